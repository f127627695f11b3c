/* Logging to stderr with a "[host:pid rank round]" prefix; the level is read once. */
#include "rg_common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

rg_log_level_t rg_log_level_current = RG_LOG_WARN;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static char log_host[64] = "?";
static int log_rank = -1;
static int log_round = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

static void log_init_once(void)
{
    const char *env = getenv("REGROUP_LOG_LEVEL");
    if (gethostname(log_host, sizeof(log_host)) != 0) {
        strcpy(log_host, "?");
    }
    log_host[sizeof(log_host) - 1] = '\0';
    if (env != NULL && env[0] != '\0') {
        for (size_t i = 0; i < RG_ARRAY_SIZE(level_names); i++) {
            if (strcasecmp(env, level_names[i]) == 0) {
                rg_log_level_current = (rg_log_level_t)i;
                return;
            }
        }
        fprintf(stderr, "regroup: REGROUP_LOG_LEVEL=%s is not one of "
                        "error|warn|info|debug|trace; using warn\n", env);
    }
}

void rg_log_init(void)
{
    pthread_once(&log_once, log_init_once);
}

void rg_log_set_identity(int rank, int round)
{
    rg_log_init();
    log_rank = rank;
    log_round = round;
}

void rg_log_write(rg_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    struct timespec ts;
    va_list ap;
    const char *base = strrchr(file, '/');

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    /* One fprintf per line so lines from threads do not interleave. */
    fprintf(stderr, "[%lld.%06ld] [%s:%d %d %d] %-5s %s:%d %s\n", (long long)ts.tv_sec,
            ts.tv_nsec / 1000, log_host, (int)getpid(), log_rank, log_round,
            level_names[level], base ? base + 1 : file, line, msg);
}

__attribute__((constructor)) static void log_ctor(void)
{
    rg_log_init();
}
