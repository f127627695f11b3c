/*
 * Fencing: every write that publishes on behalf of a job (a checkpoint commit and
 * workers/ckpt/latest, progress, the restored record, a failure marker, done, a round change) is one
 * etcd transaction whose compares say that the writer is still a member of the round it
 * works for:
 *
 *   value(round) == <the writer's round>                       the job has not moved on
 *   lease(rounds/<round>/nodes/<agent>) == <the agent's lease>  its agent is still in it
 *
 * (a compare on a missing key fails, so a node key gone with its lease fails the second).
 * A writer whose agent was stopped past its lease TTL, or cut from etcd, or whose round the
 * others have already left, is refused with RG_ELEASE and a message naming the round; it
 * never changes the job's state. Workers learn their agent's id and lease from the
 * environment the agent gives them (REGROUP_ROUND, REGROUP_AGENT_ID, REGROUP_AGENT_LEASE),
 * and in place, at each regroup, the round and lease from the notice page's assignment (an
 * agent that lost its lease joins with a new one while its workers live); see
 * docs/etcd-keys.md.
 *
 * Private to regroup (rendezvous/ is on every part's include path).
 */
#ifndef REGROUP_RDZV_FENCE_H
#define REGROUP_RDZV_FENCE_H

#include "rdzv_keys.h"

#include <regroup/etcd.h>

#define RDZV_FENCE_ENV_AGENT "REGROUP_AGENT_ID"
#define RDZV_FENCE_ENV_LEASE "REGROUP_AGENT_LEASE"
#define RDZV_FENCE_ENV_ROUND "REGROUP_ROUND"

typedef struct {
    bool    on;                         /* false: writes are unconditional (not under regroup) */
    int     round;
    int64_t lease;
    char    agent[RG_RDZV_ID_MAX];
    char    k_round[RDZV_KEY_MAX];
    char    k_node[RDZV_KEY_MAX];
    char    v_round[RDZV_NUM_MAX];
} rdzv_fence_t;

/* A fence for agent (holding lease) in round of the job keys; RG_EINVAL if the keys do not
 * fit or lease is 0. */
rg_status_t rdzv_fence_init(rdzv_fence_t *f, const rdzv_keys_t *keys, int round,
                            const char *agent, int64_t lease) RG_NODISCARD;
/* A fence from the worker's environment. Off (f->on false, RG_OK) when REGROUP_AGENT_ID is
 * not set (a program not started by an agent); RG_EINVAL if the variables are malformed. */
rg_status_t rdzv_fence_from_env(rdzv_fence_t *f, const rdzv_keys_t *keys) RG_NODISCARD;

/* Runs ops (n may be 0: only the check) in one transaction that holds only while the fence
 * does; without a fence, unconditionally. RG_ELEASE, with what (e.g. "checkpoint step 7")
 * and the round in the message, when it is refused. res (may be NULL) gets the success
 * branch's results (free with rg_etcd_txn_cleanup). */
rg_status_t rdzv_fence_txn(rg_etcd_t *etcd, const rdzv_fence_t *f, const rg_etcd_op_t *ops,
                           size_t n, rg_deadline_t deadline, const char *what,
                           rg_etcd_txn_t *res) RG_NODISCARD;
/* One put of a string value under the fence (lease 0: none). */
rg_status_t rdzv_fence_put(rg_etcd_t *etcd, const rdzv_fence_t *f, const char *key,
                           const char *value, int64_t lease, rg_deadline_t deadline,
                           const char *what) RG_NODISCARD;

/*
 * The audit of fencing: reads etcd's history of the job's keys (a watch from revision 1 up to
 * the current revision; etcd must not have compacted it) and counts the writes accepted for
 * a round the job had already left: progress records, restored records (their "round"),
 * failure markers and done records (their key's round), compared with the value `round`
 * had at that revision. *checked: how many such writes it looked at; first (may be NULL)
 * describes the first stale one. RG_ECOMPACTED and the client's errors when the history
 * cannot be read.
 */
rg_status_t rdzv_fence_audit(const rg_etcd_params_t *params, const char *job, int *stale,
                             int *checked, char *first, size_t first_cap) RG_NODISCARD;

#endif
