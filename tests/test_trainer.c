/*
 * rg_trainer_fit through real worker processes: each outcome the driver can return (success,
 * a bad scaling config, workers failing past max_failures, a private etcd that cannot start,
 * a signal to the driver), and the driver's process as it was before: environment, signal
 * mask, SIGPIPE disposition.
 *
 * The workers re-run this executable: main() sees WORKER_FLAG and calls rg_trainer_fit with
 * the training function named after it, which runs it and exits.
 */
#include "rg_common.h"
#include "test_util.h"

#include <regroup/train.h>

#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKER_FLAG "--rg-test-trainer-worker"

extern char **environ;

static char dir[256];
static char ckpt[300];

/* ---- the training functions (in the workers); arg is the test's directory ------------- */

static void note(const char *dirname, const char *name, const char *fmt, ...) RG_PRINTF(3, 4);
static void note(const char *dirname, const char *name, const char *fmt, ...)
{
    char path[512];
    va_list ap;
    snprintf(path, sizeof(path), "%s/%s", dirname, name);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fclose(f);
    }
}

static rg_status_t fn_ok(rg_train_ctx_t *ctx, void *arg)
{
    char name[64];
    snprintf(name, sizeof(name), "ok.%d", rg_train_rank(ctx));
    note(arg, name, "%s\n", rg_train_ckpt_root(ctx) ? rg_train_ckpt_root(ctx) : "(none)");
    return RG_OK;
}

static rg_status_t fn_fail(rg_train_ctx_t *ctx, void *arg)
{
    char name[64];
    snprintf(name, sizeof(name), "fail.%d.%d", rg_train_rank(ctx), rg_train_restart_count(ctx));
    note(arg, name, "failed\n");
    return rg_error(RG_EIO, "failing on purpose");
}

static rg_status_t fn_block(rg_train_ctx_t *ctx, void *arg)
{
    char name[64];
    snprintf(name, sizeof(name), "started.%d", rg_train_rank(ctx));
    note(arg, name, "%d\n", (int)getpid());
    rg_sleep_ms(60000);
    return RG_OK;
}

/* Step 1's checkpoint fails in the background (a regular file stands where its directory
 * goes); the report of step 2, with state, must return that failure. */
static rg_status_t fn_ckpt_fails(rg_train_ctx_t *ctx, void *arg)
{
    char path[600];
    int64_t v[4] = {1, 2, 3, 4};
    rg_ckpt_tensor_t t = {.name = "v", .dtype = RG_DTYPE_I64, .ndim = 1, .shape = {4},
                          .row_begin = 0, .row_count = 4, .data = v,
                          .flags = RG_CKPT_REPLICATED};
    rg_train_state_t state = {.tensors = &t, .n_tensors = 1};
    rg_report_t rep = {.step = 1};

    snprintf(path, sizeof(path), "%s/step-1", rg_train_ckpt_root(ctx));
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return rg_error(RG_ESYS, "%s: cannot create", path);
    }
    fclose(f);
    /* The background thread logs the failure just before it ends the save: stderr goes to a
     * file until that line is there, so the next report finds the save ended. */
    snprintf(path, sizeof(path), "%s/worker.err", (const char *)arg);
    int err = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int saved = dup(2);
    if (err < 0 || saved < 0 || dup2(err, 2) < 0) {
        return rg_error(RG_ESYS, "%s: cannot redirect stderr", path);
    }
    rg_status_t first = rg_report(ctx, &rep, &state);
    rg_deadline_t until = rg_deadline_in_ms(20000);
    while (!test_file_contains(path, "checkpoint step 1 rank 0 failed") &&
           !rg_deadline_passed(until)) {
        rg_sleep_ms(1);
    }
    dup2(saved, 2);
    close(saved);
    close(err);
    rep.step = 2;
    rg_status_t second = rg_report(ctx, &rep, &state);
    note(arg, "reports", "first=%s second=%s\n", rg_status_name(first),
         rg_status_name(second));
    return RG_OK;
}

static rg_train_fn_t fn_named(const char *name)
{
    return strcmp(name, "ok") == 0 ? fn_ok : strcmp(name, "fail") == 0 ? fn_fail
           : strcmp(name, "ckpt") == 0 ? fn_ckpt_fails : fn_block;
}

/* ---- the driver ----------------------------------------------------------------------- */

static void setup(void)
{
    test_tmpdir(dir, sizeof(dir), "trainer");
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
    ck_assert_int_eq(mkdir(ckpt, 0700), 0);
}

static void teardown(void)
{
    test_rmtree(dir);
}

static rg_scaling_config_t scaling(int workers, int max_failures, char **argv)
{
    return (rg_scaling_config_t){.num_workers = workers, .max_failures = max_failures,
                                 .ckpt_root = ckpt, .argc = 4, .argv = argv};
}

static rg_status_t fit(const char *fn, int workers, int max_failures)
{
    char *argv[] = {"test_trainer", WORKER_FLAG, (char *)fn, dir, NULL};
    rg_scaling_config_t sc = scaling(workers, max_failures, argv);
    return rg_trainer_fit(fn_named(fn), dir, &sc);
}

static bool exists(const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static char **environ_copy(void)
{
    size_t n = 0;
    while (environ[n] != NULL) {
        n++;
    }
    char **copy = calloc(n + 1, sizeof(char *));
    ck_assert_ptr_nonnull(copy);
    for (size_t i = 0; i < n; i++) {
        copy[i] = strdup(environ[i]);
    }
    return copy;
}

START_TEST(test_fit_succeeds_and_leaves_the_process_as_it_was)
{
    /* A checkpoint dir of the caller's own: the workers must get ckpt_root instead, and the
     * caller must keep its own. */
    setenv("REGROUP_CKPT_DIR", "/nonexistent/callers-own", 1);
    char **before = environ_copy();
    sigset_t mask_before;
    sigset_t mask_after;
    struct sigaction pipe_after;
    pthread_sigmask(SIG_BLOCK, NULL, &mask_before);

    ck_assert_msg(fit("ok", 2, 0) == RG_OK, "%s", rg_last_error());

    for (int r = 0; r < 2; r++) {
        char path[512];
        char want[400];
        snprintf(path, sizeof(path), "%s/ok.%d", dir, r);
        snprintf(want, sizeof(want), "%s\n", ckpt);
        ck_assert_msg(test_file_contains(path, want), "rank %d did not run with ckpt_root", r);
    }
    size_t i = 0;
    for (; before[i] != NULL; i++) {
        ck_assert_ptr_nonnull(environ[i]);
        ck_assert_str_eq(environ[i], before[i]);
        free(before[i]);
    }
    ck_assert_ptr_null(environ[i]);
    free(before);
    ck_assert_ptr_null(getenv("REGROUP_TRAINER_WORKER"));
    ck_assert_str_eq(getenv("REGROUP_CKPT_DIR"), "/nonexistent/callers-own");
    pthread_sigmask(SIG_BLOCK, NULL, &mask_after);
    static const int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGPIPE};
    for (size_t k = 0; k < RG_ARRAY_SIZE(sigs); k++) {
        ck_assert_int_eq(sigismember(&mask_after, sigs[k]), sigismember(&mask_before, sigs[k]));
    }
    sigaction(SIGPIPE, NULL, &pipe_after);
    ck_assert(pipe_after.sa_handler == SIG_DFL);
}
END_TEST

static void expect_invalid(rg_status_t want, rg_scaling_config_t sc, rg_train_fn_t fn,
                           const char *text)
{
    uint64_t t0 = rg_now_ns();
    rg_status_t st = rg_trainer_fit(fn, dir, &sc);
    ck_assert_msg(st == want, "%s instead of %s for '%s': %s", rg_status_name(st),
                  rg_status_name(want), text, rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), text) != NULL, "'%s' does not name '%s'",
                  rg_last_error(), text);
    /* Refused before anything started (no private etcd: that takes longer). */
    ck_assert_uint_lt(rg_now_ns() - t0, 200000000ull);
}

START_TEST(test_fit_refuses_a_bad_scaling_config)
{
    char *argv[] = {"test_trainer", WORKER_FLAG, "ok", dir, NULL};
    rg_scaling_config_t sc = scaling(0, 0, argv);
    expect_invalid(RG_EINVAL, sc, fn_ok, "rg_scaling_config_t.num_workers=0");
    sc = scaling(257, 0, argv);
    expect_invalid(RG_EINVAL, sc, fn_ok, "rg_scaling_config_t.num_workers=257");
    sc = scaling(1, -1, argv);
    expect_invalid(RG_EINVAL, sc, fn_ok, "rg_scaling_config_t.max_failures=-1");
    sc = scaling(1, 0, argv);
    sc.ckpt_root = NULL;
    expect_invalid(RG_EINVAL, sc, fn_ok, "rg_scaling_config_t.ckpt_root");
    sc = scaling(1, 0, argv);
    sc.argc = 0;
    expect_invalid(RG_EINVAL, sc, fn_ok, "rg_scaling_config_t.argc=0");
    sc = scaling(1, 0, argv);
    expect_invalid(RG_EINVAL, sc, NULL, "fn is NULL");
    sc.use_gpu = true;
    expect_invalid(RG_ENOTSUP, sc, fn_ok, "use_gpu");
}
END_TEST

/* A function that always fails: run 1 + max_failures times, then RG_EJOBFAILED. */
START_TEST(test_fit_fails_past_max_failures)
{
    int max_failures = _i;
    char text[128];
    ck_assert_int_eq(fit("fail", 1, max_failures), RG_EJOBFAILED);
    snprintf(text, sizeof(text), "rg_scaling_config_t.max_failures=%d", max_failures);
    ck_assert_msg(strstr(rg_last_error(), text) != NULL, "%s", rg_last_error());
    for (int r = 0; r <= max_failures; r++) {
        char name[64];
        snprintf(name, sizeof(name), "fail.0.%d", r);
        ck_assert_msg(exists(name), "no run with restart count %d", r);
    }
    char name[64];
    snprintf(name, sizeof(name), "fail.0.%d", max_failures + 1);
    ck_assert_msg(!exists(name), "ran again past max_failures=%d", max_failures);
}
END_TEST

/* A checkpoint that failed in the background is returned by the next report, even one with
 * state that finds it already ended (it used to return the new save's RG_OK). */
START_TEST(test_failed_checkpoint_is_reported)
{
    char path[512];
    ck_assert_msg(fit("ckpt", 1, 0) == RG_OK, "%s", rg_last_error());
    snprintf(path, sizeof(path), "%s/reports", dir);
    ck_assert_msg(test_file_contains(path, "first=RG_OK "), "the first report (staging only) "
                  "failed");
    ck_assert_msg(test_file_contains(path, "second=RG_E"), "the report after a failed "
                  "checkpoint did not return its failure");
}
END_TEST

/* The private etcd cannot make its data directory. */
START_TEST(test_fit_reports_that_etcd_cannot_start)
{
    setenv("TMPDIR", "/nonexistent/tmp", 1);
    rg_status_t st = fit("ok", 1, 0);
    unsetenv("TMPDIR");
    ck_assert_msg(st == RG_EUNREACH, "%s: %s", rg_status_name(st), rg_last_error());
    ck_assert_msg(strstr(rg_last_error(), "cannot start etcd") != NULL, "%s", rg_last_error());
    ck_assert(!exists("ok.0"));
}
END_TEST

static bool read_pid(const char *path, int *pid)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    bool ok = fscanf(f, "%d", pid) == 1 && *pid > 0;
    fclose(f);
    return ok;
}

/* SIGTERM to the driver: the workers are stopped and it returns RG_ECANCELED. */
START_TEST(test_fit_returns_canceled_on_sigterm)
{
    char path[512];
    int worker = 0;
    pid_t driver = fork();
    ck_assert_int_ge(driver, 0);
    if (driver == 0) {
        rg_status_t st = fit("block", 1, 0);
        _exit(st == RG_ECANCELED ? 0 : st == RG_OK ? 1 : 2);
    }
    snprintf(path, sizeof(path), "%s/started.0", dir);
    TEST_WAIT_UNTIL(read_pid(path, &worker), 60000, "the worker did not start within 60 s");
    kill(driver, SIGTERM);
    int rc = rg_proc_wait(driver, 30000);
    if (rc < 0) {
        kill(driver, SIGKILL);
        waitpid(driver, NULL, 0);
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(kill(worker, 0) != 0, "worker %d outlived the driver", worker);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], WORKER_FLAG) == 0) {
        /* A worker: rg_trainer_fit runs the function and exits. Without the trainer's
         * environment it would start a trainer of its own instead: refuse. */
        if (getenv("REGROUP_TRAINER_WORKER") == NULL) {
            fprintf(stderr, "test_trainer: %s without REGROUP_TRAINER_WORKER\n", WORKER_FLAG);
            return 2;
        }
        snprintf(dir, sizeof(dir), "%s", argv[3]);
        snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
        rg_scaling_config_t sc = scaling(1, 0, argv);
        rg_status_t st = rg_trainer_fit(fn_named(argv[2]), dir, &sc);
        fprintf(stderr, "test_trainer: %s outside a trainer: %s\n", WORKER_FLAG,
                rg_status_name(st));
        return 2;
    }
    setenv("UCX_NET_DEVICES", "lo", 1);
    Suite *s = suite_create("trainer");
    TCase *tc = tcase_create("fit");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fit_refuses_a_bad_scaling_config);
    tcase_add_test(tc, test_fit_succeeds_and_leaves_the_process_as_it_was);
    tcase_add_loop_test(tc, test_fit_fails_past_max_failures, 0, 2);
    tcase_add_test(tc, test_fit_reports_that_etcd_cannot_start);
    tcase_add_test(tc, test_failed_checkpoint_is_reported);
    tcase_add_test(tc, test_fit_returns_canceled_on_sigterm);
    suite_add_tcase(s, tc);
    return test_main("trainer", s, NULL);
}
