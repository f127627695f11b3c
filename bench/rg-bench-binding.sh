#!/usr/bin/env bash
# Does binding the local ranks to disjoint cores (--numa-binding=exclusive) help the
# collectives under the launcher? Runs rg-bench-comm under `regroup --standalone`, unbound and
# bound, interleaved (the order alternates each repetition), and prints one JSON line per
# size: the median of the per-pair ratios bound/unbound of busbw, with min and max, and each
# side's median. Holds /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-binding.sh [--build DIR] [-n RANKS] [--reps N] [--sizes LIST] [--seconds S]
set -euo pipefail
if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
    RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
n=2
reps=6
sizes=1048576,16777216
seconds=0.5
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        *) echo "usage: $0 [--build DIR] [-n RANKS] [--reps N] [--sizes LIST] [--seconds S]" >&2
           exit 2 ;;
    esac
done
[[ -x "$build/regroup" && -x "$build/bench/rg-bench-comm" ]] || {
    echo "$build/regroup or $build/bench/rg-bench-comm not built" >&2; exit 2; }
out=$(mktemp -d /tmp/rg-bench-binding.XXXXXX)
trap 'rm -rf "$out"' EXIT
export UCX_NET_DEVICES=lo

run() { # $1 = side (unbound|bound), $2 = repetition
    local extra=()
    [[ $1 == bound ]] && extra=(--numa-binding=exclusive)
    timeout 300 "$build/regroup" --standalone --nproc-per-node="$n" "${extra[@]}" \
        "$build/bench/rg-bench-comm" --sizes="$sizes" --seconds="$seconds" \
        >"$out/$1.$2.log" 2>&1 || { echo "$1 repetition $2 failed:" >&2; tail -5 "$out/$1.$2.log" >&2; exit 1; }
}
for ((r = 0; r < reps; r++)); do
    if ((r % 2 == 0)); then run unbound "$r"; run bound "$r"; else run bound "$r"; run unbound "$r"; fi
done
commit=$(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo unknown)
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
python3 - "$out" "$reps" "$n" "$commit" "${build_type:-unknown}" <<'PY'
import json, statistics, sys, glob, re
out, reps, n, commit, btype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def load(side, r):
    res = {}
    for line in open(f"{out}/{side}.{r}.log"):
        m = re.search(r'(\{"bench":"comm".*\})', line)
        if m:
            j = json.loads(m.group(1))
            res[j["bytes"]] = j["busbw_GBps"]
    return res
runs = {s: [load(s, r) for r in range(reps)] for s in ("unbound", "bound")}
for size in sorted(runs["unbound"][0]):
    u = [runs["unbound"][r][size] for r in range(reps)]
    b = [runs["bound"][r][size] for r in range(reps)]
    ratios = [b[r] / u[r] for r in range(reps)]
    print(json.dumps({"bench": "binding", "op": "allreduce", "dtype": "f32", "bytes": size,
                      "ranks": n, "pairs": reps, "commit": commit, "build": btype,
                      "unbound_busbw_median": round(statistics.median(u), 3),
                      "bound_busbw_median": round(statistics.median(b), 3),
                      "ratio_median": round(statistics.median(ratios), 3),
                      "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}))
PY
