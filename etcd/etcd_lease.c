/* Leases: grant, keepalive, revoke, time-to-live, and a background keeper thread. */
#include "etcd_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static rg_status_t lease_call(rg_etcd_t *client, const char *path, int64_t lease,
                              const char *extra, rg_deadline_t deadline, json_t **reply_p)
{
    json_t *body = json_object();
    rg_status_t st;

    if (client == NULL) {
        return rg_error(RG_EINVAL, "etcd %s: NULL client", path);
    }
    if (body == NULL) {
        return rg_error(RG_ENOMEM, "etcd: lease request");
    }
    st = etcd_json_set_i64(body, "ID", lease);
    if (st == RG_OK && extra != NULL) {
        json_object_set_new(body, extra, json_true());
    }
    if (st == RG_OK) {
        st = etcd_client_call(client, path, body, deadline, reply_p);
    }
    json_decref(body);
    return st;
}

rg_status_t rg_etcd_lease_grant(rg_etcd_t *client, int64_t ttl_s, rg_deadline_t deadline,
                                int64_t *lease_p, int64_t *ttl_granted_p)
{
    json_t *body;
    json_t *reply = NULL;
    int64_t id;
    int64_t ttl;
    rg_status_t st;

    if (client == NULL || lease_p == NULL) {
        return rg_error(RG_EINVAL, "etcd lease grant: NULL argument");
    }
    if (ttl_s <= 0) {
        return rg_error(RG_EINVAL, "etcd lease grant: TTL must be positive, not %lld",
                        (long long)ttl_s);
    }
    body = json_object();
    if (body == NULL) {
        return rg_error(RG_ENOMEM, "etcd: lease grant");
    }
    /* "TTL" in capitals: etcd silently ignores "ttl" and grants its minimum. */
    st = etcd_json_set_i64(body, "TTL", ttl_s);
    if (st == RG_OK) {
        st = etcd_client_call(client, "/v3/lease/grant", body, deadline, &reply);
    }
    json_decref(body);
    if (st != RG_OK) {
        return st;
    }
    if (!etcd_json_i64(reply, "ID", &id) || !etcd_json_i64(reply, "TTL", &ttl) || id == 0) {
        const char *err = json_string_value(json_object_get(reply, "error"));
        st = rg_error(err ? RG_ESERVER : RG_EPROTO, "etcd %s: lease grant: %s",
                      rg_etcd_endpoint(client), err ? err : "no lease ID in the reply");
        json_decref(reply);
        return st;
    }
    json_decref(reply);
    *lease_p = id;
    if (ttl_granted_p != NULL) {
        *ttl_granted_p = ttl;
    }
    return RG_OK;
}

rg_status_t rg_etcd_lease_keepalive(rg_etcd_t *client, int64_t lease,
                                    rg_deadline_t deadline, int64_t *ttl_p)
{
    json_t *reply = NULL;
    const json_t *result;
    int64_t ttl = 0;
    rg_status_t st;

    /* One keepalive per request: etcd drops streamed keepalives after the first. */
    st = lease_call(client, "/v3/lease/keepalive", lease, NULL, deadline, &reply);
    if (st != RG_OK) {
        return st;
    }
    result = json_object_get(reply, "result");
    if (result == NULL) {
        const json_t *err = json_object_get(reply, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        st = rg_error(err ? RG_ESERVER : RG_EPROTO, "etcd %s: lease keepalive: %s",
                      rg_etcd_endpoint(client), msg ? msg : "no result in the reply");
        json_decref(reply);
        return st;
    }
    if (!etcd_json_i64(result, "TTL", &ttl)) {
        json_decref(reply);
        return rg_error(RG_EPROTO, "etcd: lease keepalive: malformed TTL");
    }
    json_decref(reply);
    /* etcd answers a dead lease with success and TTL 0 (omitted). */
    if (ttl <= 0) {
        return rg_error(RG_ELEASE, "etcd %s: lease %llx has expired", rg_etcd_endpoint(client),
                        (unsigned long long)lease);
    }
    if (ttl_p != NULL) {
        *ttl_p = ttl;
    }
    return RG_OK;
}

rg_status_t rg_etcd_lease_revoke(rg_etcd_t *client, int64_t lease, rg_deadline_t deadline)
{
    json_t *reply = NULL;
    rg_status_t st = lease_call(client, "/v3/lease/revoke", lease, NULL, deadline, &reply);
    json_decref(reply);
    return st;
}

rg_status_t rg_etcd_lease_ttl(rg_etcd_t *client, int64_t lease, rg_deadline_t deadline,
                              int64_t *ttl_p, int64_t *granted_p)
{
    json_t *reply = NULL;
    int64_t ttl;
    int64_t granted;
    rg_status_t st;

    if (ttl_p == NULL) {
        return rg_error(RG_EINVAL, "etcd lease ttl: NULL ttl_p");
    }
    st = lease_call(client, "/v3/lease/timetolive", lease, NULL, deadline, &reply);
    if (st != RG_OK) {
        return st;
    }
    if (!etcd_json_i64(reply, "TTL", &ttl) || !etcd_json_i64(reply, "grantedTTL", &granted)) {
        json_decref(reply);
        return rg_error(RG_EPROTO, "etcd: lease time-to-live: malformed reply");
    }
    json_decref(reply);
    if (ttl < 0 || (ttl == 0 && granted == 0)) {
        return rg_error(RG_ELEASE, "etcd %s: lease %llx has expired or does not exist",
                        rg_etcd_endpoint(client), (unsigned long long)lease);
    }
    *ttl_p = ttl;
    if (granted_p != NULL) {
        *granted_p = granted;
    }
    return RG_OK;
}

/* ---- keeper ----------------------------------------------------------------------------- */

struct rg_etcd_keeper {
    rg_etcd_t      *client;     /* the keeper's own connection */
    int64_t         lease;
    int64_t         ttl_s;
    int             efd;        /* readable once lost */
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cond;
    bool            stop;
    bool            lost;
};

static void keeper_mark_lost(rg_etcd_keeper_t *k)
{
    uint64_t one = 1;
    pthread_mutex_lock(&k->mu);
    k->lost = true;
    pthread_mutex_unlock(&k->mu);
    if (write(k->efd, &one, sizeof(one)) != sizeof(one)) {
        rg_warn("lease keeper: eventfd write: %m");
    }
}

/* Waits ms or until stopped; true if stopped. */
static bool keeper_wait(rg_etcd_keeper_t *k, int64_t ms)
{
    struct timespec ts;
    bool stop;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        if (pthread_cond_timedwait(&k->cond, &k->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    stop = k->stop;
    pthread_mutex_unlock(&k->mu);
    return stop;
}

static void *keeper_main(void *arg)
{
    rg_etcd_keeper_t *k = arg;
    int64_t period_ms = RG_MAX(k->ttl_s * 1000 / 3, 100);
    uint64_t last_ok = rg_now_ns();

    while (!keeper_wait(k, period_ms)) {
        int64_t ttl;
        /* A renewal must land before the lease runs out, whatever the client's timeout. */
        uint64_t expiry = last_ok + (uint64_t)k->ttl_s * 1000000000ull;
        rg_deadline_t deadline = RG_MIN(expiry, rg_deadline_in_ms(period_ms * 2));
        rg_status_t st = rg_etcd_lease_keepalive(k->client, k->lease, deadline, &ttl);

        if (st == RG_OK) {
            last_ok = rg_now_ns();
            continue;
        }
        if (st == RG_ELEASE || rg_now_ns() >= expiry) {
            rg_warn("lease %llx lost: %s", (unsigned long long)k->lease, rg_last_error());
            keeper_mark_lost(k);
            break;
        }
        rg_info("lease %llx renewal failed, retrying: %s", (unsigned long long)k->lease,
                rg_last_error());
        /* Retry sooner than the period, but not in a tight loop. */
        if (keeper_wait(k, RG_MIN(period_ms, 200))) {
            break;
        }
    }
    return NULL;
}

rg_status_t rg_etcd_keeper_start(const rg_etcd_params_t *params, int64_t lease, int64_t ttl_s,
                                 rg_etcd_keeper_t **keeper_p)
{
    rg_etcd_keeper_t *k;
    pthread_condattr_t ca;
    rg_status_t st;

    if (keeper_p == NULL || ttl_s <= 0) {
        return rg_error(RG_EINVAL, "etcd keeper: bad arguments");
    }
    k = calloc(1, sizeof(*k));
    if (k == NULL) {
        return rg_error(RG_ENOMEM, "etcd keeper");
    }
    st = rg_etcd_create(params, &k->client);
    if (st != RG_OK) {
        goto err_free;
    }
    k->lease = lease;
    k->ttl_s = ttl_s;
    k->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (k->efd < 0) {
        st = rg_error(RG_ESYS, "etcd keeper: eventfd: %s", strerror(errno));
        goto err_client;
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&k->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
        st = rg_error(RG_ESYS, "etcd keeper: cannot start thread");
        goto err_sync;
    }
    *keeper_p = k;
    return RG_OK;

err_sync:
    pthread_cond_destroy(&k->cond);
    pthread_mutex_destroy(&k->mu);
    close(k->efd);
err_client:
    rg_etcd_destroy(k->client);
err_free:
    free(k);
    return st;
}

bool rg_etcd_keeper_lost(rg_etcd_keeper_t *keeper)
{
    bool lost;
    pthread_mutex_lock(&keeper->mu);
    lost = keeper->lost;
    pthread_mutex_unlock(&keeper->mu);
    return lost;
}

int rg_etcd_keeper_fd(rg_etcd_keeper_t *keeper)
{
    return keeper->efd;
}

void rg_etcd_keeper_stop(rg_etcd_keeper_t *keeper)
{
    if (keeper == NULL) {
        return;
    }
    pthread_mutex_lock(&keeper->mu);
    keeper->stop = true;
    pthread_cond_signal(&keeper->cond);
    pthread_mutex_unlock(&keeper->mu);
    pthread_join(keeper->thread, NULL);
    pthread_cond_destroy(&keeper->cond);
    pthread_mutex_destroy(&keeper->mu);
    close(keeper->efd);
    rg_etcd_destroy(keeper->client);
    free(keeper);
}

void rg_etcd_keeper_stats_add(const rg_etcd_keeper_t *keeper, rg_etcd_stats_t *sum)
{
    if (keeper != NULL) {
        rg_etcd_stats_add(keeper->client, sum);
    }
}
