"""The Store on a Kubernetes cluster: the apiserver's own objects, and lace's kinds as CRDs.

``KubernetesStore`` is the same ``RegistryStore`` the lab uses (``registry.py``), over a
``KubernetesBackend``; the agent, the CLI and the operator read it through the one ``Store``
interface, so turning Pods, Nodes, Services, EndpointSlices and NetworkPolicies into the agent's
desired state is the lab's code path, not a copy.

**What the platform owns.** In the lab the store *is* the API: lace validates Pods and Services,
allocates ClusterIPs and NodePorts (``allocate.py``) and its EndpointSlice controller writes
slices. On Kubernetes the apiserver validates and allocates, and the controller manager writes
EndpointSlices, so for ``APISERVER_KINDS`` this store is a pass-through: it reads them as the
apiserver serves them and sends writes (``lace apply -f pod.yaml``) to the apiserver unchanged;
lace's rules and allocators run only for lace's own kinds (Networks, Segments, IPBlocks,
IPLeases, ...), which live in CRDs (``deploy/crds``). That is the whole configuration difference
(``StoreConfig.platform``): the same code decides, with the apiserver in place of lace for what it
owns.

**Transactions.** The apiserver has no multi-object transaction, so a lace transaction here reads
the local cache (``kubernetes_cache.py``: a list + watch reflector per kind) and sends each write
as it is made, with the apiserver's own guards: a create fails if the name is taken, an update or
delete carries the resourceVersion (and uid) it read. Allocation records are named after what they
hold (``IPBlock`` per CIDR, ``IPLease`` per address, ``Segment`` per identity), so two nodes
allocating at once collide on a name and one of them runs its transaction again on fresher data —
the race-freedom the etcd backend gets from the compares of its commits. A read of the names with
one prefix (``list_prefix``: the leases of one address block) filters the cache by name before
copying anything; the apiserver itself has no such query (a field selector on ``metadata.name``
matches whole names only). A transaction that fails after
writing undoes its writes (best effort: deletes what it created, restores what it updated).
Counters (network and segment IDs) live in one ConfigMap (``lace-counters``) updated with its
resourceVersion; a counter is never rolled back, so a failed transaction may skip an ID (IDs are
never reused anyway). After a write the transaction waits (briefly) for its own watch to bring the
write back, so the next read sees it.

**Liveness** of nodes is a coordination.k8s.io Lease per node (``lace-node-<node>`` in lace's
namespace), as the kubelet's own node heartbeat.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from lace.store import kinds as K
from lace.store.api import ApplyResult, Heartbeat, Liveness, Watch
from lace.store.backend import Backend, Transaction
from lace.store.errors import AlreadyExists, Conflict, NotFound, StoreError, Unavailable
from lace.store.kubernetes_cache import Backoff, Cache, CacheWatch, Reflector
from lace.store.kubernetes_client import (CONFIG_MAPS, LEASES, ApiServer, Resource, format_micro_time,
                                          load_api_client, parse_micro_time)
from lace.store.registry import RegistryStore
from lace.store.validation import normalize, object_ref

log = logging.getLogger("lace.store.kubernetes")
T = TypeVar("T")

#: the kinds the apiserver validates and allocates for itself (and the controller manager writes,
#: for EndpointSlices): this store reads and forwards them, lace's rules do not apply
APISERVER_KINDS = frozenset(k.kind for k in K.KINDS if k.api_version != K.LACE_API_VERSION)
#: lace's kinds whose CRD has a status subresource: users write these (kubectl apply must not
#: clobber the store-allocated status.id); allocation records are written whole by lace
STATUS_SUBRESOURCE = frozenset({"Network"})
#: lace's own namespace: counters, node liveness Leases, the operator's leader Lease
DEFAULT_NAMESPACE = "lace-system"
COUNTERS_CONFIGMAP = "lace-counters"
LIVENESS_LABEL = "lace.dev/liveness"
LIVENESS_PREFIX = "lace-node-"
#: a transaction that lost a race to another writer runs again up to this many times
MAX_ATTEMPTS = 32
#: how long a writer waits for its write to come back through the watch before reading on
READ_YOUR_WRITE_SECONDS = 5.0
_SERVER_META = ("uid", "creationTimestamp", "generation", "resourceVersion", "managedFields",
                "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds")


class _LostRace(Exception):
    """A write met a newer object than the transaction read: run it again once the cache has it."""

    def __init__(self, resource: Resource, namespace: str, name: str) -> None:
        self.resource, self.namespace, self.name = resource, namespace, name


def _ref(kind: str, namespace: str, name: str) -> str:
    return f'{kind} "{namespace}/{name}"' if namespace else f'{kind} "{name}"'


def _for_create(obj: Mapping[str, Any]) -> dict:
    """``obj`` without what the apiserver sets itself (uid, timestamps, versions)."""
    body = copy.deepcopy(dict(obj))
    meta = body.setdefault("metadata", {})
    for key in _SERVER_META:
        meta.pop(key, None)
    return body


class KubernetesTransaction(Transaction):
    """Reads from the cache (plus this transaction's own writes), writes straight to the apiserver."""

    def __init__(self, backend: KubernetesBackend, *, write: bool, dry_run: bool) -> None:
        self.backend = backend
        self.write = write
        self.dry_run = dry_run
        self.overlay: dict[tuple[str, str, str], dict | None] = {}
        #: what was written, to undo: (created object | None, object before the write)
        self.undo: list[tuple[str, dict | None, dict | None]] = []
        #: the cache's revision before this transaction's first read (see ``revision``)
        self._revision: int | None = None

    def _snapshot(self) -> None:
        """Take the cache's revision now, once, before the first read: the reflectors keep
        applying events while the transaction reads, so a revision taken after a read could
        cover an event that read missed, and a watch from it would skip that event; one taken
        before may only replay what was read (harmless: watchers apply events idempotently)."""
        if self._revision is None:
            cache = self.backend.cache
            with cache.cond:
                self._revision = cache.revision

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        key = (kind, namespace, name)
        if key in self.overlay:
            obj = self.overlay[key]
            return copy.deepcopy(obj) if obj is not None else None
        self.backend.ensure_synced(kind)
        self._snapshot()
        return self.backend.cache.get(kind, namespace, name)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        self.backend.ensure_synced(kind)
        self._snapshot()
        return self._with_overlay(kind, namespace, "", self.backend.cache.list(kind, namespace))

    def list_prefix(self, kind: str, namespace: str, prefix: str) -> list[dict]:
        # the cache filters names before copying: the apiserver itself has no name-prefix query
        # (a field selector on metadata.name matches whole names only)
        self.backend.ensure_synced(kind)
        self._snapshot()
        return self._with_overlay(kind, namespace, prefix,
                                  self.backend.cache.list(kind, namespace, prefix))

    def _with_overlay(self, kind: str, namespace: str | None, prefix: str, cached: list[dict]) -> list[dict]:
        """``cached`` with this transaction's own writes of that kind, namespace and prefix."""
        objs = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in cached}
        for (k, ns, name), obj in self.overlay.items():
            if k != kind or (namespace is not None and ns != namespace) or not name.startswith(prefix):
                continue
            if obj is None:
                objs.pop((ns, name), None)
            else:
                objs[(ns, name)] = copy.deepcopy(obj)
        return [objs[k] for k in sorted(objs)]

    def _remember(self, obj: dict | None, kind: str, namespace: str, name: str) -> None:
        self.overlay[(kind, namespace, name)] = copy.deepcopy(obj) if obj is not None else None

    def create(self, obj: dict) -> dict:
        stored = self.backend.create(obj, dry_run=self.dry_run)
        meta = stored["metadata"]
        self._remember(stored, stored["kind"], meta.get("namespace", ""), meta["name"])
        self.undo.append(("create", stored, None))
        return copy.deepcopy(stored)

    def update(self, obj: dict) -> dict:
        meta = obj["metadata"]
        before = self.get(obj["kind"], meta.get("namespace", ""), meta["name"])
        stored = self.backend.update(obj, before, dry_run=self.dry_run)
        self._remember(stored, stored["kind"], meta.get("namespace", ""), meta["name"])
        self.undo.append(("update", stored, before))
        return copy.deepcopy(stored)

    def delete(self, obj: dict) -> dict:
        meta = obj["metadata"]
        self.backend.delete(obj, dry_run=self.dry_run)
        self._remember(None, obj["kind"], meta.get("namespace", ""), meta["name"])
        self.undo.append(("delete", None, obj))
        return copy.deepcopy(obj)

    def revision(self) -> int:
        """The cache's revision before this transaction's first read: every change up to it is
        in what the transaction read, so a watch from it misses nothing."""
        self._snapshot()
        assert self._revision is not None
        return self._revision

    def next_value(self, counter: str, first: int) -> int:
        return self.backend.next_counter(counter, first, dry_run=self.dry_run)

    def rollback(self) -> None:
        """Undo this transaction's writes, newest first (best effort: logged, never raised)."""
        if self.dry_run:
            return
        for action, after, before in reversed(self.undo):
            try:
                if action == "create" and after is not None:
                    self.backend.delete(after, dry_run=False, wait=False)
                elif action == "update" and after is not None and before is not None:
                    restored = copy.deepcopy(before)
                    restored["metadata"]["resourceVersion"] = after["metadata"]["resourceVersion"]
                    self.backend.update(restored, after, dry_run=False, wait=False)
                elif action == "delete" and before is not None:
                    self.backend.create(before, dry_run=False, wait=False)
            except StoreError as err:
                ref = object_ref(after or before or {})
                log.warning("could not undo the %s of %s after a failed transaction: %s", action, ref, err)
        self.undo.clear()


class KubernetesBackend(Backend):
    """Objects on an apiserver: reads from reflector caches, writes through the REST API."""

    def __init__(self, api: ApiServer, *, namespace: str = DEFAULT_NAMESPACE,
                 watch_timeout: int | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.cache = Cache()
        self.reflectors: dict[str, Reflector] = {}
        self._sync_lock = threading.Lock()
        self._reflector_kw: dict[str, Any] = {} if watch_timeout is None else {"watch_timeout": watch_timeout}
        self._closed = False

    # ---- the cache ---------------------------------------------------------------------------

    def ensure_synced(self, kind: str) -> Reflector:
        """The kind's reflector, listing it now on first use (Unavailable if the apiserver is not
        reachable: there is nothing cached to answer from yet)."""
        reflector = self.reflectors.get(kind)
        if reflector is not None:
            return reflector
        with self._sync_lock:
            reflector = self.reflectors.get(kind)
            if reflector is None:
                if self._closed:
                    raise Unavailable("the Kubernetes store was closed")
                reflector = Reflector(self.api, Resource.of(kind), self.cache, **self._reflector_kw)
                reflector.start()
                self.reflectors[kind] = reflector
        return reflector

    def _await(self, kind: str, resource_version: str | None) -> None:
        """Wait until the kind's watch has brought ``resource_version`` back (read your writes)."""
        reflector = self.reflectors.get(kind)
        if reflector is None or not resource_version:
            return
        if not reflector.wait_for(resource_version, READ_YOUR_WRITE_SECONDS):
            log.warning("the %s watch has not caught up with resourceVersion %s after %.0fs: reads may "
                        "be stale (%s)", Resource.of(kind).plural, resource_version,
                        READ_YOUR_WRITE_SECONDS, reflector.error or "no error reported")

    # ---- writes ------------------------------------------------------------------------------

    def _query(self, dry_run: bool) -> dict[str, Any]:
        return {"dryRun": "All"} if dry_run else {}

    def create(self, obj: Mapping[str, Any], *, dry_run: bool, wait: bool = True) -> dict:
        """POST ``obj``; a lace kind with a status subresource gets its status in a second call."""
        res = Resource.of(obj["kind"])
        meta = obj["metadata"]
        ns, name = meta.get("namespace", "") if res.namespaced else "", meta["name"]
        body = _for_create(obj)
        status = body.pop("status", None) if res.kind in STATUS_SUBRESOURCE else None
        try:
            stored = self.api.request("POST", res.path(ns or None), query=self._query(dry_run), body=body,
                                      what=_ref(res.kind, ns, name))
        except AlreadyExists:
            raise _LostRace(res, ns, name) from None
        stored.setdefault("apiVersion", res.api_version)
        stored.setdefault("kind", res.kind)
        if status is not None and not dry_run:
            stored["status"] = status
            stored = self.api.request("PUT", res.path(ns or None, name, "status"), body=stored,
                                      what=f"the status of {_ref(res.kind, ns, name)}")
        elif status is not None:
            stored["status"] = status
        if wait and not dry_run:
            self._await(res.kind, stored["metadata"].get("resourceVersion"))
        return stored

    def update(self, obj: Mapping[str, Any], before: Mapping[str, Any] | None, *, dry_run: bool,
               wait: bool = True) -> dict:
        """PUT ``obj`` with the resourceVersion it carries (Conflict on the apiserver: a lost race)."""
        res = Resource.of(obj["kind"])
        meta = obj["metadata"]
        ns, name = meta.get("namespace", "") if res.namespaced else "", meta["name"]
        what = _ref(res.kind, ns, name)
        body = copy.deepcopy(dict(obj))
        stored: dict = body
        try:
            if res.kind in STATUS_SUBRESOURCE and before is not None:
                strip = lambda o: {k: v for k, v in o.items() if k not in ("status", "metadata")}  # noqa: E731
                content_changed = (strip(body) != strip(dict(before))
                                   or body["metadata"].get("labels") != before["metadata"].get("labels")
                                   or body["metadata"].get("annotations") != before["metadata"].get("annotations"))
                status_changed = body.get("status") != before.get("status")
                if content_changed or not status_changed:
                    stored = self.api.request("PUT", res.path(ns or None, name), query=self._query(dry_run),
                                              body=body, what=what)
                    body["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
                if status_changed:
                    stored = self.api.request("PUT", res.path(ns or None, name, "status"),
                                              query=self._query(dry_run), body=body,
                                              what=f"the status of {what}")
            else:
                stored = self.api.request("PUT", res.path(ns or None, name), query=self._query(dry_run),
                                          body=body, what=what)
        except (Conflict, NotFound):
            raise _LostRace(res, ns, name) from None
        stored.setdefault("apiVersion", res.api_version)
        stored.setdefault("kind", res.kind)
        if wait and not dry_run:
            self._await(res.kind, stored["metadata"].get("resourceVersion"))
        return stored

    def delete(self, obj: Mapping[str, Any], *, dry_run: bool, wait: bool = True,
               grace_period: int | None = 0) -> dict:
        """DELETE with the uid and resourceVersion read as preconditions."""
        res = Resource.of(obj["kind"])
        meta = obj["metadata"]
        ns, name = meta.get("namespace", "") if res.namespaced else "", meta["name"]
        preconditions = {k: meta[k] for k in ("uid", "resourceVersion") if meta.get(k)}
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if preconditions:
            body["preconditions"] = preconditions
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if dry_run:
            body["dryRun"] = ["All"]
        try:
            out = self.api.request("DELETE", res.path(ns or None, name), body=body,
                                   what=_ref(res.kind, ns, name))
        except (Conflict, NotFound):
            raise _LostRace(res, ns, name) from None
        if wait and not dry_run:
            rv = (out.get("metadata") or {}).get("resourceVersion") if out.get("kind") != "Status" else None
            self._await(res.kind, rv)
        return out

    def next_counter(self, counter: str, first: int, *, dry_run: bool) -> int:
        """The counter's next value from the ``lace-counters`` ConfigMap, advanced with its
        resourceVersion as the guard (a lost race runs the transaction again)."""
        path = CONFIG_MAPS.path(self.namespace, COUNTERS_CONFIGMAP)
        what = f'ConfigMap "{self.namespace}/{COUNTERS_CONFIGMAP}" (lace\'s ID counters)'
        try:
            cm: dict | None = self.api.request("GET", path, what=what)
        except NotFound:
            cm = None
        data = dict((cm or {}).get("data") or {})
        value = int(data.get(counter, first))
        if dry_run:
            return value
        data[counter] = str(value + 1)
        try:
            if cm is None:
                self.api.request("POST", CONFIG_MAPS.path(self.namespace), what=what, body={
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": COUNTERS_CONFIGMAP, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/part-of": "lace"}},
                    "data": data})
            else:
                cm["data"] = data
                self.api.request("PUT", path, body=cm, what=what)
        except (AlreadyExists, Conflict):
            raise _LostRace(CONFIG_MAPS, self.namespace, COUNTERS_CONFIGMAP) from None
        return value

    # ---- Backend ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, *, write: bool = True, dry_run: bool = False) -> Iterator[KubernetesTransaction]:
        txn = KubernetesTransaction(self, write=write, dry_run=dry_run)
        try:
            yield txn
        except BaseException:
            txn.rollback()
            raise

    def run(self, body: Callable[[Transaction], T], *, write: bool = True, dry_run: bool = False) -> T:
        backoff = Backoff(0.01, 1.0)
        for _ in range(MAX_ATTEMPTS):
            try:
                with self.transaction(write=write, dry_run=dry_run) as txn:
                    return body(txn)
            except _LostRace as race:
                self._catch_up(race)
            time.sleep(backoff.next())
        raise Unavailable(f"the apiserver at {self.api.where}: a write lost the race to other writers "
                          f"{MAX_ATTEMPTS} times in a row", hint="the cluster is under heavy write contention; retry")

    def _catch_up(self, race: _LostRace) -> None:
        """Before running a transaction again: let the cache reach what the apiserver has now."""
        if race.resource.kind not in K.BY_KIND:
            return   # the counters' ConfigMap is read live
        try:
            current = self.api.request("GET", race.resource.path(race.namespace or None, race.name),
                                       what=_ref(race.resource.kind, race.namespace, race.name))
        except NotFound:
            # gone on the apiserver: wait for the cache to drop it
            deadline = time.monotonic() + READ_YOUR_WRITE_SECONDS
            while (self.cache.get(race.resource.kind, race.namespace, race.name) is not None
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            return
        self._await(race.resource.kind, (current.get("metadata") or {}).get("resourceVersion"))

    def watch(self, kinds: list[str] | None, since: int | None, timeout: float | None) -> Watch:
        for kind in kinds if kinds is not None else list(K.BY_KIND):
            self.ensure_synced(kind)
        start = self.cache.revision if since is None else since
        return CacheWatch(self.cache, None if kinds is None else set(kinds), start, timeout)

    def revision(self) -> int:
        return self.cache.revision

    def compact(self, keep: int | None = None) -> int:
        return self.cache.compacted   # the log is bounded by itself; the apiserver compacts its own

    def hold_liveness(self, name: str, ttl: float, holder: str) -> Heartbeat:
        return LeaseHeartbeat(self, name, ttl, holder)

    def liveness(self) -> dict[str, Liveness]:
        out = self.api.request("GET", LEASES.path(self.namespace), query={"labelSelector": f"{LIVENESS_LABEL}=node"},
                               what=f"the node liveness Leases in namespace {self.namespace}")
        now = datetime.datetime.now(datetime.UTC)
        held: dict[str, Liveness] = {}
        for lease in out.get("items") or ():
            spec = lease.get("spec") or {}
            renewed = parse_micro_time(spec.get("renewTime"))
            duration = spec.get("leaseDurationSeconds")
            node = (lease.get("metadata") or {}).get("labels", {}).get(K.NODE_LABEL)
            if not node or renewed is None or not duration or not spec.get("holderIdentity"):
                continue
            if renewed + datetime.timedelta(seconds=duration) > now:
                held[node] = Liveness(node, spec["holderIdentity"], float(duration))
        return held

    def close(self) -> None:
        self._closed = True
        with self._sync_lock:
            reflectors = list(self.reflectors.values())
        for r in reflectors:
            r.stop()
        for r in reflectors:
            r.join(2.0)
        self.cache.close()
        with contextlib.suppress(Exception):
            self.api.client.close()


class LeaseHeartbeat(Heartbeat):
    """A node's liveness as a coordination.k8s.io Lease: ``holderIdentity``, ``renewTime`` and
    ``leaseDurationSeconds`` (``ttl`` rounded up; Leases count whole seconds)."""

    def __init__(self, backend: KubernetesBackend, name: str, ttl: float, holder: str) -> None:
        self.backend, self.name, self.ttl, self.holder = backend, name, ttl, holder
        self.lease_name = LIVENESS_PREFIX + name
        self._path = LEASES.path(backend.namespace, self.lease_name)
        self._what = f'the liveness Lease "{backend.namespace}/{self.lease_name}" of node "{name}"'
        self.renew()

    def renew(self) -> bool:
        api = self.backend.api
        try:
            lease: dict | None = api.request("GET", self._path, what=self._what)
        except NotFound:
            lease = None
        spec = (lease or {}).get("spec") or {}
        renewed = parse_micro_time(spec.get("renewTime"))
        now = datetime.datetime.now(datetime.UTC)
        still_held = (lease is not None and spec.get("holderIdentity") == self.holder and renewed is not None
                      and renewed + datetime.timedelta(seconds=spec.get("leaseDurationSeconds") or 0) > now)
        new_spec = {"holderIdentity": self.holder, "leaseDurationSeconds": max(1, math.ceil(self.ttl)),
                    "renewTime": format_micro_time()}
        if not still_held:
            new_spec["acquireTime"] = new_spec["renewTime"]
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        else:
            new_spec["acquireTime"] = spec.get("acquireTime") or new_spec["renewTime"]
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0)
        try:
            if lease is None:
                api.request("POST", LEASES.path(self.backend.namespace), what=self._what, body={
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.lease_name, "namespace": self.backend.namespace,
                                 "labels": {LIVENESS_LABEL: "node", K.NODE_LABEL: self.name}},
                    "spec": new_spec})
            else:
                lease["spec"] = new_spec
                api.request("PUT", self._path, body=lease, what=self._what)
        except (AlreadyExists, Conflict):
            # another renewal of the same record got there first: it is held, by someone
            return still_held
        return still_held

    def release(self) -> None:
        with contextlib.suppress(StoreError):
            self.backend.api.request("DELETE", self._path, what=self._what)


class KubernetesStore(RegistryStore):
    """The Store on a Kubernetes cluster (see the module docstring)."""

    backend: KubernetesBackend

    def __init__(self, api: ApiServer, *, namespace: str = DEFAULT_NAMESPACE,
                 watch_timeout: int | None = None) -> None:
        # not RegistryStore.__init__: the cluster's built-in objects (the default Network) are the
        # operator's to create (ensure_builtins); agents and the CLI lack the RBAC, and need not
        self.backend = KubernetesBackend(api, namespace=namespace, watch_timeout=watch_timeout)

    @classmethod
    def connect(cls, *, kubeconfig: str | None = None, context: str | None = None,
                namespace: str = DEFAULT_NAMESPACE, netns: str | None = None,
                timeout: float | None = None) -> KubernetesStore:
        """Open the cluster a kubeconfig context names (in-cluster config inside a pod)."""
        client, host = load_api_client(kubeconfig=kubeconfig, context=context)
        kw = {} if timeout is None else {"timeout": timeout}
        where = host + (f" (context {context})" if context else "")
        return cls(ApiServer(client, where=where, netns=netns, **kw), namespace=namespace)

    @property
    def api(self) -> ApiServer:
        return self.backend.api

    def ensure_builtins(self) -> list[dict]:
        """Create the lace objects every cluster has (the default Network); the operator's job."""
        from lace.store import rules
        made = []
        for obj in rules.builtin_objects():
            if obj["kind"] in APISERVER_KINDS:
                continue   # Namespaces and the ServiceCIDR are the apiserver's
            try:
                made.append(super().create(obj))
            except AlreadyExists:
                pass
        return made

    # ---- the apiserver's kinds pass through --------------------------------------------------

    def create(self, obj: Mapping[str, Any]) -> dict:
        if obj.get("kind") in APISERVER_KINDS:
            norm = normalize(obj)
            try:
                return self.backend.create(norm, dry_run=False)
            except _LostRace:
                raise AlreadyExists(f"{object_ref(norm)} already exists",
                                    hint="use `lace apply` to update it") from None
        return super().create(obj)

    def apply_all(self, objs: Iterable[Mapping[str, Any]], *, dry_run: bool = False) -> list[ApplyResult]:
        objs = list(objs)
        platform = [i for i, o in enumerate(objs) if isinstance(o, Mapping) and o.get("kind") in APISERVER_KINDS]
        if not platform:
            return super().apply_all(objs, dry_run=dry_run)
        results: dict[int, ApplyResult] = {}
        ours = [i for i in range(len(objs)) if i not in set(platform)]
        order = sorted(platform, key=lambda i: K.APPLY_ORDER[objs[i]["kind"]])
        # the apiserver's kinds first (lace's objects may refer to them: a Network importing a Service)
        for i in order:
            results[i] = self._apply_platform(normalize(objs[i]), dry_run)
        if ours:
            for i, r in zip(ours, super().apply_all([objs[i] for i in ours], dry_run=dry_run)):
                results[i] = r
        return [results[i] for i in range(len(objs))]

    def _apply_platform(self, obj: dict, dry_run: bool) -> ApplyResult:
        def body(txn: Transaction) -> ApplyResult:
            meta = obj["metadata"]
            existing = txn.get(obj["kind"], meta.get("namespace", ""), meta["name"])
            if existing is None:
                return ApplyResult(self.backend.create(obj, dry_run=dry_run), "created")
            merged = copy.deepcopy(obj)
            merged["metadata"] = {**existing["metadata"], "labels": meta.get("labels") or {},
                                  "annotations": meta.get("annotations") or {}}
            if "status" in existing:
                merged["status"] = existing["status"]
            if {k: v for k, v in merged.items() if k != "metadata"} == \
                    {k: v for k, v in existing.items() if k != "metadata"} and \
                    merged["metadata"] == existing["metadata"]:
                return ApplyResult(existing, "unchanged")
            return ApplyResult(self.backend.update(merged, existing, dry_run=dry_run), "configured")

        return self.backend.run(body, dry_run=dry_run)

    def update(self, obj: Mapping[str, Any]) -> dict:
        if obj.get("kind") not in APISERVER_KINDS:
            return super().update(obj)
        norm = normalize(obj)
        try:
            return self.backend.update(norm, None, dry_run=False)
        except _LostRace:
            raise Conflict(f"{object_ref(norm)} was modified since you read it, or is gone",
                           hint="read it again, reapply your change and retry") from None

    def update_status(self, kind: str, name: str, namespace: str | None, status: Mapping[str, Any],
                      resource_version: str | None = None) -> dict:
        info = K.resolve_kind(kind)
        if info.kind not in APISERVER_KINDS:
            return super().update_status(kind, name, namespace, status, resource_version)
        obj = self.get(kind, name, namespace)
        if resource_version is not None:
            obj["metadata"]["resourceVersion"] = resource_version
        obj["status"] = dict(status)
        res = Resource.of(info.kind)
        ns = obj["metadata"].get("namespace", "")
        return self.api.request("PUT", res.path(ns or None, name, "status"), body=obj,
                                what=f"the status of {_ref(info.kind, ns, name)}")

    def delete(self, kind: str, name: str, namespace: str | None = None, *,
               grace_period: int | None = 0, uid: str | None = None) -> dict:
        info = K.resolve_kind(kind)
        if info.kind not in APISERVER_KINDS:
            return super().delete(kind, name, namespace, grace_period=grace_period, uid=uid)
        obj = self.get(kind, name, namespace)
        if uid is not None:
            obj["metadata"]["uid"] = uid
        obj["metadata"].pop("resourceVersion", None)
        try:
            self.backend.delete(obj, dry_run=False, grace_period=grace_period)
        except _LostRace:
            raise Conflict(f"{object_ref(obj)} is another object than the one meant, or already gone",
                           hint="read it again") from None
        return obj


def open_kubernetes(*, kubeconfig: str | None, context: str | None, namespace: str,
                    netns: str | None) -> KubernetesStore:
    """``open_store``'s entry for ``k8s://`` specs."""
    return KubernetesStore.connect(kubeconfig=kubeconfig, context=context, namespace=namespace, netns=netns)


__all__ = ["APISERVER_KINDS", "DEFAULT_NAMESPACE", "KubernetesBackend", "KubernetesStore",
           "KubernetesTransaction", "LeaseHeartbeat", "STATUS_SUBRESOURCE", "open_kubernetes"]
