"""A worker's training session: its context, the model, optimizer and loader it prepared, the
steps its state holds, and recovery in place below the user's loop.

The step boundary is the prepared optimizer's step(). There, the gradients of every prepared
parameter (DDP's reducer, over a group of one rank, leaves them local) are scaled by this
rank's share of the global batch and summed over the group in one allreduce; the buffers
go from rank 0. If that fails (a peer died: PeerError; a silent one: ETIMEDOUT), the step is
discarded on this rank (the optimizer does not step, the data position stays) and the
worker regroups in place: ctx.regroup() agrees on the newest state among the members (a
rank that finished the step holds it: its allreduce had every rank's gradient) and sends
the parameters and buffers to the members at another step; the optimizer's state and the
loader's position follow from the same source; the loader then hands out the batch of the
step agreed on, at the new rank and world size, so the global batch that broke is replayed.
Otherwise the optimizer steps and ctx.report() marks the boundary, where planned changes
(a ready replacement, a joining node, a preemption) arrive at the same step on every rank.

A replacement (ctx.joining) regroups at get_checkpoint(), or at its loader's first batch:
it receives the state from a survivor, and get_checkpoint() gives it the checkpoint the
survivors last reported, so that the loop it runs from the top resumes where theirs is.
"""

import json
import os
import socket
import sys
import time
import traceback

from .. import _c10d
from .. import _status
from .._train import Cursor, init
from . import _ckpt

_session = None
_REGROUP_ATTEMPTS = 8  # regroups in a row that may break off before the worker gives up


class Finished(BaseException):
    """Raised in a replacement that joined only for the job's last checkpoint (the others'
    training function had returned): it takes its part in that checkpoint and exits 0
    without running the rest of its own."""


class Leave(BaseException):
    """Raised through the user's loop when this worker's node leaves (a preemption notice):
    its last checkpoint is taken; the worker exits 0. A BaseException, so that a loop's
    `except Exception` does not keep it."""


def get():
    if _session is None:
        raise RuntimeError("regroup.train: no training session: call this from a training "
                           "function that TorchTrainer.fit() runs (directly, or under the "
                           "regroup launcher)")
    return _session


def _torch():
    import torch
    return torch


def _regroup_failure(e):
    """Whether an error means the group is broken (regroup in place)."""
    return isinstance(e, _status.PeerError) or (isinstance(e, _status.Error) and
                                                e.status == "ETIMEDOUT")


class Session:
    def __init__(self, run_dir):
        global _session
        self.run_dir = run_dir
        self.ctx = init(in_place=True)
        self.in_place = self.ctx.in_place
        self.done = 0                 # the steps the state holds
        self.cursor = None            # the data position after them (a Cursor)
        self.model = None             # the DDP model
        self.module = None
        self.optimizer = None         # the prepared optimizer (its inner one)
        self.loader = None
        self.last_checkpoint = None   # the last reported Checkpoint (its dict)
        self.last_checkpoint_step = -1  # the steps done when it was reported
        self.deferred = None          # in place: a planned change that waits for a boundary
        self.last_record = None       # the last report's metrics record (rank 0 writes it)
        self.unsaved_step = -1        # in place: a user report with a checkpoint at this step
                                      # broke off (a failure in its collectives)
        self.finishing = False        # the training function returned: the last regroup
        self.received_checkpoint = None  # a replacement's: what the survivors last reported
        self.resync = None            # a replacement's received state, to put back after load
        self.started = False          # past get_checkpoint (or training): the state is live
        self.source_started = True    # a replacement's: whether its source was started
        self.received_live = False    # a replacement's: it received a started member's state
        self.joined = not self.ctx.joining
        self.pending_extra = None     # a position read before the loader was prepared
        self.node = socket.gethostname()
        _c10d.set_context(self.ctx)
        _session = self
        if self.joined:
            self._default_group()

    # ---- the default process group ----------------------------------------------------

    def _default_group(self):
        import torch.distributed as dist
        _c10d.register()
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(_c10d.NAME, store=_c10d.round_store(self.ctx),
                                rank=self.ctx.rank,
                                world_size=self.ctx.world_size)

    def close(self):
        global _session
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
        self.ctx.close()
        _session = None

    # ---- what the user prepared --------------------------------------------------------

    def state_tensors(self):
        """The replicated state ctx.regroup moves: every parameter and buffer (as bytes where
        the library has not their dtype)."""
        torch = _torch()
        out = []
        if self.module is None:
            return out
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            d = t.data
            if d.numel() == 0:
                continue
            if str(d.dtype).replace("torch.", "") not in _ckpt._NATIVE:
                d = d.view(-1).view(torch.uint8)
            out.append(d)
        return out

    def start_cursor(self, cursor):
        if self.cursor is None:
            self.cursor = cursor

    # ---- the step boundary -------------------------------------------------------------

    def reduce(self, params):
        """Sums every parameter's gradient, scaled by this rank's share of the global batch,
        over the group, and takes rank 0's buffers. False when the group broke (the step is
        discarded; the worker has regrouped)."""
        torch = _torch()
        if not self.joined:
            self.join()
        scale = 1.0 / self.ctx.world_size
        if self.loader is not None and self.loader.global_count > 0:
            scale = self.loader.local_count / self.loader.global_count
        params = [p for p in params if p.requires_grad]
        had = [p.grad is not None for p in params]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        try:
            if self.ctx.world_size > 1 or scale != 1.0:
                by_dtype = {}
                for i, g in enumerate(grads):
                    by_dtype.setdefault(g.dtype, []).append(i)
                for dtype, idx in by_dtype.items():
                    flat = torch.cat([grads[i].reshape(-1) for i in idx])
                    flat.mul_(scale)
                    self.ctx.allreduce(flat)
                    off = 0
                    for i in idx:
                        n = grads[i].numel()
                        g = flat[off:off + n].view_as(grads[i])
                        if had[i]:
                            params[i].grad.copy_(g)
                        elif bool(g.any()):   # a gradient only other ranks had
                            params[i].grad = g.clone()
                        off += n
            if self.ctx.world_size > 1 and self.module is not None:
                for b in self.module.buffers():
                    if b.numel() > 0 and str(b.dtype).replace("torch.", "") in _ckpt._NATIVE:
                        self.ctx.broadcast(b.data, root=0)
        except _status.Error as e:
            if not (self.in_place and _regroup_failure(e)):
                raise
            self.regroup(e)
            return False
        return True

    def commit(self):
        """The step counted: its data position is the loader's; then the step boundary."""
        self.done += 1
        self.started = True
        if self.loader is not None:
            self.cursor = self.loader.sampler.cursor
        self.boundary()

    def boundary(self, checkpoint=None, metrics=None, user=False):
        """ctx.report at the steps done: the progress, a checkpoint when given, and the
        notices. In place, a broken group regroups here (never reporting again: a rank whose
        report got through has gone on, and every rank meets the next step's collectives
        in the new group); a planned change regroups at a step boundary (the optimizer's
        step) that is not its epoch's last, also when it was first seen in the user's
        report() or at an epoch's last step (the notice stays until the job regrouped), so
        that a replacement always joins at the same kind of point: mid-epoch, after the
        checkpoint of the epoch before was reported.
        A preemption takes the last checkpoint on every rank; the leaving node's workers
        exit. Seen at an epoch's last step, it waits for the user's report of that epoch
        (the notice stays posted), or the next step's boundary if the loop reports no epoch:
        the last checkpoint is then the epoch's own. Taken at the step itself, it would hold
        the previous epoch's values with the position after this one, and the loop resumed
        from it would run that epoch again on a loader already past it."""
        try:
            # (the checkpoint's tensors, broadcast from rank 0: a failure there regroups too)
            state = self._checkpoint_state(checkpoint) if checkpoint is not None else None
            self.ctx.report(self.done, metrics=metrics, state=state, cursor=self.cursor,
                            epoch=self._epoch())
        except _status.MembershipChanged as e:
            n = e.notice
            if n.preempt and checkpoint is None and not user and self._epoch_ended():
                return
            if n.preempt:
                self._leave(checkpoint, leaving=n.leaving or not self.in_place)
            elif not self.in_place:
                raise
            if n.preempt or not (user or self._epoch_ended()):
                self.regroup(e)
            else:
                self.deferred = e
        except _status.Error as e:
            if not (self.in_place and _regroup_failure(e)):
                raise
            if user and checkpoint is not None:
                self.unsaved_step = self.done
            self.regroup(e)

    def _epoch_ended(self):
        """The step just done was its epoch's last: the loader's iteration ends next, and the
        loop reports the epoch. A planned change waits for the next epoch's first step: a
        replacement takes its epoch from the checkpoint reported at an epoch's end, and one
        that joined between the last step and that report would run an empty epoch."""
        return self.loader is not None and self.loader.sampler.steps_per_epoch > 1 and \
            self.loader.sampler.epoch != self.loader.epoch

    def _epoch(self):
        return self.loader.epoch if self.loader is not None else 0

    def _leave(self, checkpoint, leaving):
        """A node leaves: every rank takes the last checkpoint at the steps done (collective);
        the leaving node's workers then exit 0 (Leave), the others regroup without it."""
        state = None
        if checkpoint is None:
            # No report at this step: the one before, with the state at this step (the
            # program's checkpoint format is its own; its model and optimizer are the
            # session's): a restart puts them back over what the program loads from it.
            # Before, only the report before was saved, and none at all before the first.
            prev = self.last_checkpoint.to_dict() if self.last_checkpoint is not None else None
            state = self._checkpoint_state(_ckpt.Checkpoint.from_dict(_ckpt.leave_data(
                prev, self.state_tensors(),
                self.optimizer.state_dict() if self.optimizer is not None else None)))
        try:
            ok = self.ctx.leave(self.done, state=state, cursor=self.cursor)
        except _status.Error as e:
            ok = False
            print("regroup.train: rank %d: the last checkpoint before a node leaves failed: %s"
                  % (self.ctx.rank, e), file=sys.stderr)
        if self.ctx.rank == 0:
            print("regroup.train: a node leaves at step %d (%s)" % (
                self.done, "last checkpoint committed" if ok else "no last checkpoint"),
                file=sys.stderr)
        if leaving:
            raise Leave()

    # ---- checkpoints -------------------------------------------------------------------

    def _checkpoint_state(self, checkpoint):
        torch = _torch()
        skeleton, tensors = _ckpt.flatten(checkpoint.to_dict())
        meta = _ckpt.meta_bytes(skeleton, {
            "loader_epoch": self._epoch(), "step": self.done,
            "cursor": tuple(self.cursor) if self.cursor is not None else None})
        if self.ctx.world_size > 1:  # rank 0's values: every rank saves a share of them
            n = torch.tensor([len(meta)], dtype=torch.int64)
            self.ctx.broadcast(n, root=0)
            buf = torch.zeros(int(n.item()), dtype=torch.uint8)
            if self.ctx.rank == 0:
                buf.copy_(torch.frombuffer(bytearray(meta), dtype=torch.uint8))
            self.ctx.broadcast(buf, root=0)
            meta = buf.numpy().tobytes()
        return _ckpt.state(meta, tensors)

    def report(self, metrics, checkpoint):
        if not self.joined:
            self.join()
        metrics = dict(metrics or {})
        numeric = {}
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and \
                    len(numeric) < 32 and _metric_name(k):
                numeric[k] = float(v)
        self.boundary(checkpoint=checkpoint, metrics=numeric, user=True)
        if checkpoint is not None:
            self.last_checkpoint = checkpoint
            self.last_checkpoint_step = self.done
        # Every rank keeps the record: rank 0 writes it, and a rank 0 of a later group
        # writes the last one at the end if the rank 0 of its report died before it did.
        self.last_record = {"metrics": metrics, "step": self.done,
                            "loader_epoch": self._epoch(), "world_size": self.ctx.world_size,
                            "round": self.ctx.round, "time": time.time(),
                            "checkpoint": checkpoint is not None}
        if self.ctx.rank == 0 and self.run_dir:
            self._write_record(self.last_record)

    def _write_record(self, rec):
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    def _last_record_written(self):
        """At the end, on rank 0: the last report's record is the file's last (its rank 0 may
        have died between the report and writing it: the result had no metrics then)."""
        if self.ctx.rank != 0 or not self.run_dir or self.last_record is None:
            return
        last = None
        try:
            with open(os.path.join(self.run_dir, "metrics.jsonl"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - (1 << 16)))
                lines = f.read().splitlines()
            last = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            last = None
        if last is None or last.get("step") != self.last_record["step"]:
            self._write_record(self.last_record)

    def get_checkpoint(self):
        """In place, a replacement regroups here: the checkpoint the survivors last reported
        (with their live values). Otherwise the newest committed checkpoint (None: none),
        the same step on every rank; its data position goes to the prepared loader."""
        if not self.joined:
            self.join()
            if self.source_started:
                self.started = True
                return self.received_checkpoint
            # The members regrouped in their own get_checkpoint, a failure having broken its
            # collectives: this rank reads the checkpoint with them, as they do again.
        ck = self.redo_on_regroup(self._read_checkpoint)
        self.started = True
        return ck

    def redo_on_regroup(self, fn):
        """fn() (collectives outside a step: get_checkpoint's and prepare_model's before the
        training loop, the last checkpoint's after it) again in the new group when a failure
        broke its group: in place the survivors regroup, and a replacement that joins there
        runs the same collectives (it received a state from a member that was not started:
        get_checkpoint, or one that was: prepare_model's broadcast)."""
        for _ in range(_REGROUP_ATTEMPTS):
            try:
                return fn()
            except _status.Error as e:
                if not (self.in_place and _regroup_failure(e)):
                    raise
                self.regroup(e)
        raise RuntimeError("regroup.train: %d regroups in a row broke off outside a step" %
                           _REGROUP_ATTEMPTS)

    def _read_checkpoint(self):
        """The newest committed checkpoint every rank can read (None: none). Collective."""
        root = self.ctx.ckpt_dir
        step = self.ctx.latest_checkpoint() if root else None
        if step is None:
            return None
        steps = [s for s in _ckpt.committed(root) if s <= step] or [step]
        got = None
        for s in steps:   # the newest this rank reads; then the newest every rank read
            try:
                got = (s,) + _ckpt.read(root, s)
                break
            except _status.Error as e:
                print("regroup.train: rank %d: checkpoint step %d unreadable: %s" % (
                    self.ctx.rank, s, e), file=sys.stderr)
        torch = _torch()
        agreed = torch.tensor([got[0] if got else -1], dtype=torch.int64)
        if self.ctx.world_size > 1:
            self.ctx.allreduce(agreed, op="min")
        a = int(agreed.item())
        if a < 0:
            raise RuntimeError("regroup.train: no rank could read a checkpoint of %s (newest "
                               "committed: step %d)" % (root, step))
        if got[0] != a:
            got = (a,) + _ckpt.read(root, a)
        s, data, extra = got
        self.done = int(extra.get("step", s))
        self._restore_position(extra)
        data, self.resync = _ckpt.unwrap(data)   # a leaving node's: its state goes back
        if data is None:
            return None                          # (no report before it: nothing to load)
        return _ckpt.Checkpoint(data=data, path=_ckpt.step_dir(root, s), step=s, root=root)

    def _restore_position(self, extra):
        """A checkpoint's data position: the cursor after its steps, the loader's epoch."""
        if extra.get("cursor") is not None:
            self.cursor = Cursor(*extra["cursor"])
        self.pending_extra = extra
        if self.loader is not None:
            self.loader.restore(extra, self.cursor)

    # ---- in place ----------------------------------------------------------------------

    def join(self):
        """A replacement's first regroup (before any collective). One that joined for the
        job's last checkpoint takes its part in it and ends (Finished)."""
        self.regroup(None)
        if self.finishing:
            self._last_saves(first=self._final_save)
            raise Finished()

    def finish(self):
        """After the training function returned. In place, a planned change that waited for
        a step boundary (first seen at the user's last report, or at an epoch's last step)
        has moved the job to a newer round: that report's checkpoint was refused in the old
        one (its writes are fenced), and the job would end without it. The workers regroup
        once more (a replacement waiting to join receives the state, takes part and ends
        without running its function) and save it again in the new round: a step already
        committed is not written twice.
        A failure that broke the last report off (a member died in its collectives: the
        checkpoint's broadcast, the report's agreement) left that report's checkpoint unsaved,
        and the job ended without it (the result's checkpoint was the epoch before's). The
        ranks agree whether any of theirs broke off, and if so save it again in the new
        group. Rank 0 then writes the last report's metrics record if it is not the file's
        last (that report's rank 0 died before it wrote it)."""
        if not self.in_place:
            return
        # From here a replacement that joins (in the deferred change's regroup, or in one
        # that a failure below makes) takes part in the last save and ends: it does not run
        # the training function the others have left.
        self.finishing = True
        self._last_saves()
        self._last_record_written()

    def _last_saves(self, first=None):
        """finish()'s saves, until one pass finds nothing to do: the deferred change's regroup
        and the last checkpoint again, or the checkpoint of a report that broke off, or that
        of a save whose commit a change refused (_await_commit). first: a replacement's
        first pass (it joined in the others' regroup there)."""
        for _ in range(_REGROUP_ATTEMPTS):
            if first is not None:
                again = self.redo_on_regroup(first)
                first = None
            elif self.deferred is not None:
                self.regroup(self.deferred)
                again = self.redo_on_regroup(self._final_save)
            else:
                again = self.redo_on_regroup(lambda: self._final_save(broken_only=True))
            if not again and self.deferred is None:
                return
        raise RuntimeError("regroup.train: the job kept changing after the training function "
                           "returned (%d regroups)" % _REGROUP_ATTEMPTS)

    def _final_save(self, broken_only=False):
        """The last checkpoint again, at the steps done, if the last report carried it;
        broken_only: if it did and that report broke off. Any rank's word (a replacement
        knows the last report from the state it received, and says no broken one): the same
        collectives on every rank whichever it was called for, since a replacement that
        joins here cannot know which. Then, if the last report carried a checkpoint, every
        rank waits for it to land (_await_commit). Whether finish() must pass again (the
        save broke off, or a change came before it landed). Collective."""
        torch = _torch()
        last = self.last_checkpoint is not None and self.last_checkpoint_step == self.done
        flags = torch.tensor([1 if last else 0, 1 if last and self.unsaved_step == self.done
                              else 0], dtype=torch.int64)
        if self.ctx.world_size > 1:
            self.ctx.allreduce(flags, op="max")
        last, broken = bool(flags[0].item()), bool(flags[1].item())
        if broken or (last and not broken_only):
            self.unsaved_step = -1   # (set again if this report breaks off too)
            r = self.ctx.round
            self.boundary(checkpoint=self.last_checkpoint, user=True)
            if self.deferred is not None or self.ctx.round != r:
                return True
        return last and not self._await_commit()

    def _await_commit(self):
        """At the job's end: every rank waits for the last checkpoint to land (rank 0:
        committed), then a report agrees on the notices; whether it landed with no change.
        rg_report returns before a checkpoint commits, and a change that came meanwhile (a
        replacement got ready, a node joined or was lost) moved the job to a newer round,
        whose fence refused the commit: the job ended without its last checkpoint (the
        result had the epoch before's, or none). Now that change arrives here, and the
        checkpoint is due again in the new round (unsaved_step). Collective."""
        self.unsaved_step = self.done   # until every rank knows it landed
        r = self.ctx.round
        try:
            self.ctx.wait_checkpoint()
        except _status.Error as e:
            # (rank 0's commit timed out: a rank died before its share was written)
            if not (self.in_place and _regroup_failure(e)):
                raise
            self.regroup(e)
            return False
        self.boundary(user=True)
        if self.deferred is not None or self.ctx.round != r:
            return False
        self.unsaved_step = -1
        return True

    def regroup(self, why):
        """Regroups in place: the parameters and buffers, with the optimizer's state, the
        last report's checkpoint and the loader's epoch from the newest member (regroup's
        extra bytes: a receiver takes all of it or none)."""
        if not self.in_place:
            raise why
        t0 = time.monotonic()
        step = self.done if self.joined else 0
        r = self.ctx.regroup(step, self.state_tensors(), self.cursor, extra=self._state_bytes)
        self._after_regroup(r)
        if r.rank == 0:
            print("regroup.train: regrouped at step %d: world size %d, round %d%s in %.3f s" % (
                r.step, r.world_size, r.round, "" if why is None else " (%s)" % type(why).__name__,
                time.monotonic() - t0), file=sys.stderr)
        return r

    def _state_bytes(self):
        """The source's state that is not in its tensors, for the members that receive."""
        ck = self.last_checkpoint.to_dict() if self.last_checkpoint is not None else None
        return _ckpt.dumps({
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "checkpoint": ck, "checkpoint_step": self.last_checkpoint_step,
            "loader_epoch": self._epoch(), "finishing": self.finishing,
            "started": self.started})

    def _after_regroup(self, r):
        if r.received:
            got = _ckpt.loads(r.extra)
            if self.optimizer is not None and got["optimizer"] is not None:
                self.optimizer.load_state_dict(got["optimizer"])
            if self.loader is not None:
                self.loader.epoch = got["loader_epoch"]
            else:
                self.pending_extra = {"loader_epoch": got["loader_epoch"]}
            if got["checkpoint"] is not None:
                self.received_checkpoint = _ckpt.Checkpoint(data=got["checkpoint"],
                                                            step=r.step)
                self.last_checkpoint = self.received_checkpoint
                self.last_checkpoint_step = got["checkpoint_step"]
            self.finishing = self.finishing or got["finishing"]
            self.source_started = got.get("started", True)
            self.received_live = self.source_started
            if not self.joined:  # what the user's load of that checkpoint must not undo
                self.resync = ([t.clone() for t in self.state_tensors()], got["optimizer"])
        self.done = r.step
        self.cursor = r.cursor
        self.deferred = None
        if self.loader is not None:
            self.loader.sampler.reshard(r.rank, r.world_size, r.cursor)
        self.joined = True
        self._default_group()

    def before_iter(self):
        """At a loader's iteration: a replacement joins now if it has not; the state it
        received is put back over whatever the program loaded since."""
        if not self.joined:
            self.join()
        if self.resync is not None:
            tensors, opt = self.resync
            self.resync = None
            for mine, got in zip(self.state_tensors(), tensors):
                mine.copy_(got)
            if self.optimizer is not None and opt is not None:
                self.optimizer.load_state_dict(opt)


def _metric_name(k):
    return isinstance(k, str) and 0 < len(k) <= 64 and all(
        c.isalnum() or c in "_.-" for c in k)


def write_error(run_dir, rank, node):
    """The failing worker's traceback, for the TrainingFailedError of fit()."""
    if not run_dir:
        return
    d = os.path.join(run_dir, "errors")
    os.makedirs(d, exist_ok=True)
    rec = {"rank": rank, "node": node, "pid": os.getpid(), "time": time.time(),
           "traceback": traceback.format_exc()}
    path = os.path.join(d, "rank-%d-%d.json" % (rank, os.getpid()))
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f)
    os.rename(path + ".tmp", path)
