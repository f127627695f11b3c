/* Status strings and the per-thread last-error message. */
#include "rg_common.h"

#include <stdio.h>
#include <string.h>

#define RG_ERRMSG_MAX 1024

static _Thread_local char errmsg[RG_ERRMSG_MAX];

const char *rg_status_str(rg_status_t status)
{
    switch (status) {
#define RG_STATUS_STR_(name, code, str) case RG_##name: return str;
    RG_STATUS_MAP(RG_STATUS_STR_)
#undef RG_STATUS_STR_
    }
    return "unknown status";
}

const char *rg_status_name(rg_status_t status)
{
    switch (status) {
#define RG_STATUS_NAME_(name, code, str) case RG_##name: return "RG_" #name;
    RG_STATUS_MAP(RG_STATUS_NAME_)
#undef RG_STATUS_NAME_
    }
    return "RG_UNKNOWN";
}

const char *rg_last_error(void)
{
    return errmsg;
}

rg_status_t rg_error(rg_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
    va_end(ap);
    rg_debug("error %s: %s", rg_status_name(status), errmsg);
    return status;
}

rg_status_t rg_error_wrap(rg_status_t status, const char *fmt, ...)
{
    char prefix[RG_ERRMSG_MAX];
    char old[RG_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof(old));
    /* Truncation of an over-long message is acceptable; build it piecewise. */
    size_t n = strnlen(prefix, sizeof(errmsg) - 1);
    memcpy(errmsg, prefix, n);
    snprintf(errmsg + n, sizeof(errmsg) - n, ": %.*s", (int)(sizeof(errmsg) - n),
             old[0] ? old : rg_status_str(status));
    return status;
}

void rg_error_clear(void)
{
    errmsg[0] = '\0';
}
