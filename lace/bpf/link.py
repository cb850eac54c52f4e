"""Attach tc programs to a device through tcx links (Linux 6.6 and later), and find classic tc filters.

The kernel resolves the ifindex in the caller's network namespace, so attaching to a device in
another namespace enters it in the calling thread for the syscall (:mod:`lace.bpf.netns`).

A tcx :class:`Link` lives as long as an fd or a pin refers to it: pin it to outlive the process,
:meth:`Link.update` swaps the program atomically, :meth:`Link.detach` removes it even while pinned.
lace attaches through tcx only: a pinned link is what lets a restarted agent adopt its attach points
and CNI CHECK see them, which a classic tc filter (owned by the device's qdisc, with no fd, no pin
and no atomic swap by owner) cannot give. On a kernel without tcx, :func:`attach_tcx` raises
NotSupported. :class:`TcFilter` only *finds* classic filters, so that ``node device list`` can show
programs other tools attached.
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


def attach_tcx(prog: _Prog, ifindex: int, direction: str, *, netns: str | None = None,
               pin_path: str | None = None) -> Link:
    """Attach ``prog`` at the tcx ``direction`` ("ingress"/"egress") hook of ``ifindex``.

    ``ifindex`` is looked up in ``netns`` (a /run/netns name or a path) when given; with
    ``pin_path`` the link is pinned there (and detached again if pinning fails). To replace the
    program behind an existing pinned link use ``Link.open_pinned(path).update(prog)``. Raises
    NotSupported when the kernel has no tcx.
    """
    attach_type = tcx_attach_type(direction)  # libbpf 1.1 predates BPF_TCX_*: pass the integers
    opts = _lb.BpfLinkCreateOpts(sz=ctypes.sizeof(_lb.BpfLinkCreateOpts))
    with _netns.enter(netns):
        fd = _lb.lib.bpf_link_create(prog.fd, ifindex, attach_type, ctypes.byref(opts))
    op = f"attach {getattr(prog, 'name', '?')!r} to tcx {direction} of ifindex {ifindex}"
    if fd < 0:
        err = -fd
        if err in _TCX_UNAVAILABLE:
            raise NotSupported(op, err, "tcx needs Linux 6.6 or later")
        raise error(op, err)
    return pinned(Link(fd, netns=netns), pin_path)


def pinned(link: Link, pin_path: str | None) -> Link:
    """``link``, pinned at ``pin_path`` when one is given; a link that cannot be pinned is closed
    (which detaches it) before the error goes on."""
    if pin_path is not None:
        try:
            link.pin(pin_path)
        except BaseException:
            link.close()
            raise
    return link


@dataclass
class TcFilter:
    """A classic tc BPF filter on a clsact hook, identified by handle/priority: found, never made."""

    ifindex: int
    direction: str
    handle: int
    priority: int
    netns: str | None = None

    def query(self) -> int | None:
        """The id of the program attached as this filter, or None if there is none."""
        if self.direction not in _TC_POINTS:
            raise ValueError(f"direction must be 'ingress' or 'egress', not {self.direction!r}")
        hook = _lb.BpfTcHook(sz=ctypes.sizeof(_lb.BpfTcHook), ifindex=self.ifindex,
                             attach_point=_TC_POINTS[self.direction])
        opts = _lb.BpfTcOpts(sz=ctypes.sizeof(_lb.BpfTcOpts), handle=self.handle, priority=self.priority)
        with _netns.enter(self.netns):
            ret = _lb.lib.bpf_tc_query(ctypes.byref(hook), ctypes.byref(opts))
        if ret in (-errno.ENOENT, -errno.EINVAL):  # the kernel answers EINVAL for an empty hook
            return None
        _lb.check(ret, f"query tc filter {self.handle}:{self.priority} on ifindex {self.ifindex}")
        return int(opts.prog_id)
