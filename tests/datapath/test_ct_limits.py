"""The per-endpoint conntrack limit through BPF_PROG_TEST_RUN: an endpoint whose veth entry carries
a limit (ct_max) opens at most that many flows per conntrack table; the next new flow drops as
ct-endpoint-limit (traced, counted) and writes nothing, while its established flows, replies to it,
its flows in other tables and other endpoints' new flows still pass. Service and masqueraded flows
count once. A lower count written by the agent's GC pass (the true count after expiry or
eviction) lets new flows in again. The agent's GC pass deletes expired entries and writes the true counts, so an endpoint at its
limit recovers; in a table small enough to fill, a flood stops at the flooder's share and another
pod's established flow stays. IPv4 and IPv6."""

from __future__ import annotations

import ipaddress

import pytest
from scapy.layers.inet import TCP, UDP

from lace.datapath.common import NETWORK_OUTSIDE, Verdict
from lace.agent.conntrack import GcEndpoint, gc_pass
from lace.datapath.conntrack import CT_ENTRY, ct_endpoint_key, ct_endpoint_value, ct_key, decode_ct_endpoint
from lace.datapath.masquerade import MASQ_PORT_COUNT
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.reasons import DropReason
from lace.datapath.reasons import TracePoint
from lace.datapath.testbed import TC_ACT_REDIRECT, Backend, Testbed
from lace.datapath.trace import METRICS_VALUE, metrics_key

from .test_pod_veth import assert_dropped, assert_local, ct_entry
from .test_services import PORT, TARGET, VIP, ct_total

FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
LIMIT = 3


def limit(dp, pod: str, ct_max: int) -> None:
    """Rewrite the pod's veth entry as the agent does, with ``ct_max`` flows per table."""
    p = dp.pods[pod]
    dp.m("veth").update(veth_key(p.ifindex), endpoint_value(
        endpoint_id=p.endpoint_id, network=p.network, segment=p.segment, mac=p.mac,
        ipv4=p.ipv4, ipv6=p.ipv6, ct_max=ct_max))


def counts(dp, pod: str) -> dict[str, int] | None:
    raw = dp.m("endpoint-ct").lookup(ct_endpoint_key(dp.pods[pod].ifindex))
    return decode_ct_endpoint(raw) if raw is not None else None


def syn(dp, src: str, dst: str, family: int, sport: int, flags: str = "S"):
    s, d = dp.pods[src], dp.pods[dst]
    return dp.from_pod(s, dp.l3(s, d.ip(family), family) / TCP(sport=sport, dport=80, flags=flags))


def drops_counted(dp, reason: DropReason) -> int:
    """Packets the metrics map counts as dropped at from-pod for ``reason`` (every CPU)."""
    per_cpu = dp.m("metrics").lookup_percpu(metrics_key(reason, TracePoint.FROM_POD, Verdict.DROP))
    return sum(METRICS_VALUE.unpack(v)["packets"] for v in per_cpu or ())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_new_flow_over_the_limit_drops_named_and_writes_nothing(dp, family):
    limit(dp, "a", LIMIT)
    table = f"ct-tcp-v{family}"
    for i in range(LIMIT):
        assert_local(syn(dp, "a", "b", family, 40000 + i), dp, "b", family)
    assert counts(dp, "a")[table] == LIMIT
    before, dropped_before = ct_total(dp), drops_counted(dp, DropReason.CT_ENDPOINT_LIMIT)

    res = syn(dp, "a", "b", family, 40000 + LIMIT)
    assert_dropped(res, DropReason.CT_ENDPOINT_LIMIT)
    a, b = dp.pods["a"], dp.pods["b"]
    assert ct_entry(dp, a.network, a.ip(family), b.ip(family), 40000 + LIMIT, 80, 6) is None
    assert ct_total(dp) == before, "a refused flow leaves no conntrack entry"
    assert counts(dp, "a")[table] == LIMIT, "a refused flow is not counted"
    assert drops_counted(dp, DropReason.CT_ENDPOINT_LIMIT) == dropped_before + 1

    # the flows it holds keep passing both ways: established packets never meet the limit
    assert_local(syn(dp, "a", "b", family, 40000, flags="A"), dp, "b", family)
    reply = dp.from_pod(b, dp.l3(b, a.ip(family), family) / TCP(sport=80, dport=40001, flags="SA"))
    assert_local(reply, dp, "a", family)
    # the limit is per table: a UDP flow of the same endpoint still opens
    udp = dp.from_pod(a, dp.l3(a, b.ip(family), family) / UDP(sport=5000, dport=53))
    assert_local(udp, dp, "b", family)
    # and another endpoint's share is its own
    assert_local(syn(dp, "b", "a", family, 41000), dp, "a", family)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lower_count_from_the_gc_lets_new_flows_in_again(dp, family):
    """The datapath only adds; the agent's GC pass writes the true count (entries expired or
    evicted no longer count)."""
    limit(dp, "a", LIMIT)
    for i in range(LIMIT):
        assert_local(syn(dp, "a", "b", family, 42000 + i), dp, "b", family)
    assert_dropped(syn(dp, "a", "b", family, 42010), DropReason.CT_ENDPOINT_LIMIT)
    table = f"ct-tcp-v{family}"
    dp.m("endpoint-ct").update(ct_endpoint_key(dp.pods["a"].ifindex), ct_endpoint_value({table: LIMIT - 1}))
    assert_local(syn(dp, "a", "b", family, 42010), dp, "b", family)
    assert counts(dp, "a")[table] == LIMIT
    assert_dropped(syn(dp, "a", "b", family, 42011), DropReason.CT_ENDPOINT_LIMIT)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_service_flow_counts_once_and_is_refused_without_entries(dp, family):
    limit(dp, "a", 1)
    dp.service(VIP[family], PORT, [Backend(dp.pods["b"].ip(family), TARGET)], affinity_timeout=60)
    a = dp.pods["a"]

    def to_vip(sport):
        return dp.from_pod(a, dp.l3(a, VIP[family], family) / TCP(sport=sport, dport=PORT, flags="S"))

    assert to_vip(43000).retval == TC_ACT_REDIRECT
    assert counts(dp, "a")[f"ct-tcp-v{family}"] == 1, "two entries (frontend, backend), one flow"
    before = ct_total(dp)
    dp.m("affinity").clear()
    assert_dropped(to_vip(43001), DropReason.CT_ENDPOINT_LIMIT)
    assert ct_total(dp) == before
    assert not list(dp.m("affinity").keys()), "a refused service flow leaves no affinity choice"
    assert to_vip(43000).retval == TC_ACT_REDIRECT, "the admitted flow keeps going to its backend"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_masqueraded_flow_counts_once(dp, family):
    limit(dp, "a", 1)
    dp.route(dp.pods["a"].network, "0.0.0.0/0" if family == 4 else "::/0", NETWORK_OUTSIDE, masquerade=True)
    a = dp.pods["a"]
    remote = "203.0.113.1" if family == 4 else "2001:db8:cafe::1"

    def out(sport):
        return dp.from_pod(a, dp.l3(a, remote, family) / TCP(sport=sport, dport=443, flags="S"))

    assert out(44000).retval == TC_ACT_REDIRECT
    assert counts(dp, "a")[f"ct-tcp-v{family}"] == 1, "two entries (pod, port reservation), one flow"
    before = ct_total(dp)
    assert_dropped(out(44001), DropReason.CT_ENDPOINT_LIMIT)
    assert ct_total(dp) == before, "no entry and no masquerade port taken"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_flow_dropped_at_its_hop_is_not_counted(dp, family):
    """TTL 1 (every traceroute probe): its entry is taken back (ct_forget_if_shot), its count never
    written."""
    limit(dp, "a", LIMIT)
    a, b = dp.pods["a"], dp.pods["b"]
    res = dp.from_pod(a, dp.l3(a, b.ip(family), family, **({"ttl": 1} if family == 4 else {"hlim": 1}))
                      / TCP(sport=49000, dport=80, flags="S"))
    assert_dropped(res, DropReason.TTL_EXCEEDED)
    assert counts(dp, "a") is None and ct_total(dp) == 0


def test_no_limit_counts_nothing(dp):
    """ct_max 0 (a Network with conntrackLimit: 0): nothing counted, nothing refused."""
    for i in range(LIMIT + 2):
        assert_local(syn(dp, "a", "b", 4, 45000 + i), dp, "b", 4)
    assert counts(dp, "a") is None


# -- the agent's GC pass against the real maps ------------------------------------------------------

def gc_endpoint(dp, pod: str, ct_max: int) -> GcEndpoint:
    p = dp.pods[pod]
    return GcEndpoint(f"test/{pod}", p.ifindex, p.ifname, p.network,
                      (ipaddress.ip_address(p.ipv4), ipaddress.ip_address(p.ipv6)), ct_max)


def expire(dp, table: str, key: bytes) -> None:
    """Age one entry past its expiry, as time would."""
    m = dp.m(table)
    e = CT_ENTRY.unpack(m.lookup(key))
    e["expires_ns"] = 1
    m.update(key, CT_ENTRY.pack(e))


@pytest.mark.parametrize("family", FAMILIES)
def test_gc_deletes_expired_entries_and_writes_the_true_count(dp, family):
    limit(dp, "a", LIMIT)
    a, b = dp.pods["a"], dp.pods["b"]
    for i in range(LIMIT):
        assert_local(syn(dp, "a", "b", family, 46000 + i), dp, "b", family)
    assert_local(syn(dp, "b", "a", family, 46100), dp, "a", family)      # b's own flow: not a's
    assert_dropped(syn(dp, "a", "b", family, 46010), DropReason.CT_ENDPOINT_LIMIT)
    table = f"ct-tcp-v{family}"
    _, gone = ct_key(a.network, a.ip(family), b.ip(family), 46000, 80, 6)
    expire(dp, table, gone)

    result = gc_pass(dp.loaded, [gc_endpoint(dp, "a", LIMIT), gc_endpoint(dp, "b", LIMIT)])
    assert result.deleted == 1 and dp.m(table).lookup(gone) is None
    by_pod = {e["pod"]: e for e in result.endpoints}
    assert by_pod["test/a"]["flows"] == {table: LIMIT - 1}
    assert by_pod["test/b"]["flows"] == {table: 1}
    assert counts(dp, "a")[table] == LIMIT - 1, "the true count is written back"
    # recovered: a new flow opens again, and the limit holds after it
    assert_local(syn(dp, "a", "b", family, 46010), dp, "b", family)
    assert_dropped(syn(dp, "a", "b", family, 46011), DropReason.CT_ENDPOINT_LIMIT)


def test_gc_counts_a_service_and_a_masqueraded_flow_once_and_reports_masquerade_ports(dp):
    limit(dp, "a", LIMIT)
    a = dp.pods["a"]
    dp.service(VIP[4], PORT, [Backend(dp.pods["b"].ip(4), TARGET)])
    assert dp.from_pod(a, dp.l3(a, VIP[4], 4) / TCP(sport=47000, dport=PORT, flags="S")).retval == TC_ACT_REDIRECT
    dp.route(a.network, "0.0.0.0/0", NETWORK_OUTSIDE, masquerade=True)
    assert dp.from_pod(a, dp.l3(a, "203.0.113.1", 4) / TCP(sport=47001, dport=443, flags="S")).retval \
        == TC_ACT_REDIRECT
    assert counts(dp, "a")["ct-tcp-v4"] == 2
    result = gc_pass(dp.loaded, [gc_endpoint(dp, "a", LIMIT)])
    assert result.endpoints[0]["flows"] == {"ct-tcp-v4": 2}, "4 entries, 2 flows"
    assert counts(dp, "a")["ct-tcp-v4"] == 2
    assert result.masquerade == [{"proto": "tcp", "remote": "203.0.113.1", "port": 443, "used": 1,
                                  "capacity": MASQ_PORT_COUNT}]


def test_gc_removes_the_counts_of_endpoints_gone_or_without_a_limit(dp):
    limit(dp, "a", LIMIT)
    limit(dp, "b", LIMIT)
    assert_local(syn(dp, "a", "b", 4, 48000), dp, "b", 4)
    assert_local(syn(dp, "b", "a", 4, 48001), dp, "a", 4)
    assert counts(dp, "a") is not None and counts(dp, "b") is not None
    gc_pass(dp.loaded, [gc_endpoint(dp, "a", 0)])        # a: no limit now; b: not local any more
    assert counts(dp, "a") is None and counts(dp, "b") is None


# -- a table at capacity: the flood stops at the flooder's share ----------------------------------------

@pytest.fixture(scope="module")
def small_table():
    """A test bed whose ct-tcp-v4 holds 1024 entries, so that a flood can reach its capacity."""
    tb = Testbed({"ct-tcp-v4": 1024})
    try:
        yield tb
    finally:
        tb.close()


def test_a_flood_stops_at_the_limit_and_another_pods_established_flow_survives(small_table):
    dp = small_table
    dp.reset()
    share = 128
    limit(dp, "a", share)
    limit(dp, "b", share)
    a, b = dp.pods["a"], dp.pods["b"]
    # b's connection, established before the flood
    assert_local(syn(dp, "b", "a", 4, 50000), dp, "a", 4)
    assert_local(dp.from_pod(a, dp.l3(a, b.ip(4), 4) / TCP(sport=80, dport=50000, flags="SA")), dp, "b", 4)
    assert_local(syn(dp, "b", "a", 4, 50000, flags="A"), dp, "a", 4)

    verdicts = {"forwarded": 0, "refused": 0}
    for i in range(3 * share):
        res = syn(dp, "a", "b", 4, 20000 + i)
        if res.retval == TC_ACT_REDIRECT:
            verdicts["forwarded"] += 1
        else:
            assert_dropped(res, DropReason.CT_ENDPOINT_LIMIT)
            verdicts["refused"] += 1
    assert verdicts == {"forwarded": share, "refused": 2 * share}
    assert len(list(dp.m("ct-tcp-v4").keys())) == share + 1, "the table holds the flood's share and b's flow"
    e = ct_entry(dp, b.network, b.ip(4), a.ip(4), 50000, 80, 6)
    assert e is not None, "b's established flow was not pushed out"
    assert_local(syn(dp, "b", "a", 4, 50000, flags="PA"), dp, "a", 4)
