#!/usr/bin/python3
"""examples/python/fmnist_torch.py's training under torchrun with PyTorch DDP over gloo.

    python3 -m torch.distributed.run --standalone --nproc-per-node=4 --max-restarts=3 \
        --redirects 2 --tee 2 --log-dir DIR bench/rg_bench_fmnist_ddp.py --ckpt-dir CK

The comparator of bench/rg-bench-torch.sh. The same model, initialisation, data and loading
(imported from the example: Model, load_split, evaluate), the same optimizer (Adam, lr 1e-3,
cosine decay to 0 over the run unless --schedule constant) and the same global batch of 64
split over the ranks: torch's DistributedSampler (shuffled, seeded, not dropping the tail, as
the example's GlobalSampler) and a DataLoader of batch 64 / world size (the last step of an
epoch short, as in the example: 938 steps of 60,000 samples). Each rank takes the mean loss
of its share and DDP averages the gradients (the example sums its shares' losses divided by
the global count and sums the gradients: the same mean). Every --ckpt-every global steps
rank 0 torch.save()s the model, Adam's state, the epoch and the step to --ckpt-dir (written
to a temporary file and renamed, while the others wait in the next step's allreduce); on
start every rank loads the newest one and goes on with the next global step (torchrun
restarts every worker after one fails). --kill-at STEP makes rank --kill-rank SIGKILL itself
at that global step in the first attempt only (TORCHELASTIC_RESTART_COUNT 0).

Rank 0 prints what the example prints: "step=... samples_per_s=..." every --log-every steps,
"eval epoch=... test_accuracy=..." per epoch, and at the end "world=N samples_per_s=X" (the
samples this attempt trained over the time from the start of its training loop to the end,
the evaluations included, as the example counts it) and "test_accuracy=<fraction>".
"""
import argparse
import datetime
import glob
import math
import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "python"))
from fmnist_torch import Model, evaluate, load_split  # noqa: E402  (needs regroup importable)


def newest(ckpt_dir):
    """The newest complete checkpoint in ckpt_dir (step-N.pt) and its step, or (None, 0)."""
    best, best_step = None, 0
    for p in glob.glob(os.path.join(ckpt_dir, "step-*.pt")):
        m = re.fullmatch(r"step-(\d+)\.pt", os.path.basename(p))
        if m and int(m.group(1)) > best_step:
            best, best_step = p, int(m.group(1))
    return best, best_step


def save(ckpt_dir, model, opt, epoch, step):
    path = os.path.join(ckpt_dir, "step-%d.pt" % step)
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch,
                "step": step}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--ckpt-dir", default=os.environ.get("RG_BENCH_CKPT_DIR"))
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--step-log", default=None,
                    help="rank 0 appends \"STEP MS\" here for each step it completes (the "
                    "global step, the wall clock in ms), as ddp_trainer.py --step-log")
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300, help="the process group's, seconds")
    ap.add_argument("--backend", choices=["gloo", "regroup"], default="gloo",
                    help="torch.distributed's backend: regroup is regroup.distributed's, over "
                         "libregroup's UCX group, under the regroup launcher")
    a = ap.parse_args()
    if not a.ckpt_dir:
        ap.error("--ckpt-dir (or $RG_BENCH_CKPT_DIR) is required")
    torch.set_num_threads(1)   # one core per worker, as the example
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    if a.backend == "regroup":
        import regroup.distributed  # noqa: F401 (registers the backend)
    dist.init_process_group(a.backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch % world:
        raise SystemExit("global batch %d is not a multiple of the world size %d"
                         % (a.batch, world))
    os.makedirs(a.ckpt_dir, exist_ok=True)
    train_x, train_y = load_split(a.data, "train")
    test_x, test_y = load_split(a.data, "t10k")
    torch.manual_seed(a.seed)          # the same seed: every rank starts equal
    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    path, done = newest(a.ckpt_dir)
    epoch = 0
    if path is not None:
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        done, epoch = saved["step"], saved["epoch"]
    ddp = DDP(model)                   # broadcasts rank 0's parameters
    dataset = TensorDataset(train_x, train_y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=a.seed, drop_last=False)
    share = a.batch // world
    per_epoch = math.ceil(len(sampler) / share)
    total = a.epochs * per_epoch
    epoch = done // per_epoch
    if path is not None and rank == 0:
        print("resumed from checkpoint step %d (epoch %d) at world size %d, restart %d"
              % (done, epoch, world, restart), flush=True)
    step_log = open(a.step_log, "a", buffering=1) if a.step_log and rank == 0 else None
    t_start = time.monotonic()
    win_t, win_samples, samples_here = t_start, 0, 0
    win = torch.zeros(2)
    while epoch < a.epochs:
        sampler.set_epoch(epoch)
        ids = list(sampler)
        skip = done - epoch * per_epoch                  # steps of this epoch already done
        batches = [ids[i:i + share] for i in range(skip * share, len(ids), share)]
        loader = DataLoader(dataset, batch_sampler=batches)
        for x, y in loader:
            gstep = done
            if gstep == a.kill_at and rank == a.kill_rank and restart == 0:
                print("rank %d: killing myself at step %d (--kill-at)" % (rank, gstep),
                      file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if a.schedule == "cosine":
                opt.param_groups[0]["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * gstep / total))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x.float() / 255.0), y)
            loss.backward()            # DDP: the gradients' allreduce, averaged
            opt.step()
            done += 1
            if step_log:
                step_log.write("%d %d\n" % (done, time.time_ns() // 1000000))
            count = len(y) * world     # every rank's share is the same size
            win += torch.tensor([loss.item() * len(y), float(len(y))])
            win_samples += count
            samples_here += count
            if done % a.ckpt_every == 0 and done < total and rank == 0:
                save(a.ckpt_dir, model, opt, epoch, done)
            if done % a.log_every == 0:
                dist.all_reduce(win)
                now = time.monotonic()
                if rank == 0:
                    print("step=%d epoch=%d loss=%.4f samples_per_s=%.0f world=%d" % (
                        done, epoch, win[0] / win[1], win_samples / (now - win_t), world),
                        flush=True)
                win.zero_()
                win_samples = 0
                win_t = now
        if rank == 0:
            acc, tl = evaluate(model, test_x, test_y)
            print("eval epoch=%d test_loss=%.4f test_accuracy=%.4f" % (epoch, tl, acc),
                  flush=True)
        epoch += 1
    if rank == 0:
        acc, _ = evaluate(model, test_x, test_y)
        print("world=%d samples_per_s=%.0f" % (
            world, samples_here / (time.monotonic() - t_start)), flush=True)
        print("test_accuracy=%.4f" % acc, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
