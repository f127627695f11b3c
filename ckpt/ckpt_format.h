/*
 * ckpt/ internals: the on-disk format (docs/checkpoint-format.md) and the helpers around it.
 *
 * A shard file is a 64-byte header, independent zstd frames (one per chunk, each with zstd's
 * content checksum, each also covered by a CRC32C of its compressed bytes), an index that
 * describes every tensor and chunk, and a 32-byte footer that locates the index. The CRC32C
 * of the index is the shard's checksum: it is recorded in the shard's record and in the
 * MANIFEST, and it covers every chunk through the chunk CRCs listed in the index.
 *
 * Every parser here takes bytes from disk and must reject anything malformed with
 * RG_ECORRUPT (never crash, never read out of bounds); they are the fuzz targets.
 */
#ifndef RG_CKPT_FORMAT_H
#define RG_CKPT_FORMAT_H

#include "rg_common.h"

#include <regroup/ckpt.h>

#include <stdint.h>

#define CKPT_VERSION          1u
#define CKPT_HEADER_SIZE      64u
#define CKPT_FOOTER_SIZE      32u
#define CKPT_SHARD_MAGIC      "RGCKSHRD"
#define CKPT_INDEX_MAGIC      "RGCKINDX"
#define CKPT_FOOTER_MAGIC     "RGCKFOOT"
#define CKPT_MAX_CHUNK        (64u << 20)      /* largest raw chunk a reader accepts */
#define CKPT_MAX_INDEX        (256u << 20)     /* largest index a reader accepts */
#define CKPT_MAX_TENSORS      (1u << 20)
#define CKPT_MAX_CHUNKS       (1u << 24)
#define CKPT_MAX_TEXT         (4u << 20)       /* largest MANIFEST or record */
#define CKPT_MANIFEST_NAME    "MANIFEST"
#define CKPT_DEFAULT_CHUNK    (4u << 20)

/* ---- checksums and filters (ckpt_crc.c, ckpt_shuffle.c) -------------------------------- */

uint32_t ckpt_crc32c(uint32_t crc, const void *buf, size_t len);
/* out[b * n + i] = in[i * esize + b] for n = len / esize elements; len % esize == 0. */
void ckpt_shuffle(void *out, const void *in, size_t len, size_t esize);
void ckpt_unshuffle(void *out, const void *in, size_t len, size_t esize);

/* ---- little-endian encoding ------------------------------------------------------------ */

static inline void ckpt_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void ckpt_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}
static inline void ckpt_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}
static inline uint16_t ckpt_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t ckpt_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}
static inline uint64_t ckpt_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* ---- shard: header, index, footer (ckpt_format.c) -------------------------------------- */

typedef struct {
    int64_t  step;
    uint32_t rank;
    uint32_t world_size;
    uint64_t chunk_bytes;
} ckpt_header_t;

typedef struct {
    char       name[RG_CKPT_MAX_NAME + 1];
    rg_dtype_t dtype;
    int        ndim;
    uint64_t   shape[RG_CKPT_MAX_DIMS];
    uint64_t   row_begin;
    uint64_t   row_count;
    unsigned   flags;          /* RG_CKPT_SHUFFLE (as applied) | RG_CKPT_REPLICATED */
    uint64_t   row_bytes;      /* derived: bytes per row of dim 0 */
    uint64_t   bytes;          /* derived: row_count * row_bytes */
    uint32_t   first_chunk;
    uint32_t   n_chunks;
} ckpt_tensor_meta_t;

typedef struct {
    uint64_t offset;           /* in the file */
    uint32_t comp_size;
    uint32_t raw_size;
    uint32_t crc;              /* CRC32C of the compressed frame */
    uint64_t raw_offset;       /* derived: offset in the tensor's data */
} ckpt_chunk_meta_t;

typedef struct {
    ckpt_tensor_meta_t *tensors;
    size_t              n_tensors;
    ckpt_chunk_meta_t  *chunks;
    size_t              n_chunks;
} ckpt_index_t;

typedef struct {
    uint64_t index_offset;
    uint64_t index_size;
    uint32_t index_crc;
} ckpt_footer_t;

void        ckpt_header_encode(const ckpt_header_t *h, uint8_t out[CKPT_HEADER_SIZE]);
rg_status_t ckpt_header_parse(const uint8_t *buf, size_t len, ckpt_header_t *h);
void        ckpt_footer_encode(const ckpt_footer_t *f, uint8_t out[CKPT_FOOTER_SIZE]);
rg_status_t ckpt_footer_parse(const uint8_t *buf, size_t len, ckpt_footer_t *f);

/* Computes row_bytes and bytes; RG_EINVAL on overflow or a bad dtype/ndim. */
rg_status_t ckpt_tensor_sizes(ckpt_tensor_meta_t *t);
/* Encodes an index into a malloc'd buffer. */
rg_status_t ckpt_index_encode(const ckpt_index_t *idx, uint8_t **buf_p, size_t *len_p);
/* Parses an index whose chunks must lie in [data_begin, data_end) of the file. */
rg_status_t ckpt_index_parse(const uint8_t *buf, size_t len, uint64_t data_begin,
                             uint64_t data_end, ckpt_index_t *idx);
void        ckpt_index_cleanup(ckpt_index_t *idx);

/* ---- MANIFEST and shard records (ckpt_format.c) ---------------------------------------- */

typedef struct {
    uint64_t size;             /* shard file size */
    uint32_t checksum;         /* CRC32C of the shard's index */
} ckpt_shard_sum_t;

typedef struct {
    int64_t           step;
    uint32_t          world_size;
    ckpt_shard_sum_t *shards;  /* world_size entries */
} ckpt_manifest_t;

typedef struct {
    int64_t          step;
    uint32_t         rank;
    uint32_t         world_size;
    uint64_t         attempt;  /* the saver's tag (0 = none); see rg_ckpt_params_t */
    ckpt_shard_sum_t sum;
} ckpt_record_t;

rg_status_t ckpt_manifest_encode(const ckpt_manifest_t *m, rg_dbuf_t *out);
rg_status_t ckpt_manifest_parse(const char *buf, size_t len, ckpt_manifest_t *m);
void        ckpt_manifest_cleanup(ckpt_manifest_t *m);
rg_status_t ckpt_record_encode(const ckpt_record_t *r, rg_dbuf_t *out);
rg_status_t ckpt_record_parse(const char *buf, size_t len, ckpt_record_t *r);

/* ---- files (ckpt_fs.c) ----------------------------------------------------------------- */

/* Maps an errno to a status: ENOSPC/EDQUOT/EFBIG -> RG_ENOSPC, EACCES/EPERM/EROFS ->
 * RG_EPERM, ENOENT -> RG_ENOENT, else RG_EIO. */
rg_status_t ckpt_errno_status(int err);
/* Writes all of buf at the file's current offset; records the error naming path. */
rg_status_t ckpt_write_all(int fd, const void *buf, size_t len, const char *path);
rg_status_t ckpt_pread_all(int fd, void *buf, size_t len, uint64_t off, const char *path);
rg_status_t ckpt_fsync_path(const char *path, bool dir);
rg_status_t ckpt_mkdir(const char *path);      /* one level; EEXIST is success */
/* Writes dir/name atomically: dir/.name.tmp, fsync, rename, fsync dir. */
/* Finishes a temp file written through fd (st: how the writing went): fsync (then, with
 * drop_cache, drops its pages), close, rename to dst, fsync dir. On any failure the temp
 * file is removed. Returns st or the first error. */
rg_status_t ckpt_finish_tmp(int fd, rg_status_t st, const char *tmp, const char *dst,
                            const char *dir, bool drop_cache);
rg_status_t ckpt_write_file_atomic(const char *dir, const char *name, const void *buf,
                                   size_t len);
/* Reads a whole small file (at most max bytes) into a malloc'd NUL-terminated buffer. */
rg_status_t ckpt_read_file(const char *path, size_t max, char **buf_p, size_t *len_p);
/* Removes a step directory: MANIFEST first (so a crash leaves it uncommitted), then the
 * files in it, then the directory. */
rg_status_t ckpt_remove_step_dir(const char *path);
/* Test hooks, read once per process: REGROUP_CKPT_KILL_AFTER_BYTES=N raises SIGKILL once N
 * bytes have been written by this process's checkpoint writers (checked at every write and
 * at every fault point); REGROUP_CKPT_KILL_AT_POINT=K raises it at the K-th fault point
 * (before every fsync and rename). Unset: no effect. */
void ckpt_fault_point(void);
/* REGROUP_CKPT_SLOW_COMMIT=STEP:MS: the first commit of STEP in this process waits MS ms
 * before its fence check (a slow store at the worst moment: a membership change then lands
 * between a checkpoint's report and its commit). Unset, it costs one comparison. */
void ckpt_fault_commit(int64_t step);

/* ---- naming ---------------------------------------------------------------------------- */

#define CKPT_PATH_MAX 4096
/* snprintf that says whether the result fit (paths must never be cut short). */
bool ckpt_fmt(char *out, size_t cap, const char *fmt, ...) RG_PRINTF(3, 4);
int  ckpt_step_dir(char *out, size_t cap, const char *root, int64_t step);
bool ckpt_parse_step_name(const char *name, int64_t *step);
/* Committed steps, newest first (malloc'd). */
rg_status_t ckpt_list_steps(const char *root, bool committed_only, int64_t **steps_p,
                            size_t *n_p);

#endif
