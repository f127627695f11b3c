/*
 * What the C benches summarise their repetitions with: the median (which sorts its array in
 * place), and the comparison it sorts by.
 */
#ifndef RG_BENCH_STATS_H
#define RG_BENCH_STATS_H

#include <math.h>
#include <stdlib.h>

static inline int rg_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), sorting v; NAN when n is 0. */
static inline double rg_bench_median(double *v, int n)
{
    if (n <= 0) {
        return NAN;
    }
    qsort(v, (size_t)n, sizeof(*v), rg_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
