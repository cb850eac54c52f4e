"""The drift audit without a kernel: classification of two dicts of entries, the agent's report
(decoded through the registry), the second look, the service programmer's scratch copy, the
rendering with and without names, ``node verify`` against a fake agent socket (exit 0 / 1 / 2 /
5) and ``lace verify``'s node results and cluster summary."""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import tempfile
from array import array
from typing import Any

import pytest

from lace.agent import verify as av
from lace.agent.api import ApiServer
from lace.agent.desired import OWNED_MAPS
from lace.cli.commands import verify as cv
from lace.cli.errors import UsageError
from lace.cli.node import verify as nv
from lace.cli.node.main import main as node_main
from lace.cli.node.resolve import NumericResolver, Resolver
from lace.datapath import registry
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_exact_key, delivery_key
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.policy import POLICY_ENTRY
from lace.datapath.routing import route_value, routing_key
from lace.services.program import ServiceProgrammer, table_key


def local(ifindex: int, ep: int) -> bytes:
    return DELIVERY.pack(kind=DeliveryKind.LOCAL, ifindex=ifindex, mac=b"\x02\0\0\0\0\x01",
                         host_mac=b"\x02\0\0\0\0\x02", endpoint_id=ep)


# ---- classification ----------------------------------------------------------------------------------

def test_classify_missing_stale_different() -> None:
    want = {b"a": b"1", b"b": b"2", b"c": b"3"}
    have = {b"b": b"2", b"c": b"9", b"d": b"4"}
    got = av.classify("veth", want, have)
    assert [(d.kind, d.key, d.desired, d.actual) for d in got] == [
        ("missing", b"a", b"1", None), ("stale", b"d", None, b"4"), ("different", b"c", b"3", b"9")]
    assert av.classify("veth", want, dict(want)) == []
    assert av.classify("veth", {}, {}) == []


def test_policy_hit_counters_are_not_drift() -> None:
    k = b"k" * 8
    want = {k: POLICY_ENTRY.pack(policy_id=7, rule=1, flags=0, hits=0)}
    assert av.classify("policy", want, {k: POLICY_ENTRY.pack(policy_id=7, rule=1, flags=0, hits=1234)}) == []
    other = {k: POLICY_ENTRY.pack(policy_id=8, rule=1, flags=0, hits=0)}
    assert [d.kind for d in av.classify("policy", want, other)] == ["different"]


def test_confirmed_keeps_what_both_looks_saw() -> None:
    first = {"routing": [av.Drift("stale", b"x", None, b"1"), av.Drift("missing", b"y", b"2", None)]}
    second = {"routing": [av.Drift("stale", b"x", None, b"1"), av.Drift("missing", b"z", b"3", None)]}
    assert av.confirmed(first, second) == {"routing": [av.Drift("stale", b"x", None, b"1")]}


# ---- the report ------------------------------------------------------------------------------------

def tampered() -> tuple[dict[str, dict[bytes, bytes]], dict[str, dict[bytes, bytes]]]:
    """Desired and actual contents of three maps, tampered as the e2e test does."""
    pod = delivery_key(1, "10.244.1.3/32")
    ve = veth_key(6)
    want = {
        "routing": {routing_key(1, "10.244.0.0/16"): route_value(1)},
        "delivery": {pod: local(6, 3), delivery_key(1, "10.244.2.0/24"): DELIVERY.pack(kind=DeliveryKind.HOST)},
        "veth": {ve: endpoint_value(endpoint_id=3, network=1, segment=259, mac="02:00:00:00:00:01",
                                    ipv4="10.244.1.3", ipv6=None)},
    }
    have = {
        "routing": {**want["routing"], routing_key(1, "192.0.2.0/24"): route_value(1)},
        "delivery": {delivery_key(1, "10.244.2.0/24"): DELIVERY.pack(kind=DeliveryKind.HOST)},
        "veth": {ve: endpoint_value(endpoint_id=3, network=1, segment=4242, mac="02:00:00:00:00:01",
                                    ipv4="10.244.1.3", ipv6=None)},
    }
    return want, have


def agent_doc() -> dict[str, Any]:
    want, have = tampered()
    drift = {n: av.classify(n, want[n], have[n]) for n in want}
    doc = av.report(drift, want, have)
    doc.update(node="worker-1")
    return json.loads(json.dumps(doc))   # as it crosses the socket


def test_report_decodes_entries_by_map_and_kind() -> None:
    doc = agent_doc()
    assert doc["total"] == 3 and doc["audited"] == ["routing", "delivery", "veth"]
    assert "ct-tcp-v4" in doc["not_audited"] and "probe-cookie" in doc["not_audited"]
    assert not set(doc["not_audited"]) & set(OWNED_MAPS)
    r, d, v = doc["maps"]["routing"], doc["maps"]["delivery"], doc["maps"]["veth"]
    assert (r["desired"], r["actual"], r["drift"]) == (1, 2, 1)
    assert r["stale"][0]["key"]["prefix"] == "192.0.2.0/24" and r["stale"][0]["desired"] is None
    assert d["missing"][0]["key"]["prefix"] == "10.244.1.3/32" and d["missing"][0]["desired"]["kind"] == "local"
    assert d["missing"][0]["actual"] is None
    e = v["different"][0]
    assert e["desired"]["segment"] == 259 and e["actual"]["segment"] == 4242 and e["raw_key"] == "06000000"


def test_maglev_tables_decode_as_slot_counts() -> None:
    a = array("I", [1, 2] * 510 + [1]).tobytes()
    b = array("I", [1, 2] * 510 + [3]).tobytes()
    m = av.map_report("maglev", av.classify("maglev", {table_key(1): a}, {table_key(1): b}), 1, 1)
    e = m["different"][0]
    assert e["key"] == {"table": 1} and e["desired"]["backends"] == {"1": 511, "2": 510}
    assert e["actual"]["backends"] == {"1": 510, "2": 510, "3": 1} and e["slots_differ"] == 1
    assert "raw_desired" not in e


def test_parse_maps() -> None:
    assert av.parse_maps({}) == list(OWNED_MAPS)
    assert av.parse_maps({"maps": "veth,routing"}) == ["routing", "veth"]
    with pytest.raises(av.BadRequest):
        av.parse_maps({"maps": "ct-tcp-v4"})


def test_a_scratch_service_programmer_leaves_the_agents_allocation_alone() -> None:
    svc = ServiceProgrammer()
    svc._ids["x"] = 5
    svc._free_tables.append(3)
    c = svc.scratch()
    c._ids["y"] = 6
    c._free_tables.pop()
    assert svc._ids == {"x": 5} and svc._free_tables == [3] and c._lock is not svc._lock


def test_cli_knows_the_audited_maps() -> None:
    assert nv.AUDITED == OWNED_MAPS


def test_cli_knows_the_maps_the_datapath_owns() -> None:
    """Every registered map is audited, a conntrack table or one the CLI names as written by the
    datapath itself, and its help text names each."""
    owned = {n for n in registry.MAPS if n not in OWNED_MAPS and not n.startswith("ct-")}
    assert set(nv.DATAPATH_OWNED) == owned
    assert all(n in nv.NOT_AUDITED_TEXT for n in nv.DATAPATH_OWNED)


# ---- rendering ---------------------------------------------------------------------------------------

def resolver() -> Resolver:
    return Resolver.from_objects({
        "networks": [{"metadata": {"name": "default"}, "status": {"id": 1}}],
        "segments": [{"spec": {"namespace": "alpha", "labels": {"app": "web"}, "network": "default"},
                      "status": {"id": 259}}],
        "pods": [{"metadata": {"name": "web-1", "namespace": "alpha"},
                  "status": {"podIPs": [{"ip": "10.244.1.3"}]}}],
    })


def inv(env: dict | None = None) -> tuple[Any, io.StringIO]:
    from lace.cli.invocation import Invocation
    out = io.StringIO()
    return Invocation(dict(env or {}), io.StringIO(""), out, io.StringIO()), out


def test_annotate_and_render_with_names() -> None:
    doc = nv.annotate(agent_doc(), resolver())
    e = doc["maps"]["delivery"]["missing"][0]
    assert e["key_text"] == "default 10.244.1.3/32 (alpha/web-1)"
    assert e["desired_text"].startswith("local ifindex 6") and e["actual_text"] == "-"
    v = doc["maps"]["veth"]["different"][0]
    assert "segment 259 alpha app=web (default)" in v["desired_text"]
    assert "segment 4242 (unresolved)" in v["actual_text"]
    assert doc["maps"]["routing"]["stale"][0]["actual_text"] == "to default"
    i, out = inv()
    nv.render_report(i, "worker-1", doc)
    text = out.getvalue()
    assert "routing on worker-1 (1 desired, 2 in the kernel): 1 stale" in text
    assert "KIND" in text and "DESIRED" in text and "ACTUAL" in text
    assert text.rstrip().endswith("node worker-1: 3 entries drift in 3 maps "
                                  "(routing: 1 stale; delivery: 1 missing; veth: 1 different)")


def test_the_exact_map_is_audited_and_named_as_delivery() -> None:
    """An exact entry the trie no longer has (deleted behind the agent's back: the datapath would
    still deliver by it) is stale drift, decoded and named as a delivery entry."""
    pod = delivery_exact_key(1, "10.244.1.3")
    want = {"delivery": {}, "delivery-exact": {}}
    have = {"delivery": {}, "delivery-exact": {pod: local(6, 3)}}
    drift = {n: av.classify(n, want[n], have[n]) for n in want}
    doc = json.loads(json.dumps(av.report(drift, want, have)))
    assert doc["audited"] == ["delivery", "delivery-exact"] and "delivery-exact" not in doc["not_audited"]
    (e,) = doc["maps"]["delivery-exact"]["stale"]
    assert e["key"]["prefix"] == "10.244.1.3/32" and e["actual"]["kind"] == "local"
    nv.annotate(doc, resolver())
    assert e["key_text"] == "default 10.244.1.3/32 (alpha/web-1)" and e["actual_text"].startswith("local ifindex 6")
    assert nv.check_maps(["delivery-exact"]) == ["delivery-exact"]
    assert av.parse_maps({"maps": "delivery-exact"}) == ["delivery-exact"]


def test_numeric_rendering_has_no_names() -> None:
    doc = nv.annotate(agent_doc(), NumericResolver())
    e = doc["maps"]["delivery"]["missing"][0]
    assert e["key_text"] == "network 1 10.244.1.3/32"
    assert "alpha" not in json.dumps(doc)


def test_summary_lines() -> None:
    clean = {"maps": {"routing": {"missing": [], "stale": [], "different": []},
                      "veth": {"missing": [], "stale": [], "different": []}}, "entries": 7}
    assert nv.summary("worker-2", clean) == "node worker-2: no drift in 2 maps (7 entries)"
    one = {"maps": {"routing": {"missing": [], "stale": [{}], "different": []}}, "entries": 1}
    assert nv.summary("w", one) == "node w: 1 entry drifts in 1 map (routing: 1 stale)"
    rep = dict(clean, repair={"fixed": one["maps"]})
    assert nv.summary("w", rep) == ("node w: repaired 1 entry in 1 map (routing: 1 stale); "
                                    "no drift in 2 maps (7 entries)")


def test_check_maps() -> None:
    assert nv.check_maps(["veth", "veth", "routing"]) == ["veth", "routing"]
    with pytest.raises(UsageError, match="not audited"):
        nv.check_maps(["ct-tcp-v4"])
    with pytest.raises(UsageError, match="unknown map"):
        nv.check_maps(["nope"])


# ---- node verify against a fake agent ---------------------------------------------------------------

@pytest.fixture
def agent_socket():
    d = tempfile.mkdtemp(prefix="lace-verify-")
    path = os.path.join(d, "agent.sock")
    api = ApiServer(path)
    state: dict[str, Any] = {"doc": agent_doc(), "queries": []}

    def get(body: dict) -> tuple[int, Any]:
        state["queries"].append(("GET", body.get("_query")))
        return 200, state["doc"]

    def repair(body: dict) -> tuple[int, Any]:
        state["queries"].append(("POST", body.get("_query")))
        doc = {"maps": {n: {"desired": 1, "actual": 1, "missing": [], "stale": [], "different": []}
                        for n in ("routing", "delivery", "veth")}, "entries": 3, "total": 0,
               "repair": {"fixed": agent_doc()["maps"], "changes": {"routing": 1}}}
        return 200, doc

    api.route("GET", "/v1/verify", get)
    api.route("POST", "/v1/verify/repair", repair)
    api.start()
    try:
        yield path, state
    finally:
        api.stop()
        os.rmdir(d)


def run_node(argv: list[str], sock: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"LACE_AGENT_SOCKET": sock, "LACE_NODE": "worker-1", "NO_COLOR": "1"}
    rc = int(node_main(argv, env, stdout=out, stderr=err))
    return rc, out.getvalue(), err.getvalue()


def test_node_verify_exit_status_and_json(agent_socket) -> None:
    sock, state = agent_socket
    rc, out, err = run_node(["verify", "-n", "-o", "json", "--map", "veth", "--map", "routing"], sock)
    assert rc == 1, err
    doc = json.loads(out)
    assert doc["clean"] is False and doc["node"] == "worker-1" and doc["summary"].startswith("node worker-1: 3")
    assert state["queries"][-1] == ("GET", {"maps": "veth,routing"})
    rc, out, err = run_node(["verify", "-n", "--repair"], sock)
    assert rc == 0, err
    assert "routing on worker-1, repaired: 1 stale" in out and "WAS" in out
    assert out.rstrip().endswith("no drift in 3 maps (3 entries)")
    state["doc"] = {"maps": {"veth": {"desired": 2, "actual": 2, "missing": [], "stale": [], "different": []}},
                    "entries": 2, "total": 0}
    rc, out, _ = run_node(["verify", "-n"], sock)
    assert rc == 0 and out == "node worker-1: no drift in 1 map (2 entries)\n"


def test_node_verify_agent_down_and_bad_input(tmp_path) -> None:
    rc, out, err = run_node(["verify", "-n"], str(tmp_path / "gone.sock"))
    assert rc == 5 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("error: the agent of worker-1 is not answering on ") and "gone.sock" in lines[0]
    assert "lace lab restart-agent worker-1" in lines[1] and "Traceback" not in err
    rc, _, err = run_node(["verify", "--map", "metrics"], str(tmp_path / "gone.sock"))
    assert rc == 2 and err.startswith("error: ") and "hint: audited maps" in err
    rc, _, err = run_node(["verify", "--bogus"], str(tmp_path / "gone.sock"))
    assert rc == 2 and "Traceback" not in err


# ---- lace verify -----------------------------------------------------------------------------------

def test_parse_result() -> None:
    doc = agent_doc()
    r = cv.parse_result("worker-1", 1, json.dumps(doc), "")
    assert r.doc == doc and r.error is None
    r = cv.parse_result("worker-2", 5, "", "error: the agent of worker-2 is not answering on /s: refused\n"
                                          "hint: restart it\n")
    assert r.doc is None and r.error == "the agent of worker-2 is not answering on /s: refused" and r.hint == "restart it"
    r = cv.parse_result("worker-3", 1, "not json", "")
    assert r.doc is None and "without a report" in r.error


def test_cluster_summary_and_status() -> None:
    clean = {"maps": {"veth": {"missing": [], "stale": [], "different": []}}, "entries": 1}
    results = [cv.NodeResult("worker-1", agent_doc()), cv.NodeResult("worker-2", error="agent down"),
               cv.NodeResult("worker-3", clean)]
    assert cv.cluster_summary(results) == "1/3 nodes clean; worker-1: 3 entries drift; worker-2 did not answer: agent down"
    assert cv.status(results) == 1
    assert cv.status([results[2]]) == 0
    assert cv.cluster_summary([results[2]]) == "1/1 nodes clean"


def test_pick_nodes_and_argv() -> None:
    assert cv.pick_nodes(None, ["a", "b"]) == ["a", "b"]
    assert cv.pick_nodes(["b", "b"], ["a", "b"]) == ["b"]
    with pytest.raises(UsageError) as e:
        cv.pick_nodes(["c"], ["a", "b"])
    assert e.value.hint == "nodes: a, b"
    a = argparse.Namespace(repair=True, maps=["veth"], numeric=True)
    assert cv.node_argv(a) == ["verify", "-o", "json", "--repair", "--map", "veth", "-n"]


def test_lace_verify_bad_input_is_one_line() -> None:
    from lace.cli.main import main as lace_main
    out, err = io.StringIO(), io.StringIO()
    rc = lace_main(["verify", "--map", "ct-udp-v6"], {"LACE_STATE_DIR": "/nonexistent"}, stdout=out, stderr=err)
    assert int(rc) == 2 and err.getvalue().startswith("error: ") and "Traceback" not in err.getvalue()
    rc = lace_main(["verify", "--frobnicate"], {"LACE_STATE_DIR": "/nonexistent"}, stdout=out, stderr=io.StringIO())
    assert int(rc) == 2


def test_kubernetes_path_with_fake_exec() -> None:
    """Each node's lace-node pod runs node verify; one without a pod is reported, the others shown."""
    from types import SimpleNamespace as NS

    class Core:
        def list_node(self):
            return NS(items=[NS(metadata=NS(name="n1")), NS(metadata=NS(name="n2"))])

        def list_namespaced_pod(self, ns, label_selector, field_selector):
            node = field_selector.split("=")[1]
            pods = [NS(metadata=NS(name="lace-node-a"), spec=NS(node_name="n1"), status=NS(phase="Running"))]
            return NS(items=[p for p in pods if p.spec.node_name == node])

        def connect_get_namespaced_pod_exec(self, **kw):   # pragma: no cover - the fake stream is called
            raise AssertionError

    class Resp:
        def __init__(self) -> None:
            self.open = True

        def is_open(self) -> bool:
            return self.open

        def update(self, timeout: float) -> None:
            self.open = False

        def peek_stdout(self) -> bool:
            return True

        def read_stdout(self) -> str:
            return json.dumps(agent_doc())

        def peek_stderr(self) -> bool:
            return False

        def read_channel(self, ch: int) -> str:
            return json.dumps({"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": "1"}]}})

        def close(self) -> None:
            pass

    args = argparse.Namespace(nodes=None, repair=False, maps=None, numeric=False, timeout=10, context="c")
    i, _ = inv()
    results = cv.run_kubernetes(args, i, core=Core(), stream_fn=lambda fn, **kw: Resp())
    assert results[0].node == "n1" and results[0].doc["total"] == 3
    assert results[1].node == "n2" and results[1].doc is None and "no running lace-node pod" in results[1].error


def test_table_key_is_u32() -> None:
    assert av.decode_key("maglev", struct.pack("<I", 9)) == {"table": 9}


def test_what_full_maps_left_out_makes_the_audit_unclean() -> None:
    """No drift, but a full services map left frontends out: named in the summary, exit 1, and
    the cluster summary says so too."""
    doc = {"maps": {"services": {"missing": [], "stale": [], "different": []}}, "entries": 4,
           "left_out": {"services": ["a/web:80", "a/dns:53"]}}
    assert nv.summary("w", doc) == ("node w: no drift in 1 map (4 entries); full maps left out services: "
                                    "a/web:80, a/dns:53 (new flows to them drop as map-full)")
    assert nv.status_of(doc) == 1 and not nv.clean(doc)
    results = [cv.NodeResult("worker-1", doc)]
    assert cv.cluster_summary(results) == "0/1 nodes clean; worker-1: full maps left out services: a/web:80, a/dns:53"
    assert cv.status(results) == 1
    assert nv.clean({**doc, "left_out": {}})
