/* CRC32C (Castagnoli): the SSE4.2 instruction where the CPU has it, a table otherwise. */
#include "ckpt_format.h"

#include <pthread.h>

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static bool crc_hw;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            uint32_t prev = crc_table[t - 1][i];
            crc_table[t][i] = (prev >> 8) ^ crc_table[0][prev & 0xff];
        }
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t len)
{
    while (len >= 8) {
        uint32_t lo = c ^ ckpt_get_u32(p);
        uint32_t hi = ckpt_get_u32(p + 4);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len-- > 0) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    }
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw_run(uint32_t c, const uint8_t *p,
                                                             size_t len)
{
    uint64_t c64 = c;
    while (len >= 8) {
        uint64_t v;
        __builtin_memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        len -= 8;
    }
    c = (uint32_t)c64;
    while (len-- > 0) {
        c = __builtin_ia32_crc32qi(c, *p++);
    }
    return c;
}
#endif

uint32_t ckpt_crc32c(uint32_t crc, const void *buf, size_t len)
{
    uint32_t c = ~crc;
    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__)
    if (crc_hw) {
        return ~crc_hw_run(c, buf, len);
    }
#endif
    return ~crc_sw(c, buf, len);
}
