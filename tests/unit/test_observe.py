"""lace observe without a lab: filter parsing and negation, time parsing, merging in time order,
the reorder window, export rotation, the summary; the collector's raw frames and exact loss
counts; rendering of followed records against describing each decoded event; the decoder."""

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

from lace.agent.flows import FlowCollector, parse_filter
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
        r.push(t, ev(t))
    assert [e["time"] for e in r.pop_ready(10.6)] == [10.1]
    r2 = ob.Reorder(0.5)
    for t in (10.3, 10.1, 10.2, 10.9):
        r2.push(t, ev(t))
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


# ---- the collector's raw stream and its rendering ---------------------------------------------------

V4, V6 = 4, 6


def record(rnd: random.Random, ts: int, **kw: Any) -> bytes:
    """A ring buffer record of one of a few flows between the test's pods (and some unknown
    addresses, families and enum values), with its own per-packet fields."""
    fam = rnd.choice([V4, V4, V4, V6, 0])
    addr = lambda: (bytes([10, 244, rnd.choice([0, 1, 5]), 2]) + bytes(12) if fam == V4  # noqa: E731
                    else b"\0" * 10 + b"\xff\xff" + os.urandom(4) if rnd.random() < 0.2 else os.urandom(16))
    fields = dict(
        ts_ns=ts, ifindex=rnd.choice([3, 4]), pkt_len=rnd.randrange(60, 1500), point=rnd.randrange(8),
        verdict=rnd.choice([1, 2, 3, 9]), reason=rnd.choice([0, 1, 2, 5, 300, 2000]), family=fam,
        proto=rnd.choice([6, 17, 1, 58, 132]), ct_status=rnd.randrange(5), delivery=rnd.randrange(6),
        src_network=rnd.choice([0, 1, 2]), dst_network=rnd.choice([1, 2]), src_segment=rnd.choice([256, 257, 3]),
        dst_segment=rnd.choice([256, 257]), saddr=addr(), daddr=addr(), sport=rnd.choice([40000, 40001, 7]),
        dport=rnd.choice([80, 53]), policy_id=rnd.choice([0, 7, 9]), nat_addr=addr(), nat_port=rnd.choice([0, 8080]),
        nat_kind=rnd.randrange(3), tcp_flags=rnd.getrandbits(8), delivery_ifindex=9, sid=addr(), node_id=3,
        rule=rnd.choice([0, 2, 0xFFFF]))
    fields.update(kw)
    return TRACE_EVENT.pack(**fields)


def reference(data: bytes, offset_ns: int, node: str) -> list[dict[str, Any]]:
    """The events of records as the collector's history gives them (one decoding per record)."""
    out = []
    for i in range(len(data) // 128):
        e = decode_trace_event(data[i * 128:(i + 1) * 128])
        e["time"] = (e["ts_ns"] + offset_ns) / 1e9
        e["node"] = node
        out.append(e)
    return out


@pytest.mark.parametrize("with_names", [True, False])
@pytest.mark.parametrize("filters", [(), (("verdict", "DROPPED", False), ("port", "53", True)),
                                     (("namespace", "a", False),), (("to_ip", "10.244.1.0/24", False),)])
def test_rendered_frames_are_what_describing_each_event_gives(with_names, filters) -> None:
    """A flow's template filled in with each packet's fields is the JSON line of that event,
    described, and the filters and the time window pick the same events as on decoded ones."""
    if not with_names and any(k == "namespace" for k, _v, _n in filters):
        return
    rnd = random.Random(11)
    offset = 1_764_763_200_123_456_789
    shapes = [record(rnd, 0) for _ in range(40)]     # 40 flows, 3,000 packets with their own fields
    ts0 = 5_000_000_000
    recs = []
    for i in range(3000):
        r = bytearray(rnd.choice(shapes))
        r[0:8] = (ts0 + i * 1_000_037).to_bytes(8, "little")
        r[12:16] = rnd.randrange(40, 9000).to_bytes(4, "little")
        r[72:76] = os.urandom(4) if rnd.random() < 0.3 else r[72:76]
        recs.append(bytes(r))
    data = b"".join(recs)
    events = reference(data, offset, "w1")
    since, until = events[200]["time"], events[2500]["time"]
    s = sel(*filters, names=names() if with_names else None, since=since, until=until)
    describe = ob.Describer(names() if with_names else None)
    want = [describe(e) for e in events if s.predicate(e)]
    assert 0 < len(want) <= 2301     # the window keeps events 200..2500
    for as_text in (True, False):
        r = ob.FrameRenderer("w1", s, describe, as_text)
        got_times, got = [], []
        for a in range(0, 3000, 700):                # frames of up to 700 records
            chunk = data[a * 128:(a + 700) * 128]
            t, f = r.render(len(chunk) // 128, offset, chunk)
            got_times += t
            got += f
        assert got_times == [d["time"] for d in want]
        assert got == ([ob._json(d) for d in want] if as_text else want)
        assert len(r._shapes) <= 40 * 2


def test_followed_agent_stream_prints_the_same_json_lines(tmp_path) -> None:
    """The agent's API server and `lace observe --follow -o jsonl`: every event, once, as the
    JSON line of the decoded and described event; --until ends it."""
    from lace.agent.api import ApiServer
    rnd = random.Random(5)
    c = FlowCollector("w1", source=lambda ms: (time.sleep(ms / 1000), (b"", 0))[1])
    api = ApiServer(str(tmp_path / "agent.sock"))
    for method, path, fn in c.routes():
        api.route(method, path, fn)
    api.start()
    try:
        now = time.monotonic_ns()
        blocks = [b"".join(record(rnd, now + i * 1000 + j) for j in range(300)) for i in range(5)]
        until = time.time() + 1.0
        out, err = io.StringIO(), io.StringIO()
        t = threading.Thread(target=lambda: lace_main(
            ["observe", "--follow", "-o", "jsonl", "-n", "--agent", f"w1={api.path}", "--until", f"@{until}"],
            {"NO_COLOR": "1"}, stdout=out, stderr=err, stdin=io.StringIO()))
        t.start()
        deadline = time.monotonic() + 10
        while c.followers == 0:
            assert time.monotonic() < deadline and t.is_alive(), err.getvalue()
            time.sleep(0.01)
        for b in blocks:
            c.add_records(b)
        t.join(15)
        assert not t.is_alive()
        describe = ob.Describer(None)
        want = [ob._json(describe(e)) for b in blocks for e in reference(b, c._offset_ns, "w1")]
        assert out.getvalue().splitlines() == want, err.getvalue()
    finally:
        api.stop()


def test_follow_names_an_agent_that_does_not_stream_records(tmp_path) -> None:
    from lace.agent.api import ApiServer
    api = ApiServer(str(tmp_path / "agent.sock"))
    api.route("GET", "/v1/flows", lambda body: (200, iter([{"keepalive": True}])))   # an older agent
    api.start()
    try:
        out, err = io.StringIO(), io.StringIO()
        rc = lace_main(["observe", "--follow", "-n", "--agent", f"w1={api.path}"], {"NO_COLOR": "1"},
                       stdout=out, stderr=err, stdin=io.StringIO())
    finally:
        api.stop()
    assert int(rc) == 1 and "Traceback" not in err.getvalue()
    assert "node w1 did not answer: its agent does not stream raw flow records" in err.getvalue()
    assert "hint: run the same lace version on both" in err.getvalue()


def _serve(tmp_path, name: str, lines) -> Any:
    """An agent API on its own socket whose /v1/flows answers with ``lines`` (a callable returning
    an iterator of documents and raw bytes)."""
    from lace.agent.api import ApiServer
    api = ApiServer(str(tmp_path / f"{name}.sock"))
    api.route("GET", "/v1/flows", lambda body: (200, lines()))
    api.start()
    return api


def _observe(argv: list[str], timeout: float = 10.0) -> tuple[int, str, str]:
    """lace observe in a thread, which must end within timeout (a follow that waits forever fails)."""
    out, err, rc = io.StringIO(), io.StringIO(), []
    t = threading.Thread(target=lambda: rc.append(lace_main(["observe", *argv], {"NO_COLOR": "1"}, stdout=out,
                                                            stderr=err, stdin=io.StringIO())), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"lace observe {' '.join(argv)} did not end: {err.getvalue()}"
    return int(rc[0]), out.getvalue(), err.getvalue()


@pytest.mark.parametrize("header", [b'{"records": "3", "offset_ns": 0}\n', b'[1, 2]\n', b'{"records": 1}\n',
                                    b'{"records": -1, "offset_ns": 0}\n', b'{"records": null, "offset_ns": 0}\n',
                                    b'{"records": 0, "offset_ns": 0, "lost": "x"}\n', b'{"records": 1e30, "offset_ns": 0}\n',
                                    b'{"records": 99999999999, "offset_ns": 0}\n'],
                         ids=["string", "array", "no-offset", "negative", "null", "lost", "float", "huge"])
def test_a_malformed_frame_header_ends_the_follow_with_the_node_named(tmp_path, header) -> None:
    """A frame header of the wrong shape is a broken stream: the node is named, no traceback, and
    the follow ends (its thread always reports its end)."""
    first = {"follow": True, "node": "w1", "record_size": TRACE_EVENT.size, "flows": []}
    api = _serve(tmp_path, "w1", lambda: iter([first, header]))
    try:
        rc, _, err = _observe(["--follow", "-n", "--agent", f"w1={api.path}"])
    finally:
        api.stop()
    assert rc == 1 and "Traceback" not in err, err
    assert "node w1 did not answer: the stream from its agent broke: a frame header" in err, err


def test_frame_header_is_checked() -> None:
    assert ob._frame_header(b'{"records": 2, "offset_ns": -5, "ring_lost": 1}') == \
        {"records": 2, "offset_ns": -5, "lost": 0, "ring_lost": 1}
    for bad in (b'{"records": true, "offset_ns": 0}', b'"x"', b'{"offset_ns": 0}', b'{"records": 1, "offset_ns": 0.5}'):
        with pytest.raises(ValueError):
            ob._frame_header(bad)


def test_last_backlog_survives_the_last_node_failing_before_its_first_document(tmp_path) -> None:
    """--last: w1 sends its backlog, then w2 (the last to answer) fails before its first document;
    w1's backlog is still printed, and w2 named."""
    now = time.time()
    first = {"follow": True, "node": "w1", "record_size": TRACE_EVENT.size,
             "flows": [ev(now - 2, sport=40001), ev(now - 1, sport=40002)]}

    def w1():
        yield first
        for _ in range(40):                       # quiet frames until the client goes
            time.sleep(0.05)
            yield b'{"records": 0, "offset_ns": 0}\n'

    def w2():
        time.sleep(0.5)                           # answers after w1's backlog is in
        yield {"follow": True, "node": "w2"}      # an older agent: no raw records
    a1, a2 = _serve(tmp_path, "w1", w1), _serve(tmp_path, "w2", w2)
    try:
        rc, out, err = _observe(["--follow", "--last", "5", "-o", "jsonl", "-n", "--agent", f"w1={a1.path}",
                                 "--agent", f"w2={a2.path}", "--until", f"@{now + 1.5}"])
    finally:
        a1.stop()
        a2.stop()
    assert rc == 1 and "node w2 did not answer" in err and "Traceback" not in err, err
    assert [json.loads(line)["sport"] for line in out.splitlines()] == [40001, 40002], (out, err)


def test_frames_count_every_loss_exactly() -> None:
    ring = [0]
    c = FlowCollector("n1", source=lambda ms: (time.sleep(ms / 1000), (b"", 0))[1], follower_queue=100,
                      ring_lost_source=lambda: ring[0])
    c.check_ring_lost()
    it = c.follow_frames(batch=50)
    first = next(it)
    assert first["follow"] and first["flows"] == [] and first["record_size"] == 128
    rnd = random.Random(1)
    for i in range(25):
        c.add_records(b"".join(record(rnd, i * 10 + j) for j in range(10)))
    ring[0] = 17
    c.check_ring_lost()
    seen, lost, ring_lost = [], 0, 0
    while len(seen) < 100:
        head, _, data = next(it).partition(b"\n")
        head = json.loads(head)
        assert len(data) == head["records"] * 128 and head["records"] <= 50
        seen += [int.from_bytes(data[i * 128:i * 128 + 8], "little") for i in range(head["records"])]
        lost += head["lost"]
        ring_lost += head["ring_lost"]
    assert seen == list(range(100)) and lost == 150 and ring_lost == 17
    it.close()
    assert c.followers == 0


def test_two_followers_see_the_same_records() -> None:
    c = FlowCollector("n1", source=lambda ms: (time.sleep(ms / 1000), (b"", 0))[1])
    its = [c.follow_frames(), c.follow_frames()]
    for it in its:
        next(it)
    rnd = random.Random(2)
    sent = [record(rnd, i) for i in range(1000)]
    for i in range(0, 1000, 100):
        c.add_records(b"".join(sent[i:i + 100]))
    for it in its:
        got = b""
        while len(got) < 1000 * 128:
            got += next(it).partition(b"\n")[2]
        assert got == b"".join(sent)
        it.close()


def test_decoder_spells_fields_as_the_commands_do() -> None:
    raw = TRACE_EVENT.pack(
        ts_ns=5, ifindex=3, pkt_len=60, point=1, verdict=2, reason=1, family=V6, proto=6, ct_status=0,
        delivery=2, src_network=1, dst_network=2, src_segment=256, dst_segment=257,
        saddr=b"\0" * 10 + b"\xff\xff" + bytes([10, 0, 0, 1]), daddr=bytes.fromhex("fd000000000000000000000000000001"),
        sport=40000, dport=443, policy_id=7, nat_addr=bytes(16), nat_port=0, nat_kind=0, tcp_flags=0x02,
        delivery_ifindex=9, sid=bytes.fromhex("fc000001000000000000000000000000"), node_id=3, rule=0xFFFF)
    e = decode_trace_event(raw)
    assert (e["saddr"], e["daddr"]) == ("::ffff:a00:1", "fd00::1")     # v4-mapped as ipaddress spells it
    assert (e["sport"], e["dport"], e["tcp_flags"], e["verdict"], e["family"]) == (40000, 443, ["syn"], "drop", "ipv6")
    assert (e["nat_addr"], e["nat_port"], e["nat_kind"]) == (None, None, "none")
    assert e["sid"] == "fc00:1::" and e["rule"] == 0xFFFF and e["delivery"] == "remote"
    unknown = decode_trace_event(TRACE_EVENT.pack(verdict=200, reason=1000, family=9, saddr=b"\1" * 16, delivery=1,
                                                  sid=b"\1" * 16))
    assert (unknown["verdict"], unknown["reason"], unknown["family"]) == (200, 1000, 9)
    assert unknown["saddr"] == "01" * 16 and unknown["sid"] is None
