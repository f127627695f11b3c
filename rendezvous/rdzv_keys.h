/*
 * The etcd key layout of a job, and the encoding of every record stored there: the one place
 * that knows what lives under /regroup/<job>/ (docs/etcd-keys.md is its description).
 *
 * Everything that reads or writes a job's keys goes through here: the rendezvous, `regroup
 * status`, the checkpoint commit, the worker API's progress and restore records, the group's
 * wire-up store, the chaos runner and the tests. A key builder writes into the caller's
 * buffer and fails with RG_EINVAL when the key does not fit: it never cuts a key short.
 * Decoders take a value as etcd returned it (bytes and length), check every field they read
 * and fail with RG_EPROTO on anything else, so a garbled record is an error, never a half
 * read. Nothing here touches etcd or the clock; everything is safe from any thread (no
 * shared state).
 *
 * This header is private to regroup (rendezvous/ is on the include path of every part, the
 * tests and the chaos runner); it includes neither curl nor jansson.
 */
#ifndef REGROUP_RDZV_KEYS_H
#define REGROUP_RDZV_KEYS_H

#include "rg_common.h"

#include <regroup/rdzv.h>

#include <sys/types.h>

#define RDZV_KEY_MAX          512         /* every key of a job fits in this */
#define RDZV_JOB_MAX          127         /* the layout's limit; the launcher allows 64 */
#define RDZV_REC_MAX          (4u << 20)  /* no record is larger; a larger value is refused */
#define RDZV_NUM_MAX          32          /* a decimal record (round, step) with its NUL */
#define RDZV_PROGRESS_METRICS 32          /* RG_TRAIN_MAX_METRICS */
#define RDZV_METRIC_NAME_MAX  64
#define RDZV_ROUND_MAX        1000000000  /* a `round` value above this is refused */
/* The value of `layout`: which layout of docs/etcd-keys.md a job's keys follow. 2: workers'
 * keys under workers/; 1 (no `layout` key): progress under status/, addresses under
 * rounds/<r>/store/, workers/ckpt/latest at the top. An agent refuses a job of another layout. */
#define RDZV_LAYOUT           "2"
#define RDZV_DONE_VALUE       "1"         /* rounds/<r>/done/<agent> before it held a time */

/* ---- keys -------------------------------------------------------------------------------- */

/* A job's key space: "/regroup/<job>/". Caller's storage, no cleanup. */
typedef struct {
    char   prefix[RDZV_JOB_MAX + 16];
    size_t len;
} rdzv_keys_t;

/* True if job is what `regroup` accepts as --rdzv-id: 1-64 characters of [A-Za-z0-9_.-]. */
bool rdzv_keys_job_id_ok(const char *job);
/* Sets up the key space of job. RG_EINVAL if the job would break the layout: empty, longer
 * than RDZV_JOB_MAX, or holding '/', a space or a control character. (The layout allows more
 * than rdzv_keys_job_id_ok: workers accept what an agent gave them.) */
rg_status_t rdzv_keys_init(rdzv_keys_t *keys, const char *job) RG_NODISCARD;
/* "/regroup/<job>/": every key of the job starts with it. */
const char *rdzv_keys_prefix(const rdzv_keys_t *keys);

/* Each builder writes one key (or one prefix, ending in '/') into buf[cap]; RG_EINVAL (and
 * nothing usable in buf) if it does not fit. agent is an agent id (rdzv_agent_id_make). */
rg_status_t rdzv_keys_round(const rdzv_keys_t *k, char *buf, size_t cap) RG_NODISCARD;
rg_status_t rdzv_keys_layout(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                  /* layout: RDZV_LAYOUT, with `round` */
/* workers/: what workers write (progress, restored, checkpoints, wire-up addresses), which
 * no agent watches (below, "what an agent watches"): a key that agents must see sorts
 * before "workers/" and one they need not see goes under it. */
rg_status_t rdzv_keys_workers_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                                             /* workers/ */
rg_status_t rdzv_keys_workers_round_prefix(const rdzv_keys_t *k, int64_t r, char *buf,
                                           size_t cap) RG_NODISCARD; /* workers/rounds/<r>/ */
rg_status_t rdzv_keys_round_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                                         /* rounds/<r>/ */
rg_status_t rdzv_keys_nodes_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                                   /* rounds/<r>/nodes/ */
rg_status_t rdzv_keys_node(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                           size_t cap) RG_NODISCARD;          /* rounds/<r>/nodes/<agent> */
rg_status_t rdzv_keys_closed(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                                  /* rounds/<r>/closed */
rg_status_t rdzv_keys_closer(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                                  /* rounds/<r>/closer */
rg_status_t rdzv_keys_restart(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                 /* restart: in place, the last round whose workers restart */
rg_status_t rdzv_keys_done_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                                    /* rounds/<r>/done/ */
rg_status_t rdzv_keys_done(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                           size_t cap) RG_NODISCARD;           /* rounds/<r>/done/<agent> */
rg_status_t rdzv_keys_comm_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                           /* workers/rounds/<r>/comm/ */
rg_status_t rdzv_keys_waiting_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                                            /* waiting/ */
rg_status_t rdzv_keys_waiting(const rdzv_keys_t *k, const char *agent, char *buf, size_t cap)
    RG_NODISCARD;                                                    /* waiting/<agent> */
rg_status_t rdzv_keys_failures_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                                /* failures/ (all rounds) */
rg_status_t rdzv_keys_failures_round_prefix(const rdzv_keys_t *k, int64_t r, char *buf,
                                            size_t cap) RG_NODISCARD;       /* failures/<r>/ */
rg_status_t rdzv_keys_failure(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                              size_t cap) RG_NODISCARD;              /* failures/<r>/<agent> */
rg_status_t rdzv_keys_status_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                                     /* workers/status/ */
rg_status_t rdzv_keys_progress_prefix(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                           /* workers/status/progress/ */
rg_status_t rdzv_keys_progress(const rdzv_keys_t *k, int rank, char *buf, size_t cap)
    RG_NODISCARD;                                    /* workers/status/progress/<rank> */
rg_status_t rdzv_keys_restored(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                             /* workers/status/restored */
rg_status_t rdzv_keys_ckpt_latest(const rdzv_keys_t *k, char *buf, size_t cap)
    RG_NODISCARD;                                                 /* workers/ckpt/latest */
rg_status_t rdzv_keys_leaving_prefix(const rdzv_keys_t *k, int64_t r, char *buf, size_t cap)
    RG_NODISCARD;                                                 /* rounds/<r>/leaving/ */
rg_status_t rdzv_keys_leaving(const rdzv_keys_t *k, int64_t r, const char *agent, char *buf,
                              size_t cap) RG_NODISCARD;      /* rounds/<r>/leaving/<agent> */

/* ---- what an agent watches ------------------------------------------------------------------
 *
 * Every agent watches the job's keys outside rounds/ and workers/ (rdzv_keys_watch_job: two
 * ranges, before rounds/ and from its end to workers/: `round`, `layout`, `restart`,
 * failures/, waiting/), and the round it joins or runs (rdzv_keys_watch_round). Only the
 * round's closer, while it forms, and its members, once it runs, watch its nodes/: the
 * others see the round's own records (closed, closer, done/, leaving/) and not one event per
 * node that registers. A range is [key, end) (etcd's range_end). */
typedef struct {
    char key[RDZV_KEY_MAX];
    char end[RDZV_KEY_MAX];
} rdzv_range_t;

rg_status_t rdzv_keys_watch_job(const rdzv_keys_t *k, rdzv_range_t out[2]) RG_NODISCARD;
/* rounds/<r>/ whole with nodes, else up to rounds/<r>/nodes/. */
rg_status_t rdzv_keys_watch_round(const rdzv_keys_t *k, int64_t r, bool nodes,
                                  rdzv_range_t *out) RG_NODISCARD;

/* The rest of key after prefix (a prefix built above), or NULL if key is not under it or
 * nothing follows it: the agent of a nodes/ or waiting/ key, the rank of a progress key. */
const char *rdzv_keys_tail(const char *key, const char *prefix);

/* ---- agent ids: <hostname>-<pid>-<8 hex digits> -------------------------------------------- */

/* Writes an agent id into buf[RG_RDZV_ID_MAX] (a longer host name is cut: ids only need to be
 * unique, and the pid and nonce make them so). */
void rdzv_agent_id_make(const char *host, pid_t pid, uint32_t nonce, char *buf);
/* Splits an agent id into its host (into host[host_cap], may be NULL) and pid, reading from
 * the right (host names may hold '-'). false if id is not of that form. */
bool rdzv_agent_id_parse(const char *id, char *host, size_t host_cap, pid_t *pid);

/* ---- records ----------------------------------------------------------------------------- */

/* `round` and `workers/ckpt/latest`: decimal text. Encoders write into buf[cap] (RDZV_NUM_MAX is
 * enough); decoders refuse anything but a whole number in range (round 0..RDZV_ROUND_MAX,
 * step >= 0). */
rg_status_t rdzv_rec_round_encode(int64_t r, char *buf, size_t cap) RG_NODISCARD;
rg_status_t rdzv_rec_round_decode(const char *v, size_t len, int64_t *r) RG_NODISCARD;
rg_status_t rdzv_rec_ckpt_latest_encode(int64_t step, char *buf, size_t cap) RG_NODISCARD;
rg_status_t rdzv_rec_ckpt_latest_decode(const char *v, size_t len, int64_t *step) RG_NODISCARD;
/* layout: which layout a value of the `layout` key names, into name[cap] (v NULL: the key is
 * absent, which is layout 1), and whether it is this build's RDZV_LAYOUT. */
bool rdzv_rec_layout_decode(const char *v, size_t len, char *name, size_t cap);

/* rounds/<r>/done/<agent>: {"time"} (wall seconds when the agent's workers had all exited 0).
 * The decoder also takes RDZV_DONE_VALUE, what older agents wrote, and then sets *time to -1
 * (not recorded). */
rg_status_t rdzv_rec_done_encode(double time, char *buf, size_t cap) RG_NODISCARD;
rg_status_t rdzv_rec_done_decode(const char *v, size_t len, double *time) RG_NODISCARD;

/* rounds/<r>/nodes/<agent>: {"agent","addr","nproc","port","prev_round","prev_rank"}.
 * create_rev is the key's create revision (not in the value): the decoder sets it to 0. */
typedef struct {
    char    agent[RG_RDZV_ID_MAX];
    char    addr[RG_RDZV_ADDR_MAX];
    int     nproc;          /* 0..4096 (0: in an in-place job, a node whose every worker
                             * is a replacement not ready yet) */
    int     port;           /* a free port on addr, for MASTER_PORT */
    int     prev_round;     /* the last closed round the agent was in, -1 */
    int     prev_rank;      /* its group rank there, -1 */
    int64_t create_rev;
} rdzv_node_rec_t;

/* Encoders return a malloc'd NUL-terminated text in *text_p (caller frees). */
rg_status_t rdzv_rec_node_encode(const rdzv_node_rec_t *n, char **text_p) RG_NODISCARD;
rg_status_t rdzv_rec_node_decode(const char *v, size_t len, rdzv_node_rec_t *n) RG_NODISCARD;

/* waiting/<agent>: {"agent","addr","nproc"}. */
rg_status_t rdzv_rec_waiting_encode(const rg_rdzv_member_t *m, char **text_p) RG_NODISCARD;
rg_status_t rdzv_rec_waiting_decode(const char *v, size_t len, rg_rdzv_member_t *m)
    RG_NODISCARD;

/* rounds/<r>/closed: {"members":[{"agent","addr","nproc"}...],"restarts","excused","failed",
 * "master_addr","master_port","time"}. The encoder writes a's members, restart_count,
 * excused_count, job_failed, master_addr and master_port, and time (wall seconds). The
 * decoder fills members, n_members, group_world, world_size, restart_count, excused_count
 * (0 when absent: older agents), job_failed, master_addr and master_port, sets round to r
 * and group_rank to -1 (see rdzv_assignment_locate).
 * rdzv_rec_closed_time reads the record's time alone: -1 when it has none (RG_EPROTO if the
 * value is not a JSON object). */
rg_status_t rdzv_rec_closed_encode(const rg_rdzv_assignment_t *a, double time, char **text_p)
    RG_NODISCARD;
/* The most a closed record may take: one etcd request (--max-request-bytes, 1.5 MiB by
 * default) less room for the txn around it. A record of max_nodes members fits when every
 * member's address has at most rdzv_addr_max(max_nodes) bytes (agent ids have at most
 * RG_RDZV_ID_MAX - 1, and neither needs JSON escapes); rg_rdzv_create checks its own. */
#define RDZV_CLOSED_MAX (1536 * 1024 - 64 * 1024)
size_t rdzv_addr_max(int max_nodes);
/* Whether addr can be a node's address in a job of max_nodes: 1..rdzv_addr_max(max_nodes)
 * characters of a host name or an IP address ([A-Za-z0-9._:%-], and [ ] around IPv6). */
bool rdzv_addr_ok(const char *addr, int max_nodes);
rg_status_t rdzv_rec_closed_decode(const char *v, size_t len, int64_t r,
                                   rg_rdzv_assignment_t *a) RG_NODISCARD;
rg_status_t rdzv_rec_closed_time(const char *v, size_t len, double *time) RG_NODISCARD;
/* The index of agent among a's members, or -1. */
int rdzv_assignment_find(const rg_rdzv_assignment_t *a, const char *agent);
/* The index of the member whose agent runs as pid (on host, or any host if NULL), or -1. */
int rdzv_assignment_find_pid(const rg_rdzv_assignment_t *a, const char *host, pid_t pid);
/* Sets a->group_rank and a->rank_offset for agent (group_rank -1 if not a member). */
void rdzv_assignment_locate(rg_rdzv_assignment_t *a, const char *agent);

/* failures/<r>/<agent>: {"round","agent","addr","rank","local_rank","exit_code","signal",
 * "time","error","stderr_tail"}. For the encoder error and stderr_tail may be NULL ("").
 * The decoder points them into memory it owns: free with rdzv_rec_failure_cleanup. */
typedef struct {
    int         round;
    char        agent[RG_RDZV_ID_MAX];
    char        addr[RG_RDZV_ADDR_MAX];
    int         rank;
    int         local_rank;
    int         exit_code;      /* -1 if killed by a signal */
    int         signal;         /* 0 if it exited */
    double      time;           /* wall seconds */
    const char *error;
    const char *stderr_tail;
    char       *mem;            /* the decoder's storage for the strings */
} rdzv_failure_rec_t;

rg_status_t rdzv_rec_failure_encode(const rdzv_failure_rec_t *f, char **text_p) RG_NODISCARD;
rg_status_t rdzv_rec_failure_decode(const char *v, size_t len, rdzv_failure_rec_t *f)
    RG_NODISCARD;
/* Frees what the decoder allocated; accepts a zeroed or encoder-filled record. */
void rdzv_rec_failure_cleanup(rdzv_failure_rec_t *f);

/* workers/status/progress/<rank>: {"step","epoch","round","time","metrics":{name: value...}} and,
 * once the rank's compute share is measured (train/train_straggler.c), "compute" (its share
 * of the step), "slow" (that over the other ranks' median) and, while it is a straggler,
 * "slow_s" (for how long). Metric names are 1-64 characters of [A-Za-z0-9_.-] (the encoder
 * refuses others); a value that is not finite is written as null and decodes as NaN. */
typedef struct {
    int64_t step;
    int64_t epoch;
    int     round;
    double  time;           /* wall seconds */
    bool    measured;       /* compute is known (else it, slow and slow_s are not said) */
    double  compute;        /* 0..1 */
    double  slow;           /* compute over the others' median; 0: not known */
    double  slow_s;         /* seconds a straggler; 0: none */
    size_t  n_metrics;
    struct {
        char   name[RDZV_METRIC_NAME_MAX + 1];
        double value;
    } metrics[RDZV_PROGRESS_METRICS];
} rdzv_progress_rec_t;

/* Writes the record into buf[cap]; RG_EINVAL if it does not fit or a name is bad. */
rg_status_t rdzv_rec_progress_encode(const rdzv_progress_rec_t *p, char *buf, size_t cap)
    RG_NODISCARD;
rg_status_t rdzv_rec_progress_decode(const char *v, size_t len, rdzv_progress_rec_t *p)
    RG_NODISCARD;

/* workers/status/restored: {"round","step"}: the round that restored a checkpoint, and its step. */
typedef struct {
    int     round;
    int64_t step;
} rdzv_restored_rec_t;

rg_status_t rdzv_rec_restored_encode(const rdzv_restored_rec_t *r, char *buf, size_t cap)
    RG_NODISCARD;
rg_status_t rdzv_rec_restored_decode(const char *v, size_t len, rdzv_restored_rec_t *r)
    RG_NODISCARD;

/* rounds/<r>/leaving/<agent>: {"agent","addr","reason","deadline","time"}: a member of round
 * r that leaves the job on purpose (a cloud's preemption notice, SIGTERM). No lease: it stays
 * with the round's history, so that an agent whose worker failed because of it finds it even
 * after the node is gone. deadline and time are wall seconds (each machine has its own
 * monotonic clock): when the node's workers must be done, and when it said so. reason is
 * 0-127 bytes of text. */
#define RDZV_LEAVING_REASON_MAX 128
typedef struct {
    char   agent[RG_RDZV_ID_MAX];
    char   addr[RG_RDZV_ADDR_MAX];
    char   reason[RDZV_LEAVING_REASON_MAX];
    double deadline;
    double time;
} rdzv_leaving_rec_t;

rg_status_t rdzv_rec_leaving_encode(const rdzv_leaving_rec_t *l, char **text_p) RG_NODISCARD;
rg_status_t rdzv_rec_leaving_decode(const char *v, size_t len, rdzv_leaving_rec_t *l)
    RG_NODISCARD;

#endif
