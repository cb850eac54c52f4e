"""A service whose backend is outside every pod network (network OUTSIDE: the apiserver behind
default/kubernetes), through BPF_PROG_TEST_RUN: a pod's new flow to the VIP is translated to the
backend and masqueraded out of the uplink from the node's address and a masquerade port, with no
route to the outside configured; its replies come back into the pod from the VIP; established
packets are translated both ways and advance the frontend entry, the pod entry and the port
reservation; a new flow dropped on its way leaves none of them. IPv4 and IPv6, TCP and UDP."""

from __future__ import annotations

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6DestUnreach, IPv6
from scapy.packet import Raw

from lace.datapath.common import NETWORK_OUTSIDE, Verdict, addr_str
from lace.datapath.conntrack import CtFlag, CtFlag2, CtState, CtStatus
from lace.datapath.delivery import DeliveryKind
from lace.datapath.masquerade import MASQ_PORT_MAX, MASQ_PORT_MIN, candidate_ports
from lace.datapath.reasons import DropReason
from lace.datapath.testbed import NET1, NODE_ADDR4, UNDERLAY1, Backend
from lace.datapath.trace import NatKind

from .test_masquerade import assert_out_of_uplink, ct, from_outside, hold, masquerade
from .test_services import assert_dropped, assert_to_pod, checksums_valid, ct_total

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
PROTOS = [pytest.param(6, id="tcp"), pytest.param(17, id="udp")]
VIP = {4: "10.96.0.1", 6: "fd00:10:96::1"}
#: the apiserver: behind the outside's router (a permanent neighbour in the test bed)
APISERVER = {4: "203.0.113.53", 6: "2001:db8:cafe::53"}
NODE = {4: NODE_ADDR4, 6: UNDERLAY1}
PORT, TARGET = 443, 6443


def fam_ip(family):
    return IP if family == 4 else IPv6


def l4(proto, sport, dport, flags="S", seq=1000, ack=0):
    return TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack) if proto == 6 else UDP(sport=sport, dport=dport)


def kubernetes(dp, family, proto=6):
    """default/kubernetes as the agent programs it for an apiserver outside the pod networks."""
    return dp.service(VIP[family], PORT, [Backend(APISERVER[family], TARGET, NETWORK_OUTSIDE)], proto=proto,
                      service_id=1)


def mport(dp, family, sport, proto):
    """The masquerade port the translated flow (pod -> apiserver) gets: its first candidate."""
    return candidate_ports(NET1, dp.pods["a"].ip(family), APISERVER[family], sport, TARGET, proto)[0]


def entries(dp, family, sport, port, proto):
    """(frontend entry, pod entry, port reservation) of pod a's flow from sport."""
    a = dp.pods["a"]
    return (ct(dp, NET1, a.ip(family), VIP[family], sport, PORT, proto),
            ct(dp, NET1, a.ip(family), APISERVER[family], sport, TARGET, proto),
            ct(dp, NETWORK_OUTSIDE, NODE[family], APISERVER[family], port, TARGET, proto))


def ev_addr(ev, field):
    return addr_str(ev["family"], ev[field])


def to_vip(dp, family, proto, sport, flags="S", payload=b"", **kw):
    a = dp.pods["a"]
    pkt = dp.l3(a, VIP[family], family) / l4(proto, sport, PORT, flags, **kw)
    return dp.from_pod(a, pkt / Raw(payload) if payload else pkt)


def from_apiserver(dp, family, proto, port, flags="SA", payload=b"", **kw):
    pkt = fam_ip(family)(src=APISERVER[family], dst=NODE[family]) / l4(proto, TARGET, port, flags, **kw)
    return from_outside(dp, family, pkt / Raw(payload) if payload else pkt)


# -- the first packet ----------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_new_flow_leaves_translated_to_the_backend_and_masqueraded(dp, family, proto):
    """No route to the outside at all (the test bed's networks route only their own CIDRs): a
    backend outside is masqueraded whatever the routes say."""
    a = dp.pods["a"]
    kubernetes(dp, family, proto)
    port = mport(dp, family, 40000, proto)
    res = to_vip(dp, family, proto, 40000, payload=b"hello")
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert (out.src, out.sport) == (NODE[family], port) and MASQ_PORT_MIN <= port <= MASQ_PORT_MAX
    assert (out.dst, out.dport) == (APISERVER[family], TARGET) and bytes(out.payload.payload) == b"hello"
    assert (out.ttl if family == 4 else out.hlim) == 63, "a routed hop"
    assert checksums_valid(bytes(out)), "DNAT and SNAT keep every checksum valid"
    fe, pe, r = entries(dp, family, 40000, port, proto)
    assert fe["flags"] & CtFlag.SERVICE and fe["flags2"] & CtFlag2.MASQ and not fe["flags2"] & CtFlag2.BACKEND_ENTRY
    assert (addr_str(family, fe["nat_addr"]), fe["nat_port"]) == (APISERVER[family], TARGET)
    assert fe["dst_network"] == NETWORK_OUTSIDE and fe["delivery"] == DeliveryKind.OUTSIDE and fe["rev_nat_id"] == 1
    assert pe["flags"] & CtFlag.SNAT and pe["flags2"] & CtFlag2.MASQ
    assert (addr_str(family, pe["nat_addr"]), pe["nat_port"]) == (NODE[family], port)
    assert r["flags"] & CtFlag.MASQ and r["flags2"] & CtFlag2.MASQ and r["dst_network"] == NET1
    assert (addr_str(family, r["nat_addr"]), r["nat_port"]) == (a.ip(family), 40000)
    assert ct_total(dp) == 3
    ev = res.events[-1]     # the service's view: client -> backend, for the VIP
    assert ev["verdict"] == Verdict.FORWARD and ev["ct_status"] == CtStatus.NEW
    assert ev["nat_kind"] == NatKind.DNAT and ev["delivery"] == DeliveryKind.OUTSIDE
    assert ev["dst_network"] == NETWORK_OUTSIDE
    assert (ev_addr(ev, "saddr"), ev["sport"]) == (a.ip(family), 40000)
    assert (ev_addr(ev, "daddr"), ev["dport"]) == (APISERVER[family], TARGET)
    assert (ev_addr(ev, "nat_addr"), ev["nat_port"]) == (VIP[family], PORT)


# -- replies and established packets ---------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_reply_comes_back_into_the_pod_from_the_vip(dp, family, proto):
    a = dp.pods["a"]
    kubernetes(dp, family, proto)
    port = mport(dp, family, 40001, proto)
    to_vip(dp, family, proto, 40001, seq=7)
    dp.configure(trace_all=True)
    res = from_apiserver(dp, family, proto, port, payload=b"answer", seq=99, ack=8)
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert (out.src, out.sport) == (VIP[family], PORT) and (out.dst, out.dport) == (a.ip(family), 40001)
    assert bytes(out.payload.payload) == b"answer" and checksums_valid(bytes(out))
    want = CtState.SYN_RECV if proto == 6 else CtState.REPLIED
    for e in entries(dp, family, 40001, port, proto):
        assert e["state"] == want and e["packets_rev"] == 1 and e["flags"] & CtFlag.SEEN_REPLY, e
    ev = res.events[-1]     # backend -> client, for the VIP
    assert ev["ct_status"] == CtStatus.REPLY and ev["nat_kind"] == NatKind.DNAT
    assert ev["src_network"] == NETWORK_OUTSIDE and ev["dst_network"] == NET1
    assert (ev_addr(ev, "saddr"), ev["sport"]) == (APISERVER[family], TARGET)
    assert (ev_addr(ev, "daddr"), ev["dport"]) == (a.ip(family), 40001)
    assert (ev_addr(ev, "nat_addr"), ev["nat_port"]) == (VIP[family], PORT)
    assert ev["delivery_ifindex"] == a.ifindex


@pytest.mark.parametrize("family", FAMILIES)
def test_established_packets_are_translated_both_ways(dp, family):
    a = dp.pods["a"]
    kubernetes(dp, family)
    port = mport(dp, family, 40002, 6)
    to_vip(dp, family, 6, 40002, seq=1)
    from_apiserver(dp, family, 6, port, seq=500, ack=2)
    dp.configure(trace_all=True)
    res = to_vip(dp, family, 6, 40002, "A", payload=b"GET /", seq=2, ack=501)
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert (out.src, out.sport, out.dst, out.dport) == (NODE[family], port, APISERVER[family], TARGET)
    assert checksums_valid(bytes(out))
    ev = res.events[-1]
    assert ev["ct_status"] == CtStatus.ESTABLISHED and ev["nat_kind"] == NatKind.DNAT
    assert ev_addr(ev, "daddr") == APISERVER[family] and ev_addr(ev, "nat_addr") == VIP[family]
    assert ev["delivery"] == DeliveryKind.OUTSIDE
    res = from_apiserver(dp, family, 6, port, "A", payload=b"200 OK", seq=501, ack=7)
    back = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert (back.src, back.sport, back.dst, back.dport) == (VIP[family], PORT, a.ip(family), 40002)
    assert checksums_valid(bytes(back))
    for e in entries(dp, family, 40002, port, 6):
        assert e["state"] == CtState.ESTABLISHED and (e["packets_fwd"], e["packets_rev"]) == (2, 2), e


# -- a new flow that does not get out leaves nothing -------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_new_flow_dropped_on_its_hop_out_leaves_no_entries(dp, family, proto):
    """Translated, masqueraded and recorded, then dropped by its hop out (TTL 1): the frontend
    entry, the pod entry and the port reservation go with the packet."""
    a = dp.pods["a"]
    kubernetes(dp, family, proto)
    hop = {"ttl": 1} if family == 4 else {"hlim": 1}
    res = dp.from_pod(a, dp.l3(a, VIP[family], family, **hop) / l4(proto, 40003, PORT))
    assert_dropped(res, DropReason.TTL_EXCEEDED)
    assert ct_total(dp) == 0
    # the flow sent again gets the port its first packet took back: the first candidate
    out = fam_ip(family)(assert_out_of_uplink(to_vip(dp, family, proto, 40003), dp))
    assert (out.src, out.sport) == (NODE[family], mport(dp, family, 40003, proto))
    assert ct_total(dp) == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_a_new_flow_without_a_port_leaves_no_frontend_entry(dp, family):
    """Every candidate port held: nat-failed, and the frontend entry written before goes too."""
    a = dp.pods["a"]
    kubernetes(dp, family, 17)
    cands = candidate_ports(NET1, a.ip(family), APISERVER[family], 40004, TARGET, 17)
    for p in cands:
        hold(dp, family, p, TARGET, 17, remote=APISERVER[family])
    res = to_vip(dp, family, 17, 40004)
    assert_dropped(res, DropReason.NAT_FAILED)
    assert ct_total(dp) == len(cands), "only the holders' reservations"


def test_a_node_without_an_ipv4_address_refuses_it_as_nat_failed(dp):
    kubernetes(dp, 4)
    dp.configure(addr4=None)
    assert_dropped(to_vip(dp, 4, 6, 40005), DropReason.NAT_FAILED)
    assert ct_total(dp) == 0


# -- the translated tuple ------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_the_pod_entrys_tuple_is_not_shared_with_a_direct_flow(dp, family):
    """The pod entry is keyed by the translated flow, the tuple a direct, masqueraded flow from the
    same port to the apiserver would have: a direct packet that meets it is not taken for the
    service flow (TUPLE_IN_USE), and a new service flow does not take a tuple a live direct flow
    holds (refused, TUPLE_IN_USE)."""
    a = dp.pods["a"]
    kubernetes(dp, family)
    masquerade(dp, family)
    to_vip(dp, family, 6, 40006)
    res = dp.from_pod(a, dp.l3(a, APISERVER[family], family) / TCP(sport=40006, dport=TARGET, flags="A"))
    assert_dropped(res, DropReason.TUPLE_IN_USE)
    # the other way round: the direct flow first
    dp.from_pod(a, dp.l3(a, APISERVER[family], family) / TCP(sport=40007, dport=TARGET, flags="S"))
    before = ct_total(dp)
    res = to_vip(dp, family, 6, 40007)
    assert res.events and res.events[0]["verdict"] == Verdict.DROP
    assert DropReason(res.events[0]["reason"]) == DropReason.TUPLE_IN_USE
    assert ct_total(dp) == before, "the refused flow wrote nothing"


# -- ICMP errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_an_icmp_error_about_the_flow_quotes_the_vip_to_the_pod(dp, family):
    a = dp.pods["a"]
    kubernetes(dp, family, 17)
    quoted = assert_out_of_uplink(to_vip(dp, family, 17, 40008, payload=b"x" * 12), dp)
    if family == 4:     # from the apiserver itself: its source becomes the VIP too
        err = IP(src=APISERVER[4], dst=NODE_ADDR4) / ICMP(type=3, code=3) / Raw(quoted)
    else:
        err = IPv6(src=APISERVER[6], dst=UNDERLAY1) / ICMPv6DestUnreach(code=4) / Raw(quoted)
    dp.configure(trace_all=True)
    res = from_outside(dp, family, err)
    out = assert_to_pod(res, dp, "a")
    pkt = fam_ip(family)(out)
    assert (pkt.src, pkt.dst) == (VIP[family], a.ip(family))
    assert checksums_valid(out)
    q = fam_ip(family)(bytes(pkt.payload)[8:])
    assert (q.src, q.sport, q.dst, q.dport) == (a.ip(family), 40008, VIP[family], PORT)
    assert res.events[-1]["ct_status"] == CtStatus.RELATED and res.events[-1]["nat_kind"] == NatKind.DNAT
