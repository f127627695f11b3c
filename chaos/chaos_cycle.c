/*
 * The fault cycle. Each fault waits for the job to make progress, is injected, and is timed
 * until the job makes progress again (in a later round when the fault ends the round the
 * job was in); a partition is also timed from the link coming back until the node cut off
 * is a member again. What happened goes into the fault's record; a job that stops making
 * progress sets faults.stalled and ends the cycle. chaos_check.c judges the records.
 */
#include "chaos.h"

#include <string.h>

bool chaos_wait_progress(chaos_t *c, double after, int min_round, int timeout_ms,
                         chaos_progress_t *out)
{
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (rg_now_ns() < until) {
        chaos_progress_t p;
        chaos_fault_heal(c, false);
        if (chaos_job_progress(c, &p) && p.time > after && p.round >= min_round) {
            *out = p;
            return true;
        }
        if (chaos_agents_reap(c) > 0 && chaos_agents_alive(c) == 0) {
            return false;
        }
        rg_sleep_ms(5);
    }
    return false;
}

/* The newest round from `from` on (a few rounds ahead: the fault may strike while a round
 * closes) whose members include the agent with this pid, or -1 if none does. */
static int member_round(chaos_t *c, int from, pid_t pid)
{
    int found = -1;
    for (int r = from; r <= from + 3; r++) {
        if (chaos_job_agent_in_round(c, r, pid)) {
            found = r;
        }
    }
    return found;
}

/* After a partition (or an agent's hang): seconds from the node's coming back until the job
 * makes progress in a round that node is a member of, or -1 (timeout, or its agent ended). */
static double wait_rejoin(chaos_t *c, int slot, int timeout_ms)
{
    uint64_t until = rg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    double healed_at = chaos_fault_healed_at(c);
    while (rg_now_ns() < until) {
        chaos_progress_t p;
        chaos_agents_reap(c);
        if (!c->procs.alive[slot]) {
            return -1;
        }
        if (chaos_job_progress(c, &p) && p.time > healed_at &&
            chaos_job_agent_in_round(c, p.round, c->procs.pid[slot])) {
            return p.time - healed_at;
        }
        rg_sleep_ms(5);
    }
    return -1;
}

/* The partition lasts its time whether or not the others recovered; then the node must come
 * back into the job. Returns whether it did. */
static bool partition_rejoined(chaos_t *c, chaos_fault_rec_t *r)
{
    double left_s = chaos_fault_heal_at(c) - rg_wall_s();
    if (chaos_fault_heal_at(c) > 0 && left_s > 0) {
        rg_sleep_ms((int64_t)(left_s * 1000) + 1);
    }
    chaos_fault_heal(c, true);
    bool rejoined = false;
    for (int a = 0; a < c->procs.n_slots; a++) {
        if (c->procs.pid[a] == r->agent_pid) {
            r->rejoin_s = wait_rejoin(c, a, CHAOS_RECOVERY_MAX_MS);
            rejoined = r->rejoin_s >= 0;
            if (!rejoined) {
                chaos_say("agent %d did not rejoin within %d ms of its coming back",
                          c->procs.id[a], CHAOS_RECOVERY_MAX_MS);
            }
        }
    }
    return rejoined;
}

/* A straggler's node must leave the job (its agent exits): waits for that, driving the
 * throttle meanwhile (a worker left stopped would be found hung and replaced, unthrottled),
 * then for the job's progress without it. Progress alone is no recovery: a round may change
 * for another reason while the straggler is still in (its node was at the job's minimum
 * size, or its window had not passed). False if the node did not go. */
static bool straggler_left(chaos_t *c, chaos_fault_rec_t *r, chaos_progress_t *after)
{
    uint64_t until = rg_now_ns() + (uint64_t)CHAOS_RECOVERY_MAX_MS * 1000000ull;
    int slot = -1;
    for (int a = 0; a < c->procs.n_slots; a++) {
        if (c->procs.pid[a] == r->agent_pid) {
            slot = a;
        }
    }
    while (slot >= 0 && c->procs.alive[slot] && rg_now_ns() < until) {
        chaos_fault_heal(c, false);
        chaos_agents_reap(c);
        rg_sleep_ms(5);
    }
    chaos_fault_heal(c, true);
    if (slot < 0 || c->procs.alive[slot]) {
        chaos_say("the straggler's node (agent pid %d) did not leave within %d ms",
                  (int)r->agent_pid, CHAOS_RECOVERY_MAX_MS);
        return false;
    }
    return chaos_wait_progress(c, rg_wall_s(), 0, CHAOS_RECOVERY_MAX_MS, after);
}

/* The kind to inject next: the schedule's, unless this machine or the scenario rules it out. */
static chaos_fault_t next_kind(chaos_t *c)
{
    chaos_agents_reap(c);   /* choose among agents that are really alive */
    chaos_fault_t kind = chaos_fault_choose(c);
    if ((kind == F_DISK_FULL && !c->run.tmpfs_mounted) ||
        (chaos_fault_needs_net(kind) && !c->net.on)) {
        kind = F_WORKER_KILL;
    }
    /* A join or a preemption that keeps the job within its size stays (a node-join scenario
     * at MAX must first lose a node). */
    if (!chaos_fault_enabled(c, kind) && kind != F_NODE_JOIN && kind != F_PREEMPT) {
        kind = F_WORKER_KILL;
    }
    return kind;
}

/* Injects fault number i and follows it; false if the job did not make progress before it
 * (no record is kept then). */
static bool cycle_one(chaos_t *c, int i)
{
    chaos_fault_t kind = next_kind(c);
    chaos_fault_rec_t *r = &c->faults.rec[c->faults.n_recs];
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->resumed = -1;
    /* Let the job run a little (a checkpoint or two) before each fault. */
    chaos_progress_t now;
    if (!chaos_wait_progress(c, rg_wall_s(), 0, 30000, &now)) {
        /* Where it stalled, while it still does (a soak's run dir is gone once it fails,
         * unless RG_CHAOS_KEEP is set). */
        chaos_say("no progress before fault %d for 30 s; the job's state and the agents' logs:",
                  i);
        chaos_job_print_state(c, stdout);
        chaos_agent_logs_tail(c);
        return false;
    }
    c->faults.n_recs++;
    r->round_before = now.round;
    r->step_before = now.step;
    r->committed = chaos_job_committed_step(c);
    r->t_inject = rg_wall_s();
    if (kind == F_PEER_PARTITION) {
        for (int a = 0; a < c->procs.n_slots; a++) {
            r->members_before += c->procs.alive[a] &&
                                 chaos_job_agent_in_round(c, now.round, c->procs.pid[a]);
        }
    }
    chaos_fault_inject(c, r);
    r->heal_at = chaos_fault_heal_at(c);
    /* An agent that was not a member of the running round (it was still stopping its
     * workers, or waiting to be let in) can go without the round ending; one that was a
     * member ends the newest round it was in. */
    bool ends = chaos_fault_ends_round(kind);
    int min_round = r->round_before + 1;
    if (ends && chaos_fault_takes_node(kind) && r->agent_pid > 0) {
        int mr = member_round(c, r->round_before, r->agent_pid);
        ends = mr >= 0;
        r->was_member = ends;
        min_round = mr + 1;
    }
    chaos_progress_t after;
    bool ok;
    if (kind == F_STRAGGLER && r->agent_pid > 0) {
        ok = straggler_left(c, r, &after);
    } else {
        ok = chaos_wait_progress(c, r->t_inject, ends ? min_round : 0, CHAOS_RECOVERY_MAX_MS,
                                 &after);
    }
    if (!chaos_fault_node_returns(kind) && r->agent_pid > 0) {
        /* The next fault is chosen among the agents left: wait for this one to go. */
        chaos_agent_wait_gone(c, r->agent_pid);
    }
    r->recovery_s = ok ? after.time - r->t_inject : -1;
    if (kind == F_ETCD_MEMBER || kind == F_ETCD_LEADER) {
        chaos_etcd_restart_dead(c);
    }
    int rr;
    int64_t rs;
    if (ok && ends && chaos_job_restored(c, &rr, &rs) && rr > r->round_before) {
        r->resumed = rs;
        /* A round may resume from before the checkpoint committed when the fault struck
         * only if that checkpoint was corrupted on purpose. */
        r->lost_work = rs < r->committed && kind != F_CORRUPT;
    }
    bool rejoined = true;
    if (chaos_fault_node_returns(kind) && r->agent_pid > 0) {
        rejoined = partition_rejoined(c, r);
    }
    chaos_fault_heal(c, true);   /* a lasting fault the job recovered from before its end */
    chaos_agents_reap(c);
    char back[64] = "";
    if (chaos_fault_node_returns(kind)) {
        snprintf(back, sizeof(back), ", node back in %.3f s", r->rejoin_s);
    }
    chaos_say("fault %2d %-13s %-32s recovered in %7.3f s (committed %lld, resumed %lld)%s", i,
              chaos_fault_names[kind], r->target, r->recovery_s, (long long)r->committed,
              (long long)r->resumed, back);
    if (ok && r->recovery_s > chaos_p99_bound_s(c, kind)) {
        /* The verdict fails it later, when the logs have moved on: what the agents said
         * while it recovered, now (a slow recovery seen once in CI is otherwise lost). */
        chaos_say("fault %d recovered past its kind's p99 bound (%.3f s): the agents' logs "
                  "now", i, chaos_p99_bound_s(c, kind));
        chaos_agent_logs_tail(c);
    }
    if (!ok || !rejoined) {
        /* Where it hung: the job's state as etcd holds it. */
        chaos_say("fault %d did not recover%s within %d ms; the job's state:", i,
                  ok ? " (the node cut off did not rejoin)" : "", CHAOS_RECOVERY_MAX_MS);
        chaos_job_print_state(c, stdout);
        c->faults.stalled = true;
    }
    return true;
}

void chaos_cycle_run(chaos_t *c)
{
    const chaos_opts_t *opt = c->opt;
    /* A quick run injects every kind: past --faults while the walk is not done (a node that
     * had to join or leave first to keep the job within its size takes a turn), by at most
     * one more fault per kind. */
    for (int i = 0; (i < opt->faults || (opt->quick && !chaos_fault_walk_done(c) &&
                                         i < opt->faults + F_COUNT)) &&
                    !c->faults.stalled &&
                    rg_wall_s() - c->run.t_start < opt->deadline_s - 60; i++) {
        if (!cycle_one(c, i)) {
            c->faults.stalled = true;
            break;
        }
    }
    chaos_fault_heal(c, true);
}
