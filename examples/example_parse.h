/*
 * A whole-string integer parser for the examples' command lines and environment (the
 * library's own parser is private: examples use only <regroup/...>).
 */
#ifndef REGROUP_EXAMPLE_PARSE_H
#define REGROUP_EXAMPLE_PARSE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Base 10, the whole string, in int64_t's range: true and *out set; false on anything else. */
static inline bool example_parse_i64(const char *s, int64_t *out)
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

#endif
