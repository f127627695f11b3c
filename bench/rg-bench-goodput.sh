#!/usr/bin/env bash
# Goodput under repeated worker failures, in restart and in-place mode: rg-fmnist (the
# Fashion-MNIST MLP) under `regroup --standalone` (a private etcd on 127.0.0.1), 4 workers,
# 2 epochs, once fault-free and once with a worker SIGKILLed every 1.5 s, per repetition and
# mode; goodput = fault-free job time / faulty job time of the same repetition and mode.
# --workload torch runs examples/python/ddp_trainer.py instead (the same model in PyTorch:
# TorchTrainer, DDP over the regroup backend, prepare_optimizer and prepare_data_loader; its
# fit() starts `regroup --standalone --preload=torch,numpy`, so that a replacement or a
# restarted worker is forked from an interpreter that imported torch; its --data-cache, as
# rg-fmnist's, in the run's directory); --modes picks the
# recovery modes (the trainer checkpoints once an epoch: in restart mode each kill redoes
# the epoch so far); in-place-no-spare is in place with REGROUP_SPARE_WORKER=0 (every new
# group makes its UCX worker in its wire-up), with a ratio line against in-place.
# Each run has its own --data-cache (in its directory): its first workers decompress the data
# set and leave the copies there, its replacements (in place) and restarted workers read them.
# The script's own loops start no process while they poll (bench_lib.sh's rg_bench_nap).
#
# The faults: this script SIGKILLs them. The workers are the agent's children (as in the
# chaos suite) less its private etcd and its fork server (whose pids the agent logs); 1.5 s (--every-ms) after the
# agent says it started the workers, and 1.5 s after each kill, one live worker chosen at
# random (--seed) is killed and the kill is counted once the process is gone (dead or a
# zombie of the agent). When there is no live worker at that moment (a restart between its
# rounds), the kill waits for one. Kills stop when rank 0 prints its final test_accuracy=
# line (the training is over), when the agent exits, or after --max-kills.
#
# Each run must exit 0 and print test_accuracy= at least --min-accuracy; a faulty run must
# have delivered at least one kill, and in place no run may resume from a checkpoint more
# often than the job was restarted (workers started afresh: "round N: started" after round 0,
# the fallback when a replacement could not join in place). The counts are reported: kills,
# resumes from a checkpoint, in-place regroups (rank 0's "regrouped in place"), full restarts.
# Runs are interleaved: even repetitions run restart and in-place fault-free, then both
# faulty; odd ones the reverse order. Prints one JSON line per mode (medians over the
# repetitions with min and max), one with the per-repetition ratio of goodputs (in place /
# restart), and one with the load averages at the start and the end. Holds
# /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
# cost_per_kill_s is (faulty - fault-free job time) / kills, per repetition; regroup_s, in
# place, the time each of rank 0's regroups took (its "regrouped in place ... in S s" line),
# over every faulty run; replacement_ready_ms, in place, each replacement's time from the
# agent's "replacement started" to its "ready to join". The torch workload's rank 0 also
# logs its steps (steps.txt): pause_ms, the gaps over 5x the run's median step in the
# faulty runs; pauses_per_kill, per run; steps_cost_per_kill_s, the faulty run's first-to-
# last step less the fault-free run's, per kill (the kills' cost without the job's start and
# end, where the repetitions' noise is); lost_after_kill_ms, per kill, the faulty run's step
# gaps from the kill to the next one (--every-ms) less the mean gap of its steps in the 0.4 s
# before the kill: the time the steps lost to it, against the same run's pace just before
# (no fault-free run in the figure). --keep DIR keeps
# every run's log (and the kills: "MS PID" per line) under DIR.
#
#   bench/rg-bench-goodput.sh [--build DIR] [--reps N] [--epochs E] [-n WORKERS]
#                             [--every-ms MS] [--max-kills K] [--min-accuracy A] [--seed S]
#                             [--workload fmnist|torch] [--modes restart,in-place] [--keep DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh"
rg_bench_lock "$@"
build="$here/../build"
reps=5
epochs=2
n=4
every_ms=1500
max_kills=40
min_acc=0.84
seed=1
keep=
workload=fmnist
modes=restart,in-place
usage="usage: $0 [--build DIR] [--reps N] [--epochs E] [-n WORKERS] [--every-ms MS] [--max-kills K] [--min-accuracy A] [--seed S] [--workload fmnist|torch] [--modes restart,in-place,in-place-no-spare] [--keep DIR]"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --epochs) epochs=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --every-ms) every_ms=$2; shift 2 ;;
        --max-kills) max_kills=$2; shift 2 ;;
        --min-accuracy) min_acc=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        --workload) workload=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
rg_bench_check_reps "$reps"
for v in epochs n every_ms max_kills seed; do
    [[ "${!v}" =~ ^[0-9]+$ ]] && ((${!v} >= 1)) || { echo "--${v//_/-} must be a whole number >= 1" >&2; exit 2; }
done
((n >= 2 && n <= 64)) || { echo "-n must be 2..64" >&2; exit 2; }
((every_ms >= 100)) || { echo "--every-ms must be at least 100" >&2; exit 2; }
((max_kills <= 10000)) || { echo "--max-kills must be at most 10000" >&2; exit 2; }
[[ "$min_acc" =~ ^0?\.[0-9]+$|^[01]$ ]] || { echo "--min-accuracy must be a fraction 0..1" >&2; exit 2; }
[[ "$workload" == fmnist || "$workload" == torch ]] || { echo "$usage" >&2; exit 2; }
IFS=, read -ra mode_list <<<"$modes"
for m in "${mode_list[@]}"; do
    [[ "$m" =~ ^(restart|in-place|in-place-no-spare)$ ]] ||
        { echo "--modes: restart, in-place, in-place-no-spare" >&2; exit 2; }
done
((${#mode_list[@]} >= 1)) || { echo "$usage" >&2; exit 2; }
[[ -x "$build/regroup" && -x "$build/examples/rg-fmnist" ]] || {
    echo "$build/regroup or $build/examples/rg-fmnist not built" >&2; exit 2; }
python=/usr/bin/python3   # Debian's, with python3-torch
src=$(cd "$here/.." && pwd)
if [[ "$workload" == torch ]]; then
    "$python" -c "import torch" 2>/dev/null || { echo "$python cannot import torch" >&2; exit 2; }
    [[ -e "$build/libregroup.so" ]] || { echo "$build/libregroup.so not built" >&2; exit 2; }
fi
out=$(mktemp -d /tmp/rg-bench-goodput.XXXXXX)
agent=   # the launcher (whose children are the workers)
job=     # the process this script started: the launcher, or the trainer's driver
cleanup() {
    if [[ -n "$agent" ]]; then   # its workers and etcd die with it (PR_SET_PDEATHSIG)
        kill -KILL "$agent" 2>/dev/null || true
    fi
    if [[ -n "$job" ]]; then
        kill -KILL "$job" 2>/dev/null || true
        wait "$job" 2>/dev/null || true
    fi
    if [[ -n "$keep" ]]; then
        rm -rf "$out"/*/ckpt
        mkdir -p "$keep" && cp -a "$out"/. "$keep"/ && echo "runs kept in $keep" >&2
    fi
    rm -rf "$out"
}
trap cleanup EXIT
# The launcher's info lines say when the workers started and which child is the etcd.
export UCX_NET_DEVICES=lo OPENBLAS_NUM_THREADS=1 REGROUP_LOG_LEVEL=info
RANDOM=$seed
load_start=$(rg_bench_loadavg)
now_ms() { rg_bench_now_ms; }
fail() { rg_bench_fail "$@"; }

# The state letter of process $1 ("" once it is gone).
proc_state() {
    local s
    { read -r s <"/proc/$1/stat"; } 2>/dev/null || { echo ""; return; }
    s=${s##*) }
    echo "${s%% *}"
}

# Sets live to the pids of agent $1's live children (not zombies, not stopped) other than
# $2 and $3 (its etcd and its fork server): the workers, found as the chaos suite finds
# them.
find_workers() {
    local f s pid st pp
    live=()
    for f in /proc/[0-9]*/stat; do
        { read -r s <"$f"; } 2>/dev/null || continue
        pid=${s%% *}
        s=${s##*) }
        st=${s%% *}
        s=${s#* }
        pp=${s%% *}
        if [[ "$pp" == "$1" && "$pid" != "$2" && "$pid" != "$3" && "$st" != Z &&
              "$st" != T ]]; then
            live+=("$pid")
        fi
    done
}

# Waits until the log $1 has a line matching the extended regex $2 while the agent runs
# (60 s at most); fails otherwise.
wait_line() {
    local why=0
    rg_bench_poll 60000 "$agent" grep -aEq "$2" "$1" || why=$?
    ((why != 1)) || { rg_bench_show "$1"; fail "$1: the agent ended before /$2/"; }
    ((why != 2)) || { rg_bench_show "$1"; fail "$1: no /$2/ within 60 s"; }
}

# Whether the faulty run of log $1 goes on: the agent runs, rank 0 has not printed its final
# accuracy, and the job's deadline (job_deadline, ms) has not passed.
running() {
    local now
    rg_bench_ms_into now
    kill -0 "$agent" 2>/dev/null && ((now < job_deadline)) && ! grep -aq '^test_accuracy=' "$1"
}

# The fault loop of a faulty run (log $1): sets kills. Returns once the training is over,
# the agent has exited, the job's deadline has passed, or max_kills were delivered.
kill_loop() {
    local log=$1 etcd server next v gone missed=0
    wait_line "$log" 'private etcd at .* \(pid [0-9]+,'
    etcd=$(sed -nE 's/.*private etcd at .* \(pid ([0-9]+),.*/\1/p' "$log" | head -1)
    wait_line "$log" 'round 0: started [0-9]+ workers'
    server=$(sed -nE 's/.*fork server \(pid ([0-9]+)\).*/\1/p' "$log" | head -1)
    next=$(( $(now_ms) + every_ms ))
    kills=0
    while ((kills < max_kills)); do
        # The interval between kills is the workload; the job's end cuts it short (looked
        # at every 100 ms: each look is a grep).
        local now left nap
        while :; do
            running "$log" || return 0
            rg_bench_ms_into now
            left=$((next - now))
            ((left > 0)) || break
            ((left < 100)) || left=100
            printf -v nap '0.%03d' "$left"
            rg_bench_nap "$nap"
        done
        find_workers "$agent" "$etcd" "$server"
        while ((${#live[@]} == 0)); do   # between a restart's rounds: wait for its workers
            running "$log" || return 0
            rg_bench_nap 0.01
            find_workers "$agent" "$etcd" "$server"
        done
        v=${live[RANDOM % ${#live[@]}]}
        if kill -KILL "$v" 2>/dev/null; then
            rg_bench_ms_into now
            gone=$((now + 10000))
            while [[ "$(proc_state "$v")" != "" && "$(proc_state "$v")" != Z ]]; do
                rg_bench_ms_into now
                ((now < gone)) || fail "$log: worker $v still running 10 s after SIGKILL"
                rg_bench_nap 0.005
            done
            kills=$((kills + 1))
            echo "$(now_ms) $v" >>"$log.kills"
            next=$(( $(now_ms) + every_ms ))
        else   # it exited between the look and the kill: pick again at once
            missed=$((missed + 1))
            ((missed < 10000)) || fail "$log: 10000 workers gone before their kill"
        fi
    done
}

run() { # $1 = mode (restart|in-place|in-place-no-spare), $2 = repetition, $3 = clean|faulty
    local d="$out/$1-$2-$3" t0 t1 acc resumed regrouped rounds recovery=$1 spare=1
    [[ "$1" != in-place-no-spare ]] || recovery=in-place spare=0
    export REGROUP_SPARE_WORKER=$spare
    mkdir -p "$d/ckpt"
    : >"$d/log"   # there before the kill loop reads it (the child opens it after the fork)
    t0=$(now_ms)
    job_deadline=$((t0 + 600000))
    if [[ "$workload" == fmnist ]]; then
        REGROUP_CKPT_DIR="$d/ckpt" "$build/regroup" --standalone --nproc-per-node="$n" \
            --max-restarts=$((2 * max_kills + 10)) --recovery="$recovery" \
            "$build/examples/rg-fmnist" --epochs "$epochs" --data-cache "$d/data" >"$d/log" 2>&1 &
        job=$!
        agent=$job
    else
        REGROUP_LAUNCHER="$build/regroup" REGROUP_LIBRARY="$build/libregroup.so" \
            PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
            "$python" "$src/examples/python/ddp_trainer.py" --workers "$n" --epochs "$epochs" \
            --storage "$d" --name run --recovery "$recovery" --max-failures $((2 * max_kills + 10)) \
            --data-cache "$d/data" --step-log "$d/steps.txt" >"$d/log" 2>&1 &
        job=$!
        agent=$job   # until its launcher is known (wait_line watches it)
        wait_line "$d/log" 'private etcd at'   # the driver's one child, by then
        agent=$(ps -o pid= --ppid "$job" | head -1 | tr -d ' ')
        [[ -n "$agent" ]] || fail "$d: the trainer's launcher not found"
    fi
    kills=0
    if [[ "$3" == faulty ]]; then
        kill_loop "$d/log"
    fi
    rg_bench_wait_child "$job" $((job_deadline > $(now_ms) ? job_deadline - $(now_ms) : 0))
    t1=$(now_ms)
    agent=
    job=
    [[ "$rc" == 0 ]] || { rg_bench_show "$d/log"; fail "$d: regroup exited $rc"; }
    acc=$(sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p' "$d/log" | tail -1)
    [[ -n "$acc" ]] || { rg_bench_show "$d/log"; fail "$d: no test_accuracy= line"; }
    awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' ||
        fail "$d: test_accuracy=$acc below --min-accuracy $min_acc"
    if [[ "$workload" == fmnist ]]; then
        resumed=$(grep -ac '^resumed from checkpoint step' "$d/log" || true)
        regrouped=$(grep -ac '^regrouped in place' "$d/log" || true)
    else   # the trainer's rank 0 says each regroup; it does not say a resume
        resumed=0
        regrouped=$(grep -ac '^regroup.train: regrouped at step' "$d/log" || true)
    fi
    rounds=$(grep -acE 'round [0-9]+: started [0-9]+ workers' "$d/log" || true)
    if [[ "$3" == faulty ]]; then
        ((kills >= 1)) || fail "$d: no worker was killed (the job ended within ${every_ms} ms?)"
    else
        ((resumed == 0 && rounds == 1)) || fail "$d: a fault-free run restarted"
    fi
    if [[ "$1" == in-place* ]] && ((resumed > rounds - 1)); then
        rg_bench_show "$d/log"
        fail "$d: in place, resumed from a checkpoint $resumed times in $((rounds - 1)) restarts"
    fi
    echo "$1 $2 $3 $((t1 - t0)) $kills $acc $resumed $regrouped $((rounds - 1))" >>"$out/runs.txt"
}

for ((r = 0; r < reps; r++)); do
    if ((r % 2 == 0)); then
        for m in "${mode_list[@]}"; do run "$m" "$r" clean; done
        for m in "${mode_list[@]}"; do run "$m" "$r" faulty; done
    else
        for ((i = ${#mode_list[@]} - 1; i >= 0; i--)); do run "${mode_list[i]}" "$r" faulty; done
        for ((i = ${#mode_list[@]} - 1; i >= 0; i--)); do run "${mode_list[i]}" "$r" clean; done
    fi
done

PYTHONPATH="$here" /usr/bin/python3 - "$out" "$reps" "$n" "$epochs" "$every_ms" "$max_kills" \
    "$here/.." "$build" "$load_start" "$workload" "$modes" <<'EOF'
import json, os, re, sys
from rg_bench_steps import build_meta, lost_after, pauses, read, span_s, stats
out, reps, n, epochs, every_ms, max_kills = sys.argv[1], *map(int, sys.argv[2:7])
meta = build_meta(sys.argv[7], sys.argv[8])
workload, modes = sys.argv[10], sys.argv[11].split(",")
workload = "rg-fmnist" if workload == "fmnist" else "ddp_trainer.py (torch, --preload)"
runs = {}
for line in open(os.path.join(out, "runs.txt")):
    mode, rep, kind, ms, kills, acc, resumed, regrouped, restarts = line.split()
    runs[(mode, int(rep), kind)] = {"job_s": int(ms) / 1000.0, "kills": int(kills),
                                    "acc": float(acc), "resumed": int(resumed),
                                    "regrouped": int(regrouped), "restarts": int(restarts)}
REGROUP = re.compile(r"regrouped in place from round \d+ into round \d+: rank 0 of \d+, .* in ([0-9.]+) s$"
                     if workload == "rg-fmnist" else
                     r"^regroup.train: regrouped at step \d+: .* in ([0-9.]+) s$")
def regroup_s(mode, rep):
    with open(os.path.join(out, f"{mode}-{rep}-faulty", "log"), errors="replace") as f:
        return [float(m.group(1)) for m in map(REGROUP.search, f) if m]
STARTED = re.compile(r"^\[([0-9.]+)\] .* replacement started \(pid (\d+)\)")
READY = re.compile(r"^\[([0-9.]+)\] .*\(pid (\d+)\): the replacement is ready to join")
def ready_ms(mode, rep):
    """Each replacement's time from its start to its word that it is ready (the agent's log)."""
    started, out_ = {}, []
    with open(os.path.join(out, f"{mode}-{rep}-faulty", "log"), errors="replace") as f:
        for line in f:
            m = STARTED.search(line)
            if m:
                started[m.group(2)] = float(m.group(1))
            m = READY.search(line)
            if m and m.group(2) in started:
                out_.append((float(m.group(1)) - started[m.group(2)]) * 1000.0)
    return out_
def step_log(mode, rep, kind):
    path = os.path.join(out, f"{mode}-{rep}-{kind}", "steps.txt")
    return read(path) if os.path.exists(path) else None
def step_figures(mode):
    """The torch workload's step logs (rank 0's): its pauses, and the kills' cost in its
    steps alone (the faulty run's first-to-last step less the fault-free run's, per kill),
    which leaves out the job's start and end (fit(), the imports, the evaluation)."""
    logs = [(step_log(mode, r, "clean"), step_log(mode, r, "faulty"), runs[(mode, r, "faulty")])
            for r in range(reps)]
    logs = [(c, f, run) for c, f, run in logs if c and f and run["kills"] > 0]
    if not logs:
        return {}
    per_run = [pauses(f) for _, f, _ in logs]
    lost = []
    for r in range(reps):
        f, kills = step_log(mode, r, "faulty"), os.path.join(out, f"{mode}-{r}-faulty", "log.kills")
        if f and os.path.exists(kills):
            with open(kills) as kf:
                lost += lost_after(f, [int(line.split()[0]) for line in kf if line.strip()],
                                   every_ms)
    return {"pause_ms": stats([p * 1000.0 for ps in per_run for p in ps]),
            **({"lost_after_kill_ms": stats([x * 1000.0 for x in lost])} if lost else {}),
            "pauses_per_kill": stats([len(ps) / run["kills"] for ps, (_, _, run) in
                                      zip(per_run, logs)]),
            "steps_cost_per_kill_s": stats([(span_s(f) - span_s(c)) / run["kills"]
                                            for c, f, run in logs])}
goodput = {}
for mode in modes:
    clean = [runs[(mode, r, "clean")] for r in range(reps)]
    faulty = [runs[(mode, r, "faulty")] for r in range(reps)]
    goodput[mode] = [c["job_s"] / f["job_s"] for c, f in zip(clean, faulty)]
    regroups = [x for r in range(reps) for x in regroup_s(mode, r)]
    extra = {"regroup_s": stats(regroups)} if regroups else {}
    ready = [x for r in range(reps) for x in ready_ms(mode, r)]
    if ready:
        extra["replacement_ready_ms"] = stats(ready)
    extra.update(step_figures(mode))
    print(json.dumps({
        "bench": "goodput", "workload": workload, "mode": mode, "workers": n,
        "epochs": epochs, "kill_every_s": every_ms / 1000.0, "reps": reps,
        "goodput": stats(goodput[mode]),
        "clean_job_s": stats([c["job_s"] for c in clean]),
        "faulty_job_s": stats([f["job_s"] for f in faulty]),
        "kills": stats([f["kills"] for f in faulty]),
        "kills_total": sum(f["kills"] for f in faulty),
        "cost_per_kill_s": stats([(f["job_s"] - c["job_s"]) / f["kills"]
                                  for c, f in zip(clean, faulty)]),
        "runs_at_max_kills": sum(f["kills"] >= max_kills for f in faulty),
        "resumed_from_checkpoint_total": sum(f["resumed"] for f in faulty),
        "full_restarts_total": sum(f["restarts"] for f in faulty),
        "regrouped_in_place_total": sum(f["regrouped"] for f in faulty),
        "test_accuracy_clean": stats([c["acc"] for c in clean]),
        "test_accuracy_faulty": stats([f["acc"] for f in faulty]), **extra, **meta}))
if "restart" in goodput and "in-place" in goodput:
    ratios = [i / r for i, r in zip(goodput["in-place"], goodput["restart"])]
    print(json.dumps({"bench": "goodput", "workload": workload,
                      "goodput_ratio_in_place_over_restart": stats(ratios), "reps": reps,
                      **meta}))
if "in-place" in goodput and "in-place-no-spare" in goodput:
    ratios = [a / b for a, b in zip(goodput["in-place"], goodput["in-place-no-spare"])]
    print(json.dumps({"bench": "goodput", "workload": workload,
                      "goodput_ratio_spare_over_no_spare": stats(ratios), "reps": reps,
                      **meta}))
if "in-place" in goodput:
    print(json.dumps({"bench": "goodput", "workload": workload, "in_place_goodput_at_least_0.9":
                      stats(goodput["in-place"])["median"] >= 0.9, **meta}))
print(json.dumps({"bench": "goodput", "loadavg_start": sys.argv[9].split(),
                  "loadavg_end": open("/proc/loadavg").read().split()[:3], **meta}))
EOF
