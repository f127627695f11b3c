/* Helpers shared by the checkpoint tests: deterministic tensor contents, damaged files
 * (temporary roots come from test_util.h). */
#ifndef CKPT_TESTUTIL_H
#define CKPT_TESTUTIL_H

#include <regroup/ckpt.h>

#include <stddef.h>
#include <stdint.h>

/* Element e of a global tensor identified by seed: the same bytes for any slicing. */
void ckpt_fill(void *dst, rg_dtype_t dtype, uint64_t first_elem, size_t n_elems,
               uint64_t seed);
/* Number of elements in rows [0, rows) of a tensor shaped shape[0..ndim). */
uint64_t ckpt_row_elems(const uint64_t *shape, int ndim);
/* Flips one byte of a file at offset off (negative: from the end). */
void ckpt_flip_byte(const char *path, int64_t off);
/* Size of a file, or -1. */
int64_t ckpt_file_size(const char *path);

#endif
