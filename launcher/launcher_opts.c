/* Command-line options of `regroup`: torchrun's names, dashed or underscored. */
#include "launcher.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum {
    O_NNODES, O_NPROC, O_RDZV_BACKEND, O_RDZV_ENDPOINT, O_RDZV_ID, O_RDZV_CONF, O_STANDALONE,
    O_MAX_RESTARTS, O_MONITOR, O_ROLE, O_LOG_DIR, O_REDIRECTS, O_TEE, O_LOCAL_ADDR,
    O_NO_PYTHON, O_MODULE, O_NODE_RANK, O_HELP, O_PRINT_CONFIG, O_GRACE, O_COUNT
} opt_id_t;

typedef struct {
    const char *name;     /* dashed spelling; the underscored one is accepted too */
    char        short_name;
    opt_id_t    id;
    bool        value;
    const char *env;      /* REGROUP_* variable read when the flag is absent */
} opt_t;

static const opt_t opts[] = {
    {"nnodes", 0, O_NNODES, true, "REGROUP_NNODES"},
    {"nproc-per-node", 0, O_NPROC, true, "REGROUP_NPROC_PER_NODE"},
    {"rdzv-backend", 0, O_RDZV_BACKEND, true, NULL},
    {"rdzv-endpoint", 0, O_RDZV_ENDPOINT, true, "REGROUP_RDZV_ENDPOINT"},
    {"rdzv-id", 0, O_RDZV_ID, true, "REGROUP_RDZV_ID"},
    {"rdzv-conf", 0, O_RDZV_CONF, true, "REGROUP_RDZV_CONF"},
    {"standalone", 0, O_STANDALONE, false, NULL},
    {"max-restarts", 0, O_MAX_RESTARTS, true, "REGROUP_MAX_RESTARTS"},
    {"monitor-interval", 0, O_MONITOR, true, "REGROUP_MONITOR_INTERVAL"},
    {"role", 0, O_ROLE, true, NULL},
    {"log-dir", 0, O_LOG_DIR, true, "REGROUP_LOG_DIR"},
    {"redirects", 'r', O_REDIRECTS, true, NULL},
    {"tee", 't', O_TEE, true, NULL},
    {"local-addr", 0, O_LOCAL_ADDR, true, "REGROUP_LOCAL_ADDR"},
    {"no-python", 0, O_NO_PYTHON, false, NULL},
    {"module", 'm', O_MODULE, false, NULL},
    {"node-rank", 0, O_NODE_RANK, true, NULL},
    {"help", 'h', O_HELP, false, NULL},
    {"print-config", 0, O_PRINT_CONFIG, false, NULL},
    {"grace-period", 0, O_GRACE, true, "REGROUP_GRACE_PERIOD"},
};

static const char *sources[O_COUNT + 8];
enum { S_LAST_CALL = O_COUNT, S_JOIN_TIMEOUT, S_LEASE_TTL };

void launcher_usage(FILE *out)
{
    fprintf(out,
"usage: regroup [options] PROGRAM [ARGS...]\n"
"       regroup status --rdzv-endpoint=HOST:PORT --rdzv-id=JOB\n"
"\n"
"Runs PROGRAM as --nproc-per-node workers on this node, joined with the other nodes of\n"
"the job through an etcd rendezvous; restarts or regroups them when workers fail, nodes\n"
"are lost or preempted, or nodes join. Workers get torchrun's environment (RANK,\n"
"WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...). Options take '=' or a separate value, and\n"
"'--nproc_per_node' spellings as well as '--nproc-per-node'.\n"
"\n"
"  --nnodes=N|MIN:MAX        nodes in the job (default 1)\n"
"  --nproc-per-node=N        workers on this node (default 1)\n"
"  --rdzv-backend=etcd       the only backend (etcd v3)\n"
"  --rdzv-endpoint=H:P[,...] etcd endpoints, http:// or https://\n"
"  --rdzv-id=JOB             job id shared by the job's nodes (default none)\n"
"  --rdzv-conf=k=v,...       last_call_timeout, join_timeout, lease_ttl (seconds), user,\n"
"                            password, cacert, cert, key, grace_period\n"
"  --standalone              run a private etcd for a single-node job\n"
"  --max-restarts=N          worker failures tolerated before the job fails (default 0)\n"
"  --monitor-interval=S      longest the agent sleeps without looking (default 1)\n"
"  --grace-period=S          SIGTERM to SIGKILL when stopping workers (default 5)\n"
"  --role=NAME               ROLE_NAME of the workers (default 'default')\n"
"  --log-dir=DIR             write each worker's stdout/stderr under DIR\n"
"  -r, --redirects=0|1|2|3   to files instead of the console: 1 stdout, 2 stderr, 3 both\n"
"  -t, --tee=0|1|2|3         to files and the console, lines prefixed with [rank N]\n"
"  --local-addr=ADDR         this node's address (default 127.0.0.1 for a loopback etcd,\n"
"                            else the host name)\n"
"  --no-python               run PROGRAM as is even if it ends in .py\n"
"  -m, --module              run PROGRAM as a python module (python3 -m)\n"
"  --node-rank=N             accepted for torchrun compatibility; ranks come from the\n"
"                            rendezvous\n"
"  --print-config            print every setting and where it came from, then exit\n"
"  -h, --help                this text\n");
}

static int bad(const char *opt, const char *value, const char *why)
{
    fprintf(stderr, "regroup: --%s%s%s: %s (see regroup --help)\n", opt, value ? "=" : "",
            value ? value : "", why);
    return 2;
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

/* Seconds, possibly fractional, as milliseconds. */
static bool parse_seconds(const char *s, double lo, double hi, int64_t *ms)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
        return false;
    }
    *ms = (int64_t)(v * 1000.0 + 0.5);
    return true;
}

static int parse_rdzv_conf(launcher_config_t *cfg, const char *conf, const char *src)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", conf);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        int64_t ms;
        if (eq == NULL) {
            return bad("rdzv-conf", kv, "expected key=value");
        }
        *eq = '\0';
        const char *v = eq + 1;
        if (strcmp(kv, "last_call_timeout") == 0) {
            if (!parse_seconds(v, 0, 3600, &ms)) {
                return bad("rdzv-conf", kv, "last_call_timeout must be 0..3600 seconds");
            }
            cfg->last_call_ms = ms;
            sources[S_LAST_CALL] = src;
        } else if (strcmp(kv, "join_timeout") == 0 || strcmp(kv, "timeout") == 0) {
            if (!parse_seconds(v, 0.1, 86400, &ms)) {
                return bad("rdzv-conf", kv, "join_timeout must be 0.1..86400 seconds");
            }
            cfg->join_timeout_ms = ms;
            sources[S_JOIN_TIMEOUT] = src;
        } else if (strcmp(kv, "lease_ttl") == 0) {
            long ttl;
            if (!parse_int(v, 1, 3600, &ttl)) {
                return bad("rdzv-conf", kv, "lease_ttl must be 1..3600 whole seconds");
            }
            cfg->lease_ttl_s = ttl;
            sources[S_LEASE_TTL] = src;
        } else if (strcmp(kv, "grace_period") == 0) {
            if (!parse_seconds(v, 0, 3600, &cfg->grace_ms)) {
                return bad("rdzv-conf", kv, "grace_period must be 0..3600 seconds");
            }
        } else if (strcmp(kv, "user") == 0 || strcmp(kv, "username") == 0) {
            snprintf(cfg->user, sizeof(cfg->user), "%s", v);
        } else if (strcmp(kv, "password") == 0) {
            snprintf(cfg->password, sizeof(cfg->password), "%s", v);
        } else if (strcmp(kv, "cacert") == 0 || strcmp(kv, "ca") == 0) {
            snprintf(cfg->cacert, sizeof(cfg->cacert), "%s", v);
        } else if (strcmp(kv, "cert") == 0) {
            snprintf(cfg->cert, sizeof(cfg->cert), "%s", v);
        } else if (strcmp(kv, "key") == 0) {
            snprintf(cfg->key, sizeof(cfg->key), "%s", v);
        } else {
            return bad("rdzv-conf", kv, "unknown key");
        }
    }
    return 0;
}

int launcher_parse_rdzv_conf(launcher_config_t *cfg, const char *conf)
{
    return parse_rdzv_conf(cfg, conf, "--rdzv-conf");
}

rg_etcd_params_t launcher_etcd_params(const launcher_config_t *cfg, const char *endpoints)
{
    return (rg_etcd_params_t){.endpoints = endpoints,
                              .user = cfg->user[0] ? cfg->user : NULL,
                              .password = cfg->password[0] ? cfg->password : NULL,
                              .ca_file = cfg->cacert[0] ? cfg->cacert : NULL,
                              .cert_file = cfg->cert[0] ? cfg->cert : NULL,
                              .key_file = cfg->key[0] ? cfg->key : NULL};
}

static int apply(launcher_config_t *cfg, const opt_t *o, const char *v, const char *src)
{
    long n;
    char *colon;

    sources[o->id] = src;
    switch (o->id) {
    case O_NNODES:
        colon = strchr(v, ':');
        if (colon == NULL) {
            if (!parse_int(v, 1, RG_RDZV_MAX_NODES, &n)) {
                return bad(o->name, v, "expected N or MIN:MAX with 1 <= N <= 256");
            }
            cfg->min_nodes = cfg->max_nodes = (int)n;
        } else {
            char lo[32];
            long mn;
            long mx;
            snprintf(lo, sizeof(lo), "%.*s", (int)(colon - v), v);
            if (!parse_int(lo, 1, RG_RDZV_MAX_NODES, &mn) ||
                !parse_int(colon + 1, 1, RG_RDZV_MAX_NODES, &mx)) {
                return bad(o->name, v, "expected N or MIN:MAX with 1 <= N <= 256");
            }
            if (mn > mx) {
                return bad(o->name, v, "MIN is larger than MAX");
            }
            cfg->min_nodes = (int)mn;
            cfg->max_nodes = (int)mx;
        }
        break;
    case O_NPROC:
        if (strcmp(v, "cpu") == 0 || strcmp(v, "auto") == 0) {
            n = sysconf(_SC_NPROCESSORS_ONLN);
        } else if (!parse_int(v, 1, LAUNCHER_MAX_NPROC, &n)) {
            return bad(o->name, v, "expected a number of workers from 1 to 256, or cpu");
        }
        cfg->nproc = (int)n;
        break;
    case O_RDZV_BACKEND:
        if (strcmp(v, "etcd") != 0 && strcmp(v, "etcd-v3") != 0 && strcmp(v, "etcd-v2") != 0) {
            return bad(o->name, v, "the only rendezvous backend is etcd");
        }
        break;
    case O_RDZV_ENDPOINT:
        if (v[0] == '\0') {
            return bad(o->name, v, "empty endpoint");
        }
        snprintf(cfg->endpoint, sizeof(cfg->endpoint), "%s", v);
        break;
    case O_RDZV_ID:
        if (strlen(v) == 0 || strlen(v) > 64 || strspn(v, "abcdefghijklmnopqrstuvwxyz"
                                                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                          "0123456789_.-") != strlen(v)) {
            return bad(o->name, v, "a job id is 1-64 characters of A-Z a-z 0-9 _ . -");
        }
        snprintf(cfg->job, sizeof(cfg->job), "%s", v);
        break;
    case O_RDZV_CONF:
        return parse_rdzv_conf(cfg, v, src);
    case O_STANDALONE:
        cfg->standalone = true;
        break;
    case O_MAX_RESTARTS:
        if (!parse_int(v, 0, 1000000, &n)) {
            return bad(o->name, v, "expected a count from 0");
        }
        cfg->max_restarts = (int)n;
        break;
    case O_MONITOR:
        if (!parse_seconds(v, 0.001, 3600, &cfg->monitor_ms)) {
            return bad(o->name, v, "expected seconds in 0.001..3600");
        }
        break;
    case O_GRACE:
        if (!parse_seconds(v, 0, 3600, &cfg->grace_ms)) {
            return bad(o->name, v, "expected seconds in 0..3600");
        }
        break;
    case O_ROLE:
        snprintf(cfg->role, sizeof(cfg->role), "%s", v);
        break;
    case O_LOG_DIR:
        snprintf(cfg->log_dir, sizeof(cfg->log_dir), "%s", v);
        break;
    case O_REDIRECTS:
    case O_TEE:
        if (!parse_int(v, 0, 3, &n)) {
            return bad(o->name, v, "expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both); "
                                   "per-rank maps are not supported");
        }
        if (o->id == O_TEE) {
            cfg->tee = (int)n;
        } else {
            cfg->redirects = (int)n;
        }
        break;
    case O_LOCAL_ADDR:
        snprintf(cfg->local_addr, sizeof(cfg->local_addr), "%s", v);
        break;
    case O_NO_PYTHON:
        cfg->no_python = true;
        break;
    case O_MODULE:
        cfg->module = true;
        break;
    case O_NODE_RANK:
        if (!parse_int(v, 0, RG_RDZV_MAX_NODES, &n)) {
            return bad(o->name, v, "expected a node rank");
        }
        break;
    case O_PRINT_CONFIG:
        cfg->print_config = true;
        break;
    case O_HELP:
    case O_COUNT:
        break;
    }
    return 0;
}

static const opt_t *find_long(const char *name, size_t len)
{
    char norm[64];
    if (len >= sizeof(norm)) {
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        norm[i] = name[i] == '_' ? '-' : name[i];
    }
    norm[len] = '\0';
    for (size_t i = 0; i < RG_ARRAY_SIZE(opts); i++) {
        if (strcmp(opts[i].name, norm) == 0) {
            return &opts[i];
        }
    }
    return NULL;
}

static bool is_loopback_endpoint(const char *ep)
{
    return strstr(ep, "127.") != NULL || strstr(ep, "localhost") != NULL ||
           strstr(ep, "[::1]") != NULL;
}

int launcher_parse(int argc, char **argv, launcher_config_t *cfg)
{
    bool seen[O_COUNT] = {false};
    int i;
    int rc;

    memset(cfg, 0, sizeof(*cfg));
    memset(sources, 0, sizeof(sources));
    cfg->min_nodes = cfg->max_nodes = 1;
    cfg->nproc = 1;
    snprintf(cfg->job, sizeof(cfg->job), "none");
    cfg->last_call_ms = 1000;
    cfg->join_timeout_ms = 600000;
    cfg->lease_ttl_s = 5;
    cfg->monitor_ms = 1000;
    cfg->grace_ms = 5000;
    snprintf(cfg->role, sizeof(cfg->role), "default");

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const opt_t *o = NULL;
        const char *v = NULL;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') {
            break;   /* the program */
        }
        if (a[1] != '-') {
            for (size_t k = 0; k < RG_ARRAY_SIZE(opts); k++) {
                if (opts[k].short_name == a[1]) {
                    o = &opts[k];
                }
            }
            if (o == NULL) {
                return bad(a + 1, NULL, "unknown option");
            }
            v = a[2] ? a + 2 : NULL;
        } else {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            o = find_long(name, eq ? (size_t)(eq - name) : strlen(name));
            if (o == NULL) {
                fprintf(stderr, "regroup: %s: unknown option (see regroup --help)\n", a);
                return 2;
            }
            v = eq ? eq + 1 : NULL;
        }
        if (o->id == O_HELP) {
            launcher_usage(stdout);
            return 1;
        }
        if (o->value && v == NULL) {
            if (i + 1 >= argc) {
                return bad(o->name, NULL, "needs a value");
            }
            v = argv[++i];
        } else if (!o->value && v != NULL) {
            return bad(o->name, v, "takes no value");
        }
        if (seen[o->id] && o->id != O_RDZV_CONF) {
            return bad(o->name, v, "given twice");
        }
        seen[o->id] = true;
        rc = apply(cfg, o, v ? v : "", "flag");
        if (rc != 0) {
            return rc;
        }
    }
    /* REGROUP_* variables for what the flags left unset. */
    for (size_t k = 0; k < RG_ARRAY_SIZE(opts); k++) {
        const char *env = opts[k].env ? getenv(opts[k].env) : NULL;
        if (env != NULL && env[0] != '\0' && !seen[opts[k].id]) {
            rc = apply(cfg, &opts[k], env, opts[k].env);
            if (rc != 0) {
                return rc;
            }
        }
    }
    cfg->argc = argc - i;
    cfg->argv = argv + i;
    if (cfg->print_config) {
        return 0;
    }
    if (cfg->argc == 0) {
        fprintf(stderr, "regroup: no PROGRAM given (see regroup --help)\n");
        return 2;
    }
    if (cfg->standalone) {
        if (seen[O_RDZV_ENDPOINT]) {
            return bad("standalone", NULL, "contradicts --rdzv-endpoint (it starts its own etcd)");
        }
        if (cfg->max_nodes != 1) {
            return bad("standalone", NULL, "is for a single node; --nnodes must be 1");
        }
    } else if (cfg->endpoint[0] == '\0') {
        fprintf(stderr, "regroup: --rdzv-endpoint is required (or --standalone for one node)\n");
        return 2;
    }
    if (cfg->log_dir[0] == '\0' && (cfg->redirects || cfg->tee)) {
        return bad(cfg->tee ? "tee" : "redirects", NULL, "needs --log-dir");
    }
    if ((cfg->cert[0] == '\0') != (cfg->key[0] == '\0')) {
        return bad("rdzv-conf", NULL, "cert and key go together");
    }
    if ((cfg->user[0] == '\0') != (cfg->password[0] == '\0')) {
        return bad("rdzv-conf", NULL, "user and password go together");
    }
    if (cfg->local_addr[0] == '\0') {
        if (cfg->standalone || is_loopback_endpoint(cfg->endpoint)) {
            snprintf(cfg->local_addr, sizeof(cfg->local_addr), "127.0.0.1");
        } else if (gethostname(cfg->local_addr, sizeof(cfg->local_addr)) != 0) {
            snprintf(cfg->local_addr, sizeof(cfg->local_addr), "127.0.0.1");
        }
    }
    return 0;
}

void launcher_print_config(const launcher_config_t *c, FILE *out)
{
#define SRC(id) (sources[id] ? sources[id] : "default")
    fprintf(out, "%-20s %-40s %s\n", "setting", "value", "from");
    fprintf(out, "%-20s %d:%-38d %s\n", "nnodes", c->min_nodes, c->max_nodes, SRC(O_NNODES));
    fprintf(out, "%-20s %-40d %s\n", "nproc_per_node", c->nproc, SRC(O_NPROC));
    fprintf(out, "%-20s %-40s %s\n", "rdzv_endpoint",
            c->standalone ? "(private etcd)" : c->endpoint, SRC(O_RDZV_ENDPOINT));
    fprintf(out, "%-20s %-40s %s\n", "rdzv_id", c->job, SRC(O_RDZV_ID));
    fprintf(out, "%-20s %-40.3f %s\n", "last_call_timeout", (double)c->last_call_ms / 1000,
            sources[S_LAST_CALL] ? sources[S_LAST_CALL] : "default");
    fprintf(out, "%-20s %-40.3f %s\n", "join_timeout", (double)c->join_timeout_ms / 1000,
            sources[S_JOIN_TIMEOUT] ? sources[S_JOIN_TIMEOUT] : "default");
    fprintf(out, "%-20s %-40lld %s\n", "lease_ttl", (long long)c->lease_ttl_s,
            sources[S_LEASE_TTL] ? sources[S_LEASE_TTL] : "default");
    fprintf(out, "%-20s %-40d %s\n", "max_restarts", c->max_restarts, SRC(O_MAX_RESTARTS));
    fprintf(out, "%-20s %-40.3f %s\n", "monitor_interval", (double)c->monitor_ms / 1000,
            SRC(O_MONITOR));
    fprintf(out, "%-20s %-40.3f %s\n", "grace_period", (double)c->grace_ms / 1000, SRC(O_GRACE));
    fprintf(out, "%-20s %-40s %s\n", "role", c->role, SRC(O_ROLE));
    fprintf(out, "%-20s %-40s %s\n", "log_dir", c->log_dir[0] ? c->log_dir : "(none)",
            SRC(O_LOG_DIR));
    fprintf(out, "%-20s %-40d %s\n", "redirects", c->redirects, SRC(O_REDIRECTS));
    fprintf(out, "%-20s %-40d %s\n", "tee", c->tee, SRC(O_TEE));
    fprintf(out, "%-20s %-40s %s\n", "local_addr", c->local_addr[0] ? c->local_addr : "(auto)",
            SRC(O_LOCAL_ADDR));
#undef SRC
}
