/*
 * The MLP's forward and backward passes. All matrix products go through cblas_sgemm on
 * row-major buffers; the element-wise parts (bias, ReLU, softmax) are plain loops.
 * With X [n x in] the standardized inputs, H = relu(X w1 + b1) [n x hid],
 * Z = H w2 + b2 [n x cls] and P = softmax(Z):
 *   dZ = (P - onehot(y)) / denom,   dw2 = H^T dZ,   db2 = colsum(dZ),
 *   dH = (dZ w2^T) * [H > 0],       dw1 = X^T dH,   db1 = colsum(dH).
 */
#include "fmnist_mlp.h"

#include <regroup/status.h>

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct fmnist_mlp {
    fmnist_mlp_config_t cfg;
    size_t              nparams;
    float              *params;
    float              *grads;
    /* offsets into params / grads */
    size_t              o_w1, o_b1, o_w2, o_b2;
    /* scratch, max_batch rows each */
    float              *h;  /* hidden activations */
    float              *dh; /* their gradient */
    float              *z;  /* logits, then P, then dZ in place */
    float              *x;  /* inputs for evaluate_dataset */
    float              *xs; /* standardized inputs of the last forward pass */
};

fmnist_mlp_config_t fmnist_mlp_default_config(uint32_t max_batch)
{
    fmnist_mlp_config_t c = {.inputs = 784, .hidden = 256, .classes = 10,
                             .max_batch = max_batch, .input_mean = 0.2860f,
                             .input_std = 0.3530f};
    return c;
}

rg_status_t fmnist_mlp_create(const fmnist_mlp_config_t *cfg, fmnist_mlp_t **model_p)
{
    if (cfg == NULL || model_p == NULL || cfg->inputs == 0 || cfg->hidden == 0 ||
        cfg->classes == 0 || cfg->max_batch == 0 || cfg->classes > 256 ||
        !(cfg->input_std > 0.0f)) {
        return rg_error(RG_EINVAL, "fmnist_mlp_create: bad configuration");
    }
    fmnist_mlp_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a model");
    }
    size_t in = cfg->inputs;
    size_t hid = cfg->hidden;
    size_t cls = cfg->classes;
    size_t mb = cfg->max_batch;
    m->cfg = *cfg;
    m->o_w1 = 0;
    m->o_b1 = m->o_w1 + in * hid;
    m->o_w2 = m->o_b1 + hid;
    m->o_b2 = m->o_w2 + hid * cls;
    m->nparams = m->o_b2 + cls;
    m->params = calloc(m->nparams, sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    m->h = malloc(mb * hid * sizeof(float));
    m->dh = malloc(mb * hid * sizeof(float));
    m->z = malloc(mb * cls * sizeof(float));
    m->x = malloc(mb * in * sizeof(float));
    m->xs = malloc(mb * in * sizeof(float));
    if (m->params == NULL || m->grads == NULL || m->h == NULL || m->dh == NULL ||
        m->z == NULL || m->x == NULL || m->xs == NULL) {
        size_t nparams = m->nparams;
        fmnist_mlp_destroy(m);
        return rg_error(RG_ENOMEM, "no memory for a model of %zu parameters", nparams);
    }
    *model_p = m;
    return RG_OK;
}

void fmnist_mlp_destroy(fmnist_mlp_t *model)
{
    if (model == NULL) {
        return;
    }
    free(model->params);
    free(model->grads);
    free(model->h);
    free(model->dh);
    free(model->z);
    free(model->x);
    free(model->xs);
    free(model);
}

static double init_uniform01(uint64_t *state)
{
    *state += 0x9E3779B97F4A7C15ull;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* (0, 1) */
}

static void init_normal(float *w, size_t n, double stddev, uint64_t *state)
{
    for (size_t i = 0; i < n; i += 2) {
        /* Box-Muller: two independent normals from two uniforms. */
        double r = sqrt(-2.0 * log(init_uniform01(state)));
        double t = 2.0 * M_PI * init_uniform01(state);
        w[i] = (float)(stddev * r * cos(t));
        if (i + 1 < n) {
            w[i + 1] = (float)(stddev * r * sin(t));
        }
    }
}

void fmnist_mlp_init(fmnist_mlp_t *model, uint64_t seed)
{
    uint64_t state = seed;
    size_t   in = model->cfg.inputs;
    size_t   hid = model->cfg.hidden;
    size_t   cls = model->cfg.classes;
    memset(model->params, 0, model->nparams * sizeof(float));
    init_normal(model->params + model->o_w1, in * hid, sqrt(2.0 / (double)in), &state);
    init_normal(model->params + model->o_w2, hid * cls, sqrt(2.0 / (double)hid), &state);
}

size_t fmnist_mlp_num_params(const fmnist_mlp_t *model)
{
    return model->nparams;
}

float *fmnist_mlp_params(fmnist_mlp_t *model)
{
    return model->params;
}

float *fmnist_mlp_grads(fmnist_mlp_t *model)
{
    return model->grads;
}

void fmnist_mlp_tensors(const fmnist_mlp_t *model, fmnist_tensor_t out[FMNIST_MLP_TENSORS])
{
    const fmnist_mlp_config_t *c = &model->cfg;
    out[0] = (fmnist_tensor_t){"w1", model->o_w1, c->inputs, c->hidden};
    out[1] = (fmnist_tensor_t){"b1", model->o_b1, 1, c->hidden};
    out[2] = (fmnist_tensor_t){"w2", model->o_w2, c->hidden, c->classes};
    out[3] = (fmnist_tensor_t){"b2", model->o_b2, 1, c->classes};
}

/*
 * Forward pass over n samples: fills h with the hidden activations and z with the softmax
 * probabilities; adds each sample's loss to *loss_sum and counts the right predictions.
 */
static rg_status_t mlp_forward(fmnist_mlp_t *m, const float *x, const uint8_t *labels,
                               size_t n, double *loss_sum, size_t *correct)
{
    const int   in = (int)m->cfg.inputs;
    const int   hid = (int)m->cfg.hidden;
    const int   cls = (int)m->cfg.classes;
    const float *p = m->params;

    if (n > m->cfg.max_batch) {
        return rg_error(RG_EINVAL, "mlp: batch of %zu samples, at most %u", n,
                        m->cfg.max_batch);
    }
    for (size_t i = 0; i < n; i++) {
        if (labels[i] >= cls) {
            return rg_error(RG_EINVAL, "mlp: label %u of sample %zu is not below %d",
                            labels[i], i, cls);
        }
    }
    if (n == 0) {
        return RG_OK;
    }
    /* Standardize into xs, which the backward pass reads for dw1. */
    const float shift = m->cfg.input_mean;
    const float scale = 1.0f / m->cfg.input_std;
    for (size_t k = 0; k < n * (size_t)in; k++) {
        m->xs[k] = (x[k] - shift) * scale;
    }
    /* H = relu(X w1 + b1): start from the bias rows, then accumulate the product. */
    for (size_t i = 0; i < n; i++) {
        memcpy(m->h + i * (size_t)hid, p + m->o_b1, (size_t)hid * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, hid, in, 1.0f, m->xs, in,
                p + m->o_w1, hid, 1.0f, m->h, hid);
    for (size_t k = 0; k < n * (size_t)hid; k++) {
        m->h[k] = m->h[k] > 0.0f ? m->h[k] : 0.0f;
    }
    /* Z = H w2 + b2 */
    for (size_t i = 0; i < n; i++) {
        memcpy(m->z + i * (size_t)cls, p + m->o_b2, (size_t)cls * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, cls, hid, 1.0f, m->h, hid,
                p + m->o_w2, cls, 1.0f, m->z, cls);
    /* Softmax and cross-entropy, shifted by the row's maximum for stability. */
    for (size_t i = 0; i < n; i++) {
        float *z = m->z + i * (size_t)cls;
        int    best = 0;
        for (int c = 1; c < cls; c++) {
            best = z[c] > z[best] ? c : best;
        }
        float  zmax = z[best];
        float  zy = z[labels[i]] - zmax;
        double sum = 0.0;
        for (int c = 0; c < cls; c++) {
            z[c] = expf(z[c] - zmax);
            sum += z[c];
        }
        /* -log softmax(z)_y = log(sum exp(z - zmax)) - (z_y - zmax); sum >= 1. */
        *loss_sum += log(sum) - (double)zy;
        float inv = (float)(1.0 / sum);
        for (int c = 0; c < cls; c++) {
            z[c] *= inv;
        }
        *correct += best == labels[i] ? 1 : 0;
    }
    return RG_OK;
}

static void colsum(const float *a, size_t rows, size_t cols, float *out)
{
    memset(out, 0, cols * sizeof(float));
    for (size_t i = 0; i < rows; i++) {
        for (size_t c = 0; c < cols; c++) {
            out[c] += a[i * cols + c];
        }
    }
}

rg_status_t fmnist_mlp_grad(fmnist_mlp_t *model, const float *x, const uint8_t *labels,
                            size_t n, uint32_t denom, double *loss_sum_p)
{
    fmnist_mlp_t *m = model;
    const int     in = (int)m->cfg.inputs;
    const int     hid = (int)m->cfg.hidden;
    const int     cls = (int)m->cfg.classes;
    double        loss = 0.0;
    size_t        correct = 0;

    if (denom == 0) {
        return rg_error(RG_EINVAL, "mlp: gradient averaged over 0 samples");
    }
    rg_status_t st = mlp_forward(m, x, labels, n, &loss, &correct);
    if (st != RG_OK) {
        return st;
    }
    float *g = m->grads;
    if (n == 0) {
        memset(g, 0, m->nparams * sizeof(float));
        *loss_sum_p = 0.0;
        return RG_OK;
    }
    /* dZ = (P - onehot) / denom, in place over P. */
    float scale = 1.0f / (float)denom;
    for (size_t i = 0; i < n; i++) {
        float *z = m->z + i * (size_t)cls;
        z[labels[i]] -= 1.0f;
        for (int c = 0; c < cls; c++) {
            z[c] *= scale;
        }
    }
    /* dw2 = H^T dZ, db2 = colsum(dZ) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hid, cls, (int)n, 1.0f, m->h, hid,
                m->z, cls, 0.0f, g + m->o_w2, cls);
    colsum(m->z, n, (size_t)cls, g + m->o_b2);
    /* dH = (dZ w2^T) masked by the ReLU's active units; dw1 = X^T dH, db1 = colsum(dH). */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, hid, cls, 1.0f, m->z, cls,
                m->params + m->o_w2, cls, 0.0f, m->dh, hid);
    for (size_t k = 0; k < n * (size_t)hid; k++) {
        m->dh[k] = m->h[k] > 0.0f ? m->dh[k] : 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, hid, (int)n, 1.0f, m->xs, in,
                m->dh, hid, 0.0f, g + m->o_w1, hid);
    colsum(m->dh, n, (size_t)hid, g + m->o_b1);
    *loss_sum_p = loss;
    return RG_OK;
}

rg_status_t fmnist_mlp_evaluate(fmnist_mlp_t *model, const float *x, const uint8_t *labels,
                                size_t n, size_t *correct_p, double *loss_sum_p)
{
    double      loss = 0.0;
    size_t      correct = 0;
    rg_status_t st = mlp_forward(model, x, labels, n, &loss, &correct);
    if (st != RG_OK) {
        return st;
    }
    *correct_p = correct;
    *loss_sum_p = loss;
    return RG_OK;
}

rg_status_t fmnist_mlp_evaluate_dataset(fmnist_mlp_t *model, const rg_dataset_t *ds,
                                        double *accuracy_p, double *mean_loss_p)
{
    size_t         n = rg_dataset_size(ds);
    size_t         rs = rg_dataset_record_size(ds);
    const uint8_t *rec = rg_dataset_records(ds);
    const uint8_t *lab = rg_dataset_labels(ds);
    size_t         correct = 0;
    double         loss = 0.0;

    if (rs != model->cfg.inputs) {
        return rg_error(RG_EINVAL, "mlp: records of %zu bytes, the model takes %u inputs", rs,
                        model->cfg.inputs);
    }
    for (size_t start = 0; start < n; start += model->cfg.max_batch) {
        size_t cnt = n - start < model->cfg.max_batch ? n - start : model->cfg.max_batch;
        for (size_t k = 0; k < cnt * rs; k++) {
            model->x[k] = (float)rec[start * rs + k] * (1.0f / 255.0f);
        }
        size_t      c = 0;
        double      l = 0.0;
        rg_status_t st = fmnist_mlp_evaluate(model, model->x, lab + start, cnt, &c, &l);
        if (st != RG_OK) {
            return st;
        }
        correct += c;
        loss += l;
    }
    *accuracy_p = (double)correct / (double)n;
    *mean_loss_p = loss / (double)n;
    return RG_OK;
}
