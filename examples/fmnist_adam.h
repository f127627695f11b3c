/*
 * Adam (Kingma & Ba, 2015) over one contiguous f32 parameter buffer, with its state (first
 * moments m, then second moments v) in one contiguous buffer of 2 * n floats so that it can be
 * checkpointed as two tensors, plus the step count t. Not thread-safe: one per model.
 */
#ifndef REGROUP_EXAMPLES_FMNIST_ADAM_H
#define REGROUP_EXAMPLES_FMNIST_ADAM_H

#include <regroup/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float lr;    /* learning rate, e.g. 1e-3 */
    float beta1; /* 0.9 */
    float beta2; /* 0.999 */
    float eps;   /* 1e-8 */
} fmnist_adam_config_t;

fmnist_adam_config_t fmnist_adam_default_config(float lr);

typedef struct fmnist_adam fmnist_adam_t;

/* State for n parameters, zeroed, t = 0. Returns RG_EINVAL, RG_ENOMEM. */
rg_status_t fmnist_adam_create(size_t n, const fmnist_adam_config_t *cfg,
                               fmnist_adam_t **adam_p);
void        fmnist_adam_destroy(fmnist_adam_t *adam); /* accepts NULL */

/* One update: t += 1, then params -= lr * mhat / (sqrt(vhat) + eps), elementwise. */
void fmnist_adam_step(fmnist_adam_t *adam, float *params, const float *grads);

/* Changes the learning rate for the following steps (for a schedule). */
void     fmnist_adam_set_lr(fmnist_adam_t *adam, float lr);

/* Cosine decay: base * (1 + cos(pi * step / total)) / 2, from base at step 0 to 0 at total
 * (and 0 past it). A pure function of the global step, so a resumed job continues the same
 * schedule. */
float fmnist_lr_cosine(float base, uint64_t step, uint64_t total);

float   *fmnist_adam_state(fmnist_adam_t *adam); /* 2 * n floats, owned by the optimizer */
uint64_t fmnist_adam_steps(const fmnist_adam_t *adam);
void     fmnist_adam_set_steps(fmnist_adam_t *adam, uint64_t t); /* when restoring state */

#endif
