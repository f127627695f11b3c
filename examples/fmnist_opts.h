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
    const char *data_cache;  /* --data-cache: the data set's decompressed files, or NULL */
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

/* Opens <o->data_dir>/<prefix>-images-idx3-ubyte.gz and the matching labels. With
 * o->data_cache, from their decompressed copies there instead: a copy that is missing is
 * made first (written under a name of this process's, then renamed: a reader sees all of it
 * or none), so that only the first process to open the data set decompresses it (a
 * replacement or a restart then reads it in milliseconds, as torchvision's extracted files
 * are read). A copy that cannot be made or read is left to the .gz, with a warning. */
rg_status_t fmnist_open_split(const fmnist_options_t *o, const char *prefix,
                              rg_dataset_t **ds_p);

#endif
