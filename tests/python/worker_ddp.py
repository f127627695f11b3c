"""A TorchTrainer program for the tests: DDP on a synthetic data set, whose model also counts,
in a float64 parameter trained by SGD, how often each sample's gradient went into a step the
job kept: every count must end at exactly the number of epochs (each sample used once per
epoch, whatever failed). The training function has no recovery code.

    worker_ddp.py --storage DIR --name NAME [--workers N] [--epochs E] [--kill-at STEP
        --kill-rank R] [--raise-at STEP --raise-rank R] [--recovery in-place|restart]
        [--max-failures K] [--bad-config] [--on-cuda] [--end-with-change]
        [--wait-for-replacement] [--preempt-after-epoch E --log PATH]

The driver prints "result metrics=<json> checkpoint_step=<n> counts_ok=<bool>"; each worker
prints "worker pid=<pid> rank=<r>" when it starts and "worker done pid=<pid> rank=<r> world=<w>"
when its loop ends. --end-with-change: before the last epoch's report, the ranks report
(without a checkpoint) until a planned change (the replacement of a killed rank) waits for a
step boundary, so that the job's last checkpoint is reported once the job has moved on to a
newer round; the last report's step is printed as "last report at step <n>".
--wait-for-replacement: a group smaller than --workers at the last epoch's start reports
(without a checkpoint) until a replacement or a joining node waits to join, which it then does
at that epoch's first step: the test sees a join however long the newcomers take to start.
--preempt-after-epoch E: at epoch E's last step, rank 0 of the first workers sends SIGTERM
to its agent (a preemption notice) and waits until the job's output (--log) says it was
posted, so that every rank sees it at that step's boundary."""
import argparse
import gc
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from regroup import train
from regroup.train import _session
from regroup.train.torch import prepare_data_loader, prepare_model, prepare_optimizer

N, B, D, K = 512, 32, 8, 4


class Data(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(N, D, generator=g)
        w = torch.randn(D, K, generator=g)
        self.y = (self.x @ w).argmax(1)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, K)
        self.counts = torch.nn.Parameter(torch.zeros(N, dtype=torch.float64))

    def forward(self, x, ids):
        # The counts' part of the loss is zero in value; its gradient is -1/n per sample.
        c = self.counts[ids]
        return self.fc(x), (c - c.detach()).sum()


def kill_before(config, ctx, what):
    """--kill-before WHAT: rank --kill-rank of the job's first workers SIGKILLs itself
    before it calls WHAT, while the others are in its collectives. Not its replacement: that
    has the rank and round 0 too until it joins (in prepare_model or get_checkpoint), and
    killed itself in turn when it started before the others were in the next round."""
    if config["kill_before"] == what and ctx.get_world_rank() == config["kill_rank"] and \
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0 and \
            ctx.get_round() == 0 and not _session.get().ctx.joining:
        print("rank %d: killing myself before %s" % (ctx.get_world_rank(), what), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def train_func(config):
    ctx = train.get_context()
    # preloaded: forked from a fork server that loaded regroup (fit()'s regroup._preload)
    # and froze its objects out of the collector's reach
    print("worker pid=%d rank=%d preloaded=%s" % (
        os.getpid(), ctx.get_world_rank(),
        "regroup._preload" in sys.modules and gc.get_freeze_count() > 0), flush=True)
    torch.manual_seed(1)
    kill_before(config, ctx, "prepare_model")
    model = prepare_model(Net())
    opt = prepare_optimizer(torch.optim.SGD([
        {"params": [model.module.fc.weight, model.module.fc.bias], "lr": 0.1},
        {"params": [model.module.counts], "lr": float(B)}]))
    loader = prepare_data_loader(DataLoader(Data(), batch_size=B // config["workers"]),
                                 global_batch_size=B)
    start = 0
    if (config["end_with_change"] or config["change_after_last_report"]) and \
            not _session.get().joined:
        # A replacement: it joins (in get_checkpoint) only once the members are at their
        # last report, so that the change waits there whatever its start takes.
        wait_for_file(config["at_the_end"])
    kill_before(config, ctx, "get_checkpoint")
    ck = train.get_checkpoint()
    if ck:
        d = ck.to_dict()
        model.module.load_state_dict(d["model"])
        opt.load_state_dict(d["opt"])
        start = d["epoch"] + 1
        print("worker rank=%d resumed from epoch %d (path=%s)" % (
            ctx.get_world_rank(), d["epoch"], ck.path), flush=True)
    steps = 0
    for epoch in range(start, config["epochs"]):
        if config["wait_for_replacement"] and epoch == config["epochs"] - 1 and \
                ctx.get_world_size() < config["workers"]:
            wait_for_a_deferred_change(ctx)
        for i, (x, y, ids) in enumerate(loader):
            opt.zero_grad()
            logits, cnt = model(x, ids)
            # mean over this rank's batch, as DDP programs write it
            loss = F.cross_entropy(logits, y) - cnt / len(ids)
            loss.backward()
            if epoch == config["preempt_after_epoch"] and i == len(loader) - 1:
                preempt_now(config, ctx)
            if ctx.get_step() + 1 == config["preempt_at_step"]:
                preempt_now(config, ctx)
            opt.step()
            steps += 1
            first = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0 and \
                ctx.get_round() == 0
            if first and steps == config["kill_at"] and ctx.get_world_rank() == config["kill_rank"]:
                print("rank %d: killing myself at step %d" % (ctx.get_world_rank(), steps),
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if first and steps == config["stall_at"] and ctx.get_world_rank() == 1:
                stall(config["stall_s"])
            if first and steps == config["raise_at"] and \
                    ctx.get_world_rank() == config["raise_rank"]:
                raise ValueError("boom at step %d" % steps)
        if config["end_with_change"] and epoch == config["epochs"] - 1:
            if ctx.get_world_rank() == 0:
                with open(config["at_the_end"] + ".tmp", "w"):
                    pass
                os.rename(config["at_the_end"] + ".tmp", config["at_the_end"])
            wait_for_a_deferred_change(ctx)
            if ctx.get_world_rank() == 0:
                print("last report at step %d" % ctx.get_step(), flush=True)
        if epoch == 0:
            kill_before(config, ctx, "report")
        if epoch == config["epochs"] - 1:
            kill_before(config, ctx, "last-report")
        train.report({"epoch": epoch, "loss": float(loss), "world_size": ctx.get_world_size()},
                     checkpoint=train.Checkpoint.from_dict({
                         "model": model.module.state_dict(), "opt": opt.state_dict(),
                         "epoch": epoch}))
        if config["change_after_last_report"] and epoch == config["epochs"] - 1 and \
                ctx.get_world_rank() == 0:
            # The replacement joins now, while the last report's checkpoint is being
            # committed (the test slows the commit down): a change after the report
            print("last report at step %d" % ctx.get_step(), flush=True)
            with open(config["at_the_end"] + ".tmp", "w"):
                pass
            os.rename(config["at_the_end"] + ".tmp", config["at_the_end"])
    print("worker done pid=%d rank=%d world=%d step=%d" % (
        os.getpid(), ctx.get_world_rank(), ctx.get_world_size(), ctx.get_step()), flush=True)


def preempt_now(config, ctx):
    """Rank 0 of the first workers: SIGTERM to its agent, then until the job's log says the
    notice is posted (120 s at most)."""
    if ctx.get_world_rank() != 0 or ctx.get_round() != 0 or \
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != 0:
        return
    print("rank 0: preempting at step %d" % (_session.get().done + 1), flush=True)
    os.kill(os.getppid(), signal.SIGTERM)
    for _ in range(12000):
        with open(config["log"], errors="replace") as f:
            if "this node leaves the job" in f.read():
                return
        time.sleep(0.01)
    raise RuntimeError("no preemption notice in %s within 120 s" % config["log"])


def stall(seconds):
    """Stops this worker (SIGSTOP) for `seconds`: a child process continues it (SIGCONT)
    then. The stall is the fault; the child's wait is its length."""
    print("rank 1: stopping myself for %g s" % seconds, flush=True)
    child = os.fork()
    if child == 0:
        try:
            time.sleep(seconds)
            os.kill(os.getppid(), signal.SIGCONT)
        finally:
            os._exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)
    os.waitpid(child, 0)
    print("rank 1: continued", flush=True)


def wait_for_file(path):
    """Until path exists (120 s at most)."""
    for _ in range(12000):
        if os.path.exists(path):
            return
        time.sleep(0.01)
    raise RuntimeError("%s did not appear within 120 s" % path)


def wait_for_a_deferred_change(ctx):
    """Reports (user reports: a planned change seen there waits) until one waits; the same
    on every rank, since every rank sees a change at the same report. Bounded."""
    for _ in range(6000):
        if _session.get().deferred is not None:
            return
        train.report({"waiting": 1.0})
        time.sleep(0.01)
    raise RuntimeError("no planned change came within 6000 reports")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--storage", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--kill-before", choices=["", "prepare_model", "get_checkpoint", "report",
                                              "last-report"],
                    default="")
    ap.add_argument("--raise-at", type=int, default=-1)
    ap.add_argument("--raise-rank", type=int, default=1)
    ap.add_argument("--recovery", default="in-place")
    ap.add_argument("--max-failures", type=int, default=0)
    ap.add_argument("--bad-config", action="store_true")
    ap.add_argument("--end-with-change", action="store_true")
    ap.add_argument("--change-after-last-report", action="store_true")
    ap.add_argument("--wait-for-replacement", action="store_true")
    ap.add_argument("--preempt-after-epoch", type=int, default=-1)
    ap.add_argument("--log", default="")
    ap.add_argument("--preempt-at-step", type=int, default=-1,
                    help="rank 0 preempts its node at this step (as --preempt-after-epoch)")
    ap.add_argument("--stall-at", type=int, default=-1, help="rank 1 stops at this step")
    ap.add_argument("--stall-s", type=float, default=4.0)
    a = ap.parse_args()
    config = {"epochs": a.epochs, "kill_at": a.kill_at, "kill_rank": a.kill_rank,
              "kill_before": a.kill_before,
              "raise_at": a.raise_at, "raise_rank": a.raise_rank, "workers": a.workers,
              "end_with_change": a.end_with_change,
              "change_after_last_report": a.change_after_last_report,
              "at_the_end": os.path.join(os.path.abspath(a.storage), a.name + ".at-the-end"),
              "wait_for_replacement": a.wait_for_replacement,
              "preempt_after_epoch": a.preempt_after_epoch, "log": os.path.abspath(a.log),
              "stall_at": a.stall_at, "stall_s": a.stall_s,
              "preempt_at_step": a.preempt_at_step}
    if a.bad_config:
        config["lock"] = __import__("threading").Lock()
    trainer = train.TorchTrainer(
        train_func, train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=a.workers),
        run_config=train.RunConfig(name=a.name, storage_path=a.storage,
                                   failure_config=train.FailureConfig(
                                       max_failures=a.max_failures, recovery=a.recovery)))
    try:
        result = trainer.fit()
    except train.TrainingFailedError as e:
        print("failed rank=%s node=%s" % (e.rank, e.node))
        print("traceback_has_boom=%s" % ("ValueError: boom" in (e.traceback or "")))
        return 3
    counts = result.checkpoint.to_dict()["model"]["counts"]
    ok = bool((counts == a.epochs).all())
    print("result metrics=%s checkpoint_step=%d counts_ok=%s" % (
        json.dumps(result.metrics), result.checkpoint.step, ok))
    if not ok:
        bad = (counts != a.epochs).nonzero().view(-1)[:10].tolist()
        print("bad counts at %s: %s" % (bad, counts[bad].tolist()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
