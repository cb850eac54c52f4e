"""Delivery through the exact-match hash (delivery-exact) probed before the LPM trie, through
BPF_PROG_TEST_RUN. The test bed writes both maps as the agent does (every full-length delivery
entry into the trie and the hash, the rest into the trie only); the tests take one map's entry away
at a time to show which one answered: a full-length destination is delivered from the hash alone,
and anything the hash does not hold (a remote node's block, a full-length entry not yet in the
hash) from the trie; an established flow whose conntrack entry recorded a remote delivery goes to
the trie at once. That the two hold the same entries is the agent's part
(tests/unit/test_agent_desired.py, tests/integration/test_delivery_exact.py)."""

from __future__ import annotations

import pytest
from scapy.layers.inet import TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw

from lace.datapath.common import mac_bytes
from lace.datapath.conntrack import CtState
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_exact_key, delivery_key, exact_entries
from lace.datapath.reasons import DropReason
from lace.datapath.testbed import LOCATOR2, NET1, NET2, REMOTE, TC_ACT_REDIRECT

from .test_pod_veth import assert_dropped, assert_local, ct_entry
from .test_uplink import remote_inner

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]


def host_key(net: int, ip: str, family: int) -> bytes:
    return delivery_key(net, f"{ip}/{32 if family == 4 else 128}")


def test_the_exact_map_holds_the_tries_full_length_entries(dp):
    trie, exact = dict(dp.m("delivery").entries()), dict(dp.m("delivery-exact").entries())
    assert exact and exact == exact_entries(trie)
    for pod in ("a", "b", "c", "d"):
        p = dp.pods[pod]
        for family in (4, 6):
            assert exact[delivery_exact_key(p.network, p.ip(family))] == trie[host_key(p.network, p.ip(family), family)]
    assert delivery_key(NET1, "10.1.2.0/24") in trie and len(exact) == 8   # the pods' addresses (no host device here)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_established_packet_to_a_local_pod_is_delivered_from_the_exact_entry(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    key = host_key(NET1, b.ip(family), family)

    def ack():
        return dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=41000, dport=80, flags="A") / Raw(b"d"))

    res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=41000, dport=80, flags="S"))
    assert_local(res, dp, "b", family)
    # the trie loses b's address (no block covers it here): only the hash can deliver it now
    dp.m("delivery").delete(key)
    res = ack()
    assert_local(res, dp, "b", family)
    e = ct_entry(dp, NET1, a.ip(family), b.ip(family), 41000, 80, 6)
    assert e is not None and e["packets_fwd"] == 2 and e["state"] == CtState.SYN_SENT
    # and without the hash's entry either, nothing delivers it
    dp.m("delivery-exact").delete(delivery_exact_key(NET1, b.ip(family)))
    assert_dropped(ack(), DropReason.NO_DELIVERY)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_full_length_entry_only_in_the_trie_still_delivers(dp, family):
    """The agent writes the trie before the hash: an entry it has not reached yet is a miss in the
    hash, found in the trie."""
    a, b = dp.pods["a"], dp.pods["b"]
    dp.m("delivery-exact").delete(delivery_exact_key(NET1, b.ip(family)))
    for flags in ("S", "A"):
        res = dp.from_pod(a, dp.l3(a, b.ip(family), family) / TCP(sport=41001, dport=80, flags=flags))
        assert_local(res, dp, "b", family)
        assert res.events == [] or res.events[-1]["delivery_ifindex"] == b.ifindex


@pytest.mark.parametrize("family", FAMILIES)
def test_a_remote_block_only_in_the_trie_is_encapsulated(dp, family):
    a = dp.pods["a"]
    dst = REMOTE["ipv4" if family == 4 else "ipv6"]
    for flags in ("S", "A"):   # the new flow, then the established one: both from the trie
        res = dp.from_pod(a, dp.l3(a, dst, family) / TCP(sport=41002, dport=8080, flags=flags))
        assert res.retval == TC_ACT_REDIRECT, res.events
        outer = IPv6(res.data[14:54])
        assert outer.dst == "2001:db8:2:0:1:0:1:0", "node 2's SID for network 1"
    assert ct_entry(dp, NET1, a.ip(family), dst, 41002, 8080, 6)["delivery"] == DeliveryKind.REMOTE


def test_a_full_length_remote_entry_is_delivered_from_the_hash(dp):
    """A remote entry at full length (a /32 block) goes into the hash too, with its SID."""
    a = dp.pods["a"]
    dp.deliver_remote(NET1, "10.1.3.7/32", LOCATOR2, node_id=2)
    key = delivery_key(NET1, "10.1.3.7/32")
    assert DELIVERY.unpack(dp.m("delivery-exact").lookup(delivery_exact_key(NET1, "10.1.3.7")))["kind"] == \
        DeliveryKind.REMOTE
    dp.m("delivery").delete(key)
    res = dp.from_pod(a, dp.l3(a, "10.1.3.7", 4) / UDP(sport=41003, dport=53))
    assert res.retval == TC_ACT_REDIRECT, res.events
    assert IPv6(res.data[14:54]).dst == "2001:db8:2:0:1:0:1:0"
    assert res.events[-1]["delivery"] == DeliveryKind.REMOTE and res.events[-1]["node_id"] == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_decapsulated_packets_use_the_hash_per_network(dp, family):
    """From the uplink: pods a (network 1) and c (network 2) share their addresses; the network is
    part of the hash's key, so each network's packet reaches its own pod with the trie emptied."""
    a, c = dp.pods["a"], dp.pods["c"]
    dp.m("delivery").clear()
    for net, pod in ((NET1, a), (NET2, c)):
        inner = remote_inner(dp, pod.ip(family), family, TCP(sport=41004, dport=80, flags="S"))
        res = dp.from_uplink(dp.encap(inner, net, net))
        assert res.retval == TC_ACT_REDIRECT, res.events
        assert res.data[0:6] == bytes.fromhex(pod.mac.replace(":", ""))
        assert res.events[-1]["delivery_ifindex"] == pod.ifindex


def test_the_agents_delete_order_leaves_nothing_behind(dp):
    """undeliver deletes as the agent does (the hash first): afterwards neither map delivers."""
    a, b = dp.pods["a"], dp.pods["b"]
    for family in (4, 6):
        dp.undeliver(host_key(NET1, b.ip(family), family))
        assert_dropped(dp.from_pod(a, dp.l3(a, b.ip(family), family) / UDP(sport=41005, dport=53)),
                       DropReason.NO_DELIVERY)
    assert dict(dp.m("delivery-exact").entries()) == exact_entries(dict(dp.m("delivery").entries()))


def moved_here(dp, ip: str, family: int) -> bytes:
    """``ip`` (in node 2's block) becomes a local pod's, as the agent writes it: a full-length LOCAL
    entry in both maps, to pod b's veth. Returns its trie key."""
    b = dp.pods["b"]
    key = host_key(NET1, ip, family)
    dp.deliver(key, DELIVERY.pack(kind=DeliveryKind.LOCAL, ifindex=b.ifindex, mac=mac_bytes(b.mac),
                                  host_mac=mac_bytes(b.host_mac), endpoint_id=b.endpoint_id))
    return key


@pytest.mark.parametrize("family", FAMILIES)
def test_an_established_remote_flow_goes_to_the_trie_and_a_stale_expectation_still_delivers_right(dp, family):
    """An established flow's entry recorded REMOTE: its packets skip the hash (where a remote block
    could only miss) for the trie, which holds every entry, so an address that has since become a
    local pod's is delivered to it all the same."""
    a = dp.pods["a"]
    dst = REMOTE["ipv4" if family == 4 else "ipv6"]

    def send(flags: str):
        return dp.from_pod(a, dp.l3(a, dst, family) / TCP(sport=41006, dport=8080, flags=flags))

    assert send("S").retval == TC_ACT_REDIRECT
    assert ct_entry(dp, NET1, a.ip(family), dst, 41006, 8080, 6)["delivery"] == DeliveryKind.REMOTE
    key = moved_here(dp, dst, family)
    assert_local(send("A"), dp, "b", family)
    # the same state with the trie's /32 gone and the hash's left: the established packet follows
    # the trie to node 2's block, so the hash was not asked
    dp.m("delivery").delete(key)
    res = send("A")
    assert res.retval == TC_ACT_REDIRECT and IPv6(res.data[14:54]).dst == "2001:db8:2:0:1:0:1:0"
    # a new flow has no expectation: the hash answers first
    res = dp.from_pod(a, dp.l3(a, dst, family) / TCP(sport=41007, dport=8080, flags="S"))
    assert_local(res, dp, "b", family)
