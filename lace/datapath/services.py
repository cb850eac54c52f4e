"""services and backends: (VIP, port, protocol, source network) -> backends by slot (C: lace/abi/services.h).

Slot 0 of a service key is the service itself (its value holds the backend count); slots
1..backend_count point at backend IDs in the backends map.
"""

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
    flag_labels,
)

SERVICES_MAX = 65536
BACKENDS_MAX = 65536


class ServiceFlag(enum.IntFlag):
    """Bits of lace_service.flags (LACE_SVC_F_*)."""

    NODEPORT = 0x1
    LOCAL = 0x2  # externalTrafficPolicy / internalTrafficPolicy Local


class BackendFlag(enum.IntFlag):
    """Bits of lace_backend.flags (LACE_BACKEND_F_*)."""

    ACTIVE = 0x1
    TERMINATING = 0x2


#: struct lace_service_key (services.h)
SERVICE_KEY = Layout(
    "struct lace_service_key",
    [
        ("network", "u32"),
        ("addr", "bytes:16"),
        ("port", "be16"),
        ("proto", "u8"),
        ("family", "u8"),
        ("slot", "u16"),
        ("reserved", "u16"),
    ],
)

#: struct lace_service (services.h)
SERVICE = Layout(
    "struct lace_service",
    [
        ("service_id", "u32"),
        ("backend_id", "u32"),
        ("backend_count", "u16"),
        ("flags", "u16"),
        ("reserved", "u32"),
    ],
)

#: struct lace_backend_key (services.h)
BACKEND_KEY = Layout("struct lace_backend_key", [("backend_id", "u32")])

#: struct lace_backend (services.h)
BACKEND = Layout(
    "struct lace_backend",
    [
        ("addr", "bytes:16"),
        ("port", "be16"),
        ("proto", "u8"),
        ("family", "u8"),
        ("network", "u32"),
        ("flags", "u32"),
    ],
)

C_MACROS: dict[str, int] = {
    "LACE_SERVICES_MAX": SERVICES_MAX,
    "LACE_BACKENDS_MAX": BACKENDS_MAX,
    "LACE_SVC_F_NODEPORT": ServiceFlag.NODEPORT,
    "LACE_SVC_F_LOCAL": ServiceFlag.LOCAL,
    "LACE_BACKEND_F_ACTIVE": BackendFlag.ACTIVE,
    "LACE_BACKEND_F_TERMINATING": BackendFlag.TERMINATING,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def service_key(network: int, vip: AddressLike, port: int, proto: int, slot: int = 0) -> bytes:
    """Key of a service (slot 0) or of one of its backend slots, in the source network it serves."""
    family, raw = addr16(vip)
    if not 0 <= slot <= 0xFFFF:
        raise ValueError(f"backend slot {slot} is not in 0..65535")
    return SERVICE_KEY.pack(network=check_u32(network, "network"), addr=raw, port=check_port(port),
                            proto=int(proto), family=family, slot=slot)


def backend_key(backend_id: int) -> bytes:
    return BACKEND_KEY.pack(backend_id=check_u32(backend_id, "backend ID"))


def backend_value(addr: AddressLike, port: int, proto: int, network: int, flags: int = BackendFlag.ACTIVE) -> bytes:
    family, raw = addr16(addr)
    return BACKEND.pack(addr=raw, port=check_port(port), proto=int(proto), family=family,
                        network=check_u32(network, "network"), flags=int(flags))


def decode_service_key(raw: bytes) -> dict[str, Any]:
    k = SERVICE_KEY.unpack(raw)
    return {
        "network": k["network"],
        "family": enum_label(Family, k["family"]),
        "addr": addr_str(k["family"], k["addr"]),
        "port": k["port"],
        "proto": enum_label(Proto, k["proto"]),
        "slot": k["slot"],
    }


def decode_service(raw: bytes) -> dict[str, Any]:
    v = SERVICE.unpack(raw)
    return {"service_id": v["service_id"], "backend_id": v["backend_id"], "backend_count": v["backend_count"],
            "flags": flag_labels(ServiceFlag, v["flags"])}


def decode_backend_key(raw: bytes) -> dict[str, Any]:
    return BACKEND_KEY.unpack(raw)


def decode_backend(raw: bytes) -> dict[str, Any]:
    v = BACKEND.unpack(raw)
    return {
        "family": enum_label(Family, v["family"]),
        "addr": addr_str(v["family"], v["addr"]),
        "port": v["port"],
        "proto": enum_label(Proto, v["proto"]),
        "network": v["network"],
        "flags": flag_labels(BackendFlag, v["flags"]),
    }
