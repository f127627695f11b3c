/*
 * regroup worker API: what a training program calls (the shape of Ray Train's, in C).
 *
 *   rg_train_ctx_t *ctx;
 *   rg_train_init(NULL, &ctx);                     // from the launcher's environment
 *   if (rg_get_checkpoint(ctx, &step) == RG_OK)     // resume: reshards if the world changed
 *       rg_train_restore(ctx, step, reqs, n, &cursor);
 *   for (...) {
 *       ... compute gradients ...
 *       rg_comm_allreduce(rg_train_comm(ctx), ...); // average them
 *       ... apply the update ...
 *       rg_report(ctx, &report, every_k ? &state : NULL);  // progress; async checkpoint
 *   }
 *   rg_train_finalize(ctx);                         // waits for the last checkpoint
 *
 * In place (`regroup --recovery=in-place`, params.in_place): the program keeps its state in
 * memory through failures. When a collective returns RG_EPEER (a peer died) or rg_report
 * returns RG_EMEMBERS (a planned change), it calls rg_train_regroup, which puts it in the
 * next round with the state every member agrees on, and goes on from the step it returns.
 * A replacement worker (rg_train_joining) calls rg_train_regroup once it is ready, instead of
 * restoring a checkpoint: it receives the state from a survivor.
 *
 * A context belongs to one thread. Every call documents whether it blocks. A call marked
 * "collective" must be made by every rank of the round, in the same order (it communicates
 * with the other ranks through the context's group, or cannot complete without them); a rank
 * that skips one leaves the others waiting until a deadline.
 */
#ifndef REGROUP_TRAIN_H
#define REGROUP_TRAIN_H

#include <regroup/ckpt.h>
#include <regroup/comm.h>
#include <regroup/data.h>
#include <regroup/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RG_TRAIN_NODISCARD __attribute__((warn_unused_result))
#define RG_TRAIN_MAX_METRICS 32

typedef struct rg_train_ctx rg_train_ctx_t;

typedef struct {
    const char *ckpt_root;       /* checkpoint root; NULL = $REGROUP_CKPT_DIR, or none */
    unsigned    keep_last;       /* checkpoints kept; 0 = $REGROUP_CKPT_KEEP or 3 */
    int64_t     comm_timeout_ms; /* the group's timeout_ms (each communication operation's
                                    default); 0 = $REGROUP_COMM_TIMEOUT_MS or 30000 */
    size_t      staging_bytes;   /* checkpoint staging buffer to allocate up front; 0 = lazy */
    bool        in_place;        /* the program regroups in place (rg_train_regroup on
                                    RG_EPEER and RG_EMEMBERS): under `regroup
                                    --recovery=in-place` its agent then keeps it alive
                                    through failures; without it (or in restart mode) a
                                    failure restarts the job */
} rg_train_params_t;

/*
 * Collective. Builds the context from the launcher's environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, REGROUP_ETCD_ENDPOINTS,
 * REGROUP_JOB_ID, REGROUP_ROUND and the optional etcd TLS and user variables of
 * rg_comm_env_read; REGROUP_COMM_TIMEOUT_MS, REGROUP_CKPT_DIR and REGROUP_CKPT_KEEP as in
 * rg_train_params_t; REGROUP_CKPT_COMMIT_TIMEOUT_MS, rank 0's wait for every rank's shard
 * before a commit, default 120000): makes an etcd client, creates the round's communication
 * group (blocks until every rank of the round has called this, or RG_ETIMEDOUT after the
 * group's default create_timeout_ms of 30 s), and opens a checkpointer on the checkpoint
 * root (creating the directory, allocating staging_bytes). Under the launcher it also reads
 * what its writes are fenced with (REGROUP_AGENT_ID, REGROUP_AGENT_LEASE: docs/etcd-keys.md)
 * and starts a thread that beats its agent's heartbeat page (REGROUP_BEAT_FD) every 100 ms,
 * by which the agent finds the worker hung once it stops running (hang_timeout). params may
 * be NULL. RG_EINVAL names a missing or malformed variable. On success the caller frees
 * *ctx_p with rg_train_finalize; on failure nothing is left to free.
 */
rg_status_t rg_train_init(const rg_train_params_t *params, rg_train_ctx_t **ctx_p)
    RG_TRAIN_NODISCARD;
/*
 * Waits for the checkpoint in flight (if any), then frees everything, the group included.
 * Not collective: each rank finalizes on its own (it tells its peers that it leaves, waiting
 * a fraction of a second for that). The wait for the checkpoint is the one rg_report does
 * (rank 0's includes the commit, bounded by REGROUP_CKPT_COMMIT_TIMEOUT_MS; a file system
 * that hangs hangs this too, as in rg_ckpt_destroy); a failure it finds is logged, as there
 * is no status to return it in. If a peer has failed (the group is
 * unhealthy), it waits at most 1 s and then abandons the checkpoint in flight, leaving the
 * context's memory and the checkpoint's threads to the process's exit (a checkpoint not
 * committed by then never becomes visible), so that the process can exit and the job
 * restart at once. Accepts NULL.
 */
void rg_train_finalize(rg_train_ctx_t *ctx);

/* The context's fixed facts; these accessors never block. */
int        rg_train_rank(const rg_train_ctx_t *ctx);
int        rg_train_world_size(const rg_train_ctx_t *ctx);
int        rg_train_local_rank(const rg_train_ctx_t *ctx);
int        rg_train_local_size(const rg_train_ctx_t *ctx);
int        rg_train_round(const rg_train_ctx_t *ctx);
int        rg_train_restart_count(const rg_train_ctx_t *ctx);
rg_comm_t *rg_train_comm(rg_train_ctx_t *ctx);          /* owned by the context */
const char *rg_train_ckpt_root(const rg_train_ctx_t *ctx); /* owned by the context; NULL if
                                                              none */

typedef struct {
    const char *name;
    double      value;
} rg_metric_t;

typedef struct {
    int64_t            step;
    int64_t            epoch;
    const rg_metric_t *metrics;
    size_t             n_metrics;   /* at most RG_TRAIN_MAX_METRICS */
} rg_report_t;

typedef struct {
    const rg_ckpt_tensor_t *tensors;  /* this rank's slices (or replicated tensors) */
    size_t                  n_tensors;
    rg_data_cursor_t        cursor;   /* where the data stream resumes */
} rg_train_state_t;

/*
 * Publishes progress at /regroup/<job>/status/progress/<rank> (where `regroup status` shows
 * it): one etcd put, bounded by the client's default timeout (5 s), at most twice a second
 * without state, at every call with state; a failed put is only logged, except a fenced
 * one: under the launcher every write of a worker (progress, the checkpoint commit and
 * workers/ckpt/latest, the restored record) is conditional in etcd on its agent still being a member
 * of the worker's round, and a refused one returns RG_ELEASE ("fenced: ... round N"); the
 * worker must stop. The caller keeps report and its metrics.
 *
 * With state (and a checkpoint root), also starts an asynchronous checkpoint of the state at
 * report->step: if the previous checkpoint is still being written it first waits for it
 * (rank 0: until it is committed; at most the checkpointer's default busy_timeout_ms, 10 min,
 * then RG_ETIMEDOUT), then copies the tensors into the staging buffer and
 * returns; compression, writes, fsync and the commit happen in the background. The caller
 * may change or free the tensors as soon as it returns. Rank 0 saves its state->cursor with
 * the checkpoint. A step an earlier attempt of the job already committed is not saved again
 * (RG_OK). Collective with state: every rank must report state at the same steps, since
 * rank 0 commits a checkpoint only once every rank's shard is durable (else the commit times
 * out and the checkpoint never exists); the call itself does not wait for the other ranks.
 *
 * A failed background checkpoint is logged when it is found, and returned by the next call
 * that finds it ended (with or without state; a call with state still starts its own save).
 *
 * The step boundary. Under the regroup launcher the call is collective, with or without
 * state: every rank calls it once per step, at the same steps. It first checks that this
 * worker's agent is still a live member of the job (a local read: RG_ELEASE once the agent
 * has not renewed its membership for a lease TTL, stopped, hung or cut from etcd; the
 * worker must stop, since the job goes on without its node). After the progress and the
 * checkpoint it agrees with the other ranks on the notices their agents posted (one
 * 40-byte allreduce, no etcd; about once a second it also carries the stragglers'
 * exchange, an allgather of each rank's compute share of the step: README "Stragglers"):
 * when some agent posted one, or (in place) assigned its
 * workers a newer round, every rank gets RG_EMEMBERS at the same step, and rg_train_notice
 * says which kinds and how much time is left. The progress record goes to etcd from a
 * thread of the worker's: the call never waits on etcd. The notice
 * stays until its agent clears it, so each call returns it again until then. In place, a
 * preemption that comes while some agent is already in a newer round is only a membership
 * change at first (the ranks regroup, then agree on the preemption in the new round, where
 * their last checkpoint can commit). Outside the
 * launcher (no notice page) the call is not collective without state, as before.
 *
 * Returns RG_EINVAL (bad report: more than RG_TRAIN_MAX_METRICS metrics, a name that is not
 * 1-64 characters of [A-Za-z0-9_.-], step < 0), RG_ELEASE, the checkpoint's failure or
 * rg_ckpt_save's errors (these before a notice), RG_EMEMBERS, or the agreement's group
 * errors (RG_EPEER, RG_ETIMEDOUT).
 */
rg_status_t rg_report(rg_train_ctx_t *ctx, const rg_report_t *report,
                      const rg_train_state_t *state) RG_TRAIN_NODISCARD;

/*
 * Not collective. Waits for the checkpoint that rg_report started, if one is in flight: this
 * rank's shard durable (rank 0: the checkpoint committed, bounded as in rg_report). RG_OK
 * when it landed or none was in flight; else its failure. In place, a commit that the fence
 * refused because the job moved to a newer round meanwhile (a replacement got ready, a node
 * joined or was lost) is RG_OK here and marks this rank's round: the next rg_report's
 * agreement then gives RG_EMEMBERS on every rank (or the group's error, a member having
 * died), and the checkpoint is to be taken again in the new round. The wait ends the same
 * way, without waiting for the commit, once this worker's agent is in a newer round: the
 * commit would be refused, or wait for a dead rank's shard until its deadline. For the end of a job in place: rg_report returns before the last
 * checkpoint commits, and a change that came after it would otherwise leave the job without
 * it (rg_train_finalize only logs such a failure).
 */
rg_status_t rg_train_ckpt_wait(rg_train_ctx_t *ctx) RG_TRAIN_NODISCARD;

/* What an agent can tell its workers, in rg_notice_t.kinds as (1u << kind). */
typedef enum {
    RG_NOTICE_NONE    = 0,
    RG_NOTICE_PREEMPT = 1,   /* a member leaves on purpose (a preemption, SIGTERM) */
    RG_NOTICE_MEMBERS = 2,   /* a planned membership change (a join, a ready replacement) */
} rg_notice_kind_t;

typedef struct {
    unsigned kinds;     /* bits (1u << rg_notice_kind_t) of what some rank's agent posted */
    unsigned own;       /* the bits this rank's own agent posted: RG_NOTICE_PREEMPT here means
                           this rank's node is the one that leaves (in an in-place job the
                           agents that stay post RG_NOTICE_MEMBERS for a leaving peer) */
    int64_t  ms_left;   /* the least time left over the ranks, now; -1: no deadline */
} rg_notice_t;

/* The notices the last rg_report agreed on: the same kinds on every rank (kinds 0 when
 * none); ms_left counts down from the agreement. Never blocks, not collective. RG_EINVAL on
 * NULL. */
rg_status_t rg_train_notice(const rg_train_ctx_t *ctx, rg_notice_t *notice) RG_TRAIN_NODISCARD;

/*
 * Collective. The last checkpoint before a preemption: after rg_report returned RG_EMEMBERS
 * with RG_NOTICE_PREEMPT among rg_train_notice's kinds (some node of the job leaves: a
 * cloud's preemption notice, or SIGTERM with the launcher's grace period), saves report->step
 * (the same step on every rank: rg_report agreed on it) and waits, within the notice's
 * ms_left, until rank 0 has committed it. If rg_report is already saving that step (it was
 * given state there), it only waits for that save; otherwise it saves state, which must then
 * be given. The ranks agree on the outcome before returning (one allreduce), so all return
 * the same: RG_OK, the step is committed and the program should exit 0 (a restart-mode job
 * resumes from this step, with no step lost); RG_ETIMEDOUT, too little time (the deadline had
 * passed, or the save did not finish before it): the checkpoint never becomes visible and the
 * job resumes from the previous one, and the program should exit too. Also RG_EINVAL (no
 * preemption notice, no state for a step not being saved), RG_ENOENT (no checkpoint root),
 * the checkpoint's errors, and the group's (RG_EPEER). Blocks up to ms_left (and a moment for
 * the agreement). The caller keeps report and state.
 */
rg_status_t rg_train_leave(rg_train_ctx_t *ctx, const rg_report_t *report,
                           const rg_train_state_t *state) RG_TRAIN_NODISCARD;

/* Collective. The newest committed checkpoint (one with a MANIFEST): rank 0 lists the
 * checkpoint root and broadcasts its step to every rank, so that all get the same *step_p.
 * Verifies nothing (rg_train_restore finds and skips a checkpoint that cannot be read).
 * Blocks on rank 0's directory listing and on the broadcast (the group's deadline).
 * RG_ENOENT: no committed checkpoint, or no checkpoint root (then without communicating);
 * the broadcast's errors (RG_EPEER, RG_ETIMEDOUT: the group is then unusable). */
rg_status_t rg_get_checkpoint(rg_train_ctx_t *ctx, int64_t *step_p) RG_TRAIN_NODISCARD;

/*
 * Collective, with the same `step` on every rank (the one rg_get_checkpoint gave). Reads the
 * given rows of each requested tensor from checkpoint `step`, verifying every chunk read, and
 * the data cursor saved with it into *cursor. The row ranges may differ from those saved
 * (resharding to a new world size). The ranks agree after each attempt (an allreduce): if any
 * rank could not read the step (any error, logged as a warning), all move together to the
 * next older committed step that rank 0 finds, at most 8 steps in all. On success rank 0
 * removes the committed steps newer than the one restored (not every rank could read them)
 * and records the restored step in etcd; *step_p (may be NULL) gets the step read. The
 * requests' dst buffers may be written even when the call fails. Blocks on disk and on the
 * group (its deadline for each agreement). RG_ENOENT: no checkpoint root; RG_ECORRUPT: no
 * step could be read by every rank; RG_EINVAL, RG_ENOMEM; the group's errors (RG_EPEER,
 * RG_ETIMEDOUT: the group is then unusable).
 */
rg_status_t rg_train_restore(rg_train_ctx_t *ctx, int64_t step, const rg_ckpt_request_t *reqs,
                             size_t n_reqs, rg_data_cursor_t *cursor, int64_t *step_p)
    RG_TRAIN_NODISCARD;

/* ---- in place ------------------------------------------------------------------------- */

/* Whether this worker recovers in place: params.in_place, under `regroup
 * --recovery=in-place`. Never blocks. */
bool rg_train_in_place(const rg_train_ctx_t *ctx);
/* Whether this worker is a replacement that is in no round yet: it must call
 * rg_train_regroup (to receive the state) before any collective. Never blocks. */
bool rg_train_joining(const rg_train_ctx_t *ctx);

/* One buffer of the replicated state: the same bytes on every rank at a step. */
typedef struct {
    void  *data;
    size_t bytes;
} rg_train_buf_t;

/*
 * The sharded state of an in-place job: a table of n_rows rows of row_bytes bytes each, split
 * by rows across the ranks as rg_sampler_share splits (rank r of W owns the rows from
 * r * (n_rows / W) + min(r, n_rows % W) on, n_rows / W of them and one more while r <
 * n_rows % W). Exactly one rank holds each row's live bytes (an optimizer's shard, a slice of
 * an embedding). So that a lost rank loses none, rg_train_table_commit keeps copies of each
 * rank's rows at the step committed: two in the memory of its buddy, a rank on another node
 * (the newest step and the one before, so that a commit cut short keeps a whole one; the
 * buddy is the rank at the largest node's size further on in the ranks' order by node; on one
 * node, or when one node holds more than half the ranks, a rank of the same node), and one in
 * a shared-memory segment that the rank's agent owns (a memfd, inherited by the node's
 * workers: it has no name in /dev/shm and is gone with the agent and its workers). Memory:
 * three extra copies of each rank's rows (its node copy, and the two buddy copies that its
 * buddy holds), and during rg_train_regroup one more transient buffer of a rank's new rows.
 * $REGROUP_TABLE_BUDDY_COPIES=1 (read at create; 1 or 2, default 2) keeps one buddy copy, two
 * extra copies in all: a commit then overwrites the only one, so a node lost while the ranks
 * exchange and agree (or a rank that is alone on its node) leaves some rows at no step a
 * member is at, and the job restarts from its disk checkpoint (6 of 20 node losses at random
 * moments in bench/rg-bench-scale.sh --scenario copies, 0 of 20 with two).
 *
 * Commit the rows at every step, after the step's update of the rows and BEFORE applying the
 * step's update to the replicated state: the step counts once the commit returned RG_OK (the
 * ranks agree on it inside). When the commit fails (RG_EPEER), the replicated state is still
 * that of the step before: give that step to rg_train_regroup. rg_train_regroup (given the
 * table) then finds every row at one step from the members' copies (never from the live
 * rows, which may have changed since the last commit): the newest step at which some
 * member's replicated state is and every row is held (in a buddy copy, or in a node copy of a
 * local rank, living or not), and moves each row to its owner in the new round, then commits
 * the new layout. Rows that no member holds at such a step (their owner and its buddy lost,
 * and its node copy with its node) make the regroup fail: the job restarts from its last disk
 * checkpoint, which should hold the table too (save each rank's rows as the rows of a
 * checkpoint tensor). The table's own transfers use the group's point-to-point tags from
 * 0xfffe0000 up: a program's own sends use lower ones.
 */
typedef struct rg_train_table rg_train_table_t;

/* Not collective. A table of n_rows (1 .. 2^32 - 1) rows of row_bytes (1 .. 2^30) bytes,
 * this rank's rows zeroed, laid out for the context's rank and world, with this worker's node
 * copy (under `regroup --recovery=in-place`; none otherwise). RG_EINVAL, RG_ENOMEM. */
rg_status_t rg_train_table_create(rg_train_ctx_t *ctx, uint64_t n_rows, size_t row_bytes,
                                  rg_train_table_t **table_p) RG_TRAIN_NODISCARD;
void        rg_train_table_destroy(rg_train_table_t *table);
/* This rank's live rows: *first_p and *count_p (may be NULL) get which; count * row_bytes
 * bytes the program reads and writes between regroups (NULL when it owns none). */
void       *rg_train_table_rows(rg_train_table_t *table, uint64_t *first_p, uint64_t *count_p);
uint64_t    rg_train_table_n_rows(const rg_train_table_t *table);
size_t      rg_train_table_row_bytes(const rg_train_table_t *table);

/* Collective, at the same step on every rank. Keeps this rank's live rows as those of `step`
 * in its buddy's memory and in its node copy: one send and one receive of about a shard, a
 * one-word allreduce (the agreement) and a memory copy; no etcd. A member that fails during
 * it leaves the copies it was writing invalid (never torn: each is marked valid only once
 * whole), and the copies of the step before whole. Returns the group's errors (RG_EPEER,
 * RG_ETIMEDOUT: the step did not count; regroup from the step before), RG_EINVAL (step < 0,
 * a table of another layout than the context's), RG_ENOMEM (a member had no memory for its
 * copy), RG_ESYS (the node copy cannot grow). */
rg_status_t rg_train_table_commit(rg_train_ctx_t *ctx, rg_train_table_t *table, int64_t step)
    RG_TRAIN_NODISCARD;

/* rg_train_regroup_t.extra_fn: the source's state that is not in its buffers (an optimizer's
 * state, anything of a size only the source knows), called on the source only, and only when
 * some member receives. Sets *data and *bytes (at most RG_TRAIN_EXTRA_MAX; the program keeps
 * the bytes valid until rg_train_regroup returns) and returns 0; non-zero fails the regroup
 * (RG_EINVAL: a program's error, not retried). */
typedef int (*rg_train_extra_fn_t)(void *arg, const void **data, size_t *bytes);
#define RG_TRAIN_EXTRA_MAX ((size_t)1 << 30)

typedef struct {
    /* in (a replacement's are ignored; its buffers get the state) */
    int64_t          step;       /* the steps this rank's state holds (completed), >= 0;
                                    -1: it holds none (it receives the whole state, as a
                                    replacement: a member whose buffers took a regroup's
                                    state but whose own other state did not come with it;
                                    not with a table) */
    rg_train_buf_t  *bufs;       /* the replicated state of `step`: overwritten with the
                                    source's when step is not the one agreed on */
    size_t           n_bufs;     /* same count and sizes on every rank */
    rg_data_cursor_t cursor;     /* where the data stream goes on from that state */
    rg_train_table_t *table;     /* the sharded state, or NULL: re-laid out for the new rank
                                    and world, holding step_out's rows, and committed */
    rg_train_extra_fn_t extra_fn;/* or NULL: the source's other state, sent after the buffers */
    void            *extra_arg;  /*   to each member that receives (with them, or not at all) */
    /* out */
    int              rank;       /* in the new round */
    int              world;
    int              round;
    int64_t          step_out;   /* the step every member continues from */
    int              source;     /* the rank (new numbering) whose state every member took */
    bool             received;   /* this rank's buffers were overwritten from the source
                                    (false for the source and every member at step_out) */
    int              n_received; /* the members that received (the same on every rank) */
    const void      *extra;      /* a receiver's copy of the source's extra_fn bytes (NULL
                                    otherwise, or with none): the context's memory, valid */
    size_t           extra_bytes;/*   until its next rg_train_regroup or rg_train_finalize */
} rg_train_regroup_t;

/*
 * In place. Called by every member after a collective returned RG_EPEER (a peer died; the
 * group is unusable) or rg_report returned RG_EMEMBERS with RG_NOTICE_MEMBERS (a planned
 * change: a replacement is ready, a member was lost), and by a replacement (rg_train_joining)
 * once it is ready. Leaves the old group without waiting for a checkpoint in flight (it
 * commits in the background with the old group's checkpointer, or, waiting for a dead peer's
 * shard, fails at its commit deadline and is never visible), waits for the next round its agent joined (its page's assignment: the
 * new rank and world size; survivors never wait for a replacement that is not ready: it joins
 * at a later step boundary), builds the new group, and agrees on the state: the members
 * exchange their steps, the newest wins (a survivor that finished the failed step's
 * allreduce holds a valid newer state; the lowest rank holding it is the source) and it is
 * sent, with its data cursor, to the members at another step (a replacement, a survivor that
 * did not finish the failed step); a member at that step keeps its buffers, since the group's
 * collectives give every rank the same bytes (the cursor is global: its shards follow from
 * the new rank and world size). The sharded table (rs->table) is found
 * at the same step and moved to its new owners (rg_train_table_t); the step agreed on is then
 * the newest at which some member holds the replicated state and every row is held. Then a
 * new checkpointer for the new rank and world.
 *
 * The state goes point to point in chunks of $REGROUP_REGROUP_CHUNK_BYTES (default 4 MiB;
 * the members use the smallest of theirs), four in flight to each receiver, followed by the
 * source's extra_fn bytes (a receiver takes the buffers and the extra together, or neither). The new group's
 * UCX worker is made ahead (rg_comm_spare_start): by a thread of the worker's once a group
 * is made (rg_train_init's, each regroup's) or, with none, as the regroup starts, while the
 * agents form the round; a replacement makes its own before it tells its agent it is ready.
 * $REGROUP_SPARE_WORKER=0 turns that off (each group then makes its worker in its wire-up).
 * Blocks up to $REGROUP_REGROUP_TIMEOUT_MS (default 120000) in all (a survivor waits at most
 * max(3 s, 3 lease TTLs) for the first new round: a peer that hangs without dying makes
 * none, and the job restarts); a member that fails
 * during the regroup makes it start over (another round), within the same deadline. On
 * failure (no member holds a state, the deadline passed, the agent is gone: RG_ELEASE) it
 * asks its agent to restart the job from its last checkpoint and returns the error: the
 * worker should then exit non-zero. RG_ENOTSUP when the worker does not recover in place;
 * RG_EINVAL on bad arguments or when the members' buffers differ in count or size.
 */
rg_status_t rg_train_regroup(rg_train_ctx_t *ctx, rg_train_regroup_t *rs) RG_TRAIN_NODISCARD;

/* ---- single-machine trainer ------------------------------------------------------------ */

typedef rg_status_t (*rg_train_fn_t)(rg_train_ctx_t *ctx, void *arg);

typedef struct {
    int         num_workers;     /* workers on this machine, 1..256 */
    int         max_failures;    /* worker failures tolerated (restarts), >= 0 */
    bool        use_gpu;         /* refused with RG_ENOTSUP: workers run on CPUs only */
    const char *ckpt_root;       /* required */
    unsigned    keep_last;       /* checkpoints kept; 0 = 3 */
    bool        in_place;        /* --recovery=in-place: fn regroups (rg_train_regroup) */
    int         argc;            /* the program's own arguments, re-used for the workers */
    char      **argv;
} rg_scaling_config_t;

/*
 * Runs fn on num_workers local workers with a private etcd: the same machinery as
 * `regroup --standalone` (restarts, checkpoints, resume). Called in the program's main: in
 * the driver it starts the workers (re-running this program) and returns when the job ends;
 * in a worker it runs fn and exits the process with fn's result (0 for RG_OK, else 1).
 * The driver returns, with the reason in rg_last_error():
 *   RG_OK          every worker finished fn successfully
 *   RG_EINVAL      a bad scaling config, naming the field ("rg_scaling_config_t.num_workers=0")
 *   RG_ENOTSUP     use_gpu
 *   RG_EJOBFAILED  the workers failed more than max_failures times
 *   RG_ECANCELED   SIGTERM, SIGINT or SIGHUP reached the driver: the workers were stopped
 *   RG_EUNREACH, RG_ETIMEDOUT, ...  the private etcd or the rendezvous could not start
 *   RG_ESYS        the workers could not be started
 * The driver's environment is left as it was (the workers get theirs from the launcher), and
 * so are its signal mask and SIGPIPE disposition, which change only while it runs. Blocks.
 * In a worker it never returns: it makes the context (rg_train_init), runs fn, prints
 * rg_last_error() if fn failed, finalizes and exits the process. The caller keeps scaling
 * and arg.
 */
rg_status_t rg_trainer_fit(rg_train_fn_t fn, void *arg, const rg_scaling_config_t *scaling)
    RG_TRAIN_NODISCARD;

#ifdef __cplusplus
}
#endif
#endif
