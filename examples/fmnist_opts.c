/* Command-line options shared by the Fashion-MNIST trainers. */
#include "fmnist_opts.h"

#include "example_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *argv0, bool distributed, const char *why)
{
    fprintf(stderr,
            "%s: %s\nusage: %s [--epochs N] [--batch B] [--lr LR] [--seed S]\n"
            "       [--schedule cosine|constant] [--data DIR] [--log-every STEPS]%s\n",
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

rg_status_t fmnist_open_split(const char *dir, const char *prefix, rg_dataset_t **ds_p)
{
    char images[1024];
    char labels[1024];
    snprintf(images, sizeof(images), "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    snprintf(labels, sizeof(labels), "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    return rg_dataset_open_idx(images, labels, ds_p);
}
