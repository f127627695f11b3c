/*
 * A worker's progress records (`workers/status/progress/<rank>`, docs/etcd-keys.md), written by a
 * thread of their own so that rg_report never waits on etcd.
 *
 * rg_report hands over the newest record with the fence of its round; one the thread has
 * not written yet is replaced (progress says where the job is, it is no log). The thread
 * writes it, fenced, with an etcd client of its own (a client is one connection, not shared
 * between threads). A write the fence refused is the job leaving this worker's round:
 * train_progress_fenced says which round, and rg_report regroups as it did when its own
 * write was refused, at the step after. Before, every record was an etcd round trip on the
 * step's path, twice a second per rank: a stall of the whole group whenever etcd was slow to
 * answer one (75 ms at the 99th percentile on the project's machine). A checkpoint's step
 * still waits for its record (train_progress_wait), so that no save of a round the job has
 * left is started; all records go through the one thread, in order.
 */
#include "train_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROGRESS_VAL_MAX 4096

struct train_progress {
    pthread_mutex_t lock;
    pthread_cond_t  cond;          /* a record was posted, or stop */
    pthread_t       thread;
    rg_etcd_t      *etcd;          /* the thread's */
    bool            stop;
    bool            pending;       /* the record below is not written yet */
    rdzv_fence_t    fence;
    char            key[RDZV_KEY_MAX];
    char            val[PROGRESS_VAL_MAX];
    int             fenced;        /* the round of the newest refused write, or -1 */
    uint64_t        posted;        /* records handed over, and written (or given up) */
    uint64_t        written;
    rg_status_t     last;          /* the result of the last one written */
    int64_t         timeout_ms;    /* the client's per-call timeout */
};

static void *progress_main(void *arg)
{
    train_progress_t *p = arg;
    rdzv_fence_t fence;
    char key[RDZV_KEY_MAX];
    char val[PROGRESS_VAL_MAX];

    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->pending && !p->stop) {
            pthread_cond_wait(&p->cond, &p->lock);
        }
        if (!p->pending) {
            break;   /* stopped, with nothing left to write */
        }
        fence = p->fence;
        memcpy(key, p->key, sizeof(key));
        memcpy(val, p->val, sizeof(val));
        p->pending = false;
        uint64_t seq = p->posted;
        pthread_mutex_unlock(&p->lock);
        /* Bounded by the client's timeout (rg_etcd_params_t.timeout_ms). */
        rg_status_t st = rdzv_fence_put(p->etcd, &fence, key, val, 0, 0, "the progress report");
        pthread_mutex_lock(&p->lock);
        if (st == RG_ELEASE) {
            p->fenced = RG_MAX(p->fenced, fence.round);
            rg_info("progress not published: %s", rg_last_error());
        } else if (st != RG_OK) {
            /* Progress is informational: training goes on without it. */
            rg_warn("progress report not published: %s", rg_last_error());
        }
        p->written = seq;
        p->last = st;
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

rg_status_t train_progress_start(const rg_etcd_params_t *params, train_progress_t **p_out)
{
    train_progress_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return rg_error(RG_ENOMEM, "progress publisher");
    }
    p->fenced = -1;
    p->timeout_ms = params->timeout_ms > 0 ? params->timeout_ms : 5000;
    rg_status_t st = rg_etcd_create(params, &p->etcd);
    if (st != RG_OK) {
        free(p);
        return st;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* the clock of rg_deadline_t */
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&p->thread, NULL, progress_main, p);
    if (rc != 0) {
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        rg_etcd_destroy(p->etcd);
        free(p);
        return rg_error(RG_ESYS, "progress publisher: pthread_create: %s", strerror(rc));
    }
    *p_out = p;
    return RG_OK;
}

void train_progress_post(train_progress_t *p, const rdzv_fence_t *fence, const char *key,
                         const char *val)
{
    size_t kn = strlen(key);
    size_t vn = strlen(val);
    if (kn >= sizeof(p->key) || vn >= sizeof(p->val)) {
        rg_warn("progress report not published: %zu bytes of key and %zu of value", kn, vn);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fence = *fence;
    memcpy(p->key, key, kn + 1);
    memcpy(p->val, val, vn + 1);
    p->pending = true;
    p->posted++;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

rg_status_t train_progress_wait(train_progress_t *p)
{
    /* The write is bounded by the client's timeout; twice that, and a second, bounds the
     * wait for the thread to get to it (a write of an earlier record before it). */
    int64_t ms = 2 * p->timeout_ms + 1000;
    rg_deadline_t deadline = rg_deadline_in_ms(ms);
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                          .tv_nsec = (long)(deadline % 1000000000ull)};
    rg_status_t st = RG_OK;
    pthread_mutex_lock(&p->lock);
    uint64_t seq = p->posted;
    while (p->written < seq && st == RG_OK) {
        if (pthread_cond_timedwait(&p->cond, &p->lock, &ts) == ETIMEDOUT) {
            st = rg_error(RG_ETIMEDOUT, "the progress report was not written within %lld ms",
                          (long long)ms);
        }
    }
    if (st == RG_OK && p->last == RG_ELEASE) {
        st = rg_error(RG_ELEASE, "the progress report of round %d was refused: the job has "
                      "left that round", p->fenced);
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

int train_progress_fenced(train_progress_t *p)
{
    pthread_mutex_lock(&p->lock);
    int r = p->fenced;
    pthread_mutex_unlock(&p->lock);
    return r;
}

void train_progress_stop(train_progress_t *p)
{
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->stop = true;   /* the thread writes what is pending first */
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    rg_etcd_destroy(p->etcd);
    free(p);
}
