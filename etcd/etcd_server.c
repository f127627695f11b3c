/* etcd servers regroup starts itself: on free loopback ports, probed on a condition, stopped
 * by pid (see etcd_server.h). */
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
#define ETCDCTL_TIMEOUT_MS 30000
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

/* One HTTP/1.0 request over a raw socket to addr:port (numeric IPv4 or IPv6); the reply, cut
 * to cap - 1 bytes, into buf. False if there is no connection, or no whole reply in time. */
static bool http_once(const char *addr, int port, const char *req, char *buf, size_t cap,
                      int timeout_ms)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    size_t got = 0;
    long long deadline = now_ms() + timeout_ms;
    int fd = -1;
    bool ok;

    buf[0] = '\0';
    memset(&ss, 0, sizeof(ss));
    if (strchr(addr, ':') != NULL) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        ok = inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1;
        sl = sizeof(*a6);
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        ok = inet_pton(AF_INET, addr, &a4->sin_addr) == 1;
        sl = sizeof(*a4);
    }
    if (!ok || (fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
        return false;
    }
    ok = false;
    if (connect(fd, (struct sockaddr *)&ss, sl) != 0 ||
        write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        goto out;
    }
    while (got < cap - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = deadline - now_ms();
        ssize_t n;
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
            break;
        }
        n = read(fd, buf + got, cap - 1 - got);
        if (n <= 0) {
            ok = n == 0;   /* HTTP/1.0: the server closes after the reply */
            break;
        }
        got += (size_t)n;
    }
    ok = ok || got == cap - 1;
out:
    buf[got] = '\0';
    close(fd);
    return ok;
}

/* One GET /health on a member's plain-http metrics port; true on {"health":"true"}. */
static bool health_once(int port, int timeout_ms)
{
    char buf[2048];
    http_once("127.0.0.1", port, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", buf,
              sizeof(buf), timeout_ms);
    return strstr(buf, "\"health\":\"true\"") != NULL;
}

int rg_etcd_server_lease_count(const rg_etcd_server_t *e, int timeout_ms)
{
    static const char req[] = "POST /v3/lease/leases HTTP/1.0\r\nHost: etcd\r\n"
                              "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    char buf[16384];
    int n = 0;

    if (e->n < 1 || e->pid[0] <= 0 || e->cert[0] != '\0' || e->root_password[0] != '\0' ||
        !http_once(e->client_addr, e->client_port[0], req, buf, sizeof(buf), timeout_ms) ||
        strstr(buf, " 200 ") == NULL || strstr(buf, "\"header\"") == NULL) {
        return -1;
    }
    /* {"header":{...},"leases":[{"ID":"..."},...]}, with no "leases" at all when there are
     * none (the gateway omits empty fields). A reply cut at the buffer still counts some. */
    for (const char *p = strstr(buf, "\"leases\""); p != NULL && (p = strstr(p, "\"ID\""));
         p++) {
        n++;
    }
    return n;
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
    char host[80];
    snprintf(host, sizeof(host), strchr(e->client_addr, ':') ? "[%s]" : "%s", e->client_addr);
    snprintf(cmd, sizeof(cmd),
             "etcd --name %s --data-dir %s/%s.data %s "
             "--listen-client-urls %s://%s:%d%s --advertise-client-urls %s://%s:%d%s "
             "--listen-peer-urls http://127.0.0.1:%d --initial-advertise-peer-urls "
             "http://127.0.0.1:%d --initial-cluster %s --initial-cluster-state %s "
             "--initial-cluster-token rgtest --listen-metrics-urls http://127.0.0.1:%d "
             "--logger zap --log-level warn %s",
             e->name[i], e->root, e->name[i], tls, scheme, host, e->client_port[i], also, scheme,
             host, e->client_port[i], also,
             e->peer_port[i], e->peer_port[i], cluster, state, e->metrics_port[i], e->extra);
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

/* Waits until member i says {"health":"true"} (it has a leader and serves) on its plain-http
 * metrics port, which TLS members have too. Ends early if the member exits (a port taken
 * between rg_free_port and its bind, a bad flag). */
static bool wait_healthy(rg_etcd_server_t *e, int i, int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;

    while (now_ms() < deadline && member_alive(e, i)) {
        if (health_once(e->metrics_port[i], 1000)) {
            return true;
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

static int start_all(rg_etcd_server_t *e, const rg_etcd_server_params_t *p)
{
    int n = p->members > 0 ? p->members : 1;
    const char *scheme = p->cert_file != NULL ? "https" : "http";
    char args[128];

    memset(e, 0, sizeof(*e));
    snprintf(e->client_addr, sizeof(e->client_addr), "%s",
             p->client_port > 0 ? p->client_addr : "127.0.0.1");
    snprintf(e->also_host, sizeof(e->also_host), "%s", p->also_host ? p->also_host : "");
    snprintf(e->cert, sizeof(e->cert), "%s", p->cert_file ? p->cert_file : "");
    snprintf(e->key, sizeof(e->key), "%s", p->key_file ? p->key_file : "");
    snprintf(e->ca, sizeof(e->ca), "%s", p->ca_file ? p->ca_file : "");
    e->n = n;
    snprintf(e->extra, sizeof(e->extra), "%s", p->extra_flags ? p->extra_flags : "");
    snprintf(e->root, sizeof(e->root), "%s/rg-etcd-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(e->root) == NULL) {
        rg_error(RG_ESYS, "etcd server: mkdtemp %s: %s", e->root, strerror(errno));
        e->root[0] = '\0';
        return -1;
    }
    for (int i = 0; i < n; i++) {
        snprintf(e->name[i], sizeof(e->name[i]), "m%d", i);
        e->client_port[i] = p->client_port > 0 ? p->client_port : rg_free_port();
        e->peer_port[i] = rg_free_port();
        e->metrics_port[i] = rg_free_port();
        snprintf(e->url[i], sizeof(e->url[i]),
                 strchr(e->client_addr, ':') ? "%s://[%s]:%d" : "%s://%s:%d", scheme,
                 e->client_addr, e->client_port[i]);
        size_t l = strlen(e->endpoints);
        snprintf(e->endpoints + l, sizeof(e->endpoints) - l, "%s%s", i ? "," : "", e->url[i]);
        if (e->also_host[0]) {
            l = strlen(e->endpoints_also);
            snprintf(e->endpoints_also + l, sizeof(e->endpoints_also) - l, "%s%s://%s:%d",
                     i ? "," : "", scheme, e->also_host, e->client_port[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        if (start_member(e, i, "new") != 0) {
            goto fail;
        }
    }
    for (int i = 0; i < n; i++) {
        if (!wait_healthy(e, i, START_TIMEOUT_MS)) {
            rg_error(RG_ETIMEDOUT, "etcd server: member %s did not become healthy (log %s/%s.log)",
                     e->name[i], e->root, e->name[i]);
            goto fail;
        }
    }
    if (p->root_password != NULL) {
        snprintf(args, sizeof(args), "user add root:%s", p->root_password);
        if (rg_etcd_server_etcdctl(e, args) != 0 || rg_etcd_server_etcdctl(e, "auth enable") != 0) {
            rg_error(RG_ESYS, "etcd server: cannot enable auth (log %s/etcdctl.log)", e->root);
            goto fail;
        }
        /* From now on etcdctl must log in. */
        snprintf(e->root_password, sizeof(e->root_password), "%s", p->root_password);
    }
    return 0;
fail:
    rg_etcd_server_stop(e);
    return -1;
}

int rg_etcd_server_start_with(rg_etcd_server_t *e, const rg_etcd_server_params_t *params)
{
    static const rg_etcd_server_params_t one = {.members = 1};
    const rg_etcd_server_params_t *p = params != NULL ? params : &one;
    const char *pw = p->root_password;

    memset(e, 0, sizeof(*e));
    if (p->members < 0 || p->members > RG_ETCD_SERVER_MAX ||
        (p->cert_file == NULL) != (p->key_file == NULL)) {
        rg_error(RG_EINVAL, "etcd server: %d members, certificate %s, key %s", p->members,
                 p->cert_file ? p->cert_file : "none", p->key_file ? p->key_file : "none");
        return -1;
    }
    if (p->client_port != 0 &&
        (p->members > 1 || p->client_port < 1 || p->client_port > 65535 ||
         p->client_addr == NULL || strlen(p->client_addr) >= sizeof(e->client_addr) ||
         p->also_host != NULL)) {
        rg_error(RG_EINVAL, "etcd server: a given client address and port are for one member");
        return -1;
    }
    if (pw != NULL && ((p->cert_file != NULL && p->ca_file == NULL) || pw[0] == '\0' ||
                       strlen(pw) >= sizeof(e->root_password) || strpbrk(pw, " :") != NULL)) {
        rg_error(RG_EINVAL, "etcd server: auth needs the CA with TLS, and a password without "
                 "spaces or colons, shorter than %zu bytes", sizeof(e->root_password));
        return -1;
    }
    /* A port picked free can be taken before etcd binds it: try a few times (once when the
     * client port is given: it stays taken). */
    for (int attempt = 0; attempt < (p->client_port > 0 ? 1 : 3); attempt++) {
        if (start_all(e, p) == 0) {
            return 0;
        }
    }
    return -1;
}

int rg_etcd_server_start(rg_etcd_server_t *e, const char *extra_flags)
{
    rg_etcd_server_params_t p = {.members = 1, .extra_flags = extra_flags};
    return rg_etcd_server_start_with(e, &p);
}

int rg_etcd_server_cluster_start_at(rg_etcd_server_t *e, int n, const char *extra_flags,
                                    const char *also_host)
{
    rg_etcd_server_params_t p = {.members = n, .extra_flags = extra_flags,
                                 .also_host = also_host};
    if (n < 1) {
        memset(e, 0, sizeof(*e));
        rg_error(RG_EINVAL, "etcd server: %d members", n);
        return -1;
    }
    return rg_etcd_server_start_with(e, &p);
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
        if (start_member(e, i, "existing") == 0 && wait_healthy(e, i, START_TIMEOUT_MS)) {
            return 0;
        }
        rg_etcd_server_kill(e, i, SIGKILL);
    }
    return -1;
}

void rg_etcd_server_stop(rg_etcd_server_t *e)
{
    for (int i = 0; i < e->n; i++) {
        rg_etcd_server_kill(e, i, SIGTERM);
    }
    if (e->root[0] != '\0' && getenv("REGROUP_KEEP_ETCD") == NULL) {
        if (!rg_rm_tree(e->root)) {
            rg_warn("etcd server: could not remove all of %s", e->root);
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

    char user[100] = "";
    char tls[900] = "";
    if (e->root_password[0] != '\0') {
        snprintf(user, sizeof(user), "--user root:%s ", e->root_password);
    }
    if (e->cert[0] != '\0' && e->ca[0] != '\0') {
        snprintf(tls, sizeof(tls), "--cacert %s --cert %s --key %s ", e->ca, e->cert, e->key);
    }
    snprintf(cmd, sizeof(cmd), "etcdctl --endpoints=%s %s%s%s", e->endpoints, user, tls, args);
    snprintf(log_path, sizeof(log_path), "%s/etcdctl.log", e->root);
    split_args(cmd, argv, MAX_ARGS);
    pid = rg_proc_spawn(argv, log_path);
    if (pid < 0) {
        return -1;
    }
    /* etcdctl bounds its own calls (dial and command timeouts); this is the backstop. */
    st = rg_proc_wait(pid, ETCDCTL_TIMEOUT_MS);
    if (st < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return st;
}
