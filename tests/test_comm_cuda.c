/*
 * comm/ on CUDA device buffers (built with REGROUP_CUDA only): allreduce (in place and out of
 * place), broadcast and allgather on memory from cudaMalloc, on 2 and 3 real rank processes
 * sharing the machine's GPUs, checked on the host against the same independent reference as
 * test_comm. Skipped (exit 77) where no CUDA device is present, or where this machine's UCX
 * cannot move device memory (the group then refuses device buffers with RG_ENOTSUP).
 *
 * CUDA is never initialized in the parent: it does not survive fork(). A probe child counts
 * the devices; every rank process initializes CUDA itself.
 */
#include "comm_testlib.h"

#include <check.h>
#include <cuda_runtime_api.h>
#include <regroup/comm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SKIP_CODE 77

#define CHECK_CUDA(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) { \
            FAIL("%s: %s", #call, cudaGetErrorString(e_)); \
        } \
    } while (0)

static const rg_dtype_t dtypes[] = {RG_DTYPE_F32, RG_DTYPE_F64, RG_DTYPE_F16, RG_DTYPE_BF16,
                                    RG_DTYPE_I32, RG_DTYPE_I64, RG_DTYPE_U8};
static const char *const dtype_names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
static const rg_redop_t ops[] = {RG_OP_SUM, RG_OP_AVG, RG_OP_MAX};
static const char *const op_names[] = {"sum", "avg", "max"};
/* One element, an odd size not divisible by 2 or 3, and 16 MiB of f32 (the ring's path). */
static const size_t sizes[] = {1, 4099, (size_t)4 << 20};

static bool is_int(rg_dtype_t d)
{
    return d == RG_DTYPE_I32 || d == RG_DTYPE_I64 || d == RG_DTYPE_U8;
}

static int t_device(rg_comm_t *comm, int rank, int size, void *arg)
{
    (void)arg;
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    CHECK_CUDA(cudaSetDevice(rank % ndev));
    const rg_comm_opts_t dev = {.mem_type = RG_MEM_CUDA};
    int k = 0;
    for (size_t di = 0; di < sizeof(dtypes) / sizeof(dtypes[0]); di++) {
        for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++) {
            rg_dtype_t d = dtypes[di];
            rg_redop_t op = ops[oi];
            if (op == RG_OP_AVG && is_int(d)) {
                continue;
            }
            for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++, k++) {
                size_t n = sizes[si];
                size_t es = rg_dtype_size(d);
                if (n * es > ((size_t)16 << 20) || (n > 4099 && d != RG_DTYPE_F32)) {
                    continue;
                }
                char *host = malloc(n * es);
                char want[8];
                void *in = NULL;
                void *out = NULL;
                if (host == NULL) {
                    FAIL("out of memory");
                }
                for (size_t i = 0; i < n; i++) {
                    comm_test_store(d, host, i, comm_test_input(d, op, rank, i));
                }
                CHECK_CUDA(cudaMalloc(&in, n * es));
                CHECK_CUDA(cudaMalloc(&out, n * es));
                CHECK_CUDA(cudaMemcpy(in, host, n * es, cudaMemcpyHostToDevice));
                bool in_place = k % 2 == 1;
                if (in_place) {
                    CHECK_CUDA(cudaMemcpy(out, host, n * es, cudaMemcpyHostToDevice));
                }
                rg_status_t st = rg_comm_allreduce(comm, in_place ? RG_COMM_IN_PLACE : in, out,
                                                   n, d, op, &dev);
                /* Refused: no CUDA here, or a UCX that cannot move device memory. */
                if (st == RG_ENOTSUP && k == 0) {
                    fprintf(stderr, "rank %d: device buffers refused: %s\n", rank,
                            rg_last_error());
                    exit(SKIP_CODE);
                }
                if (st != RG_OK) {
                    FAIL("allreduce %s %s %zu: %s: %s", dtype_names[di], op_names[oi], n,
                         rg_status_name(st), rg_last_error());
                }
                memset(host, 0, n * es);
                CHECK_CUDA(cudaMemcpy(host, out, n * es, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < n; i++) {
                    comm_test_expect(d, op, size, i, want);
                    if (memcmp(want, host + i * es, es) != 0) {
                        FAIL("allreduce %s %s count %zu %s on the device: wrong element %zu",
                             dtype_names[di], op_names[oi], n,
                             in_place ? "in place" : "out of place", i);
                    }
                }
                CHECK_CUDA(cudaFree(in));
                CHECK_CUDA(cudaFree(out));
                free(host);
            }
        }
    }
    /* Broadcast from the last rank, then allgather, of 1 MiB of bytes. */
    size_t n = (size_t)1 << 20;
    unsigned char *host = malloc(n * (size_t)size);
    void *buf = NULL;
    void *all = NULL;
    if (host == NULL) {
        FAIL("out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        host[i] = (unsigned char)(rank == size - 1 ? i * 7 + 3 : 0);
    }
    CHECK_CUDA(cudaMalloc(&buf, n));
    CHECK_CUDA(cudaMalloc(&all, n * (size_t)size));
    CHECK_CUDA(cudaMemcpy(buf, host, n, cudaMemcpyHostToDevice));
    rg_status_t st = rg_comm_broadcast(comm, buf, n, RG_DTYPE_U8, size - 1, &dev);
    if (st != RG_OK) {
        FAIL("broadcast: %s: %s", rg_status_name(st), rg_last_error());
    }
    CHECK_CUDA(cudaMemcpy(host, buf, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        if (host[i] != (unsigned char)(i * 7 + 3)) {
            FAIL("broadcast on the device: wrong byte %zu", i);
        }
    }
    for (size_t i = 0; i < n; i++) {
        host[i] = (unsigned char)(rank * 31 + i);
    }
    CHECK_CUDA(cudaMemcpy(buf, host, n, cudaMemcpyHostToDevice));
    st = rg_comm_allgather(comm, buf, all, n, RG_DTYPE_U8, &dev);
    if (st != RG_OK) {
        FAIL("allgather: %s: %s", rg_status_name(st), rg_last_error());
    }
    CHECK_CUDA(cudaMemcpy(host, all, n * (size_t)size, cudaMemcpyDeviceToHost));
    for (int r = 0; r < size; r++) {
        for (size_t i = 0; i < n; i++) {
            if (host[(size_t)r * n + i] != (unsigned char)(r * 31 + i)) {
                FAIL("allgather on the device: wrong byte %zu of rank %d", i, r);
            }
        }
    }
    CHECK_CUDA(cudaFree(buf));
    CHECK_CUDA(cudaFree(all));
    free(host);
    return 0;
}

/* Runs the device test on n ranks; a rank that exits SKIP_CODE makes the whole test skip. */
static void run_on(int n)
{
    comm_test_result_t res;
    comm_test_opts_t opts = {.env = {"UCX_NET_DEVICES=lo", NULL}, .stop_rank = -1,
                             .timeout_s = 240};
    bool ok = comm_run(n, t_device, NULL, &opts, &res);
    for (int r = 0; r < n; r++) {
        if (res.status[r] == SKIP_CODE) {
            comm_test_etcd_stop();
            exit(SKIP_CODE);
        }
    }
    ck_assert_msg(ok && !res.timed_out, "device collectives on %d ranks failed", n);
}

START_TEST(device_2) { run_on(2); }
END_TEST

START_TEST(device_3) { run_on(3); }
END_TEST

/* Counts CUDA devices in a child, leaving this process without a CUDA context. */
static int probe_devices(void)
{
    pid_t pid = fork();
    int st;
    if (pid == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess ? (n > 100 ? 100 : n) : 0);
    }
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
        return 0;
    }
    return WEXITSTATUS(st);
}

int main(void)
{
    if (probe_devices() == 0) {
        printf("test_comm_cuda: no CUDA device here: skipped\n");
        return SKIP_CODE;
    }
    Suite *s = suite_create("comm_cuda");
    TCase *tc = tcase_create("device");
    tcase_add_unchecked_fixture(tc, comm_test_etcd_fixture, comm_test_etcd_stop);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, device_2);
    tcase_add_test(tc, device_3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
