/*
 * regroup data: a dataset of fixed-size records, a global sampler whose cursor survives any
 * change of world size, and a loader that prepares each rank's batches on a background thread.
 *
 * The sampler's contract (see docs/data.md): epoch e of a job with seed S visits the records in
 * the order of a permutation that depends only on (S, e). Global step s of an epoch covers the
 * permutation's positions [s*B, (s+1)*B); rank r of a world of W takes a contiguous share of
 * those positions, the first (len % W) ranks one more than the others. Because positions are
 * global, a cursor saved at world size W and restored at W' continues with the next global
 * step, and every record of an epoch is used exactly once whatever the history of resizes.
 */
#ifndef REGROUP_DATA_H
#define REGROUP_DATA_H

#include <regroup/deadline.h>
#include <regroup/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RG_DATA_NODISCARD __attribute__((warn_unused_result))

/* ---- dataset --------------------------------------------------------------------------- */

/* The most bytes of records a dataset may hold (1 GiB); larger inputs fail with RG_ETOOBIG. */
#define RG_DATASET_MAX_BYTES (1ull << 30)
/* The most records a dataset may hold (sample ids are 32-bit). */
#define RG_DATASET_MAX_RECORDS 0x7fffffffull

/* n records of record_size bytes each, plus one byte label per record. Immutable once made. */
typedef struct rg_dataset rg_dataset_t;

/*
 * Reads a pair of IDX files (the MNIST format, gzip-compressed or plain; zlib reads both):
 * images_path holds unsigned bytes of 2 to 4 dimensions (magic 0x00000803 for n x rows x
 * cols), labels_path holds n unsigned bytes (magic 0x00000801). Each record is one image, its
 * bytes in file order. Blocks on file I/O; safe from any thread.
 * Returns RG_ENOENT (missing file), RG_EIO (read error), RG_ECORRUPT (wrong magic, bad
 * dimensions, truncated data, trailing data, a failed gzip checksum, counts that differ
 * between the files), RG_ETOOBIG (past RG_DATASET_MAX_BYTES / _RECORDS), RG_ENOMEM.
 * On success *ds_p owns the data; free it with rg_dataset_destroy().
 */
rg_status_t rg_dataset_open_idx(const char *images_path, const char *labels_path,
                                rg_dataset_t **ds_p) RG_DATA_NODISCARD;

/*
 * Makes a dataset from memory: copies n records of record_size bytes and n labels. Useful
 * for tests and for subsets (rg_dataset_records() of another dataset). Does not block;
 * safe from any thread.
 * Returns RG_EINVAL (n == 0, record_size == 0, NULL arrays), RG_ETOOBIG, RG_ENOMEM.
 */
rg_status_t rg_dataset_create(const uint8_t *records, const uint8_t *labels, size_t n,
                              size_t record_size, rg_dataset_t **ds_p) RG_DATA_NODISCARD;

/* Frees the dataset; accepts NULL. No loader may still use it. */
void rg_dataset_destroy(rg_dataset_t *ds);

/* Accessors; a dataset is immutable, so all of them are safe from any thread. */
size_t         rg_dataset_size(const rg_dataset_t *ds);         /* number of records */
size_t         rg_dataset_record_size(const rg_dataset_t *ds);  /* bytes per record */
const uint8_t *rg_dataset_records(const rg_dataset_t *ds);      /* size * record_size bytes */
const uint8_t *rg_dataset_labels(const rg_dataset_t *ds);       /* size bytes */
/* The IDX dimensions after the record count (rows, cols for images); ndims is 1 for a
 * dataset made by rg_dataset_create (its one dimension is record_size). Up to 3 returned. */
unsigned       rg_dataset_dims(const rg_dataset_t *ds, uint32_t dims[3]);

/* ---- sampler --------------------------------------------------------------------------- */

/*
 * Where a job is in its data: plain data, saved in a checkpoint and restored at any world
 * size. `step` is the next global step to run within `epoch`; always < steps per epoch once
 * normalized by rg_sampler_advance(). The sampler parameters (batch size, drop_last, number of
 * records) must be the same when a cursor is restored.
 */
typedef struct {
    uint64_t seed;
    uint64_t epoch;
    uint64_t step;
} rg_data_cursor_t;

typedef struct {
    uint64_t num_samples; /* records in the dataset, 1..RG_DATASET_MAX_RECORDS */
    uint32_t batch_size;  /* global batch B, >= 1 */
    bool     drop_last;   /* false: the last step of an epoch is a short batch of n % B records;
                             true: those n % B records are skipped in that epoch */
} rg_sampler_params_t;

typedef struct rg_sampler rg_sampler_t;

/* The cursor at the start of a job: {seed, 0, 0}. */
rg_data_cursor_t rg_data_cursor_start(uint64_t seed);

/*
 * Creates a sampler. Does not block. Returns RG_EINVAL on bad parameters (also when drop_last
 * leaves no full batch), RG_ENOMEM. Free with rg_sampler_destroy(). A sampler caches the
 * permutation of the last epoch it was asked about, so it is not thread-safe: use one per
 * thread.
 */
rg_status_t rg_sampler_create(const rg_sampler_params_t *params,
                              rg_sampler_t **sampler_p) RG_DATA_NODISCARD;
void        rg_sampler_destroy(rg_sampler_t *sampler); /* accepts NULL */

/* Global steps in one epoch: ceil(n / B), or floor(n / B) with drop_last. */
uint64_t rg_sampler_steps_per_epoch(const rg_sampler_t *sampler);

/*
 * The size of the global batch at cursor->step: B, or n % B for a short last step. The loss
 * of a step is averaged over this count (not over a rank's share), so that summing the ranks'
 * gradients gives the same update at any world size. Returns 0 if the cursor is out of range.
 */
uint32_t rg_sampler_global_count(const rg_sampler_t *sampler, const rg_data_cursor_t *cursor);

/*
 * The share of rank of world at a global batch of `len` positions: positions
 * [offset, offset + count) of the batch. A pure function, thread-safe. Requires rank < world.
 */
void rg_sampler_share(uint32_t len, uint32_t rank, uint32_t world, uint32_t *offset_p,
                      uint32_t *count_p);

/*
 * The sample ids (record indexes) of rank's share of the global step at *cursor: writes
 * count ids to ids[0..count) and sets *count_p. ids must hold max_ids; ceil(B / world) is
 * always enough. Returns RG_EINVAL (rank >= world, world == 0, cursor->step out of range),
 * RG_ETOOBIG (max_ids too small). Does not block beyond computing one permutation.
 */
rg_status_t rg_sampler_ids(rg_sampler_t *sampler, const rg_data_cursor_t *cursor,
                           uint32_t rank, uint32_t world, uint32_t *ids, size_t max_ids,
                           size_t *count_p) RG_DATA_NODISCARD;

/* Moves *cursor to the next global step: step + 1, or {epoch + 1, 0} after the last step. */
void rg_sampler_advance(const rg_sampler_t *sampler, rg_data_cursor_t *cursor);

/*
 * Fills perm[0..n) with epoch's permutation of 0..n-1 for seed. The PRNG is splitmix64 whose
 * state starts at mix(seed) ^ mix(epoch ^ 0xD1B54A32D192ED03), mix being splitmix64's output
 * function; a Fisher-Yates shuffle, i from n-1 down to 1, swaps i with j drawn uniformly from
 * [0, i] by Lemire's multiply-and-reject on the PRNG's high 32 bits. Thread-safe.
 * Requires 1 <= n <= RG_DATASET_MAX_RECORDS.
 */
void rg_sampler_permutation(uint64_t seed, uint64_t epoch, uint32_t *perm, size_t n);

/* ---- loader ---------------------------------------------------------------------------- */

/* The number of batches a loader prepares ahead of the one the caller holds. */
#define RG_LOADER_DEPTH 3
/* rg_loader_next()'s default timeout (RG_DEADLINE_DEFAULT). */
#define RG_LOADER_DEFAULT_TIMEOUT_MS 60000

/* One rank's share of one global step, owned by the loader. */
typedef struct {
    const uint32_t  *ids;          /* count sample ids */
    const float     *inputs;       /* count * record_size floats: each byte / 255 */
    const uint8_t   *labels;       /* count labels */
    size_t           count;        /* this rank's share; may be 0 in a short last batch */
    size_t           record_size;  /* floats per sample in inputs */
    uint32_t         global_count; /* records in the whole global batch of this step */
    rg_data_cursor_t cursor;       /* the step this batch belongs to */
    rg_data_cursor_t next;         /* the cursor after this batch: save this in a checkpoint */
} rg_batch_t;

typedef struct rg_loader rg_loader_t;

/*
 * Starts a loader for rank of world from *cursor: a background thread computes the ids of
 * each following global step, copies the records as floats and queues up to RG_LOADER_DEPTH
 * batches. ds must outlive the loader; params->num_samples must equal rg_dataset_size(ds).
 * To change the world size, destroy the loader and create a new one from the `next` cursor
 * of the last batch used. Returns RG_EINVAL, RG_ENOMEM, RG_ESYS (thread creation).
 */
rg_status_t rg_loader_create(const rg_dataset_t *ds, const rg_sampler_params_t *params,
                             uint32_t rank, uint32_t world, const rg_data_cursor_t *cursor,
                             rg_loader_t **loader_p) RG_DATA_NODISCARD;

/*
 * Waits, until the deadline (see <regroup/deadline.h>; default: RG_LOADER_DEFAULT_TIMEOUT_MS;
 * RG_DEADLINE_POLL takes a batch only if one is ready), for the next batch and sets *batch_p.
 * The batch stays valid until the next call of rg_loader_next() or rg_loader_destroy();
 * calling rg_loader_next() hands the previous batch's memory back to the loader. The stream
 * does not end: epochs follow one another. Returns RG_ETIMEDOUT (the batch is not lost: the
 * next call returns it), or the error that stopped the background thread. Call it from one
 * thread at a time (the loader's owner).
 */
rg_status_t rg_loader_next(rg_loader_t *loader, rg_deadline_t deadline,
                           const rg_batch_t **batch_p) RG_DATA_NODISCARD;

/* Stops the background thread (waiting for at most one batch being prepared), frees all. */
void rg_loader_destroy(rg_loader_t *loader); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
