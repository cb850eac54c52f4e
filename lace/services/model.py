"""From Service and EndpointSlice objects to frontends and backends: plain values, no I/O.

A Service yields one frontend per (cluster IP, port): in the Service's own network and in every
network that imports it. Its backends come from the EndpointSlices labelled with its name, of the
cluster IP's address family, through the slice port whose name (and protocol) match the service
port: an endpoint that is ready and not terminating is *active* (takes new flows); one that is
terminating but still serving is *terminating* (keeps its established flows); anything else is left
out. When a frontend has no ready endpoint at all, its serving terminating ones are active instead
(kube-proxy's fallback, KEP-1669 ProxyTerminatingEndpoints): a service whose last pods are
draining through their grace period still takes new connections rather than refusing them.
``internalTrafficPolicy: Local`` keeps only this node's endpoints (and falls back among those).

A NodePort or LoadBalancer Service also has frontends for the outside (source network OUTSIDE):
one per cluster IP family and port at its ``nodePort`` on this node's address of that family
(flag NODEPORT), and a LoadBalancer one per ``status.loadBalancer.ingress[].ip`` at its ``port``
(flag LOADBALANCER). ``externalTrafficPolicy: Local`` gives them this node's endpoints only (flag
LOCAL): a node without one has frontends with no active backend, which refuse new flows. The model
knows the node by name only, so a node-port frontend leaves its address unspecified (``0.0.0.0``
or ``::``); :func:`on_node` puts the node's own addresses there.

A backend is in the service's network, except an endpoint that is no pod of it: one whose
EndpointSlice endpoint has no targetRef of kind Pod *and* whose address lies in none of the
network's CIDRs is in network OUTSIDE — the apiserver behind ``default/kubernetes``, or the
addresses of a selector-less service's hand-made slice. The datapath translates a pod's flow to
such a backend and masquerades it out of the node (bpf/lib/masquerade.h). Both halves are asked:
an address in the pod CIDRs is a pod's whatever its slice says (its delivery entry finds it),
and a Pod targetRef outside them is a pod of another kind of network (hostNetwork: the node's
address) that the datapath does not masquerade to. Without the networks' CIDRs (``network_cidrs``
None) no backend is taken for outside.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from lace.datapath.common import NETWORK_OUTSIDE, Proto
from lace.datapath.services import ServiceFlag
from lace.store import kinds as K
from lace.store.records import revision

IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNet = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

#: the label tying an EndpointSlice to its Service (Kubernetes')
SERVICE_NAME_LABEL = K.SERVICE_NAME_LABEL
PROTOCOLS = {"TCP": Proto.TCP, "UDP": Proto.UDP, "SCTP": Proto.SCTP}
ADDRESS_TYPES = {"IPv4": 4, "IPv6": 6}
#: Kubernetes' default sessionAffinityConfig.clientIP.timeoutSeconds
DEFAULT_AFFINITY_TIMEOUT = 10800
#: Service types with node ports (and load-balancer addresses)
EXTERNAL_TYPES = ("NodePort", "LoadBalancer")
#: a node-port frontend's address before on_node: the node's own, which the model does not know
NODE_ADDRESS = {4: ipaddress.IPv4Address("0.0.0.0"), 6: ipaddress.IPv6Address("::")}


@dataclass(frozen=True, order=True)
class Backend:
    """One backend address: where a frontend's flows go, in the backend pod's network."""

    network: int
    addr: IPAddr
    port: int
    proto: int
    node: str = ""
    pod: str = ""   # namespace/name, from the endpoint's targetRef

    @property
    def identity(self) -> str:
        """Stable across nodes, restarts and IDs: what Maglev hashes, so every node builds the
        same table for the same backends."""
        return f"{self.network}/{self.addr}/{self.port}/{self.proto}"


@dataclass(frozen=True)
class Frontend:
    """A VIP, port and protocol in the source networks it serves, with its backends. A node-port
    frontend (NODEPORT set) has ``NODE_ADDRESS`` of its family until :func:`on_node` binds it."""

    service_id: int
    service: str            # namespace/name
    port_name: str
    networks: tuple[int, ...]
    addr: IPAddr
    port: int
    proto: int
    flags: int              # ServiceFlag bits
    affinity_timeout: int   # seconds; 0 without ClientIP affinity
    active: tuple[Backend, ...]
    terminating: tuple[Backend, ...] = ()


def service_id(svc: Mapping) -> int | None:
    """The cluster-wide service ID (the datapath's reverse-NAT and affinity key), or None before
    the store gave it one."""
    ann = (svc.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(K.SERVICE_ID_ANNOTATION) or (svc.get("status") or {}).get("id")
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def is_headless(svc: Mapping) -> bool:
    """Whether the service is headless (clusterIP None): no VIP, its names resolve to its pods."""
    spec = svc.get("spec") or {}
    return (spec.get("clusterIPs") or [spec.get("clusterIP")])[:1] == ["None"]


def slices_by_service(slices: Iterable[Mapping]) -> dict[str, list[Mapping]]:
    """``namespace/name`` of a service -> its EndpointSlices (by the kubernetes.io/service-name label)."""
    out: dict[str, list[Mapping]] = {}
    for sl in slices:
        key = K.service_of(sl)
        if key:
            out.setdefault(key, []).append(sl)
    return out


def cluster_ips(svc: Mapping) -> list[IPAddr]:
    """The service's cluster IPs (none for a headless service)."""
    spec = svc.get("spec") or {}
    raw = list(spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else []))
    out = []
    for ip in raw:
        if ip in ("", "None"):
            continue
        try:
            out.append(ipaddress.ip_address(ip))
        except ValueError:
            continue
    return out


def imports_by_service(networks: Iterable[Mapping], ids: Mapping[str, int]) -> dict[str, list[int]]:
    """``namespace/name`` of a service -> the IDs of the other networks that import it."""
    out: dict[str, list[int]] = {}
    for n in networks:
        net_id = ids.get((n.get("metadata") or {}).get("name", ""))
        if net_id is None:
            continue
        for ref in (n.get("spec") or {}).get("importServices") or ():
            out.setdefault(str(ref), []).append(net_id)
    return out


ACTIVE, TERMINATING = "active", "terminating"


def _endpoint_state(ep: Mapping) -> str | None:
    """ACTIVE, TERMINATING or None (left out), from the endpoint's conditions."""
    cond = ep.get("conditions") or {}
    ready, serving, terminating = cond.get("ready"), cond.get("serving"), cond.get("terminating")
    if terminating:
        return TERMINATING if (serving if serving is not None else ready) else None
    return ACTIVE if ready is None or ready else None


def _addresses(raw: Iterable) -> tuple[IPAddr, ...]:
    out = []
    for a in raw or ():
        try:
            out.append(ipaddress.ip_address(a))
        except ValueError:
            continue
    return tuple(out)


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """One endpoint of a slice that takes part (ACTIVE or TERMINATING), its addresses parsed."""

    state: str
    node: str
    pod: str   # namespace/name, from a targetRef of kind Pod ("" without one)
    addresses: tuple[IPAddr, ...]


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """What frontends read of an EndpointSlice: its service, address family, ports and the
    endpoints that take part. The agent keeps these instead of the stored objects (as it does pods'
    and leases', lace.store.records)."""

    namespace: str
    name: str
    service: str | None        # namespace/name, from the kubernetes.io/service-name label
    family: int | None         # 4 or 6 from addressType (None: another type)
    ports: tuple[tuple[str, int, int], ...]   # (name, protocol number, port)
    endpoints: tuple[EndpointRecord, ...]
    rv: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, sl: Mapping) -> SliceRecord:
        meta = sl.get("metadata") or {}
        ports = tuple((sys.intern(p.get("name") or ""), PROTOCOLS.get(str(p.get("protocol") or "TCP").upper(), 0),
                       int(p["port"])) for p in sl.get("ports") or () if p.get("port") is not None)
        endpoints = []
        for ep in sl.get("endpoints") or ():
            state = _endpoint_state(ep)
            if state is None:
                continue
            ref = ep.get("targetRef") or {}
            # only a Pod reference names a pod: a Node's or anything else's would make an
            # outside address look like a pod's (outside_backend)
            pod = (f'{ref.get("namespace", "")}/{ref.get("name", "")}'
                   if ref.get("name") and ref.get("kind") == "Pod" else "")
            endpoints.append(EndpointRecord(state, sys.intern(ep.get("nodeName") or ""), pod,
                                            _addresses(ep.get("addresses"))))
        return cls(sys.intern(meta.get("namespace", "")), meta.get("name", ""), K.service_of(sl),
                   ADDRESS_TYPES.get(sl.get("addressType", "")), ports, tuple(endpoints), revision(sl))


@dataclass(frozen=True, slots=True)
class ServicePort:
    """A service port lace programs (a known protocol and a port number)."""

    name: str
    proto: int
    port: int
    node_port: int | None


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    """What frontends read of a Service (see :class:`SliceRecord`)."""

    namespace: str
    name: str
    id: int | None             # service_id
    network: str               # the network it lives in (lace.store.kinds.pod_network)
    type: str
    affinity_timeout: int      # seconds with ClientIP affinity, else 0
    local: bool                # internalTrafficPolicy: Local
    ext_local: bool            # externalTrafficPolicy: Local
    cluster_ips: tuple[IPAddr, ...]
    lb_ips: tuple[IPAddr, ...]   # a LoadBalancer's status addresses
    ports: tuple[ServicePort, ...]
    rv: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, svc: Mapping) -> ServiceRecord:
        meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
        timeout = 0
        if spec.get("sessionAffinity") == "ClientIP":
            cfg = ((spec.get("sessionAffinityConfig") or {}).get("clientIP") or {})
            timeout = int(cfg.get("timeoutSeconds") or DEFAULT_AFFINITY_TIMEOUT)
        ports = []
        for p in spec.get("ports") or ():
            proto = PROTOCOLS.get(str(p.get("protocol") or "TCP").upper())
            if proto is None or p.get("port") is None:
                continue
            node_port = p.get("nodePort")
            ports.append(ServicePort(sys.intern(p.get("name") or ""), proto, int(p["port"]),
                                     int(node_port) if node_port else None))
        kind = str(spec.get("type") or "ClusterIP")
        return cls(sys.intern(meta.get("namespace", "")), meta.get("name", ""), service_id(svc), sys.intern(K.pod_network(svc)),
                   sys.intern(kind), timeout, spec.get("internalTrafficPolicy") == "Local",
                   spec.get("externalTrafficPolicy") == "Local", tuple(cluster_ips(svc)),
                   tuple(load_balancer_ips(svc)) if kind == "LoadBalancer" else (), tuple(ports), revision(svc))


def outside_backend(ep: EndpointRecord, addr: IPAddr, cidrs: Sequence[IPNet] | None) -> bool:
    """Whether ``addr`` of endpoint ``ep`` is no pod of the network whose CIDRs are ``cidrs``: no
    Pod targetRef and in none of them (the module docstring). None: the CIDRs are not known, and
    nothing is taken for outside."""
    if ep.pod or cidrs is None:
        return False
    return not any(addr in c for c in cidrs if c.version == addr.version)


def backends_of(slices: Iterable[SliceRecord], network: int, family: int, port_name: str, proto: int,
                node: str | None, cidrs: Sequence[IPNet] | None = None
                ) -> tuple[tuple[Backend, ...], tuple[Backend, ...]]:
    """(active, terminating) backends of one service port from its slices; ``node`` limits them to
    one node (internalTrafficPolicy / externalTrafficPolicy Local). Without a ready endpoint the
    serving terminating ones are the active backends (the fallback in the module docstring).
    ``cidrs``: the CIDRs of ``network``; an endpoint outside them that is no pod gets network
    OUTSIDE (:func:`outside_backend`)."""
    active: set[Backend] = set()
    terminating: set[Backend] = set()
    for sl in slices:
        if sl.family != family:
            continue
        ports = [p for n, pr, p in sl.ports if n == port_name and pr == proto]
        if not ports:
            continue
        for ep in sl.endpoints:
            if node is not None and ep.node != node:
                continue
            into = active if ep.state == ACTIVE else terminating
            for addr in ep.addresses:
                if addr.version != family:
                    continue
                net = NETWORK_OUTSIDE if outside_backend(ep, addr, cidrs) else network
                for port in ports:
                    into.add(Backend(net, addr, port, proto, ep.node, ep.pod))
    terminating -= active
    if not active:
        return tuple(sorted(terminating)), ()
    return tuple(sorted(active)), tuple(sorted(terminating))


def load_balancer_ips(svc: Mapping) -> list[IPAddr]:
    """The addresses status.loadBalancer.ingress gives a LoadBalancer service (hostnames ignored)."""
    out = []
    for ing in (((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or ()):
        try:
            out.append(ipaddress.ip_address(ing.get("ip") or ""))
        except ValueError:
            continue
    return out


def frontends(services: Iterable[Mapping | ServiceRecord], slices: Iterable[Mapping | SliceRecord],
              network_ids: Mapping[str, int], imports: Mapping[str, list[int]], node: str,
              network_cidrs: Mapping[int, Sequence[IPNet]] | None = None) -> list[Frontend]:
    """Every ClusterIP frontend of every service that has an ID and a known network, and the
    node-port and load-balancer frontends of NodePort and LoadBalancer services (see the module
    docstring; node-port addresses unbound). Services and slices are stored objects or their
    records. ``network_cidrs``: network ID -> its CIDRs, which tell a pod's address from an
    outside backend's (None: every backend is in its service's network)."""
    by_service: dict[str, list[SliceRecord]] = {}
    for sl in slices:
        rec = sl if isinstance(sl, SliceRecord) else SliceRecord.of(sl)
        if rec.service:
            by_service.setdefault(rec.service, []).append(rec)
    out: list[Frontend] = []
    for raw in services:
        svc = raw if isinstance(raw, ServiceRecord) else ServiceRecord.of(raw)
        net = network_ids.get(svc.network)
        if svc.id is None or net is None:
            continue
        key = svc.key
        flags = ServiceFlag.AFFINITY if svc.affinity_timeout else 0
        external = svc.type in EXTERNAL_TYPES
        ext_flags = flags | (ServiceFlag.LOCAL if svc.ext_local else 0)
        networks = tuple(sorted({net, *imports.get(key, ())}))
        mine = by_service.get(key, [])
        known = None if network_cidrs is None else network_cidrs.get(net)
        cidrs = None if known is None else tuple(known)
        vips = svc.cluster_ips
        for p in svc.ports:
            name, port, proto = p.name, p.port, p.proto
            for vip in vips:
                active, term = backends_of(mine, net, vip.version, name, proto, node if svc.local else None,
                                           cidrs)
                out.append(Frontend(svc.id, key, name, networks, vip, port, proto,
                                    flags | (ServiceFlag.LOCAL if svc.local else 0), svc.affinity_timeout,
                                    active, term))
            if not external:
                continue
            for family in sorted({v.version for v in vips}) if p.node_port else ():
                active, term = backends_of(mine, net, family, name, proto, node if svc.ext_local else None,
                                           cidrs)
                out.append(Frontend(svc.id, key, name, (NETWORK_OUTSIDE,), NODE_ADDRESS[family], p.node_port,
                                    proto, ext_flags | ServiceFlag.NODEPORT, svc.affinity_timeout, active, term))
            for ip in svc.lb_ips:
                active, term = backends_of(mine, net, ip.version, name, proto, node if svc.ext_local else None,
                                           cidrs)
                out.append(Frontend(svc.id, key, name, (NETWORK_OUTSIDE,), ip, port, proto,
                                    ext_flags | ServiceFlag.LOADBALANCER, svc.affinity_timeout, active, term))
    return out


def on_node(fronts: Iterable[Frontend], addr4: IPAddr | None, addr6: IPAddr | None) -> list[Frontend]:
    """``fronts`` with every node-port frontend at this node's address of its family (``addr4``,
    ``addr6``; None: the node has none, and such frontends are left out)."""
    mine = {4: addr4, 6: addr6}
    out = []
    for f in fronts:
        if f.flags & ServiceFlag.NODEPORT and f.addr == NODE_ADDRESS[f.addr.version]:
            addr = mine[f.addr.version]
            if addr is None:
                continue
            f = dataclasses.replace(f, addr=addr)
        out.append(f)
    return out
