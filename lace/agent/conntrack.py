"""Conntrack housekeeping the agent does: flushing the entries of an endpoint that went away, and
the periodic GC pass (:func:`gc_pass`): expired entries deleted, each local endpoint's flows
recounted against its conntrack limit, table fill and masquerade port use measured for the status
document and the metrics; and reading which frontends live service flows still name (the revnat
entries they need, :func:`revnat_in_use`)."""

from __future__ import annotations

import contextlib
import ipaddress
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from lace.bpf import BPFError
from lace.datapath import registry
from lace.datapath.common import Family, addr_str
from lace.datapath.conntrack import (CT4_KEY, CT6_KEY, CT_ENDPOINT_KEY, CT_ENTRY, CtFlag, ct_endpoint_key,
                                     ct_endpoint_value)
from lace.datapath.masquerade import MASQ_PORT_COUNT
from lace.datapath.services import REVNAT_KEY, revnat_key
from lace.datapath.node import LoadedDatapath

IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

if TYPE_CHECKING:
    from .datapath import NodeDatapath


def _decoded(m: Any, v6: bool) -> tuple[Any, np.ndarray, np.ndarray, int] | None:
    """A conntrack table's raw keys, its keys and entries decoded (NumPy), and their number; None
    when it is empty."""
    keys, values, n = m.dump()
    if not n:
        return None
    return keys, (CT6_KEY if v6 else CT4_KEY).decode_many(keys, n), CT_ENTRY.decode_many(values, n), n


def _delete_rows(m: Any, keys: Any, sel: np.ndarray) -> int:
    """Delete the entries of table m whose rows sel picks (keys: its raw dump); returns how many."""
    idx = np.nonzero(sel)[0]
    if not len(idx):
        return 0
    kb = bytes(keys)
    return m.delete_batch(b"".join(kb[i * m.key_size:(i + 1) * m.key_size] for i in idx), len(idx))


def flush_addresses(datapath: LoadedDatapath | NodeDatapath, network: int, ips: list) -> int:
    """Delete every conntrack entry of ``network`` whose source or destination is one of ``ips``,
    every flow keyed in another network (the client's: the outside's flows a frontend relayed here,
    a network that imports this one) whose destination is one of them in ``network``, and every
    service flow (whatever network its client is in) whose backend is one of them in ``network``:
    a flow to a pod that is gone goes nowhere, and its client's next packet should meet the pod
    given that address next, or the service, as a new flow.

    ``datapath`` hands out the loaded maps by CLI name: a :class:`~lace.datapath.node.LoadedDatapath`
    or the agent's ``NodeDatapath`` (which holds one).  The tables are read as raw arrays
    (``Map.dump``) and matched with NumPy: a table holds up to a million entries.
    """
    removed = 0
    for name in registry.CT_TABLES:
        v6 = name.endswith("v6")
        wanted = [ip for ip in ips if ip.version == (6 if v6 else 4)]
        if not wanted:
            continue
        m = datapath.map(name)
        table = _decoded(m, v6)
        if table is None:
            continue
        keys, arr, val, n = table
        width = 16 if v6 else 4
        source = np.zeros(n, dtype=bool)
        dest = np.zeros(n, dtype=bool)
        backend = np.zeros(n, dtype=bool)
        nat = val["nat_addr"]
        for ip in wanted:
            packed = ipaddress.ip_address(ip).packed
            raw = np.frombuffer(packed, dtype=f"V{width}")[0]
            source |= arr["saddr"] == raw
            dest |= arr["daddr"] == raw
            backend |= nat == np.frombuffer(packed.ljust(16, b"\0"), dtype="V16")[0]
        into = val["dst_network"] == network
        sel = ((source | dest) & (arr["network"] == network)) | (dest & into)
        sel |= backend & ((val["flags"] & np.uint8(CtFlag.SERVICE)) != 0) & into
        removed += _delete_rows(m, keys, sel)
    return removed


def _void(raw: bytes, width: int) -> Any:
    """An address as the NumPy scalar a decoded table's column of that width compares with."""
    return np.frombuffer(raw.ljust(width, b"\0"), dtype=f"V{width}")[0]


def flush_service_flows(datapath: LoadedDatapath | NodeDatapath,
                        departed: list[tuple[bytes, tuple[int, str, int]]]) -> int:
    """Delete the UDP service flows of ``departed`` pairs (revnat key of a backend that left a
    service, frontend (source network, address, port) it left): each flow's frontend entry (SERVICE,
    keyed client -> frontend under the frontend's source network, holding the backend), and where
    the flow kept a backend entry (DNAT, keyed client -> backend, holding the frontend) that entry
    and its reply alias. The client's next datagram is then a new flow and gets a backend the
    service has now (ServiceProgrammer.take_departed). Returns the number of entries deleted."""
    removed = 0
    for v6, name in ((False, "ct-udp-v4"), (True, "ct-udp-v6")):
        width = 16 if v6 else 4
        wanted = []
        for k, (net, frontend, fport) in departed:
            b = REVNAT_KEY.unpack(k)
            if (b["family"] == Family.IPV6) == v6:
                wanted.append((net, ipaddress.ip_address(frontend).packed, fport,
                               b["network"], bytes(b["addr"])[:width], b["port"]))
        m = datapath.map(name) if wanted else None
        table = _decoded(m, v6) if m is not None else None
        if table is None:
            continue
        keys, arr, val, n = table
        flags = val["flags"]
        service = (flags & np.uint8(CtFlag.SERVICE)) != 0
        dnat = (flags & np.uint8(CtFlag.DNAT)) != 0
        alias = (flags & np.uint8(CtFlag.ALIAS)) != 0
        sel = np.zeros(n, dtype=bool)
        for net, fe, fport, bnet, be, bport in wanted:
            front = (arr["network"] == net) & (arr["daddr"] == _void(fe, width)) & (arr["dport"] == fport)
            sel |= service & front & (val["nat_addr"] == _void(be, 16)) & (val["nat_port"] == bport) & \
                (val["dst_network"] == bnet)
            back = (arr["network"] == net) & (arr["daddr"] == _void(be, width)) & (arr["dport"] == bport) & dnat & \
                (val["nat_addr"] == _void(fe, 16)) & (val["nat_port"] == fport) & (val["dst_network"] == bnet)
            sel |= back
            if bnet != net and back.any():
                # the reply alias of each such backend entry: the same tuple under the backend's network
                clients = set(zip(arr["saddr"][back].tolist(), arr["sport"][back].tolist()))
                near = np.nonzero(alias & (arr["network"] == bnet) & (arr["daddr"] == _void(be, width)) &
                                  (arr["dport"] == bport) & (val["dst_network"] == net))[0]
                for i in near:
                    if (arr["saddr"][i].tolist(), int(arr["sport"][i])) in clients:
                        sel[i] = True
        removed += _delete_rows(m, keys, sel)
    return removed


# ---- the conntrack GC pass -------------------------------------------------------------------------

#: how often the agent walks the conntrack tables (--ct-gc-interval)
GC_INTERVAL_SECONDS = 10.0
#: entries the datapath never counts against an endpoint: a kubelet probe's backend entry (DNAT),
#: a masquerade port reservation (MASQ), a reply alias (ALIAS) — one flow counts once, by the entry
#: keyed with the pod's own address (plain, SERVICE frontend, SNAT pod entry)
UNCOUNTED = int(CtFlag.DNAT | CtFlag.MASQ | CtFlag.ALIAS)
#: at most this many masquerade destinations are reported (the fullest)
MASQ_REPORTED = 5
_PROTO_NAMES = {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmp"}


@dataclass(frozen=True)
class GcEndpoint:
    """A local endpoint as the GC pass counts it: its veth, network, addresses and limit."""

    pod: str
    ifindex: int
    ifname: str
    network: int
    ips: tuple[IPAddr, ...]
    limit: int


@dataclass
class GcResult:
    """What one pass found and did (``as_dict`` feeds the status document and the metrics)."""

    finished: float
    duration: float
    deleted: int
    tables: list[dict[str, Any]]
    endpoints: list[dict[str, Any]]
    masquerade: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"finished": self.finished, "duration": round(self.duration, 4), "deleted": self.deleted,
                "tables": self.tables, "endpoints": self.endpoints, "masquerade": self.masquerade}


def _rows(keys: Any, n: int, key_size: int) -> np.ndarray:
    """The ``n`` raw keys as an (n, key_size) byte array (a view, no copy)."""
    return np.frombuffer(keys, dtype=np.uint8, count=n * key_size).reshape(n, key_size)


def _source_id(network: int, ip: IPAddr) -> bytes:
    """The first bytes of a conntrack key of ``network`` with source ``ip``: (network, saddr)."""
    return network.to_bytes(4, "little") + ip.packed


def _count_sources(rows: np.ndarray, sel: np.ndarray, prefix: int, sources: dict[bytes, int]) -> dict[int, int]:
    """How many of the selected keys each local endpoint's (network, source) prefix has. A 64-bit
    tag (the prefix's last 8 bytes: the whole IPv4 prefix, an IPv6 source's low half) picks the
    candidates in one vectorised pass over the table; only those are grouped exactly."""
    tag = np.ascontiguousarray(rows[:, prefix - 8:prefix]).view("<u8").ravel()
    wanted = np.array([int.from_bytes(sid[-8:], "little") for sid in sources], dtype="<u8")
    cand = sel & np.isin(tag, wanted)
    held: dict[int, int] = {}
    if not cand.any():
        return held
    ids, counts = np.unique(np.ascontiguousarray(rows[cand, :prefix]).view(f"V{prefix}").ravel(),
                            return_counts=True)
    for sid, c in zip(ids, counts):
        ifindex = sources.get(bytes(sid))
        if ifindex is not None:
            held[ifindex] = held.get(ifindex, 0) + int(c)
    return held


def walk_table(name: str, keys: Any, values: Any, n: int, now_ns: int,
               sources: dict[bytes, int]) -> tuple[np.ndarray, dict[int, int], list[tuple]]:
    """One table, read: the indexes of its expired entries, the live flows each local endpoint
    holds (``sources``: key prefix -> ifindex) and the live masquerade reservations per
    destination as (proto, remote, remote port, ports held). Pure (unit tests call it with packed
    entries) and vectorised: a table holds up to a million entries."""
    v6 = name.endswith("v6")
    layout = CT6_KEY if v6 else CT4_KEY
    if not n:
        return np.zeros(0, dtype=np.intp), {}, []
    alen = 16 if v6 else 4
    rows = _rows(keys, n, layout.size)
    vals = CT_ENTRY.decode_many(values, n)
    expired = vals["expires_ns"] < now_ns
    counted = ~expired & ((vals["flags"] & UNCOUNTED) == 0)
    held = _count_sources(rows, counted, 4 + alen, sources) if sources else {}
    reservations = []
    masq = ~expired & ((vals["flags"] & int(CtFlag.MASQ)) != 0)
    if masq.any():
        # (daddr, dport, proto) of each reservation: key bytes [4 + alen, 4 + 2 alen), then dport, proto
        dest = np.concatenate([rows[masq, 4 + alen:4 + 2 * alen], rows[masq, 6 + 2 * alen:9 + 2 * alen]], axis=1)
        ids, counts = np.unique(np.ascontiguousarray(dest).view(f"V{alen + 3}").ravel(), return_counts=True)
        family = Family.IPV6 if v6 else Family.IPV4
        for d, c in zip(ids, counts):
            raw = bytes(d)
            reservations.append((raw[alen + 2], addr_str(family, raw[:alen]),
                                 int.from_bytes(raw[alen:alen + 2], "big"), int(c)))
    return np.nonzero(expired)[0], held, reservations


#: at most this many expired entries are deleted per table and pass (each is looked up again
#: first: two system calls); the rest wait for the next pass — the datapath ignores them already,
#: and a full LRU table evicts them first
DELETE_MAX = 20000


def _delete_expired(m: Any, keys: Any, idx: np.ndarray, now_ns: int) -> int:
    """Delete the entries at ``idx`` that are still expired: a packet may have replaced one with a
    fresh entry of the same tuple since the dump (a new flow takes an expired tuple's place)."""
    rows = _rows(keys, int(idx.max()) + 1, m.key_size) if len(idx) else None
    deleted = 0
    for i in idx[:DELETE_MAX]:
        k = rows[int(i)].tobytes()   # type: ignore[index]
        raw = m.lookup(k)
        if raw is None or CT_ENTRY.unpack(raw)["expires_ns"] >= now_ns:
            continue
        with contextlib.suppress(BPFError):   # gone meanwhile (evicted, flushed): nothing to do
            m.delete(k)
            deleted += 1
    return deleted


def gc_pass(datapath: LoadedDatapath | NodeDatapath, endpoints: list[GcEndpoint],
            now_ns: int | None = None) -> GcResult:
    """Walk every conntrack table: delete the entries that expired (the datapath already ignores
    them; deleting frees their slots and their masquerade ports), count the live flows each local
    endpoint holds per table and write those true counts into endpoint-ct, and measure each
    table's fill and the fullest masquerade destinations.

    The datapath adds one to an endpoint's count when a new flow it stored is on its way and never
    subtracts: between passes the count may run ahead of the truth by the flows that expired or were
    evicted (or flushed) since the last pass — so an endpoint can be refused up to one interval early,
    never let past its limit by them. A flow created while this pass walks the
    tables may be missed by the count it writes (the write replaces the datapath's addition): the
    count runs behind by at most the flows the endpoint opened during one pass (milliseconds) and is
    right again at the next pass."""
    started = time.monotonic()
    now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC) if now_ns is None else now_ns
    sources = {_source_id(ep.network, ip): ep.ifindex for ep in endpoints for ip in ep.ips}
    held: dict[int, dict[str, int]] = {ep.ifindex: {} for ep in endpoints}
    masq: dict[tuple, int] = {}
    tables, deleted = [], 0
    for name in registry.CT_TABLES:
        m = datapath.map(name)
        keys, values, n = m.dump()
        expired, by_ep, reservations = walk_table(name, keys, values, n, now_ns, sources)
        gone = _delete_expired(m, keys, expired, now_ns) if len(expired) else 0
        deleted += gone
        for ifindex, c in by_ep.items():
            held[ifindex][name] = c
        for proto, remote, port, used in reservations:
            masq[(proto, remote, port)] = masq.get((proto, remote, port), 0) + used
        tables.append({"table": name, "entries": n - gone, "capacity": m.max_entries})
    _write_counts(datapath.map("endpoint-ct"), endpoints, held)
    eps = [{"pod": ep.pod, "ifname": ep.ifname, "ifindex": ep.ifindex, "limit": ep.limit,
            "flows": {t: c for t, c in held[ep.ifindex].items() if c}} for ep in endpoints]
    fullest = sorted(masq.items(), key=lambda kv: -kv[1])[:MASQ_REPORTED]
    destinations = [{"proto": _PROTO_NAMES.get(p, str(p)), "remote": remote, "port": port, "used": used,
                     "capacity": MASQ_PORT_COUNT} for (p, remote, port), used in fullest]
    return GcResult(time.time(), time.monotonic() - started, deleted, tables, eps, destinations)


def _write_counts(m: Any, endpoints: list[GcEndpoint], held: dict[int, dict[str, int]]) -> None:
    """The true counts for every endpoint that has a limit; no entry for one without (the datapath
    neither counts nor reads it) or for an interface that is no longer a local endpoint."""
    limited = {ep.ifindex for ep in endpoints if ep.limit}
    for k in list(m.keys()):
        if CT_ENDPOINT_KEY.unpack(k)["ifindex"] not in limited:
            with contextlib.suppress(BPFError):
                m.delete(k)
    for ifindex in limited:
        m.update(ct_endpoint_key(ifindex), ct_endpoint_value(held.get(ifindex, {})))


def revnat_in_use(datapath: LoadedDatapath | NodeDatapath) -> set[tuple[bytes, tuple[int, str, int]]]:
    """(revnat key of the backend, frontend (source network, address, port)) of every live service
    flow's entry: the frontends the backends' revnat entries must keep (ServiceProgrammer.release_revnat).
    An entry past its expiry counts no more (the datapath ignores it, the LRU reclaims it later)."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out: set[tuple[bytes, tuple[int, str, int]]] = set()
    for name in registry.CT_TABLES:
        if "icmp" in name:
            continue   # services are TCP and UDP only
        v6 = name.endswith("v6")
        keys, values, n = datapath.map(name).dump()
        if not n:
            continue
        arr = (CT6_KEY if v6 else CT4_KEY).decode_many(keys, n)
        val = CT_ENTRY.decode_many(values, n)
        idx = np.nonzero(((val["flags"] & np.uint8(CtFlag.SERVICE)) != 0) & (val["expires_ns"] >= now))[0]
        width = 16 if v6 else 4
        for i in idx:
            backend = ipaddress.ip_address(bytes(val["nat_addr"][i])[:width])
            frontend = ipaddress.ip_address(bytes(arr["daddr"][i]))
            key = revnat_key(int(val["dst_network"][i]), backend, int(val["nat_port"][i]), int(arr["proto"][i]))
            out.add((key, (int(arr["network"][i]), str(frontend), int(arr["dport"][i]))))
    return out
