/*
 * Stragglers: a rank that computes for longer than the others in every step.
 *
 * In synchronous data parallel training the slowest rank sets every rank's pace: the others
 * wait for it in each collective, so step time alone tells nothing. What differs is the time
 * each rank spends outside the group's operations: its compute share of the step,
 *     share = (step time - time blocked in the group, rg_comm_wait_ns) / step time,
 * summed over the steps since the last exchange (about a second). A rank throttled to a
 * quarter of a core has a share near 1, the ranks that wait for it about a quarter of that.
 *
 * Once a second (rank 0's clock, carried by the step boundary's agreement) every rank
 * allgathers its share. A rank is slow at an exchange when its share is over factor x the
 * median of the others' and over it by STRAGGLER_MIN_EXCESS of the step (so that a job whose
 * ranks hardly compute does not name one for noise). Every rank keeps every rank's streak
 * (exchanges slow in a row) from the same figures, so all decide the same:
 *   - each rank puts its share, its ratio and how long it has been slow into its progress
 *     record (`regroup status` names it); rank 0 logs a slow rank when it is first seen and
 *     then once a window;
 *   - with eviction on (`--rdzv-conf=straggler_factor=F`: the agent sets
 *     REGROUP_STRAGGLER_EVICT), the slowest rank among those slow for the whole window (a
 *     streak of window / STRAGGLER_TICK_MS exchanges) asks
 *     its agent to leave (RG_NOTICE_MSG_STRAGGLER): the node goes as a preempted one does,
 *     and the job regroups in place without it. One rank per group at most: the group that
 *     follows starts a new window.
 */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

#define STRAGGLER_TICK_MS        1000    /* between two exchanges */
#define STRAGGLER_MIN_EXCESS     0.10    /* of the step: less is not worth naming */
#define STRAGGLER_MEDIAN_FLOOR   0.01    /* the others' share below which ratios saturate */
#define STRAGGLER_FACTOR_DEFAULT 2.0
#define STRAGGLER_WINDOW_DEFAULT 30000   /* ms */

static double env_double(const char *name, double lo, double hi, double dflt)
{
    const char *s = getenv(name);
    char *end;
    if (s == NULL || *s == '\0') {
        return dflt;
    }
    double v = strtod(s, &end);
    if (*end != '\0' || !(v >= lo && v <= hi)) {
        rg_warn("%s=%s: expected a number in %g..%g; using %g", name, s, lo, hi, dflt);
        return dflt;
    }
    return v;
}

void train_straggler_init(train_straggler_t *s)
{
    memset(s, 0, sizeof(*s));
    s->factor = env_double(RG_STRAGGLER_FACTOR_ENV, 1.0, 1000.0, STRAGGLER_FACTOR_DEFAULT);
    s->window_ms = (int64_t)env_double(RG_STRAGGLER_WINDOW_ENV, 1000.0, 86400000.0,
                                       STRAGGLER_WINDOW_DEFAULT);
    const char *ev = getenv(RG_STRAGGLER_EVICT_ENV);
    s->evict = ev != NULL && strcmp(ev, "1") == 0;
    s->share = -1;
    s->ratio = -1;
    s->round = -1;
}

/* A new group: nothing measured in it yet. */
static void straggler_reset(train_straggler_t *s, const rg_train_ctx_t *ctx, uint64_t now)
{
    s->round = ctx->round;
    s->comm = ctx->comm;
    s->prev_ns = 0;
    s->step_ns = s->busy_ns = 0;
    s->tick_ns = now;
    s->share = s->ratio = -1;
    s->slow_s = 0;
    if (s->n_ranks > 0) {
        memset(s->streak, 0, sizeof(uint32_t) * (size_t)s->n_ranks);
        memset(s->slow_for, 0, sizeof(double) * (size_t)s->n_ranks);
        for (int r = 0; r < s->n_ranks; r++) {
            s->smooth[r] = -1;   /* (the ranks are numbered anew) */
        }
    }
    s->asked = false;
    s->logged_ns = 0;
    s->logged_rank = -1;
}

bool train_straggler_sample(rg_train_ctx_t *ctx)
{
    train_straggler_t *s = &ctx->straggler;
    uint64_t now = rg_now_ns();
    uint64_t wait = rg_comm_wait_ns(ctx->comm);

    if (s->round != ctx->round || s->comm != ctx->comm) {
        straggler_reset(s, ctx, now);
    }
    if (s->prev_ns != 0 && wait >= s->prev_wait_ns) {
        uint64_t step = now - s->prev_ns;
        uint64_t waited = wait - s->prev_wait_ns;
        s->step_ns += step;
        s->busy_ns += waited < step ? step - waited : 0;
    }
    s->prev_ns = now;
    s->prev_wait_ns = wait;
    return ctx->rank == 0 && ctx->world > 1 &&
           now - s->tick_ns >= (uint64_t)STRAGGLER_TICK_MS * 1000000ull;
}

/* Rank r's ratio to the others' median, and whether it is slow; -1 when unknown. */
static double ratio_of(const train_straggler_t *s, const double *sorted, size_t n, double share,
                       bool *slow)
{
    *slow = false;
    if (share < 0 || n < 2) {
        return -1;
    }
    double med = train_median_without(sorted, n, share);
    double ratio = share / (med > STRAGGLER_MEDIAN_FLOOR ? med : STRAGGLER_MEDIAN_FLOOR);
    *slow = ratio > s->factor && share - med >= STRAGGLER_MIN_EXCESS;
    return ratio;
}

/* The per-rank streaks, for a group of n ranks (kept from one exchange to the next). */
static rg_status_t streaks_for(train_straggler_t *s, int n)
{
    if (s->n_ranks == n) {
        return RG_OK;
    }
    free(s->buf);
    s->buf = calloc((size_t)n, 4 * sizeof(double) + sizeof(uint32_t));
    if (s->buf == NULL) {
        s->n_ranks = 0;
        return rg_error(RG_ENOMEM, "straggler figures of %d ranks", n);
    }
    s->n_ranks = n;
    s->shares = s->buf;
    s->sorted = s->shares + n;
    s->smooth = s->sorted + n;
    s->slow_for = s->smooth + n;
    s->streak = (uint32_t *)(s->slow_for + n);
    for (int r = 0; r < n; r++) {
        s->smooth[r] = -1;
    }
    return RG_OK;
}

void train_straggler_cleanup(train_straggler_t *s)
{
    free(s->buf);
    s->buf = NULL;
    s->n_ranks = 0;
}

rg_status_t train_straggler_exchange(rg_train_ctx_t *ctx)
{
    train_straggler_t *s = &ctx->straggler;
    uint64_t now = rg_now_ns();
    uint64_t interval = now - s->tick_ns;
    int n = ctx->world;
    double mine = s->step_ns > 0 ? (double)s->busy_ns / (double)s->step_ns : -1;
    rg_status_t st;

    s->step_ns = s->busy_ns = 0;
    s->tick_ns = now;
    /* (Without memory the other ranks wait for this one until the group's timeout, and
     * regroup.) */
    st = streaks_for(s, n);
    if (st != RG_OK) {
        return st;
    }
    st = rg_comm_allgather(ctx->comm, &mine, s->shares, 1, RG_DTYPE_F64, NULL);
    if (st != RG_OK) {
        return st;
    }
    /* Each share smoothed over the last exchanges (an exponential average that halves an
     * exchange's weight at each next one), so that one exchange with a dip does not end a
     * straggler's streak, nor one with a peak begin one. */
    size_t known = 0;
    for (int r = 0; r < n; r++) {
        if (s->shares[r] >= 0) {
            s->smooth[r] = s->smooth[r] < 0 ? s->shares[r]
                                            : s->smooth[r] + 0.5 * (s->shares[r] - s->smooth[r]);
        }
        if (s->smooth[r] >= 0) {
            s->sorted[known++] = s->smooth[r];
        }
    }
    qsort(s->sorted, known, sizeof(double), train_cmp_double);

    /* Every rank's streak, the same on every rank (counted in exchanges; the seconds, for
     * people, on this rank's clock); the slowest rank; and the slowest of those slow for a
     * whole window. */
    uint32_t window_ticks = (uint32_t)((s->window_ms + STRAGGLER_TICK_MS - 1) / STRAGGLER_TICK_MS);
    int worst = -1;
    int evictee = -1;
    double worst_ratio = -1;
    for (int r = 0; r < n; r++) {
        bool slow;
        double ratio = ratio_of(s, s->sorted, known, s->smooth[r], &slow);
        if (r == ctx->rank) {
            s->share = s->smooth[r];
            s->ratio = ratio;
        }
        if (!slow) {
            s->streak[r] = 0;
            s->slow_for[r] = 0;
            continue;
        }
        s->streak[r]++;
        s->slow_for[r] += (double)interval / 1e9;
        if (worst < 0 || s->smooth[r] > s->smooth[worst]) {
            worst = r;
            worst_ratio = ratio;
        }
        if (s->streak[r] >= window_ticks &&
            (evictee < 0 || s->smooth[r] > s->smooth[evictee])) {
            evictee = r;
        }
    }
    s->slow_s = s->slow_for[ctx->rank];
    if (ctx->rank == 0 && worst >= 0 &&
        (worst != s->logged_rank ||
         now - s->logged_ns >= (uint64_t)s->window_ms * 1000000ull)) {
        double med = train_median_without(s->sorted, known, s->smooth[worst]);
        rg_warn("straggler: rank %d computes %.0f%% of its step time, %.1fx the others' "
                "median (%.0f%%), slow for %.0f s of a %.0f s window%s", worst,
                100 * s->smooth[worst], worst_ratio, 100 * med, s->slow_for[worst],
                (double)s->window_ms / 1000.0,
                s->evict ? " (its node is asked to leave once the window is full)" : "");
        s->logged_rank = worst;
        s->logged_ns = now;
    }
    if (s->evict && evictee >= 0 && !s->asked) {
        s->asked = true;   /* on every rank: one eviction per group */
        if (evictee == ctx->rank) {
            rg_warn("straggler: this rank (%d) computed %.0f%% of its step time, %.1fx the "
                    "others' median, for %.0f s: asking the agent to take its node out of "
                    "the job", ctx->rank, 100 * s->share, s->ratio, s->slow_s);
            if (!rg_notice_msg_send(RG_NOTICE_MSG_STRAGGLER, ctx->local_rank)) {
                rg_warn("straggler: cannot tell the agent (no pipe: not an in-place job)");
            }
        }
    }
    return RG_OK;
}
