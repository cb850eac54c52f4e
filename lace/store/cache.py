"""A client's cache of stored objects, as Kubernetes' informers keep one: filled by a list, then
kept by the watch events that follow it.

Events may be replayed (a watch restarted from an older revision than the list it follows), so
each object is kept at the newest revision seen: an older event never overwrites a newer object,
and a deletion is remembered by revision so a replayed create cannot bring the object back.
A (re)list of a kind is authoritative and forgets that kind's deletions, so they are not kept
forever; a replay that follows it comes in revision order and so brings each deletion after the
create it undoes.

A kind may be kept as slim records instead of whole objects (``lace.store.records``): the cache
then converts each object as it arrives and compares records by the revision they carry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lace.store.kinds import object_key


def object_revision(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


def _revision(value: Any) -> int:
    return object_revision(value) if isinstance(value, Mapping) else value.rv


class ObjectCache:
    """Objects of some kinds by kind and ``namespace/name``, each at the newest revision seen."""

    def __init__(self, kinds: Iterable[str], records: Mapping[str, Callable[[dict], Any]] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {kind: {} for kind in kinds}
        #: kinds kept as records: kind -> the function that makes one from an object
        self.records = dict(records or {})
        #: revision of the newest deletion seen per key, so a replayed create cannot resurrect it
        self._gone: dict[tuple[str, str], int] = {}

    def replace(self, kind: str, items: list[Any]) -> None:
        """Everything of one kind, from a list (of objects, or of the kind's records already)."""
        slim = self.records.get(kind)
        self.objects[kind] = {(object_key(o) if isinstance(o, Mapping) else o.key): (
            slim(o) if slim and isinstance(o, Mapping) else o) for o in items}
        self._gone = {k: rv for k, rv in self._gone.items() if k[0] != kind}

    def put(self, obj: dict) -> Any:
        """Store ``obj`` (or its record) unless a newer version (or deletion) is known; returns the
        previous one."""
        kind, key = obj["kind"], object_key(obj)
        old = self.objects[kind].get(key)
        rv = object_revision(obj)
        if (old is not None and _revision(old) >= rv) or self._gone.get((kind, key), 0) >= rv:
            return old
        slim = self.records.get(kind)
        self.objects[kind][key] = slim(obj) if slim else obj
        return old

    def remove(self, obj: dict) -> Any:
        """Forget ``obj`` unless a newer version is known; returns what was removed."""
        kind, key = obj["kind"], object_key(obj)
        old = self.objects[kind].get(key)
        if old is not None and _revision(old) > object_revision(obj):
            return None
        self._gone[(kind, key)] = max(self._gone.get((kind, key), 0), object_revision(obj))
        return self.objects[kind].pop(key, None)

    def apply(self, event_type: str, obj: dict) -> Any:
        """One watch event (ADDED, MODIFIED or DELETED); returns the object it replaced or removed."""
        return self.remove(obj) if event_type == "DELETED" else self.put(obj)

    def in_namespace(self, kind: str, namespace: str) -> list[dict]:
        prefix = f"{namespace}/"
        return [o for k, o in self.objects[kind].items() if k.startswith(prefix)]
