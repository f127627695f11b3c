/*
 * etcd servers that regroup starts itself: the private etcd of `regroup --standalone`, the
 * rendezvous a `--rdzv-backend=c10d` agent serves on its endpoint's address and port, and the
 * real servers of the tests, benches and the chaos runner, on free loopback ports.
 *
 * rg_etcd_server_start_with() is the one way to start them: one member or a cluster, plain
 * http or TLS for clients, optionally with auth enabled, in a fresh temporary data dir under
 * $TMPDIR. It waits, up to a deadline, until every member says it is healthy (a leader is
 * elected) on a plain-http metrics port of its own, so TLS members are probed the same way.
 * Stop stops by pid (SIGTERM, then SIGKILL after a deadline) and removes the data dir
 * without a shell. Each etcd child gets PR_SET_PDEATHSIG(SIGKILL), so a process that crashes
 * or _exits takes its etcd with it. Ports come from the kernel (bind to port 0), never a
 * fixed number; a start that loses a port race is retried.
 */
#ifndef REGROUP_ETCD_SERVER_H
#define REGROUP_ETCD_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

#define RG_ETCD_SERVER_MAX 5

/* How to start a server; zero-initialised means one plain-http member with etcd's defaults. */
typedef struct {
    int         members;       /* 1..RG_ETCD_SERVER_MAX; 0 means 1 */
    const char *extra_flags;   /* more etcd flags, split on spaces; NULL for none */
    const char *cert_file;     /* serve clients over TLS with this certificate and key; */
    const char *key_file;      /* NULL for plain http */
    const char *also_host;     /* serve clients on this address too (see endpoints_also) */
    const char *root_password; /* add user root with this password and enable auth; NULL
                                  for no auth. With TLS it needs ca_file. */
    const char *ca_file;       /* TLS: the CA that signed cert_file, for etcdctl, which shows
                                  cert_file as its client certificate (it must allow client
                                  auth when etcd requires client certificates) */
    const char *client_addr;   /* one member only: serve clients on this numeric address */
    int         client_port;   /* and port, instead of a free loopback port (0: free port
                                  on 127.0.0.1); a taken port fails the start */
} rg_etcd_server_params_t;

typedef struct {
    int   n;                          /* members */
    pid_t pid[RG_ETCD_SERVER_MAX];      /* 0 once stopped */
    int   client_port[RG_ETCD_SERVER_MAX];
    int   peer_port[RG_ETCD_SERVER_MAX];
    int   metrics_port[RG_ETCD_SERVER_MAX]; /* plain http: /health, whatever the client side */
    char  name[RG_ETCD_SERVER_MAX][32];
    char  client_addr[64];            /* where clients connect: "127.0.0.1" unless given */
    char  root[256];                  /* temp dir holding every member's data dir and log */
    char  endpoints[512];             /* "http://127.0.0.1:P1,http://127.0.0.1:P2,..." */
    char  url[RG_ETCD_SERVER_MAX][64];  /* each member's client URL */
    char  extra[512];                 /* extra flags the members were started with */
    char  also_host[64];              /* another address clients may use, "" for none */
    char  endpoints_also[512];        /* the members' client URLs on also_host */
    char  cert[256];                  /* TLS: server certificate and key, "" for plain http */
    char  key[256];
    char  ca[256];                    /* TLS: the CA etcdctl trusts, "" if not given */
    char  root_password[64];          /* auth: root's password, "" when auth is off */
} rg_etcd_server_t;

/* A free TCP port on 127.0.0.1 (bound and released: another process could take it later,
 * so starters retry). */
int rg_free_port(void);

/* Starts a server as params says (NULL: one plain member) and waits until every member is
 * healthy. Blocks, at most about a minute. Returns 0, or -1 with the reason in
 * rg_last_error() (nothing is left running or on disk then). Stop it with
 * rg_etcd_server_stop(). */
int rg_etcd_server_start_with(rg_etcd_server_t *e, const rg_etcd_server_params_t *params);
/* The same for one plain-http member with extra_flags (may be NULL). */
int rg_etcd_server_start(rg_etcd_server_t *e, const char *extra_flags);
/* The same for an n-member plain-http cluster with extra_flags, serving clients also on
 * also_host (NULL for none): an address of a network namespace the caller made, such as a
 * bridge that agents in other namespaces reach, on the same ports; peers and the health
 * probe stay on loopback. */
int rg_etcd_server_cluster_start_at(rg_etcd_server_t *e, int n, const char *extra_flags,
                                    const char *also_host);
/* The number of leases the server holds (asked over plain http on member 0's client URL,
 * timeout_ms at most), or -1 if it does not answer. The agents of a job hold one each. */
int rg_etcd_server_lease_count(const rg_etcd_server_t *e, int timeout_ms);
/* Kills member i with signal sig and reaps it (SIGKILL after a deadline). */
void rg_etcd_server_kill(rg_etcd_server_t *e, int i, int sig);
/* Restarts member i on the same data dir and ports; waits until it is healthy. */
int rg_etcd_server_restart(rg_etcd_server_t *e, int i);
/* Stops every member and removes the temp dir (kept if REGROUP_KEEP_ETCD is set). Safe to
 * call twice, and on a zeroed struct. */
void rg_etcd_server_stop(rg_etcd_server_t *e);
/* Runs etcdctl against the server with the given arguments (a shell-free argv string split on
 * spaces; as root when auth is on; over TLS with the CA and the server's own certificate);
 * returns its exit status. Output goes to root/etcdctl.log. */
int rg_etcd_server_etcdctl(const rg_etcd_server_t *e, const char *args);

#endif
