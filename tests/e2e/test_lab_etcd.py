"""A lab on etcd (``lace lab up --store etcd``): three members, one in each of the first three node
namespaces, peering over the fabric; every agent, the kubelet, the controllers and the CLI use it,
nothing listens in the root namespace, and ``lab down`` leaves nothing behind.

Its own lab (not the session's shared one, which is on SQLite), brought up once for this module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile

import pytest

from lace.lab import procs
from lace.store.config import lab_store

from .conftest import LabHandle, ips, leftovers, namespace, pod, wait_for

PORTS = (2379, 2380)


def _listening(netns: str | None) -> set[str]:
    """``ADDR:PORT`` of the TCP listeners on etcd's ports in a namespace (None: the root one)."""
    argv = ["ss", "-Hltn"] if netns is None else ["ip", "netns", "exec", netns, "ss", "-Hltn"]
    lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    local = [line.split()[3] for line in lines if len(line.split()) > 3]
    return {a for a in local if a.rsplit(":", 1)[-1] in {str(p) for p in PORTS}}


@pytest.fixture(scope="module")
def etcd_lab():
    name = f"et{os.getpid() % 10000}"
    state = tempfile.mkdtemp(prefix="lace-e2e-etcd-")
    handle = LabHandle(name, state)
    try:
        handle.lace("lab", "up", "--name", name, "--nodes", "3", "--store", "etcd")
        yield handle
    finally:
        handle.lace("lab", "down", "--name", name, check=False)
        left = leftovers(name, handle.dir)
        subprocess.run(["rm", "-rf", state])
        assert not left, f"lab down left {left}"


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


def test_pods_run_and_talk_through_the_etcd_store(etcd_lab: LabHandle):
    etcd_lab.apply([namespace("etcd-a"), pod("a1", "etcd-a", node="worker-1"),
                    pod("a2", "etcd-a", node="worker-3")])
    pods = etcd_lab.wait("etcd-a", ["a1", "a2"])
    v4, v6 = ips(pods["a2"])
    ok, out = etcd_lab.check("etcd-a/a1", "tcp", v4, 80)
    assert ok, out
    ok, out = etcd_lab.check("etcd-a/a1", "tcp", v6, 80)
    assert ok, out
    # a node command inside a node's namespace resolves names through etcd too
    _, out, _ = etcd_lab.lace("exec", "--node", "worker-3", "--", "node", "endpoint", "list")
    assert "etcd-a/a2" in out


def test_a_member_killed_leaves_the_cluster_working(etcd_lab: LabHandle):
    """The member the CLI and the agents try first dies: requests go to the other two, watches
    reconnect to them, and a new pod still comes up on every node."""
    assert procs.kill("etcd-worker-1", etcd_lab.dir, signal.SIGKILL)
    wait_for(lambda: "[fd5e:ff::1]:2379" not in _listening(etcd_lab.status()["nodes"][0]["netns"]),
             "etcd-worker-1 to stop listening", 10, 0.05)
    etcd_lab.apply([namespace("etcd-b"), pod("b1", "etcd-b", node="worker-1"),
                    pod("b2", "etcd-b", node="worker-2")])
    pods = etcd_lab.wait("etcd-b", ["b1", "b2"])
    ok, out = etcd_lab.check("etcd-b/b1", "tcp", ips(pods["b2"])[0], 80)
    assert ok, out
    rc, out, _ = etcd_lab.lace("status")
    assert rc == 0 and "3/3 nodes healthy" in out
