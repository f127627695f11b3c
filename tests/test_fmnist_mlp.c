/* examples/fmnist_mlp.c and fmnist_adam.c: gradients against finite differences, gradients
 * that add up across ranks, Adam's update, and a short training run on real Fashion-MNIST
 * data that must drive the loss well below its start. */
#include "fmnist_adam.h"
#include "fmnist_mlp.h"
#include "fmnist_opts.h"

#include <regroup/data.h>

#include "test_util.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef RG_FMNIST_DIR
#error "RG_FMNIST_DIR must name the Fashion-MNIST folder"
#endif

static fmnist_mlp_t *tiny_model(uint32_t max_batch)
{
    fmnist_mlp_config_t cfg = {.inputs = 7, .hidden = 6, .classes = 4, .max_batch = max_batch,
                               .input_mean = 0.3f, .input_std = 0.5f};
    fmnist_mlp_t       *m = NULL;
    ck_assert_int_eq(fmnist_mlp_create(&cfg, &m), RG_OK);
    fmnist_mlp_init(m, 3);
    /* Non-zero biases so that their gradients are exercised off the origin. */
    float *p = fmnist_mlp_params(m);
    for (size_t i = 7 * 6; i < 7 * 6 + 6; i++) {
        p[i] = 0.05f * (float)(i % 3);
    }
    return m;
}

static void tiny_batch(float *x, uint8_t *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < 7; k++) {
            x[i * 7 + k] = (float)((i * 7 + k * 3) % 11) / 11.0f;
        }
        y[i] = (uint8_t)(i % 4);
    }
}

START_TEST(test_layout)
{
    fmnist_mlp_config_t cfg = fmnist_mlp_default_config(16);
    fmnist_mlp_t       *m = NULL;
    ck_assert_int_eq(fmnist_mlp_create(&cfg, &m), RG_OK);
    ck_assert_uint_eq(fmnist_mlp_num_params(m), 784 * 256 + 256 + 256 * 10 + 10);
    fmnist_tensor_t t[FMNIST_MLP_TENSORS];
    fmnist_mlp_tensors(m, t);
    size_t next = 0;
    for (int i = 0; i < FMNIST_MLP_TENSORS; i++) {
        ck_assert_uint_eq(t[i].offset, next);
        next += (size_t)t[i].rows * t[i].cols;
    }
    ck_assert_uint_eq(next, fmnist_mlp_num_params(m));
    ck_assert_str_eq(t[0].name, "w1");
    ck_assert_uint_eq(t[0].rows, 784);
    /* He init: w1's variance is about 2 / 784, biases are zero. */
    fmnist_mlp_init(m, 9);
    const float *p = fmnist_mlp_params(m);
    double       sq = 0.0;
    for (size_t i = 0; i < 784 * 256; i++) {
        sq += (double)p[i] * p[i];
    }
    double var = sq / (784.0 * 256.0);
    ck_assert_double_eq_tol(var, 2.0 / 784.0, 0.05 * 2.0 / 784.0);
    ck_assert_float_eq(p[t[1].offset], 0.0f);
    fmnist_mlp_destroy(m);
}
END_TEST

/* Central differences of the mean loss against the analytic gradient, every parameter. */
START_TEST(test_grad_finite_differences)
{
    enum { N = 5 };
    fmnist_mlp_t *m = tiny_model(N);
    float         x[N * 7];
    uint8_t       y[N];
    tiny_batch(x, y, N);
    double loss;
    ck_assert_int_eq(fmnist_mlp_grad(m, x, y, N, N, &loss), RG_OK);
    ck_assert(loss > 0.0);
    size_t np = fmnist_mlp_num_params(m);
    float *g = malloc(np * sizeof(float));
    memcpy(g, fmnist_mlp_grads(m), np * sizeof(float));
    float *p = fmnist_mlp_params(m);
    for (size_t i = 0; i < np; i++) {
        const float eps = 1e-3f;
        float       keep = p[i];
        size_t      c;
        double      lp;
        double      lm;
        p[i] = keep + eps;
        ck_assert_int_eq(fmnist_mlp_evaluate(m, x, y, N, &c, &lp), RG_OK);
        p[i] = keep - eps;
        ck_assert_int_eq(fmnist_mlp_evaluate(m, x, y, N, &c, &lm), RG_OK);
        p[i] = keep;
        double num = (lp - lm) / (2.0 * eps) / N;
        ck_assert_msg(fabs(num - g[i]) <= 2e-3 + 2e-2 * fabs(num),
                      "parameter %zu: analytic %g, numeric %g", i, (double)g[i], num);
    }
    free(g);
    fmnist_mlp_destroy(m);
}
END_TEST

/* Shares of a global batch, each divided by the global count, add up to the whole batch's
 * gradient: what lets ranks combine gradients with a plain sum at any world size. */
START_TEST(test_grad_shares_add_up)
{
    enum { N = 10 };
    fmnist_mlp_t *m = tiny_model(N);
    float         x[N * 7];
    uint8_t       y[N];
    tiny_batch(x, y, N);
    size_t np = fmnist_mlp_num_params(m);
    double whole_loss;
    ck_assert_int_eq(fmnist_mlp_grad(m, x, y, N, N, &whole_loss), RG_OK);
    float *whole = malloc(np * sizeof(float));
    float *sum = calloc(np, sizeof(float));
    memcpy(whole, fmnist_mlp_grads(m), np * sizeof(float));
    const size_t cuts[][2] = {{0, 4}, {4, 10}, {10, 10}}; /* the last share is empty */
    double       loss_sum = 0.0;
    for (size_t s = 0; s < 3; s++) {
        double l;
        size_t len = cuts[s][1] - cuts[s][0];
        ck_assert_int_eq(fmnist_mlp_grad(m, x + cuts[s][0] * 7, y + cuts[s][0], len, N, &l),
                         RG_OK);
        for (size_t i = 0; i < np; i++) {
            sum[i] += fmnist_mlp_grads(m)[i];
        }
        loss_sum += l;
    }
    ck_assert_double_eq_tol(loss_sum, whole_loss, 1e-5);
    for (size_t i = 0; i < np; i++) {
        ck_assert_float_eq_tol(sum[i], whole[i], 1e-6f);
    }
    free(whole);
    free(sum);
    uint8_t bad = 4;
    double  l;
    ck_assert_int_eq(fmnist_mlp_grad(m, x, &bad, 1, 1, &l), RG_EINVAL);
    ck_assert_int_eq(fmnist_mlp_grad(m, x, y, N + 1, N + 1, &l), RG_EINVAL);
    ck_assert_int_eq(fmnist_mlp_grad(m, x, y, 1, 0, &l), RG_EINVAL);
    fmnist_mlp_destroy(m);
}
END_TEST

START_TEST(test_adam_step)
{
    fmnist_adam_config_t cfg = fmnist_adam_default_config(0.01f);
    fmnist_adam_t       *a = NULL;
    ck_assert_int_eq(fmnist_adam_create(3, &cfg, &a), RG_OK);
    float       p[3] = {1.0f, 1.0f, 1.0f};
    const float g[3] = {0.5f, -2.0f, 0.0f};
    /* First step: mhat = g, vhat = g^2, so each parameter moves by lr * sign(g). */
    fmnist_adam_step(a, p, g);
    ck_assert_float_eq_tol(p[0], 0.99f, 1e-6f);
    ck_assert_float_eq_tol(p[1], 1.01f, 1e-6f);
    ck_assert_float_eq(p[2], 1.0f);
    ck_assert_uint_eq(fmnist_adam_steps(a), 1);
    /* m = 0.1 g, v = 0.001 g^2 after one step */
    ck_assert_float_eq_tol(fmnist_adam_state(a)[1], -0.2f, 1e-6f);
    ck_assert_float_eq_tol(fmnist_adam_state(a)[3 + 1], 0.004f, 1e-7f);
    fmnist_adam_destroy(a);
    ck_assert_float_eq(fmnist_lr_cosine(0.5f, 0, 100), 0.5f);
    ck_assert_float_eq_tol(fmnist_lr_cosine(0.5f, 50, 100), 0.25f, 1e-6f);
    ck_assert_float_eq(fmnist_lr_cosine(0.5f, 100, 100), 0.0f);
    cfg.lr = 0.0f;
    ck_assert_int_eq(fmnist_adam_create(3, &cfg, &a), RG_EINVAL);
}
END_TEST

/* Entries of directory path, . and .. aside. */
static int count_entries(const char *path)
{
    DIR *d = opendir(path);
    int n = 0;
    ck_assert_msg(d != NULL, "opendir %s", path);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(d);
    return n;
}

/* --data-cache: the first open makes the decompressed copies (no temporary file left), a
 * later one reads them (a byte changed in the copy shows), and a copy that is not an IDX
 * file is left for the .gz. */
START_TEST(test_data_cache)
{
    char dir[512];
    char cache[600];
    char path[700];
    test_tmpdir(dir, sizeof(dir), "fmcache");
    snprintf(cache, sizeof(cache), "%s/cache", dir);
    char *argv[] = {"rg-fmnist", "--data", RG_FMNIST_DIR, "--data-cache", cache, NULL};
    fmnist_options_t o;
    ck_assert_int_eq(fmnist_parse_options(5, argv, true, &o), 0);
    rg_dataset_t *gz = NULL;
    rg_dataset_t *ds = NULL;
    ck_assert_msg(rg_dataset_open_idx(RG_FMNIST_DIR "/t10k-images-idx3-ubyte.gz",
                                      RG_FMNIST_DIR "/t10k-labels-idx1-ubyte.gz", &gz) == RG_OK,
                  "%s", rg_last_error());
    size_t bytes = rg_dataset_size(gz) * 784;

    ck_assert_msg(fmnist_open_split(&o, "t10k", &ds) == RG_OK, "%s", rg_last_error());
    ck_assert_int_eq(rg_dataset_size(ds), rg_dataset_size(gz));
    ck_assert(memcmp(rg_dataset_records(ds), rg_dataset_records(gz), bytes) == 0);
    ck_assert(memcmp(rg_dataset_labels(ds), rg_dataset_labels(gz), rg_dataset_size(gz)) == 0);
    rg_dataset_destroy(ds);
    snprintf(path, sizeof(path), "%s/t10k-images-idx3-ubyte", cache);
    ck_assert_msg(access(path, R_OK) == 0, "no copy at %s", path);
    ck_assert_int_eq(count_entries(cache), 2);   /* the two copies, nothing else */

    /* The first record's first pixel, after the 16-byte header, changed in the copy. */
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    uint8_t px = (uint8_t)(rg_dataset_records(gz)[0] ^ 0xff);
    ck_assert_int_eq(fseek(f, 16, SEEK_SET), 0);
    ck_assert_int_eq(fwrite(&px, 1, 1, f), 1);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert(fmnist_open_split(&o, "t10k", &ds) == RG_OK);
    ck_assert_int_eq(rg_dataset_records(ds)[0], px);
    rg_dataset_destroy(ds);

    /* Not an IDX file: the data set comes from the .gz. */
    f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs("not an IDX file", f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert(fmnist_open_split(&o, "t10k", &ds) == RG_OK);
    ck_assert(memcmp(rg_dataset_records(ds), rg_dataset_records(gz), bytes) == 0);
    rg_dataset_destroy(ds);
    rg_dataset_destroy(gz);
    test_rmtree(dir);
}
END_TEST

/* A few hundred Adam steps on 3000 real training images through the loader. */
START_TEST(test_short_training_run)
{
    rg_dataset_t *full = NULL;
    ck_assert_msg(rg_dataset_open_idx(RG_FMNIST_DIR "/train-images-idx3-ubyte.gz",
                                      RG_FMNIST_DIR "/train-labels-idx1-ubyte.gz", &full) ==
                      RG_OK, "%s", rg_last_error());
    enum { SUBSET = 3000, BATCH = 64, STEPS = 300, WINDOW = 20 };
    rg_dataset_t *ds = NULL;
    ck_assert_int_eq(rg_dataset_create(rg_dataset_records(full), rg_dataset_labels(full),
                                       SUBSET, 784, &ds), RG_OK);
    rg_dataset_destroy(full);

    fmnist_mlp_config_t  mcfg = fmnist_mlp_default_config(BATCH);
    fmnist_mlp_t        *m = NULL;
    fmnist_adam_t       *a = NULL;
    fmnist_adam_config_t acfg = fmnist_adam_default_config(1e-3f);
    ck_assert_int_eq(fmnist_mlp_create(&mcfg, &m), RG_OK);
    fmnist_mlp_init(m, 1);
    ck_assert_int_eq(fmnist_adam_create(fmnist_mlp_num_params(m), &acfg, &a), RG_OK);
    rg_sampler_params_t sp = {.num_samples = SUBSET, .batch_size = BATCH, .drop_last = false};
    rg_data_cursor_t    c = rg_data_cursor_start(5);
    rg_loader_t        *l = NULL;
    ck_assert_int_eq(rg_loader_create(ds, &sp, 0, 1, &c, &l), RG_OK);

    double first = 0.0;
    double last = 0.0;
    size_t first_n = 0;
    size_t last_n = 0;
    for (int s = 0; s < STEPS; s++) {
        const rg_batch_t *b = NULL;
        ck_assert_int_eq(rg_loader_next(l, rg_deadline_in_ms(10000), &b), RG_OK);
        double loss;
        ck_assert_int_eq(fmnist_mlp_grad(m, b->inputs, b->labels, b->count, b->global_count,
                                         &loss), RG_OK);
        fmnist_adam_step(a, fmnist_mlp_params(m), fmnist_mlp_grads(m));
        if (s < WINDOW) {
            first += loss;
            first_n += b->count;
        } else if (s >= STEPS - WINDOW) {
            last += loss;
            last_n += b->count;
        }
    }
    first /= (double)first_n;
    last /= (double)last_n;
    ck_assert_msg(first > 1.0, "first loss %.3f: the model started trained?", first);
    ck_assert_msg(last < 0.4 * first, "loss went from %.3f to only %.3f", first, last);
    double acc;
    double mean_loss;
    ck_assert_int_eq(fmnist_mlp_evaluate_dataset(m, ds, &acc, &mean_loss), RG_OK);
    ck_assert_msg(acc > 0.8, "training accuracy %.3f", acc);
    rg_loader_destroy(l);
    fmnist_adam_destroy(a);
    fmnist_mlp_destroy(m);
    rg_dataset_destroy(ds);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fmnist_mlp");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_layout);
    tcase_add_test(tc, test_grad_finite_differences);
    tcase_add_test(tc, test_grad_shares_add_up);
    tcase_add_test(tc, test_adam_step);
    tcase_add_test(tc, test_short_training_run);
    tcase_add_test(tc, test_data_cache);
    suite_add_tcase(s, tc);
    return test_main("test_fmnist_mlp", s, NULL);
}
