"""Imported once by the launcher's fork server when fit() starts the workers (its --preload
list): what every worker of regroup.train loads at its start, loaded before the fork instead.
libregroup and its UCX libraries, regroup.train, and with torch imported regroup.train.torch
and the torch.distributed backend's extension: a worker forked from the server (the first
ones, a replacement in place, a restarted one) finds them loaded. Loading starts no thread
and makes no UCX context (each worker makes its own in regroup.init), so the fork is safe;
the fork server says its thread count when it is ready."""

import sys

from . import _lib

_lib.load()
from . import train  # noqa: E402,F401

if "torch" in sys.modules:
    from . import _c10d
    from .train import torch as _train_torch  # noqa: F401
    try:
        _c10d.extension()
    except ImportError:
        pass   # (a build without it: a worker that needs it says so, as it would unpreloaded)
