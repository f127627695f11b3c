/*
 * comm/ internals: the group, its requests and the UCX transfer layer.
 *
 * A request is a small state machine. It owns a set of transfers (tagged UCX sends and
 * receives, polled with ucp_request_check_status / ucp_tag_recv_request_test: no completion
 * callbacks, so an abandoned request never calls back into freed memory). Every progress
 * pass runs ucp_worker_progress, then calls each posted request's `advance` function, which
 * tests its transfers, reduces what arrived and posts the next transfers.
 *
 * Tags (64 bits, always matched with a full mask):
 *   bit 63     user point to point     | bits 61..50 source rank | bits 31..0 user tag
 *   bit 62     control (abort, leave)  | any source, one posted wildcard receive
 *   bits 63,62 clear: collective       | bits 61..50 source rank | 49..32 sequence | 31..0 sub
 *
 * Failure (comm_fail.c): the endpoint error callback only records the peer. A progress pass
 * then fails the group (if an operation is posted, or at the next post): it tells every live
 * peer with an abort control message (so ranks not talking to the dead one fail at once too),
 * cancels the posted receives, force-closes the endpoints and fails every posted request. A
 * deadline that passes does the same with RG_ETIMEDOUT, without the abort message.
 *
 * Below, the functions shared between files, each under the file that defines it.
 */
#ifndef RG_COMM_INTERNAL_H
#define RG_COMM_INTERNAL_H

#include "comm_choose.h"
#include "rg_common.h"

#include <regroup/comm.h>

#include <stddef.h>

#include <ucp/api/ucp.h>

#define COMM_TAG_P2P      (1ull << 63)
#define COMM_TAG_CTRL     (1ull << 62)
#define COMM_TAG_SRC_SHIFT 50
#define COMM_TAG_SEQ_SHIFT 32
#define COMM_TAG_SEQ_MASK  ((1u << 18) - 1)

#define COMM_CTRL_ABORT 1u
#define COMM_CTRL_LEAVE 2u
#define COMM_CTRL_HELLO 3u

typedef struct {
    rg_comm_t *comm;
    int        rank;
} comm_peer_t;

/* One tagged UCX transfer of a request. */
typedef struct {
    void  *ucx;       /* UCX request while in flight, else NULL */
    int    peer;
    bool   is_recv;
    bool   active;    /* posted and not yet completed */
    bool   shm;       /* a peer's shared-memory slot, not UCX (comm_shm.c) */
    size_t len;       /* bytes expected (receive) */
} comm_xfer_t;

typedef rg_status_t (*comm_advance_fn)(rg_comm_req_t *req);

struct rg_comm_req {
    rg_comm_t      *comm;
    rg_comm_req_t  *prev;
    rg_comm_req_t  *next;
    bool            posted;   /* in the group's list */
    rg_status_t     status;   /* RG_INPROGRESS until done */
    uint64_t        deadline;
    const char     *name;     /* "allreduce", ... for messages */
    comm_advance_fn advance;
    uint32_t        seq;
    comm_coll_t     kind;     /* collectives */
    bool            is_p2p;
    bool            uses_shm; /* comm_shm.c's: needs no UCX progress */
    uint64_t        shm_seq;
    int             p2p_peer;

    ucs_memory_type_t mem;
    rg_dtype_t      dtype;
    rg_redop_t      op;
    size_t          esize;
    size_t          count;
    const char     *in;       /* input (== out when in place) */
    char           *out;
    int             root;
    char           *dst;      /* reduce_scatter: where the result goes (user memory) */
    char            errmsg[256];

    comm_xfer_t    *xfers;
    int             n_xfers;
    const void     *phases;   /* small algorithms (comm_algo.c) */
    int             n_phases;
    int             phase;    /* the round posted, -1 before the first */
    char           *tmp;      /* scratch owned by the request */
    char           *acc;

    struct comm_ring *ring;   /* comm_ring.c */

    /* Small operations avoid allocations (latency): transfers and scratch inline. Fields
     * from here on are not cleared when a request is reused. */
    comm_xfer_t     xfers_inline[4];
    union {
        char        bytes[256];
        max_align_t align_;
    } tmp_inline;

};

/* Host scratch of at least COMM_SCRATCH_MIN_BYTES (the ring's chunk buffers) is kept by the
 * group between collectives, COMM_SCRATCH_KEPT buffers at most (comm_coll.c): glibc maps
 * every allocation above its mmap threshold (at most 32 MiB) afresh, so a ring of 32 MiB
 * chunks paid the page faults of its scratch in every operation. */
#define COMM_SCRATCH_KEPT      4
#define COMM_SCRATCH_MIN_BYTES ((size_t)1 << 20)

typedef struct {
    void  *p;     /* NULL: slot free */
    size_t cap;
    bool   out;   /* handed to a request */
} comm_scratch_t;

struct rg_comm {
    int           rank;
    int           size;
    int64_t       timeout_ms;
    ucp_context_h ctx;
    ucp_worker_h  worker;
    bool          ucx_cuda;     /* UCX lists CUDA among its memory types */
    bool          from_spare;   /* ctx and worker came from rg_comm_params_t.spare */
    ucp_ep_h     *eps;          /* [size]; eps[rank] NULL */
    comm_peer_t  *peers;        /* error callback arguments */
    bool         *peer_dead;    /* error callback seen */
    bool         *peer_left;    /* sent a leave message (clean destroy) */
    ucs_status_t *peer_status;  /* what the error callback said */
    int           n_dead;       /* error callbacks seen */
    int           n_dead_seen;  /* of those, handled by a progress pass */
    int           n_left;
    int           n_hello;      /* hello messages seen while connecting */
    bool         *peer_heard;   /* [size]: that peer's hello came while connecting */
    unsigned char *unreached;   /* rg_comm_params_t.unreached, or NULL */
    uint32_t      attempt;      /* the wire-up's try at its prefix (comm_wireup.c) */
    int64_t       wire_ns[4];   /* the wire-up's phases: UCX, addresses, connect, local */
    int           wire_reads;   /* reads of the prefix until every address was there */
    void        **scratch_reqs; /* [size] for control sends and closes */
    uint64_t      ctrl_out[2];
    void        **grave;        /* buffers of failed requests, freed after the worker */
    size_t        n_grave;
    size_t        cap_grave;
    bool          healthy;
    bool          closing;      /* in rg_comm_destroy */
    int           failed_rank;
    uint32_t      seq;
    comm_tuning_t tuning;       /* read once (comm_group.c), alike on every rank */
    bool          seg_default;  /* seg_bytes not chosen by REGROUP_COMM_SEGMENT_BYTES */
    uint64_t      algo_ops[COMM_COLL_COUNT][COMM_ALGO_COUNT]; /* collectives started, by
                                                                 algorithm (comm_coll.c) */
    rg_comm_req_t *head;        /* posted requests, in post order */
    rg_comm_req_t *tail;
    rg_comm_req_t *req_cache;   /* one finished request kept for the next blocking call */
    comm_scratch_t scratch[COMM_SCRATCH_KEPT]; /* large host scratch kept between requests */
    unsigned      passes;       /* progress passes, to check deadlines every few */
    bool          ucx_due;      /* a waiter gave its core away: run UCX in the next pass */
    uint64_t      wait_ns;      /* the callers' time in rg_comm_req_wait (rg_comm_wait_ns) */
    unsigned      n_posted;     /* requests in the list */
    unsigned      n_posted_shm; /* of those, shared-memory ones */
    struct comm_shm *shm;       /* small collectives on one host (comm_shm.c), or NULL */
    int           n_local;      /* ranks of the group on this host, this one included */
    bool          oversubscribed; /* more of them than cores here: yield when idle */
    void         *ctrl_req;     /* the posted wildcard control receive */
    uint64_t      ctrl_buf[2];
    rg_status_t   fail_status;
    char          fail_msg[256];
    bool        (*abandon)(void *arg, char *why, size_t cap); /* rg_comm_params_t's */
    void         *abandon_arg;
    uint64_t      abandon_next_ns; /* when to ask it next */
};

/* ---- comm_group.c ---------------------------------------------------------------------- */

/* Allocates a group and opens its UCX worker (not yet connected): the spare's, if any
 * (taken over either way; comm_ucx_open). */
rg_status_t comm_group_new(int rank, int size, int64_t timeout_ms, rg_comm_spare_t *spare,
                           rg_deadline_t deadline, rg_comm_t **comm_p);

/* ---- comm_spare.c ---------------------------------------------------------------------- */

/* Takes the spare's context and worker once its thread ended, waiting for that until the
 * deadline; false (the spare released, or left to its thread) when it is NULL, failed, not
 * ready in time or made for fewer than `size` ranks. */
bool        comm_spare_take(rg_comm_spare_t *spare, int size, rg_deadline_t deadline,
                            ucp_context_h *ctx_p, ucp_worker_h *worker_p, bool *cuda_p);
/* Once the group knows whether any host runs more of its ranks than it has cores (the same
 * answer on every rank): settles the defaults that depend on it (called by comm_shm.c). */
void        comm_tune(rg_comm_t *comm, bool any_oversubscribed);

/* ---- comm_ucx.c ------------------------------------------------------------------------ */

#define COMM_CLOSE_WAIT_MS 200
#define COMM_ABORT_WAIT_MS 20
#define COMM_ABANDON_POLL_NS 1000000     /* rg_comm_params_t.abandon: once a millisecond */
#define COMM_ABOUT_ABANDONED (-2)        /* an abort message's `about`: given up (abandon) */

/* Whether UCX_TLS allows shared memory (unset: yes). */
bool        comm_tls_has_mm(void);
/* UCX_KEEPALIVE_NUM_EPS (the endpoints keepalive checks per round): the size, at least this */
#define COMM_KEEPALIVE_MIN_EPS 128

/* A context and worker for a group of at most max(size, COMM_KEEPALIVE_MIN_EPS) ranks;
 * comm_ucx_unmake releases them (either may be NULL). */
rg_status_t comm_ucx_make(int size, ucp_context_h *ctx_p, ucp_worker_h *worker_p,
                          bool *cuda_p);
void        comm_ucx_unmake(ucp_context_h ctx, ucp_worker_h worker);
/* The group's context and worker: the spare's (taken over either way) when it is ready by
 * the deadline and made for this size, else new ones. */
rg_status_t comm_ucx_open(rg_comm_t *comm, rg_comm_spare_t *spare, rg_deadline_t deadline);
rg_status_t comm_ucx_address(rg_comm_t *comm, ucp_address_t **addr_p, size_t *len_p);
void        comm_ucx_release_address(rg_comm_t *comm, ucp_address_t *addr);
/* Asked while the handshake waits for hellos (every COMM_WIRE_WATCH_NS): anything but
 * RG_OK ends the wire-up with that status (and its error set). */
typedef struct {
    rg_status_t (*check)(void *arg, rg_deadline_t deadline);
    void         *arg;
} comm_wire_watch_t;
#define COMM_WIRE_WATCH_NS 50000000ull   /* 50 ms */

/* Connects to every peer from their worker addresses (addrs[rank] unused); watch may be
 * NULL. */
rg_status_t comm_ucx_connect(rg_comm_t *comm, void *const *addrs, const size_t *lens,
                             rg_deadline_t deadline, const comm_wire_watch_t *watch);
void        comm_ucx_close(rg_comm_t *comm);

uint64_t    comm_tag(const rg_comm_t *comm, int src, uint32_t seq, uint32_t sub);
rg_status_t comm_xfer_send(rg_comm_req_t *req, comm_xfer_t *x, int peer, uint64_t tag,
                           const void *buf, size_t len);
rg_status_t comm_xfer_recv(rg_comm_req_t *req, comm_xfer_t *x, int peer, uint64_t tag,
                           void *buf, size_t len);
/* RG_OK when done (or never posted), RG_INPROGRESS, or the group's failure. */
rg_status_t comm_xfer_test(rg_comm_req_t *req, comm_xfer_t *x);
/* Cancels/abandons a transfer (receives are canceled; UCX frees both when they end). */
void        comm_xfer_abandon(rg_comm_t *comm, comm_xfer_t *x);
/* Progresses until the requests are done or ms passed, then frees them. */
void        comm_wait_reqs(rg_comm_t *comm, void **reqs, int n, int64_t ms);
void        comm_close_eps(rg_comm_t *comm, bool force, int64_t wait_ms);

/* ---- comm_ctrl.c ----------------------------------------------------------------------- */

/* Posts the wildcard control receive; polls it (handles a message, reposts). */
void        comm_ctrl_post(rg_comm_t *comm);
void        comm_ctrl_poll(rg_comm_t *comm);
void        comm_ctrl_handle(rg_comm_t *comm, size_t len);
/* Sends a control message to every live peer; reqs[size] gets the UCX requests. */
void        comm_send_ctrl(rg_comm_t *comm, uint32_t type, int about, void **reqs);

/* ---- comm_fail.c ----------------------------------------------------------------------- */

/* The endpoint error callback (UCP_ERR_HANDLING_MODE_PEER): records the peer as dead. */
void        comm_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status);
/* A transfer with peer returned or completed with st: fails the group (unless a peer's abort
 * message explains it first) and returns the group's failure. */
rg_status_t comm_peer_error(rg_comm_t *comm, int peer, const char *what, ucs_status_t st);
/* After UCX progress: fails the group for a recorded dead peer, or for a peer that left
 * while a posted receive still waits on it. */
void        comm_check_peers(rg_comm_t *comm);
/* Fails the group: abort message (if tell_peers), cancel, close, fail posted requests. */
rg_status_t comm_fail(rg_comm_t *comm, rg_status_t status, int rank, bool tell_peers,
                      const char *fmt, ...) RG_PRINTF(5, 6);
/* The group's failure as this call's error (RG_EPEER with the first message). */
rg_status_t comm_unhealthy_error(const rg_comm_t *comm, const char *what);
/* Keeps a failed request's buffer until the worker is destroyed (a matched receive may
 * still write to it). */
void        comm_grave_add(rg_comm_t *comm, void *p);

/* ---- comm_progress.c ------------------------------------------------------------------- */

/* One progress pass over the worker and every posted request; true if anything moved. */
bool        comm_progress(rg_comm_t *comm);

/* ---- comm_req.c ------------------------------------------------------------------------ */

rg_status_t comm_req_new(rg_comm_t *comm, const char *name, const rg_comm_opts_t *opts,
                         int n_xfers, rg_comm_req_t **req_p);
/* Adds req to the posted list and runs its first advance. */
rg_status_t comm_req_start(rg_comm_req_t *req);
void        comm_req_finish(rg_comm_req_t *req, rg_status_t status);
/* Hands the request's receive buffers to the group's graveyard (see comm_fail). */
void        comm_req_bury(rg_comm_req_t *req);
/* Blocking helper: post result + wait + free. */
rg_status_t comm_req_run(rg_status_t post_status, rg_comm_req_t *req);
/* Frees a request that was never started. */
void        comm_req_release(rg_comm_req_t *req);
rg_status_t comm_check_args(rg_comm_t *comm, const char *name, rg_dtype_t dtype, size_t count,
                            size_t mult, const rg_comm_opts_t *opts, void *req_p);
/* Transfer slots for req: inline when few (never freed), else allocated. */
comm_xfer_t *comm_xfers_alloc(rg_comm_req_t *req, int n);
void         comm_xfers_free(rg_comm_req_t *req);
rg_status_t comm_check_op(const char *name, rg_dtype_t dtype, rg_redop_t op);
/* Tests every transfer of req in [first, first + n); RG_OK when all done. */
rg_status_t comm_xfers_test(rg_comm_req_t *req, int first, int n);

/* ---- comm_choose.c: rg__comm_algo_choose, rg__comm_algo_name (in comm_choose.h) ------- */

/* ---- comm_coll.c (and rg__comm_algo_count, in comm_choose.h) -------------------------- */

/* Checks, chooses the algorithm (comm_choose.h), counts it, sets up and starts the request. */
rg_status_t comm_coll_post(rg_comm_t *comm, comm_coll_t kind, const void *sendbuf,
                           void *recvbuf, size_t count, rg_dtype_t dtype, rg_redop_t op,
                           int root, const rg_comm_opts_t *opts, rg_comm_req_t **req_p);
/* Scratch for req of at least bytes; host scratch of COMM_SCRATCH_MIN_BYTES and more comes
 * from (and goes back to) the group's kept buffers. */
void       *comm_buf_alloc(rg_comm_req_t *req, size_t bytes);
void        comm_buf_free(rg_comm_req_t *req, void *p);
/* p (scratch of a failed request) goes to the graveyard: the group no longer keeps it. */
void        comm_scratch_forget(rg_comm_t *comm, const void *p);
/* Frees the kept scratch not handed out (rg_comm_destroy). */
void        comm_scratch_free_all(rg_comm_t *comm);
rg_status_t comm_local_copy(rg_comm_req_t *req, void *dst, const void *src, size_t bytes);
rg_status_t comm_local_reduce(rg_comm_req_t *req, void *dst, const void *a, const void *b,
                              size_t n);
/* Divides by the group size when the op is avg. */
rg_status_t comm_local_scale(rg_comm_req_t *req, void *buf, size_t n);

/* ---- comm_algo.c ----------------------------------------------------------------------- */

/* Sets req (a collective `coll`, its buffers and counts filled in) up to run `algo`. */
rg_status_t comm_algo_start(rg_comm_req_t *req, comm_coll_t coll, comm_algo_t algo);
/* The advance of a request with nothing left to do. */
rg_status_t comm_done_advance(rg_comm_req_t *req);

/* ---- comm_shm.c ------------------------------------------------------------------------ */

/* After the group is connected: finds the ranks on this host and, when all are and shared
 * memory is allowed (REGROUP_COMM_SHM, UCX_TLS), maps every rank's segment. Collective: every
 * rank calls it. Errors are the exchange's (a peer failed, the deadline passed). */
rg_status_t comm_local_setup(rg_comm_t *comm, rg_deadline_t deadline);
void        comm_shm_free(rg_comm_t *comm);
/* Whether the group's shared memory is in use (every rank mapped every segment). */
bool        comm_shm_on(const rg_comm_t *comm);
/* Whether the peer of x (a shared-memory transfer of req) has published its input. */
bool        comm_shm_arrived(const rg_comm_req_t *req, const comm_xfer_t *x);
/* Switches req to the shared-memory path. */
rg_status_t comm_shm_use(rg_comm_req_t *req);

/* ---- comm_ring.c ----------------------------------------------------------------------- */

/* Segmented ring: reduce-scatter steps, then allgather steps. */
typedef struct {
    bool   do_rs;       /* reduce-scatter steps */
    bool   do_ag;       /* allgather steps */
    int    shift;       /* chunk rotation: rank r owns chunk r + 1 + shift after rs */
    size_t base;        /* chunk c has base (+1 if c < rem) elements */
    size_t rem;
    char  *rs_final;    /* rs only: where the owned chunk's result goes (NULL: in out) */
} comm_ring_cfg_t;

/* Switches req to the ring: allocates its state and sets req->advance. */
rg_status_t comm_ring_init(rg_comm_req_t *req, const comm_ring_cfg_t *cfg);
void        comm_ring_free(rg_comm_req_t *req);

/* ---- comm_reduce.c --------------------------------------------------------------------- */

/* dst[i] = a[i] op b[i] for n elements; dst may alias a or b. */
void comm_reduce(rg_dtype_t dtype, rg_redop_t op, void *dst, const void *a, const void *b,
                 size_t n);
/* buf[i] /= divisor (avg); floating types only. */
void comm_reduce_scale(rg_dtype_t dtype, void *buf, size_t n, int divisor);

/* ---- comm_cuda.cu, or comm_nocuda.c in a build without CUDA ---------------------------- */

/* Device-memory versions of the above; RG_ENOTSUP without CUDA. */
rg_status_t comm_reduce_dev(rg_dtype_t dtype, rg_redop_t op, void *dst, const void *a,
                            const void *b, size_t n);
rg_status_t comm_reduce_scale_dev(rg_dtype_t dtype, void *buf, size_t n, int divisor);
rg_status_t comm_copy_dev(void *dst, const void *src, size_t n);
void       *comm_dev_alloc(size_t bytes);
void        comm_dev_free(void *p);
bool        comm_cuda_available(void);

#endif
