/* One HTTP connection to etcd over a list of endpoints: failover, auth, TLS, deadlines. */
#include "etcd_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* A connect attempt gets at most this share of the time left, so a dead endpoint that
 * swallows SYNs still leaves time for the next one. */
#define ETCD_CONNECT_TIMEOUT_MS 1000
/* With other endpoints to try, an answer that takes longer than this on the first round of
 * failover leaves the member for the next one: a member that takes connections but does not
 * answer (stopped, cut off from its leader) costs a request this much, not its deadline. The
 * second round gives each the time left, in case every member is slow. */
#define ETCD_ANSWER_MS          1000
#define ETCD_MAX_ERRMSG         200

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

/* Set once any connection of this process got an answer from etcd: from then on a host name
 * that does not resolve is a resolver's hiccup to wait out, not a wrong name. Process-wide,
 * since a lease keeper or a watch opens its connection after the first calls succeeded. */
static bool etcd_answered;

static void curl_global_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static rg_status_t add_endpoint(etcd_conn_t *conn, const char *s, size_t len, bool tls)
{
    char *url;
    bool has_scheme = (len > 7 && strncmp(s, "http://", 7) == 0) ||
                      (len > 8 && strncmp(s, "https://", 8) == 0);

    if (len == 0) {
        return rg_error(RG_EINVAL, "etcd: empty endpoint in list");
    }
    if (conn->n_urls == ETCD_MAX_ENDPOINTS) {
        return rg_error(RG_EINVAL, "etcd: more than %d endpoints", ETCD_MAX_ENDPOINTS);
    }
    if (!has_scheme && memchr(s, ':', len) == NULL) {
        return rg_error(RG_EINVAL, "etcd: endpoint '%.*s' is not host:port or a URL", (int)len,
                        s);
    }
    url = malloc(len + 9);
    if (url == NULL) {
        return rg_error(RG_ENOMEM, "etcd: endpoint");
    }
    snprintf(url, len + 9, "%s%.*s", has_scheme ? "" : (tls ? "https://" : "http://"),
             (int)len, s);
    /* Drop a trailing slash so that url + "/v3/..." is well formed. */
    size_t ul = strlen(url);
    if (ul > 0 && url[ul - 1] == '/') {
        url[ul - 1] = '\0';
    }
    conn->urls[conn->n_urls++] = url;
    return RG_OK;
}

rg_status_t etcd_conn_init(etcd_conn_t *conn, const rg_etcd_params_t *params)
{
    const char *p;
    rg_status_t st;

    memset(conn, 0, sizeof(*conn));
    if (params == NULL || params->endpoints == NULL) {
        return rg_error(RG_EINVAL, "etcd: no endpoints given");
    }
    if ((params->user == NULL) != (params->password == NULL)) {
        return rg_error(RG_EINVAL, "etcd: a user needs a password and a password a user");
    }
    if ((params->cert_file == NULL) != (params->key_file == NULL)) {
        return rg_error(RG_EINVAL, "etcd: a client certificate needs a key and vice versa");
    }
    if (params->timeout_ms < 0) {
        return rg_error(RG_EINVAL, "etcd: negative timeout %lld ms",
                        (long long)params->timeout_ms);
    }
    pthread_once(&curl_once, curl_global_once);
    p = params->endpoints;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        st = add_endpoint(conn, p, len, params->ca_file != NULL);
        if (st != RG_OK) {
            goto err;
        }
        p += len + (comma ? 1 : 0);
    }
    if (conn->n_urls == 0) {
        st = rg_error(RG_EINVAL, "etcd: no endpoints given");
        goto err;
    }
    conn->user = rg_strdup(params->user);
    conn->password = rg_strdup(params->password);
    conn->ca_file = rg_strdup(params->ca_file);
    conn->cert_file = rg_strdup(params->cert_file);
    conn->key_file = rg_strdup(params->key_file);
    conn->timeout_ms = params->timeout_ms ? params->timeout_ms : ETCD_DEFAULT_TIMEOUT_MS;
    conn->max_response = params->max_response ? params->max_response
                                              : ETCD_DEFAULT_MAX_RESPONSE;
    rg_dbuf_init(&conn->resp, conn->max_response);
    conn->easy = curl_easy_init();
    if (conn->easy == NULL) {
        st = rg_error(RG_ENOMEM, "etcd: curl_easy_init failed");
        goto err;
    }
    return RG_OK;
err:
    etcd_conn_cleanup(conn);
    return st;
}

void etcd_conn_cleanup(etcd_conn_t *conn)
{
    if (conn->easy != NULL) {
        curl_easy_cleanup(conn->easy);
    }
    for (size_t i = 0; i < conn->n_urls; i++) {
        free(conn->urls[i]);
    }
    free(conn->user);
    free(conn->password);
    free(conn->ca_file);
    free(conn->cert_file);
    free(conn->key_file);
    free(conn->token);
    rg_dbuf_cleanup(&conn->resp);
    memset(conn, 0, sizeof(*conn));
}

rg_deadline_t etcd_conn_deadline(const etcd_conn_t *conn, rg_deadline_t deadline)
{
    return deadline ? deadline : rg_deadline_in_ms(conn->timeout_ms);
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    rg_dbuf_t *b = userdata;
    /* Returning less than given makes curl fail the transfer with CURLE_WRITE_ERROR. */
    if (rg_dbuf_append(b, ptr, size * nmemb) != RG_OK) {
        return 0;
    }
    return size * nmemb;
}

rg_status_t etcd_conn_prepare(etcd_conn_t *conn, CURL *easy, size_t i, const char *path,
                              struct curl_slist **headers_p)
{
    char url[1024];
    char auth[1024];
    struct curl_slist *h = NULL;

    snprintf(url, sizeof(url), "%s%s", conn->urls[i], path);
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 2L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 1L);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, conn->errbuf);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    if (conn->ca_file != NULL) {
        curl_easy_setopt(easy, CURLOPT_CAINFO, conn->ca_file);
    }
    if (conn->cert_file != NULL) {
        curl_easy_setopt(easy, CURLOPT_SSLCERT, conn->cert_file);
        curl_easy_setopt(easy, CURLOPT_SSLKEY, conn->key_file);
    }
    h = curl_slist_append(h, "Content-Type: application/json");
    /* curl would otherwise send "Expect: 100-continue" for larger bodies and wait for it. */
    h = h ? curl_slist_append(h, "Expect:") : NULL;
    if (h != NULL && conn->token != NULL) {
        snprintf(auth, sizeof(auth), "Authorization: %s", conn->token);
        h = curl_slist_append(h, auth);
    }
    if (h == NULL) {
        return rg_error(RG_ENOMEM, "etcd: header list");
    }
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    *headers_p = h;
    return RG_OK;
}

/* etcd's unary error body: {"error":"...","message":"...","code":N}. */
rg_status_t etcd_error_from_reply(const char *url, const char *path, long http,
                                  const char *body)
{
    json_t *j = json_loads(body ? body : "", 0, NULL);
    const char *msg = NULL;
    rg_status_t st;
    char text[ETCD_MAX_ERRMSG + 1];

    if (j != NULL) {
        msg = json_string_value(json_object_get(j, "message"));
        if (msg == NULL) {
            msg = json_string_value(json_object_get(j, "error"));
        }
    }
    snprintf(text, sizeof(text), "%s", msg ? msg : (body && body[0] ? body : "(no body)"));
    for (char *c = text; *c; c++) {
        if (*c == '\n' || *c == '\r') {
            *c = ' ';
        }
    }
    if (strstr(text, "CommonName of client sending a request against gateway") != NULL) {
        /* etcd 3.4.2x with auth on and client certificates required: the JSON gateway
         * refuses any client certificate that has a CommonName (it cannot pass the name on
         * as the user). */
        json_decref(j);
        return rg_error(RG_EAUTH, "etcd %s: %s: HTTP %ld: %s (with auth on, etcd's JSON "
                        "gateway takes only client certificates without a CommonName: use "
                        "one, with a user and password)", url, path, http, text);
    } else if (strstr(text, "compacted") != NULL) {
        st = RG_ECOMPACTED;
    } else if (strstr(text, "lease not found") != NULL) {
        st = RG_ELEASE;
    } else if (http == 401 || strstr(text, "authentication failed") != NULL ||
               strstr(text, "user name is empty") != NULL ||
               strstr(text, "invalid auth token") != NULL) {
        st = RG_EAUTH;
    } else if (http == 403 || strstr(text, "permission denied") != NULL) {
        st = RG_EPERM;
    } else if (strstr(text, "already exists") != NULL) {
        /* "user name already exists", "role name already exists" (auth administration) */
        st = RG_EEXIST;
    } else if (strstr(text, "user name not found") != NULL ||
               strstr(text, "role name not found") != NULL) {
        st = RG_ENOENT;
    } else if (http == 503 || http == 502 || http == 504 || http == 408) {
        st = RG_EAGAIN;
    } else {
        st = RG_ESERVER;
    }
    json_decref(j);
    return rg_error(st, "etcd %s: %s: HTTP %ld: %s", url, path, http, text);
}

static rg_status_t status_from_curl(etcd_conn_t *conn, size_t i, const char *path,
                                    CURLcode rc, rg_deadline_t deadline)
{
    const char *detail = conn->errbuf[0] ? conn->errbuf : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return rg_error(RG_EUNREACH, "etcd %s: %s: unreachable: %s", conn->urls[i], path,
                        detail);
    case CURLE_OPERATION_TIMEDOUT:
        return rg_error(RG_ETIMEDOUT, "etcd %s: %s: timed out%s: %s", conn->urls[i], path,
                        rg_deadline_passed(deadline) ? " at the call's deadline" : "", detail);
    case CURLE_WRITE_ERROR:
        return rg_error(RG_ETOOBIG, "etcd %s: %s: response over the %zu byte limit",
                        conn->urls[i], path, conn->max_response);
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
        return rg_error(RG_EAUTH, "etcd %s: %s: TLS failed: %s", conn->urls[i], path, detail);
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
        /* With TLS 1.3 a server that refuses the client's certificate says so with an alert
         * on the first read after the handshake: not a lost connection worth retrying. */
        if (strstr(detail, " alert ") != NULL) {
            return rg_error(RG_EAUTH, "etcd %s: %s: TLS refused by the server (is a client "
                            "certificate it trusts required?): %s", conn->urls[i], path,
                            detail);
        }
        return rg_error(RG_EAGAIN, "etcd %s: %s: connection lost: %s", conn->urls[i], path,
                        detail);
    case CURLE_GOT_NOTHING:
        return rg_error(RG_EAGAIN, "etcd %s: %s: connection lost: %s", conn->urls[i], path,
                        detail);
    default:
        return rg_error(RG_EPROTO, "etcd %s: %s: malformed or truncated response: %s",
                        conn->urls[i], path, detail);
    }
}

/* One POST to endpoint i. On success *http_p is the HTTP status and conn->resp the body.
 * patient: the whole time left, even with other endpoints to try (ETCD_ANSWER_MS). */
static rg_status_t post_once(etcd_conn_t *conn, size_t i, const char *path, const char *body,
                             rg_deadline_t deadline, bool patient, long *http_p)
{
    struct curl_slist *headers = NULL;
    int64_t left = rg_deadline_left_ms(deadline);
    int64_t attempt_ms = conn->n_urls > 1 && !patient ? RG_MIN(left, ETCD_ANSWER_MS) : left;
    CURLcode rc;
    rg_status_t st;

    conn->last_rc = CURLE_OK;
    if (left <= 0) {
        return rg_error(RG_ETIMEDOUT, "etcd %s: %s: deadline passed before the request",
                        conn->urls[i], path);
    }
    rg_dbuf_reset(&conn->resp);
    conn->errbuf[0] = '\0';
    st = etcd_conn_prepare(conn, conn->easy, i, path, &headers);
    if (st != RG_OK) {
        return st;
    }
    curl_easy_setopt(conn->easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(conn->easy, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(conn->easy, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(conn->easy, CURLOPT_WRITEDATA, &conn->resp);
    curl_easy_setopt(conn->easy, CURLOPT_TIMEOUT_MS, (long)attempt_ms);
    curl_easy_setopt(conn->easy, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)RG_MIN(left, (int64_t)ETCD_CONNECT_TIMEOUT_MS));
    rc = curl_easy_perform(conn->easy);
    conn->last_rc = rc;
    etcd_count(&conn->stats.requests, 1);
    etcd_count(&conn->stats.bytes_sent, strlen(body));
    etcd_count(&conn->stats.bytes_received, conn->resp.len);
    curl_slist_free_all(headers);
    curl_easy_setopt(conn->easy, CURLOPT_HTTPHEADER, NULL);
    if (rc != CURLE_OK) {
        return status_from_curl(conn, i, path, rc, deadline);
    }
    __atomic_store_n(&etcd_answered, true, __ATOMIC_RELAXED);
    curl_easy_getinfo(conn->easy, CURLINFO_RESPONSE_CODE, http_p);
    return RG_OK;
}

static rg_status_t authenticate(etcd_conn_t *conn, size_t i, rg_deadline_t deadline)
{
    json_t *req = json_pack("{s:s, s:s}", "name", conn->user, "password", conn->password);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_t *reply = NULL;
    const char *token;
    long http = 0;
    rg_status_t st;

    json_decref(req);
    if (body == NULL) {
        return rg_error(RG_ENOMEM, "etcd: auth request");
    }
    free(conn->token);
    conn->token = NULL;
    st = post_once(conn, i, "/v3/auth/authenticate", body, deadline, false, &http);
    free(body);
    if (st != RG_OK) {
        return st;
    }
    if (http != 200) {
        st = etcd_error_from_reply(conn->urls[i], "/v3/auth/authenticate", http,
                                   conn->resp.data);
        /* A refused password is the user's to fix, not a reason to try elsewhere. */
        return st == RG_ESERVER ? rg_error_wrap(RG_EAUTH, "authentication refused") : st;
    }
    reply = json_loadb(conn->resp.data, conn->resp.len, 0, NULL);
    token = json_string_value(json_object_get(reply, "token"));
    if (token == NULL) {
        json_decref(reply);
        return rg_error(RG_EAUTH, "etcd %s: authentication returned no token (is auth enabled?)",
                        conn->urls[i]);
    }
    conn->token = strdup(token);
    json_decref(reply);
    return conn->token ? RG_OK : rg_error(RG_ENOMEM, "etcd: token");
}

rg_status_t etcd_conn_ensure_auth(etcd_conn_t *conn, size_t i, rg_deadline_t deadline)
{
    if (conn->user == NULL || conn->token != NULL) {
        return RG_OK;
    }
    return authenticate(conn, i, deadline);
}

/* Every endpoint's host name failed to resolve, and etcd has never answered this process: a
 * typo or a wrong name, which waiting will not fix, so not one of the statuses callers retry.
 * (libcurl says CURLE_COULDNT_RESOLVE_HOST for a name that does not exist and for a resolver
 * that does not answer alike; the resolve is bounded by the connect timeout.) */
static rg_status_t no_host_resolves(const etcd_conn_t *conn)
{
    char list[1024] = "";
    size_t o = 0;

    for (size_t i = 0; i < conn->n_urls && o < sizeof(list); i++) {
        CURLU *u = curl_url();
        char *host = NULL;
        if (u != NULL && curl_url_set(u, CURLUPART_URL, conn->urls[i], 0) == CURLUE_OK) {
            curl_url_get(u, CURLUPART_HOST, &host, 0);
        }
        int n = snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "",
                         host ? host : conn->urls[i]);
        o += n > 0 ? (size_t)n : 0;
        curl_free(host);
        curl_url_cleanup(u);
    }
    if (conn->n_urls == 1) {
        return rg_error(RG_EINVAL, "etcd %s: the host name %s does not resolve", conn->urls[0],
                        list);
    }
    return rg_error(RG_EINVAL, "etcd: none of the endpoints' host names resolves (%s)", list);
}

/* Statuses after which the same request may succeed on another endpoint. */
static bool try_next_endpoint(rg_status_t st)
{
    return st == RG_EUNREACH || st == RG_ETIMEDOUT || st == RG_EAGAIN;
}

rg_status_t etcd_conn_call(etcd_conn_t *conn, const char *path, json_t *body,
                           rg_deadline_t deadline, json_t **reply_p)
{
    char *text = json_dumps(body, JSON_COMPACT);
    rg_status_t st = RG_ETIMEDOUT;
    bool reauthed = false;
    /* Each endpoint twice at most: a full round of failover, then one more try each. */
    size_t attempts = 2 * conn->n_urls;
    uint32_t unresolved = 0;   /* endpoints whose host name did not resolve */

    if (text == NULL) {
        return rg_error(RG_ENOMEM, "etcd: serialising request for %s", path);
    }
    deadline = etcd_conn_deadline(conn, deadline);
    for (size_t a = 0; a < attempts; a++) {
        size_t i = (conn->current + a) % conn->n_urls;
        long http = 0;

        if (a > 0 && rg_deadline_passed(deadline)) {
            break;
        }
        st = etcd_conn_ensure_auth(conn, i, deadline);
        if (st == RG_OK) {
            st = post_once(conn, i, path, text, deadline, a >= conn->n_urls, &http);
        }
        if (st == RG_OK && http == 401 && conn->user != NULL && !reauthed) {
            /* The token expired (etcd's simple tokens live 300 s): get a new one, once. */
            reauthed = true;
            free(conn->token);
            conn->token = NULL;
            a--;
            continue;
        }
        if (st == RG_OK && http != 200) {
            st = etcd_error_from_reply(conn->urls[i], path, http, conn->resp.data);
            if (st == RG_EPERM) {
                /* etcd does not say which key it refused: the request does. */
                char keys[ETCD_MAX_DESCRIBE];
                etcd_describe_keys(body, keys, sizeof(keys));
                st = rg_error(RG_EPERM, "etcd %s: %s: permission denied on %s%s%s",
                              conn->urls[i], path, keys, conn->user ? " for user " : "",
                              conn->user ? conn->user : "");
            }
        }
        if (st == RG_OK) {
            json_error_t jerr;
            json_t *reply = json_loadb(conn->resp.data, conn->resp.len, 0, &jerr);
            if (reply == NULL || !json_is_object(reply)) {
                json_decref(reply);
                st = rg_error(RG_EPROTO, "etcd %s: %s: malformed or truncated JSON: %s",
                              conn->urls[i], path, reply ? "not an object" : jerr.text);
                break;
            }
            conn->current = i;
            free(text);
            *reply_p = reply;
            return RG_OK;
        }
        if (!try_next_endpoint(st)) {
            break;
        }
        if (conn->last_rc == CURLE_COULDNT_RESOLVE_HOST) {
            unresolved |= 1u << i;
            if (!__atomic_load_n(&etcd_answered, __ATOMIC_RELAXED) && unresolved == (1u << conn->n_urls) - 1) {
                st = no_host_resolves(conn);
                break;
            }
        }
        rg_debug("etcd %s: %s failed (%s), trying the next endpoint", conn->urls[i], path,
                 rg_last_error());
        /* A new connection for the next endpoint: the old one may be half dead. */
        curl_easy_reset(conn->easy);
        if (conn->user != NULL) {
            free(conn->token);
            conn->token = NULL;
        }
    }
    free(text);
    if (st == RG_ETIMEDOUT || (rg_deadline_passed(deadline) && try_next_endpoint(st))) {
        return rg_error_wrap(RG_ETIMEDOUT, "etcd: %s: no answer before the deadline", path);
    }
    return st;
}

void etcd_conn_stats_add(const etcd_conn_t *conn, rg_etcd_stats_t *sum)
{
    sum->requests += __atomic_load_n(&conn->stats.requests, __ATOMIC_RELAXED);
    sum->bytes_sent += __atomic_load_n(&conn->stats.bytes_sent, __ATOMIC_RELAXED);
    sum->bytes_received += __atomic_load_n(&conn->stats.bytes_received, __ATOMIC_RELAXED);
    sum->events += __atomic_load_n(&conn->stats.events, __ATOMIC_RELAXED);
}
