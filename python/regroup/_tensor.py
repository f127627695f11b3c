"""What regroup needs to know of a tensor: its address, element count, dtype and shape.

NumPy arrays and PyTorch tensors are read through their own attributes (neither library is
imported here: a tensor's type tells which one it comes from), never copied. A tensor must be
contiguous in row-major order and of one of libregroup's element types.
"""

import sys

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


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _dtype(name, what):
    code = _BY_NAME.get(name)
    if code is None:
        raise TypeError("regroup: %s has dtype %s, which libregroup lacks (it has %s)" % (
            what, name, SUPPORTED))
    return code


def describe(obj, what="tensor", writable=False):
    """The Tensor view of a NumPy array or a PyTorch tensor; TypeError or ValueError naming
    what is wrong (the type, the dtype, non-contiguity, a read-only array)."""
    tt = _torch_tensor_type()
    if tt is not None and isinstance(obj, tt):
        name = str(obj.dtype)
        name = name[len("torch."):] if name.startswith("torch.") else name
        dtype = _dtype(name, what)
        if getattr(obj, "is_sparse", False):
            raise ValueError("regroup: %s is a sparse tensor; give a dense one" % what)
        if not obj.is_contiguous():
            raise ValueError("regroup: %s is not contiguous (shape %s, strides %s); pass "
                             "t.contiguous() and copy the result back" % (
                                 what, tuple(obj.shape), tuple(obj.stride())))
        dev = obj.device.type
        if dev not in ("cpu", "cuda"):
            raise TypeError("regroup: %s is on device %s; only CPU (and CUDA, where the "
                            "library supports it) tensors can be used" % (what, obj.device))
        return Tensor(obj, obj.data_ptr(), obj.numel(), dtype, tuple(obj.shape), dev == "cuda")
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None and type(obj).__module__.split(".")[0] == "numpy":
        dtype = _dtype(obj.dtype.name, what)
        if not obj.flags["C_CONTIGUOUS"]:
            raise ValueError("regroup: %s is not C-contiguous (shape %s, strides %s); pass "
                             "numpy.ascontiguousarray(a) and copy the result back" % (
                                 what, obj.shape, obj.strides))
        if writable and not obj.flags["WRITEABLE"]:
            raise ValueError("regroup: %s is read-only, and this call writes it" % what)
        if obj.dtype.byteorder == ">":
            raise TypeError("regroup: %s is big-endian (%s); libregroup takes native byte "
                            "order" % (what, obj.dtype.str))
        return Tensor(obj, iface["data"][0], int(obj.size), dtype, tuple(obj.shape), False)
    raise TypeError("regroup: %s is a %s.%s; give a NumPy array or a PyTorch tensor" % (
        what, type(obj).__module__, type(obj).__qualname__))
