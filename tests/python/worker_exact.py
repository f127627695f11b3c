"""Run by test_jobs.py under `regroup`: the sampler's exactly-once property through real
checkpoints, restarts and world-size changes.

Each step, every rank counts the samples of its share in a local vector; an allreduce sums
them into `seen` (epochs x samples, the same on every rank), which is checkpointed every 5
steps with the sampler's cursor and restored on resume. A resumed run that repeated or
skipped a step would leave a count other than 1. Rank 0 prints "exact=1" at the end of the
last epoch, or "stopped at step S" when --stop-at ends it earlier (after that step's
checkpoint). --kill-at STEP: rank 1 SIGKILLs itself there in the job's first attempt. On a
preemption notice (SIGTERM to the launcher) every rank takes the last checkpoint of the step
it reached (ctx.leave) and exits 0; rank 0 prints "left at step S: checkpoint committed".

  worker_exact.py [--stop-at S] [--kill-at S] [--epochs E]
"""
import argparse
import os
import signal
import sys

import numpy as np

import regroup

from exact_counts import count_step, report_exact

SAMPLES, BATCH, SEED, EVERY = 200, 8, 11, 5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stop-at", type=int, default=-1)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    try:
        with regroup.init() as ctx:
            return run(ctx, a)
    except regroup.PeerError as e:
        print("rank lost a peer: %s" % e, file=sys.stderr, flush=True)
        return 1


def run(ctx, a):
    EPOCHS = a.epochs
    sampler = regroup.GlobalSampler(SAMPLES, BATCH, SEED)
    seen = np.zeros((EPOCHS, SAMPLES), np.int32)
    step = ctx.latest_checkpoint()
    if step is not None:
        sampler.cursor = ctx.restore(step, {"seen": seen})
        if ctx.rank == 0:
            print("resumed from step %d at world %d: cursor %s" % (
                ctx.restored_step, ctx.world_size, tuple(sampler.cursor)), flush=True)
    per_epoch = sampler.steps_per_epoch
    while sampler.epoch < EPOCHS:
        epoch = sampler.epoch
        gstep = epoch * per_epoch + sampler.step
        if gstep == a.kill_at and ctx.rank == 1 and ctx.restart_count == 0:
            print("rank 1: killing myself at step %d" % gstep, file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        count_step(ctx, seen, epoch, sampler.next_step())
        done = gstep + 1
        save = done % EVERY == 0
        try:
            ctx.report(done, state={"seen": seen} if save else None, cursor=sampler)
        except regroup.MembershipChanged as e:
            if not e.notice.preempt:
                raise
            left = ctx.leave(done, state=None if save else {"seen": seen}, cursor=sampler)
            if ctx.rank == 0:
                print("left at step %d: %s (%d ms were left)" % (
                    done, "checkpoint committed" if left else "no last checkpoint",
                    e.notice.ms_left), flush=True)
            return 0
        if done == a.stop_at:
            if ctx.rank == 0:
                print("stopped at step %d" % done, flush=True)
            return 0
    return report_exact(ctx, seen)


if __name__ == "__main__":
    sys.exit(main())
