"""Build the agent's Snapshot from the store and the node's links: everything the desired-state
computation (``lace.agent.desired``, no I/O) needs.

Reads the store and this namespace's links, and writes one kind of thing: the segment IDs a pod's
new label set or a policy's ipBlock needs, allocated in the store on first use (idempotent, so every
node and the CLI agree on them).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from lace import netlink
from lace.datapath.conntrack import CT_ENDPOINT_DEFAULT
from lace.policy.sources import policy_inputs
from lace.services.cache import ServiceCache
from lace.services.model import frontends, imports_by_service

from lace.store import kinds as K

from .cluster import ClusterCache
from .hostdev import NET_IFNAME
from .model import (Block, HostAddress, HostLink, LocalEndpoint, NodeConfig,
                    PodAddress, Snapshot, is_host_container, is_pod_container, is_probe_container, parse_network,
                    parse_node, pod_container, probe_pod)


class NotRegistered(Exception):
    """This node has no Node object with its lace annotations yet."""


def build_snapshot(store: Any, node_name: str, uplink: str, mtu: int, kubelet_cgroup: int = 0,
                   services: ServiceCache | None = None,
                   ct_endpoint_limit: int = CT_ENDPOINT_DEFAULT, links: netlink.LinkIndex | None = None,
                   cluster: ClusterCache | None = None) -> Snapshot:
    """Everything a pass needs. ``cluster``, the agent's cache of the watched kinds
    (lace.agent.cluster), and ``services``, its service cache (which also keeps every unchanged
    service's frontends), stand in for listing the store; without them the store is listed now.
    ``store`` allocates the segments new label sets and ipBlock CIDRs need. ``links``: the agent's
    index of the namespace's interfaces, looked at only for interfaces it has not seen (one index
    per pass instead of a request per pod, ~1 ms of CPU each in pyroute2; a resync reads it afresh
    before the pass); without it every interface is read."""
    ifaces = (links or netlink.LinkIndex()).refresh(full=links is None)
    if cluster is None:
        cluster = ClusterCache.listed(store)
    with cluster.lock:
        return _snapshot(store, cluster, node_name, ifaces.get(uplink), uplink, mtu, kubelet_cgroup, services,
                         ct_endpoint_limit, ifaces)


def _snapshot(store: Any, cluster: ClusterCache, node_name: str, up: Any, uplink: str, mtu: int,
              kubelet_cgroup: int, services: ServiceCache | None, ct_endpoint_limit: int,
              ifaces: Any) -> Snapshot:
    net_objs = cluster.items("networks")
    ids = cluster.network_ids()
    networks = {n.name: n for n in (parse_network(o, ids) for o in net_objs) if n}
    nodes = {n.name: n for n in (parse_node(o) for o in cluster.items("nodes")) if n}
    me = nodes.get(node_name)
    if me is None:
        raise NotRegistered(f'node "{node_name}" is not registered (no Node object with lace annotations)')
    if up is None:
        raise NotRegistered(f'node "{node_name}" has no uplink interface "{uplink}"')
    snap = Snapshot(NodeConfig(me, up.ifindex, up.mac, mtu, kubelet_cgroup, ct_endpoint_limit), networks, nodes)

    for o in cluster.items("ipblocks"):
        s = o["spec"]
        if s["network"] in ids:
            snap.blocks.append(Block(ids[s["network"]], s["node"], ipaddress.ip_network(s["cidr"])))

    segments = dict(cluster.segment_ids())   # a pass may allocate segments into it
    pods = cluster.pods()

    local: dict[str, dict[str, Any]] = {}
    #: this node's containers -> their probe addresses (not pod addresses: no segment, no delivery)
    probe_ips: dict[str, list] = {}
    memo = cluster.lease_memo
    for lease in cluster.items("ipleases"):
        if is_host_container(lease.container_id):
            if lease.network == K.DEFAULT_NETWORK:
                snap.host_addresses.append(HostAddress(lease.node, lease.ip))
            continue
        if is_probe_container(lease.container_id):
            if lease.node == node_name:
                probe_ips.setdefault(pod_container(lease.container_id), []).append(lease.ip)
            continue
        pod = pods.get(lease.pod)
        net_id = ids.get(lease.network)
        if pod is None or net_id is None:
            continue   # the pod is gone: its lease is garbage the owning agent collects
        identity = (lease.network, pod.namespace, pod.labels)
        seg = segments.get(identity)
        if seg is None:
            seg = segments[identity] = store.allocate_segment(lease.network, pod.namespace, pod.label_dict)
        address = memo.get(lease.name)
        if (address is None or address.ip is not lease.ip or address.segment != seg or address.network != net_id
                or address.node is not lease.node or address.pod is not lease.pod):
            address = memo[lease.name] = PodAddress(net_id, lease.ip, seg, lease.node, lease.pod)
        snap.pods.append(address)
        if lease.node == node_name:
            _note_local(local, lease, net_id, seg)
    snap.policy = policy_inputs(cluster.items("namespaces"), cluster.items("networkpolicies"), pods, snap.pods,
                                segments, store.allocate_segment, cluster.pod_inputs_memo,
                                cluster.policy_inputs_memo)
    # a backend in none of its network's CIDRs that is no pod is outside (lace.services.model)
    cidrs = {n.id: n.cidrs for n in networks.values()}
    if services is not None:
        services.set_context(ids, imports_by_service(net_objs, ids), me.underlay4, me.underlay, cidrs)
        snap.frontends = services.frontends()
    else:
        snap.frontends = frontends(store.list("services").items, store.list("endpointslices").items, ids,
                                   imports_by_service(net_objs, ids), node_name, cidrs)

    net = ifaces.get(NET_IFNAME)
    if net is not None:
        snap.host_link = HostLink(net.ifindex, net.mac)

    snap.endpoints = _endpoints(local, probe_ips, pods.get, ifaces)
    return snap


def pod_endpoints(cluster: ClusterCache, node_name: str, key: str, ids: dict[str, int],
                  segments: dict[tuple, int], ifaces: Any) -> list[LocalEndpoint] | None:
    """The local endpoints a full pass would build for pod ``key`` (namespace/name) alone, from
    the agent's cluster cache (under its lock) and the namespace's interfaces; None when one of
    its addresses needs a segment not allocated yet (a full pass allocates it)."""
    pod = cluster.pod(key)
    if pod is None:
        return []
    local: dict[str, dict[str, Any]] = {}
    probe_ips: dict[str, list] = {}
    for lease in cluster.leases_of(key):
        net_id = ids.get(lease.network)
        if lease.node != node_name or net_id is None or not is_pod_container(lease.container_id):
            continue
        seg = segments.get((lease.network, pod.namespace, pod.labels))
        if seg is None:
            return None
        _note_local(local, lease, net_id, seg)
    for lease in cluster.leases_of(probe_pod(key)):
        if lease.node == node_name and is_probe_container(lease.container_id):
            probe_ips.setdefault(pod_container(lease.container_id), []).append(lease.ip)
    return _endpoints(local, probe_ips, {key: pod}.get, ifaces)


def _note_local(local: dict[str, dict[str, Any]], lease: Any, net_id: int, seg: int) -> None:
    """One address of a pod interface of this node, under its container (an interface the ADD
    has not named yet is not one: nothing to program for it)."""
    if not lease.host_ifname:
        return
    ep = local.setdefault(lease.container_id, {
        "pod": lease.pod, "network": net_id, "segment": seg, "host": lease.host_ifname,
        "mac": lease.pod_mac, "ipv4": None, "ipv6": None})
    ep["ipv4" if lease.ip.version == 4 else "ipv6"] = lease.ip


def _endpoints(local: dict[str, dict[str, Any]], probe_ips: dict[str, list], pod_of: Any,
               ifaces: Any) -> list[LocalEndpoint]:
    out = []
    for cid, ep in local.items():
        link = ifaces.get(ep["host"])
        if link is None:
            continue   # interface not there (yet, or anymore): nothing to program for it
        pod = pod_of(ep["pod"])
        out.append(LocalEndpoint(
            endpoint_id=link.ifindex, pod=ep["pod"], container_id=cid, network=ep["network"],
            segment=ep["segment"], ifindex=link.ifindex, host_ifname=ep["host"], host_mac=link.mac,
            pod_mac=ep["mac"], ipv4=ep["ipv4"], ipv6=ep["ipv6"],
            probe_ports=pod.probe_ports if pod is not None else (),
            probe_ips=tuple(sorted(probe_ips.get(cid, ()), key=lambda a: (a.version, a)))))
    return out
