"""Named network namespaces (/run/netns/NAME, as iproute2 keeps them) and running code inside them.

A namespace is created by a short-lived thread that unshares its own network namespace and
bind-mounts it at /run/netns/NAME: namespaces are per thread in Linux, so neither the process nor
its other threads move, and no helper process is forked (pyroute2's ``netns.create`` forks one;
forking a threaded agent is what we avoid).  The same trick gives :func:`ipr` its handles: the
netlink socket is opened by a thread inside the namespace, stays bound to it, and is handed to
pyroute2 as a file descriptor.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import socket
import threading
from typing import Any, Callable, Iterator, TypeVar

from pyroute2.iproute import IPRoute

from lace import nsenter

from .errors import NetlinkError

NETNS_RUN_DIR = nsenter.NETNS_RUN_DIR
CLONE_NEWNET = nsenter.CLONE_NEWNET
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_SHARED = 1 << 20
_MNT_DETACH = 2
_NETLINK_ROUTE = 0

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_rundir_lock = threading.Lock()
T = TypeVar("T")


def path(name: str) -> str:
    """``/run/netns/NAME`` for a name; anything containing a slash is taken as a path already."""
    if "/" in name:
        return name
    if not name or name in (".", "..") or len(name) > 255:
        raise NetlinkError("use netns", repr(name), errno.EINVAL, "not a valid namespace name")
    return os.path.join(NETNS_RUN_DIR, name)


def _nsfs_dev() -> int:
    return os.stat("/proc/self/ns/net").st_dev


def exists(name: str) -> bool:
    """Whether NAME is a live namespace mount (a leftover empty file does not count)."""
    try:
        return os.stat(path(name)).st_dev == _nsfs_dev()
    except OSError:
        return False


def inode(name: str) -> int:
    """The namespace's inode number: equal to ``os.stat('/proc/PID/ns/net').st_ino`` of its members."""
    try:
        st = os.stat(path(name))
    except OSError as exc:
        raise NetlinkError("stat netns", name, exc.errno or 0) from None
    if st.st_dev != _nsfs_dev():
        raise NetlinkError("stat netns", name, errno.ENOENT, "no such network namespace")
    return st.st_ino


def list_netns(prefix: str = "") -> list[str]:
    """Names of the live namespaces under /run/netns starting with ``prefix``, sorted."""
    try:
        names = os.listdir(NETNS_RUN_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix) and exists(n))


def _check(rc: int, op: str, target: str) -> None:
    if rc != 0:
        raise NetlinkError(op, target, ctypes.get_errno())


def run_in(name: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` in a short-lived thread inside namespace NAME; return its result.

    Exceptions raised by ``fn`` propagate to the caller.  ``None`` runs it in the caller's
    namespace (in a thread all the same, so behaviour does not depend on the argument).
    """
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            with entered(name):
                box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=body, name=f"netns:{name}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


@contextlib.contextmanager
def entered(name: str | None) -> Iterator[None]:
    """Run the block with the calling THREAD inside namespace NAME and always come back.

    Only this thread moves (setns(2) on a network namespace is per thread; :mod:`lace.nsenter`
    does it).  ``None`` stays put.
    """
    if name is None:
        yield
        return
    target = path(name)

    def translate(exc: nsenter.NetnsError) -> NetlinkError:
        err = exc.errno or 0
        if exc.step == "open":
            return NetlinkError("enter netns", name, err,
                                "no such network namespace" if err == errno.ENOENT else None)
        if exc.step == "save":
            return NetlinkError("open", "the current netns", err)
        if exc.step == "enter":
            return NetlinkError("enter netns", name, err)
        return NetlinkError("return from netns", name, err)   # "return": the thread may be stranded

    with nsenter.entered(target, translate=translate):
        yield


def _share_rundir() -> None:
    # Ported from iproute2: /run/netns is a shared mount so the bind mounts made here are seen
    # by other mount namespaces (containers, systemd services).
    os.makedirs(NETNS_RUN_DIR, exist_ok=True)
    rundir = NETNS_RUN_DIR.encode()
    if _libc.mount(b"", rundir, b"none", _MS_SHARED | _MS_REC, None) == 0:
        return
    _check(_libc.mount(rundir, rundir, b"none", _MS_BIND | _MS_REC, None), "bind-mount", NETNS_RUN_DIR)
    _check(_libc.mount(b"", rundir, b"none", _MS_SHARED | _MS_REC, None), "share mount", NETNS_RUN_DIR)


def _create_in_thread(name: str, target: str) -> None:
    # this thread is thrown away afterwards, so it never has to leave the new namespace
    _check(_libc.unshare(CLONE_NEWNET), "unshare for netns", name)
    _check(_libc.mount(b"/proc/thread-self/ns/net", target.encode(), b"none", _MS_BIND, None),
           "bind-mount netns", name)


def create(name: str) -> str:
    """Ensure namespace NAME exists (idempotent); returns its path."""
    target = path(name)
    with _rundir_lock:
        if exists(name):
            return target
        _share_rundir()
        try:
            os.close(os.open(target, os.O_RDONLY | os.O_CREAT, 0o444))
        except OSError as exc:
            raise NetlinkError("create netns", name, exc.errno or 0) from None
        box: dict[str, BaseException] = {}

        def body() -> None:
            try:
                _create_in_thread(name, target)
            except BaseException as exc:
                box["error"] = exc

        t = threading.Thread(target=body, name=f"netns-create:{name}", daemon=True)
        t.start()
        t.join()
        if "error" in box:
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise box["error"]
    return target


def delete(name: str) -> None:
    """Ensure namespace NAME is gone (idempotent).

    The kernel frees the namespace, and the links inside it, once the last process and open
    descriptor let go; veth peers elsewhere disappear with it.
    """
    target = path(name)
    with _rundir_lock:
        if _libc.umount2(target.encode(), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):
                raise NetlinkError("unmount netns", name, err)
        try:
            os.unlink(target)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise NetlinkError("delete netns", name, exc.errno or 0) from None


def _netlink_socket_fd() -> int:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
    return sock.detach()


def ipr(name: str | None = None) -> IPRoute:
    """A pyroute2 IPRoute bound to namespace NAME (None: the calling thread's namespace).

    Close it (``with ipr(ns) as ip: ...``) and use it from the thread that made it: pyroute2
    keeps per-thread state.
    """
    if name is None:
        try:
            return IPRoute()
        except OSError as exc:
            raise NetlinkError("open netlink socket", "in the current netns", exc.errno or 0) from None
    fd = run_in(name, _netlink_socket_fd)
    try:
        return IPRoute(fileno=fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise NetlinkError("open netlink socket", f"in netns {name}", exc.errno or 0) from None


def _sysctl_path(key: str) -> str:
    rel = key if "/" in key else key.replace(".", "/")
    if ".." in rel.split("/"):
        raise NetlinkError("sysctl", key, errno.EINVAL, "not a sysctl key")
    return os.path.join("/proc/sys", rel.lstrip("/"))


def _sysctl_rw(key: str, value: object | None) -> str:
    p = _sysctl_path(key)
    try:
        if value is not None:
            with open(p, "w") as f:
                f.write(str(value))
        with open(p) as f:
            return f.read().strip()
    except OSError as exc:
        raise NetlinkError("write sysctl" if value is not None else "read sysctl", key, exc.errno or 0) from None


def sysctl(netns: str | None, key: str, value: object | None = None) -> str:
    """Write (when ``value`` is given) and read back a sysctl inside NETNS.

    ``key`` is dotted (``net.ipv6.conf.all.forwarding``) or a path under /proc/sys (needed when an
    interface name contains a dot).  /proc/sys/net resolves the namespace of the thread that opens
    it, so this runs in a thread inside NETNS.
    """
    try:
        return run_in(netns, _sysctl_rw, key, value)
    except NetlinkError as exc:
        if netns and exc.target == key:
            raise NetlinkError(exc.op, f"{key} in netns {netns}", exc.errno) from None
        raise
