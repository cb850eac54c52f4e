"""Kubelet probes in the lab: startup, readiness and liveness probes drive pods of the default network
and of isolated networks; two pods with the same address and the same probe port in two networks on
one node each get their own probe (each answers its name through its probe address); a liveness
failure restarts the pod; the host reaches an isolated pod only as the kubelet and only on a probe
port, anything else is dropped as probe-denied and traced; probe-cookie shows a connection in flight
and empties when it closes; an agent SIGKILL mid-probe keeps probes passing with the maps adopted,
and a deleted pod leaves no probe entry, cookie or probe address behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from lace.lab import topology

from .conftest import ips, network, wait_for

PORT = 8080


def probed_pod(name: str, ns: str, node: str = "worker-1", net: str | None = None, *, period: int = 1,
               liveness: bool = True, failure_threshold: int = 2) -> dict:
    """A podserver on ``PORT`` (named ``http``) with a tcpSocket startup probe and httpGet /healthz
    readiness and liveness probes every ``period`` seconds."""
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": period,
             "failureThreshold": failure_threshold}
    container = {"name": "c", "image": "lace/podserver", "ports": [{"name": "http", "containerPort": PORT}],
                 "startupProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
                 "readinessProbe": probe}
    if liveness:
        container["livenessProbe"] = probe
    meta: dict = {"name": name, "namespace": ns, "labels": {"app": name}}
    if net:
        meta["annotations"] = {"lace.dev/network": net}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node, "containers": [container]}}


def condition(p: dict, kind: str = "Ready") -> str | None:
    return next((c.get("status") for c in (p.get("status") or {}).get("conditions") or () if c["type"] == kind), None)


def restarts(p: dict) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (p.get("status") or {}).get("containerStatuses") or ())



def wait_ready(lab, ns: str, names: list[str], timeout: float = 40) -> dict[str, dict]:
    def all_ready():
        ps = lab.pods(ns)
        return ps if all(condition(ps.get(n, {})) == "True" for n in names) else None
    return wait_for(all_ready, f"{names} Ready", timeout)


def probe_ip(p: dict, family: int = 4) -> str:
    return next(e["ip"] for e in p["status"]["probeIPs"] if (":" in e["ip"]) == (family == 6))


def on_host(lab, node: str, code: str, *, kubelet: bool, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """Python ``code`` in the node's host namespace: in the kubelet's cgroup (as the kubelet's
    prober) or in the node's host cgroup (another host process)."""
    netns = topology.netns_name(lab.name, node)
    group = topology.node_cgroup(lab.name, node)
    if kubelet:
        group = topology.kubelet_cgroup(group)

    def enter() -> None:
        from pyroute2.netns import setns
        setns(f"/run/netns/{netns}")
        topology.join_cgroup(group)

    return subprocess.run([sys.executable, "-c", code], preexec_fn=enter, capture_output=True, text=True,
                          timeout=timeout)


def http_get(lab, node: str, ip: str, port: int = PORT, path: str = "/", *, kubelet: bool = True
             ) -> tuple[bool, str]:
    host = f"[{ip}]" if ":" in ip else ip
    res = on_host(lab, node, (
        "import urllib.request, sys\n"
        f"r = urllib.request.urlopen('http://{host}:{port}{path}', timeout=1.5)\n"
        "sys.stdout.write(r.read().decode().strip())\n"), kubelet=kubelet)
    return res.returncode == 0, (res.stdout if res.returncode == 0 else res.stderr.strip().splitlines()[-1:] and
                                 res.stderr.strip().splitlines()[-1])


def node_json(lab, node: str, *argv: str) -> dict:
    _, out, _ = lab.lace("exec", "--node", node, "--", "node", *argv, "-o", "json")
    return json.loads(out)


def probe_entries(lab, node: str = "worker-1") -> list[dict]:
    return node_json(lab, node, "bpf", "show", "probes")["entries"]


def drops(lab, node: str, ip: str) -> list[dict]:
    rc, out, err = lab.lace("exec", "--node", node, "--", "node", "trace", "flow", "--ip", ip, "--verdict", "drop",
                            "-o", "json", check=False)
    assert rc in (0, 1), err
    return json.loads(out)["flows"] if out.strip() else []


@pytest.fixture(scope="module")
def iso(lab):
    """Two isolated networks with the same ranges (every pod of them gets the same first address on a
    node) and one of their pods each on worker-1, plus a default-network pod; all probed."""
    tag = uuid.uuid4().hex[:6]
    ns, a, b = f"pr-{tag}", f"pra-{tag}", f"prb-{tag}"
    lab.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
               network(a, "10.77.0.0/16", "fd00:77::/112"), network(b, "10.77.0.0/16", "fd00:77::/112")])
    lab.apply([probed_pod("one", ns, net=a), probed_pod("two", ns, net=b), probed_pod("dflt", ns)])
    ps = wait_ready(lab, ns, ["one", "two", "dflt"])
    yield {"ns": ns, "nets": (a, b), "pods": ps}
    lab.lace("delete", "namespace", ns, check=False)
    for n in (a, b):
        lab.lace("delete", "network", n, check=False)


def test_probes_make_pods_of_every_network_ready(lab, iso):
    ps, ns = iso["pods"], iso["ns"]
    for name in ("one", "two", "dflt"):
        p = ps[name]
        assert condition(p) == "True" and condition(p, "ContainersReady") == "True", p["status"]
        assert restarts(p) == 0
    assert "probeIPs" not in ps["dflt"]["status"] or not ps["dflt"]["status"]["probeIPs"], \
        "a default-network pod is probed at its own address"
    # the probes map: each isolated pod's probe address leads to it; the default pod at its own address
    rows = probe_entries(lab)
    for name in ("one", "two"):
        mine = [r for r in rows if r["pod"] == f"{ns}/{name}"]
        assert {r["addr"] for r in mine} == {e["ip"] for e in ps[name]["status"]["probeIPs"]}
        assert {r["port"] for r in mine if not r["marker"]} == {PORT}
        assert any(r["marker"] for r in mine), "every other port of the probe address is denied"
    v4, _ = ips(ps["dflt"])
    assert any(r["pod"] == f"{ns}/dflt" and r["addr"] == v4 and r["target_addr"] == v4 for r in rows)


def test_overlapping_pods_with_one_probe_port_each_get_their_own_probe(lab, iso):
    ps, ns = iso["pods"], iso["ns"]
    assert ips(ps["one"]) == ips(ps["two"]), "both pods hold the same addresses in their networks"
    assert ps["one"]["spec"]["nodeName"] == ps["two"]["spec"]["nodeName"] == "worker-1"
    for fam in (4, 6):
        a, b = probe_ip(ps["one"], fam), probe_ip(ps["two"], fam)
        assert a != b
        assert http_get(lab, "worker-1", a) == (True, f"{ns}/one")
        assert http_get(lab, "worker-1", b) == (True, f"{ns}/two")


def test_the_host_reaches_an_isolated_pod_only_as_the_kubelet_on_a_probe_port(lab, iso):
    ps = iso["pods"]
    ip = probe_ip(ps["one"])
    ok, out = http_get(lab, "worker-1", ip, kubelet=False)
    assert not ok, f"another host process got in: {out}"
    ok, out = http_get(lab, "worker-1", ip, 80, kubelet=True)
    assert not ok, f"a port that is no probe let the kubelet in: {out}"
    # a raw packet: a UDP datagram from the host to the probe address
    on_host(lab, "worker-1", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.sendto(b'x', ('{ip}', {PORT}))\n", kubelet=True)
    # every one of them is a named drop in the node's flow trace
    def denied():
        got = [f for f in drops(lab, "worker-1", ip) if f.get("reason") == "probe-denied"
               and f.get("point") == "from-host"]
        return got if {(f["proto"], f["dport"]) for f in got} >= {("tcp", PORT), ("tcp", 80), ("udp", PORT)} \
            else None
    seen = wait_for(denied, "probe-denied drops in the trace")
    assert {f["proto"] for f in seen} >= {"tcp", "udp"}
    # the default network keeps today's behaviour for the host: any host process, any port it serves
    v4, _ = ips(ps["dflt"])
    assert http_get(lab, "worker-1", v4, kubelet=False) == (True, f"{iso['ns']}/dflt")


def test_probe_cookie_shows_a_connection_in_flight_and_empties(lab, iso):
    ps, ns = iso["pods"], iso["ns"]
    ip = probe_ip(ps["two"])
    code = ("import socket, sys\n"
            f"s = socket.create_connection(('{ip}', {PORT}), timeout=2)\n"
            "print('open', flush=True)\n"
            "sys.stdin.readline()\n"
            "s.close()\n")
    netns = topology.netns_name(lab.name, "worker-1")
    group = topology.kubelet_cgroup(topology.node_cgroup(lab.name, "worker-1"))

    def enter() -> None:
        from pyroute2.netns import setns
        setns(f"/run/netns/{netns}")
        topology.join_cgroup(group)

    holder = subprocess.Popen([sys.executable, "-c", code], preexec_fn=enter, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        entries = node_json(lab, "worker-1", "bpf", "show", "probe-cookie")["entries"]
        mine = [e for e in entries if e["orig_addr"] == ip and e["orig_port"] == PORT]
        assert len(mine) == 1, entries
        assert mine[0]["pod"] == f"{ns}/two" and mine[0]["age_s"] < 10
    finally:
        holder.communicate("\n", timeout=10)
    wait_for(lambda: not [e for e in node_json(lab, "worker-1", "bpf", "show", "probe-cookie")["entries"]
                          if e["orig_addr"] == ip and e["orig_port"] == PORT and e["age_s"] > 1.5],
             "the closed connection's cookie to go")


def test_liveness_failure_restarts_the_pod_on_an_isolated_network(lab, iso):
    ns, (net, _) = iso["ns"], iso["nets"]
    lab.apply([probed_pod("flaky", ns, net=net, failure_threshold=1)])
    p = wait_ready(lab, ns, ["flaky"])["flaky"]
    assert restarts(p) == 0
    rc, out = lab.exec(f"{ns}/flaky", sys.executable, "-c",
                       f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{PORT}/fail').read())")
    assert rc == 0, out
    p = wait_for(lambda: (lambda q: q if restarts(q) >= 1 else None)(lab.pods(ns)["flaky"]),
                 "a restart after the liveness probe failed")
    assert restarts(p) == 1
    p = wait_ready(lab, ns, ["flaky"])["flaky"]   # the restarted server is healthy again
    assert restarts(p) == 1
    lab.lace("delete", "pod", "flaky", "-n", ns, "--force")


def test_agent_sigkill_mid_probe_keeps_probes_passing(lab, iso):
    ns = iso["ns"]
    before = sorted((r["addr"], r["port"], r["target_addr"]) for r in probe_entries(lab))
    lab.lace("lab", "restart-agent", "worker-1", "--kill")
    # through the restart window and after it, the probes of every pod keep passing
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        ps = lab.pods(ns)
        for name in ("one", "two", "dflt"):
            assert condition(ps[name]) == "True", f"{name} lost readiness across the agent restart"
            assert restarts(ps[name]) == 0
        time.sleep(0.3)
    after = sorted((r["addr"], r["port"], r["target_addr"]) for r in probe_entries(lab))
    assert after == before, "the restarted agent adopted the probes map: nothing lost, nothing duplicated"
    assert http_get(lab, "worker-1", probe_ip(iso["pods"]["one"])) == (True, f"{ns}/one")


def test_a_pod_deleted_mid_probe_leaves_nothing(lab, iso):
    ns, (net, _) = iso["ns"], iso["nets"]
    lab.apply([probed_pod("brief", ns, net=net)])
    p = wait_ready(lab, ns, ["brief"])["brief"]
    addrs = {e["ip"] for e in p["status"]["probeIPs"]}
    assert {r["addr"] for r in probe_entries(lab) if r["pod"] == f"{ns}/brief"} == addrs
    lab.lace("delete", "pod", "brief", "-n", ns, "--wait")
    assert not [r for r in probe_entries(lab) if r["addr"] in addrs], "no probe entry of the gone pod"
    wait_for(lambda: not [e for e in node_json(lab, "worker-1", "bpf", "show", "probe-cookie")["entries"]
                          if e["orig_addr"] in addrs], "no cookie of the gone pod")
    _, out, _ = lab.lace("get", "ipleases", "-o", "json")
    assert not [o for o in json.loads(out)["items"] if o["spec"]["ip"] in addrs], "its probe addresses released"


def test_readiness_takes_a_backend_out_of_its_service_and_back(lab, iso):
    """A failing readiness probe (no liveness probe: nothing restarts) turns the pod not Ready, and
    its EndpointSlice endpoint not ready; recovering brings both back."""
    ns = iso["ns"]
    lab.apply([probed_pod("backend", ns, liveness=False, failure_threshold=1),
               {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "be", "namespace": ns},
                "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80, "targetPort": "http"}]}}])
    wait_ready(lab, ns, ["backend"])

    def endpoint_ready() -> bool | None:
        _, out, _ = lab.lace("get", "endpointslices", "-n", ns, "-o", "json")
        eps = [ep for s in json.loads(out)["items"] if s["metadata"].get("labels", {}).get(
            "kubernetes.io/service-name") == "be" for ep in s["endpoints"]]
        return eps[0]["conditions"]["ready"] if eps else None

    wait_for(lambda: endpoint_ready() is True, "the ready endpoint")
    for path, want in (("/fail", False), ("/recover", True)):
        rc, out = lab.exec(f"{ns}/backend", sys.executable, "-c",
                           f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{PORT}{path}')")
        assert rc == 0, out
        wait_for(lambda: condition(lab.pods(ns)["backend"]) == ("True" if want else "False"),
                 f"Ready {want} after {path}")
        wait_for(lambda: endpoint_ready() is want, f"endpoint ready {want} after {path}")
    assert restarts(lab.pods(ns)["backend"]) == 0
    lab.lace("delete", "service", "be", "-n", ns)
    lab.lace("delete", "pod", "backend", "-n", ns, "--force")
