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
from lace.probes import pod_probe_ports
from lace.services.cache import ServiceCache
from lace.services.model import frontends, imports_by_service

from lace.store import kinds as K

from .hostdev import NET_IFNAME
from .model import (ANN_HOST_IFNAME, ANN_POD_MAC, Block, HostAddress, HostLink, LocalEndpoint, NodeConfig,
                    PodAddress, Snapshot, by_name, is_host_lease, is_probe_lease, lease_container, parse_network,
                    parse_node)


class NotRegistered(Exception):
    """This node has no Node object with its lace annotations yet."""


def _labels_key(network: str, namespace: str, labels: dict[str, str]) -> tuple:
    return (network, namespace, tuple(sorted(labels.items())))


def build_snapshot(store: Any, node_name: str, uplink: str, mtu: int, kubelet_cgroup: int = 0,
                   services: ServiceCache | None = None,
                   ct_endpoint_limit: int = CT_ENDPOINT_DEFAULT, links: netlink.LinkIndex | None = None) -> Snapshot:
    """Everything a pass needs; ``services``, the agent's service cache, stands in for listing
    Services and EndpointSlices (and keeps every unchanged service's frontends). ``links``: the
    agent's index of the namespace's interfaces, looked at only for interfaces it has not seen
    (one index per pass instead of a request per pod, ~1 ms of CPU each in pyroute2; a resync
    reads it afresh before the pass); without it every interface is read."""
    ifaces = (links or netlink.LinkIndex()).refresh(full=links is None)
    net_objs = store.list("networks").items
    ids = by_name(net_objs)
    networks = {n.name: n for n in (parse_network(o, ids) for o in net_objs) if n}
    nodes = {n.name: n for n in (parse_node(o) for o in store.list("nodes").items) if n}
    me = nodes.get(node_name)
    if me is None:
        raise NotRegistered(f'node "{node_name}" is not registered (no Node object with lace annotations)')
    up = ifaces.get(uplink)
    if up is None:
        raise NotRegistered(f'node "{node_name}" has no uplink interface "{uplink}"')
    snap = Snapshot(NodeConfig(me, up.ifindex, up.mac, mtu, kubelet_cgroup, ct_endpoint_limit), networks, nodes)

    for o in store.list("ipblocks").items:
        s = o["spec"]
        if s["network"] in ids:
            snap.blocks.append(Block(ids[s["network"]], s["node"], ipaddress.ip_network(s["cidr"])))

    segments = {_labels_key(o["spec"]["network"], o["spec"]["namespace"], o["spec"].get("labels") or {}):
                int(o["status"]["id"]) for o in store.list("segments").items if "id" in (o.get("status") or {})}
    pods = {f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}': p for p in store.list("pods").items}

    local: dict[str, dict[str, Any]] = {}
    #: this node's containers -> their probe addresses (not pod addresses: no segment, no delivery)
    probe_ips: dict[str, list] = {}
    for lease in store.list("ipleases").items:
        s = lease["spec"]
        if is_host_lease(s):
            if s["network"] == K.DEFAULT_NETWORK:
                snap.host_addresses.append(HostAddress(s["node"], ipaddress.ip_address(s["ip"])))
            continue
        if is_probe_lease(s):
            if s["node"] == node_name:
                probe_ips.setdefault(lease_container(s), []).append(ipaddress.ip_address(s["ip"]))
            continue
        pod = pods.get(s["pod"])
        net_id = ids.get(s["network"])
        if pod is None or net_id is None:
            continue   # the pod is gone: its lease is garbage the owning agent collects
        ns = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        seg = segments.get(_labels_key(s["network"], ns, labels))
        if seg is None:
            seg = store.allocate_segment(s["network"], ns, labels)
            segments[_labels_key(s["network"], ns, labels)] = seg
        ip = ipaddress.ip_address(s["ip"])
        snap.pods.append(PodAddress(net_id, ip, seg, s["node"], s["pod"]))
        ann = lease["metadata"].get("annotations") or {}
        if s["node"] == node_name and ann.get(ANN_HOST_IFNAME):
            ep = local.setdefault(s.get("containerID", ""), {
                "pod": s["pod"], "network": net_id, "segment": seg, "host": ann[ANN_HOST_IFNAME],
                "mac": ann.get(ANN_POD_MAC, ""), "ipv4": None, "ipv6": None})
            ep["ipv4" if ip.version == 4 else "ipv6"] = ip
    snap.policy = policy_inputs(store, pods, snap.pods, segments)
    if services is not None:
        services.set_context(ids, imports_by_service(net_objs, ids), me.underlay4, me.underlay)
        snap.frontends = services.frontends()
    else:
        snap.frontends = frontends(store.list("services").items, store.list("endpointslices").items, ids,
                                   imports_by_service(net_objs, ids), node_name)

    net = ifaces.get(NET_IFNAME)
    if net is not None:
        snap.host_link = HostLink(net.ifindex, net.mac)

    for cid, ep in local.items():
        link = ifaces.get(ep["host"])
        if link is None:
            continue   # interface not there (yet, or anymore): nothing to program for it
        snap.endpoints.append(LocalEndpoint(
            endpoint_id=link.ifindex, pod=ep["pod"], container_id=cid, network=ep["network"],
            segment=ep["segment"], ifindex=link.ifindex, host_ifname=ep["host"], host_mac=link.mac,
            pod_mac=ep["mac"], ipv4=ep["ipv4"], ipv6=ep["ipv6"],
            probe_ports=tuple(sorted(pod_probe_ports(pods[ep["pod"]]))) if ep["pod"] in pods else (),
            probe_ips=tuple(sorted(probe_ips.get(cid, ()), key=lambda a: (a.version, a)))))
    return snap
