/*
 * Test harness: real etcd servers on free loopback ports.
 *
 * rg_test_etcd_start() starts a one-member server (or rg_test_etcd_cluster_start() a cluster)
 * with a fresh temporary data dir, waits until it answers, and records its pid. Stop stops
 * by pid (SIGTERM, then SIGKILL after a deadline) and removes the data dir. Each etcd child
 * gets PR_SET_PDEATHSIG(SIGKILL), so a test process that crashes takes its etcd with it.
 * Ports come from the kernel (bind to port 0), never a fixed number.
 */
#ifndef RG_TEST_ETCD_H
#define RG_TEST_ETCD_H

#include <stdbool.h>
#include <sys/types.h>

#define RG_TEST_ETCD_MAX 5

typedef struct {
    int   n;                          /* members */
    pid_t pid[RG_TEST_ETCD_MAX];      /* 0 once stopped */
    int   client_port[RG_TEST_ETCD_MAX];
    int   peer_port[RG_TEST_ETCD_MAX];
    char  name[RG_TEST_ETCD_MAX][32];
    char  root[256];                  /* temp dir holding every member's data dir and log */
    char  endpoints[512];             /* "http://127.0.0.1:P1,http://127.0.0.1:P2,..." */
    char  url[RG_TEST_ETCD_MAX][64];  /* each member's client URL */
    char  extra[512];                 /* extra flags the members were started with */
    char  cert[256];                  /* TLS: server certificate and key, "" for plain http */
    char  key[256];
} rg_test_etcd_t;

/* A free TCP port on 127.0.0.1 (bound and released: another process could take it later,
 * so starters retry). */
int rg_test_free_port(void);

/* Starts a one-member etcd. extra_flags may be NULL. Returns 0, or -1 with a message on
 * stderr. */
int rg_test_etcd_start(rg_test_etcd_t *e, const char *extra_flags);
/* Starts a one-member etcd serving clients over TLS with the given certificate and key. */
int rg_test_etcd_start_tls(rg_test_etcd_t *e, const char *cert, const char *key);
/* Starts an n-member cluster on loopback and waits for all members and a leader. */
int rg_test_etcd_cluster_start(rg_test_etcd_t *e, int n, const char *extra_flags);
/* Kills member i with signal sig and reaps it. */
void rg_test_etcd_kill(rg_test_etcd_t *e, int i, int sig);
/* Restarts member i on the same data dir and ports; waits until it answers. */
int rg_test_etcd_restart(rg_test_etcd_t *e, int i);
/* Stops every member and removes the temp dir. Safe to call twice. */
void rg_test_etcd_stop(rg_test_etcd_t *e);
/* True once member i answers on its client URL (within timeout_ms). */
bool rg_test_etcd_wait_ready(const char *url, int timeout_ms);
/* Runs etcdctl against the server with the given arguments (a shell-free argv string split on
 * spaces); returns its exit status. */
int rg_test_etcdctl(const rg_test_etcd_t *e, const char *args);

#endif
