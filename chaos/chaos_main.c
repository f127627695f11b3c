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
 * exceeded its time bound. See chaos/run --help, and chaos.h for the parts.
 */
#include "chaos.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* The one mutable global: a signal handler gets no argument, so on_signal finds the run's
 * tmpfs and namespaces through it. Set once, before the handlers are installed. */
static chaos_t *signal_run;

/* Interrupted: the agents and etcd die with us (PR_SET_PDEATHSIG); the tmpfs must go too. */
static void on_signal(int sig)
{
    if (signal_run->run.tmpfs_mounted) {
        umount2(signal_run->run.ckpt_dir, MNT_DETACH);
    }
    chaos_net_cleanup(signal_run);
    _exit(128 + sig);
}

/* The run dir, its checkpoint tmpfs, the handlers that remove them, the workers' environment
 * and, with the partition fault, the namespaces. */
static bool run_setup(chaos_t *c)
{
    snprintf(c->run.dir, sizeof(c->run.dir), "/tmp/rg-chaos-XXXXXX");
    if (mkdtemp(c->run.dir) == NULL) {
        perror("mkdtemp");
        return false;
    }
    snprintf(c->run.ckpt_dir, sizeof(c->run.ckpt_dir), "%s/ckpt", c->run.dir);
    snprintf(c->run.stop_file, sizeof(c->run.stop_file), "%s/stop", c->run.dir);
    mkdir(c->run.ckpt_dir, 0755);
    /* The checkpoint disk: a small tmpfs of its own, so that it can fill up. */
    c->run.tmpfs_mounted = mount("tmpfs", c->run.ckpt_dir, "tmpfs", 0, "size=192m") == 0;
    signal_run = c;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    if (!c->run.tmpfs_mounted) {
        chaos_say("cannot mount a tmpfs for checkpoints (%s): disk-full is skipped",
                  strerror(errno));
    }
    setenv("REGROUP_CKPT_DIR", c->run.ckpt_dir, 1);
    setenv("REGROUP_CKPT_KEEP", "3", 1);
    char comm_timeout[32];
    snprintf(comm_timeout, sizeof(comm_timeout), "%d", CHAOS_COMM_TIMEOUT_MS);
    setenv("REGROUP_COMM_TIMEOUT_MS", comm_timeout, 1);
    setenv("REGROUP_CKPT_COMMIT_TIMEOUT_MS", "10000", 1);
    setenv("REGROUP_LOG_LEVEL", "warn", 0);
    bool net = false;
    for (int k = 0; k < F_COUNT; k++) {
        net = net || (chaos_fault_needs_net((chaos_fault_t)k) &&
                      chaos_fault_enabled(c, (chaos_fault_t)k));
    }
    if (net) {
        chaos_net_setup(c);
    }
    /* Workers in namespaces of their own reach each other over tcp on their veth only. */
    setenv("UCX_NET_DEVICES", c->net.on ? "veth0" : "lo", 1);
    if (c->net.on) {
        setenv("UCX_TLS", "tcp", 1);
    }
    return true;
}

static void run_teardown(chaos_t *c)
{
    if (c->run.tmpfs_mounted) {
        umount2(c->run.ckpt_dir, MNT_DETACH);
    }
    chaos_net_cleanup(c);
    if (getenv("RG_CHAOS_KEEP") == NULL) {
        if (!rg_rm_tree(c->run.dir)) {
            chaos_say("cannot remove %s", c->run.dir);
        }
    } else {
        chaos_say("kept %s", c->run.dir);
    }
}

int main(int argc, char **argv)
{
    chaos_opts_t opt;
    int rc = chaos_opts_parse(argc, argv, &opt);
    if (rc >= 0) {
        return rc;
    }
    /* ~300 KiB (the fault records); it lives until exit, as on_signal may read it. */
    chaos_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        perror("calloc");
        return 1;
    }
    c->opt = &opt;
    chaos_faults_init(c);
    c->run.t_start = rg_wall_s();
    if (!run_setup(c)) {
        return 1;
    }
    chaos_say("chaos: seed %llu, %d faults, %d nodes, scenario %s, run dir %s",
              (unsigned long long)opt.seed, opt.faults, opt.nodes, opt.scenario, c->run.dir);
    if (!chaos_etcd_start(c) || !chaos_job_open(c)) {
        return 1;
    }
    for (int i = 0; i < opt.nodes; i++) {
        chaos_agent_start(c);
    }
    chaos_progress_t p;
    if (!chaos_wait_progress(c, 0, 0, 60000, &p)) {
        chaos_say("the job never started");
        c->faults.stalled = true;
    }
    chaos_cycle_run(c);

    chaos_agents_finish(c);
    chaos_check_result(c);
    chaos_agents_kill(c);
    chaos_check_checkpoints(c);
    chaos_check_history(c);
    chaos_job_close(c);
    chaos_etcd_stop(c);
    chaos_check_leaks(c);
    chaos_check_verdict(c);
    chaos_report_write(c);
    run_teardown(c);
    return c->inv.pass ? 0 : 1;
}
