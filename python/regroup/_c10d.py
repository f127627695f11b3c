"""torch.distributed's "regroup" backend: the C++ extension _regroup_c10d (c10d/), registered
with torch.distributed when this module is imported (regroup.distributed does).

The extension is found at $REGROUP_C10D, in this package's directory (where cmake --install
puts it), or next to the libregroup.so the package loaded (a build tree). Its process groups
are views of a worker context's UCX group for one round: the backend's creation function
takes the context regroup.train set up, or makes one (regroup.init()) for a program that
calls init_process_group("regroup") itself.
"""

import importlib.machinery
import importlib.util
import os
import threading

from . import _lib

NAME = "regroup"
_FILE = "_regroup_c10d.so"
_lock = threading.Lock()
_ext = None
_ctx = None          # the Context the backend's groups use
_own_ctx = False     # made by the backend itself (closed at exit)


def _candidates():
    out = []
    env = os.environ.get("REGROUP_C10D")
    if env:
        out.append(("REGROUP_C10D", env))
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(("in the package", os.path.join(here, _FILE)))
    lib = _lib.path()
    if lib:
        out.append(("next to " + lib, os.path.join(os.path.dirname(lib), _FILE)))
    return out


def extension():
    """The extension module (loading it, and libregroup first, if not yet). Raises ImportError
    naming every path tried when none loads."""
    global _ext
    with _lock:
        if _ext is not None:
            return _ext
        _lib.load()
        import torch.distributed  # noqa: F401 (the extension's base class lives there)
        tried = []
        for where, path in _candidates():
            if not os.path.exists(path):
                tried.append("%s (%s): no such file" % (path, where))
                continue
            loader = importlib.machinery.ExtensionFileLoader("_regroup_c10d", path)
            spec = importlib.util.spec_from_file_location("_regroup_c10d", path, loader=loader)
            try:
                mod = importlib.util.module_from_spec(spec)
                loader.exec_module(mod)
            except ImportError as e:
                tried.append("%s (%s): %s" % (path, where, e))
                continue
            _ext = mod
            return mod
        raise ImportError("regroup: the torch.distributed backend (%s) is not found; tried: %s "
                          "(built when the build finds PyTorch and its headers: Debian's "
                          "python3-torch and libtorch-dev)" % (_FILE, "; ".join(tried)))


def set_context(ctx):
    """The Context whose group the backend's process groups use (regroup.train's)."""
    global _ctx, _own_ctx
    _ctx, _own_ctx = ctx, False


def context():
    """The backend's Context: the one set, else one made now from the launcher's
    environment (regroup.init(), in restart mode: a plain torch.distributed program has no
    regroup code)."""
    global _ctx, _own_ctx
    if _ctx is None or _ctx._h is None:
        from ._train import init
        import atexit
        _ctx, _own_ctx = init(), True
        atexit.register(_close_own)
    return _ctx


def _close_own():
    global _ctx
    if _own_ctx and _ctx is not None:
        _ctx.close()
        _ctx = None


def group(ctx):
    """A process group over ctx's group of its current round."""
    return extension().ProcessGroupRegroup(ctx._h.value, ctx.rank, ctx.world_size, ctx.round)


def local_group():
    """A process group of one rank that exchanges nothing (DDP is built over one)."""
    return extension().ProcessGroupRegroup(0, 0, 1, 0)


def _create(store, rank, world_size, timeout):
    ctx = context()
    if rank != ctx.rank or world_size != ctx.world_size:
        raise ValueError("regroup backend: init_process_group asked for rank %d of %d, but "
                         "the launcher made this worker rank %d of %d (leave rank and "
                         "world_size out: they come from the launcher)" % (
                             rank, world_size, ctx.rank, ctx.world_size))
    return group(ctx)


def round_store(ctx):
    """A torch.distributed Store for init_process_group over ctx's round: the regroup backend
    needs none (its wire-up went through etcd), but torch's init ends with a store-based
    barrier, which this store passes at once: every rank of the round's group is connected
    before the group is made (the wire-up heard from each), so there is nothing to wait for
    (before, it ran the group's own barrier: after a regroup, one more wait for the slowest
    rank). Other keys are kept in this process."""
    import torch.distributed as dist

    class RoundStore(dist.Store):
        def __init__(self):
            super().__init__()
            self._d = {}

        def set(self, key, value):
            self._d[key] = value

        def get(self, key):
            if key not in self._d:
                raise KeyError("regroup: the round's store holds no %r (the regroup backend "
                               "keeps nothing there for other ranks)" % key)
            return self._d[key]

        def add(self, key, n):
            if key.startswith("store_based_barrier_key"):
                return ctx.world_size
            v = int(self._d.get(key, 0)) + int(n)
            self._d[key] = str(v).encode()
            return v

        def wait(self, keys, timeout=None):
            missing = [k for k in keys if k not in self._d]
            if missing:
                raise KeyError("regroup: the round's store holds no %s" % ", ".join(missing))

        def check(self, keys):
            return all(k in self._d for k in keys)

        def num_keys(self):
            return len(self._d)

        def delete_key(self, key):
            return self._d.pop(key, None) is not None

    return RoundStore()


def register():
    """Registers the backend with torch.distributed as "regroup" (once)."""
    import torch.distributed as dist
    extension()
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create)
