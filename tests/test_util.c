/* Small helpers shared by the test suites. */
#include "test_util.h"

#include <stdio.h>
#include <string.h>

bool test_file_contains(const char *path, const char *text)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL) {
        return false;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, text) != NULL;
}
