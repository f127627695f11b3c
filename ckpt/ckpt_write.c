/*
 * The shard writer, on the coordinator thread: header, chunks in order as the workers finish
 * them, index, footer; fsync; rename into place; then the shard's durable record. A failure
 * at any point removes the temp file and leaves no record, so the step cannot be committed.
 */
#include "ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Start writeback every this many bytes (see write_chunks). */
#define WRITEBACK_BYTES (8u << 20)

/*
 * Starts writeback of [flushed, off), then waits for the window before it and drops it from
 * the page cache. Without this the kernel would hold the whole shard in the page cache
 * until the final fsync, with the disk idle while chunks are compressed, and every save
 * would take fresh pages for its file (slow where fresh pages fault in from a hypervisor).
 * Hints only: the fsync at the end decides durability, so failures here are not errors.
 */
static void write_behind(int fd, uint64_t *dropped, uint64_t *flushed, uint64_t off)
{
    (void)sync_file_range(fd, (off_t)*flushed, (off_t)(off - *flushed), SYNC_FILE_RANGE_WRITE);
    if (*flushed > *dropped) {
        (void)sync_file_range(fd, (off_t)*dropped, (off_t)(*flushed - *dropped),
                              SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                  SYNC_FILE_RANGE_WAIT_AFTER);
        (void)posix_fadvise(fd, (off_t)*dropped, (off_t)(*flushed - *dropped),
                            POSIX_FADV_DONTNEED);
        *dropped = *flushed;
    }
    *flushed = off;
}

/* Writes the chunks in order as workers finish them; fills the index's chunk entries. */
static rg_status_t write_chunks(rg_ckpt_t *ck, int fd, const char *path, uint64_t *off,
                                ckpt_chunk_meta_t *metas)
{
    rg_status_t st = RG_OK;
    uint64_t flushed = 0;
    uint64_t dropped = 0;

    pthread_mutex_lock(&ck->mu);
    ck->compressing = true;
    pthread_cond_broadcast(&ck->work_cv);
    for (size_t i = 0; i < ck->n_chunks; i++) {
        save_chunk_t *ch = &ck->chunks[i];
        while (!ch->done) {
            pthread_cond_wait(&ck->done_cv, &ck->mu);
        }
        if (ch->st != RG_OK) {
            st = rg_error(ch->st, "compressing a chunk of tensor %s failed",
                          ck->tensors[ch->tensor].name);
            break;
        }
        pthread_mutex_unlock(&ck->mu);
        st = ckpt_write_all(fd, ck->slots[ch->slot], ch->comp_size, path);
        metas[i].offset = *off;
        metas[i].comp_size = ch->comp_size;
        metas[i].raw_size = ch->raw_size;
        metas[i].crc = ch->crc;
        *off += ch->comp_size;
        if (st == RG_OK && *off - flushed >= WRITEBACK_BYTES) {
            write_behind(fd, &dropped, &flushed, *off);
        }
        pthread_mutex_lock(&ck->mu);
        if (st != RG_OK) {
            break;
        }
        ck->next_write = i + 1;
        pthread_cond_broadcast(&ck->work_cv);
    }
    /* On failure, let the chunks being compressed finish before the slots are reused. */
    ck->abort = true;
    while (ck->inflight > 0) {
        pthread_cond_wait(&ck->done_cv, &ck->mu);
    }
    ck->compressing = false;
    pthread_mutex_unlock(&ck->mu);
    return st;
}

static rg_status_t write_index(rg_ckpt_t *ck, int fd, const char *path, uint64_t off,
                               ckpt_chunk_meta_t *chunks, ckpt_shard_sum_t *sum)
{
    ckpt_index_t idx = {.tensors = ck->tensors, .n_tensors = ck->n_tensors,
                        .chunks = chunks, .n_chunks = ck->n_chunks};
    ckpt_footer_t foot;
    uint8_t fbuf[CKPT_FOOTER_SIZE];
    uint8_t *ibuf;
    size_t ilen;
    rg_status_t st;

    st = ckpt_index_encode(&idx, &ibuf, &ilen);
    if (st != RG_OK) {
        return st;
    }
    foot.index_offset = off;
    foot.index_size = ilen;
    foot.index_crc = ckpt_crc32c(0, ibuf, ilen);
    ckpt_footer_encode(&foot, fbuf);
    st = ckpt_write_all(fd, ibuf, ilen, path);
    free(ibuf);
    if (st == RG_OK) {
        st = ckpt_write_all(fd, fbuf, sizeof(fbuf), path);
    }
    sum->size = off + ilen + CKPT_FOOTER_SIZE;
    sum->checksum = foot.index_crc;
    return st;
}

static rg_status_t write_shard(rg_ckpt_t *ck, const char *dir, const char *tmp,
                               const char *final, ckpt_shard_sum_t *sum)
{
    ckpt_header_t h = {.step = ck->step, .rank = (uint32_t)ck->rank,
                       .world_size = (uint32_t)ck->world_size, .chunk_bytes = ck->chunk_bytes};
    uint8_t hbuf[CKPT_HEADER_SIZE];
    ckpt_chunk_meta_t *chunks;
    uint64_t off = CKPT_HEADER_SIZE;
    rg_status_t st;
    int fd;
    int err;

    for (size_t i = 0; i < ck->n_tensors; i++) {
        /* The index records the filter as applied. */
        ck->tensors[i].flags &= RG_CKPT_SHUFFLE | RG_CKPT_REPLICATED;
    }
    chunks = calloc(ck->n_chunks ? ck->n_chunks : 1, sizeof(*chunks));
    if (chunks == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a shard index");
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        err = errno;
        st = rg_error(ckpt_errno_status(err), "create %s: %s", tmp, strerror(err));
        goto err_free;
    }
    ckpt_header_encode(&h, hbuf);
    st = ckpt_write_all(fd, hbuf, sizeof(hbuf), tmp);
    uint64_t t0 = rg_now_ns();
    if (st == RG_OK) {
        st = write_chunks(ck, fd, tmp, &off, chunks);
    }
    uint64_t t1 = rg_now_ns();
    if (st == RG_OK) {
        st = write_index(ck, fd, tmp, off, chunks, sum);
    }
    st = ckpt_finish_tmp(fd, st, tmp, final, dir, true);
    rg_debug("shard step %" PRId64 ": chunks %.1f ms, index+fsync+rename %.1f ms", ck->step,
             (double)(t1 - t0) * 1e-6, (double)(rg_now_ns() - t1) * 1e-6);
err_free:
    free(chunks);
    return st;
}

rg_status_t ckpt_save_run(rg_ckpt_t *ck)
{
    char dir[CKPT_PATH_MAX];
    char tmp[CKPT_PATH_MAX];
    char final[CKPT_PATH_MAX];
    char rec[CKPT_PATH_MAX];
    char rec_name[64];
    ckpt_record_t record = {.step = ck->step, .rank = (uint32_t)ck->rank,
                            .world_size = (uint32_t)ck->world_size, .attempt = ck->attempt};
    rg_dbuf_t text;
    rg_status_t st;

    ckpt_fmt(rec_name, sizeof(rec_name), "shard-%05d.rec", ck->rank);
    if (ckpt_step_dir(dir, sizeof(dir), ck->root, ck->step) != 0 ||
        !ckpt_fmt(tmp, sizeof(tmp), "%s/.shard-%05d.rgs.tmp", dir, ck->rank) ||
        !ckpt_fmt(final, sizeof(final), "%s/shard-%05d.rgs", dir, ck->rank) ||
        !ckpt_fmt(rec, sizeof(rec), "%s/%s", dir, rec_name)) {
        return rg_error(RG_EINVAL, "checkpoint path too long");
    }
    st = ckpt_mkdir(dir);
    if (st != RG_OK) {
        return rg_error_wrap(st, "checkpoint step %" PRId64, ck->step);
    }
    /* A leftover of an earlier attempt at this step must not count as this one's. */
    if ((unlink(rec) != 0 && errno != ENOENT) || (unlink(final) != 0 && errno != ENOENT)) {
        int err = errno;
        return rg_error(ckpt_errno_status(err), "removing the old shard of step %" PRId64
                        " in %s: %s", ck->step, dir, strerror(err));
    }
    st = write_shard(ck, dir, tmp, final, &record.sum);
    if (st != RG_OK) {
        return st;
    }
    rg_dbuf_init(&text, CKPT_MAX_TEXT);
    st = ckpt_record_encode(&record, &text);
    if (st == RG_OK) {
        st = ckpt_write_file_atomic(dir, rec_name, text.data, text.len);
    }
    rg_dbuf_cleanup(&text);
    if (st != RG_OK || ck->rank != 0) {
        return st;
    }
    rg_debug("record step %" PRId64 " written", ck->step);
    ckpt_commit_args_t args = {.root = ck->root, .dir = dir, .step = ck->step,
                               .world_size = (uint32_t)ck->world_size,
                               .timeout_ms = ck->commit_timeout_ms, .etcd = ck->etcd,
                               .job = ck->job, .keep_last = ck->keep_last,
                               .keep_every = ck->keep_every, .attempt = ck->attempt,
                               .fence_agent = ck->fence_agent, .fence_lease = ck->fence_lease,
                               .fence_round = ck->fence_round};
    return ckpt_commit(&args);
}
