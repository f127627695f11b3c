/*
 * The fork server (--preload=MODULES): one Python interpreter per agent that imports the
 * modules once and forks each worker of a Python PROGRAM from there (forkserver.py, built
 * into the agent), so that a worker (the first ones, a restarted one, a replacement in place)
 * does not import torch again: a second or more of CPU each on every start otherwise.
 *
 * A worker is the server's grandchild; its parent exits at once, and the agent, a child
 * subreaper, becomes the worker's parent: it reaps it, signals its process group and reads
 * its pipes exactly as it does a worker it forks and execs itself. The worker sets what the
 * exec path's child sets (process group, parent-death signal, signal mask, CPUs, stdout and
 * stderr, the descriptors it keeps, the environment) before it runs the program. A server
 * that dies leaves the agent starting workers by exec, with a warning.
 */
#include "launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "forkserver_py.h"   /* forkserver.py as rg_forkserver_py[], generated */

#define FORK_MSG_MAX     (128 * 1024)   /* forkserver.py's MSG_MAX */
#define FORK_FDS_MAX     64             /* and FDS_MAX */
#define FORK_REPLY_MS    10000          /* a fork, once the modules are in */
#define FORK_PRELOAD_MS  600000         /* importing the modules (torch: seconds) */

/* The interpreter options a fork server passes on: those that change nothing but what an
 * interpreter does at its start. */
static bool passed_flag(const char *a)
{
    return strcmp(a, "-u") == 0 || strcmp(a, "-B") == 0 || strcmp(a, "-s") == 0 ||
           strcmp(a, "-E") == 0;
}

static bool is_python(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, "python", 6) == 0;
}

rg_status_t launcher_python_cmd(const rg_agent_params_t *p, launcher_pycmd_t *c)
{
    int k = 0;
    size_t len = strlen(p->argv[0]);

    memset(c, 0, sizeof(*c));
    c->interp = "python3";
    if (p->module || (!p->no_python && len > 3 && strcmp(p->argv[0] + len - 3, ".py") == 0)) {
        c->flags[c->n_flags++] = "-u";
        c->module = p->module;
    } else if (is_python(p->argv[0])) {
        c->interp = p->argv[k++];
        for (; k < p->argc && p->argv[k][0] == '-' && strcmp(p->argv[k], "-m") != 0; k++) {
            if (!passed_flag(p->argv[k]) || c->n_flags == (int)RG_ARRAY_SIZE(c->flags)) {
                return rg_error(RG_EINVAL, "--preload: %s's option %s is not one a fork server "
                                "can pass on (-u, -B, -s, -E); give it in the environment "
                                "instead", c->interp, p->argv[k]);
            }
            c->flags[c->n_flags++] = p->argv[k];
        }
        if (k < p->argc && strcmp(p->argv[k], "-m") == 0) {
            c->module = true;
            k++;
        }
        if (k == p->argc) {
            return rg_error(RG_EINVAL, "--preload: %s is given no script or module to run",
                            c->interp);
        }
    } else {
        return rg_error(RG_EINVAL, "--preload: %s is not a Python program: give a .py script, "
                        "-m MODULE, or python3 [-u] SCRIPT|-m MODULE with --no-python",
                        p->argv[0]);
    }
    c->target = p->argv[k];
    c->first_arg = k + 1;
    return RG_OK;
}

rg_status_t launcher_preload_check(const rg_agent_params_t *p)
{
    const char *s = p->preload;
    launcher_pycmd_t c;

    if (s[0] == '\0') {
        return RG_OK;
    }
    /* Module names: identifiers with dots, comma separated (they go to the server's
     * command line, where a stray character would be somebody's code). */
    for (const char *q = s; *q != '\0'; q++) {
        bool start = q == s || q[-1] == ',' || q[-1] == '.';
        bool ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_' ||
                  (!start && ((*q >= '0' && *q <= '9') || *q == '.' || *q == ','));
        if (!ok || ((*q == '.' || *q == ',') && (q[1] == '\0' || q[1] == '.' ||
                                                 q[1] == ','))) {
            return rg_error(RG_EINVAL, "--preload=%s: expected module names separated by "
                            "commas, such as torch,numpy", s);
        }
    }
    if (p->argc < 1) {
        return RG_OK;   /* said by the program's own check */
    }
    return launcher_python_cmd(p, &c);
}

rg_status_t launcher_fork_start(launcher_fork_t *f, const rg_agent_params_t *cfg,
                                char **envp, const sigset_t *child_mask)
{
    int sv[2];
    char fd_arg[16];
    char agent_arg[16];
    pid_t agent = getpid();

    memset(f, 0, sizeof(*f));
    f->sock = -1;
    rg_status_t st = launcher_python_cmd(cfg, &f->cmd);
    if (st != RG_OK) {
        return st;
    }
    const launcher_pycmd_t c = f->cmd;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        return rg_error(RG_ESYS, "--preload: socketpair: %s", strerror(errno));
    }
    char *args[RG_ARRAY_SIZE(c.flags) + 8];
    int k = 0;
    args[k++] = (char *)c.interp;
    for (int i = 0; i < c.n_flags; i++) {
        args[k++] = (char *)c.flags[i];
    }
    args[k++] = "-c";
    args[k++] = (char *)rg_forkserver_py;
    snprintf(fd_arg, sizeof(fd_arg), "%d", sv[1]);
    snprintf(agent_arg, sizeof(agent_arg), "%d", (int)agent);
    args[k++] = fd_arg;
    args[k++] = agent_arg;
    args[k++] = (char *)cfg->preload;
    args[k] = NULL;
    if (prctl(PR_GET_CHILD_SUBREAPER, &f->prev_subreaper) != 0 ||
        prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        st = rg_error(RG_ESYS, "--preload: cannot make the agent a child subreaper: %s",
                      strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return st;
    }
    f->subreaper_set = true;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {   /* async-signal-safe calls only, as in a worker's child */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != agent) {
            _exit(127);
        }
        sigprocmask(SIG_SETMASK, child_mask, NULL);
        fcntl(sv[1], F_SETFD, 0);
        execvpe(args[0], args, envp);
        _exit(127);
    }
    close(sv[1]);
    if (pid < 0) {
        st = rg_error(RG_ESYS, "--preload: fork: %s", strerror(errno));
        close(sv[0]);
        prctl(PR_SET_CHILD_SUBREAPER, f->prev_subreaper);
        f->subreaper_set = false;
        return st;
    }
    setpgid(pid, pid);
    f->pid = pid;
    f->sock = sv[0];
    rg_info("fork server (pid %d): %s importing %s", (int)pid, c.interp, cfg->preload);
    return RG_OK;
}

/* The server's next message into buf (NUL-terminated), within ms. -1: it is gone or silent
 * (errno set), else the length. */
static ssize_t fork_read(launcher_fork_t *f, char *buf, size_t cap, int64_t ms)
{
    rg_deadline_t deadline = rg_deadline_in_ms(ms);
    for (;;) {
        struct pollfd pfd = {.fd = f->sock, .events = POLLIN};
        int64_t left = rg_deadline_left_ms(deadline);
        int n = poll(&pfd, 1, (int)RG_MIN(left, 1000));
        if (n < 0 && errno != EINTR) {
            return -1;
        }
        if (n > 0) {
            ssize_t r = recv(f->sock, buf, cap - 1, 0);
            if (r <= 0) {
                errno = r == 0 ? EPIPE : errno;
                return -1;
            }
            buf[r] = '\0';
            return r;
        }
        if (rg_deadline_passed(deadline)) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
}

/* Why the modules cannot be imported: what every later start says (truncated to fit). */
static void set_error(launcher_fork_t *f, const char *fmt, ...) RG_PRINTF(2, 3);
static void set_error(launcher_fork_t *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->error, sizeof(f->error), fmt, ap);
    va_end(ap);
}

/* Gives the server up: later workers start by exec (why: NULL for no warning). */
static void fork_lost(launcher_fork_t *f, const char *why)
{
    if (why != NULL) {
        rg_warn("the fork server (pid %d) %s; workers start by exec from now on (they import "
                "their modules again)", (int)f->pid, why);
    }
    close(f->sock);
    f->sock = -1;
    kill(f->pid, SIGKILL);   /* reaped as any child of the agent's */
    f->pid = 0;
}

bool launcher_fork_usable(const launcher_fork_t *f)
{
    return f->pid > 0 && f->sock >= 0;
}

/* Appends a NUL-terminated field to msg; false when it does not fit. */
static bool put(char *msg, size_t *o, const char *s)
{
    size_t n = strlen(s) + 1;
    if (*o + n > FORK_MSG_MAX) {
        return false;
    }
    memcpy(msg + *o, s, n);
    *o += n;
    return true;
}

static bool put_int(char *msg, size_t *o, long long v)
{
    char num[24];
    snprintf(num, sizeof(num), "%lld", v);
    return put(msg, o, num);
}

/* The request of forkserver.py into msg: false if it does not fit FORK_MSG_MAX. */
static bool fork_request(char *msg, size_t *o, const launcher_pycmd_t *c,
                         const rg_agent_params_t *cfg, char **envp, const sigset_t *mask,
                         const cpu_set_t *cpus, const int *targets, int n_keep)
{
    int n_env = 0;
    int n_cpus = 0;
    int n_sig = 0;
    bool ok = put(msg, o, "spawn") && put(msg, o, c->module ? "module" : "script") &&
              put(msg, o, c->target) && put_int(msg, o, cfg->argc - c->first_arg);
    for (int i = c->first_arg; ok && i < cfg->argc; i++) {
        ok = put(msg, o, cfg->argv[i]);
    }
    while (envp[n_env] != NULL) {
        n_env++;
    }
    ok = ok && put_int(msg, o, n_env);
    for (int i = 0; ok && i < n_env; i++) {
        ok = put(msg, o, envp[i]);
    }
    for (int i = 0; cpus != NULL && i < CPU_SETSIZE; i++) {
        n_cpus += CPU_ISSET(i, cpus) ? 1 : 0;
    }
    ok = ok && put_int(msg, o, n_cpus);
    for (int i = 0; ok && cpus != NULL && i < CPU_SETSIZE; i++) {
        if (CPU_ISSET(i, cpus)) {
            ok = put_int(msg, o, i);
        }
    }
    for (int s = 1; s < NSIG; s++) {
        n_sig += sigismember(mask, s) == 1 ? 1 : 0;
    }
    ok = ok && put_int(msg, o, n_sig);
    for (int s = 1; ok && s < NSIG; s++) {
        if (sigismember(mask, s) == 1) {
            ok = put_int(msg, o, s);
        }
    }
    ok = ok && put_int(msg, o, n_keep);
    for (int i = 0; ok && i < n_keep; i++) {
        ok = put_int(msg, o, targets[i]);
    }
    return ok;
}

rg_status_t launcher_fork_spawn(launcher_fork_t *f, const rg_agent_params_t *cfg, char **envp,
                                const sigset_t *mask, const cpu_set_t *cpus, const int *fds,
                                const int *targets, int n_keep, pid_t *pid)
{
    const launcher_pycmd_t *c = &f->cmd;
    char reply[4200];

    if (f->error[0] != '\0') {
        return rg_error(RG_EINVAL, "%s", f->error);
    }
    if (!launcher_fork_usable(f) || 3 + n_keep > FORK_FDS_MAX) {
        return RG_EAGAIN;
    }
    if (!f->ready) {
        if (fork_read(f, reply, sizeof(reply), FORK_PRELOAD_MS) < 0) {
            fork_lost(f, errno == ETIMEDOUT ? "did not import its modules in time"
                                            : "exited while importing its modules");
            return RG_EAGAIN;
        }
        if (strncmp(reply, "error ", 6) == 0) {
            /* The user's to mend: every worker would meet the same import. */
            set_error(f, "--preload=%s: %s: %s", cfg->preload, c->interp, reply + 6);
            fork_lost(f, NULL);
            return rg_error(RG_EINVAL, "%s", f->error);
        }
        int threads = atoi(reply + 6);
        if (threads > 1) {
            rg_info("fork server (pid %d) has %d threads after importing %s: a worker forked "
                    "from it starts with only one", (int)f->pid, threads, cfg->preload);
        }
        f->ready = true;
    }
    char *msg = malloc(FORK_MSG_MAX);
    size_t len = 0;
    if (msg == NULL) {
        return RG_EAGAIN;
    }
    if (!fork_request(msg, &len, c, cfg, envp, mask, cpus, targets, n_keep)) {
        free(msg);
        rg_warn("a worker's command line and environment exceed the fork server's %d bytes: "
                "started by exec", FORK_MSG_MAX);
        return RG_EAGAIN;
    }
    union {
        char           buf[CMSG_SPACE(sizeof(int) * FORK_FDS_MAX)];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = msg, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                        .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)(3 + n_keep))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)(3 + n_keep));
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)(3 + n_keep));
    ssize_t sent;
    do {
        sent = sendmsg(f->sock, &mh, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    free(msg);
    if (sent != (ssize_t)len) {
        fork_lost(f, "does not take requests");
        return RG_EAGAIN;
    }
    if (fork_read(f, reply, sizeof(reply), FORK_REPLY_MS) < 0) {
        fork_lost(f, errno == ETIMEDOUT ? "did not answer in time" : "exited");
        return RG_EAGAIN;
    }
    long v = strncmp(reply, "pid ", 4) == 0 ? strtol(reply + 4, NULL, 10) : 0;
    if (v <= 0) {
        rg_warn("the fork server could not start a worker (%s): started by exec", reply);
        return RG_EAGAIN;
    }
    *pid = (pid_t)v;
    return RG_OK;
}

bool launcher_fork_reaped(launcher_fork_t *f, pid_t pid, int status)
{
    if (f->pid <= 0 || pid != f->pid) {
        return false;
    }
    char why[64];
    if (WIFSIGNALED(status)) {
        snprintf(why, sizeof(why), "was ended by signal %d", WTERMSIG(status));
    } else {
        snprintf(why, sizeof(why), "exited with status %d", WEXITSTATUS(status));
    }
    char reply[1024];
    if (!f->ready && fork_read(f, reply, sizeof(reply), 0) > 0 &&
        strncmp(reply, "error ", 6) == 0) {
        /* what the next start says (the agent's cfg is not at hand here) */
        set_error(f, "--preload: %s", reply + 6);
    } else {
        rg_warn("the fork server (pid %d) %s; workers start by exec from now on (they import "
                "their modules again)", (int)pid, why);
    }
    close(f->sock);
    f->sock = -1;
    f->pid = 0;
    return true;
}

void launcher_fork_stop(launcher_fork_t *f)
{
    if (f->sock >= 0) {
        close(f->sock);
        f->sock = -1;
    }
    if (f->pid > 0) {
        kill(f->pid, SIGKILL);
        waitpid(f->pid, NULL, 0);
        f->pid = 0;
    }
    if (f->subreaper_set) {
        prctl(PR_SET_CHILD_SUBREAPER, f->prev_subreaper);
        f->subreaper_set = false;
    }
}
