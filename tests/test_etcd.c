/* The etcd client against real etcd servers started on free loopback ports. */
#include "test_util.h"

#include <regroup/etcd.h>

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static test_etcd_t etcd;
static rg_etcd_t *cli;

static rg_etcd_params_t params_for(const char *endpoints)
{
    rg_etcd_params_t p = {.endpoints = endpoints, .timeout_ms = 3000};
    return p;
}

/* One fast member and a client without credentials; auth: the same with auth enabled. */
static void up_with(bool auth)
{
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST, .auth = auth});
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    ck_assert_int_eq(rg_etcd_create(&p, &cli), RG_OK);
}

static void up(void)
{
    up_with(false);
}

static void up_auth(void)
{
    up_with(true);
}

static void down(void)
{
    rg_etcd_destroy(cli);
    cli = NULL;
    test_etcd_down(&etcd);
}

static void put(rg_etcd_t *c, const char *k, const char *v)
{
    rg_status_t st = rg_etcd_put_str(c, k, v, 0, 0, NULL);
    ck_assert_msg(st == RG_OK, "put %s: %s", k, rg_last_error());
}

/* Waits for the next event and checks its type, key and value. */
static void expect_event(rg_etcd_watch_t *w, rg_etcd_event_type_t type, const char *key,
                         const char *value)
{
    rg_etcd_event_t ev;
    rg_status_t st = rg_etcd_watch_next(w, rg_deadline_in_ms(10000), &ev, NULL);
    ck_assert_msg(st == RG_OK, "watch next: %s %s", rg_status_name(st), rg_last_error());
    ck_assert_int_eq(ev.type, type);
    ck_assert_str_eq(ev.kv.key, key);
    if (value != NULL) {
        ck_assert_str_eq(ev.kv.value, value);
    }
    rg_etcd_event_cleanup(&ev);
}

START_TEST(test_crud_and_prefix)
{
    rg_etcd_range_t r;
    char *v;
    size_t len;
    int64_t modrev;

    put(cli, "/t/a", "1");
    put(cli, "/t/b", "2");
    put(cli, "/t/c", "3");
    put(cli, "/u/x", "9");
    ck_assert_int_eq(rg_etcd_get(cli, "/t/b", 0, &v, &len, &modrev), RG_OK);
    ck_assert_str_eq(v, "2");
    ck_assert_uint_eq(len, 1);
    ck_assert_int_gt(modrev, 0);
    free(v);
    ck_assert_int_eq(rg_etcd_get(cli, "/t/none", 0, &v, &len, NULL), RG_ENOENT);

    rg_etcd_range_req_t rq = {.key = "/t/", .prefix = true};
    ck_assert_int_eq(rg_etcd_range(cli, &rq, 0, &r), RG_OK);
    ck_assert_uint_eq(r.n_kvs, 3);
    ck_assert_int_eq(r.count, 3);
    ck_assert_str_eq(r.kvs[0].key, "/t/a");
    ck_assert_str_eq(r.kvs[2].value, "3");
    ck_assert(!r.more);
    rg_etcd_range_cleanup(&r);

    rq.limit = 2;
    ck_assert_int_eq(rg_etcd_range(cli, &rq, 0, &r), RG_OK);
    ck_assert_uint_eq(r.n_kvs, 2);
    ck_assert(r.more);
    ck_assert_int_eq(r.count, 3);
    rg_etcd_range_cleanup(&r);

    rg_etcd_range_req_t cq = {.key = "/t/", .prefix = true, .count_only = true};
    ck_assert_int_eq(rg_etcd_range(cli, &cq, 0, &r), RG_OK);
    ck_assert_uint_eq(r.n_kvs, 0);
    ck_assert_int_eq(r.count, 3);
    rg_etcd_range_cleanup(&r);

    /* Binary values survive the base64 round trip, embedded NULs included. */
    const char bin[] = {0, 1, 2, (char)0xff, 0, 'z'};
    rg_etcd_put_req_t pq = {.key = "/t/bin", .value = bin, .value_len = sizeof(bin),
                            .prev_kv = true};
    rg_etcd_put_t pr;
    ck_assert_int_eq(rg_etcd_put(cli, &pq, 0, &pr), RG_OK);
    ck_assert(!pr.has_prev);
    rg_etcd_put_cleanup(&pr);
    ck_assert_int_eq(rg_etcd_get(cli, "/t/bin", 0, &v, &len, NULL), RG_OK);
    ck_assert_uint_eq(len, sizeof(bin));
    ck_assert_mem_eq(v, bin, sizeof(bin));
    free(v);

    /* Reading at an older revision sees the old value. */
    int64_t rev1;
    int64_t rev2;
    ck_assert_int_eq(rg_etcd_put_str(cli, "/t/a", "old", 0, 0, &rev1), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(cli, "/t/a", "new", 0, 0, &rev2), RG_OK);
    ck_assert_int_gt(rev2, rev1);
    rg_etcd_range_req_t oq = {.key = "/t/a", .revision = rev1};
    ck_assert_int_eq(rg_etcd_range(cli, &oq, 0, &r), RG_OK);
    ck_assert_str_eq(r.kvs[0].value, "old");
    rg_etcd_range_cleanup(&r);

    /* Only the keys written since a revision (the group's wire-up watches its peers' keys
     * so); etcd filters the keys, not the count. */
    rg_etcd_range_req_t mq = {.key = "/t/", .prefix = true, .keys_only = true,
                              .min_mod_revision = rev2};
    ck_assert_int_eq(rg_etcd_range(cli, &mq, 0, &r), RG_OK);
    ck_assert_uint_eq(r.n_kvs, 1);
    ck_assert_str_eq(r.kvs[0].key, "/t/a");
    rg_etcd_range_cleanup(&r);
    mq.min_mod_revision = rev2 + 1;
    ck_assert_int_eq(rg_etcd_range(cli, &mq, 0, &r), RG_OK);
    ck_assert_uint_eq(r.n_kvs, 0);
    rg_etcd_range_cleanup(&r);
    mq.min_mod_revision = -1;
    ck_assert_int_eq(rg_etcd_range(cli, &mq, 0, &r), RG_EINVAL);

    rg_etcd_delete_req_t dq = {.key = "/t/", .prefix = true, .prev_kv = true};
    rg_etcd_delete_t dr;
    ck_assert_int_eq(rg_etcd_delete(cli, &dq, 0, &dr), RG_OK);
    ck_assert_int_eq(dr.deleted, 4);
    ck_assert_uint_eq(dr.n_prev, 4);
    rg_etcd_delete_cleanup(&dr);
    ck_assert_int_eq(rg_etcd_get(cli, "/u/x", 0, &v, &len, NULL), RG_OK);
    free(v);
}
END_TEST

START_TEST(test_bad_input)
{
    rg_etcd_t *c = NULL;
    rg_etcd_params_t p = {.endpoints = ""};
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_EINVAL);
    p.endpoints = "nohostport";
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_EINVAL);
    ck_assert(strstr(rg_last_error(), "nohostport") != NULL);
    p.endpoints = "127.0.0.1:1";
    p.user = "root";
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_EINVAL);
    rg_etcd_range_req_t rq = {.key = NULL};
    rg_etcd_range_t r;
    ck_assert_int_eq(rg_etcd_range(cli, &rq, 0, &r), RG_EINVAL);
    int64_t lease;
    ck_assert_int_eq(rg_etcd_lease_grant(cli, 0, 0, &lease, NULL), RG_EINVAL);
}
END_TEST

START_TEST(test_txn_branches)
{
    rg_etcd_txn_t t;
    /* create-if-absent: first time succeeds, second time fails and returns the owner. */
    rg_etcd_cmp_t cmp = {.key = "/lock", .target = RG_ETCD_CMP_CREATE,
                         .result = RG_ETCD_EQUAL, .number = 0};
    rg_etcd_op_t ok_op = {.type = RG_ETCD_OP_PUT,
                          .u.put = {.key = "/lock", .value = "me", .value_len = 2}};
    rg_etcd_op_t fail_op = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = "/lock"}};

    ck_assert_int_eq(rg_etcd_txn(cli, &cmp, 1, &ok_op, 1, &fail_op, 1, 0, &t), RG_OK);
    ck_assert(t.succeeded);
    ck_assert_uint_eq(t.n_results, 1);
    ck_assert_int_eq(t.results[0].type, RG_ETCD_OP_PUT);
    int64_t created_rev = t.revision;
    rg_etcd_txn_cleanup(&t);

    ok_op.u.put.value = "you";
    ok_op.u.put.value_len = 3;
    ck_assert_int_eq(rg_etcd_txn(cli, &cmp, 1, &ok_op, 1, &fail_op, 1, 0, &t), RG_OK);
    ck_assert(!t.succeeded);
    ck_assert_uint_eq(t.n_results, 1);
    ck_assert_int_eq(t.results[0].type, RG_ETCD_OP_RANGE);
    ck_assert_uint_eq(t.results[0].u.range.n_kvs, 1);
    ck_assert_str_eq(t.results[0].u.range.kvs[0].value, "me");
    ck_assert_int_eq(t.results[0].u.range.kvs[0].mod_revision, created_rev);
    rg_etcd_txn_cleanup(&t);

    /* compare-and-swap on mod_revision and on value; both branches, several ops. */
    rg_etcd_cmp_t cas[2] = {
        {.key = "/lock", .target = RG_ETCD_CMP_MOD, .result = RG_ETCD_EQUAL,
         .number = created_rev},
        {.key = "/lock", .target = RG_ETCD_CMP_VALUE, .result = RG_ETCD_EQUAL, .value = "me",
         .value_len = 2},
    };
    rg_etcd_op_t two[2] = {
        {.type = RG_ETCD_OP_PUT, .u.put = {.key = "/lock", .value = "v2", .value_len = 2}},
        {.type = RG_ETCD_OP_PUT, .u.put = {.key = "/round", .value = "1", .value_len = 1}},
    };
    ck_assert_int_eq(rg_etcd_txn(cli, cas, 2, two, 2, NULL, 0, 0, &t), RG_OK);
    ck_assert(t.succeeded);
    ck_assert_uint_eq(t.n_results, 2);
    rg_etcd_txn_cleanup(&t);
    ck_assert_int_eq(rg_etcd_txn(cli, cas, 2, two, 2, NULL, 0, 0, &t), RG_OK);
    ck_assert(!t.succeeded);
    ck_assert_uint_eq(t.n_results, 0);
    rg_etcd_txn_cleanup(&t);

    /* version GREATER, and a delete op in the success branch */
    rg_etcd_cmp_t vc = {.key = "/lock", .target = RG_ETCD_CMP_VERSION,
                        .result = RG_ETCD_GREATER, .number = 1};
    rg_etcd_op_t del = {.type = RG_ETCD_OP_DELETE, .u.del = {.key = "/lock", .prev_kv = true}};
    ck_assert_int_eq(rg_etcd_txn(cli, &vc, 1, &del, 1, NULL, 0, 0, &t), RG_OK);
    ck_assert(t.succeeded);
    ck_assert_int_eq(t.results[0].u.del.deleted, 1);
    ck_assert_str_eq(t.results[0].u.del.prev_kvs[0].value, "v2");
    rg_etcd_txn_cleanup(&t);

    /* The same key twice in one branch is refused by etcd with a clear message. */
    rg_etcd_op_t dup[2] = {two[0], two[0]};
    ck_assert_int_eq(rg_etcd_txn(cli, NULL, 0, dup, 2, NULL, 0, 0, &t), RG_ESERVER);
    ck_assert_msg(strstr(rg_last_error(), "duplicate key") != NULL, "%s", rg_last_error());
}
END_TEST

/* True if key exists (a failed read is not). */
static bool key_present(const char *key)
{
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = key};
    if (rg_etcd_range(cli, &rq, 0, &r) != RG_OK) {
        return false;
    }
    bool there = r.n_kvs == 1;
    rg_etcd_range_cleanup(&r);
    return there;
}

START_TEST(test_lease_expiry_and_keepalive)
{
    int64_t lease;
    int64_t ttl;
    int64_t kept;
    rg_etcd_watch_t *w;
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);

    /* Two leases: one expires, the other is held by a keeper. */
    ck_assert_int_eq(rg_etcd_lease_grant(cli, 1, 0, &lease, &ttl), RG_OK);
    ck_assert_int_eq(ttl, 1);
    /* 2 s for the kept one: a loaded machine (the sanitizer build, other work) can delay a
     * renewal by a good part of a second. */
    ck_assert_int_eq(rg_etcd_lease_grant(cli, 2, 0, &kept, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(cli, "/l/dies", "x", lease, 0, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(cli, "/l/lives", "y", kept, 0, NULL), RG_OK);
    rg_etcd_keeper_t *keeper;
    ck_assert_int_eq(rg_etcd_keeper_start(&p, kept, 2, &keeper), RG_OK);

    rg_etcd_watch_req_t wr = {.key = "/l/dies"};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    /* The expiry shows up as a DELETE event. */
    expect_event(w, RG_ETCD_EVENT_DELETE, "/l/dies", NULL);
    rg_etcd_watch_destroy(w);
    ck_assert_int_eq(rg_etcd_lease_keepalive(cli, lease, 0, &ttl), RG_ELEASE);
    ck_assert_int_eq(rg_etcd_lease_ttl(cli, lease, 0, &ttl, NULL), RG_ELEASE);

    /* While the kept lease lives two TTLs, its key stays and its keeper holds it. */
    TEST_HOLD_FOR(!rg_etcd_keeper_lost(keeper) && key_present("/l/lives"), 4000,
                  "the kept lease's key went, or its keeper gave up");
    ck_assert_int_eq(rg_etcd_lease_ttl(cli, kept, 0, &ttl, NULL), RG_OK);
    /* Revoking deletes at once; the keeper sees the lease gone and says so. */
    ck_assert_int_eq(rg_etcd_lease_revoke(cli, kept, 0), RG_OK);
    char *v;
    size_t len;
    ck_assert_int_eq(rg_etcd_get(cli, "/l/lives", 0, &v, &len, NULL), RG_ENOENT);
    TEST_WAIT_UNTIL(rg_etcd_keeper_lost(keeper), 5000, "the keeper did not see its lease go");
    rg_etcd_keeper_stop(keeper);
    ck_assert_int_eq(rg_etcd_lease_revoke(cli, kept, 0), RG_ELEASE);
}
END_TEST

/* RG_DEADLINE_DEFAULT waits the client's timeout_ms; a deadline already passed only looks. */
START_TEST(test_watch_next_deadlines)
{
    rg_etcd_watch_t *w;
    rg_etcd_event_t ev;
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    p.timeout_ms = 300;
    rg_etcd_watch_req_t wr = {.key = "/wd/", .prefix = true};

    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, rg_deadline_in_ms(10000), &w), RG_OK);
    uint64_t t0 = rg_now_ns();
    ck_assert_int_eq(rg_etcd_watch_next(w, RG_DEADLINE_POLL, &ev, NULL), RG_ETIMEDOUT);
    uint64_t t1 = rg_now_ns();
    ck_assert_int_eq(rg_etcd_watch_next(w, RG_DEADLINE_DEFAULT, &ev, NULL), RG_ETIMEDOUT);
    uint64_t t2 = rg_now_ns();
    ck_assert_msg(t1 - t0 < 200000000ull, "polling took %llu ms",
                  (unsigned long long)((t1 - t0) / 1000000));
    ck_assert_msg(t2 - t1 >= 290000000ull && t2 - t1 < 3000000000ull,
                  "the default wait took %llu ms, not about 300",
                  (unsigned long long)((t2 - t1) / 1000000));
    put(cli, "/wd/a", "1");
    expect_event(w, RG_ETCD_EVENT_PUT, "/wd/a", "1");
    rg_etcd_watch_destroy(w);
}
END_TEST

START_TEST(test_watch_order_and_prev)
{
    rg_etcd_watch_t *w;
    rg_etcd_event_t ev;
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    int64_t rev0;

    ck_assert_int_eq(rg_etcd_put_str(cli, "/w/before", "0", 0, 0, &rev0), RG_OK);
    rg_etcd_watch_req_t wr = {.key = "/w/", .prefix = true, .prev_kv = true,
                              .start_revision = rev0 + 1};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    put(cli, "/w/a", "1");
    put(cli, "/w/b", "2");
    put(cli, "/w/a", "3");
    put(cli, "/other", "x");
    rg_etcd_delete_req_t dq = {.key = "/w/b"};
    ck_assert_int_eq(rg_etcd_delete(cli, &dq, 0, NULL), RG_OK);
    expect_event(w, RG_ETCD_EVENT_PUT, "/w/a", "1");
    expect_event(w, RG_ETCD_EVENT_PUT, "/w/b", "2");
    ck_assert_int_eq(rg_etcd_watch_next(w, rg_deadline_in_ms(5000), &ev, NULL), RG_OK);
    ck_assert_str_eq(ev.kv.value, "3");
    ck_assert(ev.has_prev);
    ck_assert_str_eq(ev.prev_kv.value, "1");
    rg_etcd_event_cleanup(&ev);
    expect_event(w, RG_ETCD_EVENT_DELETE, "/w/b", NULL);
    /* Nothing more: a short wait times out. */
    ck_assert_int_eq(rg_etcd_watch_next(w, rg_deadline_in_ms(100), &ev, NULL), RG_ETIMEDOUT);
    ck_assert_int_eq(rg_etcd_watch_next(w, RG_DEADLINE_POLL, &ev, NULL), RG_ETIMEDOUT);
    rg_etcd_watch_destroy(w);
}
END_TEST

/* The counters of a client and a watch: each request and its bytes, each event received. */
START_TEST(test_stats_count_requests_and_events)
{
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    rg_etcd_t *c;
    rg_etcd_watch_t *w;
    rg_etcd_stats_t s0 = {0};
    rg_etcd_stats_t s1 = {0};
    rg_etcd_stats_t ws = {0};

    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    rg_etcd_stats_add(c, &s0);
    ck_assert_uint_eq(s0.requests, 0);
    rg_etcd_watch_req_t wr = {.key = "/stats/", .prefix = true};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    put(c, "/stats/a", "1");
    put(c, "/stats/b", "22");
    put(c, "/elsewhere", "333");
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = "/stats/", .prefix = true};
    ck_assert_int_eq(rg_etcd_range(c, &rq, 0, &r), RG_OK);
    ck_assert_int_eq((int)r.n_kvs, 2);
    rg_etcd_range_cleanup(&r);
    rg_etcd_stats_add(c, &s1);
    ck_assert_uint_eq(s1.requests, 4);
    ck_assert_uint_gt(s1.bytes_sent, 0);
    ck_assert_uint_gt(s1.bytes_received, 0);
    ck_assert_uint_eq(s1.events, 0);
    expect_event(w, RG_ETCD_EVENT_PUT, "/stats/a", "1");
    expect_event(w, RG_ETCD_EVENT_PUT, "/stats/b", "22");
    rg_etcd_watch_stats_add(w, &ws);
    ck_assert_uint_eq(ws.events, 2);   /* /elsewhere is not in the watch */
    ck_assert_uint_ge(ws.requests, 1);
    ck_assert_uint_gt(ws.bytes_received, 0);
    rg_etcd_stats_add(NULL, &ws);
    rg_etcd_watch_stats_add(NULL, &ws);
    rg_etcd_keeper_stats_add(NULL, &ws);
    ck_assert_uint_eq(ws.events, 2);
    rg_etcd_watch_destroy(w);
    rg_etcd_destroy(c);
}
END_TEST

START_TEST(test_watch_survives_restart)
{
    rg_etcd_watch_t *w;
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    char v[16];

    rg_etcd_watch_req_t wr = {.key = "/r/", .prefix = true};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    for (int i = 0; i < 5; i++) {
        snprintf(v, sizeof(v), "%d", i);
        put(cli, "/r/k", v);
    }
    /* Take two, then the server dies with three unread and comes back on the same data. */
    expect_event(w, RG_ETCD_EVENT_PUT, "/r/k", "0");
    expect_event(w, RG_ETCD_EVENT_PUT, "/r/k", "1");
    rg_etcd_server_kill(&etcd.srv, 0, SIGKILL);
    ck_assert_int_eq(rg_etcd_server_restart(&etcd.srv, 0), 0);
    for (int i = 5; i < 10; i++) {
        snprintf(v, sizeof(v), "%d", i);
        put(cli, "/r/k", v);
    }
    /* Every event once, in order, across the restart. */
    for (int i = 2; i < 10; i++) {
        snprintf(v, sizeof(v), "%d", i);
        expect_event(w, RG_ETCD_EVENT_PUT, "/r/k", v);
    }
    rg_etcd_event_t ev;
    ck_assert_int_eq(rg_etcd_watch_next(w, rg_deadline_in_ms(300), &ev, NULL), RG_ETIMEDOUT);
    rg_etcd_watch_destroy(w);
}
END_TEST

START_TEST(test_watch_compacted)
{
    rg_etcd_watch_t *w;
    rg_etcd_event_t ev;
    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    int64_t rev;
    int64_t compact = 0;

    put(cli, "/c/k", "1");
    put(cli, "/c/k", "2");
    ck_assert_int_eq(rg_etcd_put_str(cli, "/c/k", "3", 0, 0, &rev), RG_OK);
    ck_assert_int_eq(rg_etcd_server_etcdctl(&etcd.srv, "compaction 4"), 0);
    /* Reading a compacted revision is its own error. */
    rg_etcd_range_req_t rq = {.key = "/c/k", .revision = 2};
    rg_etcd_range_t r;
    ck_assert_int_eq(rg_etcd_range(cli, &rq, 0, &r), RG_ECOMPACTED);
    /* So is watching from one. */
    rg_etcd_watch_req_t wr = {.key = "/c/k", .start_revision = 2};
    rg_status_t st = rg_etcd_watch_create(&p, &wr, 0, &w);
    if (st == RG_OK) {
        ck_assert_int_eq(rg_etcd_watch_next(w, rg_deadline_in_ms(5000), &ev, &compact),
                         RG_ECOMPACTED);
        rg_etcd_watch_destroy(w);
    } else {
        ck_assert_int_eq(st, RG_ECOMPACTED);
    }
    ck_assert(strstr(rg_last_error(), "compacted") != NULL);
}
END_TEST

START_TEST(test_unreachable)
{
    rg_etcd_t *c;
    char ep[64];
    int64_t lease;
    snprintf(ep, sizeof(ep), "127.0.0.1:%d", rg_free_port());
    rg_etcd_params_t p = params_for(ep);
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    uint64_t t0 = rg_now_ns();
    rg_status_t st = rg_etcd_lease_grant(c, 5, rg_deadline_in_ms(1000), &lease, NULL);
    ck_assert_msg(st == RG_EUNREACH || st == RG_ETIMEDOUT, "%s", rg_status_name(st));
    ck_assert_msg(strstr(rg_last_error(), ep) != NULL, "message names the endpoint: %s",
                  rg_last_error());
    ck_assert_uint_lt(rg_now_ns() - t0, 1500000000ull);
    rg_etcd_destroy(c);
}
END_TEST

/* ---- three members -------------------------------------------------------------------- */

START_TEST(test_cluster_failover)
{
    test_etcd_t cluster;
    rg_etcd_server_t *cl = &cluster.srv;
    rg_etcd_t *c;
    rg_etcd_watch_t *w;
    char v[16];

    test_etcd_up(&cluster, &(test_etcd_opts_t){.members = 3, .extra_flags = TEST_ETCD_CLUSTER});
    rg_etcd_params_t p = cluster.params;
    /* Killing the leader costs an election (500 ms here, longer on a loaded machine). */
    p.timeout_ms = 10000;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    put(c, "/f/k", "0");
    rg_etcd_watch_req_t wr = {.key = "/f/", .prefix = true};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    put(c, "/f/k", "1");
    expect_event(w, RG_ETCD_EVENT_PUT, "/f/k", "1");

    /* Kill the member the client uses (the watch started on the same one). */
    const char *used = rg_etcd_endpoint(c);
    int victim = -1;
    for (int i = 0; i < cl->n; i++) {
        if (strcmp(cl->url[i], used) == 0) {
            victim = i;
        }
    }
    ck_assert_int_ge(victim, 0);
    rg_etcd_server_kill(cl, victim, SIGKILL);
    for (int i = 2; i < 6; i++) {
        snprintf(v, sizeof(v), "%d", i);
        rg_status_t st = rg_etcd_put_str(c, "/f/k", v, 0, 0, NULL);
        ck_assert_msg(st == RG_OK, "put after member death: %s", rg_last_error());
    }
    ck_assert_str_ne(rg_etcd_endpoint(c), cl->url[victim]);
    for (int i = 2; i < 6; i++) {
        snprintf(v, sizeof(v), "%d", i);
        expect_event(w, RG_ETCD_EVENT_PUT, "/f/k", v);
    }
    rg_etcd_watch_destroy(w);
    rg_etcd_destroy(c);
    test_etcd_down(&cluster);
}
END_TEST

/* The member the client and the watch use stops answering but keeps its connections
 * (SIGSTOP: what a member cut off from its leader or stalled on its disk looks like): each
 * request leaves it for another member within about a second, not half its deadline, and
 * the watch, whose stream just goes quiet, moves too and loses no event. */
START_TEST(test_cluster_silent_member)
{
    test_etcd_t cluster;
    rg_etcd_server_t *cl = &cluster.srv;
    rg_etcd_t *c;
    rg_etcd_watch_t *w;
    char v[16];

    test_etcd_up(&cluster, &(test_etcd_opts_t){.members = 3, .extra_flags = TEST_ETCD_CLUSTER});
    rg_etcd_params_t p = cluster.params;
    p.timeout_ms = 20000;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    put(c, "/s/k", "0");
    rg_etcd_watch_req_t wr = {.key = "/s/", .prefix = true};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    put(c, "/s/k", "1");
    rg_etcd_event_t ev;
    ck_assert_int_eq(rg_etcd_watch_next(w, rg_deadline_in_ms(10000), &ev, NULL), RG_OK);
    ck_assert_str_eq(ev.kv.value, "1");
    int64_t rev = ev.kv.mod_revision;
    rg_etcd_event_cleanup(&ev);
    /* Both started on the first endpoint. */
    ck_assert_str_eq(rg_etcd_endpoint(c), cl->url[0]);
    ck_assert_int_eq(kill(cl->pid[0], SIGSTOP), 0);
    for (int i = 2; i < 5; i++) {
        snprintf(v, sizeof(v), "%d", i);
        uint64_t t0 = rg_now_ns();
        rg_status_t st = rg_etcd_put_str(c, "/s/k", v, 0, 0, NULL);
        double s = (double)(rg_now_ns() - t0) / 1e9;
        ck_assert_msg(st == RG_OK, "put with a silent member: %s", rg_last_error());
        /* 1 s for the silent member, an election if it led, on a loaded machine; half the
         * deadline (10 s) before. */
        ck_assert_msg(s < 6.0, "put %d took %.2f s with one member silent", i, s);
    }
    ck_assert_str_ne(rg_etcd_endpoint(c), cl->url[0]);
    /* A put whose answer did not come in time is tried at the next member, and the first
     * try may have been committed all the same (the leader's election outlasted it): each
     * value comes once or more, in order. The watch itself loses and repeats nothing: every
     * revision from the first put on, once. */
    rg_etcd_range_t r;
    ck_assert_int_eq(rg_etcd_range(c, &(rg_etcd_range_req_t){.key = "/s/k"}, 0, &r), RG_OK);
    int64_t last = r.revision;
    rg_etcd_range_cleanup(&r);
    ck_assert_int_le(last - rev, 12);   /* 3 puts, each tried at most 2 x 3 times */
    int want = 2;
    while (rev < last) {
        ck_assert_int_eq(rg_etcd_watch_next(w, rg_deadline_in_ms(10000), &ev, NULL), RG_OK);
        ck_assert_int_eq(ev.type, RG_ETCD_EVENT_PUT);
        ck_assert_int_eq(ev.kv.mod_revision, rev + 1);
        rev = ev.kv.mod_revision;
        int got = atoi(ev.kv.value);
        ck_assert_msg(got == want || got == want - 1, "revision %lld: value %s after %d",
                      (long long)rev, ev.kv.value, want - 1);
        want = got + 1;
        rg_etcd_event_cleanup(&ev);
    }
    ck_assert_int_eq(want, 5);
    ck_assert_int_eq(kill(cl->pid[0], SIGCONT), 0);
    rg_etcd_watch_destroy(w);
    rg_etcd_destroy(c);
    test_etcd_down(&cluster);
}
END_TEST

/* ---- auth ----------------------------------------------------------------------------- */

START_TEST(test_auth)
{
    rg_etcd_t *c;
    char *v;
    size_t len;

    /* Without credentials: refused, clearly. */
    rg_status_t st = rg_etcd_put_str(cli, "/a/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH || st == RG_EPERM, "%s: %s", rg_status_name(st),
                  rg_last_error());

    rg_etcd_params_t p = params_for(etcd.srv.endpoints);
    p.user = "root";
    p.password = "wrong";
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    st = rg_etcd_put_str(c, "/a/k", "v", 0, 0, NULL);
    ck_assert_int_eq(st, RG_EAUTH);
    ck_assert_msg(strstr(rg_last_error(), "authentication") != NULL, "%s", rg_last_error());
    rg_etcd_destroy(c);

    p.password = TEST_ETCD_PASSWORD;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(c, "/a/k", "v", 0, 0, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_get(c, "/a/k", 0, &v, &len, NULL), RG_OK);
    free(v);
    /* The watch authenticates on its own connection. */
    rg_etcd_watch_t *w;
    rg_etcd_watch_req_t wr = {.key = "/a/k"};
    ck_assert_int_eq(rg_etcd_watch_create(&p, &wr, 0, &w), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(c, "/a/k", "w", 0, 0, NULL), RG_OK);
    expect_event(w, RG_ETCD_EVENT_PUT, "/a/k", "w");
    rg_etcd_watch_destroy(w);
    rg_etcd_destroy(c);
}
END_TEST

Suite *etcd_suite(void);
Suite *etcd_faults_suite(void);

Suite *etcd_suite(void)
{
    Suite *s = suite_create("etcd");
    TCase *tc = tcase_create("kv");
    tcase_add_checked_fixture(tc, up, down);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_crud_and_prefix);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_txn_branches);
    tcase_add_test(tc, test_lease_expiry_and_keepalive);
    tcase_add_test(tc, test_watch_order_and_prev);
    tcase_add_test(tc, test_watch_next_deadlines);
    tcase_add_test(tc, test_stats_count_requests_and_events);
    tcase_add_test(tc, test_watch_survives_restart);
    tcase_add_test(tc, test_watch_compacted);
    tcase_add_test(tc, test_unreachable);
    suite_add_tcase(s, tc);
    TCase *tca = tcase_create("auth");
    tcase_add_checked_fixture(tca, up_auth, down);
    tcase_set_timeout(tca, 60);
    tcase_add_test(tca, test_auth);
    suite_add_tcase(s, tca);
    TCase *tcl = tcase_create("cluster");
    tcase_set_timeout(tcl, 90);
    tcase_add_test(tcl, test_cluster_failover);
    tcase_add_test(tcl, test_cluster_silent_member);
    suite_add_tcase(s, tcl);
    return s;
}

int main(void)
{
    return test_main("test_etcd", etcd_suite(), etcd_faults_suite(), NULL);
}
