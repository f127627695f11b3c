/* Command-line options shared by the Fashion-MNIST trainers (rg-fmnist, rg-fmnist-local). */
#ifndef REGROUP_EXAMPLES_FMNIST_OPTS_H
#define REGROUP_EXAMPLES_FMNIST_OPTS_H

#include <regroup/data.h>
#include <regroup/status.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t     epochs;
    int64_t     batch;       /* global batch */
    double      lr;
    int64_t     seed;
    int64_t     log_every;
    bool        cosine;
    const char *data_dir;
    /* distributed trainer only */
    int64_t     ckpt_every;  /* steps between checkpoints */
    int64_t     kill_at;     /* global step at which kill_rank SIGKILLs itself (first attempt),
                                or FMNIST_KILL_AT_START: before training (--kill-at start) */
    int64_t     kill_rank;
    const char *stop_file;   /* ends the job at the next epoch boundary once it exists */
} fmnist_options_t;

#define FMNIST_KILL_AT_START (-2)

/* Parses argv; distributed enables --ckpt-every, --kill-at, --kill-rank and --stop-file. Returns 0, or 2
 * after printing a message naming the bad option. */
int fmnist_parse_options(int argc, char **argv, bool distributed, fmnist_options_t *o);

/* Opens <dir>/<prefix>-images-idx3-ubyte.gz and the matching labels. */
rg_status_t fmnist_open_split(const char *dir, const char *prefix, rg_dataset_t **ds_p);

#endif
