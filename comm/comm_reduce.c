/*
 * Element-wise reductions on host memory, and the 16-bit float conversions.
 *
 * The loops are plain counted loops over restrict-free pointers so that GCC vectorizes them
 * (this file is built with -O3; dst may alias a or b, which the vectorizer checks at run
 * time). f16 and bf16 are widened to float, combined, and rounded back to nearest-even: since
 * float has at least 2p+2 bits for p = 11 (f16) and p = 8 (bf16), the one rounding after a
 * float add or multiply gives the correctly rounded 16-bit result.
 *
 * min/max propagate NaN and are commutative (so every rank of a recursive-doubling exchange
 * gets the same bits).
 */
#include "comm_internal.h"

#include <string.h>

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* IEEE half -> float: exact (normals, subnormals, inf, NaN). */
static inline float f16_to_f32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    /* normals: shift the exponent and mantissa into place and rebias by 2^-112 */
    const float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    /* subnormals: put the mantissa below 0.5's exponent and subtract 0.5 */
    const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    /* a mask instead of a branch, so that loops over f16 vectorize */
    const uint32_t is_denorm = 0u - (uint32_t)(two_w < (1u << 27));
    const uint32_t result =
        sign | (f32_bits(denormalized) & is_denorm) | (f32_bits(normalized) & ~is_denorm);
    return f32_from_bits(result);
}

/* float -> IEEE half, round to nearest even; overflow to inf, NaN stays a (quiet) NaN. */
static inline uint16_t f32_to_f16(float f)
{
    /* Scaling up then down lets the FPU round at the half's mantissa width and handles
     * subnormals and overflow; the bias trick adds the right power of two. */
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    const uint32_t is_nan = 0u - (uint32_t)(shl1_w > 0xFF000000u);
    return (uint16_t)((sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

static inline float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16(float f)
{
    const uint32_t u = f32_bits(f);
    const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
    const uint32_t is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return (uint16_t)(is_nan ? ((u >> 16) | 0x40u) : (rounded >> 16));
}

float rg_f16_to_f32(uint16_t h) { return f16_to_f32(h); }
uint16_t rg_f32_to_f16(float f) { return f32_to_f16(f); }
float rg_bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t rg_f32_to_bf16(float f) { return f32_to_bf16(f); }

#define OP_SUM(x, y)  ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y)  (((x) < (y) || (x) != (x)) ? (x) : (y))
#define OP_MAX(x, y)  (((x) > (y) || (x) != (x)) ? (x) : (y))
/* Integer sum/prod wrap modulo 2^n like unsigned arithmetic (defined behaviour). */
#define OP_USUM(x, y)  ((x) + (y))

#define DEF_LOOP(name, T, OPX) \
    static void name(void *dst_, const void *a_, const void *b_, size_t n) \
    { \
        T *dst = dst_; \
        const T *a = a_; \
        const T *b = b_; \
        for (size_t i = 0; i < n; i++) { \
            dst[i] = OPX(a[i], b[i]); \
        } \
    }

/* Signed integers are combined as unsigned so overflow wraps instead of being undefined. */
#define DEF_ILOOP(name, T, UT, OPX) \
    static void name(void *dst_, const void *a_, const void *b_, size_t n) \
    { \
        T *dst = dst_; \
        const T *a = a_; \
        const T *b = b_; \
        for (size_t i = 0; i < n; i++) { \
            dst[i] = (T)OPX((UT)a[i], (UT)b[i]); \
        } \
    }

#define DEF_HLOOP(name, TO, FROM, OPX) \
    static void name(void *dst_, const void *a_, const void *b_, size_t n) \
    { \
        uint16_t *dst = dst_; \
        const uint16_t *a = a_; \
        const uint16_t *b = b_; \
        for (size_t i = 0; i < n; i++) { \
            dst[i] = TO(OPX(FROM(a[i]), FROM(b[i]))); \
        } \
    }

#define DEF_CMP(name, T, OPX) DEF_LOOP(name, T, OPX)

DEF_LOOP(f32_sum, float, OP_SUM)
DEF_LOOP(f32_prod, float, OP_PROD)
DEF_LOOP(f32_min, float, OP_MIN)
DEF_LOOP(f32_max, float, OP_MAX)
DEF_LOOP(f64_sum, double, OP_SUM)
DEF_LOOP(f64_prod, double, OP_PROD)
DEF_LOOP(f64_min, double, OP_MIN)
DEF_LOOP(f64_max, double, OP_MAX)
DEF_HLOOP(f16_sum, f32_to_f16, f16_to_f32, OP_SUM)
DEF_HLOOP(f16_prod, f32_to_f16, f16_to_f32, OP_PROD)
DEF_HLOOP(f16_min, f32_to_f16, f16_to_f32, OP_MIN)
DEF_HLOOP(f16_max, f32_to_f16, f16_to_f32, OP_MAX)
DEF_HLOOP(bf16_sum, f32_to_bf16, bf16_to_f32, OP_SUM)
DEF_HLOOP(bf16_prod, f32_to_bf16, bf16_to_f32, OP_PROD)
DEF_HLOOP(bf16_min, f32_to_bf16, bf16_to_f32, OP_MIN)
DEF_HLOOP(bf16_max, f32_to_bf16, bf16_to_f32, OP_MAX)
DEF_ILOOP(i32_sum, int32_t, uint32_t, OP_USUM)
DEF_ILOOP(i32_prod, int32_t, uint32_t, OP_PROD)
DEF_CMP(i32_min, int32_t, OP_MIN)
DEF_CMP(i32_max, int32_t, OP_MAX)
DEF_ILOOP(i64_sum, int64_t, uint64_t, OP_USUM)
DEF_ILOOP(i64_prod, int64_t, uint64_t, OP_PROD)
DEF_CMP(i64_min, int64_t, OP_MIN)
DEF_CMP(i64_max, int64_t, OP_MAX)
DEF_ILOOP(u8_sum, uint8_t, uint32_t, OP_USUM)
DEF_ILOOP(u8_prod, uint8_t, uint32_t, OP_PROD)
DEF_CMP(u8_min, uint8_t, OP_MIN)
DEF_CMP(u8_max, uint8_t, OP_MAX)

typedef void (*reduce_fn)(void *, const void *, const void *, size_t);

/* [dtype][op]: sum, avg (= sum), min, max, prod */
static const reduce_fn reduce_table[RG_DTYPE_U8 + 1][5] = {
    [RG_DTYPE_F32] = {f32_sum, f32_sum, f32_min, f32_max, f32_prod},
    [RG_DTYPE_F64] = {f64_sum, f64_sum, f64_min, f64_max, f64_prod},
    [RG_DTYPE_F16] = {f16_sum, f16_sum, f16_min, f16_max, f16_prod},
    [RG_DTYPE_BF16] = {bf16_sum, bf16_sum, bf16_min, bf16_max, bf16_prod},
    [RG_DTYPE_I32] = {i32_sum, NULL, i32_min, i32_max, i32_prod},
    [RG_DTYPE_I64] = {i64_sum, NULL, i64_min, i64_max, i64_prod},
    [RG_DTYPE_U8] = {u8_sum, NULL, u8_min, u8_max, u8_prod},
};

void comm_reduce(rg_dtype_t dtype, rg_redop_t op, void *dst, const void *a, const void *b,
                 size_t n)
{
    reduce_table[dtype][op](dst, a, b, n);
}

void comm_reduce_scale(rg_dtype_t dtype, void *buf, size_t n, int divisor)
{
    switch (dtype) {
    case RG_DTYPE_F32: {
        float *p = buf;
        const float d = (float)divisor;
        for (size_t i = 0; i < n; i++) {
            p[i] = p[i] / d;
        }
        break;
    }
    case RG_DTYPE_F64: {
        double *p = buf;
        const double d = (double)divisor;
        for (size_t i = 0; i < n; i++) {
            p[i] = p[i] / d;
        }
        break;
    }
    case RG_DTYPE_F16: {
        uint16_t *p = buf;
        const float d = (float)divisor;
        for (size_t i = 0; i < n; i++) {
            p[i] = f32_to_f16(f16_to_f32(p[i]) / d);
        }
        break;
    }
    case RG_DTYPE_BF16: {
        uint16_t *p = buf;
        const float d = (float)divisor;
        for (size_t i = 0; i < n; i++) {
            p[i] = f32_to_bf16(bf16_to_f32(p[i]) / d);
        }
        break;
    }
    default:
        break; /* refused at post time */
    }
}
