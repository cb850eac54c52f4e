"""The agent's cache of the cluster: every kind a pass reads, listed once and then kept by the
watch, as a Kubernetes informer keeps one (``lace.store.cache``).

A pass reads its objects here instead of listing the store: with 10k pods that is ~35k objects
a pass does not decode again. Pods and IPLeases, most of them, are kept as slim records
(``lace.store.records``), NetworkPolicies parsed (2k policies' stored objects are ~6 MiB that no
pass reads once they are parsed); the other kinds are few and kept whole. Services and EndpointSlices
have a cache of their own (``lace.services.cache``), which also keeps their frontends.

Leases are also indexed by the pod they belong to, so a change of one pod finds its addresses
without a walk over every lease (``lace.agent.podsync``).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from lace.policy.parse import parse_policy
from lace.store import kinds as K
from lace.store.api import WatchEvent
from lace.store.cache import ObjectCache
from lace.store.records import RECORDS, LeaseRecord, PodRecord

from .model import by_name, is_pod_container

#: what a pass reads, by plural name (the service cache keeps services and endpointslices)
KINDS = ("networks", "nodes", "ipblocks", "ipleases", "pods", "segments", "namespaces", "networkpolicies")

#: the kinds kept as records: pods and leases slim (lace.store.records), NetworkPolicies parsed as
#: resolution reads them (lace.policy.parse), never the stored objects beside them
KEPT_AS = {**RECORDS, "NetworkPolicy": parse_policy}


def lease_records(node: str) -> Callable[[dict], LeaseRecord]:
    """IPLease records for the agent of ``node``: a pod address of another node keeps no container
    ID, host interface or MAC (its own agent's business; here it is a pod's address, which an
    empty container ID still says — lace.agent.model.is_pod_container). At 10k pods that is 20k
    leases' three strings, ~6 MiB in a real cluster."""
    def convert(obj: dict) -> LeaseRecord:
        rec = LeaseRecord.of(obj)
        if rec.node != node and is_pod_container(rec.container_id):
            return dataclasses.replace(rec, container_id="", host_ifname="", pod_mac="")
        return rec
    return convert


class ClusterCache:
    """The watched kinds' objects (module docstring); readers take ``lock`` for a consistent view."""

    def __init__(self, kinds: Iterable[str] = KINDS, node: str | None = None) -> None:
        """``node``: the agent's own (its cache keeps less of other nodes' leases); None keeps all."""
        self.plurals = tuple(kinds)
        self._kind = {p: K.resolve_kind(p).kind for p in self.plurals}
        self._kept_as = dict(KEPT_AS) if node is None else {
            **KEPT_AS, "IPLease": lease_records(node), "Pod": functools.partial(PodRecord.of, local=node)}
        self._objects = ObjectCache(self._kind.values(), self._kept_as)
        #: pod key -> its leases (a tuple: a pod holds one or two, and 10k dicts of them cost ~2 MiB)
        self._by_pod: dict[str, tuple[LeaseRecord, ...]] = {}
        #: what a pass derives from one record or object and may reuse while it stays the same:
        #: each lease's PodAddress, by lease name (lace.agent.state, which checks it against the
        #: lease), and the policy inputs of each pod (by key) and policy (by namespace and name;
        #: lace.policy.sources), kept while the record is the same object (records are immutable,
        #: and a change replaces an object too); an object's entry goes with it. A pass then
        #: allocates next to nothing for what did not change
        self.lease_memo: dict[str, Any] = {}
        self.pod_inputs_memo: dict[str, tuple] = {}
        self.policy_inputs_memo: dict[tuple, tuple] = {}
        #: kind -> its keys in order, kept until a key comes or goes (a pass reads 10k pods' and
        #: leases' in order; sorting them each time cost ~10 ms a pass)
        self._order: dict[str, list] = {}
        #: segment_ids' answer, kept until a Segment changes (read by every pass, incremental too)
        self._segment_ids: dict[tuple, int] | None = None
        self.lock = threading.RLock()

    @classmethod
    def listed(cls, store: Any, kinds: Iterable[str] = KINDS, node: str | None = None) -> ClusterCache:
        """A cache filled from the store now (an audit reads the store, not the watch's view)."""
        cache = cls(kinds, node)
        cache.list(store)
        return cache

    def list(self, store: Any) -> int:
        """Every kind from a list of it; returns the revision to watch from (the oldest list's:
        events replayed past a newer one change nothing)."""
        revs = []
        for plural in self.plurals:
            # pods and leases become records as they are read: 10k pods' whole objects are never
            # all in memory at once (nor left behind as fragments of the heap)
            result = store.list(plural, convert=self._kept_as.get(self._kind[plural]))
            with self.lock:
                self._objects.replace(self._kind[plural], result.items)
                self._order.pop(self._kind[plural], None)
                self._segment_ids = None
                self.lease_memo.clear()
                self.pod_inputs_memo.clear()
                self.policy_inputs_memo.clear()
                if plural == "ipleases":
                    self._by_pod = {}
                    for lease in self._objects.objects["IPLease"].values():
                        self._by_pod[lease.pod] = (*self._by_pod.get(lease.pod, ()), lease)
            revs.append(int(result.resource_version))
        return min(revs)

    def apply(self, ev: WatchEvent) -> tuple[Any, Any] | None:
        """One watch event: (what the cache held before, what it holds now) for the object's key,
        or None when the event is of a kind this cache does not keep."""
        kind = ev.object.get("kind")
        if kind not in self._objects.objects:
            return None
        return self._change(ev.type, ev.object)

    def learn(self, objs: Iterable[dict]) -> None:
        """Objects this agent has just written or read: kept now, before the watch brings them
        (a newer version the watch brought already stays)."""
        for obj in objs:
            self._change("MODIFIED", obj)

    def forget(self, objs: Iterable[dict]) -> None:
        """Objects this agent has just deleted (as they were before): gone now, before the watch
        brings their deletion."""
        for obj in objs:
            self._change("DELETED", obj)

    def _change(self, event_type: str, obj: dict) -> tuple[Any, Any]:
        kind, key = obj["kind"], K.object_key(obj)
        with self.lock:
            old = self._objects.objects[kind].get(key)
            self._objects.apply(event_type, obj)
            new = self._objects.objects[kind].get(key)
            if (old is None) != (new is None):
                self._order.pop(kind, None)
            if kind == "Segment" and new is not old:
                self._segment_ids = None
            if new is None and kind == "IPLease":
                self.lease_memo.pop(obj["metadata"]["name"], None)
            elif new is None and kind == "Pod":
                self.pod_inputs_memo.pop(key, None)
            elif new is None and kind == "NetworkPolicy":
                meta = obj["metadata"]
                self.policy_inputs_memo.pop((meta.get("namespace"), meta["name"]), None)
            if kind == "IPLease" and new is not old:
                if old is not None:
                    rest = tuple(x for x in self._by_pod.get(old.pod, ()) if x.name != old.name)
                    if rest:
                        self._by_pod[old.pod] = rest
                    else:
                        self._by_pod.pop(old.pod, None)
                if new is not None:
                    mine = self._by_pod.get(new.pod, ())
                    self._by_pod[new.pod] = (*(x for x in mine if x.name != new.name), new)
        return old, new

    def items(self, plural: str) -> list[Any]:
        """Every object (or record) of a kind, in namespace/name order as a list gives them."""
        kind = self._kind[plural]
        with self.lock:
            objs = self._objects.objects[kind]
            order = self._order.get(kind)
            if order is None:
                order = self._order[kind] = sorted(objs)
            return [objs[k] for k in order]

    def network_ids(self) -> dict[str, int]:
        """Network name -> ID, of the networks that have one."""
        return by_name(self._objects.objects["Network"].values())

    def segment_ids(self) -> dict[tuple, int]:
        """(network, namespace, sorted labels) -> ID, of the segments that have one. The same dict
        until a Segment changes: callers read it, never change it."""
        with self.lock:
            if self._segment_ids is None:
                self._segment_ids = {
                    (o["spec"]["network"], o["spec"]["namespace"], tuple(sorted((o["spec"].get("labels") or {}).items()))):
                    int(o["status"]["id"]) for o in self._objects.objects["Segment"].values()
                    if "id" in (o.get("status") or {})}
            return self._segment_ids

    def pods(self) -> dict[str, PodRecord]:
        with self.lock:
            return dict(self._objects.objects["Pod"])

    def pod(self, key: str) -> PodRecord | None:
        return self._objects.objects["Pod"].get(key)

    def leases_of(self, pod: str) -> list[LeaseRecord]:
        """The leases a pod (``namespace/name``) holds."""
        with self.lock:
            return list(self._by_pod.get(pod, ()))
