"""``lace connectivity test`` and ``lace sysdump`` in the lab: a run on the healthy lab passes and
leaves nothing behind (namespace, pods, networks, sandboxes), writing JUnit XML; --test selects; a
policy in a namespace the test deploys into (--namespace) that blocks UDP/53 ingress to echo-other
makes exactly the scenarios sending that traffic fail, with the drop reason and the flows shown;
a sysdump holds every node's maps, conntrack, flows, devices, agent status and metrics, the logs,
the store's objects and the lab's topology, and no secret."""

from __future__ import annotations

import json
import os
import re
import tarfile
import tempfile
import xml.etree.ElementTree as ET

from lace.cli.connectivity import scenarios as S
from lace.datapath import registry
from lace.lab.kubelet import Sandboxes

from .conftest import namespace

NODES = ("worker-1", "worker-2", "worker-3")


def _ran(out: str, word: str) -> list[str]:
    """The scenario names on the report's ``PASS``/``FAIL``/``SKIP`` lines."""
    return sorted(m.group(1) for m in re.finditer(rf"^\[[ \d.]+s\] {word}\s+(\S+)", out, re.M))


def _left(lab, ns_prefix: str) -> dict[str, list[str]]:
    _, out, _ = lab.lace("get", "namespaces", "-o", "json")
    nss = [o["metadata"]["name"] for o in json.loads(out)["items"] if o["metadata"]["name"].startswith(ns_prefix)]
    _, out, _ = lab.lace("get", "networks", "-o", "json")
    nets = [o["metadata"]["name"] for o in json.loads(out)["items"] if o["metadata"]["name"].startswith("lcx-")]
    _, out, _ = lab.lace("get", "pods", "-A", "-o", "json")
    pods = [f'{o["metadata"]["namespace"]}/{o["metadata"]["name"]}' for o in json.loads(out)["items"]
            if o["metadata"]["namespace"].startswith(ns_prefix)]
    boxes = [f'{r.get("namespace")}/{r.get("name")}' for r in Sandboxes(os.path.join(lab.dir, "kubelet")).all()
             if str(r.get("namespace", "")).startswith(ns_prefix)]
    return {k: v for k, v in (("namespaces", nss), ("networks", nets), ("pods", pods), ("sandboxes", boxes)) if v}


def test_a_healthy_lab_passes_every_scenario_and_nothing_is_left(lab):
    with tempfile.TemporaryDirectory() as d:
        junit = os.path.join(d, "report.xml")
        rc, out, err = lab.lace("connectivity", "test", "--junit", junit, check=False)
        assert rc == 0, out + err
        assert _ran(out, "PASS") == sorted(s.name for s in S.SCENARIOS), out
        assert f"{len(S.SCENARIOS)} passed, 0 failed, 0 skipped" in out
        root = ET.parse(junit).getroot()
        suite = root.find("testsuite")
        assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (str(len(S.SCENARIOS)), "0", "0")
        assert {c.get("name") for c in suite.findall("testcase")} == {s.name for s in S.SCENARIOS}
    assert not _left(lab, "lace-connectivity-"), _left(lab, "lace-connectivity-")


def test_test_selects_scenarios(lab):
    rc, out, err = lab.lace("connectivity", "test", "--test", "^policy/", "--test", "same-node/ipv4/tcp", check=False)
    assert rc == 0, out + err
    assert _ran(out, "PASS") == sorted(["policy/allow", "policy/deny", "policy/audit", "pod-to-pod/same-node/ipv4/tcp"]), out
    assert "4 passed, 0 failed, 0 skipped" in out
    rc, _, err = lab.lace("connectivity", "test", "--test", "no-such-scenario", check=False)
    assert rc == 2 and "matches no scenario" in err


def test_a_policy_blocking_one_kind_of_traffic_fails_exactly_those_scenarios(lab):
    ns = "lcx-e2e-deny"
    lab.apply([namespace(ns), {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "no-udp-53", "namespace": ns},
        # echo-other (the cross-node target) admits everything but UDP/53 (the service's UDP goes to 5353)
        "spec": {"podSelector": {"matchLabels": {"lace-connectivity": "echo-other"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 8080},
                                        {"protocol": "UDP", "port": 5353}]}]}}])
    try:
        with tempfile.TemporaryDirectory() as d:
            junit = os.path.join(d, "report.xml")
            rc, out, err = lab.lace("connectivity", "test", "--namespace", ns, "--junit", junit, check=False)
            assert rc == 1, out + err
            failed = _ran(out, "FAIL")
            assert failed == ["pod-to-pod/cross-node/ipv4/udp", "pod-to-pod/cross-node/ipv6/udp"], out
            assert "unexpected drops: policy-ingress" in out and "DROP (policy-ingress)" in out
            assert f"{len(S.SCENARIOS) - 2} passed, 2 failed" in out
            cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
            failure = cases["pod-to-pod/cross-node/ipv4/udp"].find("failure")
            assert "policy-ingress" in failure.get("message") and "DROP (policy-ingress)" in failure.text
            assert cases["pod-to-pod/cross-node/ipv4/tcp"].find("failure") is None
        # the test's objects are gone; the namespace and its policy (not the test's) stay
        pods = lab.pods(ns)
        assert not pods, pods
        _, out, _ = lab.lace("get", "networkpolicies", "-n", ns, "-o", "name")
        assert out.strip() == "networkpolicy.networking.k8s.io/no-udp-53"
        assert not _left(lab, ns).get("sandboxes") and not _left(lab, ns).get("networks")
    finally:
        lab.lace("delete", "namespace", ns, check=False)


def test_sysdump_holds_every_nodes_state_the_logs_store_and_topology_without_secrets(lab, ns):
    lab.apply([{"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "s", "namespace": ns, "annotations": {"example.com/api-token": "tok-SECRET-1"}},
                "spec": {"nodeName": "worker-1", "containers": [{
                    "name": "c", "image": "lace/podserver", "ports": [{"containerPort": 80}],
                    "env": [{"name": "DB_PASSWORD", "value": "pw-SECRET-2"}]}]}}])
    lab.wait(ns, ["s"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "dump.tar.gz")
        rc, out, err = lab.lace("sysdump", "-o", path, check=False)
        assert rc == 0, out + err
        assert "0 collection errors" in out, out
        with tarfile.open(path) as tar:
            names = set(tar.getnames())
            blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    top = "dump"
    index = json.loads(blobs[f"{top}/index.json"])
    assert index["errors"] == [] and set(index["nodes"]) == set(NODES)
    assert {f"{top}/{f['path']}" for f in index["files"]} <= names
    for node in NODES:
        for m in registry.SHOWABLE:
            doc = json.loads(blobs[f"{top}/nodes/{node}/bpf-{m}.json"])
            assert doc["map"] == m and doc["node"] == node
        ct = json.loads(blobs[f"{top}/nodes/{node}/ct.json"])
        assert ct["node"] == node and {t["table"] for t in ct["tables"]} == set(registry.CT_TABLES)
        assert "flows" in json.loads(blobs[f"{top}/nodes/{node}/flows.json"])
        assert json.loads(blobs[f"{top}/nodes/{node}/devices.json"])
        assert json.loads(blobs[f"{top}/nodes/{node}/agent-status.json"])["node"] == node
        assert b"lace_" in blobs[f"{top}/nodes/{node}/metrics.txt"]
        assert f"{top}/logs/agent-{node}.log" in names
    assert f"{top}/logs/kubelet.log" in names
    assert json.loads(blobs[f"{top}/lab/lab.json"])["name"] == lab.name
    assert "kubelet" in json.loads(blobs[f"{top}/lab/procs.json"])
    assert json.loads(blobs[f"{top}/lab/status.json"])["name"] == lab.name
    pods = json.loads(blobs[f"{top}/store/pods.json"])["items"]
    assert any(p["metadata"]["name"] == "s" and p["metadata"]["namespace"] == ns for p in pods)
    for kind in ("namespaces", "nodes", "networks", "services", "networkpolicies", "endpointslices", "ipleases"):
        assert f"{top}/store/{kind}.json" in names
    assert not any("secret" in n.lower() for n in names)
    everything = b"".join(blobs.values())
    assert b"tok-SECRET-1" not in everything and b"pw-SECRET-2" not in everything
