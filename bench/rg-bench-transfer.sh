#!/usr/bin/env bash
# How fast an in-place regroup moves the replicated state to a replacement, against the
# transport's own point-to-point bandwidth. Per cell (world 2 and 4, shared memory and tcp):
#   regroup    rg-exact under `regroup --standalone --recovery=in-place`, N workers, rank 1
#              SIGKILLing itself at step --kill-at, with --state-kb KB of extra replicated
#              state (256 MiB by default) that only regroups carry. The replacement joins in
#              a regroup at world N where the state goes from one member (the source) to the
#              members at another step: the replacement alone, the others hold it already
#              (train/train_regroup.c, agree_state). From the workers' info-level log
#              (REGROUP_LOG_LEVEL=info, timestamped lines):
#                transfer_s   the receiver's span, from its "regroup: rank R receives the
#                             state of step S (B bytes) from rank Q in round M" line to its
#                             "regrouped in place ... into round M" line (the chunked sends
#                             into its buffers, reopening the checkpoint store)
#                transfer_GBps  B / transfer_s (1e9 bytes a second)
#                source_s     the source's own span, from its "sends the state" line to its
#                             "regrouped" line (the sends as the sender sees them)
#              and from rank 0's step log (bench/rg_bench_steps.py): pause_s, the longest gap
#              between two completed steps less the median gap (the fault, the regroup at
#              world N-1, the join: both may fall in one gap), and rank 0's own regroup into
#              round M (join_regroup_s).
#   reference  bench/rg-bench-comm.sh -n 2 [--tls tcp] -r 1 -- --op=send --dtype=u8
#              --sizes=KB*1024: rg_comm_send of the same size from one rank to another over
#              the same transport (one sender, one receiver, as in the transfer), on a group
#              of its own, into a buffer it reuses (ref_GBps: bytes / latency).
# The two alternate within each repetition (the order swaps every repetition), so the
# ratio transfer_GBps / ref_GBps is taken per repetition; each cell's line gives medians with
# min and max over the repetitions (>= 5) and "half": "yes" when every ratio is >= 0.5,
# "median" when only the median is, "no" otherwise. shm is comm/'s default (UCX shared memory
# with peer-failure handling), tcp is UCX_TLS=tcp as in rg-bench-comm.sh; UCX_NET_DEVICES=lo
# always. A regroup run fails the bench unless it exits 0 with exactly one exact=1 line,
# resumes from no checkpoint, started a replacement, and its round at world N has one source
# and one receiver, the replacement, of KB*1024 + the small state's bytes; a reference run fails it
# unless rg-bench-comm checked its result. Prints one JSON line per run, one per cell, and
# the load averages at the start and the end. Holds /tmp/regroup-bench.lock.
#
#   bench/rg-bench-transfer.sh [--build DIR] [--reps N] [--state-kb KB] [--work W]
#                              [--kill-at STEP] [--ranks "2 4"] [--transports "shm tcp"]
#                              [--seconds S] [--keep DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/bench_lib.sh"
rg_bench_lock "$@"
build="$here/../build"
reps=5
kb=262144
work=20000
at=40
# 250 steps: the survivors go on for 210 after the kill, some 0.5 s, while the replacement
# starts and writes its 256 MiB (0.2-0.3 s here): it joins well before the end.
epochs=10
ranks="2 4"
transports="shm tcp"
seconds=1
keep=""
dim=16   # rg-exact's default --dim: the small state is dim 64-bit words
usage="usage: $0 [--build DIR] [--reps N] [--state-kb KB] [--work W] [--kill-at STEP]
       [--ranks \"2 4\"] [--transports \"shm tcp\"] [--seconds S] [--keep DIR]"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --state-kb) kb=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        --kill-at) at=$2; shift 2 ;;
        --ranks) ranks=$2; shift 2 ;;
        --transports) transports=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
rg_bench_check_reps "$reps"
[[ "$kb" =~ ^[0-9]+$ ]] && ((kb >= 1 && kb <= 262144)) ||
    { echo "--state-kb must be 1..262144 (rg-exact's limit)" >&2; exit 2; }
[[ "$work" =~ ^[0-9]+$ && "$at" =~ ^[0-9]+$ ]] && ((at >= 5 && at <= 100)) ||
    { echo "--work must be a whole number, --kill-at 5..100 (of rg-exact's $((epochs * 25)) steps)" >&2; exit 2; }
for n in $ranks; do
    [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 2 && n <= 8)) || { echo "--ranks: 2..8 each" >&2; exit 2; }
done
for t in $transports; do
    [[ "$t" == shm || "$t" == tcp ]] || { echo "--transports: shm or tcp each" >&2; exit 2; }
done
[[ "$seconds" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "--seconds must be a number" >&2; exit 2; }
[[ -x "$build/regroup" && -x "$build/examples/rg-exact" && -x "$build/bench/rg-bench-comm" ]] || {
    echo "$build/regroup, $build/examples/rg-exact or $build/bench/rg-bench-comm not built" >&2
    exit 2; }
out=$(mktemp -d /tmp/rg-bench-transfer.XXXXXX)
cleanup() {
    if [[ -n "$keep" ]]; then
        mkdir -p "$keep" && cp -r "$out"/. "$keep"/ || true
    fi
    rm -rf "$out"
}
trap cleanup EXIT
export UCX_NET_DEVICES=lo
unset UCX_TLS
load_start=$(rg_bench_loadavg)
bytes=$((kb * 1024))

# One in-place job of $1 workers over transport $2 (repetition $3), checked; its JSON line
# goes to stdout and to runs.jsonl.
run_regroup() {
    local d="$out/regroup-$2-$1-$3" rc=0 t0 t1
    local tls=(); [[ "$2" == tcp ]] && tls=(UCX_TLS=tcp)
    mkdir -p "$d/ckpt"
    t0=$(rg_bench_now_ms)
    env "${tls[@]}" REGROUP_LOG_LEVEL=info REGROUP_CKPT_DIR="$d/ckpt" timeout 300 \
        "$build/regroup" --standalone --nproc-per-node="$1" --max-restarts=3 \
        --recovery=in-place "$build/examples/rg-exact" --epochs "$epochs" --work "$work" --kill-at "$at" \
        --kill-rank 1 --state-kb "$kb" --step-log "$d/steps.txt" >"$d/log" 2>&1 || rc=$?
    t1=$(rg_bench_now_ms)
    ((rc == 0)) || { rg_bench_show "$d/log"; rg_bench_fail "$d: regroup exited $rc"; }
    PYTHONPATH="$here" /usr/bin/python3 - "$d" "$1" "$2" "$3" "$((bytes + 8 * dim))" \
        "$((t1 - t0))" <<'EOF' | tee -a "$out/runs.jsonl" ||
import json, re, sys
from rg_bench_steps import pause_redone, read
d, n, transport, rep, want, job_ms = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
    int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
def fail(why):
    sys.exit(f"rg-bench-transfer.sh: {d}: {why}")
text = open(f"{d}/log", errors="replace").read()
lines = text.splitlines()
exact = [l for l in lines if l.startswith("exact=")]
if len(exact) != 1 or not exact[0].startswith("exact=1"):
    fail(f"not exactly one exact=1 line: {exact}")
if "resumed from step" in text:
    fail("resumed from a checkpoint in place")
newcomers = {int(p) for p in re.findall(r"^rank \d+: pid (\d+) started \(joining 1\)", text, re.M)}
if len(newcomers) != 1:
    fail(f"not one replacement started: pids {sorted(newcomers)}")
ts = r"\[(\d+\.\d+)\] \[[^:\]]*:(\d+) .*"
recv, sends, done = {}, {}, {}
for l in lines:
    m = re.search(ts + r"regroup: rank (\d+) receives the state of step (-?\d+) \((\d+) bytes\) "
                  r"from rank (\d+) in round (\d+)", l)
    if m:
        recv[(int(m[7]), int(m[3]))] = (float(m[1]), int(m[4]), int(m[5]), int(m[6]), int(m[2]))
        continue
    m = re.search(ts + r"regroup: rank (\d+) sends the state of step (-?\d+) \((\d+) bytes\) "
                  r"to (\d+) members? of round (\d+)", l)
    if m:
        sends.setdefault(int(m[7]), []).append((float(m[1]), int(m[3]), int(m[4]), int(m[5]),
                                                int(m[6])))
        continue
    m = re.search(ts + r"regrouped in place from round (\d+) into round (\d+): rank (\d+) of "
                  r"(\d+), step (-?\d+) \(state from rank (\d+)(, received)?\) in ([0-9.]+) s", l)
    if m:
        done[(int(m[4]), int(m[5]))] = (float(m[1]), int(m[6]), m[9] is not None, float(m[10]))
rounds = sorted({r for (r, _), v in done.items() if v[1] == n})
if not rounds:
    fail(f"no regroup into a round at world {n}")
rnd = rounds[-1]
src = sends.get(rnd, [])
if len(src) != 1 or src[0][3] != want or src[0][4] != 1:
    fail(f"round {rnd}: not one source sending {want} bytes to one member: {src}")
rx = {k[1]: v for k, v in recv.items() if k[0] == rnd}
if len(rx) != 1:
    fail(f"round {rnd}: {len(rx)} receivers, not 1 (the replacement)")
spans, repl = [], []
for rank, (t, step, nbytes, source, pid) in sorted(rx.items()):
    if nbytes != want or step != src[0][2] or source != src[0][1]:
        fail(f"round {rnd}: rank {rank} receives {nbytes} bytes of step {step} from {source}")
    fin = done.get((rnd, rank))
    if fin is None or not fin[2]:
        fail(f"round {rnd}: rank {rank} never said it regrouped with the state received")
    spans.append(fin[0] - t)
    if pid in newcomers:
        repl.append(fin[0] - t)
if len(repl) != 1:
    fail(f"round {rnd}: the replacement is not among the receivers")
if (rnd, 0) not in done or (rnd, src[0][1]) not in done:
    fail(f"round {rnd}: no regrouped line of rank 0 or of the source")
pause, redone, step_s = pause_redone(read(f"{d}/steps.txt"))
xfer = max(spans)
print(json.dumps({"bench": "transfer-run", "kind": "regroup", "ranks": n,
                  "transport": transport, "rep": rep, "round": rnd, "bytes": want,
                  "transfer_s": round(xfer, 6), "transfer_s_receivers": [round(s, 6) for s in spans],
                  "transfer_GBps": round(want / xfer / 1e9, 4),
                  "source_s": round(done[(rnd, src[0][1])][0] - src[0][0], 6),
                  "join_regroup_s": done[(rnd, 0)][3], "pause_s": round(pause, 4),
                  "steps_redone": redone, "step_s": round(step_s, 4),
                  "job_s": job_ms / 1000.0}))
EOF
        { rg_bench_show "$d/log"; rg_bench_fail "$d: the run's figures are not all there"; }
}

# rg-bench-comm's send of the same size between 2 ranks over transport $2, for the cell of $1
# ranks (repetition $3).
run_ref() {
    local d="$out/ref-$2-$1-$3" rc=0
    local tls=(); [[ "$2" == tcp ]] && tls=(--tls tcp)
    timeout 300 "$here/rg-bench-comm.sh" -n 2 "${tls[@]}" -r 1 --build "$build" -- \
        --op=send --dtype=u8 --sizes="$bytes" --seconds="$seconds" >"$d.out" 2>"$d.err" ||
        rc=$?
    ((rc == 0)) || { rg_bench_show "$d.out" "$d.err"; rg_bench_fail "$d: rg-bench-comm.sh exited $rc"; }
    /usr/bin/python3 - "$d.out" "$1" "$2" "$3" "$bytes" <<'EOF' | tee -a "$out/runs.jsonl" ||
import json, sys
path, n, transport, rep, want = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
    int(sys.argv[5])
rows = [json.loads(l) for l in open(path) if l.startswith('{"bench":"comm",')]
rows = [j for j in rows if j.get("op") == "send" and j.get("bytes") == want]
if len(rows) != 1 or rows[0].get("ranks") != 2 or rows[0].get("checked") is not True:
    sys.exit(f"rg-bench-transfer.sh: {path}: not one checked send of {want} bytes on 2 ranks")
j = rows[0]
lat = j["latency_us"] / 1e6
print(json.dumps({"bench": "transfer-run", "kind": "reference", "ranks": n,
                  "ref_ranks": 2, "transport": transport, "rep": rep, "bytes": want,
                  "iters": j["iters"],
                  "latency_s": round(lat, 6), "ref_GBps": round(want / lat / 1e9, 4),
                  "ucx_tls": j["transport"]}))
EOF
        { rg_bench_show "$d.out"; rg_bench_fail "$d: no send figure"; }
}

for ((r = 0; r < reps; r++)); do
    for t in $transports; do
        for n in $ranks; do
            if ((r % 2 == 0)); then run_regroup "$n" "$t" "$r"; run_ref "$n" "$t" "$r"
            else run_ref "$n" "$t" "$r"; run_regroup "$n" "$t" "$r"; fi
        done
    done
done

PYTHONPATH="$here" /usr/bin/python3 - "$out/runs.jsonl" "$reps" "$kb" "$work" "$at" "$here/.." \
    "$build" "$load_start" <<'EOF'
import json, sys
from rg_bench_steps import build_meta, stats
path, reps, kb, work, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5])
meta = build_meta(sys.argv[6], sys.argv[7])
runs = [json.loads(l) for l in open(path)]
cells = sorted({(j["transport"], j["ranks"]) for j in runs}, key=lambda c: (c[0] != "shm", c[1]))
for transport, n in cells:
    mine = [j for j in runs if j["transport"] == transport and j["ranks"] == n]
    rg = {j["rep"]: j for j in mine if j["kind"] == "regroup"}
    ref = {j["rep"]: j for j in mine if j["kind"] == "reference"}
    both = sorted(set(rg) & set(ref))
    ratios = [rg[r]["transfer_GBps"] / ref[r]["ref_GBps"] for r in both]
    med = stats(ratios)["median"]
    half = "yes" if min(ratios) >= 0.5 else "median" if med >= 0.5 else "no"
    print(json.dumps({"bench": "transfer", "ranks": n, "transport": transport,
                      "state_bytes": rg[both[0]]["bytes"], "ref_bytes": ref[both[0]]["bytes"],
                      "reps": len(both), "work": work, "kill_at": at,
                      "transfer_s": stats([rg[r]["transfer_s"] for r in both]),
                      "transfer_GBps": stats([rg[r]["transfer_GBps"] for r in both]),
                      "ref_GBps": stats([ref[r]["ref_GBps"] for r in both]),
                      "ratio": stats(ratios), "half": half,
                      "source_s": stats([rg[r]["source_s"] for r in both]),
                      "join_regroup_s": stats([rg[r]["join_regroup_s"] for r in both]),
                      "pause_s": stats([rg[r]["pause_s"] for r in both]),
                      "job_s": stats([rg[r]["job_s"] for r in both]), **meta}))
print(json.dumps({"bench": "transfer", "loadavg_start": sys.argv[8].split(),
                  "loadavg_end": open("/proc/loadavg").read().split()[:3], **meta}))
EOF
