/*
 * Internals of the etcd client.
 *
 * etcd_conn_t is one HTTP connection (a libcurl easy handle, reused between calls) over a
 * list of endpoints. etcd_conn_call() posts one JSON request and parses the JSON reply; it
 * tries the endpoint that worked last first and moves to the next one on a connect failure,
 * a timeout or an "unavailable" status, always within the caller's deadline. With a user
 * configured it authenticates on first use and again when etcd says the token expired.
 *
 * The client, a watch and a lease keeper each own one etcd_conn_t; none is shared between
 * threads (the client serialises its callers with a mutex).
 *
 * JSON is jansson; etcd's bytes fields are standard padded base64; its 64-bit integers come
 * as strings and zero values are omitted, so every field read goes through etcd_json_i64(),
 * which treats absent as 0.
 */
#ifndef REGROUP_ETCD_INTERNAL_H
#define REGROUP_ETCD_INTERNAL_H

#include "rg_common.h"

#include <regroup/etcd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>

#define ETCD_DEFAULT_TIMEOUT_MS   5000
#define ETCD_DEFAULT_MAX_RESPONSE (64u << 20)
#define ETCD_MAX_ENDPOINTS        16
#define ETCD_MAX_KEY              (64u << 10)

typedef struct {
    char   *urls[ETCD_MAX_ENDPOINTS];
    size_t  n_urls;
    size_t  current;              /* the endpoint that worked last */
    char   *user;
    char   *password;
    char   *ca_file;
    char   *cert_file;
    char   *key_file;
    int64_t timeout_ms;
    size_t  max_response;
    char   *token;                /* auth token, when a user is configured */
    CURL   *easy;
    rg_dbuf_t resp;
    char    errbuf[CURL_ERROR_SIZE];
    CURLcode last_rc;             /* of the last request's transfer */
    rg_etcd_stats_t stats;        /* written by the owner's thread, read by any (atomics) */
} etcd_conn_t;

/* Counting into a conn's stats, and reading them, from any thread. */
static inline void etcd_count(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}
void etcd_conn_stats_add(const etcd_conn_t *conn, rg_etcd_stats_t *sum);

rg_status_t etcd_conn_init(etcd_conn_t *conn, const rg_etcd_params_t *params);
void        etcd_conn_cleanup(etcd_conn_t *conn);
/* A deadline of 0 becomes now + the default timeout. */
rg_deadline_t etcd_conn_deadline(const etcd_conn_t *conn, rg_deadline_t deadline);

/* Posts body (not stolen) to path; on success *reply_p is the parsed JSON object (caller
 * decrefs). Errors name the endpoint and path. */
rg_status_t etcd_conn_call(etcd_conn_t *conn, const char *path, json_t *body,
                           rg_deadline_t deadline, json_t **reply_p);

/* Sets up conn->easy's URL, TLS, auth header and timeouts for a request to endpoint i
 * (used by the watch, which drives the transfer itself). headers_p receives the header
 * list to free after the transfer. */
rg_status_t etcd_conn_prepare(etcd_conn_t *conn, CURL *easy, size_t i, const char *path,
                              struct curl_slist **headers_p);
/* Authenticates against endpoint i if a user is configured and no token is held. */
rg_status_t etcd_conn_ensure_auth(etcd_conn_t *conn, size_t i, rg_deadline_t deadline);

/* Maps an etcd error reply (HTTP status + body) to a status and records the message. */
rg_status_t etcd_error_from_reply(const char *url, const char *path, long http,
                                  const char *body);

struct rg_etcd {
    pthread_mutex_t lock;   /* serialises calls on conn */
    etcd_conn_t     conn;
};

/* etcd_conn_call under the client's lock. */
rg_status_t etcd_client_call(rg_etcd_t *client, const char *path, json_t *body,
                             rg_deadline_t deadline, json_t **reply_p);
/* reply.header.revision */
rg_status_t etcd_header_revision(const json_t *reply, int64_t *rev);

/* ---- JSON and base64 ------------------------------------------------------------------- */

char       *etcd_b64_encode(const void *data, size_t len);             /* malloc'd */
rg_status_t etcd_b64_decode(const char *in, char **out_p, size_t *len_p); /* NUL-terminated */

/* An int64 field that may be a string, a number or absent (0). false on junk. */
bool        etcd_json_i64(const json_t *obj, const char *name, int64_t *out);
bool        etcd_json_bool(const json_t *obj, const char *name);
/* Adds a base64 field. */
rg_status_t etcd_json_set_b64(json_t *obj, const char *name, const void *data, size_t len);
rg_status_t etcd_json_set_i64(json_t *obj, const char *name, int64_t v);

/* Parses a kv object into *kv (caller cleans up). */
rg_status_t etcd_kv_parse(const json_t *obj, rg_etcd_kv_t *kv);
/* The end of the range for every key starting with prefix (prefix + 1); malloc'd. */
char       *etcd_prefix_end(const char *prefix, size_t *len_p);
/* Longest text etcd_describe_keys writes. */
#define ETCD_MAX_DESCRIBE 720
/* Names a key or range for a message: the key itself; a prefix as the prefix followed by a
 * star; "K and after" for every key from K on; else "[K, END)". */
void        etcd_describe_range(const char *key, size_t key_len, const char *range_end,
                                size_t end_len, char *out, size_t cap);
/* Names the keys a request body (range, put, delete range, txn) touches, for a refusal that
 * etcd does not explain: "key /regroup/B/round", "keys" and a prefix, or "one of the keys"
 * and a txn's list. */
void        etcd_describe_keys(const json_t *body, char *out, size_t cap);
/* Fills key/range_end of a request object for a key, range or prefix. */
rg_status_t etcd_json_set_range(json_t *obj, const char *key, const char *range_end,
                                bool prefix);

#endif
