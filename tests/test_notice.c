/*
 * Preemption notices, end to end: real agents (`regroup`), real workers (rg-exact, or a shell
 * program that does not use the worker API), a real etcd, and a stand-in for each cloud's
 * metadata service (tests/metadata_server.py on a loopback port, answering in the formats the
 * providers document; the script cites their pages) that REGROUP_METADATA_URL points the
 * agents at.
 *
 *   - a notice while training: two agents (--nnodes=1:2), the one noticed leaves, its workers
 *     and the other's take the last checkpoint of the same step, the survivor resumes from
 *     that step at the smaller size (0 steps lost) and ends with rg-exact's exact digest, at
 *     --max-restarts=0 (a preemption is no failure);
 *   - a notice with too little time (its deadline already past): the job falls back to the
 *     previous committed checkpoint, still exact;
 *   - SIGTERM during the last save: the deadline shrinks to the grace period, the save lands;
 *   - SIGTERM alone (no metadata) at --max-restarts=0: the same leaving, the job goes on;
 *   - a program that does not use the worker API gets SIGTERM as soon as the notice arrives,
 *     and `regroup status` shows the node leaving and why;
 *   - --preemption-notice=auto finds the service that answers; Azure's event is acknowledged;
 *   - a notice while the agent waits for the others to join: it leaves without starting;
 *   - a service that never answers, answers 404, gives malformed answers or hangs: a warning,
 *     and the job carries on to its exact end.
 */
#include "cloud_meta.h"
#include "test_util.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];
static char ckpt[300];
static char state_path[300];
static char server_log[300];
static char url[128];
static pid_t server = -1;
static test_etcd_t etcd;

static void setup(void)
{
    test_job_dirs(dir, sizeof(dir), ckpt, sizeof(ckpt), "notice");
    snprintf(state_path, sizeof(state_path), "%s/meta.state", dir);
    snprintf(server_log, sizeof(server_log), "%s/meta.log", dir);
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    unsetenv("REGROUP_METADATA_URL");
    server = -1;
}

static void teardown(void)
{
    if (server > 0) {
        kill(server, SIGKILL);
        (void)rg_proc_wait(server, 5000);
        server = -1;
    }
    test_etcd_down(&etcd);
    if (getenv("REGROUP_KEEP_TEST_DIR") == NULL) {
        test_rmtree(dir);   /* else kept under the run's directory, with test_main's */
    }
}

/* What the stand-in answers from now on (metadata_server.py reads it at every request). */
static void meta_state(const char *state)
{
    char tmp[400];
    snprintf(tmp, sizeof(tmp), "%s.tmp", state_path);
    FILE *f = fopen(tmp, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n", state);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(rename(tmp, state_path), 0);
}

static bool file_exists(const char *p)
{
    return access(p, F_OK) == 0;
}

/* Starts the stand-in answering for `only` (aws, gce, azure or all) in `state`; sets url. */
static void meta_up(const char *only, const char *state)
{
    char port_file[300];
    char log[300];
    snprintf(port_file, sizeof(port_file), "%s/meta.port", dir);
    snprintf(log, sizeof(log), "%s/meta.out", dir);
    meta_state(state);
    char *argv[] = {"/usr/bin/python3", RG_META_SERVER, port_file, state_path, server_log,
                    (char *)only, NULL};
    server = test_spawn(argv, log);
    TEST_WAIT_UNTIL(file_exists(port_file), 20000, "the metadata stand-in did not start");
    FILE *f = fopen(port_file, "r");
    int port = 0;
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%d", &port), 1);
    fclose(f);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
}

/* The number after the last "<prefix>" in a log (the last resume is the one after the
 * notice, whatever rounds came before), or -1. */
static long log_number(const char *name, const char *prefix)
{
    char path[400];
    char line[512];
    long v = -1;
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, prefix);
        long x;
        if (p != NULL && sscanf(p + strlen(prefix), "%ld", &x) == 1) {
            v = x;
        }
    }
    fclose(f);
    return v;
}

/* ---- two agents running rg-exact -------------------------------------------------------- */

typedef struct {
    pid_t a;        /* no notices: the survivor */
    pid_t b;        /* watches the stand-in (notice set), or none */
} job_t;

static char ep_arg[600];
static char stop_arg[400];   /* the jobs' --stop-file */

/* Two agents of job `id` on 127.0.0.1, both in its first round at world size 2 once this
 * returns, and a first checkpoint committed. b_notice is B's --preemption-notice; extra an
 * argument of B's (or NULL); work the per-sample compute; pad_kb the checkpoint padding. */
static job_t start_pair(const char *id, const char *b_notice, const char *b_extra,
                        const char *epochs, const char *work, const char *pad_kb)
{
    char rid[80];
    char bn[80];
    job_t j;
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
    snprintf(ep_arg, sizeof(ep_arg), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    test_stop_path(dir, stop_arg, sizeof(stop_arg));
    snprintf(rid, sizeof(rid), "--rdzv-id=%s", id);
    snprintf(bn, sizeof(bn), "--preemption-notice=%s", b_notice);
    char *a_argv[] = {REGROUP_BIN, ep_arg, rid, "--nnodes=1:2", "--nproc-per-node=1",
                      "--max-restarts=0", "--rdzv-conf=last_call_timeout=3", RG_EXACT_BIN,
                      "--epochs", (char *)epochs, "--work", (char *)work, "--pad-kb",
                      (char *)pad_kb, "--stop-file", stop_arg, NULL};
    char *b_argv[] = {REGROUP_BIN, ep_arg, rid, "--nnodes=1:2", "--nproc-per-node=1",
                      "--max-restarts=0", "--rdzv-conf=last_call_timeout=3", bn,
                      b_extra ? (char *)b_extra : "--grace-period=5", RG_EXACT_BIN,
                      "--epochs", (char *)epochs, "--work", (char *)work, "--pad-kb",
                      (char *)pad_kb, "--stop-file", stop_arg, NULL};
    unsetenv("REGROUP_METADATA_URL");
    j.a = test_spawn_logged(dir, "a", a_argv);
    if (url[0] != '\0') {
        setenv("REGROUP_METADATA_URL", url, 1);
    }
    j.b = test_spawn_logged(dir, "b", b_argv);
    unsetenv("REGROUP_METADATA_URL");
    /* both in round 0 at world size 2, and training: a checkpoint has landed */
    test_wait_log(dir, "a", " of 2, restart 0)", 60000);
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 0, 60000, "no checkpoint committed within 60 s");
    return j;
}

/* The survivor resumed from the leaving step: 0 steps lost, and the exact digest at world
 * size 1. */
static void check_no_step_lost(const job_t *j)
{
    /* The survivor resumed alone: the rest of its run would only take time. */
    test_wait_log(dir, "a", "resumed from step ", 120000);
    test_end_training(dir);
    test_expect_exit(j->a, 240000, 0);
    long left = log_number("a", "left at step ");
    if (left < 0) {
        left = log_number("b", "left at step ");
    }
    long resumed = log_number("a", "resumed from step ");
    ck_assert_msg(left > 0, "no rank said where it left");
    ck_assert_msg(test_log_has(dir, "a", "checkpoint committed") ||
                      test_log_has(dir, "b", "checkpoint committed"),
                  "the last checkpoint was not committed");
    ck_assert_msg(resumed == left, "left at step %ld but resumed from step %ld", left, resumed);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=1"),
                  "the survivor did not end exactly at world size 1");
    ck_assert_msg(!test_log_has(dir, "a", "failed more than"),
                  "the preemption counted as a failure");
}

START_TEST(test_aws_notice_while_training)
{
    meta_up("aws", "none");
    job_t j = start_pair("aws", "aws", NULL, "40", "20000", "0");
    ck_assert(!test_log_has(dir, "b", "leaves the job"));
    meta_state("notice 60");
    test_expect_exit(j.b, 120000, 0);
    ck_assert(
        test_log_has(dir, "b", "this node left the job (aws spot instance-action: terminate at"));
    ck_assert(test_log_has(dir, "a", "leaves: aws spot instance-action"));
    check_no_step_lost(&j);
    /* IMDSv2: a token first, then the notice with it */
    ck_assert(test_file_contains(server_log, "PUT /latest/api/token 200"));
    ck_assert(test_file_contains(server_log, "GET /latest/meta-data/spot/instance-action 404"));
    ck_assert(test_file_contains(server_log, "GET /latest/meta-data/spot/instance-action 200"));
}
END_TEST

START_TEST(test_gce_notice_while_training)
{
    meta_up("gce", "none");
    job_t j = start_pair("gce", "gce", NULL, "40", "20000", "0");
    meta_state("notice 0");
    test_expect_exit(j.b, 120000, 0);
    ck_assert(test_log_has(dir, "b", "this node left the job (gce instance/preempted: TRUE"));
    check_no_step_lost(&j);
}
END_TEST

START_TEST(test_azure_notice_while_training)
{
    meta_up("azure", "none");
    job_t j = start_pair("azure", "azure", NULL, "40", "20000", "0");
    meta_state("notice 45");
    test_expect_exit(j.b, 120000, 0);
    ck_assert(test_log_has(dir, "b", "this node left the job (azure scheduled event Preempt"));
    check_no_step_lost(&j);
    /* the agent acknowledged the event once its workers were done */
    ck_assert(test_file_contains(server_log, "ack 602d9444-d2cd-49c7-8624-8643e7171297"));
}
END_TEST

/* rg-fmnist takes the same last checkpoint and the survivor resumes from its step. */
START_TEST(test_fmnist_notice)
{
    char rid[] = "--rdzv-id=fmnist";
    meta_up("aws", "none");
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
    snprintf(ep_arg, sizeof(ep_arg), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    char *a_argv[] = {REGROUP_BIN, ep_arg, rid, "--nnodes=1:2", "--max-restarts=0",
                      "--rdzv-conf=last_call_timeout=3", RG_FMNIST_BIN, "--epochs", "1",
                      "--log-every", "50", "--ckpt-every", "50", NULL};
    char *b_argv[] = {REGROUP_BIN, ep_arg, rid, "--nnodes=1:2", "--max-restarts=0",
                      "--rdzv-conf=last_call_timeout=3", "--preemption-notice=aws",
                      RG_FMNIST_BIN, "--epochs", "1", "--log-every", "50", "--ckpt-every",
                      "50", NULL};
    pid_t a = test_spawn_logged(dir, "a", a_argv);
    setenv("REGROUP_METADATA_URL", url, 1);
    pid_t b = test_spawn_logged(dir, "b", b_argv);
    unsetenv("REGROUP_METADATA_URL");
    test_wait_log(dir, "a", " of 2, restart 0)", 60000);
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 0, 120000, "no checkpoint committed within 120 s");
    meta_state("notice 60");
    test_expect_exit(b, 120000, 0);
    test_expect_exit(a, 400000, 0);
    long left = log_number("a", "left at step ");
    if (left < 0) {
        left = log_number("b", "left at step ");
    }
    long resumed = log_number("a", "resumed from checkpoint step ");
    ck_assert_msg(left > 0 && resumed == left, "left at step %ld, resumed from %ld", left,
                  resumed);
    ck_assert(test_log_has(dir, "a", "checkpoint committed") ||
              test_log_has(dir, "b", "checkpoint committed"));
    ck_assert(test_log_has(dir, "a", "test_accuracy="));
}
END_TEST

/* The notice's time has already passed when it is seen: no time for a last checkpoint. The
 * job resumes from the previous committed one (never from a half-written one), exactly. */
START_TEST(test_notice_too_late_falls_back)
{
    meta_up("aws", "none");
    job_t j = start_pair("late", "aws", NULL, "40", "20000", "0");
    meta_state("notice -5");
    test_expect_exit(j.b, 120000, 0);
    test_wait_log(dir, "a", "resumed from step ", 120000);
    test_end_training(dir);
    test_expect_exit(j.a, 240000, 0);
    ck_assert_msg(!test_log_has(dir, "a", "checkpoint committed") &&
                      !test_log_has(dir, "b", "checkpoint committed"),
                  "a last checkpoint was taken with no time left");
    long resumed = log_number("a", "resumed from step ");
    ck_assert_msg(resumed > 0 && resumed % 5 == 0, "resumed from %ld, not from a periodic "
                  "checkpoint", resumed);
    ck_assert(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=1"));
    ck_assert(!test_log_has(dir, "a", "failed more than"));
}
END_TEST

/* SIGTERM while the last checkpoint is being written: the deadline becomes the grace period,
 * which is enough; the save lands and the survivor loses no step. The padding (64 MiB) makes
 * every checkpoint take a while, so that one is always being written: the step reached when
 * the notice is seen waits for the one in flight, then is saved itself. 8 epochs (200
 * steps, the notice comes after the first checkpoint): the survivor's 64 MiB checkpoints after
 * it would take a minute at 40. */
START_TEST(test_sigterm_during_last_save)
{
    meta_up("aws", "none");
    job_t j = start_pair("term", "aws", "--grace-period=30", "8", "20000", "65536");
    meta_state("notice 90");
    test_wait_log(dir, "b", "this node leaves the job: aws", 30000);
    ck_assert_msg(!test_log_has(dir, "b", "left the job"), "the node left before its SIGTERM");
    ck_assert_int_eq(kill(j.b, SIGTERM), 0);
    test_expect_exit(j.b, 120000, 128 + SIGTERM);
    ck_assert(test_log_has(dir, "b", "then SIGTERM"));
    check_no_step_lost(&j);
}
END_TEST

/* No metadata service: SIGTERM alone is a notice with the grace period, at --max-restarts=0. */
START_TEST(test_sigterm_is_a_notice)
{
    job_t j = start_pair("sig", "none", "--grace-period=20", "40", "20000", "0");
    ck_assert_int_eq(kill(j.b, SIGTERM), 0);
    test_expect_exit(j.b, 120000, 128 + SIGTERM);
    ck_assert(test_log_has(dir, "b", "this node leaves the job: SIGTERM"));
    check_no_step_lost(&j);
}
END_TEST

/* A program without the worker API gets SIGTERM when the notice arrives (here it ignores it
 * and says so), and `regroup status` shows the node leaving and why. */
START_TEST(test_plain_program_and_status)
{
    char mark[400];
    char prog[600];
    snprintf(mark, sizeof(mark), "%s/got-term", dir);
    snprintf(prog, sizeof(prog), "trap 'touch %s' TERM; while :; do sleep 0.05; done", mark);
    meta_up("gce", "none");
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
    snprintf(ep_arg, sizeof(ep_arg), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    setenv("REGROUP_METADATA_URL", url, 1);
    char *argv[] = {REGROUP_BIN, ep_arg, "--rdzv-id=plain", "--preemption-notice=gce",
                    "--grace-period=1", "--max-restarts=0", "/bin/sh", "-c", prog, NULL};
    pid_t p = test_spawn_logged(dir, "plain", argv);
    test_wait_log(dir, "plain", "(ranks 0..0 of 1,", 30000);
    meta_state("notice 0");
    TEST_WAIT_UNTIL(file_exists(mark), 30000, "the worker got no SIGTERM on the notice");
    char *st_argv[] = {REGROUP_BIN, "status", ep_arg, "--rdzv-id=plain", NULL};
    char out[8192];
    char st_log[400];
    test_log_path(dir, "status", st_log, sizeof(st_log));
    ck_assert_int_eq(test_run_output(st_argv, st_log, 30000, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "leaving: round 0: node 127.0.0.1") != NULL &&
                  strstr(out, "gce instance/preempted: TRUE") != NULL,
                  "regroup status does not show the leaving node: %s", out);
    /* the program ignores SIGTERM: the agent's own SIGTERM ends it within the grace period */
    ck_assert_int_eq(kill(p, SIGTERM), 0);
    test_expect_exit(p, 30000, 128 + SIGTERM);
    ck_assert(test_log_has(dir, "plain", "ignored SIGTERM") ||
              test_log_has(dir, "plain", "still running"));
}
END_TEST

/* A notice while the agent waits for the others to join: it leaves without starting. */
START_TEST(test_notice_while_joining)
{
    meta_up("aws", "none");
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
    snprintf(ep_arg, sizeof(ep_arg), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    setenv("REGROUP_METADATA_URL", url, 1);
    char *argv[] = {REGROUP_BIN, ep_arg, "--rdzv-id=joining", "--nnodes=2",
                    "--preemption-notice=aws", "/bin/true", NULL};
    pid_t p = test_spawn_logged(dir, "joining", argv);
    test_wait_log(dir, "joining", "rendezvous: joined round 0", 30000);
    meta_state("notice 30");
    test_expect_exit(p, 30000, 0);
    ck_assert(test_log_has(dir, "joining", "this node left the job before joining it (aws spot"));
    ck_assert(!test_log_has(dir, "joining", "started 1 workers"));
}
END_TEST

/* auto: the one service that answers as itself is found and said. */
START_TEST(test_auto_finds_the_service)
{
    char prog[200];
    snprintf(prog, sizeof(prog), "trap 'exit 0' TERM; while :; do sleep 0.05; done");
    meta_up("azure", "none");
    setenv("REGROUP_METADATA_URL", url, 1);
    char *argv[] = {REGROUP_BIN, "--standalone", "--preemption-notice=auto", "/bin/sh", "-c",
                    prog, NULL};
    pid_t p = test_spawn_logged(dir, "auto", argv);
    test_wait_log(dir, "auto", "--preemption-notice=auto: found azure at http://127.0.0.1:", 30000);
    test_wait_log(dir, "auto", "(ranks 0..0 of 1,", 30000);
    meta_state("notice 40");
    test_expect_exit(p, 60000, 0);
    ck_assert(test_log_has(dir, "auto", "this node left the job (azure scheduled event Preempt"));
    ck_assert(test_file_contains(server_log, "ack 602d9444-d2cd-49c7-8624-8643e7171297"));
}
END_TEST

/* A service that does not answer as it should: a warning, and the job runs to its exact end.
 * Each run is long enough (a few seconds) for several looks. */
static void run_unhealthy(const char *name, const char *notice, const char *meta_url,
                          const char *warning)
{
    setenv("REGROUP_METADATA_URL", meta_url, 1);
    char pn[80];
    snprintf(pn, sizeof(pn), "--preemption-notice=%s", notice);
    char *argv[] = {REGROUP_BIN, "--standalone", pn, "--nproc-per-node=2", RG_EXACT_BIN,
                    "--epochs", "30", "--work", "20000", NULL};
    pid_t p = test_spawn_logged(dir, name, argv);
    test_wait_log(dir, name, warning, 60000);
    test_expect_exit(p, 240000, 0);
    ck_assert_msg(test_log_has(dir, name, "exact=1"), "%s: no exact=1", name);
    ck_assert(!test_log_has(dir, name, "leaves the job"));
    unsetenv("REGROUP_METADATA_URL");
}

START_TEST(test_service_never_answers)
{
    /* nothing listens on port 1 of the loopback */
    run_unhealthy("refused", "aws", "http://127.0.0.1:1", "--preemption-notice=aws: PUT");
}
END_TEST

START_TEST(test_service_answers_404)
{
    meta_up("all", "none");
    /* AWS's 404 on instance-action is its normal "no notice": no warning for that. */
    run_unhealthy("aws404", "aws", url, "round 0: started 2 workers");
    ck_assert(!test_log_has(dir, "aws404", "warn  launcher_notice.c"));
    ck_assert(test_file_contains(server_log, "GET /latest/meta-data/spot/instance-action 404"));
    meta_state("404");
    run_unhealthy("gce404", "gce", url, "--preemption-notice=gce: gce: instance/preempted "
                  "answered 404");
}
END_TEST

START_TEST(test_service_malformed)
{
    meta_up("all", "malformed");
    run_unhealthy("aws-bad", "aws", url, "aws spot/instance-action: not a JSON object");
    run_unhealthy("gce-bad", "gce", url, "'MAYBE', not TRUE or FALSE");
    run_unhealthy("azure-bad", "azure", url, "azure scheduledevents: not a JSON object");
}
END_TEST

START_TEST(test_service_hangs)
{
    meta_up("all", "hang");
    run_unhealthy("hang", "gce", url, "no answer within 1000 ms");
}
END_TEST

/* ---- the answers' decoders, without a server ----------------------------------------------- */

START_TEST(test_decode_aws)
{
    char action[32];
    double t;
    const char *ok = "{\"action\": \"terminate\", \"time\": \"2026-12-01T12:00:00Z\"}";
    ck_assert_int_eq(meta_aws_action_decode(ok, strlen(ok), action, sizeof(action), &t), RG_OK);
    ck_assert_str_eq(action, "terminate");
    ck_assert(t == 1796126400.0);
    const char *frac = "{\"action\":\"stop\",\"time\":\"2026-12-01T12:00:00.250Z\"}";
    ck_assert_int_eq(meta_aws_action_decode(frac, strlen(frac), action, sizeof(action), &t),
                     RG_OK);
    ck_assert(t == 1796126400.25);
    const char *bad[] = {"{\"action\": \"terminate\", \"time\": ", "{\"action\":\"terminate\"}",
                         "{\"action\":\"terminate\",\"time\":\"12:00\"}",
                         "{\"action\":\"\",\"time\":\"2026-12-01T12:00:00Z\"}",
                         "{\"action\":\"terminate\",\"time\":\"2026-12-01T12:00:00+02:00\"}",
                         "[]", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(meta_aws_action_decode(bad[i], strlen(bad[i]), action, sizeof(action),
                                             &t) == RG_EPROTO, "%s", bad[i]);
    }
}
END_TEST

START_TEST(test_decode_gce)
{
    bool p = true;
    ck_assert_int_eq(meta_gce_preempted_decode("FALSE", 5, &p), RG_OK);
    ck_assert(!p);
    ck_assert_int_eq(meta_gce_preempted_decode("TRUE\n", 5, &p), RG_OK);
    ck_assert(p);
    ck_assert_int_eq(meta_gce_preempted_decode("TRUEX", 5, &p), RG_EPROTO);
    ck_assert_int_eq(meta_gce_preempted_decode("true", 4, &p), RG_EPROTO);
    ck_assert_int_eq(meta_gce_preempted_decode("", 0, &p), RG_EPROTO);
}
END_TEST

START_TEST(test_decode_azure)
{
    meta_azure_t a;
    const char *none = "{\"DocumentIncarnation\": 1, \"Events\": []}";
    ck_assert_int_eq(meta_azure_decode(none, strlen(none), &a), RG_OK);
    ck_assert(!a.found);
    ck_assert_int_eq(a.incarnation, 1);
    const char *ev =
        "{\"DocumentIncarnation\": 3, \"Events\": [{\"EventId\": \"r1\", \"EventType\": "
        "\"Reboot\", \"NotBefore\": \"\"}, {\"EventId\": \"p1\", \"EventType\": \"Preempt\", "
        "\"EventStatus\": \"Scheduled\", \"NotBefore\": \"Tue, 01 Dec 2026 12:00:30 GMT\"}]}";
    ck_assert_int_eq(meta_azure_decode(ev, strlen(ev), &a), RG_OK);
    ck_assert(a.found);
    ck_assert_str_eq(a.event_id, "p1");
    ck_assert_str_eq(a.type, "Preempt");
    ck_assert(a.not_before == 1796126430.0);
    ck_assert_int_eq(a.incarnation, 3);
    const char *started = "{\"DocumentIncarnation\": 4, \"Events\": [{\"EventId\": \"p1\", "
                          "\"EventType\": \"Preempt\", \"NotBefore\": \"\"}]}";
    ck_assert_int_eq(meta_azure_decode(started, strlen(started), &a), RG_OK);
    ck_assert(a.found && a.not_before == 0);
    /* A Preempt event without an EventId: refused, naming its type (the message once read
     * freed memory: found by fuzz_cloud_meta). */
    const char *no_id = "{\"DocumentIncarnation\": 4, \"Events\": [{\"EventType\": "
                        "\"Preempt\", \"NotBefore\": \"\"}]}";
    ck_assert_int_eq(meta_azure_decode(no_id, strlen(no_id), &a), RG_EPROTO);
    ck_assert_msg(strstr(rg_last_error(), "a Preempt event without") != NULL, "%s",
                  rg_last_error());
    const char *bad[] = {"{\"DocumentIncarnation\": 1, \"Events\": [", "{\"Events\": []}",
                         "{\"DocumentIncarnation\": 1}",
                         "{\"DocumentIncarnation\": 1, \"Events\": [{\"EventId\": \"p\", "
                         "\"EventType\": \"Preempt\", \"NotBefore\": \"soon\"}]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(meta_azure_decode(bad[i], strlen(bad[i]), &a) == RG_EPROTO, "%s", bad[i]);
    }
    char *ack = NULL;
    ck_assert_int_eq(meta_azure_ack_body("p1", &ack), RG_OK);
    ck_assert_str_eq(ack, "{\"StartRequests\":[{\"EventId\":\"p1\"}]}");
    free(ack);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("notice");
    TCase *td = tcase_create("decode");
    tcase_add_test(td, test_decode_aws);
    tcase_add_test(td, test_decode_gce);
    tcase_add_test(td, test_decode_azure);
    suite_add_tcase(s, td);
    TCase *tc = tcase_create("notice");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, test_aws_notice_while_training);
    tcase_add_test(tc, test_gce_notice_while_training);
    tcase_add_test(tc, test_azure_notice_while_training);
    tcase_add_test(tc, test_notice_too_late_falls_back);
    tcase_add_test(tc, test_fmnist_notice);
    tcase_add_test(tc, test_sigterm_during_last_save);
    tcase_add_test(tc, test_sigterm_is_a_notice);
    tcase_add_test(tc, test_plain_program_and_status);
    tcase_add_test(tc, test_auto_finds_the_service);
    tcase_add_test(tc, test_notice_while_joining);
    tcase_add_test(tc, test_service_never_answers);
    tcase_add_test(tc, test_service_answers_404);
    tcase_add_test(tc, test_service_malformed);
    tcase_add_test(tc, test_service_hangs);
    suite_add_tcase(s, tc);
    return test_main("test_notice", s, NULL);
}
