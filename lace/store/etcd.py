"""etcd v3 storage: the backend for a store shared by many nodes, with the SQLite backend's semantics.

**Keys**, like kube-apiserver's under its ``--etcd-prefix``: an object is the key
``<prefix>/registry/<Kind>/<namespace>/<name>`` (``<prefix>/registry/<Kind>/<name>`` for a
cluster-scoped kind), its value the object's JSON *without* ``metadata.resourceVersion``; a named
counter is ``<prefix>/counters/<name>`` (a decimal). Two kinds of bookkeeping keys, with empty
values, back the transactions (below): ``<prefix>/guards/...`` record deletes and
``<prefix>/txn-guard`` records every commit. Several stores can share one etcd under different
prefixes (the tests do). Keys are ordered, so the objects of a kind whose names share a prefix are
one key range: ``list_prefix`` reads the leases of one address block (an IPLease is named after
its address) without the rest of the kind.

**Revisions** are etcd's: an object's ``resourceVersion`` is its key's ``mod_revision``, set on
every read rather than stored (as the apiserver does), and the cluster revision is etcd's header
revision. An etcd transaction gives all its writes ONE revision, so objects written by one lace
transaction share it (SQLite gives each its own); they are stamped with the commit's revision
after the commit. ``watch`` is an etcd watch on ``<prefix>/registry/`` from ``since + 1``, with
``prev_kv`` for what a DELETED event carries; a ``since`` that etcd compacted raises ``Gone`` (the
watch checks before it starts, and etcd's compaction cancel ends a running one the same way), so
clients relist. Compaction is etcd's own (``compact``, or the server's auto-compaction).

**Transactions** are optimistic and serializable across processes and nodes. A transaction reads
one snapshot (every read at the revision of its first one), records what it read, buffers its
writes, and commits them in one etcd Txn whose compares say that nothing it read has changed
since: each key read by itself still has the ``mod_revision`` it had (0 if it was absent), and
each key range listed holds no key written after the snapshot (a compare with ``range_end``:
every key's ``mod_revision`` below snapshot + 1, which catches modified and created keys). A
deleted key leaves nothing in its range to compare, so a commit that deletes also rewrites a
delete guard, ``<prefix>/guards/<Kind>/[<namespace>/]<name up to its last dash>`` (the leases of
one address block share one), and a listed range also compares that no guard under its own cut
(its prefix up to its last dash or slash, a prefix of the guard of every key it can hold) was
rewritten. If every read would still give the same answer when the Txn applies, the transaction
is as if it had run alone at that revision; two transactions never both commit if either read
what the other wrote. Writers of disjoint keys and ranges — nodes allocating addresses from their
own blocks — commit side by side instead of retrying each other. A transaction with more to check
than MAX_COMPARES, or that listed a range of more than WIDE_RANGE keys (etcd reads a compared
range whole while it applies the Txn), compares only ``<prefix>/txn-guard``, which every commit
rewrites: it commits only if nothing at all was committed since its snapshot, as every writer did
before the finer checks (like SQLite's ``BEGIN IMMEDIATE``, without a lock a crashed writer could
leave held). A lost race runs the whole transaction body again (``run``) on a fresh snapshot, with
jittered backoff, a bounded number of times. Read-only transactions never commit: a snapshot
needs no check. Delete guards are never removed (removing one could hide a delete from a
transaction still in flight), so there is one per family of names ever deleted: per address block
for leases, per name stem for other kinds. Every lace client of one store must use the same
scheme: a client that only compares ``txn-guard`` (an older lace) does not see another's commits
that skip it, nor write the delete guards the newer ones check.

**Liveness** keys, ``<prefix>/liveness/<node>``, are the one thing with an etcd lease: an agent
grants a lease of its TTL, puts its node's key on it and keeps the lease alive; when the agent
dies or loses the cluster's leader (a partition) the lease expires and etcd deletes the key. That
delete touches no guard, so these keys stay outside everything the guarded transactions read, and
outside the ``registry/`` prefix the watch covers: liveness is read by listing the prefix
(``liveness``), never inside a transaction. A heartbeat has its own client with a request timeout
of a third of its TTL, so a renewal that cannot get through fails while the lease still runs.

**Client**: etcd3gw (maintained by OpenStack) over etcd's v3 JSON gateway, for the unary calls
(range, txn, compaction, status, leases): pure Python over ``requests``, no gRPC or protobuf
build, works with Debian's etcd 3.4. Its watch helper is not used: it drops etcd's compaction
cancel and the errors of its reader thread (a compacted or broken watch would block forever
instead of raising Gone or Unavailable) and stops by closing a socket it does not own. So the
watch stream is read here over ``http.client`` on a socket this module opens and can shut down
from any thread. Every client socket is created inside ``netns`` when one is given (setns of the
creating thread only, ``lace.nsenter``), so a process in the root namespace reaches an etcd that
listens only inside a lab's namespace; ``trust_env`` is off so no proxy setting reroutes it.

Endpoints are tried in order; a request that could not be sent (connection refused, connect
timeout) goes to the next one. A commit whose request may have reached etcd is never resent
(it may have committed): the caller gets ``Unavailable`` saying the outcome is unknown.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import math
import os
import queue
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import etcd3gw
import orjson
import requests
import requests.adapters
import urllib3
from etcd3gw import exceptions as etcd_errors

from lace import nsenter
from lace.store import netns_http
from lace.store.api import Heartbeat, Liveness, Watch, WatchEvent
from lace.store.backend import Backend, Transaction, prefix_end
from lace.store.errors import Conflict, Gone, StoreError, Unavailable

T = TypeVar("T")

DEFAULT_PREFIX = "/lace"
DEFAULT_MAX_EVENTS = 10_000
DEFAULT_PORT = 2379
CONNECT_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0
#: how often ``run`` retries a body whose commit lost the race, before giving up
MAX_ATTEMPTS = 64
_BACKOFF_FIRST, _BACKOFF_MAX = 0.001, 0.05
#: keys read in one Txn by ``prefetch`` (under etcd's default --max-txn-ops of 128)
_PREFETCH_BATCH = 128
#: conditions a commit checks at most before it checks "no commit since the snapshot" instead
#: (etcd's default --max-txn-ops, 128, bounds a Txn's compares too)
MAX_COMPARES = 64
#: keys a listed range holds at most for a commit to check it key by key: etcd reads the whole
#: range at the commit, inside its apply loop (larger ones fall back as above)
WIDE_RANGE = 1024

_COMPACTED = "required revision has been compacted"
_FUTURE = "required revision is a future revision"
_HINT_REACH = ("start etcd (`lace lab up --store etcd` starts one in the lab), and check the "
               "endpoints and that the network namespace reaches them")


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _range_end(prefix: str) -> str:
    """The end of the key range that holds every key starting with ``prefix`` (never empty here)."""
    end = prefix_end(prefix)
    assert end is not None
    return end


@dataclass(frozen=True)
class Endpoint:
    """One etcd member's client URL, split for the HTTP clients."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """``http://HOST:PORT``, ``HOST:PORT``, ``[V6]:PORT`` or ``HOST`` (port 2379)."""
        url = urllib.parse.urlsplit(text if "//" in text else f"http://{text}")
        if url.scheme != "http" or not url.hostname:
            raise Unavailable(f'"{text}" is not an etcd endpoint',
                              hint="give HOST:PORT or http://HOST:PORT (TLS is not supported yet)")
        return cls(url.hostname, url.port or DEFAULT_PORT)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class _Retry(Exception):
    """The transaction's snapshot is gone (compacted) or its commit lost the race: run it again."""


class _EtcdError(Exception):
    """An error etcd answered with (``message`` is etcd's text)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _netns_session(netns: str | None) -> requests.Session:
    """A requests session whose new connections are opened inside ``netns`` (None: where we are)."""
    session = requests.Session()
    session.trust_env = False
    if netns is not None:
        adapter = requests.adapters.HTTPAdapter()
        adapter.poolmanager.pool_classes_by_scheme = netns_http.pool_classes(netns, _netns_error)
        session.mount("http://", adapter)
    return session


def _netns_error(err: nsenter.NetnsError) -> Unavailable:
    return Unavailable(f"cannot enter the network namespace {err.target} to reach etcd "
                       f"({err.step}: {err.strerror})",
                       hint="is the lab up? `lace lab status` shows it")


def _sent_nothing(err: BaseException) -> bool:
    """Whether a failed request never reached the server (so resending it cannot repeat it)."""
    cause = err.__context__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError):
        reason = getattr(cause.args[0], "reason", None) if cause.args else None
        return isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


class _Gateway:
    """etcd's v3 JSON gateway on one or more members, through etcd3gw's client."""

    def __init__(self, endpoints: Sequence[Endpoint], netns: str | None, timeout: float) -> None:
        if not endpoints:
            raise Unavailable("no etcd endpoint given", hint="give at least one HOST:PORT")
        self.endpoints = list(endpoints)
        self.netns = netns
        self.timeout = timeout
        self.session = _netns_session(netns)
        self._clients = [etcd3gw.Etcd3Client(e.host, e.port, timeout=(CONNECT_TIMEOUT, timeout),
                                             api_path="/v3/", session=self.session)
                         for e in self.endpoints]
        self._current = 0

    def where(self) -> str:
        where = ", ".join(str(e) for e in self.endpoints)
        return where + (f" (from network namespace {self.netns})" if self.netns else "")

    def call(self, path: str, body: dict[str, Any], *, idempotent: bool = True) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` of the first member that answers; etcd's own errors
        raise _EtcdError, an unreachable cluster Unavailable."""
        failures: list[str] = []
        for i in range(len(self._clients)):
            index = (self._current + i) % len(self._clients)
            client = self._clients[index]
            try:
                result = client.post(client.get_url(path), data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"})
                self._current = index
                return result  # type: ignore[no-any-return]
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as err:
                if not idempotent and not _sent_nothing(err):
                    raise Unavailable(
                        f"lost the connection to etcd at {self.endpoints[index]} during a commit: "
                        "it may or may not have been applied",
                        hint="read the objects again before retrying") from None
                failures.append(f"{self.endpoints[index]}: {_short(err)}")
            except etcd_errors.Etcd3Exception as err:
                raise _EtcdError(_etcd_message(err)) from None
        raise Unavailable(f"cannot reach etcd at {self.where()}: {'; '.join(failures)}",
                          hint=_HINT_REACH)

    def close(self) -> None:
        self.session.close()


def _short(err: BaseException) -> str:
    text = str(err.__context__ or err)
    for marker in ("Connection refused", "timed out", "No route to host", "Network is unreachable",
                   "Connection reset", "Name or service not known"):
        if marker in text:
            return marker.lower()
    return text[:200]


def _etcd_message(err: etcd_errors.Etcd3Exception) -> str:
    detail = getattr(err, "detail_text", None) or str(err)
    try:
        data = orjson.loads(detail)
        return str(data.get("message") or data.get("error") or detail)
    except orjson.JSONDecodeError:
        return str(detail)


class _EtcdTransaction(Transaction):
    """One snapshot of the store, read at the revision where it began, and the writes to commit.

    Reads are cached (a range at a fixed revision never changes) and see this transaction's own
    writes. What was read is recorded, for the commit to check that none of it changed since the
    snapshot (``compares``): the keys read one by one (objects, counters) and the key ranges
    listed. Objects handed out by create/update/delete are kept, to be stamped with the commit's
    revision.
    """

    def __init__(self, backend: EtcdBackend, write: bool) -> None:
        self._backend = backend
        self._write = write
        self._rev: int | None = None      # the snapshot revision: that of the first read
        self._keys: dict[str, tuple[bytes, int] | None] = {}     # key -> (value, mod_revision)
        self._points: set[str] = set()                           # keys read one by one
        self._lists: dict[str, list[str]] = {}                   # prefix -> keys in it
        self._wide = False                # a range too large to check key by key was listed
        self.writes: dict[str, bytes | None] = {}                # key -> value, None: delete
        self.stamped: list[dict] = []

    # ---- reading the snapshot --------------------------------------------------------------

    def _range(self, key: str, range_end: str | None = None) -> list[dict[str, Any]]:
        head, kvs = self._backend._range(key, self._rev, range_end)
        if self._rev is None:
            self._rev = head
        return kvs

    def _listed(self, key: str) -> str | None:
        """A listed prefix that ``key`` is under, if any: its snapshot state is known already."""
        return next((p for p in self._lists if key.startswith(p)), None)

    def _load(self, key: str) -> tuple[bytes, int] | None:
        if key in self.writes:
            value = self.writes[key]
            return None if value is None else (value, self.revision() + 1)
        if key not in self._keys:
            if self._listed(key) is not None:
                return None        # under a listed prefix and not in the listing: absent
            kvs = self._range(key)
            self._keys[key] = (_unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"])) if kvs else None
            self._points.add(key)
        return self._keys[key]

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        found = self._load(self._backend._key(kind, namespace, name))
        return None if found is None else _decode(*found)

    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        return self._list_range(self._backend._kind_prefix(kind, namespace))

    def list_prefix(self, kind: str, namespace: str, prefix: str) -> list[dict]:
        # a key range: <prefix>/registry/<Kind>/[<namespace>/]<name prefix>
        objs = self._list_range(self._backend._kind_prefix(kind, namespace) + prefix)
        if not namespace:   # a namespaced kind's keys have a namespace where a name would be
            objs = [o for o in objs if not o["metadata"].get("namespace")]
        return objs

    def _list_range(self, prefix: str) -> list[dict]:
        if prefix not in self._lists:
            outer = self._listed(prefix)
            if outer is not None:      # inside a range listed already: no request
                self._lists[prefix] = [k for k in self._lists[outer] if k.startswith(prefix)]
            else:
                self._listed_now(prefix, self._range(prefix, _range_end(prefix)))
        keys = set(self._lists[prefix]) | {k for k in self.writes if k.startswith(prefix)}
        objs = [_decode(*found) for key in keys if (found := self._load(key)) is not None]
        objs.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return objs

    def _listed_now(self, prefix: str, kvs: list[dict[str, Any]]) -> None:
        """Record the snapshot's keys under ``prefix`` (a range read): to serve, and to check."""
        keys = []
        for kv in kvs:
            key = _unb64(kv["key"]).decode()
            self._keys[key] = (_unb64(kv.get("value", "")), int(kv["mod_revision"]))
            keys.append(key)
        self._lists[prefix] = keys
        self._wide = self._wide or len(keys) > WIDE_RANGE

    def prefetch(self, keys: list[tuple[str, str, str]],
                 prefixes: list[tuple[str, str, str]] | None = None) -> None:
        """Read the objects and name-prefix ranges not read yet in one etcd Txn of range requests
        (at the snapshot's revision, so the answers are the snapshot's), 128 a request: a batch of
        N reads costs one round trip instead of N."""
        backend = self._backend
        todo: list[tuple[str, str | None]] = [
            (k, None) for k in dict.fromkeys(backend._key(*t) for t in keys)
            if k not in self._keys and k not in self.writes and self._listed(k) is None]
        for p in dict.fromkeys(backend._kind_prefix(kind, ns) + name for kind, ns, name in prefixes or ()):
            if self._listed(p) is None:
                todo.append((p, _range_end(p)))
        for i in range(0, len(todo), _PREFETCH_BATCH):
            chunk = todo[i:i + _PREFETCH_BATCH]
            rev = self.revision()
            out = backend._call("kv/txn", {"success": [
                {"request_range": {"key": _b64(k), "revision": rev, **({"range_end": _b64(end)} if end else {})}}
                for k, end in chunk]})
            for (key, end), answer in zip(chunk, out.get("responses", [])):
                kvs = (answer.get("response_range") or {}).get("kvs") or []
                if end is None:
                    self._keys[key] = (_unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"])) if kvs else None
                    self._points.add(key)
                else:
                    self._listed_now(key, kvs)

    def revision(self) -> int:
        if self._rev is None:
            self._range(self._backend._guard)
        assert self._rev is not None
        return self._rev

    def compares(self) -> list[dict[str, Any]]:
        """The commit's condition: nothing this transaction read changed after its snapshot.

        A key read one by one still has the mod_revision it had (0: still absent). A listed range
        holds no key modified or created after the snapshot (every key's mod_revision is at most
        the snapshot's) and lost none: no delete guard under the range's moved (a delete bumps
        ``_delete_guard`` of its key, which is under ``_delete_guards`` of every range holding
        the key). Keys under a listed range need no check of their own. So a commit succeeds only
        if every read would give the same answer at the commit's revision: the transaction is as
        if it ran there, alone, and writers of disjoint keys and ranges commit side by side.

        Too much to check this way (more than MAX_COMPARES conditions, or a range of more than
        WIDE_RANGE keys, which etcd would read whole at the commit) falls back to the one
        condition that covers everything: no commit at all since the snapshot (every commit
        rewrites ``<prefix>/txn-guard``).
        """
        backend = self._backend
        after = self.revision() + 1
        ranges = _outermost(self._lists)
        out = [_unchanged_range(p, after) for p in ranges]
        out += [_unchanged_range(g, after) for g in _outermost(backend._delete_guards(p) for p in ranges)]
        for key in sorted(self._points):
            if not any(key.startswith(p) for p in ranges):
                found = self._keys[key]
                out.append({"key": _b64(key), "target": "MOD", "result": "EQUAL",
                            "mod_revision": 0 if found is None else found[1]})
        if self._wide or len(out) > MAX_COMPARES:
            return [{"key": _b64(backend._guard), "target": "MOD", "result": "LESS", "mod_revision": after}]
        return out

    # ---- buffered writes ---------------------------------------------------------------------

    def _writable(self) -> None:
        if not self._write:
            raise StoreError("a read-only transaction cannot write")

    def create(self, obj: dict) -> dict:
        return self._put(obj)

    def update(self, obj: dict) -> dict:
        return self._put(obj)

    def _put(self, obj: dict) -> dict:
        self._writable()
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.revision() + 1)   # provisional: stamped at commit
        key = self._backend._key(obj["kind"], meta.get("namespace", ""), meta["name"])
        self.writes[key] = _encode(obj)
        self.stamped.append(obj)
        return obj

    def delete(self, obj: dict) -> dict:
        self._writable()
        out = orjson.loads(orjson.dumps(obj))
        meta = out["metadata"]
        meta["resourceVersion"] = str(self.revision() + 1)
        self.writes[self._backend._key(out["kind"], meta.get("namespace", ""), meta["name"])] = None
        self.stamped.append(out)
        return out

    def next_value(self, counter: str, first: int) -> int:
        self._writable()
        key = self._backend._counter_key(counter)
        found = self._load(key)
        value = first if found is None else int(found[0])
        self.writes[key] = str(value + 1).encode()
        return value


def _outermost(prefixes: Iterable[str]) -> list[str]:
    """The prefixes that no other one of them is a prefix of (their ranges hold the others')."""
    out: list[str] = []
    for p in sorted(set(prefixes)):
        if not out or not p.startswith(out[-1]):
            out.append(p)
    return out


def _unchanged_range(prefix: str, after: int) -> dict[str, Any]:
    """A compare: no key starting with ``prefix`` was written at revision ``after`` or later."""
    return {"key": _b64(prefix), "range_end": _b64(_range_end(prefix)), "target": "MOD",
            "result": "LESS", "mod_revision": after}


def _encode(obj: dict) -> bytes:
    """The stored value: the object without its resourceVersion (the key's mod_revision is)."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return orjson.dumps({**obj, "metadata": meta})


def _decode(value: bytes, mod_revision: int) -> dict:
    obj = orjson.loads(value)
    obj["metadata"]["resourceVersion"] = str(mod_revision)
    return obj


class EtcdBackend(Backend):
    """The generic backend on an etcd v3 cluster; safe to share between threads."""

    def __init__(self, endpoints: Sequence[str | Endpoint], *, prefix: str = DEFAULT_PREFIX,
                 netns: str | None = None, timeout: float = REQUEST_TIMEOUT,
                 max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if not prefix.startswith("/") or prefix.endswith("/"):
            raise StoreError(f'etcd key prefix "{prefix}" must start with "/" and not end with one')
        self.prefix = prefix
        self.max_events = max_events
        self.gateway = _Gateway([e if isinstance(e, Endpoint) else Endpoint.parse(e) for e in endpoints],
                                netns, timeout)
        self._registry = f"{prefix}/registry/"
        self._guard = f"{prefix}/txn-guard"
        self._guards = f"{prefix}/guards/"
        self._liveness = f"{prefix}/liveness/"

    @property
    def endpoints(self) -> list[Endpoint]:
        return self.gateway.endpoints

    @property
    def netns(self) -> str | None:
        return self.gateway.netns

    # ---- keys --------------------------------------------------------------------------------

    def _key(self, kind: str, namespace: str, name: str) -> str:
        return f"{self._registry}{kind}/{namespace}/{name}" if namespace else f"{self._registry}{kind}/{name}"

    def _kind_prefix(self, kind: str, namespace: str | None) -> str:
        return f"{self._registry}{kind}/{namespace}/" if namespace else f"{self._registry}{kind}/"

    def _counter_key(self, counter: str) -> str:
        return f"{self.prefix}/counters/{counter}"

    def _delete_guard(self, key: str) -> str:
        """The key a delete of the registry key ``key`` rewrites: ``<prefix>/guards/<Kind>/
        [<namespace>/]`` and the name up to its last dash (the leases of one address block share
        one, ``.../guards/IPLease/default-10-244-1-``); one key per such family, never deleted."""
        head, _, name = key[len(self._registry):].rpartition("/")
        return f"{self._guards}{head}/{name[:name.rfind('-') + 1]}"

    def _delete_guards(self, prefix: str) -> str:
        """The prefix of every delete guard a key under the registry prefix ``prefix`` has: the
        prefix cut after its last dash or slash (a key under it has its last dash, or its name's
        last slash, at that point or later)."""
        rel = prefix[len(self._registry):]
        return f"{self._guards}{rel[:max(rel.rfind('-'), rel.rfind('/')) + 1]}"

    def _liveness_key(self, name: str) -> str:
        return f"{self._liveness}{name}"

    def _kind_of(self, key: str) -> str:
        return key[len(self._registry):].split("/", 1)[0]

    # ---- requests ----------------------------------------------------------------------------

    def _call(self, path: str, body: dict[str, Any], *, idempotent: bool = True) -> dict[str, Any]:
        try:
            return self.gateway.call(path, body, idempotent=idempotent)
        except _EtcdError as err:
            if _COMPACTED in err.message:
                raise _Retry(err.message) from None
            raise StoreError(f"etcd at {self.gateway.where()} refused {path}: {err.message}",
                             hint=_hint_for(err.message)) from None

    def _range(self, key: str, revision: int | None,
               range_end: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(header revision, kvs) of a key or range, at ``revision`` (None: the latest)."""
        body: dict[str, Any] = {"key": _b64(key)}
        if range_end is not None:
            body["range_end"] = _b64(range_end)
        if revision is not None:
            body["revision"] = revision
        out = self._call("kv/range", body)
        return int(out["header"]["revision"]), out.get("kvs", [])

    # ---- transactions ------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, *, write: bool = True, dry_run: bool = False) -> Iterator[Transaction]:
        txn = _EtcdTransaction(self, write)
        try:
            yield txn
        except _Retry:
            raise Conflict("the store changed while this transaction read it (compacted past its "
                           "snapshot)", hint="run it again") from None
        if write and not dry_run and not self._commit(txn):
            raise Conflict("another writer committed first", hint="run the transaction again")

    def run(self, body: Callable[[Transaction], T], *, write: bool = True,
            dry_run: bool = False) -> T:
        backoff = _BACKOFF_FIRST
        for _ in range(MAX_ATTEMPTS):
            try:
                txn = _EtcdTransaction(self, write)
                result = body(txn)
                if not write or dry_run or self._commit(txn):
                    return result
            except _Retry:
                pass
            time.sleep(random.uniform(0, backoff))
            backoff = min(backoff * 2, _BACKOFF_MAX)
        raise Unavailable(f"etcd at {self.gateway.where()}: a write lost the race to other writers "
                          f"{MAX_ATTEMPTS} times in a row",
                          hint="the store is under heavy write contention; retry")

    def _commit(self, txn: _EtcdTransaction) -> bool:
        """Commit the buffered writes if nothing the transaction read changed since its snapshot
        (``_EtcdTransaction.compares``); False if something did (the body must run again).
        Nothing buffered commits nothing (no new revision)."""
        if not txn.writes:
            return True
        ops: list[dict[str, Any]] = []
        guards: set[str] = set()
        for key, value in txn.writes.items():
            if value is None:
                ops.append({"request_delete_range": {"key": _b64(key)}})
                if key.startswith(self._registry):
                    guards.add(self._delete_guard(key))
            else:
                ops.append({"request_put": {"key": _b64(key), "value": _b64(value)}})
        # a delete is invisible to a range's mod_revision compare: its guard key says it happened
        ops += [{"request_put": {"key": _b64(g), "value": ""}} for g in sorted(guards)]
        ops.append({"request_put": {"key": _b64(self._guard), "value": ""}})   # for the fallback
        out = self._call("kv/txn", {"compare": txn.compares(), "success": ops}, idempotent=False)
        if not out.get("succeeded"):
            return False
        revision = str(out["header"]["revision"])
        for obj in txn.stamped:
            obj["metadata"]["resourceVersion"] = revision
        return True

    # ---- revision, compaction, watch ---------------------------------------------------------

    def revision(self) -> int:
        return self._range(self._guard, None)[0]

    def compact(self, keep: int | None = None) -> int:
        """Compact etcd so that watches can start at most ``keep`` revisions back; returns the
        revision up to which events are gone (a lower bound if etcd was compacted further)."""
        upto = self.revision() - (self.max_events if keep is None else keep)
        if upto <= 0:
            return 0
        try:
            self._call("kv/compaction", {"revision": upto + 1})
        except _Retry:
            pass   # already compacted at least that far
        return upto

    def _check_not_compacted(self, since: int) -> None:
        """Gone if the events after ``since`` are no longer kept (a range at since + 1 fails)."""
        try:
            self.gateway.call("kv/range", {"key": _b64(self._guard), "revision": since + 1,
                                           "count_only": True})
        except _EtcdError as err:
            if _COMPACTED in err.message:
                raise Gone(f"revision {since} is too old: etcd compacted the events after it",
                           hint="list again and watch from the list's resourceVersion") from None
            if _FUTURE not in err.message:
                raise StoreError(f"etcd at {self.gateway.where()}: {err.message}") from None

    def watch(self, kinds: list[str] | None, since: int | None, timeout: float | None) -> Watch:
        return EtcdWatch(self, kinds, since, timeout)

    # ---- liveness: leased keys, outside the registry and the guard ---------------------------

    def hold_liveness(self, name: str, ttl: float, holder: str) -> Heartbeat:
        return EtcdHeartbeat(self, name, ttl, holder)

    def liveness(self) -> dict[str, Liveness]:
        _, kvs = self._range(self._liveness, None, _range_end(self._liveness))
        out = {}
        for kv in kvs:
            name = _unb64(kv["key"]).decode()[len(self._liveness):]
            try:
                value = orjson.loads(_unb64(kv.get("value", "")))
                out[name] = Liveness(name, str(value.get("holder", "")), float(value.get("ttl", 0)))
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                out[name] = Liveness(name, "", 0.0)   # someone else's value: still a held key
        return out

    def close(self) -> None:
        self.gateway.close()


class EtcdHeartbeat(Heartbeat):
    """A node's liveness key on an etcd lease of ``ttl`` seconds (rounded up: etcd counts whole
    seconds), kept alive by ``renew``; etcd deletes the key when the lease runs out."""

    def __init__(self, backend: EtcdBackend, name: str, ttl: float, holder: str) -> None:
        self.name, self.ttl, self.holder = name, ttl, holder
        self._key = backend._liveness_key(name)
        self._gateway = _Gateway(backend.endpoints, backend.netns, max(0.5, ttl / 3))
        self._lease: str | None = None
        try:
            self._take()
        except BaseException:
            self._gateway.close()
            raise

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._gateway.call(path, body)
        except _EtcdError as err:
            raise Unavailable(f'etcd at {self._gateway.where()} refused {path} for the liveness of '
                              f'"{self.name}": {err.message}', hint=_hint_for(err.message)) from None

    def _take(self) -> None:
        granted = self._call("lease/grant", {"TTL": max(1, math.ceil(self.ttl))})
        if granted.get("error") or not granted.get("ID"):
            raise Unavailable(f'etcd at {self._gateway.where()} granted no lease for the liveness of '
                              f'"{self.name}": {granted.get("error") or granted}')
        lease = str(granted["ID"])
        value = orjson.dumps({"holder": self.holder, "ttl": self.ttl, "pid": os.getpid()})
        try:
            self._call("kv/put", {"key": _b64(self._key), "value": _b64(value), "lease": lease})
        except BaseException:
            # the key was not written: keeping this lease would let renew() keep alive a lease
            # that holds nothing and report the node alive while it reads as gone
            with contextlib.suppress(StoreError):
                self._call("kv/lease/revoke", {"ID": lease})
            raise
        self._lease = lease     # only once the key is on it

    def renew(self) -> bool:
        if self._lease is None:
            self._take()
            return False
        answer = self._call("lease/keepalive", {"ID": self._lease})
        if int((answer.get("result") or answer).get("TTL", 0) or 0) > 0:
            return True
        self._lease = None      # expired while we could not renew it: etcd deleted the key
        self._take()
        return False

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            with contextlib.suppress(StoreError):
                self._call("kv/lease/revoke", {"ID": lease})
        self._gateway.close()


def _hint_for(message: str) -> str | None:
    if "too many operations" in message:
        return "raise etcd's --max-txn-ops (the lab starts etcd with a high limit), or write less at once"
    if "request is too large" in message:
        return "raise etcd's --max-request-bytes, or write less at once"
    if "no leader" in message or "timed out" in message:
        return "the etcd cluster has no quorum: check that most of its members run"
    return None


_END = object()


class EtcdWatch(Watch):
    """An etcd watch stream on the registry prefix, read by a thread into a queue.

    The stream is one HTTP/1.1 chunked response of the gateway, one JSON message a line, on a
    socket opened here (inside the backend's namespace) so that ``stop`` can shut it down from any
    thread. A broken stream ends the watch with Unavailable, a compaction cancel with Gone; the
    callers (agents, controllers) watch again from the last revision they saw.
    """

    def __init__(self, backend: EtcdBackend, kinds: list[str] | None, since: int | None,
                 timeout: float | None) -> None:
        self._backend = backend
        self._kinds = None if kinds is None else set(kinds)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stopped = threading.Event()
        if since is not None:
            backend._check_not_compacted(since)
        request: dict[str, Any] = {"key": _b64(backend._registry),
                                   "range_end": _b64(_range_end(backend._registry)),
                                   "prev_kv": True}
        if since is not None:
            request["start_revision"] = since + 1
        self._conn, self._response = self._open({"create_request": request})
        try:
            created = self._message()
        except (OSError, EOFError, http.client.HTTPException, ValueError) as err:
            self._conn.close()
            raise Unavailable(f"etcd at {backend.gateway.where()} did not start the watch: {err}",
                              hint=_HINT_REACH) from None
        if not created.get("created"):
            self._conn.close()
            raise Unavailable(f"etcd at {backend.gateway.where()} did not start the watch: "
                              f"{created.get('cancel_reason') or created}")
        self._last = since if since is not None else int(created["header"]["revision"])
        self._reader = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self._reader.start()

    def _open(self, body: dict[str, Any]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        gateway = self._backend.gateway
        failures = []
        for endpoint in gateway.endpoints:
            conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=CONNECT_TIMEOUT)
            try:
                with nsenter.entered(gateway.netns, translate=_netns_error):
                    conn.connect()
                conn.sock.settimeout(None)   # a watch waits for writes as long as it takes
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.request("POST", "/v3/watch", body=orjson.dumps(body),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
            except OSError as err:
                conn.close()
                failures.append(f"{endpoint}: {err.strerror or err}")
                continue
            if response.status != 200:
                text = response.read(4096).decode(errors="replace")
                conn.close()
                raise Unavailable(f"etcd at {endpoint} refused a watch (HTTP {response.status}): {text}")
            return conn, response
        raise Unavailable(f"cannot reach etcd at {gateway.where()} to watch: {'; '.join(failures)}",
                          hint=_HINT_REACH)

    def _message(self) -> dict[str, Any]:
        """The next message of the stream (its ``result``); OSError/EOFError when it breaks."""
        while True:
            line = self._response.readline()
            if not line:
                raise EOFError("etcd closed the watch stream")
            if line.strip():
                break
        data = orjson.loads(line)
        if "error" in data:
            err = data["error"]
            raise EOFError(err.get("message") or str(err))
        return data["result"]  # type: ignore[no-any-return]

    def _read(self) -> None:
        try:
            while not self._stopped.is_set():
                result = self._message()
                if int(result.get("compact_revision", 0) or 0):
                    self._queue.put(Gone(
                        f"revision {self._last} is too old: etcd compacted up to "
                        f"{result['compact_revision']}",
                        hint="list again and watch from the list's resourceVersion"))
                    return
                if result.get("canceled"):
                    self._queue.put(Unavailable(f"etcd canceled the watch: "
                                                f"{result.get('cancel_reason') or 'no reason given'}"))
                    return
                for raw in result.get("events", ()):
                    event = self._event(raw)
                    if event is not None:
                        self._queue.put(event)
        except Exception as err:   # noqa: BLE001 - any way the stream breaks ends the watch
            if not self._stopped.is_set():
                self._queue.put(Unavailable(
                    f"lost the watch on etcd at {self._backend.gateway.where()}: {err}",
                    hint="watch again from the last revision seen"))
        finally:
            self._queue.put(_END)
            self._conn.close()   # here, not in stop(): the connection is this thread's to close

    def _event(self, raw: dict[str, Any]) -> WatchEvent | None:
        kv = raw["kv"]
        key = _unb64(kv["key"]).decode()
        kind = self._backend._kind_of(key)
        revision = int(kv["mod_revision"])
        self._last = revision
        if self._kinds is not None and kind not in self._kinds:
            return None
        if raw.get("type") == "DELETE":
            prev = raw.get("prev_kv")
            obj = orjson.loads(_unb64(prev["value"])) if prev and prev.get("value") else _stub(key, kind)
            obj["metadata"]["resourceVersion"] = str(revision)
            return WatchEvent("DELETED", obj, str(revision))
        added = kv.get("create_revision") == kv.get("mod_revision")
        return WatchEvent("ADDED" if added else "MODIFIED",
                          _decode(_unb64(kv.get("value", "")), revision), str(revision))

    def __next__(self) -> WatchEvent:
        while True:
            if self._stopped.is_set():
                raise StopIteration
            remaining = None
            if self._deadline is not None:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self.stop()
                    raise StopIteration
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if item is _END:
                self.stop()
                raise StopIteration
            if isinstance(item, BaseException):
                self.stop()
                raise item
            return item  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._queue.put(_END)
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)   # wakes the reader blocked in recv; it closes


def _stub(key: str, kind: str) -> dict:
    """What a DELETED event carries when etcd no longer has the value before the delete."""
    parts = key.split("/")
    meta = {"name": parts[-1]}
    if len(parts) >= 2 and parts[-3] == kind:
        meta["namespace"] = parts[-2]
    return {"kind": kind, "metadata": meta}


def wait_ready(endpoints: Sequence[str | Endpoint], *, netns: str | None = None,
               timeout: float = 30.0, alive: Callable[[], str | None] | None = None) -> None:
    """Wait until every member answers ``/health`` with ``true`` (a cluster with a leader).

    ``alive`` says why a member's process is gone (None while it runs), to fail at once rather
    than at the timeout; Unavailable names the members that did not come up.
    """
    points = [e if isinstance(e, Endpoint) else Endpoint.parse(e) for e in endpoints]
    deadline = time.monotonic() + timeout
    with contextlib.closing(_netns_session(netns)) as session:
        waiting = list(points)
        last = ""
        while waiting:
            try:
                answer = session.get(f"{waiting[0]}/health", timeout=(CONNECT_TIMEOUT, 2.0))
                if answer.status_code == 200 and answer.json().get("health") == "true":
                    waiting.pop(0)
                    continue
                last = answer.text.strip()
            except (requests.RequestException, ValueError) as err:
                last = _short(err)
            gone = alive() if alive is not None else None
            if gone:
                raise Unavailable(f"etcd exited before it was ready: {gone}")
            if time.monotonic() > deadline:
                raise Unavailable(f"etcd at {', '.join(map(str, waiting))} is not healthy after "
                                  f"{timeout:.0f} s: {last}", hint=_HINT_REACH)
            time.sleep(0.05)


def member_status(endpoint: str | Endpoint, *, netns: str | None = None,
                  timeout: float = 2.0) -> dict[str, Any]:
    """One member's ``/v3/maintenance/status``: its ``header.member_id``, the ``leader`` it
    follows, its version and raft index (Unavailable when it does not answer)."""
    point = endpoint if isinstance(endpoint, Endpoint) else Endpoint.parse(endpoint)
    gateway = _Gateway([point], netns, timeout)
    try:
        return gateway.call("maintenance/status", {})
    except _EtcdError as err:
        raise Unavailable(f"etcd member {point} has no status: {err.message}") from None
    finally:
        gateway.close()


# The Store callers construct on etcd: the binding of this backend under the shared rules and
# allocators, as embedded.py binds SQLite's. It lives here, beside its backend, so that importing
# it needs nothing more than the etcd module; the registry knows nothing of it.
from lace.store.registry import RegistryStore  # noqa: E402


class EtcdStore(RegistryStore):
    """The Store on an etcd v3 cluster: an EtcdBackend under the shared rules and allocators."""

    backend: EtcdBackend

    def __init__(self, endpoints: Sequence[str | Endpoint], *, prefix: str = DEFAULT_PREFIX,
                 netns: str | None = None, timeout: float = REQUEST_TIMEOUT,
                 max_events: int = DEFAULT_MAX_EVENTS) -> None:
        super().__init__(EtcdBackend(endpoints, prefix=prefix, netns=netns, timeout=timeout,
                                     max_events=max_events))

    @property
    def endpoints(self) -> list[Endpoint]:
        return self.backend.endpoints
