"""Services in the lab: the controllers process turns a Service with a selector over running pods
into EndpointSlices holding the pods' addresses, and follows a pod's deletion."""

from __future__ import annotations

import json

from .conftest import ips, pod, wait_for


def service(name: str, ns: str, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
                     **spec}}


def slices(lab, ns: str) -> dict[str, dict]:
    _, out, _ = lab.lace("get", "endpointslices", "-n", ns, "-o", "json")
    return {s["metadata"]["name"]: s for s in json.loads(out)["items"]}


def endpoints(lab, ns: str, family: str) -> dict[str, dict]:
    """address -> endpoint, over the service's slices of one family."""
    return {a: ep for s in slices(lab, ns).values() if s["addressType"] == family
            for ep in s["endpoints"] for a in ep["addresses"]}


def named(p: dict, port: int) -> dict:
    p["spec"]["containers"][0]["ports"][0]["name"] = "http"
    p["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    return p


def test_service_over_running_pods_gets_their_addresses_and_follows_a_delete(lab, ns):
    assert lab.status()["controllersPid"]
    lab.apply([named(pod("w1", ns, "worker-1", labels={"app": "web"}), 80),
               named(pod("w2", ns, "worker-2", labels={"app": "web"}), 80),
               pod("db", ns, "worker-3", labels={"app": "db"})])
    ps = lab.wait(ns, ["w1", "w2", "db"])
    lab.apply([service("web", ns, ipFamilyPolicy="PreferDualStack")])
    want4 = {ips(ps["w1"])[0], ips(ps["w2"])[0]}
    want6 = {ips(ps["w1"])[1], ips(ps["w2"])[1]}
    wait_for(lambda: set(endpoints(lab, ns, "IPv4")) == want4 and set(endpoints(lab, ns, "IPv6")) == want6,
               "the slices to hold w1 and w2")
    for family in ("IPv4", "IPv6"):
        for address, ep in endpoints(lab, ns, family).items():
            assert ep["conditions"] == {"ready": True, "serving": True, "terminating": False}, address
            assert ep["nodeName"] in ("worker-1", "worker-2") and ep["targetRef"]["kind"] == "Pod"
    (sl,) = [s for s in slices(lab, ns).values() if s["addressType"] == "IPv4"]
    assert sl["ports"] == [{"name": "http", "protocol": "TCP", "port": 80}]
    assert sl["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
    _, out, _ = lab.lace("get", "svc", "web", "-n", ns)
    header, row = out.splitlines()
    assert header.split()[:5] == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"]
    assert row.split()[:2] == ["web", "ClusterIP"] and row.split()[2].startswith("10.96.")
    _, out, _ = lab.lace("get", "endpointslices", "-n", ns)
    assert out.splitlines()[0].split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]

    # a graceful delete: the kubelet stops w1 and removes it; lace delete waits for that
    lab.lace("delete", "pod", "w1", "-n", ns)
    assert "w1" not in lab.pods(ns)
    wait_for(lambda: set(endpoints(lab, ns, "IPv4")) == {ips(ps["w2"])[0]}
               and set(endpoints(lab, ns, "IPv6")) == {ips(ps["w2"])[1]}, "w1 to leave the slices")

    # a restarted controller carries on: a new pod joins
    lab.lace("lab", "restart-controllers")
    lab.apply([named(pod("w3", ns, "worker-3", labels={"app": "web"}), 80)])
    w3 = lab.wait(ns, ["w3"])["w3"]
    wait_for(lambda: ips(w3)[0] in endpoints(lab, ns, "IPv4"), "w3 to join the slices")
    lab.lace("delete", "service", "web", "-n", ns)
    wait_for(lambda: not slices(lab, ns), "the slices to go with the service")
