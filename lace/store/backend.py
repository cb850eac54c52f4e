"""The generic storage interface each backend implements: objects, one revision, watch, transactions.

Shaped like kube-apiserver's ``storage.Interface``: a backend stores objects by (kind, namespace,
name), stamps every write with the next cluster revision (``metadata.resourceVersion``), records it
as an event that ``watch`` replays until compaction, and runs several reads and writes as one
transaction. Named counters let the layers above hand out IDs without a table of their own.

A backend knows nothing about what a kind means: validation, guards, cascades and allocation live
above it (``rules.py``, ``allocate.py``, composed by ``registry.py``) so every backend shares them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

from lace.store.api import Heartbeat, Liveness, Watch

T = TypeVar("T")


def prefix_end(prefix: str) -> str | None:
    """The smallest string above every string starting with ``prefix`` (None: no bound, for
    ``""``): the exclusive end of a key range holding exactly the keys with that prefix."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            return prefix[:-1] + chr(last + 1)
        prefix = prefix[:-1]
    return None


class Transaction(abc.ABC):
    """Reads and writes that commit together, in revision order, or not at all.

    ``kind`` is always the exact kind (``Pod``); ``namespace`` is ``""`` for cluster-scoped kinds.
    Writes do not check what is stored: the caller read first, inside the same transaction.
    """

    @abc.abstractmethod
    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        """The stored object, or None."""

    @abc.abstractmethod
    def list(self, kind: str, namespace: str | None = None) -> list[dict]:
        """Objects of one kind, in one namespace or (None) all, sorted by namespace and name."""

    def each(self, kind: str, namespace: str | None = None) -> Iterator[dict]:
        """``list``'s objects one at a time, for a caller that keeps less than each whole object
        (a backend that decodes each as it is read holds one at a time)."""
        return iter(self.list(kind, namespace))

    def list_prefix(self, kind: str, namespace: str, prefix: str) -> list[dict]:
        """Objects of one kind in one namespace (``""`` for a cluster-scoped kind) whose name
        starts with ``prefix``, sorted by name.

        Allocation records are named after what they hold (an IPLease after its address), so the
        records of one address block share a prefix and this reads them without the rest of the
        kind. This default lists the namespace and filters; a backend with ordered keys reads just
        the range.
        """
        return [o for o in self.list(kind, namespace)
                if o["metadata"].get("namespace", "") == namespace and o["metadata"]["name"].startswith(prefix)]

    @abc.abstractmethod
    def create(self, obj: dict) -> dict:
        """Store a new object as an ADDED event at the next revision; returns it with its
        ``metadata.resourceVersion`` set."""

    @abc.abstractmethod
    def update(self, obj: dict) -> dict:
        """Replace a stored object as a MODIFIED event at the next revision; returns it with its
        ``metadata.resourceVersion`` set."""

    @abc.abstractmethod
    def delete(self, obj: dict) -> dict:
        """Remove a stored object as a DELETED event at the next revision; returns a copy stamped
        with that revision."""

    @abc.abstractmethod
    def revision(self) -> int:
        """The cluster revision as this transaction sees it."""

    def prefetch(self, keys: list[tuple[str, str, str]],
                 prefixes: list[tuple[str, str, str]] | None = None) -> None:
        """A hint: these objects (kind, namespace, name) and these name prefixes (kind, namespace,
        prefix: ``list_prefix``) are about to be read. A backend whose every read is a round trip
        (etcd) reads them all in one; this default does nothing."""

    @abc.abstractmethod
    def next_value(self, counter: str, first: int) -> int:
        """The named counter's next value (``first`` the first time), advancing it by one; the
        counter rolls back with the transaction."""


class Backend(abc.ABC):
    """Persistence and watch for Kubernetes-shaped objects, with no rule about any kind."""

    @abc.abstractmethod
    def transaction(self, *, write: bool = True,
                    dry_run: bool = False) -> AbstractContextManager[Transaction]:
        """A transaction that commits on a clean exit and rolls back on an exception.

        ``write=False`` is a read-only snapshot; ``dry_run`` rolls back even on a clean exit.
        """

    def run(self, body: Callable[[Transaction], T], *, write: bool = True,
            dry_run: bool = False) -> T:
        """Run ``body`` in one transaction and return what it returned: how the layers above run
        every transaction.

        A backend whose commit can lose a race with another writer (etcd's optimistic
        transactions) runs ``body`` again on a fresh snapshot until it wins, so ``body`` keeps its
        effects inside the transaction (or redoes them harmlessly). This default runs it once, for
        a backend whose write transactions lock out every other writer (SQLite's BEGIN IMMEDIATE)
        and so never lose.
        """
        with self.transaction(write=write, dry_run=dry_run) as txn:
            return body(txn)

    @abc.abstractmethod
    def watch(self, kinds: list[str] | None, since: int | None, timeout: float | None) -> Watch:
        """Events of those exact kinds (None: all) after revision ``since`` (None: from now).

        Raises Gone if ``since`` was compacted away; ``timeout`` as in ``Store.watch``.
        """

    @abc.abstractmethod
    def revision(self) -> int:
        """The current cluster revision."""

    @abc.abstractmethod
    def compact(self, keep: int | None = None) -> int:
        """Drop all but the newest ``keep`` events (a backend default if None); returns the
        revision up to which events are gone."""

    @abc.abstractmethod
    def hold_liveness(self, name: str, ttl: float, holder: str) -> Heartbeat:
        """Take the liveness record ``name`` (``Store.keep_alive``): kept apart from the objects,
        outside every transaction, revision and watch."""

    @abc.abstractmethod
    def liveness(self) -> dict[str, Liveness]:
        """The liveness records held now (``Store.node_liveness``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the backend's resources."""
