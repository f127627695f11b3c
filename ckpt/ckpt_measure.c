/* Compression-only throughput for the benchmark (see ckpt_measure.h). */
#include "ckpt_measure.h"

#include "ckpt_format.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zstd.h>

typedef struct {
    const uint8_t *data;
    size_t         bytes;
    size_t         esize;
    bool           shuffle;
    int            level;
    size_t         chunk;
    atomic_size_t  next;
    atomic_size_t  comp;
    atomic_int     failed;
} measure_job_t;

static void *measure_worker(void *arg)
{
    measure_job_t *j = arg;
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    size_t cap = ZSTD_compressBound(j->chunk);
    uint8_t *out = malloc(cap);
    uint8_t *scratch = malloc(j->chunk);

    if (cctx == NULL || out == NULL || scratch == NULL) {
        atomic_store(&j->failed, 1);
        goto out_free;
    }
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, j->level);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    while (true) {
        size_t off = atomic_fetch_add(&j->next, j->chunk);
        size_t len;
        const uint8_t *src;
        size_t r;
        if (off >= j->bytes) {
            break;
        }
        len = RG_MIN(j->chunk, j->bytes - off);
        src = j->data + off;
        if (j->shuffle) {
            ckpt_shuffle(scratch, src, len, j->esize);
            src = scratch;
        }
        r = ZSTD_compress2(cctx, out, cap, src, len);
        if (ZSTD_isError(r)) {
            atomic_store(&j->failed, 1);
            break;
        }
        (void)ckpt_crc32c(0, out, r);   /* the save computes it too */
        atomic_fetch_add(&j->comp, r);
    }
out_free:
    free(scratch);
    free(out);
    ZSTD_freeCCtx(cctx);
    return NULL;
}

rg_status_t ckpt_measure_compress(const void *data, size_t bytes, rg_dtype_t dtype,
                                  bool shuffle, int level, int threads, size_t chunk_bytes,
                                  ckpt_measure_t *out)
{
    measure_job_t j = {.data = data, .bytes = bytes, .esize = rg_dtype_size(dtype),
                       .shuffle = shuffle, .level = level, .chunk = chunk_bytes};
    pthread_t th[64];
    int started = 0;
    uint64_t t0;

    if (threads < 1 || threads > 64 || chunk_bytes == 0 || j.esize == 0 ||
        chunk_bytes % j.esize != 0) {
        return rg_error(RG_EINVAL, "ckpt_measure_compress: bad arguments");
    }
    t0 = rg_now_ns();
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&th[i], NULL, measure_worker, &j) != 0) {
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
    }
    if (started < threads || atomic_load(&j.failed)) {
        return rg_error(RG_EIO, "compression measurement failed");
    }
    out->seconds = (double)(rg_now_ns() - t0) * 1e-9;
    out->comp_bytes = atomic_load(&j.comp);
    return RG_OK;
}
