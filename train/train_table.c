/*
 * The sharded table of an in-place job (rg_train_table_t, <regroup/train.h>): its layout, its
 * two copies, and how a regroup finds every row and moves it to its owner in the new round.
 *
 * Copies. rg_train_table_commit(step) is a small two-phase commit:
 *   1. this rank sends its rows to its buddy, and receives its sender's rows into the older of
 *      the two buddy copies it keeps (marked invalid first, valid at `step` once whole: the
 *      newer one, of the step before, stays whole whatever happens meanwhile; with
 *      $REGROUP_TABLE_BUDDY_COPIES=1, into the only one, and the step before is then held
 *      only by the node copies until the commit is over);
 *   2. the ranks agree that every exchange succeeded (an allreduce of one word: none
 *      completes unless every rank took part, so a member that died before this point makes
 *      the commit fail everywhere);
 *   3. then each writes its rows into its node copy (marked invalid, then valid at `step`).
 * A program applies a step's update to its replicated state only once the commit returned
 * RG_OK; so every member's replicated state is at `step` or at the last step committed
 * before, and both steps' rows are held: at `step` in the newer buddy copies (and the node
 * copies written), at the step before in the older buddy copies and the node copies not yet
 * rewritten. A regroup uses these copies only, never the live rows, which the program may
 * have changed since the last commit.
 *
 * The node copy is one memfd of the agent's per local rank (RG_TABLE_ENV): a header
 * (slot_hdr_t: valid, magic, version, the table's size, the rows held, their step), then the
 * rows. Only its local rank's worker writes it; every worker of the node may read it during
 * a regroup (no member writes then: the regroup's barrier comes before its commit).
 *
 * Buddies. The ranks in order of (node, rank); m, the most ranks any node has; the buddy of
 * the rank at position i is the rank at position i + m (mod W), which is on another node
 * when m <= W / 2. Otherwise (one node, or one node holding more than half the ranks) the
 * shift is 1 and a buddy may share its node. Each rank is the buddy of exactly one other.
 *
 * A regroup (train_table_find, then train_table_move and train_table_settle, from
 * train_regroup.c's agree_state):
 *   1. every member says what it holds: its two buddy copies and each node copy it can read
 *      (an allgather of (first, count, step) triples);
 *   2. every member computes the same plan: the step is the newest that some member's
 *      replicated state is at and at which every row is held; each row of a new owner comes
 *      from the owner itself when it holds it (a memory copy), else from the lowest rank
 *      holding it;
 *   3. the moves run as tagged sends and receives into a new buffer, which the member adopts
 *      only once the replicated state has arrived too (with its step: one consistent
 *      state); then a barrier (nobody still reads a node copy) and a commit of the new layout.
 */
#include "train_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLOT_MAGIC    0x52475442u   /* "RGTB" */
#define SLOT_VERSION  1u
#define SLOT_HDR      64            /* bytes before the rows */
#define TAG_COMMIT    0xfffe0000u   /* point-to-point tags of the table's own */
#define TAG_MOVE      0xffff0000u   /* + the move's index */
#define MOVES_MAX     0xffffu
#define ROWS_MAX      0xffffffffull
#define ROW_BYTES_MAX (1ull << 30)
#define TABLE_COPIES_ENV "REGROUP_TABLE_BUDDY_COPIES"

typedef struct {
    _Atomic uint32_t valid;   /* 1: the fields and the rows are whole */
    uint32_t         magic;
    uint32_t         version;
    uint32_t         reserved;
    uint64_t         n_rows;
    uint64_t         row_bytes;
    uint64_t         first;
    uint64_t         count;
    int64_t          step;
} slot_hdr_t;
_Static_assert(sizeof(slot_hdr_t) <= SLOT_HDR, "slot header");

/* Rows [first, first + count) at step; count 0: none. */
typedef struct {
    int64_t first;
    int64_t count;
    int64_t step;
} hold_t;

struct rg_train_table {
    uint64_t       n_rows;
    size_t         row_bytes;
    int            rank;        /* the layout's: rows follow rank and world; rank -1: none */
    int            world;
    int            round;
    uint64_t       first;
    uint64_t       count;
    unsigned char *rows;
    /* the copies of the sender's rows this rank keeps: the newest and (n_copies 2) the one
     * before */
    int            n_copies;    /* $REGROUP_TABLE_BUDDY_COPIES: 1 or 2 */
    hold_t         copy[2];     /* step -1: invalid */
    unsigned char *copy_rows[2];
    size_t         copy_cap[2];
    /* the buddy plan, for the layout it was made for */
    int            plan_rank;
    int            plan_world;
    int            plan_round;
    int            buddy;
    int            sender;
    uint64_t       node;
    /* node copies */
    int            n_slots;
    int            slot_fd[RG_TABLE_SLOTS_MAX];
    int            own;         /* this worker's slot, or -1 */
    unsigned char *map;         /* its mapping, read-write */
    size_t         map_bytes;
};

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s != '\0'; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    }
    return h;
}

static void layout(rg_train_table_t *t, int rank, int world, int round)
{
    uint32_t first = 0;
    uint32_t count = 0;
    if (rank >= 0 && world > 0) {
        rg_sampler_share((uint32_t)t->n_rows, (uint32_t)rank, (uint32_t)world, &first, &count);
    }
    t->rank = rank;
    t->world = world;
    t->round = round;
    t->first = first;
    t->count = count;
}

static uint64_t share_first(uint64_t n, int rank, int world, uint64_t *count)
{
    uint32_t f;
    uint32_t c;
    rg_sampler_share((uint32_t)n, (uint32_t)rank, (uint32_t)world, &f, &c);
    *count = c;
    return f;
}

/* The node copies named by $REGROUP_TABLE_FDS, kept open (close-on-exec from now on). */
static rg_status_t slots_open(rg_train_table_t *t, int local_rank)
{
    const char *s = getenv(RG_TABLE_ENV);
    t->n_slots = 0;
    t->own = -1;
    if (s == NULL || s[0] == '\0') {
        return RG_OK;
    }
    const char *p = s;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long fd = strtol(p, &end, 10);
        struct stat stb;
        if (end == p || errno != 0 || fd < 0 || fd > (1 << 20) || (*end != ',' && *end != 0)) {
            return rg_error(RG_EINVAL, "%s=%s: not a list of file descriptors", RG_TABLE_ENV,
                            s);
        }
        if (t->n_slots == RG_TABLE_SLOTS_MAX) {
            return rg_error(RG_EINVAL, "%s=%s: more than %d", RG_TABLE_ENV, s,
                            RG_TABLE_SLOTS_MAX);
        }
        if (fstat((int)fd, &stb) != 0 || !S_ISREG(stb.st_mode)) {
            return rg_error(RG_EINVAL, "%s=%s: descriptor %ld is no node copy", RG_TABLE_ENV,
                            s, fd);
        }
        (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
        t->slot_fd[t->n_slots++] = (int)fd;
        p = *end == ',' ? end + 1 : end;
    }
    if (local_rank >= 0 && local_rank < t->n_slots) {
        t->own = local_rank;
    }
    return RG_OK;
}

rg_status_t rg_train_table_create(rg_train_ctx_t *ctx, uint64_t n_rows, size_t row_bytes,
                                  rg_train_table_t **table_p)
{
    if (ctx == NULL || table_p == NULL) {
        return rg_error(RG_EINVAL, "rg_train_table_create: NULL argument");
    }
    *table_p = NULL;
    if (n_rows < 1 || n_rows > ROWS_MAX || row_bytes < 1 || row_bytes > ROW_BYTES_MAX) {
        return rg_error(RG_EINVAL, "rg_train_table_create: %llu rows of %zu bytes (1 to "
                        "2^32 - 1 rows of 1 to 2^30 bytes)", (unsigned long long)n_rows,
                        row_bytes);
    }
    if (ctx->table_made) {
        return rg_error(RG_EINVAL, "rg_train_table_create: this worker has a table already "
                        "(one per worker: put every sharded tensor in its rows)");
    }
    int64_t n_copies = 2;
    const char *env = getenv(TABLE_COPIES_ENV);
    if (env != NULL && env[0] != '\0' &&
        (!rg_parse_i64(env, &n_copies) || n_copies < 1 || n_copies > 2)) {
        return rg_error(RG_EINVAL, "%s=%s: 1 or 2 (the buddy copies of a rank's rows)",
                        TABLE_COPIES_ENV, env);
    }
    rg_train_table_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return rg_error(RG_ENOMEM, "table");
    }
    t->n_copies = (int)n_copies;
    t->n_rows = n_rows;
    t->row_bytes = row_bytes;
    t->copy[0].step = t->copy[1].step = -1;
    t->plan_world = -1;
    t->own = -1;   /* no node copy outside an in-place job */
    if (ctx->in_place) {
        rg_status_t st = slots_open(t, ctx->local_rank);
        if (st != RG_OK) {
            free(t);
            return st;
        }
    }
    const char *agent = getenv("REGROUP_AGENT_ID");
    char host[256] = "";
    if (agent == NULL || agent[0] == '\0') {
        (void)gethostname(host, sizeof(host) - 1);
        agent = host;
    }
    t->node = fnv1a(agent);
    layout(t, ctx->joining ? -1 : ctx->rank, ctx->joining ? 0 : ctx->world, ctx->round);
    if (t->count > 0) {
        t->rows = calloc(t->count, row_bytes);
        if (t->rows == NULL) {
            unsigned long long count = t->count;
            free(t);
            return rg_error(RG_ENOMEM, "table: %llu rows of %zu bytes", count, row_bytes);
        }
    }
    ctx->table_made = true;
    *table_p = t;
    return RG_OK;
}

void rg_train_table_destroy(rg_train_table_t *t)
{
    if (t == NULL) {
        return;
    }
    if (t->map != NULL) {
        munmap(t->map, t->map_bytes);
    }
    free(t->rows);
    free(t->copy_rows[0]);
    free(t->copy_rows[1]);
    free(t);
}

void *rg_train_table_rows(rg_train_table_t *t, uint64_t *first_p, uint64_t *count_p)
{
    if (first_p != NULL) {
        *first_p = t != NULL ? t->first : 0;
    }
    if (count_p != NULL) {
        *count_p = t != NULL ? t->count : 0;
    }
    return t != NULL ? t->rows : NULL;
}

uint64_t rg_train_table_n_rows(const rg_train_table_t *t)
{
    return t != NULL ? t->n_rows : 0;
}

size_t rg_train_table_row_bytes(const rg_train_table_t *t)
{
    return t != NULL ? t->row_bytes : 0;
}

/* ---- copies ---------------------------------------------------------------------------- */

/* The mapping of this rank's node copy, big enough for its rows. */
static rg_status_t slot_map(rg_train_table_t *t)
{
    if (t->own < 0) {
        return RG_OK;
    }
    int fd = t->slot_fd[t->own];
    size_t need = SLOT_HDR + t->count * t->row_bytes;
    if (t->map != NULL && t->map_bytes >= need) {
        return RG_OK;
    }
    struct stat stb;
    if (t->map != NULL) {
        munmap(t->map, t->map_bytes);
        t->map = NULL;
    }
    /* Never shrunk: another worker of the node may read it in a regroup later. */
    if (fstat(fd, &stb) != 0 ||
        ((size_t)stb.st_size < need && ftruncate(fd, (off_t)need) != 0)) {
        return rg_error(RG_ESYS, "node copy: %s", strerror(errno));
    }
    void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        return rg_error(RG_ESYS, "node copy: mmap of %zu bytes: %s", need, strerror(errno));
    }
    t->map = p;
    t->map_bytes = need;
    return RG_OK;
}

/* This rank's rows into its node copy (mapped), as those of step. */
static void slot_write(rg_train_table_t *t, int64_t step)
{
    if (t->own < 0 || t->map == NULL) {
        return;
    }
    slot_hdr_t *h = (slot_hdr_t *)t->map;
    atomic_store(&h->valid, 0);
    if (t->count > 0) {
        memcpy(t->map + SLOT_HDR, t->rows, t->count * t->row_bytes);
    }
    h->magic = SLOT_MAGIC;
    h->version = SLOT_VERSION;
    h->n_rows = t->n_rows;
    h->row_bytes = t->row_bytes;
    h->first = t->first;
    h->count = t->count;
    h->step = step;
    atomic_store_explicit(&h->valid, 1, memory_order_release);
}

/* The buddy plan of the current layout: an allgather of the ranks' nodes. */
static rg_status_t plan_buddies(rg_train_ctx_t *ctx, rg_train_table_t *t)
{
    int w = t->world;
    if (t->plan_rank == t->rank && t->plan_world == w && t->plan_round == t->round) {
        return RG_OK;
    }
    int64_t *node = calloc((size_t)w, sizeof(*node));
    int *order = calloc((size_t)w, sizeof(*order));
    rg_status_t st = RG_OK;
    if (node == NULL || order == NULL) {
        st = rg_error(RG_ENOMEM, "table: buddies");
        goto out;
    }
    node[t->rank] = (int64_t)t->node;
    st = rg_comm_allgather(ctx->comm, RG_COMM_IN_PLACE, node, 1, RG_DTYPE_I64, NULL);
    if (st != RG_OK) {
        goto out;
    }
    /* Stable order by node (insertion sort: W is small next to the rest of a regroup). */
    int most = 0;
    for (int r = 0; r < w; r++) {
        int j = r;
        while (j > 0 && node[order[j - 1]] > node[r]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = r;
    }
    for (int i = 0, run = 0; i < w; i++) {
        run = i > 0 && node[order[i]] == node[order[i - 1]] ? run + 1 : 1;
        most = RG_MAX(most, run);
    }
    int shift = 2 * most <= w ? most : 1;
    for (int i = 0; i < w; i++) {
        if (order[i] == t->rank) {
            t->buddy = order[(i + shift) % w];
            t->sender = order[(i - shift + w) % w];
        }
    }
    t->plan_rank = t->rank;
    t->plan_world = w;
    t->plan_round = t->round;
    rg_debug("table: buddy %d, copy of rank %d (%s node)", t->buddy, t->sender,
             shift == most ? "another" : "possibly the same");
out:
    free(node);
    free(order);
    return st;
}

rg_status_t rg_train_table_commit(rg_train_ctx_t *ctx, rg_train_table_t *t, int64_t step)
{
    if (ctx == NULL || t == NULL) {
        return rg_error(RG_EINVAL, "rg_train_table_commit: NULL argument");
    }
    if (step < 0) {
        return rg_error(RG_EINVAL, "rg_train_table_commit: step < 0");
    }
    if (t->rank != ctx->rank || t->world != ctx->world ||
        (ctx->comm == NULL && t->world > 1)) {
        return rg_error(RG_EINVAL, "rg_train_table_commit: the table is laid out for rank %d "
                        "of %d, the worker is rank %d of %d (regroup with the table)",
                        t->rank, t->world, ctx->rank, ctx->world);
    }
    t->round = ctx->round;
    rg_status_t st = slot_map(t);
    if (st != RG_OK) {
        return st;   /* (before any exchange: the others' fail with this rank's exit) */
    }
    if (t->world == 1) {
        slot_write(t, step);
        return RG_OK;
    }
    st = plan_buddies(ctx, t);
    if (st != RG_OK) {
        return st;
    }
    /* 1. The exchange, into the older copy (the only one, with one copy). */
    int k = t->n_copies == 1 || t->copy[0].step <= t->copy[1].step ? 0 : 1;
    uint64_t c_count;
    uint64_t c_first = share_first(t->n_rows, t->sender, t->world, &c_count);
    size_t bytes = c_count * t->row_bytes;
    t->copy[k].step = -1;
    int64_t ok = 1;
    if (bytes > t->copy_cap[k]) {
        unsigned char *p = realloc(t->copy_rows[k], bytes);
        if (p == NULL) {
            ok = 0;
            rg_warn("table: no memory for a copy of %zu bytes", bytes);
        } else {
            t->copy_rows[k] = p;
            t->copy_cap[k] = bytes;
        }
    }
    rg_comm_req_t *rq = NULL;
    rg_comm_req_t *sq = NULL;
    if (ok && bytes > 0) {
        st = rg_comm_recv_post(ctx->comm, t->copy_rows[k], bytes, RG_DTYPE_U8, t->sender,
                               TAG_COMMIT, NULL, &rq);
    }
    if (st == RG_OK && t->count > 0) {
        st = rg_comm_send_post(ctx->comm, t->rows, t->count * t->row_bytes, RG_DTYPE_U8,
                               t->buddy, TAG_COMMIT, NULL, &sq);
    }
    if (st == RG_OK && rq != NULL) {
        st = rg_comm_req_wait(rq);
    }
    if (st == RG_OK && sq != NULL) {
        st = rg_comm_req_wait(sq);
    }
    rg_comm_req_free(rq);
    rg_comm_req_free(sq);
    if (st != RG_OK) {
        return st;   /* the group is unusable: nobody's agreement completes */
    }
    if (ok) {
        t->copy[k] = (hold_t){.first = (int64_t)c_first, .count = (int64_t)c_count,
                              .step = step};
    }
    /* 2. Every exchange succeeded. */
    st = rg_comm_allreduce(ctx->comm, RG_COMM_IN_PLACE, &ok, 1, RG_DTYPE_I64, RG_OP_MIN, NULL);
    if (st != RG_OK) {
        return st;
    }
    if (!ok) {
        return rg_error(RG_ENOMEM, "rg_train_table_commit: a member had no memory for its "
                        "buddy copy of step %lld", (long long)step);
    }
    /* 3. The node copy. */
    slot_write(t, step);
    return RG_OK;
}

/* ---- a regroup ------------------------------------------------------------------------- */

struct train_table_view {
    int            world;
    int            n_holds;    /* per member */
    hold_t        *holds;      /* world x n_holds */
    const unsigned char **src; /* this member's: where each of its holdings' rows lie */
    void         **maps;       /* node copies mapped to read them, and their sizes */
    size_t        *map_bytes;
    int64_t        step;
    unsigned char *new_rows;   /* the rows of this rank's new layout, once moved */
};

void train_table_view_free(train_table_view_t *v)
{
    if (v == NULL) {
        return;
    }
    for (int i = 0; v->maps != NULL && i < v->n_holds; i++) {
        if (v->maps[i] != NULL) {
            munmap(v->maps[i], v->map_bytes[i]);
        }
    }
    free(v->maps);
    free(v->map_bytes);
    free(v->src);
    free(v->holds);
    free(v->new_rows);
    free(v);
}

/* Node copy i, if whole and of this table: its holding, mapped read-only in v. */
static void slot_read(const rg_train_table_t *t, int i, train_table_view_t *v, int k,
                      hold_t *h)
{
    struct stat stb;
    int fd = t->slot_fd[i];
    *h = (hold_t){.step = -1};
    if (fstat(fd, &stb) != 0 || (size_t)stb.st_size < SLOT_HDR) {
        return;
    }
    size_t size = (size_t)stb.st_size;
    void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rg_debug("table: node copy %d: mmap: %s", i, strerror(errno));
        return;
    }
    v->maps[k] = p;
    v->map_bytes[k] = size;
    const slot_hdr_t *s = p;
    if (atomic_load_explicit(&s->valid, memory_order_acquire) != 1 ||
        s->magic != SLOT_MAGIC || s->version != SLOT_VERSION || s->n_rows != t->n_rows ||
        s->row_bytes != t->row_bytes || s->first > t->n_rows ||
        s->count > t->n_rows - s->first || s->step < 0 ||
        (size - SLOT_HDR) / t->row_bytes < s->count) {
        return;
    }
    *h = (hold_t){.first = (int64_t)s->first, .count = (int64_t)s->count, .step = s->step};
    v->src[k] = (const unsigned char *)p + SLOT_HDR;
}

static bool holds_row(const hold_t *h, int64_t step, int64_t row)
{
    return h->count > 0 && h->step == step && row >= h->first && row < h->first + h->count;
}

/* Whether every row is held at step. */
static bool covered(const train_table_view_t *v, int64_t n_rows, int64_t step)
{
    int64_t row = 0;
    int total = v->world * v->n_holds;
    /* Greedy sweep: from row on, the holding that reaches furthest (total <= a few
     * thousand, each pass advances row past a holding's end). */
    for (int pass = 0; pass <= total && row < n_rows; pass++) {
        int64_t reach = row;
        for (int k = 0; k < total; k++) {
            if (holds_row(&v->holds[k], step, row)) {
                reach = RG_MAX(reach, v->holds[k].first + v->holds[k].count);
            }
        }
        if (reach == row) {
            return false;
        }
        row = reach;
    }
    return row >= n_rows;
}

rg_status_t train_table_find(rg_train_ctx_t *ctx, rg_train_table_t *t, const int64_t *steps,
                             int64_t *step_p, train_table_view_t **view_p)
{
    int w = ctx->world;
    int64_t head[3] = {(int64_t)t->n_rows, (int64_t)t->row_bytes, t->n_slots};
    int64_t lo[3];
    int64_t hi[3];
    rg_status_t st;

    *view_p = NULL;
    memcpy(lo, head, sizeof(lo));
    st = rg_comm_allreduce(ctx->comm, RG_COMM_IN_PLACE, lo, 3, RG_DTYPE_I64, RG_OP_MIN, NULL);
    memcpy(hi, head, sizeof(hi));
    if (st == RG_OK) {
        st = rg_comm_allreduce(ctx->comm, RG_COMM_IN_PLACE, hi, 3, RG_DTYPE_I64, RG_OP_MAX,
                               NULL);
    }
    if (st != RG_OK) {
        return st;
    }
    if (lo[0] != hi[0] || lo[1] != hi[1] || lo[0] == 0) {
        return rg_error(RG_EINVAL, "regroup: the members' sharded tables differ (this rank: "
                        "%llu rows of %zu bytes; others from %lld to %lld rows, %lld to %lld "
                        "bytes)", (unsigned long long)t->n_rows, t->row_bytes,
                        (long long)lo[0], (long long)hi[0], (long long)lo[1],
                        (long long)hi[1]);
    }
    train_table_view_t *v = calloc(1, sizeof(*v));
    if (v == NULL) {
        return rg_error(RG_ENOMEM, "table: view");
    }
    v->world = w;
    v->n_holds = 2 + (int)hi[2];   /* the two buddy copies, the node copies */
    v->holds = calloc((size_t)w * (size_t)v->n_holds, sizeof(hold_t));
    v->src = calloc((size_t)v->n_holds, sizeof(*v->src));
    v->maps = calloc((size_t)v->n_holds, sizeof(*v->maps));
    v->map_bytes = calloc((size_t)v->n_holds, sizeof(*v->map_bytes));
    if (v->holds == NULL || v->src == NULL || v->maps == NULL || v->map_bytes == NULL) {
        train_table_view_free(v);
        return rg_error(RG_ENOMEM, "table: view of %d members", w);
    }
    hold_t *mine = &v->holds[(size_t)ctx->rank * (size_t)v->n_holds];
    for (int k = 0; k < v->n_holds; k++) {
        mine[k] = (hold_t){.step = -1};
    }
    for (int c = 0; c < 2; c++) {
        if (t->copy[c].step >= 0 && t->copy[c].count > 0) {
            mine[c] = t->copy[c];
            v->src[c] = t->copy_rows[c];
        }
    }
    for (int i = 0; i < t->n_slots; i++) {
        slot_read(t, i, v, 2 + i, &mine[2 + i]);
    }
    st = rg_comm_allgather(ctx->comm, RG_COMM_IN_PLACE, v->holds,
                           (size_t)v->n_holds * 3, RG_DTYPE_I64, NULL);
    if (st != RG_OK) {
        train_table_view_free(v);
        return st;
    }
    /* The newest step some member's replicated state is at and every row is held at. */
    int64_t step = -1;
    int64_t below = INT64_MAX;
    for (int pass = 0; pass < w && step < 0; pass++) {
        int64_t cand = -1;
        for (int r = 0; r < w; r++) {
            if (steps[r] < below) {
                cand = RG_MAX(cand, steps[r]);
            }
        }
        if (cand < 0) {
            break;
        }
        if (covered(v, (int64_t)t->n_rows, cand)) {
            step = cand;
        }
        below = cand;
    }
    if (step < 0) {
        for (int k = 0; k < w * v->n_holds; k++) {
            if (v->holds[k].count > 0) {
                rg_info("table: member %d holds rows %lld..%lld at step %lld (%d)",
                        k / v->n_holds, (long long)v->holds[k].first,
                        (long long)(v->holds[k].first + v->holds[k].count),
                        (long long)v->holds[k].step, k % v->n_holds);
            }
        }
        for (int r = 0; r < w; r++) {
            rg_info("table: member %d is at step %lld", r, (long long)steps[r]);
        }
        train_table_view_free(v);
        return rg_error(RG_ENOENT, "regroup: rows of the sharded table are held by no member "
                        "at any step a member's state is at (their owner and its buddy were "
                        "lost, and its node copy with its node)");
    }
    v->step = step;
    *step_p = step;
    *view_p = v;
    return RG_OK;
}

/* Who gives the new owner d the rows from row on, and to where: the owner itself when it
 * holds them, else the lowest rank. *end gets the end of the run. */
static void pick(const train_table_view_t *v, int d, int64_t row, int64_t limit, int *src,
                 int *hold, int64_t *end)
{
    *src = -1;
    for (int pass = 0; pass < 2 && *src < 0; pass++) {
        for (int m = pass == 0 ? d : 0; m < v->world && *src < 0; m++) {
            for (int k = 0; k < v->n_holds; k++) {
                const hold_t *h = &v->holds[(size_t)m * (size_t)v->n_holds + (size_t)k];
                if (holds_row(h, v->step, row)) {
                    *src = m;
                    *hold = k;
                    *end = RG_MIN(limit, h->first + h->count);
                    break;
                }
            }
            if (pass == 0) {
                break;
            }
        }
    }
}

rg_status_t train_table_move(rg_train_ctx_t *ctx, rg_train_table_t *t, train_table_view_t *v,
                             size_t *from_others_p, size_t *from_buddy_p,
                             size_t *from_node_p)
{
    int me = ctx->rank;
    size_t rb = t->row_bytes;
    uint64_t my_count;
    uint64_t my_first = share_first(t->n_rows, me, v->world, &my_count);
    size_t n_req = 0;
    size_t cap = 0;
    rg_comm_req_t **reqs = NULL;
    rg_status_t st = RG_OK;
    uint32_t idx = 0;

    *from_others_p = 0;
    *from_buddy_p = 0;
    *from_node_p = 0;
    if (my_count > 0) {
        v->new_rows = malloc(my_count * rb);
        if (v->new_rows == NULL) {
            return rg_error(RG_ENOMEM, "table: %llu rows of %zu bytes",
                            (unsigned long long)my_count, rb);
        }
    }
    for (int d = 0; d < v->world && st == RG_OK; d++) {
        uint64_t count;
        int64_t row = (int64_t)share_first(t->n_rows, d, v->world, &count);
        int64_t limit = row + (int64_t)count;
        while (row < limit && st == RG_OK) {
            int src;
            int k = 0;
            int64_t end = limit;
            pick(v, d, row, limit, &src, &k, &end);
            if (src < 0 || idx >= MOVES_MAX) {
                st = rg_error(RG_EINVAL, "table: row %lld has no holder at step %lld (or more "
                              "than %u moves)", (long long)row, (long long)v->step, MOVES_MAX);
                break;
            }
            const hold_t *h = &v->holds[(size_t)src * (size_t)v->n_holds + (size_t)k];
            size_t bytes = (size_t)(end - row) * rb;
            if ((src == me || d == me) && n_req + 2 > cap) {
                cap = cap ? 2 * cap : 16;
                rg_comm_req_t **p = realloc(reqs, cap * sizeof(*p));
                if (p == NULL) {
                    st = rg_error(RG_ENOMEM, "table: moves");
                    break;
                }
                reqs = p;
            }
            unsigned char *dst = d == me ? v->new_rows + (size_t)(row - (int64_t)my_first) * rb
                                         : NULL;
            const unsigned char *from = src == me ? v->src[k] + (size_t)(row - h->first) * rb
                                                  : NULL;
            if (src == me && d == me) {
                memcpy(dst, from, bytes);
            } else if (d == me) {
                st = rg_comm_recv_post(ctx->comm, dst, bytes, RG_DTYPE_U8, src,
                                       TAG_MOVE + idx, NULL, &reqs[n_req]);
                n_req += st == RG_OK;
            } else if (src == me) {
                st = rg_comm_send_post(ctx->comm, from, bytes, RG_DTYPE_U8, d, TAG_MOVE + idx,
                                       NULL, &reqs[n_req]);
                n_req += st == RG_OK;
            }
            if (d == me) {
                size_t n = (size_t)(end - row);
                *(k < 2 ? from_buddy_p : from_node_p) += n;
                *from_others_p += src != me ? n : 0;
            }
            idx++;
            row = end;
        }
    }
    for (size_t i = 0; i < n_req; i++) {
        if (st == RG_OK) {
            st = rg_comm_req_wait(reqs[i]);
        }
        rg_comm_req_free(reqs[i]);   /* (one still in progress fails the group: it has) */
    }
    free(reqs);
    return st;
}

void train_table_adopt(rg_train_ctx_t *ctx, rg_train_table_t *t, train_table_view_t *v)
{
    free(t->rows);
    t->rows = v->new_rows;
    v->new_rows = NULL;
    layout(t, ctx->rank, ctx->world, ctx->round);
}

rg_status_t train_table_settle(rg_train_ctx_t *ctx, rg_train_table_t *t, train_table_view_t *v)
{
    int64_t step = v->step;
    train_table_view_free(v);   /* no node copy is read from here on */
    rg_status_t st = rg_comm_barrier(ctx->comm, NULL);
    if (st == RG_OK) {
        st = rg_train_table_commit(ctx, t, step);
    }
    return st;
}
