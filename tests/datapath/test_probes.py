"""Kubelet probes into isolated networks through BPF_PROG_TEST_RUN (bpf/lib/probe.h): what the host
device, the pod veth and the uplink do with a probe address, and the two translated directions of
an admitted probe flow.

Pod c of network 2 has the same addresses as pod a of network 1 (the default network): it is
probed at its probe address PROBE (node 1's block of network 1) on port PROBE_PORT, which the probes
map sends to c's own address and port TARGET_PORT; PROBE's marker denies everything else.

A test run's packet carries a dummy socket of its own whose cookie nobody can have recorded, so a
new probe flow is always refused here; admitting one takes a real kubelet socket
(tests/integration/test_probes.py). The admitted flow's later packets and its replies are driven
from its conntrack entries, written here as the host device writes them."""

from __future__ import annotations

import socket
import struct

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6

from lace.datapath.common import SEGMENT_HOST, Direction, Verdict, addr16, addr_str, now_coarse
from lace.datapath.conntrack import CT_ENTRY, CtFlag, CtState, CtStatus, ct_key
from lace.datapath.delivery import DeliveryKind
from lace.datapath.probes import (PROBE_COOKIE, ProbeFlag, probe_address_key, probe_cookie_key, probe_key,
                                  probe_value)
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.testbed import NET1, NET2, REMOTE, TC_ACT_OK, TC_ACT_REDIRECT, icmp_echo
from lace.datapath.trace import NatKind

from .test_host import HOST, assert_dropped, assert_into_pod, ct_entry, host  # noqa: F401 (fixture)
from .test_services import checksums_valid

#: getsockopt(SOL_SOCKET, SO_COOKIE): the socket's cookie (asm-generic/socket.h)
SO_COOKIE = 57

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
PROBE = {4: "10.1.1.200", 6: "fd10:1::c8"}     # pod c's probe address, in node 1's block of network 1
PROBE_PORT, TARGET_PORT = 8080, 80


def fam_ip(family: int):
    return IP if family == 4 else IPv6


def program_probe(dp, family: int, pod: str = "c", addr: str | None = None, marker: bool = True) -> None:
    """pod's probe as the agent writes it: (addr, PROBE_PORT, tcp) -> pod's address:TARGET_PORT in its
    network, and the address's marker (unless ``marker`` is False)."""
    p = dp.pods[pod]
    addr = addr or PROBE[family]
    value = dict(network=p.network, endpoint_id=p.endpoint_id, ifindex=p.ifindex, target_addr=p.ip(family))
    dp.m("probes").update(probe_key(addr, PROBE_PORT), probe_value(**value, target_port=TARGET_PORT))
    if marker:
        dp.m("probes").update(probe_address_key(addr), probe_value(**value, target_port=0, flags=ProbeFlag.ADDRESS))


def ct_tables_empty(dp) -> bool:
    return all(not list(dp.m(f"ct-{p}-v{v}").keys()) for p in ("tcp", "udp", "icmp") for v in (4, 6))


def write_ct(dp, net: int, src: str, dst: str, sport: int, dport: int, **fields) -> None:
    now = now_coarse()
    fam, key = ct_key(net, src, dst, sport, dport, 6)
    entry = dict(created_ns=now, last_seen_ns=now, expires_ns=now + 3600 * 10**9, packets_fwd=1, bytes_fwd=60,
                 packets_rev=1, bytes_rev=60, src_segment=SEGMENT_HOST, dst_segment=0, dst_network=NET1,
                 rev_nat_id=0, nat_addr=bytes(16), nat_port=0, state=CtState.ESTABLISHED, flags=0,
                 tcp_flags_fwd=0x12, tcp_flags_rev=0x12, delivery=DeliveryKind.LOCAL, flags2=0)
    entry.update(fields)
    dp.m(f"ct-tcp-v{int(fam)}").update(key, CT_ENTRY.pack(entry))


def admitted_probe(dp, family: int, sport: int) -> None:
    """The entries lace_from_host leaves for an admitted probe from the host's sport to PROBE:
    frontend (SERVICE|PROBE) and backend (DNAT|PROBE) under the default network, the reply alias under
    the pod's network."""
    c = dp.pods["c"]
    common = dict(dst_segment=c.segment, dst_network=NET2)
    write_ct(dp, NET1, HOST[family], PROBE[family], sport, PROBE_PORT, **common,
             flags=CtFlag.SERVICE | CtFlag.PROBE, nat_addr=addr16(c.ip(family))[1], nat_port=TARGET_PORT)
    write_ct(dp, NET1, HOST[family], c.ip(family), sport, TARGET_PORT, **common,
             flags=CtFlag.DNAT | CtFlag.PROBE, nat_addr=addr16(PROBE[family])[1], nat_port=PROBE_PORT)
    write_ct(dp, NET2, HOST[family], c.ip(family), sport, TARGET_PORT, src_segment=0, dst_network=NET1,
             flags=CtFlag.ALIAS, delivery=0)


# -- the host device: a new flow needs the kubelet's socket ------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_syn_without_the_kubelets_cookie_is_denied_and_leaves_no_entry(dp, host, family):
    program_probe(dp, family)
    res = host.send(host.packet(PROBE[family], family) / TCP(sport=41000, dport=PROBE_PORT, flags="S"))
    assert_dropped(res, DropReason.PROBE_DENIED)
    ev = res.events[-1]
    assert addr_str(family, ev["daddr"]) == PROBE[family] and ev["dport"] == PROBE_PORT, "not translated"
    assert ev["src_network"] == NET1 and ev["dst_network"] == NET1
    assert ct_tables_empty(dp)
    # a packet picked up mid-stream (no SYN) is a new flow too: no way around the cookie
    assert_dropped(host.send(host.packet(PROBE[family], family) / TCP(sport=41000, dport=PROBE_PORT, flags="A")),
                   DropReason.PROBE_DENIED)
    assert ct_tables_empty(dp)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_recorded_cookie_of_another_socket_does_not_help(dp, host, family):
    """The cookie entry must be the sending socket's own: entries for other sockets leave a packet
    without its socket's entry refused. The other sockets are real ones, held open meanwhile, so no
    cookie of theirs can be the one the test run's socket gets (cookies are handed out from a
    counter that a freshly booted machine has barely moved: fixed small numbers could be it)."""
    program_probe(dp, family)
    entry = PROBE_COOKIE.pack(orig_addr=addr16(PROBE[family])[1], orig_port=PROBE_PORT, family=family, proto=6,
                              network=NET2, created_ns=0)
    others = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(64)]
    try:
        for sock in others:
            cookie = struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]
            dp.m("probe-cookie").update(probe_cookie_key(cookie), entry)
        res = host.send(host.packet(PROBE[family], family) / TCP(sport=41001, dport=PROBE_PORT, flags="S"))
    finally:
        for sock in others:
            sock.close()
    assert_dropped(res, DropReason.PROBE_DENIED)
    assert ct_tables_empty(dp)


@pytest.mark.parametrize("family", FAMILIES)
def test_other_ports_and_protocols_of_a_probe_address_are_denied_by_its_marker(dp, host, family):
    program_probe(dp, family)
    for l4 in (TCP(sport=41002, dport=9999, flags="S"), TCP(sport=41002, dport=TARGET_PORT, flags="S"),
               UDP(sport=41002, dport=PROBE_PORT), icmp_echo(family, 0x51)):
        res = host.send(host.packet(PROBE[family], family) / l4)
        assert_dropped(res, DropReason.PROBE_DENIED)
    assert ct_tables_empty(dp)
    # without the marker the address is just an address nothing delivers
    dp.m("probes").delete(probe_address_key(PROBE[family]))
    res = host.send(host.packet(PROBE[family], family) / TCP(sport=41002, dport=9999, flags="S"))
    assert_dropped(res, DropReason.NO_DELIVERY)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_default_network_pods_probe_entry_changes_nothing(dp, host, family):
    """A pod of the default network is probed at its own address: its entry (network default, no
    marker) is for the record; the host's packets to it go exactly as without the entry."""
    a = dp.pods["a"]
    syn = host.packet(a.ip(family), family) / TCP(sport=41003, dport=TARGET_PORT, flags="S")
    other = host.packet(a.ip(family), family) / TCP(sport=41004, dport=9999, flags="S")
    before = [host.send(syn), host.send(other)]
    entries = [ct_entry(dp, NET1, HOST[family], a.ip(family), sport, dport, 6)
               for sport, dport in ((41003, TARGET_PORT), (41004, 9999))]
    dp.m("ct-tcp-v4" if family == 4 else "ct-tcp-v6").clear()

    dp.m("probes").update(probe_key(a.ip(family), TARGET_PORT), probe_value(
        network=NET1, endpoint_id=a.endpoint_id, ifindex=a.ifindex, target_addr=a.ip(family),
        target_port=TARGET_PORT))
    after = [host.send(syn), host.send(other)]
    for old, new in zip(before, after):
        assert_into_pod(new, a)
        assert new.retval == old.retval and new.data == old.data
        assert [{k: v for k, v in e.items() if k != "ts_ns"} for e in new.events] == \
            [{k: v for k, v in e.items() if k != "ts_ns"} for e in old.events]
    for (sport, dport), old in zip(((41003, TARGET_PORT), (41004, 9999)), entries):
        new = ct_entry(dp, NET1, HOST[family], a.ip(family), sport, dport, 6)
        assert new["flags"] == old["flags"] == 0 and new["dst_network"] == NET1
        assert new["nat_port"] == 0 and new["delivery"] == DeliveryKind.LOCAL


# -- pods and other nodes ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_a_pod_reaching_a_probe_address_is_denied(dp, host, family):
    a = dp.pods["a"]
    program_probe(dp, family)
    res = dp.from_pod(a, dp.l3(a, PROBE[family], family) / TCP(sport=42000, dport=PROBE_PORT, flags="S"))
    assert_dropped(res, DropReason.PROBE_DENIED, TracePoint.FROM_POD)
    res = dp.from_pod(a, dp.l3(a, PROBE[family], family) / icmp_echo(family, 0x52))
    assert_dropped(res, DropReason.PROBE_DENIED, TracePoint.FROM_POD)
    assert ct_tables_empty(dp), "a packet with nowhere to go leaves no conntrack entry"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_same_bytes_in_an_isolated_network_are_no_probe_address(dp, host, family):
    """Pod d of network 2 addressing PROBE means an address of network 2, which nothing delivers:
    the marker names a default-network address only."""
    d = dp.pods["d"]
    program_probe(dp, family)
    res = dp.from_pod(d, dp.l3(d, PROBE[family], family) / TCP(sport=42001, dport=PROBE_PORT, flags="S"))
    assert_dropped(res, DropReason.NO_DELIVERY, TracePoint.FROM_POD)
    assert res.events[-1]["dst_network"] == NET2
    assert ct_tables_empty(dp)


@pytest.mark.parametrize("family", FAMILIES)
def test_another_node_reaching_a_probe_address_is_denied_after_decapsulation(dp, host, family):
    program_probe(dp, family)
    remote = REMOTE["ipv4" if family == 4 else "ipv6"]
    l3 = fam_ip(family)(src=remote, dst=PROBE[family])
    res = dp.from_uplink(dp.encap(l3 / TCP(sport=42002, dport=PROBE_PORT, flags="S"), NET1, NET1))
    assert_dropped(res, DropReason.PROBE_DENIED, TracePoint.FROM_UPLINK)
    # another address of this node's block that nothing delivers stays NO_DELIVERY
    l3 = fam_ip(family)(src=remote, dst={4: "10.1.1.201", 6: "fd10:1::c9"}[family])
    res = dp.from_uplink(dp.encap(l3 / TCP(sport=42002, dport=PROBE_PORT, flags="S"), NET1, NET1))
    assert_dropped(res, DropReason.NO_DELIVERY, TracePoint.FROM_UPLINK)


# -- an admitted probe flow --------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_an_admitted_probes_later_packets_are_translated_into_its_pod(dp, host, family):
    a, c = dp.pods["a"], dp.pods["c"]
    program_probe(dp, family)
    admitted_probe(dp, family, 43000)
    dp.configure(trace_all=True)
    res = host.send(host.packet(PROBE[family], family) / TCP(sport=43000, dport=PROBE_PORT, flags="A"))
    out = assert_into_pod(res, c)
    assert out.dst != a.mac, "pod c, not pod a of the same address in the default network"
    ip = out[fam_ip(family)]
    assert ip.src == HOST[family] and ip.dst == c.ip(family) and ip[TCP].dport == TARGET_PORT
    assert (ip.ttl if family == 4 else ip.hlim) == 63
    ev = res.events[-1]
    assert ev["verdict"] == Verdict.FORWARD and ev["ct_status"] == CtStatus.ESTABLISHED
    assert ev["nat_kind"] == NatKind.DNAT and addr_str(family, ev["nat_addr"]) == PROBE[family]
    assert ev["nat_port"] == PROBE_PORT and ev["dst_network"] == NET2 and ev["dst_segment"] == c.segment
    be = ct_entry(dp, NET1, HOST[family], c.ip(family), 43000, TARGET_PORT, 6)
    assert be["packets_fwd"] == 2, "the backend entry moves on with the flow"
    fe = ct_entry(dp, NET1, HOST[family], PROBE[family], 43000, PROBE_PORT, 6)
    assert fe["packets_fwd"] == 2 and fe["flags"] & CtFlag.PROBE


@pytest.mark.parametrize("family", FAMILIES)
def test_the_pods_reply_leaves_from_the_probe_address_to_the_host(dp, host, family):
    c = dp.pods["c"]
    program_probe(dp, family)
    admitted_probe(dp, family, 43001)
    dp.select(c.segment, Direction.EGRESS)   # selected for egress, nothing allowed: a reply is no new flow
    dp.configure(trace_all=True)
    res = dp.from_pod(c, dp.l3(c, HOST[family], family) / TCP(sport=TARGET_PORT, dport=43001, flags="SA"))
    assert res.retval == TC_ACT_OK, res.events
    ip = res.packet()[fam_ip(family)]
    assert ip.src == PROBE[family] and ip[TCP].sport == PROBE_PORT
    assert ip.dst == HOST[family] and ip[TCP].dport == 43001
    assert checksums_valid(bytes(ip))
    ev = res.events[-1]
    assert ev["ct_status"] == CtStatus.REPLY and ev["delivery"] == DeliveryKind.HOST
    assert ev["nat_kind"] == NatKind.DNAT and addr_str(family, ev["nat_addr"]) == PROBE[family]
    assert ev["dst_network"] == NET1 and ev["dst_segment"] == SEGMENT_HOST
    fe = ct_entry(dp, NET1, HOST[family], PROBE[family], 43001, PROBE_PORT, 6)
    be = ct_entry(dp, NET1, HOST[family], c.ip(family), 43001, TARGET_PORT, 6)
    assert be["packets_rev"] == 2 and fe["packets_rev"] == 2, "both entries see the reply"


@pytest.mark.parametrize("family", FAMILIES)
def test_without_the_probes_entries_the_pods_packet_to_the_host_goes_nowhere(dp, host, family):
    """The way back is the admitted probe's entries and nothing else: in pod c's own network the
    host's address is just an address of network 2, which nothing delivers."""
    c = dp.pods["c"]
    program_probe(dp, family)
    res = dp.from_pod(c, dp.l3(c, HOST[family], family) / TCP(sport=TARGET_PORT, dport=43002, flags="SA"))
    assert_dropped(res, DropReason.NO_DELIVERY, TracePoint.FROM_POD)
    assert res.events[-1]["dst_network"] == NET2
    assert ct_tables_empty(dp)
