/*
 * The rendezvous handle's life: its etcd client, the agent's lease and keeper thread, and
 * its watches (the job's keys, and the round it is in), all behind one epoll fd that wakes
 * the agent's loop.
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
    z->closer_round = -1;
    z->waiting = false;
    return rdzv_lease_start(z, deadline);
}

static void watch_stop(rg_rdzv_t *z, rdzv_watch_slot_t *ws)
{
    if (ws->w != NULL) {
        epoll_ctl(z->epfd, EPOLL_CTL_DEL, rg_etcd_watch_fd(ws->w), NULL);
        rg_etcd_watch_stats_add(ws->w, &z->retired);
        rg_etcd_watch_destroy(ws->w);
        ws->w = NULL;
    }
}

static rg_status_t watch_start(rg_rdzv_t *z, rdzv_watch_slot_t *ws, int64_t start_rev)
{
    rg_etcd_watch_req_t wr = {.key = ws->range.key, .range_end = ws->range.end,
                              .start_revision = start_rev};
    /* Not the client's whole timeout: a join or a check makes watches as it goes (a round's,
     * the closer's), and the look every RDZV_VERIFY_MS covers for one not made yet, so a
     * slow etcd member costs a look at most this, and the next drain tries again. */
    rg_deadline_t confirm = rg_deadline_in_ms(RG_MIN(RDZV_VERIFY_MS,
                                                     z->p.etcd.timeout_ms > 0
                                                         ? z->p.etcd.timeout_ms
                                                         : RDZV_VERIFY_MS));
    rg_status_t st = rg_etcd_watch_create(&z->p.etcd, &wr, confirm, &ws->w);
    if (st != RG_OK) {
        ws->w = NULL;
        return st;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = rg_etcd_watch_fd(ws->w)};
    if (epoll_ctl(z->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
        watch_stop(z, ws);
        return rg_error(RG_ESYS, "rendezvous: epoll_ctl: %s", strerror(errno));
    }
    return RG_OK;
}

void rdzv_watch_set(rg_rdzv_t *z, int slot, const rdzv_range_t *range, int64_t start_rev)
{
    rdzv_watch_slot_t *ws = &z->watches[slot];

    if (range == NULL) {
        watch_stop(z, ws);
        ws->on = false;
        return;
    }
    if (ws->on && strcmp(ws->range.key, range->key) == 0 &&
        strcmp(ws->range.end, range->end) == 0) {
        return;   /* (one not made yet is tried again by the drain) */
    }
    watch_stop(z, ws);
    ws->range = *range;
    ws->on = true;
    if (watch_start(z, ws, start_rev) != RG_OK) {
        rg_warn("rendezvous: cannot watch %s yet (%s); reading the state every second",
                range->key, rg_last_error());
    }
}

void rdzv_watch_round(rg_rdzv_t *z, int r, bool nodes, bool prev_too, int64_t start_rev)
{
    rdzv_range_t round;
    rdzv_range_t prev;
    bool have_prev = prev_too && r > 0;

    if (rdzv_keys_watch_round(&z->keys, r, nodes, &round) != RG_OK ||
        (have_prev && rdzv_keys_watch_round(&z->keys, r - 1, true, &prev) != RG_OK)) {
        return;   /* cannot happen for a round of 0..RDZV_ROUND_MAX; the looks go on */
    }
    rdzv_watch_set(z, RDZV_W_ROUND, &round, start_rev);
    rdzv_watch_set(z, RDZV_W_PREV, have_prev ? &prev : NULL, start_rev);
}

/* A node key of the running round deleted: its agent is named for check's next look. */
static void note_gone(rg_rdzv_t *z, int slot, const rg_etcd_event_t *ev)
{
    char nodes[RDZV_KEY_MAX];
    const char *agent;

    if (slot != RDZV_W_ROUND || !z->running || ev->type != RG_ETCD_EVENT_DELETE ||
        ev->kv.mod_revision <= z->nodes_seen_rev || z->n_gone > RDZV_GONE_MAX ||
        rdzv_keys_nodes_prefix(&z->keys, z->cur.round, nodes, sizeof(nodes)) != RG_OK ||
        (agent = rdzv_keys_tail(ev->kv.key, nodes)) == NULL) {
        return;
    }
    for (int i = 0; i < z->n_gone; i++) {
        if (strcmp(z->gone[i], agent) == 0) {
            return;
        }
    }
    if (z->n_gone == RDZV_GONE_MAX || strlen(agent) >= sizeof(z->gone[0])) {
        z->n_gone = RDZV_GONE_MAX + 1;   /* too many to name: the next look lists them */
        return;
    }
    snprintf(z->gone[z->n_gone++], sizeof(z->gone[0]), "%s", agent);
}

bool rdzv_watch_drain(rg_rdzv_t *z)
{
    bool relevant = false;
    bool refused = false;   /* a watch could not be made: try no other one in this drain */

    for (int i = 0; i < RDZV_W_N; i++) {
        rdzv_watch_slot_t *ws = &z->watches[i];
        rg_etcd_event_t ev;
        if (!ws->on) {
            continue;
        }
        /* No watch (a new one could not be made last time): as if it had just ended. */
        rg_status_t st = ws->w == NULL ? RG_ECANCELED : RG_OK;
        while (st == RG_OK &&
               (st = rg_etcd_watch_next(ws->w, RG_DEADLINE_POLL, &ev, NULL)) == RG_OK) {
            relevant = true;   /* the watches hold only what agents act on */
            note_gone(z, i, &ev);
            rg_debug("rendezvous: event %s %s at %lld", ev.type == RG_ETCD_EVENT_PUT ? "put"
                     : "delete", ev.kv.key, (long long)ev.kv.mod_revision);
            rg_etcd_event_cleanup(&ev);
        }
        if (st != RG_ETIMEDOUT) {
            /* The watch is over (compacted, refused, never made): start a new one from now.
             * State is re-read after this, and at least every second, so nothing is missed. */
            if (ws->w != NULL) {
                rg_warn("rendezvous: watch of %s ended (%s); watching again", ws->range.key,
                        rg_last_error());
                watch_stop(z, ws);
            }
            z->watch_gap = true;   /* what it missed: the next look lists the round's keys */
            if (refused || watch_start(z, ws, 0) != RG_OK) {
                if (!refused) {
                    rg_warn("rendezvous: cannot watch %s (%s); reading its state every "
                            "second", ws->range.key, rg_last_error());
                }
                refused = true;   /* each try may take etcd's deadline: one a look */
            }
            relevant = true;
        }
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
    const char *addr = params->addr ? params->addr : "127.0.0.1";
    if (!rdzv_addr_ok(addr, params->max_nodes)) {
        return rg_error(RG_EINVAL, "rendezvous: node address '%.300s' must be 1-%zu characters "
                        "of a host name or IP address ([A-Za-z0-9._:%%-], [ ] around IPv6)%s",
                        addr, rdzv_addr_max(params->max_nodes),
                        rdzv_addr_max(params->max_nodes) < RG_RDZV_ADDR_MAX - 1
                            ? ": with this many nodes at most, the closed record of a round "
                              "(every node's id and address) must fit one etcd request"
                            : "");
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
    z->closer_round = -1;
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
    rdzv_range_t job[2];
    st = rdzv_keys_watch_job(&z->keys, job);
    for (int i = 0; st == RG_OK && i < 2; i++) {
        rdzv_watch_slot_t *ws = &z->watches[RDZV_W_JOB0 + i];
        ws->range = job[i];
        ws->on = true;
        st = watch_start(z, ws, 0);
        if (st == RG_ETIMEDOUT || st == RG_EUNREACH || st == RG_EAGAIN) {
            /* etcd answers but slowly (a loaded machine, a member being elected): as when a
             * watch cannot be made again later, the state is read at every look (at least
             * once a second) and each look tries to watch again (rdzv_watch_drain). */
            rg_warn("rendezvous: cannot watch the job yet (%s); reading its state every "
                    "second", rg_last_error());
            st = RG_OK;
        }
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
    for (int i = 0; i < RDZV_W_N; i++) {
        rg_etcd_watch_destroy(z->watches[i].w);
    }
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
    for (int i = 0; i < RDZV_W_N; i++) {
        rg_etcd_watch_stats_add(z->watches[i].w, out);
    }
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
