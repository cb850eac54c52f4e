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
