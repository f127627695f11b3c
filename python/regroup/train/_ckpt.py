"""regroup.train.Checkpoint: a dict of tensors and values saved as one of libregroup's sharded,
compressed checkpoints (docs/checkpoint-format.md), and read back from one.

Saving: the dict is walked; every tensor becomes a named tensor of the checkpoint ("t0",
"t1", ..., flattened, in its own dtype, or as bytes for a dtype the format has not), the
rest (the dict's shape, numbers, strings) is pickled into a byte tensor "meta" taken from
rank 0. The tensors are the same on every rank (a DDP model and its optimizer are), so each
rank writes its share of each: every rank writes about 1/world_size of the bytes. Reading: the
meta first, then each tensor whole, by this process alone (no group needed): in a worker
after a restart, or in the program that called fit().
"""

import collections
import ctypes
import io
import os
import pickle

from .. import _lib
from .. import _status

_TensorRef = collections.namedtuple("_TensorRef", "index dtype shape raw")
_FORMAT = 1
# The dtypes the checkpoint format holds as themselves (include/regroup/dtype.h).
_NATIVE = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8")


class Checkpoint:
    """A checkpoint: Checkpoint.from_dict(d) to report one, ckpt.to_dict() to read it.

    From get_checkpoint() and Result.checkpoint: path is its directory (step-<N>), step the
    steps trained when it was reported."""

    def __init__(self, data=None, path=None, step=None, root=None):
        self._data = data
        self.path = path
        self.step = step
        self._root = root

    @classmethod
    def from_dict(cls, data):
        """A checkpoint of `data`: a dict (nested dicts, lists and tuples allowed) of CPU
        tensors and picklable values."""
        if not isinstance(data, dict):
            raise TypeError("regroup.train: Checkpoint.from_dict takes a dict, not a %s" %
                            type(data).__name__)
        return cls(data=data)

    def to_dict(self):
        """The dict reported (read from disk, once, for a checkpoint on disk). That of a
        node's leaving is the one reported before it ({} when none was)."""
        if self._data is None:
            if self._root is None:
                raise ValueError("regroup.train: this Checkpoint has neither data nor a path")
            self._data = unwrap(read(self._root, self.step)[0])[0] or {}
        return self._data

    def __repr__(self):
        return "Checkpoint(path=%r, step=%r)" % (self.path, self.step)


# A node's last checkpoint at a step that no report() saved (a preemption notice seen at a
# step boundary): the checkpoint reported before it (or None) and the state at the step
# (the prepared model's tensors and optimizer), which the session puts back over what the
# program loads from that checkpoint, as for a replacement.
_LEAVE_KEY = "__regroup_leave__"


def leave_data(reported, tensors, optimizer):
    """The data of a leaving node's checkpoint (see _LEAVE_KEY)."""
    return {_LEAVE_KEY: 1, "reported": reported, "tensors": list(tensors),
            "optimizer": optimizer}


def unwrap(data):
    """(the data reported, (tensors, optimizer state) to put back or None)."""
    if isinstance(data, dict) and data.get(_LEAVE_KEY) == 1:
        return data["reported"], (data["tensors"], data["optimizer"])
    return data, None


def _torch():
    import torch
    return torch


def flatten(data):
    """(skeleton, [flat tensors]): the dict with each tensor replaced by a _TensorRef."""
    torch = _torch()
    tensors = []

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.device.type != "cpu":
                raise TypeError("regroup.train: a checkpoint's tensor is on %s; this build "
                                "saves CPU tensors" % t.device)
            if t.numel() == 0:
                return t.clone()
            flat = t.reshape(-1)
            if not flat.is_contiguous():
                flat = flat.contiguous()
            dtype = str(t.dtype).replace("torch.", "")
            raw = dtype not in _NATIVE
            if raw:
                flat = flat.view(torch.uint8)
            tensors.append(flat)
            return _TensorRef(len(tensors) - 1, dtype, tuple(t.shape), raw)
        if isinstance(obj, dict):
            out = type(obj)() if type(obj) in (dict, collections.OrderedDict) else {}
            for k, v in obj.items():
                out[k] = walk(v)
            return out
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(walk(v) for v in obj)
        return obj

    skeleton = walk(data)
    return skeleton, tensors


def meta_bytes(skeleton, extra):
    try:
        return pickle.dumps({"format": _FORMAT, "data": skeleton, "extra": extra})
    except Exception as e:
        raise TypeError("regroup.train: a checkpoint's values must be picklable: %s" % e) \
            from None


def state(meta, tensors):
    """The {name: tensor} libregroup saves: the meta bytes and the flat tensors."""
    torch = _torch()
    out = {"meta": torch.frombuffer(bytearray(meta), dtype=torch.uint8)}
    for i, t in enumerate(tensors):
        out["t%d" % i] = t
    return out


def unflatten(skeleton, tensor):
    """The dict of skeleton, each _TensorRef replaced by tensor(ref)."""
    def walk(obj):
        if isinstance(obj, _TensorRef):
            return tensor(obj)
        if isinstance(obj, dict):
            out = type(obj)()
            for k, v in obj.items():
                out[k] = walk(v)
            return out
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(walk(v) for v in obj)
        return obj
    return walk(skeleton)


def _read_tensor(lib, reader, name, torch):
    info = _lib.CkptTensorInfo()
    _status.check(lib.rg_ckpt_reader_info(reader, name.encode(), ctypes.byref(info)),
                  "rg_ckpt_reader_info")
    from .. import _tensor
    dtype = None
    for k, v in _tensor._BY_NAME.items():
        if v == info.dtype:
            dtype = getattr(torch, k)
    if dtype is None:
        raise ValueError("regroup.train: checkpoint tensor %s has dtype code %d" % (
            name, info.dtype))
    rows = info.shape[0] if info.ndim > 0 else 1
    n = 1
    for i in range(info.ndim):
        n *= info.shape[i]
    out = torch.empty(n, dtype=dtype)
    req = _lib.CkptRequest(name.encode(), info.dtype, 0, rows, out.data_ptr(),
                           out.numel() * out.element_size())
    _status.check(lib.rg_ckpt_reader_read(reader, ctypes.byref(req)), "rg_ckpt_reader_read")
    return out


def read(root, step):
    """(data, extra) of committed checkpoint `step` under root, read by this process."""
    torch = _torch()
    lib = _lib.load()
    reader = ctypes.c_void_p()
    _status.check(lib.rg_ckpt_reader_open(root.encode(), int(step), ctypes.byref(reader)),
                  "rg_ckpt_reader_open")
    try:
        meta = pickle.loads(_read_tensor(lib, reader, "meta", torch).numpy().tobytes())
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise ValueError("regroup.train: %s step %d was not saved by regroup.train's "
                             "report" % (root, step))
        tensors = {}

        def load(ref):
            if ref.index not in tensors:
                t = _read_tensor(lib, reader, "t%d" % ref.index, torch)
                if ref.raw:
                    t = t.view(getattr(torch, ref.dtype))
                tensors[ref.index] = t.reshape(ref.shape)
            return tensors[ref.index]
        return unflatten(meta["data"], load), meta.get("extra") or {}
    finally:
        lib.rg_ckpt_reader_close(reader)


def committed(root):
    """The committed steps under root, newest first ([] when none or no such directory)."""
    if not root or not os.path.isdir(root):
        return []
    lib = _lib.load()
    steps = ctypes.POINTER(ctypes.c_int64)()
    n = ctypes.c_size_t()
    _status.check(lib.rg_ckpt_list(root.encode(), ctypes.byref(steps), ctypes.byref(n)),
                  "rg_ckpt_list")
    out = [steps[i] for i in range(n.value)]
    if steps:
        ctypes.CDLL(None).free(ctypes.cast(steps, ctypes.c_void_p))
    return out


def step_dir(root, step):
    return os.path.join(root, "step-%d" % step)


def dumps(obj):
    """torch.save of obj as bytes (the optimizer's state and the last checkpoint, sent to a
    replacement)."""
    buf = io.BytesIO()
    # (the format before torch 1.6: no zip archive, a fifth of the time, and torch.load
    # reads it as well)
    _torch().save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def loads(b):
    return _torch().load(io.BytesIO(b))
