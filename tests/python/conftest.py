"""Shared helpers of the Python package's tests: the build to test, a job under the real
`regroup` launcher, and an etcd of the test's own on a loopback port.

The build is $REGROUP_BUILD (ctest sets it), else build/ of the source tree; the library is
$REGROUP_LIBRARY, else that build's libregroup.so. Every wait has a deadline."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("REGROUP_BUILD", os.path.join(SRC, "build")))
LIBRARY = os.environ.get("REGROUP_LIBRARY", os.path.join(BUILD, "libregroup.so"))
PYTHON = sys.executable
os.environ["REGROUP_LIBRARY"] = LIBRARY
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(SRC, "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])
sys.path.insert(0, os.path.join(SRC, "python"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "training: runs a training program (TorchTrainer's or an example) under "
        "the launcher: torch in every worker, on 2 cores; the sanitized build's ctest leaves "
        "these out (-m 'not training'), the Release build's runs them")


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


def worker_env(tmp, **extra):
    env = dict(os.environ)
    env.update(UCX_NET_DEVICES="lo", TMPDIR=tmp, OMP_NUM_THREADS="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_job(tmp, nproc, argv, timeout=240, max_restarts=0, env=None, recovery=None,
            preload=None):
    """Runs argv on nproc local workers under `regroup --standalone` (with
    --recovery=RECOVERY, --preload=PRELOAD when given); (exit code, output)."""
    cmd = [os.path.join(BUILD, "regroup"), "--standalone", "--nproc-per-node=%d" % nproc,
           "--max-restarts=%d" % max_restarts]
    if recovery is not None:
        cmd.append("--recovery=%s" % recovery)
    if preload is not None:
        cmd.append("--preload=%s" % preload)
    cmd += list(argv)
    p = subprocess.run(cmd, env=env if env is not None else worker_env(tmp),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    return p.returncode, out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """An etcd of the test's own, on two free loopback ports, removed with its data."""

    def __init__(self, tmp):
        self.dir = tempfile.mkdtemp(prefix="etcd.", dir=tmp)
        self.proc = None
        for _ in range(5):
            cp, pp = free_port(), free_port()
            self.endpoint = "http://127.0.0.1:%d" % cp
            peer = "http://127.0.0.1:%d" % pp
            self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
            self.proc = subprocess.Popen(
                ["etcd", "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
                 "--listen-client-urls", self.endpoint, "--advertise-client-urls",
                 self.endpoint, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
                 peer, "--initial-cluster", "t=" + peer], stdout=self.log,
                stderr=subprocess.STDOUT)
            if self._wait_healthy(20):
                return
            self.stop()
        raise RuntimeError("cannot start a test etcd (see %s)" % self.dir)

    def _wait_healthy(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as r:
                    if b"true" in r.read():
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def etcd(tmp):
    e = Etcd(tmp)
    yield e
    e.stop()
    shutil.rmtree(e.dir, ignore_errors=True)


def spawn_ranks(tmp, etcd, world, argv, job="t", **extra):
    """Starts `world` workers of argv with the launcher's worker environment on etcd."""
    procs = []
    for r in range(world):
        env = worker_env(tmp, RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, LOCAL_WORLD_SIZE=world,
                         TORCHELASTIC_RESTART_COUNT=0, REGROUP_ETCD_ENDPOINTS=etcd.endpoint,
                         REGROUP_JOB_ID=job, REGROUP_ROUND=0, **extra)
        procs.append(subprocess.Popen([PYTHON] + list(argv), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    return procs


def wait_all(procs, timeout=120):
    """(exit code, output) of each process; kills the ones past the deadline. Each process
    is reaped as soon as it ends (a dead rank left a zombie would still look alive to its
    peers' shared-memory failure detection, which checks that the process exists)."""
    deadline = time.monotonic() + timeout
    out = [None] * len(procs)

    def reap(i, p):
        try:
            o, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate(timeout=10)
        out[i] = (p.returncode, o.decode(errors="replace"))

    threads = [threading.Thread(target=reap, args=(i, p)) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return out
