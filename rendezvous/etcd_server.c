/* Real etcd servers for tests: started on free loopback ports, stopped by pid. */
#include "etcd_server.h"

#include "rg_common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_TIMEOUT_MS 20000
#define STOP_TIMEOUT_MS  5000
#define MAX_ARGS         64

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int rg_free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port = -1;

    if (fd < 0) {
        return -1;
    }
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        port = ntohs(sa.sin_port);
    }
    close(fd);
    return port;
}

/* One HTTP GET /health over a raw socket; true on {"health":"true"}. */
static bool health_once(int port, int timeout_ms)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    char buf[2048];
    size_t got = 0;
    long long deadline = now_ms() + timeout_ms;
    const char *req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bool ok = false;

    if (fd < 0) {
        return false;
    }
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        goto out;
    }
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        goto out;
    }
    while (got < sizeof(buf) - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = deadline - now_ms();
        ssize_t n;
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
            break;
        }
        n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    buf[got] = '\0';
    ok = strstr(buf, "\"health\":\"true\"") != NULL;
out:
    close(fd);
    return ok;
}

bool rg_etcd_server_wait_ready(const char *url, int timeout_ms)
{
    const char *colon = strrchr(url, ':');
    int port = colon ? atoi(colon + 1) : 0;
    long long deadline = now_ms() + timeout_ms;

    while (now_ms() < deadline) {
        if (health_once(port, 1000)) {
            return true;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

static int split_args(char *s, char **argv, int max)
{
    int n = 0;
    for (char *tok = strtok(s, " "); tok != NULL && n < max - 1; tok = strtok(NULL, " ")) {
        argv[n++] = tok;
    }
    argv[n] = NULL;
    return n;
}

static int start_member(rg_etcd_server_t *e, int i, const char *state)
{
    char cmd[4096];
    char cluster[1024] = "";
    char log_path[320];
    char *argv[MAX_ARGS];

    for (int j = 0; j < e->n; j++) {
        size_t l = strlen(cluster);
        snprintf(cluster + l, sizeof(cluster) - l, "%s%s=http://127.0.0.1:%d", j ? "," : "",
                 e->name[j], e->peer_port[j]);
    }
    char tls[600] = "";
    char also[160] = "";
    const char *scheme = e->cert[0] ? "https" : "http";
    if (e->cert[0]) {
        snprintf(tls, sizeof(tls), "--cert-file %s --key-file %s", e->cert, e->key);
    }
    if (e->also_host[0]) {
        snprintf(also, sizeof(also), ",%s://%s:%d", scheme, e->also_host, e->client_port[i]);
    }
    snprintf(cmd, sizeof(cmd),
             "etcd --name %s --data-dir %s/%s.data %s "
             "--listen-client-urls %s://127.0.0.1:%d%s --advertise-client-urls %s://127.0.0.1:%d%s "
             "--listen-peer-urls http://127.0.0.1:%d --initial-advertise-peer-urls "
             "http://127.0.0.1:%d --initial-cluster %s --initial-cluster-state %s "
             "--initial-cluster-token rgtest --logger zap --log-level warn %s",
             e->name[i], e->root, e->name[i], tls, scheme, e->client_port[i], also, scheme,
             e->client_port[i], also,
             e->peer_port[i], e->peer_port[i], cluster, state, e->extra);
    snprintf(log_path, sizeof(log_path), "%s/%s.log", e->root, e->name[i]);
    split_args(cmd, argv, MAX_ARGS);
    e->pid[i] = rg_proc_spawn(argv, log_path);
    return e->pid[i] > 0 ? 0 : -1;
}

static bool member_alive(rg_etcd_server_t *e, int i)
{
    int st;
    if (e->pid[i] <= 0) {
        return false;
    }
    if (waitpid(e->pid[i], &st, WNOHANG) == e->pid[i]) {
        e->pid[i] = 0;
        return false;
    }
    return true;
}

/* TCP connect only: used for TLS members, which the raw health probe cannot speak to. */
static bool port_open(int port, int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    while (now_ms() < deadline) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            close(fd);
            return true;
        }
        if (fd >= 0) {
            close(fd);
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

static int start_all(rg_etcd_server_t *e, int n, const char *extra, const char *cert,
                     const char *key, const char *also_host)
{
    memset(e, 0, sizeof(*e));
    snprintf(e->also_host, sizeof(e->also_host), "%s", also_host ? also_host : "");
    snprintf(e->cert, sizeof(e->cert), "%s", cert ? cert : "");
    snprintf(e->key, sizeof(e->key), "%s", key ? key : "");
    e->n = n;
    snprintf(e->extra, sizeof(e->extra), "%s", extra ? extra : "");
    snprintf(e->root, sizeof(e->root), "%s/rg-etcd-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(e->root) == NULL) {
        rg_error(RG_ESYS, "etcd server: mkdtemp %s: %s", e->root, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        snprintf(e->name[i], sizeof(e->name[i]), "m%d", i);
        e->client_port[i] = rg_free_port();
        e->peer_port[i] = rg_free_port();
        snprintf(e->url[i], sizeof(e->url[i]), "%s://127.0.0.1:%d", e->cert[0] ? "https" : "http",
                 e->client_port[i]);
        size_t l = strlen(e->endpoints);
        snprintf(e->endpoints + l, sizeof(e->endpoints) - l, "%s%s", i ? "," : "", e->url[i]);
        if (e->also_host[0]) {
            l = strlen(e->endpoints_also);
            snprintf(e->endpoints_also + l, sizeof(e->endpoints_also) - l, "%s%s://%s:%d",
                     i ? "," : "", e->cert[0] ? "https" : "http", e->also_host,
                     e->client_port[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        if (start_member(e, i, "new") != 0) {
            goto fail;
        }
    }
    for (int i = 0; i < n; i++) {
        bool ready = e->cert[0] ? port_open(e->client_port[i], START_TIMEOUT_MS)
                                : rg_etcd_server_wait_ready(e->url[i], START_TIMEOUT_MS);
        if (!ready || !member_alive(e, i)) {
            rg_error(RG_ETIMEDOUT, "etcd server: member %s did not become ready (log %s/%s.log)",
                     e->name[i], e->root, e->name[i]);
            goto fail;
        }
    }
    return 0;
fail:
    rg_etcd_server_stop(e);
    return -1;
}

int rg_etcd_server_start_tls(rg_etcd_server_t *e, const char *cert, const char *key,
                             const char *extra_flags)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        if (start_all(e, 1, extra_flags, cert, key, NULL) == 0) {
            return 0;
        }
    }
    return -1;
}

int rg_etcd_server_start(rg_etcd_server_t *e, const char *extra_flags)
{
    /* A port picked free can be taken before etcd binds it: try a few times. */
    for (int attempt = 0; attempt < 3; attempt++) {
        if (start_all(e, 1, extra_flags, NULL, NULL, NULL) == 0) {
            return 0;
        }
    }
    return -1;
}

int rg_etcd_server_cluster_start(rg_etcd_server_t *e, int n, const char *extra_flags)
{
    return rg_etcd_server_cluster_start_at(e, n, extra_flags, NULL);
}

int rg_etcd_server_cluster_start_at(rg_etcd_server_t *e, int n, const char *extra_flags,
                                    const char *also_host)
{
    if (n < 1 || n > RG_ETCD_SERVER_MAX) {
        return -1;
    }
    for (int attempt = 0; attempt < 3; attempt++) {
        if (start_all(e, n, extra_flags, NULL, NULL, also_host) == 0) {
            return 0;
        }
    }
    return -1;
}

static void reap(pid_t pid, int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    int st;
    while (now_ms() < deadline) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) {
            return;
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

void rg_etcd_server_kill(rg_etcd_server_t *e, int i, int sig)
{
    if (i < 0 || i >= e->n || e->pid[i] <= 0) {
        return;
    }
    kill(e->pid[i], sig);
    reap(e->pid[i], STOP_TIMEOUT_MS);
    e->pid[i] = 0;
}

int rg_etcd_server_restart(rg_etcd_server_t *e, int i)
{
    if (i < 0 || i >= e->n) {
        return -1;
    }
    rg_etcd_server_kill(e, i, SIGKILL);
    for (int attempt = 0; attempt < 3; attempt++) {
        if (start_member(e, i, "existing") == 0 &&
            rg_etcd_server_wait_ready(e->url[i], START_TIMEOUT_MS)) {
            return 0;
        }
        rg_etcd_server_kill(e, i, SIGKILL);
    }
    return -1;
}

void rg_etcd_server_stop(rg_etcd_server_t *e)
{
    char cmd[512];
    for (int i = 0; i < e->n; i++) {
        rg_etcd_server_kill(e, i, SIGTERM);
    }
    if (e->root[0] != '\0' && getenv("REGROUP_KEEP_ETCD") == NULL) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->root);
        if (system(cmd) != 0) {
            rg_warn("etcd server: could not remove %s", e->root);
        }
        e->root[0] = '\0';
    }
}

int rg_etcd_server_etcdctl(const rg_etcd_server_t *e, const char *args)
{
    char cmd[2048];
    char log_path[320];
    char *argv[MAX_ARGS];
    int st;
    pid_t pid;

    snprintf(cmd, sizeof(cmd), "etcdctl --endpoints=%s %s", e->endpoints, args);
    snprintf(log_path, sizeof(log_path), "%s/etcdctl.log", e->root);
    split_args(cmd, argv, MAX_ARGS);
    pid = rg_proc_spawn(argv, log_path);
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
