"""The kinds the store serves: apiVersion, scope and every name kubectl accepts for each.

Kubernetes kinds mirror Kubernetes (Namespace, Pod, Node, Service, NetworkPolicy, EndpointSlice,
ServiceCIDR); ``lace.dev/v1alpha1`` kinds are lace's own: ``Network`` and ``LoadBalancerIPPool``
are written by users, ``Segment``, ``IPBlock``, ``IPLease`` and ``ServiceAllocation`` are
allocations the store and the node agents make.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from lace.store.errors import UnknownKind

LACE_API_VERSION = "lace.dev/v1alpha1"
DISCOVERY_API_VERSION = "discovery.k8s.io/v1"
NETWORKING_API_VERSION = "networking.k8s.io/v1"

# -- the label and annotation keys lace reads and writes, in one place --------------------------
#: on a Pod or Service: the network it belongs to (absent: ``default``)
NETWORK_ANNOTATION = "lace.dev/network"
#: on a NetworkPolicy or a Namespace: report would-be drops as AUDIT and let the traffic pass
AUDIT_ANNOTATION = "lace.dev/audit"
#: on a Node (set by the lab, or a real cluster's node agent): its locator, underlay address, ID
LOCATOR_ANNOTATION = "lace.dev/locator"
UNDERLAY_ANNOTATION = "lace.dev/underlay"
NODE_ID_ANNOTATION = "lace.dev/node-id"
#: on an IPLease: the endpoint the agent made for it (host-side interface, pod MAC)
HOST_IFNAME_ANNOTATION = "lace.dev/host-ifname"
POD_MAC_ANNOTATION = "lace.dev/mac"
#: on a Service or a NetworkPolicy: an ID given by hand (else the store's status.id)
SERVICE_ID_ANNOTATION = "lace.dev/service-id"
POLICY_ID_ANNOTATION = "lace.dev/policy-id"
#: labels on IPBlock (and IPLease) objects: the node and network they belong to
NODE_LABEL = "lace.dev/node"
NETWORK_LABEL = "lace.dev/network"
#: label on the Node objects a lab registers: the lab's name
LAB_LABEL = "lace.dev/lab"
#: label of the segment identity of an ipBlock CIDR (lace.policy.ids)
CIDR_LABEL = "lace.dev/cidr"
#: on an EndpointSlice (Kubernetes'): the Service it belongs to, and who maintains it
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
#: the MANAGED_BY_LABEL value of the slices lace's EndpointSlice controller writes
ENDPOINTSLICE_CONTROLLER = "endpointslice-controller.lace.dev"

DEFAULT_NETWORK = "default"
DEFAULT_NETWORK_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")
DEFAULT_NETWORK_ID = 1
FIRST_NETWORK_ID = 2
MAX_NETWORK_ID = 0xFFFFFFFE  # 0xffffffff is LACE_NETWORK_OUTSIDE in the ABI
FIRST_SEGMENT_ID = 256  # LACE_SEGMENT_FIRST_ALLOCATED; below are reserved segments
MAX_SEGMENT_ID = 0xFFFFFFFE  # 0xffffffff is LACE_SEGMENT_SELECTED
ALWAYS_NAMESPACES = ("default", "kube-system")
ROUTE_OUTSIDE = "outside"
#: the ServiceCIDR every cluster has (Kubernetes names its default one "kubernetes" too): the
#: ClusterIP ranges of every network that names no spec.serviceCIDRs of its own
DEFAULT_SERVICE_CIDR = "kubernetes"
DEFAULT_SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/112")
#: where NodePorts come from (kube-apiserver's default --service-node-port-range)
NODE_PORT_RANGE = (30000, 32767)
FIRST_SERVICE_ID = 1
MAX_SERVICE_ID = 0xFFFFFFFE
#: Kubernetes' default terminationGracePeriodSeconds of a Pod
DEFAULT_GRACE_PERIOD = 30


@dataclasses.dataclass(frozen=True)
class KindInfo:
    """One kind: its apiVersion, plural/singular/short names and whether objects live in a namespace."""

    kind: str
    api_version: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    namespaced: bool

    @property
    def group(self) -> str:
        """API group ("" for core), as in ``networkpolicy.networking.k8s.io``."""
        return self.api_version.rpartition("/")[0]

    @property
    def qualified_singular(self) -> str:
        """``pod``, ``network.lace.dev`` — how kubectl names the kind in ``kind/name`` output."""
        return f"{self.singular}.{self.group}" if self.group else self.singular

    @property
    def qualified_plural(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def names(self) -> set[str]:
        """Every spelling that resolves to this kind (case-insensitive)."""
        out = {self.kind.lower(), self.plural, self.singular, *self.short_names}
        out |= {self.qualified_singular, self.qualified_plural}
        return out


# In dependency order: a batch writes the ranges before the services allocating from them, a
# Service before the EndpointSlices of its pods.
KINDS: tuple[KindInfo, ...] = (
    KindInfo("Namespace", "v1", "namespaces", "namespace", ("ns",), False),
    KindInfo("Node", "v1", "nodes", "node", ("no",), False),
    KindInfo("ServiceCIDR", NETWORKING_API_VERSION, "servicecidrs", "servicecidr", (), False),
    KindInfo("LoadBalancerIPPool", LACE_API_VERSION, "loadbalancerippools", "loadbalancerippool",
             ("lbpool",), False),
    KindInfo("Network", LACE_API_VERSION, "networks", "network", ("net",), False),
    KindInfo("Service", "v1", "services", "service", ("svc",), True),
    KindInfo("NetworkPolicy", NETWORKING_API_VERSION, "networkpolicies", "networkpolicy", ("netpol",), True),
    KindInfo("Pod", "v1", "pods", "pod", ("po",), True),
    KindInfo("EndpointSlice", DISCOVERY_API_VERSION, "endpointslices", "endpointslice", (), True),
    KindInfo("Segment", LACE_API_VERSION, "segments", "segment", ("seg",), False),
    KindInfo("IPBlock", LACE_API_VERSION, "ipblocks", "ipblock", (), False),
    KindInfo("IPLease", LACE_API_VERSION, "ipleases", "iplease", (), False),
    KindInfo("ServiceAllocation", LACE_API_VERSION, "serviceallocations", "serviceallocation", (), False),
)

BY_KIND: dict[str, KindInfo] = {k.kind: k for k in KINDS}
_BY_NAME: dict[str, KindInfo] = {name: k for k in KINDS for name in k.names()}

# Order in which a batch is written (dependencies first) and, reversed, deleted.
APPLY_ORDER: dict[str, int] = {k.kind: i for i, k in enumerate(KINDS)}


def resolve_kind(name: str) -> KindInfo:
    """Resolve ``pods``/``pod``/``po``/``Pod``/``network.lace.dev`` to its KindInfo, or raise UnknownKind."""
    info = _BY_NAME.get(name.strip().lower())
    if info is None:
        raise UnknownKind(
            f'the store has no resource type "{name}"',
            hint="known types: " + ", ".join(k.plural for k in KINDS),
        )
    return info


def kind_info(kind: str) -> KindInfo:
    """The KindInfo of an exact ``kind`` field value (``Pod``), or raise UnknownKind."""
    info = BY_KIND.get(kind)
    if info is None:
        raise UnknownKind(
            f'unknown kind "{kind}"', hint="known kinds: " + ", ".join(k.kind for k in KINDS)
        )
    return info


def container_port(containers: Any, port: Any, protocol: str = "TCP") -> int | None:
    """A port as a Service's targetPort or a probe names it: a number (1..65535) as is, or the name
    of one of ``containers``' ports of ``protocol``, resolved to its containerPort; None when no
    container has it. Service endpoints and kubelet probes resolve names this one way."""
    if isinstance(port, int) and not isinstance(port, bool):
        return port if 0 < port < 65536 else None
    text = str(port)
    if text.isdigit():
        n = int(text)
        return n if 0 < n < 65536 else None
    for container in containers or ():
        for p in container.get("ports") or ():
            if p.get("name") == text and (p.get("protocol") or "TCP").upper() == protocol.upper():
                try:
                    return int(p["containerPort"])
                except (KeyError, TypeError, ValueError):
                    return None
    return None


def pod_network(pod: dict) -> str:
    """The primary network a Pod (or Service) asks for: annotation lace.dev/network, else default."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(NETWORK_ANNOTATION) or DEFAULT_NETWORK


def object_key(obj: dict) -> str:
    """``namespace/name`` of a namespaced object (how Network.spec.importServices names a Service)."""
    meta = obj.get("metadata") or {}
    return f'{meta.get("namespace", "")}/{meta.get("name", "")}'


def service_of(endpoint_slice: dict) -> str | None:
    """``namespace/name`` of the Service an EndpointSlice belongs to (its service-name label), or None."""
    meta = endpoint_slice.get("metadata") or {}
    name = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return f'{meta.get("namespace", "")}/{name}' if name else None


def segment_name(network: str, namespace: str, labels: dict[str, str]) -> str:
    """The deterministic Segment object name for an identity (network, namespace, labels)."""
    import hashlib  # here, not at the top: it loads OpenSSL, and most importers never name a segment

    canon = "\n".join([network, namespace, *(f"{k}={v}" for k, v in sorted(labels.items()))])
    return f"{network}-{hashlib.sha256(canon.encode()).hexdigest()[:16]}"


def _dashed(text: str) -> str:
    return text.replace(":", "-").replace("/", "-").replace(".", "-").strip("-").lower()


def block_name(network: str, cidr: str) -> str:
    """IPBlock object name: ``default-10-244-1-0-24``."""
    return f"{network}-{_dashed(str(ipaddress.ip_network(cidr)))}"


def lease_name(network: str, ip: str) -> str:
    """IPLease object name: one lease per (network, address), so a duplicate create conflicts."""
    return f"{network}-{_dashed(ipaddress.ip_address(ip).exploded if ':' in ip else ip)}"


def lease_prefix(network: str, cidr: str) -> str:
    """The name prefix every IPLease of an address in ``cidr`` shares in ``network``: the whole
    octets (IPv4) or 16-bit groups (IPv6) of the block's address, as ``lease_name`` spells them
    (``default-10-244-1-`` for 10.244.1.0/24). A block not on such a boundary gets its boundary's
    prefix, which other addresses share too: filter what it lists by address."""
    block = ipaddress.ip_network(cidr)
    if block.version == 4:
        parts, bits = str(block.network_address).split("."), 8
    else:
        parts, bits = block.network_address.exploded.split(":"), 16
    whole = block.prefixlen // bits
    if whole == len(parts):
        return lease_name(network, str(block.network_address))   # one address: its own name
    return "-".join([network, *parts[:whole], ""])


def _dashed_ip(ip: str) -> str:
    addr = ipaddress.ip_address(ip)
    return _dashed(addr.exploded if addr.version == 6 else str(addr))


# ServiceAllocation names: one object per held resource, so a second holder's create conflicts.
# Network names are DNS labels (no dots), so "<network>." can never be read two ways.

def cluster_ip_allocation(network: str, ip: str) -> str:
    """``clusterip.default.10-96-0-10``: a ClusterIP, unique within its network."""
    return f"clusterip.{network}.{_dashed_ip(ip)}"


def node_port_allocation(port: int) -> str:
    """``nodeport.30080``: a NodePort, unique in the cluster (whatever the protocol)."""
    return f"nodeport.{port}"


def load_balancer_allocation(ip: str) -> str:
    """``loadbalancer.198-18-100-1``: a LoadBalancer address, unique in the cluster."""
    return f"loadbalancer.{_dashed_ip(ip)}"


def service_id_allocation(service_id: int) -> str:
    """``serviceid.17``: a service ID, unique in the cluster."""
    return f"serviceid.{service_id}"
