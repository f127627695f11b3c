# The fork server of `regroup --preload=MODULES` (launcher_fork.c). The agent runs it as
#   PYTHON [FLAGS] -c THIS-SOURCE SOCK-FD AGENT-PID MODULES
# with the workers' common environment. It imports MODULES once and then forks every worker
# the agent starts, so that no worker (the first, a restarted one, a replacement in place)
# imports them again. Each request on SOCK-FD (a SOCK_SEQPACKET socket, the agent's
# descriptors attached) is fields separated by NUL bytes:
#   spawn MODE TARGET NARGS ARG... NENV ENV... NCPUS CPU... NMASK SIGNAL... NFDS FD...
# MODE is "script" or "module"; the descriptors are the worker's stdout, its stderr, the
# start pipe and then those it keeps, one for each FD (the number it has in the worker). The
# server answers "pid N" or "error TEXT" for each, "ready N" (its thread count) or "error
# TEXT" once the modules are imported.
#
# A worker is the child of a child, which exits at once: the agent (a child subreaper)
# becomes its parent, reaps it and signals its process group as it does a worker it execs.
# On the start pipe the worker writes an errno (negative: the CPU binding failed) or closes
# it once it runs the program, as exec's close-on-exec would.
import errno
import fcntl
import os
import signal
import socket
import struct
import sys
import time

PR_SET_PDEATHSIG = 1
MSG_MAX = 128 * 1024
FDS_MAX = 64
REPARENT_S = 10.0


def _say(sock, text):
    sock.send(text.encode(errors="replace")[:4096])


def _parse(msg):
    f = msg.split(b"\0")
    if f[0] != b"spawn":
        raise ValueError("not a spawn request")
    k = 1

    def take():
        nonlocal k
        k += 1
        return f[k - 1]

    def take_list():
        n = int(take())
        if n < 0 or n > len(f):
            raise ValueError("a bad count")
        return [take() for _ in range(n)]

    mode, target = take().decode(), os.fsdecode(take())
    args = [os.fsdecode(a) for a in take_list()]
    env = take_list()
    cpus = [int(c) for c in take_list()]
    mask = [int(s) for s in take_list()]
    targets = [int(t) for t in take_list()]
    return mode, target, args, env, cpus, mask, targets


def _place_fds(received, targets):
    """Puts received[3 + i] at targets[i], stdout and stderr at 1 and 2; returns the start
    pipe's descriptor (close-on-exec, out of the way)."""
    high = max([10, 3] + targets) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for fd in received]
    for fd in received:
        os.close(fd)
    os.dup2(moved[0], 1)
    os.dup2(moved[1], 2)
    for fd, t in zip(moved[3:], targets):
        os.dup2(fd, t, inheritable=True)
    for fd in moved[:2] + moved[3:]:
        os.close(fd)
    return moved[2]


def _start_failed(start_fd, err):
    try:
        os.write(start_fd, struct.pack("i", err))
    finally:
        os._exit(127)


def _worker(req, received, agent, sock):
    """In the worker, before the program: what the agent's exec path does in the child. A
    system call failing there is said on the start pipe, as a failed exec would be."""
    start = [received[2]]
    try:
        return _setup(req, received, agent, sock, start)
    except OSError as e:
        _start_failed(start[0], e.errno or errno.EIO)


def _setup(req, received, agent, sock, start):
    mode, target, args, env, cpus, mask, targets = req
    os.setpgid(0, 0)
    sock.close()
    start_fd = start[0] = _place_fds(received, targets)
    deadline = time.monotonic() + REPARENT_S
    while os.getppid() != agent:   # until the middle child's exit gives us to the agent
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0002)
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != agent:
        os._exit(127)   # the agent died before that
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            _start_failed(start_fd, -e.errno)
    os.environb.clear()
    for entry in env:
        name, eq, value = entry.partition(b"=")
        if eq and name:
            os.environb[name] = value
    if mode == "script":
        try:
            with open(target, "rb"):
                pass
        except OSError as e:
            _start_failed(start_fd, e.errno)
    else:
        import importlib.util
        sys.path[0] = os.getcwd()
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            _start_failed(start_fd, 2)   # ENOENT: what python3 -m says for no such module
    os.close(start_fd)
    return mode, target, args


def _serve(sock, agent):
    """Forks a worker for each request; returns the request in the worker, None when the
    agent closed its end."""
    while True:
        try:
            msg, received, _, _ = socket.recv_fds(sock, MSG_MAX, FDS_MAX)
        except InterruptedError:
            continue
        if not msg:
            return None
        try:
            req = _parse(msg)
            if len(received) != 3 + len(req[6]):
                raise ValueError("%d descriptors for %d" % (len(received), 3 + len(req[6])))
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            for fd in received:
                os.close(fd)
            _say(sock, "error bad request: %s" % e)
            continue
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        middle = os.fork()
        if middle == 0:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                return _worker(req, received, agent, sock)
            os.write(w, b"%d" % pid)
            os._exit(0)
        os.close(w)
        for fd in received:
            os.close(fd)
        pid = os.read(r, 32)
        os.close(r)
        os.waitpid(middle, 0)
        if pid:
            _say(sock, "pid " + pid.decode())
        else:
            _say(sock, "error cannot fork")


def _run(mode, target, args):
    import runpy
    if mode == "script":
        sys.argv = [target] + args
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        runpy.run_path(target, run_name="__main__")
    else:
        sys.argv = [target] + args
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def _main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    agent = int(sys.argv[2])
    import importlib
    for name in [m for m in sys.argv[3].split(",") if m]:
        try:
            importlib.import_module(name)
        except BaseException as e:   # SystemExit, KeyboardInterrupt too: said, not raised
            _say(sock, "error cannot import %s: %s: %s" % (name, type(e).__name__, e))
            return 1
    # What the imports made stays out of the collector's reach: a collection in a worker
    # writes to every object it tracks, copying the server's pages into that worker.
    import gc
    gc.collect()
    gc.freeze()
    _say(sock, "ready %d" % len(os.listdir("/proc/self/task")))
    req = _serve(sock, agent)
    if req is None:
        return 0
    try:
        _run(*req)
    except SystemExit:
        raise
    except BaseException as e:   # as the interpreter would say it, less our frames
        import runpy
        tb = e.__traceback__
        ours = ("<string>", runpy.__file__, "<frozen runpy>")
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        if isinstance(e, KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return 1
    return 0


sys.exit(_main())
