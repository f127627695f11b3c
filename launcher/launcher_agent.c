/*
 * The agent: one per node. Joins a round, runs the node's workers, and ends the round when
 * a worker fails (reporting it), when the rendezvous says so (a failure elsewhere, a lost
 * member, a waiting node, a new round), or when it is told to stop (SIGTERM/SIGINT: stop
 * the workers with a grace period, revoke the lease so the others regroup at once, exit).
 *
 * Event-driven: one poll() over a signalfd (SIGCHLD, SIGTERM, SIGINT, SIGHUP), the
 * rendezvous fd and the workers' output pipes; the monitor interval only bounds the sleep.
 */
#include "launcher.h"

#include "etcd_server.h"
#include "launcher_c10d.h"
#include "launcher_notice.h"
#include "rg_notice.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define AGENT_MAX_FDS (4 + 2 * LAUNCHER_MAX_NPROC)   /* signals, rendezvous, notices, pipe */

/* How long a worker's death by SIGTERM, SIGINT or SIGHUP waits for the agent's own stop
 * signal before it counts as a failure (see await_own_stop). */
#define AGENT_STOP_RACE_MS 500

/* A node cut off from its peers (cut_off_leaves) joins again after this, doubled each time
 * it is cut off again before its workers were in a group, up to the maximum. */
#define AGENT_CUT_OFF_WAIT_MS     1000
#define AGENT_CUT_OFF_WAIT_MAX_MS 16000

typedef enum {
    ROUND_SUCCEEDED,    /* every local worker exited 0 */
    ROUND_RESTART,      /* join the next round */
    ROUND_STOPPED,      /* a signal told the agent to stop */
    ROUND_LEFT,         /* this node left on purpose (a preemption notice, SIGTERM) */
    ROUND_ERROR,        /* the agent cannot go on */
    ROUND_IN_PLACE,     /* in place: join the next round keeping the workers */
    ROUND_JOB_DONE,     /* in place: the other members finished the job without this node's
                           workers */
    ROUND_CUT_OFF,      /* in place: this node reached none of its peers and left the round
                           (cut_off_leaves); it joins again after a wait */
} round_end_t;

typedef struct {
    const rg_agent_params_t *cfg;
    rg_rdzv_t               *rdzv;
    int                      sigfd;
    sigset_t                 child_mask;     /* the mask workers start with */
    launcher_workers_t       ws;
    int                      stop_signal;
    int                      restart_count;
    int                      excused_count;  /* failures a lost node explained, seen so far */
    int                      cut_offs;       /* times in a row this node was cut off */
    rg_status_t              error;          /* why a round ended in ROUND_ERROR */
    rg_notice_host_t         notice;         /* the page the workers read (rg_notice.h) */
    launcher_watch_t        *watch;          /* --preemption-notice's watcher, or NULL */
    char                     left_why[LAUNCHER_NOTICE_REASON_MAX]; /* ROUND_LEFT's reason */
    rg_beat_host_t           beat;           /* the page the workers beat (rg_beat.h) */
    launcher_inplace_t       ip;             /* --recovery=in-place (launcher_inplace.c) */
    char                     endpoints[1024];
    char                     local_addr[256];
    char                     log_dir[512];   /* cfg's, or a temporary one made here */
} agent_t;

/* Handles what the signalfd says; returns true if the agent must stop. */
static bool read_signals(agent_t *ag, bool *child)
{
    struct signalfd_siginfo si;
    bool stop = false;
    /* Bounded: the signalfd holds at most one pending instance of each signal. */
    for (int k = 0; k < 32 && read(ag->sigfd, &si, sizeof(si)) == sizeof(si); k++) {
        if (si.ssi_signo == SIGCHLD) {
            *child = true;
        } else {
            ag->stop_signal = (int)si.ssi_signo;
            stop = true;
        }
    }
    return stop;
}

/* A scheduler that stops a node (slurmstepd with proctrack/linuxproc, systemd, a container
 * runtime) signals every process of it, workers included, in no set order: a worker may die
 * of that SIGTERM before its agent sees its own. Such a death is no failure of the job (with
 * --max-restarts=0 it would end a requeued job for good), so it waits, at most
 * AGENT_STOP_RACE_MS, for the agent's own stop signal. True if one came (ag->stop_signal);
 * a worker killed by anything else, or by these signals alone, counts as before. *child says
 * whether a SIGCHLD was read meanwhile (other workers to reap). */
static bool await_own_stop(agent_t *ag, const launcher_worker_t *w, bool *child)
{
    if (!WIFSIGNALED(w->wstatus) ||
        (WTERMSIG(w->wstatus) != SIGTERM && WTERMSIG(w->wstatus) != SIGINT &&
         WTERMSIG(w->wstatus) != SIGHUP)) {
        return false;
    }
    int64_t end = rg_notice_now_ms() + AGENT_STOP_RACE_MS;
    for (int64_t left = AGENT_STOP_RACE_MS; left > 0; left = end - rg_notice_now_ms()) {
        struct pollfd pfd = {.fd = ag->sigfd, .events = POLLIN};
        if (poll(&pfd, 1, (int)left) < 0 && errno != EINTR) {
            return false;
        }
        if (read_signals(ag, child)) {
            return true;
        }
    }
    return false;
}

/* The longest the agent sleeps while a round runs: the monitor interval, but short enough
 * that the workers' view of its heartbeat (renewed each tick while the lease lives) is never
 * older than a quarter of the lease TTL when all is well. */
static int64_t agent_tick_ms(const rg_agent_params_t *cfg)
{
    return RG_MIN(cfg->monitor_ms, cfg->lease_ttl_s * 1000 / 4);
}

/* How a round ends once some node's leaving is over here: this node leaves, or (another one
 * left) the job goes on at the next round. */
static round_end_t agent_left(agent_t *ag, const launcher_leave_t *lv)
{
    if (!lv->own) {
        return ROUND_RESTART;
    }
    snprintf(ag->left_why, sizeof(ag->left_why), "%s", lv->reason);
    return ROUND_LEFT;
}

/* In place: the restart path, for the whole job (every agent stops its workers). */
static round_end_t inplace_restart(agent_t *ag, const char *why)
{
    if (why != NULL && rg_rdzv_request_restart(ag->rdzv, why) != RG_OK) {
        rg_warn("cannot ask the other agents to restart: %s", rg_last_error());
    }
    launcher_workers_stop(&ag->ws, ag->cfg->grace_ms, SIGTERM, ag->cfg);
    return ROUND_RESTART;
}

/* In place: the workers' side of a change; the next round is joined by agent_loop. */
static round_end_t inplace_change(agent_t *ag, const rg_rdzv_assignment_t *asg,
                                  const char *why, bool planned)
{
    char not_capable[256];
    if (!launcher_inplace_capable(&ag->ip, &ag->ws, not_capable, sizeof(not_capable))) {
        fprintf(stderr, "regroup: warning: --recovery=in-place: %s; the job restarts as with "
                "--recovery=restart\n", not_capable);
        return inplace_restart(ag, not_capable);
    }
    rg_info("round %d: %s; regrouping in place", asg->round, why);
    if (!planned) {
        /* A member is lost: the workers stop at their next step boundary, if no collective
         * failed first. A planned change (a join, a replacement that is ready) lets them
         * train on while the agents form the round: the assignment on the page makes them
         * regroup at the step boundary after it (rg_report's agreement), so the pause is the
         * regroup's, not the rendezvous' too. */
        rg_notice_post(&ag->notice, RG_NOTICE_KIND_MEMBERS, asg->round + 1, 0, why);
    }
    return ROUND_IN_PLACE;
}

/* In place, every other member of the round finished the job (rg_rdzv_check's
 * RG_RDZV_OTHERS_DONE): this node's workers may be finishing it with them, or waiting for a
 * group of this round that they will never have (the others finished in the group before
 * it). The grace period to end on their own, then they are stopped: the node is done. */
static round_end_t others_done(agent_t *ag, const rg_rdzv_assignment_t *asg)
{
    const rg_agent_params_t *cfg = ag->cfg;
    rg_info("round %d: every other member finished the job; this node's workers have %lld ms "
            "to end", asg->round, (long long)cfg->grace_ms);
    (void)launcher_workers_wait(&ag->ws, cfg->grace_ms);
    bool all_ok = ag->ws.running == 0;
    for (int i = 0; i < ag->ws.n && all_ok; i++) {
        all_ok = WIFEXITED(ag->ws.w[i].wstatus) && WEXITSTATUS(ag->ws.w[i].wstatus) == 0;
    }
    launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);   /* closes pipes and logs */
    return all_ok ? ROUND_SUCCEEDED : ROUND_JOB_DONE;
}

/* In place: every worker that failed is reported (counted as a restart by the next round)
 * and due for a replacement (inplace_respawn_due, once the next round is the survivors');
 * ROUND_IN_PLACE, or the restart path when that cannot be done. */
static round_end_t inplace_replace(agent_t *ag, const rg_rdzv_assignment_t *asg)
{
    const rg_agent_params_t *cfg = ag->cfg;
    char why[256] = "";
    int n_failed = 0;
    bool capable = launcher_inplace_capable(&ag->ip, &ag->ws, why, sizeof(why));

    for (int i = 0; i < ag->ws.n; i++) {
        launcher_worker_t *w = &ag->ws.w[i];
        if (w->running || ag->ip.state[i] == INPLACE_EXITED ||
            ag->ip.state[i] == INPLACE_DUE) {
            continue;
        }
        if (WIFEXITED(w->wstatus) && WEXITSTATUS(w->wstatus) == 0) {
            ag->ip.state[i] = INPLACE_EXITED;
            continue;
        }
        rg_rdzv_failure_t f;
        char err[8192];
        char tail[4096];
        launcher_workers_drain(&ag->ws, i, cfg);
        launcher_workers_failure(&ag->ws, i, &f, err, sizeof(err), tail, sizeof(tail));
        fprintf(stderr, "regroup: worker rank %d failed (%s %d)\n", f.rank,
                f.signal ? "signal" : "exit code", f.signal ? f.signal : f.exit_code);
        if (rg_rdzv_report_failure(ag->rdzv, &f) != RG_OK) {
            rg_warn("cannot record the failure in etcd: %s", rg_last_error());
        }
        if (!ag->ip.capable[i] && ag->ip.state[i] != INPLACE_PENDING && capable) {
            /* (a replacement that died while starting is simply replaced again) */
            capable = false;
            snprintf(why, sizeof(why), "local rank %d (pid %d) had not said it regroups in "
                     "place", i, (int)w->pid);
        }
        n_failed++;
        if (capable) {
            ag->ip.state[i] = INPLACE_DUE;   /* (inplace_respawn_due, after the next round) */
        }
    }
    if (n_failed == 0) {
        return ROUND_SUCCEEDED;   /* only exits with 0: nothing to recover */
    }
    if (!capable) {
        fprintf(stderr, "regroup: warning: --recovery=in-place: %s; the job restarts as with "
                "--recovery=restart\n", why);
        return inplace_restart(ag, why);
    }
    rg_notice_post(&ag->notice, RG_NOTICE_KIND_MEMBERS, asg->round + 1, 0,
                   "a worker was replaced");
    return ROUND_IN_PLACE;
}

/* In place: starts a replacement for every worker whose failure inplace_replace saw, once
 * the survivors have their next round on the page; ROUND_IN_PLACE, or the restart path when
 * one cannot be started. */
static round_end_t inplace_respawn_due(agent_t *ag, const launcher_spawn_t *sp0)
{
    for (int i = 0; i < ag->ws.n; i++) {
        if (ag->ip.state[i] != INPLACE_DUE) {
            continue;
        }
        launcher_spawn_t sp = *sp0;
        sp.join = true;
        sp.replacement = true;
        rg_beat_host_reset(&ag->beat, i);   /* the replacement arms it with its first beat */
        rg_status_t st = launcher_workers_respawn(&ag->ws, &sp, &ag->child_mask, i);
        if (st != RG_OK) {
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            return inplace_restart(ag, "cannot start a replacement worker");
        }
        ag->ip.state[i] = INPLACE_PENDING;
        ag->ip.capable[i] = false;
        ag->ip.fresh[i] = true;
        rg_info("local rank %d: replacement started (pid %d); the others go on without it",
                i, (int)ag->ws.w[i].pid);
    }
    return ROUND_IN_PLACE;
}

/* A local rank said its node is unfit for the job: it has been a straggler for the window
 * (train/train_straggler.c) or its links failed the health check (train/train_health.c).
 * The node leaves as a preempted one does (its workers take the last checkpoint, the others
 * regroup in place without it), unless the job would fall below its minimum size. */
static void unfit_leaves(agent_t *ag, const rg_rdzv_assignment_t *asg, launcher_leave_t *lv)
{
    const rg_agent_params_t *cfg = ag->cfg;
    int lr = ag->ip.unfit_lr;
    bool straggler = ag->ip.unfit_msg == RG_NOTICE_MSG_STRAGGLER;
    char why[LAUNCHER_NOTICE_REASON_MAX];

    ag->ip.unfit_lr = -1;
    if (lv->own) {
        return;   /* leaving already */
    }
    if (asg->n_members <= cfg->min_nodes) {
        rg_warn("%s: local rank %d (pid %d) is slower than the others, but the job is at its "
                "minimum size (%d nodes): this node stays",
                straggler ? "straggler" : "health check", lr, (int)ag->ws.w[lr].pid,
                cfg->min_nodes);
        return;
    }
    if (straggler) {
        snprintf(why, sizeof(why), "straggler: local rank %d computed over %gx the others' "
                 "median for %g s", lr, cfg->straggler_factor,
                 (double)cfg->straggler_window_ms / 1000);
    } else {
        snprintf(why, sizeof(why), "health check: local rank %d failed it (slow links or "
                 "wrong data)", lr);
    }
    launcher_leave_begin(lv, why, rg_notice_now_ms() + cfg->grace_ms);
}

/* In place, a local rank's regroup reached no rank of any other node, several tries in a
 * row, while etcd answered (RG_NOTICE_MSG_CUT_OFF): this node's links to its peers are cut
 * (a peer-only partition). Every round that holds it fails, and its peers cannot tell which
 * node it is (for them one peer is missing), so it leaves the round itself: its lease
 * revoked, the others regroup without it at once, and its workers stop (the others hold the
 * state). It joins again later as newcomers (cut_off_wait). It stays when the job would fall
 * below its minimum size, and when it is the first of a round of two nodes: the other finds
 * the same and leaves instead, so that one of the two trains on. True if it left. */
static bool cut_off_leaves(agent_t *ag, const rg_rdzv_assignment_t *asg)
{
    const rg_agent_params_t *cfg = ag->cfg;
    int lr = ag->ip.cut_lr;

    ag->ip.cut_lr = -1;
    if (asg->n_members <= cfg->min_nodes || (asg->n_members == 2 && asg->rank_offset == 0)) {
        rg_warn("local rank %d (pid %d) reaches no other node, but %s: this node stays "
                "(the rounds with it fail until the network heals)", lr,
                (int)ag->ws.w[lr].pid, asg->n_members <= cfg->min_nodes
                    ? "the job is at its minimum size" : "it is the first of the round's two "
                                                         "nodes (the other one leaves)");
        return false;
    }
    rg_warn("round %d: local rank %d (pid %d) reaches no other node while etcd answers: this "
            "node is cut off from its peers; it leaves the round, and its workers stop",
            asg->round, lr, (int)ag->ws.w[lr].pid);
    if (rg_rdzv_leave(ag->rdzv) != RG_OK) {
        rg_warn("cannot revoke the lease (%s): the others see this node gone when it expires",
                rg_last_error());
    }
    launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
    return true;
}

/* After cut_off_leaves: waits before this node joins again (a network still cut would make
 * the round that takes it in fail, and cost its peers a regroup each time). False if a
 * signal came meanwhile (ag->stop_signal). */
static bool cut_off_wait(agent_t *ag)
{
    int64_t ms = RG_MIN((int64_t)AGENT_CUT_OFF_WAIT_MS << RG_MIN(ag->cut_offs, 4),
                        (int64_t)AGENT_CUT_OFF_WAIT_MAX_MS);
    ag->cut_offs++;
    fprintf(stderr, "regroup: this node was cut off from its peers; it joins the job again in "
            "%lld ms\n", (long long)ms);
    rg_deadline_t until = rg_deadline_in_ms(ms);
    while (!rg_deadline_passed(until)) {
        struct pollfd pfd = {.fd = ag->sigfd, .events = POLLIN};
        int n = poll(&pfd, 1, (int)RG_MAX(1, rg_deadline_left_ms(until)));
        bool child = false;
        if (n > 0 && read_signals(ag, &child)) {
            return false;
        }
    }
    return true;
}

static round_end_t run_round(agent_t *ag, const rg_rdzv_assignment_t *asg, bool resume)
{
    const rg_agent_params_t *cfg = ag->cfg;
    launcher_spawn_t sp = {.cfg = cfg, .asg = asg, .endpoints = ag->endpoints,
                           .local_addr = ag->local_addr, .log_dir = ag->log_dir,
                           .notice_fd = ag->notice.fd, .beat_fd = ag->beat.fd,
                           .agent = rg_rdzv_agent_id(ag->rdzv),
                           .lease = rg_rdzv_lease_id(ag->rdzv), .pipe_fd = ag->ip.pipe_w,
                           .table_fds = ag->ip.table_fd, .n_table_fds = ag->ip.n_table};
    rg_status_t st;

    launcher_leave_t lv;

    rg_log_set_identity(asg->rank_offset, asg->round);
    ag->restart_count = asg->restart_count;
    launcher_leave_init(&lv, cfg, &ag->ws, ag->rdzv, &ag->notice, asg);
    if (resume) {
        launcher_inplace_assign(&ag->ip, &ag->ws, &ag->notice, asg,
                                rg_rdzv_lease_id(ag->rdzv));
        rg_info("round %d: %d workers carry on in place (ranks from %d, world %d, restart %d)",
                asg->round, launcher_inplace_members(&ag->ip, &ag->ws), asg->rank_offset,
                asg->world_size, asg->restart_count);
        if (ag->ip.term_end_ms == 0 && inplace_respawn_due(ag, &sp) != ROUND_IN_PLACE) {
            return ROUND_RESTART;   /* (a node that leaves, SIGTERMed while it rejoined,
                                       starts no replacement) */
        }
    } else {
        for (int i = 0; i < cfg->nproc; i++) {
            rg_beat_host_reset(&ag->beat, i);   /* armed by each new worker's first beat */
        }
        if (ag->ip.enabled) {
            /* Before they start: what the new workers say at once is theirs to keep. */
            launcher_inplace_reset(&ag->ip, cfg->nproc);
        }
        st = launcher_workers_start(&ag->ws, &sp, &ag->child_mask);
        if (st != RG_OK) {
            ag->error = st;   /* "cannot run PROGRAM: why", "cannot start workers: fork: ..." */
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            launcher_workers_stop(&ag->ws, 0, SIGKILL, cfg);
            return ROUND_ERROR;
        }
        rg_info("round %d: started %d workers (ranks %d..%d of %d, restart %d)", asg->round,
                cfg->nproc, asg->rank_offset, asg->rank_offset + cfg->nproc - 1,
                asg->world_size, asg->restart_count);
        if (ag->ip.enabled) {   /* (their first group is made in rg_train_init) */
            launcher_inplace_assign(&ag->ip, &ag->ws, &ag->notice, asg,
                                    rg_rdzv_lease_id(ag->rdzv));
        }
    }
    launcher_preempt_t pn;
    if (launcher_watch_take(ag->watch, &pn)) {   /* it came while joining */
        launcher_leave_begin(&lv, pn.reason, pn.end_ms);
    }
    if (ag->ip.term_end_ms > 0) {   /* SIGTERM came while this node rejoined in place */
        launcher_leave_begin(&lv, "SIGTERM", ag->ip.term_end_ms);
        ag->ip.term_end_ms = 0;
    }
    const char *pending = NULL;   /* in place: a planned change waiting for the workers */
    for (;;) {
        struct pollfd pfd[AGENT_MAX_FDS];
        int n = 0;
        bool child = false;

        pfd[n++] = (struct pollfd){.fd = ag->sigfd, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = rg_rdzv_fd(ag->rdzv), .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = launcher_watch_fd(ag->watch), .events = POLLIN};
        if (ag->ip.pipe_r >= 0) {
            pfd[n++] = (struct pollfd){.fd = ag->ip.pipe_r, .events = POLLIN};
        }
        for (int i = 0; i < ag->ws.n; i++) {
            if (ag->ws.w[i].out_fd >= 0) {
                pfd[n++] = (struct pollfd){.fd = ag->ws.w[i].out_fd, .events = POLLIN};
            }
            if (ag->ws.w[i].err_fd >= 0) {
                pfd[n++] = (struct pollfd){.fd = ag->ws.w[i].err_fd, .events = POLLIN};
            }
        }
        if (poll(pfd, (nfds_t)n,
                 (int)launcher_leave_poll_ms(&lv, launcher_hang_tick_ms(cfg, agent_tick_ms(cfg)))) < 0 &&
            errno != EINTR) {
            ag->error = rg_error(RG_ESYS, "poll: %s", strerror(errno));
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
            return ROUND_ERROR;
        }
        for (int k = 3; k < n; k++) {
            if (pfd[k].revents != 0 && pfd[k].fd != ag->ip.pipe_r) {
                launcher_workers_pump(&ag->ws, pfd[k].fd, cfg);
            }
        }
        if (ag->ip.enabled) {
            launcher_inplace_read(&ag->ip, &ag->ws);
            if (ag->ip.restart_asked && lv.own) {
                /* This node leaves: it takes no part in the restart (its workers' last
                 * checkpoint is the one they took, or none could be); the nodes that stay
                 * find the same failure in their own regroup and ask for it themselves.
                 * Before, it restarted the job and trained on in fresh workers as if it
                 * had never been told to leave. */
                rg_info("leaving: a worker could not recover in place; this node leaves "
                        "rather than restart the job");
                launcher_leave_stop(&lv);   /* within what is left of the notice */
                return agent_left(ag, &lv);
            }
            if (ag->ip.dropped && !lv.own) {
                /* A worker found its agent no member of the job (its lease ran out): the
                 * others went on without this node. Its workers start again and join the
                 * running job as newcomers; the job does not restart for them. */
                return inplace_restart(ag, NULL);
            }
            if (ag->ip.restart_asked) {
                return inplace_restart(ag, "a worker could not recover in place");
            }
            if (ag->ip.unfit_lr >= 0) {
                unfit_leaves(ag, asg, &lv);
            }
            if (ag->ip.cut_lr >= 0 && !lv.own && cut_off_leaves(ag, asg)) {
                return ROUND_CUT_OFF;
            }
            if (ag->cut_offs > 0 && launcher_inplace_any_grouped(&ag->ip, &ag->ws)) {
                ag->cut_offs = 0;   /* back in a group: the next cut waits from the start */
            }
        }
        if (read_signals(ag, &child)) {
            if (ag->stop_signal != SIGTERM) {
                rg_info("signal %d: stopping workers", ag->stop_signal);
                launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                return ROUND_STOPPED;
            }
            /* SIGTERM: a preemption with the grace period as its notice. */
            launcher_leave_begin(&lv, "SIGTERM", rg_notice_now_ms() + cfg->grace_ms);
        }
        if (launcher_watch_take(ag->watch, &pn)) {
            launcher_leave_begin(&lv, pn.reason, pn.end_ms);
        }
        if (child) {
            int failed;
            int running = launcher_workers_reap(&ag->ws, &failed);
            bool more = false;
            if (failed >= 0 && !lv.own && await_own_stop(ag, &ag->ws.w[failed], &more)) {
                if (ag->stop_signal != SIGTERM) {
                    rg_info("signal %d: stopping workers", ag->stop_signal);
                    launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                    return ROUND_STOPPED;
                }
                launcher_leave_begin(&lv, "SIGTERM", rg_notice_now_ms() + cfg->grace_ms);
            }
            if (more) {
                int also;
                running = launcher_workers_reap(&ag->ws, &also);
            }
            if (failed >= 0 && lv.own && ag->ip.enabled &&
                ag->ip.state[failed] != INPLACE_IN_ROUND &&
                launcher_inplace_in_round(&ag->ip, &ag->ws) > 0) {
                /* A replacement in no round ended while this node leaves (stopped with the
                 * notice, whose page it did not read yet): it held nothing, and the round's
                 * workers are still taking their last checkpoint. Before, its end ended the
                 * leaving, and they were stopped without one. */
                launcher_workers_drain(&ag->ws, failed, cfg);
                rg_info("leaving: local rank %d, a replacement in no round, ended; the "
                        "round's %d worker(s) finish their last checkpoint", failed,
                        launcher_inplace_in_round(&ag->ip, &ag->ws));
                failed = -1;
            }
            /* In place, only this node's own leaving excuses a failure: the others replace
             * a failed worker as always (a lost peer is no failure of theirs in place). */
            if (failed >= 0 && (lv.own || !ag->ip.enabled) && launcher_leave_explains(&lv)) {
                /* Part of a node's leaving (a peer gone, too little time to save): not a
                 * failure of the job, and not counted against --max-restarts. */
                launcher_worker_t *fw = &ag->ws.w[failed];
                launcher_workers_drain(&ag->ws, failed, cfg);
                fprintf(stderr, "regroup: worker rank %d ended (status 0x%x) while %s leaves; "
                        "not counted as a failure\n", fw->rank, fw->wstatus,
                        lv.own ? "this node" : "another node");
                launcher_leave_stop(&lv);
                return agent_left(ag, &lv);
            }
            if (failed >= 0 && ag->ip.enabled) {
                round_end_t end = inplace_replace(ag, asg);
                if (end != ROUND_SUCCEEDED) {
                    return end;
                }
            } else if (failed >= 0) {
                rg_rdzv_failure_t f;
                char err[8192];
                char tail[4096];
                launcher_workers_drain(&ag->ws, failed, cfg);
                launcher_workers_failure(&ag->ws, failed, &f, err, sizeof(err), tail,
                                         sizeof(tail));
                fprintf(stderr, "regroup: worker rank %d failed (%s %d)\n",
                        f.rank, f.signal ? "signal" : "exit code",
                        f.signal ? f.signal : f.exit_code);
                st = rg_rdzv_report_failure(ag->rdzv, &f);
                if (st != RG_OK) {
                    rg_warn("cannot record the failure in etcd: %s", rg_last_error());
                }
                launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                return ROUND_RESTART;
            }
            if (running > 0 && lv.own && ag->ip.enabled &&
                launcher_inplace_in_round(&ag->ip, &ag->ws) == 0) {
                /* This node leaves and its round's workers are done (their last checkpoint
                 * taken): a replacement in no round yet holds nothing to save or wait for. */
                rg_info("leaving: stopping %d replacement(s) that joined no round", running);
                running = 0;
            }
            if (running > 0 && failed < 0 && ag->ip.enabled &&
                launcher_inplace_only_fresh(&ag->ip, &ag->ws)) {
                /* The workers finished the job while a replacement started: it has nothing
                 * to join (a round for it alone would find no state and restart the job). */
                rg_info("the workers finished: stopping %d replacement(s) that joined no "
                        "group", running);
                running = 0;
            }
            if (running == 0) {
                launcher_workers_stop(&ag->ws, 0, SIGKILL, cfg);   /* closes pipes and logs */
                if (launcher_leave_excused(&lv)) {
                    /* their last checkpoint taken: the job goes on (without a node) */
                    return agent_left(ag, &lv);
                }
                return ROUND_SUCCEEDED;
            }
        }
        if (launcher_leave_expired(&lv)) {
            launcher_leave_stop(&lv);
            return agent_left(ag, &lv);
        }
        (void)launcher_hang_check(&ag->ws, &ag->beat, cfg);   /* reaped at the next look */
        rg_rdzv_change_t change;
        st = rg_rdzv_check(ag->rdzv, &change);
        if (st != RG_OK) {
            rg_warn("rendezvous check failed (%s); will look again", rg_last_error());
            continue;
        }
        if (change != RG_RDZV_LEASE_LOST) {
            rg_notice_heartbeat(&ag->notice);   /* still a live member of the job */
        }
        launcher_leave_others(&lv);
        if (change != RG_RDZV_NONE && launcher_leave_holds(&lv, change)) {
            continue;   /* the workers' last checkpoint first */
        }
        if (change != RG_RDZV_NONE) {
            static const char *const why[] = {"", "a worker failed on another node",
                                              "a node was lost", "a node is waiting to join",
                                              "another agent opened a new round",
                                              "this agent's lease was lost",
                                              "the other members finished the job"};
            if (ag->ip.enabled && !lv.own && change == RG_RDZV_JOIN_PENDING) {
                /* A node that waits to join below the maximum size (in place, one whose
                 * newcomers could not join): fresh workers that hold no state, so the job
                 * takes the restart path. A node joins in place by opening the next round
                 * with its newcomers ready (launcher_inplace_newcomers) instead, or at the
                 * maximum size by waiting with them ready for a round with room. */
                rg_info("round %d ends: %s (restarting: a node waits to join)",
                        asg->round, why[change]);
                return inplace_restart(ag, "a node joins");
            }
            if (ag->ip.enabled && !lv.own && change == RG_RDZV_OTHERS_DONE) {
                return others_done(ag, asg);
            }
            if (ag->ip.enabled && !lv.own && change == RG_RDZV_MEMBER_LOST) {
                return inplace_change(ag, asg, why[change], false);
            }
            if (ag->ip.enabled && !lv.own && change == RG_RDZV_NEW_ROUND) {
                pending = why[change];
            } else {
                rg_info("round %d ends: %s", asg->round, why[change]);
                launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                return lv.own ? agent_left(ag, &lv) : ROUND_RESTART;
            }
        }
        if (ag->ip.enabled && ag->ip.ready_seen && pending == NULL && !lv.own) {
            /* (not while this node leaves: its notice is the preemption, and a regroup
             * would take its place on the page) */
            pending = "a replacement worker is ready";
        }
        if (ag->ip.enabled && ag->ip.regroup_asked && pending == NULL && !lv.own) {
            pending = "a worker's group failed with no member lost";
        }
        /* A planned change waits until this node's workers are in the round assigned, so
         * that none skips the round its peers are building (bounded). */
        if (pending != NULL && launcher_inplace_settled(&ag->ip, &ag->ws)) {
            return inplace_change(ag, asg, pending, true);
        }
    }
}

/* In place, the job runs without this node (rg_rdzv_join's RG_EAGAIN, asg the round
 * running): this node's workers start as newcomers, outside any round, and join once ready;
 * the running members go on meanwhile. At the job's maximum size they wait, ready, for the
 * first round with room (a node lost or leaving): the join registers this node as waiting,
 * and the round the members form without the lost node expects it. */
static launcher_inplace_end_t join_as_newcomers(agent_t *ag, const rg_rdzv_assignment_t *asg)
{
    launcher_spawn_t sp = {.cfg = ag->cfg, .asg = asg, .endpoints = ag->endpoints,
                           .local_addr = ag->local_addr, .log_dir = ag->log_dir,
                           .notice_fd = ag->notice.fd, .beat_fd = ag->beat.fd,
                           .agent = rg_rdzv_agent_id(ag->rdzv),
                           .lease = rg_rdzv_lease_id(ag->rdzv), .pipe_fd = ag->ip.pipe_w,
                           .table_fds = ag->ip.table_fd, .n_table_fds = ag->ip.n_table,
                           .join = true};
    launcher_inplace_env_t e = {.cfg = ag->cfg, .rdzv = ag->rdzv, .sigfd = ag->sigfd,
                                .ws = &ag->ws, .notice = &ag->notice, .ip = &ag->ip,
                                .beat = &ag->beat};
    for (int i = 0; i < ag->cfg->nproc; i++) {
        rg_beat_host_reset(&ag->beat, i);   /* armed by each newcomer's first beat */
    }
    rg_log_set_identity(-1, asg->round);
    launcher_inplace_end_t ie = launcher_inplace_newcomers(&e, &sp, &ag->child_mask,
                                                           &ag->stop_signal);
    if (ie == INPLACE_JOINED && asg->n_members >= ag->cfg->max_nodes) {
        fprintf(stderr, "regroup: the job runs at its maximum size (%d nodes): this node's "
                "newcomers are ready and wait for room (a node that leaves)\n",
                ag->cfg->max_nodes);
    } else if (ie == INPLACE_JOINED &&
               rg_rdzv_open_round_after(ag->rdzv, asg->round) != RG_OK) {
        rg_warn("cannot open the round after %d for this node's newcomers (%s); joining "
                "anyway", asg->round, rg_last_error());
    }
    return ie;
}

/* Rounds until the job ends for this node. */
static rg_status_t agent_loop(agent_t *ag)
{
    const rg_agent_params_t *cfg = ag->cfg;
    rg_rdzv_assignment_t *asg = malloc(sizeof(*asg));
    rg_status_t st;

    if (asg == NULL) {
        fprintf(stderr, "regroup: out of memory\n");
        return rg_error(RG_ENOMEM, "rendezvous assignment");
    }
    bool resume = false;
    bool newcomers_failed = false;   /* this node's newcomers could not join in place */
    for (;;) {
        if (resume) {
            launcher_inplace_env_t e = {.cfg = cfg, .rdzv = ag->rdzv, .sigfd = ag->sigfd,
                                        .ws = &ag->ws, .notice = &ag->notice, .ip = &ag->ip,
                                        .beat = &ag->beat};
            int ran = asg->round;   /* the round the workers are in */
            launcher_inplace_end_t ie = launcher_inplace_rejoin(&e, asg, &ag->stop_signal);
            if (ie != INPLACE_JOINED && ag->ip.term_end_ms > 0) {
                ie = INPLACE_STOPPED;   /* no round to leave from: SIGTERM stops the node */
            }
            bool asked = false;
            if (ie == INPLACE_JOINED && !asg->job_failed && !asg->job_done &&
                rg_rdzv_restart_requested(ag->rdzv, ran, &asked) == RG_OK && asked) {
                rg_info("round %d: another agent asked for a restart", asg->round);
                (void)inplace_restart(ag, NULL);
                resume = false;
                st = rg_rdzv_next_round(ag->rdzv);
                if (st != RG_OK) {
                    rg_warn("cannot open the next round (%s); joining anyway", rg_last_error());
                }
                continue;
            }
            if (ie == INPLACE_STOPPED) {
                rg_info("signal %d: stopping workers", ag->stop_signal);
                launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                break;
            }
            if (ie == INPLACE_ERROR) {
                st = ag->ip.error;
                launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                break;
            }
            if (ie == INPLACE_RESTART && ag->ip.dropped) {
                /* The job went on without this node: its workers' state is of a round the
                 * others left. They start again, and join as newcomers; the job does not
                 * restart for them (chaos' partition in place restarted every survivor). */
                rg_info("this node was left out of the job (its lease ran out): its workers "
                        "start again and join the running job");
                (void)inplace_restart(ag, NULL);
                resume = false;
                continue;
            }
            if (ie == INPLACE_RESTART) {
                (void)inplace_restart(ag, "in-place recovery failed during a join");
                resume = false;
                continue;
            }
            st = RG_OK;
        } else {
            rg_rdzv_set_nproc(ag->rdzv, cfg->nproc);   /* fresh workers: all of them */
            rg_rdzv_set_join_running(ag->rdzv, ag->ip.enabled && !newcomers_failed);
            st = rg_rdzv_join(ag->rdzv, launcher_watch_join_fd(ag->watch, ag->sigfd), asg);
            rg_rdzv_set_join_running(ag->rdzv, false);
            if (st == RG_EAGAIN) {
                launcher_inplace_end_t ie = join_as_newcomers(ag, asg);
                if (ie == INPLACE_JOINED) {
                    resume = true;   /* the next round, with them (launcher_inplace_rejoin) */
                    continue;
                }
                launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
                if (ie == INPLACE_STOPPED) {
                    rg_info("signal %d: stopping workers", ag->stop_signal);
                    break;
                }
                if (ie == INPLACE_ERROR) {
                    st = ag->ip.error;
                    break;
                }
                newcomers_failed = true;   /* join as a restart-mode node would */
                continue;
            }
        }
        if (st == RG_ECANCELED) {
            bool child = false;
            launcher_preempt_t pn;
            if (read_signals(ag, &child)) {
                break;
            }
            if (launcher_watch_take(ag->watch, &pn)) {
                /* no workers to save anything: the node leaves now */
                launcher_watch_ack(ag->watch);
                fprintf(stderr, "regroup: this node left the job before joining it (%s)\n",
                        pn.reason);
                st = RG_OK;
                break;
            }
            continue;   /* only SIGCHLD of an old worker: join again */
        }
        if (st != RG_OK) {
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            break;
        }
        ag->restart_count = asg->restart_count;
        if (asg->excused_count > ag->excused_count) {
            fprintf(stderr, "regroup: round %d: the last worker failure is not counted "
                    "against --max-restarts=%d: a node of that round was lost (restarts %d)\n",
                    asg->round, cfg->max_restarts, asg->restart_count);
            ag->excused_count = asg->excused_count;
        }
        if (asg->job_done && resume && launcher_inplace_any_grouped(&ag->ip, &ag->ws)) {
            /* Workers that were in a group may be finishing the job with the others (their
             * agents recorded done first): the grace period to end on their own. */
            (void)launcher_workers_wait(&ag->ws, cfg->grace_ms);
        }
        if ((asg->job_done || asg->job_failed) && resume) {
            launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
        }
        if (asg->job_done) {
            fprintf(stderr, "regroup: the job finished without this node\n");
            st = RG_OK;
            break;
        }
        if (asg->job_failed) {
            fprintf(stderr, "regroup: the job failed more than --max-restarts=%d times\n",
                    cfg->max_restarts);
            rg_rdzv_print_failures(ag->rdzv, stderr);
            char limit[256];
            rg_agent_params_label(cfg, RG_AGENT_MAX_RESTARTS, limit, sizeof(limit));
            st = rg_error(RG_EJOBFAILED, "the workers failed more than %s times", limit);
            break;
        }
        round_end_t end = run_round(ag, asg, resume);
        resume = end == ROUND_IN_PLACE;
        if (resume) {
            continue;
        }
        if (end == ROUND_SUCCEEDED || end == ROUND_JOB_DONE) {
            st = rg_rdzv_done(ag->rdzv);   /* a member of the round: for any latecomer */
            if (st != RG_OK) {
                rg_warn("cannot record completion: %s", rg_last_error());
            }
            if (end == ROUND_JOB_DONE) {
                fprintf(stderr, "regroup: the job finished without this node\n");
            } else {
                rg_info("workers finished successfully");
            }
            st = RG_OK;
            break;
        }
        if (end == ROUND_STOPPED) {
            break;
        }
        if (end == ROUND_LEFT) {
            launcher_watch_ack(ag->watch);
            fprintf(stderr, "regroup: this node left the job (%s)\n", ag->left_why);
            st = RG_OK;
            break;
        }
        if (end == ROUND_ERROR) {
            st = ag->error;   /* with run_round's message */
            break;
        }
        if (end == ROUND_CUT_OFF) {
            if (!cut_off_wait(ag)) {
                rg_info("signal %d while cut off: stopping", ag->stop_signal);
                break;
            }
            continue;   /* join again: the job runs without this node, which joins it */
        }
        st = rg_rdzv_next_round(ag->rdzv);
        if (st != RG_OK) {
            rg_warn("cannot open the next round (%s); joining anyway", rg_last_error());
        }
    }
    if (ag->stop_signal != 0) {
        st = rg_error(RG_ECANCELED, "stopped by signal %d", ag->stop_signal);
    }
    free(asg);
    return st;
}

/* The private etcd of a single-node job; its endpoints into ag. */
static rg_status_t start_private_etcd(agent_t *ag, rg_etcd_server_t **etcd_p)
{
    rg_etcd_server_t *etcd = calloc(1, sizeof(*etcd));
    /* Fast raft timing: a private single-member etcd can expire leases in 1 s. */
    if (etcd == NULL ||
        rg_etcd_server_start(etcd, "--heartbeat-interval=10 --election-timeout=100") != 0) {
        free(etcd);
        rg_error_wrap(RG_EUNREACH, "--standalone: cannot start etcd");
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        return RG_EUNREACH;
    }
    snprintf(ag->endpoints, sizeof(ag->endpoints), "%s", etcd->endpoints);
    rg_info("--standalone: private etcd at %s (pid %d, data %s)", etcd->endpoints,
            (int)etcd->pid[0], etcd->root);
    *etcd_p = etcd;
    return RG_OK;
}

static bool is_loopback_endpoint(const char *ep)
{
    return strstr(ep, "127.") != NULL || strstr(ep, "localhost") != NULL ||
           strstr(ep, "[::1]") != NULL;
}

static void resolve_local_addr(agent_t *ag)
{
    const rg_agent_params_t *cfg = ag->cfg;
    if (cfg->local_addr[0] != '\0') {
        snprintf(ag->local_addr, sizeof(ag->local_addr), "%s", cfg->local_addr);
    } else if (cfg->standalone || is_loopback_endpoint(cfg->endpoint) ||
               gethostname(ag->local_addr, sizeof(ag->local_addr)) != 0) {
        snprintf(ag->local_addr, sizeof(ag->local_addr), "127.0.0.1");
    }
}

/* torchrun's way with --redirects or --tee and no --log-dir: a temporary directory, said once
 * and kept after the job, since the output sent there is nowhere else. */
static rg_status_t make_log_dir(agent_t *ag)
{
    const rg_agent_params_t *cfg = ag->cfg;
    char label[600];

    snprintf(ag->log_dir, sizeof(ag->log_dir), "%s", cfg->log_dir);
    if (cfg->log_dir[0] != '\0' || !launcher_needs_log_dir(cfg)) {
        return RG_OK;
    }
    snprintf(ag->log_dir, sizeof(ag->log_dir), "%s/regroup-logs-%s-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", cfg->job);
    if (mkdtemp(ag->log_dir) == NULL) {
        rg_status_t st = rg_error(RG_ESYS, "cannot create %s: %s", ag->log_dir, strerror(errno));
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        return st;
    }
    rg_agent_params_label(cfg, cfg->tee != 0 ? RG_AGENT_TEE : RG_AGENT_REDIRECTS, label,
                          sizeof(label));
    fprintf(stderr, "regroup: %s without --log-dir: the workers' logs go to %s (kept after the "
            "job)\n", label, ag->log_dir);
    return RG_OK;
}

static rg_status_t agent_main(agent_t *ag)
{
    const rg_agent_params_t *cfg = ag->cfg;
    rg_etcd_server_t *etcd = NULL;
    rg_status_t st;

    resolve_local_addr(ag);
    st = make_log_dir(ag);
    if (st != RG_OK) {
        return st;
    }
    if (cfg->standalone) {
        st = start_private_etcd(ag, &etcd);
        if (st != RG_OK) {
            return st;
        }
    } else if (cfg->backend == RG_AGENT_BACKEND_C10D) {
        st = launcher_c10d_serve(cfg, ag->endpoints, sizeof(ag->endpoints), &etcd);
        if (st != RG_OK) {
            return st;
        }
    } else {
        snprintf(ag->endpoints, sizeof(ag->endpoints), "%s", cfg->endpoint);
    }
    snprintf(ag->ws.run_dir, sizeof(ag->ws.run_dir), "%s/regroup-%s-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", cfg->job);
    if (mkdtemp(ag->ws.run_dir) == NULL) {
        st = rg_error(RG_ESYS, "cannot create %s: %s", ag->ws.run_dir, strerror(errno));
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        ag->ws.run_dir[0] = '\0';
        goto out;
    }
    st = rg_notice_host_create(&ag->notice, cfg->lease_ttl_s * 1000);
    if (st == RG_OK && cfg->hang_ms > 0) {
        st = rg_beat_host_create(&ag->beat, cfg->nproc);
    }
    if (st == RG_OK) {
        st = launcher_inplace_open(&ag->ip, cfg);
    }
    if (st != RG_OK) {
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        goto out;
    }
    rg_rdzv_params_t p = {
        .etcd = launcher_etcd_params(cfg, ag->endpoints),
        .job = cfg->job,
        .addr = ag->local_addr,
        .nproc = cfg->nproc,
        .min_nodes = cfg->min_nodes,
        .max_nodes = cfg->max_nodes,
        .lease_ttl_s = cfg->lease_ttl_s,
        .last_call_ms = cfg->last_call_ms,
        .join_timeout_ms = cfg->join_timeout_ms,
        .max_restarts = cfg->max_restarts,
        .in_place = cfg->recovery == RG_AGENT_RECOVERY_IN_PLACE,
    };
    st = rg_rdzv_create(&p, &ag->rdzv);
    if (st != RG_OK) {
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        goto out;
    }
    st = launcher_watch_start(cfg->notice, &ag->watch);
    if (st != RG_OK) {
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        goto out;
    }
    st = agent_loop(ag);
    /* Leaving on purpose: the others regroup now instead of after the lease TTL. The loop's
     * message is what the caller reads, not this one's. */
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", rg_last_error());
    if (rg_rdzv_leave(ag->rdzv) != RG_OK) {
        rg_warn("cannot revoke the lease: %s", rg_last_error());
    }
    if (st != RG_OK) {
        rg_error(st, "%s", msg);
    }
out:
    launcher_watch_stop(ag->watch);
    ag->watch = NULL;
    rg_rdzv_destroy(ag->rdzv);
    rg_notice_host_destroy(&ag->notice);
    rg_beat_host_destroy(&ag->beat);
    launcher_inplace_close(&ag->ip);
    if (etcd != NULL) {
        /* The rendezvous this agent serves outlives its own part of the job until the other
         * agents have left (torchrun's exit barrier), unless a signal stopped this agent. */
        if (!cfg->standalone && ag->stop_signal == 0) {
            launcher_c10d_linger(etcd, ag->sigfd);
        }
        rg_info("stopping the etcd at %s (pid %d)", etcd->endpoints, (int)etcd->pid[0]);
        rg_etcd_server_stop(etcd);
        free(etcd);
    }
    if (ag->ws.run_dir[0] != '\0' && !rg_rm_tree(ag->ws.run_dir)) {
        rg_warn("cannot remove the run directory %s", ag->ws.run_dir);
    }
    rg_log_set_identity(-1, -1);   /* the rounds' identity is not the caller's */
    return st;
}

rg_status_t rg_agent_run(const rg_agent_params_t *cfg, rg_agent_result_t *result)
{
    agent_t *ag;
    sigset_t block;
    sigset_t old_mask;
    struct sigaction old_pipe;
    struct sigaction ign = {.sa_handler = SIG_IGN};
    rg_status_t st = rg_agent_params_check(cfg);

    if (result != NULL) {
        *result = (rg_agent_result_t){.status = st, .exit_code = st == RG_OK ? 0 : 2};
    }
    if (st != RG_OK) {
        return st;
    }
    ag = calloc(1, sizeof(*ag));   /* the workers' table is large for a stack */
    if (ag == NULL) {
        st = rg_error(RG_ENOMEM, "agent");
        goto done;
    }
    ag->cfg = cfg;
    ag->sigfd = -1;
    ag->notice.fd = -1;
    ag->beat.fd = -1;
    ag->ip.pipe_r = ag->ip.pipe_w = -1;
    /* Signals arrive through the signalfd; block them before any thread starts so that
     * every thread (curl's, the lease keeper's, the watch's) inherits the mask. */
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask);
    ag->child_mask = old_mask;
    sigdelset(&ag->child_mask, SIGCHLD);
    sigdelset(&ag->child_mask, SIGTERM);
    sigdelset(&ag->child_mask, SIGINT);
    sigdelset(&ag->child_mask, SIGHUP);
    sigaction(SIGPIPE, &ign, &old_pipe);
    ag->sigfd = signalfd(-1, &block, SFD_CLOEXEC | SFD_NONBLOCK);
    if (ag->sigfd < 0) {
        st = rg_error(RG_ESYS, "signalfd: %s", strerror(errno));
        fprintf(stderr, "regroup: %s\n", rg_last_error());
    } else {
        /* First: the modules of --preload import while the rendezvous goes on. */
        st = launcher_workers_fork_start(&ag->ws, cfg, &ag->child_mask);
        if (st == RG_OK) {
            st = agent_main(ag);
        } else {
            fprintf(stderr, "regroup: %s\n", rg_last_error());
        }
        launcher_fork_stop(&ag->ws.fork);
        close(ag->sigfd);
    }
    sigaction(SIGPIPE, &old_pipe, NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
done:
    if (result != NULL) {
        result->status = st;
        result->signal = ag ? ag->stop_signal : 0;
        result->restart_count = ag ? ag->restart_count : 0;
        result->exit_code = st == RG_OK ? 0 : result->signal ? 128 + result->signal : 1;
    }
    free(ag);
    return st;
}
