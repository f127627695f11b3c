/* Test support for comm/: rank processes over a real etcd (see comm_testlib.h). */
#include "comm_testlib.h"

#include "test_util.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static test_etcd_t comm_etcd;
static bool comm_etcd_up;
static int run_counter;

const char *comm_test_etcd(void)
{
    if (!comm_etcd_up) {
        if (!test_etcd_start(&comm_etcd, NULL)) {
            return NULL;
        }
        comm_etcd_up = true;
    }
    return comm_etcd.srv.endpoints;
}

void comm_test_etcd_stop(void)
{
    if (comm_etcd_up) {
        test_etcd_down(&comm_etcd);
        comm_etcd_up = false;
    }
}

void comm_test_etcd_fixture(void)
{
    ck_assert_msg(comm_test_etcd() != NULL, "cannot start the test etcd");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reports "done" to the parent and waits (bounded) until the parent releases everyone. */
static void child_hold(int report_fd, int release_fd)
{
    char b = 1;
    if (write(report_fd, &b, 1) != 1) {
        return;
    }
    struct pollfd pfd = {.fd = release_fd, .events = POLLIN};
    (void)poll(&pfd, 1, 30000);
}

static int child_main(int rank, int n, comm_test_fn fn, void *arg, const comm_test_opts_t *o,
                      const char *endpoints, const char *prefix)
{
    setenv("UCX_NET_DEVICES", "lo", 1);
    for (int i = 0; o->env[i] != NULL && i < 8; i++) {
        putenv((char *)o->env[i]);
    }
    rg_comm_params_t params = {
        .rank = rank,
        .size = n,
        .etcd_endpoints = endpoints,
        .key_prefix = prefix,
        .timeout_ms = o->op_timeout_ms ? o->op_timeout_ms : 20000,
        .create_timeout_ms = 20000,
    };
    if (o->spare) {
        rg_status_t sst = rg_comm_spare_start(n, true, &params.spare);
        if (sst != RG_OK) {
            fprintf(stderr, "rank %d: rg_comm_spare_start: %s\n", rank, rg_last_error());
            return 90;
        }
    }
    rg_comm_t *comm = NULL;
    double t0 = now_s();
    rg_status_t st = rg_comm_create(&params, &comm);
    if (st != RG_OK) {
        fprintf(stderr, "rank %d: rg_comm_create: %s: %s\n", rank, rg_status_name(st),
                rg_last_error());
        return 90;
    }
    double t1 = now_s();
    if (getenv("COMM_TEST_PRINT_CREATE") != NULL) {
        fprintf(stderr, "rank %d of %d: group created in %.3f s\n", rank, n, t1 - t0);
    }
    int rc = fn(comm, rank, n, arg);
    rg_comm_destroy(comm);
    return rc;
}

bool comm_run(int n, comm_test_fn fn, void *arg, const comm_test_opts_t *opts,
              comm_test_result_t *res)
{
    comm_test_opts_t o = {.stop_rank = -1};
    if (opts != NULL) {
        o = *opts;
    }
    comm_test_result_t local;
    if (res == NULL) {
        res = &local;
    }
    memset(res, 0, sizeof(*res));
    const char *endpoints = comm_test_etcd();
    if (endpoints == NULL || n < 1 || n > COMM_TEST_MAX_RANKS) {
        fprintf(stderr, "comm_run: no etcd or bad rank count %d\n", n);
        return false;
    }
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "/regroup/test-%d-%d/workers/rounds/0/comm/", (int)getpid(),
             run_counter++);
    fflush(NULL);
    int report[2] = {-1, -1};
    int release[2] = {-1, -1};
    if (o.hold_count > 0 && (pipe(report) != 0 || pipe(release) != 0)) {
        perror("pipe");
        return false;
    }
    if (o.hold_count > 0) {
        fcntl(report[0], F_SETFL, O_NONBLOCK);
    }
    int reported = 0;
    pid_t pids[COMM_TEST_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            if (o.hold_count > 0) {
                close(report[0]);
                close(release[1]);
            }
            int rc = child_main(r, n, fn, arg, &o, endpoints, prefix);
            fflush(NULL);
            if (o.hold_count > 0) {
                child_hold(report[1], release[0]);
            }
            _exit(rc);
        }
        if (pids[r] < 0) {
            perror("fork");
            for (int k = 0; k < r; k++) {
                kill(pids[k], SIGKILL);
                waitpid(pids[k], NULL, 0);
            }
            return false;
        }
    }
    double deadline = now_s() + (o.timeout_s ? o.timeout_s : 120);
    int left = n;
    bool ok = true;
    /* Bounded by the deadline; reaps each child as soon as it ends. */
    while (left > 0) {
        int ws;
        pid_t p = waitpid(-1, &ws, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] == p) {
                    res->status[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
                    pids[r] = 0;
                    left--;
                }
            }
            continue;
        }
        if (p < 0 && errno != EINTR) {
            break;
        }
        char buf[COMM_TEST_MAX_RANKS];
        ssize_t got = o.hold_count > 0 && release[1] >= 0 ? read(report[0], buf, sizeof(buf)) : 0;
        if (got > 0) {
            reported += (int)got;
            if (reported >= o.hold_count) {
                close(release[1]); /* EOF releases every holding child */
                release[1] = -1;
            }
        }
        bool only_stopped = o.stop_rank >= 0 && left == 1 && pids[o.stop_rank] != 0;
        if (only_stopped || now_s() > deadline) {
            if (!only_stopped) {
                res->timed_out = true;
                fprintf(stderr, "comm_run: ranks still running at the deadline: killing\n");
            }
            for (int r = 0; r < n; r++) {
                if (pids[r] != 0 && !only_stopped && getenv("COMM_TEST_GDB") != NULL) {
                    char pid[16];
                    snprintf(pid, sizeof(pid), "%d", (int)pids[r]);
                    char *gdb[] = {"gdb", "-q", "-batch", "-p", pid, "-ex", "bt 20", NULL};
                    if (test_run(gdb, NULL, 60000) != 0) {
                        fprintf(stderr, "comm_run: gdb failed\n");
                    }
                }
                if (pids[r] != 0) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], &ws, 0);
                    res->status[r] = only_stopped ? 0 : 128 + SIGKILL;
                    pids[r] = 0;
                    left--;
                }
            }
            break;
        }
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    for (int i = 0; i < 2; i++) {
        if (report[i] >= 0) {
            close(report[i]);
        }
        if (release[i] >= 0) {
            close(release[i]);
        }
    }
    for (int r = 0; r < n; r++) {
        if (res->status[r] != 0) {
            fprintf(stderr, "comm_run: rank %d of %d ended with %d\n", r, n, res->status[r]);
            ok = false;
        }
    }
    return ok && !res->timed_out;
}

/* ---- deterministic data ---------------------------------------------------------------- */

double comm_test_input(rg_dtype_t dtype, rg_redop_t op, int rank, size_t i)
{
    unsigned h = (unsigned)rank * 131u + (unsigned)(i % 100003u) * 7u;
    if (op == RG_OP_PROD) {
        static const double fl[4] = {1, 2, -1, 0.5};
        static const double in[4] = {1, 2, -1, 3};
        static const double u8[4] = {1, 2, 3, 5};
        h = (unsigned)rank * 5u + (unsigned)(i % 100003u) * 3u;
        switch (dtype) {
        case RG_DTYPE_U8: return u8[h % 4];
        case RG_DTYPE_I32:
        case RG_DTYPE_I64: return in[h % 4];
        default: return fl[h % 4];
        }
    }
    if (dtype == RG_DTYPE_U8) {
        return (double)(h % 251u);
    }
    return (double)(int)(h % 13u) - 6.0;
}

void comm_test_store(rg_dtype_t dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case RG_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case RG_DTYPE_F64: ((double *)buf)[i] = v; break;
    case RG_DTYPE_F16: ((uint16_t *)buf)[i] = rg_f32_to_f16((float)v); break;
    case RG_DTYPE_BF16: ((uint16_t *)buf)[i] = rg_f32_to_bf16((float)v); break;
    case RG_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case RG_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case RG_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)(unsigned)v; break;
    }
}

void comm_test_expect(rg_dtype_t dtype, rg_redop_t op, int size, size_t i, void *out)
{
    bool integer = dtype == RG_DTYPE_I32 || dtype == RG_DTYPE_I64 || dtype == RG_DTYPE_U8;
    int64_t acc = 0;
    double dacc = 0;
    for (int r = 0; r < size; r++) {
        double v = comm_test_input(dtype, op, r, i);
        int64_t iv = (int64_t)v;
        if (r == 0) {
            acc = iv;
            dacc = v;
            continue;
        }
        switch (op) {
        case RG_OP_SUM:
        case RG_OP_AVG: acc += iv; dacc += v; break;
        case RG_OP_PROD: acc *= iv; dacc *= v; break;
        case RG_OP_MIN: acc = iv < acc ? iv : acc; dacc = v < dacc ? v : dacc; break;
        case RG_OP_MAX: acc = iv > acc ? iv : acc; dacc = v > dacc ? v : dacc; break;
        }
    }
    if (op == RG_OP_AVG) {
        dacc /= size;
    }
    if (!integer) {
        /* f16/bf16: exact small values, or a quotient rounded first to float (innocuous
         * double rounding, see comm_reduce.c) */
        comm_test_store(dtype, out, 0, dtype == RG_DTYPE_F64 ? dacc : (double)(float)dacc);
        return;
    }
    switch (dtype) {
    case RG_DTYPE_I32: *(int32_t *)out = (int32_t)acc; break;
    case RG_DTYPE_I64: *(int64_t *)out = acc; break;
    default: *(uint8_t *)out = (uint8_t)((uint64_t)acc & 0xffu); break;
    }
}
