/* What the test suites share (see test_util.h). */
#include "test_util.h"

#include <regroup/ckpt.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the runner ------------------------------------------------------------------------ */

int test_main(const char *name, Suite *first, ...)
{
    char root[512];
    const char *base = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
    va_list ap;

    snprintf(root, sizeof(root), "%s/rg-%s-XXXXXX", base, name);
    if (mkdtemp(root) == NULL) {
        fprintf(stderr, "%s: cannot make %s: %s\n", name, root, strerror(errno));
        return EXIT_FAILURE;
    }
    setenv("TMPDIR", root, 1);
    SRunner *sr = srunner_create(first);
    va_start(ap, first);
    for (Suite *s = va_arg(ap, Suite *); s != NULL; s = va_arg(ap, Suite *)) {
        srunner_add_suite(sr, s);
    }
    va_end(ap);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (getenv("REGROUP_KEEP_TEST_DIR") != NULL) {
        fprintf(stderr, "%s: test files kept in %s\n", name, root);
    } else if (!rg_rm_tree(root)) {
        fprintf(stderr, "%s: could not remove all of %s\n", name, root);
        failed++;
    }
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ---- temporary trees ------------------------------------------------------------------- */

void test_tmpdir(char *out, size_t cap, const char *tag)
{
    const char *base = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
    int n = snprintf(out, cap, "%s/rg-%s-XXXXXX", base, tag);
    ck_assert_msg(n > 0 && (size_t)n < cap, "temp dir name too long for %zu bytes", cap);
    ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp %s: %s", out, strerror(errno));
}

void test_rmtree(const char *path)
{
    if (path[0] != '\0' && getenv("REGROUP_KEEP_TEST_DIR") != NULL) {
        fprintf(stderr, "test files kept in %s\n", path);   /* for a look after a failure */
    } else if (path[0] != '\0') {
        ck_assert_msg(rg_rm_tree(path), "could not remove all of %s", path);
    }
}

/* ---- waiting on a condition ------------------------------------------------------------ */

/* The lines of path from byte `from` on that have text (or start with it), counted up to
 * max; the last of them counted into last (cap bytes, NUL-terminated) when last is not NULL. */
static int file_lines(const char *path, const char *text, bool at_start, long from, int max,
                      char *last, size_t cap)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t line_cap = 0;
    int n = 0;

    if (f == NULL) {
        return 0;
    }
    if (from > 0 && fseek(f, from, SEEK_SET) != 0) {
        fclose(f);
        return 0;
    }
    while (n < max && getline(&line, &line_cap, f) >= 0) {
        bool hit = at_start ? strncmp(line, text, strlen(text)) == 0 : strstr(line, text) != NULL;
        if (hit && last != NULL) {
            snprintf(last, cap, "%s", line);
        }
        n += hit;
    }
    free(line);
    fclose(f);
    return n;
}

/* Whether a line of path from byte `from` on has text (or starts with it). */
static bool file_any_line(const char *path, const char *text, bool at_start, long from)
{
    return file_lines(path, text, at_start, from, 1, NULL, 0) > 0;
}

bool test_file_contains(const char *path, const char *text)
{
    return file_any_line(path, text, false, 0);
}

bool test_file_line_starts(const char *path, const char *text)
{
    return file_any_line(path, text, true, 0);
}

void test_wait_file_contains(const char *path, const char *text, int timeout_ms)
{
    TEST_WAIT_UNTIL(test_file_contains(path, text), timeout_ms,
                    "waited %d ms for a line with '%s' in %s", timeout_ms, text, path);
}

/* ---- processes ------------------------------------------------------------------------- */

pid_t test_spawn(char *const argv[], const char *log_path)
{
    fflush(NULL);
    pid_t pid = rg_proc_spawn(argv, log_path);
    ck_assert_msg(pid > 0, "cannot start %s: %s", argv[0], strerror(errno));
    return pid;
}

int test_wait_exit(pid_t pid, int timeout_ms)
{
    int rc = rg_proc_wait(pid, timeout_ms);
    if (rc < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        test_dump_job_logs();
        ck_abort_msg("pid %d did not exit within %d ms", (int)pid, timeout_ms);
    }
    return rc;
}

void test_expect_exit(pid_t pid, int timeout_ms, int want)
{
    int rc = test_wait_exit(pid, timeout_ms);
    if (rc != want) {
        test_dump_job_logs();
        ck_abort_msg("pid %d exited with status %d, not %d", (int)pid, rc, want);
    }
}

int test_run(char *const argv[], const char *log_path, int timeout_ms)
{
    return test_wait_exit(test_spawn(argv, log_path), timeout_ms);
}

int test_run_output(char *const argv[], const char *log_path, int timeout_ms, char *out,
                    size_t cap)
{
    int rc = test_run(argv, log_path, timeout_ms);
    FILE *f = fopen(log_path, "r");
    ck_assert_msg(f != NULL, "%s: %s", log_path, strerror(errno));
    size_t got = fread(out, 1, cap - 1, f);
    out[got] = '\0';
    fclose(f);
    return rc;
}

bool test_pid_gone(pid_t pid, int timeout_ms)
{
    rg_deadline_t until = rg_deadline_in_ms(timeout_ms);
    char path[64];

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    for (;;) {
        char state = 0;
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            return true;
        }
        /* A zombie whose parent is gone is as good as gone. */
        bool zombie = fscanf(f, "%*d %*s %c", &state) == 1 && state == 'Z';
        fclose(f);
        if (zombie) {
            return true;
        }
        if (rg_deadline_passed(until)) {
            return false;
        }
        rg_sleep_ms(TEST_POLL_MS);
    }
}

/* ---- a directory of jobs: one log per process, by name -------------------------------- */

/* The directory of the running test's jobs, for test_dump_job_logs ("" if none). */
static char job_dir[512];

#define DUMP_MAX_FILES 8
#define DUMP_TAIL_BYTES 6000

void test_dump_job_logs(void)
{
    DIR *d = job_dir[0] != '\0' ? opendir(job_dir) : NULL;
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d)) != NULL && files < DUMP_MAX_FILES) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".log") != 0) {
            continue;
        }
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", job_dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue;
        }
        files++;
        long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        long from = size > DUMP_TAIL_BYTES ? size - DUMP_TAIL_BYTES : 0;
        fprintf(stderr, "---- the end of %s (%ld bytes) ----\n", path, size);
        if (size >= 0 && fseek(f, from, SEEK_SET) == 0) {
            char line[1024];
            bool first = from > 0;   /* a line cut by the seek */
            while (fgets(line, sizeof(line), f) != NULL) {
                if (!first) {
                    fputs(line, stderr);
                }
                first = first && strchr(line, '\n') == NULL;
            }
        }
        fclose(f);
    }
    closedir(d);
    fflush(stderr);
}

void test_job_dirs(char *dir, size_t dir_cap, char *ckpt, size_t ckpt_cap, const char *tag)
{
    test_tmpdir(dir, dir_cap, tag);
    snprintf(job_dir, sizeof(job_dir), "%s", dir);
    int n = snprintf(ckpt, ckpt_cap, "%s/ckpt", dir);
    ck_assert_msg(n > 0 && (size_t)n < ckpt_cap, "%s/ckpt too long for %zu bytes", dir,
                  ckpt_cap);
    ck_assert_msg(mkdir(ckpt, 0700) == 0, "mkdir %s: %s", ckpt, strerror(errno));
    setenv("REGROUP_CKPT_DIR", ckpt, 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
}

void test_stop_path(const char *dir, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s/stop", dir);
    ck_assert_msg(n > 0 && (size_t)n < cap, "%s/stop too long for %zu bytes", dir, cap);
}

void test_end_training(const char *dir)
{
    char path[400];
    test_stop_path(dir, path, sizeof(path));
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_int_eq(fclose(f), 0);
}

void test_log_path(const char *dir, const char *name, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s/%s.log", dir, name);
    ck_assert_msg(n > 0 && (size_t)n < cap, "%s/%s.log too long for %zu bytes", dir, name,
                  cap);
}

pid_t test_spawn_logged(const char *dir, const char *name, char *const argv[])
{
    char log[512];
    test_log_path(dir, name, log, sizeof(log));
    return test_spawn(argv, log);
}

bool test_log_has(const char *dir, const char *name, const char *text)
{
    char path[512];
    test_log_path(dir, name, path, sizeof(path));
    return test_file_contains(path, text);
}

int test_log_count(const char *dir, const char *name, const char *text)
{
    char path[512];
    test_log_path(dir, name, path, sizeof(path));
    return file_lines(path, text, false, 0, INT_MAX, NULL, 0);
}

bool test_log_last(const char *dir, const char *name, const char *text, char *out, size_t cap)
{
    char path[512];
    test_log_path(dir, name, path, sizeof(path));
    return file_lines(path, text, false, 0, INT_MAX, out, cap) > 0;
}

long test_log_size(const char *dir, const char *name)
{
    char path[512];
    struct stat sb;
    test_log_path(dir, name, path, sizeof(path));
    return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

bool test_log_has_after(const char *dir, const char *name, long from, const char *text)
{
    char path[512];
    test_log_path(dir, name, path, sizeof(path));
    return file_any_line(path, text, false, from);
}

void test_wait_log(const char *dir, const char *name, const char *text, int timeout_ms)
{
    char path[512];
    test_log_path(dir, name, path, sizeof(path));
    test_wait_file_contains(path, text, timeout_ms);
}

size_t test_ckpt_committed(const char *root)
{
    int64_t *steps = NULL;
    size_t n = 0;
    if (rg_ckpt_list(root, &steps, &n) != RG_OK) {
        return 0;
    }
    free(steps);
    return n;
}

/* ---- an etcd for a test ---------------------------------------------------------------- */

bool test_etcd_start(test_etcd_t *t, const test_etcd_opts_t *opts)
{
    static const test_etcd_opts_t plain = {.members = 1};
    const test_etcd_opts_t *o = opts != NULL ? opts : &plain;
    rg_etcd_server_params_t sp = {.members = o->members, .extra_flags = o->extra_flags,
                                  .also_host = o->also_host};
    char srv_cert[300];
    char srv_key[300];
    char flags[1024];

    memset(t, 0, sizeof(*t));
    if (o->tls || o->client_certs) {
        const char *base = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
        snprintf(t->certs, sizeof(t->certs), "%s/rg-certs-XXXXXX", base);
        if (mkdtemp(t->certs) == NULL) {
            rg_error(RG_ESYS, "mkdtemp %s: %s", t->certs, strerror(errno));
            t->certs[0] = '\0';
            return false;
        }
        if (!test_make_certs(t->certs)) {
            rg_error(RG_ESYS, "openssl failed (see %s/openssl.log)", t->certs);
            return false;
        }
        snprintf(t->ca, sizeof(t->ca), "%s/ca.pem", t->certs);
        snprintf(t->cli_cert, sizeof(t->cli_cert), "%s/cli.pem", t->certs);
        snprintf(t->cli_key, sizeof(t->cli_key), "%s/cli.key", t->certs);
        snprintf(srv_cert, sizeof(srv_cert), "%s/srv.pem", t->certs);
        snprintf(srv_key, sizeof(srv_key), "%s/srv.key", t->certs);
        sp.cert_file = srv_cert;
        sp.key_file = srv_key;
        sp.ca_file = t->ca;
        if (o->client_certs) {
            snprintf(flags, sizeof(flags), "%s --client-cert-auth --trusted-ca-file %s",
                     o->extra_flags != NULL ? o->extra_flags : "", t->ca);
            sp.extra_flags = flags;
        }
    }
    if (o->auth) {
        sp.root_password = TEST_ETCD_PASSWORD;
    }
    if (rg_etcd_server_start_with(&t->srv, &sp) != 0) {
        return false;
    }
    t->params = (rg_etcd_params_t){.endpoints = t->srv.endpoints, .timeout_ms = 3000};
    if (t->certs[0] != '\0') {
        t->params.ca_file = t->ca;
    }
    if (o->client_certs) {
        t->params.cert_file = t->cli_cert;
        t->params.key_file = t->cli_key;
    }
    if (o->auth) {
        t->params.user = "root";
        t->params.password = TEST_ETCD_PASSWORD;
    }
    return true;
}

void test_etcd_up(test_etcd_t *t, const test_etcd_opts_t *opts)
{
    char why[512] = "";
    bool ok = test_etcd_start(t, opts);
    if (!ok) {
        snprintf(why, sizeof(why), "%s", rg_last_error());
        /* Whatever was made for it goes now: the test ends here, without its teardown. */
        test_etcd_down(t);
    }
    ck_assert_msg(ok, "cannot start the test etcd: %s", why);
}

void test_etcd_down(test_etcd_t *t)
{
    rg_etcd_server_stop(&t->srv);
    if (t->certs[0] != '\0') {
        if (!rg_rm_tree(t->certs)) {
            fprintf(stderr, "could not remove all of %s\n", t->certs);
        }
        t->certs[0] = '\0';
    }
}

/* ---- a network of nodes ----------------------------------------------------------------- */

/* Runs argv (no shell), its output appended to $TMPDIR/net.log; true if it exited 0. */
static bool net_run(const char *const *argv)
{
    char log[512];
    const char *tmp = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
    snprintf(log, sizeof(log), "%s/net.log", tmp);
    return test_run((char *const *)argv, log, 30000) == 0;
}

#define NET_RUN(...) net_run((const char *const[]){__VA_ARGS__, NULL})

static void net_remove(const char *name)
{
    char path[300];
    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    umount2(path, MNT_DETACH);
    unlink(path);
}

void test_net_up(test_net_t *t)
{
    memset(t, 0, sizeof(*t));
    DIR *d = opendir("/var/run/netns");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        int pid;
        int k;
        if (sscanf(e->d_name, "rgt-%d-%d", &pid, &k) == 2 && pid > 0 && kill(pid, 0) != 0 &&
            errno == ESRCH) {
            net_remove(e->d_name);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    ck_assert_msg(unshare(CLONE_NEWNET) == 0, "cannot make a network namespace: %s",
                  strerror(errno));
    t->on = true;
    ck_assert_msg(NET_RUN("ip", "link", "set", "lo", "up") &&
                      NET_RUN("ip", "link", "add", "rgt-br", "type", "bridge") &&
                      NET_RUN("ip", "addr", "add", TEST_NET_HUB "/16", "dev", "rgt-br") &&
                      NET_RUN("ip", "link", "set", "rgt-br", "up"),
                  "cannot set up the bridge (see $TMPDIR/net.log)");
}

void test_net_addr(int k, char *out, size_t cap)
{
    snprintf(out, cap, "10.215.1.%d", k + 1);
}

const char *test_net_name(const test_net_t *t, int k)
{
    return t->name[k];
}

void test_net_node(test_net_t *t, int k, const char *rate)
{
    char host[32];
    char addr[40];
    char *name = t->name[k];
    ck_assert(t->on && k >= 0 && k < TEST_NET_MAX && name[0] == '\0');
    snprintf(name, sizeof(t->name[k]), "rgt-%d-%d", (int)getpid(), k);
    snprintf(host, sizeof(host), "rgt-h%d", k);
    test_net_addr(k, addr, sizeof(addr));
    strcat(addr, "/16");
    t->n = RG_MAX(t->n, k + 1);
    bool ok = NET_RUN("ip", "netns", "add", name) &&
              NET_RUN("ip", "link", "add", host, "type", "veth", "peer", "name", "veth0",
                      "netns", name) &&
              NET_RUN("ip", "link", "set", host, "master", "rgt-br", "up") &&
              NET_RUN("ip", "-n", name, "addr", "add", addr, "dev", "veth0") &&
              NET_RUN("ip", "-n", name, "link", "set", "veth0", "up") &&
              NET_RUN("ip", "-n", name, "link", "set", "lo", "up");
    if (ok && rate != NULL) {
        /* Both ways: the bridge's side sends to the node, veth0 from it. */
        ok = NET_RUN("tc", "qdisc", "add", "dev", host, "root", "tbf", "rate", rate, "burst",
                     "64kb", "latency", "400ms") &&
             NET_RUN("tc", "-n", name, "qdisc", "add", "dev", "veth0", "root", "tbf", "rate",
                     rate, "burst", "64kb", "latency", "400ms");
    }
    ck_assert_msg(ok, "cannot make node %d's namespace (see $TMPDIR/net.log)", k);
}

void test_net_down(test_net_t *t)
{
    for (int k = 0; k < t->n && k < TEST_NET_MAX; k++) {
        if (t->name[k][0] != '\0') {
            net_remove(t->name[k]);
            t->name[k][0] = '\0';
        }
    }
    t->on = false;
}

/* Runs one openssl command in dir, its output appended to dir/openssl.log. */
static bool openssl(const char *dir, const char *const args[])
{
    char *argv[32];
    char log[512];
    int n = 0;
    pid_t pid;

    argv[n++] = "openssl";
    for (int i = 0; args[i] != NULL && n < 31; i++) {
        argv[n++] = (char *)args[i];
    }
    argv[n] = NULL;
    snprintf(log, sizeof(log), "%s/openssl.log", dir);
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        /* As rg_proc_spawn, but in dir: openssl writes its files relative to it. */
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd < 0 || chdir(dir) != 0 || dup2(fd, STDOUT_FILENO) < 0 ||
            dup2(fd, STDERR_FILENO) < 0) {
            _exit(126);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid < 0) {
        return false;
    }
    int rc = rg_proc_wait(pid, 60000);
    if (rc < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return rc == 0;
}

static bool write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return false;
    }
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

bool test_make_certs(const char *dir)
{
    static const char *const ca[] = {"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                                     "2", "-subj", "/CN=rg-test-ca", "-keyout", "ca.key",
                                     "-out", "ca.pem", NULL};
    static const char *const srv_req[] = {"req", "-newkey", "rsa:2048", "-nodes", "-subj",
                                          "/CN=127.0.0.1", "-keyout", "srv.key", "-out",
                                          "srv.csr", NULL};
    static const char *const srv_sign[] = {"x509", "-req", "-in", "srv.csr", "-CA", "ca.pem",
                                           "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                                           "-extfile", "srv.cnf", "-out", "srv.pem", NULL};
    static const char *const cli_req[] = {"req", "-newkey", "rsa:2048", "-nodes", "-subj",
                                          "/CN=rg-test-client", "-keyout", "cli.key", "-out",
                                          "cli.csr", NULL};
    static const char *const cli_sign[] = {"x509", "-req", "-in", "cli.csr", "-CA", "ca.pem",
                                           "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
                                           "-extfile", "cli.cnf", "-out", "cli.pem", NULL};
    /* A client certificate whose subject has no CommonName: etcd's JSON gateway refuses
     * any client certificate with one when auth is on. */
    static const char *const nocn_req[] = {"req", "-newkey", "rsa:2048", "-nodes", "-subj",
                                           "/O=rg-test-client", "-keyout", "cli-nocn.key",
                                           "-out", "cli-nocn.csr", NULL};
    static const char *const nocn_sign[] = {"x509", "-req", "-in", "cli-nocn.csr", "-CA",
                                            "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                                            "-days", "2", "-extfile", "cli.cnf", "-out",
                                            "cli-nocn.pem", NULL};
    static const char *const other[] = {"req", "-x509", "-newkey", "rsa:2048", "-nodes",
                                        "-days", "2", "-subj", "/CN=other-ca", "-keyout",
                                        "other.key", "-out", "other.pem", NULL};

    return write_file(dir, "srv.cnf",
                      "subjectAltName=IP:127.0.0.1\n"
                      "extendedKeyUsage=serverAuth,clientAuth\n") &&
           write_file(dir, "cli.cnf", "extendedKeyUsage=clientAuth\n") &&
           openssl(dir, ca) && openssl(dir, srv_req) && openssl(dir, srv_sign) &&
           openssl(dir, cli_req) && openssl(dir, cli_sign) && openssl(dir, nocn_req) &&
           openssl(dir, nocn_sign) && openssl(dir, other);
}
