"""Run by test_jobs.py under `regroup --recovery=in-place`: the sampler's exactly-once
property through an in-place regroup.

As worker_exact.py, every rank counts the samples of each step's global batch in `seen`
(epochs x samples, replicated: the same on every rank), here kept in memory through a
failure: on PeerError (or a timeout) in the allreduce, or MembershipChanged from report, every
rank calls ctx.regroup with `seen`, the steps it holds and the cursor after them, and goes on
from the step the regroup agreed on, at the new rank and world size; a replacement worker
(ctx.joining) regroups before its first collective and receives `seen` from a survivor. A
step repeated or skipped across the regroup would leave a count other than 1. Rank 0 prints
"regrouped: WHY; round R world W from step S, state from rank X" per regroup and at the end
"exact=1 world=W" (exit 0) or "exact=0 ..." (exit 1). --kill-at STEP: rank 1 SIGKILLs itself
there, in the job's first round (not a survivor renumbered 1, nor a replacement).
--table-rows N: a sharded table (ctx.table) of N int64 rows too, row i adding (i + 1) *
(step + 1) at every step and committed before `seen` takes the step; at the end every rank
checks its rows and rank 0 prints "table=1" (or "table=0 ...", exit 1).
With `seen` goes a side record of a size only the source knows (regroup's `extra`): the step
and a digest of its `seen`, and step % 7 filler bytes; a receiver checks it against the
`seen` it received ("side record ..." and exit 1 otherwise), and a member that received
nothing must have none.

  worker_inplace.py [--kill-at S] [--epochs E] [--table-rows N]
"""
import argparse
import hashlib
import os
import signal
import sys

import numpy as np

import regroup

from exact_counts import count_step, report_exact

SAMPLES, BATCH, SEED, EVERY = 200, 8, 11, 5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--table-rows", type=int, default=0)
    a = ap.parse_args()
    with regroup.init(in_place=True) as ctx:
        return run(ctx, a)


def regroup_on(ctx, e):
    """Whether a failed call is one to regroup on (in place only), as the C examples."""
    return ctx.in_place and (isinstance(e, (regroup.PeerError, regroup.MembershipChanged))
                             or e.status == "ETIMEDOUT")


def run(ctx, a):
    EPOCHS = a.epochs
    replacement = ctx.joining
    print("rank %d: pid %d started (joining %d, in place %d)" % (
        ctx.rank, os.getpid(), int(ctx.joining), int(ctx.in_place)), file=sys.stderr,
        flush=True)
    sampler = regroup.GlobalSampler(SAMPLES, BATCH, SEED, rank=max(ctx.rank, 0),
                                    world_size=max(ctx.world_size, 1))
    seen = np.zeros((EPOCHS, SAMPLES), np.int32)
    done = 0                     # the steps `seen` holds
    cur = sampler.cursor         # the data position after them
    why = None
    if ctx.joining:
        why = "a replacement joined"
    else:
        step = ctx.latest_checkpoint()
        if step is not None:
            cur = sampler.cursor = ctx.restore(step, {"seen": seen})
            done = ctx.restored_step
            if ctx.rank == 0:
                print("resumed from step %d at world %d" % (done, ctx.world_size), flush=True)
    per_epoch = sampler.steps_per_epoch
    table = ctx.table(a.table_rows, 8) if a.table_rows > 0 else None
    if table is not None and done > 0:
        raise RuntimeError("the table is not in this worker's checkpoints")
    table_at = -1                # the step the table's copies hold

    def step_rows(gstep):
        """The table's part of step gstep: its rows, then their commit as step gstep + 1."""
        first, rows = table.rows()
        ids = np.arange(first, first + len(rows), dtype=np.int64)
        rows.view(np.int64)[:, 0] += (ids + 1) * (gstep + 1)
        table.commit(gstep + 1)

    def side(step):
        return b"%d:%s:" % (step, hashlib.sha256(seen.tobytes()).hexdigest().encode()) + \
            b"x" * (step % 7)

    while True:
        if why is not None:
            at = done
            r = ctx.regroup(done, [seen], cur, table=table, extra=lambda: side(at))
            want = side(r.step) if r.received else None
            if r.extra != want or (r.received and r.n_received < 1):
                print("side record of step %d: %r, not %r (%d received)" % (
                    r.step, r.extra, want, r.n_received), file=sys.stderr, flush=True)
                return 1
            sampler.reshard(r.rank, r.world_size, r.cursor)
            done, cur = r.step, r.cursor
            table_at = done
            if r.rank == 0:
                print("regrouped: %s; round %d world %d from step %d, state from rank %d" % (
                    why, r.round, r.world_size, r.step, r.source), flush=True)
            why = None
        if sampler.epoch >= EPOCHS:
            break
        try:
            epoch = sampler.epoch
            gstep = epoch * per_epoch + sampler.step
            if gstep != done:
                raise RuntimeError("rank %d: cursor at global step %d, state at %d" % (
                    ctx.rank, gstep, done))
            if table is not None and table_at != gstep:
                table.commit(gstep)   # a fresh start's rows, before its first step
                table_at = gstep
            if gstep == a.kill_at and ctx.rank == 1 and ctx.round == 0 and \
                    ctx.restart_count == 0 and not replacement:
                print("rank 1: killing myself at step %d" % gstep, file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            ids = sampler.next_step()
            count_step(ctx, seen, epoch, ids,
                       before=(lambda: step_rows(gstep)) if table is not None else None)
            table_at = gstep + 1 if table is not None else table_at
            done = gstep + 1
            cur = sampler.cursor
            ctx.report(done, state={"seen": seen} if done % EVERY == 0 else None, cursor=cur)
        except regroup.Error as e:
            if not regroup_on(ctx, e):
                raise
            why = "the membership changes" if isinstance(e, regroup.MembershipChanged) \
                else "a peer failed"
    rc = report_exact(ctx, seen)
    if table is not None:
        rc = max(rc, check_table(ctx, table, done))
    return rc


def check_table(ctx, table, steps):
    """Every rank's rows after `steps` steps: row i holds (i + 1) * steps * (steps + 1) / 2;
    rank 0 prints "table=1", or "table=0: N rows differ" (exit status 1)."""
    first, rows = table.rows()
    ids = np.arange(first, first + len(rows), dtype=np.int64)
    bad = np.array([np.count_nonzero(rows.view(np.int64)[:, 0] !=
                                     (ids + 1) * steps * (steps + 1) // 2)], np.int64)
    ctx.allreduce(bad)
    if ctx.rank != 0:
        return 0
    print("table=1" if bad[0] == 0 else "table=0: %d rows differ" % bad[0], flush=True)
    return 1 if bad[0] else 0


if __name__ == "__main__":
    sys.exit(main())
