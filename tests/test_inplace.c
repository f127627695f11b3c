/*
 * In-place recovery (`regroup --recovery=in-place`) through real processes, a real etcd and
 * real UCX: rg-exact ends with the exact expected vector after a worker is SIGKILLed between
 * steps, in the middle of an allreduce, twice in a row, and after a whole node (its agent) is
 * SIGKILLed, and when the rank that sends the state, a replacement or a joining node's
 * newcomer that receives it is killed in the middle of the transfer (the receivers' state
 * stays; the next round carries it); the survivors keep their processes (their pids finish
 * the job), nobody resumes from a checkpoint, and no process is left behind. Losing a node
 * below the minimum ends the job with a clear error within the join timeout. A node that
 * comes at the maximum size waits with its newcomers ready and joins in place once a node is
 * lost. A program that does not regroup in place is recovered by restarting, with a
 * warning. rg-fmnist and rg_trainer_fit recover in place.
 */
#include "test_util.h"

#include <regroup/ckpt.h>
#include <regroup/etcd.h>

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PIDS 64

static char dir[256];
static char ckpt[300];
static test_etcd_t etcd;
static const char *node_state_kb = "0";   /* rg-exact's --state-kb on start_node's nodes */
static const char *node_epochs = "8";     /* and its --epochs (at most) */
static const char *node_slow = "1";       /* and its --slow (a straggler: more) */
static char stop_path[400];                /* and its --stop-file */

static void setup(void)
{
    node_state_kb = "0";
    node_epochs = "8";
    test_job_dirs(dir, sizeof(dir), ckpt, sizeof(ckpt), "inplace");
    test_stop_path(dir, stop_path, sizeof(stop_path));
}

static void teardown(void)
{
    test_etcd_down(&etcd);
    test_rmtree(dir);
}

/* The workers' pids, from rg-exact's "rank R: pid P started (joining J)" and "rank R: pid P
 * finished" lines. */
typedef struct {
    int  n_started;
    int  started[MAX_PIDS];
    bool joining[MAX_PIDS];
    int  n_finished;
    int  finished[MAX_PIDS];
} pids_t;

static void read_pids(const char *name, pids_t *p)
{
    char path[400];
    char line[512];
    memset(p, 0, sizeof(*p));
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        int rank;
        int pid;
        int joining;
        const char *s = strstr(line, "rank ");
        if (s == NULL) {
            continue;
        }
        if (sscanf(s, "rank %d: pid %d started (joining %d)", &rank, &pid, &joining) == 3 &&
            p->n_started < MAX_PIDS) {
            p->joining[p->n_started] = joining != 0;
            p->started[p->n_started++] = pid;
        } else if (strstr(s, " finished") != NULL &&
                   sscanf(s, "rank %d: pid %d", &rank, &pid) == 2 && p->n_finished < MAX_PIDS) {
            p->finished[p->n_finished++] = pid;
        }
    }
    fclose(f);
}

/* Whether pid started as one of the first workers (not a replacement). */
static bool original(const pids_t *p, int pid)
{
    for (int i = 0; i < p->n_started; i++) {
        if (p->started[i] == pid) {
            return !p->joining[i];
        }
    }
    return false;
}

/* The job's worker processes are all gone, and at least `survivors` of the first workers
 * finished it (their processes kept through the failures). */
static void check_pids(const char *name, int world, int survivors)
{
    pids_t p;
    int kept = 0;
    read_pids(name, &p);
    ck_assert_msg(p.n_finished == world, "%d workers finished, not %d", p.n_finished, world);
    for (int i = 0; i < p.n_finished; i++) {
        kept += original(&p, p.finished[i]) ? 1 : 0;
    }
    ck_assert_msg(kept >= survivors, "%d of the first workers finished the job, not %d", kept,
                  survivors);
    for (int i = 0; i < p.n_started; i++) {
        ck_assert_msg(test_pid_gone(p.started[i], 10000), "worker pid %d is left behind",
                      p.started[i]);
    }
}

/* rg-exact on one node of `world` workers, in place; extra: its fault options. */
static pid_t start_one_node(const char *name, int world, char *const *extra, int n_extra)
{
    char np[32];
    /* 6 epochs of 25 steps: after a kill past step 30 of 75, a replacement (started once
     * the survivors are in their next round, its UCX worker made before it is ready) did
     * not always join before the end. */
    char *argv[32] = {REGROUP_BIN, "--standalone", np, "--max-restarts=3",
                      "--recovery=in-place", RG_EXACT_BIN, "--work", "3000",
                      "--table-rows", "1000", "--epochs", "6"};
    int n = 12;
    snprintf(np, sizeof(np), "--nproc-per-node=%d", world);
    for (int i = 0; i < n_extra; i++) {
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    return test_spawn_logged(dir, name, argv);
}

/* The job of start_one_node ends exactly, in place. */
static void end_one_node(const char *name, pid_t pid)
{
    test_expect_exit(pid, 120000, 0);
    ck_assert_msg(test_log_has(dir, name, "exact=1"), "%s: no exact=1", name);
    ck_assert_msg(test_log_has(dir, name, "regrouped: "), "%s: nobody regrouped", name);
    ck_assert_msg(!test_log_has(dir, name, "resumed from step"), "%s: resumed from a checkpoint",
                  name);
}

/* The largest N of the lines "... N <what>" in node `name`'s log (the sharded table's
 * regroup line says where each rank's rows came from), or -1. */
static long most_rows_from(const char *name, const char *what)
{
    char path[400];
    char line[1024];
    long most = -1;
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        char *at = strstr(line, what);
        if (at == NULL || strstr(line, "the sharded table at step") == NULL) {
            continue;
        }
        char *p = at;
        while (p > line && p[-1] == ' ') {
            p--;
        }
        while (p > line && p[-1] >= '0' && p[-1] <= '9') {
            p--;
        }
        long v = strtol(p, NULL, 10);
        most = v > most ? v : most;
    }
    fclose(f);
    return most;
}

static void run_one_node(const char *name, int world, char *const *extra, int n_extra)
{
    end_one_node(name, start_one_node(name, world, extra, n_extra));
}

START_TEST(test_inplace_kill_between_steps)
{
    char *extra[] = {"--kill-at", "32", "--kill-rank", "1"};
    run_one_node("between", 4, extra, 4);
    ck_assert(test_log_has(dir, "between", "killing myself at step 32"));
    ck_assert(test_log_has(dir, "between", "received from rank"));
    ck_assert(test_log_has(dir, "between", "pid") &&
              test_log_has(dir, "between", "started (joining 1)"));
    check_pids("between", 4, 3);
}
END_TEST

/* A member that says it holds no state (step -1: its buffers took a regroup's state but
 * not the rest of its own, as a PyTorch worker whose optimizer's state did not come) gets
 * the whole state in the next regroup, and the job stays exact. Before, rg_train_regroup
 * refused step -1 and the worker failed (regroup.train raised, its agent replaced it). */
START_TEST(test_inplace_member_without_state)
{
    char *extra[] = {"--kill-at", "32", "--kill-rank", "1", "--forget-rank", "2",
                     "--table-rows", "0"};
    run_one_node("forget", 4, extra, 8);
    ck_assert(test_log_has(dir, "forget", "rank 2: dropping my state at step"));
    ck_assert(test_log_has(dir, "forget", "rank 1: state of step"));   /* (rank 2 of 4) */
    check_pids("forget", 4, 3);
}
END_TEST

/* $REGROUP_TABLE_BUDDY_COPIES=1 (one buddy copy, two extra copies of a rank's rows in all):
 * a bad value fails the worker, naming the variable; with 1 a killed rank's rows still come
 * back in place. */
START_TEST(test_inplace_table_one_buddy_copy)
{
    char *extra[] = {"--kill-at", "32", "--kill-rank", "1"};
    setenv("REGROUP_TABLE_BUDDY_COPIES", "3", 1);
    pid_t bad = start_one_node("copies-bad", 2, NULL, 0);
    ck_assert_int_ne(test_wait_exit(bad, 60000), 0);
    ck_assert(test_log_has(dir, "copies-bad", "REGROUP_TABLE_BUDDY_COPIES=3: 1 or 2"));
    setenv("REGROUP_TABLE_BUDDY_COPIES", "1", 1);
    pid_t one = start_one_node("copies-one", 4, extra, 4);
    unsetenv("REGROUP_TABLE_BUDDY_COPIES");
    end_one_node("copies-one", one);
    ck_assert(test_log_has(dir, "copies-one", "table=1"));
    check_pids("copies-one", 4, 3);
}
END_TEST

START_TEST(test_inplace_kill_in_allreduce)
{
    char *extra[] = {"--kill-at", "27", "--kill-rank", "2", "--kill-in-allreduce"};
    run_one_node("allreduce", 4, extra, 5);
    ck_assert(test_log_has(dir, "allreduce", "killing myself in the allreduce of step 27"));
    check_pids("allreduce", 4, 3);
}
END_TEST

/* A worker dies while the others wait for it in an allreduce, and UCX would not say so for a
 * minute (keepalive and operation timeout at 60 s): the survivors give their group up as
 * soon as their agent joins the next, smaller round, and the job ends exactly in place.
 * Before, they waited for UCX's keepalive (about 0.1 s by default; here past the test). */
START_TEST(test_inplace_member_lost_before_keepalive)
{
    char *extra[] = {"--kill-at", "27", "--kill-rank", "2", "--kill-in-allreduce"};
    setenv("UCX_KEEPALIVE_INTERVAL", "60s", 1);
    setenv("REGROUP_COMM_TIMEOUT_MS", "60000", 1);
    pid_t job = start_one_node("lost", 4, extra, 5);
    unsetenv("UCX_KEEPALIVE_INTERVAL");
    unsetenv("REGROUP_COMM_TIMEOUT_MS");
    test_expect_exit(job, 40000, 0);
    ck_assert(test_log_has(dir, "lost", "exact=1"));
    ck_assert(test_log_has(dir, "lost", "killing myself in the allreduce of step 27"));
    ck_assert_msg(test_log_has(dir, "lost", "a member of round 0 is lost: this node's agent "
                               "joined round 1 of 3 ranks"),
                  "the survivors did not give their group up when the agent joined round 1");
    ck_assert(!test_log_has(dir, "lost", "resumed from step"));
    check_pids("lost", 4, 3);
}
END_TEST

START_TEST(test_inplace_two_faults)
{
    char *extra[] = {"--kill-at", "20", "--kill-again", "45", "--kill-rank", "1"};
    run_one_node("two", 3, extra, 6);
    ck_assert(test_log_has(dir, "two", "killing myself at step 20"));
    ck_assert(test_log_has(dir, "two", "killing myself at step 45"));
    pids_t p;
    read_pids("two", &p);
    ck_assert_int_eq(p.n_started, 5);   /* 3, then a replacement for each fault */
    check_pids("two", 3, 1);   /* the second fault's rank 1 may be the first replacement */
}
END_TEST

/* A worker dies at the last step and its replacement takes longer to get ready than the
 * others take to finish: the agent stops it once they did (it holds nothing and has no
 * state to receive). Before, it joined a round alone, found no state, and the finished job
 * restarted from its last checkpoint. */
START_TEST(test_inplace_replacement_ready_after_the_end)
{
    char *extra[] = {"--kill-at", "74", "--kill-rank", "1", "--join-delay-ms", "3000"};
    run_one_node("late", 4, extra, 6);
    ck_assert(test_log_has(dir, "late", "killing myself at step 74"));
    ck_assert(!test_log_has(dir, "late", "every one is a replacement"));
    check_pids("late", 3, 3);
}
END_TEST

/* A rank and its buddy die at the same step on one node: the rows that only they held come
 * from their node copies (the agent's memfds), read by the survivors; nothing from disk.
 * When the agent reaps the deaths one at a time, the survivors' group of the first round
 * after them lacks a member that is dead: they give its wire-up up as soon as the agent has
 * joined the next round (before, each waited out the wire-up's 3 s deadline, once or twice:
 * the job took 3.5 or 7.5 s, not 0.5). */
START_TEST(test_inplace_table_owner_and_buddy_from_node_copies)
{
    char *extra[] = {"--kill-at", "30", "--kill-rank", "0", "--kill-rank2", "1"};
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    run_one_node("nodecopy", 4, extra, 6);
    unsetenv("REGROUP_LOG_LEVEL");
    ck_assert(test_log_has(dir, "nodecopy", "table=1"));
    ck_assert_msg(!test_log_has(dir, "nodecopy", "published their address before the deadline"),
                  "a regroup waited out a wire-up's deadline");
    ck_assert_msg(most_rows_from("nodecopy", "from node copies") > 0,
                  "no rows came from a node copy");
    check_pids("nodecopy", 4, 2);
}
END_TEST

/* The pid in the "[host:pid rank round]" prefix of the first line of the log that holds
 * `text` and `also` (NULL: anything) and, when pid > 0, comes from that pid; -1 if none.
 * copy (may be NULL) gets the line. */
static int log_line_pid(const char *name, const char *text, const char *also, int pid,
                        char *copy, size_t cap)
{
    char path[400];
    char line[2048];
    int found = -1;
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    while (found < 0 && fgets(line, sizeof(line), f) != NULL) {
        const char *b = strstr(line, "] [");
        const char *c = b != NULL ? strchr(b + 3, ':') : NULL;
        int p;
        if (c == NULL || strstr(line, text) == NULL || (also && !strstr(line, also)) ||
            sscanf(c + 1, "%d", &p) != 1 || (pid > 0 && p != pid)) {
            continue;
        }
        found = p;
        if (copy != NULL) {
            snprintf(copy, cap, "%s", line);
        }
    }
    fclose(f);
    return found;
}

/* How many lines of the log hold `text` and `also` (NULL: anything). */
static int log_lines(const char *name, const char *text, const char *also)
{
    char path[400];
    char line[2048];
    int n = 0;
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, text) != NULL && (also == NULL || strstr(line, also) != NULL);
    }
    fclose(f);
    return n;
}

/* The pid of the first replacement worker of the log, or -1. */
static int first_replacement(const char *name)
{
    pids_t p;
    if (!test_log_has(dir, name, "started (joining 1)")) {
        return -1;   /* (also while the log is not made yet) */
    }
    read_pids(name, &p);
    for (int i = 0; i < p.n_started; i++) {
        if (p.joining[i]) {
            return p.started[i];
        }
    }
    return -1;
}

/* Whether a first worker (no replacement) other than `but` logged `text`. */
static bool original_logged(const char *name, const char *text, int but)
{
    pids_t p;
    read_pids(name, &p);
    for (int i = 0; i < p.n_started; i++) {
        if (!p.joining[i] && p.started[i] != but &&
            log_line_pid(name, text, NULL, p.started[i], NULL, 0) > 0) {
            return true;
        }
    }
    return false;
}

/* A state transfer that lasts: rg-exact's extra state of 32 MiB, sent in 8-byte chunks
 * (four in flight), takes seconds over shared memory, and the test sees its first line
 * within milliseconds. The info level has the transfer's lines. */
#define TRANSFER_STATE_KB "32768"

static void transfer_env(bool slow)
{
    const char *vars[][2] = {{"REGROUP_LOG_LEVEL", "info"},
                             {"REGROUP_REGROUP_CHUNK_BYTES", "8"}};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        if (slow) {
            setenv(vars[i][0], vars[i][1], 1);
        } else {
            unsetenv(vars[i][0]);
        }
    }
}

/* Starts the one-node job of the transfer tests (rank 1 killed at step 32, so that a
 * replacement joins and receives the state); once the replacement receives the state in a
 * round (the survivors hold it already: only the replacement does), *round is that round,
 * *source the pid that sends it, and the replacement's pid is returned. */
static int transfer_job(const char *name, pid_t *job, int *round, int *source)
{
    /* 8 epochs (200 steps): the job outlasts a replacement's start, however quick its steps
     * (with the default 3, a Release build could end before the replacement joined). */
    char *extra[] = {"--kill-at", "32", "--kill-rank", "1", "--state-kb", TRANSFER_STATE_KB,
                     "--epochs", "8"};
    char line[2048];
    int pid;
    transfer_env(true);
    *job = start_one_node(name, 4, extra, 8);
    transfer_env(false);
    TEST_WAIT_UNTIL((pid = first_replacement(name)) > 0, 60000, "no replacement started");
    TEST_WAIT_UNTIL(log_line_pid(name, "receives the state", NULL, pid, line, sizeof(line)) > 0,
                    60000, "the replacement (pid %d) received no state", pid);
    const char *r = strstr(line, "in round ");
    ck_assert_msg(r != NULL && sscanf(r, "in round %d", round) == 1, "%s", line);
    char in[64];
    snprintf(in, sizeof(in), "in round %d\n", *round);
    snprintf(in, sizeof(in), "to 1 member of round %d\n", *round);
    TEST_WAIT_UNTIL((*source = log_line_pid(name, "sends the state", in, -1, NULL, 0)) > 0,
                    10000, "nobody sends the state to the replacement alone (%s)", in);
    snprintf(in, sizeof(in), "in round %d\n", *round);
    ck_assert_int_eq(log_lines(name, "receives the state", in), 1);
    return pid;
}

/* Frozen at once (nothing more goes out), then killed. */
static void stop_and_kill(int pid)
{
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
}

/* The rank that sends the state to a replacement is killed in the middle of the transfer:
 * the replacement's regroup fails (it still has no state), it goes on to the next round,
 * where another survivor sends the state; a second replacement joins, and the job ends
 * exactly with the two remaining first workers. */
START_TEST(test_inplace_source_killed_mid_transfer)
{
    pid_t job;
    int round;
    int source;
    char text[128];
    int newcomer = transfer_job("source", &job, &round, &source);
    stop_and_kill(source);
    end_one_node("source", job);
    /* The replacement alone was receiving the 32 MiB (buffer 1), and did not get it. */
    ck_assert_int_eq(log_lines("source", "broke off in buffer 1 of 2", NULL), 1);
    ck_assert_msg(log_line_pid("source", "broke off in buffer 1 of 2", "still has no state",
                               newcomer, NULL, 0) > 0,
                  "the replacement's transfer from pid %d was not broken off", source);
    snprintf(text, sizeof(text), "regroup into round %d failed", round);
    ck_assert_msg(log_line_pid("source", text, NULL, newcomer, NULL, 0) > 0,
                  "the replacement did not go on from round %d", round);
    pids_t p;
    read_pids("source", &p);
    ck_assert_msg(original(&p, source), "the source (pid %d) was a replacement", source);
    ck_assert_int_eq(p.n_started, 6);   /* 4, a replacement for rank 1, one for the source */
    check_pids("source", 4, 2);
}
END_TEST

/* The replacement is killed while it receives the state: the source's regroup fails, the
 * survivors carry on without it, the agent replaces it again and the job ends exactly with
 * the three survivors' processes. */
START_TEST(test_inplace_newcomer_killed_mid_transfer)
{
    pid_t job;
    int round;
    char text[128];
    int source;
    int newcomer = transfer_job("newcomer", &job, &round, &source);
    stop_and_kill(newcomer);
    end_one_node("newcomer", job);
    /* The source alone was sending. */
    ck_assert_int_eq(log_lines("newcomer", "broke off in buffer 1 of 2", NULL), 1);
    ck_assert_msg(log_line_pid("newcomer", "broke off in buffer 1 of 2", "members", source,
                               NULL, 0) > 0,
                  "the source's transfer (pid %d) was not broken off", source);
    snprintf(text, sizeof(text), "regroup into round %d failed", round);
    ck_assert_msg(original_logged("newcomer", text, -1),
                  "no survivor went on from round %d", round);
    pids_t p;
    read_pids("newcomer", &p);
    ck_assert_int_eq(p.n_started, 6);   /* 4, then a replacement twice */
    /* The second replacement finishes the job with the survivors, unless the job ended
     * before it could join (the agent then stops it, having joined no group). */
    bool late = test_log_has(dir, "newcomer", "stopping 1 replacement(s) that joined no group");
    check_pids("newcomer", late ? 3 : 4, 3);
}
END_TEST

/* A state transfer that outlasts the group's timeout (REGROUP_COMM_TIMEOUT_MS 2 s here; the
 * 32 MiB in 8-byte chunks take several seconds): the survivors that take no part in it wait
 * within the regroup, under the regroup's deadline, until every member holds the state.
 * Before, they went on to the next step and waited for the source in its allreduce, under the
 * group's timeout: it passed with no member lost, they asked for another round, and the job
 * regrouped again (under a loaded CI, the joining test's transfer restarted the job). */
START_TEST(test_inplace_transfer_outlasts_the_group_timeout)
{
    pid_t job;
    int round;
    int source;
    setenv("REGROUP_COMM_TIMEOUT_MS", "2000", 1);
    int pid = transfer_job("slow", &job, &round, &source);
    unsetenv("REGROUP_COMM_TIMEOUT_MS");
    end_one_node("slow", job);
    char text[96];
    snprintf(text, sizeof(text), "into round %d:", round);
    ck_assert_msg(log_line_pid("slow", "regrouped in place from round", text, pid, NULL, 0) > 0,
                  "the replacement (pid %d) did not regroup into round %d", pid, round);
    const char *never[] = {"with no member lost", "a lease TTL after its group failed",
                           "restart the job", "deadline passed"};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
        ck_assert_msg(!test_log_has(dir, "slow", never[i]), "\"%s\" in the log", never[i]);
    }
    check_pids("slow", 4, 3);
}
END_TEST

static char ep_arg[600];

/* The test's etcd, for start_node. */
static void job_etcd(void)
{
    test_etcd_up(&etcd, &(test_etcd_opts_t){.extra_flags = TEST_ETCD_FAST});
    snprintf(ep_arg, sizeof(ep_arg), "--rdzv-endpoint=%s", etcd.srv.endpoints);
}

/* Node `name`'s agent of an in-place rg-exact job on the test's etcd (job_etcd), with
 * --nnodes, --nproc-per-node and --rdzv-conf as given. */
static pid_t start_node(const char *name, const char *nnodes, const char *nproc,
                        const char *conf)
{
    char *argv[] = {REGROUP_BIN, ep_arg, "--rdzv-id=job", (char *)nnodes, (char *)nproc,
                    "--max-restarts=3", "--recovery=in-place", (char *)conf, RG_EXACT_BIN,
                    "--epochs", (char *)node_epochs, "--work", "400000", "--table-rows", "1000",
                    "--state-kb", (char *)node_state_kb, "--stop-file", stop_path,
                    "--slow", (char *)node_slow, NULL};
    return test_spawn_logged(dir, name, argv);
}

/* Mid-run: every node's ranks are training once a checkpoint is committed. */
static void wait_training(void)
{
    TEST_WAIT_UNTIL(test_ckpt_committed(ckpt) > 1, 60000,
                    "no checkpoint committed within 60 s: the job does not run");
}

/* Two agents of 2 workers; once the job trains, node b gets sig (SIGKILL: lost; SIGTERM:
 * preempted, it leaves on purpose). A long last call: both nodes are in the first round,
 * however late the second one starts on a busy machine. */
static void two_nodes_sig(const char *nnodes, int sig, pid_t *a, pid_t *b)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=8";
    job_etcd();
    setenv("REGROUP_LOG_LEVEL", "info", 1);   /* where the table's rows come from */
    *a = start_node("a", nnodes, "--nproc-per-node=2", conf);
    *b = start_node("b", nnodes, "--nproc-per-node=2", conf);
    unsetenv("REGROUP_LOG_LEVEL");
    wait_training();
    ck_assert_int_eq(kill(*b, sig), 0);
    test_expect_exit(*b, 30000, 128 + sig);
}

static void two_nodes(const char *nnodes, pid_t *a, pid_t *b)
{
    two_nodes_sig(nnodes, SIGKILL, a, b);
}

/* Node b gone (lost, preempted, left behind): node a's workers regroup in place without it,
 * the test ends the training, and a finishes exactly at world size `world`, never having
 * restarted from a checkpoint. */
static void finish_without_b(pid_t a, const char *world)
{
    char want[32];
    snprintf(want, sizeof(want), "world=%s", world);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "regrouped: "), 60000,
                    "node a did not regroup in place without node b");
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", want),
                  "the job did not finish exactly at world size %s", world);
    ck_assert_msg(!test_log_has(dir, "a", "resumed from step"),
                  "the job restarted from its checkpoint");
}

START_TEST(test_inplace_node_loss)
{
    pid_t a;
    pid_t b;
    two_nodes("--nnodes=1:2", &a, &b);
    finish_without_b(a, "2");
    ck_assert(test_log_has(dir, "a", "table=1"));
    ck_assert_msg(most_rows_from("a", "came from buddy copies") > 0,
                  "node b's rows did not come from their buddy copies on node a");
    check_pids("a", 2, 2);
}
END_TEST

/* The pid of node `name`'s lowest rank, from its workers' "rank R: pid P started" lines. */
static int lowest_rank_pid(const char *name, int *rank_p)
{
    char path[400];
    char line[512];
    int best_rank = 1 << 30;
    int best_pid = -1;
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        int rank;
        int pid;
        int joining;
        const char *s = strstr(line, "rank ");
        if (s != NULL &&
            sscanf(s, "rank %d: pid %d started (joining %d)", &rank, &pid, &joining) == 3 &&
            joining == 0 && rank < best_rank) {
            best_rank = rank;
            best_pid = pid;
        }
    }
    fclose(f);
    *rank_p = best_rank;
    return best_pid;
}

/* Node b is lost together with the rank of node a that keeps the buddy copy of one of b's
 * ranks (a's lowest: the ranks of two nodes of 2 pair up in order): those rows are held
 * nowhere (b's node copies went with b), so the regroup says so and the job restarts from its
 * last checkpoint on node a, exactly. */
START_TEST(test_inplace_table_lost_falls_back_to_disk)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=8";
    job_etcd();
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    pid_t a = start_node("a", "--nnodes=1:2", "--nproc-per-node=2", conf);
    pid_t b = start_node("b", "--nnodes=1:2", "--nproc-per-node=2", conf);
    unsetenv("REGROUP_LOG_LEVEL");
    wait_training();
    int rank;
    int victim = lowest_rank_pid("a", &rank);
    ck_assert_int_gt(victim, 0);
    ck_assert_int_eq(kill(b, SIGKILL), 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    test_expect_exit(b, 30000, 128 + SIGKILL);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "resumed from step"), 60000,
                    "the job did not restart from its checkpoint");
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    ck_assert_msg(test_log_has(dir, "a", "held by no member"),
                  "the regroup did not find the rows lost");
    ck_assert_msg(test_log_has(dir, "a", "resumed from step"),
                  "the job did not restart from its checkpoint");
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "table=1") &&
                      test_log_has(dir, "a", "world=2"),
                  "the job did not finish exactly at world size 2");
}
END_TEST

/* The hang check runs while an agent joins in place, too: node b is lost, node a's agent
 * waits in the rejoin (MIN is 2 nodes: the round cannot close), and a worker of a's frozen
 * there (SIGSTOP) is found hung and killed within hang_timeout, not at the join timeout. */
START_TEST(test_inplace_hang_while_joining)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=60";
    job_etcd();
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    pid_t a = start_node("a", "--nnodes=2:2", "--nproc-per-node=1", conf);
    pid_t b = start_node("b", "--nnodes=2:2", "--nproc-per-node=1", conf);
    unsetenv("REGROUP_LOG_LEVEL");
    wait_training();
    ck_assert_int_eq(kill(b, SIGKILL), 0);
    test_expect_exit(b, 30000, 128 + SIGKILL);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "regrouping in place"), 30000,
                    "node a did not start to regroup without node b");
    pids_t p;
    read_pids("a", &p);
    ck_assert_int_ge(p.n_started, 1);
    ck_assert_int_eq(kill(p.started[0], SIGSTOP), 0);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "is hung: no heartbeat"), 10000,
                    "the frozen worker was not found hung while its agent joined");
    ck_assert_msg(test_pid_gone(p.started[0], 10000), "the hung worker was not killed");
    kill(a, SIGTERM);
    ck_assert_int_ne(test_wait_exit(a, 30000), -1);
}
END_TEST

/* A worker stalls (SIGSTOP, with the hang check off) past its group's deadline and goes on
 * (SIGCONT): no worker died and no lease was lost, so no agent forms a round by itself; the
 * workers whose deadline passed ask theirs for one, and the job regroups in place at the
 * same size, every first worker kept. Before, they waited three lease TTLs for a round that
 * nobody opened and the job restarted from its checkpoint (a network cut between the nodes
 * did the same: the chaos suite's peer-partition). */
START_TEST(test_inplace_stalled_worker)
{
    job_etcd();
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    setenv("REGROUP_COMM_TIMEOUT_MS", "2000", 1);
    pid_t a = start_node("a", "--nnodes=1", "--nproc-per-node=3",
                         "--rdzv-conf=lease_ttl=2,hang_timeout=0");
    unsetenv("REGROUP_LOG_LEVEL");
    unsetenv("REGROUP_COMM_TIMEOUT_MS");
    wait_training();
    pids_t p;
    read_pids("a", &p);
    ck_assert_int_eq(p.n_started, 3);
    ck_assert_int_eq(kill(p.started[1], SIGSTOP), 0);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "deadline passed waiting for"), 30000,
                    "no peer of the stopped worker found its deadline passed");
    ck_assert_int_eq(kill(p.started[1], SIGCONT), 0);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "regrouped in place from round 0 into round 1"),
                    30000, "the job did not regroup in place after the stall");
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=3"),
                  "the job did not finish exactly at world 3");
    ck_assert_msg(test_log_has(dir, "a", "asking for the next round"),
                  "no worker asked for a round");
    ck_assert_msg(!test_log_has(dir, "a", "resumed from step") &&
                      !test_log_has(dir, "a", "restart the job"),
                  "the job restarted");
    check_pids("a", 3, 3);
}
END_TEST

/* Node b (nproc_b workers) joins a running in-place job of node a's nproc_a: b's workers
 * start as newcomers outside any round while the job goes on, and join once ready, receiving
 * the state over the group; nobody restarts (node a's first workers finish the job) and the
 * job ends exactly at world nproc_a + nproc_b. */
/* Node `member`'s log holds the job's exact end at `world` ("world=N"), node `joiner`'s
 * workers started as newcomers and received the state, and neither node's job restarted. */
static void check_joined(const char *member, const char *joiner, const char *world)
{
    ck_assert_msg(test_log_has(dir, member, "exact=1") && test_log_has(dir, member, world),
                  "the job did not finish exactly at %s", world);
    ck_assert_msg(test_log_has(dir, joiner, "started (joining 1)"),
                  "node %s's workers were no newcomers", joiner);
    ck_assert_msg(test_log_has(dir, joiner, "received from rank"),
                  "node %s's workers received no state", joiner);
    const char *never[] = {"resumed from step", "the job restarts", "restart the job"};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
        ck_assert_msg(!test_log_has(dir, member, never[i]) &&
                          !test_log_has(dir, joiner, never[i]),
                      "\"%s\" in a node's log: the job restarted", never[i]);
    }
}

static void node_joins(int nproc_a, int nproc_b)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=0.5,join_timeout=30";
    char np_a[32];
    char np_b[32];
    char world[32];
    snprintf(np_a, sizeof(np_a), "--nproc-per-node=%d", nproc_a);
    snprintf(np_b, sizeof(np_b), "--nproc-per-node=%d", nproc_b);
    snprintf(world, sizeof(world), "world=%d", nproc_a + nproc_b);
    job_etcd();
    pid_t a = start_node("a", "--nnodes=1:2", np_a, conf);
    wait_training();
    pid_t b = start_node("b", "--nnodes=1:2", np_b, conf);
    TEST_WAIT_UNTIL(log_lines("b", "received from rank", NULL) == nproc_b, 60000,
                    "node b's workers did not receive the state");
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    test_expect_exit(b, 30000, 0);
    check_joined("a", "b", world);
    check_pids("a", nproc_a, nproc_a);
}

START_TEST(test_inplace_node_joins)
{
    node_joins(2, 2);
}
END_TEST

/* A node with more workers than the running job has ranks joins in place: its newcomers'
 * provisional ranks (in no round yet) are valid, so none fails to start (before, the second
 * got RANK=1 in a world of 1 and the node joined by the restart path). */
START_TEST(test_inplace_bigger_node_joins)
{
    node_joins(1, 2);
}
END_TEST

/* How many nodes wait to join the test's job (its waiting/ keys, docs/etcd-keys.md), or -1. */
static int64_t waiting_nodes(void)
{
    rg_etcd_t *cli;
    rg_etcd_range_t res;
    rg_etcd_range_req_t rq = {.key = "/regroup/job/waiting/", .prefix = true,
                              .count_only = true};
    int64_t n = -1;
    if (rg_etcd_create(&etcd.params, &cli) != RG_OK) {
        return -1;
    }
    if (rg_etcd_range(cli, &rq, RG_DEADLINE_DEFAULT, &res) == RG_OK) {
        n = res.count;
        rg_etcd_range_cleanup(&res);
    }
    rg_etcd_destroy(cli);
    return n;
}

/* A node that comes while the job is at its maximum size (2 nodes) starts its workers as
 * newcomers and waits; once a node is lost, it joins in place: node a's workers keep their
 * processes, node c's newcomers receive the state over the group, nothing restarts (before,
 * the waiting node joined with fresh workers and the job restarted from its checkpoint). */
START_TEST(test_inplace_node_waits_at_max_size)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=60";
    job_etcd();
    node_epochs = "16";   /* long enough for c to start, b's lease to run out and c to join */
    pid_t a = start_node("a", "--nnodes=1:2", "--nproc-per-node=2", conf);
    pid_t b = start_node("b", "--nnodes=1:2", "--nproc-per-node=2", conf);
    wait_training();
    pid_t c = start_node("c", "--nnodes=1:2", "--nproc-per-node=2", conf);
    TEST_WAIT_UNTIL(waiting_nodes() == 1, 60000, "node c does not wait to join");
    ck_assert_int_eq(kill(b, SIGKILL), 0);
    test_expect_exit(b, 30000, 128 + SIGKILL);
    TEST_WAIT_UNTIL(log_lines("c", "received from rank", NULL) == 2, 60000,
                    "node c's workers did not receive the state");
    test_end_training(dir);
    test_expect_exit(a, 120000, 0);
    test_expect_exit(c, 30000, 0);
    check_joined("a", "c", "world=4");
    ck_assert_msg(test_log_has(dir, "c", "wait for room"),
                  "node c's newcomers did not wait at the maximum size");
    check_pids("a", 2, 2);
    check_pids("c", 2, 0);
}
END_TEST

/* A node joins, and one of its newcomers is killed while it receives the state: the
 * source's regroup breaks off (node a's members hold the state: only the newcomers receive
 * it), the members go on without it, its agent replaces it in place, and the job ends
 * exactly at world 4 with node a's first workers. */
START_TEST(test_inplace_joining_newcomer_killed_mid_transfer)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=0.5,join_timeout=30";
    char line[2048];
    char in[64];
    int round;
    int newcomer;
    job_etcd();
    node_state_kb = TRANSFER_STATE_KB;
    transfer_env(true);
    pid_t a = start_node("a", "--nnodes=1:2", "--nproc-per-node=2", conf);
    wait_training();
    pid_t b = start_node("b", "--nnodes=1:2", "--nproc-per-node=2", conf);
    transfer_env(false);
    TEST_WAIT_UNTIL((newcomer = first_replacement("b")) > 0, 60000, "node b started no newcomer");
    TEST_WAIT_UNTIL(log_line_pid("b", "receives the state", NULL, newcomer, line,
                                 sizeof(line)) > 0,
                    60000, "the newcomer (pid %d) received no state", newcomer);
    const char *r = strstr(line, "in round ");
    ck_assert_msg(r != NULL && sscanf(r, "in round %d", &round) == 1, "%s", line);
    snprintf(in, sizeof(in), "in round %d\n", round);
    TEST_WAIT_UNTIL(log_lines("b", "receives the state", in) == 2, 10000,
                    "not both newcomers receive the state %s", in);
    ck_assert_int_eq(log_lines("a", "receives the state", in), 0);
    stop_and_kill(newcomer);
    test_expect_exit(a, 120000, 0);
    test_expect_exit(b, 30000, 0);
    ck_assert_msg(test_log_has(dir, "a", "exact=1") && test_log_has(dir, "a", "world=4"),
                  "the job did not finish exactly at world size 4");
    ck_assert_int_eq(log_lines("a", "broke off in buffer 1 of 2", "members"), 1);
    snprintf(in, sizeof(in), "regroup into round %d failed", round);
    ck_assert_msg(original_logged("a", in, -1), "node a did not go on from round %d", round);
    ck_assert(!test_log_has(dir, "a", "resumed from step"));
    check_pids("a", 2, 2);
    pids_t p;
    read_pids("b", &p);
    ck_assert_int_eq(p.n_started, 3);   /* two newcomers, a replacement for the one killed */
    for (int i = 0; i < p.n_started; i++) {
        ck_assert_msg(test_pid_gone(p.started[i], 10000), "worker pid %d is left behind",
                      p.started[i]);
    }
}
END_TEST

/* A preempted node (SIGTERM to its agent) in an in-place job: every rank takes the last
 * checkpoint of the step they all reached, the leaving node's workers exit, and the others
 * regroup without it in their own processes; nothing is redone from disk. */
START_TEST(test_inplace_preemption)
{
    pid_t a;
    pid_t b;
    two_nodes_sig("--nnodes=1:2", SIGTERM, &a, &b);
    ck_assert_msg(test_log_has(dir, "b", "this node leaves the job: SIGTERM"),
                  "node b did not leave");
    finish_without_b(a, "2");
    /* Rank 0 says how the last checkpoint went: on a, which stays, or on b, which leaves. */
    ck_assert_msg(test_log_has(dir, "a", "a node leaves at step") ||
                      test_log_has(dir, "b", "left at step"),
                  "no last checkpoint before the node left");
    ck_assert_msg(!test_log_has(dir, "a", "failed (") && !test_log_has(dir, "b", "failed ("),
                  "a worker failure was reported for a preemption");
    check_pids("a", 2, 2);
}
END_TEST

/* A node whose worker does 6 times the others' work: `regroup status` names its rank, rank
 * 0's log too (the slow rank's own says it asks to leave), and once it has been slow for the
 * window (4 s) its node leaves as a preempted one does; the other finishes exactly, in
 * place, without it. */
START_TEST(test_inplace_straggler_leaves)
{
    const char *conf = "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=8,"
                       "straggler_factor=2,straggler_window=4";
    char path[400];
    job_etcd();
    pid_t a = start_node("a", "--nnodes=1:2", "--nproc-per-node=1", conf);
    node_slow = "6";
    pid_t b = start_node("b", "--nnodes=1:2", "--nproc-per-node=1", conf);
    node_slow = "1";
    wait_training();
    char *status_argv[] = {REGROUP_BIN, "status", ep_arg, "--rdzv-id=job", NULL};
    test_log_path(dir, "status", path, sizeof(path));
    /* Named while it is slow (from a second after it is first found, until it leaves). */
    TEST_WAIT_UNTIL(test_run(status_argv, path, 30000) == 0 &&
                        test_log_has(dir, "status", "straggler: rank "),
                    30000, "regroup status did not name a straggler");
    test_expect_exit(b, 60000, 0);
    ck_assert_msg(test_log_has(dir, "b", "this node left the job (straggler: local rank 0"),
                  "node b did not leave as a straggler");
    /* (Rank 0 is on either node.) */
    ck_assert_msg(test_log_has(dir, "a", "straggler: rank ") ||
                      test_log_has(dir, "b", "straggler: rank "),
                  "rank 0 did not log the straggler");
    ck_assert_msg(test_log_has(dir, "b", "straggler: this rank"),
                  "the straggler was not node b's rank");
    finish_without_b(a, "1");
    ck_assert_msg(!test_log_has(dir, "a", "failed (") && !test_log_has(dir, "b", "failed ("),
                  "a worker failure was reported for a straggler's leaving");
}
END_TEST

/* The step of the last checkpoint that rank 0 said it committed before a node left ("left at
 * step N: checkpoint committed" on the leaving node, "a node leaves at step N: last checkpoint
 * committed" on one that stays), or -1. */
static long last_checkpoint_step(const char *name)
{
    char path[400];
    char line[512];
    long step = -1;
    test_log_path(dir, name, path, sizeof(path));
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *at = strstr(line, "leave");
        at = at != NULL ? strstr(at, " at step ") : NULL;
        if (at == NULL) {
            at = strstr(line, "left at step ");
            at = at != NULL ? at + 4 : NULL;
        }
        if (at != NULL && strstr(line, "committed") != NULL) {
            step = strtol(at + strlen(" at step "), NULL, 10);
        }
    }
    fclose(f);
    return step;
}

/* SIGTERM reaches an agent while it rejoins in place: node a's worker died and the next round
 * waits for node b, whose agent is frozen (SIGSTOP) for a moment, well within its lease. The
 * join goes on, and in the round the workers take the last checkpoint of the step they
 * reached before node a leaves. Before, the agent stopped its workers at once, with no last
 * checkpoint (a job stopped as a whole then loses every step since its last one); then, a's
 * ready replacement made it post a regroup over its preemption notice, and its leaving
 * waited for that replacement until the grace period ended. */
START_TEST(test_inplace_sigterm_while_rejoining)
{
    const char *conf = "--rdzv-conf=lease_ttl=5,last_call_timeout=0.5,join_timeout=30";
    job_etcd();
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    char *argv[] = {REGROUP_BIN, ep_arg, "--rdzv-id=job", "--nnodes=1:2",
                    "--nproc-per-node=2", "--max-restarts=3", "--recovery=in-place",
                    "--grace-period=20", (char *)conf, RG_EXACT_BIN, "--epochs", "8",
                    "--work", "400000", "--table-rows", "1000", NULL};
    pid_t a = test_spawn_logged(dir, "a", argv);
    pid_t b = test_spawn_logged(dir, "b", argv);
    unsetenv("REGROUP_LOG_LEVEL");
    /* Both nodes train: a checkpoint of 4 shards, committed by rank 0 on either node (node b
     * may start too late for the first round on a loaded machine, and join it later). */
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "committed (4 shards)") ||
                        test_log_has(dir, "b", "committed (4 shards)"), 60000,
                    "the job did not train at world 4 within 60 s");
    int rank;
    int victim = lowest_rank_pid("a", &rank);
    ck_assert_int_gt(victim, 0);
    ck_assert_int_eq(kill(b, SIGSTOP), 0);
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "failed (signal 9)"), 3000,
                    "node a did not see its worker fail (and rejoin)");
    ck_assert_int_eq(kill(a, SIGTERM), 0);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "SIGTERM while joining in place"), 3000,
                    "the SIGTERM did not come while node a joined");
    ck_assert_int_eq(kill(b, SIGCONT), 0);
    test_expect_exit(a, 60000, 128 + SIGTERM);
    long left = RG_MAX(last_checkpoint_step("a"), last_checkpoint_step("b"));
    ck_assert_msg(left > 0, "no last checkpoint committed before node a left");
    int64_t *steps = NULL;
    size_t n = 0;
    ck_assert(rg_ckpt_list(ckpt, &steps, &n) == RG_OK && n > 0);
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        found = found || steps[i] == left;
    }
    free(steps);
    ck_assert_msg(found, "the last checkpoint, of step %ld, is not committed", left);
    /* Node b goes on in place without a at once: a leaving node starts no replacement (one
     * that joined no round would hold nothing that a's leaving had to wait for). */
    ck_assert(!test_log_has(dir, "a", "replacement started"));
    TEST_WAIT_UNTIL(test_log_has(dir, "b", "world 2 from step"), 10000,
                    "node b did not regroup without node a");
    ck_assert(!test_log_has(dir, "b", "resumed from step"));
    kill(b, SIGTERM);
    ck_assert_int_ne(test_wait_exit(b, 60000), -1);
    check_pids("a", 0, 0);   /* (only that none is left behind) */
}
END_TEST

/* SIGTERM reaches an agent that has just joined a newer round for a planned change (node b
 * joins) while its workers are still in the old one (frozen here, so that they see the
 * preemption before the regroup): their writes from the old round are fenced, so they
 * regroup first and take the last checkpoint in the new round. Before, they took it in the
 * old round and its commit was refused: no last checkpoint. */
START_TEST(test_inplace_sigterm_during_a_planned_change)
{
    const char *conf =
        "--rdzv-conf=lease_ttl=3,last_call_timeout=0.5,join_timeout=30,hang_timeout=0";
    job_etcd();
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    char *argv[] = {REGROUP_BIN, ep_arg, "--rdzv-id=job", "--nnodes=1:2", NULL,
                    "--max-restarts=3", "--recovery=in-place", "--grace-period=20",
                    (char *)conf, RG_EXACT_BIN, "--epochs", "8", "--work", "400000",
                    "--table-rows", "1000", NULL};
    argv[4] = "--nproc-per-node=2";
    pid_t a = test_spawn_logged(dir, "a", argv);
    wait_training();
    pids_t p;
    read_pids("a", &p);
    ck_assert_int_eq(p.n_started, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(kill(p.started[i], SIGSTOP), 0);
    }
    argv[4] = "--nproc-per-node=1";
    pid_t b = test_spawn_logged(dir, "b", argv);
    unsetenv("REGROUP_LOG_LEVEL");
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "another agent opened a new round"), 30000,
                    "node a did not see node b's round");
    ck_assert_int_eq(kill(a, SIGTERM), 0);
    TEST_WAIT_UNTIL(test_log_has(dir, "a", "this node leaves the job: SIGTERM"), 10000,
                    "node a did not begin to leave");
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(kill(p.started[i], SIGCONT), 0);
    }
    test_expect_exit(a, 60000, 128 + SIGTERM);
    ck_assert_msg(!test_log_has(dir, "a", "no last checkpoint"),
                  "node a's workers' last checkpoint did not commit");
    long left = RG_MAX(last_checkpoint_step("a"), last_checkpoint_step("b"));
    ck_assert_msg(left > 0, "no last checkpoint committed before node a left");
    ck_assert_msg(test_log_has(dir, "a", "a member leaves once the job has regrouped"),
                  "the workers did not put the regroup before the preemption");
    /* Node b leaves too. Its worker cannot regroup alone (node a took its rows of the table
     * along) and asks for a restart: a node that leaves takes no part in it. Before, b
     * restarted the job in a fresh worker and trained to the end as if never told to go. */
    ck_assert_int_eq(kill(b, SIGTERM), 0);
    test_expect_exit(b, 30000, 128 + SIGTERM);
    ck_assert_msg(test_log_has(dir, "b", "this node left the job"), "node b did not leave");
    ck_assert_msg(!test_log_has(dir, "b", "exact="), "node b trained to the end of the job");
    check_pids("a", 0, 0);   /* (only that none is left behind) */
    check_pids("b", 0, 0);
}
END_TEST

START_TEST(test_inplace_below_min)
{
    pid_t a;
    pid_t b;
    two_nodes("--nnodes=2", &a, &b);
    /* Bounded: the lease TTL, then the join timeout (8 s). */
    test_expect_exit(a, 60000, 1);
    ck_assert_msg(test_log_has(dir, "a", "did not close within the join timeout"),
                  "no clear failure when the job fell below its minimum");
    pids_t p;
    read_pids("a", &p);
    for (int i = 0; i < p.n_started; i++) {
        ck_assert_msg(test_pid_gone(p.started[i], 10000), "worker pid %d is left behind",
                      p.started[i]);
    }
}
END_TEST

/* A program without the worker API: the first failure restarts the job, with a warning. */
START_TEST(test_inplace_non_api_worker)
{
    char marker[400];
    char script[900];
    snprintf(marker, sizeof(marker), "%s/failed-once", dir);
    snprintf(script, sizeof(script), "test -e %s && exit 0; touch %s; exit 3", marker, marker);
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
                    "--recovery=in-place", "--no-python", "/bin/sh", "-c", script, NULL};
    test_expect_exit(test_spawn_logged(dir, "plain", argv), 60000, 0);
    ck_assert(test_log_has(dir, "plain", "--recovery=in-place: local rank"));
    ck_assert(test_log_has(dir, "plain", "the job restarts as with --recovery=restart"));
}
END_TEST

/* rg_trainer_fit with rg_scaling_config_t.in_place: the same recovery from inside a program. */
START_TEST(test_inplace_trainer_fit)
{
    char *argv[] = {RG_EXACT_BIN, "--trainer", "3", "--trainer-in-place", "--ckpt-root", ckpt,
                    "--kill-at", "22", "--kill-rank", "1", "--work", "3000", NULL};
    test_expect_exit(test_spawn_logged(dir, "trainer", argv), 120000, 0);
    ck_assert(test_log_has(dir, "trainer", "killing myself at step 22"));
    ck_assert(test_log_has(dir, "trainer", "regrouped: "));
    ck_assert(!test_log_has(dir, "trainer", "resumed from step"));
    ck_assert(test_log_has(dir, "trainer", "exact=1"));
    check_pids("trainer", 3, 2);
}
END_TEST

/* rg-fmnist in place: the survivors carry on at world 2, the replacement joins with the
 * parameters and Adam state received from a survivor, and the model still learns. */
START_TEST(test_inplace_fmnist)
{
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=3", "--max-restarts=2",
                    "--recovery=in-place", RG_FMNIST_BIN, "--epochs", "1", "--log-every",
                    "100", "--kill-at", "300", "--kill-rank", "1", NULL};
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    test_expect_exit(test_spawn_logged(dir, "fmnist", argv), 240000, 0);
    ck_assert(test_log_has(dir, "fmnist", "killing myself at step 300"));
    ck_assert_msg(
        test_log_has(dir, "fmnist", "regrouped in place (a peer failed): round 1 world 2"),
        "the survivors did not carry on at world 2");
    ck_assert(test_log_has(dir, "fmnist", "received from rank"));
    ck_assert(!test_log_has(dir, "fmnist", "resumed from checkpoint"));
    ck_assert(test_log_has(dir, "fmnist", "test_accuracy=0.8"));
}
END_TEST

/* A worker dies before training begins (rank 0 is in rg_get_checkpoint's broadcast): the
 * others regroup with their starting state instead of failing (before, rank 0 exited on
 * RG_EPEER and the job went the restart path). */
START_TEST(test_inplace_fmnist_kill_before_training)
{
    char *argv[] = {REGROUP_BIN, "--standalone", "--nproc-per-node=3", "--max-restarts=2",
                    "--recovery=in-place", RG_FMNIST_BIN, "--epochs", "1", "--log-every",
                    "100", "--kill-at", "start", "--kill-rank", "1", NULL};
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    test_expect_exit(test_spawn_logged(dir, "fmstart", argv), 240000, 0);
    ck_assert(test_log_has(dir, "fmstart", "killing myself before training"));
    ck_assert_msg(test_log_has(dir, "fmstart", "regrouped in place (a peer failed before "
                               "training): round 1 world 2, step 0"),
                  "the survivors did not regroup before training");
    ck_assert(!test_log_has(dir, "fmstart", "resumed from checkpoint"));
    ck_assert(!test_log_has(dir, "fmstart", "failed (exit code"));
    ck_assert(test_log_has(dir, "fmstart", "test_accuracy=0.8"));
}
END_TEST

/* --print-config shows the choice and where it came from. */
START_TEST(test_inplace_print_config)
{
    char out[8192];
    char log[400];
    test_log_path(dir, "config", log, sizeof(log));
    char *argv[] = {REGROUP_BIN, "--print-config", "--standalone", "--recovery=in-place", NULL};
    ck_assert_int_eq(test_run_output(argv, log, 10000, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "recovery") != NULL && strstr(out, "in-place") != NULL, "%s",
                  out);
    char *bad[] = {REGROUP_BIN, "--print-config", "--recovery=sometimes", NULL};
    test_log_path(dir, "config-bad", log, sizeof(log));
    ck_assert_int_eq(test_run_output(bad, log, 10000, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "expected restart or in-place") != NULL, "%s", out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("inplace");
    TCase *tc = tcase_create("inplace");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 200);
    tcase_add_test(tc, test_inplace_print_config);
    tcase_add_test(tc, test_inplace_kill_between_steps);
    tcase_add_test(tc, test_inplace_member_without_state);
    tcase_add_test(tc, test_inplace_kill_in_allreduce);
    tcase_add_test(tc, test_inplace_table_one_buddy_copy);
    tcase_add_test(tc, test_inplace_member_lost_before_keepalive);
    tcase_add_test(tc, test_inplace_two_faults);
    tcase_add_test(tc, test_inplace_replacement_ready_after_the_end);
    tcase_add_test(tc, test_inplace_node_loss);
    tcase_add_test(tc, test_inplace_table_owner_and_buddy_from_node_copies);
    tcase_add_test(tc, test_inplace_table_lost_falls_back_to_disk);
    tcase_add_test(tc, test_inplace_node_joins);
    tcase_add_test(tc, test_inplace_bigger_node_joins);
    tcase_add_test(tc, test_inplace_node_waits_at_max_size);
    tcase_add_test(tc, test_inplace_hang_while_joining);
    tcase_add_test(tc, test_inplace_stalled_worker);
    tcase_add_test(tc, test_inplace_preemption);
    tcase_add_test(tc, test_inplace_sigterm_while_rejoining);
    tcase_add_test(tc, test_inplace_sigterm_during_a_planned_change);
    tcase_add_test(tc, test_inplace_below_min);
    tcase_add_test(tc, test_inplace_non_api_worker);
    tcase_add_test(tc, test_inplace_trainer_fit);
    tcase_add_test(tc, test_inplace_fmnist);
    tcase_add_test(tc, test_inplace_fmnist_kill_before_training);
    suite_add_tcase(s, tc);
    /* A case of its own: CK_RUN_CASE=transfer runs these alone. */
    TCase *tx = tcase_create("transfer");
    tcase_add_checked_fixture(tx, setup, teardown);
    tcase_set_timeout(tx, 200);
    tcase_add_test(tx, test_inplace_source_killed_mid_transfer);
    tcase_add_test(tx, test_inplace_newcomer_killed_mid_transfer);
    tcase_add_test(tx, test_inplace_joining_newcomer_killed_mid_transfer);
    tcase_add_test(tx, test_inplace_transfer_outlasts_the_group_timeout);
    suite_add_tcase(s, tx);
    /* A node left out of the job (CK_RUN_CASE=leftout). */
    TCase *ts = tcase_create("leftout");
    tcase_add_checked_fixture(ts, setup, teardown);
    tcase_set_timeout(ts, 200);
    tcase_add_test(ts, test_inplace_straggler_leaves);
    suite_add_tcase(s, ts);
    return test_main("test_inplace", s, NULL);
}
