"""A lab on etcd (``lace lab up --store etcd``): three members, one in each of the first three node
namespaces, peering over the fabric; every agent, the kubelet, the controllers and the CLI use it,
nothing listens in the root namespace, and ``lab down`` leaves nothing behind.

The session's etcd lab (``etcd_lab`` in conftest), shared with ``test_etcd_faults.py``; a member
killed here is started again afterwards, and that test runs after every other on the lab.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from lace.lab import etcd as lab_etcd
from lace.lab import procs
from lace.store.config import lab_store

from .conftest import LabHandle, ips, pod, start_etcd_members, wait_for

PORTS = (2379, 2380)


def _listening(netns: str | None) -> set[str]:
    """``ADDR:PORT`` of the TCP listeners on etcd's ports in a namespace (None: the root one)."""
    argv = ["ss", "-Hltn"] if netns is None else ["ip", "netns", "exec", netns, "ss", "-Hltn"]
    lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    local = [line.split()[3] for line in lines if len(line.split()) > 3]
    return {a for a in local if a.rsplit(":", 1)[-1] in {str(p) for p in PORTS}}


def test_members_serve_only_inside_their_node_namespaces(etcd_lab: LabHandle):
    config = lab_store(etcd_lab.dir)
    assert config.backend == "etcd" and len(config.endpoints) == 3
    assert not os.path.exists(os.path.join(etcd_lab.dir, "store.db"))
    nodes = etcd_lab.status()["nodes"]
    assert config.netns == nodes[0]["netns"]
    for node in nodes:
        assert _listening(node["netns"]) == {f"[{node['underlay']}]:{p}" for p in PORTS}
    assert _listening(None) == set()
    status = etcd_lab.status()["store"]
    assert status["backend"] == "etcd" and all(status["members"].values())


def test_pods_run_and_talk_through_the_etcd_store(etcd_lab: LabHandle, ns: str):
    etcd_lab.apply([pod("a1", ns, node="worker-1"), pod("a2", ns, node="worker-3")])
    pods = etcd_lab.wait(ns, ["a1", "a2"])
    v4, v6 = ips(pods["a2"])
    ok, out = etcd_lab.check(f"{ns}/a1", "tcp", v4, 80)
    assert ok, out
    ok, out = etcd_lab.check(f"{ns}/a1", "tcp", v6, 80)
    assert ok, out
    # a node command inside a node's namespace resolves names through etcd too
    _, out, _ = etcd_lab.lace("exec", "--node", "worker-3", "--", "node", "endpoint", "list")
    assert f"{ns}/a2" in out


@pytest.mark.etcd_fault(last=True)
def test_a_member_killed_leaves_the_cluster_working(etcd_lab: LabHandle, ns: str):
    """The member the CLI and the agents try first dies: requests go to the other two, watches
    reconnect to them, and a new pod still comes up on every node. The member is started again
    afterwards (from its data), even when the test fails."""
    first = etcd_lab.status()["nodes"][0]
    endpoint = f"[{first['underlay']}]:{lab_etcd.CLIENT_PORT}"
    assert lab_store(etcd_lab.dir).endpoints[0] == endpoint, "the CLI tries this member first"
    assert procs.kill(lab_etcd.proc_name(first["name"]), etcd_lab.dir, signal.SIGKILL)
    try:
        wait_for(lambda: endpoint not in _listening(first["netns"]), f"{endpoint} to stop listening", 10, 0.05)
        etcd_lab.apply([pod("b1", ns, node="worker-1"), pod("b2", ns, node="worker-2")])
        pods = etcd_lab.wait(ns, ["b1", "b2"])
        ok, out = etcd_lab.check(f"{ns}/b1", "tcp", ips(pods["b2"])[0], 80)
        assert ok, out
        # the agents' watches reconnect to the other members: every node healthy again
        rc, out, err = etcd_lab.lace("status", "--wait", "--timeout", "60", check=False)
        assert rc == 0 and "3/3 nodes healthy" in out, f"{out}\n{err}"
    finally:
        start_etcd_members(etcd_lab, [first["name"]])
