"""Hostile frames through the from-pod, from-uplink and from-host programs (BPF_PROG_TEST_RUN on the
datapath test bed): a bounded hypothesis budget per program, and the corpus of every input that once
crashed or disagreed, replayed.

What each example checks, and which frames the ``lace policy trace`` emulation covers, is
tests/fuzz/harness.py's docstring: every verdict named, no crash, no conntrack entry for a dropped
packet, and, for well-formed new flows (from-pod: routing, segments, egress and local ingress
policy; from-uplink: ingress policy after decapsulation; from-host: the default network's routes and
a local pod's ingress policy for peer HOST), the program's verdict and destination
segment equal to the emulation's. bench/fuzz.py runs the same harness for minutes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from lace.datapath.testbed import Testbed
from tests.fuzz import harness as fuzz

pytestmark = pytest.mark.privileged

#: examples per program in CI: a few hundred, about 10 s each on a 2-core machine
EXAMPLES = 300


@pytest.fixture(scope="module")
def testbed():
    dp = Testbed()
    try:
        yield dp
    finally:
        dp.close()


@pytest.fixture(scope="module")
def harness(testbed):
    return fuzz.Harness(testbed)


def unexplained(out: fuzz.Outcome) -> list[str]:
    """The problems of an outcome that are not a recorded bug (fuzz.KNOWN_ISSUES)."""
    return [p for p in out.problems if fuzz.known_issue(p) is None]


@pytest.mark.parametrize("program", fuzz.PROGRAMS)
def test_hostile_frames(testbed, harness, program):
    """Random, structured and mutated frames under random policy: nothing unnamed, no crash, no
    state for a drop, no disagreement with the emulation. Derandomized: CI runs the same budget
    every time (bench/fuzz.py explores new seeds)."""
    seen: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(frame=fuzz.frames(testbed, program), world=fuzz.worlds())
    def prop(frame: fuzz.Frame, world: fuzz.World) -> None:
        out = harness.run(frame, world)
        seen[out.verdict] = seen.get(out.verdict, 0) + 1
        assert not unexplained(out), (
            f"{frame.kind} {list(frame.mutated)}: {out.problems}\n"
            f"save it: fuzz.save_case(frame, world, out) -> tests/fuzz/corpus/datapath")

    prop()
    # the budget reached the programs' decisions, not only their parsers
    drops = {v for v in seen if v.startswith("drop:")}
    assert len(drops) >= 5, seen
    assert any(v in seen for v in ("redirect", "forward")), seen


def test_state_check_sees_values_and_removals(harness):
    """What the harness holds a drop (or reject) to: an entry it only advanced (counters, state,
    expiry: masked) is unchanged; one it created, removed or otherwise rewrote is a problem."""
    from lace.datapath.conntrack import CT_ENTRY, ct4_key

    harness.program_world(fuzz.World())
    ct = harness.dp.m("ct-tcp-v4")
    key = ct4_key(fuzz.NET1, "10.1.1.10", "10.1.1.11", 1000, 80, 6)
    entry = {"created_ns": 1, "expires_ns": 10, "dst_network": fuzz.NET1, "packets_fwd": 1, "state": 1}
    ct.update(key, CT_ENTRY.pack(entry))
    before = harness.state()
    ct.update(key, CT_ENTRY.pack({**entry, "expires_ns": 20, "packets_fwd": 2, "state": 2, "flags": 1}))
    assert harness.state_changes(before, harness.state()) == []
    ct.update(key, CT_ENTRY.pack({**entry, "dst_network": fuzz.NET2}))
    assert harness.state_changes(before, harness.state()) == ["modified entries in ct-tcp-v4"]
    ct.delete(key)
    assert harness.state_changes(before, harness.state()) == ["removed entries from ct-tcp-v4"]
    assert harness.state_changes({}, before) == ["left entries in ct-tcp-v4"]
    ct.clear()


def test_problem_kind_ignores_values():
    """bench/fuzz.py keeps one corpus case per kind of problem, the key its statistics count by:
    texts that differ only in values are one kind, different drops or tables are not."""
    a = fuzz.problem_kind("emulation resolves the destination to segment 600, the program to 257")
    b = fuzz.problem_kind("emulation resolves the destination to segment 301, the program to 0")
    assert a == b and a.startswith("new: ")
    assert (fuzz.problem_kind("dropped (drop:ttl-exceeded) but left entries in ct-udp-v6")
            != fuzz.problem_kind("dropped (drop:fib-lookup-failed) but left entries in ct-udp-v6"))


def _cases():
    params = []
    for name, frame, world, doc in fuzz.load_cases():
        marks = [pytest.mark.xfail(strict=True, reason=doc["xfail"])] if doc.get("xfail") else []
        params.append(pytest.param(frame, world, doc, id=name, marks=marks))
    return params


@pytest.mark.parametrize("frame,world,doc", _cases())
def test_corpus_replays_clean(harness, frame, world, doc):
    """Every input the fuzzer ever kept (tests/fuzz/corpus/datapath) now passes every check; a
    case of a recorded bug is a strict expected failure, so fixing the bug fails it until its
    KNOWN_ISSUES entry and xfail go. A case whose bug was fixed (its "fixed" key) also keeps the
    verdict it was found with: the fix changed what the packet leaves behind, not why it drops, so
    a later change that drops it earlier for another reason (and so hides the bug) fails here —
    unless the verdict was the bug (a packet let through that must drop), when the case names the
    verdict its fix gave it ("verdict_after_fix")."""
    out = harness.run(frame, world)
    assert not out.problems, f"{doc['found']} -> now {out.verdict}: {out.problems}"
    if "fixed" in doc:
        want = doc.get("verdict_after_fix", doc["found"]["verdict"])
        assert out.verdict == want, f"{doc['found']} -> now {out.verdict}, not {want} ({doc['fixed']})"


def test_corpus_is_not_empty():
    """The replay above must have something to replay (a lost corpus is a failure, not a pass)."""
    assert fuzz.load_cases(), f"no cases in {fuzz.corpus_dir()}"
