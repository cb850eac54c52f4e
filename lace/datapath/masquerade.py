"""masquerade: the node ports masqueraded pod flows leave with, and the order the datapath tries
them in (C: lace/abi/masquerade.h)."""

from __future__ import annotations

import enum

from lace.datapath.common import AddressLike
from lace.datapath.maglev import flow_hash

MASQ_PORT_MIN = 49152
#: a power of two: candidate ports are taken modulo it with an odd stride
MASQ_PORT_COUNT = 16384
MASQ_TRIES = 32
#: the last port of the range (65535)
MASQ_PORT_MAX = MASQ_PORT_MIN + MASQ_PORT_COUNT - 1
#: the node's own ephemeral ports (``net.ipv4.ip_local_port_range``) must end below the range
EPHEMERAL_PORT_RANGE = (32768, MASQ_PORT_MIN - 1)

C_MACROS: dict[str, int] = {
    "LACE_MASQ_PORT_MIN": MASQ_PORT_MIN,
    "LACE_MASQ_PORT_COUNT": MASQ_PORT_COUNT,
    "LACE_MASQ_TRIES": MASQ_TRIES,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def candidate_ports(network: int, pod: AddressLike, remote: AddressLike, sport: int, dport: int,
                    proto: int) -> list[int]:
    """The ports (ICMP echo: identifiers) a new masqueraded flow from ``pod``:``sport`` in
    ``network`` to ``remote``:``dport`` tries, in order (C: lib/masquerade.h masq_candidate)."""
    h = flow_hash(network, pod, remote, sport, dport, proto)
    start = h % MASQ_PORT_COUNT
    stride = ((h >> 16) % MASQ_PORT_COUNT) | 1
    return [MASQ_PORT_MIN + (start + i * stride) % MASQ_PORT_COUNT for i in range(MASQ_TRIES)]
