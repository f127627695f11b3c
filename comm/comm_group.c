/* The group object: allocation, tuning knobs, accessors and destroy. */
#include "comm_internal.h"

#include <stdlib.h>

#define COMM_DEFAULT_TIMEOUT_MS   30000
#define COMM_DEFAULT_RING_MIN     (64 * 1024)
/* Measured on loopback (docs/benchmarks.md): shared memory likes many small segments, tcp
 * fewer larger ones (see the tcp settings in comm_ucx.c), with few in flight: 4 ranks on 2
 * cores reached 1.7 GB/s busbw at 16 MiB with 4, 1.4 with 8. */
#define COMM_DEFAULT_SEGMENT      (64 * 1024)
#define COMM_DEFAULT_WINDOW       16
/* Over tcp a segment is one eager message when it is below UCX_TCP_TX_SEG_SIZE (256K, set in
 * comm_ucx.c) less UCX's headers, and goes by rendezvous (a request, a reply, then the data)
 * at 256 KiB and above. Eager was faster with 2 ranks on 2 cores (1 MiB: 5.5 against 4.6 GB/s
 * busbw; 64 MiB: 2.4 against 1.7) but slower when a host runs more ranks than it has cores
 * (4 ranks, 16 MiB: 1.3 against 1.5): a descheduled receiver has not posted its receive when
 * the data comes, and UCX then copies it twice. */
#define COMM_DEFAULT_SEGMENT_TCP  (255 * 1024)
#define COMM_SEGMENT_TCP_RNDV     (256 * 1024)
#define COMM_DEFAULT_WINDOW_TCP   4
/* Over tcp, 4 ranks: recursive halving/doubling beat the ring below 4 MiB (256 KiB: 2.2
 * against 1.7 GB/s busbw, 1 MiB 2.5 against 2.3) and lost at 16 MiB; over shared memory the
 * pipelined ring was as fast or faster at every size. */
#define COMM_DEFAULT_RHD_MAX_TCP  (4 * 1024 * 1024)

/* Tuning knobs (read once per group):
 *   REGROUP_COMM_RING_MIN_BYTES  messages at least this large use the ring (default 64 KiB)
 *   REGROUP_COMM_SEGMENT_BYTES   largest ring segment (default 64 KiB; when UCX_TLS has no
 *                                shared memory 255 KiB, or 256 KiB when a host of the group
 *                                runs more ranks than it has cores); chunks are cut into
 *                                equal segments no larger than this
 *   REGROUP_COMM_RING_WINDOW     ring segments in flight (default 16; 4 without shm)
 *   REGROUP_COMM_RHD_MAX_BYTES   allreduces from RING_MIN_BYTES up to below this, on a power
 *                                of two ranks (at least 4), use recursive halving/doubling
 *                                instead of the ring (default 0, off; 4 MiB without shm) */

/* A size from the environment: default when unset, an error naming it when malformed. */
static rg_status_t comm_env_size(const char *name, size_t def, size_t min, size_t *out)
{
    const char *v = getenv(name);
    int64_t x;
    if (v == NULL || *v == '\0') {
        *out = def;
        return RG_OK;
    }
    if (!rg_parse_i64(v, &x) || x < (int64_t)min || x > (int64_t)1 << 40) {
        return rg_error(RG_EINVAL, "%s=%s: expected a byte count between %zu and 2^40", name,
                        v, min);
    }
    *out = (size_t)x;
    return RG_OK;
}

rg_status_t comm_group_new(int rank, int size, int64_t timeout_ms, rg_comm_spare_t *spare,
                           rg_deadline_t deadline, rg_comm_t **comm_p)
{
    if (size < 1 || size > RG_COMM_MAX_SIZE || rank < 0 || rank >= size) {
        rg_comm_spare_destroy(spare);
        return rg_error(RG_EINVAL, "rank %d of size %d: out of range (size 1..%d)", rank, size,
                        RG_COMM_MAX_SIZE);
    }
    if (timeout_ms < 0) {
        rg_comm_spare_destroy(spare);
        return rg_error(RG_EINVAL, "negative operation timeout %lld ms", (long long)timeout_ms);
    }
    rg_comm_t *comm = calloc(1, sizeof(*comm));
    if (comm == NULL) {
        rg_comm_spare_destroy(spare);
        return rg_error(RG_ENOMEM, "out of memory for a group of %d", size);
    }
    comm->rank = rank;
    comm->size = size;
    comm->timeout_ms = timeout_ms ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
    comm->healthy = true;
    comm->failed_rank = -1;
    rg_status_t st = comm_env_size("REGROUP_COMM_RING_MIN_BYTES", COMM_DEFAULT_RING_MIN, 0,
                                   &comm->tuning.ring_min_bytes);
    if (st == RG_OK) {
        st = comm_env_size("REGROUP_COMM_RHD_MAX_BYTES",
                           comm_tls_has_mm() ? 0 : COMM_DEFAULT_RHD_MAX_TCP, 0,
                           &comm->tuning.rhd_max_bytes);
    }
    if (st == RG_OK) {
        const char *seg = getenv("REGROUP_COMM_SEGMENT_BYTES");
        comm->seg_default = seg == NULL || *seg == '\0';
        st = comm_env_size("REGROUP_COMM_SEGMENT_BYTES",
                           comm_tls_has_mm() ? COMM_DEFAULT_SEGMENT : COMM_DEFAULT_SEGMENT_TCP, 64,
                           &comm->tuning.seg_bytes);
    }
    if (st == RG_OK) {
        st = comm_env_size("REGROUP_COMM_RING_WINDOW",
                           comm_tls_has_mm() ? COMM_DEFAULT_WINDOW : COMM_DEFAULT_WINDOW_TCP, 1,
                           &comm->tuning.ring_window);
    }
    if (st != RG_OK) {
        free(comm);
        rg_comm_spare_destroy(spare);
        return st;
    }
    comm->eps = calloc((size_t)size, sizeof(*comm->eps));
    comm->peers = calloc((size_t)size, sizeof(*comm->peers));
    comm->peer_dead = calloc((size_t)size, sizeof(*comm->peer_dead));
    comm->peer_left = calloc((size_t)size, sizeof(*comm->peer_left));
    comm->peer_status = calloc((size_t)size, sizeof(*comm->peer_status));
    comm->peer_heard = calloc((size_t)size, sizeof(*comm->peer_heard));
    comm->scratch_reqs = calloc((size_t)size, sizeof(*comm->scratch_reqs));
    if (comm->eps == NULL || comm->peers == NULL || comm->peer_dead == NULL ||
        comm->peer_left == NULL || comm->peer_status == NULL || comm->peer_heard == NULL ||
        comm->scratch_reqs == NULL) {
        rg_comm_destroy(comm);
        rg_comm_spare_destroy(spare);
        return rg_error(RG_ENOMEM, "out of memory for a group of %d", size);
    }
    for (int p = 0; p < size; p++) {
        comm->peers[p].comm = comm;
        comm->peers[p].rank = p;
    }
    st = comm_ucx_open(comm, spare, deadline);
    if (st != RG_OK) {
        rg_comm_destroy(comm);
        return st;
    }
    *comm_p = comm;
    return RG_OK;
}

void comm_tune(rg_comm_t *comm, bool any_oversubscribed)
{
    if (comm->seg_default && !comm_tls_has_mm() && any_oversubscribed) {
        comm->tuning.seg_bytes = COMM_SEGMENT_TCP_RNDV;
    }
}

void rg_comm_destroy(rg_comm_t *comm)
{
    if (comm == NULL) {
        return;
    }
    /* Requests still posted are abandoned: their buffers go to the graveyard. */
    for (int guard = 0; comm->head != NULL && guard < 1 << 20; guard++) {
        rg_comm_req_t *req = comm->head;
        for (int i = 0; i < req->n_xfers; i++) {
            comm_xfer_abandon(comm, &req->xfers[i]);
        }
        comm_req_bury(req);
        comm_req_finish(req, RG_ECANCELED);
    }
    comm_ucx_close(comm);
    comm_shm_free(comm);
    comm_scratch_free_all(comm);
    free(comm->req_cache);
    free(comm->eps);
    free(comm->peers);
    free(comm->peer_dead);
    free(comm->peer_left);
    free(comm->peer_status);
    free(comm->peer_heard);
    free(comm->scratch_reqs);
    free(comm);
}

int rg_comm_rank(const rg_comm_t *comm)
{
    return comm != NULL ? comm->rank : -1;
}

int rg_comm_size(const rg_comm_t *comm)
{
    return comm != NULL ? comm->size : 0;
}

bool rg_comm_is_healthy(const rg_comm_t *comm)
{
    return comm != NULL && comm->healthy;
}

int rg_comm_failed_rank(const rg_comm_t *comm)
{
    return comm != NULL ? comm->failed_rank : -1;
}

rg_status_t rg_comm_fail_status(const rg_comm_t *comm)
{
    return comm == NULL || comm->healthy ? RG_OK : comm->fail_status;
}
