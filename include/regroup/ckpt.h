/*
 * regroup checkpoints: sharded, asynchronous, verified.
 *
 * A checkpoint is a directory <root>/step-<N>/ holding one shard file per rank
 * (shard-<rank>.rgs), one small durable record per shard (shard-<rank>.rec: size and
 * checksum) and, once committed, a MANIFEST. The format is in docs/checkpoint-format.md.
 *
 * Saving: rg_ckpt_save() copies the tensors into the checkpointer's staging buffer (allocated
 * once, kept) and returns a handle; background threads cut the data into chunks, compress
 * each chunk as an independent zstd frame, write the shard, fsync it, rename it into place and
 * write the record. Rank 0 then waits (with a deadline) until all world_size records exist,
 * writes the MANIFEST atomically, records the step in etcd (if a client was given), removes
 * uncommitted leftovers of older steps and applies retention. Only then does rank 0's handle
 * complete; the other ranks' handles complete once their own shard and record are durable.
 *
 * Loading: rg_ckpt_load() reads the newest committed checkpoint (or a given step), verifies
 * every chunk it reads, and falls back to the next older committed checkpoint when a shard is
 * missing or corrupt (logged by name). Tensors are sharded along their first dimension into
 * contiguous row ranges; a request names a row range, and only the chunks that overlap it are
 * read, so loading at another world size reshards.
 *
 * Threads: an rg_ckpt_t is used by one thread at a time (its training loop); its background
 * threads are internal. A reader is used by one thread at a time; different readers and the
 * listing functions may run on any threads. A save handle may be waited on from any thread.
 */
#ifndef REGROUP_CKPT_H
#define REGROUP_CKPT_H

#include <regroup/deadline.h>
#include <regroup/dtype.h>
#include <regroup/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RG_CKPT_NODISCARD __attribute__((warn_unused_result))

#define RG_CKPT_MAX_DIMS    8
#define RG_CKPT_MAX_NAME    255      /* bytes in a tensor name */
#define RG_CKPT_MAX_WORLD   65536

typedef struct rg_etcd rg_etcd_t;   /* see etcd.h */

typedef struct rg_ckpt rg_ckpt_t;
typedef struct rg_ckpt_save rg_ckpt_save_t;

typedef struct {
    const char *root;          /* checkpoint root directory; created if missing. Required. */
    int         rank;          /* this rank, 0..world_size-1 */
    int         world_size;    /* ranks writing each checkpoint, 1..RG_CKPT_MAX_WORLD */
    size_t      staging_bytes; /* staging buffer allocated (and touched) at create;
                                  0 = allocate at the first save. It grows if a save needs
                                  more, and is kept until destroy. */
    int         threads;       /* compression threads; 0 = 2 */
    size_t      chunk_bytes;   /* uncompressed bytes per chunk; 0 = 4 MiB */
    int         level;         /* zstd level; 0 = 1 */
    unsigned    keep_last;     /* retention: keep the newest K committed steps; 0 = all */
    uint64_t    keep_every;    /* retention: also keep steps that are multiples of M; 0 = no */
    int64_t     commit_timeout_ms; /* rank 0's wait for all shard records; 0 = 120000 */
    int64_t     busy_timeout_ms;   /* how long rg_ckpt_save waits for the save in flight,
                                      and rg_ckpt_save_wait's default; 0 = 600000 */
    uint64_t    attempt;       /* tag of this run of the job, the same on every rank (the
                                  worker API uses the round + 1): a commit counts only shard
                                  records with this tag, never a leftover of an earlier
                                  attempt at the same step. 0 = untagged, any record counts */
    rg_etcd_t  *etcd;          /* optional (NULL = files only): not owned, must outlive */
    const char *job;           /* job id for the etcd key /regroup/<job>/ckpt/latest */
    /* Fencing (with etcd; docs/etcd-keys.md): when fence_agent is set, a commit writes its
     * MANIFEST and workers/ckpt/latest only while the job's round is still fence_round and the node
     * key of fence_agent in it holds fence_lease; otherwise the commit fails with RG_ELEASE
     * and the step is not committed. NULL: unfenced. The worker API sets these from the
     * environment its agent gives it. */
    const char *fence_agent;
    int64_t     fence_lease;
    int         fence_round;
} rg_ckpt_params_t;

/* Tensor flags. */
#define RG_CKPT_SHUFFLE     0x1u  /* byte-shuffle before compression */
#define RG_CKPT_NOSHUFFLE   0x2u  /* never shuffle (default: shuffle floating point types) */
#define RG_CKPT_REPLICATED  0x4u  /* the whole tensor, saved by this rank alone (row_begin
                                     must be 0 and row_count shape[0]) */

typedef struct {
    const char *name;          /* unique within a save, 1..RG_CKPT_MAX_NAME bytes */
    rg_dtype_t  dtype;
    int         ndim;          /* 1..RG_CKPT_MAX_DIMS */
    uint64_t    shape[RG_CKPT_MAX_DIMS]; /* the global shape */
    uint64_t    row_begin;     /* the rows of dim 0 this rank owns: [row_begin, +row_count) */
    uint64_t    row_count;
    const void *data;          /* row_count * (product of shape[1..]) elements, row-major */
    unsigned    flags;         /* RG_CKPT_* above */
} rg_ckpt_tensor_t;

/* Save flags. */
#define RG_CKPT_SAVE_SKIP_IF_BUSY 0x1u /* return RG_EAGAIN instead of waiting for the last save */

/* Creates a checkpointer for one rank; starts its background threads. Blocks while it
 * allocates and touches the staging buffer. Free with rg_ckpt_destroy. */
rg_status_t rg_ckpt_create(const rg_ckpt_params_t *params, rg_ckpt_t **ckpt_p)
    RG_CKPT_NODISCARD;

/* Waits for a save in flight to finish (it ends by its commit deadline or an I/O error;
 * a file system that hangs hangs this too), stops the threads, frees everything. Handles
 * still held stay valid until released. Accepts NULL. */
void rg_ckpt_destroy(rg_ckpt_t *ckpt);

/*
 * Starts saving step `step` (>= 0) of this rank's tensors. If a save is still in flight it
 * first waits for it, up to busy_timeout_ms (then RG_ETIMEDOUT), or with
 * RG_CKPT_SAVE_SKIP_IF_BUSY returns RG_EAGAIN at once. Copies the tensors into the staging
 * buffer (growing it if needed), so the caller may change them as soon as this returns.
 * A step commits only if every rank 0..world_size-1 saves it: rank 0's save waits, up to
 * commit_timeout_ms, for every rank's shard record; this call does not wait for the others.
 * On success *save_p is a handle the caller releases with rg_ckpt_save_release.
 * Errors: RG_EINVAL (bad tensor description), RG_EEXIST (step already committed), RG_ENOMEM,
 * RG_EAGAIN, RG_ETIMEDOUT, file-system errors.
 */
rg_status_t rg_ckpt_save(rg_ckpt_t *ckpt, int64_t step, const rg_ckpt_tensor_t *tensors,
                         size_t n_tensors, unsigned flags, rg_ckpt_save_t **save_p)
    RG_CKPT_NODISCARD;

/* RG_INPROGRESS while the save runs, then its final status. Does not block. */
rg_status_t rg_ckpt_save_status(rg_ckpt_save_t *save);

/* Waits until the save is done or the deadline passes (see <regroup/deadline.h>; default:
 * the checkpointer's busy_timeout_ms; RG_DEADLINE_POLL only looks, as rg_ckpt_save_status).
 * Returns the save's status (RG_OK: durable, and for rank 0 committed), RG_ETIMEDOUT if still
 * running, or the error that ended it (RG_ENOSPC, RG_EPERM, RG_EIO, RG_ETIMEDOUT from the
 * commit wait...); the message is in rg_last_error() of the calling thread. */
rg_status_t rg_ckpt_save_wait(rg_ckpt_save_t *save, rg_deadline_t deadline) RG_CKPT_NODISCARD;

/* The error message of a failed save (owned by the handle), "" otherwise. */
const char *rg_ckpt_save_error(rg_ckpt_save_t *save);

/* Drops the caller's reference; the save itself runs on. Accepts NULL. */
void rg_ckpt_save_release(rg_ckpt_save_t *save);

/* ---- committed checkpoints ------------------------------------------------------------- */

/* Lists the committed steps under root (those with a MANIFEST), newest first.
 * *steps_p is malloc'd (caller frees); *n_p may be 0. Does not verify the shards. Blocks on
 * the directory listing. */
rg_status_t rg_ckpt_list(const char *root, int64_t **steps_p, size_t *n_p) RG_CKPT_NODISCARD;

/* Removes step directories without a MANIFEST (uncommitted leftovers) and stray temp files.
 * Call it only while no rank is saving (e.g. before workers start). *removed_p may be NULL.
 * Blocks on disk. */
rg_status_t rg_ckpt_cleanup(const char *root, size_t *removed_p) RG_CKPT_NODISCARD;

/* Removes step `step` (committed or not): its MANIFEST first, durably, so that it stops
 * existing before its files go. For a step that cannot be restored, so that the step can be
 * saved again. Errors: RG_EINVAL, file-system errors. Blocks on disk. */
rg_status_t rg_ckpt_remove(const char *root, int64_t step) RG_CKPT_NODISCARD;

/* ---- loading --------------------------------------------------------------------------- */

typedef struct rg_ckpt_reader rg_ckpt_reader_t;

typedef struct {
    rg_dtype_t dtype;
    int        ndim;
    uint64_t   shape[RG_CKPT_MAX_DIMS];
    bool       replicated;
} rg_ckpt_tensor_info_t;

/* Opens committed step `step` for reading: parses the MANIFEST and every shard's index and
 * checks them against each other (size, checksum, step, rank). Blocks on disk. RG_ENOENT: no
 * such committed step; RG_ECORRUPT: a shard is missing, truncated or does not match (named
 * in the message). Free with rg_ckpt_reader_close. */
rg_status_t rg_ckpt_reader_open(const char *root, int64_t step, rg_ckpt_reader_t **reader_p)
    RG_CKPT_NODISCARD;
void    rg_ckpt_reader_close(rg_ckpt_reader_t *reader);  /* accepts NULL */
int64_t rg_ckpt_reader_step(const rg_ckpt_reader_t *reader);  /* never blocks */
/* Dtype and global shape of a tensor; RG_ENOENT if the checkpoint has none by that name.
 * Never blocks (the index is read at open). */
rg_status_t rg_ckpt_reader_info(const rg_ckpt_reader_t *reader, const char *name,
                                rg_ckpt_tensor_info_t *info) RG_CKPT_NODISCARD;

typedef struct {
    const char *name;
    rg_dtype_t  dtype;         /* must match the saved dtype */
    uint64_t    row_begin;     /* rows of dim 0 wanted: [row_begin, +row_count) */
    uint64_t    row_count;
    void       *dst;           /* row_count rows, row-major */
    size_t      dst_bytes;     /* must equal the size of those rows */
} rg_ckpt_request_t;

/* Reads the requested rows of one tensor, verifying every chunk read; chunks are decoded on
 * the calling thread and one helper thread. Blocks on disk. Not for concurrent use of one
 * reader. RG_ECORRUPT: a chunk failed its checksum or the rows are not all in the
 * checkpoint (the message names the file and tensor); RG_EINVAL: the request does not fit
 * the saved tensor (dtype, rows, dst_bytes); RG_ENOENT: no such tensor. */
rg_status_t rg_ckpt_reader_read(rg_ckpt_reader_t *reader, const rg_ckpt_request_t *req)
    RG_CKPT_NODISCARD;

/*
 * Loads the requests from committed step `step` (that step only: its error is returned), or
 * with step < 0 from the newest committed checkpoint, falling back to older ones while one
 * is missing, unreadable or corrupt (RG_ENOENT, RG_EIO, RG_ECORRUPT; each failure is logged
 * as a warning naming the step and file). *step_p (may be NULL) gets the step loaded. The
 * dst buffers may be written even when it fails. RG_ENOENT: no committed checkpoint (or not
 * that step). This rank alone: no other rank takes part. Blocks on disk.
 */
rg_status_t rg_ckpt_load(const char *root, int64_t step, const rg_ckpt_request_t *reqs,
                         size_t n_reqs, int64_t *step_p) RG_CKPT_NODISCARD;

/* Reads every chunk of every shard of a committed step and checks every checksum.
 * RG_OK, RG_ENOENT (no such committed step), or RG_ECORRUPT naming the first bad file.
 * Blocks on disk. */
rg_status_t rg_ckpt_verify(const char *root, int64_t step) RG_CKPT_NODISCARD;

#ifdef __cplusplus
}
#endif
#endif
