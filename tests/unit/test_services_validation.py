"""Validation of Services, EndpointSlices and the service ranges: every bad field is named with its
fix, and the defaults Kubernetes fills in are filled in."""

from __future__ import annotations

import copy

import pytest

from lace.store import ValidationError
from lace.store import kinds as K
from lace.store.validation import validate

DEFAULT_NET = {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "default"},
               "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS)}}


class DictLookup:
    """The stored objects a check may consult (the default network and ``objs``)."""

    def __init__(self, *objs):
        self.objs = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                     for o in (DEFAULT_NET, *objs)}

    def get_object(self, kind, name, namespace=None):
        return self.objs.get((kind, namespace or "", name))

    def list_objects(self, kind, namespace=None):
        return [o for (k, ns, _), o in self.objs.items() if k == kind and (namespace is None or ns == namespace)]


def net(name, cidrs, **spec):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": name},
            "spec": {"cidrs": cidrs, **spec}}


def svc(name="s", ns="default", annotations=None, **spec):
    meta = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = annotations
    spec.setdefault("ports", [{"port": 80}])
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def eps(address_type="IPv4", endpoints=None, ports=None, name="s-ipv4"):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "default", "labels": {K.SERVICE_NAME_LABEL: "s"}},
            "addressType": address_type,
            "endpoints": endpoints if endpoints is not None else [{"addresses": ["10.244.1.5"]}],
            "ports": ports if ports is not None else [{"name": "http", "port": 8080}]}


def cidr_obj(kind, name, cidrs):
    api = K.NETWORKING_API_VERSION if kind == "ServiceCIDR" else K.LACE_API_VERSION
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": {"cidrs": cidrs}}


POOL = cidr_obj("LoadBalancerIPPool", "pool-a", ["198.18.100.0/24"])


@pytest.mark.parametrize("obj, field, words", [
    (svc(type="ExternalName"), "spec.type", "use ClusterIP, NodePort or LoadBalancer"),
    (svc(ports=[]), "spec.ports", "at least one port"),
    (svc(ports=[{"port": 80, "protocol": "HTTP"}]), "spec.ports[0].protocol", "TCP, UDP or SCTP"),
    (svc(ports=[{"port": 80, "targetPort": "Web_Port"}]), "spec.ports[0].targetPort", "not a valid port name"),
    (svc(ports=[{"port": 80, "targetPort": 0}]), "spec.ports[0].targetPort", "1 to 65535"),
    (svc(ports=[{"port": 80, "nodePort": 30080}]), "spec.ports[0].nodePort", "set spec.type: NodePort"),
    (svc(type="NodePort", ports=[{"port": 80, "nodePort": 8080}]), "spec.ports[0].nodePort",
     "outside the node port range 30000-32767"),
    (svc(type="NodePort", ports=[{"name": "a", "port": 80, "nodePort": 30080},
                                 {"name": "b", "port": 81, "nodePort": 30080}]),
     "spec.ports[1].nodePort", "give each port its own"),
    (svc(clusterIP="10.96.0.300"), "spec.clusterIP", "not a valid IPv4 or IPv6 address"),
    (svc(clusterIP="10.96.0.1", clusterIPs=["10.96.0.2"]), "spec.clusterIPs[0]", "differs from spec.clusterIP"),
    (svc(clusterIPs=["10.96.0.1", "10.96.0.2"], ipFamilyPolicy="PreferDualStack"), "spec.clusterIPs[1]",
     "one IPv4 and one IPv6"),
    (svc(clusterIPs=["10.96.0.1", "fd00:10:96::1", "10.96.0.3"]), "spec.clusterIPs", "at most two"),
    (svc(clusterIPs=["None", "10.96.0.1"]), "spec.clusterIPs[1]", "headless service"),
    (svc(clusterIPs=["10.96.0.1", "None"]), "spec.clusterIPs[1]", "must be the only entry"),
    (svc(type="NodePort", clusterIP="None"), "spec.clusterIP", "cannot be headless"),
    (svc(ipFamilies=["IPv5"]), "spec.ipFamilies[0]", "use IPv4 or IPv6"),
    (svc(ipFamilies=["IPv4", "IPv4"], ipFamilyPolicy="PreferDualStack"), "spec.ipFamilies[1]", "listed twice"),
    (svc(clusterIP="10.96.0.1", ipFamilies=["IPv6"]), "spec.ipFamilies[0]", "does not match spec.clusterIPs[0]"),
    (svc(ipFamilyPolicy="DualStack"), "spec.ipFamilyPolicy", "SingleStack, PreferDualStack or RequireDualStack"),
    (svc(ipFamilies=["IPv4", "IPv6"]), "spec.ipFamilyPolicy", "set ipFamilyPolicy: PreferDualStack"),
    (svc(clusterIPs=["10.96.0.1", "fd00:10:96::1"], ipFamilyPolicy="SingleStack"), "spec.ipFamilyPolicy",
     "takes one IP family"),
    (svc(sessionAffinity="Cookie"), "spec.sessionAffinity", "use None or ClientIP"),
    (svc(sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}}), "spec.sessionAffinityConfig",
     "set sessionAffinity: ClientIP"),
    (svc(sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 0}}),
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "1 to 86400"),
    (svc(sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 86401}}),
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "out of range"),
    (svc(internalTrafficPolicy="Node"), "spec.internalTrafficPolicy", "use Cluster or Local"),
    (svc(externalTrafficPolicy="Local"), "spec.externalTrafficPolicy", "set spec.type: NodePort or LoadBalancer"),
    (svc(type="NodePort", externalTrafficPolicy="Remote"), "spec.externalTrafficPolicy", "use Cluster or Local"),
    (svc(loadBalancerIP="198.18.100.7"), "spec.loadBalancerIP", "set spec.type: LoadBalancer"),
    (svc(type="LoadBalancer", loadBalancerIP="lb.example"), "spec.loadBalancerIP", "not a valid"),
    (svc(allocateLoadBalancerNodePorts=False), "spec.allocateLoadBalancerNodePorts", "only a LoadBalancer"),
    (svc(selector={"app": "web server"}), "spec.selector.app", "label value"),
    (svc(annotations={K.SERVICE_ID_ANNOTATION: "x1"}), "metadata.annotations.lace.dev/service-id",
     "not a service ID"),
    (svc(annotations={K.NETWORK_ANNOTATION: "blue"}), "metadata.annotations.lace.dev/network",
     'Network "blue" does not exist'),
    (svc(ports=[{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]), "spec.ports[1]", "duplicate port 80/TCP"),
    (svc(ports=[{"port": 80, "name": "a"}, {"port": 81}]), "spec.ports[1].name", "must name each one"),
])
def test_service_rejects(obj, field, words):
    with pytest.raises(ValidationError) as info:
        validate(obj, DictLookup())
    err = info.value
    assert err.field == field, str(err)
    assert words in str(err), str(err)
    assert str(err).startswith(f'Service "default/s" is invalid: {field}: ') and "\n" not in str(err)


def test_service_defaults_as_kubernetes():
    out = validate(svc(selector={"app": "web"}, ports=[{"port": 80}, {"port": 53, "protocol": "UDP", "name": "dns",
                                                                      "targetPort": "5353"}][:1]), DictLookup())
    spec = out["spec"]
    assert spec["type"] == "ClusterIP" and spec["sessionAffinity"] == "None"
    assert spec["internalTrafficPolicy"] == "Cluster" and "externalTrafficPolicy" not in spec
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    lb = validate(svc(type="LoadBalancer", sessionAffinity="ClientIP",
                      ports=[{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "5353"}]), DictLookup())["spec"]
    assert lb["externalTrafficPolicy"] == "Cluster" and lb["allocateLoadBalancerNodePorts"] is True
    assert lb["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    assert lb["ports"][0]["targetPort"] == 5353
    single = validate(svc(clusterIP="fd00:10:96:0::a"), DictLookup())["spec"]
    assert single["clusterIP"] == "fd00:10:96::a" and single["clusterIPs"] == ["fd00:10:96::a"]
    headless = validate(svc(clusterIP="None", ports=[]), DictLookup())["spec"]
    assert headless["clusterIPs"] == ["None"]


@pytest.mark.parametrize("obj, field, words", [
    (eps(address_type="IP"), "addressType", "use IPv4, IPv6 or FQDN"),
    ({k: v for k, v in eps().items() if k != "addressType"}, "addressType", "required field is missing"),
    (eps(endpoints=[{"addresses": []}]), "endpoints[0].addresses", "list 1 to 100 addresses"),
    (eps(endpoints=[{"addresses": ["10.244.1.5", "fd00::5"]}]), "endpoints[0].addresses[1]",
     "not an IPv4 address"),
    (eps(endpoints=[{"addresses": ["10.244.1.500"]}]), "endpoints[0].addresses[0]", "not a valid"),
    (eps(address_type="FQDN", endpoints=[{"addresses": ["Web_1.example"]}]), "endpoints[0].addresses[0]",
     "fully qualified domain name"),
    (eps(endpoints=[{"addresses": ["10.244.1.5"], "nodeName": "Node_1"}]), "endpoints[0].nodeName",
     "not a valid node name"),
    (eps(endpoints=[{"addresses": ["10.244.1.5"], "conditions": {"ready": "yes"}}]),
     "endpoints[0].conditions.ready", "must be boolean or null"),
    (eps(ports=[{"name": "http", "port": 0}]), "ports[0].port", "1 to 65535"),
    (eps(ports=[{"name": "http", "port": 80, "protocol": "ICMP"}]), "ports[0].protocol", "TCP, UDP or SCTP"),
    (eps(ports=[{"name": "http", "port": 80}, {"name": "http", "port": 81}]), "ports[1].name",
     "duplicate port name"),
    (eps(endpoints=[{"addresses": [f"10.0.{i // 250}.{i % 250 + 1}"]} for i in range(1001)]), "endpoints",
     "at most 1000"),
])
def test_endpoint_slice_rejects(obj, field, words):
    with pytest.raises(ValidationError) as info:
        validate(obj, DictLookup())
    assert info.value.field == field, str(info.value)
    assert words in str(info.value) and str(info.value).startswith('EndpointSlice "default/s-ipv4" is invalid')


def test_endpoint_slice_accepts_and_defaults():
    obj = eps(address_type="IPv6", endpoints=[{"addresses": ["fd00:10:244:0::5"], "nodeName": "worker-1",
                                                "conditions": {"ready": True, "serving": True, "terminating": False},
                                                "targetRef": {"kind": "Pod", "namespace": "default", "name": "p"}}],
              ports=[{"name": "", "port": 80}, {"name": "dns", "port": None, "protocol": "UDP"}])
    out = validate(copy.deepcopy(obj), DictLookup())
    assert out["endpoints"][0]["addresses"] == ["fd00:10:244::5"]
    assert out["ports"][0]["protocol"] == "TCP"
    selectorless = validate({k: v for k, v in eps().items() if k != "endpoints"}, DictLookup())
    assert selectorless["endpoints"] == []


@pytest.mark.parametrize("obj, stored, field, words", [
    (cidr_obj("ServiceCIDR", "x", ["10.97.0.0/16", "fd00:97::/112", "10.98.0.0/16"]), (), "spec.cidrs",
     "at most two"),
    (cidr_obj("ServiceCIDR", "x", ["10.97.0.0/16", "10.98.0.0/16"]), (), "spec.cidrs[1]", "one range per family"),
    (cidr_obj("ServiceCIDR", "x", ["10.97.0.0/31"]), (), "spec.cidrs[0]", "too small"),
    (cidr_obj("ServiceCIDR", "x", ["10.97.0.1/16"]), (), "spec.cidrs[0]", "use 10.97.0.0/16"),
    (cidr_obj("LoadBalancerIPPool", "pool-b", ["198.18.100.128/25"]), (POOL,), "spec.cidrs[0]",
     'overlaps LoadBalancerIPPool "pool-a"'),
    (cidr_obj("LoadBalancerIPPool", "pool-b", ["198.18.0.0/24", "198.18.0.0/25"]), (), "spec.cidrs[1]",
     "overlaps spec.cidrs[0]"),
    (net("blue", ["10.10.0.0/16"], serviceCIDRs=["10.10.128.0/20"]), (), "spec.serviceCIDRs[0]",
     "must not overlap"),
    (net("blue", ["10.10.0.0/16"], serviceCIDRs=["10.11.0.0/16", "10.12.0.0/16"]), (), "spec.serviceCIDRs[1]",
     "one range per family"),
    (net("blue", ["10.10.0.0/16"], importServices=["kube-dns"]), (), "spec.importServices[0]", "namespace/name"),
    (net("blue", ["10.10.0.0/16"], importServices=["kube-system/dns", "kube-system/dns"]), (),
     "spec.importServices[1]", "listed twice"),
    ({"apiVersion": K.LACE_API_VERSION, "kind": "ServiceAllocation", "metadata": {"name": "mine"},
      "spec": {"resource": "nodePort", "service": "default/web", "port": 30080}}, (), "metadata.name",
     "name it nodeport.30080"),
    ({"apiVersion": K.LACE_API_VERSION, "kind": "ServiceAllocation", "metadata": {"name": "nodeport.80"},
      "spec": {"resource": "nodePort", "service": "default/web", "port": 80}}, (), "spec.port", "outside"),
])
def test_range_kinds_reject(obj, stored, field, words):
    with pytest.raises(ValidationError) as info:
        validate(obj, DictLookup(*stored))
    assert info.value.field == field, str(info.value)
    assert words in str(info.value), str(info.value)
