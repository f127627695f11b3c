/* Durable file operations for checkpoints, step directory naming and listing. */
#include "ckpt_format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LIST_MAX_ENTRIES (1u << 20)
#define WRITE_STEP       (64u << 20)

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static int64_t fault_kill_after = -1;
static int64_t fault_kill_point = -1;
static _Atomic int64_t fault_written;
static _Atomic int64_t fault_points;
static int64_t fault_slow_step = -1;
static int64_t fault_slow_ms;
static atomic_bool fault_slow_done;

static void fault_init(void)
{
    const char *env = getenv("REGROUP_CKPT_KILL_AFTER_BYTES");
    int64_t v;
    if (env != NULL && rg_parse_i64(env, &v) && v >= 0) {
        fault_kill_after = v;
    }
    env = getenv("REGROUP_CKPT_KILL_AT_POINT");
    if (env != NULL && rg_parse_i64(env, &v) && v >= 1) {
        fault_kill_point = v;
    }
    /* STEP:MS */
    env = getenv("REGROUP_CKPT_SLOW_COMMIT");
    const char *colon = env != NULL ? strchr(env, ':') : NULL;
    char step[32];
    if (colon != NULL && (size_t)(colon - env) < sizeof(step)) {
        memcpy(step, env, (size_t)(colon - env));
        step[colon - env] = '\0';
        int64_t ms;
        if (rg_parse_i64(step, &v) && v >= 0 && rg_parse_i64(colon + 1, &ms) && ms >= 0 &&
            ms <= 600000) {
            fault_slow_step = v;
            fault_slow_ms = ms;
        }
    }
}

void ckpt_fault_commit(int64_t step)
{
    pthread_once(&fault_once, fault_init);
    if (step == fault_slow_step && !atomic_exchange(&fault_slow_done, true)) {
        rg_warn("checkpoint step %lld: the commit waits %lld ms first "
                "(REGROUP_CKPT_SLOW_COMMIT)", (long long)step, (long long)fault_slow_ms);
        rg_sleep_ms(fault_slow_ms);
    }
}

void ckpt_fault_point(void)
{
    pthread_once(&fault_once, fault_init);
    if (fault_kill_after >= 0 && atomic_load(&fault_written) >= fault_kill_after) {
        raise(SIGKILL);
    }
    if (fault_kill_point >= 0 && atomic_fetch_add(&fault_points, 1) + 1 >= fault_kill_point) {
        raise(SIGKILL);
    }
}

/* With the hook armed, how many of the next n bytes may be written before the kill. */
static size_t fault_allow(size_t n)
{
    int64_t done;
    pthread_once(&fault_once, fault_init);
    if (fault_kill_after < 0) {
        return n;
    }
    done = atomic_load(&fault_written);
    if (done >= fault_kill_after) {
        raise(SIGKILL);
    }
    return (size_t)RG_MIN((int64_t)n, fault_kill_after - done);
}

rg_status_t ckpt_errno_status(int err)
{
    switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return RG_ENOSPC;
    case EACCES:
    case EPERM:
    case EROFS:
        return RG_EPERM;
    case ENOENT:
        return RG_ENOENT;
    case ENOMEM:
        return RG_ENOMEM;
    default:
        return RG_EIO;
    }
}

rg_status_t ckpt_write_all(int fd, const void *buf, size_t len, const char *path)
{
    const char *p = buf;

    while (len > 0) {
        size_t n = fault_allow(RG_MIN(len, (size_t)WRITE_STEP));
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            int err = errno;
            if (err == EINTR) {
                continue;
            }
            return rg_error(ckpt_errno_status(err), "write %s: %s", path, strerror(err));
        }
        if (w == 0) {
            return rg_error(RG_EIO, "write %s: no progress", path);
        }
        atomic_fetch_add(&fault_written, (int64_t)w);
        p += w;
        len -= (size_t)w;
    }
    return RG_OK;
}

rg_status_t ckpt_pread_all(int fd, void *buf, size_t len, uint64_t off, const char *path)
{
    char *p = buf;

    while (len > 0) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0) {
            int err = errno;
            if (err == EINTR) {
                continue;
            }
            return rg_error(ckpt_errno_status(err), "read %s: %s", path, strerror(err));
        }
        if (r == 0) {
            return rg_error(RG_ECORRUPT, "read %s: file ends early at %" PRIu64, path, off);
        }
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return RG_OK;
}

rg_status_t ckpt_fsync_path(const char *path, bool dir)
{
    int fd;
    int err;

    ckpt_fault_point();
    fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        return rg_error(ckpt_errno_status(err), "open %s for fsync: %s", path, strerror(err));
    }
    if (fsync(fd) != 0) {
        err = errno;
        close(fd);
        return rg_error(ckpt_errno_status(err), "fsync %s: %s", path, strerror(err));
    }
    close(fd);
    return RG_OK;
}

rg_status_t ckpt_mkdir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        int err = errno;
        return rg_error(ckpt_errno_status(err), "mkdir %s: %s", path, strerror(err));
    }
    return RG_OK;
}

rg_status_t ckpt_finish_tmp(int fd, rg_status_t st, const char *tmp, const char *dst,
                            const char *dir, bool drop_cache)
{
    int err;

    if (st == RG_OK) {
        ckpt_fault_point();
        if (fsync(fd) != 0) {
            err = errno;
            st = rg_error(ckpt_errno_status(err), "fsync %s: %s", tmp, strerror(err));
        } else if (drop_cache) {
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);   /* durable: let it go */
        }
    }
    if (close(fd) != 0 && st == RG_OK) {
        err = errno;
        st = rg_error(ckpt_errno_status(err), "close %s: %s", tmp, strerror(err));
    }
    if (st == RG_OK) {
        ckpt_fault_point();
        if (rename(tmp, dst) != 0) {
            err = errno;
            st = rg_error(ckpt_errno_status(err), "rename %s: %s", tmp, strerror(err));
        }
    }
    if (st != RG_OK) {
        unlink(tmp);
        return st;
    }
    return ckpt_fsync_path(dir, true);
}

rg_status_t ckpt_write_file_atomic(const char *dir, const char *name, const void *buf,
                                   size_t len)
{
    char tmp[CKPT_PATH_MAX];
    char dst[CKPT_PATH_MAX];
    int fd;
    int err;

    if (!ckpt_fmt(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name) ||
        !ckpt_fmt(dst, sizeof(dst), "%s/%s", dir, name)) {
        return rg_error(RG_EINVAL, "path %s/%s too long", dir, name);
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        err = errno;
        return rg_error(ckpt_errno_status(err), "create %s: %s", tmp, strerror(err));
    }
    return ckpt_finish_tmp(fd, ckpt_write_all(fd, buf, len, tmp), tmp, dst, dir, false);
}

rg_status_t ckpt_read_file(const char *path, size_t max, char **buf_p, size_t *len_p)
{
    struct stat sb;
    char *buf;
    rg_status_t st;
    int err;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        err = errno;
        return rg_error(ckpt_errno_status(err), "open %s: %s", path, strerror(err));
    }
    if (fstat(fd, &sb) != 0) {
        err = errno;
        close(fd);
        return rg_error(ckpt_errno_status(err), "stat %s: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        close(fd);
        return rg_error(RG_ECORRUPT, "%s: not a regular file of at most %zu bytes", path, max);
    }
    buf = malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        close(fd);
        return rg_error(RG_ENOMEM, "no memory to read %s", path);
    }
    st = ckpt_pread_all(fd, buf, (size_t)sb.st_size, 0, path);
    close(fd);
    if (st != RG_OK) {
        free(buf);
        return st;
    }
    buf[sb.st_size] = '\0';
    *buf_p = buf;
    *len_p = (size_t)sb.st_size;
    return RG_OK;
}

rg_status_t ckpt_remove_step_dir(const char *path)
{
    char sub[CKPT_PATH_MAX];
    DIR *d;
    struct dirent *de;
    size_t n = 0;
    int err;

    ckpt_fmt(sub, sizeof(sub), "%s/%s", path, CKPT_MANIFEST_NAME);
    if (unlink(sub) == 0) {
        rg_status_t st = ckpt_fsync_path(path, true);
        if (st != RG_OK) {
            return st;
        }
    } else if (errno != ENOENT) {
        err = errno;
        return rg_error(ckpt_errno_status(err), "unlink %s: %s", sub, strerror(err));
    }
    d = opendir(path);
    if (d == NULL) {
        err = errno;
        return rg_error(ckpt_errno_status(err), "opendir %s: %s", path, strerror(err));
    }
    /* Our step directories hold only plain files; anything else makes rmdir fail below. */
    while ((de = readdir(d)) != NULL && n++ < LIST_MAX_ENTRIES) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
            continue;
        }
        ckpt_fmt(sub, sizeof(sub), "%s/%s", path, de->d_name);
        if (unlink(sub) != 0 && errno != ENOENT) {
            rg_warn("checkpoint cleanup: unlink %s: %m", sub);
        }
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT) {
        err = errno;
        return rg_error(ckpt_errno_status(err), "rmdir %s: %s", path, strerror(err));
    }
    return RG_OK;
}

bool ckpt_fmt(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

int ckpt_step_dir(char *out, size_t cap, const char *root, int64_t step)
{
    int n = snprintf(out, cap, "%s/step-%" PRId64, root, step);
    return (n < 0 || (size_t)n >= cap) ? -1 : 0;
}

bool ckpt_parse_step_name(const char *name, int64_t *step)
{
    int64_t v;
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9' ||
        !rg_parse_i64(name + 5, &v) || v < 0) {
        return false;
    }
    *step = v;
    return true;
}

static int step_cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

rg_status_t ckpt_list_steps(const char *root, bool committed_only, int64_t **steps_p,
                            size_t *n_p)
{
    DIR *d = opendir(root);
    struct dirent *de;
    int64_t *steps = NULL;
    size_t n = 0;
    size_t cap = 0;
    size_t seen = 0;
    int err;

    if (d == NULL) {
        err = errno;
        if (err == ENOENT) {
            *steps_p = NULL;
            *n_p = 0;
            return RG_OK;
        }
        return rg_error(ckpt_errno_status(err), "opendir %s: %s", root, strerror(err));
    }
    while ((de = readdir(d)) != NULL) {
        int64_t step;
        if (++seen > LIST_MAX_ENTRIES) {
            free(steps);
            closedir(d);
            return rg_error(RG_ETOOBIG, "%s holds more than %u entries", root,
                            LIST_MAX_ENTRIES);
        }
        if (!ckpt_parse_step_name(de->d_name, &step)) {
            continue;
        }
        {
            char path[CKPT_PATH_MAX];
            struct stat sb;
            if (!ckpt_fmt(path, sizeof(path), "%s/%s", root, de->d_name) ||
                stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
                continue;   /* not one of our step directories */
            }
        }
        if (committed_only) {
            char path[CKPT_PATH_MAX];
            struct stat sb;
            if (!ckpt_fmt(path, sizeof(path), "%s/%s/%s", root, de->d_name,
                          CKPT_MANIFEST_NAME)) {
                continue;
            }
            if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                continue;
            }
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            int64_t *ns = realloc(steps, ncap * sizeof(*ns));
            if (ns == NULL) {
                free(steps);
                closedir(d);
                return rg_error(RG_ENOMEM, "no memory listing %s", root);
            }
            steps = ns;
            cap = ncap;
        }
        steps[n++] = step;
    }
    closedir(d);
    if (n > 1) {
        qsort(steps, n, sizeof(*steps), step_cmp_desc);
    }
    *steps_p = steps;
    *n_p = n;
    return RG_OK;
}
