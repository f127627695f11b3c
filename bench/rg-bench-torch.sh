#!/usr/bin/env bash
# The Python example under regroup against the same model under torchrun with PyTorch DDP:
# examples/python/fmnist_torch.py under `regroup --standalone` (restart mode, its sharded
# background checkpoints every 200 steps) and bench/rg_bench_fmnist_ddp.py (the same model,
# data, optimizer and global batch; DDP over gloo; rank 0 torch.save()s every 200 steps,
# every rank resumes from the newest) under PyTorch's torchrun
# (`python3 -m torch.distributed.run --standalone`), each with --max-restarts 3, each run
# both without a fault and with one worker kill (rank --kill-rank SIGKILLs itself at global
# step --kill-at in the first attempt; the launcher restarts every worker, which resume from
# the newest checkpoint). Every repetition runs the four jobs, the two sides interleaved
# (the order alternates each repetition). Each run is checked: exit 0, a test accuracy
# above --floor, and for a kill run the kill and the resume in its log (a fault-free run
# must not resume); a failed check fails the bench.
#
# Timed: the wall time of each launcher command (from its start to its exit: launcher,
# Python and torch start, data loading, training, evaluation); samples/s as rank 0 prints it
# at the end of a fault-free run (the epoch's samples over the time from the start of its
# training loop to its end, the per-epoch and final test evaluations included, the same
# count in both programs); the kill cost, per repetition and side, is the wall time with the
# kill less the wall time without. Prints one JSON line per metric: each side's median, the
# median of the per-repetition ratios regroup/torchrun with min and max. Holds
# /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-torch.sh [--build DIR] [-n RANKS] [--reps N] [--epochs E] [--kill-at S]
#                           [--kill-rank R] [--floor ACC] [--python PY] [--keep]
#                           [--regroup-conf KEY=VALUE,...]
# --regroup-conf: regroup's --rdzv-conf, by default hang_timeout=0: its hang detector off, as
# torchrun has none (with its default of 1 s, on the project's overloaded 2-core machine
# every worker was once seen 3 s without a heartbeat and killed as hung).
# --keep leaves the runs' logs in the /tmp/rg-bench-torch.* directory it names.
set -euo pipefail
if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
    RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
build="$src/build"
n=4
reps=3
epochs=1
kill_at=350
kill_rank=1
floor=0.80
python=/usr/bin/python3
keep=0
regroup_conf=hang_timeout=0
usage="usage: $0 [--build DIR] [-n RANKS] [--reps N] [--epochs E] [--kill-at S] \
[--kill-rank R] [--floor ACC] [--python PY] [--keep] [--regroup-conf CONF]"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --epochs) epochs=$2; shift 2 ;;
        --kill-at) kill_at=$2; shift 2 ;;
        --kill-rank) kill_rank=$2; shift 2 ;;
        --floor) floor=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --regroup-conf) regroup_conf=$2; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
[[ -x "$build/regroup" && -e "$build/libregroup.so" ]] || {
    echo "$build/regroup or $build/libregroup.so not built" >&2; exit 2; }
((reps >= 1 && n >= 2 && kill_rank < n)) || { echo "$usage" >&2; exit 2; }
out=$(mktemp -d /tmp/rg-bench-torch.XXXXXX)
if ((keep)); then echo "rg-bench-torch: logs in $out" >&2; else trap 'rm -rf "$out"' EXIT; fi
export UCX_NET_DEVICES=lo GLOO_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=1
export REGROUP_LIBRARY="$build/libregroup.so"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
common=(--epochs "$epochs" --ckpt-every 200 --log-every 100)

run() { # $1 = side (regroup|torchrun), $2 = kind (plain|kill), $3 = repetition
    local side=$1 kind=$2 r=$3 log="$out/$1.$2.$3.log" dir="$out/$1.$2.$3" args t0 t1 rc=0
    args=("${common[@]}")
    [[ $kind == kill ]] && args+=(--kill-at "$kill_at" --kill-rank "$kill_rank")
    mkdir -p "$dir"
    t0=$(date +%s.%N)
    if [[ $side == regroup ]]; then
        REGROUP_CKPT_DIR="$dir/ckpt" timeout 900 "$build/regroup" --standalone \
            --nproc-per-node="$n" --max-restarts=3 \
            ${regroup_conf:+--rdzv-conf="$regroup_conf"} \
            "$python" "$src/examples/python/fmnist_torch.py" "${args[@]}" >"$log" 2>&1 || rc=$?
    else
        # torch 1.13's torchrun takes its options with underscores only, and on Python 3.11
        # fails unless --redirects and --tee are 1 or 2.
        timeout 900 "$python" -m torch.distributed.run --standalone --nproc_per_node="$n" \
            --max_restarts=3 --redirects 2 --tee 2 --log_dir "$dir/logs" \
            "$here/rg_bench_fmnist_ddp.py" --ckpt-dir "$dir/ckpt" "${args[@]}" \
            >"$log" 2>&1 || rc=$?
    fi
    t1=$(date +%s.%N)
    if ((rc != 0)); then
        echo "$side $kind repetition $r: exit $rc" >&2; tail -20 "$log" >&2; exit 1
    fi
    # the full checks come at the end; these fail a broken run at once
    grep -q '^test_accuracy=' "$log" && { [[ $kind == plain ]] ||
        grep -q "rank $kill_rank: killing myself at step $kill_at " "$log"; } ||
        { echo "$side $kind repetition $r: no test accuracy or no kill" >&2; tail -20 "$log" >&2
          exit 1; }
    echo "$side $kind $r $t0 $t1" >>"$out/times"
    rm -rf "$dir/ckpt"
}
# Each side's two runs of a repetition back to back (the kill cost is their difference, and
# the machine's load drifts), the sides in alternating order: A plain, A kill, B kill,
# B plain; then B plain, B kill, A kill, A plain; ...
for ((r = 0; r < reps; r++)); do
    if ((r % 2 == 0)); then a=regroup b=torchrun; else a=torchrun b=regroup; fi
    run "$a" plain "$r"; run "$a" kill "$r"; run "$b" kill "$r"; run "$b" plain "$r"
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$src" diff --quiet HEAD 2>/dev/null || commit="$commit-dirty"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
"$python" - "$out" "$reps" "$n" "$epochs" "$kill_at" "$kill_rank" "$floor" "$commit" \
    "${build_type:-unknown}" "$load_start" "$load_end" "$regroup_conf" <<'PY'
import json, re, statistics, sys
(out, reps, n, epochs, kill_at, kill_rank, floor, commit, btype, load0, load1,
 rconf) = sys.argv[1:]
reps, n, epochs, kill_at, kill_rank, floor = (int(reps), int(n), int(epochs), int(kill_at),
                                              int(kill_rank), float(floor))
wall = {}
for line in open(out + "/times"):
    side, kind, r, t0, t1 = line.split()
    wall[side, kind, int(r)] = float(t1) - float(t0)
res = {}
for (side, kind, r) in wall:
    log = open("%s/%s.%s.%d.log" % (out, side, kind, r), errors="replace").read()
    def fail(why):
        sys.exit("rg-bench-torch: %s %s repetition %d: %s\n%s" % (side, kind, r, why,
                                                                  log[-2000:]))
    acc = re.findall(r"^test_accuracy=([0-9.]+)$", log, re.M)
    if len(acc) != 1:
        fail("%d test_accuracy lines, not 1" % len(acc))
    if float(acc[0]) <= floor:
        fail("test accuracy %s, not above %.2f" % (acc[0], floor))
    sps = re.findall(r"^world=%d samples_per_s=([0-9.]+)$" % n, log, re.M)
    if len(sps) != 1:
        fail("no final 'world=%d samples_per_s=' line" % n)
    resumed = re.findall(r"resumed from checkpoint step (\d+) \(epoch \d+\) at world size %d,"
                         r" restart (\d+)" % n, log)
    killed = "rank %d: killing myself at step %d (--kill-at)" % (kill_rank, kill_at) in log
    if kind == "plain" and (resumed or killed):
        fail("a fault-free run that was killed or resumed")
    if kind == "kill":
        if not killed:
            fail("no kill in the log")
        # every restart resumes from a checkpoint taken before the kill
        if len(resumed) != 1 or resumed[0][1] != "1" or not 0 < int(resumed[0][0]) <= kill_at:
            fail("not one resume from a checkpoint before step %d in restart 1: %s"
                 % (kill_at, resumed))
    res[side, kind, r] = {"acc": float(acc[0]), "sps": float(sps[0]),
                          "resumed": int(resumed[0][0]) if resumed else None}
for side in ("regroup", "torchrun"):
    for kind in ("plain", "kill"):
        for r in range(reps):
            if (side, kind, r) not in res:
                sys.exit("rg-bench-torch: %s %s repetition %d did not run" % (side, kind, r))
meta = {"bench": "torch-compare", "regroup_conf": rconf, "ranks": n, "epochs": epochs,
        "kill_at": kill_at,
        "kill_rank": kill_rank, "reps": reps, "failed": 0, "commit": commit, "build": btype,
        "load_start": load0, "load_end": load1}
def series(side, metric):
    if metric == "samples_per_s":
        return [res[side, "plain", r]["sps"] for r in range(reps)]
    if metric == "wall_s":
        return [wall[side, "plain", r] for r in range(reps)]
    if metric == "wall_kill_s":
        return [wall[side, "kill", r] for r in range(reps)]
    if metric == "kill_cost_s":
        return [wall[side, "kill", r] - wall[side, "plain", r] for r in range(reps)]
    raise KeyError(metric)
for metric in ("samples_per_s", "wall_s", "wall_kill_s", "kill_cost_s"):
    rg, tr = series("regroup", metric), series("torchrun", metric)
    # a ratio only of two positive figures (a kill cost under the noise of a loaded machine
    # can come out negative)
    ratios = [a / b for a, b in zip(rg, tr) if a > 0 and b > 0]
    line = dict(meta, metric=metric,
                regroup_median=round(statistics.median(rg), 3),
                torchrun_median=round(statistics.median(tr), 3),
                regroup=[round(x, 3) for x in rg], torchrun=[round(x, 3) for x in tr],
                ratio_pairs=len(ratios),
                ratio_median=round(statistics.median(ratios), 3) if ratios else None,
                ratio_min=round(min(ratios), 3) if ratios else None,
                ratio_max=round(max(ratios), 3) if ratios else None)
    print(json.dumps(line))
acc = {s: {k: [res[s, k, r]["acc"] for r in range(reps)] for k in ("plain", "kill")}
       for s in ("regroup", "torchrun")}
resumed = {s: [res[s, "kill", r]["resumed"] for r in range(reps)] for s in ("regroup", "torchrun")}
print(json.dumps(dict(meta, metric="checks", floor=floor, test_accuracy=acc,
                      resumed_from_step=resumed)))
PY
