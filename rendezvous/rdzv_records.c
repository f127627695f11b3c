/*
 * The records of a job's layout (rdzv_keys.h): JSON through jansson, decimal text for the two
 * numbers. Decoders read only what etcd gave (bytes and length, no NUL needed), check the type
 * and range of every field and that every string fits, and refuse the rest with RG_EPROTO.
 */
#include "rdzv_keys.h"

#include <jansson.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- decimal text ---------------------------------------------------------------------- */

static rg_status_t num_encode(int64_t x, char *buf, size_t cap)
{
    int w = buf && cap ? snprintf(buf, cap, "%" PRId64, x) : -1;
    if (w < 0 || (size_t)w >= cap) {
        return rg_error(RG_EINVAL, "number %" PRId64 " does not fit in %zu bytes", x, cap);
    }
    return RG_OK;
}

static rg_status_t num_decode(const char *what, const char *v, size_t len, int64_t lo,
                              int64_t hi, int64_t *out)
{
    char text[RDZV_NUM_MAX];
    int64_t x;

    if (v == NULL || len == 0 || len >= sizeof(text)) {
        return rg_error(RG_EPROTO, "%s: %zu bytes, not a number", what, v ? len : 0);
    }
    memcpy(text, v, len);
    text[len] = '\0';
    /* Digits only: strtoll would also take spaces, a sign or a cut-off NUL. */
    if (strspn(text, "0123456789") != len || !rg_parse_i64(text, &x) || x < lo || x > hi) {
        return rg_error(RG_EPROTO, "%s holds '%.32s', not a number in %" PRId64 "..%" PRId64,
                        what, text, lo, hi);
    }
    *out = x;
    return RG_OK;
}

rg_status_t rdzv_rec_round_encode(int64_t r, char *buf, size_t cap)
{
    return num_encode(r, buf, cap);
}

rg_status_t rdzv_rec_round_decode(const char *v, size_t len, int64_t *r)
{
    return num_decode("round", v, len, 0, RDZV_ROUND_MAX, r);
}

rg_status_t rdzv_rec_ckpt_latest_encode(int64_t step, char *buf, size_t cap)
{
    return num_encode(step, buf, cap);
}

rg_status_t rdzv_rec_ckpt_latest_decode(const char *v, size_t len, int64_t *step)
{
    return num_decode("workers/ckpt/latest", v, len, 0, INT64_MAX, step);
}

bool rdzv_rec_layout_decode(const char *v, size_t len, char *name, size_t cap)
{
    if (v == NULL) {
        snprintf(name, cap, "1");
        return false;
    }
    snprintf(name, cap, "%.*s", (int)RG_MIN(len, cap > 0 ? cap - 1 : 0), v);
    return len == strlen(RDZV_LAYOUT) && memcmp(v, RDZV_LAYOUT, len) == 0;
}

/* ---- JSON field readers ---------------------------------------------------------------- */

static json_t *load(const char *what, const char *v, size_t len)
{
    json_t *j = NULL;
    if (v != NULL && len <= RDZV_REC_MAX) {
        j = json_loadb(v, len, JSON_REJECT_DUPLICATES, NULL);
    }
    if (!json_is_object(j)) {
        json_decref(j);
        rg_error(RG_EPROTO, "%s record is not a JSON object of at most %u bytes", what,
                 RDZV_REC_MAX);
        return NULL;
    }
    return j;
}

static bool get_i64(const json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *f = json_object_get(o, name);
    if (!json_is_integer(f) || json_integer_value(f) < lo || json_integer_value(f) > hi) {
        return false;
    }
    *out = json_integer_value(f);
    return true;
}

static bool get_int(const json_t *o, const char *name, int lo, int hi, int *out)
{
    int64_t x;
    if (!get_i64(o, name, lo, hi, &x)) {
        return false;
    }
    *out = (int)x;
    return true;
}

static bool get_real(const json_t *o, const char *name, double *out)
{
    json_t *f = json_object_get(o, name);
    if (!json_is_number(f)) {
        return false;
    }
    *out = json_number_value(f);
    return true;
}

/* Copies a string field that must fit in buf[cap] (NUL included). */
static bool get_str(const json_t *o, const char *name, char *buf, size_t cap)
{
    json_t *f = json_object_get(o, name);
    size_t n = json_string_length(f);
    if (!json_is_string(f) || n >= cap || strlen(json_string_value(f)) != n) {
        return false;
    }
    memcpy(buf, json_string_value(f), n + 1);
    return true;
}

/* {"agent","addr"}, the agent not empty: who a node, waiting, closed-member or leaving record
 * speaks of. */
static bool who_get(const json_t *o, char agent[RG_RDZV_ID_MAX], char addr[RG_RDZV_ADDR_MAX])
{
    return get_str(o, "agent", agent, RG_RDZV_ID_MAX) && agent[0] != '\0' &&
           get_str(o, "addr", addr, RG_RDZV_ADDR_MAX);
}

/* Serialises and frees doc; *text_p is malloc'd. */
static rg_status_t dump(const char *what, json_t *doc, char **text_p)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (text == NULL) {
        return rg_error(RG_ENOMEM, "%s record", what);
    }
    *text_p = text;
    return RG_OK;
}

/* ---- node descriptor and waiting record ------------------------------------------------ */

rg_status_t rdzv_rec_node_encode(const rdzv_node_rec_t *n, char **text_p)
{
    return dump("node", json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "agent", n->agent, "addr",
                                  n->addr, "nproc", n->nproc, "port", n->port, "prev_round",
                                  n->prev_round, "prev_rank", n->prev_rank),
                text_p);
}

rg_status_t rdzv_rec_node_decode(const char *v, size_t len, rdzv_node_rec_t *out)
{
    json_t *j = load("node", v, len);
    rdzv_node_rec_t n = {0};
    bool ok;

    if (j == NULL) {
        return RG_EPROTO;
    }
    ok = who_get(j, n.agent, n.addr) && get_int(j, "nproc", 0, 4096, &n.nproc) &&
         get_int(j, "port", 0, 65535, &n.port) &&
         get_int(j, "prev_round", -1, RDZV_ROUND_MAX, &n.prev_round) &&
         get_int(j, "prev_rank", -1, RG_RDZV_MAX_NODES * 2, &n.prev_rank);
    json_decref(j);
    if (!ok) {
        return rg_error(RG_EPROTO, "node record: a field is missing, of the wrong type or out "
                        "of range");
    }
    *out = n;
    return RG_OK;
}

rg_status_t rdzv_rec_waiting_encode(const rg_rdzv_member_t *m, char **text_p)
{
    return dump("waiting", json_pack("{s:s, s:s, s:i}", "agent", m->agent, "addr", m->addr,
                                     "nproc", m->nproc),
                text_p);
}

/* {"agent","addr","nproc"} into *m: the member entry of a closed record is the same shape. */
static bool member_get(const json_t *o, rg_rdzv_member_t *m)
{
    return who_get(o, m->agent, m->addr) && get_int(o, "nproc", 0, 4096, &m->nproc);
}

rg_status_t rdzv_rec_waiting_decode(const char *v, size_t len, rg_rdzv_member_t *out)
{
    json_t *j = load("waiting", v, len);
    rg_rdzv_member_t m;
    bool ok;

    if (j == NULL) {
        return RG_EPROTO;
    }
    ok = member_get(j, &m);
    json_decref(j);
    if (!ok) {
        return rg_error(RG_EPROTO, "waiting record: a field is missing or malformed");
    }
    *out = m;
    return RG_OK;
}

/* ---- closed record --------------------------------------------------------------------- */

/* A member's entry without its two strings: {"agent":"","addr":"","nproc":4096}, and a comma;
 * and the record's own fields (master_addr included) around the array, with room to spare. */
#define CLOSED_MEMBER_FIXED 36
#define CLOSED_HEAD_MAX     1024

size_t rdzv_addr_max(int max_nodes)
{
    size_t n = (size_t)RG_MAX(max_nodes, 1);
    size_t per = (RDZV_CLOSED_MAX - CLOSED_HEAD_MAX) / n;
    size_t fixed = CLOSED_MEMBER_FIXED + (RG_RDZV_ID_MAX - 1);
    return per <= fixed ? 0 : RG_MIN(per - fixed, (size_t)RG_RDZV_ADDR_MAX - 1);
}

bool rdzv_addr_ok(const char *addr, int max_nodes)
{
    size_t n = addr ? strlen(addr) : 0;
    if (n == 0 || n > rdzv_addr_max(max_nodes)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = addr[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("._:%-[]", c) != NULL)) {
            return false;
        }
    }
    return true;
}

rg_status_t rdzv_rec_closed_encode(const rg_rdzv_assignment_t *a, double time, char **text_p)
{
    json_t *members = json_array();

    if (a->n_members < 1 || a->n_members > RG_RDZV_MAX_NODES) {
        json_decref(members);
        return rg_error(RG_EINVAL, "closed record: %d members", a->n_members);
    }
    for (int i = 0; i < a->n_members && members != NULL; i++) {
        const rg_rdzv_member_t *m = &a->members[i];
        if (json_array_append_new(members, json_pack("{s:s, s:s, s:i}", "agent", m->agent,
                                                     "addr", m->addr, "nproc", m->nproc)) != 0) {
            json_decref(members);
            members = NULL;
        }
    }
    if (members == NULL) {
        return rg_error(RG_ENOMEM, "closed record");
    }
    return dump("closed",
                json_pack("{s:o, s:i, s:i, s:b, s:s, s:i, s:f}", "members", members,
                          "restarts", a->restart_count, "excused", a->excused_count, "failed",
                          a->job_failed, "master_addr", a->master_addr, "master_port",
                          a->master_port, "time", time),
                text_p);
}

rg_status_t rdzv_rec_closed_decode(const char *v, size_t len, int64_t r,
                                   rg_rdzv_assignment_t *a)
{
    json_t *j = load("closed", v, len);
    json_t *members = json_object_get(j, "members");
    json_t *failed = json_object_get(j, "failed");
    size_t n = json_array_size(members);
    bool ok;

    memset(a, 0, sizeof(*a));
    if (j == NULL) {
        return rg_error_wrap(RG_EPROTO, "round %" PRId64, r);
    }
    a->round = (int)r;
    a->group_rank = -1;
    ok = json_is_array(members) && n >= 1 && n <= RG_RDZV_MAX_NODES && json_is_boolean(failed) &&
         get_int(j, "restarts", 0, INT32_MAX, &a->restart_count) &&
         get_str(j, "master_addr", a->master_addr, sizeof(a->master_addr)) &&
         get_int(j, "master_port", 0, 65535, &a->master_port) &&
         (json_object_get(j, "excused") == NULL ||   /* older agents did not write it */
          get_int(j, "excused", 0, INT32_MAX, &a->excused_count));
    for (size_t i = 0; ok && i < n; i++) {
        ok = member_get(json_array_get(members, i), &a->members[i]);
        a->world_size += ok ? a->members[i].nproc : 0;
    }
    json_decref(j);
    if (!ok) {
        memset(a, 0, sizeof(*a));
        return rg_error(RG_EPROTO, "round %" PRId64 "'s closed record is malformed", r);
    }
    a->job_failed = json_is_true(failed);
    a->n_members = (int)n;
    a->group_world = (int)n;
    return RG_OK;
}

rg_status_t rdzv_rec_closed_time(const char *v, size_t len, double *time)
{
    json_t *j = load("closed", v, len);
    double t = -1;
    if (j == NULL) {
        return RG_EPROTO;
    }
    if (!get_real(j, "time", &t) || !(t >= 0)) {
        t = -1;
    }
    json_decref(j);
    *time = t;
    return RG_OK;
}

/* ---- done record ----------------------------------------------------------------------- */

rg_status_t rdzv_rec_done_encode(double time, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "{\"time\":%.3f}", time);
    if (n < 0 || (size_t)n >= cap) {
        return rg_error(RG_EINVAL, "done record: buffer of %zu bytes", cap);
    }
    return RG_OK;
}

rg_status_t rdzv_rec_done_decode(const char *v, size_t len, double *time)
{
    json_t *j;
    double t;
    bool ok;

    if (v != NULL && len == strlen(RDZV_DONE_VALUE) && memcmp(v, RDZV_DONE_VALUE, len) == 0) {
        *time = -1;   /* an older agent's: no time recorded */
        return RG_OK;
    }
    j = load("done", v, len);
    if (j == NULL) {
        return RG_EPROTO;
    }
    ok = get_real(j, "time", &t) && t >= 0;
    json_decref(j);
    if (!ok) {
        return rg_error(RG_EPROTO, "done record has no time in wall seconds");
    }
    *time = t;
    return RG_OK;
}

int rdzv_assignment_find(const rg_rdzv_assignment_t *a, const char *agent)
{
    for (int i = 0; i < a->n_members; i++) {
        if (strcmp(a->members[i].agent, agent) == 0) {
            return i;
        }
    }
    return -1;
}

int rdzv_assignment_find_pid(const rg_rdzv_assignment_t *a, const char *host, pid_t pid)
{
    for (int i = 0; i < a->n_members; i++) {
        char h[RG_RDZV_ID_MAX];
        pid_t p;
        if (rdzv_agent_id_parse(a->members[i].agent, h, sizeof(h), &p) && p == pid &&
            (host == NULL || strcmp(h, host) == 0)) {
            return i;
        }
    }
    return -1;
}

void rdzv_assignment_locate(rg_rdzv_assignment_t *a, const char *agent)
{
    int offset = 0;
    a->group_rank = rdzv_assignment_find(a, agent);
    a->rank_offset = 0;
    for (int i = 0; i < a->group_rank; i++) {
        offset += a->members[i].nproc;
    }
    if (a->group_rank >= 0) {
        a->rank_offset = offset;
    }
}

/* ---- failure marker -------------------------------------------------------------------- */

rg_status_t rdzv_rec_failure_encode(const rdzv_failure_rec_t *f, char **text_p)
{
    return dump("failure",
                json_pack("{s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:s, s:s}", "round",
                          f->round, "agent", f->agent, "addr", f->addr, "rank", f->rank,
                          "local_rank", f->local_rank, "exit_code", f->exit_code, "signal",
                          f->signal, "time", f->time, "error", f->error ? f->error : "",
                          "stderr_tail", f->stderr_tail ? f->stderr_tail : ""),
                text_p);
}

rg_status_t rdzv_rec_failure_decode(const char *v, size_t len, rdzv_failure_rec_t *out)
{
    json_t *j = load("failure", v, len);
    json_t *err = json_object_get(j, "error");
    json_t *tail = json_object_get(j, "stderr_tail");
    rdzv_failure_rec_t f = {0};
    bool ok;

    if (j == NULL) {
        return RG_EPROTO;
    }
    ok = get_int(j, "round", 0, RDZV_ROUND_MAX, &f.round) &&
         get_str(j, "agent", f.agent, sizeof(f.agent)) &&
         get_str(j, "addr", f.addr, sizeof(f.addr)) &&
         get_int(j, "rank", -1, INT32_MAX, &f.rank) &&
         get_int(j, "local_rank", -1, INT32_MAX, &f.local_rank) &&
         get_int(j, "exit_code", -1, 255, &f.exit_code) &&
         get_int(j, "signal", 0, 127, &f.signal) && get_real(j, "time", &f.time) &&
         json_is_string(err) && json_is_string(tail);
    if (ok) {
        /* One block for both strings: the record owns one allocation. */
        size_t ne = json_string_length(err);
        size_t nt = json_string_length(tail);
        f.mem = malloc(ne + nt + 2);
        if (f.mem == NULL) {
            json_decref(j);
            return rg_error(RG_ENOMEM, "failure record");
        }
        memcpy(f.mem, json_string_value(err), ne + 1);
        memcpy(f.mem + ne + 1, json_string_value(tail), nt + 1);
        f.error = f.mem;
        f.stderr_tail = f.mem + ne + 1;
    }
    json_decref(j);
    if (!ok) {
        return rg_error(RG_EPROTO, "failure record: a field is missing, of the wrong type or "
                        "out of range");
    }
    *out = f;
    return RG_OK;
}

void rdzv_rec_failure_cleanup(rdzv_failure_rec_t *f)
{
    if (f == NULL) {
        return;
    }
    free(f->mem);
    f->mem = NULL;
    f->error = NULL;
    f->stderr_tail = NULL;
}

/* ---- progress and restored records ----------------------------------------------------- */

static bool metric_name_ok(const char *s)
{
    size_t n = strnlen(s, RDZV_METRIC_NAME_MAX + 1);
    if (n == 0 || n > RDZV_METRIC_NAME_MAX) {
        return false;
    }
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

rg_status_t rdzv_rec_progress_encode(const rdzv_progress_rec_t *p, char *buf, size_t cap)
{
    rg_dbuf_t b;
    rg_status_t st;

    if (p->n_metrics > RDZV_PROGRESS_METRICS) {
        return rg_error(RG_EINVAL, "progress record: %zu metrics, at most %d", p->n_metrics,
                        RDZV_PROGRESS_METRICS);
    }
    /* Written by hand, not by jansson: the text stays as short as the values need (%.6g). */
    rg_dbuf_init(&b, cap ? cap - 1 : 0);
    st = rg_dbuf_printf(&b, "{\"step\":%" PRId64 ",\"epoch\":%" PRId64 ",\"round\":%d,"
                        "\"time\":%.3f,\"metrics\":{", p->step, p->epoch, p->round, p->time);
    for (size_t i = 0; st == RG_OK && i < p->n_metrics; i++) {
        if (!metric_name_ok(p->metrics[i].name)) {
            st = rg_error(RG_EINVAL, "progress record: metric name '%.64s' is not 1-64 "
                          "characters of [A-Za-z0-9_.-]", p->metrics[i].name);
        } else if (isfinite(p->metrics[i].value)) {
            st = rg_dbuf_printf(&b, "%s\"%s\":%.6g", i ? "," : "", p->metrics[i].name,
                                p->metrics[i].value);
        } else {
            st = rg_dbuf_printf(&b, "%s\"%s\":null", i ? "," : "", p->metrics[i].name);
        }
    }
    if (st == RG_OK) {
        st = rg_dbuf_printf(&b, "}");
    }
    if (st == RG_OK && p->measured && p->compute >= 0 && p->compute <= 1) {
        st = rg_dbuf_printf(&b, ",\"compute\":%.3f", p->compute);
        if (st == RG_OK && p->slow > 0 && isfinite(p->slow)) {
            st = rg_dbuf_printf(&b, ",\"slow\":%.2f", p->slow);
        }
        if (st == RG_OK && p->slow_s > 0 && isfinite(p->slow_s)) {
            st = rg_dbuf_printf(&b, ",\"slow_s\":%.1f", p->slow_s);
        }
    }
    if (st == RG_OK) {
        st = rg_dbuf_printf(&b, "}");
    }
    if (st == RG_OK) {
        memcpy(buf, b.data, b.len + 1);
    } else if (st == RG_ETOOBIG) {
        st = rg_error(RG_EINVAL, "progress record does not fit in %zu bytes", cap);
    }
    rg_dbuf_cleanup(&b);
    return st;
}

rg_status_t rdzv_rec_progress_decode(const char *v, size_t len, rdzv_progress_rec_t *out)
{
    json_t *j = load("progress", v, len);
    json_t *metrics = json_object_get(j, "metrics");
    rdzv_progress_rec_t *p;
    const char *name;
    json_t *value;
    bool ok;

    if (j == NULL) {
        return RG_EPROTO;
    }
    p = calloc(1, sizeof(*p));
    if (p == NULL) {
        json_decref(j);
        return rg_error(RG_ENOMEM, "progress record");
    }
    ok = get_i64(j, "step", 0, INT64_MAX, &p->step) &&
         get_i64(j, "epoch", INT64_MIN, INT64_MAX, &p->epoch) &&
         get_int(j, "round", 0, RDZV_ROUND_MAX, &p->round) && get_real(j, "time", &p->time) &&
         json_is_object(metrics) && json_object_size(metrics) <= RDZV_PROGRESS_METRICS;
    if (ok && json_object_get(j, "compute") != NULL) {
        p->measured = true;
        ok = get_real(j, "compute", &p->compute) && p->compute >= 0 && p->compute <= 1;
    }
    if (ok && json_object_get(j, "slow") != NULL) {
        ok = get_real(j, "slow", &p->slow) && p->slow >= 0;
    }
    if (ok && json_object_get(j, "slow_s") != NULL) {
        ok = get_real(j, "slow_s", &p->slow_s) && p->slow_s >= 0;
    }
    json_object_foreach(metrics, name, value) {
        if (!ok) {
            break;
        }
        size_t i = p->n_metrics++;
        ok = metric_name_ok(name) && (json_is_number(value) || json_is_null(value));
        if (ok) {
            snprintf(p->metrics[i].name, sizeof(p->metrics[i].name), "%s", name);
            p->metrics[i].value = json_is_null(value) ? NAN : json_number_value(value);
        }
    }
    json_decref(j);
    if (ok) {
        *out = *p;
    }
    free(p);
    return ok ? RG_OK
              : rg_error(RG_EPROTO, "progress record: a field is missing, of the wrong type or "
                         "out of range");
}

rg_status_t rdzv_rec_restored_encode(const rdzv_restored_rec_t *r, char *buf, size_t cap)
{
    int w = snprintf(buf, cap, "{\"round\":%d,\"step\":%" PRId64 "}", r->round, r->step);
    if (w < 0 || (size_t)w >= cap) {
        return rg_error(RG_EINVAL, "restored record does not fit in %zu bytes", cap);
    }
    return RG_OK;
}

rg_status_t rdzv_rec_restored_decode(const char *v, size_t len, rdzv_restored_rec_t *out)
{
    json_t *j = load("restored", v, len);
    rdzv_restored_rec_t r;
    bool ok;

    if (j == NULL) {
        return RG_EPROTO;
    }
    ok = get_int(j, "round", 0, RDZV_ROUND_MAX, &r.round) &&
         get_i64(j, "step", 0, INT64_MAX, &r.step);
    json_decref(j);
    if (!ok) {
        return rg_error(RG_EPROTO, "restored record: a field is missing or malformed");
    }
    *out = r;
    return RG_OK;
}

/* ---- leaving record ----------------------------------------------------------------------- */

rg_status_t rdzv_rec_leaving_encode(const rdzv_leaving_rec_t *l, char **text_p)
{
    if (!isfinite(l->deadline) || !isfinite(l->time) ||
        strlen(l->reason) >= sizeof(l->reason)) {
        return rg_error(RG_EINVAL, "leaving record: bad deadline, time or reason");
    }
    return dump("leaving", json_pack("{s:s, s:s, s:s, s:f, s:f}", "agent", l->agent, "addr",
                                     l->addr, "reason", l->reason, "deadline", l->deadline,
                                     "time", l->time),
                text_p);
}

rg_status_t rdzv_rec_leaving_decode(const char *v, size_t len, rdzv_leaving_rec_t *out)
{
    json_t *j = load("leaving", v, len);
    rdzv_leaving_rec_t l = {0};
    bool ok;

    if (j == NULL) {
        return RG_EPROTO;
    }
    ok = who_get(j, l.agent, l.addr) && get_str(j, "reason", l.reason, sizeof(l.reason)) &&
         get_real(j, "deadline", &l.deadline) && isfinite(l.deadline) &&
         get_real(j, "time", &l.time) && isfinite(l.time);
    json_decref(j);
    if (!ok) {
        return rg_error(RG_EPROTO, "leaving record: a field is missing or malformed");
    }
    *out = l;
    return RG_OK;
}
