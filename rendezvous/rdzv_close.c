/*
 * The close policy of a round (rdzv_internal.h): who is in it, whether it closes now, and
 * the ranks. A pure function of its inputs, so that every rule is tested without etcd and
 * without waiting: the caller reads the state and the clock, the compare-and-swap that
 * writes the result is the caller's too (rdzv_round.c).
 */
#include "rdzv_internal.h"

#include <assert.h>
#include <string.h>

#define NEWCOMER (1L << 30)   /* the order key of a node that was not in the previous round */

static bool registered(const rdzv_close_in_t *in, const char *agent)
{
    for (int k = 0; k < in->n_nodes; k++) {
        if (strcmp(in->nodes[k].agent, agent) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether every agent the round may wait for is there. */
static bool all_expected_here(const rdzv_close_in_t *in)
{
    if (in->n_expected < 0) {
        return false;
    }
    for (int i = 0; i < in->n_expected; i++) {
        if (!registered(in, in->expected[i])) {
            return false;
        }
    }
    return true;
}

/* Whether a live member of prev (one of in->expected that was in prev) is not here yet:
 * after a failure its fate decides whether the failure counts. */
static bool prev_member_missing(const rdzv_close_in_t *in)
{
    if (in->prev == NULL || in->n_expected < 0) {
        return false;
    }
    for (int i = 0; i < in->n_expected; i++) {
        if (!registered(in, in->expected[i]) &&
            rdzv_assignment_find(in->prev, in->expected[i]) >= 0) {
            return true;
        }
    }
    return false;
}

/* Members of the previous closed round first, in their old order; then newcomers by
 * arrival (create revision). The agent id breaks what is left (a duplicate previous rank, or
 * one revision for two keys, which etcd never gives) so that every agent orders alike. */
static int order_cmp(const rdzv_node_rec_t *x, const rdzv_node_rec_t *y, int prev_round)
{
    long kx = prev_round >= 0 && x->prev_round == prev_round && x->prev_rank >= 0
                  ? x->prev_rank : NEWCOMER;
    long ky = prev_round >= 0 && y->prev_round == prev_round && y->prev_rank >= 0
                  ? y->prev_rank : NEWCOMER;
    if (kx != ky) {
        return kx < ky ? -1 : 1;
    }
    if (x->create_rev != y->create_rev) {
        return x->create_rev < y->create_rev ? -1 : 1;
    }
    return strcmp(x->agent, y->agent);
}

/* Insertion sort of indices: n is at most RDZV_LIST_MAX, and the input stays untouched. */
static void order_nodes(const rdzv_close_in_t *in, int prev_round, int *order)
{
    for (int i = 0; i < in->n_nodes; i++) {
        int j = i;
        while (j > 0 && order_cmp(&in->nodes[i], &in->nodes[order[j - 1]], prev_round) < 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

static void assign(const rdzv_close_in_t *in, rg_rdzv_assignment_t *a)
{
    int order[RDZV_LIST_MAX];
    int prev_round = in->prev ? in->prev->round : -1;
    int n = RG_MIN(in->n_nodes, in->max_nodes);

    order_nodes(in, prev_round, order);
    memset(a, 0, sizeof(*a));
    a->round = in->round;
    a->group_rank = -1;
    bool excused = in->prev_failed && in->prev_lost > 0;
    a->restart_count = (in->prev ? in->prev->restart_count : 0) +
                       (in->prev_failed && !excused ? 1 : 0);
    a->excused_count = (in->prev ? in->prev->excused_count : 0) + (excused ? 1 : 0);
    a->job_failed = a->restart_count > in->max_restarts;
    for (int i = 0; i < n; i++) {
        const rdzv_node_rec_t *d = &in->nodes[order[i]];
        memcpy(a->members[i].agent, d->agent, sizeof(a->members[i].agent));
        memcpy(a->members[i].addr, d->addr, sizeof(a->members[i].addr));
        a->members[i].nproc = d->nproc;
        a->world_size += d->nproc;
    }
    a->n_members = n;
    a->group_world = n;
    memcpy(a->master_addr, in->nodes[order[0]].addr, sizeof(a->master_addr));
    a->master_port = in->nodes[order[0]].port;
}

void rdzv_close_plan(const rdzv_close_in_t *in, rdzv_close_out_t *out,
                     rg_rdzv_assignment_t *closed)
{
    bool close;

    assert(in->n_nodes >= 0 && in->n_nodes <= RDZV_LIST_MAX);
    out->wake_ns = 0;
    out->excused = false;
    if (in->n_nodes < in->min_nodes || in->n_nodes < 1) {
        out->verdict = RDZV_CLOSE_BELOW_MIN;
        out->min_reached_ns = 0;
        return;
    }
    out->min_reached_ns = in->min_reached_ns ? in->min_reached_ns : in->now_ns;
    close = in->n_nodes >= in->max_nodes;
    /* Everyone expected is here (the live members of the last round and the waiters): no
     * reason to wait out the window. Without a previous round nobody is expected. */
    if (!close && in->prev != NULL) {
        close = all_expected_here(in);
    }
    if (!close) {
        int64_t window_ms = in->last_call_ms;
        /* After a failure, a member of prev that is neither here nor lost may be dead with
         * its lease still running (a node killed): wait for its lease to end, so that the
         * failure its death caused is not counted as the job's. */
        if (in->prev_failed && prev_member_missing(in)) {
            window_ms += RG_MAX(in->lease_ttl_ms, 0);
        }
        uint64_t at = out->min_reached_ns + (uint64_t)window_ms * 1000000ull;
        close = in->now_ns >= at;
        if (!close) {
            out->verdict = RDZV_CLOSE_WAIT;
            out->wake_ns = at;
            return;
        }
    }
    out->verdict = RDZV_CLOSE_NOW;
    out->excused = in->prev_failed && in->prev_lost > 0;
    assign(in, closed);
}
