/* train/data_loader.c: the prefetching loader gives exactly the sampler's ids with the right
 * records, keeps going across epochs, resizes by destroy + create from a saved cursor, and
 * stops its thread cleanly (ASan checks for leaks). */
#include <regroup/data.h>

#include "test_util.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define N  257
#define RS 5
#define B  24

static rg_dataset_t *make_dataset(void)
{
    uint8_t rec[N * RS];
    uint8_t lab[N];
    for (size_t i = 0; i < N; i++) {
        for (size_t k = 0; k < RS; k++) {
            rec[i * RS + k] = (uint8_t)(i * 13 + k * 101);
        }
        lab[i] = (uint8_t)(i % 10);
    }
    rg_dataset_t *ds = NULL;
    ck_assert_int_eq(rg_dataset_create(rec, lab, N, RS, &ds), RG_OK);
    return ds;
}

static const rg_sampler_params_t params = {.num_samples = N, .batch_size = B,
                                           .drop_last = false};

static rg_loader_t *make_loader(const rg_dataset_t *ds, uint32_t rank, uint32_t world,
                                const rg_data_cursor_t *c)
{
    rg_loader_t *l = NULL;
    ck_assert_msg(rg_loader_create(ds, &params, rank, world, c, &l) == RG_OK, "%s",
                  rg_last_error());
    return l;
}

/* ---- the loader's thread, seen from /proc --------------------------------------------- */

#define MAX_TASKS 64

/* The ids of this process's threads; returns how many (at most MAX_TASKS). */
static size_t list_tasks(pid_t *tids)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    size_t n = 0;
    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL && n < MAX_TASKS) {
        if (e->d_name[0] != '.') {
            tids[n++] = (pid_t)atoi(e->d_name);
        }
    }
    closedir(d);
    return n;
}

/* make_loader, also returning the id of the thread it started: the one task that was not
 * there before (this test starts no other threads). */
static rg_loader_t *make_loader_tid(const rg_dataset_t *ds, const rg_sampler_params_t *p,
                                    uint32_t rank, uint32_t world, const rg_data_cursor_t *c,
                                    pid_t *tid)
{
    pid_t before[MAX_TASKS];
    pid_t after[MAX_TASKS];
    size_t nb = list_tasks(before);
    rg_loader_t *l = NULL;
    ck_assert_msg(rg_loader_create(ds, p, rank, world, c, &l) == RG_OK, "%s", rg_last_error());
    size_t na = list_tasks(after);
    *tid = 0;
    for (size_t i = 0; i < na; i++) {
        bool old = false;
        for (size_t j = 0; j < nb; j++) {
            old = old || after[i] == before[j];
        }
        if (!old) {
            ck_assert_msg(*tid == 0, "more than one new thread");
            *tid = after[i];
        }
    }
    ck_assert_int_gt(*tid, 0);
    return l;
}

/* The scheduler state of one of our threads ('R', 'S', ...), 0 if it is gone. */
static char task_state(pid_t tid)
{
    char path[64];
    char buf[512];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* "tid (name) S ...": the name may hold anything */
    return p != NULL && p[1] == ' ' ? p[2] : 0;
}

/*
 * Waits until the loader's ring is full. Its thread sleeps only in the wait for a free slot
 * (while this thread, its only caller, is outside the loader there is no one to contend for
 * its lock), so the thread being asleep means every slot is filled: RG_LOADER_DEPTH batches
 * are ready beyond the one the caller holds (all RG_LOADER_DEPTH + 1 if it holds none).
 */
static void wait_queue_full(pid_t tid)
{
    TEST_WAIT_UNTIL(task_state(tid) == 'S', 10000, "the loader's queue never filled (thread %c)",
                    task_state(tid));
}

static void check_batch_records(const rg_dataset_t *ds, const rg_batch_t *b)
{
    ck_assert_uint_eq(b->record_size, RS);
    for (size_t i = 0; i < b->count; i++) {
        uint32_t id = b->ids[i];
        ck_assert_uint_lt(id, N);
        ck_assert_uint_eq(b->labels[i], rg_dataset_labels(ds)[id]);
        for (size_t k = 0; k < RS; k++) {
            float want = (float)rg_dataset_records(ds)[id * RS + k] / 255.0f;
            ck_assert_float_eq_tol(b->inputs[i * RS + k], want, 1e-6f);
        }
    }
}

/* Three ranks' loaders against three samplers, over three epochs (with short last batches). */
START_TEST(test_loader_matches_sampler)
{
    rg_dataset_t    *ds = make_dataset();
    rg_data_cursor_t start = {.seed = 11, .epoch = 0, .step = 3};
    rg_loader_t     *loaders[3];
    rg_sampler_t    *sampler;
    ck_assert_int_eq(rg_sampler_create(&params, &sampler), RG_OK);
    for (uint32_t r = 0; r < 3; r++) {
        loaders[r] = make_loader(ds, r, 3, &start);
    }
    rg_data_cursor_t c = start;
    uint64_t steps = 3 * rg_sampler_steps_per_epoch(sampler);
    for (uint64_t s = 0; s < steps; s++) {
        for (uint32_t r = 0; r < 3; r++) {
            const rg_batch_t *b = NULL;
            ck_assert_msg(rg_loader_next(loaders[r], rg_deadline_in_ms(10000), &b) == RG_OK,
                          "%s", rg_last_error());
            uint32_t want[B];
            size_t   cnt;
            ck_assert_int_eq(rg_sampler_ids(sampler, &c, r, 3, want, B, &cnt), RG_OK);
            ck_assert_uint_eq(b->count, cnt);
            ck_assert_mem_eq(b->ids, want, cnt * sizeof(uint32_t));
            ck_assert_mem_eq(&b->cursor, &c, sizeof(c));
            ck_assert_uint_eq(b->global_count, rg_sampler_global_count(sampler, &c));
            check_batch_records(ds, b);
            rg_data_cursor_t next = c;
            rg_sampler_advance(sampler, &next);
            ck_assert_mem_eq(&b->next, &next, sizeof(next));
        }
        rg_sampler_advance(sampler, &c);
    }
    ck_assert_uint_eq(c.epoch, 3);
    for (uint32_t r = 0; r < 3; r++) {
        rg_loader_destroy(loaders[r]);
    }
    rg_sampler_destroy(sampler);
    rg_dataset_destroy(ds);
}
END_TEST

/* Resizing by destroy + create from the last batch's `next`: each epoch sees each id once. */
START_TEST(test_loader_resize_exactly_once)
{
    rg_dataset_t    *ds = make_dataset();
    const uint32_t   plan[][2] = {{4, 3}, {3, 5}, {1, 4}, {8, 2}, {2, 9}, {5, 6}, {7, 3},
                                  {6, 5}, {3, 11}, {1, 1}, {8, 7}, {2, 10}};
    uint8_t          used[2][N] = {{0}};
    rg_data_cursor_t cursor = rg_data_cursor_start(99);
    for (size_t seg = 0; seg < RG_ARRAY_SIZE(plan); seg++) {
        uint32_t     world = plan[seg][0];
        rg_loader_t *l[8];
        for (uint32_t r = 0; r < world; r++) {
            l[r] = make_loader(ds, r, world, &cursor);
        }
        rg_data_cursor_t next = cursor;
        for (uint32_t s = 0; s < plan[seg][1]; s++) {
            for (uint32_t r = 0; r < world; r++) {
                const rg_batch_t *b = NULL;
                ck_assert_int_eq(rg_loader_next(l[r], 0, &b), RG_OK);
                for (size_t i = 0; i < b->count; i++) {
                    if (b->cursor.epoch < 2) {
                        used[b->cursor.epoch][b->ids[i]]++;
                    }
                }
                next = b->next;
            }
        }
        for (uint32_t r = 0; r < world; r++) {
            rg_loader_destroy(l[r]); /* batches queued ahead are simply dropped */
        }
        cursor = next;
    }
    ck_assert_uint_ge(cursor.epoch, 2);
    for (int e = 0; e < 2; e++) {
        for (size_t id = 0; id < N; id++) {
            ck_assert_msg(used[e][id] == 1, "epoch %d id %zu used %u times", e, id,
                          used[e][id]);
        }
    }
    rg_dataset_destroy(ds);
}
END_TEST

/* Destroy in every state: before any batch, holding one, with a full queue (after 0..7
 * batches taken; that the queue is full is checked: the ready batches are all there). */
START_TEST(test_loader_destroy_states)
{
    rg_dataset_t    *ds = make_dataset();
    rg_data_cursor_t c = rg_data_cursor_start(1);
    const rg_batch_t *b;
    pid_t            tid;

    /* Before any batch: the thread is still at its first one. */
    rg_loader_destroy(make_loader(ds, 0, 2, &c));
    /* Holding one. */
    rg_loader_t *l = make_loader(ds, 0, 2, &c);
    ck_assert_int_eq(rg_loader_next(l, rg_deadline_in_ms(10000), &b), RG_OK);
    rg_loader_destroy(l);

    for (int held = 0; held < 8; held++) {
        l = make_loader_tid(ds, &params, 0, 2, &c, &tid);
        for (int i = 0; i < held; i++) {
            ck_assert_int_eq(rg_loader_next(l, rg_deadline_in_ms(10000), &b), RG_OK);
        }
        wait_queue_full(tid);
        /* Full means full: every ready batch comes even with a deadline long passed. */
        rg_data_cursor_t want = held > 0 ? b->next : c;
        int ready = held == 0 ? RG_LOADER_DEPTH + 1 : RG_LOADER_DEPTH;
        for (int k = 0; k < ready; k++) {
            rg_status_t st = rg_loader_next(l, 1, &b);
            ck_assert_msg(st == RG_OK, "after %d taken, ready batch %d of %d: %s", held, k,
                          ready, rg_last_error());
            ck_assert_mem_eq(&b->cursor, &want, sizeof(want));
            want = b->next;
        }
        /* Full again, then destroyed. */
        wait_queue_full(tid);
        rg_loader_destroy(l);
        b = NULL;
    }
    rg_loader_destroy(NULL);
    rg_dataset_destroy(ds);
}
END_TEST

/*
 * A passed deadline gives RG_ETIMEDOUT when no batch is ready, the ready batch when there is
 * one, and never loses or reorders a batch. First the ring is let fill: its batches all come
 * with a deadline long passed. Then the caller asks again and again with that deadline while
 * the thread prepares each next batch (1024 records of 784 bytes: far longer than a call), so
 * some calls find nothing ready and must time out; the batches still come, each once, in the
 * sampler's order.
 */
START_TEST(test_loader_timeout_keeps_order)
{
    enum { BN = 4096, BRS = 784, BB = 1024, TOTAL = 12 };
    uint8_t *rec = calloc((size_t)BN * BRS, 1);
    uint8_t *lab = calloc(BN, 1);
    for (size_t i = 0; i < (size_t)BN * BRS; i++) {
        rec[i] = (uint8_t)(i * 31);
    }
    rg_dataset_t *ds = NULL;
    ck_assert_int_eq(rg_dataset_create(rec, lab, BN, BRS, &ds), RG_OK);
    free(rec);
    free(lab);
    rg_sampler_params_t p = {.num_samples = BN, .batch_size = BB, .drop_last = false};
    rg_sampler_t       *sampler = NULL;
    ck_assert_int_eq(rg_sampler_create(&p, &sampler), RG_OK);
    rg_data_cursor_t c = rg_data_cursor_start(4);
    pid_t            tid;
    rg_loader_t     *l = make_loader_tid(ds, &p, 1, 2, &c, &tid);
    int              timeouts = 0;
    int              got = 0;
    uint32_t         want[BB];
    rg_deadline_t    until = rg_deadline_in_ms(30000);

    wait_queue_full(tid);
    while (got < TOTAL) {
        ck_assert_msg(!rg_deadline_passed(until), "%d batches in 30 s", got);
        const rg_batch_t *b = NULL;
        rg_status_t       st = rg_loader_next(l, 1, &b); /* 1 ns after boot: long passed */
        if (st == RG_ETIMEDOUT) {
            ck_assert_msg(got > RG_LOADER_DEPTH, "timed out with batch %d ready", got);
            ck_assert_msg(strstr(rg_last_error(), "deadline") != NULL, "%s", rg_last_error());
            timeouts++;
            continue;
        }
        ck_assert_msg(st == RG_OK, "%s", rg_last_error());
        size_t cnt;
        ck_assert_int_eq(rg_sampler_ids(sampler, &c, 1, 2, want, BB, &cnt), RG_OK);
        ck_assert_mem_eq(&b->cursor, &c, sizeof(c));
        ck_assert_uint_eq(b->count, cnt);
        ck_assert_mem_eq(b->ids, want, cnt * sizeof(uint32_t));
        rg_sampler_advance(sampler, &c);
        got++;
    }
    ck_assert_msg(timeouts > 0, "no call found the queue empty in %d batches", TOTAL);
    ck_assert_uint_eq(c.epoch, 3);
    ck_assert_uint_eq(c.step, 0);
    rg_loader_destroy(l);
    rg_sampler_destroy(sampler);
    rg_dataset_destroy(ds);
}
END_TEST

START_TEST(test_loader_bad_arguments)
{
    rg_dataset_t       *ds = make_dataset();
    rg_data_cursor_t    c = rg_data_cursor_start(1);
    rg_loader_t        *l = NULL;
    ck_assert_int_eq(rg_loader_create(ds, &params, 3, 3, &c, &l), RG_EINVAL);
    ck_assert_int_eq(rg_loader_create(ds, &params, 0, 0, &c, &l), RG_EINVAL);
    rg_sampler_params_t p = params;
    p.num_samples = N - 1;
    ck_assert_int_eq(rg_loader_create(ds, &p, 0, 1, &c, &l), RG_EINVAL);
    c.step = (N + B - 1) / B;
    ck_assert_int_eq(rg_loader_create(ds, &params, 0, 1, &c, &l), RG_EINVAL);
    ck_assert_ptr_null(l);
    rg_dataset_destroy(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("data_loader");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_loader_matches_sampler);
    tcase_add_test(tc, test_loader_resize_exactly_once);
    tcase_add_test(tc, test_loader_destroy_states);
    tcase_add_test(tc, test_loader_timeout_keeps_order);
    tcase_add_test(tc, test_loader_bad_arguments);
    suite_add_tcase(s, tc);
    return test_main("test_data_loader", s, NULL);
}
