/* base64 and JSON helpers for etcd's gateway encoding (see etcd_internal.h). */
#include "etcd_internal.h"

#include <stdlib.h>
#include <string.h>

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *etcd_b64_encode(const void *data, size_t len)
{
    const unsigned char *in = data;
    size_t out_len = 4 * ((len + 2) / 3);
    char *out = malloc(out_len + 1);
    size_t o = 0;

    if (out == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < len) {
            v |= (uint32_t)in[i + 1] << 8;
        }
        if (i + 2 < len) {
            v |= in[i + 2];
        }
        out[o++] = b64_alphabet[(v >> 18) & 63];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? b64_alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    if (c == '+') {
        return 62;
    }
    if (c == '/') {
        return 63;
    }
    return -1;
}

rg_status_t etcd_b64_decode(const char *in, char **out_p, size_t *len_p)
{
    size_t n = strlen(in);
    size_t o = 0;
    char *out;

    if (n % 4 != 0) {
        return rg_error(RG_EPROTO, "base64 field of length %zu is not a multiple of 4", n);
    }
    out = malloc(n / 4 * 3 + 1);
    if (out == NULL) {
        return rg_error(RG_ENOMEM, "base64 decode of %zu bytes", n);
    }
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            if (in[i + j] == '=' && i + 4 == n && j >= 2) {
                v[j] = 0;
                pad++;
            } else if (pad > 0 || (v[j] = b64_value(in[i + j])) < 0) {
                free(out);
                return rg_error(RG_EPROTO, "invalid base64 character at offset %zu", i + j);
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        out[o++] = (char)(w >> 16);
        if (pad < 2) {
            out[o++] = (char)(w >> 8);
        }
        if (pad < 1) {
            out[o++] = (char)w;
        }
    }
    out[o] = '\0';
    *out_p = out;
    *len_p = o;
    return RG_OK;
}

bool etcd_json_i64(const json_t *obj, const char *name, int64_t *out)
{
    const json_t *v = json_object_get(obj, name);
    if (v == NULL || json_is_null(v)) {
        *out = 0;
        return true;
    }
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    if (json_is_string(v)) {
        return rg_parse_i64(json_string_value(v), out);
    }
    return false;
}

bool etcd_json_bool(const json_t *obj, const char *name)
{
    return json_is_true(json_object_get(obj, name));
}

rg_status_t etcd_json_set_b64(json_t *obj, const char *name, const void *data, size_t len)
{
    char *enc = etcd_b64_encode(data, len);
    if (enc == NULL || json_object_set_new(obj, name, json_string(enc)) != 0) {
        free(enc);
        return rg_error(RG_ENOMEM, "building request field %s", name);
    }
    free(enc);
    return RG_OK;
}

rg_status_t etcd_json_set_i64(json_t *obj, const char *name, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    if (json_object_set_new(obj, name, json_string(buf)) != 0) {
        return rg_error(RG_ENOMEM, "building request field %s", name);
    }
    return RG_OK;
}

rg_status_t etcd_kv_parse(const json_t *obj, rg_etcd_kv_t *kv)
{
    const json_t *k = json_object_get(obj, "key");
    const json_t *v = json_object_get(obj, "value");
    rg_status_t st;

    memset(kv, 0, sizeof(*kv));
    if (!json_is_object(obj) || (k != NULL && !json_is_string(k)) ||
        (v != NULL && !json_is_string(v))) {
        return rg_error(RG_EPROTO, "kv is not an object with string key and value");
    }
    if (!etcd_json_i64(obj, "create_revision", &kv->create_revision) ||
        !etcd_json_i64(obj, "mod_revision", &kv->mod_revision) ||
        !etcd_json_i64(obj, "version", &kv->version) ||
        !etcd_json_i64(obj, "lease", &kv->lease)) {
        return rg_error(RG_EPROTO, "kv has a malformed integer field");
    }
    st = etcd_b64_decode(k ? json_string_value(k) : "", &kv->key, &kv->key_len);
    if (st != RG_OK) {
        return st;
    }
    st = etcd_b64_decode(v ? json_string_value(v) : "", &kv->value, &kv->value_len);
    if (st != RG_OK) {
        free(kv->key);
        kv->key = NULL;
        return st;
    }
    return RG_OK;
}

void rg_etcd_kv_cleanup(rg_etcd_kv_t *kv)
{
    if (kv == NULL) {
        return;
    }
    free(kv->key);
    free(kv->value);
    kv->key = NULL;
    kv->value = NULL;
}

char *etcd_prefix_end(const char *prefix, size_t *len_p)
{
    size_t n = strlen(prefix);
    char *end = malloc(n + 1);

    if (end == NULL) {
        return NULL;
    }
    memcpy(end, prefix, n + 1);
    /* Increment the last byte that is not 0xff, dropping the 0xff bytes after it. */
    while (n > 0) {
        unsigned char c = (unsigned char)end[n - 1];
        if (c < 0xff) {
            end[n - 1] = (char)(c + 1);
            end[n] = '\0';
            *len_p = n;
            return end;
        }
        n--;
    }
    /* All 0xff (or empty): every key from prefix on, which etcd spells "\0". */
    end[0] = '\0';
    *len_p = 1;
    return end;
}

rg_status_t etcd_json_set_range(json_t *obj, const char *key, const char *range_end,
                                bool prefix)
{
    rg_status_t st;

    if (key == NULL) {
        return rg_error(RG_EINVAL, "etcd: no key given");
    }
    if (strlen(key) > ETCD_MAX_KEY) {
        return rg_error(RG_EINVAL, "etcd: key of %zu bytes is over the %u byte limit",
                        strlen(key), ETCD_MAX_KEY);
    }
    st = etcd_json_set_b64(obj, "key", key, strlen(key));
    if (st != RG_OK) {
        return st;
    }
    if (prefix) {
        size_t len;
        char *end = etcd_prefix_end(key, &len);
        if (end == NULL) {
            return rg_error(RG_ENOMEM, "etcd: prefix end");
        }
        st = etcd_json_set_b64(obj, "range_end", end, len);
        free(end);
        return st;
    }
    if (range_end != NULL) {
        /* An empty range_end string means "\0": every key >= key. */
        return etcd_json_set_b64(obj, "range_end", range_end[0] ? range_end : "",
                                 range_end[0] ? strlen(range_end) : 1);
    }
    return RG_OK;
}

void etcd_describe_range(const char *key, size_t key_len, const char *range_end,
                         size_t end_len, char *out, size_t cap)
{
    size_t plen = 0;
    char *pend = NULL;

    if (cap == 0) {
        return;
    }
    if (range_end == NULL || end_len == 0) {
        snprintf(out, cap, "%.*s", (int)RG_MIN(key_len, 256), key);
        return;
    }
    if (key_len > 0 && memchr(key, '\0', key_len) == NULL) {
        char k[257];
        snprintf(k, sizeof(k), "%.*s", (int)RG_MIN(key_len, 256), key);
        pend = etcd_prefix_end(k, &plen);
    }
    if (pend != NULL && plen == end_len && memcmp(pend, range_end, end_len) == 0) {
        snprintf(out, cap, "%.*s*", (int)RG_MIN(key_len, 256), key);
    } else if (end_len == 1 && range_end[0] == '\0') {
        snprintf(out, cap, "%.*s and after", (int)RG_MIN(key_len, 256), key);
    } else {
        snprintf(out, cap, "[%.*s, %.*s)", (int)RG_MIN(key_len, 256), key,
                 (int)RG_MIN(end_len, 256), range_end);
    }
    free(pend);
}

/* Appends the range of a request object (its base64 key and range_end) to the list in out,
 * unless it is there already. */
static void describe_one(const json_t *req, char *out, size_t cap, size_t *n, bool *ranged)
{
    const char *k64 = json_string_value(json_object_get(req, "key"));
    const char *e64 = json_string_value(json_object_get(req, "range_end"));
    char *key = NULL;
    char *end = NULL;
    size_t key_len = 0;
    size_t end_len = 0;
    char one[600];

    if (k64 == NULL || etcd_b64_decode(k64, &key, &key_len) != RG_OK) {
        return;
    }
    if (e64 != NULL && etcd_b64_decode(e64, &end, &end_len) != RG_OK) {
        end = NULL;
        end_len = 0;
    }
    etcd_describe_range(key, key_len, end, end_len, one, sizeof(one));
    *ranged = *ranged || end_len > 0;
    free(key);
    free(end);
    /* One range per entry, separated by ", ": a repeat (a compare and a put of the same
     * key) is named once. */
    for (const char *p = out; (p = strstr(p, one)) != NULL; p++) {
        size_t l = strlen(one);
        if ((p == out || (p >= out + 2 && p[-2] == ',' && p[-1] == ' ')) &&
            (p[l] == '\0' || p[l] == ',')) {
            return;
        }
    }
    size_t used = strlen(out);
    if (used + 2 + strlen(one) + 1 < cap) {
        snprintf(out + used, cap - used, "%s%s", *n ? ", " : "", one);
        (*n)++;
    }
}

/* The ranges of a txn's compares and ops (nested txns too, to a small depth). */
static void describe_txn(const json_t *txn, char *out, size_t cap, size_t *n, bool *ranged,
                         int depth)
{
    static const char *const branches[] = {"success", "failure"};
    static const char *const ops[] = {"request_range", "request_put", "request_delete_range"};
    const json_t *cmps = json_object_get(txn, "compare");

    for (size_t i = 0; i < json_array_size(cmps); i++) {
        describe_one(json_array_get(cmps, i), out, cap, n, ranged);
    }
    for (size_t b = 0; b < RG_ARRAY_SIZE(branches); b++) {
        const json_t *arr = json_object_get(txn, branches[b]);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            const json_t *op = json_array_get(arr, i);
            for (size_t o = 0; o < RG_ARRAY_SIZE(ops); o++) {
                const json_t *req = json_object_get(op, ops[o]);
                if (req != NULL) {
                    describe_one(req, out, cap, n, ranged);
                }
            }
            const json_t *sub = json_object_get(op, "request_txn");
            if (sub != NULL && depth < 4) {
                describe_txn(sub, out, cap, n, ranged, depth + 1);
            }
        }
    }
}

void etcd_describe_keys(const json_t *body, char *out, size_t cap)
{
    char list[ETCD_MAX_DESCRIBE - 16];
    size_t n = 0;
    bool ranged = false;

    list[0] = '\0';
    if (json_object_get(body, "key") != NULL) {
        describe_one(body, list, sizeof(list), &n, &ranged);
    } else {
        describe_txn(body, list, sizeof(list), &n, &ranged, 0);
    }
    if (n == 0 && json_object_get(body, "ID") != NULL) {
        /* A lease revoke: etcd checks the keys attached to the lease. */
        int64_t id = 0;
        etcd_json_i64(body, "ID", &id);
        snprintf(out, cap, "the keys attached to lease %llx", (unsigned long long)id);
    } else if (n == 0) {
        snprintf(out, cap, "the request's keys");
    } else {
        /* etcd refuses a txn as a whole: any of its ranges may be the one. */
        snprintf(out, cap, "%s %s", n > 1 ? "one of the keys" : ranged ? "keys" : "key", list);
    }
}
