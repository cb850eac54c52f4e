"""lace endpoint list/get: the store's expectations, the merge with the nodes' answers and each
endpoint's state, from fake inputs; and node endpoint list's per-endpoint documents."""

from __future__ import annotations

import argparse
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest

from lace.cli.commands import endpoint as E
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.node import endpoint as NE
from lace.cli.node.resolve import NumericResolver
from lace.cli.status import ExitStatus
from lace.store import NotFound

# ---- a fake store ------------------------------------------------------------------------------------


class FakeStore:
    def __init__(self, objects: dict[str, list[dict]]) -> None:
        self.objects = objects

    def list(self, kind: str, namespace: str | None = None, selector: Any = None) -> SimpleNamespace:
        items = [o for o in self.objects.get(kind, [])
                 if namespace is None or o["metadata"].get("namespace") == namespace]
        return SimpleNamespace(items=items, resource_version="1")

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        for o in self.list(kind, namespace).items:
            if o["metadata"]["name"] == name:
                return o
        raise NotFound(f"{kind} {name} not found")

    def close(self) -> None:
        pass


def pod(name: str, node: str, labels: dict, network: str | None = None, ready: bool = True,
        phase: str = "Running", probe: dict | None = None, conditions: list | None = None,
        container_status: dict | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": labels}
    if network:
        meta["annotations"] = {"lace.dev/network": network}
    c: dict[str, Any] = {"name": "c", "image": "lace/podserver"}
    if probe:
        c["readinessProbe"] = probe
    st: dict[str, Any] = {"phase": phase, "conditions": conditions if conditions is not None else [
        {"type": "Ready", "status": "True" if ready else "False",
         **({} if ready else {"reason": "ContainersNotReady", "message": "containers with unready status: [c]"})}]}
    if container_status is not None:
        st["containerStatuses"] = [container_status]
    return {"kind": "Pod", "metadata": meta, "spec": {"nodeName": node, "containers": [c]}, "status": st}


def lease(pod_key: str, ip: str, node: str, network: str = "default", ifname: str | None = None,
          mac: str | None = None, cid: str = "c1") -> dict:
    ann = {}
    if ifname:
        ann["lace.dev/host-ifname"] = ifname
    if mac:
        ann["lace.dev/mac"] = mac
    return {"metadata": {"name": f"{network}-{ip}", "annotations": ann},
            "spec": {"network": network, "ip": ip, "node": node, "pod": pod_key, "containerID": cid}}


def segment(sid: int, labels: dict, network: str = "default") -> dict:
    return {"metadata": {"name": f"seg-{sid}"}, "spec": {"network": network, "namespace": "ns", "labels": labels},
            "status": {"id": sid}}


def cluster(**extra_pods: dict) -> FakeStore:
    pods = [pod("web", "worker-1", {"app": "web"}), pod("client", "worker-2", {"app": "client"}),
            pod("iso", "worker-2", {"app": "iso"}, network="iso")]
    pods += list(extra_pods.values())
    return FakeStore({
        "namespaces": [{"metadata": {"name": "ns", "labels": {}}}, {"metadata": {"name": "default"}}],
        "networks": [{"metadata": {"name": "default"}, "status": {"id": 1}},
                     {"metadata": {"name": "iso"}, "status": {"id": 2}}],
        "segments": [segment(300, {"app": "web"}), segment(301, {"app": "client"}),
                     segment(302, {"app": "iso"}, "iso"), segment(303, {"app": "flaky"})],
        "pods": pods,
        "ipleases": [
            lease("ns/web", "10.244.0.2", "worker-1", ifname="lxaaaaaaaaaa", mac="02:00:00:00:00:01"),
            lease("ns/web", "fd00:10:244::2", "worker-1", ifname="lxaaaaaaaaaa", mac="02:00:00:00:00:01"),
            lease("ns/client", "10.244.1.2", "worker-2", ifname="lxbbbbbbbbbb"),
            lease("ns/iso", "10.10.0.1", "worker-2", network="iso", ifname="lxcccccccccc", cid="c3"),
            lease("ns/iso", "10.244.1.3", "worker-2", cid="lace:probe:c3"),      # its probe address
            {"metadata": {"name": "host"}, "spec": {"network": "default", "ip": "10.244.0.1", "node": "worker-1",
                                                    "pod": "node/worker-1", "containerID": "lace:host"}},
        ],
        "networkpolicies": [{"metadata": {"name": "web-in", "namespace": "ns"}, "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 80}]}]}}],
    })


def node_ep(ifindex: int, ifname: str, network: int, seg: int, ipv4: str | None, ipv6: str | None = None,
            program: bool = True, mac: str = "02:00:00:00:00:01") -> dict:
    delivery = [{"network": network, "prefix": f"{ip}/{32 if ':' not in ip else 128}", "ifindex": ifindex}
                for ip in (ipv4, ipv6) if ip]
    return {"endpoint_id": ifindex, "ifindex": ifindex, "ifname": ifname, "link_state": "up",
            "veth": {"endpoint_id": ifindex, "network": network, "segment": seg, "mac": mac, "ipv4": ipv4,
                     "ipv6": ipv6},
            "delivery": delivery, "programs": [{"hook": "tcx-ingress", "name": "lace_from_pod", "id": 9}]
            if program else [], "program_attached": program, "problems": []}


def answers(w1: list[dict] | None = None, w2: list[dict] | None = None) -> dict[str, E.NodeAnswer]:
    return {"worker-1": E.NodeAnswer("worker-1", {"endpoints": w1 if w1 is not None else [
                node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", "fd00:10:244::2")]}),
            "worker-2": E.NodeAnswer("worker-2", {"endpoints": w2 if w2 is not None else [
                node_ep(6, "lxbbbbbbbbbb", 1, 301, "10.244.1.2", mac="x"),
                node_ep(7, "lxcccccccccc", 2, 302, "10.10.0.1", mac="x")]})}


def expected(store: FakeStore) -> dict[str, E.Expected]:
    return {e.key: e for e in E.expected_endpoints(store, store.list("pods").items)}


# ---- the store's side ------------------------------------------------------------------------------------

def test_expected_from_store() -> None:
    ex = expected(cluster())
    web, client, iso = ex["ns/web"], ex["ns/client"], ex["ns/iso"]
    assert (web.node, web.network, web.network_id, web.segment_id) == ("worker-1", "default", 1, 300)
    assert (web.ipv4, web.ipv6, web.ifname, web.mac) == ("10.244.0.2", "fd00:10:244::2", "lxaaaaaaaaaa",
                                                         "02:00:00:00:00:01")
    assert web.enforcement == {"ingress": "enabled", "egress": "disabled"}
    assert web.policies == {"ingress": ["ns/web-in"], "egress": []}
    assert web.policy_details[0]["rules"] == {"ingress": 1} and web.policy_details[0]["map_entries"] >= 1
    assert client.enforcement == {"ingress": "disabled", "egress": "disabled"} and client.policies["ingress"] == []
    # the probe lease (probe/ pseudo-pod containers) is not one of iso's own addresses
    assert (iso.network, iso.network_id, iso.ipv4, iso.ipv6) == ("iso", 2, "10.10.0.1", None)


# ---- states ------------------------------------------------------------------------------------------------

def rows_by_pod(rows: list[dict]) -> dict[str, dict]:
    return {r["pod"]: r for r in rows}


def test_all_ready() -> None:
    rows = rows_by_pod(E.merge(list(expected(cluster()).values()), answers()))
    assert {k: r["state"] for k, r in rows.items()} == {"ns/web": "ready", "ns/client": "ready", "ns/iso": "ready"}
    assert rows["ns/web"]["endpoint_id"] == 5 and rows["ns/iso"]["endpoint_id"] == 7
    assert rows["ns/web"]["segment"] == {"id": 300, "namespace": "ns", "network": "default", "labels": {"app": "web"}}


def test_readiness_probe_failing() -> None:
    flaky = pod("flaky", "worker-1", {"app": "flaky"}, ready=False,
                probe={"httpGet": {"path": "/healthz", "port": 8080}},
                container_status={"name": "c", "ready": False, "state": {"running": {}}})
    store = cluster(flaky=flaky)
    store.objects["ipleases"].append(lease("ns/flaky", "10.244.0.3", "worker-1", ifname="lxdddddddddd", cid="c4"))
    eps = [node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", "fd00:10:244::2"),
           node_ep(8, "lxdddddddddd", 1, 303, "10.244.0.3", mac="x")]
    row = rows_by_pod(E.merge(list(expected(store).values()), answers(w1=eps)))["ns/flaky"]
    assert row["state"] == "not-ready"
    assert "readiness probe httpGet :8080/healthz of container c failing" in row["reason"]
    assert "ContainersNotReady" in row["reason"]


def test_pending_with_condition_reason() -> None:
    p = pod("stuck", "worker-1", {"app": "stuck"}, phase="Pending", conditions=[
        {"type": "Ready", "status": "False", "reason": "NetworkSetupFailed", "message": "CNI ADD failed: boom"}])
    row = rows_by_pod(E.merge(list(expected(cluster(stuck=p)).values()), answers()))["ns/stuck"]
    assert row["state"] == "not-ready"
    assert row["reason"] == "Pending (NetworkSetupFailed: CNI ADD failed: boom)"
    assert row["endpoint_id"] is None


@pytest.mark.parametrize("w1,what", [
    ([], "no interface lxaaaaaaaaaa on worker-1"),
    ([{**node_ep(5, "lxaaaaaaaaaa", 1, 300, None), "veth": None, "delivery": []}],
     "veth map: no entry for lxaaaaaaaaaa (ifindex 5)"),
    ([node_ep(5, "lxaaaaaaaaaa", 1, 999, "10.244.0.2", "fd00:10:244::2")],
     "veth map: segment 999 (unknown to the store), expected 300 app=web"),
    ([node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", None)], "veth map: ipv6 none, expected fd00:10:244::2"),
    ([{**node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", "fd00:10:244::2"), "delivery": []}],
     "delivery: no local entry for 10.244.0.2 to lxaaaaaaaaaa"),
    ([node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", "fd00:10:244::2", mac="02:00:00:00:00:99")],
     "veth map: mac 02:00:00:00:00:99, expected 02:00:00:00:00:01"),
])
def test_regenerating_names_what_differs(w1: list[dict], what: str) -> None:
    row = rows_by_pod(E.merge(list(expected(cluster()).values()), answers(w1=w1)))["ns/web"]
    assert row["state"] == "regenerating"
    assert row["problems"][0] == what and row["reason"].startswith(what)


def test_program_missing_is_not_ready() -> None:
    w1 = [node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", "fd00:10:244::2", program=False)]
    row = rows_by_pod(E.merge(list(expected(cluster()).values()), answers(w1=w1)))["ns/web"]
    assert (row["state"], row["reason"]) == ("not-ready", "no lace program on lxaaaaaaaaaa (tcx ingress)")


def test_node_down_is_unknown_and_others_still_shown() -> None:
    a = answers()
    a["worker-2"] = E.NodeAnswer("worker-2", error="no answer within 30s")
    rows = rows_by_pod(E.merge(list(expected(cluster()).values()), a))
    assert rows["ns/web"]["state"] == "ready"
    assert rows["ns/client"]["state"] == "unknown"
    assert rows["ns/client"]["reason"] == "node worker-2 did not answer: no answer within 30s"
    assert rows["ns/client"]["ipv4"] == "10.244.1.2"   # the store's facts are still there


def test_orphans_only_with_all() -> None:
    w1 = [node_ep(5, "lxaaaaaaaaaa", 1, 300, "10.244.0.2", "fd00:10:244::2"),
          node_ep(9, "lxeeeeeeeeee", 1, 300, "10.244.0.9")]
    ex = list(expected(cluster()).values())
    assert len(E.merge(ex, answers(w1=w1))) == 3
    rows = E.merge(ex, answers(w1=w1), orphans=True, seg_specs={300: {"namespace": "ns", "labels": {"app": "web"}}},
                   net_names={1: "default"})
    orphan = [r for r in rows if r["pod"] is None]
    assert len(orphan) == 1 and orphan[0]["endpoint_id"] == 9 and orphan[0]["state"] == "regenerating"
    assert orphan[0]["network"] == "default" and orphan[0]["reason"] == "no pod in the store holds this endpoint"


def test_parse_answer() -> None:
    ok = E.parse_answer("w", 0, json.dumps({"endpoints": []}), "")
    assert ok.doc == {"endpoints": []} and ok.error is None
    bad = E.parse_answer("w", 5, "", "error: pin root /x does not exist\nhint: is its agent running?\n")
    assert (bad.doc, bad.error, bad.hint) == (None, "pin root /x does not exist", "is its agent running?")
    assert E.parse_answer("w", 1, "", "").error == "node endpoint list exited 1 without a report"


def test_split_pod() -> None:
    assert E.split_pod("a/b", None) == ("a", "b")
    assert E.split_pod("b", "a") == ("a", "b")
    for bad, ns in (("b", None), ("a/b/c", None), ("/b", None), ("a/", None), ("a/b", "x"), ("", None)):
        with pytest.raises(UsageError):
            E.split_pod(bad, ns)


# ---- the commands with a fake store and fake nodes --------------------------------------------------------

def run(handler: Any, store: FakeStore, ans: dict[str, E.NodeAnswer], **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    inv = Invocation({"NO_COLOR": "1"}, io.StringIO(), out, err, _store=store)  # type: ignore[arg-type]
    defaults = dict(timeout=5.0, output=None, namespace=None, all_namespaces=False, nodes=None)
    args = argparse.Namespace(**{**defaults, **kw})
    asked: list[list[str]] = []

    def runner(nodes: list[str], timeout: float) -> dict[str, E.NodeAnswer]:
        asked.append(nodes)
        return {n: ans[n] for n in nodes if n in ans}
    rc = handler(args, inv, runner=(["worker-1", "worker-2"], runner))
    return int(rc), out.getvalue(), err.getvalue()


def test_list_json_and_node_down() -> None:
    a = answers()
    a["worker-2"] = E.NodeAnswer("worker-2", error="cannot run the node command in worker-2: boom", hint="h")
    rc, out, err = run(E.run_list, cluster(), a, namespace="ns", output="json")
    doc = json.loads(out)
    assert rc == ExitStatus.ERROR
    assert doc["unanswered"] == {"worker-2": {"error": "cannot run the node command in worker-2: boom", "hint": "h"}}
    assert [(r["pod"], r["state"]) for r in doc["endpoints"]] == [
        ("ns/client", "unknown"), ("ns/iso", "unknown"), ("ns/web", "ready")]


def test_list_table() -> None:
    rc, out, err = run(E.run_list, cluster(), answers(), namespace="ns", output="wide")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["ENDPOINT", "ID", "POD", "NODE", "NETWORK", "SEGMENT", "INGRESS", "EGRESS", "IPV4",
                                "IPV6", "STATE", "POLICIES", "VETH"]
    web = next(ln for ln in lines if "ns/web" in ln).split()
    assert web == ["5", "ns/web", "worker-1", "default", "300", "app=web", "enabled", "disabled", "10.244.0.2",
                   "fd00:10:244::2", "ready", "ns/web-in", "lxaaaaaaaaaa"]


def test_bad_input_exit_2() -> None:
    with pytest.raises(UsageError, match='no namespace "nope"'):
        run(E.run_list, cluster(), answers(), namespace="nope")
    with pytest.raises(UsageError, match='no pod "nope" in namespace ns') as exc:
        run(E.run_get, cluster(), answers(), pod="ns/nope")
    assert "web" in (exc.value.hint or "")
    with pytest.raises(UsageError, match="is not NS/POD"):
        run(E.run_get, cluster(), answers(), pod="web")
    assert UsageError("x").status == ExitStatus.USAGE == 2


def test_get_block() -> None:
    rc, out, _ = run(E.run_get, cluster(), answers(), pod="ns/web")
    assert rc == 0
    kv = {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln and not ln[0].isspace()}
    assert kv["Endpoint ID"] == "5" and kv["State"] == "ready" and kv["Ingress"] == "enabled (ns/web-in)"
    assert kv["Policies"].startswith("ns/web-in: 1 ingress rule;")
    rc, out, _ = run(E.run_get, cluster(), answers(), pod="ns/web", output="json")
    doc = json.loads(out)
    assert doc["policy_details"][0]["name"] == "ns/web-in" and doc["node_endpoint"]["ifindex"] == 5


# ---- node endpoint list's documents -------------------------------------------------------------------------

def test_node_build_endpoints() -> None:
    links = [{"ifindex": 1, "name": "lo", "state": "up", "mac": None},
             {"ifindex": 5, "name": "lxaaaaaaaaaa", "state": "up", "mac": "aa"},
             {"ifindex": 6, "name": "lxbbbbbbbbbb", "state": "up", "mac": "bb"}]
    veth = {5: {"endpoint_id": 5, "network": 1, "segment": 300, "mac": "m", "ipv4": "10.244.0.2", "ipv6": None},
            7: {"endpoint_id": 7, "network": 1, "segment": 300, "mac": "m", "ipv4": "10.244.0.7", "ipv6": None}}
    roles = {5: {"role": "pod-veth"}, 6: {"role": "pod-veth"}}
    delivery = [{"network": 1, "prefix": "10.244.0.2/32", "kind": "local", "ifindex": 5, "endpoint_id": 5}]
    hooks = {5: [{"hook": "tcx-ingress", "name": "lace_from_pod", "id": 3}], 6: []}
    docs = {d["ifindex"]: d for d in NE.build_endpoints(links, veth, roles, delivery, lambda i: hooks.get(i, []),
                                                        NumericResolver())}
    assert sorted(docs) == [5, 6, 7]
    assert docs[5]["problems"] == [] and docs[5]["delivery"][0]["prefix"] == "10.244.0.2/32"
    assert docs[6]["problems"] == [NE.NO_VETH_ENTRY, NE.NO_PROGRAM]
    assert docs[7]["link_state"] == "gone" and docs[7]["problems"] == [NE.LINK_GONE,
                                                                      "no local delivery entry for 10.244.0.7"]
