/*
 * regroup communication group: point to point and collectives over UCX.
 *
 * A group (rg_comm_t) holds `size` ranks. It is built from a round: every rank publishes its
 * UCX worker address under a key prefix in etcd, reads the others' and connects an endpoint to
 * each peer with peer-failure handling. Operations:
 *   send/recv (tagged), barrier, broadcast, allreduce, allgather, reduce_scatter,
 * with the reductions sum, avg, min, max, prod over every rg_dtype_t (avg on floating types
 * only). Each has a blocking form and a non-blocking `_post` form returning a request that
 * rg_comm_req_test() advances and rg_comm_req_wait() completes. Collectives must be called
 * (posted) in the same order on every rank.
 *
 * Failure: every operation has a deadline (opts->deadline, see <regroup/deadline.h>; default:
 * the group's timeout_ms from when it is called or posted; a deadline already passed lets it
 * complete only if it needs nothing more from its peers). A peer that dies makes the operation
 * fail with RG_EPEER on the surviving ranks; a peer that stops answering makes it fail with
 * RG_ETIMEDOUT when the deadline passes. rg_last_error() names the peer rank. After such a
 * failure (a collective that fails for any reason, a send or recv that fails because of its
 * peer or its deadline, a request freed before it completed) the group is unusable:
 * rg_comm_is_healthy() turns false, every later call fails with RG_EPEER, and the group must
 * be destroyed (this destroys its UCX worker too) and rebuilt in a new round. Errors a call
 * returns at once (RG_EINVAL, RG_ENOTSUP) and a recv whose message has another size than
 * asked (RG_EPROTO) leave the group as it was. Buffers of a failed operation may
 * still be written by UCX (a message already being received cannot be stopped) until
 * rg_comm_destroy returns: free or reuse them only after that.
 *
 * Threads: a group is used by one thread at a time (the caller serialises).
 * Transport: UCX chooses (UCX_TLS overrides). Unless the environment already sets them, the
 * group enables shared-memory peer-failure detection (UCX_MM_ERROR_HANDLING=y), UCP keepalive
 * every 100 ms and UCX_KEEPALIVE_NUM_EPS >= peers, so ranks on one host use shared memory and a
 * dead peer is found within about 100 ms; with shared memory allowed it also sends eagerly
 * only (UCX_RNDV_THRESH=inf), which avoids a UCX 1.13 abort when a peer dies mid-rendezvous.
 * Unless set, UCX_TCP_TX_SEG_SIZE=256K and UCX_TCP_RX_SEG_SIZE=512K (tcp bandwidth), and
 * UCX_TCP_CONN_NB=y: UCX 1.13 otherwise connects blocking, and an endpoint to a peer whose
 * node cannot answer (its links cut) blocks in connect() past the wire-up's deadline.
 * UCX_TLS=tcp works too (a dead peer is seen within 30 ms). When every rank is on one host and
 * UCX_TLS allows shared memory, collectives of at most 4 KiB per rank go through a small
 * shared-memory segment of the group's own (mapped at create, its name unlinked at once;
 * REGROUP_COMM_SHM=0 turns it off, =1 forces it on with any UCX_TLS); the deadlines and the
 * detection of dead peers are the same on that path. When the group has more ranks on this
 * host than the process may use cores, a waiting rank yields its core at once. Algorithm
 * tuning: see REGROUP_COMM_RING_MIN_BYTES, REGROUP_COMM_SEGMENT_BYTES, REGROUP_COMM_RING_WINDOW
 * and REGROUP_COMM_RHD_MAX_BYTES in docs/benchmarks.md; set them alike on every rank (the
 * launcher passes its environment to all), since they decide how messages are cut:
 * rg_comm_create fails with RG_EINVAL, naming a rank and its values, when they differ.
 *
 * Memory: a buffer is host memory unless opts->mem_type says RG_MEM_CUDA. Device buffers are
 * given to UCX as such; reductions on them need a build with CUDA (REGROUP_CUDA) and a CUDA
 * device, and a group of more than one rank needs a UCX that can move device memory (Debian's
 * libucx has no CUDA module); otherwise such calls fail with RG_ENOTSUP, saying which.
 */
#ifndef REGROUP_COMM_H
#define REGROUP_COMM_H

#include <regroup/deadline.h>
#include <regroup/dtype.h>
#include <regroup/etcd.h>
#include <regroup/status.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RG_COMM_NODISCARD __attribute__((warn_unused_result))

/* Largest group size (ranks are encoded in UCX tags). */
#define RG_COMM_MAX_SIZE 4096
/* Pass as sendbuf to reduce or gather in place (see each call). */
#define RG_COMM_IN_PLACE ((const void *)1)

typedef struct rg_comm rg_comm_t;
typedef struct rg_comm_req rg_comm_req_t;
typedef struct rg_comm_spare rg_comm_spare_t;

typedef enum {
    RG_OP_SUM,
    RG_OP_AVG,  /* sum / size; floating types only */
    RG_OP_MIN,
    RG_OP_MAX,
    RG_OP_PROD,
} rg_redop_t;

typedef enum {
    RG_MEM_HOST,
    RG_MEM_CUDA,
} rg_mem_type_t;

typedef struct {
    int         rank;            /* 0 <= rank < size */
    int         size;            /* 1..RG_COMM_MAX_SIZE */
    rg_etcd_t  *etcd;            /* borrowed client; or NULL and etcd_params or endpoints */
    const char *etcd_endpoints;  /* when etcd and etcd_params are NULL: the group makes its
                                    own plain client for these */
    const rg_etcd_params_t *etcd_params; /* when etcd is NULL: the group's own client, with
                                            TLS files and user (rg_comm_env_read sets it) */
    const char *key_prefix;      /* e.g. "/regroup/<job>/workers/rounds/<r>/comm/"; required */
    int64_t     timeout_ms;      /* each operation's default timeout; 0 = 30000 */
    int64_t     create_timeout_ms; /* wire-up deadline; 0 = 30000 */
    /* Optional: asked about once a millisecond while a request waits whether the group is
     * to be given up, for a caller that learns of a lost member sooner than UCX (whose
     * keepalive finds a dead peer within about one interval). Returning true with a reason
     * in why fails the group with RG_EPEER, as a dead peer does, and tells the live peers.
     * Also asked between the wire-up's reads of the addresses: true there fails
     * rg_comm_create with RG_EPEER at once (a member that will never publish its address),
     * instead of at create_timeout_ms. Called from the progress pass: it must not call back
     * into the group. */
    bool      (*abandon)(void *arg, char *why, size_t cap);
    void       *abandon_arg;
    /* Optional: a UCX context and worker made beforehand (rg_comm_spare_start). The group
     * takes it over, whether its creation succeeds or fails: the caller must not use it
     * again. One not ready by the wire-up's deadline, failed, or made for too few ranks is
     * let go, and the group makes its own (as with NULL). */
    rg_comm_spare_t *spare;
    /* Optional, `size` bytes: which peers this rank could not reach, for a caller that must
     * tell a cut network from a slow peer. rg_comm_create sets every byte to 0, then, when
     * it fails while connecting on its own (UCX could not make an endpoint to a peer, or the
     * handshake's deadline passed), to 1 for each peer that UCX said it cannot reach or
     * whose hello had not come. A creation given up for another reason (a peer withdrew,
     * the abandon hook, an address missing) leaves them 0: that says nothing of the links. */
    unsigned char *unreached;
} rg_comm_params_t;

/* Caller storage for the parameters read from a launcher's environment. */
typedef struct {
    rg_comm_params_t params;     /* ready for rg_comm_create (points into this struct) */
    rg_etcd_params_t etcd;       /* for any other etcd client of the worker (same storage) */
    char endpoints[1024];
    char job_id[128];
    int64_t round;
    char key_prefix[320];
    char ca_file[512];
    char cert_file[512];
    char key_file[512];
    char user[128];
    char password[128];
} rg_comm_env_t;

/*
 * Reads RANK, WORLD_SIZE, REGROUP_ETCD_ENDPOINTS, REGROUP_JOB_ID and REGROUP_ROUND, and the
 * optional REGROUP_ETCD_CACERT, REGROUP_ETCD_CERT, REGROUP_ETCD_KEY, REGROUP_ETCD_USER and
 * REGROUP_ETCD_PASSWORD (the launcher passes its --rdzv-conf cacert, cert, key, user and
 * password on), into *env; sets env->etcd for an etcd client and env->params for the round's
 * store: "/regroup/<job>/workers/rounds/<round>/comm/". Non-blocking. RG_EINVAL naming the
 * variable when one is missing, malformed or too long.
 */
rg_status_t rg_comm_env_read(rg_comm_env_t *env) RG_COMM_NODISCARD;

/*
 * Collective: every rank 0..size-1 must call it, with the same size and key_prefix (and
 * REGROUP_COMM_* tuning). Creates the group: makes a UCX worker, publishes its address at
 * <key_prefix><rank>, waits for all `size` addresses (progressing UCX meanwhile), connects
 * to every peer and maps the peers' shared memory when all share this host (see above).
 * Blocks up to create_timeout_ms. Errors: RG_EINVAL (params, or a rank whose REGROUP_COMM_*
 * tuning differs from this one's), RG_ETIMEDOUT (not every rank published in time), RG_EPROTO
 * (a published value this build cannot read), etcd errors, RG_EUNREACH (UCX could not
 * connect). Free with rg_comm_destroy.
 */
rg_status_t rg_comm_create(const rg_comm_params_t *params, rg_comm_t **comm_p)
    RG_COMM_NODISCARD;

/*
 * Not collective. Starts making a UCX context and worker for a later rg_comm_create of at
 * most max(size_hint, 128) ranks (rg_comm_params_t.spare), in a thread of its own when
 * background is true (returning at once), else before returning. Making a worker costs 10 to
 * 70 ms on a loaded 2-core host, most of a regroup's wire-up: made while the group before it
 * still trains, or while the agents form the round, it is off the regroup's path. The thread
 * blocks every signal (and so does the UCX thread it may start). Errors: RG_EINVAL, RG_ENOMEM,
 * RG_ESYS (no thread); a failure to make the worker itself is not one: rg_comm_create then
 * makes its own (and rg_comm_spare_wait says false). Release one that is not handed to rg_comm_create with
 * rg_comm_spare_destroy.
 */
rg_status_t rg_comm_spare_start(int size_hint, bool background, rg_comm_spare_t **spare_p)
    RG_COMM_NODISCARD;
/* Waits until the spare's worker is made, or its making failed, or until passes; whether it
 * is made (false for NULL). rg_deadline_in_ms(0): a look, never blocking. */
bool rg_comm_spare_wait(rg_comm_spare_t *spare, rg_deadline_t until);
/* Releases a spare. Waits up to 2 s for a thread that still runs (a process that exits while
 * it is inside UCX would tear UCX down under it), and past that leaves the spare to it, which
 * releases it when it ends. Accepts NULL. */
void rg_comm_spare_destroy(rg_comm_spare_t *spare);

/* Not collective. Tells the peers (if the group is healthy) that this rank leaves, closes
 * every endpoint (without waiting for unhealthy peers), destroys the UCX worker and frees
 * the group; blocks a fraction of a second at most. Requests still posted are abandoned
 * (they fail with RG_ECANCELED); free every request first. Accepts NULL. */
void rg_comm_destroy(rg_comm_t *comm);

/* Accessors; they never block. */
int  rg_comm_rank(const rg_comm_t *comm);
int  rg_comm_size(const rg_comm_t *comm);
/* False once the group has failed (see "Failure" above); it must then be destroyed. */
bool rg_comm_is_healthy(const rg_comm_t *comm);
/* The rank that failed first, or -1 (unknown or none). */
int  rg_comm_failed_rank(const rg_comm_t *comm);
/* How the group failed: RG_OK while it is healthy (or for NULL); RG_ETIMEDOUT when an
 * operation's deadline passed with no peer seen to die, leave or abort (a peer stalled, or
 * the network between the ranks is cut); RG_EPEER when a peer died, left or aborted. */
rg_status_t rg_comm_fail_status(const rg_comm_t *comm);

/* The nanoseconds callers have spent blocked in this group's operations so far
 * (rg_comm_req_wait, and the blocking calls, which wait the same way): waiting for the
 * peers and moving the data. Step time less this is the time a rank computes, which is how
 * the worker API finds a rank slower than the others. 0 for NULL. */
uint64_t rg_comm_wait_ns(const rg_comm_t *comm);

/* Per-call options; NULL (or zeroed) means the defaults (the group's timeout, host memory). */
typedef struct {
    rg_deadline_t deadline;      /* RG_DEADLINE_DEFAULT: timeout_ms from the call or post */
    rg_mem_type_t mem_type;      /* of every buffer of the call */
} rg_comm_opts_t;

/* ---- non-blocking requests ------------------------------------------------------------- */

/* Advances every posted operation of the group once. RG_OK when req is done, RG_INPROGRESS
 * while it is not, or its error (the group is then unhealthy). Never blocks. */
rg_status_t rg_comm_req_test(rg_comm_req_t *req) RG_COMM_NODISCARD;
/* Progresses until req completes or its deadline passes. RG_OK or its error. */
rg_status_t rg_comm_req_wait(rg_comm_req_t *req) RG_COMM_NODISCARD;
/* Frees a request. Freeing one that is still in progress abandons it and fails the group.
 * Accepts NULL. */
void rg_comm_req_free(rg_comm_req_t *req);

/*
 * Every operation below exists as a blocking call (returns when done, its deadline passed or
 * a peer failed) and as `_post` (returns at once with *req_p, to be tested or waited on; the
 * buffers must stay valid and untouched until the request completes). Errors found at once
 * (RG_EINVAL, RG_ENOTSUP, RG_EPEER on an unhealthy group) are returned by the call itself.
 */

/* Point to point (not collective): sends count elements to rank `peer`, matched by `tag`
 * with the peer's recv. */
rg_status_t rg_comm_send(rg_comm_t *comm, const void *buf, size_t count, rg_dtype_t dtype,
                         int peer, uint32_t tag, const rg_comm_opts_t *opts) RG_COMM_NODISCARD;
rg_status_t rg_comm_send_post(rg_comm_t *comm, const void *buf, size_t count, rg_dtype_t dtype,
                              int peer, uint32_t tag, const rg_comm_opts_t *opts,
                              rg_comm_req_t **req_p) RG_COMM_NODISCARD;
/* Point to point (not collective): receives exactly count elements from rank `peer` with
 * `tag` (RG_EPROTO if the sizes differ). */
rg_status_t rg_comm_recv(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype, int peer,
                         uint32_t tag, const rg_comm_opts_t *opts) RG_COMM_NODISCARD;
rg_status_t rg_comm_recv_post(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype,
                              int peer, uint32_t tag, const rg_comm_opts_t *opts,
                              rg_comm_req_t **req_p) RG_COMM_NODISCARD;

/*
 * The collectives below: every rank of the group must call each one (or post it), in the same
 * order on every rank, with the same count, dtype, op and root (as each takes).
 */

/* Collective: every rank of the group must call it. Returns once every rank has entered. */
rg_status_t rg_comm_barrier(rg_comm_t *comm, const rg_comm_opts_t *opts) RG_COMM_NODISCARD;
rg_status_t rg_comm_barrier_post(rg_comm_t *comm, const rg_comm_opts_t *opts,
                                 rg_comm_req_t **req_p) RG_COMM_NODISCARD;

/* Collective: every rank of the group must call it. Copies root's buf (count elements) into
 * every rank's buf. */
rg_status_t rg_comm_broadcast(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype,
                              int root, const rg_comm_opts_t *opts) RG_COMM_NODISCARD;
rg_status_t rg_comm_broadcast_post(rg_comm_t *comm, void *buf, size_t count, rg_dtype_t dtype,
                                   int root, const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
    RG_COMM_NODISCARD;

/* Collective: every rank of the group must call it. recvbuf = op over ranks of sendbuf
 * (count elements). sendbuf == RG_COMM_IN_PLACE or sendbuf == recvbuf: recvbuf is the
 * input. */
rg_status_t rg_comm_allreduce(rg_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              rg_dtype_t dtype, rg_redop_t op, const rg_comm_opts_t *opts)
    RG_COMM_NODISCARD;
rg_status_t rg_comm_allreduce_post(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, rg_dtype_t dtype, rg_redop_t op,
                                   const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
    RG_COMM_NODISCARD;

/* Collective: every rank of the group must call it.
 * recvbuf (size * count elements) = every rank's sendbuf (count elements), in rank order.
 * In place: sendbuf == RG_COMM_IN_PLACE and this rank's part is already at
 * recvbuf + rank * count elements. */
rg_status_t rg_comm_allgather(rg_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                              rg_dtype_t dtype, const rg_comm_opts_t *opts) RG_COMM_NODISCARD;
rg_status_t rg_comm_allgather_post(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, rg_dtype_t dtype, const rg_comm_opts_t *opts,
                                   rg_comm_req_t **req_p) RG_COMM_NODISCARD;

/* Collective: every rank of the group must call it.
 * recvbuf (count elements) = op over ranks of block `rank` of sendbuf (size * count elements).
 * In place: sendbuf == RG_COMM_IN_PLACE, recvbuf holds the size * count input and the result
 * is left at recvbuf + rank * count elements (the other blocks are overwritten). */
rg_status_t rg_comm_reduce_scatter(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, rg_dtype_t dtype, rg_redop_t op,
                                   const rg_comm_opts_t *opts) RG_COMM_NODISCARD;
rg_status_t rg_comm_reduce_scatter_post(rg_comm_t *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, rg_dtype_t dtype, rg_redop_t op,
                                        const rg_comm_opts_t *opts, rg_comm_req_t **req_p)
    RG_COMM_NODISCARD;

/* ---- element conversions (exposed for tests and tools) --------------------------------- */

/* IEEE binary16 and bfloat16 <-> float; float -> 16 bits rounds to nearest, ties to even,
 * keeps NaN a NaN and overflows to infinity. */
float    rg_f16_to_f32(uint16_t h);
uint16_t rg_f32_to_f16(float f);
float    rg_bf16_to_f32(uint16_t h);
uint16_t rg_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif
#endif
