"""FlowCollector: history, filters, fan-out to followers, a slow follower told what it lost, and
the /v1/flows handler — with a fake ring source (no kernel)."""

from __future__ import annotations

import threading
import time
from typing import Any

from lace.agent.flows import FlowCollector, parse_filter


def ev(i: int, **kw: Any) -> dict[str, Any]:
    base = {"ts_ns": time.monotonic_ns(), "verdict": "forward", "proto": "tcp", "saddr": "10.0.0.1",
            "daddr": "10.0.0.2", "sport": 1000 + i, "dport": 80, "seq": i}
    base.update(kw)
    return base


def collector(**kw: Any) -> FlowCollector:
    return FlowCollector("n1", source=lambda ms, deliver: time.sleep(ms / 1000), decode=lambda raw: {}, **kw)


def test_history_is_bounded_and_has_wall_time() -> None:
    c = collector(capacity=5)
    for i in range(12):
        c.add(ev(i))
    h = c.history()
    assert [e["seq"] for e in h] == [7, 8, 9, 10, 11]
    assert all(e["node"] == "n1" and abs(e["time"] - time.time()) < 5 for e in h)
    assert [e["seq"] for e in c.history(2)] == [10, 11]


def test_filters() -> None:
    f = parse_filter({"verdict": "drop", "ip": "10.0.0.0/24", "port": "80", "proto": "tcp"})
    assert f(ev(1, verdict="drop"))
    assert not f(ev(1))
    assert not f(ev(1, verdict="drop", proto="udp"))
    assert not parse_filter({"ip": "192.168.0.0/16"})(ev(1))
    assert parse_filter({"pod_ip": "10.0.0.2"})(ev(1))


def test_fan_out_and_slow_follower_is_told_what_it_lost() -> None:
    c = collector(follower_queue=4)
    fast, slow = c.follow(), c.follow()
    got_fast: list[dict] = []
    ready = threading.Event()

    def run_fast() -> None:
        ready.set()
        for d in fast:
            if "seq" in d:
                got_fast.append(d)
                if len(got_fast) == 10:
                    return

    # start both generators (they register on first next())
    t = threading.Thread(target=run_fast)
    first_slow: list[dict] = []
    t_slow = threading.Thread(target=lambda: first_slow.append(next(slow)))
    t.start()
    t_slow.start()
    ready.wait()
    time.sleep(0.2)
    assert c.followers == 2
    for i in range(10):
        c.add(ev(i))
        time.sleep(0.005)
    t.join(5)
    t_slow.join(5)
    assert [d["seq"] for d in got_fast] == list(range(10))
    docs = first_slow + [next(slow) for _ in range(5)]
    # the slow follower got what fit in its queue, in order, and was told how many it lost
    assert [d["seq"] for d in docs if "seq" in d] == [0, 1, 2, 3, 4]
    assert [d["lost"] for d in docs if "lost" in d] == [5]
    slow.close()
    fast.close()
    assert c.followers == 0


def test_handler_list_and_follow() -> None:
    c = collector()
    for i in range(3):
        c.add(ev(i, verdict="drop" if i == 1 else "forward"))
    (method, path, handler), = c.routes()
    assert (method, path) == ("GET", "/v1/flows")
    status, body = handler({"_query": {"verdict": "drop"}})
    assert status == 200 and [e["seq"] for e in body["flows"]] == [1]
    status, body = handler({"_query": {"verdict": "nope"}})
    assert status == 400
    status, it = handler({"_query": {"follow": "1", "last": "2"}})
    assert [next(it)["seq"], next(it)["seq"]] == [1, 2]
    it.close()
