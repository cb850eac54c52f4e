"""lace status / node status / lace metrics against the shared lab: a healthy lab, an agent down
(named, the others shown; --wait returns once it is back), a pod's program detached behind the
agent's back (that node's datapath fails naming the pod; an agent restart re-attaches it), and the
metrics scraped over TCP inside a node's namespace and parsed with prometheus_client, and a map
filled past 90 % behind the agent's back (flagged with its fill, healthy again once emptied)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from lace.bpf import Link
from lace.lab import cluster, procs, topology

from .conftest import pod

NODES = ("worker-1", "worker-2", "worker-3")


def _lab_node(lab, name):
    return topology.load(lab.name, state_dir=lab.dir).node(name)


def test_healthy_lab(lab):
    rc, out, err = lab.lace("status", "--wait", "--timeout", "60", check=False)
    assert rc == 0, out + err
    rc, out, err = lab.lace("status", check=False)
    assert rc == 0, out + err
    assert out.rstrip().endswith("3/3 nodes healthy"), out
    for n in NODES:
        assert f"{n}: healthy (agent " in out
    for s in ("store-watch", "reconcile", "ipam", "segments", "policy", "services", "probes", "datapath", "flows",
              "mtu", "maps", "endpoints"):
        assert f"  {s} " in out
    rc, out, _ = lab.lace("status", "-o", "json")
    doc = json.loads(out)
    assert sorted(doc["healthy"]) == list(NODES) and doc["summary"] == "3/3 nodes healthy"
    w1 = doc["nodes"]["worker-1"]
    mtu = next(s for s in w1["subsystems"] if s["name"] == "mtu")
    assert (mtu["podMTU"], mtu["underlayMTU"], mtu["overhead"]) == (1460, 1500, 40)
    rc, out, _ = lab.lace("status", "--node", "worker-1", "--verbose")
    assert "loops:" in out and "reconcile" in out and "last success" in out and "ct-tcp-v4" in out
    rc, out, _ = lab.lace("exec", "--node", "worker-2", "--", "node", "status")
    assert out.startswith("worker-2: healthy")
    rc, _, err = lab.lace("status", "--node", "worker-9", check=False)
    assert rc == 2 and 'no node "worker-9"' in err


def test_agent_down_then_wait(lab):
    node = _lab_node(lab, "worker-2")
    procs.stop("agent-worker-2", lab.dir, sig=signal.SIGKILL, timeout=5)
    try:
        rc, out, err = lab.lace("status", check=False)
        assert rc == 1, out + err
        assert "worker-2: did not answer: the agent of worker-2 is not answering" in out
        assert "worker-1: healthy" in out and "worker-3: healthy" in out
        assert "2/3 nodes healthy; worker-2 did not answer" in out
        cluster.start_agent(lab.dir, node)   # not waited for: --wait does that
        rc, out, err = lab.lace("status", "--wait", "--timeout", "60", check=False)
        assert rc == 0, out + err
        assert out.rstrip().endswith("3/3 nodes healthy")
    finally:
        if not any(p.name == "agent-worker-2" and p.alive for p in procs.list_procs(lab.dir)):
            cluster.start_agent(lab.dir, node)
        cluster.wait_agent(lab.dir, "worker-2")


def test_detached_program_is_named(lab, ns):
    lab.apply([pod("det", ns, "worker-3")])
    lab.wait(ns, ["det"])
    rc, out, err = lab.lace("status", "--node", "worker-3", "--wait", "--timeout", "30", "-o", "json", check=False)
    assert rc == 0, out + err
    doc = json.loads(out)["nodes"]["worker-3"]
    dp = next(s for s in doc["subsystems"] if s["name"] == "datapath")
    entry = next(p for p in dp["pods"] if p["pod"] == f"{ns}/det")
    assert entry["ok"], entry
    link = Link.open_pinned(entry["pin"])
    try:
        link.detach()   # behind the agent's back: the pin stays, the program is off the veth
    finally:
        link.close()
    try:
        rc, out, err = lab.lace("status", check=False)
        assert rc == 1, out + err
        ifname = entry["ifname"]
        assert f"  datapath     FAILING  pod {ns}/det ({ifname}): link {entry['linkId']} is detached (defunct)" in out
        assert f"{ns}/det: program not attached to {ifname}" in out
        assert "worker-3: datapath, endpoints failing" in out
        assert "worker-1: healthy" in out and "worker-2: healthy" in out
    finally:
        lab.lace("lab", "restart-agent", "worker-3")   # the new agent re-attaches through the pin
    rc, out, err = lab.lace("status", "--wait", "--timeout", "30", check=False)
    assert rc == 0, out + err


def test_metrics_over_tcp_and_cli(lab):
    n = lab.node("worker-1")
    netns = n["netns"]
    url = f"http://[{n['underlay']}]:{cluster.METRICS_PORT}/metrics"
    code = f"import urllib.request;print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    fams = {f.name: f for f in text_string_to_metric_families(res.stdout)}
    for name in ("lace_datapath_packets", "lace_map_pressure", "lace_conntrack_entries", "lace_policy_entries",
                 "lace_endpoints", "lace_agent_reconcile_duration_seconds", "lace_agent_reconcile_errors",
                 "lace_store_watch_lag_seconds", "lace_flows_lost_events"):
        assert name in fams, name
    assert fams["lace_agent_reconcile_duration_seconds"].type == "histogram"
    ratio = {s.labels["map"]: s.value for s in fams["lace_map_pressure"].samples}
    assert 0 < ratio["devices"] < 0.9
    # nothing listens in the machine's own namespace
    ss = subprocess.run(["ss", "-Hltn", f"sport = :{cluster.METRICS_PORT}"], capture_output=True, text=True)
    assert ss.stdout.strip() == "", ss.stdout

    rc, out, _ = lab.lace("metrics", "-o", "json")
    doc = json.loads(out)
    assert sorted(doc["nodes"]) == list(NODES) and doc["unanswered"] == {}
    for node_doc in doc["nodes"].values():
        assert node_doc["lace_endpoints"]["type"] == "gauge"
        assert any(s["name"] == "lace_agent_reconcile_duration_seconds_count"
                   for s in node_doc["lace_agent_reconcile_duration_seconds"]["samples"])
    rc, out, _ = lab.lace("metrics", "--node", "worker-2")
    assert out.startswith("# node worker-2\n") and "lace_map_pressure{" in out


def test_a_map_nearly_full_is_flagged(lab):
    """worker-2's ct-icmp-v4 filled past 90 % behind the agent's back (entries of a network no pod
    is on, expiring in an hour): that node's maps subsystem fails naming the map and its fill, and
    the metric shows the ratio; once they are gone the node is healthy again."""
    from lace.datapath import conntrack as C
    from lace.datapath.node import PinnedMaps
    import ipaddress
    import time as _time

    pm = PinnedMaps(lab.node("worker-2")["pinRoot"], "worker-2")
    now = _time.clock_gettime_ns(_time.CLOCK_MONOTONIC)
    with pm.open("ct-icmp-v4") as m:
        count = int(m.max_entries * 0.93)
        keys = b"".join(C.ct4_key(999, str(ipaddress.IPv4Address(0x0AFE0000 + i)), "10.254.255.254", 7, 7, 1)
                        for i in range(count))
        value = C.CT_ENTRY.pack(created_ns=now, last_seen_ns=now, expires_ns=now + 3600 * 10**9,
                                state=C.CtState.UNREPLIED, dst_network=999)
        assert m.update_batch(keys, value * count, count) == count
        try:
            rc, out, err = lab.lace("status", check=False)
            assert rc == 1, out + err
            assert "worker-2: maps failing" in out, out
            # the table holds what we wrote and whatever ICMP flows the lab's own traffic left there
            flagged = re.search(rf"ct-icmp-v4 (\d+)/{m.max_entries} entries \([\d.]+% full, over 90%\)", out)
            assert flagged and int(flagged.group(1)) >= count, out
            rc, out, _ = lab.lace("metrics", "--node", "worker-2", "-o", "json")
            assert "ct-icmp-v4" in out
        finally:
            m.delete_batch(keys, count)
    rc, out, err = lab.lace("status", "--wait", "--timeout", "30", check=False)
    assert rc == 0, out + err
