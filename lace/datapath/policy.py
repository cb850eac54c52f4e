"""policy: allow entries between segments, per direction, protocol and port block (C: lace/abi/policy.h).

The key is an LPM trie key: (segment, peer, direction) is always matched exactly (72 bits), the
protocol byte optionally (80), then a prefix of the big-endian destination port (up to 96).  A port
range therefore becomes the minimal set of aligned power-of-two port blocks, one entry each.
"""

from __future__ import annotations

import enum
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import SEGMENT_SELECTED, Direction, Proto, enum_label, flag_labels, check_port, check_u32

POLICY_MAX = 65536
POLICY_PREFIX_ANY_PROTO = 72
POLICY_PREFIX_PROTO = 80
POLICY_PREFIX_FULL = 96
_PORT_BITS = POLICY_PREFIX_FULL - POLICY_PREFIX_PROTO
#: the rule number of the entry that lets the node's host into a pod selected for ingress
#: (policy 0; lace.policy.resolve writes one per such segment)
HOST_RULE = 0xFFFE


class PolicyFlag(enum.IntFlag):
    """Bits of lace_policy_entry.flags (LACE_POLICY_F_*), used by the marker entry."""

    SELECTED = 0x1  # the segment is selected in this direction (default deny)
    AUDIT = 0x2  # selected in audit mode: drops are reported, not enforced


#: struct lace_policy_key (policy.h): LPM trie key
POLICY_KEY = Layout(
    "struct lace_policy_key",
    [
        ("prefixlen", "u32"),
        ("segment", "u32"),
        ("peer", "u32"),
        ("direction", "u8"),
        ("proto", "u8"),
        ("dport", "be16"),
    ],
)

#: struct lace_policy_entry (policy.h)
POLICY_ENTRY = Layout(
    "struct lace_policy_entry",
    [("policy_id", "u32"), ("rule", "u16"), ("flags", "u16"), ("hits", "u64")],
)

C_MACROS: dict[str, int] = {
    "LACE_POLICY_MAX": POLICY_MAX,
    "LACE_POLICY_PREFIX_ANY_PROTO": POLICY_PREFIX_ANY_PROTO,
    "LACE_POLICY_PREFIX_PROTO": POLICY_PREFIX_PROTO,
    "LACE_POLICY_PREFIX_FULL": POLICY_PREFIX_FULL,
    "LACE_POLICY_F_SELECTED": PolicyFlag.SELECTED,
    "LACE_POLICY_F_AUDIT": PolicyFlag.AUDIT,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def port_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """Split the port range [start, end] into the fewest aligned power-of-two blocks.

    Returns ``(first_port, prefix_bits)`` pairs in ascending order; a block covers
    ``2 ** (16 - prefix_bits)`` ports starting at ``first_port``.
    """
    check_port(start, "first port")
    check_port(end, "last port")
    if start > end:
        raise ValueError(f"port range {start}-{end} is empty")
    blocks: list[tuple[int, int]] = []
    lo = start
    while lo <= end:
        # the largest block aligned at lo that stays inside the range
        size = lo & -lo if lo else 1 << _PORT_BITS
        while size > end - lo + 1:
            size >>= 1
        blocks.append((lo, _PORT_BITS - (size.bit_length() - 1)))
        lo += size
    return blocks


def policy_keys(segment: int, peer: int, direction: Direction | int, proto: int | None,
                port: int | None = None, end_port: int | None = None) -> list[bytes]:
    """The LPM keys that together match exactly (segment, peer, direction, proto, ports).

    ``proto`` None matches any protocol (and then no port may be given); ``port`` None matches
    any port of ``proto``; ``end_port`` makes [port, end_port] an inclusive range.
    """
    base = {
        "segment": check_u32(segment, "segment"),
        "peer": check_u32(peer, "peer segment"),
        "direction": int(Direction(direction)),
    }
    if proto is None:
        if port is not None or end_port is not None:
            raise ValueError("a port needs a protocol")
        return [POLICY_KEY.pack(base, prefixlen=POLICY_PREFIX_ANY_PROTO)]
    if not 0 <= int(proto) <= 255:
        raise ValueError(f"protocol {proto} is not in 0..255")
    base["proto"] = int(proto)
    if port is None:
        if end_port is not None:
            raise ValueError("an end port needs a first port")
        return [POLICY_KEY.pack(base, prefixlen=POLICY_PREFIX_PROTO)]
    last = port if end_port is None else end_port
    return [
        POLICY_KEY.pack(base, prefixlen=POLICY_PREFIX_PROTO + bits, dport=first)
        for first, bits in port_blocks(port, last)
    ]


def selected_key(segment: int, direction: Direction | int) -> bytes:
    """The marker key saying ``segment`` is selected (default deny) in ``direction``."""
    return POLICY_KEY.pack(
        prefixlen=POLICY_PREFIX_ANY_PROTO,
        segment=check_u32(segment, "segment"),
        peer=SEGMENT_SELECTED,
        direction=int(Direction(direction)),
    )


def lookup_key(segment: int, peer: int, direction: Direction | int, proto: int, dport: int) -> bytes:
    """A full-length key as the datapath looks up one packet."""
    return POLICY_KEY.pack(
        prefixlen=POLICY_PREFIX_FULL, segment=segment, peer=peer, direction=int(direction),
        proto=proto, dport=check_port(dport),
    )


def policy_entry(policy_id: int, rule: int, flags: int = 0) -> bytes:
    return POLICY_ENTRY.pack(policy_id=check_u32(policy_id, "policy ID"), rule=rule, flags=int(flags))


def decode_policy_key(raw: bytes) -> dict[str, Any]:
    """``proto`` None = any protocol; ``port``/``end_port`` None = any port; ``selected`` marks the marker."""
    k = POLICY_KEY.unpack(raw)
    plen = k["prefixlen"]
    out: dict[str, Any] = {
        "segment": k["segment"],
        "peer": k["peer"],
        "direction": enum_label(Direction, k["direction"]),
        "selected": k["peer"] == SEGMENT_SELECTED and plen == POLICY_PREFIX_ANY_PROTO,
        "proto": None,
        "port": None,
        "end_port": None,
        "prefixlen": plen,
    }
    if plen >= POLICY_PREFIX_PROTO:
        out["proto"] = enum_label(Proto, k["proto"])
    if plen > POLICY_PREFIX_PROTO:
        bits = min(plen, POLICY_PREFIX_FULL) - POLICY_PREFIX_PROTO
        span = 1 << (_PORT_BITS - bits)
        first = k["dport"] & ~(span - 1) & 0xFFFF
        out["port"], out["end_port"] = first, first + span - 1
    return out


def decode_policy_entry(raw: bytes) -> dict[str, Any]:
    v = POLICY_ENTRY.unpack(raw)
    return {"policy_id": v["policy_id"], "rule": v["rule"], "flags": flag_labels(PolicyFlag, v["flags"]),
            "hits": v["hits"]}
