/* Fenced writes (rdzv_fence.h): a job's writes conditional on the writer's membership. */
#include "rdzv_fence.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FENCE_MAX_OPS 8

rg_status_t rdzv_fence_init(rdzv_fence_t *f, const rdzv_keys_t *keys, int round,
                            const char *agent, int64_t lease)
{
    rg_status_t st;

    memset(f, 0, sizeof(*f));
    if (agent == NULL || agent[0] == '\0' || strlen(agent) >= sizeof(f->agent) || lease == 0 ||
        round < 0) {
        return rg_error(RG_EINVAL, "fence: need an agent id, a lease and a round >= 0");
    }
    st = rdzv_keys_round(keys, f->k_round, sizeof(f->k_round));
    if (st == RG_OK) {
        st = rdzv_keys_node(keys, round, agent, f->k_node, sizeof(f->k_node));
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(round, f->v_round, sizeof(f->v_round));
    }
    if (st != RG_OK) {
        return st;
    }
    memcpy(f->agent, agent, strlen(agent) + 1);
    f->round = round;
    f->lease = lease;
    f->on = true;
    return RG_OK;
}

rg_status_t rdzv_fence_from_env(rdzv_fence_t *f, const rdzv_keys_t *keys)
{
    const char *agent = getenv(RDZV_FENCE_ENV_AGENT);
    const char *lease = getenv(RDZV_FENCE_ENV_LEASE);
    const char *round = getenv(RDZV_FENCE_ENV_ROUND);
    int64_t l = 0;
    int64_t r = -1;

    memset(f, 0, sizeof(*f));
    if (agent == NULL || agent[0] == '\0') {
        return RG_OK;
    }
    if (lease == NULL || !rg_parse_i64(lease, &l) || l == 0 || round == NULL ||
        !rg_parse_i64(round, &r) || r < 0 || r > RDZV_ROUND_MAX) {
        return rg_error(RG_EINVAL, "worker environment: %s is set but %s=%s or %s=%s is not "
                        "a lease and a round", RDZV_FENCE_ENV_AGENT, RDZV_FENCE_ENV_LEASE,
                        lease ? lease : "", RDZV_FENCE_ENV_ROUND, round ? round : "");
    }
    return rdzv_fence_init(f, keys, (int)r, agent, l);
}

/* Why the fence did not hold, from the failure branch's two reads. */
static rg_status_t refused(const rdzv_fence_t *f, const rg_etcd_txn_t *t, const char *what)
{
    const rg_etcd_range_t *round = &t->results[0].u.range;
    const rg_etcd_range_t *node = &t->results[1].u.range;
    int64_t now = -1;
    char why[160];

    if (round->n_kvs == 1 &&
        rdzv_rec_round_decode(round->kvs[0].value, round->kvs[0].value_len, &now) != RG_OK) {
        now = -1;
    }
    if (now != f->round) {
        snprintf(why, sizeof(why), "the job is at round %lld now", (long long)now);
    } else if (node->n_kvs == 0) {
        snprintf(why, sizeof(why), "its agent's membership (lease %llx) is gone",
                 (unsigned long long)f->lease);
    } else if (node->kvs[0].lease != f->lease) {
        snprintf(why, sizeof(why), "its agent's membership is held by lease %llx, not %llx",
                 (unsigned long long)node->kvs[0].lease, (unsigned long long)f->lease);
    } else {
        snprintf(why, sizeof(why), "changed while refused");
    }
    return rg_error(RG_ELEASE, "fenced: %s refused: agent %s is no longer a member of round "
                    "%d (%s)", what, f->agent, f->round, why);
}

rg_status_t rdzv_fence_txn(rg_etcd_t *etcd, const rdzv_fence_t *f, const rg_etcd_op_t *ops,
                           size_t n, rg_deadline_t deadline, const char *what,
                           rg_etcd_txn_t *res)
{
    rg_etcd_txn_t t;
    rg_status_t st;

    if (n > FENCE_MAX_OPS) {
        return rg_error(RG_EINVAL, "fence: at most %d ops", FENCE_MAX_OPS);
    }
    if (!f->on) {
        if (n == 0) {
            return RG_OK;
        }
        st = rg_etcd_txn(etcd, NULL, 0, ops, n, NULL, 0, deadline, &t);
    } else {
        rg_etcd_cmp_t cmps[2] = {
            {.key = f->k_round, .target = RG_ETCD_CMP_VALUE, .result = RG_ETCD_EQUAL,
             .value = f->v_round, .value_len = strlen(f->v_round)},
            {.key = f->k_node, .target = RG_ETCD_CMP_LEASE, .result = RG_ETCD_EQUAL,
             .number = f->lease},
        };
        rg_etcd_op_t why[2] = {
            {.type = RG_ETCD_OP_RANGE, .u.range = {.key = f->k_round}},
            {.type = RG_ETCD_OP_RANGE, .u.range = {.key = f->k_node, .keys_only = true}},
        };
        st = rg_etcd_txn(etcd, cmps, 2, ops, n, why, 2, deadline, &t);
        if (st == RG_OK && !t.succeeded) {
            st = t.n_results == 2 ? refused(f, &t, what)
                                  : rg_error(RG_EPROTO, "fence: %s refused, no reason read",
                                             what);
            rg_etcd_txn_cleanup(&t);
            return st;
        }
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "%s", what);
    }
    if (res != NULL) {
        *res = t;
    } else {
        rg_etcd_txn_cleanup(&t);
    }
    return RG_OK;
}

rg_status_t rdzv_fence_put(rg_etcd_t *etcd, const rdzv_fence_t *f, const char *key,
                           const char *value, int64_t lease, rg_deadline_t deadline,
                           const char *what)
{
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                       .u.put = {.key = key, .value = value, .value_len = strlen(value),
                                 .lease = lease}};
    return rdzv_fence_txn(etcd, f, &op, 1, deadline, what, NULL);
}

/* The round a write was made for, from its key and value; false if it is not one the audit
 * looks at. */
static bool write_round(const rdzv_keys_t *keys, const rg_etcd_kv_t *kv, const char *k_prog,
                        const char *k_rest, const char *k_fail, const char *k_rounds,
                        int64_t *r)
{
    const char *tail;
    if (rdzv_keys_tail(kv->key, k_prog) != NULL) {
        rdzv_progress_rec_t p;
        if (rdzv_rec_progress_decode(kv->value, kv->value_len, &p) != RG_OK) {
            return false;
        }
        *r = p.round;
        return true;
    }
    if (strcmp(kv->key, k_rest) == 0) {
        rdzv_restored_rec_t x;
        if (rdzv_rec_restored_decode(kv->value, kv->value_len, &x) != RG_OK) {
            return false;
        }
        *r = x.round;
        return true;
    }
    if ((tail = rdzv_keys_tail(kv->key, k_fail)) != NULL) {
        *r = strtoll(tail, NULL, 10);   /* failures/<r>/<agent> */
        return true;
    }
    if ((tail = rdzv_keys_tail(kv->key, k_rounds)) != NULL && strstr(tail, "/done/") != NULL) {
        *r = strtoll(tail, NULL, 10);   /* rounds/<r>/done/<agent> */
        return true;
    }
    (void)keys;
    return false;
}

rg_status_t rdzv_fence_audit(const rg_etcd_params_t *params, const char *job, int *stale,
                             int *checked, char *first, size_t first_cap)
{
    rdzv_keys_t keys;
    char k_round[RDZV_KEY_MAX];
    char k_prog[RDZV_KEY_MAX];
    char k_rest[RDZV_KEY_MAX];
    char k_fail[RDZV_KEY_MAX];
    char k_rounds[RDZV_KEY_MAX];
    rg_etcd_t *cli = NULL;
    rg_etcd_watch_t *w = NULL;
    rg_etcd_range_t now;
    int64_t round = -1;
    rg_status_t st;

    *stale = 0;
    *checked = 0;
    if (first != NULL && first_cap > 0) {
        first[0] = '\0';
    }
    st = rdzv_keys_init(&keys, job);
    if (st == RG_OK) {
        st = rdzv_keys_round(&keys, k_round, sizeof(k_round));
    }
    if (st == RG_OK) {
        st = rdzv_keys_progress_prefix(&keys, k_prog, sizeof(k_prog));
    }
    if (st == RG_OK) {
        st = rdzv_keys_restored(&keys, k_rest, sizeof(k_rest));
    }
    if (st == RG_OK) {
        st = rdzv_keys_failures_prefix(&keys, k_fail, sizeof(k_fail));
    }
    if (st != RG_OK) {
        return st;
    }
    snprintf(k_rounds, sizeof(k_rounds), "%srounds/", rdzv_keys_prefix(&keys));
    st = rg_etcd_create(params, &cli);
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_range_req_t q = {.key = k_round};
    st = rg_etcd_range(cli, &q, 0, &now);
    rg_etcd_destroy(cli);
    if (st != RG_OK) {
        return st;
    }
    int64_t end = now.revision;
    rg_etcd_range_cleanup(&now);
    rg_etcd_watch_req_t wr = {.key = rdzv_keys_prefix(&keys), .prefix = true,
                              .start_revision = 1};
    st = rg_etcd_watch_create(params, &wr, 0, &w);
    if (st != RG_OK) {
        return st;
    }
    /* Bounded by the history's length: each event moves the watch's revision on. */
    while (st == RG_OK && rg_etcd_watch_revision(w) < end) {
        rg_etcd_event_t ev;
        int64_t r;
        st = rg_etcd_watch_next(w, rg_deadline_in_ms(10000), &ev, NULL);
        if (st != RG_OK) {
            break;
        }
        if (ev.type == RG_ETCD_EVENT_PUT && strcmp(ev.kv.key, k_round) == 0) {
            if (rdzv_rec_round_decode(ev.kv.value, ev.kv.value_len, &round) != RG_OK) {
                round = -1;
            }
        } else if (ev.type == RG_ETCD_EVENT_PUT &&
                   write_round(&keys, &ev.kv, k_prog, k_rest, k_fail, k_rounds, &r)) {
            (*checked)++;
            if (r != round) {
                if (*stale == 0 && first != NULL) {
                    snprintf(first, first_cap, "revision %lld: %s written for round %lld "
                             "while the job was at round %lld", (long long)ev.kv.mod_revision,
                             ev.kv.key, (long long)r, (long long)round);
                }
                (*stale)++;
            }
        }
        rg_etcd_event_cleanup(&ev);
    }
    rg_etcd_watch_destroy(w);
    return st == RG_OK ? RG_OK : rg_error_wrap(st, "the history of job %s", job);
}
