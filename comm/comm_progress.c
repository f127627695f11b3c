/*
 * The progress engine: one pass runs ucp_worker_progress, takes control messages, checks the
 * peers (comm_fail.c), calls each posted request's `advance` in post order and, every few
 * passes, enforces the requests' deadlines. rg_comm_req_test and rg_comm_req_wait (comm_req.c)
 * drive it; nothing else progresses a group once it is connected.
 */
#include "comm_internal.h"

#include <stdio.h>

/* With only shared-memory requests posted, UCX is progressed in one pass of this many. */
#define COMM_SHM_UCX_EVERY 16

static void comm_check_deadlines(rg_comm_t *comm, uint64_t now)
{
    for (rg_comm_req_t *req = comm->head; req != NULL; req = req->next) {
        if (now < req->deadline) {
            continue;
        }
        char who[96] = "";
        size_t off = 0;
        int first = -1;
        int n_who = 0;
        /* The peers it still waits to hear from (or, failing that, to deliver to). */
        for (int pass = 0; pass < 2 && first < 0; pass++) {
            for (int i = 0; i < req->n_xfers && off + 16 < sizeof(who); i++) {
                comm_xfer_t *x = &req->xfers[i];
                if (!x->active || x->is_recv != (pass == 0)) {
                    continue;
                }
                bool seen = false;
                for (int k = 0; k < i; k++) {
                    seen = seen || (req->xfers[k].active && req->xfers[k].peer == x->peer &&
                                    req->xfers[k].is_recv == x->is_recv);
                }
                if (!seen) {
                    off += (size_t)snprintf(who + off, sizeof(who) - off, "%s%d",
                                            first < 0 ? "" : ", ", x->peer);
                    first = first < 0 ? x->peer : first;
                    n_who++;
                }
            }
        }
        (void)comm_fail(comm, RG_ETIMEDOUT, first, false,
                        "%s: deadline passed waiting for %s %s", req->name,
                        n_who == 1 ? "rank" : "ranks", first < 0 ? "?" : who);
        return;
    }
}

/* The caller's rg_comm_params_t.abandon, while a request waits: a member it knows is lost
 * fails the group now rather than at UCX's keepalive. */
static void comm_check_abandon(rg_comm_t *comm, uint64_t now)
{
    char why[200];
    if (comm->abandon == NULL || !comm->healthy || comm->head == NULL ||
        now < comm->abandon_next_ns) {
        return;
    }
    comm->abandon_next_ns = now + COMM_ABANDON_POLL_NS;
    if (comm->abandon(comm->abandon_arg, why, sizeof(why))) {
        why[sizeof(why) - 1] = '\0';
        (void)comm_fail(comm, RG_EPEER, COMM_ABOUT_ABANDONED, true, "%s", why);
    }
}

bool comm_progress(rg_comm_t *comm)
{
    bool moved = false;
    const unsigned pass = ++comm->passes;
    /* Shared-memory requests need UCX only to hear of failures (endpoint errors, abort
     * messages), which a pass in every COMM_SHM_UCX_EVERY still does within microseconds
     * while the waiter spins. A waiter that gave its core away (oversubscribed, or idle for
     * long) may not run again for a time slice: counting passes alone then left UCX, and
     * its keepalive (which checks peers on one call in 32), unrun for up to a second on a
     * loaded host, so such a pass runs UCX too. */
    const bool shm_only = comm->n_posted > 0 && comm->n_posted == comm->n_posted_shm;
    if (!shm_only || pass % COMM_SHM_UCX_EVERY == 0 || comm->ucx_due) {
        comm->ucx_due = false;
        for (int i = 0; i < 16; i++) {
            if (ucp_worker_progress(comm->worker) == 0) {
                break;
            }
            moved = true;
        }
        if (!comm->healthy) {
            return moved;
        }
        comm_ctrl_poll(comm);
    }
    comm_check_peers(comm);
    rg_comm_req_t *req = comm->head;
    while (req != NULL && comm->healthy) {
        rg_comm_req_t *next = req->next;
        rg_status_t st = req->advance(req);
        if (st != RG_INPROGRESS) {
            moved = true;
            if (st != RG_OK && comm->healthy && !req->is_p2p) {
                (void)comm_fail(comm, st, -1, false, "%s: %s", req->name, rg_last_error());
                break;
            }
            if (req->posted) {
                comm_req_finish(req, st);
            }
        }
        req = next;
    }
    /* A clock read every few passes is enough: a pass takes well under a microsecond. */
    if (comm->healthy && (pass & 7) == 0) {
        uint64_t now = rg_now_ns();
        comm_check_deadlines(comm, now);
        comm_check_abandon(comm, now);
    }
    return moved;
}
