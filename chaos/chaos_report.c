/*
 * What rg-chaos prints: its timestamped log lines (chaos_say), and at the end the table of
 * recovery times by fault kind, the invariants and the verdict, and the same as JSON in
 * --report FILE (each fault, by kind with p50/p99 and their bounds, the invariants,
 * "passed").
 */
#include "chaos.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

void chaos_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("[%8.3f] ", rg_wall_s() - floor(rg_wall_s() / 100000) * 100000);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static const char *tf(bool b)
{
    return b ? "true" : "false";
}

static void report_faults(const chaos_t *c, FILE *f)
{
    const chaos_opts_t *opt = c->opt;
    fprintf(f, "{\"seed\":%llu,\"recovery\":\"%s\",\"scenario\":\"%s\",\"nodes\":%d,"
            "\"wall_s\":%.1f,\"faults\":[", (unsigned long long)opt->seed, opt->recovery,
            opt->scenario, opt->nodes, c->inv.wall_s);
    for (int i = 0; i < c->faults.n_recs; i++) {
        const chaos_fault_rec_t *r = &c->faults.rec[i];
        fprintf(f, "%s{\"kind\":\"%s\",\"target\":\"%s\",\"recovery_s\":%.4f,"
                "\"committed_at_injection\":%lld,\"resumed_step\":%lld,\"steps_redone\":%lld",
                i ? "," : "", chaos_fault_names[r->kind], r->target, r->recovery_s,
                (long long)r->committed, (long long)r->resumed,
                (long long)(r->resumed >= 0 ? RG_MAX(0, r->step_before - r->resumed) : 0));
        if (chaos_fault_node_returns(r->kind)) {
            fprintf(f, ",\"rejoin_s\":%.4f", r->rejoin_s);
        }
        fprintf(f, "}");
    }
    fprintf(f, "],\"by_kind\":{");
}

/* One line of the table per kind injected (and its entry in the JSON by_kind). */
static void report_by_kind(const chaos_t *c, FILE *f)
{
    bool first = true;
    for (int k = 0; k < F_COUNT; k++) {
        const chaos_kind_stats_t *ks = &c->inv.kind[k];
        if (ks->count == 0) {
            continue;
        }
        printf("%-14s %6d %9d %9.3f %9.3f %9.3f %9.3f %s\n", chaos_fault_names[k], ks->count,
               ks->recovered, ks->p50_s, ks->p99_s, ks->p50_bound_s, ks->p99_bound_s,
               ks->within ? "yes" : "NO");
        if (f) {
            fprintf(f, "%s\"%s\":{\"count\":%d,\"recovered\":%d,\"p50_s\":%.4f,\"p99_s\":%.4f,"
                    "\"p50_bound_s\":%.4f,\"p50_judged\":%s,\"p99_bound_s\":%.4f,"
                    "\"within_bounds\":%s}", first ? "" : ",", chaos_fault_names[k], ks->count,
                    ks->recovered, ks->p50_s, ks->p99_s, ks->p50_bound_s, tf(ks->p50_judged),
                    ks->p99_bound_s, tf(ks->within));
        }
        first = false;
    }
}

void chaos_report_write(const chaos_t *c)
{
    const chaos_inv_t *inv = &c->inv;
    FILE *f = c->opt->report ? fopen(c->opt->report, "w") : NULL;
    printf("\n%-14s %6s %9s %9s %9s %9s %9s %s\n", "fault", "count", "recovered", "p50_s",
           "p99_s", "p50_bound", "p99_bound", "within");
    if (f) {
        report_faults(c, f);
    }
    report_by_kind(c, f);
    printf("\ninvariants: finished=%d result=%d checkpoints_verify=%d (%d checked) "
           "no_lost_work=%d no_stale_writes=%d (%d writes checked) no_leaks=%d time_bound=%d "
           "all_recovered=%d within_bounds=%d (scale %g) kept_in_place=%d cut_left_out=%d\n"
           "%s\nresult: %s\n",
           inv->finished, inv->result, inv->checkpoints_verify, inv->verified, inv->no_lost_work,
           inv->no_stale_writes, inv->history_checked, inv->no_leaks, inv->time_bound,
           inv->recovered, inv->within_bounds, c->opt->bound_scale, inv->kept_in_place,
           inv->cut_left_out, inv->result_line,
           inv->pass ? "PASS" : "FAIL");
    if (f) {
        fprintf(f, "},\"invariants\":{\"finished\":%s,\"result\":%s,\"checkpoints_verify\":%s,"
                "\"no_lost_work\":%s,\"no_stale_writes\":%s,\"history_writes_checked\":%d,"
                "\"no_leaks\":%s,\"time_bound\":%s,\"all_recovered\":%s,\"within_bounds\":%s,"
                "\"kept_in_place\":%s,\"cut_left_out\":%s},"
                "\"bound_scale\":%g,\"passed\":%s}\n", tf(inv->finished), tf(inv->result),
                tf(inv->checkpoints_verify), tf(inv->no_lost_work), tf(inv->no_stale_writes),
                inv->history_checked, tf(inv->no_leaks),
                tf(inv->time_bound), tf(inv->recovered), tf(inv->within_bounds),
                tf(inv->kept_in_place), tf(inv->cut_left_out),
                c->opt->bound_scale, tf(inv->pass));
        fclose(f);
    }
}
