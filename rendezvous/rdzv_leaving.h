/*
 * Members that leave a job on purpose: a cloud's preemption notice or SIGTERM. The leaving
 * agent writes rounds/<r>/leaving/<agent> (rdzv_keys.h) with the reason and the wall-clock
 * time by which its workers must be done, keeps running its round while they take their last
 * checkpoint, then revokes its lease (rg_rdzv_leave). Every other agent reads the round's
 * leaving/ records in the same read as the rest of a running round's state (rg_rdzv_check)
 * and tells its own workers, so that all ranks agree on the same step boundary. A leaving
 * node is no failure: nothing here writes under failures/, so a preemption never counts
 * against --max-restarts. The record has no lease: it stays in the round's history (removed
 * with the round's keys), so an agent whose worker failed because the node went finds it
 * even after the node is gone (rdzv_leaving_read).
 *
 * Private to regroup (the launcher and `regroup status`); one rg_rdzv_t per thread, as in
 * rdzv.h.
 */
#ifndef REGROUP_RDZV_LEAVING_H
#define REGROUP_RDZV_LEAVING_H

#include "rdzv_keys.h"

#include <regroup/rdzv.h>

#define RDZV_LEAVING_MAX 64     /* records of other agents kept from one read */

/* Writes this agent's leaving record in the running round: reason (cut to fit), and deadline
 * in wall seconds. One etcd put, the client's default deadline. */
rg_status_t rdzv_leaving_announce(rg_rdzv_t *rdzv, const char *reason, double deadline)
    RG_NODISCARD;
/* Reads the running round's leaving records now (one range read), as rg_rdzv_check does. */
rg_status_t rdzv_leaving_read(rg_rdzv_t *rdzv) RG_NODISCARD;
/* The other agents' leaving records of the running round, as last read (by rg_rdzv_check or
 * rdzv_leaving_read). *recs_p points into the handle, valid until the next read. */
int rdzv_leaving_seen(const rg_rdzv_t *rdzv, const rdzv_leaving_rec_t **recs_p);
/* The record of agent among them, or NULL. */
const rdzv_leaving_rec_t *rdzv_leaving_find(const rg_rdzv_t *rdzv, const char *agent);
/* Whether a member of the running round that has a leaving record (as last read) has gone
 * from it (its lease revoked once its workers ended), waiting until deadline at most for one
 * to go: reads rounds/<r>/nodes/ every RDZV_LEAVING_POLL_MS (no read starts after the
 * deadline; each has the client's request deadline). *gone false when none has by then; an
 * etcd error ends the wait with it. */
#define RDZV_LEAVING_POLL_MS 20
rg_status_t rdzv_leaving_await_gone(rg_rdzv_t *rdzv, rg_deadline_t deadline, bool *gone)
    RG_NODISCARD;

#endif
