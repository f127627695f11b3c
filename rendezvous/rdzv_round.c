/*
 * The rendezvous protocol (see include/regroup/rdzv.h and docs/etcd-keys.md).
 *
 * The agent never trusts an event alone: an event under the job prefix only says "look
 * again", and the state is then read from etcd in one transaction. That keeps the protocol
 * correct across watch reconnects, compactions and events drained while joining.
 */
#include "etcd_internal.h"

#include <regroup/rdzv.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define RDZV_KEY_MAX        512
#define RDZV_BACK_ROUNDS    16     /* how far back to look for the last closed round */
#define RDZV_RETRY_MS       200
#define RDZV_VERIFY_MS      1000

struct rg_rdzv {
    rg_rdzv_params_t p;
    char             job[128];
    char             addr[RG_RDZV_ADDR_MAX];
    char             prefix[200];           /* /regroup/<job>/ */
    char             agent[RG_RDZV_ID_MAX];
    rg_etcd_t       *etcd;
    int64_t          lease;
    rg_etcd_keeper_t *keeper;
    rg_etcd_watch_t *watch;
    int              epfd;                  /* watch fd + keeper fd */
    int              keeper_fd_added;
    /* state */
    int              round;                 /* the round running, or being joined */
    bool             running;               /* a closed round including us runs */
    rg_rdzv_assignment_t cur;
    int              last_round;            /* the last closed round we were in, -1 */
    int              last_rank;             /* our group rank in it */
    uint64_t         min_reached_ns;
    int              registered_round;
    bool             waiting;
    bool             verify;                /* read the state at the next check */
    uint64_t         verified_ns;           /* when check last read the state */
};

/* ---- small helpers -------------------------------------------------------------------- */

static void key_of(const rg_rdzv_t *z, char *buf, const char *fmt, ...) RG_PRINTF(3, 4);
static void key_of(const rg_rdzv_t *z, char *buf, const char *fmt, ...)
{
    va_list ap;
    size_t n = (size_t)snprintf(buf, RDZV_KEY_MAX, "%s", z->prefix);
    va_start(ap, fmt);
    vsnprintf(buf + n, RDZV_KEY_MAX - n, fmt, ap);
    va_end(ap);
}

static bool job_id_ok(const char *job)
{
    size_t n = job ? strlen(job) : 0;
    if (n == 0 || n > 64) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = job[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.')) {
            return false;
        }
    }
    return true;
}

static int free_port(const char *addr)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port = 0;

    if (fd < 0) {
        return 0;
    }
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        port = ntohs(sa.sin_port);
    }
    close(fd);
    return port;
}

static rg_status_t lease_start(rg_rdzv_t *z, rg_deadline_t deadline)
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

static void lease_stop(rg_rdzv_t *z)
{
    if (z->keeper != NULL) {
        epoll_ctl(z->epfd, EPOLL_CTL_DEL, z->keeper_fd_added, NULL);
        rg_etcd_keeper_stop(z->keeper);
        z->keeper = NULL;
    }
}

rg_status_t rg_rdzv_create(const rg_rdzv_params_t *params, rg_rdzv_t **rdzv_p)
{
    rg_rdzv_t *z;
    rg_status_t st;
    char host[64] = "node";
    rg_deadline_t deadline;
    struct epoll_event ev = {.events = EPOLLIN};

    if (params == NULL || rdzv_p == NULL) {
        return rg_error(RG_EINVAL, "rendezvous: NULL argument");
    }
    if (!job_id_ok(params->job)) {
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
    snprintf(z->prefix, sizeof(z->prefix), "/regroup/%s/", z->job);
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    snprintf(z->agent, sizeof(z->agent), "%s-%d-%08x", host, (int)getpid(),
             (unsigned)(rg_now_ns() ^ ((uint64_t)getpid() << 16)));
    z->last_round = -1;
    z->last_rank = -1;
    z->registered_round = -1;
    z->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (z->epfd < 0) {
        free(z);
        return rg_error(RG_ESYS, "rendezvous: epoll_create1: %s", strerror(errno));
    }
    deadline = rg_deadline_in_ms(z->p.join_timeout_ms);
    st = rg_etcd_create(&z->p.etcd, &z->etcd);
    if (st != RG_OK) {
        goto err;
    }
    st = lease_start(z, deadline);
    if (st != RG_OK) {
        goto err;
    }
    rg_etcd_watch_req_t wr = {.key = z->prefix, .prefix = true};
    st = rg_etcd_watch_create(&z->p.etcd, &wr, 0, &z->watch);
    if (st != RG_OK) {
        goto err;
    }
    ev.data.fd = rg_etcd_watch_fd(z->watch);
    if (epoll_ctl(z->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
        st = rg_error(RG_ESYS, "rendezvous: epoll_ctl: %s", strerror(errno));
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
    lease_stop(z);
    rg_etcd_destroy(z->etcd);
    close(z->epfd);
    free(z);
}

const char *rg_rdzv_agent_id(const rg_rdzv_t *z)
{
    return z->agent;
}

rg_etcd_t *rg_rdzv_client(rg_rdzv_t *z)
{
    return z->etcd;
}

int rg_rdzv_fd(const rg_rdzv_t *z)
{
    return z->epfd;
}

/* Drains queued watch events; true if any is outside status/ (i.e. may matter). */
static bool drain_events(rg_rdzv_t *z)
{
    rg_etcd_event_t ev;
    bool relevant = false;
    char status_prefix[RDZV_KEY_MAX];
    size_t sp;
    rg_status_t st;

    key_of(z, status_prefix, "status/");
    sp = strlen(status_prefix);
    /* No watch (a new one could not be made last time): as if it had just ended. */
    st = z->watch == NULL ? RG_ECANCELED : RG_OK;
    while (st == RG_OK &&
           (st = rg_etcd_watch_next(z->watch, RG_DEADLINE_POLL, &ev, NULL)) == RG_OK) {
        if (strncmp(ev.kv.key, status_prefix, sp) != 0) {
            relevant = true;
        }
        rg_etcd_event_cleanup(&ev);
    }
    if (st != RG_ETIMEDOUT) {
        /* The watch is over (compacted, refused, never made): start a new one from now.
         * State is re-read after this, and at least every second, so nothing is missed. */
        if (z->watch != NULL) {
            rg_warn("rendezvous: job watch ended (%s); watching again", rg_last_error());
            epoll_ctl(z->epfd, EPOLL_CTL_DEL, rg_etcd_watch_fd(z->watch), NULL);
            rg_etcd_watch_destroy(z->watch);
            z->watch = NULL;
        }
        rg_etcd_watch_req_t wr = {.key = z->prefix, .prefix = true};
        if (rg_etcd_watch_create(&z->p.etcd, &wr, 0, &z->watch) == RG_OK) {
            struct epoll_event e = {.events = EPOLLIN, .data.fd = rg_etcd_watch_fd(z->watch)};
            epoll_ctl(z->epfd, EPOLL_CTL_ADD, e.data.fd, &e);
        } else {
            z->watch = NULL;
            rg_warn("rendezvous: cannot watch the job (%s); reading its state every second",
                    rg_last_error());
        }
        relevant = true;
    }
    return relevant;
}

/* ---- reading the round -------------------------------------------------------------- */

typedef struct {
    char    agent[RG_RDZV_ID_MAX];
    char    addr[RG_RDZV_ADDR_MAX];
    int     nproc;
    int     port;
    int     prev_round;
    int     prev_rank;
    int64_t create_rev;
} node_desc_t;

static rg_status_t read_round(rg_rdzv_t *z, int *round_p)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    int64_t r;
    rg_status_t st;

    key_of(z, key, "round");
    st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    if (st == RG_ENOENT) {
        /* First agent of the job: create round 0 if nobody did in between. */
        rg_etcd_cmp_t c = {.key = key, .target = RG_ETCD_CMP_CREATE, .result = RG_ETCD_EQUAL};
        rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT, .u.put = {.key = key, .value = "0",
                                                            .value_len = 1}};
        rg_etcd_txn_t t;
        st = rg_etcd_txn(z->etcd, &c, 1, &op, 1, NULL, 0, 0, &t);
        if (st != RG_OK) {
            return st;
        }
        rg_etcd_txn_cleanup(&t);
        st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    }
    if (st != RG_OK) {
        return st;
    }
    if (!rg_parse_i64(v, &r) || r < 0 || r > 1000000000) {
        st = rg_error(RG_EPROTO, "rendezvous: %s holds '%.32s', not a round number", key, v);
        free(v);
        return st;
    }
    free(v);
    *round_p = (int)r;
    return RG_OK;
}

static bool parse_desc(const rg_etcd_kv_t *kv, node_desc_t *d)
{
    json_t *j = json_loadb(kv->value, kv->value_len, 0, NULL);
    const char *agent = json_string_value(json_object_get(j, "agent"));
    const char *addr = json_string_value(json_object_get(j, "addr"));
    bool ok = agent != NULL && addr != NULL;

    if (ok) {
        snprintf(d->agent, sizeof(d->agent), "%s", agent);
        snprintf(d->addr, sizeof(d->addr), "%s", addr);
        d->nproc = (int)json_integer_value(json_object_get(j, "nproc"));
        d->port = (int)json_integer_value(json_object_get(j, "port"));
        d->prev_round = (int)json_integer_value(json_object_get(j, "prev_round"));
        d->prev_rank = (int)json_integer_value(json_object_get(j, "prev_rank"));
        d->create_rev = kv->create_revision;
        ok = d->nproc >= 1 && d->nproc <= 4096;
    }
    json_decref(j);
    return ok;
}

static rg_status_t parse_closed(const char *v, size_t len, int round, rg_rdzv_assignment_t *a)
{
    json_t *j = json_loadb(v, len, 0, NULL);
    json_t *members = json_object_get(j, "members");
    size_t n = json_array_size(members);

    memset(a, 0, sizeof(*a));
    if (j == NULL || n == 0 || n > RG_RDZV_MAX_NODES) {
        json_decref(j);
        return rg_error(RG_EPROTO, "rendezvous: round %d's closed record is malformed", round);
    }
    a->round = round;
    a->group_rank = -1;
    a->restart_count = (int)json_integer_value(json_object_get(j, "restarts"));
    a->job_failed = json_is_true(json_object_get(j, "failed"));
    a->master_port = (int)json_integer_value(json_object_get(j, "master_port"));
    snprintf(a->master_addr, sizeof(a->master_addr), "%s",
             json_string_value(json_object_get(j, "master_addr"))
                 ? json_string_value(json_object_get(j, "master_addr"))
                 : "");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(members, i);
        const char *agent = json_string_value(json_object_get(m, "agent"));
        const char *addr = json_string_value(json_object_get(m, "addr"));
        int nproc = (int)json_integer_value(json_object_get(m, "nproc"));
        if (agent == NULL || addr == NULL || nproc < 1) {
            json_decref(j);
            return rg_error(RG_EPROTO, "rendezvous: round %d's member %zu is malformed", round,
                            i);
        }
        snprintf(a->members[i].agent, RG_RDZV_ID_MAX, "%s", agent);
        snprintf(a->members[i].addr, RG_RDZV_ADDR_MAX, "%s", addr);
        a->members[i].nproc = nproc;
        a->world_size += nproc;
    }
    a->n_members = (int)n;
    a->group_world = (int)n;
    json_decref(j);
    return RG_OK;
}

static void assignment_locate(rg_rdzv_assignment_t *a, const char *agent)
{
    int offset = 0;
    a->group_rank = -1;
    for (int i = 0; i < a->n_members; i++) {
        if (strcmp(a->members[i].agent, agent) == 0) {
            a->group_rank = i;
            a->rank_offset = offset;
        }
        offset += a->members[i].nproc;
    }
}

/* Reads rounds/<r>/closed into *a; RG_ENOENT if the round is open. */
static rg_status_t read_closed(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *a)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    rg_status_t st;

    key_of(z, key, "rounds/%d/closed", r);
    st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    if (st != RG_OK) {
        return st;
    }
    st = parse_closed(v, len, r, a);
    free(v);
    return st;
}

static rg_status_t count_prefix(rg_rdzv_t *z, const char *key, int64_t *count)
{
    rg_etcd_range_req_t rq = {.key = key, .prefix = true, .count_only = true};
    rg_etcd_range_t r;
    rg_status_t st = rg_etcd_range(z->etcd, &rq, 0, &r);
    if (st == RG_OK) {
        *count = r.count;
        rg_etcd_range_cleanup(&r);
    }
    return st;
}

static bool key_exists(const rg_etcd_range_t *r, const char *key)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        if (strcmp(r->kvs[i].key, key) == 0) {
            return true;
        }
    }
    return false;
}

/* ---- registering and closing ---------------------------------------------------------- */

static rg_status_t register_node(rg_rdzv_t *z, int r)
{
    char key[RDZV_KEY_MAX];
    char wkey[RDZV_KEY_MAX];
    json_t *d;
    char *text;
    rg_etcd_txn_t t;
    rg_status_t st;

    d = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "agent", z->agent, "addr", z->addr,
                  "nproc", z->p.nproc, "port", free_port(z->addr), "prev_round",
                  z->last_round, "prev_rank", z->last_rank);
    text = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    if (text == NULL) {
        return rg_error(RG_ENOMEM, "rendezvous: node descriptor");
    }
    key_of(z, key, "rounds/%d/nodes/%s", r, z->agent);
    key_of(z, wkey, "waiting/%s", z->agent);
    /* Joining and leaving the waiting list in one step: never seen in neither. */
    rg_etcd_op_t ops[2] = {
        {.type = RG_ETCD_OP_PUT, .u.put = {.key = key, .value = text, .value_len = strlen(text),
                                           .lease = z->lease}},
        {.type = RG_ETCD_OP_DELETE, .u.del = {.key = wkey}},
    };
    st = rg_etcd_txn(z->etcd, NULL, 0, ops, 2, NULL, 0, 0, &t);
    free(text);
    if (st != RG_OK) {
        return rg_error_wrap(st, "rendezvous: registering in round %d", r);
    }
    rg_etcd_txn_cleanup(&t);
    z->registered_round = r;
    z->waiting = false;
    rg_info("rendezvous: joined round %d", r);
    return RG_OK;
}

static rg_status_t register_waiting(rg_rdzv_t *z)
{
    char key[RDZV_KEY_MAX];
    json_t *d;
    char *val;
    rg_status_t st;

    if (z->waiting) {
        return RG_OK;
    }
    key_of(z, key, "waiting/%s", z->agent);
    d = json_pack("{s:s, s:s, s:i}", "agent", z->agent, "addr", z->addr, "nproc", z->p.nproc);
    val = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    if (val == NULL) {
        return rg_error(RG_ENOMEM, "rendezvous: waiting record");
    }
    st = rg_etcd_put_str(z->etcd, key, val, z->lease, 0, NULL);
    free(val);
    if (st == RG_OK) {
        z->waiting = true;
        rg_info("rendezvous: the job runs without this node; waiting to join");
    }
    return st;
}

static int cmp_desc(const void *a, const void *b, void *last_round_p)
{
    const node_desc_t *x = a;
    const node_desc_t *y = b;
    int lr = *(const int *)last_round_p;
    /* Members of the last closed round first, in their old order; then newcomers by arrival. */
    long kx = x->prev_round == lr && x->prev_rank >= 0 ? x->prev_rank : 1L << 30;
    long ky = y->prev_round == lr && y->prev_rank >= 0 ? y->prev_rank : 1L << 30;
    if (kx != ky) {
        return kx < ky ? -1 : 1;
    }
    return x->create_rev < y->create_rev ? -1 : x->create_rev > y->create_rev;
}

/* The latest closed round before r, or -1. */
static int last_closed_before(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *a)
{
    for (int q = r - 1; q >= 0 && q >= r - RDZV_BACK_ROUNDS; q--) {
        if (read_closed(z, q, a) == RG_OK) {
            return q;
        }
    }
    return -1;
}

/* Decides whether round r can close now and closes it if so. */
static rg_status_t try_close(rg_rdzv_t *z, int r, node_desc_t *nodes, int n, int64_t rev,
                             uint64_t *wake_ns)
{
    static rg_rdzv_assignment_t prev;  /* large: kept off the stack; one agent per process */
    char key[RDZV_KEY_MAX];
    char closed_key[RDZV_KEY_MAX];
    char round_key[RDZV_KEY_MAX];
    char nodes_key[RDZV_KEY_MAX];
    char round_val[32];
    int prev_round;
    bool close = false;
    int64_t failures = 0;
    rg_status_t st;

    if (n < z->p.min_nodes) {
        z->min_reached_ns = 0;
        return RG_OK;
    }
    if (z->min_reached_ns == 0) {
        z->min_reached_ns = rg_now_ns();
    }
    prev_round = last_closed_before(z, r, &prev);
    close = n >= z->p.max_nodes;
    if (!close && prev_round >= 0) {
        /* Everyone we expect is here: the live members of the last round and the waiters. */
        rg_etcd_range_t live;
        rg_etcd_range_t waiting;
        rg_etcd_range_req_t lq = {.key = nodes_key, .prefix = true, .keys_only = true};
        rg_etcd_range_req_t wq = {.key = key, .prefix = true};
        key_of(z, nodes_key, "rounds/%d/nodes/", prev_round);
        key_of(z, key, "waiting/");
        st = rg_etcd_range(z->etcd, &lq, 0, &live);
        if (st != RG_OK) {
            return st;
        }
        st = rg_etcd_range(z->etcd, &wq, 0, &waiting);
        if (st != RG_OK) {
            rg_etcd_range_cleanup(&live);
            return st;
        }
        close = true;
        for (size_t i = 0; i < live.n_kvs && close; i++) {
            const char *agent = strrchr(live.kvs[i].key, '/') + 1;
            bool here = false;
            for (int k = 0; k < n; k++) {
                here = here || strcmp(nodes[k].agent, agent) == 0;
            }
            close = here;
        }
        for (size_t i = 0; i < waiting.n_kvs && close; i++) {
            const char *agent = strrchr(waiting.kvs[i].key, '/') + 1;
            bool here = false;
            for (int k = 0; k < n; k++) {
                here = here || strcmp(nodes[k].agent, agent) == 0;
            }
            close = here;
        }
        rg_etcd_range_cleanup(&live);
        rg_etcd_range_cleanup(&waiting);
    }
    if (!close) {
        uint64_t at = z->min_reached_ns + (uint64_t)z->p.last_call_ms * 1000000ull;
        close = rg_now_ns() >= at;
        if (!close) {
            *wake_ns = at;
            return RG_OK;
        }
    }

    /* Close: order the members, count the restart, write it once. */
    qsort_r(nodes, (size_t)n, sizeof(*nodes), cmp_desc, &prev_round);
    if (n > z->p.max_nodes) {
        n = z->p.max_nodes;
    }
    if (prev_round >= 0) {
        key_of(z, key, "failures/%d/", prev_round);
        st = count_prefix(z, key, &failures);
        if (st != RG_OK) {
            return st;
        }
    }
    int restarts = (prev_round >= 0 ? prev.restart_count : 0) + (failures > 0 ? 1 : 0);
    json_t *members = json_array();
    for (int i = 0; i < n; i++) {
        json_array_append_new(members, json_pack("{s:s, s:s, s:i}", "agent", nodes[i].agent,
                                                 "addr", nodes[i].addr, "nproc",
                                                 nodes[i].nproc));
    }
    json_t *doc = json_pack("{s:o, s:i, s:b, s:s, s:i, s:f}", "members", members, "restarts",
                            restarts, "failed", restarts > z->p.max_restarts, "master_addr",
                            nodes[0].addr, "master_port", nodes[0].port, "time", rg_wall_s());
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (text == NULL) {
        return rg_error(RG_ENOMEM, "rendezvous: closed record");
    }
    key_of(z, closed_key, "rounds/%d/closed", r);
    key_of(z, round_key, "round");
    key_of(z, nodes_key, "rounds/%d/nodes/", r);
    snprintf(round_val, sizeof(round_val), "%d", r);
    size_t end_len;
    char *nodes_end = etcd_prefix_end(nodes_key, &end_len);
    rg_etcd_cmp_t cmps[3] = {
        {.key = closed_key, .target = RG_ETCD_CMP_CREATE, .result = RG_ETCD_EQUAL},
        {.key = round_key, .target = RG_ETCD_CMP_VALUE, .result = RG_ETCD_EQUAL,
         .value = round_val, .value_len = strlen(round_val)},
        /* Nobody joined or changed since we listed (a new key's mod revision is newer). */
        {.key = nodes_key, .range_end = nodes_end, .target = RG_ETCD_CMP_MOD,
         .result = RG_ETCD_LESS, .number = rev + 1},
    };
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                       .u.put = {.key = closed_key, .value = text, .value_len = strlen(text)}};
    rg_etcd_txn_t t;
    st = nodes_end ? rg_etcd_txn(z->etcd, cmps, 3, &op, 1, NULL, 0, 0, &t)
                   : rg_error(RG_ENOMEM, "rendezvous: range end");
    free(nodes_end);
    free(text);
    if (st != RG_OK) {
        return st;
    }
    if (t.succeeded) {
        rg_info("rendezvous: closed round %d with %d nodes (restarts %d)", r, n, restarts);
        /* Old rounds are history now; keep the last two for status and debugging. */
        if (r >= 2) {
            char old[RDZV_KEY_MAX];
            rg_etcd_delete_t dr;
            key_of(z, old, "rounds/%d/", r - 2);
            rg_etcd_delete_req_t dq = {.key = old, .prefix = true};
            if (rg_etcd_delete(z->etcd, &dq, 0, &dr) == RG_OK) {
                rg_etcd_delete_cleanup(&dr);
            }
        }
    }
    rg_etcd_txn_cleanup(&t);
    *wake_ns = rg_now_ns();   /* look again at once: closed, or someone raced us */
    return RG_OK;
}

static rg_status_t advance_round(rg_rdzv_t *z, int r);

/* True if every member of closed round r recorded that its workers finished. */
static bool round_done(rg_rdzv_t *z, int r, const rg_rdzv_assignment_t *a)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t res;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true, .keys_only = true};
    bool all = true;

    key_of(z, key, "rounds/%d/done/", r);
    if (rg_etcd_range(z->etcd, &rq, 0, &res) != RG_OK) {
        return false;
    }
    for (int i = 0; i < a->n_members && all; i++) {
        char dk[RDZV_KEY_MAX];
        key_of(z, dk, "rounds/%d/done/%s", r, a->members[i].agent);
        all = key_exists(&res, dk);
    }
    rg_etcd_range_cleanup(&res);
    return all;
}

/* One look at round r: returns RG_OK with *done set when a round including us closed. */
static rg_status_t join_step(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *out, bool *done,
                             uint64_t *wake_ns)
{
    static node_desc_t nodes[RG_RDZV_MAX_NODES * 2];
    char key[RDZV_KEY_MAX];
    char closed_key[RDZV_KEY_MAX];
    rg_etcd_range_t res;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};
    int n = 0;
    bool closed = false;
    rg_status_t st;

    *done = false;
    key_of(z, key, "rounds/%d/", r);
    key_of(z, closed_key, "rounds/%d/closed", r);
    st = rg_etcd_range(z->etcd, &rq, 0, &res);
    if (st != RG_OK) {
        return st;
    }
    for (size_t i = 0; i < res.n_kvs; i++) {
        if (strcmp(res.kvs[i].key, closed_key) == 0) {
            st = parse_closed(res.kvs[i].value, res.kvs[i].value_len, r, out);
            closed = true;
        } else if (strstr(res.kvs[i].key + strlen(key), "nodes/") == res.kvs[i].key + strlen(key)
                   && n < (int)RG_ARRAY_SIZE(nodes)) {
            if (parse_desc(&res.kvs[i], &nodes[n])) {
                n++;
            }
        }
    }
    int64_t rev = res.revision;
    rg_etcd_range_cleanup(&res);
    if (st != RG_OK) {
        return st;
    }
    if (closed) {
        assignment_locate(out, z->agent);
        if (out->group_rank >= 0 || out->job_failed) {
            *done = true;
            return RG_OK;
        }
        /* A round whose every member finished: the job is over, without us. */
        if (round_done(z, r, out)) {
            out->job_done = true;
            *done = true;
            return RG_OK;
        }
        /* The round runs without us: wait to be let in. Below max size, open the next round
         * ourselves too (after registering, so that the closer expects us), rather than
         * depend on the running agents noticing the waiting key. */
        st = register_waiting(z);
        if (st == RG_OK && out->n_members < z->p.max_nodes) {
            st = advance_round(z, r);
            *wake_ns = rg_now_ns();
        }
        return st;
    }
    if (z->registered_round != r) {
        st = register_node(z, r);
        if (st != RG_OK) {
            return st;
        }
        *wake_ns = rg_now_ns();   /* list again, with us in it */
        return RG_OK;
    }
    return try_close(z, r, nodes, n, rev, wake_ns);
}

rg_status_t rg_rdzv_join(rg_rdzv_t *z, int cancel_fd, rg_rdzv_assignment_t *out)
{
    rg_deadline_t deadline = rg_deadline_in_ms(z->p.join_timeout_ms);
    int r = -1;
    rg_status_t st;

    if (out == NULL) {
        return rg_error(RG_EINVAL, "rendezvous join: NULL out");
    }
    z->running = false;
    z->min_reached_ns = 0;
    if (z->keeper == NULL || rg_etcd_keeper_lost(z->keeper)) {
        lease_stop(z);
        z->registered_round = -1;
        z->waiting = false;
        st = lease_start(z, deadline);
        if (st != RG_OK) {
            return st;
        }
    }
    for (;;) {
        uint64_t wake_ns = 0;
        bool done = false;

        st = read_round(z, &r);
        if (st == RG_OK) {
            if (r != z->round) {
                z->min_reached_ns = 0;
            }
            z->round = r;
            st = join_step(z, r, out, &done, &wake_ns);
        }
        if (st == RG_OK && done) {
            break;
        }
        if (st != RG_OK) {
            /* etcd trouble is retried until the join deadline; say it once per failure. */
            rg_warn("rendezvous: %s; retrying", rg_last_error());
            wake_ns = rg_now_ns() + RDZV_RETRY_MS * 1000000ull;
        }
        if (rg_deadline_passed(deadline)) {
            int64_t n = 0;
            char key[RDZV_KEY_MAX];
            key_of(z, key, "rounds/%d/nodes/", r);
            (void)count_prefix(z, key, &n);
            return rg_error(RG_ETIMEDOUT, "rendezvous: round %d of job %s did not close within "
                            "the join timeout (%lld ms): %lld of min %d nodes joined%s",
                            r, z->job, (long long)z->p.join_timeout_ms, (long long)n,
                            z->p.min_nodes, z->waiting ? " (this node was waiting)" : "");
        }
        /* Sleep until an event, the cancel fd, the last-call time or the deadline. */
        uint64_t until = wake_ns ? RG_MIN(wake_ns, deadline) : deadline;
        until = RG_MIN(until, rg_now_ns() + RDZV_VERIFY_MS * 1000000ull);
        int64_t ms = until > rg_now_ns() ? (int64_t)((until - rg_now_ns() + 999999) / 1000000) : 0;
        struct pollfd pfd[2] = {{.fd = z->epfd, .events = POLLIN},
                                {.fd = cancel_fd, .events = POLLIN}};
        if (ms > 0 && poll(pfd, cancel_fd >= 0 ? 2 : 1, (int)RG_MIN(ms, 60000)) > 0 &&
            cancel_fd >= 0 && (pfd[1].revents & POLLIN)) {
            return rg_error(RG_ECANCELED, "rendezvous: join interrupted");
        }
        drain_events(z);
        if (z->keeper != NULL && rg_etcd_keeper_lost(z->keeper)) {
            lease_stop(z);
            z->registered_round = -1;
            z->waiting = false;
            st = lease_start(z, deadline);
            if (st != RG_OK) {
                return st;
            }
        }
    }
    if (!out->job_failed && !out->job_done) {
        z->running = true;
        z->cur = *out;
        z->last_round = out->round;
        z->last_rank = out->group_rank;
        z->verify = true;   /* events drained while joining may concern this round */
    }
    return RG_OK;
}

/* ---- while a round runs --------------------------------------------------------------- */

rg_status_t rg_rdzv_check(rg_rdzv_t *z, rg_rdzv_change_t *change)
{
    char k_round[RDZV_KEY_MAX];
    char k_fail[RDZV_KEY_MAX];
    char k_nodes[RDZV_KEY_MAX];
    char k_done[RDZV_KEY_MAX];
    char k_wait[RDZV_KEY_MAX];
    rg_etcd_txn_t t;
    rg_status_t st;

    *change = RG_RDZV_NONE;
    if (z->keeper != NULL && rg_etcd_keeper_lost(z->keeper)) {
        *change = RG_RDZV_LEASE_LOST;
        return RG_OK;
    }
    /* Events say when to look; a look at least every RDZV_VERIFY_MS bounds the damage of an
     * event that never arrives (one small read per second). */
    if (!drain_events(z) && !z->verify &&
        rg_now_ns() - z->verified_ns < RDZV_VERIFY_MS * 1000000ull) {
        return RG_OK;
    }
    z->verify = false;
    z->verified_ns = rg_now_ns();
    if (!z->running) {
        return RG_OK;
    }
    int r = z->cur.round;
    key_of(z, k_round, "round");
    key_of(z, k_fail, "failures/%d/", r);
    key_of(z, k_nodes, "rounds/%d/nodes/", r);
    key_of(z, k_done, "rounds/%d/done/", r);
    key_of(z, k_wait, "waiting/");
    /* One read of everything that can end the round. */
    rg_etcd_op_t ops[5] = {
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_round}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_fail, .prefix = true,
                                               .count_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_nodes, .prefix = true,
                                               .keys_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_done, .prefix = true,
                                               .keys_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_wait, .prefix = true,
                                               .count_only = true}},
    };
    st = rg_etcd_txn(z->etcd, NULL, 0, ops, 5, NULL, 0, 0, &t);
    if (st != RG_OK) {
        return st;
    }
    const rg_etcd_range_t *round = &t.results[0].u.range;
    int64_t now_round = 0;
    if (round->n_kvs == 1 && rg_parse_i64(round->kvs[0].value, &now_round) && now_round > r) {
        *change = RG_RDZV_NEW_ROUND;
    } else if (t.results[1].u.range.count > 0) {
        *change = RG_RDZV_FAILURE;
    } else {
        for (int i = 0; i < z->cur.n_members && *change == RG_RDZV_NONE; i++) {
            char nk[RDZV_KEY_MAX];
            char dk[RDZV_KEY_MAX];
            key_of(z, nk, "rounds/%d/nodes/%s", r, z->cur.members[i].agent);
            key_of(z, dk, "rounds/%d/done/%s", r, z->cur.members[i].agent);
            if (!key_exists(&t.results[2].u.range, nk) && !key_exists(&t.results[3].u.range, dk)) {
                rg_info("rendezvous: member %s of round %d is gone", z->cur.members[i].agent, r);
                *change = RG_RDZV_MEMBER_LOST;
            }
        }
        if (*change == RG_RDZV_NONE && t.results[4].u.range.count > 0 &&
            z->cur.n_members < z->p.max_nodes) {
            *change = RG_RDZV_JOIN_PENDING;
        }
    }
    rg_etcd_txn_cleanup(&t);
    return RG_OK;
}

rg_status_t rg_rdzv_report_failure(rg_rdzv_t *z, const rg_rdzv_failure_t *f)
{
    char key[RDZV_KEY_MAX];
    json_t *d;
    char *text;
    rg_status_t st;

    key_of(z, key, "failures/%d/%s", z->cur.round, z->agent);
    /* torchrun's error file: {"message": {"message": "...", "extraInfo": {...}}} or
     * {"message": "..."}; anything else is shown as it is. */
    json_t *ej = f->error ? json_loads(f->error, 0, NULL) : NULL;
    json_t *em = json_object_get(ej, "message");
    const char *error = json_string_value(em) ? json_string_value(em)
                        : json_string_value(json_object_get(em, "message"))
                            ? json_string_value(json_object_get(em, "message"))
                            : f->error;
    d = json_pack("{s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:s, s:s}", "round", z->cur.round,
                  "agent", z->agent, "addr", z->addr, "rank", f->rank, "local_rank",
                  f->local_rank, "exit_code", f->exit_code, "signal", f->signal, "time",
                  rg_wall_s(), "error", error ? error : "", "stderr_tail",
                  f->stderr_tail ? f->stderr_tail : "");
    text = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    json_decref(ej);
    if (text == NULL) {
        return rg_error(RG_ENOMEM, "rendezvous: failure record");
    }
    /* No lease: the record outlives this agent, for the job's failure report. */
    st = rg_etcd_put_str(z->etcd, key, text, 0, 0, NULL);
    free(text);
    return st;
}

/* Moves `round` from r to r + 1 by compare-and-swap (a no-op if it already moved). */
static rg_status_t advance_round(rg_rdzv_t *z, int r)
{
    char key[RDZV_KEY_MAX];
    char cur[32];
    char next[32];
    rg_etcd_txn_t t;
    rg_status_t st;

    key_of(z, key, "round");
    snprintf(cur, sizeof(cur), "%d", r);
    snprintf(next, sizeof(next), "%d", r + 1);
    rg_etcd_cmp_t c = {.key = key, .target = RG_ETCD_CMP_VALUE, .result = RG_ETCD_EQUAL,
                       .value = cur, .value_len = strlen(cur)};
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                       .u.put = {.key = key, .value = next, .value_len = strlen(next)}};
    st = rg_etcd_txn(z->etcd, &c, 1, &op, 1, NULL, 0, 0, &t);
    if (st == RG_OK) {
        if (t.succeeded) {
            rg_info("rendezvous: opened round %d", r + 1);
        }
        rg_etcd_txn_cleanup(&t);
    }
    return st;
}

rg_status_t rg_rdzv_next_round(rg_rdzv_t *z)
{
    int r;
    rg_status_t st;

    z->running = false;
    st = read_round(z, &r);
    if (st != RG_OK) {
        return st;
    }
    if (r > z->cur.round) {
        return RG_OK;   /* someone already moved on */
    }
    return advance_round(z, r);
}

rg_status_t rg_rdzv_done(rg_rdzv_t *z)
{
    char key[RDZV_KEY_MAX];
    key_of(z, key, "rounds/%d/done/%s", z->cur.round, z->agent);
    return rg_etcd_put_str(z->etcd, key, "1", 0, 0, NULL);
}

rg_status_t rg_rdzv_leave(rg_rdzv_t *z)
{
    rg_status_t st;
    int64_t lease = z->lease;

    lease_stop(z);
    z->running = false;
    if (lease == 0) {
        return RG_OK;
    }
    z->lease = 0;
    st = rg_etcd_lease_revoke(z->etcd, lease, 0);
    return st == RG_ELEASE ? RG_OK : st;
}

void rg_rdzv_print_failures(rg_rdzv_t *z, FILE *out)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};

    key_of(z, key, "failures/");
    if (rg_etcd_range(z->etcd, &rq, 0, &r) != RG_OK) {
        fprintf(out, "regroup: cannot read the failures from etcd: %s\n", rg_last_error());
        return;
    }
    fprintf(out, "regroup: job %s failed; %zu worker failure(s):\n", z->job, r.n_kvs);
    fprintf(out, "  %-5s %-5s %-32s %-12s %-20s %s\n", "round", "rank", "node", "exit",
            "time", "error");
    for (size_t i = 0; i < r.n_kvs; i++) {
        json_t *j = json_loadb(r.kvs[i].value, r.kvs[i].value_len, 0, NULL);
        char exitbuf[32];
        char when[32];
        int sig = (int)json_integer_value(json_object_get(j, "signal"));
        time_t t = (time_t)json_real_value(json_object_get(j, "time"));
        struct tm tm;
        const char *err = json_string_value(json_object_get(j, "error"));
        const char *tail = json_string_value(json_object_get(j, "stderr_tail"));

        if (sig > 0) {
            snprintf(exitbuf, sizeof(exitbuf), "%s", sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
            if (sigabbrev_np(sig) != NULL) {
                snprintf(exitbuf, sizeof(exitbuf), "SIG%s", sigabbrev_np(sig));
            }
        } else {
            snprintf(exitbuf, sizeof(exitbuf), "exit %d",
                     (int)json_integer_value(json_object_get(j, "exit_code")));
        }
        gmtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        fprintf(out, "  %-5d %-5d %-32s %-12s %-20s %s\n",
                (int)json_integer_value(json_object_get(j, "round")),
                (int)json_integer_value(json_object_get(j, "rank")),
                json_string_value(json_object_get(j, "addr"))
                    ? json_string_value(json_object_get(j, "addr")) : "?",
                exitbuf, when, err && err[0] ? err : "-");
        if (tail != NULL && tail[0] != '\0') {
            fprintf(out, "        last stderr lines:\n");
            for (const char *p = tail; *p;) {
                const char *nl = strchr(p, '\n');
                int len = nl ? (int)(nl - p) : (int)strlen(p);
                fprintf(out, "          | %.*s\n", len, p);
                p += len + (nl ? 1 : 0);
            }
        }
        json_decref(j);
    }
    rg_etcd_range_cleanup(&r);
}
