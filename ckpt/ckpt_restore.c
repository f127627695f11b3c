/* Loading with fallback to older committed checkpoints, and full verification. */
#include "ckpt_format.h"

#include <inttypes.h>
#include <stdlib.h>

/* Failures that an older checkpoint may not have: fall back. Others (a bad request, no
 * memory) would fail the same way on every checkpoint. */
static bool restore_can_fall_back(rg_status_t st)
{
    return st == RG_ECORRUPT || st == RG_EIO || st == RG_ENOENT;
}

static rg_status_t restore_one(const char *root, int64_t step, const rg_ckpt_request_t *reqs,
                               size_t n_reqs)
{
    rg_ckpt_reader_t *rd = NULL;
    rg_status_t st = rg_ckpt_reader_open(root, step, &rd);

    for (size_t i = 0; st == RG_OK && i < n_reqs; i++) {
        st = rg_ckpt_reader_read(rd, &reqs[i]);
    }
    rg_ckpt_reader_close(rd);
    return st;
}

rg_status_t rg_ckpt_load(const char *root, int64_t step, const rg_ckpt_request_t *reqs,
                         size_t n_reqs, int64_t *step_p)
{
    int64_t *steps = NULL;
    size_t n = 0;
    rg_status_t st;

    if (root == NULL || (n_reqs > 0 && reqs == NULL)) {
        return rg_error(RG_EINVAL, "rg_ckpt_load: bad arguments");
    }
    if (step >= 0) {
        st = restore_one(root, step, reqs, n_reqs);
        if (st == RG_OK && step_p != NULL) {
            *step_p = step;
        }
        return st;
    }
    st = ckpt_list_steps(root, true, &steps, &n);
    if (st != RG_OK) {
        return st;
    }
    st = rg_error(RG_ENOENT, "no committed checkpoint in %s", root);
    for (size_t i = 0; i < n; i++) {
        st = restore_one(root, steps[i], reqs, n_reqs);
        if (st == RG_OK) {
            if (i > 0) {
                rg_warn("checkpoint: loaded step %" PRId64 " instead of newer ones", steps[i]);
            }
            if (step_p != NULL) {
                *step_p = steps[i];
            }
            break;
        }
        if (!restore_can_fall_back(st)) {
            break;
        }
        rg_warn("checkpoint step %" PRId64 " unusable, trying an older one: %s", steps[i],
                rg_last_error());
        if (i + 1 == n) {
            st = rg_error_wrap(st, "no usable checkpoint in %s; the oldest failed", root);
        }
    }
    free(steps);
    return st;
}
