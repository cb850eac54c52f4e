"""Consume a BPF ring buffer map (BPF_MAP_TYPE_RINGBUF) through libbpf's ring_buffer API."""

from __future__ import annotations

import ctypes
import errno
from typing import Callable

from . import _libbpf as _lb
from .fd import Owned
from .errors import error
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



__all__ = ["RingBuffer"]
