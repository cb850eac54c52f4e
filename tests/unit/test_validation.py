"""Validation on write: each bad object is rejected with a message naming object, field and fix."""

from __future__ import annotations

import copy

import pytest

from lace.store import ValidationError
from lace.store import kinds as K
from lace.store.validation import validate

DEFAULT_NET = {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "default"},
               "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS)}}


class DictLookup:
    """The stored objects a check may consult, as a plain dict (no database needed)."""

    def __init__(self, *objs):
        self.objs = {}
        for o in (DEFAULT_NET, *objs):
            self.objs[(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])] = o

    def get_object(self, kind, name, namespace=None):
        return self.objs.get((kind, namespace or "", name))

    def list_objects(self, kind, namespace=None):
        return [o for (k, ns, _), o in self.objs.items() if k == kind and (namespace is None or ns == namespace)]


def net(name, cidrs, routes=None):
    spec = {"cidrs": cidrs}
    if routes is not None:
        spec["routes"] = routes
    return {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": name}, "spec": spec}


def pod(name="web", ns="default", network=None, **spec):
    meta = {"name": name, "namespace": ns}
    if network:
        meta["annotations"] = {K.NETWORK_ANNOTATION: network}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def netpol(spec, name="p"):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def ports_policy(ports):
    return netpol({"podSelector": {}, "ingress": [{"ports": ports}]})


BLUE = net("blue", ["10.10.0.0/16"])
DEMO = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}


def reject(obj, *stored):
    with pytest.raises(ValidationError) as info:
        validate(obj, DictLookup(*stored))
    return info.value


@pytest.mark.parametrize("obj, stored, ref, field, words", [
    (net("blue", ["10.10.0.0/16", "10.0.0.300/24"]), (), 'Network "blue"', "spec.cidrs[1]", "not a valid"),
    (net("blue", ["10.10.0.1/16"]), (), 'Network "blue"', "spec.cidrs[0]", "use 10.10.0.0/16"),
    (net("blue", ["fd00:1::1/64"]), (), 'Network "blue"', "spec.cidrs[0]", "host bits"),
    (net("blue", ["10.10.0.0/16", "10.244.7.0/24"]), (), 'Network "blue"', "spec.cidrs[1]",
     "overlaps the default network"),
    (net("blue", ["fd00:10:244:1::/64"]), (), 'Network "blue"', "spec.cidrs[0]", "never default"),
    (net("blue", ["10.10.0.0/16", "10.10.1.0/24"]), (), 'Network "blue"', "spec.cidrs[1]", "overlaps spec.cidrs[0]"),
    (net("blue", []), (), 'Network "blue"', "spec.cidrs", "must not be empty"),
    (net("blue", ["10.10.0.0/16"], [{"to": "red"}]), (), 'Network "blue"', "spec.routes[0].to",
     'Network "red" does not exist'),
    (net("blue", ["10.10.0.0/16"], [{"to": "blue"}]), (), 'Network "blue"', "spec.routes[0].to", "itself"),
    (net("blue", ["10.10.0.0/16"], [{"to": "outside", "cidrs": ["1.2.3.4/8"]}]), (), 'Network "blue"',
     "spec.routes[0].cidrs[0]", "host bits"),
    (net("blue", ["10.10.0.0/16"], [{"to": "outside", "masquerade": "yes"}]), (), 'Network "blue"',
     "spec.routes[0].masquerade", "must be boolean"),
    (net("blue", ["10.10.0.0/16"], [{"to": "outside", "via": "x"}]), (), 'Network "blue"',
     "spec.routes[0].via", "unknown field"),
    (pod(network="blue"), (), 'Pod "default/web"', "metadata.annotations.lace.dev/network",
     'Network "blue" does not exist'),
    (pod(ns="demo"), (), 'Pod "demo/web"', "metadata.namespace", "create Namespace demo first"),
    (pod(name="Web_1"), (), 'Pod "default/Web_1"', "metadata.name", "DNS-1123"),
    (pod(nodeName="Node_1"), (), 'Pod "default/web"', "spec.nodeName", "not a valid node name"),
    (pod(hostname="Db_0", subdomain="db"), (), 'Pod "default/web"', "spec.hostname", "not a DNS label"),
    (pod(hostname="db-0", subdomain="db.x"), (), 'Pod "default/web"', "spec.subdomain", "not a DNS label"),
    (pod(hostname="a" * 64), (), 'Pod "default/web"', "spec.hostname", "at most 63"),
    (pod(subdomain=7), (), 'Pod "default/web"', "spec.subdomain", "string"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "default"}}, (), 'Pod "default/<unnamed>"',
     "metadata.name", "add metadata.name"),
    ({**net("blue", ["10.10.0.0/16"]), "apiVersion": "v1"}, (), 'Network "blue"', "apiVersion",
     "set apiVersion: lace.dev/v1alpha1"),
    ({"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "x"}}, (), 'Deployment "x"', "kind",
     'unknown kind "Deployment"'),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}}, (), 'Namespace "a.b"',
     "metadata.name", "DNS-1123 label"),
    (netpol({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Has"}]}}), (),
     'NetworkPolicy "default/p"', "spec.podSelector.matchExpressions[0].operator", "unknown operator"),
    (netpol({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}), (),
     'NetworkPolicy "default/p"', "spec.podSelector.matchExpressions[0].values", "non-empty list"),
    (netpol({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
        {"key": "a", "operator": "Exists", "values": ["x"]}]}}]}]}), (), 'NetworkPolicy "default/p"',
     "spec.ingress[0].from[0].namespaceSelector.matchExpressions[0].values", "takes no values"),
    (ports_policy([{"port": 0}]), (), 'NetworkPolicy "default/p"', "spec.ingress[0].ports[0].port", "1 to 65535"),
    (ports_policy([{"port": 65536}]), (), 'NetworkPolicy "default/p"', "spec.ingress[0].ports[0].port",
     "out of range"),
    (ports_policy([{"port": 100, "endPort": 90}]), (), 'NetworkPolicy "default/p"',
     "spec.ingress[0].ports[0].endPort", "below port"),
    (ports_policy([{"port": "http", "endPort": 90}]), (), 'NetworkPolicy "default/p"',
     "spec.ingress[0].ports[0].endPort", "numeric port"),
    (ports_policy([{"port": 80, "protocol": "ICMP"}]), (), 'NetworkPolicy "default/p"',
     "spec.ingress[0].ports[0].protocol", "TCP, UDP or SCTP"),
    (ports_policy([{"port": "Not_A_Name"}]), (), 'NetworkPolicy "default/p"', "spec.ingress[0].ports[0].port",
     "not a valid port name"),
    (netpol({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/16"]}}]}]}),
     (), 'NetworkPolicy "default/p"', "spec.egress[0].to[0].ipBlock.except[0]", "not strictly inside"),
    (netpol({"podSelector": {}, "policyTypes": ["Both"]}), (), 'NetworkPolicy "default/p"',
     "spec.policyTypes[0]", "Ingress or Egress"),
    (netpol({}), (), 'NetworkPolicy "default/p"', "spec.podSelector", "required"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
      "spec": {"ports": [{"port": 80, "protocol": "HTTP"}]}}, (), 'Service "default/s"',
     "spec.ports[0].protocol", "TCP, UDP or SCTP"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
      "spec": {"ports": [{"port": 80, "name": "a"}, {"port": 81}]}}, (), 'Service "default/s"',
     "spec.ports[1].name", "must name each one"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
      "spec": {"ports": [{"port": 80, "targetPort": 70000}]}}, (), 'Service "default/s"',
     "spec.ports[0].targetPort", "out of range"),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b c"}}}, (),
     'Pod "default/p"', "metadata.labels.a", "label value"),
    ({"apiVersion": K.LACE_API_VERSION, "kind": "IPBlock", "metadata": {"name": "b"},
      "spec": {"network": "default", "node": "n1", "cidr": "10.99.0.0/24"}}, (), 'IPBlock "b"', "spec.cidr",
     "outside Network"),
    ({"apiVersion": K.LACE_API_VERSION, "kind": "IPLease", "metadata": {"name": "l"},
      "spec": {"network": "default", "node": "n1", "ip": "10.244.0.5", "pod": "web"}}, (), 'IPLease "l"',
     "spec.pod", "namespace/name"),
])
def test_rejects(obj, stored, ref, field, words):
    err = reject(obj, *stored)
    assert err.ref == ref
    assert err.field == field
    assert words in str(err), str(err)
    assert str(err).startswith(f"{ref} is invalid: {field}: ")
    assert "\n" not in str(err)


@pytest.mark.parametrize("obj, stored", [
    (net("blue", ["10.10.0.0/16", "fd00:b::/56"], [{"to": "outside", "masquerade": True},
                                                    {"to": "default", "cidrs": ["10.244.0.0/16"]}]), ()),
    (net("red", ["10.10.0.0/16"]), (BLUE,)),  # networks may overlap each other
    (pod(ns="demo", network="blue"), (BLUE, DEMO)),
    (pod(ns="kube-system"), ()),
    (ports_policy([{"port": 80, "endPort": 90, "protocol": "UDP"}, {"port": "http"}, {"protocol": "SCTP"}]), ()),
    (netpol({"podSelector": {"matchLabels": {"app": "web"}},
             "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
                                   {"podSelector": {}, "namespaceSelector": {"matchExpressions": [
                                       {"key": "team", "operator": "NotIn", "values": ["x"]}]}}]}]}), ()),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
      "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "web"},
                                                     {"name": "dns", "port": 53, "protocol": "UDP"}]}}, ()),
    ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}, "spec": {"podCIDRs": ["10.244.1.0/24"]}}, ()),
])
def test_accepts(obj, stored):
    out = validate(copy.deepcopy(obj), DictLookup(*stored))
    assert out["metadata"]["name"] == obj["metadata"]["name"]


def test_default_network_may_not_grow_over_another():
    err = reject(net("default", ["10.0.0.0/8"]), BLUE)
    assert err.field == "spec.cidrs[0]" and 'Network "blue"' in str(err)


def test_namespace_is_defaulted_and_stripped():
    assert validate(pod(ns=None) | {"metadata": {"name": "p"}}, DictLookup())["metadata"]["namespace"] == "default"
    ns = validate({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "namespace": "y"}},
                  DictLookup())
    assert "namespace" not in ns["metadata"]


def test_not_an_object():
    with pytest.raises(ValidationError, match="expected an object"):
        validate(["a"], DictLookup())
