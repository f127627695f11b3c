/*
 * comm/: every operation x dtype x size on 1, 2, 3, 4 and 8 real rank processes, over shared
 * memory and over tcp, checked against a reference computed independently on each rank
 * (inputs are small integers chosen so that the exact result is representable).
 */
#include "comm_testlib.h"

#include "comm_choose.h"

#include "test_util.h"

#include <check.h>
#include <regroup/comm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const rg_dtype_t all_dtypes[] = {RG_DTYPE_F32, RG_DTYPE_F64, RG_DTYPE_F16, RG_DTYPE_BF16,
                                        RG_DTYPE_I32, RG_DTYPE_I64, RG_DTYPE_U8};
static const rg_redop_t all_ops[] = {RG_OP_SUM, RG_OP_AVG, RG_OP_MIN, RG_OP_MAX, RG_OP_PROD};
static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
static const char *const op_names[] = {"sum", "avg", "min", "max", "prod"};

static bool is_int(rg_dtype_t d)
{
    return d == RG_DTYPE_I32 || d == RG_DTYPE_I64 || d == RG_DTYPE_U8;
}

/* Compares element i of got with the reference; returns the first bad index or -1. */
static long check_reduced(rg_dtype_t d, rg_redop_t op, int size, const void *got, size_t first,
                          size_t n)
{
    size_t es = rg_dtype_size(d);
    char want[8];
    for (size_t i = 0; i < n; i++) {
        comm_test_expect(d, op, size, first + i, want);
        if (memcmp(want, (const char *)got + i * es, es) != 0) {
            return (long)i;
        }
    }
    return -1;
}

static void fill(rg_dtype_t d, rg_redop_t op, int rank, void *buf, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        comm_test_store(d, buf, i, comm_test_input(d, op, rank, first + i));
    }
}

static int t_allreduce(rg_comm_t *comm, int rank, int size, const size_t *sizes, int n_sizes)
{
    int k = 0;
    for (size_t di = 0; di < 7; di++) {
        for (size_t oi = 0; oi < 5; oi++) {
            rg_dtype_t d = all_dtypes[di];
            rg_redop_t op = all_ops[oi];
            if (op == RG_OP_AVG && is_int(d)) {
                continue;
            }
            for (int si = 0; si < n_sizes; si++, k++) {
                size_t n = sizes[si];
                size_t es = rg_dtype_size(d);
                char *in = malloc(n * es);
                char *out = malloc(n * es);
                if (in == NULL || out == NULL) {
                    FAIL("out of memory");
                }
                fill(d, op, rank, in, 0, n);
                bool in_place = k % 2 == 1;
                if (in_place) {
                    memcpy(out, in, n * es);
                }
                CHECK_RG(rg_comm_allreduce(comm, in_place ? RG_COMM_IN_PLACE : in, out, n, d, op,
                                           NULL));
                long bad = check_reduced(d, op, size, out, 0, n);
                free(in);
                free(out);
                if (bad >= 0) {
                    FAIL("allreduce %s %s count %zu %s: wrong element %ld", dtype_names[di],
                         op_names[oi], n, in_place ? "in place" : "out of place", bad);
                }
            }
        }
    }
    return 0;
}

static int t_reduce_scatter(rg_comm_t *comm, int rank, int size, const size_t *sizes,
                            int n_sizes)
{
    int k = 0;
    for (size_t di = 0; di < 7; di++) {
        for (size_t oi = 0; oi < 5; oi++) {
            rg_dtype_t d = all_dtypes[di];
            rg_redop_t op = all_ops[oi];
            if (op == RG_OP_AVG && is_int(d)) {
                continue;
            }
            for (int si = 0; si < n_sizes; si++, k++) {
                size_t n = sizes[si];
                size_t es = rg_dtype_size(d);
                char *in = malloc(n * es * (size_t)size);
                char *out = malloc(n * es);
                if (in == NULL || out == NULL) {
                    FAIL("out of memory");
                }
                fill(d, op, rank, in, 0, n * (size_t)size);
                bool in_place = k % 2 == 1;
                const char *res = out;
                if (in_place) {
                    CHECK_RG(rg_comm_reduce_scatter(comm, RG_COMM_IN_PLACE, in, n, d, op, NULL));
                    res = in + (size_t)rank * n * es;
                } else {
                    CHECK_RG(rg_comm_reduce_scatter(comm, in, out, n, d, op, NULL));
                }
                long bad = check_reduced(d, op, size, res, (size_t)rank * n, n);
                free(in);
                free(out);
                if (bad >= 0) {
                    FAIL("reduce_scatter %s %s count %zu %s: wrong element %ld",
                         dtype_names[di], op_names[oi], n, in_place ? "in place" : "out of place",
                         bad);
                }
            }
        }
    }
    return 0;
}

static int t_allgather_bcast(rg_comm_t *comm, int rank, int size, const size_t *sizes,
                             int n_sizes)
{
    for (size_t di = 0; di < 7; di++) {
        rg_dtype_t d = all_dtypes[di];
        size_t es = rg_dtype_size(d);
        for (int si = 0; si < n_sizes; si++) {
            size_t n = sizes[si];
            char *mine = malloc(n * es);
            char *all = malloc(n * es * (size_t)size);
            char *want = malloc(n * es * (size_t)size);
            if (mine == NULL || all == NULL || want == NULL) {
                FAIL("out of memory");
            }
            for (int r = 0; r < size; r++) {
                fill(d, RG_OP_SUM, r, want + (size_t)r * n * es, (size_t)r * n, n);
            }
            fill(d, RG_OP_SUM, rank, mine, (size_t)rank * n, n);
            bool in_place = si % 2 == 1;
            if (in_place) {
                memset(all, 0xa5, n * es * (size_t)size);
                memcpy(all + (size_t)rank * n * es, mine, n * es);
                CHECK_RG(rg_comm_allgather(comm, RG_COMM_IN_PLACE, all, n, d, NULL));
            } else {
                CHECK_RG(rg_comm_allgather(comm, mine, all, n, d, NULL));
            }
            if (memcmp(all, want, n * es * (size_t)size) != 0) {
                FAIL("allgather %s count %zu: wrong result", dtype_names[di], n);
            }
            /* broadcast from a rank that changes with the size */
            int root = (int)((size_t)si * 7 % (size_t)size);
            memset(all, rank == root ? 0 : 0x5a, n * es);
            if (rank == root) {
                memcpy(all, want, n * es);
            }
            CHECK_RG(rg_comm_broadcast(comm, all, n, d, root, NULL));
            if (memcmp(all, want, n * es) != 0) {
                FAIL("broadcast %s count %zu root %d: wrong result", dtype_names[di], n, root);
            }
            free(mine);
            free(all);
            free(want);
        }
    }
    return 0;
}

static int t_p2p(rg_comm_t *comm, int rank, int size)
{
    if (size < 2) {
        return 0;
    }
    static const size_t counts[] = {1, 1000, 300001};
    for (int ci = 0; ci < 3; ci++) {
        size_t n = counts[ci];
        int32_t *out = malloc(n * 4);
        int32_t *in = malloc(n * 4);
        if (out == NULL || in == NULL) {
            FAIL("out of memory");
        }
        for (size_t i = 0; i < n; i++) {
            out[i] = (int32_t)(rank * 1000003 + (int)i);
        }
        int right = (rank + 1) % size;
        int left = (rank + size - 1) % size;
        rg_comm_req_t *rreq = NULL;
        rg_comm_req_t *sreq = NULL;
        CHECK_RG(rg_comm_recv_post(comm, in, n, RG_DTYPE_I32, left, 77u + (uint32_t)ci, NULL,
                                   &rreq));
        CHECK_RG(rg_comm_send_post(comm, out, n, RG_DTYPE_I32, right, 77u + (uint32_t)ci, NULL,
                                   &sreq));
        CHECK_RG(rg_comm_req_wait(sreq));
        CHECK_RG(rg_comm_req_wait(rreq));
        rg_comm_req_free(sreq);
        rg_comm_req_free(rreq);
        for (size_t i = 0; i < n; i++) {
            if (in[i] != (int32_t)(left * 1000003 + (int)i)) {
                FAIL("recv count %zu: wrong element %zu", n, i);
            }
        }
        free(in);
        free(out);
    }
    /* a size mismatch is an error, not a crash, and leaves the group usable */
    int32_t one[2] = {1, 2};
    if (rank == 0) {
        CHECK_RG(rg_comm_send(comm, one, 2, RG_DTYPE_I32, 1, 5, NULL));
    } else if (rank == 1) {
        rg_status_t st = rg_comm_recv(comm, one, 1, RG_DTYPE_I32, 0, 5, NULL);
        if (st != RG_EPROTO) {
            FAIL("short recv: %s, expected RG_EPROTO", rg_status_name(st));
        }
    }
    CHECK_RG(rg_comm_barrier(comm, NULL));
    return 0;
}

/* Several posted operations at once, completed out of order. */
static int t_nonblocking(rg_comm_t *comm, int rank, int size)
{
    enum { N = 5000 };
    static float a[N], b[N];
    static int64_t g[N * 8];
    fill(RG_DTYPE_F32, RG_OP_SUM, rank, a, 0, N);
    fill(RG_DTYPE_F32, RG_OP_MAX, rank, b, 0, N);
    int64_t mine[N];
    fill(RG_DTYPE_I64, RG_OP_SUM, rank, mine, (size_t)rank * N, N);
    rg_comm_req_t *r1 = NULL;
    rg_comm_req_t *r2 = NULL;
    rg_comm_req_t *r3 = NULL;
    CHECK_RG(rg_comm_allreduce_post(comm, RG_COMM_IN_PLACE, a, N, RG_DTYPE_F32, RG_OP_SUM, NULL,
                                    &r1));
    CHECK_RG(rg_comm_allreduce_post(comm, RG_COMM_IN_PLACE, b, N, RG_DTYPE_F32, RG_OP_MAX, NULL,
                                    &r2));
    CHECK_RG(rg_comm_allgather_post(comm, mine, g, N, RG_DTYPE_I64, NULL, &r3));
    rg_status_t st;
    for (int i = 0; i < 1000000 && (st = rg_comm_req_test(r3)) == RG_INPROGRESS; i++) {
    }
    CHECK_RG(rg_comm_req_wait(r3));
    CHECK_RG(rg_comm_req_wait(r2));
    CHECK_RG(rg_comm_req_wait(r1));
    rg_comm_req_free(r1);
    rg_comm_req_free(r2);
    rg_comm_req_free(r3);
    if (check_reduced(RG_DTYPE_F32, RG_OP_SUM, size, a, 0, N) >= 0 ||
        check_reduced(RG_DTYPE_F32, RG_OP_MAX, size, b, 0, N) >= 0) {
        FAIL("non-blocking allreduce: wrong result");
    }
    for (int r = 0; r < size; r++) {
        int64_t want[N];
        fill(RG_DTYPE_I64, RG_OP_SUM, r, want, (size_t)r * N, N);
        if (memcmp(want, g + (size_t)r * N, sizeof(want)) != 0) {
            FAIL("non-blocking allgather: wrong block %d", r);
        }
    }
    return 0;
}

/* Small operations (shared memory on one host) posted together, completed out of order: each
 * one waits for the one posted before it. */
static int t_nonblocking_small(rg_comm_t *comm, int rank, int size)
{
    enum { N = 100, K = 6 };
    float a[K][N];
    int64_t mine[8];
    int64_t g[8 * 16];
    rg_comm_req_t *reqs[K + 2] = {NULL};
    for (int k = 0; k < K; k++) {
        fill(RG_DTYPE_F32, RG_OP_SUM, rank + k, a[k], 0, N);
        CHECK_RG(rg_comm_allreduce_post(comm, RG_COMM_IN_PLACE, a[k], N, RG_DTYPE_F32,
                                        RG_OP_SUM, NULL, &reqs[k]));
    }
    fill(RG_DTYPE_I64, RG_OP_SUM, rank, mine, (size_t)rank * 8, 8);
    CHECK_RG(rg_comm_barrier_post(comm, NULL, &reqs[K]));
    CHECK_RG(rg_comm_allgather_post(comm, mine, g, 8, RG_DTYPE_I64, NULL, &reqs[K + 1]));
    for (int k = K + 1; k >= 0; k--) {
        CHECK_RG(rg_comm_req_wait(reqs[k]));
        rg_comm_req_free(reqs[k]);
    }
    for (int k = 0; k < K; k++) {
        float want[N];
        for (size_t i = 0; i < N; i++) {
            double s = 0;
            for (int r = 0; r < size; r++) {
                s += comm_test_input(RG_DTYPE_F32, RG_OP_SUM, r + k, i);
            }
            want[i] = (float)s;
        }
        if (memcmp(want, a[k], sizeof(want)) != 0) {
            FAIL("small non-blocking allreduce %d: wrong result", k);
        }
    }
    for (int r = 0; r < size; r++) {
        int64_t want[8];
        fill(RG_DTYPE_I64, RG_OP_SUM, r, want, (size_t)r * 8, 8);
        if (memcmp(want, g + (size_t)r * 8, sizeof(want)) != 0) {
            FAIL("small non-blocking allgather: wrong block %d", r);
        }
    }
    return 0;
}

typedef struct {
    bool        small_only;
    bool        ring;    /* REGROUP_COMM_RING_MIN_BYTES=0: every operation of at least one
                            element per rank takes the ring (broadcast: scatter + ring) */
    comm_algo_t ar_algo; /* with ring: the algorithm of those allreduces (ring or RHD) */
} matrix_arg_t;

typedef uint64_t algo_counts_t[COMM_COLL_COUNT][COMM_ALGO_COUNT];

static void algo_counts(const rg_comm_t *comm, algo_counts_t c)
{
    for (int k = 0; k < COMM_COLL_COUNT; k++) {
        for (int a = 0; a < COMM_ALGO_COUNT; a++) {
            c[k][a] = rg__comm_algo_count(comm, (comm_coll_t)k, (comm_algo_t)a);
        }
    }
}

/* Since `before`, `coll` ran n_algo times with `algo`, n_rest times with `rest`, and with
 * nothing else: the forced algorithm really ran (comm_coll.c counts every choice). */
static int algo_ran(const rg_comm_t *comm, int rank, const algo_counts_t before,
                    comm_coll_t coll, comm_algo_t algo, uint64_t n_algo, comm_algo_t rest,
                    uint64_t n_rest)
{
    static const char *const coll_names[] = {"barrier", "broadcast", "allreduce", "allgather",
                                             "reduce_scatter"};
    algo_counts_t now;
    algo_counts(comm, now);
    for (int a = 0; a < COMM_ALGO_COUNT; a++) {
        uint64_t got = now[coll][a] - before[coll][a];
        uint64_t want = (a == (int)algo ? n_algo : 0) + (a == (int)rest ? n_rest : 0);
        if (got != want) {
            FAIL("%s: %llu operations ran with %s, expected %llu (%llu with %s, %llu with %s)",
                 coll_names[coll], (unsigned long long)got, rg__comm_algo_name((comm_algo_t)a),
                 (unsigned long long)want, (unsigned long long)n_algo,
                 rg__comm_algo_name(algo), (unsigned long long)n_rest, rg__comm_algo_name(rest));
        }
    }
    return 0;
}

/* How many of the sizes are at least min. */
static uint64_t n_at_least(const size_t *sizes, int n, size_t min)
{
    uint64_t k = 0;
    for (int i = 0; i < n; i++) {
        k += sizes[i] >= min;
    }
    return k;
}

static int matrix(rg_comm_t *comm, int rank, int size, void *arg)
{
    const matrix_arg_t *m = arg;
    static const size_t ar_sizes[] = {1, 7, 1001, 40000, 70001};
    static const size_t rs_sizes[] = {1, 13, 20001};
    static const size_t ag_sizes[] = {1, 6, 1001, 20001};
    int n_ar = m->small_only ? 3 : 5;
    int n_rs = m->small_only ? 2 : 3;
    int n_ag = m->small_only ? 3 : 4;
    /* dtype x op pairs that t_allreduce and t_reduce_scatter run (avg: floating only) */
    const uint64_t pairs = 7 * 5 - 3;
    const uint64_t n = (uint64_t)size;
    algo_counts_t before;
    if (rg_comm_rank(comm) != rank || rg_comm_size(comm) != size) {
        FAIL("rank/size accessors");
    }
    CHECK_RG(rg_comm_barrier(comm, NULL));
    if (t_p2p(comm, rank, size)) {
        return 1;
    }
    algo_counts(comm, before);
    if (t_allreduce(comm, rank, size, ar_sizes, n_ar) ||
        (m->ring && algo_ran(comm, rank, before, COMM_ALLREDUCE, m->ar_algo,
                             pairs * n_at_least(ar_sizes, n_ar, n), COMM_ALGO_RD,
                             pairs * (n_ar - n_at_least(ar_sizes, n_ar, n))))) {
        return 1;
    }
    algo_counts(comm, before);
    if (t_reduce_scatter(comm, rank, size, rs_sizes, n_rs) ||
        (m->ring && algo_ran(comm, rank, before, COMM_REDSCAT, COMM_ALGO_RING,
                             pairs * (uint64_t)n_rs, COMM_ALGO_RING, 0))) {
        return 1;
    }
    algo_counts(comm, before);
    if (t_allgather_bcast(comm, rank, size, ag_sizes, n_ag) ||
        (m->ring && algo_ran(comm, rank, before, COMM_ALLGATHER, COMM_ALGO_RING,
                             7 * (uint64_t)n_ag, COMM_ALGO_RING, 0)) ||
        (m->ring && algo_ran(comm, rank, before, COMM_BCAST, COMM_ALGO_SCATTER_RING,
                             7 * n_at_least(ag_sizes, n_ag, n), COMM_ALGO_TREE,
                             7 * (n_ag - n_at_least(ag_sizes, n_ag, n))))) {
        return 1;
    }
    if (t_nonblocking(comm, rank, size) ||
        (size <= 16 && t_nonblocking_small(comm, rank, size))) {
        return 1;
    }
    CHECK_RG(rg_comm_barrier(comm, NULL));
    if (!rg_comm_is_healthy(comm)) {
        FAIL("group unhealthy after a clean run");
    }
    return 0;
}

static void run_forced(int n, const char *env0, const char *env1, const char *env2,
                       bool small_only, comm_algo_t ar_algo)
{
    matrix_arg_t arg = {.small_only = small_only, .ring = ar_algo != COMM_ALGO_COUNT,
                        .ar_algo = ar_algo};
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 240, .env = {env0, env1, env2, NULL}};
    ck_assert_msg(comm_run(n, matrix, &arg, &o, NULL), "ranks failed (see stderr)");
}

static void run_matrix(int n, const char *env0, const char *env1, bool small_only)
{
    run_forced(n, env0, env1, NULL, small_only, COMM_ALGO_COUNT);
}

START_TEST(test_matrix_1) { run_matrix(1, NULL, NULL, false); }
END_TEST
START_TEST(test_matrix_2) { run_matrix(2, NULL, NULL, false); }
END_TEST
START_TEST(test_matrix_3) { run_matrix(3, NULL, NULL, false); }
END_TEST
START_TEST(test_matrix_4) { run_matrix(4, NULL, NULL, false); }
END_TEST
START_TEST(test_matrix_8) { run_matrix(8, NULL, NULL, false); }
END_TEST
/* Over tcp, 2 ranks: ring segments below UCX's eager limit, cut evenly (unless this host has
 * a single core, where they are rendezvous sized). */
START_TEST(test_matrix_tcp_2)
{
    run_matrix(2, "UCX_TLS=tcp", NULL, false);
}
END_TEST
START_TEST(test_matrix_tcp_3)
{
    run_matrix(3, "UCX_TLS=tcp", NULL, true);
}
END_TEST
/* The ring for every size, cut into many small segments: odd and uneven chunks. Every
 * allreduce, allgather and reduce_scatter of at least one element per rank must have run on
 * the ring (broadcast: scatter + ring allgather), the others by recursive doubling or tree. */
START_TEST(test_matrix_ring_forced_3)
{
    run_forced(3, "REGROUP_COMM_RING_MIN_BYTES=0", "REGROUP_COMM_SEGMENT_BYTES=64",
               "REGROUP_COMM_SHM=0", true, COMM_ALGO_RING);
}
END_TEST
START_TEST(test_matrix_ring_forced_4)
{
    run_forced(4, "REGROUP_COMM_RING_MIN_BYTES=0", "REGROUP_COMM_SEGMENT_BYTES=96",
               "REGROUP_COMM_SHM=0", true, COMM_ALGO_RING);
}
END_TEST
/* Allreduce by recursive halving and doubling for every size of at least one element per
 * rank, checked to have run so (the other ops on the ring, as above). */
START_TEST(test_matrix_rhd_4)
{
    run_forced(4, "REGROUP_COMM_RING_MIN_BYTES=0", "REGROUP_COMM_RHD_MAX_BYTES=1099511627776",
               "REGROUP_COMM_SHM=0", false, COMM_ALGO_RHD);
}
END_TEST
START_TEST(test_matrix_rhd_8)
{
    run_forced(8, "REGROUP_COMM_RING_MIN_BYTES=0", "REGROUP_COMM_RHD_MAX_BYTES=1099511627776",
               "REGROUP_COMM_SHM=0", true, COMM_ALGO_RHD);
}
END_TEST
/* Small operations over UCX alone (no shared memory of the group's own). */
START_TEST(test_matrix_noshm_3)
{
    run_matrix(3, "REGROUP_COMM_SHM=0", NULL, true);
}
END_TEST

/* Whether the group maps every rank's shared-memory segment, all already unlinked. */
static int shm_maps(rg_comm_t *comm, int rank, int size, void *arg)
{
    const int want = *(const int *)arg ? size : 0;
    /* past every rank's set-up, which unlinks its segment last */
    CHECK_RG(rg_comm_barrier(comm, NULL));
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL) {
        FAIL("/proc/self/maps: cannot open");
    }
    char line[512];
    int n = 0;
    int linked = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, "/dev/shm/regroup-") != NULL) {
            n++;
            linked += strstr(line, "(deleted)") == NULL;
        }
    }
    fclose(f);
    if (n != want || linked != 0) {
        FAIL("%d regroup segments mapped (%d still linked), expected %d", n, linked, want);
    }
    /* and they work: a small allreduce and a barrier */
    int32_t x = rank;
    CHECK_RG(rg_comm_allreduce(comm, RG_COMM_IN_PLACE, &x, 1, RG_DTYPE_I32, RG_OP_SUM, NULL));
    CHECK_RG(rg_comm_barrier(comm, NULL));
    if (x != size * (size - 1) / 2) {
        FAIL("allreduce: %d", x);
    }
    return 0;
}

static void run_shm_maps(int n, int want, const char *env)
{
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 60, .env = {env, NULL}};
    ck_assert_msg(comm_run(n, shm_maps, &want, &o, NULL), "ranks failed (see stderr)");
}

START_TEST(test_shm_segments)
{
    run_shm_maps(3, 1, NULL);
    run_shm_maps(2, 0, "REGROUP_COMM_SHM=0");
    run_shm_maps(2, 0, "UCX_TLS=tcp");
    run_shm_maps(1, 0, NULL);
}
END_TEST

static long minor_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : -1;
}

/* 64 MiB twice: the second must not fault its scratch in again. On 2 ranks the ring's
 * scratch is one 32 MiB chunk, which glibc would map afresh for every operation (its mmap
 * threshold stops at 32 MiB): 8192 page faults each time, a third of the operation's time. */
static int large_allreduce(rg_comm_t *comm, int rank, int size, void *arg)
{
    (void)arg;
    size_t n = 16u << 20; /* 64 MiB of f32 */
    float *buf = malloc(n * sizeof(float));
    if (buf == NULL) {
        FAIL("out of memory");
    }
    long faults = 0;
    for (int k = 0; k < 2; k++) {
        fill(RG_DTYPE_F32, RG_OP_SUM, rank, buf, 0, n);
        long f0 = minor_faults();
        CHECK_RG(rg_comm_allreduce(comm, RG_COMM_IN_PLACE, buf, n, RG_DTYPE_F32, RG_OP_SUM,
                                   NULL));
        faults = minor_faults() - f0;
        long bad = check_reduced(RG_DTYPE_F32, RG_OP_SUM, size, buf, 0, n);
        if (bad >= 0) {
            free(buf);
            FAIL("64 MiB allreduce %d: wrong element %ld", k, bad);
        }
    }
    free(buf);
    /* a quarter of the chunk's pages: UCX and the request may touch a few of their own */
    const long chunk_pages = (long)(n * sizeof(float) / (size_t)size / 4096);
    if (faults < 0 || faults > chunk_pages / 4) {
        FAIL("the second 64 MiB allreduce took %ld page faults (its chunk is %ld pages)",
             faults, chunk_pages);
    }
    return 0;
}

START_TEST(test_large_allreduce_2)
{
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 120};
    ck_assert(comm_run(2, large_allreduce, NULL, &o, NULL));
}
END_TEST

/* 64 MiB through every collective, each with another dtype and op; on 3 ranks the chunks are
 * uneven (16 Mi f32 elements do not divide by 3). */
static int large_ops(rg_comm_t *comm, int rank, int size, void *arg)
{
    (void)arg;
    const size_t bytes = (size_t)64 << 20;
    const int root = size - 1;
    char *a = malloc(bytes + 64);
    char *b = malloc(bytes + 64);
    if (a == NULL || b == NULL) {
        free(a);
        free(b);
        FAIL("out of memory");
    }
    int rc = 0;
    /* allreduce, bf16 avg, out of place: rounding over 32 Mi elements */
    size_t n = bytes / 2;
    fill(RG_DTYPE_BF16, RG_OP_AVG, rank, a, 0, n);
    rg_status_t st = rg_comm_allreduce(comm, a, b, n, RG_DTYPE_BF16, RG_OP_AVG, NULL);
    long bad = st == RG_OK ? check_reduced(RG_DTYPE_BF16, RG_OP_AVG, size, b, 0, n) : -1;
    if (st != RG_OK || bad >= 0) {
        fprintf(stderr, "rank %d: 64 MiB bf16 avg allreduce: %s, wrong element %ld\n", rank,
                st == RG_OK ? "ok" : rg_last_error(), bad);
        rc = 1;
        goto out;
    }
    /* reduce_scatter, f64 max, in place: each rank's block of about 64 MiB / size */
    n = bytes / 8 / (size_t)size;
    fill(RG_DTYPE_F64, RG_OP_MAX, rank, a, 0, n * (size_t)size);
    st = rg_comm_reduce_scatter(comm, RG_COMM_IN_PLACE, a, n, RG_DTYPE_F64, RG_OP_MAX, NULL);
    bad = st == RG_OK ? check_reduced(RG_DTYPE_F64, RG_OP_MAX, size, a + (size_t)rank * n * 8,
                                      (size_t)rank * n, n)
                      : -1;
    if (st != RG_OK || bad >= 0) {
        fprintf(stderr, "rank %d: 64 MiB f64 max reduce_scatter: %s, wrong element %ld\n",
                rank, st == RG_OK ? "ok" : rg_last_error(), bad);
        rc = 1;
        goto out;
    }
    /* allgather, i32, out of place */
    n = bytes / 4 / (size_t)size;
    fill(RG_DTYPE_I32, RG_OP_SUM, rank, a, (size_t)rank * n, n);
    st = rg_comm_allgather(comm, a, b, n, RG_DTYPE_I32, NULL);
    for (int r = 0; st == RG_OK && r < size && rc == 0; r++) {
        fill(RG_DTYPE_I32, RG_OP_SUM, r, a, (size_t)r * n, n);
        rc = memcmp(a, b + (size_t)r * n * 4, n * 4) != 0;
    }
    if (st != RG_OK || rc != 0) {
        fprintf(stderr, "rank %d: 64 MiB i32 allgather: %s\n", rank,
                st == RG_OK ? "wrong result" : rg_last_error());
        rc = 1;
        goto out;
    }
    /* broadcast, u8, from the last rank: the root's bytes everywhere */
    for (size_t i = 0; i < bytes; i++) {
        a[i] = (char)(i * 131 + 7);
    }
    if (rank == root) {
        memcpy(b, a, bytes);
    } else {
        memset(b, 0x5a, bytes);
    }
    st = rg_comm_broadcast(comm, b, bytes, RG_DTYPE_U8, root, NULL);
    if (st != RG_OK || memcmp(a, b, bytes) != 0) {
        fprintf(stderr, "rank %d: 64 MiB broadcast from %d: %s\n", rank, root,
                st == RG_OK ? "wrong result" : rg_last_error());
        rc = 1;
    }
out:
    free(a);
    free(b);
    return rc;
}

/* On 1, 3 (uneven chunks) and 8 ranks over shared memory. */
START_TEST(test_large_ops)
{
    static const int sizes[] = {1, 3, 8};
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 200};
    ck_assert(comm_run(sizes[_i], large_ops, NULL, &o, NULL));
}
END_TEST
START_TEST(test_large_ops_tcp_4)
{
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 200, .env = {"UCX_TLS=tcp", NULL}};
    ck_assert(comm_run(4, large_ops, NULL, &o, NULL));
}
END_TEST

/* A group made from a spare UCX worker (rg_comm_spare_start, in the background): it took the
 * spare's worker, and its collectives are exact. */
static int spare_group(rg_comm_t *comm, int rank, int size, void *arg)
{
    (void)arg;
    if (!rg__comm_from_spare(comm)) {
        FAIL("the group made its own UCX worker: the spare was not used");
    }
    double v[64];
    for (size_t i = 0; i < RG_ARRAY_SIZE(v); i++) {
        v[i] = (double)(rank + 1) * (double)i;
    }
    CHECK_RG(rg_comm_allreduce(comm, RG_COMM_IN_PLACE, v, RG_ARRAY_SIZE(v), RG_DTYPE_F64,
                               RG_OP_SUM, NULL));
    for (size_t i = 0; i < RG_ARRAY_SIZE(v); i++) {
        if (v[i] != (double)(size * (size + 1) / 2) * (double)i) {
            FAIL("element %zu: %g", i, v[i]);
        }
    }
    return 0;
}

START_TEST(test_spare_worker)
{
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 60, .spare = true};
    ck_assert_msg(comm_run(3, spare_group, NULL, &o, NULL), "ranks failed (see stderr)");
    o.env[0] = "UCX_TLS=tcp";
    ck_assert_msg(comm_run(2, spare_group, NULL, &o, NULL), "ranks failed over tcp");
}
END_TEST

/* rg_comm_wait_ns: the time a rank spends blocked for a late peer is counted (rank 1 comes
 * to the barrier 300 ms late, so rank 0 waits that long at least), and nothing outside the
 * group's operations is. */
static int wait_counter(rg_comm_t *comm, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    CHECK_RG(rg_comm_barrier(comm, NULL));
    uint64_t before = rg_comm_wait_ns(comm);
    if (rank == 1) {
        rg_sleep_ms(300);
        if (rg_comm_wait_ns(comm) != before) {
            FAIL("the counter moved outside the group's operations");
        }
    }
    CHECK_RG(rg_comm_barrier(comm, NULL));
    uint64_t waited = rg_comm_wait_ns(comm) - before;
    if (rank == 0 && waited < 300000000ull) {
        FAIL("rank 0 waited %.3f s for a peer 0.3 s late", (double)waited / 1e9);
    }
    if (rg_comm_wait_ns(NULL) != 0) {
        FAIL("rg_comm_wait_ns(NULL) is not 0");
    }
    return 0;
}

START_TEST(test_wait_counter)
{
    comm_test_opts_t o = {.stop_rank = -1, .timeout_s = 60};
    ck_assert_msg(comm_run(2, wait_counter, NULL, &o, NULL), "ranks failed (see stderr)");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("collectives");
    tcase_add_unchecked_fixture(tc, comm_test_etcd_fixture, comm_test_etcd_stop);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_matrix_1);
    tcase_add_test(tc, test_matrix_2);
    tcase_add_test(tc, test_matrix_3);
    tcase_add_test(tc, test_matrix_4);
    tcase_add_test(tc, test_matrix_8);
    tcase_add_test(tc, test_matrix_tcp_2);
    tcase_add_test(tc, test_matrix_tcp_3);
    tcase_add_test(tc, test_matrix_ring_forced_3);
    tcase_add_test(tc, test_matrix_ring_forced_4);
    tcase_add_test(tc, test_matrix_rhd_4);
    tcase_add_test(tc, test_matrix_rhd_8);
    tcase_add_test(tc, test_matrix_noshm_3);
    tcase_add_test(tc, test_shm_segments);
    tcase_add_test(tc, test_large_allreduce_2);
    tcase_add_loop_test(tc, test_large_ops, 0, 3);
    tcase_add_test(tc, test_large_ops_tcp_4);
    tcase_add_test(tc, test_spare_worker);
    tcase_add_test(tc, test_wait_counter);
    suite_add_tcase(s, tc);
    return test_main("comm", s, NULL);
}
