/*
 * rg-bench-notice: from a cloud's preemption notice to the survivors running at the smaller
 * size, and the steps lost.
 *
 *   rg-bench-notice [--reps=N] [--provider=aws|gce|azure]
 *
 * Two agents on 127.0.0.1 (--nnodes=1:2, one worker each) run rg-exact; the second watches a
 * stand-in of the provider's metadata service (tests/metadata_server.py, on a loopback port,
 * through REGROUP_METADATA_URL). Once both train at world size 2 and a checkpoint has landed,
 * the stand-in starts answering with a notice (60 s ahead) and the wall time is noted; the
 * figure is (the survivor's worker restoring its checkpoint in the next round, from its own
 * log's timestamp) - (that time). It includes up to one poll interval (1 s) before the agent
 * sees the notice, the step boundary, the last checkpoint of that step, the agents' exits
 * and the next round; after_seen_s is the part from the leaving agent's "leaving the job" log
 * line (it saw the notice) to the same end. steps_lost is the step the ranks left at minus
 * the step resumed from; exact says whether rg-exact's final digest was right. One JSON
 * object:
 *   {"bench":"notice","provider":..,"poll_ms":1000,"reps":..,"median_s":..,"min_s":..,
 *    "max_s":..,"after_seen_median_s":..,"after_seen_max_s":..,"steps_lost_max":..,
 *    "exact":..}
 */
#include "etcd_server.h"
#include "rg_bench_meta.h"
#include "rg_common.h"

#include <regroup/ckpt.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_REPS 20

static char dir[256];
static rg_etcd_server_t etcd;

static bool file_has(const char *path, const char *text)
{
    char line[1024];
    bool found = false;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        found = strstr(line, text) != NULL;
    }
    fclose(f);
    return found;
}

/* The number after the first occurrence of prefix in the file, or -1; with stamp, the
 * "[wall seconds]" the line starts with instead. */
static double file_number(const char *path, const char *prefix, bool stamp)
{
    char line[1024];
    double v = -1;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    while (v < 0 && fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, prefix);
        if (p == NULL) {
            continue;
        }
        if (stamp ? sscanf(line, "[%lf]", &v) != 1 : sscanf(p + strlen(prefix), "%lf", &v) != 1) {
            v = -1;
        }
    }
    fclose(f);
    return v;
}

static bool wait_for(const char *path, const char *text, int timeout_ms)
{
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (rg_now_ns() < until) {
        if (file_has(path, text)) {
            return true;
        }
        rg_sleep_ms(2);
    }
    return false;
}

static void write_state(const char *path, const char *state)
{
    char tmp[420];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f != NULL) {
        fprintf(f, "%s\n", state);
        fclose(f);
        if (rename(tmp, path) != 0) {
            perror("rename");
        }
    }
}

static void reap(pid_t pid, int timeout_ms, int *rc)
{
    int r = rg_proc_wait(pid, timeout_ms);
    if (r < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    if (rc != NULL) {
        *rc = r;
    }
}

/* One repetition: the seconds from the notice to the survivor restored, or -1. */
static double one_rep(int rep, const char *provider, long *lost, bool *exact, double *seen)
{
    char sub[300];
    char ck[400];
    char state[400];
    char port_file[400];
    char slog[400];
    char mlog[400];
    char alog[400];
    char blog[400];
    char url[128];
    char ep[600];
    char rid[96];
    char pn[64];
    double result = -1;
    pid_t srv;
    pid_t a = -1;
    pid_t b = -1;

    snprintf(sub, sizeof(sub), "%s/rep%d", dir, rep);
    snprintf(ck, sizeof(ck), "%s/ckpt", sub);
    snprintf(state, sizeof(state), "%s/meta.state", sub);
    snprintf(port_file, sizeof(port_file), "%s/meta.port", sub);
    snprintf(slog, sizeof(slog), "%s/meta.log", sub);
    snprintf(mlog, sizeof(mlog), "%s/meta.out", sub);
    snprintf(alog, sizeof(alog), "%s/a.log", sub);
    snprintf(blog, sizeof(blog), "%s/b.log", sub);
    if (mkdir(sub, 0700) != 0 || mkdir(ck, 0700) != 0) {
        perror("mkdir");
        return -1;
    }
    write_state(state, "none");
    char *sargv[] = {"/usr/bin/python3", RG_BENCH_META_SERVER, port_file, state, slog,
                     (char *)provider, NULL};
    srv = rg_proc_spawn(sargv, mlog);
    uint64_t until = rg_now_ns() + 20000000000ull;
    while (access(port_file, F_OK) != 0 && rg_now_ns() < until) {
        rg_sleep_ms(5);
    }
    int port = (int)file_number(port_file, "", false);
    if (port <= 0) {
        fprintf(stderr, "rg-bench-notice: the metadata stand-in did not start\n");
        goto out;
    }
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", etcd.endpoints);
    snprintf(rid, sizeof(rid), "--rdzv-id=notice-%d-%d", rep, (int)getpid());
    snprintf(pn, sizeof(pn), "--preemption-notice=%s", provider);
    setenv("REGROUP_CKPT_DIR", ck, 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("REGROUP_LOG_LEVEL", "info", 1);
    char *aargv[] = {RG_BENCH_REGROUP, ep, rid, "--nnodes=1:2", "--max-restarts=0",
                     "--rdzv-conf=last_call_timeout=3", RG_BENCH_EXACT, "--epochs", "40",
                     "--work", "20000", NULL};
    char *bargv[] = {RG_BENCH_REGROUP, ep, rid, "--nnodes=1:2", "--max-restarts=0",
                     "--rdzv-conf=last_call_timeout=3", pn, RG_BENCH_EXACT, "--epochs", "40",
                     "--work", "20000", NULL};
    unsetenv("REGROUP_METADATA_URL");
    a = rg_proc_spawn(aargv, alog);
    setenv("REGROUP_METADATA_URL", url, 1);
    b = rg_proc_spawn(bargv, blog);
    unsetenv("REGROUP_METADATA_URL");
    if (!wait_for(alog, " of 2, restart 0)", 60000)) {
        fprintf(stderr, "rg-bench-notice: the pair did not start at world size 2\n");
        goto out;
    }
    /* a checkpoint committed: training, not starting */
    until = rg_now_ns() + 60000000000ull;
    int64_t *steps = NULL;
    size_t n = 0;
    while (rg_now_ns() < until) {
        if (rg_ckpt_list(ck, &steps, &n) == RG_OK && n > 0) {
            break;
        }
        free(steps);
        steps = NULL;
        rg_sleep_ms(5);
    }
    free(steps);
    double t0 = rg_wall_s();
    write_state(state, "notice 60");
    if (!wait_for(alog, "restored checkpoint step", 60000)) {
        fprintf(stderr, "rg-bench-notice: the survivor did not resume\n");
        goto out;
    }
    double t1 = file_number(alog, "restored checkpoint step", true);
    double ts = file_number(blog, "leaving the job: ", true);
    *seen = ts > 0 && t1 > 0 ? t1 - ts : -1;
    int rca = -1;
    int rcb = -1;
    reap(b, 60000, &rcb);
    b = -1;
    reap(a, 240000, &rca);
    a = -1;
    double left = file_number(alog, "left at step ", false);
    if (left < 0) {
        left = file_number(blog, "left at step ", false);
    }
    double resumed = file_number(alog, "resumed from step ", false);
    *lost = left >= 0 && resumed >= 0 ? (long)(left - resumed) : -1;
    *exact = rca == 0 && rcb == 0 && file_has(alog, "exact=1") && file_has(alog, "world=1");
    result = t1 > 0 ? t1 - t0 : -1;
out:
    if (b > 0) {
        kill(b, SIGKILL);
        reap(b, 10000, NULL);
    }
    if (a > 0) {
        kill(a, SIGKILL);
        reap(a, 10000, NULL);
    }
    kill(srv, SIGKILL);
    reap(srv, 10000, NULL);
    return result;
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x;
    double b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv)
{
    int reps = 5;
    const char *provider = "aws";
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--reps=", 7) == 0) {
            reps = atoi(argv[i] + 7);
        } else if (strncmp(argv[i], "--provider=", 11) == 0) {
            provider = argv[i] + 11;
        } else {
            fprintf(stderr, "usage: rg-bench-notice [--reps=N] [--provider=aws|gce|azure]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS ||
        (strcmp(provider, "aws") != 0 && strcmp(provider, "gce") != 0 &&
         strcmp(provider, "azure") != 0)) {
        fprintf(stderr, "rg-bench-notice: --reps is 1..%d, --provider aws, gce or azure\n",
                MAX_REPS);
        return 2;
    }
    snprintf(dir, sizeof(dir), "%s/rg-bench-notice-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    if (rg_etcd_server_start(&etcd, "--heartbeat-interval=10 --election-timeout=100") != 0) {
        fprintf(stderr, "rg-bench-notice: cannot start etcd: %s\n", rg_last_error());
        return 1;
    }
    double v[MAX_REPS];
    double w[MAX_REPS];
    int ok = 0;
    int n_seen = 0;
    long lost_max = 0;
    bool exact = true;
    for (int r = 0; r < reps; r++) {
        long lost = -1;
        bool ex = false;
        double seen = -1;
        double s = one_rep(r, provider, &lost, &ex, &seen);
        if (s > 0) {
            v[ok++] = s;
        }
        if (seen > 0) {
            w[n_seen++] = seen;
        }
        lost_max = lost < 0 ? -1 : lost_max < 0 ? lost_max : RG_MAX(lost_max, lost);
        exact = exact && ex;
    }
    rg_etcd_server_stop(&etcd);
    if (getenv("REGROUP_KEEP_BENCH_DIR") == NULL && !rg_rm_tree(dir)) {
        fprintf(stderr, "rg-bench-notice: cannot remove %s\n", dir);
    }
    if (ok == 0) {
        printf("{\"bench\":\"notice\",\"provider\":\"%s\",\"reps\":0,\"error\":\"no successful "
               "repetition\",%s}\n", provider, RG_BENCH_META);
        return 1;
    }
    qsort(v, (size_t)ok, sizeof(double), cmp_d);
    qsort(w, (size_t)n_seen, sizeof(double), cmp_d);
    printf("{\"bench\":\"notice\",\"provider\":\"%s\",\"poll_ms\":1000,\"reps\":%d,"
           "\"median_s\":%.3f,\"min_s\":%.3f,\"max_s\":%.3f,\"after_seen_median_s\":%.3f,"
           "\"after_seen_max_s\":%.3f,\"steps_lost_max\":%ld,\"exact\":%s,%s}\n", provider, ok,
           v[ok / 2], v[0], v[ok - 1], n_seen ? w[n_seen / 2] : -1.0,
           n_seen ? w[n_seen - 1] : -1.0, lost_max, exact ? "true" : "false", RG_BENCH_META);
    return 0;
}
