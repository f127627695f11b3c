/*
 * Datasets of fixed-size records and the IDX reader (the MNIST file format).
 *
 * An IDX file is a 4-byte magic (0, 0, element type, number of dimensions), one big-endian
 * 32-bit size per dimension, then the elements in row-major order. We accept unsigned bytes
 * (type 0x08) only. Everything read from a file is bounded before it is trusted: the header
 * limits are checked before anything is allocated, and the body buffer grows as bytes actually
 * arrive, so a small file claiming a huge size costs nothing.
 */
#include <regroup/data.h>

#include "rg_common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_TYPE_UBYTE   0x08
#define IDX_MAX_DIMS     4                 /* the count plus up to 3 record dimensions */
#define IDX_READ_CHUNK   (8u << 20)        /* bytes per gzread() call */
#define IDX_FIRST_ALLOC  (1u << 20)

struct rg_dataset {
    size_t   n;
    size_t   record_size;
    unsigned ndims;
    uint32_t dims[3];
    uint8_t *records;
    uint8_t *labels;
};

/* ---- the IDX reader -------------------------------------------------------------------- */

typedef struct {
    const char *path;
    gzFile      f;
} idx_file_t;

/* Maps a failed or short gzread() to a status with a message naming the file. */
static rg_status_t idx_read_error(idx_file_t *in, const char *what, size_t got, size_t want)
{
    int         zerr = Z_OK;
    const char *msg = gzerror(in->f, &zerr);
    if (zerr == Z_ERRNO) {
        return rg_error(RG_EIO, "%s: reading %s: %s", in->path, what, strerror(errno));
    }
    if (zerr == Z_BUF_ERROR) {
        return rg_error(RG_ECORRUPT, "%s: %s: truncated gzip stream", in->path, what);
    }
    if (zerr != Z_OK) {
        return rg_error(RG_ECORRUPT, "%s: %s: %s", in->path, what, msg);
    }
    return rg_error(RG_ECORRUPT, "%s: truncated %s: %zu of %zu bytes", in->path, what, got,
                    want);
}

/* Reads exactly want bytes or fails. want <= IDX_READ_CHUNK. */
static rg_status_t idx_read_exact(idx_file_t *in, void *buf, size_t want, const char *what)
{
    int got = gzread(in->f, buf, (unsigned)want);
    if (got < 0 || (size_t)got != want) {
        return idx_read_error(in, what, got < 0 ? 0 : (size_t)got, want);
    }
    return RG_OK;
}

static uint32_t idx_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/*
 * Reads one IDX file of unsigned bytes with between min_dims and max_dims dimensions.
 * On success *data_p (malloc'd, the caller frees it) holds dims[0] * ... bytes.
 */
static rg_status_t idx_read(const char *path, unsigned min_dims, unsigned max_dims,
                            uint32_t dims[IDX_MAX_DIMS], unsigned *ndims_p, uint8_t **data_p)
{
    idx_file_t  in = {.path = path, .f = NULL};
    uint8_t     hdr[4 * IDX_MAX_DIMS];
    uint8_t    *data = NULL;
    rg_status_t st;

    errno = 0;
    in.f = gzopen(path, "rb");
    if (in.f == NULL) {
        int e = errno;
        if (e == ENOENT) {
            return rg_error(RG_ENOENT, "%s: %s", path, strerror(e));
        }
        return rg_error(e == ENOMEM ? RG_ENOMEM : RG_EIO, "%s: cannot open: %s", path,
                        e ? strerror(e) : "gzopen failed");
    }
    gzbuffer(in.f, 256u << 10);

    st = idx_read_exact(&in, hdr, 4, "header");
    if (st != RG_OK) {
        goto err_close;
    }
    uint32_t magic = idx_be32(hdr);
    unsigned ndims = hdr[3];
    if (hdr[0] != 0 || hdr[1] != 0 || hdr[2] != IDX_TYPE_UBYTE || ndims < min_dims ||
        ndims > max_dims) {
        st = rg_error(RG_ECORRUPT,
                      "%s: not an IDX file of unsigned bytes with %u to %u dimensions "
                      "(magic 0x%08x)", path, min_dims, max_dims, magic);
        goto err_close;
    }
    st = idx_read_exact(&in, hdr, 4 * (size_t)ndims, "dimensions");
    if (st != RG_OK) {
        goto err_close;
    }
    uint64_t total = 1;
    for (unsigned i = 0; i < ndims; i++) {
        dims[i] = idx_be32(hdr + 4 * i);
        if (dims[i] == 0) {
            st = rg_error(RG_ECORRUPT, "%s: dimension %u is 0", path, i);
            goto err_close;
        }
        total *= dims[i]; /* each factor < 2^32 and total stays <= 2^30 before it: no overflow */
        if (total > RG_DATASET_MAX_BYTES) {
            st = rg_error(RG_ETOOBIG, "%s: more than %llu bytes of data", path,
                          (unsigned long long)RG_DATASET_MAX_BYTES);
            goto err_close;
        }
    }
    if (dims[0] > RG_DATASET_MAX_RECORDS) {
        st = rg_error(RG_ETOOBIG, "%s: %u records, more than %llu", path, dims[0],
                      (unsigned long long)RG_DATASET_MAX_RECORDS);
        goto err_close;
    }

    /* The body: grow the buffer as data arrives, never past the declared size. */
    size_t have = 0;
    size_t cap = 0;
    while (have < total) {
        if (have == cap) {
            size_t   ncap = RG_MIN((size_t)total, RG_MAX((size_t)IDX_FIRST_ALLOC, 2 * cap));
            uint8_t *p = realloc(data, ncap);
            if (p == NULL) {
                st = rg_error(RG_ENOMEM, "%s: no memory for %zu bytes", path, ncap);
                goto err_free;
            }
            data = p;
            cap = ncap;
        }
        size_t want = RG_MIN(cap - have, (size_t)IDX_READ_CHUNK);
        int    got = gzread(in.f, data + have, (unsigned)want);
        if (got <= 0) {
            st = idx_read_error(&in, "data", have, (size_t)total);
            goto err_free;
        }
        have += (size_t)got;
    }
    /* One more byte must not exist; reading it also makes zlib check the gzip trailer. */
    uint8_t extra;
    int     got = gzread(in.f, &extra, 1);
    if (got > 0) {
        st = rg_error(RG_ECORRUPT, "%s: trailing data after %llu bytes of records", path,
                      (unsigned long long)total);
        goto err_free;
    }
    int zerr = Z_OK;
    gzerror(in.f, &zerr);
    if (got < 0 || zerr != Z_OK) {
        st = idx_read_error(&in, "end of file", 0, 0);
        goto err_free;
    }
    if (gzclose_r(in.f) != Z_OK) {
        in.f = NULL;
        st = rg_error(RG_EIO, "%s: close failed", path);
        goto err_free;
    }
    *ndims_p = ndims;
    *data_p = data;
    return RG_OK;

err_free:
    free(data);
err_close:
    if (in.f != NULL) {
        gzclose_r(in.f);
    }
    return st;
}

rg_status_t rg_dataset_open_idx(const char *images_path, const char *labels_path,
                                rg_dataset_t **ds_p)
{
    uint32_t     idims[IDX_MAX_DIMS] = {0};
    uint32_t     ldims[IDX_MAX_DIMS] = {0};
    unsigned     indims = 0;
    unsigned     lndims = 0;
    uint8_t     *images = NULL;
    uint8_t     *labels = NULL;
    rg_dataset_t *ds;
    rg_status_t  st;

    if (images_path == NULL || labels_path == NULL || ds_p == NULL) {
        return rg_error(RG_EINVAL, "rg_dataset_open_idx: NULL argument");
    }
    /* Labels first: the smaller file, and a count to hold the images file to. */
    st = idx_read(labels_path, 1, 1, ldims, &lndims, &labels);
    if (st != RG_OK) {
        return st;
    }
    st = idx_read(images_path, 2, IDX_MAX_DIMS, idims, &indims, &images);
    if (st != RG_OK) {
        goto err_free_labels;
    }
    if (idims[0] != ldims[0]) {
        st = rg_error(RG_ECORRUPT, "%s holds %u records but %s holds %u labels", images_path,
                      idims[0], labels_path, ldims[0]);
        goto err_free_images;
    }
    ds = calloc(1, sizeof(*ds));
    if (ds == NULL) {
        st = rg_error(RG_ENOMEM, "no memory for a dataset");
        goto err_free_images;
    }
    ds->n = idims[0];
    ds->record_size = 1;
    ds->ndims = indims - 1;
    for (unsigned i = 1; i < indims; i++) {
        ds->dims[i - 1] = idims[i];
        ds->record_size *= idims[i];
    }
    ds->records = images;
    ds->labels = labels;
    rg_debug("dataset %s: %zu records of %zu bytes", images_path, ds->n, ds->record_size);
    *ds_p = ds;
    return RG_OK;

err_free_images:
    free(images);
err_free_labels:
    free(labels);
    return st;
}

/* ---- datasets in memory ---------------------------------------------------------------- */

rg_status_t rg_dataset_create(const uint8_t *records, const uint8_t *labels, size_t n,
                              size_t record_size, rg_dataset_t **ds_p)
{
    if (records == NULL || labels == NULL || ds_p == NULL || n == 0 || record_size == 0) {
        return rg_error(RG_EINVAL, "rg_dataset_create: empty or NULL argument");
    }
    if (n > RG_DATASET_MAX_RECORDS || record_size > RG_DATASET_MAX_BYTES ||
        n > RG_DATASET_MAX_BYTES / record_size || record_size > UINT32_MAX) {
        return rg_error(RG_ETOOBIG, "dataset of %zu records of %zu bytes is too big", n,
                        record_size);
    }
    rg_dataset_t *ds = calloc(1, sizeof(*ds));
    if (ds == NULL) {
        return rg_error(RG_ENOMEM, "no memory for a dataset");
    }
    ds->records = malloc(n * record_size);
    ds->labels = malloc(n);
    if (ds->records == NULL || ds->labels == NULL) {
        rg_dataset_destroy(ds);
        return rg_error(RG_ENOMEM, "no memory for %zu records of %zu bytes", n, record_size);
    }
    memcpy(ds->records, records, n * record_size);
    memcpy(ds->labels, labels, n);
    ds->n = n;
    ds->record_size = record_size;
    ds->ndims = 1;
    ds->dims[0] = (uint32_t)record_size;
    *ds_p = ds;
    return RG_OK;
}

void rg_dataset_destroy(rg_dataset_t *ds)
{
    if (ds == NULL) {
        return;
    }
    free(ds->records);
    free(ds->labels);
    free(ds);
}

size_t rg_dataset_size(const rg_dataset_t *ds)
{
    return ds->n;
}

size_t rg_dataset_record_size(const rg_dataset_t *ds)
{
    return ds->record_size;
}

const uint8_t *rg_dataset_records(const rg_dataset_t *ds)
{
    return ds->records;
}

const uint8_t *rg_dataset_labels(const rg_dataset_t *ds)
{
    return ds->labels;
}

unsigned rg_dataset_dims(const rg_dataset_t *ds, uint32_t dims[3])
{
    memcpy(dims, ds->dims, sizeof(ds->dims));
    return ds->ndims;
}
