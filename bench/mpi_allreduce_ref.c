/*
 * The OpenMPI reference for rg-bench-comm: MPI_Allreduce (sum, out of place), timed the same
 * way (warm-up, a probe that grows until it lasts 10 ms, a loop sized to about SECONDS, the
 * slowest rank's mean), on the same inputs: rank r's element i is (r + 1) * (1 + i % 5), as in
 * rg_bench_comm.c. The output of the last timed operation of every size is checked on every
 * rank (exactly for integer dtypes, within the sum's rounding for floating point); a wrong
 * one ends the run with exit status 1. Built and run only by bench/rg-bench-comm.sh with
 * mpicc; not part of the CMake build.
 *   mpi-allreduce-ref LABEL SECONDS DTYPE SIZE...     DTYPE: f32 f64 i32 i64 u8
 */
#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_MAX_ITERS 50000000L

static const struct {
    const char  *name;
    MPI_Datatype type;
    size_t       size;
    double       eps;   /* 0: integer, checked exactly */
} dtypes[] = {{"f32", MPI_FLOAT, 4, FLT_EPSILON},
              {"f64", MPI_DOUBLE, 8, DBL_EPSILON},
              {"i32", MPI_INT32_T, 4, 0},
              {"i64", MPI_INT64_T, 8, 0},
              {"u8", MPI_UINT8_T, 1, 0}};

static double input_of(int r, size_t i)
{
    return (double)(r + 1) * (double)(1 + i % 5);
}

static void elem_set(void *buf, const char *d, size_t i, double v)
{
    if (strcmp(d, "f32") == 0) {
        ((float *)buf)[i] = (float)v;
    } else if (strcmp(d, "f64") == 0) {
        ((double *)buf)[i] = v;
    } else if (strcmp(d, "i32") == 0) {
        ((int32_t *)buf)[i] = (int32_t)v;
    } else if (strcmp(d, "i64") == 0) {
        ((int64_t *)buf)[i] = (int64_t)v;
    } else {
        ((uint8_t *)buf)[i] = (uint8_t)v;
    }
}

static double elem_get(const void *buf, const char *d, size_t i)
{
    if (strcmp(d, "f32") == 0) {
        return ((const float *)buf)[i];
    } else if (strcmp(d, "f64") == 0) {
        return ((const double *)buf)[i];
    } else if (strcmp(d, "i32") == 0) {
        return ((const int32_t *)buf)[i];
    } else if (strcmp(d, "i64") == 0) {
        return (double)((const int64_t *)buf)[i];
    }
    return ((const uint8_t *)buf)[i];
}

/* 0 if every element of out is the sum over n ranks (within rounding for floats). */
static int check(const void *out, const char *d, double eps, size_t count, int n, int rank,
                 size_t bytes)
{
    double ranks_sum = (double)n * (n + 1) / 2;
    for (size_t i = 0; i < count; i++) {
        double want = ranks_sum * (double)(1 + i % 5);
        double got = elem_get(out, d, i);
        /* n - 1 additions, each rounding by at most half an ulp of the partial sum */
        double tol = eps * (double)n * want;
        if (fabs(got - want) > tol) {
            fprintf(stderr, "mpi-allreduce-ref: rank %d: %s %zu B: element %zu is %g, not %g\n",
                    rank, d, bytes, i, got, want);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int dt = -1;
    for (size_t d = 0; argc >= 4 && d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
        if (strcmp(argv[3], dtypes[d].name) == 0) {
            dt = (int)d;
        }
    }
    double seconds = argc >= 4 ? atof(argv[2]) : 0;
    if (argc < 5 || dt < 0 || seconds <= 0 || seconds > 600) {
        if (rank == 0) {
            fprintf(stderr, "usage: mpi-allreduce-ref LABEL SECONDS DTYPE SIZE...  "
                            "(DTYPE: f32 f64 i32 i64 u8)\n");
        }
        MPI_Finalize();
        return 2;
    }
    const char *label = argv[1];
    const char *dname = dtypes[dt].name;
    MPI_Datatype type = dtypes[dt].type;
    const size_t es = dtypes[dt].size;
    if (strcmp(dname, "u8") == 0 && n > 8) {
        if (rank == 0) {
            fprintf(stderr, "mpi-allreduce-ref: u8 sums of %d ranks overflow: not checked\n", n);
        }
        MPI_Finalize();
        return 1;
    }
    int rc = 0;
    for (int a = 4; a < argc && rc == 0; a++) {
        size_t bytes = (size_t)atoll(argv[a]);
        size_t count = bytes / es;
        if (count == 0 || count > (size_t)INT32_MAX) {
            continue;
        }
        bytes = count * es;
        char *in = malloc(bytes);
        char *out = malloc(bytes);
        if (in == NULL || out == NULL) {
            fprintf(stderr, "mpi-allreduce-ref: out of memory\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (size_t i = 0; i < count; i++) {
            elem_set(in, dname, i, input_of(rank, i));
            elem_set(out, dname, i, -1.0);
        }
        for (int i = 0; i < 3; i++) {
            MPI_Allreduce(in, out, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        }
        /* The probe grows until the slowest rank saw it last 10 ms (all ranks decide alike). */
        double probe = 0;
        for (long k = 1;; k *= 4) {
            double t0 = MPI_Wtime();
            for (long i = 0; i < k; i++) {
                MPI_Allreduce(in, out, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
            }
            double el = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &el, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            probe = el / (double)k;
            if (el >= 0.01 || k >= (1L << 20)) {
                break;
            }
        }
        long iters = (long)(seconds / (probe > 1e-8 ? probe : 1e-8));
        iters = iters < 5 ? 5 : (iters > REF_MAX_ITERS ? REF_MAX_ITERS : iters);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++) {
            MPI_Allreduce(in, out, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
        }
        double per_op = (MPI_Wtime() - t0) / (double)iters;
        /* What was timed must be right: the last operation's output, on every rank. */
        int bad = check(out, dname, dtypes[dt].eps, count, n, rank, bytes);
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &per_op, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (bad) {
            if (rank == 0) {
                fprintf(stderr, "mpi-allreduce-ref: %s %s %zu B: wrong result on some rank\n",
                        label, dname, bytes);
            }
            rc = 1;
        } else if (rank == 0) {
            double algbw = (double)bytes / per_op / 1e9;
            printf("{\"bench\":\"mpi\",\"impl\":\"%s\",\"op\":\"allreduce\",\"dtype\":\"%s\","
                   "\"bytes\":%zu,\"ranks\":%d,\"iters\":%ld,\"window_s\":%.3f,"
                   "\"latency_us\":%.3f,\"algbw_GBps\":%.3f,\"busbw_GBps\":%.3f,"
                   "\"checked\":true}\n",
                   label, dname, bytes, n, iters, per_op * (double)iters, per_op * 1e6, algbw,
                   algbw * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
        free(in);
        free(out);
    }
    MPI_Finalize();
    return rc;
}
