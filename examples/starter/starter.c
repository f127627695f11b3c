/*
 * starter: the smallest complete training program on libregroup; copy it to start your own.
 *
 * It fits a linear model y = w.x + b to a synthetic data set by data-parallel gradient
 * descent: every rank computes the gradient of its share of each global batch, an allreduce
 * sums the shares, and every rank applies the same update. Every --ckpt-every steps (and at
 * the last step) it reports its progress with its state, which saves an asynchronous
 * checkpoint of the parameters and of the data cursor; started again with the same
 * checkpoint directory, it resumes from the newest committed checkpoint, at any world size.
 *
 *   cc -o starter starter.c $(pkg-config --cflags --libs regroup)
 *   REGROUP_CKPT_DIR=/tmp/starter-ckpt regroup --standalone --nproc-per-node=2 \
 *       ./starter --steps 60
 *
 * Options: --steps N (global steps to reach, default 60), --ckpt-every K (default 10).
 * Rank 0 prints "step=<n> loss=<mean squared error>" lines and ends with
 * "done steps=<n> loss=<..> max_error=<..> world=<n>"; the exit status is 0 when the model
 * found the true parameters (max_error < 0.05), else 1.
 */
#include <regroup/train.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM        8                /* features */
#define NPARAMS    (DIM + 1)        /* weights and bias, one checkpointed vector */
#define SAMPLES    4096             /* records in the data set */
#define BATCH      128              /* global batch, split across the ranks */
#define LR         0.5
#define SEED       42

/* A deterministic value in [-1, 1) for (i, j): the data set is the same on every rank. */
static double uniform(uint64_t i, uint64_t j)
{
    uint64_t x = i * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double)(x >> 11) / (double)(1ull << 52) - 1.0;
}

static double true_param(int k)
{
    return k == DIM ? 0.25 : (k % 2 == 0 ? 1.0 : -1.0) * 0.5 * (k + 1);
}

/* Record i: its features x[0..DIM) and its target y (the true model plus a little noise). */
static double sample(uint32_t i, double x[DIM])
{
    double y = true_param(DIM);
    for (int j = 0; j < DIM; j++) {
        x[j] = uniform(i, (uint64_t)j);
        y += true_param(j) * x[j];
    }
    return y + 0.01 * uniform(i, DIM);
}

static int parse_count(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 1 || v > 1000000) {
        return -1;
    }
    *out = v;
    return 0;
}

/* Resumes from the newest committed checkpoint, if there is one: every rank reads the whole
 * parameter vector (whichever ranks saved its rows) and the data cursor. */
static rg_status_t resume(rg_train_ctx_t *ctx, double params[NPARAMS], rg_data_cursor_t *cur)
{
    int64_t step;
    rg_status_t st = rg_get_checkpoint(ctx, &step);
    if (st == RG_ENOENT) {
        if (rg_train_rank(ctx) == 0) {
            printf("no checkpoint: starting from scratch\n");
        }
        return RG_OK;
    }
    if (st != RG_OK) {
        return st;
    }
    rg_ckpt_request_t req = {.name = "params", .dtype = RG_DTYPE_F64, .row_begin = 0,
                             .row_count = NPARAMS, .dst = params,
                             .dst_bytes = NPARAMS * sizeof(double)};
    st = rg_train_restore(ctx, step, &req, 1, cur, &step);
    if (st == RG_OK && rg_train_rank(ctx) == 0) {
        printf("resumed from step %lld\n", (long long)step);
    }
    return st;
}

static rg_status_t train(rg_train_ctx_t *ctx, long steps, long ckpt_every)
{
    int rank = rg_train_rank(ctx);
    int world = rg_train_world_size(ctx);
    rg_comm_t *comm = rg_train_comm(ctx);
    double params[NPARAMS] = {0};
    double loss = 0;
    uint32_t ids[BATCH];
    rg_sampler_t *sampler;
    rg_sampler_params_t sp = {.num_samples = SAMPLES, .batch_size = BATCH};
    rg_data_cursor_t cur = rg_data_cursor_start(SEED);

    rg_status_t st = rg_sampler_create(&sp, &sampler);
    if (st != RG_OK) {
        return st;
    }
    uint64_t per_epoch = rg_sampler_steps_per_epoch(sampler);
    st = resume(ctx, params, &cur);

    /* Each rank saves its own rows of the parameter vector in a checkpoint. */
    uint32_t row0;
    uint32_t rows;
    rg_sampler_share(NPARAMS, (uint32_t)rank, (uint32_t)world, &row0, &rows);

    while (st == RG_OK && (long)(cur.epoch * per_epoch + cur.step) < steps) {
        /* This rank's share of the global batch, and its part of the batch's gradient. */
        size_t n;
        st = rg_sampler_ids(sampler, &cur, (uint32_t)rank, (uint32_t)world, ids, BATCH, &n);
        if (st != RG_OK) {
            break;
        }
        double count = rg_sampler_global_count(sampler, &cur);
        double grad[NPARAMS + 1] = {0}; /* d(loss)/d(params), then the loss itself */
        for (size_t i = 0; i < n; i++) {
            double x[DIM];
            double y = sample(ids[i], x);
            double err = params[DIM] - y;
            for (int j = 0; j < DIM; j++) {
                err += params[j] * x[j];
            }
            for (int j = 0; j < DIM; j++) {
                grad[j] += err * x[j] / count;
            }
            grad[DIM] += err / count;
            grad[NPARAMS] += err * err / count;
        }
        /* Sum the ranks' shares: every rank gets the gradient of the whole batch. */
        st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, grad, NPARAMS + 1, RG_DTYPE_F64,
                               RG_OP_SUM, NULL);
        if (st != RG_OK) {
            break;
        }
        for (int k = 0; k < NPARAMS; k++) {
            params[k] -= LR * grad[k];
        }
        loss = grad[NPARAMS];
        rg_sampler_advance(sampler, &cur);

        long done = (long)(cur.epoch * per_epoch + cur.step);
        bool save = done % ckpt_every == 0 || done == steps;
        rg_metric_t metrics[1] = {{"loss", loss}};
        rg_report_t report = {.step = done, .epoch = (int64_t)cur.epoch, .metrics = metrics,
                              .n_metrics = 1};
        rg_ckpt_tensor_t tensor = {.name = "params", .dtype = RG_DTYPE_F64, .ndim = 1,
                                   .shape = {NPARAMS}, .row_begin = row0, .row_count = rows,
                                   .data = params + row0};
        rg_train_state_t state = {.tensors = &tensor, .n_tensors = rows > 0 ? 1 : 0,
                                  .cursor = cur};
        /* With state: an asynchronous checkpoint (the call copies params and returns). */
        st = rg_report(ctx, &report, save ? &state : NULL);
        if (st == RG_OK && save && rank == 0) {
            printf("step=%ld loss=%.6f\n", done, loss);
            fflush(stdout);
        }
    }
    rg_sampler_destroy(sampler);
    if (st != RG_OK) {
        return st;
    }
    if (rank == 0) {
        double max_error = 0;
        for (int k = 0; k < NPARAMS; k++) {
            double e = params[k] - true_param(k);
            max_error = e > max_error ? e : -e > max_error ? -e : max_error;
        }
        printf("done steps=%ld loss=%.6f max_error=%.4f world=%d\n", steps, loss, max_error,
               world);
        if (!(max_error < 0.05)) {
            return rg_error(RG_EINVAL, "the model did not converge (max_error %.4f)", max_error);
        }
    }
    return RG_OK;
}

int main(int argc, char **argv)
{
    long steps = 60;
    long ckpt_every = 10;
    for (int i = 1; i < argc; i++) {
        long *dst = NULL;
        if (strcmp(argv[i], "--steps") == 0) {
            dst = &steps;
        } else if (strcmp(argv[i], "--ckpt-every") == 0) {
            dst = &ckpt_every;
        }
        if (dst == NULL || i + 1 >= argc || parse_count(argv[++i], dst) != 0) {
            fprintf(stderr, "usage: starter [--steps N] [--ckpt-every K]\n");
            return 2;
        }
    }

    /* Rank, world size, the communication group and the checkpoint root, from the
     * environment the regroup launcher gives each worker. */
    rg_train_ctx_t *ctx;
    if (rg_train_init(NULL, &ctx) != RG_OK) {
        fprintf(stderr, "starter: %s\n", rg_last_error());
        return 1;
    }
    rg_status_t st = train(ctx, steps, ckpt_every);
    if (st != RG_OK) {
        fprintf(stderr, "starter: rank %d: %s: %s\n", rg_train_rank(ctx), rg_status_name(st),
                rg_last_error());
    }
    /* Waits for the last checkpoint to be committed, then frees everything. */
    rg_train_finalize(ctx);
    return st == RG_OK ? 0 : 1;
}
