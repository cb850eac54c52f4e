"""Masquerade through BPF_PROG_TEST_RUN: a pod flow routed to the outside by a masquerading route
leaves from the node's address and a port of the masquerade range (the first free candidate of the
documented order), out of the uplink through the node's FIB; its replies and the outside's ICMP
errors about it are written back to the pod; the port reservation and the pod entry see the flow
both ways; ports are reclaimed when their reservation expired or is the flow's own, and a
destination whose candidates are all held is refused with nat-failed. IPv4 and IPv6."""

from __future__ import annotations


import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6DestUnreach, ICMPv6EchoReply, ICMPv6EchoRequest, IPv6
from scapy.layers.l2 import Ether
from scapy.layers.sctp import SCTP
from scapy.packet import Raw

from lace.datapath.common import NETWORK_OUTSIDE, Verdict, addr16, addr_str, mac_bytes, now_coarse
from lace.datapath.conntrack import CT_ENTRY, CtFlag, CtState, CtStatus, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.masquerade import MASQ_PORT_MAX, MASQ_PORT_MIN, MASQ_TRIES, candidate_ports
from lace.datapath.reasons import DropReason
from lace.datapath.testbed import (NET1, NODE_ADDR4, OUTSIDE_ROUTER_MAC, TC_ACT_OK, TC_ACT_REDIRECT,
                                   UNDERLAY1, UPLINK_MAC, icmp_echo)
from lace.datapath.trace import NatKind

from .test_services import assert_dropped, assert_to_pod, checksums_valid, ct_total

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
PROTOS = [pytest.param(6, id="tcp"), pytest.param(17, id="udp")]
REMOTE = {4: "203.0.113.1", 6: "2001:db8:cafe::1"}
NODE = {4: NODE_ADDR4, 6: UNDERLAY1}
TABLE = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp"}


def fam_ip(family):
    return IP if family == 4 else IPv6


def masquerade(dp, family: int, on: bool = True) -> None:
    dp.route(NET1, "0.0.0.0/0" if family == 4 else "::/0", NETWORK_OUTSIDE, masquerade=on)


def l4(proto: int, sport: int, dport: int, flags: str = "S"):
    return TCP(sport=sport, dport=dport, flags=flags, seq=1000) if proto == 6 else UDP(sport=sport, dport=dport)


def ct(dp, net, src, dst, sport, dport, proto):
    fam, key = ct_key(net, src, dst, sport, dport, proto)
    raw = dp.m(f"ct-{TABLE[proto]}-v{int(fam)}").lookup(key)
    return CT_ENTRY.unpack(raw) if raw is not None else None


def reservation(dp, family, port, dport, proto, remote=None):
    return ct(dp, NETWORK_OUTSIDE, NODE[family], remote or REMOTE[family], port, dport, proto)


def hold(dp, family, port, dport, proto, *, holder: str = "10.1.1.77", expired: bool = False, remote=None):
    """A reservation of node:port -> remote:dport held by another pod (live unless ``expired``)."""
    now = now_coarse()
    holder = holder if family == 4 else "fd10:1::77"
    fam, key = ct_key(NETWORK_OUTSIDE, NODE[family], remote or REMOTE[family], port, dport, proto)
    dp.m(f"ct-{TABLE[proto]}-v{int(fam)}").update(key, CT_ENTRY.pack(
        created_ns=now - 10**9, last_seen_ns=now - 10**9, expires_ns=now - 1 if expired else now + 60 * 10**9,
        packets_fwd=1, bytes_fwd=60, packets_rev=0, bytes_rev=0, src_segment=257, dst_segment=2,
        dst_network=NET1, rev_nat_id=0, nat_addr=addr16(holder)[1],
        nat_port=1234, state=CtState.SYN_SENT if proto == 6 else CtState.UNREPLIED, flags=CtFlag.MASQ,
        tcp_flags_fwd=0, tcp_flags_rev=0, delivery=DeliveryKind.OUTSIDE, flags2=0))


def assert_out_of_uplink(res, dp):
    """Redirected out of the uplink to the outside's router; returns the IP packet."""
    assert res.retval == TC_ACT_REDIRECT, f"expected a redirect, got {res.retval} {res.events}"
    assert res.data[0:6] == mac_bytes(OUTSIDE_ROUTER_MAC) and res.data[6:12] == mac_bytes(UPLINK_MAC)
    return res.data[14:]


def from_outside(dp, family, pkt):
    return dp.from_uplink(Ether(src=OUTSIDE_ROUTER_MAC, dst=UPLINK_MAC) / pkt)


def ev_addr(ev, field):
    return addr_str(ev["family"], ev[field])


# -- the first packet ----------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_new_flow_leaves_from_the_node_address_and_a_masquerade_port(dp, family, proto):
    a = dp.pods["a"]
    masquerade(dp, family)
    port = candidate_ports(NET1, a.ip(family), REMOTE[family], 40000, 443, proto)[0]
    pkt = dp.l3(a, REMOTE[family], family) / l4(proto, 40000, 443) / Raw(b"hello")
    res = dp.from_pod(a, pkt)
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert out.src == NODE[family] and out.dst == REMOTE[family]
    assert out.sport == port and out.dport == 443 and bytes(out.payload.payload) == b"hello"
    assert MASQ_PORT_MIN <= port <= MASQ_PORT_MAX
    assert (out.ttl if family == 4 else out.hlim) == 63, "a routed hop"
    assert checksums_valid(bytes(out))
    pe = ct(dp, NET1, a.ip(family), REMOTE[family], 40000, 443, proto)
    r = reservation(dp, family, port, 443, proto)
    assert pe["flags"] & CtFlag.SNAT and not pe["flags"] & CtFlag.MASQ
    assert (addr_str(family, pe["nat_addr"]), pe["nat_port"]) == (NODE[family], port)
    assert pe["dst_network"] == NETWORK_OUTSIDE and pe["delivery"] == DeliveryKind.OUTSIDE
    assert r["flags"] & CtFlag.MASQ and not r["flags"] & CtFlag.SNAT
    assert (addr_str(family, r["nat_addr"]), r["nat_port"]) == (a.ip(family), 40000)
    assert r["dst_network"] == NET1 and r["src_segment"] == a.segment
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.FORWARD and ev["ct_status"] == CtStatus.NEW
    assert ev["nat_kind"] == NatKind.SNAT and ev["delivery"] == DeliveryKind.OUTSIDE
    assert ev_addr(ev, "saddr") == a.ip(family) and ev["sport"] == 40000            # the pod side ...
    assert ev_addr(ev, "nat_addr") == NODE[family] and ev["nat_port"] == port       # ... behind the node


@pytest.mark.parametrize("family", FAMILIES)
def test_without_masquerade_the_pod_address_goes_to_the_stack(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family, on=False)
    pkt = bytes(dp.l3(a, REMOTE[family], family) / TCP(sport=40000, dport=443, flags="S"))
    res = dp.from_pod(a, pkt)
    assert res.retval == TC_ACT_OK and res.data == pkt
    assert res.events[-1]["nat_kind"] == NatKind.NONE
    assert ct(dp, NET1, a.ip(family), REMOTE[family], 40000, 443, 6)["flags"] & CtFlag.SNAT == 0


# -- replies -------------------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_reply_is_written_back_to_the_pod(dp, family, proto):
    a = dp.pods["a"]
    masquerade(dp, family)
    port = candidate_ports(NET1, a.ip(family), REMOTE[family], 40001, 53, proto)[0]
    dp.from_pod(a, dp.l3(a, REMOTE[family], family) / l4(proto, 40001, 53))
    dp.configure(trace_all=True)
    reply = fam_ip(family)(src=REMOTE[family], dst=NODE[family]) / l4(proto, 53, port, "SA") / Raw(b"answer")
    res = from_outside(dp, family, reply)
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert out.src == REMOTE[family] and out.dst == a.ip(family)
    assert out.sport == 53 and out.dport == 40001 and bytes(out.payload.payload) == b"answer"
    assert checksums_valid(bytes(out))
    want = CtState.SYN_RECV if proto == 6 else CtState.REPLIED
    pe = ct(dp, NET1, a.ip(family), REMOTE[family], 40001, 53, proto)
    r = reservation(dp, family, port, 53, proto)
    assert pe["state"] == r["state"] == want, "both entries see the reply"
    assert pe["packets_rev"] == r["packets_rev"] == 1
    ev = res.events[-1]
    assert ev["ct_status"] == CtStatus.REPLY and ev["nat_kind"] == NatKind.SNAT
    assert ev["src_network"] == NETWORK_OUTSIDE and ev["dst_network"] == NET1
    assert ev_addr(ev, "daddr") == a.ip(family) and ev["dport"] == 40001
    assert ev_addr(ev, "nat_addr") == NODE[family] and ev["nat_port"] == port
    assert ev["dst_segment"] == a.segment and ev["delivery_ifindex"] == a.ifindex


@pytest.mark.parametrize("family", FAMILIES)
def test_established_packets_keep_their_port_and_advance_both_entries(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family)
    port = candidate_ports(NET1, a.ip(family), REMOTE[family], 40002, 443, 6)[0]
    dp.from_pod(a, dp.l3(a, REMOTE[family], family) / TCP(sport=40002, dport=443, flags="S", seq=1))
    from_outside(dp, family, fam_ip(family)(src=REMOTE[family], dst=NODE[family]) /
                 TCP(sport=443, dport=port, flags="SA", seq=500, ack=2))
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / TCP(sport=40002, dport=443, flags="A", seq=2, ack=501))
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    assert (out.src, out.sport) == (NODE[family], port) and checksums_valid(bytes(out))
    pe = ct(dp, NET1, a.ip(family), REMOTE[family], 40002, 443, 6)
    r = reservation(dp, family, port, 443, 6)
    assert pe["state"] == r["state"] == CtState.ESTABLISHED
    assert pe["packets_fwd"] == r["packets_fwd"] == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_evicted_reservation_is_put_back_by_the_next_packet(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family)
    port = candidate_ports(NET1, a.ip(family), REMOTE[family], 40003, 443, 17)[0]
    dp.from_pod(a, dp.l3(a, REMOTE[family], family) / UDP(sport=40003, dport=443))
    fam, key = ct_key(NETWORK_OUTSIDE, NODE[family], REMOTE[family], port, 443, 17)
    dp.m(f"ct-udp-v{int(fam)}").delete(key)
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / UDP(sport=40003, dport=443))
    assert fam_ip(family)(assert_out_of_uplink(res, dp)).sport == port
    r = reservation(dp, family, port, 443, 17)
    assert r["flags"] & CtFlag.MASQ and not r["flags"] & CtFlag.SNAT
    assert (addr_str(family, r["nat_addr"]), r["nat_port"], r["dst_network"]) == (a.ip(family), 40003, NET1)
    # and the reply finds it
    res = from_outside(dp, family, fam_ip(family)(src=REMOTE[family], dst=NODE[family]) / UDP(sport=443, dport=port))
    assert fam_ip(family)(assert_to_pod(res, dp, "a")).dport == 40003


@pytest.mark.parametrize("family", FAMILIES)
def test_echo_translated_by_identifier(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family)
    proto = 1 if family == 4 else 58
    ident = candidate_ports(NET1, a.ip(family), REMOTE[family], 0x77, 0x77, proto)[0]
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / icmp_echo(family, 0x77) / Raw(b"ping"))
    out = fam_ip(family)(assert_out_of_uplink(res, dp))
    echo = out[ICMP] if family == 4 else out[ICMPv6EchoRequest]
    assert out.src == NODE[family] and echo.id == ident
    assert checksums_valid(bytes(out)) if family == 4 else _icmp6_valid(bytes(out))
    reply = fam_ip(family)(src=REMOTE[family], dst=NODE[family]) / icmp_echo(family, ident, reply=True) / Raw(b"ping")
    res = from_outside(dp, family, reply)
    back = fam_ip(family)(assert_to_pod(res, dp, "a"))
    echo = back[ICMP] if family == 4 else back[ICMPv6EchoReply]
    assert back.dst == a.ip(family) and echo.id == 0x77
    assert checksums_valid(bytes(back)) if family == 4 else _icmp6_valid(bytes(back))
    assert ct(dp, NET1, a.ip(family), REMOTE[family], 0x77, 0x77, proto)["state"] == CtState.REPLIED


def _icmp6_valid(l3: bytes) -> bool:
    pkt = IPv6(l3)
    layer = pkt.getlayer(ICMPv6EchoRequest) or pkt.getlayer(ICMPv6EchoReply)
    del layer.cksum
    return bytes(pkt) == l3


def test_the_nodes_own_traffic_goes_to_the_stack_untouched(dp):
    """A packet for the node that belongs to no masqueraded flow is the node's business."""
    a = dp.pods["a"]
    masquerade(dp, 4)
    port = candidate_ports(NET1, a.ipv4, REMOTE[4], 40004, 443, 6)[0]
    dp.from_pod(a, dp.l3(a, REMOTE[4], 4) / TCP(sport=40004, dport=443, flags="S"))
    for pkt in (IP(src=REMOTE[4], dst=NODE_ADDR4) / TCP(sport=443, dport=port, flags="S"),   # a SYN: never a reply
                IP(src=REMOTE[4], dst=NODE_ADDR4) / TCP(sport=444, dport=port, flags="SA"),  # another remote port
                IP(src=REMOTE[4], dst=NODE_ADDR4) / TCP(sport=443, dport=40100, flags="SA"),
                IP(src="203.0.113.9", dst=NODE_ADDR4) / UDP(sport=53, dport=port)):
        raw = bytes(Ether(src=OUTSIDE_ROUTER_MAC, dst=UPLINK_MAC) / pkt)
        res = dp.from_uplink(raw)
        assert res.retval == TC_ACT_OK and res.data == raw and not res.events, pkt.summary()


# -- port allocation -------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_a_held_port_moves_the_flow_to_the_next_candidate(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family)
    cands = candidate_ports(NET1, a.ip(family), REMOTE[family], 40005, 443, 6)
    assert len(set(cands)) == MASQ_TRIES
    hold(dp, family, cands[0], 443, 6)
    hold(dp, family, cands[1], 443, 6)
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / TCP(sport=40005, dport=443, flags="S"))
    assert fam_ip(family)(assert_out_of_uplink(res, dp)).sport == cands[2]
    # the holders keep their ports; the same port to another remote port is another reservation
    assert addr_str(family, reservation(dp, family, cands[0], 443, 6)["nat_addr"]) != a.ip(family)
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / TCP(sport=40005, dport=8443, flags="S"))
    want = candidate_ports(NET1, a.ip(family), REMOTE[family], 40005, 8443, 6)[0]
    assert fam_ip(family)(assert_out_of_uplink(res, dp)).sport == want


@pytest.mark.parametrize("family", FAMILIES)
def test_an_expired_reservation_is_taken_over(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family)
    cands = candidate_ports(NET1, a.ip(family), REMOTE[family], 40006, 443, 17)
    hold(dp, family, cands[0], 443, 17, expired=True)
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / UDP(sport=40006, dport=443))
    assert fam_ip(family)(assert_out_of_uplink(res, dp)).sport == cands[0]
    r = reservation(dp, family, cands[0], 443, 17)
    assert (addr_str(family, r["nat_addr"]), r["nat_port"]) == (a.ip(family), 40006)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_flow_whose_pod_entry_went_gets_its_own_port_back(dp, family):
    a = dp.pods["a"]
    masquerade(dp, family)
    cands = candidate_ports(NET1, a.ip(family), REMOTE[family], 40007, 443, 17)
    hold(dp, family, cands[0], 443, 17)
    dp.from_pod(a, dp.l3(a, REMOTE[family], family) / UDP(sport=40007, dport=443))
    fam, key = ct_key(NET1, a.ip(family), REMOTE[family], 40007, 443, 17)
    dp.m(f"ct-udp-v{int(fam)}").delete(key)          # the pod entry is evicted, the reservation stays
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / UDP(sport=40007, dport=443))
    assert fam_ip(family)(assert_out_of_uplink(res, dp)).sport == cands[1]
    assert res.events[-1]["ct_status"] == CtStatus.NEW


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_exhausted_port_space_is_nat_failed(dp, family, proto):
    a = dp.pods["a"]
    masquerade(dp, family)
    cands = candidate_ports(NET1, a.ip(family), REMOTE[family], 40008, 443, proto)
    for port in cands:
        hold(dp, family, port, 443, proto)
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / l4(proto, 40008, 443))
    assert_dropped(res, DropReason.NAT_FAILED)
    assert ct(dp, NET1, a.ip(family), REMOTE[family], 40008, 443, proto) is None, "nothing recorded"
    # one candidate freed (expired): the flow gets it
    hold(dp, family, cands[-1], 443, proto, expired=True)
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / l4(proto, 40008, 443))
    assert fam_ip(family)(assert_out_of_uplink(res, dp)).sport == cands[-1]


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_header_too_short_to_translate_leaves_no_port_nor_entry(dp, family, proto):
    """A transport header the parser takes (a TCP head of 14 bytes, UDP of 6) but too short for its
    checksum field to be rewritten: dropped, and its port reservation and pod entry deleted."""
    a = dp.pods["a"]
    masquerade(dp, family)
    head = bytes(l4(proto, 40010, 443))[:14 if proto == 6 else 6]
    next_header = {"proto": proto} if family == 4 else {"nh": proto}
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family, **next_header) / Raw(head))
    assert res.retval != TC_ACT_REDIRECT and res.events and res.events[-1]["verdict"] == Verdict.DROP, res.events
    assert ct(dp, NET1, a.ip(family), REMOTE[family], 40010, 443, proto) is None, "no pod entry"
    for port in candidate_ports(NET1, a.ip(family), REMOTE[family], 40010, 443, proto)[:MASQ_TRIES]:
        assert reservation(dp, family, port, 443, proto) is None, f"port {port} still reserved"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_masqueraded_flow_that_dies_at_this_hop_takes_no_port(dp, family):
    """Given a port and translated, then dropped by its hop out (TTL 1, every traceroute's first
    probe): neither the pod entry nor the port reservation stays."""
    a = dp.pods["a"]
    masquerade(dp, family)
    hop = {"ttl": 1} if family == 4 else {"hlim": 1}
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family, **hop) / UDP(sport=33434, dport=33435))
    assert_dropped(res, DropReason.TTL_EXCEEDED)
    assert ct_total(dp) == 0


def test_no_node_address_of_the_family_is_nat_failed(dp):
    a = dp.pods["a"]
    dp.configure(addr4=None)
    masquerade(dp, 4)
    res = dp.from_pod(a, dp.l3(a, REMOTE[4], 4) / TCP(sport=40009, dport=443, flags="S"))
    assert_dropped(res, DropReason.NAT_FAILED)


def test_untranslatable_protocol_is_nat_failed(dp):
    a = dp.pods["a"]
    masquerade(dp, 4)
    res = dp.from_pod(a, dp.l3(a, REMOTE[4], 4) / SCTP(sport=5000, dport=5000))
    assert_dropped(res, DropReason.NAT_FAILED)


# -- ICMP errors from the outside ------------------------------------------------------------------

def _inner_ipv4_header_valid(inner: bytes) -> bool:
    hdr = IP(inner[: (inner[0] & 0xF) * 4])
    del hdr.chksum
    return bytes(hdr) == inner[: (inner[0] & 0xF) * 4]


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_icmp_error_about_a_masqueraded_packet_reaches_the_pod(dp, family, proto):
    a = dp.pods["a"]
    masquerade(dp, family)
    port = candidate_ports(NET1, a.ip(family), REMOTE[family], 40010, 9999, proto)[0]
    res = dp.from_pod(a, dp.l3(a, REMOTE[family], family) / l4(proto, 40010, 9999) / Raw(b"x" * 12))
    quoted = assert_out_of_uplink(res, dp)
    dp.configure(trace_all=True)
    if family == 4:
        err = IP(src="203.0.113.254", dst=NODE_ADDR4) / ICMP(type=3, code=3) / Raw(quoted)
    else:
        err = IPv6(src="2001:db8:cafe::fe", dst=UNDERLAY1) / ICMPv6DestUnreach(code=4) / Raw(quoted)
    res = from_outside(dp, family, err)
    out = assert_to_pod(res, dp, "a")
    pkt = fam_ip(family)(out)
    assert pkt.dst == a.ip(family)
    assert checksums_valid(out), "the ICMP checksum covers the rewritten quote"
    inner = bytes(pkt.payload)[8:]
    q = fam_ip(family)(inner)
    assert q.src == a.ip(family) and q.dst == REMOTE[family] and q.sport == 40010 and q.dport == 9999
    if family == 4:
        assert _inner_ipv4_header_valid(inner)
    ev = res.events[-1]
    assert ev["ct_status"] == CtStatus.RELATED and ev["nat_kind"] == NatKind.SNAT
    assert ev["delivery_ifindex"] == a.ifindex


def test_icmp_error_about_a_masqueraded_echo_reaches_the_pod(dp):
    a = dp.pods["a"]
    masquerade(dp, 4)
    ident = candidate_ports(NET1, a.ipv4, REMOTE[4], 0x99, 0x99, 1)[0]
    quoted = assert_out_of_uplink(dp.from_pod(a, dp.l3(a, REMOTE[4], 4) / icmp_echo(4, 0x99)), dp)
    assert IP(quoted)[ICMP].id == ident
    res = from_outside(dp, 4, IP(src="203.0.113.254", dst=NODE_ADDR4) / ICMP(type=11, code=0) / Raw(quoted))
    out = assert_to_pod(res, dp, "a")
    assert checksums_valid(out)
    q = IP(bytes(IP(out).payload)[8:])
    assert q.src == a.ipv4 and q[ICMP].id == 0x99


def test_icmp_error_about_no_masqueraded_flow_goes_to_the_stack(dp):
    quoted = bytes(IP(src=NODE_ADDR4, dst=REMOTE[4]) / UDP(sport=50000, dport=9))
    raw = bytes(Ether(src=OUTSIDE_ROUTER_MAC, dst=UPLINK_MAC) /
                IP(src="203.0.113.254", dst=NODE_ADDR4) / ICMP(type=3, code=3) / Raw(quoted))
    res = dp.from_uplink(raw)
    assert res.retval == TC_ACT_OK and res.data == raw and not res.events


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_pods_icmp_error_about_a_reply_leaves_from_the_node(dp, family, proto):
    """The pod refuses a reply of its masqueraded flow: the error goes out from the node address,
    quoting the packet as the remote sent it (to the node's address and port)."""
    a = dp.pods["a"]
    masquerade(dp, family)
    port = candidate_ports(NET1, a.ip(family), REMOTE[family], 40011, 9999, proto)[0]
    dp.from_pod(a, dp.l3(a, REMOTE[family], family) / l4(proto, 40011, 9999))
    reply = fam_ip(family)(src=REMOTE[family], dst=NODE[family]) / l4(proto, 9999, port, "SA") / Raw(b"late")
    received = assert_to_pod(from_outside(dp, family, reply), dp, "a")
    if family == 4:
        err = dp.l3(a, REMOTE[family], 4) / ICMP(type=3, code=3) / Raw(received)
    else:
        err = dp.l3(a, REMOTE[family], 6) / ICMPv6DestUnreach(code=4) / Raw(received)
    res = dp.from_pod(a, err)
    out = assert_out_of_uplink(res, dp)
    pkt = fam_ip(family)(out)
    assert pkt.src == NODE[family] and pkt.dst == REMOTE[family]
    assert checksums_valid(out)
    inner = bytes(pkt.payload)[8:]
    q = fam_ip(family)(inner)
    assert (q.src, q.dst, q.sport, q.dport) == (REMOTE[family], NODE[family], 9999, port)
    if family == 4:
        assert _inner_ipv4_header_valid(inner)
