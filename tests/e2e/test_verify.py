"""The drift audit (docs/troubleshooting/drift-audit.md) against the shared lab: ``lace verify`` is clean; entries
corrupted behind worker-1's agent's back (a bogus route, a pod's delivery entry deleted, a veth
value changed) are listed exactly, with their maps, kinds and names, by ``node verify`` and
``lace verify`` (exit 1); ``--repair`` fixes them; bad input and a node whose agent is down are
one-line errors, the other nodes still shown.

The agent repairs drift on its own at its periodic resync (every 30 s, whatever the watch brings):
the test waits until worker-1's next resync is far enough away (its /healthz says when it is due),
then tampers and verifies at once."""

from __future__ import annotations

import json
import time

import pytest

from lace.datapath import registry
from lace.datapath.endpoint import ENDPOINT
from lace.datapath.node import PinnedMaps
from lace.datapath.routing import route_value, routing_key
from lace.cni.client import call
from lace.lab.cluster import agent_socket

from .conftest import agent_down, ips, namespace, pod

BOGUS = "192.0.2.0/24"


def health(lab, node: str) -> dict:
    _, body = call(agent_socket(lab.dir, node), "GET", "/healthz", timeout=5)
    return body


@pytest.fixture(scope="module")
def pods(lab):
    ns = "verify"
    lab.apply([namespace(ns), pod("alice", ns, "worker-1"), pod("bob", ns, "worker-2")])
    ps = lab.wait(ns, ["alice", "bob"])
    yield {"ns": ns, "pods": ps, "alice4": ips(ps["alice"])[0]}
    lab.lace("delete", "namespace", ns, check=False)


def quiet_window(lab, need: float = 25.0) -> float:
    """Wait until worker-1's agent's next periodic resync is at least ``need`` seconds away (after
    one just ran, if need be); returns when it is due (wall clock)."""
    h = health(lab, "worker-1")
    if h["next_resync"] - time.time() < need:
        deadline = time.monotonic() + 40
        while (now := health(lab, "worker-1"))["resyncs"] == h["resyncs"]:
            assert time.monotonic() < deadline, "worker-1's agent ran no periodic resync in 40 s"
            time.sleep(0.05)
        h = now
    assert h["next_resync"] - time.time() >= need, h
    return h["next_resync"]


def tamper(lab, alice4: str) -> dict:
    """Behind the agent's back, on worker-1's pinned maps: a bogus routing entry, alice's delivery
    entry deleted, alice's veth entry given another segment."""
    pm = PinnedMaps(lab.node("worker-1")["pinRoot"], "worker-1")
    dmap, vmap = registry.get("delivery"), registry.get("veth")
    with pm.open("delivery") as m:
        key = next(k for k, v in m.entries() if dmap.key_dict(k)["prefix"] == f"{alice4}/32")
        net = dmap.key_dict(key)["network"]
        ifindex = dmap.value_dict(m.lookup(key))["ifindex"]
        m.delete(key)
    with pm.open("routing") as m:
        m.update(routing_key(net, BOGUS), route_value(net))
    with pm.open("veth") as m:
        vkey = next(k for k, _ in m.entries() if vmap.key_dict(k)["ifindex"] == ifindex)
        val = ENDPOINT.unpack(m.lookup(vkey))
        segment = val["segment"]
        val["segment"] = 4242
        m.update(vkey, ENDPOINT.pack(**val))
    return {"ifindex": ifindex, "segment": segment}


def test_verify_finds_exactly_the_tampered_entries_and_repair_fixes_them(lab, pods):
    ns, alice4 = pods["ns"], pods["alice4"]
    rc, out, err = lab.lace("verify", check=False)
    assert rc == 0, out + err
    assert out.rstrip().endswith("3/3 nodes clean"), out
    due = quiet_window(lab)
    try:
        was = tamper(lab, alice4)
        rc, out, err = lab.lace("exec", "--node", "worker-1", "--", "node", "verify", "-o", "json", check=False)
        assert rc == 1, out + err
        doc = json.loads(out)
        drift = {(name, kind): m[kind] for name, m in doc["maps"].items() for kind in ("missing", "stale", "different")
                 if m[kind]}
        assert sorted(drift) == [("delivery", "missing"), ("routing", "stale"), ("veth", "different")], drift
        assert all(len(v) == 1 for v in drift.values()) and doc["total"] == 3
        (route,), (deliv,), (veth,) = drift[("routing", "stale")], drift[("delivery", "missing")], \
            drift[("veth", "different")]
        assert route["key"]["prefix"] == BOGUS and route["desired"] is None
        assert deliv["key"]["prefix"] == f"{alice4}/32" and deliv["desired"]["kind"] == "local"
        assert deliv["actual"] is None
        assert veth["key"]["ifindex"] == was["ifindex"]
        assert veth["desired"]["segment"] == was["segment"] and veth["actual"]["segment"] == 4242
        assert doc["summary"] == ("node worker-1: 3 entries drift in 3 maps "
                                  "(routing: 1 stale; delivery: 1 missing; veth: 1 different)")

        # the table: names resolved
        rc, out, err = lab.lace("exec", "--node", "worker-1", "--", "node", "verify", check=False)
        assert rc == 1, out + err
        assert f"default {BOGUS}" in out
        assert f"default {alice4}/32 ({ns}/alice)" in out
        assert f"{ns}/alice)" in out.split("veth on worker-1")[1] and "4242 (unresolved)" in out
        assert "KIND" in out and "DESIRED" in out and "ACTUAL" in out

        # cluster-wide: worker-1 named, the others clean
        rc, out, err = lab.lace("verify", check=False)
        assert rc == 1, out + err
        assert "2/3 nodes clean; worker-1: 3 entries drift" in out
        assert "node worker-2: no drift" in out and "node worker-3: no drift" in out
        rc, out, err = lab.lace("verify", "--node", "worker-1", "-o", "json", check=False)
        assert rc == 1 and json.loads(out)["nodes"]["worker-1"]["total"] == 3
        assert time.time() < due - 2, "too slow: the agent's own resync would repair the entries first"

        rc, out, err = lab.lace("verify", "--repair", check=False)
        assert rc == 0, out + err
        assert ("node worker-1: repaired 3 entries in 3 maps (routing: 1 stale; delivery: 1 missing; "
                "veth: 1 different); no drift") in out
    finally:
        lab.lace("verify", "--repair", check=False)
    rc, out, err = lab.lace("verify", check=False)
    assert rc == 0, out + err
    rc, out, err = lab.lace("exec", "--node", "worker-1", "--", "node", "verify", "--map", "routing", check=False)
    assert rc == 0 and out.startswith("node worker-1: no drift in 1 map"), out


def test_bad_input_is_one_line_with_a_hint(lab):
    for argv, needle in ((["verify", "--node", "worker-9"], "worker-1, worker-2, worker-3"),
                         (["verify", "--map", "ct-tcp-v4"], "audited maps"),
                         (["verify", "--bogus"], "--help"),
                         (["exec", "--node", "worker-1", "--", "node", "verify", "--map", "nope"], "audited maps")):
        rc, out, err = lab.lace(*argv, check=False)
        assert rc == 2, (argv, out, err)
        lines = err.splitlines()
        assert lines[0].startswith("error: ") and lines[1].startswith("hint: ") and needle in err, err
        assert "Traceback" not in err


def test_a_node_whose_agent_is_down_is_named_and_the_rest_shown(lab, pods):
    with agent_down(lab, "worker-3"):
        rc, out, err = lab.lace("verify", check=False)
        assert rc == 1, out + err
        assert "node worker-3: did not answer: the agent of worker-3 is not answering" in out
        assert "node worker-1: no drift" in out and "node worker-2: no drift" in out
        assert "2/3 nodes clean; worker-3 did not answer" in out and "Traceback" not in out + err
        rc, out, _ = lab.lace("verify", "-o", "json", check=False)
        doc = json.loads(out)
        assert rc == 1 and set(doc["nodes"]) == {"worker-1", "worker-2"} and list(doc["unanswered"]) == ["worker-3"]
        rc, out, err = lab.lace("exec", "--node", "worker-3", "--", "node", "verify", check=False)
        assert rc == 5 and "worker-3" in err and "lace lab restart-agent worker-3" in err
