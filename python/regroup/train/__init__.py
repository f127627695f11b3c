"""regroup.train: Ray Train's shape on regroup.

    from regroup import train
    from regroup.train.torch import prepare_model, prepare_optimizer, prepare_data_loader

    def train_func(config):
        model = prepare_model(Net())
        opt = prepare_optimizer(torch.optim.Adam(model.parameters(), lr=config["lr"]))
        loader = prepare_data_loader(DataLoader(ds, batch_size=64, shuffle=True))
        start = 0
        ckpt = train.get_checkpoint()
        if ckpt:
            d = ckpt.to_dict()
            model.module.load_state_dict(d["model"]); opt.load_state_dict(d["opt"])
            start = d["epoch"] + 1
        for epoch in range(start, config["epochs"]):
            for x, y in loader:
                opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()
            train.report({"epoch": epoch}, checkpoint=train.Checkpoint.from_dict(
                {"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}))

    result = train.TorchTrainer(train_func, train_loop_config={"lr": 1e-3, "epochs": 3},
                                scaling_config=train.ScalingConfig(num_workers=4),
                                run_config=train.RunConfig(name="mnist")).fit()

`python3 script.py` runs it on 4 local workers with a private etcd; the same script under
`regroup --nnodes=... --recovery=in-place python3 script.py` runs train_func in each worker.
"""

from ._ckpt import Checkpoint
from ._config import FailureConfig, RunConfig, ScalingConfig
from ._trainer import Result, TorchTrainer, TrainingFailedError
from . import _session


class TrainContext:
    """What get_context() returns: this worker's place in the job (after a regroup in
    place, in the new round)."""

    def __init__(self, s):
        self._s = s

    def get_world_rank(self):
        return self._s.ctx.rank

    def get_world_size(self):
        return self._s.ctx.world_size

    def get_local_rank(self):
        return self._s.ctx.local_rank

    def get_local_world_size(self):
        return self._s.ctx.local_world_size

    def get_node_rank(self):
        import os
        return int(os.environ.get("GROUP_RANK", "0"))

    def get_round(self):
        return self._s.ctx.round

    def get_step(self):
        """The steps the job has taken (its global step, the same on every rank): the
        prepared optimizer's steps, not counting one a failure discarded (in place, the
        loader replays its batch); after a restart, those of the checkpoint resumed from."""
        return self._s.done

    def get_experiment_name(self):
        import os
        return os.path.basename(self._s.run_dir) if self._s.run_dir else None

    def get_trial_dir(self):
        return self._s.run_dir


def get_context():
    """The worker's TrainContext (inside a training function)."""
    return TrainContext(_session.get())


def report(metrics, checkpoint=None):
    """Reports metrics (a dict; its numbers also go to `regroup status`) and, with a
    Checkpoint, saves it: sharded over the ranks, zstd-compressed, written in the background
    (this returns once the tensors are copied). Collective: every rank reports at the same
    points of the loop."""
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError("regroup.train: report's checkpoint is a %s, not a "
                        "regroup.train.Checkpoint" % type(checkpoint).__name__)
    if not isinstance(metrics, dict):
        raise TypeError("regroup.train: report's metrics is a %s, not a dict" %
                        type(metrics).__name__)
    _session.get().report(metrics, checkpoint)


def get_checkpoint():
    """The checkpoint to resume from: after a restart the newest committed one; for a
    replacement in place the one the survivors last reported, with their live values; None
    when there is none. Collective."""
    return _session.get().get_checkpoint()


__all__ = ["TorchTrainer", "ScalingConfig", "RunConfig", "FailureConfig", "Result",
           "TrainingFailedError", "Checkpoint", "TrainContext", "get_context", "report",
           "get_checkpoint"]
