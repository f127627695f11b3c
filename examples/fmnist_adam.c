/* Adam with bias correction folded into the step size (the paper's "efficient" form). */
#include "fmnist_adam.h"

#include <regroup/status.h>

#include <math.h>
#include <stdlib.h>

struct fmnist_adam {
    fmnist_adam_config_t cfg;
    size_t               n;
    uint64_t             t;
    float               *state; /* m [n], then v [n] */
};

fmnist_adam_config_t fmnist_adam_default_config(float lr)
{
    fmnist_adam_config_t c = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    return c;
}

rg_status_t fmnist_adam_create(size_t n, const fmnist_adam_config_t *cfg,
                               fmnist_adam_t **adam_p)
{
    if (n == 0 || cfg == NULL || adam_p == NULL || !(cfg->lr > 0.0f) ||
        !(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f)
        || !(cfg->eps > 0.0f)) {
        return rg_error(RG_EINVAL, "adam: bad configuration");
    }
    fmnist_adam_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return rg_error(RG_ENOMEM, "no memory for an optimizer");
    }
    a->state = calloc(2 * n, sizeof(float));
    if (a->state == NULL) {
        free(a);
        return rg_error(RG_ENOMEM, "no memory for optimizer state of %zu parameters", n);
    }
    a->cfg = *cfg;
    a->n = n;
    *adam_p = a;
    return RG_OK;
}

void fmnist_adam_destroy(fmnist_adam_t *adam)
{
    if (adam == NULL) {
        return;
    }
    free(adam->state);
    free(adam);
}

void fmnist_adam_step(fmnist_adam_t *adam, float *params, const float *grads)
{
    const float b1 = adam->cfg.beta1;
    const float b2 = adam->cfg.beta2;
    adam->t++;
    double bc1 = 1.0 - pow((double)b1, (double)adam->t);
    double bc2 = 1.0 - pow((double)b2, (double)adam->t);
    float  step = (float)((double)adam->cfg.lr * sqrt(bc2) / bc1);
    float  eps = (float)((double)adam->cfg.eps * sqrt(bc2));
    float *m = adam->state;
    float *v = adam->state + adam->n;
    for (size_t i = 0; i < adam->n; i++) {
        float g = grads[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        params[i] -= step * m[i] / (sqrtf(v[i]) + eps);
    }
}

void fmnist_adam_set_lr(fmnist_adam_t *adam, float lr)
{
    adam->cfg.lr = lr;
}

float fmnist_lr_cosine(float base, uint64_t step, uint64_t total)
{
    if (total == 0 || step >= total) {
        return 0.0f;
    }
    return (float)((double)base * 0.5 * (1.0 + cos(M_PI * (double)step / (double)total)));
}

float *fmnist_adam_state(fmnist_adam_t *adam)
{
    return adam->state;
}

uint64_t fmnist_adam_steps(const fmnist_adam_t *adam)
{
    return adam->t;
}

void fmnist_adam_set_steps(fmnist_adam_t *adam, uint64_t t)
{
    adam->t = t;
}
