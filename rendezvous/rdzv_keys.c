/* The key builders and agent ids of a job's layout (rdzv_keys.h, docs/etcd-keys.md). */
#include "rdzv_keys.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AGENT_HOST_MAX 64   /* keeps <host>-<pid>-<nonce> inside RG_RDZV_ID_MAX */

bool rdzv_keys_job_id_ok(const char *job)
{
    size_t n = job ? strlen(job) : 0;
    if (n == 0 || n > 64) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = job[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.')) {
            return false;
        }
    }
    return true;
}

rg_status_t rdzv_keys_init(rdzv_keys_t *keys, const char *job)
{
    size_t n = job ? strlen(job) : 0;

    if (keys == NULL || n == 0 || n > RDZV_JOB_MAX) {
        return rg_error(RG_EINVAL, "job id '%.*s' must have 1-%d characters", 64,
                        job ? job : "", RDZV_JOB_MAX);
    }
    for (size_t i = 0; i < n; i++) {
        /* '/' would make one job's keys another job's; spaces and controls break tools. */
        if (job[i] == '/' || job[i] < 0x21 || job[i] > 0x7e) {
            return rg_error(RG_EINVAL, "job id '%s': '/', spaces and control characters are "
                            "not allowed", job);
        }
    }
    int w = snprintf(keys->prefix, sizeof(keys->prefix), "/regroup/%s/", job);
    assert(w > 0 && (size_t)w < sizeof(keys->prefix));   /* RDZV_JOB_MAX leaves room */
    keys->len = (size_t)w;
    return RG_OK;
}

const char *rdzv_keys_prefix(const rdzv_keys_t *keys)
{
    return keys->prefix;
}

static rg_status_t keys_fmt(const rdzv_keys_t *k, char *buf, size_t cap, const char *fmt, ...)
    RG_PRINTF(4, 5);
static rg_status_t keys_fmt(const rdzv_keys_t *k, char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    int w;

    if (buf == NULL || cap <= k->len) {
        return rg_error(RG_EINVAL, "etcd key under %s does not fit in %zu bytes", k->prefix,
                        cap);
    }
    memcpy(buf, k->prefix, k->len);
    va_start(ap, fmt);
    w = vsnprintf(buf + k->len, cap - k->len, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= cap - k->len) {
        rg_status_t st = rg_error(RG_EINVAL, "etcd key %s%.40s... does not fit in %zu bytes",
                                  k->prefix, buf + k->len, cap);
        buf[0] = '\0';   /* a cut key must not be used by mistake */
        return st;
    }
    return RG_OK;
}

rg_status_t rdzv_keys_round(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "round");
}

rg_status_t rdzv_keys_layout(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "layout");
}

rg_status_t rdzv_keys_workers_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/");
}

rg_status_t rdzv_keys_workers_round_prefix(const rdzv_keys_t *k, int64_t r, char *buf,
                                           size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/rounds/%" PRId64 "/", r);
}

rg_status_t rdzv_keys_round_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/", r);
}

rg_status_t rdzv_keys_nodes_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/nodes/", r);
}

rg_status_t rdzv_keys_node(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                           size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/nodes/%s", r, agent);
}

rg_status_t rdzv_keys_closed(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/closed", r);
}

rg_status_t rdzv_keys_closer(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/closer", r);
}

/* The end of the range of every key under prefix (which ends in '/'): '/' + 1 is '0'. */
static void prefix_end(char *end)
{
    size_t n = strlen(end);
    assert(n > 0 && end[n - 1] == '/');
    end[n - 1] = '0';
}

rg_status_t rdzv_keys_watch_job(const rdzv_keys_t *k, rdzv_range_t out[2])
{
    rg_status_t st = keys_fmt(k, out[0].key, sizeof(out[0].key), "%s", "");
    if (st == RG_OK) {
        st = keys_fmt(k, out[0].end, sizeof(out[0].end), "rounds/");
    }
    if (st == RG_OK) {
        st = keys_fmt(k, out[1].key, sizeof(out[1].key), "rounds/");
    }
    if (st == RG_OK) {
        st = rdzv_keys_workers_prefix(k, out[1].end, sizeof(out[1].end));
    }
    if (st == RG_OK) {
        prefix_end(out[1].key);
    }
    return st;
}

rg_status_t rdzv_keys_watch_round(const rdzv_keys_t *k, int64_t r, bool nodes,
                                  rdzv_range_t *out)
{
    rg_status_t st = rdzv_keys_round_prefix(k, r, out->key, sizeof(out->key));
    if (st == RG_OK && nodes) {
        st = rdzv_keys_round_prefix(k, r, out->end, sizeof(out->end));
        if (st == RG_OK) {
            prefix_end(out->end);
        }
    } else if (st == RG_OK) {
        st = rdzv_keys_nodes_prefix(k, r, out->end, sizeof(out->end));
    }
    return st;
}

rg_status_t rdzv_keys_restart(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "restart");
}

rg_status_t rdzv_keys_done_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/done/", r);
}

rg_status_t rdzv_keys_done(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                           size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/done/%s", r, agent);
}

rg_status_t rdzv_keys_comm_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/rounds/%" PRId64 "/comm/", r);
}

rg_status_t rdzv_keys_waiting_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "waiting/");
}

rg_status_t rdzv_keys_waiting(const rdzv_keys_t *k, const char *agent, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "waiting/%s", agent);
}

rg_status_t rdzv_keys_failures_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "failures/");
}

rg_status_t rdzv_keys_failures_round_prefix(const rdzv_keys_t *k, int64_t r, char *buf,
                                            size_t cap)
{
    return keys_fmt(k, buf, cap, "failures/%" PRId64 "/", r);
}

rg_status_t rdzv_keys_failure(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                              size_t cap)
{
    return keys_fmt(k, buf, cap, "failures/%" PRId64 "/%s", r, agent);
}

rg_status_t rdzv_keys_status_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/status/");
}

rg_status_t rdzv_keys_progress_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/status/progress/");
}

rg_status_t rdzv_keys_progress(const rdzv_keys_t *k, int rank, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/status/progress/%d", rank);
}

rg_status_t rdzv_keys_restored(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/status/restored");
}

rg_status_t rdzv_keys_ckpt_latest(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "workers/ckpt/latest");
}

rg_status_t rdzv_keys_leaving_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/leaving/", r);
}

rg_status_t rdzv_keys_leaving(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                              size_t cap)
{
    return keys_fmt(k, buf, cap, "rounds/%" PRId64 "/leaving/%s", r, agent);
}

const char *rdzv_keys_tail(const char *key, const char *prefix)
{
    size_t n = strlen(prefix);
    if (key == NULL || strncmp(key, prefix, n) != 0 || key[n] == '\0') {
        return NULL;
    }
    return key + n;
}

/* ---- agent ids ----------------------------------------------------------------------------- */

void rdzv_agent_id_make(const char *host, pid_t pid, uint32_t nonce, char *buf)
{
    snprintf(buf, RG_RDZV_ID_MAX, "%.*s-%d-%08" PRIx32, AGENT_HOST_MAX,
             host && host[0] ? host : "node", (int)pid, nonce);
}

bool rdzv_agent_id_parse(const char *id, char *host, size_t host_cap, pid_t *pid)
{
    const char *nonce = id ? strrchr(id, '-') : NULL;
    const char *p;
    int64_t v = 0;

    if (nonce == NULL || nonce == id || strlen(nonce + 1) != 8 ||
        strspn(nonce + 1, "0123456789abcdef") != 8) {
        return false;
    }
    for (p = nonce - 1; p > id && *p >= '0' && *p <= '9'; p--) {
        /* back over the pid's digits to the '-' before them */
    }
    if (p == id || *p != '-' || p + 1 == nonce || nonce - (p + 1) > 10) {
        return false;
    }
    char digits[16];
    memcpy(digits, p + 1, (size_t)(nonce - (p + 1)));
    digits[nonce - (p + 1)] = '\0';
    if (!rg_parse_i64(digits, &v) || v <= 0 || v > INT32_MAX) {
        return false;
    }
    if (host != NULL) {
        size_t n = (size_t)(p - id);
        if (n >= host_cap) {
            return false;
        }
        memcpy(host, id, n);
        host[n] = '\0';
    }
    *pid = (pid_t)v;
    return true;
}
