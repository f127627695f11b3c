/*
 * Command-line options of `regroup`: torchrun's names, dashed or underscored, into the agent's
 * parameters. Here only the syntax is checked (a number is a number, a key is known); the
 * ranges and the combinations are checked by rg_agent_params_check, for the trainer too.
 */
#include "launcher.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

typedef enum {
    O_NNODES, O_NPROC, O_RDZV_BACKEND, O_RDZV_ENDPOINT, O_RDZV_ID, O_RDZV_CONF, O_STANDALONE,
    O_MAX_RESTARTS, O_MONITOR, O_ROLE, O_LOG_DIR, O_REDIRECTS, O_TEE, O_LOCAL_ADDR,
    O_NO_PYTHON, O_MODULE, O_PRELOAD, O_NODE_RANK, O_HELP, O_PRINT_CONFIG, O_GRACE, O_MASTER,
    O_START_METHOD, O_RUN_PATH, O_LOGS_SPECS, O_RANKS_FILTER, O_NUMA, O_EVENT_LOG,
    O_VIRTUAL_LOCAL_RANK, O_SIGNALS, O_NOTICE, O_RECOVERY, O_HEALTH, O_COUNT
} opt_id_t;

typedef struct {
    const char *name;     /* dashed spelling; the underscored one is accepted too */
    char        short_name;
    opt_id_t    id;
    bool        value;    /* takes a value (for a flag: may take one, as --flag=V) */
    const char *env;      /* REGROUP_* variable read when the flag is absent */
    int         field;    /* the rg_agent_field_t it sets, -1 if none */
} opt_t;

static const opt_t opts[] = {
    {"nnodes", 0, O_NNODES, true, "REGROUP_NNODES", RG_AGENT_NNODES},
    {"nproc-per-node", 0, O_NPROC, true, "REGROUP_NPROC_PER_NODE", RG_AGENT_NPROC},
    {"rdzv-backend", 0, O_RDZV_BACKEND, true, "REGROUP_RDZV_BACKEND", RG_AGENT_BACKEND},
    {"rdzv-endpoint", 0, O_RDZV_ENDPOINT, true, "REGROUP_RDZV_ENDPOINT", RG_AGENT_ENDPOINT},
    {"rdzv-id", 0, O_RDZV_ID, true, "REGROUP_RDZV_ID", RG_AGENT_JOB},
    {"rdzv-conf", 0, O_RDZV_CONF, true, "REGROUP_RDZV_CONF", -1},
    {"standalone", 0, O_STANDALONE, false, NULL, RG_AGENT_STANDALONE},
    {"max-restarts", 0, O_MAX_RESTARTS, true, "REGROUP_MAX_RESTARTS", RG_AGENT_MAX_RESTARTS},
    {"monitor-interval", 0, O_MONITOR, true, "REGROUP_MONITOR_INTERVAL", RG_AGENT_MONITOR},
    {"role", 0, O_ROLE, true, NULL, RG_AGENT_ROLE},
    {"log-dir", 0, O_LOG_DIR, true, "REGROUP_LOG_DIR", RG_AGENT_LOG_DIR},
    {"redirects", 'r', O_REDIRECTS, true, NULL, RG_AGENT_REDIRECTS},
    {"tee", 't', O_TEE, true, NULL, RG_AGENT_TEE},
    {"local-addr", 0, O_LOCAL_ADDR, true, "REGROUP_LOCAL_ADDR", RG_AGENT_LOCAL_ADDR},
    {"no-python", 0, O_NO_PYTHON, false, NULL, RG_AGENT_NO_PYTHON},
    {"module", 'm', O_MODULE, false, NULL, RG_AGENT_MODULE},
    {"preload", 0, O_PRELOAD, true, "REGROUP_PRELOAD", RG_AGENT_PRELOAD},
    {"node-rank", 0, O_NODE_RANK, true, NULL, -1},
    {"help", 'h', O_HELP, false, NULL, -1},
    {"print-config", 0, O_PRINT_CONFIG, false, NULL, -1},
    {"grace-period", 0, O_GRACE, true, "REGROUP_GRACE_PERIOD", RG_AGENT_GRACE},
    {"master-addr", 0, O_MASTER, true, NULL, -1},
    {"master-port", 0, O_MASTER, true, NULL, -1},
    {"start-method", 0, O_START_METHOD, true, NULL, -1},
    {"run-path", 0, O_RUN_PATH, false, NULL, -1},
    {"logs-specs", 0, O_LOGS_SPECS, true, NULL, -1},
    {"local-ranks-filter", 0, O_RANKS_FILTER, true, NULL, RG_AGENT_RANKS_FILTER},
    {"numa-binding", 0, O_NUMA, true, "REGROUP_NUMA_BINDING", RG_AGENT_NUMA},
    {"recovery", 0, O_RECOVERY, true, "REGROUP_RECOVERY", RG_AGENT_RECOVERY},
    {"event-log-handler", 0, O_EVENT_LOG, true, NULL, -1},
    {"virtual-local-rank", 0, O_VIRTUAL_LOCAL_RANK, false, NULL, -1},
    {"signals-to-handle", 0, O_SIGNALS, true, NULL, -1},
    {"preemption-notice", 0, O_NOTICE, true, "REGROUP_PREEMPTION_NOTICE", RG_AGENT_NOTICE},
    {"health-check", 0, O_HEALTH, false, "REGROUP_HEALTH_CHECK", RG_AGENT_HEALTH},
};

/* torchrun's options that it also reads from PET_<NAME> (its `env` action): all of them but
 * regroup's own (--grace-period, --print-config) and --help. */
static bool has_pet(const opt_t *o)
{
    return o->id != O_HELP && o->id != O_PRINT_CONFIG && o->id != O_GRACE &&
           o->id != O_NOTICE && o->id != O_RECOVERY && o->id != O_PRELOAD &&
           o->id != O_HEALTH;
}

/* "PET_NPROC_PER_NODE" for nproc-per-node. */
static void pet_name(const opt_t *o, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "PET_%s", o->name);
    for (size_t i = 4; i < n && i < cap; i++) {
        buf[i] = buf[i] == '-' ? '_' : (char)(buf[i] >= 'a' && buf[i] <= 'z' ? buf[i] - 32
                                                                                : buf[i]);
    }
}

void launcher_usage(FILE *out)
{
    fprintf(out,
"usage: regroup [options] PROGRAM [ARGS...]\n"
"       regroup status --rdzv-endpoint=HOST:PORT --rdzv-id=JOB\n"
"       regroup etcd-grant --rdzv-endpoint=HOST:PORT --rdzv-id=JOB --password-file=F ...\n"
"\n"
"Runs PROGRAM as --nproc-per-node workers on this node, joined with the other nodes of\n"
"the job through an etcd rendezvous; restarts or regroups them when workers fail, nodes\n"
"are lost or preempted, or nodes join. Workers get torchrun's environment (RANK,\n"
"WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...). Options take '=' or a separate value, and\n"
"'--nproc_per_node' spellings as well as '--nproc-per-node'. Under srun, --rdzv-id,\n"
"--nnodes and --local-addr default to Slurm's job id, the step's node count and the\n"
"node's name (flags and REGROUP_* variables first).\n"
"\n"
"  --nnodes=N|MIN:MAX        nodes in the job (default 1)\n"
"  --nproc-per-node=N|cpu|gpu|auto  workers on this node (default 1); cpu: the usable\n"
"                            cores; gpu: the visible CUDA devices; auto: gpu if any, else cpu\n"
"  --rdzv-backend=etcd|c10d  etcd (default): the etcd v3 endpoints of your own etcd;\n"
"                            c10d: the agent on the endpoint's host serves the rendezvous\n"
"                            (a single-member etcd on that port, default 29400)\n"
"  --rdzv-endpoint=H:P[,...] etcd endpoints, http:// or https://; c10d: one HOST[:PORT]\n"
"  --rdzv-id=JOB             job id shared by the job's nodes (default none)\n"
"  --rdzv-conf=k=v,...       last_call_timeout, join_timeout, lease_ttl, hang_timeout\n"
"                            (seconds; hang_timeout 0 = off, default 1), user,\n"
"                            password or password_file (a file of one line that other\n"
"                            users cannot read), cacert, cert, key, grace_period,\n"
"                            straggler_factor=F (in place: a node whose rank computes\n"
"                            more than F x the others' median for straggler_window\n"
"                            seconds, default 30, leaves as if preempted; default off)\n"
"  --standalone              run a private etcd for a single-node job\n"
"  --max-restarts=N          worker failures tolerated before the job fails (default 0)\n"
"  --recovery=restart|in-place  restart: stop every worker and restart from the last\n"
"                            checkpoint (default); in-place: keep the survivors, replace\n"
"                            only a dead worker (programs that call rg_train_regroup)\n"
"  --monitor-interval=S      longest the agent sleeps without looking (default 1)\n"
"  --grace-period=S          SIGTERM to SIGKILL when stopping workers (default 5)\n"
"  --role=NAME               ROLE_NAME of the workers (default 'default')\n"
"  --log-dir=DIR             write each worker's stdout/stderr under DIR\n"
"  -r, --redirects=0|1|2|3   to files instead of the console: 1 stdout, 2 stderr, 3 both;\n"
"                            or per local rank, 0:3,1:1 (ranks not named: 0); without\n"
"                            --log-dir, in a temporary directory kept after the job\n"
"  -t, --tee=0|1|2|3         to files and the console, lines prefixed with [rank N]\n"
"  --local-addr=ADDR         this node's address (default 127.0.0.1 for a loopback etcd,\n"
"                            else the host name)\n"
"  --no-python               run PROGRAM as is even if it ends in .py\n"
"  -m, --module              run PROGRAM as a python module (python3 -m)\n"
"  --preload=MOD[,MOD...]    fork each worker of a Python PROGRAM from one interpreter that\n"
"                            imported these modules once (e.g. torch): no worker, restarted\n"
"                            or replacing one, imports them again\n"
"  --node-rank=N             ignored, with a warning: node ranks come from the rendezvous\n"
"  --local-ranks-filter=0,1  only these local ranks' output on the console (files: all)\n"
"  --numa-binding=node|socket|exclusive|core-complex  bind each local rank's CPUs\n"
"                            (default: none)\n"
"  --preemption-notice=aws|gce|azure|auto|none  watch the cloud's instance metadata for a\n"
"                            preemption notice (default none): the node then leaves as on\n"
"                            SIGTERM, its workers taking a last checkpoint before the time\n"
"                            the notice gives; REGROUP_METADATA_URL replaces the services'\n"
"                            base URL (http://169.254.169.254)\n"
"  --health-check[=warn|evict|off]  before a group trains (the job's start, a restart, a\n"
"                            node joining in place), measure every rank's links and an\n"
"                            allreduce over the group's transport; name a node whose best\n"
"                            link is 4x below the others' median, or that corrupts data;\n"
"                            evict (in place): that node leaves as if preempted\n"
"  --start-method, --event-log-handler, --signals-to-handle  accepted, no effect\n"
"  --run-path, --logs-specs, --virtual-local-rank  refused, saying why\n"
"  --master-addr, --master-port  torchrun's static rendezvous: not supported; use\n"
"                            --rdzv-backend=c10d --rdzv-endpoint=MASTER_ADDR:PORT\n"
"  --print-config            print every setting and where it came from, then exit\n"
"  -h, --help                this text\n"
"\n"
"Every torchrun option is also read from PET_<OPTION> (PET_NPROC_PER_NODE, ...) as torchrun\n"
"reads it: a flag beats a REGROUP_* variable, which beats a PET_* variable. The whole table:\n"
"docs/torchrun-options.md.\n");
}

static int bad(const char *opt, const char *value, const char *why)
{
    fprintf(stderr, "regroup: --%s%s%s: %s (see regroup --help)\n", opt,
            value && value[0] ? "=" : "",
            value ? value : "", why);
    return 2;
}

/* The same, naming the option as its source gave it: the flag, or the REGROUP_* variable. */
static int bad_src(const opt_t *o, const char *src, const char *value, const char *why)
{
    if (strcmp(src, "flag") == 0) {
        return bad(o->name, value, why);
    }
    fprintf(stderr, "regroup: %s=%s: %s (see regroup --help)\n", src, value, why);
    return 2;
}

/* A whole decimal integer that fits an int; its range is rg_agent_params_check's. */
static bool parse_int(const char *s, int *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < -1000000000L || v > 1000000000L) {
        return false;
    }
    *out = (int)v;
    return true;
}

/* Seconds, possibly fractional, as milliseconds. */
static bool parse_seconds(const char *s, int64_t *ms)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= -1e9 && v <= 1e9)) {
        return false;
    }
    *ms = (int64_t)(v * 1000.0 + (v < 0 ? -0.5 : 0.5));
    return true;
}

/* Copies a string option into its field; too long for the field is an error, not a cut. */
static bool store(char *dst, size_t cap, const char *v)
{
    if (strlen(v) >= cap) {
        return false;
    }
    memcpy(dst, v, strlen(v) + 1);
    return true;
}

static int conf_bad(const char *src, const char *key, const char *why)
{
    fprintf(stderr, "regroup: %s%s%s: %s (see regroup --help)\n", src,
            strcmp(src, "--rdzv-conf") == 0 ? "=" : " ", key, why);
    return 2;
}

static int parse_rdzv_conf(rg_agent_params_t *p, const char *conf, const char *src)
{
    char buf[2048];
    if (!store(buf, sizeof(buf), conf)) {
        return conf_bad(src, "...", "longer than 2047 characters");
    }
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        rg_agent_field_t f;
        bool ok;
        if (eq == NULL) {
            return conf_bad(src, kv, "expected key=value");
        }
        *eq = '\0';
        const char *v = eq + 1;
        if (strcmp(kv, "last_call_timeout") == 0) {
            f = RG_AGENT_LAST_CALL;
            ok = parse_seconds(v, &p->last_call_ms);
        } else if (strcmp(kv, "join_timeout") == 0 || strcmp(kv, "timeout") == 0) {
            f = RG_AGENT_JOIN_TIMEOUT;
            ok = parse_seconds(v, &p->join_timeout_ms);
        } else if (strcmp(kv, "lease_ttl") == 0) {
            int ttl;
            f = RG_AGENT_LEASE_TTL;
            ok = parse_int(v, &ttl);
            p->lease_ttl_s = ok ? ttl : p->lease_ttl_s;
        } else if (strcmp(kv, "hang_timeout") == 0) {
            f = RG_AGENT_HANG;
            ok = parse_seconds(v, &p->hang_ms);
        } else if (strcmp(kv, "straggler_factor") == 0) {
            char *end;
            f = RG_AGENT_STRAGGLER_FACTOR;
            errno = 0;
            p->straggler_factor = strtod(v, &end);
            ok = errno == 0 && end != v && *end == '\0' && isfinite(p->straggler_factor);
        } else if (strcmp(kv, "straggler_window") == 0) {
            f = RG_AGENT_STRAGGLER_WINDOW;
            ok = parse_seconds(v, &p->straggler_window_ms);
        } else if (strcmp(kv, "grace_period") == 0) {
            f = RG_AGENT_GRACE;
            ok = parse_seconds(v, &p->grace_ms);
        } else if (strcmp(kv, "user") == 0 || strcmp(kv, "username") == 0) {
            f = RG_AGENT_USER;
            ok = store(p->user, sizeof(p->user), v);
        } else if (strcmp(kv, "password") == 0) {
            f = RG_AGENT_PASSWORD;
            ok = store(p->password, sizeof(p->password), v);
        } else if (strcmp(kv, "password_file") == 0) {
            /* The password without putting it on a command line every user can read. */
            char what[64];
            snprintf(what, sizeof(what), "%s password_file", src);
            if (launcher_read_secret(v, what, p->password, sizeof(p->password)) != 0) {
                return 2;
            }
            f = RG_AGENT_PASSWORD;
            ok = true;
        } else if (strcmp(kv, "cacert") == 0 || strcmp(kv, "ca") == 0) {
            f = RG_AGENT_CACERT;
            ok = store(p->cacert, sizeof(p->cacert), v);
        } else if (strcmp(kv, "cert") == 0) {
            f = RG_AGENT_CERT;
            ok = store(p->cert, sizeof(p->cert), v);
        } else if (strcmp(kv, "key") == 0) {
            f = RG_AGENT_KEY;
            ok = store(p->key, sizeof(p->key), v);
        } else {
            return conf_bad(src, kv, "unknown key");
        }
        if (!ok) {
            return conf_bad(src, kv, f == RG_AGENT_LEASE_TTL          ? "expected whole seconds"
                                        : f == RG_AGENT_STRAGGLER_FACTOR ? "expected a number"
                                        : f <= RG_AGENT_GRACE            ? "expected seconds"
                                                                         : "too long");
        }
        p->from[f] = src;
    }
    return 0;
}

int launcher_parse_rdzv_conf(rg_agent_params_t *p, const char *conf)
{
    return parse_rdzv_conf(p, conf, "--rdzv-conf");
}

/* name[0..len) into out[cap] with '_' read as '-' (both spellings of an option are one);
 * false if it does not fit. */
static bool norm_name(const char *name, size_t len, char *out, size_t cap)
{
    if (len >= cap) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        out[i] = name[i] == '_' ? '-' : name[i];
    }
    out[len] = '\0';
    return true;
}

int launcher_sub_arg(const char *cmd, int argc, char **argv, int *i, char *name, size_t cap,
                     const char **value)
{
    const char *a = argv[*i];
    const char *eq = strchr(a, '=');

    if (!norm_name(a, eq ? (size_t)(eq - a) : strlen(a), name, cap)) {
        fprintf(stderr, "%s: %s: unknown option\n", cmd, a);
        return 2;
    }
    if (eq != NULL) {
        *value = eq + 1;
    } else if (*i + 1 < argc && strncmp(name, "--", 2) == 0 && strcmp(name, "--help") != 0) {
        *value = argv[++*i];
    } else {
        *value = NULL;
    }
    return 0;
}

static int apply_nnodes(rg_agent_params_t *p, const opt_t *o, const char *v, const char *src)
{
    const char *colon = strchr(v, ':');
    char lo[32];
    if (colon == NULL) {
        if (!parse_int(v, &p->min_nodes)) {
            return bad_src(o, src, v, "expected N or MIN:MAX with 1 <= N <= 256");
        }
        p->max_nodes = p->min_nodes;
        return 0;
    }
    snprintf(lo, sizeof(lo), "%.*s", (int)(colon - v), v);
    if (!parse_int(lo, &p->min_nodes) || !parse_int(colon + 1, &p->max_nodes)) {
        return bad_src(o, src, v, "expected N or MIN:MAX with 1 <= N <= 256");
    }
    return 0;
}

/* --redirects / --tee: one value for every local rank, or torchrun's per-local-rank map
 * "0:3,1:1" (local ranks not named get 0; those at or past --nproc-per-node are ignored, as
 * torchrun ignores them). */
static int parse_std(rg_agent_params_t *p, const opt_t *o, const char *v, const char *src)
{
    static const char why[] = "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a "
                              "per-local-rank map such as 0:3,1:1";
    bool tee = o->id == O_TEE;
    int *value = tee ? &p->tee : &p->redirects;
    unsigned char *map = tee ? p->tee_map : p->redirects_map;
    const char *s = v;

    memset(map, 0, LAUNCHER_MAX_NPROC);
    if (strchr(v, ':') == NULL) {
        return parse_int(v, value) && *value >= 0 ? 0 : bad_src(o, src, v, why);
    }
    *value = -1;
    for (;;) {
        char *end;
        long rank;
        errno = 0;
        rank = strtol(s, &end, 10);
        if (errno != 0 || end == s || *s < '0' || *s > '9' || *end != ':' ||
            end[1] < '0' || end[1] > '3' || (end[2] != ',' && end[2] != '\0')) {
            return bad_src(o, src, v, why);
        }
        if (rank >= LAUNCHER_MAX_NPROC) {
            return bad_src(o, src, v, "local ranks go up to 255 (at most 256 workers a node)");
        }
        map[rank] = (unsigned char)(end[1] - '0');
        if (end[2] == '\0') {
            break;
        }
        s = end + 3;
    }
    return 0;
}

/* torchrun's static rendezvous (--master-addr, --master-port, a --node-rank per node): fixed
 * membership is what an elastic job replaces, and c10d runs the same job with the node ranks
 * from the rendezvous. */
static const char static_why[] =
    "torchrun's fixed membership (--rdzv-backend=static, --master-addr, --master-port) is not "
    "supported; run the same job with --rdzv-backend=c10d --rdzv-endpoint=MASTER_ADDR:PORT and "
    "the same --nnodes (node ranks then come from the rendezvous)";

/* --local-ranks-filter=0,2: the local ranks whose output reaches the console. */
static int parse_ranks_filter(rg_agent_params_t *p, const opt_t *o, const char *v,
                              const char *src)
{
    static const char why[] = "expected local ranks from 0 to 255 separated by commas, such "
                              "as 0 or 0,1";
    const char *s = v;
    memset(p->ranks_shown, 0, sizeof(p->ranks_shown));
    p->ranks_filter = true;
    for (;;) {
        char *end;
        long rank;
        errno = 0;
        rank = strtol(s, &end, 10);
        if (errno != 0 || end == s || *s < '0' || *s > '9' || rank >= LAUNCHER_MAX_NPROC ||
            (*end != ',' && *end != '\0')) {
            return bad_src(o, src, v, why);
        }
        p->ranks_shown[rank] = 1;
        if (*end == '\0') {
            return 0;
        }
        s = end + 1;
    }
}

static int apply(rg_agent_params_t *p, const opt_t *o, const char *v, const char *src,
                 bool *print_config)
{
    bool ok = true;

    if (o->field >= 0) {
        p->from[o->field] = src;
    }
    switch (o->id) {
    case O_NNODES:
        return apply_nnodes(p, o, v, src);
    case O_NPROC:
        if (strcmp(v, "cpu") == 0) {
            p->nproc = launcher_usable_cpus();
        } else if (strcmp(v, "gpu") == 0 || strcmp(v, "auto") == 0) {
            p->nproc = launcher_visible_gpus();
            if (p->nproc == 0 && v[0] == 'g') {
                return bad_src(o, src, v, "no CUDA device is visible (none in "
                               "/proc/driver/nvidia/gpus, or CUDA_VISIBLE_DEVICES hides them); "
                               "use a number or cpu");
            }
            if (p->nproc == 0) {
                p->nproc = launcher_usable_cpus();   /* auto: cpu without a GPU, as torchrun */
            }
        } else if (!parse_int(v, &p->nproc)) {
            return bad_src(o, src, v, "expected a number of workers from 1 to 256, or cpu, gpu "
                           "or auto");
        }
        break;
    case O_RDZV_BACKEND:
        if (strcmp(v, "etcd") == 0 || strcmp(v, "etcd-v3") == 0 || strcmp(v, "etcd-v2") == 0) {
            p->backend = RG_AGENT_BACKEND_ETCD;
        } else if (strcmp(v, "c10d") == 0) {
            p->backend = RG_AGENT_BACKEND_C10D;
        } else if (strcmp(v, "static") == 0) {
            return bad_src(o, src, v, static_why);
        } else {
            return bad_src(o, src, v, "expected etcd (an etcd of your own) or c10d (the agent "
                           "on the endpoint's host serves the rendezvous)");
        }
        break;
    case O_RDZV_ENDPOINT:
        if (v[0] == '\0') {
            return bad_src(o, src, v, "empty endpoint");
        }
        ok = store(p->endpoint, sizeof(p->endpoint), v);
        break;
    case O_RDZV_ID: ok = store(p->job, sizeof(p->job), v); break;
    case O_RDZV_CONF: return parse_rdzv_conf(p, v, strcmp(src, "flag") ? src : "--rdzv-conf");
    case O_STANDALONE: p->standalone = true; break;
    case O_MAX_RESTARTS:
        if (!parse_int(v, &p->max_restarts)) {
            return bad_src(o, src, v, "expected a count from 0");
        }
        break;
    case O_MONITOR:
    case O_GRACE:
        if (!parse_seconds(v, o->id == O_MONITOR ? &p->monitor_ms : &p->grace_ms)) {
            return bad_src(o, src, v, "expected a number of seconds");
        }
        break;
    case O_ROLE: ok = store(p->role, sizeof(p->role), v); break;
    case O_LOG_DIR: ok = store(p->log_dir, sizeof(p->log_dir), v); break;
    case O_REDIRECTS:
    case O_TEE:
        return parse_std(p, o, v, src);
    case O_LOCAL_ADDR: ok = store(p->local_addr, sizeof(p->local_addr), v); break;
    case O_NO_PYTHON: p->no_python = true; break;
    case O_MODULE: p->module = true; break;
    case O_PRELOAD: ok = store(p->preload, sizeof(p->preload), v); break;
    case O_NODE_RANK: {
        int n;
        if (!parse_int(v, &n) || n < 0 || n > RG_RDZV_MAX_NODES) {
            return bad_src(o, src, v, "expected a node rank");
        }
        fprintf(stderr, "regroup: %s%s%s ignored: node ranks come from the rendezvous (a node "
                "keeps its rank across rounds)\n", strcmp(src, "flag") ? src : "--node-rank",
                "=", v);
        break;
    }
    case O_START_METHOD:
        if (strcmp(v, "spawn") != 0 && strcmp(v, "fork") != 0 &&
            strcmp(v, "forkserver") != 0) {
            return bad_src(o, src, v, "expected spawn, fork or forkserver");
        }
        break;   /* no effect: workers are always fork and exec of PROGRAM */
    case O_EVENT_LOG:
    case O_SIGNALS:
        break;   /* no effect (docs/torchrun-options.md) */
    case O_RUN_PATH:
        return bad_src(o, src, v, "regroup runs PROGRAM as a process, not a script inside its "
                       "own interpreter; give the script as PROGRAM (a .py runs under python3 "
                       "-u) or run python3 -m for a module (-m)");
    case O_LOGS_SPECS:
        return bad_src(o, src, v, "torchrun's LogsSpecs plugins are Python classes; regroup has "
                       "its own logs: --log-dir, --redirects, --tee, --local-ranks-filter");
    case O_VIRTUAL_LOCAL_RANK:
        return bad_src(o, src, v, "not supported: every worker gets its own LOCAL_RANK; to give "
                       "each one device, set CUDA_VISIBLE_DEVICES from LOCAL_RANK in the "
                       "program");
    case O_RANKS_FILTER:
        return parse_ranks_filter(p, o, v, src);
    case O_NUMA:
        if (strcmp(v, "none") == 0) {
            p->numa = RG_AGENT_NUMA_NONE;
        } else if (strcmp(v, "node") == 0) {
            p->numa = RG_AGENT_NUMA_NODE;
        } else if (strcmp(v, "socket") == 0) {
            p->numa = RG_AGENT_NUMA_SOCKET;
        } else if (strcmp(v, "exclusive") == 0) {
            p->numa = RG_AGENT_NUMA_EXCLUSIVE;
        } else if (strcmp(v, "core-complex") == 0 || strcmp(v, "core_complex") == 0) {
            p->numa = RG_AGENT_NUMA_CORE_COMPLEX;
        } else {
            return bad_src(o, src, v, "expected node, socket, exclusive, core-complex or none");
        }
        break;
    case O_NOTICE: {
        static const char *const names[] = {"none", "aws", "gce", "azure", "auto"};
        size_t k = 0;
        while (k < RG_ARRAY_SIZE(names) && strcmp(v, names[k]) != 0) {
            k++;
        }
        if (k == RG_ARRAY_SIZE(names)) {
            return bad_src(o, src, v, "expected aws, gce, azure, auto or none");
        }
        p->notice = (rg_agent_notice_t)k;
        break;
    }
    case O_RECOVERY:
        if (strcmp(v, "restart") == 0) {
            p->recovery = RG_AGENT_RECOVERY_RESTART;
        } else if (strcmp(v, "in-place") == 0 || strcmp(v, "in_place") == 0) {
            p->recovery = RG_AGENT_RECOVERY_IN_PLACE;
        } else {
            return bad_src(o, src, v, "expected restart or in-place");
        }
        break;
    case O_HEALTH:
        /* (The flag alone: warn.) */
        if (v[0] == '\0' || strcmp(v, "warn") == 0) {
            p->health = RG_AGENT_HEALTH_WARN;
        } else if (strcmp(v, "evict") == 0) {
            p->health = RG_AGENT_HEALTH_EVICT;
        } else if (strcmp(v, "off") == 0) {
            p->health = RG_AGENT_HEALTH_OFF;
        } else {
            return bad_src(o, src, v, "expected warn, evict or off");
        }
        break;
    case O_MASTER: return bad_src(o, src, v, static_why);
    case O_PRINT_CONFIG: *print_config = true; break;
    case O_HELP:
    case O_COUNT:
        break;
    }
    return ok ? 0 : bad_src(o, src, v, "too long");
}

static const opt_t *find_long(const char *name, size_t len)
{
    char norm[64];
    if (!norm_name(name, len, norm, sizeof(norm))) {
        return NULL;
    }
    for (size_t i = 0; i < RG_ARRAY_SIZE(opts); i++) {
        if (strcmp(opts[i].name, norm) == 0) {
            return &opts[i];
        }
    }
    return NULL;
}

/* The PET_* name of o, in storage that lasts (p->from points at it). */
static const char *pet_src(const opt_t *o)
{
    static char names[RG_ARRAY_SIZE(opts)][48];
    size_t k = (size_t)(o - opts);
    pet_name(o, names[k], sizeof(names[k]));
    return names[k];
}

/* One argument (and perhaps the next, its value): 0, 1 (help), 2 (error), or -1 for the end
 * of the options. */
static int parse_arg(int argc, char **argv, int *i, rg_agent_params_t *p, bool *seen,
                     bool *print_config)
{
    const char *a = argv[*i];
    const opt_t *o = NULL;
    const char *v = NULL;

    if (a[0] != '-' || a[1] == '\0') {
        return -1;   /* the program */
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
        if (*i + 1 >= argc) {
            return bad(o->name, NULL, "needs a value");
        }
        v = argv[++*i];
    } else if (!o->value && v != NULL && o->id != O_HEALTH) {
        return bad(o->name, v, "takes no value");
    }
    if (seen[o->id] && o->id != O_RDZV_CONF) {
        return bad(o->name, v, "given twice");
    }
    seen[o->id] = true;
    return apply(p, o, v ? v : "", "flag", print_config);
}

int launcher_parse(int argc, char **argv, rg_agent_params_t *p, bool *print_config)
{
    bool seen[O_COUNT] = {false};
    int i;
    int rc;

    rg_agent_params_init(p);
    *print_config = false;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        rc = parse_arg(argc, argv, &i, p, seen, print_config);
        if (rc < 0) {
            break;
        }
        if (rc != 0) {
            return rc;
        }
    }
    /* REGROUP_* variables for what the flags left unset. --standalone decides the endpoint:
     * a REGROUP_RDZV_ENDPOINT in the environment does not contradict it. */
    for (size_t k = 0; k < RG_ARRAY_SIZE(opts); k++) {
        const char *env = opts[k].env ? getenv(opts[k].env) : NULL;
        if (env == NULL || env[0] == '\0' || seen[opts[k].id] ||
            (opts[k].id == O_RDZV_ENDPOINT && p->standalone)) {
            continue;
        }
        rc = apply(p, &opts[k], env, opts[k].env, print_config);
        if (rc != 0) {
            return rc;
        }
    }
    /* Then torchrun's PET_* variables (its `env` action) for what is still unset; a flag
     * without a value is set by PET_X=1 (or true, yes, on) and left by 0 (false, no, off). */
    for (size_t k = 0; k < RG_ARRAY_SIZE(opts); k++) {
        const opt_t *o = &opts[k];
        const char *env_set = o->env ? getenv(o->env) : NULL;
        char name[64];
        if (!has_pet(o) || seen[o->id] || (env_set != NULL && env_set[0] != '\0') ||
            (o->id == O_RDZV_ENDPOINT && p->standalone)) {
            continue;
        }
        pet_name(o, name, sizeof(name));
        const char *env = getenv(name);
        if (env == NULL || env[0] == '\0') {
            continue;
        }
        if (!o->value) {
            if (strcasecmp(env, "0") == 0 || strcasecmp(env, "false") == 0 ||
                strcasecmp(env, "no") == 0 || strcasecmp(env, "off") == 0) {
                continue;
            }
            if (strcasecmp(env, "1") != 0 && strcasecmp(env, "true") != 0 &&
                strcasecmp(env, "yes") != 0 && strcasecmp(env, "on") != 0) {
                fprintf(stderr, "regroup: %s=%s: expected 1 or 0 (true or false) "
                        "(see regroup --help)\n", name, env);
                return 2;
            }
        }
        /* the variable's name outlives the parse: p->from keeps it */
        const char *src = pet_src(o);
        rc = apply(p, o, env, src, print_config);
        if (rc != 0) {
            return rc;
        }
        seen[o->id] = true;
        if (o->id == O_STANDALONE && p->endpoint[0] != '\0' && p->from[RG_AGENT_ENDPOINT] &&
            strcmp(p->from[RG_AGENT_ENDPOINT], "flag") != 0) {
            /* as with the flag: standalone decides; an endpoint variable does not contradict */
            p->endpoint[0] = '\0';
            p->from[RG_AGENT_ENDPOINT] = NULL;
        }
    }
    /* Under srun, Slurm's values for what none of those gave (launcher_slurm.c). */
    rc = launcher_slurm_defaults(p);
    if (rc != 0) {
        return rc;
    }
    p->argc = argc - i;
    p->argv = argv + i;
    if (*print_config) {
        return 0;
    }
    if (rg_agent_params_check(p) != RG_OK) {
        fprintf(stderr, "regroup: %s (see regroup --help)\n", rg_last_error());
        return 2;
    }
    return 0;
}
