"""Service load balancing in the datapath through BPF_PROG_TEST_RUN: DNAT of new flows to a backend
(Maglev, slots, affinity), established flows through the frontend entry, reverse translation of
replies on the local and the uplink path, refusals when no backend is active, hairpin, network
scoping, and policy applied to the backend after translation. IPv4 and IPv6 where it applies."""

from __future__ import annotations

import ipaddress
import random

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror, UDPerror
from scapy.layers.inet6 import ICMPv6DestUnreach, IPv6, IPerror6
from scapy.packet import Raw

from lace.datapath.common import Direction, Verdict, addr_str, mac_bytes, now_coarse
from lace.datapath.conntrack import CT_ENTRY, CtFlag, CtFlag2, CtState, CtStatus, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.maglev import flow_hash
from lace.datapath.reasons import DropReason
from lace.datapath.registry import CT_TABLES
from lace.datapath.services import (AFFINITY, HAIRPIN_IPV4, HAIRPIN_IPV6, MAGLEV_SIZE, REVNAT_FRONTENDS,
                                    affinity_key, service_key)
from lace.datapath.testbed import (NET1, NET2, REMOTE, TC_ACT_REDIRECT, TC_ACT_SHOT, Backend, icmp_echo)
from lace.datapath.trace import NatKind

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
PROTOS = [pytest.param(6, id="tcp"), pytest.param(17, id="udp")]
ING, EGR = Direction.INGRESS, Direction.EGRESS
VIP = {4: "10.96.0.10", 6: "fd00:10:96::a"}
HAIRPIN = {4: str(HAIRPIN_IPV4), 6: str(HAIRPIN_IPV6)}
PORT, TARGET = 80, 8080


def fam_ip(family):
    return IP if family == 4 else IPv6


def remote(family: int, host: int = 20) -> str:
    """An address in node 2's pod block of network 1 (delivered remotely)."""
    return f"10.1.2.{host}" if family == 4 else f"fd10:1:0:2::{host:x}"


def l4(proto: int, sport: int, dport: int, flags: str = "S", payload: bytes = b""):
    layer = TCP(sport=sport, dport=dport, flags=flags, seq=1000) if proto == 6 else UDP(sport=sport, dport=dport)
    return layer / Raw(payload) if payload else layer


def ct(dp, net, src, dst, sport, dport, proto):
    fam, key = ct_key(net, src, dst, sport, dport, proto)
    name = {6: "tcp", 17: "udp"}[proto]
    raw = dp.m(f"ct-{name}-v{int(fam)}").lookup(key)
    return CT_ENTRY.unpack(raw) if raw is not None else None


def ct_count(dp) -> int:
    return sum(len(list(dp.m(t).keys())) for t in ("ct-tcp-v4", "ct-udp-v4", "ct-tcp-v6", "ct-udp-v6"))


def ct_total(dp) -> int:
    """Entries in every conntrack table (a dropped new flow must leave none behind)."""
    return sum(len(list(dp.m(t).keys())) for t in CT_TABLES)


def nat_of(entry, family) -> tuple[str, int]:
    return addr_str(family, entry["nat_addr"]), entry["nat_port"]


def ev_addr(ev, field: str) -> str:
    return addr_str(ev["family"], ev[field])


def checksums_valid(l3: bytes) -> bool:
    """Scapy recomputes the IPv4 header, TCP/UDP and ICMP/ICMPv6 checksums of the outer packet; a
    packet whose checksums were right is rebuilt byte for byte."""
    cls = IP if l3[0] >> 4 == 4 else IPv6
    pkt = cls(l3)
    for layer, field in ((IP, "chksum"), (TCP, "chksum"), (UDP, "chksum"), (ICMP, "chksum"),
                         (ICMPv6DestUnreach, "cksum")):
        if pkt.haslayer(layer):
            delattr(pkt.getlayer(layer), field)
    return bytes(pkt) == l3


def assert_to_pod(res, dp, pod: str):
    """Redirected into pod (its MAC from its gateway); returns the IP packet."""
    p = dp.pods[pod]
    assert res.retval == TC_ACT_REDIRECT, f"expected a redirect, got {res.retval} {res.events}"
    assert res.data[0:6] == mac_bytes(p.mac) and res.data[6:12] == mac_bytes(p.host_mac)
    return res.data[14:]


def assert_dropped(res, reason: DropReason):
    assert res.retval == TC_ACT_SHOT, f"expected drop {reason.name}, got {res.retval} {res.events}"
    assert res.events and res.events[-1]["verdict"] == Verdict.DROP
    assert DropReason(res.events[-1]["reason"]) == reason, DropReason(res.events[-1]["reason"])


def one_backend(dp, family, proto=6, backend: str = "b", **kw):
    return dp.service(VIP[family], PORT, [Backend(dp.pods[backend].ip(family), TARGET)], proto=proto, **kw)


# -- DNAT of a new flow ------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_new_service_flow_dropped_on_delivery_leaves_no_entries(dp, family, where):
    """Translated and recorded (its frontend entry), then dropped by its delivery — at this hop
    (TTL 1, a local backend) or for want of an underlay route to the backend's node: the entry goes
    with the packet."""
    a = dp.pods["a"]
    if where == "local":
        one_backend(dp, family)
        hop = {"ttl": 1} if family == 4 else {"hlim": 1}
        reason = DropReason.TTL_EXCEEDED
    else:
        # a node whose locator the underlay has no route to
        dp.deliver_remote(NET1, "10.1.3.0/24" if family == 4 else "fd10:1:0:3::/64", "2001:db8:3::/48", node_id=3)
        dp.service(VIP[family], PORT, [Backend("10.1.3.1" if family == 4 else "fd10:1:0:3::1", TARGET)])
        hop, reason = {}, DropReason.FIB_LOOKUP_FAILED
    res = dp.from_pod(a, dp.l3(a, VIP[family], family, **hop) / l4(6, 40000, PORT))
    assert_dropped(res, reason)
    assert ct_total(dp) == 0


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_new_flow_is_translated_to_the_backend(dp, family, proto):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family, proto, service_id=42)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / l4(proto, 40000, PORT, payload=b"hello"))
    out = fam_ip(family)(assert_to_pod(res, dp, "b"))
    assert out.src == a.ip(family) and out.dst == b.ip(family)
    assert out.sport == 40000 and out.dport == TARGET and bytes(out.payload.payload) == b"hello"
    assert checksums_valid(bytes(out)), "address and port rewrite keep every checksum valid"
    # one entry, the frontend's (client -> VIP), holding the backend; none keyed by the backend
    fe = ct(dp, NET1, a.ip(family), VIP[family], 40000, PORT, proto)
    assert fe and ct(dp, NET1, a.ip(family), b.ip(family), 40000, TARGET, proto) is None
    assert ct_count(dp) == 1
    assert fe["flags"] & CtFlag.SERVICE and not fe["flags"] & CtFlag.DNAT
    assert nat_of(fe, family) == (b.ip(family), TARGET)
    assert fe["rev_nat_id"] == 42 and fe["dst_network"] == NET1 and fe["dst_segment"] == b.segment
    assert fe["state"] == (CtState.SYN_SENT if proto == 6 else CtState.UNREPLIED)
    # the event: backend side of the flow, the frontend in nat_*
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.FORWARD and ev["ct_status"] == CtStatus.NEW
    assert ev["nat_kind"] == NatKind.DNAT
    assert ev_addr(ev, "saddr") == a.ip(family) and ev["sport"] == 40000
    assert ev_addr(ev, "daddr") == b.ip(family) and ev["dport"] == TARGET
    assert ev_addr(ev, "nat_addr") == VIP[family] and ev["nat_port"] == PORT
    assert ev["dst_segment"] == b.segment and ev["delivery_ifindex"] == b.ifindex


def test_port_rewrite_checksums_across_values(dp):
    """Incremental checksum updates stay valid whatever the checksum was (carries included)."""
    a = dp.pods["a"]
    one_backend(dp, 4, 17)
    for i, payload in enumerate(bytes([x, y]) for x in range(0, 256, 37) for y in range(0, 256, 53)):
        res = dp.from_pod(a, dp.l3(a, VIP[4], 4, id=i * 977) / UDP(sport=30000 + i, dport=PORT) / Raw(payload))
        assert checksums_valid(assert_to_pod(res, dp, "b")), payload


@pytest.mark.parametrize("family", FAMILIES)
def test_reply_from_a_local_backend_leaves_from_the_vip(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family)
    dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=41000, dport=PORT, flags="S", seq=7))
    dp.configure(trace_all=True)
    res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=TARGET, dport=41000, flags="SA", seq=99, ack=8))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert out.src == VIP[family] and out.sport == PORT and out.dst == a.ip(family) and out.dport == 41000
    assert checksums_valid(bytes(out))
    ev = res.events[-1]
    assert ev["ct_status"] == CtStatus.REPLY and ev["nat_kind"] == NatKind.DNAT
    assert ev_addr(ev, "saddr") == b.ip(family) and ev["sport"] == TARGET       # backend side ...
    assert ev_addr(ev, "daddr") == a.ip(family) and ev["dport"] == 41000
    assert ev_addr(ev, "nat_addr") == VIP[family] and ev["nat_port"] == PORT    # ... for the frontend
    # the flow's one entry sees the reply too (found through the backend's revnat entry)
    fe = ct(dp, NET1, a.ip(family), VIP[family], 41000, PORT, 6)
    assert fe["state"] == CtState.SYN_RECV
    assert fe["flags"] & CtFlag.SEEN_REPLY and fe["packets_rev"] == 1 and fe["packets_fwd"] == 1
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=41000, dport=PORT, flags="A", seq=8, ack=100))
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family)
    assert ct(dp, NET1, a.ip(family), VIP[family], 41000, PORT, 6)["state"] == CtState.ESTABLISHED
    ev = res.events[-1]          # an established forward packet: the same sides as the new flow's
    assert ev["ct_status"] == CtStatus.ESTABLISHED and ev["nat_kind"] == NatKind.DNAT
    assert ev_addr(ev, "saddr") == a.ip(family) and ev_addr(ev, "daddr") == b.ip(family)
    assert ev_addr(ev, "nat_addr") == VIP[family] and ev["nat_port"] == PORT


@pytest.mark.parametrize("family", FAMILIES)
def test_udp_reply_translated_and_entries_replied(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family, 17)
    dp.from_pod(a, dp.l3(a, VIP[family], family) / UDP(sport=5353, dport=PORT) / Raw(b"q"))
    res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / UDP(sport=TARGET, dport=5353) / Raw(b"answer"))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert (out.src, out.sport, bytes(out[UDP].payload)) == (VIP[family], PORT, b"answer")
    assert checksums_valid(bytes(out))
    assert ct(dp, NET1, a.ip(family), VIP[family], 5353, PORT, 17)["state"] == CtState.REPLIED


@pytest.mark.parametrize("family", FAMILIES)
def test_remote_backend_encapsulated_and_reply_translated_after_decap(dp, family):
    a = dp.pods["a"]
    R = REMOTE["ipv4" if family == 4 else "ipv6"]
    dp.service(VIP[family], PORT, [Backend(R, TARGET)])
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=42000, dport=PORT, flags="S"))
    assert res.retval == TC_ACT_REDIRECT, res.events
    outer = IPv6(res.data[14:])
    assert outer.dst == "2001:db8:2:0:1:0:1:0", "to node 2's SID for network 1"
    inner = fam_ip(family)(res.data[54:])
    assert inner.dst == R and inner.dport == TARGET and checksums_valid(bytes(inner))
    assert res.events[-1]["delivery"] == DeliveryKind.REMOTE and res.events[-1]["nat_kind"] == NatKind.DNAT
    # node 2's backend answers; its reply arrives encapsulated and leaves from the VIP
    reply = fam_ip(family)(src=R, dst=a.ip(family)) / TCP(sport=TARGET, dport=42000, flags="SA")
    res = dp.from_uplink(dp.encap(reply, NET1, NET1))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert out.src == VIP[family] and out.sport == PORT and out.dport == 42000
    assert checksums_valid(bytes(out))
    assert ct(dp, NET1, a.ip(family), VIP[family], 42000, PORT, 6)["state"] == CtState.SYN_RECV


@pytest.mark.parametrize("family", FAMILIES)
def test_non_service_replies_from_the_uplink_are_untouched(dp, family):
    # a plain flow's reply through the same code path keeps its source
    a = dp.pods["a"]
    R = REMOTE["ipv4" if family == 4 else "ipv6"]
    dp.from_pod(a, dp.l3(a, R, family) / UDP(sport=7000, dport=53))
    reply = fam_ip(family)(src=R, dst=a.ip(family)) / UDP(sport=53, dport=7000)
    out = fam_ip(family)(assert_to_pod(dp.from_uplink(dp.encap(reply, NET1, NET1)), dp, "a"))
    assert out.src == R and out.sport == 53


# -- established flows follow their frontend entry -----------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_established_flow_survives_the_service_changing_and_going(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    R = REMOTE["ipv4" if family == 4 else "ipv6"]
    one_backend(dp, family)
    syn = dp.l3(a, VIP[family], family) / TCP(sport=43000, dport=PORT, flags="S")
    ack = dp.l3(a, VIP[family], family) / TCP(sport=43000, dport=PORT, flags="A")
    assert_to_pod(dp.from_pod(a, syn), dp, "b")
    # the service now points at the remote backend only: the flow stays, new flows go there
    dp.service(VIP[family], PORT, [Backend(R, TARGET)])
    res = dp.from_pod(a, ack)
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family)
    assert not res.events, "an established packet is not traced by default"
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=43001, dport=PORT, flags="S"))
    assert fam_ip(family)(res.data[54:]).dst == R
    # the service is gone altogether: the flow still reaches its backend
    dp.m("services").clear()
    res = dp.from_pod(a, ack)
    out = fam_ip(family)(assert_to_pod(res, dp, "b"))
    assert out.dst == b.ip(family) and out.dport == TARGET and checksums_valid(bytes(out))
    assert ct(dp, NET1, a.ip(family), VIP[family], 43000, PORT, 6)["packets_fwd"] == 3
    # and its replies still come from the VIP: the backend's revnat entry outlives the service
    res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=TARGET, dport=43000, flags="A"))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert (out.src, out.sport) == (VIP[family], PORT) and checksums_valid(bytes(out))


@pytest.mark.parametrize("family", FAMILIES)
def test_backend_of_two_frontends_answers_each_flow_from_its_own(dp, family):
    """One pod port behind two services: its revnat entry names both frontends, and each flow's
    replies leave from the frontend that flow was sent to (the entry whose backend is this one)."""
    a, b = dp.pods["a"], dp.pods["b"]
    other = {4: "10.96.0.77", 6: "fd00:10:96::77"}[family]
    one_backend(dp, family, 17)
    dp.service(other, 53, [Backend(b.ip(family), TARGET)], proto=17, service_id=2)
    for vip, port, sport in ((VIP[family], PORT, 6000), (other, 53, 6001)):
        assert_to_pod(dp.from_pod(a, dp.l3(a, vip, family) / UDP(sport=sport, dport=port)), dp, "b")
    assert ct_count(dp) == 2, "one entry per flow"
    for vip, port, sport in ((VIP[family], PORT, 6000), (other, 53, 6001)):
        res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / UDP(sport=TARGET, dport=sport))
        out = fam_ip(family)(assert_to_pod(res, dp, "a"))
        assert (out.src, out.sport, out.dport) == (vip, port, sport) and checksums_valid(bytes(out))
        assert ct(dp, NET1, a.ip(family), vip, sport, port, 17)["state"] == CtState.REPLIED
    # a packet from the backend port to a client port no flow uses is no reply: a new flow, untouched
    res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / UDP(sport=TARGET, dport=6002))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert out.src == b.ip(family) and res.events[-1]["ct_status"] == CtStatus.NEW


@pytest.mark.parametrize("family", FAMILIES)
def test_closed_flow_reopened_chooses_again(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    R = REMOTE["ipv4" if family == 4 else "ipv6"]
    one_backend(dp, family)
    dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=44000, dport=PORT, flags="S"))
    dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=TARGET, dport=44000, flags="R"))
    assert ct(dp, NET1, a.ip(family), VIP[family], 44000, PORT, 6)["state"] == CtState.CLOSED
    dp.service(VIP[family], PORT, [Backend(R, TARGET)])
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=44000, dport=PORT, flags="S"))
    assert res.events[-1]["ct_status"] == CtStatus.NEW
    assert fam_ip(family)(res.data[54:]).dst == R, "a SYN on a closed tuple is a new flow: today's backend"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_port_of_a_closed_service_flow_reused_straight_to_its_backend(dp, family, where):
    """The client's kernel keeps client:p -> VIP and client:p -> backend apart, so a port whose
    service flow just closed may open a connection straight to the same backend: the backend's
    replies are the same packets. They belong to the new connection and keep the backend's
    address; the service flow's replies still come from the VIP while it is live."""
    a = dp.pods["a"]
    backend = dp.pods["b"].ip(family) if where == "local" else remote(family)
    dp.service(VIP[family], PORT, [Backend(backend, TARGET)])

    def reply(flags):
        seg = TCP(sport=TARGET, dport=45000, flags=flags)
        if where == "local":
            b = dp.pods["b"]
            return assert_to_pod(dp.from_pod(b, dp.l3(b, a.ip(family), family) / seg), dp, "a")
        pkt = fam_ip(family)(src=backend, dst=a.ip(family)) / seg
        return assert_to_pod(dp.from_uplink(dp.encap(pkt, NET1, NET1)), dp, "a")

    dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=45000, dport=PORT, flags="S"))
    assert fam_ip(family)(reply("SA")).src == VIP[family], "a live service flow's reply"
    reply("R")
    assert ct(dp, NET1, a.ip(family), VIP[family], 45000, PORT, 6)["state"] == CtState.CLOSED
    res = dp.from_pod(a, dp.l3(a, backend, family) / TCP(sport=45000, dport=TARGET, flags="S"))
    assert res.retval == TC_ACT_REDIRECT and res.events[-1]["nat_kind"] == NatKind.NONE, res.events
    out = fam_ip(family)(reply("SA"))
    assert (out.src, out.sport) == (backend, TARGET), "the direct connection's SYN-ACK keeps its source"
    assert ct(dp, NET1, a.ip(family), backend, 45000, TARGET, 6)["state"] == CtState.SYN_RECV


# -- one tuple at the backend: a live connection keeps it --------------------------------------------

def _reply(dp, family, backend: str, where: str, sport: int, dport: int, flags: str, proto: int = 6):
    """A packet from backend:sport to pod a's port dport (from pod b, or over the uplink from node 2),
    redirected into pod a: the IP packet a gets."""
    a = dp.pods["a"]
    seg = TCP(sport=sport, dport=dport, flags=flags) if proto == 6 else UDP(sport=sport, dport=dport)
    if where == "local":
        b = dp.pods["b"]
        return fam_ip(family)(assert_to_pod(dp.from_pod(b, dp.l3(b, a.ip(family), family) / seg), dp, "a"))
    pkt = fam_ip(family)(src=backend, dst=a.ip(family)) / seg
    return fam_ip(family)(assert_to_pod(dp.from_uplink(dp.encap(pkt, NET1, NET1)), dp, "a"))


def _direct(dp, family, backend: str, where: str, sport: int) -> None:
    """Pod a's connection straight to backend:TARGET from sport, established."""
    a = dp.pods["a"]
    dp.from_pod(a, dp.l3(a, backend, family) / TCP(sport=sport, dport=TARGET, flags="S"))
    _reply(dp, family, backend, where, TARGET, sport, "SA")
    dp.from_pod(a, dp.l3(a, backend, family) / TCP(sport=sport, dport=TARGET, flags="A"))
    assert ct(dp, NET1, a.ip(family), backend, sport, TARGET, 6)["state"] == CtState.ESTABLISHED


def _collide(dp, family, backend: str, where: str, sport: int):
    """Pod a's live connection straight to backend:TARGET from sport, then a SYN from the same port to
    the VIP, sent to that backend, and the backend's answer: an ACK for the live connection (RFC
    5961's challenge ACK), never a SYN-ACK. Returns that answer as pod a gets it."""
    a = dp.pods["a"]
    _direct(dp, family, backend, where, sport)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S", seq=41))
    assert res.retval == TC_ACT_REDIRECT and res.events[-1]["nat_kind"] == NatKind.DNAT, res.events
    return _reply(dp, family, backend, where, TARGET, sport, "A")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_service_flow_onto_a_live_direct_connections_tuple_leaves_it_alone_and_is_refused(dp, family, where):
    """The client's kernel keeps client:p -> backend and client:p -> VIP apart, so a new connection to
    a VIP may take the port of a live connection straight to the backend it is sent to: at the
    backend both are one tuple. The backend's answer to the new SYN, an ACK without SYN, is the live
    connection's and reaches it from the backend, as everything after it does; the service flow is
    closed. Its SYN, sent again, finds the tuple still held and no other backend: refused at once, a
    reset from the VIP (tuple-in-use)."""
    a = dp.pods["a"]
    backend = dp.pods["b"].ip(family) if where == "local" else remote(family)
    dp.service(VIP[family], PORT, [Backend(backend, TARGET)])
    out = _collide(dp, family, backend, where, 46000)
    assert (out.src, out.sport) == (backend, TARGET), "the backend's ACK is the live connection's"
    assert ct(dp, NET1, a.ip(family), VIP[family], 46000, PORT, 6)["state"] == CtState.CLOSED
    out = _reply(dp, family, backend, where, TARGET, 46000, "PA")
    assert (out.src, out.sport) == (backend, TARGET), "and so is everything after it"
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=46000, dport=PORT, flags="S", seq=41))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert (out.src, out.sport, out.dport, out[TCP].flags, out[TCP].ack) == (VIP[family], PORT, 46000, "RA", 42)
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.DROP and DropReason(ev["reason"]) == DropReason.TUPLE_IN_USE
    assert ev_addr(ev, "daddr") == VIP[family]
    out = _reply(dp, family, backend, where, TARGET, 46000, "A")
    assert (out.src, out.sport) == (backend, TARGET)
    assert ct(dp, NET1, a.ip(family), backend, 46000, TARGET, 6)["state"] == CtState.ESTABLISHED
    # a port no live connection holds goes through the VIP as always
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=46001, dport=PORT, flags="S"))
    assert res.retval == TC_ACT_REDIRECT and res.events[-1]["nat_kind"] == NatKind.DNAT, res.events


@pytest.mark.parametrize("family", FAMILIES)
def test_a_collided_service_flow_takes_another_backend_when_its_syn_comes_again(dp, family):
    """With other backends active, the SYN sent again goes to one whose tuple is free, not
    remembered as the client's affinity."""
    a, b = dp.pods["a"], dp.pods["b"]
    backends = [Backend(b.ip(family), TARGET)] + [Backend(remote(family, h), TARGET) for h in (20, 21)]
    svc = dp.service(VIP[family], PORT, backends, maglev_table=3)
    sport = 46100
    held = svc.predict(a.ip(family), sport)
    where = "local" if held.addr == b.ip(family) else "remote"
    assert _collide(dp, family, held.addr, where, sport).src == held.addr
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))
    assert res.retval == TC_ACT_REDIRECT, res.events
    ev = res.events[-1]
    got = Backend(ev_addr(ev, "daddr"), ev["dport"])
    assert got in backends and got != held, (got, held)
    entry = ct(dp, NET1, a.ip(family), VIP[family], sport, PORT, 6)
    assert nat_of(entry, family) == (got.addr, got.port) and entry["state"] == CtState.SYN_SENT


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_direct_connection_onto_a_live_service_flows_tuple_leaves_the_service_flow_its_replies(dp, family, where):
    """The other order is not looked for (it would cost every new connection to a backend pod a
    conntrack lookup): a SYN from the port of a live connection through the VIP goes straight to
    the backend, whose kernel answers it for the live connection; that answer, and every reply
    after it, still reaches the service flow from the VIP. The new connection gets no answer and
    times out; the live one is not disturbed."""
    a = dp.pods["a"]
    backend = dp.pods["b"].ip(family) if where == "local" else remote(family)
    dp.service(VIP[family], PORT, [Backend(backend, TARGET)])
    dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=46200, dport=PORT, flags="S"))
    assert _reply(dp, family, backend, where, TARGET, 46200, "SA").src == VIP[family]
    dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=46200, dport=PORT, flags="A"))
    res = dp.from_pod(a, dp.l3(a, backend, family) / TCP(sport=46200, dport=TARGET, flags="S"))
    assert res.retval == TC_ACT_REDIRECT and res.events[-1]["nat_kind"] == NatKind.NONE, res.events
    for flags in ("A", "PA"):
        out = _reply(dp, family, backend, where, TARGET, 46200, flags)
        assert (out.src, out.sport) == (VIP[family], PORT), "the service flow keeps its replies"
    assert ct(dp, NET1, a.ip(family), VIP[family], 46200, PORT, 6)["state"] == CtState.ESTABLISHED


@pytest.mark.parametrize("family", FAMILIES)
def test_a_collided_service_flows_syn_takes_the_tuple_once_the_direct_connection_closed(dp, family):
    """Only a live connection holds its tuple: reset meanwhile, its port goes to the backend
    through the VIP as usual."""
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family)
    _collide(dp, family, b.ip(family), "local", 46300)
    _reply(dp, family, b.ip(family), "local", TARGET, 46300, "R")
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=46300, dport=PORT, flags="S"))
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family)
    assert res.events[-1]["nat_kind"] == NatKind.DNAT
    assert ct(dp, NET1, a.ip(family), VIP[family], 46300, PORT, 6)["state"] == CtState.SYN_SENT


# -- backend choice ------------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_maglev_choice_is_the_python_prediction(dp, family, proto):
    a, b = dp.pods["a"], dp.pods["b"]
    backends = [Backend(b.ip(family), TARGET)] + [Backend(remote(family, h), TARGET) for h in (20, 21, 22)]
    svc = dp.service(VIP[family], PORT, backends, proto=proto, maglev_table=7)
    assert svc.table == 7
    seen = set()
    rnd = random.Random(family * 100 + proto)
    for sport in rnd.sample(range(1024, 65536), 120):
        res = dp.from_pod(a, dp.l3(a, VIP[family], family) / l4(proto, sport, PORT))
        assert res.retval == TC_ACT_REDIRECT, res.events
        ev = res.events[-1]
        got = Backend(ev_addr(ev, "daddr"), ev["dport"])
        assert got == svc.predict(a.ip(family), sport), sport
        seen.add(got)
    assert seen == set(backends), "120 flows over 4 backends reach every one"


@pytest.mark.parametrize("family", FAMILIES)
def test_slot_choice_without_a_table_is_the_python_prediction(dp, family):
    a = dp.pods["a"]
    backends = [Backend(remote(family, h), TARGET) for h in (30, 31, 32)]
    svc = dp.service(VIP[family], PORT, backends, maglev_table=0)
    assert svc.table == 0
    for sport in range(20000, 20060):
        ev = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S")).events[-1]
        assert Backend(ev_addr(ev, "daddr"), ev["dport"]) == svc.predict(a.ip(family), sport)


def test_c_flow_hash_is_the_python_flow_hash(dp):
    """A Maglev table naming MAGLEV_SIZE different backends (one entry each: ports 1..SIZE on a
    remote address) shows hash % MAGLEV_SIZE of every flow exactly."""
    backends = {4: [Backend(remote(4, 40), p) for p in range(1, MAGLEV_SIZE + 1)],
                6: [Backend(remote(6, 40), p) for p in range(1, MAGLEV_SIZE + 1)]}
    rnd = random.Random(5)
    checked = 0
    for family in (4, 6):
        for proto in (6, 17):
            for pod, net in (("a", NET1), ("c", NET2)):
                svc = dp.service(VIP[family], PORT, backends[family], proto=proto, network=net,
                                 service_id=family * 100 + proto + net)
                assert sorted(svc.entries) == sorted(svc.ids.values()), "a permutation of the backends"
                position = {bid: i for i, bid in enumerate(svc.entries)}
                p = dp.pods[pod]
                for sport in rnd.sample(range(1, 65536), 25):
                    ev = dp.from_pod(p, dp.l3(p, VIP[family], family) / l4(proto, sport, PORT)).events[-1]
                    chosen = svc.ids[Backend(ev_addr(ev, "daddr"), ev["dport"])]
                    h = flow_hash(net, p.ip(family), VIP[family], sport, PORT, proto)
                    assert position[chosen] == h % MAGLEV_SIZE, (family, proto, net, sport)
                    checked += 1
    assert checked == 200


def _coarse_now() -> int:
    return now_coarse()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("reply_entry", [False, True], ids=["", "reply-entry"])
def test_client_ip_affinity_is_honoured_and_expires(dp, family, reply_entry):
    """A ClientIP choice pins the client's next flows, until it expires — also when the backends
    are flagged REPLY_ENTRY (their new flows keep a backend entry: the choice is remembered all the
    same)."""
    a = dp.pods["a"]
    backends = [Backend(remote(family, h), TARGET) for h in (50, 51, 52, 53)]
    svc = dp.service(VIP[family], PORT, backends, affinity_timeout=60, service_id=9, reply_entry=reply_entry)
    first = svc.predict(a.ip(family), 1000)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=1000, dport=PORT, flags="S"))
    assert fam_ip(family)(res.data[54:]).dst == first.addr
    akey = affinity_key(9, NET1, a.ip(family))
    pinned = AFFINITY.unpack(dp.m("affinity").lookup(akey))
    assert pinned["backend_id"] == svc.ids[first]
    # flows that Maglev would send elsewhere go to the pinned backend
    others = [p for p in range(1001, 1400) if svc.predict(a.ip(family), p) != first][:20]
    assert len(others) == 20
    for sport in others:
        res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))
        assert fam_ip(family)(res.data[54:]).dst == first.addr, sport
    # another client is not pinned by a's entry
    b = dp.pods["b"]
    sport = next(p for p in range(2000, 3000) if svc.predict(b.ip(family), p) != first)
    res = dp.from_pod(b, dp.l3(b, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))
    assert fam_ip(family)(res.data[54:]).dst == svc.predict(b.ip(family), sport).addr
    # an entry older than the timeout no longer pins: Maglev decides and the entry is renewed
    dp.m("affinity").update(akey, AFFINITY.pack(last_used_ns=_coarse_now() - 61 * 10**9,
                                                backend_id=svc.ids[first], reserved=0))
    sport = next(p for p in range(1400, 2000) if svc.predict(a.ip(family), p) != first)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))
    now_chosen = svc.predict(a.ip(family), sport)
    assert fam_ip(family)(res.data[54:]).dst == now_chosen.addr != first.addr
    assert AFFINITY.unpack(dp.m("affinity").lookup(akey))["backend_id"] == svc.ids[now_chosen]


@pytest.mark.parametrize("family", FAMILIES)
def test_affinity_to_a_backend_no_longer_active_is_ignored(dp, family):
    a = dp.pods["a"]
    backends = [Backend(remote(family, h), TARGET) for h in (60, 61, 62)]
    svc = dp.service(VIP[family], PORT, backends, affinity_timeout=300, service_id=11)
    gone = backends[0]
    akey = affinity_key(11, NET1, a.ip(family))
    dp.m("affinity").update(akey, AFFINITY.pack(last_used_ns=_coarse_now(), backend_id=svc.ids[gone], reserved=0))
    sport = next(p for p in range(3000, 4000) if svc.predict(a.ip(family), p) != gone)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))
    assert fam_ip(family)(res.data[54:]).dst == gone.addr, "active and fresh: the entry pins"
    # the pinned backend is terminating now: the entry no longer decides, and is replaced
    svc = dp.service(VIP[family], PORT, backends[1:], terminating=[gone], affinity_timeout=300, service_id=11)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=4000, dport=PORT, flags="S"))
    chosen = svc.predict(a.ip(family), 4000)
    assert fam_ip(family)(res.data[54:]).dst == chosen.addr != gone.addr
    assert AFFINITY.unpack(dp.m("affinity").lookup(akey))["backend_id"] == svc.ids[chosen]


@pytest.mark.parametrize("family", FAMILIES)
def test_no_affinity_entry_for_a_refused_flow(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family, affinity_timeout=60, service_id=12)
    dp.select(b.segment, ING)
    assert_dropped(dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=1, dport=PORT, flags="S")),
                   DropReason.POLICY_INGRESS)
    assert dp.m("affinity").lookup(affinity_key(12, NET1, a.ip(family))) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_terminating_backend_keeps_its_flows_and_gets_no_new_ones(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    B, R = Backend(b.ip(family), TARGET), Backend(REMOTE["ipv4" if family == 4 else "ipv6"], TARGET)
    dp.service(VIP[family], PORT, [B])
    assert_to_pod(dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=45000, dport=PORT, flags="S")), dp, "b")
    dp.service(VIP[family], PORT, [R], terminating=[B])
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=45000, dport=PORT, flags="A"))
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family), "its established flow goes on"
    res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=TARGET, dport=45000, flags="A"))
    assert fam_ip(family)(assert_to_pod(res, dp, "a")).src == VIP[family]
    for sport in range(46000, 46040):
        res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))
        assert res.events[-1]["delivery"] == DeliveryKind.REMOTE, "no new flow to the terminating backend"
        assert ev_addr(res.events[-1], "daddr") == R.addr


# -- no backend: refused with an answer ------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_no_backend_answers_a_syn_with_a_reset(dp, family):
    a = dp.pods["a"]
    # only a terminating backend: no active one
    dp.service(VIP[family], PORT, [], terminating=[Backend(remote(family, 70), TARGET)])
    syn = dp.l3(a, VIP[family], family) / TCP(sport=47000, dport=PORT, flags="S", seq=123456,
                                             options=[("MSS", 1460), ("WScale", 7)])
    res = dp.from_pod(a, syn)
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert checksums_valid(bytes(out)), "a valid RST"
    assert out.src == VIP[family] and out.dst == a.ip(family)
    t = out[TCP]
    assert (t.sport, t.dport) == (PORT, 47000)
    assert t.flags == "RA" and t.seq == 0 and t.ack == 123457
    assert t.dataofs == 5 and not bytes(t.payload)
    assert len(bytes(out)) == (20 if family == 4 else 40) + 20
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.DROP and DropReason(ev["reason"]) == DropReason.SERVICE_NO_BACKEND
    assert ev_addr(ev, "daddr") == VIP[family] and ev["nat_kind"] == NatKind.NONE
    assert ct_count(dp) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_no_backend_reset_for_a_segment_with_data_and_for_an_ack(dp, family):
    a = dp.pods["a"]
    dp.service(VIP[family], PORT, [])
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=1, dport=PORT, flags="S", seq=10) / Raw(b"x" * 7))
    t = fam_ip(family)(assert_to_pod(res, dp, "a"))[TCP]
    assert t.flags == "RA" and t.ack == 10 + 1 + 7
    # a segment with ACK (a flow whose backends are gone): the reset takes its sequence from the ACK
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=2, dport=PORT, flags="PA", seq=5, ack=999) /
                      Raw(b"data"))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert checksums_valid(bytes(out))
    assert out[TCP].flags == "R" and out[TCP].seq == 999
    # a reset is never answered
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=3, dport=PORT, flags="R"))
    assert_dropped(res, DropReason.SERVICE_NO_BACKEND)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_backend_answers_udp_with_port_unreachable(dp, family):
    a = dp.pods["a"]
    dp.service(VIP[family], 53, [], proto=17)
    query = dp.l3(a, VIP[family], family) / UDP(sport=33333, dport=53) / Raw(b"Q" * 200)
    sent = bytes(query)[14:]
    res = dp.from_pod(a, query)
    raw = assert_to_pod(res, dp, "a")
    out = fam_ip(family)(raw)
    assert checksums_valid(raw), "a valid ICMP error"
    assert out.src == VIP[family] and out.dst == a.ip(family)
    if family == 4:
        assert (out[ICMP].type, out[ICMP].code) == (3, 3)
        quoted = bytes(out[ICMP].payload)
        inner, inner_l4 = out[IPerror], out[UDPerror]
    else:
        assert (out[ICMPv6DestUnreach].type, out[ICMPv6DestUnreach].code) == (1, 4)
        quoted = bytes(out[ICMPv6DestUnreach].payload)
        inner, inner_l4 = out[IPerror6], out[UDPerror]
    assert quoted == sent[:128], "the error quotes the start of the refused datagram"
    assert inner.src == a.ip(family) and inner.dst == VIP[family]
    assert (inner_l4.sport, inner_l4.dport) == (33333, 53)
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.DROP and DropReason(ev["reason"]) == DropReason.SERVICE_NO_BACKEND
    assert ct_count(dp) == 0


def test_no_backend_short_udp_quotes_it_whole(dp):
    a = dp.pods["a"]
    dp.service(VIP[4], 53, [], proto=17)
    query = dp.l3(a, VIP[4], 4) / UDP(sport=1, dport=53)
    raw = assert_to_pod(dp.from_pod(a, query), dp, "a")
    assert checksums_valid(raw)
    assert bytes(IP(raw)[ICMP].payload) == bytes(query)[14:]


# -- hairpin -------------------------------------------------------------------------------------

@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("family", FAMILIES)
def test_hairpin_flow_comes_back_from_the_reserved_address(dp, family, proto):
    a = dp.pods["a"]
    one_backend(dp, family, proto, backend="a")
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / l4(proto, 48000, PORT))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert out.src == HAIRPIN[family] and out.dst == a.ip(family)
    assert (out.sport, out.dport) == (48000, TARGET) and checksums_valid(bytes(out))
    ev = res.events[-1]
    assert ev_addr(ev, "saddr") == a.ip(family) and ev_addr(ev, "daddr") == a.ip(family)
    assert ev_addr(ev, "nat_addr") == VIP[family] and ev["delivery_ifindex"] == a.ifindex
    fe = ct(dp, NET1, a.ip(family), VIP[family], 48000, PORT, proto)
    assert fe["flags"] & CtFlag.SERVICE and nat_of(fe, family) == (a.ip(family), TARGET)
    assert ct_count(dp) == 1, "one entry, keyed by the client's own address, not the reserved one"
    # the pod answers the reserved address: back to itself, from the VIP
    reply = dp.l3(a, HAIRPIN[family], family) / l4(proto, TARGET, 48000, flags="SA")
    out = fam_ip(family)(assert_to_pod(dp.from_pod(a, reply), dp, "a"))
    assert out.src == VIP[family] and out.dst == a.ip(family)
    assert (out.sport, out.dport) == (PORT, 48000) and checksums_valid(bytes(out))
    # and its next packet to the VIP is translated the same way
    nxt = dp.l3(a, VIP[family], family) / l4(proto, 48000, PORT, flags="A")
    out = fam_ip(family)(assert_to_pod(dp.from_pod(a, nxt), dp, "a"))
    assert out.src == HAIRPIN[family] and out.dport == TARGET and checksums_valid(bytes(out))


# -- networks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_vip_of_one_network_is_not_visible_from_another(dp, family):
    c = dp.pods["c"]
    one_backend(dp, family)                         # network 1 only
    res = dp.from_pod(c, dp.l3(c, VIP[family], family) / TCP(sport=49000, dport=PORT, flags="S"))
    assert_dropped(res, DropReason.NO_ROUTE)
    ev = res.events[-1]
    assert ev["src_network"] == NET2 and ev["nat_kind"] == NatKind.NONE
    assert ev_addr(ev, "daddr") == VIP[family]
    assert ct_count(dp) == 0 and not list(dp.m("affinity").keys())


@pytest.mark.parametrize("family", FAMILIES)
def test_same_vip_in_two_networks_reaches_each_networks_backend(dp, family):
    a, b, c, d = (dp.pods[n] for n in "abcd")
    dp.service(VIP[family], PORT, [Backend(b.ip(family), TARGET, NET1)], network=NET1, service_id=1)
    dp.service(VIP[family], PORT, [Backend(d.ip(family), TARGET, NET2)], network=NET2, service_id=2)
    out = fam_ip(family)(assert_to_pod(
        dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=50000, dport=PORT, flags="S")), dp, "b"))
    assert out.dst == b.ip(family)
    # c has a's addresses in network 2: the same tuple, another network, another backend
    res = dp.from_pod(c, dp.l3(c, VIP[family], family) / TCP(sport=50000, dport=PORT, flags="S"))
    assert fam_ip(family)(assert_to_pod(res, dp, "d")).dst == d.ip(family)
    assert res.events[-1]["dst_network"] == NET2
    assert ct(dp, NET1, a.ip(family), VIP[family], 50000, PORT, 6)["rev_nat_id"] == 1
    assert ct(dp, NET2, c.ip(family), VIP[family], 50000, PORT, 6)["rev_nat_id"] == 2
    # each reply goes back into its own network
    res = dp.from_pod(d, dp.l3(d, c.ip(family), family) / TCP(sport=TARGET, dport=50000, flags="SA"))
    out = fam_ip(family)(assert_to_pod(res, dp, "c"))
    assert out.src == VIP[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_vip_offered_to_another_network_goes_there_and_its_replies_come_back(dp, family):
    # network 2 imports network 1's service: no route between the networks either way; the
    # backend's network decides the way there, its revnat entry (frontend VIP:PORT of network 2)
    # the way back
    a, b, c = dp.pods["a"], dp.pods["b"], dp.pods["c"]
    dp.service(VIP[family], PORT, [Backend(b.ip(family), TARGET, NET1)], network=NET2, service_id=3)
    res = dp.from_pod(c, dp.l3(c, VIP[family], family) / TCP(sport=51000, dport=PORT, flags="S"))
    assert fam_ip(family)(assert_to_pod(res, dp, "b")).dst == b.ip(family)
    ev = res.events[-1]
    assert ev["src_network"] == NET2 and ev["dst_network"] == NET1
    fe = ct(dp, NET2, c.ip(family), VIP[family], 51000, PORT, 6)
    assert fe["dst_network"] == NET1 and ct_count(dp) == 1, "the frontend entry alone, no reply alias"
    # b answers c's address, which in network 1 is a's: the flow's entry sends it to c, from the VIP
    res = dp.from_pod(b, dp.l3(b, c.ip(family), family) / TCP(sport=TARGET, dport=51000, flags="SA"))
    out = fam_ip(family)(assert_to_pod(res, dp, "c"))
    assert out.src == VIP[family] and out.sport == PORT and checksums_valid(bytes(out))
    fe = ct(dp, NET2, c.ip(family), VIP[family], 51000, PORT, 6)
    assert fe["state"] == CtState.SYN_RECV and fe["packets_rev"] == 1
    # a (c's address in network 1) sending the same tuple to b is a flow of its own and meets b's
    # policy
    dp.select(b.segment, ING)
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=51000, dport=TARGET, flags="A"))
    assert_dropped(res, DropReason.POLICY_INGRESS)
    assert res.events[-1]["ct_status"] == CtStatus.NEW


@pytest.mark.parametrize("family", FAMILIES)
def test_flow_from_another_networks_remote_pod_gets_its_replies_without_a_route(dp, family):
    """A pod of network 2 on node 2 reaches a in network 1 (an imported service node 2 already
    translated, or a route): its reply goes back into network 2 over SRv6 through the alias."""
    a = dp.pods["a"]
    far = remote(family, 30)
    inner = fam_ip(family)(src=far, dst=a.ip(family)) / UDP(sport=7777, dport=TARGET)
    assert_to_pod(dp.from_uplink(dp.encap(inner, NET1, NET2)), dp, "a")
    alias = ct(dp, NET1, far, a.ip(family), 7777, TARGET, 17)
    assert alias["flags"] == CtFlag.ALIAS and alias["dst_network"] == NET2
    res = dp.from_pod(a, dp.l3(a, far, family) / UDP(sport=TARGET, dport=7777))
    assert res.retval == TC_ACT_REDIRECT, res.events
    assert IPv6(res.data[14:]).dst == "2001:db8:2:0:2:0:1:0", "to node 2's SID for network 2, from network 1"
    assert ct(dp, NET2, far, a.ip(family), 7777, TARGET, 17)["state"] == CtState.REPLIED


def test_a_service_flow_has_one_entry(dp):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, 4)
    dp.from_pod(a, dp.l3(a, VIP[4], 4) / TCP(sport=52500, dport=PORT, flags="S"))
    assert ct_count(dp) == 1, "the frontend entry: no backend entry, no alias"


# -- policy applies to the backend ---------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_backend_ingress_policy_after_translation(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family)
    dp.select(b.segment, ING, policy_id=31)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=52000, dport=PORT, flags="S"))
    assert_dropped(res, DropReason.POLICY_INGRESS)
    ev = res.events[-1]
    assert ev["policy_id"] == 31 and ev["dst_segment"] == b.segment
    assert ev_addr(ev, "daddr") == b.ip(family) and ev["dport"] == TARGET, "policy saw the backend"
    assert ev["nat_kind"] == NatKind.DNAT and ev_addr(ev, "nat_addr") == VIP[family]
    assert ct_count(dp) == 0, "no entry for a dropped flow"
    # a rule for the service port does not open the backend; one for the target port does
    dp.allow(b.segment, a.segment, ING, proto=6, port=PORT)
    assert_dropped(dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=52001, dport=PORT, flags="S")),
                   DropReason.POLICY_INGRESS)
    dp.allow(b.segment, a.segment, ING, proto=6, port=TARGET, policy_id=32)
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=52002, dport=PORT, flags="S"))
    assert_to_pod(res, dp, "b")
    assert res.events[-1]["policy_id"] == 32


@pytest.mark.parametrize("family", FAMILIES)
def test_source_egress_policy_sees_the_backend(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family, 17)
    dp.select(a.segment, EGR)
    dp.prefix_segment(NET1, "10.96.0.0/16" if family == 4 else "fd00:10:96::/112", 5000)
    dp.allow(a.segment, 5000, EGR, proto=17, port=PORT)          # the VIP's own range: not enough
    assert_dropped(dp.from_pod(a, dp.l3(a, VIP[family], family) / UDP(sport=1, dport=PORT)), DropReason.POLICY_EGRESS)
    dp.allow(a.segment, b.segment, EGR, proto=17, port=TARGET)
    assert_to_pod(dp.from_pod(a, dp.l3(a, VIP[family], family) / UDP(sport=2, dport=PORT)), dp, "b")


# -- ICMP errors about a service flow ----------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_backend_icmp_error_is_written_back_to_the_frontend(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family, 17)
    req = dp.l3(a, VIP[family], family) / UDP(sport=53000, dport=PORT) / Raw(b"ping")
    forwarded = assert_to_pod(dp.from_pod(a, req), dp, "b")       # what b received: a -> b:8080
    if family == 4:
        err = dp.l3(b, a.ip(family), 4) / ICMP(type=3, code=3) / Raw(forwarded)
    else:
        err = dp.l3(b, a.ip(family), 6) / ICMPv6DestUnreach(code=4) / Raw(forwarded)
    res = dp.from_pod(b, err)
    raw = assert_to_pod(res, dp, "a")
    out = fam_ip(family)(raw)
    assert checksums_valid(raw), "the ICMP checksum covers the rewritten quote"
    assert out.src == VIP[family], "the backend's own error comes from the VIP"
    inner = out[IPerror] if family == 4 else out[IPerror6]
    inner_udp = out[UDPerror] if family == 4 else out[UDPerror]
    assert inner.src == a.ip(family) and inner.dst == VIP[family]
    assert (inner_udp.sport, inner_udp.dport) == (53000, PORT)
    if family == 4:
        hdr = bytes(inner)[:20]
        total = sum(int.from_bytes(hdr[i:i + 2], "big") for i in range(0, 20, 2))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        assert total == 0xFFFF, "the quoted IPv4 header checksum is rewritten too"
    assert res.events == [] or res.events[-1]["ct_status"] == CtStatus.RELATED


@pytest.mark.parametrize("family", FAMILIES)
def test_backend_icmp_error_about_an_imported_services_flow_goes_to_its_client(dp, family):
    """Network 2 imports network 1's service; c (network 2) has a's address (network 1). b's
    ICMP error about c's flow goes back to c, from the VIP, never to a."""
    a, b, c = dp.pods["a"], dp.pods["b"], dp.pods["c"]
    assert c.ip(family) == a.ip(family), "the test bed gives c a's address in another network"
    dp.service(VIP[family], PORT, [Backend(b.ip(family), TARGET, NET1)], network=NET2, service_id=3, proto=17)
    req = dp.l3(c, VIP[family], family) / UDP(sport=53100, dport=PORT) / Raw(b"ping")
    forwarded = assert_to_pod(dp.from_pod(c, req), dp, "b")
    if family == 4:
        err = dp.l3(b, c.ip(family), 4) / ICMP(type=3, code=3) / Raw(forwarded)
    else:
        err = dp.l3(b, c.ip(family), 6) / ICMPv6DestUnreach(code=4) / Raw(forwarded)
    res = dp.from_pod(b, err)
    out = fam_ip(family)(assert_to_pod(res, dp, "c"))
    assert out.src == VIP[family]
    inner = out[IPerror] if family == 4 else out[IPerror6]
    assert inner.src == c.ip(family) and inner.dst == VIP[family]


def test_icmp_echo_to_a_vip_is_not_translated(dp):
    a = dp.pods["a"]
    one_backend(dp, 4)
    res = dp.from_pod(a, dp.l3(a, VIP[4], 4) / icmp_echo(4))
    assert_dropped(res, DropReason.NO_ROUTE)


def test_frontend_keys_are_per_protocol_and_port(dp):
    a = dp.pods["a"]
    one_backend(dp, 4, 6)
    assert dp.m("services").lookup(service_key(NET1, VIP[4], PORT, 6)) is not None
    assert_dropped(dp.from_pod(a, dp.l3(a, VIP[4], 4) / UDP(sport=1, dport=PORT)), DropReason.NO_ROUTE)
    assert_dropped(dp.from_pod(a, dp.l3(a, VIP[4], 4) / TCP(sport=1, dport=81, flags="S")), DropReason.NO_ROUTE)


# -- a frontend the full services map left out ---------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_frontend_left_out_of_a_full_map_drops_as_map_full(dp, family):
    """The agent writes a SERVICE_MAP_FULL host route for a left-out frontend's address: a packet
    to it is dropped as map-full, with no conntrack entry, while a programmed frontend still works."""
    from lace.datapath.routing import route_value, routing_key
    a, b = dp.pods["a"], dp.pods["b"]
    plen = 32 if family == 4 else 128
    left_out = {4: "10.96.0.11", 6: "fd00:10:96::b"}[family]
    dp.m("routing").update(routing_key(NET1, f"{left_out}/{plen}"), route_value(NET1, service_map_full=True))
    one_backend(dp, family)
    res = dp.from_pod(a, dp.l3(a, left_out, family) / TCP(sport=41000, dport=PORT, flags="S"))
    assert_dropped(res, DropReason.MAP_FULL)
    assert ct_count(dp) == 0
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=41001, dport=PORT, flags="S"))
    out = fam_ip(family)(assert_to_pod(res, dp, "b"))
    assert out.dst == b.ip(family)


# -- the agent's conntrack housekeeping of service flows ------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_live_service_flows_name_their_frontends_and_go_with_their_backend(dp, family):
    """revnat_in_use reads which frontend each live service flow went through (the agent keeps
    those in the backends' revnat entries); flush_addresses, for a backend pod that is gone, takes
    its service flows too, so the client's next packet meets the service as a new flow."""
    from lace.agent.conntrack import flush_addresses, revnat_in_use
    from lace.datapath.services import revnat_key

    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family)
    dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=45000, dport=PORT, flags="S"))
    assert revnat_in_use(dp.loaded) == {
        (revnat_key(NET1, b.ip(family), TARGET, 6), (NET1, str(ipaddress.ip_address(VIP[family])), PORT))}
    assert flush_addresses(dp.loaded, NET1, [ipaddress.ip_address(b.ip(family))]) == 1
    assert ct_count(dp) == 0 and revnat_in_use(dp.loaded) == set()


# -- more frontends per backend than its revnat entry names -------------------------------------

def _frontends_of_one_backend(dp, family, backend, n, *, proto=6, network=NET1, first_reply_entry=REVNAT_FRONTENDS):
    """n frontends (VIPs 10.96.3.x / fd00:10:96::3:x, port PORT) that all send to backend, programmed
    as the agent does: the first REVNAT_FRONTENDS named by the backend's revnat entry, then the
    backend flagged REPLY_ENTRY for the others."""
    vips = [f"10.96.3.{i + 1}" if family == 4 else f"fd00:10:96::3:{i + 1:x}" for i in range(n)]
    for i, vip in enumerate(vips):
        dp.service(vip, PORT, [backend], proto=proto, network=network, service_id=100 + i,
                   reply_entry=i >= first_reply_entry)
    return vips


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_backend_behind_more_frontends_than_its_revnat_entry_answers_each_flow_from_its_own(dp, family, where):
    """Twelve frontends share one backend port: its revnat entry names eight; once the agent flags
    the backend REPLY_ENTRY, every new flow to it keeps a backend entry, and the replies of flows
    through every frontend — named in the revnat entry or not — leave from their own frontend; the
    handshake takes both entries to ESTABLISHED."""
    a, b = dp.pods["a"], dp.pods["b"]
    addr = b.ip(family) if where == "local" else REMOTE["ipv4" if family == 4 else "ipv6"]
    vips = _frontends_of_one_backend(dp, family, Backend(addr, TARGET), REVNAT_FRONTENDS + 4)
    for i, vip in enumerate(vips):
        sport = 43000 + i
        res = dp.from_pod(a, dp.l3(a, vip, family) / TCP(sport=sport, dport=PORT, flags="S", seq=1))
        assert res.retval == TC_ACT_REDIRECT, (vip, res.events)
        fe = ct(dp, NET1, a.ip(family), vip, sport, PORT, 6)
        assert fe["flags"] & CtFlag.SERVICE and nat_of(fe, family) == (addr, TARGET)
        assert fe["flags2"] & CtFlag2.BACKEND_ENTRY
        be = ct(dp, NET1, a.ip(family), addr, sport, TARGET, 6)
        assert be is not None and be["flags"] & CtFlag.DNAT and nat_of(be, family) == (vip, PORT)
        reply = fam_ip(family)(src=addr, dst=a.ip(family)) / TCP(sport=TARGET, dport=sport, flags="SA", seq=50, ack=2)
        if where == "local":
            res = dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=TARGET, dport=sport, flags="SA",
                                                                        seq=50, ack=2))
        else:
            res = dp.from_uplink(dp.encap(reply, NET1, NET1))
        out = fam_ip(family)(assert_to_pod(res, dp, "a"))
        assert (out.src, out.sport, out.dport) == (vip, PORT, sport), f"reply of the flow through {vip}"
        assert checksums_valid(bytes(out))
        res = dp.from_pod(a, dp.l3(a, vip, family) / TCP(sport=sport, dport=PORT, flags="A", seq=2, ack=51))
        assert res.retval == TC_ACT_REDIRECT, res.events
        assert ct(dp, NET1, a.ip(family), vip, sport, PORT, 6)["state"] == CtState.ESTABLISHED
        assert ct(dp, NET1, a.ip(family), addr, sport, TARGET, 6)["state"] == CtState.ESTABLISHED


@pytest.mark.parametrize("family", FAMILIES)
def test_a_reply_entry_backends_udp_flow_from_another_network_comes_back_through_its_alias(dp, family):
    """A service network 2 imports, its backend in network 1 flagged REPLY_ENTRY: the backend entry
    is keyed under the client's network 2 and the reply alias under network 1, through which b's
    answer to c's address (a's, in network 1) goes back to c, from the VIP."""
    b, c = dp.pods["b"], dp.pods["c"]
    dp.service(VIP[family], PORT, [Backend(b.ip(family), TARGET, NET1)], network=NET2, service_id=3, proto=17,
               reply_entry=True)
    assert_to_pod(dp.from_pod(c, dp.l3(c, VIP[family], family) / UDP(sport=5400, dport=PORT)), dp, "b")
    assert ct_count(dp) == 3, "frontend entry, backend entry, reply alias"
    res = dp.from_pod(b, dp.l3(b, c.ip(family), family) / UDP(sport=TARGET, dport=5400) / Raw(b"x"))
    out = fam_ip(family)(assert_to_pod(res, dp, "c"))
    assert (out.src, out.sport) == (VIP[family], PORT) and checksums_valid(bytes(out))
    assert ct(dp, NET2, c.ip(family), VIP[family], 5400, PORT, 17)["state"] == CtState.REPLIED


@pytest.mark.parametrize("family", FAMILIES)
def test_a_dropped_new_flow_to_a_reply_entry_backend_leaves_no_entries(dp, family):
    a = dp.pods["a"]
    one_backend(dp, family, reply_entry=True)
    hop = {"ttl": 1} if family == 4 else {"hlim": 1}
    res = dp.from_pod(a, dp.l3(a, VIP[family], family, **hop) / l4(6, 40001, PORT))
    assert_dropped(res, DropReason.TTL_EXCEEDED)
    assert ct_total(dp) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_a_reply_entry_backends_flow_does_not_take_a_live_direct_connections_tuple(dp, family):
    """A backend entry would take client:port -> backend:port; a live connection straight to the
    backend from that port holds it, so the new service flow is refused (its only backend) and the
    direct connection keeps its entry."""
    a, b = dp.pods["a"], dp.pods["b"]
    one_backend(dp, family, reply_entry=True)
    assert_to_pod(dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=44000, dport=TARGET, flags="S")), dp, "b")
    dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=TARGET, dport=44000, flags="SA"))
    dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=44000, dport=TARGET, flags="A"))
    direct = ct(dp, NET1, a.ip(family), b.ip(family), 44000, TARGET, 6)
    assert direct["state"] == CtState.ESTABLISHED and not direct["flags"] & CtFlag.DNAT
    res = dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=44000, dport=PORT, flags="S", seq=41))
    out = fam_ip(family)(assert_to_pod(res, dp, "a"))
    assert (out.src, out.sport, out[TCP].flags) == (VIP[family], PORT, "RA"), "a reset from the VIP"
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.DROP and DropReason(ev["reason"]) == DropReason.TUPLE_IN_USE
    assert ct(dp, NET1, a.ip(family), b.ip(family), 44000, TARGET, 6) == direct
    assert ct(dp, NET1, a.ip(family), VIP[family], 44000, PORT, 6) is None
