"""The Kubernetes store's local view: one reflector per kind (list + watch) feeding one cache.

Like client-go's Reflector and an informer's store. A kind is synced the first time something
reads or watches it: a LIST (its items and resourceVersion) fills the cache, then a watch thread
follows from that resourceVersion with ``allowWatchBookmarks``:

- an event updates the cache and the reflector's resourceVersion;
- a BOOKMARK only advances the resourceVersion (nothing changed; the next watch resumes there,
  so a quiet kind does not fall out of the apiserver's watch window);
- a stream that ends (the apiserver's ``timeoutSeconds``, a load balancer, a disconnect) is watched
  again from the last resourceVersion, at once;
- ``410 Gone`` (as an HTTP status or an in-stream ERROR event) means the resourceVersion was
  compacted away: the reflector lists again and the cache turns the difference between what it
  held and the new list into ADDED / MODIFIED / DELETED events, so a watcher of the cache never
  sees a gap and never has to relist itself;
- any other failure is retried after a backoff with full jitter (50 ms doubling up to 30 s), so
  a thousand agents do not come back in step after an apiserver restart.

The cache numbers what it observes with its own revision counter, one per change, and keeps a
bounded log of them: the Store's ``revision``/``watch(since=...)`` contract (one integer revision
for every kind, ``Gone`` once compacted) holds locally, whatever the apiserver's resourceVersions
are. Objects keep the apiserver's ``metadata.resourceVersion``, which is what an update's
optimistic concurrency checks. Only the reflectors write the cache, each in its kind's order, so
it never moves an object backwards; a writer that needs to read its own write waits for the
reflector to see it (``wait_for``).
"""

from __future__ import annotations

import collections
import copy
import itertools
import logging
import random
import threading
import time
from collections.abc import Iterable
from typing import Any

from lace.store.api import Watch, WatchEvent
from lace.store.errors import Gone, StoreError, Unavailable
from lace.store.kubernetes_client import ApiServer, Resource, WatchStream

log = logging.getLogger("lace.store.kubernetes")

#: how many changes the cache keeps for watchers that resume from a revision
EVENT_LOG = 100_000
#: the apiserver ends each watch after this long (plus its own jitter); the reflector re-watches
WATCH_TIMEOUT_SECONDS = 300
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 30.0

Key = tuple[str, str]   # (namespace, name)


def resource_version_at_least(have: str | None, want: str) -> bool:
    """Whether resourceVersion ``have`` is ``want`` or later. Kubernetes calls them opaque, but an
    apiserver on etcd hands out etcd's revision, and client-go compares them the same way to wait
    for its own writes; a version that is not a number counts as reached (nothing to wait for)."""
    if have is None:
        return False
    try:
        return int(have) >= int(want)
    except ValueError:
        return True


class Backoff:
    """Exponential backoff with full jitter (each wait uniform in [0, cap))."""

    def __init__(self, first: float = BACKOFF_FIRST, limit: float = BACKOFF_MAX,
                 rng: random.Random | None = None) -> None:
        self.first, self.limit = first, limit
        self.cap = first
        self.rng = rng or random.Random()

    def next(self) -> float:
        wait = self.rng.uniform(0, self.cap)
        self.cap = min(self.cap * 2, self.limit)
        return wait

    def reset(self) -> None:
        self.cap = self.first


def _key(obj: dict) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def _with_kind(obj: dict, resource: Resource) -> dict:
    """Items of a list carry no apiVersion/kind (the list does): set them as lace expects."""
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj


class Cache:
    """Objects by kind, a local revision counter and the log of changes watchers read."""

    def __init__(self, log_size: int = EVENT_LOG) -> None:
        self.cond = threading.Condition()
        self.objects: dict[str, dict[Key, dict]] = {}
        self.revision = 0
        self.log: collections.deque[tuple[int, str, dict]] = collections.deque(maxlen=log_size)
        self.closed = False

    @property
    def compacted(self) -> int:
        """The revision up to which the log has dropped changes (a watch from before it is Gone)."""
        with self.cond:
            if len(self.log) < (self.log.maxlen or 0):
                return 0
            return self.log[0][0] - 1

    def _record(self, type_: str, obj: dict) -> None:
        self.revision += 1
        self.log.append((self.revision, type_, obj))

    def apply(self, kind: str, type_: str, obj: dict) -> None:
        """One watch event of ``kind`` (ADDED / MODIFIED / DELETED)."""
        with self.cond:
            objs = self.objects.setdefault(kind, {})
            key = _key(obj)
            if type_ == "DELETED":
                if objs.pop(key, None) is None:
                    return
            else:
                old = objs.get(key)
                if old is not None and old == obj:
                    return
                objs[key] = obj
                type_ = "ADDED" if old is None else "MODIFIED"
            self._record(type_, obj)
            self.cond.notify_all()

    def replace(self, kind: str, items: Iterable[dict]) -> None:
        """A (re)list of ``kind``: the difference to what was held becomes events."""
        new = {_key(o): o for o in items}
        with self.cond:
            old = self.objects.get(kind, {})
            for key, obj in old.items():
                if key not in new:
                    self._record("DELETED", obj)
            for key, obj in sorted(new.items()):
                if key not in old:
                    self._record("ADDED", obj)
                elif old[key] != obj:
                    self._record("MODIFIED", obj)
            self.objects[kind] = new
            self.cond.notify_all()

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        with self.cond:
            obj = self.objects.get(kind, {}).get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str, namespace: str | None, prefix: str = "") -> list[dict]:
        """The objects of ``kind`` (in ``namespace``, unless None) whose name starts with
        ``prefix``: filtered by key before anything is copied (the apiserver has no name-prefix
        query to ask)."""
        with self.cond:
            objs = [o for k, o in self.objects.get(kind, {}).items()
                    if (namespace is None or k[0] == namespace) and k[1].startswith(prefix)]
        return sorted((copy.deepcopy(o) for o in objs), key=_key)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class Reflector:
    """List + watch of one kind into the cache (see the module docstring)."""

    def __init__(self, api: ApiServer, resource: Resource, cache: Cache, *,
                 watch_timeout: int = WATCH_TIMEOUT_SECONDS, backoff: Backoff | None = None) -> None:
        self.api = api
        self.resource = resource
        self.cache = cache
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.resource_version: str | None = None
        self.error: StoreError | None = None
        self.relists = 0
        #: failed lists and watches so far (each followed by a backoff)
        self.failures = 0
        self._stopping = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()

    @property
    def what(self) -> str:
        return f"the {self.resource.plural} watch"

    def start(self) -> None:
        """List now (errors reach the caller: nothing is cached yet), then watch in a thread."""
        self._list()
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.resource.plural}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _set_rv(self, rv: str) -> None:
        with self._cond:
            self.resource_version = rv
            self._cond.notify_all()

    def wait_for(self, resource_version: str, timeout: float) -> bool:
        """Block until this reflector has seen ``resource_version`` (a write's), up to ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not resource_version_at_least(self.resource_version, resource_version):
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    return False
                self._cond.wait(left)
        return True

    def _list(self) -> None:
        out = self.api.request("GET", self.resource.path(), what=f"the list of {self.resource.plural}")
        items = [_with_kind(o, self.resource) for o in out.get("items") or ()]
        self.cache.replace(self.resource.kind, items)
        self._set_rv(str((out.get("metadata") or {}).get("resourceVersion") or ""))

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self.relists += 1
                    self._list()
                self._watch()
                self.error = None
                self.backoff.reset()
            except Gone:
                log.info("%s: resourceVersion %s is gone (compacted): listing again", self.what,
                         self.resource_version)
                self.resource_version = None
            except StoreError as err:
                if self._stopping.is_set():
                    return
                self.error = err
                self.failures += 1
                wait = self.backoff.next()
                log.warning("%s: %s (again in %.2fs)", self.what, err, wait)
                self._stopping.wait(wait)
            except Exception as err:   # a bug must not end the watch for good
                self.error = Unavailable(f"{self.what} failed: {type(err).__name__}: {err}")
                log.exception("%s failed", self.what)
                self._stopping.wait(self.backoff.next())

    def _watch(self) -> None:
        query = {"watch": True, "allowWatchBookmarks": True, "resourceVersion": self.resource_version,
                 "timeoutSeconds": self.watch_timeout}
        stream = self.api.stream(self.resource.path(), query, what=self.what,
                                 read_timeout=self.watch_timeout + 30)
        self._stream = stream
        self.error = None   # connected again: whatever failed before is over
        if self._stopping.is_set():
            stream.close()
        try:
            for event in stream.events():
                self._event(event)
                self.backoff.reset()   # a stream that delivers is healthy again
        finally:
            self._stream = None
            stream.close()

    def _event(self, event: dict) -> None:
        type_, obj = event.get("type"), event.get("object") or {}
        if type_ == "ERROR":
            code = obj.get("code")
            message = obj.get("message") or obj.get("reason") or "error"
            if code == 410:
                raise Gone(f"{self.what}: {message}")
            raise Unavailable(f"{self.what}: the apiserver sent an error: {message} (code {code})")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if type_ in ("ADDED", "MODIFIED", "DELETED"):
            self.cache.apply(self.resource.kind, type_, _with_kind(obj, self.resource))
        elif type_ != "BOOKMARK":
            log.warning("%s: unknown event type %r ignored", self.what, type_)
        if rv:
            self._set_rv(str(rv))


class CacheWatch(Watch):
    """A watch of the cache: changes of some kinds after a local revision."""

    def __init__(self, cache: Cache, kinds: set[str] | None, since: int,
                 timeout: float | None) -> None:
        self.cache = cache
        self.kinds = kinds
        self.position = since
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.stopped = False
        self.pending: collections.deque[WatchEvent] = collections.deque()

    def __next__(self) -> WatchEvent:
        with self.cache.cond:
            while not self.pending:
                if self.stopped or self.cache.closed:
                    raise StopIteration
                if self.position < self.cache.compacted:
                    raise Gone(f"revision {self.position} of the Kubernetes store's cache was compacted",
                               hint="list again and watch from the list's resource_version")
                changes = self.cache.log
                # revisions are contiguous (one per change), so the first one after ours sits at a
                # known index: skip to it rather than compare every logged change on each wake-up
                first = changes[0][0] if changes else self.position + 1
                for rev, type_, obj in itertools.islice(changes, max(0, self.position + 1 - first), None):
                    self.position = rev
                    if self.kinds is None or obj.get("kind") in self.kinds:
                        self.pending.append(WatchEvent(type_, copy.deepcopy(obj), str(rev)))  # type: ignore[arg-type]
                if self.pending:
                    break
                left = None if self.deadline is None else self.deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StopIteration
                self.cache.cond.wait(left)
        return self.pending.popleft()

    def stop(self) -> None:
        with self.cache.cond:
            self.stopped = True
            self.cache.cond.notify_all()


def start_reflectors(api: ApiServer, resources: Iterable[Resource], cache: Cache, **kw: Any) -> dict[str, Reflector]:
    """A started reflector per resource (each lists first; the first failure stops them all)."""
    out: dict[str, Reflector] = {}
    try:
        for res in resources:
            r = Reflector(api, res, cache, **kw)
            r.start()
            out[res.kind] = r
    except BaseException:
        for r in out.values():
            r.stop()
        raise
    return out
