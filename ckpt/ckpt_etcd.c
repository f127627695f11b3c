/* The commit's etcd part: workers/ckpt/latest of the job's keys (rendezvous/rdzv_keys.h), written
 * under the writer's fence (rendezvous/rdzv_fence.h) when it has one. */
#include "ckpt_internal.h"
#include "rdzv_fence.h"

#include <regroup/etcd.h>

#include <inttypes.h>
#include <stdio.h>

static rg_status_t commit_fence(const ckpt_commit_args_t *a, rdzv_keys_t *keys,
                                rdzv_fence_t *fence)
{
    rg_status_t st = rdzv_keys_init(keys, a->job);
    if (st != RG_OK) {
        return st;
    }
    if (a->fence_agent == NULL) {
        *fence = (rdzv_fence_t){.on = false};
        return RG_OK;
    }
    return rdzv_fence_init(fence, keys, a->fence_round, a->fence_agent, a->fence_lease);
}

rg_status_t ckpt_etcd_fence_check(const ckpt_commit_args_t *a)
{
    rdzv_keys_t keys;
    rdzv_fence_t fence;
    char what[64];
    rg_status_t st = commit_fence(a, &keys, &fence);

    if (st != RG_OK || !fence.on) {
        return st;
    }
    snprintf(what, sizeof(what), "the commit of checkpoint step %" PRId64, a->step);
    return rdzv_fence_txn(a->etcd, &fence, NULL, 0, 0, what, NULL);
}

rg_status_t ckpt_etcd_record(const ckpt_commit_args_t *a)
{
    rdzv_keys_t keys;
    rdzv_fence_t fence;
    char key[RDZV_KEY_MAX];
    char value[RDZV_NUM_MAX];
    char what[64];
    rg_status_t st;

    st = commit_fence(a, &keys, &fence);
    if (st == RG_OK) {
        st = rdzv_keys_ckpt_latest(&keys, key, sizeof(key));
    }
    if (st == RG_OK) {
        st = rdzv_rec_ckpt_latest_encode(a->step, value, sizeof(value));
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "recording checkpoint step %" PRId64, a->step);
    }
    snprintf(what, sizeof(what), "recording checkpoint step %" PRId64 " at workers/ckpt/latest",
             a->step);
    st = rdzv_fence_put(a->etcd, &fence, key, value, 0, 0, what);
    if (st != RG_OK) {
        return st;
    }
    rg_debug("checkpoint step %" PRId64 " recorded at %s", a->step, key);
    return RG_OK;
}
