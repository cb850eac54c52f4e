"""Resolution: NetworkPolicies over segments -> ``policy`` and ``prefix-segment`` map entries.

Per policy (cached, keyed by the policy's own content, its audit mode, its ID, the fingerprints of
the parts of the world it reads — its namespace, the namespaces its selectors match — and, for
ipBlock peers, the segments with a pod address in each block; so one policy change re-resolves one
policy, a new label set the policies that can see it, and a pod address elsewhere none):

- subjects: the segments of the policy's namespace its podSelector matches, per direction in its
  (defaulted) policyTypes: each gets a MARKER (default deny in that direction);
- each rule: peer segments (selectors, or ipBlock -> the CIDR segments inside the block and not
  inside an except, plus the pod segments with an address in the block minus except: Kubernetes
  conformance expects ipBlocks to match pod IPs, and a pod address resolves to its endpoint segment
  in the datapath, never to a prefix) x ports (numeric, ranges as LPM blocks, named ports resolved
  on the destination pod: the subject for ingress, the peer for egress) -> allow entries tagged with
  (policy ID, rule index).

The node's host reaches the pods of its node whatever policy selects them, as Kubernetes expects
(kubelet probes come from the node; Calico and Cilium allow the host by default too): every
segment selected for ingress also gets an allow entry for peer HOST, any protocol and port
(policy 0, rule HOST_RULE). It is kept, like the markers, whatever the map's capacity. Other nodes'
hosts are ordinary peers (segment REMOTE_NODE): a policy must allow them.

Assembly (cheap, per node): the union of every policy's entries. For one (segment, direction), if
any policy selecting it enforces, only enforcing policies' rules are programmed; if all of them are
in audit mode (policy or namespace annotation ``lace.dev/audit: "true"``), their rules are
programmed and the marker carries AUDIT, so would-be drops pass as AUDIT verdicts. A key produced
by several policies keeps the first in namespace/name order.

Per node, only entries whose subject segment has a pod on that node are programmed: egress is
checked on the source's node and ingress on the destination's node, so nothing else is ever looked
up there. When the entries exceed the map's capacity, markers are kept (fail closed) and the allow
entries that do not fit are left out and reported (reason MAP_FULL) in ``Pressure``; the agent logs
it, ``lace policy trace`` and ``node bpf show policy`` show it.

Granularity (documented limits, reported by ``lace policy trace`` as disagreements when they bite):
the datapath decides per segment, so pods sharing (network, namespace, labels) are one peer: an
ipBlock that contains one such pod's address but not another's allows both, and a named port that
maps to different numbers in pods of one segment allows the union. A peer segment matched by an
ipBlock through one address family is allowed over both families.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from lace.datapath.common import SEGMENT_ANY, SEGMENT_HOST, Direction
from lace.datapath.policy import (HOST_RULE, POLICY_KEY, POLICY_MAX, PolicyFlag, policy_entry, policy_keys,
                                  selected_key)
from lace.datapath.segment import PREFIX_SEGMENT_MAX, prefix_segment_key, segment_value
from lace.datapath.common import NETWORK_OUTSIDE

from .ids import policy_ids
from .model import PolicyInputs
from .parse import EGRESS, INGRESS, IPBlockPeer, ParsedPolicy, Peer, Rule
from .world import SegmentInfo, World, selector_key

log = logging.getLogger("lace.policy")

MARKER_RULE = 0xFFFF
DIR = {INGRESS: int(Direction.INGRESS), EGRESS: int(Direction.EGRESS)}
MAP_FULL = "MAP_FULL"


@dataclass
class Allow:
    """One allow entry before packing: subject, direction, peer (0 = any), proto/ports (None = any)."""

    subject: int
    direction: int
    peer: int
    proto: int | None
    port: int | None
    end_port: int | None
    rule: int


class Allows:
    """One (subject segment, direction)'s allow entries from one policy: (policy key, rule) pairs,
    packed. Every key has POLICY_KEY's size, so they are kept one after another in one bytes
    object with the rules in an array beside them: a large cluster's policies hold hundreds of
    thousands of these, and as a bytes object and a tuple each they cost over three times the
    memory. Iterating gives the pairs back."""

    __slots__ = ("_keys", "_rules")

    def __init__(self) -> None:
        self._keys: bytes | bytearray = bytearray()
        self._rules = array("H")

    def append(self, key: bytes, rule: int) -> None:
        self._keys += key   # type: ignore[operator]
        self._rules.append(rule)

    def freeze(self) -> Allows:
        """Done appending: the keys as exact-size bytes (a bytearray keeps spare room)."""
        self._keys = bytes(self._keys)
        return self

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        size, keys = POLICY_KEY.size, self._keys
        for i, rule in enumerate(self._rules):
            yield bytes(keys[i * size:(i + 1) * size]), rule


@dataclass
class PolicyResolution:
    """What one policy contributes: its subjects per direction and its allow entries."""

    key: str
    policy_id: int
    audit: bool
    subjects: dict[int, tuple[int, ...]]                       # direction -> segments
    allows: dict[tuple[int, int], Allows]                      # (segment, direction) -> (key, rule)s
    cidrs: frozenset[str] = frozenset()
    fingerprint: str = ""

    def count(self) -> int:
        return sum(len(v) for v in self.allows.values())


@dataclass
class Pressure:
    """A node's policy-map pressure: what the store implies against what fits."""

    capacity: int
    desired: int = 0           # entries the policies imply for this node (markers included)
    programmed: int = 0        # entries handed to the map (<= capacity)
    markers: int = 0
    dropped: int = 0           # allow entries left out because the map is full
    dropped_by_policy: dict[str, int] = field(default_factory=dict)
    prefix_capacity: int = PREFIX_SEGMENT_MAX
    prefix_desired: int = 0
    prefix_dropped: int = 0

    @property
    def reason(self) -> str | None:
        return MAP_FULL if self.dropped or self.prefix_dropped else None

    def as_dict(self) -> dict:
        return {"capacity": self.capacity, "desired": self.desired, "programmed": self.programmed,
                "markers": self.markers, "dropped": self.dropped, "reason": self.reason,
                "dropped_by_policy": dict(sorted(self.dropped_by_policy.items())),
                "prefix_segment": {"capacity": self.prefix_capacity, "desired": self.prefix_desired,
                                   "dropped": self.prefix_dropped}}


class Resolution:
    """All policies resolved cluster-wide; per-node entries come from ``entries``."""

    def __init__(self, world: World, results: list[PolicyResolution], names: dict[int, str]) -> None:
        self.world = world
        self.results = results                       # sorted by namespace/name
        self.policy_names = names                    # policy ID -> namespace/name
        self.by_key = {r.key: r for r in results}
        h = hashlib.sha256()
        for r in results:
            h.update(f"{r.key}\0{r.fingerprint}\0".encode())
        self.version = h.hexdigest()
        # (segment, direction) -> enforcing policies, audit policies (both in namespace/name order)
        self.groups: dict[tuple[int, int], tuple[list[PolicyResolution], list[PolicyResolution]]] = {}
        for r in results:
            for d, segs in r.subjects.items():
                for s in segs:
                    enf, aud = self.groups.setdefault((s, d), ([], []))
                    (aud if r.audit else enf).append(r)

    def subject_segments(self) -> set[int]:
        return {s for s, _ in self.groups}

    def entries(self, segments: set[int] | None = None, capacity: int = POLICY_MAX
                ) -> tuple[dict[bytes, bytes], Pressure]:
        """The ``policy`` map for a node whose pods have ``segments`` (None: every segment)."""
        out: dict[bytes, bytes] = {}
        pr = Pressure(capacity)
        groups = sorted(g for g in self.groups if segments is None or g[0] in segments)
        values: dict[tuple[int, int], bytes] = {}
        for s, d in groups:
            enf, aud = self.groups[(s, d)]
            owner = (enf or aud)[0]
            flags = PolicyFlag.SELECTED | (0 if enf else PolicyFlag.AUDIT)
            out[selected_key(s, d)] = policy_entry(owner.policy_id, MARKER_RULE, flags)
        pr.markers = len(out)
        host = policy_entry(0, HOST_RULE)
        for s, d in groups:
            if d == DIR[INGRESS]:
                for key in policy_keys(s, SEGMENT_HOST, d, None):
                    out[key] = host
        n = len(out)
        desired = set(out)
        for s, d in groups:
            enf, aud = self.groups[(s, d)]
            for r in enf or aud:
                for key, rule in r.allows.get((s, d), ()):
                    if key in desired:
                        continue
                    desired.add(key)
                    if n >= capacity:
                        pr.dropped += 1
                        pr.dropped_by_policy[r.key] = pr.dropped_by_policy.get(r.key, 0) + 1
                        continue
                    v = values.get((r.policy_id, rule))
                    if v is None:
                        v = values[(r.policy_id, rule)] = policy_entry(r.policy_id, rule)
                    out[key] = v
                    n += 1
        pr.desired = len(desired)
        pr.programmed = len(out)
        return out, pr

    def prefix_entries(self, capacity: int = PREFIX_SEGMENT_MAX) -> tuple[dict[bytes, bytes], int, int]:
        """``prefix-segment`` entries: every CIDR a policy uses, in every network and the outside.
        Returns (entries, desired count, dropped count)."""
        used = sorted(set().union(*(r.cidrs for r in self.results)) if self.results else set(),
                      key=lambda c: (ipaddress.ip_network(c).version, ipaddress.ip_network(c)))
        nets = sorted(set(self.world.inputs.network_ids) | {NETWORK_OUTSIDE})
        out: dict[bytes, bytes] = {}
        desired = dropped = 0
        for c in used:
            seg = self.world.cidrs.get(c)
            if seg is None:
                continue
            for net in nets:
                desired += 1
                if len(out) >= capacity:
                    dropped += 1
                    continue
                out[prefix_segment_key(net, c)] = segment_value(seg)
        return out, desired, dropped


class Resolver:
    """Resolves policies with a per-policy cache; keep one instance across reconciles."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple, PolicyResolution]] = {}
        self.stats = {"resolved": 0, "cached": 0}

    def resolve(self, inputs: PolicyInputs) -> Resolution:
        world = World(inputs)
        parsed = sorted(inputs.policies, key=lambda p: p.key)
        ids = policy_ids(p.key for p in parsed)
        results = []
        live = set()
        resolved = 0
        # ipBlock -> the segments with a pod address in it: all an ipBlock peer reads of the pods'
        # addresses, so a pod that comes or goes elsewhere re-resolves no policy of a block
        in_blocks: dict[IPBlockPeer, tuple[int, ...]] = {}
        for p in parsed:
            audit = p.audit or world.ns_audit.get(p.namespace, False)
            ck = (p.fingerprint, audit, ids[p.key], _world_key(p, world), _block_key(p, world, in_blocks))
            live.add(p.key)
            hit = self._cache.get(p.key)
            if hit and hit[0] == ck:
                results.append(hit[1])
                continue
            r = resolve_policy(p, world, ids[p.key], audit)
            r.fingerprint = hashlib.sha256(repr(ck).encode()).hexdigest()
            self._cache[p.key] = (ck, r)
            results.append(r)
            resolved += 1
        for k in set(self._cache) - live:
            del self._cache[k]
        self.stats["resolved"] += resolved
        self.stats["cached"] += len(parsed) - resolved
        self.last_resolved = resolved
        return Resolution(world, results, {v: k for k, v in ids.items()})


def resolve(inputs: PolicyInputs) -> Resolution:
    """Resolve without a cache (tests, the CLI)."""
    return Resolver().resolve(inputs)


# -- one policy ------------------------------------------------------------------------------------


def cidrs_of(policy: ParsedPolicy) -> set[str]:
    """Every ipBlock cidr and except prefix of a policy (each needs a segment)."""
    out: set[str] = set()
    for r in policy.rules:
        for peer in r.peers or ():
            if peer.ip_block:
                out.add(str(peer.ip_block.cidr))
                out.update(str(e) for e in peer.ip_block.excepts)
    return out


def _world_key(policy: ParsedPolicy, world: World) -> tuple:
    """What a policy's resolution reads of the world besides its ipBlocks' pods (``_block_key``):
    its own namespace (subjects, same-namespace peers, their named ports), the namespaces its
    namespaceSelectors match (each one's fingerprint holds its name and labels), the CIDR
    identities when it has an ipBlock; everything when an egress named port may resolve on a
    segment anywhere (a rule to any peer, or to an ipBlock's pods). A new label set in one
    namespace then resolves that namespace's policies again and those whose namespaceSelector
    takes it in, not every policy."""
    parts = [world.ns_fingerprints.get(policy.namespace, "")]
    for rule in policy.rules:
        named_egress = rule.direction == EGRESS and any(isinstance(ps.port, str) for ps in rule.ports or ())
        if rule.peers is None:
            if named_egress:
                return (world.fingerprint,)
            continue
        for peer in rule.peers:
            if peer.ip_block is not None:
                if named_egress:
                    return (world.fingerprint,)
                parts.append(world.cidrs_fingerprint)
            elif peer.namespace_selector is not None:   # which namespaces match, and each one
                parts.append("ns")
                parts.extend(world.ns_fingerprints[n] for n in world.namespaces_matching(peer.namespace_selector))
    return tuple(parts)


def _block_key(policy: ParsedPolicy, world: World, memo: dict[IPBlockPeer, tuple[int, ...]]) -> tuple:
    """What a policy's ipBlock peers depend on from the pods' addresses: per block, the segments
    with an address in it (memo: per block, for one world)."""
    out = []
    for r in policy.rules:
        for peer in r.peers or ():
            b = peer.ip_block
            if b is None:
                continue
            if b not in memo:
                memo[b] = tuple(sorted(world.segments_with_addresses_in(b.cidr, b.excepts)))
            out.append(memo[b])
    return tuple(out)


def _block_segments(block: IPBlockPeer, world: World) -> tuple[list[int], list[SegmentInfo]]:
    """CIDR segments inside the block and in no except; pod segments with an address in the block."""
    cidr_segs = []
    for c, net in world.cidr_nets.items():
        if net.version != block.cidr.version or not net.subnet_of(block.cidr):  # type: ignore[arg-type]
            continue
        if any(e.version == net.version and net.subnet_of(e) for e in block.excepts):  # type: ignore[arg-type]
            continue
        cidr_segs.append(world.cidrs[c])
    pods = [world.segments[i] for i in sorted(world.segments_with_addresses_in(block.cidr, block.excepts))]
    return sorted(cidr_segs), pods


def _peer_segments(peer: Peer, policy: ParsedPolicy, world: World) -> tuple[list[int], list[SegmentInfo]]:
    """(all peer segment IDs, the pod segments among them)."""
    if peer.ip_block is not None:
        cidr_segs, pods = _block_segments(peer.ip_block, world)
        return sorted(set(cidr_segs) | {s.id for s in pods}), pods
    if peer.namespace_selector is None:
        namespaces = [policy.namespace]
    else:
        namespaces = world.namespaces_matching(peer.namespace_selector)
    selector = peer.pod_selector if peer.pod_selector is not None else {}
    segs = world.segments_matching(namespaces, selector)
    return [s.id for s in segs], segs


def _rule_allows(rule: Rule, subject: SegmentInfo, policy: ParsedPolicy, world: World,
                 peers: list[tuple[int, SegmentInfo | None]] | None) -> list[Allow]:
    d = DIR[rule.direction]
    out: list[Allow] = []
    peer_list = peers if peers is not None else [(SEGMENT_ANY, None)]
    if rule.ports is None:
        return [Allow(subject.id, d, pid, None, None, None, rule.index) for pid, _ in peer_list]
    for ps in rule.ports:
        if isinstance(ps.port, str):
            if rule.direction == INGRESS:
                for port in sorted(subject.named_ports(ps.port, ps.proto)):
                    out.extend(Allow(subject.id, d, pid, ps.proto, port, None, rule.index) for pid, _ in peer_list)
            else:
                # a named egress port is the destination pod's: resolve it per peer segment
                targets = ([(s.id, s) for s in world.segments.values()] if peers is None
                           else [(pid, s) for pid, s in peer_list if s is not None])
                for pid, seg in sorted(targets, key=lambda t: t[0]):
                    assert seg is not None
                    for port in sorted(seg.named_ports(ps.port, ps.proto)):
                        out.append(Allow(subject.id, d, pid, ps.proto, port, None, rule.index))
        else:
            out.extend(Allow(subject.id, d, pid, ps.proto, ps.port, ps.end_port, rule.index)
                       for pid, _ in peer_list)
    return out


def resolve_policy(policy: ParsedPolicy, world: World, policy_id: int, audit: bool) -> PolicyResolution:
    skey = selector_key(policy.pod_selector)
    subjects = [s for s in world.by_namespace.get(policy.namespace, ())
                if world.match(skey, policy.pod_selector, s.labels)]
    res = PolicyResolution(policy.key, policy_id, audit, {}, {}, frozenset(cidrs_of(policy)))
    for direction in policy.types():
        res.subjects[DIR[direction]] = tuple(s.id for s in subjects)
    if not subjects:
        return res
    for rule in policy.rules:
        peers: list[tuple[int, SegmentInfo | None]] | None = None
        if rule.peers is not None:
            seen: dict[int, SegmentInfo | None] = {}
            for peer in rule.peers:
                ids_, pods = _peer_segments(peer, policy, world)
                by_id = {s.id: s for s in pods}
                for i in ids_:
                    if i not in seen or seen[i] is None:
                        seen[i] = by_id.get(i)
            peers = sorted(seen.items())
        for subject in subjects:
            bucket = res.allows.setdefault((subject.id, DIR[rule.direction]), Allows())
            for a in _rule_allows(rule, subject, policy, world, peers):
                for k in policy_keys(a.subject, a.peer, a.direction, a.proto, a.port, a.end_port):
                    bucket.append(k, a.rule)
    for bucket in res.allows.values():
        bucket.freeze()
    return res
