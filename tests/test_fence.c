/*
 * Fencing against a real etcd (rendezvous/rdzv_fence.h): every write made on behalf of the
 * job by a member that is no longer in the job's round (the round moved on, or its agent's
 * lease is gone) is refused with RG_ELEASE and leaves the job's keys as they were: progress,
 * the checkpoint commit (its MANIFEST and workers/ckpt/latest), the rank's report through the worker
 * API, an agent's failure marker, its move to the next round and its request to restart
 * the job. And the audit of etcd's
 * history finds a write that was not fenced.
 */
#include "rdzv_fence.h"
#include "rg_common.h"
#include "test_util.h"

#include <regroup/ckpt.h>
#include <regroup/rdzv.h>
#include <regroup/train.h>

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOB   "fencejob"
#define AGENT "node-1-0000abcd"

static test_etcd_t etcd;
static rg_etcd_t *cli;
static rdzv_keys_t keys;
static char dir[256];

static void up(void)
{
    test_etcd_opts_t o = {.extra_flags = TEST_ETCD_FAST};
    test_etcd_up(&etcd, &o);
    ck_assert(rg_etcd_create(&etcd.params, &cli) == RG_OK);
    ck_assert(rdzv_keys_init(&keys, JOB) == RG_OK);
    test_tmpdir(dir, sizeof(dir), "fence");
}

static void down(void)
{
    rg_etcd_destroy(cli);
    cli = NULL;
    test_etcd_down(&etcd);
    test_rmtree(dir);
}

static void put_round(int r)
{
    char k[RDZV_KEY_MAX];
    char v[RDZV_NUM_MAX];
    ck_assert(rdzv_keys_round(&keys, k, sizeof(k)) == RG_OK);
    ck_assert(rdzv_rec_round_encode(r, v, sizeof(v)) == RG_OK);
    ck_assert(rg_etcd_put_str(cli, k, v, 0, 0, NULL) == RG_OK);
}

/* A member: its node key in round r under a fresh lease (returned). */
static int64_t put_member(int r, const char *agent)
{
    char k[RDZV_KEY_MAX];
    int64_t lease = 0;
    ck_assert(rg_etcd_lease_grant(cli, 30, 0, &lease, NULL) == RG_OK);
    ck_assert(rdzv_keys_node(&keys, r, agent, k, sizeof(k)) == RG_OK);
    ck_assert(rg_etcd_put_str(cli, k, "{}", lease, 0, NULL) == RG_OK);
    return lease;
}

/* The value of key, or "" if absent. */
static void get_value(const char *key, char *out, size_t cap)
{
    char *v = NULL;
    size_t len = 0;
    out[0] = '\0';
    if (rg_etcd_get(cli, key, 0, &v, &len, NULL) == RG_OK) {
        snprintf(out, cap, "%.*s", (int)len, v);
    }
    free(v);
}

/* Whether key's value holds text. */
static bool value_has(const char *key, const char *text)
{
    char got[512];
    get_value(key, got, sizeof(got));
    return strstr(got, text) != NULL;
}

START_TEST(fenced_put_refused_when_stale)
{
    char key[RDZV_KEY_MAX];
    char got[256];
    rdzv_fence_t f;

    put_round(3);
    int64_t lease = put_member(3, AGENT);
    ck_assert(rdzv_keys_progress(&keys, 0, key, sizeof(key)) == RG_OK);

    ck_assert(rdzv_fence_init(&f, &keys, 3, AGENT, lease) == RG_OK);
    ck_assert_msg(rdzv_fence_put(cli, &f, key, "current", 0, 0, "progress") == RG_OK, "%s",
                  rg_last_error());
    get_value(key, got, sizeof(got));
    ck_assert_str_eq(got, "current");

    /* A writer of an older round. */
    ck_assert(rdzv_fence_init(&f, &keys, 2, AGENT, lease) == RG_OK);
    ck_assert_int_eq(rdzv_fence_put(cli, &f, key, "stale", 0, 0, "progress"), RG_ELEASE);
    ck_assert_msg(strstr(rg_last_error(), "round 2") != NULL, "%s", rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), "round 3 now") != NULL, "%s", rg_last_error());
    /* A lease that is not the one the node key holds. */
    ck_assert(rdzv_fence_init(&f, &keys, 3, AGENT, lease + 1) == RG_OK);
    ck_assert_int_eq(rdzv_fence_put(cli, &f, key, "stale", 0, 0, "progress"), RG_ELEASE);
    /* The job moved on. */
    put_round(4);
    ck_assert(rdzv_fence_init(&f, &keys, 3, AGENT, lease) == RG_OK);
    ck_assert_int_eq(rdzv_fence_put(cli, &f, key, "stale", 0, 0, "progress"), RG_ELEASE);
    /* The agent's lease ended (expired or revoked): its node key went with it. */
    put_round(3);
    ck_assert(rg_etcd_lease_revoke(cli, lease, 0) == RG_OK);
    ck_assert_int_eq(rdzv_fence_put(cli, &f, key, "stale", 0, 0, "progress"), RG_ELEASE);
    ck_assert_msg(strstr(rg_last_error(), "is gone") != NULL, "%s", rg_last_error());
    get_value(key, got, sizeof(got));
    ck_assert_str_eq(got, "current");
    /* Without a fence (a program not under an agent) a put is plain. */
    f = (rdzv_fence_t){.on = false};
    ck_assert(rdzv_fence_put(cli, &f, key, "plain", 0, 0, "progress") == RG_OK);
    get_value(key, got, sizeof(got));
    ck_assert_str_eq(got, "plain");
}
END_TEST

static rg_status_t save_step(rg_ckpt_t *ck, int64_t step)
{
    float x[4] = {1, 2, 3, (float)step};
    rg_ckpt_tensor_t t = {.name = "x", .dtype = RG_DTYPE_F32, .ndim = 1, .shape = {4},
                          .row_begin = 0, .row_count = 4, .data = x};
    rg_ckpt_save_t *s = NULL;
    rg_status_t st = rg_ckpt_save(ck, step, &t, 1, 0, &s);
    if (st != RG_OK) {
        return st;
    }
    st = rg_ckpt_save_wait(s, RG_DEADLINE_DEFAULT);
    rg_ckpt_save_release(s);
    return st;
}

static bool step_listed(const char *root, int64_t step)
{
    int64_t *steps = NULL;
    size_t n = 0;
    bool found = false;
    ck_assert(rg_ckpt_list(root, &steps, &n) == RG_OK);
    for (size_t i = 0; i < n; i++) {
        found = found || steps[i] == step;
    }
    free(steps);
    return found;
}

START_TEST(fenced_checkpoint_commit)
{
    char root[300];
    char latest[RDZV_KEY_MAX];
    char got[64];
    rg_ckpt_t *ck = NULL;

    snprintf(root, sizeof(root), "%s/ckpt", dir);
    put_round(1);
    int64_t lease = put_member(1, AGENT);
    rg_ckpt_params_t p = {.root = root, .rank = 0, .world_size = 1, .etcd = cli, .job = JOB,
                          .attempt = 2, .fence_agent = AGENT, .fence_lease = lease,
                          .fence_round = 1};
    ck_assert_msg(rg_ckpt_create(&p, &ck) == RG_OK, "%s", rg_last_error());
    ck_assert(rdzv_keys_ckpt_latest(&keys, latest, sizeof(latest)) == RG_OK);

    ck_assert_msg(save_step(ck, 10) == RG_OK, "%s", rg_last_error());
    get_value(latest, got, sizeof(got));
    ck_assert_str_eq(got, "10");
    ck_assert(step_listed(root, 10));

    /* The others regrouped without this member: its next commit is refused, on disk too. */
    put_round(2);
    ck_assert_int_eq(save_step(ck, 20), RG_ELEASE);
    get_value(latest, got, sizeof(got));
    ck_assert_str_eq(got, "10");
    ck_assert(!step_listed(root, 20));

    /* Its lease gone while the round stands. */
    put_round(1);
    ck_assert(rg_etcd_lease_revoke(cli, lease, 0) == RG_OK);
    ck_assert_int_eq(save_step(ck, 30), RG_ELEASE);
    get_value(latest, got, sizeof(got));
    ck_assert_str_eq(got, "10");
    ck_assert(!step_listed(root, 30));
    rg_ckpt_destroy(ck);
}
END_TEST

/* The worker API in this process, as one rank of a 1-rank job whose agent is AGENT. */
static void worker_env(int round, int64_t lease, const char *ckpt_root)
{
    char v[64];
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    snprintf(v, sizeof(v), "%d", round);
    setenv("REGROUP_ROUND", v, 1);
    setenv("REGROUP_JOB_ID", JOB, 1);
    setenv("REGROUP_ETCD_ENDPOINTS", etcd.srv.endpoints, 1);
    setenv("REGROUP_AGENT_ID", AGENT, 1);
    snprintf(v, sizeof(v), "%lld", (long long)lease);
    setenv("REGROUP_AGENT_LEASE", v, 1);
    setenv("REGROUP_CKPT_DIR", ckpt_root, 1);
}

/* A worker of AGENT, a member of `round`, whose state is one tensor of two floats. */
typedef struct {
    char             root[300];
    float            w[2];
    rg_ckpt_tensor_t t;
    rg_train_state_t state;
} one_tensor_worker_t;

static void one_tensor_worker(one_tensor_worker_t *o, int round)
{
    snprintf(o->root, sizeof(o->root), "%s/ckpt", dir);
    o->w[0] = 1;
    o->w[1] = 2;
    o->t = (rg_ckpt_tensor_t){.name = "w", .dtype = RG_DTYPE_F32, .ndim = 1, .shape = {2},
                              .row_begin = 0, .row_count = 2, .data = o->w};
    o->state = (rg_train_state_t){.tensors = &o->t, .n_tensors = 1};
    put_round(round);
    int64_t lease = put_member(round, AGENT);
    worker_env(round, lease, o->root);
}

START_TEST(fenced_report)
{
    char pkey[RDZV_KEY_MAX];
    char latest[RDZV_KEY_MAX];
    char got[512];
    rg_train_ctx_t *ctx = NULL;
    one_tensor_worker_t o;
    const char *root = o.root;
    rg_report_t rep = {.step = 1};

    one_tensor_worker(&o, 5);
    ck_assert_msg(rg_train_init(NULL, &ctx) == RG_OK, "%s", rg_last_error());
    ck_assert(rdzv_keys_progress(&keys, 0, pkey, sizeof(pkey)) == RG_OK);
    ck_assert(rdzv_keys_ckpt_latest(&keys, latest, sizeof(latest)) == RG_OK);

    ck_assert_msg(rg_report(ctx, &rep, &o.state) == RG_OK, "%s", rg_last_error());
    /* The checkpoint of step 1 lands in the background, then its workers/ckpt/latest record (both
     * before the job moves on: a record written after round 6 is refused, as it should be). */
    TEST_WAIT_UNTIL(step_listed(root, 1), 10000, "step 1 committed");
    TEST_WAIT_UNTIL(value_has(latest, "1"), 10000, "workers/ckpt/latest does not record step 1");
    get_value(pkey, got, sizeof(got));
    ck_assert_msg(strstr(got, "\"step\":1") != NULL, "%s", got);

    /* The job regroups without this node: the rank's next report is refused, and neither its
     * progress nor a checkpoint of its reaches the job. */
    put_round(6);
    rep.step = 2;
    ck_assert_int_eq(rg_report(ctx, &rep, &o.state), RG_ELEASE);
    ck_assert_msg(strstr(rg_last_error(), "round 5") != NULL, "%s", rg_last_error());
    get_value(pkey, got, sizeof(got));
    ck_assert_msg(strstr(got, "\"step\":1") != NULL, "%s", got);
    get_value(latest, got, sizeof(got));
    ck_assert_str_eq(got, "1");
    ck_assert(!step_listed(root, 2));
    rg_train_finalize(ctx);
}
END_TEST

/* rg_train_ckpt_wait returns once the checkpoint rg_report started has landed; one whose
 * commit comes after the job moved to a newer round (REGROUP_CKPT_SLOW_COMMIT holds it back
 * 1.5 s) is refused, and the wait says so (this worker is not in place: the failure itself). */
START_TEST(ckpt_wait_sees_the_commit)
{
    rg_train_ctx_t *ctx = NULL;
    one_tensor_worker_t o;
    const char *root = o.root;
    rg_report_t rep = {.step = 1};

    one_tensor_worker(&o, 5);
    setenv("REGROUP_CKPT_SLOW_COMMIT", "2:1500", 1);
    ck_assert_int_eq(rg_train_ckpt_wait(NULL), RG_EINVAL);
    ck_assert_msg(rg_train_init(NULL, &ctx) == RG_OK, "%s", rg_last_error());
    ck_assert_msg(rg_train_ckpt_wait(ctx) == RG_OK, "%s", rg_last_error());   /* none yet */

    ck_assert_msg(rg_report(ctx, &rep, &o.state) == RG_OK, "%s", rg_last_error());
    ck_assert_msg(rg_train_ckpt_wait(ctx) == RG_OK, "%s", rg_last_error());
    ck_assert(step_listed(root, 1));   /* committed when the wait returned */

    rep.step = 2;
    ck_assert_msg(rg_report(ctx, &rep, &o.state) == RG_OK, "%s", rg_last_error());
    put_round(6);   /* the job moves on while step 2 waits to commit */
    ck_assert_int_eq(rg_train_ckpt_wait(ctx), RG_ELEASE);
    ck_assert_msg(strstr(rg_last_error(), "fenced") != NULL, "%s", rg_last_error());
    ck_assert(!step_listed(root, 2));
    rg_train_finalize(ctx);
    unsetenv("REGROUP_CKPT_SLOW_COMMIT");
}
END_TEST

/* rg_report never waits on etcd for its progress record: with etcd stopped (SIGSTOP: no
 * answer at all, for the client's 5 s timeout) the call returns at once, and the record lands
 * once etcd answers again. Before, the record was written on the step's path. */
START_TEST(report_never_waits_on_etcd)
{
    char root[300];
    char pkey[RDZV_KEY_MAX];
    rg_train_ctx_t *ctx = NULL;
    rg_report_t rep = {.step = 1};

    snprintf(root, sizeof(root), "%s/ckpt", dir);
    put_round(5);
    worker_env(5, put_member(5, AGENT), root);
    ck_assert_msg(rg_train_init(NULL, &ctx) == RG_OK, "%s", rg_last_error());
    ck_assert(rdzv_keys_progress(&keys, 0, pkey, sizeof(pkey)) == RG_OK);
    ck_assert_int_eq(kill(etcd.srv.pid[0], SIGSTOP), 0);
    uint64_t t0 = rg_now_ns();
    rg_status_t st = rg_report(ctx, &rep, NULL);   /* the first report publishes */
    double took = (double)(rg_now_ns() - t0) / 1e9;
    ck_assert_int_eq(kill(etcd.srv.pid[0], SIGCONT), 0);
    ck_assert_msg(st == RG_OK, "%s", rg_last_error());
    ck_assert_msg(took < 2.0, "rg_report took %.1f s with etcd stopped", took);
    TEST_WAIT_UNTIL(value_has(pkey, "\"step\":1"), 15000, "the progress record never landed");
    rg_train_finalize(ctx);
}
END_TEST

/* An agent's own writes: a marker and the next round, once its lease is gone. */
START_TEST(fenced_agent_writes)
{
    rg_rdzv_params_t p = {.etcd = etcd.params, .job = JOB, .addr = "127.0.0.1", .nproc = 1,
                          .min_nodes = 1, .max_nodes = 1, .lease_ttl_s = 5,
                          .last_call_ms = 100, .join_timeout_ms = 20000, .max_restarts = 3};
    rg_rdzv_t *z = NULL;
    rg_rdzv_assignment_t a;
    char fail_prefix[RDZV_KEY_MAX];
    char rkey[RDZV_KEY_MAX];
    char got[64];
    rg_etcd_range_t res;

    ck_assert(rg_rdzv_create(&p, &z) == RG_OK);
    ck_assert_msg(rg_rdzv_join(z, -1, &a) == RG_OK, "%s", rg_last_error());
    ck_assert(rdzv_keys_failures_prefix(&keys, fail_prefix, sizeof(fail_prefix)) == RG_OK);
    ck_assert(rdzv_keys_round(&keys, rkey, sizeof(rkey)) == RG_OK);

    /* Another member of the round, alive. */
    int64_t other = put_member(a.round, "node-2-0000beef");
    /* Its lease ends behind its back (what an expiry does while it is stopped). */
    ck_assert(rg_etcd_lease_revoke(cli, rg_rdzv_lease_id(z), 0) == RG_OK);
    rg_rdzv_failure_t f = {.rank = 0, .exit_code = 1, .error = "boom"};
    ck_assert_int_eq(rg_rdzv_report_failure(z, &f), RG_ELEASE);
    ck_assert_msg(strstr(rg_last_error(), "failure marker") != NULL, "%s", rg_last_error());
    rg_etcd_range_req_t q = {.key = fail_prefix, .prefix = true, .count_only = true};
    ck_assert(rg_etcd_range(cli, &q, 0, &res) == RG_OK);
    ck_assert_int_eq(res.count, 0);
    rg_etcd_range_cleanup(&res);
    ck_assert_int_eq(rg_rdzv_next_round(z), RG_ELEASE);
    get_value(rkey, got, sizeof(got));
    ck_assert_int_eq(atoi(got), a.round);
    ck_assert_int_eq(rg_rdzv_done(z), RG_ELEASE);
    /* Nor may it restart the job the others run (chaos' partition in place: the node cut
     * off past its lease asked it once back, and every survivor restarted). */
    char restart_key[RDZV_KEY_MAX];
    ck_assert(rdzv_keys_restart(&keys, restart_key, sizeof(restart_key)) == RG_OK);
    ck_assert_int_eq(rg_rdzv_request_restart(z, "a worker could not recover in place"),
                     RG_ELEASE);
    ck_assert_msg(strstr(rg_last_error(), "restart") != NULL, "%s", rg_last_error());
    get_value(restart_key, got, sizeof(got));
    ck_assert_str_eq(got, "");
    get_value(rkey, got, sizeof(got));
    ck_assert_int_eq(atoi(got), a.round);
    /* Once no member of the round is left (the other's lease ended too), the round is dead:
     * a former member may move the job on, or nobody could. */
    ck_assert(rg_etcd_lease_revoke(cli, other, 0) == RG_OK);
    ck_assert_msg(rg_rdzv_next_round(z) == RG_OK, "%s", rg_last_error());
    get_value(rkey, got, sizeof(got));
    ck_assert_int_eq(atoi(got), a.round + 1);
    rg_rdzv_destroy(z);
}
END_TEST

/* The audit finds a write made for a round the job had left (here, an unfenced one). */
START_TEST(audit_finds_stale_write)
{
    char key[RDZV_KEY_MAX];
    char fkey[RDZV_KEY_MAX];
    char first[512];
    int stale = -1;
    int checked = -1;
    rdzv_progress_rec_t p = {.step = 4, .round = 1, .time = 1.0};
    char val[512];

    ck_assert(rdzv_keys_progress(&keys, 0, key, sizeof(key)) == RG_OK);
    ck_assert(rdzv_keys_failure(&keys, 1, AGENT, fkey, sizeof(fkey)) == RG_OK);
    ck_assert(rdzv_rec_progress_encode(&p, val, sizeof(val)) == RG_OK);
    put_round(1);
    ck_assert(rg_etcd_put_str(cli, key, val, 0, 0, NULL) == RG_OK);
    ck_assert(rg_etcd_put_str(cli, fkey, "{}", 0, 0, NULL) == RG_OK);
    ck_assert(rdzv_fence_audit(&etcd.params, JOB, &stale, &checked, first, sizeof(first)) ==
              RG_OK);
    ck_assert_int_eq(stale, 0);
    ck_assert_int_eq(checked, 2);
    put_round(2);
    ck_assert(rg_etcd_put_str(cli, key, val, 0, 0, NULL) == RG_OK);   /* round 1's, late */
    ck_assert(rdzv_fence_audit(&etcd.params, JOB, &stale, &checked, first, sizeof(first)) ==
              RG_OK);
    ck_assert_int_eq(stale, 1);
    ck_assert_int_eq(checked, 3);
    ck_assert_msg(strstr(first, "round 1 while the job was at round 2") != NULL, "%s", first);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fence");
    TCase *tc = tcase_create("etcd");
    tcase_add_checked_fixture(tc, up, down);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fenced_put_refused_when_stale);
    tcase_add_test(tc, fenced_checkpoint_commit);
    tcase_add_test(tc, fenced_report);
    tcase_add_test(tc, ckpt_wait_sees_the_commit);
    tcase_add_test(tc, report_never_waits_on_etcd);
    tcase_add_test(tc, fenced_agent_writes);
    tcase_add_test(tc, audit_finds_stale_write);
    suite_add_tcase(s, tc);
    return test_main("fence", s, NULL);
}
