"""bpffs: where pinned maps, programs and links live; mounted here when the host has not."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from .errors import BPFError

BPFFS = "/sys/fs/bpf"
_BPF_FS_MAGIC = 0xCAFE4A11


def is_bpffs(path: str = BPFFS) -> bool:
    """Whether ``path`` is the root of a mounted bpffs (per /proc/self/mounts)."""
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == real and line.split()[2] == "bpf" for line in f)


def ensure_bpffs(path: str = BPFFS) -> str:
    """Mount bpffs at ``path`` unless it already is one (as systemd does at boot); returns path."""
    if is_bpffs(path):
        return path
    os.makedirs(path, exist_ok=True)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.mount(b"bpf", path.encode(), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise BPFError(f"mount bpffs at {path}", err)
    return path
