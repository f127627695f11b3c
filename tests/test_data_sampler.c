/* train/data_sampler.c: the permutation, the batch split, the cursor, and exactly-once use of
 * every sample across a simulated history of resizes and crashes. */
#include <regroup/data.h>

#include "test_util.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static rg_sampler_t *make_sampler(uint64_t n, uint32_t b, bool drop_last)
{
    rg_sampler_params_t p = {.num_samples = n, .batch_size = b, .drop_last = drop_last};
    rg_sampler_t       *s = NULL;
    ck_assert_msg(rg_sampler_create(&p, &s) == RG_OK, "%s", rg_last_error());
    return s;
}

static void assert_is_permutation(const uint32_t *perm, size_t n)
{
    uint8_t *seen = calloc(n, 1);
    ck_assert_ptr_nonnull(seen);
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_lt(perm[i], n);
        ck_assert_uint_eq(seen[perm[i]], 0);
        seen[perm[i]] = 1;
    }
    free(seen);
}

/* Known answers from tests/data/sampler_reference.py, an independent implementation of the
 * documented PRNG and shuffle: the order is part of the contract (a job resumed by a newer
 * build must see the same data order). */
START_TEST(test_permutation_known_answers)
{
    uint32_t       p[20];
    const uint32_t a[10] = {3, 9, 2, 4, 6, 8, 1, 0, 7, 5};
    const uint32_t b[10] = {3, 7, 8, 1, 4, 9, 5, 2, 6, 0};
    const uint32_t c[20] = {9, 7, 10, 16, 14, 8, 13, 3, 15, 11, 5, 18, 2, 6, 19, 1, 0, 4, 17, 12};
    rg_sampler_permutation(42, 0, p, 10);
    ck_assert_mem_eq(p, a, sizeof(a));
    rg_sampler_permutation(42, 1, p, 10);
    ck_assert_mem_eq(p, b, sizeof(b));
    rg_sampler_permutation(7, 3, p, 20);
    ck_assert_mem_eq(p, c, sizeof(c));

    uint32_t      *big = malloc(60000 * sizeof(uint32_t));
    const uint32_t d[8] = {59616, 14871, 27701, 5166, 30973, 33661, 9451, 27638};
    rg_sampler_permutation(2026, 5, big, 60000);
    ck_assert_mem_eq(big, d, sizeof(d));
    assert_is_permutation(big, 60000);
    free(big);
}
END_TEST

START_TEST(test_permutation_determinism)
{
    const size_t n = 60000;
    uint32_t    *p1 = malloc(n * sizeof(uint32_t));
    uint32_t    *p2 = malloc(n * sizeof(uint32_t));
    for (uint64_t epoch = 0; epoch < 4; epoch++) {
        rg_sampler_permutation(1234, epoch, p1, n);
        rg_sampler_permutation(1234, epoch, p2, n);
        ck_assert_mem_eq(p1, p2, n * sizeof(uint32_t));
        assert_is_permutation(p1, n);
        rg_sampler_permutation(1234, epoch + 1, p2, n);
        ck_assert(memcmp(p1, p2, n * sizeof(uint32_t)) != 0);
        rg_sampler_permutation(1235, epoch, p2, n);
        ck_assert(memcmp(p1, p2, n * sizeof(uint32_t)) != 0);
    }
    for (size_t small = 1; small <= 9; small++) {
        rg_sampler_permutation(99, 0, p1, small);
        assert_is_permutation(p1, small);
    }
    free(p1);
    free(p2);
}
END_TEST

/* Over many epochs each id lands in each position about equally often (no gross bias). */
START_TEST(test_permutation_uniform)
{
    enum { N = 5, EPOCHS = 20000 };
    unsigned count[N][N] = {{0}};
    uint32_t p[N];
    for (uint64_t e = 0; e < EPOCHS; e++) {
        rg_sampler_permutation(5, e, p, N);
        for (int pos = 0; pos < N; pos++) {
            count[pos][p[pos]]++;
        }
    }
    /* Expected 4000 each; the standard deviation is about 57, allow 6 of them. */
    for (int pos = 0; pos < N; pos++) {
        for (int id = 0; id < N; id++) {
            ck_assert_msg(count[pos][id] > 3650 && count[pos][id] < 4350,
                          "id %d at position %d %u times", id, pos, count[pos][id]);
        }
    }
}
END_TEST

START_TEST(test_share_split)
{
    for (uint32_t len = 0; len <= 70; len++) {
        for (uint32_t world = 1; world <= 9; world++) {
            uint32_t next = 0;
            for (uint32_t r = 0; r < world; r++) {
                uint32_t off;
                uint32_t cnt;
                rg_sampler_share(len, r, world, &off, &cnt);
                ck_assert_uint_eq(off, next); /* contiguous, in rank order */
                ck_assert_uint_eq(cnt, len / world + (r < len % world ? 1 : 0));
                next += cnt;
            }
            ck_assert_uint_eq(next, len);
        }
    }
}
END_TEST

START_TEST(test_steps_and_partial_batch)
{
    rg_sampler_t    *s = make_sampler(100, 32, false);
    rg_data_cursor_t c = rg_data_cursor_start(3);
    ck_assert_uint_eq(rg_sampler_steps_per_epoch(s), 4);
    ck_assert_uint_eq(rg_sampler_global_count(s, &c), 32);
    c.step = 3;
    ck_assert_uint_eq(rg_sampler_global_count(s, &c), 4); /* the short last batch */
    c.step = 4;
    ck_assert_uint_eq(rg_sampler_global_count(s, &c), 0);
    c.step = 2;
    rg_sampler_advance(s, &c);
    ck_assert_uint_eq(c.epoch, 0);
    ck_assert_uint_eq(c.step, 3);
    rg_sampler_advance(s, &c);
    ck_assert_uint_eq(c.epoch, 1);
    ck_assert_uint_eq(c.step, 0);
    ck_assert_uint_eq(c.seed, 3);

    /* World 6 on the short batch of 4: ranks 4 and 5 get nothing. */
    c.step = 3;
    uint32_t ids[6];
    size_t   cnt = 99;
    ck_assert_int_eq(rg_sampler_ids(s, &c, 5, 6, ids, 6, &cnt), RG_OK);
    ck_assert_uint_eq(cnt, 0);
    ck_assert_int_eq(rg_sampler_ids(s, &c, 0, 6, ids, 6, &cnt), RG_OK);
    ck_assert_uint_eq(cnt, 1);
    rg_sampler_destroy(s);

    s = make_sampler(100, 32, true);
    ck_assert_uint_eq(rg_sampler_steps_per_epoch(s), 3);
    c = rg_data_cursor_start(3);
    c.step = 2;
    ck_assert_uint_eq(rg_sampler_global_count(s, &c), 32);
    rg_sampler_advance(s, &c);
    ck_assert_uint_eq(c.epoch, 1);
    ck_assert_uint_eq(c.step, 0);
    rg_sampler_destroy(s);
}
END_TEST

START_TEST(test_bad_arguments)
{
    rg_sampler_params_t p = {.num_samples = 10, .batch_size = 0, .drop_last = false};
    rg_sampler_t       *s = NULL;
    ck_assert_int_eq(rg_sampler_create(&p, &s), RG_EINVAL);
    p.batch_size = 11;
    p.drop_last = true;
    ck_assert_int_eq(rg_sampler_create(&p, &s), RG_EINVAL);
    p.num_samples = 0;
    ck_assert_int_eq(rg_sampler_create(&p, &s), RG_EINVAL);
    ck_assert_ptr_null(s);

    s = make_sampler(10, 4, false);
    rg_data_cursor_t c = rg_data_cursor_start(1);
    uint32_t         ids[4];
    size_t           cnt = 77;
    ck_assert_int_eq(rg_sampler_ids(s, &c, 2, 2, ids, 4, &cnt), RG_EINVAL);
    ck_assert_int_eq(rg_sampler_ids(s, &c, 0, 0, ids, 4, &cnt), RG_EINVAL);
    ck_assert_int_eq(rg_sampler_ids(s, &c, 0, 1, ids, 3, &cnt), RG_ETOOBIG);
    c.step = 3;
    ck_assert_int_eq(rg_sampler_ids(s, &c, 0, 1, ids, 4, &cnt), RG_EINVAL);
    ck_assert_uint_eq(cnt, 77); /* untouched on failure */
    rg_sampler_destroy(s);
    rg_sampler_destroy(NULL);
}
END_TEST

/* The ranks' shares of a step, in rank order, are the step's slice of the permutation. */
START_TEST(test_ranks_cover_step)
{
    const uint64_t n = 1000;
    rg_sampler_t  *s = make_sampler(n, 96, false);
    uint32_t      *perm = malloc(n * sizeof(uint32_t));
    rg_sampler_permutation(77, 2, perm, n);
    for (uint64_t step = 0; step < rg_sampler_steps_per_epoch(s); step++) {
        for (uint32_t world = 1; world <= 7; world++) {
            rg_data_cursor_t c = {.seed = 77, .epoch = 2, .step = step};
            size_t           pos = step * 96;
            for (uint32_t r = 0; r < world; r++) {
                uint32_t ids[96];
                size_t   cnt;
                ck_assert_int_eq(rg_sampler_ids(s, &c, r, world, ids, 96, &cnt), RG_OK);
                ck_assert_mem_eq(ids, perm + pos, cnt * sizeof(uint32_t));
                pos += cnt;
            }
            ck_assert_uint_eq(pos, step * 96 + rg_sampler_global_count(s, &c));
        }
    }
    free(perm);
    rg_sampler_destroy(s);
}
END_TEST

/* ---- exactly once across resizes and crashes ------------------------------------------- */

#define HIST_N      1003
#define HIST_B      40
#define HIST_EPOCHS 5

typedef struct {
    uint64_t epoch;
    uint32_t id;
} use_t;

/*
 * Runs a job through segments of (world, steps). Every `ckpt_every` steps the job saves its
 * cursor (a checkpoint); a segment ends either gracefully (save, then the next segment resumes
 * at another world size) or by a crash (everything since the last save is lost and the next
 * segment resumes from it). Each rank is its own sampler, as it would be its own process.
 * committed[e][id] counts the uses that survive.
 */
static void run_history(bool drop_last, uint64_t history_seed, uint8_t (*committed)[HIST_N])
{
    rg_data_cursor_t cursor = rg_data_cursor_start(history_seed * 31 + 7);
    rg_data_cursor_t saved = cursor;
    use_t           *pending = malloc(sizeof(use_t) * HIST_N * 4);
    size_t           npending = 0;
    uint64_t         rng = history_seed;
    /* The fixed opening of the history, then pseudo-random segments. */
    const uint32_t   opening[][2] = {{4, 3}, {3, 5}, {1, 2}, {8, 4}, {5, 1}, {2, 7}};
    size_t           segment = 0;
    rg_sampler_params_t p = {.num_samples = HIST_N, .batch_size = HIST_B,
                             .drop_last = drop_last};

    for (int guard = 0; guard < 10000 && saved.epoch < HIST_EPOCHS; guard++, segment++) {
        uint32_t world;
        uint32_t steps;
        if (segment < RG_ARRAY_SIZE(opening)) {
            world = opening[segment][0];
            steps = opening[segment][1];
        } else {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            world = 1 + (uint32_t)((rng >> 33) % 8);
            steps = 1 + (uint32_t)((rng >> 45) % 12);
        }
        bool     crash = segment >= RG_ARRAY_SIZE(opening) && ((rng >> 20) % 3 == 0);
        uint32_t ckpt_every = 1 + (uint32_t)((rng >> 24) % 5);

        rg_sampler_t *ranks[8];
        for (uint32_t r = 0; r < world; r++) {
            ck_assert_int_eq(rg_sampler_create(&p, &ranks[r]), RG_OK);
        }
        for (uint32_t s = 0; s < steps; s++) {
            for (uint32_t r = 0; r < world; r++) {
                uint32_t ids[HIST_B];
                size_t   cnt;
                ck_assert_int_eq(rg_sampler_ids(ranks[r], &cursor, r, world, ids, HIST_B, &cnt),
                                 RG_OK);
                for (size_t i = 0; i < cnt; i++) {
                    pending[npending++] = (use_t){cursor.epoch, ids[i]};
                }
            }
            /* Every rank advances its own copy; they must agree. */
            rg_data_cursor_t next = cursor;
            rg_sampler_advance(ranks[0], &next);
            for (uint32_t r = 1; r < world; r++) {
                rg_data_cursor_t other = cursor;
                rg_sampler_advance(ranks[r], &other);
                ck_assert_mem_eq(&other, &next, sizeof(next));
            }
            cursor = next;
            if ((s + 1) % ckpt_every == 0 || (!crash && s + 1 == steps)) {
                for (size_t i = 0; i < npending; i++) {
                    if (pending[i].epoch < HIST_EPOCHS) {
                        committed[pending[i].epoch][pending[i].id]++;
                    }
                }
                npending = 0;
                saved = cursor;
            }
        }
        if (crash) {
            npending = 0;
            cursor = saved;
        }
        for (uint32_t r = 0; r < world; r++) {
            rg_sampler_destroy(ranks[r]);
        }
    }
    ck_assert_uint_ge(saved.epoch, HIST_EPOCHS);
    ck_assert_uint_gt(segment, 20); /* the history really did resize many times */
    free(pending);
}

static void check_history(bool drop_last)
{
    for (uint64_t h = 1; h <= 4; h++) {
        uint8_t (*committed)[HIST_N] = calloc(HIST_EPOCHS, sizeof(*committed));
        run_history(drop_last, h, committed);
        for (int e = 0; e < HIST_EPOCHS; e++) {
            uint32_t *perm = malloc(HIST_N * sizeof(uint32_t));
            rg_sampler_permutation(h * 31 + 7, (uint64_t)e, perm, HIST_N);
            size_t used = 0;
            for (size_t pos = 0; pos < HIST_N; pos++) {
                uint32_t id = perm[pos];
                /* With drop_last, the records past the last full batch wait for an epoch
                 * whose permutation puts them earlier. */
                unsigned want = (!drop_last || pos < (HIST_N / HIST_B) * HIST_B) ? 1 : 0;
                ck_assert_msg(committed[e][id] == want, "history %llu epoch %d id %u used %u "
                              "times, want %u", (unsigned long long)h, e, id, committed[e][id],
                              want);
                used += committed[e][id];
            }
            ck_assert_uint_eq(used, drop_last ? (HIST_N / HIST_B) * HIST_B : HIST_N);
            free(perm);
        }
        free(committed);
    }
}

START_TEST(test_exactly_once_short_last_batch)
{
    check_history(false);
}
END_TEST

START_TEST(test_exactly_once_drop_last)
{
    check_history(true);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("data_sampler");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_permutation_known_answers);
    tcase_add_test(tc, test_permutation_determinism);
    tcase_add_test(tc, test_permutation_uniform);
    tcase_add_test(tc, test_share_split);
    tcase_add_test(tc, test_steps_and_partial_batch);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_ranks_cover_step);
    tcase_add_test(tc, test_exactly_once_short_last_batch);
    tcase_add_test(tc, test_exactly_once_drop_last);
    suite_add_tcase(s, tc);
    return test_main("test_data_sampler", s, NULL);
}
