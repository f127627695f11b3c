/* rendezvous/rdzv_close.c: the close policy of a round, a pure function: no etcd, no clock. */
#include "rdzv_internal.h"

#include "test_util.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000ull

static rdzv_node_rec_t nodes[8];

/* Node i: agent "n<i>", address "10.0.0.<i>", port 1000 + i, created at revision rev. */
static void node(int i, int prev_round, int prev_rank, int64_t rev)
{
    rdzv_node_rec_t *d = &nodes[i];
    memset(d, 0, sizeof(*d));
    snprintf(d->agent, sizeof(d->agent), "n%d", i);
    snprintf(d->addr, sizeof(d->addr), "10.0.0.%d", i);
    d->nproc = 2;
    d->port = 1000 + i;
    d->prev_round = prev_round;
    d->prev_rank = prev_rank;
    d->create_rev = rev;
}

static rdzv_close_in_t input(int n, int min, int max)
{
    rdzv_close_in_t in = {.min_nodes = min, .max_nodes = max, .max_restarts = 3,
                          .last_call_ms = 1000, .round = 6, .nodes = nodes, .n_nodes = n,
                          .now_ns = 5000 * MS};
    return in;
}

static rg_rdzv_assignment_t closed;

static rdzv_close_verdict_t plan(const rdzv_close_in_t *in, rdzv_close_out_t *out)
{
    memset(&closed, 0x5a, sizeof(closed));   /* must be untouched unless it closes */
    rdzv_close_plan(in, out, &closed);
    return out->verdict;
}

static void expect_order(const char *const *agents, int n)
{
    ck_assert_int_eq(closed.n_members, n);
    ck_assert_int_eq(closed.group_world, n);
    ck_assert_int_eq(closed.world_size, 2 * n);
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(closed.members[i].agent, agents[i]);
    }
}

START_TEST(test_closes_at_max)
{
    rdzv_close_out_t out;
    for (int i = 0; i < 4; i++) {
        node(i, -1, -1, 10 + i);
    }
    rdzv_close_in_t in = input(3, 2, 3);
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);   /* no window at max */
    const char *want[] = {"n0", "n1", "n2"};
    expect_order(want, 3);
    ck_assert_int_eq(closed.round, 6);
    ck_assert_int_eq(closed.group_rank, -1);
    ck_assert_str_eq(closed.master_addr, "10.0.0.0");
    ck_assert_int_eq(closed.master_port, 1000);

    /* More than max registered: the first max in rank order are the members. */
    in = input(4, 2, 3);
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    expect_order(want, 3);
}
END_TEST

START_TEST(test_min_after_last_call)
{
    rdzv_close_out_t out;
    node(0, -1, -1, 10);
    node(1, -1, -1, 11);
    rdzv_close_in_t in = input(2, 2, 4);

    /* Min reached now: the window starts, and nothing closes before it ends. */
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_WAIT);
    ck_assert_uint_eq(out.min_reached_ns, 5000 * MS);
    ck_assert_uint_eq(out.wake_ns, 6000 * MS);
    ck_assert_int_eq(closed.n_members, 0x5a5a5a5a);   /* untouched */
    in.min_reached_ns = out.min_reached_ns;
    in.now_ns = 6000 * MS - 1;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_WAIT);
    ck_assert_uint_eq(out.min_reached_ns, 5000 * MS);   /* kept, not restarted */
    ck_assert_uint_eq(out.wake_ns, 6000 * MS);
    in.now_ns = 6000 * MS;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    const char *want[] = {"n0", "n1"};
    expect_order(want, 2);
}
END_TEST

START_TEST(test_not_below_min)
{
    rdzv_close_out_t out;
    node(0, -1, -1, 10);
    node(1, -1, -1, 11);
    rdzv_close_in_t in = input(2, 3, 4);

    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_BELOW_MIN);
    ck_assert_uint_eq(out.min_reached_ns, 0);
    /* Falling below min again (a node left) restarts the window, however long ago. */
    in.min_reached_ns = 1 * MS;
    in.now_ns = 100000 * MS;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_BELOW_MIN);
    ck_assert_uint_eq(out.min_reached_ns, 0);
    in = input(0, 1, 4);
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_BELOW_MIN);
    ck_assert_int_eq(closed.n_members, 0x5a5a5a5a);
}
END_TEST

START_TEST(test_early_when_all_expected)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));
    const char *expected[] = {"n0", "n1"};
    const char *missing[] = {"n0", "n9"};

    prev->round = 5;
    node(0, 5, 0, 10);
    node(1, -1, -1, 11);
    rdzv_close_in_t in = input(2, 2, 4);
    in.prev = prev;
    in.expected = expected;
    in.n_expected = 2;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);   /* everyone expected is here */
    in.expected = missing;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_WAIT);  /* n9 may still come */
    in.n_expected = -1;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_WAIT);  /* unknown: the window decides */
    /* Without a previous round nobody is expected: only the window closes below max. */
    in.prev = NULL;
    in.expected = expected;
    in.n_expected = 2;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_WAIT);
    free(prev);
}
END_TEST

START_TEST(test_stable_rank_order)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));

    prev->round = 5;
    node(0, -1, -1, 40);   /* newcomer, registered last */
    node(1, 5, 2, 30);     /* was rank 2 */
    node(2, 4, 0, 10);     /* in an older round only: a newcomer here */
    node(3, 5, 0, 50);     /* was rank 0, registered late: keeps rank 0 */
    node(4, -1, -1, 20);   /* newcomer, registered first */
    rdzv_close_in_t in = input(5, 2, 8);
    in.prev = prev;
    in.now_ns = in.last_call_ms * MS + 1;   /* the window is over */
    in.min_reached_ns = 1;
    in.n_expected = -1;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    const char *want[] = {"n3", "n1", "n2", "n4", "n0"};
    expect_order(want, 5);
    ck_assert_str_eq(closed.master_addr, "10.0.0.3");
    ck_assert_int_eq(closed.master_port, 1003);
    /* The input is the caller's: left as it was. */
    ck_assert_str_eq(nodes[0].agent, "n0");
    ck_assert_int_eq(nodes[4].create_rev, 20);

    /* At max the cut falls on the newcomers, never on the previous round's members. */
    in.max_nodes = 3;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    expect_order(want, 3);
    free(prev);
}
END_TEST

START_TEST(test_ties)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));

    prev->round = 5;
    /* One revision for two keys (etcd never gives it): the agent id decides. */
    node(0, -1, -1, 30);
    node(1, -1, -1, 30);
    snprintf(nodes[0].agent, sizeof(nodes[0].agent), "zz");
    snprintf(nodes[1].agent, sizeof(nodes[1].agent), "aa");
    /* Two claiming the same previous rank: the earlier registration first. */
    node(2, 5, 1, 25);
    node(3, 5, 1, 15);
    rdzv_close_in_t in = input(4, 4, 4);
    in.prev = prev;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    const char *want[] = {"n3", "n2", "aa", "zz"};
    expect_order(want, 4);
    /* Any input order gives the same ranks. */
    rdzv_node_rec_t t = nodes[0];
    nodes[0] = nodes[3];
    nodes[3] = t;
    t = nodes[1];
    nodes[1] = nodes[2];
    nodes[2] = t;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    expect_order(want, 4);
    free(prev);
}
END_TEST

START_TEST(test_restarts)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));

    node(0, 5, 0, 10);
    rdzv_close_in_t in = input(1, 1, 1);
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert_int_eq(closed.restart_count, 0);   /* the first round */
    ck_assert(!closed.job_failed);

    prev->round = 5;
    prev->restart_count = 3;
    in.prev = prev;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert_int_eq(closed.restart_count, 3);   /* a regroup without a failure */
    ck_assert(!closed.job_failed);
    in.prev_failed = true;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert_int_eq(closed.restart_count, 4);   /* past max_restarts = 3 */
    ck_assert(closed.job_failed);
    free(prev);
}
END_TEST

/* A failure of prev that came with the loss of one of its members is not counted. */
START_TEST(test_failure_with_loss_excused)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));
    const char *expected[] = {"n0"};

    prev->round = 5;
    prev->restart_count = 0;
    prev->excused_count = 2;
    prev->n_members = 2;
    snprintf(prev->members[0].agent, sizeof(prev->members[0].agent), "n0");
    snprintf(prev->members[1].agent, sizeof(prev->members[1].agent), "n1");
    node(0, 5, 0, 10);
    rdzv_close_in_t in = input(1, 1, 2);
    in.max_restarts = 0;
    in.prev = prev;
    in.expected = expected;   /* n1's node key is gone: it is not expected */
    in.n_expected = 1;
    in.prev_failed = true;
    in.prev_lost = 1;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert(out.excused);
    ck_assert_int_eq(closed.restart_count, 0);
    ck_assert_int_eq(closed.excused_count, 3);
    ck_assert(!closed.job_failed);
    ck_assert_int_eq(closed.n_members, 1);

    /* The same failure with every member still there counts, and ends the job at 0. */
    in.prev_lost = 0;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert(!out.excused);
    ck_assert_int_eq(closed.restart_count, 1);
    ck_assert_int_eq(closed.excused_count, 2);
    ck_assert(closed.job_failed);

    /* A loss without a failure is a plain regroup: nothing to excuse. */
    in.prev_failed = false;
    in.prev_lost = 1;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert(!out.excused);
    ck_assert_int_eq(closed.restart_count, 0);
    ck_assert_int_eq(closed.excused_count, 2);
    free(prev);
}
END_TEST

/* After a failure, a member of prev that is neither here nor lost (killed, its lease still
 * running) is waited for up to the lease TTL beyond the last-call window; its loss then
 * excuses the failure. Without a failure the window is the last call alone. */
START_TEST(test_failure_waits_for_a_dying_member)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));
    const char *both[] = {"n0", "n1"};
    const char *one[] = {"n0"};

    prev->round = 5;
    prev->n_members = 2;
    snprintf(prev->members[0].agent, sizeof(prev->members[0].agent), "n0");
    snprintf(prev->members[1].agent, sizeof(prev->members[1].agent), "n1");
    node(0, 5, 0, 10);
    rdzv_close_in_t in = input(1, 1, 2);
    in.max_restarts = 0;
    in.prev = prev;
    in.expected = both;
    in.n_expected = 2;
    in.prev_failed = true;
    in.lease_ttl_ms = 2000;
    in.min_reached_ns = 4000 * MS;
    in.now_ns = 5500 * MS;   /* past the last call (1 s), within it + the TTL */
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_WAIT);
    ck_assert_uint_eq(out.wake_ns, (4000 + 1000 + 2000) * MS);
    /* Without a failure the last call alone decides. */
    in.prev_failed = false;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    /* n1's lease ended: no one is missing, the failure is its loss's. */
    in.prev_failed = true;
    in.expected = one;
    in.n_expected = 1;
    in.prev_lost = 1;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert(out.excused && !closed.job_failed);
    /* n1 never came nor went: after the longer window the failure counts. */
    in.expected = both;
    in.n_expected = 2;
    in.prev_lost = 0;
    in.now_ns = 7000 * MS;
    ck_assert_int_eq(plan(&in, &out), RDZV_CLOSE_NOW);
    ck_assert(!out.excused && closed.job_failed);
    free(prev);
}
END_TEST

/* The policy at the most nodes a job takes: every member of the previous round but one comes
 * back (listed in the reverse of their order), two newcomers want the one seat left; the
 * survivors keep their order and the newcomer that registered first gets the seat. */
static rdzv_node_rec_t many[RG_RDZV_MAX_NODES + 1];

START_TEST(test_at_the_most_nodes)
{
    rdzv_close_out_t out;
    rg_rdzv_assignment_t *prev = calloc(1, sizeof(*prev));
    const int max = RG_RDZV_MAX_NODES;
    const int lost = 17;
    int n = 0;

    ck_assert_ptr_nonnull(prev);
    prev->round = 5;
    for (int rank = max - 1; rank >= 0; rank--) {
        if (rank == lost) {
            continue;
        }
        rdzv_node_rec_t *d = &many[n++];
        snprintf(d->agent, sizeof(d->agent), "p%04d", rank);
        snprintf(d->addr, sizeof(d->addr), "10.%d.%d.1", rank / 256, rank % 256);
        d->nproc = 8;
        d->prev_round = 5;
        d->prev_rank = rank;
        d->create_rev = 1000 + n;
    }
    for (int i = 0; i < 2; i++) {
        rdzv_node_rec_t *d = &many[n++];
        snprintf(d->agent, sizeof(d->agent), "new%d", i);
        snprintf(d->addr, sizeof(d->addr), "10.99.0.%d", i);
        d->nproc = 8;
        d->prev_round = -1;
        d->prev_rank = -1;
        d->create_rev = i == 0 ? 9000 : 500;   /* new1 registered first */
    }
    ck_assert_int_eq(n, max + 1);
    rdzv_close_in_t in = input(0, 1, max);
    in.nodes = many;
    in.n_nodes = n;
    in.prev = prev;
    in.n_expected = -1;
    in.now_ns = in.last_call_ms * MS + 1;
    in.min_reached_ns = 1;
    memset(&closed, 0x5a, sizeof(closed));
    rdzv_close_plan(&in, &out, &closed);
    ck_assert_int_eq(out.verdict, RDZV_CLOSE_NOW);
    ck_assert_int_eq(closed.n_members, max);
    ck_assert_int_eq(closed.world_size, 8 * max);
    for (int i = 0; i < max - 1; i++) {
        char want[16];
        snprintf(want, sizeof(want), "p%04d", i < lost ? i : i + 1);
        ck_assert_str_eq(closed.members[i].agent, want);
    }
    ck_assert_str_eq(closed.members[max - 1].agent, "new1");
    ck_assert_str_eq(closed.master_addr, "10.0.0.1");
    free(prev);
}
END_TEST

static Suite *rdzv_close_suite(void)
{
    Suite *s = suite_create("rdzv_close");
    TCase *tc = tcase_create("policy");
    tcase_add_test(tc, test_closes_at_max);
    tcase_add_test(tc, test_min_after_last_call);
    tcase_add_test(tc, test_not_below_min);
    tcase_add_test(tc, test_early_when_all_expected);
    tcase_add_test(tc, test_stable_rank_order);
    tcase_add_test(tc, test_ties);
    tcase_add_test(tc, test_restarts);
    tcase_add_test(tc, test_failure_with_loss_excused);
    tcase_add_test(tc, test_failure_waits_for_a_dying_member);
    tcase_add_test(tc, test_at_the_most_nodes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_main("rdzv_close", rdzv_close_suite(), NULL);
}
