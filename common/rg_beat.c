/* The workers' heartbeat page (rg_beat.h). */
#include "rg_beat.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    return rg_now_ns() / 1000000ull;
}

static size_t page_size(int n_slots)
{
    return sizeof(rg_beat_page_t) + (size_t)n_slots * sizeof(rg_beat_slot_t);
}

rg_status_t rg_beat_host_create(rg_beat_host_t *h, int n_slots)
{
    void *p;

    h->fd = -1;
    h->page = NULL;
    h->size = 0;
    if (n_slots < 1 || n_slots > RG_BEAT_MAX_SLOTS) {
        return rg_error(RG_EINVAL, "beat page: %d slots", n_slots);
    }
    h->size = page_size(n_slots);
    h->fd = memfd_create("regroup-beat", MFD_CLOEXEC);
    if (h->fd < 0) {
        return rg_error(RG_ESYS, "beat page: memfd_create: %s", strerror(errno));
    }
    if (ftruncate(h->fd, (off_t)h->size) != 0) {
        rg_status_t st = rg_error(RG_ESYS, "beat page: ftruncate: %s", strerror(errno));
        close(h->fd);
        h->fd = -1;
        return st;
    }
    p = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0);
    if (p == MAP_FAILED) {
        rg_status_t st = rg_error(RG_ESYS, "beat page: mmap: %s", strerror(errno));
        close(h->fd);
        h->fd = -1;
        return st;
    }
    h->page = p;   /* zero-filled: no slot armed */
    h->page->n_slots = (uint32_t)n_slots;
    h->page->version = RG_BEAT_VERSION;
    atomic_thread_fence(memory_order_release);
    h->page->magic = RG_BEAT_MAGIC;
    return RG_OK;
}

void rg_beat_host_destroy(rg_beat_host_t *h)
{
    if (h->page != NULL) {
        munmap(h->page, h->size);
        h->page = NULL;
    }
    if (h->fd >= 0) {
        close(h->fd);
        h->fd = -1;
    }
}

void rg_beat_host_reset(rg_beat_host_t *h, int i)
{
    if (h->page != NULL && i >= 0 && (uint32_t)i < h->page->n_slots) {
        atomic_store(&h->page->slots[i].beat_ms, 0);
        atomic_store(&h->page->slots[i].beats, 0);
        atomic_store(&h->page->slots[i].pid, 0);
    }
}

pid_t rg_beat_pid(const rg_beat_host_t *h, int i)
{
    if (h->page == NULL || i < 0 || (uint32_t)i >= h->page->n_slots) {
        return 0;
    }
    return (pid_t)atomic_load(&h->page->slots[i].pid);
}

int64_t rg_beat_age_ms(const rg_beat_host_t *h, int i, int64_t now)
{
    if (h->page == NULL || i < 0 || (uint32_t)i >= h->page->n_slots) {
        return -1;
    }
    uint64_t b = atomic_load(&h->page->slots[i].beat_ms);
    return b == 0 ? -1 : RG_MAX(now - (int64_t)b, 0);
}

struct rg_beat_worker {
    rg_beat_page_t *page;
    size_t          size;
    rg_beat_slot_t *slot;
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;                 /* CLOCK_MONOTONIC */
    bool            stop;               /* (mu) */
    bool            started;
};

static void beat(rg_beat_slot_t *s)
{
    atomic_store(&s->beat_ms, now_ms());
    atomic_fetch_add(&s->beats, 1);
}

static void *beat_main(void *arg)
{
    rg_beat_worker_t *w = arg;
    struct timespec ts;

    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        pthread_mutex_unlock(&w->mu);
        beat(w->slot);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += RG_BEAT_PERIOD_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&w->mu);
        /* Bounded: one wait per period until stop. */
        if (!w->stop) {
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

rg_status_t rg_beat_worker_start(int slot, rg_beat_worker_t **wp)
{
    const char *s = getenv(RG_BEAT_ENV);
    int64_t fd;
    struct stat stb;
    rg_beat_worker_t *w;
    pthread_condattr_t ca;

    *wp = NULL;
    if (s == NULL || s[0] == '\0') {
        return RG_OK;
    }
    if (!rg_parse_i64(s, &fd) || fd < 0 || fd > 1 << 20) {
        return rg_error(RG_EINVAL, "%s=%s: not a file descriptor", RG_BEAT_ENV, s);
    }
    if (fstat((int)fd, &stb) != 0 || stb.st_size < (off_t)page_size(slot + 1)) {
        return rg_error(RG_EINVAL, "%s=%s: not a beat page with slot %d", RG_BEAT_ENV, s,
                        slot);
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return rg_error(RG_ENOMEM, "beat page");
    }
    w->size = (size_t)stb.st_size;
    void *p = mmap(NULL, w->size, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    if (p == MAP_FAILED) {
        free(w);
        return rg_error(RG_EINVAL, "%s=%s: mmap: %s", RG_BEAT_ENV, s, strerror(errno));
    }
    close((int)fd);
    w->page = p;
    atomic_thread_fence(memory_order_acquire);
    if (w->page->magic != RG_BEAT_MAGIC || w->page->version != RG_BEAT_VERSION ||
        slot < 0 || (uint32_t)slot >= w->page->n_slots) {
        munmap(w->page, w->size);
        free(w);
        return rg_error(RG_EINVAL, "%s=%s: not a beat page of version %u with slot %d",
                        RG_BEAT_ENV, s, RG_BEAT_VERSION, slot);
    }
    w->slot = &w->page->slots[slot];
    atomic_store(&w->slot->pid, (int32_t)getpid());
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    beat(w->slot);
    w->started = pthread_create(&w->thread, NULL, beat_main, w) == 0;
    if (!w->started) {
        rg_beat_worker_stop(w);   /* no thread: only the mapping to undo */
        return rg_error(RG_ESYS, "beat page: cannot start its thread");
    }
    *wp = w;
    return RG_OK;
}

void rg_beat_worker_stop(rg_beat_worker_t *w)
{
    if (w == NULL) {
        return;
    }
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    /* A worker that ends on purpose is no hang: disarm its slot. */
    atomic_store(&w->slot->beat_ms, 0);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    munmap(w->page, w->size);
    free(w);
}
