"""What worker_exact.py and worker_inplace.py share: the count of every sample each step
consumed, and the exactly-once verdict on those counts.

`seen` is an (epochs x samples) int32 array, replicated: the same on every rank."""
import numpy as np


def count_step(ctx, seen, epoch, ids, before=None):
    """Adds this rank's share `ids` of the step's global batch, summed over the ranks by an
    allreduce, to seen[epoch] (raises what ctx.allreduce raises, seen untouched). before(),
    if given, runs between the allreduce and the update (raising there leaves seen too)."""
    inc = np.zeros(seen.shape, np.int32)
    inc[epoch, ids] += 1
    ctx.allreduce(inc)
    if before is not None:
        before()
    seen += inc


def report_exact(ctx, seen):
    """On rank 0, prints "exact=1 world=W", or "exact=0: ..." with the first count that is
    not 1; the worker's exit status (1 for exact=0, else 0)."""
    if ctx.rank != 0:
        return 0
    bad = np.argwhere(seen != 1)
    if len(bad):
        print("exact=0: %d (epoch, sample) counts are not 1, first %s: %d" % (
            len(bad), tuple(bad[0]), seen[tuple(bad[0])]), flush=True)
        return 1
    print("exact=1 world=%d" % ctx.world_size, flush=True)
    return 0
