/*
 * rg-fmnist-local: trains the Fashion-MNIST MLP in one process with regroup's data loader
 * (world size 1) and reports the test accuracy. The step is written as the distributed
 * trainer will run it: compute the gradient, average it over ranks (a no-op here), apply.
 *
 *   rg-fmnist-local [--epochs N] [--batch B] [--lr LR] [--seed S] [--data DIR]
 *                   [--schedule cosine|constant] [--log-every STEPS]
 *
 * Defaults: 3 epochs, batch 64, Adam with lr 1e-3 decayed to 0 by a cosine over the run,
 * seed 1, data from /usr/share/datasets/fashion-mnist.
 *
 * Prints "step=... epoch=... loss=... samples_per_s=..." every --log-every steps, one
 * "eval epoch=... test_loss=... test_accuracy=..." line per epoch, and finally
 * "test_accuracy=<fraction>". Exits non-zero on any error.
 */
#include "fmnist_adam.h"
#include "fmnist_mlp.h"
#include "fmnist_opts.h"

#include <regroup/data.h>
#include <regroup/deadline.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the distributed trainer sums the gradient buffer over ranks (each rank's gradient
 * is already divided by the global batch size). With one process there is nothing to add. */
static rg_status_t average_gradient(float *grads, size_t n)
{
    (void)grads;
    (void)n;
    return RG_OK;
}

int main(int argc, char **argv)
{
    fmnist_options_t o;
    rg_dataset_t    *train = NULL;
    rg_dataset_t    *test = NULL;
    fmnist_mlp_t    *model = NULL;
    fmnist_adam_t   *adam = NULL;
    rg_loader_t     *loader = NULL;
    rg_status_t      st;
    int              rc = fmnist_parse_options(argc, argv, false, &o);

    if (rc != 0) {
        return rc;
    }
    st = fmnist_open_split(&o, "train", &train);
    if (st == RG_OK) {
        st = fmnist_open_split(&o, "t10k", &test);
    }
    if (st != RG_OK) {
        goto out;
    }
    fmnist_mlp_config_t mcfg = fmnist_mlp_default_config((uint32_t)o.batch);
    st = fmnist_mlp_create(&mcfg, &model);
    if (st != RG_OK) {
        goto out;
    }
    fmnist_mlp_init(model, (uint64_t)o.seed);
    fmnist_adam_config_t acfg = fmnist_adam_default_config((float)o.lr);
    st = fmnist_adam_create(fmnist_mlp_num_params(model), &acfg, &adam);
    if (st != RG_OK) {
        goto out;
    }
    rg_sampler_params_t sp = {.num_samples = rg_dataset_size(train),
                              .batch_size = (uint32_t)o.batch, .drop_last = false};
    rg_data_cursor_t    start = rg_data_cursor_start((uint64_t)o.seed);
    /* The schedule's length: every epoch has ceil(n / B) steps (no drop_last). */
    uint64_t total_steps = (uint64_t)o.epochs *
                           ((rg_dataset_size(train) + (uint64_t)o.batch - 1) / (uint64_t)o.batch);
    st = rg_loader_create(train, &sp, 0, 1, &start, &loader);
    if (st != RG_OK) {
        goto out;
    }

    double   window_loss = 0.0;
    size_t   window_samples = 0;
    uint64_t window_ns = 0;
    uint64_t train_ns = 0;
    size_t   train_samples = 0;
    uint64_t step = 0;
    for (;;) {
        const rg_batch_t *b = NULL;
        /* Throughput counts the loader wait and the step, not the evaluations. */
        uint64_t          t0 = rg_now_ns();
        st = rg_loader_next(loader, rg_deadline_in_ms(60000), &b);
        if (st != RG_OK) {
            goto out;
        }
        if (b->cursor.epoch >= (uint64_t)o.epochs) {
            break;
        }
        double loss_sum = 0.0;
        st = fmnist_mlp_grad(model, b->inputs, b->labels, b->count, b->global_count,
                             &loss_sum);
        if (st == RG_OK) {
            st = average_gradient(fmnist_mlp_grads(model), fmnist_mlp_num_params(model));
        }
        if (st != RG_OK) {
            goto out;
        }
        if (o.cosine) {
            fmnist_adam_set_lr(adam, fmnist_lr_cosine((float)o.lr, step, total_steps));
        }
        fmnist_adam_step(adam, fmnist_mlp_params(model), fmnist_mlp_grads(model));
        uint64_t t1 = rg_now_ns();
        train_ns += t1 - t0;
        window_ns += t1 - t0;
        train_samples += b->count;
        window_loss += loss_sum;
        window_samples += b->count;
        step++;
        if (step % (uint64_t)o.log_every == 0) {
            double secs = (double)window_ns * 1e-9;
            printf("step=%llu epoch=%llu loss=%.4f samples_per_s=%.0f\n",
                   (unsigned long long)step, (unsigned long long)b->cursor.epoch,
                   window_loss / (double)window_samples, (double)window_samples / secs);
            fflush(stdout);
            window_loss = 0.0;
            window_samples = 0;
            window_ns = 0;
        }
        if (b->next.epoch != b->cursor.epoch) {
            double acc;
            double tl;
            st = fmnist_mlp_evaluate_dataset(model, test, &acc, &tl);
            if (st != RG_OK) {
                goto out;
            }
            printf("eval epoch=%llu test_loss=%.4f test_accuracy=%.4f\n",
                   (unsigned long long)b->cursor.epoch, tl, acc);
            fflush(stdout);
        }
    }
    double acc;
    double tl;
    st = fmnist_mlp_evaluate_dataset(model, test, &acc, &tl);
    if (st != RG_OK) {
        goto out;
    }
    printf("train_samples_per_s=%.0f steps=%llu\n",
           (double)train_samples / ((double)train_ns * 1e-9), (unsigned long long)step);
    printf("test_accuracy=%.4f\n", acc);

out:
    if (st != RG_OK) {
        fprintf(stderr, "rg-fmnist-local: %s: %s\n", rg_status_str(st), rg_last_error());
    }
    rg_loader_destroy(loader);
    fmnist_adam_destroy(adam);
    fmnist_mlp_destroy(model);
    rg_dataset_destroy(test);
    rg_dataset_destroy(train);
    return st == RG_OK ? 0 : 1;
}
