/*
 * Closing a round: read what the close policy needs (the previous closed round, its live
 * members, the waiting nodes, its failures), ask the policy (rdzv_close.c, pure), and write
 * its answer with one compare-and-swap that fails if anything it was based on changed.
 */
#include "rdzv_internal.h"

#include <stdlib.h>
#include <string.h>

/* Reads rounds/<r>/closed into *a; RG_ENOENT if the round is open. */
static rg_status_t read_closed(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *a)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    rg_status_t st;

    st = rdzv_keys_closed(&z->keys, r, key, sizeof(key));
    if (st != RG_OK) {
        return st;
    }
    st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    if (st != RG_OK) {
        return st;
    }
    st = rdzv_rec_closed_decode(v, len, r, a);
    free(v);
    return st;
}

/* The latest closed round before r (into *a), or -1. */
static int last_closed_before(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *a)
{
    for (int q = r - 1; q >= 0 && q >= r - RDZV_BACK_ROUNDS; q--) {
        if (read_closed(z, q, a) == RG_OK) {
            return q;
        }
    }
    return -1;
}

/* Whether agent has a key in leaving (a range of the keys under prefix). */
static bool left_on_purpose(const rg_etcd_range_t *leaving, const char *prefix,
                            const char *agent)
{
    for (size_t i = 0; i < leaving->n_kvs; i++) {
        const char *who = rdzv_keys_tail(leaving->kvs[i].key, prefix);
        if (who != NULL && strcmp(who, agent) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether prev's member agent left no trace in prev: its node key (leased) is gone and it
 * wrote no done record, so its lease expired or was revoked before it finished. */
static bool member_lost(rg_rdzv_t *z, int prev_round, const char *agent,
                        const rg_etcd_range_t *live, const rg_etcd_range_t *done)
{
    char nk[RDZV_KEY_MAX];
    char dk[RDZV_KEY_MAX];
    if (rdzv_keys_node(&z->keys, prev_round, agent, nk, sizeof(nk)) != RG_OK ||
        rdzv_keys_done(&z->keys, prev_round, agent, dk, sizeof(dk)) != RG_OK) {
        return false;
    }
    return !rdzv_range_has(live, nk) && !rdzv_range_has(done, dk);
}

/* What the close policy needs beyond the round's own nodes: the previous closed round, its
 * live members, the waiting nodes, whether the previous round failed and how many of its
 * members were lost. The ranges hold the agent ids in->expected points to: clean them up
 * after the plan. */
static rg_status_t read_close_context(rg_rdzv_t *z, int r, rdzv_close_in_t *in,
                                      rg_etcd_txn_t *t, bool *have_txn)
{
    char k_live[RDZV_KEY_MAX];
    char k_wait[RDZV_KEY_MAX];
    char k_fail[RDZV_KEY_MAX];
    char k_leave[RDZV_KEY_MAX];
    char k_done[RDZV_KEY_MAX];
    int prev_round = last_closed_before(z, r, &z->prev);
    rg_status_t st;

    *have_txn = false;
    if (prev_round < 0) {
        return RG_OK;
    }
    st = rdzv_keys_nodes_prefix(&z->keys, prev_round, k_live, sizeof(k_live));
    if (st == RG_OK) {
        st = rdzv_keys_waiting_prefix(&z->keys, k_wait, sizeof(k_wait));
    }
    if (st == RG_OK) {
        st = rdzv_keys_failures_round_prefix(&z->keys, prev_round, k_fail, sizeof(k_fail));
    }
    if (st == RG_OK) {
        st = rdzv_keys_leaving_prefix(&z->keys, prev_round, k_leave, sizeof(k_leave));
    }
    if (st == RG_OK) {
        st = rdzv_keys_done_prefix(&z->keys, prev_round, k_done, sizeof(k_done));
    }
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_op_t ops[5] = {
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_live, .prefix = true,
                                               .keys_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_wait, .prefix = true,
                                               .keys_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_fail, .prefix = true,
                                               .count_only = true}},
        /* members that left on purpose are not waited for, even before their lease goes */
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_leave, .prefix = true,
                                               .keys_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k_done, .prefix = true,
                                               .keys_only = true}},
    };
    st = rg_etcd_txn(z->etcd, NULL, 0, ops, 5, NULL, 0, 0, t);
    if (st != RG_OK) {
        return st;
    }
    *have_txn = true;
    in->prev = &z->prev;
    in->prev_failed = t->results[2].u.range.count > 0;
    in->prev_lost = 0;
    for (int i = 0; i < z->prev.n_members; i++) {
        if (member_lost(z, prev_round, z->prev.members[i].agent, &t->results[0].u.range,
                        &t->results[4].u.range)) {
            in->prev_lost++;
        }
    }
    in->n_expected = 0;
    for (int k = 0; k < 2; k++) {
        const rg_etcd_range_t *res = &t->results[k].u.range;
        for (size_t i = 0; i < res->n_kvs; i++) {
            const char *agent = rdzv_keys_tail(res->kvs[i].key, k == 0 ? k_live : k_wait);
            if (agent == NULL || (k == 0 && left_on_purpose(&t->results[3].u.range, k_leave,
                                                            agent))) {
                continue;
            }
            if (in->n_expected == RDZV_EXPECT_MAX) {
                in->n_expected = -1;   /* too many to list: let the window decide */
                return RG_OK;
            }
            z->expected[in->n_expected++] = agent;
        }
    }
    return RG_OK;
}

/* Writes rounds/<r>/closed once: only if it does not exist, `round` is still r and no key
 * under rounds/<r>/nodes/ changed since the listing at revision rev. */
static rg_status_t write_closed(rg_rdzv_t *z, int r, const rg_rdzv_assignment_t *a,
                                int64_t rev, int lost)
{
    char closed_key[RDZV_KEY_MAX];
    char round_key[RDZV_KEY_MAX];
    char nodes_key[RDZV_KEY_MAX];
    char round_val[RDZV_NUM_MAX];
    char *text = NULL;
    char *nodes_end = NULL;
    size_t end_len;
    rg_etcd_txn_t t;
    rg_status_t st;

    st = rdzv_keys_closed(&z->keys, r, closed_key, sizeof(closed_key));
    if (st == RG_OK) {
        st = rdzv_keys_round(&z->keys, round_key, sizeof(round_key));
    }
    if (st == RG_OK) {
        st = rdzv_keys_nodes_prefix(&z->keys, r, nodes_key, sizeof(nodes_key));
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(r, round_val, sizeof(round_val));
    }
    if (st == RG_OK) {
        st = rdzv_rec_closed_encode(a, rg_wall_s(), &text);
    }
    if (st != RG_OK) {
        return st;
    }
    nodes_end = etcd_prefix_end(nodes_key, &end_len);
    if (nodes_end == NULL) {
        free(text);
        return rg_error(RG_ENOMEM, "rendezvous: range end");
    }
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
    st = rg_etcd_txn(z->etcd, cmps, 3, &op, 1, NULL, 0, 0, &t);
    free(nodes_end);
    free(text);
    if (st != RG_OK) {
        return st;
    }
    if (t.succeeded) {
        char old[RDZV_KEY_MAX];
        rg_info("rendezvous: closed round %d with %d nodes (restarts %d)", r, a->n_members,
                a->restart_count);
        if (lost > 0) {
            rg_warn("rendezvous: the worker failure of round %d is not counted against "
                    "--max-restarts: %d member%s of that round %s lost (lease expired or "
                    "revoked), which explains it; round %d runs with %d nodes (restarts %d, "
                    "failures excused %d)", z->prev.round, lost, lost == 1 ? "" : "s",
                    lost == 1 ? "was" : "were", r, a->n_members, a->restart_count,
                    a->excused_count);
        }
        /* Old rounds are history now; keep the last two for status and debugging: the
         * agents' keys of round r - 2 and its workers' (their wire-up addresses). */
        char old_w[RDZV_KEY_MAX];
        if (r >= 2 && rdzv_keys_round_prefix(&z->keys, r - 2, old, sizeof(old)) == RG_OK &&
            rdzv_keys_workers_round_prefix(&z->keys, r - 2, old_w, sizeof(old_w)) == RG_OK) {
            rg_etcd_op_t del[2] = {
                {.type = RG_ETCD_OP_DELETE, .u.del = {.key = old, .prefix = true}},
                {.type = RG_ETCD_OP_DELETE, .u.del = {.key = old_w, .prefix = true}},
            };
            rg_etcd_txn_t dt;
            if (rg_etcd_txn(z->etcd, NULL, 0, del, 2, NULL, 0, 0, &dt) == RG_OK) {
                rg_etcd_txn_cleanup(&dt);
            }
        }
    }
    rg_etcd_txn_cleanup(&t);
    return RG_OK;
}

rg_status_t rdzv_round_try_close(rg_rdzv_t *z, int r, int n, int64_t rev, uint64_t *wake_ns)
{
    rdzv_close_in_t in = {.min_nodes = z->p.min_nodes, .max_nodes = z->p.max_nodes,
                          .max_restarts = z->p.max_restarts, .last_call_ms = z->p.last_call_ms,
                          .round = r, .nodes = z->nodes, .n_nodes = n,
                          .expected = z->expected, .n_expected = 0,
                          .min_reached_ns = z->min_reached_ns,
                          .lease_ttl_ms = z->p.lease_ttl_s * 1000};
    rdzv_close_out_t out = {0};
    rg_etcd_txn_t ctx;
    bool have_ctx = false;
    rg_status_t st = RG_OK;

    /* Below min nodes nothing else matters: the previous round is read from min on. */
    if (n >= z->p.min_nodes) {
        st = read_close_context(z, r, &in, &ctx, &have_ctx);
    }
    if (st == RG_OK) {
        in.now_ns = rg_now_ns();
        rdzv_close_plan(&in, &out, &z->closing);
        z->min_reached_ns = out.min_reached_ns;
    }
    if (have_ctx) {
        rg_etcd_txn_cleanup(&ctx);
    }
    if (st != RG_OK || out.verdict == RDZV_CLOSE_BELOW_MIN) {
        return st;
    }
    if (out.verdict == RDZV_CLOSE_WAIT) {
        *wake_ns = out.wake_ns;
        return RG_OK;
    }
    st = write_closed(z, r, &z->closing, rev, out.excused ? in.prev_lost : 0);
    *wake_ns = rg_now_ns();   /* look again at once: closed, or someone raced us */
    return st;
}
