/*
 * Control messages between the ranks of a group: hello (wire-up, comm_ucx.c), leave (a clean
 * destroy) and abort (comm_fail.c tells the live peers). One wildcard receive is kept posted
 * for them; every poll takes at most one message and reposts.
 */
#include "comm_internal.h"

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
        comm->peer_heard[from] = true;
    } else if (type == COMM_CTRL_LEAVE) {
        if (!comm->peer_left[from]) {
            comm->peer_left[from] = true;
            comm->n_left++;
        }
    } else if (type == COMM_CTRL_ABORT && comm->healthy && !comm->closing) {
        if (about >= 0 && about < comm->size) {
            (void)comm_fail(comm, RG_EPEER, about, false, "rank %d failed (reported by rank %d)",
                            about, from);
        } else if (about == COMM_ABOUT_ABANDONED) {
            (void)comm_fail(comm, RG_EPEER, -1, false, "rank %d gave the group up: a member "
                            "is lost", from);
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
