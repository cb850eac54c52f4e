"""Open a BPF object file as an editable spec, then load it into an :class:`Object` that owns fds.

Modelled on cilium/ebpf's CollectionSpec → Collection: edit maps (capacity, pinning) and programs
(autoload) on the spec, then :meth:`ObjectSpec.load` once.  Maps declared with
``__uint(pinning, LIBBPF_PIN_BY_NAME)`` are pinned at ``<pin_root>/<map name>`` and reused across
loads; a pinned map whose definition changed is migrated (see :meth:`ObjectSpec.load`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from dataclasses import dataclass
from typing import Iterator

from . import _libbpf as _lb
from .fd import FdObject, Owned
from .errors import BPFError, IncompatibleMap, LoadError, VerifierError, error
from .info import MapInfo, ProgInfo, map_info_fd, map_type_name, prog_info_fd, prog_type_name
from .maps import ANY, ARRAY, BATCH_TYPES, NON_ITERABLE, PERCPU_ARRAY, PERCPU_TYPES, Map

log = logging.getLogger(__name__)

LOG_BUF_SIZE = 4 << 20  # verifier logs of complex programs run to megabytes
PERF_EVENT_ARRAY = 4
# map types whose values are kernel object references or streams: never copied on migration
_NO_COPY_TYPES = frozenset({3, PERF_EVENT_ARRAY, 8, 12, 13, 14, 15, 16, 17, 18, 20, 25}) | NON_ITERABLE


@dataclass(frozen=True)
class Migration:
    """A pinned map replaced because its definition changed: what changed and how many entries
    were carried over (``copied``) or lost (``dropped``)."""

    map: str
    reason: str
    copied: int
    dropped: int


class MapSpec:
    """A map of an opened, not yet loaded, object; setters edit what :meth:`ObjectSpec.load` creates."""

    def __init__(self, spec: ObjectSpec, ptr: int) -> None:
        self._spec = spec
        self._ptr = ptr
        self.name: str = _lb.cstr(_lb.lib.bpf_map__name(ptr)) or "?"
        self.internal: bool = bool(_lb.lib.bpf_map__is_internal(ptr))

    def __repr__(self) -> str:
        return (
            f"MapSpec({self.name!r}, {self.type_name}, key={self.key_size}, value={self.value_size},"
            f" max_entries={self.max_entries}, pin_path={self.pin_path!r})"
        )

    @property
    def type(self) -> int:
        return int(_lb.lib.bpf_map__type(self._ptr))

    @property
    def type_name(self) -> str:
        return map_type_name(self.type)

    @property
    def key_size(self) -> int:
        return int(_lb.lib.bpf_map__key_size(self._ptr))

    @property
    def value_size(self) -> int:
        return int(_lb.lib.bpf_map__value_size(self._ptr))

    @property
    def max_entries(self) -> int:
        return int(_lb.lib.bpf_map__max_entries(self._ptr))

    @property
    def flags(self) -> int:
        return int(_lb.lib.bpf_map__map_flags(self._ptr))

    @property
    def pin_path(self) -> str | None:
        return _lb.cstr(_lb.lib.bpf_map__pin_path(self._ptr))

    @property
    def pinned(self) -> bool:
        """Whether loading pins (or reuses) this map at :attr:`pin_path`."""
        return self.pin_path is not None

    def set_max_entries(self, n: int) -> None:
        self._spec._check_editable()
        _lb.check(_lb.lib.bpf_map__set_max_entries(self._ptr, n), f"set max_entries of map {self.name!r}")

    def set_pin_path(self, path: str | None) -> None:
        """Pin (or reuse) the map at ``path``; None makes it private."""
        self._spec._check_editable()
        arg = os.fsencode(path) if path is not None else None
        _lb.check(_lb.lib.bpf_map__set_pin_path(self._ptr, arg), f"set pin path of map {self.name!r}")

    def set_private(self) -> None:
        """Load a fresh, unpinned map private to this object (tests, BPF_PROG_TEST_RUN)."""
        self.set_pin_path(None)


class ProgramSpec:
    """A program of an opened, not yet loaded, object."""

    def __init__(self, spec: ObjectSpec, ptr: int) -> None:
        self._spec = spec
        self._ptr = ptr
        self.name: str = _lb.cstr(_lb.lib.bpf_program__name(ptr)) or "?"
        self.section: str = _lb.cstr(_lb.lib.bpf_program__section_name(ptr)) or ""
        self._log_buf: ctypes.Array[ctypes.c_char] | None = None

    def __repr__(self) -> str:
        return f"ProgramSpec({self.name!r}, section={self.section!r}, type={self.type_name})"

    @property
    def type(self) -> int:
        return int(_lb.lib.bpf_program__type(self._ptr))

    @property
    def type_name(self) -> str:
        return prog_type_name(self.type)

    @property
    def autoload(self) -> bool:
        return bool(_lb.lib.bpf_program__autoload(self._ptr))

    def set_autoload(self, load: bool) -> None:
        """Whether :meth:`ObjectSpec.load` loads this program (skipped programs get no fd)."""
        self._spec._check_editable()
        _lb.check(_lb.lib.bpf_program__set_autoload(self._ptr, load), f"set autoload of {self.name!r}")


class ObjectSpec(Owned):
    """A BPF object file opened with libbpf but not loaded; see the module docstring."""

    def __init__(self, ptr: int, path: str, pin_root: str | None) -> None:
        self._ptr: int | None = ptr
        self.path = path
        self.pin_root = pin_root
        self._loaded = False
        self.maps: dict[str, MapSpec] = {}
        self.programs: dict[str, ProgramSpec] = {}
        m = _lb.lib.bpf_object__next_map(ptr, None)
        while m:
            ms = MapSpec(self, m)
            self.maps[ms.name] = ms
            m = _lb.lib.bpf_object__next_map(ptr, m)
        p = _lb.lib.bpf_object__next_program(ptr, None)
        while p:
            ps = ProgramSpec(self, p)
            self.programs[ps.name] = ps
            p = _lb.lib.bpf_object__next_program(ptr, p)

    @classmethod
    def open(cls, path: str | os.PathLike[str], pin_root: str | None = None) -> ObjectSpec:
        """Open (parse, not load) the object at ``path``; pinned maps go under ``pin_root``."""
        path = os.fspath(path)
        opts = _lb.BpfObjectOpenOpts(sz=ctypes.sizeof(_lb.BpfObjectOpenOpts))
        root = os.fsencode(pin_root) if pin_root is not None else None
        opts.pin_root_path = root
        ptr = _lb.lib.bpf_object__open_file(os.fsencode(path), ctypes.byref(opts))
        if not ptr:
            err = _lb.errno_now() or errno.EINVAL
            raise _lb.load_error(f"open BPF object {path}", err, "libbpf could not parse the object")
        return cls(ptr, path, pin_root)

    def __repr__(self) -> str:
        return f"ObjectSpec({self.path!r}, maps={list(self.maps)}, programs={list(self.programs)})"

    def _check_editable(self) -> None:
        if self._loaded or self._ptr is None:
            raise LoadError("edit object spec", errno.EINVAL, f"{self.path} was already loaded or closed")

    def private(self) -> ObjectSpec:
        """Make every map private (unpinned); returns self for chaining."""
        for m in self.maps.values():
            if m.pinned:
                m.set_private()
        return self

    def close(self) -> None:
        """Free the spec without loading it."""
        if self._ptr is not None:
            _lb.lib.bpf_object__close(self._ptr)
            self._ptr = None

    # --- loading -------------------------------------------------------------------------------

    def load(self, *, migrate: bool = True) -> Object:
        """Create maps and load programs; a spec loads once.

        Pinned maps that exist with the same definition are reused.  One whose definition changed
        (type, key/value size, max_entries, flags) is migrated: the old pin is moved aside, the new
        map is created and pinned, and entries are copied when the key size is unchanged and the
        value size equal or grown (zero-extended), as many as the new capacity holds.  If the load
        fails the old pins are put back.  What happened is in :attr:`Object.migrations`.
        With ``migrate=False`` a changed pinned map raises :class:`IncompatibleMap` instead.
        """
        self._check_editable()
        assert self._ptr is not None
        progs = [p for p in self.programs.values() if p.autoload]
        for p in progs:
            p._log_buf = ctypes.create_string_buffer(LOG_BUF_SIZE)
            _lb.check(
                _lb.lib.bpf_program__set_log_buf(p._ptr, p._log_buf, LOG_BUF_SIZE),
                f"set log buffer of {p.name!r}",
            )
        pending = self._prepare_migrations(migrate)
        self._loaded = True
        _lb.printer.clear()
        ret = _lb.lib.bpf_object__load(self._ptr)
        if ret < 0:
            err = -ret
            self._restore_pins(pending)
            exc = self._load_failure(err, progs)
            self.close()
            raise exc
        try:
            obj = Object._from_loaded(self, progs)
        except BaseException:
            self._restore_pins(pending)
            raise
        finally:
            for p in progs:
                p._log_buf = None
            self.close()
        try:
            obj.migrations = [self._migrate(old, obj.maps[name]) for name, old in pending.items()]
        except BaseException:
            obj.close()
            raise
        return obj

    def _expected_max_entries(self, ms: MapSpec) -> int:
        if ms.type == PERF_EVENT_ARRAY and ms.max_entries == 0:
            return _lb.possible_cpus()
        return ms.max_entries

    def _prepare_migrations(self, migrate: bool) -> dict[str, _OldPin]:
        """Move aside every existing pin whose map does not match its spec."""
        pending: dict[str, _OldPin] = {}
        try:
            for ms in self.maps.values():
                path = ms.pin_path
                if path is None or not os.path.exists(path):
                    continue
                fd = _lb.lib.bpf_obj_get(os.fsencode(path))
                if fd < 0:
                    raise error(f"open pinned map {path}", -fd)
                info = map_info_fd(fd)
                reason = _incompatibility(ms, info, self._expected_max_entries(ms))
                if reason is None:
                    os.close(fd)
                    continue
                if not migrate:
                    os.close(fd)
                    raise IncompatibleMap(
                        f"reuse pinned map {path}", errno.EINVAL,
                        f"{reason}; load with migrate=True or remove the pin",
                    )
                aside = f"{path}-old-{os.getpid()}"  # bpffs refuses names containing dots
                try:
                    os.rename(path, aside)
                except OSError as exc:
                    os.close(fd)
                    raise BPFError(f"move incompatible pinned map {path} aside", exc.errno or 0) from None
                log.info("pinned map %s changed (%s): migrating", path, reason)
                pending[ms.name] = _OldPin(Map(fd, name=ms.name, pin_path=aside), path, aside, reason)
        except BaseException:
            self._restore_pins(pending)
            raise
        return pending

    @staticmethod
    def _restore_pins(pending: dict[str, _OldPin]) -> None:
        for old in pending.values():
            try:
                if os.path.exists(old.path):  # a half-done load may have pinned the new map
                    os.unlink(old.path)
                os.rename(old.aside, old.path)
            except OSError as exc:  # best effort: keep the old map reachable at its aside path
                log.error("could not restore pinned map %s from %s: %s", old.path, old.aside, exc)
            old.map.close()
        pending.clear()

    def _load_failure(self, err: int, progs: list[ProgramSpec]) -> BPFError:
        for p in progs:
            text = p._log_buf.value.decode(errors="replace") if p._log_buf is not None else ""
            if text.strip():
                return VerifierError(f"load program {p.name!r} from {self.path}", err, p.name, text)
        return _lb.load_error(f"load BPF object {self.path}", err, "bpf_object__load failed")

    @staticmethod
    def _migrate(old: _OldPin, new: Map) -> Migration:
        try:
            copied, dropped = _copy_entries(old.map, new)
        finally:
            old.map.close()
            try:
                os.unlink(old.aside)
            except FileNotFoundError:
                pass
        log.info("migrated map %s: %s; %d copied, %d dropped", old.path, old.reason, copied, dropped)
        return Migration(new.name, old.reason, copied, dropped)


@dataclass
class _OldPin:
    map: Map
    path: str
    aside: str
    reason: str


def _incompatibility(ms: MapSpec, info: MapInfo, max_entries: int) -> str | None:
    changes = []
    for what, old, new in (
        ("type", info.type_name, ms.type_name),
        ("key_size", info.key_size, ms.key_size),
        ("value_size", info.value_size, ms.value_size),
        ("max_entries", info.max_entries, max_entries),
        ("flags", hex(info.flags), hex(ms.flags)),
    ):
        if old != new:
            changes.append(f"{what} {old} -> {new}")
    return ", ".join(changes) or None


def _copy_entries(old: Map, new: Map) -> tuple[int, int]:
    """Copy what survives an additive change from ``old`` into ``new``: (copied, dropped)."""
    if old.type in _NO_COPY_TYPES:
        return 0, 0
    keys, vals, count = old.dump()
    if count == 0:
        return 0, 0
    if old.type != new.type or old.key_size != new.key_size or new.value_size < old.value_size:
        return 0, count
    if old.type in (ARRAY, PERCPU_ARRAY):
        # array slots always exist: carry the slots that still have an index, skip all-zero ones
        idx = [i for i in range(count) if int.from_bytes(keys[i * 4 : i * 4 + 4], "little") < new.max_entries]
        zero = bytes(old.value_blob_size)
        live = [i for i in idx if vals[i * old.value_blob_size : (i + 1) * old.value_blob_size] != zero]
        nonzero_total = sum(
            1 for i in range(count) if vals[i * old.value_blob_size : (i + 1) * old.value_blob_size] != zero
        )
        sel = live
        dropped = nonzero_total - len(live)
    else:
        n = min(count, new.max_entries)
        sel = list(range(n))
        dropped = count - n
    if not sel:
        return 0, dropped
    ks = old.key_size
    kbuf = b"".join(keys[i * ks : (i + 1) * ks] for i in sel)
    vbuf = _widen_values(old, new, vals, sel)
    copied = _update_tolerant(new, kbuf, vbuf, len(sel))
    return copied, dropped + (len(sel) - copied)


def _widen_values(old: Map, new: Map, vals: memoryview, sel: list[int]) -> bytes:
    """Re-lay values for ``new``: zero-extend each value (each CPU's value for per-CPU maps)."""
    ob, nb = old.value_blob_size, new.value_blob_size
    if old.type in PERCPU_TYPES:
        ncpu = min(old.ncpus, new.ncpus)
        out = bytearray(len(sel) * nb)
        for j, i in enumerate(sel):
            for c in range(ncpu):
                src = vals[i * ob + c * old.percpu_stride : i * ob + c * old.percpu_stride + old.value_size]
                dst = j * nb + c * new.percpu_stride
                out[dst : dst + len(src)] = src
        return bytes(out)
    if ob == nb:
        return b"".join(vals[i * ob : (i + 1) * ob] for i in sel)
    pad = bytes(nb - ob)
    return b"".join(bytes(vals[i * ob : (i + 1) * ob]) + pad for i in sel)


def _update_tolerant(m: Map, keys: bytes, vals: bytes, count: int) -> int:
    """Batch-write, falling back to one by one and skipping entries the map refuses (full)."""
    if m.type in BATCH_TYPES:
        try:
            return m.update_batch(keys, vals, count, ANY)
        except BPFError:
            pass
    copied = 0
    ks, vs = m.key_size, m.value_blob_size
    for i in range(count):
        try:
            m.update(keys[i * ks : (i + 1) * ks], vals[i * vs : (i + 1) * vs], ANY)
            copied += 1
        except BPFError:
            continue
    return copied


class Program(FdObject):
    """A loaded BPF program; owns its file descriptor."""

    _kind = "program"

    def __init__(self, fd: int, *, name: str | None = None, pin_path: str | None = None) -> None:
        info = self._adopt(fd, prog_info_fd, name, pin_path)
        self.tag = info.tag

    def _label(self) -> str:
        return repr(self.name)

    @classmethod
    def open_pinned(cls, path: str) -> Program:
        return cls(cls._obj_get(path, "program"), pin_path=path)

    @classmethod
    def from_id(cls, prog_id: int) -> Program:
        fd = _lb.lib.bpf_prog_get_fd_by_id(prog_id)
        if fd < 0:
            raise error(f"open program id {prog_id}", -fd, key_op=True)
        return cls(fd)

    def info(self) -> ProgInfo:
        return prog_info_fd(self.fd)

    def __repr__(self) -> str:
        return f"Program({self.name!r}, {self.type_name}, id={self.id}, tag={self.tag})"


class Object(Owned):
    """A loaded object: its maps and programs, each owning a file descriptor.

    libbpf's own object is released right after loading; closing the Object closes every map and
    program fd it handed out (pinned maps stay pinned).
    """

    def __init__(self, path: str, maps: dict[str, Map], programs: dict[str, Program]) -> None:
        self.path = path
        self.maps = maps
        self.programs = programs
        self.migrations: list[Migration] = []

    @classmethod
    def _from_loaded(cls, spec: ObjectSpec, progs: list[ProgramSpec]) -> Object:
        maps: dict[str, Map] = {}
        programs: dict[str, Program] = {}
        try:
            for ms in spec.maps.values():
                fd = _lb.lib.bpf_map__fd(ms._ptr)
                if fd < 0:
                    continue
                maps[ms.name] = Map(_dup(fd), name=ms.name, pin_path=ms.pin_path)
            for ps in progs:
                fd = _lb.lib.bpf_program__fd(ps._ptr)
                if fd < 0:
                    continue
                programs[ps.name] = Program(_dup(fd), name=ps.name)
        except BaseException:
            for m in maps.values():
                m.close()
            for p in programs.values():
                p.close()
            raise
        return cls(spec.path, maps, programs)

    def close(self) -> None:
        for m in self.maps.values():
            m.close()
        for p in self.programs.values():
            p.close()

    def __iter__(self) -> Iterator[Program]:
        return iter(self.programs.values())

    def __repr__(self) -> str:
        return f"Object({self.path!r}, maps={list(self.maps)}, programs={list(self.programs)})"


def _dup(fd: int) -> int:
    return os.dup(fd)  # os.dup sets O_CLOEXEC
