"""rg_bench_python.py: the per-call cost of an allreduce through the Python package.

Runs as one rank under the launcher (bench/rg-bench-python.sh starts it beside rg-bench-comm,
the same measurement from C). For each kind of tensor (a NumPy array, a PyTorch tensor when
torch is there) it warms up, sizes the loop from a timed probe (rank 0's count, broadcast, so
every rank runs the same number), times `ctx.allreduce(t)` in a loop, and rank 0 prints
  {"bench":"comm-python","kind":"numpy","op":"allreduce","dtype":"f64","bytes":8,"ranks":2,
   "iters":..,"latency_us":..}
latency_us being the slowest rank's mean time per call, as rg-bench-comm reports it. The
timed buffer holds 0 (so that repeated in-place sums stay finite); a last allreduce of
rank + 1 is checked exactly on every rank, and a wrong result ends it with exit status 1.

  rg_bench_python.py [--count N] [--seconds S]
"""
import argparse
import sys
import time

import numpy as np

import regroup

try:
    import torch
except ImportError:
    torch = None


def run(ctx, kind, count, seconds):
    if kind == "numpy":
        t = np.zeros(count, np.float64)
    else:
        t = torch.zeros(count, dtype=torch.float64)
    for _ in range(2000):
        ctx.allreduce(t)
    t0 = time.perf_counter()
    for _ in range(200):
        ctx.allreduce(t)
    probe = (time.perf_counter() - t0) / 200
    iters = np.array([min(max(int(seconds / max(probe, 1e-7)), 50), 2000000)], np.int64)
    ctx.broadcast(iters, root=0)
    n = int(iters[0])
    t0 = time.perf_counter()
    for _ in range(n):
        ctx.allreduce(t)
    per = np.array([(time.perf_counter() - t0) / n])
    ctx.allreduce(per, op="max")
    t[:] = ctx.rank + 1
    ctx.allreduce(t)
    want = ctx.world_size * (ctx.world_size + 1) / 2
    if not all(float(x) == want for x in t):
        print("rg_bench_python: rank %d: %s allreduce gave %s, not %g" % (
            ctx.rank, kind, list(t), want), file=sys.stderr, flush=True)
        return 1
    if ctx.rank == 0:
        print('{"bench":"comm-python","kind":"%s","op":"allreduce","dtype":"f64","bytes":%d,'
              '"ranks":%d,"iters":%d,"latency_us":%.3f}' % (
                  kind, count * 8, ctx.world_size, n, per[0] * 1e6), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1, help="float64 elements (1: 8 bytes)")
    ap.add_argument("--seconds", type=float, default=0.5)
    a = ap.parse_args()
    rc = 0
    with regroup.init() as ctx:
        for kind in ["numpy"] + (["torch"] if torch is not None else []):
            rc |= run(ctx, kind, a.count, a.seconds)
    return rc


if __name__ == "__main__":
    sys.exit(main())
