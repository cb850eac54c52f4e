"""NodePort and LoadBalancer frontends through BPF_PROG_TEST_RUN: a flow from the outside to a node
address at a node port (or a load-balancer address) is balanced on the uplink to a backend, with
the client's address kept; a local backend gets it directly and its replies leave through the node's
FIB from the frontend; a backend on another node gets it over SRv6 from this node's origin SID, and
its replies come back to this node, which writes the frontend back; the backend's node records the
origin and returns the replies to it. No active backend (traffic policy Local without a local
endpoint) is refused with a reset or a port unreachable sent back out of the uplink. IPv4 and IPv6,
TCP and UDP."""

from __future__ import annotations

import ipaddress

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror
from scapy.layers.inet6 import ICMPv6DestUnreach, IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from lace.datapath.common import NETWORK_OUTSIDE, SEGMENT_REMOTE_NODE, Direction, Verdict, addr_str, mac_bytes
from lace.datapath.config import sid
from lace.datapath.conntrack import CT_ENTRY, CtFlag, CtState, CtStatus, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.reasons import DropReason
from lace.datapath.segment import segment_key, segment_value
from lace.datapath.services import ServiceFlag
from lace.datapath.testbed import (LOCATOR1, LOCATOR2, NEIGH_MAC, NET1, NODE_ADDR4, OUTSIDE_ROUTER_MAC, REMOTE,
                                   TC_ACT_OK, TC_ACT_REDIRECT, UNDERLAY1, UPLINK_MAC, Backend)
from lace.datapath.trace import NatKind

from .test_masquerade import assert_out_of_uplink, from_outside
from .test_services import assert_dropped, assert_to_pod, checksums_valid, ct_total

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
PROTOS = [pytest.param(6, id="tcp"), pytest.param(17, id="udp")]
NODE = {4: NODE_ADDR4, 6: UNDERLAY1}
LB = {4: "198.18.100.7", 6: "2001:db8:1b::7"}
CLIENT = {4: "203.0.113.1", 6: "2001:db8:cafe::1"}
NODEPORT, TARGET = 30080, 8080
TABLE = {6: "tcp", 17: "udp"}
ING = Direction.INGRESS


def fam_ip(family):
    return IP if family == 4 else IPv6


def l4(proto: int, sport: int, dport: int, flags: str = "S", payload: bytes = b""):
    layer = TCP(sport=sport, dport=dport, flags=flags, seq=1000) if proto == 6 else UDP(sport=sport, dport=dport)
    return layer / Raw(payload) if payload else layer


def ct(dp, net, src, dst, sport, dport, proto):
    fam, key = ct_key(net, src, dst, sport, dport, proto)
    raw = dp.m(f"ct-{TABLE[proto]}-v{int(fam)}").lookup(key)
    return CT_ENTRY.unpack(raw) if raw is not None else None


def origin_sid(locator: str) -> str:
    """A node's origin SID: its locator, function OUTSIDE, argument 0."""
    return str(ipaddress.IPv6Address(sid(locator, None, NETWORK_OUTSIDE)))


def nodeport(dp, family, backends, proto=6, flags=ServiceFlag.NODEPORT, addr=None, **kw):
    return dp.service(addr or NODE[family], NODEPORT, backends, network=NETWORK_OUTSIDE, proto=proto,
                      flags=int(flags), **kw)


def local_b(dp, family):
    return [Backend(dp.pods["b"].ip(family), TARGET)]


def remote_backend(family):
    return [Backend(REMOTE["ipv4" if family == 4 else "ipv6"], TARGET)]


def to_frontend(family, proto, sport=40000, flags="S", addr=None, payload=b""):
    return fam_ip(family)(src=CLIENT[family], dst=addr or NODE[family]) / l4(proto, sport, NODEPORT, flags, payload)


# -- a local backend -------------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_new_flow_to_a_node_port_reaches_a_local_backend_with_the_client_address(dp, family, proto):
    b = dp.pods["b"]
    nodeport(dp, family, local_b(dp, family), proto, service_id=5)
    res = from_outside(dp, family, to_frontend(family, proto, payload=b"hello"))
    out = fam_ip(family)(assert_to_pod(res, dp, "b"))
    assert out.src == CLIENT[family] and out.dst == b.ip(family), "the client's address is kept"
    assert out.sport == 40000 and out.dport == TARGET and bytes(out.payload.payload) == b"hello"
    assert checksums_valid(bytes(out))
    # one entry, keyed by the frontend under OUTSIDE: no backend entry, no reply alias in the pod's
    # network (its replies find the flow through the backend's revnat entry)
    fe = ct(dp, NETWORK_OUTSIDE, CLIENT[family], NODE[family], 40000, NODEPORT, proto)
    assert fe["flags"] & CtFlag.SERVICE and fe["rev_nat_id"] == 5 and fe["dst_network"] == NET1
    assert ct_total(dp) == 1
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.FORWARD and ev["ct_status"] == CtStatus.NEW
    assert ev["src_network"] == NETWORK_OUTSIDE and ev["dst_network"] == NET1
    assert ev["src_segment"] == 2 and ev["dst_segment"] == b.segment      # world -> the backend
    assert ev["nat_kind"] == NatKind.DNAT and addr_str(family, ev["nat_addr"]) == NODE[family]
    assert ev["nat_port"] == NODEPORT


@pytest.mark.parametrize("family", FAMILIES)
def test_a_node_port_flow_that_dies_at_this_hop_leaves_no_entries(dp, family):
    """Balanced, translated and recorded (its frontend entry), then dropped by the hop into the
    backend (TTL 1): the entry goes with the packet."""
    nodeport(dp, family, local_b(dp, family), 17)
    pkt = to_frontend(family, 17)
    if family == 4:
        pkt.ttl = 1
    else:
        pkt.hlim = 1
    assert_dropped(from_outside(dp, family, pkt), DropReason.TTL_EXCEEDED)
    assert ct_total(dp) == 0


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_local_backends_reply_leaves_from_the_frontend_through_the_fib(dp, family, proto):
    b = dp.pods["b"]
    nodeport(dp, family, local_b(dp, family), proto)
    from_outside(dp, family, to_frontend(family, proto, sport=40001))
    res = dp.from_pod(b, dp.l3(b, CLIENT[family], family) / l4(proto, TARGET, 40001, "SA") / Raw(b"answer"))
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert out.src == NODE[family] and out.sport == NODEPORT
    assert out.dst == CLIENT[family] and out.dport == 40001 and bytes(out.payload.payload) == b"answer"
    assert checksums_valid(bytes(out))
    fe = ct(dp, NETWORK_OUTSIDE, CLIENT[family], NODE[family], 40001, NODEPORT, proto)
    assert fe["state"] == (CtState.SYN_RECV if proto == 6 else CtState.REPLIED)
    # and the client's next packet goes the same way
    res = from_outside(dp, family, to_frontend(family, proto, sport=40001, flags="A"))
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_load_balancer_address_reaches_the_backend(dp, family):
    b = dp.pods["b"]
    nodeport(dp, family, local_b(dp, family), addr=LB[family], flags=ServiceFlag.LOADBALANCER)
    res = from_outside(dp, family, to_frontend(family, 6, sport=40002, addr=LB[family]))
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family)
    res = dp.from_pod(b, dp.l3(b, CLIENT[family], family) / TCP(sport=TARGET, dport=40002, flags="SA"))
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert out.src == LB[family] and out.sport == NODEPORT and checksums_valid(bytes(out))


@pytest.mark.parametrize("family", FAMILIES)
def test_backend_ingress_policy_applies_to_the_outside_client(dp, family):
    b = dp.pods["b"]
    nodeport(dp, family, local_b(dp, family))
    dp.select(b.segment, ING)
    assert_dropped(from_outside(dp, family, to_frontend(family, 6, sport=40003)), DropReason.POLICY_INGRESS)
    dp.allow(b.segment, 2, ING, 6, TARGET)          # world, the backend's port (policy after DNAT)
    assert fam_ip(family)(assert_to_pod(from_outside(dp, family, to_frontend(family, 6, sport=40004)),
                                        dp, "b")).dst == b.ip(family)


# -- no backend ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_local_policy_without_a_local_endpoint_refuses_tcp_with_a_reset(dp, family):
    nodeport(dp, family, [], flags=ServiceFlag.NODEPORT | ServiceFlag.LOCAL)
    res = from_outside(dp, family, to_frontend(family, 6, sport=40005))
    assert res.retval == TC_ACT_REDIRECT, "answered back out of the uplink"
    assert res.data[0:6] == mac_bytes(OUTSIDE_ROUTER_MAC) and res.data[6:12] == mac_bytes(UPLINK_MAC)
    out = fam_ip(family)(res.data[14:])
    assert out.src == NODE[family] and out.dst == CLIENT[family]
    assert out[TCP].flags == "RA" and out[TCP].sport == NODEPORT and out[TCP].dport == 40005
    assert checksums_valid(bytes(out))
    assert res.events[-1]["verdict"] == Verdict.DROP
    assert DropReason(res.events[-1]["reason"]) == DropReason.SERVICE_NO_BACKEND


@pytest.mark.parametrize("family", FAMILIES)
def test_no_backend_refuses_udp_with_port_unreachable(dp, family):
    nodeport(dp, family, [], proto=17, flags=ServiceFlag.NODEPORT | ServiceFlag.LOCAL)
    res = from_outside(dp, family, to_frontend(family, 17, sport=40006, payload=b"q"))
    assert res.retval == TC_ACT_REDIRECT
    out = fam_ip(family)(res.data[14:])
    assert out.src == NODE[family] and out.dst == CLIENT[family]
    if family == 4:
        assert out[ICMP].type == 3 and out[ICMP].code == 3 and out[IPerror].dst == NODE[family]
    else:
        assert out.haslayer(ICMPv6DestUnreach) and out[ICMPv6DestUnreach].code == 4
    assert checksums_valid(bytes(out))


# -- a backend on another node (externalTrafficPolicy Cluster) --------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_remote_backend_gets_the_flow_from_this_nodes_origin_sid(dp, family, proto):
    R = remote_backend(family)[0].addr
    nodeport(dp, family, remote_backend(family), proto)
    res = from_outside(dp, family, to_frontend(family, proto, sport=40007))
    assert res.retval == TC_ACT_REDIRECT, res.events
    outer = IPv6(res.data[14:])
    assert outer.dst == str(ipaddress.IPv6Address(sid(LOCATOR2, None, NET1, NETWORK_OUTSIDE))), \
        "node 2's SID for the backend's network, source network OUTSIDE"
    assert outer.src == origin_sid(LOCATOR1), "replies come back to this node"
    inner = fam_ip(family)(res.data[54:])
    assert inner.src == CLIENT[family] and inner.dst == R and inner.dport == TARGET
    assert checksums_valid(bytes(inner))
    assert res.events[-1]["delivery"] == DeliveryKind.REMOTE and res.events[-1]["node_id"] == 2

    # node 2 sends the backend's reply back to our origin SID; it leaves from the frontend
    reply = fam_ip(family)(src=R, dst=CLIENT[family]) / l4(proto, TARGET, 40007, "SA") / Raw(b"back")
    res = dp.from_uplink(dp.encap(reply, NETWORK_OUTSIDE, NET1))
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert out.src == NODE[family] and out.sport == NODEPORT and out.dst == CLIENT[family] and out.dport == 40007
    assert bytes(out.payload.payload) == b"back" and checksums_valid(bytes(out))
    fe = ct(dp, NETWORK_OUTSIDE, CLIENT[family], NODE[family], 40007, NODEPORT, proto)
    assert fe["state"] == (CtState.SYN_RECV if proto == 6 else CtState.REPLIED)


@pytest.mark.parametrize("family", FAMILIES)
def test_nothing_leaves_for_the_outside_without_a_translated_flow(dp, family):
    stray = fam_ip(family)(src=remote_backend(family)[0].addr, dst=CLIENT[family]) / TCP(sport=TARGET, dport=1, flags="SA")
    assert_dropped(dp.from_uplink(dp.encap(stray, NETWORK_OUTSIDE, NET1)), DropReason.CT_INVALID)


def from_node2_frontend(dp, inner):
    """A flow node 2's frontend balanced to a pod here: its SID names the pod's network and source
    network OUTSIDE, its outer source is node 2's origin SID."""
    pkt = dp.encap(inner, NET1, NETWORK_OUTSIDE)
    pkt[IPv6].src = origin_sid(LOCATOR2)
    return pkt


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_backend_node_returns_replies_to_the_frontends_node(dp, family, proto):
    b = dp.pods["b"]
    inner = fam_ip(family)(src=CLIENT[family], dst=b.ip(family)) / l4(proto, 40008, TARGET)
    res = dp.from_uplink(from_node2_frontend(dp, inner))
    out = fam_ip(family)(assert_to_pod(res, dp, "b"))
    assert out.src == CLIENT[family] and out.dport == TARGET
    e = ct(dp, NETWORK_OUTSIDE, CLIENT[family], b.ip(family), 40008, TARGET, proto)
    assert e and not e["flags"] & (CtFlag.DNAT | CtFlag.SNAT | CtFlag.SERVICE | CtFlag.MASQ)
    assert addr_str(6, e["nat_addr"]) == origin_sid(LOCATOR2), "the entry keeps where the flow came from"
    assert ct(dp, NET1, CLIENT[family], b.ip(family), 40008, TARGET, proto)["flags"] == CtFlag.ALIAS
    assert res.events[-1]["src_network"] == NETWORK_OUTSIDE and res.events[-1]["src_segment"] == 2

    dp.configure(trace_all=True)
    res = dp.from_pod(b, dp.l3(b, CLIENT[family], family) / l4(proto, TARGET, 40008, "SA") / Raw(b"r"))
    assert res.retval == TC_ACT_REDIRECT, res.events
    assert res.data[0:6] == mac_bytes(NEIGH_MAC), "towards node 2 on the underlay"
    outer = IPv6(res.data[14:])
    assert outer.src == UNDERLAY1
    assert outer.dst == str(ipaddress.IPv6Address(sid(LOCATOR2, None, NETWORK_OUTSIDE, NET1))), \
        "node 2's origin SID, the pod's network as the argument"
    back = fam_ip(family)(res.data[54:])
    assert back.src == b.ip(family) and back.dst == CLIENT[family], "untranslated: node 2 translates"
    ev = res.events[-1]
    assert ev["ct_status"] == CtStatus.REPLY and ev["delivery"] == DeliveryKind.REMOTE
    assert ev["dst_network"] == NETWORK_OUTSIDE


def test_backend_node_follows_the_flow_to_another_frontend_node(dp):
    """The origin is refreshed by the flow's packets: a client moved to another frontend node
    (a load balancer's choice) gets its replies through that node."""
    b = dp.pods["b"]
    inner = IP(src=CLIENT[4], dst=b.ipv4) / UDP(sport=40009, dport=TARGET)
    dp.from_uplink(from_node2_frontend(dp, inner))
    moved = dp.encap(inner, NET1, NETWORK_OUTSIDE)
    moved[IPv6].src = "2001:db8:3:ffff:ffff::"
    # node 3's origin SID: a node this node's agent knows (the uplink decapsulates only from nodes)
    dp.m("segment").update(segment_key(NETWORK_OUTSIDE, moved[IPv6].src), segment_value(SEGMENT_REMOTE_NODE))
    assert_to_pod(dp.from_uplink(moved), dp, "b")
    e = ct(dp, NETWORK_OUTSIDE, CLIENT[4], b.ipv4, 40009, TARGET, 17)
    assert addr_str(6, e["nat_addr"]) == "2001:db8:3:ffff:ffff::"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_relayed_flow_goes_with_its_backend_pod(dp, family):
    """The backend pod of a flow another node's frontend relayed here is deleted: the agent's flush
    of its address takes the flow's entry (keyed in network OUTSIDE, the client's) with its reply
    alias (keyed in the pod's network). Left behind, the entry would carry the next pod given that
    address into a flow it never saw, whose replies find no alias and are dropped as no-route."""
    from lace.agent.conntrack import flush_addresses

    b = dp.pods["b"]
    inner = fam_ip(family)(src=CLIENT[family], dst=b.ip(family)) / UDP(sport=40010, dport=TARGET)
    assert_to_pod(dp.from_uplink(from_node2_frontend(dp, inner)), dp, "b")
    assert ct(dp, NETWORK_OUTSIDE, CLIENT[family], b.ip(family), 40010, TARGET, 17)
    assert flush_addresses(dp.loaded, NET1, [ipaddress.ip_address(b.ip(family))]) == 2
    assert ct(dp, NETWORK_OUTSIDE, CLIENT[family], b.ip(family), 40010, TARGET, 17) is None
    assert ct(dp, NET1, CLIENT[family], b.ip(family), 40010, TARGET, 17) is None
    # the same address in another network is not this pod: a flow to it stays
    assert flush_addresses(dp.loaded, NET1 + 1, [ipaddress.ip_address(b.ip(family))]) == 0


def test_traffic_to_a_port_without_a_frontend_goes_to_the_stack(dp):
    nodeport(dp, 4, local_b(dp, 4))
    raw = bytes(Ether(src=OUTSIDE_ROUTER_MAC, dst=UPLINK_MAC) /
                IP(src=CLIENT[4], dst=NODE_ADDR4) / TCP(sport=40010, dport=22, flags="S"))
    res = dp.from_uplink(raw)
    assert res.retval == TC_ACT_OK and res.data == raw and not res.events
