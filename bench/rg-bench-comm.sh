#!/usr/bin/env bash
# Runs rg-bench-comm on N ranks of this host: starts a private etcd on a free loopback port,
# starts N rg-bench-comm processes with the launcher's environment (RANK, WORLD_SIZE,
# REGROUP_ETCD_ENDPOINTS, REGROUP_JOB_ID, REGROUP_ROUND), waits for them, stops etcd.
# With --mpi it also times OpenMPI's MPI_Allreduce (f32 sum) on the same sizes, with pml ucx
# and with pml ob1 (vader for shared memory, tcp for --tls tcp). Holds
# /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-comm.sh [-n N] [--tls tcp] [--mpi] [--build DIR] [-- rg-bench-comm args]
#   e.g. bench/rg-bench-comm.sh -n 2 --mpi -- --sizes=8,65536,1048576,16777216,67108864
set -euo pipefail
if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
    RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
n=2
tls=""
mpi=0
build="$here/../build"
while (($#)); do
    case "$1" in
        -n) n=$2; shift 2 ;;
        --tls) tls=$2; shift 2 ;;
        --mpi) mpi=1; shift ;;
        --build) build=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "usage: $0 [-n N] [--tls tcp] [--mpi] [--build DIR] [-- bench args]" >&2; exit 2 ;;
    esac
done
bench_args=("$@")
bin="$build/bench/rg-bench-comm"
[[ -x "$bin" ]] || { echo "$bin not built (cmake --build $build)" >&2; exit 2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d /tmp/rg-bench-comm.XXXXXX)
cport=$(free_port); pport=$(free_port)
etcd --name bench --data-dir "$dir/etcd" \
     --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
     --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
     --initial-cluster "bench=http://127.0.0.1:$pport" >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    kill "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do
    if ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$cport" endpoint health >/dev/null 2>&1; then break; fi
    sleep 0.1
done

export UCX_NET_DEVICES=lo
export REGROUP_ETCD_ENDPOINTS="http://127.0.0.1:$cport" REGROUP_JOB_ID="bench-$$" REGROUP_ROUND=0
[[ -n "$tls" ]] && export UCX_TLS="$tls"
for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n "$bin" "${bench_args[@]}" &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
pids=()

if ((mpi)); then
    ref="$dir/mpi-allreduce-ref"
    mpicc -O2 -o "$ref" "$here/mpi_allreduce_ref.c"
    sizes="8 65536 1048576 16777216 67108864"
    for a in "${bench_args[@]}"; do
        [[ "$a" == --sizes=* ]] && sizes=${a#--sizes=} && sizes=${sizes//,/ }
    done
    run=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n")
    if [[ -n "$tls" ]]; then
        "${run[@]}" --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
            -x UCX_NET_DEVICES=lo -x UCX_TLS="$tls" "$ref" "openmpi-pml-ucx-$tls" 0.5 $sizes
        "${run[@]}" --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo \
            "$ref" "openmpi-ob1-tcp" 0.5 $sizes
    else
        "${run[@]}" --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
            -x UCX_NET_DEVICES=lo "$ref" "openmpi-pml-ucx" 0.5 $sizes
        "${run[@]}" --mca pml ob1 --mca btl self,vader "$ref" "openmpi-ob1-vader" 0.5 $sizes
    fi
fi
exit $status
