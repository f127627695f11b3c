/* The etcd client handle and its key-value calls: range, put, delete, txn. */
#include "etcd_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ETCD_MAX_TXN_OPS 128

rg_status_t rg_etcd_create(const rg_etcd_params_t *params, rg_etcd_t **client_p)
{
    rg_etcd_t *c;
    rg_status_t st;

    if (client_p == NULL) {
        return rg_error(RG_EINVAL, "etcd: client_p is NULL");
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return rg_error(RG_ENOMEM, "etcd: client");
    }
    st = etcd_conn_init(&c->conn, params);
    if (st != RG_OK) {
        free(c);
        return st;
    }
    pthread_mutex_init(&c->lock, NULL);
    *client_p = c;
    return RG_OK;
}

void rg_etcd_destroy(rg_etcd_t *client)
{
    if (client == NULL) {
        return;
    }
    etcd_conn_cleanup(&client->conn);
    pthread_mutex_destroy(&client->lock);
    free(client);
}

const char *rg_etcd_endpoint(const rg_etcd_t *client)
{
    return client->conn.urls[client->conn.current];
}

void rg_etcd_stats_add(const rg_etcd_t *client, rg_etcd_stats_t *sum)
{
    if (client != NULL) {
        etcd_conn_stats_add(&client->conn, sum);
    }
}

rg_status_t etcd_client_call(rg_etcd_t *client, const char *path, json_t *body,
                             rg_deadline_t deadline, json_t **reply_p)
{
    rg_status_t st;
    pthread_mutex_lock(&client->lock);
    st = etcd_conn_call(&client->conn, path, body, deadline, reply_p);
    pthread_mutex_unlock(&client->lock);
    return st;
}

rg_status_t etcd_header_revision(const json_t *reply, int64_t *rev)
{
    if (!etcd_json_i64(json_object_get(reply, "header"), "revision", rev)) {
        return rg_error(RG_EPROTO, "etcd: malformed header revision");
    }
    return RG_OK;
}

/* ---- request builders (shared by the plain calls and txn ops) --------------------------- */

/* Each fills the request object b (op_body makes it and frees it on an error). */
static rg_status_t range_fill(json_t *b, const rg_etcd_range_req_t *req)
{
    rg_status_t st = etcd_json_set_range(b, req->key, req->range_end, req->prefix);
    if (st == RG_OK && req->limit > 0) {
        st = etcd_json_set_i64(b, "limit", req->limit);
    }
    if (st == RG_OK && req->revision > 0) {
        st = etcd_json_set_i64(b, "revision", req->revision);
    }
    if (st == RG_OK && req->keys_only) {
        json_object_set_new(b, "keys_only", json_true());
    }
    if (st == RG_OK && req->count_only) {
        json_object_set_new(b, "count_only", json_true());
    }
    if (st == RG_OK && req->min_mod_revision > 0) {
        st = etcd_json_set_i64(b, "min_mod_revision", req->min_mod_revision);
    }
    if (st == RG_OK && (req->limit < 0 || req->revision < 0 || req->min_mod_revision < 0)) {
        st = rg_error(RG_EINVAL, "etcd: negative limit or revision in range of %s", req->key);
    }
    return st;
}

static rg_status_t put_fill(json_t *b, const rg_etcd_put_req_t *req)
{
    rg_status_t st = etcd_json_set_range(b, req->key, NULL, false);
    if (st == RG_OK && req->value == NULL && req->value_len > 0) {
        st = rg_error(RG_EINVAL, "etcd: put of %s has a length but no value", req->key);
    }
    if (st == RG_OK) {
        st = etcd_json_set_b64(b, "value", req->value ? req->value : "", req->value_len);
    }
    if (st == RG_OK && req->lease != 0) {
        st = etcd_json_set_i64(b, "lease", req->lease);
    }
    if (st == RG_OK && req->prev_kv) {
        json_object_set_new(b, "prev_kv", json_true());
    }
    return st;
}

static rg_status_t delete_fill(json_t *b, const rg_etcd_delete_req_t *req)
{
    rg_status_t st = etcd_json_set_range(b, req->key, req->range_end, req->prefix);
    if (st == RG_OK && req->prev_kv) {
        json_object_set_new(b, "prev_kv", json_true());
    }
    return st;
}

/* ---- response parsers ------------------------------------------------------------------- */

/* Frees kvs[0..n) and the array. */
static void kvs_free(rg_etcd_kv_t *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rg_etcd_kv_cleanup(&kvs[i]);
    }
    free(kvs);
}

static rg_status_t parse_kvs(const json_t *arr, rg_etcd_kv_t **kvs_p, size_t *n_p)
{
    size_t n = json_array_size(arr);
    rg_etcd_kv_t *kvs;

    *kvs_p = NULL;
    *n_p = 0;
    if (arr == NULL) {
        return RG_OK;
    }
    if (!json_is_array(arr)) {
        return rg_error(RG_EPROTO, "etcd: kvs is not an array");
    }
    if (n == 0) {
        return RG_OK;
    }
    kvs = calloc(n, sizeof(*kvs));
    if (kvs == NULL) {
        return rg_error(RG_ENOMEM, "etcd: %zu kvs", n);
    }
    for (size_t i = 0; i < n; i++) {
        rg_status_t st = etcd_kv_parse(json_array_get(arr, i), &kvs[i]);
        if (st != RG_OK) {
            kvs_free(kvs, i);
            return st;
        }
    }
    *kvs_p = kvs;
    *n_p = n;
    return RG_OK;
}

static rg_status_t parse_range(const json_t *r, rg_etcd_range_t *res)
{
    memset(res, 0, sizeof(*res));
    if (!json_is_object(r) || !etcd_json_i64(r, "count", &res->count) ||
        etcd_header_revision(r, &res->revision) != RG_OK) {
        return rg_error(RG_EPROTO, "etcd: malformed range response");
    }
    res->more = etcd_json_bool(r, "more");
    return parse_kvs(json_object_get(r, "kvs"), &res->kvs, &res->n_kvs);
}

static rg_status_t parse_put(const json_t *r, rg_etcd_put_t *res)
{
    const json_t *prev = json_object_get(r, "prev_kv");
    rg_status_t st;

    memset(res, 0, sizeof(*res));
    if (!json_is_object(r) || etcd_header_revision(r, &res->revision) != RG_OK) {
        return rg_error(RG_EPROTO, "etcd: malformed put response");
    }
    if (prev != NULL) {
        st = etcd_kv_parse(prev, &res->prev);
        if (st != RG_OK) {
            return st;
        }
        res->has_prev = true;
    }
    return RG_OK;
}

static rg_status_t parse_delete(const json_t *r, rg_etcd_delete_t *res)
{
    memset(res, 0, sizeof(*res));
    if (!json_is_object(r) || !etcd_json_i64(r, "deleted", &res->deleted) ||
        etcd_header_revision(r, &res->revision) != RG_OK) {
        return rg_error(RG_EPROTO, "etcd: malformed delete response");
    }
    return parse_kvs(json_object_get(r, "prev_kvs"), &res->prev_kvs, &res->n_prev);
}

/* ---- plain calls: each is one op, sent on its own ------------------------------------ */

static json_t *op_body(const rg_etcd_op_t *op, rg_status_t *st);
static rg_status_t parse_op_body(const json_t *r, rg_etcd_op_type_t type,
                                 rg_etcd_op_result_t *out);
static void op_result_cleanup(rg_etcd_op_result_t *r);

/* Sends op and parses its response into *out, or, for a caller that does not want the
 * response (out NULL), checks it and frees it. */
static rg_status_t kv_call(rg_etcd_t *client, const rg_etcd_op_t *op, rg_deadline_t deadline,
                           rg_etcd_op_result_t *out)
{
    static const char *const paths[] = {"/v3/kv/range", "/v3/kv/put", "/v3/kv/deleterange"};
    json_t *body;
    json_t *reply = NULL;
    rg_etcd_op_result_t unwanted;
    rg_status_t st;

    if (client == NULL) {
        return rg_error(RG_EINVAL, "etcd %s: NULL client", paths[op->type]);
    }
    body = op_body(op, &st);
    if (body == NULL) {
        return st;
    }
    st = etcd_client_call(client, paths[op->type], body, deadline, &reply);
    json_decref(body);
    if (st != RG_OK) {
        return st;
    }
    st = parse_op_body(reply, op->type, out ? out : &unwanted);
    json_decref(reply);
    if (st == RG_OK && out == NULL) {
        op_result_cleanup(&unwanted);
    }
    return st;
}

rg_status_t rg_etcd_range(rg_etcd_t *client, const rg_etcd_range_req_t *req,
                          rg_deadline_t deadline, rg_etcd_range_t *res)
{
    rg_etcd_op_result_t out;
    rg_status_t st;

    if (req == NULL || res == NULL) {
        return rg_error(RG_EINVAL, "etcd range: NULL argument");
    }
    rg_etcd_op_t op = {.type = RG_ETCD_OP_RANGE, .u.range = *req};
    st = kv_call(client, &op, deadline, &out);
    if (st == RG_OK) {
        *res = out.u.range;
    }
    return st;
}

void rg_etcd_range_cleanup(rg_etcd_range_t *res)
{
    if (res == NULL) {
        return;
    }
    kvs_free(res->kvs, res->n_kvs);
    res->kvs = NULL;
    res->n_kvs = 0;
}

rg_status_t rg_etcd_get(rg_etcd_t *client, const char *key, rg_deadline_t deadline,
                        char **value_p, size_t *len_p, int64_t *mod_revision_p)
{
    rg_etcd_range_req_t req = {.key = key};
    rg_etcd_range_t res;
    rg_status_t st;

    if (value_p == NULL || len_p == NULL) {
        return rg_error(RG_EINVAL, "etcd get: NULL out-parameter");
    }
    st = rg_etcd_range(client, &req, deadline, &res);
    if (st != RG_OK) {
        return st;
    }
    if (res.n_kvs == 0) {
        rg_etcd_range_cleanup(&res);
        return rg_error(RG_ENOENT, "etcd: key %s not found", key);
    }
    *value_p = res.kvs[0].value;
    *len_p = res.kvs[0].value_len;
    if (mod_revision_p != NULL) {
        *mod_revision_p = res.kvs[0].mod_revision;
    }
    res.kvs[0].value = NULL;
    rg_etcd_range_cleanup(&res);
    return RG_OK;
}

rg_status_t rg_etcd_put(rg_etcd_t *client, const rg_etcd_put_req_t *req,
                        rg_deadline_t deadline, rg_etcd_put_t *res)
{
    rg_etcd_op_result_t out;
    rg_status_t st;

    if (req == NULL) {
        return rg_error(RG_EINVAL, "etcd put: NULL argument");
    }
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT, .u.put = *req};
    st = kv_call(client, &op, deadline, res ? &out : NULL);
    if (st == RG_OK && res != NULL) {
        *res = out.u.put;
    }
    return st;
}

rg_status_t rg_etcd_put_str(rg_etcd_t *client, const char *key, const char *value,
                            int64_t lease, rg_deadline_t deadline, int64_t *revision_p)
{
    rg_etcd_put_req_t req = {.key = key, .value = value,
                             .value_len = value ? strlen(value) : 0, .lease = lease};
    rg_etcd_put_t res;
    rg_status_t st = rg_etcd_put(client, &req, deadline, &res);
    if (st == RG_OK && revision_p != NULL) {
        *revision_p = res.revision;
    }
    if (st == RG_OK) {
        rg_etcd_put_cleanup(&res);
    }
    return st;
}

void rg_etcd_put_cleanup(rg_etcd_put_t *res)
{
    if (res != NULL && res->has_prev) {
        rg_etcd_kv_cleanup(&res->prev);
        res->has_prev = false;
    }
}

rg_status_t rg_etcd_delete(rg_etcd_t *client, const rg_etcd_delete_req_t *req,
                           rg_deadline_t deadline, rg_etcd_delete_t *res)
{
    rg_etcd_op_result_t out;
    rg_status_t st;

    if (req == NULL) {
        return rg_error(RG_EINVAL, "etcd delete: NULL argument");
    }
    rg_etcd_op_t op = {.type = RG_ETCD_OP_DELETE, .u.del = *req};
    st = kv_call(client, &op, deadline, res ? &out : NULL);
    if (st == RG_OK && res != NULL) {
        *res = out.u.del;
    }
    return st;
}

void rg_etcd_delete_cleanup(rg_etcd_delete_t *res)
{
    if (res == NULL) {
        return;
    }
    kvs_free(res->prev_kvs, res->n_prev);
    res->prev_kvs = NULL;
    res->n_prev = 0;
}

/* ---- transactions ----------------------------------------------------------------------- */

static const char *const cmp_targets[] = {"VALUE", "VERSION", "CREATE", "MOD", "LEASE"};
static const char *const cmp_fields[] = {"value", "version", "create_revision",
                                         "mod_revision", "lease"};
static const char *const cmp_results[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};

static json_t *cmp_json(const rg_etcd_cmp_t *c, rg_status_t *st)
{
    json_t *j = json_object();

    if (j == NULL) {
        *st = rg_error(RG_ENOMEM, "etcd: txn compare");
        return NULL;
    }
    if ((unsigned)c->target >= RG_ARRAY_SIZE(cmp_targets) ||
        (unsigned)c->result >= RG_ARRAY_SIZE(cmp_results)) {
        *st = rg_error(RG_EINVAL, "etcd: txn compare on %s has a bad target or result",
                       c->key ? c->key : "(null)");
        json_decref(j);
        return NULL;
    }
    *st = etcd_json_set_range(j, c->key, c->range_end, false);
    /* Both enums default to value 0, which etcd omits when echoing: always send them. */
    json_object_set_new(j, "target", json_string(cmp_targets[c->target]));
    json_object_set_new(j, "result", json_string(cmp_results[c->result]));
    if (*st == RG_OK) {
        if (c->target == RG_ETCD_CMP_VALUE) {
            *st = etcd_json_set_b64(j, "value", c->value ? c->value : "", c->value_len);
        } else {
            *st = etcd_json_set_i64(j, cmp_fields[c->target], c->number);
        }
    }
    if (*st != RG_OK) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *op_body(const rg_etcd_op_t *op, rg_status_t *st)
{
    static const char *const names[] = {"range", "put", "delete"};
    json_t *b;

    if ((unsigned)op->type >= RG_ARRAY_SIZE(names)) {
        *st = rg_error(RG_EINVAL, "etcd: op of unknown type %d", (int)op->type);
        return NULL;
    }
    b = json_object();
    if (b == NULL) {
        *st = rg_error(RG_ENOMEM, "etcd: %s request", names[op->type]);
        return NULL;
    }
    switch (op->type) {
    case RG_ETCD_OP_RANGE:
        *st = range_fill(b, &op->u.range);
        break;
    case RG_ETCD_OP_PUT:
        *st = put_fill(b, &op->u.put);
        break;
    case RG_ETCD_OP_DELETE:
        *st = delete_fill(b, &op->u.del);
        break;
    }
    if (*st != RG_OK) {
        json_decref(b);
        return NULL;
    }
    return b;
}

static json_t *op_json(const rg_etcd_op_t *op, rg_status_t *st)
{
    static const char *const names[] = {"request_range", "request_put",
                                        "request_delete_range"};
    json_t *inner = op_body(op, st);
    return inner ? json_pack("{s:o}", names[op->type], inner) : NULL;
}

static rg_status_t add_ops(json_t *body, const char *name, const rg_etcd_op_t *ops, size_t n)
{
    json_t *arr = json_array();
    rg_status_t st = RG_OK;

    if (arr == NULL) {
        return rg_error(RG_ENOMEM, "etcd: txn");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *j = op_json(&ops[i], &st);
        if (j == NULL) {
            json_decref(arr);
            return st;
        }
        json_array_append_new(arr, j);
    }
    json_object_set_new(body, name, arr);
    return RG_OK;
}

static rg_status_t parse_op_body(const json_t *inner, rg_etcd_op_type_t expect,
                                 rg_etcd_op_result_t *r)
{
    r->type = expect;
    switch (expect) {
    case RG_ETCD_OP_RANGE:
        return parse_range(inner, &r->u.range);
    case RG_ETCD_OP_PUT:
        return parse_put(inner, &r->u.put);
    case RG_ETCD_OP_DELETE:
        return parse_delete(inner, &r->u.del);
    }
    return rg_error(RG_EPROTO, "etcd: response of unknown type");
}

static rg_status_t parse_op_result(const json_t *j, rg_etcd_op_type_t expect,
                                   rg_etcd_op_result_t *r)
{
    static const char *const names[] = {"response_range", "response_put",
                                        "response_delete_range"};
    const json_t *inner = json_object_get(j, names[expect]);
    if (inner == NULL) {
        return rg_error(RG_EPROTO, "etcd: txn response lacks %s", names[expect]);
    }
    return parse_op_body(inner, expect, r);
}

static void op_result_cleanup(rg_etcd_op_result_t *r)
{
    switch (r->type) {
    case RG_ETCD_OP_RANGE:
        rg_etcd_range_cleanup(&r->u.range);
        break;
    case RG_ETCD_OP_PUT:
        rg_etcd_put_cleanup(&r->u.put);
        break;
    case RG_ETCD_OP_DELETE:
        rg_etcd_delete_cleanup(&r->u.del);
        break;
    }
}

void rg_etcd_txn_cleanup(rg_etcd_txn_t *res)
{
    if (res == NULL) {
        return;
    }
    for (size_t i = 0; i < res->n_results; i++) {
        op_result_cleanup(&res->results[i]);
    }
    free(res->results);
    res->results = NULL;
    res->n_results = 0;
}

rg_status_t rg_etcd_txn(rg_etcd_t *client, const rg_etcd_cmp_t *cmps, size_t n_cmps,
                        const rg_etcd_op_t *success, size_t n_success,
                        const rg_etcd_op_t *failure, size_t n_failure,
                        rg_deadline_t deadline, rg_etcd_txn_t *res)
{
    json_t *body = NULL;
    json_t *arr;
    json_t *reply = NULL;
    const json_t *resps;
    const rg_etcd_op_t *ran;
    size_t n_ran;
    rg_etcd_txn_t out = {0};
    rg_status_t st;

    if (client == NULL || res == NULL || (n_cmps && !cmps) || (n_success && !success) ||
        (n_failure && !failure)) {
        return rg_error(RG_EINVAL, "etcd txn: NULL argument");
    }
    if (n_success > ETCD_MAX_TXN_OPS || n_failure > ETCD_MAX_TXN_OPS ||
        n_cmps > ETCD_MAX_TXN_OPS) {
        return rg_error(RG_EINVAL, "etcd txn: more than %d compares or ops in a branch",
                        ETCD_MAX_TXN_OPS);
    }
    body = json_object();
    arr = json_array();
    if (body == NULL || arr == NULL) {
        json_decref(body);
        json_decref(arr);
        return rg_error(RG_ENOMEM, "etcd: txn");
    }
    json_object_set_new(body, "compare", arr);
    for (size_t i = 0; i < n_cmps; i++) {
        json_t *c = cmp_json(&cmps[i], &st);
        if (c == NULL) {
            goto err_body;
        }
        json_array_append_new(arr, c);
    }
    st = add_ops(body, "success", success, n_success);
    if (st == RG_OK) {
        st = add_ops(body, "failure", failure, n_failure);
    }
    if (st != RG_OK) {
        goto err_body;
    }
    st = etcd_client_call(client, "/v3/kv/txn", body, deadline, &reply);
    json_decref(body);
    if (st != RG_OK) {
        return st;
    }
    if (etcd_header_revision(reply, &out.revision) != RG_OK) {
        st = RG_EPROTO;
        goto err_reply;
    }
    out.succeeded = etcd_json_bool(reply, "succeeded");
    ran = out.succeeded ? success : failure;
    n_ran = out.succeeded ? n_success : n_failure;
    resps = json_object_get(reply, "responses");
    if (json_array_size(resps) != n_ran) {
        st = rg_error(RG_EPROTO, "etcd: txn returned %zu responses for %zu ops",
                      json_array_size(resps), n_ran);
        goto err_reply;
    }
    if (n_ran > 0) {
        out.results = calloc(n_ran, sizeof(*out.results));
        if (out.results == NULL) {
            st = rg_error(RG_ENOMEM, "etcd: txn results");
            goto err_reply;
        }
    }
    for (size_t i = 0; i < n_ran; i++) {
        st = parse_op_result(json_array_get(resps, i), ran[i].type, &out.results[i]);
        if (st != RG_OK) {
            goto err_results;
        }
        out.n_results = i + 1;
    }
    json_decref(reply);
    *res = out;
    return RG_OK;

err_results:
    rg_etcd_txn_cleanup(&out);
err_reply:
    json_decref(reply);
    return st;
err_body:
    json_decref(body);
    return st;
}
