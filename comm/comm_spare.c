/*
 * A UCX context and worker made before the group that uses them (rg_comm_spare_start).
 *
 * Making a worker (its shared-memory FIFOs, its tcp interface, its keepalive) costs 10 to
 * 70 ms on a loaded 2-core host, and a group's wire-up waits for the slowest rank's: it was
 * most of an in-place regroup's pause (docs/benchmarks.md). A spare made while the group
 * before it trains, or while the agents form the next round, takes it off that path.
 *
 * Ownership: the spare and its thread share the struct under its mutex. The owner takes the
 * context and worker (comm_spare_take) or lets the spare go (rg_comm_spare_destroy); if the
 * thread still runs then, the owner marks the spare abandoned and the thread releases what
 * it made, and the struct, when it ends. Neither ever waits for the other past a deadline
 * (COMM_SPARE_WAIT_MS).
 */
#include "comm_internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMM_SPARE_WAIT_MS 2000   /* at most, for a spare whose thread still runs */

struct rg_comm_spare {
    pthread_mutex_t mu;
    pthread_cond_t  cv;          /* done set; CLOCK_MONOTONIC, the clock of rg_deadline_t */
    int             size;        /* made for at most max(size, COMM_KEEPALIVE_MIN_EPS) ranks */
    bool            done;        /* the worker made, or its making failed */
    bool            abandoned;   /* the owner let it go while the thread ran */
    rg_status_t     status;
    char            error[256];
    ucp_context_h   ctx;
    ucp_worker_h    worker;
    bool            cuda;
};

static void spare_free(rg_comm_spare_t *spare)
{
    comm_ucx_unmake(spare->ctx, spare->worker);
    pthread_cond_destroy(&spare->cv);
    pthread_mutex_destroy(&spare->mu);
    free(spare);
}

static void spare_make(rg_comm_spare_t *spare)
{
    ucp_context_h ctx = NULL;
    ucp_worker_h worker = NULL;
    bool cuda = false;
    rg_status_t st = comm_ucx_make(spare->size, &ctx, &worker, &cuda);

    pthread_mutex_lock(&spare->mu);
    spare->status = st;
    if (st != RG_OK) {
        snprintf(spare->error, sizeof(spare->error), "%s", rg_last_error());
    }
    spare->ctx = ctx;
    spare->worker = worker;
    spare->cuda = cuda;
    spare->done = true;
    bool abandoned = spare->abandoned;
    pthread_cond_broadcast(&spare->cv);
    pthread_mutex_unlock(&spare->mu);
    if (abandoned) {
        spare_free(spare);
    }
}

static void *spare_thread(void *arg)
{
    spare_make(arg);
    return NULL;
}

rg_status_t rg_comm_spare_start(int size_hint, bool background, rg_comm_spare_t **spare_p)
{
    if (spare_p == NULL || size_hint < 1 || size_hint > RG_COMM_MAX_SIZE) {
        return rg_error(RG_EINVAL, "rg_comm_spare_start: size_hint %d out of 1..%d, or NULL",
                        size_hint, RG_COMM_MAX_SIZE);
    }
    rg_comm_spare_t *spare = calloc(1, sizeof(*spare));
    if (spare == NULL) {
        return rg_error(RG_ENOMEM, "out of memory for a spare UCX worker");
    }
    spare->size = size_hint;
    pthread_mutex_init(&spare->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&spare->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!background) {
        spare_make(spare);
        *spare_p = spare;
        return RG_OK;
    }
    /* Every signal blocked from the thread's first instruction (it inherits this thread's
     * mask), so that none is handled there, nor in a UCX thread that it starts; the faults
     * that a thread raises itself are delivered whatever its mask. */
    sigset_t all;
    sigset_t old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_t tid;
    int rc = pthread_create(&tid, &attr, spare_thread, spare);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        spare_free(spare);
        return rg_error(RG_ESYS, "a thread for a spare UCX worker: %s", strerror(rc));
    }
    *spare_p = spare;
    return RG_OK;
}

/* Waits for the thread until `until`, the mutex held; whether it ended. */
static bool spare_wait(rg_comm_spare_t *spare, rg_deadline_t until)
{
    struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
                          .tv_nsec = (long)(until % 1000000000ull)};
    /* Each pass returns or waits until the deadline, so the loop ends by then. */
    while (!spare->done) {
        if (pthread_cond_timedwait(&spare->cv, &spare->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    return spare->done;
}

/* Releases the spare, the mutex held (and given up): now, or by its thread when it ends. */
static void spare_let_go(rg_comm_spare_t *spare)
{
    if (!spare->done) {
        spare->abandoned = true;
        pthread_mutex_unlock(&spare->mu);
        return;
    }
    pthread_mutex_unlock(&spare->mu);
    spare_free(spare);
}

bool comm_spare_take(rg_comm_spare_t *spare, int size, rg_deadline_t deadline,
                     ucp_context_h *ctx_p, ucp_worker_h *worker_p, bool *cuda_p)
{
    if (spare == NULL) {
        return false;
    }
    bool taken = false;
    pthread_mutex_lock(&spare->mu);
    if (!spare_wait(spare, RG_MIN(deadline, rg_deadline_in_ms(COMM_SPARE_WAIT_MS)))) {
        rg_debug("the spare UCX worker is not made yet: the group makes its own");
    } else if (spare->status != RG_OK) {
        rg_debug("the spare UCX worker could not be made (%s): the group makes its own",
                 spare->error);
    } else if (size > RG_MAX(spare->size, COMM_KEEPALIVE_MIN_EPS)) {
        rg_debug("the spare UCX worker was made for %d ranks, the group has %d: it makes its "
                 "own", spare->size, size);
    } else {
        *ctx_p = spare->ctx;
        *worker_p = spare->worker;
        *cuda_p = spare->cuda;
        spare->ctx = NULL;
        spare->worker = NULL;
        taken = true;
    }
    spare_let_go(spare);
    return taken;
}

bool rg_comm_spare_wait(rg_comm_spare_t *spare, rg_deadline_t until)
{
    if (spare == NULL) {
        return false;
    }
    pthread_mutex_lock(&spare->mu);
    bool ready = spare_wait(spare, until) && spare->status == RG_OK;
    pthread_mutex_unlock(&spare->mu);
    return ready;
}

void rg_comm_spare_destroy(rg_comm_spare_t *spare)
{
    if (spare == NULL) {
        return;
    }
    pthread_mutex_lock(&spare->mu);
    /* A process that exits while the thread is inside UCX would tear UCX down under it. */
    (void)spare_wait(spare, rg_deadline_in_ms(COMM_SPARE_WAIT_MS));
    spare_let_go(spare);
}

bool rg__comm_from_spare(const rg_comm_t *comm)
{
    return comm != NULL && comm->from_spare;
}
