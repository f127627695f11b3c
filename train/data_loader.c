/*
 * The loader: one background thread that runs the sampler ahead of the caller and fills a
 * ring of RG_LOADER_DEPTH + 1 batch slots (the caller holds one while the thread fills the
 * others). Three counters under one mutex describe the ring:
 *   filled    slots the thread has filled (it fills slot filled % nslots next),
 *   taken     slots the caller has taken, in order,
 *   released  slots the caller has handed back (all but the one it holds).
 * The thread may fill while filled - released < nslots; the caller may take while
 * taken < filled. The thread keeps its own cursor; the caller only ever sees finished slots.
 */
#include <regroup/data.h>

#include "rg_common.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOADER_NSLOTS (RG_LOADER_DEPTH + 1)

typedef struct {
    uint32_t  *ids;
    float     *inputs;
    uint8_t   *labels;
    rg_batch_t batch;
} loader_slot_t;

struct rg_loader {
    const rg_dataset_t *ds;
    rg_sampler_t       *sampler;    /* used by the thread only */
    uint32_t            rank;
    uint32_t            world;
    size_t              max_count;  /* ceil(B / world): the largest share */
    rg_data_cursor_t    cursor;     /* the thread's next step */
    loader_slot_t       slots[LOADER_NSLOTS];

    pthread_mutex_t     lock;
    pthread_cond_t      can_fill;   /* signaled when a slot is released or on stop */
    pthread_cond_t      can_take;   /* signaled when a slot is filled or the thread fails */
    uint64_t            filled;
    uint64_t            taken;
    uint64_t            released;
    bool                stop;
    rg_status_t         thread_status;
    char                thread_error[256];
    pthread_t           thread;
    bool                thread_started;
};

/* Fills one slot with the share of the step at loader->cursor. Runs on the thread. */
static rg_status_t loader_fill(rg_loader_t *loader, loader_slot_t *slot)
{
    size_t      count = 0;
    rg_status_t st = rg_sampler_ids(loader->sampler, &loader->cursor, loader->rank,
                                    loader->world, slot->ids, loader->max_count, &count);
    if (st != RG_OK) {
        return st;
    }
    size_t         rs = rg_dataset_record_size(loader->ds);
    const uint8_t *records = rg_dataset_records(loader->ds);
    const uint8_t *labels = rg_dataset_labels(loader->ds);
    for (size_t i = 0; i < count; i++) {
        const uint8_t *rec = records + (size_t)slot->ids[i] * rs;
        float         *out = slot->inputs + i * rs;
        for (size_t k = 0; k < rs; k++) {
            out[k] = (float)rec[k] * (1.0f / 255.0f);
        }
        slot->labels[i] = labels[slot->ids[i]];
    }
    rg_batch_t *b = &slot->batch;
    b->ids = slot->ids;
    b->inputs = slot->inputs;
    b->labels = slot->labels;
    b->count = count;
    b->record_size = rs;
    b->global_count = rg_sampler_global_count(loader->sampler, &loader->cursor);
    b->cursor = loader->cursor;
    rg_sampler_advance(loader->sampler, &loader->cursor);
    b->next = loader->cursor;
    return RG_OK;
}

static void *loader_thread(void *arg)
{
    rg_loader_t *loader = arg;

    pthread_mutex_lock(&loader->lock);
    /* Bounded by destroy: it sets stop and signals can_fill, so this wait always ends. The
     * wait for a free slot has no deadline of its own because it waits on our own caller's
     * pace (one training step), not on anything outside the process. */
    while (!loader->stop) {
        if (loader->filled - loader->released >= LOADER_NSLOTS) {
            pthread_cond_wait(&loader->can_fill, &loader->lock);
            continue;
        }
        loader_slot_t *slot = &loader->slots[loader->filled % LOADER_NSLOTS];
        pthread_mutex_unlock(&loader->lock);

        rg_status_t st = loader_fill(loader, slot);

        pthread_mutex_lock(&loader->lock);
        if (st != RG_OK) {
            loader->thread_status = st;
            snprintf(loader->thread_error, sizeof(loader->thread_error), "%s",
                     rg_last_error());
            pthread_cond_broadcast(&loader->can_take);
            break;
        }
        loader->filled++;
        pthread_cond_broadcast(&loader->can_take);
    }
    pthread_mutex_unlock(&loader->lock);
    return NULL;
}

static void loader_free(rg_loader_t *loader)
{
    for (size_t i = 0; i < LOADER_NSLOTS; i++) {
        free(loader->slots[i].ids);
        free(loader->slots[i].inputs);
        free(loader->slots[i].labels);
    }
    rg_sampler_destroy(loader->sampler);
    free(loader);
}

rg_status_t rg_loader_create(const rg_dataset_t *ds, const rg_sampler_params_t *params,
                             uint32_t rank, uint32_t world, const rg_data_cursor_t *cursor,
                             rg_loader_t **loader_p)
{
    rg_status_t st;

    if (ds == NULL || params == NULL || cursor == NULL || loader_p == NULL) {
        return rg_error(RG_EINVAL, "rg_loader_create: NULL argument");
    }
    if (world == 0 || rank >= world) {
        return rg_error(RG_EINVAL, "loader: rank %u of world %u", rank, world);
    }
    if (params->num_samples != rg_dataset_size(ds)) {
        return rg_error(RG_EINVAL, "loader: sampler expects %llu samples, dataset has %zu",
                        (unsigned long long)params->num_samples, rg_dataset_size(ds));
    }
    rg_loader_t *loader = calloc(1, sizeof(*loader));
    if (loader == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a loader");
    }
    st = rg_sampler_create(params, &loader->sampler);
    if (st != RG_OK) {
        free(loader);
        return st;
    }
    if (cursor->step >= rg_sampler_steps_per_epoch(loader->sampler)) {
        st = rg_error(RG_EINVAL, "loader: cursor step %llu is past the %llu steps of an epoch",
                      (unsigned long long)cursor->step,
                      (unsigned long long)rg_sampler_steps_per_epoch(loader->sampler));
        goto err_free;
    }
    loader->ds = ds;
    loader->rank = rank;
    loader->world = world;
    loader->cursor = *cursor;
    loader->max_count = (params->batch_size + world - 1) / world;
    size_t rs = rg_dataset_record_size(ds);
    for (size_t i = 0; i < LOADER_NSLOTS; i++) {
        loader_slot_t *slot = &loader->slots[i];
        slot->ids = malloc(loader->max_count * sizeof(uint32_t));
        slot->inputs = malloc(loader->max_count * rs * sizeof(float));
        slot->labels = malloc(loader->max_count);
        if (slot->ids == NULL || slot->inputs == NULL || slot->labels == NULL) {
            st = rg_error(RG_ENOMEM, "loader: no memory for batches of %zu records",
                          loader->max_count);
            goto err_free;
        }
    }

    pthread_condattr_t cattr;
    if (pthread_condattr_init(&cattr) != 0) {
        st = rg_error(RG_ESYS, "loader: pthread_condattr_init failed");
        goto err_free;
    }
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    pthread_mutex_init(&loader->lock, NULL);
    pthread_cond_init(&loader->can_fill, &cattr);
    pthread_cond_init(&loader->can_take, &cattr);
    pthread_condattr_destroy(&cattr);

    int rc = pthread_create(&loader->thread, NULL, loader_thread, loader);
    if (rc != 0) {
        st = rg_error(RG_ESYS, "loader: pthread_create: %s", strerror(rc));
        goto err_destroy_sync;
    }
    loader->thread_started = true;
    *loader_p = loader;
    return RG_OK;

err_destroy_sync:
    pthread_cond_destroy(&loader->can_take);
    pthread_cond_destroy(&loader->can_fill);
    pthread_mutex_destroy(&loader->lock);
err_free:
    loader_free(loader);
    return st;
}

rg_status_t rg_loader_next(rg_loader_t *loader, rg_deadline_t deadline,
                           const rg_batch_t **batch_p)
{
    if (loader == NULL || batch_p == NULL) {
        return rg_error(RG_EINVAL, "rg_loader_next: NULL argument");
    }
    if (deadline == RG_DEADLINE_DEFAULT) {
        deadline = rg_deadline_in_ms(RG_LOADER_DEFAULT_TIMEOUT_MS);
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
                          .tv_nsec = (long)(deadline % 1000000000ull)};
    rg_status_t     st = RG_OK;

    pthread_mutex_lock(&loader->lock);
    if (loader->released < loader->taken) {
        /* The caller is done with the batch it held. */
        loader->released++;
        pthread_cond_signal(&loader->can_fill);
    }
    /* Each pass either returns or waits until the deadline, so the loop ends by then. */
    while (loader->taken == loader->filled) {
        if (loader->thread_status != RG_OK) {
            st = rg_error(loader->thread_status, "loader: %s", loader->thread_error);
            goto out_unlock;
        }
        int rc = pthread_cond_timedwait(&loader->can_take, &loader->lock, &ts);
        if (rc == ETIMEDOUT && loader->taken == loader->filled) {
            st = rg_error(RG_ETIMEDOUT, "loader: no batch within the deadline (rank %u)",
                          loader->rank);
            goto out_unlock;
        }
    }
    loader_slot_t *slot = &loader->slots[loader->taken % LOADER_NSLOTS];
    loader->taken++;
    *batch_p = &slot->batch;
out_unlock:
    pthread_mutex_unlock(&loader->lock);
    return st;
}

void rg_loader_destroy(rg_loader_t *loader)
{
    if (loader == NULL) {
        return;
    }
    pthread_mutex_lock(&loader->lock);
    loader->stop = true;
    pthread_cond_broadcast(&loader->can_fill);
    pthread_mutex_unlock(&loader->lock);
    if (loader->thread_started) {
        pthread_join(loader->thread, NULL);
    }
    pthread_cond_destroy(&loader->can_take);
    pthread_cond_destroy(&loader->can_fill);
    pthread_mutex_destroy(&loader->lock);
    loader_free(loader);
}
