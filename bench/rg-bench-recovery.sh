#!/usr/bin/env bash
# What a worker SIGKILL costs in each recovery mode. Runs rg-exact under `regroup --standalone`
# with 4 workers, rank 1 SIGKILLing itself at step 40 (of 75), in restart and in-place mode,
# interleaved (the order alternates each repetition), and from rank 0's step log (the wall
# time each step completed) takes, per run:
#   pause_s   the longest gap between two completed steps, less the run's median gap
#   redone    steps completed more than once (restart mode redoes those since the checkpoint)
#   job_s     the whole job's wall time (regroup started to exited)
# Prints one JSON line per mode: the medians over the repetitions (>= 5), with min and max,
# and one line with the per-pair ratio of job times (in-place / restart). A run that does not
# end with exact=1 fails the benchmark. Holds /tmp/regroup-bench.lock so that no two
# benchmarks run at once.
#
# --table-rows N gives rg-exact a sharded table of N rows too (rg_train_table_t: committed
# at every step, moved to its new owners by an in-place regroup, checkpointed in restart
# mode), so that the two runs show what the table costs.
#
# --modes picks the sides, interleaved (the order rotates each repetition): restart,
# in-place, and in-place-no-spare (in place with REGROUP_SPARE_WORKER=0: each new group makes
# its UCX worker in its wire-up, as before the spare worker). With in-place and
# in-place-no-spare both, a last line gives the per-repetition ratio of their pauses.
#
#   bench/rg-bench-recovery.sh [--build DIR] [--reps N] [--work W] [-n WORKERS]
#                              [--table-rows N] [--modes "restart in-place ..."]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh"
rg_bench_lock "$@"
build="$here/../build"
reps=5
work=20000
n=4
table=0
modes="restart in-place"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --table-rows) table=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        *) echo "usage: $0 [--build DIR] [--reps N] [--work W] [-n WORKERS]" \
                "[--table-rows N] [--modes \"restart in-place in-place-no-spare\"]" >&2
           exit 2 ;;
    esac
done
read -ra mode_list <<<"$modes"
((${#mode_list[@]} >= 1)) || { echo "--modes: name at least one mode" >&2; exit 2; }
for m in "${mode_list[@]}"; do
    [[ "$m" =~ ^(restart|in-place|in-place-no-spare)$ ]] || {
        echo "--modes: $m is not restart, in-place or in-place-no-spare" >&2; exit 2; }
done
rg_bench_check_reps "$reps"
[[ "$table" =~ ^[0-9]+$ ]] || { echo "--table-rows must be a number of rows" >&2; exit 2; }
[[ -x "$build/regroup" && -x "$build/examples/rg-exact" ]] || {
    echo "$build/regroup or $build/examples/rg-exact not built" >&2; exit 2; }
out=$(mktemp -d /tmp/rg-bench-recovery.XXXXXX)
trap 'rm -rf "$out"' EXIT
export UCX_NET_DEVICES=lo

run() { # $1 = mode (restart|in-place|in-place-no-spare), $2 = repetition
    local d="$out/$1-$2"
    mkdir -p "$d/ckpt"
    local t0 t1 recovery=$1 spare=1
    [[ "$1" == in-place-no-spare ]] && recovery=in-place spare=0
    t0=$(date +%s%N)
    REGROUP_SPARE_WORKER=$spare REGROUP_CKPT_DIR="$d/ckpt" timeout 300 "$build/regroup" \
        --standalone --nproc-per-node="$n" --max-restarts=3 --recovery="$recovery" \
        "$build/examples/rg-exact" --work "$work" --kill-at 40 --kill-rank 1 \
        --table-rows "$table" \
        --step-log "$d/steps.txt" >"$d/log" 2>&1 || { echo "run $1 $2 failed:" >&2;
                                                     tail -20 "$d/log" >&2; exit 1; }
    t1=$(date +%s%N)
    grep -q "exact=1" "$d/log" || { echo "run $1 $2: not exact" >&2; exit 1; }
    ((table == 0)) || grep -q "table=1" "$d/log" || {
        echo "run $1 $2: the table is not exact" >&2; exit 1; }
    echo "$1 $2 $(( (t1 - t0) / 1000000 ))" >>"$out/jobs.txt"
}

nm=${#mode_list[@]}
for ((r = 0; r < reps; r++)); do
    for ((k = 0; k < nm; k++)); do run "${mode_list[(r + k) % nm]}" "$r"; done
done

PYTHONPATH="$here" /usr/bin/python3 - "$out" "$reps" "$n" "$work" "$here/.." "$build" \
    "$table" "$modes" <<'EOF'
import json, os, sys
from rg_bench_steps import build_meta, pause_redone, read, stats
out, reps, n, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
meta = build_meta(sys.argv[5], sys.argv[6])
meta["table_rows"] = int(sys.argv[7])
modes = sys.argv[8].split()
jobs = {}
for line in open(os.path.join(out, "jobs.txt")):
    mode, rep, ms = line.split()
    jobs[(mode, int(rep))] = int(ms) / 1000.0
def one(mode, rep):
    return pause_redone(read(os.path.join(out, f"{mode}-{rep}", "steps.txt")))
pauses = {}
for mode in modes:
    runs = [one(mode, r) for r in range(reps)]
    pauses[mode] = [p for p, _, _ in runs]
    print(json.dumps({"bench": "recovery", "fault": "worker-sigkill", "mode": mode,
                      "workers": n, "work": work, "reps": reps,
                      "pause_s": stats([p for p, _, _ in runs]),
                      "steps_redone": stats([d for _, d, _ in runs]),
                      "step_s": stats([s for _, _, s in runs]),
                      "job_s": stats([jobs[(mode, r)] for r in range(reps)]), **meta}))
if "in-place" in modes and "restart" in modes:
    ratios = [jobs[("in-place", r)] / jobs[("restart", r)] for r in range(reps)]
    print(json.dumps({"bench": "recovery", "fault": "worker-sigkill",
                      "job_time_ratio_in_place_over_restart": stats(ratios), "reps": reps,
                      **meta}))
if "in-place" in modes and "in-place-no-spare" in modes:
    ratios = [a / b for a, b in zip(pauses["in-place"], pauses["in-place-no-spare"]) if b > 0]
    print(json.dumps({"bench": "recovery", "fault": "worker-sigkill",
                      "pause_ratio_spare_over_no_spare": stats(ratios), "reps": len(ratios),
                      **meta}))
EOF
