/*
 * rg_trainer_fit: the single-machine trainer. The driver runs the launcher's agent in process
 * (rg_agent_run, what `regroup --standalone` runs) with this very executable as the program;
 * each worker re-runs the program, reaches rg_trainer_fit again, sees REGROUP_TRAINER_WORKER in
 * the environment the agent gave it, and runs fn. The driver's own environment is not touched:
 * the workers' variables go to the agent as rg_agent_params_t.env.
 */
#include "launcher.h"

#include <regroup/train.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRAINER_WORKER_ENV "REGROUP_TRAINER_WORKER"

static int run_worker(rg_train_fn_t fn, void *arg, const rg_scaling_config_t *s)
{
    rg_train_ctx_t *ctx;
    rg_train_params_t tp = {.in_place = s->in_place};
    rg_status_t st = rg_train_init(&tp, &ctx);
    if (st != RG_OK) {
        fprintf(stderr, "regroup worker: %s\n", rg_last_error());
        return 1;
    }
    st = fn(ctx, arg);
    if (st != RG_OK) {
        fprintf(stderr, "regroup worker rank %d: %s: %s\n", rg_train_rank(ctx),
                rg_status_name(st), rg_last_error());
    }
    rg_train_finalize(ctx);
    return st == RG_OK ? 0 : 1;
}

/* What only the trainer has (the agent's own parameters are checked by the agent). */
static rg_status_t check_scaling(rg_train_fn_t fn, const rg_scaling_config_t *s)
{
    if (fn == NULL) {
        return rg_error(RG_EINVAL, "rg_trainer_fit: fn is NULL");
    }
    if (s == NULL) {
        return rg_error(RG_EINVAL, "rg_trainer_fit: the scaling config is NULL");
    }
    if (s->ckpt_root == NULL || s->ckpt_root[0] == '\0') {
        return rg_error(RG_EINVAL, "rg_trainer_fit: rg_scaling_config_t.ckpt_root: required");
    }
    if (s->argc < 1 || s->argv == NULL || s->argv[0] == NULL) {
        return rg_error(RG_EINVAL, "rg_trainer_fit: rg_scaling_config_t.argc=%d: the "
                        "program's argc/argv (from main) are required", s->argc);
    }
    if (s->use_gpu) {
        return rg_error(RG_ENOTSUP, "rg_trainer_fit: rg_scaling_config_t.use_gpu: this trainer "
                        "places workers on CPUs only");
    }
    return RG_OK;
}

/* The program the workers run: this executable with the program's own arguments. The
 * strings are borrowed from s and exe; free the array. */
static char **worker_argv(const char *exe, const rg_scaling_config_t *s)
{
    char **argv = calloc((size_t)s->argc + 1, sizeof(char *));
    if (argv == NULL) {
        return NULL;
    }
    argv[0] = (char *)exe;
    for (int i = 1; i < s->argc; i++) {
        argv[i] = s->argv[i];
    }
    return argv;
}

rg_status_t rg_trainer_fit(rg_train_fn_t fn, void *arg, const rg_scaling_config_t *s)
{
    char exe[4096];
    char ckpt_env[4200];
    char keep_env[64];
    rg_agent_params_t p;
    rg_agent_result_t result;
    rg_status_t st = check_scaling(fn, s);
    ssize_t n;

    if (st != RG_OK) {
        return st;
    }
    if (getenv(TRAINER_WORKER_ENV) != NULL) {
        fflush(stdout);
        exit(run_worker(fn, arg, s));
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        return rg_error(RG_ESYS, "rg_trainer_fit: cannot find this program's path");
    }
    exe[n] = '\0';
    if (snprintf(ckpt_env, sizeof(ckpt_env), "REGROUP_CKPT_DIR=%s", s->ckpt_root) >=
        (int)sizeof(ckpt_env)) {
        return rg_error(RG_EINVAL, "rg_trainer_fit: rg_scaling_config_t.ckpt_root: longer "
                        "than %zu characters", sizeof(ckpt_env) - 20);
    }
    snprintf(keep_env, sizeof(keep_env), "REGROUP_CKPT_KEEP=%u", s->keep_last ? s->keep_last : 3);
    /* The workers' environment: they run fn, with checkpoints under ckpt_root. */
    const char *const env[] = {TRAINER_WORKER_ENV "=1", ckpt_env, keep_env};

    rg_agent_params_init(&p);
    p.standalone = true;
    p.from[RG_AGENT_STANDALONE] = "rg_trainer_fit";
    p.nproc = s->num_workers;
    p.from[RG_AGENT_NPROC] = "rg_scaling_config_t.num_workers";
    p.max_restarts = s->max_failures;
    p.from[RG_AGENT_MAX_RESTARTS] = "rg_scaling_config_t.max_failures";
    if (s->in_place) {
        p.recovery = RG_AGENT_RECOVERY_IN_PLACE;
        p.from[RG_AGENT_RECOVERY] = "rg_scaling_config_t.in_place";
    }
    p.no_python = true;
    p.env = env;
    p.n_env = (int)RG_ARRAY_SIZE(env);
    p.from[RG_AGENT_ENV] = "rg_trainer_fit";
    char **argv = worker_argv(exe, s);
    if (argv == NULL) {
        return rg_error(RG_ENOMEM, "rg_trainer_fit");
    }
    p.argc = s->argc;
    p.argv = argv;
    p.from[RG_AGENT_PROGRAM] = "rg_scaling_config_t.argv";
    st = rg_agent_run(&p, &result);
    free(argv);
    if (st != RG_OK) {
        return rg_error_wrap(st, "rg_trainer_fit");
    }
    return RG_OK;
}
