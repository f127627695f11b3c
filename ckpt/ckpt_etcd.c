/* The committed step in etcd: ckpt/latest of the job's keys (rendezvous/rdzv_keys.h). */
#include "ckpt_internal.h"
#include "rdzv_keys.h"

#include <regroup/etcd.h>

#include <inttypes.h>
#include <stdio.h>

rg_status_t ckpt_etcd_record(rg_etcd_t *etcd, const char *job, int64_t step)
{
    rdzv_keys_t keys;
    char key[RDZV_KEY_MAX];
    char value[RDZV_NUM_MAX];
    int64_t rev = 0;
    rg_status_t st;

    st = rdzv_keys_init(&keys, job);
    if (st == RG_OK) {
        st = rdzv_keys_ckpt_latest(&keys, key, sizeof(key));
    }
    if (st == RG_OK) {
        st = rdzv_rec_ckpt_latest_encode(step, value, sizeof(value));
    }
    if (st != RG_OK) {
        return rg_error_wrap(st, "recording checkpoint step %" PRId64, step);
    }
    st = rg_etcd_put_str(etcd, key, value, 0, 0, &rev);
    if (st != RG_OK) {
        return rg_error_wrap(st, "recording checkpoint step %" PRId64 " at %s", step, key);
    }
    rg_debug("checkpoint step %" PRId64 " recorded at %s (revision %" PRId64 ")", step, key,
             rev);
    return RG_OK;
}
