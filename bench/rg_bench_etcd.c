/*
 * rg-bench-etcd: latency and throughput of the etcd client over loopback.
 *
 *   rg-bench-etcd [--endpoints=URLS] [--seconds=S] [--clients=1,8]
 *
 * Without --endpoints it starts a private etcd on a free loopback port (and stops it).
 * For each client count and each op (put, range, txn) every client thread runs the op in a
 * loop for S seconds (at most 200000 ops per thread) on its own connection; prints one JSON
 * object per line: op, clients, ops, ops_per_s, p50_us, p99_us, max_us.
 */
#include "rg_common.h"
#include "etcd_server.h"

#include <regroup/etcd.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CLIENTS    64
#define MAX_OPS_THREAD 200000

typedef enum { OP_PUT, OP_RANGE, OP_TXN } op_t;
static const char *const op_names[] = {"put", "range", "txn"};

typedef struct {
    const char *endpoints;
    op_t        op;
    int         id;
    double      seconds;
    uint32_t   *lat_us;
    size_t      n;
    rg_status_t st;
    char        err[256];
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    rg_etcd_params_t p = {.endpoints = w->endpoints};
    rg_etcd_t *c;
    char key[64];
    char val[64];
    uint64_t end;

    w->st = rg_etcd_create(&p, &c);
    if (w->st != RG_OK) {
        snprintf(w->err, sizeof(w->err), "%s", rg_last_error());
        return NULL;
    }
    snprintf(key, sizeof(key), "/bench/%d", w->id);
    w->st = rg_etcd_put_str(c, key, "0", 0, 0, NULL);
    end = rg_now_ns() + (uint64_t)(w->seconds * 1e9);
    while (w->st == RG_OK && w->n < MAX_OPS_THREAD && rg_now_ns() < end) {
        uint64_t t0 = rg_now_ns();
        snprintf(val, sizeof(val), "%zu", w->n);
        if (w->op == OP_PUT) {
            w->st = rg_etcd_put_str(c, key, val, 0, 0, NULL);
        } else if (w->op == OP_RANGE) {
            rg_etcd_range_req_t rq = {.key = key};
            rg_etcd_range_t r;
            w->st = rg_etcd_range(c, &rq, 0, &r);
            if (w->st == RG_OK) {
                rg_etcd_range_cleanup(&r);
            }
        } else {
            /* A compare-and-swap: the rendezvous' primitive. */
            rg_etcd_cmp_t cmp = {.key = key, .target = RG_ETCD_CMP_VERSION,
                                 .result = RG_ETCD_GREATER, .number = 0};
            rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                               .u.put = {.key = key, .value = val, .value_len = strlen(val)}};
            rg_etcd_txn_t t;
            w->st = rg_etcd_txn(c, &cmp, 1, &op, 1, NULL, 0, 0, &t);
            if (w->st == RG_OK) {
                rg_etcd_txn_cleanup(&t);
            }
        }
        w->lat_us[w->n++] = (uint32_t)RG_MIN((rg_now_ns() - t0) / 1000, UINT32_MAX);
    }
    if (w->st != RG_OK) {
        snprintf(w->err, sizeof(w->err), "%s", rg_last_error());
    }
    rg_etcd_destroy(c);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a;
    uint32_t y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int run(const char *endpoints, op_t op, int clients, double seconds)
{
    worker_t w[MAX_CLIENTS];
    pthread_t th[MAX_CLIENTS];
    uint32_t *all;
    size_t total = 0;
    uint64_t t0 = rg_now_ns();
    double wall;

    for (int i = 0; i < clients; i++) {
        w[i] = (worker_t){.endpoints = endpoints, .op = op, .id = i, .seconds = seconds};
        w[i].lat_us = malloc(MAX_OPS_THREAD * sizeof(uint32_t));
        if (w[i].lat_us == NULL || pthread_create(&th[i], NULL, worker_main, &w[i]) != 0) {
            fprintf(stderr, "rg-bench-etcd: cannot start client %d\n", i);
            exit(1);
        }
    }
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        total += w[i].n;
    }
    wall = (double)(rg_now_ns() - t0) / 1e9;
    all = malloc((total ? total : 1) * sizeof(uint32_t));
    total = 0;
    for (int i = 0; i < clients; i++) {
        if (w[i].st != RG_OK) {
            fprintf(stderr, "rg-bench-etcd: client %d: %s\n", i, w[i].err);
            return 1;
        }
        memcpy(all + total, w[i].lat_us, w[i].n * sizeof(uint32_t));
        total += w[i].n;
        free(w[i].lat_us);
    }
    qsort(all, total, sizeof(uint32_t), cmp_u32);
    printf("{\"bench\":\"etcd\",\"op\":\"%s\",\"clients\":%d,\"ops\":%zu,\"ops_per_s\":%.0f,"
           "\"p50_us\":%u,\"p99_us\":%u,\"max_us\":%u}\n",
           op_names[op], clients, total, (double)total / wall, all[total / 2],
           all[(size_t)((double)total * 0.99)], all[total - 1]);
    fflush(stdout);
    free(all);
    return 0;
}

int main(int argc, char **argv)
{
    const char *endpoints = NULL;
    double seconds = 3;
    char clients_list[64] = "1,8";
    rg_etcd_server_t srv;
    bool own = false;
    int rc = 0;

    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--endpoints=", 12) == 0) {
            endpoints = argv[i] + 12;
        } else if (strncmp(argv[i], "--seconds=", 10) == 0) {
            seconds = atof(argv[i] + 10);
        } else if (strncmp(argv[i], "--clients=", 10) == 0) {
            snprintf(clients_list, sizeof(clients_list), "%s", argv[i] + 10);
        } else {
            fprintf(stderr, "usage: rg-bench-etcd [--endpoints=URLS] [--seconds=S] "
                            "[--clients=1,8]\n");
            return 2;
        }
    }
    if (seconds <= 0 || seconds > 600) {
        fprintf(stderr, "rg-bench-etcd: --seconds must be in (0, 600]\n");
        return 2;
    }
    if (endpoints == NULL) {
        if (rg_etcd_server_start(&srv, NULL) != 0) {
            fprintf(stderr, "rg-bench-etcd: cannot start a private etcd\n");
            return 1;
        }
        own = true;
        endpoints = srv.endpoints;
    }
    for (char *tok = strtok(clients_list, ","); tok != NULL && rc == 0; tok = strtok(NULL, ",")) {
        int clients = atoi(tok);
        if (clients < 1 || clients > MAX_CLIENTS) {
            fprintf(stderr, "rg-bench-etcd: client count %s out of 1..%d\n", tok, MAX_CLIENTS);
            rc = 2;
            break;
        }
        for (int op = OP_PUT; op <= OP_TXN && rc == 0; op++) {
            rc = run(endpoints, (op_t)op, clients, seconds);
        }
    }
    if (own) {
        rg_etcd_server_stop(&srv);
    }
    return rc;
}
