"""``lace endpoint list`` / ``get`` against the shared lab: pods on two nodes and an isolated network,
one policy selecting one pod for ingress; each pod shown once with its node, network, addresses,
enforcement, policy and state; a pod whose readiness probe fails is not-ready with the reason; an
entry changed behind the agent's back is regenerating, naming what differs; nodes that do not
answer in time are named, the store's facts still shown (exit 1); bad input is exit 2 with a hint."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

from lace.datapath import registry
from lace.datapath.endpoint import ENDPOINT
from lace.datapath.node import PinnedMaps

from .conftest import ips, network, pod, wait_for

PORT = 8080


def flaky_pod(name: str, ns: str, node: str) -> dict:
    probe = {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 1, "failureThreshold": 1}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "lace/podserver",
                                                       "ports": [{"containerPort": PORT}], "readinessProbe": probe}]}}



@pytest.fixture(scope="module")
def scene(lab):
    ns = f"ep-{uuid.uuid4().hex[:6]}"
    net = f"episo{uuid.uuid4().hex[:4]}"
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "web-from-client", "namespace": ns},
              "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                    "ports": [{"port": 80}]}]}}
    lab.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
               network(net, "10.77.0.0/16", "fd77::/64"),
               pod("web", ns, "worker-1"), pod("client", ns, "worker-2"),
               pod("iso", ns, "worker-2", network=net), flaky_pod("flaky", ns, "worker-1"), policy])
    ps = lab.wait(ns, ["web", "client", "iso", "flaky"])
    yield {"ns": ns, "net": net, "pods": ps}
    lab.lace("delete", "namespace", ns, check=False)
    for name in ("web", "client", "iso", "flaky"):
        lab.wait_gone(ns, name)
    lab.lace("delete", "network", net, check=False)


def endpoints(lab, ns: str, *extra: str) -> tuple[int, dict]:
    rc, out, err = lab.lace("endpoint", "list", "-n", ns, "-o", "json", *extra, check=False)
    return rc, json.loads(out)


def by_pod(doc: dict) -> dict[str, dict]:
    return {r["pod"]: r for r in doc["endpoints"]}


def test_list_shows_each_pod_once_with_node_network_ips_enforcement_policy(lab, scene):
    ns, net = scene["ns"], scene["net"]

    def all_ready():
        rc, doc = endpoints(lab, ns)
        rows = by_pod(doc)
        return (rc, doc) if rows and all(r["state"] == "ready" for r in rows.values()) else None
    rc, doc = wait_for(all_ready, "every endpoint ready")
    assert rc == 0 and doc["unanswered"] == {}
    assert [r["pod"] for r in doc["endpoints"]] == [f"{ns}/client", f"{ns}/flaky", f"{ns}/iso", f"{ns}/web"]
    rows = by_pod(doc)
    want = {"web": ("worker-1", "default"), "client": ("worker-2", "default"), "iso": ("worker-2", net),
            "flaky": ("worker-1", "default")}
    pods = lab.pods(ns)
    for name, (node, network_name) in want.items():
        r = rows[f"{ns}/{name}"]
        assert (r["node"], r["network"]) == (node, network_name), r
        assert (r["ipv4"], r["ipv6"]) == ips(pods[name]), r
        assert isinstance(r["endpoint_id"], int) and r["veth"].startswith("lx")
        assert r["segment"]["labels"] == {"app": name} and r["segment"]["namespace"] == ns
    assert rows[f"{ns}/web"]["enforcement"] == {"ingress": "enabled", "egress": "disabled"}
    assert rows[f"{ns}/web"]["policies"] == {"ingress": [f"{ns}/web-from-client"], "egress": []}
    for name in ("client", "iso", "flaky"):
        assert rows[f"{ns}/{name}"]["enforcement"] == {"ingress": "disabled", "egress": "disabled"}
        assert rows[f"{ns}/{name}"]["policies"] == {"ingress": [], "egress": []}
    # the endpoint ID is the veth's ifindex on its node, as the node's own listing says
    rc, out, _ = lab.lace("exec", "--node", "worker-1", "--", "node", "endpoint", "list", "-o", "json")
    node_doc = {e["ifname"]: e for e in json.loads(out)["endpoints"]}
    web = rows[f"{ns}/web"]
    assert node_doc[web["veth"]]["ifindex"] == web["endpoint_id"] and node_doc[web["veth"]]["pod"] == f"{ns}/web"
    assert node_doc[web["veth"]]["problems"] == [] and node_doc[web["veth"]]["program_attached"]

    # the table and -o wide
    _, out, _ = lab.lace("endpoint", "list", "-n", ns, "-o", "wide")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ENDPOINT", "ID", "POD"] and "POLICIES" in lines[0] and "VETH" in lines[0]
    web_line = next(ln for ln in lines if f"{ns}/web " in ln).split()
    assert web_line[:4] == [str(web["endpoint_id"]), f"{ns}/web", "worker-1", "default"]
    assert "enabled" in web_line and f"{ns}/web-from-client" in web_line and web["veth"] in web_line

    # -A lists them too, among the rest of the cluster
    rc, out, _ = lab.lace("endpoint", "list", "-A", "-o", "json", check=False)
    assert rc == 0
    assert sum(1 for r in json.loads(out)["endpoints"] if r["namespace"] == ns) == 4


def test_failing_readiness_probe_is_not_ready_with_reason(lab, scene):
    ns = scene["ns"]
    rc, out = lab.exec(f"{ns}/flaky", sys.executable, "-c",
                       f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{PORT}/fail')")
    assert rc == 0, out
    try:
        def not_ready():
            _, doc = endpoints(lab, ns)
            r = by_pod(doc)[f"{ns}/flaky"]
            return r if r["state"] == "not-ready" else None
        r = wait_for(not_ready, "flaky not-ready")
        assert "readiness probe httpGet :8080/healthz of container c failing" in r["reason"], r
        assert r["ready"] is False and r["phase"] == "Running"
        _, out, _ = lab.lace("endpoint", "get", f"{ns}/flaky")
        assert "State:" in out and "not-ready: pod not Ready: readiness probe httpGet :8080/healthz" in out
    finally:
        lab.exec(f"{ns}/flaky", sys.executable, "-c",
                 f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{PORT}/recover')")


def test_get_one_pod(lab, scene):
    ns = scene["ns"]
    rc, out, err = lab.lace("endpoint", "get", f"{ns}/web")
    kv = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln and not ln[0].isspace()}
    assert kv["Pod"] == f"{ns}/web" and kv["Node"] == "worker-1" and kv["State"] == "ready"
    assert kv["Ingress"] == f"enabled ({ns}/web-from-client)" and kv["Egress"] == "disabled"
    assert kv["Policies"].startswith(f"{ns}/web-from-client: 1 ingress rule;")
    assert kv["Program"].startswith("tcx-ingress lace_from_pod")
    _, out, _ = lab.lace("endpoint", "get", "web", "-n", ns, "-o", "json")
    doc = json.loads(out)
    assert doc["pod"] == f"{ns}/web" and doc["node_endpoint"]["ifindex"] == doc["endpoint_id"]
    assert doc["policy_details"][0]["rules"] == {"ingress": 1}


def test_changed_veth_entry_is_regenerating(lab, scene):
    ns = scene["ns"]
    _, doc = endpoints(lab, ns)
    web = by_pod(doc)[f"{ns}/web"]
    pm = PinnedMaps(lab.node("worker-1")["pinRoot"], "worker-1")
    vmap = registry.get("veth")
    with pm.open("veth") as m:
        key = next(k for k, _ in m.entries() if vmap.key_dict(k)["ifindex"] == web["endpoint_id"])
        original = m.lookup(key)
        for _ in range(3):   # the agent's periodic resync may repair it first: then once more
            val = ENDPOINT.unpack(original)
            val["segment"] = 4242
            m.update(key, ENDPOINT.pack(**val))
            _, doc = endpoints(lab, ns)
            r = by_pod(doc)[f"{ns}/web"]
            if r["state"] != "ready":
                break
        try:
            assert r["state"] == "regenerating", r
            assert r["problems"] == [f'veth map: segment 4242 (unknown to the store), expected '
                                     f'{web["segment"]["id"]} app=web'], r
        finally:
            if m.lookup(key) != original:
                m.update(key, original)


def test_bad_input_is_exit_2_with_a_hint(lab, scene):
    ns = scene["ns"]
    for argv, msg in ((["endpoint", "get", f"{ns}/nope"], f'no pod "nope" in namespace {ns}'),
                      (["endpoint", "get", "nope-ns/web"], 'no namespace "nope-ns"'),
                      (["endpoint", "get", "web"], '"web" is not NS/POD'),
                      (["endpoint", "get", "a/b/c"], '"a/b/c" is not NS/POD'),
                      (["endpoint", "list", "-n", "nope-ns"], 'no namespace "nope-ns"')):
        rc, out, err = lab.lace(*argv, check=False)
        assert rc == 2, (argv, out, err)
        lines = err.splitlines()
        assert lines[0] == f"error: {msg}" and lines[1].startswith("hint: ") and len(lines) == 2, err
        assert "Traceback" not in err


def test_nodes_that_do_not_answer_are_named_and_the_rest_shown(lab, scene):
    """No node can run its command within a millisecond: both are named, every pod is still listed
    with the store's facts and state unknown, exit 1."""
    ns = scene["ns"]
    rc, doc = endpoints(lab, ns, "--timeout", "0.001")
    assert rc == 1
    assert sorted(doc["unanswered"]) == ["worker-1", "worker-2"]
    assert doc["unanswered"]["worker-1"]["error"] == "no answer within 0.001s"
    rows = by_pod(doc)
    assert len(rows) == 4
    for r in rows.values():
        assert r["state"] == "unknown" and r["reason"] == f'node {r["node"]} did not answer: no answer within 0.001s'
        assert r["ipv4"] and r["endpoint_id"] is None
    rc, out, err = lab.lace("endpoint", "list", "-n", ns, "--timeout", "0.001", check=False)
    assert rc == 1 and "node worker-1 did not answer: no answer within 0.001s" in err
    assert f"{ns}/web" in out and "unknown: node worker-1 did not answer" in out
