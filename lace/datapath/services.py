"""services, backends, maglev, affinity and sock-revnat (C: lace/abi/services.h).

Slot 0 of a service key is the frontend itself (its value holds the backend counts, flags, the
affinity timeout and the Maglev table); slots 1..backend_count point at backend IDs in the backends
map, the active ones first (slots 1..active_count take new flows, the rest are terminating).
A service with two or more active backends owns one Maglev table of MAGLEV_SIZE backend IDs at
[table * MAGLEV_SIZE, (table + 1) * MAGLEV_SIZE) of the maglev array; table 0 means none.
revnat (the agent writes it): for each backend (its network, address, port, protocol), the frontends
its replies may come from — a service flow's one conntrack entry is keyed by its frontend, and a
reply finds it through these (lace/abi/services.h).
sock-revnat is written by the cgroup socket hooks only: for each host socket they translated, the
backend it was sent to and the frontend it asked for.
"""

from __future__ import annotations

import enum
import ipaddress
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

SERVICES_MAX = 262144
BACKENDS_MAX = 262144
AFFINITY_MAX = 65536
SOCK_REVNAT_MAX = 65536
REVNAT_MAX = 262144
REVNAT_FRONTENDS = 8   # frontends one backend answers for
MAGLEV_SIZE = 1021  # a prime; Maglev balances well while it is > 100x a service's backends
MAGLEV_TABLES = 1024
MAGLEV_MAX = MAGLEV_SIZE * MAGLEV_TABLES


#: Hairpin sources (LACE_HAIRPIN_*): a pod balanced to itself receives its service flow from
#: these instead of its own address (its flow's conntrack entry is keyed by its own address).
HAIRPIN_IPV4_INT = 0xA9FE2A01
HAIRPIN_IPV6_HIGH = 0x0100000000000000
HAIRPIN_IPV6_LOW = 0x00000000A9FE2A01
HAIRPIN_IPV4 = ipaddress.IPv4Address(HAIRPIN_IPV4_INT)                              # 169.254.42.1
HAIRPIN_IPV6 = ipaddress.IPv6Address(HAIRPIN_IPV6_HIGH << 64 | HAIRPIN_IPV6_LOW)   # 100::a9fe:2a01


class ServiceFlag(enum.IntFlag):
    """Bits of lace_service.flags (LACE_SVC_F_*)."""

    NODEPORT = 0x01  # frontend is a node address; source network OUTSIDE
    LOCAL = 0x02  # traffic policy Local: only this node's backends are programmed
    LOADBALANCER = 0x04  # frontend is a LoadBalancer ingress address
    AFFINITY = 0x08  # sessionAffinity ClientIP
    EXTERNAL_IP = 0x10  # frontend is an externalIP


class BackendFlag(enum.IntFlag):
    """Bits of lace_backend.flags (LACE_BACKEND_F_*)."""

    ACTIVE = 0x1
    TERMINATING = 0x2
    REPLY_ENTRY = 0x4  # its new flows keep a backend entry: its revnat entry cannot name all its frontends


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
        ("active_count", "u16"),
        ("flags", "u16"),
        ("reserved", "u16"),
        ("affinity_timeout", "u32"),
        ("maglev", "u32"),
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

#: maglev array: index -> backend ID
MAGLEV_KEY = Layout("__u32", [("index", "u32")])
MAGLEV_VALUE = Layout("__u32", [("backend_id", "u32")])

#: struct lace_affinity_key (services.h)
AFFINITY_KEY = Layout(
    "struct lace_affinity_key",
    [
        ("service_id", "u32"),
        ("network", "u32"),
        ("addr", "bytes:16"),
        ("family", "u8"),
        ("reserved", "bytes:3"),
    ],
)

#: struct lace_affinity (services.h)
AFFINITY = Layout(
    "struct lace_affinity",
    [
        ("last_used_ns", "u64"),
        ("backend_id", "u32"),
        ("reserved", "u32"),
    ],
)

#: struct lace_sock_revnat_key (services.h)
SOCK_REVNAT_KEY = Layout(
    "struct lace_sock_revnat_key",
    [
        ("cookie", "u64"),
        ("addr", "bytes:16"),
        ("port", "be16"),
        ("family", "u8"),
        ("reserved", "bytes:5"),
    ],
)

#: struct lace_sock_revnat (services.h)
SOCK_REVNAT = Layout(
    "struct lace_sock_revnat",
    [
        ("addr", "bytes:16"),
        ("port", "be16"),
        ("family", "u8"),
        ("reserved", "u8"),
        ("service_id", "u32"),
    ],
)

#: struct lace_sock_term (services.h): a host UDP socket to terminate (progs/sock_term.c)
SOCK_TERM = Layout(
    "struct lace_sock_term",
    [
        ("addr", "bytes:16"),
        ("port", "be16"),
        ("family", "u8"),
        ("reserved", "bytes:5"),
    ],
)

#: struct lace_revnat_key (services.h)
REVNAT_KEY = Layout(
    "struct lace_revnat_key",
    [
        ("network", "u32"),
        ("addr", "bytes:16"),
        ("port", "be16"),
        ("proto", "u8"),
        ("family", "u8"),
    ],
)

#: struct lace_revnat_frontend (services.h)
REVNAT_FRONTEND = Layout(
    "struct lace_revnat_frontend",
    [
        ("addr", "bytes:16"),
        ("network", "u32"),
        ("port", "be16"),
        ("reserved", "u16"),
    ],
)

#: struct lace_revnat (services.h)
REVNAT = Layout(
    "struct lace_revnat",
    [
        ("count", "u32"),
        ("reserved", "u32"),
        ("frontends", (REVNAT_FRONTEND, REVNAT_FRONTENDS)),
    ],
)

C_MACROS: dict[str, int] = {
    "LACE_SERVICES_MAX": SERVICES_MAX,
    "LACE_BACKENDS_MAX": BACKENDS_MAX,
    "LACE_AFFINITY_MAX": AFFINITY_MAX,
    "LACE_SOCK_REVNAT_MAX": SOCK_REVNAT_MAX,
    "LACE_REVNAT_MAX": REVNAT_MAX,
    "LACE_REVNAT_FRONTENDS": REVNAT_FRONTENDS,
    "LACE_MAGLEV_SIZE": MAGLEV_SIZE,
    "LACE_MAGLEV_TABLES": MAGLEV_TABLES,
    "LACE_MAGLEV_MAX": MAGLEV_MAX,
    "LACE_SVC_F_NODEPORT": ServiceFlag.NODEPORT,
    "LACE_SVC_F_LOCAL": ServiceFlag.LOCAL,
    "LACE_SVC_F_LOADBALANCER": ServiceFlag.LOADBALANCER,
    "LACE_SVC_F_AFFINITY": ServiceFlag.AFFINITY,
    "LACE_SVC_F_EXTERNAL_IP": ServiceFlag.EXTERNAL_IP,
    "LACE_BACKEND_F_ACTIVE": BackendFlag.ACTIVE,
    "LACE_BACKEND_F_TERMINATING": BackendFlag.TERMINATING,
    "LACE_BACKEND_F_REPLY_ENTRY": BackendFlag.REPLY_ENTRY,
    "LACE_HAIRPIN_IPV4": HAIRPIN_IPV4_INT,
    "LACE_HAIRPIN_IPV6_HIGH": HAIRPIN_IPV6_HIGH,
    "LACE_HAIRPIN_IPV6_LOW": HAIRPIN_IPV6_LOW,
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
            "active_count": v["active_count"], "flags": flag_labels(ServiceFlag, v["flags"]),
            "affinity_timeout": v["affinity_timeout"], "maglev": v["maglev"]}


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


def service_value(*, service_id: int, backend_count: int = 0, active_count: int = 0, flags: int = 0,
                  affinity_timeout: int = 0, maglev: int = 0, backend_id: int = 0) -> bytes:
    """Slot 0 (the frontend: counts, flags, affinity, Maglev table) or, with ``backend_id``, a slot."""
    return SERVICE.pack(service_id=check_u32(service_id, "service ID"), backend_id=check_u32(backend_id, "backend ID"),
                        backend_count=backend_count, active_count=active_count, flags=int(flags),
                        affinity_timeout=check_u32(affinity_timeout, "affinity timeout"),
                        maglev=check_u32(maglev, "Maglev table"))


def maglev_key(table: int, index: int) -> bytes:
    """Key of entry ``index`` of Maglev table ``table`` (1-based; 0 is never a table)."""
    if table < 1 or not 0 <= index < MAGLEV_SIZE:
        raise ValueError(f"Maglev table {table} index {index} is out of range")
    return MAGLEV_KEY.pack(index=table * MAGLEV_SIZE + index)


def affinity_key(service_id: int, network: int, client: AddressLike) -> bytes:
    family, raw = addr16(client)
    return AFFINITY_KEY.pack(service_id=check_u32(service_id, "service ID"), network=check_u32(network, "network"),
                             addr=raw, family=family)


def decode_affinity_key(raw: bytes) -> dict[str, Any]:
    k = AFFINITY_KEY.unpack(raw)
    return {"service_id": k["service_id"], "network": k["network"], "family": enum_label(Family, k["family"]),
            "addr": addr_str(k["family"], k["addr"])}


def decode_affinity(raw: bytes) -> dict[str, Any]:
    v = AFFINITY.unpack(raw)
    return {"backend_id": v["backend_id"], "last_used_ns": v["last_used_ns"]}


def sock_revnat_key(cookie: int, backend: AddressLike, port: int) -> bytes:
    """Key of the entry for a socket (by cookie) sent to ``backend``:``port``."""
    family, raw = addr16(backend)
    return SOCK_REVNAT_KEY.pack(cookie=cookie, addr=raw, port=check_port(port), family=family)


def decode_sock_revnat_key(raw: bytes) -> dict[str, Any]:
    k = SOCK_REVNAT_KEY.unpack(raw)
    return {"cookie": k["cookie"], "family": enum_label(Family, k["family"]),
            "backend": addr_str(k["family"], k["addr"]), "port": k["port"]}


def decode_sock_revnat(raw: bytes) -> dict[str, Any]:
    v = SOCK_REVNAT.unpack(raw)
    return {"family": enum_label(Family, v["family"]), "frontend": addr_str(v["family"], v["addr"]),
            "port": v["port"], "service_id": v["service_id"]}


def revnat_key(network: int, backend: AddressLike, port: int, proto: int) -> bytes:
    """Key of a backend's revnat entry: the backend pod's network, address, port and protocol."""
    family, raw = addr16(backend)
    return REVNAT_KEY.pack(network=check_u32(network, "network"), addr=raw, port=check_port(port),
                           proto=int(proto), family=family)


def revnat_value(frontends: list[tuple[int, AddressLike, int]]) -> bytes:
    """The frontends (source network, address, port) a backend's replies may come from, at most
    REVNAT_FRONTENDS (the caller decides which stay when there are more)."""
    if len(frontends) > REVNAT_FRONTENDS:
        raise ValueError(f"a revnat entry holds {REVNAT_FRONTENDS} frontends, not {len(frontends)}")
    recs = [{"network": check_u32(net, "network"), "addr": addr16(addr)[1], "port": check_port(port)}
            for net, addr, port in frontends]
    return REVNAT.pack(count=len(recs), frontends=recs)


def decode_revnat_key(raw: bytes) -> dict[str, Any]:
    k = REVNAT_KEY.unpack(raw)
    return {"network": k["network"], "family": enum_label(Family, k["family"]),
            "backend": addr_str(k["family"], k["addr"]), "port": k["port"], "proto": enum_label(Proto, k["proto"])}


def decode_revnat(raw: bytes, family: int) -> dict[str, Any]:
    """The value, its frontends' addresses read in the key's family."""
    v = REVNAT.unpack(raw)
    return {"frontends": [{"network": f["network"], "addr": addr_str(family, f["addr"]), "port": f["port"]}
                          for f in v["frontends"][:min(v["count"], REVNAT_FRONTENDS)]]}
