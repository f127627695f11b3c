/*
 * Watch: one streamed POST /v3/watch per connection, driven by a thread with a curl multi
 * handle (so that destroy can wake it at once with curl_multi_wakeup).
 *
 * The stream is NDJSON across arbitrary chunk boundaries: bytes go into a bounded line
 * buffer and each complete line is parsed. Events are queued for rg_etcd_watch_next(); the
 * thread remembers next_rev = (revision of the last queued event) + 1. When the stream ends
 * for any reason but a stop, the thread reconnects (to the next endpoint, with a short
 * backoff) and asks for start_revision = next_rev, so no event is lost or repeated: etcd
 * sends all events of one revision in one message, so a message is never half-queued.
 */
#include "etcd_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define WATCH_MAX_LINE        (64u << 20)
#define WATCH_MAX_QUEUE       (1u << 20)   /* events queued before the watch gives up */
#define WATCH_BACKOFF_MIN_MS  20
#define WATCH_BACKOFF_MAX_MS  500
#define WATCH_CONFIRM_MS      3000   /* a stream must say "created" within this */
/* A confirmed stream quiet for WATCH_QUIET_MS is asked after with a read of its key at the
 * same member (linearizable: a member cut off from its leader cannot answer it either);
 * no answer within WATCH_PROBE_MS leaves the member for the next endpoint, where the stream
 * resumes at next_rev. A silent member sends no events and says nothing else either. */
#define WATCH_QUIET_MS        1000
#define WATCH_PROBE_MS        1000

struct rg_etcd_watch {
    etcd_conn_t     conn;          /* endpoints, auth and TLS; used only by the thread */
    CURLM          *multi;
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cond;
    int             efd;
    /* the request */
    char           *key;
    char           *range_end;     /* NULL, or the end (may be "\0" of length 1) */
    size_t          range_end_len;
    bool            prev_kv;
    /* thread state */
    rg_dbuf_t       line;
    int64_t         next_rev;      /* start revision for the next (re)connect; 0 = now */
    bool            connected;     /* the current stream said "created" */
    uint64_t        heard_ns;      /* when the current member last said anything */
    /* shared state, under mu */
    rg_etcd_event_t *queue;
    size_t          q_head;
    size_t          q_len;
    size_t          q_cap;
    bool            created;       /* confirmed at least once */
    bool            stop;
    rg_status_t     final;         /* RG_OK while the watch lives */
    char            final_msg[1024];
    int64_t         compact_rev;
    int64_t         taken_rev;
};

static void watch_signal(rg_etcd_watch_t *w)
{
    uint64_t one = 1;
    if (write(w->efd, &one, sizeof(one)) != sizeof(one) && errno != EAGAIN) {
        rg_warn("watch: eventfd write: %m");
    }
}

/* Called with mu held. */
static void watch_fail_locked(rg_etcd_watch_t *w, rg_status_t st, const char *msg)
{
    if (w->final == RG_OK) {
        w->final = st;
        snprintf(w->final_msg, sizeof(w->final_msg), "%s", msg);
    }
    pthread_cond_broadcast(&w->cond);
    watch_signal(w);
}

static rg_status_t queue_push_locked(rg_etcd_watch_t *w, rg_etcd_event_t *ev)
{
    if (w->q_len == w->q_cap) {
        size_t cap = w->q_cap ? w->q_cap * 2 : 64;
        rg_etcd_event_t *q;
        if (cap > WATCH_MAX_QUEUE) {
            return RG_ETOOBIG;
        }
        q = malloc(cap * sizeof(*q));
        if (q == NULL) {
            return RG_ENOMEM;
        }
        for (size_t i = 0; i < w->q_len; i++) {
            q[i] = w->queue[(w->q_head + i) % w->q_cap];
        }
        free(w->queue);
        w->queue = q;
        w->q_head = 0;
        w->q_cap = cap;
    }
    w->queue[(w->q_head + w->q_len) % w->q_cap] = *ev;
    w->q_len++;
    etcd_count(&w->conn.stats.events, 1);
    return RG_OK;
}

static rg_status_t parse_event(const json_t *j, rg_etcd_event_t *ev)
{
    const char *type = json_string_value(json_object_get(j, "type"));
    const json_t *prev = json_object_get(j, "prev_kv");
    rg_status_t st;

    memset(ev, 0, sizeof(*ev));
    /* PUT is enum value 0, which etcd omits. */
    ev->type = (type != NULL && strcmp(type, "DELETE") == 0) ? RG_ETCD_EVENT_DELETE
                                                             : RG_ETCD_EVENT_PUT;
    st = etcd_kv_parse(json_object_get(j, "kv"), &ev->kv);
    if (st != RG_OK) {
        return st;
    }
    if (prev != NULL) {
        st = etcd_kv_parse(prev, &ev->prev_kv);
        if (st != RG_OK) {
            rg_etcd_kv_cleanup(&ev->kv);
            return st;
        }
        ev->has_prev = true;
    }
    return RG_OK;
}

/* Handles one line of the stream. Returns false when this stream must be dropped. */
static bool handle_line(rg_etcd_watch_t *w, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb(line, len, 0, &jerr);
    const json_t *r;
    const json_t *events;
    int64_t rev = 0;
    bool keep = true;

    if (j == NULL) {
        rg_warn("watch: malformed line from etcd (%s); reconnecting", jerr.text);
        return false;
    }
    r = json_object_get(j, "result");
    if (r == NULL) {
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"),
                                                            "message"));
        rg_info("watch: stream error from etcd: %s; reconnecting", msg ? msg : "(none)");
        json_decref(j);
        return false;
    }
    etcd_json_i64(json_object_get(r, "header"), "revision", &rev);
    pthread_mutex_lock(&w->mu);
    if (etcd_json_bool(r, "canceled")) {
        int64_t compact = 0;
        const char *reason = json_string_value(json_object_get(r, "cancel_reason"));
        char msg[1000];
        etcd_json_i64(r, "compact_revision", &compact);
        if (compact > 0) {
            w->compact_rev = compact;
            snprintf(msg, sizeof(msg),
                     "etcd watch on %s: revision %lld has been compacted (oldest is %lld)",
                     w->key, (long long)w->next_rev, (long long)compact);
            watch_fail_locked(w, RG_ECOMPACTED, msg);
        } else if (reason != NULL && (strstr(reason, "permission denied") != NULL ||
                                      strstr(reason, "PermissionDenied") != NULL)) {
            /* etcd 3.4: "rpc error: code = PermissionDenied desc = etcdserver: permission
             * denied", in a response that is both created and canceled. */
            char keys[600];
            etcd_describe_range(w->key, strlen(w->key), w->range_end, w->range_end_len, keys,
                                sizeof(keys));
            snprintf(msg, sizeof(msg), "etcd %s: /v3/watch: permission denied on %s %s%s%s",
                     w->conn.urls[w->conn.current], w->range_end ? "keys" : "key", keys,
                     w->conn.user ? " for user " : "", w->conn.user ? w->conn.user : "");
            watch_fail_locked(w, RG_EPERM, msg);
        } else {
            snprintf(msg, sizeof(msg), "etcd watch on %s canceled by the server: %s", w->key,
                     reason ? reason : "no reason given");
            watch_fail_locked(w, RG_ESERVER, msg);
        }
        keep = false;
        goto out;
    }
    if (etcd_json_bool(r, "created")) {
        w->connected = true;
        if (!w->created) {
            w->created = true;
            pthread_cond_broadcast(&w->cond);
        }
        if (w->next_rev == 0) {
            /* A watch "from now" sees every revision after the one it was created at. */
            w->next_rev = rev + 1;
        }
    }
    events = json_object_get(r, "events");
    for (size_t i = 0; i < json_array_size(events); i++) {
        rg_etcd_event_t ev;
        rg_status_t st = parse_event(json_array_get(events, i), &ev);
        if (st == RG_OK) {
            st = queue_push_locked(w, &ev);
            if (st != RG_OK) {
                rg_etcd_event_cleanup(&ev);
            }
        }
        if (st != RG_OK) {
            watch_fail_locked(w, st, st == RG_ETOOBIG ? "etcd watch: too many unread events"
                                                      : "etcd watch: malformed event");
            keep = false;
            goto out;
        }
        if (ev.kv.mod_revision >= w->next_rev) {
            w->next_rev = ev.kv.mod_revision + 1;
        }
    }
    if (json_array_size(events) > 0) {
        pthread_cond_broadcast(&w->cond);
        watch_signal(w);
    }
out:
    pthread_mutex_unlock(&w->mu);
    json_decref(j);
    return keep;
}

static size_t stream_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    rg_etcd_watch_t *w = userdata;
    size_t n = size * nmemb;
    char *nl;

    w->heard_ns = rg_now_ns();
    etcd_count(&w->conn.stats.bytes_received, n);

    if (rg_dbuf_append(&w->line, ptr, n) != RG_OK) {
        rg_warn("watch: a stream line is over %u bytes; reconnecting", WATCH_MAX_LINE);
        return 0;
    }
    while ((nl = memchr(w->line.data, '\n', w->line.len)) != NULL) {
        size_t len = (size_t)(nl - w->line.data);
        bool keep = len == 0 || handle_line(w, w->line.data, len);
        rg_dbuf_consume(&w->line, len + 1);
        if (!keep) {
            return 0;
        }
    }
    return n;
}

static bool watch_stopping(rg_etcd_watch_t *w)
{
    bool stop;
    pthread_mutex_lock(&w->mu);
    stop = w->stop || w->final != RG_OK;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

static char *request_body(rg_etcd_watch_t *w)
{
    json_t *cr = json_object();
    json_t *body;
    char *text = NULL;

    if (cr == NULL) {
        return NULL;
    }
    if (etcd_json_set_b64(cr, "key", w->key, strlen(w->key)) != RG_OK ||
        (w->range_end != NULL &&
         etcd_json_set_b64(cr, "range_end", w->range_end, w->range_end_len) != RG_OK) ||
        (w->next_rev > 0 && etcd_json_set_i64(cr, "start_revision", w->next_rev) != RG_OK)) {
        json_decref(cr);
        return NULL;
    }
    if (w->prev_kv) {
        json_object_set_new(cr, "prev_kv", json_true());
    }
    body = json_pack("{s:o}", "create_request", cr);
    if (body != NULL) {
        text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
    }
    return text;
}

static size_t discard_cb(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    (void)ptr;
    (void)userdata;
    return size * nmemb;
}

/* The quiet stream's check (WATCH_QUIET_MS): a count-only read of the watched key. */
typedef struct {
    CURL              *easy;       /* NULL: none can be made (the stream goes unchecked) */
    char              *body;
    struct curl_slist *headers;
    bool               active;
    char               errbuf[CURL_ERROR_SIZE];
} watch_probe_t;

static void probe_init(rg_etcd_watch_t *w, watch_probe_t *pr)
{
    json_t *req = json_object();
    memset(pr, 0, sizeof(*pr));
    if (w->conn.n_urls < 2 || req == NULL ||
        etcd_json_set_b64(req, "key", w->key, strlen(w->key)) != RG_OK ||
        json_object_set_new(req, "count_only", json_true()) != 0 ||
        (pr->body = json_dumps(req, JSON_COMPACT)) == NULL ||
        (pr->easy = curl_easy_init()) == NULL) {
        free(pr->body);
        pr->body = NULL;   /* one endpoint (nowhere else to go), or no memory */
    }
    json_decref(req);
}

static void probe_end(rg_etcd_watch_t *w, watch_probe_t *pr)
{
    if (pr->active) {
        curl_multi_remove_handle(w->multi, pr->easy);
        pr->active = false;
    }
    curl_slist_free_all(pr->headers);
    pr->headers = NULL;
}

static void probe_cleanup(rg_etcd_watch_t *w, watch_probe_t *pr)
{
    probe_end(w, pr);
    if (pr->easy != NULL) {
        curl_easy_cleanup(pr->easy);
    }
    free(pr->body);
}

static void probe_start(rg_etcd_watch_t *w, watch_probe_t *pr, size_t i)
{
    if (pr->easy == NULL || pr->active) {
        return;
    }
    curl_easy_reset(pr->easy);
    if (etcd_conn_prepare(&w->conn, pr->easy, i, "/v3/kv/range", &pr->headers) != RG_OK) {
        return;
    }
    curl_easy_setopt(pr->easy, CURLOPT_ERRORBUFFER, pr->errbuf);
    curl_easy_setopt(pr->easy, CURLOPT_POSTFIELDS, pr->body);
    curl_easy_setopt(pr->easy, CURLOPT_POSTFIELDSIZE, (long)strlen(pr->body));
    curl_easy_setopt(pr->easy, CURLOPT_WRITEFUNCTION, discard_cb);
    curl_easy_setopt(pr->easy, CURLOPT_TIMEOUT_MS, (long)WATCH_PROBE_MS);
    curl_easy_setopt(pr->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)WATCH_PROBE_MS);
    etcd_count(&w->conn.stats.requests, 1);
    etcd_count(&w->conn.stats.bytes_sent, strlen(pr->body));
    if (curl_multi_add_handle(w->multi, pr->easy) == CURLM_OK) {
        pr->active = true;
    }
}

/* Runs one stream on endpoint i until it ends, its member goes silent, or the watch stops. */
static void run_stream(rg_etcd_watch_t *w, CURL *easy, watch_probe_t *pr, size_t i)
{
    struct curl_slist *headers = NULL;
    char *body;
    bool running = true;

    if (etcd_conn_ensure_auth(&w->conn, i, rg_deadline_in_ms(w->conn.timeout_ms)) != RG_OK) {
        rg_info("watch: %s", rg_last_error());
        return;
    }
    pthread_mutex_lock(&w->mu);
    body = request_body(w);
    pthread_mutex_unlock(&w->mu);
    if (body == NULL || etcd_conn_prepare(&w->conn, easy, i, "/v3/watch", &headers) != RG_OK) {
        free(body);
        return;
    }
    rg_dbuf_reset(&w->line);
    w->connected = false;
    w->conn.current = i;   /* the endpoint a refusal names */
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, stream_cb);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 0L);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    etcd_count(&w->conn.stats.requests, 1);
    etcd_count(&w->conn.stats.bytes_sent, strlen(body));
    curl_multi_add_handle(w->multi, easy);
    uint64_t confirm_by = rg_now_ns() + WATCH_CONFIRM_MS * 1000000ull;
    w->heard_ns = rg_now_ns();
    while (running && !watch_stopping(w)) {
        uint64_t now = rg_now_ns();
        if (!w->connected && now > confirm_by) {
            /* A member that takes the connection but never confirms the watch (still
             * starting, or cut off) must not hold it: try the next one. */
            rg_info("watch on %s: %s did not confirm within %d ms; trying the next endpoint",
                    w->key, w->conn.urls[i], WATCH_CONFIRM_MS);
            break;
        }
        if (w->connected && !pr->active && now - w->heard_ns > WATCH_QUIET_MS * 1000000ull) {
            probe_start(w, pr, i);
        }
        int n_running;
        CURLMcode mc = curl_multi_perform(w->multi, &n_running);
        if (mc != CURLM_OK) {
            rg_warn("watch: curl_multi_perform: %s", curl_multi_strerror(mc));
            break;
        }
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(w->multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE) {
                continue;
            }
            if (m->easy_handle == easy) {
                running = false;
                if (m->data.result != CURLE_OK && !watch_stopping(w)) {
                    rg_info("watch on %s: stream from %s ended: %s", w->key, w->conn.urls[i],
                            curl_easy_strerror(m->data.result));
                }
                continue;
            }
            long http = 0;
            curl_easy_getinfo(pr->easy, CURLINFO_RESPONSE_CODE, &http);
            CURLcode rc = m->data.result;
            probe_end(w, pr);
            if (rc == CURLE_OK && (http == 200 || http == 401)) {   /* 401: a token aged */
                w->heard_ns = rg_now_ns();
            } else if (!watch_stopping(w)) {
                rg_info("watch on %s: %s did not answer a read within %d ms (%s); trying the "
                        "next endpoint", w->key, w->conn.urls[i], WATCH_PROBE_MS,
                        rc != CURLE_OK ? curl_easy_strerror(rc) : "an error status");
                running = false;
            }
        }
        if (running) {
            curl_multi_poll(w->multi, NULL, 0, 200, NULL);
        }
    }
    probe_end(w, pr);
    curl_multi_remove_handle(w->multi, easy);
    curl_slist_free_all(headers);
    free(body);
}

static void *watch_main(void *arg)
{
    rg_etcd_watch_t *w = arg;
    CURL *easy = w->conn.easy;
    int64_t backoff = WATCH_BACKOFF_MIN_MS;
    size_t i = w->conn.current;
    watch_probe_t probe;

    probe_init(w, &probe);
    while (!watch_stopping(w)) {
        run_stream(w, easy, &probe, i);
        if (watch_stopping(w)) {
            break;
        }
        /* A stream that had been confirmed ended: reconnect quickly, elsewhere first. */
        backoff = w->connected ? WATCH_BACKOFF_MIN_MS : RG_MIN(backoff * 2, WATCH_BACKOFF_MAX_MS);
        i = (i + 1) % w->conn.n_urls;
        if (w->conn.user != NULL) {
            free(w->conn.token);    /* simple tokens are per member */
            w->conn.token = NULL;
        }
        curl_easy_reset(easy);
        curl_multi_poll(w->multi, NULL, 0, (int)backoff, NULL);
    }
    probe_cleanup(w, &probe);
    return NULL;
}

rg_status_t rg_etcd_watch_create(const rg_etcd_params_t *params, const rg_etcd_watch_req_t *req,
                                 rg_deadline_t deadline, rg_etcd_watch_t **watch_p)
{
    rg_etcd_watch_t *w;
    pthread_condattr_t ca;
    struct timespec ts;
    rg_status_t st;

    if (req == NULL || req->key == NULL || watch_p == NULL || req->start_revision < 0) {
        return rg_error(RG_EINVAL, "etcd watch: bad arguments");
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return rg_error(RG_ENOMEM, "etcd watch");
    }
    st = etcd_conn_init(&w->conn, params);
    if (st != RG_OK) {
        free(w);
        return st;
    }
    deadline = etcd_conn_deadline(&w->conn, deadline);
    w->key = strdup(req->key);
    if (req->prefix) {
        w->range_end = etcd_prefix_end(req->key, &w->range_end_len);
    } else if (req->range_end != NULL) {
        w->range_end_len = req->range_end[0] ? strlen(req->range_end) : 1;
        w->range_end = calloc(1, w->range_end_len + 1);
        if (w->range_end != NULL) {
            memcpy(w->range_end, req->range_end, strlen(req->range_end));
        }
    }
    w->prev_kv = req->prev_kv;
    w->next_rev = req->start_revision;
    w->taken_rev = req->start_revision > 0 ? req->start_revision - 1 : 0;
    rg_dbuf_init(&w->line, WATCH_MAX_LINE);
    w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    w->multi = curl_multi_init();
    if (w->key == NULL || ((req->prefix || req->range_end) && w->range_end == NULL) ||
        w->efd < 0 || w->multi == NULL) {
        st = rg_error(RG_ENOMEM, "etcd watch: setup failed");
        goto err;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->mu);
        st = rg_error(RG_ESYS, "etcd watch: cannot start thread");
        goto err;
    }
    ts.tv_sec = (time_t)(deadline / 1000000000ull);
    ts.tv_nsec = (long)(deadline % 1000000000ull);
    pthread_mutex_lock(&w->mu);
    while (!w->created && w->final == RG_OK) {
        if (pthread_cond_timedwait(&w->cond, &w->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    if (w->created) {
        st = RG_OK;
    } else if (w->final != RG_OK) {
        st = rg_error(w->final, "%s", w->final_msg);
    } else {
        st = rg_error(RG_ETIMEDOUT, "etcd watch on %s: not confirmed by any of %zu endpoints "
                      "before the deadline", w->key, w->conn.n_urls);
    }
    pthread_mutex_unlock(&w->mu);
    if (st != RG_OK) {
        rg_etcd_watch_destroy(w);
        return st;
    }
    *watch_p = w;
    return RG_OK;

err:
    if (w->multi != NULL) {
        curl_multi_cleanup(w->multi);
    }
    if (w->efd >= 0) {
        close(w->efd);
    }
    free(w->key);
    free(w->range_end);
    rg_dbuf_cleanup(&w->line);
    etcd_conn_cleanup(&w->conn);
    free(w);
    return st;
}

rg_status_t rg_etcd_watch_next(rg_etcd_watch_t *w, rg_deadline_t deadline,
                               rg_etcd_event_t *ev, int64_t *compact_revision_p)
{
    struct timespec ts;
    rg_status_t st;
    uint64_t drain;

    if (w == NULL || ev == NULL) {
        return rg_error(RG_EINVAL, "etcd watch next: NULL argument");
    }
    deadline = etcd_conn_deadline(&w->conn, deadline);
    ts.tv_sec = (time_t)(deadline / 1000000000ull);
    ts.tv_nsec = (long)(deadline % 1000000000ull);
    pthread_mutex_lock(&w->mu);
    while (w->q_len == 0 && w->final == RG_OK && !rg_deadline_passed(deadline)) {
        if (pthread_cond_timedwait(&w->cond, &w->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
    if (w->q_len > 0) {
        *ev = w->queue[w->q_head];
        w->q_head = (w->q_head + 1) % w->q_cap;
        w->q_len--;
        w->taken_rev = ev->kv.mod_revision;
        st = RG_OK;
    } else if (w->final != RG_OK) {
        st = rg_error(w->final, "%s", w->final_msg);
        if (compact_revision_p != NULL) {
            *compact_revision_p = w->compact_rev;
        }
    } else {
        st = RG_ETIMEDOUT;
    }
    if (w->q_len == 0 && w->final == RG_OK) {
        /* Nothing left: make the fd unreadable until the next event. */
        if (read(w->efd, &drain, sizeof(drain)) < 0 && errno != EAGAIN) {
            rg_warn("watch: eventfd read: %m");
        }
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

int rg_etcd_watch_fd(rg_etcd_watch_t *w)
{
    return w->efd;
}

int64_t rg_etcd_watch_revision(rg_etcd_watch_t *w)
{
    int64_t r;
    pthread_mutex_lock(&w->mu);
    r = w->taken_rev;
    pthread_mutex_unlock(&w->mu);
    return r;
}

void rg_etcd_event_cleanup(rg_etcd_event_t *ev)
{
    if (ev == NULL) {
        return;
    }
    rg_etcd_kv_cleanup(&ev->kv);
    if (ev->has_prev) {
        rg_etcd_kv_cleanup(&ev->prev_kv);
        ev->has_prev = false;
    }
}

void rg_etcd_watch_destroy(rg_etcd_watch_t *w)
{
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_mutex_unlock(&w->mu);
    curl_multi_wakeup(w->multi);
    pthread_join(w->thread, NULL);
    while (w->q_len > 0) {
        rg_etcd_event_cleanup(&w->queue[w->q_head]);
        w->q_head = (w->q_head + 1) % w->q_cap;
        w->q_len--;
    }
    free(w->queue);
    curl_multi_cleanup(w->multi);
    close(w->efd);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mu);
    free(w->key);
    free(w->range_end);
    rg_dbuf_cleanup(&w->line);
    etcd_conn_cleanup(&w->conn);
    free(w);
}

void rg_etcd_watch_stats_add(const rg_etcd_watch_t *watch, rg_etcd_stats_t *sum)
{
    if (watch != NULL) {
        etcd_conn_stats_add(&watch->conn, sum);
    }
}
