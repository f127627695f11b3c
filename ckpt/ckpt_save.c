/*
 * The asynchronous saver. rg_ckpt_save() copies the tensors into the staging buffer and hands
 * the job to the coordinator thread; `threads` worker threads shuffle and compress chunks
 * into a ring of output slots, and the coordinator writes the slots in chunk order, so the
 * file is written sequentially while compression runs on every core. The ring bounds memory:
 * a worker takes chunk i only once chunk i - n_slots has been written.
 */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

static void *worker_main(void *arg);
static void *coord_main(void *arg);

/* ---- the handle ------------------------------------------------------------------------ */

static rg_ckpt_save_t *save_handle_new(int64_t step, int64_t wait_ms)
{
    rg_ckpt_save_t *s = calloc(1, sizeof(*s));
    pthread_condattr_t ca;

    if (s == NULL) {
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->refs = 2;   /* the caller's and the coordinator's */
    s->status = RG_INPROGRESS;
    s->step = step;
    s->wait_ms = wait_ms;
    return s;
}

static void save_handle_finish(rg_ckpt_save_t *s, rg_status_t st, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    s->status = st;
    snprintf(s->err, sizeof(s->err), "%s", st == RG_OK ? "" : msg);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void rg_ckpt_save_release(rg_ckpt_save_t *s)
{
    if (s == NULL || atomic_fetch_sub(&s->refs, 1) != 1) {
        return;
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

rg_status_t rg_ckpt_save_status(rg_ckpt_save_t *s)
{
    rg_status_t st;
    pthread_mutex_lock(&s->mu);
    st = s->status;
    pthread_mutex_unlock(&s->mu);
    return st;
}

const char *rg_ckpt_save_error(rg_ckpt_save_t *s)
{
    return rg_ckpt_save_status(s) == RG_INPROGRESS ? "" : s->err;
}

rg_status_t rg_ckpt_save_wait(rg_ckpt_save_t *s, rg_deadline_t deadline)
{
    rg_status_t st;

    if (deadline == RG_DEADLINE_DEFAULT) {
        deadline = rg_deadline_in_ms(s->wait_ms);
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                          .tv_nsec = (long)(deadline % 1000000000ull)};

    pthread_mutex_lock(&s->mu);
    while (s->status == RG_INPROGRESS) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT &&
            s->status == RG_INPROGRESS) {
            pthread_mutex_unlock(&s->mu);
            return rg_error(RG_ETIMEDOUT, "checkpoint step %" PRId64 " still saving", s->step);
        }
    }
    st = s->status;
    pthread_mutex_unlock(&s->mu);
    if (st != RG_OK) {
        return rg_error(st, "%s", s->err);
    }
    return RG_OK;
}

/* ---- create / destroy ------------------------------------------------------------------ */

rg_status_t rg_ckpt_create(const rg_ckpt_params_t *p, rg_ckpt_t **ckpt_p)
{
    rg_ckpt_t *ck;
    rg_status_t st;

    if (p == NULL || p->root == NULL || p->root[0] == '\0' || p->world_size < 1 ||
        p->world_size > RG_CKPT_MAX_WORLD || p->rank < 0 || p->rank >= p->world_size ||
        p->threads < 0 || p->threads > 256 || p->level < 0 || p->level > ZSTD_maxCLevel() ||
        p->commit_timeout_ms < 0 || p->busy_timeout_ms < 0 || (p->etcd != NULL && (p->job == NULL || p->job[0] == '\0'))) {
        return rg_error(RG_EINVAL, "checkpoint params: need a root, 0 <= rank < world_size "
                        "<= %d, threads <= 256, a zstd level <= %d, and a job with etcd",
                        RG_CKPT_MAX_WORLD, ZSTD_maxCLevel());
    }
#ifndef RG_CKPT_WITH_ETCD
    if (p->etcd != NULL) {
        return rg_error(RG_ENOTSUP, "checkpoint commits in etcd need a build with rendezvous/");
    }
#endif
    if (strlen(p->root) > CKPT_PATH_MAX - 64) {
        return rg_error(RG_EINVAL, "checkpoint root path too long");
    }
    if (p->chunk_bytes != 0 && (p->chunk_bytes < 4096 || p->chunk_bytes > CKPT_MAX_CHUNK)) {
        return rg_error(RG_EINVAL, "checkpoint chunk_bytes %zu not in [4096, %u]",
                        p->chunk_bytes, CKPT_MAX_CHUNK);
    }
    ck = calloc(1, sizeof(*ck));
    if (ck == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a checkpointer");
    }
    ck->root = rg_strdup(p->root);
    ck->job = rg_strdup(p->job);
    ck->rank = p->rank;
    ck->world_size = p->world_size;
    ck->n_threads = p->threads ? p->threads : 2;
    /* Chunks hold whole elements of every dtype, whatever the caller asked. */
    ck->chunk_bytes = (p->chunk_bytes ? p->chunk_bytes : CKPT_DEFAULT_CHUNK) & ~(size_t)7;
    ck->level = p->level ? p->level : 1;
    ck->keep_last = p->keep_last;
    ck->keep_every = p->keep_every;
    ck->commit_timeout_ms = p->commit_timeout_ms ? p->commit_timeout_ms : 120000;
    ck->busy_timeout_ms = p->busy_timeout_ms ? p->busy_timeout_ms : 600000;
    ck->attempt = p->attempt;
    ck->etcd = p->etcd;
    ck->fence_agent = p->fence_agent != NULL ? rg_strdup(p->fence_agent) : NULL;
    ck->fence_lease = p->fence_lease;
    ck->fence_round = p->fence_round;
    pthread_mutex_init(&ck->mu, NULL);
    pthread_cond_init(&ck->work_cv, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&ck->done_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (ck->root == NULL || (p->job != NULL && ck->job == NULL) ||
        (p->fence_agent != NULL && ck->fence_agent == NULL)) {
        st = rg_error(RG_ENOMEM, "no memory for a checkpointer");
        goto err_free;
    }
    st = ckpt_mkdir(ck->root);
    if (st != RG_OK) {
        goto err_free;
    }
    if (p->staging_bytes > 0) {
        ck->staging = malloc(p->staging_bytes);
        if (ck->staging == NULL) {
            st = rg_error(RG_ENOMEM, "no memory for a %zu-byte staging buffer",
                          p->staging_bytes);
            goto err_free;
        }
        /* Touch every page now, so that no save pays for the page faults. Not zeros: a
         * compiler may turn malloc + memset(0) into calloc, which touches nothing. */
        memset(ck->staging, 0xa5, p->staging_bytes);
        ck->staging_cap = p->staging_bytes;
    }
    ck->n_slots = 4 * (size_t)ck->n_threads + 4;
    ck->slot_cap = ZSTD_compressBound(ck->chunk_bytes);
    ck->slots = calloc(ck->n_slots, sizeof(*ck->slots));
    ck->workers = calloc((size_t)ck->n_threads, sizeof(*ck->workers));
    if (ck->slots == NULL || ck->workers == NULL) {
        st = rg_error(RG_ENOMEM, "no memory for checkpoint threads");
        goto err_free;
    }
    for (size_t i = 0; i < ck->n_slots; i++) {
        ck->slots[i] = malloc(ck->slot_cap);
        if (ck->slots[i] == NULL) {
            st = rg_error(RG_ENOMEM, "no memory for checkpoint output slots");
            goto err_free;
        }
    }
    if (pthread_create(&ck->coord, NULL, coord_main, ck) != 0) {
        st = rg_error(RG_ESYS, "cannot start the checkpoint writer thread");
        goto err_free;
    }
    ck->coord_started = true;
    for (int i = 0; i < ck->n_threads; i++) {
        if (pthread_create(&ck->workers[i], NULL, worker_main, ck) != 0) {
            st = rg_error(RG_ESYS, "cannot start checkpoint compression threads");
            goto err_free;
        }
        ck->n_started++;
    }
    *ckpt_p = ck;
    return RG_OK;
err_free:
    rg_ckpt_destroy(ck);
    return st;
}

void rg_ckpt_destroy(rg_ckpt_t *ck)
{
    if (ck == NULL) {
        return;
    }
    pthread_mutex_lock(&ck->mu);
    while (ck->busy) {
        pthread_cond_wait(&ck->done_cv, &ck->mu);
    }
    ck->stop = true;
    pthread_cond_broadcast(&ck->work_cv);
    pthread_mutex_unlock(&ck->mu);
    for (int i = 0; i < ck->n_started; i++) {
        pthread_join(ck->workers[i], NULL);
    }
    if (ck->coord_started) {
        pthread_join(ck->coord, NULL);
    }
    for (size_t i = 0; ck->slots != NULL && i < ck->n_slots; i++) {
        free(ck->slots[i]);
    }
    free(ck->slots);
    free(ck->workers);
    free(ck->staging);
    free(ck->root);
    free(ck->job);
    free(ck->fence_agent);
    pthread_cond_destroy(&ck->done_cv);
    pthread_cond_destroy(&ck->work_cv);
    pthread_mutex_destroy(&ck->mu);
    free(ck);
}

/* ---- save: the caller's part ----------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const ckpt_tensor_meta_t *)a)->name, ((const ckpt_tensor_meta_t *)b)->name);
}

/* Describes the tensors (validating them) and counts the chunks. */
static rg_status_t save_describe(rg_ckpt_t *ck, const rg_ckpt_tensor_t *tensors, size_t n,
                                 ckpt_tensor_meta_t **metas_p, size_t *n_chunks_p,
                                 size_t *total_p)
{
    ckpt_tensor_meta_t *m = calloc(n ? n : 1, sizeof(*m));
    ckpt_tensor_meta_t *sorted = NULL;
    size_t n_chunks = 0;
    size_t total = 0;
    rg_status_t st;

    if (m == NULL) {
        return rg_error(RG_ENOMEM, "no memory to describe %zu tensors", n);
    }
    for (size_t i = 0; i < n; i++) {
        const rg_ckpt_tensor_t *t = &tensors[i];
        size_t nl = t->name ? strlen(t->name) : 0;
        if (nl == 0 || nl > RG_CKPT_MAX_NAME || t->ndim < 1 || t->ndim > RG_CKPT_MAX_DIMS ||
            (t->flags & ~(RG_CKPT_SHUFFLE | RG_CKPT_NOSHUFFLE | RG_CKPT_REPLICATED)) != 0) {
            st = rg_error(RG_EINVAL, "tensor %zu: bad name, ndim or flags", i);
            goto err_free;
        }
        memcpy(m[i].name, t->name, nl + 1);
        m[i].dtype = t->dtype;
        m[i].ndim = t->ndim;
        memcpy(m[i].shape, t->shape, sizeof(m[i].shape));
        m[i].row_begin = t->row_begin;
        m[i].row_count = t->row_count;
        st = ckpt_tensor_sizes(&m[i]);
        if (st != RG_OK) {
            goto err_free;
        }
        if ((t->flags & RG_CKPT_REPLICATED) &&
            (t->row_begin != 0 || t->row_count != t->shape[0])) {
            st = rg_error(RG_EINVAL, "tensor %s: a replicated tensor is saved whole", t->name);
            goto err_free;
        }
        if (m[i].bytes > 0 && t->data == NULL) {
            st = rg_error(RG_EINVAL, "tensor %s: no data", t->name);
            goto err_free;
        }
        m[i].flags = t->flags & RG_CKPT_REPLICATED;
        if (rg_dtype_size(t->dtype) > 1 && !(t->flags & RG_CKPT_NOSHUFFLE) &&
            ((t->flags & RG_CKPT_SHUFFLE) || rg_dtype_is_float(t->dtype))) {
            m[i].flags |= RG_CKPT_SHUFFLE;
        }
        m[i].first_chunk = (uint32_t)n_chunks;
        m[i].n_chunks = (uint32_t)((m[i].bytes + ck->chunk_bytes - 1) / ck->chunk_bytes);
        n_chunks += m[i].n_chunks;
        total += (m[i].bytes + 63) & ~(size_t)63;
        if (n_chunks > CKPT_MAX_CHUNKS) {
            st = rg_error(RG_ETOOBIG, "checkpoint of more than %u chunks", CKPT_MAX_CHUNKS);
            goto err_free;
        }
    }
    sorted = malloc((n ? n : 1) * sizeof(*sorted));
    if (sorted == NULL) {
        st = rg_error(RG_ENOMEM, "no memory to describe %zu tensors", n);
        goto err_free;
    }
    memcpy(sorted, m, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), name_cmp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
            st = rg_error(RG_EINVAL, "tensor name %s appears twice", sorted[i].name);
            goto err_free;
        }
    }
    free(sorted);
    *metas_p = m;
    *n_chunks_p = n_chunks;
    *total_p = total;
    return RG_OK;
err_free:
    free(sorted);
    free(m);
    return st;
}

rg_status_t rg_ckpt_save(rg_ckpt_t *ck, int64_t step, const rg_ckpt_tensor_t *tensors,
                         size_t n_tensors, unsigned flags, rg_ckpt_save_t **save_p)
{
    ckpt_tensor_meta_t *metas = NULL;
    save_chunk_t *chunks = NULL;
    rg_ckpt_save_t *handle = NULL;
    size_t n_chunks = 0;
    size_t total = 0;
    size_t off = 0;
    size_t c = 0;
    char path[CKPT_PATH_MAX];
    struct stat sb;
    rg_status_t st;

    if (ck == NULL || save_p == NULL || step < 0 || (n_tensors > 0 && tensors == NULL) ||
        n_tensors > CKPT_MAX_TENSORS || (flags & ~RG_CKPT_SAVE_SKIP_IF_BUSY) != 0) {
        return rg_error(RG_EINVAL, "rg_ckpt_save: bad arguments");
    }
    st = save_describe(ck, tensors, n_tensors, &metas, &n_chunks, &total);
    if (st != RG_OK) {
        return st;
    }
    pthread_mutex_lock(&ck->mu);
    if (ck->busy && (flags & RG_CKPT_SAVE_SKIP_IF_BUSY)) {
        pthread_mutex_unlock(&ck->mu);
        st = rg_error(RG_EAGAIN, "checkpoint step %" PRId64 " skipped: a save is in flight",
                      step);
        goto err_free;
    }
    if (ck->busy) {
        rg_deadline_t deadline = rg_deadline_in_ms(ck->busy_timeout_ms);
        struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                              .tv_nsec = (long)(deadline % 1000000000ull)};
        while (ck->busy) {
            if (pthread_cond_timedwait(&ck->done_cv, &ck->mu, &ts) == ETIMEDOUT && ck->busy) {
                pthread_mutex_unlock(&ck->mu);
                st = rg_error(RG_ETIMEDOUT, "checkpoint step %" PRId64 " not started: the "
                              "save of step %" PRId64 " is still running after %" PRId64
                              " ms", step, ck->step, ck->busy_timeout_ms);
                goto err_free;
            }
        }
    }
    pthread_mutex_unlock(&ck->mu);

    if (ckpt_step_dir(path, sizeof(path), ck->root, step) != 0 ||
        strlen(path) + sizeof("/" CKPT_MANIFEST_NAME) > sizeof(path)) {
        st = rg_error(RG_EINVAL, "checkpoint path too long");
        goto err_free;
    }
    strcat(path, "/" CKPT_MANIFEST_NAME);
    if (stat(path, &sb) == 0) {
        st = rg_error(RG_EEXIST, "checkpoint step %" PRId64 " is already committed", step);
        goto err_free;
    }
    if (ck->staging_cap < total) {
        void *nb = malloc(total);
        if (nb == NULL) {
            st = rg_error(RG_ENOMEM, "no memory for a %zu-byte staging buffer", total);
            goto err_free;
        }
        if (ck->staging_cap > 0) {
            rg_info("checkpoint staging buffer grows from %zu to %zu bytes", ck->staging_cap,
                    total);
        }
        free(ck->staging);
        ck->staging = nb;
        ck->staging_cap = total;
    }
    chunks = calloc(n_chunks ? n_chunks : 1, sizeof(*chunks));
    handle = save_handle_new(step, ck->busy_timeout_ms);
    if (chunks == NULL || handle == NULL) {
        st = rg_error(RG_ENOMEM, "no memory to start a save");
        goto err_free;
    }
    /* The stall: one copy of the state into the (already touched) staging buffer. */
    for (size_t i = 0; i < n_tensors; i++) {
        if (metas[i].bytes > 0) {
            memcpy(ck->staging + off, tensors[i].data, metas[i].bytes);
        }
        for (uint64_t done = 0; done < metas[i].bytes; done += ck->chunk_bytes, c++) {
            chunks[c].tensor = i;
            chunks[c].src = ck->staging + off + done;
            chunks[c].raw_size = (uint32_t)RG_MIN(ck->chunk_bytes, metas[i].bytes - done);
        }
        off += (metas[i].bytes + 63) & ~(size_t)63;
    }
    pthread_mutex_lock(&ck->mu);
    ck->step = step;
    ck->tensors = metas;
    ck->n_tensors = n_tensors;
    ck->chunks = chunks;
    ck->n_chunks = n_chunks;
    ck->next_claim = 0;
    ck->next_write = 0;
    ck->inflight = 0;
    ck->abort = false;
    ck->compressing = false;
    ck->cur = handle;
    ck->busy = true;
    ck->job_ready = true;
    pthread_cond_broadcast(&ck->work_cv);
    pthread_mutex_unlock(&ck->mu);
    *save_p = handle;
    return RG_OK;
err_free:
    if (handle != NULL) {
        rg_ckpt_save_release(handle);   /* both references: nobody else has seen it */
        rg_ckpt_save_release(handle);
    }
    free(chunks);
    free(metas);
    return st;
}

/* ---- background threads ---------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    rg_ckpt_t *ck = arg;
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    uint8_t *scratch = malloc(ck->chunk_bytes);
    bool ok = cctx != NULL && scratch != NULL;

    if (ok) {
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, ck->level);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
    }
    pthread_mutex_lock(&ck->mu);
    while (true) {
        size_t i;
        save_chunk_t *ch;
        const ckpt_tensor_meta_t *t;
        const uint8_t *src;
        size_t r;
        rg_status_t st = RG_OK;

        while (!ck->stop && !(ck->compressing && !ck->abort && ck->next_claim < ck->n_chunks &&
                              ck->next_claim - ck->next_write < ck->n_slots)) {
            pthread_cond_wait(&ck->work_cv, &ck->mu);
        }
        if (ck->stop) {
            break;
        }
        i = ck->next_claim++;
        ck->inflight++;
        ch = &ck->chunks[i];
        t = &ck->tensors[ch->tensor];
        pthread_mutex_unlock(&ck->mu);

        ch->slot = i % ck->n_slots;
        src = ch->src;
        if (!ok) {
            st = RG_ENOMEM;
        } else {
            if (t->flags & RG_CKPT_SHUFFLE) {
                ckpt_shuffle(scratch, src, ch->raw_size, rg_dtype_size(t->dtype));
                src = scratch;
            }
            r = ZSTD_compress2(cctx, ck->slots[ch->slot], ck->slot_cap, src, ch->raw_size);
            if (ZSTD_isError(r)) {
                rg_error_log("zstd compression of a chunk of %s failed: %s", t->name,
                             ZSTD_getErrorName(r));
                st = RG_EIO;
            } else {
                ch->comp_size = (uint32_t)r;
                ch->crc = ckpt_crc32c(0, ck->slots[ch->slot], r);
            }
        }

        pthread_mutex_lock(&ck->mu);
        ch->st = st;
        ch->done = true;
        ck->inflight--;
        pthread_cond_broadcast(&ck->done_cv);
    }
    pthread_mutex_unlock(&ck->mu);
    free(scratch);
    ZSTD_freeCCtx(cctx);
    return NULL;
}

static void *coord_main(void *arg)
{
    rg_ckpt_t *ck = arg;

    pthread_mutex_lock(&ck->mu);
    while (true) {
        rg_status_t st;
        rg_ckpt_save_t *handle;

        while (!ck->stop && !ck->job_ready) {
            pthread_cond_wait(&ck->work_cv, &ck->mu);
        }
        if (ck->stop) {
            break;
        }
        ck->job_ready = false;
        pthread_mutex_unlock(&ck->mu);

        rg_error_clear();
        st = ckpt_save_run(ck);
        if (st != RG_OK) {
            rg_error_log("checkpoint step %" PRId64 " rank %d failed: %s", ck->step, ck->rank,
                         rg_last_error());
        } else {
            rg_info("checkpoint step %" PRId64 " rank %d saved", ck->step, ck->rank);
        }

        pthread_mutex_lock(&ck->mu);
        handle = ck->cur;
        free(ck->tensors);
        free(ck->chunks);
        ck->tensors = NULL;
        ck->chunks = NULL;
        ck->cur = NULL;
        save_handle_finish(handle, st, rg_last_error());
        rg_ckpt_save_release(handle);
        ck->busy = false;
        pthread_cond_broadcast(&ck->done_cv);
    }
    pthread_mutex_unlock(&ck->mu);
    return NULL;
}
