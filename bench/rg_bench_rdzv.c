/*
 * rg-bench-rdzv: what a round costs against the job's size, with real rendezvous handles on
 * a real etcd.
 *
 *   rg-bench-rdzv [--nodes=16,32,64,128,256] [--reps=3] [--nproc=8] [--steady-s=5]
 *                 [--steady-max=32] [--progress-hz=2]
 *
 * It starts a private etcd on a free loopback port (and stops it). For each repetition, and
 * in it for each N (so that the sizes alternate over time and the machine's drift falls on
 * all of them), one job of N agents, each a rendezvous handle (rg_rdzv_t) on its own thread,
 * each with --nproc workers (no processes: the handles are what is measured):
 *   form    every handle created (lease, keeper, watch) waits at a barrier, then all join
 *           round 0 (min N-1, max N: it closes when the N-th registers). form_s: the barrier
 *           to the last join's return. Each handle checks the closed record (round 0, N
 *           members, world N x nproc, its own rank).
 *   steady  (N <= --steady-max) for --steady-s seconds the agents look after their round
 *           (poll their fd, rg_rdzv_check: every change is an error) while two writer
 *           threads put a progress record (workers/status/progress/<rank>, rdzv_rec_progress) for
 *           each of the N x nproc ranks --progress-hz times a second, as rg_report would:
 *           each agent's watch events a second (what fans progress out to the agents).
 *   loss    the last agent leaves (rg_rdzv_leave: its lease revoked, so that the loss is
 *           seen at once and not a TTL later); every other one must see RG_RDZV_MEMBER_LOST,
 *           moves the round on and joins round 1, which must close with the N-1 of them.
 *           regroup_s: the revoke to the last join's return.
 * Per phase, the per-agent cost from rg_rdzv_stats (requests, watch events, bytes received;
 * median and max over the agents) and etcd's own counters from its /metrics (events sent to
 * watchers, puts, ranges, txns, bytes sent to clients). One JSON line per job, then for each
 * N the medians over the repetitions (with min and max), then the exponent k of a fit
 * y = a N^k (least squares on log-log of the medians) for each per-round figure. Exits 1 when
 * any check fails or a phase does not finish within its deadline.
 */
#include "rg_common.h"
#include "etcd_server.h"
#include "rdzv_keys.h"
#include "rg_bench_meta.h"
#include "rg_bench_stats.h"

#include <regroup/rdzv.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAX_SIZES     16
#define MAX_REPS      50
#define PHASE_MS      180000   /* a deadline for each phase */
#define STATS_MAX     (MAX_SIZES * MAX_REPS)
#define WRITERS       2

enum { PH_FORM, PH_STEADY, PH_LOSS, PH_N };
static const char *const ph_name[PH_N] = {"form", "steady", "loss"};

typedef struct {
    double events_sent;    /* etcd_debugging_mvcc_events_total */
    double puts;           /* etcd_mvcc_put_total */
    double ranges;         /* etcd_mvcc_range_total */
    double txns;           /* etcd_mvcc_txn_total */
    double deletes;        /* etcd_mvcc_delete_total */
    double sent_bytes;     /* etcd_network_client_grpc_sent_bytes_total */
} etcd_metrics_t;

typedef struct job job_t;

typedef struct {
    job_t          *job;
    int             i;
    pthread_t       tid;
    rg_rdzv_t      *z;
    char            err[512];
    int64_t         joined_ns[2];           /* round 0, round 1 */
    rg_etcd_stats_t at[PH_N + 1];           /* at the start of each phase, and the end */
} agent_t;

struct job {
    int               n;
    int               nproc;
    char              id[64];
    const char       *endpoints;
    pthread_barrier_t bar;
    atomic_int        phase;                /* what the agents do now */
    atomic_int        failed;
    int64_t           t_form_ns;
    int64_t           t_loss_ns;
    agent_t          *agents;
};

/* ---- etcd's counters ---------------------------------------------------------------------- */

static size_t metrics_cb(char *p, size_t size, size_t n, void *arg)
{
    rg_dbuf_t *b = arg;
    return rg_dbuf_append(b, p, size * n) == RG_OK ? size * n : 0;
}

static double metric(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *l = text; l != NULL && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, len) == 0 && l[len] == ' ') {
            return strtod(l + len + 1, NULL);
        }
    }
    return NAN;
}

static int metrics_read(int port, etcd_metrics_t *m)
{
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", port);
    rg_dbuf_t b;
    rg_dbuf_init(&b, 16u << 20);
    CURL *c = curl_easy_init();
    if (c == NULL) {
        return -1;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, metrics_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK || rg_dbuf_append(&b, "", 1) != RG_OK) {
        rg_dbuf_cleanup(&b);
        return -1;
    }
    *m = (etcd_metrics_t){
        .events_sent = metric(b.data, "etcd_debugging_mvcc_events_total"),
        .puts = metric(b.data, "etcd_mvcc_put_total"),
        .ranges = metric(b.data, "etcd_mvcc_range_total"),
        .txns = metric(b.data, "etcd_mvcc_txn_total"),
        .deletes = metric(b.data, "etcd_mvcc_delete_total"),
        .sent_bytes = metric(b.data, "etcd_network_client_grpc_sent_bytes_total"),
    };
    rg_dbuf_cleanup(&b);
    return isnan(m->events_sent) || isnan(m->puts) ? -1 : 0;
}

/* ---- the agents ---------------------------------------------------------------------------- */

static void agent_fail(agent_t *a, const char *what)
{
    snprintf(a->err, sizeof(a->err), "agent %d: %s: %s", a->i, what, rg_last_error());
    atomic_store(&a->job->failed, 1);
}

static bool agent_check(agent_t *a, const rg_rdzv_assignment_t *as, int round, int members)
{
    job_t *j = a->job;
    if (as->round != round || as->n_members != members || as->world_size != members * j->nproc ||
        as->group_rank < 0 || as->group_rank >= members ||
        strcmp(as->members[as->group_rank].agent, rg_rdzv_agent_id(a->z)) != 0 ||
        as->job_failed || as->job_done) {
        snprintf(a->err, sizeof(a->err), "agent %d: round %d closed as round %d with %d members, "
                 "world %d, rank %d (expected round %d, %d members)", a->i, round, as->round,
                 as->n_members, as->world_size, as->group_rank, round, members);
        atomic_store(&j->failed, 1);
        return false;
    }
    return true;
}

/* One look after the round, as an agent's loop does: wait up to 50 ms for its fd, check. */
static bool agent_look(agent_t *a, rg_rdzv_change_t *c)
{
    struct pollfd pfd = {.fd = rg_rdzv_fd(a->z), .events = POLLIN};
    (void)poll(&pfd, 1, 50);
    *c = RG_RDZV_NONE;
    if (rg_rdzv_check(a->z, c) != RG_OK) {
        agent_fail(a, "rg_rdzv_check");
        return false;
    }
    return true;
}

/* Looks after the round until the phase moves on; a change is an error. */
static bool agent_watch_round(agent_t *a, int phase)
{
    rg_deadline_t d = rg_deadline_in_ms(PHASE_MS);
    while (atomic_load(&a->job->phase) == phase && !atomic_load(&a->job->failed)) {
        if (rg_deadline_passed(d)) {
            rg_error(RG_ETIMEDOUT, "the %s phase did not end", ph_name[phase]);
            agent_fail(a, "waiting");
            return false;
        }
        rg_rdzv_change_t c;
        if (!agent_look(a, &c)) {
            return false;
        }
        if (c != RG_RDZV_NONE) {
            rg_error(RG_EPROTO, "change %d while the round should run on", (int)c);
            agent_fail(a, ph_name[phase]);
            return false;
        }
    }
    return true;
}

/* A survivor: sees the loss, moves the round on, joins round 1. */
static bool agent_regroup(agent_t *a)
{
    job_t *j = a->job;
    rg_deadline_t d = rg_deadline_in_ms(PHASE_MS);
    rg_rdzv_change_t c = RG_RDZV_NONE;
    while (c == RG_RDZV_NONE) {
        if (rg_deadline_passed(d) || atomic_load(&j->failed)) {
            rg_error(RG_ETIMEDOUT, "no change seen after the loss");
            agent_fail(a, "loss");
            return false;
        }
        if (!agent_look(a, &c)) {
            return false;
        }
    }
    if (c != RG_RDZV_MEMBER_LOST && c != RG_RDZV_NEW_ROUND) {
        rg_error(RG_EPROTO, "change %d after a member left (expected member lost or a new "
                 "round)", (int)c);
        agent_fail(a, "loss");
        return false;
    }
    if (rg_rdzv_next_round(a->z) != RG_OK) {   /* a no-op if another agent moved it */
        agent_fail(a, "rg_rdzv_next_round");
        return false;
    }
    rg_rdzv_assignment_t *as = malloc(sizeof(*as));
    if (as == NULL) {
        rg_error(RG_ENOMEM, "assignment");
        agent_fail(a, "loss");
        return false;
    }
    bool ok = rg_rdzv_join(a->z, -1, as) == RG_OK;
    if (!ok) {
        agent_fail(a, "rg_rdzv_join (round 1)");
    } else {
        a->joined_ns[1] = rg_now_ns();
        ok = agent_check(a, as, 1, j->n - 1);
    }
    free(as);
    return ok;
}

static void *agent_main(void *arg)
{
    agent_t *a = arg;
    job_t *j = a->job;
    rg_rdzv_params_t p = {.etcd = {.endpoints = j->endpoints, .timeout_ms = 5000},
                          .job = j->id, .addr = "127.0.0.1", .nproc = j->nproc,
                          .min_nodes = j->n - 1, .max_nodes = j->n, .lease_ttl_s = 10,
                          .last_call_ms = PHASE_MS, .join_timeout_ms = PHASE_MS,
                          .max_restarts = 3};
    bool ok = rg_rdzv_create(&p, &a->z) == RG_OK;
    if (!ok) {
        agent_fail(a, "rg_rdzv_create");
    }
    pthread_barrier_wait(&j->bar);   /* 1: all created; the main thread sets t_form */
    rg_rdzv_assignment_t *as = malloc(sizeof(*as));
    if (ok && as == NULL) {
        rg_error(RG_ENOMEM, "assignment");
        agent_fail(a, "form");
        ok = false;
    }
    if (ok) {
        rg_rdzv_stats(a->z, &a->at[PH_FORM]);
        if (rg_rdzv_join(a->z, -1, as) != RG_OK) {
            agent_fail(a, "rg_rdzv_join (round 0)");
            ok = false;
        } else {
            a->joined_ns[0] = rg_now_ns();
            ok = agent_check(a, as, 0, j->n);
        }
    }
    free(as);
    pthread_barrier_wait(&j->bar);   /* 2: formed */
    if (ok) {
        rg_rdzv_stats(a->z, &a->at[PH_STEADY]);
        ok = agent_watch_round(a, PH_STEADY);
    }
    pthread_barrier_wait(&j->bar);   /* 3: the steady phase over; the main thread sets t_loss */
    if (ok) {
        rg_rdzv_stats(a->z, &a->at[PH_LOSS]);
        if (a->i == j->n - 1) {
            if (rg_rdzv_leave(a->z) != RG_OK) {
                agent_fail(a, "rg_rdzv_leave");
                ok = false;
            }
        } else {
            ok = agent_regroup(a);
        }
        rg_rdzv_stats(a->z, &a->at[PH_N]);
    }
    pthread_barrier_wait(&j->bar);   /* 4: regrouped */
    if (a->z != NULL) {
        if (a->i != j->n - 1 && rg_rdzv_leave(a->z) != RG_OK) {
            rg_info("agent %d: leave: %s", a->i, rg_last_error());
        }
        rg_rdzv_destroy(a->z);
        a->z = NULL;
    }
    return NULL;
}

/* ---- progress writers ---------------------------------------------------------------------- */

typedef struct {
    job_t     *job;
    int        first, count;   /* the ranks it writes */
    double     hz;
    atomic_int *stop;
    uint64_t   puts;
    char       err[256];
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    rdzv_keys_t keys;
    rg_etcd_t *c = NULL;
    rg_etcd_params_t ep = {.endpoints = w->job->endpoints, .timeout_ms = 5000};
    if (rdzv_keys_init(&keys, w->job->id) != RG_OK || rg_etcd_create(&ep, &c) != RG_OK) {
        snprintf(w->err, sizeof(w->err), "writer: %s", rg_last_error());
        return NULL;
    }
    const int64_t period_ns = (int64_t)(1e9 / w->hz);
    int64_t next = rg_now_ns();
    for (int64_t step = 0; !atomic_load(w->stop) && step < 1000000; step++) {
        for (int r = w->first; r < w->first + w->count && !atomic_load(w->stop); r++) {
            char key[256];
            char val[1024];
            rdzv_progress_rec_t rec = {.step = step, .epoch = 0, .round = 0,
                                       .time = rg_wall_s(), .n_metrics = 1};
            snprintf(rec.metrics[0].name, sizeof(rec.metrics[0].name), "loss");
            rec.metrics[0].value = 1.0 / (double)(step + 1);
            if (rdzv_keys_progress(&keys, r, key, sizeof(key)) != RG_OK ||
                rdzv_rec_progress_encode(&rec, val, sizeof(val)) != RG_OK ||
                rg_etcd_put_str(c, key, val, 0, 0, NULL) != RG_OK) {
                snprintf(w->err, sizeof(w->err), "writer: %s", rg_last_error());
                rg_etcd_destroy(c);
                return NULL;
            }
            w->puts++;
        }
        next += period_ns;
        int64_t left = next - rg_now_ns();
        if (left > 0) {
            rg_sleep_ms(left / 1000000);
        }
    }
    rg_etcd_destroy(c);
    return NULL;
}

/* ---- one job ------------------------------------------------------------------------------- */

typedef struct {
    int    n;
    double create_s, form_s, regroup_s;
    /* per agent, per phase: median and max */
    double req_med[PH_N], req_max[PH_N], ev_med[PH_N], ev_max[PH_N], rx_med[PH_N];
    double steady_s, steady_writes_per_s;
    etcd_metrics_t etcd[PH_N];
} job_result_t;

static double vmax(const double *v, int n)
{
    double m = n ? v[0] : NAN;
    for (int i = 1; i < n; i++) {
        m = v[i] > m ? v[i] : m;
    }
    return m;
}

static void metrics_sub(const etcd_metrics_t *b, const etcd_metrics_t *a, etcd_metrics_t *d)
{
    *d = (etcd_metrics_t){b->events_sent - a->events_sent, b->puts - a->puts,
                          b->ranges - a->ranges, b->txns - a->txns, b->deletes - a->deletes,
                          b->sent_bytes - a->sent_bytes};
}

static int run_job(const rg_etcd_server_t *srv, int n, int nproc, int rep, double steady_s,
                   int steady_max, double hz, job_result_t *res)
{
    job_t j = {.n = n, .nproc = nproc, .endpoints = srv->endpoints};
    snprintf(j.id, sizeof(j.id), "bench-%d-%d-%d", (int)getpid(), n, rep);
    j.agents = calloc((size_t)n, sizeof(*j.agents));
    if (j.agents == NULL || pthread_barrier_init(&j.bar, NULL, (unsigned)n + 1) != 0) {
        free(j.agents);
        return -1;
    }
    memset(res, 0, sizeof(*res));
    res->n = n;
    etcd_metrics_t m[PH_N + 1];
    bool mok = metrics_read(srv->metrics_port[0], &m[PH_FORM]) == 0;
    atomic_store(&j.phase, PH_FORM);
    int64_t t_create = rg_now_ns();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    int started = 0;
    for (int i = 0; i < n; i++) {
        j.agents[i] = (agent_t){.job = &j, .i = i};
        if (pthread_create(&j.agents[i].tid, &attr, agent_main, &j.agents[i]) != 0) {
            break;
        }
        started++;
    }
    pthread_attr_destroy(&attr);
    if (started < n) {
        /* The barrier counts n + 1: the threads started would wait for ever. */
        fprintf(stderr, "rg-bench-rdzv: only %d of %d threads started\n", started, n);
        exit(1);
    }
    pthread_barrier_wait(&j.bar);   /* 1 */
    j.t_form_ns = rg_now_ns();
    res->create_s = (double)(j.t_form_ns - t_create) / 1e9;
    atomic_store(&j.phase, PH_STEADY);   /* before the barrier: the agents look from it on */
    pthread_barrier_wait(&j.bar);   /* 2 */
    mok = mok && metrics_read(srv->metrics_port[0], &m[PH_STEADY]) == 0;
    writer_t w[WRITERS] = {0};
    pthread_t wt[WRITERS];
    atomic_int stop = 0;
    int64_t t_steady = rg_now_ns();
    int n_writers = 0;
    if (n <= steady_max && !atomic_load(&j.failed)) {
        int ranks = n * nproc;
        for (int k = 0; k < WRITERS; k++) {
            w[k] = (writer_t){.job = &j, .first = k * ranks / WRITERS,
                              .count = (k + 1) * ranks / WRITERS - k * ranks / WRITERS,
                              .hz = hz, .stop = &stop};
            if (pthread_create(&wt[k], NULL, writer_main, &w[k]) == 0) {
                n_writers++;
            }
        }
        rg_sleep_ms((int64_t)(steady_s * 1000));
        atomic_store(&stop, 1);
        for (int k = 0; k < n_writers; k++) {
            pthread_join(wt[k], NULL);
            if (w[k].err[0]) {
                fprintf(stderr, "rg-bench-rdzv: %s\n", w[k].err);
                atomic_store(&j.failed, 1);
            }
            res->steady_writes_per_s += (double)w[k].puts;
        }
    }
    res->steady_s = (double)(rg_now_ns() - t_steady) / 1e9;
    res->steady_writes_per_s /= res->steady_s;
    mok = mok && metrics_read(srv->metrics_port[0], &m[PH_LOSS]) == 0;
    atomic_store(&j.phase, PH_LOSS);
    j.t_loss_ns = rg_now_ns();
    pthread_barrier_wait(&j.bar);   /* 3 */
    pthread_barrier_wait(&j.bar);   /* 4 */
    mok = mok && metrics_read(srv->metrics_port[0], &m[PH_N]) == 0;
    for (int i = 0; i < n; i++) {
        pthread_join(j.agents[i].tid, NULL);
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (j.agents[i].err[0]) {
            fprintf(stderr, "rg-bench-rdzv: N=%d: %s\n", n, j.agents[i].err);
            rc = -1;
        }
    }
    if (!mok) {
        fprintf(stderr, "rg-bench-rdzv: etcd's /metrics could not be read\n");
        rc = -1;
    }
    if (rc == 0) {
        double *v = malloc(sizeof(double) * (size_t)n * 3);
        int64_t last0 = 0, last1 = 0;
        for (int i = 0; i < n; i++) {
            last0 = RG_MAX(last0, j.agents[i].joined_ns[0]);
            last1 = RG_MAX(last1, j.agents[i].joined_ns[1]);
        }
        res->form_s = (double)(last0 - j.t_form_ns) / 1e9;
        res->regroup_s = (double)(last1 - j.t_loss_ns) / 1e9;
        for (int ph = 0; ph < PH_N && v != NULL; ph++) {
            int k = 0;
            for (int i = 0; i < n; i++) {
                if (ph == PH_LOSS && i == n - 1) {
                    continue;   /* the one that left */
                }
                const rg_etcd_stats_t *s0 = &j.agents[i].at[ph];
                const rg_etcd_stats_t *s1 = &j.agents[i].at[ph + 1];
                v[k] = (double)(s1->requests - s0->requests);
                v[n + k] = (double)(s1->events - s0->events);
                v[2 * n + k] = (double)(s1->bytes_received - s0->bytes_received);
                k++;
            }
            res->req_max[ph] = vmax(v, k);
            res->req_med[ph] = rg_bench_median(v, k);
            res->ev_max[ph] = vmax(v + n, k);
            res->ev_med[ph] = rg_bench_median(v + n, k);
            res->rx_med[ph] = rg_bench_median(v + 2 * n, k);
            metrics_sub(&m[ph + 1], &m[ph], &res->etcd[ph]);
        }
        free(v);
    }
    pthread_barrier_destroy(&j.bar);
    free(j.agents);
    return rc;
}

static void print_job(const job_result_t *r, int rep, int nproc)
{
    printf("{\"bench\":\"rdzv\",\"nodes\":%d,\"nproc\":%d,\"rep\":%d,\"create_s\":%.3f,"
           "\"form_s\":%.3f,\"regroup_s\":%.3f", r->n, nproc, rep, r->create_s, r->form_s,
           r->regroup_s);
    for (int ph = 0; ph < PH_N; ph++) {
        if (ph == PH_STEADY && r->steady_writes_per_s == 0) {
            continue;
        }
        double per = ph == PH_STEADY ? r->steady_s : 1.0;
        const char *unit = ph == PH_STEADY ? "_per_s" : "";
        printf(",\"%s\":{\"agent_requests%s\":{\"median\":%.1f,\"max\":%.1f},"
               "\"agent_events%s\":{\"median\":%.1f,\"max\":%.1f},\"agent_rx_bytes%s\":%.0f,"
               "\"etcd_events%s\":%.1f,\"etcd_puts%s\":%.1f,\"etcd_ranges%s\":%.1f,"
               "\"etcd_txns%s\":%.1f,\"etcd_sent_bytes%s\":%.0f",
               ph_name[ph], unit, r->req_med[ph] / per, r->req_max[ph] / per, unit,
               r->ev_med[ph] / per, r->ev_max[ph] / per, unit, r->rx_med[ph] / per, unit,
               r->etcd[ph].events_sent / per, unit, r->etcd[ph].puts / per, unit,
               r->etcd[ph].ranges / per, unit, r->etcd[ph].txns / per, unit,
               r->etcd[ph].sent_bytes / per);
        if (ph == PH_STEADY) {
            printf(",\"progress_writes_per_s\":%.1f", r->steady_writes_per_s);
        }
        printf("}");
    }
    printf(",%s}\n", RG_BENCH_META);
    fflush(stdout);
}

/* ---- summary and fit ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    size_t      off;      /* of a double in job_result_t */
} field_t;

#define FIELD(name, member) {name, offsetof(job_result_t, member)}

static const field_t fields[] = {
    FIELD("form_s", form_s),
    FIELD("regroup_s", regroup_s),
    FIELD("form_agent_requests", req_med[PH_FORM]),
    FIELD("form_agent_events", ev_med[PH_FORM]),
    FIELD("form_etcd_events", etcd[PH_FORM].events_sent),
    FIELD("loss_agent_requests", req_med[PH_LOSS]),
    FIELD("loss_agent_events", ev_med[PH_LOSS]),
    FIELD("loss_agent_rx_bytes", rx_med[PH_LOSS]),
    FIELD("loss_etcd_events", etcd[PH_LOSS].events_sent),
    FIELD("loss_etcd_ranges", etcd[PH_LOSS].ranges),
    FIELD("loss_etcd_txns", etcd[PH_LOSS].txns),
    FIELD("loss_etcd_sent_bytes", etcd[PH_LOSS].sent_bytes),
};

static double get(const job_result_t *r, const field_t *f)
{
    return *(const double *)(const void *)((const char *)r + f->off);
}

static void summarise(const job_result_t *res, int n_res, const int *sizes, int n_sizes)
{
    double med[MAX_SIZES][RG_ARRAY_SIZE(fields)];
    for (int s = 0; s < n_sizes; s++) {
        double v[MAX_REPS];
        printf("{\"bench\":\"rdzv-summary\",\"nodes\":%d", sizes[s]);
        for (size_t f = 0; f < RG_ARRAY_SIZE(fields); f++) {
            int k = 0;
            for (int i = 0; i < n_res; i++) {
                if (res[i].n == sizes[s] && k < MAX_REPS) {
                    v[k++] = get(&res[i], &fields[f]);
                }
            }
            med[s][f] = rg_bench_median(v, k);
            printf(",\"%s\":{\"median\":%.4g,\"min\":%.4g,\"max\":%.4g,\"n\":%d}",
                   fields[f].name, med[s][f], k ? v[0] : NAN, k ? v[k - 1] : NAN, k);
        }
        printf(",%s}\n", RG_BENCH_META);
    }
    if (n_sizes < 2) {
        return;
    }
    printf("{\"bench\":\"rdzv-fit\",\"model\":\"median = a * nodes^k\"");
    for (size_t f = 0; f < RG_ARRAY_SIZE(fields); f++) {
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        int k = 0;
        for (int s = 0; s < n_sizes; s++) {
            if (med[s][f] > 0) {
                double x = log((double)sizes[s]);
                double y = log(med[s][f]);
                sx += x;
                sy += y;
                sxx += x * x;
                sxy += x * y;
                k++;
            }
        }
        if (k < 2 || k * sxx - sx * sx == 0) {
            continue;
        }
        double slope = (k * sxy - sx * sy) / (k * sxx - sx * sx);
        double a = exp((sy - slope * sx) / k);
        printf(",\"%s\":{\"k\":%.2f,\"a\":%.4g,\"at_4096\":%.4g,\"at_16384\":%.4g}",
               fields[f].name, slope, a, a * pow(4096, slope), a * pow(16384, slope));
    }
    printf(",%s}\n", RG_BENCH_META);
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (n == max || !rg_parse_i64(t, &v) || v < 2 || v > RG_RDZV_MAX_NODES) {
            return -1;
        }
        out[n++] = (int)v;
    }
    return n;
}

int main(int argc, char **argv)
{
    int sizes[MAX_SIZES];
    int n_sizes = parse_list("16,32,64,128,256", sizes, MAX_SIZES);
    int64_t reps = 3, nproc = 8, steady_max = 32;
    double steady_s = 5, hz = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int64_t v;
        if (strncmp(a, "--nodes=", 8) == 0) {
            n_sizes = parse_list(a + 8, sizes, MAX_SIZES);
        } else if (strncmp(a, "--reps=", 7) == 0 && rg_parse_i64(a + 7, &v) && v >= 1 &&
                   v <= MAX_REPS) {
            reps = v;
        } else if (strncmp(a, "--nproc=", 8) == 0 && rg_parse_i64(a + 8, &v) && v >= 1 &&
                   v <= 64) {
            nproc = v;
        } else if (strncmp(a, "--steady-max=", 13) == 0 && rg_parse_i64(a + 13, &v) && v >= 0) {
            steady_max = v;
        } else if (strncmp(a, "--steady-s=", 11) == 0 && (steady_s = atof(a + 11)) > 0 &&
                   steady_s <= 120) {
        } else if (strncmp(a, "--progress-hz=", 14) == 0 && (hz = atof(a + 14)) > 0 &&
                   hz <= 100) {
        } else {
            fprintf(stderr, "usage: rg-bench-rdzv [--nodes=N,N,...] [--reps=R] [--nproc=P] "
                    "[--steady-s=S] [--steady-max=N] [--progress-hz=H]  (bad: %s)\n", a);
            return 2;
        }
    }
    if (n_sizes < 1) {
        fprintf(stderr, "rg-bench-rdzv: --nodes: 1..%d sizes, each 2..%d\n", MAX_SIZES,
                RG_RDZV_MAX_NODES);
        return 2;
    }
    /* Each agent holds three connections (client, keeper, watch) and etcd one per each. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rg_etcd_server_t srv;
    /* What the tests' etcd runs with (TEST_ETCD_FAST): short elections, not fewer fsyncs. */
    if (rg_etcd_server_start(&srv, "--heartbeat-interval=10 --election-timeout=100") != 0) {
        fprintf(stderr, "rg-bench-rdzv: cannot start a private etcd: %s\n", rg_last_error());
        return 1;
    }
    job_result_t *res = calloc(STATS_MAX, sizeof(*res));
    int n_res = 0;
    int rc = 0;
    for (int rep = 0; rep < reps && rc == 0; rep++) {
        for (int s = 0; s < n_sizes && rc == 0; s++) {
            /* Alternate the order of the sizes each repetition. */
            int n = sizes[rep % 2 ? n_sizes - 1 - s : s];
            if (res == NULL || run_job(&srv, n, (int)nproc, rep, steady_s, (int)steady_max, hz,
                                       &res[n_res]) != 0) {
                rc = 1;
                break;
            }
            print_job(&res[n_res], rep, (int)nproc);
            n_res++;
        }
    }
    if (rc == 0) {
        summarise(res, n_res, sizes, n_sizes);
    }
    free(res);
    rg_etcd_server_stop(&srv);
    curl_global_cleanup();
    return rc;
}
