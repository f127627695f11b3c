"""Run by the tests under `regroup --nproc-per-node=N` with REGROUP_CKPT_DIR set.

  worker_ckpt.py save     saves the state below at steps 10 and 20 (every dtype, shapes
                          with fewer rows than ranks and a 0-d tensor), each rank its rows
  worker_ckpt.py restore  reads the newest checkpoint whole into fresh tensors, at whatever
                          world size it runs, and checks every element and the cursor

Prints "saved rank=R" or "restored rank=R world=W step=S" at the end; a mismatch raises.
"""
import sys

import numpy as np

import regroup

try:
    import torch
except ImportError:
    torch = None

# name: (dtype, shape, library): values are small integers, exact in every dtype.
STATE = {
    "w_f32": ("float32", (10, 3), "numpy"),
    "w_f64": ("float64", (5,), "numpy"),
    "w_f16": ("float16", (7, 2), "numpy"),
    "w_bf16": ("bfloat16", (9,), "torch"),
    "w_i32": ("int32", (3,), "torch"),        # fewer rows than 4 ranks
    "w_i64": ("int64", (), "numpy"),          # 0-d: rank 0 saves it
    "w_u8": ("uint8", (64, 64), "numpy"),     # 4096 rows of bytes
    "t_f32": ("float32", (4, 2, 3), "torch"),
}
CURSORS = {10: regroup.Cursor(5, 1, 3), 20: regroup.Cursor(5, 2, 7)}


def expected(name, step):
    dtype, shape, _ = STATE[name]
    n = int(np.prod(shape)) if shape else 1
    k = sum(map(ord, name))
    v = (np.arange(n, dtype=np.int64) * 37 + k + step) % 251
    return v.astype(np.float64).reshape(shape)


def make(name, v):
    dtype, shape, kind = STATE[name]
    if kind == "torch" and torch is not None:
        return torch.tensor(v, dtype=getattr(torch, dtype)).reshape(shape)
    if dtype == "bfloat16":
        raise SystemExit("bfloat16 needs PyTorch")
    return np.array(v, dtype=dtype).reshape(shape)


def as_f64(t):
    if isinstance(t, np.ndarray):
        return t.astype(np.float64)
    return t.to(torch.float64).numpy()


def main():
    mode = sys.argv[1]
    with regroup.init() as ctx:
        if mode == "save":
            assert ctx.latest_checkpoint() is None
            for step in (10, 20):
                state = {n: make(n, expected(n, step)) for n in STATE}
                ctx.report(step, metrics={"loss": 1.0 / step}, state=state,
                           cursor=CURSORS[step])
                # The tensors may change at once: report copied them.
                for t in state.values():
                    t.fill(0) if isinstance(t, np.ndarray) else t.zero_()
            print("saved rank=%d" % ctx.rank, flush=True)
            return 0
        step = ctx.latest_checkpoint()
        assert step == 20, "latest checkpoint %r, not 20" % step
        got = {n: make(n, np.zeros(STATE[n][1])) for n in STATE}
        cur = ctx.restore(step, got)
        assert ctx.restored_step == 20, ctx.restored_step
        assert cur == CURSORS[20], "cursor %r, not %r" % (cur, CURSORS[20])
        for n, t in got.items():
            want = expected(n, 20)
            if not np.array_equal(as_f64(t), want):
                raise AssertionError("%s at world %d: got %s, want %s" % (
                    n, ctx.world_size, as_f64(t).ravel()[:8], want.ravel()[:8]))
        print("restored rank=%d world=%d step=%d" % (ctx.rank, ctx.world_size, step),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
