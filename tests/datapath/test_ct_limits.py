"""The per-endpoint conntrack limit through BPF_PROG_TEST_RUN: an endpoint whose veth entry carries
a limit (ct_max) opens at most that many flows per conntrack table; the next new flow drops as
ct-endpoint-limit (traced, counted) and writes nothing, while its established flows, replies to it,
its flows in other tables and other endpoints' new flows still pass. Service and masqueraded flows
count once. A lower count written by the agent's GC pass (the true count after expiry or
eviction) lets new flows in again. IPv4 and IPv6."""

from __future__ import annotations

import pytest
from scapy.layers.inet import TCP, UDP

from lace.datapath.common import NETWORK_OUTSIDE, Verdict
from lace.datapath.conntrack import ct_endpoint_key, ct_endpoint_value, decode_ct_endpoint
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.reasons import DropReason
from lace.datapath.reasons import TracePoint
from lace.datapath.testbed import TC_ACT_REDIRECT, Backend
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


def test_no_limit_counts_nothing(dp):
    """ct_max 0 (a Network with conntrackLimit: 0): nothing counted, nothing refused."""
    for i in range(LIMIT + 2):
        assert_local(syn(dp, "a", "b", 4, 45000 + i), dp, "b", 4)
    assert counts(dp, "a") is None
