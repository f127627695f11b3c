/*
 * What the test suites share: the runner, temporary trees, waiting on conditions with a
 * deadline, child processes, and one etcd fixture.
 *
 * Cleanup when a test fails: in fork mode (the default) a failed assertion _exits the test's
 * child at once, without its checked teardown. So nothing a test leaves may outlive it on its
 * own: every process it starts (etcd members included) gets PR_SET_PDEATHSIG(SIGKILL) and dies
 * with the child, and every file it makes lies under the run's directory, which test_main()
 * makes, points TMPDIR at, and removes after the last test whatever happened.
 */
#ifndef REGROUP_TEST_UTIL_H
#define REGROUP_TEST_UTIL_H

#include "etcd_server.h"
#include "rg_common.h"

#include <regroup/etcd.h>

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* ---- the runner ------------------------------------------------------------------------ */

/* Runs the NULL-terminated suites with TMPDIR set to a fresh $TMPDIR/rg-<name>-XXXXXX, then
 * removes that directory with all a test left in it (kept and named on stderr when
 * REGROUP_KEEP_TEST_DIR is set). Returns main's exit status. */
int test_main(const char *name, Suite *first, ...);

/* ---- temporary trees ------------------------------------------------------------------- */

/* Makes a fresh directory $TMPDIR/rg-<tag>-XXXXXX into out; fails the test if it cannot. */
void test_tmpdir(char *out, size_t cap, const char *tag);
/* Removes a tree (rg_rm_tree: nftw, no shell); fails the test if something is left. "" is a
 * no-op, so a teardown may run before its setup made the directory. */
void test_rmtree(const char *path);   /* kept (and named) under $REGROUP_KEEP_TEST_DIR */

/* ---- waiting on a condition ------------------------------------------------------------ */

#define TEST_POLL_MS 5

/* Polls the expression every TEST_POLL_MS until it holds; fails the test with the message
 * (printf-style) if it still does not after timeout_ms. */
#define TEST_WAIT_UNTIL(cond, timeout_ms, ...) \
    do { \
        rg_deadline_t test_until_ = rg_deadline_in_ms(timeout_ms); \
        while (!(cond)) { \
            if (rg_deadline_passed(test_until_)) { \
                test_dump_job_logs(); \
                ck_abort_msg(__VA_ARGS__); \
            } \
            rg_sleep_ms(TEST_POLL_MS); \
        } \
    } while (0)

/* The end of every log in the test's job directory (test_job_dirs), to stderr: what a
 * failed wait shows of the jobs it waited on (CI keeps no directory). */
void test_dump_job_logs(void);

#define TEST_HOLD_POLL_MS 100

/* Checks the expression every TEST_HOLD_POLL_MS for duration_ms, failing the test with the
 * message as soon as it does not hold: for what must stay true over a span of time (a kept
 * lease outliving its TTL), which nothing but waiting the span out can show. */
#define TEST_HOLD_FOR(cond, duration_ms, ...) \
    do { \
        rg_deadline_t test_until_ = rg_deadline_in_ms(duration_ms); \
        do { \
            ck_assert_msg((cond), __VA_ARGS__); \
            rg_sleep_ms(RG_MIN(TEST_HOLD_POLL_MS, rg_deadline_left_ms(test_until_))); \
        } while (!rg_deadline_passed(test_until_)); \
        ck_assert_msg((cond), __VA_ARGS__); \
    } while (0)

/* True if a line of the file contains text (false if it cannot be read). */
bool test_file_contains(const char *path, const char *text);
/* True if a line of the file starts with text; a text ending in "\n" matches a whole line. */
bool test_file_line_starts(const char *path, const char *text);
/* Waits until a line of the file contains text; fails the test after timeout_ms. */
void test_wait_file_contains(const char *path, const char *text, int timeout_ms);

/* ---- processes ------------------------------------------------------------------------- */

/* Starts argv (rg_proc_spawn: dies with this process) with stdout and stderr appended to
 * log_path; fails the test if it cannot. */
pid_t test_spawn(char *const argv[], const char *log_path);
/* Waits for a child of ours to exit and reaps it: its exit status, or 128 + the signal that
 * ended it. Past timeout_ms it is SIGKILLed and reaped, and the test fails. */
int test_wait_exit(pid_t pid, int timeout_ms);
/* test_wait_exit that fails the test, with the job logs (test_dump_job_logs), unless the
 * status is want. */
void test_expect_exit(pid_t pid, int timeout_ms, int want);
/* test_spawn + test_wait_exit. */
int test_run(char *const argv[], const char *log_path, int timeout_ms);
/* test_run with both streams to log_path, then the first cap - 1 bytes of it into out
 * (NUL-terminated). Returns the exit status. */
int test_run_output(char *const argv[], const char *log_path, int timeout_ms, char *out,
                    size_t cap);
/* True once pid (any process, not only a child) is gone or a zombie, within timeout_ms. */
bool test_pid_gone(pid_t pid, int timeout_ms);

/* ---- a directory of jobs: one log per process, by name -------------------------------- */

/* What a test that runs jobs under the launcher sets up: a fresh directory (test_tmpdir, tag)
 * into dir and its checkpoint root dir/ckpt into ckpt, with REGROUP_CKPT_DIR pointing at it and
 * UCX on the loopback device (UCX_NET_DEVICES=lo). Fails the test if it cannot. */
void test_job_dirs(char *dir, size_t dir_cap, char *ckpt, size_t ckpt_cap, const char *tag);
/* The log of the process a test calls name: dir/<name>.log, into out. */
void test_log_path(const char *dir, const char *name, char *out, size_t cap);
/* test_spawn with both streams appended to dir/<name>.log. */
pid_t test_spawn_logged(const char *dir, const char *name, char *const argv[]);
/* True if a line of dir/<name>.log contains text (test_file_contains). */
bool test_log_has(const char *dir, const char *name, const char *text);
/* How many lines of dir/<name>.log contain text. */
int test_log_count(const char *dir, const char *name, const char *text);
/* The last line of dir/<name>.log that contains text, into out (cap bytes); false if none. */
bool test_log_last(const char *dir, const char *name, const char *text, char *out, size_t cap);
/* The size of dir/<name>.log now (0 if it is not there): with test_log_has_after, a line
 * written from then on, not one from before (a job's first round has the same words). */
long test_log_size(const char *dir, const char *name);
bool test_log_has_after(const char *dir, const char *name, long from, const char *text);
/* Waits until a line of dir/<name>.log contains text; fails the test after timeout_ms. */
void test_wait_log(const char *dir, const char *name, const char *text, int timeout_ms);
/* How many checkpoints under root are committed (have a MANIFEST: rg_ckpt_list); 0 if none
 * or root cannot be listed. */
size_t test_ckpt_committed(const char *root);
/* The stop file of the jobs in dir (dir/stop: rg-exact's --stop-file) into out. */
void test_stop_path(const char *dir, char *out, size_t cap);
/* Creates dir's stop file: an rg-exact job run with --stop-file on it ends at its next epoch
 * boundary (the test has seen what it waited for; the rest of the run would only take time). */
void test_end_training(const char *dir);

/* ---- an etcd for a test ---------------------------------------------------------------- */

/* Raft timing for one member: leases can expire in about a second. */
#define TEST_ETCD_FAST "--heartbeat-interval=10 --election-timeout=100"
/* For clusters: an election takes about half a second. */
#define TEST_ETCD_CLUSTER "--heartbeat-interval=50 --election-timeout=500"
/* The root password of an etcd started with .auth. */
#define TEST_ETCD_PASSWORD "rootpw"

typedef struct {
    int         members;      /* 0 means 1 */
    const char *extra_flags;  /* TEST_ETCD_FAST, TEST_ETCD_CLUSTER, NULL... */
    bool        tls;          /* clients over TLS, with certificates made for the test */
    bool        client_certs; /* tls, and clients must show a certificate signed by the CA */
    bool        auth;         /* user root (TEST_ETCD_PASSWORD), auth enabled (with tls too) */
    const char *also_host;    /* serve clients on this address too (TEST_NET_HUB) */
} test_etcd_opts_t;

typedef struct {
    rg_etcd_server_t srv;
    char             certs[256];  /* tls: test_make_certs' directory, else "" */
    char             ca[300];     /* tls: certs/ca.pem, the CA that signed the server's */
    char             cli_cert[300]; /* tls: a client certificate and key the CA signed */
    char             cli_key[300];
    /* How a client reaches it (points into this struct: do not copy it): endpoints, timeout
     * 3 s, and the CA, client certificate (client_certs) or root's password (auth). */
    rg_etcd_params_t params;
} test_etcd_t;

/* Starts the etcd that opts describes (NULL: one plain member) and waits until it is healthy
 * (rg_etcd_server_start_with). False, with the reason in rg_last_error(), if it cannot. */
bool test_etcd_start(test_etcd_t *t, const test_etcd_opts_t *opts);
/* test_etcd_start, failing the test if it cannot. */
void test_etcd_up(test_etcd_t *t, const test_etcd_opts_t *opts);
/* Stops it by pid and removes its data dir and certificates. Safe twice and on a zeroed
 * struct. */
void test_etcd_down(test_etcd_t *t);

/* ---- a network of nodes (network namespaces) ------------------------------------------ */

/* test_net_up moves the test's process into a network namespace of its own, with loopback
 * and a bridge at TEST_NET_HUB (where the test's etcd also serves: .also_host); each node k
 * gets a namespace with veth0 at test_net_addr(k), linked to the bridge. The namespaces are
 * named after the test's pid: test_net_down removes them, and test_net_up removes those of
 * earlier tests whose process is gone (a failed test _exits without its teardown). */
#define TEST_NET_MAX 8
#define TEST_NET_HUB "10.215.0.1"

typedef struct {
    bool on;
    int  n;
    char name[TEST_NET_MAX][64];
} test_net_t;

/* Fails the test if the machine does not allow it (it needs root and iproute2). */
void        test_net_up(test_net_t *t);
/* Node k's namespace (0 <= k < TEST_NET_MAX); rate: its link limited to this many bits a
 * second each way (tc's token bucket: "200mbit"), or NULL. Fails the test if it cannot. */
void        test_net_node(test_net_t *t, int k, const char *rate);
const char *test_net_name(const test_net_t *t, int k);
void        test_net_addr(int k, char *out, size_t cap);
/* Removes the nodes' namespaces (their links go with them). Safe twice and on a zeroed one. */
void        test_net_down(test_net_t *t);

/* Makes, with the openssl command (no shell), in dir: a test CA (ca.pem, ca.key), a
 * certificate it signed for a server on 127.0.0.1 (srv.pem, srv.key, which also allows client
 * auth), one it signed for a client (cli.pem, cli.key: CN rg-test-client), one for a client
 * without a CommonName (cli-nocn.pem, cli-nocn.key) and an unrelated CA (other.pem). False if
 * openssl failed (its output is in dir/openssl.log). */
bool test_make_certs(const char *dir);

#endif
