"""Incremental pod passes: what the agent does when only pods changed.

A pod of another node reaches this node's maps in one place: its addresses' entries in the
``segment`` map (address -> segment, the identity policy decides on). Its delivery goes by its
node's block, which did not change. So when pods of other nodes come and go, and their identities
are ones the cluster already has, the agent writes those entries and nothing else — Cilium's
ipcache updates for an endpoint of a known identity do the same.

A pod of this node has more: its interface's entries (the host-side device, a delivery entry per
address and its delivery-exact copy, the veth entry, its probe targets: lace.agent.desired's
endpoint_entries) and its addresses' segment entries, flagged local. A CNI ADD or DEL programs
them this way (a full pass at 10k pods and 2k policies is a few hundred ms; this is about one).

Policy is the catch: it is resolved per segment, and a pod can change what a segment means to it.
A change takes this way only when it changes none of that, and a full pass (which also covers
the pods) decides otherwise:

- the set of segments that have pods stays the same (a segment's first pod or its last one makes
  selectors match or stop matching it);
- a segment that gains its first pod on this node or loses its last (a subject of this node's
  policy map) brings or takes its policy entries: the full pass's resolution of every policy
  stands (the checks here are what it depends on), so the node's policy maps for the new set of
  subjects are an assembly of it, and the pass writes the difference (Cilium regenerates an
  endpoint's policy from the cached selector results the same way); the pass declines when the
  programmer's last assembly was made for another set of subjects (an audit's, say);
- each segment's named container ports stay the same (named ports resolve per segment);
- no address, old or new, lies in an ipBlock of any policy (ipBlocks match pod addresses too);
- the segment already exists (a new label set needs a Segment allocated, in a full pass);
- none of the pod's leases is a host lease, and its networks are ones the last full pass knew.

What the check needs is rebuilt from every full pass's snapshot and kept up to date by each
incremental pass: the addresses programmed per pod, this node's endpoints per pod, pod counts per
segment, per local segment and per (segment, named port), the ipBlock prefixes, the networks that
have pods and their conntrack limits.
"""

from __future__ import annotations

import functools
import ipaddress
import threading
from collections import Counter
from typing import Any

from lace.datapath.delivery import exact_entries
from lace.datapath.segment import segment_value
from lace.policy.program import PolicyProgrammer
from lace.store import kinds as K
from lace.store.api import WatchEvent
from lace.store.records import same_objects

from .cluster import ClusterCache
from .desired import ENDPOINT_MAPS, Entries, ct_limit, endpoint_entries
from .diff import COMPARE, MapChanges, diff
from .model import LocalEndpoint, PodAddress, Snapshot, is_pod_container, lease_pod
from .state import pod_endpoints

#: kinds whose changes an incremental pod pass may program
POD_KINDS = ("Pod", "IPLease")


class PodSync:
    """The pods the watch left for the next pass, what the check reads, and the pass itself.
    ``links``: the agent's index of the namespace's interfaces (lace.netlink.LinkIndex), which a
    pass for a pod of this node looks its interface up in; passes run under the agent's reconcile
    lock, as full passes do, which is what the index asks. ``policy``: the agent's policy
    programmer, whose last resolution gives the policy entries of a segment that gains its first
    pod on this node or loses its last (without one, such a pass is left to a full pass)."""

    def __init__(self, node: str, cluster: ClusterCache, datapath: Any, order: tuple[str, ...],
                 links: Any = None, policy: PolicyProgrammer | None = None) -> None:
        self.node = node
        self.cluster = cluster
        self.datapath = datapath
        self.order = order
        self.links = links
        self.policy = policy
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        #: from the last full pass, kept by incremental ones (None: no full pass yet)
        self._addresses: dict[str, tuple[PodAddress, ...]] | None = None
        self._seg_pods: Counter[int] = Counter()
        self._seg_ports: Counter[tuple] = Counter()
        self._ports: dict[str, tuple] = {}
        self._blocks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._block_cidrs: tuple[str, ...] = ()
        self._networks: frozenset[int] = frozenset()
        #: this node's endpoints per pod, its pods per segment, each network's conntrack limit for
        #: its endpoints, the default network's ID (probe targets)
        self._endpoints: dict[str, tuple[LocalEndpoint, ...]] = {}
        self._local_segs: Counter[int] = Counter()
        self._ct_limits: dict[int, int] = {}
        self._default: int | None = None

    # -- the watch's side --------------------------------------------------------------------

    def event(self, ev: WatchEvent, change: tuple[Any, Any] | None) -> bool:
        """One watch event with what the cluster cache held before and holds now: True when an
        incremental pass may cover it (the pod is noted for the next one), False when it needs a
        full pass."""
        kind = ev.object.get("kind")
        if kind not in POD_KINDS or change is None:
            return False
        records = [r for r in change if r is not None]
        if kind == "Pod":
            keys = {r.key for r in records}
        else:
            keys = set()
            for r in records:
                # a probe address counts for the pod it stands for (its endpoint's probe targets)
                owner = lease_pod(r.pod, r.container_id)
                if owner is None:
                    return False
                keys.add(owner)
        with self._lock:
            self._pending |= keys
        return True

    def take(self) -> set[str]:
        """The pods noted since the last take (taking clears them; a full pass covers them)."""
        with self._lock:
            keys, self._pending = self._pending, set()
        return keys

    # -- the passes --------------------------------------------------------------------------

    def rebuilt(self, snap: Snapshot) -> None:
        """What the check reads, from a full pass's snapshot."""
        addresses: dict[str, list[PodAddress]] = {}
        for a in snap.pods:
            addresses.setdefault(a.pod, []).append(a)
        # a pod whose addresses are the very objects of last time keeps its tuple: a full pass
        # then leaves next to nothing new behind among its garbage (the heap's holes)
        old = self._addresses or {}
        self._addresses = {k: held if same_objects(held := old.get(k), v) else tuple(v)
                           for k, v in addresses.items()}
        inputs = snap.policy
        self._ports = {}
        self._seg_pods, self._seg_ports = Counter(), Counter()
        if inputs is not None:
            for p in inputs.pods:
                self._ports[p.key] = named = _named(p.ports)
                self._count(p.segment, named, 1)
            if self._block_cidrs != tuple(inputs.cidr_segments):   # parsed once per change
                self._block_cidrs = tuple(inputs.cidr_segments)
                self._blocks = [ipaddress.ip_network(c) for c in self._block_cidrs]
            self._networks = frozenset(inputs.network_ids)
            # the subjects of this node's policy map (lace.policy.program.node_segments)
            self._local_segs = Counter(p.segment for p in inputs.pods if p.node == self.node)
        endpoints: dict[str, list[LocalEndpoint]] = {}
        for ep in snap.endpoints:
            endpoints.setdefault(ep.pod, []).append(ep)
        self._endpoints = {k: tuple(v) for k, v in endpoints.items()}
        self._ct_limits = {n.id: ct_limit(snap, n.id) for n in snap.networks.values()}
        self._default = snap.network_id(K.DEFAULT_NETWORK)

    def endpoints(self) -> list[LocalEndpoint]:
        """This node's endpoints as the last pass left them."""
        return [ep for eps in self._endpoints.values() for ep in eps]

    def sync(self, keys: set[str]) -> dict[str, MapChanges] | None:
        """Program these pods (``namespace/name``): the segment entries of their addresses and,
        for pods of this node, their endpoints' entries. Returns the changes written, or None when
        only a full pass can decide (nothing was written then)."""
        if self._addresses is None:
            return None
        with self.cluster.lock:
            segments, ids = self.cluster.segment_ids(), self.cluster.network_ids()
            plan = {key: self._wanted(key, segments, ids) for key in keys}
        if any(v is None for v in plan.values()):
            return None
        local = [key for key, (addrs, _) in plan.items()   # type: ignore[misc]
                 if key in self._endpoints or any(a.node == self.node for a in addrs)]
        endpoints: dict[str, list[LocalEndpoint]] = {}
        if local:
            if self.links is None:
                return None
            ifaces = self.links.refresh()
            with self.cluster.lock:
                for key in local:
                    eps = pod_endpoints(self.cluster, self.node, key, ids, segments, ifaces)
                    if eps is None:
                        return None
                    endpoints[key] = eps
        seg_pods, seg_ports = Counter(self._seg_pods), Counter(self._seg_ports)
        local_segs = Counter(self._local_segs)
        changes: dict[str, MapChanges] = {}
        segment = changes["segment"] = MapChanges()
        for key, (addrs, named) in plan.items():   # type: ignore[misc]
            old = self._addresses.get(key, ())
            for a in old:
                if self._in_block(a.ip):
                    return None
                segment.deletes.append(a.key)
            if old:
                _count(seg_pods, seg_ports, old[0].segment, self._ports.get(key, ()), -1)
                local_segs[old[0].segment] -= old[0].node == self.node
            if addrs:
                _count(seg_pods, seg_ports, addrs[0].segment, named, 1)
                local_segs[addrs[0].segment] += addrs[0].node == self.node
            ips = {(ep.network, ip) for ep in endpoints.get(key, ()) for ip in ep.ips()}
            for a in addrs:
                if self._in_block(a.ip) or a.network not in self._networks:
                    return None
                segment.updates[a.key] = segment_value(a.segment, local=(a.network, a.ip) in ips)
        if _held(seg_pods) != _held(self._seg_pods) or _held(seg_ports) != _held(self._seg_ports):
            return None   # a segment gains its first pod or loses its last, or its named ports change
        subjects, was = _held(local_segs), _held(self._local_segs)
        if subjects != was:
            # a segment gains its first pod on this node or loses its last: the policy map's
            # entries for it come or go, from the resolution the last full pass made
            maps = self.policy.resubject(was, subjects) if self.policy is not None else None
            if maps is None:
                return None
            for name, want in maps[1].items():
                step = diff(name, want, maps[0][name])
                ch = changes.setdefault(name, MapChanges())
                ch.deletes.extend(step.deletes)
                ch.updates.update(step.updates)
        for key, eps in endpoints.items():
            before = self._entries(self._endpoints.get(key, ()))
            after = self._entries(eps)
            if before is None or after is None:
                return None   # a network the last full pass did not know
            for name in (*ENDPOINT_MAPS, "delivery-exact"):
                ch = changes.setdefault(name, MapChanges())
                ch.deletes.extend(before[name])
                ch.updates.update(after[name])
        work: dict[str, MapChanges] = {}
        for name, ch in changes.items():
            # a key both deleted and written is an update; one that holds the same entry is left
            deletes = [k for k in ch.deletes if k not in ch.updates]
            have = self.datapath.held(name, [*ch.updates, *deletes])
            view = COMPARE.get(name, bytes)   # the policy maps' hit counters are the datapath's
            ch.updates = {k: v for k, v in ch.updates.items() if k not in have or view(have[k]) != view(v)}
            ch.deletes = [k for k in dict.fromkeys(deletes) if k in have]
            if ch:
                work[name] = ch
        self.datapath.apply(work, self.order)
        for key, (addrs, named) in plan.items():   # type: ignore[misc]
            if addrs:
                self._addresses[key], self._ports[key] = addrs, named
            else:
                self._addresses.pop(key, None)
                self._ports.pop(key, None)
        for key, eps in endpoints.items():
            if eps:
                self._endpoints[key] = tuple(eps)
            else:
                self._endpoints.pop(key, None)
        self._seg_pods, self._seg_ports, self._local_segs = +seg_pods, +seg_ports, +local_segs
        return work

    def _entries(self, eps: Any) -> dict[str, Entries] | None:
        """ENDPOINT_MAPS' and delivery-exact's entries of these endpoints (None: a network's
        conntrack limit is not known)."""
        out: dict[str, Entries] = {name: {} for name in ENDPOINT_MAPS}
        for ep in eps:
            limit = self._ct_limits.get(ep.network)
            if limit is None:
                return None
            for name, entries in endpoint_entries(ep, limit, self._default).items():
                out[name].update(entries)
        out["delivery-exact"] = exact_entries(out["delivery"])
        return out

    def _wanted(self, key: str, segments: dict[tuple, int],
                ids: dict[str, int]) -> tuple[tuple[PodAddress, ...], tuple] | None:
        """The addresses a full pass would program for this pod and its named ports, or None when
        only a full pass can (its segment is not allocated yet)."""
        pod = self.cluster.pod(key)
        if pod is None:
            return (), ()
        out = []
        for lease in sorted(self.cluster.leases_of(key), key=lambda r: r.name):
            if not is_pod_container(lease.container_id):
                return None
            net_id = ids.get(lease.network)
            if net_id is None:
                continue
            seg = segments.get((lease.network, pod.namespace, pod.labels))
            if seg is None:
                return None
            out.append(PodAddress(net_id, lease.ip, seg, lease.node, key))
        return tuple(out), _named(pod.ports)

    def _in_block(self, ip: Any) -> bool:
        return any(ip in net for net in self._blocks if net.version == ip.version)

    def _count(self, segment: int, named: tuple, n: int) -> None:
        _count(self._seg_pods, self._seg_ports, segment, named, n)


@functools.lru_cache(maxsize=4096)
def _named(ports: tuple) -> tuple:
    """A pod's named ports as (name, proto, port)s; pods share their records' ports tuples
    (lace.store.records.shared), so one answer serves all of a workload's pods."""
    return tuple(sorted({(p.name, p.proto, p.port) for p in ports if p.name}))


def _held(counts: Counter) -> set:
    """The keys some pod still counts for."""
    return {k for k, n in counts.items() if n > 0}


def _count(seg_pods: Counter, seg_ports: Counter, segment: int, named: tuple, n: int) -> None:
    seg_pods[segment] += n
    for port in named:
        seg_ports[(segment, port)] += n

