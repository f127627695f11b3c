"""The Trainer's configuration, with Ray Train's names: ScalingConfig, RunConfig,
FailureConfig. Each checks its values when made, and says which one is wrong."""

import os

RECOVERIES = ("in-place", "restart")


class ScalingConfig:
    """How many workers: num_workers=N, or (MIN, MAX) for a job that runs on as many as are
    there (under the launcher, --nnodes=MIN:MAX decides; fit() on one machine starts MAX).
    use_gpu=True asks for a CUDA device per worker (refused where PyTorch has none)."""

    def __init__(self, num_workers=1, use_gpu=False):
        if isinstance(num_workers, (tuple, list)):
            if len(num_workers) != 2:
                raise ValueError("regroup.train: ScalingConfig: num_workers=%r; give N or "
                                 "(MIN, MAX)" % (num_workers,))
            lo, hi = (_count(v, "num_workers") for v in num_workers)
            if lo > hi:
                raise ValueError("regroup.train: ScalingConfig: num_workers=(%d, %d): MIN is "
                                 "above MAX" % (lo, hi))
        else:
            lo = hi = _count(num_workers, "num_workers")
        self.num_workers = num_workers
        self.min_workers, self.max_workers = lo, hi
        self.use_gpu = bool(use_gpu)

    def __repr__(self):
        return "ScalingConfig(num_workers=%r, use_gpu=%r)" % (self.num_workers, self.use_gpu)


class FailureConfig:
    """max_failures: worker failures the job survives (0: the first one ends it, as in Ray
    Train; -1: any number). recovery: "in-place" (the default: the survivors keep their
    processes and state, a replacement receives it from them) or "restart" (every worker
    restarts from the last checkpoint, as torchrun)."""

    def __init__(self, max_failures=0, recovery="in-place"):
        if not isinstance(max_failures, int) or isinstance(max_failures, bool) or \
                max_failures < -1:
            raise ValueError("regroup.train: FailureConfig: max_failures=%r; give an int >= 0, "
                             "or -1 for any number" % (max_failures,))
        if recovery not in RECOVERIES:
            raise ValueError("regroup.train: FailureConfig: recovery=%r; use %s" % (
                recovery, " or ".join(RECOVERIES)))
        self.max_failures = max_failures
        self.recovery = recovery

    def __repr__(self):
        return "FailureConfig(max_failures=%r, recovery=%r)" % (self.max_failures,
                                                                 self.recovery)


class RunConfig:
    """name: the run's name (default: train_<time>); storage_path: where its directory goes
    (default ~/regroup_results): <storage_path>/<name>/ holds checkpoints/ (the sharded
    checkpoints), metrics.jsonl (every report's metrics) and errors/ (a failed worker's
    traceback). Under several nodes it must be a directory every node shares."""

    def __init__(self, name=None, storage_path=None, failure_config=None):
        if name is not None and (not isinstance(name, str) or not name or "/" in name):
            raise ValueError("regroup.train: RunConfig: name=%r; give a non-empty name "
                             "without '/'" % (name,))
        if failure_config is not None and not isinstance(failure_config, FailureConfig):
            raise TypeError("regroup.train: RunConfig: failure_config is a %s, not a "
                            "FailureConfig" % type(failure_config).__name__)
        self.name = name
        self.storage_path = os.path.expanduser(storage_path or "~/regroup_results")
        self.failure_config = failure_config or FailureConfig()

    def __repr__(self):
        return "RunConfig(name=%r, storage_path=%r, failure_config=%r)" % (
            self.name, self.storage_path, self.failure_config)


def _count(v, what):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError("regroup.train: ScalingConfig: %s=%r; a job needs at least one "
                         "worker" % (what, v))
    return v
