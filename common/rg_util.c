/* Time, the bounded buffer and small parsing helpers. */
#include "rg_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t rg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double rg_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t rg_deadline_left_ms(rg_deadline_t deadline)
{
    uint64_t now = rg_now_ns();
    if (deadline <= now) {
        return 0;
    }
    return (int64_t)((deadline - now + 999999ull) / 1000000ull);
}

bool rg_deadline_passed(rg_deadline_t deadline)
{
    return rg_now_ns() >= deadline;
}

void rg_sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void rg_dbuf_init(rg_dbuf_t *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

void rg_dbuf_cleanup(rg_dbuf_t *b)
{
    if (b == NULL) {
        return;
    }
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void rg_dbuf_reset(rg_dbuf_t *b)
{
    b->len = 0;
    if (b->data != NULL) {
        b->data[0] = '\0';
    }
}

static rg_status_t dbuf_reserve(rg_dbuf_t *b, size_t extra)
{
    size_t need;
    size_t cap;
    char *p;

    if (extra > b->max || b->len > b->max - extra) {
        return rg_error(RG_ETOOBIG, "buffer limit of %zu bytes exceeded", b->max);
    }
    need = b->len + extra + 1;
    if (need <= b->cap) {
        return RG_OK;
    }
    cap = b->cap ? b->cap : 256;
    while (cap < need) {
        cap *= 2;
    }
    p = realloc(b->data, cap);
    if (p == NULL) {
        return rg_error(RG_ENOMEM, "cannot grow buffer to %zu bytes", cap);
    }
    b->data = p;
    b->cap = cap;
    return RG_OK;
}

rg_status_t rg_dbuf_append(rg_dbuf_t *b, const void *p, size_t n)
{
    rg_status_t st = dbuf_reserve(b, n);
    if (st != RG_OK) {
        return st;
    }
    if (n > 0) {
        memcpy(b->data + b->len, p, n);
    }
    b->len += n;
    b->data[b->len] = '\0';
    return RG_OK;
}

rg_status_t rg_dbuf_printf(rg_dbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    rg_status_t st;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return rg_error(RG_EINVAL, "bad format string");
    }
    st = dbuf_reserve(b, (size_t)n);
    if (st != RG_OK) {
        return st;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return RG_OK;
}

void rg_dbuf_consume(rg_dbuf_t *b, size_t n)
{
    if (n >= b->len) {
        rg_dbuf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

bool rg_parse_i64(const char *s, int64_t *out)
{
    char *end;
    long long v;

    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return false;
    }
    *out = (int64_t)v;
    return true;
}

char *rg_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}
