/*
 * The health of a group: control messages (hello, leave, abort), failing the group, and the
 * progress pass that advances every posted request and enforces deadlines.
 */
#include "comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* With only shared-memory requests posted, UCX is progressed in one pass of this many. */
#define COMM_SHM_UCX_EVERY 16

/* Before blaming a peer for a broken transfer: a peer that aborts the group tells us, then
 * closes its endpoints; take its message first if it is already here. Bounded. */
void comm_settle(rg_comm_t *comm)
{
    for (int i = 0; i < 64 && comm->healthy; i++) {
        ucp_worker_progress(comm->worker);
        comm_ctrl_poll(comm);
    }
}

/* ---- control messages ------------------------------------------------------------------ */

void comm_ctrl_post(rg_comm_t *comm)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL};
    ucs_status_ptr_t r = ucp_tag_recv_nbx(comm->worker, comm->ctrl_buf, sizeof(comm->ctrl_buf),
                                          COMM_TAG_CTRL, COMM_TAG_CTRL | COMM_TAG_P2P, &param);
    if (UCS_PTR_IS_ERR(r) || r == NULL) {
        rg_warn("posting the control receive: %s", ucs_status_string(UCS_PTR_STATUS(r)));
        return;
    }
    comm->ctrl_req = r;
}

void comm_send_ctrl(rg_comm_t *comm, uint32_t type, int about, void **reqs)
{
    comm->ctrl_out[0] = ((uint64_t)type << 32) | (uint32_t)comm->rank;
    comm->ctrl_out[1] = (uint64_t)(int64_t)about;
    for (int p = 0; p < comm->size; p++) {
        reqs[p] = NULL;
        if (p == comm->rank || comm->eps[p] == NULL || comm->peer_dead[p] ||
            comm->peer_left[p]) {
            continue;
        }
        ucp_request_param_t param = {0};
        uint64_t tag = COMM_TAG_CTRL | ((uint64_t)comm->rank << COMM_TAG_SRC_SHIFT);
        ucs_status_ptr_t r =
            ucp_tag_send_nbx(comm->eps[p], comm->ctrl_out, sizeof(comm->ctrl_out), tag, &param);
        if (!UCS_PTR_IS_ERR(r)) {
            reqs[p] = r;
        }
    }
}

/* Progresses until the control sends are out, at most ms. */
void comm_wait_reqs(rg_comm_t *comm, void **reqs, int n, int64_t ms)
{
    rg_deadline_t deadline = rg_deadline_in_ms(ms);
    for (;;) {
        bool pending = false;
        for (int i = 0; i < n; i++) {
            if (reqs[i] != NULL && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) {
                pending = true;
            }
        }
        if (!pending || rg_deadline_passed(deadline)) {
            break;
        }
        ucp_worker_progress(comm->worker);
        comm_ctrl_poll(comm); /* keeps the control receive posted: no stray messages */
    }
    for (int i = 0; i < n; i++) {
        if (reqs[i] != NULL) {
            ucp_request_free(reqs[i]);
            reqs[i] = NULL;
        }
    }
}

/* ---- failure --------------------------------------------------------------------------- */

void comm_grave_add(rg_comm_t *comm, void *p)
{
    if (p == NULL) {
        return;
    }
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

void comm_close_eps(rg_comm_t *comm, bool force, int64_t wait_ms)
{
    void **reqs = comm->scratch_reqs;
    for (int p = 0; p < comm->size; p++) {
        reqs[p] = NULL;
        if (comm->eps[p] == NULL) {
            continue;
        }
        ucp_request_param_t param = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
            .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
        };
        ucs_status_ptr_t r = ucp_ep_close_nbx(comm->eps[p], &param);
        if (!UCS_PTR_IS_ERR(r)) {
            reqs[p] = r;
        }
        comm->eps[p] = NULL;
    }
    comm_wait_reqs(comm, reqs, comm->size, wait_ms);
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
    comm->failed_rank = rank;
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

void comm_ctrl_handle(rg_comm_t *comm, size_t len)
{
    if (len != sizeof(comm->ctrl_buf)) {
        rg_warn("ignoring a control message of %zu bytes", len);
        return;
    }
    uint32_t type = (uint32_t)(comm->ctrl_buf[0] >> 32);
    int from = (int)(uint32_t)comm->ctrl_buf[0];
    int about = (int)(int64_t)comm->ctrl_buf[1];
    if (from < 0 || from >= comm->size) {
        rg_warn("ignoring a control message from unknown rank %d", from);
        return;
    }
    if (type == COMM_CTRL_HELLO) {
        comm->n_hello++;
    } else if (type == COMM_CTRL_LEAVE) {
        if (!comm->peer_left[from]) {
            comm->peer_left[from] = true;
            comm->n_left++;
        }
    } else if (type == COMM_CTRL_ABORT && comm->healthy && !comm->closing) {
        if (about >= 0 && about < comm->size) {
            (void)comm_fail(comm, RG_EPEER, about, false, "rank %d failed (reported by rank %d)",
                            about, from);
        } else {
            (void)comm_fail(comm, RG_EPEER, from, false, "rank %d aborted the group", from);
        }
    }
}

void comm_ctrl_poll(rg_comm_t *comm)
{
    if (comm->ctrl_req == NULL) {
        return;
    }
    ucp_tag_recv_info_t info = {0};
    ucs_status_t st = ucp_tag_recv_request_test(comm->ctrl_req, &info);
    if (st == UCS_INPROGRESS) {
        return;
    }
    ucp_request_free(comm->ctrl_req);
    comm->ctrl_req = NULL;
    if (st == UCS_OK) {
        comm_ctrl_handle(comm, info.length);
    }
    if (comm->healthy || comm->closing) {
        comm_ctrl_post(comm);
    }
}

/* Peers whose endpoint failed, or that left while a request still waits on them. */
static void comm_check_peers(rg_comm_t *comm)
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

static void comm_check_deadlines(rg_comm_t *comm)
{
    uint64_t now = rg_now_ns();
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

bool comm_progress(rg_comm_t *comm)
{
    bool moved = false;
    const unsigned pass = ++comm->passes;
    /* Shared-memory requests need UCX only to hear of failures (endpoint errors, abort
     * messages), which a pass in every COMM_SHM_UCX_EVERY still does within microseconds. */
    const bool shm_only = comm->n_posted > 0 && comm->n_posted == comm->n_posted_shm;
    if (!shm_only || pass % COMM_SHM_UCX_EVERY == 0) {
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
        comm_check_deadlines(comm);
    }
    return moved;
}
