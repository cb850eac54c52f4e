"""delivery: (network, destination prefix) -> local pod, remote node SID, or host (C: lace/abi/delivery.h)."""

from __future__ import annotations

import enum
import ipaddress
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import NetworkLike, decode_lpm_addr_key, enum_label, lpm_addr_key, mac_str

DELIVERY_MAX = 65536
#: prefixlen counts network + family + reserved (64 bits), then the address bits
DELIVERY_PREFIX_BASE = 64


class DeliveryKind(enum.IntEnum):
    """How a destination is reached (C: enum lace_delivery_kind)."""

    NONE = 0
    LOCAL = 1  # redirect into a pod veth on this node
    REMOTE = 2  # encapsulate to another node's locator SID
    HOST = 3  # hand to this node's stack
    OUTSIDE = 4  # leave the cluster (routing to NETWORK_OUTSIDE)

    @property
    def label(self) -> str:
        return self.name.lower()


#: struct lace_delivery_key (delivery.h): LPM trie key, same shape as the routing key
DELIVERY_KEY = Layout(
    "struct lace_delivery_key",
    [
        ("prefixlen", "u32"),
        ("network", "u32"),
        ("family", "u8"),
        ("reserved", "bytes:3"),
        ("addr", "bytes:16"),
    ],
)

#: struct lace_delivery (delivery.h)
DELIVERY = Layout(
    "struct lace_delivery",
    [
        ("kind", "u8"),
        ("flags", "u8"),
        ("reserved", "u16"),
        ("ifindex", "u32"),
        ("mac", "bytes:6"),
        ("host_mac", "bytes:6"),
        ("node_id", "u32"),
        ("sid", "bytes:16"),
        ("endpoint_id", "u32"),
    ],
)

C_MACROS: dict[str, int] = {
    "LACE_DELIVERY_MAX": DELIVERY_MAX,
    "LACE_DELIVERY_PREFIX_BASE": DELIVERY_PREFIX_BASE,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {"lace_delivery_kind": (DeliveryKind, "LACE_DELIVERY_")}


def delivery_key(network: int, cidr: NetworkLike) -> bytes:
    """LPM key for ``cidr`` in ``network``; prefixlen = 64 + the prefix length."""
    return lpm_addr_key(DELIVERY_KEY, DELIVERY_PREFIX_BASE, "network", network, cidr)


def decode_delivery_key(raw: bytes) -> dict[str, Any]:
    """``{network, family, prefix}`` with the prefix as a CIDR string."""
    return decode_lpm_addr_key(DELIVERY_KEY, DELIVERY_PREFIX_BASE, "network", raw)


def decode_delivery(raw: bytes) -> dict[str, Any]:
    """Only the fields meaningful for the entry's kind are shown."""
    v = DELIVERY.unpack(raw)
    out: dict[str, Any] = {"kind": enum_label(DeliveryKind, v["kind"]), "flags": v["flags"]}
    if v["kind"] == DeliveryKind.LOCAL:
        out.update(
            ifindex=v["ifindex"],
            mac=mac_str(v["mac"]),
            host_mac=mac_str(v["host_mac"]),
            endpoint_id=v["endpoint_id"],
        )
    elif v["kind"] == DeliveryKind.REMOTE:
        out.update(node_id=v["node_id"], sid=str(ipaddress.IPv6Address(v["sid"])))
    return out
