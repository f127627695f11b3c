/*
 * ckpt/: crashes and full disks. Every save runs in a forked child (so that its process-wide
 * fault hooks start fresh); the child is SIGKILLed at a chosen byte count or fault point
 * (REGROUP_CKPT_KILL_AFTER_BYTES / REGROUP_CKPT_KILL_AT_POINT), or runs with RLIMIT_FSIZE.
 * Afterwards the previous checkpoint must load and no partial one may be visible.
 */
#include "ckpt_testutil.h"
#include "test_util.h"

#include <regroup/ckpt.h>

#include <check.h>
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROWS  4096
#define COLS  64
#define CHUNK 65536

static char root[256];

static void root_up(void)
{
    test_tmpdir(root, sizeof(root), "ckpt-crash");
}

static void root_down(void)
{
    test_rmtree(root);
}

typedef struct {
    const char *root;
    int         rank;
    int         world;
    int64_t     step;
    int64_t     kill_bytes;   /* -1: none */
    int64_t     kill_point;   /* -1: none */
    rlim_t      fsize;        /* 0: no limit */
    int64_t     commit_ms;
} child_t;

/* In the child: the state of rank r of `world` at `step`. Returns the save's status. */
static rg_status_t child_save(const child_t *c)
{
    rg_ckpt_params_t params = {.root = c->root, .rank = c->rank, .world_size = c->world,
                               .chunk_bytes = CHUNK, .commit_timeout_ms = c->commit_ms};
    uint64_t begin = (uint64_t)ROWS * (uint64_t)c->rank / (uint64_t)c->world;
    uint64_t count = (uint64_t)ROWS * (uint64_t)(c->rank + 1) / (uint64_t)c->world - begin;
    float *w = malloc(count * COLS * sizeof(float));
    int64_t cnt[1000];
    rg_ckpt_tensor_t ts[2] = {
        {.name = "w", .dtype = RG_DTYPE_F32, .ndim = 2, .shape = {ROWS, COLS},
         .row_begin = begin, .row_count = count, .data = w},
        {.name = "cnt", .dtype = RG_DTYPE_I64, .ndim = 1, .shape = {1000}, .row_count = 1000,
         .data = cnt, .flags = RG_CKPT_REPLICATED},
    };
    rg_ckpt_t *ck = NULL;
    rg_ckpt_save_t *sv = NULL;
    rg_status_t st;

    ckpt_fill(w, RG_DTYPE_F32, begin * COLS, count * COLS, (uint64_t)c->step);
    ckpt_fill(cnt, RG_DTYPE_I64, 0, 1000, (uint64_t)c->step);
    st = rg_ckpt_create(&params, &ck);
    if (st == RG_OK) {
        st = rg_ckpt_save(ck, c->step, ts, c->rank == 0 ? 2 : 1, 0, &sv);
    }
    if (st == RG_OK) {
        st = rg_ckpt_save_wait(sv, 0);
    }
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck);
    free(w);
    return st;
}

static pid_t child_start(const child_t *c)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char v[32];
        if (c->kill_bytes >= 0) {
            snprintf(v, sizeof(v), "%" PRId64, c->kill_bytes);
            setenv("REGROUP_CKPT_KILL_AFTER_BYTES", v, 1);
        }
        if (c->kill_point >= 0) {
            snprintf(v, sizeof(v), "%" PRId64, c->kill_point);
            setenv("REGROUP_CKPT_KILL_AT_POINT", v, 1);
        }
        if (c->fsize > 0) {
            struct rlimit rl = {.rlim_cur = c->fsize, .rlim_max = c->fsize};
            signal(SIGXFSZ, SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) {
                _exit(99);
            }
        }
        _exit(-child_save(c));
    }
    return pid;
}

/* Runs a child to its end; returns its wait status. */
static int child_run(const child_t *c)
{
    int ws = 0;
    pid_t pid = child_start(c);
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    return ws;
}

static child_t plain(const char *r, int64_t step)
{
    return (child_t){.root = r, .rank = 0, .world = 1, .step = step, .kill_bytes = -1,
                     .kill_point = -1, .commit_ms = 30000};
}

/* Loads the newest checkpoint as one rank and checks it is exactly `want_step`'s state. */
static void check_newest(int64_t want_step)
{
    float *w = malloc((size_t)ROWS * COLS * sizeof(float));
    float *ref = malloc((size_t)ROWS * COLS * sizeof(float));
    int64_t cnt[1000];
    int64_t cref[1000];
    int64_t got = -1;
    rg_ckpt_request_t reqs[2] = {
        {.name = "w", .dtype = RG_DTYPE_F32, .row_count = ROWS, .dst = w,
         .dst_bytes = (size_t)ROWS * COLS * sizeof(float)},
        {.name = "cnt", .dtype = RG_DTYPE_I64, .row_count = 1000, .dst = cnt,
         .dst_bytes = sizeof(cnt)},
    };
    ck_assert_msg(rg_ckpt_load(root, -1, reqs, 2, &got) == RG_OK, "%s", rg_last_error());
    ck_assert_int_eq(got, want_step);
    ckpt_fill(ref, RG_DTYPE_F32, 0, (size_t)ROWS * COLS, (uint64_t)want_step);
    ckpt_fill(cref, RG_DTYPE_I64, 0, 1000, (uint64_t)want_step);
    ck_assert(memcmp(w, ref, (size_t)ROWS * COLS * sizeof(float)) == 0);
    ck_assert(memcmp(cnt, cref, sizeof(cnt)) == 0);
    free(w);
    free(ref);
}

static size_t committed(int64_t *newest)
{
    int64_t *steps = NULL;
    size_t n = 0;
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    *newest = n ? steps[0] : -1;
    free(steps);
    return n;
}

/* After a killed save of step 2 over a committed step 1. */
static void check_after_crash(const char *what, int64_t arg)
{
    int64_t newest;
    size_t n = committed(&newest);
    char dir[512];

    ck_assert_msg(n == 1 || (n == 2 && newest == 2), "%s %" PRId64 ": %zu committed", what,
                  arg, n);
    if (n == 2) {
        ck_assert_msg(rg_ckpt_verify(root, 2) == RG_OK, "%s %" PRId64 ": %s", what, arg,
                      rg_last_error());
    }
    ck_assert_msg(rg_ckpt_verify(root, 1) == RG_OK, "%s", rg_last_error());
    check_newest(newest);
    /* Reset for the next round: leftovers go, and so does a step 2 that made it. */
    ck_assert_int_eq(rg_ckpt_cleanup(root, NULL), RG_OK);
    snprintf(dir, sizeof(dir), "%s/step-2", root);
    test_rmtree(dir);
}

static int64_t total_bytes_of_step2(void)
{
    char scratch[256];
    char path[512];
    int64_t total = 0;
    const char *names[] = {"shard-00000.rgs", "shard-00000.rec", "MANIFEST"};
    child_t c;
    int ws;

    test_tmpdir(scratch, sizeof(scratch), "ckpt-scratch");
    c = plain(scratch, 2);
    ws = child_run(&c);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/step-2/%s", scratch, names[i]);
        ck_assert_int_gt(ckpt_file_size(path), 0);
        total += ckpt_file_size(path);
    }
    test_rmtree(scratch);
    return total;
}

START_TEST(test_kill_at_byte_counts)
{
    child_t c = plain(root, 1);
    int64_t total;
    int kills = 0;

    ck_assert_int_eq(WEXITSTATUS(child_run(&c)), 0);
    total = total_bytes_of_step2();
    /* The shard, then its record, then the MANIFEST: cut anywhere, including the edges. */
    const int64_t cuts[] = {0, 1, 63, 64, 65, 4096, total / 7, total / 3, total / 2,
                            total * 2 / 3, total - 400, total - 300, total - 200, total - 120,
                            total - 60, total - 1, total, total + 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        int ws;
        c = plain(root, 2);
        c.kill_bytes = cuts[i];
        ws = child_run(&c);
        ck_assert_msg((WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL) ||
                      (WIFEXITED(ws) && WEXITSTATUS(ws) == 0), "cut %" PRId64, cuts[i]);
        kills += WIFSIGNALED(ws);
        check_after_crash("bytes", cuts[i]);
    }
    ck_assert_int_ge(kills, 16);
}
END_TEST

START_TEST(test_kill_at_every_fault_point)
{
    child_t c = plain(root, 1);
    int64_t k;

    ck_assert_int_eq(WEXITSTATUS(child_run(&c)), 0);
    for (k = 1; k < 100; k++) {
        int ws;
        c = plain(root, 2);
        c.kill_point = k;
        ws = child_run(&c);
        if (WIFEXITED(ws)) {
            ck_assert_int_eq(WEXITSTATUS(ws), 0);
            check_after_crash("point", k);
            break;          /* past the last fault point: the save completed */
        }
        ck_assert_int_eq(WTERMSIG(ws), SIGKILL);
        check_after_crash("point", k);
    }
    ck_assert_int_ge(k, 9);     /* shard, record and MANIFEST: fsync, rename, dir fsync */
    ck_assert_int_lt(k, 100);
}
END_TEST

START_TEST(test_kill_one_rank_of_two)
{
    child_t c0 = plain(root, 1);
    child_t c1;
    pid_t p0;
    pid_t p1;
    int ws0;
    int ws1;
    int64_t newest;

    c0.world = 2;
    c1 = c0;
    c1.rank = 1;
    p0 = child_start(&c0);
    p1 = child_start(&c1);
    ck_assert_int_eq(waitpid(p0, &ws0, 0), p0);
    ck_assert_int_eq(waitpid(p1, &ws1, 0), p1);
    ck_assert(WIFEXITED(ws0) && WEXITSTATUS(ws0) == 0 && WIFEXITED(ws1) &&
              WEXITSTATUS(ws1) == 0);
    /* Step 2: rank 1 dies halfway through its shard; rank 0's commit must time out. */
    c0.step = c1.step = 2;
    c0.commit_ms = 1500;
    c1.kill_bytes = 100000;
    p0 = child_start(&c0);
    p1 = child_start(&c1);
    ck_assert_int_eq(waitpid(p0, &ws0, 0), p0);
    ck_assert_int_eq(waitpid(p1, &ws1, 0), p1);
    ck_assert(WIFSIGNALED(ws1) && WTERMSIG(ws1) == SIGKILL);
    ck_assert_msg(WIFEXITED(ws0) && WEXITSTATUS(ws0) == -RG_ETIMEDOUT, "rank 0 status %d",
                  ws0);
    ck_assert_uint_eq(committed(&newest), 1);
    check_newest(1);
}
END_TEST

START_TEST(test_disk_full)
{
    child_t c = plain(root, 1);
    char dir[512];
    DIR *d;
    struct dirent *de;
    int64_t newest;
    int ws;

    ck_assert_int_eq(WEXITSTATUS(child_run(&c)), 0);
    /* Files may not grow past 200 KiB: the ~1 MiB shard cannot be written. */
    c = plain(root, 2);
    c.fsize = 200 * 1024;
    ws = child_run(&c);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == -RG_ENOSPC, "status %d", ws);
    ck_assert_uint_eq(committed(&newest), 1);
    check_newest(1);
    /* Nothing of the failed save is left but its (empty) directory. */
    snprintf(dir, sizeof(dir), "%s/step-2", root);
    d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)) != NULL) {
        ck_assert_msg(de->d_name[0] == '.' && (de->d_name[1] == '\0' ||
                      (de->d_name[1] == '.' && de->d_name[2] == '\0')), "left: %s",
                      de->d_name);
    }
    closedir(d);
    /* With room again, the same step saves and commits. */
    c.fsize = 0;
    ck_assert_int_eq(WEXITSTATUS(child_run(&c)), 0);
    check_newest(2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_crash");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, root_up, root_down);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_kill_at_byte_counts);
    tcase_add_test(tc, test_kill_at_every_fault_point);
    tcase_add_test(tc, test_kill_one_rank_of_two);
    tcase_add_test(tc, test_disk_full);
    suite_add_tcase(s, tc);
    return test_main("test_ckpt_crash", s, NULL);
}
