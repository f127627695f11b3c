/* Element types shared by comm/ and ckpt/. */
#ifndef REGROUP_DTYPE_H
#define REGROUP_DTYPE_H

#include <stddef.h>

typedef enum {
    RG_DTYPE_F32,
    RG_DTYPE_F64,
    RG_DTYPE_F16,
    RG_DTYPE_BF16,
    RG_DTYPE_I32,
    RG_DTYPE_I64,
    RG_DTYPE_U8,
} rg_dtype_t;

/* Size in bytes of one element; 0 for an unknown type. */
static inline size_t rg_dtype_size(rg_dtype_t dtype)
{
    switch (dtype) {
    case RG_DTYPE_F32: return 4;
    case RG_DTYPE_F64: return 8;
    case RG_DTYPE_F16: return 2;
    case RG_DTYPE_BF16: return 2;
    case RG_DTYPE_I32: return 4;
    case RG_DTYPE_I64: return 8;
    case RG_DTYPE_U8: return 1;
    }
    return 0;
}

#endif
