"""The lab end to end: pods on one node and across nodes over IPv4 and IPv6, SRv6 on the fabric,
overlapping networks, anti-spoofing, agent crashes, pod deletion, IPAM exhaustion, lab teardown."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether  # noqa: F401 - registers the link type rdpcap needs
from scapy.utils import rdpcap

from lace.bpf import Map
from lace.datapath import registry

from .conftest import NETCHECK, LabHandle, leftovers, network, pod, ips, wait_for


def test_pods_talk_on_one_node_and_across_nodes(lab, ns):
    lab.apply([pod("p1", ns, "worker-1"), pod("p2", ns, "worker-1"), pod("p3", ns, "worker-2")])
    ps = lab.wait(ns, ["p1", "p2", "p3"])
    for p in ps.values():   # what `lace get pods -o json` shows of each pod
        assert p["spec"]["nodeName"] and p["status"]["network"] == "default" and p["status"]["phase"] == "Running"
        assert len(p["status"]["podIPs"]) == 2
    for target in ("p2", "p3"):
        v4, v6 = ips(ps[target])
        for ip in (v4, v6):
            ok, out = lab.check(f"{ns}/p1", "tcp", ip, 80)
            assert ok and out == f"{ns}/{target}", (target, ip, out)
            ok, out = lab.check(f"{ns}/p1", "udp", ip, 53)
            assert ok and out.startswith("lace-netcheck"), (target, ip, out)
    # and back the other way, from the remote node
    ok, out = lab.check(f"{ns}/p3", "tcp", ips(ps["p1"])[1], 80)
    assert ok and out == f"{ns}/p1"


class Capture:
    """tcpdump on the lab fabric, to a pcap file (an independent oracle of what crossed it)."""

    def __init__(self, lab: LabHandle, path: str) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", f"lace-{lab.name}-fabric", "tcpdump", "-U", "-nn", "-i", "br0", "-w", path,
             "ip6 and (ip6[6] == 4 or ip6[6] == 41)"], stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()   # "listening on br0 ..." once the filter is in place
        assert "listening" in line, line

    def stop(self, want_bytes: int = 200, timeout: float = 5.0) -> list:
        # tcpdump -U writes each packet as it reads it: wait until they are on disk, then stop
        deadline = time.monotonic() + timeout
        while os.path.getsize(self.path) < want_bytes and time.monotonic() < deadline:
            time.sleep(0.02)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        return list(rdpcap(self.path))


@pytest.mark.parametrize("family", [4, 6])
def test_cross_node_packets_are_srv6_to_the_destination_locator(lab, ns, tmp_path, family):
    lab.apply([pod("src", ns, "worker-1"), pod("dst", ns, "worker-3")])
    ps = lab.wait(ns, ["src", "dst"])
    src_ip = ips(ps["src"])[0 if family == 4 else 1]
    dst_ip = ips(ps["dst"])[0 if family == 4 else 1]
    locator = ipaddress.ip_network(lab.node("worker-3")["locator"])
    cap = Capture(lab, str(tmp_path / "fabric.pcap"))
    try:
        ok, out = lab.check(f"{ns}/src", "tcp", dst_ip, 80)
    finally:
        pkts = cap.stop()
    assert ok, out
    inner_t = IP if family == 4 else IPv6
    to_dst = [p for p in pkts if IPv6 in p and p[IPv6].haslayer(inner_t)
              and p[IPv6].payload.haslayer(TCP) and p[IPv6].payload.src == src_ip and p[IPv6].payload.dst == dst_ip]
    assert to_dst, f"no encapsulated packet {src_ip} -> {dst_ip} on the fabric ({len(pkts)} captured)"
    for p in to_dst:
        outer = p[IPv6]
        assert outer.nh == (4 if family == 4 else 41)
        assert ipaddress.ip_address(outer.dst) in locator, f"{outer.dst} not in {locator}"
        assert outer.src == lab.node("worker-1")["underlay"]
        assert outer.payload[TCP].dport == 80


def test_overlapping_networks_stay_apart(lab, ns):
    tag = uuid.uuid4().hex[:4]
    red, blue = f"red{tag}", f"blue{tag}"
    # ra and ba first: each takes the first block of its network, so they share an address
    lab.apply([network(red, "10.40.0.0/16", "fd40::/64"), network(blue, "10.40.0.0/16", "fd40::/64"),
               pod("ra", ns, "worker-1", red), pod("ba", ns, "worker-1", blue)])
    lab.wait(ns, ["ra", "ba"])
    lab.apply([pod("rb", ns, "worker-2", red), pod("bb", ns, "worker-3", blue)])
    ps = lab.wait(ns, ["ra", "ba", "rb", "bb"])
    assert ips(ps["ra"]) == ips(ps["ba"]), "the first pod of each network on worker-1 gets the same address"
    same = ips(ps["ra"])
    for ip in same:
        ok, out = lab.check(f"{ns}/rb", "tcp", ip, 80)
        assert ok and out == f"{ns}/ra", out       # red reaches the red pod behind the shared IP
        ok, out = lab.check(f"{ns}/bb", "tcp", ip, 80)
        assert ok and out == f"{ns}/ba", out       # blue the blue one
    # a red pod never reaches a blue pod: bb's address means nothing (or another pod) in red
    bb4 = ips(ps["bb"])[0]
    ok, out = lab.check(f"{ns}/ra", "tcp", bb4, 80)
    assert out != f"{ns}/bb"
    # nor the default network's pods
    lab.apply([pod("dflt", ns, "worker-2")])
    d = lab.wait(ns, ["dflt"])["dflt"]
    ok, out = lab.check(f"{ns}/ra", "tcp", ips(d)[0], 80)
    assert not ok, out
    lab.lace("delete", "pods", "ra", "ba", "rb", "bb", "-n", ns)
    for p in ("ra", "ba", "rb", "bb"):
        lab.wait_gone(ns, p)


def _metric(lab: LabHandle, node: str, reason: str) -> float:
    from lace.cni.client import call
    _, text = call(os.path.join(lab.dir, "agents", f"{node}.sock"), "GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("lace_datapath_packets_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_spoofed_source_is_dropped(lab, ns):
    lab.apply([pod("honest", ns, "worker-1"), pod("target", ns, "worker-2")])
    ps = lab.wait(ns, ["honest", "target"])
    tgt = ips(ps["target"])[0]
    spoof = "10.244.250.250"
    rc, out = lab.exec(f"{ns}/honest", "ip", "addr", "add", f"{spoof}/32", "dev", "eth0")
    assert rc == 0, out
    before = _metric(lab, "worker-1", "spoofed-source")
    code = (f"import socket;s=socket.socket();s.bind(({spoof!r},0));s.settimeout(1)\n"
            f"try:\n s.connect(({tgt!r},80));print('connected')\nexcept OSError as e:\n print('blocked',e)")
    rc, out = lab.exec(f"{ns}/honest", sys.executable, "-c", code)
    assert "blocked" in out, out
    assert _metric(lab, "worker-1", "spoofed-source") > before, "the drop is counted under its reason"
    ok, out = lab.check(f"{ns}/honest", "tcp", tgt, 80)
    assert ok, "the pod's own address still works"


def _dump_owned(pin_root: str) -> dict[str, dict[bytes, bytes]]:
    out = {}
    for name in ("config", "devices", "routing", "delivery", "delivery-exact", "veth", "segment"):
        m = Map.open_pinned(os.path.join(pin_root, registry.get(name).pin_name))
        try:
            keys, values, n = m.dump()
            kb, vb, ks, vs = bytes(keys), bytes(values), m.key_size, m.value_blob_size
            out[name] = {kb[i * ks:(i + 1) * ks]: vb[i * vs:(i + 1) * vs] for i in range(n)}
        finally:
            m.close()
    return out


def test_agent_sigkill_keeps_streams_and_state(lab, ns):
    lab.apply([pod("client", ns, "worker-1"), pod("server", ns, "worker-2")])
    ps = lab.wait(ns, ["client", "server"])
    pin_root = lab.node("worker-2")["pinRoot"]
    before = _dump_owned(pin_root)
    result: dict = {}

    def stream() -> None:
        result["rc"], result["out"] = lab.exec(f"{ns}/client", *NETCHECK, "hold", ips(ps["server"])[0], "80", "4")

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(1.0)   # the stream is running: now crash the agent of the server's node
    old_pid = lab.node("worker-2")["agentPid"]
    lab.lace("lab", "restart-agent", "worker-2", "--kill")
    t.join(timeout=30)
    assert result.get("rc") == 0, f"the stream broke: {result}"
    assert lab.node("worker-2")["agentPid"] not in (None, old_pid)
    after = _dump_owned(pin_root)
    assert after == before, "the restarted agent adopted the maps without flushing or duplicating"
    # and the node still takes new connections
    ok, out = lab.check(f"{ns}/client", "tcp", ips(ps["server"])[0], 80)
    assert ok, out


def test_pod_delete_removes_every_trace(lab, ns):
    lab.apply([pod("gone", ns, "worker-3")])
    p = lab.wait(ns, ["gone"])["gone"]
    uid = p["metadata"]["uid"]
    from lace.agent.endpoints import host_ifname
    host = host_ifname(uid)
    node_ns = f"lace-{lab.name}-worker-3"
    pin_root = lab.node("worker-3")["pinRoot"]
    assert subprocess.run(["ip", "-n", node_ns, "link", "show", host], capture_output=True).returncode == 0
    assert os.path.exists(os.path.join(pin_root, "links", f"pod-{host}"))
    v4, v6 = ips(p)
    lab.lace("delete", "pod", "gone", "-n", ns)
    lab.wait_gone(ns, "gone")
    from lace.datapath.delivery import delivery_key
    from lace.lab.kubelet import sandbox_netns

    def traces() -> list[str]:
        left = []
        if subprocess.run(["ip", "-n", node_ns, "link", "show", host], capture_output=True).returncode == 0:
            left.append("veth")
        if os.path.exists(os.path.join(pin_root, "links", f"pod-{host}")):
            left.append("pinned link")
        _, out, _ = lab.lace("get", "ipleases", "-o", "json")
        if [l for l in json.loads(out)["items"] if l["spec"]["pod"] == f"{ns}/gone"]:
            left.append("lease")
        dl = Map.open_pinned(os.path.join(pin_root, "lace_delivery"))
        try:
            if dl.lookup(delivery_key(1, f"{v4}/32")) is not None or dl.lookup(delivery_key(1, f"{v6}/128")):
                left.append("delivery entry")
        finally:
            dl.close()
        if subprocess.run(["ip", "netns", "pids", sandbox_netns(lab.name, uid)], capture_output=True).returncode == 0:
            left.append("pod namespace")
        return left

    deadline = time.monotonic() + 20
    while left := traces():
        assert time.monotonic() < deadline, f"left behind after delete: {left}"
        time.sleep(0.05)


def _passes(lab: LabHandle, node: str) -> dict[str, float]:
    """The node's agent's incremental pod passes, its full passes for CNI operations (those the pod
    pass could not cover) and for watch events (a change no incremental pass covers), and its CNI
    ADDs and DELs so far."""
    _, out, _ = lab.lace("metrics", "--node", node, "-o", "json")
    doc = json.loads(out)["nodes"][node]

    def value(family: str, sample: str, **labels: str) -> float:
        return sum(s["value"] for s in doc.get(family, {"samples": []})["samples"]
                   if s["name"] == sample and all(s["labels"].get(k) == v for k, v in labels.items()))
    cni = "lace_agent_cni_duration_seconds"
    return {"pod": value("lace_agent_pod_sync_duration_seconds", "lace_agent_pod_sync_duration_seconds_count"),
            "full": value("lace_agent_full_passes", "lace_agent_full_passes_total", cause="cni"),
            "watch": value("lace_agent_full_passes", "lace_agent_full_passes_total", cause="watch"),
            "add": value(cni, f"{cni}_count", command="ADD", result="ok"),
            "del": value(cni, f"{cni}_count", command="DEL", result="ok")}


def _verified(lab: LabHandle, node: str) -> None:
    """`lace verify` finds every map of the node as a full pass would make it."""
    rc, out, err = lab.lace("verify", "--node", node, check=False)
    assert rc == 0, f"{out}\n{err}"


def _no_full_pass(before: dict[str, float], now: dict[str, float]) -> None:
    """No full pass for a CNI operation or a watch event between two looks at _passes."""
    assert (now["full"], now["watch"]) == (before["full"], before["watch"]), (before, now)


def _started(lab: LabHandle, doc: dict) -> tuple[dict[str, float], dict]:
    """Start one pod: its node's _passes just before, and the pod once running."""
    meta = doc["metadata"]
    before = _passes(lab, doc["spec"]["nodeName"])
    lab.apply([doc])
    return before, lab.wait(meta["namespace"], [meta["name"]])[meta["name"]]


def test_a_replica_on_a_node_that_runs_its_workload_is_programmed_without_a_full_pass(lab, ns):
    """A pod whose label set already has a pod on its node changes none of the node's policy
    subjects: its CNI ADD and DEL program its endpoint with incremental passes (no full pass for
    either), it answers at once from another node, and `lace verify` finds every map as a full
    pass would make it."""
    lab.apply([pod("rep0", ns, "worker-2", labels={"app": "rep"}), pod("cli", ns, "worker-1")])
    lab.wait(ns, ["rep0", "cli"])
    before, rep1 = _started(lab, pod("rep1", ns, "worker-2", labels={"app": "rep"}))
    for ip in ips(rep1):
        ok, out = lab.check(f"{ns}/cli", "tcp", ip, 80)
        assert ok and out == f"{ns}/rep1", (ip, out)
    _verified(lab, "worker-2")
    added = _passes(lab, "worker-2")
    assert added["add"] == before["add"] + 1
    _no_full_pass(before, added)
    assert added["pod"] > before["pod"]
    lab.lace("delete", "pod", "rep1", "-n", ns)
    lab.wait_gone(ns, "rep1")
    wait_for(lambda: _passes(lab, "worker-2")["del"] > added["del"], "rep1's CNI DEL on worker-2")
    # runtimes repeat a DEL: one that finds nothing left succeeds, and programs nothing
    cni = os.path.join(os.path.dirname(sys.executable), "lace-cni")
    conf = json.dumps({"cniVersion": "1.1.0", "name": "lace", "type": "lace-cni",
                       "agentSocket": os.path.join(lab.dir, "agents", "worker-2.sock")})
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": rep1["metadata"]["uid"], "CNI_NETNS": "",
           "CNI_IFNAME": "eth0", "CNI_ARGS": f"K8S_POD_NAMESPACE={ns};K8S_POD_NAME=rep1"}
    r = subprocess.run([cni], env=env, input=conf, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    _verified(lab, "worker-2")
    deleted = _passes(lab, "worker-2")
    assert deleted["del"] >= added["del"] + 2   # the kubelet may repeat its own DEL too
    _no_full_pass(before, deleted)
    ok, out = lab.check(f"{ns}/cli", "tcp", ips(lab.wait(ns, ["rep0"])["rep0"])[0], 80)
    assert ok and out == f"{ns}/rep0", out


def test_a_selected_workloads_first_pod_on_a_node_brings_its_policy_without_a_full_pass(lab, ns):
    """A policy selects a workload with a pod on another node; its first pod on worker-2 makes its
    label set a subject of worker-2's policy map: the CNI ADD writes that subject's policy
    entries with the pod (no full pass), and the policy holds at once — a pod it allows reaches
    the new pod across nodes, one it does not is dropped. The DEL of the last such pod takes the
    entries again; `lace verify` finds every map as a full pass would make it after each."""
    lab.apply([{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "guard", "namespace": ns},
                "spec": {"podSelector": {"matchLabels": {"app": "guarded"}},
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}],
                                      "ports": [{"port": 80}]}]}},
               pod("g0", ns, "worker-1", labels={"app": "guarded"}),
               pod("friend", ns, "worker-1", labels={"role": "friend"}),
               pod("stranger", ns, "worker-1", labels={"role": "stranger"})])
    lab.wait(ns, ["g0", "friend", "stranger"])
    before, g1 = _started(lab, pod("g1", ns, "worker-2", labels={"app": "guarded"}))
    for ip in ips(g1):
        ok, out = lab.check(f"{ns}/friend", "tcp", ip, 80)
        assert ok and out == f"{ns}/g1", (ip, out)
        ok, out = lab.check(f"{ns}/stranger", "tcp", ip, 80)
        assert not ok, f"{ip}: a peer the policy does not allow reached the new pod ({out})"
    _verified(lab, "worker-2")
    added = _passes(lab, "worker-2")
    assert added["add"] == before["add"] + 1, (before, added)
    _no_full_pass(before, added)
    lab.lace("delete", "pod", "g1", "-n", ns)
    lab.wait_gone(ns, "g1")
    wait_for(lambda: _passes(lab, "worker-2")["del"] > added["del"], "g1's CNI DEL on worker-2")
    _verified(lab, "worker-2")
    deleted = _passes(lab, "worker-2")
    _no_full_pass(before, deleted)


def test_ipam_exhaustion_is_a_clear_error(lab, ns):
    tag = uuid.uuid4().hex[:4]
    tiny = f"tiny{tag}"
    lab.apply([network(tiny, "10.50.0.0/29")] + [pod(f"x{i}", ns, "worker-1", tiny) for i in range(7)])
    deadline = time.monotonic() + 60
    while True:
        ps = lab.pods(ns)
        running = [n for n, p in ps.items() if p.get("status", {}).get("phase") == "Running"]
        failed = [p for p in ps.values() if any(c.get("reason") == "NetworkSetupFailed"
                                                  for c in p.get("status", {}).get("conditions", []))]
        if len(running) == 6 and failed:
            break
        assert time.monotonic() < deadline, {n: p.get("status") for n, p in ps.items()}
        time.sleep(0.1)
    msg = next(c["message"] for c in failed[0]["status"]["conditions"] if c.get("reason") == "NetworkSetupFailed")
    assert tiny in msg and "worker-1" in msg and "6 of 6" in msg, msg
    lab.lace("delete", "pods", *[f"x{i}" for i in range(7)], "-n", ns)


def test_unbound_pods_are_scheduled_and_run(lab, ns):
    lab.apply([pod(f"s{i}", ns) for i in range(3)])
    ps = lab.wait(ns, [f"s{i}" for i in range(3)])
    assert all(p["spec"]["nodeName"] in ("worker-1", "worker-2", "worker-3") for p in ps.values())


def test_cni_check_confirms_a_running_pod(lab, ns):
    from lace.lab.kubelet import sandbox_netns
    lab.apply([pod("chk", ns, "worker-2")])
    p = lab.wait(ns, ["chk"])["chk"]
    uid = p["metadata"]["uid"]
    cni = os.path.join(os.path.dirname(sys.executable), "lace-cni")
    conf = json.dumps({"cniVersion": "1.1.0", "name": "lace", "type": "lace-cni",
                       "agentSocket": os.path.join(lab.dir, "agents", "worker-2.sock")})
    env = {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": uid, "CNI_NETNS": f"/run/netns/{sandbox_netns(lab.name, uid)}",
           "CNI_IFNAME": "eth0", "CNI_ARGS": f"K8S_POD_NAMESPACE={ns};K8S_POD_NAME=chk"}
    r = subprocess.run([cni], env=env, input=conf, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    r = subprocess.run([cni], env=dict(env, CNI_CONTAINERID="not-a-container"), input=conf,
                       capture_output=True, text=True)
    assert r.returncode == 1 and json.loads(r.stdout)["code"] == 3, r.stdout


def test_cni_gc_releases_only_what_the_runtime_no_longer_knows(lab, ns):
    """CNI GC on worker-2 with every attachment the runtime knows but one pod's: that pod's
    addresses and host interface go; the other pod's, the node's host addresses and another
    node's pod stay."""
    from lace.agent.endpoints import host_ifname
    from lace.agent.model import is_host_lease, lease_container
    lab.apply([pod("kept", ns, "worker-2"), pod("forgot", ns, "worker-2"), pod("far", ns, "worker-3")])
    ps = lab.wait(ns, ["kept", "forgot", "far"])
    forgot = ps["forgot"]["metadata"]["uid"]

    def leases() -> list[dict]:
        return [x["spec"] for x in json.loads(lab.lace("get", "ipleases", "-o", "json")[1])["items"]]

    def veth(uid: str) -> bool:
        return subprocess.run(["ip", "-n", lab.node("worker-2")["netns"], "link", "show", host_ifname(uid)],
                              capture_output=True).returncode == 0

    before = leases()
    valid = sorted({lease_container(x) for x in before if x["node"] == "worker-2" and not is_host_lease(x)}
                   - {forgot})
    assert ps["kept"]["metadata"]["uid"] in valid and veth(forgot)
    cni = os.path.join(os.path.dirname(sys.executable), "lace-cni")
    conf = json.dumps({"cniVersion": "1.1.0", "name": "lace", "type": "lace-cni",
                       "agentSocket": os.path.join(lab.dir, "agents", "worker-2.sock"),
                       "cni.dev/valid-attachments": [{"containerID": c, "ifname": "eth0"} for c in valid]})
    r = subprocess.run([cni], env={"CNI_COMMAND": "GC"}, input=conf, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    after = leases()
    gone = [x for x in before if x not in after]
    assert gone and {x["pod"] for x in gone} <= {f"{ns}/forgot", f"probe/{ns}/forgot"}, gone
    assert not [x for x in after if lease_container(x) == forgot]
    assert not veth(forgot) and veth(ps["kept"]["metadata"]["uid"])
    assert {x["pod"] for x in after} >= {f"{ns}/kept", f"{ns}/far"}
    assert [x for x in before if is_host_lease(x)] == [x for x in after if is_host_lease(x)]


def test_cni_plugin_speaks_the_spec(lab):
    cni = os.path.join(os.path.dirname(sys.executable), "lace-cni")
    r = subprocess.run([cni], env={"CNI_COMMAND": "VERSION"}, capture_output=True, text=True)
    assert r.returncode == 0 and "1.1.0" in json.loads(r.stdout)["supportedVersions"]
    r = subprocess.run([cni], env={"CNI_COMMAND": "ADD"}, input="not json", capture_output=True, text=True)
    assert r.returncode == 1 and json.loads(r.stdout)["code"] == 6
    conf = json.dumps({"cniVersion": "1.1.0", "name": "lace", "type": "lace-cni",
                       "agentSocket": os.path.join(lab.dir, "agents", "worker-1.sock")})
    r = subprocess.run([cni], env={"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x", "CNI_NETNS": "/run/netns/none",
                                   "CNI_IFNAME": "eth0", "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=nope"},
                       input=conf, capture_output=True, text=True)
    err = json.loads(r.stdout)
    assert r.returncode == 1 and "default/nope" in err["msg"], err
    r = subprocess.run([cni], env={"CNI_COMMAND": "STATUS"}, input=conf, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_second_lab_coexists_and_down_leaves_nothing(lab, tmp_path):
    other = LabHandle(f"x{os.getpid() % 10000}", str(tmp_path / "state"))
    try:
        other.lace("lab", "up", "--name", other.name, "--nodes", "1")
        other.apply([pod("solo", "default", "worker-1")])
        other.wait("default", ["solo"])
        st = other.status()
        assert [n["name"] for n in st["nodes"]] == ["worker-1"] and st["nodes"][0]["agent"] == "healthy"
        assert lab.status()["nodes"][0]["agent"] == "healthy", "the first lab is unaffected"
    finally:
        other.lace("lab", "down", "--name", other.name, check=False)
    assert not leftovers(other.name), leftovers(other.name)
    rc, out, _ = other.lace("lab", "down", "--name", other.name, check=False)
    assert rc == 0, "down is safe to run twice"
    assert not leftovers(other.name)
