/*
 * The notice page: what an agent tells the workers of its node, without a system call on
 * the workers' side.
 *
 * One page per agent, in a memfd (no name in /dev/shm, so nothing is left behind however the
 * agent ends). The agent maps it read-write and is its only writer; each worker inherits the
 * descriptor (REGROUP_NOTICE_FD names it), maps it read-only and closes it. Two things live
 * there:
 *
 *   - the agent's heartbeat: CLOCK_MONOTONIC milliseconds (the same clock in every process
 *     of a machine), renewed by the agent while it is a live member of the job (its lease is
 *     alive). A worker that finds it older than lease_ttl_ms knows its agent is stopped, hung
 *     or cut from etcd: the job has regrouped or will regroup without it.
 *   - the current notice: a kind, the time by which the workers must have acted on it
 *     (deadline_ms on the same clock, 0 = none), the round it is about, and a reason for the
 *     log. The agent writes the fields, then increments seq (release); a reader loads seq
 *     (acquire), the fields, then seq again, and retries if it moved (a seqlock, bounded).
 *
 * The page carries facts, never decisions: what a worker does on a notice is the worker API's
 * business (rg_report and rg_train_notice in <regroup/train.h>).
 */
#ifndef REGROUP_NOTICE_H
#define REGROUP_NOTICE_H

#include "rg_common.h"

#include <stdatomic.h>

#define RG_NOTICE_ENV     "REGROUP_NOTICE_FD"
#define RG_NOTICE_MAGIC   0x52474e54u   /* "RGNT" */
#define RG_NOTICE_VERSION 3u
#define RG_NOTICE_REASON_MAX 128
#define RG_NOTICE_MAX_LOCAL  256          /* local ranks an assignment covers */
/* In an in-place job (`--recovery=in-place`): the write end of the agent's pipe, which every
 * worker inherits (the worker -> agent direction: see rg_notice_msg_send), and the variable
 * that tells a replacement worker it is not in the round it was started in yet. */
#define RG_NOTICE_PIPE_ENV   "REGROUP_AGENT_PIPE_FD"
#define RG_NOTICE_JOIN_ENV   "REGROUP_INPLACE_JOIN"
/* With it, how long the agent may take to let the newcomer in, in ms (twice its join timeout:
 * until its newcomers are ready, then the join; a node at the job's maximum size waits for
 * room within that), which bounds the newcomer's wait for its first round. */
#define RG_NOTICE_JOIN_MS_ENV "REGROUP_INPLACE_JOIN_TIMEOUT_MS"
/* --rdzv-conf=straggler_factor,straggler_window, to the workers (train/train_straggler.c):
 * the factor and window a rank is named by, and "1" when a straggler's node is to leave. */
#define RG_STRAGGLER_FACTOR_ENV "REGROUP_STRAGGLER_FACTOR"
#define RG_STRAGGLER_WINDOW_ENV "REGROUP_STRAGGLER_WINDOW_MS"
#define RG_STRAGGLER_EVICT_ENV  "REGROUP_STRAGGLER_EVICT"
/* In place: a newcomer that replaces a dead worker of its node ("1"), not one of a node that
 * joins the job. */
#define RG_NOTICE_REPLACEMENT_ENV "REGROUP_INPLACE_REPLACEMENT"
/* --health-check: off, warn or evict (train/train_health.c), and the bytes of each link's
 * test (per direction and repetition; 4 MiB by default). */
#define RG_HEALTH_CHECK_ENV       "REGROUP_HEALTH_CHECK"
#define RG_HEALTH_CHECK_BYTES_ENV "REGROUP_HEALTH_CHECK_BYTES"
/* In an in-place job, the node copies of the workers' sharded tables (rg_train_table_t,
 * train/train_table.c owns their format): one memfd per local rank, made empty by the agent
 * and inherited by every worker of the node, named in local rank order by
 * $REGROUP_TABLE_FDS ("fd,fd,..."), so that a rank finds a dead local rank's copy. The
 * agent empties them whenever it starts all its workers afresh (a restart from disk: no copy
 * of an earlier attempt is taken for the new one's), and closes them when it ends. */
#define RG_TABLE_ENV         "REGROUP_TABLE_FDS"
#define RG_TABLE_SLOTS_MAX   RG_NOTICE_MAX_LOCAL

/* What the agent tells its workers. Also the public rg_notice_kind_t (<regroup/train.h>):
 * the values must stay equal. */
typedef enum {
    RG_NOTICE_KIND_NONE    = 0,  /* nothing pending */
    RG_NOTICE_KIND_PREEMPT = 1,  /* this node (or another member) leaves by deadline_ms */
    RG_NOTICE_KIND_MEMBERS = 2,  /* a planned membership change: a join, a ready replacement */
} rg_notice_kind_internal_t;

typedef struct {
    uint32_t         magic;
    uint32_t         version;
    uint32_t         lease_ttl_ms;     /* set once at creation */
    uint32_t         pad;
    _Atomic uint64_t heartbeat_ms;     /* CLOCK_MONOTONIC ms of the agent's last renewal */
    _Atomic uint64_t seq;              /* incremented after each notice is written */
    _Atomic int32_t  kind;
    _Atomic int32_t  round;
    _Atomic int64_t  deadline_ms;      /* CLOCK_MONOTONIC ms; 0 = none */
    char             reason[RG_NOTICE_REASON_MAX];   /* NUL-terminated, for logs */
    /* In an in-place job: the round the agent's node is in now and each local rank's global
     * rank there (-1: not in it, a replacement that is not ready yet), written by the agent
     * once the round closed, under its own seqlock (asg_seq). A worker that regroups waits
     * here for a round newer than its own. */
    _Atomic uint64_t asg_seq;
    _Atomic int32_t  asg_round;          /* -1 before the first in-place assignment */
    _Atomic int32_t  asg_world;
    _Atomic int32_t  asg_restarts;
    _Atomic int32_t  asg_n;              /* local ranks listed */
    _Atomic int32_t  asg_rank[RG_NOTICE_MAX_LOCAL];
    _Atomic int64_t  asg_lease;          /* the agent's lease in that round: what the
                                          * workers fence their writes with (it changes when
                                          * the agent joined with a new one, its old one
                                          * lost, while its workers lived) */
} rg_notice_page_t;

/* A consistent copy of the assignment. */
typedef struct {
    int round;                         /* -1: none yet */
    int world;
    int restarts;
    int n;
    int rank[RG_NOTICE_MAX_LOCAL];
    int64_t lease;                     /* the agent's lease in that round; 0: not said */
} rg_notice_assign_t;

/* A consistent copy of the current notice. */
typedef struct {
    uint64_t seq;                      /* 0: no notice was ever posted */
    int      kind;
    int      round;
    int64_t  deadline_ms;
    char     reason[RG_NOTICE_REASON_MAX];
} rg_notice_snap_t;

/* ---- the agent's side ------------------------------------------------------------------ */

typedef struct {
    int               fd;     /* the memfd, close-on-exec; a worker gets it in the child */
    rg_notice_page_t *page;
} rg_notice_host_t;

/* Creates the page with the lease TTL the workers measure the heartbeat against, and a first
 * heartbeat. RG_ESYS names the failing call. */
rg_status_t rg_notice_host_create(rg_notice_host_t *h, int64_t lease_ttl_ms) RG_NODISCARD;
void        rg_notice_host_destroy(rg_notice_host_t *h);    /* accepts a zeroed host */

/* The node copies (RG_TABLE_ENV): n (1 .. RG_TABLE_SLOTS_MAX) empty memfds, close-on-exec,
 * into fds; emptied (size 0) again; closed (each set to -1; accepts -1s). */
rg_status_t rg_table_slots_create(int n, int *fds) RG_NODISCARD;
void        rg_table_slots_reset(int n, const int *fds);
void        rg_table_slots_close(int n, int *fds);
/* Renews the heartbeat: now. */
void        rg_notice_heartbeat(rg_notice_host_t *h);
/* Posts a notice (kind RG_NOTICE_KIND_NONE clears the current one); deadline_ms is an
 * absolute CLOCK_MONOTONIC time in ms, or 0; reason may be NULL. Never blocks. */
void        rg_notice_post(rg_notice_host_t *h, int kind, int round, int64_t deadline_ms,
                           const char *reason);

/* In-place jobs: publishes the round this node is in, each local rank's global rank
 * (ranks[0..n-1], -1 for a local rank not in the round) and the agent's lease there (what
 * the workers' fence compares; 0: not said). Never blocks. */
void        rg_notice_assign(rg_notice_host_t *h, int round, int world, int restarts,
                             const int *ranks, int n, int64_t lease);

/* ---- the worker's side ----------------------------------------------------------------- */

typedef struct {
    const rg_notice_page_t *page;     /* NULL: no agent page (not under regroup) */
} rg_notice_view_t;

/* Maps the page named by $REGROUP_NOTICE_FD read-only and closes the descriptor. No variable:
 * RG_OK with view->page NULL. RG_EINVAL: a malformed variable, or a descriptor that is not a
 * page of this version. */
rg_status_t rg_notice_view_open(rg_notice_view_t *v) RG_NODISCARD;
void        rg_notice_view_close(rg_notice_view_t *v);      /* accepts a zeroed view */
/* A consistent copy of the current notice; false (snap zeroed) without a page. */
bool        rg_notice_read(const rg_notice_view_t *v, rg_notice_snap_t *snap);
/* Milliseconds since the agent's last heartbeat, now_ms being CLOCK_MONOTONIC ms; -1
 * without a page. */
int64_t     rg_notice_heartbeat_age_ms(const rg_notice_view_t *v, int64_t now_ms);
int64_t     rg_notice_lease_ttl_ms(const rg_notice_view_t *v);   /* 0 without a page */

/* A consistent copy of the assignment; false (a->round -1) without a page or none yet. */
bool        rg_notice_read_assign(const rg_notice_view_t *v, rg_notice_assign_t *a);

/* ---- the worker -> agent pipe (in-place jobs) ------------------------------------------ */

/* What a worker tells its agent, one 4-byte message (atomic on a pipe) each. */
typedef enum {
    RG_NOTICE_MSG_INPLACE = 'A',   /* this worker regroups in place (rg_train_regroup) */
    RG_NOTICE_MSG_READY   = 'R',   /* a replacement is ready to join the running job */
    RG_NOTICE_MSG_RESTART = 'X',   /* in-place recovery failed here: restart the job */
    RG_NOTICE_MSG_JOINED  = 'J',   /* this worker is in the group of the page's round */
    RG_NOTICE_MSG_REGROUP = 'G',   /* this worker's group failed with no member lost (a
                                      deadline passed): open the next round */
    RG_NOTICE_MSG_LEFT_OUT = 'L',  /* this worker's regroup found its agent no member of
                                      the job (RG_ELEASE): start new workers, which join
                                      it; the others do not restart */
    RG_NOTICE_MSG_STRAGGLER = 'S', /* this worker has been a straggler for the window:
                                      take the node out of the job (as a preemption) */
    RG_NOTICE_MSG_HEALTH = 'H',    /* this worker's node failed the health check
                                      (--health-check=evict): take it out of the job */
    RG_NOTICE_MSG_CUT_OFF = 'C',   /* this worker reached no rank of any other node in its
                                      regroup's last tries, while etcd answered: the node
                                      leaves the round and joins again later */
} rg_notice_msg_t;

/* Sends msg for local_rank on $REGROUP_AGENT_PIPE_FD (never blocks; false if there is no
 * pipe or the write failed). */
bool        rg_notice_msg_send(rg_notice_msg_t msg, int local_rank);
/* Decodes one message read by the agent; false if buf is not one. */
bool        rg_notice_msg_decode(const unsigned char buf[4], rg_notice_msg_t *msg,
                                 int *local_rank);

/* CLOCK_MONOTONIC in ms: the page's clock. */
int64_t     rg_notice_now_ms(void);

#endif
