/*
 * rg-fmnist: data-parallel training of the Fashion-MNIST MLP under the regroup launcher.
 *
 *   regroup --standalone --nproc-per-node=4 rg-fmnist --epochs 3
 *
 * Each rank reads its share of every global batch through the prefetching loader, computes
 * its gradient, and the ranks sum the gradients (each already divided by the global batch)
 * with regroup's allreduce, so every rank applies the same Adam update. Every --ckpt-every
 * steps the parameters, the Adam moments and the data cursor are checkpointed in the
 * background (sharded across ranks); after a restart or a resize the job resumes from the
 * last committed checkpoint, resharding to the new world size. Rank 0 prints
 * "step=... epoch=... loss=... samples_per_s=..." lines, one "eval ..." line per epoch, a
 * timing summary and finally "test_accuracy=<fraction>". --kill-at STEP makes rank
 * --kill-rank (default 1) SIGKILL itself at that step in the job's first attempt, to show the
 * job regrouping and resuming. --stop-file PATH ends the job at the next epoch boundary once
 * PATH exists (rank 0 decides, every rank follows), as the chaos suite does. On a preemption
 * notice (a node leaves: rg_report's RG_EMEMBERS with RG_NOTICE_PREEMPT) every rank takes the
 * last checkpoint of the step it reached (rg_train_leave), prints "left at step N: ..." on
 * rank 0 and exits (0 when it landed); the job resumes from that step. In place, only the
 * ranks of the node that leaves exit; the others regroup without it after that checkpoint.
 *
 * In place (`regroup --recovery=in-place`): a collective that fails with RG_EPEER, or rg_report
 * saying RG_EMEMBERS, makes every rank call rg_train_regroup with the parameters, the Adam
 * moments and step count (replicated: every rank holds all of them) and the data cursor; the
 * survivors go on at once at the new world size, and a replacement joins at a later step
 * with the state received from a survivor over the group, not from disk. Rank 0 prints
 * "regrouped in place: ..." each time.
 */
#include "fmnist_adam.h"
#include "fmnist_mlp.h"
#include "fmnist_opts.h"

#include <regroup/deadline.h>
#include <regroup/train.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_STATE 4   /* params, adam m, adam v, adam step */

typedef struct {
    rg_train_ctx_t *ctx;
    fmnist_mlp_t   *model;
    fmnist_adam_t  *adam;
    size_t          n;           /* parameters */
    uint32_t        row0;        /* this rank's rows of each flat tensor, for checkpoints */
    uint32_t        rows;
    int64_t         adam_steps;
} trainer_t;

/* The training state as checkpoint tensors: each flat buffer is 1-D, this rank saves its
 * rows; the Adam step count is saved by rank 0 alone. */
static void state_tensors(trainer_t *t, rg_ckpt_tensor_t out[N_STATE], size_t *n_out)
{
    float *m = fmnist_adam_state(t->adam);
    const float *bufs[3] = {fmnist_mlp_params(t->model), m, m + t->n};
    static const char *const names[3] = {"params", "adam_m", "adam_v"};
    size_t k = 0;
    for (int i = 0; i < 3; i++) {
        if (t->rows > 0) {
            out[k++] = (rg_ckpt_tensor_t){.name = names[i], .dtype = RG_DTYPE_F32, .ndim = 1,
                                          .shape = {t->n}, .row_begin = t->row0,
                                          .row_count = t->rows, .data = bufs[i] + t->row0};
        }
    }
    t->adam_steps = (int64_t)fmnist_adam_steps(t->adam);
    if (rg_train_rank(t->ctx) == 0) {
        out[k++] = (rg_ckpt_tensor_t){.name = "adam_steps", .dtype = RG_DTYPE_I64, .ndim = 1,
                                      .shape = {1}, .row_begin = 0, .row_count = 1,
                                      .data = &t->adam_steps, .flags = RG_CKPT_REPLICATED};
    }
    *n_out = k;
}

/* Restores the newest checkpoint, if any: every rank reads all rows (the model is replicated).
 * *untouched: a failure left the state as it started (the group failed before any read). */
static rg_status_t resume(trainer_t *t, rg_data_cursor_t *cur, bool *resumed, bool *untouched)
{
    int64_t step;
    int64_t adam_steps = 0;
    float *m = fmnist_adam_state(t->adam);
    rg_status_t st = rg_get_checkpoint(t->ctx, &step);

    *resumed = false;
    *untouched = true;
    if (st == RG_ENOENT) {
        return RG_OK;
    }
    if (st != RG_OK) {
        return st;
    }
    *untouched = false;
    size_t bytes = t->n * sizeof(float);
    rg_ckpt_request_t reqs[4] = {
        {.name = "params", .dtype = RG_DTYPE_F32, .row_begin = 0, .row_count = t->n,
         .dst = fmnist_mlp_params(t->model), .dst_bytes = bytes},
        {.name = "adam_m", .dtype = RG_DTYPE_F32, .row_begin = 0, .row_count = t->n, .dst = m,
         .dst_bytes = bytes},
        {.name = "adam_v", .dtype = RG_DTYPE_F32, .row_begin = 0, .row_count = t->n,
         .dst = m + t->n, .dst_bytes = bytes},
        {.name = "adam_steps", .dtype = RG_DTYPE_I64, .row_begin = 0, .row_count = 1,
         .dst = &adam_steps, .dst_bytes = sizeof(adam_steps)},
    };
    st = rg_train_restore(t->ctx, step, reqs, 4, cur, &step);
    if (st != RG_OK) {
        return st;
    }
    fmnist_adam_set_steps(t->adam, (uint64_t)adam_steps);
    *resumed = true;
    if (rg_train_rank(t->ctx) == 0) {
        printf("resumed from checkpoint step %lld (epoch %llu) at world size %d, restart %d\n",
               (long long)step, (unsigned long long)cur->epoch, rg_train_world_size(t->ctx),
               rg_train_restart_count(t->ctx));
        fflush(stdout);
    }
    return RG_OK;
}

/* In place: brings this rank's state (after `step` steps; the data from *cur on) into the
 * next round; the members go on from the state they agree on. */
static rg_status_t regroup(trainer_t *t, int64_t step, rg_data_cursor_t *cur, const char *why)
{
    float *m = fmnist_adam_state(t->adam);
    int64_t adam_steps = (int64_t)fmnist_adam_steps(t->adam);
    rg_train_buf_t bufs[3] = {{fmnist_mlp_params(t->model), t->n * sizeof(float)},
                              {m, 2 * t->n * sizeof(float)},
                              {&adam_steps, sizeof(adam_steps)}};
    rg_train_regroup_t rs = {.step = step, .bufs = bufs, .n_bufs = 3, .cursor = *cur};
    rg_status_t st = rg_train_regroup(t->ctx, &rs);
    if (st != RG_OK) {
        return st;
    }
    fmnist_adam_set_steps(t->adam, (uint64_t)adam_steps);
    *cur = rs.cursor;
    rg_sampler_share((uint32_t)t->n, (uint32_t)rs.rank, (uint32_t)rs.world, &t->row0,
                     &t->rows);
    if (rs.rank == 0) {
        printf("regrouped in place (%s): round %d world %d, step %lld, state from rank %d\n",
               why, rs.round, rs.world, (long long)rs.step_out, rs.source);
        fflush(stdout);
    }
    if (rs.received) {
        fprintf(stderr, "rank %d: state of step %lld received from rank %d over the group "
                "(not from disk)\n", rs.rank, (long long)rs.step_out, rs.source);
    }
    return RG_OK;
}

/* Whether a failed call is one to regroup on (in place only). */
static bool regroup_on(const rg_train_ctx_t *ctx, rg_status_t st)
{
    return rg_train_in_place(ctx) && (st == RG_EPEER || st == RG_ETIMEDOUT || st == RG_EMEMBERS);
}

static rg_status_t train(trainer_t *t, const fmnist_options_t *o, const rg_dataset_t *train_ds,
                         const rg_dataset_t *test_ds)
{
    rg_train_ctx_t *ctx = t->ctx;
    rg_comm_t *comm = rg_train_comm(ctx);
    int rank = rg_train_rank(ctx);
    int world = rg_train_world_size(ctx);
    rg_loader_t *loader = NULL;
    bool resumed;
    rg_status_t st;

    rg_data_cursor_t cur = rg_data_cursor_start((uint64_t)o->seed);
    if (rg_train_joining(ctx)) {
        /* A replacement in an in-place job: the state comes from a survivor. */
        st = regroup(t, 0, &cur, "a replacement joined");
        comm = rg_train_comm(ctx);
        rank = rg_train_rank(ctx);
        world = rg_train_world_size(ctx);
    } else {
        bool untouched;
        if (o->kill_at == FMNIST_KILL_AT_START && rank == o->kill_rank &&
            rg_train_restart_count(ctx) == 0) {
            fprintf(stderr, "rank %d: killing myself before training (--kill-at start)\n",
                    rank);
            fflush(stderr);
            raise(SIGKILL);
        }
        st = resume(t, &cur, &resumed, &untouched);
        int64_t *saved = NULL;
        size_t n_saved = 0;
        if (untouched && rg_train_in_place(ctx) && (st == RG_EPEER || st == RG_ETIMEDOUT) &&
            (rg_train_ckpt_root(ctx) == NULL ||
             (rg_ckpt_list(rg_train_ckpt_root(ctx), &saved, &n_saved) == RG_OK &&
              n_saved == 0))) {
            /* A peer died before training began in a job that has no checkpoint yet: regroup
             * with the starting state (every member's: no step was taken). With one, the job
             * restarts from it instead (which step every member read is not known). */
            st = regroup(t, 0, &cur, "a peer failed before training");
            comm = rg_train_comm(ctx);
            rank = rg_train_rank(ctx);
            world = rg_train_world_size(ctx);
        }
        free(saved);
    }
    if (st != RG_OK) {
        return st;
    }
    rg_sampler_params_t sp = {.num_samples = rg_dataset_size(train_ds),
                              .batch_size = (uint32_t)o->batch, .drop_last = false};
    uint64_t per_epoch = (rg_dataset_size(train_ds) + (uint64_t)o->batch - 1) / (uint64_t)o->batch;
    uint64_t total_steps = (uint64_t)o->epochs * per_epoch;
    st = rg_loader_create(train_ds, &sp, (uint32_t)rank, (uint32_t)world, &cur, &loader);
    if (st != RG_OK) {
        return st;
    }
    double win_loss[2] = {0, 0};   /* loss sum, samples: this rank's, summed at log time */
    uint64_t win_ns = 0;
    uint64_t win_samples = 0;
    uint64_t step_ns = 0;
    uint64_t allreduce_ns = 0;
    uint64_t stall_ns = 0;
    uint64_t steps_here = 0;
    uint64_t samples_here = 0;
    for (;;) {
        const rg_batch_t *b;
        uint64_t t0 = rg_now_ns();
        int64_t at = -1;              /* in place: regroup with the state after `at` steps */
        rg_data_cursor_t at_cur;
        st = rg_loader_next(loader, rg_deadline_in_ms(60000), &b);
        if (st != RG_OK || b->cursor.epoch >= (uint64_t)o->epochs) {
            break;
        }
        uint64_t gstep = b->cursor.epoch * per_epoch + b->cursor.step;
        if ((int64_t)gstep == o->kill_at && rank == o->kill_rank &&
            rg_train_restart_count(ctx) == 0) {
            fprintf(stderr, "rank %d: killing myself at step %llu (--kill-at)\n", rank,
                    (unsigned long long)gstep);
            fflush(stderr);
            raise(SIGKILL);
        }
        double loss_sum = 0;
        st = fmnist_mlp_grad(t->model, b->inputs, b->labels, b->count, b->global_count,
                             &loss_sum);
        if (st != RG_OK) {
            break;
        }
        uint64_t t1 = rg_now_ns();
        st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, fmnist_mlp_grads(t->model), t->n,
                               RG_DTYPE_F32, RG_OP_SUM, NULL);
        if (regroup_on(ctx, st)) {
            at = (int64_t)gstep;   /* not applied: the state holds gstep steps */
            at_cur = b->cursor;
            goto regroup_now;
        }
        if (st != RG_OK) {
            break;
        }
        uint64_t t2 = rg_now_ns();
        allreduce_ns += t2 - t1;
        if (o->cosine) {
            fmnist_adam_set_lr(t->adam, fmnist_lr_cosine((float)o->lr, gstep, total_steps));
        }
        fmnist_adam_step(t->adam, fmnist_mlp_params(t->model), fmnist_mlp_grads(t->model));
        win_loss[0] += loss_sum;
        win_loss[1] += (double)b->count;
        win_samples += b->global_count;
        samples_here += b->global_count;
        steps_here++;

        uint64_t done = gstep + 1;
        rg_ckpt_tensor_t tensors[N_STATE];
        size_t n_tensors = 0;
        bool save = done % (uint64_t)o->ckpt_every == 0 && done < total_steps;
        if (save) {
            state_tensors(t, tensors, &n_tensors);
        }
        rg_train_state_t state = {.tensors = tensors, .n_tensors = n_tensors, .cursor = b->next};
        rg_metric_t metrics[2] = {{"loss", win_loss[1] > 0 ? win_loss[0] / win_loss[1] : 0},
                                  {"samples_per_s", 0}};
        uint64_t t3 = rg_now_ns();
        rg_report_t rep = {.step = (int64_t)done, .epoch = (int64_t)b->cursor.epoch,
                           .metrics = metrics, .n_metrics = 1};
        st = rg_report(ctx, &rep, save ? &state : NULL);
        rg_notice_t notice;
        at = (int64_t)done;
        at_cur = b->next;
        if (st == RG_EMEMBERS && rg_train_notice(ctx, &notice) == RG_OK &&
            (notice.kinds & (1u << RG_NOTICE_PREEMPT))) {
            /* A node leaves: the last checkpoint of this step (every rank is at it), then
             * exit (a restart resumes here), or in place, on a node that stays, regroup
             * without the one that left. */
            bool stays = rg_train_in_place(ctx) && !(notice.own & (1u << RG_NOTICE_PREEMPT));
            if (!save) {
                state_tensors(t, tensors, &n_tensors);
                state.n_tensors = n_tensors;
            }
            st = rg_train_leave(ctx, &rep, &state);
            if (rank == 0) {
                if (st == RG_OK) {
                    printf("%s step %llu: checkpoint committed\n",
                           stays ? "a node leaves at" : "left at", (unsigned long long)done);
                } else {
                    printf("%s step %llu: no last checkpoint: %s\n",
                           stays ? "a node leaves at" : "left at", (unsigned long long)done,
                           rg_last_error());
                }
                fflush(stdout);
            }
            if (st == RG_OK && stays) {
                st = RG_EMEMBERS;
                goto regroup_now;
            }
            rg_loader_destroy(loader);
            return st;
        }
        if (regroup_on(ctx, st)) {
            goto regroup_now;
        }
        if (st != RG_OK) {
            break;
        }
        uint64_t t4 = rg_now_ns();
        if (save) {
            stall_ns += t4 - t3;
        }
        step_ns += t4 - t0;
        win_ns += t4 - t0;
        if (done % (uint64_t)o->log_every == 0) {
            /* The loss over every rank's samples of the window. */
            st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, win_loss, 2, RG_DTYPE_F64, RG_OP_SUM,
                                   NULL);
            if (regroup_on(ctx, st)) {
                goto regroup_now;
            }
            if (st != RG_OK) {
                break;
            }
            if (rank == 0) {
                printf("step=%llu epoch=%llu loss=%.4f samples_per_s=%.0f world=%d\n",
                       (unsigned long long)done, (unsigned long long)b->cursor.epoch,
                       win_loss[0] / win_loss[1], (double)win_samples / ((double)win_ns * 1e-9),
                       world);
                fflush(stdout);
            }
            win_loss[0] = win_loss[1] = 0;
            win_samples = 0;
            win_ns = 0;
        }
        if (b->next.epoch != b->cursor.epoch && rank == 0) {
            double acc;
            double tl;
            st = fmnist_mlp_evaluate_dataset(t->model, test_ds, &acc, &tl);
            if (st != RG_OK) {
                break;
            }
            printf("eval epoch=%llu test_loss=%.4f test_accuracy=%.4f\n",
                   (unsigned long long)b->cursor.epoch, tl, acc);
            fflush(stdout);
        }
        if (b->next.epoch != b->cursor.epoch && o->stop_file != NULL) {
            /* At an epoch boundary: rank 0 decides whether the job ends here. */
            int64_t stop = rank == 0 && access(o->stop_file, F_OK) == 0 ? 1 : 0;
            st = rg_comm_broadcast(comm, &stop, 1, RG_DTYPE_I64, 0, NULL);
            if (regroup_on(ctx, st)) {
                goto regroup_now;
            }
            if (st != RG_OK || stop) {
                break;
            }
        }
        continue;
    regroup_now:
        /* The loader reads this rank's share at the old world size: a new one for the new. */
        rg_loader_destroy(loader);
        loader = NULL;
        st = regroup(t, at, &at_cur, st == RG_EMEMBERS ? "the membership changes"
                                                       : "a peer failed");
        if (st != RG_OK) {
            break;
        }
        comm = rg_train_comm(ctx);
        rank = rg_train_rank(ctx);
        world = rg_train_world_size(ctx);
        win_loss[0] = win_loss[1] = 0;
        win_samples = 0;
        win_ns = 0;
        st = rg_loader_create(train_ds, &sp, (uint32_t)rank, (uint32_t)world, &at_cur, &loader);
        if (st != RG_OK) {
            break;
        }
    }
    rg_loader_destroy(loader);
    if (st != RG_OK) {
        return st;
    }
    if (rank == 0) {
        double acc;
        double tl;
        st = fmnist_mlp_evaluate_dataset(t->model, test_ds, &acc, &tl);
        if (st != RG_OK) {
            return st;
        }
        printf("world=%d steps=%llu samples_per_s=%.0f allreduce_share=%.3f "
               "ckpt_stall_share=%.3f\n", world, (unsigned long long)steps_here,
               (double)samples_here / ((double)step_ns * 1e-9 + 1e-12),
               (double)allreduce_ns / ((double)step_ns + 1), (double)stall_ns / ((double)step_ns + 1));
        printf("test_accuracy=%.4f\n", acc);
        fflush(stdout);
    }
    return RG_OK;
}

int main(int argc, char **argv)
{
    fmnist_options_t o;
    trainer_t t = {0};
    rg_dataset_t *train_ds = NULL;
    rg_dataset_t *test_ds = NULL;
    rg_status_t st;
    int rc = fmnist_parse_options(argc, argv, true, &o);

    if (rc != 0) {
        return rc;
    }
    rg_train_params_t tp = {.in_place = true};   /* it regroups when the launcher does */
    st = rg_train_init(&tp, &t.ctx);
    if (st == RG_OK) {
        st = fmnist_open_split(&o, "train", &train_ds);
    }
    if (st == RG_OK) {
        st = fmnist_open_split(&o, "t10k", &test_ds);
    }
    if (st != RG_OK) {
        goto out;
    }
    fmnist_mlp_config_t mcfg = fmnist_mlp_default_config((uint32_t)o.batch);
    st = fmnist_mlp_create(&mcfg, &t.model);
    if (st != RG_OK) {
        goto out;
    }
    fmnist_mlp_init(t.model, (uint64_t)o.seed);   /* the same seed: every rank starts equal */
    t.n = fmnist_mlp_num_params(t.model);
    fmnist_adam_config_t acfg = fmnist_adam_default_config((float)o.lr);
    st = fmnist_adam_create(t.n, &acfg, &t.adam);
    if (st != RG_OK) {
        goto out;
    }
    rg_sampler_share((uint32_t)t.n, (uint32_t)rg_train_rank(t.ctx),
                     (uint32_t)rg_train_world_size(t.ctx), &t.row0, &t.rows);
    st = train(&t, &o, train_ds, test_ds);
out:
    if (st != RG_OK) {
        fprintf(stderr, "rg-fmnist: %s: %s\n", rg_status_name(st), rg_last_error());
    }
    fmnist_adam_destroy(t.adam);
    fmnist_mlp_destroy(t.model);
    rg_dataset_destroy(test_ds);
    rg_dataset_destroy(train_ds);
    rg_train_finalize(t.ctx);
    return st == RG_OK ? 0 : 1;
}
