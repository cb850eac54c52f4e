"""The node agent: loads the datapath, serves the local API, and reconciles the maps it owns from
the store, level-triggered (every change recomputes the whole desired state and applies a pure
diff; a periodic resync repairs anything changed behind its back)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable

from lace import __version__, netlink
from lace.bpf import BPFError
from lace.bpf.cgroup import cgroup_id
from lace.datapath import registry
from lace.datapath.config import DEFAULT_POD_MTU
from lace.datapath.conntrack import CT_ENDPOINT_DEFAULT
from lace.datapath.services import REVNAT_FRONTENDS
from lace.policy.program import PolicyProgrammer
from lace.services.program import ServiceProgrammer
from lace.store import kinds as K
from lace.store.api import Store, Watch
from lace.store.errors import Gone, StoreError

from .api import ApiServer
from .cluster import KINDS as CLUSTER_KINDS, ClusterCache
from .conntrack import GC_INTERVAL_SECONDS, GcEndpoint, GcResult, flush_addresses, gc_pass, revnat_in_use
from .datapath import NodeDatapath
from .desired import OWNED_MAPS, Entries, ct_limit, desired_maps
from .podsync import PodSync
from .servicesync import ServiceSync
from .diff import MapChanges, diff_all
from .endpoints import CniError, CniRequest, Endpoints
from .flows import FlowCollector
from .heap import release_free_memory
from .hostdev import HostDevice
from .liveness import DEFAULT_TTL, LivenessKeeper
from .metrics import AgentMetrics
from .probes import stale_cookies
from .socklb import SockLB
from .status import Loops, WatchState
from .status import status as status_doc
from .state import NotRegistered, build_snapshot
from .verify import register_routes as register_verify_routes

log = logging.getLogger("lace.agent")

WATCH_KINDS = [*CLUSTER_KINDS, "services", "endpointslices"]
RESYNC_SECONDS = 30.0
#: the CNI commands the agent serves (the plugin answers VERSION itself)
CNI_COMMANDS = ("ADD", "DEL", "CHECK", "GC")


class Agent:
    """One node's agent. Every collaborator is built here from the configuration; ``start`` does
    the I/O (load and attach the datapath, open the flow reader, serve the API, start the loops)
    and ``stop`` undoes it, whether or not ``start`` got through."""

    def __init__(self, *, node: str, store: Store, pin_root: str, socket_path: str,
                 uplink: str = "eth0", mtu: int = DEFAULT_POD_MTU, cgroup: str | None = None,
                 kubelet_cgroup: str | None = None, metrics_port: int | None = None,
                 metrics_addresses: list[str] | None = None, liveness_ttl: float = DEFAULT_TTL,
                 ct_endpoint_limit: int = CT_ENDPOINT_DEFAULT,
                 ct_gc_interval: float = GC_INTERVAL_SECONDS) -> None:
        self.node = node
        self.store = store
        self.pin_root = pin_root
        self.socket_path = socket_path
        self.uplink = uplink
        self.mtu = mtu
        #: the node namespace's interfaces, as reconcile passes see them (under _reconcile_lock)
        self.links = netlink.LinkIndex()
        #: the kubelet's cgroup: its ID goes into the config map (resolved at start, when it must exist)
        self.kubelet_cgroup = kubelet_cgroup
        self.kubelet_cgroup_id = 0
        #: the conntrack limit of a local endpoint whose Network sets none (0: none), and how often
        #: the conntrack GC pass runs; its last result feeds the status and the metrics
        self.ct_endpoint_limit = ct_endpoint_limit
        self.ct_gc_interval = ct_gc_interval
        self.ct_gc: GcResult | None = None
        self.stopping = threading.Event()
        self.dirty = threading.Event()
        self._reconcile_lock = threading.Lock()
        self._watch: Watch | None = None
        self._pressure_logged: tuple[int, int] | None = None
        self._service_pressure_logged: tuple[int, int] | None = None
        self._revnat_left_out_logged = 0
        self.stats: dict[str, Any] = {"reconciles": 0, "errors": 0, "last_error": None,
                                      "last_reconcile": None, "started": time.time(),
                                      # the periodic resync: how many ran, when the next one is due
                                      "resyncs": 0, "next_resync": None}
        # lace.agent.status: each loop's last success / error / failures, the watch, the last snapshot
        self.loops = Loops()
        self.watch_state = WatchState()
        self.last_snapshot: Any = None
        #: Prometheus over TCP on the node's addresses (default: the uplink's), besides the socket
        self.metrics_port = metrics_port
        self.metrics_addresses = metrics_addresses
        self.datapath = NodeDatapath(pin_root)
        #: the node's liveness record in the store; its renewals also tell when the store is lost
        #: (the watch reconnects) and back (watch afresh, a full pass) — lace.agent.liveness
        self.liveness = LivenessKeeper(store, node, liveness_ttl,
                                       f"lace-agent pid {os.getpid()} on {socket.gethostname()}",
                                       on_failing=self._restart_watch, on_restored=self._catch_up)
        # the host cgroup's socket hooks: the node's own processes reach service frontends
        self.socklb = SockLB(cgroup, self.datapath.links_dir) if cgroup else None
        self.hostdev = HostDevice(node, store, self.datapath, mtu)
        self.policy = PolicyProgrammer(node)
        self.services = ServiceProgrammer()
        #: the service cache the watch keeps, and incremental passes for services that changed
        self.service_sync = ServiceSync(node, self.services, self.datapath, OWNED_MAPS)
        #: every other watched kind, listed once and kept by the watch (lace.agent.cluster)
        self.cluster = ClusterCache(node=node)
        #: incremental passes for pods, of this node (after CNI ADD and DEL) and others (lace.agent.podsync)
        self.pod_sync = PodSync(node, self.cluster, self.datapath, OWNED_MAPS, self.links, self.policy)
        self._watch_since: int | None = None
        self.metrics = AgentMetrics(self.datapath, {n: m.max_entries for n, m in registry.MAPS.items()
                                                    if m.map_type != "ringbuf"},
                                    lambda: status_doc(self, maps=False))
        self.endpoints = Endpoints(store, node, mtu, self.datapath, self.program_pods,
                                   lambda net, ips: flush_addresses(self.datapath, net, ips), self.cluster)
        # the one reader of the events ring buffer: a bounded history any number of clients follow
        self.flows = FlowCollector(node)
        self.api = ApiServer(socket_path)
        for method, path, fn in self.flows.routes():
            self.api.route(method, path, fn)
        self.api.route("POST", "/v1/cni", self._cni)
        self.api.route("GET", "/healthz", lambda _: (200, self.health()))
        self.api.route("GET", "/v1/status", lambda _: (200, status_doc(self)))
        self.api.route("GET", "/metrics", lambda _: (200, ("text/plain; version=0.0.4",
                                                           self.metrics.exposition())))
        register_verify_routes(self)   # GET /v1/verify, POST /v1/verify/repair (drift audit)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.kubelet_cgroup:
            try:
                self.kubelet_cgroup_id = cgroup_id(self.kubelet_cgroup)
            except OSError as e:
                raise NotRegistered(f"kubelet cgroup {self.kubelet_cgroup}: {e.strerror}: create it (cgroup2) "
                                    "or fix --kubelet-cgroup") from None
        self.datapath.load()
        if self.socklb is not None:
            self.socklb.attach(self.datapath)
        up = netlink.link(self.uplink)
        if up is None:
            raise NotRegistered(f"uplink {self.uplink} does not exist in this namespace")
        self.datapath.attach_uplink(up.ifindex)
        self.hostdev.ensure()
        self.loops["host-device"].ok()
        self._adopt_pod_links()
        # backend IDs and Maglev tables as a previous agent left them: nothing still right is rewritten
        self.services.adopt(self.datapath.read("services"), self.datapath.read("backends"),
                            self.datapath.read("maglev"), self.datapath.read("revnat"))
        self.flows.start(self.datapath.map("events"), self.datapath.map("metrics"))
        self.liveness.renew_once()   # the record exists before the agent says it is ready
        self.liveness.start()
        self._watch_since = self._list()
        self.reconcile(cause="start")
        # what the first pass built lives as long as the agent: keep the collector's full passes
        # from walking it again and again (tens of thousands of services are millions of objects)
        gc.freeze()
        self.loops["reconcile"].ok()
        self.api.start()
        if self.metrics_port:
            addrs = self.metrics_addresses or [a.split("/")[0] for a in netlink.addresses(self.uplink)
                                               if not a.startswith("fe80:")]
            self.metrics_addresses = self.metrics.serve(addrs, self.metrics_port)
        threading.Thread(target=self._reconcile_loop, name="reconcile", daemon=True).start()
        threading.Thread(target=self._watch_loop, name="watch", daemon=True).start()
        threading.Thread(target=self._ct_gc_loop, name="ct-gc", daemon=True).start()
        log.info("agent for node %s ready (pin root %s, socket %s)", self.node, self.pin_root, self.socket_path)

    def _adopt_pod_links(self) -> None:
        """After a restart: swap this agent's program into every pinned pod link whose interface
        still exists; drop the pins of interfaces that are gone."""
        for host in self.datapath.pod_links():
            link = netlink.link(host)
            if link is None:
                self.datapath.detach_pod(host)
            else:
                self.datapath.attach_pod(host, link.ifindex)

    def stop(self) -> None:
        self.stopping.set()
        self.dirty.set()
        self.liveness.stop()
        watch = self._watch
        if watch is not None:
            watch.stop()
        self.api.stop()
        self.metrics.stop()
        self.flows.stop()
        # maps and links stay pinned: the datapath keeps forwarding without us
        if self.socklb is not None:
            self.socklb.close()
        self.datapath.close()
        self.store.close()

    def run_forever(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        try:
            self.start()
            while not self.stopping.wait(1.0):
                pass
        finally:
            self.stop()

    # -- reconcile ---------------------------------------------------------------------------

    def reconcile(self, *, resync: bool = False, cause: str = "watch") -> dict[str, int]:
        """One level-triggered pass; returns the number of entries changed per map. A resync
        reads every map back from the kernel instead of trusting what this agent last wrote.
        ``cause``: why it runs (start, watch, resync, cni, repair), counted in
        lace_agent_full_passes_total."""
        with self._reconcile_lock, netlink.reuse(), self.metrics.reconcile_duration.time(), \
                (self.metrics.resync_duration.time() if resync else contextlib.nullcontext()):
            self.metrics.full_passes.labels(cause).inc()
            started = time.time()
            if resync:   # the interfaces read afresh once, for the host device and the snapshot
                ifaces = self.links.refresh(full=True)
                try:
                    self.hostdev.ensure(ifaces)
                    self.loops["host-device"].ok()
                except Exception as e:
                    self.loops["host-device"].failed(e)
                    raise
            # a full pass covers whatever the watch left for the incremental ones
            self.service_sync.take()
            self.pod_sync.take()
            # retired revnat frontends whose flows are all gone go (lace.services.program); the
            # conntrack tables are read for it only while some wait
            if resync and self.services.revnat_retired:
                self.services.release_revnat(revnat_in_use(self.datapath))
            snap = build_snapshot(self.store, self.node, self.uplink, self.mtu, self.kubelet_cgroup_id,
                                  self.service_sync.cache, self.ct_endpoint_limit, self.links, self.cluster)
            self.last_snapshot = snap
            want = desired_maps(snap, self.policy, self.services)
            have = {name: self.datapath.read(name, fresh=resync) for name in OWNED_MAPS}
            changes = {name: ch for name, ch in diff_all(want, have).items() if ch}
            self.datapath.apply(changes, OWNED_MAPS)
            self.service_sync.flush_departed()
            self.pod_sync.rebuilt(snap)
            if resync or "probes" in changes:   # a target went, or a release hook was missed
                self._collect_probe_cookies(want["probes"])
            changed = {}
            for name, ch in changes.items():
                n = len(ch.updates) + len(ch.deletes)
                changed[name] = n
                self.metrics.map_writes.labels(name).inc(n)
            self.stats["reconciles"] += 1
            self.stats["resyncs"] += resync
            self.stats["last_reconcile"] = time.time()
            self.stats["last_error"] = None   # healthy again: the last pass went through
            self.stats["endpoints"] = len(snap.endpoints)
            self.watch_state.applied(started)
            self.metrics.reconciles.inc()
            if changed:
                log.info("reconciled: %s", ", ".join(f"{k} {v}" for k, v in sorted(changed.items())))
            self._log_policy_pressure()
            self._log_service_pressure()
            self._export_pressure()
            del snap, want, have, changes
            release_free_memory()   # what the pass freed goes back to the kernel (lace.agent.heap)
            return changed

    def sync_services(self, keys: set[str]) -> dict[str, int] | None:
        """An incremental pass for these services (``namespace/name``) only (lace.agent.servicesync).
        Returns the entries changed per map, or None when only a full pass can decide (a service
        map is full or would be)."""
        return self._incremental("services", keys, self.service_sync.sync, self.metrics.service_sync_duration)

    def sync_pods(self, keys: set[str]) -> dict[str, int] | None:
        """An incremental pass for these pods (``namespace/name``) only (lace.agent.podsync).
        Returns the entries changed per map, or None when only a full pass can decide."""
        return self._incremental("pods", keys, self._sync_pods, self.metrics.pod_sync_duration)

    def _sync_pods(self, keys: set[str]) -> dict[str, MapChanges] | None:
        work = self.pod_sync.sync(keys)
        if work and {"veth", "probes"} & work.keys():
            # this node's endpoints changed: what the status and the conntrack GC read of them
            snap = self.last_snapshot
            if snap is not None:
                snap.endpoints = self.pod_sync.endpoints()
                self.stats["endpoints"] = len(snap.endpoints)
            if "probes" in work:   # a target went: its sockets' cookies go too
                self._collect_probe_cookies(self.datapath.read("probes", fresh=False))
        return work

    def program_pods(self, keys: set[str]) -> None:
        """Program the maps for these pods after a CNI operation on them: an incremental pass when
        one can cover it, else (or with no pod named) a full pass."""
        if not keys or self.sync_pods(keys) is None:
            self.reconcile(cause="cni")

    def _incremental(self, what: str, keys: set[str], sync: Callable[[set[str]], dict[str, MapChanges] | None],
                     timer: Any) -> dict[str, int] | None:
        with self._reconcile_lock, timer.time():
            started = time.time()
            work = sync(keys)
            if work is None:
                log.debug("%s %s: only a full pass can decide", what, ", ".join(sorted(keys)[:5]))
                return None
            changed = {name: len(ch.updates) + len(ch.deletes) for name, ch in work.items()}
            for name, n in changed.items():
                self.metrics.map_writes.labels(name).inc(n)
            self._export_pressure()
            self.watch_state.applied(started)
            if changed:
                log.info("%s %s: %s", what, ", ".join(sorted(keys)[:5]) + (" ..." if len(keys) > 5 else ""),
                         ", ".join(f"{k} {v}" for k, v in sorted(changed.items())))
            return changed

    def audit(self, names: list[str]) -> tuple[dict[str, Entries], dict[str, Entries]]:
        """What a reconcile pass would want in the maps ``names`` and what the kernel holds there,
        applying nothing (lace.agent.verify): the store listed afresh, the service programmer a
        scratch copy (an audit hands out no backend ID or table number), and the kernel read
        without refreshing the writer's record of its own writes."""
        with self._reconcile_lock, netlink.reuse():
            # Services and EndpointSlices listed afresh, not the watch's cache: an audit also
            # catches what a missed event would have left behind
            snap = build_snapshot(self.store, self.node, self.uplink, self.mtu, self.kubelet_cgroup_id,
                                  ct_endpoint_limit=self.ct_endpoint_limit)
            want = desired_maps(snap, self.policy, self.services.scratch())
            have = {n: self.datapath.read_kernel(n) for n in names}
        return {n: want[n] for n in names}, have

    def left_out(self) -> dict[str, list[str]]:
        """What full maps left out at the last pass, by map: service frontends (``ns/name:port``),
        policy entries (``policy: N entries``), prefix-segment entries (a count)."""
        out: dict[str, list[str]] = {}
        svc, pol = self.services.pressure, self.policy.pressure
        if svc is not None and svc.left_out:
            out["services"] = list(svc.left_out)
        if pol is not None and pol.dropped:
            out["policy"] = [f"{k}: {v} entries" for k, v in sorted(pol.dropped_by_policy.items())]
        if pol is not None and pol.prefix_dropped:
            out["prefix-segment"] = [f"{pol.prefix_dropped} entries"]
        return out

    def _collect_probe_cookies(self, probe_entries: dict[bytes, bytes]) -> None:
        """Delete the probe-cookie entries the socket hooks left behind (lace.agent.probes)."""
        m = self.datapath.map("probe-cookie")
        cookies = dict(m.items())
        if not cookies:
            return
        for k in stale_cookies(cookies, probe_entries, time.clock_gettime_ns(time.CLOCK_MONOTONIC)):
            with contextlib.suppress(BPFError):   # its socket closed meanwhile: already gone
                m.delete(k)

    def _log_policy_pressure(self) -> None:
        """Warn once per change of what a full policy map leaves out (MAP_FULL)."""
        pr = self.policy.pressure
        seen = (pr.dropped, pr.prefix_dropped) if pr is not None and pr.reason else None
        if seen == self._pressure_logged:
            return
        self._pressure_logged = seen
        if pr is not None and seen is not None:
            log.warning("node %s: policy map full (%s): %d of %d entries programmed, %d allow entries left out "
                        "(%s); %d prefix-segment entries left out", self.node, pr.reason, pr.programmed,
                        pr.desired, pr.dropped,
                        ", ".join(f"{k}: {v}" for k, v in sorted(pr.dropped_by_policy.items())),
                        pr.prefix_dropped)

    def _export_pressure(self) -> None:
        pol, svc = self.policy.pressure, self.services.pressure
        self.metrics.left_out.labels("policy").set(pol.dropped if pol else 0)
        self.metrics.left_out.labels("prefix-segment").set(pol.prefix_dropped if pol else 0)
        self.metrics.left_out.labels("services").set(svc.frontends - svc.programmed if svc else 0)
        self.metrics.left_out.labels("maglev").set(svc.without_table if svc else 0)
        self.metrics.left_out.labels("revnat").set(svc.revnat_left_out if svc else 0)
        self.metrics.reply_entry_backends.set(svc.reply_entry_backends if svc else 0)

    def _log_service_pressure(self) -> None:
        """Warn once per change of what full service maps leave out (MAP_FULL)."""
        pr = self.services.pressure
        seen = (pr.frontends - pr.programmed, pr.without_table) if pr is not None and pr.reason else None
        if seen == self._service_pressure_logged:
            return
        self._service_pressure_logged = seen
        if pr is not None and seen is not None:
            log.warning("node %s: %s: %d of %d service frontends programmed (left out: %s); %d frontends "
                        "without a Maglev table spread new flows over their slots", self.node, pr.reason,
                        pr.programmed, pr.frontends, ", ".join(pr.left_out[:10]) or "none", pr.without_table)
        if pr is not None and pr.revnat_left_out != self._revnat_left_out_logged:
            self._revnat_left_out_logged = pr.revnat_left_out
            if pr.revnat_left_out:
                log.info("node %s: %d frontends not named by their backends' revnat entries (at most %d per "
                         "backend): %d backends keep a second conntrack entry per new flow for its replies",
                         self.node, pr.revnat_left_out, REVNAT_FRONTENDS, pr.reply_entry_backends)

    def _next_resync(self) -> float:
        """When the next periodic resync is due (monotonic clock); /healthz shows it (wall clock)."""
        self.stats["next_resync"] = time.time() + RESYNC_SECONDS
        return time.monotonic() + RESYNC_SECONDS

    def _reconcile_loop(self) -> None:
        backoff = 0.05
        # every RESYNC_SECONDS whatever the watch brings: a node whose store never goes quiet for
        # that long still gets its repairs and its revnat housekeeping
        next_resync = self._next_resync()
        while not self.stopping.is_set():
            self.dirty.wait(max(0.0, next_resync - time.monotonic()))
            resync = time.monotonic() >= next_resync
            if self.stopping.is_set():
                return
            if resync:
                next_resync = self._next_resync()
            self.dirty.clear()
            keys, full = self.service_sync.take()
            pods = self.pod_sync.take()
            try:
                # only services or pods changed: program those; a change no incremental pass
                # covers (the watch asked for a full pass) or an incremental pass that declines
                # is a full pass. Woken with nothing left to do is nothing to do: the watch sets
                # the flag after it notes a change, so a pass that took the change already may
                # find the flag set again behind it
                if resync or full or \
                        (pods and self.sync_pods(pods) is None) or (keys and self.sync_services(keys) is None):
                    time.sleep(0.005)   # coalesce a burst of writes into one pass
                    self.reconcile(resync=resync, cause="resync" if resync else "watch")
                self.loops["reconcile"].ok()
                backoff = 0.05
            except Exception as e:
                self.loops["reconcile"].failed(e)
                self.stats["errors"] += 1
                self.stats["last_error"] = f"{type(e).__name__}: {e}"
                self.metrics.reconcile_errors.inc()
                log.warning("reconcile failed (retrying in %.1fs): %s", backoff, e)
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self.service_sync.request_full()   # what the failed pass took is not lost
                self.dirty.set()

    def ct_gc_once(self) -> GcResult:
        """One conntrack GC pass over the local endpoints of the last reconcile (lace.agent.conntrack)."""
        snap = self.last_snapshot
        eps = [GcEndpoint(ep.pod, ep.ifindex, ep.host_ifname, ep.network, tuple(ep.ips()), ct_limit(snap, ep.network))
               for ep in (snap.endpoints if snap is not None else ())]
        result = gc_pass(self.datapath, eps)
        self.ct_gc = result
        self.metrics.ct_gc_deleted.inc(result.deleted)
        self.metrics.ct_gc_duration.observe(result.duration)
        return result

    def _ct_gc_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                result = self.ct_gc_once()
                self.loops["ct-gc"].ok()
                at_limit = [e["pod"] for e in result.endpoints
                            if e["limit"] and any(n >= e["limit"] for n in e["flows"].values())]
                if result.deleted or at_limit:
                    log.info("conntrack gc: %d expired entries deleted%s", result.deleted,
                             f"; at their conntrack limit: {', '.join(at_limit)}" if at_limit else "")
            except Exception as e:
                self.loops["ct-gc"].failed(e)
                log.warning("conntrack gc failed: %s", e)
            self.stopping.wait(self.ct_gc_interval)

    def _watch_loop(self) -> None:
        since = self._watch_since
        relist = since is None
        while not self.stopping.is_set():
            try:
                if relist:   # first, or fell behind compaction: list again, and a full pass
                    since = self._list()
                    relist = False
                    self.service_sync.request_full()
                    self.dirty.set()
                self._watch = self.store.watch(WATCH_KINDS, since=since)
                self.watch_state.connected, self.watch_state.error = True, None
                self.loops["watch"].ok()
                for ev in self._watch:
                    rv = int(ev.resource_version)
                    # a watch ended mid-revision (a store may write a transaction's objects at one
                    # revision) resumes before it: replaying an event changes nothing
                    since = rv - 1
                    self.watch_state.event(rv)
                    change = self.cluster.apply(ev)
                    if not (self.service_sync.event(ev) or self.pod_sync.event(ev, change)):
                        if log.isEnabledFor(logging.DEBUG):   # the key only for a log that shows it
                            log.debug("watch: %s %s %s asks for a full pass", ev.type, ev.object.get("kind"),
                                      K.object_key(ev.object))
                        self.service_sync.request_full()
                    self.dirty.set()
            except Gone:
                relist = True
            except Exception as e:   # StoreError, or anything unforeseen: report, back off, watch again
                self.watch_state.connected, self.watch_state.error = False, str(e)
                self.loops["watch"].failed(e)
                if isinstance(e, StoreError):
                    log.warning("watch: %s", e)
                else:
                    log.exception("watch failed")
                self.stopping.wait(0.5)

    def _list(self) -> int:
        """List every watched kind into the caches; returns the revision to watch from."""
        return min(self.service_sync.list(self.store), self.cluster.list(self.store))

    def _restart_watch(self) -> None:
        """End the current watch; the watch loop opens a new one from the last revision it saw
        (on a member that still answers, or reporting that none does)."""
        watch = self._watch
        if watch is not None:
            watch.stop()

    def _catch_up(self) -> None:
        """The store is back after an outage: watch afresh and make a full pass, so what changed
        meanwhile reaches the maps even if the old watch missed it."""
        self._restart_watch()
        self.service_sync.request_full()
        self.dirty.set()

    # -- API ---------------------------------------------------------------------------------

    def _cni(self, body: dict[str, Any]) -> tuple[int, Any]:
        started, command = time.monotonic(), str(body.get("command") or "") if isinstance(body, dict) else ""
        code, result = self._cni_request(body)
        if command in CNI_COMMANDS:   # a label per command the agent knows, never one per bad input
            self.metrics.cni_duration.labels(command, "ok" if code == 200 else "error").observe(
                time.monotonic() - started)
        return code, result

    def _cni_request(self, body: dict[str, Any]) -> tuple[int, Any]:
        try:
            req = CniRequest.parse(body)
            if req.command == "ADD":
                return 200, self.endpoints.add(req)
            if req.command == "DEL":
                return 200, self.endpoints.delete(req)
            if req.command == "CHECK":
                return 200, self.endpoints.check(req)
            if req.command == "GC":
                conf = body.get("config") or {}
                valid = conf.get("cni.dev/valid-attachments") or [] if isinstance(conf, dict) else None
                if not isinstance(valid, list) or not all(isinstance(a, dict) for a in valid):
                    raise CniError(7, "cni.dev/valid-attachments must be a list of attachment objects")
                return 200, self.endpoints.gc(valid)
            raise CniError(4, f"unsupported CNI command {req.command!r}")
        except CniError as e:
            return 400, e.result()

    def health(self) -> dict[str, Any]:
        pressure = self.policy.pressure
        return {"node": self.node, "version": __version__, "ok": self.stats["last_error"] is None,
                "pinRoot": self.pin_root, **self.stats,
                "policyPressure": pressure.as_dict() if pressure else None,
                "servicePressure": self.services.pressure.as_dict() if self.services.pressure else None,
                "migrations": [m.__dict__ for m in self.datapath.migrations]}
