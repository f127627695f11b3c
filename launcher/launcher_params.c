/*
 * The agent's parameters: defaults, the one validation both front ends go through, and
 * --print-config. A bad value is named as its source gave it, so the user of the command
 * reads the option or variable and the user of rg_trainer_fit reads the struct field.
 */
#include "launcher.h"
#include "launcher_notice.h"
#include "rdzv_keys.h"   /* rdzv_addr_ok: what the rendezvous takes as a node's address */

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_INT, K_NODES, K_MS, K_SEC, K_STR, K_BOOL, K_SECRET, K_OTHER } kind_t;

typedef struct {
    const char *key;      /* --print-config's name, and the name used when from is NULL */
    const char *flag;     /* the option, without "--" */
    const char *conf;     /* the --rdzv-conf key, NULL if none */
    kind_t      kind;
    bool        printed;  /* a --print-config row */
} field_t;

static const field_t fields[RG_AGENT_NFIELDS] = {
    [RG_AGENT_NNODES] = {"nnodes", "nnodes", NULL, K_NODES, true},
    [RG_AGENT_NPROC] = {"nproc_per_node", "nproc-per-node", NULL, K_INT, true},
    [RG_AGENT_BACKEND] = {"rdzv_backend", "rdzv-backend", NULL, K_STR, true},
    [RG_AGENT_ENDPOINT] = {"rdzv_endpoint", "rdzv-endpoint", NULL, K_STR, true},
    [RG_AGENT_JOB] = {"rdzv_id", "rdzv-id", NULL, K_STR, true},
    [RG_AGENT_LAST_CALL] = {"last_call_timeout", "rdzv-conf", "last_call_timeout", K_MS, true},
    [RG_AGENT_JOIN_TIMEOUT] = {"join_timeout", "rdzv-conf", "join_timeout", K_MS, true},
    [RG_AGENT_LEASE_TTL] = {"lease_ttl", "rdzv-conf", "lease_ttl", K_SEC, true},
    [RG_AGENT_MAX_RESTARTS] = {"max_restarts", "max-restarts", NULL, K_INT, true},
    [RG_AGENT_RECOVERY] = {"recovery", "recovery", NULL, K_STR, true},
    [RG_AGENT_MONITOR] = {"monitor_interval", "monitor-interval", NULL, K_MS, true},
    [RG_AGENT_HANG] = {"hang_timeout", "rdzv-conf", "hang_timeout", K_MS, true},
    [RG_AGENT_STRAGGLER_FACTOR] = {"straggler_factor", "rdzv-conf", "straggler_factor", K_INT,
                                   true},
    [RG_AGENT_STRAGGLER_WINDOW] = {"straggler_window", "rdzv-conf", "straggler_window", K_MS,
                                   true},
    [RG_AGENT_GRACE] = {"grace_period", "grace-period", "grace_period", K_MS, true},
    [RG_AGENT_ROLE] = {"role", "role", NULL, K_STR, true},
    [RG_AGENT_LOG_DIR] = {"log_dir", "log-dir", NULL, K_STR, true},
    [RG_AGENT_REDIRECTS] = {"redirects", "redirects", NULL, K_INT, true},
    [RG_AGENT_TEE] = {"tee", "tee", NULL, K_INT, true},
    [RG_AGENT_RANKS_FILTER] = {"local_ranks_filter", "local-ranks-filter", NULL, K_STR, true},
    [RG_AGENT_NUMA] = {"numa_binding", "numa-binding", NULL, K_STR, true},
    [RG_AGENT_NOTICE] = {"preemption_notice", "preemption-notice", NULL, K_STR, true},
    [RG_AGENT_HEALTH] = {"health_check", "health-check", NULL, K_STR, true},
    [RG_AGENT_PRELOAD] = {"preload", "preload", NULL, K_STR, true},
    [RG_AGENT_LOCAL_ADDR] = {"local_addr", "local-addr", NULL, K_STR, true},
    [RG_AGENT_STANDALONE] = {"standalone", "standalone", NULL, K_BOOL, false},
    [RG_AGENT_USER] = {"user", "rdzv-conf", "user", K_STR, false},
    [RG_AGENT_PASSWORD] = {"password", "rdzv-conf", "password", K_SECRET, false},
    [RG_AGENT_CACERT] = {"cacert", "rdzv-conf", "cacert", K_STR, false},
    [RG_AGENT_CERT] = {"cert", "rdzv-conf", "cert", K_STR, false},
    [RG_AGENT_KEY] = {"key", "rdzv-conf", "key", K_STR, false},
    [RG_AGENT_NO_PYTHON] = {"no_python", "no-python", NULL, K_BOOL, false},
    [RG_AGENT_MODULE] = {"module", "module", NULL, K_BOOL, false},
    [RG_AGENT_PROGRAM] = {"program", "PROGRAM", NULL, K_OTHER, false},
    [RG_AGENT_ENV] = {"env", "env", NULL, K_OTHER, false},
};

void rg_agent_params_init(rg_agent_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->min_nodes = p->max_nodes = 1;
    p->nproc = 1;
    snprintf(p->job, sizeof(p->job), "none");
    p->last_call_ms = 1000;
    p->join_timeout_ms = 600000;
    p->lease_ttl_s = 5;
    p->monitor_ms = 1000;
    p->grace_ms = 5000;
    p->hang_ms = 1000;
    p->straggler_window_ms = 30000;
    snprintf(p->role, sizeof(p->role), "default");
}

static int64_t ms_of(const rg_agent_params_t *p, rg_agent_field_t f)
{
    switch (f) {
    case RG_AGENT_LAST_CALL: return p->last_call_ms;
    case RG_AGENT_JOIN_TIMEOUT: return p->join_timeout_ms;
    case RG_AGENT_MONITOR: return p->monitor_ms;
    case RG_AGENT_HANG: return p->hang_ms;
    case RG_AGENT_STRAGGLER_WINDOW: return p->straggler_window_ms;
    default: return p->grace_ms;
    }
}

int launcher_std_bits(const rg_agent_params_t *p, bool tee, int local_rank)
{
    int v = tee ? p->tee : p->redirects;
    const unsigned char *map = tee ? p->tee_map : p->redirects_map;
    if (v >= 0) {
        return v;
    }
    return local_rank >= 0 && local_rank < LAUNCHER_MAX_NPROC ? map[local_rank] : 0;
}

bool launcher_needs_log_dir(const rg_agent_params_t *p)
{
    for (int i = 0; i < p->nproc && i < LAUNCHER_MAX_NPROC; i++) {
        if (launcher_std_bits(p, false, i) != 0 || launcher_std_bits(p, true, i) != 0) {
            return true;
        }
    }
    return false;
}

/* "3", or a per-local-rank map as torchrun takes it: "0:3,1:1" (the ranks not named get 0). */
static void std_str(int v, const unsigned char *map, char *buf, size_t len)
{
    size_t o = 0;
    if (v >= 0) {
        snprintf(buf, len, "%d", v);
        return;
    }
    buf[0] = '\0';
    for (int i = 0; i < LAUNCHER_MAX_NPROC && o < len; i++) {
        if (map[i] != 0) {
            int n = snprintf(buf + o, len - o, "%s%d:%d", o ? "," : "", i, map[i]);
            o += n > 0 ? (size_t)n : 0;
        }
    }
}

/* The value of f as a user would have written it. */
static void value_str(const rg_agent_params_t *p, rg_agent_field_t f, char *buf, size_t len)
{
    switch (f) {
    case RG_AGENT_NNODES:
        if (p->min_nodes == p->max_nodes) {
            snprintf(buf, len, "%d", p->min_nodes);
        } else {
            snprintf(buf, len, "%d:%d", p->min_nodes, p->max_nodes);
        }
        break;
    case RG_AGENT_NPROC: snprintf(buf, len, "%d", p->nproc); break;
    case RG_AGENT_MAX_RESTARTS: snprintf(buf, len, "%d", p->max_restarts); break;
    case RG_AGENT_REDIRECTS: std_str(p->redirects, p->redirects_map, buf, len); break;
    case RG_AGENT_TEE: std_str(p->tee, p->tee_map, buf, len); break;
    case RG_AGENT_RANKS_FILTER:
        if (!p->ranks_filter) {
            snprintf(buf, len, "(all)");
            break;
        }
        buf[0] = '\0';
        for (int i = 0, o = 0; i < LAUNCHER_MAX_NPROC && o < (int)len; i++) {
            if (p->ranks_shown[i]) {
                int n = snprintf(buf + o, len - (size_t)o, "%s%d", o ? "," : "", i);
                o += n > 0 ? n : 0;
            }
        }
        break;
    case RG_AGENT_RECOVERY:
        snprintf(buf, len, "%s", p->recovery == RG_AGENT_RECOVERY_IN_PLACE ? "in-place"
                                                                          : "restart");
        break;
    case RG_AGENT_NUMA: {
        static const char *const names[] = {"none", "node", "socket", "exclusive",
                                             "core-complex"};
        snprintf(buf, len, "%s", (unsigned)p->numa < RG_ARRAY_SIZE(names) ? names[p->numa]
                                                                           : "?");
        break;
    }
    case RG_AGENT_NOTICE: {
        static const char *const names[] = {"none", "aws", "gce", "azure", "auto"};
        snprintf(buf, len, "%s", (unsigned)p->notice < RG_ARRAY_SIZE(names) ? names[p->notice]
                                                                             : "?");
        break;
    }
    case RG_AGENT_HEALTH: {
        static const char *const names[] = {"off", "warn", "evict"};
        snprintf(buf, len, "%s", (unsigned)p->health < RG_ARRAY_SIZE(names) ? names[p->health]
                                                                             : "?");
        break;
    }
    case RG_AGENT_LEASE_TTL: snprintf(buf, len, "%lld", (long long)p->lease_ttl_s); break;
    case RG_AGENT_LAST_CALL:
    case RG_AGENT_JOIN_TIMEOUT:
    case RG_AGENT_MONITOR:
    case RG_AGENT_HANG:
    case RG_AGENT_STRAGGLER_WINDOW:
    case RG_AGENT_GRACE: snprintf(buf, len, "%g", (double)ms_of(p, f) / 1000); break;
    case RG_AGENT_STRAGGLER_FACTOR:
        if (p->straggler_factor == 0) {
            snprintf(buf, len, "0 (off)");
        } else {
            snprintf(buf, len, "%g", p->straggler_factor);
        }
        break;
    case RG_AGENT_BACKEND:
        snprintf(buf, len, "%s", p->backend == RG_AGENT_BACKEND_C10D ? "c10d" : "etcd");
        break;
    case RG_AGENT_ENDPOINT: snprintf(buf, len, "%s", p->endpoint); break;
    case RG_AGENT_JOB: snprintf(buf, len, "%s", p->job); break;
    case RG_AGENT_ROLE: snprintf(buf, len, "%s", p->role); break;
    case RG_AGENT_LOG_DIR: snprintf(buf, len, "%s", p->log_dir); break;
    case RG_AGENT_LOCAL_ADDR: snprintf(buf, len, "%s", p->local_addr); break;
    case RG_AGENT_PRELOAD: snprintf(buf, len, "%s", p->preload); break;
    case RG_AGENT_USER: snprintf(buf, len, "%s", p->user); break;
    case RG_AGENT_CACERT: snprintf(buf, len, "%s", p->cacert); break;
    case RG_AGENT_CERT: snprintf(buf, len, "%s", p->cert); break;
    case RG_AGENT_KEY: snprintf(buf, len, "%s", p->key); break;
    case RG_AGENT_PASSWORD: snprintf(buf, len, "***"); break;
    default: snprintf(buf, len, "%s", ""); break;
    }
}

void rg_agent_params_label(const rg_agent_params_t *p, rg_agent_field_t f, char *buf,
                           size_t len)
{
    const field_t *d = &fields[f];
    const char *from = p->from[f];
    char v[1100];

    value_str(p, f, v, sizeof(v));
    if (d->kind == K_OTHER) {
        snprintf(buf, len, "%s", from && strcmp(from, "flag") != 0 ? from : d->flag);
    } else if (from == NULL) {
        snprintf(buf, len, "%s%s%s", d->key, d->kind == K_BOOL ? "" : "=", v);
    } else if (strcmp(from, "flag") == 0) {
        snprintf(buf, len, "--%s%s%s", d->flag, d->kind == K_BOOL ? "" : "=", v);
    } else if (d->conf != NULL &&
               (strcmp(from, "--rdzv-conf") == 0 || strcmp(from, "REGROUP_RDZV_CONF") == 0)) {
        snprintf(buf, len, "%s %s=%s", from, d->conf, v);
    } else if (d->kind == K_BOOL) {
        snprintf(buf, len, "%s (%s)", d->key, from);
    } else {
        snprintf(buf, len, "%s=%s", from, v);
    }
}

#define BAD(f, ...) bad_value(p, (f), __VA_ARGS__)

static rg_status_t bad_value(const rg_agent_params_t *p, rg_agent_field_t f, const char *fmt,
                             ...) RG_PRINTF(3, 4);
static rg_status_t bad_value(const rg_agent_params_t *p, rg_agent_field_t f, const char *fmt,
                             ...)
{
    char label[1200];
    char why[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    rg_agent_params_label(p, f, label, sizeof(label));
    return rg_error(RG_EINVAL, "%s: %s", label, why);
}

static bool job_id_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= 64 &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

static rg_status_t check_program(const rg_agent_params_t *p)
{
    if (p->argc < 1 || p->argv == NULL || p->argv[0] == NULL || p->argv[0][0] == '\0') {
        return rg_error(RG_EINVAL, "no PROGRAM given");
    }
    for (int i = 0; i < p->argc; i++) {
        if (p->argv[i] == NULL) {
            return BAD(RG_AGENT_PROGRAM, "an argument is NULL");
        }
    }
    if (p->n_env < 0 || p->n_env > RG_AGENT_MAX_ENV || (p->n_env > 0 && p->env == NULL)) {
        return BAD(RG_AGENT_ENV, "expected 0 to 64 entries");
    }
    for (int i = 0; i < p->n_env; i++) {
        const char *eq = p->env[i] ? strchr(p->env[i], '=') : NULL;
        if (eq == NULL || eq == p->env[i]) {
            return rg_error(RG_EINVAL, "env[%d] '%s': expected NAME=VALUE", i,
                            p->env[i] ? p->env[i] : "(null)");
        }
    }
    return RG_OK;
}

rg_status_t rg_agent_params_check(const rg_agent_params_t *p)
{
    if (p->min_nodes < 1 || p->max_nodes < 1 || p->min_nodes > RG_RDZV_MAX_NODES ||
        p->max_nodes > RG_RDZV_MAX_NODES) {
        return BAD(RG_AGENT_NNODES, "expected N or MIN:MAX with 1 <= N <= %d",
                   RG_RDZV_MAX_NODES);
    }
    if (p->min_nodes > p->max_nodes) {
        return BAD(RG_AGENT_NNODES, "MIN is larger than MAX");
    }
    if (p->local_addr[0] != '\0' && !rdzv_addr_ok(p->local_addr, p->max_nodes)) {
        /* The closed record of a round holds every node's address in one etcd value. */
        return BAD(RG_AGENT_LOCAL_ADDR, "expected a host name or IP address of 1 to %zu "
                   "characters of A-Z a-z 0-9 . _ : %% - [ ] (with up to %d nodes)",
                   rdzv_addr_max(p->max_nodes), p->max_nodes);
    }
    if (p->nproc < 1 || p->nproc > LAUNCHER_MAX_NPROC) {
        return BAD(RG_AGENT_NPROC, "expected a number of workers from 1 to 256");
    }
    if (!job_id_ok(p->job)) {
        return BAD(RG_AGENT_JOB, "a job id is 1-64 characters of A-Z a-z 0-9 _ . -");
    }
    if (p->last_call_ms < 0 || p->last_call_ms > 3600000) {
        return BAD(RG_AGENT_LAST_CALL, "must be 0..3600 seconds");
    }
    if (p->join_timeout_ms < 100 || p->join_timeout_ms > 86400000) {
        return BAD(RG_AGENT_JOIN_TIMEOUT, "must be 0.1..86400 seconds");
    }
    if (p->lease_ttl_s < 1 || p->lease_ttl_s > 3600) {
        return BAD(RG_AGENT_LEASE_TTL, "must be 1..3600 whole seconds");
    }
    if (p->max_restarts < 0 || p->max_restarts > 1000000) {
        return BAD(RG_AGENT_MAX_RESTARTS, "expected a count from 0 to 1000000");
    }
    if (p->monitor_ms < 1 || p->monitor_ms > 3600000) {
        return BAD(RG_AGENT_MONITOR, "expected seconds in 0.001..3600");
    }
    if (p->hang_ms != 0 && (p->hang_ms < 200 || p->hang_ms > 3600000)) {
        return BAD(RG_AGENT_HANG, "expected 0 (off) or seconds in 0.2..3600");
    }
    if (p->straggler_factor != 0 &&
        !(p->straggler_factor >= 1.1 && p->straggler_factor <= 1000)) {
        return BAD(RG_AGENT_STRAGGLER_FACTOR, "expected 0 (off) or a factor in 1.1..1000");
    }
    if (p->straggler_factor != 0 && p->recovery != RG_AGENT_RECOVERY_IN_PLACE) {
        return BAD(RG_AGENT_STRAGGLER_FACTOR, "a straggler's node leaves as a preempted one "
                   "does and the job regroups in place without it: it needs "
                   "--recovery=in-place");
    }
    if ((unsigned)p->health > RG_AGENT_HEALTH_EVICT) {
        return BAD(RG_AGENT_HEALTH, "expected off, warn or evict");
    }
    if (p->health == RG_AGENT_HEALTH_EVICT && p->recovery != RG_AGENT_RECOVERY_IN_PLACE) {
        return BAD(RG_AGENT_HEALTH, "evict: a node that fails the check leaves as a preempted "
                   "one does and the job regroups in place without it: it needs "
                   "--recovery=in-place (warn names it in either mode)");
    }
    if (p->straggler_window_ms < 1000 || p->straggler_window_ms > 86400000) {
        return BAD(RG_AGENT_STRAGGLER_WINDOW, "expected seconds in 1..86400");
    }
    if (p->grace_ms < 0 || p->grace_ms > 3600000) {
        return BAD(RG_AGENT_GRACE, "expected seconds in 0..3600");
    }
    for (int i = 0; i < LAUNCHER_MAX_NPROC; i++) {
        if (p->redirects < -1 || p->redirects > 3 || p->redirects_map[i] > 3) {
            return BAD(RG_AGENT_REDIRECTS, "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) "
                                           "or a per-local-rank map such as 0:3,1:1");
        }
        if (p->tee < -1 || p->tee > 3 || p->tee_map[i] > 3) {
            return BAD(RG_AGENT_TEE, "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) "
                                     "or a per-local-rank map such as 0:3,1:1");
        }
    }
    if ((unsigned)p->recovery > RG_AGENT_RECOVERY_IN_PLACE) {
        return BAD(RG_AGENT_RECOVERY, "expected restart or in-place");
    }
    if ((unsigned)p->numa > RG_AGENT_NUMA_CORE_COMPLEX) {
        return BAD(RG_AGENT_NUMA, "expected node, socket, exclusive, core-complex or none");
    }
    if ((unsigned)p->notice > RG_AGENT_NOTICE_AUTO) {
        return BAD(RG_AGENT_NOTICE, "expected aws, gce, azure, auto or none");
    }
    if (p->notice != RG_AGENT_NOTICE_NONE && launcher_metadata_url_check() != RG_OK) {
        return RG_EINVAL;   /* the message names the variable */
    }
    if (launcher_preload_check(p) != RG_OK) {
        return RG_EINVAL;   /* the message names the option */
    }
    if (p->numa != RG_AGENT_NUMA_NONE) {
        /* Said now rather than when the workers start: fewer cores than local ranks. */
        cpu_set_t *sets = calloc((size_t)p->nproc, sizeof(*sets));
        rg_status_t st = sets ? launcher_numa_sets(p, sets, p->nproc) : RG_ENOMEM;
        free(sets);
        if (st != RG_OK) {
            return st;
        }
    }
    if (p->standalone) {
        if (p->endpoint[0] != '\0') {
            char ep[1200];
            rg_agent_params_label(p, RG_AGENT_ENDPOINT, ep, sizeof(ep));
            return BAD(RG_AGENT_STANDALONE, "contradicts %s (it starts its own etcd)", ep);
        }
        if (p->max_nodes != 1) {
            return BAD(RG_AGENT_STANDALONE, "is for a single node; --nnodes must be 1");
        }
    } else if (p->endpoint[0] == '\0') {
        return rg_error(RG_EINVAL, "--rdzv-endpoint is required (or --standalone for one node)");
    } else if (p->backend == RG_AGENT_BACKEND_C10D) {
        char host[256];
        int port;
        const char *why;
        if (!launcher_c10d_split(p->endpoint, host, sizeof(host), &port, &why)) {
            return BAD(RG_AGENT_ENDPOINT, "%s", why);
        }
        if (p->cacert[0] != '\0' || p->cert[0] != '\0' || p->user[0] != '\0') {
            return BAD(RG_AGENT_BACKEND, "serves a plain-http etcd without users; TLS and "
                       "passwords need --rdzv-backend=etcd and an etcd of your own");
        }
    }
    if ((p->cert[0] == '\0') != (p->key[0] == '\0')) {
        return BAD(p->cert[0] ? RG_AGENT_CERT : RG_AGENT_KEY, "cert and key go together");
    }
    if ((p->user[0] == '\0') != (p->password[0] == '\0')) {
        return BAD(p->user[0] ? RG_AGENT_USER : RG_AGENT_PASSWORD,
                   "user and password go together");
    }
    return check_program(p);
}

rg_etcd_params_t launcher_etcd_params(const rg_agent_params_t *p, const char *endpoints)
{
    return (rg_etcd_params_t){.endpoints = endpoints,
                              .user = p->user[0] ? p->user : NULL,
                              .password = p->password[0] ? p->password : NULL,
                              .ca_file = p->cacert[0] ? p->cacert : NULL,
                              .cert_file = p->cert[0] ? p->cert : NULL,
                              .key_file = p->key[0] ? p->key : NULL};
}

void rg_agent_params_print(const rg_agent_params_t *p, FILE *out)
{
    fprintf(out, "%-20s %-40s %s\n", "setting", "value", "from");
    for (int f = 0; f < RG_AGENT_NFIELDS; f++) {
        const field_t *d = &fields[f];
        const char *from = p->from[f] ? p->from[f] : "default";
        char v[1100];
        char host[256];
        int port;
        const char *why;
        if (!d->printed) {
            continue;
        }
        if (d->kind == K_MS) {
            snprintf(v, sizeof(v), "%.3f", (double)ms_of(p, (rg_agent_field_t)f) / 1000);
        } else if (f == RG_AGENT_NNODES) {
            snprintf(v, sizeof(v), "%d:%d", p->min_nodes, p->max_nodes);
        } else if ((f == RG_AGENT_ENDPOINT || f == RG_AGENT_BACKEND) && p->standalone) {
            snprintf(v, sizeof(v), "(private etcd)");
        } else if (f == RG_AGENT_ENDPOINT && p->backend == RG_AGENT_BACKEND_C10D &&
                   launcher_c10d_split(p->endpoint, host, sizeof(host), &port, &why)) {
            /* What the agents use: with c10d's default port when none is given. */
            snprintf(v, sizeof(v), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
        } else {
            value_str(p, (rg_agent_field_t)f, v, sizeof(v));
        }
        if (v[0] == '\0' && f == RG_AGENT_LOG_DIR) {
            /* The agent makes one (and keeps it) when some output goes to files. */
            snprintf(v, sizeof(v), "%s",
                     launcher_needs_log_dir(p) ? "(a new temporary directory)" : "(none)");
        } else if (v[0] == '\0' && f == RG_AGENT_LOCAL_ADDR) {
            snprintf(v, sizeof(v), "(auto)");
        }
        fprintf(out, "%-20s %-40s %s\n", d->key, v, from);
        if (f == RG_AGENT_NOTICE && p->notice != RG_AGENT_NOTICE_NONE) {
            /* where the watcher looks (launcher_notice.c) */
            const char *url = getenv("REGROUP_METADATA_URL");
            bool set = url != NULL && url[0] != '\0';
            fprintf(out, "%-20s %-40s %s\n", "metadata_url", set ? url : "http://169.254.169.254",
                    set ? "REGROUP_METADATA_URL" : "default");
        }
    }
}
