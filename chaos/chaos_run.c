/*
 * rg-chaos: runs a real job on several simulated nodes and breaks it on purpose.
 *
 * An etcd on loopback (three members when etcd faults are on), N `regroup` agents (one per
 * simulated node, nnodes=MIN:MAX) running the exactness workload (rg-exact; or, with
 * --workload fmnist, the Fashion-MNIST trainer rg-fmnist) with checkpoints, and a seeded
 * schedule of faults. Each fault waits for the job to make progress, is injected, and is
 * timed until the job makes progress again. At the end the job is told to finish at the next
 * epoch boundary and the invariants are checked: the job finished, its final state is
 * exactly right, every retained checkpoint verifies, no round resumed from before the last
 * checkpoint committed when its fault struck, no process of the run is left, and nothing
 * exceeded its time bound. See chaos/run --help.
 *
 * With the partition fault, the runner moves into a network namespace of its own, where etcd
 * serves on a bridge; every agent runs in a namespace of its own linked to that bridge by a
 * veth pair, and its workers talk UCX over tcp on it. A partition takes one node's link down
 * for a few seconds and brings it up again; the node must then rejoin.
 */
#include "etcd_server.h"
#include "rg_common.h"

#include <regroup/ckpt.h>
#include <regroup/etcd.h>
#include <regroup/rdzv.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_NODES    8
#define MAX_FAULTS   2000
#define RECOVERY_MAX_MS 60000
#define FMNIST_MIN_ACCURACY 0.75

typedef enum {
    F_WORKER_KILL, F_WORKER_HANG, F_AGENT_KILL, F_PREEMPT, F_NODE_JOIN, F_ETCD_MEMBER,
    F_ETCD_LEADER, F_PARTITION, F_CKPT_KILL, F_CORRUPT, F_DISK_FULL, F_COUNT
} fault_t;

static const char *const fault_names[F_COUNT] = {
    "worker-kill", "worker-hang", "agent-kill", "preempt", "node-join", "etcd-member",
    "etcd-leader", "partition", "ckpt-kill", "corrupt-shard", "disk-full"};

typedef struct {
    fault_t kind;
    double  t_inject;
    double  recovery_s;      /* -1: did not recover */
    int     round_before;
    int64_t committed;       /* newest committed step when the fault struck */
    int64_t step_before;     /* last reported step when the fault struck */
    int64_t resumed;         /* step the next round restored, -1 if none */
    char    target[64];
    pid_t   agent_pid;       /* agent-kill, preempt, partition: the agent hit */
    double  rejoin_s;        /* partition: from the link coming back to the node in a round */
    bool    lost_work;
} fault_rec_t;

typedef struct {
    uint64_t    seed;
    int         faults;
    double      duration_s;
    int         nodes;
    const char *scenario;
    const char *report;
    bool        quick;
    const char *regroup;
    const char *exact;
    const char *fmnist;
    bool        use_fmnist;  /* --workload fmnist */
} options_t;

static options_t opt;
static char dir[256];
static char ckpt_dir[300];
static char stop_file[300];
static rg_etcd_server_t etcd;
static rg_etcd_t *cli;
/* Agents live in slots, reused once an agent has ended and been reaped (a long soak starts
 * far more agents than ever run at once); each agent started gets a new id, which names its
 * log, its network namespace and its address. */
#define MAX_SLOTS (MAX_NODES * 4)
static pid_t agents[MAX_SLOTS];
static int agent_id[MAX_SLOTS];
static int n_agent_slots;
static int n_started;
static bool alive[MAX_SLOTS];
static fault_rec_t recs[MAX_FAULTS];
static int n_recs;
static bool tmpfs_mounted;
static uint64_t rng;
static int64_t corrupted_steps[MAX_FAULTS];
static int n_corrupted;

/* Network namespaces (the partition fault). */
#define NET_BRIDGE "rgc-br"
#define NET_PREFIX "10.213."
static bool netns_mode;
static char ns_path[MAX_SLOTS][96];
static struct {
    bool   on;
    int    slot;
    double heal_at;
    double healed_at;
} cut;

static uint64_t next_rand(void)
{
    rng += 0x9e3779b97f4a7c15ull;
    uint64_t z = rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void say(const char *fmt, ...) RG_PRINTF(1, 2);
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("[%8.3f] ", rg_wall_s() - floor(rg_wall_s() / 100000) * 100000);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* ---- processes ------------------------------------------------------------------------ */

static int alive_agents(void)
{
    int n = 0;
    for (int i = 0; i < n_agent_slots; i++) {
        n += alive[i];
    }
    return n;
}

/* Runs a shell command line (ip, in the runner's network namespace), its output appended to
 * the run dir's net.log; returns its exit status. */
static int sh(const char *fmt, ...) RG_PRINTF(1, 2);
static int sh(const char *fmt, ...)
{
    char cmd[600];
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "%s >>%s/net.log 2>&1", cmd, dir);
    int st = system(line);
    return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Namespaces left by an earlier run that was killed before it could remove them (its pid is
 * in their name, and gone). */
static void net_remove_stale(void)
{
    DIR *d = opendir("/var/run/netns");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        int pid;
        int slot;
        char path[400];
        if (sscanf(e->d_name, "rgc-%d-%d", &pid, &slot) == 2 && pid > 0 &&
            kill(pid, 0) != 0 && errno == ESRCH) {
            snprintf(path, sizeof(path), "/var/run/netns/%s", e->d_name);
            umount2(path, MNT_DETACH);
            unlink(path);
        }
    }
    if (d) {
        closedir(d);
    }
}

/* Moves the runner into a new network namespace with loopback and a bridge, where etcd will
 * serve; false (and back in the original namespace) if this machine does not allow it. */
static bool net_setup(void)
{
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0 || unshare(CLONE_NEWNET) != 0) {
        say("cannot make a network namespace (%s): the partition fault is skipped",
            strerror(errno));
        if (self >= 0) {
            close(self);
        }
        return false;
    }
    net_remove_stale();
    bool ok = sh("ip link set lo up") == 0 && sh("ip link add " NET_BRIDGE " type bridge") == 0 &&
              sh("ip addr add " NET_PREFIX "0.1/16 dev " NET_BRIDGE) == 0 &&
              sh("ip link set " NET_BRIDGE " up") == 0;
    if (!ok) {
        say("cannot set up the namespaces' network (see %s/net.log): the partition fault is "
            "skipped", dir);
        if (setns(self, CLONE_NEWNET) != 0) {
            say("cannot go back to the original network namespace: %s", strerror(errno));
        }
    }
    close(self);
    return ok;
}

/* The address of agent id k in its namespace. */
static void node_addr(int k, char *out, size_t len)
{
    snprintf(out, len, NET_PREFIX "%d.%d", 1 + k / 250, 1 + k % 250);
}

/* Removes a slot's namespace as `ip netns del` does (async-signal-safe); a namespace lives on
 * until its last process is gone, then its veth pair goes with it. */
static void node_ns_remove(int i)
{
    if (ns_path[i][0]) {
        umount2(ns_path[i], MNT_DETACH);
        unlink(ns_path[i]);
        ns_path[i][0] = '\0';
    }
}

/* A node's namespace for the agent in slot i: veth0 inside, its peer rgc-h<id> on the bridge. */
static bool node_ns_make(int i)
{
    char name[64];
    char addr[32];
    int k = agent_id[i];
    node_ns_remove(i);   /* the namespace of the slot's previous agent */
    snprintf(name, sizeof(name), "rgc-%d-%d", (int)getpid(), k);
    snprintf(ns_path[i], sizeof(ns_path[i]), "/var/run/netns/%s", name);
    node_addr(k, addr, sizeof(addr));
    return sh("ip netns add %s", name) == 0 &&
           sh("ip link add rgc-h%d type veth peer name veth0 netns %s", k, name) == 0 &&
           sh("ip link set rgc-h%d master " NET_BRIDGE " up", k) == 0 &&
           sh("ip -n %s addr add %s/16 dev veth0", name, addr) == 0 &&
           sh("ip -n %s link set veth0 up", name) == 0 && sh("ip -n %s link set lo up", name) == 0;
}

static void net_cleanup(void)
{
    for (int i = 0; i < MAX_SLOTS; i++) {
        node_ns_remove(i);
    }
}

/* Ends the partition once its time is up (or now). */
static void heal(bool now)
{
    if (cut.on && (now || rg_wall_s() >= cut.heal_at)) {
        if (sh("ip link set rgc-h%d up", agent_id[cut.slot]) != 0) {
            say("cannot bring the link of agent %d back up", agent_id[cut.slot]);
        }
        cut.on = false;
        cut.healed_at = rg_wall_s();
    }
}

static void start_agent(void)
{
    char log[400];
    char ep[700];
    char nn[64];
    char net[120];
    char addr[64];
    char host[32] = "127.0.0.1";
    int i = 0;
    while (i < n_agent_slots && alive[i]) {
        i++;
    }
    if (i == MAX_SLOTS) {
        say("no free agent slot (%d agents alive)", MAX_SLOTS);
        return;
    }
    n_agent_slots = RG_MAX(n_agent_slots, i + 1);
    agent_id[i] = n_started++;

    snprintf(log, sizeof(log), "%s/agent%d.log", dir, agent_id[i]);
    snprintf(ep, sizeof(ep), "--rdzv-endpoint=%s", netns_mode ? etcd.endpoints_also
                                                               : etcd.endpoints);
    snprintf(nn, sizeof(nn), "--nnodes=%d:%d", opt.nodes > 2 ? opt.nodes - 1 : 1, opt.nodes);
    if (netns_mode) {
        node_addr(agent_id[i], host, sizeof(host));
    }
    snprintf(addr, sizeof(addr), "--local-addr=%s", host);
    char *argv[32] = {"ip", "netns", "exec", net, (char *)opt.regroup, ep, "--rdzv-id=chaos", nn,
                      "--nproc-per-node=1", addr, "--max-restarts=100000", "--grace-period=1",
                      "--rdzv-conf=lease_ttl=2,last_call_timeout=0.5,join_timeout=120"};
    char *exact[] = {(char *)opt.exact, "--epochs", "1000000", "--stop-file", stop_file,
                     "--pad-kb", "4096", "--ckpt-every", "4", "--work", "20000", "--dim", "64",
                     NULL};
    char *fmnist[] = {(char *)opt.fmnist, "--epochs", "1000", "--stop-file", stop_file,
                      "--schedule", "constant", "--ckpt-every", "20", "--log-every", "500",
                      NULL};
    char **work = opt.use_fmnist ? fmnist : exact;
    int n = 13;
    for (int k = 0; work[k] != NULL && n < 31; k++) {
        argv[n++] = work[k];
    }
    argv[n] = NULL;
    agents[i] = -1;
    if (netns_mode) {
        if (!node_ns_make(i)) {
            say("cannot make the network namespace of agent %d (see %s/net.log)", agent_id[i],
                dir);
            alive[i] = false;
            return;
        }
        snprintf(net, sizeof(net), "%s", strrchr(ns_path[i], '/') + 1);
    }
    /* ip netns exec, unlike nsenter, also mounts a /sys of the namespace: UCX finds its
     * network devices there. */
    pid_t pid = rg_proc_spawn(netns_mode ? argv : argv + 4, log);
    agents[i] = pid;
    alive[i] = pid > 0;
}

/* Reaps agents that exited; returns how many were reaped with a non-zero status. */
static int reap_agents(int *bad_status)
{
    int bad = 0;
    for (int i = 0; i < n_agent_slots; i++) {
        int st;
        if (alive[i] && waitpid(agents[i], &st, WNOHANG) == agents[i]) {
            alive[i] = false;
            if (WIFSIGNALED(st)) {
                say("agent %d (pid %d) ended by signal %d", agent_id[i], (int)agents[i],
                    WTERMSIG(st));
            } else {
                say("agent %d (pid %d) exited with status %d", agent_id[i], (int)agents[i],
                    WEXITSTATUS(st));
            }
            if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
                bad++;
                if (bad_status) {
                    *bad_status = st;
                }
            }
        }
    }
    return bad;
}

/* The workers: processes whose parent is one of our live agents. */
static int find_workers(pid_t *out, int max)
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
            for (int i = 0; i < n_agent_slots; i++) {
                if (alive[i] && agents[i] == ppid) {
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
static int leftover_processes(pid_t *out, int max)
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
        if (strstr(cmd, dir) != NULL) {
            out[n++] = pid;
        }
    }
    if (d) {
        closedir(d);
    }
    return n;
}

/* ---- the job's state, from etcd ------------------------------------------------------ */

typedef struct {
    int     round;
    int64_t step;
    double  time;
} progress_t;

static bool read_progress(progress_t *p)
{
    char *v;
    size_t len;
    if (rg_etcd_get(cli, "/regroup/chaos/status/progress/0", 0, &v, &len, NULL) != RG_OK) {
        return false;
    }
    bool ok = sscanf(v, "{\"step\":%" SCNd64 ",\"epoch\":%*d,\"round\":%d,\"time\":%lf",
                     &p->step, &p->round, &p->time) == 3;
    free(v);
    return ok;
}

static int64_t read_i64_key(const char *key, const char *fmt)
{
    char *v;
    size_t len;
    int64_t x = -1;
    if (rg_etcd_get(cli, key, 0, &v, &len, NULL) == RG_OK) {
        if (sscanf(v, fmt, &x) != 1) {
            x = -1;
        }
        free(v);
    }
    return x;
}

static int64_t committed_step(void)
{
    return read_i64_key("/regroup/chaos/ckpt/latest", "%" SCNd64);
}

static bool read_restored(int *round, int64_t *step)
{
    char *v;
    size_t len;
    if (rg_etcd_get(cli, "/regroup/chaos/status/restored", 0, &v, &len, NULL) != RG_OK) {
        return false;
    }
    bool ok = sscanf(v, "{\"round\":%d,\"step\":%" SCNd64 "}", round, step) == 2;
    free(v);
    return ok;
}

static int64_t failure_count(void)
{
    rg_etcd_range_req_t rq = {.key = "/regroup/chaos/failures/", .prefix = true,
                              .count_only = true};
    rg_etcd_range_t r;
    if (rg_etcd_range(cli, &rq, 0, &r) != RG_OK) {
        return -1;
    }
    int64_t n = r.count;
    rg_etcd_range_cleanup(&r);
    return n;
}

/* Waits until the job reports progress newer than `after` (wall time) in a round of at least
 * min_round; returns the report, or false on timeout. */
static bool wait_progress(double after, int min_round, int timeout_ms, progress_t *out)
{
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (rg_now_ns() < until) {
        progress_t p;
        heal(false);
        if (read_progress(&p) && p.time > after && p.round >= min_round) {
            *out = p;
            return true;
        }
        if (reap_agents(NULL) > 0 && alive_agents() == 0) {
            return false;
        }
        rg_sleep_ms(5);
    }
    return false;
}

/* ---- faults ---------------------------------------------------------------------------- */

static int etcd_leader(void)
{
    /* etcdctl reports each member's id and the leader's id. */
    for (int i = 0; i < etcd.n; i++) {
        char cmd[600];
        char out[4096];
        if (etcd.pid[i] <= 0) {
            continue;
        }
        snprintf(cmd, sizeof(cmd), "etcdctl --endpoints=%s endpoint status -w json 2>/dev/null",
                 etcd.url[i]);
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

static void corrupt_newest(fault_rec_t *r)
{
    int64_t *steps = NULL;
    size_t n = 0;
    if (rg_ckpt_list(ckpt_dir, &steps, &n) != RG_OK || n == 0) {
        snprintf(r->target, sizeof(r->target), "no checkpoint");
        free(steps);
        return;
    }
    int64_t newest = steps[0];
    for (size_t i = 0; i < n; i++) {
        newest = RG_MAX(newest, steps[i]);
    }
    free(steps);
    char path[512];
    snprintf(path, sizeof(path), "%s/step-%lld/shard-0.rgs", ckpt_dir, (long long)newest);
    int fd = open(path, O_RDWR);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size > 64) {
        unsigned char c;
        off_t at = sb.st_size / 2;
        if (pread(fd, &c, 1, at) == 1) {
            c ^= 0x5a;
            if (pwrite(fd, &c, 1, at) == 1) {
                corrupted_steps[n_corrupted++] = newest;
            }
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    snprintf(r->target, sizeof(r->target), "step-%lld shard 0", (long long)newest);
}

static bool write_in_progress(void)
{
    DIR *d = opendir(ckpt_dir);
    struct dirent *e;
    bool busy = false;
    while (d != NULL && (e = readdir(d)) != NULL && !busy) {
        char path[600];
        struct stat sb;
        if (strncmp(e->d_name, "step-", 5) != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s/MANIFEST", ckpt_dir, e->d_name);
        busy = stat(path, &sb) != 0;
    }
    if (d) {
        closedir(d);
    }
    return busy;
}

static void kill_worker(fault_rec_t *r, int sig)
{
    pid_t w[64];
    int n = find_workers(w, 64);
    if (n == 0) {
        snprintf(r->target, sizeof(r->target), "no worker");
        return;
    }
    pid_t victim = w[next_rand() % (uint64_t)n];
    kill(victim, sig);
    snprintf(r->target, sizeof(r->target), "worker pid %d", (int)victim);
}

static int pick_agent(void)
{
    int live[MAX_NODES * 4];
    int n = 0;
    for (int i = 0; i < n_agent_slots; i++) {
        if (alive[i]) {
            live[n++] = i;
        }
    }
    return n ? live[next_rand() % (uint64_t)n] : -1;
}

/* Fills the checkpoint file system, waits until a worker fails on it, then frees it. */
static void disk_full(fault_rec_t *r)
{
    char filler[400];
    char cmd[600];
    int64_t before = failure_count();
    snprintf(filler, sizeof(filler), "%s/filler", ckpt_dir);
    snprintf(cmd, sizeof(cmd), "dd if=/dev/zero of=%s bs=1M count=4096 2>/dev/null", filler);
    if (system(cmd) == -1) {
        say("disk-full: cannot run dd");
    }
    snprintf(r->target, sizeof(r->target), "checkpoint tmpfs");
    uint64_t until = rg_now_ns() + 30000000000ull;
    while (failure_count() <= before && rg_now_ns() < until) {
        rg_sleep_ms(10);
    }
    unlink(filler);
}

static void inject(fault_t kind, fault_rec_t *r)
{
    int a;
    int m;
    switch (kind) {
    case F_WORKER_KILL:
        kill_worker(r, SIGKILL);
        break;
    case F_WORKER_HANG:
        kill_worker(r, SIGSTOP);   /* never resumed: the peers' deadline must catch it */
        break;
    case F_AGENT_KILL:
    case F_PREEMPT:
        a = pick_agent();
        if (a >= 0) {
            r->agent_pid = agents[a];
            kill(agents[a], kind == F_AGENT_KILL ? SIGKILL : SIGTERM);
            snprintf(r->target, sizeof(r->target), "agent %d (pid %d)", agent_id[a],
                     (int)agents[a]);
        }
        break;
    case F_PARTITION:
        a = pick_agent();
        if (a >= 0) {
            /* Longer than the lease TTL (2 s): the node is lost, and must rejoin. */
            int hold = 3 + (int)(next_rand() % 4);
            r->agent_pid = agents[a];
            if (sh("ip link set rgc-h%d down", agent_id[a]) == 0) {
                cut.on = true;
                cut.slot = a;
                cut.heal_at = rg_wall_s() + hold;
            } else {
                say("cannot take the link of agent %d down", agent_id[a]);
            }
            snprintf(r->target, sizeof(r->target), "agent %d (pid %d) cut off %d s", agent_id[a],
                     (int)agents[a], hold);
        }
        break;
    case F_NODE_JOIN:
        start_agent();
        snprintf(r->target, sizeof(r->target), "agent %d", n_started - 1);
        break;
    case F_ETCD_MEMBER:
    case F_ETCD_LEADER:
        m = kind == F_ETCD_LEADER ? etcd_leader() : (int)(next_rand() % (uint64_t)etcd.n);
        if (m < 0) {
            m = 0;
        }
        rg_etcd_server_kill(&etcd, m, SIGKILL);
        snprintf(r->target, sizeof(r->target), "etcd member %d%s", m,
                 kind == F_ETCD_LEADER ? " (leader)" : "");
        break;
    case F_CKPT_KILL: {
        uint64_t until = rg_now_ns() + 20000000000ull;
        while (!write_in_progress() && rg_now_ns() < until) {
            rg_sleep_ms(1);
        }
        kill_worker(r, SIGKILL);
        strncat(r->target, write_in_progress() ? " (during a write)" : " (no write seen)",
                sizeof(r->target) - strlen(r->target) - 1);
        break;
    }
    case F_CORRUPT:
        corrupt_newest(r);
        kill_worker(r, SIGKILL);   /* so that the next round must restore */
        break;
    case F_DISK_FULL:
        disk_full(r);
        break;
    case F_COUNT:
        break;
    }
}

/* Whether round r closed with the agent of this pid among its members (agent ids are
 * host-pid-random). */
static bool in_round(int r, pid_t pid)
{
    char needle[32];
    char key[128];
    char *v;
    size_t len;
    bool found = false;
    snprintf(needle, sizeof(needle), "-%d-", (int)pid);
    snprintf(key, sizeof(key), "/regroup/chaos/rounds/%d/closed", r);
    if (rg_etcd_get(cli, key, 0, &v, &len, NULL) == RG_OK) {
        found = strstr(v, needle) != NULL;
        free(v);
    }
    return found;
}

/* The newest round from `from` on (a few rounds ahead: the fault may strike while a round
 * closes) whose members include the agent with this pid, or -1 if none does. */
static int member_round(int from, pid_t pid)
{
    int found = -1;
    for (int r = from; r <= from + 3; r++) {
        if (in_round(r, pid)) {
            found = r;
        }
    }
    return found;
}

/* After a partition: seconds from the link coming back until the job makes progress in a
 * round the cut-off node is a member of, or -1 (timeout, or the node's agent ended). */
static double wait_rejoin(int slot, int timeout_ms)
{
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (rg_now_ns() < until) {
        progress_t p;
        reap_agents(NULL);
        if (!alive[slot]) {
            return -1;
        }
        if (read_progress(&p) && p.time > cut.healed_at && in_round(p.round, agents[slot])) {
            return p.time - cut.healed_at;
        }
        rg_sleep_ms(5);
    }
    return -1;
}

/* Faults that end the running round (all but the etcd ones). */
static bool ends_round(fault_t k)
{
    return k != F_ETCD_MEMBER && k != F_ETCD_LEADER;
}

/* Faults that take a whole node out of the job (for a while, for a partition). */
static bool takes_node(fault_t k)
{
    return k == F_AGENT_KILL || k == F_PREEMPT || k == F_PARTITION;
}

static bool kind_enabled(fault_t k)
{
    if (strcmp(opt.scenario, "all") == 0) {
        return true;
    }
    return strcmp(opt.scenario, fault_names[k]) == 0;
}

static fault_t choose(void)
{
    fault_t enabled[F_COUNT];
    int n = 0;
    for (int k = 0; k < F_COUNT; k++) {
        if (kind_enabled((fault_t)k)) {
            enabled[n++] = (fault_t)k;
        }
    }
    /* Quick mode walks every kind once first, in a seeded order, then draws. */
    static int order[F_COUNT];
    static int next = -1;
    if (next < 0) {
        for (int i = 0; i < n; i++) {
            order[i] = enabled[i];
        }
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(next_rand() % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        next = 0;
    }
    fault_t k = next < n ? (fault_t)order[next] : enabled[next_rand() % (uint64_t)n];
    /* Keep the job within its size: a node cannot be lost at MIN nor join at MAX. Then the
     * opposite fault comes first, and the one drawn stays due. */
    int min_nodes = opt.nodes > 2 ? opt.nodes - 1 : 1;
    if (takes_node(k) && alive_agents() <= min_nodes) {
        return F_NODE_JOIN;
    }
    if (k == F_NODE_JOIN && alive_agents() >= opt.nodes) {
        return F_PREEMPT;
    }
    if (next < n) {
        next++;
    }
    return k;
}

/* ---- report ---------------------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (n == 0) {
        return -1;
    }
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

typedef struct {
    bool finished;
    bool result;             /* exact: the final state is exactly right; fmnist: accuracy */
    bool checkpoints_verify;
    bool no_lost_work;
    bool no_leaks;
    bool time_bound;
    bool recovered;
    char result_line[256];
    int  verified;
    int  leaks;
} invariants_t;

static void write_report(const invariants_t *inv, double wall_s)
{
    FILE *f = opt.report ? fopen(opt.report, "w") : NULL;
    printf("\n%-14s %6s %9s %9s %9s\n", "fault", "count", "recovered", "p50_s", "p99_s");
    if (f) {
        fprintf(f, "{\"seed\":%llu,\"scenario\":\"%s\",\"nodes\":%d,\"wall_s\":%.1f,\"faults\":[",
                (unsigned long long)opt.seed, opt.scenario, opt.nodes, wall_s);
        for (int i = 0; i < n_recs; i++) {
            const fault_rec_t *r = &recs[i];
            fprintf(f, "%s{\"kind\":\"%s\",\"target\":\"%s\",\"recovery_s\":%.4f,"
                    "\"committed_at_injection\":%lld,\"resumed_step\":%lld,\"steps_redone\":%lld",
                    i ? "," : "", fault_names[r->kind], r->target, r->recovery_s,
                    (long long)r->committed, (long long)r->resumed,
                    (long long)(r->resumed >= 0 ? RG_MAX(0, r->step_before - r->resumed) : 0));
            if (r->kind == F_PARTITION) {
                fprintf(f, ",\"rejoin_s\":%.4f", r->rejoin_s);
            }
            fprintf(f, "}");
        }
        fprintf(f, "],\"by_kind\":{");
    }
    bool first = true;
    for (int k = 0; k < F_COUNT; k++) {
        double v[MAX_FAULTS];
        int n = 0;
        int count = 0;
        for (int i = 0; i < n_recs; i++) {
            if (recs[i].kind == (fault_t)k) {
                count++;
                if (recs[i].recovery_s >= 0) {
                    v[n++] = recs[i].recovery_s;
                }
            }
        }
        if (count == 0) {
            continue;
        }
        double p50 = pct(v, n, 0.5);
        double p99 = pct(v, n, 0.99);
        printf("%-14s %6d %9d %9.3f %9.3f\n", fault_names[k], count, n, p50, p99);
        if (f) {
            fprintf(f, "%s\"%s\":{\"count\":%d,\"recovered\":%d,\"p50_s\":%.4f,\"p99_s\":%.4f}",
                    first ? "" : ",", fault_names[k], count, n, p50, p99);
        }
        first = false;
    }
    bool pass = inv->finished && inv->result && inv->checkpoints_verify && inv->no_lost_work &&
                inv->no_leaks && inv->time_bound && inv->recovered;
    printf("\ninvariants: finished=%d result=%d checkpoints_verify=%d (%d checked) "
           "no_lost_work=%d no_leaks=%d time_bound=%d all_recovered=%d\n%s\nresult: %s\n",
           inv->finished, inv->result, inv->checkpoints_verify, inv->verified, inv->no_lost_work,
           inv->no_leaks, inv->time_bound, inv->recovered, inv->result_line,
           pass ? "PASS" : "FAIL");
    if (f) {
        fprintf(f, "},\"invariants\":{\"finished\":%s,\"result\":%s,\"checkpoints_verify\":%s,"
                "\"no_lost_work\":%s,\"no_leaks\":%s,\"time_bound\":%s,\"all_recovered\":%s},"
                "\"passed\":%s}\n", inv->finished ? "true" : "false",
                inv->result ? "true" : "false", inv->checkpoints_verify ? "true" : "false",
                inv->no_lost_work ? "true" : "false", inv->no_leaks ? "true" : "false",
                inv->time_bound ? "true" : "false", inv->recovered ? "true" : "false",
                pass ? "true" : "false");
        fclose(f);
    }
}

/* ---- main ------------------------------------------------------------------------------- */

/* Interrupted: the agents and etcd die with us (PR_SET_PDEATHSIG); the tmpfs must go too. */
static void on_signal(int sig)
{
    if (tmpfs_mounted) {
        umount2(ckpt_dir, MNT_DETACH);
    }
    net_cleanup();
    _exit(128 + sig);
}

static int usage(const char *why)
{
    fprintf(stderr,
            "rg-chaos: %s\n"
            "usage: chaos/run [--seed N] [--faults N | --duration 30m] [--nodes N]\n"
            "                 [--scenario NAME|all] [--workload exact|fmnist] [--report FILE]\n"
            "                 [--quick]\n"
            "scenarios: all", why);
    for (int k = 0; k < F_COUNT; k++) {
        fprintf(stderr, " %s", fault_names[k]);
    }
    fprintf(stderr, "\n");
    return 2;
}

static double parse_duration(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) {
        return -1;
    }
    if (*end == 'm') {
        v *= 60;
    } else if (*end == 'h') {
        v *= 3600;
    } else if (*end != '\0' && *end != 's') {
        return -1;
    }
    return v;
}

/* Whether an agent's log has a line starting with `text`; the last such line of the first
 * log that has one goes to line_out. */
static bool job_log_has(const char *text, char *line_out, size_t line_len)
{
    for (int k = 0; k < n_started; k++) {
        char path[400];
        char line[1024];
        snprintf(path, sizeof(path), "%s/agent%d.log", dir, k);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue;
        }
        bool found = false;
        while (fgets(line, sizeof(line), f) != NULL) {
            if (strncmp(line, text, strlen(text)) == 0) {
                found = true;
                if (line_out) {
                    snprintf(line_out, line_len, "%.*s", (int)line_len - 1, line);
                    line_out[strcspn(line_out, "\n")] = '\0';
                }
            }
        }
        fclose(f);
        if (found) {
            return true;
        }
    }
    return false;
}

int main(int argc, char **argv)
{
    invariants_t inv = {.checkpoints_verify = true, .no_lost_work = true, .recovered = true};
    opt = (options_t){.seed = 1, .faults = 12, .nodes = 3, .scenario = "all"};
    opt.regroup = getenv("RG_CHAOS_REGROUP");
    opt.exact = getenv("RG_CHAOS_EXACT");
    opt.fmnist = getenv("RG_CHAOS_FMNIST");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            opt.quick = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage("help");
            return 0;
        }
        if (v == NULL) {
            return usage("missing value");
        }
        i++;
        if (strcmp(a, "--seed") == 0) {
            opt.seed = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--faults") == 0) {
            opt.faults = atoi(v);
            if (opt.faults < 1 || opt.faults > MAX_FAULTS) {
                return usage("--faults must be 1..2000");
            }
        } else if (strcmp(a, "--duration") == 0) {
            opt.duration_s = parse_duration(v);
            if (opt.duration_s <= 0) {
                return usage("--duration: e.g. 90s, 30m, 2h");
            }
            opt.faults = MAX_FAULTS;
        } else if (strcmp(a, "--nodes") == 0) {
            opt.nodes = atoi(v);
            if (opt.nodes < 2 || opt.nodes > MAX_NODES) {
                return usage("--nodes must be 2..8");
            }
        } else if (strcmp(a, "--scenario") == 0) {
            opt.scenario = v;
            bool known = strcmp(v, "all") == 0;
            for (int k = 0; k < F_COUNT; k++) {
                known = known || strcmp(v, fault_names[k]) == 0;
            }
            if (!known) {
                return usage("unknown scenario");
            }
        } else if (strcmp(a, "--report") == 0) {
            opt.report = v;
        } else if (strcmp(a, "--workload") == 0) {
            if (strcmp(v, "exact") != 0 && strcmp(v, "fmnist") != 0) {
                return usage("--workload is exact or fmnist");
            }
            opt.use_fmnist = strcmp(v, "fmnist") == 0;
        } else {
            return usage(a);
        }
    }
    if (opt.regroup == NULL || opt.exact == NULL || (opt.use_fmnist && opt.fmnist == NULL)) {
        return usage("RG_CHAOS_REGROUP, RG_CHAOS_EXACT and RG_CHAOS_FMNIST must name the "
                     "regroup, rg-exact and rg-fmnist binaries (chaos/run sets them)");
    }
    /* Quick: every kind once, and room for the faults that keep the job within its size. */
    if (opt.quick && opt.faults < 16) {
        opt.faults = 16;
    }
    rng = opt.seed;
    double t_start = rg_wall_s();
    double deadline_s = opt.duration_s > 0 ? opt.duration_s : 480 + 60.0 * opt.faults;

    snprintf(dir, sizeof(dir), "/tmp/rg-chaos-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(ckpt_dir, sizeof(ckpt_dir), "%s/ckpt", dir);
    snprintf(stop_file, sizeof(stop_file), "%s/stop", dir);
    mkdir(ckpt_dir, 0755);
    /* The checkpoint disk: a small tmpfs of its own, so that it can fill up. */
    tmpfs_mounted = mount("tmpfs", ckpt_dir, "tmpfs", 0, "size=192m") == 0;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    if (!tmpfs_mounted) {
        say("cannot mount a tmpfs for checkpoints (%s): disk-full is skipped", strerror(errno));
    }
    setenv("REGROUP_CKPT_DIR", ckpt_dir, 1);
    setenv("REGROUP_CKPT_KEEP", "3", 1);
    setenv("REGROUP_COMM_TIMEOUT_MS", "3000", 1);
    setenv("REGROUP_CKPT_COMMIT_TIMEOUT_MS", "10000", 1);
    setenv("REGROUP_LOG_LEVEL", "warn", 0);
    if (kind_enabled(F_PARTITION)) {
        netns_mode = net_setup();
    }
    /* Workers in namespaces of their own reach each other over tcp on their veth only. */
    setenv("UCX_NET_DEVICES", netns_mode ? "veth0" : "lo", 1);
    if (netns_mode) {
        setenv("UCX_TLS", "tcp", 1);
    }

    say("chaos: seed %llu, %d faults, %d nodes, scenario %s, run dir %s",
        (unsigned long long)opt.seed, opt.faults, opt.nodes, opt.scenario, dir);
    /* Three members when a fault kills one, else one. */
    int members = kind_enabled(F_ETCD_MEMBER) || kind_enabled(F_ETCD_LEADER) ? 3 : 1;
    if (rg_etcd_server_cluster_start_at(&etcd, members,
                                        "--heartbeat-interval=50 --election-timeout=500",
                                        netns_mode ? NET_PREFIX "0.1" : NULL) != 0) {
        say("cannot start etcd: %s", rg_last_error());
        return 1;
    }
    rg_etcd_params_t ep = {.endpoints = etcd.endpoints, .timeout_ms = 3000};
    if (rg_etcd_create(&ep, &cli) != RG_OK) {
        say("etcd client: %s", rg_last_error());
        return 1;
    }
    for (int i = 0; i < opt.nodes; i++) {
        start_agent();
    }
    progress_t p;
    if (!wait_progress(0, 0, 60000, &p)) {
        say("the job never started");
        inv.recovered = false;
    }
    int injected = 0;
    while (injected < opt.faults && inv.recovered && rg_wall_s() - t_start < deadline_s - 60) {
        reap_agents(NULL);   /* choose among agents that are really alive */
        fault_t kind = choose();
        if ((kind == F_DISK_FULL && !tmpfs_mounted) || (kind == F_PARTITION && !netns_mode)) {
            kind = F_WORKER_KILL;
        }
        /* A join or a preemption that keeps the job within its size stays (a node-join
         * scenario at MAX must first lose a node). */
        if (!kind_enabled(kind) && kind != F_NODE_JOIN && kind != F_PREEMPT) {
            kind = F_WORKER_KILL;
        }
        fault_rec_t *r = &recs[n_recs++];
        memset(r, 0, sizeof(*r));
        r->kind = kind;
        r->resumed = -1;
        /* Let the job run a little (a checkpoint or two) before each fault. */
        progress_t now;
        if (!wait_progress(rg_wall_s(), 0, 30000, &now)) {
            say("no progress before fault %d", injected);
            inv.recovered = false;
            n_recs--;
            break;
        }
        r->round_before = now.round;
        r->step_before = now.step;
        r->committed = committed_step();
        r->t_inject = rg_wall_s();
        inject(kind, r);
        progress_t after;
        /* An agent that was not a member of the running round (it was still stopping its
         * workers, or waiting to be let in) can go without the round ending; one that was a
         * member ends the newest round it was in. */
        bool ends = ends_round(kind);
        int min_round = r->round_before + 1;
        if (ends && takes_node(kind) && r->agent_pid > 0) {
            int mr = member_round(r->round_before, r->agent_pid);
            ends = mr >= 0;
            min_round = mr + 1;
        }
        bool ok = wait_progress(r->t_inject, ends ? min_round : 0, RECOVERY_MAX_MS, &after);
        if (kind != F_PARTITION && r->agent_pid > 0) {
            /* The next fault is chosen among the agents left: wait for this one to go. */
            for (int a = 0; a < n_agent_slots; a++) {
                if (agents[a] == r->agent_pid && alive[a]) {
                    int rc = rg_proc_wait(agents[a], 30000);
                    alive[a] = false;
                    say("agent %d (pid %d) ended: %d", agent_id[a], (int)agents[a], rc);
                }
            }
        }
        r->recovery_s = ok ? after.time - r->t_inject : -1;
        if (kind == F_ETCD_MEMBER || kind == F_ETCD_LEADER) {
            for (int m = 0; m < etcd.n; m++) {
                if (etcd.pid[m] <= 0 && rg_etcd_server_restart(&etcd, m) != 0) {
                    say("cannot restart etcd member %d", m);
                }
            }
        }
        int rr;
        int64_t rs;
        if (ok && ends && read_restored(&rr, &rs) && rr > r->round_before) {
            r->resumed = rs;
            /* A round may resume from before the checkpoint committed when the fault struck
             * only if that checkpoint was corrupted on purpose. */
            if (rs < r->committed && kind != F_CORRUPT) {
                r->lost_work = true;
                inv.no_lost_work = false;
            }
        }
        bool rejoined = true;
        if (kind == F_PARTITION && r->agent_pid > 0) {
            /* The partition lasts its time whether or not the others recovered; then the node
             * must come back into the job. */
            double left_s = cut.heal_at - rg_wall_s();
            if (cut.on && left_s > 0) {
                rg_sleep_ms((int64_t)(left_s * 1000) + 1);
            }
            heal(true);
            rejoined = false;
            for (int a = 0; a < n_agent_slots; a++) {
                if (agents[a] == r->agent_pid) {
                    r->rejoin_s = wait_rejoin(a, RECOVERY_MAX_MS);
                    rejoined = r->rejoin_s >= 0;
                    if (!rejoined) {
                        say("agent %d did not rejoin within %d ms of its link coming back",
                            agent_id[a], RECOVERY_MAX_MS);
                    }
                }
            }
        }
        reap_agents(NULL);
        char back[64] = "";
        if (kind == F_PARTITION) {
            snprintf(back, sizeof(back), ", node back in %.3f s", r->rejoin_s);
        }
        say("fault %2d %-13s %-32s recovered in %7.3f s (committed %lld, resumed %lld)%s",
            injected, fault_names[kind], r->target, r->recovery_s, (long long)r->committed,
            (long long)r->resumed, back);
        if (!ok || !rejoined) {
            /* Where it hung: the job's state as etcd holds it. */
            say("fault %d did not recover%s within %d ms; the job's state:", injected,
                ok ? " (the node cut off did not rejoin)" : "", RECOVERY_MAX_MS);
            if (rg_rdzv_status_print(&ep, "chaos", stdout) != RG_OK) {
                say("cannot read the job's state: %s", rg_last_error());
            }
            inv.recovered = false;
        }
        injected++;
    }
    heal(true);
    /* Finish: the job ends at the next epoch boundary. */
    int fd = open(stop_file, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) {
        close(fd);
    }
    uint64_t until = rg_now_ns() + 120000000000ull;
    int bad_status = 0;
    int bad = 0;
    while (alive_agents() > 0 && rg_now_ns() < until) {
        bad += reap_agents(&bad_status);
        rg_sleep_ms(20);
    }
    if (opt.use_fmnist) {
        /* Floating point, summed in an order that depends on the world size: not exact, but
         * training must still reach the accuracy one epoch gives. */
        inv.finished = alive_agents() == 0 &&
                       job_log_has("test_accuracy=", inv.result_line, sizeof(inv.result_line));
        inv.result = inv.finished && atof(inv.result_line + strlen("test_accuracy=")) >=
                                         FMNIST_MIN_ACCURACY;
    } else {
        inv.finished = alive_agents() == 0 && job_log_has("exact=", NULL, 0);
        inv.result = job_log_has("exact=1", inv.result_line, sizeof(inv.result_line));
        if (!inv.result) {
            job_log_has("exact=", inv.result_line, sizeof(inv.result_line));
        }
    }
    for (int i = 0; i < n_agent_slots; i++) {
        if (alive[i]) {
            say("agent %d (pid %d) still runs: killing it", agent_id[i], (int)agents[i]);
            kill(agents[i], SIGKILL);
            waitpid(agents[i], NULL, 0);
            alive[i] = false;
        }
    }
    /* Every retained checkpoint verifies, but those corrupted on purpose. */
    int64_t *steps = NULL;
    size_t n_steps = 0;
    if (rg_ckpt_list(ckpt_dir, &steps, &n_steps) == RG_OK) {
        for (size_t i = 0; i < n_steps; i++) {
            bool corrupted = false;
            for (int c = 0; c < n_corrupted; c++) {
                corrupted = corrupted || corrupted_steps[c] == steps[i];
            }
            if (corrupted) {
                continue;
            }
            inv.verified++;
            if (rg_ckpt_verify(ckpt_dir, steps[i]) != RG_OK) {
                say("checkpoint step %lld does not verify: %s", (long long)steps[i],
                    rg_last_error());
                inv.checkpoints_verify = false;
            }
        }
    }
    free(steps);
    rg_etcd_destroy(cli);
    rg_etcd_server_stop(&etcd);
    /* Nothing of the run may remain (stopped workers included). */
    pid_t left[64];
    int n_left = 0;
    for (int tries = 0; tries < 100; tries++) {
        n_left = leftover_processes(left, 64);
        if (n_left == 0) {
            break;
        }
        rg_sleep_ms(20);
    }
    inv.leaks = n_left;
    inv.no_leaks = n_left == 0;
    for (int i = 0; i < n_left; i++) {
        say("leaked process %d: killing it", (int)left[i]);
        kill(left[i], SIGKILL);
    }
    double wall = rg_wall_s() - t_start;
    inv.time_bound = wall < deadline_s;
    if (opt.quick && injected < 12) {
        say("only %d faults injected", injected);
        inv.recovered = false;
    }
    for (int k = 0; opt.quick && k < F_COUNT; k++) {
        bool possible = kind_enabled((fault_t)k) && (k != F_DISK_FULL || tmpfs_mounted) &&
                        (k != F_PARTITION || netns_mode);
        int count = 0;
        for (int i = 0; i < n_recs; i++) {
            count += recs[i].kind == (fault_t)k;
        }
        if (possible && count == 0) {
            say("quick run: no %s fault was injected", fault_names[k]);
            inv.recovered = false;
        }
    }
    write_report(&inv, wall);
    if (tmpfs_mounted) {
        umount2(ckpt_dir, MNT_DETACH);
    }
    net_cleanup();
    if (getenv("RG_CHAOS_KEEP") == NULL) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd) != 0) {
            say("cannot remove %s", dir);
        }
    } else {
        say("kept %s", dir);
    }
    bool pass = inv.finished && inv.result && inv.checkpoints_verify && inv.no_lost_work &&
                inv.no_leaks && inv.time_bound && inv.recovered;
    return pass ? 0 : 1;
}
