"""Consume a BPF ring buffer map (BPF_MAP_TYPE_RINGBUF): through libbpf's ring_buffer API
(:class:`RingBuffer`, a callback per record) or in bulk through the map's memory mapping
(:class:`RingReader`, for readers that must keep up with hundreds of thousands of records a second)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import select
from typing import Callable

import numpy as np

from . import _libbpf as _lb
from .fd import Owned
from .errors import NotSupported, error
from .maps import RINGBUF, Map

Callback = Callable[[bytes], "int | None"]


class RingBuffer(Owned):
    """Delivers each record of a ring buffer map to ``callback(data: bytes)``.

    A callback returning a non-zero int stops the current poll/consume (libbpf semantics); an
    exception raised by the callback stops it too and is re-raised from :meth:`poll`/:meth:`consume`.
    :meth:`fileno` is an epoll fd for use with ``selectors``/asyncio.
    """

    def __init__(self, map: Map, callback: Callback) -> None:
        if map.type != RINGBUF:
            raise ValueError(f"map {map.name!r} is a {map.type_name} map, not a ringbuf")
        self.map = map
        self._callback = callback
        self._exc: BaseException | None = None
        self._cb = _lb.RingBufferSampleFn(self._on_sample)  # kept alive as long as the ring buffer
        ptr = _lb.lib.ring_buffer__new(map.fd, self._cb, None, None)
        if not ptr:
            raise error(f"open ring buffer {map.name!r}", _lb.errno_now() or errno.EINVAL)
        self._ptr: int | None = ptr

    def _on_sample(self, _ctx: int | None, data: int | None, size: int) -> int:
        try:
            ret = self._callback(ctypes.string_at(data, size) if data else b"")
            return int(ret or 0)
        except BaseException as exc:  # never unwind through C: stop and re-raise in poll()
            self._exc = exc
            return -errno.ECANCELED

    def _finish(self, ret: int, op: str) -> int:
        if self._exc is not None:
            exc, self._exc = self._exc, None
            raise exc
        if ret == -errno.EINTR:
            return 0
        if ret < 0:
            raise error(f"{op} ring buffer {self.map.name!r}", -ret)
        return ret

    def _handle(self) -> int:
        if self._ptr is None:
            raise ValueError(f"ring buffer {self.map.name!r} is closed")
        return self._ptr

    def poll(self, timeout_ms: int = -1) -> int:
        """Wait up to ``timeout_ms`` (-1: forever) for records and deliver them; returns how many."""
        return self._finish(_lb.lib.ring_buffer__poll(self._handle(), timeout_ms), "poll")

    def consume(self) -> int:
        """Deliver every record available now without waiting; returns how many."""
        return self._finish(_lb.lib.ring_buffer__consume(self._handle()), "consume")

    def fileno(self) -> int:
        return int(_lb.lib.ring_buffer__epoll_fd(self._handle()))

    def close(self) -> None:
        if self._ptr is not None:
            _lb.lib.ring_buffer__free(self._ptr)
            self._ptr = None


#: ring buffer record header (uapi/linux/bpf.h): u32 length with these two flag bits, u32 page offset
_HDR = 8
_BUSY = 1 << 31
_DISCARD = 1 << 30


class RingReader(Owned):
    """Reads a ring buffer's records in bulk from its memory mapping: no call per record.

    libbpf's ``ring_buffer__poll`` calls back into Python once per record (about 1.3 µs each
    through ctypes), which alone would take a quarter of a core at 200,000 records a second.  This
    reader maps the ring as libbpf does (the consumer position page read-write; the producer
    position page and the data pages, mapped twice in a row so that a record wrapping around the
    end is contiguous, read-only) and does libbpf's consumer loop over all records at once: it
    reads the producer position, then the headers of records of the expected size with one
    vectorized gather (a header whose busy bit is still set ends the read: that record is being
    written), copies the data of the committed ones out in one go and only then moves the consumer
    position, so the kernel never overwrites what is being copied.

    Python has no memory barriers: the order of those loads and of the final store is the one x86-64
    guarantees (loads are not reordered with older loads, stores not with older loads), which is
    why other architectures get :class:`NotSupported` (use :class:`RingBuffer` there).
    """

    def __init__(self, map: Map) -> None:
        if map.type != RINGBUF:
            raise ValueError(f"map {map.name!r} is a {map.type_name} map, not a ringbuf")
        if platform.machine() not in ("x86_64", "AMD64"):
            raise NotSupported(f"bulk reading of ring buffer {map.name!r} relies on x86-64 memory ordering; "
                               f"this is {platform.machine()}")
        self.map = map
        page = mmap.PAGESIZE
        self._size = int(map.max_entries)
        self._mask = self._size - 1
        self._cons: mmap.mmap | None = mmap.mmap(map.fd, page, mmap.MAP_SHARED,
                                                 mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod: mmap.mmap | None = mmap.mmap(map.fd, page + 2 * self._size, mmap.MAP_SHARED,
                                                 mmap.PROT_READ, offset=page)
        self._page = page
        # the positions and the headers are read (and the consumer position written) through NumPy
        # views: one aligned 8- or 4-byte access each, where struct would go byte by byte and the
        # kernel could see a torn consumer position (a ring that looks full: events lost)
        self._cons_pos: np.ndarray | None = np.frombuffer(self._cons, dtype="<u8", count=1)
        self._prod_pos: np.ndarray | None = np.frombuffer(self._prod, dtype="<u8", count=1)
        self._words: np.ndarray | None = np.frombuffer(self._prod, dtype="<u4", offset=page)
        self._epoll: select.epoll | None = select.epoll()
        self._epoll.register(map.fd, select.EPOLLIN)
        # wake() ends a wait at once from another thread, so an idle reader can wait long
        self._wake_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` until the ring holds records (level-triggered) or :meth:`wake`
        is called; True when the ring holds records."""
        if self._epoll is None:
            raise ValueError(f"ring buffer {self.map.name!r} is closed")
        try:
            ready = self._epoll.poll(timeout_ms / 1000)
        except InterruptedError:
            return False
        data = False
        for fd, _ in ready:
            if fd == self._wake_fd:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(fd)
            else:
                data = True
        return data

    def wake(self) -> None:
        """End a :meth:`wait` in another thread now (it returns False unless records are waiting)."""
        if self._wake_fd is not None:
            os.eventfd_write(self._wake_fd, 1)

    def read(self, record_size: int) -> tuple[bytes, int]:
        """Every committed record, consumed: ``(data, others)`` where ``data`` is the records of
        exactly ``record_size`` bytes back to back, in ring order, and ``others`` counts records of
        any other size (skipped; discarded records are not counted)."""
        if self._cons_pos is None or self._prod_pos is None or self._words is None:
            raise ValueError(f"ring buffer {self.map.name!r} is closed")
        cons = int(self._cons_pos[0])
        prod = int(self._prod_pos[0])
        step = (record_size + _HDR + 7) & ~7
        chunks: list[bytes] = []
        others = 0
        while cons < prod:
            off = cons & self._mask
            # headers where records of this size would be (the data is mapped twice: no wrap)
            n = (prod - cons) // step
            if n:
                heads = self._words[(off + np.arange(n, dtype=np.int64) * step) >> 2]
                bad = np.flatnonzero(heads != record_size)
                good = int(bad[0]) if len(bad) else n
                if good:
                    block = np.frombuffer(self._prod, dtype=np.uint8, count=good * step, offset=self._page + off)
                    chunks.append(block.reshape(good, step)[:, _HDR:_HDR + record_size].tobytes())
                    cons += good * step
                    continue
            # a record of another size, discarded, or not committed yet
            head = int(self._words[off >> 2])
            if head & _BUSY:
                break
            if not head & _DISCARD:
                others += 1
            cons += ((head & ~(_BUSY | _DISCARD)) + _HDR + 7) & ~7
        self._cons_pos[0] = cons
        return b"".join(chunks), others

    def fileno(self) -> int:
        return self.map.fd

    def close(self) -> None:
        self._cons_pos = self._prod_pos = self._words = None   # the views go before the mappings
        for m in (self._prod, self._cons):
            if m is not None:
                m.close()
        self._prod = self._cons = None
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._wake_fd is not None:
            os.close(self._wake_fd)
            self._wake_fd = None


__all__ = ["RingBuffer", "RingReader"]
