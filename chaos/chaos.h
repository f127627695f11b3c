/*
 * rg-chaos, the chaos suite's runner: its private parts.
 *
 * A run is one chaos_t, made by main and handed to every part; the parts share nothing else
 * (but the one pointer a signal handler needs, in chaos_main.c). In the order a run uses them:
 *   chaos_opts.c      the command line, parsed once into a chaos_opts_t that nothing changes
 *   chaos_netns.c     the network namespaces, the bridge and the veth pairs (partition faults:
 *                     the whole link, or routes to etcd alone or to the peers alone)
 *   chaos_procs.c     etcd and the agents: started, tracked by pid, stopped by pid; workers
 *   chaos_jobstate.c  every read of the job's keys in etcd: the one file that knows them
 *   chaos_faults.c    the seeded schedule and the injection of each kind of fault
 *   chaos_cycle.c     one fault at a time: wait for progress, inject, time the recovery
 *   chaos_check.c     the invariants, and the verdict, computed once from them
 *   chaos_report.c    the table, the JSON report, and chaos_say (the runner's log lines)
 *   chaos_main.c      the run dir, the checkpoint tmpfs, the environment, the sequence
 * The fault cycle only records what happened (chaos_fault_rec_t, chaos_t.faults.stalled);
 * chaos_check.c alone judges it. Everything here is single-threaded.
 */
#ifndef REGROUP_CHAOS_H
#define REGROUP_CHAOS_H

#include "etcd_server.h"
#include "rdzv_keys.h"
#include "rg_common.h"

#include <regroup/etcd.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CHAOS_MAX_NODES      8
#define CHAOS_MAX_FAULTS     2000
#define CHAOS_RECOVERY_MAX_MS 60000
/* Agents live in slots, reused once an agent has ended and been reaped (a long soak starts
 * far more agents than ever run at once); each agent started gets a new id, which names its
 * log, its network namespace and its address. */
#define CHAOS_MAX_SLOTS      (CHAOS_MAX_NODES * 4)
/* The job's id (--rdzv-id): its keys are under /regroup/chaos/ (see chaos_jobstate.c). */
#define CHAOS_JOB_ID         "chaos"
/* The agents' lease TTL, last-call timeout and the workers' hang timeout (the launcher's
 * default), in seconds: chaos_procs.c passes the first two; the recovery bounds build on all
 * three (chaos_check.c). */
#define CHAOS_LEASE_TTL_S      2
#define CHAOS_LAST_CALL_S      0.5
#define CHAOS_HANG_TIMEOUT_S   1.0
/* The workers' collective deadline (REGROUP_COMM_TIMEOUT_MS): a peer-only partition is seen
 * when it passes, and a lease TTL is what every other lasting fault takes to be seen. */
#define CHAOS_COMM_TIMEOUT_MS  2000
/* In place, the agents' --rdzv-conf=straggler_factor,straggler_window (F_STRAGGLER), and the
 * throttle of a straggler: it runs CHAOS_STRAGGLER_RUN_MS of every CHAOS_STRAGGLER_CYCLE_MS. */
#define CHAOS_STRAGGLER_FACTOR   2
#define CHAOS_STRAGGLER_WINDOW_S 3
#define CHAOS_STRAGGLER_RUN_MS   25
#define CHAOS_STRAGGLER_CYCLE_MS 100
/* The recovery bounds of a fault kind, before --bound-scale: p99 at most the lease TTL +
 * CHAOS_BOUND_P99_OVER_TTL_S; p50 at most the time the fault takes to be seen by design (a
 * lease to expire, a hang timeout) + CHAOS_BOUND_P50_AFTER_S, or CHAOS_BOUND_P50_AT_ONCE_S
 * for a fault seen at once. The p50 is judged only of a kind with CHAOS_BOUND_P50_MIN
 * recoveries or more (the median of fewer is one fault's luck). */
#define CHAOS_BOUND_P99_OVER_TTL_S 1.0
#define CHAOS_BOUND_P50_AFTER_S    0.5
#define CHAOS_BOUND_P50_AT_ONCE_S  0.3
#define CHAOS_BOUND_P50_MIN        5

typedef enum {
    F_WORKER_KILL, F_WORKER_HANG, F_AGENT_KILL, F_PREEMPT, F_NODE_JOIN, F_ETCD_MEMBER,
    F_ETCD_LEADER, F_PARTITION, F_CKPT_KILL, F_CORRUPT, F_DISK_FULL,
    F_AGENT_HANG,       /* an agent stopped (SIGSTOP) past its lease TTL, then SIGCONT */
    F_ETCD_PARTITION,   /* a node reaches its peers and the checkpoint dir, not etcd */
    F_PEER_PARTITION,   /* a node reaches etcd, not its peers */
    F_ETCD_SILENT,      /* an etcd member alive but silent (SIGSTOP), then SIGCONT */
    F_STRAGGLER,        /* a worker throttled to a quarter of a core (SIGCONT, SIGSTOP in a
                         * 100 ms cycle); in place, --scenario straggler only: its node
                         * must leave the job */
    F_COUNT
} chaos_fault_t;

/* The names of the fault kinds (--scenario, the report), in chaos_fault_t order. */
extern const char *const chaos_fault_names[F_COUNT];

/* The command line; filled once by chaos_opts_parse, read-only after. */
typedef struct {
    uint64_t    seed;
    int         faults;
    double      duration_s;   /* 0: run until `faults` faults */
    double      deadline_s;   /* the whole run's time bound */
    int         nodes;        /* MAX of nnodes=MIN:MAX */
    int         min_nodes;    /* MIN */
    const char *scenario;     /* "all" or one of chaos_fault_names */
    const char *report;       /* JSON report path, or NULL */
    bool        quick;
    const char *recovery;     /* --recovery: "restart" (default) or "in-place" */
    const char *regroup;      /* the binaries (RG_CHAOS_REGROUP, _EXACT, _FMNIST) */
    const char *exact;
    const char *fmnist;
    bool        use_fmnist;   /* --workload fmnist */
    double      bound_scale;  /* --bound-scale: the recovery bounds times this (default 1) */
} chaos_opts_t;

/* One fault injected, and what followed. */
typedef struct {
    chaos_fault_t kind;
    double  t_inject;
    double  recovery_s;      /* -1: did not recover */
    int     round_before;
    int64_t committed;       /* newest committed step when the fault struck */
    int64_t step_before;     /* last reported step when the fault struck */
    int64_t resumed;         /* step the next round restored, -1 if none */
    char    target[64];
    pid_t   agent_pid;       /* agent-kill, preempt, partition: the agent hit */
    double  rejoin_s;        /* partition: from the link coming back to the node in a round */
    double  heal_at;         /* a lasting fault: when it ends (rg_wall_s) */
    int     members_before;  /* peer-partition: members of the round it struck */
    bool    was_member;      /* a fault that takes a node: that node was in the round */
    bool    lost_work;
} chaos_fault_rec_t;

/* The job's last progress report. */
typedef struct {
    int     round;
    int64_t step;
    double  time;
} chaos_progress_t;

/* A fault kind's recoveries and their bounds (chaos_check_verdict). */
typedef struct {
    int    count;            /* injected */
    int    recovered;
    double p50_s, p99_s;     /* of the recovered; -1 if none */
    double p50_bound_s, p99_bound_s;
    bool   p50_judged;       /* recovered >= CHAOS_BOUND_P50_MIN */
    bool   within;           /* p99 (and p50 where judged) within the bounds */
} chaos_kind_stats_t;

typedef struct {
    bool finished;
    bool result;             /* exact: the final state is exactly right; fmnist: accuracy */
    bool checkpoints_verify;
    bool no_lost_work;
    bool no_leaks;
    bool no_stale_writes;    /* etcd's history holds no write of a stale member */
    bool time_bound;
    bool recovered;
    bool within_bounds;      /* every kind's recovery times within its bounds */
    bool kept_in_place;      /* in place: no node that came back (partition, agent-hang,
                              * etcd-partition) made the job restart from a checkpoint */
    bool cut_left_out;       /* in place: every peer-partition of a member in a round of
                              * three or more recovered before the link came back (the
                              * cut-off node left the round) */
    bool pass;               /* all of the above: computed once, by chaos_check_verdict */
    char result_line[256];
    int  verified;
    int  leaks;
    int  history_checked;    /* the writes no_stale_writes looked at */
    double wall_s;
    chaos_kind_stats_t kind[F_COUNT];
} chaos_inv_t;

typedef struct {
    const chaos_opts_t *opt;

    struct {                 /* chaos_main.c */
        char   dir[256];     /* the run dir: logs, checkpoints, the stop file */
        char   ckpt_dir[300];
        char   stop_file[300];
        bool   tmpfs_mounted;
        double t_start;
    } run;

    struct {                 /* chaos_netns.c */
        bool on;             /* the runner, etcd and every agent are in namespaces */
        char ns_path[CHAOS_MAX_SLOTS][96];
        struct {
            bool   on;
            int    slot;
            double heal_at;
            double healed_at;
        } cut;
    } net;

    struct {                 /* chaos_procs.c */
        rg_etcd_server_t etcd;
        pid_t pid[CHAOS_MAX_SLOTS];
        int   id[CHAOS_MAX_SLOTS];
        bool  alive[CHAOS_MAX_SLOTS];
        int   n_slots;
        int   n_started;
    } procs;

    struct {                 /* chaos_jobstate.c */
        rg_etcd_t            *cli;
        rg_etcd_params_t      params;
        rdzv_keys_t           keys;    /* the job's key layout (rendezvous/rdzv_keys.h) */
        rg_rdzv_assignment_t *closed;  /* scratch for a decoded closed record (~90 KiB) */
    } job;

    struct {                 /* chaos_faults.c, chaos_cycle.c */
        uint64_t rng;
        int      order[F_COUNT];   /* quick mode's first walk through every kind */
        int      next;             /* -1 until the order is drawn */
        chaos_fault_rec_t rec[CHAOS_MAX_FAULTS];
        int      n_recs;
        int64_t  corrupted[CHAOS_MAX_FAULTS];   /* steps corrupted on purpose */
        int      n_corrupted;
        bool     stalled;          /* the job stopped making progress: no more faults */
        struct {                   /* a fault that lasts a while (agent-hang, etcd-partition,
                                    * peer-partition, etcd-silent, straggler), ended by
                                    * chaos_fault_heal */
            bool          on;
            chaos_fault_t kind;
            int           slot;    /* the agent's slot, or the etcd member */
            double        heal_at;
            double        healed_at;
            pid_t         worker;  /* straggler: the worker throttled, */
            bool          stopped; /*   whether it is stopped now, */
            uint64_t      toggle_ns; /* and when that changes next */
        } hold;
    } faults;

    chaos_inv_t inv;         /* chaos_check.c */
} chaos_t;

/* chaos_opts.c: parses argv (and RG_CHAOS_* from the environment) into *o. Returns -1 to go
 * on, or the exit status (0 for --help, 2 for a usage error, with the usage printed). */
int chaos_opts_parse(int argc, char **argv, chaos_opts_t *o);

/* chaos_netns.c */
bool chaos_net_setup(chaos_t *c);            /* the runner's namespace and bridge */
const char *chaos_net_etcd_host(const chaos_t *c);   /* NULL outside namespaces */
void chaos_net_node_addr(int id, char *out, size_t len);
bool chaos_net_node_make(chaos_t *c, int slot);
const char *chaos_net_node_name(const chaos_t *c, int slot);
bool chaos_net_cut(chaos_t *c, int slot, int hold_s);
/* Blackhole routes in slot's namespace: to etcd alone (etcd true) or to every peer but etcd
 * (etcd false); add or remove them. */
bool chaos_net_routes(chaos_t *c, int slot, bool etcd, bool add);
void chaos_net_heal(chaos_t *c, bool now);   /* ends a partition once due (or now) */
void chaos_net_cleanup(chaos_t *c);          /* async-signal-safe */

/* chaos_procs.c */
bool chaos_etcd_start(chaos_t *c);
void chaos_etcd_stop(chaos_t *c);
void chaos_etcd_kill(chaos_t *c, int member);
void chaos_etcd_signal(chaos_t *c, int member, int sig);   /* SIGSTOP / SIGCONT, no reaping */
void chaos_etcd_restart_dead(chaos_t *c);
int  chaos_etcd_leader(const chaos_t *c);    /* the leader's member index, or -1 */
void chaos_agent_start(chaos_t *c);          /* in the first free slot (none: said, skipped) */
int  chaos_agents_alive(const chaos_t *c);
int  chaos_agents_reap(chaos_t *c);          /* returns how many exited badly */
void chaos_agent_wait_gone(chaos_t *c, pid_t pid);   /* blocks up to 30 s */
void chaos_agents_finish(chaos_t *c);        /* the stop file; waits up to 120 s for the job */
void chaos_agents_kill(chaos_t *c);          /* SIGKILLs and reaps the agents still alive */
void chaos_agent_logs_tail(const chaos_t *c); /* every agent's log's last lines, to stderr */
int  chaos_workers_find(const chaos_t *c, pid_t *out, int max);
int  chaos_leftover_processes(const chaos_t *c, pid_t *out, int max);

/* chaos_jobstate.c: the job's keys in etcd (the list is at the top of that file). */
bool chaos_job_open(chaos_t *c);
void chaos_job_close(chaos_t *c);
bool chaos_job_progress(chaos_t *c, chaos_progress_t *p);
int64_t chaos_job_committed_step(chaos_t *c);
bool chaos_job_restored(chaos_t *c, int *round, int64_t *step);
int64_t chaos_job_failure_count(chaos_t *c);
bool chaos_job_agent_in_round(chaos_t *c, int round, pid_t agent_pid);
/* Reads etcd's history of the job's keys (a watch from revision 1) and counts the writes
 * made for a round the job had left when etcd accepted them: progress, restored records,
 * failure markers, done records. *checked: the writes looked at; -1 if the history cannot be
 * read (compacted, no answer), with the reason said. */
int chaos_job_stale_writes(chaos_t *c, int *checked);
void chaos_job_print_state(chaos_t *c, FILE *out);

/* chaos_faults.c */
void chaos_faults_init(chaos_t *c);
bool chaos_fault_enabled(const chaos_t *c, chaos_fault_t k);
bool chaos_fault_ends_round(chaos_fault_t k);
bool chaos_fault_takes_node(chaos_fault_t k);
chaos_fault_t chaos_fault_choose(chaos_t *c);
/* Whether every enabled kind has been chosen once (the walk that opens every run). */
bool          chaos_fault_walk_done(const chaos_t *c);
/* Injects a fault of kind r->kind; fills r->target (and r->agent_pid for a node fault). */
void chaos_fault_inject(chaos_t *c, chaos_fault_rec_t *r);
/* Whether the kind needs the network namespaces, and whether it holds a node out for a while
 * and then lets it back (partition, agent-hang, etcd-partition). */
bool chaos_fault_needs_net(chaos_fault_t k);
bool chaos_fault_node_returns(chaos_fault_t k);
/* Ends a lasting fault once due (or now); partitions of the whole link too. Drives a
 * straggler's throttle while it lasts (the waits call it every few ms). */
void chaos_fault_heal(chaos_t *c, bool now);
double chaos_fault_heal_at(const chaos_t *c);     /* when the lasting fault ends; 0: none */
double chaos_fault_healed_at(const chaos_t *c);   /* when the last one ended */

/* chaos_cycle.c */
/* Waits until the job reports progress newer than `after` (wall time) in a round of at
 * least min_round; false on timeout, or once every agent has ended. */
bool chaos_wait_progress(chaos_t *c, double after, int min_round, int timeout_ms,
                         chaos_progress_t *out);
void chaos_cycle_run(chaos_t *c);            /* injects the faults, one at a time */

/* chaos_check.c, in this order: the result before the agents are killed, the leaks once
 * etcd is stopped, the verdict last. */
void chaos_check_result(chaos_t *c);
void chaos_check_checkpoints(chaos_t *c);
void chaos_check_leaks(chaos_t *c);
void chaos_check_history(chaos_t *c);
void chaos_check_verdict(chaos_t *c);
/* The p99 recovery bound of kind k, --bound-scale applied (chaos.h's CHAOS_BOUND_*). */
double chaos_p99_bound_s(const chaos_t *c, chaos_fault_t k);

/* chaos_report.c */
void chaos_say(const char *fmt, ...) RG_PRINTF(1, 2);
void chaos_report_write(const chaos_t *c);

#endif
