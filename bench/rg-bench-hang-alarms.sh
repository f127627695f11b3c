#!/usr/bin/env bash
# False alarms of hang detection: a fault-free job of three agents with two rg-exact workers
# each (lease TTL 2 s, the default hang_timeout of 1 s) runs for SECONDS on a private etcd,
# then ends at the next epoch; prints one JSON line: the run's length, the steps done, the
# hang alarms raised (must be 0), the worker failures, the rounds the agents ran (3: one
# round each, no regroup) and whether the result is exact. Run it on a loaded machine: that
# is the point. Holds /tmp/regroup-bench.lock.
#
#   bench/rg-bench-hang-alarms.sh [--build DIR] [--seconds S]
set -euo pipefail
if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
    RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
seconds=300
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        *) echo "usage: $0 [--build DIR] [--seconds S]" >&2; exit 2 ;;
    esac
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/rg-bench-hang.XXXXXX")
etcd_pid=
agents=()
cleanup() {
    for p in "${agents[@]}" $etcd_pid; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
mkdir "$dir/ckpt"
port=$((23000 + RANDOM % 2000))
etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$port" \
     --advertise-client-urls "http://127.0.0.1:$port" \
     --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
     --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
     --initial-cluster "default=http://127.0.0.1:$((port + 1))" \
     --heartbeat-interval=50 --election-timeout=500 >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
    etcdctl --endpoints="127.0.0.1:$port" endpoint health >/dev/null 2>&1 && break
    sleep 0.1
done
export REGROUP_CKPT_DIR="$dir/ckpt" UCX_NET_DEVICES=lo REGROUP_LOG_LEVEL=info
start=$(date +%s.%N)
for a in a b c; do
    "$build/regroup" --rdzv-endpoint="127.0.0.1:$port" --rdzv-id=hang-alarms --nnodes=1:3 \
        --nproc-per-node=2 --rdzv-conf=lease_ttl=2,last_call_timeout=1 --max-restarts=100 \
        "$build/examples/rg-exact" --epochs 1000000 --work 20000 --stop-file "$dir/stop" \
        >"$dir/$a.log" 2>&1 &
    agents+=($!)
done
sleep "$seconds"
touch "$dir/stop"
rc=0
for p in "${agents[@]}"; do wait "$p" || rc=1; done
agents=()
end=$(date +%s.%N)
alarms=$(cat "$dir"/[abc].log | grep -c 'is hung' || true)
failures=$(cat "$dir"/[abc].log | grep -c 'regroup: worker rank' || true)
rounds=$(cat "$dir"/[abc].log | grep -c 'started 2 workers' || true)
line=$(grep -h '^exact=' "$dir"/[abc].log | head -1)
steps=$(sed -n 's/.* steps=\([0-9]*\).*/\1/p' <<<"$line")
exact=$([[ "$line" == exact=1* ]] && echo true || echo false)
printf '{"bench":"hang_alarms","seconds":%.1f,"steps":%s,"hang_alarms":%d,"worker_failures":%d,"agent_rounds":%d,"exact":%s,"agents_ok":%s,"loadavg":"%s"}\n' \
    "$(echo "$end - $start" | bc)" "${steps:-0}" "$alarms" "$failures" "$rounds" "$exact" \
    "$([[ $rc == 0 ]] && echo true || echo false)" "$(cut -d' ' -f1-3 /proc/loadavg)"
