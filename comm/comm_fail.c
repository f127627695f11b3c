/*
 * From "UCX reports a dead peer" to "the group is failed and every pending request returns
 * RG_EPEER", in one place.
 *
 * UCX tells us of a dead peer in two ways:
 *   - the endpoint error callback (comm_ep_error), run inside ucp_worker_progress: it only
 *     records the peer and the status (the callback must not re-enter UCX);
 *   - an error status from a transfer: an immediate error return of ucp_tag_send_nbx or
 *     ucp_tag_recv_nbx, or a request that completes with an error (comm_peer_error, called by
 *     comm_ucx.c's transfer functions).
 * The progress pass (comm_progress.c) calls comm_check_peers after every UCX progress: a
 * recorded death, or a receive still waiting on a peer that left, fails the group. Before a
 * peer is blamed, the control messages already here are taken (comm_settle): a peer that
 * aborted the group sent its reason first, and that reason is the one to report.
 *
 * comm_fail is the one way a group fails (also on a deadline, comm_progress.c, or a
 * peer's abort message, comm_ctrl.c): it records the failure, tells every live peer with an
 * abort message (so ranks not talking to the dead one fail at once too), cancels the
 * control receive, fails every posted request with the status (their buffers go to the
 * graveyard, freed after the worker), and force-closes the endpoints. Every later call on
 * the group returns RG_EPEER (comm_unhealthy_error).
 */
#include "comm_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void comm_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    comm_peer_t *peer = arg;
    (void)ep;
    if (!peer->comm->peer_dead[peer->rank]) {
        peer->comm->peer_dead[peer->rank] = true;
        peer->comm->peer_status[peer->rank] = status;
        peer->comm->n_dead++;
    }
}

/* Before blaming a peer for a broken transfer: a peer that aborts the group tells us, then
 * closes its endpoints; take its message first if it is already here. Bounded. */
static void comm_settle(rg_comm_t *comm)
{
    for (int i = 0; i < 64 && comm->healthy; i++) {
        ucp_worker_progress(comm->worker);
        comm_ctrl_poll(comm);
    }
}

rg_status_t comm_peer_error(rg_comm_t *comm, int peer, const char *what, ucs_status_t st)
{
    comm_settle(comm);
    if (!comm->healthy) {
        return rg_error(comm->fail_status, "%s", comm->fail_msg);
    }
    return comm_fail(comm, RG_EPEER, peer, true, "%s with rank %d failed: %s", what, peer,
                     ucs_status_string(st));
}

/* Peers whose endpoint failed, or that left while a request still waits on them. */
void comm_check_peers(rg_comm_t *comm)
{
    if (comm->n_dead > comm->n_dead_seen) {
        comm->n_dead_seen = comm->n_dead;
        comm_settle(comm);
        for (int p = 0; p < comm->size && comm->healthy; p++) {
            if (comm->peer_dead[p] && !comm->peer_left[p]) {
                (void)comm_fail(comm, RG_EPEER, p, true, "rank %d failed: %s", p,
                                ucs_status_string(comm->peer_status[p]));
            }
        }
    }
    if (comm->n_left == 0 || !comm->healthy) {
        return;
    }
    for (rg_comm_req_t *req = comm->head; req != NULL; req = req->next) {
        for (int i = 0; i < req->n_xfers; i++) {
            comm_xfer_t *x = &req->xfers[i];
            if (x->active && x->is_recv && comm->peer_left[x->peer] &&
                (x->shm ? !comm_shm_arrived(req, x)
                        : ucp_request_check_status(x->ucx) == UCS_INPROGRESS)) {
                (void)comm_fail(comm, RG_EPEER, x->peer, false,
                                "%s: rank %d left the group before sending", req->name,
                                x->peer);
                return;
            }
        }
    }
}

void comm_grave_add(rg_comm_t *comm, void *p)
{
    if (p == NULL) {
        return;
    }
    comm_scratch_forget(comm, p);
    if (comm->n_grave == comm->cap_grave) {
        size_t cap = comm->cap_grave ? 2 * comm->cap_grave : 16;
        void **g = realloc(comm->grave, cap * sizeof(*g));
        if (g == NULL) {
            rg_warn("out of memory keeping a failed request's buffers; leaking them");
            return;
        }
        comm->grave = g;
        comm->cap_grave = cap;
    }
    comm->grave[comm->n_grave++] = p;
}

rg_status_t comm_unhealthy_error(const rg_comm_t *comm, const char *what)
{
    return rg_error(RG_EPEER, "%s: the group is unusable after an earlier failure (%s)", what,
                    comm->fail_msg);
}

rg_status_t comm_fail(rg_comm_t *comm, rg_status_t status, int rank, bool tell_peers,
                      const char *fmt, ...)
{
    if (!comm->healthy) {
        return comm_unhealthy_error(comm, "operation");
    }
    comm->healthy = false;
    comm->failed_rank = rank >= 0 ? rank : -1;   /* (an abandoned group: none known) */
    comm->fail_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(comm->fail_msg, sizeof(comm->fail_msg), fmt, ap);
    va_end(ap);
    rg_warn("group of %d: %s", comm->size, comm->fail_msg);
    (void)rg_error(status, "%s", comm->fail_msg); /* what the failed requests report */

    if (tell_peers) {
        comm_send_ctrl(comm, COMM_CTRL_ABORT, rank, comm->scratch_reqs);
    }
    if (comm->ctrl_req != NULL) {
        ucp_request_cancel(comm->worker, comm->ctrl_req);
        ucp_request_free(comm->ctrl_req);
        comm->ctrl_req = NULL;
    }
    /* Every posted request fails; its buffers stay alive until the worker is destroyed,
     * since a receive already matched cannot be canceled and may still write to them. */
    for (int guard = 0; comm->head != NULL && guard < 1 << 20; guard++) {
        rg_comm_req_t *req = comm->head;
        for (int i = 0; i < req->n_xfers; i++) {
            comm_xfer_abandon(comm, &req->xfers[i]);
        }
        comm_req_bury(req);
        comm_req_finish(req, status);
    }
    if (tell_peers) {
        comm_wait_reqs(comm, comm->scratch_reqs, comm->size, COMM_ABORT_WAIT_MS);
    }
    comm_close_eps(comm, true, COMM_CLOSE_WAIT_MS);
    return rg_error(status, "%s", comm->fail_msg);
}
