"""The agent's view of Services and EndpointSlices, and each service's frontends worked out once.

The agent lists both kinds once and then keeps them with its watch (``lace.store.cache``), so a
pass reads no store; it keeps each object as the record frontends read (``ServiceRecord``,
``SliceRecord``: ports, addresses and endpoint states parsed once), never the stored object.
Each service's frontends (``lace.services.model.frontends``, bound to this node's addresses) are
computed on first use and kept until the service, one of its slices, or the context — network
IDs and CIDRs, imports, this node's addresses — changes. A pass therefore hands the service programmer the
very same Frontend objects for every service that did not change, and the programmer skips them
with one dictionary lookup: the cost of a pass follows what changed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from lace.store.cache import ObjectCache
from lace.store.kinds import object_key, service_of

from .model import Frontend, IPAddr, IPNet, ServiceRecord, SliceRecord, frontends, on_node

KINDS = ("Service", "EndpointSlice")
#: both kinds are kept as the records frontends read, never the stored objects (1k services and
#: their slices are ~4.5 MiB of dictionaries, their records under 1 MiB)
RECORDS = {"Service": ServiceRecord.of, "EndpointSlice": SliceRecord.of}


class ServiceCache:
    """Services and their slices by service, with each service's frontends (module docstring)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._objects = ObjectCache(KINDS, RECORDS)
        #: service key -> slice key -> slice
        self._slices: dict[str, dict[str, SliceRecord]] = {}
        #: service key -> its frontends in the current context
        self._fronts: dict[str, tuple[Frontend, ...]] = {}
        self._context: tuple | None = None
        self._lock = threading.Lock()

    def load(self, services: list, slices: list) -> None:
        """Everything, from a list of each kind (objects or their records): every frontend is
        worked out again."""
        with self._lock:
            self._objects.replace("Service", services)
            self._objects.replace("EndpointSlice", slices)
            self._slices = {}
            for key, sl in self._objects.objects["EndpointSlice"].items():
                if sl.service is not None:
                    self._slices.setdefault(sl.service, {})[key] = sl
            self._fronts.clear()

    def apply(self, event_type: str, obj: dict) -> set[str]:
        """One watch event of either kind; returns the services (``namespace/name``) whose
        frontends it may change."""
        with self._lock:
            old = self._objects.apply(event_type, obj)
            if obj["kind"] == "Service":
                touched = {object_key(obj)}
            else:
                touched = set()
                key = object_key(obj)
                for owner in (old.service if old is not None else None, service_of(obj)):
                    if owner is not None:
                        touched.add(owner)
                        mine = self._slices.get(owner)
                        if mine is not None:
                            mine.pop(key, None)
                            if not mine:   # a service's last slice gone: forget the service's entry
                                del self._slices[owner]
                now = self._objects.objects["EndpointSlice"].get(key)
                if now is not None and now.service is not None:
                    self._slices.setdefault(now.service, {})[key] = now
            for key in touched:
                self._fronts.pop(key, None)
            return touched

    def set_context(self, network_ids: Mapping[str, int], imports: Mapping[str, list[int]],
                    addr4: IPAddr | None, addr6: IPAddr | None,
                    network_cidrs: Mapping[int, Sequence[IPNet]] | None = None) -> None:
        """What frontends depend on besides the objects; a change works out every one again.
        ``network_cidrs`` (network ID -> CIDRs) tells pod backends from outside ones
        (lace.services.model.outside_backend)."""
        cidrs = None if network_cidrs is None else tuple(sorted((k, tuple(v)) for k, v in network_cidrs.items()))
        context = (tuple(sorted(network_ids.items())),
                   tuple(sorted((k, tuple(v)) for k, v in imports.items())), addr4, addr6, cidrs)
        with self._lock:
            if context != self._context:
                self._context = context
                self._network_ids = dict(network_ids)
                self._imports = {k: list(v) for k, v in imports.items()}
                self._addrs = (addr4, addr6)
                self._cidrs = None if cidrs is None else dict(cidrs)
                self._fronts.clear()

    def _of(self, key: str) -> tuple[Frontend, ...]:
        fronts = self._fronts.get(key)
        if fronts is None:
            svc = self._objects.objects["Service"].get(key)
            if svc is None or self._context is None:
                fronts = ()
            else:
                fronts = tuple(on_node(frontends([svc], self._slices.get(key, {}).values(), self._network_ids,
                                                 self._imports, self.node, self._cidrs), *self._addrs))
            self._fronts[key] = fronts
        return fronts

    def frontends_of(self, keys: set[str]) -> dict[str, list[Frontend]]:
        """These services' frontends (an empty list for a service that is gone)."""
        with self._lock:
            return {key: list(self._of(key)) for key in keys}

    def frontends(self) -> list[Frontend]:
        """Every service's frontends."""
        with self._lock:
            out: list[Frontend] = []
            for key in self._objects.objects["Service"]:
                out.extend(self._of(key))
            for key in [k for k in self._fronts if k not in self._objects.objects["Service"]]:
                del self._fronts[key]
            return out
