/*
 * Commit, on rank 0's coordinator thread: wait (with a deadline) until every rank's shard
 * record exists and matches its shard file, then write the MANIFEST atomically. The MANIFEST
 * is what makes a step exist; everything before it can be lost to a crash without harm.
 * Then: record the step in etcd, remove uncommitted older steps, apply retention.
 * Also the listing and cleanup calls of the public API.
 */
#include "ckpt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define COMMIT_POLL_MS 5

/* Checks rank r's record; true once it is there and matches its shard file. */
static bool commit_have_record(const ckpt_commit_args_t *a, uint32_t r, ckpt_shard_sum_t *sum,
                               char *why, size_t why_cap)
{
    char path[CKPT_PATH_MAX];
    char *buf = NULL;
    size_t len;
    ckpt_record_t rec;
    struct stat sb;
    bool ok = false;

    ckpt_fmt(path, sizeof(path), "%s/shard-%05" PRIu32 ".rec", a->dir, r);
    if (ckpt_read_file(path, CKPT_MAX_TEXT, &buf, &len) != RG_OK) {
        ckpt_fmt(why, why_cap, "%s", rg_last_error());
        return false;
    }
    if (ckpt_record_parse(buf, len, &rec) != RG_OK) {
        ckpt_fmt(why, why_cap, "%s: %s", path, rg_last_error());
    } else if (a->attempt != 0 && rec.attempt != a->attempt) {
        /* Left by an earlier attempt of the job at this step: this rank's record is still
         * to come (it removes the old one when its save starts). */
        ckpt_fmt(why, why_cap, "%s is from attempt %" PRIu64 ", not %" PRIu64, path,
                 rec.attempt, a->attempt);
    } else if (rec.step != a->step || rec.rank != r || rec.world_size != a->world_size) {
        ckpt_fmt(why, why_cap, "%s is for step %" PRId64 " rank %" PRIu32 " of %" PRIu32,
                 path, rec.step, rec.rank, rec.world_size);
    } else {
        ckpt_fmt(path, sizeof(path), "%s/shard-%05" PRIu32 ".rgs", a->dir, r);
        if (stat(path, &sb) != 0 || (uint64_t)sb.st_size != rec.sum.size) {
            ckpt_fmt(why, why_cap, "%s is missing or not %" PRIu64 " bytes", path,
                     rec.sum.size);
        } else {
            *sum = rec.sum;
            ok = true;
        }
    }
    free(buf);
    return ok;
}

static void commit_cleanup(const ckpt_commit_args_t *a)
{
    int64_t *steps = NULL;
    size_t n = 0;
    size_t kept = 0;
    char dir[CKPT_PATH_MAX];
    char manifest[CKPT_PATH_MAX];
    struct stat sb;

    if (ckpt_list_steps(a->root, false, &steps, &n) != RG_OK) {
        rg_warn("checkpoint retention: %s", rg_last_error());
        return;
    }
    for (size_t i = 0; i < n; i++) {     /* newest first */
        bool committed;
        bool keep;
        if (ckpt_step_dir(dir, sizeof(dir), a->root, steps[i]) != 0) {
            continue;
        }
        ckpt_fmt(manifest, sizeof(manifest), "%s/%s", dir, CKPT_MANIFEST_NAME);
        committed = stat(manifest, &sb) == 0;
        if (!committed) {
            /* Newer uncommitted steps may be in flight on other ranks: leave them. */
            keep = steps[i] > a->step;
        } else {
            keep = a->keep_last == 0 || kept < a->keep_last ||
                   (a->keep_every != 0 && (uint64_t)steps[i] % a->keep_every == 0);
            kept++;
        }
        if (keep) {
            continue;
        }
        rg_info("checkpoint: removing %s step %" PRId64, committed ? "old" : "uncommitted",
                steps[i]);
        if (ckpt_remove_step_dir(dir) != RG_OK) {
            rg_warn("checkpoint retention: %s", rg_last_error());
        }
    }
    free(steps);
}

rg_status_t ckpt_commit(const ckpt_commit_args_t *a)
{
    ckpt_manifest_t m = {.step = a->step, .world_size = a->world_size};
    rg_deadline_t deadline = rg_deadline_in_ms(a->timeout_ms);
    bool *have = calloc(a->world_size, sizeof(*have));
    uint32_t missing = a->world_size;
    char why[512] = "";
    rg_dbuf_t text;
    rg_status_t st;

    m.shards = calloc(a->world_size, sizeof(*m.shards));
    if (have == NULL || m.shards == NULL) {
        st = rg_error(RG_ENOMEM, "no memory to commit step %" PRId64, a->step);
        goto out_free;
    }
    /* Polling: the ranks may share nothing but this (possibly network) file system. The loop
     * ends by the deadline. */
    while (true) {
        for (uint32_t r = 0; r < a->world_size; r++) {
            if (!have[r] && commit_have_record(a, r, &m.shards[r], why, sizeof(why))) {
                have[r] = true;
                missing--;
            }
        }
        if (missing == 0) {
            break;
        }
        if (rg_deadline_passed(deadline)) {
            st = rg_error(RG_ETIMEDOUT, "commit of step %" PRId64 ": %" PRIu32 " of %" PRIu32
                          " shards not durable after %" PRId64 " ms (last: %s)", a->step,
                          missing, a->world_size, a->timeout_ms, why);
            goto out_free;
        }
        rg_sleep_ms(RG_MIN(COMMIT_POLL_MS, rg_deadline_left_ms(deadline)));
    }
    ckpt_fault_commit(a->step);
#ifdef RG_CKPT_WITH_ETCD
    if (a->etcd != NULL) {
        /* A writer that is no longer a member of the job's round commits nothing: the
         * MANIFEST is what makes the step exist for every later loader. */
        st = ckpt_etcd_fence_check(a);
        if (st != RG_OK) {
            goto out_free;
        }
    }
#endif
    rg_dbuf_init(&text, CKPT_MAX_TEXT + (size_t)a->world_size * 64);
    st = ckpt_manifest_encode(&m, &text);
    if (st == RG_OK) {
        st = ckpt_write_file_atomic(a->dir, CKPT_MANIFEST_NAME, text.data, text.len);
    }
    rg_dbuf_cleanup(&text);
    if (st != RG_OK) {
        st = rg_error_wrap(st, "commit of step %" PRId64, a->step);
        goto out_free;
    }
    rg_info("checkpoint step %" PRId64 " committed (%" PRIu32 " shards)", a->step,
            a->world_size);
#ifdef RG_CKPT_WITH_ETCD
    if (a->etcd != NULL) {
        st = ckpt_etcd_record(a);
        if (st == RG_ELEASE) {
            /* Fenced between the check and now (the membership ended while the MANIFEST was
             * written): take the step back, it was never the job's. */
            char msg[1024];
            snprintf(msg, sizeof(msg), "%s", rg_last_error());
            rg_warn("checkpoint step %" PRId64 ": %s; removing it", a->step, msg);
            if (ckpt_remove_step_dir(a->dir) != RG_OK) {
                rg_warn("cannot remove %s: %s", a->dir, rg_last_error());
            }
            st = rg_error(RG_ELEASE, "%s", msg);
            goto out_free;
        }
        if (st != RG_OK) {
            /* The step is committed on disk (loaders find it there); say so. */
            st = rg_error_wrap(st, "step %" PRId64 " committed on disk but not in etcd",
                               a->step);
        }
    }
#endif
    rg_debug("step %" PRId64 " manifest and etcd done", a->step);
    commit_cleanup(a);
    rg_debug("step %" PRId64 " retention done", a->step);
out_free:
    free(m.shards);
    free(have);
    return st;
}

/* ---- public: list and cleanup ---------------------------------------------------------- */

rg_status_t rg_ckpt_list(const char *root, int64_t **steps_p, size_t *n_p)
{
    if (root == NULL || steps_p == NULL || n_p == NULL) {
        return rg_error(RG_EINVAL, "rg_ckpt_list: bad arguments");
    }
    return ckpt_list_steps(root, true, steps_p, n_p);
}

rg_status_t rg_ckpt_cleanup(const char *root, size_t *removed_p)
{
    int64_t *steps = NULL;
    size_t n = 0;
    size_t removed = 0;
    char dir[CKPT_PATH_MAX];
    char manifest[CKPT_PATH_MAX];
    struct stat sb;
    rg_status_t st;

    if (root == NULL) {
        return rg_error(RG_EINVAL, "rg_ckpt_cleanup: no root");
    }
    st = ckpt_list_steps(root, false, &steps, &n);
    if (st != RG_OK) {
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        if (ckpt_step_dir(dir, sizeof(dir), root, steps[i]) != 0) {
            continue;
        }
        ckpt_fmt(manifest, sizeof(manifest), "%s/%s", dir, CKPT_MANIFEST_NAME);
        if (stat(manifest, &sb) == 0) {
            continue;
        }
        st = ckpt_remove_step_dir(dir);
        if (st != RG_OK) {
            break;
        }
        removed++;
    }
    free(steps);
    if (st == RG_OK && removed_p != NULL) {
        *removed_p = removed;
    }
    return st;
}

rg_status_t rg_ckpt_remove(const char *root, int64_t step)
{
    char dir[CKPT_PATH_MAX];

    if (root == NULL || step < 0 || ckpt_step_dir(dir, sizeof(dir), root, step) != 0) {
        return rg_error(RG_EINVAL, "rg_ckpt_remove: need a root and a step >= 0");
    }
    /* The MANIFEST goes first (and durably): the step stops existing before its files go. */
    rg_info("checkpoint: removing step %" PRId64 " on request", step);
    return ckpt_remove_step_dir(dir);
}
