"""BPF maps: an fd-owning :class:`Map` with a raw bytes API and fast batch dumps, and
:class:`TypedMap`, which codes keys and values through :class:`~lace.bpf.layout.Layout`.

Per-CPU maps hold one value per possible CPU, each rounded up to 8 bytes: a per-CPU value blob is
``percpu_stride * ncpus`` bytes.  LPM trie keys are ordinary layouts whose first field is
``prefixlen`` (u32), followed by the address bytes.
"""

from __future__ import annotations

import struct
import ctypes
import errno
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from . import _libbpf as _lb
from .fd import FdObject
from .errors import ENOTSUPP, BPFError, NotSupported, error
from .info import MapInfo, map_info_fd, map_type_name
from .layout import Layout

ANY = 0  # BPF_ANY: create or update
NOEXIST = 1  # BPF_NOEXIST: create only
EXIST = 2  # BPF_EXIST: update only

HASH, ARRAY, PERCPU_HASH, PERCPU_ARRAY, LRU_HASH, LRU_PERCPU_HASH, LPM_TRIE = 1, 2, 5, 6, 9, 10, 11
RINGBUF = 27
PERCPU_TYPES = frozenset({PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, 21})
# map types whose kernel ops implement lookup/update/delete batch
BATCH_TYPES = frozenset({HASH, ARRAY, PERCPU_HASH, PERCPU_ARRAY, LRU_HASH, LRU_PERCPU_HASH})
# map types that cannot be walked with get_next_key + lookup from user space
NON_ITERABLE = frozenset({22, 23, 24, 26, RINGBUF, 28, 29, 30, 31, 32, 33})
_BATCH_UNSUPPORTED = (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP)

KeyLike = bytes | bytearray | memoryview | int
Buffer = bytes | bytearray | memoryview


def _round8(n: int) -> int:
    return (n + 7) & ~7


class Map(FdObject):
    """A BPF map; owns its file descriptor (closed by :meth:`close` or the context manager)."""

    _kind = "map"

    def __init__(self, fd: int, *, name: str | None = None, pin_path: str | None = None) -> None:
        info = self._adopt(fd, map_info_fd, name, pin_path)
        self.key_size = info.key_size
        self.value_size = info.value_size
        self.max_entries = info.max_entries
        self.flags = info.flags
        self.percpu = self.type in PERCPU_TYPES
        self.ncpus = _lb.possible_cpus() if self.percpu else 1
        #: bytes between consecutive CPUs' values in a per-CPU blob (value_size otherwise)
        self.percpu_stride = _round8(self.value_size) if self.percpu else self.value_size
        #: size of one value as the syscalls read and write it (all CPUs for per-CPU maps)
        self.value_blob_size = self.percpu_stride * self.ncpus

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open_pinned(cls, path: str) -> Map:
        """Open the map pinned at ``path`` on bpffs."""
        return cls(cls._obj_get(path, "map"), pin_path=path)

    @classmethod
    def from_id(cls, map_id: int) -> Map:
        """Open map ``map_id``."""
        fd = _lb.lib.bpf_map_get_fd_by_id(map_id)
        if fd < 0:
            raise error(f"open map id {map_id}", -fd, key_op=True)
        return cls(fd)

    def _label(self) -> str:
        return repr(self.name)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __repr__(self) -> str:
        return (
            f"Map({self.name!r}, {self.type_name}, key={self.key_size}, value={self.value_size},"
            f" max_entries={self.max_entries}, id={self.id})"
        )

    def info(self) -> MapInfo:
        """The kernel's current view of this map."""
        return map_info_fd(self.fd)

    # --- single elements ---------------------------------------------------------------------

    def _key(self, key: KeyLike) -> bytes:
        if isinstance(key, int):
            key = key.to_bytes(self.key_size, "little")
        key = bytes(key)
        if len(key) != self.key_size:
            raise ValueError(f"map {self.name!r}: key is {len(key)} bytes, expected {self.key_size}")
        return key

    def _value(self, value: bytes | bytearray | memoryview | Sequence[bytes]) -> bytes:
        if self.percpu and isinstance(value, (list, tuple)):
            if len(value) != self.ncpus:
                raise ValueError(f"map {self.name!r}: {len(value)} per-CPU values for {self.ncpus} CPUs")
            value = b"".join(bytes(v).ljust(self.percpu_stride, b"\0") for v in value)
        value = bytes(value)  # type: ignore[arg-type]
        if len(value) != self.value_blob_size:
            raise ValueError(
                f"map {self.name!r}: value is {len(value)} bytes, expected {self.value_blob_size}"
                + (f" ({self.ncpus} CPUs x {self.percpu_stride})" if self.percpu else "")
            )
        return value

    def _check_iterable(self, op: str) -> None:
        if self.type in NON_ITERABLE:
            raise NotSupported(
                f"{op} map {self.name!r}",
                errno.EOPNOTSUPP,
                f"a {self.type_name} map has no user-space lookup/iteration; use the type's own API"
                + (" (lace.bpf.RingBuffer)" if self.type == RINGBUF else ""),
            )

    def lookup(self, key: KeyLike) -> bytes | None:
        """The value at ``key`` (the per-CPU blob for per-CPU maps), or None if absent."""
        self._check_iterable("lookup in")
        k = self._key(key)
        buf = ctypes.create_string_buffer(self.value_blob_size)
        ret = _lb.lib.bpf_map_lookup_elem(self.fd, k, buf)
        if ret == -errno.ENOENT:
            return None
        _lb.check(ret, f"lookup in map {self.name!r}")
        return buf.raw

    def lookup_percpu(self, key: KeyLike) -> list[bytes] | None:
        """The per-CPU values at ``key`` (one ``value_size`` bytes string per possible CPU)."""
        if not self.percpu:
            raise ValueError(f"map {self.name!r} ({self.type_name}) is not per-CPU")
        blob = self.lookup(key)
        if blob is None:
            return None
        s = self.percpu_stride
        return [blob[i * s : i * s + self.value_size] for i in range(self.ncpus)]

    def update(
        self, key: KeyLike, value: bytes | bytearray | memoryview | Sequence[bytes], flags: int = ANY
    ) -> None:
        """Set ``key`` to ``value``; per-CPU maps take the full blob or a list of per-CPU values."""
        k, v = self._key(key), self._value(value)
        ret = _lb.lib.bpf_map_update_elem(self.fd, k, v, flags)
        _lb.check(ret, f"update map {self.name!r}", key_op=True)

    def delete(self, key: KeyLike) -> bool:
        """Delete ``key``; False if it was not there."""
        ret = _lb.lib.bpf_map_delete_elem(self.fd, self._key(key))
        if ret == -errno.ENOENT:
            return False
        _lb.check(ret, f"delete from map {self.name!r}")
        return True

    def keys(self) -> Iterator[bytes]:
        """Iterate keys with get_next_key (a concurrent delete can restart a hash walk)."""
        self._check_iterable("iterate")
        cur: bytes | None = None
        nxt = ctypes.create_string_buffer(self.key_size)
        while True:
            ret = _lb.lib.bpf_map_get_next_key(self.fd, cur, nxt)
            if ret == -errno.ENOENT:
                return
            _lb.check(ret, f"iterate map {self.name!r}")
            cur = nxt.raw
            yield cur

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Iterate (key, value) pairs one syscall pair at a time; prefer :meth:`dump` for bulk."""
        for k in self.keys():
            v = self.lookup(k)
            if v is not None:
                yield k, v

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) pair as bytes, from one :meth:`dump` taken now (batch lookup where
        the map type has it, get_next_key iteration otherwise, e.g. LPM tries).

        The snapshot is read when this is called, so the iterator stays valid after the map is
        closed; ``dict(m.entries())`` is the map as ``{key: value}``.  Values are
        ``value_blob_size`` bytes (the per-CPU blob for per-CPU maps).  For NumPy work on many
        entries use :meth:`dump`'s contiguous buffers instead.
        """
        keys, values, n = self.dump()
        return _pairs(bytes(keys), bytes(values), n, self.key_size, self.value_blob_size)

    def __len__(self) -> int:
        return self.count()

    def count(self, chunk: int = 4096) -> int:
        """How many entries the map holds, read at most ``chunk`` (and 1 MiB of values) at a time
        into buffers of that size: a :meth:`dump` would fault in buffers for every entry (the node's
        conntrack tables when full: ~100 MiB of the caller's memory for a number)."""
        self._check_iterable("count")
        if self.type in (ARRAY, PERCPU_ARRAY):
            return int(self.max_entries)   # every element always exists (what a dump returns)
        if self.type in BATCH_TYPES:
            try:
                return self._count_batch(chunk)
            except BPFError as exc:
                if exc.errno not in _BATCH_UNSUPPORTED:
                    raise
        return sum(1 for _ in self.keys())

    def _count_batch(self, chunk: int) -> int:
        chunk = max(1, min(chunk, (1 << 20) // max(self.value_blob_size, 1)))
        keys = ctypes.create_string_buffer(chunk * self.key_size)
        values = ctypes.create_string_buffer(chunk * self.value_blob_size)
        return self._lookup_batches(lambda done: (keys, values, chunk))

    def _lookup_batches(self, where: Callable[[int], tuple[Any, Any, int]]) -> int:
        """Walk the map with BPF_MAP_LOOKUP_BATCH: ``where(done)``, given how many entries were
        read so far, says where the next batch goes (key buffer, value buffer, how many entries
        they hold; 0: stop). Returns how many entries were read."""
        token_size = max(self.key_size, 8)
        in_tok = ctypes.create_string_buffer(token_size)
        out_tok = ctypes.create_string_buffer(token_size)
        opts = _lb.BpfMapBatchOpts(sz=ctypes.sizeof(_lb.BpfMapBatchOpts))
        count = 0
        first = True
        while True:
            keys, values, room = where(count)
            if room <= 0:
                return count
            n = ctypes.c_uint32(room)
            ret = _lb.lib.bpf_map_lookup_batch(self.fd, None if first else in_tok, out_tok, keys, values,
                                               ctypes.byref(n), ctypes.byref(opts))
            count += n.value
            if ret == -errno.ENOENT:
                return count
            _lb.check(ret, f"batch lookup in map {self.name!r}")
            ctypes.memmove(in_tok, out_tok, token_size)
            first = False

    # --- batch ---------------------------------------------------------------------------------

    def dump(self) -> tuple[Buffer, Buffer, int]:
        """All entries as (keys, values, count): contiguous buffers of ``count`` keys and values.

        The buffers are read-only memoryviews (zero-copy over the memory the kernel filled; use
        ``bytes(...)`` for a copy), ready for ``Layout.decode_many``/``np.frombuffer``.  Values are
        ``value_blob_size`` bytes each (per-CPU maps: ``ncpus`` values of ``percpu_stride`` bytes).
        Uses BPF_MAP_LOOKUP_BATCH where the map type supports it and falls back to get_next_key
        iteration otherwise (e.g. LPM tries).
        """
        self._check_iterable("dump")
        if self.type in BATCH_TYPES:
            try:
                return self._dump_batch()
            except BPFError as exc:
                if exc.errno not in _BATCH_UNSUPPORTED:
                    raise
        return self._dump_iter()

    def _dump_batch(self) -> tuple[Buffer, Buffer, int]:
        cap = self.max_entries
        ks, vs = self.key_size, self.value_blob_size
        kmem, kp = _lb.scratch(cap * ks)
        vmem, vp = _lb.scratch(cap * vs)
        count = self._lookup_batches(lambda done: (kp + done * ks, vp + done * vs, cap - done))
        return (
            memoryview(kmem)[: count * ks].toreadonly(),
            memoryview(vmem)[: count * vs].toreadonly(),
            count,
        )

    def _dump_iter(self) -> tuple[Buffer, Buffer, int]:
        ks: list[bytes] = []
        vs: list[bytes] = []
        for k, v in self.items():
            ks.append(k)
            vs.append(v)
        return memoryview(b"".join(ks)), memoryview(b"".join(vs)), len(ks)

    def _buffer(self, buf: Buffer, size: int, count: int, what: str) -> memoryview:
        mv = memoryview(buf).cast("B")
        if len(mv) < size * count:
            raise ValueError(f"map {self.name!r}: {what} buffer holds {len(mv) // max(size, 1)} < {count} entries")
        return mv[: size * count]

    def update_batch(self, keys: Buffer, values: Buffer, count: int, flags: int = ANY) -> int:
        """Write ``count`` entries from contiguous key and value buffers; returns the count written."""
        k = self._buffer(keys, self.key_size, count, "key")
        v = self._buffer(values, self.value_blob_size, count, "value")
        if count == 0:
            return 0
        if self.type in BATCH_TYPES:
            (_, kp), (_, vp) = _lb.addr_of(k), _lb.addr_of(v)  # k and v keep the memory alive
            n = ctypes.c_uint32(count)
            opts = _lb.BpfMapBatchOpts(sz=ctypes.sizeof(_lb.BpfMapBatchOpts), elem_flags=flags)
            ret = _lb.lib.bpf_map_update_batch(self.fd, kp, vp, ctypes.byref(n), ctypes.byref(opts))
            if ret >= 0:
                return count
            if -ret not in _BATCH_UNSUPPORTED or n.value:
                raise error(
                    f"batch update of map {self.name!r}", -ret, f"{n.value} of {count} entries written",
                    key_op=True,
                )
        ks, vs = self.key_size, self.value_blob_size
        for i in range(count):
            ret = _lb.lib.bpf_map_update_elem(
                self.fd, bytes(k[i * ks : (i + 1) * ks]), bytes(v[i * vs : (i + 1) * vs]), flags
            )
            if ret < 0:
                raise error(f"update map {self.name!r}", -ret, f"{i} of {count} entries written", key_op=True)
        return count

    def delete_batch(self, keys: Buffer, count: int) -> int:
        """Delete ``count`` keys from a contiguous buffer; absent keys are skipped; returns deleted."""
        k = self._buffer(keys, self.key_size, count, "key")
        ks = self.key_size
        deleted = 0
        start = 0
        if self.type in BATCH_TYPES and self.type not in (ARRAY, PERCPU_ARRAY):
            keep, kp = _lb.addr_of(k)
            opts = _lb.BpfMapBatchOpts(sz=ctypes.sizeof(_lb.BpfMapBatchOpts))
            while start < count:
                n = ctypes.c_uint32(count - start)
                ret = _lb.lib.bpf_map_delete_batch(self.fd, kp + start * ks, ctypes.byref(n), ctypes.byref(opts))
                deleted += n.value
                if ret >= 0:
                    return deleted
                if -ret == errno.ENOENT:  # the key at start+n is absent: skip it and go on
                    start += n.value + 1
                    continue
                if -ret in _BATCH_UNSUPPORTED and n.value == 0:
                    break
                raise error(f"batch delete from map {self.name!r}", -ret)
            else:
                return deleted
            del keep
        for i in range(start, count):
            if self.delete(k[i * ks : (i + 1) * ks]):
                deleted += 1
        return deleted

    def clear(self) -> int:
        """Delete every entry of a hash-like map, or zero every slot of an array (whose slots
        cannot be deleted); returns the number of entries removed or zeroed."""
        if self.type in (ARRAY, PERCPU_ARRAY):
            n = self.max_entries
            keys = struct.pack(f"<{n}I", *range(n))
            return self.update_batch(keys, bytes(self.value_blob_size * n), n)
        keys, _, count = self.dump()
        return self.delete_batch(keys, count)


def _pairs(kb: bytes, vb: bytes, n: int, ks: int, vs: int) -> Iterator[tuple[bytes, bytes]]:
    for i in range(n):
        yield kb[i * ks : (i + 1) * ks], vb[i * vs : (i + 1) * vs]


class TypedMap:
    """A :class:`Map` whose keys and values are coded by :class:`Layout` s (dicts in, dicts out).

    For per-CPU maps values come back as a list of dicts (one per possible CPU) and ``dump`` gives
    a values array of shape (count, ncpus).
    """

    def __init__(self, map: Map, key_layout: Layout, value_layout: Layout) -> None:
        if key_layout.size != map.key_size:
            raise ValueError(f"{key_layout.c_name} is {key_layout.size} bytes; map {map.name!r} keys are {map.key_size}")
        if value_layout.size != map.value_size:
            raise ValueError(
                f"{value_layout.c_name} is {value_layout.size} bytes; map {map.name!r} values are {map.value_size}"
            )
        self.map = map
        self.key_layout = key_layout
        self.value_layout = value_layout

    def __repr__(self) -> str:
        return f"TypedMap({self.map!r}, {self.key_layout.c_name}, {self.value_layout.c_name})"

    def _k(self, key: Mapping[str, Any] | bytes) -> bytes:
        return bytes(key) if isinstance(key, (bytes, bytearray)) else self.key_layout.pack(key)

    def _v(self, value: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> bytes | list[bytes]:
        if self.map.percpu and isinstance(value, (list, tuple)):
            return [self.value_layout.pack(v) for v in value]
        v = self.value_layout.pack(value)  # type: ignore[arg-type]
        if self.map.percpu:
            raise ValueError(f"map {self.map.name!r} is per-CPU: pass one value dict per CPU")
        return v

    def _decode_value(self, blob: bytes) -> Any:
        if not self.map.percpu:
            return self.value_layout.unpack(blob)
        s = self.map.percpu_stride
        return [self.value_layout.unpack(blob[i * s : i * s + self.map.value_size]) for i in range(self.map.ncpus)]

    def lookup(self, key: Mapping[str, Any]) -> Any:
        """The value dict at ``key`` (a list of dicts for per-CPU maps), or None."""
        blob = self.map.lookup(self._k(key))
        return None if blob is None else self._decode_value(blob)

    def update(self, key: Mapping[str, Any], value: Any, flags: int = ANY) -> None:
        self.map.update(self._k(key), self._v(value), flags)

    def delete(self, key: Mapping[str, Any]) -> bool:
        return self.map.delete(self._k(key))

    def items(self) -> Iterator[tuple[dict[str, Any], Any]]:
        for k, v in self.map.items():
            yield self.key_layout.unpack(k), self._decode_value(v)

    def dump(self) -> tuple[np.ndarray, np.ndarray]:
        """All entries as NumPy structured arrays (keys, values) decoded in one step."""
        kb, vb, n = self.map.dump()
        keys = self.key_layout.decode_many(kb, n)
        if not self.map.percpu:
            return keys, self.value_layout.decode_many(vb, n)
        m = self.map
        vals = np.ndarray(
            shape=(n, m.ncpus),
            dtype=self.value_layout.dtype,
            buffer=vb,
            strides=(m.value_blob_size, m.percpu_stride),
        )
        return keys, vals


__all__ = ["ANY", "NOEXIST", "EXIST", "Map", "TypedMap", "map_type_name"]
