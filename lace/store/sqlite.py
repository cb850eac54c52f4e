"""SqliteStore: the embedded store, one SQLite file in WAL mode shared by the CLI and every node agent.

Tables: ``objects`` (one row per object, its JSON), ``events`` (one row per revision, bounded by
compaction) and ``meta`` (the revision counter, the compaction mark, ID allocators). Each write is
one ``BEGIN IMMEDIATE`` transaction — revision bump, validation reads, object row and event row — so
revisions are in commit order across processes and a rejected write leaves nothing behind.
Watches poll ``PRAGMA data_version`` (a cheap "did another connection commit?") every 20 ms and are
woken at once by writes of their own process.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import ipaddress
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson

from lace.store import kinds as K
from lace.store.api import ApplyResult, ListResult, Selector, Store, Watch, WatchEvent
from lace.store.errors import (AlreadyExists, Conflict, Exhausted, Forbidden, Gone, NotFound,
                               StoreError, Unavailable, ValidationError)
from lace.store.selectors import InvalidSelector, matches, parse_selector_string, validate_selector
from lace.store.validation import normalize, object_ref, validate

SCHEMA_VERSION = 1
DEFAULT_MAX_EVENTS = 10_000
COMPACT_EVERY = 100
POLL_INTERVAL = 0.02

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
    uid TEXT NOT NULL, rv INTEGER NOT NULL, json BLOB NOT NULL,
    PRIMARY KEY (kind, namespace, name));
CREATE TABLE IF NOT EXISTS events (
    rv INTEGER PRIMARY KEY, type TEXT NOT NULL, kind TEXT NOT NULL,
    namespace TEXT NOT NULL, name TEXT NOT NULL, json BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS events_kind ON events (kind, rv);
"""
_META_DEFAULTS = {
    "schema_version": SCHEMA_VERSION,
    "revision": 0,
    "compacted": 0,
    "next_network_id": K.FIRST_NETWORK_ID,
    "next_segment_id": K.FIRST_SEGMENT_ID,
}
_OWNED_STATUS = {"Network": ("id",), "Segment": ("id",)}
_META_KEPT = ("uid", "creationTimestamp", "generation", "resourceVersion")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


class _Notifier:
    """Wakes this process's watches when this process commits a write to the same file."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.counter = 0

    def notify(self) -> None:
        with self.cond:
            self.counter += 1
            self.cond.notify_all()


_NOTIFIERS: dict[str, _Notifier] = {}
_NOTIFIERS_LOCK = threading.Lock()


def _notifier(path: str) -> _Notifier:
    with _NOTIFIERS_LOCK:
        return _NOTIFIERS.setdefault(path, _Notifier())


class _Rollback(Exception):
    pass


def _translate(err: sqlite3.Error, path: str) -> StoreError:
    text = str(err)
    if "locked" in text or "busy" in text:
        return Unavailable(f"the store {path} stayed locked past the busy timeout",
                           hint="another process holds a long write; retry, or look for a stuck lace process")
    if isinstance(err, sqlite3.OperationalError) and ("unable to open" in text or "readonly" in text):
        return Unavailable(f"cannot open the store {path}: {text}",
                           hint="check that the directory exists and is writable (are you root?)")
    if isinstance(err, sqlite3.DatabaseError) and "not a database" in text:
        return Unavailable(f"{path} is not a lace store (not an SQLite database)",
                           hint="point LACE_STATE_DIR at the right directory, or remove the file")
    return StoreError(f"store {path}: {type(err).__name__}: {text}")


class _TxnLookup:
    """Validation's view of the store inside the current transaction (sees the batch so far)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    def get_object(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        return self.store._row(kind, namespace or "", name)

    def list_objects(self, kind: str, namespace: str | None = None) -> list[dict]:
        return self.store._rows(kind, namespace)


class SqliteStore(Store):
    """The embedded Store on one SQLite file; safe to share between threads and processes."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 10.0,
                 max_events: int = DEFAULT_MAX_EVENTS, poll_interval: float = POLL_INTERVAL) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.busy_timeout = busy_timeout
        self.max_events = max_events
        self.poll_interval = poll_interval
        self._lock = threading.RLock()
        self._notifier = _notifier(self.path)
        self._conn = self._connect()
        try:
            self._init_schema()
        except BaseException:
            self._conn.close()
            raise

    # ---- connection and transactions -------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise Unavailable(f"the store {self.path} cannot use WAL mode (got {mode})",
                                  hint="put the state directory on a local filesystem")
            conn.execute("PRAGMA synchronous = NORMAL")
            return conn
        except sqlite3.Error as err:
            raise _translate(err, self.path) from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def _write(self, dry_run: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            committed = False
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    if dry_run:
                        raise _Rollback()
                    conn.execute("COMMIT")
                    committed = True
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except _Rollback:
                pass
            except sqlite3.Error as err:
                raise _translate(err, self.path) from None
        if committed:
            self._notifier.notify()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
            except sqlite3.Error as err:
                raise _translate(err, self.path) from None

    def _init_schema(self) -> None:
        with self._write() as conn:
            for stmt in _DDL.strip().split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            for key, value in _META_DEFAULTS.items():
                conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, value))
            version = self._meta("schema_version")
            if version != SCHEMA_VERSION:
                raise Unavailable(f"the store {self.path} has schema version {version}, "
                                  f"this lace understands {SCHEMA_VERSION}",
                                  hint="use the lace version that created it, or recreate the lab")
            if self._row("Network", "", K.DEFAULT_NETWORK) is None:
                self._create_in_txn({
                    "apiVersion": K.LACE_API_VERSION, "kind": "Network",
                    "metadata": {"name": K.DEFAULT_NETWORK},
                    "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS), "routes": []}})
            for ns in K.ALWAYS_NAMESPACES:
                if self._row("Namespace", "", ns) is None:
                    self._create_in_txn({"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": ns}})

    # ---- low-level row access (callers hold the lock, inside a transaction) -----------------

    def _meta(self, key: str) -> int:
        return int(self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])

    def _set_meta(self, key: str, value: int) -> None:
        self._conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))

    def _next_rv(self) -> int:
        row = self._conn.execute(
            "UPDATE meta SET value = value + 1 WHERE key = 'revision' RETURNING value").fetchone()
        return int(row[0])

    def _row(self, kind: str, namespace: str, name: str) -> dict | None:
        row = self._conn.execute(
            "SELECT json FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
            (kind, namespace, name)).fetchone()
        return orjson.loads(row[0]) if row else None

    def _rows(self, kind: str, namespace: str | None = None) -> list[dict]:
        if namespace is None:
            cur = self._conn.execute(
                "SELECT json FROM objects WHERE kind = ? ORDER BY namespace, name", (kind,))
        else:
            cur = self._conn.execute(
                "SELECT json FROM objects WHERE kind = ? AND namespace = ? ORDER BY name",
                (kind, namespace))
        return [orjson.loads(r[0]) for r in cur]

    def _put(self, obj: dict, event: str) -> dict:
        rv = self._next_rv()
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        ns = meta.get("namespace", "")
        blob = _dumps(obj)
        self._conn.execute(
            "INSERT OR REPLACE INTO objects (kind, namespace, name, uid, rv, json) "
            "VALUES (?, ?, ?, ?, ?, ?)", (obj["kind"], ns, meta["name"], meta["uid"], rv, blob))
        self._event(rv, event, obj, blob)
        return obj

    def _remove(self, obj: dict) -> dict:
        rv = self._next_rv()
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        self._conn.execute("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                           (obj["kind"], meta.get("namespace", ""), meta["name"]))
        self._event(rv, "DELETED", obj, _dumps(obj))
        return obj

    def _event(self, rv: int, event: str, obj: dict, blob: bytes) -> None:
        meta = obj["metadata"]
        self._conn.execute(
            "INSERT INTO events (rv, type, kind, namespace, name, json) VALUES (?, ?, ?, ?, ?, ?)",
            (rv, event, obj["kind"], meta.get("namespace", ""), meta["name"], blob))
        if rv % COMPACT_EVERY == 0 and rv > self.max_events:
            self._compact(rv - self.max_events)

    def _compact(self, upto: int) -> None:
        self._conn.execute("DELETE FROM events WHERE rv <= ?", (upto,))
        if upto > self._meta("compacted"):
            self._set_meta("compacted", upto)

    def compact(self, keep: int | None = None) -> int:
        """Drop all but the newest ``keep`` events (default max_events); returns the compaction mark."""
        with self._write() as _:
            upto = self._meta("revision") - (self.max_events if keep is None else keep)
            if upto > 0:
                self._compact(upto)
            return self._meta("compacted")

    # ---- allocation of store-owned status fields -------------------------------------------

    def _allocate_id(self, counter: str, limit: int, what: str) -> int:
        value = self._meta(counter)
        if value > limit:
            raise Exhausted(f"no {what} IDs are left (the last one was {limit})",
                            hint=f"delete unused {what}s; IDs are never reused")
        self._set_meta(counter, value + 1)
        return value

    def _create_in_txn(self, obj: dict) -> dict:
        obj = validate(obj, _TxnLookup(self))
        meta = obj["metadata"]
        if self._row(obj["kind"], meta.get("namespace", ""), meta["name"]) is not None:
            raise AlreadyExists(f"{object_ref(obj)} already exists",
                                hint="use `lace apply` to update it, or delete it first")
        obj.pop("status", None)
        if obj["kind"] == "Network":
            if meta["name"] == K.DEFAULT_NETWORK:
                net_id = K.DEFAULT_NETWORK_ID
            else:
                net_id = self._allocate_id("next_network_id", K.MAX_NETWORK_ID, "network")
            obj["status"] = {"id": net_id}
        elif obj["kind"] == "Segment":
            obj["status"] = {"id": self._allocate_id("next_segment_id", K.MAX_SEGMENT_ID, "segment")}
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta.pop("resourceVersion", None)
        return self._put(obj, "ADDED")

    def _merge(self, existing: dict, new: dict) -> dict:
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
        content = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        if content(merged) != content(existing):
            meta["generation"] = int(existing["metadata"].get("generation", 1)) + 1
        return merged

    def _guard_update(self, existing: dict, new: dict) -> None:
        """Refuse updates that would orphan allocations (a Network shrinking under its IPBlocks)."""
        if new["kind"] != "Network":
            return
        cidrs = [ipaddress.ip_network(c) for c in new["spec"]["cidrs"]]
        for block in self._rows("IPBlock"):
            if block["spec"]["network"] != new["metadata"]["name"]:
                continue
            cidr = ipaddress.ip_network(block["spec"]["cidr"])
            if not any(cidr.version == c.version and cidr.subnet_of(c) for c in cidrs):  # type: ignore[arg-type]
                raise Forbidden(
                    f'{object_ref(new)}: the new spec.cidrs no longer contain IPBlock '
                    f'"{block["metadata"]["name"]}" ({cidr}) of node {block["spec"]["node"]}',
                    hint="keep the range, or drain the pods of that network first")

    def _apply_in_txn(self, obj: dict) -> ApplyResult:
        meta = obj["metadata"]
        existing = self._row(obj["kind"], meta.get("namespace", ""), meta["name"])
        if existing is None:
            return ApplyResult(self._create_in_txn(obj), "created")
        new = validate(obj, _TxnLookup(self))
        merged = self._merge(existing, new)
        if merged == existing:
            return ApplyResult(existing, "unchanged")
        self._guard_update(existing, merged)
        return ApplyResult(self._put(merged, "MODIFIED"), "configured")

    # ---- the Store API ----------------------------------------------------------------------

    @staticmethod
    def _ns(info: K.KindInfo, namespace: str | None) -> str:
        if not info.namespaced:
            return ""
        return namespace or "default"

    def _not_found(self, info: K.KindInfo, name: str, ns: str) -> NotFound:
        where = f' in namespace "{ns}"' if info.namespaced else ""
        return NotFound(f'{info.kind} "{name}" not found{where}',
                        hint=f"list what exists with `lace get {info.plural}"
                             + (f" -n {ns}`" if info.namespaced else "`"))

    def revision(self) -> int:
        with self._read():
            return self._meta("revision")

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        info = K.resolve_kind(kind)
        ns = self._ns(info, namespace)
        with self._read():
            obj = self._row(info.kind, ns, name)
        if obj is None:
            raise self._not_found(info, name, ns)
        return obj

    def list(self, kind: str, namespace: str | None = None,
             label_selector: Selector = None) -> ListResult:
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
        with self._read():
            items = self._rows(info.kind, namespace if info.namespaced else None)
            rv = self._meta("revision")
        if selector is not None:
            items = [o for o in items if matches(selector, o["metadata"].get("labels") or {})]
        return ListResult(items, str(rv))

    def create(self, obj: Mapping[str, Any]) -> dict:
        with self._write() as _:
            return self._create_in_txn(dict(obj))

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
        results: list[ApplyResult | None] = [None] * len(normalized)
        with self._write(dry_run=dry_run) as _:
            for i in order:
                try:
                    results[i] = self._apply_in_txn(normalized[i])
                except StoreError as err:
                    if isinstance(err, ValidationError):
                        err.index = i
                    raise
        return [r for r in results if r is not None]

    def update(self, obj: Mapping[str, Any]) -> dict:
        new_meta = (obj.get("metadata") or {}) if isinstance(obj, Mapping) else {}
        wanted_rv = new_meta.get("resourceVersion")
        with self._write() as _:
            new = validate(obj, _TxnLookup(self))
            meta = new["metadata"]
            info = K.kind_info(new["kind"])
            existing = self._row(new["kind"], meta.get("namespace", ""), meta["name"])
            if existing is None:
                raise self._not_found(info, meta["name"], meta.get("namespace", ""))
            self._check_rv(existing, wanted_rv)
            merged = self._merge(existing, new)
            if merged == existing:
                return existing
            self._guard_update(existing, merged)
            return self._put(merged, "MODIFIED")

    @staticmethod
    def _check_rv(existing: dict, wanted: Any) -> None:
        have = existing["metadata"]["resourceVersion"]
        if wanted is not None and str(wanted) != have:
            raise Conflict(f"{object_ref(existing)} was modified since you read it "
                           f"(resourceVersion {have}, you had {wanted})",
                           hint="read it again, reapply your change and retry")

    def update_status(self, kind: str, name: str, namespace: str | None, status: Mapping[str, Any],
                      resource_version: str | None = None) -> dict:
        info = K.resolve_kind(kind)
        ns = self._ns(info, namespace)
        with self._write() as _:
            existing = self._row(info.kind, ns, name)
            if existing is None:
                raise self._not_found(info, name, ns)
            self._check_rv(existing, resource_version)
            new_status = copy.deepcopy(dict(status))
            for key in _OWNED_STATUS.get(info.kind, ()):
                if key in (existing.get("status") or {}):
                    new_status[key] = existing["status"][key]
            candidate = copy.deepcopy(existing)
            candidate["status"] = new_status
            validate(candidate, _TxnLookup(self))
            if candidate == existing:
                return existing
            return self._put(candidate, "MODIFIED")

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict:
        info = K.resolve_kind(kind)
        ns = self._ns(info, namespace)
        with self._write() as _:
            existing = self._row(info.kind, ns, name)
            if existing is None:
                raise self._not_found(info, name, ns)
            if info.kind == "Network":
                self._guard_network_delete(existing)
                for internal in ("IPLease", "IPBlock", "Segment"):
                    for obj in self._rows(internal):
                        if obj["spec"]["network"] == name:
                            self._remove(obj)
            elif info.kind == "Namespace":
                if name in K.ALWAYS_NAMESPACES:
                    raise Forbidden(f'Namespace "{name}" cannot be deleted: it always exists')
                for kind_name in ("Pod", "NetworkPolicy", "Service"):
                    for obj in self._rows(kind_name, name):
                        self._remove(obj)
            return self._remove(existing)

    def _guard_network_delete(self, net: dict) -> None:
        name = net["metadata"]["name"]
        if name == K.DEFAULT_NETWORK:
            raise Forbidden('Network "default" cannot be deleted: every cluster has it')
        users = [f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}'
                 for p in self._rows("Pod") if K.pod_network(p) == name]
        if users:
            shown = ", ".join(users[:5]) + (", ..." if len(users) > 5 else "")
            raise Forbidden(f'Network "{name}" is in use by {len(users)} pod(s): {shown}',
                            hint="delete or move those pods first")
        services = [f'{s["metadata"]["namespace"]}/{s["metadata"]["name"]}' for s in self._rows("Service")
                    if (s["metadata"].get("annotations") or {}).get(K.NETWORK_ANNOTATION) == name]
        if services:
            raise Forbidden(f'Network "{name}" is in use by service(s): {", ".join(services[:5])}',
                            hint="delete those services first")
        routed = [n["metadata"]["name"] for n in self._rows("Network")
                  if any(r.get("to") == name for r in (n["spec"].get("routes") or []))]
        if routed:
            raise Forbidden(f'Network "{name}" is the target of routes in Network(s): {", ".join(routed)}',
                            hint="remove those routes first")

    # ---- allocators ---------------------------------------------------------------------------

    def allocate_segment(self, network: str, namespace: str, labels: Mapping[str, str]) -> int:
        spec = {"network": network, "namespace": namespace, "labels": dict(labels)}
        base = K.segment_name(network, namespace, spec["labels"])
        with self._write() as _:
            for attempt in range(16):
                name = base if attempt == 0 else f"{base}-{attempt}"
                existing = self._row("Segment", "", name)
                if existing is None:
                    obj = self._create_in_txn({"apiVersion": K.LACE_API_VERSION, "kind": "Segment",
                                               "metadata": {"name": name}, "spec": spec})
                    return int(obj["status"]["id"])
                if existing["spec"] == spec:
                    return int(existing["status"]["id"])
        raise StoreError(f"segment name collision for {base}")

    def allocate_block(self, network: str, node: str, family: int | str, prefixlen: int,
                       *, additional: bool = False) -> str:
        version = _family(family)
        with self._write() as _:
            net = self._row("Network", "", network)
            if net is None:
                raise NotFound(f'Network "{network}" not found',
                               hint="create it first (lace get networks lists what exists)")
            blocks = [b for b in self._rows("IPBlock") if b["spec"]["network"] == network]
            taken = sorted((ipaddress.ip_network(b["spec"]["cidr"]) for b in blocks
                            if ipaddress.ip_network(b["spec"]["cidr"]).version == version),
                           key=lambda n: int(n.network_address))
            if not additional:
                for b in blocks:
                    cidr = ipaddress.ip_network(b["spec"]["cidr"])
                    if b["spec"]["node"] == node and cidr.version == version and cidr.prefixlen == prefixlen:
                        return str(cidr)
            ranges = [c for c in (ipaddress.ip_network(x) for x in net["spec"]["cidrs"])
                      if c.version == version]
            if not ranges:
                raise Exhausted(f'Network "{network}" has no IPv{version} CIDR',
                                hint=f"add an IPv{version} range to its spec.cidrs")
            for rng in ranges:
                if prefixlen < rng.prefixlen or prefixlen > rng.max_prefixlen:
                    raise ValidationError(f'IPBlock for node "{node}"', "prefixlen",
                                          f"/{prefixlen} does not fit in {rng}",
                                          f"use a prefix length from {rng.prefixlen} to {rng.max_prefixlen}")
                start = _first_free(rng, prefixlen, taken)
                if start is not None:
                    cidr = ipaddress.ip_network(f"{start}/{prefixlen}")
                    self._create_in_txn({
                        "apiVersion": K.LACE_API_VERSION, "kind": "IPBlock",
                        "metadata": {"name": K.block_name(network, str(cidr)),
                                     "labels": {"lace.dev/node": node, "lace.dev/network": network}},
                        "spec": {"network": network, "node": node, "cidr": str(cidr)}})
                    return str(cidr)
            raise Exhausted(f'Network "{network}" has no free IPv{version} /{prefixlen} block left',
                            hint="add a range to the network's spec.cidrs or use smaller blocks")

    def watch(self, kinds: list[str] | None = None, since: int | str | None = None,
              timeout: float | None = None) -> Watch:
        names = None if kinds is None else sorted({K.resolve_kind(k).kind for k in kinds})
        return SqliteWatch(self, names, None if since is None else int(since), timeout)


def _family(family: int | str) -> int:
    text = str(family).lower().removeprefix("ipv").removeprefix("inet")
    if text in ("4", ""):
        return 4
    if text == "6":
        return 6
    raise ValidationError("IPBlock request", "family", f"unknown address family {family!r}", "use 4 or 6")


def _first_free(rng: Any, prefixlen: int, taken: list[Any]) -> Any:
    """Lowest aligned /prefixlen inside rng overlapping none of ``taken`` (sorted), or None."""
    size = 1 << (rng.max_prefixlen - prefixlen)
    cand = int(rng.network_address)
    end = int(rng.broadcast_address)
    for block in taken:
        b_start, b_end = int(block.network_address), int(block.broadcast_address)
        if b_end < cand:
            continue
        if cand + size - 1 < b_start:
            break
        cand = ((b_end + 1 + size - 1) // size) * size
    if cand + size - 1 > end:
        return None
    return ipaddress.IPv4Address(cand) if rng.version == 4 else ipaddress.IPv6Address(cand)


class SqliteWatch(Watch):
    """A watch on a SqliteStore: its own connection, polling the events table by data_version."""

    def __init__(self, store: SqliteStore, kinds: list[str] | None, since: int | None,
                 timeout: float | None) -> None:
        self._store = store
        self._kinds = kinds
        self._stopped = threading.Event()
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._buffer: deque[WatchEvent] = deque()
        self._data_version: int | None = None
        self._conn = store._connect()
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as err:
            self._conn.close()
            raise _translate(err, store.path) from None
        self._last = int(meta["revision"]) if since is None else since
        self._check_compacted(int(meta["compacted"]))

    def _check_compacted(self, compacted: int) -> None:
        if self._last < compacted:
            self.stop()
            raise Gone(f"revision {self._last} is too old: events up to {compacted} were compacted",
                       hint="list again and watch from the list's resourceVersion")

    def stop(self) -> None:
        self._stopped.set()
        self._store._notifier.notify()

    def _close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def _fetch(self) -> None:
        conn = self._conn
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._data_version:
                return
            conn.execute("BEGIN")
            try:
                meta = dict(conn.execute(
                    "SELECT key, value FROM meta WHERE key IN ('revision', 'compacted')").fetchall())
                self._check_compacted(int(meta["compacted"]))
                sql = "SELECT rv, type, json FROM events WHERE rv > ?"
                params: list[Any] = [self._last]
                if self._kinds is not None:
                    sql += f" AND kind IN ({','.join('?' * len(self._kinds))})"
                    params += self._kinds
                rows = conn.execute(sql + " ORDER BY rv LIMIT 1000", params).fetchall()
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as err:
            raise _translate(err, self._store.path) from None
        for rv, event_type, blob in rows:
            self._buffer.append(WatchEvent(event_type, orjson.loads(blob), str(rv)))
        if len(rows) == 1000:
            self._last = rows[-1][0]  # more to read: come back without waiting for data_version
        else:
            self._last = max(self._last, int(meta["revision"]))
            self._data_version = version

    def __next__(self) -> WatchEvent:
        notifier = self._store._notifier
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._stopped.is_set():
                self._close()
                raise StopIteration
            with notifier.cond:
                seen = notifier.counter
            self._fetch()
            if self._buffer:
                continue
            wait = self._store.poll_interval
            if self._deadline is not None:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self.stop()
                    continue
                wait = min(wait, remaining)
            with notifier.cond:
                if notifier.counter == seen:
                    notifier.cond.wait(wait)
