/*
 * rg-bench-comm: latency and bandwidth of the comm/ collectives.
 *
 * Runs as one rank of a group whose parameters come from the launcher's environment (RANK,
 * WORLD_SIZE, REGROUP_ETCD_ENDPOINTS, REGROUP_JOB_ID, REGROUP_ROUND); bench/rg-bench-comm.sh
 * starts an etcd and N such processes on this host. Rank 0 prints one JSON object per line
 * per op and size:
 *   {"bench":"comm","op":"allreduce","dtype":"f32","bytes":1048576,"ranks":2,"iters":..,
 *    "window_s":..,"latency_us":..,"algbw_GBps":..,"busbw_GBps":..,"transport":"..",
 *    "checked":true,"commit":"..","build":".."}
 * iters operations are timed back to back over window_s seconds (about --seconds: a probe
 * that grows until it lasts 10 ms sizes the loop). Inputs are rank-dependent small integers
 * (bench/mpi_allreduce_ref.c fills the same); the output of the last timed operation is
 * checked exactly on every rank, and a wrong one ends the bench with exit status 1. Figures are
 * with nccl-tests' definitions: latency = time per operation (the slowest rank's mean),
 * algbw = bytes / latency, busbw = algbw * 2(n-1)/n for allreduce, (n-1)/n for allgather and
 * reduce_scatter (bytes = the whole gathered / scattered buffer), 1 for broadcast.
 *
 * The op "send" is point to point: rank 0 sends the buffer to rank 1 (rg_comm_send and
 * rg_comm_recv; any other rank waits), checked on rank 1.
 *   rg-bench-comm [--op=allreduce,allgather,reduce_scatter,broadcast,send] [--dtype=f32]
 *                 [--sizes=8,65536,1048576] [--seconds=0.5]
 *   rg-bench-comm --memcpy     memcpy bandwidth of this host (no group; one JSON line)
 */
#include "rg_bench_meta.h"
#include "rg_common.h"

#include <regroup/comm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_SIZES 32
/* Enough for --seconds of 8 B operations at 0.1 us each. */
#define BENCH_MAX_ITERS 50000000

static const struct {
    const char *name;
    rg_dtype_t  dtype;
} dtypes[] = {{"f32", RG_DTYPE_F32}, {"f64", RG_DTYPE_F64}, {"f16", RG_DTYPE_F16},
              {"bf16", RG_DTYPE_BF16}, {"i32", RG_DTYPE_I32}, {"i64", RG_DTYPE_I64},
              {"u8", RG_DTYPE_U8}};

static const char *dtype_name(rg_dtype_t d)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
        if (dtypes[i].dtype == d) {
            return dtypes[i].name;
        }
    }
    return "?";
}

static double now_s(void)
{
    return (double)rg_now_ns() / 1e9;
}

static int memcpy_bench(void)
{
    size_t n = 64u << 20;
    char *a = malloc(n);
    char *b = malloc(n);
    if (a == NULL || b == NULL) {
        fprintf(stderr, "rg-bench-comm: out of memory\n");
        return 1;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e9;
    for (int i = 0; i < 20; i++) {
        double t0 = now_s();
        memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    printf("{\"bench\":\"comm\",\"op\":\"memcpy\",\"bytes\":%zu,\"best_of\":20,\"GBps\":%.3f,"
           "%s}\n",
           n, (double)n / best / 1e9, RG_BENCH_META);
    free(a);
    free(b);
    return 0;
}

typedef struct {
    const char *op;
    rg_dtype_t  dtype;
    size_t      bytes;
} bench_case_t;

/* Element i of buf as a double, and set from one. */
static double elem_get(const void *buf, rg_dtype_t d, size_t i)
{
    switch (d) {
    case RG_DTYPE_F32: return ((const float *)buf)[i];
    case RG_DTYPE_F64: return ((const double *)buf)[i];
    case RG_DTYPE_F16: return rg_f16_to_f32(((const uint16_t *)buf)[i]);
    case RG_DTYPE_BF16: return rg_bf16_to_f32(((const uint16_t *)buf)[i]);
    case RG_DTYPE_I32: return ((const int32_t *)buf)[i];
    case RG_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    case RG_DTYPE_U8: return ((const uint8_t *)buf)[i];
    }
    return 0;
}

static void elem_set(void *buf, rg_dtype_t d, size_t i, double v)
{
    switch (d) {
    case RG_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case RG_DTYPE_F64: ((double *)buf)[i] = v; break;
    case RG_DTYPE_F16: ((uint16_t *)buf)[i] = rg_f32_to_f16((float)v); break;
    case RG_DTYPE_BF16: ((uint16_t *)buf)[i] = rg_f32_to_bf16((float)v); break;
    case RG_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case RG_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case RG_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

/* Rank r's input element i: (r + 1) * (1 + i % 5). Small integers: a sum over n ranks is at
 * most 5n(n+1)/2, exact in f32 up to about 2,500 ranks, in f64 and the integer types of 32
 * bits and more for any group, and in u8, f16 and bf16 up to 8 ranks (check_result refuses
 * to check those past 8). */
static double input_of(int r, size_t i)
{
    return (double)(r + 1) * (double)(1 + i % 5);
}

/* Fills the inputs of case c on this rank (and the root's broadcast buffer). */
static void fill_inputs(const bench_case_t *c, int rank, char *in, char *out)
{
    size_t n = c->bytes / rg_dtype_size(c->dtype);
    for (size_t i = 0; i < n; i++) {
        elem_set(in, c->dtype, i, input_of(rank, i));
    }
    if (strcmp(c->op, "broadcast") == 0 || strcmp(c->op, "send") == 0) {
        for (size_t i = 0; i < n; i++) {
            elem_set(out, c->dtype, i, rank == 0 ? input_of(0, i) : -1.0);
        }
    }
}

/* Checks the output of the last timed operation exactly; 0 if right. */
static int check_result(const bench_case_t *c, int rank, int nranks, const char *out)
{
    size_t n = c->bytes / rg_dtype_size(c->dtype);
    size_t per_rank = n / (size_t)nranks;
    if (strcmp(c->op, "send") == 0 && rank != 1) {
        return 0;   /* the sender's buffer, and the bystanders' */
    }
    double ranks_sum = (double)nranks * (nranks + 1) / 2;
    if ((c->dtype == RG_DTYPE_U8 || c->dtype == RG_DTYPE_F16 || c->dtype == RG_DTYPE_BF16) &&
        nranks > 8 && strcmp(c->op, "allgather") != 0 && strcmp(c->op, "broadcast") != 0) {
        fprintf(stderr, "rg-bench-comm: %s sums of %d ranks are not exact: not checked\n",
                dtype_name(c->dtype), nranks);
        return 1;
    }
    size_t count = strcmp(c->op, "reduce_scatter") == 0 ? per_rank
                   : strcmp(c->op, "allgather") == 0    ? per_rank * (size_t)nranks
                                                        : n;
    for (size_t i = 0; i < count; i++) {
        double want;
        if (strcmp(c->op, "allreduce") == 0) {
            want = ranks_sum * (double)(1 + i % 5);
        } else if (strcmp(c->op, "reduce_scatter") == 0) {
            want = ranks_sum * (double)(1 + ((size_t)rank * per_rank + i) % 5);
        } else if (strcmp(c->op, "allgather") == 0) {
            want = input_of((int)(i / per_rank), i % per_rank);
        } else {
            want = input_of(0, i);
        }
        double got = elem_get(out, c->dtype, i);
        if (got != want) {
            fprintf(stderr, "rg-bench-comm: rank %d: %s %s %zu B: element %zu is %g, not %g\n",
                    rank, c->op, dtype_name(c->dtype), c->bytes, i, got, want);
            return 1;
        }
    }
    return 0;
}

/* Runs the op once; buffers are sized for the largest case. */
static rg_status_t bench_once(rg_comm_t *comm, const bench_case_t *c, char *in, char *out)
{
    size_t es = rg_dtype_size(c->dtype);
    size_t n = c->bytes / es;
    size_t per_rank = n / (size_t)rg_comm_size(comm);
    if (strcmp(c->op, "allreduce") == 0) {
        return rg_comm_allreduce(comm, in, out, n, c->dtype, RG_OP_SUM, NULL);
    }
    if (strcmp(c->op, "allgather") == 0) {
        return rg_comm_allgather(comm, in, out, per_rank, c->dtype, NULL);
    }
    if (strcmp(c->op, "reduce_scatter") == 0) {
        return rg_comm_reduce_scatter(comm, in, out, per_rank, c->dtype, RG_OP_SUM, NULL);
    }
    if (strcmp(c->op, "broadcast") == 0) {
        return rg_comm_broadcast(comm, out, n, c->dtype, 0, NULL);
    }
    if (strcmp(c->op, "send") == 0) {
        int rank = rg_comm_rank(comm);
        return rank == 0 ? rg_comm_send(comm, out, n, c->dtype, 1, 1, NULL)
               : rank == 1 ? rg_comm_recv(comm, out, n, c->dtype, 0, 1, NULL)
                           : RG_OK;
    }
    return rg_error(RG_EINVAL, "unknown op %s", c->op);
}

static double bus_factor(const char *op, int n)
{
    if (strcmp(op, "allreduce") == 0) {
        return 2.0 * (n - 1) / n;
    }
    if (strcmp(op, "broadcast") == 0 || strcmp(op, "send") == 0) {
        return 1.0;
    }
    return (double)(n - 1) / n;
}

static int run_case(rg_comm_t *comm, const bench_case_t *c, double seconds, char *in, char *out)
{
    const int rank = rg_comm_rank(comm);
    const int n = rg_comm_size(comm);
    rg_status_t st = RG_OK;
    fill_inputs(c, rank, in, out);
    /* Warm up, then size the loop from a probe that grows until the slowest rank saw it last
     * 10 ms (every rank decides from the same maximum, so all run the same operations). */
    for (int i = 0; i < 3 && st == RG_OK; i++) {
        st = bench_once(comm, c, in, out);
    }
    double t0;
    double probe = 0;
    for (int64_t k = 1; st == RG_OK; k *= 4) {
        t0 = now_s();
        for (int64_t i = 0; i < k && st == RG_OK; i++) {
            st = bench_once(comm, c, in, out);
        }
        double el = now_s() - t0;
        if (st == RG_OK) {
            st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, &el, 1, RG_DTYPE_F64, RG_OP_MAX,
                                   NULL);
        }
        probe = el / (double)k;
        if (el >= 0.01 || k >= (1 << 20)) {
            break;
        }
    }
    int64_t iters = (int64_t)(seconds / (probe > 1e-8 ? probe : 1e-8));
    iters = iters < 5 ? 5 : (iters > BENCH_MAX_ITERS ? BENCH_MAX_ITERS : iters);
    if (st == RG_OK) {
        st = rg_comm_barrier(comm, NULL);
    }
    t0 = now_s();
    for (int64_t i = 0; i < iters && st == RG_OK; i++) {
        st = bench_once(comm, c, in, out);
    }
    double per_op = (now_s() - t0) / (double)iters;
    /* What was timed must be right: the last operation's output, exactly, on every rank. */
    double bad = st == RG_OK ? (double)check_result(c, rank, n, out) : 0;
    if (st == RG_OK) {
        st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, &bad, 1, RG_DTYPE_F64, RG_OP_MAX, NULL);
    }
    if (st == RG_OK && bad != 0) {
        if (rank == 0) {
            fprintf(stderr, "rg-bench-comm: %s %zu B: wrong result on some rank\n", c->op,
                    c->bytes);
        }
        return 1;
    }
    if (st == RG_OK) {
        st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, &per_op, 1, RG_DTYPE_F64, RG_OP_MAX,
                               NULL);
    }
    if (st != RG_OK) {
        fprintf(stderr, "rg-bench-comm: rank %d: %s %zu B: %s\n", rank, c->op, c->bytes,
                rg_last_error());
        return 1;
    }
    if (rank == 0) {
        double algbw = (double)c->bytes / per_op / 1e9;
        const char *tls = getenv("UCX_TLS");
        printf("{\"bench\":\"comm\",\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu,\"ranks\":%d,"
               "\"iters\":%lld,\"window_s\":%.3f,\"latency_us\":%.3f,\"algbw_GBps\":%.3f,"
               "\"busbw_GBps\":%.3f,\"transport\":\"%s\",\"checked\":true,%s}\n",
               c->op, dtype_name(c->dtype), c->bytes, n, (long long)iters,
               per_op * (double)iters, per_op * 1e6, algbw, algbw * bus_factor(c->op, n),
               tls ? tls : "default(shm)", RG_BENCH_META);
        fflush(stdout);
    }
    return 0;
}

static int parse_sizes(const char *s, size_t *sizes, int *n_sizes)
{
    *n_sizes = 0;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (!rg_parse_i64(t, &v) || v <= 0 || *n_sizes == BENCH_MAX_SIZES || v > (1ll << 34)) {
            return -1;
        }
        sizes[(*n_sizes)++] = (size_t)v;
    }
    return *n_sizes > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *ops = "allreduce";
    const char *dtype_s = "f32";
    size_t sizes[BENCH_MAX_SIZES] = {8, 65536, 1048576, 16777216, 67108864};
    int n_sizes = 5;
    double seconds = 0.5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--memcpy") == 0) {
            return memcpy_bench();
        } else if (strncmp(argv[i], "--op=", 5) == 0) {
            ops = argv[i] + 5;
        } else if (strncmp(argv[i], "--dtype=", 8) == 0) {
            dtype_s = argv[i] + 8;
        } else if (strncmp(argv[i], "--sizes=", 8) == 0) {
            if (parse_sizes(argv[i] + 8, sizes, &n_sizes) != 0) {
                fprintf(stderr, "rg-bench-comm: bad --sizes\n");
                return 2;
            }
        } else if (strncmp(argv[i], "--seconds=", 10) == 0) {
            seconds = atof(argv[i] + 10);
        } else {
            fprintf(stderr, "usage: rg-bench-comm [--op=allreduce,...] [--dtype=f32] "
                            "[--sizes=8,65536] [--seconds=0.5] | --memcpy\n");
            return 2;
        }
    }
    int dtype = -1;
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        if (strcmp(dtype_s, dtypes[d].name) == 0) {
            dtype = (int)dtypes[d].dtype;
        }
    }
    if (dtype < 0 || seconds <= 0 || seconds > 600) {
        fprintf(stderr, "rg-bench-comm: bad --dtype or --seconds\n");
        return 2;
    }
    rg_comm_env_t env;
    rg_status_t st = rg_comm_env_read(&env);
    if (st != RG_OK) {
        fprintf(stderr, "rg-bench-comm: %s (run it through bench/rg-bench-comm.sh)\n",
                rg_last_error());
        return 2;
    }
    rg_comm_t *comm = NULL;
    st = rg_comm_create(&env.params, &comm);
    if (st != RG_OK) {
        fprintf(stderr, "rg-bench-comm: rank %d: %s\n", env.params.rank, rg_last_error());
        return 1;
    }
    size_t max = 0;
    for (int i = 0; i < n_sizes; i++) {
        max = sizes[i] > max ? sizes[i] : max;
    }
    char *in = malloc(max);
    char *out = malloc(max);
    int rc = in == NULL || out == NULL;
    char opbuf[256];
    snprintf(opbuf, sizeof(opbuf), "%s", ops);
    for (char *save = NULL, *op = strtok_r(opbuf, ",", &save); op != NULL && rc == 0;
         op = strtok_r(NULL, ",", &save)) {
        for (int i = 0; i < n_sizes && rc == 0; i++) {
            bench_case_t c = {.op = op, .dtype = (rg_dtype_t)dtype, .bytes = sizes[i]};
            size_t unit = rg_dtype_size(c.dtype) *
                          (strcmp(op, "allreduce") && strcmp(op, "broadcast") &&
                                   strcmp(op, "send")
                               ? (size_t)env.params.size
                               : 1);
            if (c.bytes < unit) {
                continue;
            }
            c.bytes -= c.bytes % unit;
            rc = run_case(comm, &c, seconds, in, out);
        }
    }
    free(in);
    free(out);
    rg_comm_destroy(comm);
    return rc;
}
