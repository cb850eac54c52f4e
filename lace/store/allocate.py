"""Allocation every backend shares: network and segment IDs, segments, per-node IP blocks, leases.

Each allocator runs inside one backend transaction: it reads what is taken and writes the object
that records its choice through a ``Records`` handle (the registry passes its ``Writer``, so the
kinds' rules check the record), and the choice and its record commit together. IDs come from the backend's named counters and are never
reused. Service ClusterIPs and NodePorts belong here too, next to blocks, when Services get them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from lace.store import kinds as K
from lace.store.api import Lease
from lace.store.errors import AlreadyExists, Exhausted, IpamExhausted, NotFound, StoreError, ValidationError

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address

# Counter names, as store files have always spelled them.
NETWORK_IDS = "next_network_id"
SEGMENT_IDS = "next_segment_id"


class Counters(Protocol):
    """The named counters of a backend transaction (``backend.Transaction.next_value``)."""

    def next_value(self, counter: str, first: int) -> int: ...


class Records(Protocol):
    """What an allocator reads and writes inside one transaction (``registry.Writer`` is one)."""

    def get(self, kind: str, name: str, namespace: str = "") -> dict | None: ...

    def list(self, kind: str, namespace: str | None = None) -> list[dict]: ...

    def create(self, obj: Mapping[str, Any]) -> dict: ...


# ---- IDs ------------------------------------------------------------------------------------


def _next_id(counters: Counters, counter: str, first: int, limit: int, what: str) -> int:
    value = counters.next_value(counter, first)
    if value > limit:
        # the transaction rolls back, so the counter stays where it was
        raise Exhausted(f"no {what} IDs are left (the last one was {limit})",
                        hint=f"delete unused {what}s; IDs are never reused")
    return value


def network_id(counters: Counters, name: str) -> int:
    """A new Network's ID: fixed for ``default``, the next unused one (from 2) for any other."""
    if name == K.DEFAULT_NETWORK:
        return K.DEFAULT_NETWORK_ID
    return _next_id(counters, NETWORK_IDS, K.FIRST_NETWORK_ID, K.MAX_NETWORK_ID, "network")


def segment_id(counters: Counters) -> int:
    """A new Segment's ID: the next unused one (from 256; lower IDs are reserved segments)."""
    return _next_id(counters, SEGMENT_IDS, K.FIRST_SEGMENT_ID, K.MAX_SEGMENT_ID, "segment")


# ---- segments -------------------------------------------------------------------------------


def allocate_segment(w: Records, network: str, namespace: str, labels: Mapping[str, str]) -> int:
    """The segment ID of (network, namespace, labels): the existing Segment's, or a new one's."""
    spec = {"network": network, "namespace": namespace, "labels": dict(labels)}
    base = K.segment_name(network, namespace, spec["labels"])
    for attempt in range(16):
        name = base if attempt == 0 else f"{base}-{attempt}"
        existing = w.get("Segment", name)
        if existing is None:
            obj = w.create({"apiVersion": K.LACE_API_VERSION, "kind": "Segment",
                            "metadata": {"name": name}, "spec": spec})
            return int(obj["status"]["id"])
        if existing["spec"] == spec:
            return int(existing["status"]["id"])
    raise StoreError(f"segment name collision for {base}")


# ---- per-node IP blocks ---------------------------------------------------------------------


def allocate_block(w: Records, network: str, node: str, family: int | str, prefixlen: int,
                   *, additional: bool = False) -> str:
    """A /prefixlen of the network's CIDR of that family for ``node``, overlapping no other block:
    the node's existing block unless ``additional``, else the lowest free one."""
    version = _family(family)
    net = w.get("Network", network)
    if net is None:
        raise NotFound(f'Network "{network}" not found',
                       hint="create it first (lace get networks lists what exists)")
    blocks = [b for b in w.list("IPBlock") if b["spec"]["network"] == network]
    taken = sorted((ipaddress.ip_network(b["spec"]["cidr"]) for b in blocks
                    if ipaddress.ip_network(b["spec"]["cidr"]).version == version),
                   key=lambda n: int(n.network_address))
    if not additional:
        for b in blocks:
            cidr = ipaddress.ip_network(b["spec"]["cidr"])
            if b["spec"]["node"] == node and cidr.version == version and cidr.prefixlen == prefixlen:
                return str(cidr)
    ranges = [c for c in (ipaddress.ip_network(x) for x in net["spec"]["cidrs"])
              if c.version == version]
    if not ranges:
        raise Exhausted(f'Network "{network}" has no IPv{version} CIDR',
                        hint=f"add an IPv{version} range to its spec.cidrs")
    for rng in ranges:
        if prefixlen < rng.prefixlen or prefixlen > rng.max_prefixlen:
            raise ValidationError(f'IPBlock for node "{node}"', "prefixlen",
                                  f"/{prefixlen} does not fit in {rng}",
                                  f"use a prefix length from {rng.prefixlen} to {rng.max_prefixlen}")
        start = _first_free(rng, prefixlen, taken)
        if start is not None:
            cidr = ipaddress.ip_network(f"{start}/{prefixlen}")
            w.create({
                "apiVersion": K.LACE_API_VERSION, "kind": "IPBlock",
                "metadata": {"name": K.block_name(network, str(cidr)),
                             "labels": {K.NODE_LABEL: node, K.NETWORK_LABEL: network}},
                "spec": {"network": network, "node": node, "cidr": str(cidr)}})
            return str(cidr)
    raise Exhausted(f'Network "{network}" has no free IPv{version} /{prefixlen} block left',
                    hint="add a range to the network's spec.cidrs or use smaller blocks")


def block_prefixlen(cidr: IPNet) -> int:
    """The size of the blocks a node takes from ``cidr``: /24 (IPv4) or /112 (IPv6) out of large
    ranges, a quarter of smaller ones, never less than 16 addresses."""
    if cidr.version == 4:
        return max(min(max(24, cidr.prefixlen + 2), 28), cidr.prefixlen)
    return max(min(max(112, cidr.prefixlen + 2), 124), cidr.prefixlen)


def _family(family: int | str) -> int:
    text = str(family).lower().removeprefix("ipv").removeprefix("inet")
    if text in ("4", ""):
        return 4
    if text == "6":
        return 6
    raise ValidationError("IPBlock request", "family", f"unknown address family {family!r}", "use 4 or 6")


def _first_free(rng: Any, prefixlen: int, taken: list[Any]) -> Any:
    """Lowest aligned /prefixlen inside rng overlapping none of ``taken`` (sorted), or None."""
    size = 1 << (rng.max_prefixlen - prefixlen)
    cand = int(rng.network_address)
    end = int(rng.broadcast_address)
    for block in taken:
        b_start, b_end = int(block.network_address), int(block.broadcast_address)
        if b_end < cand:
            continue
        if cand + size - 1 < b_start:
            break
        cand = ((b_end + 1 + size - 1) // size) * size
    if cand + size - 1 > end:
        return None
    return ipaddress.IPv4Address(cand) if rng.version == 4 else ipaddress.IPv6Address(cand)


# ---- leases: one address per pod interface, from its node's blocks -----------------------------


def _usable(block: IPNet) -> Iterator[IPAddr]:
    # pods get host addresses (/32, /128); the block's first address stays unused so that no pod
    # holds an address that reads as a network address
    it = iter(block)
    next(it)
    for ip in it:
        if block.version == 4 and ip == block.broadcast_address:
            return
        yield ip


def _node_blocks(w: Records, network: str, node: str, version: int) -> list[IPNet]:
    out = []
    for o in w.list("IPBlock"):
        s = o["spec"]
        if s["network"] == network and s["node"] == node:
            cidr = ipaddress.ip_network(s["cidr"])
            if cidr.version == version:
                out.append(cidr)
    return sorted(out, key=lambda c: int(c.network_address))


def leases_for(w: Records, node: str, container_id: str) -> list[dict]:
    """The IPLease objects a container holds on ``node``."""
    return [o for o in w.list("IPLease")
            if o["spec"].get("containerID") == container_id and o["spec"]["node"] == node]


def lease_of(obj: dict) -> Lease:
    """The Lease an IPLease object records."""
    return Lease(obj["spec"]["network"], ipaddress.ip_address(obj["spec"]["ip"]),
                 obj["spec"].get("block", ""), obj["metadata"]["name"])


def allocate_lease(w: Records, network: str, cidrs: Sequence[IPNet], node: str, pod: str,
                   container_id: str, ifname: str) -> Lease:
    """One address for a container on ``node`` from the network's ``cidrs`` of one family: the
    lowest free one in the node's blocks, taking another block when they are full."""
    version = cidrs[0].version
    plen = block_prefixlen(cidrs[0])
    used = {ipaddress.ip_address(o["spec"]["ip"]) for o in w.list("IPLease")
            if o["spec"]["network"] == network}
    for _attempt in range(64):   # a block too small to hold a pod address sends us round again
        blocks = _node_blocks(w, network, node, version)
        for blk in blocks:
            for ip in _usable(blk):
                if ip in used:
                    continue
                name = K.lease_name(network, str(ip))
                try:
                    w.create({
                        "apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
                        "metadata": {"name": name, "labels": {K.NODE_LABEL: node, K.NETWORK_LABEL: network}},
                        "spec": {"network": network, "node": node, "block": K.block_name(network, str(blk)),
                                 "ip": str(ip), "pod": pod, "containerID": container_id,
                                 "ifname": ifname}})
                except AlreadyExists:
                    used.add(ip)      # a lease written by hand holds this address's name
                    continue
                return Lease(network, ip, K.block_name(network, str(blk)), name)
        try:
            allocate_block(w, network, node, version, plen, additional=bool(blocks))
        except Exhausted as e:
            total = sum(sum(1 for _ in _usable(b)) for b in blocks)
            inuse = sum(1 for b in blocks for ip in used if ip in b)
            raise IpamExhausted(
                f'network "{network}" has no free IPv{version} address for node "{node}": '
                f"{inuse} of {total} addresses in use in its blocks "
                f"({', '.join(map(str, blocks)) or 'none'}), and {e.message.lower()}"
                f" — add a range to the network's spec.cidrs or delete unused pods") from None
    raise IpamExhausted(f'network "{network}": could not allocate an IPv{version} address on "{node}"')
