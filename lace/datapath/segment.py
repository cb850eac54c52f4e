"""segment and prefix-segment: endpoint address or prefix in a network -> segment (C: lace/abi/segment.h)."""

from __future__ import annotations

import enum
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import (
    AddressLike,
    NetworkLike,
    addr16,
    addr_str,
    decode_lpm_addr_key,
    enum_label,
    Family,
    flag_labels,
    lpm_addr_key,
    check_u32,
)

SEGMENT_MAX = 65536
PREFIX_SEGMENT_MAX = 16384
#: prefixlen counts network + family + reserved (64 bits), then the address bits
PREFIX_SEGMENT_PREFIX_BASE = 64


class SegmentFlag(enum.IntFlag):
    """Bits of lace_segment_value.flags (LACE_SEG_F_*)."""

    LOCAL = 0x1  # the endpoint lives on this node


#: struct lace_segment_key (segment.h): hash key, an endpoint address in its network
SEGMENT_KEY = Layout(
    "struct lace_segment_key",
    [("network", "u32"), ("family", "u8"), ("reserved", "bytes:3"), ("addr", "bytes:16")],
)

#: struct lace_prefix_segment_key (segment.h): LPM trie key, a prefix in a network
PREFIX_SEGMENT_KEY = Layout(
    "struct lace_prefix_segment_key",
    [
        ("prefixlen", "u32"),
        ("network", "u32"),
        ("family", "u8"),
        ("reserved", "bytes:3"),
        ("addr", "bytes:16"),
    ],
)

#: struct lace_segment_value (segment.h): the value of both maps
SEGMENT_VALUE = Layout("struct lace_segment_value", [("segment", "u32"), ("flags", "u32")])

C_MACROS: dict[str, int] = {
    "LACE_SEGMENT_MAX": SEGMENT_MAX,
    "LACE_PREFIX_SEGMENT_MAX": PREFIX_SEGMENT_MAX,
    "LACE_PREFIX_SEGMENT_PREFIX_BASE": PREFIX_SEGMENT_PREFIX_BASE,
    "LACE_SEG_F_LOCAL": SegmentFlag.LOCAL,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def segment_key(network: int, ip: AddressLike) -> bytes:
    family, raw = addr16(ip)
    return SEGMENT_KEY.pack(network=check_u32(network, "network"), family=family, addr=raw)


def prefix_segment_key(network: int, cidr: NetworkLike) -> bytes:
    """LPM key for ``cidr`` in ``network``; prefixlen = 64 + the prefix length."""
    return lpm_addr_key(PREFIX_SEGMENT_KEY, PREFIX_SEGMENT_PREFIX_BASE, "network", network, cidr)


def segment_value(segment: int, *, local: bool = False) -> bytes:
    return SEGMENT_VALUE.pack(segment=check_u32(segment, "segment"), flags=int(SegmentFlag.LOCAL if local else 0))


def decode_segment_key(raw: bytes) -> dict[str, Any]:
    k = SEGMENT_KEY.unpack(raw)
    return {
        "network": k["network"],
        "family": enum_label(Family, k["family"]),
        "addr": addr_str(k["family"], k["addr"]),
    }


def decode_prefix_segment_key(raw: bytes) -> dict[str, Any]:
    return decode_lpm_addr_key(PREFIX_SEGMENT_KEY, PREFIX_SEGMENT_PREFIX_BASE, "network", raw)


def decode_segment_value(raw: bytes) -> dict[str, Any]:
    v = SEGMENT_VALUE.unpack(raw)
    return {"segment": v["segment"], "local": bool(v["flags"] & SegmentFlag.LOCAL),
            "flags": flag_labels(SegmentFlag, v["flags"])}
