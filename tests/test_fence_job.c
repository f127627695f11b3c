/*
 * A member that lost its lease can do no harm, end to end, with rg-exact under two regroup
 * agents (--nnodes=1:2 --nproc-per-node=2, lease_ttl=2) on a real etcd:
 *  - one agent is stopped (SIGSTOP) past its lease TTL: the other regroups at world 2 and
 *    finishes with the exact result; after SIGCONT the stopped node's writes are refused
 *    (or its workers fenced themselves), and etcd's history of the job's keys holds no write
 *    made for a round that was no longer the job's;
 *  - one node is lost (its agent SIGKILLed, its workers with it) at --max-restarts=0: the
 *    survivor's workers fail on the reset connections, that failure is the loss's doing, so
 *    the job regroups at world 2 and finishes with the exact result;
 *  - one node is preempted (SIGTERM) at --max-restarts=0: the same;
 *  - a worker is stopped (SIGSTOP): its agent finds it hung by its heartbeat page and kills
 *    it, and the job restarts and finishes with the exact result.
 */
#include "rdzv_fence.h"
#include "rg_common.h"
#include "test_util.h"

#include <regroup/etcd.h>

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];
static char ckpt[300];
static test_etcd_t etcd;
static char stop_path[400];   /* the jobs' --stop-file */

static void setup(void)
{
    test_job_dirs(dir, sizeof(dir), ckpt, sizeof(ckpt), "fencejob");
    test_stop_path(dir, stop_path, sizeof(stop_path));
    setenv("REGROUP_LOG_LEVEL", "info", 1);   /* the agents' rounds, in their logs */
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
}

static void teardown(void)
{
    test_etcd_down(&etcd);
    test_rmtree(dir);
}

/* Two agents of job `id` with the lease TTL given (s); extra is one more option (may be
 * NULL). */
static void start_pair(const char *id, int lease_ttl, const char *extra, pid_t *a, pid_t *b)
{
    char ep[600];
    char rid[100];
    char conf[100];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(rid, sizeof(rid), "--rdzv-id=%s", id);
    snprintf(conf, sizeof(conf), "--rdzv-conf=last_call_timeout=1,lease_ttl=%d", lease_ttl);
    char *argv[] = {REGROUP_BIN, ep, rid, "--nnodes=1:2", "--nproc-per-node=2", conf,
                    extra ? (char *)extra : "--monitor-interval=0.1", RG_EXACT_BIN,
                    "--epochs", "20", "--work", "100000", "--stop-file", stop_path, NULL};
    *a = test_spawn_logged(dir, "a", argv);
    *b = test_spawn_logged(dir, "b", argv);
    /* Both in one round of world 4, with a checkpoint committed there. */
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "of 4,") && test_log_has(dir, "b", "of 4,"), 60000,
                    "the agents did not run a round of world 4 together");
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 0, 60000, "no committed checkpoint within 60 s");
}

/* etcd's history of the job's keys holds no write made for a round the job had left
 * (rdzv_fence_audit); returns how many writes it checked. */
static int check_no_stale_writes(const char *job)
{
    int stale = -1;
    int checked = 0;
    char first[512];
    ck_assert_msg(rdzv_fence_audit(&etcd.params, job, &stale, &checked, first,
                                   sizeof(first)) == RG_OK, "history: %s", rg_last_error());
    ck_assert_msg(stale == 0, "%d stale writes accepted; the first: %s", stale, first);
    return checked;
}

/* Up to max children of pid that run rg-exact (the workers of that agent, not its private
 * etcd) into pids; how many. */
static int workers_of(pid_t pid, pid_t *pids, int max)
{
    char path[96];
    long c;
    int found = 0;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    for (int k = 0; f != NULL && k < 64 && found < max && fscanf(f, "%ld", &c) == 1; k++) {
        char cmd[4096] = "";
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", c);
        FILE *g = fopen(path, "r");
        if (g != NULL) {
            size_t n = fread(cmd, 1, sizeof(cmd) - 1, g);
            cmd[n] = '\0';
            fclose(g);
        }
        if (strstr(cmd, "rg-exact") != NULL) {
            pids[found++] = (pid_t)c;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return found;
}

START_TEST(test_stopped_agent_is_fenced)
{
    pid_t a;
    pid_t b;

    start_pair("stopped", 2, NULL, &a, &b);
    /* (A round of world 2 from before: agent a's first round, when b came too late for it.
     * Seen as such, b was resumed before its lease ran out and never fenced.) */
    long from = test_log_size(dir, "a");
    long from_b = test_log_size(dir, "b");
    ck_assert_int_eq(kill(b, SIGSTOP), 0);
    /* Past its lease TTL the other agent regroups without it. */
    TEST_WAIT_UNTIL(test_log_has_after(dir, "a", from, "ranks 0..1 of 2,"), 60000,
                    "the running agent did not regroup at world 2");
    ck_assert_int_eq(kill(b, SIGCONT), 0);
    /* The resumed agent finds its membership gone: what it or its workers write for the
     * old round is refused, or the workers stopped on their own view of its heartbeat, or
     * the agent found its lease lost before it wrote anything (its keepalive's deadline
     * passed while it was stopped: seen under the sanitizers), or its first look at the
     * rendezvous found the round the others had opened and it stopped its workers (seen
     * most often on a fast machine). The audit below checks that no write of the old round
     * was accepted, whichever came first. */
    TEST_WAIT_UNTIL(test_log_has_after(dir, "b", from_b, "fenced: ") ||
                        test_log_has_after(dir, "b", from_b, "has not renewed its membership") ||
                        test_log_has_after(dir, "b", from_b, "this agent's lease was lost") ||
                        test_log_has_after(dir, "b", from_b,
                                           "ends: another agent opened a new round"),
                    30000, "the stopped node went on as if it were a member");
    test_end_training(dir);
    test_expect_exit(a, 180000, 0);
    (void)test_wait_exit(b, 180000);   /* it rejoins, or finds the job finished without it */
    ck_assert_msg(test_log_has(dir, "a", "exact=1"), "the job did not end with the exact result");
    ck_assert_int_gt(check_no_stale_writes("stopped"), 0);
}
END_TEST

/* Job id's keys under its prefix + rest (one key, or a prefix) into res. */
static void job_range(const char *id, const char *rest, bool prefix, rg_etcd_range_t *res)
{
    char key[200];
    snprintf(key, sizeof(key), "/regroup/%s/%s", id, rest);
    rg_etcd_t *c = NULL;
    ck_assert_int_eq(rg_etcd_create(&etcd.params, &c), RG_OK);
    rg_etcd_range_req_t req = {.key = key, .prefix = prefix};
    ck_assert_msg(rg_etcd_range(c, &req, rg_deadline_in_ms(5000), res) == RG_OK, "%s",
                  rg_last_error());
    rg_etcd_destroy(c);
}

/* The last committed checkpoint's step of job id (workers/ckpt/latest), or -1. */
static long latest_step(const char *id)
{
    rg_etcd_range_t res;
    long step = -1;
    job_range(id, "workers/ckpt/latest", false, &res);
    if (res.n_kvs == 1 && res.kvs[0].value_len < 32) {
        char v[32];
        memcpy(v, res.kvs[0].value, res.kvs[0].value_len);
        v[res.kvs[0].value_len] = '\0';
        step = strtol(v, NULL, 10);
    }
    rg_etcd_range_cleanup(&res);
    return step;
}

/* The lease of job id's one agent (its node key's), or 0. */
static int64_t agent_lease(const char *id)
{
    rg_etcd_range_t res;
    int64_t lease = 0;
    job_range(id, "rounds/", true, &res);
    for (size_t i = 0; i < res.n_kvs; i++) {
        if (strstr(res.kvs[i].key, "/nodes/") != NULL && res.kvs[i].lease != 0) {
            lease = res.kvs[i].lease;   /* (one agent: its node key in the running round) */
        }
    }
    rg_etcd_range_cleanup(&res);
    return lease;
}

/* In place, an agent whose lease is lost joins the next round with a new one while its
 * workers live: they fence their writes with the new lease from then on (the page's
 * assignment carries it). Before, they kept the lease of their environment: every
 * checkpoint commit and progress record was refused, and each refusal regrouped (40
 * regroups in 2 minutes, no checkpoint committed after the lease was replaced). */
START_TEST(test_inplace_agent_with_a_new_lease)
{
    char ep[600];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    char *argv[] = {REGROUP_BIN, ep, "--rdzv-id=newlease", "--nnodes=1", "--nproc-per-node=2",
                    "--rdzv-conf=lease_ttl=2", "--recovery=in-place", "--max-restarts=3",
                    RG_EXACT_BIN, "--epochs", "100000", "--work", "3000", "--ckpt-every", "5",
                    "--stop-file", stop_path, NULL};
    pid_t a = test_spawn_logged(dir, "a", argv);
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 0, 60000, "no committed checkpoint within 60 s");
    int64_t lease = agent_lease("newlease");
    ck_assert_msg(lease != 0, "the agent's node key has no lease");
    rg_etcd_t *c = NULL;
    ck_assert_int_eq(rg_etcd_create(&etcd.params, &c), RG_OK);
    ck_assert_msg(rg_etcd_lease_revoke(c, lease, rg_deadline_in_ms(5000)) == RG_OK, "%s",
                  rg_last_error());
    rg_etcd_destroy(c);
    long from = test_log_size(dir, "a");
    TEST_WAIT_UNTIL(test_log_has_after(dir, "a", from, "carry on in place"), 30000,
                    "the agent did not join the next round with its workers");
    /* Then checkpoints commit in that round (one every 5 steps). */
    long before = latest_step("newlease");
    TEST_WAIT_UNTIL(latest_step("newlease") > before + 10, 30000,
                    "no checkpoint committed after the agent's lease was replaced (the last "
                    "at step %ld)", before);
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1"), "the job did not end with the exact result");
    ck_assert_int_gt(check_no_stale_writes("newlease"), 0);
}
END_TEST

START_TEST(test_node_loss_not_counted)
{
    pid_t a;
    pid_t b;

    pid_t w[2];
    /* A TTL well beyond the time the survivor's workers take to fail, even under the
     * sanitizers (at 2 s its agent once found the node lost first: no failure to attribute). */
    start_pair("lost", 6, "--max-restarts=0", &a, &b);
    ck_assert_int_eq(workers_of(b, w, 2), 2);
    long from = test_log_size(dir, "a");
    /* The whole node at once: its agent, then its workers (they would die with it by
     * PDEATHSIG; killing them too makes the others' workers fail at once, well before the
     * lost agent's lease ends, which is the case to attribute). */
    ck_assert_int_eq(kill(b, SIGKILL), 0);
    kill(w[0], SIGKILL);
    kill(w[1], SIGKILL);
    test_expect_exit(b, 10000, 128 + SIGKILL);
    TEST_WAIT_UNTIL(test_log_has_after(dir, "a", from, "ranks 0..1 of 2,"), 60000,
                    "the survivor did not regroup at world 2");
    test_end_training(dir);
    test_expect_exit(a, 180000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=2"),
                  "the job did not finish exactly at world 2");
    ck_assert_msg(test_log_has(dir, "a", "worker rank"), "the survivor's workers did not fail");
    ck_assert_msg(test_log_has(dir, "a", "not counted"),
                  "the failure was not attributed to the loss");
    ck_assert_int_gt(check_no_stale_writes("lost"), 0);
    /* `regroup status` says so too. */
    char ep[600];
    char path[400];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    char *status_argv[] = {REGROUP_BIN, "status", ep, "--rdzv-id=lost", NULL};
    test_log_path(dir, "status", path, sizeof(path));
    ck_assert_int_eq(test_run(status_argv, path, 30000), 0);
    ck_assert_msg(test_log_has(dir, "status", "not counted: 1 worker failure"),
                  "regroup status does not say the failure was not counted");
}
END_TEST

/* A preempted node (SIGTERM: its agent stops its workers and revokes its lease) at
 * --max-restarts=0: whatever the survivor's workers do on the closed connections, the job
 * goes on at world 2 and finishes exactly. */
START_TEST(test_preemption_not_counted)
{
    pid_t a;
    pid_t b;

    start_pair("preempted", 2, "--max-restarts=0", &a, &b);
    long from = test_log_size(dir, "a");
    ck_assert_int_eq(kill(b, SIGTERM), 0);
    test_expect_exit(b, 30000, 128 + SIGTERM);
    TEST_WAIT_UNTIL(test_log_has_after(dir, "a", from, "ranks 0..1 of 2,"), 60000,
                    "the survivor did not regroup at world 2");
    test_end_training(dir);
    test_expect_exit(a, 180000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=2"),
                  "the job did not finish exactly at world 2");
    ck_assert_int_gt(check_no_stale_writes("preempted"), 0);
}
END_TEST

START_TEST(test_stopped_worker_found_hung)
{
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
                    RG_EXACT_BIN, "--epochs", "20", "--work", "100000", "--stop-file",
                    stop_path, NULL};
    /* Far beyond the hang timeout: only the heartbeat can find the stopped worker. */
    setenv("REGROUP_COMM_TIMEOUT_MS", "120000", 1);
    pid_t pid = test_spawn_logged(dir, "job", argv);
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 0, 60000, "no committed checkpoint within 60 s");
    pid_t w = -1;
    TEST_WAIT_UNTIL(workers_of(pid, &w, 1) == 1, 10000, "no worker found");
    ck_assert_int_eq(kill(w, SIGSTOP), 0);
    test_wait_log(dir, "job", "is hung: no heartbeat", 60000);
    test_end_training(dir);
    test_expect_exit(pid, 120000, 0);
    ck_assert_msg(test_log_has(dir, "job", "is hung: no heartbeat"), "the hang was not found");
    ck_assert_msg(test_log_has(dir, "job", "exact=1"), "the job did not end with the exact result");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fence_job");
    TCase *tc = tcase_create("job");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_stopped_agent_is_fenced);
    tcase_add_test(tc, test_inplace_agent_with_a_new_lease);
    tcase_add_test(tc, test_node_loss_not_counted);
    tcase_add_test(tc, test_preemption_not_counted);
    tcase_add_test(tc, test_stopped_worker_found_hung);
    suite_add_tcase(s, tc);
    return test_main("test_fence_job", s, NULL);
}
