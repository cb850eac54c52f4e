"""Attach tc programs to a device: tcx links (kernel ≥ 6.6) with a classic tc (clsact) fallback.

The kernel resolves the ifindex in the caller's network namespace, so attaching to a device in
another namespace enters it in the calling thread for the syscall (:mod:`lace.bpf.netns`).

A tcx :class:`Link` lives as long as an fd or a pin refers to it: pin it to outlive the process,
:meth:`Link.update` swaps the program atomically, :meth:`Link.detach` removes it even while pinned.
A :class:`TcFilter` (the fallback) is owned by the device's clsact qdisc, not by an fd.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from typing import Protocol

from . import _libbpf as _lb
from . import netns as _netns
from .fd import FdObject
from .errors import ENOTSUPP, BPFError, NotSupported, error
from .info import LinkInfo, link_info_fd, tcx_attach_type

_TC_POINTS = {"ingress": _lb.BPF_TC_INGRESS, "egress": _lb.BPF_TC_EGRESS}
_TCX_UNAVAILABLE = (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP)


class _Prog(Protocol):
    @property
    def fd(self) -> int: ...

    name: str


class Link(FdObject):
    """A BPF link (here: tcx); owns its fd.  Closing an unpinned link's last fd detaches it."""

    _kind = "link"

    def __init__(self, fd: int, *, pin_path: str | None = None, netns: str | None = None) -> None:
        self._fd = fd
        self.pin_path = pin_path
        self.netns = netns
        try:
            self.id = link_info_fd(fd).id
        except BPFError:
            os.close(fd)
            raise

    @classmethod
    def open_pinned(cls, path: str) -> Link:
        """Open the link pinned at ``path`` (e.g. to :meth:`update` it to a new program)."""
        return cls(cls._obj_get(path, "link"), pin_path=path)

    def _label(self) -> str:
        return str(self.id)

    def info(self) -> LinkInfo:
        return link_info_fd(self.fd)

    def update(self, prog: _Prog) -> None:
        """Atomically replace the attached program with ``prog``."""
        ret = _lb.lib.bpf_link_update(self.fd, prog.fd, None)
        _lb.check(ret, f"update link {self.id} to program {getattr(prog, 'name', '?')!r}")

    def detach(self) -> None:
        """Detach the program now, even if the link is pinned or shared (it becomes defunct)."""
        _lb.check(_lb.lib.bpf_link_detach(self.fd), f"detach link {self.id}")

    def __repr__(self) -> str:
        return f"Link(id={self.id}, pin_path={self.pin_path!r})"


def attach_tcx(prog: _Prog, ifindex: int, direction: str, *, netns: str | None = None) -> Link:
    """Attach ``prog`` at the tcx ``direction`` ("ingress"/"egress") hook of ``ifindex``.

    ``ifindex`` is looked up in ``netns`` (a /run/netns name or a path) when given.  Raises
    NotSupported when the kernel has no tcx (callers fall back to :func:`attach_tc`).
    """
    attach_type = tcx_attach_type(direction)  # libbpf 1.1 predates BPF_TCX_*: pass the integers
    opts = _lb.BpfLinkCreateOpts(sz=ctypes.sizeof(_lb.BpfLinkCreateOpts))
    with _netns.enter(netns):
        fd = _lb.lib.bpf_link_create(prog.fd, ifindex, attach_type, ctypes.byref(opts))
    op = f"attach {getattr(prog, 'name', '?')!r} to tcx {direction} of ifindex {ifindex}"
    if fd < 0:
        err = -fd
        if err in _TCX_UNAVAILABLE:
            raise NotSupported(op, err, "tcx needs Linux 6.6+ (use attach_tc or attach(prefer='tc'))")
        raise error(op, err)
    return Link(fd, netns=netns)


@dataclass
class TcFilter:
    """A classic tc BPF filter (direct-action) on a clsact hook, identified by handle/priority."""

    ifindex: int
    direction: str
    handle: int
    priority: int
    prog_id: int
    netns: str | None = None

    pin_path = None  # tc filters cannot be pinned; present for symmetry with Link

    def _hook(self) -> _lb.BpfTcHook:
        return _lb.BpfTcHook(
            sz=ctypes.sizeof(_lb.BpfTcHook), ifindex=self.ifindex, attach_point=_TC_POINTS[self.direction]
        )

    def query(self) -> int | None:
        """The id of the program now attached as this filter, or None if the filter is gone."""
        hook = self._hook()
        opts = _lb.BpfTcOpts(sz=ctypes.sizeof(_lb.BpfTcOpts), handle=self.handle, priority=self.priority)
        with _netns.enter(self.netns):
            ret = _lb.lib.bpf_tc_query(ctypes.byref(hook), ctypes.byref(opts))
        if ret in (-errno.ENOENT, -errno.EINVAL):  # the kernel answers EINVAL for an empty hook
            return None
        _lb.check(ret, f"query tc filter {self.handle}:{self.priority} on ifindex {self.ifindex}")
        return int(opts.prog_id)

    def update(self, prog: _Prog) -> None:
        """Replace the filter's program (BPF_TC_F_REPLACE on the same handle/priority)."""
        self.prog_id = _tc_attach(prog, self.ifindex, self.direction, self.netns, self.priority, self.handle, True)

    def detach(self) -> None:
        """Remove the filter (an already removed filter is not an error)."""
        hook = self._hook()
        opts = _lb.BpfTcOpts(sz=ctypes.sizeof(_lb.BpfTcOpts), handle=self.handle, priority=self.priority)
        with _netns.enter(self.netns):
            ret = _lb.lib.bpf_tc_detach(ctypes.byref(hook), ctypes.byref(opts))
        if ret in (-errno.ENOENT, -errno.ENODEV):
            return
        _lb.check(ret, f"detach tc filter {self.handle}:{self.priority} from ifindex {self.ifindex}")

    def close(self) -> None:
        """Nothing to release: the filter belongs to the device until :meth:`detach`."""


def _tc_attach(
    prog: _Prog, ifindex: int, direction: str, netns: str | None, priority: int, handle: int, replace: bool
) -> int:
    if direction not in _TC_POINTS:
        raise ValueError(f"direction must be 'ingress' or 'egress', not {direction!r}")
    hook = _lb.BpfTcHook(sz=ctypes.sizeof(_lb.BpfTcHook), ifindex=ifindex, attach_point=_TC_POINTS[direction])
    opts = _lb.BpfTcOpts(
        sz=ctypes.sizeof(_lb.BpfTcOpts),
        prog_fd=prog.fd,
        handle=handle,
        priority=priority,
        flags=_lb.BPF_TC_F_REPLACE if replace else 0,
    )
    what = f"tc {direction} of ifindex {ifindex}"
    with _netns.enter(netns):
        ret = _lb.lib.bpf_tc_hook_create(ctypes.byref(hook))
        if ret < 0 and ret != -errno.EEXIST:
            raise error(f"create clsact qdisc for {what}", -ret)
        ret = _lb.lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts))
    _lb.check(ret, f"attach {getattr(prog, 'name', '?')!r} to {what}")
    return int(opts.prog_id)


def attach_tc(
    prog: _Prog,
    ifindex: int,
    direction: str,
    *,
    netns: str | None = None,
    priority: int = 1,
    handle: int = 1,
    replace: bool = True,
) -> TcFilter:
    """Attach ``prog`` as a direct-action tc filter (clsact created if missing)."""
    prog_id = _tc_attach(prog, ifindex, direction, netns, priority, handle, replace)
    return TcFilter(ifindex, direction, handle, priority, prog_id, netns)


def attach(
    prog: _Prog,
    ifindex: int,
    direction: str,
    *,
    netns: str | None = None,
    pin_path: str | None = None,
    prefer: str = "tcx",
) -> Link | TcFilter:
    """Attach with tcx (pinned at ``pin_path`` if given), falling back to tc when tcx is missing.

    ``prefer="tc"`` forces the tc fallback.  To replace the program behind an existing pinned
    link use ``Link.open_pinned(path).update(prog)``.
    """
    if prefer not in ("tcx", "tc"):
        raise ValueError(f"prefer must be 'tcx' or 'tc', not {prefer!r}")
    if prefer == "tcx":
        try:
            link = attach_tcx(prog, ifindex, direction, netns=netns)
        except NotSupported:
            pass
        else:
            if pin_path is not None:
                try:
                    link.pin(pin_path)
                except BaseException:
                    link.close()  # unpinned: closing detaches
                    raise
            return link
    return attach_tc(prog, ifindex, direction, netns=netns)
