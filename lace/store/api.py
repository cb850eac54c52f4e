"""The store interface, shaped like the Kubernetes API so a Kubernetes-backed store can replace it.

Objects are plain dicts in Kubernetes manifest shape. The cluster has one revision counter that every
write bumps (``metadata.resourceVersion`` is its decimal string, as with etcd); ``watch`` streams the
writes after a revision, and a revision that was compacted away raises ``Gone`` (HTTP 410), after
which a client relists and watches from the list's ``resource_version``.

Status is a subresource: ``create``/``apply``/``update`` ignore ``status`` in the body and keep the
stored one; only ``update_status`` writes it. Store-allocated status fields (``Network.status.id``,
``Segment.status.id``, ``Service.status.id`` and ``status.loadBalancer``) are kept by every write.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import ipaddress

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ApplyOutcome = Literal["created", "configured", "unchanged"]
Selector = Mapping[str, Any] | str | None


@dataclasses.dataclass(frozen=True)
class ListResult:
    """A list's items (sorted by namespace, name) and the revision to watch from afterwards."""

    items: list[dict]
    resource_version: str


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One write: ADDED / MODIFIED / DELETED with the object as it was written."""

    type: EventType
    object: dict
    resource_version: str


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did to one object, and the object as now stored."""

    object: dict
    outcome: ApplyOutcome


@dataclasses.dataclass(frozen=True)
class Lease:
    """An address held for a container: its network, IP, IPBlock object name and IPLease name,
    and the IPLease object as stored (a watch's cache can take it before the watch brings it)."""

    network: str
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    block: str
    name: str
    object: dict | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Liveness:
    """A node's liveness record while it is held: who holds it and its time to live (seconds)."""

    name: str
    holder: str
    ttl: float


class Heartbeat(abc.ABC):
    """A liveness record held for one name (a node), kept alive by ``renew``.

    The record disappears from ``Store.node_liveness`` once ``ttl`` seconds pass without a renewal
    (the holder died, or cannot reach the store), without anyone deleting it: on etcd it is a key
    attached to an etcd lease, on SQLite a row with an expiry time. A renewal that finds the record
    already expired takes it again and says so.
    """

    name: str
    holder: str
    ttl: float

    @abc.abstractmethod
    def renew(self) -> bool:
        """Extend the record by ``ttl`` seconds: True if it was still held, False if it had expired
        (or another holder took it) and was taken again. Raises Unavailable when the store cannot
        be reached — the record then expires on its own."""

    @abc.abstractmethod
    def release(self) -> None:
        """Drop the record now (best effort: an unreachable store lets it expire instead)."""


class Watch(abc.ABC, Iterator[WatchEvent]):
    """An iterator of WatchEvents that blocks for new writes until stopped or its timeout elapses."""

    @abc.abstractmethod
    def __next__(self) -> WatchEvent: ...

    @abc.abstractmethod
    def stop(self) -> None:
        """End the watch; safe to call from another thread, a blocked ``next`` returns promptly."""

    def __iter__(self) -> Watch:
        return self

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Store(abc.ABC):
    """Desired state: Kubernetes-shaped objects with revisions and watch.

    ``kind`` arguments accept every name kubectl does (``pods``, ``pod``, ``po``, ``Pod``).
    ``namespace=None`` means ``default`` for a namespaced kind in get/delete, and all namespaces
    in ``list``; it is ignored for cluster-scoped kinds.
    """

    @abc.abstractmethod
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        """The stored object, or NotFound."""

    @abc.abstractmethod
    def list(self, kind: str, namespace: str | None = None,
             label_selector: Selector = None, *, convert: Callable[[dict], Any] | None = None) -> ListResult:
        """Objects of a kind, optionally in one namespace and matching a selector (dict or ``-l`` string).
        ``convert`` turns each object into what the caller keeps (a slim record, lace.store.records)
        as it is read, so a large list never holds every whole object at once."""

    @abc.abstractmethod
    def create(self, obj: Mapping[str, Any]) -> dict:
        """Create a new object (AlreadyExists if the name is taken); returns it as stored."""

    def apply(self, obj: Mapping[str, Any]) -> ApplyResult:
        """Create, or update by name: spec (all non-metadata fields), labels and annotations are
        replaced, status is kept. Unchanged objects are not written (no new revision)."""
        return self.apply_all([obj])[0]

    @abc.abstractmethod
    def apply_all(self, objs: Iterable[Mapping[str, Any]], *, dry_run: bool = False) -> list[ApplyResult]:
        """Apply several objects atomically: all are validated (each seeing the ones before it,
        dependencies first) and written in one transaction, or nothing is written. Results are in
        input order. On a ValidationError, ``err.index`` is the offending object's input position."""

    @abc.abstractmethod
    def update(self, obj: Mapping[str, Any]) -> dict:
        """Replace an existing object (NotFound if absent). A ``metadata.resourceVersion`` that is
        not the stored one raises Conflict (optimistic concurrency)."""

    @abc.abstractmethod
    def update_status(self, kind: str, name: str, namespace: str | None, status: Mapping[str, Any],
                      resource_version: str | None = None) -> dict:
        """Replace an object's status (the status subresource)."""

    @abc.abstractmethod
    def delete(self, kind: str, name: str, namespace: str | None = None, *,
               grace_period: int | None = 0, uid: str | None = None) -> dict:
        """Delete an object (NotFound if absent, Forbidden if a rule refuses); returns it.

        ``grace_period`` 0 (the default) removes the object at once. Otherwise a Pod that a
        kubelet runs is deleted gracefully, as in Kubernetes: the store sets
        ``metadata.deletionTimestamp`` (now + ``grace_period`` seconds; None: the pod's
        ``spec.terminationGracePeriodSeconds``, else 30, as ``kubectl delete`` asks) and returns
        the pod still stored; its kubelet stops it and then deletes it with ``grace_period=0``.
        ``uid`` is a precondition: Conflict if the stored object has another one.
        """

    @abc.abstractmethod
    def watch(self, kinds: list[str] | None = None, since: int | str | None = None,
              timeout: float | None = None) -> Watch:
        """Events after revision ``since`` (None: from now), then block for new ones.

        ``timeout`` ends the watch after that many seconds (like ``timeoutSeconds``); None waits
        until ``stop()``. Raises Gone if ``since`` was compacted away.
        """

    @abc.abstractmethod
    def revision(self) -> int:
        """The current cluster revision."""

    @abc.abstractmethod
    def allocate_segment(self, network: str, namespace: str, labels: Mapping[str, str]) -> int:
        """The segment ID of (network, namespace, labels): the existing one, or a new one (>= 256)."""

    @abc.abstractmethod
    def allocate_block(self, network: str, node: str, family: int | str, prefixlen: int,
                       *, additional: bool = False) -> str:
        """A per-node block of the network's CIDR of that family (4 or 6), never overlapping another
        node's. Returns the node's existing block of that family unless ``additional``."""

    @abc.abstractmethod
    def allocate_leases(self, network: str, node: str,
                        cidrs: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network], pod: str,
                        container_id: str, ifname: str,
                        annotations: Mapping[str, str] | None = None) -> list[Lease]:
        """One address per family of ``cidrs`` (the network's ranges) for a container on ``node``,
        from that node's blocks (taking a new block when they are full), all in one transaction, each
        lease carrying ``annotations``; the container's existing leases if it has any. Raises
        IpamExhausted, naming the network, node and usage."""

    @abc.abstractmethod
    def leases_for(self, node: str, container_id: str) -> list[dict]:
        """The IPLease objects a container holds on ``node``, in the node's own IPBlocks."""

    @abc.abstractmethod
    def release_leases(self, node: str, container_id: str) -> list[dict]:
        """Delete a container's leases on ``node``; returns them as they were."""

    @abc.abstractmethod
    def keep_alive(self, node: str, ttl: float, holder: str) -> Heartbeat:
        """Take the liveness record of ``node`` for ``holder`` (an agent: who it is, for messages),
        to be renewed at least every ``ttl`` seconds (a third of it is the usual period).

        Liveness records are not objects: no resourceVersion, no watch event, and no transaction
        reads them, so their expiry (which no writer performs) never races a guarded transaction.
        Renewing does not advance the cluster revision; taking or expiring one may (on etcd, every
        key's write does)."""

    @abc.abstractmethod
    def node_liveness(self) -> dict[str, Liveness]:
        """The liveness records held now, by node: a node missing here has no live agent (its
        record expired, was released, or was never taken)."""

    def close(self) -> None:
        """Release the store's resources."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
