"""Many frontends for one backend port: a pod behind a dozen dual-stack Services and a NodePort
(more frontends than a backend's revnat entry names) answers through every one of them, from pods
on its own node and on others and from the outside, and the status says how the agent serves it."""

from __future__ import annotations

import json

from .conftest import pod, status_doc, wait_for
from .test_nodestate import node_cmd
from .test_outside import node_addr, outside_get

SERVICES = 12


def web_service(name: str, ns: str, type_: str = "ClusterIP") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"type": type_, "selector": {"app": "many"}, "ipFamilyPolicy": "PreferDualStack",
                     "ports": [{"name": "http", "port": 80, "targetPort": 80}]}}


def test_every_frontend_of_a_backend_port_shared_by_a_dozen_services_answers(lab, ns):
    lab.apply([pod("many", ns, "worker-2", labels={"app": "many"}, udp=()),
               pod("near", ns, "worker-2", tcp=(), udp=()), pod("far", ns, "worker-1", tcp=(), udp=())])
    lab.wait(ns, ["many", "near", "far"])
    lab.apply([web_service(f"s{i}", ns) for i in range(SERVICES)] + [web_service("np", ns, "NodePort")])
    vips = []
    for i in range(SERVICES):
        _, out, _ = lab.lace("get", "services", f"s{i}", "-n", ns, "-o", "json")
        vips += json.loads(out)["spec"]["clusterIPs"]
    _, out, _ = lab.lace("get", "services", "np", "-n", ns, "-o", "json")
    node_port = int(json.loads(out)["spec"]["ports"][0]["nodePort"])

    for client in ("near", "far"):
        for vip in vips:
            wait_for(lambda: lab.check(f"{ns}/{client}", "tcp", vip, 80)[0], f"{client} -> {vip}:80", timeout=30)
            ok, out = lab.check(f"{ns}/{client}", "tcp", vip, 80)
            assert ok and out == f"{ns}/many", f"{client} -> {vip}: {out}"
    for node in ("worker-1", "worker-2", "worker-3"):
        for family in (4, 6):
            addr = node_addr(lab, node, family)
            wait_for(lambda: outside_get(lab, addr, node_port) == f"{ns}/many", f"outside -> {addr}:{node_port}",
                     timeout=30)
    # the backend is flagged on the clients' nodes: its new flows keep a backend entry
    for node in ("worker-1", "worker-2"):
        _, out = node_cmd(lab, node, "bpf", "show", "services", "--endpoints")
        assert f"({ns}/many) reply-entry" in out, out
    # every frontend works, so the services line is OK; the JSON says how many backends keep reply
    # entries and how many frontends their revnat entries leave to them
    doc = status_doc(lab, "worker-1", "worker-2")
    for node in ("worker-1", "worker-2"):
        svc = next(s for s in doc["nodes"][node]["subsystems"] if s["name"] == "services")
        assert svc["ok"], svc
        assert svc["pressure"]["replyEntryBackends"] >= 1 and svc["pressure"]["revnatLeftOut"] >= 1, svc
