"""Flow events (ring buffer records) and per-CPU packet counters by reason (C: lace/abi/trace.h)."""

from __future__ import annotations

import enum
import ipaddress
from typing import Any

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


def decode_trace_event(raw: bytes) -> dict[str, Any]:
    """A flow event with enums by label and addresses as strings (NAT and SID fields only when set)."""
    e = TRACE_EVENT.unpack(raw)
    fam = e["family"]
    out: dict[str, Any] = {
        "ts_ns": e["ts_ns"],
        "ifindex": e["ifindex"],
        "pkt_len": e["pkt_len"],
        "point": enum_label(TracePoint, e["point"]),
        "verdict": enum_label(Verdict, e["verdict"]),
        "reason": enum_label(DropReason, e["reason"]),
        "family": enum_label(Family, fam),
        "proto": enum_label(Proto, e["proto"]),
        "ct_status": enum_label(CtStatus, e["ct_status"]),
        "delivery": enum_label(DeliveryKind, e["delivery"]),
        "src_network": e["src_network"],
        "dst_network": e["dst_network"],
        "src_segment": e["src_segment"],
        "dst_segment": e["dst_segment"],
        "saddr": addr_str(fam, e["saddr"]),
        "daddr": addr_str(fam, e["daddr"]),
        "sport": e["sport"],
        "dport": e["dport"],
        "tcp_flags": tcp_flag_labels(e["tcp_flags"]) if e["proto"] == Proto.TCP else [],
        "policy_id": e["policy_id"],
        "rule": e["rule"],
        "nat_kind": enum_label(NatKind, e["nat_kind"]),
        "nat_addr": addr_str(fam, e["nat_addr"]) if e["nat_kind"] else None,
        "nat_port": e["nat_port"] if e["nat_kind"] else None,
        "delivery_ifindex": e["delivery_ifindex"],
        "sid": str(ipaddress.IPv6Address(e["sid"])) if e["delivery"] == DeliveryKind.REMOTE else None,
        "node_id": e["node_id"],
    }
    return out


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
