"""config: the node's own identity — locator, underlay address, node ID, MTU (C: lace/abi/config.h).

Also the SID layout: inside a node's locator the 4 bytes after the locator (the *function*) carry
the destination network and the next 4 (the *argument*) the source network, big-endian.
"""

from __future__ import annotations

import enum
import ipaddress
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import NetworkLike, flag_labels, check_u32

CONFIG_MAX = 1
#: bytes the cross-node encapsulation adds: one outer IPv6 header (SRv6 reduced encapsulation)
ENCAP_OVERHEAD = 40
#: the underlay MTU lace assumes when none is given (Ethernet)
DEFAULT_UNDERLAY_MTU = 1500
#: pods get the underlay MTU less the encapsulation, so an encapsulated packet still fits
DEFAULT_POD_MTU = DEFAULT_UNDERLAY_MTU - ENCAP_OVERHEAD
#: the one array index that holds the node's configuration
CONFIG_INDEX = 0


class ConfigFlag(enum.IntFlag):
    """Datapath option bits in lace_config.flags (LACE_CFG_F_*)."""

    TRACE_ALL = 0x01  # a trace event for every packet, not only new flows and drops


#: key of the config array map (C: __u32 index)
CONFIG_KEY = Layout("__u32", [("index", "u32")])

#: struct lace_config (config.h)
CONFIG = Layout(
    "struct lace_config",
    [
        ("locator", "bytes:16"),
        ("underlay_addr", "bytes:16"),
        ("node_id", "u32"),
        ("uplink_ifindex", "u32"),
        ("mtu", "u16"),
        ("locator_len", "u8"),
        ("flags", "u8"),
        ("addr4", "bytes:4"),
        ("kubelet_cgroup", "u64"),
    ],
)

C_MACROS: dict[str, int] = {
    "LACE_CONFIG_MAX": CONFIG_MAX,
    "LACE_CFG_F_TRACE_ALL": ConfigFlag.TRACE_ALL,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}

#: bytes of the SID function (destination network) and of its argument (source network)
SID_FUNCTION_LEN = 4
SID_ARGUMENT_LEN = 4
#: a locator leaves room for function and argument: at most /64, whole bytes
LOCATOR_MAX_LEN = 128 - 8 * (SID_FUNCTION_LEN + SID_ARGUMENT_LEN)


def _locator(locator_prefix: NetworkLike | bytes, locator_len: int | None) -> tuple[bytes, int]:
    if isinstance(locator_prefix, (bytes, bytearray)):
        if len(locator_prefix) != 16 or locator_len is None:
            raise ValueError("a raw locator is 16 bytes and needs its prefix length")
        raw, bits = bytes(locator_prefix), locator_len
    else:
        text = str(locator_prefix).strip()
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ValueError(f"{locator_prefix!r} is not an IPv6 locator prefix") from None
        if net.version != 6:
            raise ValueError(f"locator {locator_prefix} is not IPv6")
        if locator_len is None:
            if "/" not in text:
                raise ValueError(f"locator {text} needs a prefix length")
            bits = net.prefixlen
        elif "/" in text and net.prefixlen != locator_len:
            raise ValueError(f"locator {text} disagrees with locator length /{locator_len}")
        else:
            bits = locator_len
        raw = net.network_address.packed
    if bits % 8 or not 0 < bits <= LOCATOR_MAX_LEN:
        raise ValueError(f"locator length /{bits} must be a multiple of 8 and at most /{LOCATOR_MAX_LEN}")
    # clear the bits past the locator: they belong to the function and argument
    return raw[: bits // 8].ljust(16, b"\0"), bits


def sid(locator_prefix: NetworkLike | bytes, locator_len: int | None, network: int,
        src_network: int = 0) -> bytes:
    """The 16-byte SID for ``network`` inside a node's locator.

    ``locator || network (function, 4 bytes BE) || src_network (argument, 4 bytes BE) || zeros``.
    ``locator_len`` may be None when ``locator_prefix`` is a CIDR string.
    """
    raw, bits = _locator(locator_prefix, locator_len)
    n = bits // 8
    out = (
        raw[:n]
        + check_u32(network, "network").to_bytes(SID_FUNCTION_LEN, "big")
        + check_u32(src_network, "source network").to_bytes(SID_ARGUMENT_LEN, "big")
    )
    return out.ljust(16, b"\0")


def parse_sid(raw: bytes, locator_len: int) -> dict[str, Any]:
    """Split a SID into ``{locator, network, src_network}`` given the locator length in bits."""
    if len(raw) != 16 or locator_len % 8 or not 0 < locator_len <= LOCATOR_MAX_LEN:
        raise ValueError("a SID is 16 bytes inside a byte-aligned locator of at most /64")
    n = locator_len // 8
    loc = bytes(raw[:n]).ljust(16, b"\0")
    return {
        "locator": f"{ipaddress.IPv6Address(loc)}/{locator_len}",
        "network": int.from_bytes(raw[n : n + SID_FUNCTION_LEN], "big"),
        "src_network": int.from_bytes(raw[n + SID_FUNCTION_LEN : n + SID_FUNCTION_LEN + SID_ARGUMENT_LEN], "big"),
    }


def config_key(index: int = CONFIG_INDEX) -> bytes:
    """The array index key (always 0)."""
    return CONFIG_KEY.pack(index=index)


def config_value(*, locator: NetworkLike, underlay_addr: str, node_id: int, uplink_ifindex: int,
                 mtu: int, flags: int = 0, addr4: str | None = None, kubelet_cgroup: int = 0) -> bytes:
    """Pack the node configuration; ``locator`` is a CIDR such as ``fd00:0:1::/48``; ``addr4`` is the
    node's IPv4 address (the IPv4 masquerade source), None when it has none; ``kubelet_cgroup`` the
    cgroup ID whose sockets may open probes into other networks (0: any host process)."""
    raw, bits = _locator(locator, None)
    under = ipaddress.IPv6Address(underlay_addr.strip())
    v4 = ipaddress.IPv4Address(addr4.strip()).packed if addr4 else bytes(4)
    return CONFIG.pack(
        locator=raw, locator_len=bits, underlay_addr=under.packed, node_id=check_u32(node_id, "node ID"),
        uplink_ifindex=uplink_ifindex, mtu=mtu, flags=int(flags), addr4=v4,
        kubelet_cgroup=kubelet_cgroup,
    )


def decode_config_key(raw: bytes) -> dict[str, Any]:
    return CONFIG_KEY.unpack(raw)


def decode_config(raw: bytes) -> dict[str, Any]:
    """The config value with addresses as strings and flags by name."""
    v = CONFIG.unpack(raw)
    bits = v["locator_len"]
    return {
        "locator": f"{ipaddress.IPv6Address(v['locator'])}/{bits}",
        "underlay_addr": str(ipaddress.IPv6Address(v["underlay_addr"])),
        "node_id": v["node_id"],
        "uplink_ifindex": v["uplink_ifindex"],
        "mtu": v["mtu"],
        "flags": flag_labels(ConfigFlag, v["flags"]),
        "addr4": str(ipaddress.IPv4Address(v["addr4"])) if any(v["addr4"]) else None,
        "kubelet_cgroup": v["kubelet_cgroup"],
    }
