"""regroup.GlobalSampler: libregroup's global sampler (include/regroup/data.h) as an iterable
of this rank's sample indices per step, for torch.utils.data.DataLoader or a plain loop."""

import ctypes
import os

from . import _lib
from . import _status
from ._train import Cursor, _Positioned


class GlobalSampler(_Positioned):
    """This rank's share of each global batch of a seeded permutation per epoch.

    Epoch e visits the num_samples indices in the order of a permutation that depends only on
    (seed, e); global step s covers its positions [s*B, (s+1)*B) (B = global_batch), and rank
    r of world_size takes a contiguous share of them. Iterating yields, for each remaining
    step of the current epoch, the list of this rank's indices, and moves `cursor` past that
    step: a `cursor` saved with a checkpoint (ctx.report(..., cursor=sampler)) and given back
    after a restart, at any world size (GlobalSampler(..., cursor=ctx.restore(...))), resumes
    with the next global step, so every sample of an epoch is used exactly once.

    rank and world_size default to the launcher's RANK and WORLD_SIZE (0 and 1 without).
    Use it as `DataLoader(ds, batch_sampler=sampler)` (each item a batch) or as
    `DataLoader(ds, sampler=sampler, batch_size=None)` with a dataset that takes a list of
    indices; in both, keep num_workers=0 so that no batch is fetched ahead of the step that
    uses it (`cursor` counts the steps handed out). A rank's share is empty at a step with
    fewer records than ranks (the short last step of an epoch, or world_size > global_batch):
    a DataLoader's default collate cannot batch none, so choose drop_last=True or sizes
    that avoid it, or iterate the sampler yourself.
    """

    def __init__(self, num_samples, global_batch, seed=0, rank=None, world_size=None,
                 drop_last=False, cursor=None):
        self._lib = _lib.load()
        self._h = None
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError("regroup: GlobalSampler: rank %d of world_size %d" % (
                rank, world_size))
        self.num_samples = int(num_samples)
        self.global_batch = int(global_batch)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        if self.num_samples < 1 or not 1 <= self.global_batch < 2 ** 32:
            raise ValueError("regroup: GlobalSampler: num_samples %d, global_batch %d" % (
                self.num_samples, self.global_batch))
        params = _lib.SamplerParams(self.num_samples, self.global_batch, self.drop_last)
        h = ctypes.c_void_p()
        _status.check(self._lib.rg_sampler_create(ctypes.byref(params), ctypes.byref(h)),
                      "rg_sampler_create")
        self._h = h
        self.steps_per_epoch = self._lib.rg_sampler_steps_per_epoch(h)
        self._max = (self.global_batch + self.world_size - 1) // self.world_size
        self._ids = (ctypes.c_uint32 * self._max)()
        self._cur = (cursor if cursor is not None else Cursor.start(seed))._c()
        self._check_cursor()
        self.global_count = 0

    def reshard(self, rank, world_size, cursor=None):
        """Takes rank of world_size's share from now on (after ctx.regroup()), at `cursor`
        when given."""
        rank, world_size = int(rank), int(world_size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError("regroup: GlobalSampler: rank %d of world_size %d" % (
                rank, world_size))
        self.rank = rank
        self.world_size = world_size
        self._max = (self.global_batch + self.world_size - 1) // self.world_size
        self._ids = (ctypes.c_uint32 * self._max)()
        if cursor is not None:
            self.cursor = cursor

    def _check_cursor(self):
        if self._cur.step >= self.steps_per_epoch:
            raise ValueError("regroup: GlobalSampler: cursor step %d, but an epoch has %d "
                             "steps (another batch size or dataset?)" % (
                                 self._cur.step, self.steps_per_epoch))

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h is not None:
            self._lib.rg_sampler_destroy(h)

    @property
    def cursor(self):
        """The position after the last step handed out: save it with a checkpoint."""
        return Cursor._from_c(self._cur)

    @cursor.setter
    def cursor(self, c):
        self._cur = Cursor(*c)._c()
        self._check_cursor()

    @property
    def epoch(self):
        return self._cur.epoch

    @property
    def step(self):
        """The next global step of the current epoch."""
        return self._cur.step

    def ids(self, cursor=None):
        """This rank's indices at `cursor` (default: the current position), without moving."""
        c = self._cur if cursor is None else Cursor(*cursor)._c()
        n = ctypes.c_size_t()
        _status.check(self._lib.rg_sampler_ids(self._h, ctypes.byref(c), self.rank,
                                               self.world_size, self._ids, self._max,
                                               ctypes.byref(n)), "rg_sampler_ids")
        return self._ids[:n.value]

    def next_step(self):
        """This rank's indices of the current step; then moves the cursor to the next one
        (the next epoch's first after the last). Sets global_count, the global batch's size
        at that step (the loss of a step is averaged over it)."""
        out = self.ids()
        self.global_count = self._lib.rg_sampler_global_count(self._h, ctypes.byref(self._cur))
        self._lib.rg_sampler_advance(self._h, ctypes.byref(self._cur))
        return out

    def __len__(self):
        """The steps left in the current epoch."""
        return self.steps_per_epoch - self._cur.step

    def __iter__(self):
        epoch = self._cur.epoch
        while self._cur.epoch == epoch:
            yield self.next_step()


def permutation(seed, epoch, n):
    """Epoch's permutation of range(n) for seed, as libregroup computes it (a list)."""
    lib = _lib.load()
    arr = (ctypes.c_uint32 * n)()
    lib.rg_sampler_permutation(int(seed), int(epoch), arr, n)
    return arr[:]
