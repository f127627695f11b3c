/*
 * The UCX layer of a group: context and worker, endpoints with peer-failure handling, the
 * wire-up handshake, tagged transfers polled without callbacks, and closing. With
 * comm_fail.c (which a transfer's error status is handed to, and which holds the endpoint
 * error callback), the only place where ucs_status_t is turned into rg_status_t.
 */
#include "comm_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether UCX_TLS lets a shared-memory transport in (setting MM_ERROR_HANDLING otherwise
 * makes UCX warn about an unused setting). */
bool comm_tls_has_mm(void)
{
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || *tls == '\0') {
        return true;
    }
    static const char *const mm[] = {"sm", "shm", "posix", "sysv", "mm", "all"};
    for (size_t i = 0; i < RG_ARRAY_SIZE(mm); i++) {
        if (strstr(tls, mm[i]) != NULL) {
            return true;
        }
    }
    return tls[0] == '^'; /* an exclusion list keeps the others */
}

/* UCX settings the group needs unless the user chose otherwise (see comm.h). */
static void comm_ucx_config_defaults(ucp_config_t *config, int size)
{
    /* {variable after UCX_, key for ucp_config_modify, value}: a transport's own setting is
     * named without its prefix there (the tcp table's field is TX_SEG_SIZE). */
    static const char *const names[][3] = {
        {"MM_ERROR_HANDLING", "MM_ERROR_HANDLING", "y"},
        {"KEEPALIVE_INTERVAL", "KEEPALIVE_INTERVAL", "100ms"},
        /* Eager only: with rendezvous, a receiver's replies queue up toward a peer that died
         * (its FIFO no longer drains) and UCX 1.13 then aborts on an assertion while purging
         * them ("got REP message", fixed upstream in openucx/ucx#8175). Over shared memory
         * in peer-failure mode rendezvous is copied through the same lane anyway. */
        {"RNDV_THRESH", "RNDV_THRESH", "inf"},
        /* tcp: UCX's defaults (8 KiB sends, 64 KiB receives) cut a ring segment into 32
         * fragments, each a system call and, past 20 KiB, a rendezvous round trip. With these
         * a segment just under 256 KiB is one eager message, and one of 256 KiB goes by
         * rendezvous (comm_group.c chooses between them): loopback busbw at
         * 1 MiB went from 3.1 to 4.7 GB/s with 2 ranks. Costs (grown 8 buffers at a time)
         * 2 MiB of send and 4 MiB of receive buffers per worker. */
        {"TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "256K"},
        {"TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "512K"},
        /* tcp: UCX 1.13 connects blocking by default: ucp_ep_create to a peer that cannot
         * answer (its node's links cut, its SYNs unanswered) sat in connect() until the
         * link healed or the kernel gave up (minutes), past every deadline of the wire-up,
         * and its peers could not give the attempt up. Not blocking, the handshake's
         * deadline and watch bound it. */
        {"TCP_CONN_NB", "CONN_NB", "y"},
    };
    char env[64];
    for (size_t i = 0; i < RG_ARRAY_SIZE(names); i++) {
        snprintf(env, sizeof(env), "UCX_%s", names[i][0]);
        /* UCX_POSIX_ and UCX_SYSV_ERROR_HANDLING override MM_ for one transport: respect
         * them as the user's choice too. */
        bool user_mm = i == 0 && (getenv("UCX_POSIX_ERROR_HANDLING") != NULL ||
                                  getenv("UCX_SYSV_ERROR_HANDLING") != NULL);
        /* Both are about shared memory; over tcp alone, eager-only messages of a failed
         * group corrupted UCX's heap in our tests, so tcp keeps its rendezvous. */
        bool mm_only = (i == 0 || i == 2) && !comm_tls_has_mm();
        if (getenv(env) == NULL && !user_mm && !mm_only) {
            ucs_status_t st = ucp_config_modify(config, names[i][1], names[i][2]);
            if (st != UCS_OK) {
                rg_debug("ucp_config_modify %s: %s", names[i][1], ucs_status_string(st));
            }
        }
    }
    if (getenv("UCX_KEEPALIVE_NUM_EPS") == NULL) {
        char v[32];
        snprintf(v, sizeof(v), "%d", RG_MAX(size, COMM_KEEPALIVE_MIN_EPS));
        (void)ucp_config_modify(config, "KEEPALIVE_NUM_EPS", v);
    }
}

rg_status_t comm_ucx_make(int size, ucp_context_h *ctx_p, ucp_worker_h *worker_p,
                          bool *cuda_p)
{
    ucp_config_t *config = NULL;
    ucp_context_h ctx = NULL;
    ucp_worker_h worker = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        return rg_error(RG_EINVAL, "ucp_config_read: %s", ucs_status_string(st));
    }
    comm_ucx_config_defaults(config, size);
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS,
        .features = UCP_FEATURE_TAG,
        .estimated_num_eps = (size_t)size,
    };
    st = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (st != UCS_OK) {
        return rg_error(RG_EUNREACH, "ucp_init: %s", ucs_status_string(st));
    }
    ucp_worker_params_t wparams = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(ctx, &wparams, &worker);
    if (st != UCS_OK) {
        ucp_cleanup(ctx);
        return rg_error(RG_EUNREACH, "ucp_worker_create: %s", ucs_status_string(st));
    }
    /* Whether this UCX can move device memory (a build without its CUDA module cannot). */
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    *cuda_p = ucp_context_query(ctx, &attr) == UCS_OK &&
              (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    *ctx_p = ctx;
    *worker_p = worker;
    return RG_OK;
}

void comm_ucx_unmake(ucp_context_h ctx, ucp_worker_h worker)
{
    if (worker != NULL) {
        ucp_worker_destroy(worker);
    }
    if (ctx != NULL) {
        ucp_cleanup(ctx);
    }
}

rg_status_t comm_ucx_open(rg_comm_t *comm, rg_comm_spare_t *spare, rg_deadline_t deadline)
{
    comm->from_spare = comm_spare_take(spare, comm->size, deadline, &comm->ctx,
                                       &comm->worker, &comm->ucx_cuda);
    if (comm->from_spare) {
        return RG_OK;
    }
    return comm_ucx_make(comm->size, &comm->ctx, &comm->worker, &comm->ucx_cuda);
}

rg_status_t comm_ucx_address(rg_comm_t *comm, ucp_address_t **addr_p, size_t *len_p)
{
    ucp_address_t *addr = NULL;
    size_t len = 0;
    ucs_status_t st = ucp_worker_get_address(comm->worker, &addr, &len);
    if (st != UCS_OK) {
        return rg_error(RG_EUNREACH, "ucp_worker_get_address: %s", ucs_status_string(st));
    }
    *addr_p = addr;
    *len_p = len;
    return RG_OK;
}

void comm_ucx_release_address(rg_comm_t *comm, ucp_address_t *addr)
{
    if (addr != NULL) {
        ucp_worker_release_address(comm->worker, addr);
    }
}

/* Peer p could not be reached while connecting (rg_comm_params_t.unreached). */
static void comm_unreached(rg_comm_t *comm, int p)
{
    if (comm->unreached != NULL) {
        comm->unreached[p] = 1;
    }
}

/* Whether any of reqs[0..n) is still in progress. */
static bool comm_reqs_pending(void *const *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        if (reqs[i] != NULL && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) {
            return true;
        }
    }
    return false;
}

/* The handshake's wait: progresses until every request in reqs is done (reqs non-NULL) or,
 * with reqs NULL, until every peer's hello of round `round` is in or a peer died; bounded by
 * the deadline. Asks the watch every COMM_WIRE_WATCH_NS whether a peer gave this attempt up:
 * then a send to it may never complete (a peer cut off: the connection hangs) and its hello
 * never comes. Frees the requests it waited on. */
static rg_status_t comm_handshake_wait(rg_comm_t *comm, void **reqs, int round,
                                       rg_deadline_t deadline, const comm_wire_watch_t *watch,
                                       uint64_t *next_watch)
{
    const int n = comm->size;
    rg_status_t st = RG_OK;
    while (!rg_deadline_passed(deadline)) {
        if (reqs != NULL ? !comm_reqs_pending(reqs, n)
                         : comm->n_hello >= round * (n - 1) || comm->n_dead > 0) {
            break;
        }
        ucp_worker_progress(comm->worker);
        comm_ctrl_poll(comm);   /* keeps the control receive posted: no stray messages */
        if (watch != NULL && rg_now_ns() >= *next_watch) {
            st = watch->check(watch->arg, deadline);
            if (st != RG_OK) {
                break;
            }
            *next_watch = rg_now_ns() + COMM_WIRE_WATCH_NS;
        }
    }
    if (reqs != NULL) {
        comm_wait_reqs(comm, reqs, n, 0);   /* (frees them) */
    }
    return st;
}

/*
 * Completes the wire-up of every endpoint now: each rank sends a hello to every peer, waits
 * for every peer's hello and flushes its endpoints. UCX connects lazily otherwise, and in
 * 1.13 a peer that dies while a wire-up message is still queued on a shared-memory endpoint
 * trips an assertion inside UCX (ucp_request.c "got REP message"). Connected endpoints are
 * also all watched by keepalive, so every rank sees a death itself.
 */
static rg_status_t comm_ucx_handshake(rg_comm_t *comm, rg_deadline_t deadline,
                                      const comm_wire_watch_t *watch)
{
    const int n = comm->size;
    void **reqs = comm->scratch_reqs;
    uint64_t next_watch = rg_now_ns() + COMM_WIRE_WATCH_NS;
    /* Two rounds: the second one's hellos arrive only after the first round's wire-up
     * replies and acknowledgements have been processed on both sides. */
    for (int round = 1; round <= 2; round++) {
        comm_send_ctrl(comm, COMM_CTRL_HELLO, -1, reqs);
        rg_status_t st = comm_handshake_wait(comm, reqs, round, deadline, watch, &next_watch);
        for (int p = 0; p < n && st == RG_OK; p++) {
            reqs[p] = NULL;
            if (comm->eps[p] != NULL) {
                ucp_request_param_t param = {0};
                ucs_status_ptr_t r = ucp_ep_flush_nbx(comm->eps[p], &param);
                if (UCS_PTR_IS_ERR(r)) {
                    comm_unreached(comm, p);
                    comm_wait_reqs(comm, reqs, n, 0);   /* (frees the flushes begun) */
                    return rg_error(RG_EUNREACH, "connecting to rank %d: flush: %s", p,
                                    ucs_status_string(UCS_PTR_STATUS(r)));
                }
                reqs[p] = r;
            }
        }
        if (st == RG_OK) {
            st = comm_handshake_wait(comm, reqs, round, deadline, watch, &next_watch);
        }
        if (st == RG_OK) {
            st = comm_handshake_wait(comm, NULL, round, deadline, watch, &next_watch);
        }
        if (st != RG_OK) {
            return st;
        }
    }
    for (int p = 0; p < n; p++) {
        if (comm->peer_dead[p]) {
            return rg_error(RG_EPEER, "rank %d failed while the group was connecting: %s", p,
                            ucs_status_string(comm->peer_status[p]));
        }
    }
    if (comm->n_hello < 2 * (n - 1)) {
        for (int p = 0; p < n; p++) {
            if (p != comm->rank && !comm->peer_heard[p]) {
                comm_unreached(comm, p);
            }
        }
        return rg_error(RG_ETIMEDOUT, "group of %d: only %d of %d peers answered before the "
                        "deadline", n, comm->n_hello / 2, n - 1);
    }
    return RG_OK;
}

rg_status_t comm_ucx_connect(rg_comm_t *comm, void *const *addrs, const size_t *lens,
                             rg_deadline_t deadline, const comm_wire_watch_t *watch)
{
    int n_failed = 0;
    int first = -1;
    ucs_status_t first_st = UCS_OK;
    for (int p = 0; p < comm->size; p++) {
        if (p == comm->rank) {
            continue;
        }
        if (addrs[p] == NULL || lens[p] == 0) {
            return rg_error(RG_EPROTO, "no worker address for rank %d", p);
        }
        ucp_ep_params_t ep_params = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .address = addrs[p],
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = comm_ep_error, .arg = &comm->peers[p]},
        };
        ucs_status_t st = ucp_ep_create(comm->worker, &ep_params, &comm->eps[p]);
        if (st != UCS_OK) {
            /* The other peers are tried too: whether this rank reaches none of them (its
             * own links are cut) or one alone is the caller's question. */
            comm->eps[p] = NULL;
            comm_unreached(comm, p);
            if (n_failed++ == 0) {
                first = p;
                first_st = st;
            }
        }
    }
    if (n_failed > 0) {
        return rg_error(RG_EUNREACH, "connecting to rank %d: ucp_ep_create: %s (%d of %d "
                        "peers unreachable)", first, ucs_status_string(first_st), n_failed,
                        comm->size - 1);
    }
    comm_ctrl_post(comm);
    return comm_ucx_handshake(comm, deadline, watch);
}

uint64_t comm_tag(const rg_comm_t *comm, int src, uint32_t seq, uint32_t sub)
{
    (void)comm;
    return ((uint64_t)src << COMM_TAG_SRC_SHIFT) |
           ((uint64_t)(seq & COMM_TAG_SEQ_MASK) << COMM_TAG_SEQ_SHIFT) | sub;
}

/* ---- transfers ------------------------------------------------------------------------- */

rg_status_t comm_xfer_send(rg_comm_req_t *req, comm_xfer_t *x, int peer, uint64_t tag,
                           const void *buf, size_t len)
{
    rg_comm_t *comm = req->comm;
    x->peer = peer;
    x->is_recv = false;
    x->active = false;
    x->ucx = NULL;
    x->len = len;
    if (!comm->healthy) {
        return comm_unhealthy_error(comm, req->name);
    }
    if (comm->eps[peer] == NULL || comm->peer_left[peer]) {
        return comm_fail(comm, RG_EPEER, peer, true, "%s: rank %d has left the group",
                         req->name, peer);
    }
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .memory_type = req->mem,
    };
    ucs_status_ptr_t r = ucp_tag_send_nbx(comm->eps[peer], buf, len, tag, &param);
    if (UCS_PTR_IS_ERR(r)) {
        return comm_peer_error(comm, peer, "send", UCS_PTR_STATUS(r));
    }
    if (r != NULL) {
        x->ucx = r;
        x->active = true;
    }
    return RG_OK;
}

rg_status_t comm_xfer_recv(rg_comm_req_t *req, comm_xfer_t *x, int peer, uint64_t tag,
                           void *buf, size_t len)
{
    rg_comm_t *comm = req->comm;
    x->peer = peer;
    x->is_recv = true;
    x->active = false;
    x->ucx = NULL;
    x->len = len;
    if (!comm->healthy) {
        return comm_unhealthy_error(comm, req->name);
    }
    /* Always a request: UCX 1.13 does not fill recv_info on an immediate completion. */
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .memory_type = req->mem,
    };
    ucs_status_ptr_t r = ucp_tag_recv_nbx(comm->worker, buf, len, tag, UINT64_MAX, &param);
    if (UCS_PTR_IS_ERR(r) || r == NULL) {
        if (UCS_PTR_STATUS(r) == UCS_ERR_MESSAGE_TRUNCATED) {
            return rg_error(RG_EPROTO, "%s: message from rank %d longer than %zu bytes",
                            req->name, peer, len);
        }
        return comm_peer_error(comm, peer, "receive", UCS_PTR_STATUS(r));
    }
    x->ucx = r;
    x->active = true;
    return RG_OK;
}

rg_status_t comm_xfer_test(rg_comm_req_t *req, comm_xfer_t *x)
{
    if (!x->active) {
        return RG_OK;
    }
    rg_comm_t *comm = req->comm;
    ucs_status_t st;
    ucp_tag_recv_info_t info = {0};
    if (x->is_recv) {
        st = ucp_tag_recv_request_test(x->ucx, &info);
    } else {
        st = ucp_request_check_status(x->ucx);
    }
    if (st == UCS_INPROGRESS) {
        return RG_INPROGRESS;
    }
    ucp_request_free(x->ucx);
    x->ucx = NULL;
    x->active = false;
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
        return rg_error(RG_EPROTO, "%s: message from rank %d longer than %zu bytes", req->name,
                        x->peer, x->len);
    }
    if (st != UCS_OK) {
        return comm_peer_error(comm, x->peer, x->is_recv ? "receive" : "send", st);
    }
    if (x->is_recv && info.length != x->len) {
        return rg_error(RG_EPROTO, "%s: got %zu bytes from rank %d, expected %zu", req->name,
                        info.length, x->peer, x->len);
    }
    return RG_OK;
}

void comm_xfer_abandon(rg_comm_t *comm, comm_xfer_t *x)
{
    if (!x->active || x->shm) {
        x->active = false;
        return;
    }
    if (x->is_recv) {
        ucp_request_cancel(comm->worker, x->ucx);
    }
    ucp_request_free(x->ucx);
    x->ucx = NULL;
    x->active = false;
}

/* ---- closing ----------------------------------------------------------------------------- */

/* Progresses until the requests (control sends, flushes, closes) are done, at most ms. */
void comm_wait_reqs(rg_comm_t *comm, void **reqs, int n, int64_t ms)
{
    rg_deadline_t deadline = rg_deadline_in_ms(ms);
    for (;;) {
        if (!comm_reqs_pending(reqs, n) || rg_deadline_passed(deadline)) {
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

/* Receives the control messages still queued (peers' leave messages that arrived after the
 * last poll), so that destroying the worker does not warn about unmatched messages. */
static void comm_ctrl_drain(rg_comm_t *comm)
{
    for (int i = 0; i < 4 * comm->size; i++) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h msg = ucp_tag_probe_nb(comm->worker, COMM_TAG_CTRL,
                                                 COMM_TAG_CTRL | COMM_TAG_P2P, 1, &info);
        if (msg == NULL) {
            return;
        }
        ucp_request_param_t param = {0};
        ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(comm->worker, comm->ctrl_buf,
                                                  sizeof(comm->ctrl_buf), msg, &param);
        void *reqs[1] = {UCS_PTR_IS_PTR(r) ? r : NULL};
        comm_wait_reqs(comm, reqs, 1, COMM_ABORT_WAIT_MS);
    }
}

void comm_ucx_close(rg_comm_t *comm)
{
    if (comm->worker != NULL) {
        comm->closing = true;
        if (comm->healthy && comm->eps != NULL) {
            /* A clean leave: tell the peers first, so that their endpoint error for us is
             * not taken for a failure. */
            comm_send_ctrl(comm, COMM_CTRL_LEAVE, -1, comm->scratch_reqs);
            comm_wait_reqs(comm, comm->scratch_reqs, comm->size, COMM_CLOSE_WAIT_MS);
        }
        if (comm->eps != NULL) {
            comm_close_eps(comm, !comm->healthy, COMM_CLOSE_WAIT_MS);
        }
        if (comm->ctrl_req != NULL) {
            ucp_request_cancel(comm->worker, comm->ctrl_req);
            ucp_request_free(comm->ctrl_req);
            comm->ctrl_req = NULL;
        }
        comm_ctrl_drain(comm);
        ucp_worker_destroy(comm->worker);
        comm->worker = NULL;
    }
    if (comm->ctx != NULL) {
        ucp_cleanup(comm->ctx);
        comm->ctx = NULL;
    }
    for (size_t i = 0; i < comm->n_grave; i++) {
        free(comm->grave[i]);
    }
    free(comm->grave);
    comm->grave = NULL;
    comm->n_grave = 0;
}
