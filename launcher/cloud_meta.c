/* The clouds' metadata services: one bounded request, and their answers (cloud_meta.h). */
#include "cloud_meta.h"

#include <curl/curl.h>
#include <jansson.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static pthread_once_t meta_curl_once = PTHREAD_ONCE_INIT;

/* libcurl 7.84 and later make this thread-safe; etcd_conn.c calls it too (it counts). */
static void meta_curl_global(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

typedef struct {
    rg_dbuf_t  body;
    bool       google;
} meta_sink_t;

static size_t meta_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    meta_sink_t *s = userdata;
    return rg_dbuf_append(&s->body, ptr, size * nmemb) == RG_OK ? size * nmemb : 0;
}

static size_t meta_header(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    meta_sink_t *s = userdata;
    size_t n = size * nmemb;
    static const char name[] = "metadata-flavor:";
    if (n > sizeof(name) && strncasecmp(ptr, name, sizeof(name) - 1) == 0) {
        const char *v = ptr + sizeof(name) - 1;
        size_t left = n - (sizeof(name) - 1);
        while (left > 0 && (*v == ' ' || *v == '\t')) {
            v++;
            left--;
        }
        s->google = left >= 6 && strncasecmp(v, "Google", 6) == 0;
    }
    return n;
}

static int meta_progress(void *userdata, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                         curl_off_t un)
{
    const atomic_bool *cancel = userdata;
    (void)dt, (void)dn, (void)ut, (void)un;
    return cancel != NULL && atomic_load(cancel) ? 1 : 0;
}

rg_status_t meta_http(const meta_req_t *req, meta_resp_t *resp)
{
    struct curl_slist *h = NULL;
    meta_sink_t sink = {.google = false};
    char errbuf[CURL_ERROR_SIZE] = "";
    rg_status_t st = RG_OK;
    CURL *easy;
    CURLcode rc;

    memset(resp, 0, sizeof(*resp));
    pthread_once(&meta_curl_once, meta_curl_global);
    easy = curl_easy_init();
    if (easy == NULL) {
        return rg_error(RG_ENOMEM, "metadata: curl_easy_init failed");
    }
    rg_dbuf_init(&sink.body, META_BODY_MAX);
    for (int i = 0; i < META_HEADERS_MAX && req->headers[i] != NULL; i++) {
        struct curl_slist *n = curl_slist_append(h, req->headers[i]);
        if (n == NULL) {
            st = rg_error(RG_ENOMEM, "metadata: headers");
            goto out;
        }
        h = n;
    }
    /* No proxy: the metadata services are link-local, and a proxy would see the token. */
    curl_easy_setopt(easy, CURLOPT_URL, req->url);
    curl_easy_setopt(easy, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, req->method);
    if (req->body != NULL || strcmp(req->method, "GET") != 0) {
        const char *body = req->body ? req->body : "";
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, meta_write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, meta_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, &sink);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)RG_MAX(req->timeout_ms, 1));
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long)RG_MAX(req->timeout_ms, 1));
    curl_easy_setopt(easy, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(easy, CURLOPT_XFERINFOFUNCTION, meta_progress);
    curl_easy_setopt(easy, CURLOPT_XFERINFODATA, (void *)req->cancel);
    rc = curl_easy_perform(easy);
    if (rc != CURLE_OK) {
        const char *why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
        if (rc == CURLE_ABORTED_BY_CALLBACK) {
            st = rg_error(RG_ECANCELED, "%s %s: canceled", req->method, req->url);
        } else if (rc == CURLE_OPERATION_TIMEDOUT) {
            st = rg_error(RG_ETIMEDOUT, "%s %s: no answer within %lld ms", req->method,
                          req->url, (long long)req->timeout_ms);
        } else if (rc == CURLE_WRITE_ERROR) {
            st = rg_error(RG_ETOOBIG, "%s %s: answer larger than %d bytes", req->method,
                          req->url, META_BODY_MAX);
        } else {
            st = rg_error(RG_EUNREACH, "%s %s: %s", req->method, req->url, why);
        }
        goto out;
    }
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &resp->http);
    resp->google = sink.google;
    resp->len = sink.body.len;
    resp->body = sink.body.data ? sink.body.data : calloc(1, 1);
    sink.body.data = NULL;
    if (resp->body == NULL) {
        st = rg_error(RG_ENOMEM, "metadata: answer");
    }
out:
    rg_dbuf_cleanup(&sink.body);
    curl_slist_free_all(h);
    curl_easy_cleanup(easy);
    return st;
}

void meta_resp_cleanup(meta_resp_t *resp)
{
    free(resp->body);
    memset(resp, 0, sizeof(*resp));
}

bool meta_time_iso8601(const char *s, double *t)
{
    struct tm tm;
    char *end;
    double frac = 0;

    memset(&tm, 0, sizeof(tm));
    end = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (end == NULL) {
        return false;
    }
    if (*end == '.') {
        char *fe;
        frac = strtod(end, &fe);
        if (fe == end + 1) {
            return false;
        }
        end = fe;
    }
    if (strcmp(end, "Z") != 0 && strcmp(end, "+00:00") != 0) {
        return false;
    }
    time_t secs = timegm(&tm);
    if (secs == (time_t)-1) {
        return false;
    }
    *t = (double)secs + frac;
    return true;
}

bool meta_time_rfc1123(const char *s, double *t)
{
    struct tm tm;
    char *end;

    memset(&tm, 0, sizeof(tm));
    end = s ? strptime(s, "%a, %d %b %Y %H:%M:%S", &tm) : NULL;
    if (end == NULL || (strcmp(end, " GMT") != 0 && strcmp(end, " UTC") != 0)) {
        return false;
    }
    time_t secs = timegm(&tm);
    if (secs == (time_t)-1) {
        return false;
    }
    *t = (double)secs;
    return true;
}

static json_t *meta_load(const char *what, const char *v, size_t len)
{
    json_t *j = v != NULL && len <= META_BODY_MAX ? json_loadb(v, len, 0, NULL) : NULL;
    if (!json_is_object(j)) {
        json_decref(j);
        rg_error(RG_EPROTO, "%s: not a JSON object: '%.*s'", what, v ? (int)RG_MIN(len, 60) : 0,
                 v ? v : "");
        return NULL;
    }
    return j;
}

rg_status_t meta_aws_action_decode(const char *v, size_t len, char *action, size_t cap,
                                   double *time)
{
    json_t *j = meta_load("aws spot/instance-action", v, len);
    const char *a = json_string_value(json_object_get(j, "action"));
    const char *ts = json_string_value(json_object_get(j, "time"));
    double t;
    bool ok = a != NULL && a[0] != '\0' && strlen(a) < cap && meta_time_iso8601(ts, &t);

    if (j != NULL && ok) {
        snprintf(action, cap, "%s", a);
        *time = t;
    }
    json_decref(j);
    if (j == NULL) {
        return RG_EPROTO;
    }
    return ok ? RG_OK : rg_error(RG_EPROTO, "aws spot/instance-action: no action or no ISO "
                                 "8601 time in '%.*s'", (int)RG_MIN(len, 80), v);
}

rg_status_t meta_gce_preempted_decode(const char *v, size_t len, bool *preempted)
{
    while (len > 0 && (v[len - 1] == '\n' || v[len - 1] == '\r' || v[len - 1] == ' ')) {
        len--;
    }
    if (len == 4 && strncmp(v, "TRUE", 4) == 0) {
        *preempted = true;
        return RG_OK;
    }
    if (len == 5 && strncmp(v, "FALSE", 5) == 0) {
        *preempted = false;
        return RG_OK;
    }
    return rg_error(RG_EPROTO, "gce instance/preempted: '%.*s', not TRUE or FALSE",
                    (int)RG_MIN(len, 60), v);
}

rg_status_t meta_azure_decode(const char *v, size_t len, meta_azure_t *out)
{
    json_t *j = meta_load("azure scheduledevents", v, len);
    json_t *inc = json_object_get(j, "DocumentIncarnation");
    json_t *events = json_object_get(j, "Events");
    meta_azure_t a = {0};
    size_t i;
    json_t *e;

    if (j == NULL) {
        return RG_EPROTO;
    }
    if (!json_is_integer(inc) || !json_is_array(events)) {
        json_decref(j);
        return rg_error(RG_EPROTO, "azure scheduledevents: no DocumentIncarnation or Events");
    }
    a.incarnation = json_integer_value(inc);
    json_array_foreach(events, i, e) {
        const char *type = json_string_value(json_object_get(e, "EventType"));
        const char *id = json_string_value(json_object_get(e, "EventId"));
        const char *nb = json_string_value(json_object_get(e, "NotBefore"));
        if (type == NULL || (strcmp(type, "Preempt") != 0 && strcmp(type, "Terminate") != 0)) {
            continue;
        }
        if (id == NULL || strlen(id) >= sizeof(a.event_id) || nb == NULL ||
            (nb[0] != '\0' && !meta_time_rfc1123(nb, &a.not_before))) {
            rg_status_t st = rg_error(RG_EPROTO, "azure scheduledevents: a %s event without a "
                                      "usable EventId or NotBefore", type);
            json_decref(j);   /* type points into it */
            return st;
        }
        a.found = true;
        snprintf(a.event_id, sizeof(a.event_id), "%s", id);
        snprintf(a.type, sizeof(a.type), "%s", type);
        break;
    }
    json_decref(j);
    *out = a;
    return RG_OK;
}

rg_status_t meta_azure_ack_body(const char *event_id, char **text_p)
{
    json_t *doc = json_pack("{s:[{s:s}]}", "StartRequests", "EventId", event_id);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (text == NULL) {
        return rg_error(RG_ENOMEM, "azure acknowledgement");
    }
    *text_p = text;
    return RG_OK;
}
