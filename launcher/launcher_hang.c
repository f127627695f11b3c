/*
 * Hang detection: a worker of the worker API beats its slot of the agent's beat page every
 * RG_BEAT_PERIOD_MS from a thread (common/rg_beat.h). At each tick the agent looks at the
 * slots of its running workers; one whose beat is older than --rdzv-conf=hang_timeout, and
 * whose beating process is stopped or gets no CPU time (frozen), is not running at all: the
 * agent kills it (SIGKILL to its process group), and
 * the reaping that follows reports it as a worker failure like any other, about a second
 * after it stopped instead of at its peers' communication timeout.
 */
#include "launcher.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

int64_t launcher_hang_tick_ms(const rg_agent_params_t *cfg, int64_t tick_ms)
{
    /* A quarter of the timeout: found at most a quarter late. */
    return cfg->hang_ms > 0 ? RG_MAX(RG_MIN(tick_ms, cfg->hang_ms / 4), 1) : tick_ms;
}

/* The state letter and the CPU ticks (user + system, every thread) of pid, from
 * /proc/<pid>/stat; false if it cannot be read (gone). */
static bool proc_cpu(pid_t pid, char *state, uint64_t *ticks)
{
    char path[64];
    char buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return false;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* after the command name, which may hold anything */
    unsigned long long ut;
    unsigned long long st;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (p == NULL || sscanf(p + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu",
                            state, &ut, &st) != 3) {
        return false;
    }
    *ticks = ut + st;
    return true;
}

/* Whether worker w, whose beat is older than the timeout, is hung (see launcher.h). */
static bool hung(launcher_worker_t *w, pid_t beater, int64_t now, const rg_agent_params_t *cfg)
{
    char state;
    uint64_t ticks;
    if (!proc_cpu(beater > 0 ? beater : w->pid, &state, &ticks)) {
        return false;   /* gone: reaped at the next look */
    }
    if (state == 'T' || state == 't') {
        return true;    /* stopped */
    }
    if (w->stale_ms == 0 || ticks != w->stale_cpu) {
        if (w->stale_ms != 0) {
            rg_debug("worker rank %d: no heartbeat, but it runs (a loaded machine): not hung",
                     w->rank);
        }
        w->stale_ms = now;
        w->stale_cpu = ticks;
        return false;
    }
    return now - w->stale_ms > cfg->hang_ms;   /* no CPU time all that while: frozen */
}

int launcher_hang_check(launcher_workers_t *ws, const rg_beat_host_t *beat,
                        const rg_agent_params_t *cfg)
{
    int64_t now = (int64_t)(rg_now_ns() / 1000000ull);
    int killed = 0;

    if (cfg->hang_ms <= 0 || beat->page == NULL) {
        return 0;
    }
    for (int i = 0; i < ws->n; i++) {
        launcher_worker_t *w = &ws->w[i];
        int64_t age = rg_beat_age_ms(beat, w->local_rank, now);
        if (!w->running || age < 0 || age <= cfg->hang_ms) {
            w->stale_ms = 0;
            continue;
        }
        if (!hung(w, rg_beat_pid(beat, w->local_rank), now, cfg)) {
            continue;
        }
        fprintf(stderr, "regroup: worker rank %d (pid %d) is hung: no heartbeat for %lld ms "
                "(hang_timeout %lld ms); killing it\n", w->rank, (int)w->pid, (long long)age,
                (long long)cfg->hang_ms);
        rg_warn("worker rank %d hung for %lld ms: SIGKILL", w->rank, (long long)age);
        kill(-w->pid, SIGKILL);
        kill(w->pid, SIGCONT);   /* a stopped process dies only once it runs */
        rg_beat_host_reset((rg_beat_host_t *)beat, w->local_rank);   /* said once */
        w->stale_ms = 0;
        killed++;
    }
    return killed;
}
