/*
 * regroup deadlines: the one way every waiting call of regroup is bounded.
 *
 * A deadline is an absolute point in time on CLOCK_MONOTONIC, in nanoseconds (the clock of
 * rg_now_ns()), of type rg_deadline_t. Every call that may wait takes one (or, for a call
 * that stands for a whole phase, a timeout in its parameters) and means the same by it:
 *
 *   RG_DEADLINE_DEFAULT (0)  the call's default timeout, counted from when it is called.
 *                            Each call states its default where it is declared (an etcd
 *                            call: the client's timeout_ms; a communication operation: the
 *                            group's timeout_ms; ...). A zeroed options struct gets it.
 *   a time already passed    do not wait: the call does what it can without waiting and
 *   (RG_DEADLINE_POLL)       returns, RG_ETIMEDOUT if that was not enough. A queued etcd
 *                            event, a finished checkpoint save, a prepared batch are
 *                            returned; an etcd request is not sent; a communication
 *                            operation that still needs its peers fails as any operation
 *                            past its deadline does (see comm.h).
 *   any other time           wait until then at most; RG_ETIMEDOUT once it has passed.
 *
 * There is no "wait forever": every wait in regroup ends by a deadline, so that a dead peer,
 * a hung server or a full disk turns into an error and never into a hang. To wait longer,
 * pass a later deadline. (What no deadline can bound is a system call that the kernel does
 * not return from, such as a write to a hung file system: a call that must see its own
 * threads end, like rg_ckpt_destroy, says so.)
 */
#ifndef REGROUP_DEADLINE_H
#define REGROUP_DEADLINE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Absolute CLOCK_MONOTONIC nanoseconds; RG_DEADLINE_DEFAULT for the call's default. */
typedef uint64_t rg_deadline_t;

/* The call's default timeout from now (stated where each call is declared). */
#define RG_DEADLINE_DEFAULT ((rg_deadline_t)0)
/* A deadline long passed (1 ns after boot): do not wait, just check once. */
#define RG_DEADLINE_POLL ((rg_deadline_t)1)

/* CLOCK_MONOTONIC now, in nanoseconds. Never blocks; thread-safe. */
uint64_t rg_now_ns(void);

/* The deadline ms milliseconds from now; ms <= 0 gives now, a deadline that has passed by
 * the time it is used (RG_DEADLINE_POLL's meaning). Saturates instead of wrapping. */
static inline rg_deadline_t rg_deadline_in_ms(int64_t ms)
{
    uint64_t now = rg_now_ns();
    uint64_t add = ms <= 0 ? 0 : (uint64_t)ms;
    if (add > (UINT64_MAX - now) / 1000000ull) {
        return UINT64_MAX;
    }
    return now + add * 1000000ull;
}

/* Milliseconds left before the deadline, rounded up; 0 once it has passed. These helpers
 * take a deadline as the callee sees it after applying its default: RG_DEADLINE_DEFAULT
 * itself counts as long passed. */
int64_t rg_deadline_left_ms(rg_deadline_t deadline);
/* True once the deadline has passed. */
bool    rg_deadline_passed(rg_deadline_t deadline);

#ifdef __cplusplus
}
#endif
#endif
