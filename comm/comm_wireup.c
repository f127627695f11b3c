/*
 * Building a group from a round: worker addresses exchanged through etcd.
 *
 * Rank r puts a header and its UCX worker address (binary) at <prefix><r>, then reads the
 * prefix until every rank's address is there, backing off from 1 ms to 20 ms between reads
 * and progressing its worker meanwhile (a peer's wire-up needs this worker to progress), and
 * finally creates one endpoint per peer. A rank whose attempt fails for a reason another
 * attempt may not meet (a deadline, a peer it could not connect to) deletes its address
 * again: it names a UCX worker that is gone, and a peer that read it would fail to connect
 * and try again, out of step with this rank's next attempt, for as long as the two kept
 * missing each other's current address (seen as a livelock of a regroup under a sanitizer).
 * One that fails on a header that differs (RG_EINVAL, RG_EPROTO) keeps it: every attempt
 * fails the same way, and the peers must read it to fail at once too.
 * The header carries the tuning values that decide how
 * a message is cut into transfers: ranks that differ there would wait on transfers that never
 * come, so creation fails at once instead, naming the rank and the values.
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
#define COMM_UNPUBLISH_MS      1000     /* a failed attempt's delete of its address */

/* Before the address in the published value (host byte order; docs/etcd-keys.md). */
typedef struct {
    char     magic[4];   /* "RGC1" */
    uint32_t reserved;
    uint64_t ring_min;   /* REGROUP_COMM_RING_MIN_BYTES */
    uint64_t rhd_max;    /* REGROUP_COMM_RHD_MAX_BYTES */
    uint64_t seg;        /* REGROUP_COMM_SEGMENT_BYTES */
} comm_wire_hdr_t;

static const char comm_wire_magic[4] = {'R', 'G', 'C', '1'};

static void comm_wire_hdr(const rg_comm_t *comm, comm_wire_hdr_t *h)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, comm_wire_magic, sizeof(h->magic));
    h->ring_min = comm->tuning.ring_min_bytes;
    h->rhd_max = comm->tuning.rhd_max_bytes;
    h->seg = comm->tuning.seg_bytes;
}

/* The header of rank r's value against ours: an error naming both when they differ. */
static rg_status_t comm_wire_check(const rg_comm_t *comm, int r, const void *value)
{
    comm_wire_hdr_t mine;
    comm_wire_hdr_t theirs;
    comm_wire_hdr(comm, &mine);
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

/* Reads every published address; RG_INPROGRESS while some rank is missing. */
static rg_status_t comm_read_addresses(rg_comm_t *comm, rg_etcd_t *etcd, const char *prefix,
                                       rg_deadline_t deadline, void **addrs, size_t *lens,
                                       int *n_found)
{
    rg_etcd_range_req_t rreq = {.key = prefix, .prefix = true};
    rg_etcd_range_t res;
    rg_status_t st = rg_etcd_range(etcd, &rreq, deadline, &res);
    if (st != RG_OK) {
        return rg_error_wrap(st, "reading the group's addresses under %s", prefix);
    }
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < res.n_kvs; i++) {
        const rg_etcd_kv_t *kv = &res.kvs[i];
        int64_t r;
        if (kv->key_len <= plen || !rg_parse_i64(kv->key + plen, &r) || r < 0 ||
            r >= comm->size) {
            rg_debug("ignoring key %s under the group's prefix", kv->key);
            continue;
        }
        const size_t hl = sizeof(comm_wire_hdr_t);
        if (kv->value_len <= hl || kv->value_len > hl + COMM_MAX_ADDRESS) {
            st = rg_error(RG_EPROTO, "address of rank %lld under %s has %zu bytes",
                          (long long)r, prefix, kv->value_len);
            break;
        }
        if (addrs[r] != NULL) {
            continue;
        }
        st = comm_wire_check(comm, (int)r, kv->value);
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
    return *n_found == comm->size ? RG_OK : RG_INPROGRESS;
}

static rg_status_t comm_exchange(rg_comm_t *comm, rg_etcd_t *etcd, const char *prefix,
                                 rg_deadline_t deadline)
{
    rg_status_t st;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    char *value = NULL;
    void **addrs = calloc((size_t)comm->size, sizeof(*addrs));
    size_t *lens = calloc((size_t)comm->size, sizeof(*lens));
    if (addrs == NULL || lens == NULL) {
        st = rg_error(RG_ENOMEM, "out of memory for addresses");
        goto out;
    }
    st = comm_ucx_address(comm, &addr, &addr_len);
    if (st != RG_OK) {
        goto out;
    }
    char key[COMM_MAX_PREFIX + 16];
    snprintf(key, sizeof(key), "%s%d", prefix, comm->rank);
    value = malloc(sizeof(comm_wire_hdr_t) + addr_len);
    if (value == NULL) {
        st = rg_error(RG_ENOMEM, "out of memory for addresses");
        goto out;
    }
    comm_wire_hdr_t hdr;
    comm_wire_hdr(comm, &hdr);
    memcpy(value, &hdr, sizeof(hdr));
    memcpy(value + sizeof(hdr), addr, addr_len);
    rg_etcd_put_req_t put = {.key = key, .value = value, .value_len = sizeof(hdr) + addr_len};
    st = rg_etcd_put(etcd, &put, deadline, NULL);
    if (st != RG_OK) {
        st = rg_error_wrap(st, "publishing the address of rank %d", comm->rank);
        goto out;
    }
    int n_found = 0;
    int64_t backoff_ms = 1;
    for (;;) {
        st = comm_read_addresses(comm, etcd, prefix, deadline, addrs, lens, &n_found);
        if (st != RG_INPROGRESS && !(st == RG_ETIMEDOUT && rg_deadline_passed(deadline))) {
            break;
        }
        if (rg_deadline_passed(deadline)) {
            st = rg_error(RG_ETIMEDOUT, "group of %d under %s: only %d ranks published their "
                          "address before the deadline", comm->size, prefix, n_found);
            break;
        }
        char why[256];
        if (comm->abandon != NULL && comm->abandon(comm->abandon_arg, why, sizeof(why))) {
            st = rg_error(RG_EPEER, "group of %d under %s: given up with %d ranks' addresses "
                          "read: %s", comm->size, prefix, n_found, why);
            break;
        }
        comm_progress_for(comm, backoff_ms, deadline);
        backoff_ms = RG_MIN(backoff_ms * 2, 20);
    }
    if (st == RG_OK) {
        st = comm_ucx_connect(comm, addrs, lens, deadline);
    }
    if (st != RG_OK && st != RG_EINVAL && st != RG_EPROTO) {
        /* (Another error is the one to report; a failed delete leaves a stale address, which
         * only costs a peer another attempt.) */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", rg_last_error());
        rg_etcd_delete_req_t del = {.key = key};
        if (rg_etcd_delete(etcd, &del, rg_deadline_in_ms(COMM_UNPUBLISH_MS), NULL) != RG_OK) {
            rg_debug("deleting the address at %s: %s", key, rg_last_error());
        }
        (void)rg_error(st, "%s", msg);
    }
out:
    free(value);
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
        return rg_error(RG_EINVAL, "rg_comm_create: NULL params or result pointer");
    }
    if (params->key_prefix == NULL || params->key_prefix[0] == '\0' ||
        strlen(params->key_prefix) > COMM_MAX_PREFIX) {
        return rg_error(RG_EINVAL, "rg_comm_create: key_prefix must have 1..%d characters",
                        COMM_MAX_PREFIX);
    }
    if (params->etcd == NULL && params->etcd_params == NULL &&
        (params->etcd_endpoints == NULL || params->etcd_endpoints[0] == '\0')) {
        return rg_error(RG_EINVAL, "rg_comm_create: neither an etcd client nor endpoints");
    }
    if (params->create_timeout_ms < 0) {
        return rg_error(RG_EINVAL, "rg_comm_create: negative create_timeout_ms");
    }
    rg_deadline_t deadline = rg_deadline_in_ms(
        params->create_timeout_ms ? params->create_timeout_ms : COMM_DEFAULT_CREATE_MS);
    rg_comm_t *comm = NULL;
    rg_status_t st = comm_group_new(params->rank, params->size, params->timeout_ms, &comm);
    if (st != RG_OK) {
        return st;
    }
    comm->abandon = params->abandon;
    comm->abandon_arg = params->abandon_arg;
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
    st = comm_local_setup(comm, deadline);
    if (st != RG_OK) {
        goto err_destroy;
    }
    rg_info("group of %d connected under %s", comm->size, params->key_prefix);
    *comm_p = comm;
    return RG_OK;

err_destroy:
    comm->healthy = false; /* no leave messages: nobody was told we joined */
    rg_comm_destroy(comm);
    return st;
}
