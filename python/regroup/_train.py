"""regroup.init() and its context: the worker API of include/regroup/train.h."""

import collections
import ctypes

from . import _lib
from . import _status
from . import _tensor

_OPS = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}


class Regrouped(collections.namedtuple(
        "Regrouped", "rank world_size round step source received cursor n_received extra")):
    """What ctx.regroup() agreed on: this rank and the world size in the new round, the step
    every member continues from (its state's completed steps), the rank (new numbering) whose
    state every member took, whether this rank's buffers were overwritten with it, the data
    Cursor that goes with that state, how many members received it (the same on every rank),
    and a receiver's copy of the source's extra bytes (regroup's `extra`; None otherwise)."""

    __slots__ = ()


class Cursor(collections.namedtuple("Cursor", "seed epoch step")):
    """Where a job is in its data (rg_data_cursor_t): the next global step of an epoch."""

    __slots__ = ()

    @classmethod
    def start(cls, seed):
        return cls(int(seed), 0, 0)

    def _c(self):
        return _lib.DataCursor(self.seed, self.epoch, self.step)

    @classmethod
    def _from_c(cls, c):
        return cls(c.seed, c.epoch, c.step)


class Notice(collections.namedtuple("Notice", "preempt members leaving ms_left")):
    """The notices a report agreed on (rg_notice_t): preempt, some node of the job leaves (a
    cloud's preemption notice, or SIGTERM); members, a planned membership change (a join, a
    ready replacement, in place a node that left); leaving, this rank's own node is the one
    that leaves; ms_left, the least time left over the ranks (-1: no deadline)."""

    __slots__ = ()

    @classmethod
    def _from_c(cls, n):
        own = n.own & (1 << _lib.RG_NOTICE_PREEMPT)
        return cls(bool(n.kinds & (1 << _lib.RG_NOTICE_PREEMPT)),
                   bool(n.kinds & (1 << _lib.RG_NOTICE_MEMBERS)), bool(own), int(n.ms_left))


def _deadline(lib, timeout_ms):
    if timeout_ms is None:
        return 0
    ms = int(timeout_ms)
    return lib.rg_now_ns() + max(ms, 0) * 1000000 if ms > 0 else 1


class Context:
    """One worker's membership of the job (rg_train_ctx_t): made by regroup.init().

    Belongs to the thread that made it. Collective calls (allreduce, broadcast, allgather,
    barrier, latest_checkpoint, restore, and report with state) must be made by every rank in
    the same order. Every call that fails raises regroup.Error (regroup.PeerError when a peer
    died: the group is then unusable; regroup.MembershipChanged from report when the
    membership changes). In place (self.in_place) the worker then calls regroup(); otherwise
    it closes the context and lets the launcher restart the job.
    """

    def __init__(self, ckpt_dir=None, keep_last=0, comm_timeout_ms=0, staging_bytes=0,
                 in_place=False):
        lib = _lib.load()
        self._lib = lib
        self._h = None
        params = _lib.TrainParams(ckpt_dir.encode() if ckpt_dir else None, int(keep_last),
                                  int(comm_timeout_ms), int(staging_bytes), bool(in_place))
        h = ctypes.c_void_p()
        _status.check(lib.rg_train_init(ctypes.byref(params), ctypes.byref(h)), "rg_train_init")
        self._h = h
        self._allreduce = lib.rg_comm_allreduce
        self.in_place = bool(lib.rg_train_in_place(h))
        self._members()
        self.local_rank = lib.rg_train_local_rank(h)
        self.local_world_size = lib.rg_train_local_size(h)
        self.restart_count = lib.rg_train_restart_count(h)
        root = lib.rg_train_ckpt_root(h)
        self.ckpt_dir = root.decode() if root is not None else None
        self.restored_step = None
        self._table = None

    def _members(self):
        """Rank, world size, round and group from the library (after init and each regroup;
        a replacement that has not regrouped yet has no group)."""
        lib, h = self._lib, self._h
        self._comm = ctypes.c_void_p(lib.rg_train_comm(h))
        self.joining = bool(lib.rg_train_joining(h))
        self.rank = lib.rg_train_rank(h)
        self.world_size = lib.rg_train_world_size(h)
        self.round = lib.rg_train_round(h)

    # ---- lifetime ----------------------------------------------------------------------

    def close(self):
        """Waits for the checkpoint in flight, then leaves the group (rg_train_finalize).
        Not collective; idempotent."""
        if self._h is not None:
            if self._table is not None:
                self._table.close()
            h, self._h = self._h, None
            self._lib.rg_train_finalize(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _handle(self):
        if self._h is None:
            raise ValueError("regroup: the context is closed")
        return self._h

    @property
    def healthy(self):
        """False once a collective failed: the group must be given up (close())."""
        self._handle()
        return bool(self._lib.rg_comm_is_healthy(self._comm))

    @property
    def failed_rank(self):
        """The rank that failed first, or None."""
        self._handle()
        r = self._lib.rg_comm_failed_rank(self._comm)
        return None if r < 0 else r

    # ---- collectives -------------------------------------------------------------------

    def _opts(self, t, timeout_ms):
        cuda = t is not None and t.cuda
        if timeout_ms is None and not cuda:
            return None
        return ctypes.byref(_lib.CommOpts(_deadline(self._lib, timeout_ms),
                                          _lib.RG_MEM_CUDA if cuda else _lib.RG_MEM_HOST))

    def _check_comm(self, st, fn, t):
        if st != 0 and t is not None and t.cuda and _status.status_name(st) == "ENOTSUP":
            raise TypeError("regroup: %s: a CUDA tensor, which this libregroup cannot use: %s"
                            % (fn, self._lib.rg_last_error().decode(errors="replace")))
        _status.check(st, fn)

    def allreduce(self, tensor, op="sum", timeout_ms=None):
        """In place: tensor = op over every rank's tensor ("sum", "avg", "min", "max",
        "prod"; avg on floating types only). Collective; returns tensor."""
        if self._h is None:
            self._handle()
        code = _OPS.get(op)
        if code is None:
            raise ValueError("regroup: allreduce op %r; use one of %s" % (op, ", ".join(_OPS)))
        t = _tensor.describe(tensor, "allreduce's tensor", writable=True)
        opts = None if timeout_ms is None and not t.cuda else self._opts(t, timeout_ms)
        st = self._allreduce(self._comm, t.ptr, t.ptr, t.count, t.dtype, code, opts)
        if st != 0:
            self._check_comm(st, "rg_comm_allreduce", t)
        return tensor

    def broadcast(self, tensor, root=0, timeout_ms=None):
        """In place: every rank's tensor = root's. Collective; returns tensor."""
        self._handle()
        t = _tensor.describe(tensor, "broadcast's tensor", writable=True)
        st = self._lib.rg_comm_broadcast(self._comm, t.ptr, t.count, t.dtype, int(root),
                                         self._opts(t, timeout_ms))
        self._check_comm(st, "rg_comm_broadcast", t)
        return tensor

    def allgather(self, src, dst, timeout_ms=None):
        """dst (world_size * src's elements, src's dtype) = every rank's src in rank order.
        In place when src is this rank's part of dst. Collective; returns dst."""
        self._handle()
        s = _tensor.describe(src, "allgather's src")
        d = _tensor.describe(dst, "allgather's dst", writable=True)
        if s.dtype != d.dtype:
            raise TypeError("regroup: allgather: src is %s, dst %s" % (
                _dtype_name(s.dtype), _dtype_name(d.dtype)))
        if d.count != s.count * self.world_size:
            raise ValueError("regroup: allgather: dst has %d elements, not world_size (%d) "
                             "* src's %d" % (d.count, self.world_size, s.count))
        if s.cuda != d.cuda:
            raise TypeError("regroup: allgather: src and dst on different devices")
        sendbuf = s.ptr
        if s.ptr == d.ptr + self.rank * s.nbytes:
            sendbuf = 1  # RG_COMM_IN_PLACE
        st = self._lib.rg_comm_allgather(self._comm, sendbuf, d.ptr, s.count, s.dtype,
                                         self._opts(d, timeout_ms))
        self._check_comm(st, "rg_comm_allgather", d)
        return dst

    def barrier(self, timeout_ms=None):
        """Returns once every rank has entered. Collective."""
        self._handle()
        _status.check(self._lib.rg_comm_barrier(self._comm, self._opts(None, timeout_ms)),
                      "rg_comm_barrier")

    # ---- in place ----------------------------------------------------------------------

    def table(self, n_rows, row_bytes):
        """The sharded state of an in-place job (rg_train_table_t): n_rows rows of row_bytes
        bytes, each held live by exactly one rank (this rank's: Table.rows()), kept by
        Table.commit in a buddy rank's memory and in a copy its agent owns, and moved to the
        new owners by regroup(..., table=). One per worker; closed with the context. Not
        collective."""
        h = self._handle()
        if self._table is not None:
            raise ValueError("regroup: this worker has a table already")
        t = ctypes.c_void_p()
        _status.check(self._lib.rg_train_table_create(h, int(n_rows), int(row_bytes),
                                                      ctypes.byref(t)), "rg_train_table_create")
        self._table = Table(self, t)
        return self._table

    def regroup(self, step, buffers, cursor, table=None, extra=None):
        """In place (rg_train_regroup): after a collective raised PeerError (or a timeout), or
        report raised MembershipChanged, on every member; and once by a replacement
        (self.joining) before any collective. Waits for the next round, builds its group and
        agrees on the newest state: each of `buffers` (a list of contiguous NumPy arrays or
        PyTorch CPU tensors, the replicated state, the same count and sizes on every rank)
        is overwritten in place with the source's when this rank's step is not the one agreed
        on (a replacement's, a survivor's that did not finish the failed step; r.received
        says so). `step` is the steps this rank's buffers hold (completed), `cursor` (a
        Cursor, or a GlobalSampler's position) the data position after them; a replacement's
        are ignored. `table` (this worker's Table, or None): its rows are found at the step
        agreed on and moved to their owners in the new round (Table.rows() again for this
        rank's). `extra` (a function returning bytes, or None): the source's state that is not
        in `buffers` (an optimizer's, of a size only it knows), called on the source only when
        some member receives, and sent after the buffers: each receiver gets both or neither
        (r.extra). Returns a Regrouped; rank,
        world_size, round and joining then describe the new round (reshard a GlobalSampler
        with sampler.reshard(r.rank, r.world_size, r.cursor)). Raises regroup.Error when the
        regroup fails (the agent then restarts the job from its last checkpoint: exit
        non-zero), with ENOTSUP when this worker does not recover in place."""
        h = self._handle()
        if isinstance(cursor, _Positioned):
            cursor = cursor.cursor
        items = list(buffers)
        bufs = (_lib.TrainBuf * max(len(items), 1))()
        for i, obj in enumerate(items):
            t = _tensor.describe(obj, "regroup's buffer %d" % i, writable=True)
            if t.cuda:
                raise TypeError("regroup: regroup's buffer %d is a CUDA tensor; the state is "
                                "exchanged in host memory" % i)
            bufs[i] = _lib.TrainBuf(t.ptr, t.nbytes)
        c = cursor._c() if cursor is not None else _lib.DataCursor()
        rs = _lib.TrainRegroup(int(step), bufs, len(items), c)
        if table is not None:
            if table is not self._table:
                raise ValueError("regroup: table is not this context's")
            rs.table = table._handle()
        made = []   # the bytes the source sends (alive until the call returns), or its error
        if extra is not None:
            def extra_fn(_arg, data, nbytes):
                try:
                    b = bytes(extra())
                except BaseException as e:   # (raised below, once the library returned)
                    made.append(e)
                    return -1
                made.append(b)
                data[0] = ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value
                nbytes[0] = len(b)
                return 0
            rs.extra_fn = _lib.TrainExtraFn(extra_fn)
        st = self._lib.rg_train_regroup(h, ctypes.byref(rs))
        self._members()
        if made and isinstance(made[-1], BaseException):
            raise made[-1]
        _status.check(st, "rg_train_regroup")
        got = ctypes.string_at(rs.extra, rs.extra_bytes) if rs.received and rs.extra else None
        return Regrouped(rs.rank, rs.world, rs.round, rs.step_out, rs.source, bool(rs.received),
                         Cursor._from_c(rs.cursor), rs.n_received, got)

    # ---- checkpoints -------------------------------------------------------------------

    def latest_checkpoint(self):
        """The newest committed checkpoint's step, the same on every rank; None when there is
        none (or no checkpoint directory). Collective."""
        step = ctypes.c_int64()
        st = self._lib.rg_get_checkpoint(self._handle(), ctypes.byref(step))
        if st != 0 and _status.status_name(st) == "ENOENT":
            return None
        _status.check(st, "rg_get_checkpoint")
        return step.value

    def restore(self, step, tensors):
        """Fills each tensor of {name: tensor} in place with the whole of that tensor from
        checkpoint `step` (any world size may have saved it: it is resharded), and returns
        the data Cursor saved with it. If some rank cannot read `step`, every rank falls back
        to an older one together: self.restored_step says which was read. Collective."""
        h = self._handle()
        items = list(tensors.items())
        reqs = (_lib.CkptRequest * max(len(items), 1))()
        names = []
        for i, (name, obj) in enumerate(items):
            t = _tensor.describe(obj, "restore's tensor %r" % name, writable=True)
            if t.cuda:
                raise TypeError("regroup: restore's tensor %r is a CUDA tensor; checkpoints "
                                "read into host memory" % name)
            b = _name_bytes(name)
            names.append(b)
            rows = t.shape[0] if len(t.shape) > 0 else 1
            reqs[i] = _lib.CkptRequest(b, t.dtype, 0, rows, t.ptr, t.nbytes)
        cur = _lib.DataCursor()
        got = ctypes.c_int64()
        st = self._lib.rg_train_restore(h, int(step), reqs, len(items), ctypes.byref(cur),
                                        ctypes.byref(got))
        _status.check(st, "rg_train_restore")
        self.restored_step = got.value
        return Cursor._from_c(cur)

    def report(self, step, metrics=None, state=None, cursor=None, epoch=None):
        """Publishes progress (step, epoch, metrics {name: float}; epoch defaults to the
        cursor's, the position after the step, else 0). With state
        ({name: tensor}, the same on every rank), also starts an asynchronous checkpoint of
        it at `step`: each rank saves its share of every tensor's rows (dim 0), copying them
        before this returns, and rank 0 saves `cursor` (a Cursor, or a GlobalSampler's
        position). Collective with state: every rank reports state at the same steps.
        Under the launcher it is also the step boundary where notices arrive: it raises
        regroup.MembershipChanged, on every rank at the same step, with .notice (a Notice)
        saying what: a node leaves (notice.preempt; notice.leaving when it is this rank's:
        then take the last checkpoint with leave()) or the membership changes."""
        st = self._call_report(self._lib.rg_report, step, metrics, state, cursor, epoch)
        try:
            _status.check(st, "rg_report")
        except _status.MembershipChanged as e:
            e.notice = self.notice()
            raise

    def wait_checkpoint(self):
        """Waits for the checkpoint the last report started, if one is in flight
        (rg_train_ckpt_wait): this rank's share durable, on rank 0 the checkpoint committed;
        raises its failure. In place, a commit refused because the job moved to a newer round
        meanwhile is no error here: the next report raises MembershipChanged on every rank,
        and the checkpoint is to be taken again in the new round. Not collective."""
        _status.check(self._lib.rg_train_ckpt_wait(self._handle()), "rg_train_ckpt_wait")

    def notice(self):
        """What the last report agreed on (rg_train_notice): a Notice, the same kinds on
        every rank; ms_left counts down from that report. Never blocks."""
        n = _lib.Notice()
        _status.check(self._lib.rg_train_notice(self._handle(), ctypes.byref(n)),
                      "rg_train_notice")
        return Notice._from_c(n)

    def leave(self, step, state=None, cursor=None, metrics=None, epoch=None):
        """The last checkpoint before a node leaves (rg_train_leave), after report raised
        MembershipChanged with notice.preempt, on every rank with the step it reported
        there: saves `state` at `step` (not needed when that report already saved it) and
        waits, within the notice's time left, for its commit. True: committed, the job
        resumes from `step` with no step lost; False: too little time, the job resumes from
        the checkpoint before. Either way the same on every rank, and a restart-mode worker
        (or, in place, one whose notice.leaving is true) then returns from its program
        (exit 0); in place the others regroup. Collective."""
        st = self._call_report(self._lib.rg_train_leave, step, metrics, state, cursor, epoch)
        if st != 0 and _status.status_name(st) == "ETIMEDOUT":
            return False
        _status.check(st, "rg_train_leave")
        return True

    def _call_report(self, fn, step, metrics, state, cursor, epoch):
        """fn (rg_report or rg_train_leave) with the report and the state: its status."""
        h = self._handle()
        keep = []
        rep, cursor = self._report(step, metrics, cursor, epoch, keep)
        st_p = None
        if state is not None:
            st_p = ctypes.byref(self._state(state, cursor, keep))
        return fn(h, ctypes.byref(rep), st_p)

    def _report(self, step, metrics, cursor, epoch, keep):
        """The rg_report_t of report() and leave(), and the cursor as a Cursor."""
        if isinstance(cursor, _Positioned):
            cursor = cursor.cursor
        if epoch is None:
            epoch = cursor.epoch if cursor is not None else 0
        mlist = list((metrics or {}).items())
        if len(mlist) > _lib.RG_TRAIN_MAX_METRICS:
            raise ValueError("regroup: report: %d metrics, at most %d" % (
                len(mlist), _lib.RG_TRAIN_MAX_METRICS))
        marr = (_lib.Metric * max(len(mlist), 1))()
        for i, (k, v) in enumerate(mlist):
            b = _name_bytes(k)
            keep.append(b)
            marr[i] = _lib.Metric(b, float(v))
        keep.append(marr)
        return _lib.Report(int(step), int(epoch), marr, len(mlist)), cursor

    def _state(self, state, cursor, keep):
        items = list(state.items())
        arr = (_lib.CkptTensor * max(len(items), 1))()
        n = 0
        off = ctypes.c_uint32()
        cnt = ctypes.c_uint32()
        for name, obj in items:
            t = _tensor.describe(obj, "report's state tensor %r" % name)
            if t.cuda:
                raise TypeError("regroup: report's state tensor %r is a CUDA tensor; copy it "
                                "to the host for a checkpoint" % name)
            shape = list(t.shape) if len(t.shape) > 0 else [1]
            if len(shape) > _lib.RG_CKPT_MAX_DIMS:
                raise ValueError("regroup: report's state tensor %r has %d dimensions, at "
                                 "most %d" % (name, len(shape), _lib.RG_CKPT_MAX_DIMS))
            if shape[0] >= 2 ** 32:
                raise ValueError("regroup: report's state tensor %r has %d rows, at most "
                                 "2^32 - 1" % (name, shape[0]))
            self._lib.rg_sampler_share(shape[0], self.rank, self.world_size,
                                       ctypes.byref(off), ctypes.byref(cnt))
            if cnt.value == 0:
                continue
            row_bytes = t.nbytes // shape[0] if shape[0] > 0 else 0
            b = _name_bytes(name)
            keep.append(b)
            dims = (ctypes.c_uint64 * _lib.RG_CKPT_MAX_DIMS)(*shape)
            arr[n] = _lib.CkptTensor(b, t.dtype, len(shape), dims, off.value, cnt.value,
                                     t.ptr + off.value * row_bytes, 0)
            n += 1
        c = cursor._c() if cursor is not None else _lib.DataCursor()
        s = _lib.TrainState(arr, n, c)
        keep.append(arr)
        return s


class Table:
    """Context.table(): the rows of a sharded state that this rank holds."""

    def __init__(self, ctx, handle):
        self._ctx = ctx
        self._t = handle
        self.n_rows = ctx._lib.rg_train_table_n_rows(handle)
        self.row_bytes = ctx._lib.rg_train_table_row_bytes(handle)

    def _handle(self):
        if self._t is None:
            raise ValueError("regroup: the table is closed")
        return self._t

    def rows(self):
        """(first, rows): this rank's rows, from row `first` on, as a writable NumPy array of
        uint8, count x row_bytes (view it as the rows' type), over the table's own memory;
        valid until the next regroup (call rows() again after it)."""
        import numpy as np
        first = ctypes.c_uint64()
        count = ctypes.c_uint64()
        p = self._ctx._lib.rg_train_table_rows(self._handle(), ctypes.byref(first),
                                               ctypes.byref(count))
        if not p or count.value == 0:
            return first.value, np.zeros((0, self.row_bytes), np.uint8)
        buf = (ctypes.c_uint8 * (count.value * self.row_bytes)).from_address(p)
        return first.value, np.frombuffer(buf, np.uint8).reshape(count.value, self.row_bytes)

    def commit(self, step):
        """Collective, at the same step on every rank (rg_train_table_commit): keeps this
        rank's rows as those of `step`. Commit after the step's update of the rows and before
        the step's update of the replicated state: the step counts once this returned (on
        PeerError the replicated state is still that of the step before: regroup from it)."""
        _status.check(self._ctx._lib.rg_train_table_commit(self._ctx._handle(), self._handle(),
                                                           int(step)), "rg_train_table_commit")

    def close(self):
        """Frees the table (also done by the context's close). Idempotent."""
        if self._t is not None:
            t, self._t = self._t, None
            self._ctx._lib.rg_train_table_destroy(t)
            if self._ctx._table is self:
                self._ctx._table = None


class _Positioned:
    """Anything with a .cursor (a Cursor) that report() accepts as its cursor."""


def _name_bytes(name):
    if not isinstance(name, str):
        raise TypeError("regroup: a name must be a str, not %s" % type(name).__name__)
    return name.encode()


def _dtype_name(code):
    for k, v in _tensor._BY_NAME.items():
        if v == code:
            return k
    return str(code)


def init(ckpt_dir=None, keep_last=0, comm_timeout_ms=0, staging_bytes=0, in_place=False):
    """Joins the job from the launcher's environment (rg_train_init): collective, blocks until
    every rank of the round has called it. ckpt_dir defaults to $REGROUP_CKPT_DIR (none if
    unset), keep_last to $REGROUP_CKPT_KEEP or 3, comm_timeout_ms (each collective's default
    timeout) to $REGROUP_COMM_TIMEOUT_MS or 30000. in_place: the program regroups in place
    (ctx.regroup on PeerError and MembershipChanged); ctx.in_place is then true under
    `regroup --recovery=in-place` (else false: a failure restarts the job). Returns a
    Context, also usable as `with regroup.init() as ctx:`."""
    return Context(ckpt_dir, keep_last, comm_timeout_ms, staging_bytes, in_place)
