"""Judging one scenario (pure): its check's outcome, its answer, and the flows the nodes recorded
while it ran.

A flow belongs to a scenario when it was recorded inside the scenario's time window, carries the
scenario's protocol, and both its ends (the destination, or the address it was translated to)
are among the scenario's addresses. Every drop among those flows whose reason the scenario does
not expect fails it, whatever the check said: traffic that got through after a retransmission
still lost packets on the way.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .scenarios import Scenario

PASS = "pass"
FAIL = "fail"
SKIP = "skip"

#: seconds of slack around a check's window (flow times come from the kernel's clock through the
#: agent's offset; the first packet leaves after the process started)
SLACK = 0.25


@dataclass
class Outcome:
    """What running a scenario's check gave: exit status, its output, how long it took."""

    rc: int
    output: str = ""
    started: float = 0.0       # wall clock
    finished: float = 0.0
    answer_ok: bool | None = None   # the answer was what the scenario wants (None: not checked)
    answer_problem: str = ""


@dataclass
class Result:
    """A judged scenario."""

    scenario: Scenario
    status: str
    message: str = ""
    duration: float = 0.0
    flows: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""


def _norm(addr: Any) -> str | None:
    if not addr:
        return None
    try:
        a = ipaddress.ip_address(str(addr).split("%")[0])
    except ValueError:
        return None
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped:
        a = a.ipv4_mapped
    return str(a)


Dest = tuple[str, "int | None"]   # (address, port); port None: any port


def flow_matches(flow: dict[str, Any], sources: Iterable[str], dests: Iterable[Dest], proto: str,
                 start: float, end: float, *, family: int = 0, slack: float = SLACK) -> bool:
    """Whether ``flow`` belongs to a scenario: recorded in ``[start, end]`` (with ``slack``),
    ``proto`` (``any`` for all), ``family`` (4 or 6; 0 for either), from one of ``sources`` to one
    of ``dests`` — an (address, port) the packet was sent to or translated to — or the reply the
    other way. Ports keep apart checks that run at once between the same pods."""
    t = flow.get("time")
    if not isinstance(t, (int, float)) or t < start - slack or t > end + slack:
        return False
    fp = str(flow.get("proto"))
    if proto != "any" and fp != proto and not (proto == "icmp" and fp == "icmpv6"):
        return False
    if family and str(flow.get("family") or "") not in ("", f"ipv{family}"):
        return False
    srcs = {a for a in (_norm(x) for x in sources) if a}
    want: dict[str, set[int | None]] = {}
    for addr, port in dests:
        a = _norm(addr)
        if a:
            want.setdefault(a, set()).add(port)

    def hit(addr: Any, port: Any) -> bool:
        ports = want.get(_norm(addr) or "")
        return ports is not None and (None in ports or port in ports)
    saddr, daddr = _norm(flow.get("saddr")), _norm(flow.get("daddr"))
    forward = saddr in srcs and (hit(daddr, flow.get("dport")) or hit(flow.get("nat_addr"), flow.get("nat_port")))
    reply = daddr in srcs and hit(saddr, flow.get("sport"))
    return forward or reply


def select_flows(flows: Iterable[dict[str, Any]], sources: Iterable[str], dests: Iterable[Dest], proto: str,
                 start: float, end: float, *, family: int = 0) -> list[dict[str, Any]]:
    sources, dests = list(sources), list(dests)
    got = [f for f in flows if flow_matches(f, sources, dests, proto, start, end, family=family)]
    return sorted(got, key=lambda f: (f.get("time") or 0, str(f.get("node"))))


def unexpected_drops(s: Scenario, flows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The drops among ``flows`` whose reason ``s`` does not expect."""
    return [f for f in flows if f.get("verdict") == "drop" and str(f.get("reason")) not in s.expected_drops]


def evidence_missing(s: Scenario, flows: Iterable[dict[str, Any]]) -> str:
    """What ``s`` must see in its flows and did not ('' when nothing is missing)."""
    flows = list(flows)
    if s.required_drops and not any(f.get("verdict") == "drop" and str(f.get("reason")) in s.required_drops
                                    for f in flows):
        return f"no drop with reason {' or '.join(sorted(s.required_drops))} was seen"
    if s.required_verdict and not any(f.get("verdict") == s.required_verdict for f in flows):
        return f"no {s.required_verdict.upper()} flow was seen"
    return ""


def _reasons(flows: list[dict[str, Any]]) -> str:
    c = Counter(str(f.get("reason")) for f in flows)
    return ", ".join(f"{r} ({n})" if n > 1 else r for r, n in sorted(c.items()))


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def judge(s: Scenario, outcome: Outcome, flows: list[dict[str, Any]]) -> Result:
    """Pass or fail, with the reason; ``flows`` are the scenario's own (:func:`select_flows`)."""
    duration = max(0.0, outcome.finished - outcome.started)
    problems: list[str] = []
    connected = outcome.rc == 0
    if s.expect_connect and not connected:
        problems.append(f"no answer: {_first_line(outcome.output) or f'exit status {outcome.rc}'}")
    elif s.expect_connect and outcome.answer_ok is False:
        problems.append(f"wrong answer: {outcome.answer_problem}")
    elif not s.expect_connect and connected:
        problems.append(f"got through but must not: {_first_line(outcome.output) or 'answered'}")
    bad = unexpected_drops(s, flows)
    if bad:
        problems.append(f"unexpected drop{'s' if len(bad) > 1 else ''}: {_reasons(bad)}")
    if not problems or not s.expect_connect:
        missing = evidence_missing(s, flows)
        if missing and (connected or not s.expect_connect):
            problems.append(missing)
    if problems:
        return Result(s, FAIL, "; ".join(problems), duration, flows, outcome.output)
    return Result(s, PASS, "", duration, flows, outcome.output)


def check_answer(kind: str | None, output: str, want: Iterable[str]) -> tuple[bool | None, str]:
    """Whether the check's output is the answer ``kind`` calls for; ``want``: the acceptable
    values (pod names, addresses). Returns (ok, problem); ok is None when nothing is checked."""
    want = sorted(set(want))
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    if kind is None or kind == "echo":
        return None, ""
    if kind == "vips":
        got = {_norm(x) for ln in lines for x in ln.split()}
        missing = [w for w in want if _norm(w) not in got]
        return (not missing), (f"{', '.join(missing)} not among {' '.join(lines) or 'nothing'}" if missing else "")
    if not lines:
        return False, f"empty answer, expected {' or '.join(want)}"
    got_norm = _norm(lines[-1]) or lines[-1]
    ok = any(got_norm == (_norm(w) or w) for w in want)
    return ok, ("" if ok else f"{lines[-1]!r}, expected {' or '.join(want)}")
