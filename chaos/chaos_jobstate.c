/*
 * Every read rg-chaos makes of the job's state in etcd (job CHAOS_JOB_ID, "chaos"). The keys
 * and the records' formats are rendezvous/rdzv_keys.h's, the module every other part of
 * regroup writes them with; this file only chooses what to read:
 *   rank 0's progress record          -> chaos_job_progress (step, round, time)
 *   workers/ckpt/latest, the committed step   -> chaos_job_committed_step
 *   workers/status/restored                   -> chaos_job_restored
 *   failures/, counted                -> chaos_job_failure_count
 *   rounds/<r>/closed, an agent's pid -> chaos_job_agent_in_round
 *   the whole job (rg_rdzv_status_print) -> chaos_job_print_state
 *   the history of the job's keys (rdzv_fence_audit) -> chaos_job_stale_writes
 * A record that does not decode counts as absent, as an unreadable one did before.
 */
#include "chaos.h"
#include "rdzv_fence.h"

#include <regroup/rdzv.h>

#include <stdlib.h>
#include <string.h>

/* The client's timeout: a read that takes longer counts as no answer. */
#define JOB_ETCD_TIMEOUT_MS 3000

bool chaos_job_open(chaos_t *c)
{
    if (rdzv_keys_init(&c->job.keys, CHAOS_JOB_ID) != RG_OK) {
        chaos_say("job keys: %s", rg_last_error());
        return false;
    }
    c->job.closed = calloc(1, sizeof(*c->job.closed));
    if (c->job.closed == NULL) {
        chaos_say("job state: out of memory");
        return false;
    }
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
    free(c->job.closed);
    c->job.closed = NULL;
}

/* The value of a key (caller frees), or NULL if absent or etcd does not answer. */
static char *job_get(chaos_t *c, rg_status_t (*key_of)(const rdzv_keys_t *, char *, size_t),
                     size_t *len)
{
    char key[RDZV_KEY_MAX];
    char *v;
    if (key_of(&c->job.keys, key, sizeof(key)) != RG_OK ||
        rg_etcd_get(c->job.cli, key, 0, &v, len, NULL) != RG_OK) {
        return NULL;
    }
    return v;
}

static rg_status_t progress_key_0(const rdzv_keys_t *k, char *buf, size_t cap)
{
    return rdzv_keys_progress(k, 0, buf, cap);
}

bool chaos_job_progress(chaos_t *c, chaos_progress_t *p)
{
    rdzv_progress_rec_t rec;
    size_t len;
    char *v = job_get(c, progress_key_0, &len);
    bool ok = v != NULL && rdzv_rec_progress_decode(v, len, &rec) == RG_OK;
    free(v);
    if (ok) {
        p->step = rec.step;
        p->round = rec.round;
        p->time = rec.time;
    }
    return ok;
}

/* The newest committed step, or -1 if there is none or it cannot be read. */
int64_t chaos_job_committed_step(chaos_t *c)
{
    int64_t step = -1;
    size_t len;
    char *v = job_get(c, rdzv_keys_ckpt_latest, &len);
    if (v == NULL || rdzv_rec_ckpt_latest_decode(v, len, &step) != RG_OK) {
        step = -1;
    }
    free(v);
    return step;
}

bool chaos_job_restored(chaos_t *c, int *round, int64_t *step)
{
    rdzv_restored_rec_t rec;
    size_t len;
    char *v = job_get(c, rdzv_keys_restored, &len);
    bool ok = v != NULL && rdzv_rec_restored_decode(v, len, &rec) == RG_OK;
    free(v);
    if (ok) {
        *round = rec.round;
        *step = rec.step;
    }
    return ok;
}

/* The number of failures the job recorded, or -1 if etcd does not answer. */
int64_t chaos_job_failure_count(chaos_t *c)
{
    char prefix[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    if (rdzv_keys_failures_prefix(&c->job.keys, prefix, sizeof(prefix)) != RG_OK) {
        return -1;
    }
    rg_etcd_range_req_t rq = {.key = prefix, .prefix = true, .count_only = true};
    if (rg_etcd_range(c->job.cli, &rq, 0, &r) != RG_OK) {
        return -1;
    }
    int64_t n = r.count;
    rg_etcd_range_cleanup(&r);
    return n;
}

/* Whether round r closed with the agent of this pid (on any host) among its members. */
bool chaos_job_agent_in_round(chaos_t *c, int r, pid_t pid)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    bool found = false;
    if (rdzv_keys_closed(&c->job.keys, r, key, sizeof(key)) != RG_OK ||
        rg_etcd_get(c->job.cli, key, 0, &v, &len, NULL) != RG_OK) {
        return false;
    }
    if (rdzv_rec_closed_decode(v, len, r, c->job.closed) == RG_OK) {
        found = rdzv_assignment_find_pid(c->job.closed, NULL, pid) >= 0;
    }
    free(v);
    return found;
}

/* The job's state as etcd holds it, for a fault that did not recover: where it hung. */
void chaos_job_print_state(chaos_t *c, FILE *out)
{
    if (rg_rdzv_status_print(&c->job.params, CHAOS_JOB_ID, out) != RG_OK) {
        chaos_say("cannot read the job's state: %s", rg_last_error());
    }
}

int chaos_job_stale_writes(chaos_t *c, int *checked)
{
    int stale = 0;
    char first[512];
    if (rdzv_fence_audit(&c->job.params, CHAOS_JOB_ID, &stale, checked, first,
                         sizeof(first)) != RG_OK) {
        chaos_say("cannot read the job's history: %s", rg_last_error());
        *checked = -1;
        return -1;
    }
    if (stale > 0) {
        chaos_say("%d writes of stale members were accepted; the first: %s", stale, first);
    }
    return stale;
}
