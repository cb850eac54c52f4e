"""Per-node IPAM: this node's view of the store's address allocator.

Blocks and leases live in the store (IPBlock / IPLease) and are allocated there
(``lace.store.allocate``), so they persist across agent restarts, every caller shares one allocator
and two nodes never hand out the same address. A container that asks again gets its existing lease.
"""

from __future__ import annotations

from typing import Mapping

from lace.store.allocate import block_prefixlen
from lace.store.api import Lease, Store
from lace.store.errors import IpamExhausted

from .model import IPNet

__all__ = ["Ipam", "IpamExhausted", "Lease", "block_prefixlen"]


class Ipam:
    """The leases of this node's containers."""

    def __init__(self, store: Store, node: str) -> None:
        self.store = store
        self.node = node

    def leases_for(self, container_id: str) -> list[dict]:
        return self.store.leases_for(self.node, container_id)

    def allocate(self, network: str, cidrs: list[IPNet], pod: str, container_id: str,
                 ifname: str, annotations: Mapping[str, str] | None = None) -> list[Lease]:
        return self.store.allocate_leases(network, self.node, cidrs, pod, container_id, ifname, annotations)

    def release(self, container_id: str) -> list[dict]:
        """Delete the container's leases on this node; returns them as they were."""
        return self.store.release_leases(self.node, container_id)
