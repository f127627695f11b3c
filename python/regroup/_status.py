"""regroup.Error and its subclasses: a library status as a Python exception."""

_lib = None


class Error(Exception):
    """A libregroup call failed.

    status: the status name without its prefix ("ETIMEDOUT"); code: its number (-20);
    message: the library's rg_last_error() of the failing call, naming what failed;
    function: the C function that returned it.
    """

    def __init__(self, status, code, message, function=None):
        self.status = status
        self.code = code
        self.message = message
        self.function = function
        where = "%s: " % function if function else ""
        super().__init__("%s%s: %s" % (where, status, message or "(no message)"))


class PeerError(Error):
    """A peer failed in a collective (EPEER): the group is unusable; the job must regroup."""


class MembershipChanged(Error):
    """rg_report said the membership changes (EMEMBERS: a replacement is ready, a member was
    lost, a node leaves), at the same step on every rank. From ctx.report, .notice (a
    regroup.Notice) says what: on notice.preempt take the last checkpoint (ctx.leave); in
    place, regroup (ctx.regroup) unless this rank's own node leaves (notice.leaving)."""

    notice = None


def bind(lib):
    global _lib
    _lib = lib


def status_name(code):
    name = _lib.rg_status_name(code).decode()
    return name[3:] if name.startswith("RG_") else name


def check(code, function):
    """Raises the Error for a status other than RG_OK (0); returns it otherwise."""
    if code == 0:
        return code
    name = status_name(code)
    msg = _lib.rg_last_error().decode(errors="replace")
    if not msg:
        msg = _lib.rg_status_str(code).decode()
    cls = {"EPEER": PeerError, "EMEMBERS": MembershipChanged}.get(name, Error)
    raise cls(name, code, msg, function)
