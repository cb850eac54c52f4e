"""Shared ABI constants and address helpers (C: bpf/include/lace/abi/common.h)."""

from __future__ import annotations

import enum
import ipaddress
import time
from typing import Union

from lace.bpf.layout import Layout

#: the datapath's clock (bpf_ktime_get_coarse_ns): conntrack, affinity, probe and next-hop times are in it
CLOCK_MONOTONIC_COARSE = getattr(time, "CLOCK_MONOTONIC_COARSE", 6)  # Linux; Python 3.11 lacks the name


def now_coarse() -> int:
    """Now on the datapath's clock, in ns."""
    return time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE)


IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
AddressLike = Union[str, IPAddress]
NetworkLike = Union[str, IPNetwork]


class Family(enum.IntEnum):
    """Address family as stored in keys: one self-describing byte, not AF_* (LACE_FAMILY_*)."""

    IPV4 = 4
    IPV6 = 6

    @property
    def label(self) -> str:
        return "ipv4" if self is Family.IPV4 else "ipv6"

    @property
    def addr_len(self) -> int:
        return 4 if self is Family.IPV4 else 16


FAMILY_IPV4 = Family.IPV4
FAMILY_IPV6 = Family.IPV6

# Networks. 0 never names a network; 1 is the default network every cluster has.
NETWORK_NONE = 0
NETWORK_DEFAULT = 1
#: a routing destination outside the cluster (handed to the node's stack)
NETWORK_OUTSIDE = 0xFFFFFFFF

#: names of the reserved network IDs, for rendering
RESERVED_NETWORKS: dict[int, str] = {NETWORK_DEFAULT: "default", NETWORK_OUTSIDE: "outside"}

# Segments (security identities); below SEGMENT_FIRST_ALLOCATED they are reserved.
SEGMENT_ANY = 0  # policy keys only: any peer segment
SEGMENT_HOST = 1
SEGMENT_WORLD = 2
SEGMENT_REMOTE_NODE = 3
SEGMENT_UNKNOWN = 4
SEGMENT_FIRST_ALLOCATED = 256
SEGMENT_SELECTED = 0xFFFFFFFF  # policy keys only: the "segment is selected" marker

#: names of the reserved segments, for rendering IDs the store does not know
RESERVED_SEGMENTS: dict[int, str] = {
    SEGMENT_HOST: "host",
    SEGMENT_WORLD: "world",
    SEGMENT_REMOTE_NODE: "remote-node",
    SEGMENT_UNKNOWN: "unknown",
}
#: names of the policy-key-only segment values
POLICY_SEGMENTS: dict[int, str] = {SEGMENT_ANY: "any", SEGMENT_SELECTED: "selected"}


class Verdict(enum.IntEnum):
    """Final decision recorded in trace events and metrics (C: enum lace_verdict)."""

    FORWARD = 1
    DROP = 2
    AUDIT = 3  # policy would drop; audit mode let it pass

    @property
    def label(self) -> str:
        return self.name.lower()


class Direction(enum.IntEnum):
    """Direction of a policy entry, seen from its subject segment (C: enum lace_direction)."""

    INGRESS = 0
    EGRESS = 1

    @property
    def label(self) -> str:
        return self.name.lower()


class Proto(enum.IntEnum):
    """IP protocol numbers lace keys on (IANA; not part of the lace headers)."""

    ICMP = 1
    TCP = 6
    UDP = 17
    ICMPV6 = 58
    SCTP = 132

    @property
    def label(self) -> str:
        return self.name.lower()


#: C macro / enum name -> Python value; tests/schema checks it against the header.
C_MACROS: dict[str, int] = {
    "LACE_FAMILY_IPV4": FAMILY_IPV4,
    "LACE_FAMILY_IPV6": FAMILY_IPV6,
    "LACE_NETWORK_NONE": NETWORK_NONE,
    "LACE_NETWORK_DEFAULT": NETWORK_DEFAULT,
    "LACE_NETWORK_OUTSIDE": NETWORK_OUTSIDE,
    "LACE_SEGMENT_ANY": SEGMENT_ANY,
    "LACE_SEGMENT_HOST": SEGMENT_HOST,
    "LACE_SEGMENT_WORLD": SEGMENT_WORLD,
    "LACE_SEGMENT_REMOTE_NODE": SEGMENT_REMOTE_NODE,
    "LACE_SEGMENT_UNKNOWN": SEGMENT_UNKNOWN,
    "LACE_SEGMENT_FIRST_ALLOCATED": SEGMENT_FIRST_ALLOCATED,
    "LACE_SEGMENT_SELECTED": SEGMENT_SELECTED,
}
#: C enum -> (Python enum, prefix of the C enumerator names)
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {
    "lace_verdict": (Verdict, "LACE_VERDICT_"),
    "lace_direction": (Direction, "LACE_DIR_"),
}


# --- addresses -----------------------------------------------------------------------------------


def ip(value: AddressLike) -> IPAddress:
    """Parse an address (``str`` or ``ipaddress`` object); ValueError names the bad input."""
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return value
    try:
        return ipaddress.ip_address(value.strip())
    except (ValueError, AttributeError):
        raise ValueError(f"{value!r} is not an IPv4 or IPv6 address") from None


def prefix(value: NetworkLike) -> IPNetwork:
    """Parse a CIDR (a bare address is a host prefix); host bits are cleared, as LPM keys need."""
    if isinstance(value, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return value
    try:
        return ipaddress.ip_network(value.strip(), strict=False)
    except (ValueError, AttributeError):
        raise ValueError(f"{value!r} is not an IPv4 or IPv6 prefix") from None


def family_of(value: AddressLike | IPNetwork) -> Family:
    """The lace family byte of an address or prefix."""
    if isinstance(value, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return Family.IPV4 if value.version == 4 else Family.IPV6
    return Family.IPV4 if ip(value).version == 4 else Family.IPV6


def addr16(value: AddressLike) -> tuple[Family, bytes]:
    """(family, 16 bytes) as keys store an address: IPv4 in the first 4 bytes, the rest zero."""
    a = ip(value)
    raw = a.packed
    return (Family.IPV4 if a.version == 4 else Family.IPV6), raw.ljust(16, b"\0")


def addr4(value: AddressLike) -> bytes:
    """The 4 bytes of an IPv4 address; ValueError for IPv6."""
    a = ip(value)
    if a.version != 4:
        raise ValueError(f"{value} is not an IPv4 address")
    return a.packed


def addr_bytes(value: AddressLike, family: int) -> bytes:
    """The address packed for a field of the family's natural size (4 or 16 bytes)."""
    a = ip(value)
    if a.version != Family(family).value:
        raise ValueError(f"{value} is not an {Family(family).label} address")
    return a.packed


def addr_str(family: int, raw: bytes) -> str:
    """Render a stored address by its family byte; an unknown family renders as hex."""
    if family == Family.IPV4:
        return str(ipaddress.IPv4Address(bytes(raw[:4])))
    if family == Family.IPV6:
        return str(ipaddress.IPv6Address(bytes(raw[:16])))
    return bytes(raw).hex()


def prefix_str(family: int, raw: bytes, bits: int) -> str:
    """Render a stored prefix (address bytes and prefix length in bits) as a CIDR."""
    return f"{addr_str(family, raw)}/{bits}"


# --- MAC addresses -------------------------------------------------------------------------------


def mac_bytes(value: str | bytes) -> bytes:
    """``aa:bb:cc:dd:ee:ff`` (or ``-`` separated, or 6 raw bytes) -> 6 bytes."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) != 6:
            raise ValueError(f"a MAC address has 6 bytes, got {len(value)}")
        return bytes(value)
    parts = value.strip().replace("-", ":").split(":")
    try:
        if len(parts) != 6 or not all(1 <= len(p) <= 2 for p in parts):
            raise ValueError
        return bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ValueError(f"{value!r} is not a MAC address (aa:bb:cc:dd:ee:ff)") from None


def mac_str(raw: bytes) -> str:
    """6 bytes -> ``aa:bb:cc:dd:ee:ff``."""
    return ":".join(f"{b:02x}" for b in bytes(raw[:6]))


# --- rendering -----------------------------------------------------------------------------------


def enum_label(cls: type[enum.IntEnum], value: int) -> str | int:
    """A member's label (or lower-case name), or the raw number when the value is unknown."""
    try:
        member = cls(value)
    except ValueError:
        return value
    label = getattr(member, "label", None)
    return label if isinstance(label, str) else member.name.lower()


def flag_labels(cls: type[enum.IntFlag], value: int) -> list[str]:
    """Names of the set bits, lower-case and kebab-case; unknown bits as ``0x..``."""
    out: list[str] = []
    rest = value
    for member in cls:
        if member.value and value & member.value == member.value:
            out.append((member.name or "").lower().replace("_", "-"))
            rest &= ~member.value
    if rest:
        out.append(f"{rest:#x}")
    return out


def check_u32(value: int, what: str) -> int:
    """Check that ``value`` fits a __u32 field; the error names the field."""
    if not 0 <= int(value) <= 0xFFFFFFFF:
        raise ValueError(f"{what} {value} does not fit 32 bits")
    return int(value)


def check_port(value: int, what: str = "port") -> int:
    """Check a TCP/UDP port number."""
    if not 0 <= int(value) <= 0xFFFF:
        raise ValueError(f"{what} {value} is not in 0..65535")
    return int(value)


# --- LPM keys shaped (prefixlen, u32 scope, family, reserved[3], addr[16]) ----------------------
# routing, delivery and prefix-segment keys share this shape: the prefix length counts the scope
# (32 bits), the family byte and the reserved bytes (24) — a base of 64 — then the address bits.

def lpm_addr_key(layout: Layout, base: int, scope_field: str, scope: int, cidr: NetworkLike) -> bytes:
    """Pack an LPM key for ``cidr`` inside ``scope`` (a network ID): prefixlen = base + bits."""
    net = prefix(cidr)
    family, raw = addr16(net.network_address)
    return layout.pack(
        {
            "prefixlen": base + net.prefixlen,
            scope_field: check_u32(scope, scope_field),
            "family": family,
            "addr": raw,
        }
    )


def decode_lpm_addr_key(layout: Layout, base: int, scope_field: str, raw: bytes) -> dict[str, object]:
    """Unpack such a key into ``{scope_field, family, prefix}`` with the prefix as a CIDR string."""
    k = layout.unpack(raw)
    bits = k["prefixlen"] - base
    family = k["family"]
    return {
        scope_field: k[scope_field],
        "family": enum_label(Family, family),
        "prefix": prefix_str(family, k["addr"], bits),
    }
