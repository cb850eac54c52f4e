"""routing: (source network, destination prefix) -> destination network, masquerade (C: lace/abi/routing.h)."""

from __future__ import annotations

import enum
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import (
    NETWORK_OUTSIDE,
    NetworkLike,
    decode_lpm_addr_key,
    flag_labels,
    lpm_addr_key,
    check_u32,
)

ROUTING_MAX = 16384
#: prefixlen counts src_network + family + reserved (64 bits), then the address bits
ROUTING_PREFIX_BASE = 64


class RouteFlag(enum.IntFlag):
    """Bits of lace_route.flags (LACE_ROUTE_F_*)."""

    MASQUERADE = 0x1
    #: a service frontend's address the full services map left out: its packets drop as map-full
    SERVICE_MAP_FULL = 0x2


#: struct lace_routing_key (routing.h): LPM trie key, IPv4 in addr[0..3]
ROUTING_KEY = Layout(
    "struct lace_routing_key",
    [
        ("prefixlen", "u32"),
        ("src_network", "u32"),
        ("family", "u8"),
        ("reserved", "bytes:3"),
        ("addr", "bytes:16"),
    ],
)

#: struct lace_route (routing.h)
ROUTE = Layout("struct lace_route", [("dst_network", "u32"), ("flags", "u32")])

C_MACROS: dict[str, int] = {
    "LACE_ROUTING_MAX": ROUTING_MAX,
    "LACE_ROUTING_PREFIX_BASE": ROUTING_PREFIX_BASE,
    "LACE_ROUTE_F_MASQUERADE": RouteFlag.MASQUERADE,
    "LACE_ROUTE_F_SERVICE_MAP_FULL": RouteFlag.SERVICE_MAP_FULL,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def routing_key(src_network: int, cidr: NetworkLike) -> bytes:
    """LPM key for ``cidr`` as seen from ``src_network``; prefixlen = 64 + the prefix length."""
    return lpm_addr_key(ROUTING_KEY, ROUTING_PREFIX_BASE, "src_network", src_network, cidr)


def route_value(dst_network: int, *, masquerade: bool = False, service_map_full: bool = False) -> bytes:
    flags = (RouteFlag.MASQUERADE if masquerade else RouteFlag(0)) | \
        (RouteFlag.SERVICE_MAP_FULL if service_map_full else RouteFlag(0))
    return ROUTE.pack(dst_network=check_u32(dst_network, "destination network"), flags=int(flags))


def decode_routing_key(raw: bytes) -> dict[str, Any]:
    """``{src_network, family, prefix}`` with the prefix as a CIDR string."""
    return decode_lpm_addr_key(ROUTING_KEY, ROUTING_PREFIX_BASE, "src_network", raw)


def decode_route(raw: bytes) -> dict[str, Any]:
    """Network IDs stay numbers (the CLI resolves names, ``outside`` included)."""
    v = ROUTE.unpack(raw)
    return {
        "dst_network": v["dst_network"],
        "outside": v["dst_network"] == NETWORK_OUTSIDE,
        "masquerade": bool(v["flags"] & RouteFlag.MASQUERADE),
        "service_map_full": bool(v["flags"] & RouteFlag.SERVICE_MAP_FULL),
        "flags": flag_labels(RouteFlag, v["flags"]),
    }
