/* `regroup status`: the job's state as etcd holds it, for people. */
#include "etcd_internal.h"

#include <regroup/rdzv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_progress(rg_etcd_t *c, const char *prefix, FILE *out)
{
    char key[512];
    rg_etcd_range_t r;
    snprintf(key, sizeof(key), "%sstatus/progress/", prefix);
    rg_etcd_range_req_t rq = {.key = key, .prefix = true};
    if (rg_etcd_range(c, &rq, 0, &r) != RG_OK) {
        return;
    }
    if (r.n_kvs > 0) {
        fprintf(out, "progress (last report of each rank):\n");
    }
    for (size_t i = 0; i < r.n_kvs; i++) {
        fprintf(out, "  rank %-4s %s\n", r.kvs[i].key + strlen(key), r.kvs[i].value);
    }
    rg_etcd_range_cleanup(&r);
}

rg_status_t rg_rdzv_status_print(const rg_etcd_params_t *params, const char *job, FILE *out)
{
    char prefix[256];
    char key[512];
    rg_etcd_t *c;
    char *v = NULL;
    size_t len;
    int64_t round = -1;
    rg_status_t st;

    snprintf(prefix, sizeof(prefix), "/regroup/%s/", job);
    st = rg_etcd_create(params, &c);
    if (st != RG_OK) {
        return st;
    }
    snprintf(key, sizeof(key), "%sround", prefix);
    st = rg_etcd_get(c, key, 0, &v, &len, NULL);
    if (st == RG_ENOENT) {
        fprintf(out, "job %s: no such job in etcd (%s)\n", job, rg_etcd_endpoint(c));
        rg_etcd_destroy(c);
        return RG_ENOENT;
    }
    if (st != RG_OK || !rg_parse_i64(v, &round)) {
        free(v);
        rg_etcd_destroy(c);
        return st != RG_OK ? st : rg_error(RG_EPROTO, "status: malformed round key");
    }
    free(v);
    fprintf(out, "job:     %s\nround:   %lld\n", job, (long long)round);

    /* The newest closed round tells the members and ranks. */
    for (int64_t r = round; r >= 0 && r >= round - 16; r--) {
        snprintf(key, sizeof(key), "%srounds/%lld/closed", prefix, (long long)r);
        if (rg_etcd_get(c, key, 0, &v, &len, NULL) != RG_OK) {
            continue;
        }
        json_t *j = json_loadb(v, len, 0, NULL);
        json_t *members = json_object_get(j, "members");
        int world = 0;
        for (size_t i = 0; i < json_array_size(members); i++) {
            world += (int)json_integer_value(json_object_get(json_array_get(members, i), "nproc"));
        }
        fprintf(out, "state:   %s\n", json_is_true(json_object_get(j, "failed")) ? "failed"
                                      : r == round ? "running" : "regrouping");
        fprintf(out, "running round %lld: %zu nodes, world size %d, restarts %lld, master %s:%lld\n",
                (long long)r, json_array_size(members), world,
                (long long)json_integer_value(json_object_get(j, "restarts")),
                json_string_value(json_object_get(j, "master_addr")) ?
                json_string_value(json_object_get(j, "master_addr")) : "?",
                (long long)json_integer_value(json_object_get(j, "master_port")));
        fprintf(out, "members:\n  %-10s %-8s %-20s %s\n", "node rank", "ranks", "host", "agent");
        int offset = 0;
        for (size_t i = 0; i < json_array_size(members); i++) {
            json_t *m = json_array_get(members, i);
            int nproc = (int)json_integer_value(json_object_get(m, "nproc"));
            char ranks[32];
            snprintf(ranks, sizeof(ranks), "%d-%d", offset, offset + nproc - 1);
            fprintf(out, "  %-10zu %-8s %-20s %s\n", i, ranks,
                    json_string_value(json_object_get(m, "addr")),
                    json_string_value(json_object_get(m, "agent")));
            offset += nproc;
        }
        json_decref(j);
        free(v);
        break;
    }
    snprintf(key, sizeof(key), "%swaiting/", prefix);
    rg_etcd_range_req_t wq = {.key = key, .prefix = true, .keys_only = true};
    rg_etcd_range_t w;
    if (rg_etcd_range(c, &wq, 0, &w) == RG_OK) {
        fprintf(out, "waiting: %zu node(s)\n", w.n_kvs);
        for (size_t i = 0; i < w.n_kvs; i++) {
            fprintf(out, "  %s\n", w.kvs[i].key + strlen(key));
        }
        rg_etcd_range_cleanup(&w);
    }
    snprintf(key, sizeof(key), "%sfailures/", prefix);
    rg_etcd_range_req_t fq = {.key = key, .prefix = true, .count_only = true};
    rg_etcd_range_t f;
    if (rg_etcd_range(c, &fq, 0, &f) == RG_OK) {
        fprintf(out, "worker failures recorded: %lld\n", (long long)f.count);
        rg_etcd_range_cleanup(&f);
    }
    snprintf(key, sizeof(key), "%sckpt/latest", prefix);
    if (rg_etcd_get(c, key, 0, &v, &len, NULL) == RG_OK) {
        fprintf(out, "last committed checkpoint: %s\n", v);
        free(v);
    } else {
        fprintf(out, "last committed checkpoint: none\n");
    }
    print_progress(c, prefix, out);
    rg_etcd_destroy(c);
    return RG_OK;
}
