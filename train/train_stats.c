/*
 * Order statistics that the group's checks share: train_straggler.c (each rank's compute
 * share against the others') and train_health.c (each rank's best link against the others').
 * Both ask, for every rank, the median of the other ranks' figures: one sort of all of them,
 * then a binary search per rank, rather than a sort per rank.
 */
#include "train_internal.h"

int train_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

double train_median_without(const double *sorted, size_t n, double v)
{
    size_t lo = 0;
    size_t hi = n;
    while (lo < hi) {   /* the first element >= v */
        size_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < v) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    size_t p = lo;
    size_t m = n - 1;
#define AT(i) sorted[(i) < p ? (i) : (i) + 1]
    double med = m % 2 ? AT(m / 2) : (AT(m / 2 - 1) + AT(m / 2)) / 2;
#undef AT
    return med;
}
