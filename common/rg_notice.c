/* The notice page between an agent and its workers (rg_notice.h). */
#include "rg_notice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NOTICE_READ_TRIES 64   /* a writer posts rarely: a few retries always suffice */

int64_t rg_notice_now_ms(void)
{
    return (int64_t)(rg_now_ns() / 1000000ull);
}

rg_status_t rg_notice_host_create(rg_notice_host_t *h, int64_t lease_ttl_ms)
{
    size_t size = sizeof(rg_notice_page_t);
    void *p;

    h->fd = -1;
    h->page = NULL;
    if (lease_ttl_ms <= 0 || lease_ttl_ms > UINT32_MAX) {
        return rg_error(RG_EINVAL, "notice page: lease TTL %lld ms out of range",
                        (long long)lease_ttl_ms);
    }
    h->fd = memfd_create("regroup-notice", MFD_CLOEXEC);
    if (h->fd < 0) {
        return rg_error(RG_ESYS, "notice page: memfd_create: %s", strerror(errno));
    }
    if (ftruncate(h->fd, (off_t)size) != 0) {
        rg_status_t st = rg_error(RG_ESYS, "notice page: ftruncate: %s", strerror(errno));
        close(h->fd);
        h->fd = -1;
        return st;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0);
    if (p == MAP_FAILED) {
        rg_status_t st = rg_error(RG_ESYS, "notice page: mmap: %s", strerror(errno));
        close(h->fd);
        h->fd = -1;
        return st;
    }
    h->page = p;   /* zero-filled by ftruncate */
    h->page->lease_ttl_ms = (uint32_t)lease_ttl_ms;
    h->page->version = RG_NOTICE_VERSION;
    atomic_store_explicit(&h->page->asg_round, -1, memory_order_relaxed);
    rg_notice_heartbeat(h);
    atomic_thread_fence(memory_order_release);
    h->page->magic = RG_NOTICE_MAGIC;
    return RG_OK;
}

void rg_notice_host_destroy(rg_notice_host_t *h)
{
    if (h->page != NULL) {
        munmap(h->page, sizeof(*h->page));
        h->page = NULL;
    }
    if (h->fd >= 0) {
        close(h->fd);
        h->fd = -1;
    }
}

rg_status_t rg_table_slots_create(int n, int *fds)
{
    if (n < 1 || n > RG_TABLE_SLOTS_MAX) {
        return rg_error(RG_EINVAL, "node copies: %d local ranks", n);
    }
    for (int i = 0; i < n; i++) {
        fds[i] = memfd_create("regroup-table", MFD_CLOEXEC);
        if (fds[i] < 0) {
            rg_status_t st = rg_error(RG_ESYS, "node copies: memfd_create: %s",
                                      strerror(errno));
            rg_table_slots_close(i, fds);
            return st;
        }
    }
    return RG_OK;
}

void rg_table_slots_reset(int n, const int *fds)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0 && ftruncate(fds[i], 0) != 0) {
            rg_warn("node copy %d: ftruncate: %s", i, strerror(errno));
        }
    }
}

void rg_table_slots_close(int n, int *fds)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
    }
}

void rg_notice_heartbeat(rg_notice_host_t *h)
{
    if (h->page != NULL) {
        atomic_store_explicit(&h->page->heartbeat_ms, (uint64_t)rg_notice_now_ms(),
                              memory_order_release);
    }
}

void rg_notice_post(rg_notice_host_t *h, int kind, int round, int64_t deadline_ms,
                    const char *reason)
{
    rg_notice_page_t *p = h->page;
    uint64_t seq;

    if (p == NULL) {
        return;
    }
    /* Odd while writing: a reader that sees an odd or a moved seq retries. */
    seq = atomic_load_explicit(&p->seq, memory_order_relaxed);
    atomic_store_explicit(&p->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->kind, kind, memory_order_relaxed);
    atomic_store_explicit(&p->round, round, memory_order_relaxed);
    atomic_store_explicit(&p->deadline_ms, deadline_ms, memory_order_relaxed);
    snprintf(p->reason, sizeof(p->reason), "%s", reason != NULL ? reason : "");
    atomic_store_explicit(&p->seq, seq + 2, memory_order_release);
}

void rg_notice_assign(rg_notice_host_t *h, int round, int world, int restarts,
                      const int *ranks, int n, int64_t lease)
{
    rg_notice_page_t *p = h->page;
    uint64_t seq;

    if (p == NULL) {
        return;
    }
    n = RG_MAX(0, RG_MIN(n, RG_NOTICE_MAX_LOCAL));
    seq = atomic_load_explicit(&p->asg_seq, memory_order_relaxed);
    atomic_store_explicit(&p->asg_seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->asg_round, round, memory_order_relaxed);
    atomic_store_explicit(&p->asg_world, world, memory_order_relaxed);
    atomic_store_explicit(&p->asg_restarts, restarts, memory_order_relaxed);
    atomic_store_explicit(&p->asg_n, n, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        atomic_store_explicit(&p->asg_rank[i], ranks[i], memory_order_relaxed);
    }
    atomic_store_explicit(&p->asg_lease, lease, memory_order_relaxed);
    atomic_store_explicit(&p->asg_seq, seq + 2, memory_order_release);
}

bool rg_notice_read_assign(const rg_notice_view_t *v, rg_notice_assign_t *a)
{
    rg_notice_page_t *p = (rg_notice_page_t *)v->page;   /* read-only mapping: loads only */

    a->round = -1;
    a->n = 0;
    a->lease = 0;
    if (p == NULL) {
        return false;
    }
    for (int t = 0; t < NOTICE_READ_TRIES; t++) {
        uint64_t s1 = atomic_load_explicit(&p->asg_seq, memory_order_acquire);
        if (s1 & 1) {
            continue;
        }
        a->round = atomic_load_explicit(&p->asg_round, memory_order_relaxed);
        a->world = atomic_load_explicit(&p->asg_world, memory_order_relaxed);
        a->restarts = atomic_load_explicit(&p->asg_restarts, memory_order_relaxed);
        a->n = RG_MAX(0, RG_MIN(atomic_load_explicit(&p->asg_n, memory_order_relaxed),
                                RG_NOTICE_MAX_LOCAL));
        for (int i = 0; i < a->n; i++) {
            a->rank[i] = atomic_load_explicit(&p->asg_rank[i], memory_order_relaxed);
        }
        a->lease = atomic_load_explicit(&p->asg_lease, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->asg_seq, memory_order_relaxed) == s1) {
            return a->round >= 0;
        }
    }
    a->round = -1;
    a->n = 0;
    return false;
}

bool rg_notice_msg_send(rg_notice_msg_t msg, int local_rank)
{
    const char *s = getenv(RG_NOTICE_PIPE_ENV);
    int64_t fd;
    unsigned char buf[4] = {(unsigned char)msg, 0, (unsigned char)(local_rank & 0xff),
                            (unsigned char)((local_rank >> 8) & 0xff)};

    if (s == NULL || !rg_parse_i64(s, &fd) || fd < 0 || fd > 1 << 20 || local_rank < 0) {
        return false;
    }
    return write((int)fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf);
}

bool rg_notice_msg_decode(const unsigned char buf[4], rg_notice_msg_t *msg, int *local_rank)
{
    if ((buf[0] != RG_NOTICE_MSG_INPLACE && buf[0] != RG_NOTICE_MSG_READY &&
         buf[0] != RG_NOTICE_MSG_RESTART && buf[0] != RG_NOTICE_MSG_JOINED &&
         buf[0] != RG_NOTICE_MSG_REGROUP && buf[0] != RG_NOTICE_MSG_STRAGGLER &&
         buf[0] != RG_NOTICE_MSG_HEALTH && buf[0] != RG_NOTICE_MSG_CUT_OFF &&
         buf[0] != RG_NOTICE_MSG_LEFT_OUT) ||
        buf[1] != 0) {
        return false;
    }
    *msg = (rg_notice_msg_t)buf[0];
    *local_rank = buf[2] | (buf[3] << 8);
    return true;
}

rg_status_t rg_notice_view_open(rg_notice_view_t *v)
{
    const char *s = getenv(RG_NOTICE_ENV);
    int64_t fd;
    struct stat stb;
    void *p;

    v->page = NULL;
    if (s == NULL || s[0] == '\0') {
        return RG_OK;
    }
    if (!rg_parse_i64(s, &fd) || fd < 0 || fd > 1 << 20) {
        return rg_error(RG_EINVAL, "%s=%s: not a file descriptor", RG_NOTICE_ENV, s);
    }
    if (fstat((int)fd, &stb) != 0 || stb.st_size < (off_t)sizeof(rg_notice_page_t)) {
        return rg_error(RG_EINVAL, "%s=%s: not a notice page (%s)", RG_NOTICE_ENV, s,
                        errno != 0 ? strerror(errno) : "too small");
    }
    p = mmap(NULL, sizeof(rg_notice_page_t), PROT_READ, MAP_SHARED, (int)fd, 0);
    if (p == MAP_FAILED) {
        return rg_error(RG_EINVAL, "%s=%s: mmap: %s", RG_NOTICE_ENV, s, strerror(errno));
    }
    close((int)fd);
    v->page = p;
    atomic_thread_fence(memory_order_acquire);
    if (v->page->magic != RG_NOTICE_MAGIC || v->page->version != RG_NOTICE_VERSION) {
        rg_notice_view_close(v);
        return rg_error(RG_EINVAL, "%s=%s: not a notice page of version %u", RG_NOTICE_ENV, s,
                        RG_NOTICE_VERSION);
    }
    return RG_OK;
}

void rg_notice_view_close(rg_notice_view_t *v)
{
    if (v->page != NULL) {
        munmap((void *)v->page, sizeof(*v->page));
        v->page = NULL;
    }
}

bool rg_notice_read(const rg_notice_view_t *v, rg_notice_snap_t *snap)
{
    rg_notice_page_t *p = (rg_notice_page_t *)v->page;   /* read-only mapping: loads only */

    memset(snap, 0, sizeof(*snap));
    if (p == NULL) {
        return false;
    }
    for (int t = 0; t < NOTICE_READ_TRIES; t++) {
        uint64_t s1 = atomic_load_explicit(&p->seq, memory_order_acquire);
        if (s1 & 1) {
            continue;
        }
        snap->kind = atomic_load_explicit(&p->kind, memory_order_relaxed);
        snap->round = atomic_load_explicit(&p->round, memory_order_relaxed);
        snap->deadline_ms = atomic_load_explicit(&p->deadline_ms, memory_order_relaxed);
        memcpy(snap->reason, p->reason, sizeof(snap->reason));
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&p->seq, memory_order_relaxed) == s1) {
            snap->seq = s1 / 2;
            snap->reason[sizeof(snap->reason) - 1] = '\0';
            return true;
        }
    }
    /* A writer that keeps writing for 64 reads: report the last notice as unchanged. */
    memset(snap, 0, sizeof(*snap));
    return false;
}

int64_t rg_notice_heartbeat_age_ms(const rg_notice_view_t *v, int64_t now_ms)
{
    rg_notice_page_t *p = (rg_notice_page_t *)v->page;
    if (p == NULL) {
        return -1;
    }
    return now_ms - (int64_t)atomic_load_explicit(&p->heartbeat_ms, memory_order_acquire);
}

int64_t rg_notice_lease_ttl_ms(const rg_notice_view_t *v)
{
    return v->page != NULL ? (int64_t)v->page->lease_ttl_ms : 0;
}
