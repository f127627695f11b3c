/*
 * The rendezvous handle's life: its etcd client, the agent's lease and keeper thread, and
 * the watch on the job's prefix, all behind one epoll fd that wakes the agent's loop.
 */
#include "rdzv_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

rg_status_t rdzv_lease_start(rg_rdzv_t *z, rg_deadline_t deadline)
{
    rg_status_t st;
    int64_t granted;
    struct epoll_event ev = {.events = EPOLLIN};

    for (;;) {
        rg_deadline_t call = RG_MIN(deadline, rg_deadline_in_ms(z->p.etcd.timeout_ms
                                                                    ? z->p.etcd.timeout_ms
                                                                    : 5000));
        st = rg_etcd_lease_grant(z->etcd, z->p.lease_ttl_s, call, &z->lease, &granted);
        if (st == RG_OK || (st != RG_EUNREACH && st != RG_ETIMEDOUT && st != RG_EAGAIN) ||
            rg_deadline_passed(deadline)) {
            break;
        }
        rg_info("rendezvous: etcd not reachable yet (%s); retrying", rg_last_error());
        rg_sleep_ms(RG_MIN(RDZV_RETRY_MS, rg_deadline_left_ms(deadline)));
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "rendezvous: cannot get a lease from etcd");
    }
    st = rg_etcd_keeper_start(&z->p.etcd, z->lease, granted, &z->keeper);
    if (st != RG_OK) {
        return st;
    }
    ev.data.fd = rg_etcd_keeper_fd(z->keeper);
    if (epoll_ctl(z->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
        return rg_error(RG_ESYS, "rendezvous: epoll_ctl: %s", strerror(errno));
    }
    z->keeper_fd_added = ev.data.fd;
    return RG_OK;
}

void rdzv_lease_stop(rg_rdzv_t *z)
{
    if (z->keeper != NULL) {
        epoll_ctl(z->epfd, EPOLL_CTL_DEL, z->keeper_fd_added, NULL);
        rg_etcd_keeper_stats_add(z->keeper, &z->retired);
        rg_etcd_keeper_stop(z->keeper);
        z->keeper = NULL;
    }
}

rg_status_t rdzv_lease_renew_if_lost(rg_rdzv_t *z, rg_deadline_t deadline)
{
    if (z->keeper != NULL && !rg_etcd_keeper_lost(z->keeper)) {
        return RG_OK;
    }
    /* Whatever was attached to the old lease is gone with it. */
    rdzv_lease_stop(z);
    z->registered_round = -1;
    z->waiting = false;
    return rdzv_lease_start(z, deadline);
}

/* The agent's watch: the job's keys up to workers/ (rdzv_keys.h), so that what workers write
 * (progress twice a second a rank, wire-up addresses, checkpoints) is not sent to every
 * agent. */
static rg_status_t watch_start(rg_rdzv_t *z)
{
    char end[RDZV_KEY_MAX];
    rg_status_t st = rdzv_keys_workers_prefix(&z->keys, end, sizeof(end));
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_watch_req_t wr = {.key = rdzv_keys_prefix(&z->keys), .range_end = end};
    st = rg_etcd_watch_create(&z->p.etcd, &wr, 0, &z->watch);
    if (st != RG_OK) {
        z->watch = NULL;
        return st;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = rg_etcd_watch_fd(z->watch)};
    if (epoll_ctl(z->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
        return rg_error(RG_ESYS, "rendezvous: epoll_ctl: %s", strerror(errno));
    }
    return RG_OK;
}

bool rdzv_watch_drain(rg_rdzv_t *z)
{
    rg_etcd_event_t ev;
    bool relevant = false;
    rg_status_t st;

    /* No watch (a new one could not be made last time): as if it had just ended. */
    st = z->watch == NULL ? RG_ECANCELED : RG_OK;
    while (st == RG_OK &&
           (st = rg_etcd_watch_next(z->watch, RG_DEADLINE_POLL, &ev, NULL)) == RG_OK) {
        relevant = true;   /* the watch holds only what agents act on */
        rg_etcd_event_cleanup(&ev);
    }
    if (st != RG_ETIMEDOUT) {
        /* The watch is over (compacted, refused, never made): start a new one from now.
         * State is re-read after this, and at least every second, so nothing is missed. */
        if (z->watch != NULL) {
            rg_warn("rendezvous: job watch ended (%s); watching again", rg_last_error());
            epoll_ctl(z->epfd, EPOLL_CTL_DEL, rg_etcd_watch_fd(z->watch), NULL);
            rg_etcd_watch_stats_add(z->watch, &z->retired);
            rg_etcd_watch_destroy(z->watch);
            z->watch = NULL;
        }
        if (watch_start(z) != RG_OK) {
            rg_warn("rendezvous: cannot watch the job (%s); reading its state every second",
                    rg_last_error());
        }
        relevant = true;
    }
    return relevant;
}

/* A nonce that differs between the handles of one process even within one clock tick. */
static uint32_t agent_nonce(void)
{
    static atomic_uint seq;   /* atomic: handles may be created on several threads */
    uint64_t x = rg_now_ns() ^ ((uint64_t)getpid() << 16);
    x ^= (uint64_t)atomic_fetch_add(&seq, 1) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(x ^ (x >> 32));
}

rg_status_t rg_rdzv_create(const rg_rdzv_params_t *params, rg_rdzv_t **rdzv_p)
{
    rg_rdzv_t *z;
    rg_status_t st;
    char host[64] = "node";
    rg_deadline_t deadline;

    if (params == NULL || rdzv_p == NULL) {
        return rg_error(RG_EINVAL, "rendezvous: NULL argument");
    }
    if (!rdzv_keys_job_id_ok(params->job)) {
        return rg_error(RG_EINVAL, "rendezvous: job id '%s' must be 1-64 characters of "
                        "[A-Za-z0-9_.-]", params->job ? params->job : "");
    }
    if (params->min_nodes < 1 || params->max_nodes < params->min_nodes ||
        params->max_nodes > RG_RDZV_MAX_NODES || params->nproc < 1) {
        return rg_error(RG_EINVAL, "rendezvous: need 1 <= min nodes (%d) <= max nodes (%d) "
                        "<= %d and nproc >= 1", params->min_nodes, params->max_nodes,
                        RG_RDZV_MAX_NODES);
    }
    z = calloc(1, sizeof(*z));
    if (z == NULL) {
        return rg_error(RG_ENOMEM, "rendezvous");
    }
    z->p = *params;
    snprintf(z->job, sizeof(z->job), "%s", params->job);
    snprintf(z->addr, sizeof(z->addr), "%s", params->addr ? params->addr : "127.0.0.1");
    z->p.job = z->job;
    z->p.addr = z->addr;
    if (z->p.lease_ttl_s <= 0) {
        z->p.lease_ttl_s = 5;
    }
    if (z->p.last_call_ms <= 0) {
        z->p.last_call_ms = 1000;
    }
    if (z->p.join_timeout_ms <= 0) {
        z->p.join_timeout_ms = 600000;
    }
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    rdzv_agent_id_make(host, getpid(), agent_nonce(), z->agent);
    z->last_round = -1;
    z->last_rank = -1;
    z->registered_round = -1;
    z->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (z->epfd < 0) {
        free(z);
        return rg_error(RG_ESYS, "rendezvous: epoll_create1: %s", strerror(errno));
    }
    st = rdzv_keys_init(&z->keys, z->job);   /* cannot fail for a job id checked above */
    if (st != RG_OK) {
        goto err;
    }
    deadline = rg_deadline_in_ms(z->p.join_timeout_ms);
    st = rg_etcd_create(&z->p.etcd, &z->etcd);
    if (st != RG_OK) {
        goto err;
    }
    st = rdzv_lease_start(z, deadline);
    if (st != RG_OK) {
        goto err;
    }
    st = watch_start(z);
    if (st == RG_ETIMEDOUT || st == RG_EUNREACH || st == RG_EAGAIN) {
        /* etcd answers but slowly (a loaded machine, a member being elected): as when a watch
         * cannot be made again later, the state is read at every look (at least once a
         * second) and each look tries to watch again (rdzv_watch_drain). */
        rg_warn("rendezvous: cannot watch the job yet (%s); reading its state every second",
                rg_last_error());
        st = RG_OK;
    }
    if (st != RG_OK) {
        goto err;
    }
    *rdzv_p = z;
    return RG_OK;
err:
    rg_rdzv_destroy(z);
    return st;
}

void rg_rdzv_destroy(rg_rdzv_t *z)
{
    if (z == NULL) {
        return;
    }
    rg_etcd_watch_destroy(z->watch);
    rdzv_lease_stop(z);
    rg_etcd_destroy(z->etcd);
    close(z->epfd);
    free(z);
}

const char *rg_rdzv_agent_id(const rg_rdzv_t *z)
{
    return z->agent;
}

int64_t rg_rdzv_lease_id(const rg_rdzv_t *z)
{
    return z->lease;
}

rg_etcd_t *rg_rdzv_client(rg_rdzv_t *z)
{
    return z->etcd;
}

void rg_rdzv_stats(const rg_rdzv_t *z, rg_etcd_stats_t *out)
{
    *out = z->retired;
    rg_etcd_stats_add(z->etcd, out);
    rg_etcd_keeper_stats_add(z->keeper, out);
    rg_etcd_watch_stats_add(z->watch, out);
}

int rg_rdzv_fd(const rg_rdzv_t *z)
{
    return z->epfd;
}

rg_status_t rg_rdzv_leave(rg_rdzv_t *z)
{
    rg_status_t st;
    int64_t lease = z->lease;

    rdzv_lease_stop(z);
    z->running = false;
    if (lease == 0) {
        return RG_OK;
    }
    z->lease = 0;
    st = rg_etcd_lease_revoke(z->etcd, lease, 0);
    return st == RG_ELEASE ? RG_OK : st;
}
