/*
 * Building a group from a round: worker addresses exchanged through etcd.
 *
 * Rank r puts a header and its UCX worker address (binary) at <prefix><r>, then reads the
 * prefix until every rank's address is there, backing off from 1 ms to 20 ms between reads
 * and progressing its worker meanwhile (a peer's wire-up needs this worker to progress), and
 * finally creates one endpoint per peer and trades hellos with each.
 *
 * A caller may try the same prefix again after a failed creation (a regroup does, with a new
 * UCX worker each time), and its peers' tries begin and end at other times. So the header
 * numbers the try: an attempt, the same on every rank of one wire-up. A rank takes the
 * highest attempt under the prefix, or the next one if its own key already has that one (it
 * tried it and failed) or a peer withdrew from it. It reads only the addresses of its own
 * attempt, and gives up at once when a peer's key shows a later attempt or withdraws this
 * one: that peer's worker, and the address this rank may have read for it, are gone. A rank
 * whose attempt fails withdraws its address (the header alone, at its attempt), so that the
 * others give that attempt up too and meet at the next one. Before, a failed try deleted its
 * address and the next try read what it found: a try could connect to a peer's address of
 * the try before ("shmat failed" over shared memory), and ranks whose tries began a second
 * apart kept reading each other's old address (a regroup of four live ranks failed every 4 s
 * for a minute). One that fails on a header that differs (RG_EINVAL, RG_EPROTO) keeps its
 * address: every attempt fails the same way, and the peers must read it to fail at once
 * too. The header also carries the tuning values that decide how a message is cut into
 * transfers: ranks that differ there would wait on transfers that never come, so creation
 * fails at once instead, naming the rank and the values.
 */
#include "comm_internal.h"
#include "rdzv_keys.h"

#include <regroup/etcd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMM_DEFAULT_CREATE_MS 30000
#define COMM_MAX_ADDRESS       (64 * 1024)
#define COMM_MAX_PREFIX        256
#define COMM_UNPUBLISH_MS      1000     /* a failed attempt's withdrawal of its address */
#define COMM_WATCH_READ_MS     500      /* one read of the handshake's watch */

/* Before the address in the published value (host byte order; docs/etcd-keys.md). */
typedef struct {
    char     magic[4];   /* "RGC1" */
    uint32_t attempt;    /* which try at this prefix (the file's comment) */
    uint64_t ring_min;   /* REGROUP_COMM_RING_MIN_BYTES */
    uint64_t rhd_max;    /* REGROUP_COMM_RHD_MAX_BYTES */
    uint64_t seg;        /* REGROUP_COMM_SEGMENT_BYTES */
} comm_wire_hdr_t;

static const char comm_wire_magic[4] = {'R', 'G', 'C', '1'};

static void comm_wire_hdr(const rg_comm_t *comm, uint32_t attempt, comm_wire_hdr_t *h)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, comm_wire_magic, sizeof(h->magic));
    h->attempt = attempt;
    h->ring_min = comm->tuning.ring_min_bytes;
    h->rhd_max = comm->tuning.rhd_max_bytes;
    h->seg = comm->tuning.seg_bytes;
}

/* The header of rank r's value against ours: an error naming both when they differ. */
static rg_status_t comm_wire_check(const rg_comm_t *comm, int r, const void *value)
{
    comm_wire_hdr_t mine;
    comm_wire_hdr_t theirs;
    comm_wire_hdr(comm, 0, &mine);
    memcpy(&theirs, value, sizeof(theirs));
    if (memcmp(theirs.magic, comm_wire_magic, sizeof(theirs.magic)) != 0) {
        return rg_error(RG_EPROTO, "rank %d published its address in a format this build "
                        "does not read (another regroup version?)", r);
    }
    if (theirs.ring_min == mine.ring_min && theirs.rhd_max == mine.rhd_max &&
        theirs.seg == mine.seg) {
        return RG_OK;
    }
    return rg_error(RG_EINVAL, "rank %d runs with REGROUP_COMM_RING_MIN_BYTES=%llu "
                    "REGROUP_COMM_RHD_MAX_BYTES=%llu REGROUP_COMM_SEGMENT_BYTES=%llu, rank %d "
                    "with %llu %llu %llu: set them, and UCX_TLS (their defaults follow it), "
                    "alike on every rank", r, (unsigned long long)theirs.ring_min,
                    (unsigned long long)theirs.rhd_max, (unsigned long long)theirs.seg,
                    comm->rank, (unsigned long long)mine.ring_min,
                    (unsigned long long)mine.rhd_max, (unsigned long long)mine.seg);
}

static rg_status_t env_get(const char *name, char *out, size_t cap)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') {
        return rg_error(RG_EINVAL, "environment variable %s is not set", name);
    }
    if (strlen(v) >= cap) {
        return rg_error(RG_EINVAL, "environment variable %s is longer than %zu bytes", name,
                        cap - 1);
    }
    memcpy(out, v, strlen(v) + 1);
    return RG_OK;
}

static rg_status_t env_int(const char *name, int64_t min, int64_t max, int64_t *out)
{
    char buf[32];
    rg_status_t st = env_get(name, buf, sizeof(buf));
    if (st != RG_OK) {
        return st;
    }
    int64_t x;
    if (!rg_parse_i64(buf, &x) || x < min || x > max) {
        return rg_error(RG_EINVAL, "%s=%s: expected an integer in [%lld, %lld]", name, buf,
                        (long long)min, (long long)max);
    }
    *out = x;
    return RG_OK;
}

rg_status_t rg_comm_env_read(rg_comm_env_t *env)
{
    if (env == NULL) {
        return rg_error(RG_EINVAL, "rg_comm_env_read: NULL env");
    }
    memset(env, 0, sizeof(*env));
    int64_t rank = 0;
    int64_t size = 0;
    rg_status_t st = env_int("WORLD_SIZE", 1, RG_COMM_MAX_SIZE, &size);
    if (st == RG_OK) {
        st = env_int("RANK", 0, size - 1, &rank);
    }
    if (st == RG_OK) {
        st = env_int("REGROUP_ROUND", 0, INT64_MAX, &env->round);
    }
    if (st == RG_OK) {
        st = env_get("REGROUP_ETCD_ENDPOINTS", env->endpoints, sizeof(env->endpoints));
    }
    if (st == RG_OK) {
        st = env_get("REGROUP_JOB_ID", env->job_id, sizeof(env->job_id));
    }
    if (st != RG_OK) {
        return st;
    }
    for (const char *c = env->job_id; *c; c++) {
        if (*c == '/' || *c < 0x21 || *c > 0x7e) {
            return rg_error(RG_EINVAL, "REGROUP_JOB_ID=%s: '/', spaces and control characters "
                            "are not allowed", env->job_id);
        }
    }
    /* Optional: TLS files and etcd user, as the agent has them. */
    struct {
        const char *name;
        char       *dst;
        size_t      cap;
    } opt[] = {
        {"REGROUP_ETCD_CACERT", env->ca_file, sizeof(env->ca_file)},
        {"REGROUP_ETCD_CERT", env->cert_file, sizeof(env->cert_file)},
        {"REGROUP_ETCD_KEY", env->key_file, sizeof(env->key_file)},
        {"REGROUP_ETCD_USER", env->user, sizeof(env->user)},
        {"REGROUP_ETCD_PASSWORD", env->password, sizeof(env->password)},
    };
    const char *val[RG_ARRAY_SIZE(opt)];
    for (size_t i = 0; i < RG_ARRAY_SIZE(opt); i++) {
        const char *v = getenv(opt[i].name);
        val[i] = NULL;
        if (v != NULL && *v != '\0') {
            st = env_get(opt[i].name, opt[i].dst, opt[i].cap);
            if (st != RG_OK) {
                return st;
            }
            val[i] = opt[i].dst;
        }
    }
    env->etcd = (rg_etcd_params_t){.endpoints = env->endpoints,
                                   .ca_file = val[0],
                                   .cert_file = val[1],
                                   .key_file = val[2],
                                   .user = val[3],
                                   .password = val[4]};
    rdzv_keys_t keys;
    st = rdzv_keys_init(&keys, env->job_id);
    if (st == RG_OK) {
        st = rdzv_keys_comm_prefix(&keys, env->round, env->key_prefix, sizeof(env->key_prefix));
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "REGROUP_JOB_ID");
    }
    env->params.rank = (int)rank;
    env->params.size = (int)size;
    env->params.etcd_endpoints = env->endpoints;
    env->params.etcd_params = &env->etcd;
    env->params.key_prefix = env->key_prefix;
    return RG_OK;
}

/* Progresses the worker for about ms milliseconds, sleeping briefly between passes. */
static void comm_progress_for(rg_comm_t *comm, int64_t ms, rg_deadline_t deadline)
{
    rg_deadline_t until = RG_MIN(rg_deadline_in_ms(ms), deadline);
    const struct timespec nap = {.tv_sec = 0, .tv_nsec = 200000};
    for (int i = 0; i < 100000 && !rg_deadline_passed(until); i++) {
        if (ucp_worker_progress(comm->worker) == 0) {
            nanosleep(&nap, NULL);
        }
    }
}

/* The header of a value under the prefix that names rank *r_p of this group, or NULL (a
 * key of another kind, or a rank out of range: ignored). RG_EPROTO in *st for a value that
 * cannot be one of ours. */
static const comm_wire_hdr_t *comm_wire_value(const rg_comm_t *comm, const rg_etcd_kv_t *kv,
                                              size_t plen, int *r_p, rg_status_t *st)
{
    int64_t r;
    *st = RG_OK;
    if (kv->key_len <= plen || !rg_parse_i64(kv->key + plen, &r) || r < 0 ||
        r >= comm->size) {
        rg_debug("ignoring key %s under the group's prefix", kv->key);
        return NULL;
    }
    const size_t hl = sizeof(comm_wire_hdr_t);
    if (kv->value_len < hl || kv->value_len > hl + COMM_MAX_ADDRESS) {
        *st = rg_error(RG_EPROTO, "address of rank %lld under %.*s has %zu bytes", (long long)r,
                       (int)plen, kv->key, kv->value_len);
        return NULL;
    }
    if (memcmp(kv->value, comm_wire_magic, sizeof(comm_wire_magic)) != 0) {
        *st = rg_error(RG_EPROTO, "rank %lld published its address in a format this build "
                       "does not read (another regroup version?)", (long long)r);
        return NULL;
    }
    *r_p = (int)r;
    return (const comm_wire_hdr_t *)(const void *)kv->value;
}

/* This rank's attempt at prefix: the highest one published there, or the next one when this
 * rank's own key already has it (a try of its own that failed) or a rank withdrew from it. */
static rg_status_t comm_wire_attempt(rg_comm_t *comm, rg_etcd_t *etcd, const char *prefix,
                                     rg_deadline_t deadline, uint32_t *attempt)
{
    rg_etcd_range_req_t rreq = {.key = prefix, .prefix = true};
    rg_etcd_range_t res;
    rg_status_t st = rg_etcd_range(etcd, &rreq, deadline, &res);
    if (st != RG_OK) {
        return rg_error_wrap(st, "reading the group's addresses under %s", prefix);
    }
    uint32_t top = 0;
    bool top_done = false;   /* a rank tried the top attempt already: this one, or one that
                                withdrew from it */
    for (size_t i = 0; i < res.n_kvs; i++) {
        int r;
        rg_status_t vst;
        const comm_wire_hdr_t *hp = comm_wire_value(comm, &res.kvs[i], strlen(prefix), &r, &vst);
        if (hp == NULL) {
            continue;   /* a malformed value fails the read loop, which names it */
        }
        comm_wire_hdr_t h;
        memcpy(&h, hp, sizeof(h));
        bool done = r == comm->rank || res.kvs[i].value_len == sizeof(comm_wire_hdr_t);
        if (h.attempt > top) {
            top = h.attempt;
            top_done = done;
        } else if (h.attempt == top) {
            top_done = top_done || done;
        }
    }
    rg_etcd_range_cleanup(&res);
    if (top_done && top == UINT32_MAX) {
        return rg_error(RG_EPROTO, "group under %s: no attempt number left", prefix);
    }
    *attempt = top_done ? top + 1 : top;
    return RG_OK;
}

/* The error for a peer's value past this attempt: a later attempt, or this one withdrawn. */
static rg_status_t comm_wire_gone(const rg_comm_t *comm, const char *prefix, int r,
                                  const comm_wire_hdr_t *h)
{
    if (h->attempt > comm->attempt) {
        return rg_error(RG_EPEER, "group of %d under %s: rank %d went on to attempt %u while "
                        "this rank was at attempt %u", comm->size, prefix, r,
                        (unsigned)h->attempt, (unsigned)comm->attempt);
    }
    return rg_error(RG_EPEER, "group of %d under %s: rank %d gave attempt %u up", comm->size,
                    prefix, r, (unsigned)comm->attempt);
}

/* Reads every address of this attempt; RG_INPROGRESS while some rank is missing, RG_EPEER
 * once a rank gave the attempt up. *revision is the store's revision of the read. */
static rg_status_t comm_read_addresses(rg_comm_t *comm, rg_etcd_t *etcd, const char *prefix,
                                       rg_deadline_t deadline, void **addrs, size_t *lens,
                                       int *n_found, int64_t *revision)
{
    rg_etcd_range_req_t rreq = {.key = prefix, .prefix = true};
    rg_etcd_range_t res;
    rg_status_t st = rg_etcd_range(etcd, &rreq, deadline, &res);
    if (st != RG_OK) {
        return rg_error_wrap(st, "reading the group's addresses under %s", prefix);
    }
    *revision = res.revision;
    size_t plen = strlen(prefix);
    const size_t hl = sizeof(comm_wire_hdr_t);
    for (size_t i = 0; i < res.n_kvs && st == RG_OK; i++) {
        const rg_etcd_kv_t *kv = &res.kvs[i];
        int r;
        const comm_wire_hdr_t *hp = comm_wire_value(comm, kv, plen, &r, &st);
        if (hp == NULL || r == comm->rank) {
            continue;
        }
        comm_wire_hdr_t h;
        memcpy(&h, hp, sizeof(h));
        if (h.attempt < comm->attempt) {
            continue;   /* its try before this one: it has not come to this one yet */
        }
        if (h.attempt > comm->attempt || kv->value_len == hl) {
            st = comm_wire_gone(comm, prefix, r, &h);
            break;
        }
        if (addrs[r] != NULL) {
            continue;
        }
        st = comm_wire_check(comm, r, kv->value);
        if (st != RG_OK) {
            break;
        }
        addrs[r] = malloc(kv->value_len - hl);
        if (addrs[r] == NULL) {
            st = rg_error(RG_ENOMEM, "out of memory for addresses");
            break;
        }
        memcpy(addrs[r], kv->value + hl, kv->value_len - hl);
        lens[r] = kv->value_len - hl;
        (*n_found)++;
    }
    rg_etcd_range_cleanup(&res);
    if (st != RG_OK) {
        return st;
    }
    return *n_found == comm->size - 1 ? RG_OK : RG_INPROGRESS;
}

/* comm_ucx_connect's watch while it waits for hellos: a peer's key written after every
 * address was read is that peer giving this attempt up (its hello never comes); and the
 * caller's abandon hook. */
typedef struct {
    rg_comm_t  *comm;
    rg_etcd_t  *etcd;
    const char *prefix;
    int64_t     since;   /* the revision every address was read at */
} comm_wire_watch_arg_t;

static rg_status_t comm_wire_watch(void *arg, rg_deadline_t deadline)
{
    comm_wire_watch_arg_t *w = arg;
    char why[256];
    if (w->comm->abandon != NULL && w->comm->abandon(w->comm->abandon_arg, why, sizeof(why))) {
        return rg_error(RG_EPEER, "group of %d under %s: given up while connecting: %s",
                        w->comm->size, w->prefix, why);
    }
    rg_etcd_range_req_t rreq = {.key = w->prefix, .prefix = true,
                                .min_mod_revision = w->since + 1};
    rg_etcd_range_t res;
    rg_deadline_t d = RG_MIN(deadline, rg_deadline_in_ms(COMM_WATCH_READ_MS));
    if (rg_etcd_range(w->etcd, &rreq, d, &res) != RG_OK) {
        rg_debug("watching the group's addresses under %s: %s", w->prefix, rg_last_error());
        return RG_OK;   /* the handshake's own deadline still bounds the wait */
    }
    rg_status_t st = RG_OK;
    for (size_t i = 0; i < res.n_kvs && st == RG_OK; i++) {
        int r;
        const comm_wire_hdr_t *hp = comm_wire_value(w->comm, &res.kvs[i], strlen(w->prefix),
                                                    &r, &st);
        if (hp != NULL && r != w->comm->rank) {
            comm_wire_hdr_t h;
            memcpy(&h, hp, sizeof(h));
            st = comm_wire_gone(w->comm, w->prefix, r, &h);
        }
    }
    rg_etcd_range_cleanup(&res);
    return st;
}

/* Puts this rank's value for its attempt: the header and address, or the header alone
 * (address NULL: the attempt withdrawn). */
static rg_status_t comm_wire_put(rg_comm_t *comm, rg_etcd_t *etcd, const char *key,
                                 const void *address, size_t len, rg_deadline_t deadline)
{
    comm_wire_hdr_t hdr;
    comm_wire_hdr(comm, comm->attempt, &hdr);
    char *value = malloc(sizeof(hdr) + len);
    if (value == NULL) {
        return rg_error(RG_ENOMEM, "out of memory for addresses");
    }
    memcpy(value, &hdr, sizeof(hdr));
    if (len > 0) {
        memcpy(value + sizeof(hdr), address, len);
    }
    rg_etcd_put_req_t put = {.key = key, .value = value, .value_len = sizeof(hdr) + len};
    rg_status_t st = rg_etcd_put(etcd, &put, deadline, NULL);
    free(value);
    return st;
}

static rg_status_t comm_exchange(rg_comm_t *comm, rg_etcd_t *etcd, const char *prefix,
                                 rg_deadline_t deadline)
{
    rg_status_t st;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    bool published = false;
    char key[COMM_MAX_PREFIX + 16];
    snprintf(key, sizeof(key), "%s%d", prefix, comm->rank);
    void **addrs = calloc((size_t)comm->size, sizeof(*addrs));
    size_t *lens = calloc((size_t)comm->size, sizeof(*lens));
    if (addrs == NULL || lens == NULL) {
        st = rg_error(RG_ENOMEM, "out of memory for addresses");
        goto out;
    }
    st = comm_ucx_address(comm, &addr, &addr_len);
    if (st == RG_OK) {
        st = comm_wire_attempt(comm, etcd, prefix, deadline, &comm->attempt);
    }
    if (st == RG_OK) {
        st = comm_wire_put(comm, etcd, key, addr, addr_len, deadline);
        if (st != RG_OK) {
            st = rg_error_wrap(st, "publishing the address of rank %d", comm->rank);
        }
        published = st == RG_OK;
    }
    int n_found = 0;
    int64_t backoff_ms = 1;
    int64_t revision = 0;
    while (st == RG_OK) {
        comm->wire_reads++;
        st = comm_read_addresses(comm, etcd, prefix, deadline, addrs, lens, &n_found,
                                 &revision);
        if (st != RG_INPROGRESS && !(st == RG_ETIMEDOUT && rg_deadline_passed(deadline))) {
            break;
        }
        if (rg_deadline_passed(deadline)) {
            st = rg_error(RG_ETIMEDOUT, "group of %d under %s: only %d ranks published their "
                          "address for attempt %u before the deadline", comm->size, prefix,
                          n_found + 1, (unsigned)comm->attempt);
            break;
        }
        char why[256];
        if (comm->abandon != NULL && comm->abandon(comm->abandon_arg, why, sizeof(why))) {
            st = rg_error(RG_EPEER, "group of %d under %s: given up with %d ranks' addresses "
                          "read: %s", comm->size, prefix, n_found + 1, why);
            break;
        }
        comm_progress_for(comm, backoff_ms, deadline);
        backoff_ms = RG_MIN(backoff_ms * 2, 20);
        st = RG_OK;
    }
    int64_t t_read = rg_now_ns();
    if (st == RG_OK) {
        comm_wire_watch_arg_t warg = {.comm = comm, .etcd = etcd, .prefix = prefix,
                                      .since = revision};
        comm_wire_watch_t watch = {.check = comm_wire_watch, .arg = &warg};
        st = comm_ucx_connect(comm, addrs, lens, deadline, &watch);
    }
    comm->wire_ns[2] = rg_now_ns() - t_read;
    if (st != RG_OK && published && st != RG_EINVAL && st != RG_EPROTO) {
        /* The peers still at this attempt give it up too (another error is the one to
         * report; a withdrawal that fails leaves an address of a worker that is gone, which
         * costs a peer that attempt). */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", rg_last_error());
        if (comm_wire_put(comm, etcd, key, NULL, 0, rg_deadline_in_ms(COMM_UNPUBLISH_MS)) !=
            RG_OK) {
            rg_debug("withdrawing the address at %s: %s", key, rg_last_error());
        }
        (void)rg_error(st, "%s", msg);
    }
out:
    comm_ucx_release_address(comm, addr);
    for (int p = 0; addrs != NULL && p < comm->size; p++) {
        free(addrs[p]);
    }
    free(addrs);
    free(lens);
    return st;
}

rg_status_t rg_comm_create(const rg_comm_params_t *params, rg_comm_t **comm_p)
{
    if (params == NULL || comm_p == NULL) {
        rg_comm_spare_destroy(params != NULL ? params->spare : NULL);
        return rg_error(RG_EINVAL, "rg_comm_create: NULL params or result pointer");
    }
    rg_status_t bad = RG_OK;
    if (params->key_prefix == NULL || params->key_prefix[0] == '\0' ||
        strlen(params->key_prefix) > COMM_MAX_PREFIX) {
        bad = rg_error(RG_EINVAL, "rg_comm_create: key_prefix must have 1..%d characters",
                       COMM_MAX_PREFIX);
    } else if (params->etcd == NULL && params->etcd_params == NULL &&
               (params->etcd_endpoints == NULL || params->etcd_endpoints[0] == '\0')) {
        bad = rg_error(RG_EINVAL, "rg_comm_create: neither an etcd client nor endpoints");
    } else if (params->create_timeout_ms < 0) {
        bad = rg_error(RG_EINVAL, "rg_comm_create: negative create_timeout_ms");
    }
    if (bad != RG_OK) {
        rg_comm_spare_destroy(params->spare);   /* (sets no error) */
        return bad;
    }
    if (params->unreached != NULL && params->size > 0 && params->size <= RG_COMM_MAX_SIZE) {
        memset(params->unreached, 0, (size_t)params->size);
    }
    rg_deadline_t deadline = rg_deadline_in_ms(
        params->create_timeout_ms ? params->create_timeout_ms : COMM_DEFAULT_CREATE_MS);
    rg_comm_t *comm = NULL;
    int64_t t0 = rg_now_ns();
    rg_status_t st = comm_group_new(params->rank, params->size, params->timeout_ms,
                                    params->spare, deadline, &comm);
    if (st != RG_OK) {
        return st;
    }
    int64_t t1 = rg_now_ns();
    comm->wire_ns[0] = t1 - t0;
    comm->abandon = params->abandon;
    comm->abandon_arg = params->abandon_arg;
    comm->unreached = params->unreached;
    rg_etcd_t *etcd = params->etcd;
    rg_etcd_t *own = NULL;
    if (etcd == NULL) {
        rg_etcd_params_t ep = {.endpoints = params->etcd_endpoints};
        st = rg_etcd_create(params->etcd_params != NULL ? params->etcd_params : &ep, &own);
        if (st != RG_OK) {
            goto err_destroy;
        }
        etcd = own;
    }
    st = comm_exchange(comm, etcd, params->key_prefix, deadline);
    rg_etcd_destroy(own);
    if (st != RG_OK) {
        goto err_destroy;
    }
    comm->wire_ns[1] = rg_now_ns() - t1 - comm->wire_ns[2];
    int64_t t2 = rg_now_ns();
    st = comm_local_setup(comm, deadline);
    if (st != RG_OK) {
        goto err_destroy;
    }
    comm->wire_ns[3] = rg_now_ns() - t2;
    comm->unreached = NULL;   /* (the caller's, for this creation only) */
    rg_info("group of %d connected under %s", comm->size, params->key_prefix);
    rg_debug("group of %d wired in %.1f ms: UCX context and worker %.1f, addresses %.1f "
             "(%d reads), endpoints and hellos %.1f, shared memory %.1f",
             comm->size, (double)(rg_now_ns() - t0) / 1e6, (double)comm->wire_ns[0] / 1e6,
             (double)comm->wire_ns[1] / 1e6, comm->wire_reads, (double)comm->wire_ns[2] / 1e6,
             (double)comm->wire_ns[3] / 1e6);
    *comm_p = comm;
    return RG_OK;

err_destroy:
    comm->healthy = false; /* no leave messages: nobody was told we joined */
    rg_comm_destroy(comm);
    return st;
}
