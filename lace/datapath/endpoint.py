"""veth: pod interface -> endpoint, network, source segment and its addresses (C: lace/abi/endpoint.h)."""

from __future__ import annotations

import enum
import ipaddress
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import AddressLike, addr_bytes, flag_labels, mac_bytes, mac_str, check_u32

VETH_MAX = 4096


class EndpointFlag(enum.IntFlag):
    """Bits of lace_endpoint.flags (LACE_EP_F_*)."""

    IPV4 = 0x1  # ipv4 is set
    IPV6 = 0x2  # ipv6 is set


#: struct lace_veth_key (endpoint.h)
VETH_KEY = Layout("struct lace_veth_key", [("ifindex", "u32")])

#: struct lace_endpoint (endpoint.h)
ENDPOINT = Layout(
    "struct lace_endpoint",
    [
        ("endpoint_id", "u32"),
        ("network", "u32"),
        ("segment", "u32"),
        ("flags", "u32"),
        ("mac", "bytes:6"),
        ("ct_max", "u16"),
        ("ipv4", "bytes:4"),
        ("ipv6", "bytes:16"),
    ],
)

C_MACROS: dict[str, int] = {
    "LACE_VETH_MAX": VETH_MAX,
    "LACE_EP_F_IPV4": EndpointFlag.IPV4,
    "LACE_EP_F_IPV6": EndpointFlag.IPV6,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def veth_key(ifindex: int) -> bytes:
    return VETH_KEY.pack(ifindex=check_u32(ifindex, "ifindex"))


def endpoint_value(*, endpoint_id: int, network: int, segment: int, mac: str | bytes,
                   ipv4: AddressLike | None = None, ipv6: AddressLike | None = None, ct_max: int = 0) -> bytes:
    """Pack an endpoint; the IPV4/IPV6 flags follow from which addresses are given. ``ct_max`` is the
    most conntrack flows it may hold in each table (endpoint-ct; 0: no limit)."""
    if not 0 <= ct_max <= 0xFFFF:
        raise ValueError(f"conntrack limit {ct_max} out of range 0..65535 (0: no limit)")
    flags = EndpointFlag(0)
    if ipv4 is not None:
        flags |= EndpointFlag.IPV4
    if ipv6 is not None:
        flags |= EndpointFlag.IPV6
    return ENDPOINT.pack(
        endpoint_id=check_u32(endpoint_id, "endpoint ID"),
        network=check_u32(network, "network"),
        segment=check_u32(segment, "segment"),
        flags=int(flags),
        mac=mac_bytes(mac),
        ct_max=ct_max,
        ipv4=addr_bytes(ipv4, 4) if ipv4 is not None else None,
        ipv6=addr_bytes(ipv6, 6) if ipv6 is not None else None,
    )


def decode_veth_key(raw: bytes) -> dict[str, Any]:
    return VETH_KEY.unpack(raw)


def decode_endpoint(raw: bytes) -> dict[str, Any]:
    """Addresses are strings, or None when their flag is clear."""
    v = ENDPOINT.unpack(raw)
    flags = v["flags"]
    return {
        "endpoint_id": v["endpoint_id"],
        "network": v["network"],
        "segment": v["segment"],
        "mac": mac_str(v["mac"]),
        "ipv4": str(ipaddress.IPv4Address(v["ipv4"])) if flags & EndpointFlag.IPV4 else None,
        "ipv6": str(ipaddress.IPv6Address(v["ipv6"])) if flags & EndpointFlag.IPV6 else None,
        "flags": flag_labels(EndpointFlag, flags),
        "ct_max": v["ct_max"],
    }
