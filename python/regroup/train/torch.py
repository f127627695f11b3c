"""regroup.train.torch: PyTorch on regroup, with Ray Train's names.

    model = prepare_model(Net())                              # DDP
    opt = prepare_optimizer(torch.optim.Adam(model.parameters()))
    loader = prepare_data_loader(DataLoader(ds, batch_size=64, shuffle=True))

prepare_model wraps the model in DistributedDataParallel; prepare_optimizer makes its step()
the step boundary where the gradients are summed over the job's UCX group and where, in
place, a step that a failure broke is discarded and the job regroups below the loop;
prepare_data_loader replaces the loader's sampler with the global exactly-once sampler
(regroup.GlobalSampler: a seeded permutation per epoch, a global batch of batch_size x the
job's largest world size, each rank's share of it), whose position is part of the state.
"""

import os
import warnings

import torch
import torch.nn as nn

from .. import _c10d
from .._sampler import GlobalSampler
from . import _session

__all__ = ["prepare_model", "prepare_optimizer", "prepare_data_loader", "get_device"]


def get_device():
    """The device a worker trains on: the CPU (this build serves CPU tensors)."""
    return torch.device("cpu")


def prepare_model(model, move_to_device=True, ddp_kwargs=None):
    """model wrapped in torch.nn.parallel.DistributedDataParallel (model.module is yours).

    Every rank starts with rank 0's parameters and buffers (a replacement in place: the
    survivors'). Training through a prepared optimizer (prepare_optimizer) is what makes
    failures recoverable in place; without one, the gradients are averaged in backward as DDP
    does, and a failure raises."""
    s = _session.get()
    if not isinstance(model, nn.Module):
        raise TypeError("regroup.train: prepare_model takes a torch.nn.Module, not a %s" %
                        type(model).__name__)
    if s.model is not None:
        raise ValueError("regroup.train: prepare_model was called already in this worker "
                         "(one model per training function)")
    # move_to_device is Ray Train's argument: the device here is the CPU (get_device()), so
    # a model elsewhere is refused rather than moved.
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type != "cpu":
            raise ValueError("regroup.train: prepare_model: %s is on %s: this build serves "
                             "CPU tensors only" % (name, t.device))
    kw = dict(ddp_kwargs or {})
    for k in ("process_group", "device_ids", "output_device"):
        if k in kw:
            raise ValueError("regroup.train: prepare_model: ddp_kwargs[%r] is set by regroup" %
                             k)
    kw.setdefault("broadcast_buffers", False)  # rank 0's go at each step boundary instead
    s.module = model

    def from_rank_0():   # every rank starts from rank 0's values
        # (not a replacement that received the live state of a member: that state goes back
        # over its model at its first iteration, and the members are training)
        if s.joined and s.ctx.world_size > 1 and not s.received_live:
            for t in s.state_tensors():
                s.ctx.broadcast(t, root=0)
    s.redo_on_regroup(from_rank_0)
    # Over a group of one rank: building DDP exchanges nothing (a replacement builds its
    # model while the others train), and its reducer leaves the gradients local.
    ddp = nn.parallel.DistributedDataParallel(model, process_group=_c10d.local_group(), **kw)
    ddp.register_comm_hook(s, _comm_hook)
    s.model = ddp
    s.module = model
    return ddp


def _comm_hook(s, bucket):
    """Without a prepared optimizer the bucket is averaged here, as DDP's own hook does;
    with one, the optimizer's step sums the gradients (and can discard the step)."""
    t = bucket.buffer()
    if s.optimizer is None:
        if s.in_place:
            raise RuntimeError("regroup.train: recovery in place needs the optimizer prepared: "
                               "opt = regroup.train.torch.prepare_optimizer(opt)")
        if not s.joined:
            s.join()
        if s.ctx.world_size > 1:
            s.ctx.allreduce(t, op="avg")
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


class _PreparedOptimizer(torch.optim.Optimizer):
    """The optimizer, whose step() is the step boundary (see regroup.train.torch)."""

    def __init__(self, inner, session):
        # Not Optimizer.__init__: this wraps inner and shares its state and groups.
        self._inner = inner
        self._session = session
        self.defaults = inner.defaults

    @property
    def param_groups(self):
        return self._inner.param_groups

    @param_groups.setter
    def param_groups(self, v):
        self._inner.param_groups = v

    @property
    def state(self):
        return self._inner.state

    def state_dict(self):
        return self._inner.state_dict()

    def load_state_dict(self, sd):
        self._inner.load_state_dict(sd)

    def zero_grad(self, set_to_none=False):
        self._inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, group):
        self._inner.add_param_group(group)

    def _params(self):
        return [p for g in self._inner.param_groups for p in g["params"]]

    def step(self, closure=None):
        """Sums the gradients over the group and steps; in place, a step a failure broke is
        not taken on any rank (the job regroups, and the loader replays the global batch).
        Returns the inner step's value, or None for a discarded step."""
        if closure is not None:
            raise ValueError("regroup.train: a prepared optimizer's step takes no closure")
        s = self._session
        if not s.reduce(self._params()):
            return None
        out = self._inner.step()
        s.commit()
        return out

    def __repr__(self):
        return "Prepared(%r)" % (self._inner,)


def prepare_optimizer(optimizer):
    """optimizer, prepared: call its step() as usual, once per batch of the prepared
    loader. The loss is taken to be a mean over the batch, as DDP does: each rank's gradient
    is weighted by its share of the global batch, so the update is the global batch's mean at
    any world size."""
    s = _session.get()
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("regroup.train: prepare_optimizer takes a torch.optim.Optimizer, not "
                        "a %s" % type(optimizer).__name__)
    if s.optimizer is not None:
        raise ValueError("regroup.train: prepare_optimizer was called already in this worker")
    s.optimizer = optimizer
    return _PreparedOptimizer(optimizer, s)


class _Loader:
    """A prepared loader: the dataset's batches of this rank's share of each global batch."""

    def __init__(self, loader, session, global_batch_size, seed):
        self.dataset = loader.dataset
        self.collate_fn = loader.collate_fn
        self.batch_size = loader.batch_size
        self._session = session
        ctx = session.ctx
        maxw = int(os.environ.get("REGROUP_MAX_WORLD_SIZE", "0")) or ctx.world_size
        gb = global_batch_size if global_batch_size is not None else loader.batch_size * maxw
        rank, world = (ctx.rank, ctx.world_size) if session.joined else (0, 1)
        self.sampler = GlobalSampler(len(self.dataset), gb, seed=seed, rank=rank,
                                     world_size=world, drop_last=loader.drop_last)
        self.global_batch_size = gb
        self.epoch = 0
        self.local_count = 0
        self.global_count = 0

    def restore(self, extra, cursor):
        if cursor is not None:
            self.sampler.cursor = cursor
        self.epoch = int(extra.get("loader_epoch", self.sampler.epoch))

    def __len__(self):
        return self.sampler.steps_per_epoch

    def __iter__(self):
        s = self._session
        s.before_iter()
        e = self.epoch
        while self.sampler.epoch == e:
            ids = self.sampler.next_step()
            self.local_count = len(ids)
            self.global_count = self.sampler.global_count
            if not ids:
                raise ValueError("regroup.train: rank %d has no sample at step %d of epoch %d "
                                 "(a global batch of %d over %d ranks, %d left in the epoch): "
                                 "use drop_last=True or a larger batch" % (
                                     s.ctx.rank, self.sampler.step, e, self.global_batch_size,
                                     s.ctx.world_size, self.global_count))
            yield self.collate_fn([self.dataset[i] for i in ids])
        self.epoch = e + 1


def prepare_data_loader(data_loader, global_batch_size=None, seed=0):
    """data_loader's dataset and collate function, with the global exactly-once sampler:
    each epoch a permutation seeded by (seed, epoch); each step a global batch of
    global_batch_size (default: the loader's batch_size x the job's largest world size, so
    that a worker's batch is batch_size at full size), this rank's share of it. Its position
    is saved with report()'s checkpoints and, in place, kept through regroups: every sample
    of an epoch is used exactly once at any world size and history of failures. Batches are
    made in the worker's own thread (the loader's num_workers is not used: no batch is
    fetched ahead of the step that uses it)."""
    s = _session.get()
    if not isinstance(data_loader, torch.utils.data.DataLoader):
        raise TypeError("regroup.train: prepare_data_loader takes a torch DataLoader, not a %s"
                        % type(data_loader).__name__)
    if data_loader.batch_size is None:
        raise ValueError("regroup.train: prepare_data_loader needs a DataLoader with a "
                         "batch_size (not a batch_sampler)")
    if s.loader is not None:
        raise ValueError("regroup.train: prepare_data_loader was called already in this worker")
    if data_loader.num_workers:
        warnings.warn("regroup.train: prepare_data_loader makes batches in the worker's thread; "
                      "num_workers=%d is not used" % data_loader.num_workers)
    ld = _Loader(data_loader, s, global_batch_size, seed)
    s.loader = ld
    if s.cursor is not None:
        ld.sampler.cursor = s.cursor
    else:
        s.start_cursor(ld.sampler.cursor)
    if s.pending_extra is not None:
        ld.restore(s.pending_extra, s.cursor)
    return ld
