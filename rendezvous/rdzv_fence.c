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
