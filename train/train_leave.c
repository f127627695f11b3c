/*
 * The last checkpoint before a node leaves (rg_train_leave, <regroup/train.h>). rg_report's
 * agreement has already put every rank at the same step boundary, so every rank saves the
 * same step; the ranks then agree once more, so that all return the same answer: RG_OK only
 * if rank 0 committed it. A checkpoint that was not committed in time is never visible (the
 * MANIFEST is written last), so the job then resumes from the previous one.
 */
#include "train_internal.h"

#include <stdio.h>
#include <string.h>

/* The minimum time the closing agreement gets, even past the notice's deadline: the other
 * ranks are at the same point, and the agent's SIGKILL bounds it anyway. */
#define LEAVE_AGREE_MIN_MS 200

static rg_status_t leave_save(rg_train_ctx_t *ctx, int64_t step,
                              const rg_train_state_t *state, rg_deadline_t dl, int64_t ms_left)
{
    rg_status_t st;

    if (ctx->ckpt == NULL) {
        return rg_error(RG_ENOENT, "rg_train_leave: no checkpoint root: step %lld cannot be "
                        "saved", (long long)step);
    }
    if (ctx->save == NULL && ctx->save_committed && ctx->save_step == step) {
        return RG_OK;   /* an earlier attempt committed this very step */
    }
    if (ctx->save == NULL || ctx->save_step != step) {
        if (state == NULL) {
            return rg_error(RG_EINVAL, "rg_train_leave: step %lld is not being saved and no "
                            "state was given", (long long)step);
        }
        if (ms_left == 0) {
            return rg_error(RG_ETIMEDOUT, "too little time to save step %lld: the notice's "
                            "deadline has passed", (long long)step);
        }
        if (ctx->save != NULL) {
            int64_t older = ctx->save_step;
            st = train_save_finish(ctx, dl);
            if (st == RG_ETIMEDOUT && ctx->save != NULL) {
                return rg_error(RG_ETIMEDOUT, "too little time: the checkpoint of step %lld "
                                "was still being written at the notice's deadline",
                                (long long)older);
            }
            /* an older save's failure is logged; the last step is what counts now */
        }
        st = train_save_start(ctx, step, state);
        if (st != RG_OK || ctx->save == NULL) {
            return st;
        }
    }
    st = train_save_finish(ctx, dl);
    if (st == RG_ETIMEDOUT && ctx->save != NULL) {
        return rg_error(RG_ETIMEDOUT, "too little time: the checkpoint of step %lld was not %s "
                        "within the notice's %lld ms", (long long)step,
                        ctx->rank == 0 ? "committed" : "written", (long long)ms_left);
    }
    return st;
}

rg_status_t rg_train_leave(rg_train_ctx_t *ctx, const rg_report_t *report,
                           const rg_train_state_t *state)
{
    rg_notice_t n;
    rg_status_t st;

    if (ctx == NULL || report == NULL || report->step < 0) {
        return rg_error(RG_EINVAL, "rg_train_leave: bad arguments");
    }
    st = rg_train_notice(ctx, &n);
    if (st != RG_OK) {
        return st;
    }
    if (!(n.kinds & (1u << RG_NOTICE_PREEMPT))) {
        return rg_error(RG_EINVAL, "rg_train_leave: the last rg_report agreed on no "
                        "preemption notice");
    }
    uint64_t t0 = rg_now_ns();
    rg_deadline_t dl = n.ms_left >= 0 ? rg_deadline_in_ms(n.ms_left) : RG_DEADLINE_DEFAULT;
    rg_status_t local = leave_save(ctx, report->step, state, dl, n.ms_left);
    char why[512] = "";
    if (local != RG_OK) {
        snprintf(why, sizeof(why), "%s", rg_last_error());
    }
    /* Every rank answers alike: committed (rank 0 waited for it) and written everywhere. */
    int64_t ok = local == RG_OK ? 1 : 0;
    int64_t left = n.ms_left >= 0 ? n.ms_left - (int64_t)((rg_now_ns() - t0) / 1000000ull) : 0;
    rg_comm_opts_t o = {.deadline = n.ms_left >= 0
                                        ? rg_deadline_in_ms(RG_MAX(left, LEAVE_AGREE_MIN_MS))
                                        : RG_DEADLINE_DEFAULT};
    st = rg_comm_allreduce(ctx->comm, RG_COMM_IN_PLACE, &ok, 1, RG_DTYPE_I64, RG_OP_MIN, &o);
    if (local != RG_OK) {
        return rg_error(local, "the last checkpoint (step %lld) did not land: %s; the job "
                        "resumes from the previous one", (long long)report->step, why);
    }
    if (st != RG_OK) {
        return rg_error(st, "the last checkpoint (step %lld): the ranks could not agree on it: "
                        "%s", (long long)report->step, rg_last_error());
    }
    if (ok != 1) {
        return rg_error(RG_ETIMEDOUT, "the last checkpoint (step %lld) did not land on "
                        "another rank in time; the job resumes from the previous one",
                        (long long)report->step);
    }
    rg_info("last checkpoint before leaving: step %lld committed (%lld ms)",
            (long long)report->step, (long long)((rg_now_ns() - t0) / 1000000ull));
    return RG_OK;
}
