"""torch.distributed's regroup backend under the launcher: every collective DDP and ordinary
code call, checked against what torch defines; `die` mode: rank 1 SIGKILLs itself and the
others' next all_reduce must raise (a dead peer is an error, never a hang).

Prints "pg ok rank=R world=W" (or "pg peer error rank=R after=S") on success."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import regroup.distributed  # noqa: F401 (registers the backend)


def main():
    dist.init_process_group("regroup")
    r, w = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "regroup"
    if len(sys.argv) > 1 and sys.argv[1] == "die":
        dist.barrier()
        if r == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 60:
                dist.all_reduce(torch.ones(4))
        except RuntimeError as e:
            assert "EPEER" in str(e) or "ETIMEDOUT" in str(e), e
            print("pg peer error rank=%d after=%.3f" % (r, time.monotonic() - t0), flush=True)
            os._exit(0)
        raise SystemExit("no error in 60 s")
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        t = torch.full((5,), r + 1, dtype=dtype)
        dist.all_reduce(t)
        assert (t == w * (w + 1) // 2).all(), (dtype, t)
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert (t == w).all(), t
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    assert (t == 1).all(), t
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    assert (t == float(torch.arange(1, w + 1).prod())).all(), t
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.allclose(t, torch.full((3,), (w + 1) / 2)), t
    out = [torch.zeros(2, 3) for _ in range(w)]
    dist.all_gather(out, torch.full((2, 3), float(r)))
    assert [int(o[1, 2]) for o in out] == list(range(w)), out
    big = torch.zeros(w * 4)
    dist._all_gather_base(big, torch.full((4,), float(r)))
    assert big.view(w, 4)[:, 0].tolist() == list(range(w)), big
    b = torch.full((4,), float(r))
    dist.broadcast(b, w - 1)
    assert (b == w - 1).all(), b
    ins = [torch.full((2,), float(r * 10 + j)) for j in range(w)]
    o = torch.zeros(2)
    dist.reduce_scatter(o, ins)
    assert (o == sum(i * 10 + r for i in range(w))).all(), o
    if r == 0:
        dist.send(torch.arange(5.), 1, tag=7)
    elif r == 1:
        x = torch.zeros(5)
        dist.recv(x, 0, tag=7)
        assert x.tolist() == [0, 1, 2, 3, 4], x
    try:
        dist.all_reduce(torch.zeros(2, dtype=torch.bool))
        raise SystemExit("a bool tensor was reduced")
    except RuntimeError as e:
        assert "dtype" in str(e), e
    # DDP on the backend: the gradients are averaged over the ranks
    torch.manual_seed(r)                    # different inits: DDP broadcasts rank 0's
    m = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    x = torch.full((3, 4), float(r + 1))
    ddp(x).sum().backward()
    g = m.weight.grad.clone()
    gs = [torch.zeros_like(g) for _ in range(w)]
    dist.all_gather(gs, g)
    assert all(torch.equal(gs[0], q) for q in gs), gs
    expect = 3 * (w + 1) / 2                # d(sum)/dW = sum of the rows, averaged over ranks
    assert torch.allclose(g, torch.full_like(g, expect)), (g, expect)
    dist.barrier()
    print("pg ok rank=%d world=%d" % (r, w), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
