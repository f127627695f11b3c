/*
 * regroup worker API: what a training program calls (the shape of Ray Train's, in C).
 *
 *   rg_train_ctx_t *ctx;
 *   rg_train_init(NULL, &ctx);                     // from the launcher's environment
 *   if (rg_get_checkpoint(ctx, &step) == RG_OK)     // resume: reshards if the world changed
 *       rg_train_restore(ctx, step, reqs, n, &cursor);
 *   for (...) {
 *       ... compute gradients ...
 *       rg_comm_allreduce(rg_train_comm(ctx), ...); // average them
 *       ... apply the update ...
 *       rg_report(ctx, &report, every_k ? &state : NULL);  // progress; async checkpoint
 *   }
 *   rg_train_finalize(ctx);                         // waits for the last checkpoint
 *
 * A context belongs to one thread. Every call documents whether it blocks.
 */
#ifndef REGROUP_TRAIN_H
#define REGROUP_TRAIN_H

#include <regroup/ckpt.h>
#include <regroup/comm.h>
#include <regroup/data.h>
#include <regroup/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RG_TRAIN_NODISCARD __attribute__((warn_unused_result))
#define RG_TRAIN_MAX_METRICS 32

typedef struct rg_train_ctx rg_train_ctx_t;

typedef struct {
    const char *ckpt_root;       /* checkpoint root; NULL = $REGROUP_CKPT_DIR, or none */
    unsigned    keep_last;       /* checkpoints kept; 0 = $REGROUP_CKPT_KEEP or 3 */
    int64_t     comm_timeout_ms; /* collective deadline; 0 = $REGROUP_COMM_TIMEOUT_MS or 30000 */
    size_t      staging_bytes;   /* checkpoint staging buffer to allocate up front; 0 = lazy */
} rg_train_params_t;

/*
 * Builds the context from the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, REGROUP_ETCD_ENDPOINTS, REGROUP_JOB_ID,
 * REGROUP_ROUND): connects to etcd, creates the round's communication group (blocks until
 * every rank joined or the deadline), and opens the checkpoint root. params may be NULL.
 * RG_EINVAL names a missing or malformed variable. Free with rg_train_finalize.
 */
rg_status_t rg_train_init(const rg_train_params_t *params, rg_train_ctx_t **ctx_p)
    RG_TRAIN_NODISCARD;
/* Waits for a checkpoint in flight, then frees everything. If a peer has failed (the group
 * is unhealthy), it waits at most 1 s and then abandons the checkpoint in flight (it never
 * becomes visible) so that the process can exit and the job restart at once. The commit
 * wait is bounded by REGROUP_CKPT_COMMIT_TIMEOUT_MS (default 120000). Accepts NULL. */
void rg_train_finalize(rg_train_ctx_t *ctx);

int        rg_train_rank(const rg_train_ctx_t *ctx);
int        rg_train_world_size(const rg_train_ctx_t *ctx);
int        rg_train_local_rank(const rg_train_ctx_t *ctx);
int        rg_train_local_size(const rg_train_ctx_t *ctx);
int        rg_train_round(const rg_train_ctx_t *ctx);
int        rg_train_restart_count(const rg_train_ctx_t *ctx);
rg_comm_t *rg_train_comm(rg_train_ctx_t *ctx);          /* owned by the context */
const char *rg_train_ckpt_root(const rg_train_ctx_t *ctx); /* NULL if none */

typedef struct {
    const char *name;
    double      value;
} rg_metric_t;

typedef struct {
    int64_t            step;
    int64_t            epoch;
    const rg_metric_t *metrics;
    size_t             n_metrics;   /* at most RG_TRAIN_MAX_METRICS */
} rg_report_t;

typedef struct {
    const rg_ckpt_tensor_t *tensors;  /* this rank's slices (or replicated tensors) */
    size_t                  n_tensors;
    rg_data_cursor_t        cursor;   /* where the data stream resumes */
} rg_train_state_t;

/*
 * Publishes progress at /regroup/<job>/status/progress/<rank> (where `regroup status` shows
 * it). With state (and a checkpoint root), also starts an asynchronous checkpoint of the
 * state at report->step: the call copies the tensors into the staging buffer and returns;
 * compression, writes, fsync and the commit happen in the background. If the previous
 * checkpoint is still being written, it waits for it first. A failed background checkpoint
 * is reported by the next rg_report or rg_train_finalize (and logged), never silently lost.
 */
rg_status_t rg_report(rg_train_ctx_t *ctx, const rg_report_t *report,
                      const rg_train_state_t *state) RG_TRAIN_NODISCARD;

/* The newest committed checkpoint that verifies, or RG_ENOENT if none. Non-blocking apart
 * from reading the manifests. */
rg_status_t rg_get_checkpoint(rg_train_ctx_t *ctx, int64_t *step_p) RG_TRAIN_NODISCARD;

/*
 * Reads the given rows of each requested tensor from checkpoint `step` (falling back to the
 * newest good one if it fails to verify), and the data cursor saved with it. The row ranges
 * may differ from those saved (resharding to a new world size). *step_p (may be NULL) gets
 * the step actually read. Blocks on disk.
 */
rg_status_t rg_train_restore(rg_train_ctx_t *ctx, int64_t step, const rg_ckpt_request_t *reqs,
                             size_t n_reqs, rg_data_cursor_t *cursor, int64_t *step_p)
    RG_TRAIN_NODISCARD;

/* ---- single-machine trainer ------------------------------------------------------------ */

typedef rg_status_t (*rg_train_fn_t)(rg_train_ctx_t *ctx, void *arg);

typedef struct {
    int         num_workers;     /* workers on this machine, 1..256 */
    int         max_failures;    /* worker failures tolerated (restarts), >= 0 */
    bool        use_gpu;         /* refused with RG_ENOTSUP in a build without CUDA */
    const char *ckpt_root;       /* required */
    unsigned    keep_last;       /* checkpoints kept; 0 = 3 */
    int         argc;            /* the program's own arguments, re-used for the workers */
    char      **argv;
} rg_scaling_config_t;

/*
 * Runs fn on num_workers local workers with a private etcd: the same machinery as
 * `regroup --standalone` (restarts, checkpoints, resume). Called in the program's main: in
 * the driver it starts the workers (re-running this program) and returns when the job ends;
 * in a worker it runs fn and exits the process with fn's result (0 for RG_OK, else 1).
 * The driver returns, with the reason in rg_last_error():
 *   RG_OK          every worker finished fn successfully
 *   RG_EINVAL      a bad scaling config, naming the field ("rg_scaling_config_t.num_workers=0")
 *   RG_ENOTSUP     use_gpu
 *   RG_EJOBFAILED  the workers failed more than max_failures times
 *   RG_ECANCELED   SIGTERM, SIGINT or SIGHUP reached the driver: the workers were stopped
 *   RG_EUNREACH, RG_ETIMEDOUT, ...  the private etcd or the rendezvous could not start
 *   RG_ESYS        the workers could not be started
 * The driver's environment is left as it was (the workers get theirs from the launcher), and
 * so are its signal mask and SIGPIPE disposition, which change only while it runs. Blocks.
 */
rg_status_t rg_trainer_fit(rg_train_fn_t fn, void *arg, const rg_scaling_config_t *scaling)
    RG_TRAIN_NODISCARD;

#ifdef __cplusplus
}
#endif
#endif
