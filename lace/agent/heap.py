"""The agent's C heap: one malloc arena for all its threads, and free pages handed back to the
kernel after a full pass.

A full pass in a large cluster allocates and frees tens of megabytes (the snapshot, every map's
entries, the diff). Objects larger than CPython's small-object allocator takes come from glibc's
malloc, which by default gives every thread that allocates an arena of its own (up to eight per
core): the watch, the pass, the flow reader and the API each fragment their own, and a block one
thread frees is reused only by that thread's later allocations. The GIL runs one thread's Python
at a time, so the arenas buy no parallelism; with one (``mallopt(M_ARENA_MAX, 1)``, what
``MALLOC_ARENA_MAX=1`` does, set before the agent starts a thread) the agent at 10k pods settled
5-10 MiB lower. ``malloc_trim(0)`` then releases every whole free page of the heap
(``madvise(MADV_DONTNEED)``); it takes well under a millisecond here. On a C library without
these, nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: glibc's mallopt parameter for the number of arenas (malloc.h)
M_ARENA_MAX = -8

try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _malloc_trim = _libc.malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
    _malloc_trim.restype = ctypes.c_int
    _mallopt = _libc.mallopt
    _mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _mallopt.restype = ctypes.c_int
except (OSError, AttributeError):   # not glibc
    _malloc_trim = _mallopt = None


def one_arena() -> bool:
    """Have every thread allocate from the main arena (call before starting threads); True when
    the C library took it."""
    return _mallopt is not None and _mallopt(M_ARENA_MAX, 1) == 1


def release_free_memory() -> None:
    """Give free heap pages back to the kernel (glibc's ``malloc_trim``)."""
    if _malloc_trim is not None:
        _malloc_trim(0)
