"""Per-node IPAM: blocks of each network's CIDRs for this node, one lease per pod address.

Blocks and leases live in the store (IPBlock / IPLease), so they persist across agent restarts and
two nodes never hand out the same address. A container that asks again gets its existing lease.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from lace.store.errors import AlreadyExists, Exhausted
from lace.store.kinds import LACE_API_VERSION, block_name, lease_name

from .model import IPAddr, IPNet


class IpamExhausted(Exception):
    """No address left for a pod: the message names the network, the node and the usage."""


def block_prefixlen(cidr: IPNet) -> int:
    """The size of the blocks a node takes from ``cidr``: /24 (IPv4) or /112 (IPv6) out of large
    ranges, a quarter of smaller ones, never less than 16 addresses."""
    if cidr.version == 4:
        return max(min(max(24, cidr.prefixlen + 2), 28), cidr.prefixlen)
    return max(min(max(112, cidr.prefixlen + 2), 124), cidr.prefixlen)


def _usable(block: IPNet):
    # pods get host addresses (/32, /128); the block's first address stays unused so that no pod
    # holds an address that reads as a network address
    it = iter(block)
    next(it)
    for ip in it:
        if block.version == 4 and ip == block.broadcast_address:
            return
        yield ip


@dataclass(frozen=True)
class Lease:
    """An address held for a container: its network, IP, IPBlock object name and IPLease name."""

    network: str
    ip: IPAddr
    block: str
    name: str


class Ipam:
    def __init__(self, store, node: str) -> None:
        self.store = store
        self.node = node

    def leases_for(self, container_id: str) -> list[dict]:
        return [o for o in self.store.list("ipleases").items
                if o["spec"].get("containerID") == container_id and o["spec"]["node"] == self.node]

    def allocate(self, network: str, cidrs: list[IPNet], pod: str, container_id: str,
                 ifname: str) -> list[Lease]:
        existing = self.leases_for(container_id)
        if existing:
            return [Lease(o["spec"]["network"], ipaddress.ip_address(o["spec"]["ip"]),
                          o["spec"].get("block", ""), o["metadata"]["name"]) for o in existing]
        out = []
        try:
            for version in sorted({c.version for c in cidrs}):
                family_cidrs = [c for c in cidrs if c.version == version]
                out.append(self._allocate_one(network, family_cidrs, version, pod, container_id, ifname))
        except BaseException:
            for lease in out:
                self._delete(lease.name)
            raise
        return out

    def _allocate_one(self, network: str, cidrs: list[IPNet], version: int, pod: str,
                      container_id: str, ifname: str) -> Lease:
        plen = block_prefixlen(cidrs[0])
        used = {ipaddress.ip_address(o["spec"]["ip"]) for o in self.store.list("ipleases").items
                if o["spec"]["network"] == network}
        for attempt in range(64):
            blocks = self._blocks(network, version)
            for blk in blocks:
                for ip in _usable(blk):
                    if ip in used:
                        continue
                    name = lease_name(network, str(ip))
                    try:
                        self.store.create({
                            "apiVersion": LACE_API_VERSION, "kind": "IPLease",
                            "metadata": {"name": name, "labels": {"lace.dev/node": self.node,
                                                                   "lace.dev/network": network}},
                            "spec": {"network": network, "node": self.node, "block": block_name(network, str(blk)),
                                     "ip": str(ip), "pod": pod, "containerID": container_id,
                                     "ifname": ifname}})
                    except AlreadyExists:
                        used.add(ip)      # another writer took it a moment ago
                        continue
                    return Lease(network, ip, block_name(network, str(blk)), name)
            try:
                self.store.allocate_block(network, self.node, version, plen, additional=bool(blocks))
            except Exhausted as e:
                total = sum(sum(1 for _ in _usable(b)) for b in blocks)
                inuse = sum(1 for b in blocks for ip in used if ip in b)
                raise IpamExhausted(
                    f'network "{network}" has no free IPv{version} address for node "{self.node}": '
                    f"{inuse} of {total} addresses in use in its blocks "
                    f"({', '.join(map(str, blocks)) or 'none'}), and {e.message.lower()}"
                    f" — add a range to the network's spec.cidrs or delete unused pods") from None
        raise IpamExhausted(f'network "{network}": could not allocate an IPv{version} address on "{self.node}"')

    def _blocks(self, network: str, version: int) -> list[IPNet]:
        out = []
        for o in self.store.list("ipblocks").items:
            s = o["spec"]
            if s["network"] == network and s["node"] == self.node:
                cidr = ipaddress.ip_network(s["cidr"])
                if cidr.version == version:
                    out.append(cidr)
        return sorted(out, key=lambda c: int(c.network_address))

    def release(self, container_id: str) -> int:
        leases = self.leases_for(container_id)
        for o in leases:
            self._delete(o["metadata"]["name"])
        return len(leases)

    def _delete(self, name: str) -> None:
        from lace.store.errors import NotFound
        try:
            self.store.delete("ipleases", name)
        except NotFound:
            pass
