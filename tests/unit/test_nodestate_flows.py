"""FlowCollector: history, filters, fan-out to followers, a slow follower told what it lost, and
the /v1/flows handler — with raw ring buffer records and no kernel."""

from __future__ import annotations

import threading
import time
import tracemalloc
from typing import Any

import orjson

from lace.agent.flows import FRAMES_CONTENT_TYPE, FlowCollector, parse_filter
from lace.datapath.trace import TRACE_EVENT

V4 = 4
TCP, UDP = 6, 17
DROP, FORWARD = 2, 1


def record(i: int, **kw: Any) -> bytes:
    """A policy-relevant TCP flow record; ``i`` is its source port - 1000 (the tests' sequence)."""
    fields = {"ts_ns": time.monotonic_ns(), "ifindex": 3, "pkt_len": 60, "verdict": FORWARD, "family": V4,
              "proto": TCP, "saddr": bytes([10, 0, 0, 1]), "daddr": bytes([10, 0, 0, 2]), "sport": 1000 + i,
              "dport": 80}
    fields.update(kw)
    return TRACE_EVENT.pack(**fields)


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["sport"] - 1000 for e in events if "sport" in e]


def collector(**kw: Any) -> FlowCollector:
    return FlowCollector("n1", source=lambda ms: (time.sleep(ms / 1000), (b"", 0))[1], **kw)


def wait_for(cond: Any, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


def test_history_is_bounded_by_records_and_has_wall_time() -> None:
    c = collector(capacity=5)
    c.add_records(b"".join(record(i) for i in range(3)))
    c.add_records(b"".join(record(i) for i in range(3, 12)))
    h = c.history()
    assert seqs(h) == [7, 8, 9, 10, 11]
    assert all(e["node"] == "n1" and abs(e["time"] - time.time()) < 5 for e in h)
    assert seqs(c.history(2)) == [10, 11]
    assert c.stats()["kept"] == 5 and c.received == 12


def test_history_wraps_round_its_buffer_keeping_order_and_each_records_clock() -> None:
    c = collector(capacity=7)
    base = c._offset_ns
    for start, n in ((0, 1), (1, 3), (4, 1), (5, 4), (9, 2)):   # 11 records: the buffer wraps
        if start == 5:
            c._offset_ns = base + 10**9                         # a clock step between reads
        c.add_records(b"".join(record(i, ts_ns=10**12 + i) for i in range(start, start + n)))
    h = c.history()
    assert seqs(h) == [4, 5, 6, 7, 8, 9, 10] and c.stats()["kept"] == 7
    # records read after the step show it in their wall time, older ones do not
    assert [round(e["time"] - (10**12 + e["sport"] - 1000) / 1e9 - base / 1e9) for e in h] == [0, 1, 1, 1, 1, 1, 1]
    # the records are copied out: a later write does not change a history already answered
    blocks = c.history_buf.blocks()
    c.add_records(b"".join(record(i) for i in range(11, 18)))
    assert b"".join(b.data for b in blocks) == b"".join(record(i, ts_ns=10**12 + i) for i in range(4, 11))


def test_history_memory_is_allocated_up_front() -> None:
    """A quiet node's records come one per read; the history's memory does not grow with them."""
    c = collector(capacity=1000)
    recs = [record(i % 100) for i in range(1000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for r in recs:
            c.add_records(r)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a block object per read would hold ~250 KB here
    assert grown < 16 * 1024, f"the history grew by {grown} bytes while filling"
    assert c.stats()["kept"] == 1000 and len(c.history()) == 1000


def test_records_of_another_size_are_counted_not_decoded() -> None:
    c = collector()
    c.add_records(record(1) + record(2)[:100], others=2)
    assert c.received == 1 and c.errors == 3 and seqs(c.history()) == [1]


def test_filters() -> None:
    ev = lambda **kw: {"verdict": "forward", "proto": "tcp", "saddr": "10.0.0.1", "daddr": "10.0.0.2",  # noqa: E731
                       "sport": 1000, "dport": 80, "nat_port": None, "time": 100.0, **kw}
    f = parse_filter({"verdict": "drop", "ip": "10.0.0.0/24", "port": "80", "proto": "tcp"})
    assert f(ev(verdict="drop"))
    assert not f(ev())
    assert not f(ev(verdict="drop", proto="udp"))
    assert not parse_filter({"ip": "192.168.0.0/16"})(ev())
    assert parse_filter({"pod_ip": "10.0.0.2"})(ev())
    assert parse_filter({"since": "99"})(ev()) and not parse_filter({"until": "99"})(ev())
    assert parse_filter({}) is None


def test_filtering_records_decides_once_per_flow_and_times_per_event() -> None:
    c = collector()
    base = time.monotonic_ns()
    # one dropped flow in packets of different lengths and times, and a forwarded one
    recs = [record(1, verdict=DROP, pkt_len=60 + i, ts_ns=base + i * 10**9) for i in range(4)]
    recs += [record(2, ts_ns=base + 5 * 10**9)]
    since = (base + 1_500_000_000 + c._offset_ns) / 1e9
    f = parse_filter({"verdict": "drop", "since": repr(since)})
    c.add_records(b"".join(recs))
    got = c.history(filt=f)
    assert [(e["sport"], e["pkt_len"]) for e in got] == [(1001, 62), (1001, 63)]
    sel = f.select(c.history_buf.blocks()[0])
    assert sel.count == 2 and sel.data == recs[2] + recs[3]
    assert len(f._answers) == 2        # two flows, two decisions


def test_fan_out_and_slow_follower_is_told_what_it_lost() -> None:
    c = collector(follower_queue=4)
    fast, slow = c.follow(), c.follow()
    got_fast: list[dict] = []

    def run_fast() -> None:
        for d in fast:
            if "sport" in d:
                got_fast.append(d)
                if len(got_fast) == 10:
                    return

    t = threading.Thread(target=run_fast)
    t.start()
    first_slow: list[dict] = []
    t_slow = threading.Thread(target=lambda: first_slow.append(next(slow)))
    t_slow.start()
    wait_for(lambda: c.followers == 2)
    c.add_records(record(0))
    t_slow.join(5)                       # the slow follower took its first event, then stalls
    for i in range(1, 10):
        c.add_records(record(i))
        wait_for(lambda: len(got_fast) == i + 1 or not t.is_alive())
    t.join(5)
    assert seqs(got_fast) == list(range(10))
    docs = first_slow + [next(slow) for _ in range(5)]
    # the slow follower got what fit in its queue, in order, and was told how many it lost
    assert seqs(docs) == [0, 1, 2, 3, 4]
    assert [d["lost"] for d in docs if "lost" in d] == [5]
    slow.close()
    fast.close()
    assert c.followers == 0


def test_handler_list_and_follow() -> None:
    c = collector()
    for i in range(3):
        c.add_records(record(i, verdict=DROP if i == 1 else FORWARD))
    (method, path, handler), = c.routes()
    assert (method, path) == ("GET", "/v1/flows")
    status, body = handler({"_query": {"verdict": "drop"}})
    assert status == 200 and seqs(body["flows"]) == [1]
    status, body = handler({"_query": {"verdict": "nope"}})
    assert status == 400
    status, body = handler({"_query": {"follow": "1", "batch": "1"}})
    assert status == 400 and "batch must be raw" in body["error"]
    status, it = handler({"_query": {"follow": "1", "last": "2"}})
    assert seqs([next(it), next(it)]) == [1, 2]
    it.close()
    status, (ctype, frames) = handler({"_query": {"follow": "1", "batch": "raw", "last": "1"}})
    first = next(frames)
    assert ctype == FRAMES_CONTENT_TYPE and first["record_size"] == TRACE_EVENT.size
    assert first["follow"] and seqs(first["flows"]) == [2]
    sent = record(5) + record(6)
    c.add_records(sent)
    head, _, data = next(frames).partition(b"\n")
    assert orjson.loads(head) == {"records": 2, "offset_ns": c._offset_ns, "lost": 0, "ring_lost": 0}
    assert data == sent
    frames.close()


def test_records_read_by_the_reader_thread_reach_history_and_followers() -> None:
    """The agent's path: the ring is read by the collector's own thread, not by the test."""
    waiting = [record(i) + record(i + 100) for i in range(3)]

    def source(ms: int) -> tuple[bytes, int]:
        if waiting:
            return waiting.pop(0), 0
        time.sleep(ms / 1000)
        return b"", 0

    c = FlowCollector("n1", source=source)
    follower = c.follow()
    got: list[dict] = []

    def take() -> None:
        for d in follower:
            if "sport" in d:
                got.append(d)
                if len(got) == 6:
                    return

    t = threading.Thread(target=take)
    t.start()
    wait_for(lambda: c.followers == 1)
    c.start()
    try:
        wait_for(lambda: c.received == 6)
        assert sorted(seqs(c.history())) == [0, 1, 2, 100, 101, 102]
        t.join(5)
        assert not t.is_alive() and sorted(seqs(got)) == [0, 1, 2, 100, 101, 102]
    finally:
        c.stop()
        follower.close()
