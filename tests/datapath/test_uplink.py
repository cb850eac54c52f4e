"""From-uplink program (tc ingress on the node's uplink): SRv6 decapsulation for the node's own
locator, ingress policy and delivery into the pod; everything else is left to the stack."""

from __future__ import annotations

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from lace.datapath.common import Direction, Verdict
from lace.datapath.conntrack import CT_ENTRY, CtState, CtStatus, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.segment import segment_key, segment_value

from lace.datapath.testbed import NET1, NET2, REMOTE, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, UNDERLAY1, UPLINK_MAC

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]


def remote_inner(dp, dst_ip: str, family: int, l4, src_ip: str | None = None):
    src = src_ip or REMOTE["ipv4" if family == 4 else "ipv6"]
    if family == 4:
        return IP(src=src, dst=dst_ip, ttl=63) / l4
    return IPv6(src=src, dst=dst_ip, hlim=63) / l4


def ct(dp, net, src, dst, sport, dport, proto):
    fam, key = ct_key(net, src, dst, sport, dport, proto)
    name = {6: "tcp", 17: "udp"}[proto]
    raw = dp.m(f"ct-{name}-v{int(fam)}").lookup(key)
    return CT_ENTRY.unpack(raw) if raw else None


@pytest.mark.parametrize("family", FAMILIES)
def test_decap_delivers_inner_packet_intact(dp, family):
    a = dp.pods["a"]
    inner = remote_inner(dp, a.ip(family), family, TCP(sport=33000, dport=80, flags="S") / Raw(b"p" * 20))
    res = dp.from_uplink(dp.encap(inner, NET1, NET1))
    assert res.retval == TC_ACT_REDIRECT, res.events
    out = res.data
    assert out[0:6] == bytes.fromhex(a.mac.replace(":", ""))
    assert out[6:12] == bytes.fromhex(a.host_mac.replace(":", ""))
    assert out[12:14] == (b"\x08\x00" if family == 4 else b"\x86\xdd")
    assert out[14:] == bytes(inner), "the inner packet is delivered byte for byte"
    e = ct(dp, NET1, REMOTE["ipv4" if family == 4 else "ipv6"], a.ip(family), 33000, 80, 6)
    assert e is not None and e["state"] == CtState.SYN_SENT
    assert e["src_segment"] == REMOTE["segment"] and e["dst_segment"] == a.segment
    ev = res.events[-1]
    assert ev["point"] == TracePoint.FROM_UPLINK and ev["ct_status"] == CtStatus.NEW
    assert ev["delivery"] == DeliveryKind.LOCAL and ev["delivery_ifindex"] == a.ifindex


@pytest.mark.parametrize("family", FAMILIES)
def test_decap_ingress_policy_denies(dp, family):
    a = dp.pods["a"]
    dp.select(a.segment, Direction.INGRESS, policy_id=5)
    inner = remote_inner(dp, a.ip(family), family, TCP(sport=1, dport=80, flags="S"))
    res = dp.from_uplink(dp.encap(inner, NET1, NET1))
    assert res.retval == TC_ACT_SHOT
    assert DropReason(res.events[-1]["reason"]) == DropReason.POLICY_INGRESS
    assert res.events[-1]["src_segment"] == REMOTE["segment"]


@pytest.mark.parametrize("family", FAMILIES)
def test_decap_ingress_allowed_from_remote_segment(dp, family):
    a = dp.pods["a"]
    dp.select(a.segment, Direction.INGRESS)
    dp.allow(a.segment, REMOTE["segment"], Direction.INGRESS, proto=6, port=80)
    inner = remote_inner(dp, a.ip(family), family, TCP(sport=1, dport=80, flags="S"))
    assert dp.from_uplink(dp.encap(inner, NET1, NET1)).retval == TC_ACT_REDIRECT


@pytest.mark.parametrize("family", FAMILIES)
def test_reply_from_remote_of_local_flow_bypasses_policy(dp, family):
    # a opens a flow to the remote pod; a is selected for ingress with no rule; the reply arrives
    # encapsulated and is delivered because conntrack knows it
    a = dp.pods["a"]
    R = REMOTE["ipv4" if family == 4 else "ipv6"]
    dp.select(a.segment, Direction.INGRESS)
    out = dp.from_pod(a, dp.l3(a, R, family) / TCP(sport=44000, dport=80, flags="S"))
    assert out.retval == TC_ACT_REDIRECT
    reply = remote_inner(dp, a.ip(family), family, TCP(sport=80, dport=44000, flags="SA"))
    res = dp.from_uplink(dp.encap(reply, NET1, NET1))
    assert res.retval == TC_ACT_REDIRECT, res.events
    assert ct(dp, NET1, a.ip(family), R, 44000, 80, 6)["state"] == CtState.SYN_RECV
    # a new flow from the remote side is still denied
    new = remote_inner(dp, a.ip(family), family, TCP(sport=81, dport=44001, flags="S"))
    assert dp.from_uplink(dp.encap(new, NET1, NET1)).retval == TC_ACT_SHOT


def test_decap_overlapping_address_goes_to_the_sids_network(dp):
    # a (network 1) and c (network 2) share 10.1.1.10: the SID's function decides
    a, c = dp.pods["a"], dp.pods["c"]
    inner = remote_inner(dp, "10.1.1.10", 4, UDP(sport=5, dport=6))
    res = dp.from_uplink(dp.encap(inner, NET2, NET2))
    assert res.retval == TC_ACT_REDIRECT
    assert res.data[0:6] == bytes.fromhex(c.mac.replace(":", ""))
    assert res.events[-1]["delivery_ifindex"] == c.ifindex
    res = dp.from_uplink(dp.encap(inner, NET1, NET1))
    assert res.events[-1]["delivery_ifindex"] == a.ifindex


def test_not_our_locator_goes_to_the_stack_untouched(dp):
    a = dp.pods["a"]
    inner = remote_inner(dp, a.ipv4, 4, UDP(dport=53))
    pkt = bytes(dp.encap(inner, NET1, NET1, locator="2001:db8:7::/48"))
    res = dp.from_uplink(pkt)
    assert res.retval == TC_ACT_OK and res.data == pkt and not res.events


def test_underlay_traffic_to_the_node_goes_to_the_stack(dp):
    pkt = bytes(Ether(dst=UPLINK_MAC) / IPv6(src="2001:db8:f::2", dst=UNDERLAY1) / ICMPv6EchoRequest())
    res = dp.from_uplink(pkt)
    assert res.retval == TC_ACT_OK and res.data == pkt


def test_sid_without_network_dropped(dp):
    a = dp.pods["a"]
    res = dp.from_uplink(dp.encap(remote_inner(dp, a.ipv4, 4, UDP(dport=53)), 0, 0))
    assert res.retval == TC_ACT_SHOT
    assert DropReason(res.events[-1]["reason"]) == DropReason.BAD_SID


@pytest.mark.parametrize("family", FAMILIES)
def test_decapsulated_packet_not_for_a_local_pod_dropped(dp, family):
    # the destination is itself remote: never forward between nodes (no loops)
    dst = REMOTE["ipv4" if family == 4 else "ipv6"]
    res = dp.from_uplink(dp.encap(remote_inner(dp, dst, family, UDP(dport=53),
                                               src_ip="10.1.1.10" if family == 4 else "fd10:1::a"), NET1, NET1))
    assert res.retval == TC_ACT_SHOT
    assert DropReason(res.events[-1]["reason"]) == DropReason.NOT_LOCAL


def test_decap_unknown_destination_dropped(dp):
    res = dp.from_uplink(dp.encap(remote_inner(dp, "10.1.7.7", 4, UDP(dport=53)), NET1, NET1))
    assert res.retval == TC_ACT_SHOT
    assert DropReason(res.events[-1]["reason"]) == DropReason.NO_DELIVERY


def test_decap_inner_fragment_dropped(dp):
    a = dp.pods["a"]
    inner = IP(src=REMOTE["ipv4"], dst=a.ipv4, flags="MF") / UDP(dport=53) / Raw(b"x" * 8)
    res = dp.from_uplink(dp.encap(inner, NET1, NET1))
    assert res.retval == TC_ACT_SHOT
    assert DropReason(res.events[-1]["reason"]) == DropReason.FRAGMENT


def test_cross_network_route_source_network_from_argument(dp):
    # network 2 routes 10.1.1.10/32 into network 1; the remote pod in network 2 reaches a.
    a = dp.pods["a"]
    dp.m("segment").update(segment_key(NET2, "10.1.2.30"), segment_value(400))
    inner = remote_inner(dp, a.ipv4, 4, TCP(sport=2000, dport=80, flags="S"), src_ip="10.1.2.30")
    res = dp.from_uplink(dp.encap(inner, NET1, NET2))
    assert res.retval == TC_ACT_REDIRECT
    ev = res.events[-1]
    assert ev["src_network"] == NET2 and ev["dst_network"] == NET1 and ev["src_segment"] == 400
    # the flow is keyed under its source network (2)
    assert ct(dp, NET2, "10.1.2.30", a.ipv4, 2000, 80, 6) is not None
    # and a's reply, routed back into network 2, finds it
    dp.route(NET1, "10.1.2.30/32", NET2)
    res = dp.from_pod(a, dp.l3(a, "10.1.2.30", 4) / TCP(sport=80, dport=2000, flags="SA"))
    assert res.retval == TC_ACT_REDIRECT
    assert ct(dp, NET2, "10.1.2.30", a.ipv4, 2000, 80, 6)["state"] == CtState.SYN_RECV


@pytest.mark.parametrize("family", FAMILIES)
def test_encapsulated_packet_from_no_node_is_dropped(dp, family):
    """A packet crafted to one of this node's SIDs by anyone but another node (the outside, a
    stranger on the underlay) would be decapsulated into the network its SID names: dropped as
    spoofed-source, nothing delivered, nothing left in conntrack."""
    a = dp.pods["a"]
    inner = remote_inner(dp, a.ip(family), family, UDP(sport=5000, dport=53))
    for stranger in ("2001:db8:f::99", "2001:db8:cafe::1", UNDERLAY1):
        pkt = dp.encap(inner, NET1, NET1)
        pkt[IPv6].src = stranger
        res = dp.from_uplink(pkt)
        assert res.retval == TC_ACT_SHOT, (stranger, res.events)
        assert DropReason(res.events[-1]["reason"]) == DropReason.SPOOFED_SOURCE
        assert ct(dp, NET1, REMOTE["ipv4" if family == 4 else "ipv6"], a.ip(family), 5000, 53, 17) is None
    # node 2 itself still gets through
    assert dp.from_uplink(dp.encap(inner, NET1, NET1)).retval == TC_ACT_REDIRECT
