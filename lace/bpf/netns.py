"""Enter a network namespace in the calling thread only, and always come back.

setns(2) on a network namespace affects just the calling thread, which is what the bpf() calls
that resolve an ifindex need (tcx link create, prog query).  Only the calling thread moves, so
other threads (and the rest of the process) keep their namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator

from . import _libbpf as _lb
from .errors import BPFError

NETNS_RUN_DIR = "/run/netns"


def path_of(name_or_path: str) -> str:
    """``/run/netns/NAME`` for a bare name; paths (anything with a slash) are used as given."""
    return name_or_path if "/" in name_or_path else os.path.join(NETNS_RUN_DIR, name_or_path)


def _setns(fd: int, what: str) -> None:
    if _lb.libc.setns(fd, _lb.CLONE_NEWNET) != 0:
        raise BPFError(f"setns into {what}", ctypes.get_errno())


@contextlib.contextmanager
def enter(name_or_path: str | None) -> Iterator[None]:
    """Run the block with the calling thread in the given network namespace (None: stay put)."""
    if name_or_path is None:
        yield
        return
    target = path_of(name_or_path)
    try:
        target_fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BPFError(f"open network namespace {target}", exc.errno or 0) from None
    try:
        orig_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        os.close(target_fd)
        raise BPFError("open current network namespace", exc.errno or 0) from None
    try:
        _setns(target_fd, target)
        try:
            yield
        finally:
            # Failing to come back would leave this thread in the wrong namespace: never ignore it.
            _setns(orig_fd, "the original network namespace")
    finally:
        os.close(target_fd)
        os.close(orig_fd)
