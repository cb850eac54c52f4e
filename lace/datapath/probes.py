"""probes and probe-cookie: kubelet probe targets and in-flight probe connections (C: lace/abi/probes.h)."""

from __future__ import annotations

import enum
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import (
    AddressLike,
    Family,
    Proto,
    addr16,
    addr_str,
    check_port,
    check_u32,
    enum_label,
)

class ProbeFlag(enum.IntFlag):
    """lace_probe.flags (LACE_PROBE_F_*)."""

    #: the (probe address, port 0, proto 0) entry: every port of the address without an entry of
    #: its own is denied
    ADDRESS = 0x1


PROBES_MAX = 16384
PROBE_COOKIE_MAX = 65536

#: struct lace_probe_key (probes.h): the (pod address, port) the host connects to
PROBE_KEY = Layout(
    "struct lace_probe_key",
    [("addr", "bytes:16"), ("port", "be16"), ("proto", "u8"), ("family", "u8")],
)

#: struct lace_probe (probes.h): where the probe really goes
PROBE = Layout(
    "struct lace_probe",
    [
        ("network", "u32"),
        ("endpoint_id", "u32"),
        ("ifindex", "u32"),
        ("target_addr", "bytes:16"),
        ("target_port", "be16"),
        ("flags", "u16"),
    ],
)

#: struct lace_probe_cookie_key (probes.h): socket cookie of the probing socket
PROBE_COOKIE_KEY = Layout("struct lace_probe_cookie_key", [("cookie", "u64")])

#: struct lace_probe_cookie (probes.h): the destination the host asked for
PROBE_COOKIE = Layout(
    "struct lace_probe_cookie",
    [
        ("orig_addr", "bytes:16"),
        ("orig_port", "be16"),
        ("family", "u8"),
        ("proto", "u8"),
        ("network", "u32"),
        ("created_ns", "u64"),
    ],
)

C_MACROS: dict[str, int] = {
    "LACE_PROBES_MAX": PROBES_MAX,
    "LACE_PROBE_COOKIE_MAX": PROBE_COOKIE_MAX,
    "LACE_PROBE_F_ADDRESS": ProbeFlag.ADDRESS,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def probe_key(addr: AddressLike, port: int, proto: int = Proto.TCP) -> bytes:
    family, raw = addr16(addr)
    return PROBE_KEY.pack(addr=raw, port=check_port(port), proto=int(proto), family=family)


def probe_value(*, network: int, endpoint_id: int, ifindex: int, target_addr: AddressLike, target_port: int,
                flags: int = 0) -> bytes:
    _, raw = addr16(target_addr)
    return PROBE.pack(network=check_u32(network, "network"), endpoint_id=check_u32(endpoint_id, "endpoint ID"),
                      ifindex=check_u32(ifindex, "ifindex"), target_addr=raw,
                      target_port=check_port(target_port), flags=flags)


def probe_cookie_key(cookie: int) -> bytes:
    return PROBE_COOKIE_KEY.pack(cookie=cookie)


def decode_probe_key(raw: bytes) -> dict[str, Any]:
    k = PROBE_KEY.unpack(raw)
    return {
        "family": enum_label(Family, k["family"]),
        "addr": addr_str(k["family"], k["addr"]),
        "port": k["port"],
        "proto": enum_label(Proto, k["proto"]),
    }


def decode_probe(raw: bytes, family: int = Family.IPV6) -> dict[str, Any]:
    """``family`` is the key's (the value has no family byte of its own)."""
    v = PROBE.unpack(raw)
    return {
        "network": v["network"],
        "endpoint_id": v["endpoint_id"],
        "ifindex": v["ifindex"],
        "target_addr": addr_str(family, v["target_addr"]),
        "target_port": v["target_port"],
        "flags": v["flags"],
    }


def decode_probe_cookie_key(raw: bytes) -> dict[str, Any]:
    return PROBE_COOKIE_KEY.unpack(raw)


def decode_probe_cookie(raw: bytes) -> dict[str, Any]:
    v = PROBE_COOKIE.unpack(raw)
    return {
        "family": enum_label(Family, v["family"]),
        "orig_addr": addr_str(v["family"], v["orig_addr"]),
        "orig_port": v["orig_port"],
        "proto": enum_label(Proto, v["proto"]),
        "network": v["network"],
        "created_ns": v["created_ns"],
    }


def probe_address_key(addr: AddressLike) -> bytes:
    """The key of a probe address's marker entry (ProbeFlag.ADDRESS): port 0, protocol 0."""
    family, raw = addr16(addr)
    return PROBE_KEY.pack(addr=raw, port=0, proto=0, family=family)
