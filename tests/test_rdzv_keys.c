/* rendezvous/rdzv_keys.h: the job's key layout and its records, without etcd. */
#include "rdzv_keys.h"

#include "test_util.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK_OK(expr) ck_assert_int_eq((expr), RG_OK)

static rdzv_keys_t job(const char *id)
{
    rdzv_keys_t k;
    CK_OK(rdzv_keys_init(&k, id));
    return k;
}

START_TEST(test_keys_layout)
{
    rdzv_keys_t k = job("job-1");
    char b[RDZV_KEY_MAX];

    ck_assert_str_eq(rdzv_keys_prefix(&k), "/regroup/job-1/");
    CK_OK(rdzv_keys_round(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/round");
    CK_OK(rdzv_keys_round_prefix(&k, 3, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/3/");
    CK_OK(rdzv_keys_nodes_prefix(&k, 3, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/3/nodes/");
    CK_OK(rdzv_keys_node(&k, 3, "h-12-0000abcd", b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/3/nodes/h-12-0000abcd");
    CK_OK(rdzv_keys_closed(&k, 3, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/3/closed");
    CK_OK(rdzv_keys_done_prefix(&k, 3, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/3/done/");
    CK_OK(rdzv_keys_done(&k, 3, "a", b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/3/done/a");
    CK_OK(rdzv_keys_comm_prefix(&k, 7, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/rounds/7/comm/");
    CK_OK(rdzv_keys_waiting_prefix(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/waiting/");
    CK_OK(rdzv_keys_waiting(&k, "a", b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/waiting/a");
    CK_OK(rdzv_keys_failures_prefix(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/failures/");
    CK_OK(rdzv_keys_failures_round_prefix(&k, 2, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/failures/2/");
    CK_OK(rdzv_keys_failure(&k, 2, "a", b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/failures/2/a");
    CK_OK(rdzv_keys_status_prefix(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/status/");
    CK_OK(rdzv_keys_progress_prefix(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/status/progress/");
    CK_OK(rdzv_keys_progress(&k, 5, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/status/progress/5");
    CK_OK(rdzv_keys_restored(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/status/restored");
    CK_OK(rdzv_keys_ckpt_latest(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/ckpt/latest");
    CK_OK(rdzv_keys_leaving_prefix(&k, 6, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/6/leaving/");
    CK_OK(rdzv_keys_leaving(&k, 6, "a", b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/rounds/6/leaving/a");
    CK_OK(rdzv_keys_restart(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/restart");
    CK_OK(rdzv_keys_layout(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/layout");
    char name[16];
    ck_assert(rdzv_rec_layout_decode(RDZV_LAYOUT, strlen(RDZV_LAYOUT), name, sizeof(name)));
    ck_assert_str_eq(name, RDZV_LAYOUT);
    ck_assert(!rdzv_rec_layout_decode("3", 1, name, sizeof(name)));
    ck_assert_str_eq(name, "3");
    ck_assert(!rdzv_rec_layout_decode(NULL, 0, name, sizeof(name)));   /* absent: layout 1 */
    ck_assert_str_eq(name, "1");
    CK_OK(rdzv_keys_workers_prefix(&k, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/");
    CK_OK(rdzv_keys_workers_round_prefix(&k, 7, b, sizeof(b)));
    ck_assert_str_eq(b, "/regroup/job-1/workers/rounds/7/");

    ck_assert_str_eq(rdzv_keys_tail("/regroup/job-1/waiting/a-1-00000000",
                                    "/regroup/job-1/waiting/"), "a-1-00000000");
    ck_assert_ptr_null(rdzv_keys_tail("/regroup/job-1/waiting/", "/regroup/job-1/waiting/"));
    ck_assert_ptr_null(rdzv_keys_tail("/regroup/job-12/waiting/a", "/regroup/job-1/"));
}
END_TEST

/* The agents watch [prefix, prefix "workers/"): every key they act on sorts before the end
 * (or an agent would miss it), every key workers write sorts after it (or every agent would
 * be sent it), with round and agent ids at their largest. */
static bool in_range(const char *key, const rdzv_range_t *r)
{
    return strcmp(key, r->key) >= 0 && strcmp(key, r->end) < 0;
}

/* Which of an agent's watches a key falls in: 'J' the job's two ranges, 'R' round r's own
 * records (every agent of the round), 'N' round r's nodes/ (its closer and running members
 * only), '-' none; checked against the builders with the largest rounds and ids. */
static char watched_by(const rdzv_keys_t *k, int64_t r, const char *key)
{
    rdzv_range_t job[2], own, all;
    CK_OK(rdzv_keys_watch_job(k, job));
    CK_OK(rdzv_keys_watch_round(k, r, false, &own));
    CK_OK(rdzv_keys_watch_round(k, r, true, &all));
    ck_assert(!(in_range(key, &job[0]) && in_range(key, &job[1])));
    if (in_range(key, &job[0]) || in_range(key, &job[1])) {
        ck_assert_msg(!in_range(key, &all), "%s", key);
        return 'J';
    }
    if (in_range(key, &own)) {
        ck_assert_msg(in_range(key, &all), "%s", key);
        return 'R';
    }
    return in_range(key, &all) ? 'N' : '-';
}

START_TEST(test_keys_agents_watch_theirs_only)
{
    rdzv_keys_t k = job("job-1");
    char b[RDZV_KEY_MAX];
    const char *big = "zzzz-4294967295-ffffffff";
    const int64_t rounds[] = {0, 1, 10, 19, RDZV_ROUND_MAX};
#define SEEN(what, call) do { CK_OK(call); ck_assert_msg(watched_by(&k, r, b) == (what), \
                                                         "%s: %c", b, watched_by(&k, r, b)); \
                         } while (0)
    for (size_t i = 0; i < sizeof(rounds) / sizeof(rounds[0]); i++) {
        int64_t r = rounds[i];
        SEEN('J', rdzv_keys_round(&k, b, sizeof(b)));
        SEEN('J', rdzv_keys_layout(&k, b, sizeof(b)));
        SEEN('J', rdzv_keys_restart(&k, b, sizeof(b)));
        SEEN('J', rdzv_keys_waiting(&k, big, b, sizeof(b)));
        SEEN('J', rdzv_keys_failure(&k, r, big, b, sizeof(b)));
        SEEN('R', rdzv_keys_closed(&k, r, b, sizeof(b)));
        SEEN('R', rdzv_keys_closer(&k, r, b, sizeof(b)));
        SEEN('R', rdzv_keys_done(&k, r, big, b, sizeof(b)));
        SEEN('R', rdzv_keys_leaving(&k, r, big, b, sizeof(b)));
        SEEN('N', rdzv_keys_node(&k, r, big, b, sizeof(b)));
        SEEN('N', rdzv_keys_node(&k, r, "", b, sizeof(b)));
        /* other rounds' keys, whose numbers share digits with r's */
        SEEN('-', rdzv_keys_node(&k, r * 10 + 1, big, b, sizeof(b)));
        SEEN('-', rdzv_keys_closed(&k, r + 1, b, sizeof(b)));
        if (r > 0) {
            SEEN('-', rdzv_keys_closed(&k, r / 10, b, sizeof(b)));
        }
        /* what workers write: no agent's */
        SEEN('-', rdzv_keys_progress(&k, 0, b, sizeof(b)));
        SEEN('-', rdzv_keys_restored(&k, b, sizeof(b)));
        SEEN('-', rdzv_keys_ckpt_latest(&k, b, sizeof(b)));
        SEEN('-', rdzv_keys_comm_prefix(&k, r, b, sizeof(b)));
        SEEN('-', rdzv_keys_workers_round_prefix(&k, r, b, sizeof(b)));
    }
#undef SEEN
}
END_TEST

START_TEST(test_keys_bounded)
{
    rdzv_keys_t k = job("job-1");
    char small[24];
    char exact[sizeof("/regroup/job-1/round")];
    char agent[600];

    /* One byte short of the key and its NUL: refused, and nothing usable left. */
    ck_assert_int_eq(rdzv_keys_round(&k, exact, sizeof(exact) - 1), RG_EINVAL);
    ck_assert_str_eq(exact, "");
    CK_OK(rdzv_keys_round(&k, exact, sizeof(exact)));
    ck_assert_str_eq(exact, "/regroup/job-1/round");
    ck_assert_int_eq(rdzv_keys_ckpt_latest(&k, small, sizeof(small)), RG_EINVAL);
    ck_assert_int_eq(rdzv_keys_round(&k, small, 4), RG_EINVAL);   /* shorter than the prefix */
    memset(agent, 'a', sizeof(agent) - 1);
    agent[sizeof(agent) - 1] = '\0';
    char b[RDZV_KEY_MAX];
    ck_assert_int_eq(rdzv_keys_node(&k, 1, agent, b, sizeof(b)), RG_EINVAL);
    ck_assert_int_eq(rdzv_keys_waiting(&k, agent, b, sizeof(b)), RG_EINVAL);
}
END_TEST

START_TEST(test_keys_job_ids)
{
    rdzv_keys_t k;
    char longest[RDZV_JOB_MAX + 2];

    ck_assert(rdzv_keys_job_id_ok("a.b_c-9"));
    ck_assert(!rdzv_keys_job_id_ok(""));
    ck_assert(!rdzv_keys_job_id_ok("a:b"));
    ck_assert(!rdzv_keys_job_id_ok(NULL));
    ck_assert_int_eq(rdzv_keys_init(&k, ""), RG_EINVAL);
    ck_assert_int_eq(rdzv_keys_init(&k, NULL), RG_EINVAL);
    ck_assert_int_eq(rdzv_keys_init(&k, "a/b"), RG_EINVAL);
    ck_assert_int_eq(rdzv_keys_init(&k, "a b"), RG_EINVAL);
    ck_assert_int_eq(rdzv_keys_init(&k, "a\nb"), RG_EINVAL);
    CK_OK(rdzv_keys_init(&k, "a:b"));   /* the layout takes it; the launcher does not */
    memset(longest, 'j', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    ck_assert_int_eq(rdzv_keys_init(&k, longest), RG_EINVAL);
    longest[RDZV_JOB_MAX] = '\0';
    CK_OK(rdzv_keys_init(&k, longest));
    char b[RDZV_KEY_MAX];
    CK_OK(rdzv_keys_ckpt_latest(&k, b, sizeof(b)));
}
END_TEST

START_TEST(test_agent_ids)
{
    char id[RG_RDZV_ID_MAX];
    char host[64];
    char longhost[200];
    pid_t pid = 0;

    rdzv_agent_id_make("my-host-7", 4321, 0xdeadbeef, id);
    ck_assert_str_eq(id, "my-host-7-4321-deadbeef");
    ck_assert(rdzv_agent_id_parse(id, host, sizeof(host), &pid));
    ck_assert_str_eq(host, "my-host-7");
    ck_assert_int_eq(pid, 4321);
    ck_assert(!rdzv_agent_id_parse(id, host, 4, &pid));   /* host does not fit */

    memset(longhost, 'h', sizeof(longhost) - 1);
    longhost[sizeof(longhost) - 1] = '\0';
    rdzv_agent_id_make(longhost, 99, 1, id);
    ck_assert(rdzv_agent_id_parse(id, NULL, 0, &pid));
    ck_assert_int_eq(pid, 99);

    const char *bad[] = {"", "h", "h-1", "h-1-123", "h-1-0000000g", "-1-00000000",
                         "h--00000000", "h-x-00000000", "h-0-00000000", "h-12345678901-00000000",
                         "h-1-00000000-", "h-1-000000000"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(!rdzv_agent_id_parse(bad[i], host, sizeof(host), &pid), "%s", bad[i]);
    }
}
END_TEST

START_TEST(test_numbers)
{
    char b[RDZV_NUM_MAX];
    int64_t x = -5;

    CK_OK(rdzv_rec_round_encode(12, b, sizeof(b)));
    ck_assert_str_eq(b, "12");
    CK_OK(rdzv_rec_round_decode(b, strlen(b), &x));
    ck_assert_int_eq(x, 12);
    CK_OK(rdzv_rec_ckpt_latest_encode(900000000123, b, sizeof(b)));
    CK_OK(rdzv_rec_ckpt_latest_decode(b, strlen(b), &x));
    ck_assert_int_eq(x, 900000000123);
    ck_assert_int_eq(rdzv_rec_round_encode(12345, b, 3), RG_EINVAL);
    /* Only the given bytes count: "12" out of "123". */
    CK_OK(rdzv_rec_round_decode("123", 2, &x));
    ck_assert_int_eq(x, 12);

    const char *bad[] = {"", "-1", "1x", " 1", "0x10", "99999999999999999999", "1.5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        x = 77;
        ck_assert_int_eq(rdzv_rec_ckpt_latest_decode(bad[i], strlen(bad[i]), &x), RG_EPROTO);
        ck_assert_int_eq(rdzv_rec_round_decode(bad[i], strlen(bad[i]), &x), RG_EPROTO);
        ck_assert_int_eq(x, 77);   /* untouched on error */
    }
    ck_assert_int_eq(rdzv_rec_round_decode("2000000000", 10, &x), RG_EPROTO);
    ck_assert_int_eq(rdzv_rec_round_decode("1\0", 2, &x), RG_EPROTO);
}
END_TEST

START_TEST(test_node_record)
{
    rdzv_node_rec_t n = {.agent = "h-1-00000001", .addr = "10.0.0.1", .nproc = 8,
                         .port = 29500, .prev_round = 4, .prev_rank = 2};
    rdzv_node_rec_t d;
    char *text;

    CK_OK(rdzv_rec_node_encode(&n, &text));
    CK_OK(rdzv_rec_node_decode(text, strlen(text), &d));
    ck_assert_str_eq(d.agent, n.agent);
    ck_assert_str_eq(d.addr, n.addr);
    ck_assert_int_eq(d.nproc, 8);
    ck_assert_int_eq(d.port, 29500);
    ck_assert_int_eq(d.prev_round, 4);
    ck_assert_int_eq(d.prev_rank, 2);
    ck_assert_int_eq(d.create_rev, 0);
    /* Every cut of a good record is refused. */
    for (size_t len = 0; len < strlen(text); len++) {
        ck_assert_int_eq(rdzv_rec_node_decode(text, len, &d), RG_EPROTO);
    }
    free(text);

    const char *bad[] = {
        "", "null", "[]", "{}", "not json",
        "{\"agent\":\"a\",\"addr\":\"x\",\"nproc\":-1,\"port\":1,\"prev_round\":-1,"
        "\"prev_rank\":-1}",
        "{\"agent\":\"a\",\"addr\":\"x\",\"nproc\":\"1\",\"port\":1,\"prev_round\":-1,"
        "\"prev_rank\":-1}",
        "{\"agent\":\"\",\"addr\":\"x\",\"nproc\":1,\"port\":1,\"prev_round\":-1,\"prev_rank\":-1}",
        "{\"agent\":\"a\",\"addr\":\"x\",\"nproc\":1,\"port\":70000,\"prev_round\":-1,"
        "\"prev_rank\":-1}",
        "{\"agent\":\"a\",\"addr\":\"x\",\"nproc\":1,\"port\":1,\"prev_round\":-1}",
        "{\"agent\":\"a\",\"agent\":\"b\",\"addr\":\"x\",\"nproc\":1,\"port\":1,"
        "\"prev_round\":-1,\"prev_rank\":-1}",
        "{\"agent\":\"a\\u0000b\",\"addr\":\"x\",\"nproc\":1,\"port\":1,\"prev_round\":-1,"
        "\"prev_rank\":-1}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(rdzv_rec_node_decode(bad[i], strlen(bad[i]), &d) == RG_EPROTO, "%s",
                      bad[i]);
    }
    /* A string longer than its field is refused, not cut. */
    char big[600];
    int w = snprintf(big, sizeof(big), "{\"agent\":\"%0*d\",\"addr\":\"x\",\"nproc\":1,"
                     "\"port\":1,\"prev_round\":-1,\"prev_rank\":-1}", RG_RDZV_ID_MAX, 0);
    ck_assert_int_eq(rdzv_rec_node_decode(big, (size_t)w, &d), RG_EPROTO);
}
END_TEST

START_TEST(test_waiting_record)
{
    rg_rdzv_member_t m = {.agent = "w-9-0000000f", .addr = "h9", .nproc = 2};
    rg_rdzv_member_t d;
    char *text;

    CK_OK(rdzv_rec_waiting_encode(&m, &text));
    ck_assert_str_eq(text, "{\"agent\":\"w-9-0000000f\",\"addr\":\"h9\",\"nproc\":2}");
    CK_OK(rdzv_rec_waiting_decode(text, strlen(text), &d));
    ck_assert_str_eq(d.agent, m.agent);
    ck_assert_str_eq(d.addr, "h9");
    ck_assert_int_eq(d.nproc, 2);
    ck_assert_int_eq(rdzv_rec_waiting_decode(text, strlen(text) - 1, &d), RG_EPROTO);
    free(text);
}
END_TEST

static rg_rdzv_assignment_t *three_members(void)
{
    rg_rdzv_assignment_t *a = calloc(1, sizeof(*a));
    ck_assert_ptr_nonnull(a);
    a->n_members = 3;
    const char *ids[] = {"host-a-100-00000001", "host-b-200-00000002", "host-a-300-00000003"};
    for (int i = 0; i < 3; i++) {
        snprintf(a->members[i].agent, RG_RDZV_ID_MAX, "%s", ids[i]);
        snprintf(a->members[i].addr, RG_RDZV_ADDR_MAX, "10.0.0.%d", i + 1);
        a->members[i].nproc = i + 1;
    }
    a->restart_count = 2;
    a->job_failed = true;
    snprintf(a->master_addr, sizeof(a->master_addr), "10.0.0.1");
    a->master_port = 29400;
    return a;
}

/* The closed record at the most the rendezvous takes: RG_RDZV_MAX_NODES members, each with
 * the longest agent id and the longest address rg_rdzv_create lets a node of such a job have,
 * and 4096 workers, fits one etcd request with room for the txn around it
 * (RDZV_CLOSED_MAX), and reads back as it was written. */
START_TEST(test_closed_record_at_the_maximum)
{
    rg_rdzv_assignment_t *a = calloc(1, sizeof(*a));
    rg_rdzv_assignment_t *d = calloc(1, sizeof(*d));
    char *text;
    size_t addr_len = rdzv_addr_max(RG_RDZV_MAX_NODES);
    ck_assert(a != NULL && d != NULL);
    ck_assert_uint_ge(addr_len, 200);   /* room for any host name a cloud gives */
    a->n_members = RG_RDZV_MAX_NODES;
    for (int i = 0; i < RG_RDZV_MAX_NODES; i++) {
        rg_rdzv_member_t *m = &a->members[i];
        char tail[32];
        int tl = snprintf(tail, sizeof(tail), "-%u-%08x", 4000000000u + (unsigned)i, (unsigned)i);
        memset(m->agent, 'h', RG_RDZV_ID_MAX - 1 - (size_t)tl);
        memcpy(m->agent + RG_RDZV_ID_MAX - 1 - tl, tail, (size_t)tl + 1);
        memset(m->addr, 'a', addr_len);
        m->addr[addr_len] = '\0';
        ck_assert(rdzv_addr_ok(m->addr, RG_RDZV_MAX_NODES));
        m->nproc = 4096;
    }
    memset(a->master_addr, 'a', RG_RDZV_ADDR_MAX - 1);
    a->master_port = 65535;
    a->restart_count = 1000000;
    a->excused_count = 1000000;
    CK_OK(rdzv_rec_closed_encode(a, 1764580000.5, &text));
    size_t len = strlen(text);
    ck_assert_msg(len <= RDZV_CLOSED_MAX, "%zu bytes", len);
    ck_assert_msg(len > RDZV_CLOSED_MAX - 64 * 1024, "%zu bytes: the bound is loose", len);
    CK_OK(rdzv_rec_closed_decode(text, len, 3, d));
    ck_assert_int_eq(d->n_members, RG_RDZV_MAX_NODES);
    ck_assert_int_eq(d->world_size, RG_RDZV_MAX_NODES * 4096);
    for (int i = 0; i < RG_RDZV_MAX_NODES; i++) {
        ck_assert_str_eq(d->members[i].agent, a->members[i].agent);
        ck_assert_str_eq(d->members[i].addr, a->members[i].addr);
    }
    free(text);
    free(d);
    free(a);
}
END_TEST

/* A node's address: what a host name or an IP address holds, and short enough for the closed
 * record of its job's most nodes. */
START_TEST(test_node_addresses)
{
    char longest[RG_RDZV_ADDR_MAX];
    ck_assert(rdzv_addr_ok("127.0.0.1", 2));
    ck_assert(rdzv_addr_ok("ip-10-0-0-1.ec2.internal", RG_RDZV_MAX_NODES));
    ck_assert(rdzv_addr_ok("[fe80::1%eth0]", 8));
    ck_assert(!rdzv_addr_ok("", 2));
    ck_assert(!rdzv_addr_ok(NULL, 2));
    ck_assert(!rdzv_addr_ok("a\"b", 2));
    ck_assert(!rdzv_addr_ok("a b", 2));
    ck_assert(!rdzv_addr_ok("a/b", 2));
    memset(longest, 'a', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    ck_assert_uint_eq(rdzv_addr_max(256), RG_RDZV_ADDR_MAX - 1);
    ck_assert(rdzv_addr_ok(longest, 256));
    ck_assert(!rdzv_addr_ok(longest, RG_RDZV_MAX_NODES));
    longest[rdzv_addr_max(RG_RDZV_MAX_NODES)] = '\0';
    ck_assert(rdzv_addr_ok(longest, RG_RDZV_MAX_NODES));
    ck_assert_uint_eq(rdzv_addr_max(1 << 20), 0);   /* nothing fits: every address refused */
}
END_TEST

/* done/ records carry the time the node finished; the older "1" still decodes. */
START_TEST(test_done_record)
{
    char buf[64];
    double t = 0;

    CK_OK(rdzv_rec_done_encode(1764580000.25, buf, sizeof(buf)));
    ck_assert_str_eq(buf, "{\"time\":1764580000.250}");
    CK_OK(rdzv_rec_done_decode(buf, strlen(buf), &t));
    ck_assert(t == 1764580000.25);
    CK_OK(rdzv_rec_done_decode("1", 1, &t));
    ck_assert(t == -1);
    ck_assert_int_eq(rdzv_rec_done_decode("2", 1, &t), RG_EPROTO);
    ck_assert_int_eq(rdzv_rec_done_decode("{}", 2, &t), RG_EPROTO);
    ck_assert_int_eq(rdzv_rec_done_decode("{\"time\":-3}", 11, &t), RG_EPROTO);
    ck_assert_int_eq(rdzv_rec_done_encode(1.0, buf, 8), RG_EINVAL);
}
END_TEST

START_TEST(test_closed_record)
{
    rg_rdzv_assignment_t *a = three_members();
    rg_rdzv_assignment_t *d = calloc(1, sizeof(*d));
    char *text;

    CK_OK(rdzv_rec_closed_encode(a, 1764580000.5, &text));
    CK_OK(rdzv_rec_closed_decode(text, strlen(text), 9, d));
    double t = 0;
    CK_OK(rdzv_rec_closed_time(text, strlen(text), &t));
    ck_assert(t == 1764580000.5);
    CK_OK(rdzv_rec_closed_time("{}", 2, &t));
    ck_assert(t == -1);
    ck_assert_int_eq(d->round, 9);
    ck_assert_int_eq(d->group_rank, -1);
    ck_assert_int_eq(d->n_members, 3);
    ck_assert_int_eq(d->group_world, 3);
    ck_assert_int_eq(d->world_size, 6);
    ck_assert_int_eq(d->restart_count, 2);
    ck_assert(d->job_failed);
    ck_assert(!d->job_done);
    ck_assert_str_eq(d->master_addr, "10.0.0.1");
    ck_assert_int_eq(d->master_port, 29400);
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(d->members[i].agent, a->members[i].agent);
        ck_assert_str_eq(d->members[i].addr, a->members[i].addr);
        ck_assert_int_eq(d->members[i].nproc, a->members[i].nproc);
    }
    rdzv_assignment_locate(d, "host-a-300-00000003");
    ck_assert_int_eq(d->group_rank, 2);
    ck_assert_int_eq(d->rank_offset, 3);
    rdzv_assignment_locate(d, "nobody");
    ck_assert_int_eq(d->group_rank, -1);
    ck_assert_int_eq(rdzv_assignment_find(d, "host-b-200-00000002"), 1);

    /* The chaos runner's question: is the agent with this pid a member? */
    ck_assert_int_eq(rdzv_assignment_find_pid(d, NULL, 300), 2);
    ck_assert_int_eq(rdzv_assignment_find_pid(d, "host-b", 200), 1);
    ck_assert_int_eq(rdzv_assignment_find_pid(d, "host-a", 200), -1);
    ck_assert_int_eq(rdzv_assignment_find_pid(d, NULL, 10), -1);   /* not a substring search */
    ck_assert_int_eq(rdzv_assignment_find_pid(d, NULL, 0), -1);

    for (size_t len = 0; len < strlen(text); len++) {
        ck_assert_int_eq(rdzv_rec_closed_decode(text, len, 9, d), RG_EPROTO);
        ck_assert_int_eq(d->n_members, 0);
    }
    free(text);

    const char *bad[] = {
        "{\"members\":[],\"restarts\":0,\"failed\":false,\"master_addr\":\"a\",\"master_port\":1}",
        "{\"members\":[{\"agent\":\"a\",\"addr\":\"b\"}],\"restarts\":0,\"failed\":false,"
        "\"master_addr\":\"a\",\"master_port\":1}",
        "{\"members\":[{\"agent\":\"a\",\"addr\":\"b\",\"nproc\":1}],\"restarts\":0,"
        "\"failed\":0,\"master_addr\":\"a\",\"master_port\":1}",
        "{\"members\":[{\"agent\":\"a\",\"addr\":\"b\",\"nproc\":1}],\"restarts\":-1,"
        "\"failed\":false,\"master_addr\":\"a\",\"master_port\":1}",
        "{\"members\":{},\"restarts\":0,\"failed\":false,\"master_addr\":\"a\",\"master_port\":1}",
        "{\"members\":[7],\"restarts\":0,\"failed\":false,\"master_addr\":\"a\",\"master_port\":1}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(rdzv_rec_closed_decode(bad[i], strlen(bad[i]), 1, d) == RG_EPROTO, "%s",
                      bad[i]);
    }
    a->n_members = 0;
    ck_assert_int_eq(rdzv_rec_closed_encode(a, 0, &text), RG_EINVAL);
    free(a);
    free(d);
}
END_TEST

START_TEST(test_failure_record)
{
    rdzv_failure_rec_t f = {.round = 3, .agent = "h-5-00000005", .addr = "10.1.1.1",
                            .rank = 7, .local_rank = 1, .exit_code = -1, .signal = 9,
                            .time = 1764580000.25, .error = "boom \"quoted\"\n",
                            .stderr_tail = "line 1\nline 2\n"};
    rdzv_failure_rec_t d;
    char *text;

    CK_OK(rdzv_rec_failure_encode(&f, &text));
    CK_OK(rdzv_rec_failure_decode(text, strlen(text), &d));
    ck_assert_int_eq(d.round, 3);
    ck_assert_str_eq(d.agent, f.agent);
    ck_assert_str_eq(d.addr, f.addr);
    ck_assert_int_eq(d.rank, 7);
    ck_assert_int_eq(d.local_rank, 1);
    ck_assert_int_eq(d.exit_code, -1);
    ck_assert_int_eq(d.signal, 9);
    ck_assert(fabs(d.time - f.time) < 1e-6);
    ck_assert_str_eq(d.error, f.error);
    ck_assert_str_eq(d.stderr_tail, f.stderr_tail);
    rdzv_rec_failure_cleanup(&d);
    rdzv_rec_failure_cleanup(&d);   /* twice is harmless */
    for (size_t len = 0; len < strlen(text); len++) {
        ck_assert_int_eq(rdzv_rec_failure_decode(text, len, &d), RG_EPROTO);
    }
    free(text);

    /* NULL strings are written as "". */
    f.error = NULL;
    f.stderr_tail = NULL;
    CK_OK(rdzv_rec_failure_encode(&f, &text));
    CK_OK(rdzv_rec_failure_decode(text, strlen(text), &d));
    ck_assert_str_eq(d.error, "");
    ck_assert_str_eq(d.stderr_tail, "");
    rdzv_rec_failure_cleanup(&d);
    free(text);

    const char *bad = "{\"round\":3,\"agent\":\"a\",\"addr\":\"b\",\"rank\":0,\"local_rank\":0,"
                      "\"exit_code\":1,\"signal\":0,\"time\":1,\"error\":5,\"stderr_tail\":\"\"}";
    ck_assert_int_eq(rdzv_rec_failure_decode(bad, strlen(bad), &d), RG_EPROTO);
}
END_TEST

START_TEST(test_progress_record)
{
    rdzv_progress_rec_t p = {.step = 1200, .epoch = 3, .round = 2, .time = 1764580000.125,
                             .n_metrics = 3};
    rdzv_progress_rec_t *d = calloc(1, sizeof(*d));
    char text[4096];

    snprintf(p.metrics[0].name, sizeof(p.metrics[0].name), "loss");
    p.metrics[0].value = 0.25;
    snprintf(p.metrics[1].name, sizeof(p.metrics[1].name), "acc.top-1");
    p.metrics[1].value = 91.5;
    snprintf(p.metrics[2].name, sizeof(p.metrics[2].name), "grad_norm");
    p.metrics[2].value = INFINITY;
    CK_OK(rdzv_rec_progress_encode(&p, text, sizeof(text)));
    ck_assert_str_eq(text, "{\"step\":1200,\"epoch\":3,\"round\":2,\"time\":1764580000.125,"
                           "\"metrics\":{\"loss\":0.25,\"acc.top-1\":91.5,\"grad_norm\":null}}");
    CK_OK(rdzv_rec_progress_decode(text, strlen(text), d));
    ck_assert_int_eq(d->step, 1200);
    ck_assert_int_eq(d->epoch, 3);
    ck_assert_int_eq(d->round, 2);
    ck_assert(fabs(d->time - p.time) < 1e-6);
    ck_assert_uint_eq(d->n_metrics, 3);
    ck_assert_str_eq(d->metrics[1].name, "acc.top-1");
    ck_assert(d->metrics[1].value == 91.5);
    ck_assert(isnan(d->metrics[2].value));
    ck_assert(!d->measured);
    for (size_t len = 0; len < strlen(text); len++) {
        ck_assert_int_eq(rdzv_rec_progress_decode(text, len, d), RG_EPROTO);
    }
    /* The straggler figures: said once measured, slow_s only while slow. */
    p.measured = true;
    p.compute = 0.8234;
    p.slow = 4.126;
    CK_OK(rdzv_rec_progress_encode(&p, text, sizeof(text)));
    ck_assert_msg(strstr(text, "null},\"compute\":0.823,\"slow\":4.13}") != NULL, "%s", text);
    p.slow_s = 12.04;
    CK_OK(rdzv_rec_progress_encode(&p, text, sizeof(text)));
    ck_assert_msg(strstr(text, ",\"compute\":0.823,\"slow\":4.13,\"slow_s\":12.0}") != NULL,
                  "%s", text);
    CK_OK(rdzv_rec_progress_decode(text, strlen(text), d));
    ck_assert(d->measured);
    ck_assert(fabs(d->compute - 0.823) < 1e-9 && fabs(d->slow - 4.13) < 1e-9 &&
              fabs(d->slow_s - 12.0) < 1e-9);
    p.compute = 1.5;   /* not a share: not said */
    CK_OK(rdzv_rec_progress_encode(&p, text, sizeof(text)));
    ck_assert_msg(strstr(text, "compute") == NULL, "%s", text);
    /* Too small a buffer, a bad name, too many metrics: refused. */
    ck_assert_int_eq(rdzv_rec_progress_encode(&p, text, 40), RG_EINVAL);
    snprintf(p.metrics[0].name, sizeof(p.metrics[0].name), "a\"b");
    ck_assert_int_eq(rdzv_rec_progress_encode(&p, text, sizeof(text)), RG_EINVAL);
    p.n_metrics = RDZV_PROGRESS_METRICS + 1;
    ck_assert_int_eq(rdzv_rec_progress_encode(&p, text, sizeof(text)), RG_EINVAL);

    /* Every metric at its longest still fits the 4 KiB record the worker API keeps. */
    p.n_metrics = RDZV_PROGRESS_METRICS;
    for (int i = 0; i < RDZV_PROGRESS_METRICS; i++) {
        memset(p.metrics[i].name, 'm', RDZV_METRIC_NAME_MAX);
        p.metrics[i].name[RDZV_METRIC_NAME_MAX] = '\0';
        p.metrics[i].name[0] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh"[i];
        p.metrics[i].value = -1.234567e-300;
    }
    p.compute = 0.999;
    p.slow = 1000;
    p.slow_s = 86400;
    CK_OK(rdzv_rec_progress_encode(&p, text, sizeof(text)));
    CK_OK(rdzv_rec_progress_decode(text, strlen(text), d));
    ck_assert_uint_eq(d->n_metrics, RDZV_PROGRESS_METRICS);

    const char *bad[] = {
        "{\"step\":-1,\"epoch\":0,\"round\":0,\"time\":1,\"metrics\":{}}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":\"1\",\"metrics\":{}}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":1}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":1,\"metrics\":{\"a b\":1}}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":1,\"metrics\":{\"a\":\"1\"}}",
        "{\"step\":1,\"epoch\":0,\"time\":1,\"metrics\":{}}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":1,\"metrics\":{},\"compute\":1.5}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":1,\"metrics\":{},\"compute\":0.5,"
        "\"slow\":-1}",
        "{\"step\":1,\"epoch\":0,\"round\":0,\"time\":1,\"metrics\":{},\"slow_s\":\"2\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(rdzv_rec_progress_decode(bad[i], strlen(bad[i]), d) == RG_EPROTO, "%s",
                      bad[i]);
    }
    free(d);
}
END_TEST

START_TEST(test_restored_record)
{
    rdzv_restored_rec_t r = {.round = 4, .step = 3000};
    rdzv_restored_rec_t d = {0};
    char text[64];

    CK_OK(rdzv_rec_restored_encode(&r, text, sizeof(text)));
    ck_assert_str_eq(text, "{\"round\":4,\"step\":3000}");
    CK_OK(rdzv_rec_restored_decode(text, strlen(text), &d));
    ck_assert_int_eq(d.round, 4);
    ck_assert_int_eq(d.step, 3000);
    ck_assert_int_eq(rdzv_rec_restored_encode(&r, text, 10), RG_EINVAL);
    for (size_t len = 0; len < strlen(text); len++) {
        ck_assert_int_eq(rdzv_rec_restored_decode(text, len, &d), RG_EPROTO);
    }
    const char *bad = "{\"round\":4,\"step\":\"3000\"}";
    ck_assert_int_eq(rdzv_rec_restored_decode(bad, strlen(bad), &d), RG_EPROTO);
}
END_TEST

START_TEST(test_leaving_record)
{
    rdzv_leaving_rec_t l = {.agent = "vm-12-0000abcd", .addr = "10.0.0.2",
                            .reason = "aws spot instance-action: terminate at "
                                      "2026-12-01T12:00:00Z",
                            .deadline = 1796126400.5, .time = 1796126280.25};
    rdzv_leaving_rec_t d;
    char *text = NULL;

    CK_OK(rdzv_rec_leaving_encode(&l, &text));
    CK_OK(rdzv_rec_leaving_decode(text, strlen(text), &d));
    ck_assert_str_eq(d.agent, l.agent);
    ck_assert_str_eq(d.addr, l.addr);
    ck_assert_str_eq(d.reason, l.reason);
    ck_assert(d.deadline == l.deadline && d.time == l.time);
    for (size_t len = 0; len < strlen(text); len++) {
        ck_assert_int_eq(rdzv_rec_leaving_decode(text, len, &d), RG_EPROTO);
    }
    free(text);
    l.deadline = NAN;
    ck_assert_int_eq(rdzv_rec_leaving_encode(&l, &text), RG_EINVAL);
    const char *bad[] = {
        "{\"agent\":\"\",\"addr\":\"a\",\"reason\":\"r\",\"deadline\":1,\"time\":1}",
        "{\"agent\":\"a\",\"addr\":\"a\",\"reason\":\"r\",\"deadline\":\"1\",\"time\":1}",
        "{\"agent\":\"a\",\"addr\":\"a\",\"reason\":7,\"deadline\":1,\"time\":1}",
        "{\"agent\":\"a\",\"addr\":\"a\",\"reason\":\"r\",\"deadline\":1}",
        "[\"agent\"]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(rdzv_rec_leaving_decode(bad[i], strlen(bad[i]), &d) == RG_EPROTO, "%s",
                      bad[i]);
    }
    /* a reason that does not fit is refused, not cut */
    char longr[300];
    memset(longr, 'x', sizeof(longr) - 1);
    longr[sizeof(longr) - 1] = '\0';
    char doc[600];
    snprintf(doc, sizeof(doc), "{\"agent\":\"a\",\"addr\":\"a\",\"reason\":\"%s\","
             "\"deadline\":1,\"time\":1}", longr);
    ck_assert_int_eq(rdzv_rec_leaving_decode(doc, strlen(doc), &d), RG_EPROTO);
}
END_TEST

/* ---- golden records in tests/data/rdzv/ ---------------------------------------------------- */

#ifndef RDZV_TEST_DATA
#error "RDZV_TEST_DATA must name tests/data/rdzv"
#endif

static size_t slurp(const char *name, char *buf, size_t cap)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", RDZV_TEST_DATA, name);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s", path);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    ck_assert_uint_lt(n, cap);
    return n;
}

/* Decodes a golden file with the decoder its name says. */
static rg_status_t decode_file(const char *name)
{
    static char v[1 << 16];
    static rg_rdzv_assignment_t a;
    static rdzv_progress_rec_t p;
    size_t n = slurp(name, v, sizeof(v));
    const char *kind = strncmp(name, "bad_", 4) == 0 ? name + 4 : name;
    rdzv_node_rec_t nd;
    rg_rdzv_member_t m;
    rdzv_failure_rec_t f;
    rdzv_restored_rec_t r;
    int64_t x;
    rg_status_t st;

    if (strncmp(kind, "node", 4) == 0) {
        return rdzv_rec_node_decode(v, n, &nd);
    } else if (strncmp(kind, "waiting", 7) == 0) {
        return rdzv_rec_waiting_decode(v, n, &m);
    } else if (strncmp(kind, "closed", 6) == 0) {
        return rdzv_rec_closed_decode(v, n, 1, &a);
    } else if (strncmp(kind, "failure", 7) == 0) {
        st = rdzv_rec_failure_decode(v, n, &f);
        rdzv_rec_failure_cleanup(&f);
        return st;
    } else if (strncmp(kind, "progress", 8) == 0) {
        return rdzv_rec_progress_decode(v, n, &p);
    } else if (strncmp(kind, "restored", 8) == 0) {
        return rdzv_rec_restored_decode(v, n, &r);
    } else if (strncmp(kind, "leaving", 7) == 0) {
        rdzv_leaving_rec_t l;
        return rdzv_rec_leaving_decode(v, n, &l);
    } else if (strncmp(kind, "round", 5) == 0) {
        return rdzv_rec_round_decode(v, n, &x);
    } else if (strncmp(kind, "latest", 6) == 0) {
        return rdzv_rec_ckpt_latest_decode(v, n, &x);
    }
    ck_abort_msg("%s: no decoder for this name", name);
    return RG_EINVAL;
}

START_TEST(test_golden_records)
{
    const char *good[] = {"node.json", "waiting.json", "closed.json", "failure.json",
                          "progress.json", "restored.json", "round.txt", "latest.txt",
                          "leaving.json"};
    const char *bad[] = {"bad_closed_cut.json", "bad_closed_nproc.json",
                         "bad_node_duplicate.json", "bad_progress_type.json",
                         "bad_restored_missing.json", "bad_round_space.txt",
                         "bad_leaving_deadline.json"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ck_assert_msg(decode_file(good[i]) == RG_OK, "%s: %s", good[i], rg_last_error());
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(decode_file(bad[i]) == RG_EPROTO, "%s decoded", bad[i]);
    }
    /* The golden failure record holds what the table shows. */
    char v[1024];
    size_t n = slurp("failure.json", v, sizeof(v));
    rdzv_failure_rec_t f;
    CK_OK(rdzv_rec_failure_decode(v, n, &f));
    ck_assert_str_eq(f.stderr_tail, "step 10\nstep 11\n");
    ck_assert_int_eq(f.signal, 9);
    rdzv_rec_failure_cleanup(&f);
}
END_TEST

static Suite *rdzv_keys_suite(void)
{
    Suite *s = suite_create("rdzv_keys");
    TCase *tk = tcase_create("keys");
    tcase_add_test(tk, test_keys_layout);
    tcase_add_test(tk, test_keys_agents_watch_theirs_only);
    tcase_add_test(tk, test_keys_bounded);
    tcase_add_test(tk, test_keys_job_ids);
    tcase_add_test(tk, test_agent_ids);
    suite_add_tcase(s, tk);
    TCase *tr = tcase_create("records");
    tcase_add_test(tr, test_numbers);
    tcase_add_test(tr, test_node_record);
    tcase_add_test(tr, test_waiting_record);
    tcase_add_test(tr, test_closed_record);
    tcase_add_test(tr, test_closed_record_at_the_maximum);
    tcase_add_test(tr, test_node_addresses);
    tcase_add_test(tr, test_done_record);
    tcase_add_test(tr, test_failure_record);
    tcase_add_test(tr, test_progress_record);
    tcase_add_test(tr, test_restored_record);
    tcase_add_test(tr, test_leaving_record);
    tcase_add_test(tr, test_golden_records);
    suite_add_tcase(s, tr);
    return s;
}

int main(void)
{
    return test_main("rdzv_keys", rdzv_keys_suite(), NULL);
}
