/*
 * Worker processes: started with torchrun's environment, each in its own process group with
 * PR_SET_PDEATHSIG(SIGKILL) so that it dies with its agent; stdout and stderr come back
 * through pipes, so the agent can log them, tee them and keep the last lines of stderr.
 */
#include "launcher.h"
#include "rg_notice.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ERROR_FILE_MAX (64 * 1024)

/* The environment of one worker, built before fork: the agent has threads, so the child may
 * not allocate between fork and exec. */
typedef struct {
    char  *vars[64];
    int    n;
    char **envp;
} worker_env_t;

static void env_add(worker_env_t *e, const char *name, const char *fmt, ...) RG_PRINTF(3, 4);
static void env_add(worker_env_t *e, const char *name, const char *fmt, ...)
{
    char value[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof(value), fmt, ap);
    va_end(ap);
    if (e->n < (int)RG_ARRAY_SIZE(e->vars) &&
        asprintf(&e->vars[e->n], "%s=%s", name, value) > 0) {
        e->n++;
    }
}

static void env_free(worker_env_t *e)
{
    for (int i = 0; i < e->n; i++) {
        free(e->vars[i]);
    }
    free(e->envp);
    e->n = 0;
    e->envp = NULL;
}

static bool same_name(const char *a, const char *b)
{
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) + 1 : strlen(a);
    return strncmp(a, b, len) == 0;
}

/* True if entry's variable is one of vars[0..n-1]. */
static bool env_in(char *const *vars, int n, const char *entry)
{
    for (int i = 0; i < n; i++) {
        if (same_name(entry, vars[i])) {
            return true;
        }
    }
    return false;
}

extern char **environ;

static rg_status_t env_finish(worker_env_t *e, const rg_agent_params_t *cfg);

static rg_status_t env_build(worker_env_t *e, const launcher_spawn_t *sp,
                             const launcher_worker_t *w)
{
    const rg_agent_params_t *cfg = sp->cfg;
    const rg_rdzv_assignment_t *a = sp->asg;

    memset(e, 0, sizeof(*e));
    /* A newcomer (a replacement, a joining node's worker) is in no round: rg_train_regroup
     * gives it its rank and world size. Until then it gets its local rank of its node's
     * workers, which is valid whatever the running round's size (its rank in that round
     * could be past the round's world size, which rg_train_init refuses). */
    env_add(e, "RANK", "%d", sp->join ? w->local_rank : w->rank);
    env_add(e, "LOCAL_RANK", "%d", w->local_rank);
    env_add(e, "WORLD_SIZE", "%d", sp->join ? cfg->nproc : a->world_size);
    env_add(e, "LOCAL_WORLD_SIZE", "%d", cfg->nproc);
    env_add(e, "GROUP_RANK", "%d", a->group_rank);
    env_add(e, "GROUP_WORLD_SIZE", "%d", a->group_world);
    env_add(e, "ROLE_RANK", "%d", w->rank);
    env_add(e, "ROLE_WORLD_SIZE", "%d", a->world_size);
    env_add(e, "ROLE_NAME", "%s", cfg->role);
    env_add(e, "MASTER_ADDR", "%s", a->master_addr);
    env_add(e, "MASTER_PORT", "%d", a->master_port);
    env_add(e, "TORCHELASTIC_RESTART_COUNT", "%d", a->restart_count);
    env_add(e, "TORCHELASTIC_MAX_RESTARTS", "%d", cfg->max_restarts);
    env_add(e, "TORCHELASTIC_RUN_ID", "%s", cfg->job);
    env_add(e, "TORCHELASTIC_ERROR_FILE", "%s", w->error_file);
    env_add(e, "TORCHELASTIC_USE_AGENT_STORE", "False");
    env_add(e, "REGROUP_ETCD_ENDPOINTS", "%s", sp->endpoints);
    /* The workers' own etcd clients (their group's wire-up, progress and checkpoint keys)
     * need what the agent's needs: TLS files and the etcd user. */
    const struct {
        const char *name;
        const char *value;
    } creds[] = {
        {"REGROUP_ETCD_CACERT", cfg->cacert}, {"REGROUP_ETCD_CERT", cfg->cert},
        {"REGROUP_ETCD_KEY", cfg->key},       {"REGROUP_ETCD_USER", cfg->user},
        {"REGROUP_ETCD_PASSWORD", cfg->password},
    };
    for (size_t i = 0; i < RG_ARRAY_SIZE(creds); i++) {
        if (creds[i].value[0] != '\0') {
            env_add(e, creds[i].name, "%s", creds[i].value);
        }
    }
    env_add(e, "REGROUP_JOB_ID", "%s", cfg->job);
    env_add(e, "REGROUP_ROUND", "%d", a->round);
    env_add(e, "REGROUP_NODE_ADDR", "%s", sp->local_addr);
    /* The job's largest world (--nnodes' maximum x --nproc-per-node): what a program that
     * keeps its global batch fixed through resizes sizes it by (regroup.train's loaders). */
    env_add(e, "REGROUP_MAX_WORLD_SIZE", "%lld", (long long)cfg->max_nodes * cfg->nproc);
    if (sp->notice_fd >= 0) {
        env_add(e, RG_NOTICE_ENV, "%d", sp->notice_fd);
    }
    if (sp->beat_fd >= 0) {
        env_add(e, RG_BEAT_ENV, "%d", sp->beat_fd);
    }
    if (sp->n_table_fds > 0) {
        char list[RG_TABLE_SLOTS_MAX * 12];
        size_t o = 0;
        for (int i = 0; i < sp->n_table_fds && i < RG_TABLE_SLOTS_MAX; i++) {
            o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%d", i ? "," : "",
                                  sp->table_fds[i]);
        }
        env_add(e, RG_TABLE_ENV, "%s", list);
    }
    if (sp->agent != NULL && sp->lease != 0) {
        env_add(e, "REGROUP_AGENT_ID", "%s", sp->agent);
        env_add(e, "REGROUP_AGENT_LEASE", "%lld", (long long)sp->lease);
    }
    /* Always said, so that a REGROUP_RECOVERY the agent was started with (an option's
     * source) cannot tell a worker of a restart job that it recovers in place. */
    env_add(e, "REGROUP_RECOVERY", "%s",
            cfg->recovery == RG_AGENT_RECOVERY_IN_PLACE ? "in-place" : "restart");
    /* How the workers name a straggler, and (in place) whether its node leaves. */
    env_add(e, RG_STRAGGLER_WINDOW_ENV, "%lld", (long long)cfg->straggler_window_ms);
    if (cfg->straggler_factor > 0) {
        env_add(e, RG_STRAGGLER_FACTOR_ENV, "%g", cfg->straggler_factor);
        env_add(e, RG_STRAGGLER_EVICT_ENV, "1");
    }
    /* Always said, as the recovery is. */
    env_add(e, RG_HEALTH_CHECK_ENV, "%s", cfg->health == RG_AGENT_HEALTH_EVICT  ? "evict"
                                          : cfg->health == RG_AGENT_HEALTH_WARN ? "warn"
                                                                                : "off");
    if (cfg->recovery == RG_AGENT_RECOVERY_IN_PLACE) {
        if (sp->pipe_fd >= 0) {
            env_add(e, RG_NOTICE_PIPE_ENV, "%d", sp->pipe_fd);
        }
        if (sp->join) {
            env_add(e, RG_NOTICE_JOIN_ENV, "1");
            if (sp->replacement) {
                env_add(e, RG_NOTICE_REPLACEMENT_ENV, "1");
            }
            env_add(e, RG_NOTICE_JOIN_MS_ENV, "%lld", 2 * (long long)cfg->join_timeout_ms);
        }
    }
    return env_finish(e, cfg);
}

/* What every worker's environment has, after e's own variables: envp. */
static rg_status_t env_finish(worker_env_t *e, const rg_agent_params_t *cfg)
{
    size_t n_environ = 0;
    size_t k = 0;

    if (getenv("PYTHONUNBUFFERED") == NULL) {
        env_add(e, "PYTHONUNBUFFERED", "1");
    }
    /* As torchrun: several workers of a node each running a full OpenMP pool would
     * oversubscribe its cores, so they get one thread unless the user chose. */
    if (cfg->nproc > 1 && getenv("OMP_NUM_THREADS") == NULL &&
        !env_in((char *const *)cfg->env, cfg->n_env, "OMP_NUM_THREADS=")) {
        env_add(e, "OMP_NUM_THREADS", "1");
    }
    while (environ[n_environ] != NULL) {
        n_environ++;
    }
    e->envp = calloc(n_environ + (size_t)cfg->n_env + (size_t)e->n + 1, sizeof(char *));
    if (e->envp == NULL) {
        env_free(e);
        return rg_error(RG_ENOMEM, "worker environment");
    }
    /* This process's environment, then the caller's entries, then torchrun's variables; each
     * replaces the variables of the same name before it. */
    char *const *extra = (char *const *)cfg->env;
    for (size_t i = 0; i < n_environ; i++) {
        if (!env_in(e->vars, e->n, environ[i]) && !env_in(extra, cfg->n_env, environ[i])) {
            e->envp[k++] = environ[i];
        }
    }
    for (int i = 0; i < cfg->n_env; i++) {
        if (!env_in(e->vars, e->n, extra[i])) {
            e->envp[k++] = extra[i];
        }
    }
    for (int i = 0; i < e->n; i++) {
        e->envp[k++] = e->vars[i];
    }
    e->envp[k] = NULL;
    return RG_OK;
}

/* In the child, between fork and exec: async-signal-safe calls only. If exec fails, its errno
 * goes to the agent through exec_w (close-on-exec, so a successful exec closes it). */
static void child_exec(char **args, char **envp, int out_w, int err_w, int exec_w, pid_t agent,
                       const sigset_t *child_mask, const cpu_set_t *cpus, int notice_fd,
                       int beat_fd, int pipe_fd, const int *table_fds, int n_table_fds)
{
    int e;

    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != agent) {
        _exit(127);   /* the agent died before we got here */
    }
    sigprocmask(SIG_SETMASK, child_mask, NULL);
    if (cpus != NULL && sched_setaffinity(0, sizeof(*cpus), cpus) != 0) {
        e = -errno;   /* negative: the binding failed, not exec */
        if (write(exec_w, &e, sizeof(e)) < 0) {
            _exit(127);
        }
        _exit(127);
    }
    dup2(out_w, STDOUT_FILENO);
    dup2(err_w, STDERR_FILENO);
    if (notice_fd >= 0) {
        fcntl(notice_fd, F_SETFD, 0);   /* the agent's descriptors a worker keeps */
    }
    if (beat_fd >= 0) {
        fcntl(beat_fd, F_SETFD, 0);
    }
    if (pipe_fd >= 0) {
        fcntl(pipe_fd, F_SETFD, 0);
    }
    for (int i = 0; i < n_table_fds; i++) {
        fcntl(table_fds[i], F_SETFD, 0);
    }
    execvpe(args[0], args, envp);
    e = errno;
    if (write(exec_w, &e, sizeof(e)) < 0) {
        _exit(127);
    }
    _exit(127);
}

/* Waits for worker pid's exec: 0 once it ran the program (or died before trying), else the
 * errno of the failed exec, read from exec_r. */
static int exec_result(int exec_r)
{
    int e = 0;
    ssize_t n;
    do {
        n = read(exec_r, &e, sizeof(e));
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof(e) ? e : 0;
}

/* Closes both ends of the pipes given (ex may be NULL). */
static void close_pipes(int out[2], int err[2], int ex[2])
{
    int *pipes[] = {out, err, ex};
    for (size_t i = 0; i < RG_ARRAY_SIZE(pipes); i++) {
        if (pipes[i] != NULL) {
            close(pipes[i][0]);
            close(pipes[i][1]);
        }
    }
}

static void worker_close(launcher_worker_t *w, const rg_agent_params_t *cfg);

static FILE *open_log(const launcher_spawn_t *sp, const launcher_worker_t *w, const char *name)
{
    char dir[1024];
    char path[1100];
    const rg_agent_params_t *cfg = sp->cfg;
    snprintf(dir, sizeof(dir), "%s/%s/round_%d/rank_%d", sp->log_dir, cfg->job,
             sp->asg->round, w->rank);
    /* mkdir -p, bounded by the path's depth */
    for (char *p = dir + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    }
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/%s.log", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        rg_warn("cannot open log %s: %m", path);
    }
    return f;
}

static rg_status_t launcher_workers_spawn(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                          const sigset_t *child_mask, char **args,
                                          const cpu_set_t *sets);

static rg_status_t spawn_one(launcher_workers_t *ws, const launcher_spawn_t *sp,
                             const sigset_t *child_mask, char **args, const cpu_set_t *cpus,
                             int i);

/* The command line of a worker into args[cfg->argc + 4]. */
static void worker_args(const rg_agent_params_t *cfg, char **args)
{
    int k = 0;

    if (cfg->module || (!cfg->no_python && strlen(cfg->argv[0]) > 3 &&
                        strcmp(cfg->argv[0] + strlen(cfg->argv[0]) - 3, ".py") == 0)) {
        args[k++] = "python3";
        args[k++] = "-u";
        if (cfg->module) {
            args[k++] = "-m";
        }
    }
    for (int i = 0; i < cfg->argc; i++) {
        args[k++] = cfg->argv[i];
    }
    args[k] = NULL;
}

rg_status_t launcher_workers_respawn(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                     const sigset_t *child_mask, int i)
{
    const rg_agent_params_t *cfg = sp->cfg;
    char *args[cfg->argc + 4];
    cpu_set_t cpus;
    bool bind = ws->w[i].bind;

    if (i < 0 || i >= ws->n || ws->w[i].running) {
        return rg_error(RG_EINVAL, "no exited worker %d to start again", i);
    }
    cpus = ws->w[i].cpus;
    worker_args(cfg, args);
    worker_close(&ws->w[i], cfg);
    return spawn_one(ws, sp, child_mask, args, bind ? &cpus : NULL, i);
}

rg_status_t launcher_workers_start(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                   const sigset_t *child_mask)
{
    const rg_agent_params_t *cfg = sp->cfg;
    char *args[cfg->argc + 4];

    worker_args(cfg, args);
    ws->n = 0;
    ws->running = 0;
    /* Every worker starts afresh: no node copy of an earlier attempt is theirs. */
    rg_table_slots_reset(sp->n_table_fds, sp->table_fds);
    cpu_set_t *sets = NULL;
    if (cfg->numa != RG_AGENT_NUMA_NONE) {
        sets = calloc((size_t)cfg->nproc, sizeof(*sets));
        if (sets == NULL) {
            return rg_error(RG_ENOMEM, "cannot start workers: CPU sets");
        }
        rg_status_t st = launcher_numa_sets(cfg, sets, cfg->nproc);
        if (st != RG_OK) {
            free(sets);
            return st;
        }
    }
    rg_status_t st = launcher_workers_spawn(ws, sp, child_mask, args, sets);
    free(sets);
    return st;
}

/* Worker w through the fork server, if the agent has one: what child_exec does, by the
 * server. RG_EAGAIN: it has none, or gave up. */
static rg_status_t fork_server_spawn(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                     const worker_env_t *env, const sigset_t *child_mask,
                                     launcher_worker_t *w, int out_w, int err_w, int ex_w)
{
    int fds[3 + 3 + RG_TABLE_SLOTS_MAX] = {out_w, err_w, ex_w};
    int targets[3 + RG_TABLE_SLOTS_MAX];
    int n = 0;
    const int kept[] = {sp->notice_fd, sp->beat_fd, sp->pipe_fd};

    if (!launcher_fork_usable(&ws->fork) && ws->fork.error[0] == '\0') {
        return RG_EAGAIN;
    }
    for (size_t i = 0; i < RG_ARRAY_SIZE(kept); i++) {
        if (kept[i] >= 0) {
            fds[3 + n] = targets[n] = kept[i];
            n++;
        }
    }
    for (int i = 0; i < sp->n_table_fds && i < RG_TABLE_SLOTS_MAX; i++) {
        fds[3 + n] = targets[n] = sp->table_fds[i];
        n++;
    }
    return launcher_fork_spawn(&ws->fork, sp->cfg, env->envp, child_mask,
                               w->bind ? &w->cpus : NULL, fds, targets, n, &w->pid);
}

rg_status_t launcher_workers_fork_start(launcher_workers_t *ws, const rg_agent_params_t *cfg,
                                        const sigset_t *child_mask)
{
    worker_env_t env;

    memset(&ws->fork, 0, sizeof(ws->fork));
    ws->fork.sock = -1;
    if (cfg->preload[0] == '\0') {
        return RG_OK;
    }
    memset(&env, 0, sizeof(env));
    rg_status_t st = env_finish(&env, cfg);
    if (st == RG_OK) {
        st = launcher_fork_start(&ws->fork, cfg, env.envp, child_mask);
    }
    env_free(&env);
    return st;
}

/* Starts worker i (local rank i) with args; cpus: its binding, or NULL. */
static rg_status_t spawn_one(launcher_workers_t *ws, const launcher_spawn_t *sp,
                             const sigset_t *child_mask, char **args, const cpu_set_t *cpus,
                             int i)
{
    const rg_agent_params_t *cfg = sp->cfg;
    pid_t agent = getpid();
    launcher_worker_t *w = &ws->w[i];
    int out[2];
    int err[2];
    int ex[2];

    memset(w, 0, sizeof(*w));
    w->local_rank = i;
    w->rank = sp->asg->rank_offset + i;
    w->out_fd = -1;
    w->err_fd = -1;
    if (cpus != NULL) {
        w->bind = true;
        w->cpus = *cpus;
    }
    snprintf(w->error_file, sizeof(w->error_file), "%s/error_r%d_l%d.json", ws->run_dir,
             sp->asg->round, i);
    unlink(w->error_file);
    if (pipe2(out, O_CLOEXEC) != 0) {
        return rg_error(RG_ESYS, "cannot start workers: pipe: %s", strerror(errno));
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
        close(out[0]);
        close(out[1]);
        return rg_error(RG_ESYS, "cannot start workers: pipe: %s", strerror(errno));
    }
    if (pipe2(ex, O_CLOEXEC) != 0) {
        rg_status_t st = rg_error(RG_ESYS, "cannot start workers: pipe: %s",
                                  strerror(errno));
        close_pipes(out, err, NULL);
        return st;
    }
    int to_files = launcher_std_bits(cfg, false, i) | launcher_std_bits(cfg, true, i);
    if (sp->log_dir != NULL && sp->log_dir[0] != '\0') {
        if (to_files & 1) {
            w->out_log = open_log(sp, w, "stdout");
        }
        if (to_files & 2) {
            w->err_log = open_log(sp, w, "stderr");
        }
    }
    worker_env_t env;
    rg_status_t st = env_build(&env, sp, w);
    if (st != RG_OK) {
        close_pipes(out, err, ex);
        worker_close(w, cfg);   /* its logs */
        return st;
    }
    st = fork_server_spawn(ws, sp, &env, child_mask, w, out[1], err[1], ex[1]);
    launcher_pycmd_t py;
    const char *program = args[0];
    if (st == RG_OK && launcher_python_cmd(cfg, &py) == RG_OK) {
        program = py.target;   /* what the server could not open */
    }
    if (st == RG_EINVAL) {   /* the modules cannot be imported */
        env_free(&env);
        close_pipes(out, err, ex);
        worker_close(w, cfg);
        return st;
    }
    if (st != RG_OK) {   /* no server (or it cannot take this one): fork and exec */
        fflush(stdout);
        fflush(stderr);
        w->pid = fork();
        if (w->pid == 0) {
            child_exec(args, env.envp, out[1], err[1], ex[1], agent, child_mask,
                       w->bind ? &w->cpus : NULL, sp->notice_fd, sp->beat_fd, sp->pipe_fd,
                       sp->table_fds, sp->n_table_fds);
        }
        if (w->pid < 0) {
            st = rg_error(RG_ESYS, "cannot start workers: fork: %s", strerror(errno));
            env_free(&env);
            close_pipes(out, err, ex);
            worker_close(w, cfg);
            return st;
        }
        /* Also from the parent: no window in which a signal to the group misses it. (A
         * worker of the fork server sets its group before its start pipe says it runs.) */
        setpgid(w->pid, w->pid);
    }
    env_free(&env);
    close(out[1]);
    close(err[1]);
    close(ex[1]);
    /* A program that cannot be executed is no worker failure to retry: every restart
     * would meet it again. The job ends here, saying what and why. */
    int exec_errno = exec_result(ex[0]);
    close(ex[0]);
    if (exec_errno != 0) {
        waitpid(w->pid, NULL, 0);
        close(out[0]);
        close(err[0]);
        worker_close(w, cfg);
        if (exec_errno < 0) {
            return rg_error(RG_ESYS, "--numa-binding: cannot bind local rank %d to its "
                            "CPUs: %s", i, strerror(-exec_errno));
        }
        return rg_error(RG_ESYS, "cannot run %s: %s", program, strerror(exec_errno));
    }
    w->out_fd = out[0];
    w->err_fd = err[0];
    fcntl(w->out_fd, F_SETFL, O_NONBLOCK);
    fcntl(w->err_fd, F_SETFL, O_NONBLOCK);
    w->running = true;
    ws->running++;
    return RG_OK;
}

static rg_status_t launcher_workers_spawn(launcher_workers_t *ws, const launcher_spawn_t *sp,
                                          const sigset_t *child_mask, char **args,
                                          const cpu_set_t *sets)
{
    const rg_agent_params_t *cfg = sp->cfg;
    for (int i = 0; i < cfg->nproc; i++) {
        rg_status_t st = spawn_one(ws, sp, child_mask, args, sets ? &sets[i] : NULL, i);
        if (st != RG_OK) {
            return st;
        }
        ws->n++;
    }
    return RG_OK;
}

static void tail_push(launcher_worker_t *w, const char *line, size_t len)
{
    snprintf(w->tail[w->tail_next], sizeof(w->tail[0]), "%.*s", (int)len, line);
    w->tail_next = (w->tail_next + 1) % (int)RG_ARRAY_SIZE(w->tail);
    if (w->tail_count < (int)RG_ARRAY_SIZE(w->tail)) {
        w->tail_count++;
    }
}

static void emit_line(launcher_worker_t *w, bool is_err, const char *line, size_t len,
                      const rg_agent_params_t *cfg)
{
    int bit = is_err ? 2 : 1;
    FILE *log = is_err ? w->err_log : w->out_log;
    FILE *console = is_err ? stderr : stdout;

    if (is_err) {
        tail_push(w, line, len);
    }
    if (log != NULL) {
        fwrite(line, 1, len, log);
        fputc('\n', log);
        fflush(log);
    }
    if (cfg->ranks_filter &&
        (w->local_rank >= LAUNCHER_MAX_NPROC || !cfg->ranks_shown[w->local_rank])) {
        return;   /* --local-ranks-filter: not on the console (the files above have it) */
    }
    if (launcher_std_bits(cfg, true, w->local_rank) & bit) {
        fprintf(console, "[rank %d]: %.*s\n", w->rank, (int)len, line);
    } else if (!(launcher_std_bits(cfg, false, w->local_rank) & bit)) {
        fprintf(console, "%.*s\n", (int)len, line);
    }
}

/* Moves complete lines out of buf (and everything when flush, or when the line is full). */
static void split_lines(launcher_worker_t *w, bool is_err, char *buf, size_t *len, bool flush,
                        const rg_agent_params_t *cfg)
{
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] == '\n') {
            emit_line(w, is_err, buf + start, i - start, cfg);
            start = i + 1;
        }
    }
    if (start == 0 && (flush || *len == 4096) && *len > 0) {
        emit_line(w, is_err, buf, *len, cfg);
        start = *len;
    }
    memmove(buf, buf + start, *len - start);
    *len -= start;
}

static bool pump_fd(launcher_worker_t *w, bool is_err, const rg_agent_params_t *cfg)
{
    int *fd = is_err ? &w->err_fd : &w->out_fd;
    char *buf = is_err ? w->err_line : w->out_line;
    size_t *len = is_err ? &w->err_len : &w->out_len;

    /* Bounded: at most 64 reads per wakeup, the rest at the next one. */
    for (int k = 0; k < 64 && *fd >= 0; k++) {
        ssize_t n = read(*fd, buf + *len, 4096 - *len);
        if (n > 0) {
            *len += (size_t)n;
            split_lines(w, is_err, buf, len, false, cfg);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            break;
        }
        split_lines(w, is_err, buf, len, true, cfg);
        close(*fd);
        *fd = -1;
    }
    fflush(is_err ? stderr : stdout);
    return true;
}

void launcher_workers_pump(launcher_workers_t *ws, int fd, const rg_agent_params_t *cfg)
{
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].out_fd == fd) {
            pump_fd(&ws->w[i], false, cfg);
        } else if (ws->w[i].err_fd == fd) {
            pump_fd(&ws->w[i], true, cfg);
        }
    }
}

static void worker_close(launcher_worker_t *w, const rg_agent_params_t *cfg)
{
    /* Drain what is left in the pipes so no output is lost. */
    pump_fd(w, false, cfg);
    pump_fd(w, true, cfg);
    if (w->out_fd >= 0) {
        close(w->out_fd);
        w->out_fd = -1;
    }
    if (w->err_fd >= 0) {
        close(w->err_fd);
        w->err_fd = -1;
    }
    if (w->out_log != NULL) {
        fclose(w->out_log);
        w->out_log = NULL;
    }
    if (w->err_log != NULL) {
        fclose(w->err_log);
        w->err_log = NULL;
    }
}

int launcher_workers_reap(launcher_workers_t *ws, int *failed)
{
    int st;
    pid_t pid;

    *failed = -1;
    /* Bounded by the number of our children. */
    for (int k = 0; k <= ws->n + 1 && (pid = waitpid(-1, &st, WNOHANG)) > 0; k++) {
        if (launcher_fork_reaped(&ws->fork, pid, st)) {
            continue;
        }
        for (int i = 0; i < ws->n; i++) {
            launcher_worker_t *w = &ws->w[i];
            if (w->pid == pid && w->running) {
                w->running = false;
                w->wstatus = st;
                ws->running--;
                if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && *failed < 0) {
                    *failed = i;
                }
                /* Kill whatever the worker left in its group. */
                kill(-pid, SIGKILL);
            }
        }
    }
    return ws->running;
}

int launcher_workers_wait(launcher_workers_t *ws, int64_t ms)
{
    rg_deadline_t deadline = rg_deadline_in_ms(ms);
    int failed;
    int running;
    while ((running = launcher_workers_reap(ws, &failed)) > 0 && !rg_deadline_passed(deadline)) {
        rg_sleep_ms(RG_MIN(5, rg_deadline_left_ms(deadline)));
    }
    return running;
}

void launcher_workers_stop(launcher_workers_t *ws, int64_t grace_ms, int sig,
                           const rg_agent_params_t *cfg)
{
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].running) {
            kill(-ws->w[i].pid, sig);
        }
    }
    (void)launcher_workers_wait(ws, grace_ms);
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].running) {
            rg_warn("worker rank %d (pid %d) ignored SIGTERM for %lld ms; killing it",
                    ws->w[i].rank, (int)ws->w[i].pid, (long long)grace_ms);
            kill(-ws->w[i].pid, SIGKILL);
        }
    }
    for (int i = 0; i < ws->n; i++) {
        if (ws->w[i].running) {
            int st;
            if (waitpid(ws->w[i].pid, &st, 0) == ws->w[i].pid) {
                ws->w[i].running = false;
                ws->w[i].wstatus = st;
                ws->running--;
            }
        }
        worker_close(&ws->w[i], cfg);
    }
}

void launcher_workers_drain(launcher_workers_t *ws, int i, const rg_agent_params_t *cfg)
{
    pump_fd(&ws->w[i], false, cfg);
    pump_fd(&ws->w[i], true, cfg);
}

void launcher_workers_failure(launcher_workers_t *ws, int i, rg_rdzv_failure_t *f,
                              char *err_buf, size_t err_len, char *tail_buf, size_t tail_len)
{
    launcher_worker_t *w = &ws->w[i];
    FILE *ef;
    size_t o = 0;

    memset(f, 0, sizeof(*f));
    f->rank = w->rank;
    f->local_rank = w->local_rank;
    f->exit_code = WIFEXITED(w->wstatus) ? WEXITSTATUS(w->wstatus) : -1;
    f->signal = WIFSIGNALED(w->wstatus) ? WTERMSIG(w->wstatus) : 0;
    err_buf[0] = '\0';
    ef = fopen(w->error_file, "r");
    if (ef != NULL) {
        size_t n = fread(err_buf, 1, err_len - 1, ef);
        err_buf[n] = '\0';
        fclose(ef);
    }
    f->error = err_buf[0] ? err_buf : NULL;
    tail_buf[0] = '\0';
    for (int k = 0; k < w->tail_count; k++) {
        int idx = (w->tail_next - w->tail_count + k + (int)RG_ARRAY_SIZE(w->tail)) %
                  (int)RG_ARRAY_SIZE(w->tail);
        int n = snprintf(tail_buf + o, tail_len - o, "%s\n", w->tail[idx]);
        if (n < 0 || (size_t)n >= tail_len - o) {
            break;
        }
        o += (size_t)n;
    }
    f->stderr_tail = tail_buf[0] ? tail_buf : NULL;
}
