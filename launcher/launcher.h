/*
 * The `regroup` command: one agent per node, torchrun's options and worker environment.
 *
 * launcher_opts.c  parses the command line (dashed and underscored spellings) into a const
 *                  launcher_config_t; flags over REGROUP_* environment over defaults.
 * launcher_workers.c starts, watches, pumps the output of and stops the worker processes.
 * launcher_agent.c the agent: rendezvous, run a round, react to failures and signals.
 * launcher_status.c `regroup status`.
 */
#ifndef REGROUP_LAUNCHER_H
#define REGROUP_LAUNCHER_H

#include "rg_common.h"

#include <regroup/rdzv.h>

#include <stdio.h>
#include <sys/types.h>

#define LAUNCHER_MAX_NPROC 256

typedef struct {
    /* rendezvous */
    int         min_nodes;
    int         max_nodes;
    int         nproc;
    char        endpoint[1024];
    char        job[80];
    bool        standalone;
    int64_t     last_call_ms;
    int64_t     join_timeout_ms;
    int64_t     lease_ttl_s;
    char        user[128];
    char        password[128];
    char        cacert[512];
    char        cert[512];
    char        key[512];
    /* agent */
    int         max_restarts;
    int64_t     monitor_ms;
    int64_t     grace_ms;           /* SIGTERM to SIGKILL when stopping workers */
    char        role[64];
    char        log_dir[512];
    int         redirects;          /* bit 1: stdout, bit 2: stderr to files */
    int         tee;                /* same bits: to files and the console */
    char        local_addr[256];
    bool        no_python;
    bool        module;             /* -m: run PROGRAM as a python module */
    bool        print_config;
    /* the program */
    int         argc;
    char      **argv;
} launcher_config_t;

/* Parses argv. Returns 0, 1 if help was printed (exit 0), or 2 after printing a one-line
 * error that names the bad option. */
int  launcher_parse(int argc, char **argv, launcher_config_t *cfg);
/* Parses one --rdzv-conf value into cfg (`regroup status` takes the same). 0, or 2 after
 * printing a one-line error naming the bad key. */
int  launcher_parse_rdzv_conf(launcher_config_t *cfg, const char *conf);
/* The etcd client parameters for endpoints with cfg's TLS files and user (strings borrowed
 * from cfg). */
rg_etcd_params_t launcher_etcd_params(const launcher_config_t *cfg, const char *endpoints);
void launcher_usage(FILE *out);
void launcher_print_config(const launcher_config_t *cfg, FILE *out);

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
} launcher_worker_t;

typedef struct {
    launcher_worker_t w[LAUNCHER_MAX_NPROC];
    int               n;
    int               running;
    char              run_dir[256]; /* per-agent temp dir: error files */
} launcher_workers_t;

typedef struct {
    const launcher_config_t    *cfg;
    const rg_rdzv_assignment_t *asg;
    const char                 *endpoints;
} launcher_spawn_t;

rg_status_t launcher_workers_start(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                   const sigset_t *child_mask);
/* Reaps exited workers. Sets *failed to the index of the first worker that failed (or -1),
 * and returns the number still running. */
int  launcher_workers_reap(launcher_workers_t *ws, int *failed);
/* Reads what a worker wrote on fd (one of its pipes). */
void launcher_workers_pump(launcher_workers_t *ws, int fd, const launcher_config_t *cfg);
/* SIGTERM to every worker's process group, up to grace_ms for them to exit, then SIGKILL;
 * reaps them all. */
void launcher_workers_stop(launcher_workers_t *ws, int64_t grace_ms, int sig,
                           const launcher_config_t *cfg);
/* Reads what worker i left in its pipes (after it exited). */
void launcher_workers_drain(launcher_workers_t *ws, int i, const launcher_config_t *cfg);
/* Fills a failure record for worker i (error file and stderr tail). */
void launcher_workers_failure(launcher_workers_t *ws, int i, rg_rdzv_failure_t *f,
                              char *err_buf, size_t err_len, char *tail_buf, size_t tail_len);

/* ---- commands ------------------------------------------------------------------------ */

int launcher_agent_main(const launcher_config_t *cfg);
int launcher_status_main(int argc, char **argv);

#endif
