/* File-system helpers that would otherwise be shelled out (`rm -rf`). */
#include "rg_common.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

/* Keeps walking past an entry it cannot remove: the caller checks whether the root is gone. */
static int rm_tree_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    (void)remove(path);
    return 0;
}

bool rg_rm_tree(const char *path)
{
    struct stat sb;

    if (path == NULL || path[0] == '\0') {
        return false;
    }
    /* Depth first, without following symbolic links (a link is removed, not its target). */
    if (nftw(path, rm_tree_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) {
        return false;
    }
    return lstat(path, &sb) != 0 && errno == ENOENT;
}
