"""lace observe without a lab: filter parsing and negation, time parsing, merging in time order,
the reorder window, export rotation, the summary; the collector's batched stream and exact loss
counts; the fast event decoder against the reference one."""

from __future__ import annotations

import datetime
import io
import json
import os
import random
import threading
import time
from typing import Any

import pytest

from lace.agent.flows import FlowCollector, decode_event, parse_filter
from lace.cli.commands import observe as ob
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.main import main as lace_main
from lace.datapath.trace import TRACE_EVENT, decode_trace_event


def ev(t: float, **kw: Any) -> dict[str, Any]:
    base = {"time": t, "node": "w1", "verdict": "forward", "reason": "none", "proto": "tcp",
            "saddr": "10.244.0.2", "daddr": "10.244.1.2", "sport": 40000, "dport": 80,
            "src_network": 1, "dst_network": 1, "src_segment": 256, "dst_segment": 257,
            "policy_id": 0, "rule": 0, "nat_kind": "none", "nat_addr": None, "nat_port": None, "tcp_flags": ["syn"]}
    base.update(kw)
    return base


def names() -> ob.Names:
    objs = {
        "networks": [{"metadata": {"name": "default"}, "status": {"id": 1}},
                     {"metadata": {"name": "red"}, "status": {"id": 2}}],
        "namespaces": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
        "segments": [{"status": {"id": 256}, "spec": {"namespace": "a", "labels": {"app": "web"}, "network": "default"}},
                     {"status": {"id": 257}, "spec": {"namespace": "b", "labels": {"app": "db"}, "network": "default"}}],
        "pods": [{"metadata": {"namespace": "a", "name": "web"}, "status": {"podIPs": [{"ip": "10.244.0.2"}]}},
                 {"metadata": {"namespace": "b", "name": "db"}, "status": {"podIPs": [{"ip": "10.244.1.2"}]}},
                 {"metadata": {"namespace": "a", "name": "red", "annotations": {"lace.dev/network": "red"}},
                  "status": {"podIPs": [{"ip": "10.244.1.2"}]}}],
        "networkpolicies": [{"metadata": {"namespace": "b", "name": "deny", "annotations": {"lace.dev/policy-id": "7"}}}],
    }
    return ob.Names.from_objects(objs)


def sel(*specs: tuple[str, str, bool], **kw: Any) -> ob.Selection:
    return ob.build_selection([ob.Spec(k, v, n) for k, v, n in specs], names=kw.pop("names", names()),
                              known_nodes=["w1", "w2"], **kw)


def parse(*argv: str):
    from lace.cli.args import build_parser
    from lace.cli.commands import command_modules
    return build_parser(command_modules()).parse_args(["observe", *argv])


# ---- filters ---------------------------------------------------------------------------------------

def test_not_negates_only_the_next_filter_in_order() -> None:
    a = parse("--verdict", "DROPPED", "--not", "--port", "53", "--port", "80", "--protocol", "tcp")
    assert a.filters == [ob.Spec("verdict", "DROPPED"), ob.Spec("port", "53", True), ob.Spec("port", "80"),
                         ob.Spec("protocol", "tcp")]
    with pytest.raises(UsageError):
        parse("--not", "--not", "--port", "1")


def test_repeated_filters_or_different_ones_and_negation_excludes() -> None:
    s = sel(("verdict", "DROPPED", False), ("verdict", "audit", False), ("port", "53", True))
    p = s.predicate
    assert p(ev(1, verdict="drop")) and p(ev(1, verdict="audit"))
    assert not p(ev(1))
    assert not p(ev(1, verdict="drop", dport=53))
    # pushed down: the positive verdicts; the negated port is applied here only
    assert s.query == {"verdict": "drop,audit"} and not s.exact_pushdown


def test_pods_namespaces_networks_resolve_through_the_store() -> None:
    s = sel(("from_pod", "a/web", False), ("to_pod", "b/db", False))
    assert s.predicate(ev(1))
    # the same address in another network is another pod
    assert not s.predicate(ev(1, dst_network=2))
    assert s.query == {"src_ip": "10.244.0.2", "dst_ip": "10.244.1.2"}
    assert sel(("namespace", "b", False)).predicate(ev(1, src_segment=0, dst_segment=0))
    assert not sel(("namespace", "b", False)).predicate(ev(1, dst_segment=0, daddr="10.244.9.9"))
    assert sel(("network", "red", True)).predicate(ev(1))
    assert not sel(("network", "default", True)).predicate(ev(1))
    assert sel(("pod", "a/red", False)).predicate(ev(1, src_network=2, dst_network=2, daddr="10.244.1.2"))


def test_ips_ports_protocols_reasons_nodes() -> None:
    assert sel(("from_ip", "10.244.0.0/24", False)).predicate(ev(1))
    assert not sel(("to_ip", "10.244.0.0/24", False)).predicate(ev(1))
    assert sel(("to_ip", "10.96.0.1", False)).predicate(ev(1, nat_addr="10.96.0.1")), "the frontend counts"
    assert sel(("protocol", "icmp", False)).predicate(ev(1, proto="icmpv6"))
    assert sel(("drop_reason", "POLICY_INGRESS", False)).predicate(ev(1, reason="policy-ingress"))
    s = sel(("node", "w2", True))
    assert s.nodes == ["w1"]
    with pytest.raises(UsageError):
        sel(("node", "w3", False))


@pytest.mark.parametrize("spec, needle", [
    (("verdict", "maybe", False), "FORWARDED, DROPPED, AUDIT"),
    (("drop_reason", "policy", False), "policy-ingress"),
    (("from_ip", "10.0.0.300", False), "CIDR"),
    (("port", "http", False), "1 to 65535"),
    (("protocol", "gre", False), "tcp, udp"),
    (("from_pod", "web", False), "NS/POD"),
    (("pod", "zz/web", False), "namespaces: a, b"),
    (("pod", "a/nope", False), "pods in a: red, web"),
    (("namespace", "zz", False), "namespaces"),
    (("network", "blue", False), "networks: default, red"),
])
def test_bad_input_is_one_error_with_a_hint(spec, needle) -> None:
    with pytest.raises(UsageError) as ei:
        sel(spec)
    assert needle in (ei.value.hint or "") + ei.value.message


def test_numeric_refuses_name_filters() -> None:
    with pytest.raises(UsageError) as ei:
        sel(("pod", "a/web", False), names=None)
    assert "-n" in ei.value.message


def test_bad_input_exits_2_before_any_lab_is_needed(tmp_path) -> None:
    env = {"LACE_STATE_DIR": str(tmp_path), "NO_COLOR": "1"}
    for argv in (["--verdict", "nope"], ["--since", "yesterday"], ["--until", "2026-13-01T00:00:00"],
                 ["--from-ip", "1.2.3"], ["--drop-reason", "bogus"], ["--not"], ["--last", "-1"],
                 ["--summary", "--follow"], ["--port", "0"]):
        out, err = io.StringIO(), io.StringIO()
        rc = lace_main(["observe", *argv], env, stdout=out, stderr=err, stdin=io.StringIO())
        assert int(rc) == 2, (argv, err.getvalue())
        lines = err.getvalue().splitlines()
        assert lines[0].startswith("error: ") and lines[1].startswith("hint: ") and "Traceback" not in err.getvalue()


# ---- time --------------------------------------------------------------------------------------------

def test_time_parsing() -> None:
    now = 1_800_000_000.0
    assert ob.parse_time("5m", now) == now - 300
    assert ob.parse_time("30s", now) == now - 30
    assert ob.parse_time("1.5h", now) == now - 5400
    assert ob.parse_time("2d", now) == now - 172800
    assert ob.parse_time("@1700000000", now) == 1_700_000_000
    assert ob.parse_time("2026-12-03T12:00:00Z", now) == datetime.datetime(2026, 12, 3, 12, tzinfo=datetime.timezone.utc).timestamp()
    assert ob.parse_time("2026-12-03T12:00:00", now) == datetime.datetime(2026, 12, 3, 12).timestamp()
    assert ob.parse_time("2026-12-03T13:00:00+01:00", now) == ob.parse_time("2026-12-03T12:00:00Z", now)
    for bad in ("5x", "yesterday", "", "2026-12-03T25:00"):
        with pytest.raises(UsageError):
            ob.parse_time(bad, now)
    s = sel(since=100.0, until=200.0)
    assert s.query == {"since": "100.0", "until": "200.0"}
    assert s.predicate(ev(150.0)) and not s.predicate(ev(99.0)) and not s.predicate(ev(201.0))
    f = parse_filter(s.query)
    assert f(ev(150.0)) and not f(ev(250.0))


# ---- merging ---------------------------------------------------------------------------------------

def test_history_merges_nodes_in_time_order() -> None:
    rnd = random.Random(3)
    nodes = [[ev(rnd.uniform(0, 100), node=f"w{i}") for _ in range(200)] for i in range(3)]
    for evs in nodes:
        evs.sort(key=lambda e: e["time"])
    nodes[0][10], nodes[0][11] = nodes[0][11], nodes[0][10]   # a node's CPUs submit a little out of order
    merged = list(ob.merge_history(nodes))
    assert len(merged) == 600
    assert [e["time"] for e in merged] == sorted(e["time"] for n in nodes for e in n)


def test_reorder_window_releases_oldest_first_once_old_enough() -> None:
    r = ob.Reorder(0.5)
    for t in (10.3, 10.1, 10.2, 10.9):
        r.push(ev(t))
    assert r.pop_ready(10.6) == [] or all(e["time"] <= 10.1 for e in r.pop_ready(10.6))
    r2 = ob.Reorder(0.5)
    for t in (10.3, 10.1, 10.2, 10.9):
        r2.push(ev(t))
    assert [e["time"] for e in r2.pop_ready(10.85)] == [10.1, 10.2, 10.3]
    assert [e["time"] for e in r2.drain()] == [10.9]


# ---- export and summary ------------------------------------------------------------------------------

def test_export_rotates_by_size_and_keeps_n(tmp_path) -> None:
    path = str(tmp_path / "flows.jsonl")
    w = ob.RotatingWriter(path, max_bytes=1000, keep=2)
    line = json.dumps({"x": "y" * 91})          # 101 bytes with the newline: 9 lines fit in 1000
    for _ in range(45):
        w.write(line)
    w.close()
    files = sorted(os.listdir(tmp_path))
    assert files == ["flows.jsonl", "flows.jsonl.1", "flows.jsonl.2"]
    for f in files:
        size = os.path.getsize(tmp_path / f)
        assert size <= 1000
        assert all(json.loads(x) for x in open(tmp_path / f))
    assert os.path.getsize(tmp_path / "flows.jsonl.1") == 909    # 9 lines: the 10th would not fit
    assert w.rotations == 4 and w.lines == 45


def test_summary_counts_talkers_reasons_pairs() -> None:
    s = ob.Summary()
    d = ob.Describer(names())
    for e in [ev(1), ev(2), ev(3, verdict="drop", reason="policy-ingress", policy_id=7, rule=0xFFFF),
              ev(4, saddr="10.244.5.5", verdict="drop", reason="no-delivery")]:
        s.add(d(e))
    doc = s.document(10)
    assert doc["flows"] == 4
    assert doc["top_talkers"][0] == {"source": "a/web", "destination": "b/db", "flows": 3}
    assert doc["drop_reasons"] == [{"reason": "no-delivery", "flows": 1}, {"reason": "policy-ingress", "flows": 1}]
    pair = doc["pairs"][0]
    assert (pair["forwarded"], pair["dropped"], pair["audit"]) == (2, 1, 0)
    assert d(ev(3, verdict="drop", reason="policy-ingress", policy_id=7, rule=0xFFFF))["policy"] == "b/deny (default deny)"
    assert d(ev(3, policy_id=7, rule=2))["policy"] == "b/deny rule 2"
    assert d(ev(3, verdict="drop", reason="policy-egress"))["policy"] == "no policy info in the event"


def test_compact_line_names_node_pods_verdict_reason_policy() -> None:
    d = ob.Describer(names())(ev(1_800_000_000.0, verdict="drop", reason="policy-ingress", policy_id=7, rule=0xFFFF))
    line = ob.compact_line(d)
    assert "[w1] a/web (10.244.0.2:40000) -> b/db (10.244.1.2:80) tcp syn DROPPED (policy-ingress)" in line
    assert line.endswith("policy b/deny (default deny)")


# ---- the collector -----------------------------------------------------------------------------------

def collector(**kw: Any) -> FlowCollector:
    return FlowCollector("n1", source=lambda ms, deliver: time.sleep(ms / 1000), decode=lambda raw: {}, **kw)


def test_batched_follow_counts_every_loss_exactly() -> None:
    ring = [0]
    c = collector(follower_queue=100, ring_lost_source=lambda: ring[0])
    c.check_ring_lost()
    it = c.follow_batches(batch=50)
    first = next(it)
    assert first["follow"] and first["flows"] == []
    for i in range(250):
        c.add({"ts_ns": time.monotonic_ns(), "seq": i})
    ring[0] = 17
    c.check_ring_lost()
    seen, lost, ring_lost = [], 0, 0
    while len(seen) < 100:
        doc = next(it)
        seen += [e["seq"] for e in doc.get("flows", [])]
        lost += doc["lost"]
        ring_lost += doc["ring_lost"]
    assert seen == list(range(100)) and lost == 150 and ring_lost == 17
    it.close()
    assert c.followers == 0


def test_two_batched_followers_see_the_same_events() -> None:
    c = collector()
    its = [c.follow_batches(), c.follow_batches()]
    for it in its:
        next(it)
    for i in range(1000):
        c.add({"ts_ns": 1, "seq": i})
    for it in its:
        got: list[int] = []
        while len(got) < 1000:
            got += [e["seq"] for e in next(it).get("flows", [])]
        assert got == list(range(1000))
        it.close()


def test_fast_decoder_matches_the_reference() -> None:
    rnd = random.Random(7)
    for i in range(500):
        fam = rnd.choice([2, 10, 0])
        raw = TRACE_EVENT.pack(
            ts_ns=rnd.getrandbits(63), ifindex=rnd.getrandbits(32), pkt_len=rnd.getrandbits(16), point=rnd.randrange(8),
            verdict=rnd.randrange(4), reason=rnd.randrange(40), family=fam, proto=rnd.choice([6, 17, 1, 58, 132, 0]),
            ct_status=rnd.randrange(5), delivery=rnd.randrange(6), src_network=rnd.getrandbits(32),
            dst_network=rnd.getrandbits(32), src_segment=5, dst_segment=7,
            saddr=os.urandom(16) if i % 5 else b"\0" * 10 + b"\xff\xff" + os.urandom(4), daddr=os.urandom(16),
            sport=rnd.getrandbits(16), dport=rnd.getrandbits(16), policy_id=rnd.getrandbits(32),
            nat_addr=os.urandom(16), nat_port=rnd.getrandbits(16), nat_kind=rnd.randrange(3),
            tcp_flags=rnd.getrandbits(8), delivery_ifindex=9, sid=os.urandom(16), node_id=3,
            rule=rnd.getrandbits(16), reserved=0)
        assert decode_event(raw) == decode_trace_event(raw)
