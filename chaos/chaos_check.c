/*
 * The invariants of a run, checked once the job has been told to finish: the job finished,
 * its final state is exactly right (fmnist: accurate enough), every retained checkpoint
 * verifies, no round resumed from before the checkpoint committed when its fault struck, no
 * write of a stale member was accepted (etcd's history of the job's keys), no process of the
 * run is left, nothing exceeded its time bound, every fault recovered, and each kind's
 * recovery times keep to its bounds (chaos.h: p99 and p50 from the lease TTL and the time the
 * kind takes to be seen, times --bound-scale).
 * chaos_check_verdict computes the pass/fail from them, once; the report and the exit
 * status both read c->inv.pass.
 */
#include "chaos.h"

#include <regroup/ckpt.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define FMNIST_MIN_ACCURACY 0.75

/* Whether an agent's log has a line starting with `text`; the last such line of the first
 * log that has one goes to line_out. */
static bool job_log_has(const chaos_t *c, const char *text, char *line_out, size_t line_len)
{
    for (int k = 0; k < c->procs.n_started; k++) {
        char path[400];
        char line[1024];
        snprintf(path, sizeof(path), "%s/agent%d.log", c->run.dir, k);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue;
        }
        bool found = false;
        while (fgets(line, sizeof(line), f) != NULL) {
            if (strncmp(line, text, strlen(text)) == 0) {
                found = true;
                if (line_out) {
                    snprintf(line_out, line_len, "%.*s", (int)line_len - 1, line);
                    line_out[strcspn(line_out, "\n")] = '\0';
                }
            }
        }
        fclose(f);
        if (found) {
            return true;
        }
    }
    return false;
}

/* finished and result, from the workers' last lines in the agents' logs. */
void chaos_check_result(chaos_t *c)
{
    chaos_inv_t *inv = &c->inv;
    if (c->opt->use_fmnist) {
        /* Floating point, summed in an order that depends on the world size: not exact, but
         * training must still reach the accuracy one epoch gives. */
        inv->finished = chaos_agents_alive(c) == 0 &&
                        job_log_has(c, "test_accuracy=", inv->result_line,
                                    sizeof(inv->result_line));
        inv->result = inv->finished && atof(inv->result_line + strlen("test_accuracy=")) >=
                                           FMNIST_MIN_ACCURACY;
    } else {
        inv->finished = chaos_agents_alive(c) == 0 && job_log_has(c, "exact=", NULL, 0);
        inv->result = job_log_has(c, "exact=1", inv->result_line, sizeof(inv->result_line));
        if (!inv->result) {
            job_log_has(c, "exact=", inv->result_line, sizeof(inv->result_line));
        }
    }
}

/* Every retained checkpoint verifies, but those corrupted on purpose. */
void chaos_check_checkpoints(chaos_t *c)
{
    int64_t *steps = NULL;
    size_t n_steps = 0;
    c->inv.checkpoints_verify = true;
    if (rg_ckpt_list(c->run.ckpt_dir, &steps, &n_steps) == RG_OK) {
        for (size_t i = 0; i < n_steps; i++) {
            bool corrupted = false;
            for (int k = 0; k < c->faults.n_corrupted; k++) {
                corrupted = corrupted || c->faults.corrupted[k] == steps[i];
            }
            if (corrupted) {
                continue;
            }
            c->inv.verified++;
            if (rg_ckpt_verify(c->run.ckpt_dir, steps[i]) != RG_OK) {
                chaos_say("checkpoint step %lld does not verify: %s", (long long)steps[i],
                          rg_last_error());
                c->inv.checkpoints_verify = false;
            }
        }
    }
    free(steps);
}

/* No write by a stale member was accepted: from etcd's history of the job's keys. */
void chaos_check_history(chaos_t *c)
{
    int stale = chaos_job_stale_writes(c, &c->inv.history_checked);
    c->inv.no_stale_writes = stale == 0;
}

/* Nothing of the run may remain (stopped workers included); what does is killed. */
void chaos_check_leaks(chaos_t *c)
{
    pid_t left[64];
    int n_left = 0;
    for (int tries = 0; tries < 100; tries++) {
        n_left = chaos_leftover_processes(c, left, 64);
        if (n_left == 0) {
            break;
        }
        rg_sleep_ms(20);
    }
    c->inv.leaks = n_left;
    c->inv.no_leaks = n_left == 0;
    for (int i = 0; i < n_left; i++) {
        chaos_say("leaked process %d: killing it", (int)left[i]);
        kill(left[i], SIGKILL);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-quantile of v[0..n) (sorted here), or -1 if n is 0. */
static double pct(double *v, int n, double p)
{
    if (n == 0) {
        return -1;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return v[(int)(p * (n - 1) + 0.5)];
}

/* How long a fault of kind k takes to be seen, by design, in seconds; 0 for one seen at once
 * (a worker's exit, a refused connection, a write that fails). */
static double detect_s(chaos_fault_t k)
{
    switch (k) {
    case F_AGENT_KILL:        /* the agent's lease expires */
    case F_AGENT_HANG:
    case F_PARTITION:
    case F_ETCD_PARTITION:
        return CHAOS_LEASE_TTL_S;
    case F_PEER_PARTITION:    /* the cut-off node's lease lives on: the collectives' deadline */
        return CHAOS_COMM_TIMEOUT_MS / 1000.0;
    case F_WORKER_HANG:
        return CHAOS_HANG_TIMEOUT_S;
    case F_ETCD_SILENT:       /* the etcd client leaves a member silent for about 1 s */
        return 1.0;
    case F_NODE_JOIN:         /* the round waits the last call for more nodes */
        return CHAOS_LAST_CALL_S;
    case F_STRAGGLER:         /* slow for the window, counted from the second exchange (a
                               * second each) that shows it: the first measures the second
                               * before the throttle too, and the shares are smoothed */
        return CHAOS_STRAGGLER_WINDOW_S + 2.0;
    default:
        return 0;
    }
}

double chaos_p99_bound_s(const chaos_t *c, chaos_fault_t k)
{
    return c->opt->bound_scale * (RG_MAX(CHAOS_LEASE_TTL_S, detect_s(k)) +
                                  CHAOS_BOUND_P99_OVER_TTL_S);
}

/* Kind k's recovery times and whether they keep to its bounds (chaos.h). */
static void kind_stats(const chaos_t *c, chaos_fault_t k, chaos_kind_stats_t *ks)
{
    static double v[CHAOS_MAX_FAULTS];
    double scale = c->opt->bound_scale;
    double d = detect_s(k);
    int n = 0;
    *ks = (chaos_kind_stats_t){0};
    for (int i = 0; i < c->faults.n_recs; i++) {
        if (c->faults.rec[i].kind == k) {
            ks->count++;
            if (c->faults.rec[i].recovery_s >= 0) {
                v[n++] = c->faults.rec[i].recovery_s;
            }
        }
    }
    ks->recovered = n;
    ks->p50_s = pct(v, n, 0.5);
    ks->p99_s = pct(v, n, 0.99);
    ks->p50_bound_s = scale * (d > 0 ? d + CHAOS_BOUND_P50_AFTER_S : CHAOS_BOUND_P50_AT_ONCE_S);
    ks->p99_bound_s = chaos_p99_bound_s(c, k);
    ks->p50_judged = n >= CHAOS_BOUND_P50_MIN;
    ks->within = ks->p99_s <= ks->p99_bound_s &&
                 (!ks->p50_judged || ks->p50_s <= ks->p50_bound_s);
}

/* Every kind injected keeps to its recovery bounds; each that does not is said, with its
 * figures. */
static bool check_bounds(chaos_t *c)
{
    bool ok = true;
    for (int k = 0; k < F_COUNT; k++) {
        chaos_kind_stats_t *ks = &c->inv.kind[k];
        kind_stats(c, (chaos_fault_t)k, ks);
        if (ks->count > 0 && !ks->within) {
            chaos_say("%s recovers out of its bounds: p50 %.3f s (bound %.3f s%s), p99 %.3f s "
                      "(bound %.3f s), %d recoveries", chaos_fault_names[k], ks->p50_s,
                      ks->p50_bound_s, ks->p50_judged ? "" : ", not judged", ks->p99_s,
                      ks->p99_bound_s, ks->recovered);
            ok = false;
        }
    }
    return ok;
}

/* The run's time bound, the faults' records, and then the verdict, from all invariants. */
void chaos_check_verdict(chaos_t *c)
{
    const chaos_opts_t *opt = c->opt;
    chaos_inv_t *inv = &c->inv;
    inv->wall_s = rg_wall_s() - c->run.t_start;
    inv->time_bound = inv->wall_s < opt->deadline_s;
    inv->no_lost_work = true;
    for (int i = 0; i < c->faults.n_recs; i++) {
        inv->no_lost_work = inv->no_lost_work && !c->faults.rec[i].lost_work;
    }
    inv->recovered = !c->faults.stalled;
    if (opt->quick && c->faults.n_recs < 12) {
        chaos_say("only %d faults injected", c->faults.n_recs);
        inv->recovered = false;
    }
    for (int k = 0; opt->quick && k < F_COUNT; k++) {
        bool possible = chaos_fault_enabled(c, (chaos_fault_t)k) &&
                        (k != F_DISK_FULL || c->run.tmpfs_mounted) &&
                        (!chaos_fault_needs_net((chaos_fault_t)k) || c->net.on);
        int count = 0;
        for (int i = 0; i < c->faults.n_recs; i++) {
            count += c->faults.rec[i].kind == (chaos_fault_t)k;
        }
        if (possible && count == 0) {
            chaos_say("quick run: no %s fault was injected", chaos_fault_names[k]);
            inv->recovered = false;
        }
    }
    inv->within_bounds = check_bounds(c);
    /* In place, a node that was cut off or stopped past its lease and came back is left out
     * and joins again with newcomers: the others never restart for it. */
    inv->kept_in_place = true;
    for (int i = 0; strcmp(opt->recovery, "in-place") == 0 && i < c->faults.n_recs; i++) {
        const chaos_fault_rec_t *r = &c->faults.rec[i];
        if (chaos_fault_node_returns(r->kind) && r->resumed >= 0) {
            chaos_say("fault %d (%s) made the job restart from step %lld in place", i,
                      chaos_fault_names[r->kind], (long long)r->resumed);
            inv->kept_in_place = false;
        }
    }
    /* In place, a node cut off from its peers while etcd answers leaves the round itself
     * (of three or more: of two, the first stays), so the others train on before the link
     * comes back. */
    inv->cut_left_out = true;
    for (int i = 0; strcmp(opt->recovery, "in-place") == 0 && i < c->faults.n_recs; i++) {
        const chaos_fault_rec_t *r = &c->faults.rec[i];
        if (r->kind == F_PEER_PARTITION && r->was_member && r->members_before >= 3 &&
            r->recovery_s >= 0 && r->t_inject + r->recovery_s >= r->heal_at) {
            chaos_say("fault %d (%s) recovered in %.3f s, only once the link came back (%.3f "
                      "s): the cut-off node was not left out", i, chaos_fault_names[r->kind],
                      r->recovery_s, r->heal_at - r->t_inject);
            inv->cut_left_out = false;
        }
    }
    inv->pass = inv->finished && inv->result && inv->checkpoints_verify && inv->no_lost_work &&
                inv->no_leaks && inv->no_stale_writes && inv->time_bound && inv->recovered &&
                inv->within_bounds && inv->kept_in_place && inv->cut_left_out;
}
