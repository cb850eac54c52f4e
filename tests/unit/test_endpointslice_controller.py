"""The EndpointSlice controller: the pure function from (Service, Pods) to slices, its plan, and
its loop against a real store (create, follow pod changes, restart without rewriting)."""

from __future__ import annotations

import threading
import time

import pytest

from lace.controllers import endpointslices as E
from lace.controllers.controller import EndpointSliceController
from lace.store import SqliteStore
from lace.store import kinds as K


def service(name="web", ns="default", selector=None, ports=None, families=("IPv4",), network=None, **spec):
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if network:
        meta["annotations"] = {K.NETWORK_ANNOTATION: network}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"selector": {"app": "web"} if selector is None else selector, "ipFamilies": list(families),
                     "ports": ports or [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}], **spec}}


def pod(name, ips=("10.244.1.5",), ns="default", labels=None, ready=True, deleting=False, ports=None,
        node="worker-1", network=None, phase="Running"):
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {"app": "web"}}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    if network:
        meta["annotations"] = {K.NETWORK_ANNOTATION: network}
    status = {"phase": phase, "podIPs": [{"ip": ip} for ip in ips],
              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status,
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": ports or []}]}}


def addresses(sl):
    return [a for ep in sl["endpoints"] for a in ep["addresses"]]


def test_a_pod_whose_subdomain_names_the_service_gets_its_hostname_on_its_endpoints():
    svc = service("db", families=("IPv4", "IPv6"), clusterIP="None")
    named = pod("db-0", ips=("10.244.1.5", "fd00:10:244:1::5"))
    named["spec"].update(hostname="db-0", subdomain="db")
    other = pod("x", ips=("10.244.1.6",))
    other["spec"].update(hostname="x", subdomain="web")      # another service's subdomain
    lone = pod("y", ips=("10.244.1.7",))
    lone["spec"]["hostname"] = "y"                           # a hostname without subdomain
    v4, v6 = E.desired_slices(svc, [named, other, lone])
    assert {ep["targetRef"]["name"]: ep.get("hostname") for ep in v4["endpoints"]} == {"db-0": "db-0", "x": None,
                                                                                       "y": None}
    assert v6["endpoints"][0]["hostname"] == "db-0"


def test_one_slice_per_family_with_labels_owner_and_conditions():
    svc = service(families=("IPv4", "IPv6"))
    pods = [pod("a", ips=("10.244.1.5", "fd00:10:244:1::5")), pod("b", ips=("10.244.2.6",), ready=False),
            pod("c", ips=("10.244.2.7",), deleting=True), pod("d", ips=("10.244.2.8",), ready=False, deleting=True)]
    v4, v6 = E.desired_slices(svc, pods)
    assert (v4["metadata"]["name"], v4["addressType"]) == ("web-ipv4", "IPv4")
    assert (v6["metadata"]["name"], v6["addressType"]) == ("web-ipv6", "IPv6")
    assert v4["metadata"]["labels"] == {K.SERVICE_NAME_LABEL: "web", K.MANAGED_BY_LABEL: K.ENDPOINTSLICE_CONTROLLER}
    assert v4["metadata"]["ownerReferences"][0]["uid"] == "uid-web"
    assert v4["ports"] == [{"name": "http", "protocol": "TCP", "port": 8080}]
    cond = {ep["targetRef"]["name"]: ep["conditions"] for ep in v4["endpoints"]}
    assert cond == {"a": {"ready": True, "serving": True, "terminating": False},
                    "b": {"ready": False, "serving": False, "terminating": False},
                    "c": {"ready": False, "serving": True, "terminating": True},
                    "d": {"ready": False, "serving": False, "terminating": True}}
    assert addresses(v6) == ["fd00:10:244:1::5"] and v6["endpoints"][0]["nodeName"] == "worker-1"
    published = E.desired_slices(service(publishNotReadyAddresses=True), [pod("b", ready=False)])
    assert published[0]["endpoints"][0]["conditions"]["ready"] is True


def test_only_selected_pods_of_the_namespace_and_network():
    pods = [pod("yes"), pod("other-ns", ns="x"), pod("other-labels", labels={"app": "db"}),
            pod("other-net", network="red"), pod("finished", phase="Succeeded"), pod("no-ip", ips=())]
    (sl,) = E.desired_slices(service(), pods)
    assert [ep["targetRef"]["name"] for ep in sl["endpoints"]] == ["yes"]
    (red,) = E.desired_slices(service(network="red"), pods)
    assert [ep["targetRef"]["name"] for ep in red["endpoints"]] == ["other-net"]
    # no endpoints: the family keeps one empty slice
    (empty,) = E.desired_slices(service(selector={"app": "none"}), pods)
    assert empty["metadata"]["name"] == "web-ipv4" and empty["endpoints"] == [] and empty["ports"] == []


def test_named_target_port_resolved_per_pod():
    svc = service(ports=[{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "web"},
                         {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}])
    pods = [pod("a", ports=[{"name": "web", "containerPort": 8080}]),
            pod("b", ips=("10.244.1.6",), ports=[{"name": "web", "containerPort": 8080}]),
            pod("c", ips=("10.244.1.7",), ports=[{"name": "web", "containerPort": 9090}]),
            pod("d", ips=("10.244.1.8",), ports=[{"name": "web", "containerPort": 8080, "protocol": "UDP"}])]
    slices = {tuple(p["port"] for p in s["ports"]): s for s in E.desired_slices(svc, pods)}
    assert set(slices) == {(8080, 5353), (9090, 5353), (5353,)}
    assert addresses(slices[(8080, 5353)]) == ["10.244.1.5", "10.244.1.6"]
    assert addresses(slices[(9090, 5353)]) == ["10.244.1.7"]
    assert addresses(slices[(5353,)]) == ["10.244.1.8"]        # no TCP port named web: only dns
    names = sorted(s["metadata"]["name"] for s in slices.values())
    assert len(set(names)) == 3 and all(n.startswith("web-ipv4-") for n in names)
    # the names depend on the port mappings only, so a restarted controller finds them again
    assert names == sorted(s["metadata"]["name"] for s in E.desired_slices(svc, list(reversed(pods))))


def test_a_slice_holds_at_most_1000_endpoints():
    pods = [pod(f"p{i:04d}", ips=(f"10.244.{i // 250}.{i % 250 + 1}",)) for i in range(1500)]
    slices = E.desired_slices(service(), pods)
    assert [s["metadata"]["name"] for s in slices] == ["web-ipv4", "web-ipv4-2"]
    assert [len(s["endpoints"]) for s in slices] == [1000, 500]


def test_selectorless_services_and_foreign_slices_are_left_alone():
    svc = service(selector={})
    assert E.desired_slices(svc, [pod("a")]) == []
    user = {"apiVersion": K.DISCOVERY_API_VERSION, "kind": "EndpointSlice",
            "metadata": {"name": "web-ipv4", "namespace": "default", "labels": {K.SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4", "endpoints": [], "ports": []}
    assert E.plan("default/web", [], [user]) == ([], [], [])
    # a desired slice whose name a user's slice holds is not written over
    writes, deletes, blocked = E.plan("default/web", E.desired_slices(service(), [pod("a")]), [user])
    assert (writes, deletes, blocked) == ([], [], ["web-ipv4"])
    # managed slices of the service that are no longer wanted go; other services' stay
    mine = E.desired_slices(service(), [pod("a")])[0]
    theirs = E.desired_slices(service(name="db"), [pod("a")])[0]
    assert E.plan("default/web", [], [mine, theirs]) == ([], [mine], [])
    assert E.plan("default/web", [mine], [mine, theirs]) == ([], [], [])


# ---- the loop against a store ------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "store.db", poll_interval=0.005)
    yield s
    s.close()


class Running:
    """The controller in a thread of this process."""

    def __init__(self, store):
        self.controller = EndpointSliceController(store, resync=0.5)
        self.thread = threading.Thread(target=self.controller.run)
        self.thread.start()

    def stop(self):
        self.controller.stop()
        self.thread.join(5)
        assert not self.thread.is_alive()


def wait_for(fn, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def stored_pod(store, name, ip):
    store.apply({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
                 "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "ports": [{"containerPort": 8080}]}]}})
    store.update_status("pods", name, "default", {"phase": "Running", "podIPs": [{"ip": ip}],
                                                  "conditions": [{"type": "Ready", "status": "True"}]})


def slice_addresses(store, name="web-ipv4"):
    try:
        return sorted(addresses(store.get("endpointslices", name)))
    except Exception:
        return None


def test_loop_follows_pods_restarts_idempotently_and_leaves_user_slices(store):
    stored_pod(store, "a", "10.244.1.5")
    store.apply(service() | {"metadata": {"name": "web", "namespace": "default"}})
    user = {"apiVersion": K.DISCOVERY_API_VERSION, "kind": "EndpointSlice",
            "metadata": {"name": "ext-1", "namespace": "default", "labels": {K.SERVICE_NAME_LABEL: "ext"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["192.0.2.10"]}], "ports": [{"port": 443}]}
    store.apply_all([service(name="ext", selector={}) | {"metadata": {"name": "ext", "namespace": "default"}}, user])
    running = Running(store)
    try:
        wait_for(lambda: slice_addresses(store) == ["10.244.1.5"])
        stored_pod(store, "b", "10.244.2.6")
        wait_for(lambda: slice_addresses(store) == ["10.244.1.5", "10.244.2.6"])
        store.delete("pods", "a")
        wait_for(lambda: slice_addresses(store) == ["10.244.2.6"])
    finally:
        running.stop()
    rev = store.revision()
    running = Running(store)        # a restart recomputes everything and writes nothing
    try:
        wait_for(lambda: running.controller.stats["reconciles"] >= 2)
        time.sleep(0.3)
        assert store.revision() == rev and running.controller.stats["writes"] == 0
        assert store.get("endpointslices", "ext-1")["endpoints"] == user["endpoints"]
        # a managed slice deleted by hand comes back; the service's deletion takes its slices along
        store.delete("endpointslices", "web-ipv4")
        wait_for(lambda: slice_addresses(store) == ["10.244.2.6"])
        store.delete("services", "web")
        wait_for(lambda: slice_addresses(store) is None)
        assert [s["metadata"]["name"] for s in store.list("endpointslices").items] == ["ext-1"]
    finally:
        running.stop()
