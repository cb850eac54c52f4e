"""Prometheus metrics of the node: datapath packet counters by verdict, point and reason (read
from the per-CPU metrics map at scrape time), map fill, and the agent's own reconcile counters."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from lace.datapath.common import Verdict
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.trace import METRICS_POINT_BITS, METRICS_REASON_BITS, METRICS_VALUE


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
            labels = [_label(Verdict, i >> (METRICS_REASON_BITS + METRICS_POINT_BITS)),
                      _label(TracePoint, (i >> METRICS_REASON_BITS) & 7), _label(DropReason, i & 0xFF)]
            pk.add_metric(labels, float(packets[i]))
            by.add_metric(labels, float(nbytes[i]))
        yield pk
        yield by
        fill = GaugeMetricFamily("lace_map_entries", "Entries in a datapath map", labels=["map"])
        cap = GaugeMetricFamily("lace_map_capacity", "Capacity of a datapath map", labels=["map"])
        for name, capacity in self.capacities.items():
            try:
                entries = self.datapath.map(name).dump()[2]
            except Exception:
                continue
            fill.add_metric([name], entries)
            cap.add_metric([name], capacity)
        yield fill
        yield cap


class AgentMetrics:
    def __init__(self, datapath, capacities: dict[str, int]) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("lace_agent_reconciles", "Reconcile passes", registry=self.registry)
        self.reconcile_errors = Counter("lace_agent_reconcile_errors", "Failed reconcile passes",
                                        registry=self.registry)
        self.map_writes = Counter("lace_agent_map_writes", "Map entries written or deleted", ["map"],
                                  registry=self.registry)
        self.left_out = Gauge("lace_agent_map_left_out",
                              "What the desired state holds that a full map could not take: policy entries "
                              "(policy, prefix-segment), service frontends (services), frontends without a "
                              "Maglev table (maglev)", ["map"], registry=self.registry)
        self.registry.register(DatapathCollector(datapath, capacities))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
