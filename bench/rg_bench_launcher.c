/*
 * rg-bench-launcher: the launcher's own cost, side by side with torchrun.
 *
 *   rg-bench-launcher [--reps=N] [--only=regroup|torchrun] [--scenarios=a,b,...]
 *                     [--worker=PATH]
 *
 * Workers are a shell script (tests/data/rg_test_worker.sh) that appends
 * "start ROUND RANK WORLD RESTART PID ... UNIX_TIME" to an events file and waits. Each
 * scenario injects an event, notes the wall time, and waits until every worker of the new
 * round has written its start line; the figure is (latest such start) - (event time), from
 * the workers' own timestamps. One JSON object per line:
 *   {"bench":"launcher","launcher":..,"scenario":..,"reps":..,"median_s":..,"min_s":..,"max_s":..}
 * Scenarios: worker_kill_1node (1 agent x 4 workers), worker_kill_3nodes (3 x 2),
 * agent_sigterm (3 x 2 -> 2 x 2), agent_sigkill (3 x 2 -> 2 x 2; regroup lease_ttl=2),
 * start_8 (8 agents, MIN=MAX=8, from the last agent's start to all 8 workers running),
 * idle_cpu (1 agent x 4 idle workers for 5 s: the agent's CPU share in percent).
 * torchrun: PyTorch's, c10d backend, --monitor_interval=0.1, last_call_timeout=1.
 */
#include "etcd_server.h"
#include "rg_common.h"

#include <arpa/inet.h>
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

static char dir[256];
static char worker[512];
static char regroup_bin[512];
static rg_etcd_server_t etcd;
static pid_t agents[MAX_AGENTS];
static int store_port;
static const char *scenarios;   /* NULL: all */

static bool wanted(const char *name)
{
    if (scenarios == NULL) {
        return true;
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
    snprintf(log, sizeof(log), "%s/agent%d.log", dir, i);
    snprintf(np, sizeof(np), "--nproc_per_node=%d", nproc);
    snprintf(nn, sizeof(nn), "--nnodes=%s", nnodes);
    snprintf(id, sizeof(id), "--rdzv_id=%s", job);
    if (l == L_REGROUP) {
        snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.endpoints);
        char *argv[] = {regroup_bin, nn, np, ep, id,
                        "--rdzv-conf=lease_ttl=2,last_call_timeout=1", "--max-restarts=1000",
                        "--monitor-interval=1", worker, NULL};
        agents[i] = rg_proc_spawn(argv, log);
    } else {
        snprintf(ep, sizeof(ep), "--rdzv_endpoint=127.0.0.1:%d", store_port);
        char *argv[] = {"torchrun", nn, np, "--rdzv_backend=c10d", ep, id,
                        "--rdzv_conf=last_call_timeout=1", "--monitor_interval=0.1",
                        "--max_restarts=1000", "--redirects=1", "--tee=1", "--no_python",
                        worker, NULL};
        agents[i] = rg_proc_spawn(argv, log);
    }
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

static void report(launcher_t l, const char *scenario, double *v, int n, const char *unit)
{
    if (n == 0) {
        printf("{\"bench\":\"launcher\",\"launcher\":\"%s\",\"scenario\":\"%s\",\"reps\":0,"
               "\"error\":\"no successful repetition\"}\n", lnames[l], scenario);
        fflush(stdout);
        return;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    printf("{\"bench\":\"launcher\",\"launcher\":\"%s\",\"scenario\":\"%s\",\"reps\":%d,"
           "\"median_%s\":%.4f,\"min_%s\":%.4f,\"max_%s\":%.4f}\n", lnames[l], scenario, n, unit,
           v[n / 2], unit, v[0], unit, v[n - 1]);
    fflush(stdout);
}

static void new_job(char *job, size_t len, const char *scenario, int rep)
{
    snprintf(job, len, "%s-%d-%d", scenario, rep, (int)getpid());
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
            double t1 = wait_starts(at, nodes * nproc, nodes * nproc, 60000, NULL);
            if (t1 > 0) {
                v[ok++] = t1 - t0;
            }
        }
        stop_all();
    }
    report(l, name, v, ok, "s");
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
            double t1 = wait_starts(at, 4, 4, 90000, NULL);
            if (t1 > 0) {
                v[ok++] = t1 - t0;
            }
        }
        stop_all();
    }
    report(l, name, v, ok, "s");
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
        double t1 = wait_starts(0, 8, 8, 60000, NULL);
        if (t1 > 0) {
            v[ok++] = t1 - t_last;
        }
        stop_all();
    }
    report(l, "start_8", v, ok, "s");
}

static double cpu_seconds(pid_t pid)
{
    char path[64];
    unsigned long ut = 0;
    unsigned long stt = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt) != 2) {
        ut = stt = 0;
    }
    fclose(f);
    return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static void scenario_idle(launcher_t l)
{
    double v[1];
    char job[96];
    int at;
    new_job(job, sizeof(job), "idle", 0);
    if (bring_up(l, 1, 4, "1", job, &at) == 0) {
        double c0 = cpu_seconds(agents[0]);
        double t0 = wall();
        rg_sleep_ms(5000);
        v[0] = 100.0 * (cpu_seconds(agents[0]) - c0) / (wall() - t0);
        stop_all();
        report(l, "idle_cpu", v, 1, "pct");
        return;
    }
    stop_all();
    report(l, "idle_cpu", v, 0, "pct");
}

int main(int argc, char **argv)
{
    int reps = 5;
    const char *only = NULL;

    snprintf(regroup_bin, sizeof(regroup_bin), "%s", RG_BENCH_REGROUP);
    snprintf(worker, sizeof(worker), "%s", RG_BENCH_WORKER);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--reps=", 7) == 0) {
            reps = atoi(argv[i] + 7);
        } else if (strncmp(argv[i], "--only=", 7) == 0) {
            only = argv[i] + 7;
        } else if (strncmp(argv[i], "--scenarios=", 12) == 0) {
            scenarios = argv[i] + 12;
        } else if (strncmp(argv[i], "--worker=", 9) == 0) {
            snprintf(worker, sizeof(worker), "%s", argv[i] + 9);
        } else {
            fprintf(stderr, "usage: rg-bench-launcher [--reps=N] [--only=regroup|torchrun] "
                            "[--scenarios=a,b,...] [--worker=PATH]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "rg-bench-launcher: --reps must be 1..%d\n", MAX_REPS);
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
        if (l == L_TORCHRUN && system("torchrun --help >/dev/null 2>&1") != 0) {
            printf("{\"bench\":\"launcher\",\"launcher\":\"torchrun\",\"error\":\"torchrun not "
                   "installed (scripts/setup.sh --bench)\"}\n");
            continue;
        }
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
            scenario_agent((launcher_t)l, SIGKILL, RG_MIN(reps, 3));
        }
        if (wanted("start_8")) {
            scenario_start8((launcher_t)l, reps);
        }
        if (wanted("idle_cpu")) {
            scenario_idle((launcher_t)l);
        }
    }
    rg_etcd_server_stop(&etcd);
    return rg_rm_tree(dir) ? 0 : 1;
}
