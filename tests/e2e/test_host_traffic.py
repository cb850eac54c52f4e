"""Traffic between a node's host namespace and pods through the host device, in the lab: worker-1's
host reaches pods on its own node and on worker-2 (TCP and ping, IPv4 and IPv6) from its host
address; pods reach the host address of their own node and of another node; the host gets into a
pod under a default-deny policy while another node's host and another pod do not; a pod of an
isolated network stays out of the host's reach, even when the node routes to it; and a host
process in the node's host cgroup reaches a ClusterIP's backends (socket-level translation to a
pod address, then the host device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from lace.lab import topology

from .conftest import NETCHECK, ips, network, pod

HOST_PORT = 18080


def in_node(lab, node: str, argv: list[str], *, cgroup: bool = False, timeout: float = 30,
            **popen) -> subprocess.CompletedProcess[str]:
    """Run argv in the node's network namespace (and its host cgroup): as a process on the node's host."""
    netns = topology.netns_name(lab.name, node)
    group = topology.node_cgroup(lab.name, node) if cgroup else None

    def enter() -> None:
        from pyroute2.netns import setns
        setns(f"/run/netns/{netns}")
        if group:
            topology.join_cgroup(group)

    return subprocess.run(argv, preexec_fn=enter, capture_output=True, text=True, timeout=timeout, **popen)


def host_check(lab, node: str, mode: str, ip: str, port: int, *, cgroup: bool = False, count: int = 1
               ) -> tuple[bool, str]:
    argv = [*NETCHECK, mode, ip, str(port), "--timeout", "1"] + (["--count", str(count)] if count > 1 else [])
    res = in_node(lab, node, argv, cgroup=cgroup)
    return res.returncode == 0, (res.stdout + res.stderr).strip()


def host_ping(lab, node: str, ip: str) -> bool:
    return in_node(lab, node, ["ping", "-c1", "-W1", ip]).returncode == 0


def host_addresses(lab, node: str) -> tuple[str, str]:
    """(IPv4, IPv6) host address of ``node``: its leases for the pseudo-pod node/<node>."""
    _, out, _ = lab.lace("get", "ipleases", "-o", "json")
    mine = [o["spec"]["ip"] for o in json.loads(out)["items"] if o["spec"]["pod"] == f"node/{node}"]
    v4 = next(a for a in mine if ":" not in a)
    v6 = next(a for a in mine if ":" in a)
    return v4, v6


def eventually(fn, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        ok, out = fn()
        if ok:
            return out
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {out}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def host_servers(lab) -> Iterator[dict[str, tuple[str, str]]]:
    """A TCP server answering with ``host/<node>`` in the host namespace of worker-1 and worker-2;
    node -> its host addresses."""
    procs, out = [], {}
    tmp = tempfile.mkdtemp(prefix="lace-hostsrv-")
    try:
        for node in ("worker-1", "worker-2"):
            ready = os.path.join(tmp, node)
            netns = topology.netns_name(lab.name, node)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, "-m", "lace.lab.podserver", "--name", f"host/{node}",
                 "--tcp", str(HOST_PORT), "--ready-file", ready], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 10
            while not os.path.exists(ready):
                assert time.monotonic() < deadline, f"host server on {node} did not start"
                time.sleep(0.02)
            out[node] = host_addresses(lab, node)
        yield out
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=5)
        subprocess.run(["rm", "-rf", tmp])


def test_host_reaches_pods_on_its_node_and_another_in_both_families(lab, ns):
    lab.apply([pod("here", ns, "worker-1"), pod("there", ns, "worker-2")])
    ps = lab.wait(ns, ["here", "there"])
    for name in ("here", "there"):
        for ip in ips(ps[name]):
            assert eventually(lambda: host_check(lab, "worker-1", "tcp", ip, 80), f"worker-1 -> {ns}/{name} {ip}") \
                == f"{ns}/{name}"
            assert host_ping(lab, "worker-1", ip), f"worker-1 host pings {ns}/{name} at {ip}"
    # from the host address, tracked as segment HOST at from-host
    v4, _ = host_addresses(lab, "worker-1")
    rc, out, err = lab.lace("exec", "--node", "worker-1", "--", "node", "trace", "flow", "--ip", v4, "-o", "json",
                            check=False)
    assert rc == 0, err
    flows = json.loads(out)["flows"]
    assert any(f["point"] == "from-host" and f["saddr"] == v4 and f["src_segment_name"] == "host"
               and f["dst_pod"] == f"{ns}/here" for f in flows), out[:2000]


def test_pods_reach_their_own_and_another_nodes_host_address(lab, ns, host_servers):
    lab.apply([pod("client", ns, "worker-1")])
    lab.wait(ns, ["client"])
    for node, addrs in host_servers.items():
        for ip in addrs:
            ok, out = lab.check(f"{ns}/client", "tcp", ip, HOST_PORT)
            assert ok and out == f"host/{node}", f"{ns}/client -> {node} host {ip}: {out}"
            rc, out = lab.exec(f"{ns}/client", "ping", "-c1", "-W1", ip)
            assert rc == 0, f"{ns}/client pings {node} host {ip}: {out}"


def test_host_enters_a_default_deny_pod_but_another_nodes_host_does_not(lab, ns, host_servers):
    lab.apply([pod("guarded", ns, "worker-1"), pod("peer", ns, "worker-2")])
    ps = lab.wait(ns, ["guarded", "peer"])
    v4, v6 = ips(ps["guarded"])
    for ip in (v4, v6):
        eventually(lambda: host_check(lab, "worker-1", "tcp", ip, 80), f"worker-1 -> guarded {ip}")
        eventually(lambda: host_check(lab, "worker-2", "tcp", ip, 80), f"worker-2 -> guarded {ip}")
    lab.apply([{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "deny-all", "namespace": ns},
                "spec": {"podSelector": {"matchLabels": {"app": "guarded"}}, "policyTypes": ["Ingress"]}}])
    eventually(lambda: (not host_check(lab, "worker-2", "tcp", v4, 80)[0], "still answers"),
               "the policy to reach worker-1")
    for ip in (v4, v6):
        ok, out = host_check(lab, "worker-1", "tcp", ip, 80)
        assert ok and out == f"{ns}/guarded", f"the node's host is allowed by default: {out}"
        assert host_ping(lab, "worker-1", ip)
        assert not host_check(lab, "worker-2", "tcp", ip, 80)[0], "another node's host is an ordinary peer"
        assert not lab.check(f"{ns}/peer", "tcp", ip, 80)[0], "other pods stay denied"


def test_isolated_network_pod_is_out_of_the_hosts_reach(lab, ns):
    net = f"iso-{ns}"
    lab.apply([network(net, "10.78.0.0/16", "fd78::/64"),
               pod("iso", ns, "worker-1", network=net), pod("iso-peer", ns, "worker-1", network=net)])
    ps = lab.wait(ns, ["iso", "iso-peer"])
    v4, v6 = ips(ps["iso"])
    # it serves its own network
    ok, out = lab.check(f"{ns}/iso-peer", "tcp", v4, 80)
    assert ok and out == f"{ns}/iso", out
    for ip in (v4, v6):
        assert not host_check(lab, "worker-1", "tcp", ip, 80)[0]
        assert not host_ping(lab, "worker-1", ip)
    # even routed into the host device, the datapath keeps the host in the default network
    netns = topology.netns_name(lab.name, "worker-1")
    subprocess.run(["ip", "-n", netns, "route", "add", "10.78.0.0/16", "dev", "lace_host"], check=True)
    try:
        ok, out = host_check(lab, "worker-1", "tcp", v4, 80)
        assert not ok, f"an isolated pod answered the host: {out}"
        rc, text, _ = lab.lace("exec", "--node", "worker-1", "--", "node", "trace", "flow", "--ip", v4,
                               "--verdict", "drop", check=False)
        assert "no-route" in text and "from-host" in text, text
    finally:
        subprocess.run(["ip", "-n", netns, "route", "del", "10.78.0.0/16", "dev", "lace_host"])
    lab.lace("delete", "pod", "iso", "iso-peer", "-n", ns, check=False)
    lab.wait_gone(ns, "iso")
    lab.wait_gone(ns, "iso-peer")
    lab.lace("delete", "network", net, check=False)


def test_host_process_reaches_clusterip_backends(lab, ns):
    """A process on worker-1's host (its cgroup's socket hooks translate the ClusterIP to a backend
    pod's address) gets answers from backends on its own node and on another one."""
    lab.apply([pod(f"web{i}", ns, node, labels={"app": "web"}) for i, node in enumerate(("worker-1", "worker-2"))])
    lab.wait(ns, ["web0", "web1"])
    lab.apply([{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": ns},
                "spec": {"selector": {"app": "web"}, "ipFamilyPolicy": "PreferDualStack",
                         "ports": [{"port": 80, "targetPort": 80}]}}])
    _, out, _ = lab.lace("get", "services", "web", "-n", ns, "-o", "json")
    vips = json.loads(out)["spec"]["clusterIPs"]
    assert len(vips) == 2
    backends = {f"{ns}/web0", f"{ns}/web1"}
    for vip in vips:
        def both() -> tuple[bool, str]:
            ok, text = host_check(lab, "worker-1", "tcp", vip, 80, cgroup=True, count=16)
            return ok and set(text.split()) == backends, text
        answers = eventually(both, f"worker-1 host -> {vip} answered by both backends", timeout=30)
        assert set(answers.split()) == backends
