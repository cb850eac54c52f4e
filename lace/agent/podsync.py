"""Incremental pod passes: what the agent does when only pods of other nodes changed.

A pod of another node reaches this node's maps in one place: its addresses' entries in the
``segment`` map (address -> segment, the identity policy decides on). Its delivery goes by its
node's block, which did not change. So when pods of other nodes come and go, and their identities
are ones the cluster already has, the agent writes those entries and nothing else — Cilium's
ipcache updates for an endpoint of a known identity do the same.

Policy is the catch: it is resolved per segment, and a pod can change what a segment means to it.
A change takes this way only when it changes none of that, and a full pass (which also covers
the pods) decides otherwise:

- the set of segments that have pods stays the same (a segment's first pod or its last one makes
  selectors match or stop matching it);
- each segment's named container ports stay the same (named ports resolve per segment);
- no address, old or new, lies in an ipBlock of any policy (ipBlocks match pod addresses too);
- the segment already exists (a new label set needs a Segment allocated, in a full pass);
- the pod is not on this node, nor is any of its leases, and none is a host or probe lease
  (local endpoints need interfaces, delivery, probes and policy subjects).

What the check needs is rebuilt from every full pass's snapshot and kept up to date by each
incremental pass: the addresses programmed per pod, pod counts per segment and per (segment,
named port), the ipBlock prefixes, the networks that have pods.
"""

from __future__ import annotations

import functools
import ipaddress
import threading
from collections import Counter
from typing import Any

from lace.datapath.segment import segment_value
from lace.store.api import WatchEvent
from lace.store.records import same_objects

from .cluster import ClusterCache
from .diff import MapChanges
from .model import PodAddress, Snapshot, is_pod_container

#: kinds whose changes an incremental pod pass may program
POD_KINDS = ("Pod", "IPLease")


class PodSync:
    """The pods the watch left for the next pass, what the check reads, and the pass itself."""

    def __init__(self, node: str, cluster: ClusterCache, datapath: Any, order: tuple[str, ...]) -> None:
        self.node = node
        self.cluster = cluster
        self.datapath = datapath
        self.order = order
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
            if any(r.node == self.node for r in records):
                return False
            keys = {r.key for r in records}
        else:
            if any(r.node == self.node or not is_pod_container(r.container_id) for r in records):
                return False
            keys = {r.pod for r in records}
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

    def sync(self, keys: set[str]) -> dict[str, MapChanges] | None:
        """Program these pods' (``namespace/name``) segment entries only; returns the changes
        written, or None when only a full pass can decide (nothing was written then)."""
        if self._addresses is None:
            return None
        with self.cluster.lock:
            segments, ids = self.cluster.segment_ids(), self.cluster.network_ids()
            plan = {key: self._wanted(key, segments, ids) for key in keys}
        if any(v is None for v in plan.values()):
            return None
        seg_pods, seg_ports = Counter(self._seg_pods), Counter(self._seg_ports)
        changes = MapChanges()
        for key, (addrs, named) in plan.items():   # type: ignore[misc]
            old = self._addresses.get(key, ())
            for a in old:
                if self._in_block(a.ip):
                    return None
                changes.deletes.append(a.key)
            if old:
                _count(seg_pods, seg_ports, old[0].segment, self._ports.get(key, ()), -1)
            if addrs:
                _count(seg_pods, seg_ports, addrs[0].segment, named, 1)
            for a in addrs:
                if self._in_block(a.ip) or a.network not in self._networks:
                    return None
                changes.updates[a.key] = segment_value(a.segment)
        if _held(seg_pods) != _held(self._seg_pods) or _held(seg_ports) != _held(self._seg_ports):
            return None   # a segment gains its first pod or loses its last, or its named ports change
        # an address both deleted and written is an update; one that holds the same entry is left
        changes.deletes = [k for k in changes.deletes if k not in changes.updates]
        have = self.datapath.held("segment", [*changes.updates, *changes.deletes])
        changes.updates = {k: v for k, v in changes.updates.items() if have.get(k) != v}
        changes.deletes = [k for k in changes.deletes if k in have]
        work = {"segment": changes} if changes else {}
        self.datapath.apply(work, self.order)
        for key, (addrs, named) in plan.items():   # type: ignore[misc]
            if addrs:
                self._addresses[key], self._ports[key] = addrs, named
            else:
                self._addresses.pop(key, None)
                self._ports.pop(key, None)
        self._seg_pods, self._seg_ports = +seg_pods, +seg_ports
        return work

    def _wanted(self, key: str, segments: dict[tuple, int],
                ids: dict[str, int]) -> tuple[tuple[PodAddress, ...], tuple] | None:
        """The addresses a full pass would program for this pod and its named ports, or None when
        it would need more than segment entries (its segment is not allocated yet)."""
        pod = self.cluster.pod(key)
        if pod is None:
            return (), ()
        if pod.node == self.node:
            return None
        out = []
        for lease in sorted(self.cluster.leases_of(key), key=lambda r: r.name):
            if lease.node == self.node or not is_pod_container(lease.container_id):
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

