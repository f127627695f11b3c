/*
 * Under srun: defaults from the Slurm job step's environment, as torchrun's users write them
 * by hand in their sbatch scripts (--rdzv-id=$SLURM_JOB_ID --nnodes=$SLURM_NNODES).
 *
 * The agent is under srun when both SLURM_JOB_ID and SLURM_STEP_ID are set: srun sets both for
 * every task of a step, while a batch script (which also has SLURM_JOB_ID, SLURM_PROCID=0, and
 * runs on the first node only) and an salloc shell have no SLURM_STEP_ID. There, and only
 * there, the settings that nothing else gave take:
 *
 *   rdzv_id     SLURM_JOB_ID           the same on every node of the job, and kept when Slurm
 *                                      requeues it, so a requeued job resumes its checkpoints
 *   nnodes      SLURM_STEP_NUM_NODES   N:N, the nodes srun started the step on (SLURM_NNODES
 *                                      when a Slurm has no SLURM_STEP_NUM_NODES)
 *   local_addr  SLURMD_NODENAME        the node's name in slurm.conf, if it resolves
 *
 * A flag beats a REGROUP_* variable, which beats these, which beat the defaults.
 *
 * nnodes is fixed, not 1:N: srun starts the step on all N nodes at once, so every agent is
 * coming; 1:N would close the first round with the agents that happened to be there within
 * last_call_timeout and regroup as soon as the rest joined, and would let the job run on
 * fewer nodes than it holds. Slurm ends the whole step when one of its nodes fails (unless
 * srun --no-kill), so a smaller minimum buys nothing by default; a job that means to carry on
 * gives --nnodes=MIN:$SLURM_NNODES and srun --no-kill itself.
 *
 * SLURMD_NODENAME is a name in slurm.conf, which need not be a host name (NodeName=n1
 * NodeAddr=10.0.0.1). A name that does not resolve is not used: local_addr stays automatic (the
 * host name, as without Slurm), and the agent says so on stderr, so that a job that would run
 * without Slurm also runs under it.
 *
 * A value that is not what Slurm writes (a job id that is not a number, a node count that is
 * not a whole number) is an error that names the variable, like a bad REGROUP_* variable, as
 * are several tasks a node when nnodes comes from Slurm: srun must start one agent a node
 * (--ntasks-per-node=1), and each agent starts --nproc-per-node workers.
 */
#include "launcher.h"

#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int slurm_bad(const char *var, const char *value, const char *why)
{
    fprintf(stderr, "regroup: %s=%s: %s (see regroup --help)\n", var, value, why);
    return 2;
}

/* A whole decimal number without sign, at most max. */
static bool slurm_number(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end;
    unsigned long long v;
    if (s[0] < '0' || s[0] > '9') {
        return false;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max) {
        return false;
    }
    *out = v;
    return true;
}

static bool slurm_node_name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n < sizeof(((rg_agent_params_t *)NULL)->local_addr) &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

static bool slurm_resolves(const char *host, const char **why)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        *why = gai_strerror(rc);
        return false;
    }
    freeaddrinfo(res);
    return true;
}

static const char *slurm_env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

static int slurm_nnodes(rg_agent_params_t *p)
{
    const char *var = "SLURM_STEP_NUM_NODES";
    const char *v = slurm_env(var);
    const char *tasks = slurm_env("SLURM_STEP_NUM_TASKS");
    unsigned long long n;
    unsigned long long t;

    if (v == NULL) {
        var = "SLURM_NNODES";
        v = slurm_env(var);
    }
    if (v == NULL) {
        return 0;
    }
    /* The upper bound (256) is rg_agent_params_check's, which names the variable too. */
    if (!slurm_number(v, 1000000, &n) || n == 0) {
        return slurm_bad(var, v, "expected Slurm's node count, a number from 1");
    }
    if (tasks != NULL && !slurm_number(tasks, 100000000, &t)) {
        return slurm_bad("SLURM_STEP_NUM_TASKS", tasks,
                         "expected Slurm's task count, a whole number");
    }
    if (tasks != NULL && t != n) {
        fprintf(stderr, "regroup: SLURM_STEP_NUM_TASKS=%s, %s=%s: srun started %s tasks on %s "
                "nodes; regroup is one agent a node, which starts --nproc-per-node workers: "
                "run srun --ntasks-per-node=1 (or give --nnodes)\n", tasks, var, v, tasks, v);
        return 2;
    }
    p->min_nodes = p->max_nodes = (int)n;
    p->from[RG_AGENT_NNODES] = var;
    return 0;
}

static void slurm_local_addr(rg_agent_params_t *p)
{
    const char *name = slurm_env("SLURMD_NODENAME");
    const char *why = NULL;

    if (name == NULL) {
        return;
    }
    if (!slurm_node_name_ok(name) || !slurm_resolves(name, &why)) {
        fprintf(stderr, "regroup: SLURMD_NODENAME=%s %s%s%s; local_addr stays automatic (as "
                "without Slurm); give --local-addr if the other nodes cannot reach this one by "
                "it\n", name, why ? "does not resolve (" : "is not a host name",
                why ? why : "", why ? ")" : "");
        return;
    }
    memcpy(p->local_addr, name, strlen(name) + 1);
    p->from[RG_AGENT_LOCAL_ADDR] = "SLURMD_NODENAME";
}

static bool slurm_step(void)
{
    return slurm_env("SLURM_JOB_ID") != NULL && slurm_env("SLURM_STEP_ID") != NULL;
}

int launcher_slurm_defaults(rg_agent_params_t *p)
{
    const char *job = slurm_env("SLURM_JOB_ID");
    const char *step = slurm_env("SLURM_STEP_ID");
    unsigned long long n;
    int rc;

    if (!slurm_step()) {
        return 0;
    }
    if (!slurm_number(step, UINT32_MAX, &n)) {
        return slurm_bad("SLURM_STEP_ID", step, "expected Slurm's step id, a whole number");
    }
    if (p->from[RG_AGENT_JOB] == NULL) {
        if (!slurm_number(job, UINT32_MAX, &n) || n == 0) {
            return slurm_bad("SLURM_JOB_ID", job, "expected Slurm's job id, a number from 1");
        }
        snprintf(p->job, sizeof(p->job), "%llu", n);
        p->from[RG_AGENT_JOB] = "SLURM_JOB_ID";
    }
    /* --standalone is one node with its private etcd on loopback: nothing more to take. */
    if (p->standalone) {
        return 0;
    }
    if (p->from[RG_AGENT_NNODES] == NULL) {
        rc = slurm_nnodes(p);
        if (rc != 0) {
            return rc;
        }
    }
    if (p->from[RG_AGENT_LOCAL_ADDR] == NULL) {
        slurm_local_addr(p);
    }
    return 0;
}
