"""Traffic through Services in the lab: ClusterIPs of both families over TCP and UDP from pods on
every node, spread over the backends, ClientIP affinity, the same VIP in two networks, a service
of another network out of reach, no backend answered with a reset and a named drop, a kept
connection surviving the loss of other backends, Maglev keeping flows where they were, and
NetworkPolicy applied to the backend after translation."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter

from .conftest import NETCHECK, ips, network, pod, wait_for
from .test_nodestate import node_json

NODES = ("worker-1", "worker-2", "worker-3")


def service(name: str, ns: str, selector: dict, *, network_name: str | None = None, **spec) -> dict:
    meta: dict = {"name": name, "namespace": ns}
    if network_name:
        meta["annotations"] = {"lace.dev/network": network_name}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"selector": selector, "ipFamilyPolicy": "PreferDualStack",
                     "ports": [{"name": "http", "port": 80, "targetPort": 80},
                               {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}], **spec}}


def vips(lab, ns: str, name: str) -> list[str]:
    _, out, _ = lab.lace("get", "services", name, "-n", ns, "-o", "json")
    return json.loads(out)["spec"]["clusterIPs"]


def programmed(lab, vip: str, active: int, nodes=NODES, frontends: int = 1) -> None:
    """Wait until every node's services map has ``frontends`` frontends at the VIP (one per source
    network) with ``active`` active backends."""
    def ready() -> bool:
        for node in nodes:
            doc = node_json(lab, node, "bpf", "show", "services", "-n")
            if sum(e["addr"] == vip and e["port"] == 80 and e["active_count"] == active
                   for e in doc["entries"]) < frontends:
                return False
        return True
    wait_for(ready, f"{vip} programmed with {active} active backends on {', '.join(nodes)}", timeout=30)


def incremental_passes(lab) -> dict[str, float]:
    """Per node, how many incremental service passes its agent ran (lace.agent.servicesync)."""
    _, out, _ = lab.lace("metrics", "-o", "json")
    family = "lace_agent_service_sync_duration_seconds"
    return {node: next(s["value"] for s in doc[family]["samples"] if s["name"] == f"{family}_count")
            for node, doc in json.loads(out)["nodes"].items()}


def answers(lab, client: str, vip: str, count: int, sport: int | None = None) -> list[str]:
    argv = [*NETCHECK, "tcp", vip, "80", "--count", str(count)]
    if sport:
        argv += ["--sport", str(sport)]
    rc, out = lab.exec(client, *argv)
    assert rc == 0, f"{client} -> {vip}: {out}"
    return out.split()


def test_clusterip_spreads_over_backends_from_every_node_in_both_families(lab, ns):
    lab.apply([pod(f"web{i}", ns, n, labels={"app": "web"}) for i, n in enumerate(NODES)] +
              [pod(f"cli{i}", ns, n, labels={"app": "cli"}) for i, n in enumerate(NODES)])
    lab.wait(ns, [f"web{i}" for i in range(3)] + [f"cli{i}" for i in range(3)])
    lab.apply([service("web", ns, {"app": "web"})])
    v4, v6 = vips(lab, ns, "web")
    for vip in (v4, v6):
        programmed(lab, vip, 3)
    backends = {f"{ns}/web{i}" for i in range(3)}
    for i in range(3):
        for vip in (v4, v6):
            seen = Counter(answers(lab, f"{ns}/cli{i}", vip, 24))
            assert set(seen) <= backends and len(seen) >= 2, f"cli{i} -> {vip}: {seen}"
            ok, out = lab.check(f"{ns}/cli{i}", "udp", vip, 53)
            assert ok, f"UDP through {vip} from cli{i}: {out}"
    # the translation is in conntrack with the frontend it came from
    text = json.dumps(node_json(lab, "worker-1", "ct", "list", "all", "-n"))
    assert v4 in text and v6 in text


def test_client_ip_affinity_keeps_a_client_on_one_backend(lab, ns):
    lab.apply([pod(f"aff{i}", ns, n, labels={"app": "aff"}) for i, n in enumerate(NODES)] +
              [pod("sticky", ns, "worker-1")])
    lab.wait(ns, ["aff0", "aff1", "aff2", "sticky"])
    lab.apply([service("aff", ns, {"app": "aff"}, sessionAffinity="ClientIP",
                       sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}})])
    v4 = vips(lab, ns, "aff")[0]
    programmed(lab, v4, 3)
    order = answers(lab, f"{ns}/sticky", v4, 12)
    assert len(set(order)) == 1, (f"ClientIP affinity: one backend for one client, got {order}; "
                                  f"worker-1's backends: {node_json(lab, 'worker-1', 'bpf', 'show', 'services', '-n')}")


def test_same_vip_in_two_networks_reaches_each_networks_backends(lab, ns):
    red, blue = f"r{ns[-6:]}", f"b{ns[-6:]}"
    lab.apply([network(red, "10.61.0.0/16", "fd61::/64"), network(blue, "10.62.0.0/16", "fd62::/64")])
    lab.apply([pod("rweb", ns, "worker-2", red, labels={"app": "rweb"}),
               pod("bweb", ns, "worker-3", blue, labels={"app": "bweb"}),
               pod("rcli", ns, "worker-1", red), pod("bcli", ns, "worker-1", blue),
               pod("dcli", ns, "worker-1")])
    lab.wait(ns, ["rweb", "bweb", "rcli", "bcli", "dcli"])
    vip = "10.96.200.7"
    lab.apply([service("same", ns, {"app": "rweb"}, network_name=red, clusterIP=vip, clusterIPs=[vip],
                       ipFamilyPolicy="SingleStack"),
               {**service("same2", ns, {"app": "bweb"}, network_name=blue, clusterIP=vip, clusterIPs=[vip],
                          ipFamilyPolicy="SingleStack")}])
    programmed(lab, vip, 1, frontends=2)   # in red and in blue
    assert answers(lab, f"{ns}/rcli", vip, 3) == [f"{ns}/rweb"] * 3
    assert answers(lab, f"{ns}/bcli", vip, 3) == [f"{ns}/bweb"] * 3
    # the default network has no such service: the VIP does not exist there
    ok, out = lab.check(f"{ns}/dcli", "tcp", vip, 80)
    assert not ok, f"a service of another network answered the default network: {out}"
    flows = node_json(lab, "worker-1", "trace", "flow", "--last", "300", "--verdict", "drop", "--ip", vip)
    assert any(f["reason"] == "no-route" for f in flows["flows"]), flows


def test_no_backend_is_refused_with_a_named_drop(lab, ns):
    lab.apply([pod("lonely", ns, "worker-2")])
    lab.wait(ns, ["lonely"])
    passes = incremental_passes(lab)
    lab.apply([service("empty", ns, {"app": "nobody"})])
    v4, v6 = vips(lab, ns, "empty")
    for vip in (v4, v6):
        programmed(lab, vip, 0, nodes=("worker-2",))
        t0 = time.monotonic()
        ok, out = lab.check(f"{ns}/lonely", "tcp", vip, 80, timeout=3)
        assert not ok and "refused" in out.lower(), f"a reset, not a timeout: {out}"
        assert time.monotonic() - t0 < 2.5
    flows = node_json(lab, "worker-2", "trace", "flow", "--last", "300", "--verdict", "drop")
    assert any(f["reason"] == "service-no-backend" for f in flows["flows"]), flows
    # only a Service (and its empty slices) changed: the agents programmed it by an incremental pass
    # (a full pass that happened to run meanwhile may take some of it, but not on every node)
    now = incremental_passes(lab)
    assert any(now[n] > passes[n] for n in now), (passes, now)


def test_kept_connection_survives_backend_scale_down_and_maglev_keeps_flows(lab, ns):
    lab.apply([pod(f"mg{i}", ns, NODES[i % 3], labels={"app": "mg"}) for i in range(4)] +
              [pod("holder", ns, "worker-1")])
    lab.wait(ns, [f"mg{i}" for i in range(4)] + ["holder"])
    lab.apply([service("mg", ns, {"app": "mg"})])
    v4 = vips(lab, ns, "mg")[0]
    programmed(lab, v4, 4)
    before = answers(lab, f"{ns}/holder", v4, 40, sport=41000)
    assert len(set(before)) >= 3, before
    result: dict = {}

    def stream() -> None:
        result["rc"], result["out"] = lab.exec(f"{ns}/holder", *NETCHECK, "hold", v4, "80", "4")

    t = threading.Thread(target=stream)
    t.start()
    # the held connection's backend, from its frontend entry in conntrack on the client's node
    holder4 = ips(lab.pods(ns)["holder"])[0]

    def held_backend() -> str | None:
        doc = node_json(lab, "worker-1", "ct", "list", "ct-tcp-v4", "-n")
        for e in doc["entries"]:
            if ("service" in e["flags"] and e["saddr"] == holder4 and e["daddr"] == v4
                    and e["state"] == "established"):
                return e["nat_addr"]
        return None

    backend = wait_for(held_backend, "the held connection in conntrack")
    by_ip = {ips(p)[0]: name for name, p in lab.pods(ns).items()}
    victim = next(f"mg{i}" for i in range(4) if by_ip.get(backend) != f"mg{i}")
    # a backend that is not the held connection's goes away while it runs
    lab.lace("delete", "pod", victim, "-n", ns, "--grace-period", "0")
    t.join(timeout=30)
    assert result.get("rc") == 0, f"the kept connection broke when another backend left: {result}"
    programmed(lab, v4, 3)
    after = answers(lab, f"{ns}/holder", v4, 40, sport=41000)
    gone = f"{ns}/{victim}"
    kept = [(b, a) for b, a in zip(before, after) if b != gone]
    moved = [(b, a) for b, a in kept if b != a]
    assert all(a != gone for a in after)
    assert len(moved) <= len(kept) // 10, f"Maglev moved {len(moved)} of {len(kept)} flows of kept backends"


def test_policy_applies_to_the_backend_after_translation(lab, ns):
    lab.apply([pod("guarded", ns, "worker-3", labels={"app": "guarded"}),
               pod("friend", ns, "worker-1", labels={"role": "friend"}),
               pod("stranger", ns, "worker-1", labels={"role": "stranger"})])
    lab.wait(ns, ["guarded", "friend", "stranger"])
    lab.apply([service("guarded", ns, {"app": "guarded"}),
               {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "only-friends", "namespace": ns},
                "spec": {"podSelector": {"matchLabels": {"app": "guarded"}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}],
                                      "ports": [{"port": 80}]}]}}])
    v4 = vips(lab, ns, "guarded")[0]
    programmed(lab, v4, 1)
    assert answers(lab, f"{ns}/friend", v4, 1) == [f"{ns}/guarded"]
    ok, out = lab.check(f"{ns}/stranger", "tcp", v4, 80)
    assert not ok, f"policy must hold after DNAT: {out}"
    guarded4 = ips(lab.pods(ns)["guarded"])[0]
    flows = node_json(lab, "worker-3", "trace", "flow", "--last", "300", "--verdict", "drop", "--ip", guarded4)
    assert any(f["reason"] == "policy-ingress" for f in flows["flows"]), flows


def test_agent_sigkill_keeps_a_stream_through_a_service(lab, ns):
    lab.apply([pod("far", ns, "worker-2", labels={"app": "far"}), pod("near", ns, "worker-1")])
    lab.wait(ns, ["far", "near"])
    lab.apply([service("far", ns, {"app": "far"})])
    v4 = vips(lab, ns, "far")[0]
    programmed(lab, v4, 1, nodes=("worker-1",))
    before = node_json(lab, "worker-1", "bpf", "show", "services", "-n")["entries"]
    result: dict = {}

    def stream() -> None:
        result["rc"], result["out"] = lab.exec(f"{ns}/near", *NETCHECK, "hold", v4, "80", "4")

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(1.0)   # the stream runs through the VIP: crash the agent of the client's node
    old_pid = lab.node("worker-1")["agentPid"]
    lab.lace("lab", "restart-agent", "worker-1", "--kill")
    t.join(timeout=30)
    assert result.get("rc") == 0 and f"answered by {ns}/far" in result["out"], f"the stream broke: {result}"
    assert lab.node("worker-1")["agentPid"] not in (None, old_pid)
    after = node_json(lab, "worker-1", "bpf", "show", "services", "-n")["entries"]
    key = lambda e: (e["network"], e["addr"], e["port"], e["proto"])   # noqa: E731
    assert sorted(map(key, after)) == sorted(map(key, before)), "the restarted agent adopted the services"
    assert answers(lab, f"{ns}/near", v4, 2) == [f"{ns}/far"] * 2


#: in a client pod: a keep-alive HTTP connection straight to BACKEND:80, then a connection to
#: VIP:80 from the same source port (SO_REUSEADDR on both: the kernel keeps only its own tuples
#: apart), then the first connection asked again; prints what happened as JSON
COLLIDE = """
import http.client, json, socket, sys, time
backend, vip = sys.argv[1], sys.argv[2]
fam = socket.AF_INET6 if ":" in backend else socket.AF_INET

def bound(port):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    return s

def ask(host, s):
    conn = http.client.HTTPConnection(host, 80, timeout=5)
    conn.sock = s
    conn.request("GET", "/")
    return conn.getresponse().read().decode().strip()

d = bound(0)
d.settimeout(5)
d.connect((backend, 80))
port = d.getsockname()[1]
first = ask(backend, d)
v = bound(port)
v.settimeout(10)
t0 = time.monotonic()
try:
    v.connect((vip, 80))
    via, error = ask(vip, v), None
except OSError as e:
    via, error = None, type(e).__name__
took = time.monotonic() - t0
print(json.dumps({"port": port, "first": first, "via": via, "error": error, "took": took,
                  "after": [ask(backend, d) for _ in range(3)]}))
"""


def test_a_vip_connection_from_the_port_of_a_live_direct_one_leaves_it_alone(lab, ns):
    """A pod holds a connection straight to a Service's only backend and opens one to the VIP from
    the same source port: at the backend the two would be one tuple. The live connection goes on
    answering; the new one is refused (a reset from the VIP after its SYN comes again, named
    tuple-in-use), not left hanging, in both families."""
    lab.apply([pod("solo", ns, "worker-2", labels={"app": "solo"}), pod("both-ways", ns, "worker-1")])
    pods = lab.wait(ns, ["solo", "both-ways"])
    lab.apply([service("solo", ns, {"app": "solo"})])
    for backend, vip in zip(ips(pods["solo"]), vips(lab, ns, "solo")):
        programmed(lab, vip, 1, nodes=("worker-1",))
        rc, out = lab.exec(f"{ns}/both-ways", sys.executable, "-c", COLLIDE, backend, vip)
        assert rc == 0, out
        doc = json.loads(out.strip().splitlines()[-1])
        assert doc["first"] == doc["after"][0] == doc["after"][-1] == f"{ns}/solo", doc
        assert doc["via"] is None and doc["error"] == "ConnectionRefusedError" and doc["took"] < 5, doc
    flows = node_json(lab, "worker-1", "trace", "flow", "--last", "300", "--verdict", "drop")
    assert any(f["reason"] == "tuple-in-use" for f in flows["flows"]), flows
