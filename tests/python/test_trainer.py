"""regroup.train (TorchTrainer, DDP over the regroup backend, recovery in place below the
user's loop) in real jobs: real torch, real worker processes under the launcher with its
private etcd, real UCX. worker_ddp.py's model counts how often each sample went into a kept
step: every count must equal the epochs (each sample once per epoch, whatever failed)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import conftest
from conftest import PYTHON, worker_env

torch = pytest.importorskip("torch")
DDP = os.path.join(conftest.HERE, "worker_ddp.py")
EXAMPLE = os.path.join(conftest.SRC, "examples", "python", "ddp_trainer.py")
FMNIST = "/usr/share/datasets/fashion-mnist"


def fit(tmp, name, *args, timeout=240, script=DDP, **env):
    """Runs a TorchTrainer program as a user does (python3 script.py), with env added to
    the environment: (exit code, output)."""
    cmd = [PYTHON, script, "--storage", tmp, "--name", name] + [str(a) for a in args]
    p = subprocess.run(cmd, env=worker_env(tmp, **env), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    sys.stdout.write(out)   # whole in pytest's report of a failure (an assertion cuts it)
    return p.returncode, out


def pids(out, pattern):
    """{rank: pid} of the first line of each rank matching pattern."""
    out_ = {}
    for m in re.finditer(pattern, out):
        out_.setdefault(int(m.group(2)), int(m.group(1)))
    return out_


def assert_gone(out):
    """Every worker the job started has exited (the launcher reaped them)."""
    for pid in {int(p) for p in re.findall(r"worker pid=(\d+)", out)}:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # reaped processes can be reused only by new ones: check it is not a worker of ours
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            assert b"worker_ddp" not in f.read(), "worker %d is still running" % pid


@pytest.mark.training
def test_fault_free(tmp):
    rc, out = fit(tmp, "plain", "--workers", 2, "--epochs", 2)
    assert rc == 0, out
    assert "counts_ok=True" in out, out
    assert "checkpoint_step=32" in out, out       # 512 samples / 32 a step x 2 epochs
    assert "regrouped" not in out, out
    # fit()'s fork server loaded regroup for the workers (none loads it at its start)
    assert re.findall(r"worker pid=\d+ rank=\d+ preloaded=(\w+)", out) == ["True"] * 2, out


@pytest.mark.training
def test_in_place_kill_keeps_survivors(tmp):
    """4 workers, rank 2 SIGKILLed mid-epoch (step 20: epoch 1's 4th): the survivors keep
    their processes (pids unchanged), regroup at world 3 from memory (no checkpoint read),
    the replacement joins with the survivors' state (at the last epoch's first step at the
    latest: the survivors wait there for it); every sample of every epoch once."""
    rc, out = fit(tmp, "kill", "--workers", 4, "--epochs", 3, "--kill-at", 20,
                  "--kill-rank", 2, "--max-failures", 2, "--wait-for-replacement")
    assert rc == 0, out
    assert "rank 2: killing myself at step 20" in out, out
    assert "counts_ok=True" in out, out
    assert re.search(r"regrouped at step 20: world size 3, round 1 \(PeerError\)", out), out
    assert re.search(r"regrouped at step \d+: world size 4, round 2 \(MembershipChanged\)",
                     out), out
    started = pids(out, r"worker pid=(\d+) rank=(\d+)")
    done = pids(out, r"worker done pid=(\d+) rank=(\d+) world=4")
    for r in (0, 1, 3):   # the same process from start to end
        assert r in done and done[r] == started[r], (r, out)
    assert done[2] != started[2], out              # the replacement
    # get_step: the job's steps, the same on every rank (16 an epoch), the discarded step
    # at the kill not counted, the replacement's from the state it received
    assert sorted(re.findall(r"worker done pid=\d+ rank=\d+ world=4 step=(\d+)", out)) == \
        ["48"] * 4, out
    # Only the replacement resumed, from what the survivors hold, not from a file.
    resumed = re.findall(r"worker rank=(\d+) resumed from epoch \d+ \(path=(\S+)\)", out)
    assert resumed == [("2", "None")], out
    assert "restart" not in out.replace("max_restarts", ""), out
    assert_gone(out)


@pytest.mark.training
def test_in_place_stalled_worker(tmp):
    """Rank 1 stops (SIGSTOP) for 4 s at step 20, past its peers' group timeout (2 s here;
    the hang check off): no member is lost and no worker exits, so the workers whose group
    timed out ask their agent for the next round, and the job regroups in place at the same
    size, every worker in its own process; every sample of every epoch once. Without the ask,
    they waited three lease TTLs for a round nobody opened and the job restarted."""
    rc, out = fit(tmp, "stall", "--workers", 4, "--epochs", 3, "--stall-at", 20,
                  "--stall-s", 4, REGROUP_COMM_TIMEOUT_MS=2000,
                  REGROUP_RDZV_CONF="hang_timeout=0,lease_ttl=2")
    assert rc == 0, out
    assert "rank 1: continued" in out, out
    assert "counts_ok=True" in out, out
    # (the group's timeout: a regroup_failure that is no PeerError)
    assert re.search(r"regrouped at step \d+: world size 4, round 1 \(Error\)", out), out
    started = pids(out, r"worker pid=(\d+) rank=(\d+)")
    done = pids(out, r"worker done pid=(\d+) rank=(\d+) world=4")
    assert done == started and len(done) == 4, out
    assert "restart" not in out.replace("max_restarts", ""), out
    assert_gone(out)


@pytest.mark.training
@pytest.mark.parametrize("what", ["prepare_model", "get_checkpoint", "report"])
def test_in_place_kill_outside_a_step(tmp, what):
    """Rank 1 SIGKILLed before prepare_model, get_checkpoint or the first epoch's report,
    while the others are in its collectives (rank 0's broadcast of the parameters; agreeing
    on the checkpoint; the checkpoint's tensors from rank 0): they regroup there at world 3
    (and do it again before training), keeping their processes, and the replacement joins
    later; every sample of every epoch once. Before, the error reached the training
    function: every worker failed and the job restarted."""
    rc, out = fit(tmp, "start-" + what, "--workers", 4, "--epochs", 2, "--kill-before", what,
                  "--kill-rank", 1, "--max-failures", 2, "--wait-for-replacement")
    assert rc == 0, out
    assert "rank 1: killing myself before %s" % what in out, out
    assert "counts_ok=True" in out, out
    assert re.search(r"regrouped at step \d+: world size 3, round 1 \(PeerError\)", out), out
    started = pids(out, r"worker pid=(\d+) rank=(\d+)")
    done = pids(out, r"worker done pid=(\d+) rank=(\d+) world=4")
    for r in (0, 2, 3):
        assert r in done and done[r] == started[r], (r, out)
    assert done[1] != started[1], out
    assert "restart" not in out.replace("max_restarts", ""), out
    assert_gone(out)


@pytest.mark.training
def test_in_place_kill_in_the_last_report(tmp):
    """Rank 1 SIGKILLed before the last epoch's report, while the others are in its
    collectives (the checkpoint's tensors from rank 0): they regroup there and the training
    function returns. That report's checkpoint was never saved (every rank's report broke
    off), and the job ended without it: the result's checkpoint was the epoch before's. The
    workers now save it again in the new group before they end."""
    rc, out = fit(tmp, "lastreport", "--workers", 4, "--epochs", 2, "--kill-before",
                  "last-report", "--kill-rank", 1, "--max-failures", 2)
    assert rc == 0, out
    assert "rank 1: killing myself before last-report" in out, out
    assert re.search(r"regrouped at step (\d+): world size 3, round \d+ \(PeerError\)", out), out
    m = re.search(r"worker done pid=\d+ rank=0 world=\d+ step=(\d+)", out)
    assert m, out
    assert "checkpoint_step=%s " % m.group(1) in out, out   # the last report's
    assert "counts_ok=True" in out, out
    assert "restart" not in out.replace("max_restarts", ""), out
    assert_gone(out)


@pytest.mark.training
def test_last_checkpoint_after_a_change_waited(tmp):
    """The job's last report (with its checkpoint) comes while a replacement waits to join:
    the job has moved to a newer round, so that checkpoint is refused in the old one. The
    workers regroup once more after the training function returned, the replacement takes
    part in saving it again and exits 0: the result's checkpoint is the last report's."""
    rc, out = fit(tmp, "endchange", "--workers", 4, "--epochs", 2, "--kill-at", 20,
                  "--kill-rank", 2, "--max-failures", 2, "--end-with-change")
    assert rc == 0, out
    assert "rank 2: killing myself at step 20" in out, out
    m = re.search(r"last report at step (\d+)", out)
    assert m, out
    assert "checkpoint_step=%s " % m.group(1) in out, out
    assert "counts_ok=True" in out, out
    assert re.search(r"regrouped at step %s: world size 4, round 2 \(MembershipChanged\)" %
                     m.group(1), out), out
    done = pids(out, r"worker done pid=(\d+) rank=(\d+) world=3")
    assert sorted(done) == [0, 1, 2], out   # the survivors' loops ended at world 3
    assert out.count("worker done") == 3, out   # the replacement ran no loop
    assert_gone(out)


@pytest.mark.training
def test_last_checkpoint_committed_after_a_change(tmp):
    """A replacement joins after the job's last report, before its checkpoint commits (the
    commit slowed down by 3 s): the job moved to a newer round, whose fence refuses that
    commit. The workers wait for it before they end, see the change, regroup once more and
    save the checkpoint again: the result's checkpoint is the last report's. Before, the
    job ended without it (the result's was the epoch before's)."""
    last = 32   # 2 epochs of 512 samples, 32 a step
    rc, out = fit(tmp, "aftercommit", "--workers", 4, "--epochs", 2, "--kill-at", 20,
                  "--kill-rank", 2, "--max-failures", 2, "--change-after-last-report",
                  REGROUP_CKPT_SLOW_COMMIT="%d:3000" % last)
    assert rc == 0, out
    assert "rank 2: killing myself at step 20" in out, out
    assert "last report at step %d" % last in out, out
    assert "checkpoint step %d: the commit waits 3000 ms first" % last in out, out
    assert "checkpoint_step=%d " % last in out, out
    assert "counts_ok=True" in out, out
    assert re.search(r"regrouped at step %d: world size 4, round 2 \(MembershipChanged\)" %
                     last, out), out
    assert out.count("worker done") == 3, out   # the replacement ran no loop
    assert_gone(out)


@pytest.mark.training
def test_restart_mode_same_script(tmp):
    """The same script with FailureConfig(recovery="restart"): every worker restarts from
    the last committed checkpoint (on disk) and the counts are still exact."""
    rc, out = fit(tmp, "restart", "--workers", 2, "--epochs", 4, "--kill-at", 40,
                  "--kill-rank", 1, "--recovery", "restart", "--max-failures", 1)
    assert rc == 0, out
    assert "counts_ok=True" in out, out
    resumed = re.findall(r"worker rank=(\d+) resumed from epoch (\d+) \(path=(\S+)\)", out)
    assert sorted(r for r, _, _ in resumed) == ["0", "1"], out
    assert all(p.endswith("step-%d" % (16 * (int(e) + 1))) for _, e, p in resumed), out


@pytest.mark.training
def test_train_func_raising(tmp):
    """A training function that raises on rank 1: fit() raises TrainingFailedError naming
    rank 1 and its node, with the worker's traceback; every worker stops."""
    rc, out = fit(tmp, "raise", "--workers", 3, "--epochs", 3, "--raise-at", 5,
                  "--raise-rank", 1)
    assert rc == 3, out
    assert "failed rank=1 node=" in out, out
    assert "traceback_has_boom=True" in out, out
    assert_gone(out)


def run_snippet(tmp, code):
    p = subprocess.run([PYTHON, "-c", code], env=worker_env(tmp), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    return p.returncode, p.stdout.decode(errors="replace")


@pytest.mark.training
def test_bad_input_said_at_once(tmp):
    rc, out = run_snippet(tmp, "from regroup import train\ntrain.ScalingConfig(num_workers=0)")
    assert rc != 0 and "ValueError" in out and "at least one worker" in out, out
    rc, out = run_snippet(tmp, "from regroup import train\ntrain.FailureConfig(recovery='x')")
    assert rc != 0 and "recovery='x'" in out, out
    rc, out = run_snippet(tmp, "from regroup import train\n"
                               "train.ScalingConfig(num_workers=1, use_gpu=True)\n"
                               "train.TorchTrainer(print, scaling_config=train.ScalingConfig("
                               "use_gpu=True)).fit()")
    assert rc != 0 and "use_gpu=True" in out and "no CUDA" in out, out
    # A config that cannot be pickled is refused in the driver, before any worker starts.
    rc, out = fit(tmp, "badcfg", "--workers", 2, "--bad-config")
    assert rc != 0 and "train_loop_config cannot be pickled" in out, out
    assert "worker pid=" not in out, out


@pytest.mark.training
def test_model_on_a_device_the_build_cannot_serve(tmp):
    script = os.path.join(tmp, "meta.py")
    with open(script, "w") as f:
        f.write("import torch\nfrom regroup import train\n"
                "from regroup.train.torch import prepare_model\n"
                "def f():\n    prepare_model(torch.nn.Linear(2, 2, device='meta'))\n"
                "try:\n    train.TorchTrainer(f, scaling_config=train.ScalingConfig(2),"
                " run_config=train.RunConfig(storage_path=%r)).fit()\n"
                "except train.TrainingFailedError as e:\n    print('failed:', e)\n" % tmp)
    p = subprocess.run([PYTHON, script], env=worker_env(tmp), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode(errors="replace")
    assert "failed: regroup.train: the training function failed on rank" in out, out
    assert "is on meta: this build serves CPU tensors only" in out, out


@pytest.mark.training
@pytest.mark.skipif(not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")),
                    reason="no Fashion-MNIST in " + FMNIST + " (dataset-fashion-mnist)")
def test_example_accuracy_after_a_kill(tmp):
    """examples/python/ddp_trainer.py, 4 workers, one epoch: a worker SIGKILLed mid-epoch
    costs no accuracy (within 0.01 of the fault-free run)."""
    args = ["--workers", 4, "--epochs", 1, "--train-samples", 20000]
    rc, plain = fit(tmp, "fm0", *args, script=EXAMPLE)
    assert rc == 0, plain
    # (with a data cache: the first workers write it, the replacement maps it)
    rc, killed = fit(tmp, "fm1", *(args + ["--kill-at", 100, "--kill-rank", 2,
                                           "--data-cache", os.path.join(tmp, "cache")]),
                     script=EXAMPLE)
    assert rc == 0, killed
    assert "regrouped at step 100: world size 3" in killed, killed
    acc = [float(re.search(r"test_accuracy=([0-9.]+)", o).group(1)) for o in (plain, killed)]
    assert acc[0] > 0.7, plain
    assert abs(acc[0] - acc[1]) <= 0.01, (plain, killed)


def test_preload_without_the_backend(tmp):
    """fit()'s fork server imports regroup._preload; in a build without the torch backend's
    extension it still imports (a worker that needs the backend says so itself, as it would
    unpreloaded), rather than failing every job of that build at its start."""
    lib = os.path.join(tmp, "lib")
    os.makedirs(lib)
    import regroup
    src = regroup.library_path()
    dst = os.path.join(lib, os.path.basename(src))
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())
    env = dict(worker_env(tmp), REGROUP_LIBRARY=dst)
    env.pop("REGROUP_C10D", None)
    code = ("import sys, torch, regroup._preload\n"
            "from regroup import _c10d\n"
            "assert 'regroup.train.torch' in sys.modules and _c10d._ext is None\n"
            "try:\n    _c10d.extension()\nexcept ImportError as e:\n"
            "    print('said:', 'is not found' in str(e))\n")
    p = subprocess.run([PYTHON, "-c", code], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120, cwd=tmp)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0 and "said: True" in out, out


def test_example_data_cache(tmp):
    """The example's --data-cache: the first load decompresses the data set and keeps the
    copies; a later one maps them copy-on-write. The same tensors as the .gz's either way,
    and writing to a mapped one leaves the copy as it was."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import fmnist_torch
    finally:
        sys.path.pop(0)
    cache = os.path.join(tmp, "cache")
    ref = fmnist_torch.load_split(FMNIST, "t10k")
    first = fmnist_torch.load_split(FMNIST, "t10k", cache)
    assert sorted(os.listdir(cache)) == ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    mapped = fmnist_torch.load_split(FMNIST, "t10k", cache)
    for got in (first, mapped):
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert mapped[0].shape == (10000, 784) and mapped[0].dtype == torch.uint8
    mapped[0][0].fill_(7)
    assert torch.equal(fmnist_torch.load_split(FMNIST, "t10k", cache)[0], ref[0])
    with open(os.path.join(cache, "t10k-images-idx3-ubyte"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="bytes of data for dimensions"):
        fmnist_torch.load_split(FMNIST, "t10k", cache)


def children(pid):
    out = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, task)) as f:
            out += [int(c) for c in f.read().split()]
    return out


@pytest.mark.training
def test_preemption_loses_no_step(tmp):
    """SIGTERM to the launcher fit() started (what a preemption notice does): every worker
    takes the last checkpoint at the step it reached (mid-epoch, not the last epoch's end)
    and exits; the same program run again resumes from that step and every count is still
    exact: no step lost, none done twice."""
    cmd = [PYTHON, DDP, "--storage", tmp, "--name", "pre", "--workers", 2, "--epochs", 40]
    p = subprocess.Popen([str(c) for c in cmd], env=worker_env(tmp), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    try:
        metrics = os.path.join(tmp, "pre", "metrics.jsonl")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:   # a few epochs reported
            if os.path.exists(metrics) and len(open(metrics).readlines()) >= 3:
                break
            time.sleep(0.05)
        assert p.poll() is None, p.stdout.read().decode(errors="replace")
        launcher = [c for c in children(p.pid)]
        assert len(launcher) == 1, launcher
        os.kill(launcher[0], signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = out.decode(errors="replace")
    m = re.search(r"a node leaves at step (\d+) \(last checkpoint committed\)", out)
    assert m, out
    step = int(m.group(1))
    assert os.path.isdir(os.path.join(tmp, "pre", "checkpoints", "step-%d" % step)), out
    rc, out2 = fit(tmp, "pre", "--workers", 2, "--epochs", 40)
    assert rc == 0, out2
    assert "counts_ok=True" in out2, out2
    assert "checkpoint_step=640" in out2, out2


def test_checkpoint_repr_and_a_leaving_nodes_data():
    """Checkpoint's repr names its path and step (it was lost once, to a helper written into
    the class); a leaving node's checkpoint data unwraps into the report before it and the
    state to put back, and any other data is the report itself."""
    from regroup.train import _ckpt
    assert repr(_ckpt.Checkpoint(path="p", step=3)) == "Checkpoint(path='p', step=3)"
    d = _ckpt.leave_data({"epoch": 1}, ["t"], {"state": {}})
    assert _ckpt.unwrap(d) == ({"epoch": 1}, (["t"], {"state": {}}))
    assert _ckpt.unwrap({"epoch": 1}) == ({"epoch": 1}, None)


def test_the_last_record_is_written_at_the_end(tmp):
    """At the end, rank 0 writes the last report's metrics record when the file's last is
    an earlier one: the rank 0 of that report died between its report and writing it (the
    result then had no metrics: rg-bench-goodput saw KeyError 'samples_per_s'). Once only."""
    import json
    import types
    from regroup.train import _session
    run_dir = os.path.join(tmp, "run")
    os.makedirs(run_dir)
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"metrics": {"epoch": 0}, "step": 16}) + "\n")
    s = types.SimpleNamespace(ctx=types.SimpleNamespace(rank=0), run_dir=run_dir,
                              last_record={"metrics": {"epoch": 1}, "step": 32})
    s._write_record = lambda rec: _session.Session._write_record(s, rec)
    for _ in range(2):
        _session.Session._last_record_written(s)
    steps = [json.loads(line)["step"] for line in open(path)]
    assert steps == [16, 32], steps
    s.ctx.rank = 1   # only rank 0 writes
    s.last_record = {"metrics": {}, "step": 48}
    _session.Session._last_record_written(s)
    assert [json.loads(line)["step"] for line in open(path)] == [16, 32]


def preempted_run(tmp, name, *args):
    """The DDP program on 2 workers for 4 epochs, with args that make it preempt its own
    node (its rank 0 watches the output, in a file, for the notice): that output."""
    log_path = os.path.join(tmp, "first.log")
    with open(log_path, "wb") as log:
        p = subprocess.Popen([PYTHON, DDP, "--storage", tmp, "--name", name, "--workers", "2",
                              "--epochs", "4", "--log", log_path] + [str(a) for a in args],
                             env=worker_env(tmp), stdout=log, stderr=subprocess.STDOUT)
        try:
            p.wait(timeout=180)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    with open(log_path, errors="replace") as f:
        return f.read()


@pytest.mark.training
def test_preemption_at_an_epochs_last_step(tmp):
    """The notice seen at the boundary of an epoch's last step, before that epoch's report:
    the workers leave at the report, with the epoch's own checkpoint (not the previous
    epoch's values at this epoch's end), and the program run again goes on with the next
    epoch: every count exact."""
    out = preempted_run(tmp, "end", "--preempt-after-epoch", 1)
    assert "rank 0: preempting at step 32" in out, out   # 16 steps an epoch
    assert "a node leaves at step 32 (last checkpoint committed)" in out, out
    rc, out2 = fit(tmp, "end", "--workers", 2, "--epochs", 4)
    assert rc == 0, out2
    assert "resumed from epoch 1" in out2, out2
    assert "counts_ok=True" in out2, out2
    assert "checkpoint_step=64" in out2, out2


@pytest.mark.training
def test_preemption_before_the_first_report(tmp):
    """The notice at step 5, mid-epoch 0, before any report(): the last checkpoint holds the
    state at that step (the prepared model's and optimizer's); the program run again resumes
    from it (its get_checkpoint() finds nothing reported and returns None, and the session
    puts the state back at the loader's first iteration): every count exact, no step lost.
    Before, no last checkpoint was taken ("step 5 is not being saved and no state was
    given") and the program run again started from the beginning."""
    out = preempted_run(tmp, "early", "--preempt-at-step", 5)
    assert "rank 0: preempting at step 5" in out, out
    assert "a node leaves at step 5 (last checkpoint committed)" in out, out
    rc, out2 = fit(tmp, "early", "--workers", 2, "--epochs", 4)
    assert rc == 0, out2
    assert "resumed from epoch" not in out2, out2   # nothing reported: None
    assert "counts_ok=True" in out2, out2
    assert "checkpoint_step=64" in out2, out2


PG = os.path.join(conftest.HERE, "worker_pg.py")


@pytest.mark.parametrize("world", [2, 3])
def test_backend_collectives_and_ddp(tmp, world):
    rc, out = conftest.run_job(tmp, world, [PYTHON, PG])
    assert rc == 0, out
    for r in range(world):
        assert "pg ok rank=%d world=%d" % (r, world) in out, out


def test_backend_dead_peer_is_an_error(tmp, etcd):
    """A rank SIGKILLed (no launcher to stop the others): the others' next all_reduce
    raises within the group's detection time, never hangs."""
    procs = conftest.spawn_ranks(tmp, etcd, 3, [PG, "die"], MASTER_ADDR="127.0.0.1",
                                 MASTER_PORT=conftest.free_port())
    res = conftest.wait_all(procs, timeout=90)
    out = "\n".join(o for _, o in res)
    for r in (0, 2):
        assert res[r][0] == 0, out
        m = re.search(r"pg peer error rank=%d after=([0-9.]+)" % r, out)
        assert m and float(m.group(1)) < 30, out


# ---- under agents: the same TorchTrainer program as each worker, two nodes --------------

AGENT_CONF = "--rdzv-conf=lease_ttl=2,last_call_timeout=6,join_timeout=8"


class Node:
    """One `regroup` agent (a node) of a job on the test's etcd, its output in a file."""

    def __init__(self, tmp, etcd, name, epochs, max_restarts=0, extra=()):
        self.log_path = os.path.join(tmp, "node-%s.log" % name)
        self.log = open(self.log_path, "wb")
        cmd = [os.path.join(conftest.BUILD, "regroup"), "--rdzv-endpoint=" + etcd.endpoint,
               "--rdzv-id=job", "--nnodes=1:2", "--nproc-per-node=2",
               "--max-restarts=%d" % max_restarts, "--recovery=in-place", AGENT_CONF,
               "--preload=torch", PYTHON, DDP, "--storage", tmp, "--name", "agents", "--workers", "4",
               "--epochs", str(epochs)] + list(extra)
        self.proc = subprocess.Popen(cmd, env=worker_env(tmp), stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def out(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


def wait_until(cond, seconds, what, nodes=()):
    """Waits for cond(); fails at the deadline, or at once when a node has exited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        for n in nodes:
            if n.proc.poll() is not None:
                raise AssertionError("node exited %d before: %s\n%s" % (
                    n.proc.returncode, what, n.out()))
        time.sleep(0.05)
    raise AssertionError("not within %d s: %s" % (seconds, what))


def reported(tmp, n):
    path = os.path.join(tmp, "agents", "metrics.jsonl")
    return os.path.exists(path) and len(open(path).readlines()) >= n


def final_counts_ok(tmp, epochs):
    from regroup.train import _ckpt
    root = os.path.join(tmp, "agents", "checkpoints")
    step = _ckpt.committed(root)[0]
    counts = _ckpt.read(root, step)[0]["model"]["counts"]
    return step, bool((counts == epochs).all())


@pytest.mark.training
def test_node_loss_in_place_at_max_restarts_0(tmp, etcd):
    """Two nodes x 2 workers, --max-restarts=0; node b's agent SIGKILLed while the job
    trains: after the lease TTL node a's workers regroup in their own processes at world 2
    and finish; every sample of every epoch once."""
    epochs = 120
    a = Node(tmp, etcd, "a", epochs)
    b = Node(tmp, etcd, "b", epochs)
    try:
        wait_until(lambda: reported(tmp, 3), 120, "the job trains", (a, b))
        b.proc.kill()
        assert b.wait(30) == -9
        assert a.wait(240) == 0, a.out()
    finally:
        for n in (a, b):
            if n.proc.poll() is None:
                n.proc.kill()
                n.wait(10)
    out = a.out()
    assert re.search(r"regrouped at step \d+: world size 2, round 1 \(PeerError\)", out), out
    # node a's two workers, whatever their ranks were (the first node to join gets 0 and 1):
    # the same processes from start to end
    started = set(int(p) for p in re.findall(r"worker pid=(\d+) rank=\d+", out))
    done = set(int(p) for p in re.findall(r"worker done pid=(\d+) rank=\d+ world=2", out))
    assert len(started) == 2 and done == started, out
    assert "resumed from" not in out, out
    step, ok = final_counts_ok(tmp, epochs)
    assert step == 16 * epochs and ok, (step, out)
    assert_gone(out + b.out())


@pytest.mark.training
def test_node_joins_in_place(tmp, etcd):
    """Node a trains alone (world 2) at --nnodes=1:2; node b comes: its workers join the
    running job in place (world 4), receive the state from node a's (at the last epoch's
    first step at the latest: node a waits there for them), and a's workers keep their
    processes; every sample of every epoch once."""
    epochs = 6
    a = Node(tmp, etcd, "a", epochs, extra=["--wait-for-replacement"])
    b = None
    try:
        wait_until(lambda: reported(tmp, 3), 120, "node a trains", (a,))
        b = Node(tmp, etcd, "b", epochs, extra=["--wait-for-replacement"])
        assert a.wait(240) == 0, a.out()
        assert b.wait(60) == 0, b.out()
    finally:
        for n in (a, b):
            if n is not None and n.proc.poll() is None:
                n.proc.kill()
                n.wait(10)
    out, outb = a.out(), b.out()
    assert re.search(r"regrouped at step \d+: world size 4, round \d+ \(MembershipChanged\)",
                     out), out
    started = set(int(p) for p in re.findall(r"worker pid=(\d+) rank=\d+", out))
    done = set(int(p) for p in re.findall(r"worker done pid=(\d+) rank=\d+ world=4", out))
    assert len(started) == 2 and done == started, out
    assert len(re.findall(r"worker done pid=\d+ rank=\d+ world=4", outb)) == 2, outb
    step, ok = final_counts_ok(tmp, epochs)
    assert step == 16 * epochs and ok, (step, out, outb)
