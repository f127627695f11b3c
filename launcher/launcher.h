/*
 * The launcher: one agent per node that forks the workers, restarts them, owns the etcd lease
 * and the rendezvous. Two front ends drive the same agent through one interface:
 *
 *   rg_agent_params_t p;
 *   rg_agent_params_init(&p);            defaults, every field's source "default"
 *   ... fill p (and p.from[field]) ...   the `regroup` command from argv and REGROUP_* variables
 *                                        (launcher_opts.c); rg_trainer_fit from its
 *                                        rg_scaling_config_t (train/train_trainer.c)
 *   rg_agent_run(&p, &result);           validates (rg_agent_params_check), runs, says what
 *                                        happened
 *
 * Validation is in one place (launcher_params.c) and names the bad value as its source gave it
 * (`--nproc-per-node=0`, `REGROUP_NPROC_PER_NODE=0`, `rg_scaling_config_t.num_workers=0`).
 * The workers' environment is built for each child from this process's environ, p.env and
 * torchrun's variables; the agent never calls setenv, and it restores the signal mask and the
 * SIGPIPE disposition it changed, so an in-process caller gets its process back as it was.
 *
 * launcher_params.c  the parameters: defaults, validation, --print-config, etcd parameters.
 * launcher_opts.c    the command line (dashed and underscored spellings) into the parameters;
 *                    the subcommands' arguments read the same way (launcher_sub_arg).
 * launcher_workers.c starts, watches, pumps the output of and stops the worker processes.
 * launcher_fork.c    --preload: the fork server (forkserver.py) that forks a Python
 *                    program's workers from an interpreter that imported its modules once;
 *                    the agent, a child subreaper while it runs, is each worker's parent.
 * launcher_agent.c   the agent: rendezvous, run a round, react to failures and signals.
 * launcher_inplace.c --recovery=in-place: the workers' pipe, replacing one worker, and
 *                    joining the next round while the workers live.
 * launcher_c10d.c    --rdzv-backend=c10d: serving the rendezvous from the endpoint's host.
 * launcher_slurm.c   under srun: defaults from the Slurm job step's environment.
 * launcher_notice.c  preemption notices (the clouds' metadata, SIGTERM): a node that leaves on
 *                    purpose, its last checkpoint, and the others told (launcher_notice.h).
 * launcher_status.c  `regroup status`.
 */
#ifndef REGROUP_LAUNCHER_H
#define REGROUP_LAUNCHER_H

#include "rg_beat.h"
#include "rg_common.h"

#include <regroup/rdzv.h>

#include "rg_notice.h"

#include <sched.h>
#include <stdio.h>
#include <sys/types.h>

#define LAUNCHER_MAX_NPROC 256
#define RG_AGENT_MAX_ENV   64     /* entries of rg_agent_params_t.env */

/* The settings, in --print-config's order; each has a source in rg_agent_params_t.from. */
typedef enum {
    RG_AGENT_NNODES, RG_AGENT_NPROC, RG_AGENT_BACKEND, RG_AGENT_ENDPOINT, RG_AGENT_JOB,
    RG_AGENT_LAST_CALL, RG_AGENT_JOIN_TIMEOUT, RG_AGENT_LEASE_TTL, RG_AGENT_MAX_RESTARTS,
    RG_AGENT_RECOVERY,
    RG_AGENT_MONITOR, RG_AGENT_HANG, RG_AGENT_STRAGGLER_FACTOR, RG_AGENT_STRAGGLER_WINDOW,
    RG_AGENT_GRACE, RG_AGENT_ROLE, RG_AGENT_LOG_DIR, RG_AGENT_REDIRECTS, RG_AGENT_TEE,
    RG_AGENT_RANKS_FILTER, RG_AGENT_NUMA, RG_AGENT_NOTICE, RG_AGENT_HEALTH,
    RG_AGENT_PRELOAD, RG_AGENT_LOCAL_ADDR, RG_AGENT_STANDALONE, RG_AGENT_USER, RG_AGENT_PASSWORD,
    RG_AGENT_CACERT, RG_AGENT_CERT, RG_AGENT_KEY, RG_AGENT_NO_PYTHON, RG_AGENT_MODULE,
    RG_AGENT_PROGRAM, RG_AGENT_ENV, RG_AGENT_NFIELDS
} rg_agent_field_t;

/* Who serves the rendezvous. */
typedef enum {
    RG_AGENT_BACKEND_ETCD,          /* an etcd (or a cluster) the job is given */
    RG_AGENT_BACKEND_C10D,          /* torchrun's c10d: the agent on the endpoint's host serves
                                     * it, as a single-member etcd on the endpoint's port */
} rg_agent_backend_t;

/* --numa-binding: torchrun's values; none by default, as in torchrun. */
typedef enum {
    RG_AGENT_NUMA_NONE,
    RG_AGENT_NUMA_NODE,             /* the whole NUMA node of the local rank */
    RG_AGENT_NUMA_SOCKET,           /* the whole socket of that node */
    RG_AGENT_NUMA_EXCLUSIVE,        /* disjoint whole cores of that node, per local rank */
    RG_AGENT_NUMA_CORE_COMPLEX,     /* one L3 cache group of that node */
} rg_agent_numa_t;

/* --preemption-notice: whose instance metadata the agent watches (launcher_notice.c). */
typedef enum {
    RG_AGENT_NOTICE_NONE,           /* none (the default): only SIGTERM */
    RG_AGENT_NOTICE_AWS,            /* EC2 spot instance-action, IMDSv2 */
    RG_AGENT_NOTICE_GCE,            /* Compute Engine instance/preempted */
    RG_AGENT_NOTICE_AZURE,          /* Azure Scheduled Events: Preempt, Terminate */
    RG_AGENT_NOTICE_AUTO,           /* the first of those that answers */
} rg_agent_notice_t;
/* --health-check: what the workers do before a group trains (train/train_health.c). */
typedef enum {
    RG_AGENT_HEALTH_OFF,            /* nothing (the default) */
    RG_AGENT_HEALTH_WARN,           /* measure the links; name a node far below the others */
    RG_AGENT_HEALTH_EVICT,          /* and (in place) that node leaves as a preempted one */
} rg_agent_health_t;

/* --recovery: how the job recovers from a failure or a membership change. */
typedef enum {
    RG_AGENT_RECOVERY_RESTART,      /* stop every worker, start fresh ones from the last
                                     * checkpoint (any program; the default) */
    RG_AGENT_RECOVERY_IN_PLACE,     /* keep the survivors; replace only a dead worker; the
                                     * workers regroup with rg_train_regroup (programs on
                                     * libregroup's worker API that say they do) */
} rg_agent_recovery_t;

#define RG_AGENT_C10D_PORT 29400    /* torchrun's default port of a c10d endpoint */

typedef struct {
    /* rendezvous */
    int         min_nodes;          /* 1..256, min <= max */
    int         max_nodes;
    int         nproc;              /* workers on this node, 1..LAUNCHER_MAX_NPROC */
    rg_agent_backend_t backend;
    char        endpoint[1024];     /* etcd endpoints, or c10d's one HOST[:PORT]; "" with
                                     * standalone */
    char        job[80];            /* 1-64 of A-Z a-z 0-9 _ . - */
    bool        standalone;         /* start a private etcd (a single node) */
    int64_t     last_call_ms;       /* 0..3600 s */
    int64_t     join_timeout_ms;    /* 0.1..86400 s */
    int64_t     lease_ttl_s;        /* 1..3600 */
    char        user[128];          /* etcd user and password: both or neither */
    char        password[128];
    char        cacert[512];
    char        cert[512];          /* client certificate and key: both or neither */
    char        key[512];
    /* agent */
    int         max_restarts;       /* worker failures tolerated, 0..1000000 */
    rg_agent_recovery_t recovery;   /* restart (default) or in-place */
    int64_t     monitor_ms;         /* longest sleep without looking, 0.001..3600 s */
    int64_t     grace_ms;           /* SIGTERM to SIGKILL when stopping workers, 0..3600 s */
    double      straggler_factor;   /* in place: a node whose rank computes more than this
                                     * times the others' median for straggler_window_ms is
                                     * asked to leave (train/train_straggler.c); 0 = off, else
                                     * 1.1..1000 */
    int64_t     straggler_window_ms;/* 1..86400 s; 30 s */
    rg_agent_health_t health;       /* --health-check */
    int64_t     hang_ms;            /* a worker of the worker API whose heartbeat (rg_beat.h)
                                     * is older than this is hung: killed, a failure; 0 = off,
                                     * else 0.2..3600 s */
    char        role[64];
    char        log_dir[512];       /* "": a temporary one when redirects or tee need it */
    int         redirects;          /* 0..3 for every local rank (bit 1: stdout, bit 2: stderr
                                     * to files), or -1: per local rank, in redirects_map */
    int         tee;                /* same bits: to files and the console; -1: tee_map */
    unsigned char redirects_map[LAUNCHER_MAX_NPROC]; /* with -1: local rank i's bits */
    unsigned char tee_map[LAUNCHER_MAX_NPROC];
    bool        ranks_filter;       /* --local-ranks-filter given: only the local ranks i with
                                     * ranks_shown[i] reach the console (files get all) */
    unsigned char ranks_shown[LAUNCHER_MAX_NPROC];
    rg_agent_numa_t numa;           /* CPU binding of the local ranks (launcher_numa.c) */
    rg_agent_notice_t notice;       /* preemption notices watched (launcher_notice.c) */
    char        local_addr[256];    /* "" = 127.0.0.1 for a loopback etcd, else the host name */
    bool        no_python;
    bool        module;             /* run argv[0] as a python module */
    char        preload[512];       /* --preload: modules a fork server imports once, comma
                                     * separated; "": workers are fork and exec of PROGRAM */
    /* the program, borrowed for the run: argv[0..argc-1], argc >= 1 */
    int         argc;
    char *const *argv;
    /* the workers' extra environment, borrowed for the run: "NAME=VALUE" entries that replace
     * this process's variables of the same name (torchrun's variables replace these) */
    int          n_env;             /* 0..RG_AGENT_MAX_ENV */
    const char *const *env;
    /* where each value came from, as --print-config shows it: NULL = "default", "flag",
     * "--rdzv-conf", a variable's name, or the caller's field ("rg_scaling_config_t....") */
    const char *from[RG_AGENT_NFIELDS];
} rg_agent_params_t;

/* How the run ended. status is also rg_agent_run's return value. */
typedef struct {
    rg_status_t status;
    int         exit_code;          /* what `regroup` exits with: 0, 1, or 128 + signal */
    int         signal;             /* the signal that stopped the agent, or 0 */
    int         restart_count;      /* failure restarts the job went through */
} rg_agent_result_t;

/* Fills p with the defaults (a job "none" of one node and one worker, no program). */
void rg_agent_params_init(rg_agent_params_t *p);
/* RG_OK, or RG_EINVAL with a message naming the first bad value as its source gave it. */
rg_status_t rg_agent_params_check(const rg_agent_params_t *p) RG_NODISCARD;
/* Every setting, its value and where it came from (`regroup --print-config`). */
void rg_agent_params_print(const rg_agent_params_t *p, FILE *out);
/* "--nproc-per-node=0", "REGROUP_NPROC_PER_NODE=0", ...: field f as its source gave it. */
void rg_agent_params_label(const rg_agent_params_t *p, rg_agent_field_t f, char *buf,
                           size_t len);
/* Local rank i's redirects (tee false) or tee bits, from the value or the per-rank map. */
int  launcher_std_bits(const rg_agent_params_t *p, bool tee, int local_rank);
/* True if some local rank's output goes to files (redirects or tee). */
bool launcher_needs_log_dir(const rg_agent_params_t *p);
/* The etcd client parameters for endpoints with p's TLS files and user (strings borrowed). */
rg_etcd_params_t launcher_etcd_params(const rg_agent_params_t *p, const char *endpoints);

/*
 * Runs the agent until the job ends for this node. Blocks. Returns (and puts in result, which
 * may be NULL):
 *   RG_OK          the job finished (this node's workers succeeded, or it ended without us),
 *                  or this node left it on a preemption notice (--preemption-notice)
 *   RG_EINVAL      p failed rg_agent_params_check; nothing was started
 *   RG_EJOBFAILED  the workers failed more than max_restarts times
 *   RG_ECANCELED   SIGTERM, SIGINT or SIGHUP stopped the agent (result->signal says which);
 *                  the signal is consumed, the workers are stopped
 *   other          etcd or the rendezvous could not start or went away (RG_EUNREACH,
 *                  RG_ETIMEDOUT, RG_EAUTH, ...), or the workers could not be started (RG_ESYS)
 * The message is in rg_last_error(); the agent also prints its report on stderr. While it runs,
 * SIGCHLD, SIGTERM, SIGINT and SIGHUP are blocked in the calling thread (read through a
 * signalfd) and SIGPIPE is ignored; both are restored before it returns.
 */
rg_status_t rg_agent_run(const rg_agent_params_t *p, rg_agent_result_t *result) RG_NODISCARD;

/* ---- the command line ------------------------------------------------------------------ */

/* Fills p from argv (flags) over REGROUP_* variables over defaults; argv strings are borrowed.
 * Returns 0, 1 if help was printed (exit 0), or 2 after printing a one-line error that names
 * the bad option. *print_config is set by --print-config (then no PROGRAM is needed, and the
 * parameters are not checked). */
int  launcher_parse(int argc, char **argv, rg_agent_params_t *p, bool *print_config);
/* Parses one --rdzv-conf value into p (`regroup status` takes the same). 0, or 2 after
 * printing a one-line error naming the bad key. */
int  launcher_parse_rdzv_conf(rg_agent_params_t *p, const char *conf);
/* One argument of a subcommand (`regroup status`, `regroup etcd-grant`) at argv[*i]: its name,
 * '_' read as '-', into name[cap], and into *value what follows its '=', or else for a "--"
 * option other than --help the next argument (*i then moves onto it), or else NULL. Returns 0,
 * or 2 after printing "CMD: ARG: unknown option" for a name that does not fit in name. */
int  launcher_sub_arg(const char *cmd, int argc, char **argv, int *i, char *name, size_t cap,
                      const char **value);
void launcher_usage(FILE *out);
/* Under srun (SLURM_JOB_ID and SLURM_STEP_ID set), fills the settings no flag or REGROUP_*
 * variable gave from Slurm's variables: rdzv_id from SLURM_JOB_ID, nnodes N:N from
 * SLURM_STEP_NUM_NODES, local_addr from SLURMD_NODENAME if it resolves (else a note on
 * stderr). 0 (also when not under srun), or 2 after printing a one-line error naming the
 * variable. launcher_slurm.c says why. */
int  launcher_slurm_defaults(rg_agent_params_t *p);

/* ---- CPU binding (launcher_numa.c) ------------------------------------------------------- */

/* The CPUs each of the nproc local ranks is bound to under p->numa (sets[0..nproc-1]), from
 * this process's affinity and the topology under /sys/devices/system (node/, cpu/). RG_OK, or
 * RG_EINVAL saying why the binding cannot be made (fewer cores than ranks). Call it before
 * forking: it reads files. */
#include <sched.h>
rg_status_t launcher_numa_sets(const rg_agent_params_t *p, cpu_set_t *sets, int nproc)
    RG_NODISCARD;
/* The same from the topology under sys (a copy of /sys/devices/system: node/online,
 * node/node<k>/cpulist, cpu/cpu<c>/topology/{thread_siblings_list,physical_package_id},
 * cpu/cpu<c>/cache/index3/shared_cpu_list) for the CPUs in usable. */
rg_status_t launcher_numa_sets_at(const char *sys, rg_agent_numa_t numa,
                                  const cpu_set_t *usable, cpu_set_t *sets, int nproc)
    RG_NODISCARD;
/* Usable cores (sched_getaffinity), and visible CUDA devices (CUDA_VISIBLE_DEVICES, else the
 * entries of /proc/driver/nvidia/gpus; no CUDA runtime): --nproc-per-node=cpu|gpu|auto. */
int launcher_usable_cpus(void);
int launcher_visible_gpus(void);

/* ---- c10d (launcher_c10d.c) ------------------------------------------------------------ */

/* Splits a c10d endpoint, [http://]HOST[:PORT] or [http://][ADDR6][:PORT], into host (no
 * brackets) and port (RG_AGENT_C10D_PORT when none). False, with why, if it is not one. */
bool launcher_c10d_split(const char *endpoint, char *host, size_t cap, int *port,
                         const char **why);
/* (serving it: launcher_c10d.h) */

/* ---- workers ------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    int   local_rank;
    int   rank;
    int   out_fd;               /* pipes from the worker, -1 once closed */
    int   err_fd;
    bool  running;
    int   wstatus;
    FILE *out_log;
    FILE *err_log;
    char  out_line[4096];
    size_t out_len;
    char  err_line[4096];
    size_t err_len;
    char  tail[10][256];        /* last stderr lines, a ring */
    int   tail_next;
    int   tail_count;
    char  error_file[512];
    bool  bind;                 /* --numa-binding: sched_setaffinity(cpus) before exec */
    cpu_set_t cpus;
    int64_t  stale_ms;          /* hang check: when its beat was first seen stale, or 0 */
    uint64_t stale_cpu;         /* the beating process's CPU ticks then */
} launcher_worker_t;

/* A Python PROGRAM as a fork server runs it: `python3 -u SCRIPT.py`, `python3 -u -m MOD`, or
 * with --no-python `PYTHON [-u -B -s -E] SCRIPT|-m MOD`; then cfg->argv[first_arg..]. */
typedef struct {
    const char *interp;
    const char *flags[4];
    int         n_flags;
    bool        module;
    const char *target;         /* the script or the module */
    int         first_arg;
} launcher_pycmd_t;

/* The fork server of --preload (launcher_fork.c). */
typedef struct {
    launcher_pycmd_t cmd;       /* the PROGRAM it runs (its strings are cfg->argv's) */
    pid_t pid;                  /* 0: none (or gone: workers start by exec) */
    int   sock;                 /* the agent's end of its socket, -1: none */
    bool  ready;                /* it said it imported the modules */
    char  error[1024];          /* why it could not, once known: what each start says */
    int   prev_subreaper;       /* PR_GET_CHILD_SUBREAPER before it started */
    bool  subreaper_set;
} launcher_fork_t;

rg_status_t launcher_python_cmd(const rg_agent_params_t *p, launcher_pycmd_t *c);
/* RG_OK, or RG_EINVAL saying why p->preload or the program does not go together. */
rg_status_t launcher_preload_check(const rg_agent_params_t *p);
/* Starts the server (from the agent's main thread: its workers become that thread's
 * children) with envp, the workers' common environment, and makes the agent a child
 * subreaper; it imports cfg->preload while the agent goes on. */
rg_status_t launcher_fork_start(launcher_fork_t *f, const rg_agent_params_t *cfg,
                                char **envp, const sigset_t *child_mask);
bool        launcher_fork_usable(const launcher_fork_t *f);
/* Forks a worker with envp, mask and cpus (NULL: any); fds: its stdout, stderr and start
 * pipe write ends, then n_keep descriptors it gets at targets[i]. RG_OK and *pid (the
 * agent's child by the time the start pipe says so); RG_EINVAL when the modules cannot be
 * imported (the job's error); RG_EAGAIN: start it by exec instead. */
rg_status_t launcher_fork_spawn(launcher_fork_t *f, const rg_agent_params_t *cfg, char **envp,
                                const sigset_t *mask, const cpu_set_t *cpus, const int *fds,
                                const int *targets, int n_keep, pid_t *pid);
/* True if pid (reaped with status) was the server. */
bool        launcher_fork_reaped(launcher_fork_t *f, pid_t pid, int status);
void        launcher_fork_stop(launcher_fork_t *f);

typedef struct {
    launcher_worker_t w[LAUNCHER_MAX_NPROC];
    int               n;
    int               running;
    launcher_fork_t   fork;
    char              run_dir[256]; /* per-agent temp dir: error files */
} launcher_workers_t;

typedef struct {
    const rg_agent_params_t    *cfg;
    const rg_rdzv_assignment_t *asg;
    const char                 *endpoints;
    const char                 *local_addr;   /* resolved */
    const char                 *log_dir;      /* cfg's, or the temporary one; "" for none */
    int                         notice_fd;    /* the agent's notice page, inherited by each
                                                 worker as $REGROUP_NOTICE_FD; -1: none */
    int                         beat_fd;      /* the workers' heartbeat page
                                                 ($REGROUP_BEAT_FD); -1: none */
    const char                 *agent;        /* this agent's id and the lease of its */
    int64_t                     lease;        /* membership: $REGROUP_AGENT_ID and
                                                 $REGROUP_AGENT_LEASE, what the workers fence
                                                 their writes with (rdzv_fence.h); NULL: none */
    int                         pipe_fd;      /* in place: the write end of the agent's pipe,
                                                 $REGROUP_AGENT_PIPE_FD; -1: none */
    bool                        join;         /* a newcomer: $REGROUP_INPLACE_JOIN=1 */
    bool                        replacement;  /*   of a dead worker (not of a node that
                                               *   joins): $REGROUP_INPLACE_REPLACEMENT=1 */
    const int                  *table_fds;    /* in place: the node copies, one per local
                                                 rank, inherited by each worker
                                                 ($REGROUP_TABLE_FDS, rg_notice.h); NULL */
    int                         n_table_fds;
} launcher_spawn_t;

/* Hang detection (launcher_hang.c): the tick the agent needs to find a hang in time, and
 * the check: kills the running workers that are hung (the reaping then reports them),
 * returning how many. Hung: a heartbeat older than cfg->hang_ms, and the beating process
 * stopped (SIGSTOP, a tracer) or without CPU time for another cfg->hang_ms (frozen); a
 * process that still gets CPU time is only slow (a loaded machine starves its beat). */
int64_t launcher_hang_tick_ms(const rg_agent_params_t *cfg, int64_t tick_ms);
int     launcher_hang_check(launcher_workers_t *ws, const rg_beat_host_t *beat,
                            const rg_agent_params_t *cfg);

rg_status_t launcher_workers_start(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                   const sigset_t *child_mask);
/* Starts worker i again (a replacement, in place), with sp's round in its environment. */
rg_status_t launcher_workers_respawn(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                     const sigset_t *child_mask, int i);
/* Starts the fork server when cfg->preload names modules (else nothing). */
rg_status_t launcher_workers_fork_start(launcher_workers_t *ws, const rg_agent_params_t *cfg,
                                        const sigset_t *child_mask);
/* Reaps exited workers. Sets *failed to the index of the first worker that failed (or -1),
 * and returns the number still running. */
int  launcher_workers_reap(launcher_workers_t *ws, int *failed);
/* Reads what a worker wrote on fd (one of its pipes). */
void launcher_workers_pump(launcher_workers_t *ws, int fd, const rg_agent_params_t *cfg);
/* Reaps workers as they exit, for up to ms; returns the number still running. */
int  launcher_workers_wait(launcher_workers_t *ws, int64_t ms);
/* SIGTERM to every worker's process group, up to grace_ms for them to exit, then SIGKILL;
 * reaps them all. */
void launcher_workers_stop(launcher_workers_t *ws, int64_t grace_ms, int sig,
                           const rg_agent_params_t *cfg);
/* Reads what worker i left in its pipes (after it exited). */
void launcher_workers_drain(launcher_workers_t *ws, int i, const rg_agent_params_t *cfg);
/* Fills a failure record for worker i (error file and stderr tail). */
void launcher_workers_failure(launcher_workers_t *ws, int i, rg_rdzv_failure_t *f,
                              char *err_buf, size_t err_len, char *tail_buf, size_t tail_len);

/* ---- in-place recovery (launcher_inplace.c) --------------------------------------------- */

/* What an in-place agent knows about each of its workers. */
typedef enum {
    INPLACE_IN_ROUND,       /* a member of the running round */
    INPLACE_PENDING,        /* a replacement that is starting (not in any round yet) */
    INPLACE_READY,          /* a replacement that said it is ready: in the next round */
    INPLACE_EXITED,         /* exited 0 */
    INPLACE_DUE,            /* failed: its replacement starts once the others have their
                               next round (forking it first delayed that round by up to
                               55 ms under load: a fork of a Python fork server) */
} launcher_inplace_state_t;

typedef struct {
    bool  enabled;                          /* --recovery=in-place */
    int   pipe_r;                           /* the agent's end of the workers' pipe */
    int   pipe_w;                           /* the end every worker inherits */
    launcher_inplace_state_t state[LAUNCHER_MAX_NPROC];
    bool  capable[LAUNCHER_MAX_NPROC];      /* the worker said it regroups in place */
    bool  joined[LAUNCHER_MAX_NPROC];       /* it is in the group of the round assigned */
    bool  fresh[LAUNCHER_MAX_NPROC];        /* a replacement or newcomer that has been in no
                                               group yet: it holds no state */
    uint64_t assigned_ns;                   /* when the page's assignment was written */
    bool  restart_asked;                    /* a worker said in-place recovery failed */
    bool  ready_seen;                       /* a replacement became ready */
    bool  regroup_asked;                    /* a worker's group failed with no member lost:
                                               it asked for the next round */
    bool  dropped;                          /* a worker said RG_NOTICE_MSG_LEFT_OUT: this
                                               agent is no longer a member of the job (its
                                               lease ran out), and a worker's failure then
                                               is no reason to restart the others */
    int   unfit_lr;                         /* the local rank that said its node should
                                               leave (RG_NOTICE_MSG_STRAGGLER or
                                               RG_NOTICE_MSG_HEALTH), or -1 */
    int   unfit_msg;                        /*   which of the two */
    int   cut_lr;                           /* the local rank that said its regroup reached
                                               no other node (RG_NOTICE_MSG_CUT_OFF), or -1 */
    rg_status_t error;                      /* why launcher_inplace_rejoin failed */
    int64_t term_end_ms;                    /* SIGTERM came while this node rejoined: it
                                               leaves once in the round (its workers take
                                               their last checkpoint there), by this time
                                               (rg_notice_now_ms); 0: none */
    int   table_fd[LAUNCHER_MAX_NPROC];     /* the node copies of the workers' sharded
                                               tables (RG_TABLE_ENV), one per local rank */
    int   n_table;
} launcher_inplace_t;

rg_status_t launcher_inplace_open(launcher_inplace_t *ip, const rg_agent_params_t *cfg);
void        launcher_inplace_close(launcher_inplace_t *ip);
/* A fresh set of workers started: every one is in the round, none has said anything. */
void        launcher_inplace_reset(launcher_inplace_t *ip, int nproc);
/* Reads the workers' messages (non-blocking). */
void        launcher_inplace_read(launcher_inplace_t *ip, const launcher_workers_t *ws);
/* Whether every live worker of this node said it regroups in place, a replacement still
 * starting aside (else: why, for the warning that the job recovers by restarting). */
bool        launcher_inplace_capable(const launcher_inplace_t *ip, const launcher_workers_t *ws,
                                     char *why, size_t len);
/* Whether every live member of the round assigned is in its group (or they had
 * LAUNCHER_INPLACE_SETTLE_MS to get there): the agent opens no newer round before, so that no
 * worker skips the round its peers are building. */
#define LAUNCHER_INPLACE_SETTLE_MS 5000
bool        launcher_inplace_settled(const launcher_inplace_t *ip, const launcher_workers_t *ws);
/* Workers that take part in the next round: live, and in the round or ready. */
int         launcher_inplace_members(const launcher_inplace_t *ip, const launcher_workers_t *ws);
/* Whether some worker of this node finished (exited 0) and every one still running is a
 * replacement or newcomer that has been in no group yet: the training is over, and they
 * hold nothing and have no state to receive. */
bool        launcher_inplace_only_fresh(const launcher_inplace_t *ip,
                                        const launcher_workers_t *ws);
/* Whether a running worker of this node has been in a group (no fresh newcomer). */
bool        launcher_inplace_any_grouped(const launcher_inplace_t *ip,
                                         const launcher_workers_t *ws);
/* The running workers in the current round only (not a ready replacement waiting for the
 * next). */
int         launcher_inplace_in_round(const launcher_inplace_t *ip, const launcher_workers_t *ws);

/* Puts this node's ranks in asg (a round it joined in place) into the page and the worker
 * table: ready replacements become members. lease: the agent's in that round, which its
 * workers fence their writes with from then on (the one in their environment is the
 * agent's when they started: it changes when the agent joins with a new one). */
void        launcher_inplace_assign(launcher_inplace_t *ip, launcher_workers_t *ws,
                                    rg_notice_host_t *notice, const rg_rdzv_assignment_t *asg,
                                    int64_t lease);

typedef struct {
    const rg_agent_params_t *cfg;
    rg_rdzv_t               *rdzv;
    int                      sigfd;
    launcher_workers_t      *ws;
    rg_notice_host_t        *notice;
    launcher_inplace_t      *ip;
    const rg_beat_host_t    *beat;   /* the hang check runs while the agent joins, too */
} launcher_inplace_env_t;

typedef enum {
    INPLACE_JOINED,         /* *asg is the round joined; the workers keep running */
    INPLACE_RESTART,        /* in-place recovery cannot go on: restart the job */
    INPLACE_STOPPED,        /* a signal: *stop_signal */
    INPLACE_ERROR,          /* the join failed (rg_last_error(), printed) */
} launcher_inplace_end_t;

/* A node that finds its in-place job running without it (rg_rdzv_set_join_running): starts
 * its workers as newcomers ($REGROUP_INPLACE_JOIN=1, in no round; sp->join) and waits, up to
 * the join timeout, until every one said it is ready, so that the running members never wait
 * for them to start. INPLACE_JOINED: all ready (the caller joins the next round with them,
 * launcher_inplace_rejoin); INPLACE_STOPPED: a stop signal (*stop_signal); INPLACE_RESTART:
 * one ended, asked for a restart, or the timeout passed (the caller stops them and joins as a
 * node of a restart-mode job would); INPLACE_ERROR: they could not start. */
launcher_inplace_end_t launcher_inplace_newcomers(const launcher_inplace_env_t *e,
                                                  const launcher_spawn_t *sp,
                                                  const sigset_t *child_mask, int *stop_signal);
/* Opens the next round and joins it with this node's members (launcher_inplace_members)
 * while the workers live: heartbeats, output, messages and reaping go on. Bounded by the
 * join timeout. */
launcher_inplace_end_t launcher_inplace_rejoin(const launcher_inplace_env_t *e,
                                               rg_rdzv_assignment_t *asg, int *stop_signal);

/* ---- commands ------------------------------------------------------------------------ */

int launcher_status_main(int argc, char **argv);
/* `regroup etcd-grant` (launcher_grant.c). */
int launcher_grant_main(int argc, char **argv);
/* Reads a password from path, a regular file of one line (its newline dropped) that other
 * users may neither read nor write, into buf[cap]. 0, or 2 after printing a one-line error
 * naming what (the option) and the file. */
int launcher_read_secret(const char *path, const char *what, char *buf, size_t cap);

#endif
