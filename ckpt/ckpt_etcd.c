/* The committed step in etcd: /regroup/<job>/ckpt/latest = "<step>" (decimal). */
#include "ckpt_internal.h"

#include <regroup/etcd.h>

#include <inttypes.h>
#include <stdio.h>

rg_status_t ckpt_etcd_record(rg_etcd_t *etcd, const char *job, int64_t step)
{
    char key[512];
    char value[32];
    int64_t rev = 0;
    rg_status_t st;

    if (!ckpt_fmt(key, sizeof(key), "/regroup/%s/ckpt/latest", job)) {
        return rg_error(RG_EINVAL, "job id too long for an etcd key");
    }
    snprintf(value, sizeof(value), "%" PRId64, step);
    st = rg_etcd_put_str(etcd, key, value, 0, 0, &rev);
    if (st != RG_OK) {
        return rg_error_wrap(st, "recording checkpoint step %" PRId64 " at %s", step, key);
    }
    rg_debug("checkpoint step %" PRId64 " recorded at %s (revision %" PRId64 ")", step, key,
             rev);
    return RG_OK;
}
