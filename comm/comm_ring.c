/*
 * The segmented ring: reduce-scatter then allgather, for large messages.
 *
 * The buffer is cut into `size` chunks (chunk c: base elements, plus one when c < rem), and
 * every chunk into the same number of segments. Each segment walks the ring on its own: at
 * every step it sends one segment to the right neighbour and receives one from the left; when
 * both are done it reduces what arrived (reduce-scatter steps) and moves to the next step.
 * A window of segments is in flight at once, so reducing one overlaps the transfer of the
 * others (the pipeline), while what arrives is reduced soon enough to still be in cache.
 * The window slides with the lowest unfinished segment; that segment is inside every rank's
 * window that still needs it, so the ring cannot deadlock. Every rank reduces each chunk in the same order, so all ranks end with the
 * same bits.
 *
 * Step s < rs_steps (reduce-scatter): send chunk r-s+shift, receive chunk r-s-1+shift into
 * scratch and reduce it into the destination. After the last such step rank r owns chunk
 * r+1+shift, fully reduced. Allgather step t: send chunk r+1+shift-t, receive chunk
 * r+shift-t straight into the output.
 */
#include "comm_internal.h"

#include <stdlib.h>

struct comm_ring {
    comm_ring_cfg_t cfg;
    int    rs_steps;
    int    steps;
    int    nseg;
    size_t seg;        /* elements per segment */
    int    n_finished;
    int    lowest;     /* lowest segment not finished */
    int    window;     /* segments in flight: lowest .. lowest + window - 1 */
    int   *step;       /* [nseg]: the step each segment is at */
    bool  *posted;     /* [nseg]: that step's transfers are posted */
};

static int ring_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Elements [*off, *off + *len) of segment j of chunk c. */
static void ring_seg(const struct comm_ring *ring, int c, int j, size_t *off, size_t *len)
{
    const comm_ring_cfg_t *cfg = &ring->cfg;
    size_t coff = (size_t)c * cfg->base + RG_MIN((size_t)c, cfg->rem);
    size_t clen = cfg->base + ((size_t)c < cfg->rem ? 1 : 0);
    size_t start = (size_t)j * ring->seg;
    *off = coff + RG_MIN(start, clen);
    *len = start >= clen ? 0 : RG_MIN(ring->seg, clen - start);
}

/* Where the reduce-scatter result of step s for chunk c, segment j goes. */
static char *ring_rs_dst(rg_comm_req_t *req, int s, size_t off, int j)
{
    const struct comm_ring *ring = req->ring;
    if (ring->cfg.rs_final == NULL) {
        return req->out + off * req->esize;
    }
    if (s == ring->rs_steps - 1) {
        return ring->cfg.rs_final + (size_t)j * ring->seg * req->esize;
    }
    return req->acc + (size_t)j * ring->seg * req->esize;
}

static rg_status_t ring_post(rg_comm_req_t *req, int j)
{
    struct comm_ring *ring = req->ring;
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const int s = ring->step[j];
    const int shift = ring->cfg.shift;
    const uint32_t sub = (uint32_t)s * (uint32_t)ring->nseg + (uint32_t)j;
    comm_xfer_t *xs = &req->xfers[2 * j];
    size_t soff;
    size_t slen;
    size_t roff;
    size_t rlen;
    const char *src;
    char *rbuf;
    if (s < ring->rs_steps) {
        ring_seg(ring, ring_mod(r - s + shift, n), j, &soff, &slen);
        ring_seg(ring, ring_mod(r - s - 1 + shift, n), j, &roff, &rlen);
        src = s == 0 ? req->in + soff * req->esize : ring_rs_dst(req, s - 1, soff, j);
        rbuf = req->tmp + (size_t)j * ring->seg * req->esize;
    } else {
        int t = s - ring->rs_steps;
        ring_seg(ring, ring_mod(r + 1 + shift - t, n), j, &soff, &slen);
        ring_seg(ring, ring_mod(r + shift - t, n), j, &roff, &rlen);
        src = req->out + soff * req->esize;
        rbuf = req->out + roff * req->esize;
    }
    xs[0].active = false;
    xs[1].active = false;
    /* Marked before posting: a transfer that fails fails the group, which finishes this
     * request and frees the ring before the call returns. */
    ring->posted[j] = true;
    rg_status_t st = RG_OK;
    if (rlen > 0) {
        int left = ring_mod(r - 1, n);
        st = comm_xfer_recv(req, &xs[0], left, comm_tag(req->comm, left, req->seq, sub), rbuf,
                            rlen * req->esize);
    }
    if (st == RG_OK && slen > 0) {
        st = comm_xfer_send(req, &xs[1], ring_mod(r + 1, n), comm_tag(req->comm, r, req->seq, sub),
                            src, slen * req->esize);
    }
    return st;
}

/* Both transfers of segment j's step are done: reduce what arrived. */
static rg_status_t ring_step_done(rg_comm_req_t *req, int j)
{
    struct comm_ring *ring = req->ring;
    const int s = ring->step[j];
    if (s >= ring->rs_steps) {
        return RG_OK;
    }
    const int n = req->comm->size;
    const int r = req->comm->rank;
    size_t off;
    size_t len;
    ring_seg(ring, ring_mod(r - s - 1 + ring->cfg.shift, n), j, &off, &len);
    if (len == 0) {
        return RG_OK;
    }
    char *dst = ring_rs_dst(req, s, off, j);
    rg_status_t st = comm_local_reduce(req, dst, req->in + off * req->esize,
                                       req->tmp + (size_t)j * ring->seg * req->esize, len);
    if (st == RG_OK && s == ring->rs_steps - 1) {
        st = comm_local_scale(req, dst, len);
    }
    return st;
}

static rg_status_t ring_advance(rg_comm_req_t *req)
{
    struct comm_ring *ring = req->ring;
    const int end = RG_MIN(ring->nseg, ring->lowest + ring->window);
    for (int j = ring->lowest; j < end; j++) {
        /* Bounded: a segment moves at most through all its steps in one pass. */
        for (int guard = 0; guard <= ring->steps && ring->step[j] < ring->steps; guard++) {
            if (!ring->posted[j]) {
                rg_status_t st = ring_post(req, j);
                if (st != RG_OK) {
                    return st;
                }
            }
            rg_status_t st = comm_xfers_test(req, 2 * j, 2);
            if (st == RG_INPROGRESS) {
                break;
            }
            if (st == RG_OK) {
                st = ring_step_done(req, j);
            }
            if (st != RG_OK) {
                return st;
            }
            ring->posted[j] = false;
            if (++ring->step[j] == ring->steps) {
                ring->n_finished++;
            }
        }
    }
    while (ring->lowest < ring->nseg && ring->step[ring->lowest] == ring->steps) {
        ring->lowest++;
    }
    return ring->n_finished == ring->nseg ? RG_OK : RG_INPROGRESS;
}

rg_status_t comm_ring_init(rg_comm_req_t *req, const comm_ring_cfg_t *cfg)
{
    const int n = req->comm->size;
    const size_t max_chunk = cfg->base + (cfg->rem > 0 ? 1 : 0);
    size_t seg = RG_MAX((size_t)1, req->comm->tuning.seg_bytes / req->esize);
    /* The tag's sub field holds step * nseg + seg: keep it within 32 bits. */
    while ((max_chunk + seg - 1) / seg * (uint64_t)(2 * n) >= UINT32_MAX) {
        seg *= 2;
    }
    int nseg = (int)RG_MAX((size_t)1, (max_chunk + seg - 1) / seg);
    /* Segments of equal size, none above seg_bytes: a 512 KiB chunk at 255 KiB is three of
     * 171 KiB, not two full ones and a 2 KiB straggler that costs a round of its own. */
    seg = RG_MAX((size_t)1, (max_chunk + (size_t)nseg - 1) / (size_t)nseg);

    struct comm_ring *ring = calloc(1, sizeof(*ring));
    comm_xfer_t *xfers = calloc((size_t)nseg * 2, sizeof(*xfers));
    int *step = calloc((size_t)nseg, sizeof(*step));
    bool *posted = calloc((size_t)nseg, sizeof(*posted));
    char *tmp = NULL;
    char *acc = NULL;
    if (ring == NULL || xfers == NULL || step == NULL || posted == NULL) {
        goto err_nomem;
    }
    if (cfg->do_rs) {
        tmp = comm_buf_alloc(req, max_chunk * req->esize);
        if (tmp == NULL) {
            goto err_nomem;
        }
        if (cfg->rs_final != NULL && n > 2) {
            acc = comm_buf_alloc(req, max_chunk * req->esize);
            if (acc == NULL) {
                goto err_free_tmp;
            }
        }
    }
    ring->cfg = *cfg;
    ring->rs_steps = cfg->do_rs ? n - 1 : 0;
    ring->steps = ring->rs_steps + (cfg->do_ag ? n - 1 : 0);
    ring->nseg = nseg;
    ring->seg = seg;
    ring->step = step;
    ring->posted = posted;
    ring->window = (int)RG_MAX((size_t)1, req->comm->tuning.ring_window);

    comm_xfers_free(req); /* the previous phase's transfers are all done */
    comm_buf_free(req, req->tmp);
    req->xfers = xfers;
    req->n_xfers = 2 * nseg;
    req->tmp = tmp;
    req->acc = acc;
    req->ring = ring;
    req->advance = ring_advance;
    return RG_OK;

err_free_tmp:
    comm_buf_free(req, tmp);
err_nomem:
    free(posted);
    free(step);
    free(xfers);
    free(ring);
    return rg_error(RG_ENOMEM, "%s: out of memory for the ring of %zu-element chunks",
                    req->name, max_chunk);
}

void comm_ring_free(rg_comm_req_t *req)
{
    if (req->ring != NULL) {
        free(req->ring->step);
        free(req->ring->posted);
        free(req->ring);
        req->ring = NULL;
    }
}
