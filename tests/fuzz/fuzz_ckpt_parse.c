/*
 * libFuzzer target for the checkpoint parsers: every input goes through the MANIFEST and
 * shard-record parsers (text), and the shard header, footer and index parsers (binary).
 * Each must accept or reject with RG_ECORRUPT, never crash or read out of bounds.
 * Built and run by scripts/fuzz.sh.
 */
#include "ckpt_format.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ckpt_manifest_t m;
    ckpt_record_t r;
    ckpt_header_t h;
    ckpt_footer_t f;
    ckpt_index_t idx;
    /* An exact-size copy, so that any read past the end is caught. */
    uint8_t *copy = malloc(size ? size : 1);

    if (copy == NULL) {
        return 0;
    }
    memcpy(copy, data, size);
    if (ckpt_manifest_parse((const char *)copy, size, &m) == RG_OK) {
        ckpt_manifest_cleanup(&m);
    }
    (void)ckpt_record_parse((const char *)copy, size, &r);
    (void)ckpt_header_parse(copy, size, &h);
    (void)ckpt_footer_parse(copy, size, &f);
    if (size >= CKPT_FOOTER_SIZE) {
        (void)ckpt_footer_parse(copy + size - CKPT_FOOTER_SIZE, CKPT_FOOTER_SIZE, &f);
    }
    if (ckpt_index_parse(copy, size, CKPT_HEADER_SIZE, (uint64_t)size * 64, &idx) == RG_OK) {
        ckpt_index_cleanup(&idx);
    }
    /* A whole shard image: header, then the index its footer points at. */
    if (size >= CKPT_HEADER_SIZE + CKPT_FOOTER_SIZE &&
        ckpt_header_parse(copy, size, &h) == RG_OK &&
        ckpt_footer_parse(copy + size - CKPT_FOOTER_SIZE, CKPT_FOOTER_SIZE, &f) == RG_OK &&
        f.index_offset >= CKPT_HEADER_SIZE && f.index_offset <= size - CKPT_FOOTER_SIZE &&
        f.index_size == size - CKPT_FOOTER_SIZE - f.index_offset &&
        ckpt_index_parse(copy + f.index_offset, f.index_size, CKPT_HEADER_SIZE,
                         f.index_offset, &idx) == RG_OK) {
        ckpt_index_cleanup(&idx);
    }
    free(copy);
    return 0;
}
