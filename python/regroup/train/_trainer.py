"""TorchTrainer: fit() runs a training function on workers, as Ray Train's does.

In the program that calls fit() (the driver), fit() starts the workers on this machine under
the regroup launcher with a private etcd (`regroup --standalone`): each worker runs this same
program (sys.argv) again, and its fit() runs the training function instead of starting
anything, then exits. Under agents that a user started (`regroup --nnodes=... python3
script.py`), every process is a worker: fit() runs the training function. The config goes
to the workers pickled (a config that cannot be pickled is refused before anything starts),
the metrics come back through <run>/metrics.jsonl (rank 0 writes it), a failed worker's
traceback through <run>/errors/.
"""

import glob
import inspect
import json
import os
import pickle
import signal
import subprocess
import sys
import time

from .. import _lib
from . import _ckpt
from . import _session
from ._config import FailureConfig, RunConfig, ScalingConfig

_CONFIG_ENV = "REGROUP_TRAIN_CONFIG"
_RUN_ENV = "REGROUP_TRAIN_RUN_DIR"
_STOP_GRACE_S = 60
# Modules that take seconds to import, preloaded for the workers when the driver has them;
# then regroup's own (regroup._preload: the library, regroup.train, the torch backend).
_PRELOADED = ("numpy", "torch")


class TrainingFailedError(RuntimeError):
    """A worker's training function failed (or the job did). rank, node and traceback name
    the first failure; None when the job failed with no worker's traceback (its exit
    status says why)."""

    def __init__(self, message, rank=None, node=None, traceback=None):
        super().__init__(message)
        self.rank = rank
        self.node = node
        self.traceback = traceback


class Result:
    """What fit() returns: metrics (the last report's, rank 0's), metrics_history (every
    report's, in order), metrics_dataframe (the same as a pandas DataFrame, where pandas is
    installed), checkpoint (the newest committed, a Checkpoint, or None), path (the run's
    directory) and error (None: fit() raises TrainingFailedError instead)."""

    def __init__(self, metrics, metrics_history, checkpoint, path, error=None):
        self.metrics = metrics
        self.metrics_history = metrics_history
        self.checkpoint = checkpoint
        self.path = path
        self.error = error

    @property
    def metrics_dataframe(self):
        try:
            import pandas
        except ImportError:
            raise ImportError("regroup.train: Result.metrics_dataframe needs pandas; "
                              "metrics_history has the same records") from None
        return pandas.DataFrame(self.metrics_history)

    def __repr__(self):
        return "Result(metrics=%r, checkpoint=%r, path=%r)" % (self.metrics, self.checkpoint,
                                                              self.path)


def in_worker():
    """Whether this process is a worker the regroup launcher started."""
    return "REGROUP_JOB_ID" in os.environ and "RANK" in os.environ


class TorchTrainer:
    """TorchTrainer(train_func, train_loop_config=None, scaling_config=None, run_config=None):
    train_func(config) (or train_func() when it takes no argument) runs on every worker."""

    def __init__(self, train_loop_per_worker, train_loop_config=None, scaling_config=None,
                 run_config=None):
        if not callable(train_loop_per_worker):
            raise TypeError("regroup.train: TorchTrainer's training function is a %s, not a "
                            "callable" % type(train_loop_per_worker).__name__)
        if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
            raise TypeError("regroup.train: scaling_config is a %s, not a ScalingConfig" %
                            type(scaling_config).__name__)
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError("regroup.train: run_config is a %s, not a RunConfig" %
                            type(run_config).__name__)
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()

    # ---- in a worker -------------------------------------------------------------------

    def _run_worker(self):
        run_dir = os.environ.get(_RUN_ENV) or self._run_dir(os.environ.get(
            "TORCHELASTIC_RUN_ID"))
        config = self.train_loop_config
        path = os.environ.get(_CONFIG_ENV)
        if path:
            with open(path, "rb") as f:
                config = pickle.load(f)
        os.makedirs(run_dir, exist_ok=True)
        if "REGROUP_CKPT_DIR" not in os.environ:
            os.environ["REGROUP_CKPT_DIR"] = os.path.join(run_dir, "checkpoints")
        rank = int(os.environ.get("RANK", "0"))
        code = 0
        s = None
        try:
            s = _session.Session(run_dir)
            fn = self.train_loop_per_worker
            if _takes_config(fn):
                fn(config)
            else:
                fn()
            s.finish()
        except (_session.Leave, _session.Finished):
            code = 0
        except BaseException:
            code = 1
            r = s.ctx.rank if s is not None and s.ctx._h is not None else rank
            _session.write_error(run_dir, r, "%s (node rank %s)" % (
                s.node if s else os.uname().nodename, os.environ.get("GROUP_RANK", "?")))
            import traceback
            traceback.print_exc()
        finally:
            if s is not None:
                try:
                    s.close()
                except BaseException as e:  # the exit status already says what happened
                    print("regroup.train: closing: %s" % e, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # a worker ends here: nothing after fit() runs in it

    # ---- in the driver -----------------------------------------------------------------

    def _run_dir(self, name=None):
        name = self.run_config.name or name or time.strftime("train_%Y-%m-%d_%H-%M-%S")
        return os.path.join(self.run_config.storage_path, name)

    def fit(self):
        """Runs the training function on the workers; returns a Result, or raises
        TrainingFailedError naming the worker that failed and carrying its traceback."""
        if in_worker():
            self._run_worker()
        sc, fc = self.scaling_config, self.run_config.failure_config
        if sc.use_gpu:
            import torch
            if not torch.cuda.is_available():
                raise ValueError("regroup.train: ScalingConfig(use_gpu=True), but this PyTorch "
                                 "has no CUDA device (torch.cuda.is_available() is False)")
        try:
            blob = pickle.dumps(self.train_loop_config)
        except Exception as e:
            raise TypeError("regroup.train: train_loop_config cannot be pickled for the "
                            "workers: %s" % e) from None
        script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        if not os.path.isfile(script):
            raise RuntimeError("regroup.train: fit() runs this program again in each worker, "
                               "but it has no script file (sys.argv[0] is %r): run it as "
                               "`python3 script.py`" % (sys.argv[0] if sys.argv else None))
        run_dir = self._run_dir()
        os.makedirs(run_dir, exist_ok=True)
        for old in glob.glob(os.path.join(run_dir, "errors", "*.json")):
            os.unlink(old)
        cfg_path = os.path.join(run_dir, "train_loop_config.pkl")
        with open(cfg_path + ".tmp", "wb") as f:
            f.write(blob)
        os.rename(cfg_path + ".tmp", cfg_path)
        env = dict(os.environ)
        env[_CONFIG_ENV] = cfg_path
        env[_RUN_ENV] = run_dir
        env.setdefault("REGROUP_CKPT_DIR", os.path.join(run_dir, "checkpoints"))
        env.setdefault("UCX_NET_DEVICES", "lo")
        env["REGROUP_LIBRARY"] = _lib.path()
        pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
            __file__))))
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        max_restarts = fc.max_failures if fc.max_failures >= 0 else 1000000
        cmd = [launcher(), "--standalone", "--nproc-per-node=%d" % sc.max_workers,
               "--max-restarts=%d" % max_restarts, "--recovery=%s" % fc.recovery]
        # The workers run this script again, so they import what it imported: the heavy
        # modules it has are imported once, by the launcher's fork server, instead of by each
        # worker at each start (REGROUP_PRELOAD, even empty, says otherwise).
        preload = [m for m in _PRELOADED if m in sys.modules] + ["regroup._preload"]
        if "REGROUP_PRELOAD" not in env:
            cmd.append("--preload=" + ",".join(preload))
        cmd += ["--no-python", sys.executable, script] + sys.argv[1:]
        p = subprocess.Popen(cmd, env=env)
        try:
            rc = p.wait()
        except BaseException:   # Ctrl-C, a signal: the launcher stops its workers
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            raise
        history = _metrics(run_dir)
        if rc != 0:
            raise _failure(run_dir, rc)
        ck_root = env["REGROUP_CKPT_DIR"]
        steps = _ckpt.committed(ck_root)
        ck = None
        if steps:
            ck = _ckpt.Checkpoint(path=_ckpt.step_dir(ck_root, steps[0]), step=steps[0],
                                  root=ck_root)
        last = history[-1]["metrics"] if history else {}
        # each record: what the report said, beside the step, the world size, the round and
        # the time it was made at (a metric of the same name wins)
        return Result(last, [dict({k: v for k, v in h.items() if k != "metrics"},
                                  **h["metrics"]) for h in history], ck, run_dir)


def _takes_config(fn):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return len(params) > 0


def _metrics(run_dir):
    out = []
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut by a rank 0 that died while writing it
    return out


def _failure(run_dir, rc):
    errs = []
    for path in glob.glob(os.path.join(run_dir, "errors", "*.json")):
        try:
            with open(path) as f:
                errs.append(json.load(f))
        except (OSError, ValueError):
            pass
    if not errs:
        return TrainingFailedError("regroup.train: the job failed (the launcher exited %d) "
                                   "with no training function's error: see its output above"
                                   % rc)
    first = min(errs, key=lambda e: e["time"])
    more = "" if len(errs) == 1 else " (and %d other worker error(s) after it)" % (
        len(errs) - 1)
    return TrainingFailedError(
        "regroup.train: the training function failed on rank %d, node %s, pid %d%s:\n%s" % (
            first["rank"], first["node"], first["pid"], more, first["traceback"]),
        rank=first["rank"], node=first["node"], traceback=first["traceback"])


def launcher():
    """The regroup command: $REGROUP_LAUNCHER, beside the library (a build tree: build/regroup;
    installed: <prefix>/bin/regroup), or on PATH."""
    env = os.environ.get("REGROUP_LAUNCHER")
    if env:
        return env
    lib = os.path.dirname(os.path.abspath(_lib.path()))
    tried = []
    for c in (os.path.join(lib, "regroup"), os.path.join(os.path.dirname(lib), "bin", "regroup")):
        if os.access(c, os.X_OK) and os.path.isfile(c):
            return c
        tried.append(c)
    import shutil
    found = shutil.which("regroup")
    if found:
        return found
    raise RuntimeError("regroup.train: the regroup launcher is not found (tried %s and PATH; "
                       "set REGROUP_LAUNCHER)" % ", ".join(tried))


__all__ = ["TorchTrainer", "Result", "TrainingFailedError", "ScalingConfig", "RunConfig",
           "FailureConfig"]
