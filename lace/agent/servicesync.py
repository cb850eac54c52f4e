"""Incremental service passes: what the agent does when only Services or EndpointSlices changed.

A full reconcile pass works out every map from a snapshot of the whole store and diffs it against
the kernel: right for anything, and its cost follows what exists. Services change often and there
may be tens of thousands of them, so their changes take a shorter way, as kube-proxy's partial
syncs and Cilium's per-service updates do:

- the watch feeds Service and EndpointSlice events into the service cache
  (``lace.services.cache``) and notes the services they touch; any other kind asks for a full pass;
- the pass asks the cache for just those services' frontends and the service programmer for the
  changes they make (``ServiceProgrammer.update``), and writes them to the ``backends``,
  ``maglev`` and ``services`` maps in the writer's make-before-break order;
- when a service map is full, or the change would fill it, the programmer declines and a full pass
  decides which frontends stay in, in its stable order.

A full pass reads the same cache, so both kinds of pass agree on every frontend.

After either kind of pass has written the maps, the UDP flows whose backend left their service
are deleted (:meth:`ServiceSync.flush_departed`): their clients' next datagrams meet the service as
it is now; and the host's UDP sockets connected to them through the socket hooks are terminated
(lace.agent.socklb.terminate_udp).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from lace.bpf import BPFError
from lace.services.cache import RECORDS, ServiceCache
from lace.services.program import ServiceProgrammer
from lace.store.api import WatchEvent

from .conntrack import flush_service_flows
from .diff import MapChanges
from .socklb import terminate_udp

log = logging.getLogger("lace.agent")

#: kinds whose changes an incremental pass programs; any other kind needs a full pass
SERVICE_KINDS = ("Service", "EndpointSlice")


class ServiceSync:
    """The service cache, the services the watch left for the next pass, and the incremental pass."""

    def __init__(self, node: str, programmer: ServiceProgrammer, datapath: Any, order: tuple[str, ...]) -> None:
        self.cache = ServiceCache(node)
        self.programmer = programmer
        self.datapath = datapath
        self.order = order
        self._pending: set[str] = set()
        self._full = True
        self._lock = threading.Lock()

    def list(self, store: Any) -> int:
        """Fill the cache from a list of Services and EndpointSlices; returns the revision to watch
        from (the older list's: events replayed past the newer one change nothing), and asks for a
        full pass."""
        # made records as they are read (lace.services.cache): the stored objects are never all kept
        services = store.list("services", convert=RECORDS["Service"])
        slices = store.list("endpointslices", convert=RECORDS["EndpointSlice"])
        self.cache.load(services.items, slices.items)
        with self._lock:
            self._full = True
        return min(int(services.resource_version), int(slices.resource_version))

    def event(self, ev: WatchEvent) -> bool:
        """One watch event: True when it is of a service kind (the services it touches are noted
        for the next incremental pass), False when it is not this cache's to handle."""
        if ev.object.get("kind") not in SERVICE_KINDS:
            return False
        keys = self.cache.apply(ev.type, ev.object)
        with self._lock:
            self._pending |= keys
        return True

    def request_full(self) -> None:
        """The next pass must be a full one (a change no incremental pass covers)."""
        with self._lock:
            self._full = True

    def take(self) -> tuple[set[str], bool]:
        """What the watch left: (services to program again, whether a full pass is needed). Taking
        it clears it; a full pass also covers the services."""
        with self._lock:
            keys, full = self._pending, self._full
            self._pending, self._full = set(), False
        return keys, full

    def sync(self, keys: set[str]) -> dict[str, MapChanges] | None:
        """Program these services (``namespace/name``) only; returns the changes written per map,
        or None when only a full pass can decide (nothing was written then)."""
        changes = self.programmer.update(self.cache.frontends_of(keys))
        if changes is None:
            return None
        work = {name: MapChanges(updates, deletes) for name, (updates, deletes) in changes.items()
                if updates or deletes}
        self.datapath.apply(work, self.order)
        self.flush_departed()
        return work

    def flush_departed(self) -> int:
        """Delete the UDP flows through a frontend whose backend left it since the last call
        (ServiceProgrammer.take_departed), once the pass that took the backend out is written: a
        client sending from one source port would otherwise keep its flow to the gone backend alive
        for as long as it sends. Returns the entries deleted."""
        departed = self.programmer.take_departed()
        if not departed:
            return 0
        n = flush_service_flows(self.datapath, departed)
        log.info("%d UDP service flows to %d departed backend(s) deleted", n,
                 len({k for k, _ in departed}))
        try:
            terminate_udp(self.datapath.map("sock-revnat"), departed)
        except (BPFError, OSError) as e:   # the packet path is done; a host socket keeps its backend
            log.warning("host UDP sockets connected to departed backends not terminated: %s", e)
        return n
