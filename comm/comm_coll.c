/*
 * Posting a collective: checks its arguments, makes the request, asks rg__comm_algo_choose
 * (comm_choose.c) which algorithm runs it, counts and logs that choice, and hands the request
 * to comm_algo.c to set it up. Also the local data movement every algorithm uses, on host or
 * device memory.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- local data movement, host or device ----------------------------------------------- */

void *comm_buf_alloc(rg_comm_req_t *req, size_t bytes)
{
    if (req->mem == UCS_MEMORY_TYPE_CUDA) {
        return comm_dev_alloc(bytes);
    }
    if (bytes < COMM_SCRATCH_MIN_BYTES) {
        return malloc(bytes ? bytes : 1);
    }
    /* The smallest kept buffer that fits; else a new one, kept in a free slot or in place of
     * a kept one too small (freed); with every slot handed out, a new one not kept. */
    comm_scratch_t *sc = req->comm->scratch;
    comm_scratch_t *fit = NULL;
    comm_scratch_t *room = NULL;
    for (int i = 0; i < COMM_SCRATCH_KEPT; i++) {
        if (sc[i].p != NULL && !sc[i].out && sc[i].cap >= bytes &&
            (fit == NULL || sc[i].cap < fit->cap)) {
            fit = &sc[i];
        }
    }
    for (int i = 0; i < COMM_SCRATCH_KEPT && room == NULL; i++) {
        room = sc[i].p == NULL ? &sc[i] : NULL;
    }
    for (int i = 0; i < COMM_SCRATCH_KEPT && room == NULL; i++) {
        room = !sc[i].out ? &sc[i] : NULL;
    }
    if (fit != NULL) {
        fit->out = true;
        return fit->p;
    }
    void *p = malloc(bytes);
    if (p != NULL && room != NULL) {
        free(room->p);
        *room = (comm_scratch_t){.p = p, .cap = bytes, .out = true};
    }
    return p;
}

void comm_buf_free(rg_comm_req_t *req, void *p)
{
    if (p == NULL || p == req->tmp_inline.bytes) {
        return;
    }
    if (req->mem == UCS_MEMORY_TYPE_CUDA) {
        comm_dev_free(p);
        return;
    }
    for (int i = 0; i < COMM_SCRATCH_KEPT; i++) {
        if (req->comm->scratch[i].p == p) {
            req->comm->scratch[i].out = false; /* kept for the next request */
            return;
        }
    }
    free(p);
}

void comm_scratch_forget(rg_comm_t *comm, const void *p)
{
    for (int i = 0; p != NULL && i < COMM_SCRATCH_KEPT; i++) {
        if (comm->scratch[i].p == p) {
            comm->scratch[i] = (comm_scratch_t){0};
        }
    }
}

void comm_scratch_free_all(rg_comm_t *comm)
{
    for (int i = 0; i < COMM_SCRATCH_KEPT; i++) {
        if (!comm->scratch[i].out) {
            free(comm->scratch[i].p);
        }
        comm->scratch[i] = (comm_scratch_t){0};
    }
}

rg_status_t comm_local_copy(rg_comm_req_t *req, void *dst, const void *src, size_t bytes)
{
    if (dst == src || bytes == 0) {
        return RG_OK;
    }
    if (req->mem == UCS_MEMORY_TYPE_CUDA) {
        return comm_copy_dev(dst, src, bytes);
    }
    memmove(dst, src, bytes);
    return RG_OK;
}

rg_status_t comm_local_reduce(rg_comm_req_t *req, void *dst, const void *a, const void *b,
                              size_t n)
{
    if (req->mem == UCS_MEMORY_TYPE_CUDA) {
        return comm_reduce_dev(req->dtype, req->op, dst, a, b, n);
    }
    comm_reduce(req->dtype, req->op, dst, a, b, n);
    return RG_OK;
}

rg_status_t comm_local_scale(rg_comm_req_t *req, void *buf, size_t n)
{
    if (req->op != RG_OP_AVG) {
        return RG_OK;
    }
    if (req->mem == UCS_MEMORY_TYPE_CUDA) {
        return comm_reduce_scale_dev(req->dtype, buf, n, req->comm->size);
    }
    comm_reduce_scale(req->dtype, buf, n, req->comm->size);
    return RG_OK;
}

rg_status_t comm_coll_post(rg_comm_t *comm, comm_coll_t kind, const void *sendbuf, void *recvbuf,
                           size_t count, rg_dtype_t dtype, rg_redop_t op, int root,
                           const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
{
    static const char *const names[] = {"barrier", "broadcast", "allreduce", "allgather",
                                        "reduce_scatter"};
    const char *name = names[kind];
    rg_status_t st = comm_check_args(comm, name, dtype, count,
                                     comm != NULL && (kind == COMM_ALLGATHER ||
                                                      kind == COMM_REDSCAT)
                                         ? (size_t)comm->size
                                         : 1,
                                     opts, req_p);
    if (st != RG_OK) {
        return st;
    }
    if (kind == COMM_ALLREDUCE || kind == COMM_REDSCAT) {
        st = comm_check_op(name, dtype, op);
        if (st != RG_OK) {
            return st;
        }
    }
    if (kind == COMM_BCAST && (root < 0 || root >= comm->size)) {
        return rg_error(RG_EINVAL, "%s: root %d out of range (size %d)", name, root,
                        comm->size);
    }
    if (kind != COMM_BARRIER && count > 0 && (recvbuf == NULL || sendbuf == NULL)) {
        return rg_error(RG_EINVAL, "%s: NULL buffer", name);
    }
    rg_comm_req_t *req = NULL;
    st = comm_req_new(comm, name, opts, 0, &req);
    if (st != RG_OK) {
        return st;
    }
    req->seq = comm->seq++;
    req->kind = kind;
    req->dtype = dtype;
    req->op = op;
    req->esize = rg_dtype_size(dtype);
    req->count = count;
    req->root = root;
    req->out = recvbuf;
    bool in_place = sendbuf == RG_COMM_IN_PLACE || sendbuf == recvbuf;
    req->in = in_place ? (kind == COMM_ALLGATHER ? NULL : recvbuf) : sendbuf;
    const comm_algo_t algo = rg__comm_algo_choose(
        &comm->tuning, kind, comm->size, count, req->esize,
        req->mem == UCS_MEMORY_TYPE_CUDA ? RG_MEM_CUDA : RG_MEM_HOST, comm_shm_on(comm));
    rg_debug("%s #%u of %zu bytes on %d ranks: %s", name, req->seq, count * req->esize,
             comm->size, rg__comm_algo_name(algo));
    st = comm_algo_start(req, kind, algo);
    if (st != RG_OK) {
        comm_req_release(req);
        return st;
    }
    comm->algo_ops[kind][algo]++;
    (void)comm_req_start(req);
    *req_p = req;
    return RG_OK;
}

uint64_t rg__comm_algo_count(const rg_comm_t *comm, comm_coll_t coll, comm_algo_t algo)
{
    if (comm == NULL || (unsigned)coll >= COMM_COLL_COUNT || (unsigned)algo >= COMM_ALGO_COUNT) {
        return 0;
    }
    return comm->algo_ops[coll][algo];
}
