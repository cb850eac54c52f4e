"""delivery: (network, prefix) -> local pod, remote SID or host; delivery-exact: its /32, /128 (C: lace/abi/delivery.h).

delivery-exact holds every full-length delivery entry again, with the same value, under the trie key
past its prefixlen: the datapath looks there before the trie.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import Family, NetworkLike, decode_lpm_addr_key, enum_label, lpm_addr_key, mac_str

DELIVERY_MAX = 65536
#: prefixlen counts network + family + reserved (64 bits), then the address bits
DELIVERY_PREFIX_BASE = 64
#: the exact map holds a subset of the trie's entries: at the trie's size it never refuses one
DELIVERY_EXACT_MAX = DELIVERY_MAX
#: prefixlen of a full-length key by family: the only keys the exact map holds
FULL_PREFIXLEN = {Family.IPV4: DELIVERY_PREFIX_BASE + 32, Family.IPV6: DELIVERY_PREFIX_BASE + 128}


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

#: struct lace_delivery_exact_key (delivery.h): the trie key past its prefixlen (a full-length
#: entry's prefixlen follows from its family)
DELIVERY_EXACT_KEY = Layout(
    "struct lace_delivery_exact_key",
    [
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
    "LACE_DELIVERY_EXACT_MAX": DELIVERY_EXACT_MAX,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {"lace_delivery_kind": (DeliveryKind, "LACE_DELIVERY_")}


def delivery_key(network: int, cidr: NetworkLike) -> bytes:
    """LPM key for ``cidr`` in ``network``; prefixlen = 64 + the prefix length."""
    return lpm_addr_key(DELIVERY_KEY, DELIVERY_PREFIX_BASE, "network", network, cidr)


def decode_delivery_key(raw: bytes) -> dict[str, Any]:
    """``{network, family, prefix}`` with the prefix as a CIDR string."""
    return decode_lpm_addr_key(DELIVERY_KEY, DELIVERY_PREFIX_BASE, "network", raw)


_PREFIXLEN = struct.Struct("<I")
_PREFIXLEN_AT = DELIVERY_KEY.field("prefixlen").offset
#: the exact key is the trie key from its network on (the C header asserts the same)
_EXACT_AT = DELIVERY_KEY.field("network").offset
assert DELIVERY_KEY.size - _EXACT_AT == DELIVERY_EXACT_KEY.size
_FAMILY_AT = DELIVERY_KEY.field("family").offset


def full_length(key: bytes) -> bool:
    """Whether a packed delivery key is a full-length entry (/32, /128): one the exact map holds too.

    Reads the two fields in place: the agent asks for every delivery entry on every pass."""
    return FULL_PREFIXLEN.get(key[_FAMILY_AT]) == _PREFIXLEN.unpack_from(key, _PREFIXLEN_AT)[0]


def exact_key(key: bytes) -> bytes:
    """The exact map's key for a full-length delivery key: the same bytes past the prefixlen."""
    if not full_length(key):
        raise ValueError(f"delivery key {decode_delivery_key(key)} is not full-length: only /32 and /128 "
                         "entries have an exact key")
    return key[_EXACT_AT:]


def delivery_exact_key(network: int, addr: str) -> bytes:
    """The exact map's key for address ``addr`` in ``network``."""
    ip = ipaddress.ip_address(addr)
    return exact_key(delivery_key(network, f"{ip}/{ip.max_prefixlen}"))


def exact_entries(entries: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The exact map's entries for the delivery map's ``entries``: every full-length one, with the
    same value, under its exact key; nothing else."""
    return {k[_EXACT_AT:]: v for k, v in entries.items() if full_length(k)}


def decode_delivery_exact_key(raw: bytes) -> dict[str, Any]:
    """``{network, family, prefix}`` as for a delivery key (the prefix at full length)."""
    family = raw[_FAMILY_AT - _EXACT_AT]
    return decode_delivery_key(_PREFIXLEN.pack(FULL_PREFIXLEN.get(family, DELIVERY_PREFIX_BASE + 128)) + raw)


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
