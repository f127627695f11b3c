/* Nodes that leave on purpose (rdzv_leaving.h). */
#include "rdzv_internal.h"
#include "rdzv_leaving.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

rg_status_t rdzv_leaving_announce(rg_rdzv_t *z, const char *reason, double deadline)
{
    char key[RDZV_KEY_MAX];
    char *text = NULL;
    rdzv_leaving_rec_t rec = {.deadline = deadline, .time = rg_wall_s()};
    rg_status_t st;

    if (!z->running) {
        return rg_error(RG_EINVAL, "leaving record: no round is running");
    }
    memcpy(rec.agent, z->agent, sizeof(rec.agent));
    memcpy(rec.addr, z->addr, sizeof(rec.addr));
    snprintf(rec.reason, sizeof(rec.reason), "%s", reason ? reason : "");
    st = rdzv_keys_leaving(&z->keys, z->cur.round, z->agent, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_rec_leaving_encode(&rec, &text);
    }
    if (st == RG_OK) {
        st = rg_etcd_put_str(z->etcd, key, text, 0, 0, NULL);
    }
    free(text);
    return st;
}

void rdzv_leaving_note(rg_rdzv_t *z, const rg_etcd_range_t *r)
{
    int n = 0;
    for (size_t i = 0; i < r->n_kvs && n < RDZV_LEAVING_MAX; i++) {
        rdzv_leaving_rec_t rec;
        if (rdzv_rec_leaving_decode(r->kvs[i].value, r->kvs[i].value_len, &rec) != RG_OK) {
            rg_warn("rendezvous: ignoring %s: %s", r->kvs[i].key, rg_last_error());
            continue;
        }
        if (strcmp(rec.agent, z->agent) != 0) {
            z->leaving[n++] = rec;
        }
    }
    z->n_leaving = n;
}

rg_status_t rdzv_leaving_read(rg_rdzv_t *z)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};
    rg_status_t st;

    if (!z->running) {
        return RG_OK;
    }
    st = rdzv_keys_leaving_prefix(&z->keys, z->cur.round, key, sizeof(key));
    if (st == RG_OK) {
        st = rg_etcd_range(z->etcd, &rq, 0, &r);
    }
    if (st != RG_OK) {
        return st;
    }
    rdzv_leaving_note(z, &r);
    rg_etcd_range_cleanup(&r);
    return RG_OK;
}

int rdzv_leaving_seen(const rg_rdzv_t *z, const rdzv_leaving_rec_t **recs_p)
{
    *recs_p = z->leaving;
    return z->n_leaving;
}

const rdzv_leaving_rec_t *rdzv_leaving_find(const rg_rdzv_t *z, const char *agent)
{
    for (int i = 0; i < z->n_leaving; i++) {
        if (strcmp(z->leaving[i].agent, agent) == 0) {
            return &z->leaving[i];
        }
    }
    return NULL;
}

/* Whether one of the leaving members of the round has no node key in nodes (a range of
 * rounds/<r>/nodes/). */
static bool leaving_member_gone(const rg_rdzv_t *z, const rg_etcd_range_t *nodes)
{
    char key[RDZV_KEY_MAX];
    for (int i = 0; i < z->n_leaving; i++) {
        bool member = false;
        for (int m = 0; m < z->cur.n_members && !member; m++) {
            member = strcmp(z->cur.members[m].agent, z->leaving[i].agent) == 0;
        }
        if (member &&
            rdzv_keys_node(&z->keys, z->cur.round, z->leaving[i].agent, key, sizeof(key)) ==
                RG_OK &&
            !rdzv_range_has(nodes, key)) {
            return true;
        }
    }
    return false;
}

rg_status_t rdzv_leaving_await_gone(rg_rdzv_t *z, rg_deadline_t deadline, bool *gone)
{
    char prefix[RDZV_KEY_MAX];
    rg_etcd_range_req_t rq = {.key = prefix, .prefix = true, .keys_only = true};
    rg_status_t st;

    *gone = false;
    if (!z->running || z->n_leaving == 0) {
        return RG_OK;
    }
    st = rdzv_keys_nodes_prefix(&z->keys, z->cur.round, prefix, sizeof(prefix));
    /* bounded: each pass sleeps RDZV_LEAVING_POLL_MS, and none starts after the deadline.
     * A read has the client's own deadline, not what is left of the wait: a last read
     * begun with a millisecond left would time out and say nothing. */
    while (st == RG_OK) {
        rg_etcd_range_t r;
        st = rg_etcd_range(z->etcd, &rq, 0, &r);
        if (st != RG_OK) {
            break;
        }
        *gone = leaving_member_gone(z, &r);
        rg_etcd_range_cleanup(&r);
        if (*gone || rg_deadline_left_ms(deadline) <= RDZV_LEAVING_POLL_MS) {
            break;
        }
        rg_sleep_ms(RDZV_LEAVING_POLL_MS);
    }
    return st;
}
