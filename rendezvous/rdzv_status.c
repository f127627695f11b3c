/* `regroup status`: the job's state as etcd holds it, for people. */
#include "etcd_internal.h"
#include "rdzv_keys.h"

#include <regroup/rdzv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void print_progress(rg_etcd_t *c, const rdzv_keys_t *keys, int64_t round, FILE *out)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};

    if (rdzv_keys_progress_prefix(keys, key, sizeof(key)) != RG_OK ||
        rg_etcd_range(c, &rq, 0, &r) != RG_OK) {
        return;
    }
    if (r.n_kvs > 0) {
        fprintf(out, "progress (last report of each rank):\n");
    }
    for (size_t i = 0; i < r.n_kvs; i++) {
        const char *rank = rdzv_keys_tail(r.kvs[i].key, key);
        fprintf(out, "  rank %-4s %s\n", rank ? rank : "?", r.kvs[i].value);
    }
    /* The ranks of the current round that said they are stragglers
     * (train/train_straggler.c), with their figures: a record of an older round is of a
     * group that is no more. */
    for (size_t i = 0; i < r.n_kvs; i++) {
        const char *rank = rdzv_keys_tail(r.kvs[i].key, key);
        rdzv_progress_rec_t p;
        if (rdzv_rec_progress_decode(r.kvs[i].value, r.kvs[i].value_len, &p) == RG_OK &&
            p.measured && p.slow_s > 0 && p.round == round) {
            fprintf(out, "straggler: rank %s computes %.0f%% of its step time, %.1fx the "
                    "other ranks' median, for %.0f s (round %d)\n", rank ? rank : "?",
                    100 * p.compute, p.slow, p.slow_s, p.round);
        }
    }
    rg_etcd_range_cleanup(&r);
}

/* "2026-12-01 09:50:01 UTC", or "(time not recorded)" for a negative t. */
static void time_str(double t, char *buf, size_t cap)
{
    time_t secs = (time_t)t;
    struct tm tm;
    if (t < 0 || gmtime_r(&secs, &tm) == NULL ||
        strftime(buf, cap, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0) {
        snprintf(buf, cap, "(time not recorded)");
    }
}

/* The latest time among the done/ records of round r's members: true if every member has
 * one (*t is -1 if none of them recorded a time). */
static bool all_done(rg_etcd_t *c, const rdzv_keys_t *keys, const rg_rdzv_assignment_t *a,
                     double *t)
{
    char prefix[RDZV_KEY_MAX];
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = prefix, .prefix = true};
    bool all = true;

    *t = -1;
    if (rdzv_keys_done_prefix(keys, a->round, prefix, sizeof(prefix)) != RG_OK ||
        rg_etcd_range(c, &rq, 0, &r) != RG_OK) {
        return false;
    }
    for (int i = 0; i < a->n_members && all; i++) {
        bool found = false;
        if (rdzv_keys_done(keys, a->round, a->members[i].agent, key, sizeof(key)) != RG_OK) {
            all = false;
            break;
        }
        for (size_t k = 0; k < r.n_kvs && !found; k++) {
            double dt;
            if (strcmp(r.kvs[k].key, key) == 0) {
                found = true;
                if (rdzv_rec_done_decode(r.kvs[k].value, r.kvs[k].value_len, &dt) == RG_OK &&
                    dt > *t) {
                    *t = dt;
                }
            }
        }
        all = found;
    }
    rg_etcd_range_cleanup(&r);
    return all;
}

/* The latest failures/ record's time, or -1. */
static double last_failure_time(rg_etcd_t *c, const rdzv_keys_t *keys)
{
    char prefix[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = prefix, .prefix = true};
    double t = -1;

    if (rdzv_keys_failures_prefix(keys, prefix, sizeof(prefix)) != RG_OK ||
        rg_etcd_range(c, &rq, 0, &r) != RG_OK) {
        return -1;
    }
    for (size_t k = 0; k < r.n_kvs; k++) {
        rdzv_failure_rec_t f = {0};
        if (rdzv_rec_failure_decode(r.kvs[k].value, r.kvs[k].value_len, &f) == RG_OK &&
            f.time > t) {
            t = f.time;
        }
        rdzv_rec_failure_cleanup(&f);
    }
    rg_etcd_range_cleanup(&r);
    return t;
}

/* The state line: running, regrouping, done (every member of the newest closed round wrote
 * its done/ key) or failed (that round's record says so), with when for the last two. True
 * if the job is over. */
static bool print_state(rg_etcd_t *c, const rdzv_keys_t *keys, const rg_rdzv_assignment_t *a,
                        int64_t round, const char *closed, size_t closed_len, FILE *out)
{
    char when[64];
    double t;

    if (a->job_failed) {
        t = last_failure_time(c, keys);
        if (t < 0 && rdzv_rec_closed_time(closed, closed_len, &t) != RG_OK) {
            t = -1;
        }
        time_str(t, when, sizeof(when));
        fprintf(out, "state:   failed at %s (workers failed more than --max-restarts=%d "
                "times)\n", when, a->restart_count - 1);
        return true;
    }
    if (a->round == round && all_done(c, keys, a, &t)) {
        time_str(t, when, sizeof(when));
        fprintf(out, "state:   done at %s (every node's workers exited 0)\n", when);
        return true;
    }
    fprintf(out, "state:   %s\n", a->round == round ? "running" : "regrouping");
    return false;
}

/* The newest closed round from `round` back: its state, members and ranks. */
static void print_members(rg_etcd_t *c, const rdzv_keys_t *keys, int64_t round, FILE *out)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    rg_rdzv_assignment_t *a = malloc(sizeof(*a));

    if (a == NULL) {
        return;
    }
    for (int64_t r = round; r >= 0 && r >= round - 16; r--) {
        if (rdzv_keys_closed(keys, r, key, sizeof(key)) != RG_OK ||
            rg_etcd_get(c, key, 0, &v, &len, NULL) != RG_OK) {
            continue;
        }
        rg_status_t st = rdzv_rec_closed_decode(v, len, r, a);
        if (st != RG_OK) {
            free(v);
            fprintf(out, "state:   unknown (%s)\n", rg_last_error());
            break;
        }
        bool over = print_state(c, keys, a, round, v, len, out);
        free(v);
        fprintf(out, "%s round %lld: %d nodes, world size %d, restarts %d, master %s:%d\n",
                r == round && !over ? "running" : "last", (long long)r, a->n_members, a->world_size,
                a->restart_count, a->master_addr[0] ? a->master_addr : "?", a->master_port);
        if (a->excused_count > 0) {
            fprintf(out, "not counted: %d worker failure%s, each explained by the loss of a "
                    "node of its round (not against --max-restarts)\n", a->excused_count,
                    a->excused_count == 1 ? "" : "s");
        }
        fprintf(out, "members:\n  %-10s %-8s %-20s %s\n", "node rank", "ranks", "host", "agent");
        int offset = 0;
        for (int i = 0; i < a->n_members; i++) {
            const rg_rdzv_member_t *m = &a->members[i];
            char ranks[32];
            snprintf(ranks, sizeof(ranks), "%d-%d", offset, offset + m->nproc - 1);
            fprintf(out, "  %-10d %-8s %-20s %s\n", i, ranks, m->addr, m->agent);
            offset += m->nproc;
        }
        break;
    }
    free(a);
}

/* The members of the last two rounds that left on purpose or are leaving (a preemption
 * notice, SIGTERM): who, why, and their workers' deadline. */
static void print_leaving(rg_etcd_t *c, const rdzv_keys_t *keys, int64_t round, FILE *out)
{
    for (int64_t q = RG_MAX(round - 1, 0); q <= round; q++) {
        char key[RDZV_KEY_MAX];
        rg_etcd_range_t r;
        rg_etcd_range_req_t rq = {.key = key, .prefix = true};

        if (rdzv_keys_leaving_prefix(keys, q, key, sizeof(key)) != RG_OK ||
            rg_etcd_range(c, &rq, 0, &r) != RG_OK) {
            continue;
        }
        for (size_t i = 0; i < r.n_kvs; i++) {
            rdzv_leaving_rec_t l;
            char when[64];
            if (rdzv_rec_leaving_decode(r.kvs[i].value, r.kvs[i].value_len, &l) != RG_OK) {
                fprintf(out, "leaving: %s (unreadable: %s)\n", r.kvs[i].key, rg_last_error());
                continue;
            }
            time_str(l.deadline, when, sizeof(when));
            double left = l.deadline - rg_wall_s();
            fprintf(out, "leaving: round %lld: node %s (%s): %s; workers' deadline %s (%.1f s "
                    "%s)\n", (long long)q, l.addr, l.agent, l.reason, when,
                    left >= 0 ? left : -left, left >= 0 ? "from now" : "ago");
        }
        rg_etcd_range_cleanup(&r);
    }
}

rg_status_t rg_rdzv_status_print(const rg_etcd_params_t *params, const char *job, FILE *out)
{
    rdzv_keys_t keys;
    char key[RDZV_KEY_MAX];
    rg_etcd_t *c;
    char *v = NULL;
    size_t len;
    int64_t round = -1;
    rg_status_t st;

    st = rdzv_keys_init(&keys, job);
    if (st != RG_OK) {
        return st;
    }
    st = rg_etcd_create(params, &c);
    if (st != RG_OK) {
        return st;
    }
    st = rdzv_keys_round(&keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rg_etcd_get(c, key, 0, &v, &len, NULL);
    }
    if (st == RG_ENOENT) {
        fprintf(out, "job %s: no such job in etcd (%s)\n", job, rg_etcd_endpoint(c));
        rg_etcd_destroy(c);
        return RG_ENOENT;
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_decode(v, len, &round);
        free(v);
    }
    if (st != RG_OK) {
        rg_etcd_destroy(c);
        return rg_error_wrap(st, "status");
    }
    fprintf(out, "job:     %s\nround:   %lld\n", job, (long long)round);
    /* A job of another layout (docs/etcd-keys.md): its rounds read the same, but what its
     * workers wrote is elsewhere, and agents of this regroup refuse to join it. */
    char layout[16];
    v = NULL;
    st = rdzv_keys_layout(&keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rg_etcd_get(c, key, 0, &v, &len, NULL);
    }
    bool other = false;
    if (st == RG_OK || st == RG_ENOENT) {   /* absent: layout 1; unreadable: not said */
        other = !rdzv_rec_layout_decode(st == RG_OK ? v : NULL, len, layout, sizeof(layout));
    }
    free(v);
    if (other) {
        fprintf(out, "layout:  %s, not this regroup's %s: its workers' progress and checkpoints "
                "are not shown, and its agents must be of the regroup that started it\n",
                layout, RDZV_LAYOUT);
    }
    print_members(c, &keys, round, out);

    if (rdzv_keys_waiting_prefix(&keys, key, sizeof(key)) == RG_OK) {
        rg_etcd_range_req_t wq = {.key = key, .prefix = true, .keys_only = true};
        rg_etcd_range_t w;
        if (rg_etcd_range(c, &wq, 0, &w) == RG_OK) {
            fprintf(out, "waiting: %zu node(s)\n", w.n_kvs);
            for (size_t i = 0; i < w.n_kvs; i++) {
                const char *agent = rdzv_keys_tail(w.kvs[i].key, key);
                fprintf(out, "  %s\n", agent ? agent : "?");
            }
            rg_etcd_range_cleanup(&w);
        }
    }
    print_leaving(c, &keys, round, out);
    if (rdzv_keys_failures_prefix(&keys, key, sizeof(key)) == RG_OK) {
        rg_etcd_range_req_t fq = {.key = key, .prefix = true, .count_only = true};
        rg_etcd_range_t f;
        if (rg_etcd_range(c, &fq, 0, &f) == RG_OK) {
            fprintf(out, "worker failures recorded: %lld\n", (long long)f.count);
            rg_etcd_range_cleanup(&f);
        }
    }
    int64_t step = -1;
    if (rdzv_keys_ckpt_latest(&keys, key, sizeof(key)) == RG_OK &&
        rg_etcd_get(c, key, 0, &v, &len, NULL) == RG_OK) {
        if (rdzv_rec_ckpt_latest_decode(v, len, &step) != RG_OK) {
            step = -1;
        }
        free(v);
    }
    if (step >= 0) {
        fprintf(out, "last committed checkpoint: %lld\n", (long long)step);
    } else {
        fprintf(out, "last committed checkpoint: none\n");
    }
    print_progress(c, &keys, round, out);
    rg_etcd_destroy(c);
    return RG_OK;
}
