"""Plain inputs of policy resolution (namespaces, pods, policies, CIDR segment IDs): no I/O, no store.

The resolver, the semantic evaluator and ``lace policy trace`` all read these values; building them
from a store is ``lace.policy.sources``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from lace.store import kinds as K
from lace.store.records import PROTO_NUMBERS, ContainerPort

if TYPE_CHECKING:   # lace.policy.parse reads this module's names
    from .parse import ParsedPolicy

IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNet = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Labels = tuple[tuple[str, str], ...]

#: annotation on a NetworkPolicy or a Namespace: report would-be drops as AUDIT, let traffic pass
ANN_AUDIT = K.AUDIT_ANNOTATION

PROTO_NAMES = {v: k for k, v in PROTO_NUMBERS.items()}


def labels_tuple(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


@dataclass(frozen=True)
class NamespaceInfo:
    """A Namespace: its labels and whether it is in audit mode."""

    name: str
    labels: Labels = ()
    audit: bool = False


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A pod with an address: identity (segment), where it runs and what it serves."""

    namespace: str
    name: str
    labels: Labels
    network: str
    network_id: int
    segment: int
    ips: tuple[IPAddr, ...]
    node: str
    ports: tuple[ContainerPort, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def named_ports(self, name: str, proto: int) -> set[int]:
        return {p.port for p in self.ports if p.name == name and p.proto == proto}


@dataclass
class PolicyInputs:
    """Everything resolution reads. ``policies`` are the NetworkPolicies parsed
    (``lace.policy.parse.ParsedPolicy``); ``cidr_segments`` maps each ipBlock CIDR (normalised
    string) to its allocated segment ID."""

    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    pods: list[PodInfo] = field(default_factory=list)
    policies: list[ParsedPolicy] = field(default_factory=list)
    cidr_segments: dict[str, int] = field(default_factory=dict)
    network_ids: tuple[int, ...] = (1,)
