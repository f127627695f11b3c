/*
 * Internals of the rendezvous (include/regroup/rdzv.h, docs/etcd-keys.md).
 *
 * One rg_rdzv_t is one agent's view of its job: an etcd client, a lease kept alive by a
 * keeper thread, and watches on the job's keys and its round (rdzv_keys.h). Its files:
 *   rdzv_lease.c      the handle's life: lease, keeper and watch, and the fd that wakes callers
 *   rdzv_keys.c       key builders and agent ids; rdzv_records.c the records (rdzv_keys.h)
 *   rdzv_close.c      the close policy: a pure function of what was read and the time given
 *   rdzv_close_txn.c  closing a round: the policy's inputs read, its answer written by one
 *                     compare-and-swap
 *   rdzv_round.c      joining: reading the round, registering (the first to register is
 *                     the round's closer: only it lists the round's nodes), waiting to be
 *                     let in
 *   rdzv_check.c      while a round runs: what ends it, failure markers, done, the next round
 *   rdzv_fence.c      fenced writes: conditional on the writer still being a member (rdzv_fence.h)
 *   rdzv_print.c      the failure table at the end of a failed job
 *   rdzv_leaving.c    nodes that leave on purpose (rdzv_leaving.h): their records
 *
 * In place (params.in_place, `--recovery=in-place`): rounds follow one another while the
 * workers live. A round's members are the agents, as always; each registers with the number
 * of its workers taking part (rg_rdzv_set_nproc: its live workers less the replacements not
 * ready yet, possibly 0), so the world size is their sum and ranks are compact: node order
 * as the close policy gives it (survivors keep theirs), then the local ranks taking part, in
 * order (the agent computes them and tells its workers through the notice page). A
 * failure marker only counts the restart; the `restart` key (rg_rdzv_request_restart) is
 * what ends a round for everyone. rg_rdzv_join may be interrupted and entered again for the
 * same round (the agent looks after its workers meanwhile): it keeps the last-call window.
 *
 * An event never decides anything: it only says "look again", and the state is then read in
 * one range or transaction, so a dropped watch or a compaction cannot make an agent miss a
 * change. Every buffer too large for a stack lives in the handle, not in a function-static:
 * the handle belongs to one thread, and a process may hold several (the tests do).
 */
#ifndef REGROUP_RDZV_INTERNAL_H
#define REGROUP_RDZV_INTERNAL_H

#include "etcd_internal.h"
#include "rdzv_fence.h"
#include "rdzv_keys.h"
#include "rdzv_leaving.h"

#include <regroup/rdzv.h>

#define RDZV_LIST_MAX    (RG_RDZV_MAX_NODES * 2)  /* nodes of one round we look at */
#define RDZV_EXPECT_MAX  (RG_RDZV_MAX_NODES * 4)  /* agents a close may wait for */
#define RDZV_BACK_ROUNDS 16     /* how far back to look for the last closed round */
#define RDZV_RETRY_MS    200
#define RDZV_VERIFY_MS   1000
#define RDZV_WATCH_AHEAD_NS (20 * 1000000ull)   /* a look this soon comes before a new watch */
#define RDZV_GONE_MAX    8      /* members a look reads by name (their node keys deleted) */

/* ---- the close policy (rdzv_close.c): no etcd, no clock ---------------------------------- */

typedef struct {
    int      min_nodes;
    int      max_nodes;
    int      max_restarts;
    int64_t  last_call_ms;
    int      round;                     /* the round to close */
    const rdzv_node_rec_t *nodes;       /* registered in it, any order (create_rev set) */
    int      n_nodes;
    const rg_rdzv_assignment_t *prev;   /* the last closed round before it, NULL if none */
    bool     prev_failed;               /* prev has a failure marker: this close restarts */
    /* With prev: how many of its members are lost (their node key in prev is gone, with
     * their lease, and they left no done record). A failure of prev that comes with such a
     * loss is the loss's doing: it is not counted against max_restarts (excused). While prev
     * failed and one of its members is neither registered here nor lost, the round waits for
     * its fate up to lease_ttl_ms beyond the last-call window. */
    int      prev_lost;
    int64_t  lease_ttl_ms;
    /* With prev: the agents the round may close early for once all have registered (prev's
     * live members and the waiting nodes); n_expected < 0 means unknown (the window decides). */
    const char *const *expected;
    int      n_expected;
    uint64_t now_ns;
    uint64_t min_reached_ns;            /* when min nodes were first seen; 0: not yet */
} rdzv_close_in_t;

typedef enum {
    RDZV_CLOSE_BELOW_MIN,   /* fewer than min nodes: keep waiting, the window restarts */
    RDZV_CLOSE_WAIT,        /* min reached, someone expected is missing: look at wake_ns */
    RDZV_CLOSE_NOW,         /* close with the assignment given */
} rdzv_close_verdict_t;

typedef struct {
    rdzv_close_verdict_t verdict;
    uint64_t min_reached_ns;            /* to pass in at the next look */
    uint64_t wake_ns;                   /* WAIT: when the last-call window ends */
    bool     excused;                   /* NOW: prev's failure is not counted (prev_lost) */
} rdzv_close_out_t;

/* Decides whether in->round closes now. With RDZV_CLOSE_NOW, *closed is the record to write:
 * members ordered (the previous round's in their old order, then newcomers by create
 * revision, then by agent id), at most max_nodes of them, the restart count (prev's, plus
 * one if prev failed and no member of prev was lost) and the excused count (prev's, plus
 * one if prev failed and one was), whether the job failed, and the master (the first
 * member's address and port); round set, group_rank -1. Otherwise *closed is untouched. */
void rdzv_close_plan(const rdzv_close_in_t *in, rdzv_close_out_t *out,
                     rg_rdzv_assignment_t *closed);

/* ---- the handle -------------------------------------------------------------------------- */

/* The handle's watches (rdzv_keys.h, "what an agent watches"): the job's two ranges always;
 * the round it joins or runs; and, for the closer of a forming round, the round before it
 * (its members' node keys and leaving records decide when the new round may close). */
enum { RDZV_W_JOB0, RDZV_W_JOB1, RDZV_W_ROUND, RDZV_W_PREV, RDZV_W_N };

typedef struct {
    rg_etcd_watch_t *w;
    bool             on;      /* wanted: range holds what to watch */
    rdzv_range_t     range;
} rdzv_watch_slot_t;

struct rg_rdzv {
    rg_rdzv_params_t p;
    char             job[RDZV_JOB_MAX + 1];
    char             addr[RG_RDZV_ADDR_MAX];
    rdzv_keys_t      keys;
    char             agent[RG_RDZV_ID_MAX];
    rg_etcd_t       *etcd;
    int64_t          lease;
    rg_etcd_keeper_t *keeper;
    rdzv_watch_slot_t watches[RDZV_W_N];
    int              epfd;                  /* watch fd + keeper fd */
    int              keeper_fd_added;
    rg_etcd_stats_t  retired;               /* counters of keepers and watches stopped */
    enum { RDZV_LAYOUT_UNKNOWN, RDZV_LAYOUT_OURS, RDZV_LAYOUT_OTHER } layout;   /* the job's */
    /* state */
    int              round;                 /* the round running, or being joined */
    bool             running;               /* a closed round including us runs */
    rg_rdzv_assignment_t cur;
    int              last_round;            /* the last closed round we were in, -1 */
    int              last_rank;             /* our group rank in it */
    uint64_t         min_reached_ns;
    int              registered_round;
    int              closer_round;          /* the round we hold the closer key of, -1 */
    int64_t          look_rev;              /* revision of the join's last look */
    int64_t          member_watch_rev;      /* > 0: check watches the round from there */
    bool             waiting;
    bool             hold_running;    /* rg_rdzv_set_join_running: RG_EAGAIN before waiting */
    bool             verify;                /* read the state at the next check */
    uint64_t         verified_ns;           /* when check last read the state */
    int64_t          nodes_seen;            /* node keys of the round at check's last full */
    int64_t          nodes_seen_rev;        /* look, and its revision (0: none yet) */
    uint64_t         n_quick_looks;         /* check's looks that began without listing them */
    uint64_t         n_full_looks;          /* and those that listed them */
    /* Members of the running round whose node keys the watch saw deleted since check's last
     * look (more than RDZV_GONE_MAX: the next look lists them all): that look reads their
     * keys by name instead of the round's. And whether a watch ended or was made again
     * since (events may have been lost: the next look lists the round's keys). */
    char             gone[RDZV_GONE_MAX][RG_RDZV_ID_MAX];
    int              n_gone;
    bool             watch_gap;
    /* scratch of one look at a round: too large for a stack, and the handle's own */
    rdzv_node_rec_t  nodes[RDZV_LIST_MAX];
    const char      *expected[RDZV_EXPECT_MAX];
    rg_rdzv_assignment_t prev;
    rg_rdzv_assignment_t closing;
    /* the other agents' leaving/ records at the last check (rdzv_leaving.c) */
    rdzv_leaving_rec_t leaving[RDZV_LEAVING_MAX];
    int              n_leaving;
};

/* rdzv_lease.c: (re)starts the lease and its keeper, within deadline; stops them. */
rg_status_t rdzv_lease_start(rg_rdzv_t *z, rg_deadline_t deadline);
void        rdzv_lease_stop(rg_rdzv_t *z);
/* If the keeper lost the lease: forgets the registrations and starts a new lease. */
rg_status_t rdzv_lease_renew_if_lost(rg_rdzv_t *z, rg_deadline_t deadline);
/* Drains queued watch events (re-watching any that ended); true if any may matter (the
 * watches hold only what agents act on), or a watch was renewed. */
bool        rdzv_watch_drain(rg_rdzv_t *z);
/* Makes slot watch range (NULL: nothing) from start_rev (0: now); a no-op when it already
 * does. A watch that cannot be made is tried again at the next drain. */
void        rdzv_watch_set(rg_rdzv_t *z, int slot, const rdzv_range_t *range, int64_t start_rev);
/* The round watches: round r, with its nodes/ or not (rdzv_keys_watch_round), and with
 * prev_too all of round r - 1 (the closer of a forming round: its members' node keys and
 * leaving records decide when round r may close); from start_rev. */
void        rdzv_watch_round(rg_rdzv_t *z, int r, bool nodes, bool prev_too,
                             int64_t start_rev);

/* rdzv_round.c: reads `round` (creating it as 0 for the job's first agent). */
rg_status_t rdzv_round_read(rg_rdzv_t *z, int *round_p);
/* Moves `round` from r to r + 1 by compare-and-swap (a no-op if it already moved). The
 * fenced form (a member's move, rdzv_fence.h) also needs the member's node key of round r
 * to hold its lease, and fails with RG_ELEASE if it does not. */
rg_status_t rdzv_round_advance(rg_rdzv_t *z, int r);
rg_status_t rdzv_round_advance_fenced(rg_rdzv_t *z, int r, const rdzv_fence_t *fence);
/* Moves `round` from r to r + 1 only if no node key of round r is left (every member's lease
 * ended: the round is dead, and a member that lost its own lease may then move on); *moved
 * says whether it did. */
rg_status_t rdzv_round_advance_if_dead(rg_rdzv_t *z, int r, bool *moved);

/* rdzv_check.c: this agent's done record of round r (its workers finished, or the job ended
 * for it: rdzv_round.c), fenced by its membership of the round it runs, or not. */
rg_status_t rdzv_done_put(rg_rdzv_t *z, int r, bool fenced);

/* rdzv_close_txn.c: asks the close policy about round r's n nodes (z->nodes, listed at
 * revision rev) and closes the round if it says so; *wake_ns is when to look again. */
rg_status_t rdzv_round_try_close(rg_rdzv_t *z, int r, int n, int64_t rev, uint64_t *wake_ns);

/* rdzv_leaving.c: keeps the other agents' records of a range of leaving/. */
void        rdzv_leaving_note(rg_rdzv_t *z, const rg_etcd_range_t *r);

/* rdzv_check.c: true if key is in r's keys. */
bool rdzv_range_has(const rg_etcd_range_t *r, const char *key);

#endif
