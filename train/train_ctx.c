/*
 * The worker API: a context from the launcher's environment, progress reports, asynchronous
 * checkpoints of the training state and the data cursor, and restoring them at any world
 * size. Ranks agree on what they restore: rank 0 picks the newest committed step, every rank
 * tries it, and if any rank cannot read it, all fall back to an older one together.
 */
#include "rdzv_fence.h"
#include "rg_beat.h"
#include "rdzv_keys.h"
#include "rg_common.h"
#include "rg_notice.h"
#include "train_internal.h"

#include <regroup/etcd.h>
#include <regroup/train.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CURSOR_TENSOR      "_regroup.cursor"
#define PROGRESS_PERIOD_NS 500000000ull   /* progress without a checkpoint: at most 2/s */
#define RESTORE_TRIES      8
#define RETIRED_SAME_STEP_MS 10000   /* an earlier group's save of the step a new one takes */
#define CKPT_WAIT_SLICE_MS   20      /* rg_train_ckpt_wait, in place: between looks at the round */

static rg_status_t finish_save(rg_train_ctx_t *ctx);

/* Every report rg_report accepts fits the progress record. */
_Static_assert(RG_TRAIN_MAX_METRICS <= RDZV_PROGRESS_METRICS, "progress record metrics");


_Static_assert(RG_NOTICE_PREEMPT == (int)RG_NOTICE_KIND_PREEMPT &&
               RG_NOTICE_MEMBERS == (int)RG_NOTICE_KIND_MEMBERS, "notice kinds");

static rg_status_t env_int(const char *name, int lo, int hi, int dflt, int *out)
{
    const char *v = getenv(name);
    int64_t x;
    if (v == NULL || v[0] == '\0') {
        if (dflt < lo) {
            return rg_error(RG_EINVAL, "worker environment: %s is not set (run the program "
                            "under regroup)", name);
        }
        *out = dflt;
        return RG_OK;
    }
    if (!rg_parse_i64(v, &x) || x < lo || x > hi) {
        return rg_error(RG_EINVAL, "worker environment: %s=%s is not in %d..%d", name, v, lo, hi);
    }
    *out = (int)x;
    return RG_OK;
}

rg_status_t rg_train_init(const rg_train_params_t *params, rg_train_ctx_t **ctx_p)
{
    rg_train_params_t defaults = {0};
    rg_train_ctx_t *ctx;
    rg_comm_env_t *env;
    rg_status_t st;

    if (ctx_p == NULL) {
        return rg_error(RG_EINVAL, "rg_train_init: NULL ctx_p");
    }
    if (params == NULL) {
        params = &defaults;
    }
    ctx = calloc(1, sizeof(*ctx));
    env = calloc(1, sizeof(*env));
    if (ctx == NULL || env == NULL) {
        free(ctx);
        free(env);
        return rg_error(RG_ENOMEM, "rg_train_init");
    }
    st = rg_comm_env_read(env);
    if (st == RG_OK) {
        st = env_int("LOCAL_RANK", 0, RG_COMM_MAX_SIZE, 0, &ctx->local_rank);
    }
    if (st == RG_OK) {
        st = env_int("LOCAL_WORLD_SIZE", 1, RG_COMM_MAX_SIZE, 1, &ctx->local_size);
    }
    if (st == RG_OK) {
        st = env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, 0, &ctx->restart_count);
    }
    if (st != RG_OK) {
        goto err;
    }
    ctx->rank = env->params.rank;
    ctx->world = env->params.size;
    ctx->round = (int)env->round;
    ctx->fenced_round = -1;
    train_straggler_init(&ctx->straggler);
    snprintf(ctx->job, sizeof(ctx->job), "%s", env->job_id);
    rg_log_set_identity(ctx->rank, ctx->round);
    st = rdzv_keys_init(&ctx->keys, ctx->job);
    if (st == RG_OK) {
        st = rdzv_fence_from_env(&ctx->fence, &ctx->keys);
    }
    if (st != RG_OK) {
        goto err;
    }

    st = rg_notice_view_open(&ctx->notice);
    if (st == RG_OK) {
        st = rg_beat_worker_start(ctx->local_rank, &ctx->beat);
    }
    if (st != RG_OK) {
        goto err;
    }
    st = rg_etcd_create(&env->etcd, &ctx->etcd); /* TLS files and user from the launcher */
    if (st == RG_OK) {
        st = train_progress_start(&env->etcd, &ctx->progress);
    }
    if (st != RG_OK) {
        goto err;
    }
    env->params.etcd = ctx->etcd;
    env->params.timeout_ms = params->comm_timeout_ms;
    if (env->params.timeout_ms == 0) {
        int ms = 0;
        st = env_int("REGROUP_COMM_TIMEOUT_MS", 1, 1 << 30, 30000, &ms);
        if (st != RG_OK) {
            goto err;
        }
        env->params.timeout_ms = ms;
    }
    ctx->comm_timeout_ms = env->params.timeout_ms;
    /* In place: the agent keeps this worker through failures, and a replacement starts in no
     * round (rg_train_regroup lets it in). */
    const char *recovery = getenv("REGROUP_RECOVERY");
    const char *join = getenv(RG_NOTICE_JOIN_ENV);
    ctx->in_place = params->in_place && ctx->notice.page != NULL && recovery != NULL &&
                    strcmp(recovery, "in-place") == 0;
    ctx->joining = ctx->in_place && join != NULL && strcmp(join, "1") == 0;
    const char *repl = getenv(RG_NOTICE_REPLACEMENT_ENV);
    ctx->replacement = ctx->joining && repl != NULL && strcmp(repl, "1") == 0;
    if (ctx->joining) {
        st = env_int(RG_NOTICE_JOIN_MS_ENV, 0, 1 << 30, 0, &ctx->join_wait_ms);
        if (st != RG_OK) {
            goto err;
        }
    }
    if (!ctx->joining) {
        if (ctx->in_place) {
            train_group_watch(ctx, ctx->round, ctx->world, &env->params);
        }
        st = rg_comm_create(&env->params, &ctx->comm);
        if (st == RG_OK) {
            st = train_health_check(ctx, ctx->restart_count > 0 ? "a restart" : "the start");
        }
        if (st != RG_OK) {
            goto err;
        }
    }
    train_spare_start(ctx);   /* in place: the next group's UCX worker, in the background */
    const char *root = params->ckpt_root ? params->ckpt_root : getenv("REGROUP_CKPT_DIR");
    if (root != NULL && root[0] != '\0') {
        int keep = (int)params->keep_last;
        if (keep == 0) {
            st = env_int("REGROUP_CKPT_KEEP", 1, 1 << 20, 3, &keep);
            if (st != RG_OK) {
                goto err;
            }
        }
        snprintf(ctx->ckpt_root, sizeof(ctx->ckpt_root), "%s", root);
        st = env_int("REGROUP_CKPT_COMMIT_TIMEOUT_MS", 1, 1 << 30, 120000, &ctx->commit_ms);
        if (st != RG_OK) {
            goto err;
        }
        ctx->keep_last = (unsigned)keep;
        ctx->staging_bytes = params->staging_bytes;
        if (!ctx->joining) {
            st = train_ckpt_open(ctx);
            if (st != RG_OK) {
                goto err;
            }
        }
    }
    free(env);
    if (ctx->in_place && !rg_notice_msg_send(RG_NOTICE_MSG_INPLACE, ctx->local_rank)) {
        rg_warn("cannot tell the agent that this worker regroups in place: the job will "
                "recover by restarting");
    }
    if (ctx->joining) {
        rg_info("a newcomer (a replacement, or a joining node's worker): joins the running "
                "job in rg_train_regroup");
    }
    *ctx_p = ctx;
    return RG_OK;
err:
    free(env);
    rg_train_finalize(ctx);
    return st;
}

rg_status_t train_ckpt_open(rg_train_ctx_t *ctx)
{
    if (ctx->ckpt_root[0] == '\0') {
        return RG_OK;
    }
    rg_ckpt_params_t cp = {.root = ctx->ckpt_root, .rank = ctx->rank,
                           .world_size = ctx->world, .staging_bytes = ctx->staging_bytes,
                           .keep_last = ctx->keep_last, .etcd = ctx->etcd, .job = ctx->job,
                           .commit_timeout_ms = ctx->commit_ms,
                           .attempt = (uint64_t)ctx->round + 1,
                           .fence_agent = ctx->fence.on ? ctx->fence.agent : NULL,
                           .fence_lease = ctx->fence.lease,
                           .fence_round = ctx->fence.round};
    return rg_ckpt_create(&cp, &ctx->ckpt);
}

/* Waits for the checkpoint in flight; returns its result. */
static rg_status_t finish_save(rg_train_ctx_t *ctx)
{
    return train_save_finish(ctx, RG_DEADLINE_DEFAULT);
}

rg_status_t train_save_finish(rg_train_ctx_t *ctx, rg_deadline_t deadline)
{
    rg_status_t st = RG_OK;
    if (ctx->save == NULL) {
        return RG_OK;
    }
    st = rg_ckpt_save_wait(ctx->save, deadline);
    if (deadline != RG_DEADLINE_DEFAULT && st == RG_ETIMEDOUT &&
        rg_ckpt_save_status(ctx->save) == RG_INPROGRESS) {
        return st;   /* still running: the caller's deadline, not the save's failure */
    }
    if (st != RG_OK) {
        rg_error_log("checkpoint of step %lld failed: %s", (long long)ctx->save_step,
                     rg_ckpt_save_error(ctx->save));
        st = rg_error(st, "checkpoint of step %lld failed: %s", (long long)ctx->save_step,
                      rg_ckpt_save_error(ctx->save));
    }
    rg_ckpt_save_release(ctx->save);
    ctx->save = NULL;
    return st;
}

void rg_train_finalize(rg_train_ctx_t *ctx)
{
    if (ctx == NULL) {
        return;
    }
    if (ctx->comm != NULL && !rg_comm_is_healthy(ctx->comm) && ctx->save != NULL) {
        /* A peer failed: the checkpoint in flight may wait for that peer's shard until its
         * commit deadline. A restart must not wait for that; an uncommitted checkpoint is
         * never visible, so leave it (and its threads) to the process's exit. */
        rg_status_t ws = rg_ckpt_save_wait(ctx->save, rg_deadline_in_ms(1000));
        if (ws != RG_OK && rg_ckpt_save_status(ctx->save) == RG_INPROGRESS) {
            rg_warn("abandoning the checkpoint of step %lld in flight: a peer failed",
                    (long long)ctx->save_step);
            rg_comm_destroy(ctx->comm);
            rg_comm_spare_destroy(ctx->spare);
            rg_etcd_destroy(ctx->etcd);   /* (the progress thread, with its own, is left too) */
            rg_beat_worker_stop(ctx->beat);
            return;
        }
    }
    (void)finish_save(ctx);
    train_retired_reap(ctx, 1000);   /* earlier groups' checkpoints: bounded, then left */
    rg_ckpt_destroy(ctx->ckpt);
    rg_comm_destroy(ctx->comm);
    rg_comm_spare_destroy(ctx->spare);
    free(ctx->regroup_extra);
    train_progress_stop(ctx->progress);
    rg_etcd_destroy(ctx->etcd);
    rg_notice_view_close(&ctx->notice);
    rg_beat_worker_stop(ctx->beat);
    train_straggler_cleanup(&ctx->straggler);
    free(ctx);
}

int rg_train_rank(const rg_train_ctx_t *ctx)
{
    return ctx->rank;
}

int rg_train_world_size(const rg_train_ctx_t *ctx)
{
    return ctx->world;
}

int rg_train_local_rank(const rg_train_ctx_t *ctx)
{
    return ctx->local_rank;
}

int rg_train_local_size(const rg_train_ctx_t *ctx)
{
    return ctx->local_size;
}

int rg_train_round(const rg_train_ctx_t *ctx)
{
    return ctx->round;
}

int rg_train_restart_count(const rg_train_ctx_t *ctx)
{
    return ctx->restart_count;
}

rg_comm_t *rg_train_comm(rg_train_ctx_t *ctx)
{
    return ctx->comm;
}

const char *rg_train_ckpt_root(const rg_train_ctx_t *ctx)
{
    return ctx->ckpt_root[0] ? ctx->ckpt_root : NULL;
}

static bool metric_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-') {
            return false;
        }
    }
    return true;
}

/* Hands the progress record of r to the publisher (train_progress.c): never waits on etcd. */
static void publish_progress(rg_train_ctx_t *ctx, const rg_report_t *r)
{
    char key[RDZV_KEY_MAX];
    char val[4096];
    rdzv_progress_rec_t p = {.step = r->step, .epoch = r->epoch, .round = ctx->round,
                             .time = rg_wall_s(), .n_metrics = r->n_metrics,
                             .measured = ctx->straggler.round == ctx->round &&
                                         ctx->straggler.share >= 0,
                             .compute = ctx->straggler.share,
                             .slow = RG_MAX(ctx->straggler.ratio, 0.0),
                             .slow_s = ctx->straggler.slow_s};
    rg_status_t st;

    for (size_t i = 0; i < r->n_metrics; i++) {   /* names checked by rg_report: they fit */
        snprintf(p.metrics[i].name, sizeof(p.metrics[i].name), "%s", r->metrics[i].name);
        p.metrics[i].value = r->metrics[i].value;
    }
    st = rdzv_keys_progress(&ctx->keys, ctx->rank, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_rec_progress_encode(&p, val, sizeof(val));
    }
    if (st != RG_OK) {
        /* Progress is informational: training goes on without it. */
        rg_warn("progress report not published: %s", rg_last_error());
        return;
    }
    train_progress_post(ctx->progress, &ctx->fence, key, val);
}

/* Whether the fence refused a progress record of this rank's round (written in the
 * background since: the job has left the round): RG_ELEASE, for the caller to decide what
 * that means, as for a write of its own. */
static rg_status_t progress_fenced(const rg_train_ctx_t *ctx)
{
    if (train_progress_fenced(ctx->progress) < ctx->round) {
        return RG_OK;
    }
    return rg_error(RG_ELEASE, "the progress report of round %d was refused: the job has "
                    "left that round", ctx->round);
}

/* Whether this worker's agent is still a live member of the job: RG_ELEASE once its
 * heartbeat is older than the lease TTL (stopped, hung, or cut from etcd: the others have
 * regrouped or will regroup without this node, so nothing it computes may count). */
static rg_status_t check_agent(const rg_train_ctx_t *ctx)
{
    int64_t age = rg_notice_heartbeat_age_ms(&ctx->notice, rg_notice_now_ms());
    int64_t ttl = rg_notice_lease_ttl_ms(&ctx->notice);
    if (ctx->notice.page != NULL && age > ttl) {
        return rg_error(RG_ELEASE, "this worker's agent has not renewed its membership for "
                        "%lld ms (lease TTL %lld ms): the job goes on without this node",
                        (long long)age, (long long)ttl);
    }
    return RG_OK;
}

/*
 * The step boundary's agreement on notices: one small allreduce, no etcd. Each rank puts in
 * what its agent's page says now; every rank gets the union of the kinds and the least time
 * left, so all see a notice at the same step even though the agents post it at different
 * times. RG_EMEMBERS when any kind is set (*ctx->agreed says which); the group's errors.
 */
static rg_status_t agree_notice(rg_train_ctx_t *ctx)
{
    rg_notice_snap_t snap;
    rg_notice_assign_t a;
    /* preempt, members, -(ms left), a newer round, the stragglers' exchange is due */
    int64_t v[5] = {0, 0, INT64_MIN, 0, 0};
    unsigned own = 0;
    rg_status_t st;

    /* A membership notice is about the round its agent joins: once this worker regrouped
     * into that round (or a later one), it is history. */
    if (rg_notice_read(&ctx->notice, &snap) && snap.kind != RG_NOTICE_KIND_NONE &&
        !(snap.kind == RG_NOTICE_KIND_MEMBERS && snap.round <= ctx->round)) {
        v[snap.kind == RG_NOTICE_KIND_PREEMPT ? 0 : 1] = 1;
        own = 1u << snap.kind;
        if (snap.deadline_ms > 0) {
            v[2] = -RG_MAX(snap.deadline_ms - rg_notice_now_ms(), 0);
        }
    }
    if (ctx->fenced_round == ctx->round) {
        v[1] = 1;   /* the job has left this round (fenced_in_place): every rank regroups */
    }
    if (ctx->in_place && rg_notice_read_assign(&ctx->notice, &a) && a.round > ctx->round &&
        ctx->local_rank < a.n && a.rank[ctx->local_rank] >= 0) {
        v[3] = 1;   /* this rank's agent is in a newer round already */
    }
    v[4] = train_straggler_sample(ctx);
    st = rg_comm_allreduce(ctx->comm, RG_COMM_IN_PLACE, v, 5, RG_DTYPE_I64, RG_OP_MAX, NULL);
    if (st != RG_OK) {
        return st;
    }
    if (v[4] && !v[0] && !v[1] && !v[3]) {   /* (the same on every rank) */
        st = train_straggler_exchange(ctx);
        if (st != RG_OK) {
            return st;
        }
    }
    if (v[3]) {
        /* Some agent moved to a newer round: the job's writes from this one are fenced, so a
         * preemption's last checkpoint here could not commit. Every rank regroups first; the
         * preemption notice stays posted and is agreed on at the next step boundary, in the
         * new round. */
        if (v[0]) {
            rg_info("a member leaves once the job has regrouped into the round its agents "
                    "joined (the last checkpoint is taken there)");
        }
        v[0] = 0;
        v[1] = 1;
    }
    ctx->agreed = (rg_notice_t){.kinds = (v[0] ? 1u << RG_NOTICE_PREEMPT : 0) |
                                         (v[1] ? 1u << RG_NOTICE_MEMBERS : 0),
                                .own = own,
                                .ms_left = v[2] == INT64_MIN ? -1 : -v[2]};
    ctx->agreed_ns = rg_now_ns();
    if (ctx->agreed.kinds == 0) {
        return RG_OK;
    }
    if (snap.kind != RG_NOTICE_KIND_NONE) {
        rg_info("notice at step boundary: %s (%lld ms left)", snap.reason,
                (long long)ctx->agreed.ms_left);
    }
    return rg_error(RG_EMEMBERS, "a notice at this step: %s%s%s (%lld ms left)",
                    ctx->agreed.kinds & (1u << RG_NOTICE_PREEMPT) ? "a member leaves" : "",
                    ctx->agreed.kinds == ((1u << RG_NOTICE_PREEMPT) |
                                          (1u << RG_NOTICE_MEMBERS)) ? ", " : "",
                    ctx->agreed.kinds & (1u << RG_NOTICE_MEMBERS) ? "the membership changes"
                                                                  : "",
                    (long long)ctx->agreed.ms_left);
}

rg_status_t rg_train_notice(const rg_train_ctx_t *ctx, rg_notice_t *notice)
{
    if (ctx == NULL || notice == NULL) {
        return rg_error(RG_EINVAL, "rg_train_notice: NULL argument");
    }
    *notice = ctx->agreed;
    if (notice->ms_left >= 0) {
        int64_t since = (int64_t)((rg_now_ns() - ctx->agreed_ns) / 1000000ull);
        notice->ms_left = RG_MAX(notice->ms_left - since, 0);
    }
    return RG_OK;
}

/* A write of this rank's round (its progress, a checkpoint's commit) refused by the fence,
 * in place, while this worker's agent lives: the job's round moved on for a planned change
 * (its agent posts it soon) or a failure elsewhere. Not the end of this worker: the round is
 * marked so that the step's agreement makes every rank regroup now, and nothing more of it is
 * written (an uncommitted checkpoint is never visible). Any other result is returned as is. */
static rg_status_t fenced_in_place(rg_train_ctx_t *ctx, rg_status_t st, const char *what)
{
    if (st != RG_ELEASE || !ctx->in_place || check_agent(ctx) != RG_OK) {
        return st;
    }
    rg_info("%s: %s (regrouping in place)", what, rg_last_error());
    ctx->fenced_round = ctx->round;
    return RG_OK;
}

rg_status_t rg_train_ckpt_wait(rg_train_ctx_t *ctx)
{
    if (ctx == NULL) {
        return rg_error(RG_EINVAL, "rg_train_ckpt_wait: NULL context");
    }
    /* In place, in slices: once this worker's agent is in a newer round (a member was lost,
     * or a planned change came), the commit is refused or waits for a dead rank's shard until
     * its deadline, minutes away; the round is marked as a refused commit's is. Bounded by
     * the save's own deadline. */
    while (ctx->save != NULL) {
        rg_notice_assign_t a;
        rg_status_t st = train_save_finish(ctx, ctx->in_place
                                                    ? rg_deadline_in_ms(CKPT_WAIT_SLICE_MS)
                                                    : RG_DEADLINE_DEFAULT);
        if (ctx->save == NULL) {
            return fenced_in_place(ctx, st, "checkpoint not committed");
        }
        if (rg_notice_read_assign(&ctx->notice, &a) && a.round > ctx->round) {
            rg_info("the checkpoint of step %lld waits in round %d, and this worker's agent "
                    "is in round %d: regrouping in place", (long long)ctx->save_step,
                    ctx->round, a.round);
            ctx->fenced_round = ctx->round;
            return RG_OK;
        }
    }
    return RG_OK;
}

/* rg_report's progress and checkpoint. */
static rg_status_t report_step(rg_train_ctx_t *ctx, const rg_report_t *report,
                               const rg_train_state_t *state)
{
    rg_status_t st = RG_OK;
    rg_status_t prev;

    st = fenced_in_place(ctx, progress_fenced(ctx), "progress not published");
    if (st != RG_OK) {
        /* Fenced: this rank's round is over for the job; nothing it does counts. */
        rg_error_log("%s", rg_last_error());
        return st;   /* no checkpoint of this round may start either */
    }
    if (state != NULL || rg_now_ns() - ctx->last_progress_ns >= PROGRESS_PERIOD_NS) {
        ctx->last_progress_ns = rg_now_ns();
        publish_progress(ctx, report);
    }
    if (state != NULL) {
        /* No save of a round the job has left: a checkpoint's step waits for its record. */
        rg_status_t ws = train_progress_wait(ctx->progress);
        if (ws == RG_ETIMEDOUT) {
            rg_warn("progress report not published: %s", rg_last_error());
            ws = RG_OK;
        }
        st = fenced_in_place(ctx, ws, "progress not published");
        if (st != RG_OK) {
            rg_error_log("%s", rg_last_error());
            return st;
        }
    }
    if (ctx->n_retired > 0) {
        train_retired_reap(ctx, 0);   /* earlier groups' checkpoints that have ended */
    }
    /* Surface a background failure of the previous checkpoint at the next report. */
    if (ctx->save != NULL && rg_ckpt_save_status(ctx->save) != RG_INPROGRESS) {
        st = fenced_in_place(ctx, finish_save(ctx), "checkpoint not committed");
    }
    if (state == NULL || ctx->ckpt == NULL) {
        return st;
    }
    /* One save staged at a time. A failure of the previous one found above is kept: it is
     * the caller's only word that that checkpoint never landed. */
    prev = st != RG_OK ? st : fenced_in_place(ctx, finish_save(ctx), "checkpoint not committed");
    if (prev == RG_OK && ctx->fenced_round == ctx->round) {
        return RG_OK;   /* no checkpoint of a round the job has left: the regroup is due */
    }
    st = train_save_start(ctx, report->step, state);
    return prev != RG_OK ? prev : st;
}

rg_status_t train_save_start(rg_train_ctx_t *ctx, int64_t step, const rg_train_state_t *state)
{
    rg_status_t st;
    size_t n = state->n_tensors + 1;
    rg_ckpt_tensor_t *t = calloc(n, sizeof(*t));
    if (t == NULL) {
        return rg_error(RG_ENOMEM, "rg_report: tensors");
    }
    memcpy(t, state->tensors, state->n_tensors * sizeof(*t));
    int64_t cursor[3] = {(int64_t)state->cursor.seed, (int64_t)state->cursor.epoch,
                         (int64_t)state->cursor.step};
    size_t n_save = state->n_tensors;
    if (ctx->n_retired > 0) {
        train_retired_wait_step(ctx, step, RETIRED_SAME_STEP_MS);
    }
    if (ctx->rank == 0) {
        t[n_save++] = (rg_ckpt_tensor_t){.name = CURSOR_TENSOR, .dtype = RG_DTYPE_I64,
                                         .ndim = 1, .shape = {3}, .row_begin = 0,
                                         .row_count = 3, .data = cursor,
                                         .flags = RG_CKPT_REPLICATED};
    }
    st = rg_ckpt_save(ctx->ckpt, step, t, n_save, 0, &ctx->save);
    free(t);
    if (st == RG_EEXIST) {
        /* An earlier attempt of the job committed this very step (the steps since the
         * checkpoint it resumed from are replayed exactly): nothing to add. */
        rg_info("checkpoint step %lld is already committed", (long long)step);
        ctx->save = NULL;
        ctx->save_step = step;
        ctx->save_committed = true;
        return RG_OK;
    }
    if (st != RG_OK) {
        ctx->save = NULL;
        return st;
    }
    ctx->save_step = step;
    ctx->save_committed = false;
    return RG_OK;
}

rg_status_t rg_report(rg_train_ctx_t *ctx, const rg_report_t *report,
                      const rg_train_state_t *state)
{
    rg_status_t st;
    rg_status_t nt;

    if (ctx == NULL || report == NULL || report->n_metrics > RG_TRAIN_MAX_METRICS ||
        (report->n_metrics > 0 && report->metrics == NULL) || report->step < 0) {
        return rg_error(RG_EINVAL, "rg_report: bad arguments");
    }
    for (size_t i = 0; i < report->n_metrics; i++) {
        if (!metric_name_ok(report->metrics[i].name)) {
            return rg_error(RG_EINVAL, "rg_report: metric name '%s' is not 1-64 characters of "
                            "[A-Za-z0-9_.-]", report->metrics[i].name ? report->metrics[i].name
                                                                       : "(null)");
        }
    }
    st = check_agent(ctx);
    if (st != RG_OK) {
        return st;
    }
    if (ctx->joining) {
        return rg_error(RG_EINVAL, "rg_report: a replacement must join with rg_train_regroup "
                        "first");
    }
    st = report_step(ctx, report, state);
    if (ctx->notice.page == NULL) {
        return st;
    }
    /* Every rank takes part in the agreement whatever its own report gave, so that the
     * ranks stay in step; the report's own failure comes first. */
    nt = agree_notice(ctx);
    return st != RG_OK ? st : nt;
}

/* Rank 0's choice, shared with every rank. */
static rg_status_t agree_i64(rg_train_ctx_t *ctx, int64_t *v)
{
    return rg_comm_broadcast(ctx->comm, v, 1, RG_DTYPE_I64, 0, NULL);
}

rg_status_t rg_get_checkpoint(rg_train_ctx_t *ctx, int64_t *step_p)
{
    int64_t step = -1;
    rg_status_t st;

    if (ctx == NULL || step_p == NULL) {
        return rg_error(RG_EINVAL, "rg_get_checkpoint: NULL argument");
    }
    if (ctx->joining) {
        return rg_error(RG_EINVAL, "rg_get_checkpoint: a replacement joins the running job "
                        "with rg_train_regroup (its state comes from a survivor)");
    }
    if (ctx->ckpt == NULL) {
        return rg_error(RG_ENOENT, "no checkpoint root configured");
    }
    if (ctx->rank == 0) {
        int64_t *steps = NULL;
        size_t n = 0;
        if (rg_ckpt_list(ctx->ckpt_root, &steps, &n) == RG_OK && n > 0) {
            step = steps[n - 1];
            for (size_t i = 0; i < n; i++) {
                step = RG_MAX(step, steps[i]);
            }
        }
        free(steps);
    }
    st = agree_i64(ctx, &step);
    if (st != RG_OK) {
        return st;
    }
    if (step < 0) {
        return rg_error(RG_ENOENT, "no committed checkpoint in %s", ctx->ckpt_root);
    }
    *step_p = step;
    return RG_OK;
}

/* Removes committed steps newer than the one every rank just restored: they could not be
 * restored by every rank, and must not stand in the way of saving those steps again. */
static void remove_newer(rg_train_ctx_t *ctx, int64_t step)
{
    int64_t *steps = NULL;
    size_t n = 0;
    if (rg_ckpt_list(ctx->ckpt_root, &steps, &n) != RG_OK) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (steps[i] > step) {
            rg_warn("removing checkpoint step %lld: not every rank could restore it",
                    (long long)steps[i]);
            if (rg_ckpt_remove(ctx->ckpt_root, steps[i]) != RG_OK) {
                rg_warn("cannot remove checkpoint step %lld: %s", (long long)steps[i],
                        rg_last_error());
            }
        }
    }
    free(steps);
}

/* The newest committed step older than `step`, or -1 (decided by rank 0, shared). */
static rg_status_t older_step(rg_train_ctx_t *ctx, int64_t step, int64_t *out)
{
    int64_t best = -1;
    if (ctx->rank == 0) {
        int64_t *steps = NULL;
        size_t n = 0;
        if (rg_ckpt_list(ctx->ckpt_root, &steps, &n) == RG_OK) {
            for (size_t i = 0; i < n; i++) {
                if (steps[i] < step) {
                    best = RG_MAX(best, steps[i]);
                }
            }
        }
        free(steps);
    }
    rg_status_t st = agree_i64(ctx, &best);
    if (st == RG_OK) {
        *out = best;
    }
    return st;
}

rg_status_t rg_train_restore(rg_train_ctx_t *ctx, int64_t step, const rg_ckpt_request_t *reqs,
                             size_t n_reqs, rg_data_cursor_t *cursor, int64_t *step_p)
{
    rg_status_t st;

    if (ctx == NULL || (n_reqs > 0 && reqs == NULL) || cursor == NULL) {
        return rg_error(RG_EINVAL, "rg_train_restore: NULL argument");
    }
    if (ctx->ckpt == NULL) {
        return rg_error(RG_ENOENT, "no checkpoint root configured");
    }
    rg_ckpt_request_t *all = calloc(n_reqs + 1, sizeof(*all));
    if (all == NULL) {
        return rg_error(RG_ENOMEM, "rg_train_restore");
    }
    int64_t saved[3];
    memcpy(all, reqs, n_reqs * sizeof(*all));
    all[n_reqs] = (rg_ckpt_request_t){.name = CURSOR_TENSOR, .dtype = RG_DTYPE_I64,
                                      .row_begin = 0, .row_count = 3, .dst = saved,
                                      .dst_bytes = sizeof(saved)};
    for (int tries = 0; tries < RESTORE_TRIES && step >= 0; tries++) {
        int64_t got = -1;
        rg_status_t lst = rg_ckpt_load(ctx->ckpt_root, step, all, n_reqs + 1, &got);
        /* Everyone must restore the same step: all succeed on it, or all try an older one. */
        int64_t ok = (lst == RG_OK && got == step) ? 1 : 0;
        if (lst != RG_OK) {
            rg_warn("cannot restore step %lld here: %s", (long long)step, rg_last_error());
        }
        st = rg_comm_allreduce(ctx->comm, RG_COMM_IN_PLACE, &ok, 1, RG_DTYPE_I64, RG_OP_MIN,
                               NULL);
        if (st != RG_OK) {
            free(all);
            return st;
        }
        if (ok == 1) {
            free(all);
            if (ctx->rank == 0) {
                remove_newer(ctx, step);
            }
            cursor->seed = (uint64_t)saved[0];
            cursor->epoch = (uint64_t)saved[1];
            cursor->step = (uint64_t)saved[2];
            if (step_p != NULL) {
                *step_p = step;
            }
            rg_info("restored checkpoint step %lld", (long long)step);
            if (ctx->rank == 0) {
                /* For `regroup status` and the chaos suite: where this round resumed. */
                char key[RDZV_KEY_MAX];
                char val[128];
                rdzv_restored_rec_t rec = {.round = ctx->round, .step = step};
                rg_status_t rs = rdzv_keys_restored(&ctx->keys, key, sizeof(key));
                if (rs == RG_OK) {
                    rs = rdzv_rec_restored_encode(&rec, val, sizeof(val));
                }
                if (rs == RG_OK) {
                    rs = rdzv_fence_put(ctx->etcd, &ctx->fence, key, val, 0, 0,
                                        "the restored record");
                }
                if (rs == RG_ELEASE) {
                    return rs;   /* fenced: this round is no longer the job's */
                }
                if (rs != RG_OK) {
                    rg_warn("cannot record the restored step: %s", rg_last_error());
                }
            }
            return RG_OK;
        }
        st = older_step(ctx, step, &step);
        if (st != RG_OK) {
            free(all);
            return st;
        }
    }
    free(all);
    return rg_error(RG_ECORRUPT, "no checkpoint in %s could be restored by every rank",
                    ctx->ckpt_root);
}
