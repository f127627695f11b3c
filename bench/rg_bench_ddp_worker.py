#!/usr/bin/python3
# A worker for rg-bench-launcher's node_lost scenarios: PyTorch DDP over gloo, one real
# allreduce of the gradients every step, so that a launcher learns of a lost peer the way its
# users' jobs do (the collective's error, or its timeout) as well as by its own means.
# Joins the group from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT), then records its start in $RG_TEST_DIR/events as rg_test_worker.sh does
# ("start ROUND RANK WORLD RESTART PID LOCAL_RANK GROUP_RANK UNIX_TIME"), then trains until
# $RG_TEST_DIR/stop exists (at most 300 s). A collective that fails ends it with status 1.
# RG_BENCH_GLOO_TIMEOUT: the process group's timeout in seconds (PyTorch's default, 1800).
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    d = os.environ["RG_TEST_DIR"]
    stop = os.path.join(d, "stop")
    if os.path.exists(stop):  # restarted while the bench stops the job
        return 0
    timeout = float(os.environ.get("RG_BENCH_GLOO_TIMEOUT", "1800"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout))
    rank = dist.get_rank()
    world = dist.get_world_size()
    with open(os.path.join(d, "events"), "a") as f:
        f.write("start %s %d %d %s %d %s %s %.6f\n" % (
            os.environ.get("REGROUP_ROUND", "-1"), rank, world,
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), os.getpid(),
            os.environ.get("LOCAL_RANK", "0"), os.environ.get("GROUP_RANK", "-1"), time.time()))
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.time() + 300
    while True:
        loss = model(torch.randn(8, 64)).square().sum()
        opt.zero_grad()
        loss.backward()  # the gradients' allreduce
        opt.step()
        # every rank stops at the same step: the stop file or the time bound, agreed
        flag = torch.tensor([1 if os.path.exists(stop) or time.time() > end else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            break
        time.sleep(0.02)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the collective's error: the launcher sees a failed worker
        print("rank %s: %s: %s" % (os.environ.get("RANK"), type(e).__name__, e), file=sys.stderr)
        sys.exit(1)
