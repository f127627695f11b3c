"""Run by the tests under `regroup --nproc-per-node=N`: every collective, op and dtype, from
NumPy arrays and PyTorch tensors, against NumPy's result of the same inputs on every rank.

Inputs are small integers, so that sum, min, max and prod are exact in every dtype (bfloat16
included) whatever the order the library reduces in; avg is checked to the dtype's precision.
Prints "ops ok rank=R checks=K" at the end; any mismatch raises (exit 1).
"""
import sys

import numpy as np

import regroup

try:
    import torch
except ImportError:  # the NumPy half still runs
    torch = None

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]
OPS = ["sum", "avg", "min", "max", "prod"]
SIZES = [1, 7, 3000]    # 3000 elements: past the small-message shared-memory path
RTOL = {"float32": 1e-6, "float64": 1e-12, "float16": 2 ** -10, "bfloat16": 2 ** -7}


def values(rank, n, dtype, op):
    """Rank's input as float64: small integers, negative ones for signed types."""
    i = np.arange(n, dtype=np.int64)
    if op == "prod":
        v = (i + rank) % 2 + 1
    else:
        v = (i * 7 + rank * 3) % 8
        if dtype != "uint8":
            v = v - 3
    return v.astype(np.float64)


def make(kind, v, dtype, shape=None):
    """The input in the library kind's own type (a fresh, contiguous tensor)."""
    if shape is not None:
        v = v.reshape(shape)
    if kind == "numpy":
        return np.array(v, dtype=dtype)
    return torch.tensor(v, dtype=getattr(torch, dtype))


def as_f64(t):
    if isinstance(t, np.ndarray):
        return t.astype(np.float64)
    return t.to(torch.float64).numpy()


def reduce_all(op, stack):
    if op == "sum":
        return stack.sum(axis=0)
    if op == "avg":
        return stack.sum(axis=0) / stack.shape[0]
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    return stack.prod(axis=0)


def main():
    checks = 0
    kinds = ["numpy"] + (["torch"] if torch is not None else [])
    with regroup.init() as ctx:
        w, r = ctx.world_size, ctx.rank
        for kind in kinds:
            for dtype in DTYPES:
                if kind == "numpy" and dtype == "bfloat16":
                    continue   # NumPy has no bfloat16: the torch half covers it
                for n in SIZES:
                    shape = (n,) if n != 3000 else (30, 100)
                    for op in OPS:
                        t = make(kind, values(r, n, dtype, op), dtype, shape)
                        if op == "avg" and dtype not in RTOL:
                            try:
                                ctx.allreduce(t, op="avg")
                            except regroup.Error as e:
                                assert e.status == "EINVAL", e
                                checks += 1
                                continue
                            raise AssertionError("avg on %s did not fail" % dtype)
                        out = ctx.allreduce(t, op=op)
                        assert out is t
                        stack = np.stack([values(q, n, dtype, op) for q in range(w)])
                        want = reduce_all(op, stack).reshape(shape)
                        got = as_f64(t)
                        if op == "avg":
                            ok = np.allclose(got, want, rtol=RTOL[dtype], atol=0)
                        else:
                            ok = np.array_equal(got, want)
                        if not ok:
                            raise AssertionError("%s %s allreduce %s n=%d at world %d: got %s, "
                                                 "want %s" % (kind, dtype, op, n, w,
                                                              got.ravel()[:8],
                                                              want.ravel()[:8]))
                        checks += 1
                    for root in range(w):
                        t = make(kind, values(r, n, dtype, "sum"), dtype, shape)
                        ctx.broadcast(t, root=root)
                        want = values(root, n, dtype, "sum").reshape(shape)
                        assert np.array_equal(as_f64(t), want), (kind, dtype, "bcast", root)
                        checks += 1
                    src = make(kind, values(r, n, dtype, "sum"), dtype)
                    dst = make(kind, np.zeros(n * w), dtype)
                    ctx.allgather(src, dst)
                    want = np.concatenate([values(q, n, dtype, "sum") for q in range(w)])
                    assert np.array_equal(as_f64(dst), want), (kind, dtype, "allgather", n)
                    # In place: this rank's part already in dst.
                    dst = make(kind, np.zeros(n * w), dtype)
                    dst[r * n:(r + 1) * n] = src
                    ctx.allgather(dst[r * n:(r + 1) * n], dst)
                    assert np.array_equal(as_f64(dst), want), (kind, dtype, "allgather ip", n)
                    checks += 2
        ctx.barrier()
        print("ops ok rank=%d checks=%d" % (r, checks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
