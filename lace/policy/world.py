"""The cluster as policy sees it: segments with their pods, namespaces with their labels, the CIDR
identities, and memoised selector matching (the hot loop of resolution)."""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
import json
from dataclasses import dataclass, field
from lace.store.selectors import matches

from .model import Labels, PodInfo, PolicyInputs

#: Kubernetes sets this label on every Namespace; conformance tests select namespaces by it
NS_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass
class SegmentInfo:
    """One segment (network, namespace, labels) and the pods that have it."""

    id: int
    namespace: str
    labels: Labels
    network_id: int
    pods: list[PodInfo] = field(default_factory=list)

    def named_ports(self, name: str, proto: int) -> set[int]:
        out: set[int] = set()
        for p in self.pods:
            out |= p.named_ports(name, proto)
        return out


def selector_key(selector: dict | None) -> str:
    return json.dumps(selector, sort_keys=True)


class World:
    """Derived, read-only view of PolicyInputs used while resolving."""

    def __init__(self, inputs: PolicyInputs) -> None:
        self.inputs = inputs
        self.segments: dict[int, SegmentInfo] = {}
        for p in inputs.pods:
            s = self.segments.get(p.segment)
            if s is None:
                s = self.segments[p.segment] = SegmentInfo(p.segment, p.namespace, p.labels, p.network_id)
            s.pods.append(p)
        self.by_namespace: dict[str, list[SegmentInfo]] = {}
        for s in sorted(self.segments.values(), key=lambda s: s.id):
            self.by_namespace.setdefault(s.namespace, []).append(s)
        self.ns_labels: dict[str, dict[str, str]] = {}
        self.ns_audit: dict[str, bool] = {}
        for name in set(self.by_namespace) | set(inputs.namespaces):
            info = inputs.namespaces.get(name)
            labels = dict(info.labels) if info else {}
            labels.setdefault(NS_NAME_LABEL, name)
            self.ns_labels[name] = labels
            self.ns_audit[name] = bool(info and info.audit)
        self.cidrs: dict[str, int] = dict(inputs.cidr_segments)
        self.cidr_nets = {c: ipaddress.ip_network(c) for c in self.cidrs}
        self._memo: dict[tuple[str, Labels], bool] = {}
        self._ns_matching: dict[str, list[str]] = {}
        # fingerprints of what resolution reads, so a policy is resolved again only when what it
        # reads changed (lace.policy.resolve): per namespace, its labels and its segments (labels,
        # network, named ports); the CIDR identities; and all of it
        self.ns_fingerprints: dict[str, str] = {}
        for name in sorted(self.ns_labels):
            hn = hashlib.sha256(repr((name, sorted(self.ns_labels[name].items()))).encode())
            for s in self.by_namespace.get(name, ()):
                ports = sorted({(cp.name, cp.proto, cp.port) for p in s.pods for cp in p.ports if cp.name})
                hn.update(repr((s.id, s.labels, s.network_id, ports)).encode())
            self.ns_fingerprints[name] = hn.hexdigest()
        self.cidrs_fingerprint = hashlib.sha256(repr(sorted(self.cidrs.items())).encode()).hexdigest()
        h = hashlib.sha256()
        for name, digest in sorted(self.ns_fingerprints.items()):
            h.update(f"{name}\0{digest}\0".encode())
        h.update(self.cidrs_fingerprint.encode())
        #: everything a policy's resolution may depend on besides the policy itself
        self.fingerprint = h.hexdigest()
        # every pod address as an integer, sorted per family, beside its segment: an ipBlock's pods
        # are then a range of it (bisect), not a test of every address of the cluster
        pairs: dict[int, list[tuple[int, int]]] = {4: [], 6: []}
        for s in self.segments.values():
            for p in s.pods:
                for ip in p.ips:
                    pairs[ip.version].append((int(ip), s.id))
        self._addrs: dict[int, tuple[list[int], list[int]]] = {}
        for version, lst in pairs.items():
            lst.sort()
            self._addrs[version] = ([a for a, _ in lst], [sid for _, sid in lst])

    def segments_with_addresses_in(self, cidr: ipaddress.IPv4Network | ipaddress.IPv6Network,
                                   excepts: tuple = ()) -> set[int]:
        """IDs of the segments with a pod address in ``cidr`` and in none of ``excepts``."""
        addrs, segs = self._addrs[cidr.version]
        first, last = int(cidr.network_address), int(cidr.broadcast_address)
        holes = sorted((int(e.network_address), int(e.broadcast_address))
                       for e in excepts if e.version == cidr.version)
        out: set[int] = set()
        start = first
        for lo, hi in holes + [(last + 1, last + 1)]:
            end = min(lo - 1, last)
            if end >= start:   # the stretch [start, end] lies in cidr and in no except
                out.update(segs[bisect.bisect_left(addrs, start):bisect.bisect_right(addrs, end)])
            start = max(start, hi + 1)
            if start > last:
                break
        return out

    def match(self, skey: str, selector: dict | None, labels: Labels) -> bool:
        k = (skey, labels)
        hit = self._memo.get(k)
        if hit is None:
            hit = self._memo[k] = matches(selector, dict(labels))
        return hit

    def namespaces_matching(self, selector: dict | None) -> list[str]:
        """The namespaces a namespaceSelector matches, in name order (one answer per selector;
        callers read it, never change it)."""
        skey = "ns:" + selector_key(selector)
        hit = self._ns_matching.get(skey)
        if hit is None:
            hit = self._ns_matching[skey] = [ns for ns, labels in sorted(self.ns_labels.items())
                                             if self.match(skey, selector, tuple(sorted(labels.items())))]
        return hit

    def segments_matching(self, namespaces: list[str], selector: dict | None) -> list[SegmentInfo]:
        skey = selector_key(selector)
        return [s for ns in namespaces for s in self.by_namespace.get(ns, ())
                if self.match(skey, selector, s.labels)]
