/*
 * rg_trainer_fit: the single-machine trainer. The driver runs the launcher's agent in
 * process, as `regroup --standalone --nproc-per-node=N --max-restarts=F PROGRAM ARGS`, with
 * PROGRAM this very executable; each worker re-runs the program, reaches rg_trainer_fit
 * again, sees REGROUP_TRAINER_WORKER and runs fn.
 */
#include "launcher.h"

#include <regroup/train.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRAINER_WORKER_ENV "REGROUP_TRAINER_WORKER"

static int run_worker(rg_train_fn_t fn, void *arg)
{
    rg_train_ctx_t *ctx;
    rg_status_t st = rg_train_init(NULL, &ctx);
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

rg_status_t rg_trainer_fit(rg_train_fn_t fn, void *arg, const rg_scaling_config_t *s)
{
    char exe[4096];
    char nproc[32];
    char restarts[32];
    char keep[32];
    launcher_config_t cfg;
    ssize_t n;
    int rc;

    if (fn == NULL || s == NULL || s->num_workers < 1 || s->num_workers > LAUNCHER_MAX_NPROC ||
        s->max_failures < 0 || s->ckpt_root == NULL || s->argc < 1 || s->argv == NULL) {
        return rg_error(RG_EINVAL, "rg_trainer_fit: need fn, 1..%d workers, max_failures >= 0, "
                        "a checkpoint root and the program's argc/argv", LAUNCHER_MAX_NPROC);
    }
    if (s->use_gpu) {
        return rg_error(RG_ENOTSUP, "rg_trainer_fit: use_gpu: this trainer places workers on "
                        "CPUs only");
    }
    if (getenv(TRAINER_WORKER_ENV) != NULL) {
        fflush(stdout);
        exit(run_worker(fn, arg));
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        return rg_error(RG_ESYS, "rg_trainer_fit: cannot find this program's path");
    }
    exe[n] = '\0';
    snprintf(nproc, sizeof(nproc), "--nproc-per-node=%d", s->num_workers);
    snprintf(restarts, sizeof(restarts), "--max-restarts=%d", s->max_failures);
    snprintf(keep, sizeof(keep), "%u", s->keep_last ? s->keep_last : 3);
    /* The workers' environment: they run fn, with checkpoints under ckpt_root. */
    setenv(TRAINER_WORKER_ENV, "1", 1);
    setenv("REGROUP_CKPT_DIR", s->ckpt_root, 1);
    setenv("REGROUP_CKPT_KEEP", keep, 1);
    char **argv = calloc((size_t)s->argc + 8, sizeof(char *));
    if (argv == NULL) {
        return rg_error(RG_ENOMEM, "rg_trainer_fit");
    }
    int k = 0;
    argv[k++] = "regroup";
    argv[k++] = "--standalone";
    argv[k++] = nproc;
    argv[k++] = restarts;
    argv[k++] = "--no-python";
    argv[k++] = exe;
    for (int i = 1; i < s->argc; i++) {
        argv[k++] = s->argv[i];
    }
    argv[k] = NULL;
    rc = launcher_parse(k, argv, &cfg);
    if (rc == 0) {
        rc = launcher_agent_main(&cfg);
    }
    unsetenv(TRAINER_WORKER_ENV);
    free(argv);
    if (rc != 0) {
        return rg_error(RG_EPEER, "rg_trainer_fit: the job failed (exit status %d)", rc);
    }
    return RG_OK;
}
