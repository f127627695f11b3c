/*
 * Device-memory helpers for comm/, built when CMake finds a CUDA toolkit (REGROUP_CUDA).
 * Element-wise reductions run as one grid-stride kernel per call on the default stream, and
 * the call waits for it: UCX reads the result right after. f16 and bf16 are widened to float
 * and rounded back to nearest-even, like the host loops.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "rg_common.h"

#include <regroup/comm.h>
}

namespace {

struct op_sum {
    template <typename T> __device__ T operator()(T x, T y) const { return x + y; }
};
struct op_prod {
    template <typename T> __device__ T operator()(T x, T y) const { return x * y; }
};
struct op_min {
    template <typename T> __device__ T operator()(T x, T y) const
    {
        return (x < y || x != x) ? x : y;
    }
};
struct op_max {
    template <typename T> __device__ T operator()(T x, T y) const
    {
        return (x > y || x != x) ? x : y;
    }
};

template <typename T> struct wide { typedef T type; };
template <> struct wide<__half> { typedef float type; };
template <> struct wide<__nv_bfloat16> { typedef float type; };
template <> struct wide<int32_t> { typedef uint32_t type; }; /* wrap, do not overflow */
template <> struct wide<int64_t> { typedef uint64_t type; };
template <> struct wide<uint8_t> { typedef uint32_t type; };

template <typename T> __device__ typename wide<T>::type widen(T x)
{
    return (typename wide<T>::type)x;
}
template <> __device__ float widen<__half>(__half x) { return __half2float(x); }
template <> __device__ float widen<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ T narrow(typename wide<T>::type x) { return (T)x; }
template <> __device__ __half narrow<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __nv_bfloat16 narrow<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

template <typename T, typename OP>
__global__ void reduce_kernel(T *dst, const T *a, const T *b, size_t n)
{
    OP op;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
    }
}

template <typename T> __global__ void scale_kernel(T *buf, size_t n, float d)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        buf[i] = narrow<T>((typename wide<T>::type)(widen(buf[i]) / d));
    }
}
template <> __global__ void scale_kernel<double>(double *buf, size_t n, float d)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        buf[i] = buf[i] / (double)d;
    }
}

unsigned grid_for(size_t n)
{
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 4096 ? 4096 : (blocks ? blocks : 1));
}

rg_status_t cuda_check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        return rg_error(RG_EIO, "cuda %s: %s", what, cudaGetErrorString(err));
    }
    return RG_OK;
}

template <typename T>
rg_status_t launch(rg_redop_t op, void *dst, const void *a, const void *b, size_t n)
{
    T *d = (T *)dst;
    const T *x = (const T *)a;
    const T *y = (const T *)b;
    unsigned g = grid_for(n);
    switch (op) {
    case RG_OP_SUM:
    case RG_OP_AVG: reduce_kernel<T, op_sum><<<g, 256>>>(d, x, y, n); break;
    case RG_OP_PROD: reduce_kernel<T, op_prod><<<g, 256>>>(d, x, y, n); break;
    case RG_OP_MIN: reduce_kernel<T, op_min><<<g, 256>>>(d, x, y, n); break;
    case RG_OP_MAX: reduce_kernel<T, op_max><<<g, 256>>>(d, x, y, n); break;
    }
    rg_status_t st = cuda_check(cudaGetLastError(), "reduce launch");
    return st != RG_OK ? st : cuda_check(cudaStreamSynchronize(0), "reduce");
}

} // namespace

extern "C" bool comm_cuda_available(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

extern "C" rg_status_t comm_reduce_dev(rg_dtype_t dtype, rg_redop_t op, void *dst,
                                       const void *a, const void *b, size_t n)
{
    switch (dtype) {
    case RG_DTYPE_F32: return launch<float>(op, dst, a, b, n);
    case RG_DTYPE_F64: return launch<double>(op, dst, a, b, n);
    case RG_DTYPE_F16: return launch<__half>(op, dst, a, b, n);
    case RG_DTYPE_BF16: return launch<__nv_bfloat16>(op, dst, a, b, n);
    case RG_DTYPE_I32: return launch<int32_t>(op, dst, a, b, n);
    case RG_DTYPE_I64: return launch<int64_t>(op, dst, a, b, n);
    case RG_DTYPE_U8: return launch<uint8_t>(op, dst, a, b, n);
    }
    return rg_error(RG_EINVAL, "unknown dtype %d", (int)dtype);
}

extern "C" rg_status_t comm_reduce_scale_dev(rg_dtype_t dtype, void *buf, size_t n, int divisor)
{
    unsigned g = grid_for(n);
    float d = (float)divisor;
    switch (dtype) {
    case RG_DTYPE_F32: scale_kernel<float><<<g, 256>>>((float *)buf, n, d); break;
    case RG_DTYPE_F64: scale_kernel<double><<<g, 256>>>((double *)buf, n, d); break;
    case RG_DTYPE_F16: scale_kernel<__half><<<g, 256>>>((__half *)buf, n, d); break;
    case RG_DTYPE_BF16: scale_kernel<__nv_bfloat16><<<g, 256>>>((__nv_bfloat16 *)buf, n, d); break;
    default: return rg_error(RG_EINVAL, "avg is defined on floating types only");
    }
    rg_status_t st = cuda_check(cudaGetLastError(), "scale launch");
    return st != RG_OK ? st : cuda_check(cudaStreamSynchronize(0), "scale");
}

extern "C" rg_status_t comm_copy_dev(void *dst, const void *src, size_t n)
{
    return cuda_check(cudaMemcpy(dst, src, n, cudaMemcpyDefault), "memcpy");
}

extern "C" void *comm_dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        return NULL;
    }
    return p;
}

extern "C" void comm_dev_free(void *p)
{
    if (p != NULL) {
        (void)cudaFree(p);
    }
}
