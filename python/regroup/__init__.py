"""regroup's worker API for Python programs: a thin layer over libregroup.so (ctypes).

    import regroup
    with regroup.init() as ctx:                  # from the launcher's environment
        sampler = regroup.GlobalSampler(len(ds), 64, seed=1)
        step = ctx.latest_checkpoint()
        if step is not None:
            sampler.cursor = ctx.restore(step, {"params": flat})
        for ids in sampler:
            ...                                   # gradients into `grads`
            ctx.allreduce(grads, op="sum")
            try:
                ctx.report(step, metrics={"loss": l}, state={"params": flat}, cursor=sampler)
            except regroup.MembershipChanged as e:
                if not e.notice.preempt:
                    raise
                ctx.leave(step, cursor=sampler)   # a node leaves: its last checkpoint
                break                             # exit 0; the job resumes from `step`

Tensors are NumPy arrays or PyTorch CPU tensors, contiguous, of dtype float32, float64,
float16, bfloat16, int32, int64 or uint8, passed to the library by address (never copied).
The library is found at $REGROUP_LIBRARY, next to this package, or on the loader's path.
"""

from ._lib import LayoutError, SONAME
from ._sampler import GlobalSampler, permutation
from ._status import Error, MembershipChanged, PeerError
from ._train import Context, Cursor, Notice, Regrouped, Table, init

__version__ = "0.1.0"

__all__ = ["init", "Context", "Cursor", "Notice", "Regrouped", "Table", "GlobalSampler",
           "permutation", "Error", "PeerError", "MembershipChanged", "LayoutError", "library_path", "SONAME"]


def library_path():
    """The path libregroup was loaded from (loading it if not yet)."""
    from . import _lib
    return _lib.path()
