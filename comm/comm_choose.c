/*
 * The choice of a collective's algorithm (see comm_choose.h). The table:
 *
 *   any op, no elements (barrier aside), or 1 rank    local only
 *   host memory, shared memory in use, input at most
 *   COMM_SHM_MAX_BYTES (reduce_scatter: all blocks)   shared memory
 *   otherwise, with ring = bytes >= ring_min_bytes:
 *     barrier                                         dissemination
 *     broadcast       ring, count >= n                scatter + ring allgather
 *                     else                            binomial tree
 *     allreduce       ring, count >= n, n >= 4 a
 *                     power of two, bytes < rhd_max   recursive halving/doubling
 *                     ring, count >= n                ring
 *                     else                            recursive doubling
 *     allgather       ring                            ring
 *                     else                            direct
 *     reduce_scatter  ring                            ring
 *                     else                            direct
 *
 * Small messages take few latency-bound rounds; large ones the pipelined ring, whose bytes
 * per rank are optimal. Halving/doubling sends the ring's bytes in 2 log2(n) steps instead of
 * 2(n - 1) and won over tcp up to a few MiB (comm_group.c has the measurements behind the
 * defaults).
 */
#include "comm_choose.h"

static bool comm_is_pow2(int n)
{
    return n > 0 && (n & (n - 1)) == 0;
}

comm_algo_t rg__comm_algo_choose(const comm_tuning_t *tuning, comm_coll_t coll, int nranks,
                                 size_t count, size_t esize, rg_mem_type_t mem, bool shm_ok)
{
    const size_t bytes = count * esize;
    if ((coll != COMM_BARRIER && count == 0) || nranks <= 1) {
        return COMM_ALGO_LOCAL;
    }
    const size_t shm_max = coll == COMM_REDSCAT ? COMM_SHM_MAX_BYTES / (size_t)nranks
                                                : COMM_SHM_MAX_BYTES;
    if (shm_ok && mem == RG_MEM_HOST && bytes <= shm_max) {
        return COMM_ALGO_SHM;
    }
    const bool ring = bytes >= tuning->ring_min_bytes;
    const bool chunks = count >= (size_t)nranks;
    switch (coll) {
    case COMM_BARRIER:
        return COMM_ALGO_DISSEMINATION;
    case COMM_BCAST:
        return ring && chunks ? COMM_ALGO_SCATTER_RING : COMM_ALGO_TREE;
    case COMM_ALLREDUCE:
        if (!ring || !chunks) {
            return COMM_ALGO_RD;
        }
        if (nranks >= 4 && comm_is_pow2(nranks) && bytes < tuning->rhd_max_bytes) {
            return COMM_ALGO_RHD;
        }
        return COMM_ALGO_RING;
    case COMM_ALLGATHER:
    case COMM_REDSCAT:
        return ring ? COMM_ALGO_RING : COMM_ALGO_DIRECT;
    case COMM_COLL_COUNT:
        break;
    }
    return COMM_ALGO_LOCAL;
}

const char *rg__comm_algo_name(comm_algo_t algo)
{
    static const char *const names[COMM_ALGO_COUNT] = {
        [COMM_ALGO_LOCAL] = "local",
        [COMM_ALGO_SHM] = "shared memory",
        [COMM_ALGO_DISSEMINATION] = "dissemination",
        [COMM_ALGO_TREE] = "binomial tree",
        [COMM_ALGO_SCATTER_RING] = "scatter and ring allgather",
        [COMM_ALGO_RD] = "recursive doubling",
        [COMM_ALGO_RHD] = "recursive halving/doubling",
        [COMM_ALGO_RING] = "ring",
        [COMM_ALGO_DIRECT] = "direct exchange",
    };
    return (unsigned)algo < COMM_ALGO_COUNT ? names[algo] : "?";
}
