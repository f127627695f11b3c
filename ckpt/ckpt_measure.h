/*
 * Measurements for bench/rg-bench-ckpt: the compression side of the save pipeline alone
 * (same chunking, filter, level and thread count as rg_ckpt_save, nothing written), so the
 * benchmark can state the throughput limit without including <zstd.h> outside ckpt/.
 * Not part of the public API.
 */
#ifndef RG_CKPT_MEASURE_H
#define RG_CKPT_MEASURE_H

#include <regroup/dtype.h>
#include <regroup/status.h>

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    double seconds;           /* wall time of the parallel compression */
    size_t comp_bytes;        /* total compressed size */
} ckpt_measure_t;

/* Compresses `bytes` of `data` in chunk_bytes frames at zstd `level` on `threads` threads,
 * shuffled or not. Blocks. */
rg_status_t ckpt_measure_compress(const void *data, size_t bytes, rg_dtype_t dtype,
                                  bool shuffle, int level, int threads, size_t chunk_bytes,
                                  ckpt_measure_t *out);

#endif
