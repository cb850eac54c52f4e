"""Attach cgroup socket programs through BPF links: socket-address hooks (connect, sendmsg,
recvmsg, getpeername) and the socket-release hook (sock_release, a ``cgroup/sock_release`` program).

A cgroup :class:`~lace.bpf.link.Link` applies to every process in the cgroup and its descendants,
lives as long as an fd or a pin refers to it, and swaps its program atomically with
:meth:`~lace.bpf.link.Link.update`. Several links may sit on one hook (the kernel runs them all),
so a restarted owner must update its pinned links rather than attach again:
:func:`cgroup_link_target` tells whether a pinned link still sits on the cgroup and hook it should.
When the cgroup is removed the kernel detaches its links: the pins stay, pointing at nothing
(target cgroup ID 0), and updating them fails with ENOLINK.
"""

from __future__ import annotations

import ctypes
import os
from typing import Protocol

from . import _libbpf as _lb
from .errors import NotSupported, error
from .info import _get_info
from .link import Link, pinned

#: hook name -> enum bpf_attach_type (uapi bpf.h); the names follow libbpf's "cgroup/<hook>" sections
ATTACH_TYPES: dict[str, int] = {
    "connect4": 10, "connect6": 11, "sendmsg4": 14, "sendmsg6": 15,
    "recvmsg4": 19, "recvmsg6": 20, "getpeername4": 29, "getpeername6": 30,
    "sock_release": 34,   # BPF_CGROUP_INET_SOCK_RELEASE
}  # fmt: skip
BPF_LINK_TYPE_CGROUP = 3


class _Prog(Protocol):
    @property
    def fd(self) -> int: ...

    name: str


def attach_type(hook: str) -> int:
    try:
        return ATTACH_TYPES[hook]
    except KeyError:
        raise ValueError(f"unknown cgroup hook {hook!r}; known hooks: {', '.join(ATTACH_TYPES)}") from None


def cgroup_id(path: str) -> int:
    """The kernel's ID of the cgroup2 directory ``path`` (its inode number)."""
    return os.stat(path).st_ino


def attach_cgroup(prog: _Prog, cgroup: str, hook: str, *, pin_path: str | None = None) -> Link:
    """Attach ``prog`` at ``hook`` (a key of :data:`ATTACH_TYPES`) of the cgroup2 directory
    ``cgroup``; with ``pin_path`` the link is pinned there (and detached again if pinning fails).

    The program must have been loaded for that hook (its ``cgroup/<hook>`` section). To replace
    the program behind an existing pinned link use ``Link.open_pinned(path).update(prog)``.
    """
    kind = attach_type(hook)
    op = f"attach {getattr(prog, 'name', '?')!r} to cgroup {hook} of {cgroup}"
    try:
        cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise error(op, exc.errno or 0, exc.strerror) from None
    try:
        opts = _lb.BpfLinkCreateOpts(sz=ctypes.sizeof(_lb.BpfLinkCreateOpts))
        fd = _lb.lib.bpf_link_create(prog.fd, cg, kind, ctypes.byref(opts))
    finally:
        os.close(cg)
    if fd < 0:
        err = error(op, -fd)
        if isinstance(err, NotSupported):
            raise NotSupported(op, -fd, "cgroup links need Linux 5.7 or later")
        raise err
    return pinned(Link(fd), pin_path)


def cgroup_link_target(link: Link) -> tuple[int, int] | None:
    """(cgroup ID, attach type) of a cgroup link; cgroup ID 0 once its cgroup is gone.
    None when ``link`` is not a cgroup link."""
    i = _lb.BpfLinkInfo()
    _get_info(link.fd, i, f"link {link.id} info")
    if i.type != BPF_LINK_TYPE_CGROUP:
        return None
    raw = bytes(i.u)
    return int.from_bytes(raw[0:8], "little"), int.from_bytes(raw[8:12], "little")
