"""The error paths: argument errors, a collective past its deadline, a dead peer, a job
environment missing, a library that cannot be found or whose structs differ."""
import ctypes
import os
import signal
import subprocess

import conftest
from conftest import PYTHON, spawn_ranks, wait_all

WORKER = os.path.join(conftest.HERE, "worker_errors.py")


def test_argument_errors(tmp, etcd):
    [(rc, out)] = wait_all(spawn_ranks(tmp, etcd, 1, [WORKER, "args"]))
    assert rc == 0 and "args ok rank=0" in out, out


def test_timeout_is_etimedout(tmp, etcd):
    flag = os.path.join(tmp, "timed-out")
    res = wait_all(spawn_ranks(tmp, etcd, 2, [WORKER, "timeout", flag]))
    for r, (rc, out) in enumerate(res):
        assert rc == 0 and "timeout ok rank=%d" % r in out, out


def test_dead_peer_is_peer_error(tmp, etcd):
    (rc0, out0), (rc1, out1) = wait_all(spawn_ranks(tmp, etcd, 2, [WORKER, "peer"]))
    assert rc1 == -signal.SIGKILL, (rc1, out1)
    assert rc0 == 0 and "peer ok rank=0" in out0, out0


def python(code, **env):
    e = dict(os.environ)
    e.update(env)
    p = subprocess.run([PYTHON, "-c", code], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    return p.returncode, p.stdout.decode(errors="replace")


def test_init_without_launcher_names_the_variable():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.run([PYTHON, "-c", "import regroup\ntry:\n regroup.init()\n"
                        "except regroup.Error as e:\n print(e.status, e)\n"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode()
    assert p.returncode == 0 and out.startswith("EINVAL") and "WORLD_SIZE" in out, out


def test_library_not_found_names_every_path(tmp):
    missing = os.path.join(tmp, "nowhere", "libregroup.so")
    rc, out = python("import regroup; regroup.library_path()", REGROUP_LIBRARY=missing)
    assert rc != 0 and "ImportError" in out and missing in out, out
    # Without $REGROUP_LIBRARY: next to the package, then the loader's path, each named.
    env = {k: v for k, v in os.environ.items() if k != "REGROUP_LIBRARY"}
    env["LD_LIBRARY_PATH"] = ""
    p = subprocess.run([PYTHON, "-c", "import regroup; regroup.library_path()"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                       cwd=tmp)
    out = p.stdout.decode()
    if p.returncode == 0:
        return   # an installed libregroup on the loader's path: nothing to report
    assert "next to the package" in out and "the system loader path" in out, out
    assert os.path.join(conftest.SRC, "python", "regroup", "libregroup.so.0.1") in out, out


def test_soname_is_the_build_s():
    import regroup
    real = os.path.basename(os.path.realpath(conftest.LIBRARY))
    assert real.startswith(regroup.SONAME), (real, regroup.SONAME)


def test_layout_mismatch_is_found():
    import regroup
    from regroup import _lib
    lib = _lib.load()
    for name, mirror in _lib.STRUCTS.items():
        _lib.check_layout(lib, name, mirror)   # the real mirrors agree

    class Wrong(ctypes.Structure):   # rg_data_cursor_t with a 32-bit step
        _fields_ = [("seed", ctypes.c_uint64), ("epoch", ctypes.c_uint64),
                    ("step", ctypes.c_uint32)]

    class Reordered(ctypes.Structure):   # rg_metric_t's fields swapped
        _fields_ = [("value", ctypes.c_double), ("name", ctypes.c_char_p),
                    ("pad", ctypes.c_int)]

    for cname, bad in (("rg_data_cursor_t", Wrong), ("rg_metric_t", Reordered)):
        try:
            _lib.check_layout(lib, cname, bad)
        except regroup.LayoutError as e:
            assert cname in str(e)
        else:
            raise AssertionError("a wrong %s mirror passed" % cname)
    try:
        _lib.check_layout(lib, "rg_no_such_t", Wrong)
    except regroup.LayoutError as e:
        assert "ENOENT" in str(e)
    else:
        raise AssertionError("an unknown struct passed")
