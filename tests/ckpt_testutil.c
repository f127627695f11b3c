#include "ckpt_testutil.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Roughly N(0, 0.02) from two hashes, like freshly initialised weights. */
static double gauss(uint64_t h)
{
    double u1 = ((double)(h >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(mix(h) >> 11) / 9007199254740992.0;
    return 0.02 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void ckpt_fill(void *dst, rg_dtype_t dtype, uint64_t first, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t h = mix((first + i) * 0x9e3779b97f4a7c15ull + seed);
        switch (dtype) {
        case RG_DTYPE_F32: {
            float v = (float)gauss(h);
            memcpy((char *)dst + 4 * i, &v, 4);
            break;
        }
        case RG_DTYPE_F64: {
            double v = gauss(h);
            memcpy((char *)dst + 8 * i, &v, 8);
            break;
        }
        case RG_DTYPE_F16:
        case RG_DTYPE_BF16: {
            float v = (float)gauss(h);
            uint32_t b;
            uint16_t s;
            memcpy(&b, &v, 4);
            s = (uint16_t)(b >> 16);   /* bf16; as f16 the bits are just some pattern */
            memcpy((char *)dst + 2 * i, &s, 2);
            break;
        }
        case RG_DTYPE_I32: {
            int32_t v = (int32_t)h;
            memcpy((char *)dst + 4 * i, &v, 4);
            break;
        }
        case RG_DTYPE_I64:
            memcpy((char *)dst + 8 * i, &h, 8);
            break;
        case RG_DTYPE_U8:
            ((uint8_t *)dst)[i] = (uint8_t)(h % 7);   /* compressible */
            break;
        }
    }
}

uint64_t ckpt_row_elems(const uint64_t *shape, int ndim)
{
    uint64_t n = 1;
    for (int d = 1; d < ndim; d++) {
        n *= shape[d];
    }
    return n;
}

void ckpt_flip_byte(const char *path, int64_t off)
{
    int fd = open(path, O_RDWR);
    struct stat sb;
    unsigned char c;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        perror(path);
        abort();
    }
    if (off < 0) {
        off += sb.st_size;
    }
    if (pread(fd, &c, 1, off) != 1) {
        abort();
    }
    c ^= 0x5a;
    if (pwrite(fd, &c, 1, off) != 1) {
        abort();
    }
    close(fd);
}

int64_t ckpt_file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
}
