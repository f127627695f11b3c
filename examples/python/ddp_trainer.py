"""Fashion-MNIST with PyTorch DDP on regroup.train: the main job's model (a 784-256-10 MLP,
Adam, a global batch of 64) as a Ray Train user writes it, with no recovery code.

    python3 examples/python/ddp_trainer.py --workers 4 --epochs 2        # 4 local workers
    regroup --nnodes=1:2 --nproc-per-node=2 --recovery=in-place --rdzv-endpoint=... \\
        /usr/bin/python3 examples/python/ddp_trainer.py                  # under agents

fit() starts the workers (here, under `regroup --standalone` with a private etcd); every
worker runs train_func: prepare_model (DDP), prepare_optimizer, prepare_data_loader (the
global sampler), a plain loop, report() with a checkpoint per epoch. In place (the default),
a killed worker costs the survivors a discarded step: they keep their processes and state,
the job regroups at the smaller size at once and replays the global batch, and the
replacement receives the state from a survivor; restart mode (--recovery restart) restarts
every worker from the last checkpoint. --kill-at STEP makes rank --kill-rank SIGKILL itself
at that step of the first round, to see it. The driver prints "test_accuracy=<fraction>".
"""
import argparse
import math
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fmnist_torch import Model, load_split  # noqa: E402 (the main job's model and data)

from regroup import train  # noqa: E402
from regroup.train.torch import (prepare_data_loader, prepare_model,  # noqa: E402
                                 prepare_optimizer)


def train_func(config):
    torch.set_num_threads(1)
    ctx = train.get_context()
    x, y = load_split(config["data"], "train", config["data_cache"])
    if config["train_samples"]:
        x, y = x[:config["train_samples"]], y[:config["train_samples"]]
    tx, ty = load_split(config["data"], "t10k", config["data_cache"])
    torch.manual_seed(config["seed"])
    model = prepare_model(Model())
    opt = prepare_optimizer(torch.optim.Adam(model.parameters(), lr=config["lr"]))
    ds = TensorDataset(x, y)   # (the bytes: each batch is scaled to [0, 1] as it is used)
    loader = prepare_data_loader(DataLoader(ds, batch_size=config["batch"] // config["workers"],
                                            shuffle=True), global_batch_size=config["batch"],
                                 seed=config["seed"])
    start = 0
    ck = train.get_checkpoint()
    if ck:
        d = ck.to_dict()
        model.module.load_state_dict(d["model"])
        opt.load_state_dict(d["optimizer"])
        start = d["epoch"] + 1
    steps = 0
    t0, trained = time.monotonic(), 0
    step_log = open(config["step_log"], "a", buffering=1) if config["step_log"] else None
    for epoch in range(start, config["epochs"]):
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb.float() / 255.0), yb)
            loss.backward()
            before = ctx.get_step()
            opt.step()   # (in place, a step a failure broke is discarded: not counted)
            steps += 1
            trained += loader.global_count
            if step_log and ctx.get_world_rank() == 0 and ctx.get_step() > before:
                step_log.write("%d %d\n" % (ctx.get_step(), time.time_ns() // 1000000))
            if steps == config["kill_at"] and ctx.get_world_rank() == config["kill_rank"] and \
                    ctx.get_round() == 0 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
                print("rank %d: killing myself at step %d" % (ctx.get_world_rank(), steps),
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        with torch.no_grad():
            acc = (model.module(tx.float() / 255.0).argmax(1) == ty).float().mean().item()
        train.report({"epoch": epoch, "loss": loss.item(), "test_accuracy": acc,
                      "world_size": ctx.get_world_size(),
                      "samples_per_s": trained / (time.monotonic() - t0)},
                     checkpoint=train.Checkpoint.from_dict({
                         "model": model.module.state_dict(), "optimizer": opt.state_dict(),
                         "epoch": epoch}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train-samples", type=int, default=0, help="the first N (0: all)")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--data-cache", default=None,
                    help="keep the decompressed data set here (a replacement reads it)")
    ap.add_argument("--recovery", choices=["in-place", "restart"], default="in-place")
    ap.add_argument("--max-failures", type=int, default=3)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--name", default="ddp-fmnist")
    ap.add_argument("--storage", default=None)
    ap.add_argument("--step-log", default=None,
                    help="rank 0 appends \"STEP MS\" here for each step it completes (the "
                    "job's step, the wall clock in ms): what the benchmarks time")
    a = ap.parse_args()
    config = {k: getattr(a, k) for k in ("workers", "epochs", "batch", "lr", "seed",
                                         "train_samples", "data", "data_cache", "kill_at",
                                         "kill_rank", "step_log")}
    trainer = train.TorchTrainer(
        train_func, train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=a.workers),
        run_config=train.RunConfig(name=a.name, storage_path=a.storage,
                                   failure_config=train.FailureConfig(
                                       max_failures=a.max_failures, recovery=a.recovery)))
    try:
        result = trainer.fit()
    except train.TrainingFailedError as e:
        print(e, file=sys.stderr)
        return 1
    print("epochs=%d checkpoint=%s" % (len(result.metrics_history), result.checkpoint.path))
    print("samples_per_s=%.0f" % result.metrics["samples_per_s"])
    print("test_accuracy=%.4f" % result.metrics["test_accuracy"])
    return 0 if math.isfinite(result.metrics["loss"]) else 1


if __name__ == "__main__":
    sys.exit(main())
