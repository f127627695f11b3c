/*
 * The faults: which kind comes next (a seeded schedule; quick mode walks every enabled kind
 * once in a seeded order, then draws), and how each kind is injected. The random stream is
 * splitmix64 from --seed, so a seed replays the same schedule and the same victims.
 */
#include "chaos.h"

#include <regroup/ckpt.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const chaos_fault_names[F_COUNT] = {
    "worker-kill", "worker-hang", "agent-kill", "preempt", "node-join", "etcd-member",
    "etcd-leader", "partition", "ckpt-kill", "corrupt-shard", "disk-full", "agent-hang",
    "etcd-partition", "peer-partition", "etcd-silent", "straggler"};

void chaos_faults_init(chaos_t *c)
{
    c->faults.rng = c->opt->seed;
    c->faults.next = -1;
}

static uint64_t next_rand(chaos_t *c)
{
    c->faults.rng += 0x9e3779b97f4a7c15ull;
    uint64_t z = c->faults.rng;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Faults that end the running round (all but the etcd ones). */
bool chaos_fault_ends_round(chaos_fault_t k)
{
    return k != F_ETCD_MEMBER && k != F_ETCD_LEADER && k != F_ETCD_SILENT;
}

/* Faults that take a whole node out of the job (for a while, for a partition). */
bool chaos_fault_takes_node(chaos_fault_t k)
{
    return k == F_AGENT_KILL || k == F_PREEMPT || k == F_STRAGGLER ||
           chaos_fault_node_returns(k);
}

bool chaos_fault_node_returns(chaos_fault_t k)
{
    return k == F_PARTITION || k == F_AGENT_HANG || k == F_ETCD_PARTITION ||
           k == F_PEER_PARTITION;
}

bool chaos_fault_needs_net(chaos_fault_t k)
{
    return k == F_PARTITION || k == F_ETCD_PARTITION || k == F_PEER_PARTITION;
}

bool chaos_fault_enabled(const chaos_t *c, chaos_fault_t k)
{
    if (k == F_STRAGGLER) {
        /* A straggler's node is left behind only in place; and only on its own scenario so
         * far: among the other kinds (the quick run's seed 1) the job was seen regrouping
         * every few seconds once the straggler was throttled, so that no group lasted its
         * window, and its node never left (docs/benchmarks.md, "Stragglers"). */
        return strcmp(c->opt->recovery, "in-place") == 0 &&
               strcmp(c->opt->scenario, "straggler") == 0;
    }
    if (strcmp(c->opt->scenario, "all") == 0) {
        return true;
    }
    return strcmp(c->opt->scenario, chaos_fault_names[k]) == 0;
}

bool chaos_fault_walk_done(const chaos_t *c)
{
    int n = 0;
    for (int k = 0; k < F_COUNT; k++) {
        n += chaos_fault_enabled(c, (chaos_fault_t)k) ? 1 : 0;
    }
    return c->faults.next >= n;
}

chaos_fault_t chaos_fault_choose(chaos_t *c)
{
    chaos_fault_t enabled[F_COUNT];
    int *order = c->faults.order;
    int n = 0;
    for (int k = 0; k < F_COUNT; k++) {
        if (chaos_fault_enabled(c, (chaos_fault_t)k)) {
            enabled[n++] = (chaos_fault_t)k;
        }
    }
    /* Quick mode walks every kind once first, in a seeded order, then draws. */
    if (c->faults.next < 0) {
        for (int i = 0; i < n; i++) {
            order[i] = enabled[i];
        }
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(next_rand(c) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        c->faults.next = 0;
    }
    int next = c->faults.next;
    chaos_fault_t k = next < n ? (chaos_fault_t)order[next]
                               : enabled[next_rand(c) % (uint64_t)n];
    /* Keep the job within its size: a node cannot be lost at MIN nor join at MAX. Then the
     * opposite fault comes first, and the one drawn stays due. */
    if (chaos_fault_takes_node(k) && chaos_agents_alive(c) <= c->opt->min_nodes) {
        return F_NODE_JOIN;
    }
    if (k == F_NODE_JOIN && chaos_agents_alive(c) >= c->opt->nodes) {
        return F_PREEMPT;
    }
    if (next < n) {
        c->faults.next++;
    }
    return k;
}

/* ---- injection ------------------------------------------------------------------------ */

static void corrupt_newest(chaos_t *c, chaos_fault_rec_t *r)
{
    int64_t *steps = NULL;
    size_t n = 0;
    if (rg_ckpt_list(c->run.ckpt_dir, &steps, &n) != RG_OK || n == 0) {
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
    snprintf(path, sizeof(path), "%s/step-%lld/shard-0.rgs", c->run.ckpt_dir,
             (long long)newest);
    int fd = open(path, O_RDWR);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size > 64) {
        unsigned char b;
        off_t at = sb.st_size / 2;
        if (pread(fd, &b, 1, at) == 1) {
            b ^= 0x5a;
            if (pwrite(fd, &b, 1, at) == 1) {
                c->faults.corrupted[c->faults.n_corrupted++] = newest;
            }
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    snprintf(r->target, sizeof(r->target), "step-%lld shard 0", (long long)newest);
}

/* Whether a checkpoint is being written: a step dir without its manifest yet. */
static bool write_in_progress(const chaos_t *c)
{
    DIR *d = opendir(c->run.ckpt_dir);
    struct dirent *e;
    bool busy = false;
    while (d != NULL && (e = readdir(d)) != NULL && !busy) {
        char path[600];
        struct stat sb;
        if (strncmp(e->d_name, "step-", 5) != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s/MANIFEST", c->run.ckpt_dir, e->d_name);
        busy = stat(path, &sb) != 0;
    }
    if (d) {
        closedir(d);
    }
    return busy;
}

/* A worker drawn from those running, or -1 (r's target says "no worker"). */
static pid_t pick_worker(chaos_t *c, chaos_fault_rec_t *r)
{
    pid_t w[64];
    int n = chaos_workers_find(c, w, 64);
    if (n == 0) {
        snprintf(r->target, sizeof(r->target), "no worker");
        return -1;
    }
    return w[next_rand(c) % (uint64_t)n];
}

static void kill_worker(chaos_t *c, chaos_fault_rec_t *r, int sig)
{
    pid_t victim = pick_worker(c, r);
    if (victim < 0) {
        return;
    }
    kill(victim, sig);
    snprintf(r->target, sizeof(r->target), "worker pid %d", (int)victim);
}

static int pick_agent(chaos_t *c)
{
    int live[CHAOS_MAX_SLOTS];
    int n = 0;
    for (int i = 0; i < c->procs.n_slots; i++) {
        if (c->procs.alive[i]) {
            live[n++] = i;
        }
    }
    return n ? live[next_rand(c) % (uint64_t)n] : -1;
}

/* Writes zeros to path until the file system is full or max_mib are written. */
static void fill_file(const char *path, int max_mib)
{
    static const char zeros[1 << 16];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        chaos_say("disk-full: cannot create %s: %s", path, strerror(errno));
        return;
    }
    for (int64_t left = (int64_t)max_mib << 20; left > 0;) {
        ssize_t n = write(fd, zeros, sizeof(zeros));
        if (n <= 0) {
            break; /* ENOSPC is what this fault is for */
        }
        left -= n;
    }
    close(fd);
}

/* Fills the checkpoint file system, waits until a worker fails on it, then frees it. */
static void disk_full(chaos_t *c, chaos_fault_rec_t *r)
{
    char filler[400];
    int64_t before = chaos_job_failure_count(c);
    snprintf(filler, sizeof(filler), "%s/filler", c->run.ckpt_dir);
    fill_file(filler, 4096);
    snprintf(r->target, sizeof(r->target), "checkpoint tmpfs");
    uint64_t until = rg_now_ns() + 30000000000ull;
    while (chaos_job_failure_count(c) <= before && rg_now_ns() < until) {
        rg_sleep_ms(10);
    }
    unlink(filler);
}

/* A node lost for a while: longer than the lease TTL (2 s), so it must rejoin. */
static void partition(chaos_t *c, chaos_fault_rec_t *r, int a)
{
    int hold = 3 + (int)(next_rand(c) % 4);
    int id = c->procs.id[a];
    r->agent_pid = c->procs.pid[a];
    if (!chaos_net_cut(c, a, hold)) {
        chaos_say("cannot take the link of agent %d down", id);
    }
    snprintf(r->target, sizeof(r->target), "agent %d (pid %d) cut off %d s", id,
             (int)c->procs.pid[a], hold);
}

/* A lasting fault on slot (an agent) or member (etcd), ended by chaos_fault_heal. */
static void hold_start(chaos_t *c, chaos_fault_t kind, int slot, int hold_s)
{
    c->faults.hold.on = true;
    c->faults.hold.kind = kind;
    c->faults.hold.slot = slot;
    c->faults.hold.heal_at = rg_wall_s() + hold_s;
}

/* One step of a straggler's duty cycle, when due; false once the worker is gone. */
static bool throttle_step(chaos_t *c)
{
    uint64_t t = rg_now_ns();
    if (t < c->faults.hold.toggle_ns) {
        return true;
    }
    bool stop = !c->faults.hold.stopped;
    if (kill(c->faults.hold.worker, stop ? SIGSTOP : SIGCONT) != 0) {
        return false;
    }
    c->faults.hold.stopped = stop;
    int ms = stop ? CHAOS_STRAGGLER_CYCLE_MS - CHAOS_STRAGGLER_RUN_MS : CHAOS_STRAGGLER_RUN_MS;
    c->faults.hold.toggle_ns = t + (uint64_t)ms * 1000000ull;
    return true;
}

void chaos_fault_heal(chaos_t *c, bool now)
{
    chaos_net_heal(c, now);
    if (c->faults.hold.on && c->faults.hold.kind == F_STRAGGLER && !now &&
        throttle_step(c)) {
        return;   /* it lasts until the worker is gone (its node left) or the fault's end */
    }
    if (!c->faults.hold.on || (!now && rg_wall_s() < c->faults.hold.heal_at &&
                               c->faults.hold.kind != F_STRAGGLER)) {
        return;
    }
    int a = c->faults.hold.slot;
    switch (c->faults.hold.kind) {
    case F_AGENT_HANG:
        if (c->procs.alive[a]) {
            kill(c->procs.pid[a], SIGCONT);
        }
        break;
    case F_ETCD_PARTITION:
    case F_PEER_PARTITION:
        if (!chaos_net_routes(c, a, c->faults.hold.kind == F_ETCD_PARTITION, false)) {
            chaos_say("cannot remove the routes of agent %d's partition", c->procs.id[a]);
        }
        break;
    case F_ETCD_SILENT:
        chaos_etcd_signal(c, a, SIGCONT);
        break;
    case F_STRAGGLER:
        kill(c->faults.hold.worker, SIGCONT);   /* (ESRCH once it is gone) */
        break;
    default:
        break;
    }
    c->faults.hold.on = false;
    c->faults.hold.healed_at = rg_wall_s();
}

double chaos_fault_heal_at(const chaos_t *c)
{
    return c->faults.hold.on ? c->faults.hold.heal_at
                             : c->net.cut.on ? c->net.cut.heal_at : 0;
}

double chaos_fault_healed_at(const chaos_t *c)
{
    return RG_MAX(c->faults.hold.healed_at, c->net.cut.healed_at);
}

/* A worker throttled to a quarter of a core from now on (chaos_fault_heal drives it): in
 * place its rank is found a straggler and its node leaves the job. */
static void straggler(chaos_t *c, chaos_fault_rec_t *r)
{
    pid_t victim = pick_worker(c, r);
    if (victim < 0) {
        return;
    }
    int slot = -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)victim);
    FILE *f = fopen(path, "r");
    int ppid = 0;
    if (f != NULL) {
        if (fscanf(f, "%*d %*s %*c %d", &ppid) != 1) {
            ppid = 0;
        }
        fclose(f);
    }
    for (int i = 0; i < c->procs.n_slots; i++) {
        if (c->procs.alive[i] && c->procs.pid[i] == ppid) {
            slot = i;
        }
    }
    if (slot < 0) {
        snprintf(r->target, sizeof(r->target), "worker pid %d (no agent)", (int)victim);
        return;
    }
    r->agent_pid = c->procs.pid[slot];
    hold_start(c, F_STRAGGLER, slot, CHAOS_RECOVERY_MAX_MS / 1000);
    c->faults.hold.worker = victim;
    c->faults.hold.stopped = false;
    c->faults.hold.toggle_ns = rg_now_ns() + CHAOS_STRAGGLER_RUN_MS * 1000000ull;
    snprintf(r->target, sizeof(r->target), "worker pid %d (agent %d) at %d%%", (int)victim,
             c->procs.id[slot], 100 * CHAOS_STRAGGLER_RUN_MS / CHAOS_STRAGGLER_CYCLE_MS);
}

/* A node stopped, cut from etcd or from its peers for longer than the lease TTL (2 s). */
static void node_hold(chaos_t *c, chaos_fault_rec_t *r, int a)
{
    int hold = 3 + (int)(next_rand(c) % 3);
    int id = c->procs.id[a];
    bool ok;
    r->agent_pid = c->procs.pid[a];
    if (r->kind == F_AGENT_HANG) {
        ok = kill(r->agent_pid, SIGSTOP) == 0;
    } else {
        ok = chaos_net_routes(c, a, r->kind == F_ETCD_PARTITION, true);
    }
    if (!ok) {
        chaos_say("cannot inject %s on agent %d", chaos_fault_names[r->kind], id);
    }
    hold_start(c, r->kind, a, hold);
    snprintf(r->target, sizeof(r->target), "agent %d (pid %d) for %d s", id,
             (int)r->agent_pid, hold);
}

void chaos_fault_inject(chaos_t *c, chaos_fault_rec_t *r)
{
    chaos_fault_t kind = r->kind;
    int a;
    int m;
    switch (kind) {
    case F_WORKER_KILL:
        kill_worker(c, r, SIGKILL);
        break;
    case F_WORKER_HANG:
        kill_worker(c, r, SIGSTOP);   /* never resumed: its agent's hang detection ends it */
        break;
    case F_AGENT_KILL:
    case F_PREEMPT:
        a = pick_agent(c);
        if (a >= 0) {
            r->agent_pid = c->procs.pid[a];
            kill(r->agent_pid, kind == F_AGENT_KILL ? SIGKILL : SIGTERM);
            snprintf(r->target, sizeof(r->target), "agent %d (pid %d)", c->procs.id[a],
                     (int)r->agent_pid);
        }
        break;
    case F_PARTITION:
        a = pick_agent(c);
        if (a >= 0) {
            partition(c, r, a);
        }
        break;
    case F_NODE_JOIN:
        chaos_agent_start(c);
        snprintf(r->target, sizeof(r->target), "agent %d", c->procs.n_started - 1);
        break;
    case F_ETCD_MEMBER:
    case F_ETCD_LEADER:
        m = kind == F_ETCD_LEADER ? chaos_etcd_leader(c)
                                  : (int)(next_rand(c) % (uint64_t)c->procs.etcd.n);
        if (m < 0) {
            m = 0;
        }
        chaos_etcd_kill(c, m);
        snprintf(r->target, sizeof(r->target), "etcd member %d%s", m,
                 kind == F_ETCD_LEADER ? " (leader)" : "");
        break;
    case F_CKPT_KILL: {
        uint64_t until = rg_now_ns() + 20000000000ull;
        while (!write_in_progress(c) && rg_now_ns() < until) {
            rg_sleep_ms(1);
        }
        kill_worker(c, r, SIGKILL);
        strncat(r->target, write_in_progress(c) ? " (during a write)" : " (no write seen)",
                sizeof(r->target) - strlen(r->target) - 1);
        break;
    }
    case F_CORRUPT:
        corrupt_newest(c, r);
        kill_worker(c, r, SIGKILL);   /* so that the next round must restore */
        break;
    case F_DISK_FULL:
        disk_full(c, r);
        break;
    case F_AGENT_HANG:
    case F_ETCD_PARTITION:
    case F_PEER_PARTITION:
        a = pick_agent(c);
        if (a >= 0) {
            node_hold(c, r, a);   /* (a peer-only partition's node may stay a member: the
                                     * first of two, or at the minimum size) */
        }
        break;
    case F_ETCD_SILENT:
        m = (int)(next_rand(c) % (uint64_t)c->procs.etcd.n);
        chaos_etcd_signal(c, m, SIGSTOP);
        hold_start(c, kind, m, 2 + (int)(next_rand(c) % 3));
        snprintf(r->target, sizeof(r->target), "etcd member %d stopped", m);
        break;
    case F_STRAGGLER:
        straggler(c, r);
        break;
    case F_COUNT:
        break;
    }
}
