/*
 * rg-exact: the exactness workload. Its state is a vector of 64-bit integers; every step adds,
 * through an i64 allreduce, integer contributions derived from the ids of the global batch's
 * samples and their epoch. The final vector is therefore the same for every world size and
 * every history of failures, and differs if any sample of any epoch is lost or counted twice.
 * It checkpoints the state (sharded by rows across ranks) and the data cursor every few steps
 * through rg_report, and resumes from the last committed checkpoint after a restart or resize.
 *
 *   rg-exact [--samples N] [--batch B] [--epochs E] [--dim K] [--seed S] [--ckpt-every C]
 *            [--work W] [--trace DIR] [--kill-at STEP --kill-rank R] [--pad-kb KB]
 *            [--stop-file PATH]
 *   rg-exact --expect [same data options]     prints the expected digest and exits
 *   rg-exact --trainer N --ckpt-root DIR [...] runs itself on N local workers through
 *                                              rg_trainer_fit (no launcher needed)
 *
 * In place (`regroup --recovery=in-place`): a collective that fails with RG_EPEER, or rg_report
 * saying RG_EMEMBERS, makes every rank call rg_train_regroup with the state vector (replicated:
 * every rank holds all of it) and the cursor; it goes on at the new world size from the step
 * the members agreed on, with the state received from a survivor. A replacement worker joins
 * the same way instead of reading a checkpoint. With the state goes a side record of a size
 * only the source knows (rg_train_regroup_t.extra_fn, as a program's optimizer state), which
 * each receiver checks against the state it received. Rank 0 then prints "regrouped: ..."
 * lines.
 * --trainer-in-place makes --trainer run in place too.
 *
 * Run it under regroup with REGROUP_CKPT_DIR set. Rank 0 ends with
 * "exact=1 digest=<hex> steps=<n>" when the result equals the vector computed directly, or
 * "exact=0 ..." and exit status 3 when it does not. --trace writes, per rank and round, one
 * line "round step epoch id" per sample consumed, for the exactly-once data check.
 * --kill-at makes rank R SIGKILL itself at global step STEP in the job's first attempt (before
 * the step's allreduce; --kill-in-allreduce: once its part of that allreduce is posted and
 * progressed once); --kill-again STEP2 makes rank R of the second attempt (restart count 1)
 * do the same at STEP2; --kill-rank2 R2 makes rank R2 die with rank R. --forget-rank R3 makes
 * rank R3 drop its state at its first regroup (zeroes, step -1: it must receive it all). Every rank says
 * "rank R: pid P started (joining J)" and, at the end, "rank R: pid P finished". --step-log FILE makes rank 0 append "STEP MS" for every step it
 * completes (MS: CLOCK_REALTIME milliseconds), for bench/rg-bench-recovery.sh.
 * --table-rows N adds a sharded part to the state: a table of N 64-bit rows, each owned by
 * exactly one rank at a time (rg_train_table_t), which its owner updates at every step from
 * the step's sum and number (row k = row k * A + sum[k % dim] + step, mod 2^64), commits at
 * every step before it adds the step to the state vector (its copies at its buddy and on its
 * node; a failed commit leaves the step undone) and saves in checkpoints; in place the
 * regroup moves it to its new owners. Rank 0 gathers it at the end and checks it too
 * ("table=1", part of exact=1).
 * --slow K makes this process do K times the work of --work per sample: a straggler (give
 * it on one node's command line only: every rank started there is slow).
 * --join-delay-ms MS makes a newcomer (a replacement, a joining node's worker) take MS before
 * it joins, as a program that loads a model and its data would.
 * --pad-kb adds KB of pseudo-random bytes (sharded, checked when restored) to every
 * checkpoint, so that writes take a realistic time. --state-kb adds KB of replicated state
 * that goes over the group at every regroup (not into checkpoints): one word a page is a
 * function of the step, brought to it before a regroup and checked after it, and every word
 * is checked at the end, so that a state transfer lasts long enough to be broken off mid-way,
 * and a torn one is caught.
 * --stop-file ends the job at the next epoch boundary once PATH exists (rank 0 decides, every
 * rank follows); the expected vector is then that of the epochs completed.
 *
 * On a preemption notice (rg_report's RG_EMEMBERS with RG_NOTICE_PREEMPT: a node leaves) every
 * rank takes the last checkpoint of the step it reached (rg_train_leave) and exits: 0 with
 * "left at step N: checkpoint committed" when it landed, 1 when there was too little time.
 */
#include "example_parse.h"

#include <regroup/train.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXACT_MAX_DIM 4096

typedef struct {
    int64_t     samples;
    int64_t     batch;
    int64_t     epochs;
    int64_t     dim;
    int64_t     seed;
    int64_t     ckpt_every;
    int64_t     work;
    int64_t     slow;         /* --slow: this process does the work of --work that many times */
    int64_t     kill_at;
    int64_t     kill_rank;
    int64_t     kill_rank2;   /* a second rank killed with kill_rank, or -1 */
    int64_t     kill_again;
    int64_t     forget_rank;  /* --forget-rank: this rank drops its state at its first regroup */
    bool        kill_in_allreduce;
    int64_t     pad_kb;
    int64_t     table_rows;   /* the sharded table's rows; 0: none */
    int64_t     join_delay_ms;/* a newcomer's time to get ready (loading a model, say) */
    int64_t     state_kb;     /* --state-kb: the extra replicated state (extra_state_t) */
    int64_t     trainer;      /* > 0: run under rg_trainer_fit with this many workers */
    const char *trainer_ckpt; /* the trainer's checkpoint root */
    const char *trace;
    const char *stop_file;
    const char *step_log;
    bool        expect;
    bool        trainer_in_place;
} options_t;

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The contribution of sample `id` in `epoch` to element k: small, so sums never overflow. */
static int64_t contribution(const options_t *o, uint64_t epoch, uint64_t id, uint64_t k)
{
    uint64_t h = mix((uint64_t)o->seed ^ mix(epoch * 0x100000001b3ull ^ mix(id * 4099 + k)));
    return (int64_t)(h % 1000003u) - 500001;
}

/* Optional extra compute per sample (--work), so that steps take a realistic time. */
static volatile uint64_t work_sink;
static void busy_work(int64_t n, uint64_t id)
{
    uint64_t h = id;
    for (int64_t w = 0; w < n; w++) {
        h = mix(h);
    }
    work_sink ^= h;
}

static uint64_t digest(const int64_t *v, int64_t n)
{
    uint64_t d = 0;
    for (int64_t i = 0; i < n; i++) {
        d = mix(d ^ (uint64_t)v[i]);
    }
    return d;
}

static int usage(const char *why)
{
    fprintf(stderr, "rg-exact: %s\nusage: rg-exact [--samples N] [--batch B] [--epochs E] "
            "[--dim K] [--seed S] [--ckpt-every C] [--work W] [--trace DIR] "
            "[--kill-at STEP --kill-rank R] [--expect]\n", why);
    return 2;
}

static int parse(int argc, char **argv, options_t *o)
{
    *o = (options_t){.samples = 1000, .batch = 40, .epochs = 3, .dim = 16, .seed = 7, .slow = 1,
                     .ckpt_every = 5, .kill_at = -1, .kill_rank = 0, .kill_again = -1,
                     .kill_rank2 = -1, .forget_rank = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--expect") == 0) {
            o->expect = true;
            continue;
        }
        if (strcmp(a, "--kill-in-allreduce") == 0) {
            o->kill_in_allreduce = true;
            continue;
        }
        if (strcmp(a, "--trainer-in-place") == 0) {
            o->trainer_in_place = true;
            continue;
        }
        if (i + 1 >= argc) {
            return usage("missing value or unknown option");
        }
        const char *v = argv[++i];
        int64_t *dst = NULL;
        int64_t lo = 0;
        int64_t hi = 1LL << 40;
        if (strcmp(a, "--samples") == 0) {
            dst = &o->samples, lo = 1, hi = 1 << 24;
        } else if (strcmp(a, "--batch") == 0) {
            dst = &o->batch, lo = 1, hi = 1 << 20;
        } else if (strcmp(a, "--epochs") == 0) {
            dst = &o->epochs, lo = 1, hi = 1000000000;
        } else if (strcmp(a, "--dim") == 0) {
            dst = &o->dim, lo = 1, hi = EXACT_MAX_DIM;
        } else if (strcmp(a, "--seed") == 0) {
            dst = &o->seed;
        } else if (strcmp(a, "--ckpt-every") == 0) {
            dst = &o->ckpt_every, lo = 1, hi = 1 << 20;
        } else if (strcmp(a, "--work") == 0) {
            dst = &o->work, lo = 0, hi = 1 << 20;
        } else if (strcmp(a, "--slow") == 0) {
            dst = &o->slow, lo = 1, hi = 1000;
        } else if (strcmp(a, "--kill-at") == 0) {
            dst = &o->kill_at;
        } else if (strcmp(a, "--kill-again") == 0) {
            dst = &o->kill_again;
        } else if (strcmp(a, "--kill-rank") == 0) {
            dst = &o->kill_rank, lo = 0, hi = 4096;
        } else if (strcmp(a, "--kill-rank2") == 0) {
            dst = &o->kill_rank2, lo = 0, hi = 4096;
        } else if (strcmp(a, "--forget-rank") == 0) {
            dst = &o->forget_rank, lo = 0, hi = 4096;
        } else if (strcmp(a, "--join-delay-ms") == 0) {
            dst = &o->join_delay_ms, lo = 0, hi = 600000;
        } else if (strcmp(a, "--table-rows") == 0) {
            dst = &o->table_rows, lo = 0, hi = 1 << 24;
        } else if (strcmp(a, "--pad-kb") == 0) {
            dst = &o->pad_kb, lo = 0, hi = 1 << 20;
        } else if (strcmp(a, "--state-kb") == 0) {
            dst = &o->state_kb, lo = 0, hi = 1 << 18;
        } else if (strcmp(a, "--trace") == 0) {
            o->trace = v;
            continue;
        } else if (strcmp(a, "--stop-file") == 0) {
            o->stop_file = v;
            continue;
        } else if (strcmp(a, "--step-log") == 0) {
            o->step_log = v;
            continue;
        } else if (strcmp(a, "--trainer") == 0) {
            dst = &o->trainer, lo = 1, hi = 256;
        } else if (strcmp(a, "--ckpt-root") == 0) {
            o->trainer_ckpt = v;
            continue;
        } else {
            return usage(a);
        }
        if (!example_parse_i64(v, dst) || *dst < lo || *dst > hi) {
            return usage(a);
        }
    }
    return 0;
}

/* What the state must be after `epochs` epochs: every sample of every epoch, once. */
static void expected(const options_t *o, int64_t epochs, int64_t *want)
{
    memset(want, 0, sizeof(int64_t) * (size_t)o->dim);
    for (int64_t e = 0; e < epochs; e++) {
        for (int64_t id = 0; id < o->samples; id++) {
            for (int64_t k = 0; k < o->dim; k++) {
                want[k] += contribution(o, (uint64_t)e, (uint64_t)id, (uint64_t)k);
            }
        }
    }
}

#define TABLE_MUL 6364136223846793005ull
#define TABLE_TAG 7u

/* One step's update of the table's rows [first, first + count) from the step's sums. */
static void table_step(uint64_t *rows, uint64_t first, uint64_t count, const int64_t *sum,
                       int64_t dim, int64_t done)
{
    for (uint64_t i = 0; i < count; i++) {
        uint64_t k = first + i;
        rows[i] = rows[i] * TABLE_MUL + (uint64_t)sum[k % (uint64_t)dim] + (uint64_t)done;
    }
}

/* The table after `epochs` epochs, computed directly: every step's global batch (the
 * sampler's share of rank 0 in a world of 1). */
static rg_status_t expected_table(const options_t *o, int64_t epochs, uint64_t *want)
{
    rg_sampler_params_t sp = {.num_samples = (uint64_t)o->samples,
                              .batch_size = (uint32_t)o->batch, .drop_last = false};
    rg_sampler_t *sampler;
    uint32_t *ids = malloc(sizeof(uint32_t) * (size_t)o->batch);
    int64_t sum[EXACT_MAX_DIM];
    if (ids == NULL) {
        return rg_error(RG_ENOMEM, "ids");
    }
    rg_status_t st = rg_sampler_create(&sp, &sampler);
    if (st != RG_OK) {
        free(ids);
        return st;
    }
    uint64_t per_epoch = rg_sampler_steps_per_epoch(sampler);
    rg_data_cursor_t cur = rg_data_cursor_start((uint64_t)o->seed);
    memset(want, 0, sizeof(uint64_t) * (size_t)o->table_rows);
    while (st == RG_OK && (int64_t)cur.epoch < epochs) {
        size_t n = 0;
        st = rg_sampler_ids(sampler, &cur, 0, 1, ids, (size_t)o->batch, &n);
        memset(sum, 0, sizeof(int64_t) * (size_t)o->dim);
        for (size_t i = 0; st == RG_OK && i < n; i++) {
            for (int64_t k = 0; k < o->dim; k++) {
                sum[k] += contribution(o, cur.epoch, ids[i], (uint64_t)k);
            }
        }
        rg_sampler_advance(sampler, &cur);
        table_step(want, 0, (uint64_t)o->table_rows, sum, o->dim,
                   (int64_t)(cur.epoch * per_epoch + cur.step));
    }
    rg_sampler_destroy(sampler);
    free(ids);
    return st;
}

/* Rank 0: whether the table every rank holds a part of equals the one computed directly
 * (collective: the others send their rows). */
static rg_status_t check_table(rg_train_ctx_t *ctx, const options_t *o, int64_t epochs,
                               rg_train_table_t *table, bool *ok)
{
    rg_comm_t *comm = rg_train_comm(ctx);
    int rank = rg_train_rank(ctx);
    int world = rg_train_world_size(ctx);
    uint64_t first;
    uint64_t count;
    uint64_t *rows = rg_train_table_rows(table, &first, &count);
    rg_status_t st = RG_OK;

    *ok = true;
    if (rank != 0) {
        return count > 0 ? rg_comm_send(comm, rows, count * 8, RG_DTYPE_U8, 0, TABLE_TAG, NULL)
                         : RG_OK;
    }
    size_t n = (size_t)o->table_rows;
    uint64_t *all = malloc(n * sizeof(uint64_t));
    uint64_t *want = malloc(n * sizeof(uint64_t));
    if (all == NULL || want == NULL) {
        free(all);
        free(want);
        return rg_error(RG_ENOMEM, "table check");
    }
    memcpy(all + first, rows, count * sizeof(uint64_t));
    for (int r = 1; r < world && st == RG_OK; r++) {
        uint32_t f;
        uint32_t c;
        rg_sampler_share((uint32_t)n, (uint32_t)r, (uint32_t)world, &f, &c);
        if (c > 0) {
            st = rg_comm_recv(comm, all + f, (size_t)c * 8, RG_DTYPE_U8, r, TABLE_TAG, NULL);
        }
    }
    if (st == RG_OK) {
        st = expected_table(o, epochs, want);
    }
    if (st == RG_OK) {
        *ok = memcmp(all, want, n * sizeof(uint64_t)) == 0;
        for (size_t k = 0; k < n && !*ok; k++) {
            if (all[k] != want[k]) {
                fprintf(stderr, "table row %zu: %016llx, expected %016llx\n", k,
                        (unsigned long long)all[k], (unsigned long long)want[k]);
                break;
            }
        }
    }
    free(all);
    free(want);
    return st;
}

/* After rg_report's RG_EMEMBERS: a preemption is the last checkpoint of the step every rank
 * reached, then the end of this process (*left), unless this rank's node stays in an
 * in-place job: then RG_EMEMBERS, to regroup without the node that left. Anything else stays
 * RG_EMEMBERS (an error, or in place a regroup). */
static rg_status_t on_notice(rg_train_ctx_t *ctx, const rg_report_t *rep,
                             const rg_train_state_t *s, bool *left)
{
    rg_notice_t n;
    if (rg_train_notice(ctx, &n) != RG_OK || !(n.kinds & (1u << RG_NOTICE_PREEMPT))) {
        return RG_EMEMBERS;
    }
    bool stays = rg_train_in_place(ctx) && !(n.own & (1u << RG_NOTICE_PREEMPT));
    *left = !stays;
    rg_status_t st = rg_train_leave(ctx, rep, s);
    if (rg_train_rank(ctx) == 0 && stays) {
        printf("a node leaves at step %lld: last checkpoint %s; regrouping without it\n",
               (long long)rep->step, st == RG_OK ? "committed" : rg_last_error());
        fflush(stdout);
    } else if (rg_train_rank(ctx) == 0) {
        if (st == RG_OK) {
            printf("left at step %lld: checkpoint committed (%lld ms were left)\n",
                   (long long)rep->step, (long long)n.ms_left);
        } else {
            printf("left at step %lld: no last checkpoint: %s\n", (long long)rep->step,
                   rg_last_error());
        }
        fflush(stdout);
    }
    return st == RG_OK && stays ? RG_EMEMBERS : st;
}

/* This rank's rows of the state and of the padding, for checkpoints (they follow the rank
 * and the world size). */
static rg_status_t layout(const options_t *o, int rank, int world, uint32_t *row0,
                          uint32_t *rows, uint8_t **pad, uint32_t *pad0, uint32_t *pad_rows)
{
    rg_sampler_share((uint32_t)o->dim, (uint32_t)rank, (uint32_t)world, row0, rows);
    if (o->pad_kb <= 0) {
        return RG_OK;
    }
    rg_sampler_share((uint32_t)(o->pad_kb * 1024), (uint32_t)rank, (uint32_t)world, pad0,
                     pad_rows);
    free(*pad);
    *pad = malloc(*pad_rows + 1);
    if (*pad == NULL) {
        return rg_error(RG_ENOMEM, "pad");
    }
    for (uint32_t i = 0; i < *pad_rows; i++) {
        (*pad)[i] = (uint8_t)mix(*pad0 + i);
    }
    return RG_OK;
}

/* --state-kb: words that stand for a step (step -1: none yet, a replacement's own). Only
 * regroups move them, so they are brought to the step just before one. One word in
 * EXTRA_STRIDE depends on the step, the others only on their place (and differ from a
 * replacement's own): bringing the state to a step, and a receiver's check that it got the
 * step agreed on, touch one word a page, not the whole state, as a program's model is just
 * there at a regroup and nobody reads it through afterwards; every word is still checked at
 * the end, on every rank, so that a torn transfer of any part shows. */
#define EXTRA_STRIDE 512
typedef struct {
    uint64_t *w;
    size_t    n;
    int64_t   step;
} extra_state_t;

static extra_state_t extra = {.step = -1};

static uint64_t extra_word(int64_t step, size_t i)
{
    int64_t s = step < 0 || i % EXTRA_STRIDE == 0 ? step : 0;
    return mix((uint64_t)s * 0x100000001b3ull ^ mix(i));
}

/* The extra state, made to hold the step's words (a replacement's hold those of step -1).
 * It is written when it is made, as a program builds its model before it joins: a
 * replacement's pages are then in memory before the state arrives, not faulted in by the
 * transfer. (Not zeros: malloc and memset to 0 may become a calloc, whose pages are
 * mapped only when first written.) */
static rg_status_t extra_fill(const options_t *o, int64_t step, bool joining)
{
    if (extra.w == NULL) {
        extra.n = (size_t)o->state_kb * 1024 / sizeof(uint64_t);
        extra.w = malloc(extra.n * sizeof(uint64_t));
        if (extra.w == NULL) {
            return rg_error(RG_ENOMEM, "%lld KiB of extra state", (long long)o->state_kb);
        }
        for (size_t i = 0; i < extra.n; i++) {
            extra.w[i] = extra_word(-1, i);
        }
    }
    if (!joining && extra.step != step) {
        /* Every word the first time (from a replacement's own), then the step's words. */
        size_t stride = extra.step < 0 ? 1 : EXTRA_STRIDE;
        for (size_t i = 0; i < extra.n; i += stride) {
            extra.w[i] = extra_word(step, i);
        }
        extra.step = step;
    }
    return RG_OK;
}

/* --step-log: rank 0 appends "STEP MS" (CLOCK_REALTIME) for a step it completed. */
static void step_log(const options_t *o, int rank, int64_t done)
{
    if (o->step_log == NULL || rank != 0) {
        return;
    }
    FILE *sl = fopen(o->step_log, "a");
    if (sl != NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        fprintf(sl, "%lld %lld\n", (long long)done,
                (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
        fclose(sl);
    }
}

/* Whether the extra state holds the words of `step`, as it must after a regroup to it: the
 * step's words (stride EXTRA_STRIDE: after a transfer), or every word (stride 1: at the end). */
static rg_status_t extra_check(int64_t step, size_t stride)
{
    for (size_t i = 0; i < extra.n; i += stride) {
        if (extra.w[i] != extra_word(step, i)) {
            return rg_error(RG_ECORRUPT, "the extra state differs from that of step %lld at "
                            "word %zu of %zu", (long long)step, i, extra.n);
        }
    }
    extra.step = step;
    return RG_OK;
}

/* In place, the source's side record (rg_train_regroup_t.extra_fn), as a program's optimizer
 * state of a size only the source knows: the step of its state, a hash of its vector, and
 * step mod SIDE_MORE more words of that step's own. A receiver checks every word against the
 * state it received with it. */
#define SIDE_MORE 13
typedef struct {
    int64_t        step;
    const int64_t *state;
    int64_t        dim;
    uint64_t       w[2 + SIDE_MORE];
} side_t;

static uint64_t side_word(int64_t step, const int64_t *state, int64_t dim, size_t i)
{
    if (i == 0) {
        return (uint64_t)step;
    }
    uint64_t h = mix((uint64_t)step + i);
    for (int64_t k = 0; i == 1 && k < dim; k++) {
        h = mix(h ^ (uint64_t)state[k]);
    }
    return h;
}

static size_t side_words(int64_t step)
{
    return 2 + (size_t)(step % SIDE_MORE);
}

static int side_make(void *arg, const void **data, size_t *bytes)
{
    side_t *s = arg;
    size_t n = side_words(s->step);
    for (size_t i = 0; i < n; i++) {
        s->w[i] = side_word(s->step, s->state, s->dim, i);
    }
    *data = s->w;
    *bytes = n * sizeof(uint64_t);
    return 0;
}

static rg_status_t side_check(const rg_train_regroup_t *rs, const int64_t *state, int64_t dim)
{
    if (!rs->received) {
        return rs->extra == NULL && rs->extra_bytes == 0
                   ? RG_OK
                   : rg_error(RG_ECORRUPT, "a side record came to a member that received no "
                              "state (%zu bytes)", rs->extra_bytes);
    }
    size_t n = side_words(rs->step_out);
    if (rs->extra == NULL || rs->extra_bytes != n * sizeof(uint64_t) || rs->n_received < 1) {
        return rg_error(RG_ECORRUPT, "the side record of step %lld: %zu bytes, not %zu (%d "
                        "members received)", (long long)rs->step_out, rs->extra_bytes,
                        n * sizeof(uint64_t), rs->n_received);
    }
    uint64_t w;
    for (size_t i = 0; i < n; i++) {
        memcpy(&w, (const unsigned char *)rs->extra + i * sizeof(w), sizeof(w));
        if (w != side_word(rs->step_out, state, dim, i)) {
            return rg_error(RG_ECORRUPT, "the side record of step %lld differs from the "
                            "state received with it at word %zu", (long long)rs->step_out, i);
        }
    }
    return RG_OK;
}

/* In place: every member brings its state (the vector after `step` steps, and the cursor)
 * into the next round; they go on from the state the members agreed on. */
static rg_status_t regroup(rg_train_ctx_t *ctx, const options_t *o, int64_t *state,
                           rg_train_table_t *table, rg_data_cursor_t *cur, int64_t step,
                           const char *why)
{
    rg_train_buf_t buf[2];
    /* --forget-rank: at its first regroup this member says it holds no state (step -1), as
     * one whose buffers took a regroup's state but not the rest of it: it must receive the
     * whole state, and the job stay exact. */
    static bool forgot;
    bool forget = o->forget_rank == rg_train_rank(ctx) && !forgot && !rg_train_joining(ctx) &&
                  table == NULL;
    if (forget) {
        forgot = true;
        memset(state, 0, sizeof(int64_t) * (size_t)o->dim);
        fprintf(stderr, "rank %d: dropping my state at step %lld\n", rg_train_rank(ctx),
                (long long)step);
    }
    side_t side = {.step = step, .state = state, .dim = o->dim};
    rg_train_regroup_t rs = {.step = forget ? -1 : step, .bufs = buf, .n_bufs = 0,
                             .cursor = *cur, .table = table, .extra_fn = side_make,
                             .extra_arg = &side};
    if (o->state_kb > 0) {
        /* First: a transfer that breaks off while it goes breaks off in buffer 1. */
        rg_status_t fs = extra_fill(o, step, rg_train_joining(ctx) || forget);
        if (fs != RG_OK) {
            return fs;
        }
        buf[rs.n_bufs++] = (rg_train_buf_t){.data = extra.w,
                                            .bytes = extra.n * sizeof(uint64_t)};
    }
    buf[rs.n_bufs++] = (rg_train_buf_t){.data = state,
                                        .bytes = sizeof(int64_t) * (size_t)o->dim};
    rg_status_t st = rg_train_regroup(ctx, &rs);
    if (st == RG_OK) {
        st = side_check(&rs, state, o->dim);
    }
    if (st == RG_OK && o->state_kb > 0 && rs.received) {
        st = extra_check(rs.step_out, EXTRA_STRIDE);
    } else if (st == RG_OK && o->state_kb > 0 && extra.step != rs.step_out) {
        /* A member that received nothing must already hold the step agreed on (its words
         * are checked word by word at the end, as every rank's are). */
        st = rg_error(RG_ECORRUPT, "the extra state is that of step %lld, the regroup's of "
                      "step %lld, and none was received", (long long)extra.step,
                      (long long)rs.step_out);
    }
    if (st != RG_OK) {
        return st;
    }
    *cur = rs.cursor;
    if (rs.rank == 0) {
        printf("regrouped: %s; round %d world %d from step %lld, state from rank %d\n", why,
               rs.round, rs.world, (long long)rs.step_out, rs.source);
        fflush(stdout);
    }
    if (rs.received) {
        fprintf(stderr, "rank %d: state of step %lld received from rank %d over the group\n",
                rs.rank, (long long)rs.step_out, rs.source);
    }
    return RG_OK;
}

/* Whether a failed call is one to regroup on (in place only). */
static bool regroup_on(const rg_train_ctx_t *ctx, rg_status_t st)
{
    return rg_train_in_place(ctx) &&
           (st == RG_EPEER || st == RG_ETIMEDOUT || st == RG_EMEMBERS);
}

static rg_status_t run(rg_train_ctx_t *ctx, const options_t *o)
{
    int rank = rg_train_rank(ctx);
    int world = rg_train_world_size(ctx);
    rg_comm_t *comm = rg_train_comm(ctx);
    rg_sampler_t *sampler = NULL;
    int64_t state[EXACT_MAX_DIM] = {0};
    int64_t local[EXACT_MAX_DIM];
    uint32_t *ids = malloc(sizeof(uint32_t) * (size_t)o->batch);
    FILE *trace = NULL;
    int64_t ckpt_step = -1;
    int64_t epochs = o->epochs;
    bool left = false;
    uint8_t *pad = NULL;
    uint32_t pad0 = 0;
    uint32_t pad_rows = 0;
    rg_train_table_t *table = NULL;
    rg_status_t st;

    rg_sampler_params_t sp = {.num_samples = (uint64_t)o->samples,
                              .batch_size = (uint32_t)o->batch, .drop_last = false};
    if (ids == NULL) {
        return rg_error(RG_ENOMEM, "ids");
    }
    fprintf(stderr, "rank %d: pid %d started (joining %d)\n", rank, (int)getpid(),
            rg_train_joining(ctx) ? 1 : 0);
    st = rg_sampler_create(&sp, &sampler);
    if (st != RG_OK) {
        free(ids);
        return st;
    }
    uint64_t per_epoch = rg_sampler_steps_per_epoch(sampler);
    rg_data_cursor_t cur = rg_data_cursor_start((uint64_t)o->seed);
    if (o->table_rows > 0) {
        st = rg_train_table_create(ctx, (uint64_t)o->table_rows, sizeof(uint64_t), &table);
        if (st != RG_OK) {
            goto out;
        }
    }

    /* This rank's rows of the state, for checkpoints and resharding. */
    uint32_t row0;
    uint32_t rows;
    bool joined = rg_train_joining(ctx);
    if (joined && o->join_delay_ms > 0) {
        /* What a real program does before it can join: load its model, its data. */
        struct timespec ts = {.tv_sec = o->join_delay_ms / 1000,
                              .tv_nsec = (o->join_delay_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    if (joined) {
        /* A replacement in an in-place job: the state comes from a survivor. */
        st = regroup(ctx, o, state, table, &cur, 0, "a replacement joined");
        if (st != RG_OK) {
            goto out;
        }
        rank = rg_train_rank(ctx);
        world = rg_train_world_size(ctx);
        comm = rg_train_comm(ctx);
    }
    st = layout(o, rank, world, &row0, &rows, &pad, &pad0, &pad_rows);
    if (st != RG_OK) {
        goto out;
    }
    bool fresh = !joined && cur.epoch == 0 && cur.step == 0;   /* (no state received) */
    if (fresh && rg_get_checkpoint(ctx, &ckpt_step) == RG_OK) {
        uint64_t t0 = 0;
        uint64_t tn = 0;
        void *trows = rg_train_table_rows(table, &t0, &tn);
        rg_ckpt_request_t rq[3] = {
            {.name = "state", .dtype = RG_DTYPE_I64, .row_begin = row0, .row_count = rows,
             .dst = state + row0, .dst_bytes = rows * sizeof(int64_t)},
            {.name = "pad", .dtype = RG_DTYPE_U8, .row_begin = pad0, .row_count = pad_rows,
             .dst = pad, .dst_bytes = pad_rows},
            {.name = "table", .dtype = RG_DTYPE_I64, .row_begin = t0, .row_count = tn,
             .dst = trows, .dst_bytes = tn * sizeof(uint64_t)},
        };
        size_t nrq = 0;
        rg_ckpt_request_t use[3];
        if (rows > 0) {
            use[nrq++] = rq[0];
        }
        if (pad_rows > 0) {
            use[nrq++] = rq[1];
        }
        if (tn > 0) {
            use[nrq++] = rq[2];
        }
        st = rg_train_restore(ctx, ckpt_step, nrq ? use : NULL, nrq, &cur, &ckpt_step);
        if (st != RG_OK) {
            goto out;
        }
        for (uint32_t i = 0; i < pad_rows; i++) {
            if (pad[i] != (uint8_t)mix(pad0 + i)) {
                st = rg_error(RG_ECORRUPT, "restored padding differs at byte %u", pad0 + i);
                goto out;
            }
        }
        /* Reassemble the whole vector from every rank's rows. */
        st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, state, (size_t)o->dim, RG_DTYPE_I64,
                               RG_OP_SUM, NULL);
        if (st != RG_OK) {
            goto out;
        }
        if (rank == 0) {
            printf("resumed from step %lld at world size %d\n", (long long)ckpt_step, world);
        }
    }
    if (o->state_kb > 0 && !joined) {
        /* The extra state is made before training, as a program builds its model: a regroup
         * then only brings its step's words up to date. */
        st = extra_fill(o, (int64_t)(cur.epoch * per_epoch + cur.step), false);
        if (st != RG_OK) {
            goto out;
        }
    }
    /* The step the table's copies hold: a regroup commits them (a replacement's too), every
     * step commits its own, and a fresh start commits the rows it starts from first. */
    int64_t table_at = joined ? (int64_t)(cur.epoch * per_epoch + cur.step) : -1;
    bool regrouped = true;   /* (re)open the trace, for this rank and round */
    while ((int64_t)cur.epoch < epochs) {
        int64_t gstep = (int64_t)(cur.epoch * per_epoch + cur.step);
        size_t n = 0;
        if (table != NULL && table_at != gstep) {
            st = rg_train_table_commit(ctx, table, gstep);
            if (regroup_on(ctx, st)) {
                goto regroup_before;
            }
            if (st != RG_OK) {
                goto out;
            }
            table_at = gstep;
        }
        if (regrouped && o->trace != NULL) {
            char path[1024];
            if (trace != NULL) {
                fclose(trace);
            }
            snprintf(path, sizeof(path), "%s/rank%d-round%d.txt", o->trace, rank,
                     rg_train_round(ctx));
            trace = fopen(path, "a");
            if (trace == NULL) {
                st = rg_error(RG_EIO, "cannot open %s", path);
                goto out;
            }
        }
        regrouped = false;
        if (o->stop_file != NULL && cur.step == 0 && cur.epoch > 0) {
            /* At an epoch boundary: rank 0 decides whether the job ends here. */
            int64_t stop = rank == 0 && access(o->stop_file, F_OK) == 0 ? 1 : 0;
            st = rg_comm_broadcast(comm, &stop, 1, RG_DTYPE_I64, 0, NULL);
            if (regroup_on(ctx, st)) {
                goto regroup_before;
            }
            if (st != RG_OK) {
                goto out;
            }
            if (stop) {
                epochs = (int64_t)cur.epoch;
                break;
            }
        }
        bool kill_now = (o->kill_rank == rank || o->kill_rank2 == rank) &&
                        ((o->kill_at == gstep && rg_train_restart_count(ctx) == 0) ||
                         (o->kill_again == gstep && rg_train_restart_count(ctx) == 1));
        if (kill_now && !o->kill_in_allreduce) {
            fprintf(stderr, "rank %d: killing myself at step %lld as asked\n", rank,
                    (long long)gstep);
            fflush(stderr);
            raise(SIGKILL);
        }
        st = rg_sampler_ids(sampler, &cur, (uint32_t)rank, (uint32_t)world, ids,
                            (size_t)o->batch, &n);
        if (st != RG_OK) {
            goto out;
        }
        memset(local, 0, sizeof(int64_t) * (size_t)o->dim);
        for (size_t i = 0; i < n; i++) {
            busy_work(o->work * o->slow, ids[i]);
            for (int64_t k = 0; k < o->dim; k++) {
                local[k] += contribution(o, cur.epoch, ids[i], (uint64_t)k);
            }
            if (trace != NULL) {
                fprintf(trace, "%d %lld %llu %u\n", rg_train_round(ctx), (long long)gstep,
                        (unsigned long long)cur.epoch, ids[i]);
            }
        }
        if (trace != NULL) {
            fflush(trace);
        }
        if (kill_now) {
            /* In the middle of the step's allreduce: posted, progressed once. */
            rg_comm_req_t *req = NULL;
            st = rg_comm_allreduce_post(comm, RG_COMM_IN_PLACE, local, (size_t)o->dim,
                                        RG_DTYPE_I64, RG_OP_SUM, NULL, &req);
            if (st == RG_OK && rg_comm_req_test(req) == RG_OK) {
                fprintf(stderr, "rank %d: the allreduce completed before the kill\n", rank);
            }
            fprintf(stderr, "rank %d: killing myself in the allreduce of step %lld as asked\n",
                    rank, (long long)gstep);
            fflush(stderr);
            raise(SIGKILL);
        }
        st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, local, (size_t)o->dim, RG_DTYPE_I64,
                               RG_OP_SUM, NULL);
        if (regroup_on(ctx, st)) {
            goto regroup_before;
        }
        if (st != RG_OK) {
            goto out;
        }
        rg_data_cursor_t next = cur;
        rg_sampler_advance(sampler, &next);
        int64_t done = (int64_t)(next.epoch * per_epoch + next.step);
        uint64_t t0 = 0;
        uint64_t tn = 0;
        uint64_t *trows = rg_train_table_rows(table, &t0, &tn);
        if (table != NULL) {
            /* The table's rows first: the step counts once they are committed (the
             * replicated state follows only then; a failed commit leaves it at gstep). */
            table_step(trows, t0, tn, local, o->dim, done);
            st = rg_train_table_commit(ctx, table, done);
            if (regroup_on(ctx, st)) {
                goto regroup_before;
            }
            if (st != RG_OK) {
                goto out;
            }
            table_at = done;
        }
        for (int64_t k = 0; k < o->dim; k++) {
            state[k] += local[k];
        }
        cur = next;
        /* The step is complete here, whatever the report below says (a planned change
         * regroups after it; before, such a step went unlogged and its gap merged with the
         * next one's). */
        step_log(o, rank, done);
        rg_metric_t m[1] = {{"state_digest_low", (double)(digest(state, o->dim) & 0xffff)}};
        rg_report_t rep = {.step = done, .epoch = (int64_t)cur.epoch, .metrics = m,
                           .n_metrics = 1};
        rg_ckpt_tensor_t t[3];
        size_t nt = 0;
        if (tn > 0) {
            t[nt++] = (rg_ckpt_tensor_t){.name = "table", .dtype = RG_DTYPE_I64, .ndim = 1,
                                         .shape = {(uint64_t)o->table_rows}, .row_begin = t0,
                                         .row_count = tn, .data = trows};
        }
        if (rows > 0) {
            t[nt++] = (rg_ckpt_tensor_t){.name = "state", .dtype = RG_DTYPE_I64, .ndim = 1,
                                         .shape = {(uint64_t)o->dim}, .row_begin = row0,
                                         .row_count = rows, .data = state + row0};
        }
        if (pad_rows > 0) {
            t[nt++] = (rg_ckpt_tensor_t){.name = "pad", .dtype = RG_DTYPE_U8, .ndim = 1,
                                         .shape = {(uint64_t)o->pad_kb * 1024},
                                         .row_begin = pad0, .row_count = pad_rows,
                                         .data = pad, .flags = RG_CKPT_NOSHUFFLE};
        }
        rg_train_state_t s = {.tensors = t, .n_tensors = nt, .cursor = cur};
        bool save = done % o->ckpt_every == 0 && (int64_t)cur.epoch < epochs;
        st = rg_report(ctx, &rep, save ? &s : NULL);
        if (st == RG_EMEMBERS) {
            st = on_notice(ctx, &rep, &s, &left);
        }
        if (regroup_on(ctx, st)) {
            /* The step is done here: the state holds `done` steps. */
            st = regroup(ctx, o, state, table, &cur, done,
                         st == RG_EMEMBERS ? "the membership changes" : "a peer failed");
            goto regrouped;
        }
        if (st != RG_OK || left) {
            goto out;
        }
        continue;
    regroup_before:
        /* The step failed before its update: the state holds gstep steps. */
        st = regroup(ctx, o, state, table, &cur, gstep, "a peer failed");
    regrouped:
        if (st != RG_OK) {
            goto out;
        }
        rank = rg_train_rank(ctx);
        world = rg_train_world_size(ctx);
        comm = rg_train_comm(ctx);
        st = layout(o, rank, world, &row0, &rows, &pad, &pad0, &pad_rows);
        if (st != RG_OK) {
            goto out;
        }
        table_at = (int64_t)(cur.epoch * per_epoch + cur.step);   /* (the regroup's commit) */
        regrouped = true;
    }
    if (extra.w != NULL && (st = extra_check(extra.step, 1)) != RG_OK) {
        goto out;
    }
    bool table_ok = true;
    if (table != NULL) {
        st = check_table(ctx, o, epochs, table, &table_ok);   /* collective */
        if (st != RG_OK) {
            goto out;
        }
    }
    if (rank == 0) {
        int64_t *want = malloc(sizeof(int64_t) * (size_t)o->dim);
        if (want == NULL) {
            st = rg_error(RG_ENOMEM, "want");
            goto out;
        }
        expected(o, epochs, want);
        if (table != NULL) {
            printf("table=%d rows=%lld\n", table_ok ? 1 : 0, (long long)o->table_rows);
        }
        bool ok = table_ok && memcmp(want, state, sizeof(int64_t) * (size_t)o->dim) == 0;
        printf("exact=%d digest=%016llx expected=%016llx steps=%llu epochs=%lld world=%d\n",
               ok ? 1 : 0, (unsigned long long)digest(state, o->dim),
               (unsigned long long)digest(want, o->dim),
               (unsigned long long)(per_epoch * (uint64_t)epochs), (long long)epochs, world);
        fflush(stdout);
        free(want);
        if (!ok) {
            st = rg_error(RG_ECORRUPT, "the final state differs from the expected one");
        }
    }
    fprintf(stderr, "rank %d: pid %d finished\n", rank, (int)getpid());
out:
    rg_train_table_destroy(table);
    free(extra.w);
    extra = (extra_state_t){.step = -1};
    free(pad);
    if (trace != NULL) {
        fclose(trace);
    }
    rg_sampler_destroy(sampler);
    free(ids);
    return st;
}

/* The training function of the trainer form: the same run, the context made for us. */
static rg_status_t train_fn(rg_train_ctx_t *ctx, void *arg)
{
    return run(ctx, arg);
}

int main(int argc, char **argv)
{
    options_t o;
    rg_train_ctx_t *ctx;
    /* A line at a time, into a file or a pipe too: tests and the chaos runner read its lines
     * ("resumed from step ...") while it runs. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = parse(argc, argv, &o);
    if (rc != 0) {
        return rc;
    }
    if (o.trainer > 0) {
        if (o.trainer_ckpt == NULL) {
            return usage("--trainer needs --ckpt-root");
        }
        rg_scaling_config_t sc = {.num_workers = (int)o.trainer, .max_failures = 3,
                                  .ckpt_root = o.trainer_ckpt, .in_place = o.trainer_in_place,
                                  .argc = argc, .argv = argv};
        rg_status_t st = rg_trainer_fit(train_fn, &o, &sc);
        if (st != RG_OK) {
            fprintf(stderr, "rg-exact: %s\n", rg_last_error());
            return 1;
        }
        printf("trainer: the job finished\n");
        return 0;
    }
    if (o.expect) {
        int64_t *want = malloc(sizeof(int64_t) * (size_t)o.dim);
        if (want == NULL) {
            return 1;
        }
        expected(&o, o.epochs, want);
        printf("expected digest=%016llx\n", (unsigned long long)digest(want, o.dim));
        free(want);
        return 0;
    }
    rg_train_params_t tp = {.in_place = true};   /* it regroups when the launcher does */
    if (rg_train_init(&tp, &ctx) != RG_OK) {
        fprintf(stderr, "rg-exact: %s\n", rg_last_error());
        return 1;
    }
    rg_status_t st = run(ctx, &o);
    if (st != RG_OK) {
        fprintf(stderr, "rg-exact rank %d: %s: %s\n", rg_train_rank(ctx), rg_status_name(st),
                rg_last_error());
    }
    rg_train_finalize(ctx);
    return st == RG_OK ? 0 : (st == RG_ECORRUPT ? 3 : 1);
}
