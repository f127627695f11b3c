/*
 * In-place recovery on the agent's side (--recovery=in-place).
 *
 * The agent does not stop its surviving workers when a member fails, leaves or joins: it
 * joins the next round while they live, and tells them where they are in it through the
 * notice page's assignment (rg_notice_assign: the round, the world size and each local
 * rank's global rank). The workers rebuild their group from that (rg_train_regroup).
 *
 *   - A worker of this node dies: the agent records the failure (it counts against
 *     --max-restarts as in restart mode), starts a replacement for that local rank at once
 *     ($REGROUP_INPLACE_JOIN=1: it is in no round yet), and joins the next round without it.
 *     The survivors carry on at the smaller size; once the replacement says it is ready (a
 *     message on the pipe below), the agent joins one more round with it while they train
 *     on; the assignment on the page makes them regroup at their next step boundary.
 *   - A node joins the running job: its agent starts its workers as newcomers (in no round,
 *     as replacements are), waits until every one is ready, then opens the next round and
 *     joins it with them (launcher_inplace_newcomers); the members go on meanwhile. At the
 *     job's maximum size it opens none: it waits as a waiting node, its newcomers ready,
 *     and the round the members form once a node is lost or leaves takes it in.
 *   - A member is lost: the agent posts a MEMBERS notice (so that its workers regroup at the
 *     next step boundary, if no collective failed first) and joins the next round. Another
 *     agent opens a round (a replacement or a node is ready elsewhere): the agent joins it,
 *     its workers training on until it assigns them their ranks there (rg_report's agreement
 *     sees a newer round on the page, and every rank regroups at that step).
 *
 * Ranks in a round: nodes in the close policy's order (previous members keep their order, a
 * lost node's ranks are closed up), and within a node the local ranks taking part, in order:
 * a node's rank_offset plus the index among them. So a survivor's rank is stable unless a
 * worker or node before it left.
 *
 * The workers talk back through one pipe per agent (rg_notice_msg_send, 4-byte messages,
 * atomic): 'A' when a worker's context is made by a program that regroups in place, 'R' when a
 * replacement is ready, 'X' when in-place recovery failed for a worker (no member holds the
 * state, a deadline passed). A worker that never said 'A' does not use libregroup's worker
 * API (or not rg_train_regroup): at the first failure or change the job then recovers as in
 * restart mode, with a warning. The restart path is job-wide (rg_rdzv_request_restart): every
 * agent stops its workers and the job resumes from its last checkpoint.
 *
 * While the agent joins a round its workers live: the join is interrupted by the signalfd,
 * the workers' pipes and a timer of a quarter of the lease TTL, so that the agent keeps
 * renewing its heartbeat on the page (while its lease is alive), pumping the workers' output
 * and reaping them. The whole join keeps the join timeout as its deadline.
 */
#include "launcher.h"

#include "rg_notice.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* One fd that is readable whenever something needs the agent while it joins: the signals,
 * the workers' output and messages, and a timer of `tick` ms for the heartbeat. */
static int join_fds(const launcher_inplace_env_t *e, int64_t tick, int *timer)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct itimerspec its = {.it_interval = {.tv_sec = tick / 1000,
                                             .tv_nsec = (tick % 1000) * 1000000},
                             .it_value = {.tv_sec = tick / 1000,
                                          .tv_nsec = (tick % 1000) * 1000000}};
    int fds[3 + 2 * LAUNCHER_MAX_NPROC];
    int n = 0;

    *timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (ep < 0 || *timer < 0 || timerfd_settime(*timer, 0, &its, NULL) != 0) {
        rg_error(RG_ESYS, "--recovery=in-place: epoll/timerfd: %s", strerror(errno));
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        if (ep >= 0) {
            close(ep);
        }
        if (*timer >= 0) {
            close(*timer);
        }
        return -1;
    }
    fds[n++] = e->sigfd;
    fds[n++] = *timer;
    fds[n++] = e->ip->pipe_r;
    for (int i = 0; i < e->ws->n; i++) {
        fds[n++] = e->ws->w[i].out_fd;
        fds[n++] = e->ws->w[i].err_fd;
    }
    for (int k = 0; k < n; k++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[k]};
        if (fds[k] >= 0) {
            (void)epoll_ctl(ep, EPOLL_CTL_ADD, fds[k], &ev);
        }
    }
    return ep;
}

rg_status_t launcher_inplace_open(launcher_inplace_t *ip, const rg_agent_params_t *cfg)
{
    int fds[2];

    memset(ip, 0, sizeof(*ip));
    ip->pipe_r = ip->pipe_w = -1;
    ip->unfit_lr = -1;
    ip->cut_lr = -1;
    ip->enabled = cfg->recovery == RG_AGENT_RECOVERY_IN_PLACE;
    if (!ip->enabled) {
        return RG_OK;
    }
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        return rg_error(RG_ESYS, "--recovery=in-place: pipe: %s", strerror(errno));
    }
    ip->pipe_r = fds[0];
    ip->pipe_w = fds[1];
    rg_status_t st = rg_table_slots_create(cfg->nproc, ip->table_fd);
    if (st != RG_OK) {
        launcher_inplace_close(ip);
        return st;
    }
    ip->n_table = cfg->nproc;
    return RG_OK;
}

void launcher_inplace_close(launcher_inplace_t *ip)
{
    if (ip->pipe_r >= 0) {
        close(ip->pipe_r);
    }
    if (ip->pipe_w >= 0) {
        close(ip->pipe_w);
    }
    ip->pipe_r = ip->pipe_w = -1;
    rg_table_slots_close(ip->n_table, ip->table_fd);
    ip->n_table = 0;
}

void launcher_inplace_reset(launcher_inplace_t *ip, int nproc)
{
    unsigned char buf[256];
    for (int i = 0; i < nproc && i < LAUNCHER_MAX_NPROC; i++) {
        ip->state[i] = INPLACE_IN_ROUND;
        ip->capable[i] = false;
        ip->joined[i] = false;
        ip->fresh[i] = false;
    }
    ip->restart_asked = false;
    ip->ready_seen = false;
    ip->regroup_asked = false;
    ip->unfit_lr = -1;
    ip->cut_lr = -1;
    ip->dropped = false;
    /* What the stopped workers wrote is about them, not about the new ones. */
    for (int k = 0; k < 64 && ip->pipe_r >= 0 && read(ip->pipe_r, buf, sizeof(buf)) > 0; k++) {
    }
}

void launcher_inplace_read(launcher_inplace_t *ip, const launcher_workers_t *ws)
{
    unsigned char buf[4 * 64];

    if (ip->pipe_r < 0) {
        return;
    }
    /* Bounded: 64 reads of 64 messages per call, the rest at the next one. */
    for (int k = 0; k < 64; k++) {
        ssize_t n = read(ip->pipe_r, buf, sizeof(buf));
        if (n <= 0) {
            break;
        }
        for (ssize_t o = 0; o + 4 <= n; o += 4) {
            rg_notice_msg_t msg;
            int lr;
            if (!rg_notice_msg_decode(buf + o, &msg, &lr) || lr >= ws->n) {
                rg_warn("--recovery=in-place: a message from a worker that is none of ours");
                continue;
            }
            if (msg == RG_NOTICE_MSG_INPLACE) {
                ip->capable[lr] = true;
                ip->joined[lr] = ip->state[lr] == INPLACE_IN_ROUND;   /* its first group */
            } else if (msg == RG_NOTICE_MSG_JOINED) {
                ip->joined[lr] = true;
                ip->fresh[lr] = false;
            } else if (msg == RG_NOTICE_MSG_REGROUP) {
                /* (Only from a worker in the group of the round assigned: one that asked
                 * before a newer assignment is in that round already.) */
                if (ip->state[lr] == INPLACE_IN_ROUND && ip->joined[lr] && !ip->regroup_asked) {
                    rg_info("local rank %d (pid %d): its group failed with no member lost; "
                            "asking for the next round", lr, (int)ws->w[lr].pid);
                    ip->regroup_asked = true;
                }
            } else if (msg == RG_NOTICE_MSG_LEFT_OUT) {
                rg_warn("local rank %d (pid %d): the job went on without this node; its "
                        "workers start again and join it", lr, (int)ws->w[lr].pid);
                ip->dropped = true;
            } else if (msg == RG_NOTICE_MSG_CUT_OFF) {
                if (ip->state[lr] == INPLACE_IN_ROUND && ip->cut_lr < 0) {
                    ip->cut_lr = lr;
                }
            } else if (msg == RG_NOTICE_MSG_STRAGGLER || msg == RG_NOTICE_MSG_HEALTH) {
                if (ip->state[lr] == INPLACE_IN_ROUND && ip->unfit_lr < 0) {
                    ip->unfit_lr = lr;
                    ip->unfit_msg = msg;
                }
            } else if (msg == RG_NOTICE_MSG_READY) {
                if (ip->state[lr] == INPLACE_PENDING) {
                    rg_info("local rank %d (pid %d): the replacement is ready to join", lr,
                            (int)ws->w[lr].pid);
                    ip->state[lr] = INPLACE_READY;
                    ip->ready_seen = true;
                }
            } else {
                rg_warn("local rank %d (pid %d) could not recover in place: restarting the job",
                        lr, (int)ws->w[lr].pid);
                ip->restart_asked = true;
            }
        }
    }
}

bool launcher_inplace_capable(const launcher_inplace_t *ip, const launcher_workers_t *ws,
                              char *why, size_t len)
{
    for (int i = 0; i < ws->n; i++) {
        /* (A replacement still starting is in no round and holds nothing: it replaces a
         * worker that said it regroups in place, and joins once ready.) */
        if (ws->w[i].running && ip->state[i] != INPLACE_EXITED &&
            ip->state[i] != INPLACE_PENDING && !ip->capable[i]) {
            snprintf(why, len, "local rank %d (pid %d) does not regroup in place (a program "
                     "that does not use libregroup's rg_train_regroup, or not started yet)",
                     i, (int)ws->w[i].pid);
            return false;
        }
    }
    return true;
}

bool launcher_inplace_settled(const launcher_inplace_t *ip, const launcher_workers_t *ws)
{
    if (rg_now_ns() - ip->assigned_ns > LAUNCHER_INPLACE_SETTLE_MS * 1000000ull) {
        return true;
    }
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].running && ip->state[i] == INPLACE_IN_ROUND && !ip->joined[i]) {
            return false;
        }
    }
    return true;
}

int launcher_inplace_members(const launcher_inplace_t *ip, const launcher_workers_t *ws)
{
    int n = 0;
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].running &&
            (ip->state[i] == INPLACE_IN_ROUND || ip->state[i] == INPLACE_READY)) {
            n++;
        }
    }
    return n;
}

bool launcher_inplace_only_fresh(const launcher_inplace_t *ip, const launcher_workers_t *ws)
{
    bool done = false;
    for (int i = 0; i < ws->n; i++) {
        const launcher_worker_t *w = &ws->w[i];
        if (w->running && !ip->fresh[i]) {
            return false;
        }
        done = done || (!w->running && WIFEXITED(w->wstatus) && WEXITSTATUS(w->wstatus) == 0);
    }
    return done;
}

bool launcher_inplace_any_grouped(const launcher_inplace_t *ip, const launcher_workers_t *ws)
{
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].running && !ip->fresh[i]) {
            return true;
        }
    }
    return false;
}

int launcher_inplace_in_round(const launcher_inplace_t *ip, const launcher_workers_t *ws)
{
    int n = 0;
    for (int i = 0; i < ws->n; i++) {
        n += ws->w[i].running && ip->state[i] == INPLACE_IN_ROUND ? 1 : 0;
    }
    return n;
}

void launcher_inplace_assign(launcher_inplace_t *ip, launcher_workers_t *ws,
                             rg_notice_host_t *notice, const rg_rdzv_assignment_t *asg,
                             int64_t lease)
{
    int ranks[RG_NOTICE_MAX_LOCAL];
    bool pick[RG_NOTICE_MAX_LOCAL] = {false};
    int n = RG_MIN(ws->n, RG_NOTICE_MAX_LOCAL);
    /* The round closed with this node's count as it registered: a replacement that became
     * ready since is no member of it (the ranks after this node's are other nodes'), and
     * waits for the next round. Survivors first, then ready replacements, up to that count. */
    int quota = asg->group_rank >= 0 ? asg->members[asg->group_rank].nproc : 0;
    int k = 0;
    for (int pass = 0; pass < 2; pass++) {
        launcher_inplace_state_t want = pass == 0 ? INPLACE_IN_ROUND : INPLACE_READY;
        for (int i = 0; i < n && k < quota; i++) {
            if (ws->w[i].running && ip->state[i] == want) {
                pick[i] = true;
                k++;
            }
        }
    }
    bool ready_left = false;
    k = 0;
    for (int i = 0; i < n; i++) {
        ranks[i] = -1;
        if (pick[i]) {
            ip->state[i] = INPLACE_IN_ROUND;
            ip->joined[i] = false;
            ranks[i] = asg->rank_offset + k++;
            ws->w[i].rank = ranks[i];
        } else if (ws->w[i].running && ip->state[i] == INPLACE_READY) {
            ready_left = true;
        }
    }
    ip->ready_seen = ready_left;   /* (it is the next planned change) */
    ip->regroup_asked = false;
    ip->assigned_ns = rg_now_ns();
    rg_notice_assign(notice, asg->round, asg->world_size, asg->restart_count, ranks, ws->n,
                     lease);
}

/* One pass of what the agent does for its workers while it joins in place: the timer, the
 * workers' heartbeat on the page, their output and messages, the hang check, the signals
 * (*stop_signal for a stop signal). True if a worker ended (SIGCHLD). */
static bool serve_workers(const launcher_inplace_env_t *e, int timer, int *stop_signal)
{
    const rg_agent_params_t *cfg = e->cfg;
    uint64_t ticks;
    if (read(timer, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN) {
        rg_debug("timerfd: %s", strerror(errno));
    }
    rg_notice_heartbeat(e->notice);
    for (int i = 0; i < e->ws->n; i++) {
        if (e->ws->w[i].out_fd >= 0) {
            launcher_workers_pump(e->ws, e->ws->w[i].out_fd, cfg);
        }
        if (e->ws->w[i].err_fd >= 0) {
            launcher_workers_pump(e->ws, e->ws->w[i].err_fd, cfg);
        }
    }
    launcher_inplace_read(e->ip, e->ws);
    if (e->beat != NULL) {
        (void)launcher_hang_check(e->ws, e->beat, cfg);   /* reaped at the next look */
    }
    bool child = false;
    struct signalfd_siginfo si;
    for (int k = 0; k < 32 && read(e->sigfd, &si, sizeof(si)) == sizeof(si); k++) {
        if (si.ssi_signo == SIGCHLD) {
            child = true;
        } else {
            *stop_signal = (int)si.ssi_signo;
        }
    }
    return child;
}

/* Reaps during a join: true if a worker that is needed died (the caller restarts the job). */
static bool reap_during_join(const launcher_inplace_env_t *e)
{
    int failed;
    launcher_workers_reap(e->ws, &failed);
    for (int i = 0; i < e->ws->n; i++) {
        launcher_worker_t *w = &e->ws->w[i];
        if (!w->running && e->ip->state[i] != INPLACE_EXITED &&
            e->ip->state[i] != INPLACE_DUE) {
            if (WIFEXITED(w->wstatus) && WEXITSTATUS(w->wstatus) == 0) {
                e->ip->state[i] = INPLACE_EXITED;
                continue;
            }
            rg_warn("worker local rank %d (pid %d) failed while this node joined the next "
                    "round: restarting the job", i, (int)w->pid);
            return true;
        }
    }
    return false;
}

launcher_inplace_end_t launcher_inplace_rejoin(const launcher_inplace_env_t *e,
                                               rg_rdzv_assignment_t *asg, int *stop_signal)
{
    const rg_agent_params_t *cfg = e->cfg;
    rg_deadline_t deadline = rg_deadline_in_ms(cfg->join_timeout_ms);
    int64_t tick = launcher_hang_tick_ms(cfg, RG_MAX(1, RG_MIN(cfg->monitor_ms,
                                                               cfg->lease_ttl_s * 1000 / 4)));
    rg_status_t st;

    rg_rdzv_set_nproc(e->rdzv, launcher_inplace_members(e->ip, e->ws));
    st = rg_rdzv_next_round(e->rdzv);
    /* (A refusal here says nothing of this agent's membership: another agent may have opened
     * the round first. Only the workers' RG_NOTICE_MSG_LEFT_OUT does: e->ip->dropped.) */
    if (st != RG_OK) {
        rg_warn("cannot open the next round (%s); joining anyway", rg_last_error());
    }
    /* A pipe that is readable whenever something needs the agent while it joins: the
     * signals, the workers' output and messages, and the heartbeat's timer (a poll in a
     * helper thread would need a thread; an epoll set is one fd for the join to watch). */
    int timer;
    int ep = join_fds(e, tick, &timer);
    if (ep < 0) {
        e->ip->error = RG_ESYS;
        return INPLACE_ERROR;
    }
    launcher_inplace_end_t end = INPLACE_ERROR;
    for (int guard = 0; guard < 1 << 24; guard++) {
        st = rg_rdzv_join(e->rdzv, ep, asg);
        if (st == RG_OK) {
            end = INPLACE_JOINED;
            break;
        }
        if (st != RG_ECANCELED) {
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            e->ip->error = st;
            end = INPLACE_ERROR;
            break;
        }
        /* The lease is this node's membership: renew the workers' view of it only while it
         * is alive (rg_rdzv_check says LEASE_LOST otherwise). */
        rg_rdzv_change_t change = RG_RDZV_NONE;
        if (rg_rdzv_check(e->rdzv, &change) == RG_OK && change == RG_RDZV_LEASE_LOST) {
            rg_warn("this agent's lease was lost while joining: restarting the job");
            end = INPLACE_RESTART;
            break;
        }
        bool child = serve_workers(e, timer, stop_signal);
        if (*stop_signal == SIGTERM && e->ip->term_end_ms == 0) {
            /* A preemption with the grace period as its notice. The workers are between two
             * groups and can save nothing yet: the join goes on, and the node leaves once in
             * the round, where they take their last checkpoint (a job stopped as a whole
             * would lose every step since its last one otherwise). */
            e->ip->term_end_ms = rg_notice_now_ms() + cfg->grace_ms;
            fprintf(stderr, "regroup: SIGTERM while joining in place: this node leaves once "
                    "its workers are in the round (within %lld ms)\n",
                    (long long)cfg->grace_ms);
        }
        if ((*stop_signal != 0 && *stop_signal != SIGTERM) ||
            (e->ip->term_end_ms > 0 && rg_notice_now_ms() >= e->ip->term_end_ms)) {
            end = INPLACE_STOPPED;
            break;
        }
        if ((child && reap_during_join(e)) || e->ip->restart_asked) {
            end = INPLACE_RESTART;
            break;
        }
        if (rg_deadline_passed(deadline)) {
            e->ip->error = rg_error(RG_ETIMEDOUT, "rendezvous: the next round of job %s did "
                                    "not close within the join timeout (%lld ms) while this "
                                    "node's workers waited in place", cfg->job,
                                    (long long)cfg->join_timeout_ms);
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            end = INPLACE_ERROR;
            break;
        }
    }
    close(ep);
    close(timer);
    return end;
}

launcher_inplace_end_t launcher_inplace_newcomers(const launcher_inplace_env_t *e,
                                                  const launcher_spawn_t *sp,
                                                  const sigset_t *child_mask, int *stop_signal)
{
    const rg_agent_params_t *cfg = e->cfg;
    rg_deadline_t deadline = rg_deadline_in_ms(cfg->join_timeout_ms);
    int64_t tick = launcher_hang_tick_ms(cfg, RG_MAX(1, RG_MIN(cfg->monitor_ms,
                                                               cfg->lease_ttl_s * 1000 / 4)));

    /* Before they start: a newcomer that is ready at once says so on the pipe, which the
     * reset drains (it said nothing, otherwise, and timed out). */
    launcher_inplace_reset(e->ip, cfg->nproc);
    rg_status_t st = launcher_workers_start(e->ws, sp, child_mask);
    if (st != RG_OK) {
        e->ip->error = st;   /* "cannot run PROGRAM: why" */
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        return INPLACE_ERROR;
    }
    for (int i = 0; i < e->ws->n; i++) {
        e->ip->state[i] = INPLACE_PENDING;
        e->ip->fresh[i] = true;
    }
    rg_info("round %d runs without this node: %d workers start as newcomers; they join once "
            "ready", sp->asg->round, e->ws->n);
    int timer;
    int ep = join_fds(e, tick, &timer);
    if (ep < 0) {
        e->ip->error = RG_ESYS;
        return INPLACE_ERROR;
    }
    launcher_inplace_end_t end = INPLACE_RESTART;
    /* Bounded by the join timeout: one pass per event or tick. */
    for (int guard = 0; guard < 1 << 24; guard++) {
        struct epoll_event ev[8];
        int64_t left = rg_deadline_left_ms(deadline);
        if (left <= 0) {
            fprintf(stderr, "regroup: warning: --recovery=in-place: this node's newcomers were "
                    "not all ready within the join timeout (%lld ms); the node joins as in "
                    "--recovery=restart\n", (long long)cfg->join_timeout_ms);
            break;
        }
        (void)epoll_wait(ep, ev, 8, (int)RG_MIN(left, tick));
        bool child = serve_workers(e, timer, stop_signal);
        if (*stop_signal != 0) {
            end = INPLACE_STOPPED;
            break;
        }
        int failed;
        if (child && launcher_workers_reap(e->ws, &failed) < e->ws->n) {
            fprintf(stderr, "regroup: warning: --recovery=in-place: a newcomer of this node "
                    "ended before it was ready; the node joins as in --recovery=restart\n");
            break;
        }
        if (e->ip->restart_asked) {
            break;
        }
        int ready = 0;
        for (int i = 0; i < e->ws->n; i++) {
            ready += e->ip->state[i] == INPLACE_READY;
        }
        if (ready == e->ws->n) {
            rg_info("%d newcomers ready: joining the next round with them", ready);
            end = INPLACE_JOINED;
            break;
        }
    }
    close(ep);
    close(timer);
    return end;
}
