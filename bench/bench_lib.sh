# shellcheck shell=bash disable=SC2034 # rc is set for the caller
# Shell pieces the bench scripts share; sourced (bash), never run. The caller sets
# `set -euo pipefail` first. Holds no state of its own beyond the functions.
#
#   . "$(dirname "$0")/bench_lib.sh"
#   rg_bench_lock "$@"        # first: re-runs the script under /tmp/regroup-bench.lock
#   rg_bench_check_reps "$reps"

# Re-runs the calling script under flock /tmp/regroup-bench.lock (once: RG_BENCH_LOCKED marks
# the locked run), so that no two benchmarks run at once. Pass the script's "$@".
rg_bench_lock() {
    if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
        RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
    fi
}

# Exits 2 unless $1 is a whole number 5..100: every figure is a median of 5 or more.
rg_bench_check_reps() {
    [[ "$1" =~ ^[0-9]+$ ]] && (($1 >= 5 && $1 <= 100)) ||
        { echo "--reps must be 5..100 (medians of 5 or more)" >&2; exit 2; }
}

rg_bench_now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The two below start no process, for the loops that poll while a benchmark's job runs: on
# this 2-core machine a poll every 20 ms that forks date, grep and sleep took about a tenth
# of a core from the job it measured.
# Sets the variable named $1 to the wall clock in milliseconds (bash's EPOCHREALTIME).
rg_bench_ms_into() { local t=${EPOCHREALTIME/[.,]/}; printf -v "$1" '%d' $((10#$t / 1000)); }
# Sleeps $1 seconds: a read with a timeout on a pipe that nobody else writes to.
rg_bench_nap() {
    [[ -n "${rg_bench_nap_fd:-}" ]] || exec {rg_bench_nap_fd}<> <(:)
    read -rt "$1" -u "$rg_bench_nap_fd" _ || true
}

# Prints "${0##*/}: MESSAGE" on stderr and exits 1.
rg_bench_fail() { echo "${0##*/}: $*" >&2; exit 1; }

# The last 20 lines of each file named, on stderr.
rg_bench_show() { for f in "$@"; do echo "--- $f" >&2; tail -20 "$f" >&2; done; }

# The load averages (1, 5, 15 minutes), space-separated.
rg_bench_loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# Runs "${@:3}" every 20 ms until it succeeds (returns 0), process $2 has ended (1) or $1 ms
# have passed (2).
rg_bench_poll() {
    local ms=$1 pid=$2 now end
    shift 2
    rg_bench_ms_into now
    end=$((now + ms))
    until "$@"; do
        kill -0 "$pid" 2>/dev/null || return 1
        rg_bench_ms_into now
        ((now < end)) || return 2
        rg_bench_nap 0.02
    done
}

# Waits for background child $1 for at most $2 ms (then it is SIGKILLed) and sets rc to its
# exit status (137 when it was killed).
rg_bench_wait_child() {
    local now deadline
    rg_bench_ms_into now
    deadline=$((now + $2))
    while kill -0 "$1" 2>/dev/null; do
        rg_bench_ms_into now
        if ((now >= deadline)); then
            kill -KILL "$1" 2>/dev/null || true
            break
        fi
        rg_bench_nap 0.02
    done
    rc=0
    wait "$1" || rc=$?
}

# A free TCP port on 127.0.0.1 (bound and released: the caller binds it soon after).
rg_bench_free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts a single-member etcd on free loopback ports, its data and log under directory $1
# (fast raft timing: heartbeat 50 ms, election 500 ms), and waits until it is healthy (10 s,
# else it exits 1 with the log's end). Sets rg_bench_etcd_pid (the caller stops it by that
# pid) and rg_bench_etcd_ep (HOST:PORT of its client URL).
rg_bench_etcd_start() {
    local d=$1 cport pport
    cport=$(rg_bench_free_port)
    pport=$(rg_bench_free_port)
    etcd --name bench --data-dir "$d/etcd" \
         --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
         --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
         --initial-cluster "bench=http://127.0.0.1:$pport" \
         --heartbeat-interval=50 --election-timeout=500 >"$d/etcd.log" 2>&1 &
    rg_bench_etcd_pid=$!
    rg_bench_etcd_ep="127.0.0.1:$cport"
    local _
    for _ in $(seq 100); do
        if ETCDCTL_API=3 etcdctl --endpoints "$rg_bench_etcd_ep" endpoint health >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    echo "etcd did not become healthy in 10 s:" >&2
    tail -5 "$d/etcd.log" >&2
    kill "$rg_bench_etcd_pid" 2>/dev/null || true
    wait "$rg_bench_etcd_pid" 2>/dev/null || true
    exit 1
}

# The EXIT trap of the benches that run agents on rg_bench_etcd_start's etcd: SIGKILLs the
# pids in the caller's array pids, stops that etcd, copies the run directory $out to $keep
# when keep is set (every run's logs and step logs), and removes $out.
rg_bench_cleanup() {
    local p
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    if [[ -n "${rg_bench_etcd_pid:-}" ]]; then
        kill "$rg_bench_etcd_pid" 2>/dev/null || true
        wait "$rg_bench_etcd_pid" 2>/dev/null || true
    fi
    if [[ -n "${keep:-}" ]]; then
        mkdir -p "$keep" && cp -r "$out"/. "$keep"/ || true
    fi
    rm -rf "$out"
}
