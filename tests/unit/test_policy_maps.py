"""The policy maps' split (lace.datapath.policy.policy_maps) and its lookups (lace.policy.emulate):
the agent's desired maps put every entry where the datapath looks for it and give each marker the
kinds of entries its segment has; and the hash-first lookup decides every packet as one LPM trie of
every entry did (the layout before the split), verdict and rule alike."""

from __future__ import annotations

import ipaddress as ia
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lace.agent.desired import OWNED_MAPS, desired_maps
from lace.agent.diff import diff
from lace.datapath.common import SEGMENT_ANY, SEGMENT_HOST, SEGMENT_SELECTED, Direction
from lace.datapath.policy import (ANY_PEER_SHIFT, EXACT_MAP, POLICY_ENTRY, POLICY_MAPS, POLICY_PREFIX_FULL, POLICY_PREFIX_PROTO,
                                  TRIE_MAP, PolicyFlag, decode_policy_entry, decode_policy_key, entry_kind, is_marker,
                                  lookup_key, map_of, policy_entry, policy_keys, policy_maps, selected_key)
from lace.policy import ContainerPort, NamespaceInfo, PodInfo, PolicyInputs, parse_policy
from lace.policy.emulate import LpmTable, PolicyMaps
from lace.policy.ids import base_policy_id
from lace.policy.program import PolicyProgrammer

from test_agent_desired import snapshot

ING, EG = Direction.INGRESS, Direction.EGRESS
SEL, AUD = PolicyFlag.SELECTED, PolicyFlag.AUDIT
PORTS, PROTOS, ANY_PROTO, BLOCKS = PolicyFlag.PORTS, PolicyFlag.PROTOS, PolicyFlag.ANY_PROTO, PolicyFlag.BLOCKS
ANY_PEER = {kind: PolicyFlag(kind << ANY_PEER_SHIFT) for kind in (PORTS, PROTOS, ANY_PROTO, BLOCKS)}


def flags(raw: bytes) -> PolicyFlag:
    return PolicyFlag(struct.unpack_from("<H", raw, 6)[0])


def plen(key: bytes) -> int:
    return struct.unpack_from("<I", key)[0]


# -- the agent's desired maps ------------------------------------------------------------------------

def policy_objects() -> list[dict]:
    """policy_snapshot's NetworkPolicies: x/a's ingress and egress, x/b's ingress."""
    from_b = [{"podSelector": {"matchLabels": {"app": "b"}}}]
    ingress = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "a-in", "namespace": "x", "resourceVersion": "1"},
               "spec": {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [
                   {"from": from_b, "ports": [{"port": 80}, {"port": 30000, "endPort": 30100}, {"protocol": "UDP"}]},
                   {"from": from_b}]}}
    egress = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "a-out", "namespace": "x", "resourceVersion": "1"},
              "spec": {"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Egress"],
                       "egress": [{"ports": [{"port": 53, "protocol": "UDP"}, {"port": "http"}]}]}}
    b_in = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "b-in", "namespace": "x", "resourceVersion": "1"},
            "spec": {"podSelector": {"matchLabels": {"app": "b"}}, "ingress": [{"ports": [{"port": 9000, "endPort": 9007}]}]}}
    return [ingress, egress, b_in]


def policy_snapshot():
    """worker-1 runs x/a (segment 300): ingress from x/b (301) on an exact port, a port range, a
    whole protocol and any protocol (and the node's host, as for every segment selected for
    ingress); egress on exact ports only. x/b on worker-2 is selected for ingress too."""
    s = snapshot()
    pa = PodInfo("x", "a", (("app", "a"),), "default", 1, 300, (ia.ip_address("10.244.0.5"),), "worker-1",
                 (ContainerPort(8080, 6, "http"),))
    pb = PodInfo("x", "b", (("app", "b"),), "default", 1, 301, (ia.ip_address("10.244.1.9"),), "worker-2")
    s.policy = PolicyInputs(namespaces={"x": NamespaceInfo("x", (("ns", "x"),))}, pods=[pa, pb],
                            policies=[parse_policy(p) for p in policy_objects()])
    return s


def test_desired_policy_maps_hold_each_entry_where_the_datapath_looks_and_flag_the_markers():
    programmer = PolicyProgrammer("worker-1")
    want = desired_maps(policy_snapshot(), programmer)
    assert OWNED_MAPS.index("policy") < OWNED_MAPS.index("policy-exact"), \
        "port blocks are written before the markers that send checks to them"
    trie, exact = want["policy"], want["policy-exact"]
    assert trie and exact and not set(trie) & set(exact)
    # the trie: port blocks only; the hash: markers, exact ports, whole and any protocol
    assert {plen(k) for k in trie} <= set(range(POLICY_PREFIX_PROTO + 1, POLICY_PREFIX_FULL))
    assert {plen(k) for k in exact} == {72, 80, 96}
    assert all(map_of(k) == TRIE_MAP for k in trie) and all(map_of(k) == EXACT_MAP for k in exact)
    # together they are the resolver's entries for this node, markers aside
    logical, _ = programmer.entries(policy_snapshot().policy)
    assert set(logical) == set(trie) | set(exact)
    assert all(v == logical[k] for part in (trie, exact) for k, v in part.items() if not is_marker(k))
    # only worker-1's subject: x/b's ingress (on worker-2) is not here
    assert {decode_policy_key(k)["segment"] for k in (*trie, *exact)} == {300}
    # each marker: the resolver's bits plus the kinds of entries its segment has in its direction
    ingress, egress = exact[selected_key(300, ING)], exact[selected_key(300, EG)]
    # ingress: every rule names its peer (x/b, the node's host): no any-peer bit
    assert flags(ingress) == SEL | PORTS | PROTOS | ANY_PROTO | BLOCKS
    # egress: 53/udp to any peer; the named port 8080/tcp resolved on the one pod that has it
    assert flags(egress) == SEL | PORTS | PolicyFlag.ANY_PEER_PORTS
    assert decode_policy_entry(ingress)["policy_id"] == base_policy_id("x", "a-in")
    assert decode_policy_entry(egress)["flags"] == ["selected", "ports", "any-peer-ports"]
    # the range 30000-30100: its blocks in the trie, its last port (a block of one) in the hash
    rng = policy_keys(300, 301, ING, 6, 30000, 30100)
    assert [map_of(k) for k in rng] == [TRIE_MAP] * (len(rng) - 1) + [EXACT_MAP]
    # the node's host: any protocol, in the hash
    (host,) = policy_keys(300, SEGMENT_HOST, ING, None)
    assert host in exact and entry_kind(host) == ANY_PROTO


def test_marker_flags_follow_the_entries_and_the_agent_rewrites_the_marker_alone():
    s = policy_snapshot()
    programmer = PolicyProgrammer("worker-1")
    before = desired_maps(s, programmer)
    changed = policy_objects()[0]
    changed["spec"]["ingress"][0]["ports"] = [{"port": 80}]   # no range, no whole protocol
    changed["metadata"]["resourceVersion"] = "2"
    s.policy.policies[0] = parse_policy(changed)
    after = desired_maps(s, programmer)
    assert after["policy"] == {}
    assert flags(after["policy-exact"][selected_key(300, ING)]) == SEL | PORTS | ANY_PROTO
    ch = diff("policy-exact", after["policy-exact"], before["policy-exact"])
    assert selected_key(300, ING) in ch.updates and selected_key(300, EG) not in ch.updates
    assert len(diff("policy", after["policy"], before["policy"]).deletes) == len(before["policy"])


def test_diff_keeps_hit_counters_in_both_policy_maps():
    key = policy_keys(300, 301, ING, 6, 80)[0]
    counted = bytearray(policy_entry(5, 1))
    counted[8:16] = (77).to_bytes(8, "little")
    for name in POLICY_MAPS:
        assert not diff(name, {key: policy_entry(5, 1)}, {key: bytes(counted)})


def test_split_refuses_keys_the_datapath_could_never_find():
    marker = selected_key(300, ING)
    ok = {marker: policy_entry(1, 0xFFFF, SEL)}
    with pytest.raises(ValueError, match="prefix length 64"):
        policy_maps({**ok, struct.pack("<I", 64) + marker[4:]: policy_entry(1, 1)})
    (any_proto,) = policy_keys(300, 301, ING, None)
    with pytest.raises(ValueError, match="bits past its prefix length"):
        policy_maps({**ok, any_proto[:13] + b"\x06" + any_proto[14:]: policy_entry(1, 1)})
    with pytest.raises(ValueError, match="reserved for selection markers"):
        policy_keys(300, SEGMENT_SELECTED, ING, 6, 80)
    with pytest.raises(ValueError, match="reserved for selection markers"):
        policy_maps({**ok, struct.pack("<I", 96) + marker[4:13] + b"\x06\x00\x50": policy_entry(1, 1)})


def test_marker_bits_per_kind_and_per_peer_class():
    """Each kind of entry sets its own bit, one set for named peers and one for any peer, so that a
    check probes nothing its segment does not have."""
    marker = selected_key(300, EG)
    for peer, proto, port, end, want in [
        (301, 6, 80, None, PORTS), (301, 6, None, None, PROTOS), (301, None, None, None, ANY_PROTO),
        (301, 6, 8000, 8007, BLOCKS), (SEGMENT_ANY, 6, 80, None, ANY_PEER[PORTS]),
        (SEGMENT_ANY, 17, None, None, ANY_PEER[PROTOS]), (SEGMENT_ANY, None, None, None, ANY_PEER[ANY_PROTO]),
        (SEGMENT_ANY, 6, 8000, 8007, ANY_PEER[BLOCKS]),
    ]:
        keys = policy_keys(300, peer, EG, proto, port, end)
        assert {entry_kind(k) for k in keys} == {want}
        split = policy_maps({marker: policy_entry(1, 0xFFFF, SEL), **{k: policy_entry(1, 1) for k in keys}})
        assert flags(split[EXACT_MAP][marker]) == SEL | want, (peer, proto, port, end)
        # only the other direction's or another segment's entries: no bit
        other = policy_keys(300, peer, ING, proto, port, end) + policy_keys(302, peer, EG, proto, port, end)
        split = policy_maps({marker: policy_entry(1, 0xFFFF, SEL), **{k: policy_entry(1, 1) for k in other}})
        assert flags(split[EXACT_MAP][marker]) == SEL


def test_split_is_stable_and_keeps_marker_bits_the_resolver_set():
    entries = {selected_key(300, ING): policy_entry(1, 0xFFFF, SEL | AUD | BLOCKS)}
    entries.update({k: policy_entry(1, 1) for k in policy_keys(300, 301, ING, 17, 53)})
    split = policy_maps(entries)
    assert flags(split[EXACT_MAP][selected_key(300, ING)]) == SEL | AUD | PORTS   # BLOCKS: no block
    assert policy_maps({**split[TRIE_MAP], **split[EXACT_MAP]}) == split


# -- the lookup: hash first, as one trie of every entry decided -------------------------------------

def one_trie_check(entries: dict[bytes, bytes], subject: int, peer: int, direction: int, proto: int,
                   dport: int) -> tuple[str, bytes | None]:
    """The datapath's decision when every entry sat in one LPM trie (the layout before the split):
    the marker by longest prefix, then the longest entry for the peer, else for any peer."""
    trie = LpmTable(entries)
    hit = trie.lookup(lookup_key(subject, SEGMENT_SELECTED, direction, 0, 0))
    if hit is None:
        return "allow", None
    marker = hit[1]
    if proto in (1, 58):
        dport = 0
    e = trie.lookup(lookup_key(subject, peer, direction, proto, dport))
    if e is None:
        e = trie.lookup(lookup_key(subject, SEGMENT_ANY, direction, proto, dport))
    if e is not None and not flags(e[1]) & SEL:
        return "allow", e[0]
    return ("audit" if flags(marker) & AUD else "deny"), None


SUBJECTS = (300, 301)
PEERS = (301, 302, 303, SEGMENT_HOST, SEGMENT_ANY)


@st.composite
def rule_sets(draw):
    entries: dict[bytes, bytes] = {}
    for subject, direction in draw(st.lists(st.tuples(st.sampled_from(SUBJECTS), st.sampled_from([ING, EG])),
                                            max_size=4, unique=True)):
        entries[selected_key(subject, direction)] = policy_entry(9, 0xFFFF, SEL | (AUD if draw(st.booleans()) else 0))
    for n in range(draw(st.integers(0, 12))):
        proto = draw(st.sampled_from([None, 6, 17, 132, 1]))
        port = end = None
        if proto in (6, 17, 132) and draw(st.booleans()):
            port = draw(st.integers(1, 24))       # a few ports, so that packets meet them often
            if draw(st.booleans()):
                end = port + draw(st.integers(0, 40))
        for k in policy_keys(draw(st.sampled_from(SUBJECTS)), draw(st.sampled_from(PEERS)),
                             draw(st.sampled_from([ING, EG])), proto, port, end):
            entries[k] = policy_entry(10 + n, n)
    return entries


@st.composite
def cases(draw):
    """A rule set and a packet (subject, peer, direction, proto, dport): half of the packets aimed
    at one of the set's allow entries (its subject, direction and protocol, a port in its block,
    its peer or another), so that every kind of entry decides some of them."""
    entries = draw(rule_sets())
    allows = [k for k in entries if not is_marker(k)]
    if allows and draw(st.booleans()):
        k = decode_policy_key(draw(st.sampled_from(allows)))
        proto = {"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1}.get(k["proto"], draw(st.sampled_from([6, 17, 1])))
        port = draw(st.integers(k["port"], k["end_port"])) if k["port"] is not None else draw(st.integers(0, 70))
        peer = k["peer"] if draw(st.booleans()) else draw(st.sampled_from((*PEERS, 304)))
        return entries, (k["segment"], peer, Direction[k["direction"].upper()], proto, port)
    return entries, (draw(st.sampled_from(SUBJECTS)), draw(st.sampled_from((*PEERS, 304))),
                     draw(st.sampled_from([ING, EG])), draw(st.sampled_from([6, 17, 132, 1])), draw(st.integers(0, 70)))


@settings(max_examples=400, deadline=None)
@given(cases())
def test_split_lookup_decides_as_one_trie_of_every_entry(case):
    entries, (subject, peer, direction, proto, dport) = case
    maps = PolicyMaps.from_entries("n", entries, {}, {})
    got = maps.check(subject, peer, direction, proto, dport)
    verdict, key = one_trie_check(entries, subject, peer, direction, proto, dport)
    assert got["verdict"] == verdict
    if key is not None:   # the same entry allows it: the same rule credited, the same hits counted
        e = got["entry"]
        assert (e["prefixlen"], e["peer"]) == (plen(key), decode_policy_key(key)["peer"])
        assert got["rule"] == POLICY_ENTRY.unpack(entries[key])["rule"]


def test_lookups_skip_kinds_the_marker_does_not_name():
    """A marker's bits are the lookups a check makes: an entry of a kind its marker does not name
    is never found (so the agent must, and does, set them from the entries)."""
    (k80,) = policy_keys(300, 301, ING, 17, None)
    entries = {selected_key(300, ING): policy_entry(1, 0xFFFF, SEL), k80: policy_entry(1, 3)}
    maps = PolicyMaps.from_entries("n", entries, {}, {})
    assert maps.check(300, 301, ING, 17, 53)["verdict"] == "allow"
    stale = PolicyMaps("n", {}, {}, {}, policy_exact=dict(entries))   # marker without PROTOS
    assert stale.check(300, 301, ING, 17, 53)["verdict"] == "deny"
    # an any-peer entry under the named-peer bit only is not probed for any peer
    (any80,) = policy_keys(300, SEGMENT_ANY, ING, 17, None)
    named_only = {selected_key(300, ING): policy_entry(1, 0xFFFF, SEL | PROTOS), any80: policy_entry(1, 4)}
    assert PolicyMaps("n", {}, {}, {}, policy_exact=named_only).check(300, 301, ING, 17, 53)["verdict"] == "deny"
    assert PolicyMaps.from_entries("n", named_only, {}, {}).check(300, 301, ING, 17, 53)["rule"] == 4
