/*
 * Small collectives through shared memory, when every rank of the group is on this host.
 *
 * Every rank owns a segment with two slots. For its k-th small collective (k counts from 1 and
 * is the same on every rank, since collectives are called in the same order and the choice of
 * this path, in comm_choose.c, depends only on the call's arguments and on what every rank of
 * the group agreed at set-up), a rank copies its input into slot k % 2 and then publishes k
 * in that slot's sequence word (a release store). It waits until every peer's
 * slot k % 2 shows k, and computes its result from the slots alone, in rank order, so every rank
 * ends with the same bits.
 *
 * Why two slots suffice: a rank starts op k + 2 (overwriting slot k % 2) only after finishing
 * op k + 1, for which it saw every peer publish k + 1; a peer publishes k + 1 only after
 * finishing op k, that is after reading slot k % 2. So one rank's ops run one at a time, in
 * post order: a later op waits until the earlier one is done.
 *
 * Failures are found as before. While waiting, the request's transfers are marked as receives
 * from the peers not yet seen, so a deadline names them; the progress pass still runs UCX,
 * whose endpoint error callback (keepalive, for a dead shared-memory peer) fails the group;
 * and a peer's abort message still arrives over UCX.
 *
 * Set-up, in rg_comm_create (comm_local_setup): each rank creates its segment with shm_open;
 * the ranks exchange {host, segment name, nonce} with an allgather over UCX; each maps every
 * peer's segment and checks its header; an allreduce agrees that every rank succeeded; then
 * each rank unlinks its own name (the mappings stay). Any failure leaves the group on UCX
 * alone. The same exchange counts the group's ranks on this host, to see whether they
 * oversubscribe its cores.
 */
#include "comm_internal.h"

#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define COMM_SHM_MAGIC 0x7267736d31ull /* "rgsm1" */

typedef struct {
    _Alignas(64) _Atomic uint64_t seq; /* the op whose input the slot holds; 0 = none yet */
    uint64_t len;                      /* bytes of input */
    _Alignas(64) unsigned char data[COMM_SHM_MAX_BYTES];
} comm_shm_slot_t;

typedef struct {
    uint64_t magic;
    uint64_t nonce;
    int32_t  rank;
    int32_t  size;
    _Alignas(64) comm_shm_slot_t slot[2];
} comm_shm_seg_t;

/* What each rank tells the others at set-up (fixed size: sent as bytes). */
typedef struct {
    uint64_t host;      /* hash of the host name and boot id */
    uint64_t nonce;     /* also in the segment's header */
    int32_t  has_seg;
    int32_t  ncpu;
    char     name[48];  /* shm_open name */
} comm_shm_card_t;

struct comm_shm {
    comm_shm_seg_t  *own;
    comm_shm_seg_t **peers;     /* [size]; peers[rank] == own */
    char             name[48];
    bool             linked;    /* name still to unlink */
    bool             on;        /* every rank mapped every segment: in use */
    uint64_t         next_seq;  /* given to the next small collective posted */
    uint64_t         done_seq;  /* the last one finished here */
};

static uint64_t fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    }
    return h;
}

/* Ranks on one host share the name and the boot id (a container may share the second). */
static uint64_t comm_host_id(void)
{
    char buf[300] = "";
    uint64_t h = 0xcbf29ce484222325ull;
    if (gethostname(buf, sizeof(buf) - 1) == 0) {
        h = fnv1a(h, buf, strlen(buf));
    }
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        h = fnv1a(h, buf, n);
    }
    return h;
}

static int comm_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        return RG_MAX(1, CPU_COUNT(&set));
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static uint64_t comm_nonce(void)
{
    uint64_t x = rg_now_ns() ^ ((uint64_t)getpid() << 32);
    FILE *f = fopen("/dev/urandom", "r");
    if (f != NULL) {
        if (fread(&x, sizeof(x), 1, f) != 1) {
            x ^= (uint64_t)(uintptr_t)&x;
        }
        fclose(f);
    }
    return x;
}

static comm_shm_seg_t *comm_shm_map(const char *name, bool create)
{
    int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd < 0) {
        rg_debug("shm_open %s: %m", name);
        return NULL;
    }
    comm_shm_seg_t *seg = NULL;
    struct stat stt;
    if (create && ftruncate(fd, sizeof(comm_shm_seg_t)) != 0) {
        rg_debug("ftruncate %s: %m", name);
    } else if (fstat(fd, &stt) != 0 || (size_t)stt.st_size != sizeof(comm_shm_seg_t)) {
        rg_debug("%s: not a segment of this version", name);
    } else {
        void *p = mmap(NULL, sizeof(comm_shm_seg_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            rg_debug("mmap %s: %m", name);
        } else {
            seg = p;
        }
    }
    close(fd);
    if (seg == NULL && create) {
        shm_unlink(name);
    }
    return seg;
}

static void comm_shm_unlink(struct comm_shm *shm)
{
    if (shm->linked) {
        shm_unlink(shm->name);
        shm->linked = false;
    }
}

void comm_shm_free(rg_comm_t *comm)
{
    struct comm_shm *shm = comm->shm;
    if (shm == NULL) {
        return;
    }
    comm_shm_unlink(shm);
    for (int p = 0; shm->peers != NULL && p < comm->size; p++) {
        if (shm->peers[p] != NULL && shm->peers[p] != shm->own) {
            munmap(shm->peers[p], sizeof(comm_shm_seg_t));
        }
    }
    if (shm->own != NULL) {
        munmap(shm->own, sizeof(comm_shm_seg_t));
    }
    free(shm->peers);
    free(shm);
    comm->shm = NULL;
}

/* Whether the environment lets the group use shared memory of its own. */
static rg_status_t comm_shm_wanted(bool *want)
{
    const char *v = getenv("REGROUP_COMM_SHM");
    if (v == NULL || *v == '\0') {
        *want = comm_tls_has_mm();
        return RG_OK;
    }
    if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) {
        *want = v[0] == '1';
        return RG_OK;
    }
    return rg_error(RG_EINVAL, "REGROUP_COMM_SHM=%s: expected 0 or 1", v);
}

static struct comm_shm *comm_shm_create(rg_comm_t *comm, comm_shm_card_t *card)
{
    struct comm_shm *shm = calloc(1, sizeof(*shm));
    if (shm == NULL) {
        return NULL;
    }
    shm->peers = calloc((size_t)comm->size, sizeof(*shm->peers));
    if (shm->peers == NULL) {
        free(shm);
        return NULL;
    }
    comm->shm = shm;
    snprintf(shm->name, sizeof(shm->name), "/regroup-%d-%d-%016llx", (int)getpid(),
             comm->rank, (unsigned long long)card->nonce);
    shm->own = comm_shm_map(shm->name, true);
    if (shm->own == NULL) {
        comm_shm_free(comm);
        return NULL;
    }
    shm->linked = true;
    memset(shm->own, 0, sizeof(*shm->own));
    shm->own->nonce = card->nonce;
    shm->own->rank = comm->rank;
    shm->own->size = comm->size;
    shm->own->magic = COMM_SHM_MAGIC;
    shm->peers[comm->rank] = shm->own;
    card->has_seg = 1;
    snprintf(card->name, sizeof(card->name), "%s", shm->name);
    return shm;
}

/* Maps every peer's segment; false if any is missing or not the one it announced. */
static bool comm_shm_attach(rg_comm_t *comm, const comm_shm_card_t *cards)
{
    struct comm_shm *shm = comm->shm;
    for (int p = 0; p < comm->size; p++) {
        if (p == comm->rank) {
            continue;
        }
        if (!cards[p].has_seg || cards[p].host != cards[comm->rank].host ||
            memchr(cards[p].name, '\0', sizeof(cards[p].name)) == NULL) {
            return false;
        }
        comm_shm_seg_t *seg = comm_shm_map(cards[p].name, false);
        if (seg == NULL) {
            return false;
        }
        shm->peers[p] = seg;
        if (seg->magic != COMM_SHM_MAGIC || seg->nonce != cards[p].nonce || seg->rank != p ||
            seg->size != comm->size) {
            rg_debug("shared memory of rank %d: unexpected header", p);
            return false;
        }
    }
    return true;
}

rg_status_t comm_local_setup(rg_comm_t *comm, rg_deadline_t deadline)
{
    const int n = comm->size;
    comm->n_local = 1;
    if (n == 1) {
        return RG_OK;
    }
    bool want = false;
    rg_status_t st = comm_shm_wanted(&want);
    if (st != RG_OK) {
        return st;
    }
    comm_shm_card_t card = {.host = comm_host_id(), .nonce = comm_nonce(), .ncpu = comm_cpus()};
    if (want && comm_shm_create(comm, &card) == NULL) {
        rg_debug("no shared memory for small collectives; using UCX alone");
    }
    comm_shm_card_t *cards = calloc((size_t)n, sizeof(*cards));
    if (cards == NULL) {
        return rg_error(RG_ENOMEM, "out of memory for a group of %d", n);
    }
    rg_comm_opts_t opts = {.deadline = deadline};
    st = rg_comm_allgather(comm, &card, cards, sizeof(card), RG_DTYPE_U8, &opts);
    if (st != RG_OK) {
        free(cards);
        return rg_error_wrap(st, "exchanging host identities");
    }
    for (int p = 0; p < n; p++) {
        comm->n_local += p != comm->rank && cards[p].host == card.host;
    }
    comm->oversubscribed = comm->n_local > card.ncpu;
    /* The same answer on every rank, from the same cards. */
    bool any_over = false;
    for (int p = 0; p < n && !any_over; p++) {
        int on_host = 0;
        for (int q = 0; q < n; q++) {
            on_host += cards[q].host == cards[p].host;
        }
        any_over = on_host > cards[p].ncpu;
    }
    comm_tune(comm, any_over);
    int32_t ok = comm->shm != NULL && comm->n_local == n && comm_shm_attach(comm, cards);
    free(cards);
    st = rg_comm_allreduce(comm, RG_COMM_IN_PLACE, &ok, 1, RG_DTYPE_I32, RG_OP_MIN, &opts);
    if (st != RG_OK) {
        return rg_error_wrap(st, "agreeing on shared memory");
    }
    if (comm->shm != NULL) {
        /* Every rank that could map our segment has done so: the name can go. */
        comm_shm_unlink(comm->shm);
        if (ok) {
            comm->shm->on = true;
        } else {
            comm_shm_free(comm);
        }
    }
    rg_debug("%d of %d ranks on this host (%d cores)%s%s", comm->n_local, n, card.ncpu,
             comm->oversubscribed ? ", oversubscribed" : "",
             comm->shm != NULL ? "; small collectives through shared memory" : "");
    return RG_OK;
}

/* ---- the collectives ------------------------------------------------------------------- */

/* Bytes this rank contributes, and where they are. */
static size_t comm_shm_input(const rg_comm_req_t *req, const char **src)
{
    const size_t bytes = req->count * req->esize;
    const int r = req->comm->rank;
    switch (req->kind) {
    case COMM_BARRIER:
        *src = NULL;
        return 0;
    case COMM_BCAST:
        *src = req->out;
        return r == req->root ? bytes : 0;
    case COMM_ALLGATHER:
        *src = req->in != NULL ? req->in : req->out + (size_t)r * bytes;
        return bytes;
    case COMM_REDSCAT:
        *src = req->in;
        return (size_t)req->comm->size * bytes;
    default:
        *src = req->in;
        return bytes;
    }
}

bool comm_shm_on(const rg_comm_t *comm)
{
    return comm->shm != NULL && comm->shm->on;
}

/* Everything has arrived: the result, from the slots alone, in rank order. */
static rg_status_t comm_shm_finish(rg_comm_req_t *req, int parity)
{
    struct comm_shm *shm = req->comm->shm;
    const int n = req->comm->size;
    const int r = req->comm->rank;
    const size_t bytes = req->count * req->esize;
    const size_t want = req->kind == COMM_REDSCAT ? (size_t)n * bytes : bytes;
    for (int p = 0; p < n; p++) {
        const comm_shm_slot_t *s = &shm->peers[p]->slot[parity];
        bool sends = req->kind != COMM_BARRIER && (req->kind != COMM_BCAST || p == req->root);
        if (sends && s->len != want) {
            return rg_error(RG_EPROTO, "%s: rank %d contributed %llu bytes, expected %zu",
                            req->name, p, (unsigned long long)s->len, want);
        }
    }
#define SLOT(p) ((const char *)shm->peers[(p)]->slot[parity].data)
    switch (req->kind) {
    case COMM_BARRIER:
        return RG_OK;
    case COMM_BCAST:
        if (r != req->root) {
            memcpy(req->out, SLOT(req->root), bytes);
        }
        return RG_OK;
    case COMM_ALLGATHER:
        for (int p = 0; p < n; p++) {
            memcpy(req->out + (size_t)p * bytes, SLOT(p), bytes);
        }
        return RG_OK;
    case COMM_REDSCAT: {
        char *dst = req->in == req->out ? req->out + (size_t)r * bytes : req->out;
        const size_t off = (size_t)r * bytes;
        comm_reduce(req->dtype, req->op, dst, SLOT(0) + off, SLOT(1) + off, req->count);
        for (int p = 2; p < n; p++) {
            comm_reduce(req->dtype, req->op, dst, dst, SLOT(p) + off, req->count);
        }
        return comm_local_scale(req, dst, req->count);
    }
    default:
        comm_reduce(req->dtype, req->op, req->out, SLOT(0), SLOT(1), req->count);
        for (int p = 2; p < n; p++) {
            comm_reduce(req->dtype, req->op, req->out, req->out, SLOT(p), req->count);
        }
        return comm_local_scale(req, req->out, req->count);
    }
#undef SLOT
}

bool comm_shm_arrived(const rg_comm_req_t *req, const comm_xfer_t *x)
{
    const comm_shm_slot_t *s = &req->comm->shm->peers[x->peer]->slot[req->shm_seq & 1];
    return atomic_load_explicit(&s->seq, memory_order_acquire) == req->shm_seq;
}

static rg_status_t comm_shm_advance(rg_comm_req_t *req)
{
    rg_comm_t *comm = req->comm;
    struct comm_shm *shm = comm->shm;
    const int parity = (int)(req->shm_seq & 1);
    if (req->phase < 0) {
        if (shm->done_seq != req->shm_seq - 1) {
            return RG_INPROGRESS; /* an earlier small collective is still running here */
        }
        comm_shm_slot_t *mine = &shm->own->slot[parity];
        const char *src = NULL;
        size_t len = comm_shm_input(req, &src);
        if (len > 0) {
            memcpy(mine->data, src, len);
        }
        mine->len = len;
        atomic_store_explicit(&mine->seq, req->shm_seq, memory_order_release);
        for (int i = 0; i < req->n_xfers; i++) {
            req->xfers[i].active = true;
        }
        req->phase = 0;
    }
    bool waiting = false;
    for (int i = 0; i < req->n_xfers; i++) {
        comm_xfer_t *x = &req->xfers[i];
        if (x->active) {
            x->active = !comm_shm_arrived(req, x);
            waiting = waiting || x->active;
        }
    }
    if (waiting) {
        return RG_INPROGRESS;
    }
    rg_status_t st = comm_shm_finish(req, parity);
    shm->done_seq = req->shm_seq;
    return st;
}

rg_status_t comm_shm_use(rg_comm_req_t *req)
{
    rg_comm_t *comm = req->comm;
    const int n = comm->size;
    if (comm_xfers_alloc(req, n - 1) == NULL) {
        return rg_error(RG_ENOMEM, "%s: out of memory", req->name);
    }
    for (int i = 0, p = 0; p < n; p++) {
        if (p != comm->rank) {
            req->xfers[i].peer = p;
            req->xfers[i].is_recv = true;
            req->xfers[i].shm = true;
            i++;
        }
    }
    req->shm_seq = ++comm->shm->next_seq;
    req->phase = -1;
    req->uses_shm = true;
    req->advance = comm_shm_advance;
    return RG_OK;
}
