"""Shared plumbing of the verb modules: one pyroute2 handle per call, errors translated, names resolved."""

from __future__ import annotations

import contextlib
import errno
import threading
from typing import Any, Iterator

from pyroute2.iproute import IPRoute
from pyroute2.netlink.exceptions import NetlinkError as _PyrNetlinkError

from . import netns as _netns
from .errors import NetlinkError, where

IFNAMSIZ = 16  # including the NUL: names are at most 15 characters


def check_ifname(ifname: str, op: str, netns: str | None) -> None:
    """Refuse names the kernel would reject, with a message that says why."""
    if not ifname or len(ifname) >= IFNAMSIZ or "/" in ifname or any(c.isspace() for c in ifname):
        raise NetlinkError(op, where(repr(ifname), netns), errno.EINVAL,
                           f"not a valid interface name (1-{IFNAMSIZ - 1} characters, no '/' or spaces)")


@contextlib.contextmanager
def translated(op: str, target: str) -> Iterator[None]:
    """Turn pyroute2 and OS exceptions raised in the block into NetlinkError(op, target, ...)."""
    try:
        yield
    except NetlinkError:
        raise
    except _PyrNetlinkError as exc:
        raise NetlinkError(op, target, int(exc.code or 0),
                           None if exc.code else str(exc)) from None
    except OSError as exc:
        raise NetlinkError(op, target, exc.errno or 0, None if exc.errno else str(exc)) from None


_local = threading.local()


@contextlib.contextmanager
def reuse() -> Iterator[None]:
    """Within the block, the calling thread keeps one handle per namespace instead of opening
    one per operation (a dozen operations on a pod's interfaces then cost one socket each side)."""
    outer = getattr(_local, "cache", None)
    if outer is not None:
        yield
        return
    _local.cache = {}
    try:
        yield
    finally:
        cache, _local.cache = _local.cache, None
        for ip in cache.values():
            with contextlib.suppress(Exception):
                ip.close()


@contextlib.contextmanager
def handle(op: str, target: str, netns: str | None) -> Iterator[IPRoute]:
    """An IPRoute in NETNS for one operation; every failure is reported as ``op target``."""
    cache = getattr(_local, "cache", None)
    with translated(op, target):
        if cache is not None:
            ip = cache.get(netns)
            if ip is None:
                ip = cache[netns] = _netns.ipr(netns)
            yield ip
            return
        ip = _netns.ipr(netns)
        try:
            yield ip
        finally:
            with contextlib.suppress(Exception):
                ip.close()


def index_of(ip: IPRoute, ifname: str | int, op: str, netns: str | None) -> int:
    """The ifindex of ``ifname`` (an int is taken as an ifindex already)."""
    if isinstance(ifname, int):
        return ifname
    found = ip.link_lookup(ifname=ifname)
    if not found:
        raise NetlinkError(op, where(ifname, netns), errno.ENODEV, "no such interface")
    return int(found[0])


def attr(msg: Any, name: str, default: Any = None) -> Any:
    value = msg.get(name)
    return default if value is None else value
