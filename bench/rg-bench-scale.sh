#!/usr/bin/env bash
# What a node joining and a node being lost cost the running job, in restart and in-place
# mode. Two agents (nodes a and b) of 2 rg-exact workers each, on a private etcd on a free
# loopback port, --nnodes=1:2, lease TTL 2 s; both modes interleaved (the order alternates
# each repetition), each scenario and mode >= 5 times. From rank 0's step log (the wall time
# each step completed; both nodes write the same file, whichever holds rank 0):
#   join  node a runs alone (world 2, last call 0.5 s); node b starts once a's step log has
#         --at steps, and the job goes on at world 4.
#           pause_s      the longest gap between two completed steps, less the run's median
#           redone       steps completed more than once (restart mode: since the checkpoint)
#           to_world4_s  from b's start to the first step completed at world 4 (the step
#                        after the one rank 0 says it regrouped or resumed from at world 4)
#           job_s        a's start to both agents' exit
#   loss  a and b start together (last call 6 s: both are in round 0, checked), b's agent is
#         SIGKILLed once the step log has --at steps (its workers die with it), and a's
#         workers finish at world 2.
#           pause_s      as above; it includes detecting the loss: b's lease (TTL 2 s) must
#                        run out before the survivors' next round closes
#           redone, job_s  as above (job_s: both started to a's exit)
#   kill  three agents (a, b, c) of 2 workers each start together (last call 6 s: all are in
#         round 0 at world 6, checked), and rank 1 (node a's second worker) SIGKILLs itself
#         at step --at; in place its agent replaces it and the job goes on at world 5 until
#         the replacement joins, in restart mode every worker restarts. pause_s, redone and
#         job_s as above (job_s: the three started to the last one's exit).
#   preempt  as loss, but b's agent gets SIGTERM (a preemption notice): its workers take the
#         last checkpoint, hand over and leave, and a's go on at world 2 (b's agent exits 143).
#   copies  as loss, in place, with a sharded table of --table-rows rows (rg-exact
#         --table-rows), and instead of the two modes the two numbers of buddy copies a rank
#         keeps of another's rows ($REGROUP_TABLE_BUDDY_COPIES 1 and 2, interleaved): how often
#         a node lost at a random moment takes the job back to its disk checkpoint because some
#         rows were held at no step a member is at (fallbacks_to_disk: runs whose regroup said
#         the rows were held by no member and which resumed from a checkpoint; any other
#         resume fails the bench), and the pause and steps redone with it.
#   to_training_s  (loss) from node b's SIGKILL to the step that ends the longest gap after
#                it: the first the survivors completed at world 2
# --workload torch --scenario loss has a third side, interleaved with the two: torchrun + DDP
# on gloo (see run_loss_torchrun), what a PyTorch user has today.
# --spare-ab adds another side to every scenario but copies, interleaved: in place with
# REGROUP_SPARE_WORKER=0 (every new group makes its UCX worker in its wire-up, as before the
# spare worker), and to the ratio line the per-repetition ratio of the in-place pauses.
# --workload torch (scenarios loss and preempt) runs examples/python/ddp_trainer.py in each
# agent instead (PyTorch DDP through regroup.train: TorchTrainer, prepare_model, optimizer and
# loader, Fashion-MNIST; --preload=torch,numpy, so that a restarted worker is forked from an
# interpreter that imported torch; its --step-log, rank 0's wall time of each step): the run
# is checked by the last record of its metrics.jsonl (every step of --epochs at world size 2,
# a test accuracy above 0.8) instead of rg-exact's exact=1; the gaps across an epoch's end
# (its evaluation and report) are no pause.
# Prints one JSON line per scenario and mode (medians over the repetitions, with min and max)
# and one per scenario with the per-pair ratio of job times (in-place / restart), then the
# load averages at its start and end. A run that does not end with exact=1 at the expected
# world size fails the benchmark, and so does an in-place run that resumed from a checkpoint or, joining, whose
# node b's workers were no newcomers. The step-log code is shared with rg-bench-recovery.sh
# (rg_bench_steps.py). Holds /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-scale.sh [--build DIR] [--reps N] [--work W] [--epochs E] [--at STEPS]
#                           [--scenario join|loss|kill|preempt|copies|both|all]   (both: join
#                           and loss; all: not copies) [--table-rows N] (copies: 1000)
#                           [--keep DIR]   (every run's logs and step logs, copied to DIR)
#                           [--workload exact|torch]   (torch: --epochs defaults to 2)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh"
rg_bench_lock "$@"
build="$here/../build"
reps=5
work=100000
epochs=6
at=15
at_set=0
scenarios="join loss"
keep=""
workload=exact
epochs_set=0
table_rows=1000
spare_ab=0
usage="usage: $0 [--build DIR] [--reps N] [--work W] [--epochs E] [--at STEPS] [--scenario join|loss|kill|preempt|copies|both|all] [--table-rows N] [--keep DIR] [--workload exact|torch] [--spare-ab]"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --epochs) epochs=$2; epochs_set=1; shift 2 ;;
        --workload) workload=$2; shift 2 ;;
        --at) at=$2; at_set=1; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        --table-rows) table_rows=$2; shift 2 ;;
        --spare-ab) spare_ab=1; shift ;;
        --scenario)
            case "$2" in join|loss|kill|preempt|copies) scenarios=$2 ;; both) scenarios="join loss" ;;
                all) scenarios="join loss kill preempt" ;; *) echo "$usage" >&2; exit 2 ;; esac
            shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
rg_bench_check_reps "$reps"
[[ "$table_rows" =~ ^[0-9]+$ ]] && ((table_rows >= 1)) || { echo "--table-rows must be at least 1" >&2; exit 2; }
[[ "$at" =~ ^[0-9]+$ ]] && ((at >= 2)) || { echo "--at must be at least 2" >&2; exit 2; }
[[ "$epochs" =~ ^[0-9]+$ && "$work" =~ ^[0-9]+$ ]] && ((epochs >= 1)) ||
    { echo "--epochs and --work must be whole numbers (epochs >= 1)" >&2; exit 2; }
python=/usr/bin/python3   # Debian's, with python3-torch
case $workload in
exact)
    [[ -x "$build/regroup" && -x "$build/examples/rg-exact" ]] || {
        echo "$build/regroup or $build/examples/rg-exact not built" >&2; exit 2; }
    steps_per_epoch=25 ;;   # rg-exact's 1000 samples in batches of 40
torch)
    [[ -x "$build/regroup" && -e "$build/libregroup.so" ]] || {
        echo "$build/regroup or $build/libregroup.so not built" >&2; exit 2; }
    "$python" -c "import torch" 2>/dev/null || { echo "$python cannot import torch" >&2; exit 2; }
    for s in $scenarios; do
        [[ "$s" == loss || "$s" == preempt ]] ||
            { echo "--workload torch runs the loss and preempt scenarios only" >&2; exit 2; }
    done
    ((epochs_set)) || epochs=2
    ((at_set)) || at=200
    steps_per_epoch=938 ;;  # Fashion-MNIST's 60,000 samples in global batches of 64
*) echo "$usage" >&2; exit 2 ;;
esac
epoch_gap=0   # the torch workload evaluates and reports at each epoch's end: no pause
[[ "$workload" != torch ]] || epoch_gap=$steps_per_epoch
# The event must come early enough for the job to go on well past it.
((at + 10 < epochs * steps_per_epoch)) ||
    { echo "--at must be well below the job's $((epochs * steps_per_epoch)) steps" >&2; exit 2; }

free_port() { rg_bench_free_port; }
out=$(mktemp -d /tmp/rg-bench-scale.XXXXXX)
pids=()
trap rg_bench_cleanup EXIT
rg_bench_etcd_start "$out"
cport=${rg_bench_etcd_ep##*:}
export UCX_NET_DEVICES=lo REGROUP_LOG_LEVEL=info
if [[ "$workload" == torch ]]; then
    export PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
        REGROUP_LIBRARY="$build/libregroup.so" REGROUP_LAUNCHER="$build/regroup"
fi
load_start=$(rg_bench_loadavg)

now_ms() { rg_bench_now_ms; }
fail() { rg_bench_fail "$@"; }
show() { rg_bench_show "$@"; }

# Node $2's agent for run directory $1 (mode $3, job id $4, --rdzv-conf $5, --nnodes $6 or
# 1:2, rg-exact's further arguments after them), in the background; its pid (the agent's
# own: b's is SIGKILLed) is appended to pids. Every agent's life is bounded: the waits below
# have deadlines and cleanup kills what is left.
agent() {
    local d=$1 name=$2 mode=$3 id=$4 conf=$5 nnodes=${6:-1:2} spare=1
    shift $(($# < 6 ? $# : 6))
    [[ "$mode" != in-place-no-spare ]] || mode=in-place spare=0
    local prog=("$build/examples/rg-exact" --epochs "$epochs" --work "$work"
                --step-log "$d/steps.txt" "$@")
    local pre=()
    if [[ "$workload" == torch ]]; then
        pre=(--preload=torch,numpy)
        # (--data-cache: the data set decompressed once a run, a restarted worker reads it)
        prog=("$python" "$here/../examples/python/ddp_trainer.py" --workers 4
              --epochs "$epochs" --recovery "$mode" --storage "$d" --name run
              --data-cache "$d/data" --step-log "$d/steps.txt" "$@")
    fi
    REGROUP_SPARE_WORKER=$spare REGROUP_CKPT_DIR="$d/ckpt" "$build/regroup" \
        --rdzv-endpoint="127.0.0.1:$cport" \
        --rdzv-id="$id" --nnodes="$nnodes" --nproc-per-node=2 --max-restarts=3 \
        --recovery="$mode" --rdzv-conf="$conf" "${pre[@]}" "${prog[@]}" \
        >"$d/$name.log" 2>&1 &
    pids+=($!)
}

# Waits until the step log of run directory $1 has $2 steps, while agent $3 runs (60 s).
wait_steps() {
    local why=0
    rg_bench_poll 60000 "$3" has_steps "$1/steps.txt" "$2" || why=$?
    ((why != 1)) || { show "$1"/*.log; fail "$1: an agent ended before step $2"; }
    ((why != 2)) || { show "$1"/*.log; fail "$1: no step $2 within 60 s"; }
}

# Whether step log $1 has $2 lines or more.
has_steps() { [[ -e "$1" ]] && (( $(wc -l <"$1") >= $2 )); }

# Waits for agent $1 (300 s at most; then it is killed) and sets rc to its exit status.
wait_agent() { rg_bench_wait_child "$1" 300000; }

# The run's result: exactly one exact= line, exact=1 at world size $2 (the torch workload:
# its metrics.jsonl's last record at the job's last step, world size $2, accuracy > 0.8).
check_exact() {
    local line
    if [[ "$workload" == torch ]]; then
        "$python" - "$1/run/metrics.jsonl" "$2" "$((epochs * steps_per_epoch))" <<'PY' ||
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
last = recs[-1]
ok = (last["step"] == int(sys.argv[3]) and last["world_size"] == int(sys.argv[2])
      and last["metrics"]["test_accuracy"] > 0.8)
sys.exit(0 if ok else "last record: %s" % last)
PY
            { show "$1"/*.log; fail "$1: the torch job did not end at world size $2"; }
        return
    fi
    line=$(cat "$1"/[abc].log | grep -a '^exact=' || true)
    [[ "$(grep -c . <<<"$line")" == 1 && "$line" == exact=1* && "$line" == *" world=$2" ]] ||
        { show "$1"/*.log; fail "$1: not exact at world size $2: ${line:-no exact= line}"; }
}

run_join() { # $1 = mode (restart|in-place), $2 = repetition
    local d="$out/join-$1-$2" conf="lease_ttl=2,last_call_timeout=0.5,join_timeout=30"
    mkdir -p "$d/ckpt"
    local t0 tb t1 a b rca rcb
    t0=$(now_ms)
    agent "$d" a "$1" "join-$1-$2" "$conf"; a=$!
    wait_steps "$d" "$at" "$a"
    tb=$(now_ms)
    agent "$d" b "$1" "join-$1-$2" "$conf"; b=$!
    wait_agent "$a"; rca=$rc
    wait_agent "$b"; rcb=$rc
    t1=$(now_ms)
    pids=()
    [[ "$rca" == 0 && "$rcb" == 0 ]] || { show "$d"/[ab].log; fail "$d: agents exited $rca and $rcb"; }
    check_exact "$d" 4
    # The step the job went on from at world 4: rank 0 says it, in place or after a restart.
    local from
    if [[ "$1" == in-place* ]]; then
        from=$(cat "$d"/[ab].log | sed -n 's/^regrouped: .* world 4 from step \([0-9]*\),.*/\1/p' | head -1)
        ! grep -aq "resumed from step" "$d"/[ab].log || fail "$d: resumed from a checkpoint in place"
        grep -aq "started (joining 1)" "$d/b.log" ||
            { show "$d/b.log"; fail "$d: node b's workers were no newcomers (it joined by a restart)"; }
    else
        from=$(cat "$d"/[ab].log | sed -n 's/^resumed from step \([0-9]*\) at world size 4$/\1/p' | head -1)
    fi
    [[ -n "$from" ]] || { show "$d"/[ab].log; fail "$d: rank 0 never said it went on at world 4"; }
    echo "join $1 $2 $((t1 - t0)) $tb $from 0" >>"$out/runs.txt"
}

run_loss() { # $1 = mode (restart|in-place|copies-1|copies-2), $2 = repetition; $3 = the signal (KILL)
    local sig=${3:-KILL} scen=loss mode=$1 table=() fb=0
    [[ "$sig" == KILL ]] || scen=preempt
    if [[ "$1" == copies-* ]]; then   # in place, with a table and that many buddy copies
        scen=copies mode=in-place table=(--table-rows "$table_rows")
    fi
    local d="$out/$scen-$1-$2" conf="lease_ttl=2,last_call_timeout=6,join_timeout=30"
    mkdir -p "$d/ckpt"
    local t0 tk t1 a b rca rcb
    t0=$(now_ms)
    [[ "$scen" != copies ]] || export REGROUP_TABLE_BUDDY_COPIES=${1#copies-}
    agent "$d" a "$mode" "$scen-$1-$2" "$conf" 1:2 "${table[@]}"; a=$!
    agent "$d" b "$mode" "$scen-$1-$2" "$conf" 1:2 "${table[@]}"; b=$!
    unset REGROUP_TABLE_BUDDY_COPIES
    wait_steps "$d" "$at" "$a"
    grep -aq "round 0: started 2 workers (ranks [0-9]*\.\.[0-9]* of 4," "$d/b.log" ||
        { show "$d"/[ab].log; fail "$d: node b's workers were not in round 0 at world 4"; }
    tk=$(now_ms)
    kill -"$sig" "$b"
    wait_agent "$b" 2>/dev/null; rcb=$rc   # without bash's "Killed" notice
    wait_agent "$a"; rca=$rc
    t1=$(now_ms)
    pids=()
    local want=137
    [[ "$sig" == KILL ]] || want=143
    [[ "$rca" == 0 && "$rcb" == "$want" ]] ||
        { show "$d"/[ab].log; fail "$d: agents exited $rca and $rcb"; }
    [[ "$sig" == KILL ]] || grep -aq "this node leaves the job: SIGTERM" "$d/b.log" ||
        { show "$d/b.log"; fail "$d: node b did not leave on SIGTERM"; }
    check_exact "$d" 2
    if [[ "$workload" == torch && "$mode" == in-place* ]]; then
        [[ "$(grep -ac "started 2 workers" "$d/a.log")" == 1 ]] ||
            { show "$d/a.log"; fail "$d: node a's workers were started again in place"; }
    elif [[ "$mode" == in-place* ]] && grep -aq "resumed from step" "$d/a.log"; then
        [[ "$scen" == copies ]] && grep -aq "held by no member" "$d/a.log" ||
            fail "$d: resumed from a checkpoint in place"
        fb=1   # the table's rows were held at no common step: back to the disk checkpoint
    fi
    echo "$scen $1 $2 $((t1 - t0)) $tk -1 $fb" >>"$out/runs.txt"
}

# The reference of --workload torch --scenario loss: what a torchrun user has. Two torchrun
# agents (c10d rendezvous on a free loopback port, hosted by node a's; --nnodes=1:2, last
# call 1 s, --max_restarts=3) of 2 workers each running bench/rg_bench_fmnist_ddp.py on gloo
# (b started once a hosts the store; the same model, data, optimizer and global batch; rank 0
# torch.save()s every 200 steps, as ddp_trainer.py reports every epoch), and at step --at
# node b lost: its agent and workers SIGKILLed together (torchrun's workers do not die with
# their agent). Node a's agent restarts its workers, which resume from the last torch.save
# at world 2.
torchrun_node() { # $1 = run directory, $2 = node name, $3 = rendezvous port
    "$python" -m torch.distributed.run --nnodes=1:2 --nproc_per_node=2 --rdzv_backend=c10d \
        --rdzv_endpoint="127.0.0.1:$3" --rdzv_id=bench --rdzv_conf=last_call_timeout=1 \
        --max_restarts=3 --redirects 2 --tee 2 --log_dir "$1/logs-$2" \
        "$here/rg_bench_fmnist_ddp.py" --backend gloo --ckpt-dir "$1/ckpt" \
        --epochs "$epochs" --ckpt-every 200 --log-every 100 --schedule constant \
        --step-log "$1/steps.txt" >"$1/$2.log" 2>&1 &
    pids+=($!)
}

# Whether something listens on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The pids of process $1 and all its descendants.
tree_pids() {
    local p=$1 c
    echo "$p"
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do tree_pids "$c"; done
}

run_loss_torchrun() { # $1 = repetition
    local d="$out/loss-torchrun-$1" port t0 tk t1 a b rca line
    mkdir -p "$d/ckpt"
    port=$(free_port)
    t0=$(now_ms)
    torchrun_node "$d" a "$port"; a=$!
    # b once a's agent hosts the rendezvous' store: the node that stays (whichever agent binds
    # the port first hosts it, and the job cannot outlive its host)
    local why=0
    rg_bench_poll 30000 "$a" port_open "$port" || why=$?
    ((why == 0)) || { show "$d/a.log"; fail "$d: node a's torchrun hosts no store within 30 s"; }
    torchrun_node "$d" b "$port"; b=$!
    # With a last call of 1 s, a often starts alone and torchrun takes b in with a restart:
    # the kill comes once rank 0 has logged steps at world 4 (every 100), and --at steps.
    wait_steps "$d" "$at" "$a"
    why=0
    rg_bench_poll 120000 "$a" grep -aq " world=4$" "$d/a.log" "$d/b.log" || why=$?
    ((why == 0)) || { show "$d"/[ab].log; fail "$d: the job did not train at world 4"; }
    local victims
    victims=$(tree_pids "$b")
    tk=$(now_ms)
    # shellcheck disable=SC2086 # one pid a word
    kill -KILL $victims 2>/dev/null || true
    wait_agent "$b" 2>/dev/null
    wait_agent "$a"; rca=$rc
    t1=$(now_ms)
    pids=()
    [[ "$rca" == 0 ]] || { show "$d"/[ab].log; fail "$d: node a's torchrun exited $rca"; }
    line=$(grep -a '^test_accuracy=' "$d/a.log" || true)
    grep -aq "^world=2 samples_per_s=" "$d/a.log" && [[ "$(grep -c . <<<"$line")" == 1 ]] &&
        "$python" -c "import sys; sys.exit(float(sys.argv[1]) <= 0.8)" "${line#*=}" ||
        { show "$d/a.log"; fail "$d: node a did not finish at world 2 above 0.8 accuracy"; }
    echo "loss torchrun $1 $((t1 - t0)) $tk -1 0" >>"$out/runs.txt"
}

run_copies() { run_loss "$1" "$2"; }

run_preempt() { run_loss "$1" "$2" TERM; }

run_kill() { # $1 = mode (restart|in-place), $2 = repetition
    local d="$out/kill-$1-$2" conf="lease_ttl=2,last_call_timeout=6,join_timeout=30"
    mkdir -p "$d/ckpt"
    local t0 t1 a b c rca rcb rcc
    t0=$(now_ms)
    agent "$d" a "$1" "kill-$1-$2" "$conf" 1:3 --kill-at "$at" --kill-rank 1; a=$!
    agent "$d" b "$1" "kill-$1-$2" "$conf" 1:3 --kill-at "$at" --kill-rank 1; b=$!
    agent "$d" c "$1" "kill-$1-$2" "$conf" 1:3 --kill-at "$at" --kill-rank 1; c=$!
    wait_agent "$a"; rca=$rc
    wait_agent "$b"; rcb=$rc
    wait_agent "$c"; rcc=$rc
    t1=$(now_ms)
    pids=()
    [[ "$rca" == 0 && "$rcb" == 0 && "$rcc" == 0 ]] ||
        { show "$d"/[abc].log; fail "$d: agents exited $rca, $rcb and $rcc"; }
    local n0
    n0=$(cat "$d"/[abc].log | grep -ac "round 0: started 2 workers (ranks [0-9]*\.\.[0-9]* of 6," || true)
    [[ "$n0" == 3 ]] || { show "$d"/[abc].log; fail "$d: not every node was in round 0 at world 6"; }
    cat "$d"/[abc].log | grep -aq "killing myself at step $at" ||
        { show "$d"/[abc].log; fail "$d: rank 1 did not kill itself at step $at"; }
    check_exact "$d" 6
    if [[ "$1" == in-place* ]]; then
        ! grep -aq "resumed from step" "$d"/[abc].log || fail "$d: resumed from a checkpoint in place"
    fi
    echo "kill $1 $2 $((t1 - t0)) -1 -1 0" >>"$out/runs.txt"
}

for s in $scenarios; do
    m1=restart m2=in-place
    [[ "$s" != copies ]] || m1=copies-1 m2=copies-2
    ref=0   # the torch workload's node loss has torchrun's as a third side
    [[ "$workload" != torch || "$s" != loss ]] || ref=1
    ab=$spare_ab   # in place without the spare UCX worker as another side
    [[ "$s" != copies ]] || ab=0
    for ((r = 0; r < reps; r++)); do
        if ((r % 2 == 0)); then "run_$s" "$m1" "$r"; "run_$s" "$m2" "$r"
            ((ref == 0)) || run_loss_torchrun "$r"
            ((ab == 0)) || "run_$s" in-place-no-spare "$r"
        else
            ((ab == 0)) || "run_$s" in-place-no-spare "$r"
            ((ref == 0)) || run_loss_torchrun "$r"
            "run_$s" "$m2" "$r"; "run_$s" "$m1" "$r"; fi
    done
done

PYTHONPATH="$here" /usr/bin/python3 - "$out" "$reps" "$work" "$epochs" "$at" "$here/.." "$build" \
    "$load_start" "$table_rows" "$workload" "$epoch_gap" <<'EOF'
import json, os, sys
from rg_bench_steps import build_meta, fault_ends, pause_redone, read, stats
out, reps, work, epochs, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
meta = build_meta(sys.argv[6], sys.argv[7])
epoch_steps = int(sys.argv[11])   # the torch workload's: its epoch-end evaluations are no fault
runs = {}
for line in open(os.path.join(out, "runs.txt")):
    scen, mode, rep, job_ms, event_ms, frm, fb = line.split()
    runs[(scen, mode, int(rep))] = (int(job_ms) / 1000.0, int(event_ms), int(frm), int(fb))

def first_at(steps, frm):
    """The time (ms) of the first step completed after going on from step frm: the step
    frm + 1 that follows a restart (a step log going back) where there are several."""
    idx = [i for i, (s, _) in enumerate(steps) if s == frm + 1]
    if not idx:
        raise SystemExit(f"step {frm + 1} never completed")
    after = [i for i in idx if i > 0 and steps[i - 1][0] >= frm + 1]
    return steps[(after or idx)[0]][1]

def to_training(steps, event_ms, epoch_steps):
    """Seconds from the event to the step that ends the longest gap after it (not counting
    an epoch's end, as pause_redone): the first the survivors completed at their new size."""
    ends = [i for i in fault_ends(steps, epoch_steps) if steps[i][1] > event_ms]
    if not ends:
        raise SystemExit("no step completed after the event")
    i = max(ends, key=lambda i: steps[i][1] - steps[i - 1][1])
    return (steps[i][1] - event_ms) / 1000.0

names = {"join": "node-joins", "loss": "node-lost", "kill": "worker-sigkill",
         "preempt": "node-preempted", "copies": "node-lost-table"}
order = ["join", "loss", "kill", "preempt", "copies"]
for scen in sorted({k[0] for k in runs}, key=order.index):
    jobs = {}
    modes = ("copies-1", "copies-2") if scen == "copies" else ("restart", "in-place")
    if scen == "loss" and ("loss", "torchrun", 0) in runs:
        modes += ("torchrun",)
    if (scen, "in-place-no-spare", 0) in runs:
        modes += ("in-place-no-spare",)
    pauses = {}
    for mode in modes:
        res = []
        for r in range(reps):
            job_s, event_ms, frm, fb = runs[(scen, mode, r)]
            steps = read(os.path.join(out, f"{scen}-{mode}-{r}", "steps.txt"))
            pause, redone, step_s = pause_redone(steps, epoch_steps)
            extra = None
            if scen == "join":
                extra = (first_at(steps, frm) - event_ms) / 1000.0
            elif scen == "loss":
                extra = to_training(steps, event_ms, epoch_steps)
            res.append((pause, redone, step_s, job_s, extra, fb))
            jobs[(mode, r)] = job_s
        pauses[mode] = [x[0] for x in res]
        line = {"bench": "scale", "scenario": names[scen],
                "mode": mode, "nodes": 3 if scen == "kill" else 2, "workers_per_node": 2,
                "work": work,
                "epochs": epochs, "event_at_step": at, "lease_ttl_s": 2, "reps": reps,
                "pause_s": stats([x[0] for x in res]),
                "steps_redone": stats([x[1] for x in res]),
                "step_s": stats([x[2] for x in res])}
        if scen == "join":
            line["to_world4_s"] = stats([x[4] for x in res])
        if scen == "loss":
            line["to_training_s"] = stats([x[4] for x in res])
        line["workload"] = sys.argv[10]
        if scen == "copies":
            line["table_rows"] = int(sys.argv[9])
            line["fallbacks_to_disk"] = sum(x[5] for x in res)
        line["job_s"] = stats([x[3] for x in res])
        print(json.dumps({**line, **meta}))
    ratios = [jobs[(modes[1], r)] / jobs[(modes[0], r)] for r in range(reps)]
    key = "job_time_ratio_" + "_over_".join(m.replace("-", "_") for m in modes[1::-1])
    line = {"bench": "scale", "scenario": names[scen], key: stats(ratios), "reps": reps}
    if "torchrun" in modes:
        line["job_time_ratio_in_place_over_torchrun"] = stats(
            [jobs[("in-place", r)] / jobs[("torchrun", r)] for r in range(reps)])
    if "in-place-no-spare" in modes:
        line["pause_ratio_spare_over_no_spare"] = stats(
            [a / b for a, b in zip(pauses["in-place"], pauses["in-place-no-spare"]) if b > 0])
    print(json.dumps({**line, **meta}))
print(json.dumps({"bench": "scale", "loadavg_start": sys.argv[8].split(),
                  "loadavg_end": open("/proc/loadavg").read().split()[:3], **meta}))
EOF
