"""The package in real jobs under the `regroup` launcher (--standalone: its own private
etcd): every collective, op and dtype against NumPy at several world sizes, and checkpoints
saved at 4 ranks and restored at 1, 2 and 3."""
import os

import pytest

import conftest
from conftest import PYTHON, run_job, worker_env

OPS = os.path.join(conftest.HERE, "worker_ops.py")
CKPT = os.path.join(conftest.HERE, "worker_ckpt.py")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_op_and_dtype(tmp, world):
    rc, out = run_job(tmp, world, [PYTHON, OPS])
    assert rc == 0, out
    for r in range(world):
        assert "ops ok rank=%d" % r in out, out


def test_checkpoint_saved_at_4_restored_at_1_2_3(tmp):
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "ckpt"))
    rc, out = run_job(tmp, 4, [PYTHON, CKPT, "save"], env=env)
    assert rc == 0, out
    assert all("saved rank=%d" % r in out for r in range(4)), out
    assert sorted(os.listdir(os.path.join(tmp, "ckpt"))) == ["step-10", "step-20"]
    for world in (1, 2, 3):
        rc, out = run_job(tmp, world, [PYTHON, CKPT, "restore"], env=env)
        assert rc == 0, out
        for r in range(world):
            assert "restored rank=%d world=%d step=20" % (r, world) in out, out
