/*
 * common: what every part of regroup shares and nothing of ours depends on.
 *
 * - errors: rg_error() records a status plus a formatted message in a thread-local slot and
 *   returns the status, so a failing function can `return rg_error(RG_EIO, "...")` once,
 *   where the failure is found; rg_last_error() reads it.
 * - logging: level-checked before formatting, prefixed "[host:pid rank round]".
 *   REGROUP_LOG_LEVEL=error|warn|info|debug|trace (default warn) picks the level.
 * - time: wall-clock seconds and sleeping (deadlines are public: <regroup/deadline.h>).
 * - rg_dbuf: a growable byte buffer with a hard maximum (filled from outside).
 */
#ifndef REGROUP_COMMON_H
#define REGROUP_COMMON_H

#include <regroup/deadline.h>
#include <regroup/status.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RG_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define RG_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define RG_MAX(a, b)     ((a) > (b) ? (a) : (b))
#define RG_NODISCARD     __attribute__((warn_unused_result))
#define RG_PRINTF(f, a)  __attribute__((format(printf, f, a)))

/* ---- errors ---------------------------------------------------------------------------- */

/* rg_error() (records status and message for rg_last_error(); returns status) is public:
 * see <regroup/status.h>. */
/* Prepends "prefix: " to the current message, keeping the status; returns status. */
rg_status_t rg_error_wrap(rg_status_t status, const char *fmt, ...) RG_PRINTF(2, 3);
void rg_error_clear(void);

/* ---- logging --------------------------------------------------------------------------- */

typedef enum {
    RG_LOG_ERROR = 0,
    RG_LOG_WARN  = 1,
    RG_LOG_INFO  = 2,
    RG_LOG_DEBUG = 3,
    RG_LOG_TRACE = 4,
} rg_log_level_t;

extern rg_log_level_t rg_log_level_current;

void rg_log_init(void);                             /* reads REGROUP_LOG_LEVEL; idempotent */
void rg_log_set_identity(int rank, int round);      /* fills the prefix; -1 = unknown */
void rg_log_write(rg_log_level_t level, const char *file, int line, const char *fmt, ...)
    RG_PRINTF(4, 5);

#define rg_log(level, ...) \
    do { \
        if ((level) <= rg_log_level_current) { \
            rg_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
        } \
    } while (0)
#define rg_error_log(...) rg_log(RG_LOG_ERROR, __VA_ARGS__)
#define rg_warn(...)      rg_log(RG_LOG_WARN, __VA_ARGS__)
#define rg_info(...)      rg_log(RG_LOG_INFO, __VA_ARGS__)
#define rg_debug(...)     rg_log(RG_LOG_DEBUG, __VA_ARGS__)
#define rg_trace(...)     rg_log(RG_LOG_TRACE, __VA_ARGS__)

/* ---- time ------------------------------------------------------------------------------ */

/* rg_deadline_t, rg_now_ns(), rg_deadline_in_ms(), rg_deadline_left_ms() and
 * rg_deadline_passed() are public: see <regroup/deadline.h>. */
double   rg_wall_s(void);                       /* CLOCK_REALTIME seconds, for reports */
/* Sleeps ms milliseconds (resumed after a signal); ms <= 0 returns at once. */
void    rg_sleep_ms(int64_t ms);

/* ---- bounded buffer -------------------------------------------------------------------- */

typedef struct {
    char  *data;     /* always NUL-terminated when non-NULL (the NUL is not counted in len) */
    size_t len;
    size_t cap;
    size_t max;      /* hard limit on len */
} rg_dbuf_t;

void        rg_dbuf_init(rg_dbuf_t *b, size_t max);
void        rg_dbuf_cleanup(rg_dbuf_t *b);
void        rg_dbuf_reset(rg_dbuf_t *b);                      /* len = 0, keeps memory */
rg_status_t rg_dbuf_append(rg_dbuf_t *b, const void *p, size_t n) RG_NODISCARD; /* ETOOBIG */
rg_status_t rg_dbuf_printf(rg_dbuf_t *b, const char *fmt, ...) RG_PRINTF(2, 3) RG_NODISCARD;
void        rg_dbuf_consume(rg_dbuf_t *b, size_t n);          /* drops the first n bytes */

/* ---- child processes ------------------------------------------------------------------- */

#include <sys/types.h>

/* Starts argv[0] (searched in PATH) with stdout and stderr appended to log_path (NULL:
 * inherited). The child gets PR_SET_PDEATHSIG(SIGKILL): it dies with its parent. Returns the
 * pid, or -1 if fork failed. Does not block. */
pid_t rg_proc_spawn(char *const argv[], const char *log_path);
/* Waits up to timeout_ms for pid to exit and reaps it: its exit status, 128 + the signal
 * that killed it, or -1 on timeout (the child is left running) or error. */
int rg_proc_wait(pid_t pid, int64_t timeout_ms);

/* ---- files ----------------------------------------------------------------------------- */

/* Removes path and everything under it, like `rm -rf` but without a shell: depth first, never
 * following a symbolic link. True when nothing is left at path (also when there was nothing);
 * false if some entry could not be removed (the rest is removed anyway). Blocks on disk. */
bool rg_rm_tree(const char *path);

/* ---- misc ------------------------------------------------------------------------------ */

/* strtoll over a whole string with range check; false on junk. */
bool rg_parse_i64(const char *s, int64_t *out);
/* Duplicates a string, NULL-safe. */
char *rg_strdup(const char *s);

#endif
