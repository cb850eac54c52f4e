"""BPF iterators: a program that walks kernel objects (maps, sockets) when its file is read
(:class:`Iterator`), and every hash map's entry count as the kernel keeps it, read through one
(:class:`MapEntryCounts`).

Linux 6.6 and later count the elements of each hash map (per-CPU insert and delete counters, LRU
evictions included), and a BPF program reads a map's count with the ``bpf_map_sum_elem_count``
kfunc. A map iterator program (``SEC("iter/bpf_map")``) that writes one line ``<map id> <count>``
per map in the kernel makes every count one read of the iterator: microseconds for all the maps,
where walking a map's entries from user space costs time and copies in proportion to its size
(~0.5 s for a hash map of 1M entries). The kernel keeps no count for other map types (a trie, an
array): :meth:`MapEntryCounts.entries` walks those.

The caller names the compiled iterator object and its program; loading fails with the kernel's
or libbpf's error where the kfunc or iterators are missing (an older kernel, no BTF), and the
caller can fall back to :meth:`lace.bpf.Map.count`.
"""

from __future__ import annotations

import ctypes
import os

from . import _libbpf as _lb
from .errors import error
from .maps import HASH, LRU_HASH, LRU_PERCPU_HASH, PERCPU_HASH, Map
from .object import ObjectSpec

#: the map types whose elements the kernel counts
COUNTED_TYPES = frozenset({HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH})


class Iterator:
    """An iterator program loaded from its object (its maps private, never pinned) and linked:
    each :meth:`read` runs one walk and returns what the program printed. A socket iterator walks
    the sockets of the network namespace of the thread that reads it. Close it when done."""

    def __init__(self, object_path: str, program: str) -> None:
        self.obj = ObjectSpec.open(object_path).private().load()
        self._link = -1
        try:
            prog = self.obj.programs[program]
            opts = _lb.BpfLinkCreateOpts(sz=ctypes.sizeof(_lb.BpfLinkCreateOpts))
            fd = _lb.lib.bpf_link_create(prog.fd, 0, _lb.BPF_TRACE_ITER, ctypes.byref(opts))
            if fd < 0:
                raise error(f"attach iterator {program!r}", -fd)
            self._link = fd
        except BaseException:
            self.obj.close()
            raise

    def read(self) -> bytes:
        """One walk: everything the program printed."""
        fd = _lb.lib.bpf_iter_create(self._link)
        if fd < 0:
            raise error("read the iterator", -fd)
        chunks = []
        try:
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks)

    def close(self) -> None:
        if self._link >= 0:
            os.close(self._link)
            self._link = -1
        self.obj.close()

    def __enter__(self) -> Iterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MapEntryCounts:
    """A loaded map iterator program and its link; :meth:`read` runs it. Close it when done."""

    def __init__(self, object_path: str, program: str) -> None:
        self._it = Iterator(object_path, program)

    def read(self) -> dict[int, int]:
        """Map ID -> the kernel's count of its entries (0 for a type it does not count)."""
        out = {}
        for line in self._it.read().split(b"\n"):
            if line:
                map_id, n = line.split()
                out[int(map_id)] = int(n)
        return out

    def entries(self, maps: dict[str, Map]) -> dict[str, int]:
        """Each map's entries: the kernel's count for a hash map (one read of the iterator for
        all of them), a walk for any other type (an array's every slot, as Map.count says)."""
        counts = self.read() if any(m.type in COUNTED_TYPES for m in maps.values()) else {}
        return {name: counts[m.id] if m.type in COUNTED_TYPES and m.id in counts else m.count()
                for name, m in maps.items()}

    def close(self) -> None:
        self._it.close()

    def __enter__(self) -> MapEntryCounts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
