/*
 * comm/: the table of rg__comm_algo_choose (comm_choose.c), a pure function: no UCX, no etcd,
 * no processes. Each row states the inputs and the algorithm the group must run.
 */
#include "comm_choose.h"

#include "test_util.h"

#include <check.h>

#include <stdlib.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* The defaults with shared memory allowed (comm_group.c): ring from 64 KiB, no RHD. */
static const comm_tuning_t shm_defaults = {
    .ring_min_bytes = 64 * KiB, .rhd_max_bytes = 0, .seg_bytes = 64 * KiB, .ring_window = 16};
/* The defaults over tcp alone: RHD below 4 MiB. */
static const comm_tuning_t tcp_defaults = {
    .ring_min_bytes = 64 * KiB, .rhd_max_bytes = 4 * MiB, .seg_bytes = 255 * KiB,
    .ring_window = 4};
/* What REGROUP_COMM_RING_MIN_BYTES=0 (and RHD_MAX_BYTES=2^40) force in tests/test_comm.c. */
static const comm_tuning_t ring_forced = {.ring_min_bytes = 0, .rhd_max_bytes = 0,
                                          .seg_bytes = 64, .ring_window = 16};
static const comm_tuning_t rhd_forced = {.ring_min_bytes = 0, .rhd_max_bytes = (size_t)1 << 40,
                                         .seg_bytes = 64 * KiB, .ring_window = 16};

typedef struct {
    const comm_tuning_t *t;
    comm_coll_t   coll;
    int           n;
    size_t        count;
    size_t        esize;
    rg_mem_type_t mem;
    bool          shm;
    comm_algo_t   want;
} row_t;

static const row_t rows[] = {
    /* nothing to exchange */
    {&shm_defaults, COMM_ALLREDUCE, 1, 1000, 4, RG_MEM_HOST, false, COMM_ALGO_LOCAL},
    {&shm_defaults, COMM_BARRIER, 1, 0, 1, RG_MEM_HOST, true, COMM_ALGO_LOCAL},
    {&shm_defaults, COMM_REDSCAT, 1, 1 << 20, 4, RG_MEM_HOST, false, COMM_ALGO_LOCAL},
    {&shm_defaults, COMM_ALLGATHER, 4, 0, 8, RG_MEM_HOST, true, COMM_ALGO_LOCAL},
    {&tcp_defaults, COMM_BCAST, 8, 0, 4, RG_MEM_CUDA, false, COMM_ALGO_LOCAL},
    /* shared memory: at most 4 KiB per rank, host memory, when the group has it */
    {&shm_defaults, COMM_BARRIER, 4, 0, 1, RG_MEM_HOST, true, COMM_ALGO_SHM},
    {&shm_defaults, COMM_ALLREDUCE, 2, 1, 4, RG_MEM_HOST, true, COMM_ALGO_SHM},
    {&shm_defaults, COMM_ALLREDUCE, 3, 1024, 4, RG_MEM_HOST, true, COMM_ALGO_SHM},
    {&shm_defaults, COMM_ALLREDUCE, 3, 1025, 4, RG_MEM_HOST, true, COMM_ALGO_RD},
    {&shm_defaults, COMM_ALLREDUCE, 3, 1024, 4, RG_MEM_CUDA, true, COMM_ALGO_RD},
    {&shm_defaults, COMM_ALLREDUCE, 3, 1024, 4, RG_MEM_HOST, false, COMM_ALGO_RD},
    {&ring_forced, COMM_ALLREDUCE, 4, 1000, 4, RG_MEM_HOST, true, COMM_ALGO_SHM},
    {&shm_defaults, COMM_BCAST, 8, 4096, 1, RG_MEM_HOST, true, COMM_ALGO_SHM},
    {&shm_defaults, COMM_ALLGATHER, 8, 4096, 1, RG_MEM_HOST, true, COMM_ALGO_SHM},
    /* reduce_scatter: the whole input (n blocks) must fit */
    {&shm_defaults, COMM_REDSCAT, 4, 256, 4, RG_MEM_HOST, true, COMM_ALGO_SHM},
    {&shm_defaults, COMM_REDSCAT, 4, 257, 4, RG_MEM_HOST, true, COMM_ALGO_DIRECT},
    {&shm_defaults, COMM_BARRIER, 4, 0, 1, RG_MEM_CUDA, true, COMM_ALGO_DISSEMINATION},
    /* barrier over UCX */
    {&shm_defaults, COMM_BARRIER, 3, 0, 1, RG_MEM_HOST, false, COMM_ALGO_DISSEMINATION},
    {&ring_forced, COMM_BARRIER, 16, 0, 1, RG_MEM_HOST, false, COMM_ALGO_DISSEMINATION},
    /* broadcast: tree below ring_min_bytes, or when fewer elements than ranks */
    {&shm_defaults, COMM_BCAST, 4, 64 * KiB - 1, 1, RG_MEM_HOST, false, COMM_ALGO_TREE},
    {&shm_defaults, COMM_BCAST, 4, 64 * KiB, 1, RG_MEM_HOST, false, COMM_ALGO_SCATTER_RING},
    {&ring_forced, COMM_BCAST, 3, 2, 4, RG_MEM_HOST, false, COMM_ALGO_TREE},
    {&ring_forced, COMM_BCAST, 3, 3, 4, RG_MEM_HOST, false, COMM_ALGO_SCATTER_RING},
    /* allreduce: recursive doubling, ring, halving/doubling */
    {&shm_defaults, COMM_ALLREDUCE, 4, 16 * KiB - 1, 4, RG_MEM_HOST, false, COMM_ALGO_RD},
    {&shm_defaults, COMM_ALLREDUCE, 4, 16 * KiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&shm_defaults, COMM_ALLREDUCE, 8, 16 * MiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&ring_forced, COMM_ALLREDUCE, 3, 2, 8, RG_MEM_HOST, false, COMM_ALGO_RD},
    {&ring_forced, COMM_ALLREDUCE, 3, 3, 1, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&ring_forced, COMM_ALLREDUCE, 4, 7, 4, RG_MEM_CUDA, true, COMM_ALGO_RING},
    {&tcp_defaults, COMM_ALLREDUCE, 4, 16 * KiB, 4, RG_MEM_HOST, false, COMM_ALGO_RHD},
    {&tcp_defaults, COMM_ALLREDUCE, 4, MiB - 1, 4, RG_MEM_HOST, false, COMM_ALGO_RHD},
    {&tcp_defaults, COMM_ALLREDUCE, 4, MiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&tcp_defaults, COMM_ALLREDUCE, 2, 16 * KiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&tcp_defaults, COMM_ALLREDUCE, 6, 16 * KiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&tcp_defaults, COMM_ALLREDUCE, 16, 16 * KiB, 4, RG_MEM_HOST, false, COMM_ALGO_RHD},
    {&tcp_defaults, COMM_ALLREDUCE, 4, 1000, 4, RG_MEM_HOST, false, COMM_ALGO_RD},
    {&rhd_forced, COMM_ALLREDUCE, 4, 3, 4, RG_MEM_HOST, false, COMM_ALGO_RD},
    {&rhd_forced, COMM_ALLREDUCE, 4, 4, 4, RG_MEM_HOST, false, COMM_ALGO_RHD},
    {&rhd_forced, COMM_ALLREDUCE, 8, 16 * MiB, 2, RG_MEM_HOST, false, COMM_ALGO_RHD},
    {&rhd_forced, COMM_ALLREDUCE, 3, 1000, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    /* allgather and reduce_scatter: direct or ring, by bytes per rank only */
    {&shm_defaults, COMM_ALLGATHER, 3, 64 * KiB - 1, 1, RG_MEM_HOST, false, COMM_ALGO_DIRECT},
    {&shm_defaults, COMM_ALLGATHER, 3, 16 * KiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&ring_forced, COMM_ALLGATHER, 8, 1, 1, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&shm_defaults, COMM_REDSCAT, 3, 8 * KiB - 1, 8, RG_MEM_HOST, false, COMM_ALGO_DIRECT},
    {&shm_defaults, COMM_REDSCAT, 3, 8 * KiB, 8, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&ring_forced, COMM_REDSCAT, 8, 1, 2, RG_MEM_HOST, false, COMM_ALGO_RING},
    {&tcp_defaults, COMM_REDSCAT, 4, 1 * MiB, 4, RG_MEM_HOST, false, COMM_ALGO_RING},
};

START_TEST(test_choose_table)
{
    const row_t *r = &rows[_i];
    comm_algo_t got = rg__comm_algo_choose(r->t, r->coll, r->n, r->count, r->esize, r->mem,
                                           r->shm);
    ck_assert_msg(got == r->want, "row %d (op %d, %d ranks, %zu x %zu bytes, mem %d, shm %d): "
                  "%s, expected %s", _i, (int)r->coll, r->n, r->count, r->esize, (int)r->mem,
                  (int)r->shm, rg__comm_algo_name(got), rg__comm_algo_name(r->want));
}
END_TEST

/* Every algorithm is reachable from some row, and named. */
START_TEST(test_choose_covers_every_algorithm)
{
    bool seen[COMM_ALGO_COUNT] = {false};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        seen[rows[i].want] = true;
    }
    for (int a = 0; a < COMM_ALGO_COUNT; a++) {
        ck_assert_msg(seen[a], "no row expects %s", rg__comm_algo_name((comm_algo_t)a));
        ck_assert_str_ne(rg__comm_algo_name((comm_algo_t)a), "?");
    }
    ck_assert_str_eq(rg__comm_algo_name(COMM_ALGO_COUNT), "?");
    ck_assert_uint_eq(rg__comm_algo_count(NULL, COMM_ALLREDUCE, COMM_ALGO_RING), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm_choose");
    TCase *tc = tcase_create("table");
    tcase_add_loop_test(tc, test_choose_table, 0, (int)(sizeof(rows) / sizeof(rows[0])));
    tcase_add_test(tc, test_choose_covers_every_algorithm);
    suite_add_tcase(s, tc);
    return test_main("comm_choose", s, NULL);
}
