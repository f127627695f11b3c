/*
 * The OpenMPI reference for rg-bench-comm: MPI_Allreduce of f32 sums, timed the same way
 * (warm-up, a loop sized to about --seconds, the slowest rank's mean). Built and run only by
 * bench/rg-bench-comm.sh with mpicc; not part of the CMake build.
 *   mpi-allreduce-ref LABEL SECONDS SIZE...
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 4) {
        if (rank == 0) {
            fprintf(stderr, "usage: mpi-allreduce-ref LABEL SECONDS SIZE...\n");
        }
        MPI_Finalize();
        return 2;
    }
    const char *label = argv[1];
    double seconds = atof(argv[2]);
    for (int a = 3; a < argc; a++) {
        size_t bytes = (size_t)atoll(argv[a]);
        int count = (int)(bytes / sizeof(float));
        float *in = calloc((size_t)count, sizeof(float));
        float *out = calloc((size_t)count, sizeof(float));
        for (int i = 0; i < 3; i++) {
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double t0 = MPI_Wtime();
        for (int i = 0; i < 5; i++) {
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double probe = (MPI_Wtime() - t0) / 5;
        MPI_Allreduce(MPI_IN_PLACE, &probe, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        long iters = (long)(seconds / (probe > 1e-7 ? probe : 1e-7));
        iters = iters < 5 ? 5 : (iters > 200000 ? 200000 : iters);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++) {
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double per_op = (MPI_Wtime() - t0) / (double)iters;
        MPI_Allreduce(MPI_IN_PLACE, &per_op, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = (double)bytes / per_op / 1e9;
            printf("{\"bench\":\"mpi\",\"impl\":\"%s\",\"op\":\"allreduce\",\"dtype\":\"f32\","
                   "\"bytes\":%zu,\"ranks\":%d,\"iters\":%ld,\"latency_us\":%.3f,"
                   "\"algbw_GBps\":%.3f,\"busbw_GBps\":%.3f}\n",
                   label, bytes, n, iters, per_op * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
