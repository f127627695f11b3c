"""Fashion-MNIST in PyTorch on regroup: the main job's model from Python.

    regroup --standalone --nproc-per-node=4 /usr/bin/python3 examples/python/fmnist_torch.py

A 784-256-10 MLP (ReLU), Adam (lr 1e-3, decayed to 0 on a cosine as in rg-fmnist; --schedule
constant keeps it), a global batch of 64 split across the ranks by
regroup's GlobalSampler (plugged into a torch DataLoader). Each rank computes the gradient of
its share, its loss summed over the share and divided by the global batch, so that regroup's
allreduce (a sum over the ranks, of one flat buffer holding every parameter's gradient) gives
every rank the same gradient and the same Adam update at any world size. Every --ckpt-every
steps the parameters, Adam's moments and step count and the sampler's position are
checkpointed in the background, sharded across the ranks; after a restart (a worker killed,
the launcher restarting the workers) or a resize the job resumes from the last committed
checkpoint and continues with the next global step, each sample used once per epoch.

Rank 0 prints "step=... epoch=... loss=... samples_per_s=..." every --log-every steps, an
"eval epoch=... test_accuracy=..." line per epoch and at the end "test_accuracy=<fraction>".
--kill-at STEP makes rank --kill-rank (default 1) SIGKILL itself at that global step in the
job's first attempt (restart count 0), to show the job restarting and resuming.
"""
import argparse
import gzip
import math
import os
import signal
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import regroup


def read_idx(path):
    """An IDX file (gzip'd or not) as a NumPy array of unsigned bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic >> 8 != 0x08:
        raise ValueError("%s: not an IDX file of unsigned bytes (magic 0x%08x)" % (path, magic))
    ndim = magic & 0xff
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError("%s: %d bytes of data for dimensions %s" % (path, body.size, dims))
    return body.reshape(dims)


def load_split(data_dir, split):
    def path(kind):
        base = os.path.join(data_dir, "%s-%s-idx%d-ubyte" % (split, kind,
                                                            3 if kind == "images" else 1))
        return base + ".gz" if os.path.exists(base + ".gz") else base
    images = read_idx(path("images"))
    labels = read_idx(path("labels"))
    return (torch.from_numpy(images.reshape(len(images), -1).copy()),
            torch.from_numpy(labels.astype(np.int64)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, 256)
        self.fc2 = torch.nn.Linear(256, 10)
        for fc in (self.fc1, self.fc2):   # He initialisation, zero biases (as rg-fmnist)
            torch.nn.init.normal_(fc.weight, 0.0, math.sqrt(2.0 / fc.in_features))
            torch.nn.init.zeros_(fc.bias)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def flatten(model):
    """Moves every parameter and its gradient into two flat buffers (the parameters become
    views of them): one allreduce per step, one tensor per checkpoint."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    flat = torch.zeros(n)
    grad = torch.zeros(n)
    off = 0
    for p in params:
        k = p.numel()
        flat[off:off + k].copy_(p.data.view(-1))
        p.data = flat[off:off + k].view_as(p)
        p.grad = grad[off:off + k].view_as(p)
        off += k
    return flat, grad, params


def adam_state(opt, params, n):
    """Adam's moments as two flat tensors and its step count."""
    m = torch.zeros(n)
    v = torch.zeros(n)
    steps = 0
    off = 0
    for p in params:
        k = p.numel()
        st = opt.state.get(p)
        if st:
            m[off:off + k].copy_(st["exp_avg"].view(-1))
            v[off:off + k].copy_(st["exp_avg_sq"].view(-1))
            steps = int(st["step"])
        off += k
    return m, v, steps


def set_adam_state(opt, params, m, v, steps):
    off = 0
    for p in params:
        k = p.numel()
        if steps > 0:
            opt.state[p] = {"step": torch.tensor(float(steps)),
                            "exp_avg": m[off:off + k].view_as(p).clone(),
                            "exp_avg_sq": v[off:off + k].view_as(p).clone()}
        off += k


def evaluate(model, images, labels):
    with torch.no_grad():
        logits = model(images.float() / 255.0)
        loss = torch.nn.functional.cross_entropy(logits, labels).item()
        acc = (logits.argmax(1) == labels).float().mean().item()
    return acc, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--schedule", choices=["cosine", "constant"], default="cosine",
                    help="the learning rate from --lr down to 0 over the run (as rg-fmnist)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)   # one core per worker; the launcher runs one per core

    with regroup.init() as ctx:
        rank, world = ctx.rank, ctx.world_size
        train_x, train_y = load_split(a.data, "train")
        test_x, test_y = load_split(a.data, "t10k")
        torch.manual_seed(a.seed)          # the same seed: every rank starts equal
        model = Model()
        flat, grad, params = flatten(model)
        n = flat.numel()
        opt = torch.optim.Adam(params, lr=a.lr)
        sampler = regroup.GlobalSampler(len(train_x), a.batch, seed=a.seed, rank=rank,
                                        world_size=world)
        step = ctx.latest_checkpoint()
        if step is not None:
            m = torch.zeros(n)
            v = torch.zeros(n)
            adam_steps = np.zeros(1, np.int64)
            sampler.cursor = ctx.restore(step, {"params": flat, "adam_m": m, "adam_v": v,
                                                "adam_steps": adam_steps})
            set_adam_state(opt, params, m, v, int(adam_steps[0]))
            if rank == 0:
                print("resumed from checkpoint step %d (epoch %d) at world size %d, restart %d"
                      % (ctx.restored_step, sampler.epoch, world, ctx.restart_count),
                      flush=True)
        loader = DataLoader(TensorDataset(train_x, train_y), batch_sampler=sampler)
        per_epoch = sampler.steps_per_epoch
        total = a.epochs * per_epoch
        win = np.zeros(2)            # loss sum, samples: this rank's, summed at log time
        win_t = time.monotonic()
        win_samples = 0
        t_start = time.monotonic()
        samples_here = 0
        while sampler.epoch < a.epochs:
            epoch = sampler.epoch
            first = epoch * per_epoch + sampler.step       # the global step of the next batch
            for i, (x, y) in enumerate(loader):
                gstep = first + i
                if gstep == a.kill_at and rank == a.kill_rank and ctx.restart_count == 0:
                    print("rank %d: killing myself at step %d (--kill-at)" % (rank, gstep),
                          file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                count = sampler.global_count
                if a.schedule == "cosine":
                    opt.param_groups[0]["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * gstep / total))
                grad.zero_()
                loss = torch.nn.functional.cross_entropy(model(x.float() / 255.0), y,
                                                         reduction="sum")
                (loss / count).backward()
                if params[0].grad.data_ptr() != grad.data_ptr():
                    raise RuntimeError("autograd replaced the flat gradient buffer")
                ctx.allreduce(grad)          # the sum of the ranks' shares: the batch's mean
                opt.step()
                win += (loss.item(), len(y))
                win_samples += count
                samples_here += count
                done = gstep + 1
                state = None
                if done % a.ckpt_every == 0 and done < total:
                    m, v, adam_steps = adam_state(opt, params, n)
                    state = {"params": flat, "adam_m": m, "adam_v": v,
                             "adam_steps": np.array([adam_steps], np.int64)}
                ctx.report(done, metrics={"loss": win[0] / max(win[1], 1)}, state=state,
                           cursor=sampler)
                if done % a.log_every == 0:
                    ctx.allreduce(win)
                    now = time.monotonic()
                    if rank == 0:
                        print("step=%d epoch=%d loss=%.4f samples_per_s=%.0f world=%d" % (
                            done, epoch, win[0] / win[1], win_samples / (now - win_t), world),
                            flush=True)
                    win[:] = 0
                    win_samples = 0
                    win_t = now
            if rank == 0:
                acc, tl = evaluate(model, test_x, test_y)
                print("eval epoch=%d test_loss=%.4f test_accuracy=%.4f" % (epoch, tl, acc),
                      flush=True)
        if rank == 0:
            acc, _ = evaluate(model, test_x, test_y)
            print("world=%d samples_per_s=%.0f" % (
                world, samples_here / (time.monotonic() - t_start)), flush=True)
            print("test_accuracy=%.4f" % acc, flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except regroup.PeerError as e:
        # A peer died: this attempt is over; the launcher restarts the workers and they resume
        # from the last checkpoint.
        print("rg-fmnist-torch: %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)
