/*
 * rg-bench-etcd: latency and throughput of the etcd client over loopback.
 *
 *   rg-bench-etcd [--endpoints=URLS] [--seconds=S] [--clients=1,8]
 *
 * Without --endpoints it starts a private etcd on a free loopback port (and stops it).
 * For each client count and each op every client thread runs the op in a loop for S seconds
 * (at most 200000 ops per thread) on its own connection; prints one JSON object per line:
 * op, clients, ops, ops_per_s, p50_us, p99_us, max_us, commit, build. Ops:
 *   put        a put of the client's own key
 *   range      a read of the client's own key
 *   txn        a compare-and-swap on the client's own key that always holds (uncontended);
 *              a transaction whose compare failed is an error
 *   cas_shared the rendezvous' real pattern, contended: every client increments one shared
 *              key by read, then a transaction comparing the value read and putting value+1,
 *              retried until it holds. ops counts increments (their latency includes the
 *              retries), attempts the transactions, conflicts those that did not hold. At the
 *              end the key must equal the sum of the clients' succeeded increments, and
 *              attempts = succeeded + conflicts; otherwise the bench exits 1.
 * With its own etcd it first prints which file system holds the data directory
 * ({"bench":"etcd-env",...}: statfs type and df -T's name), since every put is an fsync.
 */
#include "rg_common.h"
#include "etcd_server.h"
#include "rg_bench_meta.h"

#include <regroup/etcd.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

#define MAX_CLIENTS    64
#define MAX_OPS_THREAD 200000
/* A bound on one increment's retries; each retry means another client's increment held. */
#define MAX_CAS_RETRIES 100000
#define SHARED_KEY     "/bench/shared"

typedef enum { OP_PUT, OP_RANGE, OP_TXN, OP_CAS_SHARED, OP_COUNT } op_t;
static const char *const op_names[] = {"put", "range", "txn", "cas_shared"};

typedef struct {
    const char *endpoints;
    op_t        op;
    int         id;
    double      seconds;
    uint32_t   *lat_us;
    size_t      n;
    uint64_t    attempts;   /* cas_shared: transactions sent */
    uint64_t    conflicts;  /* cas_shared: of those, compares that did not hold */
    uint64_t    succeeded;  /* cas_shared: those that held (= n) */
    rg_status_t st;
    char        err[256];
} worker_t;

/* Increments SHARED_KEY by read, compare-the-value-read and put, retried until it holds. */
static rg_status_t cas_increment(rg_etcd_t *c, worker_t *w)
{
    for (int retry = 0; retry < MAX_CAS_RETRIES; retry++) {
        char *v = NULL;
        size_t len = 0;
        int64_t cur;
        char next[32];
        rg_status_t st = rg_etcd_get(c, SHARED_KEY, 0, &v, &len, NULL);
        if (st != RG_OK) {
            return st;
        }
        bool parsed = rg_parse_i64(v, &cur);
        rg_etcd_cmp_t cmp = {.key = SHARED_KEY, .target = RG_ETCD_CMP_VALUE,
                             .result = RG_ETCD_EQUAL, .value = v, .value_len = len};
        snprintf(next, sizeof(next), "%" PRId64, cur + 1);
        rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                           .u.put = {.key = SHARED_KEY, .value = next, .value_len = strlen(next)}};
        rg_etcd_txn_t t;
        if (!parsed) {
            free(v);
            return rg_error(RG_EPROTO, "%s holds a non-number", SHARED_KEY);
        }
        st = rg_etcd_txn(c, &cmp, 1, &op, 1, NULL, 0, 0, &t);
        free(v);
        if (st != RG_OK) {
            return st;
        }
        w->attempts++;
        bool held = t.succeeded;
        rg_etcd_txn_cleanup(&t);
        if (held) {
            w->succeeded++;
            return RG_OK;
        }
        w->conflicts++;
    }
    return rg_error(RG_ETIMEDOUT, "cas_shared: %d retries without an increment", MAX_CAS_RETRIES);
}

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
        } else if (w->op == OP_TXN) {
            /* A compare-and-swap on the client's own key: it always holds. */
            rg_etcd_cmp_t cmp = {.key = key, .target = RG_ETCD_CMP_VERSION,
                                 .result = RG_ETCD_GREATER, .number = 0};
            rg_etcd_op_t op = {.type = RG_ETCD_OP_PUT,
                               .u.put = {.key = key, .value = val, .value_len = strlen(val)}};
            rg_etcd_txn_t t;
            w->st = rg_etcd_txn(c, &cmp, 1, &op, 1, NULL, 0, 0, &t);
            if (w->st == RG_OK) {
                if (!t.succeeded) {
                    w->st = rg_error(RG_EPROTO, "txn: the compare on %s did not hold", key);
                }
                rg_etcd_txn_cleanup(&t);
            }
        } else {
            w->st = cas_increment(c, w);
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
    uint64_t t0;
    double wall;
    uint64_t attempts = 0;
    uint64_t conflicts = 0;
    uint64_t succeeded = 0;
    char extra[256] = "";

    if (op == OP_CAS_SHARED) {
        rg_etcd_params_t p = {.endpoints = endpoints};
        rg_etcd_t *c;
        rg_status_t st = rg_etcd_create(&p, &c);
        if (st == RG_OK) {
            st = rg_etcd_put_str(c, SHARED_KEY, "0", 0, 0, NULL);
            rg_etcd_destroy(c);
        }
        if (st != RG_OK) {
            fprintf(stderr, "rg-bench-etcd: %s\n", rg_last_error());
            return 1;
        }
    }
    t0 = rg_now_ns();
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
        attempts += w[i].attempts;
        conflicts += w[i].conflicts;
        succeeded += w[i].succeeded;
    }
    if (op == OP_CAS_SHARED) {
        /* Every increment that held must be in the key, and no other. */
        rg_etcd_params_t p = {.endpoints = endpoints};
        rg_etcd_t *c;
        char *v = NULL;
        size_t len;
        int64_t final = -1;
        rg_status_t st = rg_etcd_create(&p, &c);
        if (st == RG_OK) {
            st = rg_etcd_get(c, SHARED_KEY, 0, &v, &len, NULL);
            rg_etcd_destroy(c);
        }
        if (st != RG_OK || !rg_parse_i64(v, &final) || (uint64_t)final != succeeded ||
            attempts != succeeded + conflicts || succeeded != total) {
            fprintf(stderr, "rg-bench-etcd: cas_shared: %s is %" PRId64 " after %" PRIu64
                            " succeeded increments (%" PRIu64 " attempts, %" PRIu64
                            " conflicts, %zu timed)%s%s\n",
                    SHARED_KEY, final, succeeded, attempts, conflicts, total,
                    st != RG_OK ? ": " : "", st != RG_OK ? rg_last_error() : "");
            free(v);
            free(all);
            return 1;
        }
        free(v);
        snprintf(extra, sizeof(extra),
                 "\"attempts\":%" PRIu64 ",\"conflicts\":%" PRIu64 ",\"succeeded\":%" PRIu64
                 ",\"final_value\":%" PRId64 ",\"checked\":true,",
                 attempts, conflicts, succeeded, final);
    }
    qsort(all, total, sizeof(uint32_t), cmp_u32);
    if (total == 0) {
        fprintf(stderr, "rg-bench-etcd: %s: no operation completed\n", op_names[op]);
        free(all);
        return 1;
    }
    printf("{\"bench\":\"etcd\",\"op\":\"%s\",\"clients\":%d,\"seconds\":%.2f,\"ops\":%zu,"
           "\"ops_per_s\":%.0f,\"p50_us\":%u,\"p99_us\":%u,\"max_us\":%u,%s%s}\n",
           op_names[op], clients, wall, total, (double)total / wall, all[total / 2],
           all[(size_t)((double)total * 0.99)], all[total - 1], extra, RG_BENCH_META);
    fflush(stdout);
    free(all);
    return 0;
}

/* Which file system holds the private etcd's data directory (every put is fsync'd there). */
static void print_fs(const char *path)
{
    struct statfs sf;
    char cmd[600];
    char fs[64] = "?";
    unsigned long type = 0;
    if (statfs(path, &sf) == 0) {
        type = (unsigned long)sf.f_type;
    }
    snprintf(cmd, sizeof(cmd), "df --output=fstype '%s' 2>/dev/null | tail -1", path);
    FILE *f = popen(cmd, "r");
    if (f != NULL) {
        if (fgets(fs, sizeof(fs), f) != NULL) {
            fs[strcspn(fs, " \n")] = '\0';
        }
        pclose(f);
    }
    printf("{\"bench\":\"etcd-env\",\"data_dir\":\"%s\",\"statfs_type\":\"0x%lx\","
           "\"fstype\":\"%s\",%s}\n",
           path, type, fs, RG_BENCH_META);
    fflush(stdout);
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
        print_fs(srv.root);
    }
    for (char *tok = strtok(clients_list, ","); tok != NULL && rc == 0; tok = strtok(NULL, ",")) {
        int clients = atoi(tok);
        if (clients < 1 || clients > MAX_CLIENTS) {
            fprintf(stderr, "rg-bench-etcd: client count %s out of 1..%d\n", tok, MAX_CLIENTS);
            rc = 2;
            break;
        }
        for (int op = OP_PUT; op < OP_COUNT && rc == 0; op++) {
            rc = run(endpoints, (op_t)op, clients, seconds);
        }
    }
    if (own) {
        rg_etcd_server_stop(&srv);
    }
    return rc;
}
