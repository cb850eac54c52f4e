"""NodePort and LoadBalancer frontends from Service objects: in source network OUTSIDE, at the
node's own addresses (bound by on_node) and at the load-balancer ingress addresses, with
externalTrafficPolicy Local keeping this node's endpoints only; and what the agent writes for
them."""

from __future__ import annotations

import ipaddress as ia

from lace.agent.desired import desired_maps
from lace.agent.model import Network, Node, NodeConfig, Snapshot
from lace.datapath.common import NETWORK_OUTSIDE, Proto
from lace.datapath.config import decode_config
from lace.datapath.services import SERVICE, ServiceFlag, service_key
from lace.services.model import NODE_ADDRESS, frontends, on_node

NET = {"default": 1}
V4, V6 = ia.ip_address("198.18.0.1"), ia.ip_address("fd5e:ff::1")


def svc(name, *, type_="NodePort", policy=None, lb=(), ips=("10.96.0.20", "fd00:10:96::20"), **extra):
    spec = {"type": type_, "clusterIPs": list(ips),
            "ports": [{"name": "http", "port": 80, "nodePort": 30080},
                      {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}], **extra}
    if policy:
        spec["externalTrafficPolicy"] = policy
    status = {"id": 11}
    if lb:
        status["loadBalancer"] = {"ingress": [{"ip": ip} for ip in lb] + [{"hostname": "lb.example"}]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": spec, "status": status}


def slices(name):
    def ep(addr, node):
        return {"addresses": [addr], "conditions": {"ready": True}, "nodeName": node,
                "targetRef": {"kind": "Pod", "namespace": "default", "name": f"p-{node}"}}
    ports = [{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]
    labels = {"kubernetes.io/service-name": name}
    return [{"metadata": {"name": f"{name}-4", "namespace": "default", "labels": labels}, "addressType": "IPv4",
             "endpoints": [ep("10.244.1.5", "w1"), ep("10.244.2.5", "w2")], "ports": ports},
            {"metadata": {"name": f"{name}-6", "namespace": "default", "labels": labels}, "addressType": "IPv6",
             "endpoints": [ep("fd00:10:244:1::5", "w1"), ep("fd00:10:244:2::5", "w2")], "ports": ports}]


def outside(fronts):
    return {(str(f.addr), f.port, f.proto): f for f in fronts if f.networks == (NETWORK_OUTSIDE,)}


def test_nodeport_frontends_per_family_at_the_node_port_with_every_endpoint():
    fronts = frontends([svc("web")], slices("web"), NET, {}, "w1")
    ext = outside(fronts)
    assert set(ext) == {(str(NODE_ADDRESS[4]), 30080, Proto.TCP), (str(NODE_ADDRESS[4]), 30053, Proto.UDP),
                        (str(NODE_ADDRESS[6]), 30080, Proto.TCP), (str(NODE_ADDRESS[6]), 30053, Proto.UDP)}
    f = ext[("0.0.0.0", 30080, Proto.TCP)]
    assert f.flags == ServiceFlag.NODEPORT and f.service_id == 11
    assert [(str(b.addr), b.port, b.network) for b in f.active] == [("10.244.1.5", 8080, 1), ("10.244.2.5", 8080, 1)]
    # the cluster IPs are still there, in the service's network, without the external flags
    inside = [f for f in fronts if f.networks == (1,)]
    assert len(inside) == 4 and all(f.flags == 0 for f in inside)


def test_external_traffic_policy_local_keeps_this_nodes_endpoints():
    on_w1 = outside(frontends([svc("web", policy="Local")], slices("web"), NET, {}, "w1"))
    on_w3 = outside(frontends([svc("web", policy="Local")], slices("web"), NET, {}, "w3"))
    f = on_w1[("::", 30080, Proto.TCP)]
    assert f.flags == ServiceFlag.NODEPORT | ServiceFlag.LOCAL
    assert [str(b.addr) for b in f.active] == ["fd00:10:244:1::5"]
    empty = on_w3[("::", 30080, Proto.TCP)]
    assert empty.flags & ServiceFlag.LOCAL and empty.active == () and empty.terminating == ()
    # the cluster IPs keep every endpoint: only internalTrafficPolicy limits them
    inside = [f for f in frontends([svc("web", policy="Local")], slices("web"), NET, {}, "w3") if f.networks == (1,)]
    assert all(len(f.active) == 2 and not f.flags & ServiceFlag.LOCAL for f in inside)


def test_load_balancer_frontends_at_each_ingress_address_and_its_node_ports():
    s = svc("lb", type_="LoadBalancer", lb=("198.18.100.7", "2001:db8:1b::7"), sessionAffinity="ClientIP")
    ext = outside(frontends([s], slices("lb"), NET, {}, "w1"))
    assert {k for k in ext if k[0] in ("198.18.100.7", "2001:db8:1b::7")} == {
        ("198.18.100.7", 80, Proto.TCP), ("198.18.100.7", 53, Proto.UDP),
        ("2001:db8:1b::7", 80, Proto.TCP), ("2001:db8:1b::7", 53, Proto.UDP)}
    f = ext[("2001:db8:1b::7", 80, Proto.TCP)]
    assert f.flags == ServiceFlag.LOADBALANCER | ServiceFlag.AFFINITY
    assert [str(b.addr) for b in f.active] == ["fd00:10:244:1::5", "fd00:10:244:2::5"]
    assert ext[("0.0.0.0", 30080, Proto.TCP)].flags == ServiceFlag.NODEPORT | ServiceFlag.AFFINITY


def test_clusterip_services_have_no_outside_frontends():
    s = svc("web", type_="ClusterIP")
    assert outside(frontends([s], slices("web"), NET, {}, "w1")) == {}


def test_a_single_stack_service_gets_node_ports_of_its_family_only():
    ext = outside(frontends([svc("web", ips=("fd00:10:96::20",))], slices("web"), NET, {}, "w1"))
    assert {k[0] for k in ext} == {"::"}


def test_on_node_binds_node_ports_to_the_nodes_addresses():
    fronts = frontends([svc("lb", type_="LoadBalancer", lb=("198.18.100.7",))], slices("lb"), NET, {}, "w1")
    bound = on_node(fronts, V4, V6)
    ext = outside(bound)
    assert ("198.18.0.1", 30080, Proto.TCP) in ext and ("fd5e:ff::1", 30053, Proto.UDP) in ext
    assert ("198.18.100.7", 80, Proto.TCP) in ext, "load-balancer addresses stay"
    assert not any(k[0] in ("0.0.0.0", "::") for k in ext)
    # a node without an IPv4 address answers its IPv6 node ports only
    v6only = outside(on_node(fronts, None, V6))
    assert {k[0] for k in v6only} == {"fd5e:ff::1", "198.18.100.7"}


def test_the_agent_writes_node_ports_at_its_addresses_in_network_outside():
    node = Node("w1", 1, V6, ia.IPv6Network("fd5e:c000:1::/48"), V4)
    s = Snapshot(NodeConfig(node, 2, "02:00:00:00:00:01", 1460),
                 {"default": Network("default", 1, (ia.ip_network("10.244.0.0/16"),))}, {"w1": node})
    s.frontends = frontends([svc("web", policy="Local")], slices("web"), NET, {}, "w1")
    want = desired_maps(s)
    assert decode_config(next(iter(want["config"].values())))["addr4"] == "198.18.0.1"
    for addr in ("198.18.0.1", "fd5e:ff::1"):
        fe = SERVICE.unpack(want["services"][service_key(NETWORK_OUTSIDE, addr, 30080, Proto.TCP)])
        assert fe["flags"] == ServiceFlag.NODEPORT | ServiceFlag.LOCAL
        assert fe["active_count"] == 1 and fe["service_id"] == 11
    assert service_key(NETWORK_OUTSIDE, "0.0.0.0", 30080, Proto.TCP) not in want["services"]
