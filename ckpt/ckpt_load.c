/*
 * The reader. Opening a committed step parses its MANIFEST and every shard's header, footer
 * and index, and checks them against each other, so a missing, truncated, foreign or
 * swapped shard is found before any data is read. Every piece of every tensor (a shard's
 * slice of it) goes into one table sorted by name and first row; a read walks the pieces
 * that overlap the requested rows and decompresses only the chunks that overlap them, each
 * verified by its CRC32C and zstd's content checksum.
 */
#include "ckpt_format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

typedef struct {
    int          fd;
    char         path[CKPT_PATH_MAX];
    ckpt_index_t idx;
} reader_shard_t;

typedef struct {
    const ckpt_tensor_meta_t *t;
    uint32_t                  shard;
} reader_piece_t;

/* One decoding thread's context and scratch buffers (bounded by CKPT_MAX_CHUNK). */
typedef struct {
    ZSTD_DCtx *dctx;
    uint8_t   *comp;
    size_t     comp_cap;
    uint8_t   *raw;
    uint8_t   *raw2;
    size_t     raw_cap;
} reader_decoder_t;

/* Chunks are decoded on this many threads (the caller's and READER_THREADS - 1 more). */
#define READER_THREADS 2

struct rg_ckpt_reader {
    int64_t          step;
    uint32_t         world_size;
    reader_shard_t  *shards;
    reader_piece_t  *pieces;
    size_t           n_pieces;
    reader_decoder_t dec[READER_THREADS];
};

/* One chunk to decode for a read: bytes [from, from + len) of the chunk go to dst. */
typedef struct {
    const reader_shard_t     *sh;
    const ckpt_tensor_meta_t *t;
    const ckpt_chunk_meta_t  *ch;
    uint64_t                  from;
    uint64_t                  len;
    uint8_t                  *dst;
} reader_task_t;

static int piece_cmp(const void *a, const void *b)
{
    const reader_piece_t *x = a;
    const reader_piece_t *y = b;
    int c = strcmp(x->t->name, y->t->name);
    if (c != 0) {
        return c;
    }
    return (x->t->row_begin > y->t->row_begin) - (x->t->row_begin < y->t->row_begin);
}

static rg_status_t reader_open_shard(rg_ckpt_reader_t *rd, const char *dir, uint32_t r,
                                     const ckpt_shard_sum_t *sum)
{
    reader_shard_t *sh = &rd->shards[r];
    uint8_t head[CKPT_HEADER_SIZE];
    uint8_t foot_buf[CKPT_FOOTER_SIZE];
    ckpt_header_t h;
    ckpt_footer_t f;
    struct stat sb;
    uint8_t *ibuf;
    rg_status_t st;
    int err;

    ckpt_fmt(sh->path, sizeof(sh->path), "%s/shard-%05" PRIu32 ".rgs", dir, r);
    sh->fd = open(sh->path, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0) {
        err = errno;
        return rg_error(err == ENOENT ? RG_ECORRUPT : ckpt_errno_status(err), "open %s: %s",
                        sh->path, strerror(err));
    }
    if (fstat(sh->fd, &sb) != 0 || (uint64_t)sb.st_size != sum->size ||
        sum->size < CKPT_HEADER_SIZE + CKPT_FOOTER_SIZE) {
        return rg_error(RG_ECORRUPT, "%s: size %" PRId64 " does not match the MANIFEST's %"
                        PRIu64, sh->path, (int64_t)sb.st_size, sum->size);
    }
    st = ckpt_pread_all(sh->fd, head, sizeof(head), 0, sh->path);
    if (st == RG_OK) {
        st = ckpt_pread_all(sh->fd, foot_buf, sizeof(foot_buf), sum->size - CKPT_FOOTER_SIZE,
                            sh->path);
    }
    if (st != RG_OK) {
        return st;
    }
    if (ckpt_header_parse(head, sizeof(head), &h) != RG_OK ||
        ckpt_footer_parse(foot_buf, sizeof(foot_buf), &f) != RG_OK) {
        return rg_error_wrap(RG_ECORRUPT, "%s", sh->path);
    }
    if (h.step != rd->step || h.rank != r || h.world_size != rd->world_size) {
        return rg_error(RG_ECORRUPT, "%s is step %" PRId64 " rank %" PRIu32 " of %" PRIu32
                        ", not what the MANIFEST lists", sh->path, h.step, h.rank,
                        h.world_size);
    }
    if (f.index_crc != sum->checksum || f.index_offset < CKPT_HEADER_SIZE ||
        f.index_offset > sum->size - CKPT_FOOTER_SIZE ||
        f.index_size != sum->size - CKPT_FOOTER_SIZE - f.index_offset) {
        return rg_error(RG_ECORRUPT, "%s: index does not match the MANIFEST (checksum 0x%08"
                        PRIx32 ", expected 0x%08" PRIx32 ")", sh->path, f.index_crc,
                        sum->checksum);
    }
    ibuf = malloc(f.index_size ? f.index_size : 1);
    if (ibuf == NULL) {
        return rg_error(RG_ENOMEM, "no memory for the index of %s", sh->path);
    }
    st = ckpt_pread_all(sh->fd, ibuf, f.index_size, f.index_offset, sh->path);
    if (st == RG_OK && ckpt_crc32c(0, ibuf, f.index_size) != f.index_crc) {
        st = rg_error(RG_ECORRUPT, "%s: index checksum mismatch", sh->path);
    }
    if (st == RG_OK) {
        st = ckpt_index_parse(ibuf, f.index_size, CKPT_HEADER_SIZE, f.index_offset, &sh->idx);
        if (st != RG_OK) {
            st = rg_error_wrap(st, "%s", sh->path);
        }
    }
    free(ibuf);
    return st;
}

/* Builds the piece table and checks that every tensor is described alike by every shard. */
static rg_status_t reader_build_pieces(rg_ckpt_reader_t *rd)
{
    size_t n = 0;
    size_t k = 0;

    for (uint32_t r = 0; r < rd->world_size; r++) {
        n += rd->shards[r].idx.n_tensors;
    }
    rd->pieces = calloc(n ? n : 1, sizeof(*rd->pieces));
    if (rd->pieces == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a checkpoint's table of tensors");
    }
    for (uint32_t r = 0; r < rd->world_size; r++) {
        for (size_t i = 0; i < rd->shards[r].idx.n_tensors; i++) {
            rd->pieces[k].t = &rd->shards[r].idx.tensors[i];
            rd->pieces[k].shard = r;
            k++;
        }
    }
    rd->n_pieces = n;
    qsort(rd->pieces, n, sizeof(*rd->pieces), piece_cmp);
    for (size_t i = 1; i < n; i++) {
        const ckpt_tensor_meta_t *a = rd->pieces[i - 1].t;
        const ckpt_tensor_meta_t *b = rd->pieces[i].t;
        if (strcmp(a->name, b->name) != 0) {
            continue;
        }
        if (a->dtype != b->dtype || a->ndim != b->ndim ||
            memcmp(a->shape, b->shape, sizeof(a->shape[0]) * (size_t)a->ndim) != 0 ||
            rd->pieces[i - 1].shard == rd->pieces[i].shard) {
            return rg_error(RG_ECORRUPT, "step %" PRId64 ": tensor %s is described "
                            "differently by shards %" PRIu32 " and %" PRIu32, rd->step,
                            a->name, rd->pieces[i - 1].shard, rd->pieces[i].shard);
        }
    }
    return RG_OK;
}

rg_status_t rg_ckpt_reader_open(const char *root, int64_t step, rg_ckpt_reader_t **reader_p)
{
    char dir[CKPT_PATH_MAX];
    char path[CKPT_PATH_MAX];
    char *text = NULL;
    size_t len;
    ckpt_manifest_t m = {0};
    rg_ckpt_reader_t *rd;
    rg_status_t st;

    if (root == NULL || reader_p == NULL || step < 0 ||
        ckpt_step_dir(dir, sizeof(dir), root, step) != 0 || strlen(dir) > CKPT_PATH_MAX - 64) {
        return rg_error(RG_EINVAL, "rg_ckpt_reader_open: bad arguments");
    }
    ckpt_fmt(path, sizeof(path), "%s/%s", dir, CKPT_MANIFEST_NAME);
    st = ckpt_read_file(path, CKPT_MAX_TEXT + (size_t)RG_CKPT_MAX_WORLD * 64, &text, &len);
    if (st == RG_ENOENT) {
        return rg_error(RG_ENOENT, "no committed checkpoint at step %" PRId64 " in %s", step,
                        root);
    }
    if (st != RG_OK) {
        return st;
    }
    st = ckpt_manifest_parse(text, len, &m);
    free(text);
    if (st != RG_OK) {
        return rg_error_wrap(st, "%s", path);
    }
    if (m.step != step) {
        ckpt_manifest_cleanup(&m);
        return rg_error(RG_ECORRUPT, "%s is for step %" PRId64, path, m.step);
    }
    rd = calloc(1, sizeof(*rd));
    if (rd == NULL) {
        ckpt_manifest_cleanup(&m);
        return rg_error(RG_ENOMEM, "no memory for a checkpoint reader");
    }
    rd->step = step;
    rd->world_size = m.world_size;
    rd->shards = calloc(m.world_size, sizeof(*rd->shards));
    if (rd->shards == NULL) {
        rd->world_size = 0;
        st = rg_error(RG_ENOMEM, "no memory for a checkpoint reader");
        goto err_close;
    }
    for (uint32_t r = 0; r < m.world_size; r++) {
        rd->shards[r].fd = -1;
    }
    for (int i = 0; i < READER_THREADS; i++) {
        rd->dec[i].dctx = ZSTD_createDCtx();
        if (rd->dec[i].dctx == NULL) {
            st = rg_error(RG_ENOMEM, "no memory for a checkpoint reader");
            goto err_close;
        }
    }
    for (uint32_t r = 0; r < m.world_size; r++) {
        st = reader_open_shard(rd, dir, r, &m.shards[r]);
        if (st != RG_OK) {
            goto err_close;
        }
    }
    st = reader_build_pieces(rd);
    if (st != RG_OK) {
        goto err_close;
    }
    ckpt_manifest_cleanup(&m);
    *reader_p = rd;
    return RG_OK;
err_close:
    ckpt_manifest_cleanup(&m);
    rg_ckpt_reader_close(rd);
    return st;
}

void rg_ckpt_reader_close(rg_ckpt_reader_t *rd)
{
    if (rd == NULL) {
        return;
    }
    for (uint32_t r = 0; rd->shards != NULL && r < rd->world_size; r++) {
        if (rd->shards[r].fd >= 0) {
            close(rd->shards[r].fd);
        }
        ckpt_index_cleanup(&rd->shards[r].idx);
    }
    free(rd->shards);
    free(rd->pieces);
    for (int i = 0; i < READER_THREADS; i++) {
        ZSTD_freeDCtx(rd->dec[i].dctx);
        free(rd->dec[i].comp);
        free(rd->dec[i].raw);
        free(rd->dec[i].raw2);
    }
    free(rd);
}

int64_t rg_ckpt_reader_step(const rg_ckpt_reader_t *rd)
{
    return rd->step;
}

/* The first piece of a tensor, or NULL. */
static const reader_piece_t *reader_find(const rg_ckpt_reader_t *rd, const char *name,
                                         size_t *at)
{
    size_t lo = 0;
    size_t hi = rd->n_pieces;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(rd->pieces[mid].t->name, name) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == rd->n_pieces || strcmp(rd->pieces[lo].t->name, name) != 0) {
        return NULL;
    }
    *at = lo;
    return &rd->pieces[lo];
}

rg_status_t rg_ckpt_reader_info(const rg_ckpt_reader_t *rd, const char *name,
                                rg_ckpt_tensor_info_t *info)
{
    size_t at;
    const reader_piece_t *p = (rd && name && info) ? reader_find(rd, name, &at) : NULL;

    if (p == NULL) {
        return rg_error(RG_ENOENT, "no tensor %s in the checkpoint", name ? name : "(null)");
    }
    info->dtype = p->t->dtype;
    info->ndim = p->t->ndim;
    memcpy(info->shape, p->t->shape, sizeof(info->shape));
    info->replicated = (p->t->flags & RG_CKPT_REPLICATED) != 0;
    return RG_OK;
}

/* Reads, verifies and decodes one chunk; *out points into the decoder's buffers. */
static rg_status_t reader_chunk(reader_decoder_t *d, const reader_shard_t *sh,
                                const ckpt_tensor_meta_t *t, const ckpt_chunk_meta_t *ch,
                                const uint8_t **out)
{
    size_t got;
    rg_status_t st;

    if (d->comp_cap < ch->comp_size || d->raw_cap < ch->raw_size) {
        size_t cc = RG_MAX(d->comp_cap, (size_t)ch->comp_size);
        size_t rc = RG_MAX(d->raw_cap, (size_t)ch->raw_size);
        free(d->comp);
        free(d->raw);
        free(d->raw2);
        d->comp = malloc(cc);
        d->raw = malloc(rc);
        d->raw2 = malloc(rc);
        d->comp_cap = d->raw_cap = 0;
        if (d->comp == NULL || d->raw == NULL || d->raw2 == NULL) {
            return rg_error(RG_ENOMEM, "no memory to read a chunk");
        }
        d->comp_cap = cc;
        d->raw_cap = rc;
    }
    st = ckpt_pread_all(sh->fd, d->comp, ch->comp_size, ch->offset, sh->path);
    if (st != RG_OK) {
        return st;
    }
    if (ckpt_crc32c(0, d->comp, ch->comp_size) != ch->crc) {
        return rg_error(RG_ECORRUPT, "%s: checksum mismatch in chunk at offset %" PRIu64
                        " (tensor %s)", sh->path, ch->offset, t->name);
    }
    got = ZSTD_decompressDCtx(d->dctx, d->raw, ch->raw_size, d->comp, ch->comp_size);
    if (ZSTD_isError(got) || got != ch->raw_size) {
        return rg_error(RG_ECORRUPT, "%s: chunk at offset %" PRIu64 " (tensor %s) does not "
                        "decode: %s", sh->path, ch->offset, t->name,
                        ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size");
    }
    if (t->flags & RG_CKPT_SHUFFLE) {
        ckpt_unshuffle(d->raw2, d->raw, ch->raw_size, rg_dtype_size(t->dtype));
        *out = d->raw2;
    } else {
        *out = d->raw;
    }
    return RG_OK;
}

/* Adds a task per chunk overlapping bytes [lo, hi) of a piece, copied to dst. */
static size_t reader_piece_tasks(const rg_ckpt_reader_t *rd, const reader_piece_t *p,
                                 uint64_t lo, uint64_t hi, uint8_t *dst, reader_task_t *tasks)
{
    const reader_shard_t *sh = &rd->shards[p->shard];
    const ckpt_chunk_meta_t *chunks = sh->idx.chunks + p->t->first_chunk;
    size_t n = p->t->n_chunks;
    size_t a = 0;
    size_t b = n;
    size_t k = 0;

    while (a < b) {   /* first chunk that ends after lo */
        size_t mid = a + (b - a) / 2;
        if (chunks[mid].raw_offset + chunks[mid].raw_size <= lo) {
            a = mid + 1;
        } else {
            b = mid;
        }
    }
    for (size_t c = a; c < n && chunks[c].raw_offset < hi; c++) {
        uint64_t from = RG_MAX(lo, chunks[c].raw_offset);
        uint64_t to = RG_MIN(hi, chunks[c].raw_offset + chunks[c].raw_size);
        if (tasks != NULL) {
            tasks[k] = (reader_task_t){.sh = sh, .t = p->t, .ch = &chunks[c],
                                       .from = from - chunks[c].raw_offset, .len = to - from,
                                       .dst = dst + (from - lo)};
        }
        k++;
    }
    return k;
}

typedef struct {
    reader_task_t   *tasks;
    size_t           n;
    atomic_size_t    next;
    atomic_bool      failed;
    pthread_mutex_t  mu;
    rg_status_t      st;
    char             err[1024];
} reader_job_t;

typedef struct {
    reader_job_t     *job;
    reader_decoder_t *dec;
} reader_worker_t;

static void *reader_worker(void *arg)
{
    reader_worker_t *w = arg;
    reader_job_t *j = w->job;

    while (!atomic_load(&j->failed)) {
        size_t i = atomic_fetch_add(&j->next, 1);
        const reader_task_t *tk;
        const uint8_t *data = NULL;
        rg_status_t st;
        if (i >= j->n) {
            break;
        }
        tk = &j->tasks[i];
        st = reader_chunk(w->dec, tk->sh, tk->t, tk->ch, &data);
        if (st != RG_OK) {
            pthread_mutex_lock(&j->mu);
            if (!atomic_load(&j->failed)) {
                j->st = st;
                ckpt_fmt(j->err, sizeof(j->err), "%s", rg_last_error());
                atomic_store(&j->failed, true);
            }
            pthread_mutex_unlock(&j->mu);
            break;
        }
        memcpy(tk->dst, data + tk->from, tk->len);
    }
    return NULL;
}

/* Decodes the tasks on the caller's thread and, when there are several, on more. */
static rg_status_t reader_run(rg_ckpt_reader_t *rd, reader_task_t *tasks, size_t n)
{
    reader_job_t j = {.tasks = tasks, .n = n, .st = RG_OK};
    reader_worker_t w[READER_THREADS];
    pthread_t th[READER_THREADS];
    int started = 0;

    pthread_mutex_init(&j.mu, NULL);
    for (int i = 0; i < READER_THREADS; i++) {
        w[i] = (reader_worker_t){.job = &j, .dec = &rd->dec[i]};
    }
    for (int i = 1; i < READER_THREADS && (size_t)i < n; i++) {
        if (pthread_create(&th[i], NULL, reader_worker, &w[i]) != 0) {
            break;      /* fewer threads: the work still gets done */
        }
        started = i;
    }
    reader_worker(&w[0]);
    for (int i = 1; i <= started; i++) {
        pthread_join(th[i], NULL);
    }
    pthread_mutex_destroy(&j.mu);
    if (j.st != RG_OK) {
        return rg_error(j.st, "%s", j.err);
    }
    return RG_OK;
}

rg_status_t rg_ckpt_reader_read(rg_ckpt_reader_t *rd, const rg_ckpt_request_t *req)
{
    const reader_piece_t *p;
    size_t at;
    uint64_t cursor;
    uint64_t end;
    uint64_t row_bytes;
    reader_task_t *tasks = NULL;
    size_t n_tasks = 0;
    rg_status_t st;

    if (rd == NULL || req == NULL || req->name == NULL) {
        return rg_error(RG_EINVAL, "rg_ckpt_reader_read: bad arguments");
    }
    p = reader_find(rd, req->name, &at);
    if (p == NULL) {
        return rg_error(RG_ENOENT, "step %" PRId64 " has no tensor %s", rd->step, req->name);
    }
    row_bytes = p->t->row_bytes;
    if (req->dtype != p->t->dtype || req->row_begin > p->t->shape[0] ||
        req->row_count > p->t->shape[0] - req->row_begin ||
        (row_bytes != 0 && req->row_count > UINT64_MAX / row_bytes) ||
        req->dst_bytes != req->row_count * row_bytes || (req->dst == NULL && req->dst_bytes)) {
        return rg_error(RG_EINVAL, "request for %s: dtype %d rows [%" PRIu64 ", +%" PRIu64
                        ") into %zu bytes does not fit the saved dtype %d, %" PRIu64 " rows of "
                        "%" PRIu64 " bytes", req->name, (int)req->dtype, req->row_begin,
                        req->row_count, req->dst_bytes, (int)p->t->dtype, p->t->shape[0],
                        row_bytes);
    }
    /* Two passes over the pieces in row order: count the chunks, then list them. */
    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0;
        cursor = req->row_begin;
        end = req->row_begin + req->row_count;
        for (size_t i = at; i < rd->n_pieces && cursor < end &&
                            strcmp(rd->pieces[i].t->name, req->name) == 0; i++) {
            const ckpt_tensor_meta_t *t = rd->pieces[i].t;
            uint64_t upto;
            if (t->row_begin + t->row_count <= cursor) {
                continue;
            }
            if (t->row_begin > cursor) {
                break;
            }
            upto = RG_MIN(end, t->row_begin + t->row_count);
            k += reader_piece_tasks(rd, &rd->pieces[i], (cursor - t->row_begin) * row_bytes,
                                    (upto - t->row_begin) * row_bytes,
                                    (uint8_t *)req->dst + (cursor - req->row_begin) * row_bytes,
                                    tasks ? tasks + k : NULL);
            cursor = upto;
        }
        if (cursor < end) {
            free(tasks);
            return rg_error(RG_ECORRUPT, "step %" PRId64 ": rows [%" PRIu64 ", %" PRIu64
                            ") of %s are in no shard", rd->step, cursor, end, req->name);
        }
        if (pass == 0) {
            n_tasks = k;
            tasks = malloc((n_tasks ? n_tasks : 1) * sizeof(*tasks));
            if (tasks == NULL) {
                return rg_error(RG_ENOMEM, "no memory to plan a read of %s", req->name);
            }
        }
    }
    st = reader_run(rd, tasks, n_tasks);
    free(tasks);
    return st;
}

rg_status_t rg_ckpt_verify(const char *root, int64_t step)
{
    rg_ckpt_reader_t *rd = NULL;
    rg_status_t st = rg_ckpt_reader_open(root, step, &rd);

    /* Every chunk of every shard, whether or not another shard holds the same rows. */
    for (uint32_t r = 0; st == RG_OK && r < (rd ? rd->world_size : 0); r++) {
        const ckpt_index_t *idx = &rd->shards[r].idx;
        for (size_t i = 0; st == RG_OK && i < idx->n_tensors; i++) {
            const ckpt_tensor_meta_t *t = &idx->tensors[i];
            for (uint32_t c = 0; st == RG_OK && c < t->n_chunks; c++) {
                const uint8_t *data;
                st = reader_chunk(&rd->dec[0], &rd->shards[r], t,
                                  &idx->chunks[t->first_chunk + c], &data);
            }
        }
    }
    rg_ckpt_reader_close(rd);
    return st;
}
