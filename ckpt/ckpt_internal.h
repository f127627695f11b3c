/*
 * ckpt/ internals shared by the saver (ckpt_save.c), the shard writer (ckpt_write.c) and the
 * commit (ckpt_commit.c).
 *
 * Threads: the caller's thread fills a job under `mu` and sets job_ready; the coordinator
 * thread runs the job (ckpt_save_run: write, fsync, record, commit); the workers compress
 * chunks. `mu` guards every field below marked (mu); a chunk's results are written by the
 * worker that claimed it before it sets `done` under `mu`, and read by the coordinator after.
 */
#ifndef RG_CKPT_INTERNAL_H
#define RG_CKPT_INTERNAL_H

#include "ckpt_format.h"

#include <pthread.h>
#include <stdatomic.h>

struct rg_ckpt_save {
    pthread_mutex_t mu;
    pthread_cond_t  cv;            /* CLOCK_MONOTONIC */
    atomic_int      refs;
    rg_status_t     status;        /* (mu) RG_INPROGRESS until done */
    char            err[1024];     /* (mu) */
    int64_t         step;
    int64_t         wait_ms;       /* rg_ckpt_save_wait's default: the busy_timeout_ms */
};

typedef struct {
    size_t         tensor;
    const uint8_t *src;            /* in the staging buffer */
    uint32_t       raw_size;
    bool           done;           /* (mu) */
    rg_status_t    st;
    uint32_t       comp_size;
    uint32_t       crc;
    size_t         slot;
} save_chunk_t;

struct rg_ckpt {
    char       *root;
    char       *job;
    int         rank;
    int         world_size;
    int         n_threads;
    size_t      chunk_bytes;
    int         level;
    unsigned    keep_last;
    uint64_t    keep_every;
    int64_t     commit_timeout_ms;
    int64_t     busy_timeout_ms;
    uint64_t    attempt;
    rg_etcd_t  *etcd;
    char       *fence_agent;       /* NULL: unfenced (rg_ckpt_params_t) */
    int64_t     fence_lease;
    int         fence_round;

    uint8_t    *staging;
    size_t      staging_cap;
    uint8_t   **slots;             /* n_slots compressed-chunk buffers of slot_cap bytes */
    size_t      n_slots;
    size_t      slot_cap;

    pthread_mutex_t mu;
    pthread_cond_t  work_cv;       /* to the coordinator and workers */
    pthread_cond_t  done_cv;       /* chunk done, save done; CLOCK_MONOTONIC */
    pthread_t       coord;
    pthread_t      *workers;
    int             n_started;
    bool            coord_started;
    bool            stop;          /* (mu) */

    /* the job (mu) */
    bool                busy;
    bool                job_ready;
    bool                compressing;
    bool                abort;
    int64_t             step;
    ckpt_tensor_meta_t *tensors;
    size_t              n_tensors;
    save_chunk_t       *chunks;
    size_t              n_chunks;
    size_t              next_claim;
    size_t              next_write;
    size_t              inflight;
    rg_ckpt_save_t     *cur;
};

/* Runs the job on the coordinator thread: writes the shard and its record, and on rank 0
 * commits. */
rg_status_t ckpt_save_run(rg_ckpt_t *ck);

typedef struct {
    const char *root;
    const char *dir;               /* root/step-N */
    int64_t     step;
    uint32_t    world_size;
    int64_t     timeout_ms;
    rg_etcd_t  *etcd;
    const char *job;
    unsigned    keep_last;
    uint64_t    keep_every;
    uint64_t    attempt;       /* only records with this tag count (0: any) */
    const char *fence_agent;   /* with etcd: the commit's fence (NULL: none) */
    int64_t     fence_lease;
    int         fence_round;
} ckpt_commit_args_t;

/* Waits for every shard record, writes the MANIFEST, records the step in etcd, removes
 * uncommitted older steps and applies retention. */
rg_status_t ckpt_commit(const ckpt_commit_args_t *a);

/* The commit's etcd part (ckpt_etcd.c), both under the args' fence: whether the writer may
 * commit at all (before the MANIFEST; RG_ELEASE if fenced), and recording the committed
 * step at workers/ckpt/latest. */
rg_status_t ckpt_etcd_fence_check(const ckpt_commit_args_t *a);
rg_status_t ckpt_etcd_record(const ckpt_commit_args_t *a);

#endif
