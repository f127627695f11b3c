"""libregroup.so through ctypes: finding it, the structs it takes, the functions' prototypes.

The structs below mirror include/regroup/*.h field by field; load() checks each one against
the library's own rg_abi_struct_layout() and refuses a library whose layout differs.
"""

import ctypes
import os
import threading

from . import _status

# The SONAME's version (major.minor while 0.x): the one library this package is written for.
SONAME = "libregroup.so.0.1"

# ---- the public structs --------------------------------------------------------------------

RG_CKPT_MAX_DIMS = 8
RG_TRAIN_MAX_METRICS = 32
RG_CKPT_REPLICATED = 0x4


class DataCursor(ctypes.Structure):
    _fields_ = [("seed", ctypes.c_uint64), ("epoch", ctypes.c_uint64),
                ("step", ctypes.c_uint64)]


class SamplerParams(ctypes.Structure):
    _fields_ = [("num_samples", ctypes.c_uint64), ("batch_size", ctypes.c_uint32),
                ("drop_last", ctypes.c_bool)]


class CkptTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_uint64 * RG_CKPT_MAX_DIMS), ("row_begin", ctypes.c_uint64),
                ("row_count", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("flags", ctypes.c_uint)]


class CkptRequest(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("row_begin", ctypes.c_uint64), ("row_count", ctypes.c_uint64),
                ("dst", ctypes.c_void_p), ("dst_bytes", ctypes.c_size_t)]


class CkptTensorInfo(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_uint64 * RG_CKPT_MAX_DIMS), ("replicated", ctypes.c_bool)]


class Metric(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class Report(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("epoch", ctypes.c_int64),
                ("metrics", ctypes.POINTER(Metric)), ("n_metrics", ctypes.c_size_t)]


class TrainState(ctypes.Structure):
    _fields_ = [("tensors", ctypes.POINTER(CkptTensor)), ("n_tensors", ctypes.c_size_t),
                ("cursor", DataCursor)]


class TrainParams(ctypes.Structure):
    _fields_ = [("ckpt_root", ctypes.c_char_p), ("keep_last", ctypes.c_uint),
                ("comm_timeout_ms", ctypes.c_int64), ("staging_bytes", ctypes.c_size_t),
                ("in_place", ctypes.c_bool)]


class TrainBuf(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("bytes", ctypes.c_size_t)]


# rg_train_extra_fn_t: int (*)(void *arg, const void **data, size_t *bytes)
TrainExtraFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_size_t))


class TrainRegroup(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("bufs", ctypes.POINTER(TrainBuf)),
                ("n_bufs", ctypes.c_size_t), ("cursor", DataCursor),
                ("table", ctypes.c_void_p), ("extra_fn", TrainExtraFn),
                ("extra_arg", ctypes.c_void_p), ("rank", ctypes.c_int),
                ("world", ctypes.c_int), ("round", ctypes.c_int),
                ("step_out", ctypes.c_int64), ("source", ctypes.c_int),
                ("received", ctypes.c_bool), ("n_received", ctypes.c_int),
                ("extra", ctypes.c_void_p), ("extra_bytes", ctypes.c_size_t)]


class Notice(ctypes.Structure):
    _fields_ = [("kinds", ctypes.c_uint), ("own", ctypes.c_uint), ("ms_left", ctypes.c_int64)]


RG_NOTICE_PREEMPT = 1
RG_NOTICE_MEMBERS = 2


class CommOpts(ctypes.Structure):
    _fields_ = [("deadline", ctypes.c_uint64), ("mem_type", ctypes.c_int)]


# The C typedef each mirror stands for, as rg_abi_struct_layout() names it.
STRUCTS = {
    "rg_data_cursor_t": DataCursor,
    "rg_sampler_params_t": SamplerParams,
    "rg_ckpt_tensor_t": CkptTensor,
    "rg_ckpt_request_t": CkptRequest,
    "rg_ckpt_tensor_info_t": CkptTensorInfo,
    "rg_metric_t": Metric,
    "rg_report_t": Report,
    "rg_train_state_t": TrainState,
    "rg_train_params_t": TrainParams,
    "rg_train_buf_t": TrainBuf,
    "rg_train_regroup_t": TrainRegroup,
    "rg_notice_t": Notice,
    "rg_comm_opts_t": CommOpts,
}

RG_MEM_HOST = 0
RG_MEM_CUDA = 1

c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_P = ctypes.c_void_p
_st = ctypes.c_int  # rg_status_t

# name: (restype, argtypes)
_PROTOTYPES = {
    "rg_status_name": (ctypes.c_char_p, [_st]),
    "rg_status_str": (ctypes.c_char_p, [_st]),
    "rg_last_error": (ctypes.c_char_p, []),
    "rg_now_ns": (ctypes.c_uint64, []),
    "rg_abi_struct_layout": (_st, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                                   ctypes.POINTER(ctypes.c_size_t),
                                   ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]),
    # train.h
    "rg_train_init": (_st, [ctypes.POINTER(TrainParams), c_void_pp]),
    "rg_train_finalize": (None, [_P]),
    "rg_train_rank": (ctypes.c_int, [_P]),
    "rg_train_world_size": (ctypes.c_int, [_P]),
    "rg_train_local_rank": (ctypes.c_int, [_P]),
    "rg_train_local_size": (ctypes.c_int, [_P]),
    "rg_train_round": (ctypes.c_int, [_P]),
    "rg_train_restart_count": (ctypes.c_int, [_P]),
    "rg_train_comm": (_P, [_P]),
    "rg_train_ckpt_root": (ctypes.c_char_p, [_P]),
    "rg_report": (_st, [_P, ctypes.POINTER(Report), ctypes.POINTER(TrainState)]),
    "rg_get_checkpoint": (_st, [_P, ctypes.POINTER(ctypes.c_int64)]),
    "rg_train_restore": (_st, [_P, ctypes.c_int64, ctypes.POINTER(CkptRequest), ctypes.c_size_t,
                               ctypes.POINTER(DataCursor), ctypes.POINTER(ctypes.c_int64)]),
    "rg_train_in_place": (ctypes.c_bool, [_P]),
    "rg_train_joining": (ctypes.c_bool, [_P]),
    "rg_train_regroup": (_st, [_P, ctypes.POINTER(TrainRegroup)]),
    "rg_train_table_create": (_st, [_P, ctypes.c_uint64, ctypes.c_size_t, c_void_pp]),
    "rg_train_table_destroy": (None, [_P]),
    "rg_train_table_rows": (_P, [_P, ctypes.POINTER(ctypes.c_uint64),
                                 ctypes.POINTER(ctypes.c_uint64)]),
    "rg_train_table_n_rows": (ctypes.c_uint64, [_P]),
    "rg_train_table_row_bytes": (ctypes.c_size_t, [_P]),
    "rg_train_table_commit": (_st, [_P, _P, ctypes.c_int64]),
    "rg_train_notice": (_st, [_P, ctypes.POINTER(Notice)]),
    "rg_train_leave": (_st, [_P, ctypes.POINTER(Report), ctypes.POINTER(TrainState)]),
    "rg_train_ckpt_wait": (_st, [_P]),
    # comm.h
    "rg_comm_rank": (ctypes.c_int, [_P]),
    "rg_comm_size": (ctypes.c_int, [_P]),
    "rg_comm_is_healthy": (ctypes.c_bool, [_P]),
    "rg_comm_failed_rank": (ctypes.c_int, [_P]),
    "rg_comm_barrier": (_st, [_P, ctypes.POINTER(CommOpts)]),
    "rg_comm_broadcast": (_st, [_P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                ctypes.POINTER(CommOpts)]),
    "rg_comm_allreduce": (_st, [_P, _P, _P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                ctypes.POINTER(CommOpts)]),
    "rg_comm_allgather": (_st, [_P, _P, _P, ctypes.c_size_t, ctypes.c_int,
                                ctypes.POINTER(CommOpts)]),
    # ckpt.h: reading a committed checkpoint (this process alone)
    "rg_ckpt_list": (_st, [ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                           ctypes.POINTER(ctypes.c_size_t)]),
    "rg_ckpt_reader_open": (_st, [ctypes.c_char_p, ctypes.c_int64, c_void_pp]),
    "rg_ckpt_reader_close": (None, [_P]),
    "rg_ckpt_reader_info": (_st, [_P, ctypes.c_char_p, ctypes.POINTER(CkptTensorInfo)]),
    "rg_ckpt_reader_read": (_st, [_P, ctypes.POINTER(CkptRequest)]),
    # data.h
    "rg_data_cursor_start": (DataCursor, [ctypes.c_uint64]),
    "rg_sampler_create": (_st, [ctypes.POINTER(SamplerParams), c_void_pp]),
    "rg_sampler_destroy": (None, [_P]),
    "rg_sampler_steps_per_epoch": (ctypes.c_uint64, [_P]),
    "rg_sampler_global_count": (ctypes.c_uint32, [_P, ctypes.POINTER(DataCursor)]),
    "rg_sampler_share": (None, [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                ctypes.POINTER(ctypes.c_uint32),
                                ctypes.POINTER(ctypes.c_uint32)]),
    "rg_sampler_ids": (_st, [_P, ctypes.POINTER(DataCursor), ctypes.c_uint32, ctypes.c_uint32,
                             ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_size_t)]),
    "rg_sampler_advance": (None, [_P, ctypes.POINTER(DataCursor)]),
    "rg_sampler_permutation": (None, [ctypes.c_uint64, ctypes.c_uint64,
                                      ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t]),
}


class LayoutError(ImportError):
    """A struct mirrored here differs from the loaded library's."""


def check_layout(lib, cname, mirror):
    """Compares the ctypes mirror of struct `cname` with the library's own layout."""
    size = ctypes.c_size_t()
    n = ctypes.c_size_t()
    offsets = (ctypes.c_size_t * 32)()
    sizes = (ctypes.c_size_t * 32)()
    st = lib.rg_abi_struct_layout(cname.encode(), ctypes.byref(size), offsets, sizes, 32,
                                  ctypes.byref(n))
    if st != 0:
        raise LayoutError("%s: rg_abi_struct_layout: %s: %s" % (
            cname, lib.rg_status_name(st).decode(), lib.rg_last_error().decode()))
    names = [f[0] for f in mirror._fields_]
    mine = [(getattr(mirror, f).offset, getattr(mirror, f).size) for f in names]
    theirs = list(zip(offsets[:n.value], sizes[:n.value]))
    if ctypes.sizeof(mirror) != size.value or mine != theirs:
        raise LayoutError(
            "%s: the Python mirror (size %d, (offset, size) %s of fields %s) differs from the "
            "library's (size %d, %s)" % (cname, ctypes.sizeof(mirror), mine, names,
                                         size.value, theirs))


def _candidates():
    """The paths tried, in order: $REGROUP_LIBRARY, next to the package, the loader's path."""
    out = []
    env = os.environ.get("REGROUP_LIBRARY")
    if env:
        out.append(("REGROUP_LIBRARY", env))
    here = os.path.dirname(os.path.abspath(__file__))
    try:  # installed by cmake --install: the library's directory, recorded then
        from ._libdir import LIBDIR
        out.append(("next to the package", os.path.join(LIBDIR, SONAME)))
    except ImportError:
        pass
    # Installed: <libdir>/python3/dist-packages/regroup/ beside <libdir>/libregroup.so;
    # in a build tree or a wheel: the library inside or just above the package.
    for d in (here, os.path.dirname(here), os.path.dirname(os.path.dirname(here)),
              os.path.dirname(os.path.dirname(os.path.dirname(here)))):
        out.append(("next to the package", os.path.join(d, SONAME)))
    out.append(("the system loader path", SONAME))
    return out


_lock = threading.Lock()
_lib = None
_lib_path = None


def load():
    """The loaded library (loaded and checked once per process)."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        lib = None
        for where, path in _candidates():
            if where == "REGROUP_LIBRARY" or where == "the system loader path" or \
                    os.path.exists(path):
                try:
                    lib = ctypes.CDLL(path)
                    _lib_path = path
                    break
                except OSError as e:
                    tried.append("%s (%s): %s" % (path, where, e))
                    if where == "REGROUP_LIBRARY":
                        # An explicit choice that fails is not replaced by another library.
                        break
            else:
                tried.append("%s (%s): no such file" % (path, where))
        if lib is None:
            raise ImportError("regroup: cannot load %s; tried: %s" % (SONAME, "; ".join(tried)))
        missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
        if missing:
            raise ImportError("regroup: %s does not export %s" % (_lib_path, ", ".join(missing)))
        for cname, mirror in STRUCTS.items():
            try:
                check_layout(lib, cname, mirror)
            except LayoutError as e:
                raise LayoutError("regroup: %s: %s" % (_lib_path, e)) from None
        _status.bind(lib)
        _lib = lib
        return lib


def path():
    """The path the library was loaded from (after load())."""
    load()
    return _lib_path
