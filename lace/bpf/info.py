"""Kernel object introspection: program, map and link info by id or fd, and tcx queries on a device."""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field

from . import _libbpf as _lb
from . import netns as _netns
from .errors import BPFError, error

# enum bpf_map_type / bpf_prog_type / bpf_link_type / bpf_attach_type values this loader names
# itself (libbpf 1.1 predates some of them).
MAP_TYPES = {
    0: "unspec", 1: "hash", 2: "array", 3: "prog_array", 4: "perf_event_array",
    5: "percpu_hash", 6: "percpu_array", 7: "stack_trace", 8: "cgroup_array", 9: "lru_hash",
    10: "lru_percpu_hash", 11: "lpm_trie", 12: "array_of_maps", 13: "hash_of_maps",
    14: "devmap", 15: "sockmap", 16: "cpumap", 17: "xskmap", 18: "sockhash",
    19: "cgroup_storage", 20: "reuseport_sockarray", 21: "percpu_cgroup_storage", 22: "queue",
    23: "stack", 24: "sk_storage", 25: "devmap_hash", 26: "struct_ops", 27: "ringbuf",
    28: "inode_storage", 29: "task_storage", 30: "bloom_filter", 31: "user_ringbuf",
    32: "cgrp_storage", 33: "arena",
}  # fmt: skip
LINK_TYPES = {
    0: "unspec", 1: "raw_tracepoint", 2: "tracing", 3: "cgroup", 4: "iter", 5: "netns",
    6: "xdp", 7: "perf_event", 8: "kprobe_multi", 9: "struct_ops", 10: "netfilter", 11: "tcx",
    12: "uprobe_multi", 13: "netkit", 14: "sockmap",
}  # fmt: skip
BPF_LINK_TYPE_TCX = 11
BPF_TCX_INGRESS = 46
BPF_TCX_EGRESS = 47
TCX_ATTACH_TYPES = {"ingress": BPF_TCX_INGRESS, "egress": BPF_TCX_EGRESS}
ATTACH_TYPE_NAMES = {BPF_TCX_INGRESS: "tcx_ingress", BPF_TCX_EGRESS: "tcx_egress"}


def map_type_name(t: int) -> str:
    return MAP_TYPES.get(t) or _lb.cstr(_lb.lib.libbpf_bpf_map_type_str(t)) or f"type{t}"


def prog_type_name(t: int) -> str:
    return _lb.cstr(_lb.lib.libbpf_bpf_prog_type_str(t)) or f"type{t}"


def tcx_attach_type(direction: str) -> int:
    try:
        return TCX_ATTACH_TYPES[direction]
    except KeyError:
        raise ValueError(f"direction must be 'ingress' or 'egress', not {direction!r}") from None


@dataclass(frozen=True)
class MapInfo:
    """What the kernel reports about a map (struct bpf_map_info)."""

    id: int
    name: str
    type: int
    type_name: str
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    btf_id: int = 0
    map_extra: int = 0


@dataclass(frozen=True)
class ProgInfo:
    """What the kernel reports about a program (struct bpf_prog_info)."""

    id: int
    name: str
    type: int
    type_name: str
    tag: str
    load_time_ns: int  # CLOCK_BOOTTIME ns at load, as the kernel reports it
    loaded_at: float  # the same instant as a Unix timestamp
    created_by_uid: int
    map_ids: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class LinkInfo:
    """What the kernel reports about a link; ifindex/attach_type are set for tcx links."""

    id: int
    type: int
    type_name: str
    prog_id: int
    ifindex: int | None = None
    attach_type: int | None = None

    @property
    def direction(self) -> str | None:
        return {BPF_TCX_INGRESS: "ingress", BPF_TCX_EGRESS: "egress"}.get(self.attach_type or -1)


def _get_info(fd: int, info: ctypes.Structure, what: str) -> None:
    size = ctypes.c_uint32(ctypes.sizeof(info))
    _lb.check(_lb.lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)), what)


def map_info_fd(fd: int) -> MapInfo:
    """Info of the map behind ``fd``."""
    i = _lb.BpfMapInfo()
    _get_info(fd, i, "map info")
    return MapInfo(
        id=i.id,
        name=i.name.decode(errors="replace"),
        type=i.type,
        type_name=map_type_name(i.type),
        key_size=i.key_size,
        value_size=i.value_size,
        max_entries=i.max_entries,
        flags=i.map_flags,
        btf_id=i.btf_id,
        map_extra=i.map_extra,
    )


def prog_info_fd(fd: int) -> ProgInfo:
    """Info of the program behind ``fd`` (including the ids of the maps it uses)."""
    i = _lb.BpfProgInfo()
    _get_info(fd, i, "program info")
    map_ids: tuple[int, ...] = ()
    if i.nr_map_ids:
        ids = (ctypes.c_uint32 * i.nr_map_ids)()
        j = _lb.BpfProgInfo()
        j.nr_map_ids = i.nr_map_ids
        j.map_ids = ctypes.addressof(ids)
        _get_info(fd, j, "program info")
        map_ids = tuple(ids[: min(j.nr_map_ids, i.nr_map_ids)])
    boot_now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return ProgInfo(
        id=i.id,
        name=i.name.decode(errors="replace"),
        type=i.type,
        type_name=prog_type_name(i.type),
        tag=bytes(i.tag).hex(),
        load_time_ns=i.load_time,
        loaded_at=time.time() - (boot_now - i.load_time) / 1e9,
        created_by_uid=i.created_by_uid,
        map_ids=map_ids,
    )


def link_info_fd(fd: int) -> LinkInfo:
    """Info of the link behind ``fd``."""
    i = _lb.BpfLinkInfo()
    _get_info(fd, i, "link info")
    ifindex = attach_type = None
    if i.type == BPF_LINK_TYPE_TCX:
        ifindex, attach_type = (int.from_bytes(bytes(i.u[k : k + 4]), "little") for k in (0, 4))
    return LinkInfo(i.id, i.type, LINK_TYPES.get(i.type, f"type{i.type}"), i.prog_id, ifindex, attach_type)


def _by_id(getter: str, oid: int, what: str) -> int:
    fd = getattr(_lb.lib, getter)(oid)
    if fd < 0:
        raise error(f"{what} {oid}", -fd, key_op=True)
    return int(fd)


def prog_info(prog_id: int) -> ProgInfo:
    """Info of program ``prog_id``; KeyNotFound if it no longer exists."""
    fd = _by_id("bpf_prog_get_fd_by_id", prog_id, "program")
    try:
        return prog_info_fd(fd)
    finally:
        os.close(fd)


def map_info(map_id: int) -> MapInfo:
    """Info of map ``map_id``; KeyNotFound if it no longer exists."""
    fd = _by_id("bpf_map_get_fd_by_id", map_id, "map")
    try:
        return map_info_fd(fd)
    finally:
        os.close(fd)


def link_info(link_id: int) -> LinkInfo:
    """Info of link ``link_id``; KeyNotFound if it no longer exists."""
    fd = _by_id("bpf_link_get_fd_by_id", link_id, "link")
    try:
        return link_info_fd(fd)
    finally:
        os.close(fd)


def _ids(getter: str) -> list[int]:
    out: list[int] = []
    cur = ctypes.c_uint32(0)
    nxt = ctypes.c_uint32(0)
    while getattr(_lb.lib, getter)(cur.value, ctypes.byref(nxt)) == 0:
        out.append(nxt.value)
        cur.value = nxt.value
    return out


def prog_ids() -> list[int]:
    """Ids of every loaded program."""
    return _ids("bpf_prog_get_next_id")


def map_ids() -> list[int]:
    """Ids of every map."""
    return _ids("bpf_map_get_next_id")


def link_ids() -> list[int]:
    """Ids of every link."""
    return _ids("bpf_link_get_next_id")


def link_info_all() -> list[LinkInfo]:
    """Info of every link in the system (links that vanish while listing are skipped)."""
    out = []
    for lid in link_ids():
        try:
            out.append(link_info(lid))
        except BPFError:
            continue
    return out


@dataclass(frozen=True)
class TcxQuery:
    """Programs and links attached at one tcx hook, in execution order, and the hook revision."""

    prog_ids: list[int]
    link_ids: list[int]
    revision: int


def query_tcx_full(ifindex: int, direction: str, netns: str | None = None) -> TcxQuery:
    """BPF_PROG_QUERY on a tcx hook via the raw syscall (libbpf 1.1's opts lack link_ids/revision).

    ``ifindex`` is resolved in ``netns`` (a /run/netns name or path) when given, else in the
    caller's namespace.
    """
    attach = tcx_attach_type(direction)
    with _netns.enter(netns):
        cap = 64
        while True:
            progs = (ctypes.c_uint32 * cap)()
            links = (ctypes.c_uint32 * cap)()
            attr = _lb.BpfAttrQuery(
                target_fd=ifindex,
                attach_type=attach,
                prog_ids=ctypes.addressof(progs),
                link_ids=ctypes.addressof(links),
                count=cap,
            )
            ret = _lb.sys_bpf(_lb.BPF_PROG_QUERY, attr)
            if ret == -28 and attr.count > cap:  # ENOSPC: more programs than room
                cap = attr.count
                continue
            if ret < 0:
                raise error(f"query tcx {direction} on ifindex {ifindex}", -ret)
            n = attr.count
            return TcxQuery(list(progs[:n]), [x for x in links[:n]], attr.revision)


def query_tcx(ifindex: int, direction: str, netns: str | None = None) -> list[int]:
    """Ids of the programs attached at the tcx ``direction`` hook of ``ifindex``, in order.

    Uses libbpf's bpf_prog_query_opts (its prog_ids field is enough; target_fd doubles as the
    ifindex for tcx attach types).
    """
    attach = tcx_attach_type(direction)
    with _netns.enter(netns):
        cap = 64
        while True:
            ids = (ctypes.c_uint32 * cap)()
            opts = _lb.BpfProgQueryOpts(sz=ctypes.sizeof(_lb.BpfProgQueryOpts))
            opts.prog_ids = ids
            opts.prog_cnt = cap
            ret = _lb.lib.bpf_prog_query_opts(ifindex, attach, ctypes.byref(opts))
            if ret == -28 and opts.prog_cnt > cap:
                cap = opts.prog_cnt
                continue
            _lb.check(ret, f"query tcx {direction} on ifindex {ifindex}")
            return list(ids[: opts.prog_cnt])
