/*
 * `regroup --health-check` through real agents, workers, etcd and UCX (train_health.c).
 *
 * - passes: three workers of one node; the check runs at the job's start, measures, names
 *   nobody (one node: no network to judge) and the job trains exactly (label c: under the
 *   sanitizers too).
 * - a slow node: three nodes in network namespaces of their own, over tcp on their veths;
 *   node c's link is limited to 200 Mbit/s each way (tc's token bucket). c joins the running
 *   job in place; the check of that round names c's rank, c's agent leaves as a preempted
 *   one does, and a and b go on at world 2 without restarting; a replacement of a's worker
 *   then joins with no check (label system: it needs root and iproute2, as the chaos suite's
 *   partitions do).
 */
#include "test_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[256];
static char ckpt[300];
static char stop_path[400];
static test_etcd_t etcd;
static test_net_t net;

static void setup(void)
{
    test_job_dirs(dir, sizeof(dir), ckpt, sizeof(ckpt), "health");
    test_stop_path(dir, stop_path, sizeof(stop_path));
}

static void teardown(void)
{
    test_etcd_down(&etcd);
    test_net_down(&net);
    test_rmtree(dir);
}

START_TEST(test_health_check_passes)
{
    char log[400];
    test_log_path(dir, "job", log, sizeof(log));
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=3", "--health-check",
                    RG_EXACT_BIN, "--epochs", "2", "--work", "20000", NULL};
    int rc = test_run(argv, log, 120000);
    unsetenv("REGROUP_LOG_LEVEL");
    ck_assert_msg(rc == 0, "the job exited %d", rc);
    ck_assert_msg(test_log_has(dir, "job",
                               "health check (the start) of round 0: 3 ranks on 1 node,") &&
                      test_log_has(dir, "job", "0 named") &&
                      test_log_has(dir, "job", "slowest link"),
                  "the check did not run at the job's start, or named a rank");
    ck_assert(test_log_has(dir, "job", "exact=1"));
}
END_TEST

/* Bad values are refused in one line naming the option. */
START_TEST(test_health_check_bad_values)
{
    char out[2048];
    char log[400];
    test_log_path(dir, "bad", log, sizeof(log));
    char *bad[] = {REGROUP_BIN, "--standalone", "--health-check=sometimes", RG_EXACT_BIN, NULL};
    ck_assert_int_eq(test_run_output(bad, log, 30000, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "--health-check=sometimes") != NULL &&
                      strstr(out, "expected warn, evict or off") != NULL, "%s", out);
    char *restart[] = {REGROUP_BIN, "--standalone", "--health-check=evict", RG_EXACT_BIN, NULL};
    ck_assert_int_eq(test_run_output(restart, log, 30000, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "--recovery=in-place") != NULL, "%s", out);
}
END_TEST

/* Node k's agent, in its namespace: an in-place rg-exact job of one worker. */
static pid_t start_net_node(const char *name, int k, const char *endpoint)
{
    char ep[600];
    char addr[64];
    char host[40];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", endpoint);
    test_net_addr(k, host, sizeof(host));
    snprintf(addr, sizeof(addr), "--local-addr=%s", host);
    char *argv[] = {"ip", "netns", "exec", (char *)test_net_name(&net, k), REGROUP_BIN, ep,
                    "--rdzv-id=job", "--nnodes=2:3", "--nproc-per-node=1", addr,
                    "--max-restarts=3", "--recovery=in-place", "--health-check=evict",
                    "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=30",
                    RG_EXACT_BIN, "--epochs", "400", "--work", "400000", "--stop-file",
                    stop_path, NULL};
    return test_spawn_logged(dir, name, argv);
}

/* Whether node `name`'s worker last regrouped in place into a group of `world` ranks (its
 * info line "regrouped in place from round R into round S: rank K of N, step ..."). */
static bool last_regroup_at(const char *name, int world)
{
    char line[512];
    char want[32];
    snprintf(want, sizeof(want), " of %d, step ", world);
    return test_log_last(dir, name, "regrouped in place from round ", line, sizeof(line)) &&
           strstr(line, want) != NULL;
}

/* The pid of node `name`'s latest worker, from rg-exact's "rank R: pid P started (joining J)"
 * lines. */
static int last_worker_pid(const char *name)
{
    char line[512];
    int r;
    int pid;
    if (!test_log_last(dir, name, " started (joining ", line, sizeof(line)) ||
        strstr(line, "rank ") == NULL ||
        sscanf(strstr(line, "rank "), "rank %d: pid %d started", &r, &pid) != 2) {
        return -1;
    }
    return pid;
}

START_TEST(test_health_check_evicts_slow_node)
{
    test_net_up(&net);
    for (int k = 0; k < 3; k++) {
        test_net_node(&net, k, k == 2 ? "200mbit" : NULL);
    }
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST,
                                            .also_host = TEST_NET_HUB});
    /* Separate nodes: tcp on their own veth, no shared memory between them. */
    setenv("UCX_NET_DEVICES", "veth0", 1);
    setenv("UCX_TLS", "tcp", 1);
    setenv("REGROUP_HEALTH_CHECK_BYTES", "1048576", 1);
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    pid_t a = start_net_node("a", 0, etcd.srv.endpoints_also);
    pid_t b = start_net_node("b", 1, etcd.srv.endpoints_also);
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 1, 60000,
                    "no checkpoint committed within 60 s: the job does not run");
    /* Two ranks: measured, nobody to compare with. */
    ck_assert_msg(test_log_has(dir, "a", "of round 0: 2 ranks") ||
                      test_log_has(dir, "b", "of round 0: 2 ranks"),
                  "the check did not run at the job's start");
    pid_t c = start_net_node("c", 2, etcd.srv.endpoints_also);
    unsetenv("REGROUP_LOG_LEVEL");
    test_expect_exit(c, 90000, 0);
    ck_assert_msg(test_log_has(dir, "c", "health check: this rank"),
                  "node c's rank was not the one named");
    ck_assert_msg(test_log_has(dir, "c", "this node left the job (health check: local rank 0"),
                  "node c did not leave for its health check");
    ck_assert_msg(test_log_has(dir, "a", "health check: rank ") ||
                      test_log_has(dir, "b", "health check: rank "),
                  "rank 0 did not name the slow rank");
    ck_assert_msg(test_log_has(dir, "a", "(a node joins) of round") ||
                      test_log_has(dir, "b", "(a node joins) of round"),
                  "the check did not run when node c joined");
    /* a and b regroup in place without c, and finish exactly at world 2. */
    TEST_WAIT_UNTIL(last_regroup_at("a", 2), 60000,
                    "node a did not regroup in place without node c");
    ck_assert_msg(!test_log_has(dir, "a", "failed (") && !test_log_has(dir, "b", "failed ("),
                  "a worker failure was reported for a node the check took out");
    /* A replacement of a dead worker joins on a node the group holds: no check for it. */
    int victim = last_worker_pid("a");
    ck_assert_int_gt(victim, 0);
    long from = test_log_size(dir, "a");
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    TEST_WAIT_UNTIL(test_log_has_after(dir, "a", from, "regrouped in place from round") &&
                        last_regroup_at("a", 2), 60000,
                    "node a's replacement did not join in place");
    ck_assert_int_eq(test_log_count(dir, "a", "(a node joins) of round") +
                         test_log_count(dir, "b", "(a node joins) of round"), 1);
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    test_expect_exit(b, 120000, 0);
    /* (Rank 0, which prints the result, is on either node.) */
    ck_assert_msg((test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=2")) ||
                      (test_log_has(dir, "b", "exact=1") && test_log_has(dir, "b", "world=2")),
                  "the job did not finish exactly at world 2");
    ck_assert_msg(!test_log_has(dir, "a", "resumed from step") &&
                      !test_log_has(dir, "b", "resumed from step"),
                  "the job restarted from its checkpoint");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("health");
    TCase *tc = tcase_create("pass");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_health_check_passes);
    tcase_add_test(tc, test_health_check_bad_values);
    suite_add_tcase(s, tc);
    TCase *tn = tcase_create("netns");
    tcase_add_checked_fixture(tn, setup, teardown);
    tcase_set_timeout(tn, 300);
    tcase_add_test(tn, test_health_check_evicts_slow_node);
    suite_add_tcase(s, tn);
    return test_main("test_health", s, NULL);
}
