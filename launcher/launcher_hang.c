/*
 * Hang detection: a worker of the worker API beats its slot of the agent's beat page every
 * RG_BEAT_PERIOD_MS from a thread (common/rg_beat.h). At each tick the agent looks at the
 * slots of its running workers; one whose beat is older than --rdzv-conf=hang_timeout is not
 * running at all (stopped, frozen): the agent kills it (SIGKILL to its process group), and
 * the reaping that follows reports it as a worker failure like any other, about a second
 * after it stopped instead of at its peers' communication timeout.
 */
#include "launcher.h"

#include <signal.h>
#include <stdio.h>

int64_t launcher_hang_tick_ms(const rg_agent_params_t *cfg, int64_t tick_ms)
{
    /* A quarter of the timeout: found at most a quarter late. */
    return cfg->hang_ms > 0 ? RG_MAX(RG_MIN(tick_ms, cfg->hang_ms / 4), 1) : tick_ms;
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
            continue;
        }
        fprintf(stderr, "regroup: worker rank %d (pid %d) is hung: no heartbeat for %lld ms "
                "(hang_timeout %lld ms); killing it\n", w->rank, (int)w->pid, (long long)age,
                (long long)cfg->hang_ms);
        rg_warn("worker rank %d hung for %lld ms: SIGKILL", w->rank, (long long)age);
        kill(-w->pid, SIGKILL);
        kill(w->pid, SIGCONT);   /* a stopped process dies only once it runs */
        rg_beat_host_reset((rg_beat_host_t *)beat, w->local_rank);   /* said once */
        killed++;
    }
    return killed;
}
