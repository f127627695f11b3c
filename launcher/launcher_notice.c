/*
 * Preemption notices (launcher_notice.h): the metadata watcher, and a round while a node
 * leaves.
 *
 * The poll interval, LAUNCHER_NOTICE_POLL_MS = 1 s: the shortest notice a cloud documents is
 * 30 s (GCE, and Azure's Preempt events), AWS gives two minutes; a look a second costs at most
 * a second of that (3% of GCE's, under 1% of AWS's) and one small request to a link-local
 * service, far below what the services throttle at. (Bamboo polls AWS every 3 s, Varuna
 * Azure every 5 s.) Each request is bounded by LAUNCHER_NOTICE_REQUEST_MS, so a service that
 * hangs delays the next look, never the agent, which waits on the watcher's eventfd in its own
 * poll(): a notice wakes it at once.
 */
#include "launcher_notice.h"

#include "cloud_meta.h"
#include "rdzv_leaving.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define WATCH_BASE_DEFAULT   "http://169.254.169.254"
#define AWS_TOKEN_TTL_S      21600   /* asked for; renewed after a tenth of it */
#define AZURE_EVENTS_PATH    "/metadata/scheduledevents?api-version=2020-07-01"
#define MAPS_LINES_MAX       100000  /* of a worker's /proc/<pid>/maps */

static const char *const provider_names[] = {"none", "aws", "gce", "azure", "auto"};

struct launcher_watch {
    rg_agent_notice_t want;
    rg_agent_notice_t provider;          /* the one watched (auto: the one found) */
    char              base[512];
    pthread_t         thread;
    bool              started;
    atomic_bool       stop;
    pthread_mutex_t   mu;
    pthread_cond_t    cv;                /* signalled on stop */
    int               efd;
    int               epfd;              /* efd + the caller's fd (launcher_watch_join_fd) */
    bool              have;              /* a notice arrived (under mu) */
    bool              taken;
    launcher_preempt_t notice;
    char              token[256];        /* AWS IMDSv2 session token, "" for none */
    int64_t           token_ms;
    char              azure_event[128];  /* the event to acknowledge */
};

static void watch_url(const launcher_watch_t *w, const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", w->base, path);
}

/* One request with the watcher's cancel flag. */
static rg_status_t watch_http(launcher_watch_t *w, const char *method, const char *path,
                              const char *h0, const char *h1, const char *body,
                              int64_t timeout_ms, meta_resp_t *resp)
{
    char url[700];
    watch_url(w, path, url, sizeof(url));
    meta_req_t rq = {.method = method, .url = url, .headers = {h0, h1}, .body = body,
                     .timeout_ms = timeout_ms, .cancel = &w->stop};
    return meta_http(&rq, resp);
}

/* The wall time t as CLOCK_MONOTONIC ms. */
static int64_t mono_of_wall(double t)
{
    return rg_notice_now_ms() + (int64_t)((t - rg_wall_s()) * 1000.0);
}

static void utc_str(double t, char *buf, size_t cap)
{
    time_t s = (time_t)t;
    struct tm tm;
    if (gmtime_r(&s, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
        snprintf(buf, cap, "?");
    }
}

static rg_status_t aws_token(launcher_watch_t *w, int64_t timeout_ms)
{
    char ttl[80];
    meta_resp_t r;
    rg_status_t st;

    snprintf(ttl, sizeof(ttl), "X-aws-ec2-metadata-token-ttl-seconds: %d", AWS_TOKEN_TTL_S);
    st = watch_http(w, "PUT", "/latest/api/token", ttl, NULL, NULL, timeout_ms, &r);
    if (st != RG_OK) {
        return st;
    }
    size_t n = r.len;
    while (n > 0 && (r.body[n - 1] == '\n' || r.body[n - 1] == '\r')) {
        n--;
    }
    if (r.http != 200 || n == 0 || n >= sizeof(w->token) || memchr(r.body, '\n', n) != NULL) {
        st = rg_error(RG_EPROTO, "aws: PUT %s/latest/api/token answered %ld (%zu bytes), not "
                      "a token", w->base, r.http, r.len);
    } else {
        memcpy(w->token, r.body, n);
        w->token[n] = '\0';
        w->token_ms = rg_notice_now_ms();
    }
    meta_resp_cleanup(&r);
    return st;
}

static rg_status_t poll_aws(launcher_watch_t *w, launcher_preempt_t *pn, bool *found)
{
    char hdr[300];
    meta_resp_t r;
    rg_status_t st;

    if (w->token[0] == '\0' ||
        rg_notice_now_ms() - w->token_ms > AWS_TOKEN_TTL_S * 1000LL / 10) {
        st = aws_token(w, LAUNCHER_NOTICE_REQUEST_MS);
        if (st != RG_OK) {
            return st;
        }
    }
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", w->token);
    st = watch_http(w, "GET", "/latest/meta-data/spot/instance-action", hdr, NULL, NULL,
                    LAUNCHER_NOTICE_REQUEST_MS, &r);
    if (st != RG_OK) {
        return st;
    }
    if (r.http == 404) {
        meta_resp_cleanup(&r);   /* no interruption scheduled: the normal answer */
        return RG_OK;
    }
    if (r.http == 401) {
        w->token[0] = '\0';      /* expired or refused: a new one at the next look */
        meta_resp_cleanup(&r);
        return rg_error(RG_EAUTH, "aws: the metadata service refused the session token");
    }
    if (r.http != 200) {
        st = rg_error(RG_ESERVER, "aws: spot/instance-action answered %ld", r.http);
        meta_resp_cleanup(&r);
        return st;
    }
    char action[32];
    double t;
    st = meta_aws_action_decode(r.body, r.len, action, sizeof(action), &t);
    meta_resp_cleanup(&r);
    if (st != RG_OK) {
        return st;
    }
    char when[40];
    utc_str(t, when, sizeof(when));
    *found = true;
    pn->end_ms = mono_of_wall(t);
    snprintf(pn->reason, sizeof(pn->reason), "aws spot instance-action: %s at %s", action,
             when);
    return RG_OK;
}

static rg_status_t poll_gce(launcher_watch_t *w, launcher_preempt_t *pn, bool *found)
{
    meta_resp_t r;
    bool preempted = false;
    rg_status_t st = watch_http(w, "GET", "/computeMetadata/v1/instance/preempted",
                                "Metadata-Flavor: Google", NULL, NULL,
                                LAUNCHER_NOTICE_REQUEST_MS, &r);
    if (st != RG_OK) {
        return st;
    }
    if (r.http != 200) {
        st = rg_error(RG_ESERVER, "gce: instance/preempted answered %ld", r.http);
    } else {
        st = meta_gce_preempted_decode(r.body, r.len, &preempted);
    }
    meta_resp_cleanup(&r);
    if (st == RG_OK && preempted) {
        *found = true;
        pn->end_ms = rg_notice_now_ms() + LAUNCHER_NOTICE_GCE_MS;
        snprintf(pn->reason, sizeof(pn->reason), "gce instance/preempted: TRUE (%d s)",
                 LAUNCHER_NOTICE_GCE_MS / 1000);
    }
    return st;
}

static rg_status_t azure_events(launcher_watch_t *w, int64_t timeout_ms, meta_azure_t *a)
{
    meta_resp_t r;
    rg_status_t st = watch_http(w, "GET", AZURE_EVENTS_PATH, "Metadata: true", NULL, NULL,
                                timeout_ms, &r);
    if (st != RG_OK) {
        return st;
    }
    if (r.http != 200) {
        st = rg_error(RG_ESERVER, "azure: scheduledevents answered %ld", r.http);
    } else {
        st = meta_azure_decode(r.body, r.len, a);
    }
    meta_resp_cleanup(&r);
    return st;
}

static rg_status_t poll_azure(launcher_watch_t *w, launcher_preempt_t *pn, bool *found)
{
    meta_azure_t a;
    rg_status_t st = azure_events(w, LAUNCHER_NOTICE_REQUEST_MS, &a);
    if (st != RG_OK || !a.found) {
        return st;
    }
    char when[40] = "now";
    if (a.not_before > 0) {
        utc_str(a.not_before, when, sizeof(when));
    }
    *found = true;
    pn->end_ms = a.not_before > 0 ? mono_of_wall(a.not_before) : rg_notice_now_ms();
    snprintf(w->azure_event, sizeof(w->azure_event), "%s", a.event_id);
    snprintf(pn->reason, sizeof(pn->reason), "azure scheduled event %s %.40s (incarnation "
             "%lld) not before %s", a.type, a.event_id, (long long)a.incarnation, when);
    return RG_OK;
}

/* --preemption-notice=auto: the first service that answers as itself, quickly. */
static rg_agent_notice_t probe(launcher_watch_t *w)
{
    meta_resp_t r;
    meta_azure_t a;

    if (aws_token(w, LAUNCHER_NOTICE_PROBE_MS) == RG_OK) {
        return RG_AGENT_NOTICE_AWS;
    }
    if (watch_http(w, "GET", "/computeMetadata/v1/instance/preempted",
                   "Metadata-Flavor: Google", NULL, NULL, LAUNCHER_NOTICE_PROBE_MS,
                   &r) == RG_OK) {
        bool gce = r.http == 200 && r.google;
        meta_resp_cleanup(&r);
        if (gce) {
            return RG_AGENT_NOTICE_GCE;
        }
    }
    if (azure_events(w, LAUNCHER_NOTICE_PROBE_MS, &a) == RG_OK) {
        return RG_AGENT_NOTICE_AZURE;
    }
    return RG_AGENT_NOTICE_NONE;
}

/* Sleeps up to ms unless stopped; true if stopped. */
static bool watch_wait(launcher_watch_t *w, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    while (!atomic_load(&w->stop) &&
           pthread_cond_timedwait(&w->cv, &w->mu, &ts) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&w->mu);
    return atomic_load(&w->stop);
}

static void *watch_main(void *arg)
{
    launcher_watch_t *w = arg;
    bool failing = false;

    if (w->want == RG_AGENT_NOTICE_AUTO) {
        w->provider = probe(w);
        if (w->provider == RG_AGENT_NOTICE_NONE) {
            if (!atomic_load(&w->stop)) {
                fprintf(stderr, "regroup: --preemption-notice=auto: no metadata service "
                        "answered at %s (tried aws, gce, azure); no preemption notices will "
                        "be seen (SIGTERM still is)\n", w->base);
            }
            return NULL;
        }
        fprintf(stderr, "regroup: --preemption-notice=auto: found %s at %s\n",
                provider_names[w->provider], w->base);
    }
    /* Bounded by the stop flag: every look ends within a request's time. */
    while (!atomic_load(&w->stop)) {
        launcher_preempt_t pn = {.provider = w->provider};
        bool found = false;
        rg_status_t st = w->provider == RG_AGENT_NOTICE_AWS   ? poll_aws(w, &pn, &found)
                         : w->provider == RG_AGENT_NOTICE_GCE ? poll_gce(w, &pn, &found)
                                                              : poll_azure(w, &pn, &found);
        if (st == RG_ECANCELED || atomic_load(&w->stop)) {
            break;
        }
        if (st != RG_OK && !failing) {
            rg_warn("--preemption-notice=%s: %s; the agent carries on, and looks again every "
                    "%d ms", provider_names[w->provider], rg_last_error(),
                    LAUNCHER_NOTICE_POLL_MS);
            failing = true;
        } else if (st == RG_OK && failing) {
            rg_warn("--preemption-notice=%s: the metadata service answers again",
                    provider_names[w->provider]);
            failing = false;
        }
        if (found) {
            uint64_t one = 1;
            pthread_mutex_lock(&w->mu);
            w->notice = pn;
            w->have = true;
            pthread_mutex_unlock(&w->mu);
            if (write(w->efd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
                rg_warn("notice watcher: eventfd write: %m");
            }
            break;   /* one notice is the node's last */
        }
        if (watch_wait(w, LAUNCHER_NOTICE_POLL_MS)) {
            break;
        }
    }
    return NULL;
}

rg_status_t launcher_metadata_url_check(void)
{
    const char *env = getenv("REGROUP_METADATA_URL");
    if (env != NULL && env[0] != '\0' &&
        ((strncmp(env, "http://", 7) != 0 && strncmp(env, "https://", 8) != 0) ||
         strlen(env) >= sizeof(((launcher_watch_t *)NULL)->base) || strlen(env) < 9)) {
        return rg_error(RG_EINVAL, "REGROUP_METADATA_URL=%s: expected http://HOST[:PORT] or "
                        "https://HOST[:PORT] (the metadata services' base URL)", env);
    }
    return RG_OK;
}

rg_status_t launcher_watch_start(rg_agent_notice_t provider, launcher_watch_t **w_p)
{
    const char *env = getenv("REGROUP_METADATA_URL");
    launcher_watch_t *w;
    rg_status_t st;

    *w_p = NULL;
    if (provider == RG_AGENT_NOTICE_NONE) {
        return RG_OK;
    }
    st = launcher_metadata_url_check();
    if (st != RG_OK) {
        return st;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return rg_error(RG_ENOMEM, "notice watcher");
    }
    w->want = provider;
    w->provider = provider;
    snprintf(w->base, sizeof(w->base), "%s", env && env[0] ? env : WATCH_BASE_DEFAULT);
    size_t n = strlen(w->base);
    if (w->base[n - 1] == '/') {
        w->base[n - 1] = '\0';
    }
    atomic_init(&w->stop, false);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->epfd = -1;
    w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->efd < 0) {
        rg_status_t st = rg_error(RG_ESYS, "notice watcher: eventfd: %s", strerror(errno));
        launcher_watch_stop(w);
        return st;
    }
    int rc = pthread_create(&w->thread, NULL, watch_main, w);
    if (rc != 0) {
        launcher_watch_stop(w);
        return rg_error(RG_ESYS, "notice watcher: pthread_create: %s", strerror(rc));
    }
    w->started = true;
    rg_info("--preemption-notice=%s: watching %s every %d ms", provider_names[provider],
            w->base, LAUNCHER_NOTICE_POLL_MS);
    *w_p = w;
    return RG_OK;
}

int launcher_watch_fd(const launcher_watch_t *w)
{
    return w != NULL ? w->efd : -1;
}

int launcher_watch_join_fd(launcher_watch_t *w, int fd)
{
    if (w == NULL) {
        return fd;
    }
    if (w->epfd < 0) {
        struct epoll_event ev = {.events = EPOLLIN};
        int ep = epoll_create1(EPOLL_CLOEXEC);
        ev.data.fd = fd;
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            rg_warn("notice watcher: epoll: %m; a notice is seen only once a round runs");
            if (ep >= 0) {
                close(ep);
            }
            return fd;
        }
        ev.data.fd = w->efd;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, w->efd, &ev) != 0) {
            rg_warn("notice watcher: epoll: %m; a notice is seen only once a round runs");
            close(ep);
            return fd;
        }
        w->epfd = ep;
    }
    return w->epfd;
}

bool launcher_watch_take(launcher_watch_t *w, launcher_preempt_t *out)
{
    uint64_t v;
    bool got = false;

    if (w == NULL) {
        return false;
    }
    if (read(w->efd, &v, sizeof(v)) < 0 && errno != EAGAIN) {
        rg_warn("notice watcher: eventfd read: %m");
    }
    pthread_mutex_lock(&w->mu);
    if (w->have && !w->taken) {
        *out = w->notice;
        w->taken = true;
        got = true;
    }
    pthread_mutex_unlock(&w->mu);
    return got;
}

void launcher_watch_ack(launcher_watch_t *w)
{
    char *body = NULL;
    meta_resp_t r;

    if (w == NULL || w->provider != RG_AGENT_NOTICE_AZURE || !w->taken ||
        w->azure_event[0] == '\0') {
        return;
    }
    if (meta_azure_ack_body(w->azure_event, &body) != RG_OK) {
        rg_warn("azure: cannot acknowledge event %s: %s", w->azure_event, rg_last_error());
        return;
    }
    meta_req_t rq = {.method = "POST", .headers = {"Metadata: true",
                                                   "Content-Type: application/json"},
                     .body = body, .timeout_ms = LAUNCHER_NOTICE_REQUEST_MS};
    char url[700];
    watch_url(w, AZURE_EVENTS_PATH, url, sizeof(url));
    rq.url = url;
    if (meta_http(&rq, &r) != RG_OK) {
        rg_warn("azure: cannot acknowledge event %s: %s", w->azure_event, rg_last_error());
    } else {
        if (r.http != 200) {
            rg_warn("azure: the acknowledgement of event %s answered %ld", w->azure_event,
                    r.http);
        }
        meta_resp_cleanup(&r);
    }
    free(body);
}

void launcher_watch_stop(launcher_watch_t *w)
{
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    atomic_store(&w->stop, true);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->started) {
        pthread_join(w->thread, NULL);
    }
    if (w->efd >= 0) {
        close(w->efd);
    }
    if (w->epfd >= 0) {
        close(w->epfd);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* ---- a round while some node leaves ------------------------------------------------------- */

/* Whether worker pid mapped its agent's notice page (rg_notice_view_open: the worker API
 * did); false if its maps cannot be read. */
static bool maps_notice_page(pid_t pid)
{
    char path[64];
    char line[512];
    bool found = false;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    for (int k = 0; k < MAPS_LINES_MAX && !found && fgets(line, sizeof(line), f) != NULL;
         k++) {
        found = strstr(line, "/memfd:regroup-notice") != NULL;
    }
    fclose(f);
    return found;
}

/* Whether some running worker reads the notice page (it can take a last checkpoint). */
static bool workers_read_page(const launcher_leave_t *lv)
{
    for (int i = 0; i < lv->ws->n; i++) {
        if (lv->ws->w[i].running && maps_notice_page(lv->ws->w[i].pid)) {
            return true;
        }
    }
    return false;
}

void launcher_leave_init(launcher_leave_t *lv, const rg_agent_params_t *cfg,
                         launcher_workers_t *ws, rg_rdzv_t *rdzv, rg_notice_host_t *notice,
                         const rg_rdzv_assignment_t *asg)
{
    *lv = (launcher_leave_t){.cfg = cfg, .ws = ws, .rdzv = rdzv, .notice = notice,
                             .asg = asg};
    rg_notice_post(notice, RG_NOTICE_KIND_NONE, asg->round, 0, NULL);
}

void launcher_leave_begin(launcher_leave_t *lv, const char *reason, int64_t end_ms)
{
    int64_t now = rg_notice_now_ms();
    bool again = lv->own;

    if (again && end_ms >= lv->end_ms) {
        return;   /* an earlier end stands */
    }
    lv->own = true;
    lv->end_ms = end_ms;
    int64_t span = RG_MAX(end_ms - now, 0);
    lv->workers_ms = end_ms - RG_MIN(span / 10, 500);
    if (!again) {
        snprintf(lv->reason, sizeof(lv->reason), "%s", reason);
    } else {
        snprintf(lv->reason + strlen(lv->reason), sizeof(lv->reason) - strlen(lv->reason),
                 "; then %s", reason);
    }
    rg_notice_post(lv->notice, RG_NOTICE_KIND_PREEMPT, lv->asg->round, lv->workers_ms,
                   lv->reason);
    /* (said once posted: a worker's next step boundary sees what this line says) */
    fprintf(stderr, "regroup: this node leaves the job: %s; %lld ms left for the workers' "
            "last checkpoint\n", lv->reason, (long long)RG_MAX(lv->workers_ms - now, 0));
    rg_info("leaving the job: %s", lv->reason);   /* timestamped, for rg-bench-notice */
    /* Wall time for the other machines: their monotonic clocks are their own. */
    double deadline = rg_wall_s() + (double)(lv->workers_ms - now) / 1000.0;
    if (rdzv_leaving_announce(lv->rdzv, lv->reason, deadline) != RG_OK) {
        rg_warn("cannot tell the other nodes that this one leaves: %s (they will see it go)",
                rg_last_error());
    }
    if (again) {
        return;
    }
    /* A program that does not read the page would learn nothing before the end: it gets
     * SIGTERM now, and with it the whole notice. */
    for (int i = 0; i < lv->ws->n; i++) {
        launcher_worker_t *w = &lv->ws->w[i];
        if (w->running && !maps_notice_page(w->pid)) {
            rg_info("worker rank %d does not read the notice page: SIGTERM now", w->rank);
            kill(-w->pid, SIGTERM);
        }
    }
}

void launcher_leave_others(launcher_leave_t *lv)
{
    const rg_rdzv_assignment_t *a = lv->asg;
    const char *self = rg_rdzv_agent_id(lv->rdzv);

    if (lv->others) {
        return;
    }
    for (int i = 0; i < a->n_members; i++) {
        const rdzv_leaving_rec_t *rec;
        if (strcmp(a->members[i].agent, self) == 0 ||
            (rec = rdzv_leaving_find(lv->rdzv, a->members[i].agent)) == NULL) {
            continue;
        }
        char reason[RG_NOTICE_REASON_MAX];
        int64_t at = mono_of_wall(rec->deadline);
        lv->others = true;
        lv->others_ms = at;
        snprintf(reason, sizeof(reason), "node %.32s leaves: %.80s", a->members[i].addr,
                 rec->reason);
        fprintf(stderr, "regroup: %s; %lld ms left for the last checkpoint\n", reason,
                (long long)RG_MAX(at - rg_notice_now_ms(), 0));
        if (!lv->own && lv->cfg->recovery == RG_AGENT_RECOVERY_IN_PLACE) {
            /* In place this node stays: for its workers it is a planned change of the
             * members (the next round's), taken after the leaving node's last step. */
            rg_notice_post(lv->notice, RG_NOTICE_KIND_MEMBERS, a->round + 1, at, reason);
        } else if (!lv->own) {
            rg_notice_post(lv->notice, RG_NOTICE_KIND_PREEMPT, a->round, at, reason);
        }
        return;
    }
}

/* When the agent stops waiting for its workers. */
static int64_t leave_until(const launcher_leave_t *lv)
{
    if (lv->own) {
        return lv->workers_ms;
    }
    return lv->drain ? lv->others_ms + lv->cfg->grace_ms : INT64_MAX;
}

int64_t launcher_leave_poll_ms(const launcher_leave_t *lv, int64_t tick_ms)
{
    int64_t until = leave_until(lv);
    if (until == INT64_MAX) {
        return tick_ms;
    }
    return RG_MAX(RG_MIN(tick_ms, until - rg_notice_now_ms()), 0);
}

bool launcher_leave_excused(launcher_leave_t *lv)
{
    if (!lv->own && !lv->others) {
        /* A worker that failed because a peer's node went may be reaped before this agent
         * read that node's record: read it now (it has no lease, it is still there). */
        if (rdzv_leaving_read(lv->rdzv) != RG_OK) {
            rg_warn("cannot read the round's leaving records: %s", rg_last_error());
        }
        launcher_leave_others(lv);
    }
    return lv->own || lv->others;
}

bool launcher_leave_explains(launcher_leave_t *lv)
{
    bool gone = false;
    if (!launcher_leave_excused(lv) || lv->own) {
        return lv->own;
    }
    if (rdzv_leaving_await_gone(lv->rdzv, rg_deadline_in_ms(LAUNCHER_LEAVE_EXPLAIN_MS),
                                &gone) != RG_OK) {
        rg_warn("cannot tell whether the leaving node has gone: %s (the failure is not "
                "counted)", rg_last_error());
        return true;
    }
    if (!gone) {
        fprintf(stderr, "regroup: the leaving node is still there %d ms after the failure: "
                "the failure is its worker's own\n", LAUNCHER_LEAVE_EXPLAIN_MS);
    }
    return gone;
}

bool launcher_leave_holds(launcher_leave_t *lv, rg_rdzv_change_t change)
{
    if (change == RG_RDZV_FAILURE || change == RG_RDZV_NEW_ROUND ||
        change == RG_RDZV_LEASE_LOST) {
        return false;   /* the job moves on without this round's last checkpoint */
    }
    if (lv->own) {
        return true;    /* this node is on its way out: its workers finish first */
    }
    if (lv->others && lv->cfg->recovery == RG_AGENT_RECOVERY_IN_PLACE) {
        return false;   /* in place the workers stay and regroup: nothing to wait for */
    }
    if (lv->others && workers_read_page(lv)) {
        lv->drain = true;
        return !launcher_leave_expired(lv);
    }
    return false;   /* workers that cannot hear of it have nothing to finish */
}

bool launcher_leave_expired(const launcher_leave_t *lv)
{
    return lv->ws->running > 0 && rg_notice_now_ms() >= leave_until(lv);
}

void launcher_leave_stop(launcher_leave_t *lv)
{
    int64_t grace = lv->own ? RG_MAX(lv->end_ms - rg_notice_now_ms(), 0) : lv->cfg->grace_ms;
    if (lv->ws->running > 0) {
        rg_warn("%d worker(s) still running at the deadline: stopping them (SIGKILL in %lld ms)",
                lv->ws->running, (long long)grace);
    }
    launcher_workers_stop(lv->ws, grace, SIGTERM, lv->cfg);
}
