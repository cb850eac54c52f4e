"""ctypes bindings to libbpf 1.1.2 (``libbpf.so.1``) and the few libc calls the loader needs.

Every struct here mirrors a C struct from /usr/include/bpf/{libbpf,bpf}.h (libbpf 1.1.2) or the
kernel uapi ``union bpf_attr`` / ``struct bpf_*_info`` (checked against the running kernel's BTF);
sizes are asserted at import.  Nothing outside lace.bpf imports this module: ctypes stays here.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import mmap
import os
import sys
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_int,
    c_long,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)

import numpy as np

from .errors import LoadError, error

try:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
except OSError as exc:  # pragma: no cover - depends on the host
    raise ImportError(f"libbpf.so.1 not found ({exc}); install libbpf1 (Debian: apt install libbpf1)") from exc
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

# --- libbpf.h ----------------------------------------------------------------------------------


class BpfObjectOpenOpts(Structure):
    """struct bpf_object_open_opts (libbpf 1.1.2, 80 bytes)."""

    _fields_ = [
        ("sz", c_size_t),
        ("object_name", c_char_p),
        ("relaxed_maps", c_bool),
        ("pin_root_path", c_char_p),
        ("_removed_attach_prog_fd", c_uint32),  # __u32 :32
        ("kconfig", c_char_p),
        ("btf_custom_path", c_char_p),
        ("kernel_log_buf", c_void_p),
        ("kernel_log_size", c_size_t),
        ("kernel_log_level", c_uint32),
    ]


class BpfTcHook(Structure):
    """struct bpf_tc_hook."""

    _fields_ = [("sz", c_size_t), ("ifindex", c_int), ("attach_point", c_uint32), ("parent", c_uint32)]


class BpfTcOpts(Structure):
    """struct bpf_tc_opts."""

    _fields_ = [
        ("sz", c_size_t),
        ("prog_fd", c_int),
        ("flags", c_uint32),
        ("prog_id", c_uint32),
        ("handle", c_uint32),
        ("priority", c_uint32),
    ]


BPF_TC_INGRESS = 1 << 0
BPF_TC_EGRESS = 1 << 1
BPF_TC_F_REPLACE = 1 << 0

# --- bpf.h -------------------------------------------------------------------------------------


class BpfMapBatchOpts(Structure):
    """struct bpf_map_batch_opts."""

    _fields_ = [("sz", c_size_t), ("elem_flags", c_uint64), ("flags", c_uint64)]


class BpfLinkCreateOpts(Structure):
    """struct bpf_link_create_opts (only the common head is used; the union is left zero)."""

    _fields_ = [
        ("sz", c_size_t),
        ("flags", c_uint32),
        ("iter_info", c_void_p),
        ("iter_info_len", c_uint32),
        ("target_btf_id", c_uint32),
        ("_union", c_uint64 * 4),
    ]


class BpfLinkUpdateOpts(Structure):
    """struct bpf_link_update_opts."""

    _fields_ = [("sz", c_size_t), ("flags", c_uint32), ("old_prog_fd", c_uint32)]


class BpfProgQueryOpts(Structure):
    """struct bpf_prog_query_opts (libbpf 1.1: no link_ids/revision fields)."""

    _fields_ = [
        ("sz", c_size_t),
        ("query_flags", c_uint32),
        ("attach_flags", c_uint32),
        ("prog_ids", POINTER(c_uint32)),
        ("prog_cnt", c_uint32),
        ("prog_attach_flags", POINTER(c_uint32)),
    ]


class BpfTestRunOpts(Structure):
    """struct bpf_test_run_opts."""

    _fields_ = [
        ("sz", c_size_t),
        ("data_in", c_void_p),
        ("data_out", c_void_p),
        ("data_size_in", c_uint32),
        ("data_size_out", c_uint32),
        ("ctx_in", c_void_p),
        ("ctx_out", c_void_p),
        ("ctx_size_in", c_uint32),
        ("ctx_size_out", c_uint32),
        ("retval", c_uint32),
        ("repeat", c_int),
        ("duration", c_uint32),
        ("flags", c_uint32),
        ("cpu", c_uint32),
        ("batch_size", c_uint32),
    ]


# --- kernel uapi (linux/bpf.h as of 6.18) ------------------------------------------------------


class BpfMapInfo(Structure):
    """struct bpf_map_info (104 bytes)."""

    _fields_ = [
        ("type", c_uint32),
        ("id", c_uint32),
        ("key_size", c_uint32),
        ("value_size", c_uint32),
        ("max_entries", c_uint32),
        ("map_flags", c_uint32),
        ("name", c_char * 16),
        ("ifindex", c_uint32),
        ("btf_vmlinux_value_type_id", c_uint32),
        ("netns_dev", c_uint64),
        ("netns_ino", c_uint64),
        ("btf_id", c_uint32),
        ("btf_key_type_id", c_uint32),
        ("btf_value_type_id", c_uint32),
        ("btf_vmlinux_id", c_uint32),
        ("map_extra", c_uint64),
        ("hash", c_uint64),
        ("hash_size", c_uint32),
        ("_pad", c_uint32),
    ]


class BpfProgInfo(Structure):
    """struct bpf_prog_info (232 bytes); only the head up to ``name``/``ifindex`` is interpreted."""

    _fields_ = [
        ("type", c_uint32),
        ("id", c_uint32),
        ("tag", c_uint8 * 8),
        ("jited_prog_len", c_uint32),
        ("xlated_prog_len", c_uint32),
        ("jited_prog_insns", c_uint64),
        ("xlated_prog_insns", c_uint64),
        ("load_time", c_uint64),
        ("created_by_uid", c_uint32),
        ("nr_map_ids", c_uint32),
        ("map_ids", c_uint64),
        ("name", c_char * 16),
        ("ifindex", c_uint32),
        ("_rest", c_uint8 * (232 - 84)),
    ]


class BpfLinkInfo(Structure):
    """struct bpf_link_info (64 bytes): type, id, prog_id, then a per-type union at offset 16."""

    _fields_ = [
        ("type", c_uint32),
        ("id", c_uint32),
        ("prog_id", c_uint32),
        ("_pad", c_uint32),
        ("u", c_uint8 * 48),
    ]


class BpfAttrQuery(Structure):
    """The BPF_PROG_QUERY member of union bpf_attr (kernel ≥ 6.6 with tcx link_ids/revision)."""

    _fields_ = [
        ("target_fd", c_uint32),  # union with target_ifindex
        ("attach_type", c_uint32),
        ("query_flags", c_uint32),
        ("attach_flags", c_uint32),
        ("prog_ids", c_uint64),
        ("count", c_uint32),  # union with prog_cnt
        ("_pad", c_uint32),
        ("prog_attach_flags", c_uint64),
        ("link_ids", c_uint64),
        ("link_attach_flags", c_uint64),
        ("revision", c_uint64),
    ]


for _cls, _size in (
    (BpfObjectOpenOpts, 80),
    (BpfTcHook, 24),
    (BpfTcOpts, 32),
    (BpfMapBatchOpts, 24),
    (BpfLinkCreateOpts, 64),
    (BpfLinkUpdateOpts, 16),
    (BpfProgQueryOpts, 40),
    (BpfTestRunOpts, 80),
    (BpfMapInfo, 104),
    (BpfProgInfo, 232),
    (BpfLinkInfo, 64),
    (BpfAttrQuery, 64),
):
    assert ctypes.sizeof(_cls) == _size, (_cls.__name__, ctypes.sizeof(_cls), _size)

# --- function prototypes -----------------------------------------------------------------------

RingBufferSampleFn = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
PrintFn = CFUNCTYPE(c_int, c_int, c_char_p, c_void_p)  # the va_list decays to a pointer on x86-64

_P = c_void_p
_PROTOS: dict[str, tuple[object, list[object]]] = {
    # object / program / map (libbpf.h)
    "bpf_object__open_file": (_P, [c_char_p, POINTER(BpfObjectOpenOpts)]),
    "bpf_object__load": (c_int, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__next_map": (_P, [_P, _P]),
    "bpf_object__next_program": (_P, [_P, _P]),
    "bpf_map__name": (c_char_p, [_P]),
    "bpf_map__type": (c_int, [_P]),
    "bpf_map__key_size": (c_uint32, [_P]),
    "bpf_map__value_size": (c_uint32, [_P]),
    "bpf_map__max_entries": (c_uint32, [_P]),
    "bpf_map__set_max_entries": (c_int, [_P, c_uint32]),
    "bpf_map__map_flags": (c_uint32, [_P]),
    "bpf_map__pin_path": (c_char_p, [_P]),
    "bpf_map__set_pin_path": (c_int, [_P, c_char_p]),
    "bpf_map__is_internal": (c_bool, [_P]),
    "bpf_map__fd": (c_int, [_P]),
    "bpf_program__name": (c_char_p, [_P]),
    "bpf_program__section_name": (c_char_p, [_P]),
    "bpf_program__type": (c_int, [_P]),
    "bpf_program__fd": (c_int, [_P]),
    "bpf_program__autoload": (c_bool, [_P]),
    "bpf_program__set_autoload": (c_int, [_P, c_bool]),
    "bpf_program__set_log_buf": (c_int, [_P, c_void_p, c_size_t]),
    "bpf_program__set_log_level": (c_int, [_P, c_uint32]),
    "libbpf_set_print": (_P, [PrintFn]),
    "libbpf_bpf_map_type_str": (c_char_p, [c_int]),
    "libbpf_bpf_prog_type_str": (c_char_p, [c_int]),
    "libbpf_num_possible_cpus": (c_int, []),
    # tc (netlink inside libbpf)
    "bpf_tc_hook_create": (c_int, [POINTER(BpfTcHook)]),
    "bpf_tc_hook_destroy": (c_int, [POINTER(BpfTcHook)]),
    "bpf_tc_attach": (c_int, [POINTER(BpfTcHook), POINTER(BpfTcOpts)]),
    "bpf_tc_detach": (c_int, [POINTER(BpfTcHook), POINTER(BpfTcOpts)]),
    "bpf_tc_query": (c_int, [POINTER(BpfTcHook), POINTER(BpfTcOpts)]),
    # ring buffer
    "ring_buffer__new": (_P, [c_int, RingBufferSampleFn, c_void_p, c_void_p]),
    "ring_buffer__free": (None, [_P]),
    "ring_buffer__poll": (c_int, [_P, c_int]),
    "ring_buffer__consume": (c_int, [_P]),
    "ring_buffer__epoll_fd": (c_int, [_P]),
    # low level (bpf.h)
    "bpf_map_lookup_elem": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_update_elem": (c_int, [c_int, c_void_p, c_void_p, c_uint64]),
    "bpf_map_delete_elem": (c_int, [c_int, c_void_p]),
    "bpf_map_get_next_key": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_lookup_batch": (
        c_int,
        [c_int, c_void_p, c_void_p, c_void_p, c_void_p, POINTER(c_uint32), POINTER(BpfMapBatchOpts)],
    ),
    "bpf_map_update_batch": (
        c_int,
        [c_int, c_void_p, c_void_p, POINTER(c_uint32), POINTER(BpfMapBatchOpts)],
    ),
    "bpf_map_delete_batch": (c_int, [c_int, c_void_p, POINTER(c_uint32), POINTER(BpfMapBatchOpts)]),
    "bpf_obj_pin": (c_int, [c_int, c_char_p]),
    "bpf_obj_get": (c_int, [c_char_p]),
    "bpf_obj_get_info_by_fd": (c_int, [c_int, c_void_p, POINTER(c_uint32)]),
    "bpf_link_create": (c_int, [c_int, c_int, c_int, POINTER(BpfLinkCreateOpts)]),
    "bpf_link_update": (c_int, [c_int, c_int, POINTER(BpfLinkUpdateOpts)]),
    "bpf_link_detach": (c_int, [c_int]),
    "bpf_iter_create": (c_int, [c_int]),
    "bpf_prog_query_opts": (c_int, [c_int, c_int, POINTER(BpfProgQueryOpts)]),
    "bpf_prog_get_next_id": (c_int, [c_uint32, POINTER(c_uint32)]),
    "bpf_map_get_next_id": (c_int, [c_uint32, POINTER(c_uint32)]),
    "bpf_link_get_next_id": (c_int, [c_uint32, POINTER(c_uint32)]),
    "bpf_prog_get_fd_by_id": (c_int, [c_uint32]),
    "bpf_map_get_fd_by_id": (c_int, [c_uint32]),
    "bpf_link_get_fd_by_id": (c_int, [c_uint32]),
    "bpf_prog_test_run_opts": (c_int, [c_int, POINTER(BpfTestRunOpts)]),
}

for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

libc.vsnprintf.restype = c_int
libc.vsnprintf.argtypes = [c_char_p, c_size_t, c_char_p, c_void_p]
libc.syscall.restype = c_long
libc.syscall.argtypes = [c_long, c_long, c_void_p, c_uint32]

SYS_bpf = 321  # x86-64
BPF_PROG_QUERY = 16
BPF_TRACE_ITER = 28   # enum bpf_attach_type


def check(ret: int, op: str, *, key_op: bool = False) -> int:
    """Return ``ret`` if non-negative, else raise the typed error for libbpf's ``-errno``."""
    if ret < 0:
        err = -ret if ret != -1 else (ctypes.get_errno() or 1)
        raise error(op, err, key_op=key_op)
    return ret


def errno_now() -> int:
    return ctypes.get_errno()


def addr_of(data: bytes | bytearray | memoryview | mmap.mmap) -> tuple[object, int]:
    """(keepalive, address) of any contiguous buffer, read-only ones included, without copying."""
    arr = np.frombuffer(data, dtype=np.uint8)
    return arr, int(arr.ctypes.data) if arr.size else 0


_HUGE = 2 << 20


def scratch(size: int) -> tuple[mmap.mmap, int]:
    """A zero-filled anonymous mapping of ``size`` bytes and its address, for bulk kernel output.

    Pages are only faulted in where the kernel writes (a 1M-capacity map holding ten entries
    costs ten entries), and transparent huge pages cut the fault cost of a full dump by ~4x.
    """
    mm = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    anchor = c_char.from_buffer(mm)
    address = ctypes.addressof(anchor)
    del anchor  # drop the export so the mapping can be freed with its last memoryview
    return mm, address


def sys_bpf(cmd: int, attr: Structure) -> int:
    """The raw bpf(2) syscall, for commands whose fields libbpf 1.1 does not expose."""
    ret = libc.syscall(SYS_bpf, cmd, ctypes.addressof(attr), ctypes.sizeof(attr))
    if ret < 0:
        return -ctypes.get_errno()
    return int(ret)


def possible_cpus() -> int:
    """Number of possible CPUs (/sys/devices/system/cpu/possible), the per-CPU value multiplier."""
    n = lib.libbpf_num_possible_cpus()
    if n > 0:
        return int(n)
    count = 0
    with open("/sys/devices/system/cpu/possible") as f:
        for part in f.read().strip().split(","):
            lo, _, hi = part.partition("-")
            count += int(hi or lo) - int(lo) + 1
    return count


def cstr(ptr: bytes | None) -> str | None:
    return ptr.decode() if ptr is not None else None


# --- libbpf's own messages ---------------------------------------------------------------------


class _PrintCapture:
    """Keeps libbpf's last messages (for LoadError) instead of printing them to stderr.

    libbpf hands a printf format and a ``va_list``; libc ``vsnprintf`` formats it.  Set
    ``LACE_LIBBPF_DEBUG=1`` to also echo every message to stderr.
    """

    def __init__(self, keep: int = 200) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.lock = threading.Lock()
        self.debug = os.environ.get("LACE_LIBBPF_DEBUG", "") not in ("", "0")
        self._buf = ctypes.create_string_buffer(8192)
        self.callback = PrintFn(self._print)  # must stay referenced for libbpf's lifetime

    def _print(self, level: int, fmt: bytes | None, ap: int | None) -> int:
        try:
            with self.lock:
                n = libc.vsnprintf(self._buf, len(self._buf), fmt, ap)
                text = self._buf.value.decode(errors="replace")
            for line in text.rstrip("\n").splitlines():
                self.lines.append(line)
            if self.debug:
                sys.stderr.write(text)
            return max(n, 0)
        except Exception:  # never let an exception unwind through C
            return 0

    def recent(self, n: int = 20) -> list[str]:
        with self.lock:
            return list(self.lines)[-n:]

    def clear(self) -> None:
        with self.lock:
            self.lines.clear()


printer = _PrintCapture()
lib.libbpf_set_print(printer.callback)


def load_error(op: str, err: int, what: str) -> LoadError:
    """A LoadError for ``what`` that carries libbpf's recent messages."""
    msgs = printer.recent(12)
    detail = what + (("\nlibbpf said:\n  " + "\n  ".join(msgs)) if msgs else "")
    return LoadError(op, err, detail)
