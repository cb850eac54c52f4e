"""ct-{tcp,udp,icmp}-{v4,v6}: connection tracking, one table per protocol and family (C: lace/abi/conntrack.h).

Keys carry the source network of the original direction.  ICMP echo uses the identifier as both
ports, so the reply's reversed tuple finds the same entry.  Entry times are CLOCK_MONOTONIC ns.
"""

from __future__ import annotations

import enum
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import (
    AddressLike,
    Family,
    Proto,
    addr_bytes,
    addr_str,
    check_port,
    check_u32,
    enum_label,
    family_of,
    flag_labels,
    ip,
)
from lace.datapath.delivery import DeliveryKind

CT_TCP_MAX = 262144
CT_UDP_MAX = 131072
CT_ICMP_MAX = 32768

# Timeouts in seconds by state.
CT_TIMEOUT_SYN = 60
CT_TIMEOUT_ESTABLISHED = 21600
CT_TIMEOUT_FIN = 120
CT_TIMEOUT_CLOSE = 10
CT_TIMEOUT_UDP = 30
CT_TIMEOUT_UDP_REPLIED = 180
CT_TIMEOUT_ICMP = 30


class CtState(enum.IntEnum):
    """State of a tracked connection (C: enum lace_ct_state)."""

    NONE = 0
    SYN_SENT = 1
    SYN_RECV = 2
    ESTABLISHED = 3
    FIN_WAIT = 4  # one side sent FIN
    CLOSING = 5  # both sides sent FIN
    CLOSED = 6  # RST seen
    UNREPLIED = 7  # UDP / ICMP: no reply yet
    REPLIED = 8  # UDP / ICMP: seen both ways

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


class CtStatus(enum.IntEnum):
    """How a packet related to conntrack, reported in trace events (C: enum lace_ct_status)."""

    NONE = 0
    NEW = 1
    ESTABLISHED = 2
    REPLY = 3
    RELATED = 4

    @property
    def label(self) -> str:
        return self.name.lower()


class CtFlag(enum.IntFlag):
    """Bits of lace_ct_entry.flags (LACE_CT_F_*)."""

    SEEN_REPLY = 0x01
    DNAT = 0x02  # a kubelet probe's backend entry: replies get nat_addr:nat_port as their source
    SNAT = 0x04  # pod entry of a masqueraded flow: the source leaves as nat_addr:nat_port
    AUDIT = 0x08  # admitted by audit mode
    PROBE = 0x10  # a kubelet probe connection
    SERVICE = 0x20  # a service flow's one entry, keyed by its frontend: packets go to nat_addr:nat_port
    MASQ = 0x40  # masquerade port reservation, keyed in network OUTSIDE by node address:port
    ALIAS = 0x80  # reply alias of a flow between networks: keyed under its destination network, dst_network
    #               names the network the flow's entry is keyed under


class CtFlag2(enum.IntFlag):
    """Bits of lace_ct_entry.flags2 (LACE_CT_F2_*)."""

    BACKEND_ENTRY = 0x01  # a service flow's frontend entry whose flow also keeps a backend entry (DNAT)
    MASQ = 0x02           # an entry of a service flow to a backend outside, masqueraded (all three)


#: struct lace_ct4_key (conntrack.h)
CT4_KEY = Layout(
    "struct lace_ct4_key",
    [
        ("network", "u32"),
        ("saddr", "bytes:4"),
        ("daddr", "bytes:4"),
        ("sport", "be16"),
        ("dport", "be16"),
        ("proto", "u8"),
        ("reserved", "bytes:3"),
    ],
)

#: struct lace_ct6_key (conntrack.h)
CT6_KEY = Layout(
    "struct lace_ct6_key",
    [
        ("network", "u32"),
        ("saddr", "bytes:16"),
        ("daddr", "bytes:16"),
        ("sport", "be16"),
        ("dport", "be16"),
        ("proto", "u8"),
        ("reserved", "bytes:3"),
    ],
)

#: struct lace_ct_entry (conntrack.h): the value of all six tables
CT_ENTRY = Layout(
    "struct lace_ct_entry",
    [
        ("created_ns", "u64"),
        ("last_seen_ns", "u64"),
        ("expires_ns", "u64"),
        ("packets_fwd", "u64"),
        ("bytes_fwd", "u64"),
        ("packets_rev", "u64"),
        ("bytes_rev", "u64"),
        ("src_segment", "u32"),
        ("dst_segment", "u32"),
        ("dst_network", "u32"),
        ("rev_nat_id", "u32"),
        ("nat_addr", "bytes:16"),
        ("nat_port", "be16"),
        ("state", "u8"),
        ("flags", "u8"),
        ("tcp_flags_fwd", "u8"),
        ("tcp_flags_rev", "u8"),
        ("delivery", "u8"),
        ("flags2", "u8"),
    ],
)

#: endpoint-ct: one entry per local endpoint (= the veth map's capacity)
CT_ENDPOINT_MAX = 4096
#: the per-endpoint conntrack limit when neither the endpoint's Network nor the agent sets one: 1/32
#: of a TCP table, 1/16 of a UDP table, 1/4 of an ICMP table
CT_ENDPOINT_DEFAULT = 8192
#: the most a limit can be (lace_endpoint.ct_max is 16 bits; 0 means none)
CT_ENDPOINT_LIMIT_MAX = 0xFFFF

#: struct lace_ct_endpoint_key (conntrack.h): the pod veth's host-side ifindex
CT_ENDPOINT_KEY = Layout("struct lace_ct_endpoint_key", [("ifindex", "u32")])

#: struct lace_ct_endpoint (conntrack.h): flows an endpoint holds per table
CT_ENDPOINT = Layout(
    "struct lace_ct_endpoint",
    [("tcp4", "u32"), ("udp4", "u32"), ("icmp4", "u32"), ("tcp6", "u32"), ("udp6", "u32"), ("icmp6", "u32")],
)

#: conntrack table (CLI name) -> its field in struct lace_ct_endpoint
CT_ENDPOINT_FIELDS: dict[str, str] = {
    "ct-tcp-v4": "tcp4", "ct-udp-v4": "udp4", "ct-icmp-v4": "icmp4",
    "ct-tcp-v6": "tcp6", "ct-udp-v6": "udp6", "ct-icmp-v6": "icmp6",
}

C_MACROS: dict[str, int] = {
    "LACE_CT_ENDPOINT_MAX": CT_ENDPOINT_MAX,
    "LACE_CT_ENDPOINT_DEFAULT": CT_ENDPOINT_DEFAULT,
    "LACE_CT_TCP_MAX": CT_TCP_MAX,
    "LACE_CT_UDP_MAX": CT_UDP_MAX,
    "LACE_CT_ICMP_MAX": CT_ICMP_MAX,
    "LACE_CT_TIMEOUT_SYN": CT_TIMEOUT_SYN,
    "LACE_CT_TIMEOUT_ESTABLISHED": CT_TIMEOUT_ESTABLISHED,
    "LACE_CT_TIMEOUT_FIN": CT_TIMEOUT_FIN,
    "LACE_CT_TIMEOUT_CLOSE": CT_TIMEOUT_CLOSE,
    "LACE_CT_TIMEOUT_UDP": CT_TIMEOUT_UDP,
    "LACE_CT_TIMEOUT_UDP_REPLIED": CT_TIMEOUT_UDP_REPLIED,
    "LACE_CT_TIMEOUT_ICMP": CT_TIMEOUT_ICMP,
    "LACE_CT_F_SEEN_REPLY": CtFlag.SEEN_REPLY,
    "LACE_CT_F_DNAT": CtFlag.DNAT,
    "LACE_CT_F_SNAT": CtFlag.SNAT,
    "LACE_CT_F_AUDIT": CtFlag.AUDIT,
    "LACE_CT_F_PROBE": CtFlag.PROBE,
    "LACE_CT_F_SERVICE": CtFlag.SERVICE,
    "LACE_CT_F_MASQ": CtFlag.MASQ,
    "LACE_CT_F_ALIAS": CtFlag.ALIAS,
    "LACE_CT_F2_BACKEND_ENTRY": CtFlag2.BACKEND_ENTRY,
    "LACE_CT_F2_MASQ": CtFlag2.MASQ,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {
    "lace_ct_state": (CtState, "LACE_CT_"),
    "lace_ct_status": (CtStatus, "LACE_CT_STATUS_"),
}

_TCP_FLAGS = ("fin", "syn", "rst", "psh", "ack", "urg", "ece", "cwr")


def tcp_flag_labels(bits: int) -> list[str]:
    return [name for i, name in enumerate(_TCP_FLAGS) if bits & (1 << i)]


def ct_key(network: int, saddr: AddressLike, daddr: AddressLike, sport: int, dport: int,
           proto: int) -> tuple[Family, bytes]:
    """(family, packed key) for a tuple; the family says which table (v4 or v6) it belongs in.

    For ICMP echo pass the identifier as both ports.
    """
    family = family_of(saddr)
    if family_of(daddr) != family:
        raise ValueError(f"{saddr} and {daddr} are not of the same family")
    layout = CT4_KEY if family == Family.IPV4 else CT6_KEY
    return family, layout.pack(
        network=check_u32(network, "network"),
        saddr=addr_bytes(saddr, family),
        daddr=addr_bytes(daddr, family),
        sport=check_port(sport, "source port"),
        dport=check_port(dport, "destination port"),
        proto=int(proto),
    )


def ct4_key(network: int, saddr: AddressLike, daddr: AddressLike, sport: int, dport: int, proto: int) -> bytes:
    if ip(saddr).version != 4:
        raise ValueError(f"{saddr} is not an IPv4 address")
    return ct_key(network, saddr, daddr, sport, dport, proto)[1]


def ct6_key(network: int, saddr: AddressLike, daddr: AddressLike, sport: int, dport: int, proto: int) -> bytes:
    if ip(saddr).version != 6:
        raise ValueError(f"{saddr} is not an IPv6 address")
    return ct_key(network, saddr, daddr, sport, dport, proto)[1]


def _decode_ct_key(layout: Layout, family: Family, raw: bytes) -> dict[str, Any]:
    k = layout.unpack(raw)
    return {
        "network": k["network"],
        "saddr": addr_str(family, k["saddr"]),
        "daddr": addr_str(family, k["daddr"]),
        "sport": k["sport"],
        "dport": k["dport"],
        "proto": enum_label(Proto, k["proto"]),
    }


def decode_ct4_key(raw: bytes) -> dict[str, Any]:
    return _decode_ct_key(CT4_KEY, Family.IPV4, raw)


def decode_ct6_key(raw: bytes) -> dict[str, Any]:
    return _decode_ct_key(CT6_KEY, Family.IPV6, raw)


def decode_ct_entry(raw: bytes, family: int = Family.IPV6) -> dict[str, Any]:
    """The entry with names for state, flags and delivery; ``nat_addr`` rendered in ``family``
    (the table's family) when a NAT flag is set, else None."""
    v = CT_ENTRY.unpack(raw)
    nat = v["flags"] & (CtFlag.DNAT | CtFlag.SNAT | CtFlag.SERVICE | CtFlag.MASQ)
    out: dict[str, Any] = {k: v[k] for k in (
        "created_ns", "last_seen_ns", "expires_ns", "packets_fwd", "bytes_fwd", "packets_rev",
        "bytes_rev", "src_segment", "dst_segment", "dst_network", "rev_nat_id")}
    out.update(
        nat_addr=addr_str(family, v["nat_addr"]) if nat else None,
        nat_port=v["nat_port"] if nat else None,
        state=enum_label(CtState, v["state"]),
        flags=flag_labels(CtFlag, v["flags"]),
        tcp_flags_fwd=tcp_flag_labels(v["tcp_flags_fwd"]),
        tcp_flags_rev=tcp_flag_labels(v["tcp_flags_rev"]),
        delivery=enum_label(DeliveryKind, v["delivery"]),
    )
    return out


def decode_ct4_entry(raw: bytes) -> dict[str, Any]:
    return decode_ct_entry(raw, Family.IPV4)


def decode_ct6_entry(raw: bytes) -> dict[str, Any]:
    return decode_ct_entry(raw, Family.IPV6)


def ct_endpoint_key(ifindex: int) -> bytes:
    return CT_ENDPOINT_KEY.pack(ifindex=check_u32(ifindex, "ifindex"))


def ct_endpoint_value(counts: dict[str, int]) -> bytes:
    """Pack an endpoint's flow counts, given by table (``ct-tcp-v4``: n); tables not named hold 0."""
    unknown = set(counts) - set(CT_ENDPOINT_FIELDS)
    if unknown:
        raise ValueError(f"no conntrack table {', '.join(sorted(unknown))}; tables: {', '.join(CT_ENDPOINT_FIELDS)}")
    return CT_ENDPOINT.pack(**{CT_ENDPOINT_FIELDS[t]: check_u32(n, t) for t, n in counts.items()})


def decode_ct_endpoint_key(raw: bytes) -> dict[str, Any]:
    return CT_ENDPOINT_KEY.unpack(raw)


def decode_ct_endpoint(raw: bytes) -> dict[str, Any]:
    """The counts by table (``ct-tcp-v4``: n)."""
    v = CT_ENDPOINT.unpack(raw)
    return {table: v[f] for table, f in CT_ENDPOINT_FIELDS.items()}
