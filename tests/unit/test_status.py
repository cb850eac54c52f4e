"""lace status / node status / metrics: the agent's status assembly (pure, over facts), the MTU
check, the >90 % map flag, the rendering, the cluster summary, the metric families and the Grafana
dashboard's expressions against them."""

from __future__ import annotations

import copy
import json
import os
import re
import urllib.request
from types import SimpleNamespace as NS

import numpy as np
import pytest

from lace.agent import status as st
from lace.agent.metrics import AgentMetrics
from lace.cli import fanout
from lace.cli.commands import status as cs
from lace.cli.node import metrics as nm
from lace.cli.node import status as ns
from lace.datapath.trace import METRICS_VALUE

NOW = 1_000_000.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def link(what, ok=True, reason=None, **kw):
    return {"what": what, "ok": ok, "reason": reason, **kw}


def facts(**over):
    f = {
        "node": "worker-1", "version": "0.1.0", "pid": 42, "started": NOW - 300,
        "watch": {"connected": True, "revision": 90, "lastEvent": NOW - 2, "lag": 0.0, "error": None},
        "liveness": {"ttl": 10.0, "lastRenewed": NOW - 1, "lastError": None, "failingSince": None, "expired": 0},
        "reconcile": {"reconciles": 12, "errors": 0, "lastError": None, "lastReconcile": NOW - 1},
        "ipam": {"blocks": [{"network": "default", "cidr": "10.244.1.0/24", "leases": 3, "size": 256}], "errors": []},
        "segments": {"count": 4, "local": 2, "errors": []},
        "pods": [{"pod": "a/web", "created": NOW - 100}, {"pod": "a/db", "created": NOW - 100}],
        "policyPressure": None, "policyEntries": 7, "servicesPressure": None,
        "probes": {"entries": 0, "kubeletCgroup": "/cg/kubelet", "kubeletCgroupId": 77},
        "attach": {"uplink": link("uplink", ifname="eth0"), "host": link("host device"),
                   "sock": [link("socket hook connect4")],
                   "pods": [link("pod", pod="a/web", ifname="lx01"), link("pod", pod="a/db", ifname="lx02")],
                   "stalePins": []},
        "endpoints": {"a/web": {"ifname": "lx01", "attached": True, "veth": True, "delivery": []},
                      "a/db": {"ifname": "lx02", "attached": True, "veth": True, "delivery": []}},
        "flows": {"running": True, "received": 10, "decodeErrors": 0, "lost": 0, "followers": 0, "backlog": 0},
        "mtu": {"pod": 1460, "underlay": 1500, "uplink": "eth0"},
        "maps": [{"map": "veth", "type": "hash", "entries": 2, "capacity": 4096},
                 {"map": "config", "type": "array", "entries": 1, "capacity": 1}],
        "loops": [st.Loop("reconcile", runs=3, last_success=NOW - 1).as_dict()],
        "metrics": ["[fd5e:ff::1]:9962"],
    }
    f.update(over)
    return f


def sub(doc, name):
    return next(s for s in doc["subsystems"] if s["name"] == name)


# ---- pure checks -------------------------------------------------------------------------------------

def test_mtu_check():
    assert st.mtu_check(1460, 1500)["ok"]
    assert st.mtu_check(1460, 1500)["overhead"] == 40
    bad = st.mtu_check(1460, 1480)
    assert not bad["ok"] and "1460 + 40 encapsulation = 1500 > underlay MTU 1480" in bad["reason"] and "--mtu 1440" in bad["reason"]
    assert not st.mtu_check(1460, None)["ok"]
    assert st.mtu_check(1460, 1500, overhead=40)["ok"] and not st.mtu_check(1461, 1500)["ok"]


def test_map_pressure_flags_over_90_percent():
    assert st.map_pressure("veth", 3686, 4096)["ok"]                 # 89.99 %
    assert st.map_pressure("veth", 3687, 4096)["ok"] is False      # 90.01 %
    assert "veth 3687/4096 entries (90.0% full, over 90%)" == st.map_pressure("veth", 3687, 4096)["reason"]
    assert st.map_pressure("config", 1, 1, "array")["ok"]           # arrays are always full: never flagged
    assert st.map_pressure("empty", 0, 0)["ok"]


def test_endpoint_states_grace_and_reasons():
    pods = [{"pod": "a/new", "created": NOW - 1}, {"pod": "a/old", "created": NOW - 100},
            {"pod": "a/det", "created": NOW - 100}, {"pod": "a/nodel", "created": NOW - 100}]
    eps = {"a/det": {"ifname": "lx9", "attached": False, "attachReason": "link 5 is detached (defunct)",
                     "veth": True, "delivery": []},
           "a/nodel": {"ifname": "lx8", "attached": True, "veth": True, "delivery": ["10.0.0.1/32"]}}
    got = {e["pod"]: e for e in st.endpoint_states(pods, eps, NOW)}
    assert got["a/new"]["state"] == "pending"
    assert got["a/old"]["state"] == "failing" and "no endpoint after 30s" in got["a/old"]["reason"]
    assert got["a/det"]["state"] == "failing" and "lx9: link 5 is detached" in got["a/det"]["reason"]
    assert got["a/nodel"]["state"] == "failing" and got["a/nodel"]["reason"] == "no delivery entry 10.0.0.1/32"


def test_watch_state_lag_and_loops():
    w = st.WatchState()
    assert w.lag() == 0.0
    w.event(5)
    t = w.pending_since
    assert w.lag(t + 3) == pytest.approx(3)
    w.applied(t - 1)                      # a pass that started before the event does not apply it
    assert w.pending_since == t
    w.applied(t + 0.001)
    assert w.lag() == 0.0 and w.revision == 5
    lp = st.Loop("x")
    lp.failed(ValueError("boom"))
    lp.failed("again")
    assert lp.as_dict()["failures"] == 2 and not lp.as_dict()["ok"]
    lp.ok()
    d = lp.as_dict()
    assert d["ok"] and d["failures"] == 0 and d["totalFailures"] == 2 and d["lastError"] == "again"
    loops = st.Loops()
    assert [x["name"] for x in loops.as_list()] == ["host-device", "reconcile", "watch"]


# ---- assembly -----------------------------------------------------------------------------------------

def test_assemble_healthy():
    doc = st.assemble(facts(), NOW)
    assert doc["healthy"] and doc["problems"] == []
    assert doc["endpoints"] == {"ready": 2, "total": 2}
    assert [s["name"] for s in doc["subsystems"]] == ["store-watch", "liveness", "reconcile", "ipam", "segments", "policy",
                                                      "services", "probes", "datapath", "flows", "mtu", "maps",
                                                      "endpoints", "conntrack"]
    assert sub(doc, "store-watch")["lastEventAge"] == 2
    assert sub(doc, "datapath")["summary"].endswith("2/2 pod programs attached")
    assert doc["uptime"] == 300 and doc["version"] == "0.1.0"
    json.dumps(doc)


def test_assemble_liveness_degraded_when_the_store_is_unavailable():
    f = facts(liveness={"ttl": 10.0, "lastRenewed": NOW - 4, "lastError": "cannot reach etcd at ...",
                        "failingSince": NOW - 3, "expired": 0})
    doc = st.assemble(f, NOW)
    lv = sub(doc, "liveness")
    assert not doc["healthy"] and lv["degraded"]
    assert lv["reason"].startswith("degraded: store unavailable for 3s") and "expires in 6s" in lv["reason"]
    assert "keeps forwarding on what is programmed" in lv["reason"]
    f["liveness"].update(lastRenewed=NOW - 14, failingSince=NOW - 13)
    assert "other nodes see this node as not ready" in sub(st.assemble(f, NOW), "liveness")["reason"]
    f["liveness"].update(lastRenewed=NOW - 1, failingSince=None, lastError=None, expired=1)
    lv = sub(st.assemble(f, NOW), "liveness")
    assert lv["ok"] and lv["summary"] == "record held, renewed 1.0s ago (ttl 10s)" and lv["expired"] == 1


def test_assemble_detached_pod_names_it():
    f = facts()
    f["attach"]["pods"][1] = link("pod", ok=False, reason="link 12 is detached (defunct)", pod="a/db", ifname="lx02")
    f["endpoints"]["a/db"].update(attached=False, attachReason="link 12 is detached (defunct)")
    doc = st.assemble(f, NOW)
    assert not doc["healthy"]
    assert sub(doc, "datapath")["reason"] == "pod a/db (lx02): link 12 is detached (defunct)"
    assert doc["endpoints"] == {"ready": 1, "total": 2}
    assert "datapath: pod a/db (lx02): link 12 is detached (defunct)" in doc["problems"]


def test_assemble_flags_full_map_mtu_pressure_and_watch():
    f = facts(maps=[{"map": "policy", "type": "lpm_trie", "entries": 60000, "capacity": 65536}],
              mtu={"pod": 1500, "underlay": 1500, "uplink": "eth0"},
              policyPressure={"reason": "MAP_FULL", "dropped": 3},
              watch={"connected": False, "revision": None, "lastEvent": None, "lag": 45.0, "error": "locked"})
    doc = st.assemble(f, NOW)
    failing = {s["name"]: s["reason"] for s in doc["subsystems"] if not s["ok"]}
    assert failing["maps"] == "policy 60000/65536 entries (91.6% full, over 90%)"
    assert "1500 + 40 encapsulation = 1540 > underlay MTU 1500" in failing["mtu"]
    assert failing["policy"] == "map full (MAP_FULL): entries left out"
    assert "not connected to the store: locked" in failing["store-watch"]
    assert "wait 45s for a reconcile" in failing["store-watch"]


def test_assemble_other_failures():
    f = facts(reconcile={"reconciles": 3, "errors": 1, "lastError": "StoreError: locked", "lastReconcile": NOW - 5},
              flows={"running": False, "received": 0, "lost": 2},
              ipam={"blocks": [{"network": "default", "cidr": "10.0.0.0/30", "leases": 4, "size": 4}], "errors": []})
    f["attach"]["sock"] = [link("socket hook connect4", ok=False, reason="link not on cgroup /cg (detached)")]
    doc = st.assemble(f, NOW)
    failing = {s["name"]: s["reason"] for s in doc["subsystems"] if not s["ok"]}
    assert failing["reconcile"] == "last pass failed: StoreError: locked"
    assert failing["flows"] == "the flow collector is not running"
    assert failing["ipam"] == "block 10.0.0.0/30 of default is full (4/4)"
    assert failing["datapath"] == "socket hook connect4: link not on cgroup /cg (detached)"


# ---- rendering ----------------------------------------------------------------------------------------

def test_node_render():
    doc = st.assemble(facts(), NOW)
    text = ns.render(doc)
    assert text.startswith("worker-1: healthy (agent 0.1.0, pid 42, up 5m, endpoints 2/2 ready)\n")
    assert re.search(r"^  datapath +OK +uplink eth0", text, re.M)
    assert "loops:" not in text
    verbose = ns.render(doc, verbose=True)
    assert re.search(r"^    reconcile  OK  3 runs, last success 1s ago, 0 failures in a row", verbose, re.M)
    assert "veth    2/4096 entries (0.0%)" in verbose and "config  array" in verbose
    assert "mtu: pod 1460, underlay 1500 (eth0), encapsulation 40" in verbose
    assert "http://[fd5e:ff::1]:9962/metrics" in verbose
    f = facts(maps=[{"map": "veth", "type": "hash", "entries": 4000, "capacity": 4096}])
    bad = ns.render(st.assemble(f, NOW), verbose=True)
    assert "UNHEALTHY (1 problems)" in bad and "OVER 90%" in bad
    assert re.search(r"^  maps +FAILING +veth 4000/4096 entries \(97.7% full, over 90%\)", bad, re.M)


def test_cluster_summary_and_exit():
    healthy = st.assemble(facts(), NOW)
    f = facts()
    f["attach"]["pods"][0] = link("pod", ok=False, reason="no pinned link pod-lx01", pod="a/web", ifname="lx01")
    sick = st.assemble(f, NOW)
    outs = [fanout.NodeOutput("worker-1", 0, json.dumps(healthy), ""),
            fanout.NodeOutput("worker-2", 5, "", "error: the agent of worker-2 is not answering on /s: refused\n"
                                                 "hint: restart it: lace lab restart-agent worker-2\n"),
            fanout.NodeOutput("worker-3", 1, json.dumps({**sick, "node": "worker-3"}), "")]
    results = [cs.parse_result(o) for o in outs]
    assert results[1].error == "the agent of worker-2 is not answering on /s: refused"
    assert results[1].hint == "restart it: lace lab restart-agent worker-2"
    assert cs.summary(results) == ("1/3 nodes healthy; worker-2 did not answer: the agent of worker-2 is not "
                                   "answering on /s: refused; worker-3: datapath failing")
    assert cs.exit_status(results) == 1
    assert cs.exit_status(results[:1]) == 0
    assert cs.summary(results[:1]) == "1/1 nodes healthy"
    report = cs.report(results, verbose=False)
    assert "worker-2: did not answer: the agent of worker-2" in report and report.count("store-watch") == 2
    doc = cs.document(results)
    assert doc["healthy"] == ["worker-1"] and set(doc["nodes"]) == {"worker-1", "worker-3"}
    assert cs.parse_result(fanout.NodeOutput("w", error="no answer within 3s")).error == "no answer within 3s"
    assert cs.parse_result(fanout.NodeOutput("w", 1, "not json", "")).error == "node status exited 1 without a report"


def test_lace_status_bad_input():
    import io

    from lace.cli.main import main as lace_main
    out, err = io.StringIO(), io.StringIO()
    assert lace_main(["status", "--timeout", "-1"], {"NO_COLOR": "1"}, stdout=out, stderr=err) == 2
    assert "--timeout must be more than 0" in err.getvalue()


# ---- metrics ----------------------------------------------------------------------------------------

class FakeMap:
    ncpus = 2

    def __init__(self, n=0):
        self.n = n

    def dump(self):
        arr = np.zeros((8192, self.ncpus), dtype=METRICS_VALUE.dtype)
        arr[0, 0]["packets"] = 9        # the ring-lost counter: not a packet
        arr[(2 << 11) | (1 << 8) | 3, 1]["packets"] = 5
        arr[(1 << 11), 0]["packets"] = 7
        return None, arr.tobytes(), 8192

    def count(self):
        return 8192


class FakeDatapath:
    def map(self, name):
        if name == "metrics":
            return FakeMap()
        return NS(count=lambda: 3)

    def entry_counts(self, names):
        return {name: self.map(name).count() for name in names}


def exported_families(text: str) -> set[str]:
    return set(nm.parse(text))


def agent_metrics():
    doc = st.assemble(facts(), NOW)
    m = AgentMetrics(FakeDatapath(), {"veth": 4096, "ct-tcp-v4": 262144}, lambda: doc)
    m.reconcile_duration.observe(0.02)
    return m


def test_metric_families():
    m = agent_metrics()
    text = m.exposition().decode()
    fams = nm.parse(text)
    for name in ("lace_datapath_packets", "lace_map_pressure", "lace_conntrack_entries", "lace_policy_entries",
                 "lace_endpoints", "lace_agent_reconcile_duration_seconds", "lace_agent_reconcile_errors",
                 "lace_store_watch_lag_seconds", "lace_flows_lost_events", "lace_flows_ring_backlog_bytes",
                 "lace_agent_subsystem_healthy", "lace_agent_info"):
        assert name in fams, name
    pk = fams["lace_datapath_packets"]["samples"]
    assert sum(s["value"] for s in pk) == 12, "metrics index 0 (ring losses) is not a packet"
    assert {s["labels"]["verdict"] for s in pk} == {"drop", "forward"}
    ratio = {s["labels"]["map"]: s["value"] for s in fams["lace_map_pressure"]["samples"]}
    assert ratio["veth"] == pytest.approx(3 / 4096)
    assert [s["labels"] for s in fams["lace_conntrack_entries"]["samples"]] == [{"table": "ct-tcp-v4"}]
    eps = {s["labels"]["state"]: s["value"] for s in fams["lace_endpoints"]["samples"]}
    assert eps == {"ready": 2, "pending": 0, "failing": 0}
    assert not any(n.endswith("_created") for n in fams)


def test_metrics_server_over_tcp():
    m = agent_metrics()
    bound = m.serve(["127.0.0.1"], 0)
    try:
        with urllib.request.urlopen(f"http://{bound[0]}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert "lace_map_pressure" in exported_families(text) | {"lace_map_pressure"} and "lace_endpoints" in text
    finally:
        m.stop()


def test_grafana_dashboard_uses_exported_metrics():
    with open(os.path.join(ROOT, "deploy", "grafana", "lace-dashboard.json")) as f:
        dash = json.load(f)
    fams = exported_families(agent_metrics().exposition().decode())
    series = set()
    for name, fam in nm.parse(agent_metrics().exposition().decode()).items():
        series |= {s["name"] for s in fam["samples"]}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for want in ("drops", "forwards", "map pressure", "reconcile duration", "conntrack", "endpoints", "lost"):
        assert want in titles, want
    for e in exprs:
        names = re.findall(r"\blace_[a-z0-9_]+", e)
        assert names, e
        for n in names:
            assert n in series or n in fams, f"{n} in {e!r} is not exported"


def test_parse_exposition():
    text = ('# HELP lace_x_total Things\n# TYPE lace_x_total counter\nlace_x_total{a="b"} 3.0\n')
    assert nm.parse(text) == {"lace_x": {"type": "counter", "help": "Things",
                                         "samples": [{"name": "lace_x_total", "labels": {"a": "b"}, "value": 3.0}]}}
    _ = copy


def test_store_facts_come_from_the_agents_cache():
    """IPAM, segment and local-pod facts are read from the agent's cluster cache (never a list of
    the store): this node's blocks with the leases in each, the segment count, and the node's pods
    that expect an endpoint with their creation time (not host-network, deleting or finished ones,
    and nothing of other nodes)."""
    from lace.agent.cluster import ClusterCache
    from lace.store import kinds as K

    def pod(name, node, **extra):
        spec = {"nodeName": node, "containers": [{"name": "c"}], **extra.pop("spec", {})}
        meta = {"name": name, "namespace": "a", "resourceVersion": "5",
                "creationTimestamp": "2026-12-06T10:00:00Z", **extra.pop("meta", {})}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, **extra}

    def lease(ip, node, pod_name):
        return {"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
                "metadata": {"name": f"default-{ip}", "resourceVersion": "5"},
                "spec": {"network": "default", "node": node, "block": "b", "ip": ip, "pod": f"a/{pod_name}",
                         "containerID": "c" * 64}}

    cache = ClusterCache(node="worker-1")
    cache.learn([
        {"apiVersion": K.LACE_API_VERSION, "kind": "IPBlock", "metadata": {"name": "b1", "resourceVersion": "5"},
         "spec": {"network": "default", "node": "worker-1", "cidr": "10.244.1.0/24"}},
        {"apiVersion": K.LACE_API_VERSION, "kind": "IPBlock", "metadata": {"name": "b2", "resourceVersion": "5"},
         "spec": {"network": "default", "node": "worker-2", "cidr": "10.244.2.0/24"}},
        {"apiVersion": K.LACE_API_VERSION, "kind": "Segment", "metadata": {"name": "s1", "resourceVersion": "5"},
         "spec": {"network": "default", "namespace": "a", "labels": {}}, "status": {"id": 300}},
        pod("web", "worker-1"), pod("host", "worker-1", spec={"hostNetwork": True}),
        pod("going", "worker-1", meta={"deletionTimestamp": "2026-12-06T11:00:00Z"}),
        pod("done", "worker-1", status={"phase": "Succeeded"}), pod("far", "worker-2"),
        lease("10.244.1.5", "worker-1", "web"), lease("10.244.2.7", "worker-2", "far"),
    ])
    got = st._store_facts(NS(cluster=cache, node="worker-1"))
    assert got["ipam"] == {"blocks": [{"network": "default", "cidr": "10.244.1.0/24", "leases": 1, "size": 256}],
                           "errors": []}
    assert got["segments"]["count"] == 1
    assert got["pods"] == [{"pod": "a/web", "created": 1796551200.0}]
    # other nodes' pods keep no status facts in the agent's cache
    assert cache.pod("a/far").created is None and cache.pod("a/web").created == 1796551200.0


def test_a_full_services_map_names_the_frontends_it_left_out():
    f = facts(servicesPressure={"reason": "services map full", "frontends": 9, "programmed": 2,
                                "leftOut": [f"a/web{i}:80" for i in range(7)]})
    doc = st.assemble(f, NOW)
    failing = {s["name"]: s["reason"] for s in doc["subsystems"] if not s["ok"]}
    assert failing["services"] == ("map full (services map full): 7 frontends left out (a/web0:80, a/web1:80, "
                                   "a/web2:80, a/web3:80, a/web4:80, 2 more); new flows to them are dropped as map-full")
