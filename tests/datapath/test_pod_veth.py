"""From-pod program (tc ingress on the pod veth) through BPF_PROG_TEST_RUN: a table of decisions,
each for IPv4 and IPv6 where it applies."""

from __future__ import annotations

import ipaddress

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6DestUnreach, ICMPv6ND_NS, IPv6, IPv6ExtHdrFragment
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from lace.datapath.common import Direction
from lace.datapath.conntrack import CT_ENTRY, CT_TIMEOUT_UDP, CtState, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.reasons import DropReason
from lace.datapath.common import Verdict
from lace.datapath.conntrack import CtStatus

from lace.datapath.common import mac_bytes, now_coarse
from lace.datapath.devices import NEXTHOP, NEXTHOP_TTL_NS, decode_nexthop, decode_nexthop_key, nexthop_key

from lace.datapath.testbed import NEIGH_MAC, UPLINK_MAC, NET1, NET2, REMOTE, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, UNDERLAY1, icmp_echo

from .test_services import ct_total

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
ING, EGR = Direction.INGRESS, Direction.EGRESS


def ipv4_checksum_ok(raw: bytes) -> bool:
    hdr = IP(raw)
    fresh = hdr.copy()
    del fresh.chksum
    return IP(bytes(fresh)).chksum == hdr.chksum


def ct_entry(dp, net, src, dst, sport, dport, proto):
    fam, key = ct_key(net, src, dst, sport, dport, proto)
    name = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp"}[proto]
    raw = dp.m(f"ct-{name}-v{int(fam)}").lookup(key)
    return CT_ENTRY.unpack(raw) if raw is not None else None


def assert_dropped(res, reason: DropReason):
    assert res.retval == TC_ACT_SHOT, f"expected drop {reason.name}, got retval {res.retval}"
    drops = [e for e in res.events if e["verdict"] == Verdict.DROP]
    assert drops, "a drop must emit a trace event"
    assert DropReason(drops[-1]["reason"]) == reason


def assert_local(res, dp, dst_pod: str, family: int):
    pod = dp.pods[dst_pod]
    assert res.retval == TC_ACT_REDIRECT, f"expected redirect, got {res.retval} {res.events}"
    out = res.packet()
    assert out.dst == pod.mac and out.src == pod.host_mac
    return out


# -- allowed, same node ------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_tcp_syn_same_node_allowed_creates_ct(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    pkt = dp.l3(a, b.ip(family), family) / TCP(sport=40000, dport=80, flags="S")
    res = dp.from_pod(a, pkt)
    out = assert_local(res, dp, "b", family)
    inner = out[IP] if family == 4 else out[IPv6]
    assert (inner.ttl if family == 4 else inner.hlim) == 63, "a routed hop decrements TTL"
    if family == 4:
        assert ipv4_checksum_ok(bytes(inner)), "the checksum stays valid after the TTL decrement"
    e = ct_entry(dp, NET1, a.ip(family), b.ip(family), 40000, 80, 6)
    assert e is not None and e["state"] == CtState.SYN_SENT
    assert e["src_segment"] == a.segment and e["dst_segment"] == b.segment
    assert e["dst_network"] == NET1 and e["packets_fwd"] == 1
    assert e["delivery"] == DeliveryKind.LOCAL
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.FORWARD and ev["ct_status"] == CtStatus.NEW
    assert ev["delivery"] == DeliveryKind.LOCAL and ev["delivery_ifindex"] == b.ifindex


def test_ttl_decrement_checksum_across_carries(dp):
    """The incremental checksum update stays valid for every checksum value, carries included."""
    import struct

    a, b = dp.pods["a"], dp.pods["b"]
    for ident in range(0, 65536, 257):      # walks the checksum through all its high bytes
        res = dp.from_pod(a, dp.l3(a, b.ipv4, 4, id=ident) / UDP(sport=7000, dport=53))
        out = assert_local(res, dp, "b", 4)
        hdr = bytes(out[IP])[:20]
        total = sum(struct.unpack("!10H", hdr))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        assert total == 0xFFFF, f"IP id {ident}: header checksum invalid after the TTL decrement"
        assert out[IP].ttl == 63


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_new_flow_that_dies_at_this_hop_leaves_no_conntrack_entry(dp, family, where):
    """TTL / hop limit 1 (every traceroute's first probe): dropped as TTL_EXCEEDED, as the forward
    would, but before the flow's entry is written — a flow whose packet never left has none."""
    a = dp.pods["a"]
    dst = dp.pods["b"].ip(family) if where == "local" else REMOTE["ipv4" if family == 4 else "ipv6"]
    hop = {"ttl": 1} if family == 4 else {"hlim": 1}
    res = dp.from_pod(a, dp.l3(a, dst, family, **hop) / UDP(sport=33434, dport=33435))
    assert_dropped(res, DropReason.TTL_EXCEEDED)
    assert ct_entry(dp, NET1, a.ip(family), dst, 33434, 33435, 17) is None
    # the next probe, one hop further, is a new flow like any other
    hop = {"ttl": 2} if family == 4 else {"hlim": 2}
    res = dp.from_pod(a, dp.l3(a, dst, family, **hop) / UDP(sport=33434, dport=33435))
    assert res.retval != TC_ACT_SHOT, res.events
    assert ct_entry(dp, NET1, a.ip(family), dst, 33434, 33435, 17) is not None


@pytest.mark.parametrize("family", FAMILIES)
def test_udp_same_node_allowed(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / UDP(sport=5000, dport=53) / Raw(b"q"))
    assert_local(res, dp, "b", family)
    e = ct_entry(dp, NET1, a.ip(family), b.ip(family), 5000, 53, 17)
    assert e["state"] == CtState.UNREPLIED


@pytest.mark.parametrize("family", FAMILIES)
def test_icmp_echo_and_reply(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    proto = 1 if family == 4 else 58
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / icmp_echo(family, 0x77))
    assert_local(res, dp, "b", family)
    assert ct_entry(dp, NET1, a.ip(family), b.ip(family), 0x77, 0x77, proto)["state"] == CtState.UNREPLIED
    res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / icmp_echo(family, 0x77, reply=True))
    assert_local(res, dp, "a", family)
    assert ct_entry(dp, NET1, a.ip(family), b.ip(family), 0x77, 0x77, proto)["state"] == CtState.REPLIED


@pytest.mark.parametrize("family", FAMILIES)
def test_tcp_handshake_states(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    A, B = a.ip(family), b.ip(family)
    steps = [
        (a, B, "S", CtState.SYN_SENT, CtStatus.NEW),
        (b, A, "SA", CtState.SYN_RECV, CtStatus.REPLY),
        (a, B, "A", CtState.ESTABLISHED, CtStatus.ESTABLISHED),
        (a, B, "FA", CtState.FIN_WAIT, CtStatus.ESTABLISHED),
        (b, A, "FA", CtState.CLOSING, CtStatus.REPLY),
    ]
    for src, dst, flags, state, status in steps:
        sport, dport = (41000, 80) if src is a else (80, 41000)
        res = dp.from_pod(src, dp.l3(src, dst, family) / TCP(sport=sport, dport=dport, flags=flags))
        assert res.retval == TC_ACT_REDIRECT, (flags, res.events)
        assert ct_entry(dp, NET1, A, B, 41000, 80, 6)["state"] == state, flags
        if status == CtStatus.NEW:
            assert res.events[-1]["ct_status"] == status
        else:
            assert not res.events, "established packets are not traced by default"
    e = ct_entry(dp, NET1, A, B, 41000, 80, 6)
    assert e["packets_fwd"] == 3 and e["packets_rev"] == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_rst_closes(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=42000, dport=80, flags="S"))
    dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=80, dport=42000, flags="R"))
    assert ct_entry(dp, NET1, a.ip(family), b.ip(family), 42000, 80, 6)["state"] == CtState.CLOSED


# -- source validation -------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_spoofed_source_dropped(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    spoof = "10.1.1.77" if family == 4 else "fd10:1::77"
    pkt = dp.l3(a, b.ip(family), family) / TCP(sport=1, dport=80, flags="S")
    pkt[IP if family == 4 else IPv6].src = spoof
    assert_dropped(dp.from_pod(a, pkt), DropReason.SPOOFED_SOURCE)


@pytest.mark.parametrize("family", FAMILIES)
def test_another_pods_address_is_spoofing(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    pkt = dp.l3(a, a.ip(family), family) / UDP(sport=1, dport=53)
    pkt[IP if family == 4 else IPv6].src = b.ip(family)
    assert_dropped(dp.from_pod(a, pkt), DropReason.SPOOFED_SOURCE)


def test_spoofed_mac_dropped(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    pkt = dp.l3(a, b.ipv4, 4) / UDP(sport=1, dport=53)
    pkt[Ether].src = "02:00:00:00:00:ee"
    assert_dropped(dp.from_pod(a, pkt), DropReason.SPOOFED_MAC)


def test_unknown_endpoint_dropped(dp):
    x, b = dp.pods["x"], dp.pods["b"]
    assert_dropped(dp.from_pod(x, dp.l3(x, b.ipv4, 4) / UDP(dport=53)), DropReason.UNKNOWN_ENDPOINT)


# -- routing and delivery ----------------------------------------------------------------------

@pytest.mark.parametrize("family,dst", [(4, "198.51.100.1"), (6, "2001:db8:99::1")], ids=["v4", "v6"])
def test_no_route_dropped(dp, family, dst):
    a = dp.pods["a"]
    res = dp.from_pod(a, dp.l3(a, dst, family) / TCP(dport=80, flags="S"))
    assert_dropped(res, DropReason.NO_ROUTE)
    assert res.events[-1]["src_network"] == NET1


@pytest.mark.parametrize("family,dst", [(4, "10.1.9.9"), (6, "fd10:1::9999")], ids=["v4", "v6"])
def test_routed_but_no_delivery_dropped(dp, family, dst):
    a = dp.pods["a"]
    assert_dropped(dp.from_pod(a, dp.l3(a, dst, family) / UDP(dport=53)), DropReason.NO_DELIVERY)


@pytest.mark.parametrize("family", FAMILIES)
def test_remote_delivery_encapsulates_byte_by_byte(dp, family):
    a = dp.pods["a"]
    dst = REMOTE["ipv4" if family == 4 else "ipv6"]
    inner_in = dp.l3(a, dst, family, **({"ttl": 64} if family == 4 else {"hlim": 64})) / \
        TCP(sport=43000, dport=8080, flags="S") / Raw(b"x" * 32)
    res = dp.from_pod(a, inner_in)
    assert res.retval == TC_ACT_REDIRECT, res.events
    out = res.data
    # Ethernet: rewritten for the underlay neighbour, IPv6 ethertype
    assert out[0:6] == mac_bytes(NEIGH_MAC)
    assert out[6:12] == mac_bytes(UPLINK_MAC)
    assert out[12:14] == b"\x86\xdd"
    outer = IPv6(out[14:54])
    assert outer.version == 6 and outer.hlim == 64
    assert outer.nh == (4 if family == 4 else 41)
    assert outer.src == UNDERLAY1
    # SID = node 2 locator | function: network 1 | argument: source network 1
    assert outer.dst == "2001:db8:2:0:1:0:1:0"
    inner_bytes = bytes(inner_in)[14:]
    assert outer.plen == len(inner_bytes)
    got_inner = out[54:]
    assert len(got_inner) == len(inner_bytes)
    # inner packet intact except the decremented TTL / hop limit (and the IPv4 checksum)
    if family == 4:
        assert got_inner[8] == 63
        diff = [i for i in range(len(inner_bytes)) if got_inner[i] != inner_bytes[i]]
        assert set(diff) <= {8, 10, 11}
        assert ipv4_checksum_ok(got_inner)
    else:
        assert got_inner[7] == 63
        diff = [i for i in range(len(inner_bytes)) if got_inner[i] != inner_bytes[i]]
        assert diff == [7]
    ev = res.events[-1]
    assert ev["delivery"] == DeliveryKind.REMOTE and ev["node_id"] == 2
    assert ev["dst_segment"] == REMOTE["segment"]


# -- the underlay's next hop, cached per SID (nexthops) ----------------------------------------

def _remote_syn(dp, a, family: int, sport: int, payload: int = 32):
    dst = REMOTE["ipv4" if family == 4 else "ipv6"]
    return dp.l3(a, dst, family) / TCP(sport=sport, dport=8080, flags="S") / Raw(b"x" * payload)


def _nexthops(dp) -> dict[str, dict]:
    m = dp.m("nexthops")
    return {decode_nexthop_key(k)["sid"]: decode_nexthop(v) for k, v in m.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_remote_delivery_caches_the_fib_answer_and_sends_by_it(dp, family):
    a = dp.pods["a"]
    assert _nexthops(dp) == {}
    res = dp.from_pod(a, _remote_syn(dp, a, family, 43100))
    assert res.retval == TC_ACT_REDIRECT, res.events
    sid = "2001:db8:2:0:1:0:1:0"
    nh = _nexthops(dp)[sid]
    assert (nh["dmac"], nh["smac"], nh["ifindex"], nh["mtu"]) == (NEIGH_MAC, UPLINK_MAC, dp.ifindex["up0"], 1500)
    now = now_coarse()
    assert now < nh["expires_ns"] <= now + NEXTHOP_TTL_NS + 10_000_000
    # while it is fresh, packets go where the entry says, without asking the FIB: an entry naming
    # another next hop shows it (the FIB still says NEIGH_MAC)
    other = "02:00:00:00:0f:99"
    key = nexthop_key(sid)
    raw = NEXTHOP.pack(expires_ns=nh["expires_ns"] + 10**12, ifindex=nh["ifindex"], mtu=1500,
                       smac=mac_bytes(UPLINK_MAC), dmac=mac_bytes(other), pad=0)
    dp.m("nexthops").update(key, raw)
    res = dp.from_pod(a, _remote_syn(dp, a, family, 43101))
    assert res.retval == TC_ACT_REDIRECT and res.data[0:6] == mac_bytes(other)
    # once it has expired, the FIB is asked again and the entry renewed from its answer
    dp.m("nexthops").update(key, NEXTHOP.pack(expires_ns=1, ifindex=nh["ifindex"], mtu=1500,
                                              smac=mac_bytes(UPLINK_MAC), dmac=mac_bytes(other), pad=0))
    res = dp.from_pod(a, _remote_syn(dp, a, family, 43102))
    assert res.retval == TC_ACT_REDIRECT and res.data[0:6] == mac_bytes(NEIGH_MAC)
    assert _nexthops(dp)[sid]["dmac"] == NEIGH_MAC and _nexthops(dp)[sid]["expires_ns"] > now


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packet_longer_than_the_uplink_takes_is_refused_with_a_fresh_next_hop_too(dp, family):
    """The FIB lookup refuses a (non-GSO) packet the uplink's MTU cannot take; a packet sent by the
    cached answer meets the same check. Encapsulated, 1,480 bytes of IP are 1,520 on a 1,500 uplink."""
    a = dp.pods["a"]
    big = 1480 - (20 if family == 4 else 40) - 20
    assert_dropped(dp.from_pod(a, _remote_syn(dp, a, family, 43200, payload=big)), DropReason.FIB_LOOKUP_FAILED)
    assert _nexthops(dp) == {}, "a refused lookup caches nothing"
    assert dp.from_pod(a, _remote_syn(dp, a, family, 43201)).retval == TC_ACT_REDIRECT
    assert len(_nexthops(dp)) == 1
    assert_dropped(dp.from_pod(a, _remote_syn(dp, a, family, 43202, payload=big)), DropReason.FIB_LOOKUP_FAILED)
    fits = 1460 - (20 if family == 4 else 40) - 20   # 1,500 bytes encapsulated: goes by the cached answer
    assert dp.from_pod(a, _remote_syn(dp, a, family, 43203, payload=fits)).retval == TC_ACT_REDIRECT


def test_remote_without_underlay_route_dropped(dp):
    a = dp.pods["a"]
    dp.deliver_remote(NET1, "10.1.3.0/24", "2001:db8:3::/48", node_id=3)
    res = dp.from_pod(a, dp.l3(a, "10.1.3.1", 4) / UDP(dport=53))
    assert_dropped(res, DropReason.FIB_LOOKUP_FAILED)
    assert ct_total(dp) == 0, "a new flow that never left leaves no conntrack entry"


@pytest.mark.parametrize("family,dst", [(4, "10.1.255.254"), (6, "fd10:1::fffe")], ids=["v4", "v6"])
def test_delivery_to_host(dp, family, dst):
    a = dp.pods["a"]
    dp.deliver_host(NET1, f"{dst}/{32 if family == 4 else 128}")
    res = dp.from_pod(a, dp.l3(a, dst, family) / TCP(dport=10250, flags="S"))
    assert res.retval == TC_ACT_OK
    assert res.events[-1]["delivery"] == DeliveryKind.HOST


def test_route_to_outside(dp):
    a = dp.pods["a"]
    dp.route(NET1, "203.0.113.0/24", 0xFFFFFFFF)
    res = dp.from_pod(a, dp.l3(a, "203.0.113.5", 4) / TCP(dport=443, flags="S"))
    assert res.retval == TC_ACT_OK
    ev = res.events[-1]
    assert ev["delivery"] == DeliveryKind.OUTSIDE and ev["dst_segment"] == 2  # world


@pytest.mark.parametrize("family", FAMILIES)
def test_ttl_exhausted_dropped(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    kw = {"ttl": 1} if family == 4 else {"hlim": 1}
    assert_dropped(dp.from_pod(a, dp.l3(a, b.ip(family), family, **kw) / UDP(dport=53)),
                   DropReason.TTL_EXCEEDED)


# -- overlapping networks ----------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_overlapping_networks_deliver_to_own_network(dp, family):
    # c has a's addresses in network 2; d is c's peer. c -> d reaches d, never a network-1 pod.
    c, d = dp.pods["c"], dp.pods["d"]
    res = dp.from_pod(c, dp.l3(c, d.ip(family), family) / TCP(sport=1234, dport=80, flags="S"))
    assert_local(res, dp, "d", family)
    assert ct_entry(dp, NET2, c.ip(family), d.ip(family), 1234, 80, 6) is not None
    assert ct_entry(dp, NET1, c.ip(family), d.ip(family), 1234, 80, 6) is None
    # d -> "a's address" in network 2 is c, not a
    res = dp.from_pod(d, dp.l3(d, c.ip(family), family) / UDP(sport=9, dport=9))
    assert_local(res, dp, "c", family)


@pytest.mark.parametrize("family", FAMILIES)
def test_network_isolation(dp, family):
    # a (network 1) targets d's address: network 1 has no pod there and no route into network 2
    a, d = dp.pods["a"], dp.pods["d"]
    assert_dropped(dp.from_pod(a, dp.l3(a, d.ip(family), family) / UDP(dport=53)), DropReason.NO_DELIVERY)


# -- policy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_egress_denied_when_selected_without_rule(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(a.segment, EGR, policy_id=11)
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=1, dport=80, flags="S"))
    assert_dropped(res, DropReason.POLICY_EGRESS)
    assert res.events[-1]["policy_id"] == 11
    assert ct_entry(dp, NET1, a.ip(family), b.ip(family), 1, 80, 6) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_egress_allowed_by_rule_and_port(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(a.segment, EGR)
    dp.allow(a.segment, b.segment, EGR, proto=6, port=80, policy_id=12, rule=3)
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=1, dport=80, flags="S"))
    assert_local(res, dp, "b", family)
    assert res.events[-1]["policy_id"] == 12 and res.events[-1]["rule"] == 3
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=1, dport=81, flags="S"))
    assert_dropped(res, DropReason.POLICY_EGRESS)
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / UDP(sport=1, dport=80))
    assert_dropped(res, DropReason.POLICY_EGRESS)


@pytest.mark.parametrize("family", FAMILIES)
def test_ingress_denied_when_selected_without_rule(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING, policy_id=21)
    assert_dropped(dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(dport=80, flags="S")),
                   DropReason.POLICY_INGRESS)


@pytest.mark.parametrize("family", FAMILIES)
def test_ingress_allowed_from_peer_segment(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING)
    dp.allow(b.segment, a.segment, ING, proto=6, port=80)
    assert_local(dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(dport=80, flags="S")), dp, "b", family)


def test_port_range_rule(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING)
    dp.allow(b.segment, a.segment, ING, proto=17, port=1000, end_port=2000)
    for port, ok in [(999, False), (1000, True), (1500, True), (2000, True), (2001, False)]:
        res = dp.from_pod(a, dp.l3(a, b.ipv4, 4) / UDP(sport=port, dport=port))
        assert (res.retval == TC_ACT_REDIRECT) == ok, port


def test_any_peer_and_any_protocol_rules(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING)
    dp.allow(b.segment, 0, ING, proto=None)   # from anyone, anything
    assert_local(dp.from_pod(a, dp.l3(a, b.ipv6, 6) / UDP(dport=7)), dp, "b", 6)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_allow_when_no_policy_selects(dp, family):
    # a policy selecting some other segment changes nothing for a -> b
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(999, ING)
    dp.select(999, EGR)
    assert_local(dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(dport=80, flags="S")), dp, "b", family)


@pytest.mark.parametrize("family", FAMILIES)
def test_reply_allowed_while_reverse_new_flow_denied(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(a.segment, ING)          # nothing may connect to a
    A, B = a.ip(family), b.ip(family)
    assert dp.from_pod(a, dp.l3(a, B, family) / TCP(sport=5555, dport=80, flags="S")).retval == TC_ACT_REDIRECT
    res = dp.from_pod(b, dp.l3(b, A, family) / TCP(sport=80, dport=5555, flags="SA"))
    assert_local(res, dp, "a", family)
    res = dp.from_pod(b, dp.l3(b, A, family) / TCP(sport=6666, dport=22, flags="S"))
    assert_dropped(res, DropReason.POLICY_INGRESS)


def test_policy_hits_counted(dp):
    from lace.datapath.policy import POLICY_ENTRY, map_of, policy_keys
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING)
    dp.allow(b.segment, a.segment, ING, proto=6, port=80)
    for sport in (1, 2, 3):
        dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=sport, dport=80, flags="S"))
    (key,) = policy_keys(b.segment, a.segment, ING, 6, 80)
    assert map_of(key) == "policy-exact"
    assert POLICY_ENTRY.unpack(dp.m("policy-exact").lookup(key))["hits"] == 3


def test_ipblock_prefix_segment_rule(dp):
    a = dp.pods["a"]
    dp.route(NET1, "203.0.113.0/24", 0xFFFFFFFF)
    dp.prefix_segment(0xFFFFFFFF, "203.0.113.0/25", 4000)
    dp.select(a.segment, EGR)
    dp.allow(a.segment, 4000, EGR, proto=6, port=443)
    assert dp.from_pod(a, dp.l3(a, "203.0.113.5", 4) / TCP(dport=443, flags="S")).retval == TC_ACT_OK
    assert_dropped(dp.from_pod(a, dp.l3(a, "203.0.113.200", 4) / TCP(dport=443, flags="S")),
                   DropReason.POLICY_EGRESS)


def test_audit_mode_passes_and_reports(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING, audit=True)
    res = dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(dport=80, flags="S"))
    assert res.retval == TC_ACT_REDIRECT
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.AUDIT and DropReason(ev["reason"]) == DropReason.POLICY_INGRESS


# -- related ICMP errors -----------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_related_icmp_error_passes(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(a.segment, ING)          # a accepts no new flows
    A, B = a.ip(family), b.ip(family)
    orig = dp.l3(a, B, family) / UDP(sport=7000, dport=9999) / Raw(b"hello")
    assert dp.from_pod(a, orig).retval == TC_ACT_REDIRECT
    quoted = bytes(orig)[14:]
    if family == 4:
        err = dp.l3(b, A, 4) / ICMP(type=3, code=3) / Raw(quoted)
    else:
        err = dp.l3(b, A, 6) / ICMPv6DestUnreach(code=4) / Raw(quoted)
    res = dp.from_pod(b, err)
    assert_local(res, dp, "a", family)


def test_unrelated_icmp_error_dropped(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    quoted = bytes(IP(src=a.ipv4, dst=b.ipv4) / UDP(sport=1, dport=2))
    res = dp.from_pod(b, dp.l3(b, a.ipv4, 4) / ICMP(type=3, code=3) / Raw(quoted))
    assert_dropped(res, DropReason.CT_INVALID)


# -- malformed packets -------------------------------------------------------------------------

# (BPF_PROG_TEST_RUN itself refuses packets shorter than the fixed IPv4/IPv6 header, so the
# truncations tested here are the ones past it: options and extension headers.)

def test_ipv4_options_past_the_end(dp):
    a = dp.pods["a"]
    raw = bytearray(bytes(dp.l3(a, "10.1.1.11", 4) / UDP(dport=53)))
    raw[14] = 0x4F                      # IHL 15: 60 bytes of header, the packet has 28
    assert_dropped(dp.from_pod(a, bytes(raw)), DropReason.PKT_TRUNCATED)


def test_ipv6_extension_header_past_the_end(dp):
    a = dp.pods["a"]
    pkt = bytes(dp.l3(a, "fd10:1::b", 6, nh=0))  # hop-by-hop announced, nothing follows
    assert_dropped(dp.from_pod(a, pkt), DropReason.PKT_TRUNCATED)


@pytest.mark.parametrize("family", FAMILIES)
def test_truncated_tcp_header(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    full = bytes(dp.l3(a, b.ip(family), family) / TCP(dport=80))
    hdr = 20 if family == 4 else 40
    assert_dropped(dp.from_pod(a, full[:14 + hdr + 10]), DropReason.PKT_TRUNCATED)


def test_bad_ihl(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    pkt = dp.l3(a, b.ipv4, 4, ihl=3) / UDP(dport=53)
    assert_dropped(dp.from_pod(a, bytes(pkt)), DropReason.BAD_IHL)


def test_ipv4_fragment(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    assert_dropped(dp.from_pod(a, dp.l3(a, b.ipv4, 4, flags="MF") / UDP(dport=53) / Raw(b"x" * 16)),
                   DropReason.FRAGMENT)
    assert_dropped(dp.from_pod(a, dp.l3(a, b.ipv4, 4, frag=10) / Raw(b"x" * 16)), DropReason.FRAGMENT)


def test_ipv6_fragment_header(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    pkt = dp.l3(a, b.ipv6, 6) / IPv6ExtHdrFragment(m=1) / UDP(dport=53) / Raw(b"x" * 16)
    assert_dropped(dp.from_pod(a, pkt), DropReason.FRAGMENT)


def test_unsupported_transport(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    assert_dropped(dp.from_pod(a, dp.l3(a, b.ipv4, 4, proto=47) / Raw(b"\0" * 8)), DropReason.UNSUPPORTED_L4)


def test_unsupported_ethertype(dp):
    a = dp.pods["a"]
    pkt = Ether(src=a.mac, dst=a.host_mac, type=0x88CC) / Raw(b"\0" * 46)
    assert_dropped(dp.from_pod(a, pkt), DropReason.UNSUPPORTED_L3)


def test_arp_and_neighbour_discovery_go_to_the_stack(dp):
    a = dp.pods["a"]
    arp = Ether(src=a.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=a.ipv4, pdst="169.254.1.1", hwsrc=a.mac)
    assert dp.from_pod(a, arp).retval == TC_ACT_OK
    ns = Ether(src=a.mac, dst="33:33:00:00:00:01") / IPv6(src=a.ipv6, dst="ff02::1:ff00:1") / \
        ICMPv6ND_NS(tgt="fe80::1")
    assert dp.from_pod(a, ns).retval == TC_ACT_OK
    # a multicast listener report from the pod's link-local address is no spoofing attempt
    from scapy.layers.inet6 import ICMPv6MLReport2
    mld = Ether(src=a.mac, dst="33:33:00:00:00:16") / IPv6(src=link_local(a.mac), dst="ff02::16", hlim=1) / \
        ICMPv6MLReport2()
    res = dp.from_pod(a, mld)
    assert res.retval == TC_ACT_OK and not res.events


def link_local(mac: str) -> str:
    """The link-local address the kernel derives from mac (EUI-64)."""
    b = bytes.fromhex(mac.replace(":", ""))
    iid = bytes([b[0] ^ 2, b[1], b[2], 0xff, 0xfe, b[3], b[4], b[5]])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + iid))


def test_arp_speaks_for_the_pod_alone(dp):
    """The node's stack learns neighbours from a pod's ARP: it may claim only its own MAC and
    address (or none, an ARP probe)."""
    a, b = dp.pods["a"], dp.pods["b"]
    bcast = "ff:ff:ff:ff:ff:ff"
    probe = Ether(src=a.mac, dst=bcast) / ARP(psrc="0.0.0.0", pdst=a.ipv4, hwsrc=a.mac)
    assert dp.from_pod(a, probe).retval == TC_ACT_OK
    # a gratuitous reply claiming b's address, a request in b's name, another sender MAC, another frame MAC
    assert_dropped(dp.from_pod(a, Ether(src=a.mac, dst=bcast) / ARP(op=2, psrc=b.ipv4, pdst=b.ipv4, hwsrc=a.mac)),
                   DropReason.SPOOFED_SOURCE)
    assert_dropped(dp.from_pod(a, Ether(src=a.mac, dst=bcast) / ARP(psrc=b.ipv4, pdst="169.254.1.1", hwsrc=a.mac)),
                   DropReason.SPOOFED_SOURCE)
    assert_dropped(dp.from_pod(a, Ether(src=a.mac, dst=bcast) / ARP(psrc=a.ipv4, pdst="169.254.1.1", hwsrc=b.mac)),
                   DropReason.SPOOFED_MAC)
    assert_dropped(dp.from_pod(a, Ether(src=b.mac, dst=bcast) / ARP(psrc=a.ipv4, pdst="169.254.1.1", hwsrc=a.mac)),
                   DropReason.SPOOFED_MAC)


def test_neighbour_discovery_speaks_for_the_pod_alone(dp):
    """Neighbour discovery from a pod: from its own addresses (or ::), about its own addresses,
    with its own MAC in link-layer options, and never as a router."""
    from scapy.layers.inet6 import (ICMPv6ND_NA, ICMPv6ND_RA, ICMPv6ND_Redirect, ICMPv6NDOptDstLLAddr,
                                    ICMPv6NDOptSrcLLAddr, ICMPv6NDOptUnknown)

    def ICMPv6NDOptNonce():     # noqa: N802 - RFC 3971's nonce option, which scapy does not name
        return ICMPv6NDOptUnknown(type=14, len=1, data=b"\x5a" * 6)
    a, b = dp.pods["a"], dp.pods["b"]
    ll = link_local(a.mac)

    def nd(src, body):
        return Ether(src=a.mac, dst="33:33:00:00:00:01") / IPv6(src=src, dst="ff02::1", hlim=255) / body

    ok = [nd("::", ICMPv6ND_NS(tgt=ll) / ICMPv6NDOptNonce()),                      # duplicate address detection
          nd(ll, ICMPv6ND_NA(tgt=a.ipv6, O=1) / ICMPv6NDOptDstLLAddr(lladdr=a.mac)),
          nd(a.ipv6, ICMPv6ND_NS(tgt="fe80::1") / ICMPv6NDOptSrcLLAddr(lladdr=a.mac))]
    for pkt in ok:
        res = dp.from_pod(a, pkt)
        assert res.retval == TC_ACT_OK and not res.events, pkt.summary()
    spoofed = [
        (nd(ll, ICMPv6ND_NA(tgt=b.ipv6, O=1) / ICMPv6NDOptDstLLAddr(lladdr=a.mac)), DropReason.SPOOFED_SOURCE),
        (nd(b.ipv6, ICMPv6ND_NS(tgt="fe80::1") / ICMPv6NDOptSrcLLAddr(lladdr=a.mac)), DropReason.SPOOFED_SOURCE),
        (nd(link_local(b.mac), ICMPv6ND_NS(tgt="fe80::1")), DropReason.SPOOFED_SOURCE),
        (nd(ll, ICMPv6ND_RA() / ICMPv6NDOptSrcLLAddr(lladdr=a.mac)), DropReason.SPOOFED_SOURCE),
        (nd(ll, ICMPv6ND_Redirect(tgt="fe80::1", dst=b.ipv6)), DropReason.SPOOFED_SOURCE),
        (nd(ll, ICMPv6ND_NA(tgt=a.ipv6, O=1) / ICMPv6NDOptDstLLAddr(lladdr=b.mac)), DropReason.SPOOFED_MAC),
        (nd(a.ipv6, ICMPv6ND_NS(tgt="fe80::1") / ICMPv6NDOptNonce() / ICMPv6NDOptSrcLLAddr(lladdr=b.mac)),
         DropReason.SPOOFED_MAC),
        # the link-layer option hidden behind more options than the scan reads
        (nd(a.ipv6, ICMPv6ND_NS(tgt="fe80::1") / ICMPv6NDOptNonce() / ICMPv6NDOptNonce() / ICMPv6NDOptNonce() / ICMPv6NDOptNonce() /
             ICMPv6NDOptNonce() / ICMPv6NDOptNonce() / ICMPv6NDOptNonce() / ICMPv6NDOptNonce() / ICMPv6NDOptSrcLLAddr(lladdr=b.mac)),
         DropReason.UNSUPPORTED_L4),
    ]
    for pkt, reason in spoofed:
        assert_dropped(dp.from_pod(a, pkt), reason)
    frame_mac = Ether(src=b.mac, dst="33:33:00:00:00:01") / IPv6(src=ll, dst="ff02::1", hlim=255) / \
        ICMPv6ND_NA(tgt=a.ipv6)
    assert_dropped(dp.from_pod(a, frame_mac), DropReason.SPOOFED_MAC)


def test_drop_counters_by_reason(dp):
    from lace.datapath.trace import METRICS_VALUE, metrics_key
    from lace.datapath.reasons import TracePoint
    a = dp.pods["a"]
    for _ in range(3):
        dp.from_pod(a, dp.l3(a, "198.51.100.1", 4) / UDP(dport=53))
    per_cpu = dp.m("metrics").lookup_percpu(metrics_key(DropReason.NO_ROUTE, TracePoint.FROM_POD, Verdict.DROP))
    assert sum(METRICS_VALUE.unpack(v)["packets"] for v in per_cpu) == 3


# -- stale conntrack entries never bypass policy -----------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_syn_reusing_a_closed_tuple_meets_policy_again(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    A, B = a.ip(family), b.ip(family)
    assert dp.from_pod(a, dp.l3(a, B, family) / TCP(sport=45000, dport=80, flags="S")).retval == TC_ACT_REDIRECT
    dp.from_pod(b, dp.l3(b, A, family) / TCP(sport=80, dport=45000, flags="R"))
    assert ct_entry(dp, NET1, A, B, 45000, 80, 6)["state"] == CtState.CLOSED
    dp.select(b.segment, ING)       # the policy tightened meanwhile
    res = dp.from_pod(a, dp.l3(a, B, family) / TCP(sport=45000, dport=80, flags="S"))
    assert_dropped(res, DropReason.POLICY_INGRESS)


@pytest.mark.parametrize("family", FAMILIES)
def test_bare_syn_on_a_reversed_tracked_tuple_is_a_new_flow(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    A, B = a.ip(family), b.ip(family)
    dp.select(a.segment, ING)          # nothing may connect to a
    assert dp.from_pod(a, dp.l3(a, B, family) / TCP(sport=46000, dport=80, flags="S")).retval == TC_ACT_REDIRECT
    # b opening a connection on a's tuple reversed is not a reply of a's flow: it meets a's policy
    res = dp.from_pod(b, dp.l3(b, A, family) / TCP(sport=80, dport=46000, flags="S"))
    assert_dropped(res, DropReason.POLICY_INGRESS)
    assert res.events[-1]["ct_status"] == CtStatus.NEW
    # while the real reply still passes as one
    res = dp.from_pod(b, dp.l3(b, A, family) / TCP(sport=80, dport=46000, flags="SA"))
    assert_local(res, dp, "a", family)
    assert res.events == [] or res.events[-1]["ct_status"] == CtStatus.REPLY


def test_conntrack_times_are_the_monotonic_clock(dp):
    """The agent's GC and `lace node ct list` compare conntrack's times with CLOCK_MONOTONIC: an
    entry is stamped with the coarse clock of its packet's moment, and a later packet restamps it
    with a later reading (the walk reads the clock once per tick per CPU: lib/clock.h)."""
    import time

    a, b = dp.pods["a"], dp.pods["b"]
    before = now_coarse()
    dp.from_pod(a, dp.l3(a, b.ipv4, 4) / UDP(sport=6100, dport=53))
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    e = ct_entry(dp, NET1, a.ipv4, b.ipv4, 6100, 53, 17)
    assert before <= e["created_ns"] <= after
    assert e["last_seen_ns"] == e["created_ns"]
    assert e["expires_ns"] - e["last_seen_ns"] == CT_TIMEOUT_UDP * 10**9
    moved = before
    while moved <= e["created_ns"]:          # the coarse clock steps once per tick
        time.sleep(0.001)
        moved = now_coarse()
    dp.from_pod(a, dp.l3(a, b.ipv4, 4) / UDP(sport=6100, dport=53))
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    e2 = ct_entry(dp, NET1, a.ipv4, b.ipv4, 6100, 53, 17)
    assert moved <= e2["last_seen_ns"] <= after, "a later packet restamps its entry with a later reading"
    assert e2["created_ns"] == e["created_ns"] and e2["packets_fwd"] == 2
    assert e2["expires_ns"] - e2["last_seen_ns"] == CT_TIMEOUT_UDP * 10**9


def test_expired_entry_is_a_new_flow(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    dp.from_pod(a, dp.l3(a, b.ipv4, 4) / UDP(sport=6000, dport=53))
    fam, key = ct_key(NET1, a.ipv4, b.ipv4, 6000, 53, 17)
    m = dp.m("ct-udp-v4")
    e = CT_ENTRY.unpack(m.lookup(key))
    e["expires_ns"] = 1                 # long expired, gc has not run
    m.update(key, CT_ENTRY.pack(e))
    dp.select(b.segment, ING)
    assert_dropped(dp.from_pod(a, dp.l3(a, b.ipv4, 4) / UDP(sport=6000, dport=53)), DropReason.POLICY_INGRESS)
    # and a reply does not revive it either
    dp.clear_policy()
    dp.from_pod(a, dp.l3(a, b.ipv4, 4) / UDP(sport=6001, dport=53))
    fam, key = ct_key(NET1, a.ipv4, b.ipv4, 6001, 53, 17)
    e = CT_ENTRY.unpack(m.lookup(key))
    e["expires_ns"] = 1
    m.update(key, CT_ENTRY.pack(e))
    dp.select(a.segment, ING)
    res = dp.from_pod(b, dp.l3(b, a.ipv4, 4) / UDP(sport=53, dport=6001))
    assert_dropped(res, DropReason.POLICY_INGRESS)
