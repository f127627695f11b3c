"""What regroup needs to know of a tensor: its address, element count, dtype and shape.

NumPy arrays and PyTorch tensors are read through their own attributes (neither library is
imported here: a tensor's type tells which one it comes from), never copied. A tensor must be
contiguous in row-major order and of one of libregroup's element types.
"""

import ctypes
import sys

_c_char = ctypes.c_char

RG_DTYPE_F32 = 1
RG_DTYPE_F64 = 2
RG_DTYPE_F16 = 3
RG_DTYPE_BF16 = 4
RG_DTYPE_I32 = 5
RG_DTYPE_I64 = 6
RG_DTYPE_U8 = 7

DTYPE_SIZES = {RG_DTYPE_F32: 4, RG_DTYPE_F64: 8, RG_DTYPE_F16: 2, RG_DTYPE_BF16: 2,
               RG_DTYPE_I32: 4, RG_DTYPE_I64: 8, RG_DTYPE_U8: 1}
FLOAT_DTYPES = (RG_DTYPE_F32, RG_DTYPE_F64, RG_DTYPE_F16, RG_DTYPE_BF16)

# By the dtype's name, the same in NumPy (bfloat16 only where an extension defines it) and
# in PyTorch ("torch.float32" without its prefix).
_BY_NAME = {"float32": RG_DTYPE_F32, "float64": RG_DTYPE_F64, "float16": RG_DTYPE_F16,
            "bfloat16": RG_DTYPE_BF16, "int32": RG_DTYPE_I32, "int64": RG_DTYPE_I64,
            "uint8": RG_DTYPE_U8}
SUPPORTED = ", ".join(_BY_NAME)


class Tensor:
    """A view of a caller's tensor: ptr, count (elements), dtype (rg_dtype_t), shape, cuda."""

    __slots__ = ("ptr", "count", "dtype", "shape", "cuda", "nbytes", "obj")

    def __init__(self, obj, ptr, count, dtype, shape, cuda):
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.shape = shape
        self.cuda = cuda
        self.nbytes = count * DTYPE_SIZES[dtype]


_np_codes = {}      # {numpy.dtype: rg_dtype_t}, filled at the first NumPy array
_torch_codes = {}   # {torch.dtype: rg_dtype_t}, filled at the first PyTorch tensor


def _dtype(name, what):
    code = _BY_NAME.get(name)
    if code is None:
        raise TypeError("regroup: %s has dtype %s, which libregroup lacks (it has %s)" % (
            what, name, SUPPORTED))
    return code


def describe(obj, what="tensor", writable=False):
    """The Tensor view of a NumPy array or a PyTorch tensor; TypeError or ValueError naming
    what is wrong (the type, the dtype, non-contiguity, a read-only array). Called on every
    collective, so the usual case takes a few attribute reads and dictionary look-ups."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        code = _np_codes.get(obj.dtype)
        flags = obj.flags
        if code is None or not flags.c_contiguous or (writable and not flags.writeable):
            code = _numpy_slow(np, obj, what, writable)
        if flags.writeable and obj.size > 0:
            ptr = ctypes.addressof(_c_char.from_buffer(obj))   # the fastest way to the address
        else:
            ptr = obj.__array_interface__["data"][0]
        return Tensor(obj, ptr, obj.size, code, obj.shape, False)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        code = _torch_codes.get(obj.dtype)
        if code is None or not obj.is_contiguous() or obj.layout is not torch.strided or \
                not (obj.is_cpu or obj.is_cuda):
            code = _torch_slow(torch, obj, what)
        return Tensor(obj, obj.data_ptr(), obj.numel(), code, obj.shape, obj.is_cuda)
    raise TypeError("regroup: %s is a %s.%s; give a NumPy array or a PyTorch tensor" % (
        what, type(obj).__module__, type(obj).__qualname__))


def _numpy_slow(np, obj, what, writable):
    """The checks of describe() for a NumPy array not seen to be usable at once."""
    code = _dtype(obj.dtype.name, what)
    if obj.dtype.byteorder == ">":
        raise TypeError("regroup: %s is big-endian (%s); libregroup takes native byte "
                        "order" % (what, obj.dtype.str))
    if not obj.flags.c_contiguous:
        raise ValueError("regroup: %s is not C-contiguous (shape %s, strides %s); pass "
                         "numpy.ascontiguousarray(a) and copy the result back" % (
                             what, obj.shape, obj.strides))
    if writable and not obj.flags.writeable:
        raise ValueError("regroup: %s is read-only, and this call writes it" % what)
    _np_codes[obj.dtype] = code
    return code


def _torch_slow(torch, obj, what):
    """The checks of describe() for a PyTorch tensor not seen to be usable at once."""
    name = str(obj.dtype)
    name = name[len("torch."):] if name.startswith("torch.") else name
    code = _dtype(name, what)
    if obj.layout is not torch.strided:
        raise ValueError("regroup: %s has layout %s; give a dense (strided) tensor" % (
            what, obj.layout))
    if not obj.is_contiguous():
        raise ValueError("regroup: %s is not contiguous (shape %s, strides %s); pass "
                         "t.contiguous() and copy the result back" % (
                             what, tuple(obj.shape), tuple(obj.stride())))
    if obj.device.type not in ("cpu", "cuda"):
        raise TypeError("regroup: %s is on device %s; only CPU (and CUDA, where the "
                        "library supports it) tensors can be used" % (what, obj.device))
    _torch_codes[obj.dtype] = code
    return code
