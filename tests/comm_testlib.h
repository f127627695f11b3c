/*
 * Test support for comm/: runs a function on N real rank processes that build a group through
 * a real etcd.
 *
 * comm_run() forks n children. Each child sets the given environment (UCX pinned to loopback),
 * creates its group with rg_comm_create under a fresh key prefix, calls fn, destroys the group
 * and exits with fn's result (0 = pass). The parent reaps every child as soon as it ends (a
 * dead shared-memory peer left as a zombie is never detected by UCX), and SIGKILLs and reaps
 * any child still running at the deadline (COMM_TEST_GDB=1 prints their stacks first).
 * Children report failures on stderr.
 */
#ifndef COMM_TESTLIB_H
#define COMM_TESTLIB_H

#include <regroup/comm.h>

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define COMM_TEST_MAX_RANKS 16

/* In a rank function (with `rank` in scope): say what failed on stderr, return 1. */
#define FAIL(...) \
    do { \
        fprintf(stderr, "rank %d: ", rank); \
        fprintf(stderr, __VA_ARGS__); \
        fprintf(stderr, "\n"); \
        return 1; \
    } while (0)

/* In a rank function: FAIL unless the call returns RG_OK, naming the call and the error. */
#define CHECK_RG(call) \
    do { \
        rg_status_t st_ = (call); \
        if (st_ != RG_OK) { \
            FAIL("%s: %s: %s", #call, rg_status_name(st_), rg_last_error()); \
        } \
    } while (0)

typedef int (*comm_test_fn)(rg_comm_t *comm, int rank, int size, void *arg);

typedef struct {
    int         status[COMM_TEST_MAX_RANKS];  /* exit code, or 128 + signal */
    bool        timed_out;
    double      create_s[COMM_TEST_MAX_RANKS]; /* unused by the parent (children print) */
} comm_test_result_t;

typedef struct {
    const char *env[8];       /* "NAME=value" strings set in each child, NULL-terminated */
    int64_t     op_timeout_ms; /* 0 = 20000 */
    int         timeout_s;    /* whole run; 0 = 120 */
    int         stop_rank;    /* a rank expected to stop itself (SIGSTOP): killed once the
                                 others are done; -1 = none */
    int         hold_count;   /* > 0: a child whose fn returned waits (its group destroyed)
                                 until hold_count children have returned, then exits */
    bool        spare;        /* each child makes its UCX worker first, in the background
                                 (rg_comm_spare_start), and gives it to rg_comm_create */
} comm_test_opts_t;

/* Starts the test etcd (once per process) and returns its endpoints, or NULL. */
const char *comm_test_etcd(void);
/* Stops the test etcd started by comm_test_etcd. */
void comm_test_etcd_stop(void);
/* A Check fixture: starts the test etcd, failing the test case if it cannot (pair it with
 * comm_test_etcd_stop as the teardown). */
void comm_test_etcd_fixture(void);

/* Runs fn on n ranks; returns true when every rank exited 0. */
bool comm_run(int n, comm_test_fn fn, void *arg, const comm_test_opts_t *opts,
              comm_test_result_t *res);

/* Deterministic input and the reference result, computed in double / exact integers. */
double comm_test_input(rg_dtype_t dtype, rg_redop_t op, int rank, size_t i);
void   comm_test_store(rg_dtype_t dtype, void *buf, size_t i, double v);
/* The expected reduction of element i over ranks 0..size-1, stored at buf[i] */
void   comm_test_expect(rg_dtype_t dtype, rg_redop_t op, int size, size_t i, void *out);

#endif
