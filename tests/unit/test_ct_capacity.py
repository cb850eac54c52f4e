"""Conntrack capacity without a kernel: the GC pass's table walk (expired entries, flows counted per
local endpoint once per flow, masquerade reservations), the ``conntrack`` status subsystem and its
warnings (a pod at its limit, a table or a masquerade destination nearly full) as ``node status``
and ``lace status`` show them, the metric families, the Network's conntrackLimit (validation, the
limit the veth entry carries) and the agent's options."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress as ia

import pytest

from lace.agent import status as st
from lace.agent.__main__ import _ct_limit
from lace.agent.conntrack import _source_id, walk_table
from lace.agent.desired import desired_maps
from lace.agent.metrics import AgentMetrics
from lace.agent.model import Network, parse_network
from lace.cli.commands import status as cs
from lace.cli.node import metrics as nm
from lace.cli.node import status as ns
from lace.datapath.common import NETWORK_OUTSIDE
from lace.datapath.conntrack import CT_ENDPOINT_DEFAULT, CT_ENTRY, CtFlag, ct4_key, ct6_key
from lace.datapath.endpoint import decode_endpoint, veth_key
from lace.store import ValidationError
from lace.store import kinds as K
from lace.store.validation import validate

from test_agent_desired import snapshot
from test_status import NOW, FakeDatapath, facts
from test_validation import DictLookup

POD_A, POD_B = "10.244.0.5", "10.244.0.6"
NOW_NS = 10_000_000_000


def entry(expires_ns: int = NOW_NS + 1, flags: int = 0) -> bytes:
    return CT_ENTRY.pack(expires_ns=expires_ns, flags=flags)


def table(rows: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes, int]:
    return b"".join(k for k, _ in rows), b"".join(v for _, v in rows), len(rows)


SOURCES = {_source_id(1, ia.ip_address(POD_A)): 11, _source_id(1, ia.ip_address(POD_B)): 12}


# ---- the walk ----------------------------------------------------------------------------------------

def test_walk_counts_live_flows_per_endpoint_once_per_flow():
    rows = [
        (ct4_key(1, POD_A, "10.244.1.9", 40000, 80, 6), entry()),                               # plain
        (ct4_key(1, POD_A, "10.96.0.1", 40001, 80, 6), entry(flags=CtFlag.SERVICE)),            # a service flow...
        (ct4_key(1, POD_A, "10.244.1.9", 40001, 8080, 6), entry(flags=CtFlag.DNAT)),            # ...its 2nd entry
        (ct4_key(1, POD_A, "203.0.113.1", 40002, 443, 6), entry(flags=CtFlag.SNAT)),            # masqueraded...
        (ct4_key(NETWORK_OUTSIDE, "198.18.0.1", "203.0.113.1", 50000, 443, 6), entry(flags=CtFlag.MASQ)),  # ...port
        (ct4_key(2, POD_A, "10.10.0.1", 40003, 80, 6), entry(flags=CtFlag.ALIAS)),             # a reply alias
        (ct4_key(1, POD_A, "10.244.1.9", 40004, 80, 6), entry(expires_ns=NOW_NS - 1)),         # expired
        (ct4_key(1, POD_B, "10.244.1.9", 40005, 80, 6), entry()),                               # b's
        (ct4_key(1, "10.244.1.9", POD_A, 40006, 80, 6), entry()),                               # to a, not a's
        (ct4_key(3, POD_A, "10.244.1.9", 40007, 80, 6), entry()),                               # same IP, other network
    ]
    expired, held, masq = walk_table("ct-tcp-v4", *table(rows), NOW_NS, SOURCES)
    assert list(expired) == [6]
    assert held == {11: 3, 12: 1}, "plain, service and masqueraded flows: one each"
    assert masq == [(6, "203.0.113.1", 443, 1)]


def test_walk_groups_masquerade_reservations_by_destination():
    node6, remote6 = "fd5e:ff::1", "2001:db8:cafe::1"
    rows = [(ct6_key(NETWORK_OUTSIDE, node6, remote6, port, 443, 6), entry(flags=CtFlag.MASQ)) for port in (50000, 50001)]
    rows.append((ct6_key(NETWORK_OUTSIDE, node6, remote6, 50002, 80, 6), entry(flags=CtFlag.MASQ)))
    rows.append((ct6_key(NETWORK_OUTSIDE, node6, remote6, 50003, 80, 6), entry(NOW_NS - 1, flags=CtFlag.MASQ)))
    _, held, masq = walk_table("ct-tcp-v6", *table(rows), NOW_NS, SOURCES)
    assert held == {} and sorted(masq) == [(6, remote6, 80, 1), (6, remote6, 443, 2)]


def test_walk_ipv6_and_empty():
    a6 = "fd00:10:244::5"
    sources = {_source_id(1, ia.ip_address(a6)): 11}
    rows = [(ct6_key(1, a6, "fd00:10:244::1:9", 1, 2, 17), entry()) for _ in range(1)]
    rows.append((ct6_key(1, a6, "fd00:10:244::1:9", 3, 4, 17), entry()))
    _, held, _ = walk_table("ct-udp-v6", *table(rows), NOW_NS, sources)
    assert held == {11: 2}
    expired, held, masq = walk_table("ct-udp-v6", b"", b"", 0, NOW_NS, sources)
    assert len(expired) == 0 and held == {} and masq == []


# ---- the status subsystem ----------------------------------------------------------------------------

def gc(**over):
    doc = {"finished": NOW - 3, "duration": 0.01, "deleted": 4,
           "tables": [{"table": "ct-tcp-v4", "entries": 120, "capacity": 262144},
                      {"table": "ct-udp-v4", "entries": 400, "capacity": 131072}],
           "endpoints": [{"pod": "a/flood", "ifname": "lx01", "ifindex": 11, "limit": 200,
                          "flows": {"ct-udp-v4": 200, "ct-tcp-v4": 3}},
                         {"pod": "a/web", "ifname": "lx02", "ifindex": 12, "limit": 200, "flows": {"ct-tcp-v4": 9}}],
           "masquerade": [{"proto": "tcp", "remote": "203.0.113.1", "port": 443, "used": 10, "capacity": 16384}]}
    doc.update(over)
    return doc


def sub(doc, name):
    return next(s for s in doc["subsystems"] if s["name"] == name)


def test_a_pod_at_its_limit_warns_and_the_node_stays_healthy():
    doc = st.assemble(facts(conntrack=gc()), NOW)
    ct = sub(doc, "conntrack")
    assert doc["healthy"] and ct["ok"]
    assert ct["warning"] == ("a/flood is at its conntrack limit in ct-udp-v4 (200/200 flows): its new flows there "
                             "drop as ct-endpoint-limit")
    assert ct["atLimit"] == [{"pod": "a/flood", "table": "ct-udp-v4", "flows": 200, "limit": 200}]
    assert doc["warnings"] == ["conntrack: " + ct["warning"]]
    text = ns.render(doc)
    assert "worker-1: healthy, 1 warning" in text
    assert "conntrack    WARNING  a/flood is at its conntrack limit in ct-udp-v4" in text


def test_verbose_lists_tables_the_pods_nearest_their_limit_and_masquerade():
    text = ns.render(st.assemble(facts(conntrack=gc()), NOW), verbose=True)
    assert "  conntrack: gc 3s ago (10 ms), 4 expired entries deleted" in text
    assert "    ct-udp-v4  400/131072 live entries (0.3%)" in text
    assert "    nearest their limit: a/flood ct-udp-v4 200/200, a/web ct-tcp-v4 9/200, a/flood ct-tcp-v4 3/200" in text
    assert "    masquerade to 203.0.113.1:443/tcp: 10/16384 ports" in text


def test_the_warning_clears_once_the_count_is_below_the_limit():
    over = gc(endpoints=[{"pod": "a/flood", "ifname": "lx01", "ifindex": 11, "limit": 200,
                          "flows": {"ct-udp-v4": 199}}])
    doc = st.assemble(facts(conntrack=over), NOW)
    ct = sub(doc, "conntrack")
    assert ct["warning"] is None and doc["warnings"] == []
    assert ct["summary"] == ("gc 3.0s ago: fullest ct-udp-v4 0.3%, 4 expired deleted, 0 at a pod's limit, "
                             "masquerade fullest 10/16384 ports")
    assert "conntrack    OK       gc 3.0s ago" in ns.render(doc)


def test_no_limit_never_warns():
    over = gc(endpoints=[{"pod": "a/flood", "ifname": "lx01", "ifindex": 11, "limit": 0,
                          "flows": {"ct-udp-v4": 100000}}])
    assert sub(st.assemble(facts(conntrack=over), NOW), "conntrack")["warning"] is None


def test_a_table_and_a_masquerade_destination_nearly_full_warn():
    over = gc(tables=[{"table": "ct-icmp-v4", "entries": 32000, "capacity": 32768}], endpoints=[],
              masquerade=[{"proto": "udp", "remote": "203.0.113.1", "port": 53, "used": 15000, "capacity": 16384}])
    ct = sub(st.assemble(facts(conntrack=over), NOW), "conntrack")
    assert ct["ok"]
    assert "ct-icmp-v4 32000/32768 live entries (97.7%): a full table evicts the least recently used flows" \
        in ct["warning"]
    assert "masquerade ports to 203.0.113.1:53/udp 15000/16384 in use (91.6%): new flows there drop as " \
           "nat-failed" in ct["warning"]


def test_before_the_first_pass():
    ct = sub(st.assemble(facts(), NOW), "conntrack")
    assert ct["ok"] and ct["warning"] is None and ct["summary"] == "not walked yet"


def test_lace_status_summary_names_the_warning():
    doc = st.assemble(facts(conntrack=gc()), NOW)
    r = cs.NodeStatus(node="worker-1", doc=doc)
    assert cs.summary([r]) == "1/1 nodes healthy; worker-1: conntrack warning"
    assert cs.exit_status([r]) == cs.ExitStatus.OK


# ---- metrics -----------------------------------------------------------------------------------------

def test_metrics_name_the_pod_at_its_limit_while_it_lasts():
    doc = st.assemble(facts(conntrack=gc()), NOW)
    fams = nm.parse(AgentMetrics(FakeDatapath(), {}, lambda: doc).exposition().decode())
    named = fams["lace_conntrack_endpoint_at_limit"]["samples"]
    assert named == [{"name": "lace_conntrack_endpoint_at_limit", "value": 200.0,
                      "labels": {"pod": "a/flood", "table": "ct-udp-v4", "limit": "200"}}]
    per_table = {s["labels"]["table"]: s["value"] for s in fams["lace_conntrack_endpoints_at_limit"]["samples"]}
    assert per_table == {"ct-tcp-v4": 0, "ct-udp-v4": 1}
    warn = {s["labels"]["subsystem"]: s["value"] for s in fams["lace_agent_subsystem_warning"]["samples"]}
    assert warn["conntrack"] == 1 and warn["maps"] == 0
    live = {s["labels"]["table"]: s["value"] for s in fams["lace_conntrack_live_entries"]["samples"]}
    assert live == {"ct-tcp-v4": 120, "ct-udp-v4": 400}
    masq = fams["lace_masquerade_ports_used"]["samples"]
    assert masq[0]["labels"] == {"proto": "tcp", "remote": "203.0.113.1", "port": "443"} and masq[0]["value"] == 10
    assert fams["lace_conntrack_gc_last_run_age_seconds"]["samples"][0]["value"] == 3

    cleared = st.assemble(facts(conntrack=gc(endpoints=[])), NOW)
    fams = nm.parse(AgentMetrics(FakeDatapath(), {}, lambda: cleared).exposition().decode())
    assert not fams.get("lace_conntrack_endpoint_at_limit", {}).get("samples")


# ---- configuration -----------------------------------------------------------------------------------

def network(limit):
    spec = {"cidrs": ["10.10.0.0/16"]}
    if limit is not None:
        spec["conntrackLimit"] = limit
    return {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "blue"}, "spec": spec}


@pytest.mark.parametrize("limit", [0, 1, 200, 65535])
def test_a_network_conntrack_limit_is_accepted(limit):
    assert validate(network(limit), DictLookup())["spec"]["conntrackLimit"] == limit


@pytest.mark.parametrize("limit, words", [(-1, "out of range"), (65536, "out of range"), (True, "must be integer"),
                                          ("200", "integer")])
def test_a_bad_network_conntrack_limit_is_named(limit, words):
    with pytest.raises(ValidationError) as info:
        validate(network(limit), DictLookup())
    assert info.value.field == "spec.conntrackLimit" and words in str(info.value)


def test_the_veth_entry_carries_the_networks_limit_else_the_agents():
    s = snapshot()
    ep = s.endpoints[0]
    assert decode_endpoint(desired_maps(s)["veth"][veth_key(ep.ifindex)])["ct_max"] == CT_ENDPOINT_DEFAULT
    s.networks["default"] = Network("default", 1, s.networks["default"].cidrs, (), ct_limit=200)
    assert decode_endpoint(desired_maps(s)["veth"][veth_key(ep.ifindex)])["ct_max"] == 200
    s.networks["default"] = Network("default", 1, s.networks["default"].cidrs, (), ct_limit=0)
    assert decode_endpoint(desired_maps(s)["veth"][veth_key(ep.ifindex)])["ct_max"] == 0
    s.networks["default"] = Network("default", 1, s.networks["default"].cidrs, ())
    s.config = dataclasses.replace(s.config, ct_endpoint_limit=50)
    assert decode_endpoint(desired_maps(s)["veth"][veth_key(ep.ifindex)])["ct_max"] == 50


def test_parse_network_reads_the_limit():
    obj = network(300) | {"status": {"id": 5}}
    assert parse_network(obj, {}).ct_limit == 300
    assert parse_network(network(None) | {"status": {"id": 5}}, {}).ct_limit is None


@pytest.mark.parametrize("text, value", [("0", 0), ("8192", 8192), ("65535", 65535)])
def test_agent_limit_option(text, value):
    assert _ct_limit(text) == value


@pytest.mark.parametrize("text", ["-1", "65536", "many"])
def test_agent_limit_option_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="0 for no limit"):
        _ct_limit(text)

