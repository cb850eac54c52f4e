"""The agent's view of the cluster: plain values parsed from store objects, no I/O.

Everything the desired-state computation needs is here, so that it stays a pure function that
unit tests can drive without a kernel or a store.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Iterable, Union

from lace.datapath.common import NETWORK_OUTSIDE
from lace.datapath.conntrack import CT_ENDPOINT_DEFAULT
from lace.datapath.segment import segment_key
from lace.store import kinds as K

IPNet = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

#: the pod's gateway: link-local, answered by a permanent neighbour entry (no ARP/ND needed)
GATEWAY4 = ipaddress.IPv4Address("169.254.1.1")
GATEWAY6 = ipaddress.IPv6Address("fe80::1")

#: annotations on Node objects (the lab and a real cluster's node agent set them)
ANN_LOCATOR = K.LOCATOR_ANNOTATION
ANN_UNDERLAY = K.UNDERLAY_ANNOTATION
ANN_NODE_ID = K.NODE_ID_ANNOTATION
#: annotations on IPLease objects recording the endpoint an agent made
ANN_HOST_IFNAME = K.HOST_IFNAME_ANNOTATION
ANN_POD_MAC = K.POD_MAC_ANNOTATION

#: the IPLease of a node's host address (lace.agent.hostdev) holds this spec.containerID: a colon
#: never occurs in a CNI container ID, so no runtime's ADD or DEL can name it (and CNI GC, which
#: releases the leases of containers the runtime does not list, must skip it: is_host_lease)
HOST_CONTAINER_ID = "lace:host"


def host_lease_pod(node: str) -> str:
    """The pseudo-pod a node's host address is leased to (``lace get ipleases`` shows it)."""
    return f"node/{node}"


def is_host_lease(spec: dict) -> bool:
    """Whether an IPLease spec records a node's host address rather than a pod's."""
    return is_host_container(str(spec.get("containerID") or ""))


def is_host_container(container_id: str) -> bool:
    """Whether an IPLease's containerID is a node's host address's (is_host_lease)."""
    return container_id == HOST_CONTAINER_ID


#: the IPLease of a pod's probe address (an address of the default network that the node's kubelet
#: probes a pod of another network through, see lace.agent.probes) holds this prefix before the pod's
#: container ID: the pod's own leases and its probe leases are released together, and no CNI call
#: can name a probe lease by itself
PROBE_CONTAINER_PREFIX = "lace:probe:"


def probe_container_id(container_id: str) -> str:
    """The containerID of a container's probe-address leases."""
    return PROBE_CONTAINER_PREFIX + container_id


#: the pseudo-pod a pod's probe-address leases are leased to: ``probe/<namespace>/<name>`` (no pod
#: has that name, so nothing takes such an address for a pod's own)
PROBE_POD_PREFIX = "probe/"


def probe_pod(pod: str) -> str:
    """The pseudo-pod of pod ``namespace/name``'s probe-address leases."""
    return PROBE_POD_PREFIX + pod


def probe_pod_owner(name: str) -> str | None:
    """The pod (``namespace/name``) a probe-address lease's pseudo-pod stands for, None if it is
    not one."""
    return name[len(PROBE_POD_PREFIX):] if name.startswith(PROBE_POD_PREFIX) else None


def lease_pod(pod: str, container_id: str) -> str | None:
    """The pod an IPLease (its ``pod`` and ``containerID``) counts for: its own, or for a probe
    address the pod it stands for; None for a node's host address (no pod's) or a probe lease
    that names no pseudo-pod."""
    if is_host_container(container_id):
        return None
    return probe_pod_owner(pod) if is_probe_container(container_id) else pod


def is_probe_lease(spec: dict) -> bool:
    """Whether an IPLease spec records a pod's probe address rather than one of its own."""
    return is_probe_container(str(spec.get("containerID") or ""))


def is_probe_container(container_id: str) -> bool:
    """Whether an IPLease's containerID is a probe address's (is_probe_lease)."""
    return container_id.startswith(PROBE_CONTAINER_PREFIX)


def lease_container(spec: dict) -> str:
    """The container an IPLease belongs to (a probe lease's pod container)."""
    return pod_container(str(spec.get("containerID") or ""))


def is_pod_container(container_id: str) -> bool:
    """Whether an IPLease's containerID is a pod's own address's: neither a node's host address
    (is_host_container) nor a probe address (is_probe_container)."""
    return not is_host_container(container_id) and not is_probe_container(container_id)


def pod_container(container_id: str) -> str:
    """The pod container an IPLease's containerID names (a probe lease's without its prefix)."""
    return container_id[len(PROBE_CONTAINER_PREFIX):] if is_probe_container(container_id) else container_id


@dataclass(frozen=True)
class Route:
    """A Network route: destination network ID (or NETWORK_OUTSIDE), prefixes, masquerade."""

    dst_network: int
    cidrs: tuple[IPNet, ...]
    masquerade: bool = False


@dataclass(frozen=True)
class Network:
    name: str
    id: int
    cidrs: tuple[IPNet, ...]
    routes: tuple[Route, ...] = ()
    #: spec.conntrackLimit: the most conntrack flows one of its pods may hold per table (0: no
    #: limit; None: the agent's --ct-endpoint-limit)
    ct_limit: int | None = None


@dataclass(frozen=True)
class Node:
    name: str
    node_id: int
    underlay: ipaddress.IPv6Address
    locator: ipaddress.IPv6Network
    #: the node's IPv4 address (IPv4 masquerade source, IPv4 NodePort frontend), if it has one
    underlay4: ipaddress.IPv4Address | None = None


@dataclass(frozen=True)
class Block:
    """A per-node block of a network CIDR (IPBlock)."""

    network: int
    node: str
    cidr: IPNet


@dataclass(frozen=True, slots=True)
class PodAddress:
    """One pod address anywhere in the cluster with its segment (for segment / delivery maps)."""

    network: int
    ip: IPAddr
    segment: int
    node: str
    pod: str  # namespace/name
    #: its ``segment`` map key, packed once: the agent keeps each address across passes while its
    #: lease stays the same, so a full pass at 10k pods does not pack 20k keys again
    key: bytes = field(default=b"", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", segment_key(self.network, self.ip))


@dataclass(frozen=True)
class LocalEndpoint:
    """A pod interface on this node as the datapath needs it."""

    endpoint_id: int
    pod: str
    container_id: str
    network: int
    segment: int
    ifindex: int
    host_ifname: str
    host_mac: str
    pod_mac: str
    ipv4: ipaddress.IPv4Address | None
    ipv6: ipaddress.IPv6Address | None
    #: the TCP ports the node's kubelet probes (lace.probes.pod_probe_ports)
    probe_ports: tuple[int, ...] = ()
    #: the pod's probe addresses (default network; only for pods of other networks)
    probe_ips: tuple[IPAddr, ...] = ()

    def ips(self) -> list[IPAddr]:
        return [ip for ip in (self.ipv4, self.ipv6) if ip is not None]


@dataclass(frozen=True)
class HostAddress:
    """A node's host address: in the default network, from that node's own block; this node's
    sources its host traffic into pods from it, every node routes it like a pod address."""

    node: str
    ip: IPAddr


@dataclass(frozen=True)
class HostLink:
    """The datapath end of this node's host device (lace_net) as the kernel shows it."""

    ifindex: int
    mac: str


@dataclass(frozen=True)
class NodeConfig:
    """This node: identity, uplink and pod MTU."""

    node: Node
    uplink_ifindex: int
    uplink_mac: str
    mtu: int
    #: the kubelet's cgroup ID (0: any process of the host cgroup may probe)
    kubelet_cgroup: int = 0
    #: the conntrack limit of a local endpoint whose Network sets none (--ct-endpoint-limit; 0: none)
    ct_endpoint_limit: int = CT_ENDPOINT_DEFAULT


@dataclass
class Snapshot:
    """Everything desired-state computation reads."""

    config: NodeConfig
    networks: dict[str, Network] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    pods: list[PodAddress] = field(default_factory=list)
    endpoints: list[LocalEndpoint] = field(default_factory=list)
    #: lace.policy.PolicyInputs (namespaces, pod labels and ports, policies); None: no policy maps
    policy: Any = None
    #: lace.services.model.Frontend: every service frontend this node serves
    frontends: list[Any] = field(default_factory=list)
    #: every node's host addresses (this node's included)
    host_addresses: list[HostAddress] = field(default_factory=list)
    #: this node's host device, None until the agent has made it
    host_link: HostLink | None = None

    def network_id(self, name: str) -> int | None:
        n = self.networks.get(name)
        return n.id if n else None


def parse_network(obj: dict, by_name: dict[str, int]) -> Network | None:
    """A Network object (its routes resolved through ``by_name``); None before it has an ID."""
    status = obj.get("status") or {}
    if "id" not in status:
        return None
    spec = obj.get("spec") or {}
    routes = []
    for r in spec.get("routes") or []:
        to = r.get("to")
        dst = NETWORK_OUTSIDE if to == "outside" else by_name.get(to)
        if dst is None:
            continue
        cidrs = tuple(ipaddress.ip_network(c) for c in r.get("cidrs") or ())
        routes.append(Route(dst, cidrs, bool(r.get("masquerade"))))
    limit = spec.get("conntrackLimit")
    return Network(obj["metadata"]["name"], int(status["id"]),
                   tuple(ipaddress.ip_network(c) for c in spec.get("cidrs") or ()), tuple(routes),
                   int(limit) if limit is not None else None)


def parse_node(obj: dict) -> Node | None:
    """A Node with its lace annotations; None when it has not registered them yet."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    v4 = None
    for a in (obj.get("status") or {}).get("addresses") or ():
        if a.get("type") == "InternalIP" and "." in str(a.get("address", "")):
            try:
                v4 = ipaddress.IPv4Address(a["address"])
            except ValueError:
                continue
            break
    try:
        return Node(obj["metadata"]["name"], int(ann[ANN_NODE_ID]),
                    ipaddress.IPv6Address(ann[ANN_UNDERLAY]), ipaddress.IPv6Network(ann[ANN_LOCATOR]), v4)
    except (KeyError, ValueError):
        return None


def by_name(networks: Iterable[dict]) -> dict[str, int]:
    out = {}
    for n in networks:
        sid = (n.get("status") or {}).get("id")
        if sid is not None:
            out[n["metadata"]["name"]] = int(sid)
    return out
