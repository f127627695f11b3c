/*
 * The workers' heartbeat page: how an agent finds, in about a second, a worker that stopped
 * running (SIGSTOP, a frozen VM or container, a process swapped out for good), which its
 * peers would otherwise only notice at their communication timeout.
 *
 * The reverse of the notice page (rg_notice.h): one memfd per agent with one slot per local
 * worker; each worker inherits the descriptor (REGROUP_BEAT_FD), maps it read-write, closes
 * it, and writes only its own slot (LOCAL_RANK): CLOCK_MONOTONIC milliseconds, renewed by a
 * thread of the worker API every RG_BEAT_PERIOD_MS for as long as the process runs. The
 * agent reads the slots at each tick; a slot at 0 is not armed yet (the worker has not
 * started the worker API, or does not use it: then the agent never declares it hung). The
 * agent zeroes a slot before it starts that slot's worker.
 *
 * What it finds is a process that does not run at all. A worker whose threads run but whose
 * program is stuck (a deadlock, a collective waiting for a hung peer) keeps beating: the
 * peers' communication timeouts and the hung peer's own detection end those.
 */
#ifndef REGROUP_BEAT_H
#define REGROUP_BEAT_H

#include "rg_common.h"

#include <stdatomic.h>
#include <sys/types.h>

#define RG_BEAT_ENV       "REGROUP_BEAT_FD"
#define RG_BEAT_MAGIC     0x52474254u   /* "RGBT" */
#define RG_BEAT_VERSION   2u
#define RG_BEAT_PERIOD_MS 100
#define RG_BEAT_MAX_SLOTS 256           /* LAUNCHER_MAX_NPROC */

typedef struct {
    _Atomic uint64_t beat_ms;           /* CLOCK_MONOTONIC ms; 0 = not armed */
    _Atomic uint64_t beats;             /* how many, for the logs */
    _Atomic int32_t  pid;               /* the beating process (a wrapper's child, maybe) */
    char             pad[44];           /* one cache line a slot */
} rg_beat_slot_t;
_Static_assert(sizeof(rg_beat_slot_t) == 64, "a beat slot is one cache line");

typedef struct {
    uint32_t       magic;
    uint32_t       version;
    uint32_t       n_slots;
    uint32_t       pad[13];
    rg_beat_slot_t slots[];
} rg_beat_page_t;

/* ---- the agent's side ------------------------------------------------------------------ */

typedef struct {
    int             fd;                 /* close-on-exec; a worker gets it in the child */
    rg_beat_page_t *page;
    size_t          size;
} rg_beat_host_t;

rg_status_t rg_beat_host_create(rg_beat_host_t *h, int n_slots) RG_NODISCARD;
void        rg_beat_host_destroy(rg_beat_host_t *h);       /* accepts a zeroed host */
/* Disarms slot i (before its worker starts). */
void        rg_beat_host_reset(rg_beat_host_t *h, int i);
/* Milliseconds since slot i's last beat at now_ms; -1 if not armed (or no such slot). */
int64_t     rg_beat_age_ms(const rg_beat_host_t *h, int i, int64_t now_ms);
/* The pid that beats slot i (the worker API's process), 0 if none said. */
pid_t       rg_beat_pid(const rg_beat_host_t *h, int i);

/* ---- the worker's side ----------------------------------------------------------------- */

typedef struct rg_beat_worker rg_beat_worker_t;

/* Maps the page of $REGROUP_BEAT_FD, closes the descriptor and starts the thread that beats
 * slot `slot`. No variable: RG_OK and *w NULL. */
rg_status_t rg_beat_worker_start(int slot, rg_beat_worker_t **w) RG_NODISCARD;
/* Stops the thread and unmaps the page; accepts NULL. */
void        rg_beat_worker_stop(rg_beat_worker_t *w);

#endif
