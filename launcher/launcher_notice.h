/*
 * Preemption notices: a node that leaves the job on purpose, and the last checkpoint its
 * workers take before it goes.
 *
 * Two sources tell an agent that its node goes away: the cloud's instance metadata
 * (--preemption-notice=aws|gce|azure|auto, watched by a background thread with bounded
 * requests; the agent's poll() waits on its eventfd) and SIGTERM (the same, with the grace
 * period as the deadline). Either way the agent
 *   1. posts RG_NOTICE_KIND_PREEMPT with the deadline on its notice page (rg_notice.h), so its
 *      workers learn of it at their next step boundary (rg_report); a worker process that did
 *      not map the page (it does not use the worker API) gets SIGTERM at once instead;
 *   2. writes its leaving/ record in etcd (rdzv_leaving.h); every other agent turns it into a
 *      PREEMPT notice for its own workers, so that every rank's rg_report agrees at the same
 *      step and all take the same last checkpoint (rg_train_leave);
 *   3. keeps running the round (heartbeat, rendezvous) until its workers have exited or the
 *      deadline comes (then SIGTERM, SIGKILL at the end), revokes its lease and exits.
 * No failure is recorded for any of it on any node, so a preemption never counts against
 * --max-restarts.
 *
 * The deadline posted to the workers is the notice's end less a small margin (a tenth of the
 * time left, at most 500 ms) in which the agent stops what is left and revokes its lease.
 */
#ifndef REGROUP_LAUNCHER_NOTICE_H
#define REGROUP_LAUNCHER_NOTICE_H

#include "launcher.h"
#include "rg_notice.h"

#define LAUNCHER_NOTICE_POLL_MS    1000   /* between two looks at the metadata (see .c) */
#define LAUNCHER_NOTICE_REQUEST_MS 1000   /* one request, connect included */
#define LAUNCHER_NOTICE_PROBE_MS   300    /* one service's answer to --preemption-notice=auto */
#define LAUNCHER_NOTICE_GCE_MS     30000  /* GCE gives no time: it documents 30 s */
#define LAUNCHER_NOTICE_REASON_MAX 128

/* ---- the metadata watcher: its own thread, one per agent ---------------------------------- */

typedef struct launcher_watch launcher_watch_t;

typedef struct {
    rg_agent_notice_t provider;
    int64_t           end_ms;        /* CLOCK_MONOTONIC ms by which the node is gone */
    char              reason[LAUNCHER_NOTICE_REASON_MAX];
} launcher_preempt_t;

/* Starts watching provider (with RG_AGENT_NOTICE_NONE: *w_p = NULL, nothing started) at
 * $REGROUP_METADATA_URL or http://169.254.169.254. RG_EINVAL names a malformed variable;
 * RG_ESYS. Never blocks on the network: auto probes from the thread. */
rg_status_t launcher_watch_start(rg_agent_notice_t provider, launcher_watch_t **w_p)
    RG_NODISCARD;
/* RG_EINVAL naming $REGROUP_METADATA_URL if it is set and not an http(s) base URL. */
rg_status_t launcher_metadata_url_check(void) RG_NODISCARD;
/* Readable once a notice has arrived (an eventfd); -1 for NULL. */
int  launcher_watch_fd(const launcher_watch_t *w);
/* A descriptor readable when fd is or when a notice has arrived, for rg_rdzv_join's cancel_fd:
 * fd itself for NULL. Made once, owned by the watcher. */
int  launcher_watch_join_fd(launcher_watch_t *w, int fd);
/* The notice, once: true the first time it is called after the notice arrived. Never blocks;
 * accepts NULL (false). */
bool launcher_watch_take(launcher_watch_t *w, launcher_preempt_t *out);
/* Tells the service the node is ready to go (Azure: StartRequests of the event); a no-op for
 * the others and for NULL. One request, LAUNCHER_NOTICE_REQUEST_MS at most. */
void launcher_watch_ack(launcher_watch_t *w);
/* Stops the thread (within a request's time) and frees. Accepts NULL. */
void launcher_watch_stop(launcher_watch_t *w);

/* ---- a round while some node leaves ------------------------------------------------------- */

typedef struct {
    const rg_agent_params_t    *cfg;
    launcher_workers_t         *ws;
    rg_rdzv_t                  *rdzv;
    rg_notice_host_t           *notice;
    const rg_rdzv_assignment_t *asg;
    /* state */
    bool    own;                    /* this node leaves */
    int64_t end_ms;                 /* own: when it is gone (CLOCK_MONOTONIC ms) */
    int64_t workers_ms;             /* own: the deadline posted to its workers */
    char    reason[LAUNCHER_NOTICE_REASON_MAX];
    bool    others;                 /* another member leaves: its PREEMPT is posted here */
    int64_t others_ms;              /* the deadline posted for it */
    bool    drain;                  /* a change came while another member leaves: the
                                       workers get until others_ms to finish their save */
} launcher_leave_t;

/* At the start of a round: no one leaves; clears the page's notice. */
void launcher_leave_init(launcher_leave_t *lv, const rg_agent_params_t *cfg,
                         launcher_workers_t *ws, rg_rdzv_t *rdzv, rg_notice_host_t *notice,
                         const rg_rdzv_assignment_t *asg);
/* This node leaves by end_ms (an earlier end replaces a later one: SIGTERM after a notice).
 * Posts the notice, writes the leaving record, SIGTERMs the workers that do not read the
 * page, and says so on stderr. */
void launcher_leave_begin(launcher_leave_t *lv, const char *reason, int64_t end_ms);
/* After rg_rdzv_check: a PREEMPT notice for the workers when another member of the round
 * leaves. */
void launcher_leave_others(launcher_leave_t *lv);
/* The longest the agent may sleep: tick, or less when a deadline comes sooner. */
int64_t launcher_leave_poll_ms(const launcher_leave_t *lv, int64_t tick_ms);
/* True if the workers' end now is part of a member's leaving: then no failure is recorded.
 * Reads the round's leaving records first when none was seen yet. */
bool launcher_leave_excused(launcher_leave_t *lv);
/* True if a worker's failure now is explained by a member's leaving: this node's own, or
 * another's whose node goes (its workers ended, its lease revoked) within
 * LAUNCHER_LEAVE_EXPLAIN_MS of the failure, as when the worker lost its peers there. A
 * worker that fails while the leaving node's workers still run failed by itself: false, and
 * the failure counts. Waits that long at most. */
#define LAUNCHER_LEAVE_EXPLAIN_MS 3000
bool launcher_leave_explains(launcher_leave_t *lv);
/* What to do about a change rg_rdzv_check reported: true to keep the round running while the
 * workers finish their last checkpoint. */
bool launcher_leave_holds(launcher_leave_t *lv, rg_rdzv_change_t change);
/* True once the deadline has passed with workers still running: the agent stops them. */
bool launcher_leave_expired(const launcher_leave_t *lv);
/* Stops what is left of the workers, SIGKILL at the node's end (own) or after the grace
 * period (another's). */
void launcher_leave_stop(launcher_leave_t *lv);

#endif
