#!/usr/bin/env bash
# Runs rg-bench-comm on N ranks of this host: starts a private etcd on a free loopback port,
# starts N rg-bench-comm processes with the launcher's environment (RANK, WORLD_SIZE,
# REGROUP_ETCD_ENDPOINTS, REGROUP_JOB_ID, REGROUP_ROUND), waits for them, stops etcd.
# With --mpi it also times OpenMPI's MPI_Allreduce (bench/mpi_allreduce_ref.c: the same
# inputs, every size's result checked, the same --seconds and --dtype) with pml ucx and with
# pml ob1 (vader for shared memory, tcp for --tls tcp), each with --bind-to none and with
# OpenMPI's default binding (when the ranks do not outnumber the cores; oversubscribed,
# OpenMPI binds nothing, so the default is none).
#
# The implementations alternate over R repetitions (-r, default 5; the order rotates each
# repetition), and every run's results are checked by the program itself: a wrong result or
# a failed run makes the script exit 1. It prints every run's JSON lines, then one summary
# line per implementation and size ({"bench":"comm-summary",...}: medians, min and max over
# the repetitions) and one per OpenMPI variant and size ({"bench":"comm-vs",...}: the median,
# min and max of the per-repetition ratios regroup busbw / OpenMPI busbw, and a verdict:
# "regroup faster" when every ratio is above 1, "openmpi faster" when every one is below 1,
# "tie" when the ratios' spread includes 1.0). The "best" variant is, per repetition,
# OpenMPI's fastest run. Holds /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-comm.sh [-n N] [--tls tcp] [--mpi] [-r R] [--build DIR] [-- rg-bench-comm args]
#   e.g. bench/rg-bench-comm.sh -n 2 --mpi -r 5 -- --sizes=8,65536,1048576,16777216,67108864
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh"
rg_bench_lock "$@"
n=2
tls=""
mpi=0
reps=5
build="$here/../build"
usage="usage: $0 [-n N] [--tls tcp] [--mpi] [-r R] [--build DIR] [-- bench args]"
while (($#)); do
    case "$1" in
        -n) n=$2; shift 2 ;;
        --tls) tls=$2; shift 2 ;;
        --mpi) mpi=1; shift ;;
        -r) reps=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
[[ "$reps" =~ ^[0-9]+$ ]] && ((reps >= 1 && reps <= 100)) || { echo "-r must be 1..100" >&2; exit 2; }
bench_args=("$@")
bin="$build/bench/rg-bench-comm"
[[ -x "$bin" ]] || { echo "$bin not built (cmake --build $build)" >&2; exit 2; }

sizes="8 65536 1048576 16777216 67108864"
seconds=0.5
dtype=f32
op=allreduce
for a in "${bench_args[@]}"; do
    case "$a" in
        --sizes=*) sizes=${a#--sizes=}; sizes=${sizes//,/ } ;;
        --seconds=*) seconds=${a#--seconds=} ;;
        --dtype=*) dtype=${a#--dtype=} ;;
        --op=*) op=${a#--op=} ;;
    esac
done
if ((mpi)) && [[ "$op" != allreduce ]]; then
    echo "rg-bench-comm.sh: the OpenMPI reference times allreduce only: --mpi needs --op=allreduce" >&2
    exit 2
fi
if ((mpi)) && [[ ! "$dtype" =~ ^(f32|f64|i32|i64|u8)$ ]]; then
    echo "rg-bench-comm.sh: MPI has no $dtype type: --mpi needs f32, f64, i32, i64 or u8" >&2
    exit 2
fi

out=$(mktemp -d /tmp/rg-bench-comm.XXXXXX)
dir=$out
pids=()
trap rg_bench_cleanup EXIT
rg_bench_etcd_start "$out"
cport=${rg_bench_etcd_ep##*:}

export UCX_NET_DEVICES=lo
export REGROUP_ETCD_ENDPOINTS="http://127.0.0.1:$cport" REGROUP_ROUND=0
[[ -n "$tls" ]] && export UCX_TLS="$tls"

run_regroup() { # $1 = repetition; output to stdout
    local status=0
    pids=()
    for ((r = 0; r < n; r++)); do
        REGROUP_JOB_ID="bench-$$-$1" RANK=$r WORLD_SIZE=$n timeout 600 "$bin" "${bench_args[@]}" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    pids=()
    return $status
}

impls=(regroup)
if ((mpi)); then
    ref="$dir/mpi-allreduce-ref"
    mpicc -O2 -o "$ref" "$here/mpi_allreduce_ref.c" -lm
    if [[ -n "$tls" ]]; then
        ucx_args=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any
                  -x UCX_NET_DEVICES=lo -x UCX_TLS="$tls")
        ob1_args=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo)
        ucx_name="openmpi-pml-ucx-$tls"; ob1_name="openmpi-ob1-tcp"
    else
        ucx_args=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_NET_DEVICES=lo)
        ob1_args=(--mca pml ob1 --mca btl self,vader)
        ucx_name="openmpi-pml-ucx"; ob1_name="openmpi-ob1-vader"
    fi
    impls+=("$ucx_name/bind-none" "$ob1_name/bind-none")
    if ((n <= $(nproc))); then
        impls+=("$ucx_name/bind-default" "$ob1_name/bind-default")
    else
        echo "rg-bench-comm.sh: $n ranks on $(nproc) cores: OpenMPI binds nothing when" \
             "oversubscribed, so its default binding is --bind-to none (not run twice)" >&2
    fi
fi
run_mpi() { # $1 = implementation label, $2 = repetition
    local label=$1 pml bind
    pml=${label%/*}; bind=${label#*/}
    local run=(mpirun --allow-run-as-root --oversubscribe -np "$n")
    [[ $bind == bind-none ]] && run+=(--bind-to none)
    if [[ $pml == "$ucx_name" ]]; then run+=("${ucx_args[@]}"); else run+=("${ob1_args[@]}"); fi
    timeout 600 "${run[@]}" "$ref" "$label" "$seconds" "$dtype" $sizes
}

status=0
k=${#impls[@]}
for ((rep = 0; rep < reps; rep++)); do
    for ((j = 0; j < k; j++)); do
        impl=${impls[$(((j + rep) % k))]}
        log="$dir/run.$rep.${impl//\//_}"
        if [[ $impl == regroup ]]; then
            run_regroup "$rep" >"$log" 2>"$log.err" || { status=1; echo "FAILED" >>"$log"; }
        else
            run_mpi "$impl" "$rep" >"$log" 2>"$log.err" || { status=1; echo "FAILED" >>"$log"; }
        fi
        if grep -q FAILED "$log"; then
            echo "rg-bench-comm.sh: $impl repetition $rep failed:" >&2
            grep -m5 -E '^(mpi-allreduce-ref|rg-bench-comm)' "$log.err" >&2 || tail -5 "$log.err" >&2
        fi
        grep '^{' "$log" | sed "s/}\$/,\"rep\":$rep}/" || true
    done
done

# the summary names the commit rg-bench-comm was built from (its JSON says), and the tree's
# commit now, which built the OpenMPI reference and ran this script
tree=$(git -C "$here/.." rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$here/.." diff --quiet HEAD -- 2>/dev/null || tree="$tree-dirty"
python3 - "$dir" "$reps" "$n" "${tls:-shm}" "$tree" "${impls[@]}" <<'PY'
import json, statistics, sys, os
d, reps, n, transport, tree = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
impls = sys.argv[6:]
runs = {}            # impl -> rep -> bytes -> record (None: the run failed)
build = "unknown"
commit = "unknown"
for impl in impls:
    runs[impl] = {}
    for rep in range(reps):
        text = open(os.path.join(d, f"run.{rep}.{impl.replace('/', '_')}")).read()
        if "FAILED" in text:
            runs[impl][rep] = None
            continue
        res = {}
        for line in text.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                res[j["bytes"]] = j
                build = j.get("build", build)
                commit = j.get("commit", commit)
        runs[impl][rep] = res
failed = {i: sum(1 for r in runs[i].values() if r is None) for i in impls}
sizes = sorted({b for i in impls for r in runs[i].values() if r for b in r})
def rnd(x):
    return round(x, 4)
def ok_reps(impl, size):
    return [r for r in range(reps) if runs[impl][r] is not None and size in runs[impl][r]]
for size in sizes:
    for impl in impls:
        rs = ok_reps(impl, size)
        if not rs:
            continue
        lat = [runs[impl][r][size]["latency_us"] for r in rs]
        bw = [runs[impl][r][size]["busbw_GBps"] for r in rs]
        print(json.dumps({"bench": "comm-summary", "impl": impl, "transport": transport,
                          "ranks": n, "bytes": size, "reps": len(rs), "failed_reps": failed[impl],
                          "latency_us_median": rnd(statistics.median(lat)),
                          "latency_us_min": rnd(min(lat)), "latency_us_max": rnd(max(lat)),
                          "busbw_GBps_median": rnd(statistics.median(bw)),
                          "busbw_GBps_min": rnd(min(bw)), "busbw_GBps_max": rnd(max(bw)),
                          "iters_median": int(statistics.median(runs[impl][r][size]["iters"] for r in rs)),
                          "commit": commit, "tree": tree, "build": build}))
    mpis = [i for i in impls if i != "regroup"]
    base = ok_reps("regroup", size)
    pairs = {}
    for impl in mpis:
        # the same bytes on both sides: busbw ratio = latency ratio inverted (and unrounded)
        pairs[impl] = {r: runs[impl][r][size]["latency_us"] / runs["regroup"][r][size]["latency_us"]
                       for r in base if r in ok_reps(impl, size)}
    best = {}
    for r in base:
        if all(r in pairs[i] for i in mpis) and mpis:
            best[r] = min(pairs[i][r] for i in mpis)
    if mpis:
        pairs["openmpi-best"] = best
    for impl, p in pairs.items():
        v = list(p.values())
        if not v:
            continue
        lo, hi = min(v), max(v)
        verdict = "regroup faster" if lo > 1 else "openmpi faster" if hi < 1 else "tie"
        print(json.dumps({"bench": "comm-vs", "vs": impl, "transport": transport, "ranks": n,
                          "bytes": size, "pairs": len(v), "ratio": "regroup busbw / openmpi busbw",
                          "ratio_median": rnd(statistics.median(v)), "ratio_min": rnd(lo),
                          "ratio_max": rnd(hi), "verdict": verdict, "commit": commit,
                          "tree": tree, "build": build}))
PY
exit $status
