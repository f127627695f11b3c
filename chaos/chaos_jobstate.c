/*
 * Every read rg-chaos makes of the job's state in etcd: the only place that knows the key
 * layout under /regroup/<job>/ (job CHAOS_JOB_ID, "chaos") and the records other parts of
 * regroup write there, so that a change of either is a change to this file alone.
 *
 * Keys and records read (written by the workers and the agents, never by rg-chaos):
 *   /regroup/chaos/status/progress/0  rank 0's progress record, parsed with sscanf:
 *                                     {"step":S,"epoch":E,"round":R,"time":T,...}
 *                                     -> chaos_job_progress (step, round, time)
 *   /regroup/chaos/ckpt/latest        the newest committed step, a decimal number
 *                                     -> chaos_job_committed_step
 *   /regroup/chaos/status/restored    the step a round resumed from: {"round":R,"step":S}
 *                                     -> chaos_job_restored
 *   /regroup/chaos/failures/          one key per recorded failure; only counted
 *                                     -> chaos_job_failure_count
 *   /regroup/chaos/rounds/<r>/closed  round r's final member list; an agent is found in it
 *                                     by "-<pid>-" (agent ids are host-pid-random)
 *                                     -> chaos_job_agent_in_round
 *   the whole job, through rg_rdzv_status_print(job "chaos")
 *                                     -> chaos_job_print_state
 */
#include "chaos.h"

#include <regroup/rdzv.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* The client's timeout: a read that takes longer counts as no answer. */
#define JOB_ETCD_TIMEOUT_MS 3000

bool chaos_job_open(chaos_t *c)
{
    c->job.params = (rg_etcd_params_t){.endpoints = c->procs.etcd.endpoints,
                                       .timeout_ms = JOB_ETCD_TIMEOUT_MS};
    if (rg_etcd_create(&c->job.params, &c->job.cli) != RG_OK) {
        chaos_say("etcd client: %s", rg_last_error());
        return false;
    }
    return true;
}

void chaos_job_close(chaos_t *c)
{
    rg_etcd_destroy(c->job.cli);
    c->job.cli = NULL;
}

bool chaos_job_progress(chaos_t *c, chaos_progress_t *p)
{
    char *v;
    size_t len;
    if (rg_etcd_get(c->job.cli, "/regroup/chaos/status/progress/0", 0, &v, &len, NULL) !=
        RG_OK) {
        return false;
    }
    bool ok = sscanf(v, "{\"step\":%" SCNd64 ",\"epoch\":%*d,\"round\":%d,\"time\":%lf",
                     &p->step, &p->round, &p->time) == 3;
    free(v);
    return ok;
}

/* A key holding one number in the given scanf format; -1 if absent or unreadable. */
static int64_t job_read_i64(chaos_t *c, const char *key, const char *fmt)
{
    char *v;
    size_t len;
    int64_t x = -1;
    if (rg_etcd_get(c->job.cli, key, 0, &v, &len, NULL) == RG_OK) {
        if (sscanf(v, fmt, &x) != 1) {
            x = -1;
        }
        free(v);
    }
    return x;
}

int64_t chaos_job_committed_step(chaos_t *c)
{
    return job_read_i64(c, "/regroup/chaos/ckpt/latest", "%" SCNd64);
}

bool chaos_job_restored(chaos_t *c, int *round, int64_t *step)
{
    char *v;
    size_t len;
    if (rg_etcd_get(c->job.cli, "/regroup/chaos/status/restored", 0, &v, &len, NULL) != RG_OK) {
        return false;
    }
    bool ok = sscanf(v, "{\"round\":%d,\"step\":%" SCNd64 "}", round, step) == 2;
    free(v);
    return ok;
}

/* The number of failures the job recorded, or -1 if etcd does not answer. */
int64_t chaos_job_failure_count(chaos_t *c)
{
    rg_etcd_range_req_t rq = {.key = "/regroup/chaos/failures/", .prefix = true,
                              .count_only = true};
    rg_etcd_range_t r;
    if (rg_etcd_range(c->job.cli, &rq, 0, &r) != RG_OK) {
        return -1;
    }
    int64_t n = r.count;
    rg_etcd_range_cleanup(&r);
    return n;
}

/* Whether round r closed with the agent of this pid among its members. */
bool chaos_job_agent_in_round(chaos_t *c, int r, pid_t pid)
{
    char needle[32];
    char key[128];
    char *v;
    size_t len;
    bool found = false;
    snprintf(needle, sizeof(needle), "-%d-", (int)pid);
    snprintf(key, sizeof(key), "/regroup/chaos/rounds/%d/closed", r);
    if (rg_etcd_get(c->job.cli, key, 0, &v, &len, NULL) == RG_OK) {
        found = strstr(v, needle) != NULL;
        free(v);
    }
    return found;
}

/* The job's state as etcd holds it, for a fault that did not recover: where it hung. */
void chaos_job_print_state(chaos_t *c, FILE *out)
{
    if (rg_rdzv_status_print(&c->job.params, CHAOS_JOB_ID, out) != RG_OK) {
        chaos_say("cannot read the job's state: %s", rg_last_error());
    }
}
