/*
 * The processes of a run: etcd (three members when a fault kills one, else one) and the
 * agents, one `regroup` per simulated node, nnodes=MIN:MAX, running the exactness workload
 * (rg-exact) or the Fashion-MNIST trainer (rg-fmnist) with checkpoints. Each is tracked and
 * stopped by its pid; the agents' children are the workers the faults hit. etcd and the
 * agents die with the runner (PR_SET_PDEATHSIG, set by the spawners).
 */
#include "chaos.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

bool chaos_etcd_start(chaos_t *c)
{
    int members = chaos_fault_enabled(c, F_ETCD_MEMBER) ||
                          chaos_fault_enabled(c, F_ETCD_LEADER) ||
                          chaos_fault_enabled(c, F_ETCD_SILENT)
                      ? 3 : 1;
    if (rg_etcd_server_cluster_start_at(&c->procs.etcd, members,
                                        "--heartbeat-interval=50 --election-timeout=500",
                                        chaos_net_etcd_host(c)) != 0) {
        chaos_say("cannot start etcd: %s", rg_last_error());
        return false;
    }
    return true;
}

void chaos_etcd_stop(chaos_t *c)
{
    rg_etcd_server_stop(&c->procs.etcd);
}

void chaos_etcd_signal(chaos_t *c, int m, int sig)
{
    if (m >= 0 && m < c->procs.etcd.n && c->procs.etcd.pid[m] > 0) {
        kill(c->procs.etcd.pid[m], sig);
    }
}

void chaos_etcd_kill(chaos_t *c, int m)
{
    rg_etcd_server_kill(&c->procs.etcd, m, SIGKILL);
}

/* Restarts the members a fault killed. */
void chaos_etcd_restart_dead(chaos_t *c)
{
    for (int m = 0; m < c->procs.etcd.n; m++) {
        if (c->procs.etcd.pid[m] <= 0 && rg_etcd_server_restart(&c->procs.etcd, m) != 0) {
            chaos_say("cannot restart etcd member %d", m);
        }
    }
}

int chaos_etcd_leader(const chaos_t *c)
{
    const rg_etcd_server_t *etcd = &c->procs.etcd;
    /* etcdctl reports each member's id and the leader's id. */
    for (int i = 0; i < etcd->n; i++) {
        char cmd[600];
        char out[4096];
        if (etcd->pid[i] <= 0) {
            continue;
        }
        snprintf(cmd, sizeof(cmd), "etcdctl --endpoints=%s endpoint status -w json 2>/dev/null",
                 etcd->url[i]);
        FILE *p = popen(cmd, "r");
        if (p == NULL) {
            continue;
        }
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        pclose(p);
        const char *m = strstr(out, "\"member_id\":");
        const char *l = strstr(out, "\"leader\":");
        if (m && l && strtoull(m + 12, NULL, 10) == strtoull(l + 9, NULL, 10)) {
            return i;
        }
    }
    return -1;
}

int chaos_agents_alive(const chaos_t *c)
{
    int n = 0;
    for (int i = 0; i < c->procs.n_slots; i++) {
        n += c->procs.alive[i];
    }
    return n;
}

void chaos_agent_start(chaos_t *c)
{
    const chaos_opts_t *opt = c->opt;
    char log[400];
    char ep[700];
    char nn[64];
    char net[120];
    char addr[64];
    char rec[64];
    char conf[160];
    char host[32] = "127.0.0.1";
    int i = 0;
    while (i < c->procs.n_slots && c->procs.alive[i]) {
        i++;
    }
    if (i == CHAOS_MAX_SLOTS) {
        chaos_say("no free agent slot (%d agents alive)", CHAOS_MAX_SLOTS);
        return;
    }
    c->procs.n_slots = RG_MAX(c->procs.n_slots, i + 1);
    c->procs.id[i] = c->procs.n_started++;

    snprintf(log, sizeof(log), "%s/agent%d.log", c->run.dir, c->procs.id[i]);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", c->net.on ? c->procs.etcd.endpoints_also
                                                              : c->procs.etcd.endpoints);
    snprintf(nn, sizeof(nn), "--nnodes=%d:%d", opt->min_nodes, opt->nodes);
    if (c->net.on) {
        chaos_net_node_addr(c->procs.id[i], host, sizeof(host));
    }
    snprintf(addr, sizeof(addr), "--local-addr=%s", host);
    snprintf(rec, sizeof(rec), "--recovery=%s", opt->recovery);
    char straggler[80] = "";
    if (strcmp(opt->recovery, "in-place") == 0) {
        snprintf(straggler, sizeof(straggler), ",straggler_factor=%d,straggler_window=%d",
                 CHAOS_STRAGGLER_FACTOR, CHAOS_STRAGGLER_WINDOW_S);
    }
    snprintf(conf, sizeof(conf),
             "--rdzv-conf=lease_ttl=%d,last_call_timeout=%g,join_timeout=120%s",
             CHAOS_LEASE_TTL_S, CHAOS_LAST_CALL_S, straggler);
    char *argv[32] = {"ip", "netns", "exec", net, (char *)opt->regroup, ep,
                      "--rdzv-id=" CHAOS_JOB_ID, nn, "--nproc-per-node=1", addr,
                      "--max-restarts=100000", "--grace-period=1", conf, rec};
    char *exact[] = {(char *)opt->exact, "--epochs", "1000000", "--stop-file",
                     c->run.stop_file, "--pad-kb", "4096", "--ckpt-every", "4", "--work",
                     "20000", "--dim", "64", "--table-rows", "4096", NULL};
    char *fmnist[] = {(char *)opt->fmnist, "--epochs", "1000", "--stop-file", c->run.stop_file,
                      "--schedule", "constant", "--ckpt-every", "20", "--log-every", "500",
                      NULL};
    char **work = opt->use_fmnist ? fmnist : exact;
    int n = 14;
    for (int k = 0; work[k] != NULL && n < 31; k++) {
        argv[n++] = work[k];
    }
    argv[n] = NULL;
    c->procs.pid[i] = -1;
    if (c->net.on) {
        if (!chaos_net_node_make(c, i)) {
            chaos_say("cannot make the network namespace of agent %d (see %s/net.log)",
                      c->procs.id[i], c->run.dir);
            c->procs.alive[i] = false;
            return;
        }
        snprintf(net, sizeof(net), "%s", chaos_net_node_name(c, i));
    }
    /* ip netns exec, unlike nsenter, also mounts a /sys of the namespace: UCX finds its
     * network devices there. */
    pid_t pid = rg_proc_spawn(c->net.on ? argv : argv + 4, log);
    c->procs.pid[i] = pid;
    c->procs.alive[i] = pid > 0;
}

int chaos_agents_reap(chaos_t *c)
{
    int bad = 0;
    for (int i = 0; i < c->procs.n_slots; i++) {
        int st;
        pid_t pid = c->procs.pid[i];
        if (c->procs.alive[i] && waitpid(pid, &st, WNOHANG) == pid) {
            c->procs.alive[i] = false;
            if (WIFSIGNALED(st)) {
                chaos_say("agent %d (pid %d) ended by signal %d", c->procs.id[i], (int)pid,
                          WTERMSIG(st));
            } else {
                chaos_say("agent %d (pid %d) exited with status %d", c->procs.id[i], (int)pid,
                          WEXITSTATUS(st));
            }
            bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
    }
    return bad;
}

/* Waits (30 s at most) for the agent of this pid to end, if it still runs. */
void chaos_agent_wait_gone(chaos_t *c, pid_t pid)
{
    for (int a = 0; a < c->procs.n_slots; a++) {
        if (c->procs.pid[a] == pid && c->procs.alive[a]) {
            int rc = rg_proc_wait(pid, 30000);
            c->procs.alive[a] = false;
            chaos_say("agent %d (pid %d) ended: %d", c->procs.id[a], (int)pid, rc);
        }
    }
}

/* Tells the job to finish at its next epoch boundary; waits up to 120 s for every agent. */
void chaos_agents_finish(chaos_t *c)
{
    int fd = open(c->run.stop_file, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) {
        close(fd);
    }
    uint64_t until = rg_now_ns() + 120000000000ull;
    while (chaos_agents_alive(c) > 0 && rg_now_ns() < until) {
        chaos_agents_reap(c);
        rg_sleep_ms(20);
    }
}

/* The last lines of agent id's log, to stderr: why an agent that should have ended did not,
 * or why a recovery was slow (the run dir of a CI machine is gone once the run fails). */
static void agent_log_tail(const chaos_t *c, int id)
{
    enum { TAIL_BYTES = 6144 };
    char path[400];
    char buf[TAIL_BYTES + 1];
    snprintf(path, sizeof(path), "%s/agent%d.log", c->run.dir, id);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return;
    }
    off_t end = lseek(fd, 0, SEEK_END);
    off_t from = end > TAIL_BYTES ? end - TAIL_BYTES : 0;
    ssize_t n = pread(fd, buf, TAIL_BYTES, from);
    close(fd);
    if (n <= 0) {
        return;
    }
    buf[n] = '\0';
    const char *text = buf;
    if (from > 0 && strchr(buf, '\n') != NULL) {
        text = strchr(buf, '\n') + 1;   /* from the first whole line */
    }
    fprintf(stderr, "---- the end of %s ----\n%s---- (end) ----\n", path, text);
}

void chaos_agent_logs_tail(const chaos_t *c)
{
    for (int id = 0; id < c->procs.n_started; id++) {
        agent_log_tail(c, id);
    }
}

void chaos_agents_kill(chaos_t *c)
{
    for (int i = 0; i < c->procs.n_slots; i++) {
        if (c->procs.alive[i]) {
            chaos_say("agent %d (pid %d) still runs: killing it", c->procs.id[i],
                      (int)c->procs.pid[i]);
            agent_log_tail(c, c->procs.id[i]);
            kill(c->procs.pid[i], SIGKILL);
            waitpid(c->procs.pid[i], NULL, 0);
            c->procs.alive[i] = false;
        }
    }
}

/* The workers: processes whose parent is one of our live agents. */
int chaos_workers_find(const chaos_t *c, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while (d != NULL && (e = readdir(d)) != NULL && n < max) {
        char path[300];
        int pid = atoi(e->d_name);
        int ppid = 0;
        char state;
        if (pid <= 0) {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue;
        }
        if (fscanf(f, "%*d %*s %c %d", &state, &ppid) == 2 && state != 'Z' && state != 'T') {
            for (int i = 0; i < c->procs.n_slots; i++) {
                if (c->procs.alive[i] && c->procs.pid[i] == ppid) {
                    out[n++] = pid;
                }
            }
        }
        fclose(f);
    }
    if (d) {
        closedir(d);
    }
    return n;
}

/* Processes of this run still alive: anything whose command line names our run dir. */
int chaos_leftover_processes(const chaos_t *c, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while (d != NULL && (e = readdir(d)) != NULL && n < max) {
        char path[300];
        char cmd[4096];
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == getpid()) {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            continue;
        }
        ssize_t len = read(fd, cmd, sizeof(cmd) - 1);
        close(fd);
        if (len <= 0) {
            continue;
        }
        for (ssize_t i = 0; i < len; i++) {
            cmd[i] = cmd[i] ? cmd[i] : ' ';
        }
        cmd[len] = '\0';
        if (strstr(cmd, c->run.dir) != NULL) {
            out[n++] = pid;
        }
    }
    if (d) {
        closedir(d);
    }
    return n;
}
