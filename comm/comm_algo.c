/*
 * The collective algorithms on UCX transfers, except the ring (comm_ring.c), and setting a
 * request up for the algorithm rg__comm_algo_choose picked (comm_choose.c).
 *
 * Small messages take few, latency-bound rounds:
 *   barrier         dissemination (ceil(log2 n) rounds, any n)
 *   broadcast       binomial tree
 *   allreduce       recursive doubling; for n not a power of two, the first 2*rem ranks fold
 *                   pairwise into rem ranks before and unfold after
 *   allgather       direct exchange with every peer (one round)
 *   reduce_scatter  direct exchange, then a local fold in a fixed order
 * Large messages use the segmented ring; broadcast scatters from the root first. Allreduces
 * between the two, on a power of two ranks, may use recursive halving/doubling.
 * A phase posts its transfers; when they are all done, its `done` step reduces what arrived.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    rg_status_t (*post)(rg_comm_req_t *req, int phase);
    rg_status_t (*done)(rg_comm_req_t *req, int phase); /* may be NULL; RG_INPROGRESS: the
                                                            request switched algorithm */
} comm_phases_t;

static int ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n) {
        k++;
    }
    return k;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* ---- the phase engine ------------------------------------------------------------------ */

static rg_status_t comm_phases_advance(rg_comm_req_t *req)
{
    const comm_phases_t *ph = req->phases;
    for (int guard = 0; guard <= req->n_phases + 1; guard++) {
        if (req->phase >= 0) {
            rg_status_t st = comm_xfers_test(req, 0, req->n_xfers);
            if (st != RG_OK) {
                return st;
            }
            if (ph->done != NULL) {
                st = ph->done(req, req->phase);
                if (st == RG_INPROGRESS) {
                    return req->advance(req); /* switched to the ring */
                }
                if (st != RG_OK) {
                    return st;
                }
            }
        }
        req->phase++;
        if (req->phase >= req->n_phases) {
            return RG_OK;
        }
        rg_status_t st = ph->post(req, req->phase);
        if (st != RG_OK) {
            return st;
        }
    }
    return RG_INPROGRESS;
}

static uint64_t tag_from(rg_comm_req_t *req, int src, uint32_t sub)
{
    return comm_tag(req->comm, src, req->seq, sub);
}

static rg_status_t send_to(rg_comm_req_t *req, int xi, int peer, uint32_t sub, const void *buf,
                           size_t len)
{
    return comm_xfer_send(req, &req->xfers[xi], peer, tag_from(req, req->comm->rank, sub), buf,
                          len);
}

static rg_status_t recv_from(rg_comm_req_t *req, int xi, int peer, uint32_t sub, void *buf,
                             size_t len)
{
    return comm_xfer_recv(req, &req->xfers[xi], peer, tag_from(req, peer, sub), buf, len);
}

/* ---- barrier --------------------------------------------------------------------------- */

static rg_status_t barrier_post(rg_comm_req_t *req, int k)
{
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const int d = 1 << k;
    rg_status_t st = recv_from(req, 0, mod(r - d, n), (uint32_t)k, req->tmp + 1, 1);
    if (st == RG_OK) {
        st = send_to(req, 1, mod(r + d, n), (uint32_t)k, req->tmp, 1);
    }
    return st;
}

static const comm_phases_t barrier_phases = {barrier_post, NULL};

/* ---- broadcast: binomial tree ---------------------------------------------------------- */

static rg_status_t bcast_tree_post(rg_comm_req_t *req, int phase)
{
    const int n = req->comm->size;
    const int vr = mod(req->comm->rank - req->root, n);
    const size_t len = req->count * req->esize;
    const int low = vr == 0 ? (1 << ceil_log2(n)) : (vr & -vr);
    if (phase == 0) {
        if (vr != 0) {
            return recv_from(req, 0, mod(vr - low + req->root, n), 0, req->out, len);
        }
        return RG_OK;
    }
    int xi = 1;
    for (int m = low >> 1; m >= 1; m >>= 1) {
        if (vr + m < n) {
            rg_status_t st = send_to(req, xi++, mod(vr + m + req->root, n), 0, req->out, len);
            if (st != RG_OK) {
                return st;
            }
        }
    }
    return RG_OK;
}

static const comm_phases_t bcast_tree_phases = {bcast_tree_post, NULL};

/* ---- broadcast: scatter from the root, then ring allgather ----------------------------- */

static void chunk_range(size_t count, int n, int c, size_t *off, size_t *len)
{
    size_t base = count / (size_t)n;
    size_t rem = count % (size_t)n;
    *off = (size_t)c * base + RG_MIN((size_t)c, rem);
    *len = base + ((size_t)c < rem ? 1 : 0);
}

static rg_status_t bcast_scatter_post(rg_comm_req_t *req, int phase)
{
    (void)phase;
    const int n = req->comm->size;
    const int r = req->comm->rank;
    size_t off;
    size_t len;
    if (r != req->root) {
        chunk_range(req->count, n, r, &off, &len);
        return len ? recv_from(req, 0, req->root, 0, req->out + off * req->esize,
                               len * req->esize)
                   : RG_OK;
    }
    for (int c = 0, xi = 0; c < n; c++) {
        chunk_range(req->count, n, c, &off, &len);
        if (c == r || len == 0) {
            continue;
        }
        rg_status_t st = send_to(req, xi++, c, 0, req->out + off * req->esize, len * req->esize);
        if (st != RG_OK) {
            return st;
        }
    }
    return RG_OK;
}

static rg_status_t bcast_scatter_done(rg_comm_req_t *req, int phase)
{
    (void)phase;
    comm_ring_cfg_t cfg = {
        .do_ag = true,
        .shift = -1,
        .base = req->count / (size_t)req->comm->size,
        .rem = req->count % (size_t)req->comm->size,
    };
    rg_status_t st = comm_ring_init(req, &cfg);
    return st == RG_OK ? RG_INPROGRESS : st;
}

static const comm_phases_t bcast_scatter_phases = {bcast_scatter_post, bcast_scatter_done};

/* ---- allreduce: recursive doubling ----------------------------------------------------- */

typedef struct {
    int p2;     /* largest power of two <= n */
    int rem;    /* n - p2 */
    int vrank;  /* rank among the p2, or -1 while folded out */
} rd_shape_t;

static rd_shape_t rd_shape(int n, int r)
{
    rd_shape_t s;
    s.p2 = 1 << (ceil_log2(n + 1) - 1);
    s.rem = n - s.p2;
    if (r < 2 * s.rem) {
        s.vrank = (r % 2 == 1) ? r / 2 : -1;
    } else {
        s.vrank = r - s.rem;
    }
    return s;
}

static int rd_real(const rd_shape_t *s, int v)
{
    return v < s->rem ? 2 * v + 1 : v + s->rem;
}

static rg_status_t rd_post(rg_comm_req_t *req, int phase)
{
    const int r = req->comm->rank;
    const rd_shape_t s = rd_shape(req->comm->size, r);
    const size_t len = req->count * req->esize;
    const int last = req->n_phases - 1;
    if (phase == 0 || phase == last) {
        if (phase == last && s.vrank >= 0) {
            rg_status_t st = comm_local_scale(req, req->out, req->count);
            if (st != RG_OK) {
                return st;
            }
        }
        if (r >= 2 * s.rem) {
            return RG_OK;
        }
        bool even = r % 2 == 0;
        if (phase == 0) {
            return even ? send_to(req, 0, r + 1, 0, req->out, len)
                        : recv_from(req, 0, r - 1, 0, req->tmp, len);
        }
        return even ? recv_from(req, 0, r + 1, (uint32_t)phase, req->out, len)
                    : send_to(req, 0, r - 1, (uint32_t)phase, req->out, len);
    }
    if (s.vrank < 0) {
        return RG_OK;
    }
    int partner = rd_real(&s, s.vrank ^ (1 << (phase - 1)));
    rg_status_t st = recv_from(req, 0, partner, (uint32_t)phase, req->tmp, len);
    if (st == RG_OK) {
        st = send_to(req, 1, partner, (uint32_t)phase, req->out, len);
    }
    return st;
}

static rg_status_t rd_done(rg_comm_req_t *req, int phase)
{
    const int r = req->comm->rank;
    const rd_shape_t s = rd_shape(req->comm->size, r);
    if (phase == req->n_phases - 1 || s.vrank < 0) {
        return RG_OK;
    }
    if (phase == 0 && r >= 2 * s.rem) {
        return RG_OK;
    }
    return comm_local_reduce(req, req->out, req->out, req->tmp, req->count);
}

static const comm_phases_t rd_phases = {rd_post, rd_done};

/* ---- allreduce: recursive halving, then recursive doubling (n a power of two) ------------
 *
 * Chunk c of the buffer (chunk_range) ends on rank c. Reduce-scatter phase j (0..k-1) pairs
 * ranks d = n >> (j + 1) apart; each keeps the half of its current window of 2d chunks on its
 * side of bit d, sends the other half, and reduces what the partner sent for the kept half.
 * After k phases rank r holds chunk r reduced over every rank, computed there alone, so every
 * rank ends with the same bits. Allgather phase k + j pairs ranks 1 << j apart and swaps
 * windows of 1 << j chunks. The bytes sent equal the ring's, in 2 log2(n) steps instead of
 * 2(n - 1). */

static void chunks_span(const rg_comm_req_t *req, int a, int b, size_t *off, size_t *len)
{
    size_t end;
    size_t l;
    chunk_range(req->count, req->comm->size, a, off, &l);
    chunk_range(req->count, req->comm->size, b - 1, &end, &l);
    *len = end + l - *off;
}

/* The chunks rank r keeps and sends in reduce-scatter phase j. */
static void rhd_halves(int r, int d, int *keep, int *give)
{
    int w0 = r & ~(2 * d - 1);
    *keep = (r & d) ? w0 + d : w0;
    *give = (r & d) ? w0 : w0 + d;
}

static rg_status_t rhd_post(rg_comm_req_t *req, int phase)
{
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const int k = req->n_phases / 2;
    const size_t es = req->esize;
    size_t off;
    size_t len;
    if (phase < k) {
        const int d = n >> (phase + 1);
        int keep;
        int give;
        rhd_halves(r, d, &keep, &give);
        chunks_span(req, keep, keep + d, &off, &len);
        rg_status_t st = recv_from(req, 0, r ^ d, (uint32_t)phase, req->tmp, len * es);
        if (st != RG_OK) {
            return st;
        }
        chunks_span(req, give, give + d, &off, &len);
        return send_to(req, 1, r ^ d, (uint32_t)phase, (phase == 0 ? req->in : req->out) +
                       off * es, len * es);
    }
    const int d = 1 << (phase - k);
    const int partner = r ^ d;
    const int mine = r & ~(d - 1);
    const int theirs = partner & ~(d - 1);
    chunks_span(req, theirs, theirs + d, &off, &len);
    rg_status_t st = recv_from(req, 0, partner, (uint32_t)phase, req->out + off * es, len * es);
    if (st != RG_OK) {
        return st;
    }
    chunks_span(req, mine, mine + d, &off, &len);
    return send_to(req, 1, partner, (uint32_t)phase, req->out + off * es, len * es);
}

static rg_status_t rhd_done(rg_comm_req_t *req, int phase)
{
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const int k = req->n_phases / 2;
    if (phase >= k) {
        return RG_OK;
    }
    const int d = n >> (phase + 1);
    int keep;
    int give;
    size_t off;
    size_t len;
    rhd_halves(r, d, &keep, &give);
    chunks_span(req, keep, keep + d, &off, &len);
    char *dst = req->out + off * req->esize;
    rg_status_t st = comm_local_reduce(req, dst, (phase == 0 ? req->in : req->out) +
                                       off * req->esize, req->tmp, len);
    if (st == RG_OK && phase == k - 1) {
        st = comm_local_scale(req, dst, len);
    }
    return st;
}

static const comm_phases_t rhd_phases = {rhd_post, rhd_done};

/* ---- allgather: direct ----------------------------------------------------------------- */

static rg_status_t ag_direct_post(rg_comm_req_t *req, int phase)
{
    (void)phase;
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const size_t blk = req->count * req->esize;
    for (int i = 1, xi = 0; i < n; i++) {
        int to = mod(r + i, n);
        int from = mod(r - i, n);
        rg_status_t st = recv_from(req, xi++, from, 0, req->out + (size_t)from * blk, blk);
        if (st == RG_OK) {
            st = send_to(req, xi++, to, 0, req->out + (size_t)r * blk, blk);
        }
        if (st != RG_OK) {
            return st;
        }
    }
    return RG_OK;
}

static const comm_phases_t ag_direct_phases = {ag_direct_post, NULL};

/* ---- reduce_scatter: direct ------------------------------------------------------------ */

static rg_status_t rs_direct_post(rg_comm_req_t *req, int phase)
{
    (void)phase;
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const size_t blk = req->count * req->esize;
    for (int i = 1, xi = 0; i < n; i++) {
        int to = mod(r + i, n);
        int from = mod(r - i, n);
        int slot = from < r ? from : from - 1;
        rg_status_t st = recv_from(req, xi++, from, 0, req->tmp + (size_t)slot * blk, blk);
        if (st == RG_OK) {
            st = send_to(req, xi++, to, 0, req->in + (size_t)to * blk, blk);
        }
        if (st != RG_OK) {
            return st;
        }
    }
    return RG_OK;
}

static rg_status_t rs_direct_done(rg_comm_req_t *req, int phase)
{
    (void)phase;
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const size_t blk = req->count * req->esize;
    char *dst = req->dst;
    const char *own = req->in + (size_t)r * blk;
    /* Own contribution first, then the others in rank order after it: a fixed order. */
    for (int i = 1; i < n; i++) {
        int from = mod(r + i, n);
        int slot = from < r ? from : from - 1;
        rg_status_t st = comm_local_reduce(req, dst, i == 1 ? own : dst,
                                           req->tmp + (size_t)slot * blk, req->count);
        if (st != RG_OK) {
            return st;
        }
    }
    return comm_local_scale(req, dst, req->count);
}

static const comm_phases_t rs_direct_phases = {rs_direct_post, rs_direct_done};

/* ---- setting a request up for the chosen algorithm ----------------------------------- */

rg_status_t comm_done_advance(rg_comm_req_t *req)
{
    (void)req;
    return RG_OK;
}

static rg_status_t use_phases(rg_comm_req_t *req, const comm_phases_t *ph, int n_phases,
                              int n_xfers, size_t tmp_bytes)
{
    req->phases = ph;
    req->n_phases = n_phases;
    req->phase = -1;
    req->advance = comm_phases_advance;
    if (n_xfers > 0 && comm_xfers_alloc(req, n_xfers) == NULL) {
        return rg_error(RG_ENOMEM, "%s: out of memory", req->name);
    }
    if (tmp_bytes > 0 && tmp_bytes <= sizeof(req->tmp_inline.bytes) &&
        req->mem == UCS_MEMORY_TYPE_HOST) {
        req->tmp = req->tmp_inline.bytes;
    } else if (tmp_bytes > 0) {
        req->tmp = comm_buf_alloc(req, tmp_bytes);
        if (req->tmp == NULL) {
            return rg_error(RG_ENOMEM, "%s: out of memory for %zu scratch bytes", req->name,
                            tmp_bytes);
        }
    }
    return RG_OK;
}

/* What every rank does alone: with one rank the result is the input (reduce_scatter: scaled
 * for avg), written to `final` for reduce_scatter; with no elements, nothing. */
static rg_status_t local_only(rg_comm_req_t *req, comm_coll_t coll, char *final)
{
    const size_t bytes = req->count * req->esize;
    req->advance = comm_done_advance;
    if (req->count == 0 || coll == COMM_BARRIER || coll == COMM_BCAST) {
        return RG_OK;
    }
    if (coll == COMM_ALLREDUCE) {
        return comm_local_copy(req, req->out, req->in, bytes);
    }
    if (coll == COMM_ALLGATHER) {
        return req->in != NULL ? comm_local_copy(req, req->out, req->in, bytes) : RG_OK;
    }
    rg_status_t st = comm_local_copy(req, final, req->in, bytes);
    if (st == RG_OK) {
        st = comm_local_scale(req, final, req->count);
    }
    return st;
}

rg_status_t comm_algo_start(rg_comm_req_t *req, comm_coll_t coll, comm_algo_t algo)
{
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const size_t bytes = req->count * req->esize;
    /* reduce_scatter: where this rank's block of the result goes */
    char *final = req->in == req->out ? req->out + (size_t)r * bytes : req->out;
    rg_status_t st;

    if (coll == COMM_ALLGATHER && req->in != NULL && algo != COMM_ALGO_LOCAL &&
        algo != COMM_ALGO_SHM) {
        /* the own block, in place for the exchange */
        st = comm_local_copy(req, req->out + (size_t)r * bytes, req->in, bytes);
        if (st != RG_OK) {
            return st;
        }
    }
    switch (algo) {
    case COMM_ALGO_LOCAL:
        return local_only(req, coll, final);
    case COMM_ALGO_SHM:
        return comm_shm_use(req);
    case COMM_ALGO_DISSEMINATION:
        st = use_phases(req, &barrier_phases, ceil_log2(n), 2, 2);
        if (st == RG_OK) {
            memset(req->tmp, 0, 2);
        }
        return st;
    case COMM_ALGO_TREE:
        return use_phases(req, &bcast_tree_phases, 2, 1 + ceil_log2(n), 0);
    case COMM_ALGO_SCATTER_RING:
        return use_phases(req, &bcast_scatter_phases, 1, n, 0);
    case COMM_ALGO_RD:
        st = comm_local_copy(req, req->out, req->in, bytes);
        if (st != RG_OK) {
            return st;
        }
        return use_phases(req, &rd_phases, 2 + ceil_log2(rd_shape(n, r).p2), 2, bytes);
    case COMM_ALGO_RHD: {
        size_t half = (req->count / (size_t)n + 1) * (size_t)(n / 2) * req->esize;
        return use_phases(req, &rhd_phases, 2 * ceil_log2(n), 2, half);
    }
    case COMM_ALGO_RING: {
        comm_ring_cfg_t cfg = {0};
        if (coll == COMM_ALLREDUCE) {
            /* Out of place needs no copy: each reduce-scatter step reads sendbuf's chunk and
             * writes recvbuf's; the one chunk never reduced here arrives by allgather. */
            cfg = (comm_ring_cfg_t){.do_rs = true, .do_ag = true,
                                    .base = req->count / (size_t)n,
                                    .rem = req->count % (size_t)n};
        } else if (coll == COMM_ALLGATHER) {
            cfg = (comm_ring_cfg_t){.do_ag = true, .shift = -1, .base = req->count};
        } else if (coll == COMM_REDSCAT) {
            cfg = (comm_ring_cfg_t){.do_rs = true, .shift = -1, .base = req->count,
                                    .rs_final = final};
        } else {
            break;
        }
        return comm_ring_init(req, &cfg);
    }
    case COMM_ALGO_DIRECT:
        if (coll == COMM_ALLGATHER) {
            return use_phases(req, &ag_direct_phases, 1, 2 * (n - 1), 0);
        }
        if (coll == COMM_REDSCAT) {
            st = use_phases(req, &rs_direct_phases, 1, 2 * (n - 1), (size_t)(n - 1) * bytes);
            req->dst = final;
            return st;
        }
        break;
    case COMM_ALGO_COUNT:
        break;
    }
    return rg_error(RG_EINVAL, "%s: no %s algorithm for it", req->name, rg__comm_algo_name(algo));
}
