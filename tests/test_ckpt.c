/* ckpt/: round trips, resharding, verification and fallback, retention, bad input. */
#include "ckpt_testutil.h"
#include "test_util.h"

#include <regroup/ckpt.h>
#include <regroup/etcd.h>
#include "rdzv_keys.h"

#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void root_up(void)
{
    test_tmpdir(root, sizeof(root), "ckpt");
}

static void root_down(void)
{
    test_rmtree(root);
}

static uint64_t deadline_s(int s)
{
    return rg_deadline_in_ms(s * 1000);
}

/* ---- a model: tensors sharded by rows, plus one replicated ----------------------------- */

typedef struct {
    const char *name;
    rg_dtype_t  dtype;
    int         ndim;
    uint64_t    shape[RG_CKPT_MAX_DIMS];
    bool        replicated;
    uint64_t    seed;
} model_tensor_t;

static const model_tensor_t model[] = {
    {"layer0.weight", RG_DTYPE_F32, 2, {1000, 33}, false, 1},
    {"layer0.bias", RG_DTYPE_F64, 1, {1001}, false, 2},
    {"embed", RG_DTYPE_BF16, 2, {257, 64}, false, 3},
    {"half", RG_DTYPE_F16, 3, {130, 4, 9}, false, 4},
    {"counts", RG_DTYPE_I64, 1, {5003}, false, 5},
    {"ids", RG_DTYPE_I32, 2, {77, 130}, false, 6},
    {"mask", RG_DTYPE_U8, 1, {70001}, false, 7},
    {"sampler.state", RG_DTYPE_U8, 1, {93}, true, 8},
    {"empty", RG_DTYPE_F32, 2, {0, 5}, false, 9},
};
#define N_MODEL (sizeof(model) / sizeof(model[0]))

static void rows_of(uint64_t rows, int rank, int world, uint64_t *begin, uint64_t *count)
{
    *begin = rows * (uint64_t)rank / (uint64_t)world;
    *count = rows * (uint64_t)(rank + 1) / (uint64_t)world - *begin;
}

typedef struct {
    int rank;
    int world;
    int64_t step;
    uint64_t salt;
    size_t chunk;
    rg_status_t st;
    char err[512];
} saver_arg_t;

/* Saves this rank's slice of the model (contents depend on step via salt). */
static rg_status_t save_model(rg_ckpt_t *ck, int rank, int world, int64_t step, uint64_t salt,
                              rg_ckpt_save_t **save_p)
{
    rg_ckpt_tensor_t ts[N_MODEL];
    void *bufs[N_MODEL];
    size_t n = 0;
    rg_status_t st;

    for (size_t i = 0; i < N_MODEL; i++) {
        const model_tensor_t *m = &model[i];
        uint64_t begin;
        uint64_t count;
        uint64_t re = ckpt_row_elems(m->shape, m->ndim);
        if (m->replicated) {
            if (rank != world - 1) {
                continue;       /* saved by one rank only */
            }
            begin = 0;
            count = m->shape[0];
        } else {
            rows_of(m->shape[0], rank, world, &begin, &count);
        }
        bufs[n] = malloc(count * re * rg_dtype_size(m->dtype) + 1);
        ckpt_fill(bufs[n], m->dtype, begin * re, count * re, m->seed + salt);
        ts[n] = (rg_ckpt_tensor_t){.name = m->name, .dtype = m->dtype, .ndim = m->ndim,
                                   .row_begin = begin, .row_count = count, .data = bufs[n],
                                   .flags = m->replicated ? RG_CKPT_REPLICATED : 0};
        memcpy(ts[n].shape, m->shape, sizeof(m->shape));
        n++;
    }
    st = rg_ckpt_save(ck, step, ts, n, 0, save_p);
    /* The save copied them: scribble over the originals to prove it. */
    for (size_t i = 0; i < n; i++) {
        memset(bufs[i], 0xee, ts[i].row_count * ckpt_row_elems(ts[i].shape, ts[i].ndim) *
                                  rg_dtype_size(ts[i].dtype));
        free(bufs[i]);
    }
    return st;
}

static void *saver_main(void *p)
{
    saver_arg_t *a = p;
    rg_ckpt_params_t params = {.root = root, .rank = a->rank, .world_size = a->world,
                               .chunk_bytes = a->chunk, .commit_timeout_ms = 60000};
    rg_ckpt_t *ck = NULL;
    rg_ckpt_save_t *sv = NULL;

    a->st = rg_ckpt_create(&params, &ck);
    if (a->st == RG_OK) {
        a->st = save_model(ck, a->rank, a->world, a->step, a->salt, &sv);
    }
    if (a->st == RG_OK) {
        a->st = rg_ckpt_save_wait(sv, deadline_s(60));
    }
    snprintf(a->err, sizeof(a->err), "%s", rg_last_error());
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck);
    return NULL;
}

/* Saves the model at `world` ranks, one thread per rank, each with its own checkpointer. */
static void save_world(int world, int64_t step, uint64_t salt, size_t chunk)
{
    pthread_t th[16];
    saver_arg_t args[16];
    ck_assert_int_le(world, 16);
    for (int r = 0; r < world; r++) {
        args[r] = (saver_arg_t){.rank = r, .world = world, .step = step, .salt = salt,
                                .chunk = chunk};
        ck_assert_int_eq(pthread_create(&th[r], NULL, saver_main, &args[r]), 0);
    }
    for (int r = 0; r < world; r++) {
        pthread_join(th[r], NULL);
    }
    for (int r = 0; r < world; r++) {
        ck_assert_msg(args[r].st == RG_OK, "rank %d: %s: %s", r, rg_status_name(args[r].st),
                      args[r].err);
    }
}

/* Loads the model as rank `rank` of `world` and compares with what was saved. */
static void check_load_as(int rank, int world, int64_t want_step, uint64_t salt)
{
    rg_ckpt_request_t reqs[N_MODEL];
    void *bufs[N_MODEL];
    int64_t got_step = -1;
    rg_status_t st;

    for (size_t i = 0; i < N_MODEL; i++) {
        const model_tensor_t *m = &model[i];
        uint64_t begin;
        uint64_t count;
        uint64_t re = ckpt_row_elems(m->shape, m->ndim);
        if (m->replicated) {
            begin = 0;
            count = m->shape[0];
        } else {
            rows_of(m->shape[0], rank, world, &begin, &count);
        }
        bufs[i] = calloc(1, count * re * rg_dtype_size(m->dtype) + 1);
        reqs[i] = (rg_ckpt_request_t){.name = m->name, .dtype = m->dtype, .row_begin = begin,
                                      .row_count = count, .dst = bufs[i],
                                      .dst_bytes = count * re * rg_dtype_size(m->dtype)};
    }
    st = rg_ckpt_load(root, -1, reqs, N_MODEL, &got_step);
    ck_assert_msg(st == RG_OK, "load as %d/%d: %s", rank, world, rg_last_error());
    ck_assert_int_eq(got_step, want_step);
    for (size_t i = 0; i < N_MODEL; i++) {
        const model_tensor_t *m = &model[i];
        uint64_t re = ckpt_row_elems(m->shape, m->ndim);
        void *want = malloc(reqs[i].dst_bytes + 1);
        ckpt_fill(want, m->dtype, reqs[i].row_begin * re, reqs[i].row_count * re,
                  m->seed + salt);
        ck_assert_msg(memcmp(want, bufs[i], reqs[i].dst_bytes) == 0,
                      "tensor %s differs when loaded as rank %d of %d", m->name, rank, world);
        free(want);
        free(bufs[i]);
    }
}

START_TEST(test_roundtrip_every_dtype)
{
    int64_t *steps = NULL;
    size_t n = 0;
    rg_ckpt_reader_t *rd;
    rg_ckpt_tensor_info_t info;

    save_world(1, 7, 0, 16384);
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(steps[0], 7);
    free(steps);
    check_load_as(0, 1, 7, 0);
    ck_assert_msg(rg_ckpt_verify(root, 7) == RG_OK, "%s", rg_last_error());
    ck_assert_int_eq(rg_ckpt_reader_open(root, 7, &rd), RG_OK);
    ck_assert_int_eq(rg_ckpt_reader_step(rd), 7);
    ck_assert_int_eq(rg_ckpt_reader_info(rd, "half", &info), RG_OK);
    ck_assert_int_eq(info.dtype, RG_DTYPE_F16);
    ck_assert_int_eq(info.ndim, 3);
    ck_assert_uint_eq(info.shape[2], 9);
    ck_assert(!info.replicated);
    ck_assert_int_eq(rg_ckpt_reader_info(rd, "sampler.state", &info), RG_OK);
    ck_assert(info.replicated);
    ck_assert_int_eq(rg_ckpt_reader_info(rd, "nope", &info), RG_ENOENT);
    rg_ckpt_reader_close(rd);
}
END_TEST

START_TEST(test_save_4_load_2_3_8)
{
    save_world(4, 100, 11, 8192);
    for (int w = 1; w <= 8; w++) {
        if (w != 2 && w != 3 && w != 8 && w != 1) {
            continue;
        }
        for (int r = 0; r < w; r++) {
            check_load_as(r, w, 100, 11);
        }
    }
}
END_TEST

START_TEST(test_request_mismatch)
{
    rg_ckpt_reader_t *rd;
    float buf[66];
    rg_ckpt_request_t req = {.name = "layer0.weight", .dtype = RG_DTYPE_F64, .row_begin = 0,
                             .row_count = 2, .dst = buf, .dst_bytes = sizeof(buf)};
    save_world(1, 1, 0, 0);
    ck_assert_int_eq(rg_ckpt_reader_open(root, 1, &rd), RG_OK);
    ck_assert_int_eq(rg_ckpt_reader_read(rd, &req), RG_EINVAL);       /* wrong dtype */
    req.dtype = RG_DTYPE_F32;
    ck_assert_int_eq(rg_ckpt_reader_read(rd, &req), RG_OK);
    req.row_begin = 999;                                                /* past the end */
    ck_assert_int_eq(rg_ckpt_reader_read(rd, &req), RG_EINVAL);
    req.row_begin = 0;
    req.dst_bytes = 8;                                                  /* too small */
    ck_assert_int_eq(rg_ckpt_reader_read(rd, &req), RG_EINVAL);
    rg_ckpt_reader_close(rd);
    ck_assert_int_eq(rg_ckpt_reader_open(root, 2, &rd), RG_ENOENT);
}
END_TEST

static void shard_path(char *out, size_t cap, int64_t step, int rank)
{
    snprintf(out, cap, "%s/step-%" PRId64 "/shard-%05d.rgs", root, step, rank);
}

START_TEST(test_flipped_byte_falls_back)
{
    char path[512];
    int64_t size;

    save_world(2, 1, 0, 8192);
    save_world(2, 2, 5, 8192);
    shard_path(path, sizeof(path), 2, 1);
    size = ckpt_file_size(path);
    ck_assert_int_gt(size, 1000);
    ckpt_flip_byte(path, size / 2);                 /* inside some chunk */
    ck_assert_int_eq(rg_ckpt_verify(root, 2), RG_ECORRUPT);
    ck_assert_msg(strstr(rg_last_error(), "shard-00001.rgs") != NULL, "%s", rg_last_error());
    ck_assert_int_eq(rg_ckpt_verify(root, 1), RG_OK);
    check_load_as(0, 1, 1, 0);                       /* step 2 is bad: step 1 is used */
    check_load_as(1, 3, 1, 0);
}
END_TEST

START_TEST(test_header_index_damage_detected)
{
    char path[512];
    int64_t got;
    const int64_t offs[] = {5, 40, -5, -20, -40};
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
        root_down();
        root_up();
        save_world(1, 1, 0, 0);
        save_world(1, 2, 5, 0);
        shard_path(path, sizeof(path), 2, 0);
        ckpt_flip_byte(path, offs[i]);
        ck_assert_int_eq(rg_ckpt_verify(root, 2), RG_ECORRUPT);
        ck_assert_int_eq(rg_ckpt_load(root, -1, NULL, 0, &got), RG_OK);
        ck_assert_int_eq(got, 1);
    }
}
END_TEST

START_TEST(test_missing_or_truncated_shard_falls_back)
{
    char path[512];
    rg_ckpt_reader_t *rd;

    save_world(2, 1, 0, 0);
    save_world(2, 2, 5, 0);
    save_world(2, 3, 9, 0);
    shard_path(path, sizeof(path), 3, 0);
    ck_assert_int_eq(unlink(path), 0);
    shard_path(path, sizeof(path), 2, 1);
    ck_assert_int_eq(truncate(path, ckpt_file_size(path) - 100), 0);
    ck_assert_int_eq(rg_ckpt_reader_open(root, 3, &rd), RG_ECORRUPT);
    ck_assert_msg(strstr(rg_last_error(), "shard-00000.rgs") != NULL, "%s", rg_last_error());
    ck_assert_int_eq(rg_ckpt_reader_open(root, 2, &rd), RG_ECORRUPT);
    ck_assert_msg(strstr(rg_last_error(), "shard-00001.rgs") != NULL, "%s", rg_last_error());
    check_load_as(0, 2, 1, 0);
    /* With every checkpoint bad the load fails, naming the problem. */
    shard_path(path, sizeof(path), 1, 1);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(rg_ckpt_load(root, -1, NULL, 0, NULL), RG_ECORRUPT);
}
END_TEST

START_TEST(test_manifest_mismatch)
{
    char src[512];
    char dst[512];
    rg_ckpt_reader_t *rd;

    /* Step 2's shard swapped for step 1's: sizes may agree, step and checksum do not. */
    save_world(1, 1, 0, 0);
    save_world(1, 2, 0, 0);
    shard_path(src, sizeof(src), 1, 0);
    shard_path(dst, sizeof(dst), 2, 0);
    ck_assert_int_eq(rename(src, dst), 0);
    ck_assert_int_eq(rg_ckpt_reader_open(root, 2, &rd), RG_ECORRUPT);
    ck_assert_int_eq(rg_ckpt_reader_open(root, 1, &rd), RG_ECORRUPT);
    ck_assert_int_eq(rg_ckpt_load(root, -1, NULL, 0, NULL), RG_ECORRUPT);
}
END_TEST

START_TEST(test_retention)
{
    rg_ckpt_params_t params = {.root = root, .rank = 0, .world_size = 1, .keep_last = 2,
                               .keep_every = 5};
    rg_ckpt_t *ck;
    rg_ckpt_save_t *sv;
    int64_t *steps;
    size_t n;
    char dir[512];
    struct stat sb;
    size_t removed = 0;

    /* Leftovers of a crashed save: an older one goes at the next commit, a newer one stays
     * (it could be in flight) until an explicit cleanup. */
    snprintf(dir, sizeof(dir), "%s/step-3", root);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(dir, sizeof(dir), "%s/step-99", root);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_OK);
    for (int64_t s = 1; s <= 12; s++) {
        if (s == 3) {
            continue;
        }
        ck_assert_int_eq(save_model(ck, 0, 1, s, 0, &sv), RG_OK);
        ck_assert_msg(rg_ckpt_save_wait(sv, deadline_s(30)) == RG_OK, "%s", rg_last_error());
        rg_ckpt_save_release(sv);
    }
    rg_ckpt_destroy(ck);
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(steps[0], 12);
    ck_assert_int_eq(steps[1], 11);
    ck_assert_int_eq(steps[2], 10);
    ck_assert_int_eq(steps[3], 5);
    free(steps);
    for (int64_t s = 1; s <= 9; s++) {
        snprintf(dir, sizeof(dir), "%s/step-%" PRId64, root, s);
        ck_assert_msg(stat(dir, &sb) != 0 || s == 5, "step-%" PRId64 " still there", s);
    }
    snprintf(dir, sizeof(dir), "%s/step-99", root);
    ck_assert_int_eq(stat(dir, &sb), 0);
    ck_assert_int_eq(rg_ckpt_cleanup(root, &removed), RG_OK);
    ck_assert_uint_eq(removed, 1);
    ck_assert_int_ne(stat(dir, &sb), 0);
    check_load_as(0, 1, 12, 0);
}
END_TEST

START_TEST(test_skip_if_busy_and_commit_timeout)
{
    /* Rank 0 of 2 alone: its commit waits for rank 1's record, which never comes. */
    rg_ckpt_params_t params = {.root = root, .rank = 0, .world_size = 2,
                               .commit_timeout_ms = 600, .busy_timeout_ms = 50};
    rg_ckpt_t *ck;
    rg_ckpt_save_t *sv;
    rg_ckpt_save_t *sv2 = NULL;
    int64_t *steps;
    size_t n;

    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_OK);
    ck_assert_int_eq(save_model(ck, 0, 2, 1, 0, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save(ck, 2, NULL, 0, RG_CKPT_SAVE_SKIP_IF_BUSY, &sv2), RG_EAGAIN);
    ck_assert_ptr_null(sv2);
    /* Without the flag it waits, but no longer than busy_timeout_ms. */
    ck_assert_int_eq(rg_ckpt_save(ck, 2, NULL, 0, 0, &sv2), RG_ETIMEDOUT);
    ck_assert_msg(strstr(rg_last_error(), "still running") != NULL, "%s", rg_last_error());
    ck_assert_ptr_null(sv2);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, rg_deadline_in_ms(1)), RG_ETIMEDOUT);
    /* The default deadline is busy_timeout_ms (50 ms), not the commit's 600 ms or forever;
     * a passed deadline only looks. */
    uint64_t t0 = rg_now_ns();
    ck_assert_int_eq(rg_ckpt_save_wait(sv, RG_DEADLINE_DEFAULT), RG_ETIMEDOUT);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, RG_DEADLINE_POLL), RG_ETIMEDOUT);
    ck_assert_msg(rg_now_ns() - t0 < 400000000ull, "waited %llu ms",
                  (unsigned long long)((rg_now_ns() - t0) / 1000000));
    ck_assert_int_eq(rg_ckpt_save_status(sv), RG_INPROGRESS);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_ETIMEDOUT);
    ck_assert_msg(strstr(rg_last_error(), "1 of 2 shards") != NULL, "%s", rg_last_error());
    ck_assert_int_eq(rg_ckpt_save_status(sv), RG_ETIMEDOUT);
    ck_assert_str_ne(rg_ckpt_save_error(sv), "");
    rg_ckpt_save_release(sv);
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    ck_assert_uint_eq(n, 0);
    free(steps);
    ck_assert_int_eq(rg_ckpt_load(root, -1, NULL, 0, NULL), RG_ENOENT);
    rg_ckpt_destroy(ck);
}
END_TEST

/* Regression (found by the chaos soak): rank 0 of a new attempt at a step must not commit
 * with another rank's record left by an earlier attempt at the same step, whose shard that
 * rank is about to replace. */
START_TEST(test_stale_record_of_earlier_attempt)
{
    rg_ckpt_params_t p1 = {.root = root, .rank = 1, .world_size = 2, .attempt = 1};
    rg_ckpt_params_t p0 = {.root = root, .rank = 0, .world_size = 2, .attempt = 2,
                           .commit_timeout_ms = 500};
    rg_ckpt_t *ck1;
    rg_ckpt_t *ck0;
    rg_ckpt_save_t *sv;
    int64_t *steps;
    size_t n;

    /* Attempt 1: rank 1 wrote its shard and record of step 7, then the job restarted. */
    ck_assert_int_eq(rg_ckpt_create(&p1, &ck1), RG_OK);
    ck_assert_int_eq(save_model(ck1, 1, 2, 7, 0, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_OK);
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck1);
    /* Attempt 2: rank 0 saves step 7 first; rank 1's old record must not count. */
    ck_assert_int_eq(rg_ckpt_create(&p0, &ck0), RG_OK);
    ck_assert_int_eq(save_model(ck0, 0, 2, 7, 1, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_ETIMEDOUT);
    ck_assert_msg(strstr(rg_ckpt_save_error(sv), "1 of 2 shards") != NULL, "%s",
                  rg_ckpt_save_error(sv));
    rg_ckpt_save_release(sv);
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    ck_assert_uint_eq(n, 0);
    free(steps);
    /* With rank 1's record of attempt 2 there, the step commits. */
    p1.attempt = 2;
    ck_assert_int_eq(rg_ckpt_create(&p1, &ck1), RG_OK);
    ck_assert_int_eq(save_model(ck1, 1, 2, 7, 1, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_OK);
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck1);
    p0.commit_timeout_ms = 30000;
    rg_ckpt_destroy(ck0);
    ck_assert_int_eq(rg_ckpt_create(&p0, &ck0), RG_OK);
    ck_assert_int_eq(save_model(ck0, 0, 2, 7, 1, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_OK);
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck0);
    check_load_as(0, 1, 7, 1);
    /* A committed step that cannot be used can be removed, then saved again. */
    ck_assert_int_eq(rg_ckpt_remove(root, 7), RG_OK);
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    ck_assert_uint_eq(n, 0);
    free(steps);
}
END_TEST

START_TEST(test_bad_arguments)
{
    rg_ckpt_params_t params = {.root = root, .rank = 0, .world_size = 1};
    rg_ckpt_t *ck;
    rg_ckpt_save_t *sv = NULL;
    float a[4] = {1, 2, 3, 4};
    rg_ckpt_tensor_t ts[2] = {
        {.name = "a", .dtype = RG_DTYPE_F32, .ndim = 1, .shape = {4}, .row_count = 4,
         .data = a},
        {.name = "a", .dtype = RG_DTYPE_F32, .ndim = 1, .shape = {4}, .row_count = 4,
         .data = a},
    };
    char file[512];
    int fd;

    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_OK);
    ck_assert_int_eq(rg_ckpt_save(ck, 1, ts, 2, 0, &sv), RG_EINVAL);      /* same name */
    ts[1].name = "b";
    ts[1].row_count = 5;
    ck_assert_int_eq(rg_ckpt_save(ck, 1, ts, 2, 0, &sv), RG_EINVAL);      /* rows > shape */
    ts[1].row_count = 4;
    ts[1].dtype = (rg_dtype_t)99;
    ck_assert_int_eq(rg_ckpt_save(ck, 1, ts, 2, 0, &sv), RG_EINVAL);      /* dtype */
    ts[1].dtype = RG_DTYPE_F32;
    ts[1].flags = RG_CKPT_REPLICATED;
    ts[1].row_count = 2;
    ck_assert_int_eq(rg_ckpt_save(ck, 1, ts, 2, 0, &sv), RG_EINVAL);      /* partial replica */
    ck_assert_int_eq(rg_ckpt_save(ck, -1, ts, 1, 0, &sv), RG_EINVAL);
    ck_assert_ptr_null(sv);
    ck_assert_int_eq(rg_ckpt_save(ck, 1, ts, 1, 0, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_OK);
    rg_ckpt_save_release(sv);
    sv = NULL;
    ck_assert_int_eq(rg_ckpt_save(ck, 1, ts, 1, 0, &sv), RG_EEXIST);      /* committed */
    rg_ckpt_destroy(ck);

    /* A root below a regular file cannot be written: a clear error, no crash. */
    snprintf(file, sizeof(file), "%s/plainfile", root);
    fd = open(file, O_CREAT | O_WRONLY, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
    snprintf(file, sizeof(file), "%s/plainfile/ckpt", root);
    params.root = file;
    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_EIO);
    ck_assert_msg(strstr(rg_last_error(), "plainfile") != NULL, "%s", rg_last_error());
    params.world_size = 0;
    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_EINVAL);
}
END_TEST

START_TEST(test_write_error_surfaces_on_handle)
{
    rg_ckpt_params_t params = {.root = root, .rank = 0, .world_size = 1};
    rg_ckpt_t *ck;
    rg_ckpt_save_t *sv;
    char path[512];
    int fd;
    int64_t *steps;
    size_t n;

    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_OK);
    /* A plain file where step 4's directory belongs. */
    snprintf(path, sizeof(path), "%s/step-4", root);
    fd = open(path, O_CREAT | O_WRONLY, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(save_model(ck, 0, 1, 4, 0, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_EIO);
    ck_assert_msg(strstr(rg_last_error(), "step-4") != NULL, "%s", rg_last_error());
    rg_ckpt_save_release(sv);
    /* The next save works. */
    ck_assert_int_eq(save_model(ck, 0, 1, 5, 0, &sv), RG_OK);
    ck_assert_int_eq(rg_ckpt_save_wait(sv, deadline_s(30)), RG_OK);
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck);
    ck_assert_int_eq(rg_ckpt_list(root, &steps, &n), RG_OK);
    ck_assert_uint_eq(n, 1);
    free(steps);
}
END_TEST

START_TEST(test_commit_recorded_in_etcd)
{
    test_etcd_t etcd;
    rg_etcd_t *cli;
    rg_ckpt_params_t params = {.root = root, .rank = 0, .world_size = 1, .job = "job-7"};
    rg_ckpt_t *ck;
    rg_ckpt_save_t *sv;
    char *value = NULL;
    size_t len = 0;

    rdzv_keys_t keys;
    char latest[RDZV_KEY_MAX];
    int64_t got = -1;
    ck_assert_int_eq(rdzv_keys_init(&keys, "job-7"), RG_OK);
    ck_assert_int_eq(rdzv_keys_ckpt_latest(&keys, latest, sizeof(latest)), RG_OK);
    test_etcd_up(&etcd, NULL);
    ck_assert_int_eq(rg_etcd_create(&etcd.params, &cli), RG_OK);
    params.etcd = cli;
    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_OK);
    for (int64_t s = 3; s <= 4; s++) {
        ck_assert_int_eq(save_model(ck, 0, 1, s, 0, &sv), RG_OK);
        ck_assert_msg(rg_ckpt_save_wait(sv, deadline_s(30)) == RG_OK, "%s", rg_last_error());
        rg_ckpt_save_release(sv);
        ck_assert_int_eq(rg_etcd_get(cli, latest, 0, &value, &len, NULL), RG_OK);
        ck_assert_int_eq(rdzv_rec_ckpt_latest_decode(value, len, &got), RG_OK);
        ck_assert_int_eq(got, s);
        free(value);
    }
    /* etcd gone: the step is committed on disk, and the handle says etcd failed. */
    test_etcd_down(&etcd);
    ck_assert_int_eq(save_model(ck, 0, 1, 5, 0, &sv), RG_OK);
    ck_assert_int_ne(rg_ckpt_save_wait(sv, deadline_s(60)), RG_OK);
    ck_assert_msg(strstr(rg_last_error(), "committed on disk but not in etcd") != NULL, "%s",
                  rg_last_error());
    rg_ckpt_save_release(sv);
    rg_ckpt_destroy(ck);
    rg_etcd_destroy(cli);
    check_load_as(0, 1, 5, 0);
    params.job = NULL;
    ck_assert_int_eq(rg_ckpt_create(&params, &ck), RG_EINVAL);     /* etcd needs a job */
}
END_TEST

/* Copies tests/data/ckpt/<src> to <root>/step-1/<dst>. */
static void install_golden(const char *src, const char *dst)
{
    char from[512];
    char to[512];
    char buf[4096];
    FILE *in;
    FILE *out;
    size_t n;

    snprintf(to, sizeof(to), "%s/step-1", root);
    mkdir(to, 0755);
    snprintf(from, sizeof(from), "%s/%s", CKPT_TEST_DATA, src);
    snprintf(to, sizeof(to), "%s/step-1/%s", root, dst);
    in = fopen(from, "rb");
    out = fopen(to, "wb");
    ck_assert_msg(in != NULL && out != NULL, "%s", from);
    n = fread(buf, 1, sizeof(buf), in);
    ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

START_TEST(test_golden_inputs)
{
    static const struct {
        const char *manifest;
        const char *shard;
        const char *says;
    } bad[] = {
        {"manifest-truncated", "shard-good.rgs", "checksum line"},
        {"manifest-bad-crc", "shard-good.rgs", "checksum line"},
        {"manifest-version2", "shard-good.rgs", "MANIFEST version 2"},
        {"manifest-huge-world", "shard-good.rgs", "world_size 65536"},
        {"manifest-wrong-size", "shard-good.rgs", "does not match the MANIFEST"},
        {"manifest-wrong-checksum", "shard-good.rgs", "index does not match"},
        {"manifest-good", "shard-truncated.rgs", "does not match the MANIFEST"},
        {"manifest-good", "shard-foreign.rgs", "not a regroup shard"},
        {"manifest-good", "shard-version2.rgs", "format version 2"},
    };
    rg_ckpt_reader_t *rd = NULL;
    float w[2][4];
    uint8_t u[5];
    rg_ckpt_request_t reqs[2] = {
        {.name = "w", .dtype = RG_DTYPE_F32, .row_begin = 1, .row_count = 1, .dst = w[1],
         .dst_bytes = sizeof(w[1])},
        {.name = "u", .dtype = RG_DTYPE_U8, .row_count = 5, .dst = u, .dst_bytes = 5},
    };
    int64_t step = -1;

    install_golden("manifest-good", "MANIFEST");
    install_golden("shard-good.rgs", "shard-00000.rgs");
    ck_assert_msg(rg_ckpt_load(root, -1, reqs, 2, &step) == RG_OK, "%s", rg_last_error());
    ck_assert_int_eq(step, 1);
    ck_assert(w[1][0] == 3.0f && w[1][2] == -1.5f && w[1][3] == 0.125f);
    ck_assert(u[0] == 1 && u[4] == 5);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        install_golden(bad[i].manifest, "MANIFEST");
        install_golden(bad[i].shard, "shard-00000.rgs");
        ck_assert_int_eq(rg_ckpt_reader_open(root, 1, &rd), RG_ECORRUPT);
        ck_assert_msg(strstr(rg_last_error(), bad[i].says) != NULL, "%s + %s: %s",
                      bad[i].manifest, bad[i].shard, rg_last_error());
        ck_assert_int_eq(rg_ckpt_load(root, -1, reqs, 2, NULL), RG_ECORRUPT);
        ck_assert_int_eq(rg_ckpt_verify(root, 1), RG_ECORRUPT);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, root_up, root_down);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip_every_dtype);
    tcase_add_test(tc, test_save_4_load_2_3_8);
    tcase_add_test(tc, test_request_mismatch);
    tcase_add_test(tc, test_flipped_byte_falls_back);
    tcase_add_test(tc, test_header_index_damage_detected);
    tcase_add_test(tc, test_missing_or_truncated_shard_falls_back);
    tcase_add_test(tc, test_manifest_mismatch);
    tcase_add_test(tc, test_retention);
    tcase_add_test(tc, test_skip_if_busy_and_commit_timeout);
    tcase_add_test(tc, test_stale_record_of_earlier_attempt);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_write_error_surfaces_on_handle);
    tcase_add_test(tc, test_commit_recorded_in_etcd);
    tcase_add_test(tc, test_golden_inputs);
    suite_add_tcase(s, tc);
    return test_main("test_ckpt", s, NULL);
}
