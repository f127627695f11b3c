/*
 * rg-bench-ckpt: what a checkpoint costs the training loop, and how fast it gets to disk.
 *
 * State shaped like one rank's share of real training state: weights ~ N(0, 0.02) and the
 * two Adam moments (m ~ N(0, 3e-4), v ~ m^2-like positive values), in f32 and in bf16, the
 * same number of bytes each. Each of --runs runs makes --iters saves through a checkpointer
 * whose staging buffer is allocated and touched at create (staging_bytes set), and prints
 * one JSON object ("bench":"ckpt", per dtype and run) on stdout:
 *   bytes          bytes of state saved
 *   memcpy_ms      one memcpy of those bytes into an already-touched buffer, just before
 *                  each save (median)
 *   stall_ms       time inside rg_ckpt_save (median over --iters saves)
 *   stall_vs_memcpy  median over saves of stall / the memcpy just before it
 *   save_GBps      background throughput: bytes / (save call returned -> durable and
 *                  committed), median
 *   save_total_ms  save call entered -> durable and committed, median
 *   zstd_GBps      the same chunks compressed (shuffled as saved) on --threads threads, no I/O
 *   disk_GBps      bytes / sync_write_ms: uncompressed write + fsync of the same bytes
 *   limit_GBps     min(zstd_GBps, disk_GBps * ratio): the pipeline cannot beat either
 *   save_vs_limit  median over saves of (that save's throughput / the limit measured just
 *                  before it)
 *   save_vs_limit_of_medians  save_GBps / limit_GBps: the ratio of the run's medians
 *   ratio, ratio_noshuffle   raw / compressed bytes with and without the byte shuffle
 *   zstd_noshuffle_GBps      compression throughput without the shuffle (measured once)
 *   load_GBps      rg_ckpt_load of everything after dropping the shard from the page cache
 *   sync_write_ms  the baseline: a synchronous uncompressed write + fsync
 * Then per dtype one "ckpt-staging0" object: the stall of the first and of the second save
 * with the default staging_bytes = 0 (the first allocates the staging buffer and pays its
 * page faults), and one "ckpt-summary" object: the median, min and max over the runs of
 * save_vs_limit, save_vs_limit_of_medians, stall_vs_memcpy and save_GBps. Every object
 * names the commit and build type.
 * Run it alone: flock /tmp/regroup-bench.lock build/bench/rg-bench-ckpt --dir DIR
 */
#include "ckpt_measure.h"
#include "rg_bench_meta.h"
#include "rg_bench_stats.h"
#include "rg_common.h"

#include <regroup/ckpt.h>

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_TENSORS 3
#define MAX_ITERS 16

static const char *const tensor_names[N_TENSORS] = {"weight", "adam.m", "adam.v"};

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static inline uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static inline double rng_gauss(void)
{
    double u1 = ((double)(rng_next() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(rng_next() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static float state_value(int tensor)
{
    double g = rng_gauss();
    switch (tensor) {
    case 0: return (float)(0.02 * g);
    case 1: return (float)(3e-4 * g);
    default: return (float)(1e-7 * g * g + 1e-9 * fabs(rng_gauss()));
    }
}

static void fill_state(void *buf, size_t n, int tensor, rg_dtype_t dtype)
{
    for (size_t i = 0; i < n; i++) {
        float v = state_value(tensor);
        if (dtype == RG_DTYPE_F32) {
            memcpy((float *)buf + i, &v, 4);
        } else {
            uint32_t b;
            uint16_t h;
            memcpy(&b, &v, 4);
            h = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);  /* round to nearest even */
            memcpy((uint16_t *)buf + i, &h, 2);
        }
    }
}

static double ms_since(uint64_t t0)
{
    return (double)(rg_now_ns() - t0) * 1e-6;
}

/* Writes n buffers of len bytes to a new file and fsyncs it: the synchronous baseline. */
static int sync_write(const char *dir, void *const *bufs, int n, size_t len, double *ms)
{
    char path[4096];
    uint64_t t0;
    int fd;

    snprintf(path, sizeof(path), "%s/sync-write.tmp", dir);
    t0 = rg_now_ns();
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return -1;
    }
    for (int b = 0; b < n; b++) {
        size_t off = 0;
        while (off < len) {
            ssize_t w = write(fd, (const char *)bufs[b] + off, RG_MIN(len - off, (size_t)64 << 20));
            if (w <= 0) {
                close(fd);
                unlink(path);
                return -1;
            }
            off += (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        close(fd);
        unlink(path);
        return -1;
    }
    close(fd);
    *ms = ms_since(t0);
    unlink(path);
    return 0;
}

/* Evicts the step's shard from the page cache, so that the load reads the disk. */
static void drop_cache(const char *dir, int64_t step)
{
    char path[4096];
    int fd;
    snprintf(path, sizeof(path), "%s/step-%" PRId64 "/shard-00000.rgs", dir, step);
    fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static void remove_steps(const char *dir)
{
    int64_t *steps = NULL;
    size_t n = 0;
    char path[4096];
    if (rg_ckpt_list(dir, &steps, &n) == RG_OK) {
        for (size_t i = 0; i < n; i++) {
            snprintf(path, sizeof(path), "%s/step-%" PRId64 "/MANIFEST", dir, steps[i]);
            unlink(path);   /* uncommitted now: cleanup removes it */
        }
    }
    free(steps);
    if (rg_ckpt_cleanup(dir, NULL) != RG_OK) {
        fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
    }
    rmdir(dir);
}

/* One dtype's state, filled once and saved by every run. */
typedef struct {
    rg_dtype_t         dtype;
    const char        *name;
    size_t             per;      /* elements per tensor */
    size_t             tbytes;   /* bytes per tensor */
    size_t             total;
    void              *state[N_TENSORS];
    void              *dst[N_TENSORS];
    rg_ckpt_tensor_t   ts[N_TENSORS];
    rg_ckpt_request_t  reqs[N_TENSORS];
} bench_state_t;

/* What one run measured, for the summary over runs. */
typedef struct {
    double stall_vs_memcpy;
    double save_vs_limit;        /* median over saves of (save throughput / its limit) */
    double save_vs_limit_medians; /* median save throughput / median limit */
    double save_gbps;
    double limit_gbps;
} run_result_t;

static int state_init(bench_state_t *b, size_t bytes, rg_dtype_t dtype)
{
    size_t esize = rg_dtype_size(dtype);
    memset(b, 0, sizeof(*b));
    b->dtype = dtype;
    b->name = dtype == RG_DTYPE_F32 ? "f32" : "bf16";
    b->per = (bytes / N_TENSORS) / esize;
    b->tbytes = b->per * esize;
    b->total = b->tbytes * N_TENSORS;
    for (int t = 0; t < N_TENSORS; t++) {
        b->state[t] = malloc(b->tbytes);
        b->dst[t] = malloc(b->tbytes);
        if (b->state[t] == NULL || b->dst[t] == NULL) {
            fprintf(stderr, "rg-bench-ckpt: out of memory\n");
            return 1;
        }
        fill_state(b->state[t], b->per, t, dtype);
        memset(b->dst[t], 0, b->tbytes);
        b->ts[t] = (rg_ckpt_tensor_t){.name = tensor_names[t], .dtype = dtype, .ndim = 2,
                                      .shape = {b->per / 1024, 1024},
                                      .row_count = b->per / 1024, .data = b->state[t]};
        b->reqs[t] = (rg_ckpt_request_t){.name = tensor_names[t], .dtype = dtype,
                                         .row_count = b->per / 1024, .dst = b->dst[t],
                                         .dst_bytes = (b->per / 1024) * 1024 * esize};
    }
    return 0;
}

static void state_free(bench_state_t *b)
{
    for (int t = 0; t < N_TENSORS; t++) {
        free(b->state[t]);
        free(b->dst[t]);
    }
}

static double memcpy_state(bench_state_t *b)
{
    uint64_t t0 = rg_now_ns();
    for (int t = 0; t < N_TENSORS; t++) {
        memcpy(b->dst[t], b->state[t], b->tbytes);
    }
    return ms_since(t0);
}

static int run(const char *root, bench_state_t *b, int iters, int threads, int run_no,
               run_result_t *res)
{
    char dir[2048];
    const size_t total = b->total;
    const rg_dtype_t dtype = b->dtype;
    rg_ckpt_params_t params = {.rank = 0, .world_size = 1, .threads = threads,
                               .staging_bytes = total + 64 * N_TENSORS, .keep_last = 1};
    rg_ckpt_t *ck = NULL;
    double stall[MAX_ITERS];
    double save_s[MAX_ITERS];
    double total_s[MAX_ITERS];
    double zstd_gbps[MAX_ITERS];
    double vs_limit[MAX_ITERS];
    double copy_ms[MAX_ITERS];
    double stall_vs[MAX_ITERS];
    size_t comp = 0;
    size_t comp_noshuf = 0;
    double comp_s = 0;
    double noshuf_s = 0;
    double load_ms;
    double sync_ms = 0;
    int64_t step = 0;
    int rc = 1;

    snprintf(dir, sizeof(dir), "%s/%s", root, b->name);
    params.root = dir;
    /* The baseline: a plain write + fsync of the same bytes, best of 2 (the disk is shared). */
    for (int i = 0; i < 2; i++) {
        double ms;
        if (sync_write(root, b->state, N_TENSORS, b->tbytes, &ms) != 0) {
            perror("rg-bench-ckpt: sync write");
            goto out;
        }
        sync_ms = i == 0 ? ms : RG_MIN(sync_ms, ms);
    }
    for (int t = 0; t < N_TENSORS; t++) {
        ckpt_measure_t m;
        if (ckpt_measure_compress(b->state[t], b->tbytes, dtype, false, 1, threads, 4u << 20,
                                  &m) != RG_OK) {
            fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
            goto out;
        }
        comp_noshuf += m.comp_bytes;
        noshuf_s += m.seconds;
    }
    if (rg_ckpt_create(&params, &ck) != RG_OK) {
        fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
        goto out;
    }
    for (int i = 0; i < iters; i++) {
        rg_ckpt_save_t *sv;
        uint64_t t0;
        /* The compression limit, measured just before each save: the cores are shared, and
         * a limit measured at another moment would compare unlike conditions. */
        comp = 0;
        comp_s = 0;
        for (int t = 0; t < N_TENSORS; t++) {
            ckpt_measure_t m;
            if (ckpt_measure_compress(b->state[t], b->tbytes, dtype, true, 1, threads,
                                      4u << 20, &m) != RG_OK) {
                fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
                goto out;
            }
            comp += m.comp_bytes;
            comp_s += m.seconds;
        }
        zstd_gbps[i] = (double)total / comp_s * 1e-9;
        /* Likewise the memcpy the stall is compared with. */
        copy_ms[i] = memcpy_state(b);
        t0 = rg_now_ns();
        step++;
        if (rg_ckpt_save(ck, step, b->ts, N_TENSORS, 0, &sv) != RG_OK) {
            fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
            goto out;
        }
        stall[i] = ms_since(t0);
        stall_vs[i] = stall[i] / copy_ms[i];
        if (rg_ckpt_save_wait(sv, 0) != RG_OK) {
            fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
            rg_ckpt_save_release(sv);
            goto out;
        }
        total_s[i] = ms_since(t0) * 1e-3;
        save_s[i] = total_s[i] - stall[i] * 1e-3;
        rg_ckpt_save_release(sv);
    }
    drop_cache(dir, step);
    for (int t = 0; t < N_TENSORS; t++) {
        memset(b->dst[t], 0, b->tbytes);
    }
    {
        uint64_t t0 = rg_now_ns();
        if (rg_ckpt_load(dir, step, b->reqs, N_TENSORS, NULL) != RG_OK) {
            fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
            goto out;
        }
        load_ms = ms_since(t0);
    }
    for (int t = 0; t < N_TENSORS; t++) {
        if (memcmp(b->dst[t], b->state[t], b->reqs[t].dst_bytes) != 0) {
            fprintf(stderr, "rg-bench-ckpt: loaded %s differs\n", tensor_names[t]);
            goto out;
        }
    }
    {
        double ratio = (double)total / (double)comp;
        double disk_gbps = (double)total / sync_ms * 1e-6;
        for (int i = 0; i < iters; i++) {
            double lim = RG_MIN(zstd_gbps[i], disk_gbps * ratio);
            vs_limit[i] = (double)total / save_s[i] * 1e-9 / lim;
        }
        /* rg_bench_median() sorts its argument: every per-save series is paired before this
         * point */
        double st_ms = rg_bench_median(stall, iters);
        double memcpy_ms = rg_bench_median(copy_ms, iters);
        double st_vs = rg_bench_median(stall_vs, iters);
        double save_gbps = (double)total / rg_bench_median(save_s, iters) * 1e-9;
        double total_ms = rg_bench_median(total_s, iters) * 1e3;
        double zstd = rg_bench_median(zstd_gbps, iters);
        double limit = RG_MIN(zstd, disk_gbps * ratio);
        double vs = rg_bench_median(vs_limit, iters);
        *res = (run_result_t){.stall_vs_memcpy = st_vs, .save_vs_limit = vs,
                              .save_vs_limit_medians = save_gbps / limit,
                              .save_gbps = save_gbps, .limit_gbps = limit};
        printf("{\"bench\":\"ckpt\",\"dtype\":\"%s\",\"run\":%d,\"bytes\":%zu,\"threads\":%d,"
               "\"chunk_bytes\":%u,\"level\":1,\"iters\":%d,\"staging_bytes\":%zu,"
               "\"memcpy_ms\":%.1f,\"stall_ms\":%.1f,\"stall_vs_memcpy\":%.2f,"
               "\"save_GBps\":%.3f,\"save_total_ms\":%.1f,\"zstd_GBps\":%.3f,\"disk_GBps\":%.3f,"
               "\"limit_GBps\":%.3f,\"save_vs_limit\":%.2f,\"save_vs_limit_of_medians\":%.2f,"
               "\"ratio\":%.3f,\"ratio_noshuffle\":%.3f,\"zstd_noshuffle_GBps\":%.3f,"
               "\"load_GBps\":%.3f,\"sync_write_ms\":%.1f,%s}\n",
               b->name, run_no, total, threads, 4u << 20, iters, params.staging_bytes,
               memcpy_ms, st_ms, st_vs, save_gbps, total_ms, zstd, disk_gbps, limit, vs,
               save_gbps / limit, ratio, (double)total / (double)comp_noshuf,
               (double)total / noshuf_s * 1e-9, (double)total / load_ms * 1e-6, sync_ms,
               RG_BENCH_META);
        fflush(stdout);
    }
    rc = 0;
out:
    rg_ckpt_destroy(ck);
    remove_steps(dir);
    return rc;
}

/* With the default staging_bytes = 0 the first save allocates the staging buffer and pays its
 * page faults inside the stall; the second reuses it. Each compared with a memcpy into an
 * already-touched buffer measured just before it. */
static int first_save(const char *root, bench_state_t *b, int threads)
{
    char dir[2048];
    rg_ckpt_params_t params = {.rank = 0, .world_size = 1, .threads = threads,
                               .staging_bytes = 0, .keep_last = 1};
    rg_ckpt_t *ck = NULL;
    double stall[2];
    double copy[2];
    int rc = 1;
    snprintf(dir, sizeof(dir), "%s/%s-staging0", root, b->name);
    params.root = dir;
    if (rg_ckpt_create(&params, &ck) != RG_OK) {
        fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
        goto out;
    }
    for (int i = 0; i < 2; i++) {
        rg_ckpt_save_t *sv;
        copy[i] = memcpy_state(b);
        uint64_t t0 = rg_now_ns();
        if (rg_ckpt_save(ck, i + 1, b->ts, N_TENSORS, 0, &sv) != RG_OK) {
            fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
            goto out;
        }
        stall[i] = ms_since(t0);
        rg_status_t st = rg_ckpt_save_wait(sv, 0);
        rg_ckpt_save_release(sv);
        if (st != RG_OK) {
            fprintf(stderr, "rg-bench-ckpt: %s\n", rg_last_error());
            goto out;
        }
    }
    printf("{\"bench\":\"ckpt-staging0\",\"dtype\":\"%s\",\"bytes\":%zu,\"staging_bytes\":0,"
           "\"first_stall_ms\":%.1f,\"first_memcpy_ms\":%.1f,\"first_stall_vs_memcpy\":%.2f,"
           "\"second_stall_ms\":%.1f,\"second_memcpy_ms\":%.1f,\"second_stall_vs_memcpy\":%.2f,"
           "%s}\n",
           b->name, b->total, stall[0], copy[0], stall[0] / copy[0], stall[1], copy[1],
           stall[1] / copy[1], RG_BENCH_META);
    fflush(stdout);
    rc = 0;
out:
    rg_ckpt_destroy(ck);
    remove_steps(dir);
    return rc;
}

static void summary_field(const char *name, double *v, int n, const char *sep)
{
    double s[64];
    memcpy(s, v, (size_t)n * sizeof(*v));
    qsort(s, (size_t)n, sizeof(*s), rg_bench_cmp_double);
    printf("\"%s_median\":%.2f,\"%s_min\":%.2f,\"%s_max\":%.2f%s", name,
           rg_bench_median(s, n), name, s[0], name, s[n - 1], sep);
}

static int run_dtype(const char *root, size_t bytes, rg_dtype_t dtype, int iters, int threads,
                     int runs)
{
    bench_state_t b;
    run_result_t res[64];
    double v[4][64];
    int ok = 0;
    int rc = state_init(&b, bytes, dtype);
    for (int r = 0; r < runs && rc == 0; r++) {
        rc = run(root, &b, iters, threads, r, &res[ok]);
        ok += rc == 0;
    }
    if (rc == 0) {
        rc = first_save(root, &b, threads);
    }
    if (ok > 0) {
        for (int r = 0; r < ok; r++) {
            v[0][r] = res[r].save_vs_limit;
            v[1][r] = res[r].save_vs_limit_medians;
            v[2][r] = res[r].stall_vs_memcpy;
            v[3][r] = res[r].save_gbps;
        }
        printf("{\"bench\":\"ckpt-summary\",\"dtype\":\"%s\",\"bytes\":%zu,\"runs\":%d,"
               "\"failed_runs\":%d,\"saves_per_run\":%d,",
               b.name, b.total, ok, runs - ok, iters);
        summary_field("save_vs_limit", v[0], ok, ",");
        summary_field("save_vs_limit_of_medians", v[1], ok, ",");
        summary_field("stall_vs_memcpy", v[2], ok, ",");
        summary_field("save_GBps", v[3], ok, ",");
        printf("%s}\n", RG_BENCH_META);
        fflush(stdout);
    }
    state_free(&b);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int64_t mib = 512;
    int64_t iters = 3;
    int64_t threads = 2;
    int64_t runs = 3;
    const char *dtypes = "f32,bf16";
    size_t bytes;
    int rc = 0;

    for (int i = 1; i < argc; i++) {
        bool more = i + 1 < argc;
        if (strcmp(argv[i], "--dir") == 0 && more) {
            dir = argv[++i];
        } else if (strcmp(argv[i], "--mib") == 0 && more && rg_parse_i64(argv[++i], &mib) &&
                   mib > 0 && mib <= 65536) {
        } else if (strcmp(argv[i], "--iters") == 0 && more && rg_parse_i64(argv[++i], &iters) &&
                   iters > 0 && iters <= MAX_ITERS) {
        } else if (strcmp(argv[i], "--threads") == 0 && more &&
                   rg_parse_i64(argv[++i], &threads) && threads > 0 && threads <= 64) {
        } else if (strcmp(argv[i], "--runs") == 0 && more && rg_parse_i64(argv[++i], &runs) &&
                   runs > 0 && runs <= 64) {
        } else if (strcmp(argv[i], "--dtypes") == 0 && more) {
            dtypes = argv[++i];
        } else {
            fprintf(stderr, "usage: rg-bench-ckpt --dir DIR [--mib 512] [--iters 3] "
                            "[--threads 2] [--runs 3] [--dtypes f32,bf16]\n");
            return 2;
        }
    }
    if (dir == NULL) {
        fprintf(stderr, "rg-bench-ckpt: --dir is required (a directory on the disk to test)\n");
        return 2;
    }
    bytes = (size_t)mib << 20;
    if (mkdir(dir, 0755) != 0 && access(dir, W_OK) != 0) {
        perror(dir);
        return 1;
    }
    if (strstr(dtypes, "f32") != NULL) {
        rc |= run_dtype(dir, bytes, RG_DTYPE_F32, (int)iters, (int)threads, (int)runs);
    }
    if (strstr(dtypes, "bf16") != NULL) {
        rc |= run_dtype(dir, bytes, RG_DTYPE_BF16, (int)iters, (int)threads, (int)runs);
    }
    return rc;
}
