/*
 * Joining a round (include/regroup/rdzv.h, docs/etcd-keys.md): read the round, register in
 * it or wait to be let in, and let rdzv_close_txn.c close it when the close policy says so.
 * Each look reads the state afresh; events only say when to look.
 */
#include "rdzv_internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A port free now on addr, for MASTER_PORT (0 if none could be had: workers then pick). */
static int free_port(const char *addr)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port = 0;

    if (fd < 0) {
        return 0;
    }
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        port = ntohs(sa.sin_port);
    }
    close(fd);
    return port;
}

/* Whether the job's keys follow this build's layout (RDZV_LAYOUT): `layout` says which, and
 * a job with `round` but no `layout` was started by a regroup from before the key. */
static rg_status_t layout_check(rg_rdzv_t *z, const char *round_key, const char *layout_key)
{
    rg_etcd_op_t ops[2] = {
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = round_key, .keys_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = layout_key}},
    };
    rg_etcd_txn_t t;
    rg_status_t st = rg_etcd_txn(z->etcd, NULL, 0, ops, 2, NULL, 0, 0, &t);
    if (st != RG_OK) {
        return st;
    }
    const rg_etcd_range_t *round = &t.results[0].u.range;
    const rg_etcd_range_t *layout = &t.results[1].u.range;
    char have[16];
    const rg_etcd_kv_t *kv = layout->n_kvs == 1 ? &layout->kvs[0] : NULL;
    bool ours = rdzv_rec_layout_decode(kv ? kv->value : NULL, kv ? kv->value_len : 0, have,
                                       sizeof(have)) ||
                (round->n_kvs == 0 && kv == NULL);   /* a new job: ours to lay out */
    rg_etcd_txn_cleanup(&t);
    z->layout = ours ? RDZV_LAYOUT_OURS : RDZV_LAYOUT_OTHER;
    if (!ours) {
        return rg_error(RG_EPROTO, "rendezvous: job %s: its keys in etcd (under %s) follow "
                        "layout %s%s, and this regroup reads layout %s "
                        "(docs/etcd-keys.md): let the job end with the regroup that "
                        "started it, or run this one under another --rdzv-id", z->job,
                        rdzv_keys_prefix(&z->keys), have,
                        strcmp(have, "1") == 0 ? " (a regroup from before the layout key)"
                                               : "",
                        RDZV_LAYOUT);
    }
    return RG_OK;
}

rg_status_t rdzv_round_read(rg_rdzv_t *z, int *round_p)
{
    char key[RDZV_KEY_MAX];
    char layout_key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    int64_t r;
    rg_status_t st;

    st = rdzv_keys_round(&z->keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_keys_layout(&z->keys, layout_key, sizeof(layout_key));
    }
    if (st == RG_OK && z->layout != RDZV_LAYOUT_OURS) {
        st = layout_check(z, key, layout_key);
    }
    if (st != RG_OK) {
        return st;
    }
    st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    if (st == RG_ENOENT) {
        /* First agent of the job: create round 0 if nobody did in between, and say which
         * layout the job's keys follow. */
        rg_etcd_cmp_t c = {.key = key, .target = RG_ETCD_CMP_CREATE, .result = RG_ETCD_EQUAL};
        rg_etcd_op_t op[2] = {
            {.type = RG_ETCD_OP_PUT, .u.put = {.key = key, .value = "0", .value_len = 1}},
            {.type = RG_ETCD_OP_PUT, .u.put = {.key = layout_key, .value = RDZV_LAYOUT,
                                               .value_len = strlen(RDZV_LAYOUT)}},
        };
        rg_etcd_txn_t t;
        st = rg_etcd_txn(z->etcd, &c, 1, op, 2, NULL, 0, 0, &t);
        if (st != RG_OK) {
            return st;
        }
        rg_etcd_txn_cleanup(&t);
        st = rg_etcd_get(z->etcd, key, 0, &v, &len, NULL);
    }
    if (st != RG_OK) {
        return st;
    }
    st = rdzv_rec_round_decode(v, len, &r);
    free(v);
    if (st != RG_OK) {
        return rg_error_wrap(st, "rendezvous: %s", key);
    }
    *round_p = (int)r;
    return RG_OK;
}

rg_status_t rdzv_round_advance_fenced(rg_rdzv_t *z, int r, const rdzv_fence_t *fence)
{
    char key[RDZV_KEY_MAX];
    char cur[RDZV_NUM_MAX];
    char next[RDZV_NUM_MAX];
    rg_etcd_txn_t t;
    rg_status_t st;

    st = rdzv_keys_round(&z->keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(r, cur, sizeof(cur));
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(r + 1, next, sizeof(next));
    }
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                       .u.put = {.key = key, .value = next, .value_len = strlen(next)}};
    if (fence != NULL && fence->on) {
        /* The member's move: the fence compares `round` with its round already. */
        if (fence->round != r) {
            return RG_OK;   /* the job left the member's round: nothing to move */
        }
        char what[64];
        snprintf(what, sizeof(what), "opening round %d", r + 1);
        st = rdzv_fence_txn(z->etcd, fence, &op, 1, 0, what, NULL);
        if (st == RG_OK) {
            rg_info("rendezvous: opened round %d", r + 1);
        }
        return st;
    }
    rg_etcd_cmp_t c = {.key = key, .target = RG_ETCD_CMP_VALUE, .result = RG_ETCD_EQUAL,
                       .value = cur, .value_len = strlen(cur)};
    st = rg_etcd_txn(z->etcd, &c, 1, &op, 1, NULL, 0, 0, &t);
    if (st == RG_OK) {
        if (t.succeeded) {
            rg_info("rendezvous: opened round %d", r + 1);
        }
        rg_etcd_txn_cleanup(&t);
    }
    return st;
}

rg_status_t rdzv_round_advance_if_dead(rg_rdzv_t *z, int r, bool *moved)
{
    char key[RDZV_KEY_MAX];
    char nodes[RDZV_KEY_MAX];
    char cur[RDZV_NUM_MAX];
    char next[RDZV_NUM_MAX];
    char *nodes_end;
    size_t end_len;
    rg_etcd_txn_t t;
    rg_status_t st;

    *moved = false;
    st = rdzv_keys_round(&z->keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_keys_nodes_prefix(&z->keys, r, nodes, sizeof(nodes));
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(r, cur, sizeof(cur));
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_encode(r + 1, next, sizeof(next));
    }
    if (st != RG_OK) {
        return st;
    }
    nodes_end = etcd_prefix_end(nodes, &end_len);
    if (nodes_end == NULL) {
        return rg_error(RG_ENOMEM, "rendezvous: range end");
    }
    /* A compare on a range holds for every key in it, and for none: no key under nodes/. */
    rg_etcd_cmp_t c[2] = {
        {.key = key, .target = RG_ETCD_CMP_VALUE, .result = RG_ETCD_EQUAL, .value = cur,
         .value_len = strlen(cur)},
        {.key = nodes, .range_end = nodes_end, .target = RG_ETCD_CMP_CREATE,
         .result = RG_ETCD_EQUAL, .number = 0},
    };
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                       .u.put = {.key = key, .value = next, .value_len = strlen(next)}};
    st = rg_etcd_txn(z->etcd, c, 2, &op, 1, NULL, 0, 0, &t);
    free(nodes_end);
    if (st == RG_OK) {
        *moved = t.succeeded;
        if (t.succeeded) {
            rg_info("rendezvous: opened round %d (no member of round %d is left)", r + 1, r);
        }
        rg_etcd_txn_cleanup(&t);
    }
    return st;
}

rg_status_t rdzv_round_advance(rg_rdzv_t *z, int r)
{
    return rdzv_round_advance_fenced(z, r, NULL);
}

/* ---- registering ------------------------------------------------------------------------ */

/* Registers in round r, leaving the waiting list in the same step (never seen in neither),
 * and becomes the round's closer if it has none yet: the first to register closes the round,
 * and only it lists the round's nodes while the round forms (rdzv_keys.h). */
static rg_status_t register_node(rg_rdzv_t *z, int r)
{
    char key[RDZV_KEY_MAX];
    char wkey[RDZV_KEY_MAX];
    char ckey[RDZV_KEY_MAX];
    char *text;
    rg_etcd_txn_t t;
    rg_status_t st;
    rdzv_node_rec_t d = {.nproc = z->p.nproc, .port = free_port(z->addr),
                         .prev_round = z->last_round, .prev_rank = z->last_rank};

    memcpy(d.agent, z->agent, sizeof(d.agent));
    memcpy(d.addr, z->addr, sizeof(d.addr));
    st = rdzv_keys_node(&z->keys, r, z->agent, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_keys_waiting(&z->keys, z->agent, wkey, sizeof(wkey));
    }
    if (st == RG_OK) {
        st = rdzv_keys_closer(&z->keys, r, ckey, sizeof(ckey));
    }
    if (st == RG_OK) {
        st = rdzv_rec_node_encode(&d, &text);
    }
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_cmp_t c = {.key = ckey, .target = RG_ETCD_CMP_CREATE, .result = RG_ETCD_EQUAL};
    rg_etcd_op_t ops[3] = {
        {.type = RG_ETCD_OP_PUT, .u.put = {.key = key, .value = text, .value_len = strlen(text),
                                           .lease = z->lease}},
        {.type = RG_ETCD_OP_DELETE, .u.del = {.key = wkey}},
        {.type = RG_ETCD_OP_PUT, .u.put = {.key = ckey, .value = z->agent,
                                           .value_len = strlen(z->agent), .lease = z->lease}},
    };
    st = rg_etcd_txn(z->etcd, &c, 1, ops, 3, ops, 2, 0, &t);
    free(text);
    if (st != RG_OK) {
        return rg_error_wrap(st, "rendezvous: registering in round %d", r);
    }
    z->registered_round = r;
    z->closer_round = t.succeeded ? r : -1;
    z->waiting = false;
    rg_etcd_txn_cleanup(&t);
    rg_info("rendezvous: joined round %d%s", r, z->closer_round == r ? " (its closer)" : "");
    return RG_OK;
}

/* Whether this agent closes round r: it registered in it and holds its closer key. */
static bool closes(const rg_rdzv_t *z, int r)
{
    return z->registered_round == r && z->closer_round == r;
}

/* Round r has no closer (the first to register lost its lease): this registered agent takes
 * over, if it is still registered and nobody else did first. */
static rg_status_t take_closer(rg_rdzv_t *z, int r)
{
    char key[RDZV_KEY_MAX];
    char ckey[RDZV_KEY_MAX];
    rg_etcd_txn_t t;
    rg_status_t st = rdzv_keys_node(&z->keys, r, z->agent, key, sizeof(key));

    if (st == RG_OK) {
        st = rdzv_keys_closer(&z->keys, r, ckey, sizeof(ckey));
    }
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_cmp_t c[2] = {
        {.key = ckey, .target = RG_ETCD_CMP_CREATE, .result = RG_ETCD_EQUAL},
        {.key = key, .target = RG_ETCD_CMP_CREATE, .result = RG_ETCD_GREATER, .number = 0},
    };
    rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                       .u.put = {.key = ckey, .value = z->agent, .value_len = strlen(z->agent),
                                 .lease = z->lease}};
    st = rg_etcd_txn(z->etcd, c, 2, &op, 1, NULL, 0, 0, &t);
    if (st != RG_OK) {
        return st;
    }
    if (t.succeeded) {
        z->closer_round = r;
        rg_info("rendezvous: round %d lost its closer; this agent closes it", r);
    }
    rg_etcd_txn_cleanup(&t);
    return RG_OK;
}

/* How many node keys round r has (one count, not the keys). */
static rg_status_t nodes_count(rg_rdzv_t *z, int r, int *n)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t res;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true, .count_only = true};
    rg_status_t st = rdzv_keys_nodes_prefix(&z->keys, r, key, sizeof(key));

    if (st == RG_OK) {
        st = rg_etcd_range(z->etcd, &rq, 0, &res);
    }
    if (st == RG_OK) {
        *n = (int)RG_MIN(res.count, (int64_t)INT32_MAX);
        rg_etcd_range_cleanup(&res);
    }
    return st;
}

static rg_status_t register_waiting(rg_rdzv_t *z)
{
    char key[RDZV_KEY_MAX];
    char *val;
    rg_rdzv_member_t m = {.nproc = z->p.nproc};
    rg_status_t st;

    if (z->waiting) {
        return RG_OK;
    }
    memcpy(m.agent, z->agent, sizeof(m.agent));
    memcpy(m.addr, z->addr, sizeof(m.addr));
    st = rdzv_keys_waiting(&z->keys, z->agent, key, sizeof(key));
    if (st == RG_OK) {
        st = rdzv_rec_waiting_encode(&m, &val);
    }
    if (st != RG_OK) {
        return st;
    }
    st = rg_etcd_put_str(z->etcd, key, val, z->lease, 0, NULL);
    free(val);
    if (st == RG_OK) {
        z->waiting = true;
        rg_info("rendezvous: the job runs without this node; waiting to join");
    }
    return st;
}

/* ---- joining ---------------------------------------------------------------------------- */

/* True if every member of closed round r recorded that its workers finished, this agent
 * aside (it asks because it is not done: in place, the others' workers can finish the job in
 * the group before round r, while this node's newcomers wait to join them in it). At least
 * one other member must have finished: a round of this agent alone says nothing. */
static bool round_done(rg_rdzv_t *z, int r, const rg_rdzv_assignment_t *a)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t res;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true, .keys_only = true};
    bool all = true;
    int others = 0;
    int self = rdzv_assignment_find(a, z->agent);

    if (rdzv_keys_done_prefix(&z->keys, r, key, sizeof(key)) != RG_OK ||
        rg_etcd_range(z->etcd, &rq, 0, &res) != RG_OK) {
        return false;
    }
    for (int i = 0; i < a->n_members && all; i++) {
        char dk[RDZV_KEY_MAX];
        if (i == self) {
            continue;
        }
        others++;
        all = rdzv_keys_done(&z->keys, r, a->members[i].agent, dk, sizeof(dk)) == RG_OK &&
              rdzv_range_has(&res, dk);
    }
    rg_etcd_range_cleanup(&res);
    return all && others > 0;
}

/* The job ended without this member of round r's workers: its own done record, so that the
 * round reads as done to an agent that asks later (a latecomer, which counts every member). */
static void member_done(rg_rdzv_t *z, int r, const rg_rdzv_assignment_t *a)
{
    if (rdzv_assignment_find(a, z->agent) >= 0 && rdzv_done_put(z, r, false) != RG_OK) {
        rg_warn("rendezvous: cannot record that the job ended for this member of round %d "
                "(%s)", r, rg_last_error());
    }
}

/* True if round r-1 closed and every member of it finished, with that round in *out. An agent
 * can open round r after it (it asked for a restart while the others' workers were
 * finishing): the job is over all the same, and a join of round r must not wait for members
 * that are gone. */
static bool prev_round_done(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *out)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t res;
    rg_etcd_range_req_t rq = {.key = key};
    bool done = false;

    if (r <= 0 || rdzv_keys_closed(&z->keys, r - 1, key, sizeof(key)) != RG_OK ||
        rg_etcd_range(z->etcd, &rq, 0, &res) != RG_OK) {
        return false;
    }
    rg_rdzv_assignment_t *a = res.n_kvs == 1 ? malloc(sizeof(*a)) : NULL;
    if (a != NULL &&
        rdzv_rec_closed_decode(res.kvs[0].value, res.kvs[0].value_len, r - 1, a) == RG_OK) {
        done = round_done(z, r - 1, a);
    }
    if (done) {
        member_done(z, r - 1, a);
        *out = *a;
        rdzv_assignment_locate(out, z->agent);
        out->job_done = true;
    }
    free(a);
    rg_etcd_range_cleanup(&res);
    return done;
}

/* In place (hold_running), before this agent registers in the open round r: whether the
 * job runs without it in round r - 1, which into *out. That round closed, live members of it
 * form round r in place (a loss, a planned change) and this agent is not one of them (new,
 * or one that left: its node key there is gone), and no restart was asked for it. Joining r
 * with fresh workers would mix them with survivors that regroup with their state, and the
 * job would restart: its workers must start as newcomers instead, as when the running round
 * is the newest. */
static rg_status_t runs_without_us(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *out, bool *yes)
{
    char closed_key[RDZV_KEY_MAX];
    char nodes_key[RDZV_KEY_MAX];
    char own_key[RDZV_KEY_MAX];
    rg_etcd_txn_t t;
    rg_status_t st;

    *yes = false;
    if (!z->hold_running || r <= 0) {
        return RG_OK;
    }
    st = rdzv_keys_closed(&z->keys, r - 1, closed_key, sizeof(closed_key));
    if (st == RG_OK) {
        st = rdzv_keys_nodes_prefix(&z->keys, r - 1, nodes_key, sizeof(nodes_key));
    }
    if (st == RG_OK) {
        st = rdzv_keys_node(&z->keys, r - 1, z->agent, own_key, sizeof(own_key));
    }
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_op_t ops[3] = {
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = closed_key}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = nodes_key, .prefix = true,
                                               .count_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = own_key, .count_only = true}},
    };
    st = rg_etcd_txn(z->etcd, NULL, 0, ops, 3, NULL, 0, 0, &t);
    if (st != RG_OK) {
        return st;
    }
    const rg_etcd_range_t *closed = &t.results[0].u.range;
    bool candidate = closed->n_kvs == 1 && t.results[1].u.range.count > 0 &&
                     t.results[2].u.range.count == 0;
    rg_rdzv_assignment_t *a = candidate ? malloc(sizeof(*a)) : NULL;
    if (candidate && a == NULL) {
        st = rg_error(RG_ENOMEM, "rendezvous: an assignment");
    } else if (candidate) {
        st = rdzv_rec_closed_decode(closed->kvs[0].value, closed->kvs[0].value_len, r - 1, a);
    }
    rg_etcd_txn_cleanup(&t);
    bool asked = false;
    if (st == RG_OK && a != NULL && !a->job_failed) {
        st = rg_rdzv_restart_requested(z, r - 1, &asked);
        if (st == RG_OK && !asked) {
            *out = *a;   /* (group_rank -1, as decoded: this agent is no live member) */
            *yes = true;
        }
    }
    free(a);
    return st;
}

/* One look at round r: returns RG_OK with *done set when a round including us closed. The
 * look reads the round's own records (closed, closer, done/, leaving/), and its node keys
 * only for the closer: an agent waiting for the close reads O(1) keys however large the
 * job. */
static rg_status_t join_step(rg_rdzv_t *z, int r, rg_rdzv_assignment_t *out, bool *done,
                             uint64_t *wake_ns)
{
    rdzv_range_t own;
    char closed_key[RDZV_KEY_MAX];
    char closer_key[RDZV_KEY_MAX];
    char nodes_key[RDZV_KEY_MAX];
    char prev_done[RDZV_KEY_MAX];
    rg_etcd_txn_t t;
    bool closer = closes(z, r);
    int n = -1;   /* node keys of round r: listed by the closer, else counted when needed */
    bool closed = false;
    bool has_closer = false;
    rg_status_t st;

    *done = false;
    st = rdzv_keys_watch_round(&z->keys, r, false, &own);
    if (st == RG_OK) {
        st = rdzv_keys_closed(&z->keys, r, closed_key, sizeof(closed_key));
    }
    if (st == RG_OK) {
        st = rdzv_keys_closer(&z->keys, r, closer_key, sizeof(closer_key));
    }
    if (st == RG_OK) {
        st = rdzv_keys_nodes_prefix(&z->keys, r, nodes_key, sizeof(nodes_key));
    }
    if (st == RG_OK) {
        st = rdzv_keys_done_prefix(&z->keys, RG_MAX(r - 1, 0), prev_done, sizeof(prev_done));
    }
    if (st != RG_OK) {
        return st;
    }
    rg_etcd_op_t ops[3] = {
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = own.key, .range_end = own.end}},
        /* whether any member of round r - 1 finished (then prev_round_done reads more) */
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = prev_done, .prefix = true,
                                               .count_only = true}},
        {.type = RG_ETCD_OP_RANGE, .u.range = {.key = nodes_key, .prefix = true}},
    };
    st = rg_etcd_txn(z->etcd, NULL, 0, ops, closer ? 3 : 2, NULL, 0, 0, &t);
    if (st != RG_OK) {
        return st;
    }
    const rg_etcd_range_t *res = &t.results[0].u.range;
    for (size_t i = 0; i < res->n_kvs && st == RG_OK; i++) {
        const rg_etcd_kv_t *kv = &res->kvs[i];
        if (strcmp(kv->key, closed_key) == 0) {
            st = rdzv_rec_closed_decode(kv->value, kv->value_len, r, out);
            closed = true;
        } else if (strcmp(kv->key, closer_key) == 0) {
            has_closer = true;
        }
    }
    bool prev_finished = r > 0 && t.results[1].u.range.count > 0;
    if (closer) {
        n = 0;
        res = &t.results[2].u.range;
        for (size_t i = 0; i < res->n_kvs && n < RDZV_LIST_MAX; i++) {
            const rg_etcd_kv_t *kv = &res->kvs[i];
            /* A descriptor that does not decode is no node of ours: leave it out. */
            if (rdzv_keys_tail(kv->key, nodes_key) != NULL &&
                rdzv_rec_node_decode(kv->value, kv->value_len, &z->nodes[n]) == RG_OK) {
                z->nodes[n++].create_rev = kv->create_revision;
            }
        }
    }
    int64_t rev = t.revision;
    z->look_rev = rev;
    rg_etcd_txn_cleanup(&t);
    if (st != RG_OK) {
        return st;
    }
    if (closed) {
        rdzv_assignment_locate(out, z->agent);
        if (out->job_failed) {
            *done = true;
            return RG_OK;
        }
        /* A round whose every other member finished: the job is over, without us. So too for
         * a member that ran this round already (a lost lease sent it back to join it), and
         * in place for any member (the others can finish only in a group before this
         * round's, which this agent's workers were not in). A member of a restart-mode round
         * it has not run yet runs it: its peers' workers can finish before its own start
         * (workers that need no peer), and that ends nothing for this node. */
        bool over_for_members = z->p.in_place || z->last_round >= r;
        if ((out->group_rank < 0 || over_for_members) && round_done(z, r, out)) {
            member_done(z, r, out);
            out->job_done = true;
            *done = true;
            return RG_OK;
        }
        if (out->group_rank >= 0) {
            *done = true;
            return RG_OK;
        }
        /* The round runs without us: wait to be let in. Below max size, open the next round
         * ourselves too (after registering, so that the closer expects us), rather than
         * depend on the running agents noticing the waiting key. So too when none of its
         * members' descriptors is left (their leases were revoked or expired, and no member
         * finished): nobody is running it to let us in (a whole job preempted, then started
         * again under the same job id). An in-place agent (hold_running) starts its workers
         * as newcomers first, at the maximum size too: they wait there for room. */
        if (n < 0) {
            st = nodes_count(z, r, &n);
            if (st != RG_OK) {
                return st;
            }
        }
        if (z->hold_running && n > 0) {
            return rg_error(RG_EAGAIN, "rendezvous: round %d of job %s runs without this node",
                            r, z->job);   /* rg_rdzv_set_join_running */
        }
        st = register_waiting(z);
        if (st == RG_OK && (out->n_members < z->p.max_nodes || n == 0)) {
            st = rdzv_round_advance(z, r);
            *wake_ns = rg_now_ns();
        }
        return st;
    }
    if (prev_finished && prev_round_done(z, r, out)) {
        rg_info("rendezvous: the other members of round %d finished: the job is over", r - 1);
        *done = true;
        return RG_OK;
    }
    if (z->registered_round != r && !prev_finished) {
        bool without = false;
        st = runs_without_us(z, r, out, &without);
        if (st != RG_OK) {
            return st;
        }
        if (without) {
            return rg_error(RG_EAGAIN, "rendezvous: round %d of job %s runs without this node "
                            "(its members form round %d)", r - 1, z->job, r);
        }
    }
    if (z->registered_round != r) {
        st = register_node(z, r);
        if (st != RG_OK) {
            return st;
        }
        *wake_ns = rg_now_ns();   /* look again, with us in it */
        return RG_OK;
    }
    if (!closer) {
        /* The closer's lease went with it (its key is leased): the next to look takes over. */
        if (!has_closer) {
            st = take_closer(z, r);
            if (st == RG_OK && z->closer_round == r) {
                *wake_ns = rg_now_ns();
            }
        }
        return st;
    }
    return rdzv_round_try_close(z, r, n, rev, wake_ns);
}

/* The join deadline passed: say how far round r got. */
static rg_status_t join_timed_out(rg_rdzv_t *z, int r)
{
    int n = 0;

    (void)nodes_count(z, r, &n);   /* 0 if etcd cannot say: the timeout is the error */
    return rg_error(RG_ETIMEDOUT, "rendezvous: round %d of job %s did not close within the join "
                    "timeout (%lld ms): %d of min %d nodes joined%s", r, z->job,
                    (long long)z->p.join_timeout_ms, n, z->p.min_nodes,
                    z->waiting ? " (this node was waiting)" : "");
}

rg_status_t rg_rdzv_join(rg_rdzv_t *z, int cancel_fd, rg_rdzv_assignment_t *out)
{
    rg_deadline_t deadline = rg_deadline_in_ms(z->p.join_timeout_ms);
    int r = -1;
    rg_status_t st;

    if (out == NULL) {
        return rg_error(RG_EINVAL, "rendezvous join: NULL out");
    }
    z->running = false;
    /* min_reached_ns is reset below when the round changes: an agent that comes back to
     * the same round (an in-place agent's join, interrupted to look after its workers) keeps
     * its last-call window. */
    st = rdzv_lease_renew_if_lost(z, deadline);
    if (st != RG_OK) {
        return st;
    }
    for (;;) {
        uint64_t wake_ns = 0;
        bool done = false;

        st = rdzv_round_read(z, &r);
        if (st == RG_OK) {
            if (r != z->round) {
                z->min_reached_ns = 0;
            }
            z->round = r;
            st = join_step(z, r, out, &done, &wake_ns);
        }
        if (st == RG_OK && done) {
            break;
        }
        if (st == RG_OK && (wake_ns == 0 || wake_ns > rg_now_ns() + RDZV_WATCH_AHEAD_NS)) {
            /* What to be woken by until the next look: the round's close, and its nodes for
             * its closer (from just after this look, so that nothing falls between). Made
             * only before a wait: a watch takes a round trip to make, and a look due at once
             * (just registered, just closed) goes first. */
            rdzv_watch_round(z, r, closes(z, r), closes(z, r), z->look_rev + 1);
        }
        if (st == RG_EAGAIN) {
            return st;   /* the running round in *out (rg_rdzv_set_join_running) */
        }
        if (z->layout == RDZV_LAYOUT_OTHER) {
            return st;   /* a job of another layout (layout_check): waiting changes nothing */
        }
        if (st != RG_OK) {
            /* etcd trouble is retried until the join deadline; say it once per failure. */
            rg_warn("rendezvous: %s; retrying", rg_last_error());
            wake_ns = rg_now_ns() + RDZV_RETRY_MS * 1000000ull;
        }
        if (rg_deadline_passed(deadline)) {
            return join_timed_out(z, r);
        }
        /* Sleep until an event, the cancel fd, the last-call time or the deadline. */
        uint64_t until = wake_ns ? RG_MIN(wake_ns, deadline) : deadline;
        until = RG_MIN(until, rg_now_ns() + RDZV_VERIFY_MS * 1000000ull);
        int64_t ms = until > rg_now_ns() ? (int64_t)((until - rg_now_ns() + 999999) / 1000000) : 0;
        struct pollfd pfd[2] = {{.fd = z->epfd, .events = POLLIN},
                                {.fd = cancel_fd, .events = POLLIN}};
        if (ms > 0 && poll(pfd, cancel_fd >= 0 ? 2 : 1, (int)RG_MIN(ms, 60000)) > 0 &&
            cancel_fd >= 0 && (pfd[1].revents & POLLIN)) {
            return rg_error(RG_ECANCELED, "rendezvous: join interrupted");
        }
        rdzv_watch_drain(z);
        if (z->keeper != NULL) {
            st = rdzv_lease_renew_if_lost(z, deadline);
            if (st != RG_OK) {
                return st;
            }
        }
    }
    if (!out->job_failed && !out->job_done) {
        z->running = true;
        z->cur = *out;
        z->last_round = out->round;
        z->last_rank = out->group_rank;
        /* A member watches its round's nodes/ (a member lost is a key deleted), not the
         * round before it, from the look that found the round closed: the first check
         * makes that watch, so that the agent starts its workers first. */
        z->member_watch_rev = z->look_rev + 1;
        z->verify = true;   /* events drained while joining may concern this round */
        z->nodes_seen_rev = 0;   /* and its first look lists its nodes */
        z->n_leaving = 0;   /* the last round's leaving members are not this one's */
    }
    return RG_OK;
}
