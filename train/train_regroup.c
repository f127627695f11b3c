/*
 * In-place recovery on the worker's side: rg_train_regroup (<regroup/train.h>).
 *
 * The agent tells its workers where they are through the notice page's assignment (the round
 * its node joined, the world size and each local rank's global rank: launcher_inplace.c).
 * A regroup is:
 *
 *   1. leave the old group (after a peer failure it is unusable); a checkpoint in flight
 *      is not waited for: it finishes in the background with its old checkpointer (kept in
 *      ctx->retired, released once it ended), or fails at its commit deadline when it waits
 *      for a dead peer's shard (never committed, never visible);
 *   2. wait for an assignment newer than this worker's round that includes it;
 *   3. build that round's group (its wire-up keys are the round's own);
 *   4. agree on the state: an allgather of every member's step, buffer count, bytes and
 *      chunk size; the newest step wins, its lowest rank is the source, and it sends the
 *      state (its cursor, then every buffer in chunks) to the members at another step only:
 *      a replacement, or a survivor that did not finish the failed step. A receiver with a
 *      state of its own takes the bytes into scratch memory and copies them only once all
 *      arrived, so a source that dies mid-transfer leaves that state as it was, and the next
 *      attempt agrees again; a replacement receives into its buffers;
 *   5. a new checkpointer for the new rank and world size.
 *
 * A failure in 3-4 (a member died, a wire-up that times out because the agents moved on to a
 * newer round) starts again at 1 with whatever assignment is newest, until the deadline. If
 * that passes, or no member holds a state, the worker asks its agent to restart the job
 * ('X' on the agent's pipe) and returns the error.
 */
#include "train_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REGROUP_TIMEOUT_MS  120000
#define CREATE_ATTEMPT_MS   3000    /* one wire-up; then look for a newer round */
#define REGROUP_ATTEMPTS    1000    /* bounded by the deadline long before */
#define NEWER_WAIT_MS       200     /* after a failed attempt: a newer round, or the same */
#define ASK_ROUND_MS        1000    /* past the lease TTL with no round: ask for one */
#define CUT_OFF_TRIES       2       /* wire-ups in a row that reach no other node: cut off */
#define SPARE_READY_MS      2000    /* a newcomer waits this long at most for its UCX worker */
#define AGREE_WORDS         5       /* each member's step, buffer count, bytes, chunk, and
                                     * 0: a member, 1: a replacement, 2: a new node's worker */
#define HDR_WORDS           4       /* the source's cursor (seed, epoch, step) and its extra
                                     * bytes' count */
#define XFER_CHUNK          ((size_t)4 << 20)   /* the state goes in chunks of this size, */
#define XFER_CHUNK_MAX      ((size_t)1 << 30)   /* ($REGROUP_REGROUP_CHUNK_BYTES: at most; */
                                                /* the members take the smallest of theirs) */
#define XFER_WINDOW         4                   /* this many in flight per receiver */
/* Point-to-point tags (train_table.c has 0xfffe0000 and up); chunks: + the chunk mod 65536 */
#define TAG_STATE_HDR       0xfffc0000u
#define TAG_STATE           0xfffd0000u
#define TAG_STATE_CHUNKS    0xffffu
#define TAG_STATE_EXTRA     0xfffa0000u

bool rg_train_in_place(const rg_train_ctx_t *ctx)
{
    return ctx != NULL && ctx->in_place;
}

bool rg_train_joining(const rg_train_ctx_t *ctx)
{
    return ctx != NULL && ctx->joining;
}

void train_retired_reap(rg_train_ctx_t *ctx, int64_t wait_ms)
{
    rg_deadline_t until = rg_deadline_in_ms(wait_ms);
    int k = 0;
    for (int i = 0; i < ctx->n_retired; i++) {
        rg_ckpt_save_t *save = ctx->retired[i].save;
        if (wait_ms > 0 && !ctx->retired[i].doomed &&
            rg_ckpt_save_wait(save, until) != RG_OK) {
            rg_debug("waiting for the checkpoint of step %lld of an earlier group: %s",
                     (long long)ctx->retired[i].step, rg_last_error());
        }
        rg_status_t st = rg_ckpt_save_status(save);
        if (st == RG_INPROGRESS) {
            if (wait_ms > 0) {
                rg_warn("abandoning the checkpoint of step %lld of an earlier group: it never "
                        "committed", (long long)ctx->retired[i].step);
            } else {
                ctx->retired[k++] = ctx->retired[i];
            }
            continue;   /* (abandoned: left to the process's exit, with its checkpointer) */
        }
        if (st != RG_OK) {
            rg_info("the checkpoint of step %lld of an earlier group did not commit: %s",
                    (long long)ctx->retired[i].step, rg_ckpt_save_error(save));
        }
        rg_ckpt_save_release(save);
        rg_ckpt_destroy(ctx->retired[i].ckpt);
    }
    ctx->n_retired = k;
}

void train_retired_wait_step(rg_train_ctx_t *ctx, int64_t step, int64_t wait_ms)
{
    rg_deadline_t until = rg_deadline_in_ms(wait_ms);
    for (int i = 0; i < ctx->n_retired; i++) {
        if (ctx->retired[i].step == step && !ctx->retired[i].doomed &&
            rg_ckpt_save_wait(ctx->retired[i].save, until) != RG_OK &&
            rg_ckpt_save_status(ctx->retired[i].save) == RG_INPROGRESS) {
            rg_warn("the checkpoint of step %lld of an earlier group is still in flight",
                    (long long)step);
        }
    }
    train_retired_reap(ctx, 0);
}

/* Leaves the old group and its checkpointer. A checkpoint still in flight is not waited
 * for: with every rank alive it commits in the background, with its old checkpointer; one
 * that waits for a dead peer's shard fails at its commit deadline, never visible. */
static void leave_group(rg_train_ctx_t *ctx)
{
    train_retired_reap(ctx, 0);
    if (ctx->save != NULL && rg_ckpt_save_status(ctx->save) == RG_INPROGRESS &&
        ctx->n_retired < TRAIN_RETIRED_MAX) {
        ctx->retired[ctx->n_retired].ckpt = ctx->ckpt;
        ctx->retired[ctx->n_retired].save = ctx->save;
        /* a peer died: the commit waits for a shard that never comes */
        ctx->retired[ctx->n_retired].doomed = ctx->comm == NULL ||
                                              !rg_comm_is_healthy(ctx->comm);
        ctx->retired[ctx->n_retired++].step = ctx->save_step;
        ctx->save = NULL;
        ctx->ckpt = NULL;
    } else if (ctx->save != NULL) {
        /* Ended, or no room left: then wait, bounded as in rg_train_finalize. */
        if (rg_ckpt_save_status(ctx->save) == RG_INPROGRESS &&
            rg_ckpt_save_wait(ctx->save, rg_deadline_in_ms(1000)) != RG_OK &&
            rg_ckpt_save_status(ctx->save) == RG_INPROGRESS) {
            rg_warn("abandoning the checkpoint of step %lld in flight: the group changed",
                    (long long)ctx->save_step);
            ctx->save = NULL;
            ctx->ckpt = NULL;
        } else {
            rg_status_t fs = train_save_finish(ctx, RG_DEADLINE_DEFAULT);
            if (fs != RG_OK) {
                rg_warn("the checkpoint in flight before the regroup failed: %s",
                        rg_last_error());
            }
        }
    }
    rg_ckpt_destroy(ctx->ckpt);
    ctx->ckpt = NULL;
    rg_comm_destroy(ctx->comm);
    ctx->comm = NULL;
}

/* The group's abandon hook (train_group_watch). While its wire-up waits for the members'
 * addresses: the agent has assigned this worker any newer round (a member of this one died
 * before it published its address, or a replacement became ready: the members that are left
 * go to the newer round, and waiting out the wire-up's deadline for this one only costs the
 * job that long). Once it is made: the agent has assigned this worker a round
 * newer than the group's with fewer ranks. Its agent closes that round within milliseconds
 * of a local worker's death (and others' agents once the lost member's lease is gone),
 * where UCX would tell the survivors of the death only at its next keepalive (about 100 ms
 * over shared memory). A newer round of as many ranks or more is a planned change (a
 * replacement ready, a node joining): the members finish their step and regroup at its end,
 * and their collectives are not given up. One shared-memory read. */
static bool group_member_lost(void *arg, char *why, size_t cap)
{
    rg_train_ctx_t *ctx = arg;
    rg_notice_assign_t a;
    if (!rg_notice_read_assign(&ctx->notice, &a) || a.round <= ctx->group_round ||
        ctx->local_rank >= a.n || a.rank[ctx->local_rank] < 0) {
        return false;
    }
    if (ctx->group_wiring) {
        snprintf(why, cap, "this node's agent joined round %d while round %d was being made",
                 a.round, ctx->group_round);
        return true;
    }
    if (a.world >= ctx->group_world) {
        return false;
    }
    snprintf(why, cap, "a member of round %d is lost: this node's agent joined round %d of "
             "%d ranks", ctx->group_round, a.round, a.world);
    return true;
}

void train_spare_start(rg_train_ctx_t *ctx)
{
    const char *env = getenv("REGROUP_SPARE_WORKER");
    if (!ctx->in_place || ctx->spare != NULL || (env != NULL && strcmp(env, "0") == 0)) {
        return;
    }
    if (rg_comm_spare_start(RG_MAX(ctx->world, 1), true, &ctx->spare) != RG_OK) {
        rg_debug("no spare UCX worker for the next regroup: %s", rg_last_error());
        ctx->spare = NULL;
    }
}

void train_group_watch(rg_train_ctx_t *ctx, int round, int world, rg_comm_params_t *params)
{
    ctx->group_round = round;
    ctx->group_world = world;
    params->abandon = group_member_lost;
    params->abandon_arg = ctx;
}

/* Asks this worker's agent for the next round (RG_NOTICE_MSG_REGROUP), once per regroup. */
static void ask_round(rg_train_ctx_t *ctx, int round, const char *why)
{
    if (rg_notice_msg_send(RG_NOTICE_MSG_REGROUP, ctx->local_rank)) {
        rg_info("regroup from round %d: %s: asking for the next round", round, why);
    } else {
        rg_warn("regroup from round %d: %s, and the agent cannot be asked for a round",
                round, why);
    }
}

/* Whether a failed wire-up reached no rank of any other node (unreached, from
 * rg_comm_params_t): this node's links to its peers are cut, or every peer is gone. Ranks of
 * this node (a->rank) do not count; false when the round has no other node. */
static bool reached_no_other_node(const rg_notice_assign_t *a, const unsigned char *unreached)
{
    int others = 0;
    for (int r = 0; r < a->world; r++) {
        bool local = false;
        for (int i = 0; i < a->n && !local; i++) {
            local = a->rank[i] == r;
        }
        if (local) {
            continue;
        }
        if (!unreached[r]) {
            return false;
        }
        others++;
    }
    return others > 0;
}

/* Waits for an assignment of round min_round or newer that includes this worker. */
static rg_status_t wait_assignment(rg_train_ctx_t *ctx, int min_round, rg_deadline_t deadline,
                                   rg_notice_assign_t *a)
{
    const struct timespec nap = {.tv_sec = 0, .tv_nsec = 1000000};
    int64_t ttl = rg_notice_lease_ttl_ms(&ctx->notice);

    for (uint64_t i = 0;; i++) {
        if (rg_notice_read_assign(&ctx->notice, a) && a->round >= min_round &&
            ctx->local_rank < a->n && a->rank[ctx->local_rank] >= 0) {
            return RG_OK;
        }
        int64_t age = rg_notice_heartbeat_age_ms(&ctx->notice, rg_notice_now_ms());
        if (age > ttl) {
            return rg_error(RG_ELEASE, "regroup: this worker's agent has not renewed its "
                            "membership for %lld ms: the job goes on without this node",
                            (long long)age);
        }
        if (rg_deadline_passed(deadline)) {
            return rg_error(RG_ETIMEDOUT, "regroup: no round from %d on took this worker in "
                            "before the deadline", min_round);
        }
        nanosleep(&nap, NULL);   /* 1 ms: the page is a local read */
    }
}

/* The group of round a->round, within deadline (at most one attempt's time). */
static rg_status_t make_group(rg_train_ctx_t *ctx, const rg_notice_assign_t *a,
                              rg_deadline_t deadline, unsigned char *unreached)
{
    char prefix[RDZV_KEY_MAX];
    rg_status_t st = rdzv_keys_comm_prefix(&ctx->keys, a->round, prefix, sizeof(prefix));
    if (st != RG_OK) {
        return st;
    }
    int64_t left = rg_deadline_left_ms(deadline);
    rg_comm_params_t cp = {.rank = a->rank[ctx->local_rank], .size = a->world,
                           .etcd = ctx->etcd, .key_prefix = prefix,
                           .timeout_ms = ctx->comm_timeout_ms,
                           .create_timeout_ms = RG_MAX(1, RG_MIN(left, CREATE_ATTEMPT_MS)),
                           .spare = ctx->spare, .unreached = unreached};
    ctx->spare = NULL;   /* the group's, made or not */
    train_group_watch(ctx, a->round, a->world, &cp);
    ctx->group_wiring = true;
    st = rg_comm_create(&cp, &ctx->comm);
    ctx->group_wiring = false;
    if (st != RG_OK) {
        ctx->comm = NULL;
        return st;
    }
    ctx->rank = cp.rank;
    ctx->world = cp.size;
    ctx->round = a->round;
    ctx->restart_count = a->restarts;
    if (ctx->fence.on) {
        /* The job's writes from now on are this round's (rdzv_fence.h), under the agent's
         * lease in it: the page's. The one from the environment is the agent's when this
         * worker started; an agent whose lease was lost joins with a new one while its
         * workers live, and every write fenced with the old one was refused (each a regroup
         * that asked for another round: a regroup every few steps, no checkpoint). */
        char agent[sizeof(ctx->fence.agent)];
        snprintf(agent, sizeof(agent), "%s", ctx->fence.agent);
        st = rdzv_fence_init(&ctx->fence, &ctx->keys, a->round, agent,
                             a->lease != 0 ? a->lease : ctx->fence.lease);
        if (st != RG_OK) {
            return st;
        }
    }
    rg_log_set_identity(ctx->rank, ctx->round);
    return RG_OK;
}

/* The state's bytes (every buffer, in order) between the source and its receivers, in chunks
 * of at most `chunk` bytes with XFER_WINDOW of them in flight to or from each peer. The
 * source sends to every peer in `peers`; a receiver (n_peers 1: the source) receives into
 * scratch (the buffers laid end to end) or, when scratch is NULL, into its buffers. On
 * failure *failed_buf is the buffer (from 1) in which the transfer broke off. */
static rg_status_t state_stream(rg_train_ctx_t *ctx, const rg_train_buf_t *bufs,
                                size_t n_bufs, uint32_t tag_base, bool send, const int *peers,
                                int n_peers, unsigned char *scratch, size_t chunk,
                                size_t *failed_buf)
{
    rg_comm_req_t **reqs = calloc((size_t)XFER_WINDOW * (size_t)n_peers, sizeof(*reqs));
    rg_status_t st = RG_OK;
    size_t i = 0;      /* the buffer */
    size_t off = 0;    /* in it */
    size_t base = 0;   /* its offset in scratch */
    uint32_t k = 0;    /* the chunk */

    if (reqs == NULL) {
        return rg_error(RG_ENOMEM, "regroup: transfer requests");
    }
    while (i < n_bufs && st == RG_OK) {
        size_t bytes = bufs[i].bytes;
        if (off >= bytes) {
            base += bytes;
            off = 0;
            i++;
            continue;
        }
        size_t len = RG_MIN(chunk, bytes - off);
        unsigned char *p = scratch != NULL ? scratch + base + off
                                           : (unsigned char *)bufs[i].data + off;
        rg_comm_req_t **slot = &reqs[(size_t)(k % XFER_WINDOW) * (size_t)n_peers];
        uint32_t tag = tag_base + (k & TAG_STATE_CHUNKS);
        for (int j = 0; j < n_peers && st == RG_OK; j++) {
            if (slot[j] != NULL) {
                st = rg_comm_req_wait(slot[j]);
                rg_comm_req_free(slot[j]);
                slot[j] = NULL;
            }
            if (st == RG_OK) {
                st = send ? rg_comm_send_post(ctx->comm, p, len, RG_DTYPE_U8, peers[j], tag,
                                              NULL, &slot[j])
                          : rg_comm_recv_post(ctx->comm, p, len, RG_DTYPE_U8, peers[j], tag,
                                              NULL, &slot[j]);
            }
        }
        off += len;
        k++;
    }
    for (size_t j = 0; j < (size_t)XFER_WINDOW * (size_t)n_peers; j++) {
        if (st == RG_OK && reqs[j] != NULL) {
            st = rg_comm_req_wait(reqs[j]);
        }
        rg_comm_req_free(reqs[j]);   /* (one still in progress fails the group: it has) */
    }
    free(reqs);
    *failed_buf = RG_MIN(i + 1, n_bufs);
    return st;
}

static size_t xfer_chunk_bytes(void)
{
    const char *env = getenv("REGROUP_REGROUP_CHUNK_BYTES");
    int64_t v;
    if (env != NULL && rg_parse_i64(env, &v) && v > 0 && v <= (int64_t)XFER_CHUNK_MAX) {
        return (size_t)v;
    }
    return XFER_CHUNK;
}

/* Step 4: agree on the newest state and bring every member to it. An allgather of every
 * member's step, buffer count, bytes and chunk size; the newest step wins (with a sharded
 * table, the newest at which its rows are all held too), its lowest rank is the source, and
 * only the members at another step (a replacement, a survivor that did not finish the failed
 * step) receive it: the others already hold it, since the group's collectives give every
 * rank the same bytes. A receiver with a state of its own takes the bytes into scratch memory first,
 * so that a source dying mid-transfer leaves that state as it was; a replacement, which has
 * none, receives into its buffers. Each member takes the replicated state and its rows of
 * the table together, once both arrived (one consistent state, or none). */
static rg_status_t agree_state(rg_train_ctx_t *ctx, rg_train_regroup_t *rs, int64_t *my_step,
                               rg_data_cursor_t *my_cursor, rg_deadline_t deadline)
{
    int world = ctx->world;
    int64_t *words = calloc((size_t)world, AGREE_WORDS * sizeof(*words));
    int64_t *steps = calloc((size_t)world, sizeof(*steps));
    int *peers = calloc((size_t)world, sizeof(*peers));
    train_table_view_t *view = NULL;
    unsigned char *scratch = NULL;
    size_t from_others = 0;
    size_t from_buddy = 0;
    size_t from_node = 0;
    size_t total = 0;
    size_t failed_buf = 0;
    rg_train_buf_t extra = {0};      /* the source's extra_fn bytes; a receiver's copy */
    bool extra_mine = false;         /*   (then this function's until it is the context's) */
    size_t chunk = XFER_CHUNK_MAX;   /* the smallest of the members' */
    int64_t best = -1;
    int source = -1;
    int n_peers = 0;
    bool differ = false;
    rg_status_t st = RG_OK;

    free(ctx->regroup_extra);   /* (an earlier regroup's: valid until this one) */
    ctx->regroup_extra = NULL;
    rs->extra = NULL;
    rs->extra_bytes = 0;
    rs->n_received = 0;
    if (words == NULL || steps == NULL || peers == NULL) {
        st = rg_error(RG_ENOMEM, "regroup: steps");
        goto out;
    }
    for (size_t i = 0; i < rs->n_bufs; i++) {
        total += rs->bufs[i].bytes;
    }
    int64_t *mine = &words[(size_t)ctx->rank * AGREE_WORDS];
    mine[0] = *my_step;
    mine[1] = (int64_t)rs->n_bufs;
    mine[2] = (int64_t)total;
    mine[3] = (int64_t)xfer_chunk_bytes();
    mine[4] = !ctx->joining ? 0 : ctx->replacement ? 1 : 2;
    st = rg_comm_allgather(ctx->comm, RG_COMM_IN_PLACE, words, AGREE_WORDS, RG_DTYPE_I64,
                           NULL);
    /* A node joins: a newcomer that replaces no dead worker of its node. */
    bool new_node = false;
    for (int r = 0; st == RG_OK && r < world; r++) {
        new_node |= words[(size_t)r * AGREE_WORDS + 4] == 2;
    }
    for (int r = 0; st == RG_OK && r < world; r++) {
        steps[r] = words[(size_t)r * AGREE_WORDS];
        best = RG_MAX(best, steps[r]);
        differ |= words[(size_t)r * AGREE_WORDS + 1] != mine[1] ||
                  words[(size_t)r * AGREE_WORDS + 2] != mine[2];
        int64_t c = words[(size_t)r * AGREE_WORDS + 3];
        differ |= c < 1 || c > (int64_t)XFER_CHUNK_MAX;
        chunk = c >= 1 ? RG_MIN(chunk, (size_t)c) : chunk;
    }
    if (st == RG_OK && differ) {
        /* Every member sees the same words: all of them fail here. */
        st = rg_error(RG_EINVAL, "regroup: the members' state buffers differ in count or "
                      "size (this rank: %zu buffers, %zu bytes), or a chunk size is out of "
                      "range", rs->n_bufs, total);
    }
    if (st == RG_OK && new_node) {
        /* (Before the state moves: a joining node far below the others leaves.) */
        st = train_health_check(ctx, "a node joins");
    }
    if (st == RG_OK && best >= 0 && rs->table != NULL) {
        st = train_table_find(ctx, rs->table, steps, &best, &view);
    }
    for (int r = 0; st == RG_OK && r < world && source < 0; r++) {
        source = steps[r] == best && best >= 0 ? r : -1;
    }
    if (st != RG_OK) {
        goto out;
    }
    if (source < 0) {
        st = rg_error(RG_ENOENT, "regroup: no member of round %d holds a state (every one is "
                      "a replacement)", ctx->round);
        goto out;
    }
    for (int r = 0; r < world; r++) {
        if (steps[r] != best) {
            peers[n_peers++] = r;
        }
    }
    if (view != NULL) {
        st = train_table_move(ctx, rs->table, view, &from_others, &from_buddy, &from_node);
        if (st != RG_OK) {
            goto out;
        }
    }
    bool is_source = ctx->rank == source;
    bool receives = steps[ctx->rank] != best;
    int64_t hdr[HDR_WORDS] = {(int64_t)my_cursor->seed, (int64_t)my_cursor->epoch,
                              (int64_t)my_cursor->step, 0};
    if (is_source && n_peers > 0) {
        const void *data = NULL;
        size_t bytes = 0;
        if (rs->extra_fn != NULL && (rs->extra_fn(rs->extra_arg, &data, &bytes) != 0 ||
                                     (bytes > 0 && data == NULL) || bytes > RG_TRAIN_EXTRA_MAX)) {
            /* (the receivers see this group fail, and try again with the next round) */
            st = rg_error(RG_EINVAL, "regroup: the program's extra state for round %d failed "
                          "(%zu bytes, at most %zu)", ctx->round, bytes, RG_TRAIN_EXTRA_MAX);
            goto out;
        }
        extra = (rg_train_buf_t){.data = (void *)data, .bytes = bytes};
        hdr[3] = (int64_t)bytes;
        rg_info("regroup: rank %d sends the state of step %lld (%zu bytes, %zu extra) to %d "
                "member%s of round %d", ctx->rank, (long long)best, total, bytes, n_peers,
                n_peers > 1 ? "s" : "", ctx->round);
        for (int j = 0; j < n_peers && st == RG_OK; j++) {
            st = rg_comm_send(ctx->comm, hdr, HDR_WORDS, RG_DTYPE_I64, peers[j], TAG_STATE_HDR,
                              NULL);
        }
        if (st == RG_OK) {
            st = state_stream(ctx, rs->bufs, rs->n_bufs, TAG_STATE, true, peers, n_peers, NULL,
                              chunk, &failed_buf);
        }
        if (st == RG_OK && extra.bytes > 0) {
            size_t ignored;
            st = state_stream(ctx, &extra, 1, TAG_STATE_EXTRA, true, peers, n_peers, NULL,
                              chunk, &ignored);
        }
    } else if (receives) {
        rg_info("regroup: rank %d receives the state of step %lld (%zu bytes) from rank %d "
                "in round %d", ctx->rank, (long long)best, total, source, ctx->round);
        /* Without a state of its own (step < 0) there is nothing to keep. */
        if (*my_step >= 0 && total > 0) {
            scratch = malloc(total);
            if (scratch == NULL) {
                st = rg_error(RG_ENOMEM, "regroup: %zu bytes of state", total);
            }
        }
        if (st == RG_OK) {
            st = rg_comm_recv(ctx->comm, hdr, HDR_WORDS, RG_DTYPE_I64, source, TAG_STATE_HDR,
                              NULL);
        }
        if (st == RG_OK) {
            st = state_stream(ctx, rs->bufs, rs->n_bufs, TAG_STATE, false, &source, 1, scratch,
                              chunk, &failed_buf);
        }
        if (st == RG_OK && (hdr[3] < 0 || (uint64_t)hdr[3] > RG_TRAIN_EXTRA_MAX)) {
            st = rg_error(RG_EPROTO, "regroup: rank %d sends %lld bytes of extra state (at "
                          "most %zu)", source, (long long)hdr[3], RG_TRAIN_EXTRA_MAX);
        }
        if (st == RG_OK && hdr[3] > 0) {
            extra = (rg_train_buf_t){.data = malloc((size_t)hdr[3]), .bytes = (size_t)hdr[3]};
            extra_mine = true;
            st = extra.data != NULL ? RG_OK
                                    : rg_error(RG_ENOMEM, "regroup: %lld bytes of extra state",
                                               (long long)hdr[3]);
        }
        if (st == RG_OK && extra.bytes > 0) {
            size_t ignored;
            st = state_stream(ctx, &extra, 1, TAG_STATE_EXTRA, false, &source, 1, NULL, chunk,
                              &ignored);
        }
    } else if (ctx->rank == 0 && n_peers == 0) {
        rg_info("regroup: every member of round %d holds the state of step %lld",
                ctx->round, (long long)best);
    }
    if (st == RG_OK && n_peers > 0) {
        /* Every member waits here, under the regroup's deadline, until the state is
         * everywhere. The members that take no part in the transfer would otherwise wait for
         * the source in their next collective, under the group's timeout, which a long
         * transfer passes with no member lost (and the job regroups again, for nothing). */
        failed_buf = 0;
        st = rg_comm_barrier(ctx->comm, &(rg_comm_opts_t){.deadline = deadline});
        if (st != RG_OK) {
            rg_info("regroup: a member failed before every member of round %d held the state "
                    "of step %lld (%s)", ctx->round, (long long)best, rg_last_error());
        }
    }
    if (st != RG_OK) {
        /* The group is unusable. Destroyed first: UCX writes no more into a failed
         * operation's buffers once it is (comm.h). A receiver with a state of its own keeps
         * it; a replacement's buffers hold a part of it, and it still has no state. */
        rg_comm_destroy(ctx->comm);
        ctx->comm = NULL;
        if (failed_buf > 0 && is_source) {
            rg_info("regroup: the state to round %d's members broke off in buffer %zu of %zu",
                    ctx->round, failed_buf, rs->n_bufs);
        } else if (failed_buf > 0 && *my_step >= 0) {
            rg_info("regroup: the state from rank %d broke off in buffer %zu of %zu: this "
                    "rank's state stays that of step %lld", source, failed_buf, rs->n_bufs,
                    (long long)*my_step);
        } else if (failed_buf > 0) {
            rg_info("regroup: the state from rank %d broke off in buffer %zu of %zu: this "
                    "rank still has no state", source, failed_buf, rs->n_bufs);
        }
        goto out;
    }
    if (view != NULL) {
        train_table_adopt(ctx, rs->table, view);
        rg_info("regroup: the sharded table at step %lld: of this rank's rows, %zu came from "
                "buddy copies and %zu from node copies (%zu sent by other members)",
                (long long)best, from_buddy, from_node, from_others);
        st = train_table_settle(ctx, rs->table, view);
        view = NULL;
        if (st != RG_OK) {
            goto out;
        }
    }
    /* Only now the step received: a member whose regroup failed after the transfer (in the
     * table) keeps the state it had, and a replacement still has none, so that the next try
     * sends it again. Before, the step was taken first: a replacement whose table failed
     * went into the next try saying it held the state, and received none. */
    if (receives) {
        size_t off = 0;
        for (size_t i = 0; scratch != NULL && i < rs->n_bufs; i++) {
            memcpy(rs->bufs[i].data, scratch + off, rs->bufs[i].bytes);
            off += rs->bufs[i].bytes;
        }
        *my_cursor = (rg_data_cursor_t){.seed = (uint64_t)hdr[0], .epoch = (uint64_t)hdr[1],
                                        .step = (uint64_t)hdr[2]};
        ctx->regroup_extra = extra.data;
        rs->extra = extra.data;
        rs->extra_bytes = extra.bytes;
        extra_mine = false;
    }
    *my_step = best;
    rs->received = receives;
    rs->n_received = n_peers;
    rs->source = source;
    rs->step_out = best;
out:
    if (extra_mine) {
        free(extra.data);   /* (a transfer that broke off) */
    }
    train_table_view_free(view);
    free(scratch);
    free(peers);
    free(steps);
    free(words);
    return st;
}

rg_status_t rg_train_regroup(rg_train_ctx_t *ctx, rg_train_regroup_t *rs)
{
    rg_status_t st = RG_OK;

    if (ctx == NULL || rs == NULL || (rs->n_bufs > 0 && rs->bufs == NULL)) {
        return rg_error(RG_EINVAL, "rg_train_regroup: NULL argument");
    }
    for (size_t i = 0; i < rs->n_bufs; i++) {
        if (rs->bufs[i].bytes > 0 && rs->bufs[i].data == NULL) {
            return rg_error(RG_EINVAL, "rg_train_regroup: buffer %zu has no data", i);
        }
    }
    if (!ctx->in_place) {
        return rg_error(RG_ENOTSUP, "rg_train_regroup: this worker does not recover in place "
                        "(run it under regroup --recovery=in-place, with "
                        "rg_train_params_t.in_place)");
    }
    if (!ctx->joining && (rs->step < -1 || (rs->step == -1 && rs->table != NULL))) {
        return rg_error(RG_EINVAL, "rg_train_regroup: step %lld (-1, no state, only without "
                        "a table)", (long long)rs->step);
    }
    int ms = REGROUP_TIMEOUT_MS;
    const char *env = getenv("REGROUP_REGROUP_TIMEOUT_MS");
    int64_t v;
    if (env != NULL && rg_parse_i64(env, &v) && v > 0 && v < (1 << 30)) {
        ms = (int)v;
    }
    rg_deadline_t deadline = rg_deadline_in_ms(ms);
    int64_t my_step = ctx->joining ? -1 : rs->step;   /* (-1: no state) */
    rg_data_cursor_t my_cursor = rs->cursor;
    uint64_t t0 = rg_now_ns();
    int from_round = ctx->round;
    int min_round = ctx->round + 1;
    /* A group whose deadline passed with no peer seen to die: nobody forms a round for that
     * (no lease is lost, no worker exits), so this worker asks its agent for one. */
    bool stalled = rg_comm_fail_status(ctx->comm) == RG_ETIMEDOUT;

    if (ctx->joining && !ctx->said_ready) {
        /* Its UCX worker first (begun at rg_train_init): the members' wire-up with this
         * newcomer then waits for none of it. */
        train_spare_start(ctx);
        (void)rg_comm_spare_wait(ctx->spare, rg_deadline_in_ms(SPARE_READY_MS));
        ctx->said_ready = rg_notice_msg_send(RG_NOTICE_MSG_READY, ctx->local_rank);
        if (!ctx->said_ready) {
            st = rg_error(RG_ESYS, "regroup: cannot tell the agent this replacement is ready");
        }
    }
    /* Tries in a row that reached no other node (one alone may have met peers whose
     * workers were just gone), and whether the agent was told. */
    int cut_tries = 0;
    bool said_cut = false;
    for (int attempt = 0; st == RG_OK && attempt < REGROUP_ATTEMPTS; attempt++) {
        rg_notice_assign_t a;
        leave_group(ctx);
        /* The next group's UCX worker, if none is made yet: in the background while the
         * agents form the round. */
        train_spare_start(ctx);
        if (attempt > 0) {
            /* After a failed attempt at round min_round - 1: a newer round if the agents form
             * one soon (a member died), else that round again (a member was slow, or cut off
             * and maybe back). A newer round that comes later gives the attempt up (the
             * group's abandon hook), so the wait is short: a partition that healed while an
             * attempt waited costs the next attempt, not a second more. */
            rg_deadline_t soon = RG_MIN(deadline, rg_deadline_in_ms(NEWER_WAIT_MS));
            st = wait_assignment(ctx, min_round, soon, &a);
            if (st == RG_ETIMEDOUT && !rg_deadline_passed(deadline)) {
                st = wait_assignment(ctx, min_round - 1, deadline, &a);
            }
        } else if (!ctx->joining) {
            /* A member's failure makes its agent (or, once its lease is gone, the others)
             * open a round within about a lease TTL. A group that failed on a deadline, or
             * no round by a TTL and a second: no member was lost (a peer stalled, or the
             * network between the ranks was cut and is maybe whole again), so this worker
             * asks for a round of the same members. None by three TTLs: the job restarts. */
            int64_t ttl = rg_notice_lease_ttl_ms(&ctx->notice);
            rg_deadline_t first = RG_MIN(deadline, rg_deadline_in_ms(RG_MAX(3000, 3 * ttl)));
            if (stalled) {
                ask_round(ctx, from_round, "its group's deadline passed with no member lost");
            } else {
                st = wait_assignment(ctx, min_round,
                                     RG_MIN(first, rg_deadline_in_ms(ttl + ASK_ROUND_MS)), &a);
                if (st == RG_ETIMEDOUT && !rg_deadline_passed(first)) {
                    ask_round(ctx, from_round, "no round came a lease TTL after its group "
                              "failed");
                }
            }
            if (stalled || st == RG_ETIMEDOUT) {
                st = wait_assignment(ctx, min_round, first, &a);
            }
        } else {
            /* A newcomer waits until the members let it in, as long as its agent may take
             * for that (a node at the job's maximum size waits for room), then has the
             * regroup's own time. */
            st = wait_assignment(ctx, min_round,
                                 rg_deadline_in_ms((int64_t)ctx->join_wait_ms + ms), &a);
            deadline = rg_deadline_in_ms(ms);
        }
        if (st != RG_OK) {
            break;
        }
        unsigned char *unreached = calloc((size_t)RG_MAX(a.world, 1), 1);
        if (unreached == NULL) {
            st = rg_error(RG_ENOMEM, "regroup: a group of %d", a.world);
            break;
        }
        st = make_group(ctx, &a, deadline, unreached);
        cut_tries = st != RG_OK && reached_no_other_node(&a, unreached) ? cut_tries + 1 : 0;
        free(unreached);
        if (cut_tries >= CUT_OFF_TRIES && !said_cut) {
            /* etcd answers (the round came) but no peer on another node does: nobody else
             * can tell which node is cut off, and every round with it fails. */
            char why[512];
            snprintf(why, sizeof(why), "%s", rg_last_error());
            said_cut = rg_notice_msg_send(RG_NOTICE_MSG_CUT_OFF, ctx->local_rank);
            rg_warn("regroup into round %d: %d tries in a row reached no rank of another node "
                    "(%s): %s", a.round, cut_tries, why,
                    said_cut ? "this node is cut off from its peers; its agent takes it out "
                               "of the round" : "and the agent cannot be told");
            (void)rg_error(st, "%s", why);
        }
        if (st == RG_OK) {
            (void)rg_notice_msg_send(RG_NOTICE_MSG_JOINED, ctx->local_rank);
            st = agree_state(ctx, rs, &my_step, &my_cursor, deadline);
        }
        if (st == RG_OK) {
            st = train_ckpt_open(ctx);
            if (st != RG_OK) {
                break;
            }
            ctx->joining = false;
            ctx->agreed = (rg_notice_t){.ms_left = -1};
            rs->rank = ctx->rank;
            rs->world = ctx->world;
            rs->round = ctx->round;
            rs->step = my_step;
            rs->cursor = my_cursor;
            rg_info("regrouped in place from round %d into round %d: rank %d of %d, step %lld "
                    "(state from rank %d%s) in %.3f s", from_round, ctx->round, ctx->rank,
                    ctx->world, (long long)my_step, rs->source,
                    rs->received ? ", received" : "", (double)(rg_now_ns() - t0) / 1e9);
            train_spare_start(ctx);   /* for the next one, while this group trains */
            return RG_OK;
        }
        if (st == RG_EINVAL || st == RG_ENOENT || st == RG_ENOMEM || rg_deadline_passed(deadline)) {
            break;
        }
        /* A member failed, or the wire-up waited for ranks that moved on: the agents form
         * another round; wait for it (this attempt's round counts as left). */
        rg_warn("regroup into round %d failed (%s): waiting for the next round", a.round,
                rg_last_error());
        min_round = a.round + 1;
        st = RG_OK;
    }
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", rg_last_error());
    if (st == RG_ELEASE) {
        /* This worker's agent is no member of the job any more (cut off or stopped past its
         * lease): the job went on without this node, and there is nothing to restart for
         * it. Its agent starts new workers, which join the running job. */
        if (!rg_notice_msg_send(RG_NOTICE_MSG_LEFT_OUT, ctx->local_rank)) {
            rg_warn("cannot tell the agent that this node was left out");
        }
        return rg_error(RG_ELEASE, "in-place regroup failed: the job went on without this "
                        "node (its agent starts new workers, which join it): %s", msg);
    }
    if (!rg_notice_msg_send(RG_NOTICE_MSG_RESTART, ctx->local_rank)) {
        rg_warn("cannot ask the agent to restart the job");
    }
    return rg_error(st != RG_OK ? st : RG_ETIMEDOUT, "in-place regroup failed, restarting the "
                    "job from its last checkpoint: %s", msg);
}
