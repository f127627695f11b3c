/*
 * etcd servers that regroup starts itself: the private etcd of `regroup --standalone`, and
 * the real servers of the tests and benches, on free loopback ports.
 *
 * rg_etcd_server_start() starts a one-member server (or rg_etcd_server_cluster_start() a cluster)
 * with a fresh temporary data dir, waits until it answers, and records its pid. Stop stops
 * by pid (SIGTERM, then SIGKILL after a deadline) and removes the data dir. Each etcd child
 * gets PR_SET_PDEATHSIG(SIGKILL), so a test process that crashes takes its etcd with it.
 * Ports come from the kernel (bind to port 0), never a fixed number.
 */
#ifndef REGROUP_ETCD_SERVER_H
#define REGROUP_ETCD_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

#define RG_ETCD_SERVER_MAX 5

typedef struct {
    int   n;                          /* members */
    pid_t pid[RG_ETCD_SERVER_MAX];      /* 0 once stopped */
    int   client_port[RG_ETCD_SERVER_MAX];
    int   peer_port[RG_ETCD_SERVER_MAX];
    char  name[RG_ETCD_SERVER_MAX][32];
    char  root[256];                  /* temp dir holding every member's data dir and log */
    char  endpoints[512];             /* "http://127.0.0.1:P1,http://127.0.0.1:P2,..." */
    char  url[RG_ETCD_SERVER_MAX][64];  /* each member's client URL */
    char  extra[512];                 /* extra flags the members were started with */
    char  also_host[64];              /* another address clients may use, "" for none */
    char  endpoints_also[512];        /* the members' client URLs on also_host */
    char  cert[256];                  /* TLS: server certificate and key, "" for plain http */
    char  key[256];
} rg_etcd_server_t;

/* A free TCP port on 127.0.0.1 (bound and released: another process could take it later,
 * so starters retry). */
int rg_free_port(void);

/* Starts a one-member etcd. extra_flags may be NULL. Returns 0, or -1 with the reason in
 * rg_last_error(). */
int rg_etcd_server_start(rg_etcd_server_t *e, const char *extra_flags);
/* Starts a one-member etcd serving clients over TLS with the given certificate and key;
 * extra_flags (may be NULL) as for rg_etcd_server_start, e.g. to require client
 * certificates. */
int rg_etcd_server_start_tls(rg_etcd_server_t *e, const char *cert, const char *key,
                             const char *extra_flags);
/* Starts an n-member cluster on loopback and waits for all members and a leader. */
int rg_etcd_server_cluster_start(rg_etcd_server_t *e, int n, const char *extra_flags);
/* The same, serving clients also on also_host (an address of a network namespace the caller
 * made, such as a bridge that agents in other namespaces reach), on the same ports; peers and
 * the health probe stay on loopback. e->endpoints_also lists those URLs. */
int rg_etcd_server_cluster_start_at(rg_etcd_server_t *e, int n, const char *extra_flags,
                                    const char *also_host);
/* Kills member i with signal sig and reaps it. */
void rg_etcd_server_kill(rg_etcd_server_t *e, int i, int sig);
/* Restarts member i on the same data dir and ports; waits until it answers. */
int rg_etcd_server_restart(rg_etcd_server_t *e, int i);
/* Stops every member and removes the temp dir. Safe to call twice. */
void rg_etcd_server_stop(rg_etcd_server_t *e);
/* True once member i answers on its client URL (within timeout_ms). */
bool rg_etcd_server_wait_ready(const char *url, int timeout_ms);
/* Runs etcdctl against the server with the given arguments (a shell-free argv string split on
 * spaces); returns its exit status. */
int rg_etcd_server_etcdctl(const rg_etcd_server_t *e, const char *args);

#endif
