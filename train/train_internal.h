/*
 * The worker API's context, shared by its files: train_ctx.c (the context, reports,
 * checkpoints, restore) and train_regroup.c (in-place recovery).
 */
#ifndef REGROUP_TRAIN_INTERNAL_H
#define REGROUP_TRAIN_INTERNAL_H

#include "rdzv_keys.h"
#include "rg_common.h"
#include "rg_notice.h"

#include <regroup/etcd.h>
#include <regroup/train.h>

#define TRAIN_RETIRED_MAX 4   /* old checkpointers kept while their last save finishes */

struct rg_train_ctx {
    int              rank;
    int              world;
    int              local_rank;
    int              local_size;
    int              round;
    int              restart_count;
    char             job[128];
    rdzv_keys_t      keys;           /* the job's etcd keys: progress, restored */
    char             ckpt_root[1024];
    rg_etcd_t       *etcd;
    rg_comm_t       *comm;
    rg_ckpt_t       *ckpt;
    rg_ckpt_save_t  *save;           /* the checkpoint in flight, if any */
    int64_t          save_step;
    uint64_t         last_progress_ns;
    rg_notice_view_t notice;         /* the agent's page; page NULL when not under regroup */
    rg_notice_t      agreed;         /* what the last rg_report agreed on */
    uint64_t         agreed_ns;      /* when */
    /* in place (train_regroup.c) */
    bool             in_place;       /* params.in_place under `regroup --recovery=in-place` */
    bool             joining;        /* a replacement, in no round yet */
    bool             said_ready;     /* it told its agent it is ready */
    int64_t          comm_timeout_ms;/* the group's, for the groups regroup makes */
    unsigned         keep_last;      /* the checkpointer's, for the one regroup makes */
    int              commit_ms;
    size_t           staging_bytes;
    /* checkpoints in flight when the group changed: they finish (or fail, when they wait for
     * a dead peer's shard: never committed, never visible) in the background with their
     * old checkpointer, which is destroyed once they have */
    struct {
        rg_ckpt_t      *ckpt;
        rg_ckpt_save_t *save;
        int64_t         step;
        bool            doomed;
    } retired[TRAIN_RETIRED_MAX];
    int              n_retired;
};

/* train_ctx.c: makes the checkpointer for the context's rank and world (none without a
 * checkpoint root). */
rg_status_t train_ckpt_open(rg_train_ctx_t *ctx) RG_NODISCARD;
/* train_regroup.c: releases the retired checkpoints that have ended (logging a failure);
 * with wait_ms > 0, waits up to that long for the others first, then abandons them to the
 * process's exit (their threads keep their memory). */
void train_retired_reap(rg_train_ctx_t *ctx, int64_t wait_ms);
/* train_ctx.c: waits for the checkpoint in flight; its result. */
rg_status_t train_finish_save(rg_train_ctx_t *ctx);

#endif
