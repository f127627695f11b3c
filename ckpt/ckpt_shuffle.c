/*
 * The byte-shuffle filter: byte b of every element goes to plane b, so the sign/exponent
 * bytes of floating point values (alike across a tensor) end up next to each other, where
 * zstd finds them; the noisy mantissa bytes no longer break up its matches.
 */
#include "ckpt_format.h"

#include <string.h>

/* Fixed element sizes let the compiler unroll the inner loop. */
#define SHUFFLE_FN(NAME, ES) \
    static void NAME(uint8_t *restrict out, const uint8_t *restrict in, size_t n) \
    { \
        for (size_t i = 0; i < n; i++) { \
            for (size_t b = 0; b < (ES); b++) { \
                out[b * n + i] = in[i * (ES) + b]; \
            } \
        } \
    }
#define UNSHUFFLE_FN(NAME, ES) \
    static void NAME(uint8_t *restrict out, const uint8_t *restrict in, size_t n) \
    { \
        for (size_t i = 0; i < n; i++) { \
            for (size_t b = 0; b < (ES); b++) { \
                out[i * (ES) + b] = in[b * n + i]; \
            } \
        } \
    }

/* For 4- and 8-byte elements, one byte plane at a time over blocks that stay in L1: the
 * stores become sequential, which measured ~1.5x faster than the element-order loop. */
#define SHUFFLE_BLOCK 2048
#define SHUFFLE_BLOCKED_FN(NAME, ES) \
    static void NAME(uint8_t *restrict out, const uint8_t *restrict in, size_t n) \
    { \
        for (size_t i0 = 0; i0 < n; i0 += SHUFFLE_BLOCK) { \
            size_t m = RG_MIN(n - i0, (size_t)SHUFFLE_BLOCK); \
            for (size_t b = 0; b < (ES); b++) { \
                uint8_t *o = out + b * n + i0; \
                const uint8_t *p = in + i0 * (ES) + b; \
                for (size_t i = 0; i < m; i++) { \
                    o[i] = p[i * (ES)]; \
                } \
            } \
        } \
    }

SHUFFLE_FN(shuffle2, 2)
SHUFFLE_BLOCKED_FN(shuffle4, 4)
SHUFFLE_BLOCKED_FN(shuffle8, 8)
UNSHUFFLE_FN(unshuffle2, 2)
UNSHUFFLE_FN(unshuffle4, 4)
UNSHUFFLE_FN(unshuffle8, 8)

void ckpt_shuffle(void *out, const void *in, size_t len, size_t esize)
{
    size_t n = esize ? len / esize : 0;
    switch (esize) {
    case 2: shuffle2(out, in, n); return;
    case 4: shuffle4(out, in, n); return;
    case 8: shuffle8(out, in, n); return;
    default: memcpy(out, in, len); return;
    }
}

void ckpt_unshuffle(void *out, const void *in, size_t len, size_t esize)
{
    size_t n = esize ? len / esize : 0;
    switch (esize) {
    case 2: unshuffle2(out, in, n); return;
    case 4: unshuffle4(out, in, n); return;
    case 8: unshuffle8(out, in, n); return;
    default: memcpy(out, in, len); return;
    }
}
