/* train/data_dataset.c: the IDX reader on the real Fashion-MNIST files and on the golden
 * corrupt, truncated and foreign files in tests/data/ (made by tests/data/make_idx_golden.py). */
#include <regroup/data.h>

#include "test_util.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef RG_TEST_DATA_DIR
#error "RG_TEST_DATA_DIR must name tests/data"
#endif
#ifndef RG_FMNIST_DIR
#error "RG_FMNIST_DIR must name the Fashion-MNIST folder"
#endif

/* A path by value: golden("x").s lives until the end of the full expression. */
typedef struct {
    char s[512];
} path_t;

static path_t golden(const char *name)
{
    path_t p;
    snprintf(p.s, sizeof(p.s), "%s/%s", RG_TEST_DATA_DIR, name);
    return p;
}

static path_t fmnist(const char *name)
{
    path_t p;
    snprintf(p.s, sizeof(p.s), "%s/%s", RG_FMNIST_DIR, name);
    return p;
}

/* Opens images + labels expecting failure with status and a message containing needle. */
static void expect_fail(const char *images, const char *labels, rg_status_t want,
                        const char *needle)
{
    rg_dataset_t *ds = (rg_dataset_t *)(uintptr_t)0x1;
    rg_error_clear();
    rg_status_t st = rg_dataset_open_idx(images, labels, &ds);
    ck_assert_msg(st == want, "%s: got %s (%s), want %s", images, rg_status_name(st),
                  rg_last_error(), rg_status_name(want));
    ck_assert_msg(strstr(rg_last_error(), needle) != NULL, "message '%s' lacks '%s'",
                  rg_last_error(), needle);
    ck_assert_ptr_eq(ds, (rg_dataset_t *)(uintptr_t)0x1); /* untouched on failure */
}

static void check_real(const char *images, const char *labels, size_t n)
{
    rg_dataset_t *ds = NULL;
    ck_assert_msg(rg_dataset_open_idx(fmnist(images).s, fmnist(labels).s, &ds) == RG_OK, "%s",
                  rg_last_error());
    ck_assert_uint_eq(rg_dataset_size(ds), n);
    ck_assert_uint_eq(rg_dataset_record_size(ds), 784);
    uint32_t dims[3];
    ck_assert_uint_eq(rg_dataset_dims(ds, dims), 2);
    ck_assert_uint_eq(dims[0], 28);
    ck_assert_uint_eq(dims[1], 28);
    /* Fashion-MNIST is balanced: n / 10 images of each of the 10 classes. */
    size_t per_class[256] = {0};
    const uint8_t *lab = rg_dataset_labels(ds);
    for (size_t i = 0; i < n; i++) {
        per_class[lab[i]]++;
    }
    for (int c = 0; c < 10; c++) {
        ck_assert_uint_eq(per_class[c], n / 10);
    }
    /* Pixels span the whole byte range and the images are not blank. */
    const uint8_t *px = rg_dataset_records(ds);
    uint8_t        lo = 255;
    uint8_t        hi = 0;
    for (size_t i = 0; i < n * 784; i++) {
        lo = RG_MIN(lo, px[i]);
        hi = RG_MAX(hi, px[i]);
    }
    ck_assert_uint_eq(lo, 0);
    ck_assert_uint_eq(hi, 255);
    rg_dataset_destroy(ds);
}

START_TEST(test_real_train)
{
    check_real("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60000);
}
END_TEST

START_TEST(test_real_test)
{
    check_real("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10000);
}
END_TEST

static void check_good(const char *images)
{
    rg_dataset_t *ds = NULL;
    ck_assert_msg(rg_dataset_open_idx(golden(images).s, golden("idx_good_labels.gz").s, &ds) ==
                      RG_OK, "%s", rg_last_error());
    ck_assert_uint_eq(rg_dataset_size(ds), 5);
    ck_assert_uint_eq(rg_dataset_record_size(ds), 6);
    uint32_t dims[3];
    ck_assert_uint_eq(rg_dataset_dims(ds, dims), 2);
    ck_assert_uint_eq(dims[0], 3);
    ck_assert_uint_eq(dims[1], 2);
    const uint8_t *px = rg_dataset_records(ds);
    for (int i = 0; i < 30; i++) {
        ck_assert_uint_eq(px[i], (i * 7 + 3) % 256);
    }
    const uint8_t want_labels[5] = {9, 0, 4, 1, 7};
    ck_assert_mem_eq(rg_dataset_labels(ds), want_labels, 5);
    rg_dataset_destroy(ds);
}

START_TEST(test_golden_good)
{
    check_good("idx_good_images.gz");
    check_good("idx_plain_images.idx"); /* zlib reads uncompressed files as they are */
}
END_TEST

START_TEST(test_golden_corrupt)
{
    path_t      labels_path = golden("idx_good_labels.gz");
    const char *labels = labels_path.s;
    expect_fail(golden("idx_bad_type.gz").s, labels, RG_ECORRUPT, "magic 0x00000d03");
    expect_fail(golden("idx_bad_magic.gz").s, labels, RG_ECORRUPT, "magic 0x12340803");
    expect_fail(golden("idx_foreign.gz").s, labels, RG_ECORRUPT, "not an IDX file");
    expect_fail(golden("idx_zero_dim.gz").s, labels, RG_ECORRUPT, "dimension 1 is 0");
    expect_fail(golden("idx_bad_crc.gz").s, labels, RG_ECORRUPT, "incorrect data check");
    expect_fail(golden("idx_trailing.gz").s, labels, RG_ECORRUPT, "trailing data");
    expect_fail(golden("idx_good_images.gz").s, golden("idx_labels4.gz").s, RG_ECORRUPT,
                "holds 5 records but");
    /* Each file in the other's place: the dimension counts do not fit. */
    expect_fail(golden("idx_good_labels.gz").s, labels, RG_ECORRUPT, "2 to 4 dimensions");
    expect_fail(golden("idx_good_images.gz").s, golden("idx_good_images.gz").s, RG_ECORRUPT,
                "1 to 1 dimensions");
}
END_TEST

START_TEST(test_golden_truncated)
{
    path_t      labels_path = golden("idx_good_labels.gz");
    const char *labels = labels_path.s;
    expect_fail(golden("idx_trunc_header.gz").s, labels, RG_ECORRUPT,
                "truncated dimensions: 2 of 12 bytes");
    expect_fail(golden("idx_trunc_data.gz").s, labels, RG_ECORRUPT,
                "truncated data: 20 of 30 bytes");
    expect_fail(golden("idx_trunc_gzip.gz").s, labels, RG_ECORRUPT, "truncated gzip stream");
    expect_fail(golden("idx_claims_more.gz").s, labels, RG_ECORRUPT,
                "truncated data: 30 of 784000 bytes");
}
END_TEST

START_TEST(test_golden_limits)
{
    path_t      labels_path = golden("idx_good_labels.gz");
    const char *labels = labels_path.s;
    expect_fail(golden("idx_huge.gz").s, labels, RG_ETOOBIG, "more than 1073741824 bytes");
    expect_fail(golden("no_such_file.gz").s, labels, RG_ENOENT, "no_such_file.gz");
    expect_fail(golden("idx_good_images.gz").s, golden("no_such_labels.gz").s, RG_ENOENT,
                "no_such_labels.gz");
}
END_TEST

START_TEST(test_create_copies)
{
    uint8_t       rec[6] = {1, 2, 3, 4, 5, 6};
    uint8_t       lab[3] = {7, 8, 9};
    rg_dataset_t *ds = NULL;
    ck_assert_int_eq(rg_dataset_create(rec, lab, 3, 2, &ds), RG_OK);
    rec[0] = 100;
    lab[0] = 100;
    ck_assert_uint_eq(rg_dataset_records(ds)[0], 1);
    ck_assert_uint_eq(rg_dataset_labels(ds)[0], 7);
    ck_assert_uint_eq(rg_dataset_records(ds)[5], 6);
    uint32_t dims[3];
    ck_assert_uint_eq(rg_dataset_dims(ds, dims), 1);
    ck_assert_uint_eq(dims[0], 2);
    rg_dataset_destroy(ds);
    rg_dataset_destroy(NULL);

    rg_dataset_t *untouched = NULL;
    ck_assert_int_eq(rg_dataset_create(rec, lab, 0, 2, &untouched), RG_EINVAL);
    ck_assert_int_eq(rg_dataset_create(rec, lab, 3, 0, &untouched), RG_EINVAL);
    ck_assert_int_eq(rg_dataset_create(rec, lab, (size_t)1 << 20, (size_t)1 << 11, &untouched),
                     RG_ETOOBIG);
    ck_assert_ptr_null(untouched);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("data_idx");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_real_train);
    tcase_add_test(tc, test_real_test);
    tcase_add_test(tc, test_golden_good);
    tcase_add_test(tc, test_golden_corrupt);
    tcase_add_test(tc, test_golden_truncated);
    tcase_add_test(tc, test_golden_limits);
    tcase_add_test(tc, test_create_copies);
    suite_add_tcase(s, tc);
    return test_main("test_data_idx", s, NULL);
}
