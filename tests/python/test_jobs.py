"""The package in real jobs under the `regroup` launcher (--standalone: its own private
etcd): every collective, op and dtype against NumPy at several world sizes, checkpoints
saved at 4 ranks and restored at 1, 2 and 3, and in-place recovery (ctx.regroup)."""
import os
import re
import signal
import subprocess
import time

import pytest

import conftest
from conftest import PYTHON, run_job, worker_env

OPS = os.path.join(conftest.HERE, "worker_ops.py")
CKPT = os.path.join(conftest.HERE, "worker_ckpt.py")
EXACT = os.path.join(conftest.HERE, "worker_exact.py")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_op_and_dtype(tmp, world):
    rc, out = run_job(tmp, world, [PYTHON, OPS])
    assert rc == 0, out
    for r in range(world):
        assert "ops ok rank=%d" % r in out, out


@pytest.mark.training
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


EXAMPLE = os.path.join(conftest.SRC, "examples", "python", "fmnist_torch.py")
FMNIST = "/usr/share/datasets/fashion-mnist"


def final_accuracy(out):
    lines = [ln for ln in out.splitlines() if ln.startswith("test_accuracy=")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.training
@pytest.mark.skipif(not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")),
                    reason="no Fashion-MNIST in " + FMNIST + " (dataset-fashion-mnist)")
def test_example_survives_a_worker_kill(tmp):
    pytest.importorskip("torch")
    args = [PYTHON, EXAMPLE, "--epochs", "1", "--train-samples", "16000", "--ckpt-every", "40",
            "--log-every", "500"]
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "plain"))
    rc, plain = run_job(tmp, 4, args, timeout=400, env=env)
    assert rc == 0, plain
    # The killed run's workers (the first ones and the restarted ones) are forked from the
    # launcher's fork server (--preload), the plain run's exec'd: the same result.
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "killed"))
    rc, killed = run_job(tmp, 4, args + ["--kill-at", "150", "--kill-rank", "2"], timeout=400,
                         max_restarts=2, env=env, preload="torch,numpy")
    assert rc == 0, killed
    assert "rank 2: killing myself at step 150" in killed, killed
    # From the newest checkpoint committed by then (written in the background: 120 or before).
    m = re.search(r"resumed from checkpoint step (\d+) \(epoch 0\) at world size 4, restart 1",
                  killed)
    assert m and int(m.group(1)) in (40, 80, 120), killed
    # The same run from the same checkpointed state and data position: the same model.
    sha = [re.findall(r"params_sha256=\w+", o) for o in (plain, killed)]
    assert len(sha[0]) == 1 and sha[0] == sha[1], (plain, killed)
    assert final_accuracy(killed) == final_accuracy(plain), (plain, killed)
    assert float(final_accuracy(plain).split("=")[1]) > 0.7, plain


@pytest.mark.training
@pytest.mark.skipif(not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")),
                    reason="no Fashion-MNIST in " + FMNIST + " (dataset-fashion-mnist)")
def test_example_in_place_survives_a_worker_kill(tmp):
    """The example under --recovery=in-place on 3 ranks, rank 2 SIGKILLed at step 150: the
    survivors regroup in their own processes (parameters and Adam's state from memory, at
    world 2 from step 150: no rank finished it), the replacement joins with the state of
    rank 0, and the job ends without a restart. The steps at world 2 sum the
    gradient over 2 shares instead of 3, so the floating-point result is not the fault-free
    run's bit for bit (unlike restart mode at an unchanged world size): only the model's
    quality is asserted."""
    pytest.importorskip("torch")
    args = [PYTHON, EXAMPLE, "--epochs", "1", "--ckpt-every", "100", "--log-every", "500",
            "--kill-at", "150", "--kill-rank", "2"]
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "ckpt"))
    rc, out = run_job(tmp, 3, args, timeout=400, max_restarts=2, env=env, recovery="in-place",
                      preload="torch")
    assert rc == 0, out
    assert "rank 2: killing myself at step 150" in out, out
    assert "regrouped: a peer failed; round 1 world 2 from step 150, state from rank 0" in out, out
    assert re.search(r"regrouped: the membership changes; round 2 world 3 from step \d+, "
                     r"state from rank 0", out), out
    assert "resumed from" not in out, out
    assert "restarting the job" not in out, out
    assert float(final_accuracy(out).split("=")[1]) > 0.8, out


EXACT = os.path.join(conftest.HERE, "worker_exact.py")


def test_sampler_exactly_once_across_resize_and_kill(tmp):
    """3 ranks for 40 steps, then 2 ranks resuming from that checkpoint, rank 1 killed at
    step 62 and the job restarted from step 60: every sample used once in each epoch."""
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "ckpt"))
    rc, out = run_job(tmp, 3, [PYTHON, EXACT, "--stop-at", "40"], env=env)
    assert rc == 0 and "stopped at step 40" in out, out
    rc, out = run_job(tmp, 2, [PYTHON, EXACT, "--kill-at", "62"], max_restarts=1, env=env)
    assert rc == 0, out
    assert "resumed from step 40 at world 2: cursor (11, 1, 15)" in out, out
    assert "rank 1: killing myself at step 62" in out, out
    # The newest checkpoint committed before the kill: 60, or 55 if 60's was still being
    # written.
    assert re.search(r"resumed from step (60|55) at world 2", out), out
    assert "exact=1 world=2" in out, out


INPLACE = os.path.join(conftest.HERE, "worker_inplace.py")


def test_in_place_regroup_after_a_kill_exactly_once(tmp):
    """3 ranks in place, rank 1 SIGKILLed before step 30's allreduce: the survivors regroup
    in their own processes at world 2 from step 30 (no rank finished it), the replacement
    joins at a later step boundary receiving the state from a survivor, and every sample is
    used once per epoch; the job never restarts."""
    # 1000 steps: the replacement joins long before the end (survivors that finish first
    # leave it nobody to join, and the job restarts). With a checkpoint directory: a
    # background checkpoint of the old round is refused at its commit once the round moved
    # on, and that must be a regroup, not the end of the worker; the state comes from memory.
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "ckpt"))
    rc, out = run_job(tmp, 3, [PYTHON, INPLACE, "--kill-at", "30", "--epochs", "40"],
                      max_restarts=2, env=env, recovery="in-place")
    assert rc == 0, out
    assert "rank 1: killing myself at step 30" in out, out
    assert out.count("killing myself") == 1, out
    assert "regrouped: a peer failed; round 1 world 2 from step 30, state from rank 0" in out, out
    assert re.search(r"rank \d: pid \d+ started \(joining 1, in place 1\)", out), out
    m = re.search(r"regrouped: the membership changes; round 2 world 3 from step (\d+), "
                  r"state from rank 0", out)
    assert m and int(m.group(1)) > 30, out
    assert "resumed from" not in out, out
    assert "the job restarts" not in out, out
    assert "exact=1 world=3" in out, out


def test_in_place_table_after_a_kill(tmp):
    """The same job with a sharded table (ctx.table) of 1000 int64 rows, updated and
    committed at every step: the dead rank's rows come back from its node copy and its
    buddy's copy, every row holds the sum of its updates over every step once, and the
    samples are used once per epoch; the job never restarts."""
    env = worker_env(tmp, REGROUP_CKPT_DIR=os.path.join(tmp, "ckpt"))
    rc, out = run_job(tmp, 3, [PYTHON, INPLACE, "--kill-at", "30", "--epochs", "40",
                               "--table-rows", "1000"],
                      max_restarts=2, env=env, recovery="in-place")
    assert rc == 0, out
    assert "rank 1: killing myself at step 30" in out, out
    assert "regrouped: a peer failed; round 1 world 2 from step 30, state from rank 0" in out, out
    assert re.search(r"regrouped: the membership changes; round 2 world 3 from step \d+", out), out
    assert "resumed from" not in out, out
    assert "exact=1 world=3" in out, out
    assert "table=1" in out, out


def committed_steps(ckpt):
    """The steps with a committed checkpoint (a MANIFEST) in the directory ckpt."""
    names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
    return [int(n[5:]) for n in names if n.startswith("step-") and
            os.path.exists(os.path.join(ckpt, n, "MANIFEST"))]


@pytest.mark.training
def test_sigterm_takes_a_last_checkpoint_and_the_job_resumes_from_it(tmp):
    """SIGTERM to the launcher of a restart-mode job (a scheduler's stop; a cloud's soft-off):
    every rank learns it from report at the same step (MembershipChanged, notice.preempt),
    takes the last checkpoint of that step with ctx.leave and exits 0. The job started again
    on the same checkpoint directory resumes from exactly that step (no step lost) and every
    sample is used once per epoch."""
    ckpt = os.path.join(tmp, "ckpt")
    env = worker_env(tmp, REGROUP_CKPT_DIR=ckpt)
    args = [PYTHON, EXACT, "--epochs", "100"]   # 2500 steps, a checkpoint every 5
    log_path = os.path.join(tmp, "first.log")
    with open(log_path, "wb") as log:
        p = subprocess.Popen([os.path.join(conftest.BUILD, "regroup"), "--standalone",
                              "--nproc-per-node=2"] + args, env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not committed_steps(ckpt) and p.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            assert committed_steps(ckpt), "no checkpoint committed in 120 s"
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    with open(log_path, errors="replace") as f:
        out = f.read()
    assert rc in (128 + signal.SIGTERM, -signal.SIGTERM), out
    m = re.search(r"left at step (\d+): checkpoint committed \((\d+) ms were left\)", out)
    assert m, out
    left = int(m.group(1))
    assert 0 < left < 2500, out
    assert max(committed_steps(ckpt)) == left, (sorted(committed_steps(ckpt)), out)
    rc, out = run_job(tmp, 2, args, env=env)
    assert rc == 0, out
    assert re.search(r"resumed from step %d at world 2" % left, out), out
    assert "exact=1 world=2" in out, out
