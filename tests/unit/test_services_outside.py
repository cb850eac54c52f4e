"""Backends outside every pod network: an EndpointSlice endpoint with no Pod targetRef whose
address is in none of its service's network CIDRs (the apiserver behind default/kubernetes) is a
backend in network OUTSIDE, which the datapath masquerades to; everything else stays in the
service's network."""

from __future__ import annotations

import ipaddress

from lace.datapath.common import NETWORK_OUTSIDE
from lace.datapath.services import BACKEND, revnat_key
from lace.services.cache import ServiceCache
from lace.services.model import frontends
from lace.services.program import ServiceProgrammer

NET = {"default": 1, "red": 7}
CIDRS = {1: (ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/48")),
         7: (ipaddress.ip_network("10.250.0.0/16"),)}


def svc(name="kubernetes", ips=("10.96.0.1",), port=443, sid=1, network=None):
    meta = {"name": name, "namespace": "default"}
    if network:
        meta["annotations"] = {"lace.dev/network": network}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "status": {"id": sid},
            "spec": {"clusterIPs": list(ips), "ports": [{"name": "https", "port": port}]}}


def ep(addr, ref=None):
    out = {"addresses": [addr], "conditions": {"ready": True}}
    if ref is not None:
        out["targetRef"] = ref
    return out


def pod_ref(name="p"):
    return {"kind": "Pod", "namespace": "default", "name": name}


def eps(endpoints, family=4, name="kubernetes", port=6443):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-{family}", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4" if family == 4 else "IPv6", "endpoints": endpoints,
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}


def networks_of(fronts, family=4):
    (f,) = [f for f in fronts if f.addr.version == family]
    return {str(b.addr): b.network for b in f.active}


def test_the_apiserver_endpoint_is_a_backend_outside():
    """default/kubernetes as the apiserver writes it: one endpoint, no targetRef, the apiserver's
    address outside the pod CIDRs."""
    fronts = frontends([svc()], [eps([ep("198.18.0.253")])], NET, {}, "w1", CIDRS)
    assert networks_of(fronts) == {"198.18.0.253": NETWORK_OUTSIDE}
    (b,) = fronts[0].active
    assert b.port == 6443 and b.pod == "" and b.identity == f"{NETWORK_OUTSIDE}/198.18.0.253/6443/6"


def test_both_halves_of_the_rule_are_asked():
    slices = [eps([ep("198.18.0.253"),                                   # no ref, outside: OUTSIDE
                   ep("10.244.3.4"),                                     # no ref, a pod CIDR: a pod's
                   ep("192.0.2.10", pod_ref("host-net")),                # a Pod ref outside: not masqueraded
                   ep("192.0.2.11", {"kind": "Node", "name": "w2"}),     # a ref of another kind: OUTSIDE
                   ep("10.244.3.5", pod_ref())])]                        # an ordinary pod
    got = networks_of(frontends([svc()], slices, NET, {}, "w1", CIDRS))
    assert got == {"198.18.0.253": NETWORK_OUTSIDE, "10.244.3.4": 1, "192.0.2.10": 1,
                   "192.0.2.11": NETWORK_OUTSIDE, "10.244.3.5": 1}


def test_the_service_networks_cidrs_decide_not_another_networks():
    """10.244.3.4 is a pod address of network 1, not of red (7), whose CIDR is 10.250/16."""
    slices = [eps([ep("10.244.3.4"), ep("10.250.0.9")])]
    got = networks_of(frontends([svc(network="red")], slices, NET, {}, "w1", CIDRS))
    assert got == {"10.244.3.4": NETWORK_OUTSIDE, "10.250.0.9": 7}


def test_ipv6_and_a_network_without_cidrs_of_the_family():
    v6 = frontends([svc(ips=("fd00:10:96::1",))], [eps([ep("2001:db8:a::1"), ep("fd00:10:244::9")], family=6)],
                   NET, {}, "w1", CIDRS)
    assert networks_of(v6, 6) == {"2001:db8:a::1": NETWORK_OUTSIDE, "fd00:10:244::9": 1}
    # red has no IPv6 CIDR: an IPv6 address that is no pod is outside it
    red = frontends([svc(ips=("fd00:10:96::1",), network="red")], [eps([ep("fd00:10:250::9")], family=6)],
                    NET, {}, "w1", CIDRS)
    assert networks_of(red, 6) == {"fd00:10:250::9": NETWORK_OUTSIDE}


def test_without_the_cidrs_every_backend_stays_in_its_network():
    """Callers that know no CIDRs (None), or a network the mapping does not name, keep the old
    rule: nothing is taken for outside."""
    slices = [eps([ep("198.18.0.253")])]
    assert networks_of(frontends([svc()], slices, NET, {}, "w1")) == {"198.18.0.253": 1}
    assert networks_of(frontends([svc()], slices, NET, {}, "w1", {7: CIDRS[7]})) == {"198.18.0.253": 1}


def test_an_outside_backend_is_programmed_in_network_outside():
    """Its backend entry names network OUTSIDE, and its revnat entry is keyed there: the reply of
    a masqueraded service flow finds its frontend through it."""
    p = ServiceProgrammer()
    _, backends, _ = p.entries(frontends([svc()], [eps([ep("198.18.0.253")])], NET, {}, "w1", CIDRS))
    (value,) = backends.values()
    assert BACKEND.unpack(value)["network"] == NETWORK_OUTSIDE
    assert revnat_key(NETWORK_OUTSIDE, ipaddress.ip_address("198.18.0.253"), 6443, 6) in p.revnat_entries()


def test_the_service_cache_passes_the_cidrs_on_and_a_change_of_them_counts():
    cache = ServiceCache("w1")
    cache.load([svc()], [eps([ep("198.18.0.253")])])
    cache.set_context(NET, {}, None, None, CIDRS)
    (f,) = cache.frontends()
    assert f.active[0].network == NETWORK_OUTSIDE
    # the apiserver's address becomes a pod CIDR: worked out again
    cache.set_context(NET, {}, None, None, {1: (ipaddress.ip_network("198.18.0.0/16"),)})
    (f,) = cache.frontends()
    assert f.active[0].network == 1
