"""Policy lookups with every kind of entry under one subject (BPF_PROG_TEST_RUN of the pod program):
exact ports and whole protocols in the hash, port ranges in the trie, any-protocol and any-peer
rules beside them. Each new flow must get the verdict and the rule one LPM trie of every entry
gave (the longest prefix for the peer, then for any peer), the allowing entry's hit counted in
whichever map holds it, and the emulation of ``lace policy trace`` must say the same."""

from __future__ import annotations

import itertools

import pytest
from scapy.layers.inet import TCP, UDP
from scapy.layers.sctp import SCTP

from lace.datapath.common import SEGMENT_ANY, Direction, Verdict
from lace.datapath.policy import POLICY_ENTRY, POLICY_MAPS, PolicyFlag, map_of, policy_keys, selected_key
from lace.datapath.reasons import DropReason
from lace.datapath.testbed import REMOTE, TC_ACT_REDIRECT, TC_ACT_SHOT, icmp_echo
from lace.policy.emulate import PolicyMaps

ING, EGR = Direction.INGRESS, Direction.EGRESS
FAMILIES = [pytest.param(4, id="v4"), pytest.param(6, id="v6")]
OTHER_PEER = 999
MARKER_POLICY = 40
_sport = itertools.count(20000)

#: b's ingress rules (rule number -> peer, proto, first port, last port); a is the peer under test
INGRESS_RULES = {
    1: ("a", 6, 80, None),              # exact port (hash)
    2: ("a", 6, 8000, 8099),            # a port range (its blocks in the trie)
    3: (SEGMENT_ANY, 17, None, None),   # any peer, a whole protocol (hash)
    4: ("a", 132, None, None),          # a whole protocol (hash)
    5: (SEGMENT_ANY, 6, 9000, 9003),    # any peer, one port block (trie)
    6: (OTHER_PEER, None, None, None),  # another peer, any protocol (hash): never a's
    7: (SEGMENT_ANY, 6, 443, None),     # any peer, an exact port
    8: ("a", 6, 8080, None),            # an exact port inside rule 2's range
    9: ("a", 17, 53, None),             # an exact port of the protocol rule 3 allows to anyone
    10: (SEGMENT_ANY, 6, 8050, None),   # any peer, an exact port inside a's own range
}

#: (protocol, destination port) of a's new flow to b -> the rule that allows it (None: denied)
INGRESS_CASES = [
    (6, 80, 1), (6, 81, None), (6, 7999, None), (6, 8000, 2), (6, 8063, 2), (6, 8099, 2), (6, 8100, None),
    (6, 8080, 8),      # the exact port beats the block that holds it (a longer prefix)
    (6, 8050, 2),      # a's own block beats any peer's exact port: the peer's entries come first
    (17, 53, 9), (17, 54, 3), (17, 1, 3),     # a's exact port, then any peer's whole protocol
    (132, 5, 4), (6, 9000, 5), (6, 9003, 5), (6, 9004, None), (6, 443, 7),
    ("icmp", 0, None),  # no rule allows ICMP from a (rule 6's any protocol is another peer's)
]


def program(dp, rules: dict[int, tuple], subject: int, direction: Direction, peers: dict[str, int]) -> None:
    dp.select(subject, direction, policy_id=MARKER_POLICY)
    for rule, (peer, proto, port, end) in rules.items():
        dp.allow(subject, peers.get(peer, peer), direction, proto=proto, port=port, end_port=end,
                 policy_id=100 + rule, rule=rule)


def l4(proto, port: int, family: int):
    sport = next(_sport)
    if proto == "icmp":
        return icmp_echo(family, sport & 0xFFFF)
    return {6: TCP(sport=sport, dport=port, flags="S"), 17: UDP(sport=sport, dport=port),
            132: SCTP(sport=sport, dport=port)}[proto]


def emulated(dp) -> PolicyMaps:
    return PolicyMaps("testbed", dict(dp.m("policy").entries()), {}, {},
                      policy_exact=dict(dp.m("policy-exact").entries()))


def hits(dp, key: bytes) -> int:
    return POLICY_ENTRY.unpack(dp.m(map_of(key)).lookup(key))["hits"]


def run_cases(dp, src, dst_ip: str, family: int, cases, subject: int, peer: int, direction: Direction,
              reason: DropReason) -> dict[int, int]:
    """Send each case as a new flow; check verdict, the rule the trace event names and the emulation.
    Returns how many flows each rule allowed."""
    maps = emulated(dp)
    allowed: dict[int, int] = {}
    for proto, port, rule in cases:
        res = dp.from_pod(src, dp.l3(src, dst_ip, family) / l4(proto, port, family))
        number = 1 if proto == "icmp" and family == 4 else 58 if proto == "icmp" else proto
        emu = maps.check(subject, peer, direction, number, port)
        what = f"{proto}/{port} from segment {peer} (IPv{family})"
        if rule is None:
            assert res.retval == TC_ACT_SHOT, f"{what}: expected a policy drop, got {res.retval}"
            (drop,) = [e for e in res.events if e["verdict"] == Verdict.DROP]
            assert DropReason(drop["reason"]) == reason and drop["policy_id"] == MARKER_POLICY, what
            assert emu["verdict"] == "deny", what
            continue
        assert res.retval == TC_ACT_REDIRECT or (res.retval != TC_ACT_SHOT and direction == EGR), \
            f"{what}: expected rule {rule} to allow it, got {res.retval} {res.events}"
        ev = res.events[-1]
        assert ev["verdict"] == Verdict.FORWARD and (ev["policy_id"], ev["rule"]) == (100 + rule, rule), \
            f"{what}: allowed by policy {ev['policy_id']} rule {ev['rule']}, expected rule {rule}"
        assert (emu["verdict"], emu["rule"]) == ("allow", rule), what
        allowed[rule] = allowed.get(rule, 0) + 1
    return allowed


@pytest.mark.parametrize("family", FAMILIES)
def test_every_kind_of_entry_under_one_ingress_subject(dp, family):
    a, b = dp.pods["a"], dp.pods["b"]
    program(dp, INGRESS_RULES, b.segment, ING, {"a": a.segment})
    # where the entries went, and what b's marker tells a check to probe
    in_trie = {k for k in dp.m("policy").keys()}
    assert in_trie and all(map_of(k) == "policy" for k in in_trie)
    assert set(policy_keys(b.segment, a.segment, ING, 6, 8000, 8099)) <= in_trie
    marker = POLICY_ENTRY.unpack(dp.m("policy-exact").lookup(selected_key(b.segment, ING)))
    named = PolicyFlag.PORTS | PolicyFlag.PROTOS | PolicyFlag.ANY_PROTO | PolicyFlag.BLOCKS
    any_peer = PolicyFlag.ANY_PEER_PORTS | PolicyFlag.ANY_PEER_PROTOS | PolicyFlag.ANY_PEER_BLOCKS
    assert marker["flags"] == PolicyFlag.SELECTED | named | any_peer

    allowed = run_cases(dp, a, b.ip(family), family, INGRESS_CASES, b.segment, a.segment, ING,
                        DropReason.POLICY_INGRESS)
    # hits: counted on the allowing entry, in the hash and in the trie alike
    assert hits(dp, policy_keys(b.segment, a.segment, ING, 6, 80)[0]) == allowed[1] == 1
    block_hits = sum(hits(dp, k) for k in policy_keys(b.segment, a.segment, ING, 6, 8000, 8099))
    assert block_hits == allowed[2] == 4
    assert hits(dp, policy_keys(b.segment, SEGMENT_ANY, ING, 17, None)[0]) == allowed[3] == 2
    assert hits(dp, policy_keys(b.segment, SEGMENT_ANY, ING, 6, 8050)[0]) == 0, "a's own block allowed 8050"


def test_peer_and_any_peer_rules_of_one_egress_subject(dp):
    """a's egress to two peers (b on this node, a remote pod): the remote peer has no rule of its
    own, so only any-peer rules allow it; b's own entries are probed first."""
    a, b = dp.pods["a"], dp.pods["b"]
    rules = {
        1: ("b", 6, 80, None), 2: ("b", None, None, None),          # b: one port, then anything
        3: (SEGMENT_ANY, 6, 5000, 5999), 4: (SEGMENT_ANY, 17, 53, None),
    }
    program(dp, rules, a.segment, EGR, {"b": b.segment})
    to_b = [(6, 80, 1), (6, 81, 2), (17, 53, 2), ("icmp", 0, 2), (6, 5000, 2)]
    to_remote = [(6, 80, None), (6, 5000, 3), (6, 5999, 3), (6, 6000, None), (17, 53, 4), (17, 54, None),
                 ("icmp", 0, None)]
    run_cases(dp, a, b.ipv4, 4, to_b, a.segment, b.segment, EGR, DropReason.POLICY_EGRESS)
    run_cases(dp, a, REMOTE["ipv4"], 4, to_remote, a.segment, REMOTE["segment"], EGR, DropReason.POLICY_EGRESS)


def test_any_peer_entries_are_probed_only_when_the_marker_names_them(dp):
    """A subject whose rules all name their peers is checked without the any-peer probes: an any-peer
    entry left behind the test bed's back (no ANY_PEER bit) allows nothing; written as the agent
    writes it, it allows."""
    from lace.datapath.policy import policy_entry
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING)
    dp.allow(b.segment, 999, ING, proto=6, port=80)
    (stray,) = policy_keys(b.segment, SEGMENT_ANY, ING, 6, 80)
    dp.m("policy-exact").update(stray, policy_entry(7, 5))
    res = dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=next(_sport), dport=80, flags="S"))
    assert res.retval == TC_ACT_SHOT
    dp.allow(b.segment, SEGMENT_ANY, ING, proto=6, port=80, rule=5)
    res = dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=next(_sport), dport=80, flags="S"))
    assert res.retval == TC_ACT_REDIRECT and res.events[-1]["rule"] == 5


def test_a_subject_without_port_ranges_never_reaches_the_trie(dp):
    """A marker without BLOCKS: the trie is not probed for its subject, so a stale block there (what
    no agent writes for it) allows nothing; with the bit the same block allows."""
    a, b = dp.pods["a"], dp.pods["b"]
    dp.select(b.segment, ING)
    dp.allow(b.segment, a.segment, ING, proto=6, port=80)
    (block,) = policy_keys(b.segment, a.segment, ING, 6, 8000, 8007)
    from lace.datapath.policy import policy_entry
    dp.m("policy").update(block, policy_entry(7, 9))   # behind the test bed's back: no BLOCKS bit
    res = dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=next(_sport), dport=8001, flags="S"))
    assert res.retval == TC_ACT_SHOT
    dp.allow(b.segment, a.segment, ING, proto=6, port=8000, end_port=8007, rule=9)   # as the agent: the bit too
    res = dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=next(_sport), dport=8001, flags="S"))
    assert res.retval == TC_ACT_REDIRECT and res.events[-1]["rule"] == 9
    assert {name: len(dp.m(name)) for name in POLICY_MAPS} == {"policy": 1, "policy-exact": 2}
