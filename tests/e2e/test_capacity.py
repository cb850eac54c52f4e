"""Conntrack capacity in the shared lab: a pod floods new flows against its per-pod conntrack limit
(its Network's conntrackLimit). The flood stops at the limit — the rest drop as ct-endpoint-limit,
visible in ``node trace flow``, ``lace observe`` and the metrics —, another pod's established TCP
connection on the same node keeps going, ``lace status`` warns naming the pod while it lasts (the
node stays healthy) and clears once the flood's entries expired and the agent's GC pass recounted;
then the pod opens new flows again."""

from __future__ import annotations

import json
import sys
import threading
import uuid

import pytest

from .conftest import NETCHECK, ips, namespace, network, pod, wait_for

LIMIT = 100
FLOOD = 3 * LIMIT
#: the agent walks the conntrack tables every 10 s (--ct-gc-interval); UDP entries without a reply
#: expire after 30 s (LACE_CT_TIMEOUT_UDP)
GC_WAIT = 30.0
EXPIRY_WAIT = 90.0

# one UDP datagram to each of FLOOD ports of the sink: FLOOD new flows, as fast as a socket goes
FLOOD_SCRIPT = ("import socket, sys\n"
                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "for p in range(20000, 20000 + int(sys.argv[2])):\n"
                "    s.sendto(b'flood', (sys.argv[1], p))\n")


@pytest.fixture(scope="module")
def scene(lab):
    ns = f"cap-{uuid.uuid4().hex[:6]}"
    net = f"ctlim{uuid.uuid4().hex[:4]}"
    limited = network(net, "10.78.0.0/16", "fd78::/64")
    limited["spec"]["conntrackLimit"] = LIMIT
    lab.apply([namespace(ns), limited,
               pod("flood", ns, "worker-1", network=net), pod("sink", ns, "worker-2", network=net),
               pod("client", ns, "worker-1"), pod("server", ns, "worker-2")])
    ps = lab.wait(ns, ["flood", "sink", "client", "server"])
    yield {"ns": ns, "net": net, "flood4": ips(ps["flood"])[0], "sink4": ips(ps["sink"])[0],
           "server4": ips(ps["server"])[0]}
    lab.lace("delete", "namespace", ns, check=False)
    for name in ("flood", "sink", "client", "server"):
        lab.wait_gone(ns, name)
    lab.lace("delete", "network", net, check=False)


def node_json(lab, node: str, *argv: str) -> dict:
    rc, out, err = lab.lace("exec", "--node", node, "--", "node", *argv, "-o", "json", check=False)
    assert rc == 0, err
    return json.loads(out)


def conntrack(lab) -> dict:
    """worker-1's conntrack subsystem, as ``lace status`` reports it."""
    rc, out, err = lab.lace("status", "--node", "worker-1", "-o", "json", check=False)
    doc = json.loads(out)["nodes"]["worker-1"]
    return next(s for s in doc["subsystems"] if s["name"] == "conntrack")


def metric(lab, family: str) -> list[dict]:
    _, out, _ = lab.lace("metrics", "--node", "worker-1", "-o", "json")
    return (json.loads(out)["nodes"]["worker-1"].get(family) or {}).get("samples") or []


def test_a_flood_stops_at_the_pods_limit_named_and_others_keep_their_flows(lab, scene):
    ns = scene["ns"]
    flooder = f"{ns}/flood"
    veth = node_json(lab, "worker-1", "bpf", "show", "veth")
    assert [e["ct_max"] for e in veth["entries"] if e["pod"] == flooder] == [LIMIT], \
        "the pod's veth entry carries its network's limit"

    # another pod on the same node holds one TCP connection through the whole flood
    held: dict = {}

    def hold() -> None:
        held["rc"], held["out"] = lab.exec(f"{ns}/client", *NETCHECK, "hold", scene["server4"], "80", "6")

    t = threading.Thread(target=hold)
    t.start()
    rc, out = lab.exec(flooder, sys.executable, "-c", FLOOD_SCRIPT, scene["sink4"], str(FLOOD))
    assert rc == 0, out
    t.join(timeout=60)
    assert held.get("rc") == 0 and f"answered by {ns}/server" in held["out"], f"the connection broke: {held}"

    # the datapath refused the flood past the limit, each refusal named
    flows = node_json(lab, "worker-1", "trace", "flow", "--last", "1000", "--verdict", "drop",
                      "--ip", scene["flood4"])["flows"]
    refused = [f for f in flows if f["reason"] == "ct-endpoint-limit"]
    assert len(refused) >= FLOOD - LIMIT - 5, f"{len(refused)} refusals traced"
    observed = wait_for(lambda: [f for f in json.loads(lab.lace(
        "observe", "--namespace", ns, "--drop-reason", "ct-endpoint-limit", "-o", "json")[1])["flows"]],
        "the refusals in lace observe", 15)
    assert all(f["verdict"] == "drop" and f["node"] == "worker-1" for f in observed)
    drops = [s for s in metric(lab, "lace_datapath_packets")
             if s["labels"].get("reason") == "ct-endpoint-limit"]
    assert drops and sum(s["value"] for s in drops) >= FLOOD - LIMIT - 5, drops

    # status warns, naming the pod, while it lasts; the node stays healthy
    ct = wait_for(lambda: (lambda s: s if s.get("warning") else None)(conntrack(lab)),
                  "the conntrack warning", GC_WAIT, 0.5)
    assert f"{flooder} is at its conntrack limit in ct-udp-v4 ({LIMIT}/{LIMIT} flows)" in ct["warning"]
    rc, out, _ = lab.lace("status", "--node", "worker-1", check=False)
    assert rc == 0 and "worker-1: healthy, 1 warning" in out and "conntrack    WARNING" in out, out
    at_limit = metric(lab, "lace_conntrack_endpoint_at_limit")
    assert [(s["labels"]["pod"], s["labels"]["table"], s["value"]) for s in at_limit] == \
        [(flooder, "ct-udp-v4", LIMIT)]
    ok, _ = lab.check(flooder, "udp", scene["sink4"], 53, timeout=0.5)
    assert not ok, "at its limit, the pod opens no new flow"

    # the flood's entries expire, the GC pass recounts: the warning clears, new flows open again
    wait_for(lambda: conntrack(lab).get("warning") is None, "the conntrack warning to clear", EXPIRY_WAIT, 1.0)
    assert not metric(lab, "lace_conntrack_endpoint_at_limit")
    ok, out = lab.check(flooder, "udp", scene["sink4"], 53)
    assert ok, out


# ---- the masquerade port space -------------------------------------------------------------------

#: a destination's masquerade ports (lace.datapath.masquerade.MASQ_PORT_COUNT) and half as many
#: again: each new flow tries MASQ_TRIES of them, so the space fills to the brim and the rest fail
MASQ_FLOOD = 24576
#: a port nothing listens on in the outside: its kernel answers port unreachable, so every flow
#: stays unreplied and expires after 30 s (LACE_CT_TIMEOUT_UDP)
DEAD_PORT = 9

# In one process in the pod: a UDP flow to the outside's echo server answered, then MASQ_FLOOD new
# flows to DEAD_PORT (a raw socket writes each UDP header, one source port each), then the first
# flow's socket asks again: it must still be answered, through the port its flow was given.
MASQ_SCRIPT = r"""
import socket, struct, sys
dst, echo_port, dead_port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kept = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
kept.settimeout(3)
kept.sendto(b"before", (dst, echo_port))
print("before", kept.recvfrom(64)[0].decode())
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
for i in range(n):
    raw.sendto(struct.pack("!HHHH", 1024 + i, dead_port, 13, 0) + b"flood", (dst, 0))
kept.sendto(b"after", (dst, echo_port))
print("after", kept.recvfrom(64)[0].decode())
"""


@pytest.fixture
def masq_scene(lab):
    from lace.lab import topology
    from lace.cli.connectivity.outside import OutsideServer

    ns = f"nat-{uuid.uuid4().hex[:6]}"
    net = f"natfill{uuid.uuid4().hex[:4]}"
    nat = network(net, "10.79.0.0/16", "fd79::/64", routes=[{"to": "outside", "masquerade": True}])
    nat["spec"]["conntrackLimit"] = 0        # no per-pod limit: the port space is what runs out
    srv = OutsideServer(lab.status()["outside"], topology.INTERNET4, topology.INTERNET6)
    try:
        lab.apply([namespace(ns), nat, pod("nat", ns, "worker-1", network=net)])
        ps = lab.wait(ns, ["nat"])
        yield {"ns": ns, "pod4": ips(ps["nat"])[0], "internet4": topology.INTERNET4, "echo": srv.udp_port}
    finally:
        srv.close()
        lab.lace("delete", "namespace", ns, check=False)
        lab.wait_gone(ns, "nat")
        lab.lace("delete", "network", net, check=False)


def test_a_full_masquerade_port_space_drops_named_warns_keeps_flows_and_recovers(lab, masq_scene):
    from lace.datapath.masquerade import MASQ_PORT_COUNT

    sc = masq_scene
    client = f"{sc['ns']}/nat"
    before = sum(s["value"] for s in metric(lab, "lace_datapath_packets") if s["labels"].get("reason") == "nat-failed")
    rc, out = lab.exec(client, sys.executable, "-c", MASQ_SCRIPT, sc["internet4"], str(sc["echo"]),
                       str(DEAD_PORT), str(MASQ_FLOOD))
    # the flow that was there before the port space filled keeps its port: still answered
    assert rc == 0 and "before before" in out and "after after" in out, out

    # the flows past the port space are dropped, named, in trace and metrics
    failed = sum(s["value"] for s in metric(lab, "lace_datapath_packets")
                 if s["labels"].get("reason") == "nat-failed") - before
    assert failed >= MASQ_FLOOD - MASQ_PORT_COUNT, f"{failed} nat-failed drops for {MASQ_FLOOD} flows"
    flows = node_json(lab, "worker-1", "trace", "flow", "--last", "200", "--verdict", "drop",
                      "--ip", sc["pod4"])["flows"]
    assert any(f["reason"] == "nat-failed" for f in flows), [f["reason"] for f in flows][:10]

    # status warns, naming the destination, while the space is full; the node stays healthy
    dest = f"masquerade ports to {sc['internet4']}:{DEAD_PORT}/udp"
    ct = wait_for(lambda: (lambda s: s if dest in (s.get("warning") or "") else None)(conntrack(lab)),
                  "the masquerade warning", GC_WAIT, 0.5)
    assert "new flows there drop as nat-failed" in ct["warning"], ct
    used = [s for s in metric(lab, "lace_masquerade_ports_used")
            if s["labels"].get("remote") == sc["internet4"] and s["labels"].get("port") == str(DEAD_PORT)]
    assert used and used[0]["value"] > 0.9 * MASQ_PORT_COUNT, used
    rc, out, _ = lab.lace("status", "--node", "worker-1", check=False)
    assert rc == 0 and "worker-1: healthy" in out, out

    # the flows expire, the GC pass frees their ports: the warning clears, a new flow goes out again
    wait_for(lambda: dest not in (conntrack(lab).get("warning") or ""), "the masquerade warning to clear",
             EXPIRY_WAIT, 1.0)
    t0 = failed
    rc, out = lab.exec(client, sys.executable, "-c", MASQ_SCRIPT, sc["internet4"], str(sc["echo"]),
                       str(DEAD_PORT), "1")
    assert rc == 0 and "after after" in out, out
    again = sum(s["value"] for s in metric(lab, "lace_datapath_packets")
                if s["labels"].get("reason") == "nat-failed") - before
    assert again == t0, f"a new flow after recovery failed to get a port ({again - t0} more nat-failed)"
