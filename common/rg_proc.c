/* Child processes that regroup's tools start and must never outlive them. */
#include "rg_common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

pid_t rg_proc_spawn(char *const argv[], const char *log_path)
{
    pid_t parent = getpid();
    pid_t pid = fork();

    if (pid != 0) {
        return pid;
    }
    /* Dies with its parent, even if the parent is killed or crashes. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(127);
    }
    if (log_path != NULL) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
    }
    execvp(argv[0], argv);
    _exit(127);
}

int rg_proc_wait(pid_t pid, int64_t timeout_ms)
{
    rg_deadline_t deadline = rg_deadline_in_ms(timeout_ms);
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (r < 0 && errno != EINTR) {
            return -1;
        }
        if (rg_deadline_passed(deadline)) {
            return -1;
        }
        rg_sleep_ms(RG_MIN(5, RG_MAX(1, rg_deadline_left_ms(deadline))));
    }
}
