/*
 * While a round runs: what ends it (rg_rdzv_check), and what an agent records about it
 * (failure markers, done) or does to it (moving on to the next round).
 */
#include "rdzv_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rdzv_range_has(const rg_etcd_range_t *r, const char *key)
{
    for (size_t i = 0; i < r->n_kvs; i++) {
        if (strcmp(r->kvs[i].key, key) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether the member's nodes/ key is gone without a done/ key; false if unsure. */
static bool member_lost(rg_rdzv_t *z, int r, const char *agent, const rg_etcd_range_t *nodes,
                        const rg_etcd_range_t *done)
{
    char nk[RDZV_KEY_MAX];
    char dk[RDZV_KEY_MAX];
    if (rdzv_keys_node(&z->keys, r, agent, nk, sizeof(nk)) != RG_OK ||
        rdzv_keys_done(&z->keys, r, agent, dk, sizeof(dk)) != RG_OK) {
        return false;
    }
    return !rdzv_range_has(nodes, nk) && !rdzv_range_has(done, dk);
}

/* This agent's fence for the round it runs (rdzv_fence.h). */
static rg_status_t agent_fence(const rg_rdzv_t *z, rdzv_fence_t *f)
{
    return rdzv_fence_init(f, &z->keys, z->cur.round, z->agent, z->lease);
}

/* The keys one look at round r reads (rg_rdzv_check). */
typedef struct {
    char round[RDZV_KEY_MAX];
    char fail[RDZV_KEY_MAX];
    char nodes[RDZV_KEY_MAX];
    char done[RDZV_KEY_MAX];
    char self_done[RDZV_KEY_MAX];
    char wait[RDZV_KEY_MAX];
    char leave[RDZV_KEY_MAX];
    char gone_node[RDZV_GONE_MAX][RDZV_KEY_MAX];
    char gone_done[RDZV_GONE_MAX][RDZV_KEY_MAX];
} check_keys_t;

enum { CK_ROUND, CK_FAIL, CK_NODES, CK_DONE_OR_NEW, CK_DONES, CK_SELF_DONE, CK_WAIT, CK_LEAVE,
       CK_N };
/* then, in a look that is not full, each member named gone: its node key, its done key */
#define CK_GONE(i, done) (CK_N + 2 * (i) + ((done) ? 1 : 0))

static rg_status_t check_keys(const rg_rdzv_t *z, int r, check_keys_t *k)
{
    /* In place, a failure marker only counts the restart (the agent that replaced its
     * worker opens the next round); a restart request ends the round for everyone. */
    rg_status_t st = rdzv_keys_round(&z->keys, k->round, sizeof(k->round));
    if (st == RG_OK) {
        st = z->p.in_place ? rdzv_keys_restart(&z->keys, k->fail, sizeof(k->fail))
                           : rdzv_keys_failures_round_prefix(&z->keys, r, k->fail,
                                                             sizeof(k->fail));
    }
    if (st == RG_OK) {
        st = rdzv_keys_nodes_prefix(&z->keys, r, k->nodes, sizeof(k->nodes));
    }
    if (st == RG_OK) {
        st = rdzv_keys_done_prefix(&z->keys, r, k->done, sizeof(k->done));
    }
    if (st == RG_OK) {
        st = rdzv_keys_done(&z->keys, r, z->agent, k->self_done, sizeof(k->self_done));
    }
    if (st == RG_OK) {
        st = rdzv_keys_waiting_prefix(&z->keys, k->wait, sizeof(k->wait));
    }
    if (st == RG_OK) {
        st = rdzv_keys_leaving_prefix(&z->keys, r, k->leave, sizeof(k->leave));
    }
    for (int i = 0; i < z->n_gone && i < RDZV_GONE_MAX && st == RG_OK; i++) {
        st = rdzv_keys_node(&z->keys, r, z->gone[i], k->gone_node[i], sizeof(k->gone_node[i]));
        if (st == RG_OK) {
            st = rdzv_keys_done(&z->keys, r, z->gone[i], k->gone_done[i],
                                sizeof(k->gone_done[i]));
        }
    }
    return st;
}

/*
 * One read of everything that can end round r. A full look lists the round's node and done
 * keys, to find which member is gone. Any other look, the once-a-second one when no event
 * came and the one after events, reads instead how many node keys there are and whether any
 * was written since the last full look (at most one key back), and the node and done keys
 * of the members whose node keys the watch saw deleted (z->gone): the count less those
 * deleted, and none written, means no other member went, so no full listing is needed.
 * That keeps each agent's look O(1) in the job's size, after a member is lost too; with the
 * node keys in every agent's look each second, etcd sent N² keys a second (7.5 MB a second
 * at 256 nodes, docs/benchmarks.md), and a full look by every agent after a loss N² once.
 */
static rg_status_t check_read(rg_rdzv_t *z, const check_keys_t *k, bool full,
                              rg_etcd_txn_t *t)
{
    rg_etcd_op_t ops[CK_N + 2 * RDZV_GONE_MAX] = {
        [CK_ROUND] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->round}},
        [CK_FAIL] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->fail,
                                                           .prefix = !z->p.in_place,
                                                           .count_only = !z->p.in_place}},
        [CK_NODES] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->nodes, .prefix = true,
                                                            .keys_only = full,
                                                            .count_only = !full}},
        [CK_DONE_OR_NEW] = full ? (rg_etcd_op_t){.type = RG_ETCD_OP_RANGE,
                                                 .u.range = {.key = k->done, .prefix = true,
                                                             .keys_only = true}}
                                : (rg_etcd_op_t){.type = RG_ETCD_OP_RANGE,
                                                 .u.range = {.key = k->nodes, .prefix = true,
                                                             .keys_only = true, .limit = 1,
                                                             .min_mod_revision =
                                                                 z->nodes_seen_rev + 1}},
        [CK_DONES] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->done, .prefix = true,
                                                            .count_only = true}},
        [CK_SELF_DONE] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->self_done,
                                                                .count_only = true}},
        [CK_WAIT] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->wait, .prefix = true,
                                                           .count_only = true}},
        /* not a change by itself: the launcher reads it through rdzv_leaving_seen */
        [CK_LEAVE] = {.type = RG_ETCD_OP_RANGE, .u.range = {.key = k->leave, .prefix = true}},
    };
    int n_ops = CK_N;
    for (int i = 0; !full && i < z->n_gone; i++) {
        ops[CK_GONE(i, false)] = (rg_etcd_op_t){.type = RG_ETCD_OP_RANGE,
                                                .u.range = {.key = k->gone_node[i],
                                                            .count_only = true}};
        ops[CK_GONE(i, true)] = (rg_etcd_op_t){.type = RG_ETCD_OP_RANGE,
                                               .u.range = {.key = k->gone_done[i],
                                                           .count_only = true}};
        n_ops += 2;
    }
    rg_status_t st = rg_etcd_txn(z->etcd, NULL, 0, ops, n_ops, NULL, 0, 0, t);
    if (st == RG_OK && full) {
        z->nodes_seen = t->results[CK_NODES].u.range.count;
        z->nodes_seen_rev = t->revision;
        z->n_full_looks++;
    }
    return st;
}

/* How many of the members named gone have no node key in a look that is not full. */
static int64_t gone_absent(const rg_rdzv_t *z, const rg_etcd_txn_t *t)
{
    int64_t n = 0;
    for (int i = 0; i < z->n_gone; i++) {
        n += t->results[CK_GONE(i, false)].u.range.count == 0;
    }
    return n;
}

/* Whether a look that is not full accounts for the round's node keys: as the last full look
 * saw them, less the members named gone whose keys are absent, and none written since. */
static bool nodes_accounted(const rg_rdzv_t *z, const rg_etcd_txn_t *t)
{
    return t->results[CK_NODES].u.range.count == z->nodes_seen - gone_absent(z, t) &&
           t->results[CK_DONE_OR_NEW].u.range.n_kvs == 0;
}

/* A member of round r gone without a done record, or NULL: from the listing of a full look,
 * else from the keys of the members named gone. */
static const char *member_gone(rg_rdzv_t *z, int r, const rg_etcd_txn_t *t, bool full)
{
    for (int i = 0; full && i < z->cur.n_members; i++) {
        if (member_lost(z, r, z->cur.members[i].agent, &t->results[CK_NODES].u.range,
                        &t->results[CK_DONE_OR_NEW].u.range)) {
            return z->cur.members[i].agent;
        }
    }
    for (int i = 0; !full && i < z->n_gone; i++) {
        if (rdzv_assignment_find(&z->cur, z->gone[i]) >= 0 &&
            t->results[CK_GONE(i, false)].u.range.count == 0 &&
            t->results[CK_GONE(i, true)].u.range.count == 0) {
            return z->gone[i];
        }
    }
    return NULL;
}

/* Whether every other member of the running round recorded done (done keys are members'
 * only: rg_rdzv_done and rdzv_round.c's member_done write them). */
static bool others_done(const rg_rdzv_t *z, const rg_etcd_txn_t *t)
{
    int64_t others = t->results[CK_DONES].u.range.count -
                     t->results[CK_SELF_DONE].u.range.count;
    return z->cur.n_members > 1 && others >= z->cur.n_members - 1;
}

rg_status_t rg_rdzv_check(rg_rdzv_t *z, rg_rdzv_change_t *change)
{
    check_keys_t k;
    rg_etcd_txn_t t;
    rg_status_t st;

    *change = RG_RDZV_NONE;
    if (z->keeper != NULL && rg_etcd_keeper_lost(z->keeper)) {
        *change = RG_RDZV_LEASE_LOST;
        return RG_OK;
    }
    if (z->running && z->member_watch_rev > 0) {
        rdzv_watch_round(z, z->cur.round, true, false, z->member_watch_rev);
        z->member_watch_rev = 0;
    }
    /* Events say when to look; a look at least every RDZV_VERIFY_MS bounds the damage of an
     * event that never arrives (one small read per second). What the events were decides
     * only what the look reads: a watch that ended may have lost some, so the next look
     * lists the round's keys. */
    bool events = rdzv_watch_drain(z);
    if (!events && !z->verify && rg_now_ns() - z->verified_ns < RDZV_VERIFY_MS * 1000000ull) {
        return RG_OK;
    }
    bool full = z->verify || z->watch_gap || z->n_gone > RDZV_GONE_MAX ||
                z->nodes_seen_rev == 0;   /* (no full look at this round yet) */
    z->verify = false;
    z->watch_gap = false;
    z->verified_ns = rg_now_ns();
    if (!z->running) {
        z->n_gone = 0;
        return RG_OK;
    }
    int r = z->cur.round;
    if (full) {
        z->n_gone = 0;   /* the listing covers them */
    }
    st = check_keys(z, r, &k);
    if (st != RG_OK) {
        return st;
    }
    z->n_quick_looks += !full;
    st = check_read(z, &k, full, &t);
    bool accounted = st == RG_OK && (full || nodes_accounted(z, &t));
    if (st == RG_OK && !accounted) {
        /* A node key went or came that no event named: look at which. */
        rg_etcd_txn_cleanup(&t);
        full = true;
        st = check_read(z, &k, true, &t);
    }
    if (st != RG_OK) {
        return st;
    }
    const char *gone = member_gone(z, r, &t, full);
    if (!full && z->n_gone > 0) {
        /* The keys are known again at this revision: the next looks count from it. */
        z->nodes_seen = t.results[CK_NODES].u.range.count;
        z->nodes_seen_rev = t.revision;
    }
    rdzv_leaving_note(z, &t.results[CK_LEAVE].u.range);
    const rg_etcd_range_t *round = &t.results[CK_ROUND].u.range;
    int64_t now_round = 0;
    const rg_etcd_range_t *rq = &t.results[CK_FAIL].u.range;
    int64_t restart_round = -1;
    if (z->p.in_place && rq->n_kvs == 1 &&
        rdzv_rec_round_decode(rq->kvs[0].value, rq->kvs[0].value_len, &restart_round) !=
            RG_OK) {
        restart_round = -1;
    }
    if (z->p.in_place && restart_round >= r) {
        *change = RG_RDZV_FAILURE;   /* a restart request outranks the round it opened */
    } else if (round->n_kvs == 1 &&
        rdzv_rec_round_decode(round->kvs[0].value, round->kvs[0].value_len, &now_round) ==
            RG_OK &&
        now_round > r) {
        /* A member gone is said even when another agent opened the round for it already: in
         * place a new round alone is a planned change, which waits for this node's workers
         * to be in the running round's group, and with a member gone that group never
         * forms (it waited out LAUNCHER_INPLACE_SETTLE_MS, then the job restarted). */
        if (gone != NULL) {
            rg_info("rendezvous: member %s of round %d is gone (round %lld is open)", gone, r,
                    (long long)now_round);
        }
        *change = gone != NULL ? RG_RDZV_MEMBER_LOST : RG_RDZV_NEW_ROUND;
    } else if (!z->p.in_place && rq->count > 0) {
        *change = RG_RDZV_FAILURE;
    } else {
        if (gone != NULL) {
            rg_info("rendezvous: member %s of round %d is gone", gone, r);
            *change = RG_RDZV_MEMBER_LOST;
        }
        if (*change == RG_RDZV_NONE && z->p.in_place && others_done(z, &t)) {
            /* In place, the others' workers can finish the job in the group before this
             * round, this node's workers waiting for them in this one: nothing ends the
             * round but this. (In restart mode this node's workers run on: they end on
             * their own, or fail without their peers.) */
            rg_info("rendezvous: every other member of round %d finished", r);
            *change = RG_RDZV_OTHERS_DONE;
        }
        if (*change == RG_RDZV_NONE && t.results[CK_WAIT].u.range.count > 0 &&
            z->cur.n_members < z->p.max_nodes) {
            *change = RG_RDZV_JOIN_PENDING;
        }
    }
    z->n_gone = 0;   /* this look read them */
    rg_etcd_txn_cleanup(&t);
    return RG_OK;
}

/* torchrun's error file: {"message": {"message": "...", "extraInfo": {...}}} or
 * {"message": "..."}; anything else is shown as it is. The result points into *doc_p or
 * into error; decref *doc_p after use. */
static const char *error_message(const char *error, json_t **doc_p)
{
    json_t *ej = error ? json_loads(error, 0, NULL) : NULL;
    json_t *em = json_object_get(ej, "message");
    const char *msg = json_string_value(em) ? json_string_value(em)
                      : json_string_value(json_object_get(em, "message"))
                          ? json_string_value(json_object_get(em, "message"))
                          : error;
    *doc_p = ej;
    return msg;
}

rg_status_t rg_rdzv_report_failure(rg_rdzv_t *z, const rg_rdzv_failure_t *f)
{
    char key[RDZV_KEY_MAX];
    json_t *doc;
    char *text;
    rg_status_t st;
    rdzv_failure_rec_t rec = {.round = z->cur.round, .rank = f->rank,
                              .local_rank = f->local_rank, .exit_code = f->exit_code,
                              .signal = f->signal, .time = rg_wall_s(),
                              .stderr_tail = f->stderr_tail};

    st = rdzv_keys_failure(&z->keys, z->cur.round, z->agent, key, sizeof(key));
    if (st != RG_OK) {
        return st;
    }
    memcpy(rec.agent, z->agent, sizeof(rec.agent));
    memcpy(rec.addr, z->addr, sizeof(rec.addr));
    rec.error = error_message(f->error, &doc);
    st = rdzv_rec_failure_encode(&rec, &text);
    json_decref(doc);
    if (st != RG_OK) {
        return st;
    }
    /* No lease: the record outlives this agent, for the job's failure report. Fenced: an
     * agent that is no longer a member (its lease ran out while it was stopped or cut off)
     * must not fail the round the others run now. */
    rdzv_fence_t fence;
    char what[64];
    snprintf(what, sizeof(what), "the failure marker of rank %d", f->rank);
    st = agent_fence(z, &fence);
    if (st == RG_OK) {
        st = rdzv_fence_put(z->etcd, &fence, key, text, 0, 0, what);
    }
    free(text);
    return st;
}

rg_status_t rg_rdzv_request_restart(rg_rdzv_t *z, const char *why)
{
    char key[RDZV_KEY_MAX];
    char val[RDZV_NUM_MAX];
    int latest = z->cur.round;
    rg_status_t st;

    rg_warn("rendezvous: asking every agent to restart the job: %s", why);
    /* Every worker of a round up to the newest one (which may be forming, agents joining it
     * in place) restarts; the job then goes on in the round after it, with fresh workers
     * only. No lease: the request outlives this agent. */
    z->running = false;
    st = rdzv_round_read(z, &latest);
    if (st != RG_OK) {
        return st;
    }
    latest = RG_MAX(latest, z->cur.round);
    st = rdzv_keys_restart(&z->keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(latest, val, sizeof(val));
    }
    if (st != RG_OK) {
        return st;
    }
    /* Fenced: only a member of the job's round (the one it runs, or the newer one it joins
     * in place) may restart the job. An agent whose lease ran out while it was cut off or
     * stopped is no longer one: the others went on without it, and its own failure is no
     * reason for them to restart (chaos' partition, in place: once back, the node cut off
     * restarted every survivor). */
    rdzv_fence_t fence;
    st = agent_fence(z, &fence);
    if (st == RG_OK) {
        st = rdzv_fence_put(z->etcd, &fence, key, val, 0, 0, "the request to restart the job");
    }
    if (st == RG_ELEASE && latest != z->cur.round &&
        rdzv_fence_init(&fence, &z->keys, latest, z->agent, z->lease) == RG_OK) {
        st = rdzv_fence_put(z->etcd, &fence, key, val, 0, 0, "the request to restart the job");
    }
    if (st == RG_OK) {
        st = rdzv_round_advance(z, latest);
    }
    return st;
}

rg_status_t rg_rdzv_restart_requested(rg_rdzv_t *z, int round, bool *yes)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    int64_t r;
    rg_status_t st = rdzv_keys_restart(&z->keys, key, sizeof(key));

    *yes = false;
    if (st == RG_OK) {
        st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    }
    if (st == RG_ENOENT) {
        return RG_OK;
    }
    if (st != RG_OK) {
        return st;
    }
    st = rdzv_rec_round_decode(v, len, &r);
    free(v);
    *yes = st == RG_OK && r >= round;
    return st;
}

void rg_rdzv_set_nproc(rg_rdzv_t *z, int nproc)
{
    z->p.nproc = RG_MAX(0, nproc);
}

void rg_rdzv_set_join_running(rg_rdzv_t *z, bool hold)
{
    z->hold_running = hold;
}

rg_status_t rg_rdzv_open_round_after(rg_rdzv_t *z, int round)
{
    return rdzv_round_advance(z, round);   /* as a waiting node does: no member's fence */
}

rg_status_t rg_rdzv_next_round(rg_rdzv_t *z)
{
    int r;
    rg_status_t st;

    z->running = false;
    st = rdzv_round_read(z, &r);
    if (st != RG_OK) {
        return st;
    }
    if (r > z->cur.round || z->last_round < 0) {
        return RG_OK;   /* someone already moved on, or this agent was in no round yet */
    }
    rdzv_fence_t fence;
    st = agent_fence(z, &fence);
    if (st != RG_OK) {
        return st;
    }
    st = rdzv_round_advance_fenced(z, r, &fence);
    if (st == RG_ELEASE) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", rg_last_error());
        int now = -1;
        if (rdzv_round_read(z, &now) == RG_OK && now > r) {
            /* Another agent moved the round on between the read and the move (the fence
             * compares the round too): what this call was for. */
            return RG_OK;
        }
        /* Not a member any more. If nobody is (every lease of the round ended at once: etcd
         * was out of reach of them all), the round is dead and someone must move on, or
         * every agent would find itself named by its closed record again and again. */
        bool moved = false;
        if (rdzv_round_advance_if_dead(z, r, &moved) == RG_OK && moved) {
            return RG_OK;
        }
        return rg_error(RG_ELEASE, "%s", msg);
    }
    return st;
}

rg_status_t rdzv_done_put(rg_rdzv_t *z, int r, bool fenced)
{
    char key[RDZV_KEY_MAX];
    char rec[64];
    rg_status_t st = rdzv_keys_done(&z->keys, r, z->agent, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_rec_done_encode(rg_wall_s(), rec, sizeof(rec));
    }
    if (st != RG_OK) {
        return st;
    }
    if (!fenced) {
        return rg_etcd_put_str(z->etcd, key, rec, 0, 0, NULL);
    }
    rdzv_fence_t fence;
    st = agent_fence(z, &fence);
    if (st != RG_OK) {
        return st;
    }
    return rdzv_fence_put(z->etcd, &fence, key, rec, 0, 0, "the done record");
}

rg_status_t rg_rdzv_done(rg_rdzv_t *z)
{
    return rdzv_done_put(z, z->cur.round, true);
}
