/*
 * A multilayer perceptron for Fashion-MNIST: inputs -> hidden (ReLU) -> classes, trained with
 * softmax cross-entropy. By default 784-256-10.
 *
 * Data-parallel training is built from three separate calls so that a distributed trainer can
 * put a collective between them:
 *   1. fmnist_mlp_grad()      this rank's gradient into the contiguous gradient buffer,
 *                             already divided by the *global* batch size;
 *   2. (distributed only)     sum the gradient buffer over ranks: one allreduce of
 *                             fmnist_mlp_num_params() floats;
 *   3. fmnist_adam_step()     the update, identical on every rank.
 * Because each rank divides by the global batch size, step 2 is a plain sum and the result is
 * the same at every world size, including ranks whose share of a short batch is empty.
 *
 * Parameters live in one contiguous f32 buffer, in this order (row-major):
 *   w1 [inputs x hidden], b1 [hidden], w2 [hidden x classes], b2 [classes]
 * fmnist_mlp_tensors() describes them for a checkpoint. Not thread-safe: one model per thread.
 */
#ifndef REGROUP_EXAMPLES_FMNIST_MLP_H
#define REGROUP_EXAMPLES_FMNIST_MLP_H

#include <regroup/data.h>
#include <regroup/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t inputs;     /* 784 for Fashion-MNIST */
    uint32_t hidden;     /* 256 */
    uint32_t classes;    /* 10 */
    uint32_t max_batch;  /* the most samples passed to one grad/evaluate call */
    float    input_mean; /* the model's first operation: x' = (x - input_mean) / input_std */
    float    input_std;  /* (0 and 1 leave inputs as they are) */
} fmnist_mlp_config_t;

/* The 784-256-10 model with the given largest batch, standardizing its inputs by the mean and
 * standard deviation of Fashion-MNIST's training pixels (0.2860, 0.3530 on the [0, 1] scale). */
fmnist_mlp_config_t fmnist_mlp_default_config(uint32_t max_batch);

typedef struct {
    const char *name;   /* "w1", "b1", "w2", "b2" */
    size_t      offset; /* in floats, into the parameter (and gradient) buffer */
    uint32_t    rows;   /* 1 for a bias */
    uint32_t    cols;
} fmnist_tensor_t;

#define FMNIST_MLP_TENSORS 4

typedef struct fmnist_mlp fmnist_mlp_t;

/* Allocates parameters, gradients and scratch; parameters start at zero (call init).
 * Returns RG_EINVAL (a zero size), RG_ENOMEM. Free with fmnist_mlp_destroy(). */
rg_status_t fmnist_mlp_create(const fmnist_mlp_config_t *cfg, fmnist_mlp_t **model_p);
void        fmnist_mlp_destroy(fmnist_mlp_t *model); /* accepts NULL */

/* He initialization: weights ~ N(0, 2 / fan_in) from a splitmix64 stream, biases 0.
 * Deterministic in seed, so every rank can initialize identically without a broadcast. */
void fmnist_mlp_init(fmnist_mlp_t *model, uint64_t seed);

size_t fmnist_mlp_num_params(const fmnist_mlp_t *model);
float *fmnist_mlp_params(fmnist_mlp_t *model); /* owned by the model */
float *fmnist_mlp_grads(fmnist_mlp_t *model);  /* owned by the model, same layout */
/* Fills out[FMNIST_MLP_TENSORS]; the names are static strings. */
void   fmnist_mlp_tensors(const fmnist_mlp_t *model, fmnist_tensor_t out[FMNIST_MLP_TENSORS]);

/*
 * Forward and backward over n samples (x: n * inputs floats, labels: n class indexes):
 * overwrites the gradient buffer with (1 / denom) * sum of the per-sample loss gradients, and
 * sets *loss_sum_p to the sum (not the mean) of the n losses. n may be 0 (zero gradient).
 * Returns RG_EINVAL (n > max_batch, denom == 0, a label >= classes).
 */
rg_status_t fmnist_mlp_grad(fmnist_mlp_t *model, const float *x, const uint8_t *labels,
                            size_t n, uint32_t denom, double *loss_sum_p);

/* Forward only over n <= max_batch samples: the number classified right and the loss sum. */
rg_status_t fmnist_mlp_evaluate(fmnist_mlp_t *model, const float *x, const uint8_t *labels,
                                size_t n, size_t *correct_p, double *loss_sum_p);

/* Evaluates on a whole dataset (bytes scaled to [0, 1] as the loader does), max_batch at a
 * time. Returns RG_EINVAL if the record size is not the model's inputs. */
rg_status_t fmnist_mlp_evaluate_dataset(fmnist_mlp_t *model, const rg_dataset_t *ds,
                                        double *accuracy_p, double *mean_loss_p);

#endif
