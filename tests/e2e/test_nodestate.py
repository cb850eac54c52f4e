"""The node-state commands (``node bpf show``, ``node ct``, ``node trace flow``, ``node device
list``; docs/troubleshooting/node-state.md) against the shared lab, through ``lace exec --node NODE --
node …``, asserting what an operator would look for."""

from __future__ import annotations

import json
import os
import time

import pytest

from .conftest import NETCHECK, agent_down, ips, pod


def node_cmd(lab, node: str, *argv: str, check: bool = True) -> tuple[int, str]:
    rc, out, err = lab.lace("exec", "--node", node, "--", "node", *argv, check=False)
    if check:
        assert rc == 0, f"node {' '.join(argv)} on {node} -> {rc}\n{out}\n{err}"
    return rc, out + err


def node_json(lab, node: str, *argv: str):
    rc, out, err = lab.lace("exec", "--node", node, "--", "node", *argv, "-o", "json", check=False)
    assert rc == 0, err
    return json.loads(out)   # one valid JSON document


@pytest.fixture(scope="module")
def talked(lab):
    """Two pods on worker-1 and worker-2 that have talked over TCP, and one denied attempt."""
    ns = "nodestate"
    lab.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"ns": ns}}},
               pod("alice", ns, "worker-1"), pod("bob", ns, "worker-2")])
    ps = lab.wait(ns, ["alice", "bob"])
    bob4, bob6 = ips(ps["bob"])
    ok, out = lab.check(f"{ns}/alice", "tcp", bob4, 80)
    assert ok, out
    ok, out = lab.check(f"{ns}/alice", "udp", bob6, 53)
    assert ok, out
    # an address of the default network with no pod behind it: dropped, no delivery
    ok, _ = lab.check(f"{ns}/alice", "tcp", "10.244.250.1", 8080, timeout=0.3)
    assert not ok
    yield {"ns": ns, "pods": ps, "bob4": bob4, "bob6": bob6, "alice4": ips(ps["alice"])[0]}
    lab.lace("delete", "namespace", ns, check=False)


def test_maps_hold_the_expected_rows(lab, talked):
    alice4, bob4 = talked["alice4"], talked["bob4"]
    ns = talked["ns"]
    veth = node_json(lab, "worker-1", "bpf", "show", "veth")
    assert any(alice4 in json.dumps(r) and f"{ns}/alice" in json.dumps(r) for r in veth["entries"]), veth
    delivery = node_json(lab, "worker-1", "bpf", "show", "delivery")
    text = json.dumps(delivery)
    assert f"{alice4}/32" in text, "local pod delivered by address"
    bob_block = next(r for r in delivery["entries"] if r.get("kind") == "remote" and
                     __import__("ipaddress").ip_address(bob4) in __import__("ipaddress").ip_network(r["prefix"]))
    assert bob_block, "the remote pod's block goes to its node"
    # the exact map: the trie's full-length entries, identical, and nothing else
    exact = node_json(lab, "worker-1", "bpf", "show", "delivery-exact", "-n")["entries"]
    trie = node_json(lab, "worker-1", "bpf", "show", "delivery", "-n")["entries"]
    full = [r for r in trie if r["prefix"].endswith("/32" if r["family"] == "ipv4" else "/128")]
    key = lambda r: (r["network"], r["prefix"])   # noqa: E731
    assert sorted(exact, key=key) == sorted(full, key=key) and f"{alice4}/32" in json.dumps(exact)
    routing = node_json(lab, "worker-1", "bpf", "show", "routing")
    assert any("10.244.0.0/16" in json.dumps(r) for r in routing["entries"])
    seg = node_json(lab, "worker-1", "bpf", "show", "segment")
    assert any(bob4 in json.dumps(r) for r in seg["entries"]), "every pod of the cluster has a segment"
    rc, table = node_cmd(lab, "worker-1", "bpf", "show", "veth")
    assert f"{ns}/alice" in table and "entries" in table


def test_every_showable_map_renders(lab, talked):
    for name in ("config", "devices", "routing", "delivery", "delivery-exact", "veth", "services", "policy",
                 "segment", "prefix-segment", "probes", "probe-cookie"):
        rc, out = node_cmd(lab, "worker-2", "bpf", "show", name)
        assert out.strip(), name
        node_json(lab, "worker-2", "bpf", "show", name)
    rc, out = node_cmd(lab, "worker-2", "bpf", "show", "services", "--endpoints")
    rc, out = node_cmd(lab, "worker-2", "bpf", "show", "policy", "--egress")
    rc, out = node_cmd(lab, "worker-2", "bpf", "show", "nosuchmap", check=False)
    assert rc != 0 and "routing" in out and "prefix-segment" in out, out


def test_conntrack_lists_the_connection(lab, talked):
    # the agent's GC pass (every 10 s) deletes a closed connection's entries once they expire:
    # the pods talk again right before the listing
    for mode, ip, port in (("tcp", talked["bob4"], 80), ("udp", talked["bob6"], 53)):
        ok, out = lab.check(f"{talked['ns']}/alice", mode, ip, port)
        assert ok, out
    entries = node_json(lab, "worker-1", "ct", "list", "ct-tcp-v4")
    text = json.dumps(entries)
    assert talked["alice4"] in text and talked["bob4"] in text
    rc, out = node_cmd(lab, "worker-1", "ct", "list", "all")
    assert talked["bob4"] in out and "tcp" in out
    udp6 = json.dumps(node_json(lab, "worker-2", "ct", "list", "ct-udp-v6"))
    assert talked["bob6"] in udp6, "the reply side tracks it too"
    rc, out = node_cmd(lab, "worker-1", "ct", "gc", "all")
    assert "ct-tcp-v4" in out


def test_trace_shows_the_denied_flow_with_its_reason(lab, talked):
    deadline = time.monotonic() + 10
    while True:
        flows = node_json(lab, "worker-1", "trace", "flow", "--last", "200", "--verdict", "drop")
        text = json.dumps(flows)
        if "10.244.250.1" in text:
            break
        assert time.monotonic() < deadline, text[:2000]
        time.sleep(0.1)
    assert "no-delivery" in text
    rc, out = node_cmd(lab, "worker-1", "trace", "flow", "--last", "50", "--port", "80")
    assert talked["bob4"] in out


def test_numeric_works_with_the_store_unreadable(lab, talked, tmp_path):
    """``node`` run directly on the node (as on a real one), its store a garbage file with mode 000
    (root ignores modes, so the content makes opening it fail) or a path that does not exist."""
    import subprocess
    import sys
    from lace.netlink import netns
    node = lab.node("worker-1")
    bad = tmp_path / "store.db"
    bad.write_bytes(b"not a database" * 100)
    bad.chmod(0)
    node_bin = os.path.join(os.path.dirname(sys.executable), "node")

    def run(store: str, *argv: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, LACE_PIN_ROOT=node["pinRoot"], LACE_STORE=store, LACE_NODE="worker-1",
                   LACE_AGENT_SOCKET=os.path.join(lab.dir, "agents", "worker-1.sock"), NO_COLOR="1")
        path = netns.path(node["netns"])

        def enter() -> None:
            from pyroute2.netns import setns
            setns(path)
        return subprocess.run([node_bin, *argv], env=env, preexec_fn=enter, capture_output=True, text=True)

    for store in (str(bad), str(tmp_path / "missing" / "store.db")):
        r = run(store, "-n", "bpf", "show", "veth")
        assert r.returncode == 0, r.stderr
        assert talked["alice4"] in r.stdout and f"{talked['ns']}/alice" not in r.stdout, "raw, no names"
        r = run(store, "-n", "ct", "list", "all", "-o", "json")
        assert r.returncode == 0 and talked["bob6"] in r.stdout, r.stderr
        json.loads(r.stdout)
    assert bad.read_bytes().startswith(b"not a database"), "-n never touched the store"
    r = run(str(bad), "bpf", "show", "veth")
    assert r.returncode != 0 and "-n" in r.stderr, "without -n an unreachable store is an error that says so"


def test_limit_and_json(lab, talked):
    full = node_json(lab, "worker-1", "bpf", "show", "segment")
    assert len(full["entries"]) > 2
    limited = node_json(lab, "worker-1", "--limit", "2", "bpf", "show", "segment")
    assert len(limited["entries"]) == 2


def test_device_list_shows_programs_on_every_pod_veth_and_the_uplink(lab, talked):
    devs = node_json(lab, "worker-1", "device", "list")
    text = json.dumps(devs)
    rows = devs["devices"] if isinstance(devs, dict) and "devices" in devs else devs["entries"]
    uplink = next(r for r in rows if r.get("role") == "uplink")
    assert "lace_from_uplin" in json.dumps(uplink)
    pods = [r for r in rows if r.get("role") == "pod-veth"]
    assert pods and all("lace_from_pod" in json.dumps(r) for r in pods), text[:2000]
    assert "MISSING" not in text


def test_maps_conntrack_and_devices_read_with_the_agent_down(lab, talked):
    with agent_down(lab, "worker-1"):
        rc, out = node_cmd(lab, "worker-1", "bpf", "show", "veth")
        assert f"{talked['ns']}/alice" in out
        node_json(lab, "worker-1", "ct", "list", "all")
        rc, out = node_cmd(lab, "worker-1", "device", "list")
        assert "lace_from_pod" in out
        rc, out = node_cmd(lab, "worker-1", "trace", "flow", "--last", "1", check=False)
        assert rc != 0 and "worker-1" in out, "trace needs the agent, and says which one is down"


def test_two_followers_see_the_same_new_flow(lab, talked):
    """`node trace flow --follow` from two readers at once: both see a flow made after they started."""
    import subprocess
    import sys
    import threading
    lace_bin = os.path.join(os.path.dirname(sys.executable), "lace")
    env = dict(lab.env, PYTHONUNBUFFERED="1")
    cmd = [lace_bin, "exec", "--node", "worker-1", "--", "node", "trace", "flow", "--follow", "--port", "81"]
    readers = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for _ in range(2)]
    seen = [threading.Event(), threading.Event()]
    target = talked["bob4"]

    def watch(i: int) -> None:
        for line in readers[i].stdout:
            if target in line and ":81" in line:
                seen[i].set()
                return

    threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 20
        while not all(e.is_set() for e in seen):
            assert time.monotonic() < deadline, "a follower missed the flow"
            lab.check(f"{talked['ns']}/alice", "tcp", target, 81, timeout=0.3)   # nothing listens on 81
            for e in seen:
                e.wait(0.5)
    finally:
        for r in readers:
            r.terminate()
            r.wait(timeout=10)
