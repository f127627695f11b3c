/* `regroup status`: the job's state as etcd holds it, for people. */
#include "etcd_internal.h"
#include "rdzv_keys.h"

#include <regroup/rdzv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_progress(rg_etcd_t *c, const rdzv_keys_t *keys, FILE *out)
{
    char key[RDZV_KEY_MAX];
    rg_etcd_range_t r;
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};

    if (rdzv_keys_progress_prefix(keys, key, sizeof(key)) != RG_OK ||
        rg_etcd_range(c, &rq, 0, &r) != RG_OK) {
        return;
    }
    if (r.n_kvs > 0) {
        fprintf(out, "progress (last report of each rank):\n");
    }
    for (size_t i = 0; i < r.n_kvs; i++) {
        const char *rank = rdzv_keys_tail(r.kvs[i].key, key);
        fprintf(out, "  rank %-4s %s\n", rank ? rank : "?", r.kvs[i].value);
    }
    rg_etcd_range_cleanup(&r);
}

/* The newest closed round from `round` back: its members and ranks. */
static void print_members(rg_etcd_t *c, const rdzv_keys_t *keys, int64_t round, FILE *out)
{
    char key[RDZV_KEY_MAX];
    char *v;
    size_t len;
    rg_rdzv_assignment_t *a = malloc(sizeof(*a));

    if (a == NULL) {
        return;
    }
    for (int64_t r = round; r >= 0 && r >= round - 16; r--) {
        if (rdzv_keys_closed(keys, r, key, sizeof(key)) != RG_OK ||
            rg_etcd_get(c, key, 0, &v, &len, NULL) != RG_OK) {
            continue;
        }
        rg_status_t st = rdzv_rec_closed_decode(v, len, r, a);
        free(v);
        if (st != RG_OK) {
            fprintf(out, "state:   unknown (%s)\n", rg_last_error());
            break;
        }
        fprintf(out, "state:   %s\n", a->job_failed ? "failed"
                                      : r == round ? "running" : "regrouping");
        fprintf(out, "running round %lld: %d nodes, world size %d, restarts %d, master %s:%d\n",
                (long long)r, a->n_members, a->world_size, a->restart_count,
                a->master_addr[0] ? a->master_addr : "?", a->master_port);
        fprintf(out, "members:\n  %-10s %-8s %-20s %s\n", "node rank", "ranks", "host", "agent");
        int offset = 0;
        for (int i = 0; i < a->n_members; i++) {
            const rg_rdzv_member_t *m = &a->members[i];
            char ranks[32];
            snprintf(ranks, sizeof(ranks), "%d-%d", offset, offset + m->nproc - 1);
            fprintf(out, "  %-10d %-8s %-20s %s\n", i, ranks, m->addr, m->agent);
            offset += m->nproc;
        }
        break;
    }
    free(a);
}

rg_status_t rg_rdzv_status_print(const rg_etcd_params_t *params, const char *job, FILE *out)
{
    rdzv_keys_t keys;
    char key[RDZV_KEY_MAX];
    rg_etcd_t *c;
    char *v = NULL;
    size_t len;
    int64_t round = -1;
    rg_status_t st;

    st = rdzv_keys_init(&keys, job);
    if (st != RG_OK) {
        return st;
    }
    st = rg_etcd_create(params, &c);
    if (st != RG_OK) {
        return st;
    }
    st = rdzv_keys_round(&keys, key, sizeof(key));
    if (st == RG_OK) {
        st = rg_etcd_get(c, key, 0, &v, &len, NULL);
    }
    if (st == RG_ENOENT) {
        fprintf(out, "job %s: no such job in etcd (%s)\n", job, rg_etcd_endpoint(c));
        rg_etcd_destroy(c);
        return RG_ENOENT;
    }
    if (st == RG_OK) {
        st = rdzv_rec_round_decode(v, len, &round);
        free(v);
    }
    if (st != RG_OK) {
        rg_etcd_destroy(c);
        return rg_error_wrap(st, "status");
    }
    fprintf(out, "job:     %s\nround:   %lld\n", job, (long long)round);
    print_members(c, &keys, round, out);

    if (rdzv_keys_waiting_prefix(&keys, key, sizeof(key)) == RG_OK) {
        rg_etcd_range_req_t wq = {.key = key, .prefix = true, .keys_only = true};
        rg_etcd_range_t w;
        if (rg_etcd_range(c, &wq, 0, &w) == RG_OK) {
            fprintf(out, "waiting: %zu node(s)\n", w.n_kvs);
            for (size_t i = 0; i < w.n_kvs; i++) {
                const char *agent = rdzv_keys_tail(w.kvs[i].key, key);
                fprintf(out, "  %s\n", agent ? agent : "?");
            }
            rg_etcd_range_cleanup(&w);
        }
    }
    if (rdzv_keys_failures_prefix(&keys, key, sizeof(key)) == RG_OK) {
        rg_etcd_range_req_t fq = {.key = key, .prefix = true, .count_only = true};
        rg_etcd_range_t f;
        if (rg_etcd_range(c, &fq, 0, &f) == RG_OK) {
            fprintf(out, "worker failures recorded: %lld\n", (long long)f.count);
            rg_etcd_range_cleanup(&f);
        }
    }
    int64_t step = -1;
    if (rdzv_keys_ckpt_latest(&keys, key, sizeof(key)) == RG_OK &&
        rg_etcd_get(c, key, 0, &v, &len, NULL) == RG_OK) {
        if (rdzv_rec_ckpt_latest_decode(v, len, &step) != RG_OK) {
            step = -1;
        }
        free(v);
    }
    if (step >= 0) {
        fprintf(out, "last committed checkpoint: %lld\n", (long long)step);
    } else {
        fprintf(out, "last committed checkpoint: none\n");
    }
    print_progress(c, &keys, out);
    rg_etcd_destroy(c);
    return RG_OK;
}
