#!/usr/bin/env bash
# regroup under a real Slurm: a one-node cluster on this machine (munged, slurmctld and slurmd
# from Debian's packages, each with its own key, sockets, ports, state, logs and pid files in a
# temporary directory) and a private etcd on a free loopback port; then
#   srun -N1 -n1 regroup --nproc-per-node=2 --rdzv-endpoint=127.0.0.1:PORT WORKER
# must give the job id as the rendezvous id (TORCHELASTIC_RUN_ID), Slurm's node count and the
# node's name as the defaults --print-config shows with their sources, and a world of 2 that
# exits 0; `srun -n2` on one node must be refused; and a batch job requeued after its first
# checkpoint (sbatch --requeue, scontrol requeue) must come back under its job id, resume
# from that checkpoint and end with the exact result. Every wait is bounded; an EXIT trap stops what it started, by pid, and removes the
# temporary directory. Where a daemon cannot start here (no munge or Slurm installed, not
# root, a daemon that exits), it exits 77 (ctest's SKIP_RETURN_CODE) and says why.
#   test_slurm.sh BUILD_DIR
set -euo pipefail

build=$(cd "$1" && pwd)
regroup=$build/regroup
SKIP=77

skip() {
    echo "test_slurm: SKIP: $*"
    exit $SKIP
}
fail() {
    echo "test_slurm: FAIL: $*" >&2
    exit 1
}
step() {
    echo "== $*"
}

for cmd in munged slurmctld slurmd srun sinfo scontrol squeue scancel etcd etcdctl ss; do
    command -v "$cmd" >/dev/null ||
        skip "no $cmd here (scripts/setup.sh installs munge, slurmctld, slurmd, slurm-client)"
done
[[ $(id -u) -eq 0 ]] || skip "not root: slurmd starts job steps as their user only as root"
[[ -x $regroup ]] || fail "no $regroup"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/regroup-slurm.XXXXXX")
chmod 700 "$tmp"
pids=()
cleanup() {
    local rc=$?
    # The job steps first (their slurmstepd is slurmd's, not ours): this private controller
    # holds only this script's jobs.
    if [[ -n ${ctld_pid:-} ]] && kill -0 "$ctld_pid" 2>/dev/null; then
        timeout 10 scancel --user=root 2>/dev/null || true
        # shellcheck disable=SC2016 # expanded by the inner shell, at each turn
        timeout 15 bash -c 'while [[ -n $(squeue -h -o %i 2>/dev/null) ]]; do sleep 0.2; done' ||
            true
    fi
    # Then the daemons, last started first: slurmd, slurmctld, munged; etcd whenever.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${pids[i]}" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback TCP port (not listened on now, nor chosen before by this script).
chosen=" "
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        if [[ $chosen != *" $p "* ]] && ! ss -Htan "( sport = :$p )" | grep -q .; then
            chosen+="$p "
            echo "$p"
            return 0
        fi
    done
    fail "no free port"
}

# log_tail FILE: its last lines, for a skip or a failure.
log_tail() {
    tail -n 15 "$1" 2>/dev/null | sed 's/^/    /' || true
}
# gone PID WHAT LOG...: if a daemon we started has exited, shows its logs and skips with the
# reason it gave (its last error line).
gone() {
    local pid=$1 what=$2 reason
    shift 2
    kill -0 "$pid" 2>/dev/null && return 0
    for f in "$@"; do
        [[ -s $f ]] && { echo "$what's $f:"; log_tail "$f"; }
    done
    reason=$(cat "$@" 2>/dev/null | grep -iE 'error|fatal|fail' | tail -n 1 || true)
    skip "$what cannot start here: ${reason:-it exited without saying why}"
}
# up_within SECONDS PID CONDITION: waits until the shell condition holds, at most SECONDS,
# and while the daemon PID runs.
up_within() {
    timeout "$1" bash -c "until $3; do kill -0 $2 2>/dev/null || exit 1; sleep 0.2; done"
}

# ---- munge --------------------------------------------------------------------------------
step "munged"
mkdir -m 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munge_sock=$tmp/munge/munge.socket
munged -F -f --socket="$munge_sock" --key-file="$tmp/munge/munge.key" \
    --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/munge/munged.log" \
    --seed-file="$tmp/munge/munged.seed" >"$tmp/munge/stdout.log" 2>&1 &
pids+=($!)
munged_pid=$!
up_within 10 "$munged_pid" "[[ -S '$munge_sock' ]]" || true
gone "$munged_pid" munged "$tmp/munge/stdout.log" "$tmp/munge/munged.log"
[[ -S $munge_sock ]] || skip "munged made no socket in 10 s"
if command -v munge >/dev/null; then
    echo probe | timeout 10 munge --socket="$munge_sock" | timeout 10 unmunge --socket="$munge_sock" \
        >/dev/null || skip "munged answers no credential request"
fi

# ---- slurm.conf ---------------------------------------------------------------------------
ctld_port=$(free_port)
slurmd_port=$(free_port)
srun_lo=$(free_port)
cpus=$(nproc)
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/log"
export SLURM_CONF=$tmp/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=regrouptest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SrunPortRange=$srun_lo-$((srun_lo + 20))
CommunicationParameters=NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: how long a requeued job waits before it may start again (120 s by default)
AuthInfo=socket=$munge_sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmdDebug=info
SlurmctldDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
SlurmdParameters=config_overrides
TmpFS=$tmp
PlugStackConfig=$tmp/plugstack.conf
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=10 State=UP
EOF
: >"$tmp/plugstack.conf"

# ---- slurmctld, slurmd --------------------------------------------------------------------
step "slurmctld on 127.0.0.1:$ctld_port, slurmd on 127.0.0.1:$slurmd_port"
slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
ctld_pid=$!
if ! up_within 20 "$ctld_pid" "scontrol ping 2>/dev/null | grep -q UP"; then
    gone "$ctld_pid" slurmctld "$tmp/log/slurmctld.out" "$tmp/log/slurmctld.log"
    log_tail "$tmp/log/slurmctld.log"
    skip "slurmctld does not answer scontrol ping in 20 s"
fi
slurmd -D -f "$SLURM_CONF" -N localhost >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
slurmd_pid=$!
if ! up_within 30 "$slurmd_pid" "sinfo -h -N -o %t 2>/dev/null | grep -qx idle"; then
    gone "$slurmd_pid" slurmd "$tmp/log/slurmd.out" "$tmp/log/slurmd.log"
    sinfo -N -l 2>&1 | sed 's/^/    /' || true
    log_tail "$tmp/log/slurmd.log"
    skip "the node does not become idle in 30 s (see slurmd's log above)"
fi
sinfo -N

# ---- etcd, the job's rendezvous -----------------------------------------------------------
etcd_port=$(free_port)
etcd_peer=$(free_port)
step "etcd on 127.0.0.1:$etcd_port"
etcd --name rg-slurm --data-dir "$tmp/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "rg-slurm=http://127.0.0.1:$etcd_peer" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
etcd_pid=$!
up_within 20 "$etcd_pid" "ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:$etcd_port endpoint health >/dev/null 2>&1" ||
    { log_tail "$tmp/etcd.log"; fail "etcd did not become healthy in 20 s"; }

# ---- the job ------------------------------------------------------------------------------
cat >"$tmp/worker.sh" <<'EOF'
#!/bin/sh
echo "worker rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE run_id=$TORCHELASTIC_RUN_ID job=$SLURM_JOB_ID"
EOF
chmod +x "$tmp/worker.sh"

step "srun regroup --print-config"
timeout 60 srun -N1 -n1 -t 2 "$regroup" --print-config --nproc-per-node=2 \
    --rdzv-endpoint=127.0.0.1:"$etcd_port" >"$tmp/config.out" 2>&1 ||
    { cat "$tmp/config.out"; log_tail "$tmp/log/slurmd.log"; fail "srun regroup --print-config"; }
cat "$tmp/config.out"
job=$(sed -n 's/^rdzv_id  *\([0-9][0-9]*\)  *SLURM_JOB_ID$/\1/p' "$tmp/config.out")
[[ -n $job ]] || fail "--print-config under srun has no rdzv_id from SLURM_JOB_ID"
grep -Eq '^nnodes +1:1 +SLURM_STEP_NUM_NODES$' "$tmp/config.out" ||
    fail "--print-config under srun has no nnodes 1:1 from SLURM_STEP_NUM_NODES"
grep -Eq '^local_addr +localhost +SLURMD_NODENAME$' "$tmp/config.out" ||
    fail "--print-config under srun has no local_addr localhost from SLURMD_NODENAME"

step "srun regroup --nproc-per-node=2 worker.sh"
set +e
timeout 120 srun -N1 -n1 -t 2 "$regroup" --nproc-per-node=2 --rdzv-endpoint=127.0.0.1:"$etcd_port" \
    --rdzv-conf=last_call_timeout=0.2 "$tmp/worker.sh" >"$tmp/job.out" 2>&1
rc=$?
set -e
cat "$tmp/job.out"
[[ $rc -eq 0 ]] || { log_tail "$tmp/log/slurmd.log"; fail "srun regroup exited $rc"; }
workers=$(grep -c '^worker ' "$tmp/job.out" || true)
[[ $workers -eq 2 ]] || fail "$workers workers, not 2"
step_job=$(sed -n 's/^worker .* job=\([0-9]*\)$/\1/p' "$tmp/job.out" | sort -u)
[[ -n $step_job ]] || fail "the workers saw no SLURM_JOB_ID"
for r in 0 1; do
    grep -Eq "^worker rank=$r world=2 local=$r/2 run_id=$step_job job=$step_job$" "$tmp/job.out" ||
        fail "no worker rank=$r world=2 with run_id=$step_job (the job id)"
done

step "srun -n2 regroup (two agents on one node): refused, naming the variables"
set +e
timeout 60 srun -N1 -n2 -t 2 "$regroup" --rdzv-endpoint=127.0.0.1:"$etcd_port" "$tmp/worker.sh" \
    >"$tmp/two.out" 2>&1
rc=$?
set -e
sort -u "$tmp/two.out"
[[ $rc -eq 2 ]] || fail "srun -n2 regroup exited $rc, not 2"
grep -q 'SLURM_STEP_NUM_TASKS=2, SLURM_STEP_NUM_NODES=1: srun started 2 tasks on 1 nodes' \
    "$tmp/two.out" || fail "srun -n2 regroup does not say why it refuses"
! grep -q '^worker ' "$tmp/two.out" || fail "srun -n2 regroup started workers"

# A requeued job keeps its job id: its new agents must open the next round of the job that
# the old ones left, and the workers resume from the last checkpoint.
rg_exact=$build/examples/rg-exact
step "sbatch --requeue; scontrol requeue after a checkpoint: the job resumes, exactly"
cat >"$tmp/requeue.sh" <<EOF
#!/bin/sh
echo "batch start restarts=\${SLURM_RESTART_COUNT:-0}"
REGROUP_CKPT_DIR=$tmp/ckpt exec srun "$regroup" --nproc-per-node=2 \\
    --rdzv-endpoint=127.0.0.1:$etcd_port --rdzv-conf=last_call_timeout=0.2 \\
    "$rg_exact" --epochs 300 --ckpt-every 50 --work 20000 --stop-file "$tmp/stop"
EOF
chmod +x "$tmp/requeue.sh"
rjob=$(timeout 20 sbatch --parsable --requeue -N1 -t 5 --open-mode=append \
       -o "$tmp/requeue.out" "$tmp/requeue.sh") || fail "sbatch"
# A committed checkpoint (its MANIFEST), not only a step directory being written: slurm's
# SIGTERM may end the workers before an uncommitted one lands.
up_within 60 "$ctld_pid" "compgen -G '$tmp/ckpt/step-*/MANIFEST' >/dev/null" ||
    { cat "$tmp/requeue.out"; fail "job $rjob committed no checkpoint in 60 s"; }
timeout 20 scontrol requeue "$rjob" || fail "scontrol requeue $rjob"
# Once it resumed, the job ends at its next epoch boundary (--stop-file): the rest of its 300
# epochs would only take time.
up_within 240 "$ctld_pid" "grep -q 'resumed from step' '$tmp/requeue.out'" ||
    { cat "$tmp/requeue.out"; fail "job $rjob did not resume within 240 s of its requeue"; }
: >"$tmp/stop"
job_state() {
    scontrol -o show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'
}
ended="COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY"
for ((i = 0; i < 480; i++)); do
    [[ $(job_state "$rjob") =~ ^($ended)$ ]] && break
    sleep 0.5
done
grep -E '^batch start|resumed from|^exact=' "$tmp/requeue.out" | sort | uniq -c
state=$(job_state "$rjob")
[[ $state == COMPLETED ]] ||
    { cat "$tmp/requeue.out"; fail "job $rjob is $state, not COMPLETED, 240 s after its requeue"; }
grep -q '^batch start restarts=1$' "$tmp/requeue.out" || fail "job $rjob was not requeued"
grep -q 'resumed from step [1-9]' "$tmp/requeue.out" ||
    fail "job $rjob did not resume from its checkpoint after its requeue"
grep -q '^exact=1 ' "$tmp/requeue.out" || fail "job $rjob's result is not exact"

echo "test_slurm: ok (job $step_job: rdzv id = the job id, world size 2, exit 0)"
