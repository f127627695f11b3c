/*
 * rg-bench-launcher: the launcher's own cost, side by side with torchrun.
 *
 *   rg-bench-launcher [--reps=N] [--only=regroup|torchrun] [--settings=default,tuned]
 *                     [--scenarios=a,b,...] [--worker=PATH] [--timeout=S]
 *                     [--idle-seconds=S] [--idle-reps=N]
 *
 * Workers are a shell script (tests/data/rg_test_worker.sh) that appends
 * "start ROUND RANK WORLD RESTART PID ... UNIX_TIME" to an events file and waits. Each
 * scenario injects an event, notes the wall time, and waits (at most --timeout seconds, 90 by
 * default) until every worker of the new round has written its start line; the figure is
 * (latest such start) - (event time), from the workers' own timestamps. One JSON object per
 * launcher, settings and scenario:
 *   {"bench":"launcher","launcher":..,"settings":..,"args":..,"scenario":..,"reps":..,
 *    "failed":..,"median_s":..,"min_s":..,"max_s":..,"commit":..,"build":..}
 * reps counts the repetitions behind the figures, failed those that did not reach the new
 * round within the timeout (or did not start): they are not in the median.
 * Settings: "default" runs each launcher with its own defaults; "tuned" with the settings the
 * project's figures used (regroup: lease_ttl=2, last_call_timeout=1, monitor interval 1 s;
 * torchrun: monitor_interval=0.1, last_call_timeout=1). torchrun is PyTorch's
 * (/usr/bin/python3 -m torch.distributed.run), c10d backend; torch 1.13 on Python 3.11 needs
 * --redirects and --tee of 1 or 2, so both its rows pass --redirects=1 --tee=1.
 * Scenarios: worker_kill_1node (1 agent x 4 workers), worker_kill_3nodes (3 x 2),
 * agent_sigterm (3 x 2 -> 2 x 2), agent_sigkill (3 x 2 -> 2 x 2), start_8 (8 agents,
 * MIN=MAX=8, from the last agent's start to all 8 workers running), idle_cpu (1 agent x 4
 * idle workers: the agent's CPU share in percent over --idle-seconds, 60 by default,
 * --idle-reps times, 3 by default; also the clock ticks counted), and, only when named,
 * node_lost_kill and node_lost_freeze (3 x 2 -> 2 x 2: agent 2 and all its workers killed at
 * once, or frozen with SIGSTOP, a hung or cut-off node), meant for --worker=ddp
 * (bench/rg_bench_ddp_worker.py: PyTorch DDP over gloo, a real allreduce every step, so that
 * the survivors learn of the loss through their collectives as well as through the launcher;
 * RG_BENCH_GLOO_TIMEOUT sets its process group's timeout, PyTorch's default 1800 s).
 */
#include "etcd_server.h"
#include "rg_bench_meta.h"
#include "rg_common.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_AGENTS 8
#define MAX_REPS   20

typedef enum { L_REGROUP, L_TORCHRUN } launcher_t;
static const char *const lnames[] = {"regroup", "torchrun"};
typedef enum { S_DEFAULT, S_TUNED } settings_t;
static const char *const snames[] = {"default", "tuned"};
/* The settings' own arguments, as the JSON's "args" shows them. */
static const char *const regroup_args[2][3] = {
    {NULL},
    {"--rdzv-conf=lease_ttl=2,last_call_timeout=1", "--monitor-interval=1", NULL}};
static const char *const torchrun_args[2][3] = {
    {NULL},
    {"--rdzv_conf=last_call_timeout=1", "--monitor_interval=0.1", NULL}};
static settings_t settings;
static int timeout_s = 90;

static char dir[256];
static char worker[512];
static char regroup_bin[512];
static rg_etcd_server_t etcd;
static pid_t agents[MAX_AGENTS];
static int store_port;
static const char *scenarios;   /* NULL: all */

static bool named(const char *name);

/* Every scenario but the node_lost ones (which want --worker=ddp) runs unless --scenarios
 * names some. */
static bool wanted(const char *name)
{
    if (scenarios == NULL) {
        return strncmp(name, "node_lost", 9) != 0;
    }
    return named(name);
}

static bool named(const char *name)
{
    if (scenarios == NULL) {
        return false;
    }
    size_t n = strlen(name);
    for (const char *p = strstr(scenarios, name); p != NULL; p = strstr(p + 1, name)) {
        if ((p == scenarios || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) {
            return true;
        }
    }
    return false;
}

static double wall(void)
{
    return rg_wall_s();
}

static void start_agent(launcher_t l, int i, const char *nnodes, int nproc, const char *job)
{
    char log[300];
    char np[32];
    char nn[64];
    char ep[600];
    char id[128];
    char *argv[24];
    int a = 0;
    snprintf(log, sizeof(log), "%s/agent%d.log", dir, i);
    snprintf(np, sizeof(np), "--nproc_per_node=%d", nproc);
    snprintf(nn, sizeof(nn), "--nnodes=%s", nnodes);
    snprintf(id, sizeof(id), "--rdzv_id=%s", job);
    if (l == L_REGROUP) {
        snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.endpoints);
        argv[a++] = regroup_bin;
        argv[a++] = nn;
        argv[a++] = np;
        argv[a++] = ep;
        argv[a++] = id;
        argv[a++] = "--max-restarts=1000";
        argv[a++] = "--no-python"; /* as torchrun's --no_python: the worker runs as is */
        for (int k = 0; regroup_args[settings][k] != NULL; k++) {
            argv[a++] = (char *)regroup_args[settings][k];
        }
    } else {
        snprintf(ep, sizeof(ep), "--rdzv_endpoint=127.0.0.1:%d", store_port);
        argv[a++] = "/usr/bin/python3";
        argv[a++] = "-m";
        argv[a++] = "torch.distributed.run";
        argv[a++] = nn;
        argv[a++] = np;
        argv[a++] = "--rdzv_backend=c10d";
        argv[a++] = ep;
        argv[a++] = id;
        argv[a++] = "--max_restarts=1000";
        argv[a++] = "--redirects=1";
        argv[a++] = "--tee=1";
        argv[a++] = "--no_python";
        for (int k = 0; torchrun_args[settings][k] != NULL; k++) {
            argv[a++] = (char *)torchrun_args[settings][k];
        }
    }
    argv[a++] = worker;
    argv[a] = NULL;
    agents[i] = rg_proc_spawn(argv, log);
}

static void stop_all(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/stop", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fclose(f);
    }
    for (int i = 0; i < MAX_AGENTS; i++) {
        if (agents[i] > 0) {
            if (rg_proc_wait(agents[i], 15000) < 0) {
                kill(agents[i], SIGKILL);
                waitpid(agents[i], NULL, 0);
            }
            agents[i] = 0;
        }
    }
    static const char *const names[] = {"stop", "events"};
    for (size_t i = 0; i < 2; i++) {
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (unlink(path) != 0 && errno != ENOENT) {
            fprintf(stderr, "rg-bench-launcher: cleanup failed: %s: %s\n", path,
                    strerror(errno));
        }
    }
}

typedef struct {
    int    world;
    int    restart;
    int    rank;
    pid_t  pid;
    double t;
} start_t;

static int read_starts(start_t *s, int max)
{
    char path[300];
    char line[512];
    int n = 0;
    snprintf(path, sizeof(path), "%s/events", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    while (n < max && fgets(line, sizeof(line), f)) {
        int round;
        int pid;
        int lr;
        int gr;
        if (sscanf(line, "start %d %d %d %d %d %d %d %lf", &round, &s[n].rank, &s[n].world,
                   &s[n].restart, &pid, &lr, &gr, &s[n].t) == 8) {
            s[n].pid = pid;
            n++;
        }
    }
    fclose(f);
    return n;
}

/* Waits for `count` starts at `world` after index from; returns the latest start time, or
 * -1 on timeout. *next gets the index after them. */
static double wait_starts(int from, int count, int world, int timeout_ms, int *next)
{
    static start_t s[8192];
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (rg_now_ns() < until) {
        int n = read_starts(s, 8192);
        int got = 0;
        double latest = 0;
        for (int i = from; i < n; i++) {
            if (s[i].world == world) {
                latest = RG_MAX(latest, s[i].t);
                if (++got == count) {
                    if (next) {
                        *next = i + 1;
                    }
                    return latest;
                }
            }
        }
        rg_sleep_ms(2);
    }
    return -1;
}

static pid_t worker_pid(int index)
{
    static start_t s[8192];
    int n = read_starts(s, 8192);
    return index < n ? s[index].pid : -1;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report_args(launcher_t l)
{
    const char *const *args = l == L_REGROUP ? regroup_args[settings] : torchrun_args[settings];
    printf("\"args\":\"");
    for (int k = 0; args[k] != NULL; k++) {
        printf("%s%s", k ? " " : "", args[k]);
    }
    if (l == L_TORCHRUN) {
        printf("%s--redirects=1 --tee=1", args[0] ? " " : "");
    }
    printf("\"");
}

static void report(launcher_t l, const char *scenario, double *v, int n, int failed,
                   const char *unit, const char *extra)
{
    printf("{\"bench\":\"launcher\",\"launcher\":\"%s\",\"settings\":\"%s\",", lnames[l],
           snames[settings]);
    report_args(l);
    printf(",\"scenario\":\"%s\",\"reps\":%d,\"failed\":%d,\"timeout_s\":%d,", scenario, n,
           failed, timeout_s);
    if (n == 0) {
        printf("\"error\":\"no successful repetition\",");
    } else {
        qsort(v, (size_t)n, sizeof(double), cmp_d);
        double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        printf("\"median_%s\":%.4f,\"min_%s\":%.4f,\"max_%s\":%.4f,", unit, med, unit, v[0],
               unit, v[n - 1]);
    }
    printf("%s%s}\n", extra ? extra : "", RG_BENCH_META);
    fflush(stdout);
}

static void new_job(char *job, size_t len, const char *scenario, int rep)
{
    snprintf(job, len, "%s-%s-%d-%d", scenario, snames[settings], rep, (int)getpid());
    store_port = rg_free_port();
}

/* torchrun's first agent hosts the c10d store: the others must not start (and take the
 * port) before it listens, and the scenarios then never kill the host. */
static bool store_listening(int timeout_ms)
{
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (rg_now_ns() < until) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)store_port)};
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        if (fd >= 0) {
            close(fd);
        }
        if (ok) {
            return true;
        }
        rg_sleep_ms(20);
    }
    return false;
}

/* Starts n agents of nproc workers and waits until all run at world n*nproc. */
static int bring_up(launcher_t l, int n, int nproc, const char *nnodes, const char *job,
                    int *at)
{
    for (int i = 0; i < n; i++) {
        start_agent(l, i, nnodes, nproc, job);
        if (i == 0 && l == L_TORCHRUN && !store_listening(30000)) {
            return -1;
        }
    }
    return wait_starts(0, n * nproc, n * nproc, 60000, at) < 0 ? -1 : 0;
}

static void scenario_worker_kill(launcher_t l, int nodes, int nproc, int reps)
{
    double v[MAX_REPS];
    int ok = 0;
    char job[96];
    char name[64];
    snprintf(name, sizeof(name), "worker_kill_%dnode%s", nodes, nodes > 1 ? "s" : "");
    for (int r = 0; r < reps; r++) {
        int at;
        new_job(job, sizeof(job), name, r);
        if (bring_up(l, nodes, nproc, nodes > 1 ? "2:3" : "1", job, &at) == 0) {
            pid_t victim = worker_pid(1);
            double t0 = wall();
            kill(victim, SIGKILL);
            double t1 = wait_starts(at, nodes * nproc, nodes * nproc, timeout_s * 1000, NULL);
            if (t1 > 0) {
                v[ok++] = t1 - t0;
            }
        }
        stop_all();
    }
    report(l, name, v, ok, reps - ok, "s", NULL);
}

static void scenario_agent(launcher_t l, int sig, int reps)
{
    double v[MAX_REPS];
    int ok = 0;
    char job[96];
    const char *name = sig == SIGTERM ? "agent_sigterm" : "agent_sigkill";
    for (int r = 0; r < reps; r++) {
        int at;
        new_job(job, sizeof(job), name, r);
        if (bring_up(l, 3, 2, "2:3", job, &at) == 0) {
            double t0 = wall();
            kill(agents[2], sig);
            double t1 = wait_starts(at, 4, 4, timeout_s * 1000, NULL);
            if (t1 > 0) {
                v[ok++] = t1 - t0;
            }
        }
        stop_all();
    }
    report(l, name, v, ok, reps - ok, "s", NULL);
}

/* The processes of pid's tree: pid and every descendant (from /proc's parent links). */
static int proc_tree(pid_t pid, pid_t *out, int max)
{
    int n = 0;
    out[n++] = pid;
    /* Bounded: each pass adds the children of those found so far; a tree is a few deep. */
    for (int pass = 0; pass < 8; pass++) {
        DIR *d = opendir("/proc");
        int before = n;
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL && n < max) {
            int64_t p;
            char path[300];
            int ppid = 0;
            if (!rg_parse_i64(e->d_name, &p)) {
                continue;
            }
            snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
            FILE *f = fopen(path, "r");
            if (f == NULL) {
                continue;
            }
            char buf[512];
            size_t len = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[len] = '\0';
            const char *rp = strrchr(buf, ')');
            if (rp == NULL || sscanf(rp + 1, " %*c %d", &ppid) != 1) {
                continue;
            }
            bool child = false;
            bool known = false;
            for (int i = 0; i < n; i++) {
                child |= out[i] == ppid;
                known |= out[i] == (pid_t)p;
            }
            if (child && !known) {
                out[n++] = (pid_t)p;
            }
        }
        if (d != NULL) {
            closedir(d);
        }
        if (n == before) {
            break;
        }
    }
    return n;
}

static pid_t frozen[64];
static int n_frozen;

/* A node lost with its workers: agent 2 and all its processes killed at once ("kill": the
 * kernel closes their sockets, so the peers' collectives fail at once), or frozen ("freeze":
 * a hung or cut-off node; the sockets stay open and the peers' collectives wait for their
 * timeout). The survivors must regroup at world 4. */
static void scenario_node_lost(launcher_t l, bool freeze, int reps)
{
    double v[MAX_REPS];
    int ok = 0;
    char job[96];
    const char *name = freeze ? "node_lost_freeze" : "node_lost_kill";
    for (int r = 0; r < reps; r++) {
        int at;
        new_job(job, sizeof(job), name, r);
        if (bring_up(l, 3, 2, "2:3", job, &at) == 0) {
            pid_t tree[64];
            int n = proc_tree(agents[2], tree, 64);
            for (int i = 0; i < n; i++) {
                kill(tree[i], SIGSTOP); /* all at once: none sees another go first */
            }
            double t0 = wall();
            if (freeze) {
                memcpy(frozen, tree, (size_t)n * sizeof(pid_t));
                n_frozen = n;
            } else {
                for (int i = 0; i < n; i++) {
                    kill(tree[i], SIGKILL);
                }
            }
            double t1 = wait_starts(at, 4, 4, timeout_s * 1000, NULL);
            if (t1 > 0) {
                v[ok++] = t1 - t0;
            }
        }
        for (int i = 0; i < n_frozen; i++) {
            kill(frozen[i], SIGKILL);
        }
        n_frozen = 0;
        stop_all();
    }
    char extra[700];
    snprintf(extra, sizeof(extra), "\"worker\":\"%s\",\"gloo_timeout_s\":\"%s\",",
             strrchr(worker, '/') ? strrchr(worker, '/') + 1 : worker,
             getenv("RG_BENCH_GLOO_TIMEOUT") && strlen(getenv("RG_BENCH_GLOO_TIMEOUT")) < 16
                 ? getenv("RG_BENCH_GLOO_TIMEOUT")
                 : "1800");
    report(l, name, v, ok, reps - ok, "s", extra);
}

static void scenario_start8(launcher_t l, int reps)
{
    double v[MAX_REPS];
    int ok = 0;
    char job[96];
    for (int r = 0; r < reps; r++) {
        new_job(job, sizeof(job), "start_8", r);
        double t_last = 0;
        for (int i = 0; i < 8; i++) {
            t_last = wall();
            start_agent(l, i, "8", 1, job);
            if (i == 0 && l == L_TORCHRUN && !store_listening(30000)) {
                break;
            }
        }
        double t1 = wait_starts(0, 8, 8, timeout_s * 1000, NULL);
        if (t1 > 0) {
            v[ok++] = t1 - t_last;
        }
        stop_all();
    }
    report(l, "start_8", v, ok, reps - ok, "s", NULL);
}

/* The process's user + system CPU time in clock ticks. */
static long cpu_ticks(pid_t pid)
{
    char path[64];
    unsigned long ut = 0;
    unsigned long stt = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt) != 2) {
        fclose(f);
        return -1;
    }
    fclose(f);
    return (long)(ut + stt);
}

static void scenario_idle(launcher_t l, int reps, int seconds)
{
    double v[MAX_REPS];
    long ticks = 0;
    int ok = 0;
    char job[96];
    char extra[160];
    for (int r = 0; r < reps; r++) {
        int at;
        new_job(job, sizeof(job), "idle", r);
        if (bring_up(l, 1, 4, "1", job, &at) == 0) {
            long c0 = cpu_ticks(agents[0]);
            double t0 = wall();
            rg_sleep_ms((uint64_t)seconds * 1000);
            long c1 = cpu_ticks(agents[0]);
            double el = wall() - t0;
            if (c0 >= 0 && c1 >= c0) {
                ticks += c1 - c0;
                v[ok++] = 100.0 * (double)(c1 - c0) / (double)sysconf(_SC_CLK_TCK) / el;
            }
        }
        stop_all();
    }
    snprintf(extra, sizeof(extra), "\"idle_seconds\":%d,\"ticks_total\":%ld,\"tick_s\":%.3f,",
             seconds, ticks, 1.0 / (double)sysconf(_SC_CLK_TCK));
    report(l, "idle_cpu", v, ok, reps - ok, "pct", extra);
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (!rg_parse_i64(s, &v) || v < lo || v > hi) {
        return false;
    }
    *out = (int)v;
    return true;
}

int main(int argc, char **argv)
{
    int reps = 5;
    int idle_reps = 3;
    int idle_seconds = 60;
    const char *only = NULL;
    const char *settings_list = "default,tuned";
    bool ok = true;

    snprintf(regroup_bin, sizeof(regroup_bin), "%s", RG_BENCH_REGROUP);
    snprintf(worker, sizeof(worker), "%s", RG_BENCH_WORKER);
    for (int i = 1; i < argc && ok; i++) {
        if (strncmp(argv[i], "--reps=", 7) == 0) {
            ok = parse_int(argv[i] + 7, 1, MAX_REPS, &reps);
        } else if (strncmp(argv[i], "--idle-reps=", 12) == 0) {
            ok = parse_int(argv[i] + 12, 1, MAX_REPS, &idle_reps);
        } else if (strncmp(argv[i], "--idle-seconds=", 15) == 0) {
            ok = parse_int(argv[i] + 15, 1, 3600, &idle_seconds);
        } else if (strncmp(argv[i], "--timeout=", 10) == 0) {
            ok = parse_int(argv[i] + 10, 1, 3600, &timeout_s);
        } else if (strncmp(argv[i], "--only=", 7) == 0) {
            only = argv[i] + 7;
        } else if (strncmp(argv[i], "--settings=", 11) == 0) {
            settings_list = argv[i] + 11;
        } else if (strncmp(argv[i], "--scenarios=", 12) == 0) {
            scenarios = argv[i] + 12;
        } else if (strcmp(argv[i], "--worker=ddp") == 0) {
            snprintf(worker, sizeof(worker), "%s", RG_BENCH_DDP_WORKER);
        } else if (strncmp(argv[i], "--worker=", 9) == 0) {
            snprintf(worker, sizeof(worker), "%s", argv[i] + 9);
        } else {
            ok = false;
        }
    }
    if (!ok) {
        fprintf(stderr, "usage: rg-bench-launcher [--reps=N] [--only=regroup|torchrun] "
                        "[--settings=default,tuned] [--scenarios=a,b,...] [--worker=PATH] "
                        "[--timeout=S] [--idle-seconds=S] [--idle-reps=N]  (reps 1..%d)\n",
                MAX_REPS);
        return 2;
    }
    snprintf(dir, sizeof(dir), "/tmp/rg-bench-launcher-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    setenv("RG_TEST_DIR", dir, 1);
    if (rg_etcd_server_start(&etcd, "--heartbeat-interval=10 --election-timeout=100") != 0) {
        fprintf(stderr, "rg-bench-launcher: cannot start etcd: %s\n", rg_last_error());
        return 1;
    }
    for (int l = L_REGROUP; l <= L_TORCHRUN; l++) {
        if (only != NULL && strcmp(only, lnames[l]) != 0) {
            continue;
        }
        if (l == L_TORCHRUN &&
            system("/usr/bin/python3 -c 'import torch.distributed.run' >/dev/null 2>&1") != 0) {
            printf("{\"bench\":\"launcher\",\"launcher\":\"torchrun\",\"error\":\"torch not "
                   "installed for /usr/bin/python3 (scripts/setup.sh --bench)\"}\n");
            continue;
        }
        for (int sv = S_DEFAULT; sv <= S_TUNED; sv++) {
            if (strstr(settings_list, snames[sv]) == NULL) {
                continue;
            }
            settings = (settings_t)sv;
            if (wanted("worker_kill_1node")) {
                scenario_worker_kill((launcher_t)l, 1, 4, reps);
            }
            if (wanted("worker_kill_3nodes")) {
                scenario_worker_kill((launcher_t)l, 3, 2, reps);
            }
            if (wanted("agent_sigterm")) {
                scenario_agent((launcher_t)l, SIGTERM, reps);
            }
            if (wanted("agent_sigkill")) {
                scenario_agent((launcher_t)l, SIGKILL, reps);
            }
            if (wanted("start_8")) {
                scenario_start8((launcher_t)l, reps);
            }
            if (wanted("node_lost_kill")) {
                scenario_node_lost((launcher_t)l, false, reps);
            }
            if (wanted("node_lost_freeze")) {
                scenario_node_lost((launcher_t)l, true, reps);
            }
            if (wanted("idle_cpu")) {
                scenario_idle((launcher_t)l, idle_reps, idle_seconds);
            }
        }
    }
    rg_etcd_server_stop(&etcd);
    return rg_rm_tree(dir) ? 0 : 1;
}
