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
"eval epoch=... test_accuracy=..." line per epoch and at the end "params_sha256=<hex>" (the
final parameters' bytes) and "test_accuracy=<fraction>".
--kill-at STEP makes rank --kill-rank (default 1) SIGKILL itself at that global step in the
job's first attempt (restart count 0, round 0), to show the job restarting and resuming.

Under `regroup --recovery=in-place` the workers keep their state in memory through a failure
instead: the parameters, Adam's moments and step counts live in flat buffers (the optimizer
works on views of them), the same on every rank; when a collective raises regroup.PeerError
(a peer died) or report raises regroup.MembershipChanged (a replacement is ready), every rank
calls ctx.regroup with them and the cursor after its last completed step, and goes on from
the step the members agreed on at the new rank and world size (rank 0 prints "regrouped:
..."). A replacement worker (ctx.joining) receives them from a survivor instead of reading a
checkpoint.
"""
import argparse
import gzip
import hashlib
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
        return parse_idx(f.read(), path)


def idx_header(data, path):
    """The dimensions of an IDX file of unsigned bytes and its header's length, from its
    first bytes."""
    magic = int.from_bytes(data[0:4], "big") if len(data) >= 4 else 0
    if magic >> 8 != 0x08:
        raise ValueError("%s: not an IDX file of unsigned bytes (magic 0x%08x)" % (path, magic))
    ndim = magic & 0xff
    if len(data) < 4 + 4 * ndim:
        raise ValueError("%s: a header cut short" % path)
    return [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)], 4 + 4 * ndim


def shaped(body, dims, path):
    if body.size != int(np.prod(dims)):
        raise ValueError("%s: %d bytes of data for dimensions %s" % (path, body.size, dims))
    return body.reshape(dims)


def parse_idx(data, path):
    """An IDX file's bytes (read from path) as a NumPy array of unsigned bytes."""
    dims, off = idx_header(data, path)
    return shaped(np.frombuffer(data, dtype=np.uint8, offset=off), dims, path)


def mapped_idx(path):
    """An uncompressed IDX file mapped copy-on-write: its pages come from the page cache as
    they are used (shared by the workers of a node); none is read or copied at the start."""
    with open(path, "rb") as f:
        dims, off = idx_header(f.read(4 + 4 * 255), path)
    return shaped(np.memmap(path, dtype=np.uint8, mode="c", offset=off), dims, path)


def cached_idx(path, cache_dir):
    """The IDX file at path, decompressed once into cache_dir (as rg-fmnist's --data-cache):
    the first process writes the copy under a name of its own and renames it into place, the
    others (a replacement, a restarted worker) map it (mapped_idx): no gunzip, no read."""
    if not cache_dir or not path.endswith(".gz"):
        return read_idx(path)
    copy = os.path.join(cache_dir, os.path.basename(path)[:-3])
    if os.path.exists(copy):
        return mapped_idx(copy)
    with gzip.open(path, "rb") as f:
        data = f.read()
    arr = parse_idx(data, path)   # checked before it is kept
    os.makedirs(cache_dir, exist_ok=True)
    tmp = "%s.%d.tmp" % (copy, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, copy)
    return arr


def load_split(data_dir, split, cache_dir=None):
    def path(kind):
        base = os.path.join(data_dir, "%s-%s-idx%d-ubyte" % (split, kind,
                                                            3 if kind == "images" else 1))
        return base + ".gz" if os.path.exists(base + ".gz") else base
    images = cached_idx(path("images"), cache_dir)
    labels = cached_idx(path("labels"), cache_dir)
    x = images.reshape(len(images), -1)
    if not x.flags.writeable:   # (bytes read whole: torch takes no read-only array)
        x = x.copy()
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


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


def flat_adam(opt, params, n):
    """Adam's state in flat buffers: its moments (n each) and one step count per parameter,
    the optimizer's state being views of them, as Adam's first step would make it (zeros,
    step 0). Adam updates them in place: they are the state to checkpoint and to regroup."""
    m = torch.zeros(n)
    v = torch.zeros(n)
    steps = torch.zeros(len(params))
    off = 0
    for i, p in enumerate(params):
        k = p.numel()
        opt.state[p] = {"step": steps[i], "exp_avg": m[off:off + k].view_as(p),
                        "exp_avg_sq": v[off:off + k].view_as(p)}
        off += k
    return m, v, steps


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
    ap.add_argument("--train-samples", type=int, default=0,
                    help="train on the first N samples (0: all 60000)")
    ap.add_argument("--ckpt-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    a = ap.parse_args()
    if a.train_samples < 0:
        ap.error("--train-samples must be >= 0")
    torch.set_num_threads(1)   # one core per worker; the launcher runs one per core

    with regroup.init(in_place=True) as ctx:
        train_x, train_y = load_split(a.data, "train")
        if a.train_samples:
            train_x, train_y = train_x[:a.train_samples], train_y[:a.train_samples]
        test_x, test_y = load_split(a.data, "t10k")
        torch.manual_seed(a.seed)          # the same seed: every rank starts equal
        model = Model()
        flat, grad, params = flatten(model)
        n = flat.numel()
        opt = torch.optim.Adam(params, lr=a.lr)
        m, v, adam_steps = flat_adam(opt, params, n)
        replicated = [flat, m, v, adam_steps]    # what a regroup carries
        sampler = regroup.GlobalSampler(len(train_x), a.batch, seed=a.seed,
                                        rank=max(ctx.rank, 0), world_size=max(ctx.world_size, 1))
        step = None if ctx.joining else ctx.latest_checkpoint()
        if step is not None:
            saved_steps = np.zeros(1, np.int64)
            sampler.cursor = ctx.restore(step, {"params": flat, "adam_m": m, "adam_v": v,
                                                "adam_steps": saved_steps})
            adam_steps.fill_(float(saved_steps[0]))
            if ctx.rank == 0:
                print("resumed from checkpoint step %d (epoch %d) at world size %d, restart %d"
                      % (ctx.restored_step, sampler.epoch, ctx.world_size, ctx.restart_count),
                      flush=True)
        replacement = ctx.joining
        why = "a replacement joined" if ctx.joining else None
        done = 0 if step is None else ctx.restored_step   # the steps the state holds
        cur = sampler.cursor                               # the data position after them
        loader = DataLoader(TensorDataset(train_x, train_y), batch_sampler=sampler)
        per_epoch = sampler.steps_per_epoch
        total = a.epochs * per_epoch
        win = np.zeros(2)            # loss sum, samples: this rank's, summed at log time
        win_t = time.monotonic()
        win_samples = 0
        t_start = time.monotonic()
        samples_here = 0
        while True:
            if why is not None:
                r = ctx.regroup(done, replicated, cur)
                sampler.reshard(r.rank, r.world_size, r.cursor)
                done, cur = r.step, r.cursor
                if r.rank == 0:
                    print("regrouped: %s; round %d world %d from step %d, state from rank %d"
                          % (why, r.round, r.world_size, r.step, r.source), flush=True)
                why = None
                win[:] = 0
                win_samples = 0
            if sampler.epoch >= a.epochs:
                break
            rank, world = ctx.rank, ctx.world_size
            epoch = sampler.epoch
            first = epoch * per_epoch + sampler.step       # the global step of the next batch
            try:
                for i, (x, y) in enumerate(loader):
                    gstep = first + i
                    done = train_step(a, ctx, model, opt, grad, params, sampler, win, gstep,
                                      total, replacement, x, y)
                    cur = sampler.cursor
                    state = None
                    if done % a.ckpt_every == 0 and done < total:
                        state = {"params": flat, "adam_m": m, "adam_v": v,
                                 "adam_steps": np.array([int(adam_steps[0])], np.int64)}
                    ctx.report(done, metrics={"loss": win[0] / max(win[1], 1)}, state=state,
                               cursor=cur)
                    win_samples += sampler.global_count
                    samples_here += sampler.global_count
                    if done % a.log_every == 0:
                        ctx.allreduce(win)
                        now = time.monotonic()
                        if rank == 0:
                            print("step=%d epoch=%d loss=%.4f samples_per_s=%.0f world=%d" % (
                                done, epoch, win[0] / win[1], win_samples / (now - win_t),
                                world), flush=True)
                        win[:] = 0
                        win_samples = 0
                        win_t = now
            except regroup.Error as e:
                if not regroup_on(ctx, e):
                    raise
                why = "the membership changes" if isinstance(e, regroup.MembershipChanged) \
                    else "a peer failed"
                continue
            if rank == 0:
                acc, tl = evaluate(model, test_x, test_y)
                print("eval epoch=%d test_loss=%.4f test_accuracy=%.4f" % (epoch, tl, acc),
                      flush=True)
        if ctx.rank == 0:
            acc, _ = evaluate(model, test_x, test_y)
            print("world=%d samples_per_s=%.0f" % (
                ctx.world_size, samples_here / (time.monotonic() - t_start)), flush=True)
            print("params_sha256=%s" % hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
                  flush=True)
            print("test_accuracy=%.4f" % acc, flush=True)
    return 0


def regroup_on(ctx, e):
    """Whether a failed call is one to regroup on (in place only), as the C examples."""
    return ctx.in_place and (isinstance(e, (regroup.PeerError, regroup.MembershipChanged))
                             or e.status == "ETIMEDOUT")


def train_step(a, ctx, model, opt, grad, params, sampler, win, gstep, total, replacement, x, y):
    """Global step gstep on this rank's share (x, y): the gradient, its allreduce (which may
    raise) and Adam's update. Returns the steps the state then holds."""
    rank = ctx.rank
    if gstep == a.kill_at and rank == a.kill_rank and ctx.restart_count == 0 and \
            ctx.round == 0 and not replacement:
        print("rank %d: killing myself at step %d (--kill-at)" % (rank, gstep),
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    count = sampler.global_count
    if a.schedule == "cosine":
        opt.param_groups[0]["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * gstep / total))
    grad.zero_()
    loss = torch.nn.functional.cross_entropy(model(x.float() / 255.0), y, reduction="sum")
    (loss / count).backward()
    if params[0].grad.data_ptr() != grad.data_ptr():
        raise RuntimeError("autograd replaced the flat gradient buffer")
    ctx.allreduce(grad)          # the sum of the ranks' shares: the batch's mean
    opt.step()
    win += (loss.item(), len(y))
    return gstep + 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except regroup.PeerError as e:
        # A peer died: this attempt is over; the launcher restarts the workers and they resume
        # from the last checkpoint.
        print("rg-fmnist-torch: %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)
