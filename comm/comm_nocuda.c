/* Device-memory helpers of a build without CUDA: device buffers are refused up front
 * (comm_check_args), so these are reached only through a bug; they fail cleanly. */
#include "comm_internal.h"

bool comm_cuda_available(void)
{
    return false;
}

static rg_status_t nocuda(void)
{
    return rg_error(RG_ENOTSUP, "CUDA device buffers need a build with CUDA (REGROUP_CUDA)");
}

rg_status_t comm_reduce_dev(rg_dtype_t dtype, rg_redop_t op, void *dst, const void *a,
                            const void *b, size_t n)
{
    (void)dtype, (void)op, (void)dst, (void)a, (void)b, (void)n;
    return nocuda();
}

rg_status_t comm_reduce_scale_dev(rg_dtype_t dtype, void *buf, size_t n, int divisor)
{
    (void)dtype, (void)buf, (void)n, (void)divisor;
    return nocuda();
}

rg_status_t comm_copy_dev(void *dst, const void *src, size_t n)
{
    (void)dst, (void)src, (void)n;
    return nocuda();
}

void *comm_dev_alloc(size_t bytes)
{
    (void)bytes;
    return NULL;
}

void comm_dev_free(void *p)
{
    (void)p;
}
