"""Desired map contents for one node, computed from a Snapshot: no I/O, no store, no kernel.

Returns, for every map the agent owns, the exact set of entries it should hold (packed key ->
packed value); the same snapshot always gives the same entries. The policy maps come from the
agent's PolicyProgrammer, whose caches only make a repeat cheaper; the service maps from its
ServiceProgrammer, which also keeps backend IDs and Maglev table numbers stable across passes
(``maglev`` entries are whole tables). The diff against what the kernel holds is
``lace.agent.diff``.
"""

from __future__ import annotations

import ipaddress

from lace.datapath import config as cfg
from lace.datapath.common import NETWORK_OUTSIDE, SEGMENT_HOST, SEGMENT_REMOTE_NODE, mac_bytes
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_key, exact_entries
from lace.datapath.devices import DeviceRole, device_key, device_value
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.probes import ProbeFlag, probe_address_key, probe_key, probe_value
from lace.datapath.routing import route_value, routing_key
from lace.datapath.segment import segment_key, segment_value
from lace.policy.program import PolicyProgrammer
from lace.datapath.services import ServiceFlag
from lace.services.model import on_node
from lace.services.program import ServiceProgrammer
from lace.store import kinds as K

from .model import LocalEndpoint, Snapshot

#: maps the agent owns and reconciles, in the order their updates are written (what an entry points
#: at comes before it: backends and Maglev tables before the services that name them, port blocks
#: before the policy markers whose BLOCKS bit sends a check to them); deletes go in reverse.
#: delivery-exact, the hash the datapath probes before the delivery trie, comes right after it: an
#: entry is added to the trie before the hash and deleted from the hash before the trie, so the
#: hash never holds an entry the trie has not (a changed value reaches the hash just after the
#: trie, and until then the hash answers with the old one, as the trie did a moment before). The
#: datapath owns conntrack, affinity, events, metrics and probe-cookie.
OWNED_MAPS = ("config", "devices", "routing", "delivery", "delivery-exact", "veth", "segment", "prefix-segment",
              "policy", "policy-exact", "backends", "maglev", "revnat", "services", "probes")

Entries = dict[bytes, bytes]


def desired_maps(s: Snapshot, policy: PolicyProgrammer | None = None,
                 services: ServiceProgrammer | None = None) -> dict[str, Entries]:
    """Every owned map's entries; ``policy`` and ``services`` are the node's programmers (fresh
    ones if None)."""
    out: dict[str, Entries] = {name: {} for name in OWNED_MAPS}
    me = s.config.node
    out["config"][cfg.config_key()] = cfg.config_value(
        locator=str(me.locator), underlay_addr=str(me.underlay), node_id=me.node_id,
        uplink_ifindex=s.config.uplink_ifindex, mtu=s.config.mtu,
        addr4=str(me.underlay4) if me.underlay4 else None, kubelet_cgroup=s.config.kubelet_cgroup)

    out["devices"][device_key(s.config.uplink_ifindex)] = device_value(s.config.uplink_mac, DeviceRole.UPLINK)
    if s.host_link is not None:
        out["devices"][device_key(s.host_link.ifindex)] = device_value(s.host_link.mac, DeviceRole.HOST)

    _routing(s, out["routing"])
    _delivery(s, out["delivery"])
    default = s.network_id(K.DEFAULT_NETWORK)
    for ep in s.endpoints:
        for name, entries in endpoint_entries(ep, ct_limit(s, ep.network), default).items():
            out[name].update(entries)
    out["delivery-exact"] = exact_entries(out["delivery"])

    local = {(ep.network, ip) for ep in s.endpoints for ip in ep.ips()}
    values: dict[tuple[int, bool], bytes] = {}   # one value per (segment, local): pods share them
    segments = out["segment"]
    for p in s.pods:
        flag = bool(local) and (p.network, p.ip) in local
        v = values.get((p.segment, flag))
        if v is None:
            v = values[(p.segment, flag)] = segment_value(p.segment, local=flag)
        segments[p.key] = v
    _host_segments(s, out["segment"])
    _underlay_peers(s, out["segment"])
    if s.policy is not None:
        programmer = policy if policy is not None else PolicyProgrammer(me.name)
        maps, out["prefix-segment"] = programmer.map_entries(s.policy)
        out.update(maps)
    svc = services if services is not None else ServiceProgrammer()
    # node-port frontends answer on this node's own addresses
    out["services"], out["backends"], out["maglev"] = svc.entries(on_node(s.frontends, me.underlay4, me.underlay))
    out["revnat"] = svc.revnat_entries()
    _service_overflow_routes(s, svc, out["routing"])
    return out


#: the maps a local endpoint has entries of its own in (endpoint_entries), besides its addresses'
#: segment entries and the delivery-exact copies of its delivery entries
ENDPOINT_MAPS = ("devices", "delivery", "veth", "probes")


def endpoint_entries(ep: LocalEndpoint, ct_max: int, default: int | None) -> dict[str, Entries]:
    """What one pod interface of this node puts in ENDPOINT_MAPS: its host-side device, a delivery
    entry per address (into the pod: its ifindex and both MACs), its veth entry (source
    validation, segment, conntrack limit ``ct_max``) and its probe targets (``default``: the
    default network's ID). A full pass and an incremental pass (lace.agent.podsync) both take a
    pod's entries from here."""
    out: dict[str, Entries] = {name: {} for name in ENDPOINT_MAPS}
    out["devices"][device_key(ep.ifindex)] = device_value(ep.host_mac, DeviceRole.POD_VETH)
    for ip in ep.ips():
        plen = 32 if ip.version == 4 else 128
        out["delivery"][delivery_key(ep.network, f"{ip}/{plen}")] = DELIVERY.pack(
            kind=DeliveryKind.LOCAL, ifindex=ep.ifindex, mac=mac_bytes(ep.pod_mac),
            host_mac=mac_bytes(ep.host_mac), endpoint_id=ep.endpoint_id)
    out["veth"][veth_key(ep.ifindex)] = endpoint_value(
        endpoint_id=ep.endpoint_id, network=ep.network, segment=ep.segment, mac=ep.pod_mac,
        ipv4=str(ep.ipv4) if ep.ipv4 else None, ipv6=str(ep.ipv6) if ep.ipv6 else None, ct_max=ct_max)
    _probes(ep, default, out["probes"])
    return out


def ct_limit(s: Snapshot, network: int) -> int:
    """The conntrack limit of a local endpoint in ``network``: its Network's conntrackLimit, else the
    agent's --ct-endpoint-limit (0: no limit)."""
    net = next((n for n in s.networks.values() if n.id == network), None)
    return net.ct_limit if net is not None and net.ct_limit is not None else s.config.ct_endpoint_limit


#: at most this many map-full routes (the routing map is shared with every network's prefixes)
OVERFLOW_ROUTES_MAX = 4096


def _service_overflow_routes(s: Snapshot, svc: ServiceProgrammer, out: Entries) -> None:
    """A host route, flagged SERVICE_MAP_FULL, for the address of every frontend the full services
    map left out, in each network it serves: a packet to it then drops as map-full (named, counted,
    traced) instead of being routed on as a plain address. Node-port frontends answer on the node's
    own addresses, which must stay routable, so they get none."""
    pr = svc.pressure
    if pr is None or not pr.left_out_frontends:
        return
    own = {a for a in (s.config.node.underlay4, s.config.node.underlay) if a is not None}
    added = 0
    for f in pr.left_out_frontends:
        if f.addr in own or f.flags & ServiceFlag.NODEPORT:
            continue
        plen = 32 if f.addr.version == 4 else 128
        for net in f.networks:
            key = routing_key(net, f"{f.addr}/{plen}")
            if key in out or added >= OVERFLOW_ROUTES_MAX:
                continue
            out[key] = route_value(net, service_map_full=True)
            added += 1


def _routing(s: Snapshot, out: Entries) -> None:
    """Every network reaches its own CIDRs; its routes add other networks' prefixes or the outside."""
    for net in s.networks.values():
        for cidr in net.cidrs:
            out[routing_key(net.id, str(cidr))] = route_value(net.id)
        for r in net.routes:
            if r.cidrs:
                cidrs = list(r.cidrs)
            elif r.dst_network == NETWORK_OUTSIDE:
                cidrs = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
            else:
                target = next((n for n in s.networks.values() if n.id == r.dst_network), None)
                cidrs = list(target.cidrs) if target else []
            for cidr in cidrs:
                # a network's own CIDRs always stay inside it
                key = routing_key(net.id, str(cidr))
                if key not in out:
                    out[key] = route_value(r.dst_network, masquerade=r.masquerade)


def _delivery(s: Snapshot, out: Entries) -> None:
    """Every other node's blocks to its locator SID for that network; this node's host addresses to
    its stack (local pods: endpoint_entries). The full-length ones go to delivery-exact too
    (desired_maps)."""
    me = s.config.node.name
    for blk in s.blocks:
        if blk.node == me:
            continue
        node = s.nodes.get(blk.node)
        if node is None:
            continue
        out[delivery_key(blk.network, str(blk.cidr))] = DELIVERY.pack(
            kind=DeliveryKind.REMOTE, node_id=node.node_id,
            sid=cfg.sid(str(node.locator), None, blk.network))
    # this node's host addresses go to its stack; other nodes' are inside their blocks (REMOTE)
    default = s.network_id(K.DEFAULT_NETWORK)
    for h in s.host_addresses:
        if h.node == me and default is not None:
            plen = 32 if h.ip.version == 4 else 128
            out[delivery_key(default, f"{h.ip}/{plen}")] = DELIVERY.pack(kind=DeliveryKind.HOST)


def _probes(ep: LocalEndpoint, default: int | None, out: Entries) -> None:
    """The probe targets of a pod of this node (lace.agent.probes). A pod of another network than
    the default one is probed through its probe address of each family: one entry per probe port
    to the pod's own address of that family, and the address's marker (every other port is
    denied). A pod of the default network is probed at its own address, as any host connection to
    it: its entries only show what the kubelet probes."""
    if not ep.probe_ports:
        return
    if ep.network == default:
        pairs = [(ip, ip) for ip in ep.ips()]
    else:
        pairs = [(probe, ip) for probe in ep.probe_ips for ip in ep.ips() if ip.version == probe.version]
    for addr, target in pairs:
        for port in ep.probe_ports:
            out[probe_key(str(addr), port)] = probe_value(
                network=ep.network, endpoint_id=ep.endpoint_id, ifindex=ep.ifindex,
                target_addr=str(target), target_port=port)
        if addr != target:
            out[probe_address_key(str(addr))] = probe_value(
                network=ep.network, endpoint_id=ep.endpoint_id, ifindex=ep.ifindex,
                target_addr=str(target), target_port=0, flags=ProbeFlag.ADDRESS)


def _host_segments(s: Snapshot, out: Entries) -> None:
    """Host addresses resolve to reserved segments: this node's to HOST (local: the host device
    accepts only these as sources), every other node's to REMOTE_NODE."""
    default = s.network_id(K.DEFAULT_NETWORK)
    if default is None:
        return
    me = s.config.node.name
    for h in s.host_addresses:
        mine = h.node == me
        out[segment_key(default, str(h.ip))] = segment_value(
            SEGMENT_HOST if mine else SEGMENT_REMOTE_NODE, local=mine)


def _underlay_peers(s: Snapshot, out: Entries) -> None:
    """Every other node's underlay address and origin SID (its locator with function OUTSIDE, the
    outer source of the NodePort flows it relays) as segment REMOTE_NODE in network OUTSIDE: the
    uplink decapsulates only packets from these (lib/segment.h underlay_peer). Anyone else could
    address a packet to one of this node's SIDs and have it delivered into the network it names."""
    me = s.config.node.name
    for node in s.nodes.values():
        if node.name == me:
            continue
        origin = ipaddress.IPv6Address(cfg.sid(str(node.locator), None, NETWORK_OUTSIDE))
        for addr in (node.underlay, origin):
            out[segment_key(NETWORK_OUTSIDE, str(addr))] = segment_value(SEGMENT_REMOTE_NODE)
