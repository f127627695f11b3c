/* --rdzv-backend=c10d: the agent on the endpoint's host serves the rendezvous (see
 * launcher_c10d.h). */
#include "launcher_c10d.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

bool launcher_c10d_split(const char *endpoint, char *host, size_t cap, int *port,
                         const char **why)
{
    static const char form[] = "expected HOST[:PORT] or [IPv6 address][:PORT]";
    char s[1024];
    const char *h = endpoint;
    const char *name;
    const char *rest;
    size_t name_len;

    if (strchr(endpoint, ',') != NULL) {
        *why = "--rdzv-backend=c10d takes one HOST[:PORT], whose agent serves the rendezvous "
               "(several endpoints are for --rdzv-backend=etcd)";
        return false;
    }
    if (strncmp(h, "https://", 8) == 0) {
        *why = "--rdzv-backend=c10d serves plain http; TLS needs --rdzv-backend=etcd and an "
               "etcd of your own";
        return false;
    }
    if (strncmp(h, "http://", 7) == 0) {
        h += 7;
    }
    snprintf(s, sizeof(s), "%s", h);
    if (s[0] != '\0' && s[strlen(s) - 1] == '/') {
        s[strlen(s) - 1] = '\0';
    }
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (rb == NULL) {
            *why = form;
            return false;
        }
        name = s + 1;
        name_len = (size_t)(rb - name);
        rest = rb + 1;
    } else {
        const char *colon = strchr(s, ':');
        if (colon != NULL && strchr(colon + 1, ':') != NULL) {
            *why = "write an IPv6 address as [ADDR]:PORT";
            return false;
        }
        name = s;
        name_len = colon ? (size_t)(colon - s) : strlen(s);
        rest = s + name_len;
    }
    if (name_len == 0 || name_len >= cap || (rest[0] != '\0' && rest[0] != ':')) {
        *why = form;
        return false;
    }
    *port = RG_AGENT_C10D_PORT;
    if (rest[0] == ':') {
        char *end;
        long v;
        errno = 0;
        v = strtol(rest + 1, &end, 10);
        if (errno != 0 || end == rest + 1 || *end != '\0' || rest[1] < '0' || rest[1] > '9' ||
            v < 1 || v > 65535) {
            *why = "expected a port from 1 to 65535";
            return false;
        }
        *port = (int)v;
    }
    memcpy(host, name, name_len);
    host[name_len] = '\0';
    return true;
}

typedef enum {
    PROBE_SERVE,        /* an address of this host, and the port is free: serve here */
    PROBE_TAKEN,        /* an address of this host, and the port is listened on: connect */
    PROBE_ELSEWHERE,    /* not this host's (or no address at all): connect */
} probe_t;

/* Which of the addresses host resolves to can be bound on port. SO_REUSEADDR, as etcd's
 * listener has it: only a listening socket makes the port taken, not another agent's probe
 * or a connection in TIME_WAIT. */
static probe_t probe(const char *host, int port, char *addr, size_t cap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char service[16];
    probe_t r = PROBE_ELSEWHERE;

    snprintf(service, sizeof(service), "%d", port);
    if (getaddrinfo(host, service, &hints, &res) != 0) {
        return PROBE_ELSEWHERE;   /* the etcd client says why it cannot connect */
    }
    for (struct addrinfo *ai = res; ai != NULL && r == PROBE_ELSEWHERE; ai = ai->ai_next) {
        int one = 1;
        int fd;
        if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) {
            continue;
        }
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            if (getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, (socklen_t)cap, NULL, 0,
                            NI_NUMERICHOST) == 0) {
                r = PROBE_SERVE;
            }
        } else if (errno == EADDRINUSE) {
            r = PROBE_TAKEN;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return r;
}

rg_status_t launcher_c10d_serve(const rg_agent_params_t *cfg, char *endpoints, size_t cap,
                                rg_etcd_server_t **etcd_p)
{
    char host[256];
    char addr[128];
    int port;
    const char *why;
    rg_etcd_server_t *etcd;
    rg_status_t st;

    *etcd_p = NULL;
    if (!launcher_c10d_split(cfg->endpoint, host, sizeof(host), &port, &why)) {
        return rg_error(RG_EINVAL, "--rdzv-endpoint=%s: %s", cfg->endpoint, why);
    }
    /* Every agent uses the endpoint as given (with its default port), the serving one too. */
    snprintf(endpoints, cap, strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host, port);
    if (probe(host, port, addr, sizeof(addr)) != PROBE_SERVE) {
        rg_info("--rdzv-backend=c10d: using the rendezvous at %s, served by the agent on that "
                "host", endpoints);
        return RG_OK;
    }
    etcd = calloc(1, sizeof(*etcd));
    if (etcd == NULL) {
        return rg_error(RG_ENOMEM, "c10d rendezvous");
    }
    /* Fast raft timing, as the private etcd of --standalone: one member, nothing to elect. */
    rg_etcd_server_params_t sp = {.members = 1,
                                  .extra_flags = "--heartbeat-interval=10 --election-timeout=100",
                                  .client_addr = addr,
                                  .client_port = port};
    if (rg_etcd_server_start_with(etcd, &sp) != 0) {
        free(etcd);
        /* Another agent of this host may have started its etcd on the port since the probe. */
        if (probe(host, port, addr, sizeof(addr)) == PROBE_TAKEN) {
            rg_info("--rdzv-backend=c10d: another agent of this host serves %s; using it",
                    endpoints);
            return RG_OK;
        }
        st = rg_error_wrap(RG_EUNREACH, "--rdzv-backend=c10d: cannot serve the rendezvous at %s",
                           endpoints);
        fprintf(stderr, "regroup: %s\n", rg_last_error());
        return st;
    }
    fprintf(stderr,
            "regroup: --rdzv-backend=c10d: this agent serves the rendezvous at %s (a "
            "single-member etcd, pid %d); this host is a single point of failure for the job, "
            "as with torchrun's c10d; a three-member etcd (--rdzv-backend=etcd "
            "--rdzv-endpoint=HOST1:2379,HOST2:2379,HOST3:2379) avoids it\n",
            etcd->endpoints, (int)etcd->pid[0]);
    *etcd_p = etcd;
    return RG_OK;
}

void launcher_c10d_linger(const rg_etcd_server_t *etcd, int sigfd)
{
    rg_deadline_t until = rg_deadline_in_ms((int64_t)RG_AGENT_C10D_LINGER_S * 1000);
    rg_deadline_t say = rg_deadline_in_ms(1000);
    bool said = false;
    int n;

    /* Bounded by the deadline; each probe by its timeout. */
    while ((n = rg_etcd_server_lease_count(etcd, 1000)) > 0) {
        struct pollfd p = {.fd = sigfd, .events = POLLIN};
        struct signalfd_siginfo si;
        if (rg_deadline_passed(until)) {
            fprintf(stderr, "regroup: --rdzv-backend=c10d: %d agent(s) still in the job after "
                    "%d s; stopping the rendezvous\n", n, RG_AGENT_C10D_LINGER_S);
            return;
        }
        if (!said && rg_deadline_passed(say)) {
            fprintf(stderr, "regroup: --rdzv-backend=c10d: waiting up to %d s for the other "
                    "agents (%d) to leave the rendezvous this agent serves\n",
                    RG_AGENT_C10D_LINGER_S, n);
            said = true;
        }
        if (poll(&p, 1, 100) <= 0) {
            continue;
        }
        /* Bounded: the signalfd holds at most one pending instance of each signal. */
        for (int k = 0; k < 32 && read(sigfd, &si, sizeof(si)) == sizeof(si); k++) {
            if (si.ssi_signo != SIGCHLD) {
                fprintf(stderr, "regroup: signal %d: stopping the rendezvous now\n",
                        (int)si.ssi_signo);
                return;
            }
        }
    }
}
