/* Command-line options shared by the Fashion-MNIST trainers. */
#include "fmnist_opts.h"

#include "example_parse.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* A decompressed file of the data set is at most this big (rg_dataset's bound and a header). */
#define CACHE_MAX_BYTES (RG_DATASET_MAX_BYTES + 4096)

static int usage(const char *argv0, bool distributed, const char *why)
{
    fprintf(stderr,
            "%s: %s\nusage: %s [--epochs N] [--batch B] [--lr LR] [--seed S]\n"
            "       [--schedule cosine|constant] [--data DIR] [--data-cache DIR]\n"
            "       [--log-every STEPS]%s\n",
            argv0, why, argv0,
            distributed ? "\n       [--ckpt-every STEPS] [--kill-at STEP|start [--kill-rank R]]"
                          " [--stop-file PATH]" : "");
    return 2;
}

int fmnist_parse_options(int argc, char **argv, bool distributed, fmnist_options_t *o)
{
    *o = (fmnist_options_t){.epochs = 3, .batch = 64, .lr = 1e-3, .seed = 1, .log_every = 100,
                            .cosine = true, .data_dir = "/usr/share/datasets/fashion-mnist",
                            .ckpt_every = 200, .kill_at = -1, .kill_rank = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            return usage(argv[0], distributed, "missing value or unknown option");
        }
        bool ok = true;
        if (strcmp(a, "--epochs") == 0) {
            ok = example_parse_i64(v, &o->epochs) && o->epochs >= 1 && o->epochs <= 1000;
        } else if (strcmp(a, "--batch") == 0) {
            ok = example_parse_i64(v, &o->batch) && o->batch >= 1 && o->batch <= 65536;
        } else if (strcmp(a, "--seed") == 0) {
            ok = example_parse_i64(v, &o->seed) && o->seed >= 0;
        } else if (strcmp(a, "--log-every") == 0) {
            ok = example_parse_i64(v, &o->log_every) && o->log_every >= 1;
        } else if (strcmp(a, "--lr") == 0) {
            char *end = NULL;
            o->lr = strtod(v, &end);
            ok = end != v && *end == '\0' && o->lr > 0.0 && o->lr < 10.0;
        } else if (strcmp(a, "--schedule") == 0) {
            ok = strcmp(v, "cosine") == 0 || strcmp(v, "constant") == 0;
            o->cosine = strcmp(v, "cosine") == 0;
        } else if (strcmp(a, "--data") == 0) {
            o->data_dir = v;
        } else if (strcmp(a, "--data-cache") == 0) {
            o->data_cache = v;
        } else if (distributed && strcmp(a, "--ckpt-every") == 0) {
            ok = example_parse_i64(v, &o->ckpt_every) && o->ckpt_every >= 1;
        } else if (distributed && strcmp(a, "--kill-at") == 0) {
            o->kill_at = FMNIST_KILL_AT_START;
            ok = strcmp(v, "start") == 0 || (example_parse_i64(v, &o->kill_at) &&
                                              o->kill_at >= 0);
        } else if (distributed && strcmp(a, "--stop-file") == 0) {
            o->stop_file = v;
        } else if (distributed && strcmp(a, "--kill-rank") == 0) {
            ok = example_parse_i64(v, &o->kill_rank) && o->kill_rank >= 0;
        } else {
            return usage(argv[0], distributed, "unknown option");
        }
        if (!ok) {
            fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], v, a);
            return 2;
        }
        i++;
    }
    return 0;
}

/* Decompresses src into path (a new file of this process's name, then renamed). */
static rg_status_t cache_make(const char *src, const char *path)
{
    char tmp[1100];
    unsigned char buf[1 << 16];
    rg_status_t st = RG_OK;
    uint64_t total = 0;
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    gzFile in = gzopen(src, "rb");
    if (in == NULL) {
        return rg_error(RG_ENOENT, "%s: %s", src, strerror(errno ? errno : ENOENT));
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        gzclose_r(in);
        return rg_error(RG_EIO, "%s: %s", tmp, strerror(errno));
    }
    for (;;) {
        int got = gzread(in, buf, sizeof(buf));
        if (got < 0 || (got > 0 && (total += (uint64_t)got) > CACHE_MAX_BYTES)) {
            st = rg_error(RG_ECORRUPT, "%s: %s", src, got < 0 ? "not a readable gzip file"
                                                              : "larger than a data set");
            break;
        }
        if (got == 0) {
            break;
        }
        for (ssize_t off = 0; off < got && st == RG_OK;) {
            ssize_t w = write(fd, buf + off, (size_t)(got - off));
            if (w < 0 && errno != EINTR) {
                st = rg_error(RG_EIO, "%s: %s", tmp, strerror(errno));
            }
            off += w > 0 ? w : 0;
        }
        if (st != RG_OK) {
            break;
        }
    }
    gzclose_r(in);
    if (close(fd) != 0 && st == RG_OK) {
        st = rg_error(RG_EIO, "%s: %s", tmp, strerror(errno));
    }
    if (st == RG_OK && rename(tmp, path) != 0) {
        st = rg_error(RG_EIO, "%s: %s", path, strerror(errno));
    }
    if (st != RG_OK) {
        unlink(tmp);
    }
    return st;
}

/* The decompressed copy of dir/name.gz in the cache (made when missing) into out; false
 * (with a warning) when there is none to read. */
static bool cache_path(const fmnist_options_t *o, const char *name, char *out, size_t cap)
{
    char src[1024];
    snprintf(src, sizeof(src), "%s/%s.gz", o->data_dir, name);
    snprintf(out, cap, "%s/%s", o->data_cache, name);
    if (access(out, R_OK) == 0) {
        return true;
    }
    rg_status_t st = RG_OK;
    if (mkdir(o->data_cache, 0700) != 0 && errno != EEXIST) {
        st = rg_error(RG_EIO, "%s: %s", o->data_cache, strerror(errno));
    }
    if (st == RG_OK) {
        st = cache_make(src, out);
    }
    if (st != RG_OK) {
        fprintf(stderr, "rg-fmnist: warning: no decompressed copy of %s in %s (%s): reading "
                "the .gz\n", src, o->data_cache, rg_last_error());
        return false;
    }
    return true;
}

rg_status_t fmnist_open_split(const fmnist_options_t *o, const char *prefix,
                              rg_dataset_t **ds_p)
{
    char images[1024];
    char labels[1024];
    char name[128];
    if (o->data_cache != NULL) {
        char ci[1100];
        char cl[1100];
        snprintf(name, sizeof(name), "%s-images-idx3-ubyte", prefix);
        bool have = cache_path(o, name, ci, sizeof(ci));
        snprintf(name, sizeof(name), "%s-labels-idx1-ubyte", prefix);
        have = have && cache_path(o, name, cl, sizeof(cl));
        if (have) {
            rg_status_t st = rg_dataset_open_idx(ci, cl, ds_p);
            if (st == RG_OK || st == RG_ENOMEM) {
                return st;
            }
            fprintf(stderr, "rg-fmnist: warning: the decompressed copies in %s: %s: reading "
                    "the .gz\n", o->data_cache, rg_last_error());
        }
    }
    snprintf(images, sizeof(images), "%s/%s-images-idx3-ubyte.gz", o->data_dir, prefix);
    snprintf(labels, sizeof(labels), "%s/%s-labels-idx1-ubyte.gz", o->data_dir, prefix);
    return rg_dataset_open_idx(images, labels, ds_p);
}
