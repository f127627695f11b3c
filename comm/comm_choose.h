/*
 * Which algorithm a collective runs: one pure function of the group's tuning, the operation,
 * the number of ranks, the message's size and memory type, and whether the group's own shared
 * memory is in use. Every rank of a group gets the same answer, since collectives are called
 * alike on every rank and the tuning is checked to match when the group is created
 * (comm_wireup.c): ranks that chose differently would wait on transfers that never come.
 *
 * The choice only decides; comm_algo.c then sets the request up for what was chosen, and
 * comm_coll.c counts the operations per algorithm (rg__comm_algo_count, for tests) and logs
 * the choice at debug level. This header needs no UCX, so that the table has a unit test of
 * its own (tests/test_comm_choose.c).
 */
#ifndef RG_COMM_CHOOSE_H
#define RG_COMM_CHOOSE_H

#include <regroup/comm.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest input per rank of a collective that goes through shared memory (a slot of
 * comm_shm.c); a reduce_scatter's whole input (size blocks) must fit. */
#define COMM_SHM_MAX_BYTES 4096

typedef enum {
    COMM_BARRIER,
    COMM_BCAST,
    COMM_ALLREDUCE,
    COMM_ALLGATHER,
    COMM_REDSCAT,
    COMM_COLL_COUNT
} comm_coll_t;

typedef enum {
    COMM_ALGO_LOCAL,         /* nothing to exchange: one rank, or no elements */
    COMM_ALGO_SHM,           /* the group's shared-memory slots, every rank on one host */
    COMM_ALGO_DISSEMINATION, /* barrier: ceil(log2 n) rounds */
    COMM_ALGO_TREE,          /* broadcast: binomial tree */
    COMM_ALGO_SCATTER_RING,  /* broadcast: scatter from the root, then ring allgather */
    COMM_ALGO_RD,            /* allreduce: recursive doubling (folding to a power of two) */
    COMM_ALGO_RHD,           /* allreduce: recursive halving, then doubling */
    COMM_ALGO_RING,          /* allreduce, allgather, reduce_scatter: segmented ring */
    COMM_ALGO_DIRECT,        /* allgather, reduce_scatter: one exchange with every peer */
    COMM_ALGO_COUNT
} comm_algo_t;

/* The tuning knobs of a group (comm_group.c reads them once; see docs/benchmarks.md). */
typedef struct {
    size_t ring_min_bytes; /* REGROUP_COMM_RING_MIN_BYTES: messages this large use the ring */
    size_t rhd_max_bytes;  /* REGROUP_COMM_RHD_MAX_BYTES: allreduces from ring_min_bytes up to
                              below this, on a power of two ranks (at least 4), use recursive
                              halving/doubling instead */
    size_t seg_bytes;      /* REGROUP_COMM_SEGMENT_BYTES: largest ring segment */
    size_t ring_window;    /* REGROUP_COMM_RING_WINDOW: ring segments in flight */
} comm_tuning_t;

/*
 * The algorithm for a collective `coll` on `nranks` ranks of `count` elements of `esize`
 * bytes (per rank's block for allgather and reduce_scatter, the whole buffer otherwise) in
 * memory `mem`; `shm_ok`: the group's shared memory is in use. Pure: no I/O, no state.
 * Elements matter beside bytes: the ring and the scatter cut a message into nranks chunks
 * of whole elements, so they need count >= nranks.
 */
comm_algo_t rg__comm_algo_choose(const comm_tuning_t *tuning, comm_coll_t coll, int nranks,
                                 size_t count, size_t esize, rg_mem_type_t mem, bool shm_ok);

/* "ring", "recursive halving/doubling", ... for messages; "?" when out of range. */
const char *rg__comm_algo_name(comm_algo_t algo);

/* How many `coll` operations the group started with `algo` since it was created (its own
 * set-up collectives included). An internal accessor for tests; 0 for a NULL group. */
uint64_t rg__comm_algo_count(const rg_comm_t *comm, comm_coll_t coll, comm_algo_t algo);

/* Whether the group took its UCX context and worker from rg_comm_params_t.spare (and did not
 * make its own). An internal accessor for tests, as the one above; false for NULL. */
bool rg__comm_from_spare(const rg_comm_t *comm);

#endif
