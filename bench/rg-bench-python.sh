#!/usr/bin/env bash
# The cost of the Python layer per call: an 8-byte allreduce (one float64, sum) from Python
# (bench/rg_bench_python.py, through the regroup package, with a NumPy array and with a
# PyTorch tensor) against the same call from C (rg-bench-comm), each under
# `regroup --standalone`, interleaved (the order alternates each repetition). Prints one JSON
# line per kind of tensor: the median of the per-pair ratios Python/C of the latency per call,
# with min and max, each side's median and the median of the differences (the overhead per
# call, in microseconds). Holds /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-python.sh [--build DIR] [-n RANKS] [--reps N] [--seconds S] [--python PY]
set -euo pipefail
if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
    RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
n=2
reps=6
seconds=0.5
python=/usr/bin/python3
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        *) echo "usage: $0 [--build DIR] [-n RANKS] [--reps N] [--seconds S] [--python PY]" >&2
           exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
[[ -x "$build/regroup" && -x "$build/bench/rg-bench-comm" && -e "$build/libregroup.so" ]] || {
    echo "$build/regroup, $build/bench/rg-bench-comm or $build/libregroup.so not built" >&2
    exit 2; }
out=$(mktemp -d /tmp/rg-bench-python.XXXXXX)
trap 'rm -rf "$out"' EXIT
export UCX_NET_DEVICES=lo OMP_NUM_THREADS=1
export REGROUP_LIBRARY="$build/libregroup.so"
export PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}"

run() { # $1 = side (c|python), $2 = repetition
    local prog
    if [[ $1 == c ]]; then
        prog=("$build/bench/rg-bench-comm" --op=allreduce --dtype=f64 --sizes=8
              --seconds="$seconds")
    else
        prog=("$python" "$here/rg_bench_python.py" --count 1 --seconds "$seconds")
    fi
    timeout 300 "$build/regroup" --standalone --nproc-per-node="$n" --max-restarts=0 \
        "${prog[@]}" >"$out/$1.$2.log" 2>&1 ||
        { echo "$1 repetition $2 failed:" >&2; tail -5 "$out/$1.$2.log" >&2; exit 1; }
}
for ((r = 0; r < reps; r++)); do
    if ((r % 2 == 0)); then run c "$r"; run python "$r"; else run python "$r"; run c "$r"; fi
done
commit=$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo unknown)
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
"$python" - "$out" "$reps" "$n" "$commit" "${build_type:-unknown}" <<'PY'
import json, re, statistics, sys
out, reps, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
commit, btype = sys.argv[4], sys.argv[5]
def lines(side, r):
    for line in open(f"{out}/{side}.{r}.log"):
        m = re.search(r'(\{"bench":"comm[-a-z]*".*\})', line)
        if m:
            yield json.loads(m.group(1))
c = [[j["latency_us"] for j in lines("c", r) if j["bytes"] == 8][0] for r in range(reps)]
kinds = {}
for r in range(reps):
    for j in lines("python", r):
        kinds.setdefault(j["kind"], []).append(j["latency_us"])
for kind, py in kinds.items():
    if len(py) != reps:
        sys.exit("rg-bench-python: %s ran %d of %d times" % (kind, len(py), reps))
    ratios = [py[r] / c[r] for r in range(reps)]
    diffs = [py[r] - c[r] for r in range(reps)]
    print(json.dumps({"bench": "python-overhead", "op": "allreduce", "dtype": "f64",
                      "bytes": 8, "kind": kind, "ranks": n, "pairs": reps, "commit": commit,
                      "build": btype, "c_latency_us_median": round(statistics.median(c), 3),
                      "python_latency_us_median": round(statistics.median(py), 3),
                      "overhead_us_median": round(statistics.median(diffs), 3),
                      "ratio_median": round(statistics.median(ratios), 3),
                      "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}))
PY
