"""The host device through BPF_PROG_TEST_RUN: from-host (tc ingress on lace_net) into local and
remote pods, and the way back — pods reaching the host address of their own node (from-pod) and of
another node (from-uplink) — with conntrack, policy and the named drops of the host path.

The test bed's node 1 gets a host device as the agent makes it: a veth pair whose datapath end
(lace_net) is registered as role HOST, host addresses HOST in network 1 (segment HOST, local, and a
HOST delivery entry), and node 2's host address PEER_HOST inside node 2's block (REMOTE_NODE)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror
from scapy.layers.inet6 import ICMPv6DestUnreach, ICMPv6ND_NS, IPv6, IPerror6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from lace.datapath.common import (NETWORK_OUTSIDE, SEGMENT_HOST, SEGMENT_REMOTE_NODE, Direction, Verdict,
                                  mac_bytes)
from lace.datapath.conntrack import CT_ENTRY, CtState, CtStatus, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.devices import DeviceRole, device_key, device_value
from lace.datapath.policy import HOST_RULE
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.testbed import (HOST, HOST_MAC, NEIGH_MAC, NET1, NET2, NET_MAC, PEER_HOST, REMOTE, TC_ACT_OK,
                                   TC_ACT_REDIRECT, TC_ACT_SHOT, UNDERLAY1, UPLINK_MAC, icmp_echo)

from .test_services import ct_total

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
ING, EGR = Direction.INGRESS, Direction.EGRESS

NODE2_SID = "2001:db8:2:0:1:0:1:0"                   # node 2 locator | function 1 | argument 1


@dataclass
class HostDevice:
    """Node 1's host device in the test bed: lace_net's ifindex and the program on it."""

    dp: object
    ifindex: int

    def packet(self, dst: str, family: int, src: str | None = None, **kw):
        """An IP packet as the node's stack sends it out of lace_host (NOARP: to its own MAC)."""
        ether = Ether(src=HOST_MAC, dst=HOST_MAC)
        if family == 4:
            return ether / IP(src=src or HOST[4], dst=dst, **kw)
        return ether / IPv6(src=src or HOST[6], dst=dst, **kw)

    def send(self, pkt, ifindex: int | None = None):
        prog = self.dp.loaded.program("lace_from_host")
        return self.dp.run(prog, bytes(pkt), self.ifindex if ifindex is None else ifindex)


@pytest.fixture
def host(dp) -> HostDevice:
    """The base topology plus node 1's host device and both nodes' host addresses."""
    return HostDevice(dp, dp.host_device())


def ct_entry(dp, net, src, dst, sport, dport, proto):
    fam, key = ct_key(net, src, dst, sport, dport, proto)
    name = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp"}[proto]
    raw = dp.m(f"ct-{name}-v{int(fam)}").lookup(key)
    return CT_ENTRY.unpack(raw) if raw is not None else None


def assert_dropped(res, reason: DropReason, point: TracePoint = TracePoint.FROM_HOST):
    assert res.retval == TC_ACT_SHOT, f"expected drop {reason.name}, got retval {res.retval} {res.events}"
    drops = [e for e in res.events if e["verdict"] == Verdict.DROP]
    assert drops, "a drop must emit a trace event"
    assert DropReason(drops[-1]["reason"]) == reason and drops[-1]["point"] == point


def assert_into_pod(res, pod):
    assert res.retval == TC_ACT_REDIRECT, f"expected redirect into {pod.name}, got {res.retval} {res.events}"
    out = res.packet()
    assert out.dst == pod.mac and out.src == pod.host_mac
    assert res.events == [] or res.events[-1]["delivery_ifindex"] == pod.ifindex
    return out


def assert_encapsulated(res, family: int):
    assert res.retval == TC_ACT_REDIRECT, f"expected encapsulation, got {res.retval} {res.events}"
    out = res.data
    assert out[0:6] == mac_bytes(NEIGH_MAC) and out[6:12] == mac_bytes(UPLINK_MAC)
    outer = IPv6(out[14:54])
    assert outer.src == UNDERLAY1 and outer.dst == NODE2_SID
    assert outer.nh == (4 if family == 4 else 41)
    return IP(out[54:]) if family == 4 else IPv6(out[54:])


def remote(family: int) -> str:
    return REMOTE["ipv4" if family == 4 else "ipv6"]


# -- host -> local pod -------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_host_to_local_pod_delivered_with_segment_host(dp, host, family):
    a = dp.pods["a"]
    res = host.send(host.packet(a.ip(family), family, **({"ttl": 64} if family == 4 else {"hlim": 64}))
                    / TCP(sport=41000, dport=8080, flags="S"))
    out = assert_into_pod(res, a)
    inner = out[IP] if family == 4 else out[IPv6]
    assert inner.src == HOST[family] and (inner.ttl if family == 4 else inner.hlim) == 63
    ev = res.events[-1]
    assert ev["point"] == TracePoint.FROM_HOST and ev["verdict"] == Verdict.FORWARD
    assert ev["src_network"] == NET1 and ev["dst_network"] == NET1
    assert ev["src_segment"] == SEGMENT_HOST and ev["dst_segment"] == a.segment
    assert ev["ct_status"] == CtStatus.NEW and ev["delivery"] == DeliveryKind.LOCAL
    e = ct_entry(dp, NET1, HOST[family], a.ip(family), 41000, 8080, 6)
    assert e is not None and e["state"] == CtState.SYN_SENT
    assert e["src_segment"] == SEGMENT_HOST and e["dst_segment"] == a.segment
    assert e["delivery"] == DeliveryKind.LOCAL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["local", "remote"])
def test_host_flow_that_dies_at_this_hop_leaves_no_entry(dp, host, family, where):
    """Recorded, then dropped by its forward (TTL 1: into a local pod, or over SRv6): the entry
    goes with the packet."""
    dst = dp.pods["a"].ip(family) if where == "local" else remote(family)
    res = host.send(host.packet(dst, family, **({"ttl": 1} if family == 4 else {"hlim": 1}))
                    / UDP(sport=33434, dport=33435))
    assert_dropped(res, DropReason.TTL_EXCEEDED)
    assert ct_total(dp) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_pod_reply_to_host_is_established_and_handed_to_the_stack(dp, host, family):
    """The pod's answer finds the host's conntrack entry: a reply, not a new flow meeting the pod's
    egress policy (the pod is selected for egress with nothing allowed), delivered to the stack."""
    a = dp.pods["a"]
    dp.select(a.segment, EGR)
    assert host.send(host.packet(a.ip(family), family) / TCP(sport=41001, dport=80, flags="S")).retval \
        == TC_ACT_REDIRECT
    res = dp.from_pod(a, dp.l3(a, HOST[family], family) / TCP(sport=80, dport=41001, flags="SA"))
    assert res.retval == TC_ACT_OK, res.events
    assert not [e for e in res.events if e["verdict"] == Verdict.DROP]
    res = host.send(host.packet(a.ip(family), family) / TCP(sport=41001, dport=80, flags="A"))
    assert_into_pod(res, a)
    e = ct_entry(dp, NET1, HOST[family], a.ip(family), 41001, 80, 6)
    assert e["state"] == CtState.ESTABLISHED and e["packets_rev"] == 1 and e["packets_fwd"] == 2
    # a new connection from the pod to the host is a new flow: egress policy applies to it
    res = dp.from_pod(a, dp.l3(a, HOST[family], family) / TCP(sport=5555, dport=10250, flags="S"))
    assert_dropped(res, DropReason.POLICY_EGRESS, TracePoint.FROM_POD)


@pytest.mark.parametrize("family", FAMILIES)
def test_host_echo_to_local_pod_and_reply(dp, host, family):
    a = dp.pods["a"]
    assert_into_pod(host.send(host.packet(a.ip(family), family) / icmp_echo(family, 0x42)), a)
    res = dp.from_pod(a, dp.l3(a, HOST[family], family) / icmp_echo(family, 0x42, reply=True))
    assert res.retval == TC_ACT_OK
    assert res.events == [] or res.events[-1]["ct_status"] == CtStatus.REPLY
    e = ct_entry(dp, NET1, HOST[family], a.ip(family), 0x42, 0x42, 1 if family == 4 else 58)
    assert e["state"] == CtState.REPLIED


# -- policy --------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_host_meets_the_pods_ingress_policy_as_peer_host(dp, host, family):
    """A pod selected for ingress (default deny) with nothing for peer HOST drops the host; the
    entry the agent adds for every selected pod (peer HOST, any protocol) lets it in, and an
    allow for another peer does not."""
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(a.segment, ING, policy_id=9)
    dp.allow(a.segment, b.segment, ING, proto=6, port=80)
    syn = TCP(sport=42000, dport=80, flags="S")
    res = host.send(host.packet(a.ip(family), family) / syn)
    assert_dropped(res, DropReason.POLICY_INGRESS)
    assert res.events[-1]["src_segment"] == SEGMENT_HOST and res.events[-1]["policy_id"] == 9
    dp.allow(a.segment, SEGMENT_HOST, ING, policy_id=0, rule=HOST_RULE)
    res = host.send(host.packet(a.ip(family), family) / syn)
    assert_into_pod(res, a)
    assert res.events[-1]["policy_id"] == 0 and res.events[-1]["rule"] == HOST_RULE
    assert_dropped(dp.from_pod(b, dp.l3(b, a.ip(family), family) / UDP(sport=9, dport=53)),
                   DropReason.POLICY_INGRESS, TracePoint.FROM_POD)   # the host entry is for the host only


@pytest.mark.parametrize("family", FAMILIES)
def test_host_into_audited_pod_passes_as_audit(dp, host, family):
    a = dp.pods["a"]
    dp.select(a.segment, ING, audit=True)
    res = host.send(host.packet(a.ip(family), family) / TCP(sport=42001, dport=80, flags="S"))
    assert_into_pod(res, a)
    assert res.events[-1]["verdict"] == Verdict.AUDIT
    assert DropReason(res.events[-1]["reason"]) == DropReason.POLICY_INGRESS


# -- host -> remote pod, and back ------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_host_to_remote_pod_encapsulated_to_its_node(dp, host, family):
    res = host.send(host.packet(remote(family), family) / TCP(sport=43000, dport=80, flags="S") / Raw(b"h" * 8))
    inner = assert_encapsulated(res, family)
    assert inner.src == HOST[family] and inner.dst == remote(family)
    assert (inner.ttl if family == 4 else inner.hlim) == 63
    ev = res.events[-1]
    assert ev["point"] == TracePoint.FROM_HOST and ev["delivery"] == DeliveryKind.REMOTE
    assert ev["node_id"] == 2 and ev["src_segment"] == SEGMENT_HOST and ev["dst_segment"] == REMOTE["segment"]
    e = ct_entry(dp, NET1, HOST[family], remote(family), 43000, 80, 6)
    assert e is not None and e["delivery"] == DeliveryKind.REMOTE


@pytest.mark.parametrize("family", FAMILIES)
def test_reply_of_remote_pod_to_host_decapsulated_into_the_stack(dp, host, family):
    host.send(host.packet(remote(family), family) / TCP(sport=43001, dport=80, flags="S"))
    l3 = IP(src=remote(family), dst=HOST[family]) if family == 4 else IPv6(src=remote(family), dst=HOST[family])
    res = dp.from_uplink(dp.encap(l3 / TCP(sport=80, dport=43001, flags="SA"), NET1, NET1))
    assert res.retval == TC_ACT_OK, res.events
    out = res.packet()
    assert (out[IP] if family == 4 else out[IPv6]).dst == HOST[family], "decapsulated for the stack"
    assert out.haslayer(TCP) and out[TCP].flags == "SA"
    assert res.events == [] or res.events[-1]["ct_status"] == CtStatus.REPLY
    e = ct_entry(dp, NET1, HOST[family], remote(family), 43001, 80, 6)
    assert e["state"] == CtState.SYN_RECV and e["packets_rev"] == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_host_to_another_nodes_host_address_encapsulated(dp, host, family):
    res = host.send(host.packet(PEER_HOST[family], family) / icmp_echo(family, 0x43))
    assert_encapsulated(res, family)
    assert res.events[-1]["dst_segment"] == SEGMENT_REMOTE_NODE


# -- pods -> host addresses --------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_pod_to_own_host_address_handed_to_the_stack(dp, host, family):
    a = dp.pods["a"]
    res = dp.from_pod(a, dp.l3(a, HOST[family], family) / TCP(sport=44000, dport=10250, flags="S"))
    assert res.retval == TC_ACT_OK
    ev = res.events[-1]
    assert ev["delivery"] == DeliveryKind.HOST and ev["dst_segment"] == SEGMENT_HOST
    # the host's answer goes out of lace_host and finds the pod's flow
    res = host.send(host.packet(a.ip(family), family) / TCP(sport=10250, dport=44000, flags="SA"))
    assert_into_pod(res, a)
    e = ct_entry(dp, NET1, a.ip(family), HOST[family], 44000, 10250, 6)
    assert e["state"] == CtState.SYN_RECV


@pytest.mark.parametrize("family", FAMILIES)
def test_remote_pod_to_this_nodes_host_decapsulated_into_the_stack(dp, host, family):
    """Node 2's pod reaches node 1's host address: node 2 encapsulates it (node 1's block); node 1's
    uplink decapsulates it and, as the delivery entry says HOST, hands it to the stack (ingress
    policy of segment HOST, which no policy selects) instead of dropping it as NOT_LOCAL."""
    l3 = IP(src=remote(family), dst=HOST[family]) if family == 4 else IPv6(src=remote(family), dst=HOST[family])
    res = dp.from_uplink(dp.encap(l3 / TCP(sport=45000, dport=10250, flags="S"), NET1, NET1))
    assert res.retval == TC_ACT_OK, res.events
    assert (res.packet()[IP] if family == 4 else res.packet()[IPv6]).dst == HOST[family]
    ev = res.events[-1]
    assert ev["point"] == TracePoint.FROM_UPLINK and ev["verdict"] == Verdict.FORWARD
    assert ev["delivery"] == DeliveryKind.HOST and ev["dst_segment"] == SEGMENT_HOST
    assert ev["src_segment"] == REMOTE["segment"]
    # the host's answer leaves through lace_host as a reply and is encapsulated back to node 2
    res = host.send(host.packet(remote(family), family) / TCP(sport=10250, dport=45000, flags="SA"))
    assert_encapsulated(res, family)
    assert res.events == [] or res.events[-1]["ct_status"] == CtStatus.REPLY


def test_decapsulated_for_a_remote_block_is_still_not_local(dp, host):
    res = dp.from_uplink(dp.encap(IP(src=remote(4), dst=PEER_HOST[4]) / UDP(dport=53), NET1, NET1))
    assert_dropped(res, DropReason.NOT_LOCAL, TracePoint.FROM_UPLINK)


# -- ICMP errors from the node's stack ---------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_stack_icmp_error_about_a_pods_flow_reaches_the_pod(dp, host, family):
    """The node's stack answers a pod's packet it cannot forward with an ICMP error from the host
    address (the source of its route to pods); conntrack relates it to the pod's flow."""
    a = dp.pods["a"]
    dp.route(NET1, "0.0.0.0/0" if family == 4 else "::/0", NETWORK_OUTSIDE)
    world = "203.0.113.9" if family == 4 else "2001:db8:cafe::9"
    sent = dp.l3(a, world, family) / UDP(sport=46000, dport=53) / Raw(b"q")
    assert dp.from_pod(a, sent).retval == TC_ACT_OK
    quoted = bytes(sent)[14:]
    if family == 4:
        err = host.packet(a.ip(4), 4) / ICMP(type=3, code=1) / IPerror(quoted)
    else:
        err = host.packet(a.ip(6), 6) / ICMPv6DestUnreach(code=3) / IPerror6(quoted)
    res = host.send(err)
    assert_into_pod(res, a)
    assert res.events == [] or res.events[-1]["ct_status"] == CtStatus.RELATED
    # an error about nothing the node tracks is invalid
    stray = (dp.l3(a, world, family) / UDP(sport=46999, dport=53)).payload
    bogus = (host.packet(a.ip(4), 4) / ICMP(type=3, code=1) / IPerror(bytes(stray)) if family == 4 else
             host.packet(a.ip(6), 6) / ICMPv6DestUnreach(code=3) / IPerror6(bytes(stray)))
    assert_dropped(host.send(bogus), DropReason.CT_INVALID)


# -- what the host device refuses -----------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_source_other_than_a_host_address_is_spoofed(dp, host, family):
    a = dp.pods["a"]
    forwarded = {4: "198.18.0.9", 6: "2001:db8:cafe::9"}[family]
    for src in (forwarded, PEER_HOST[family], dp.pods["b"].ip(family)):
        res = host.send(host.packet(a.ip(family), family, src=src) / TCP(sport=1, dport=80, flags="S"))
        assert_dropped(res, DropReason.SPOOFED_SOURCE)
    assert ct_entry(dp, NET1, forwarded, a.ip(family), 1, 80, 6) is None


def test_interface_not_registered_as_host_device(dp, host):
    a = dp.pods["a"]
    res = host.send(host.packet(a.ipv4, 4) / TCP(dport=80, flags="S"), ifindex=dp.pods["x"].ifindex)
    assert_dropped(res, DropReason.UNKNOWN_DEVICE)
    dp.m("devices").update(device_key(host.ifindex), device_value(NET_MAC, DeviceRole.POD_VETH))
    assert_dropped(host.send(host.packet(a.ipv4, 4) / TCP(dport=80, flags="S")), DropReason.UNKNOWN_DEVICE)


@pytest.mark.parametrize("family", FAMILIES)
def test_host_reaches_the_default_network_only(dp, host, family):
    """A destination the default network routes into another network (a Network route to network
    2) is no route for the host; nor is an address no route covers."""
    other = {4: "10.9.0.12", 6: "fd10:9::d"}[family]
    dp.route(NET1, "10.9.0.0/16" if family == 4 else "fd10:9::/64", NET2)
    for dst in (other, {4: "192.0.2.1", 6: "2001:db8:ffff::1"}[family]):
        res = host.send(host.packet(dst, family) / TCP(sport=2, dport=80, flags="S"))
        assert_dropped(res, DropReason.NO_ROUTE)
        assert res.events[-1]["src_network"] == NET1


@pytest.mark.parametrize("family", FAMILIES)
def test_own_host_address_through_the_device_has_no_delivery(dp, host, family):
    res = host.send(host.packet(HOST[family], family) / UDP(sport=3, dport=53))
    assert_dropped(res, DropReason.NO_DELIVERY)
    res = host.send(host.packet({4: "10.1.1.77", 6: "fd10:1::77"}[family], family) / UDP(sport=3, dport=53))
    assert_dropped(res, DropReason.NO_DELIVERY)


def test_neighbour_discovery_of_the_device_passes_untraced(dp, host):
    ns = Ether(src=HOST_MAC, dst="33:33:ff:00:00:01") / IPv6(src="fe80::1", dst="ff02::1:ff00:1", hlim=255) / \
        ICMPv6ND_NS(tgt="fe80::1")
    res = host.send(ns)
    assert res.retval == TC_ACT_OK and res.events == []
