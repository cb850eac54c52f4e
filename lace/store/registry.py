"""RegistryStore: the Store callers use, composed of any backend, the kinds' rules and the allocators.

Like kube-apiserver's generic registry: this layer owns the API semantics all kinds share (kind
names, namespace defaulting, status as a subresource, generation, optimistic concurrency, apply and
dry run) and runs every call as one backend transaction (``Backend.run``, which may run a call's
body again where the backend's commit lost a race: the bodies keep their effects inside the
transaction), inside which the per-kind rules (``rules.py``) and the allocators (``allocate.py``)
read and write. A backend (``backend.py``)
therefore holds no domain code, and a new one gets every rule by being passed in here.
"""

from __future__ import annotations

import copy
import datetime
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from lace.store import allocate, rules
from lace.store import kinds as K
from lace.store.api import ApplyResult, Heartbeat, Lease, ListResult, Liveness, Selector, Store, Watch
from lace.store.backend import Backend, Transaction
from lace.store.allocate import IPNet
from lace.store.errors import AlreadyExists, Conflict, NotFound, StoreError, ValidationError
from lace.store.selectors import InvalidSelector, matches, parse_selector_string, validate_selector
from lace.store.validation import normalize, object_ref

_META_KEPT = ("uid", "creationTimestamp", "generation", "resourceVersion")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _merge(existing: dict, new: dict) -> dict:
    """existing with new's content (every field but status) and new's labels/annotations."""
    merged = {k: copy.deepcopy(v) for k, v in new.items() if k != "status"}
    meta = merged["metadata"]
    for key in _META_KEPT:
        if key in existing["metadata"]:
            meta[key] = existing["metadata"][key]
    for key in ("labels", "annotations"):
        if not meta.get(key):
            meta.pop(key, None)
    if "status" in existing:
        merged["status"] = copy.deepcopy(existing["status"])
    return merged


def _bump_generation(existing: dict, new: dict) -> None:
    """metadata.generation counts changes of everything but metadata and status."""
    if _content(new) != _content(existing):
        new["metadata"]["generation"] = int(existing["metadata"].get("generation", 1)) + 1


def _check_rv(existing: dict, wanted: Any) -> None:
    have = existing["metadata"]["resourceVersion"]
    if wanted is not None and str(wanted) != have:
        raise Conflict(f"{object_ref(existing)} was modified since you read it "
                       f"(resourceVersion {have}, you had {wanted})",
                       hint="read it again, reapply your change and retry")


def _ns(info: K.KindInfo, namespace: str | None) -> str:
    if not info.namespaced:
        return ""
    return namespace or "default"


def _not_found(info: K.KindInfo, name: str, ns: str) -> NotFound:
    where = f' in namespace "{ns}"' if info.namespaced else ""
    return NotFound(f'{info.kind} "{name}" not found{where}',
                    hint=f"list what exists with `lace get {info.plural}"
                         + (f" -n {ns}`" if info.namespaced else "`"))


def _stored(txn: Transaction, kind: str, name: str, namespace: str | None) -> dict:
    """The object ``kind`` ``name`` as stored (NotFound naming it and how to list what exists)."""
    info = K.resolve_kind(kind)
    ns = _ns(info, namespace)
    obj = txn.get(info.kind, ns, name)
    if obj is None:
        raise _not_found(info, name, ns)
    return obj


class Writer:
    """One backend transaction seen through the rules: what the API and the allocators write with.

    ``finish`` runs the checks a batch may satisfy only once all of it is written (references
    to objects later in the batch); every write path calls it before its transaction commits.
    """

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn
        self._written: list[tuple[dict | None, dict]] = []

    def get(self, kind: str, name: str, namespace: str = "") -> dict | None:
        """The stored object of an exact kind, or None."""
        return self.txn.get(kind, namespace, name)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        """Stored objects of an exact kind, sorted by namespace and name."""
        return self.txn.list(kind, namespace)

    def list_prefix(self, kind: str, prefix: str, namespace: str = "") -> list[dict]:
        """Stored objects of an exact kind whose name starts with ``prefix``, sorted by name."""
        return self.txn.list_prefix(kind, namespace, prefix)

    def prefetch(self, keys: list[tuple[str, str, str]], prefixes: list[tuple[str, str, str]] | None = None) -> None:
        """The backend's read-ahead hint (``Transaction.prefetch``)."""
        self.txn.prefetch(keys, prefixes)

    def next_value(self, counter: str, first: int) -> int:
        """The backend's named counter (for the allocators' IDs)."""
        return self.txn.next_value(counter, first)

    def create(self, obj: Mapping[str, Any]) -> dict:
        """Validate, refuse a taken name, set the store-owned status and metadata, and store it."""
        new = rules.validate(self.txn, obj)
        meta = new["metadata"]
        if self.txn.get(new["kind"], meta.get("namespace", ""), meta["name"]) is not None:
            raise AlreadyExists(f"{object_ref(new)} already exists",
                                hint="use `lace apply` to update it, or delete it first")
        for key in ("labels", "annotations"):   # as _merge does, so a reapply finds it unchanged
            if not meta.get(key):
                meta.pop(key, None)
        # the uid first: allocations made below (a Service's) may name their owner by it
        meta["uid"] = str(uuid.uuid4())
        rules.prepare_for_create(self, new)
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta.pop("resourceVersion", None)
        self._written.append((None, new))
        return self.txn.create(new)

    def apply(self, obj: dict) -> ApplyResult:
        """Create, or update by name keeping status; an unchanged object is not written."""
        meta = obj["metadata"]
        existing = self.txn.get(obj["kind"], meta.get("namespace", ""), meta["name"])
        if existing is None:
            return ApplyResult(self.create(obj), "created")
        return self.update(existing, rules.validate(self.txn, obj))

    def update(self, existing: dict, new: dict) -> ApplyResult:
        """Replace ``existing`` by the validated ``new`` (status and store-set fields kept); an
        unchanged object is not written."""
        merged = _merge(existing, new)
        rules.prepare_for_update(self, existing, merged)
        _bump_generation(existing, merged)
        if merged == existing:
            return ApplyResult(existing, "unchanged")
        return ApplyResult(self.replace(existing, merged), "configured")

    def replace(self, existing: dict, new: dict) -> dict:
        """Store ``new`` over ``existing`` unless a rule refuses the change."""
        rules.guard_update(self.txn, existing, new)
        self._written.append((existing, new))
        return self.txn.update(new)

    def delete(self, obj: dict) -> dict:
        """Delete ``obj`` and what goes with it, unless a rule refuses; returns it as deleted."""
        rules.guard_delete(self.txn, obj)
        for dependent in rules.dependents(self.txn, obj):
            self.delete(dependent)
        deleted = self.txn.delete(obj)
        rules.after_delete(self, obj)
        return deleted

    def finish(self) -> None:
        """The checks that wait for the whole batch (rules.check_written)."""
        for existing, obj in self._written:
            rules.check_written(self, existing, obj)
        self._written.clear()


class RegistryStore(Store):
    """The Store on any Backend: the kinds' rules and the allocators applied in its transactions."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        try:
            # every open makes sure the cluster's built-in objects exist; only a store that lacks
            # one takes the write lock (every CLI call and node command opens the store)
            def missing(txn: Transaction) -> list[dict]:
                return [o for o in rules.builtin_objects()
                        if txn.get(o["kind"], "", o["metadata"]["name"]) is None]

            def create_missing(txn: Transaction) -> None:
                w = Writer(txn)
                for obj in missing(txn):
                    w.create(obj)

            if backend.run(missing, write=False):
                backend.run(create_missing)
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        self.backend.close()

    def keep_alive(self, node: str, ttl: float, holder: str) -> Heartbeat:
        if not node:
            raise ValidationError("liveness", "node", "is empty", "name the node the agent runs on")
        if ttl <= 0:
            raise ValidationError(f'liveness of node "{node}"', "ttl", f"{ttl} is not positive",
                                  "give the seconds a renewal may be late before the node counts as down")
        return self.backend.hold_liveness(node, ttl, holder)

    def node_liveness(self) -> dict[str, Liveness]:
        return self.backend.liveness()

    def compact(self, keep: int | None = None) -> int:
        """Drop all but the newest ``keep`` events (default: the backend's); returns the compaction mark."""
        return self.backend.compact(keep)

    def revision(self) -> int:
        return self.backend.revision()

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        return self.backend.run(lambda txn: _stored(txn, kind, name, namespace), write=False)

    def list(self, kind: str, namespace: str | None = None,
             label_selector: Selector = None, *, convert: Callable[[dict], Any] | None = None) -> ListResult:
        info = K.resolve_kind(kind)
        selector: Mapping[str, Any] | None = None
        if isinstance(label_selector, str):
            try:
                selector = parse_selector_string(label_selector)
            except InvalidSelector as err:
                raise ValidationError("label selector", None, err.problem) from None
        elif label_selector is not None:
            try:
                validate_selector(label_selector, "labelSelector")
            except InvalidSelector as err:
                raise ValidationError("label selector", err.field, err.problem) from None
            selector = label_selector
        def body(txn: Any) -> tuple[list, int]:
            items = []
            for o in txn.each(info.kind, namespace if info.namespaced else None):
                if selector is None or matches(selector, o["metadata"].get("labels") or {}):
                    items.append(convert(o) if convert is not None else o)
            return items, txn.revision()
        items, rv = self.backend.run(body, write=False)
        return ListResult(items, str(rv))

    def create(self, obj: Mapping[str, Any]) -> dict:
        def body(txn: Transaction) -> dict:
            w = Writer(txn)
            created = w.create(dict(obj))
            w.finish()
            return created

        return self.backend.run(body)

    def apply_all(self, objs: Iterable[Mapping[str, Any]], *, dry_run: bool = False) -> list[ApplyResult]:
        normalized: list[dict] = []
        seen: dict[tuple[str, str, str], int] = {}
        for i, obj in enumerate(objs):
            try:
                norm = normalize(obj)
            except ValidationError as err:
                err.index = i
                raise
            meta = norm["metadata"]
            key = (norm["kind"], meta.get("namespace", ""), meta["name"])
            if key in seen:
                err = ValidationError(object_ref(norm), "metadata.name",
                                      f"appears twice in one apply (objects {seen[key] + 1} and {i + 1})",
                                      "keep one of them")
                err.index = i
                raise err
            seen[key] = i
            normalized.append(norm)
        order = sorted(range(len(normalized)), key=lambda i: K.APPLY_ORDER[normalized[i]["kind"]])

        keys = [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in normalized]

        def body(txn: Transaction) -> list[ApplyResult]:
            results: list[ApplyResult | None] = [None] * len(normalized)
            txn.prefetch(keys)     # every object's stored self, in one read where that is a round trip
            w = Writer(txn)
            for i in order:
                try:
                    # a copy: the rules may fill in the object, and a retried body starts afresh
                    results[i] = w.apply(copy.deepcopy(normalized[i]))
                except StoreError as err:
                    if isinstance(err, ValidationError):
                        err.index = i
                    raise
            try:
                w.finish()
            except ValidationError as err:
                err.index = next((i for i, o in enumerate(normalized) if object_ref(o) == err.ref), None)
                raise
            return [r for r in results if r is not None]

        return self.backend.run(body, dry_run=dry_run)

    def update(self, obj: Mapping[str, Any]) -> dict:
        new_meta = (obj.get("metadata") or {}) if isinstance(obj, Mapping) else {}
        wanted_rv = new_meta.get("resourceVersion")

        def body(txn: Transaction) -> dict:
            new = rules.validate(txn, obj)
            meta = new["metadata"]
            info = K.kind_info(new["kind"])
            existing = txn.get(new["kind"], meta.get("namespace", ""), meta["name"])
            if existing is None:
                raise _not_found(info, meta["name"], meta.get("namespace", ""))
            _check_rv(existing, wanted_rv)
            w = Writer(txn)
            result = w.update(existing, new)
            w.finish()
            return result.object

        return self.backend.run(body)

    def update_status(self, kind: str, name: str, namespace: str | None, status: Mapping[str, Any],
                      resource_version: str | None = None) -> dict:
        info = K.resolve_kind(kind)

        def body(txn: Transaction) -> dict:
            existing = _stored(txn, kind, name, namespace)
            _check_rv(existing, resource_version)
            new_status = copy.deepcopy(dict(status))
            for key in rules.OWNED_STATUS.get(info.kind, ()):
                if key in (existing.get("status") or {}):
                    new_status[key] = existing["status"][key]
            candidate = copy.deepcopy(existing)
            candidate["status"] = new_status
            rules.validate(txn, candidate)
            if candidate == existing:
                return existing
            return txn.update(candidate)

        return self.backend.run(body)

    def delete(self, kind: str, name: str, namespace: str | None = None, *,
               grace_period: int | None = 0, uid: str | None = None) -> dict:
        def body(txn: Transaction) -> dict:
            obj = _stored(txn, kind, name, namespace)
            if uid is not None and obj["metadata"].get("uid") != uid:
                raise Conflict(f'{object_ref(obj)} is another object than the one meant (uid '
                               f'{obj["metadata"].get("uid")}, not {uid})',
                               hint="it was deleted and created again: read it again")
            grace = rules.grace_period(obj, grace_period)
            if grace > 0:
                if not rules.mark_deleted(obj, grace):
                    return obj
                return txn.update(obj)
            return Writer(txn).delete(obj)

        return self.backend.run(body)

    def watch(self, kinds: list[str] | None = None, since: int | str | None = None,
              timeout: float | None = None) -> Watch:
        names = None if kinds is None else sorted({K.resolve_kind(k).kind for k in kinds})
        return self.backend.watch(names, None if since is None else int(since), timeout)

    # ---- allocators (allocate.py), each one transaction ---------------------------------------

    def allocate_segment(self, network: str, namespace: str, labels: Mapping[str, str]) -> int:
        return self.backend.run(
            lambda txn: allocate.allocate_segment(Writer(txn), network, namespace, labels))

    def allocate_block(self, network: str, node: str, family: int | str, prefixlen: int,
                       *, additional: bool = False) -> str:
        return self.backend.run(
            lambda txn: allocate.allocate_block(Writer(txn), network, node, family, prefixlen,
                                                additional=additional))

    def leases_for(self, node: str, container_id: str) -> list[dict]:
        return self.backend.run(lambda txn: allocate.leases_for(Writer(txn), node, container_id),
                                write=False)

    def allocate_leases(self, network: str, node: str, cidrs: Sequence[IPNet], pod: str,
                        container_id: str, ifname: str, annotations: Mapping[str, str] | None = None) -> list[Lease]:
        # one transaction: the container's leases, else every family's new one, with one commit
        # (and one wake-up of every watcher) per pod; both read the same blocks' leases once
        def body(txn: Transaction) -> list[Lease]:
            w = Writer(txn)
            seen = allocate.BlockLeases(w)
            existing = allocate.leases_for(w, node, container_id, seen)
            if existing:
                held = []
                for o in existing:   # a retried ADD of a container whose leases lack what it asks for now
                    ann = o["metadata"].get("annotations") or {}
                    if annotations and any(ann.get(k) != v for k, v in annotations.items()):
                        changed = copy.deepcopy(o)
                        changed["metadata"]["annotations"] = {**ann, **annotations}
                        o = w.update(o, rules.validate(txn, changed)).object
                    held.append(allocate.lease_of(o))
                return held
            return [allocate.allocate_lease(w, network, [c for c in cidrs if c.version == version], node, pod,
                                            container_id, ifname, annotations, seen)
                    for version in sorted({c.version for c in cidrs})]

        return self.backend.run(body)

    def release_leases(self, node: str, container_id: str) -> list[dict]:
        leases = self.leases_for(node, container_id)
        self._delete_leases([o["metadata"]["name"] for o in leases])
        return leases

    def _delete_leases(self, names: list[str]) -> None:
        # each its own write, as `delete` would; one already gone is what we wanted anyway
        for name in names:
            try:
                self.delete("IPLease", name)
            except NotFound:
                pass
