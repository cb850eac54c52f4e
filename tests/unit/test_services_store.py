"""Services in the store: ClusterIPs, NodePorts, LoadBalancer addresses and IDs allocated with the
Service's own write, per network, freed on delete, never half-written; Network imports. Run
against every backend (the ``store`` fixture, tests/unit/conftest.py)."""

from __future__ import annotations

import pytest

from lace.store import Exhausted, Forbidden, ValidationError
from lace.store import kinds as K


def svc(name, ns="default", network=None, annotations=None, **spec):
    meta = {"name": name, "namespace": ns, "annotations": dict(annotations or {})}
    if network:
        meta["annotations"][K.NETWORK_ANNOTATION] = network
    spec.setdefault("ports", [{"port": 80}])
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def net(name, cidrs, **spec):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": name},
            "spec": {"cidrs": cidrs, **spec}}


def pool(name, cidrs):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "LoadBalancerIPPool", "metadata": {"name": name},
            "spec": {"cidrs": cidrs}}


def allocations(store):
    return sorted(o["metadata"]["name"] for o in store.list("serviceallocations").items)


def rejected(store, exc, objs):
    """Apply ``objs``, expect ``exc``, and check that nothing at all was written."""
    rev, held = store.revision(), allocations(store)
    with pytest.raises(exc) as info:
        store.apply_all(objs)
    assert store.revision() == rev and allocations(store) == held
    return info.value


def test_cluster_ip_defaults_id_and_reapply_unchanged(store):
    s = store.apply(svc("web", selector={"app": "web"})).object
    spec = s["spec"]
    assert spec["clusterIP"] == "10.96.0.1" and spec["clusterIPs"] == ["10.96.0.1"]
    assert spec["ipFamilies"] == ["IPv4"] and spec["ipFamilyPolicy"] == "SingleStack"
    assert s["status"] == {"id": 1, "loadBalancer": {}}
    assert allocations(store) == ["clusterip.default.10-96-0-1", "serviceid.1"]
    rev = store.revision()
    again = store.apply(svc("web", selector={"app": "web"}))
    assert again.outcome == "unchanged" and store.revision() == rev
    # status is the store's: a body's status and update_status keep the ID
    store.update_status("svc", "web", "default", {"id": 99, "loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}})
    assert store.get("svc", "web")["status"] == {"id": 1, "loadBalancer": {}}
    assert store.apply(svc("db")).object["status"]["id"] == 2


def test_dual_stack_and_families(store):
    dual = store.apply(svc("dual", ipFamilyPolicy="PreferDualStack")).object["spec"]
    assert dual["ipFamilies"] == ["IPv4", "IPv6"] and dual["clusterIPs"] == ["10.96.0.1", "fd00:10:96::1"]
    v6 = store.apply(svc("v6", ipFamilies=["IPv6"])).object["spec"]
    assert v6["clusterIPs"] == ["fd00:10:96::2"] and v6["ipFamilyPolicy"] == "SingleStack"
    required = store.apply(svc("req", ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv6", "IPv4"])).object["spec"]
    assert required["clusterIPs"] == ["fd00:10:96::3", "10.96.0.2"]
    given = store.apply(svc("given", ipFamilyPolicy="PreferDualStack",
                            clusterIPs=["10.96.7.7", "fd00:10:96::77"])).object["spec"]
    assert given["clusterIP"] == "10.96.7.7" and given["ipFamilies"] == ["IPv4", "IPv6"]
    headless = store.apply(svc("hl", clusterIP="None", selector={"a": "b"})).object
    assert headless["spec"]["clusterIPs"] == ["None"] and headless["spec"]["ipFamilies"] == ["IPv4"]
    assert not [a for a in allocations(store) if "clusterip" in a and "hl" in a]
    # a headless service without selector serves every family it may get, as in Kubernetes
    bare = store.apply(svc("bare", clusterIP="None")).object["spec"]
    assert bare["ipFamilyPolicy"] == "RequireDualStack" and bare["ipFamilies"] == ["IPv4", "IPv6"]
    # a network with one family cannot give two
    store.apply(net("blue", ["10.10.0.0/16"], serviceCIDRs=["10.110.0.0/24"]))
    err = rejected(store, ValidationError, [svc("b", network="blue", ipFamilyPolicy="RequireDualStack")])
    assert err.field == "spec.ipFamilyPolicy" and "only IPv4" in str(err)
    err = rejected(store, ValidationError, [svc("b", network="blue", ipFamilies=["IPv6"])])
    assert err.field == "spec.ipFamilies[0]" and "no IPv6 service range" in str(err)
    assert store.apply(svc("b", network="blue", ipFamilyPolicy="PreferDualStack")).object["spec"]["clusterIPs"] == \
        ["10.110.0.1"]


def test_conflicts_and_ranges_are_named_and_nothing_is_written(store):
    store.apply(svc("web", clusterIP="10.96.0.10"))
    err = rejected(store, ValidationError, [svc("ok"), svc("clash", clusterIP="10.96.0.10")])
    assert err.field == "spec.clusterIPs[0]" and 'Service "default/web"' in str(err) and err.index == 1
    err = rejected(store, ValidationError, [svc("out", clusterIP="10.97.0.1")])
    assert "outside the service ranges" in str(err) and "10.96.0.0/16" in str(err)
    err = rejected(store, ValidationError, [svc("bcast", clusterIP="10.96.255.255")])
    assert err.field == "spec.clusterIPs[0]"
    store.apply(svc("np", type="NodePort", ports=[{"port": 80, "nodePort": 30080}]))
    err = rejected(store, ValidationError, [svc("np2", type="NodePort", ports=[{"port": 81, "nodePort": 30080}])])
    assert err.field == "spec.ports[0].nodePort" and "already allocated" in str(err)


def test_update_keeps_allocations_and_refuses_changing_them(store):
    first = store.apply(svc("web", type="NodePort", ports=[{"name": "http", "port": 80}])).object
    ip, node_port, sid = first["spec"]["clusterIP"], first["spec"]["ports"][0]["nodePort"], first["status"]["id"]
    again = store.apply(svc("web", type="NodePort", ports=[{"name": "http", "port": 80, "targetPort": 8080}])).object
    assert (again["spec"]["clusterIP"], again["spec"]["ports"][0]["nodePort"], again["status"]["id"]) == \
        (ip, node_port, sid)
    assert again["metadata"]["generation"] == 2
    err = rejected(store, ValidationError, [svc("web", type="NodePort", clusterIP="10.96.9.9",
                                                ports=[{"name": "http", "port": 80}])])
    assert err.field == "spec.clusterIPs[0]" and "may not change" in str(err)
    err = rejected(store, ValidationError, [svc("web", network="blue")])
    assert err.field == "metadata.annotations.lace.dev/network"
    store.apply(net("blue", ["10.10.0.0/16"]))
    err = rejected(store, ValidationError, [svc("web", network="blue", type="NodePort", ports=[{"name": "http", "port": 80}])])
    assert "cannot move" in str(err)
    # upgrade to dual stack: the IPv4 address stays, an IPv6 one is added; downgrade frees it
    up = store.apply(svc("web", ipFamilyPolicy="PreferDualStack")).object
    assert up["spec"]["clusterIPs"][0] == ip and len(up["spec"]["clusterIPs"]) == 2
    assert "nodePort" not in up["spec"]["ports"][0] and f"nodeport.{node_port}" not in allocations(store)
    v6 = up["spec"]["clusterIPs"][1]
    down = store.apply(svc("web", ipFamilyPolicy="SingleStack")).object
    assert down["spec"]["clusterIPs"] == [ip] and down["spec"]["ipFamilies"] == ["IPv4"]
    assert not [a for a in allocations(store) if a.startswith("clusterip.default.fd00")], v6
    assert down["status"]["id"] == sid


def test_per_network_uniqueness_and_own_ranges(store):
    store.apply(net("red", ["10.20.0.0/16"]))
    store.apply(net("blue", ["10.10.0.0/16"], serviceCIDRs=["10.100.0.0/24", "fd00:100::/120"]))
    a = store.apply(svc("a", clusterIP="10.96.0.10")).object
    b = store.apply(svc("a", ns="kube-system", network="red", clusterIP="10.96.0.10")).object
    assert a["spec"]["clusterIP"] == b["spec"]["clusterIP"] == "10.96.0.10"
    assert "clusterip.red.10-96-0-10" in allocations(store) and "clusterip.default.10-96-0-10" in allocations(store)
    c = store.apply(svc("c", network="blue", ipFamilyPolicy="RequireDualStack")).object
    assert c["spec"]["clusterIPs"] == ["10.100.0.1", "fd00:100::1"]
    err = rejected(store, ValidationError, [svc("d", network="blue", clusterIP="10.96.0.11")])
    assert "10.100.0.0/24" in str(err)
    # the network's ranges may not shrink under its services, nor the ServiceCIDR under default's
    with pytest.raises(Forbidden, match="10.100.0.1"):
        store.apply(net("blue", ["10.10.0.0/16"], serviceCIDRs=["10.101.0.0/24"]))
    cidr = store.get("servicecidrs", "kubernetes")
    with pytest.raises(Forbidden, match="10.96.0.10"):
        store.apply({**cidr, "spec": {"cidrs": ["10.97.0.0/16"]}})
    with pytest.raises(Forbidden, match="every cluster has it"):
        store.delete("servicecidrs", "kubernetes")


def test_exhaustion_and_free_on_delete(store):
    store.apply(net("tiny", ["10.30.0.0/16"], serviceCIDRs=["10.50.0.0/30"]))
    store.apply_all([svc("one", network="tiny"), svc("two", network="tiny")])
    err = rejected(store, Exhausted, [svc("three", network="tiny")])
    assert 'Network "tiny"' in str(err) and "10.50.0.0/30" in str(err) and err.hint
    freed = store.get("svc", "one")["spec"]["clusterIP"]
    store.delete("svc", "one")
    assert f'clusterip.tiny.{freed.replace(".", "-")}' not in allocations(store)
    assert store.apply(svc("three", network="tiny")).object["spec"]["clusterIP"] == freed
    # deleting the namespace frees its services' allocations too
    store.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})
    store.apply(svc("x", ns="gone", type="NodePort"))
    before = len(allocations(store))
    store.delete("namespace", "gone")
    assert len(allocations(store)) == before - 3


def test_node_ports_shared_by_protocol_and_freed_on_type_change(store):
    s = store.apply(svc("dns", type="NodePort", ports=[{"name": "udp", "port": 53, "protocol": "UDP"},
                                                       {"name": "tcp", "port": 53, "protocol": "TCP"},
                                                       {"name": "m", "port": 9153}])).object
    ports = s["spec"]["ports"]
    assert ports[0]["nodePort"] == ports[1]["nodePort"] != ports[2]["nodePort"]
    assert all(30000 <= p["nodePort"] <= 32767 for p in ports)
    assert len([a for a in allocations(store) if a.startswith("nodeport.")]) == 2
    store.apply(svc("dns", ports=[{"name": "udp", "port": 53, "protocol": "UDP"}]))
    assert not [a for a in allocations(store) if a.startswith("nodeport.")]


def test_load_balancer_pools(store):
    err = rejected(store, Exhausted, [svc("lb", type="LoadBalancer")])
    assert "no LoadBalancerIPPool" in str(err)
    store.apply(pool("lab", ["198.18.100.0/30", "2001:db8:1b::/126"]))
    lb = store.apply(svc("lb", type="LoadBalancer", ipFamilyPolicy="PreferDualStack")).object
    assert lb["status"]["loadBalancer"]["ingress"] == [{"ip": "198.18.100.1"}, {"ip": "2001:db8:1b::1"}]
    assert lb["spec"]["ports"][0]["nodePort"] >= 30000
    assert store.apply(svc("lb", type="LoadBalancer", ipFamilyPolicy="PreferDualStack")).outcome == "unchanged"
    store.apply(svc("lb2", type="LoadBalancer", loadBalancerIP="198.18.100.2",
                    allocateLoadBalancerNodePorts=False))
    assert store.get("svc", "lb2")["status"]["loadBalancer"]["ingress"] == [{"ip": "198.18.100.2"}]
    assert "nodePort" not in store.get("svc", "lb2")["spec"]["ports"][0]
    err = rejected(store, ValidationError, [svc("lb3", type="LoadBalancer", loadBalancerIP="198.18.100.2")])
    assert err.field == "spec.loadBalancerIP" and "lb2" in str(err)
    err = rejected(store, ValidationError, [svc("lb3", type="LoadBalancer", loadBalancerIP="203.0.113.9")])
    assert "in no LoadBalancerIPPool" in str(err)
    err = rejected(store, Exhausted, [svc("lb3", type="LoadBalancer")])
    assert "198.18.100.0/30" in str(err)
    with pytest.raises(Forbidden, match="198.18.100.1"):
        store.delete("loadbalancerippools", "lab")
    store.apply(svc("lb", ipFamilyPolicy="PreferDualStack"))   # to ClusterIP: the addresses go
    assert store.get("svc", "lb")["status"]["loadBalancer"] == {}
    assert store.apply(svc("lb3", type="LoadBalancer")).object["status"]["loadBalancer"]["ingress"] == \
        [{"ip": "198.18.100.1"}]


def test_service_ids_given_by_hand_are_unique_and_skipped(store):
    assert store.apply(svc("a", annotations={K.SERVICE_ID_ANNOTATION: "2"})).object["status"]["id"] == 2
    assert store.apply(svc("b")).object["status"]["id"] == 1
    assert store.apply(svc("c")).object["status"]["id"] == 3    # 2 is taken by hand
    err = rejected(store, ValidationError, [svc("d", annotations={K.SERVICE_ID_ANNOTATION: "3"})])
    assert 'Service "default/c"' in str(err)
    err = rejected(store, ValidationError, [svc("a", annotations={K.SERVICE_ID_ANNOTATION: "7"})])
    assert err.field == "metadata.annotations.lace.dev/service-id" and "never change" in str(err)


def test_imports(store):
    dns = svc("dns", ns="kube-system", clusterIP="10.96.0.10", ports=[{"port": 53, "protocol": "UDP"}])
    red = net("red", ["10.20.0.0/16"], importServices=["kube-system/dns"])
    # one batch may hold the service and the network importing it
    store.apply_all([red, dns])
    assert store.get("networks", "red")["spec"]["importServices"] == ["kube-system/dns"]
    # red's own services never get the imported VIP ...
    store.apply(net("tiny", ["10.30.0.0/16"], serviceCIDRs=["10.96.0.8/30"], importServices=["kube-system/dns"]))
    assert store.apply(svc("t", network="tiny")).object["spec"]["clusterIP"] == "10.96.0.9"
    err = rejected(store, Exhausted, [svc("t2", network="tiny")])     # .10 is imported, .11 the broadcast
    err = rejected(store, ValidationError, [svc("x", network="red", clusterIP="10.96.0.10")])
    assert "imported into" in str(err)
    # ... and an import may not collide with a VIP the network has
    store.apply(net("blue", ["10.10.0.0/16"]))
    store.apply(svc("mine", network="blue", clusterIP="10.96.0.10"))
    err = rejected(store, ValidationError, [net("blue", ["10.10.0.0/16"], importServices=["kube-system/dns"])])
    assert err.field == "spec.importServices[0]" and 'Service "default/mine"' in str(err)
    for refs, words in ((["kube-system/nope"], "does not exist"), (["default/mine"], "already")):
        err = rejected(store, ValidationError, [net("blue", ["10.10.0.0/16"], importServices=refs)])
        assert err.field == "spec.importServices[0]" and words in str(err)
    store.apply(svc("hl", clusterIP="None"))
    err = rejected(store, ValidationError, [net("blue", ["10.10.0.0/16"], importServices=["default/hl"])])
    assert "headless" in str(err)
    # a service imported elsewhere: its new VIPs must be free in the importing networks too
    store.delete("svc", "mine")
    store.apply(net("blue", ["10.10.0.0/16"], importServices=["kube-system/dns"]))
    assert store.apply(svc("v6", network="blue", ipFamilies=["IPv6"])).object["spec"]["clusterIP"] == "fd00:10:96::1"
    dual = dict(dns, spec={**dns["spec"], "ipFamilyPolicy": "PreferDualStack"})
    err = rejected(store, ValidationError, [dict(dual, spec={**dual["spec"], "clusterIPs": ["10.96.0.10", "fd00:10:96::1"]})])
    assert err.field == "spec.clusterIPs[1]" and 'Network "blue" (which imports kube-system/dns)' in str(err)
    assert store.apply(dual).object["spec"]["clusterIPs"] == ["10.96.0.10", "fd00:10:96::2"]
