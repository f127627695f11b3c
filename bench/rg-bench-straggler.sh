#!/usr/bin/env bash
# What one throttled rank costs the job, and what leaving it behind gives back. Three agents
# (nodes a, b, c) of one rg-exact worker each, in place, --nnodes=2:3, on a private etcd on a
# free loopback port (lease TTL 2 s, last call 6 s: all three are in round 0, checked). Once
# rank 0's step log has --at steps, node c's worker is throttled to --duty percent of a core:
# SIGCONT and SIGSTOP in a 100 ms cycle (25: runs 25 ms, stopped 75 ms) until it ends. The
# job stops at the first epoch boundary --run seconds after the throttle began (rg-exact
# --stop-file). Two sides, interleaved (the order alternates each repetition):
#   keep   no eviction (straggler_factor off): the job goes on at the straggler's pace
#   evict  --rdzv-conf=straggler_factor=2,straggler_window=--window: once c's rank has been
#          slow for the window its node leaves as a preempted one does, and a and b regroup
#          in place at world 2
# From rank 0's step log (both nodes append to one file, whichever holds rank 0):
#   before_steps_per_s     the --at steps before the throttle
#   throttled_steps_per_s  from 1 s after the throttle to the end of the window
#   after_steps_per_s      from window + 5 s after the throttle to the stop (keep: still
#                          throttled; evict: at world 2, without c)
#   evicted_after_s        (evict) from the throttle to the first step completed at world 2
# Prints one JSON line per side (medians over the repetitions, with min and max) and one with
# the per-repetition ratio of after_steps_per_s (evict / keep). A run that does not end with
# exact=1 (at world 3 for keep, 2 for evict) fails the benchmark, and so does an evict run
# whose node c did not leave as a straggler or that resumed from a checkpoint. Holds
# /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-straggler.sh [--build DIR] [--reps N] [--work W] [--at STEPS]
#                               [--duty PERCENT] [--window S] [--run S]
#                               [--keep DIR]   (every run's logs and step logs, copied to DIR)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh"
rg_bench_lock "$@"
build="$here/../build"
reps=5
work=20000
at=300
duty=25
window=5
run_s=20
keep=""
usage="usage: $0 [--build DIR] [--reps N] [--work W] [--at STEPS] [--duty PERCENT] [--window S] [--run S] [--keep DIR]"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --at) at=$2; shift 2 ;;
        --duty) duty=$2; shift 2 ;;
        --window) window=$2; shift 2 ;;
        --run) run_s=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
rg_bench_check_reps "$reps"
for v in "$work" "$at" "$duty" "$window" "$run_s"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { echo "$usage (whole numbers)" >&2; exit 2; }
done
((duty >= 5 && duty <= 95)) || { echo "--duty must be 5..95 (percent of a core)" >&2; exit 2; }
((window >= 1 && run_s >= window + 10)) ||
    { echo "--window must be at least 1 and --run at least the window + 10 s" >&2; exit 2; }
((at >= 10)) || { echo "--at must be at least 10 steps" >&2; exit 2; }
[[ -x "$build/regroup" && -x "$build/examples/rg-exact" ]] || {
    echo "$build/regroup or $build/examples/rg-exact not built" >&2; exit 2; }

out=$(mktemp -d /tmp/rg-bench-straggler.XXXXXX)
pids=()
throttler=
cleanup() {
    [[ -z "$throttler" ]] || kill -KILL "$throttler" 2>/dev/null || true
    rg_bench_cleanup
}
trap cleanup EXIT
rg_bench_etcd_start "$out"
export UCX_NET_DEVICES=lo REGROUP_LOG_LEVEL=info
load_start=$(rg_bench_loadavg)

# Node $2's agent for run directory $1 (side $3), in the background; its pid into pids.
agent() {
    local d=$1 name=$2 side=$3
    local conf="lease_ttl=2,last_call_timeout=6,join_timeout=30"
    [[ "$side" != evict ]] || conf+=",straggler_factor=2,straggler_window=$window"
    REGROUP_CKPT_DIR="$d/ckpt" "$build/regroup" --rdzv-endpoint="$rg_bench_etcd_ep" \
        --rdzv-id="${d##*/}" --nnodes=2:3 --nproc-per-node=1 --max-restarts=3 \
        --recovery=in-place --rdzv-conf="$conf" "$build/examples/rg-exact" --epochs 100000 \
        --work "$work" --stop-file "$d/stop" --step-log "$d/steps.txt" >"$d/$name.log" 2>&1 &
    pids+=($!)
}

has_steps() { [[ -e "$1" ]] && (( $(wc -l <"$1") >= $2 )); }

# The pid node c's worker said it started with.
worker_pid() { sed -n 's/^rank [0-9]*: pid \([0-9]*\) started.*/\1/p' "$1" | head -1; }

# Throttles process $1 to duty percent of a core until it ends (SIGCONT when stopped).
throttle() {
    local pid=$1 run stop
    run=$(printf '0.%03d' $((duty)))   # of a 100 ms cycle
    stop=$(printf '0.%03d' $((100 - duty)))
    trap 'kill -CONT "$pid" 2>/dev/null; exit 0' TERM
    while kill -CONT "$pid" 2>/dev/null; do
        rg_bench_nap "$run"
        kill -STOP "$pid" 2>/dev/null || break
        rg_bench_nap "$stop"
    done
}

run_side() { # $1 = side (keep|evict), $2 = repetition
    local d="$out/$1-$2" a b c rca rcb rcc why=0 t_throttle wpid
    mkdir -p "$d/ckpt"
    agent "$d" a "$1"; a=$!
    agent "$d" b "$1"; b=$!
    agent "$d" c "$1"; c=$!
    rg_bench_poll 120000 "$a" has_steps "$d/steps.txt" "$at" || why=$?
    ((why == 0)) || { rg_bench_show "$d"/[abc].log; rg_bench_fail "$d: no step $at (why $why)"; }
    local n0
    n0=$(cat "$d"/[abc].log | grep -ac "round 0: started 1 workers (ranks [0-9]*\.\.[0-9]* of 3," || true)
    [[ "$n0" == 3 ]] || { rg_bench_show "$d"/[abc].log; rg_bench_fail "$d: not every node in round 0"; }
    wpid=$(worker_pid "$d/c.log")
    [[ -n "$wpid" ]] || { rg_bench_show "$d/c.log"; rg_bench_fail "$d: no worker pid on node c"; }
    rg_bench_ms_into t_throttle
    throttle "$wpid" &
    throttler=$!
    rg_bench_nap "$run_s"
    : >"$d/stop"
    rg_bench_wait_child "$a" 120000; rca=$rc
    rg_bench_wait_child "$b" 60000; rcb=$rc
    rg_bench_wait_child "$c" 60000; rcc=$rc
    kill -TERM "$throttler" 2>/dev/null || true
    wait "$throttler" 2>/dev/null || true
    throttler=
    pids=()
    [[ "$rca" == 0 && "$rcb" == 0 && "$rcc" == 0 ]] ||
        { rg_bench_show "$d"/[abc].log; rg_bench_fail "$d: agents exited $rca, $rcb and $rcc"; }
    local world=3 line
    if [[ "$1" == evict ]]; then
        world=2
        grep -aq "this node left the job (straggler: " "$d/c.log" ||
            { rg_bench_show "$d/c.log"; rg_bench_fail "$d: node c did not leave as a straggler"; }
        ! grep -aq "resumed from step" "$d"/[ab].log ||
            rg_bench_fail "$d: resumed from a checkpoint in place"
    fi
    line=$(cat "$d"/[abc].log | grep -a '^exact=' || true)
    [[ "$(grep -c . <<<"$line")" == 1 && "$line" == exact=1* && "$line" == *" world=$world" ]] ||
        { rg_bench_show "$d"/[abc].log; rg_bench_fail "$d: not exact at world $world: ${line:-none}"; }
    local from=-1
    if [[ "$1" == evict ]]; then
        from=$(cat "$d"/[ab].log | sed -n 's/^regrouped: .* world 2 from step \([0-9]*\),.*/\1/p' | head -1)
        [[ -n "$from" ]] || { rg_bench_show "$d"/[ab].log; rg_bench_fail "$d: no regroup to world 2"; }
    fi
    echo "$1 $2 $t_throttle $from" >>"$out/runs.txt"
}

for ((r = 0; r < reps; r++)); do
    if ((r % 2 == 0)); then run_side keep "$r"; run_side evict "$r"
    else run_side evict "$r"; run_side keep "$r"; fi
done

PYTHONPATH="$here" /usr/bin/python3 - "$out" "$reps" "$work" "$at" "$duty" "$window" \
    "$run_s" "$here/.." "$build" "$load_start" <<'EOF'
import json, os, sys
from rg_bench_steps import build_meta, read, stats
out, reps, work, at, duty, window, run_s = sys.argv[1], *map(int, sys.argv[2:8])
meta = build_meta(sys.argv[8], sys.argv[9])
runs = {}
for line in open(os.path.join(out, "runs.txt")):
    side, rep, t0, frm = line.split()
    runs[(side, int(rep))] = (int(t0), int(frm))

def rate(steps, lo, hi):
    """Steps per second completed in the wall-time span [lo, hi) (ms)."""
    n = sum(1 for _, t in steps if lo <= t < hi)
    if n < 2 or hi <= lo:
        raise SystemExit(f"too few steps between {lo} and {hi} to measure a rate")
    return n / ((hi - lo) / 1000.0)

res = {}
for side in ("keep", "evict"):
    rows = []
    for r in range(reps):
        t0, frm = runs[(side, r)]
        steps = read(os.path.join(out, f"{side}-{r}", "steps.txt"))
        first = steps[0][1]
        before_lo = next(t for s, t in steps if s >= min(10, at // 2))
        row = {"before": rate(steps, before_lo, t0),
               "throttled": rate(steps, t0 + 1000, t0 + window * 1000),
               "after": rate(steps, t0 + (window + 5) * 1000, steps[-1][1] + 1)}
        if side == "evict":
            later = [t for s, t in steps if s == frm + 1 and t > t0]
            if not later:
                raise SystemExit(f"evict {r}: no step after the regroup's step {frm}")
            row["evicted_after"] = (later[0] - t0) / 1000.0
        rows.append(row)
    res[side] = rows
    line = {"bench": "straggler", "side": side, "nodes": 3, "workers_per_node": 1,
            "work": work, "throttled_to_percent_of_a_core": duty, "window_s": window,
            "run_s": run_s, "reps": reps,
            "before_steps_per_s": stats([x["before"] for x in rows]),
            "throttled_steps_per_s": stats([x["throttled"] for x in rows]),
            "after_steps_per_s": stats([x["after"] for x in rows])}
    if side == "evict":
        line["evicted_after_s"] = stats([x["evicted_after"] for x in rows])
    print(json.dumps({**line, **meta}))
print(json.dumps({"bench": "straggler",
                  "after_steps_per_s_ratio_evict_over_keep": stats(
                      [e["after"] / k["after"] for e, k in zip(res["evict"], res["keep"])]),
                  "reps": reps, "loadavg_start": sys.argv[10].split(),
                  "loadavg_end": open("/proc/loadavg").read().split()[:3], **meta}))
EOF
