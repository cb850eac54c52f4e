"""The EndpointSlice controller's loop: watch the store, keep a cache, write only differences.

Level-triggered, like Kubernetes' controllers: a watcher thread lists Services, Pods and
EndpointSlices and then streams their events into a queue (relisting when the watch falls behind
compaction); the loop drains the queue, updates its cache, marks the Services an event can affect
(the Service itself, the Services selecting a pod before or after the change, the owner of a
slice) and reconciles each: desired slices from ``endpointslices.desired_slices``, compared with
the stored ones, written in one batch, and the slices it manages that are no longer wanted
deleted. Everything is also resynced every ``resync`` seconds, so a missed event or a failed
write heals. A restarted controller recomputes everything and writes nothing that is already right.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from lace.store.api import Store, Watch, WatchEvent
from lace.store.cache import ObjectCache
from lace.store.kinds import object_key
from lace.store.errors import Gone, NotFound, StoreError

from . import endpointslices as E

log = logging.getLogger("lace.controllers.endpointslices")

KINDS = ("Service", "Pod", "EndpointSlice")
RESYNC_SECONDS = 30.0
RETRY_SECONDS = 1.0


class EndpointSliceController:
    """Keeps every Service's EndpointSlices in step with its pods (see the module docstring)."""

    def __init__(self, store: Store, *, resync: float = RESYNC_SECONDS) -> None:
        self.store = store
        self.resync = resync
        self.cache = ObjectCache(KINDS)
        self.dirty: set[str] = set()
        self.retry: dict[str, float] = {}
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stopping = threading.Event()
        self._watch: Watch | None = None
        self._watcher: threading.Thread | None = None
        self.stats = {"reconciles": 0, "writes": 0, "deletes": 0, "errors": 0}

    # ---- feeding the cache -------------------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                lists = {kind: self.store.list(kind) for kind in KINDS}
                self.events.put(("list", {kind: r.items for kind, r in lists.items()}))
                since = min(int(r.resource_version) for r in lists.values())
                with self.store.watch(list(KINDS), since=since) as w:
                    self._watch = w
                    if self.stopping.is_set():
                        break
                    for ev in w:
                        self.events.put(("event", ev))
            except Gone:
                log.info("watch fell behind compaction: listing again")
            except StoreError as err:
                log.warning("watch: %s", err)
                self.stopping.wait(0.5)
        self.events.put(("stopped", None))

    def _apply_event(self, ev: WatchEvent) -> None:
        self._mark(ev.object, self.cache.apply(ev.type, ev.object))

    def _mark(self, obj: dict, old: dict | None) -> None:
        """The Services this change can affect."""
        kind = obj["kind"]
        if kind == "Service":
            self.dirty.add(object_key(obj))
        elif kind == "EndpointSlice":
            owner = E.service_of(obj)
            if owner is not None and E.managed(obj):
                self.dirty.add(owner)
        elif kind == "Pod":
            ns = obj["metadata"]["namespace"]
            for svc in self.cache.in_namespace("Service", ns):
                if E.selects(svc, obj) or (old is not None and E.selects(svc, old)):
                    self.dirty.add(object_key(svc))

    def _mark_all(self) -> None:
        self.dirty |= set(self.cache.objects["Service"])
        self.dirty |= {k for o in self.cache.objects["EndpointSlice"].values()
                       if E.managed(o) and (k := E.service_of(o)) is not None}

    # ---- reconciling -------------------------------------------------------------------------

    def reconcile(self, key: str) -> None:
        """Make the stored slices of the Service ``namespace/name`` what they should be."""
        ns = key.partition("/")[0]
        svc = self.cache.objects["Service"].get(key)
        desired = E.desired_slices(svc, self.cache.in_namespace("Pod", ns)) if svc is not None else []
        writes, deletes, blocked = E.plan(key, desired, self.cache.in_namespace("EndpointSlice", ns))
        for name in blocked:
            log.warning("service %s: EndpointSlice %s/%s exists and is not managed by %s: left alone",
                        key, ns, name, E.K.ENDPOINTSLICE_CONTROLLER)
        if writes:
            for result in self.store.apply_all(writes):
                self.cache.put(result.object)
            self.stats["writes"] += len(writes)
            log.info("service %s: wrote %s", key, ", ".join(w["metadata"]["name"] for w in writes))
        for obj in deletes:
            try:
                gone = self.store.delete("EndpointSlice", obj["metadata"]["name"], ns)
                self.cache.remove(gone)
            except NotFound:
                self.cache.objects["EndpointSlice"].pop(object_key(obj), None)
            self.stats["deletes"] += 1
            log.info("service %s: deleted %s", key, obj["metadata"]["name"])
        self.stats["reconciles"] += 1

    def _reconcile_dirty(self) -> None:
        now = time.monotonic()
        due = {k for k, at in self.retry.items() if at <= now}
        for key in due:
            del self.retry[key]
        for key in sorted(self.dirty | due):
            self.dirty.discard(key)
            try:
                self.reconcile(key)
            except StoreError as err:
                # a write refused (or the store busy): this service again later, the others now
                self.stats["errors"] += 1
                log.warning("service %s: %s", key, err)
                self.retry[key] = now + RETRY_SECONDS

    # ---- running -----------------------------------------------------------------------------

    def run(self) -> None:
        """Until ``stop``: follow the store and reconcile."""
        self._watcher = threading.Thread(target=self._watch_loop, name="watch", daemon=True)
        self._watcher.start()
        next_resync = time.monotonic() + self.resync
        while True:
            timeout = max(0.0, min([next_resync] + list(self.retry.values())) - time.monotonic())
            try:
                items = [self.events.get(timeout=timeout)]
            except queue.Empty:
                items = []
            while True:   # take whatever else is already there: one pass for a burst of events
                try:
                    items.append(self.events.get_nowait())
                except queue.Empty:
                    break
            for what, payload in items:
                if what == "stopped":
                    return
                if what == "list":
                    for kind, objs in payload.items():
                        self.cache.replace(kind, objs)
                    self._mark_all()
                else:
                    self._apply_event(payload)
            if time.monotonic() >= next_resync:
                self._mark_all()
                next_resync = time.monotonic() + self.resync
            if not self.stopping.is_set():
                self._reconcile_dirty()

    def stop(self) -> None:
        """End ``run`` (safe from another thread or a signal handler)."""
        self.stopping.set()
        if self._watch is not None:
            self._watch.stop()
        self.events.put(("stopped", None))
