/*
 * The health check: before a group trains (a job's first round, every round after a restart,
 * and in place every round that a node joins: not one that only replaces a dead worker, whose
 * node the group holds already), each rank measures its links to two
 * neighbours over the group's own transport, and the group times a small allreduce. A node
 * whose best link is far below the others' is named; with `--health-check=evict` it leaves
 * as a preempted one does, and the job regroups without it.
 *
 * The links. The ranks are put in a ring that goes from node to node (sorted by local rank,
 * then node), so that a link between two ranks of one node (shared memory) stands beside no
 * link of the network. Each ring edge (i, i+1) is measured alone: the edges are coloured so
 * that no rank is in two edges of one colour (two colours, three for an odd ring), and each
 * colour is a phase after a barrier. In an edge the two ranks send each other `bytes` at
 * once, HEALTH_REPS times; the edge's rate is the best of them (noise on a loaded machine only
 * lowers a rate), counted as the bytes this rank sent and received over the time. The data
 * is a pattern of the sender's rank that the receiver checks: a link that corrupts data
 * fails the check.
 *
 * The verdict, the same on every rank (the figures are allgathered): a rank's figure is its
 * best link; it is named when that is below the median of the others' figures over factor. A
 * node whose network is slow has every link slow; its neighbours keep one good link each.
 * A rank is named only when a second measurement (taken only then) finds it slow again: on
 * a loaded machine one measurement of shared-memory links was seen 6x off. With fewer than
 * three nodes there is no network to compare (one node) or no telling which end of it is
 * slow (two): the figures are logged only. Wrong data names a rank whatever the count.
 */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEALTH_BYTES_DEFAULT  (4u << 20)   /* per edge and direction, each repetition */
#define HEALTH_BYTES_MIN      4096u
#define HEALTH_BYTES_MAX      (1u << 30)
#define HEALTH_REPS           3
#define HEALTH_FACTOR_DEFAULT 4.0
#define HEALTH_ALLREDUCE_REPS 9
#define HEALTH_ATTEMPTS       2            /* measurements that must agree to name a rank */
#define HEALTH_FIGURES        4            /* per rank: best link, worst link, allreduce, bad */
#define TAG_HEALTH            0xfffb0000u  /* + 0: the warm-up, + 1: the data */

typedef enum { HEALTH_OFF, HEALTH_WARN, HEALTH_EVICT } health_mode_t;

static health_mode_t health_mode(void)
{
    const char *s = getenv(RG_HEALTH_CHECK_ENV);
    if (s == NULL || *s == '\0' || strcmp(s, "off") == 0) {
        return HEALTH_OFF;
    }
    if (strcmp(s, "evict") == 0) {
        return HEALTH_EVICT;
    }
    if (strcmp(s, "warn") != 0) {
        rg_warn("%s=%s: expected off, warn or evict; checking (warn)", RG_HEALTH_CHECK_ENV, s);
    }
    return HEALTH_WARN;
}

static size_t health_bytes(void)
{
    const char *s = getenv(RG_HEALTH_CHECK_BYTES_ENV);
    int64_t v;
    if (s == NULL || *s == '\0') {
        return HEALTH_BYTES_DEFAULT;
    }
    if (!rg_parse_i64(s, &v) || v < HEALTH_BYTES_MIN || v > HEALTH_BYTES_MAX) {
        rg_warn("%s=%s: expected bytes in %u..%u; using %u", RG_HEALTH_CHECK_BYTES_ENV, s,
                HEALTH_BYTES_MIN, HEALTH_BYTES_MAX, HEALTH_BYTES_DEFAULT);
        return HEALTH_BYTES_DEFAULT;
    }
    return (size_t)v & ~(size_t)7;
}

/* This worker's node: its agent's id (one per node of the job), else its host and parent. */
static uint64_t node_key(void)
{
    char buf[512];
    const char *agent = getenv("REGROUP_AGENT_ID");
    if (agent != NULL && *agent != '\0') {
        snprintf(buf, sizeof(buf), "%s", agent);
    } else {
        char host[256] = "";
        (void)gethostname(host, sizeof(host) - 1);
        snprintf(buf, sizeof(buf), "%s/%d", host, (int)getppid());
    }
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (const char *p = buf; *p; p++) {
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    }
    return h;
}

/* A rank's place in the ring: sorted by (local rank, node, rank). */
typedef struct {
    int64_t  local_rank;
    uint64_t node;
    int      rank;
} ring_key_t;

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_key(const void *a, const void *b)
{
    const ring_key_t *x = a;
    const ring_key_t *y = b;
    if (x->local_rank != y->local_rank) {
        return x->local_rank < y->local_rank ? -1 : 1;
    }
    if (x->node != y->node) {
        return x->node < y->node ? -1 : 1;
    }
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static void fill(uint64_t *w, size_t n, int rank, int rep)
{
    uint64_t base = ((uint64_t)(unsigned)rank << 40) ^ ((uint64_t)(unsigned)rep << 32);
    for (size_t i = 0; i < n; i++) {
        w[i] = base ^ i;
    }
}

static bool filled(const uint64_t *w, size_t n, int rank, int rep)
{
    uint64_t base = ((uint64_t)(unsigned)rank << 40) ^ ((uint64_t)(unsigned)rep << 32);
    for (size_t i = 0; i < n; i++) {
        if (w[i] != (base ^ i)) {
            return false;
        }
    }
    return true;
}

/* One edge: this rank and peer send each other `words` at once, HEALTH_REPS times. *gbps: the
 * best rate (Gbit/s of this rank's sent plus received bits); *bad: the data was wrong. */
static rg_status_t edge(rg_comm_t *comm, int rank, int peer, uint64_t *out, uint64_t *in,
                        size_t words, double *gbps, bool *bad)
{
    int64_t ping = rank;
    int64_t pong = -1;
    rg_comm_req_t *rq = NULL;
    rg_status_t st = rg_comm_recv_post(comm, &pong, 1, RG_DTYPE_I64, peer, TAG_HEALTH, NULL,
                                       &rq);
    if (st == RG_OK) {
        st = rg_comm_send(comm, &ping, 1, RG_DTYPE_I64, peer, TAG_HEALTH, NULL);
    }
    if (st == RG_OK) {
        st = rg_comm_req_wait(rq);
    }
    rg_comm_req_free(rq);
    double best = 0;
    for (int rep = 0; st == RG_OK && rep < HEALTH_REPS; rep++) {
        rg_comm_req_t *r = NULL;
        rg_comm_req_t *s = NULL;
        fill(out, words, rank, rep);
        memset(in, 0, words * sizeof(*in));
        uint64_t t0 = rg_now_ns();
        st = rg_comm_recv_post(comm, in, words, RG_DTYPE_I64, peer, TAG_HEALTH + 1, NULL, &r);
        if (st == RG_OK) {
            st = rg_comm_send_post(comm, out, words, RG_DTYPE_I64, peer, TAG_HEALTH + 1, NULL,
                                   &s);
        }
        if (st == RG_OK) {
            st = rg_comm_req_wait(s);
        }
        if (st == RG_OK) {
            st = rg_comm_req_wait(r);
        }
        uint64_t ns = rg_now_ns() - t0;
        rg_comm_req_free(s);
        rg_comm_req_free(r);
        if (st == RG_OK) {
            double rate = 2.0 * 8.0 * (double)(words * sizeof(*in)) / (double)RG_MAX(ns, 1);
            best = RG_MAX(best, rate);
            *bad |= !filled(in, words, peer, rep);
        }
    }
    *gbps = best;
    return st;
}

/* The ring edges and their colours: edge i joins order[i] and order[(i + 1) % n]. */
static int edge_colour(int i, int n)
{
    return n % 2 && i == n - 1 ? 2 : i % 2;
}

/* The phases: this rank measures its edges, one per phase. link[0], link[1]: its edges'
 * rates (-1: no such edge). */
static rg_status_t measure_links(rg_train_ctx_t *ctx, const int *order, size_t bytes,
                                 double link[2], bool *bad)
{
    int n = ctx->world;
    int edges = n == 2 ? 1 : n;   /* (two ranks: one edge, not two) */
    size_t words = bytes / sizeof(uint64_t);
    uint64_t *out = malloc(words * sizeof(uint64_t));
    uint64_t *in = malloc(words * sizeof(uint64_t));
    rg_status_t st = RG_OK;
    int k = 0;

    if (out == NULL || in == NULL) {
        free(out);
        free(in);
        /* (A collective: every rank must come to each phase; a rank that cannot is a
         * failure of the check, and the group's error ends it on the others.) */
        return rg_error(RG_ENOMEM, "health check: %zu bytes", 2 * bytes);
    }
    for (int colour = 0; colour < 3 && st == RG_OK; colour++) {
        st = rg_comm_barrier(ctx->comm, NULL);
        for (int i = 0; st == RG_OK && i < edges; i++) {
            int a = order[i];
            int b = order[(i + 1) % n];
            if (edge_colour(i, n) != colour || (a != ctx->rank && b != ctx->rank)) {
                continue;
            }
            st = edge(ctx->comm, ctx->rank, a == ctx->rank ? b : a, out, in, words, &link[k],
                      bad);
            k++;
        }
    }
    free(out);
    free(in);
    return st;
}

/* A small allreduce, HEALTH_ALLREDUCE_REPS times: the median time in microseconds. The sum
 * is checked (*bad when wrong). */
static rg_status_t time_allreduce(rg_train_ctx_t *ctx, double *us, bool *bad)
{
    double t[HEALTH_ALLREDUCE_REPS];
    rg_status_t st = RG_OK;
    double want = (double)ctx->world * (ctx->world + 1) / 2;
    for (int i = 0; i < HEALTH_ALLREDUCE_REPS && st == RG_OK; i++) {
        double v = ctx->rank + 1;
        double sum = 0;
        uint64_t t0 = rg_now_ns();
        st = rg_comm_allreduce(ctx->comm, &v, &sum, 1, RG_DTYPE_F64, RG_OP_SUM, NULL);
        t[i] = (double)(rg_now_ns() - t0) / 1e3;
        *bad |= st == RG_OK && sum != want;
    }
    qsort(t, HEALTH_ALLREDUCE_REPS, sizeof(double), train_cmp_double);
    *us = t[HEALTH_ALLREDUCE_REPS / 2];
    return st;
}

/* One measurement: the links, the allreduce, and every rank's figures into fig (n x
 * HEALTH_FIGURES: best link, worst link, allreduce us, bad data). *us: this rank's allreduce. */
static rg_status_t measure(rg_train_ctx_t *ctx, const int *order, size_t bytes, double *fig,
                           double *us)
{
    double link[2] = {-1, -1};
    bool bad = false;
    rg_status_t st = measure_links(ctx, order, bytes, link, &bad);
    if (st == RG_OK) {
        st = time_allreduce(ctx, us, &bad);
    }
    if (st != RG_OK) {
        return st;
    }
    double mine[HEALTH_FIGURES] = {RG_MAX(link[0], link[1]),
                                   link[1] < 0 ? link[0] : RG_MIN(link[0], link[1]), *us,
                                   bad ? 1 : 0};
    return rg_comm_allgather(ctx->comm, mine, fig, HEALTH_FIGURES, RG_DTYPE_F64, NULL);
}

/* Every rank's best link, in order, into sorted (n of them). */
static void sort_best_links(const double *fig, int n, double *sorted)
{
    for (int r = 0; r < n; r++) {
        sorted[r] = fig[(size_t)r * HEALTH_FIGURES];
    }
    qsort(sorted, (size_t)n, sizeof(double), train_cmp_double);
}

rg_status_t train_health_check(rg_train_ctx_t *ctx, const char *when)
{
    health_mode_t mode = health_mode();
    int n = ctx->world;
    if (mode == HEALTH_OFF || ctx->comm == NULL || n < 2) {
        return RG_OK;
    }
    size_t bytes = health_bytes();
    uint64_t t0 = rg_now_ns();
    int64_t *keys = calloc((size_t)n, 2 * sizeof(int64_t));
    ring_key_t *ring = calloc((size_t)n, sizeof(ring_key_t));
    int *order = calloc((size_t)n, sizeof(int));
    double *fig = calloc((size_t)n, HEALTH_FIGURES * sizeof(double));
    double *tmp = calloc((size_t)n, sizeof(double));
    bool *suspect = calloc((size_t)n, sizeof(bool));
    double factor = HEALTH_FACTOR_DEFAULT;
    rg_status_t st = RG_OK;

    if (keys == NULL || ring == NULL || order == NULL || fig == NULL || tmp == NULL ||
        suspect == NULL) {
        st = rg_error(RG_ENOMEM, "health check of %d ranks", n);
        goto out;
    }
    int64_t mine[2] = {(int64_t)node_key(), ctx->local_rank};
    st = rg_comm_allgather(ctx->comm, mine, keys, 2, RG_DTYPE_I64, NULL);
    if (st != RG_OK) {
        goto out;
    }
    for (int r = 0; r < n; r++) {
        ring[r] = (ring_key_t){.node = (uint64_t)keys[2 * r], .local_rank = keys[2 * r + 1],
                               .rank = r};
    }
    qsort(ring, (size_t)n, sizeof(ring_key_t), cmp_key);
    for (int r = 0; r < n; r++) {
        order[r] = ring[r].rank;
    }

    int nodes = 0;   /* the distinct node keys: sorted, in keys' first n words */
    for (int r = 0; r < n; r++) {
        keys[r] = keys[2 * r];
    }
    qsort(keys, (size_t)n, sizeof(int64_t), cmp_int64);
    for (int r = 0; r < n; r++) {
        nodes += r == 0 || keys[r] != keys[r - 1];
    }

    /* A rank is named only when two measurements in a row find it below the others: on a
     * loaded machine one measurement can be a few times off (a rank descheduled during its
     * edge). The second is taken only when the first named someone. */
    int named = 0;
    int worst = -1;
    double worst_ratio = 0;
    double us = 0;
    for (int attempt = 0; attempt < HEALTH_ATTEMPTS; attempt++) {
        st = measure(ctx, order, bytes, fig, &us);
        if (st != RG_OK) {
            goto out;
        }
        int was_named = named;
        named = 0;
        worst = -1;
        sort_best_links(fig, n, tmp);
        for (int r = 0; r < n; r++) {
            const double *f = &fig[(size_t)r * HEALTH_FIGURES];
            bool corrupt = f[3] != 0;
            double med = nodes >= 3 ? train_median_without(tmp, (size_t)n, f[0]) : 0;
            bool slow = nodes >= 3 && f[0] * factor < med;
            suspect[r] = (corrupt || slow) && (attempt == 0 || suspect[r]);
            if (!suspect[r]) {
                continue;
            }
            named++;
            double ratio = corrupt ? 1e300 : med / RG_MAX(f[0], 1e-9);
            if (worst < 0 || ratio > worst_ratio) {
                worst = r;
                worst_ratio = ratio;
            }
            if (ctx->rank == 0 && attempt == HEALTH_ATTEMPTS - 1) {
                if (corrupt) {
                    rg_warn("health check: rank %d received wrong data over its links or in "
                            "the allreduce", r);
                } else {
                    rg_warn("health check: rank %d reaches %.3g Gbit/s on its best link, %.1fx "
                            "below the others' median (%.3g Gbit/s), twice%s", r, f[0],
                            med / f[0], med, mode == HEALTH_EVICT ? "" : " (--health-check="
                            "evict would take its node out of the job)");
                }
            }
        }
        if (named == 0) {
            if (ctx->rank == 0 && attempt > 0) {
                rg_info("health check: the %d rank%s below the others in the first "
                        "measurement %s not in the second", was_named, was_named > 1 ? "s" : "",
                        was_named > 1 ? "were" : "was");
            }
            break;
        }
    }
    if (ctx->rank == 0) {
        /* Every rank's figures: the best links' mean, the slowest link of all and its rank,
         * the slowest rank's allreduce. */
        double sum_best = 0;
        double slowest = -1;
        double us_max = 0;
        int slowest_rank = 0;
        for (int r = 0; r < n; r++) {
            const double *f = &fig[(size_t)r * HEALTH_FIGURES];
            sum_best += f[0];
            if (slowest < 0 || f[1] < slowest) {
                slowest = f[1];
                slowest_rank = r;
            }
            us_max = RG_MAX(us_max, f[2]);
        }
        rg_info("health check (%s) of round %d: %d ranks on %d node%s, best links %.3g "
                "Gbit/s on average, slowest link %.3g Gbit/s (rank %d), allreduce %.0f us "
                "(slowest rank %.0f us), %d named%s, in %.3f s", when, ctx->round, n, nodes,
                nodes > 1 ? "s" : "", sum_best / n, slowest, slowest_rank, us, us_max, named,
                nodes < 3 ? " (fewer than 3 nodes: figures only)" : "",
                (double)(rg_now_ns() - t0) / 1e9);
    }
    if (mode == HEALTH_EVICT && named > 0 && worst == ctx->rank) {
        const double *f = &fig[(size_t)worst * HEALTH_FIGURES];
        rg_warn("health check: this rank (%d) %s: asking the agent to take its node out of the "
                "job", ctx->rank, f[3] != 0 ? "received wrong data" : "has the slowest links");
        if (!rg_notice_msg_send(RG_NOTICE_MSG_HEALTH, ctx->local_rank)) {
            rg_warn("health check: cannot tell the agent (no pipe: not an in-place job)");
        }
    }
out:
    free(keys);
    free(ring);
    free(order);
    free(fig);
    free(tmp);
    free(suspect);
    return st;
}
