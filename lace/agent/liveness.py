"""The node's liveness in the store: the agent keeps its node's liveness record alive.

The record (``Store.keep_alive``: an etcd key on a lease, a SQLite row with an expiry) is renewed
every third of its TTL. When the agent dies, or cannot reach the store (etcd down, or this node
cut off from the members that have a leader), renewals stop and the record expires: ``lace get
nodes`` then shows the node NotReady and ``lace status`` says its lease expired — the way a
kubelet's Lease in ``kube-node-lease`` tells the node lifecycle controller that a node is gone.

A failing renewal is also how the agent itself learns that the store is unavailable even when
nothing else fails loudly: an etcd watch on a connection the partition silently cut just stops
sending. So the keeper tells the agent when renewals start failing (it reconnects its watch,
reporting the store as it finds it) and when they go through again (it watches afresh from the
last revision it saw and makes a full pass: whatever changed meanwhile reaches the maps). In
between, the datapath keeps forwarding on what is programmed: nothing here touches a map.

A clean stop does not release the record (a kubelet does not delete its Lease either): an agent
restarted within the TTL — a rolling update — never shows its node as down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lace.store.api import Heartbeat, Store
from lace.store.errors import StoreError

log = logging.getLogger("lace.agent.liveness")

#: seconds a node stays ready without a renewal (a kubelet's node lease is 40 s; lace's agents
#: renew every third of this, so a dead or partitioned node shows NotReady within 10 s)
DEFAULT_TTL = 10.0


class LivenessKeeper:
    """A thread that keeps ``node``'s liveness record alive and remembers how that went."""

    def __init__(self, store: Store, node: str, ttl: float, holder: str, *,
                 on_failing: Callable[[], None] = lambda: None,
                 on_restored: Callable[[], None] = lambda: None) -> None:
        if not ttl > 0:     # not a store failure: no renewal could ever go through
            raise ValueError(f"the liveness TTL of node {node} is {ttl:g}s: give a positive number of "
                             "seconds (the agent's --liveness-ttl)")
        self.store = store
        self.node = node
        self.ttl = ttl
        self.holder = holder
        self.on_failing = on_failing
        self.on_restored = on_restored
        self._beat: Heartbeat | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: wall time of the last renewal that went through, the error of the last that did not,
        #: since when renewals fail (None: they do not), how often the record had expired
        self.last_renewed: float | None = None
        self.last_error: str | None = None
        self.failing_since: float | None = None
        self.expired = 0
        #: wall time the renewal in flight began (None: none is)
        self.renewing_since: float | None = None

    @property
    def interval(self) -> float:
        return self.ttl / 3

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)

    def renew_once(self) -> None:
        """One renewal (the first takes the record); records the outcome. A store error is a
        failed renewal, not raised; anything else (a bug) is raised, and the thread counts it as
        a failed renewal too."""
        self.renewing_since = time.time()
        try:
            self._renew()
        finally:
            self.renewing_since = None

    def _renew(self) -> None:
        try:
            if self._beat is None:
                self._beat = self.store.keep_alive(self.node, self.ttl, self.holder)
            elif not self._beat.renew():
                self.expired += 1
                log.warning("node %s: the liveness record had expired (not renewed for over %.0fs): "
                            "taken again", self.node, self.ttl)
        except StoreError as e:
            self._failed("store unavailable", f"{e}")
            return
        self.last_renewed = time.time()
        if self.failing_since is not None:
            log.info("node %s: store reachable again after %.1fs: catching up", self.node,
                     self.last_renewed - self.failing_since)
            self.failing_since = None
            self.last_error = None
            self._notify(self.on_restored)

    def _failed(self, why: str, error: str) -> None:
        self.last_error = error
        if self.failing_since is None:
            self.failing_since = time.time()
            log.warning("node %s: %s, cannot renew the node's liveness: %s; forwarding continues on "
                        "what is programmed", self.node, why, error)
            self._notify(self.on_failing)

    def _notify(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception as e:   # the keeper's thread outlives a callback's failure
            log.warning("node %s: liveness callback failed: %s: %s", self.node, type(e).__name__, e)

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.renew_once()
            except Exception as e:   # a bug must not end the thread: the record would expire unseen
                log.exception("node %s: renewing the liveness record failed", self.node)
                self._failed("renewal failed", f"{type(e).__name__}: {e}")
            # a renewal that took long (timeouts) is not followed by a full interval's wait
            self._stopping.wait(max(0.05, self.interval - (time.monotonic() - started)))

    def facts(self) -> dict[str, Any]:
        """What the status document's ``liveness`` subsystem is made of. A renewal the store has
        not answered for over an interval counts as failing from when it began: a locked or
        cut-off store answers late (its timeouts), and until then the record runs out unexplained."""
        failing, error = self.failing_since, self.last_error
        started, now = self.renewing_since, time.time()
        if failing is None and started is not None and now - started > self.interval:
            failing, error = started, f"the store has not answered a renewal for {now - started:.0f}s"
        return {"ttl": self.ttl, "lastRenewed": self.last_renewed, "lastError": error,
                "failingSince": failing, "expired": self.expired}
