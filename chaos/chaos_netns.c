/*
 * The network of the partition fault. The runner moves into a network namespace of its own,
 * where etcd serves on a bridge; every agent runs in a namespace of its own linked to that
 * bridge by a veth pair, and its workers talk UCX over tcp on it. A partition takes one
 * node's link down for a few seconds and brings it up again; the node must then rejoin.
 */
#include "chaos.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#define NET_BRIDGE "rgc-br"
#define NET_PREFIX "10.213."

/* Runs a shell command line (ip, in the runner's network namespace), its output appended to
 * the run dir's net.log; returns its exit status. */
static int net_sh(const chaos_t *c, const char *fmt, ...) RG_PRINTF(2, 3);
static int net_sh(const chaos_t *c, const char *fmt, ...)
{
    char cmd[600];
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "%s >>%s/net.log 2>&1", cmd, c->run.dir);
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
bool chaos_net_setup(chaos_t *c)
{
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0 || unshare(CLONE_NEWNET) != 0) {
        chaos_say("cannot make a network namespace (%s): the partition fault is skipped",
                  strerror(errno));
        if (self >= 0) {
            close(self);
        }
        return false;
    }
    net_remove_stale();
    bool ok = net_sh(c, "ip link set lo up") == 0 &&
              net_sh(c, "ip link add " NET_BRIDGE " type bridge") == 0 &&
              net_sh(c, "ip addr add " NET_PREFIX "0.1/16 dev " NET_BRIDGE) == 0 &&
              net_sh(c, "ip link set " NET_BRIDGE " up") == 0;
    if (!ok) {
        chaos_say("cannot set up the namespaces' network (see %s/net.log): the partition "
                  "fault is skipped", c->run.dir);
        if (setns(self, CLONE_NEWNET) != 0) {
            chaos_say("cannot go back to the original network namespace: %s", strerror(errno));
        }
    }
    close(self);
    c->net.on = ok;
    return ok;
}

const char *chaos_net_etcd_host(const chaos_t *c)
{
    return c->net.on ? NET_PREFIX "0.1" : NULL;
}

/* The address of agent id k in its namespace. */
void chaos_net_node_addr(int k, char *out, size_t len)
{
    snprintf(out, len, NET_PREFIX "%d.%d", 1 + k / 250, 1 + k % 250);
}

/* Removes a slot's namespace as `ip netns del` does (async-signal-safe); a namespace lives on
 * until its last process is gone, then its veth pair goes with it. */
static void node_ns_remove(chaos_t *c, int i)
{
    if (c->net.ns_path[i][0]) {
        umount2(c->net.ns_path[i], MNT_DETACH);
        unlink(c->net.ns_path[i]);
        c->net.ns_path[i][0] = '\0';
    }
}

/* A node's namespace for the agent in slot i: veth0 inside, its peer rgc-h<id> on the bridge. */
bool chaos_net_node_make(chaos_t *c, int i)
{
    char name[64];
    char addr[32];
    int k = c->procs.id[i];
    node_ns_remove(c, i);   /* the namespace of the slot's previous agent */
    snprintf(name, sizeof(name), "rgc-%d-%d", (int)getpid(), k);
    snprintf(c->net.ns_path[i], sizeof(c->net.ns_path[i]), "/var/run/netns/%s", name);
    chaos_net_node_addr(k, addr, sizeof(addr));
    return net_sh(c, "ip netns add %s", name) == 0 &&
           net_sh(c, "ip link add rgc-h%d type veth peer name veth0 netns %s", k, name) == 0 &&
           net_sh(c, "ip link set rgc-h%d master " NET_BRIDGE " up", k) == 0 &&
           net_sh(c, "ip -n %s addr add %s/16 dev veth0", name, addr) == 0 &&
           net_sh(c, "ip -n %s link set veth0 up", name) == 0 &&
           net_sh(c, "ip -n %s link set lo up", name) == 0;
}

/* The name of slot i's namespace, as `ip netns exec` takes it. */
const char *chaos_net_node_name(const chaos_t *c, int i)
{
    return strrchr(c->net.ns_path[i], '/') + 1;
}

/* Takes the link of slot i's node down; chaos_net_heal brings it up after hold_s seconds. */
bool chaos_net_cut(chaos_t *c, int i, int hold_s)
{
    if (net_sh(c, "ip link set rgc-h%d down", c->procs.id[i]) != 0) {
        return false;
    }
    c->net.cut.on = true;
    c->net.cut.slot = i;
    c->net.cut.heal_at = rg_wall_s() + hold_s;
    return true;
}

bool chaos_net_routes(chaos_t *c, int i, bool etcd, bool add)
{
    const char *ns = chaos_net_node_name(c, i);
    const char *op = add ? "add" : "del";
    if (etcd) {
        return net_sh(c, "ip -n %s route %s blackhole " NET_PREFIX "0.1/32", ns, op) == 0;
    }
    /* etcd's /32 through the link, every other address of the bridge's /16 (the peers) into
     * two /17 blackholes: the more specific route wins. */
    return net_sh(c, "ip -n %s route %s " NET_PREFIX "0.1/32 dev veth0", ns, op) == 0 &&
           net_sh(c, "ip -n %s route %s blackhole " NET_PREFIX "0.0/17", ns, op) == 0 &&
           net_sh(c, "ip -n %s route %s blackhole " NET_PREFIX "128.0/17", ns, op) == 0;
}

void chaos_net_heal(chaos_t *c, bool now)
{
    if (c->net.cut.on && (now || rg_wall_s() >= c->net.cut.heal_at)) {
        int k = c->procs.id[c->net.cut.slot];
        if (net_sh(c, "ip link set rgc-h%d up", k) != 0) {
            chaos_say("cannot bring the link of agent %d back up", k);
        }
        c->net.cut.on = false;
        c->net.cut.healed_at = rg_wall_s();
    }
}

void chaos_net_cleanup(chaos_t *c)
{
    for (int i = 0; i < CHAOS_MAX_SLOTS; i++) {
        node_ns_remove(c, i);
    }
}
