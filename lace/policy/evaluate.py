"""The store-implied decision, straight from NetworkPolicy semantics, per pod (not per segment).

This is the oracle ``lace policy trace`` compares the programmed maps with, and the unit tests
check the resolver against: it never looks at segments or map entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lace.store.selectors import matches

from .model import IPAddr, PodInfo, PolicyInputs
from .parse import EGRESS, INGRESS, ParsedPolicy, Peer, Rule, is_audit
from .world import NS_NAME_LABEL


@dataclass
class Endpoint:
    """One side of a connection: a pod (with the address used) or a bare address."""

    ip: IPAddr
    pod: PodInfo | None = None

    def label(self) -> str:
        return self.pod.key if self.pod else str(self.ip)


@dataclass
class DirectionDecision:
    direction: str
    subject: str | None                          # the pod whose policies decide, None: not a pod
    selected_by: list[str] = field(default_factory=list)   # policies selecting it in this direction
    audit: bool = False                          # every selecting policy is in audit mode
    allowed: bool = True
    policy: str | None = None                    # the policy and rule that allowed it
    rule: int | None = None

    @property
    def selected(self) -> bool:
        return bool(self.selected_by)

    @property
    def verdict(self) -> str:
        if self.allowed:
            return "allow"
        return "audit" if self.audit else "deny"

    def as_dict(self) -> dict[str, Any]:
        return {"direction": self.direction, "subject": self.subject, "selected": self.selected,
                "selected_by": self.selected_by, "audit_mode": self.audit, "verdict": self.verdict,
                "policy": self.policy, "rule": self.rule}


class Evaluator:
    def __init__(self, inputs: PolicyInputs) -> None:
        self.inputs = inputs
        self.policies = sorted(inputs.policies, key=lambda p: p.key)
        self.ns_labels: dict[str, dict[str, str]] = {}
        for p in inputs.pods:
            self.ns_labels.setdefault(p.namespace, {})
        for name, info in inputs.namespaces.items():
            self.ns_labels[name] = dict(info.labels)
        for name, labels in self.ns_labels.items():
            labels.setdefault(NS_NAME_LABEL, name)

    def _audit(self, p: ParsedPolicy) -> bool:
        ns = self.inputs.namespaces.get(p.namespace)
        return p.audit or bool(ns and ns.audit)

    def pod_for_ip(self, ip: IPAddr) -> PodInfo | None:
        return next((p for p in self.inputs.pods if ip in p.ips), None)

    def _peer_matches(self, peer: Peer, policy: ParsedPolicy, other: Endpoint) -> bool:
        if peer.ip_block is not None:
            return peer.ip_block.contains(other.ip)
        pod = other.pod
        if pod is None:
            return False
        if peer.namespace_selector is None:
            if pod.namespace != policy.namespace:
                return False
        elif not matches(peer.namespace_selector, self.ns_labels.get(pod.namespace, {NS_NAME_LABEL: pod.namespace})):
            return False
        return matches(peer.pod_selector if peer.pod_selector is not None else {}, dict(pod.labels))

    @staticmethod
    def _port_matches(rule: Rule, proto: int, port: int, target: PodInfo | None) -> bool:
        if rule.ports is None:
            return True
        for ps in rule.ports:
            if ps.proto != proto:
                continue
            if ps.port is None:
                return True
            if isinstance(ps.port, str):
                if target is not None and port in target.named_ports(ps.port, proto):
                    return True
            elif ps.port <= port <= (ps.end_port if ps.end_port is not None else ps.port):
                return True
        return False

    def direction(self, direction: str, subject: Endpoint, other: Endpoint, proto: int, port: int,
                  target: Endpoint) -> DirectionDecision:
        d = DirectionDecision(direction, subject.pod.key if subject.pod else None)
        pod = subject.pod
        if pod is None:
            return d
        selecting = [p for p in self.policies if direction in p.types() and p.namespace == pod.namespace
                     and matches(p.pod_selector, dict(pod.labels))]
        if not selecting:
            return d
        enforcing = [p for p in selecting if not self._audit(p)]
        mode = enforcing or selecting
        d.selected_by = [p.key for p in mode]
        d.audit = not enforcing
        d.allowed = False
        for p in mode:
            for r in p.rules:
                if r.direction != direction:
                    continue
                peer_ok = r.peers is None or any(self._peer_matches(peer, p, other) for peer in r.peers)
                if peer_ok and self._port_matches(r, proto, port, target.pod):
                    d.allowed, d.policy, d.rule = True, p.key, r.index
                    return d
        return d

    def decide(self, src: Endpoint, dst: Endpoint, proto: int, port: int) -> tuple[DirectionDecision, DirectionDecision]:
        """(source egress, destination ingress) for a new connection src -> dst:port/proto."""
        if proto in (1, 58):
            port = 0
        return (self.direction(EGRESS, src, dst, proto, port, dst),
                self.direction(INGRESS, dst, src, proto, port, dst))


def overall(egress: str, ingress: str) -> str:
    """Connection verdict from the two directions: deny wins, then audit, else allow."""
    if "deny" in (egress, ingress):
        return "deny"
    if "audit" in (egress, ingress):
        return "audit"
    return "allow"


__all__ = ["DirectionDecision", "Endpoint", "Evaluator", "INGRESS", "EGRESS", "is_audit", "overall"]
