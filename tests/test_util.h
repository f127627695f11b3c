/* Small helpers shared by the test suites. */
#ifndef REGROUP_TEST_UTIL_H
#define REGROUP_TEST_UTIL_H

#include <stdbool.h>

/* True if the file's first MiB contains text (false if it cannot be read). */
bool test_file_contains(const char *path, const char *text);

#endif
