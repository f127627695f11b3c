/*
 * The regroup launcher through real processes: agents started as separate "nodes" on
 * loopback against a real etcd, workers that record their starts in an events file.
 */
#include "launcher.h"
#include "rdzv_keys.h"
#include "test_util.h"

#include <check.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_AGENTS 4
#define WORKER     RG_TEST_DATA "/rg_test_worker.sh"

static char dir[256];
static test_etcd_t etcd;
static pid_t agents[MAX_AGENTS];

static void setup_dir(void)
{
    test_tmpdir(dir, sizeof(dir), "launch");
    setenv("RG_TEST_DIR", dir, 1);
    unsetenv("RG_TEST_FAIL_RANK");
    memset(agents, 0, sizeof(agents));
}

static void up(void)
{
    setup_dir();
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
}

static void kill_agents(void)
{
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (agents[i] > 0) {
            kill(agents[i], SIGKILL);
            waitpid(agents[i], NULL, 0);
            agents[i] = 0;
        }
    }
}

static void down_dir(void)
{
    kill_agents();
    test_rmtree(dir);
}

static void down(void)
{
    kill_agents();
    test_etcd_down(&etcd);
    test_rmtree(dir);
}

/* Starts `regroup ARGS... WORKER` with output in dir/agent<i>.log. NULL-terminated args. */
static pid_t start_agent(int i, ...)
{
    char *argv[32];
    char log[300];
    int n = 0;
    va_list ap;

    argv[n++] = REGROUP_BIN;
    va_start(ap, i);
    for (char *a = va_arg(ap, char *); a != NULL && n < 30; a = va_arg(ap, char *)) {
        argv[n++] = a;
    }
    va_end(ap);
    argv[n++] = WORKER;
    argv[n] = NULL;
    snprintf(log, sizeof(log), "%s/agent%d.log", dir, i);
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    pid_t pid = test_spawn(argv, log);
    unsetenv("REGROUP_LOG_LEVEL");
    agents[i] = pid;
    return pid;
}

typedef struct {
    int    round;
    int    rank;
    int    world;
    int    restart;
    pid_t  pid;
} start_t;

/* The lines of dir/name that parse(line, out, n) takes (it fills entry n of out), at most
 * max; returns how many. */
static int read_events(const char *name, bool (*parse)(const char *, void *, int), void *out,
                       int max)
{
    char path[300];
    char line[512];
    int n = 0;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    while (n < max && fgets(line, sizeof(line), f) != NULL) {
        n += parse(line, out, n) ? 1 : 0;
    }
    fclose(f);
    return n;
}

static bool parse_start(const char *line, void *out, int n)
{
    start_t *s = (start_t *)out + n;
    int pid;
    if (sscanf(line, "start %d %d %d %d %d", &s->round, &s->rank, &s->world, &s->restart,
               &pid) != 5) {
        return false;
    }
    s->pid = pid;
    return true;
}

/* Reads the events file; returns the number of starts (at most max). */
static int read_starts(start_t *out, int max)
{
    return read_events("events", parse_start, out, max);
}

/* Waits until, among the starts after index `from`, `count` have world size `world`
 * (and restart count `restart` unless -1). Returns the index after the last matched. */
static int wait_starts(int from, int count, int world, int restart, int timeout_ms)
{
    static start_t s[4096];
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int n = read_starts(s, 4096);
        int got = 0;
        for (int i = from; i < n; i++) {
            if (s[i].world == world && (restart < 0 || s[i].restart == restart)) {
                if (++got == count) {
                    return i + 1;
                }
            }
        }
        if (rg_now_ns() > until) {
            ck_abort_msg("waited %d ms for %d starts at world %d (restart %d) after event %d; "
                         "have %d events", timeout_ms, count, world, restart, from, n);
        }
        rg_sleep_ms(TEST_POLL_MS);
    }
}

/* test_wait_exit for an agent: it is reaped either way, so the teardown forgets it. */
static int wait_exit(pid_t pid, int timeout_ms)
{
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (agents[i] == pid) {
            agents[i] = 0;
        }
    }
    return test_wait_exit(pid, timeout_ms);
}

static void stop_workers(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/stop", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
}

static const char *agent_log(int i)
{
    static char path[300];
    snprintf(path, sizeof(path), "%s/agent%d.log", dir, i);
    return path;
}

static bool log_contains(int i, const char *text)
{
    return test_file_contains(agent_log(i), text);
}

/* Runs `regroup ARGS...` to its end (30 s at most) with its output in out (cap bytes);
 * returns its exit status. */
static int run_regroup(char *const args[], char *out, size_t cap)
{
    char *argv[16];
    char log[300];
    int n = 0;
    static int runs;

    argv[n++] = REGROUP_BIN;
    for (int i = 0; args[i] != NULL && n < 15; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    snprintf(log, sizeof(log), "%s/regroup-%d.log", dir, runs++);
    return test_run_output(argv, log, 30000, out, cap);
}

#define EP "--rdzv-endpoint", etcd.srv.endpoints, "--rdzv-id", "job1"

/* The parent of a running process, or 0. */
static pid_t parent_of(pid_t pid)
{
    char path[64];
    int ppid = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%*d %*s %*c %d", &ppid) != 1) {
            ppid = 0;
        }
        fclose(f);
    }
    return ppid;
}

/* The pid of agent i's one worker among the first n starts in s. */
static pid_t worker_of(int i, const start_t *s, int n)
{
    for (int k = 0; k < n; k++) {
        if (parent_of(s[k].pid) == agents[i]) {
            return s[k].pid;
        }
    }
    ck_abort_msg("agent %d has no worker among %d starts", i, n);
    return -1;
}

START_TEST(test_resize_on_node_loss_and_return)
{
    static start_t s[256];
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=1,join_timeout=60";

    for (int i = 0; i < 3; i++) {
        start_agent(i, EP, "--nnodes=2:3", "--nproc-per-node=2", (char *)conf, NULL);
    }
    int at = wait_starts(0, 6, 6, 0, 30000);
    int n = read_starts(s, 256);
    /* The ranks of a round are 0..5, each once. */
    int seen = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].world == 6) {
            seen |= 1 << s[i].rank;
        }
    }
    ck_assert_int_eq(seen, 0x3f);

    /* `regroup status` shows the round: members, ranks and world size. */
    char ep[600];
    char out[4096];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    ck_assert_int_eq(run_regroup((char *[]){"status", ep, "--rdzv-id=job1", NULL}, out,
                                 sizeof(out)), 0);
    ck_assert_msg(strstr(out, "3 nodes, world size 6") != NULL && strstr(out, "4-5") != NULL,
                  "status says: %s", out);

    /* A node is lost: its workers die with it, the other two go on at world 4. */
    pid_t victim = agents[2];
    pid_t orphans[2];
    int k = 0;
    for (int i = 0; i < n && k < 2; i++) {
        if (parent_of(s[i].pid) == victim) {   /* the victim's workers */
            orphans[k++] = s[i].pid;
        }
    }
    ck_assert_int_eq(k, 2);
    kill(victim, SIGKILL);
    ck_assert_int_eq(wait_exit(victim, 5000), 128 + SIGKILL);
    ck_assert_msg(test_pid_gone(orphans[0], 5000) && test_pid_gone(orphans[1], 5000),
                  "the lost agent's workers outlived it");
    at = wait_starts(at, 4, 4, 0, 30000);

    /* It comes back: world 6 again, a membership change, so still restart 0. */
    start_agent(2, EP, "--nnodes=2:3", "--nproc-per-node=2", (char *)conf, NULL);
    wait_starts(at, 6, 6, 0, 30000);
    stop_workers();
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(wait_exit(agents[i], 20000), 0);
    }
}
END_TEST

/* Regression (found by the chaos soak): a node waiting to join a job at its maximum size must
 * not wait out its join timeout once the job has finished; it ends too, successfully. */
START_TEST(test_waiting_node_ends_with_the_job)
{
    start_agent(0, EP, "--nnodes=1", NULL);
    wait_starts(0, 1, 1, 0, 20000);
    start_agent(1, EP, "--nnodes=1", "--rdzv-conf=join_timeout=60", NULL);
    /* The second node waits (the job is at MAX); then the job's workers finish. */
    test_wait_file_contains(agent_log(1), "waiting to join", 20000);
    stop_workers();
    ck_assert_int_eq(wait_exit(agents[0], 20000), 0);
    ck_assert_int_eq(wait_exit(agents[1], 20000), 0);
    ck_assert(log_contains(1, "the job finished without this node"));
}
END_TEST

/* `regroup status` of a job whose workers all exited 0 says it is done, and when. */
START_TEST(test_status_of_a_finished_job)
{
    char ep[600];
    char out[4096];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    start_agent(0, EP, "--nproc-per-node=2", NULL);
    wait_starts(0, 2, 2, 0, 20000);
    ck_assert_int_eq(run_regroup((char *[]){"status", ep, "--rdzv-id=job1", NULL}, out,
                                 sizeof(out)), 0);
    ck_assert_msg(strstr(out, "state:   running\n") != NULL, "status says: %s", out);
    stop_workers();
    ck_assert_int_eq(wait_exit(agents[0], 20000), 0);
    ck_assert_int_eq(run_regroup((char *[]){"status", ep, "--rdzv-id=job1", NULL}, out,
                                 sizeof(out)), 0);
    ck_assert_msg(strstr(out, "state:   done at 20") != NULL &&
                  strstr(out, " UTC (every node's workers exited 0)") != NULL &&
                  strstr(out, "last round 0: 1 nodes, world size 2") != NULL,
                  "status says: %s", out);
}
END_TEST

/* A job started by a regroup from before etcd layout 2 (its `round`, no `layout`): an agent
 * of this one refuses to join it at once, naming the job and what to do; `regroup status`
 * says which layout the job has. */
START_TEST(test_job_of_an_older_layout)
{
    char ep[600];
    char out[4096];
    rg_etcd_t *c;
    rg_etcd_params_t p = {.endpoints = etcd.srv.endpoints, .timeout_ms = 3000};
    rdzv_keys_t keys;
    char key[RDZV_KEY_MAX];
    ck_assert_int_eq(rdzv_keys_init(&keys, "old1"), RG_OK);
    ck_assert_int_eq(rdzv_keys_round(&keys, key, sizeof(key)), RG_OK);
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(c, key, "4", 0, 0, NULL), RG_OK);
    rg_etcd_destroy(c);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    int64_t t0 = rg_now_ns();
    int rc = run_regroup((char *[]){"--nnodes=1", "--nproc-per-node=1", ep, "--rdzv-id=old1",
                                    "--rdzv-conf=join_timeout=60", WORKER, NULL},
                         out, sizeof(out));
    ck_assert_int_ne(rc, 0);
    ck_assert_msg(strstr(out, "job old1") != NULL && strstr(out, "layout 1") != NULL &&
                  strstr(out, "--rdzv-id") != NULL, "regroup says: %s", out);
    ck_assert_msg(rg_now_ns() - t0 < 20000000000ll, "refused only after %.1f s",
                  (double)(rg_now_ns() - t0) / 1e9);   /* not at its 60 s join timeout */
    ck_assert_int_eq(run_regroup((char *[]){"status", ep, "--rdzv-id=old1", NULL}, out,
                                 sizeof(out)), 0);
    ck_assert_msg(strstr(out, "round:   4\n") != NULL &&
                  strstr(out, "layout:  1, not this regroup's 2") != NULL,
                  "status says: %s", out);
}
END_TEST

START_TEST(test_worker_kill_restarts_then_fails)
{
    static start_t s[64];
    start_agent(0, EP, "--nproc-per-node=2", "--max-restarts=1", NULL);
    wait_starts(0, 2, 2, 0, 20000);
    ck_assert_int_eq(read_starts(s, 64), 2);
    kill(s[0].pid, SIGKILL);
    /* Every worker restarts with TORCHELASTIC_RESTART_COUNT one higher. */
    int at = wait_starts(0, 2, 2, 1, 20000);
    ck_assert_int_ge(read_starts(s, 64), at);
    kill(s[at - 1].pid, SIGKILL);
    /* Past --max-restarts the job fails with the report. */
    ck_assert_int_eq(wait_exit(agents[0], 20000), 1);
    ck_assert(log_contains(0, "failed more than --max-restarts=1"));
    ck_assert(log_contains(0, "SIGKILL"));
    /* `regroup status` says it failed, and when. */
    char ep[600];
    char out[4096];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    ck_assert_int_eq(run_regroup((char *[]){"status", ep, "--rdzv-id=job1", NULL}, out,
                                 sizeof(out)), 0);
    ck_assert_msg(strstr(out, "state:   failed at 20") != NULL &&
                  strstr(out, "UTC (workers failed more than --max-restarts=1 times)") != NULL,
                  "status says: %s", out);
}
END_TEST

START_TEST(test_failure_report_has_error_file_and_stderr)
{
    setenv("RG_TEST_FAIL_RANK", "1", 1);
    start_agent(0, EP, "--nproc-per-node=2", NULL);
    ck_assert_int_eq(wait_exit(agents[0], 20000), 1);
    ck_assert(log_contains(0, "RuntimeError: rank 1 failed on purpose"));
    ck_assert(log_contains(0, "| rank 1 fails on purpose"));
    ck_assert(log_contains(0, "exit 3"));
}
END_TEST

START_TEST(test_sigterm_regroups_before_ttl)
{
    /* A 30 s lease: only the revoke on SIGTERM can make the survivor regroup in time. */
    const char *conf = "--rdzv-conf=lease_ttl=30,last_call_timeout=1";
    start_agent(0, EP, "--nnodes=1:2", "--nproc-per-node=1", (char *)conf, NULL);
    start_agent(1, EP, "--nnodes=1:2", "--nproc-per-node=1", (char *)conf, NULL);
    int at = wait_starts(0, 2, 2, 0, 20000);
    uint64_t t0 = rg_now_ns();
    kill(agents[1], SIGTERM);
    ck_assert_int_eq(wait_exit(agents[1], 10000), 128 + SIGTERM);
    wait_starts(at, 1, 1, 0, 10000);
    ck_assert_uint_lt(rg_now_ns() - t0, 15000000000ull);
    stop_workers();
    ck_assert_int_eq(wait_exit(agents[0], 20000), 0);
}
END_TEST

/* A scheduler that stops a node (slurmstepd's proctrack/linuxproc) signals the workers and
 * the agent in no set order: a worker dead of SIGTERM before its agent's own SIGTERM is part
 * of the node's stop, not a failure (with --max-restarts=0 it failed a requeued job). The
 * agent's SIGTERM here comes only once the agent has reaped the worker. */
START_TEST(test_node_stop_that_reaches_a_worker_first_is_no_failure)
{
    static start_t s[8];
    start_agent(0, EP, "--nproc-per-node=1", NULL);
    wait_starts(0, 1, 1, 0, 20000);
    ck_assert_int_eq(read_starts(s, 8), 1);
    kill(s[0].pid, SIGTERM);
    uint64_t until = rg_now_ns() + 10000000000ull;
    while (kill(s[0].pid, 0) == 0 && rg_now_ns() < until) {
        rg_sleep_ms(1);   /* a zombie until its agent reaps it */
    }
    ck_assert_msg(kill(s[0].pid, 0) != 0, "the agent did not reap its worker in 10 s");
    kill(agents[0], SIGTERM);
    ck_assert_int_eq(wait_exit(agents[0], 20000), 128 + SIGTERM);
    ck_assert(log_contains(0, "not counted as a failure"));
    ck_assert(!log_contains(0, "failed more than --max-restarts"));
    char ep[600];
    char out[4096];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    ck_assert_int_eq(run_regroup((char *[]){"status", ep, "--rdzv-id=job1", NULL}, out,
                                 sizeof(out)), 0);
    ck_assert_msg(strstr(out, "failed") == NULL, "status says: %s", out);
}
END_TEST

/* In place, a replacement that became ready after its agent registered for a round is no
 * member of that round: the round closed with the count the agent registered, and the ranks
 * after this node's are other nodes'. Given one, two workers were the same rank of a round
 * (seen in the quick in-place chaos run: a survivor could never connect, 60 s). It waits
 * for the next round, which is the next planned change (ready_seen). */
START_TEST(test_inplace_assign_keeps_to_the_round_count)
{
    static launcher_inplace_t ip;
    static launcher_workers_t ws;
    rg_notice_host_t nh;
    rg_rdzv_assignment_t *asg = calloc(1, sizeof(*asg));

    ck_assert_ptr_nonnull(asg);
    ip.pipe_r = -1;
    launcher_inplace_reset(&ip, 2);
    ws.n = 2;
    ws.w[0].running = ws.w[1].running = true;
    ip.state[1] = INPLACE_READY;   /* ready since this node registered with 1 */
    ck_assert_int_eq(rg_notice_host_create(&nh, 5000), RG_OK);
    asg->round = 7;
    asg->world_size = 3;
    asg->n_members = 2;
    asg->group_rank = 1;
    asg->rank_offset = 2;
    asg->members[0].nproc = 2;
    asg->members[1].nproc = 1;
    launcher_inplace_assign(&ip, &ws, &nh, asg, 0x1234);
    ck_assert_int_eq(ws.w[0].rank, 2);
    ck_assert_int_eq(ip.state[0], INPLACE_IN_ROUND);
    ck_assert_int_eq(ip.state[1], INPLACE_READY);
    ck_assert(ip.ready_seen);
    /* A member with no workers in the round (its only one died): nobody gets its offset. */
    ip.state[0] = INPLACE_PENDING;
    asg->round = 8;
    asg->members[1].nproc = 0;
    asg->world_size = 2;
    launcher_inplace_assign(&ip, &ws, &nh, asg, 0x1234);
    ck_assert_int_eq(ip.state[1], INPLACE_READY);
    /* The next round counts both: the survivor first, then the replacement. */
    ip.state[0] = INPLACE_IN_ROUND;
    asg->round = 9;
    asg->members[1].nproc = 2;
    asg->world_size = 4;
    launcher_inplace_assign(&ip, &ws, &nh, asg, 0x1234);
    ck_assert_int_eq(ws.w[0].rank, 2);
    ck_assert_int_eq(ws.w[1].rank, 3);
    ck_assert_int_eq(ip.state[1], INPLACE_IN_ROUND);
    ck_assert(!ip.ready_seen);
    rg_notice_host_destroy(&nh);
    free(asg);
}
END_TEST

/* A child in a process group of its own (the hang check kills a worker's group) that ends by
 * itself within 60 s whatever happens to the test: spinning, or waiting. */
static pid_t hang_child(bool spin)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        alarm(60);
        for (;;) {
            if (!spin) {
                pause();
            }
        }
    }
    ck_assert_int_gt(pid, 0);
    setpgid(pid, pid);
    return pid;
}

/* The hang check kills a worker whose heartbeat is stale when its process is stopped, and
 * spares one that still gets CPU time: a loaded machine can starve the beat thread past
 * hang_timeout (false alarms at load 20 without this). */
START_TEST(test_hang_check_spares_a_running_worker)
{
    static launcher_workers_t ws;
    static rg_agent_params_t cfg;
    rg_beat_host_t beat;
    int st;

    cfg.hang_ms = 200;
    ck_assert_int_eq(rg_beat_host_create(&beat, 2), RG_OK);
    pid_t spin = hang_child(true);
    pid_t stopped = hang_child(false);
    ck_assert_int_eq(kill(stopped, SIGSTOP), 0);
    ck_assert_int_eq(waitpid(stopped, &st, WUNTRACED), stopped);
    ck_assert(WIFSTOPPED(st));
    pid_t pids[2] = {spin, stopped};
    int64_t now = (int64_t)(rg_now_ns() / 1000000ull);
    ws.n = 2;
    for (int i = 0; i < 2; i++) {
        ws.w[i] = (launcher_worker_t){.pid = pids[i], .local_rank = i, .rank = i,
                                      .running = true};
        atomic_store(&beat.page->slots[i].beat_ms, (uint64_t)(now - 10000));   /* stale */
        atomic_store(&beat.page->slots[i].pid, (int32_t)pids[i]);
    }
    ck_assert_int_eq(launcher_hang_check(&ws, &beat, &cfg), 1);   /* the stopped one */
    ck_assert_int_eq(waitpid(stopped, &st, 0), stopped);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    ws.w[1].running = false;
    /* The spinning one, looked at over more than three timeouts: never hung. */
    uint64_t until = rg_now_ns() + 3 * (uint64_t)cfg.hang_ms * 1000000ull;
    while (rg_now_ns() < until) {
        ck_assert_int_eq(launcher_hang_check(&ws, &beat, &cfg), 0);
        rg_sleep_ms(TEST_POLL_MS);
    }
    ck_assert_int_eq(kill(spin, 0), 0);
    kill(spin, SIGKILL);
    ck_assert_int_eq(waitpid(spin, &st, 0), spin);
    rg_beat_host_destroy(&beat);
}
END_TEST

START_TEST(test_standalone_leaves_nothing)
{
    stop_workers();   /* the workers finish at once */
    pid_t pid = start_agent(0, "--standalone", "--nproc-per-node=2", NULL);
    ck_assert_int_eq(wait_exit(pid, 20000), 0);
    /* The agent says where its etcd ran; both must be gone. */
    char path[300];
    char line[1024];
    int etcd_pid = 0;
    char root[512] = "";
    snprintf(path, sizeof(path), "%s/agent0.log", dir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        char *p = strstr(line, "private etcd at ");
        if (p != NULL) {
            ck_assert_int_eq(sscanf(strstr(p, "(pid "), "(pid %d, data %511[^)])", &etcd_pid,
                                    root), 2);
        }
    }
    fclose(f);
    ck_assert_int_gt(etcd_pid, 0);
    ck_assert_msg(test_pid_gone(etcd_pid, 2000), "etcd pid %d still runs", etcd_pid);
    struct stat sb;
    ck_assert_msg(stat(root, &sb) != 0, "data dir %s still exists", root);
}
END_TEST

START_TEST(test_log_dir_tee_and_redirects)
{
    char logdir[300];
    char arg[320];
    char path[512];
    stop_workers();
    snprintf(logdir, sizeof(logdir), "%s/logs", dir);
    snprintf(arg, sizeof(arg), "--log-dir=%s", logdir);
    /* --tee: to the files and to the console, prefixed with the rank. */
    pid_t pid = start_agent(0, "--standalone", "--nproc-per-node=2", arg, "--tee=3", NULL);
    ck_assert_int_eq(wait_exit(pid, 20000), 0);
    ck_assert(log_contains(0, "[rank 1]: rank 1 done"));
    snprintf(path, sizeof(path), "%s/none/round_0/rank_1/stdout.log", logdir);
    ck_assert_msg(test_file_contains(path, "rank 1 done"), "%s", path);
    /* --redirects: to the files only. */
    pid = start_agent(1, "--standalone", "--nproc-per-node=1", arg, "--redirects=1", NULL);
    ck_assert_int_eq(wait_exit(pid, 20000), 0);
    ck_assert(!log_contains(1, "rank 0 done"));
    snprintf(path, sizeof(path), "%s/none/round_0/rank_0/stdout.log", logdir);
    ck_assert(test_file_contains(path, "rank 0 done"));
}
END_TEST

static int run_cmd(const char *args, char *out, size_t len);

/* --tee without --log-dir, as torchrun takes it: a temporary log directory, said once and
 * kept after the job. */
START_TEST(test_tee_without_log_dir)
{
    char line[1024];
    char logdir[512] = "";
    char path[700];
    int said = 0;
    stop_workers();
    pid_t pid = start_agent(0, "--standalone", "--nproc-per-node=2", "--tee=3", NULL);
    ck_assert_int_eq(wait_exit(pid, 20000), 0);
    ck_assert(log_contains(0, "[rank 1]: rank 1 done"));
    FILE *f = fopen(agent_log(0), "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "--tee=3 without --log-dir: the workers' logs go to ");
        if (p != NULL) {
            said++;
            ck_assert_int_eq(sscanf(strstr(p, " go to ") + 7, "%511s", logdir), 1);
        }
    }
    fclose(f);
    ck_assert_int_eq(said, 1);
    ck_assert(log_contains(0, "(kept after the job)"));
    snprintf(path, sizeof(path), "%s/none/round_0/rank_1/stdout.log", logdir);
    ck_assert_msg(test_file_contains(path, "rank 1 done"), "%s", path);
    test_rmtree(logdir);
}
END_TEST

/* torchrun's per-local-rank maps: -r 1:1 sends only local rank 1's stdout to its file,
 * --tee 0:3 tees only local rank 0's. */
START_TEST(test_per_rank_redirects_and_tee)
{
    char logdir[300];
    char arg[320];
    char path[512];
    char out[4096];
    stop_workers();
    snprintf(logdir, sizeof(logdir), "%s/logs", dir);
    snprintf(arg, sizeof(arg), "--log-dir=%s", logdir);
    pid_t pid = start_agent(0, "--standalone", "--nproc-per-node=2", arg, "--tee", "0:3", "-r",
                            "1:1", NULL);
    ck_assert_int_eq(wait_exit(pid, 20000), 0);
    ck_assert(log_contains(0, "[rank 0]: rank 0 done"));
    ck_assert(!log_contains(0, "rank 1 done"));
    snprintf(path, sizeof(path), "%s/none/round_0/rank_0/stdout.log", logdir);
    ck_assert_msg(test_file_contains(path, "rank 0 done"), "%s", path);
    snprintf(path, sizeof(path), "%s/none/round_0/rank_1/stdout.log", logdir);
    ck_assert_msg(test_file_contains(path, "rank 1 done"), "%s", path);
    /* --print-config shows the maps as given. */
    ck_assert_int_eq(run_cmd("--print-config --standalone --tee=0:3,1:1 -r 1:2", out,
                             sizeof(out)), 0);
    ck_assert_msg(strstr(out, "tee                  0:3,1:1 ") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "redirects            1:2 ") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "(a new temporary directory)") != NULL, "%s", out);
}
END_TEST

/* A program that cannot be executed ends the job at once, named with the reason, without
 * burning restarts or printing a table of worker failures. */
START_TEST(test_program_that_cannot_run)
{
    char out[4096];
    char cmd[600];
    char path[300];
    uint64_t t0 = rg_now_ns();
    int rc = run_cmd("--standalone --nproc-per-node=2 --max-restarts=3 /nonexistent/program",
                     out, sizeof(out));
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "regroup: cannot run /nonexistent/program: No such file or "
                              "directory\n") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "failed") == NULL && strstr(out, "restart") == NULL, "%s", out);
    ck_assert_uint_lt(rg_now_ns() - t0, 10000000000ull);
    /* Found but not executable: the reason is exec's. */
    snprintf(path, sizeof(path), "%s/not-executable", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "--standalone --max-restarts=3 %s", path);
    ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 1);
    ck_assert_msg(strstr(out, ": Permission denied\n") != NULL && strstr(out, path) != NULL,
                  "%s", out);
}
END_TEST

/* ---- --preload: workers forked from a fork server that imported the modules ---------- */

#define PY_WORKER RG_TEST_DATA "/rg_test_forked.py"

typedef struct {
    int   restart;
    int   rank;
    pid_t pid;
    pid_t ppid;
    int   preloaded;
    char  arg[64];
    int   fds_ok;
    int   path0_ok;
} py_start_t;

static bool parse_py_start(const char *line, void *out, int n)
{
    py_start_t *s = (py_start_t *)out + n;
    int pid;
    int ppid;
    if (sscanf(line, "start %d %d %d %d %d %63s %d %d", &s->restart, &s->rank, &pid, &ppid,
               &s->preloaded, s->arg, &s->fds_ok, &s->path0_ok) != 8) {
        return false;
    }
    s->pid = pid;
    s->ppid = ppid;
    return true;
}

/* rg_test_forked.py's starts, from dir/events-py; returns how many (at most max). */
static int read_py_starts(py_start_t *out, int max)
{
    return read_events("events-py", parse_py_start, out, max);
}

/* `regroup --standalone --nproc-per-node=2 --preload=json ... python3 rg_test_forked.py
 * ARG`, with output in dir/agent0.log. */
static pid_t start_preloaded(const char *max_restarts)
{
    char log[300];
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=2", (char *)max_restarts,
                    "--preload=json", "--no-python", "/usr/bin/python3", PY_WORKER, "xyz",
                    NULL};
    snprintf(log, sizeof(log), "%s/agent0.log", dir);
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    pid_t pid = test_spawn(argv, log);
    unsetenv("REGROUP_LOG_LEVEL");
    agents[0] = pid;
    return pid;
}

/* The fork server's pid, from the agent's log line, or 0. */
static pid_t fork_server_pid(void)
{
    char line[1024];
    int pid = 0;
    FILE *f = fopen(agent_log(0), "r");
    while (f != NULL && pid == 0 && fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "fork server (pid ");
        if (p != NULL) {
            pid = atoi(p + strlen("fork server (pid "));
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return pid;
}

static bool gone(pid_t pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH;
}

/* Every worker, the first ones and those of the restart after rank 1's failure, is forked
 * from one interpreter that imported json before it: each is the agent's child (it reaps
 * and signals them as the workers it execs), runs the script as python3 would (its
 * arguments, sys.path[0] its directory, the descriptors its variables name), and a failure
 * is reported with the script's own traceback. Nothing is left after the job. */
START_TEST(test_preload_forks_every_start)
{
    static py_start_t s[16];
    setenv("RG_TEST_FAIL_RANK", "1", 1);
    pid_t agent = start_preloaded("--max-restarts=1");
    unsetenv("RG_TEST_FAIL_RANK");
    TEST_WAIT_UNTIL(read_py_starts(s, 16) >= 4, 60000, "4 starts (2, then 2 after the "
                    "restart): have %d", read_py_starts(s, 16));
    stop_workers();
    ck_assert_int_eq(wait_exit(agent, 30000), 0);
    int n = read_py_starts(s, 16);
    ck_assert_int_eq(n, 4);
    int per_restart[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        ck_assert_msg(s[i].ppid == agent, "start %d: parent %d, not the agent %d", i,
                      (int)s[i].ppid, (int)agent);
        ck_assert_msg(s[i].preloaded == 1, "start %d: json was not preloaded", i);
        ck_assert_str_eq(s[i].arg, "xyz");
        ck_assert_int_eq(s[i].fds_ok, 1);
        ck_assert_int_eq(s[i].path0_ok, 1);
        ck_assert(s[i].restart == 0 || s[i].restart == 1);
        per_restart[s[i].restart]++;
        ck_assert_msg(gone(s[i].pid), "worker %d is still there", (int)s[i].pid);
    }
    ck_assert_int_eq(per_restart[0], 2);
    ck_assert_int_eq(per_restart[1], 2);
    pid_t server = fork_server_pid();
    ck_assert_msg(server > 0, "no fork server in the log");
    ck_assert_msg(gone(server), "the fork server %d outlived the job", (int)server);
    ck_assert(log_contains(0, "RuntimeError: rank 1 fails on purpose"));
    ck_assert(log_contains(0, "rg_test_forked.py\", line"));
    ck_assert_msg(!log_contains(0, "File \"<string>\"") && !log_contains(0, "runpy"),
                  "the traceback shows the fork server's frames");
    ck_assert(!log_contains(0, "start by exec"));
}
END_TEST

/* An agent SIGKILLed takes its forked workers and its fork server with it, as it does the
 * workers it execs (their parent-death signal, set once the agent is their parent). */
START_TEST(test_preload_workers_die_with_the_agent)
{
    static py_start_t s[16];
    pid_t agent = start_preloaded("--max-restarts=0");
    TEST_WAIT_UNTIL(read_py_starts(s, 16) >= 2, 60000, "2 starts: have %d",
                    read_py_starts(s, 16));
    pid_t server = fork_server_pid();
    ck_assert_int_gt(server, 0);
    kill(agent, SIGKILL);
    ck_assert_int_eq(wait_exit(agent, 10000), 128 + SIGKILL);
    TEST_WAIT_UNTIL(gone(s[0].pid) && gone(s[1].pid) && gone(server), 10000,
                    "workers %d %d or the fork server %d outlived their agent", (int)s[0].pid,
                    (int)s[1].pid, (int)server);
}
END_TEST

/* What --preload cannot do is said at once: a module that does not import (the job ends
 * without burning restarts), a program that is not Python, a script that is not there,
 * what is no module name. */
START_TEST(test_preload_bad_input)
{
    char out[4096];
    uint64_t t0 = rg_now_ns();
    ck_assert_int_eq(run_cmd("--standalone --nproc-per-node=2 --max-restarts=3 "
                             "--preload=json,no_such_module_rg --no-python /usr/bin/python3 "
                             PY_WORKER, out, sizeof(out)), 1);
    ck_assert_msg(strstr(out, "--preload=json,no_such_module_rg: /usr/bin/python3: cannot "
                              "import no_such_module_rg: ModuleNotFoundError") != NULL,
                  "%s", out);
    ck_assert_msg(strstr(out, "restart") == NULL && strstr(out, "failed") == NULL, "%s", out);
    ck_assert_uint_lt(rg_now_ns() - t0, 20000000000ull);
    ck_assert_int_eq(run_cmd("--standalone --preload=json /bin/true", out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "--preload: /bin/true is not a Python program") != NULL, "%s",
                  out);
    ck_assert_int_eq(run_cmd("--standalone --preload=json /usr/bin/python3 -c pass", out,
                             sizeof(out)), 2);
    ck_assert_msg(strstr(out, "option -c is not one a fork server can pass on") != NULL, "%s",
                  out);
    /* A node address the closed record of a round could not hold. */
    ck_assert_int_eq(run_cmd("--standalone --local-addr=a\"b x.py", out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "expected a host name or IP address of 1 to 255 characters") !=
                  NULL, "%s", out);
    char longer[300];
    char cmd[400];
    memset(longer, 'a', 240);
    longer[240] = '\0';
    snprintf(cmd, sizeof(cmd), "--nnodes=1:4096 --local-addr=%s x.py", longer);
    ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "of 1 to 236 characters") != NULL, "%s", out);
    ck_assert_int_eq(run_cmd("--standalone --preload=torch;rm /usr/bin/python3 x.py", out,
                             sizeof(out)), 2);
    ck_assert_msg(strstr(out, "expected module names separated by commas") != NULL, "%s", out);
    ck_assert_int_eq(run_cmd("--standalone --max-restarts=3 --preload=json --no-python "
                             "/usr/bin/python3 /nonexistent/script.py", out, sizeof(out)), 1);
    ck_assert_msg(strstr(out, "regroup: cannot run /nonexistent/script.py: No such file or "
                              "directory\n") != NULL, "%s", out);
}
END_TEST

/* The pid of a process (not this one) whose command line has text in an argument, or 0. */
static pid_t process_with_arg(const char *text)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    pid_t found = 0;
    ck_assert_ptr_nonnull(d);
    while (found == 0 && (de = readdir(d)) != NULL) {
        char path[300];
        char cmd[8192];
        int pid = atoi(de->d_name);
        if (pid <= 0 || pid == (int)getpid()) {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue;
        }
        size_t n = fread(cmd, 1, sizeof(cmd) - 1, f);
        fclose(f);
        cmd[n] = '\0';
        for (size_t o = 0; o < n && found == 0; o += strlen(cmd + o) + 1) {
            if (strstr(cmd + o, text) != NULL) {
                found = pid;
            }
        }
    }
    closedir(d);
    return found;
}

/* torchrun's multi-node command line: --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT. The agent
 * on the endpoint's host serves the rendezvous (an etcd on that port), says that it is a
 * single point of failure, and stops it when the job is over; the other only connects. */
START_TEST(test_c10d_agent_serves_the_rendezvous)
{
    static start_t s[16];
    char addr[64];
    char ep[80];
    char line[1024];
    int serving = -1;
    int etcd_pid = 0;
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", rg_free_port());
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", addr);
    stop_workers();   /* the workers finish at once */
    pid_t a0 = start_agent(0, "--rdzv-backend=c10d", ep, "--nnodes=2", "--nproc-per-node=1",
                           NULL);
    pid_t a1 = start_agent(1, "--rdzv-backend", "c10d", ep, "--nnodes=2", "--nproc-per-node=1",
                           NULL);
    ck_assert_int_eq(wait_exit(a0, 60000), 0);
    ck_assert_int_eq(wait_exit(a1, 60000), 0);
    ck_assert_int_eq(read_starts(s, 16), 2);
    ck_assert_int_eq(s[0].world, 2);
    ck_assert_int_eq(s[1].world, 2);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(agent_log(i), "r");
        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f) != NULL) {
            const char *p = strstr(line, "this agent serves the rendezvous at http://");
            if (p != NULL) {
                ck_assert_msg(serving < 0, "both agents serve: %s", line);
                serving = i;
                ck_assert_ptr_nonnull(strstr(p, addr));
                ck_assert_int_eq(sscanf(strstr(p, "(a single-member etcd, pid "),
                                        "(a single-member etcd, pid %d)", &etcd_pid), 1);
                ck_assert_ptr_nonnull(strstr(p, "single point of failure"));
                ck_assert_ptr_nonnull(strstr(p, "--rdzv-backend=etcd"));
            }
        }
        fclose(f);
    }
    ck_assert_int_ge(serving, 0);
    ck_assert_int_gt(etcd_pid, 0);
    ck_assert_msg(test_pid_gone(etcd_pid, 5000), "etcd pid %d still runs", etcd_pid);
    ck_assert(test_pid_gone(s[0].pid, 5000) && test_pid_gone(s[1].pid, 5000));
    /* Nothing is left that was started for the endpoint (the etcd of an agent that lost the
     * race to serve it included). */
    pid_t left = process_with_arg(addr);
    ck_assert_msg(left == 0, "pid %d still runs with %s", (int)left, addr);
    /* --print-config says so. */
    char out[4096];
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "--print-config --rdzv-backend=c10d %s", ep);
    ck_assert_int_eq(run_cmd(cmd, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "rdzv_backend         c10d ") != NULL, "%s", out);
    ck_assert_int_eq(run_cmd("--print-config --rdzv-backend=c10d --rdzv-endpoint=node1", out,
                             sizeof(out)), 0);
    ck_assert_msg(strstr(out, "rdzv_endpoint        node1:29400 ") != NULL, "%s", out);
}
END_TEST

/* The serving agent whose own workers are done keeps the rendezvous up until the other agent
 * has left, then stops it. */
START_TEST(test_c10d_serving_agent_waits_for_the_others)
{
    static start_t s[16];
    char ep[80];
    char dir1[300];
    char path[400];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=127.0.0.1:%d", rg_free_port());
    stop_workers();   /* agent 0's worker finishes at once; agent 1's waits for dir1/stop */
    pid_t a0 = start_agent(0, "--rdzv-backend=c10d", ep, "--nnodes=2", NULL);
    test_wait_file_contains(agent_log(0), "this agent serves the rendezvous", 20000);
    snprintf(dir1, sizeof(dir1), "%s/node1", dir);
    ck_assert_int_eq(mkdir(dir1, 0755), 0);
    setenv("RG_TEST_DIR", dir1, 1);
    pid_t a1 = start_agent(1, "--rdzv-backend=c10d", ep, "--nnodes=2", NULL);
    setenv("RG_TEST_DIR", dir, 1);
    test_wait_file_contains(agent_log(0), "waiting up to 300 s for the other agents (1)", 20000);
    TEST_HOLD_FOR(kill(a0, 0) == 0 && waitpid(a0, NULL, WNOHANG) == 0, 1000,
                  "the serving agent ended while the other was in the job");
    snprintf(path, sizeof(path), "%s/stop", dir1);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(wait_exit(a1, 20000), 0);
    ck_assert_int_eq(wait_exit(a0, 20000), 0);
    ck_assert_int_eq(read_starts(s, 16), 1);
    ck_assert(!log_contains(1, "unreachable"));
}
END_TEST

static int run_bad(const char *a1, const char *a2, const char *expect)
{
    char out[2048] = "";
    char *args[] = {(char *)a1, a2 ? (char *)a2 : "/bin/true", a2 ? "/bin/true" : NULL, NULL};
    int st = run_regroup(args, out, sizeof(out));
    ck_assert_msg(strstr(out, expect) != NULL, "'regroup %s %s' says '%s', not '%s'", a1,
                  a2 ? a2 : "", out, expect);
    ck_assert_msg(strchr(out, '\n') == out + strlen(out) - 1, "one line: %s", out);
    return st;
}

START_TEST(test_bad_options)
{
    ck_assert_int_eq(run_bad("--nnodes=3:2", "--standalone", "--nnodes=3:2"), 2);
    ck_assert_int_eq(run_bad("--nproc_per_node=0", "--standalone", "--nproc-per-node=0"), 2);
    ck_assert_int_eq(run_bad("--bogus", NULL, "--bogus"), 2);
    ck_assert_int_eq(run_bad("--standalone", "--rdzv-endpoint=127.0.0.1:1", "--standalone"), 2);
    ck_assert_int_eq(run_bad("--rdzv-conf=nope=1", "--standalone", "nope"), 2);
    ck_assert_int_eq(run_bad("--max-restarts=-1", "--standalone", "--max-restarts"), 2);
    ck_assert_int_eq(run_bad("--rdzv-backend=zeus", "--standalone", "--rdzv-backend=zeus"), 2);
    ck_assert_int_eq(run_bad("--rdzv-backend=static", "--rdzv-endpoint=127.0.0.1:1",
                             "with --rdzv-backend=c10d --rdzv-endpoint=MASTER_ADDR:PORT"), 2);
    ck_assert_int_eq(run_bad("--master-addr=10.0.0.1", "--standalone",
                             "with --rdzv-backend=c10d --rdzv-endpoint=MASTER_ADDR:PORT"), 2);
    ck_assert_int_eq(run_bad("--rdzv-backend=c10d", "--rdzv-endpoint=a:1,b:2",
                             "--rdzv-backend=c10d takes one HOST[:PORT]"), 2);
    ck_assert_int_eq(run_bad("--rdzv-backend=c10d", "--rdzv-endpoint=a:0",
                             "expected a port from 1 to 65535"), 2);
    ck_assert_int_eq(run_bad("--nnodes=2", NULL, "--rdzv-endpoint is required"), 2);
    ck_assert_int_eq(run_bad("--standalone", "--nnodes=2", "--standalone"), 2);
    ck_assert_int_eq(run_bad("--tee=0:4", "--standalone", "--tee=0:4: expected 0 (none)"), 2);
    ck_assert_int_eq(run_bad("-r", "0:1,", "--redirects=0:1,: expected"), 2);
    /* Stragglers: a factor, a window, and eviction only in place. */
    ck_assert_int_eq(run_bad("--rdzv-conf=straggler_factor=2", "--standalone",
                             "straggler_factor=2: a straggler's node leaves as a preempted "
                             "one does"), 2);
    ck_assert_int_eq(run_bad("--rdzv-conf=straggler_factor=1", "--recovery=in-place",
                             "straggler_factor=1: expected 0 (off) or a factor in 1.1..1000"),
                     2);
    ck_assert_int_eq(run_bad("--rdzv-conf=straggler_factor=fast", "--recovery=in-place",
                             "straggler_factor: expected a number"), 2);
    ck_assert_int_eq(run_bad("--rdzv-conf=straggler_window=0.5", "--standalone",
                             "straggler_window=0.5: expected seconds in 1..86400"), 2);
}
END_TEST

/* Runs `regroup ARGS` (split on spaces) through run_regroup; its output into out. */
static int run_cmd(const char *args, char *out, size_t len)
{
    char buf[1024];
    char *argv[16];
    char *save = NULL;
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", args);
    for (char *tok = strtok_r(buf, " ", &save); tok != NULL && n < 15;
         tok = strtok_r(NULL, " ", &save)) {
        argv[n++] = tok;
    }
    argv[n] = NULL;
    return run_regroup(argv, out, len);
}

/* Each row says where its value came from: a flag, --rdzv-conf, a variable, the default. */
START_TEST(test_print_config_sources)
{
    char out[4096];
    setenv("REGROUP_MAX_RESTARTS", "4", 1);
    int rc = run_cmd("--print-config --nproc-per-node=2 --rdzv-conf=lease_ttl=7 --standalone",
                     out, sizeof(out));
    unsetenv("REGROUP_MAX_RESTARTS");
    ck_assert_int_eq(rc, 0);
    static const char *const rows[][3] = {
        {"nproc_per_node", "2", "flag"},
        {"lease_ttl", "7", "--rdzv-conf"},
        {"max_restarts", "4", "REGROUP_MAX_RESTARTS"},
        {"role", "default", "default"},
        {"rdzv_endpoint", "(private etcd)", "default"},
    };
    for (size_t i = 0; i < RG_ARRAY_SIZE(rows); i++) {
        char want[256];
        snprintf(want, sizeof(want), "%-20s %-40s %s\n", rows[i][0], rows[i][1], rows[i][2]);
        ck_assert_msg(strstr(out, want) != NULL, "no row '%s' in:\n%s", want, out);
    }
}
END_TEST

/* Every torchrun option: accepted (its --print-config row, or the run's exit status) or
 * refused with why (docs/torchrun-options.md is the same table in words). env is
 * "NAME=VALUE[;NAME=VALUE]" set for the run only; row is "setting|value|from" of
 * --print-config, or the text the output must hold. */
typedef struct {
    const char *env;
    const char *args;
    int         rc;
    const char *row;
    const char *text;
} opt_case_t;

static void env_apply(const char *env, bool set)
{
    char buf[256];
    char *save = NULL;
    if (env == NULL) {
        return;
    }
    snprintf(buf, sizeof(buf), "%s", env);
    for (char *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        *eq = '\0';
        if (set) {
            setenv(kv, eq + 1, 1);
        } else {
            unsetenv(kv);
        }
    }
}

START_TEST(test_torchrun_option_table)
{
    char cpus[16];
    char cpus_row[64];
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    snprintf(cpus, sizeof(cpus), "%d", CPU_COUNT(&set));
    snprintf(cpus_row, sizeof(cpus_row), "nproc_per_node|%s|flag", cpus);
    const opt_case_t cases[] = {
        /* PET_* variables, and who wins */
        {"PET_NPROC_PER_NODE=3", "--print-config --standalone", 0,
         "nproc_per_node|3|PET_NPROC_PER_NODE", NULL},
        {"PET_NPROC_PER_NODE=3", "--print-config --standalone --nproc-per-node=2", 0,
         "nproc_per_node|2|flag", NULL},
        {"PET_NPROC_PER_NODE=3;REGROUP_NPROC_PER_NODE=4", "--print-config --standalone", 0,
         "nproc_per_node|4|REGROUP_NPROC_PER_NODE", NULL},
        {"PET_MAX_RESTARTS=2;PET_MONITOR_INTERVAL=0.5;PET_ROLE=trainer",
         "--print-config --standalone", 0, "max_restarts|2|PET_MAX_RESTARTS", NULL},
        {"PET_ROLE=trainer", "--print-config --standalone", 0, "role|trainer|PET_ROLE", NULL},
        {"PET_NNODES=1:3;PET_RDZV_ENDPOINT=127.0.0.1:1;PET_RDZV_ID=j9",
         "--print-config", 0, "rdzv_id|j9|PET_RDZV_ID", NULL},
        {"PET_NNODES=1:3;PET_RDZV_ENDPOINT=127.0.0.1:1", "--print-config", 0,
         "nnodes|1:3|PET_NNODES", NULL},
        {"PET_STANDALONE=1;PET_RDZV_ENDPOINT=127.0.0.1:1", "--print-config", 0,
         "rdzv_endpoint|(private etcd)|default", NULL},
        {"PET_STANDALONE=1;REGROUP_RDZV_ENDPOINT=127.0.0.1:1", "--print-config", 0,
         "rdzv_endpoint|(private etcd)|default", NULL},
        {"PET_STANDALONE=maybe", "--print-config", 2, NULL,
         "PET_STANDALONE=maybe: expected 1 or 0"},
        {"PET_NPROC_PER_NODE=0", "--standalone /bin/true", 2, NULL, "PET_NPROC_PER_NODE=0:"},
        {"PET_MASTER_ADDR=10.0.0.1", "--standalone /bin/true", 2, NULL,
         "PET_MASTER_ADDR=10.0.0.1: torchrun's fixed membership"},
        /* --nproc-per-node=cpu|gpu|auto */
        {NULL, "--print-config --standalone --nproc-per-node=cpu", 0, cpus_row, NULL},
        {"CUDA_VISIBLE_DEVICES=0,1", "--print-config --standalone --nproc-per-node=gpu", 0,
         "nproc_per_node|2|flag", NULL},
        {"CUDA_VISIBLE_DEVICES=3", "--print-config --standalone --nproc-per-node=auto", 0,
         "nproc_per_node|1|flag", NULL},
        {"CUDA_VISIBLE_DEVICES=-1", "--print-config --standalone --nproc-per-node=auto", 0,
         cpus_row, NULL},
        {"CUDA_VISIBLE_DEVICES=-1", "--standalone --nproc-per-node=gpu /bin/true", 2, NULL,
         "--nproc-per-node=gpu: no CUDA device is visible"},
        {NULL, "--standalone --nproc-per-node=tpu /bin/true", 2, NULL,
         "or cpu, gpu or auto"},
        /* accepted as in torchrun */
        {NULL, "--print-config --standalone --max-restarts=3", 0, "max_restarts|3|flag", NULL},
        {NULL, "--print-config --standalone --monitor-interval=0.5", 0,
         "monitor_interval|0.500|flag", NULL},
        {NULL, "--print-config --standalone --role=trainer", 0, "role|trainer|flag", NULL},
        {NULL, "--print-config --standalone", 0, "rdzv_id|none|default", NULL},
        {NULL, "--standalone --no-python /bin/true", 0, NULL, NULL},
        {NULL, "--standalone -m --print-config", 0, NULL, "setting"},
        {NULL, "--print-config --standalone --local-ranks-filter=0,2", 0,
         "local_ranks_filter|0,2|flag", NULL},
        {NULL, "--standalone --local-ranks-filter=0,x /bin/true", 2, NULL,
         "--local-ranks-filter=0,x: expected local ranks"},
        {NULL, "--print-config --standalone --numa-binding=socket", 0,
         "numa_binding|socket|flag", NULL},
        {NULL, "--print-config --standalone", 0, "numa_binding|none|default", NULL},
        {NULL, "--print-config --standalone", 0, "preemption_notice|none|default", NULL},
        {NULL, "--print-config --standalone --preemption-notice=gce", 0,
         "preemption_notice|gce|flag", NULL},
        {NULL, "--print-config --standalone --preemption-notice=gce", 0,
         "metadata_url|http://169.254.169.254|default", NULL},
        {"REGROUP_METADATA_URL=http://127.0.0.1:9", "--print-config --standalone "
         "--preemption-notice=aws", 0, "metadata_url|http://127.0.0.1:9|REGROUP_METADATA_URL",
         NULL},
        {"REGROUP_PREEMPTION_NOTICE=azure", "--print-config --standalone", 0,
         "preemption_notice|azure|REGROUP_PREEMPTION_NOTICE", NULL},
        {NULL, "--standalone --preemption-notice=ibm /bin/true", 2, NULL,
         "--preemption-notice=ibm: expected aws, gce, azure, auto or none"},
        {"REGROUP_METADATA_URL=ftp://x", "--standalone --preemption-notice=aws /bin/true", 2,
         NULL, "REGROUP_METADATA_URL=ftp://x: expected http://HOST[:PORT]"},
        {NULL, "--standalone --numa-binding=everything /bin/true", 2, NULL,
         "expected node, socket, exclusive, core-complex or none"},
        {NULL, "--standalone --numa-binding=exclusive --nproc-per-node=256 /bin/true", 2, NULL,
         "usable cores for 256 local ranks"},
        /* accepted with no effect, or ignored with a warning */
        {NULL, "--print-config --standalone --start-method=fork", 0, NULL, "setting"},
        {NULL, "--standalone --start-method=thread /bin/true", 2, NULL,
         "expected spawn, fork or forkserver"},
        {NULL, "--print-config --standalone --event-log-handler=console", 0, NULL, "setting"},
        {NULL, "--print-config --standalone --signals-to-handle=SIGTERM", 0, NULL, "setting"},
        {NULL, "--print-config --standalone --node-rank=1", 0, NULL,
         "--node-rank=1 ignored: node ranks come from the rendezvous"},
        /* refused, saying why */
        {NULL, "--standalone --run-path x.py", 2, NULL,
         "--run-path: regroup runs PROGRAM as a process"},
        {"PET_RUN_PATH=1", "--standalone /bin/true", 2, NULL,
         "PET_RUN_PATH=1: regroup runs PROGRAM as a process"},
        {"PET_RUN_PATH=0", "--standalone --print-config", 0, NULL, "setting"},
        {NULL, "--standalone --logs-specs=my.Specs /bin/true", 2, NULL,
         "LogsSpecs plugins are Python classes"},
        {NULL, "--standalone --virtual-local-rank /bin/true", 2, NULL,
         "every worker gets its own LOCAL_RANK"},
        {NULL, "--standalone --master-port=29500 /bin/true", 2, NULL,
         "--rdzv-backend=c10d --rdzv-endpoint=MASTER_ADDR:PORT"},
        {NULL, "--rdzv-backend=static --rdzv-endpoint=127.0.0.1:1 /bin/true", 2, NULL,
         "--rdzv-backend=c10d --rdzv-endpoint=MASTER_ADDR:PORT"},
    };
    /* Every row is tried; each one that fails is said, then the test fails. */
    int failed = 0;
    for (size_t i = 0; i < RG_ARRAY_SIZE(cases); i++) {
        const opt_case_t *c = &cases[i];
        char out[8192];
        char want[256] = "";
        env_apply(c->env, true);
        int rc = run_cmd(c->args, out, sizeof(out));
        env_apply(c->env, false);
        if (c->row != NULL) {
            char k[64];
            char v[64];
            char f[64];
            ck_assert_int_eq(sscanf(c->row, "%63[^|]|%63[^|]|%63s", k, v, f), 3);
            snprintf(want, sizeof(want), "%-20s %-40s %s\n", k, v, f);
        }
        if (rc != c->rc || (want[0] && strstr(out, want) == NULL) ||
            (c->text != NULL && strstr(out, c->text) == NULL)) {
            fprintf(stderr, "[%s] regroup %s: exit %d (want %d), want '%s%s' in:\n%s\n",
                    c->env ? c->env : "", c->args, rc, c->rc, want, c->text ? c->text : "",
                    out);
            failed++;
        }
    }
    ck_assert_msg(failed == 0, "%d of %zu torchrun option rows failed (see stderr)", failed,
                  RG_ARRAY_SIZE(cases));
}
END_TEST

/* Each worker gets torchrun's environment (a script written for torchrun reads it), plus
 * OMP_NUM_THREADS=1 with several workers unless the user set it, as torchrun does. */
START_TEST(test_worker_environment)
{
    char out[4096];
    char path[400];
    char want[128];
    unsetenv("OMP_NUM_THREADS");
    int rc = run_regroup((char *[]){"--standalone", "--nproc-per-node=2", "--max-restarts=2",
                                    "--rdzv-id=envjob", "/bin/sh", "-c",
                                    "f=\"$RG_TEST_DIR/env.$LOCAL_RANK\"; env > \"$f\"; "
                                    "test -e /proc/$$/fd/$REGROUP_NOTICE_FD && "
                                    "echo notice-page-open >> \"$f\"", NULL},
                         out, sizeof(out));
    ck_assert_msg(rc == 0, "%s", out);
    for (int r = 0; r < 2; r++) {
        const char *fixed[] = {"WORLD_SIZE=2\n", "LOCAL_WORLD_SIZE=2\n", "GROUP_RANK=0\n",
                               "GROUP_WORLD_SIZE=1\n", "ROLE_WORLD_SIZE=2\n",
                               "ROLE_NAME=default\n", "MASTER_ADDR=127.0.0.1\n",
                               "TORCHELASTIC_RESTART_COUNT=0\n",
                               "TORCHELASTIC_MAX_RESTARTS=2\n",
                               "TORCHELASTIC_RUN_ID=envjob\n", "REGROUP_JOB_ID=envjob\n",
                               "REGROUP_ROUND=0\n", "OMP_NUM_THREADS=1\n", "MASTER_PORT=",
                               "TORCHELASTIC_ERROR_FILE=", "REGROUP_ETCD_ENDPOINTS=http",
                               /* the agent's notice page, inherited open (rg_notice.h) */
                               "REGROUP_NOTICE_FD=", "notice-page-open\n"};
        snprintf(path, sizeof(path), "%s/env.%d", dir, r);
        for (size_t i = 0; i < RG_ARRAY_SIZE(fixed); i++) {
            ck_assert_msg(test_file_line_starts(path, fixed[i]), "rank %d: no %s", r, fixed[i]);
        }
        const char *own[] = {"RANK", "LOCAL_RANK", "ROLE_RANK"};
        for (size_t i = 0; i < RG_ARRAY_SIZE(own); i++) {
            snprintf(want, sizeof(want), "%s=%d\n", own[i], r);
            ck_assert_msg(test_file_line_starts(path, want), "rank %d: no %s=%d", r, own[i], r);
        }
    }
    /* The user's own choice stands. */
    setenv("OMP_NUM_THREADS", "3", 1);
    rc = run_regroup((char *[]){"--standalone", "--nproc-per-node=2", "/bin/sh", "-c",
                                "env > \"$RG_TEST_DIR/omp.$LOCAL_RANK\"", NULL},
                     out, sizeof(out));
    unsetenv("OMP_NUM_THREADS");
    ck_assert_msg(rc == 0, "%s", out);
    snprintf(path, sizeof(path), "%s/omp.0", dir);
    ck_assert(test_file_line_starts(path, "OMP_NUM_THREADS=3\n"));
}
END_TEST

/* --local-ranks-filter: only those local ranks reach the console; the files have all. */
START_TEST(test_local_ranks_filter)
{
    char out[4096];
    char logs[300];
    char path[400];
    snprintf(logs, sizeof(logs), "--log-dir=%s/logs", dir);
    int rc = run_regroup((char *[]){"--standalone", "--nproc-per-node=3", "--tee=1", logs,
                                    "--local-ranks-filter=1", "/bin/sh", "-c",
                                    "echo hello from $LOCAL_RANK", NULL},
                         out, sizeof(out));
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(strstr(out, "[rank 1]: hello from 1") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "hello from 0") == NULL && strstr(out, "hello from 2") == NULL,
                  "%s", out);
    snprintf(path, sizeof(path), "%s/logs/none/round_0/rank_2/stdout.log", dir);
    ck_assert_msg(test_file_contains(path, "hello from 2"), "no %s", path);
}
END_TEST

/* --numa-binding=exclusive: each local rank on its own cores, none shared. */
START_TEST(test_numa_binding_exclusive)
{
    char out[4096];
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    if (CPU_COUNT(&set) < 2) {
        return;   /* one core: nothing to split (the refusal is in the option table) */
    }
    int rc = run_regroup((char *[]){"--standalone", "--nproc-per-node=2", "--tee=1",
                                    "--numa-binding=exclusive", "/bin/sh", "-c",
                                    "grep Cpus_allowed_list /proc/self/status", NULL},
                         out, sizeof(out));
    ck_assert_int_eq(rc, 0);
    char l0[64] = "";
    char l1[64] = "";
    const char *a = strstr(out, "[rank 0]: Cpus_allowed_list:");
    const char *b = strstr(out, "[rank 1]: Cpus_allowed_list:");
    ck_assert_msg(a && b && sscanf(a, "[rank 0]: Cpus_allowed_list: %63s", l0) == 1 &&
                  sscanf(b, "[rank 1]: Cpus_allowed_list: %63s", l1) == 1, "%s", out);
    /* Each a part of this process's CPUs, and no CPU in both. */
    cpu_set_t s0;
    cpu_set_t s1;
    const char *lists[] = {l0, l1};
    cpu_set_t *sets[] = {&s0, &s1};
    for (int k = 0; k < 2; k++) {
        CPU_ZERO(sets[k]);
        for (const char *p = lists[k]; *p;) {
            char *end;
            long lo = strtol(p, &end, 10);
            long hi = *end == '-' ? strtol(end + 1, &end, 10) : lo;
            for (long c = lo; c <= hi; c++) {
                CPU_SET((int)c, sets[k]);
            }
            p = *end == ',' ? end + 1 : end;
        }
    }
    cpu_set_t both;
    CPU_AND(&both, &s0, &s1);
    ck_assert_msg(CPU_COUNT(&s0) > 0 && CPU_COUNT(&s1) > 0 && CPU_COUNT(&both) == 0 &&
                  CPU_COUNT(&s0) + CPU_COUNT(&s1) < CPU_COUNT(&set) + 1,
                  "rank 0 on %s, rank 1 on %s", l0, l1);
}
END_TEST

/* A made-up /sys/devices/system: 2 NUMA nodes of 4 CPUs (0-3, 4-7), each 2 cores of 2
 * hyperthreads, one socket, one L3 per node. */
static void put(const char *root, const char *rel, const char *text)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    }
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void fake_sys(const char *root)
{
    char rel[128];
    char text[32];
    put(root, "node/online", "0-1\n");
    put(root, "node/node0/cpulist", "0-3\n");
    put(root, "node/node1/cpulist", "4-7\n");
    for (int c = 0; c < 8; c++) {
        snprintf(rel, sizeof(rel), "cpu/cpu%d/topology/thread_siblings_list", c);
        snprintf(text, sizeof(text), "%d-%d\n", c & ~1, (c & ~1) + 1);
        put(root, rel, text);
        snprintf(rel, sizeof(rel), "cpu/cpu%d/topology/physical_package_id", c);
        put(root, rel, "0\n");
        snprintf(rel, sizeof(rel), "cpu/cpu%d/cache/index3/shared_cpu_list", c);
        put(root, rel, c < 4 ? "0-3\n" : "4-7\n");
    }
}

/* "0-3" style, for messages and comparisons. */
static const char *set_str(const cpu_set_t *s)
{
    static char buf[8][64];
    static int next;
    char *b = buf[next++ % 8];
    size_t o = 0;
    b[0] = '\0';
    for (int c = 0; c < 64; c++) {
        if (CPU_ISSET(c, s)) {
            o += (size_t)snprintf(b + o, 64 - o, "%s%d", o ? "," : "", c);
        }
    }
    return b;
}

START_TEST(test_numa_binding_sets)
{
    char root[256];
    cpu_set_t all;
    cpu_set_t sets[8];
    test_tmpdir(root, sizeof(root), "sys");
    fake_sys(root);
    CPU_ZERO(&all);
    for (int c = 0; c < 8; c++) {
        CPU_SET(c, &all);
    }
    static const struct {
        rg_agent_numa_t numa;
        int nproc;
        const char *want[8];
    } cases[] = {
        {RG_AGENT_NUMA_NODE, 4, {"0,1,2,3", "0,1,2,3", "4,5,6,7", "4,5,6,7"}},
        {RG_AGENT_NUMA_SOCKET, 2, {"0,1,2,3,4,5,6,7", "0,1,2,3,4,5,6,7"}},
        {RG_AGENT_NUMA_EXCLUSIVE, 4, {"0,1", "2,3", "4,5", "6,7"}},
        {RG_AGENT_NUMA_EXCLUSIVE, 2, {"0,1,2,3", "4,5,6,7"}},
        {RG_AGENT_NUMA_CORE_COMPLEX, 4, {"0,1,2,3", "0,1,2,3", "4,5,6,7", "4,5,6,7"}},
    };
    for (size_t i = 0; i < RG_ARRAY_SIZE(cases); i++) {
        ck_assert_int_eq(launcher_numa_sets_at(root, cases[i].numa, &all, sets,
                                               cases[i].nproc), RG_OK);
        for (int r = 0; r < cases[i].nproc; r++) {
            ck_assert_msg(strcmp(set_str(&sets[r]), cases[i].want[r]) == 0,
                          "case %zu rank %d: %s, not %s", i, r, set_str(&sets[r]),
                          cases[i].want[r]);
        }
    }
    /* Only the usable CPUs: without 3, node 0's second core is 2 alone. */
    cpu_set_t some = all;
    CPU_CLR(3, &some);
    ck_assert_int_eq(launcher_numa_sets_at(root, RG_AGENT_NUMA_EXCLUSIVE, &some, sets, 4), RG_OK);
    ck_assert_str_eq(set_str(&sets[1]), "2");
    /* Three ranks a node on two cores: refused, saying so. */
    ck_assert_int_eq(launcher_numa_sets_at(root, RG_AGENT_NUMA_EXCLUSIVE, &all, sets, 6),
                     RG_EINVAL);
    ck_assert_msg(strstr(rg_last_error(), "NUMA node 0 has 2 usable cores for 3 local ranks"),
                  "%s", rg_last_error());
    /* No NUMA information: one node of every usable CPU. */
    ck_assert_int_eq(launcher_numa_sets_at("/nonexistent", RG_AGENT_NUMA_NODE, &some, sets, 2),
                     RG_OK);
    ck_assert_str_eq(set_str(&sets[0]), "0,1,2,4,5,6,7");
    test_rmtree(root);
}
END_TEST

/* A bad value from the environment is named as the variable, not as a flag. */
START_TEST(test_bad_environment_names_the_variable)
{
    char out[2048];
    setenv("REGROUP_NPROC_PER_NODE", "0", 1);
    int rc = run_cmd("--standalone /bin/true", out, sizeof(out));
    unsetenv("REGROUP_NPROC_PER_NODE");
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(out, "REGROUP_NPROC_PER_NODE=0") != NULL, "%s", out);
    setenv("REGROUP_RDZV_CONF", "lease_ttl=0", 1);
    rc = run_cmd("--standalone /bin/true", out, sizeof(out));
    unsetenv("REGROUP_RDZV_CONF");
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(out, "REGROUP_RDZV_CONF lease_ttl=0") != NULL, "%s", out);
}
END_TEST

START_TEST(test_etcd_unreachable)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=127.0.0.1:%d", rg_free_port());
    uint64_t t0 = rg_now_ns();
    pid_t pid = start_agent(0, ep, "--rdzv-conf=join_timeout=2", NULL);
    ck_assert_int_eq(wait_exit(pid, 15000), 1);
    ck_assert_uint_lt(rg_now_ns() - t0, 10000000000ull);
    ck_assert(log_contains(0, "unreachable"));
    ck_assert(log_contains(0, ep + strlen("--rdzv-endpoint=")));
}
END_TEST

/* Node 1 leaves on SIGTERM; its worker ignores SIGTERM, so it goes on until its work is done
 * (within the 60 s grace period). Returns agent 0's worker. */
static pid_t start_pair_and_leave(void)
{
    static start_t s[8];
    start_agent(0, EP, "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=0",
                "--rdzv-conf=last_call_timeout=1", NULL);
    setenv("RG_TEST_IGNORE_TERM", "1", 1);
    start_agent(1, EP, "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=0",
                "--rdzv-conf=last_call_timeout=1", "--grace-period=60", NULL);
    unsetenv("RG_TEST_IGNORE_TERM");
    wait_starts(0, 2, 2, 0, 30000);
    pid_t w0 = worker_of(0, s, read_starts(s, 8));
    kill(agents[1], SIGTERM);
    TEST_WAIT_UNTIL(log_contains(0, "leaves: SIGTERM"), 20000,
                    "agent 0 did not see node 1 leave");
    return w0;
}

/* A worker that fails while another node leaves, but whose failure that node does not explain
 * (its worker still runs), failed by itself: the failure counts, here against
 * --max-restarts=0, which ends the job. It was excused as part of the leaving. */
START_TEST(test_failure_while_another_node_leaves_counts)
{
    pid_t w0 = start_pair_and_leave();
    kill(w0, SIGKILL);
    ck_assert_int_eq(wait_exit(agents[0], 30000), 1);
    ck_assert(log_contains(0, "the failure is its worker's own"));
    ck_assert(log_contains(0, "failed more than --max-restarts=0"));
    ck_assert(!log_contains(0, "not counted as a failure"));
    stop_workers();   /* node 1's worker ends its work; the node leaves */
    ck_assert_int_eq(wait_exit(agents[1], 30000), 128 + SIGTERM);
}
END_TEST

/* The same failure, then the leaving node's worker ends (as when the worker lost its peer
 * there): explained by the leaving, not counted, and the job goes on without the node. */
START_TEST(test_failure_the_leaving_node_explains)
{
    static start_t s[8];
    pid_t w0 = start_pair_and_leave();
    pid_t w1 = worker_of(1, s, read_starts(s, 8));
    kill(w0, SIGKILL);
    kill(w1, SIGKILL);
    ck_assert_int_eq(wait_exit(agents[1], 30000), 128 + SIGTERM);
    wait_starts(2, 1, 1, -1, 30000);   /* after round 0's two starts: node 0 alone */
    ck_assert(log_contains(0, "not counted as a failure"));
    stop_workers();
    ck_assert_int_eq(wait_exit(agents[0], 30000), 0);
    ck_assert(!log_contains(0, "failed more than"));
}
END_TEST

/* A host name that does not resolve (RFC 2606's .invalid never does, and asks nothing of the
 * network beyond the local resolver) is said at once, not waited out to the join deadline;
 * with several endpoints the agent fails over, and fails at once only when none resolves. */
START_TEST(test_endpoint_that_does_not_resolve)
{
    char eps[700];
    uint64_t t0 = rg_now_ns();
    pid_t pid = start_agent(0, "--rdzv-endpoint=not-a-host.invalid:2379",
                            "--rdzv-conf=join_timeout=60", NULL);
    ck_assert_int_eq(wait_exit(pid, 30000), 1);
    ck_assert_uint_lt(rg_now_ns() - t0, 5000000000ull);
    ck_assert(log_contains(0, "the host name not-a-host.invalid does not resolve"));
    ck_assert(!log_contains(0, "deadline"));

    pid = start_agent(1, "--rdzv-endpoint=a.invalid:2379,http://b.invalid:2379",
                      "--rdzv-conf=join_timeout=60", NULL);
    ck_assert_int_eq(wait_exit(pid, 30000), 1);
    ck_assert_uint_lt(rg_now_ns() - t0, 10000000000ull);
    ck_assert(log_contains(1, "none of the endpoints' host names resolves (a.invalid, "
                              "b.invalid)"));

    /* One that resolves among them: the job runs on it. */
    snprintf(eps, sizeof(eps), "not-a-host.invalid:2379,%s", etcd.srv.endpoints);
    stop_workers();
    pid = start_agent(2, "--rdzv-endpoint", eps, "--rdzv-id", "job1", NULL);
    ck_assert_int_eq(wait_exit(pid, 30000), 0);
}
END_TEST

START_TEST(test_etcd_member_loss)
{
    test_etcd_t cluster;
    char ep[600];
    static start_t s[64];
    test_etcd_up(&cluster, &(test_etcd_opts_t){.members = 3, .extra_flags = TEST_ETCD_CLUSTER});
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", cluster.srv.endpoints);
    const char *conf = "--rdzv-conf=lease_ttl=5,last_call_timeout=1";
    start_agent(0, ep, "--rdzv-id=j3", "--nnodes=2", (char *)conf, NULL);
    start_agent(1, ep, "--rdzv-id=j3", "--nnodes=2", (char *)conf, NULL);
    wait_starts(0, 2, 2, 0, 30000);
    /* The first member is every client's first choice: kill it. */
    rg_etcd_server_kill(&cluster.srv, 0, SIGKILL);
    /* The job carries on through two lease TTLs (no worker restarts), then ends normally. */
    TEST_HOLD_FOR(read_starts(s, 64) == 2, 8000, "workers restarted after an etcd member died");
    stop_workers();
    ck_assert_int_eq(wait_exit(agents[0], 20000), 0);
    ck_assert_int_eq(wait_exit(agents[1], 20000), 0);
    ck_assert_int_eq(read_starts(s, 64), 2);
    test_etcd_down(&cluster);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("launcher");
    TCase *tc = tcase_create("agents");
    tcase_add_checked_fixture(tc, up, down);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_resize_on_node_loss_and_return);
    tcase_add_test(tc, test_worker_kill_restarts_then_fails);
    tcase_add_test(tc, test_status_of_a_finished_job);
    tcase_add_test(tc, test_job_of_an_older_layout);
    tcase_add_test(tc, test_waiting_node_ends_with_the_job);
    tcase_add_test(tc, test_failure_report_has_error_file_and_stderr);
    tcase_add_test(tc, test_sigterm_regroups_before_ttl);
    tcase_add_test(tc, test_node_stop_that_reaches_a_worker_first_is_no_failure);
    tcase_add_test(tc, test_failure_while_another_node_leaves_counts);
    tcase_add_test(tc, test_failure_the_leaving_node_explains);
    tcase_add_test(tc, test_endpoint_that_does_not_resolve);
    suite_add_tcase(s, tc);
    TCase *tc2 = tcase_create("standalone");
    tcase_set_timeout(tc2, 120);
    tcase_add_checked_fixture(tc2, setup_dir, down_dir);
    tcase_add_test(tc2, test_standalone_leaves_nothing);
    tcase_add_test(tc2, test_inplace_assign_keeps_to_the_round_count);
    tcase_add_test(tc2, test_hang_check_spares_a_running_worker);
    tcase_add_test(tc2, test_bad_options);
    tcase_add_test(tc2, test_print_config_sources);
    tcase_add_test(tc2, test_torchrun_option_table);
    tcase_add_test(tc2, test_local_ranks_filter);
    tcase_add_test(tc2, test_numa_binding_exclusive);
    tcase_add_test(tc2, test_numa_binding_sets);
    tcase_add_test(tc2, test_bad_environment_names_the_variable);
    tcase_add_test(tc2, test_log_dir_tee_and_redirects);
    tcase_add_test(tc2, test_worker_environment);
    tcase_add_test(tc2, test_tee_without_log_dir);
    tcase_add_test(tc2, test_program_that_cannot_run);
    tcase_add_test(tc2, test_preload_forks_every_start);
    tcase_add_test(tc2, test_preload_workers_die_with_the_agent);
    tcase_add_test(tc2, test_preload_bad_input);
    tcase_add_test(tc2, test_c10d_agent_serves_the_rendezvous);
    tcase_add_test(tc2, test_c10d_serving_agent_waits_for_the_others);
    tcase_add_test(tc2, test_per_rank_redirects_and_tee);
    tcase_add_test(tc2, test_etcd_unreachable);
    tcase_add_test(tc2, test_etcd_member_loss);
    suite_add_tcase(s, tc2);
    return test_main("test_launcher", s, NULL);
}
