/*
 * Jobs isolated from each other on one etcd with authentication on: each job's user, made by
 * rg_etcd_grant_prefix or `regroup etcd-grant`, reads and writes its job's keys and is refused,
 * with a message naming the key, on every other job's; `regroup status` works with the job's
 * own credential; two jobs run side by side under the launcher, each regrouping after a worker
 * is killed, each finishing exactly, neither moving the other's rounds.
 *
 * Run as `test_etcd_auth --probe JOB` (a worker under the launcher), the executable reaches
 * etcd as a worker does (REGROUP_ETCD_* from the agent) and tries its own job's keys and
 * JOB's, printing what etcd said.
 */
#include "test_util.h"

#include "rdzv_keys.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static test_etcd_t etcd;
static char dir[256];

static void setup(void)
{
    test_tmpdir(dir, sizeof(dir), "auth");
    test_etcd_up(&etcd, &(test_etcd_opts_t){.auth = true, .extra_flags = TEST_ETCD_FAST});
}

static void teardown(void)
{
    test_etcd_down(&etcd);
    test_rmtree(dir);
}

/* dir/<name> holding text, with the given mode; its path into out. */
static void write_secret(const char *name, const char *text, mode_t mode, char *out,
                         size_t cap)
{
    snprintf(out, cap, "%s/%s", dir, name);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    ck_assert_int_eq(fchmod(fd, mode), 0);
    close(fd);
}

static rg_etcd_t *client_as(const char *user, const char *password)
{
    rg_etcd_t *c;
    rg_etcd_params_t p = etcd.params;
    p.user = user;
    p.password = password;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    return c;
}

static void grant(rg_etcd_t *root, const char *job, const char *password, rg_etcd_grant_t *res)
{
    char user[80];
    char prefix[100];
    snprintf(user, sizeof(user), "regroup-%s", job);
    snprintf(prefix, sizeof(prefix), "/regroup/%s/", job);
    rg_etcd_grant_req_t req = {.user = user, .password = password, .role = user,
                               .prefix = prefix};
    rg_status_t st = rg_etcd_grant_prefix(root, &req, 0, res);
    ck_assert_msg(st == RG_OK, "grant %s: %s", job, rg_last_error());
}

/* st is RG_EPERM with a message that holds every one of the texts (NULL-terminated). */
#define EXPECT_EPERM(st, ...) expect_eperm((st), __LINE__, (const char *[]){__VA_ARGS__, NULL})
static void expect_eperm(rg_status_t st, int line, const char *const texts[])
{
    ck_assert_msg(st == RG_EPERM, "line %d: %s: %s", line, rg_status_name(st), rg_last_error());
    for (int i = 0; texts[i] != NULL; i++) {
        ck_assert_msg(strstr(rg_last_error(), texts[i]) != NULL, "line %d: no '%s' in: %s",
                      line, texts[i], rg_last_error());
    }
}

/* A's credential on B's keys: every kind of request refused, naming the key; A's own keys
 * (with a lease, as an agent's) work. */
START_TEST(test_job_user_refused_on_other_jobs_keys)
{
    rg_etcd_t *root;
    rg_etcd_grant_t res;
    char *v;
    size_t len;

    ck_assert_int_eq(rg_etcd_create(&etcd.params, &root), RG_OK);
    grant(root, "A", "pw-a", &res);
    ck_assert(res.user_created && res.role_created && res.perm_granted);
    ck_assert_int_eq(res.perms_revoked, 0);
    ck_assert_str_eq(res.other_roles, "");
    grant(root, "B", "pw-b", &res);
    ck_assert_int_eq(rg_etcd_put_str(root, "/regroup/B/round", "3", 0, 0, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(root, "/regroup/AB/round", "1", 0, 0, NULL), RG_OK);

    rg_etcd_t *a = client_as("regroup-A", "pw-a");
    /* Its own keys, with a lease as an agent holds one; revoking it deletes them. */
    int64_t lease;
    ck_assert_int_eq(rg_etcd_lease_grant(a, 5, 0, &lease, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(a, "/regroup/A/round", "0", lease, 0, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_get(a, "/regroup/A/round", 0, &v, &len, NULL), RG_OK);
    ck_assert_str_eq(v, "0");
    free(v);
    ck_assert_int_eq(rg_etcd_lease_revoke(a, lease, 0), RG_OK);
    ck_assert_int_eq(rg_etcd_get(a, "/regroup/A/round", 0, &v, &len, NULL), RG_ENOENT);

    /* B's: read, write, delete, a prefix, a txn, a watch. */
    EXPECT_EPERM(rg_etcd_get(a, "/regroup/B/round", 0, &v, &len, NULL),
                 "permission denied on key /regroup/B/round", "for user regroup-A",
                 etcd.srv.url[0]);
    EXPECT_EPERM(rg_etcd_put_str(a, "/regroup/B/round", "9", 0, 0, NULL),
                 "/v3/kv/put: permission denied on key /regroup/B/round");
    EXPECT_EPERM(rg_etcd_delete(a, &(rg_etcd_delete_req_t){.key = "/regroup/B/", .prefix = true},
                                0, NULL),
                 "permission denied on keys /regroup/B/*");
    rg_etcd_range_t r;
    EXPECT_EPERM(rg_etcd_range(a, &(rg_etcd_range_req_t){.key = "/regroup/B/", .prefix = true},
                               0, &r),
                 "permission denied on keys /regroup/B/*");
    EXPECT_EPERM(rg_etcd_range(a, &(rg_etcd_range_req_t){.key = "/regroup/B/a",
                                                          .range_end = "/regroup/B/z"},
                               0, &r),
                 "permission denied on keys [/regroup/B/a, /regroup/B/z)");
    EXPECT_EPERM(rg_etcd_range(a, &(rg_etcd_range_req_t){.key = "/regroup/A/", .range_end = ""},
                               0, &r),
                 "permission denied on keys /regroup/A/ and after");
    /* A job whose id starts with A's is another job. */
    EXPECT_EPERM(rg_etcd_get(a, "/regroup/AB/round", 0, &v, &len, NULL),
                 "key /regroup/AB/round");
    /* Every job's keys at once. */
    EXPECT_EPERM(rg_etcd_range(a, &(rg_etcd_range_req_t){.key = "/regroup/", .prefix = true},
                               0, &r),
                 "keys /regroup/*");
    /* A compare-and-swap of B's round: the txn is refused whole, naming its keys. */
    rg_etcd_cmp_t cmp = {.key = "/regroup/B/round", .target = RG_ETCD_CMP_VALUE,
                         .result = RG_ETCD_EQUAL, .value = "3", .value_len = 1};
    rg_etcd_op_t put = {.type = RG_ETCD_OP_PUT,
                        .u.put = {.key = "/regroup/B/round", .value = "4", .value_len = 1}};
    rg_etcd_txn_t txn;
    EXPECT_EPERM(rg_etcd_txn(a, &cmp, 1, &put, 1, NULL, 0, 0, &txn),
                 "/v3/kv/txn: permission denied on key /regroup/B/round");
    rg_etcd_op_t put_own = {.type = RG_ETCD_OP_PUT,
                            .u.put = {.key = "/regroup/A/x", .value = "4", .value_len = 1}};
    EXPECT_EPERM(rg_etcd_txn(a, &cmp, 1, &put_own, 1, NULL, 0, 0, &txn),
                 "one of the keys /regroup/B/round, /regroup/A/x");
    rg_etcd_params_t pa = etcd.params;
    pa.user = "regroup-A";
    pa.password = "pw-a";
    rg_etcd_watch_t *w = NULL;
    EXPECT_EPERM(rg_etcd_watch_create(&pa, &(rg_etcd_watch_req_t){.key = "/regroup/B/",
                                                                   .prefix = true},
                                      0, &w),
                 "/v3/watch: permission denied on keys /regroup/B/*", "for user regroup-A");
    ck_assert_ptr_null(w);
    /* B's agent's lease: A cannot revoke it (etcd checks the keys attached to it). */
    rg_etcd_t *b = client_as("regroup-B", "pw-b");
    int64_t lease_b;
    ck_assert_int_eq(rg_etcd_lease_grant(b, 30, 0, &lease_b, NULL), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(b, "/regroup/B/rounds/3/nodes/x", "{}", lease_b, 0, NULL),
                     RG_OK);
    char lease_text[80];
    snprintf(lease_text, sizeof(lease_text), "the keys attached to lease %llx",
             (unsigned long long)lease_b);
    EXPECT_EPERM(rg_etcd_lease_revoke(a, lease_b, 0), lease_text, "/v3/lease/revoke");
    ck_assert_int_eq(rg_etcd_get(b, "/regroup/B/rounds/3/nodes/x", 0, &v, &len, NULL), RG_OK);
    free(v);
    rg_etcd_destroy(b);
    /* Nothing of B's changed. */
    ck_assert_int_eq(rg_etcd_get(root, "/regroup/B/round", 0, &v, &len, NULL), RG_OK);
    ck_assert_str_eq(v, "3");
    free(v);
    /* And A's own watch works. */
    ck_assert_int_eq(rg_etcd_watch_create(&pa, &(rg_etcd_watch_req_t){.key = "/regroup/A/",
                                                                       .prefix = true},
                                          0, &w),
                     RG_OK);
    rg_etcd_watch_destroy(w);
    rg_etcd_destroy(a);
    rg_etcd_destroy(root);
}
END_TEST

/* A re-run converges: nothing new is made, a permission added by hand is revoked, and the
 * password is the new one. */
START_TEST(test_grant_is_idempotent)
{
    rg_etcd_t *root;
    rg_etcd_grant_t res;

    ck_assert_int_eq(rg_etcd_create(&etcd.params, &root), RG_OK);
    grant(root, "A", "pw-a", &res);
    grant(root, "A", "pw-a", &res);
    ck_assert(!res.user_created && !res.role_created && !res.perm_granted);
    ck_assert_int_eq(res.perms_revoked, 0);

    ck_assert_int_eq(rg_etcd_server_etcdctl(&etcd.srv, "role grant-permission regroup-A "
                                                       "readwrite /other/ --prefix=true"), 0);
    ck_assert_int_eq(rg_etcd_server_etcdctl(&etcd.srv, "role add extra"), 0);
    ck_assert_int_eq(rg_etcd_server_etcdctl(&etcd.srv, "user grant-role regroup-A extra"), 0);
    rg_etcd_t *a = client_as("regroup-A", "pw-a");
    ck_assert_int_eq(rg_etcd_put_str(a, "/other/k", "v", 0, 0, NULL), RG_OK);
    rg_etcd_destroy(a);

    grant(root, "A", "pw-a2", &res);
    ck_assert(!res.user_created && !res.role_created && !res.perm_granted);
    ck_assert_int_eq(res.perms_revoked, 1);
    ck_assert_str_eq(res.other_roles, "extra");
    a = client_as("regroup-A", "pw-a2");
    EXPECT_EPERM(rg_etcd_put_str(a, "/other/k", "v", 0, 0, NULL), "key /other/k");
    ck_assert_int_eq(rg_etcd_put_str(a, "/regroup/A/k", "v", 0, 0, NULL), RG_OK);
    rg_etcd_destroy(a);
    a = client_as("regroup-A", "pw-a");
    rg_status_t st = rg_etcd_put_str(a, "/regroup/A/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH, "%s: %s", rg_status_name(st), rg_last_error());
    rg_etcd_destroy(a);

    /* A job user can grant nothing. */
    a = client_as("regroup-A", "pw-a2");
    rg_etcd_grant_req_t req = {.user = "u", .password = "p", .role = "r", .prefix = "/x/"};
    st = rg_etcd_grant_prefix(a, &req, 0, &res);
    ck_assert_msg(st == RG_EPERM, "%s: %s", rg_status_name(st), rg_last_error());
    rg_etcd_destroy(a);
    rg_etcd_destroy(root);
}
END_TEST

/* ---- the command ------------------------------------------------------------------------ */

static char root_pw[400];

static void root_secret(void)
{
    write_secret("root.pw", TEST_ETCD_PASSWORD "\n", 0600, root_pw, sizeof(root_pw));
}

/* `regroup etcd-grant` for job with the password file pw; its exit status, output in out. */
static int grant_cmd(const char *job, const char *pw, const char *extra, char *out, size_t cap)
{
    char ep[600];
    char id[100];
    char pf[500];
    char af[500];
    char log[400];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(id, sizeof(id), "--rdzv-id=%s", job);
    snprintf(pf, sizeof(pf), "--password-file=%s", pw);
    snprintf(af, sizeof(af), "--admin-password-file=%s", root_pw);
    snprintf(log, sizeof(log), "%s/grant-%s.log", dir, job);
    unlink(log);
    char *argv[] = {REGROUP_BIN, "etcd-grant", ep, id, pf, af, (char *)extra, NULL};
    return test_run_output(argv, log, 30000, out, cap);
}

START_TEST(test_grant_command)
{
    char pw[400];
    char open_pw[400];
    char out[4096];

    root_secret();
    write_secret("a.pw", "pw-a\n", 0600, pw, sizeof(pw));
    write_secret("open.pw", "pw-a\n", 0644, open_pw, sizeof(open_pw));

    /* A password file every user can read: refused before anything is sent. */
    ck_assert_int_eq(grant_cmd("A", open_pw, NULL, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "other users may read it") != NULL, "%s", out);
    /* A password on the command line: refused. */
    ck_assert_int_eq(grant_cmd("A", pw, "--password=pw-a", out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "read from files only") != NULL, "%s", out);

    ck_assert_int_eq(grant_cmd("A", pw, NULL, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "etcd user regroup-A (created) holds role regroup-A (created): "
                              "read and write on /regroup/A/*") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "--rdzv-conf=user=regroup-A,password_file=") != NULL, "%s", out);
    ck_assert_int_eq(grant_cmd("A", pw, NULL, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "(existed, password set) holds role regroup-A (existed, "
                              "unchanged)") != NULL, "%s", out);

    rg_etcd_t *a = client_as("regroup-A", "pw-a");
    ck_assert_int_eq(rg_etcd_put_str(a, "/regroup/A/k", "v", 0, 0, NULL), RG_OK);
    EXPECT_EPERM(rg_etcd_put_str(a, "/regroup/B/k", "v", 0, 0, NULL), "key /regroup/B/k");
    rg_etcd_destroy(a);

    /* The agent's password_file is held to the same rule, and named as its source gave it. */
    char conf[600];
    char log[400];
    snprintf(conf, sizeof(conf), "--rdzv-conf=user=regroup-A,password_file=%s", open_pw);
    snprintf(log, sizeof(log), "%s/open-conf.log", dir);
    char *print_argv[] = {REGROUP_BIN, "--print-config", conf, NULL};
    ck_assert_int_eq(test_run_output(print_argv, log, 30000, out, sizeof(out)), 2);
    ck_assert_msg(strstr(out, "--rdzv-conf password_file") != NULL &&
                  strstr(out, "other users may read it") != NULL, "%s", out);
    snprintf(conf, sizeof(conf), "--rdzv-conf=user=regroup-A,password_file=%s", pw);
    snprintf(log, sizeof(log), "%s/conf.log", dir);
    ck_assert_int_eq(test_run_output(print_argv, log, 30000, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "pw-a") == NULL, "--print-config shows the password: %s", out);

    /* An etcd without auth: nothing to grant, and the command says what to do first. */
    test_etcd_t plain;
    test_etcd_up(&plain, NULL);
    char ep[600];
    char af[500];
    char pf[500];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", plain.srv.endpoints);
    snprintf(af, sizeof(af), "--admin-password-file=%s", root_pw);
    snprintf(pf, sizeof(pf), "--password-file=%s", pw);
    snprintf(log, sizeof(log), "%s/grant-plain.log", dir);
    char *plain_argv[] = {REGROUP_BIN, "etcd-grant", ep, "--rdzv-id=A", pf, af, NULL};
    int rc = test_run_output(plain_argv, log, 30000, out, sizeof(out));
    test_etcd_down(&plain);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "authentication is not enabled") != NULL &&
                  strstr(out, "enable etcd's authentication first") != NULL, "%s", out);

    /* A wrong administrator password: refused by etcd, said so. */
    write_secret("root.pw", "wrong\n", 0600, root_pw, sizeof(root_pw));
    ck_assert_int_eq(grant_cmd("A", pw, NULL, out, sizeof(out)), 1);
    ck_assert_msg(strstr(out, "authentication") != NULL, "%s", out);
}
END_TEST

/* ---- two jobs under the launcher ---------------------------------------------------------- */

static int64_t round_of(rg_etcd_t *root, const char *job)
{
    char key[100];
    char *v;
    size_t len;
    int64_t r = -1;
    snprintf(key, sizeof(key), "/regroup/%s/round", job);
    if (rg_etcd_get(root, key, 0, &v, &len, NULL) == RG_OK) {
        if (rdzv_rec_round_decode(v, len, &r) != RG_OK) {
            r = -1;
        }
        free(v);
    }
    return r;
}

/* The job has regrouped and runs on: its round is 1 and rank 0 has reported progress in it. */
static bool regrouped(rg_etcd_t *root, const char *job)
{
    rdzv_keys_t k;
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    rdzv_progress_rec_t rec;
    bool ok = false;

    if (round_of(root, job) != 1 || rdzv_keys_init(&k, job) != RG_OK ||
        rdzv_keys_progress(&k, 0, key, sizeof(key)) != RG_OK ||
        rg_etcd_get(root, key, 0, &v, &len, NULL) != RG_OK) {
        return false;
    }
    ok = rdzv_rec_progress_decode(v, len, &rec) == RG_OK && rec.round == 1;
    free(v);
    return ok;
}

/* Starts job (2 workers of rg-exact, rank 1 killing itself at step 12, one restart allowed)
 * under the launcher with its own credential (conf) and checkpoint directory. It runs until
 * dir/stop-<job> exists (then to the end of the epoch). */
static pid_t start_job(const char *job, const char *conf)
{
    char ep[600];
    char id[100];
    char ck[400];
    char stop[400];
    snprintf(stop, sizeof(stop), "%s/stop-%s", dir, job);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(id, sizeof(id), "--rdzv-id=%s", job);
    snprintf(ck, sizeof(ck), "%s/ckpt-%s", dir, job);
    ck_assert_int_eq(mkdir(ck, 0700), 0);
    setenv("REGROUP_CKPT_DIR", ck, 1);
    char *argv[] = {REGROUP_BIN, ep, id, "--nnodes=1", "--nproc-per-node=2",
                    "--max-restarts=1", (char *)conf, RG_EXACT_BIN, "--epochs", "100000",
                    "--stop-file", stop, "--kill-at", "12", "--kill-rank", "1", NULL};
    pid_t pid = test_spawn_logged(dir, job, argv);
    unsetenv("REGROUP_CKPT_DIR");
    return pid;
}

START_TEST(test_two_jobs_side_by_side)
{
    char pa[400];
    char pb[400];
    char out[4096];
    char conf_a[600];
    char conf_b[600];
    rg_etcd_t *root;

    setenv("UCX_NET_DEVICES", "lo", 1);
    root_secret();
    write_secret("a.pw", "pw-a\n", 0600, pa, sizeof(pa));
    write_secret("b.pw", "pw-b\n", 0400, pb, sizeof(pb));
    ck_assert_int_eq(grant_cmd("A", pa, NULL, out, sizeof(out)), 0);
    ck_assert_int_eq(grant_cmd("B", pb, NULL, out, sizeof(out)), 0);
    snprintf(conf_a, sizeof(conf_a), "--rdzv-conf=user=regroup-A,password_file=%s,lease_ttl=2",
             pa);
    snprintf(conf_b, sizeof(conf_b), "--rdzv-conf=user=regroup-B,password_file=%s,lease_ttl=2",
             pb);

    ck_assert_int_eq(rg_etcd_create(&etcd.params, &root), RG_OK);
    pid_t a = start_job("A", conf_a);
    pid_t b = start_job("B", conf_b);
    /* Neither job can end before its stop file: each one's kill and regroup happen while the
     * other runs. */
    TEST_WAIT_UNTIL(regrouped(root, "A") && regrouped(root, "B"), 120000,
                    "the jobs did not both regroup within 120 s");
    char stop[400];
    for (int j = 0; j < 2; j++) {
        snprintf(stop, sizeof(stop), "%s/stop-%s", dir, j ? "B" : "A");
        write_secret(j ? "stop-B" : "stop-A", "", 0600, stop, sizeof(stop));
    }
    test_expect_exit(a, 180000, 0);
    test_expect_exit(b, 180000, 0);
    const char *jobs[] = {"A", "B"};
    for (int j = 0; j < 2; j++) {
        ck_assert_msg(test_log_has(dir, jobs[j], "killing myself at step 12"), "job %s: no kill",
                      jobs[j]);
        ck_assert_msg(test_log_has(dir, jobs[j], "exact=1"), "job %s: no exact=1", jobs[j]);
        /* One failure, one regroup: round 0, then round 1, which finished. A job that
         * moved the other's round would show here. */
        ck_assert_int_eq(round_of(root, jobs[j]), 1);
    }

    /* regroup status with the job's own credential; another job's is refused, by name. */
    char ep[600];
    char log[400];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(log, sizeof(log), "%s/status-a.log", dir);
    char *st_a[] = {REGROUP_BIN, "status", ep, "--rdzv-id=A", conf_a, NULL};
    ck_assert_int_eq(test_run_output(st_a, log, 30000, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "job:     A") != NULL, "%s", out);
    snprintf(log, sizeof(log), "%s/status-b.log", dir);
    char *st_b[] = {REGROUP_BIN, "status", ep, "--rdzv-id=B", conf_a, NULL};
    ck_assert_int_eq(test_run_output(st_b, log, 30000, out, sizeof(out)), 1);
    ck_assert_msg(strstr(out, "permission denied on") != NULL &&
                  strstr(out, "/regroup/B/") != NULL && strstr(out, "regroup-A") != NULL,
                  "%s", out);

    /* An agent of A's pointed at B's job: refused at once, naming B's key. Its workers
     * (this executable as --probe) never start. */
    char self[600];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    snprintf(log, sizeof(log), "%s/a-on-b.log", dir);
    char *a_on_b[] = {REGROUP_BIN, ep, "--rdzv-id=B", conf_a, self, "--probe", "B", NULL};
    ck_assert_int_ne(test_run_output(a_on_b, log, 60000, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "permission denied on") != NULL && strstr(out, "/regroup/B/"),
                  "%s", out);
    ck_assert_int_eq(round_of(root, "B"), 1);
    rg_etcd_destroy(root);
}
END_TEST

/* A's workers, with the credential the agent hands them, reach A's keys and not B's. */
START_TEST(test_workers_refused_on_other_jobs_keys)
{
    char pa[400];
    char out[8192];
    char conf_a[600];
    char ep[600];
    char log[400];
    char self[600];
    rg_etcd_t *root;

    root_secret();
    write_secret("a.pw", "pw-a\n", 0600, pa, sizeof(pa));
    ck_assert_int_eq(grant_cmd("A", pa, NULL, out, sizeof(out)), 0);
    ck_assert_int_eq(rg_etcd_create(&etcd.params, &root), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(root, "/regroup/B/round", "0", 0, 0, NULL), RG_OK);
    snprintf(conf_a, sizeof(conf_a), "--rdzv-conf=user=regroup-A,password_file=%s", pa);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(log, sizeof(log), "%s/probe.log", dir);
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    char *argv[] = {REGROUP_BIN, ep, "--rdzv-id=A", "--nproc-per-node=2", conf_a, self,
                    "--probe", "B", NULL};
    ck_assert_int_eq(test_run_output(argv, log, 60000, out, sizeof(out)), 0);
    for (int rank = 0; rank < 2; rank++) {
        char want[200];
        snprintf(want, sizeof(want), "probe %d own RG_OK", rank);
        ck_assert_msg(strstr(out, want) != NULL, "%s", out);
        snprintf(want, sizeof(want), "probe %d read RG_EPERM", rank);
        ck_assert_msg(strstr(out, want) != NULL, "%s", out);
        snprintf(want, sizeof(want), "probe %d write RG_EPERM", rank);
        ck_assert_msg(strstr(out, want) != NULL, "%s", out);
    }
    ck_assert_msg(strstr(out, "permission denied on key /regroup/B/round for user regroup-A"),
                  "%s", out);
    char *v;
    size_t len;
    ck_assert_int_eq(rg_etcd_get(root, "/regroup/B/round", 0, &v, &len, NULL), RG_OK);
    ck_assert_str_eq(v, "0");
    free(v);
    rg_etcd_destroy(root);
}
END_TEST

/* ---- client certificates with auth on ------------------------------------------------- */

static void setup_tls(void)
{
    test_tmpdir(dir, sizeof(dir), "auth-tls");
    test_etcd_up(&etcd, &(test_etcd_opts_t){.tls = true, .client_certs = true, .auth = true,
                                             .extra_flags = TEST_ETCD_FAST});
}

/* etcd requiring client certificates signed by its CA, with auth on: a client needs both a
 * certificate and a password. etcd 3.4's JSON gateway refuses a certificate that has a
 * CommonName then (it cannot map it to a user): the client says so. One without a CN and a
 * job's password work, and the job's user is still held to its prefix; a job runs so end to
 * end under the launcher. */
START_TEST(test_client_certificate_and_password)
{
    char nocn_cert[400];
    char nocn_key[400];
    char pa[400];
    char out[4096];
    rg_etcd_t *c;
    rg_status_t st;

    snprintf(nocn_cert, sizeof(nocn_cert), "%s/cli-nocn.pem", etcd.certs);
    snprintf(nocn_key, sizeof(nocn_key), "%s/cli-nocn.key", etcd.certs);

    /* The certificate with CN=rg-test-client: refused, and why. */
    rg_etcd_params_t p = etcd.params;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    st = rg_etcd_put_str(c, "/regroup/A/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH && strstr(rg_last_error(), "without a CommonName") != NULL,
                  "%s: %s", rg_status_name(st), rg_last_error());
    rg_etcd_destroy(c);
    /* No certificate: the TLS handshake is refused. */
    p.cert_file = NULL;
    p.key_file = NULL;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    st = rg_etcd_put_str(c, "/regroup/A/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH && strstr(rg_last_error(), "TLS") != NULL, "%s: %s",
                  rg_status_name(st), rg_last_error());
    rg_etcd_destroy(c);
    /* A certificate without a CN but no user: refused by auth. */
    p.cert_file = nocn_cert;
    p.key_file = nocn_key;
    p.user = NULL;
    p.password = NULL;
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    st = rg_etcd_put_str(c, "/regroup/A/k", "v", 0, 0, NULL);
    ck_assert_msg(st == RG_EAUTH, "%s: %s", rg_status_name(st), rg_last_error());
    rg_etcd_destroy(c);

    /* `regroup etcd-grant` over TLS with that certificate, then job A's user with it. */
    char tls_conf[1200];
    snprintf(tls_conf, sizeof(tls_conf), "--rdzv-conf=cacert=%s,cert=%s,key=%s", etcd.ca,
             nocn_cert, nocn_key);
    root_secret();
    write_secret("a.pw", "pw-a\n", 0600, pa, sizeof(pa));
    ck_assert_int_eq(grant_cmd("A", pa, tls_conf, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "etcd user regroup-A (created)") != NULL, "%s", out);
    p.user = "regroup-A";
    p.password = "pw-a";
    ck_assert_int_eq(rg_etcd_create(&p, &c), RG_OK);
    ck_assert_int_eq(rg_etcd_put_str(c, "/regroup/A/k", "v", 0, 0, NULL), RG_OK);
    EXPECT_EPERM(rg_etcd_put_str(c, "/regroup/B/k", "v", 0, 0, NULL), "key /regroup/B/k",
                 "https://127.0.0.1:");
    rg_etcd_destroy(c);

    /* A job under the launcher: agent and workers over TLS with the certificate and A's
     * password. */
    char ep[600];
    char ck[400];
    char conf[1600];
    char log[400];
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.srv.endpoints);
    snprintf(ck, sizeof(ck), "%s/ckpt", dir);
    ck_assert_int_eq(mkdir(ck, 0700), 0);
    snprintf(conf, sizeof(conf),
             "--rdzv-conf=cacert=%s,cert=%s,key=%s,user=regroup-A,password_file=%s", etcd.ca,
             nocn_cert, nocn_key, pa);
    snprintf(log, sizeof(log), "%s/job.log", dir);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("REGROUP_CKPT_DIR", ck, 1);
    char *argv[] = {REGROUP_BIN, ep, "--rdzv-id=A", "--nproc-per-node=2", conf, RG_EXACT_BIN,
                    "--epochs", "1", NULL};
    ck_assert_int_eq(test_run_output(argv, log, 120000, out, sizeof(out)), 0);
    unsetenv("REGROUP_CKPT_DIR");
    ck_assert_msg(strstr(out, "exact=1") != NULL, "%s", out);
}
END_TEST

/* The worker side of the test above: what etcd lets a worker of this job do. */
static int probe(const char *other)
{
    const char *job = getenv("TORCHELASTIC_RUN_ID");
    const char *rank = getenv("RANK");
    rg_etcd_params_t p = {.endpoints = getenv("REGROUP_ETCD_ENDPOINTS"),
                          .user = getenv("REGROUP_ETCD_USER"),
                          .password = getenv("REGROUP_ETCD_PASSWORD"),
                          .ca_file = getenv("REGROUP_ETCD_CACERT"),
                          .cert_file = getenv("REGROUP_ETCD_CERT"),
                          .key_file = getenv("REGROUP_ETCD_KEY")};
    rg_etcd_t *c;
    char own[200];
    char key[200];
    char *v = NULL;
    size_t len;

    if (job == NULL || rank == NULL || p.endpoints == NULL || rg_etcd_create(&p, &c) != RG_OK) {
        fprintf(stderr, "probe: not under the launcher, or no etcd: %s\n", rg_last_error());
        return 1;
    }
    snprintf(own, sizeof(own), "/regroup/%s/round", job);
    snprintf(key, sizeof(key), "/regroup/%s/round", other);
    rg_status_t st = rg_etcd_get(c, own, 0, &v, &len, NULL);
    free(v);
    v = NULL;
    printf("probe %s own %s\n", rank, rg_status_name(st));
    st = rg_etcd_get(c, key, 0, &v, &len, NULL);
    free(v);
    printf("probe %s read %s: %s\n", rank, rg_status_name(st), rg_last_error());
    st = rg_etcd_put_str(c, key, "7", 0, 0, NULL);
    printf("probe %s write %s: %s\n", rank, rg_status_name(st), rg_last_error());
    fflush(stdout);
    rg_etcd_destroy(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--probe") == 0) {
        return probe(argv[2]);
    }
    Suite *s = suite_create("etcd_auth");
    TCase *tc = tcase_create("auth");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_job_user_refused_on_other_jobs_keys);
    tcase_add_test(tc, test_grant_is_idempotent);
    tcase_add_test(tc, test_grant_command);
    tcase_add_test(tc, test_workers_refused_on_other_jobs_keys);
    tcase_add_test(tc, test_two_jobs_side_by_side);
    suite_add_tcase(s, tc);
    TCase *tls = tcase_create("tls");
    tcase_add_checked_fixture(tls, setup_tls, teardown);
    tcase_set_timeout(tls, 240);
    tcase_add_test(tls, test_client_certificate_and_password);
    suite_add_tcase(s, tls);
    return test_main("test_etcd_auth", s, NULL);
}
