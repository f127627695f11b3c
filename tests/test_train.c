/*
 * The worker API through real processes: rg-exact under the regroup launcher ends with the
 * exact expected vector at world sizes 1-4, after a worker is SIGKILLed, and when a node joins
 * mid-run; and the samples each rank consumed, kept for the steps of the final history, are
 * every sample of every epoch exactly once.
 */
#include "test_util.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SAMPLES 1000
#define EPOCHS  3

static char dir[256];
static char ckpt[300];
static char trace[300];

static test_etcd_t etcd;   /* the tests that need one start it themselves */

static void setup(void)
{
    test_job_dirs(dir, sizeof(dir), ckpt, sizeof(ckpt), "train");
    snprintf(trace, sizeof(trace), "%s/trace", dir);
    ck_assert_int_eq(mkdir(trace, 0700), 0);
}

static void teardown(void)
{
    test_etcd_down(&etcd);
    test_rmtree(dir);
}

/*
 * The exactly-once check. Trace lines are "round step epoch id"; a step executed in several
 * rounds (rolled back by a restart) counts only in the latest round that ran it.
 */
static void check_exactly_once(int epochs, int samples)
{
    enum { MAX_STEPS = 4096 };
    static int last_round[MAX_STEPS];
    static unsigned short count[16][SAMPLES];
    DIR *d = opendir(trace);
    struct dirent *e;
    char path[700];
    char line[128];

    ck_assert_ptr_nonnull(d);
    memset(last_round, -1, sizeof(last_round));
    memset(count, 0, sizeof(count));
    /* Pass 1: the latest round of every step. */
    for (int pass = 0; pass < 2; pass++) {
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') {
                continue;
            }
            snprintf(path, sizeof(path), "%s/%s", trace, e->d_name);
            FILE *f = fopen(path, "r");
            ck_assert_ptr_nonnull(f);
            while (fgets(line, sizeof(line), f) != NULL) {
                int round;
                int step;
                int epoch;
                int id;
                ck_assert_int_eq(sscanf(line, "%d %d %d %d", &round, &step, &epoch, &id), 4);
                ck_assert(step >= 0 && step < MAX_STEPS && epoch < 16 && id < samples);
                if (pass == 0 && round > last_round[step]) {
                    last_round[step] = round;
                } else if (pass == 1 && round == last_round[step]) {
                    count[epoch][id]++;
                }
            }
            fclose(f);
        }
    }
    closedir(d);
    for (int ep = 0; ep < epochs; ep++) {
        for (int id = 0; id < samples; id++) {
            ck_assert_msg(count[ep][id] == 1, "epoch %d sample %d used %d times", ep, id,
                          count[ep][id]);
        }
    }
}

static void run_exact(int world, const char *kill_at)
{
    char np[32];
    char tr[320];
    snprintf(np, sizeof(np), "--nproc-per-node=%d", world);
    snprintf(tr, sizeof(tr), "%s", trace);
    /* With a sharded table too: restart mode saves and reshards it through checkpoints. */
    char *argv[] = {REGROUP_BIN, "--standalone", np, "--max-restarts=2", RG_EXACT_BIN,
                    "--table-rows", "300", "--trace", tr, kill_at ? "--kill-at" : NULL,
                    (char *)kill_at, "--kill-rank", "1", NULL};
    pid_t pid = test_spawn_logged(dir, "job", argv);
    test_expect_exit(pid, 120000, 0);
    ck_assert_msg(test_log_has(dir, "job", "exact=1") && test_log_has(dir, "job", "table=1"),
                  "no exact=1 and table=1 at world %d", world);
    check_exactly_once(EPOCHS, SAMPLES);
}

START_TEST(test_exact_world_sizes)
{
    run_exact(_i + 1, NULL);
}
END_TEST

START_TEST(test_exact_after_worker_kill)
{
    run_exact(3, "32");
    ck_assert(test_log_has(dir, "job", "killing myself at step 32"));
    /* It resumes from a checkpoint at most 32 (which one depends on how far the background
     * writes had got: checkpoints are taken every 5 steps). */
    char path[400];
    char line[256];
    int resumed = -1;
    test_log_path(dir, "job", path, sizeof(path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "resumed from step %d", &resumed) == 1) {
            break;
        }
    }
    fclose(f);
    ck_assert_msg(resumed > 0 && resumed <= 32 && resumed % 5 == 0, "resumed from %d", resumed);
}
END_TEST

START_TEST(test_exact_with_node_joining)
{
    char ep[600];
    char tr[320];
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(tr, sizeof(tr), "%s", trace);
    /* Slow steps (extra compute per sample) so that the second node arrives mid-run. */
    char *argv[] = {REGROUP_BIN, ep, "--rdzv-id=join", "--nnodes=1:2", "--nproc-per-node=1",
                    "--rdzv-conf=last_call_timeout=0.5", RG_EXACT_BIN, "--trace", tr,
                    "--epochs", "3", "--work", "40000", NULL};
    pid_t a = test_spawn_logged(dir, "a", argv);
    /* Mid-run: once a checkpoint has been committed (a step directory alone may still be
     * being written), the second node starts. */
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 0, 60000, "no committed checkpoint within 60 s");
    pid_t b = test_spawn_logged(dir, "b", argv);
    test_expect_exit(a, 120000, 0);
    test_expect_exit(b, 120000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=2"),
                  "the job did not finish exactly at world size 2");
    check_exactly_once(EPOCHS, SAMPLES);
}
END_TEST

/* A 2-rank rg-exact job whose etcd the agent reaches with the --rdzv-conf in conf: the workers
 * must reach it the same way (their group's wire-up, progress and checkpoint keys). */
static void run_exact_on(const char *name, const char *endpoints, const char *conf)
{
    char ep[600];
    char id[64];
    char ck[400];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", endpoints);
    snprintf(id, sizeof(id), "--rdzv-id=%s", name);
    snprintf(ck, sizeof(ck), "%s/%s", ckpt, name);
    ck_assert_int_eq(mkdir(ck, 0700), 0);
    setenv("REGROUP_CKPT_DIR", ck, 1);
    char *argv[] = {REGROUP_BIN, ep, id, "--nnodes=1", "--nproc-per-node=2", (char *)conf,
                    RG_EXACT_BIN, "--epochs", "2", NULL};
    pid_t pid = test_spawn_logged(dir, name, argv);
    test_expect_exit(pid, 120000, 0);
    ck_assert_msg(test_log_has(dir, name, "exact=1"), "%s: no exact=1", name);
    setenv("REGROUP_CKPT_DIR", ckpt, 1);
}

/* etcd over TLS that requires client certificates, then etcd with a user and password. */
START_TEST(test_exact_secured_etcd)
{
    char conf[1400];
    test_etcd_up(&etcd, &(test_etcd_opts_t){.tls = true, .client_certs = true});
    snprintf(conf, sizeof(conf), "--rdzv-conf=cacert=%s,cert=%s,key=%s", etcd.ca,
             etcd.cli_cert, etcd.cli_key);
    run_exact_on("tls", etcd.srv.endpoints, conf);
    /* `regroup status` reads the job with the same --rdzv-conf */
    char ep[600];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    char *status_argv[] = {REGROUP_BIN, "status", ep, "--rdzv-id=tls", conf, NULL};
    test_expect_exit(test_spawn_logged(dir, "status", status_argv), 30000, 0);
    ck_assert_msg(test_log_has(dir, "status", "job:     tls"),
                  "regroup status did not read the job");
    test_etcd_down(&etcd);

    test_etcd_up(&etcd, &(test_etcd_opts_t){.auth = true});
    run_exact_on("auth", etcd.srv.endpoints,
                 "--rdzv-conf=user=root,password=" TEST_ETCD_PASSWORD);
    test_etcd_down(&etcd);
}
END_TEST

/* rg_trainer_fit: the program runs itself on local workers, with restarts and checkpoints. */
START_TEST(test_trainer_fit)
{
    char *argv[] = {RG_EXACT_BIN, "--trainer", "2", "--ckpt-root", ckpt, "--kill-at", "22",
                    "--kill-rank", "1", NULL};
    pid_t pid = test_spawn_logged(dir, "trainer", argv);
    test_expect_exit(pid, 120000, 0);
    ck_assert(test_log_has(dir, "trainer", "killing myself at step 22"));
    ck_assert(test_log_has(dir, "trainer", "exact=1"));
    ck_assert(test_log_has(dir, "trainer", "trainer: the job finished"));
}
END_TEST

/* The MLP at world size 2: a short run drives the loss well below where it started. */
START_TEST(test_mlp_loss_falls_at_world_2)
{
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=2", RG_FMNIST_BIN,
                    "--epochs", "1", "--log-every", "50", "--ckpt-every", "100", NULL};
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    pid_t pid = test_spawn_logged(dir, "mlp", argv);
    test_expect_exit(pid, 240000, 0);
    char path[400];
    char line[256];
    double first = -1;
    double last = -1;
    test_log_path(dir, "mlp", path, sizeof(path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, " loss=");
        double loss;
        if (strncmp(line, "step=", 5) == 0 && p != NULL && sscanf(p, " loss=%lf", &loss) == 1) {
            if (first < 0) {
                first = loss;
            }
            last = loss;
        }
    }
    fclose(f);
    ck_assert_msg(first > 0 && last > 0 && last < 0.5 * first,
                  "loss went from %.4f to %.4f", first, last);
    ck_assert(test_log_has(dir, "mlp", "test_accuracy="));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("exact");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_exact_world_sizes, 0, 4);
    tcase_add_test(tc, test_exact_after_worker_kill);
    tcase_add_test(tc, test_exact_with_node_joining);
    tcase_add_test(tc, test_exact_secured_etcd);
    tcase_add_test(tc, test_mlp_loss_falls_at_world_2);
    tcase_add_test(tc, test_trainer_fit);
    suite_add_tcase(s, tc);
    return test_main("test_train", s, NULL);
}
