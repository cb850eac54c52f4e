"""Flow events (ring buffer records) and per-CPU packet counters by reason (C: lace/abi/trace.h)."""

from __future__ import annotations

import enum
import socket
from typing import Any

import numpy as np

from lace.bpf.layout import Layout
from lace.datapath.common import Family, Proto, Verdict, addr_str, enum_label
from lace.datapath.conntrack import CtStatus, tcp_flag_labels
from lace.datapath.delivery import DeliveryKind
from lace.datapath.reasons import DropReason, TracePoint

EVENTS_BYTES = 4 * 1024 * 1024
METRICS_MAX = 4 << 11


class NatKind(enum.IntEnum):
    """Address translation applied to a traced packet (C: enum lace_nat_kind).

    DNAT (a service flow), in both directions: the event's addresses and ports are the backend
    side of the flow (forward: client -> backend, reply: backend -> client) and
    ``nat_addr``:``nat_port`` the frontend (VIP:port) it stands for.
    """

    NONE = 0
    DNAT = 1
    SNAT = 2

    @property
    def label(self) -> str:
        return self.name.lower()


#: struct lace_trace_event (trace.h): one ring buffer record
TRACE_EVENT = Layout(
    "struct lace_trace_event",
    [
        ("ts_ns", "u64"),
        ("ifindex", "u32"),
        ("pkt_len", "u32"),
        ("point", "u8"),
        ("verdict", "u8"),
        ("reason", "u16"),
        ("family", "u8"),
        ("proto", "u8"),
        ("ct_status", "u8"),
        ("delivery", "u8"),
        ("src_network", "u32"),
        ("dst_network", "u32"),
        ("src_segment", "u32"),
        ("dst_segment", "u32"),
        ("saddr", "bytes:16"),
        ("daddr", "bytes:16"),
        ("sport", "be16"),
        ("dport", "be16"),
        ("policy_id", "u32"),
        ("nat_addr", "bytes:16"),
        ("nat_port", "be16"),
        ("nat_kind", "u8"),
        ("tcp_flags", "u8"),
        ("delivery_ifindex", "u32"),
        ("sid", "bytes:16"),
        ("node_id", "u32"),
        ("rule", "u16"),
        ("reserved", "u16"),
    ],
)

#: metrics is a per-CPU array: the key is LACE_METRICS_INDEX(reason, point, verdict) (trace.h)
METRICS_KEY = Layout("__u32", [("index", "u32")])
METRICS_REASON_BITS = 8
METRICS_POINT_BITS = 3

#: struct lace_metrics_value (trace.h): one per CPU
METRICS_VALUE = Layout("struct lace_metrics_value", [("packets", "u64"), ("bytes", "u64")])

C_MACROS: dict[str, int] = {
    "LACE_EVENTS_BYTES": EVENTS_BYTES,
    "LACE_METRICS_MAX": METRICS_MAX,
    "LACE_METRICS_REASON_BITS": METRICS_REASON_BITS,
    "LACE_METRICS_POINT_BITS": METRICS_POINT_BITS,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {
    "lace_nat_kind": (NatKind, "LACE_NAT_"),
}


#: struct lace_trace_event compiled once (the big-endian ports come as raw u16: swapped below)
_EVENT = TRACE_EVENT.struct
_V4_MAPPED = b"\0" * 10 + b"\xff\xff"


class _Labels:
    """Every enum's label by value, looked up once: the flow collector decodes every ring buffer
    record, and ``enum_label`` (an enum construction, an exception for an unknown value) per field
    cost five times the rest of the decoding."""

    def __init__(self) -> None:
        def table(cls: type[enum.IntEnum], n: int = 256) -> list[Any]:
            return [enum_label(cls, i) for i in range(n)]
        self.point = table(TracePoint)
        self.verdict = table(Verdict)
        self.reason = table(DropReason, 1024)   # u16: a code past the table is unknown anyway
        self.family = table(Family)
        self.proto = table(Proto)
        self.ct_status = table(CtStatus)
        self.delivery = table(DeliveryKind)
        self.nat = table(NatKind)
        self.tcp_flags = [tcp_flag_labels(i) for i in range(256)]


_labels: _Labels | None = None


def _addr(fam: int, raw: bytes) -> str:
    """``addr_str`` for the hot path: inet_ntop, except for a v4-mapped IPv6 address, which
    ipaddress spells ``::ffff:a00:1`` (as every other command shows it) and inet_ntop as ``::ffff:10.0.0.1``."""
    if fam == Family.IPV4:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if fam == Family.IPV6 and raw[:12] != _V4_MAPPED:
        return socket.inet_ntop(socket.AF_INET6, raw)
    return addr_str(fam, raw)


def decode_trace_event(raw: bytes) -> dict[str, Any]:
    """A flow event with enums by label (the number when unknown) and addresses as strings (NAT
    and SID fields only when set).  The flow collector decodes every record it shows with it, so
    it unpacks the compiled struct once and reads labels from tables built on first use."""
    global _labels
    L = _labels or _Labels()
    _labels = L
    (ts, ifindex, pkt_len, point, verdict, reason, fam, proto, ct_status, delivery, src_net, dst_net,
     src_seg, dst_seg, saddr, daddr, sport, dport, policy_id, nat_addr, nat_port, nat_kind, tcp_flags,
     delivery_ifindex, sid, node_id, rule, _reserved) = _EVENT.unpack_from(raw)
    return {
        "ts_ns": ts, "ifindex": ifindex, "pkt_len": pkt_len,
        "point": L.point[point], "verdict": L.verdict[verdict], "reason": L.reason[reason] if reason < 1024 else reason,
        "family": L.family[fam], "proto": L.proto[proto], "ct_status": L.ct_status[ct_status],
        "delivery": L.delivery[delivery],
        "src_network": src_net, "dst_network": dst_net, "src_segment": src_seg, "dst_segment": dst_seg,
        "saddr": _addr(fam, saddr), "daddr": _addr(fam, daddr),
        "sport": ((sport & 0xFF) << 8) | (sport >> 8), "dport": ((dport & 0xFF) << 8) | (dport >> 8),
        "tcp_flags": L.tcp_flags[tcp_flags] if proto == Proto.TCP else [],
        "policy_id": policy_id, "rule": rule,
        "nat_kind": L.nat[nat_kind],
        "nat_addr": _addr(fam, nat_addr) if nat_kind else None,
        "nat_port": (((nat_port & 0xFF) << 8) | (nat_port >> 8)) if nat_kind else None,
        "delivery_ifindex": delivery_ifindex,
        "sid": _addr(Family.IPV6, sid) if delivery == DeliveryKind.REMOTE else None,
        "node_id": node_id,
    }


#: a record's first bytes: ts_ns, ifindex and pkt_len, which change with every packet of a flow;
#: the rest (from ``point`` on) is what a flow filter reads, so it keys a filter's cached answers
PER_PACKET_BYTES = TRACE_EVENT.field("point").offset


def record_ts(data: bytes) -> list[int]:
    """``ts_ns`` of each record in ``data`` (records back to back, as a ring buffer read gives them)."""
    return np.frombuffer(data, dtype="<u8")[:: TRACE_EVENT.size // 8].tolist() if data else []


def wall_time(ts_ns: int, offset_ns: int) -> float:
    """An event's ``time``: its monotonic ``ts_ns`` (bpf_ktime_get_ns) on the wall clock, through
    the offset between the two clocks the flow collector measured when it read the record."""
    return (ts_ns + offset_ns) / 1e9


def metrics_index(reason: int, point: int, verdict: int) -> int:
    """LACE_METRICS_INDEX: (verdict, point, reason) packed into one array index."""
    return ((int(verdict) & 3) << (METRICS_REASON_BITS + METRICS_POINT_BITS)) | \
        ((int(point) & 7) << METRICS_REASON_BITS) | (int(reason) & 0xFF)


def metrics_key(reason: int, point: int, verdict: int) -> bytes:
    return METRICS_KEY.pack(index=metrics_index(reason, point, verdict))


def decode_metrics_key(raw: bytes) -> dict[str, Any]:
    i = METRICS_KEY.unpack(raw)["index"]
    return {
        "reason": enum_label(DropReason, i & 0xFF),
        "point": enum_label(TracePoint, (i >> METRICS_REASON_BITS) & 7),
        "verdict": enum_label(Verdict, i >> (METRICS_REASON_BITS + METRICS_POINT_BITS)),
    }


def decode_metrics_value(raw: bytes) -> dict[str, Any]:
    """One CPU's counters; callers of a per-CPU lookup sum them."""
    return METRICS_VALUE.unpack(raw)
