"""SQLite storage: the embedded backend, one file in WAL mode shared by the CLI and every node agent.

Tables: ``objects`` (one row per object, its JSON), ``events`` (one row per revision, bounded by
compaction), ``meta`` (the revision counter, the compaction mark, named counters) and
``liveness`` (node liveness records: a holder and an expiry time on this machine's wall clock,
renewed by the agents; neither objects nor events, so they bump no revision and bring no watch
an event — the same contract as etcd's leased keys, with the expiry decided at read time instead
of by a lease). Each write is one ``BEGIN IMMEDIATE`` transaction — revision bump, the reads the
layers above make, object row and event row — so revisions are in commit order across processes
and a rejected write leaves nothing behind.

A watch looks for new events when woken: at once by a commit of its own process, and by another
process's through inotify on the write-ahead log (``_FileWakes``). A look that finds nothing new
after a wake-up, and that saw no commit at all, is tried again a few times over ~0.1 s (the
wake-up may come before the commit is visible); once a look sees a commit, the wake-up is
answered. An idle watch looks anyway every WAKE_SAFETY (1 s). Without inotify, watches
poll every ``poll_interval`` (POLL_INTERVAL, 20 ms, by default). A look first asks ``PRAGMA
data_version`` (a cheap "did another connection commit?"). Any commit to the file wakes the
watches, a liveness renewal's too (it appends to the same write-ahead log): their looks then find
nothing new, which costs one query, not an event.

``SqliteBackend`` is the generic backend (``backend.py``); the Store callers construct over it,
``SqliteStore``, lives a layer up (``embedded.py``).
"""

from __future__ import annotations

import contextlib
import logging
import copy
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import orjson

from lace.store.api import Heartbeat, Liveness, Watch, WatchEvent
from lace.store.backend import Backend, Transaction, prefix_end
from lace.store.errors import Gone, StoreError, Unavailable

log = logging.getLogger("lace.store")

SCHEMA_VERSION = 1
DEFAULT_MAX_EVENTS = 10_000
COMPACT_EVERY = 100
#: how often a watch asks SQLite for new events when nothing wakes it (no inotify)
POLL_INTERVAL = 0.02
#: how long a watch woken by file events sleeps between looks when nothing wakes it
WAKE_SAFETY = 1.0
#: a wake-up may arrive before the commit it announces is visible (its last step, the WAL index
#: in shared memory, raises no file event): look again after SETTLE, then after twice as long each
#: time up to SETTLE_MAX, before sleeping WAKE_SAFETY
SETTLE = 0.002
SETTLE_MAX = 0.064

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
CREATE TABLE IF NOT EXISTS liveness (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, token TEXT NOT NULL,
    ttl REAL NOT NULL, expires REAL NOT NULL);
"""
_META_DEFAULTS = {"schema_version": SCHEMA_VERSION, "revision": 0, "compacted": 0}


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


class _Notifier:
    """Wakes this process's watches on one store file: at once when this process commits a write
    to it, and through :class:`_FileWakes` when another process does."""

    def __init__(self, path: str) -> None:
        self.path = path
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
        return _NOTIFIERS.setdefault(path, _Notifier(path))


class _FileWakes:
    """Other processes' commits, noticed without polling: a commit appends to the store's
    write-ahead log (``<file>-wal``), and one inotify instance and one thread per process turn
    each append into a wake-up of that store's watches. An idle watch then sleeps (WAKE_SAFETY
    between looks) instead of asking SQLite every POLL_INTERVAL.

    Watched stores are counted per file and directories per watched file, so a directory is
    watched only while some watch of a store in it is open (the instance and its thread stay)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ino: Any = None
        self._failed = False
        self._users: dict[str, int] = {}            # store file -> open watches
        self._dirs: dict[str, int] = {}             # directory -> watch descriptor
        self._by_wd: dict[int, str] = {}

    def acquire(self, path: str) -> bool:
        """Wake ``path``'s watches on other processes' commits; False when inotify cannot (the
        watch then polls)."""
        with self._lock:
            if self._failed:
                return False
            try:
                if self._ino is None:
                    from inotify_simple import INotify
                    self._ino = INotify()
                    threading.Thread(target=self._run, args=(self._ino,), name="store-wakes", daemon=True).start()
                directory = os.path.dirname(path)
                if directory not in self._dirs:
                    from inotify_simple import flags
                    wd = self._ino.add_watch(directory, flags.MODIFY | flags.CREATE | flags.MOVED_TO)
                    self._dirs[directory] = wd
                    self._by_wd[wd] = directory
            except (OSError, ImportError) as err:   # no inotify (or out of instances): poll
                log.info("store watches poll every %.0f ms: %s", POLL_INTERVAL * 1000, err)
                self._failed = True
                return False
            self._users[path] = self._users.get(path, 0) + 1
            return True

    def release(self, path: str) -> None:
        with self._lock:
            left = self._users.get(path, 0) - 1
            if left > 0:
                self._users[path] = left
                return
            self._users.pop(path, None)
            directory = os.path.dirname(path)
            if any(os.path.dirname(p) == directory for p in self._users):
                return
            wd = self._dirs.pop(directory, None)
            if wd is not None:
                self._by_wd.pop(wd, None)
                with contextlib.suppress(OSError):
                    self._ino.rm_watch(wd)

    def _run(self, ino: Any) -> None:
        while True:
            try:
                events = ino.read()
            except OSError as err:
                log.warning("store watches: inotify failed (%s): polling from now on", err)
                with self._lock:
                    self._failed = True
                for n in list(_NOTIFIERS.values()):
                    n.notify()
                return
            woken = set()
            with self._lock:
                for ev in events:
                    directory = self._by_wd.get(ev.wd)
                    if directory is None or not ev.name:
                        continue
                    name = ev.name[:-4] if ev.name.endswith("-wal") else ev.name
                    path = os.path.join(directory, name)
                    if path in self._users:
                        woken.add(path)
            for path in woken:
                _notifier(path).notify()

    @property
    def failed(self) -> bool:
        return self._failed


_FILE_WAKES = _FileWakes()


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


class _SqliteTransaction(Transaction):
    """A transaction on the backend's connection; only used while the backend's lock is held."""

    def __init__(self, backend: SqliteBackend) -> None:
        self._backend = backend
        self._conn = backend._conn

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        row = self._conn.execute(
            "SELECT json FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
            (kind, namespace, name)).fetchone()
        return orjson.loads(row[0]) if row else None

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        if namespace is None:
            cur = self._conn.execute(
                "SELECT json FROM objects WHERE kind = ? ORDER BY namespace, name", (kind,))
        else:
            cur = self._conn.execute(
                "SELECT json FROM objects WHERE kind = ? AND namespace = ? ORDER BY name",
                (kind, namespace))
        return [orjson.loads(r[0]) for r in cur]

    def each(self, kind: str, namespace: str | None = None) -> Iterator[dict]:
        where, args = ("kind = ?", (kind,)) if namespace is None else ("kind = ? AND namespace = ?", (kind, namespace))
        for (raw,) in self._conn.execute(f"SELECT json FROM objects WHERE {where} ORDER BY namespace, name", args):
            yield orjson.loads(raw)

    def list_prefix(self, kind: str, namespace: str, prefix: str) -> list[dict]:
        end = prefix_end(prefix)
        if end is None:
            return self.list(kind, namespace)
        # a range on the primary key (kind, namespace, name): the rows of the prefix, no others
        cur = self._conn.execute(
            "SELECT json FROM objects WHERE kind = ? AND namespace = ? AND name >= ? AND name < ? "
            "ORDER BY name", (kind, namespace, prefix, end))
        return [orjson.loads(r[0]) for r in cur]

    def create(self, obj: dict) -> dict:
        return self._put(obj, "ADDED")

    def update(self, obj: dict) -> dict:
        return self._put(obj, "MODIFIED")

    def _put(self, obj: dict, event: str) -> dict:
        rv = self._next_rv()
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        ns = meta.get("namespace", "")
        blob = _dumps(obj)
        self._conn.execute(
            "INSERT OR REPLACE INTO objects (kind, namespace, name, uid, rv, json) "
            "VALUES (?, ?, ?, ?, ?, ?)", (obj["kind"], ns, meta["name"], meta.get("uid", ""), rv, blob))
        self._event(rv, event, obj, blob)
        return obj

    def delete(self, obj: dict) -> dict:
        rv = self._next_rv()
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        self._conn.execute("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?",
                           (obj["kind"], meta.get("namespace", ""), meta["name"]))
        self._event(rv, "DELETED", obj, _dumps(obj))
        return obj

    def revision(self) -> int:
        return self._backend._meta("revision")

    def next_value(self, counter: str, first: int) -> int:
        if counter in _META_DEFAULTS:
            raise StoreError(f'"{counter}" is the store\'s own bookkeeping, not a counter')
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (counter,)).fetchone()
        value = first if row is None else int(row[0])
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (counter, value + 1))
        return value

    def _next_rv(self) -> int:
        row = self._conn.execute(
            "UPDATE meta SET value = value + 1 WHERE key = 'revision' RETURNING value").fetchone()
        return int(row[0])

    def _event(self, rv: int, event: str, obj: dict, blob: bytes) -> None:
        meta = obj["metadata"]
        self._conn.execute(
            "INSERT INTO events (rv, type, kind, namespace, name, json) VALUES (?, ?, ?, ?, ?, ?)",
            (rv, event, obj["kind"], meta.get("namespace", ""), meta["name"], blob))
        backend = self._backend
        if rv % COMPACT_EVERY == 0 and rv > backend.max_events:
            backend._compact(rv - backend.max_events)


class SqliteBackend(Backend):
    """The generic backend on one SQLite file; safe to share between threads and processes."""

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
    def transaction(self, *, write: bool = True, dry_run: bool = False) -> Iterator[Transaction]:
        if not write:
            with self._read():
                yield _SqliteTransaction(self)
            return
        with self._write(dry_run) as _:
            yield _SqliteTransaction(self)

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
        # a store that already has this schema is only read: opening it must not wait for the write
        # lock, or a writer stuck in its transaction would keep every reader (`lace get`, an agent
        # starting) from even opening the store, while in WAL mode they could read the last commit
        if self._schema_current():
            return
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

    def _schema_current(self) -> bool:
        """Whether the file already holds every table and meta row of this schema version."""
        with self._read() as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"meta", "objects", "events", "liveness"} <= tables:
                return False
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if not set(_META_DEFAULTS) <= set(meta):
            return False
        if meta["schema_version"] != SCHEMA_VERSION:
            raise Unavailable(f"the store {self.path} has schema version {meta['schema_version']}, "
                              f"this lace understands {SCHEMA_VERSION}",
                              hint="use the lace version that created it, or recreate the lab")
        return True

    # ---- bookkeeping (callers hold the lock, inside a transaction) -------------------------

    def _meta(self, key: str) -> int:
        return int(self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0])

    def _set_meta(self, key: str, value: int) -> None:
        self._conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))

    def _compact(self, upto: int) -> None:
        self._conn.execute("DELETE FROM events WHERE rv <= ?", (upto,))
        if upto > self._meta("compacted"):
            self._set_meta("compacted", upto)

    def compact(self, keep: int | None = None) -> int:
        with self._write() as _:
            upto = self._meta("revision") - (self.max_events if keep is None else keep)
            if upto > 0:
                self._compact(upto)
            return self._meta("compacted")

    def revision(self) -> int:
        with self._read():
            return self._meta("revision")

    def watch(self, kinds: list[str] | None, since: int | None, timeout: float | None) -> Watch:
        return SqliteWatch(self, kinds, since, timeout)

    # ---- liveness (outside objects, revisions and events) -----------------------------------

    def hold_liveness(self, name: str, ttl: float, holder: str) -> Heartbeat:
        beat = SqliteHeartbeat(self, name, ttl, holder)
        beat.take()
        return beat

    def liveness(self) -> dict[str, Liveness]:
        with self._read() as conn:
            rows = conn.execute("SELECT name, holder, ttl FROM liveness WHERE expires > ? ORDER BY name",
                                (time.time(),)).fetchall()
        return {name: Liveness(name, holder, ttl) for name, holder, ttl in rows}


class SqliteHeartbeat(Heartbeat):
    """A liveness row held by one holder (its random token): renewed by moving its expiry on."""

    def __init__(self, backend: SqliteBackend, name: str, ttl: float, holder: str) -> None:
        self._backend = backend
        self.name, self.ttl, self.holder = name, ttl, holder
        self._token = uuid.uuid4().hex

    def take(self) -> None:
        with self._backend._write() as conn:
            conn.execute("INSERT OR REPLACE INTO liveness (name, holder, token, ttl, expires) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (self.name, self.holder, self._token, self.ttl, time.time() + self.ttl))

    def renew(self) -> bool:
        now = time.time()
        with self._backend._write() as conn:
            held = conn.execute("UPDATE liveness SET expires = ? WHERE name = ? AND token = ? AND expires > ?",
                                (now + self.ttl, self.name, self._token, now)).rowcount == 1
        if not held:
            self.take()
        return held

    def release(self) -> None:
        with contextlib.suppress(StoreError):
            with self._backend._write() as conn:
                conn.execute("DELETE FROM liveness WHERE name = ? AND token = ?", (self.name, self._token))


class SqliteWatch(Watch):
    """A watch on a SqliteBackend: its own connection, polling the events table by data_version."""

    def __init__(self, backend: SqliteBackend, kinds: list[str] | None, since: int | None,
                 timeout: float | None) -> None:
        self._backend = backend
        self._kinds = kinds
        self._stopped = threading.Event()
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._buffer: deque[WatchEvent] = deque()
        self._data_version: int | None = None
        #: the next wait while a wake-up has not shown its commit yet (0: not waiting for one)
        self._settle = 0.0
        self._conn = backend._connect()
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as err:
            self._conn.close()
            raise _translate(err, backend.path) from None
        self._last = int(meta["revision"]) if since is None else since
        self._woken = False
        try:
            self._check_compacted(int(meta["compacted"]))
        except Gone:
            self._close()
            raise
        self._woken = _FILE_WAKES.acquire(backend.path)

    def _check_compacted(self, compacted: int) -> None:
        if self._last < compacted:
            self.stop()
            raise Gone(f"revision {self._last} is too old: events up to {compacted} were compacted",
                       hint="list again and watch from the list's resourceVersion")

    def stop(self) -> None:
        self._stopped.set()
        self._backend._notifier.notify()

    def __exit__(self, *exc: object) -> None:
        """Leaving the with-block ends the watch and gives back its connection and its share of
        the file wakes now: a reader that broke out of the loop never calls ``next`` again, which
        is where a stopped watch otherwise closes. (A share left behind kept its directory
        watched past the directory's removal: a store made again at the same path then woke this
        process's watches only at WAKE_SAFETY.)"""
        self.stop()
        self._close()

    def _close(self) -> None:
        if self._woken:
            self._woken = False
            _FILE_WAKES.release(self._backend.path)
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def _fetch(self) -> bool:
        """Read new events into the buffer; whether a commit became visible since the last look."""
        conn = self._conn
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version == self._data_version:
                return False
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
            raise _translate(err, self._backend.path) from None
        for rv, event_type, blob in rows:
            self._buffer.append(WatchEvent(event_type, orjson.loads(blob), str(rv)))
        if len(rows) == 1000:
            self._last = rows[-1][0]  # more to read: come back without waiting for data_version
        else:
            self._last = max(self._last, int(meta["revision"]))
            self._data_version = version
        return True

    def __next__(self) -> WatchEvent:
        notifier = self._backend._notifier
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._stopped.is_set():
                self._close()
                raise StopIteration
            with notifier.cond:
                seen = notifier.counter
            try:
                visible = self._fetch()
            except BaseException:
                # the watch ends here (Gone, a store error): give back its connection and its
                # share of the file wakes now, not whenever the caller drops it
                self._stopped.set()
                self._close()
                raise
            if self._buffer:
                continue
            if visible:
                # a commit showed and brought nothing for this watch (a liveness renewal, another
                # kind): the one a wake-up announced is in, so no looking again for it
                self._settle = 0.0
            if self._settle:
                # woken, and nothing new yet: the commit may not be visible yet (on a busy machine
                # it can take a while): look again, less and less often
                wait = self._settle
                self._settle = self._settle * 2 if self._settle < SETTLE_MAX else 0.0
            elif self._woken and not _FILE_WAKES.failed:
                wait = WAKE_SAFETY
            else:
                wait = self._backend.poll_interval
            if self._deadline is not None:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self.stop()
                    continue
                wait = min(wait, remaining)
            with notifier.cond:
                if notifier.counter == seen:
                    notifier.cond.wait(wait)
                if notifier.counter != seen:
                    self._settle = SETTLE   # woken (again): a new commit to look for
