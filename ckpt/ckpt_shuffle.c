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

SHUFFLE_FN(shuffle2, 2)
SHUFFLE_FN(shuffle4, 4)
SHUFFLE_FN(shuffle8, 8)
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
