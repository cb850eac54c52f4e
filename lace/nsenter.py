"""Entering a network namespace: the one place lace calls setns(2).  Stdlib only.

A network namespace is per *thread* in Linux: :func:`entered` moves the calling thread alone into a
namespace for the length of a ``with`` block and always brings it back, so the rest of the process
keeps its namespace.  Namespaces are named as iproute2 keeps them (``NAME`` is ``/run/netns/NAME``)
or given as a path (anything with a slash, e.g. ``/proc/PID/ns/net``).

Layers that have their own error type (lace.bpf, lace.netlink) pass ``translate``, which turns the
:class:`NetnsError` describing the failed step into their exception; the block's own exceptions are
never touched.  :func:`setns` is the bare call, for a child between fork and exec.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno as _errno
import os
from typing import Callable, Iterator, TypeVar

NETNS_RUN_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
#: the calling thread's own network namespace
THREAD_NETNS = "/proc/thread-self/ns/net"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.setns.restype = ctypes.c_int


class NetnsError(OSError):
    """Entering or leaving a network namespace failed.

    ``step`` says where: ``"open"`` (the target namespace), ``"save"`` (the calling thread's own
    namespace, to come back to), ``"enter"`` (setns into the target) or ``"return"`` (setns back:
    the thread may be stranded in the target); ``target`` is the namespace's path.
    """

    def __init__(self, step: str, target: str, errno: int) -> None:
        self.step = step
        self.target = target
        super().__init__(errno, os.strerror(errno) if errno else "failed", target)


Translate = Callable[[NetnsError], BaseException]
T = TypeVar("T")


def path_of(name_or_path: str) -> str:
    """``/run/netns/NAME`` for a bare name; a path (anything with a slash) as given."""
    return name_or_path if "/" in name_or_path else os.path.join(NETNS_RUN_DIR, name_or_path)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at ``fd``; OSError on failure.

    One syscall and nothing else, so it is safe in a ``preexec_fn`` between fork and exec."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), "setns")


def _fail(exc: NetnsError, translate: Translate | None) -> BaseException:
    return translate(exc) if translate is not None else exc


@contextlib.contextmanager
def entered(name_or_path: str | None, *, translate: Translate | None = None) -> Iterator[None]:
    """Run the block with the calling thread in the given network namespace (None: stay put).

    Failures to get in or out raise :class:`NetnsError`, or what ``translate`` makes of it.
    """
    if name_or_path is None:
        yield
        return
    target = path_of(name_or_path)

    def step(name: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except OSError as exc:
            raise _fail(NetnsError(name, target, exc.errno or _errno.EIO), translate) from None

    with contextlib.ExitStack() as fds:
        target_fd = step("open", lambda: os.open(target, os.O_RDONLY | os.O_CLOEXEC))
        fds.callback(os.close, target_fd)
        orig_fd = step("save", lambda: os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC))
        fds.callback(os.close, orig_fd)
        step("enter", lambda: setns(target_fd))
        try:
            yield
        finally:
            # Staying in the wrong namespace would silently misdirect every later call: never ignore it.
            step("return", lambda: setns(orig_fd))


__all__ = ["NETNS_RUN_DIR", "CLONE_NEWNET", "NetnsError", "entered", "path_of", "setns"]
