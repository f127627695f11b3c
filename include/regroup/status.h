/*
 * regroup status codes.
 *
 * Every fallible call returns an rg_status_t. Codes are grouped by what the caller must do:
 *   0, 1        success, or work still in progress (post/test calls)
 *   -1..-19     the caller's input or the local system is at fault: fix and do not retry
 *   -20..-29    transient: retry, perhaps against another endpoint
 *   -30..-39    membership changed: rejoin the rendezvous
 *   -40..-49    a peer failed: rebuild the group
 *   -50..-59    data is corrupt: fall back to an older copy
 * The failing call also leaves a message naming what failed in rg_last_error() (per thread);
 * a program's own functions can do the same with rg_error().
 */
#ifndef REGROUP_STATUS_H
#define REGROUP_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define RG_STATUS_MAP(X) \
    X(OK,           0, "success") \
    X(INPROGRESS,   1, "in progress") \
    X(EINVAL,      -1, "invalid argument") \
    X(ENOMEM,      -2, "out of memory") \
    X(EIO,         -3, "input/output error") \
    X(ENOSPC,      -4, "no space left") \
    X(ENOTSUP,     -5, "not supported") \
    X(EPROTO,      -6, "malformed or truncated response") \
    X(ETOOBIG,     -7, "size limit exceeded") \
    X(ENOENT,      -8, "not found") \
    X(EEXIST,      -9, "already exists") \
    X(EAUTH,      -10, "authentication refused") \
    X(EPERM,      -11, "permission denied") \
    X(ESERVER,    -12, "server refused the request") \
    X(ESYS,       -13, "system call failed") \
    X(EJOBFAILED, -14, "job failed: workers failed more than the restarts allowed") \
    X(ETIMEDOUT,  -20, "timed out") \
    X(EUNREACH,   -21, "unreachable") \
    X(EAGAIN,     -22, "temporarily unavailable") \
    X(ECANCELED,  -23, "canceled") \
    X(ECOMPACTED, -24, "revision compacted") \
    X(ECOMPARE,   -25, "compare failed") \
    X(EMEMBERS,   -30, "membership changed") \
    X(ELEASE,     -31, "lease lost") \
    X(EPEER,      -40, "peer failed") \
    X(ECORRUPT,   -50, "data corrupt")

typedef enum {
#define RG_STATUS_ENUM_(name, code, str) RG_##name = (code),
    RG_STATUS_MAP(RG_STATUS_ENUM_)
#undef RG_STATUS_ENUM_
} rg_status_t;

/* The fixed description of a status ("timed out"); never NULL. */
const char *rg_status_str(rg_status_t status);

/* The symbolic name of a status ("RG_ETIMEDOUT"); never NULL. */
const char *rg_status_name(rg_status_t status);

/*
 * The message of the last failure on this thread, naming what failed
 * ("etcd http://127.0.0.1:2379: /v3/kv/put: timed out after 500 ms"). Empty if none.
 * The string belongs to the thread and stays valid until its next failing call.
 */
const char *rg_last_error(void);

/*
 * Records a failure as this thread's last error: rg_last_error() returns the printf-style
 * message (cut at 1023 bytes) until the thread's next failure. Returns status, so that a
 * function says what failed where it finds it: `return rg_error(RG_EIO, "cannot open %s",
 * path);`. regroup's calls report this way; a program's functions that return rg_status_t
 * can too (rg_trainer_fit prints rg_last_error() when the worker function fails). Never
 * blocks; touches only the calling thread's message.
 */
rg_status_t rg_error(rg_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
