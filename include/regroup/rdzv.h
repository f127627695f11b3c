/*
 * regroup rendezvous: how the per-node agents of a job agree on rounds over etcd.
 *
 * Keys live under /regroup/<job>/ (docs/etcd-keys.md has the full layout). Each agent holds
 * one etcd lease (kept alive by a background thread); every key that says "this agent is
 * here" is attached to it, so a lost agent disappears when its lease expires and an agent
 * that leaves on purpose revokes it and disappears at once.
 *
 * A round r is open until its closer (the first agent to register in it, or, if that one's
 * lease ends first, the next registered agent to look) closes it with a compare-and-swap that
 * writes rounds/<r>/closed; the others wait for that key without being sent the others'
 * registrations: at once when max nodes have joined; when min have joined and every
 * live member of the previous closed round (and every waiting node) has joined; or when min
 * have joined and the last-call window has passed since min was reached. Ranks are stable:
 * members of the previous round keep their order, new nodes come last.
 *
 * While a round runs, an agent learns from rg_rdzv_check() that it must stop its workers
 * and join the next round: a failure was reported, a member was lost, a node is waiting to
 * join a job below max size, or the round number moved on.
 *
 * One rg_rdzv_t belongs to one thread (the agent's).
 *
 * Blocking: rg_rdzv_create and rg_rdzv_join are bounded by join_timeout_ms; every other call
 * that talks to etcd makes a few requests, each with the client's default deadline
 * (etcd.timeout_ms, see etcd.h and <regroup/deadline.h>). The accessors never block.
 */
#ifndef REGROUP_RDZV_H
#define REGROUP_RDZV_H

#include <regroup/etcd.h>

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A job's most nodes. The closed record of a round lists every member (id and address) in one
 * etcd value, so the larger max_nodes, the shorter a node's address may be: 255 characters up
 * to 1024 nodes, 236 at 4096 (rg_rdzv_create refuses a longer one). */
#define RG_RDZV_MAX_NODES 4096
#define RG_RDZV_ID_MAX    96
#define RG_RDZV_ADDR_MAX  256

typedef struct {
    rg_etcd_params_t etcd;
    const char *job;            /* job id, [A-Za-z0-9_.-]{1,64} */
    const char *addr;           /* this node's address for MASTER_ADDR and status */
    int         nproc;          /* workers on this node */
    int         min_nodes;
    int         max_nodes;
    int64_t     lease_ttl_s;    /* default 5 */
    int64_t     last_call_ms;   /* default 1000 */
    int64_t     join_timeout_ms;/* default 600000 */
    int         max_restarts;   /* failures tolerated before the job fails */
    bool        in_place;       /* --recovery=in-place: a failure marker does not end the
                                 * round for the other agents (the agent that replaced its
                                 * worker opens the next round); rg_rdzv_request_restart
                                 * does */
} rg_rdzv_params_t;

typedef struct {
    char agent[RG_RDZV_ID_MAX];
    char addr[RG_RDZV_ADDR_MAX];
    int  nproc;
} rg_rdzv_member_t;

typedef struct {
    int              round;
    int              group_rank;     /* this node's index in members */
    int              group_world;    /* number of nodes */
    int              world_size;     /* total workers */
    int              rank_offset;    /* global rank of this node's local rank 0 */
    int              restart_count;  /* failure restarts so far */
    int              excused_count;  /* worker failures not counted in restart_count: each
                                        came with the loss of a member of its round (a lease
                                        that expired or was revoked), which explains it */
    bool             job_failed;     /* restarts exceeded max_restarts: the job is over */
    bool             job_done;       /* every member of the last round finished: over */
    char             master_addr[RG_RDZV_ADDR_MAX];
    int              master_port;
    int              n_members;
    rg_rdzv_member_t members[RG_RDZV_MAX_NODES];
} rg_rdzv_assignment_t;

typedef enum {
    RG_RDZV_NONE = 0,
    RG_RDZV_FAILURE,        /* a worker failed somewhere: restart (counts as a restart); in
                             * an in-place job: some agent asked for a restart */
    RG_RDZV_MEMBER_LOST,    /* a member's lease ended without it finishing */
    RG_RDZV_JOIN_PENDING,   /* a node waits to join and the job is below max */
    RG_RDZV_NEW_ROUND,      /* another agent opened the next round */
    RG_RDZV_LEASE_LOST,     /* this agent's own lease is gone */
    RG_RDZV_OTHERS_DONE,    /* in place: every other member of the round finished the job
                             * (in the group before it, without this node's workers) */
} rg_rdzv_change_t;

typedef struct rg_rdzv rg_rdzv_t;

/* Connects, grants this agent's lease (retrying until the join timeout if etcd cannot be
 * reached), starts its keeper thread and watches the job. Free with rg_rdzv_destroy. */
rg_status_t rg_rdzv_create(const rg_rdzv_params_t *params, rg_rdzv_t **rdzv_p)
    RG_ETCD_NODISCARD;
/* Stops the watch and keeper; does not revoke the lease (see rg_rdzv_leave). Accepts NULL. */
void rg_rdzv_destroy(rg_rdzv_t *rdzv);
/* This agent's id (host:pid:random), owned by the rendezvous. */
const char *rg_rdzv_agent_id(const rg_rdzv_t *rdzv);
/* The lease this agent's membership keys are attached to now (it changes when a lost lease
 * is replaced at the next join); what its workers fence their writes with. */
int64_t rg_rdzv_lease_id(const rg_rdzv_t *rdzv);
/* The etcd client the rendezvous uses (for status and progress keys); owned by the
 * rendezvous, valid until rg_rdzv_destroy. */
rg_etcd_t *rg_rdzv_client(rg_rdzv_t *rdzv);
/* What this handle has cost etcd so far: the requests and bytes of its client (and of what
 * others write through rg_rdzv_client), its lease keepers' keep-alives and its watches'
 * streams, and the events its watches received (rg_etcd_stats_t). Never blocks; call it from
 * the handle's thread. */
void rg_rdzv_stats(const rg_rdzv_t *rdzv, rg_etcd_stats_t *out);

/*
 * Joins the current round (or the next one, waiting if the job is running without this
 * node) and blocks until a round that includes this node is closed. Returns RG_ETIMEDOUT
 * with a message saying how many nodes came if the join timeout passes, and RG_ECANCELED as
 * soon as cancel_fd (may be -1) becomes readable.
 */
rg_status_t rg_rdzv_join(rg_rdzv_t *rdzv, int cancel_fd, rg_rdzv_assignment_t *out)
    RG_ETCD_NODISCARD;

/* A file descriptor that becomes readable when something may have changed (etcd events or
 * a lost lease). Stable for the rendezvous' life. */
int rg_rdzv_fd(const rg_rdzv_t *rdzv);
/* Drains what happened since the last call and says whether the running round must end. */
rg_status_t rg_rdzv_check(rg_rdzv_t *rdzv, rg_rdzv_change_t *change) RG_ETCD_NODISCARD;

typedef struct {
    int         rank;           /* global rank of the failed worker */
    int         local_rank;
    int         exit_code;      /* -1 if killed by a signal */
    int         signal;         /* 0 if it exited */
    const char *error;          /* from the worker's error file, may be NULL */
    const char *stderr_tail;    /* last lines of its stderr, may be NULL */
} rg_rdzv_failure_t;

/* Records a worker failure of the current round; every agent sees RG_RDZV_FAILURE. */
rg_status_t rg_rdzv_report_failure(rg_rdzv_t *rdzv, const rg_rdzv_failure_t *f)
    RG_ETCD_NODISCARD;
/* In-place jobs: asks every agent to stop its workers and restart the job from its last
 * checkpoint: `restart` says the newest round so far, whose workers and those of every
 * round before it restart (rg_rdzv_check says RG_RDZV_FAILURE to an agent running one), and
 * the job moves on to the round after it. Fenced: RG_ELEASE, and nothing written, when this
 * agent is a member neither of the round it runs nor of the job's newest (its lease ran out:
 * the job went on without it, and it restarts only its own workers). */
rg_status_t rg_rdzv_request_restart(rg_rdzv_t *rdzv, const char *why) RG_ETCD_NODISCARD;
/* In-place jobs: whether a restart was requested for workers of `round` (or a later one). */
rg_status_t rg_rdzv_restart_requested(rg_rdzv_t *rdzv, int round, bool *yes)
    RG_ETCD_NODISCARD;
/* In-place jobs: the number of this node's workers in the rounds it joins from now on (its
 * live workers, less the replacements not ready yet); 0..params.nproc. */
void rg_rdzv_set_nproc(rg_rdzv_t *rdzv, int nproc);
/* In-place jobs: with hold set, a join that finds the job running without this node (a
 * closed round of live members, at any size up to the maximum, that is not the job's end)
 * returns RG_EAGAIN with that round in *out, before this node registers as waiting: the agent
 * starts its workers as newcomers first, so that the running members never wait for them to
 * start, then joins the next round with hold off (at the maximum size, the first round that
 * has room for it: it waits as a waiting node does). */
void rg_rdzv_set_join_running(rg_rdzv_t *rdzv, bool hold);
/* In-place jobs: a node that is no member of the running round `round` (its newcomers are
 * ready) moves the job to the round after it, so that the members take the node in; a no-op
 * if the job already moved on. */
rg_status_t rg_rdzv_open_round_after(rg_rdzv_t *rdzv, int round) RG_ETCD_NODISCARD;
/* Moves the job to the next round (a no-op if another agent already did, or if this agent
 * was in no round yet). */
rg_status_t rg_rdzv_next_round(rg_rdzv_t *rdzv) RG_ETCD_NODISCARD;
/* Records that this node's workers all finished successfully in the current round. */
rg_status_t rg_rdzv_done(rg_rdzv_t *rdzv) RG_ETCD_NODISCARD;
/* Revokes the lease so the other agents see this node gone at once. */
rg_status_t rg_rdzv_leave(rg_rdzv_t *rdzv) RG_ETCD_NODISCARD;

/* Prints a job's state from etcd (round, members and ranks, waiting nodes, restarts,
 * failures, progress, last checkpoint) for `regroup status`. RG_ENOENT: no such job. */
rg_status_t rg_rdzv_status_print(const rg_etcd_params_t *params, const char *job, FILE *out)
    RG_ETCD_NODISCARD;

/* Prints every failure the job recorded as a table (for the end of a failed job), or a line
 * saying why they cannot be read. */
void rg_rdzv_print_failures(rg_rdzv_t *rdzv, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
