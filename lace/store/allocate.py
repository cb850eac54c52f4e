"""Allocation every backend shares: network, segment and service IDs, segments, per-node IP blocks,
pod address leases, and what a Service holds (cluster IPs, node ports, load-balancer addresses).

Each allocator runs inside one backend transaction: it reads what is taken and writes the object
that records its choice through a ``Records`` handle (the registry passes its ``Writer``, so the
kinds' rules check the record), and the choice and its record commit together. IDs come from the
backend's named counters and are never reused.

Pod addresses (``allocate_lease``) come from the node's own IPBlocks, the lowest free one first.
An IPLease is named after its network and address (``kinds.lease_name``), so the leases of one
block share a name prefix (``kinds.lease_prefix``) and are one range of the backend's keys: an
allocation reads the leases of its node's blocks (``BlockLeases``), and a retried ADD finds the
container's leases there too (``leases_for``), never reading every lease of the cluster.

Services (``allocate_service``, run with the Service's own write) follow Kubernetes:

- **Cluster IPs** come from the ranges of the Service's network (annotation ``lace.dev/network``,
  absent: ``default``): the Network's ``spec.serviceCIDRs`` if it names any, else the cluster's
  ``ServiceCIDR`` objects (the built-in ``kubernetes``: 10.96.0.0/16 and fd00:10:96::/112).
  Networks are isolated, so a VIP is unique per network: two networks may both have 10.96.0.10.
  A network also sees the VIPs of the services it imports (``Network.spec.importServices``), so
  no VIP of its own may equal one of those, nor fall inside its pod ranges.
- **Node ports** come from ``kinds.NODE_PORT_RANGE`` (30000-32767), unique in the cluster (they
  answer on every node's address); ports of one Service with the same port number share one.
- **Load-balancer addresses** come from ``LoadBalancerIPPool`` objects, one per IP family of the
  Service where a pool of that family exists, unique in the cluster; they go to
  ``status.loadBalancer.ingress``.
- **Service IDs** (``status.id``, the datapath's service_id) come from a counter, or from the
  ``lace.dev/service-id`` annotation when one is given, unique in the cluster, never changed.

Every held resource is a ``ServiceAllocation`` object named after it (``clusterip.<network>.<ip>``,
``nodeport.<port>``, ``loadbalancer.<ip>``, ``serviceid.<id>``), so a second holder's create
conflicts and "is it taken?" is one lookup, however many services there are. Free addresses and
ports are found by a per-range cursor (a named counter) that walks the range round and round,
so an allocation probes few candidates until the range is nearly full. A conflict or a VIP
outside its range is a ValidationError naming the field; a full range is Exhausted; either way
the write is rolled back whole. Deleting a Service frees everything it held.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from lace.store import kinds as K
from lace.store.api import Lease
from lace.store.errors import AlreadyExists, Exhausted, IpamExhausted, NotFound, StoreError, ValidationError
from lace.store.validation import HEADLESS, allocation_name, object_ref

IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address

# Counter names, as store files have always spelled them.
NETWORK_IDS = "next_network_id"
SEGMENT_IDS = "next_segment_id"
SERVICE_IDS = "next_service_id"
NODE_PORT_CURSOR = "service_node_port_cursor"
#: how many candidates one allocation looks at before calling a range full (a /16 is 65534)
MAX_PROBES = 1 << 17


class Counters(Protocol):
    """The named counters of a backend transaction (``backend.Transaction.next_value``)."""

    def next_value(self, counter: str, first: int) -> int: ...


class Records(Protocol):
    """What an allocator reads and writes inside one transaction (``registry.Writer`` is one)."""

    def get(self, kind: str, name: str, namespace: str = "") -> dict | None: ...

    def list(self, kind: str, namespace: str | None = None) -> list[dict]: ...

    def list_prefix(self, kind: str, prefix: str, namespace: str = "") -> list[dict]: ...

    def prefetch(self, keys: list[tuple[str, str, str]], prefixes: list[tuple[str, str, str]] | None = None) -> None: ...

    def create(self, obj: Mapping[str, Any]) -> dict: ...

    def delete(self, obj: dict) -> dict: ...


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


def leases_in(objs: Iterable[dict], network: str, block: IPNet) -> list[tuple[IPAddr, dict]]:
    """(address, IPLease) of the leases among ``objs`` — the name-prefix range of ``block``'s
    leases (``K.lease_prefix``) — that hold an address of ``block`` in ``network``: another
    network's lease names may share the prefix, and the prefix may be wider than the block."""
    out = []
    for o in objs:
        if o["spec"]["network"] == network:
            ip = ipaddress.ip_address(o["spec"]["ip"])
            if ip in block:
                out.append((ip, o))
    return out


class BlockLeases:
    """The leases of address blocks as one transaction reads them: each block's leases are one
    name-prefix range (a lease is named after its address), read once and shared by
    ``leases_for`` and ``allocate_lease``; no list of every lease."""

    def __init__(self, w: Records) -> None:
        self.w = w
        self._held: dict[tuple[str, IPNet], list[tuple[IPAddr, dict]]] = {}
        self._used: dict[tuple[str, IPNet], set[IPAddr]] = {}

    def read_ahead(self, blocks: Sequence[tuple[str, IPNet]]) -> None:
        """Hint that the leases of these (network, block) are about to be read, with the
        Networks a new lease's validation reads: on etcd, one request instead of one each."""
        self.w.prefetch(sorted({("Network", "", network) for network, _ in blocks}),
                        [("IPLease", "", K.lease_prefix(network, str(block))) for network, block in blocks
                         if (network, block) not in self._held])

    def held(self, network: str, block: IPNet) -> list[tuple[IPAddr, dict]]:
        """(address, IPLease) of ``block``'s addresses in ``network``, by name."""
        key = (network, block)
        if key not in self._held:
            self._held[key] = leases_in(self.w.list_prefix("IPLease", K.lease_prefix(network, str(block))),
                                        network, block)
        return self._held[key]

    def used(self, network: str, block: IPNet) -> set[IPAddr]:
        """The addresses of ``block`` taken in ``network``, with those leased through this reader."""
        key = (network, block)
        if key not in self._used:
            self._used[key] = {ip for ip, _ in self.held(network, block)}
        return self._used[key]


def leases_for(w: Records, node: str, container_id: str, seen: BlockLeases | None = None) -> list[dict]:
    """The IPLease objects a container holds on ``node``, found in the node's blocks (IPBlocks
    are few, one or a few per node and network; the leases of other nodes are not read)."""
    seen = seen or BlockLeases(w)
    blocks = [(o["spec"]["network"], ipaddress.ip_network(o["spec"]["cidr"])) for o in w.list("IPBlock")
              if o["spec"]["node"] == node]
    seen.read_ahead(blocks)
    found: dict[str, dict] = {}
    for network, block in blocks:
        for _, lease in seen.held(network, block):
            if lease["spec"].get("containerID") == container_id and lease["spec"]["node"] == node:
                found[lease["metadata"]["name"]] = lease
    return [found[name] for name in sorted(found)]


def lease_of(obj: dict) -> Lease:
    """The Lease an IPLease object records."""
    return Lease(obj["spec"]["network"], ipaddress.ip_address(obj["spec"]["ip"]),
                 obj["spec"].get("block", ""), obj["metadata"]["name"], obj)


def allocate_lease(w: Records, network: str, cidrs: Sequence[IPNet], node: str, pod: str,
                   container_id: str, ifname: str, annotations: Mapping[str, str] | None = None,
                   seen: BlockLeases | None = None) -> Lease:
    """One address for a container on ``node`` from the network's ``cidrs`` of one family: the
    lowest free one in the node's blocks, taking another block when they are full. The lease
    carries ``annotations`` from the start."""
    version = cidrs[0].version
    plen = block_prefixlen(cidrs[0])
    # what is taken is read per block of this node, as the allocation reaches it: the leases of
    # other nodes' blocks can never hold an address of ours, so they are not read at all
    seen = seen or BlockLeases(w)
    for _attempt in range(64):   # a block too small to hold a pod address sends us round again
        blocks = _node_blocks(w, network, node, version)
        for blk in blocks:
            taken = seen.used(network, blk)
            for ip in _usable(blk):
                if ip in taken:
                    continue
                name = K.lease_name(network, str(ip))
                try:
                    meta: dict[str, Any] = {"name": name, "labels": {K.NODE_LABEL: node, K.NETWORK_LABEL: network}}
                    if annotations:
                        meta["annotations"] = dict(annotations)
                    created = w.create({
                        "apiVersion": K.LACE_API_VERSION, "kind": "IPLease", "metadata": meta,
                        "spec": {"network": network, "node": node, "block": K.block_name(network, str(blk)),
                                 "ip": str(ip), "pod": pod, "containerID": container_id,
                                 "ifname": ifname}})
                except AlreadyExists:
                    taken.add(ip)      # a lease written by hand holds this address's name
                    continue
                taken.add(ip)
                return Lease(network, ip, K.block_name(network, str(blk)), name, created)
        try:
            allocate_block(w, network, node, version, plen, additional=bool(blocks))
        except Exhausted as e:
            total = sum(sum(1 for _ in _usable(b)) for b in blocks)
            inuse = sum(len(seen.used(network, b)) for b in blocks)
            raise IpamExhausted(
                f'network "{network}" has no free IPv{version} address for node "{node}": '
                f"{inuse} of {total} addresses in use in its blocks "
                f"({', '.join(map(str, blocks)) or 'none'}), and {e.message.lower()}"
                f" — add a range to the network's spec.cidrs or delete unused pods") from None
    raise IpamExhausted(f'network "{network}": could not allocate an IPv{version} address on "{node}"')


# ---- services: IDs, cluster IPs, node ports, load-balancer addresses ---------------------------


class ServiceRecords(Records, Counters, Protocol):
    """Records and counters of one transaction: what the service allocators need."""


def _fail(svc: Mapping[str, Any], field: str, problem: str, fix: str) -> None:
    raise ValidationError(object_ref(svc), field, problem, fix)


def _ips(values: Sequence[str] | None) -> list[IPAddr]:
    return [ipaddress.ip_address(v) for v in values or () if v != HEADLESS]


def _range_text(ranges: Sequence[IPNet]) -> str:
    return ", ".join(map(str, ranges)) or "none"


def network_service_ranges(w: Records, network: str) -> list[IPNet]:
    """Where a network's ClusterIPs come from, primary family first: its ``spec.serviceCIDRs``,
    else every ServiceCIDR's ranges (the built-in one first)."""
    net = w.get("Network", network)
    own = ((net or {}).get("spec") or {}).get("serviceCIDRs")
    if own:
        return [ipaddress.ip_network(c) for c in own]
    return cluster_service_ranges(w.list("ServiceCIDR"))


def cluster_service_ranges(service_cidrs: Sequence[Mapping[str, Any]]) -> list[IPNet]:
    """The ranges of ServiceCIDR objects, the built-in one's first (its first CIDR is the cluster's
    primary family, as kube-apiserver's first --service-cluster-ip-range is)."""
    ordered = sorted(service_cidrs, key=lambda o: (o["metadata"]["name"] != K.DEFAULT_SERVICE_CIDR,
                                                   o["metadata"]["name"]))
    return [ipaddress.ip_network(c) for o in ordered for c in o["spec"]["cidrs"]]


def pool_ranges(pools: Sequence[Mapping[str, Any]]) -> list[IPNet]:
    """The ranges of LoadBalancerIPPool objects, by pool name."""
    ordered = sorted(pools, key=lambda o: o["metadata"]["name"])
    return [ipaddress.ip_network(c) for o in ordered for c in o["spec"]["cidrs"]]


def _host_span(rng: IPNet) -> tuple[int, int]:
    """(first address as an integer, how many) of what a range hands out: not its first address
    (nor IPv4's broadcast), as Kubernetes' allocator; all of a /31, /32, /127 or /128."""
    first, size = int(rng.network_address), rng.num_addresses
    if size <= 2:
        return first, size
    return first + 1, size - (2 if rng.version == 4 else 1)


def _in_span(rng: IPNet, addr: IPAddr) -> bool:
    first, count = _host_span(rng)
    return addr.version == rng.version and first <= int(addr) < first + count


def _probe(w: Counters, counter: str, rng: IPNet, is_free: Any) -> IPAddr | None:
    """The next free address of ``rng`` after the range's cursor, or None when none is."""
    first, count = _host_span(rng)
    for _ in range(min(count, MAX_PROBES)):
        offset = w.next_value(counter, 0) % count
        addr = ipaddress.ip_address(first + offset)
        if is_free(addr):
            return addr
    return None


def _allocation(resource: str, service: str, **fields: Any) -> dict:
    spec = {"resource": resource, "service": service, **fields}
    labels = {K.NETWORK_LABEL: fields["network"]} if "network" in fields else {}
    return {"apiVersion": K.LACE_API_VERSION, "kind": "ServiceAllocation",
            "metadata": {"name": allocation_name(spec), **({"labels": labels} if labels else {})},
            "spec": spec}


def _holder(w: Records, name: str, key: str) -> str | None:
    """The other Service holding the allocation ``name`` (namespace/name), or None."""
    rec = w.get("ServiceAllocation", name)
    if rec is None or rec["spec"]["service"] == key:
        return None
    return str(rec["spec"]["service"])


def _imported_vips(w: Records, network: Mapping[str, Any], skip: str) -> dict[IPAddr, str]:
    """VIP -> namespace/name of the services a network imports (but ``skip``)."""
    out: dict[IPAddr, str] = {}
    for ref in (network.get("spec") or {}).get("importServices") or ():
        if ref == skip:
            continue
        ns, _, name = ref.partition("/")
        svc = w.get("Service", name, ns)
        for ip in _ips(((svc or {}).get("spec") or {}).get("clusterIPs")):
            out[ip] = ref
    return out


class _VipScope:
    """Where a Service's VIPs must be unique: its own network and every network importing it."""

    def __init__(self, w: Records, network: str, key: str) -> None:
        self.w = w
        self.key = key
        self.network = network
        nets = {n["metadata"]["name"]: n for n in w.list("Network")}
        self.networks = [network] + sorted(name for name, n in nets.items() if name != network
                                           and key in ((n.get("spec") or {}).get("importServices") or ()))
        self.imported = {name: _imported_vips(w, nets.get(name) or {}, key) for name in self.networks}
        self.pod_ranges = {name: [ipaddress.ip_network(c) for c in
                                  ((nets.get(name) or {}).get("spec") or {}).get("cidrs") or ()]
                           for name in self.networks}

    def conflict(self, addr: IPAddr) -> str | None:
        """Who already has ``addr`` in one of the networks, or None."""
        for net in self.networks:
            where = f'Network "{net}"' + ("" if net == self.network else f" (which imports {self.key})")
            holder = _holder(self.w, K.cluster_ip_allocation(net, str(addr)), self.key)
            if holder is not None:
                return f'Service "{holder}" in {where}'
            if addr in self.imported[net]:
                return f'Service "{self.imported[net][addr]}", imported into {where}'
            for rng in self.pod_ranges[net]:
                if addr.version == rng.version and addr in rng:
                    return f"the pod range {rng} of {where}"
        return None


def _families(svc: dict, network: str, ranges: Sequence[IPNet]) -> list[int]:
    """Kubernetes' defaulting of ipFamilyPolicy and ipFamilies, given the network's ranges; sets
    both fields and returns the families (4, 6) in order."""
    spec = svc["spec"]
    available = list(dict.fromkeys(r.version for r in ranges))
    if not available:
        _fail(svc, "spec.clusterIPs", f'Network "{network}" has no service range',
              "give it spec.serviceCIDRs, or create a ServiceCIDR")
    headless = spec.get("clusterIPs") == [HEADLESS]
    policy = spec.get("ipFamilyPolicy")
    if policy is None:
        # as Kubernetes: a headless service without selector serves whatever addresses it is given
        policy = "RequireDualStack" if headless and not spec.get("selector") and len(available) > 1 \
            else "SingleStack"
    wanted = [ip.version for ip in _ips(spec.get("clusterIPs"))]
    wanted += [int(f[-1]) for f in (spec.get("ipFamilies") or [])[len(wanted):]]
    families: list[int] = []
    for i, version in enumerate(wanted):
        if version in available:
            families.append(version)
        elif not (policy == "PreferDualStack" and i == 1):
            field = f"spec.clusterIPs[{i}]" if i < len(spec.get("clusterIPs") or []) else f"spec.ipFamilies[{i}]"
            _fail(svc, field, f'Network "{network}" has no IPv{version} service range ({_range_text(ranges)})',
                  f"leave IPv{version} out, or give the network an IPv{version} range (spec.serviceCIDRs)")
    if not families:
        families = [available[0]]
    if policy == "SingleStack":
        families = families[:1]
    elif len(families) == 1 and len(available) > 1:
        families.append(next(v for v in available if v != families[0]))
    if policy == "RequireDualStack" and len(families) < 2:
        _fail(svc, "spec.ipFamilyPolicy", f'RequireDualStack, but Network "{network}" has only IPv{available[0]} '
                                          f"service ranges ({_range_text(ranges)})",
              "use PreferDualStack or SingleStack, or give the network both families (spec.serviceCIDRs)")
    spec["ipFamilyPolicy"] = policy
    spec["ipFamilies"] = [f"IPv{v}" for v in families]
    if spec.get("clusterIPs"):
        spec["clusterIPs"] = spec["clusterIPs"][:len(families)] if not headless else [HEADLESS]
    return families


def _cluster_ips(w: ServiceRecords, svc: dict, network: str, ranges: Sequence[IPNet],
                 families: Sequence[int], scope: _VipScope) -> None:
    """Check the requested cluster IPs and allocate the missing ones; sets clusterIP(s)."""
    spec = svc["spec"]
    if spec.get("clusterIPs") == [HEADLESS]:
        return
    ips = _ips(spec.get("clusterIPs"))
    for i, version in enumerate(families):
        in_family = [r for r in ranges if r.version == version]
        field = f"spec.clusterIPs[{i}]"
        if i < len(ips):
            addr = ips[i]
            if not any(_in_span(r, addr) for r in in_family):
                _fail(svc, field, f'{addr} is outside the service ranges of Network "{network}" '
                                  f"({_range_text(in_family)}) or is a range's network or broadcast address",
                      "pick an address inside them, or leave clusterIP out to get one")
            holder = scope.conflict(addr)
            if holder is not None:
                _fail(svc, field, f"{addr} is already taken by {holder}",
                      "pick another address, or leave clusterIP out to get one")
            continue
        for rng in in_family:
            addr = _probe(w, f"service_ip_cursor {network} {rng}", rng, lambda a: scope.conflict(a) is None)
            if addr is not None:
                ips.append(addr)
                break
        else:
            raise Exhausted(f'{object_ref(svc)}: no free IPv{version} cluster IP left in Network "{network}" '
                            f"({_range_text(in_family)})",
                            hint="delete unused services, or give the network a larger range "
                                 "(Network spec.serviceCIDRs, or a ServiceCIDR)")
    spec["clusterIPs"] = [str(ip) for ip in ips]
    spec["clusterIP"] = spec["clusterIPs"][0]


def _needs_node_ports(spec: Mapping[str, Any]) -> bool:
    return spec["type"] == "NodePort" or (spec["type"] == "LoadBalancer"
                                          and spec.get("allocateLoadBalancerNodePorts", True))


def _node_ports(w: ServiceRecords, svc: dict, key: str) -> None:
    """Check requested node ports and allocate the missing ones (ports of one Service with the same
    port number, e.g. 53/TCP and 53/UDP, share one, as in Kubernetes)."""
    spec = svc["spec"]
    if not _needs_node_ports(spec):
        return
    low, high = K.NODE_PORT_RANGE
    by_port: dict[int, int] = {}
    mine: set[int] = set()
    for i, port in enumerate(spec.get("ports") or []):
        if "nodePort" not in port:
            continue
        holder = _holder(w, K.node_port_allocation(port["nodePort"]), key)
        if holder is not None:
            _fail(svc, f"spec.ports[{i}].nodePort", f'{port["nodePort"]} is already allocated to Service "{holder}"',
                  "pick another port, or leave nodePort out to get one")
        by_port.setdefault(port["port"], port["nodePort"])
        mine.add(port["nodePort"])
    for port in spec.get("ports") or []:
        if "nodePort" in port:
            continue
        if port["port"] in by_port:
            port["nodePort"] = by_port[port["port"]]
            continue
        for _ in range(high - low + 1):
            candidate = low + w.next_value(NODE_PORT_CURSOR, 0) % (high - low + 1)
            if candidate not in mine and w.get("ServiceAllocation", K.node_port_allocation(candidate)) is None:
                break
        else:
            raise Exhausted(f"{object_ref(svc)}: no free node port left in {low}-{high}",
                            hint="delete unused NodePort or LoadBalancer services")
        port["nodePort"] = by_port[port["port"]] = candidate
        mine.add(candidate)


def _load_balancer(w: ServiceRecords, svc: dict, existing: Mapping[str, Any] | None,
                   families: Sequence[int], key: str) -> None:
    """status.loadBalancer: for a LoadBalancer service, spec.loadBalancerIP or one address per
    family of the service from the pools (kept across updates); empty for other types."""
    spec = svc["spec"]
    status = svc.setdefault("status", {})
    if spec["type"] != "LoadBalancer":
        status["loadBalancer"] = {}
        return
    ranges = pool_ranges(w.list("LoadBalancerIPPool"))
    old = (((existing or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    kept = [ipaddress.ip_address(e["ip"]) for e in old if e.get("ip")]
    out: list[IPAddr] = []
    requested = spec.get("loadBalancerIP")
    if requested:
        addr = ipaddress.ip_address(requested)
        if not any(addr.version == r.version and addr in r for r in ranges):
            _fail(svc, "spec.loadBalancerIP", f"{addr} is in no LoadBalancerIPPool ({_range_text(ranges)})",
                  "pick an address of a pool (lace get loadbalancerippools), or leave loadBalancerIP out")
        holder = _holder(w, K.load_balancer_allocation(str(addr)), key)
        if holder is not None:
            _fail(svc, "spec.loadBalancerIP", f'{addr} is already allocated to Service "{holder}"',
                  "pick another address, or leave loadBalancerIP out to get one")
        out.append(addr)
    for version in families if not requested else ():
        in_family = [r for r in ranges if r.version == version]
        still = [a for a in kept if any(a.version == r.version and a in r for r in in_family)]
        if still:
            out.append(still[0])
            continue
        for rng in in_family:
            addr = _probe(w, f"service_lb_cursor {rng}", rng,
                          lambda a: w.get("ServiceAllocation", K.load_balancer_allocation(str(a))) is None)
            if addr is not None:
                out.append(addr)
                break
        else:
            if in_family:
                raise Exhausted(f"{object_ref(svc)}: every IPv{version} address of the LoadBalancerIPPools "
                                f"({_range_text(in_family)}) is taken",
                                hint="add a range to a pool, or delete unused LoadBalancer services")
    if not out:
        wanted = " or ".join(f"IPv{v}" for v in families)
        raise Exhausted(f"{object_ref(svc)}: there is no LoadBalancerIPPool with {wanted} addresses "
                        f"(pool ranges: {_range_text(ranges)})",
                        hint="create a LoadBalancerIPPool (lace.dev/v1alpha1, spec.cidrs), or use type NodePort")
    status["loadBalancer"] = {"ingress": [{"ip": str(a)} for a in out]}


def _service_id(w: ServiceRecords, svc: dict, existing: Mapping[str, Any] | None, key: str) -> None:
    """status.id: kept once given; the lace.dev/service-id annotation's, or the next free one."""
    field = f"metadata.annotations.{K.SERVICE_ID_ANNOTATION}"
    raw = (svc["metadata"].get("annotations") or {}).get(K.SERVICE_ID_ANNOTATION)
    given = ((existing or {}).get("status") or {}).get("id")
    status = svc.setdefault("status", {})
    if given is not None:
        if raw is not None and int(raw) != given:
            _fail(svc, field, f"the service has ID {given}, and IDs never change",
                  f"set it to {given} or remove it; to get another ID, delete and recreate the service")
        status["id"] = given
        return
    if raw is not None:
        holder = _holder(w, K.service_id_allocation(int(raw)), key)
        if holder is not None:
            _fail(svc, field, f'ID {raw} is already Service "{holder}"\'s',
                  "pick another ID, or remove the annotation to get one")
        status["id"] = int(raw)
        return
    while True:   # skip IDs given by hand
        sid = _next_id(w, SERVICE_IDS, K.FIRST_SERVICE_ID, K.MAX_SERVICE_ID, "service")
        if w.get("ServiceAllocation", K.service_id_allocation(sid)) is None:
            status["id"] = sid
            return


def _patch_allocated(existing: Mapping[str, Any], svc: dict) -> None:
    """An update keeps what was allocated when the new body leaves it out (as Kubernetes'
    patchAllocatedValues): cluster IPs, IP families and policy, node ports by port name."""
    old, new = existing.get("spec") or {}, svc["spec"]
    if not new.get("clusterIPs") and old.get("clusterIPs"):
        new["clusterIPs"] = list(old["clusterIPs"])
        new["clusterIP"] = new["clusterIPs"][0]
    if "ipFamilyPolicy" not in new and "ipFamilyPolicy" in old:
        new["ipFamilyPolicy"] = old["ipFamilyPolicy"]
    if not new.get("ipFamilies") and old.get("ipFamilies"):
        new["ipFamilies"] = list(old["ipFamilies"])
    if new.get("ipFamilyPolicy") == "SingleStack" and new.get("clusterIPs") != [HEADLESS]:
        # a downgrade to single stack lets the secondary family go
        new["ipFamilies"] = (new.get("ipFamilies") or [])[:1]
        if new.get("clusterIPs"):
            new["clusterIPs"] = new["clusterIPs"][:1]
    if _needs_node_ports(old) and _needs_node_ports(new):
        used = {p["nodePort"] for p in new.get("ports") or [] if "nodePort" in p}
        by_name = {p.get("name", ""): p["nodePort"] for p in old.get("ports") or [] if "nodePort" in p}
        for port in new.get("ports") or []:
            value = by_name.get(port.get("name", ""))
            if "nodePort" not in port and value is not None and value not in used:
                port["nodePort"] = value


def _check_immutable(existing: Mapping[str, Any], svc: dict) -> None:
    old, new = existing.get("spec") or {}, svc["spec"]
    fix = "delete the service and create it again to change it"
    if K.pod_network(existing) != K.pod_network(svc):
        _fail(svc, f"metadata.annotations.{K.NETWORK_ANNOTATION}",
              f'the service is in Network "{K.pod_network(existing)}" and cannot move', fix)
    old_ips, new_ips = old.get("clusterIPs") or [], new.get("clusterIPs") or []
    for i in range(min(len(old_ips), len(new_ips))):
        if old_ips[i] != new_ips[i]:
            _fail(svc, f"spec.clusterIPs[{i}]", f"may not change once set ({old_ips[i]} -> {new_ips[i]})", fix)
    old_families, new_families = old.get("ipFamilies") or [], new.get("ipFamilies") or []
    if old_families and new_families and old_families[0] != new_families[0]:
        _fail(svc, "spec.ipFamilies[0]", f"the primary family may not change ({old_families[0]} -> "
                                         f"{new_families[0]})", fix)


def _held(svc: Mapping[str, Any]) -> dict[str, dict]:
    """The ServiceAllocation objects a stored Service holds, by name."""
    key = K.object_key(svc)
    spec, status = svc.get("spec") or {}, svc.get("status") or {}
    out = []
    if status.get("id") is not None:
        out.append(_allocation("id", key, id=int(status["id"])))
    network = K.pod_network(svc)
    out += [_allocation("clusterIP", key, network=network, ip=str(ip)) for ip in _ips(spec.get("clusterIPs"))]
    if spec.get("type") in ("NodePort", "LoadBalancer"):
        out += [_allocation("nodePort", key, port=port)
                for port in sorted({p["nodePort"] for p in spec.get("ports") or [] if "nodePort" in p})]
    out += [_allocation("loadBalancerIP", key, ip=e["ip"])
            for e in (status.get("loadBalancer") or {}).get("ingress") or [] if e.get("ip")]
    return {o["metadata"]["name"]: o for o in out}


def allocate_service(w: ServiceRecords, existing: Mapping[str, Any] | None, svc: dict) -> None:
    """Fill in what the store allocates for a Service about to be created (``existing`` None) or
    to replace ``existing``: IP families, cluster IPs, node ports, load-balancer addresses and its
    ID; write the ServiceAllocations it now holds and free those it no longer does."""
    key = K.object_key(svc)
    network = K.pod_network(svc)
    if existing is not None:
        _patch_allocated(existing, svc)
    ranges = network_service_ranges(w, network)
    families = _families(svc, network, ranges)
    if existing is not None:
        _check_immutable(existing, svc)
    _cluster_ips(w, svc, network, ranges, families, _VipScope(w, network, key))
    _node_ports(w, svc, key)
    _load_balancer(w, svc, existing, families, key)
    _service_id(w, svc, existing, key)
    want = _held(svc)
    for name, obj in want.items():
        rec = w.get("ServiceAllocation", name)
        if rec is None:
            w.create(obj)
        elif rec["spec"]["service"] != key:   # every choice above was checked against the records
            raise StoreError(f'{object_ref(svc)}: ServiceAllocation "{name}" is Service '
                             f'{rec["spec"]["service"]}\'s')
    for name in _held(existing or {}).keys() - want.keys():
        rec = w.get("ServiceAllocation", name)
        if rec is not None and rec["spec"]["service"] == key:
            w.delete(rec)


def release_service(w: Records, svc: Mapping[str, Any]) -> None:
    """Free what a deleted Service held."""
    key = K.object_key(svc)
    for name in _held(svc):
        rec = w.get("ServiceAllocation", name)
        if rec is not None and rec["spec"]["service"] == key:
            w.delete(rec)


def check_imports(w: Records, existing: Mapping[str, Any] | None, net: Mapping[str, Any]) -> None:
    """A Network's ``spec.importServices``: each newly listed service exists, and no imported VIP
    equals one of the network's own, another import's, or falls in its pod ranges."""
    name = net["metadata"]["name"]
    before = set(((existing or {}).get("spec") or {}).get("importServices") or ())
    pod_ranges = [ipaddress.ip_network(c) for c in net["spec"]["cidrs"]]
    seen: dict[IPAddr, str] = {}
    for i, ref in enumerate(net["spec"].get("importServices") or ()):
        field = f"spec.importServices[{i}]"
        ns, _, svc_name = ref.partition("/")
        svc = w.get("Service", svc_name, ns)
        if svc is None:
            if ref in before:
                continue   # imported while it existed: the datapath skips it until it is back
            _fail(net, field, f'Service "{ref}" does not exist', "create it first, or remove it from the list")
        assert svc is not None
        if K.pod_network(svc) == name:
            _fail(net, field, f'Service "{ref}" is in Network "{name}" already', "remove it from the list")
        vips = _ips(svc["spec"].get("clusterIPs"))
        if not vips and ref not in before:
            _fail(net, field, f'Service "{ref}" is headless: it has no cluster IP to import',
                  "import a service with a cluster IP")
        for addr in vips:
            holder = _holder(w, K.cluster_ip_allocation(name, str(addr)), ref)
            if holder is not None:
                _fail(net, field, f'{ref}\'s cluster IP {addr} is Service "{holder}"\'s in Network "{name}"',
                      "change one of the two services' addresses, or give the network its own "
                      "spec.serviceCIDRs")
            if addr in seen:
                _fail(net, field, f'{ref}\'s cluster IP {addr} is also imported Service "{seen[addr]}"\'s',
                      "import only one of them")
            for rng in pod_ranges:
                if addr.version == rng.version and addr in rng:
                    _fail(net, field, f"{ref}'s cluster IP {addr} is inside the network's pod range {rng}",
                          "import a service whose address is outside the pod ranges")
            seen[addr] = ref


def cluster_ips_outside(allocations: Iterable[Mapping[str, Any]], ranges_of: Any) -> list[str]:
    """Allocated cluster IPs outside ``ranges_of(network)`` (None: that network is not checked),
    as ``ip (Service ns/name in Network "n")``."""
    out = []
    for rec in allocations:
        spec = rec["spec"]
        if spec["resource"] != "clusterIP":
            continue
        ranges = ranges_of(spec["network"])
        addr = ipaddress.ip_address(spec["ip"])
        if ranges is not None and not any(_in_span(r, addr) for r in ranges):
            out.append(f'{addr} (Service {spec["service"]} in Network "{spec["network"]}")')
    return out


def load_balancer_ips_outside(allocations: Iterable[Mapping[str, Any]], ranges: Sequence[IPNet]) -> list[str]:
    """Allocated load-balancer addresses outside ``ranges``, as ``ip (Service ns/name)``."""
    out = []
    for rec in allocations:
        spec = rec["spec"]
        if spec["resource"] == "loadBalancerIP":
            addr = ipaddress.ip_address(spec["ip"])
            if not any(addr.version == r.version and addr in r for r in ranges):
                out.append(f'{addr} (Service {spec["service"]})')
    return out
