/*
 * Counting what --nproc-per-node=cpu|gpu|auto names, and binding local ranks to CPUs
 * (--numa-binding, torchrun's values). Everything is read from /proc and /sys before the
 * workers are forked; the child only calls sched_setaffinity with its precomputed set.
 *
 * Local rank i is taken to belong to NUMA node i * nodes / nproc (ranks in blocks, as GPUs
 * are numbered in the order of their nodes on the machines torchrun's binding targets).
 */
#include "launcher.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_NODES 64

int launcher_usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        return (int)sysconf(_SC_NPROCESSORS_ONLN);
    }
    return CPU_COUNT(&set);
}

int launcher_visible_gpus(void)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;

    if (cvd != NULL) {
        /* As the CUDA runtime reads it: the devices listed up to the first invalid one
         * ("-1" hides them all). */
        for (const char *s = cvd; *s != '\0';) {
            size_t len = strcspn(s, ",");
            if (len == 0 || s[0] == '-' || s[0] == ' ') {
                break;
            }
            n++;
            s += len;
            s += *s == ',';
        }
        return n;
    }
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d == NULL) {
        return 0;
    }
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

/* A cpulist ("0-3,8,10-11") into set; false if the file cannot be read. */
static bool read_cpulist(const char *path, cpu_set_t *set)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    CPU_ZERO(set);
    if (f == NULL) {
        return false;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    for (char *s = buf; *s != '\0' && *s != '\n';) {
        char *end;
        long lo = strtol(s, &end, 10);
        long hi = lo;
        if (end == s) {
            return false;
        }
        if (*end == '-') {
            s = end + 1;
            hi = strtol(s, &end, 10);
            if (end == s) {
                return false;
            }
        }
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++) {
            CPU_SET((int)c, set);
        }
        s = end + (*end == ',');
    }
    return true;
}

/* <sys>/cpu/cpu<cpu>/<name>, a number, or -1. */
static long read_long(const char *sys, int cpu, const char *name)
{
    char path[600];
    long v = -1;
    snprintf(path, sizeof(path), "%s/cpu/cpu%d/%s", sys, cpu, name);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%ld", &v) != 1) {
            v = -1;
        }
        fclose(f);
    }
    return v;
}

/* The usable CPUs of each NUMA node that has some; at least one node (all usable CPUs when
 * the machine shows none). */
static int numa_nodes(const char *sys, const cpu_set_t *usable, cpu_set_t *nodes)
{
    cpu_set_t online;
    char path[600];
    int n = 0;
    snprintf(path, sizeof(path), "%s/node/online", sys);
    if (read_cpulist(path, &online)) {
        for (int k = 0; k < CPU_SETSIZE && n < MAX_NODES; k++) {
            if (!CPU_ISSET(k, &online)) {
                continue;
            }
            snprintf(path, sizeof(path), "%s/node/node%d/cpulist", sys, k);
            if (read_cpulist(path, &nodes[n])) {
                CPU_AND(&nodes[n], &nodes[n], usable);
                n += CPU_COUNT(&nodes[n]) > 0;
            }
        }
    }
    if (n == 0) {
        nodes[0] = *usable;
        n = 1;
    }
    return n;
}

/* The groups of node's CPUs that share a core (l3 false) or an L3 cache, in the order of
 * their first CPU; at most cap groups. */
static int cpu_groups(const char *sys, const cpu_set_t *node, bool l3, cpu_set_t *groups,
                      int cap)
{
    int n = 0;
    cpu_set_t left = *node;
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++) {
        cpu_set_t g;
        if (!CPU_ISSET(c, &left)) {
            continue;
        }
        char path[600];
        snprintf(path, sizeof(path), "%s/cpu/cpu%d/%s", sys, c,
                 l3 ? "cache/index3/shared_cpu_list" : "topology/thread_siblings_list");
        if (!read_cpulist(path, &g)) {
            CPU_ZERO(&g);
            CPU_SET(c, &g);
        }
        CPU_AND(&g, &g, &left);
        CPU_SET(c, &g);
        CPU_XOR(&left, &left, &g);
        groups[n++] = g;
    }
    return n;
}

rg_status_t launcher_numa_sets(const rg_agent_params_t *p, cpu_set_t *sets, int nproc)
{
    cpu_set_t usable;
    if (sched_getaffinity(0, sizeof(usable), &usable) != 0) {
        return rg_error(RG_ESYS, "--numa-binding: sched_getaffinity: %m");
    }
    return launcher_numa_sets_at("/sys/devices/system", p->numa, &usable, sets, nproc);
}

rg_status_t launcher_numa_sets_at(const char *sys, rg_agent_numa_t numa,
                                  const cpu_set_t *usable, cpu_set_t *sets, int nproc)
{
    static const char *const names[] = {"none", "node", "socket", "exclusive", "core-complex"};
    cpu_set_t *nodes = calloc(MAX_NODES, sizeof(cpu_set_t));
    cpu_set_t *groups = calloc(CPU_SETSIZE, sizeof(cpu_set_t));
    rg_status_t st = RG_OK;

    if (nodes == NULL || groups == NULL) {
        free(nodes);
        free(groups);
        return rg_error(RG_ENOMEM, "--numa-binding");
    }
    int n_nodes = numa_nodes(sys, usable, nodes);
    for (int i = 0; i < nproc; i++) {
        int k = (int)((int64_t)i * n_nodes / nproc);
        /* the local ranks on node k: first..first+m-1 */
        int first = (int)(((int64_t)k * nproc + n_nodes - 1) / n_nodes);
        int m = (int)(((int64_t)(k + 1) * nproc + n_nodes - 1) / n_nodes) - first;
        int j = i - first;
        int g;
        switch (numa) {
        case RG_AGENT_NUMA_NONE:
        case RG_AGENT_NUMA_NODE:
            sets[i] = nodes[k];
            break;
        case RG_AGENT_NUMA_SOCKET: {
            long pkg = -1;
            for (int c = 0; c < CPU_SETSIZE && pkg < 0; c++) {
                if (CPU_ISSET(c, &nodes[k])) {
                    pkg = read_long(sys, c, "topology/physical_package_id");
                }
            }
            sets[i] = nodes[k];
            for (int c = 0; c < CPU_SETSIZE && pkg >= 0; c++) {
                if (CPU_ISSET(c, usable) &&
                    read_long(sys, c, "topology/physical_package_id") == pkg) {
                    CPU_SET(c, &sets[i]);
                }
            }
            break;
        }
        case RG_AGENT_NUMA_EXCLUSIVE:
            /* whole cores (their hyperthreads together), split in contiguous shares */
            g = cpu_groups(sys, &nodes[k], false, groups, CPU_SETSIZE);
            if (g < m) {
                st = rg_error(RG_EINVAL, "--numa-binding=exclusive: NUMA node %d has %d usable "
                              "cores for %d local ranks; use --numa-binding=node or fewer "
                              "workers", k, g, m);
                goto out;
            }
            CPU_ZERO(&sets[i]);
            for (int c = j * g / m; c < (j + 1) * g / m; c++) {
                CPU_OR(&sets[i], &sets[i], &groups[c]);
            }
            break;
        case RG_AGENT_NUMA_CORE_COMPLEX:
            /* one L3 group each, shared round robin when the node has fewer than its ranks */
            g = cpu_groups(sys, &nodes[k], true, groups, CPU_SETSIZE);
            sets[i] = groups[j % g];
            break;
        }
        if (CPU_COUNT(&sets[i]) == 0) {
            st = rg_error(RG_EINVAL, "--numa-binding=%s: no usable CPU for local rank %d",
                          names[numa], i);
            goto out;
        }
    }
out:
    free(nodes);
    free(groups);
    return st;
}
