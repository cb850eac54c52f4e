"""devices: interfaces lace manages on the node, with their role and MAC; nexthops: the underlay's
next hop per SID, which the datapath caches from the node's FIB (C: lace/abi/devices.h)."""

from __future__ import annotations

import enum
import ipaddress
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import enum_label, mac_bytes, mac_str, check_u32

DEVICES_MAX = 4096
NEXTHOPS_MAX = 4096
#: how long a nexthops entry stands in for the node's FIB
NEXTHOP_TTL_NS = 100_000_000


class DeviceRole(enum.IntEnum):
    """What a managed interface is for (C: enum lace_device_role)."""

    POD_VETH = 1  # host side of a pod's veth
    UPLINK = 2  # the node's underlay interface
    HOST = 3  # the host device for host <-> pod traffic

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")


#: struct lace_device_key (devices.h)
DEVICE_KEY = Layout("struct lace_device_key", [("ifindex", "u32")])

#: struct lace_device (devices.h)
DEVICE = Layout(
    "struct lace_device",
    [("mac", "bytes:6"), ("role", "u8"), ("flags", "u8")],
)

#: struct lace_nexthop_key (devices.h): an SRv6 destination (a remote node's SID)
NEXTHOP_KEY = Layout("struct lace_nexthop_key", [("sid", "bytes:16")])

#: struct lace_nexthop (devices.h): what the FIB said for it, and until when the datapath trusts it
NEXTHOP = Layout(
    "struct lace_nexthop",
    [("expires_ns", "u64"), ("ifindex", "u32"), ("mtu", "u32"), ("smac", "bytes:6"), ("dmac", "bytes:6"),
     ("pad", "u32")],
)

C_MACROS: dict[str, int] = {
    "LACE_DEVICES_MAX": DEVICES_MAX, "LACE_NEXTHOPS_MAX": NEXTHOPS_MAX, "LACE_NEXTHOP_TTL_NS": NEXTHOP_TTL_NS,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {"lace_device_role": (DeviceRole, "LACE_ROLE_")}


def device_key(ifindex: int) -> bytes:
    return DEVICE_KEY.pack(ifindex=check_u32(ifindex, "ifindex"))


def device_value(mac: str | bytes, role: DeviceRole, flags: int = 0) -> bytes:
    return DEVICE.pack(mac=mac_bytes(mac), role=int(role), flags=flags)


def decode_device_key(raw: bytes) -> dict[str, Any]:
    return DEVICE_KEY.unpack(raw)


def decode_device(raw: bytes) -> dict[str, Any]:
    v = DEVICE.unpack(raw)
    return {"mac": mac_str(v["mac"]), "role": enum_label(DeviceRole, v["role"]), "flags": v["flags"]}


def nexthop_key(sid: str | bytes) -> bytes:
    return NEXTHOP_KEY.pack(sid=ipaddress.IPv6Address(sid).packed if isinstance(sid, str) else sid)


def decode_nexthop_key(raw: bytes) -> dict[str, Any]:
    return {"sid": str(ipaddress.IPv6Address(NEXTHOP_KEY.unpack(raw)["sid"]))}


def decode_nexthop(raw: bytes) -> dict[str, Any]:
    v = NEXTHOP.unpack(raw)
    return {"ifindex": v["ifindex"], "dmac": mac_str(v["dmac"]), "smac": mac_str(v["smac"]), "mtu": v["mtu"],
            "expires_ns": v["expires_ns"]}
