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

#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define AGENT_MAX_FDS (2 + 2 * LAUNCHER_MAX_NPROC)

typedef enum {
    ROUND_SUCCEEDED,    /* every local worker exited 0 */
    ROUND_RESTART,      /* join the next round */
    ROUND_STOPPED,      /* a signal told the agent to stop */
    ROUND_ERROR,        /* the agent cannot go on */
} round_end_t;

typedef struct {
    const launcher_config_t *cfg;
    rg_rdzv_t               *rdzv;
    int                      sigfd;
    sigset_t                 child_mask;     /* the mask workers start with */
    launcher_workers_t       ws;
    int                      stop_signal;
    char                     endpoints[1024];
} agent_t;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_tree(const char *dir)
{
    if (dir[0] != '\0') {
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

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

static round_end_t run_round(agent_t *ag, const rg_rdzv_assignment_t *asg)
{
    const launcher_config_t *cfg = ag->cfg;
    launcher_spawn_t sp = {.cfg = cfg, .asg = asg, .endpoints = ag->endpoints};
    rg_status_t st;

    rg_log_set_identity(asg->rank_offset, asg->round);
    st = launcher_workers_start(&ag->ws, &sp, &ag->child_mask);
    if (st != RG_OK) {
        fprintf(stderr, "regroup: cannot start workers: %s\n", rg_last_error());
        launcher_workers_stop(&ag->ws, 0, SIGKILL, cfg);
        return ROUND_ERROR;
    }
    rg_info("round %d: started %d workers (ranks %d..%d of %d, restart %d)", asg->round,
            cfg->nproc, asg->rank_offset, asg->rank_offset + cfg->nproc - 1, asg->world_size,
            asg->restart_count);
    for (;;) {
        struct pollfd pfd[AGENT_MAX_FDS];
        int n = 0;
        bool child = false;

        pfd[n++] = (struct pollfd){.fd = ag->sigfd, .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = rg_rdzv_fd(ag->rdzv), .events = POLLIN};
        for (int i = 0; i < ag->ws.n; i++) {
            if (ag->ws.w[i].out_fd >= 0) {
                pfd[n++] = (struct pollfd){.fd = ag->ws.w[i].out_fd, .events = POLLIN};
            }
            if (ag->ws.w[i].err_fd >= 0) {
                pfd[n++] = (struct pollfd){.fd = ag->ws.w[i].err_fd, .events = POLLIN};
            }
        }
        if (poll(pfd, (nfds_t)n, (int)cfg->monitor_ms) < 0 && errno != EINTR) {
            fprintf(stderr, "regroup: poll: %s\n", strerror(errno));
            launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
            return ROUND_ERROR;
        }
        for (int k = 2; k < n; k++) {
            if (pfd[k].revents != 0) {
                launcher_workers_pump(&ag->ws, pfd[k].fd, cfg);
            }
        }
        if (read_signals(ag, &child)) {
            rg_info("signal %d: stopping workers", ag->stop_signal);
            launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
            return ROUND_STOPPED;
        }
        if (child) {
            int failed;
            int running = launcher_workers_reap(&ag->ws, &failed);
            if (failed >= 0) {
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
            if (running == 0) {
                launcher_workers_stop(&ag->ws, 0, SIGKILL, cfg);   /* closes pipes and logs */
                return ROUND_SUCCEEDED;
            }
        }
        rg_rdzv_change_t change;
        st = rg_rdzv_check(ag->rdzv, &change);
        if (st != RG_OK) {
            rg_warn("rendezvous check failed (%s); will look again", rg_last_error());
            continue;
        }
        if (change != RG_RDZV_NONE) {
            static const char *const why[] = {"", "a worker failed on another node",
                                              "a node was lost", "a node is waiting to join",
                                              "another agent opened a new round",
                                              "this agent's lease was lost"};
            rg_info("round %d ends: %s", asg->round, why[change]);
            launcher_workers_stop(&ag->ws, cfg->grace_ms, SIGTERM, cfg);
            return ROUND_RESTART;
        }
    }
}

static int agent_loop(agent_t *ag)
{
    const launcher_config_t *cfg = ag->cfg;
    rg_rdzv_assignment_t *asg = malloc(sizeof(*asg));
    int rc = 1;

    if (asg == NULL) {
        fprintf(stderr, "regroup: out of memory\n");
        return 1;
    }
    for (;;) {
        rg_status_t st = rg_rdzv_join(ag->rdzv, ag->sigfd, asg);
        if (st == RG_ECANCELED) {
            bool child = false;
            if (read_signals(ag, &child)) {
                rc = 128 + ag->stop_signal;
                break;
            }
            continue;   /* only SIGCHLD of an old worker: join again */
        }
        if (st != RG_OK) {
            fprintf(stderr, "regroup: %s\n", rg_last_error());
            rc = 1;
            break;
        }
        if (asg->job_done) {
            fprintf(stderr, "regroup: the job finished without this node\n");
            rc = 0;
            break;
        }
        if (asg->job_failed) {
            fprintf(stderr, "regroup: the job failed more than --max-restarts=%d times\n",
                    cfg->max_restarts);
            rg_rdzv_print_failures(ag->rdzv, stderr);
            rc = 1;
            break;
        }
        round_end_t end = run_round(ag, asg);
        if (end == ROUND_SUCCEEDED) {
            st = rg_rdzv_done(ag->rdzv);
            if (st != RG_OK) {
                rg_warn("cannot record completion: %s", rg_last_error());
            }
            rg_info("workers finished successfully");
            rc = 0;
            break;
        }
        if (end == ROUND_STOPPED) {
            rc = 128 + ag->stop_signal;
            break;
        }
        if (end == ROUND_ERROR) {
            rc = 1;
            break;
        }
        st = rg_rdzv_next_round(ag->rdzv);
        if (st != RG_OK) {
            rg_warn("cannot open the next round (%s); joining anyway", rg_last_error());
        }
    }
    free(asg);
    return rc;
}

int launcher_agent_main(const launcher_config_t *cfg)
{
    agent_t ag = {.cfg = cfg, .sigfd = -1};
    rg_etcd_server_t *etcd = NULL;
    sigset_t block;
    rg_status_t st;
    int rc = 1;

    /* Signals arrive through the signalfd; block them before any thread starts so that
     * every thread (curl's, the lease keeper's, the watch's) inherits the mask. */
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &ag.child_mask);
    sigdelset(&ag.child_mask, SIGCHLD);
    sigdelset(&ag.child_mask, SIGTERM);
    sigdelset(&ag.child_mask, SIGINT);
    sigdelset(&ag.child_mask, SIGHUP);
    signal(SIGPIPE, SIG_IGN);
    ag.sigfd = signalfd(-1, &block, SFD_CLOEXEC | SFD_NONBLOCK);
    if (ag.sigfd < 0) {
        fprintf(stderr, "regroup: signalfd: %s\n", strerror(errno));
        return 1;
    }
    snprintf(ag.ws.run_dir, sizeof(ag.ws.run_dir), "%s/regroup-%s-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", cfg->job);
    if (mkdtemp(ag.ws.run_dir) == NULL) {
        fprintf(stderr, "regroup: cannot create %s: %s\n", ag.ws.run_dir, strerror(errno));
        ag.ws.run_dir[0] = '\0';
        goto out;
    }
    if (cfg->standalone) {
        etcd = calloc(1, sizeof(*etcd));
        /* Fast raft timing: a private single-member etcd can expire leases in 1 s. */
        if (etcd == NULL ||
            rg_etcd_server_start(etcd, "--heartbeat-interval=10 --election-timeout=100") != 0) {
            fprintf(stderr, "regroup: --standalone: cannot start etcd: %s\n", rg_last_error());
            goto out;
        }
        snprintf(ag.endpoints, sizeof(ag.endpoints), "%s", etcd->endpoints);
        rg_info("--standalone: private etcd at %s (pid %d, data %s)", etcd->endpoints,
                (int)etcd->pid[0], etcd->root);
    } else {
        snprintf(ag.endpoints, sizeof(ag.endpoints), "%s", cfg->endpoint);
    }

    rg_rdzv_params_t p = {
        .etcd = launcher_etcd_params(cfg, ag.endpoints),
        .job = cfg->job,
        .addr = cfg->local_addr,
        .nproc = cfg->nproc,
        .min_nodes = cfg->min_nodes,
        .max_nodes = cfg->max_nodes,
        .lease_ttl_s = cfg->lease_ttl_s,
        .last_call_ms = cfg->last_call_ms,
        .join_timeout_ms = cfg->join_timeout_ms,
        .max_restarts = cfg->max_restarts,
    };
    st = rg_rdzv_create(&p, &ag.rdzv);
    if (st != RG_OK) {
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        goto out;
    }
    rc = agent_loop(&ag);
    /* Leaving on purpose: the others regroup now instead of after the lease TTL. */
    st = rg_rdzv_leave(ag.rdzv);
    if (st != RG_OK) {
        rg_warn("cannot revoke the lease: %s", rg_last_error());
    }
out:
    rg_rdzv_destroy(ag.rdzv);
    if (etcd != NULL) {
        rg_etcd_server_stop(etcd);
        free(etcd);
    }
    rm_tree(ag.ws.run_dir);
    close(ag.sigfd);
    return rc;
}
