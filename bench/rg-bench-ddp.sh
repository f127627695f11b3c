#!/usr/bin/env bash
# PyTorch DDP on regroup against DDP on gloo under torchrun, the same Fashion-MNIST model,
# data, optimizer (Adam, lr 1e-3) and global batch of 64, one epoch, three sides:
#   gloo     torchrun --standalone + bench/rg_bench_fmnist_ddp.py --backend gloo (restart
#            recovery from rank 0's torch.save every 200 steps)
#   regroup  regroup --standalone --preload=torch,numpy + the same script with --backend
#            regroup: plain DDP over torch.distributed's regroup backend (libregroup's UCX
#            group), its step time, and restart recovery as gloo's (the same torch.save
#            checkpoints), its workers forked from an interpreter that imported torch
#   trainer  examples/python/ddp_trainer.py: TorchTrainer, prepare_model/optimizer/loader,
#            recovery in place (its fit() starts regroup --standalone itself)
# Each side runs each repetition without a fault and with a worker SIGKILLed at step
# --kill-at (rank --kill-rank, first attempt). The sides' runs are
# interleaved, their order alternating each repetition. Each run is checked: exit 0, a test
# accuracy above --floor, the kill in the log of a kill run (and, for the trainer, the
# regroup at that step at world n-1), none in a fault-free run.
# Timed: samples/s as each program's rank 0 prints it (the samples trained over the training
# loop's time, evaluations included), the wall time of each command, the kill cost (the wall
# time with the kill less the one without, per repetition). Prints one JSON line per metric:
# each side's median and values, the per-repetition ratios to gloo (median, min, max).
# Holds /tmp/regroup-bench.lock so that no two benchmarks run at once.
#
#   bench/rg-bench-ddp.sh [--build DIR] [-n RANKS] [--reps N] [--kill-at S] [--kill-rank R]
#                         [--floor ACC] [--python PY] [--keep]
set -euo pipefail
if [[ -z "${RG_BENCH_LOCKED:-}" ]]; then
    RG_BENCH_LOCKED=1 exec flock /tmp/regroup-bench.lock "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
build="$src/build"
n=4
reps=3
kill_at=350
kill_rank=1
floor=0.80
python=/usr/bin/python3
keep=0
usage="usage: $0 [--build DIR] [-n RANKS] [--reps N] [--kill-at S] [--kill-rank R] \
[--floor ACC] [--python PY] [--keep]"
while (($#)); do
    case "$1" in
        --build) build=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --kill-at) kill_at=$2; shift 2 ;;
        --kill-rank) kill_rank=$2; shift 2 ;;
        --floor) floor=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
[[ -x "$build/regroup" && -e "$build/libregroup.so" && -e "$build/_regroup_c10d.so" ]] || {
    echo "$build: regroup, libregroup.so or _regroup_c10d.so not built" >&2; exit 2; }
((reps >= 1 && n >= 2 && kill_rank < n && 64 % n == 0)) || { echo "$usage" >&2; exit 2; }
out=$(mktemp -d /tmp/rg-bench-ddp.XXXXXX)
if ((keep)); then echo "rg-bench-ddp: logs in $out" >&2; else trap 'rm -rf "$out"' EXIT; fi
export UCX_NET_DEVICES=lo GLOO_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=1
export REGROUP_LIBRARY="$build/libregroup.so" REGROUP_LAUNCHER="$build/regroup"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
ddp=(--epochs 1 --ckpt-every 200 --log-every 100 --schedule constant)

run() { # $1 = side (gloo|regroup|trainer), $2 = kind (plain|kill), $3 = repetition
    local side=$1 kind=$2 r=$3 log="$out/$1.$2.$3.log" dir="$out/$1.$2.$3" t0 t1 rc=0
    local kill=()
    [[ $kind == kill ]] && kill=(--kill-at "$kill_at" --kill-rank "$kill_rank")
    mkdir -p "$dir"
    t0=$(date +%s.%N)
    case $side in
    gloo)
        # torch 1.13's torchrun takes underscored options, and on Python 3.11 fails unless
        # --redirects and --tee are 1 or 2.
        timeout 900 "$python" -m torch.distributed.run --standalone --nproc_per_node="$n" \
            --max_restarts=3 --redirects 2 --tee 2 --log_dir "$dir/logs" \
            "$here/rg_bench_fmnist_ddp.py" --backend gloo --ckpt-dir "$dir/ckpt" \
            "${ddp[@]}" "${kill[@]}" >"$log" 2>&1 || rc=$? ;;
    regroup)
        timeout 900 "$build/regroup" --standalone --nproc-per-node="$n" --max-restarts=3 \
            --rdzv-conf=hang_timeout=0 --preload=torch,numpy "$python" "$here/rg_bench_fmnist_ddp.py" \
            --backend regroup --ckpt-dir "$dir/ckpt" "${ddp[@]}" "${kill[@]}" \
            >"$log" 2>&1 || rc=$? ;;
    trainer)
        timeout 900 "$python" "$src/examples/python/ddp_trainer.py" --workers "$n" \
            --epochs 1 --storage "$dir" --name run --max-failures 3 "${kill[@]}" \
            >"$log" 2>&1 || rc=$? ;;
    esac
    t1=$(date +%s.%N)
    if ((rc != 0)); then
        echo "$side $kind repetition $r: exit $rc" >&2; tail -20 "$log" >&2; exit 1
    fi
    echo "$side $kind $r $t0 $t1" >>"$out/times"
    rm -rf "$dir/ckpt" "$dir/run/checkpoints"
}
for ((r = 0; r < reps; r++)); do
    if ((r % 2 == 0)); then
        run gloo plain "$r"; run gloo kill "$r"; run regroup plain "$r"; run regroup kill "$r"
        run trainer kill "$r"; run trainer plain "$r"
    else
        run trainer plain "$r"; run trainer kill "$r"; run regroup kill "$r"
        run regroup plain "$r"; run gloo kill "$r"; run gloo plain "$r"
    fi
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$src" diff --quiet HEAD 2>/dev/null || commit="$commit-dirty"
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
"$python" - "$out" "$reps" "$n" "$kill_at" "$kill_rank" "$floor" "$commit" \
    "${build_type:-unknown}" "$load_start" "$load_end" <<'PY'
import json, re, statistics, sys
out, reps, n, kill_at, kill_rank, floor, commit, btype, load0, load1 = sys.argv[1:]
reps, n, kill_at, kill_rank, floor = int(reps), int(n), int(kill_at), int(kill_rank), float(floor)
wall, res = {}, {}
for line in open(out + "/times"):
    side, kind, r, t0, t1 = line.split()
    wall[side, kind, int(r)] = float(t1) - float(t0)
for (side, kind, r) in wall:
    log = open("%s/%s.%s.%d.log" % (out, side, kind, r), errors="replace").read()
    def fail(why):
        sys.exit("rg-bench-ddp: %s %s repetition %d: %s\n%s" % (side, kind, r, why, log[-2000:]))
    acc = re.findall(r"^test_accuracy=([0-9.]+)$", log, re.M)
    if len(acc) != 1 or float(acc[0]) <= floor:
        fail("test accuracy %s, not one above %.2f" % (acc, floor))
    sps = re.findall(r"^(?:world=%d )?samples_per_s=([0-9.]+)$" % n, log, re.M)
    if len(sps) != 1:
        fail("no final samples_per_s line")
    killed = "rank %d: killing myself at step %d" % (kill_rank, kill_at) in log
    if (kind == "kill") != killed:
        fail("kill expected" if kind == "kill" else "a fault-free run with a kill")
    if side == "trainer":
        regrouped = "regrouped at step %d: world size %d" % (kill_at, n - 1) in log
        if (kind == "kill") != regrouped:
            fail("a kill run regroups in place at the kill's step; a fault-free one never")
    # the survivors' regroup after the kill, as rank 0 times it (from the failed collective
    # to the new group holding the state)
    pause = re.findall(r"regrouped at step %d: world size %d, round \d+ \(PeerError\) in "
                       r"([0-9.]+) s" % (kill_at, n - 1), log)
    res[side, kind, r] = {"acc": float(acc[0]), "sps": float(sps[0]),
                          "pause": float(pause[0]) if pause else None}
meta = {"bench": "ddp", "ranks": n, "kill_at": kill_at, "kill_rank": kill_rank, "reps": reps,
        "commit": commit, "build": btype, "load_start": load0, "load_end": load1}
def series(side, metric):
    if metric == "samples_per_s":
        return [res[side, "plain", r]["sps"] for r in range(reps)]
    if metric == "wall_s":
        return [wall[side, "plain", r] for r in range(reps)]
    return [wall[side, "kill", r] - wall[side, "plain", r] for r in range(reps)]
for metric, sides in (("samples_per_s", ("gloo", "regroup", "trainer")),
                      ("wall_s", ("gloo", "regroup", "trainer")),
                      ("kill_cost_s", ("gloo", "regroup", "trainer"))):
    line = dict(meta, metric=metric)
    ref = series("gloo", metric)
    for side in sides:
        s = series(side, metric)
        line[side] = [round(x, 3) for x in s]
        line[side + "_median"] = round(statistics.median(s), 3)
        if side != "gloo":
            ratios = [a / b for a, b in zip(s, ref) if a > 0 and b > 0]
            line[side + "_over_gloo"] = ({"median": round(statistics.median(ratios), 3),
                                          "min": round(min(ratios), 3),
                                          "max": round(max(ratios), 3), "pairs": len(ratios)}
                                         if ratios else None)
    print(json.dumps(line))
pauses = [res["trainer", "kill", r]["pause"] for r in range(reps)]
if None not in pauses:
    print(json.dumps(dict(meta, metric="trainer_regroup_pause_s", trainer=pauses,
                          trainer_median=round(statistics.median(pauses), 3))))
print(json.dumps(dict(meta, metric="checks", floor=floor, test_accuracy={
    "%s.%s" % (s, k): [res[s, k, r]["acc"] for r in range(reps)]
    for (s, k) in sorted({(s, k) for (s, k, _) in res})})))
PY
