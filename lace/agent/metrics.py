"""Prometheus metrics of the node: datapath packet counters by verdict, point and reason (read
from the per-CPU metrics map at scrape time), map fill and pressure, conntrack entries per table,
the agent's reconcile counters and duration, and what its status document knows (endpoints by
state, policy entries, store watch lag, the flow collector's events, losses and backlog).

Served on the agent's unix socket (``GET /metrics``) and, with ``--metrics-port``, over TCP on the
node's own addresses (:class:`MetricsServer`; the agent runs inside the node's network namespace,
so nothing listens in any other namespace). ``deploy/grafana/lace-dashboard.json`` charts them.
"""

from __future__ import annotations

import numpy as np
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lace.datapath.common import Verdict
from lace.datapath.masquerade import MASQ_PORT_COUNT
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.trace import METRICS_POINT_BITS, METRICS_REASON_BITS, METRICS_VALUE

from .flows import RING_LOST_INDEX   # not a packet counter: flow events the ring buffer could not take

log = logging.getLogger("lace.agent.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
IP_FREEBIND = 15
IPV6_FREEBIND = 78


def _label(enum_cls, value: int) -> str:
    try:
        return enum_cls(value).label
    except ValueError:
        return str(value)


class DatapathCollector:
    def __init__(self, datapath, capacities: dict[str, int]) -> None:
        self.datapath = datapath
        self.capacities = capacities

    def collect(self):
        pk = CounterMetricFamily("lace_datapath_packets", "Packets by final verdict, observation point and drop reason",
                                 labels=["verdict", "point", "reason"])
        by = CounterMetricFamily("lace_datapath_bytes", "Bytes by final verdict, observation point and drop reason",
                                 labels=["verdict", "point", "reason"])
        m = self.datapath.map("metrics")
        _, values, n = m.dump()
        arr = np.frombuffer(values, dtype=METRICS_VALUE.dtype, count=n * m.ncpus).reshape(n, m.ncpus)
        packets = arr["packets"].sum(axis=1)
        nbytes = arr["bytes"].sum(axis=1)
        for idx in np.nonzero(packets)[0]:
            i = int(idx)
            if i == RING_LOST_INDEX:   # not a packet: the events the ring buffer could not take
                continue
            labels = [_label(Verdict, i >> (METRICS_REASON_BITS + METRICS_POINT_BITS)),
                      _label(TracePoint, (i >> METRICS_REASON_BITS) & 7), _label(DropReason, i & 0xFF)]
            pk.add_metric(labels, float(packets[i]))
            by.add_metric(labels, float(nbytes[i]))
        yield pk
        yield by
        fill = GaugeMetricFamily("lace_map_entries", "Entries in a datapath map", labels=["map"])
        cap = GaugeMetricFamily("lace_map_capacity", "Capacity of a datapath map", labels=["map"])
        ratio = GaugeMetricFamily("lace_map_pressure", "Entries / capacity of a datapath map (0..1; array "
                                  "maps always read 1)", labels=["map"])
        ct = GaugeMetricFamily("lace_conntrack_entries", "Entries in a conntrack table", labels=["table"])
        try:
            counts = self.datapath.entry_counts(self.capacities)
        except Exception:
            counts = {}
        for name, capacity in self.capacities.items():
            entries = counts.get(name)
            if entries is None:
                continue
            fill.add_metric([name], entries)
            cap.add_metric([name], capacity)
            ratio.add_metric([name], entries / capacity if capacity else 0.0)
            if name.startswith("ct-"):
                ct.add_metric([name], entries)
        yield fill
        yield cap
        yield ratio
        yield ct


class StatusCollector:
    """Gauges from the agent's status document (``lace.agent.status``), computed at scrape time."""

    def __init__(self, status_doc: Callable[[], dict[str, Any]]) -> None:
        self.status_doc = status_doc

    def collect(self):
        try:
            doc = self.status_doc()
        except Exception as e:   # a scrape must not fail because one fact could not be read
            log.warning("status for metrics: %s", e)
            return
        subs = {s["name"]: s for s in doc["subsystems"]}
        info = GaugeMetricFamily("lace_agent_info", "The agent's version", labels=["node", "version"])
        info.add_metric([doc["node"], doc["version"]], 1)
        yield info
        healthy = GaugeMetricFamily("lace_agent_subsystem_healthy", "1 when a subsystem is OK, 0 when failing",
                                    labels=["subsystem"])
        for name, s in subs.items():
            healthy.add_metric([name], 1 if s["ok"] else 0)
        yield healthy
        eps = GaugeMetricFamily("lace_endpoints", "Local endpoints by state (ready, pending, failing)",
                                labels=["state"])
        states = {"ready": 0, "pending": 0, "failing": 0}
        for e in subs["endpoints"]["endpoints"]:
            states[e["state"]] = states.get(e["state"], 0) + 1
        for state, n in states.items():
            eps.add_metric([state], n)
        yield eps
        yield GaugeMetricFamily("lace_policy_entries", "Entries in the policy maps (policy and policy-exact)",
                                value=subs["policy"]["entries"])
        w = subs["store-watch"]
        yield GaugeMetricFamily("lace_store_watch_connected", "1 while the store watch is connected",
                                value=1 if w["connected"] else 0)
        yield GaugeMetricFamily("lace_store_watch_lag_seconds", "How long store changes have waited for a "
                                "reconcile (0: every change seen is applied)", value=w["lag"])
        if w.get("lastEventAge") is not None:
            yield GaugeMetricFamily("lace_store_watch_last_event_age_seconds", "Seconds since the last store event",
                                    value=w["lastEventAge"])
        fl = subs["flows"]
        yield CounterMetricFamily("lace_flows_events", "Flow events the collector read", value=fl.get("received", 0))
        lost = CounterMetricFamily("lace_flows_lost_events", "Flow events lost: ring (the datapath found the ring "
                                   "buffer full), decode (unreadable records)", labels=["where"])
        lost.add_metric(["ring"], fl.get("lost", 0))
        lost.add_metric(["decode"], fl.get("decodeErrors", 0))
        yield lost
        if fl.get("backlog") is not None:
            yield GaugeMetricFamily("lace_flows_ring_backlog_bytes", "Bytes in the events ring buffer the "
                                    "collector has not read yet (its lag)", value=fl["backlog"])
        yield GaugeMetricFamily("lace_flows_collector_running", "1 while the flow collector reads",
                                value=1 if fl.get("running") else 0)
        warning = GaugeMetricFamily("lace_agent_subsystem_warning", "1 while a subsystem warns (not a fault of "
                                    "the node: a pod at its conntrack limit, a table nearly full)", labels=["subsystem"])
        for name, s in subs.items():
            warning.add_metric([name], 1 if s.get("warning") else 0)
        yield warning
        yield from conntrack_families(subs.get("conntrack") or {})


def conntrack_families(ct: dict[str, Any]):
    """The conntrack GC pass's findings (the status document's ``conntrack`` subsystem): live
    entries per table, endpoints at their limit — each named while it lasts —, the fullest
    masquerade destinations' ports."""
    live = GaugeMetricFamily("lace_conntrack_live_entries", "Unexpired entries in a conntrack table at the last "
                             "GC pass", labels=["table"])
    for t in ct.get("tables") or ():
        live.add_metric([t["table"]], t["entries"])
    yield live
    per_table: dict[str, int] = {t["table"]: 0 for t in ct.get("tables") or ()}
    named = GaugeMetricFamily("lace_conntrack_endpoint_at_limit", "Flows a local pod holds in a conntrack table, "
                              "present while it is at its limit (its new flows there drop as ct-endpoint-limit)",
                              labels=["pod", "table", "limit"])
    for a in ct.get("atLimit") or ():
        per_table[a["table"]] = per_table.get(a["table"], 0) + 1
        named.add_metric([a["pod"], a["table"], str(a["limit"])], a["flows"])
    count = GaugeMetricFamily("lace_conntrack_endpoints_at_limit", "Local pods at their conntrack limit in a table",
                              labels=["table"])
    for table, n in per_table.items():
        count.add_metric([table], n)
    yield count
    yield named
    masq = GaugeMetricFamily("lace_masquerade_ports_used", "Masquerade ports in use towards one destination (the "
                             "fullest few; the range holds lace_masquerade_port_capacity)",
                             labels=["proto", "remote", "port"])
    for d in ct.get("masquerade") or ():
        masq.add_metric([d["proto"], d["remote"], str(d["port"])], d["used"])
    yield masq
    yield GaugeMetricFamily("lace_masquerade_port_capacity", "Masquerade ports per destination",
                            value=MASQ_PORT_COUNT)
    if ct.get("lastRunAge") is not None:
        yield GaugeMetricFamily("lace_conntrack_gc_last_run_age_seconds", "Seconds since the last conntrack GC pass",
                                value=ct["lastRunAge"])


class AgentMetrics:
    def __init__(self, datapath, capacities: dict[str, int],
                 status_doc: Callable[[], dict[str, Any]] | None = None) -> None:
        disable_created_metrics()   # no *_created series: one sample per counter, as a dashboard wants
        self.registry = CollectorRegistry()
        self.reconciles = Counter("lace_agent_reconciles", "Reconcile passes", registry=self.registry)
        self.full_passes = Counter(
            "lace_agent_full_passes", "Full passes by cause: start, watch (a change no incremental pass covers), "
            "resync (the periodic one), cni (a CNI ADD or DEL the pod pass could not cover), repair "
            "(lace verify --repair)", ["cause"], registry=self.registry)
        self.reconcile_duration = Histogram("lace_agent_reconcile_duration_seconds", "Duration of a reconcile pass",
                                            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                                            registry=self.registry)
        self.resync_duration = Histogram(
            "lace_agent_resync_duration_seconds",
            "Duration of a periodic resync: a full pass that also reads every map back from the kernel",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=self.registry)
        self.service_sync_duration = Histogram(
            "lace_agent_service_sync_duration_seconds",
            "Duration of an incremental pass that programs only the services that changed",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1), registry=self.registry)
        self.pod_sync_duration = Histogram(
            "lace_agent_pod_sync_duration_seconds",
            "Duration of an incremental pass that programs only the pods that changed (of this node: "
            "their endpoints too)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1), registry=self.registry)
        self.cni_duration = Histogram(
            "lace_agent_cni_duration_seconds",
            "Duration of a CNI request in the agent (addresses, interfaces, maps), by command and result",
            ["command", "result"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry)
        self.reconcile_errors = Counter("lace_agent_reconcile_errors", "Failed reconcile passes",
                                        registry=self.registry)
        self.map_writes = Counter("lace_agent_map_writes", "Map entries written or deleted", ["map"],
                                  registry=self.registry)
        self.left_out = Gauge("lace_agent_map_left_out",
                              "What the desired state holds that a full map could not take: policy entries "
                              "(policy, prefix-segment), service frontends (services), frontends without a "
                              "Maglev table (maglev), frontends a backend's revnat entry does not name "
                              "(revnat: they work, their flows keep a backend entry)", ["map"],
                              registry=self.registry)
        self.reply_entry_backends = Gauge(
            "lace_agent_service_reply_entry_backends",
            "Backends flagged REPLY_ENTRY: more frontends than a revnat entry names, or no room in the revnat "
            "map; each new flow to one keeps a second conntrack entry for its replies", registry=self.registry)
        self.ct_gc_deleted = Counter("lace_conntrack_gc_deleted",
                                     "Expired conntrack entries the agent's GC pass deleted", registry=self.registry)
        self.ct_gc_duration = Histogram("lace_conntrack_gc_duration_seconds",
                                        "Duration of a conntrack GC pass (every table walked)",
                                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                        registry=self.registry)
        self.registry.register(DatapathCollector(datapath, capacities))
        if status_doc is not None:
            self.registry.register(StatusCollector(status_doc))
        self.server: MetricsServer | None = None

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, addresses: list[str], port: int) -> list[str]:
        """Serve ``GET /metrics`` over TCP on ``addresses`` (this namespace's); returns ``addr:port``s."""
        self.server = MetricsServer(addresses, port, self.exposition)
        return self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        # the node's addresses may still be tentative (IPv6 DAD) when the agent starts
        self.socket.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()


class MetricsServer:
    """A Prometheus scrape endpoint on each of ``addresses`` (one listening socket per address)."""

    def __init__(self, addresses: list[str], port: int, exposition: Callable[[], bytes]) -> None:
        self.addresses = addresses
        self.port = port
        self.exposition = exposition
        self._servers: list[_Server] = []

    def start(self) -> list[str]:
        exposition = self.exposition

        class H(BaseHTTPRequestHandler):
            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("metrics: " + fmt, *args)

            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "GET /metrics")
                    return
                data = exposition()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        bound = []
        for addr in self.addresses:
            cls = type("S", (_Server,), {"address_family": socket.AF_INET6 if ":" in addr else socket.AF_INET})
            srv = cls((addr, self.port), H)
            self._servers.append(srv)
            threading.Thread(target=srv.serve_forever, name=f"metrics-{addr}", daemon=True).start()
            port = srv.server_address[1]
            bound.append(f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}")
        return bound

    def stop(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._servers.clear()
