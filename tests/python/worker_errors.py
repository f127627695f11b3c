"""Run by test_errors.py as each rank of a small job on the test's own etcd (the worker
environment set by the test, as the launcher would):

  worker_errors.py args      (1 rank) every argument error: each raises TypeError or
                             ValueError naming what is wrong, and the group stays usable
  worker_errors.py timeout   (2 ranks) rank 1 does not join the allreduce until rank 0's
                             has timed out: regroup.Error ETIMEDOUT on rank 0
  worker_errors.py peer      (2 ranks) rank 1 SIGKILLs itself after a barrier: rank 0's
                             allreduce raises regroup.PeerError naming rank 1

Each prints "<mode> ok rank=R" when its checks pass; a failed check raises (exit 1).
"""
import os
import signal
import sys
import time

import numpy as np

import regroup

try:
    import torch
except ImportError:
    torch = None


def expect(exc, words, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        msg = str(e)
        for w in words:
            assert w in msg, "%r does not name %r" % (msg, w)
        return e
    raise AssertionError("%s%r did not raise %s" % (fn.__name__, args, exc.__name__))


def args_checks(ctx):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    expect(ValueError, ["not C-contiguous"], ctx.allreduce, a.T)
    expect(TypeError, ["complex128", "float32"], ctx.allreduce, np.zeros(3, np.complex128))
    expect(TypeError, ["int16"], ctx.broadcast, np.zeros(3, np.int16))
    expect(TypeError, ["builtins.list"], ctx.allreduce, [1.0, 2.0])
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    expect(ValueError, ["read-only"], ctx.allreduce, ro)
    expect(ValueError, ["'mean'", "sum"], ctx.allreduce, a, op="mean")
    e = expect(regroup.Error, ["EINVAL"], ctx.allreduce, np.zeros(3, np.int32), op="avg")
    assert e.status == "EINVAL" and e.code == -1 and e.message, e
    expect(ValueError, ["dst has 5 elements"], ctx.allgather, np.zeros(2, np.float32),
           np.zeros(5, np.float32))
    expect(TypeError, ["src is float32, dst float64"], ctx.allgather,
           np.zeros(1, np.float32), np.zeros(1, np.float64))
    expect(ValueError, ["not C-contiguous"], ctx.report, 1, state={"x": a.T})
    expect(TypeError, ["complex64"], ctx.restore, 1, {"x": np.zeros(1, np.complex64)})
    if torch is not None:
        t = torch.zeros(4, 4)
        expect(ValueError, ["not contiguous"], ctx.allreduce, t.t())
        expect(TypeError, ["complex64"], ctx.allreduce, torch.zeros(2, dtype=torch.complex64))
        expect(TypeError, ["int16"], ctx.allreduce, torch.zeros(2, dtype=torch.int16))
        expect(TypeError, ["device meta"], ctx.allreduce, torch.zeros(2, device="meta"))
    # No checkpoint directory: no checkpoint.
    assert ctx.ckpt_dir is None and ctx.latest_checkpoint() is None
    # A bad report (a metric name the library refuses): regroup.Error with its message.
    expect(regroup.Error, ["EINVAL"], ctx.report, 1, metrics={"bad name!": 1.0})
    # None of the above touched the group.
    assert ctx.healthy
    x = np.ones(4, np.float64)
    ctx.allreduce(x)
    assert x.tolist() == [1.0] * 4


def main():
    mode = sys.argv[1]
    ctx = regroup.init()
    r = ctx.rank
    if mode == "args":
        args_checks(ctx)
        ctx.close()
        expect(ValueError, ["closed"], ctx.barrier)
        ctx.close()   # idempotent
    elif mode == "timeout":
        flag = sys.argv[2]
        x = np.ones(16, np.float32)
        if r == 0:
            t0 = time.monotonic()
            e = expect(regroup.Error, ["ETIMEDOUT"], ctx.allreduce, x, timeout_ms=300)
            assert type(e) is regroup.Error and e.status == "ETIMEDOUT", repr(e)
            assert time.monotonic() - t0 < 20
            assert not ctx.healthy
            with open(flag, "w"):
                pass
        else:
            deadline = time.monotonic() + 60
            while not os.path.exists(flag):
                assert time.monotonic() < deadline, "rank 0 never timed out"
                time.sleep(0.05)
        ctx.close()
    elif mode == "peer":
        ctx.barrier()
        if r == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.ones(1 << 16, np.float32)
        e = expect(regroup.PeerError, ["EPEER"], ctx.allreduce, x, timeout_ms=20000)
        assert isinstance(e, regroup.Error) and e.status == "EPEER" and e.code == -40, repr(e)
        assert not ctx.healthy and ctx.failed_rank == 1, (ctx.healthy, ctx.failed_rank)
        # Every later call fails the same way until the group is given up.
        expect(regroup.PeerError, ["EPEER"], ctx.barrier)
        ctx.close()
    print("%s ok rank=%d" % (mode, r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
