"""From Service and EndpointSlice objects to frontends and backends: plain values, no I/O.

A Service yields one frontend per (cluster IP, port): in the Service's own network and in every
network that imports it. Its backends come from the EndpointSlices labelled with its name, of the
cluster IP's address family, through the slice port whose name (and protocol) match the service
port: an endpoint that is ready and not terminating is *active* (takes new flows); one that is
terminating but still serving is *terminating* (keeps its established flows); anything else is left
out. ``internalTrafficPolicy: Local`` keeps only this node's endpoints.

A NodePort or LoadBalancer Service also has frontends for the outside (source network OUTSIDE):
one per cluster IP family and port at its ``nodePort`` on this node's address of that family
(flag NODEPORT), and a LoadBalancer one per ``status.loadBalancer.ingress[].ip`` at its ``port``
(flag LOADBALANCER). ``externalTrafficPolicy: Local`` gives them this node's endpoints only (flag
LOCAL): a node without one has frontends with no active backend, which refuse new flows. The model
knows the node by name only, so a node-port frontend leaves its address unspecified (``0.0.0.0``
or ``::``); :func:`on_node` puts the node's own addresses there.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Union

from lace.datapath.common import NETWORK_OUTSIDE, Proto
from lace.datapath.services import ServiceFlag
from lace.store import kinds as K

IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

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


def _slice_ports(sl: Mapping) -> list[tuple[str, int, int]]:
    out = []
    for p in sl.get("ports") or ():
        if p.get("port") is None:
            continue
        out.append((p.get("name") or "", PROTOCOLS.get(str(p.get("protocol") or "TCP").upper(), 0), int(p["port"])))
    return out


def _endpoint_state(ep: Mapping) -> str | None:
    """"active", "terminating" or None (left out), from the endpoint's conditions."""
    cond = ep.get("conditions") or {}
    ready, serving, terminating = cond.get("ready"), cond.get("serving"), cond.get("terminating")
    if terminating:
        return "terminating" if (serving if serving is not None else ready) else None
    return "active" if ready is None or ready else None


def backends_of(slices: Iterable[Mapping], network: int, family: int, port_name: str, proto: int,
                node: str | None) -> tuple[tuple[Backend, ...], tuple[Backend, ...]]:
    """(active, terminating) backends of one service port from its slices; ``node`` limits them to
    one node (internalTrafficPolicy / externalTrafficPolicy Local)."""
    active: set[Backend] = set()
    terminating: set[Backend] = set()
    for sl in slices:
        if ADDRESS_TYPES.get(sl.get("addressType", "")) != family:
            continue
        ports = [p for n, pr, p in _slice_ports(sl) if n == port_name and pr == proto]
        if not ports:
            continue
        for ep in sl.get("endpoints") or ():
            state = _endpoint_state(ep)
            if state is None:
                continue
            ep_node = ep.get("nodeName") or ""
            if node is not None and ep_node != node:
                continue
            ref = ep.get("targetRef") or {}
            pod = f'{ref.get("namespace", "")}/{ref.get("name", "")}' if ref.get("name") else ""
            for raw in ep.get("addresses") or ():
                try:
                    addr = ipaddress.ip_address(raw)
                except ValueError:
                    continue
                if addr.version != family:
                    continue
                for port in ports:
                    (active if state == "active" else terminating).add(
                        Backend(network, addr, port, proto, ep_node, pod))
    terminating -= active
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


def frontends(services: Iterable[Mapping], slices: Iterable[Mapping], network_ids: Mapping[str, int],
              imports: Mapping[str, list[int]], node: str) -> list[Frontend]:
    """Every ClusterIP frontend of every service that has an ID and a known network, and the
    node-port and load-balancer frontends of NodePort and LoadBalancer services (see the module
    docstring; node-port addresses unbound)."""
    by_service = slices_by_service(slices)
    out: list[Frontend] = []
    for svc in services:
        sid = service_id(svc)
        net = network_ids.get(K.pod_network(svc))
        if sid is None or net is None:
            continue
        key = K.object_key(svc)
        spec = svc.get("spec") or {}
        flags = 0
        timeout = 0
        if spec.get("sessionAffinity") == "ClientIP":
            flags |= ServiceFlag.AFFINITY
            cfg = ((spec.get("sessionAffinityConfig") or {}).get("clientIP") or {})
            timeout = int(cfg.get("timeoutSeconds") or DEFAULT_AFFINITY_TIMEOUT)
        local = spec.get("internalTrafficPolicy") == "Local"
        external = spec.get("type") in EXTERNAL_TYPES
        ext_local = spec.get("externalTrafficPolicy") == "Local"
        ext_flags = (flags & ServiceFlag.AFFINITY) | (ServiceFlag.LOCAL if ext_local else 0)
        networks = tuple(sorted({net, *imports.get(key, ())}))
        mine = by_service.get(key, [])
        vips = cluster_ips(svc)
        lb_ips = load_balancer_ips(svc) if spec.get("type") == "LoadBalancer" else []
        for p in spec.get("ports") or ():
            proto = PROTOCOLS.get(str(p.get("protocol") or "TCP").upper())
            if proto is None or p.get("port") is None:
                continue
            name = p.get("name") or ""
            port = int(p["port"])
            for vip in vips:
                active, term = backends_of(mine, net, vip.version, name, proto, node if local else None)
                out.append(Frontend(sid, key, name, networks, vip, port, proto,
                                    flags | (ServiceFlag.LOCAL if local else 0), timeout, active, term))
            if not external:
                continue
            node_port = p.get("nodePort")
            for family in sorted({v.version for v in vips}) if node_port else ():
                active, term = backends_of(mine, net, family, name, proto, node if ext_local else None)
                out.append(Frontend(sid, key, name, (NETWORK_OUTSIDE,), NODE_ADDRESS[family], int(node_port),
                                    proto, ext_flags | ServiceFlag.NODEPORT, timeout, active, term))
            for ip in lb_ips:
                active, term = backends_of(mine, net, ip.version, name, proto, node if ext_local else None)
                out.append(Frontend(sid, key, name, (NETWORK_OUTSIDE,), ip, port, proto,
                                    ext_flags | ServiceFlag.LOADBALANCER, timeout, active, term))
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
