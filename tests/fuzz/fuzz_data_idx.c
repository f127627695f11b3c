/*
 * libFuzzer target for the IDX reader: each input is written to a temporary file and read
 * both as an images file (with a valid labels file) and as a labels file, plain and gzip'd
 * inputs alike (zlib decides). scripts/fuzz.sh builds and runs it.
 * The reader must return a status, never crash, leak or read out of bounds.
 */
#include <regroup/data.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef RG_TEST_DATA_DIR
#error "RG_TEST_DATA_DIR must name tests/data"
#endif

static void try_pair(const char *images, const char *labels)
{
    rg_dataset_t *ds = NULL;
    if (rg_dataset_open_idx(images, labels, &ds) == RG_OK) {
        /* Touch every byte so that a wrong size shows up under ASan. */
        size_t         n = rg_dataset_size(ds) * rg_dataset_record_size(ds);
        const uint8_t *p = rg_dataset_records(ds);
        unsigned       sum = 0;
        for (size_t i = 0; i < n; i++) {
            sum += p[i];
        }
        for (size_t i = 0; i < rg_dataset_size(ds); i++) {
            sum += rg_dataset_labels(ds)[i];
        }
        if (sum == 0xFFFFFFFFu) {
            abort(); /* never: keeps the loop from being optimized away */
        }
        rg_dataset_destroy(ds);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[] = "/tmp/rg-fuzz-idx-XXXXXX";
    int  fd = mkstemp(path);
    if (fd < 0) {
        return 0;
    }
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            break;
        }
        off += (size_t)w;
    }
    close(fd);
    try_pair(path, RG_TEST_DATA_DIR "/idx_good_labels.gz");
    try_pair(RG_TEST_DATA_DIR "/idx_good_images.gz", path);
    unlink(path);
    return 0;
}
