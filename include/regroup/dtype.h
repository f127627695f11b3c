/*
 * regroup element types, shared by checkpoints (ckpt.h) and collectives (comm.h).
 * The numeric values are stored in checkpoint files: never renumber, only append.
 */
#ifndef REGROUP_DTYPE_H
#define REGROUP_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    RG_DTYPE_F32  = 1,
    RG_DTYPE_F64  = 2,
    RG_DTYPE_F16  = 3,
    RG_DTYPE_BF16 = 4,
    RG_DTYPE_I32  = 5,
    RG_DTYPE_I64  = 6,
    RG_DTYPE_U8   = 7,
} rg_dtype_t;

/* Bytes per element; 0 for a value that is not an rg_dtype_t (e.g. read from a file). */
static inline size_t rg_dtype_size(rg_dtype_t dtype)
{
    switch (dtype) {
    case RG_DTYPE_F32:  return 4;
    case RG_DTYPE_F64:  return 8;
    case RG_DTYPE_F16:  return 2;
    case RG_DTYPE_BF16: return 2;
    case RG_DTYPE_I32:  return 4;
    case RG_DTYPE_I64:  return 8;
    case RG_DTYPE_U8:   return 1;
    }
    return 0;
}

/* True for the floating point types (f32, f64, f16, bf16). */
static inline int rg_dtype_is_float(rg_dtype_t dtype)
{
    return dtype == RG_DTYPE_F32 || dtype == RG_DTYPE_F64 || dtype == RG_DTYPE_F16 ||
           dtype == RG_DTYPE_BF16;
}

#ifdef __cplusplus
}
#endif
#endif
