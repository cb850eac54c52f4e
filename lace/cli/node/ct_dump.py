"""A conntrack table as ``node ct`` works on it: dumped in one batch sequence and decoded into
NumPy columns (what ``ct list``'s JSON and text writers and ``ct gc`` share)."""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Any

import numpy as np

from lace.datapath.conntrack import CT4_KEY, CT6_KEY, CT_ENTRY


@dataclass
class CtDump:
    """One conntrack table as dumped: its decoded key and entry columns (NumPy structured arrays)."""

    name: str
    family: int
    keys: np.ndarray
    vals: np.ndarray
    capacity: int

    @property
    def count(self) -> int:
        return len(self.keys)


def dump_table(name: str, m: Any) -> CtDump:
    """Dump conntrack table ``name`` from its open map ``m`` (closed here)."""
    family = 6 if name.endswith("v6") else 4
    layout = CT6_KEY if family == 6 else CT4_KEY
    with m:
        kb, vb, n = m.dump()
        cap = m.max_entries
    # the dump's buffers are a fresh mapping per dump that lives as long as these views: no copy
    keys = layout.decode_many(kb, n)
    vals = CT_ENTRY.decode_many(vb, n)
    return CtDump(name, family, keys, vals, cap)


def take(t: CtDump, count: int, start: int = 0) -> CtDump:
    """Rows ``start`` to ``start + count`` of a dump (views, no copy)."""
    return CtDump(t.name, t.family, t.keys[start:start + count], t.vals[start:start + count], t.capacity)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = 256 << 20


def keep_freed_memory() -> None:
    """Ask glibc's malloc to keep freed memory in the process (up to 256 MiB at the heap's top,
    blocks up to 32 MiB from the heap) for the rest of this command.

    Why: formatting a million entries allocates and frees the same few hundred KiB of NumPy
    temporaries for every 4096-row chunk.  By default glibc hands such blocks back to the kernel
    (munmap, or trimming the heap) and the next chunk faults fresh zeroed pages back in: a third
    more page faults and ~10% of the command's time.  The command is short-lived, so keeping the
    memory costs nothing.  Not glibc (no mallopt): nothing changes."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)
