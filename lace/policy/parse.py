"""A NetworkPolicy object (networking.k8s.io/v1) as plain rules, with Kubernetes' defaulting.

- ``policyTypes`` absent: Ingress always, plus Egress when ``spec.egress`` has at least one rule.
- A direction in ``policyTypes`` with no rules denies everything in that direction.
- ``from``/``to`` absent or empty: any peer; ``ports`` absent or empty: every protocol and port.
- A port entry without ``protocol`` is TCP; without ``port`` it is every port of the protocol.
- A peer with only ``podSelector`` selects pods of the policy's namespace; with only
  ``namespaceSelector`` every pod of the selected namespaces; with both, pods matching both (AND).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lace.store.records import revision

from .ids import normalise_cidr
from .model import ANN_AUDIT, PROTO_NUMBERS, IPNet

INGRESS = "ingress"
EGRESS = "egress"
DIRECTIONS = (INGRESS, EGRESS)


@dataclass(frozen=True, slots=True)
class IPBlockPeer:
    cidr: IPNet
    excepts: tuple[IPNet, ...] = ()

    def contains(self, ip: Any) -> bool:
        if ip.version != self.cidr.version or ip not in self.cidr:
            return False
        return not any(ip in e for e in self.excepts if e.version == ip.version)


@dataclass(frozen=True, slots=True)
class Peer:
    """One entry of from/to: selectors (None = not given) or an ipBlock."""

    pod_selector: dict | None = None
    namespace_selector: dict | None = None
    ip_block: IPBlockPeer | None = None


@dataclass(frozen=True, slots=True)
class PortSpec:
    proto: int
    port: int | str | None = None   # str = a named port
    end_port: int | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    direction: str
    index: int
    peers: tuple[Peer, ...] | None    # None: any peer
    ports: tuple[PortSpec, ...] | None  # None: any protocol and port


@dataclass(frozen=True, slots=True)
class ParsedPolicy:
    """A NetworkPolicy as resolution reads it. The agent keeps this instead of the stored object
    (its cluster cache converts each policy as it arrives), so it carries the object's
    resourceVersion as the slim records of lace.store.records do."""

    namespace: str
    name: str
    pod_selector: dict
    ingress: bool        # selects its pods for ingress (from policyTypes or the defaulting)
    egress: bool
    rules: tuple[Rule, ...]
    audit: bool          # the policy's own lace.dev/audit annotation
    fingerprint: str     # what resolution of this policy depends on from the object itself (a digest)
    rv: int = 0          # the object's resourceVersion

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def types(self) -> list[str]:
        return [d for d in DIRECTIONS if getattr(self, d)]

    def has_ip_blocks(self) -> bool:
        return any(p.ip_block for r in self.rules for p in r.peers or ())


def is_audit(annotations: dict | None) -> bool:
    return str((annotations or {}).get(ANN_AUDIT, "")).lower() == "true"


def _peer(raw: dict) -> Peer:
    if "ipBlock" in raw and raw["ipBlock"] is not None:
        b = raw["ipBlock"]
        return Peer(ip_block=IPBlockPeer(ipaddress.ip_network(normalise_cidr(b["cidr"])),
                                         tuple(ipaddress.ip_network(normalise_cidr(e)) for e in b.get("except") or ())))
    return Peer(pod_selector=raw.get("podSelector"), namespace_selector=raw.get("namespaceSelector"))


def _port(raw: dict) -> PortSpec:
    proto = PROTO_NUMBERS[str(raw.get("protocol") or "TCP").upper()]
    port = raw.get("port")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    end = raw.get("endPort")
    return PortSpec(proto, port, int(end) if end is not None and isinstance(port, int) else None)


def parse_policy(obj: dict) -> ParsedPolicy:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    types = spec.get("policyTypes")
    if not types:
        types = ["Ingress"] + (["Egress"] if spec.get("egress") else [])
    rules: list[Rule] = []
    for direction, peers_key in ((INGRESS, "from"), (EGRESS, "to")):
        if direction.capitalize() not in types:
            continue
        for i, r in enumerate(spec.get(direction) or []):
            r = r or {}
            peers = r.get(peers_key)
            ports = r.get("ports")
            rules.append(Rule(direction, i,
                              tuple(_peer(p) for p in peers) if peers else None,
                              tuple(_port(p or {}) for p in ports) if ports else None))
    audit = is_audit(meta.get("annotations"))
    fp = hashlib.sha256(json.dumps([spec, audit], sort_keys=True, default=str).encode()).hexdigest()
    return ParsedPolicy(meta.get("namespace") or "default", meta["name"], spec.get("podSelector") or {},
                        "Ingress" in types, "Egress" in types, tuple(rules), audit, fp,
                        revision(obj))


def parsed(policies: Iterable[dict | ParsedPolicy]) -> list[ParsedPolicy]:
    """NetworkPolicy objects parsed (the agent's cache holds them parsed already)."""
    return [p if isinstance(p, ParsedPolicy) else parse_policy(p) for p in policies]
