/*
 * Requests (post, test, wait, free), argument checks, point to point, and the public entry
 * points of the collectives (which hand over to comm_coll.c).
 */
#include "comm_internal.h"

#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Spins of progress without news before yielding the core to another process. */
#define COMM_SPIN_BEFORE_YIELD 64

rg_status_t comm_req_new(rg_comm_t *comm, const char *name, const rg_comm_opts_t *opts,
                         int n_xfers, rg_comm_req_t **req_p)
{
    if (!comm->healthy) {
        return comm_unhealthy_error(comm, name);
    }
    rg_comm_req_t *req = comm->req_cache;
    if (req != NULL) {
        comm->req_cache = NULL;
        memset(req, 0, offsetof(rg_comm_req_t, xfers_inline));
    } else {
        req = calloc(1, sizeof(*req));
    }
    if (req == NULL) {
        return rg_error(RG_ENOMEM, "%s: out of memory", name);
    }
    if (n_xfers > 0 && comm_xfers_alloc(req, n_xfers) == NULL) {
        free(req);
        return rg_error(RG_ENOMEM, "%s: out of memory", name);
    }
    req->comm = comm;
    req->name = name;
    req->status = RG_INPROGRESS;
    req->deadline = (opts != NULL && opts->deadline != 0) ? opts->deadline
                                                          : rg_deadline_in_ms(comm->timeout_ms);
    req->mem = (opts != NULL && opts->mem_type == RG_MEM_CUDA) ? UCS_MEMORY_TYPE_CUDA
                                                               : UCS_MEMORY_TYPE_HOST;
    req->root = -1;
    *req_p = req;
    return RG_OK;
}

static void comm_req_free_buffers(rg_comm_req_t *req)
{
    comm_ring_free(req);
    comm_buf_free(req, req->tmp);
    comm_buf_free(req, req->acc);
    req->tmp = NULL;
    req->acc = NULL;
}

comm_xfer_t *comm_xfers_alloc(rg_comm_req_t *req, int n)
{
    comm_xfer_t *x = req->xfers_inline;
    if ((size_t)n > RG_ARRAY_SIZE(req->xfers_inline)) {
        x = calloc((size_t)n, sizeof(*x));
        if (x == NULL) {
            return NULL;
        }
    } else {
        memset(x, 0, sizeof(req->xfers_inline));
    }
    req->xfers = x;
    req->n_xfers = n;
    return x;
}

void comm_xfers_free(rg_comm_req_t *req)
{
    if (req->xfers != req->xfers_inline) {
        free(req->xfers);
    }
    req->xfers = NULL;
    req->n_xfers = 0;
}

rg_status_t comm_xfers_test(rg_comm_req_t *req, int first, int n)
{
    rg_status_t result = RG_OK;
    for (int i = first; i < first + n; i++) {
        rg_status_t st = comm_xfer_test(req, &req->xfers[i]);
        if (st == RG_INPROGRESS) {
            result = RG_INPROGRESS;
        } else if (st != RG_OK) {
            return st;
        }
    }
    return result;
}

void comm_req_bury(rg_comm_req_t *req)
{
    /* Device scratch would need cudaFree after the worker is gone; host only here. */
    if (req->tmp == req->tmp_inline.bytes) {
        /* inline scratch only takes single-fragment messages: complete once matched */
        req->tmp = NULL;
    }
    if (req->mem == UCS_MEMORY_TYPE_HOST) {
        comm_grave_add(req->comm, req->tmp);
        comm_grave_add(req->comm, req->acc);
        req->tmp = NULL;
        req->acc = NULL;
    }
}

void comm_req_finish(rg_comm_req_t *req, rg_status_t status)
{
    rg_comm_t *comm = req->comm;
    if (req->posted) {
        if (req->prev != NULL) {
            req->prev->next = req->next;
        } else {
            comm->head = req->next;
        }
        if (req->next != NULL) {
            req->next->prev = req->prev;
        } else {
            comm->tail = req->prev;
        }
        req->prev = req->next = NULL;
        req->posted = false;
        comm->n_posted--;
        comm->n_posted_shm -= req->uses_shm;
    }
    req->status = status;
    if (status < 0) {
        snprintf(req->errmsg, sizeof(req->errmsg), "%s", rg_last_error());
    }
    comm_req_free_buffers(req);
}

void comm_req_release(rg_comm_req_t *req)
{
    comm_req_free_buffers(req);
    comm_xfers_free(req);
    free(req);
}

rg_status_t comm_req_start(rg_comm_req_t *req)
{
    rg_comm_t *comm = req->comm;
    req->prev = comm->tail;
    req->next = NULL;
    if (comm->tail != NULL) {
        comm->tail->next = req;
    } else {
        comm->head = req;
    }
    comm->tail = req;
    req->posted = true;
    comm->n_posted++;
    comm->n_posted_shm += req->uses_shm;
    rg_status_t st = req->advance(req);
    if (st != RG_INPROGRESS) {
        if (st != RG_OK && comm->healthy && !req->is_p2p) {
            st = comm_fail(comm, st, -1, true, "%s: %s", req->name, rg_last_error());
        }
        if (req->posted) {
            comm_req_finish(req, st);
        }
    }
    return RG_OK;
}

rg_status_t rg_comm_req_test(rg_comm_req_t *req)
{
    if (req == NULL) {
        return rg_error(RG_EINVAL, "rg_comm_req_test: NULL request");
    }
    if (req->status == RG_INPROGRESS) {
        (void)comm_progress(req->comm);
    }
    if (req->status < 0) {
        return rg_error(req->status, "%s", req->errmsg);
    }
    return req->status;
}

rg_status_t rg_comm_req_wait(rg_comm_req_t *req)
{
    if (req == NULL) {
        return rg_error(RG_EINVAL, "rg_comm_req_wait: NULL request");
    }
    if (req->status != RG_INPROGRESS) {
        return req->status < 0 ? rg_error(req->status, "%s", req->errmsg) : RG_OK;
    }
    uint64_t t0 = rg_now_ns();
    unsigned idle = 0;
    /* With more ranks than cores here, a waiting rank gives its core away at once (as MPI
     * does when oversubscribed): the peer it waits for may be the one that needs it. */
    const unsigned spin = req->comm->oversubscribed ? 1 : COMM_SPIN_BEFORE_YIELD;
    /* Bounded by the request's deadline, which comm_progress enforces. */
    while (req->status == RG_INPROGRESS) {
        if (comm_progress(req->comm)) {
            idle = 0;
        } else if (++idle >= spin) {
            idle = 0;
            sched_yield();
            req->comm->ucx_due = true;
        }
    }
    req->comm->wait_ns += rg_now_ns() - t0;
    if (req->status < 0) {
        return rg_error(req->status, "%s", req->errmsg);
    }
    return RG_OK;
}

uint64_t rg_comm_wait_ns(const rg_comm_t *comm)
{
    return comm != NULL ? comm->wait_ns : 0;
}

void rg_comm_req_free(rg_comm_req_t *req)
{
    if (req == NULL) {
        return;
    }
    if (req->status == RG_INPROGRESS && req->posted) {
        (void)comm_fail(req->comm, RG_ECANCELED, req->comm->rank, true,
                        "%s: request freed before it completed", req->name);
    }
    comm_req_release(req);
}

rg_status_t comm_req_run(rg_status_t post_status, rg_comm_req_t *req)
{
    if (post_status != RG_OK) {
        return post_status;
    }
    rg_status_t st = rg_comm_req_wait(req);
    rg_comm_t *comm = req->comm;
    if (comm->req_cache == NULL && req->xfers != NULL && req->xfers != req->xfers_inline) {
        comm_xfers_free(req);
    }
    if (comm->req_cache == NULL && (req->xfers == NULL || req->xfers == req->xfers_inline)) {
        /* blocking calls reuse one request: no allocation on the latency path */
        comm_req_free_buffers(req);
        comm->req_cache = req;
    } else {
        comm_req_release(req);
    }
    return st;
}

/* ---- argument checks ------------------------------------------------------------------- */

rg_status_t comm_check_args(rg_comm_t *comm, const char *name, rg_dtype_t dtype, size_t count,
                            size_t mult, const rg_comm_opts_t *opts, void *req_p)
{
    if (comm == NULL || req_p == NULL) {
        return rg_error(RG_EINVAL, "%s: NULL group or request pointer", name);
    }
    size_t esize = rg_dtype_size(dtype);
    if (esize == 0) {
        return rg_error(RG_EINVAL, "%s: unknown dtype %d", name, (int)dtype);
    }
    if (count > SIZE_MAX / esize / mult || count * esize * mult > (size_t)PTRDIFF_MAX) {
        return rg_error(RG_EINVAL, "%s: count %zu of %zu-byte elements overflows", name, count,
                        esize);
    }
    if (opts != NULL && opts->mem_type != RG_MEM_HOST && opts->mem_type != RG_MEM_CUDA) {
        return rg_error(RG_EINVAL, "%s: unknown memory type %d", name, (int)opts->mem_type);
    }
    if (opts != NULL && opts->mem_type == RG_MEM_CUDA && !comm_cuda_available()) {
        return rg_error(RG_ENOTSUP,
                        "%s: CUDA device buffers are not supported here: they need a build with "
                        "CUDA (REGROUP_CUDA) and a CUDA device", name);
    }
    if (opts != NULL && opts->mem_type == RG_MEM_CUDA && comm->size > 1 && !comm->ucx_cuda) {
        return rg_error(RG_ENOTSUP,
                        "%s: CUDA device buffers are not supported here: this UCX cannot move "
                        "device memory (it was built without CUDA support; see ucx_info -d)",
                        name);
    }
    if (!comm->healthy) {
        return comm_unhealthy_error(comm, name);
    }
    return RG_OK;
}

rg_status_t comm_check_op(const char *name, rg_dtype_t dtype, rg_redop_t op)
{
    if ((unsigned)op > RG_OP_PROD) {
        return rg_error(RG_EINVAL, "%s: unknown reduction %d", name, (int)op);
    }
    if (op == RG_OP_AVG && (dtype == RG_DTYPE_I32 || dtype == RG_DTYPE_I64 ||
                            dtype == RG_DTYPE_U8)) {
        return rg_error(RG_EINVAL, "%s: avg is defined on floating types only", name);
    }
    return RG_OK;
}

/* ---- point to point -------------------------------------------------------------------- */

static rg_status_t comm_p2p_advance(rg_comm_req_t *req)
{
    return comm_xfer_test(req, &req->xfers[0]);
}

static rg_status_t comm_p2p_post(rg_comm_t *comm, bool is_recv, void *buf, size_t count,
                                 rg_dtype_t dtype, int peer, uint32_t tag,
                                 const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
{
    const char *name = is_recv ? "recv" : "send";
    rg_status_t st = comm_check_args(comm, name, dtype, count, 1, opts, req_p);
    if (st != RG_OK) {
        return st;
    }
    if (peer < 0 || peer >= comm->size || peer == comm->rank) {
        return rg_error(RG_EINVAL, "%s: peer %d out of range (size %d, self %d)", name, peer,
                        comm->size, comm->rank);
    }
    if (buf == NULL && count > 0) {
        return rg_error(RG_EINVAL, "%s: NULL buffer", name);
    }
    rg_comm_req_t *req = NULL;
    st = comm_req_new(comm, name, opts, 1, &req);
    if (st != RG_OK) {
        return st;
    }
    req->is_p2p = true;
    req->p2p_peer = peer;
    req->advance = comm_p2p_advance;
    size_t len = count * rg_dtype_size(dtype);
    int src = is_recv ? peer : comm->rank;
    uint64_t t = COMM_TAG_P2P | ((uint64_t)src << COMM_TAG_SRC_SHIFT) | tag;
    st = is_recv ? comm_xfer_recv(req, &req->xfers[0], peer, t, buf, len)
                 : comm_xfer_send(req, &req->xfers[0], peer, t, buf, len);
    if (st != RG_OK) {
        comm_req_release(req);
        return st;
    }
    (void)comm_req_start(req);
    *req_p = req;
    return RG_OK;
}

rg_status_t rg_comm_send_post(rg_comm_t *comm, const void *buf, size_t count, rg_dtype_t dtype,
                              int peer, uint32_t tag, const rg_comm_opts_t *opts,
                              rg_comm_req_t **req_p)
{
    return comm_p2p_post(comm, false, (void *)buf, count, dtype, peer, tag, opts, req_p);
}

rg_status_t rg_comm_recv_post(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype,
                              int peer, uint32_t tag, const rg_comm_opts_t *opts,
                              rg_comm_req_t **req_p)
{
    return comm_p2p_post(comm, true, buf, count, dtype, peer, tag, opts, req_p);
}

rg_status_t rg_comm_send(rg_comm_t *comm, const void *buf, size_t count, rg_dtype_t dtype,
                         int peer, uint32_t tag, const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_send_post(comm, buf, count, dtype, peer, tag, opts, &req);
    return comm_req_run(st, req);
}

rg_status_t rg_comm_recv(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype, int peer,
                         uint32_t tag, const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_recv_post(comm, buf, count, dtype, peer, tag, opts, &req);
    return comm_req_run(st, req);
}

/* ---- collectives ----------------------------------------------------------------------- */

rg_status_t rg_comm_barrier_post(rg_comm_t *comm, const rg_comm_opts_t *opts,
                                 rg_comm_req_t **req_p)
{
    return comm_coll_post(comm, COMM_BARRIER, NULL, NULL, 0, RG_DTYPE_U8, RG_OP_SUM, -1, opts,
                          req_p);
}

rg_status_t rg_comm_barrier(rg_comm_t *comm, const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_barrier_post(comm, opts, &req);
    return comm_req_run(st, req);
}

rg_status_t rg_comm_broadcast_post(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype,
                                   int root, const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
{
    return comm_coll_post(comm, COMM_BCAST, buf, buf, count, dtype, RG_OP_SUM, root, opts,
                          req_p);
}

rg_status_t rg_comm_broadcast(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype,
                              int root, const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_broadcast_post(comm, buf, count, dtype, root, opts, &req);
    return comm_req_run(st, req);
}

rg_status_t rg_comm_allreduce_post(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, rg_dtype_t dtype, rg_redop_t op,
                                   const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
{
    return comm_coll_post(comm, COMM_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1, opts,
                          req_p);
}

rg_status_t rg_comm_allreduce(rg_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              rg_dtype_t dtype, rg_redop_t op, const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_allreduce_post(comm, sendbuf, recvbuf, count, dtype, op, opts, &req);
    return comm_req_run(st, req);
}

rg_status_t rg_comm_allgather_post(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, rg_dtype_t dtype, const rg_comm_opts_t *opts,
                                   rg_comm_req_t **req_p)
{
    return comm_coll_post(comm, COMM_ALLGATHER, sendbuf, recvbuf, count, dtype, RG_OP_SUM, -1,
                          opts, req_p);
}

rg_status_t rg_comm_allgather(rg_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              rg_dtype_t dtype, const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_allgather_post(comm, sendbuf, recvbuf, count, dtype, opts, &req);
    return comm_req_run(st, req);
}

rg_status_t rg_comm_reduce_scatter_post(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, rg_dtype_t dtype, rg_redop_t op,
                                        const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
{
    return comm_coll_post(comm, COMM_REDSCAT, sendbuf, recvbuf, count, dtype, op, -1, opts,
                          req_p);
}

rg_status_t rg_comm_reduce_scatter(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, rg_dtype_t dtype, rg_redop_t op,
                                   const rg_comm_opts_t *opts)
{
    rg_comm_req_t *req = NULL;
    rg_status_t st = rg_comm_reduce_scatter_post(comm, sendbuf, recvbuf, count, dtype, op, opts, &req);
    return comm_req_run(st, req);
}
