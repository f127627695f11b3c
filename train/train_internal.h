/*
 * The worker API's context, shared by its files: train_ctx.c (the context, reports,
 * the asynchronous checkpoints, restoring), train_leave.c (the last checkpoint before a node
 * leaves) and train_regroup.c (in-place recovery). A context belongs to one thread, as
 * <regroup/train.h> says.
 */
#ifndef REGROUP_TRAIN_INTERNAL_H
#define REGROUP_TRAIN_INTERNAL_H

#include "rdzv_fence.h"
#include "rdzv_keys.h"
#include "rg_beat.h"
#include "rg_common.h"
#include "rg_notice.h"

#include <regroup/etcd.h>
#include <regroup/train.h>

#define TRAIN_RETIRED_MAX 4   /* old checkpointers kept while their last save finishes */

/* train_straggler.c: this rank's compute share of the step, and the group's stragglers. */
typedef struct {
    double     factor;         /* slow: share over factor x the others' median */
    int64_t    window_ms;      /* slow this long: the node is asked to leave (evict) */
    bool       evict;
    int        round;          /* the figures are of this round's group */
    const void *comm;          /*   and of this group (its wait counter) */
    uint64_t   prev_ns;        /* the last step boundary, 0: none yet in this group */
    uint64_t   prev_wait_ns;   /* rg_comm_wait_ns then */
    uint64_t   step_ns;        /* since the last exchange: the steps' time */
    uint64_t   busy_ns;        /*   and the part of it outside the group's operations */
    uint64_t   tick_ns;        /* the last exchange (rank 0's decides when the next is) */
    double     share;          /* at the last exchange: busy / step, smoothed; -1 unknown */
    double     ratio;          /*   over the others' median, -1 unknown */
    double     slow_s;         /*   seconds this rank has been slow, 0 not slow */
    /* every rank's, at the last exchange (one allocation of n_ranks of each) */
    int        n_ranks;
    void      *buf;
    double    *shares;
    double    *sorted;         /*   the known smoothed shares, in order */
    double    *smooth;         /*   the shares smoothed over the exchanges, -1 unknown */
    double    *slow_for;       /*   seconds slow (this rank's clock) */
    uint32_t  *streak;         /*   exchanges slow in a row */
    bool       asked;          /* a rank of this group was asked out: no other */
    uint64_t   logged_ns;      /* rank 0's last straggler line, and its rank */
    int        logged_rank;
} train_straggler_t;

/* Reads the agent's settings ($REGROUP_STRAGGLER_*). */
void train_straggler_init(train_straggler_t *s);
void train_straggler_cleanup(train_straggler_t *s);
/* At each step boundary, before the agreement: adds the step since the last one; true on
 * rank 0 when an exchange is due (the agreement carries that to every rank). */
bool train_straggler_sample(rg_train_ctx_t *ctx);
/* Collective (when the agreement said so): the exchange, the log line, the eviction. The
 * group's errors, RG_ENOMEM. */
rg_status_t train_straggler_exchange(rg_train_ctx_t *ctx) RG_NODISCARD;

/* train_health.c: collective, on a group that has not trained yet (`when` says which, for
 * the log), under --health-check (REGROUP_HEALTH_CHECK): measures the ranks' links and a small
 * allreduce, names the ranks far below the others, and with evict asks the agent of the worst
 * to take its node out of the job. RG_OK when off; the group's errors, RG_ENOMEM. */
rg_status_t train_health_check(rg_train_ctx_t *ctx, const char *when) RG_NODISCARD;

/* train_stats.c: qsort's comparison of doubles, ascending; and the median of sorted[0..n)
 * (n >= 2) without one element equal to v, which is in it. */
int train_cmp_double(const void *a, const void *b);
double train_median_without(const double *sorted, size_t n, double v);

/* train_progress.c: the thread that writes the worker's progress records. */
typedef struct train_progress train_progress_t;

struct rg_train_ctx {
    int              rank;
    int              world;
    int              local_rank;
    int              local_size;
    int              round;
    int              restart_count;
    char             job[128];
    rdzv_keys_t      keys;           /* the job's etcd keys: progress, restored */
    rdzv_fence_t     fence;          /* what every write to them is conditional on */
    train_progress_t *progress;      /* writes the progress records (train_progress.c) */
    char             ckpt_root[1024];
    rg_etcd_t       *etcd;
    rg_comm_t       *comm;
    rg_ckpt_t       *ckpt;
    rg_ckpt_save_t  *save;           /* the checkpoint in flight, if any */
    int64_t          save_step;      /* of the save in flight, or of the last one started */
    bool             save_committed; /* save_step was found committed already (RG_EEXIST) */
    uint64_t         last_progress_ns;
    rg_notice_view_t notice;         /* the agent's page; page NULL when not under regroup */
    rg_beat_worker_t *beat;          /* this worker's heartbeat to its agent, or NULL */
    rg_notice_t      agreed;         /* what the last rg_report agreed on */
    uint64_t         agreed_ns;      /* when */
    /* in place (train_regroup.c) */
    bool             in_place;       /* params.in_place under `regroup --recovery=in-place` */
    bool             joining;        /* a newcomer, in no round yet */
    bool             replacement;    /*   of a dead worker ($REGROUP_INPLACE_REPLACEMENT), not
                                      *   one of a node that joins */
    bool             said_ready;     /* it told its agent it is ready */
    rg_comm_spare_t *spare;          /* a UCX worker made for the next regroup's group */
    unsigned char   *regroup_extra;  /* the last regroup's extra bytes received (its
                                      * rg_train_regroup_t.extra), or NULL */
    int              join_wait_ms;   /* a newcomer: how long its agent may take to let it in
                                      * ($REGROUP_INPLACE_JOIN_TIMEOUT_MS; 0: not said) */
    int              fenced_round;   /* a write of this round was fenced while the agent
                                      * lives: the job moved on, a regroup is due; or -1 */
    int64_t          comm_timeout_ms;/* the group's, for the groups regroup makes */
    int              group_round;    /* the round and world of the group being made or in */
    int              group_world;    /*   use, for train_group_watch */
    bool             group_wiring;   /* a regroup's group is being made (its wire-up) */
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
    bool             table_made;     /* rg_train_table_create was called (one per worker) */
    train_straggler_t straggler;     /* train_straggler.c */
};

/* train_progress.c. Starts the thread, with an etcd client of params of its own. */
rg_status_t train_progress_start(const rg_etcd_params_t *params, train_progress_t **p)
    RG_NODISCARD;
/* Hands the thread the record val for key, fenced by fence: it replaces one not written yet.
 * Never waits on etcd (only on the thread's lock for a copy). */
void train_progress_post(train_progress_t *p, const rdzv_fence_t *fence, const char *key,
                         const char *val);
/* Waits until the last record handed over is written: RG_OK, RG_ELEASE (the fence refused
 * it), or RG_ETIMEDOUT (the thread did not get it written in twice the client's timeout
 * and a second). Another etcd failure is RG_OK: progress is informational (warned). */
rg_status_t train_progress_wait(train_progress_t *p) RG_NODISCARD;
/* The newest round a record of which the fence refused (the job had left it), or -1. */
int  train_progress_fenced(train_progress_t *p);
/* Writes what is pending (bounded by the client's timeout), ends the thread, frees p.
 * Accepts NULL. */
void train_progress_stop(train_progress_t *p);

/* train_regroup.c: sets params' abandon hook for the group of `round` at `world` in an
 * in-place job: the group is given up once the agent assigns this worker a newer round of
 * fewer ranks (a member is lost: the collectives would wait for it until UCX's keepalive
 * says so). */
void train_group_watch(rg_train_ctx_t *ctx, int round, int world, rg_comm_params_t *params);
/* In place: starts making the UCX worker of the next regroup's group in the background
 * (ctx->spare), unless one is made or being made. Never fails: without it the group makes
 * its own worker, as a creation does. */
void train_spare_start(rg_train_ctx_t *ctx);
/* Waits for the checkpoint in flight until deadline and releases it: its result. With a
 * deadline of the caller's (not RG_DEADLINE_DEFAULT), RG_ETIMEDOUT with the save still
 * running keeps it in flight (ctx->save stays). */
rg_status_t train_save_finish(rg_train_ctx_t *ctx, rg_deadline_t deadline) RG_NODISCARD;
/* Starts the asynchronous checkpoint of state at step (no save may be in flight): rank 0 adds
 * the data cursor. A step already committed is RG_OK with no save (save_committed). */
rg_status_t train_save_start(rg_train_ctx_t *ctx, int64_t step, const rg_train_state_t *state)
    RG_NODISCARD;
/* train_ctx.c: makes the checkpointer for the context's rank and world (none without a
 * checkpoint root). */
rg_status_t train_ckpt_open(rg_train_ctx_t *ctx) RG_NODISCARD;
/* train_regroup.c: releases the retired checkpoints that have ended (logging a failure);
 * with wait_ms > 0, waits up to that long for the others first, then abandons them to the
 * process's exit (their threads keep their memory). */
void train_retired_reap(rg_train_ctx_t *ctx, int64_t wait_ms);
/* Waits up to wait_ms for an earlier group's checkpoint of this step (one that no dead peer
 * holds up), then reaps: a new save of the same step must not write its directory beside
 * it, and finds it committed (RG_EEXIST) if it was. */
void train_retired_wait_step(rg_train_ctx_t *ctx, int64_t step, int64_t wait_ms);

/* train_table.c: the sharded table's part of a regroup (in the new group, on every member).
 * find: the members say what rows they hold (an allgather); *step_p gets the newest of
 * steps[] (each member's replicated step) at which every row is held (RG_ENOENT: none), and
 * *view_p what is needed to move them. move: the rows of this rank's new layout into the
 * view (tagged sends and receives): *from_buddy_p of them came from buddy copies,
 * *from_node_p from node copies, and *from_others_p of all those were sent by other members
 * (the rest copied in this member's memory). adopt: the moved rows become the table's (with
 * the replicated state: no failure between). settle: frees the view, then a barrier (no
 * member reads a node copy any more) and the commit of the new layout at the view's step. */
typedef struct train_table_view train_table_view_t;
rg_status_t train_table_find(rg_train_ctx_t *ctx, rg_train_table_t *t, const int64_t *steps,
                             int64_t *step_p, train_table_view_t **view_p) RG_NODISCARD;
rg_status_t train_table_move(rg_train_ctx_t *ctx, rg_train_table_t *t, train_table_view_t *v,
                             size_t *from_others_p, size_t *from_buddy_p,
                             size_t *from_node_p) RG_NODISCARD;
void        train_table_adopt(rg_train_ctx_t *ctx, rg_train_table_t *t,
                              train_table_view_t *v);
rg_status_t train_table_settle(rg_train_ctx_t *ctx, rg_train_table_t *t,
                               train_table_view_t *v) RG_NODISCARD;
void        train_table_view_free(train_table_view_t *v);   /* accepts NULL */

#endif
