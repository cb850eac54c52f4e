"""The connectivity scenarios, as data: who talks to whom, how, what must come back, which drops
are expected on the way and what the scenario needs from the cluster.

Each scenario names a *source* and a *target* among the test's actors (the pods the runner
deploys, a node's host, the lab's outside) by role, so that this table is pure: the runner
resolves roles to addresses and processes (:mod:`lace.cli.connectivity.runner`).

Actors the runner deploys (namespace ``lace-connectivity-<random>`` unless ``--namespace``), on
node A (the first node) and node B (the second; A again on a one-node cluster):

    client      A   default network, labels app=client role=client
    echo-same   A   default network, app=echo (a backend of Service ``echo``)
    echo-other  B   default network, app=echo (a backend of Service ``echo``)
    guarded     B   default network, app=guarded: NetworkPolicy ``guard`` admits role=client on tcp/80 only
    audited     B   default network, app=audited: NetworkPolicy ``audit`` (lace.dev/audit) denies all ingress
    isolated    A   Network ``<ns>-iso`` (no routes), a readiness probe on tcp/8080 (/healthz)
    masq        A   Network ``<ns>-masq``: route to the outside with masquerade
    open        B   Network ``<ns>-open``: route to the outside without masquerade

Every pod serves HTTP on tcp/80 and tcp/8080 and echoes UDP on 53 and 5353; Service ``echo``
maps 80 -> 8080/tcp and 53 -> 5353/udp, so that traffic through the service and straight to a
pod use different pod ports (a policy can tell them apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# what a scenario may need; the runner reports the ones the cluster lacks as "skipped: needs X"
SERVICES = "services"
DNS = "dns"
OUTSIDE = "outside"
MASQUERADE = "masquerade"
IPV6 = "ipv6"
TWO_NODES = "2 nodes"
PROBES = "probes"
POLICY = "policy"
CAPABILITIES = (SERVICES, DNS, OUTSIDE, MASQUERADE, IPV6, TWO_NODES, PROBES, POLICY)

# how a scenario is exercised
TCP = "tcp"            # HTTP GET (lace.lab.netcheck tcp): the answer is who answered
UDP = "udp"            # one datagram echoed (lace.lab.netcheck udp), from the address it was sent to
PMTU = "pmtu"          # a UDP datagram filling the pod MTU, don't-fragment, echoed (lace.cli.connectivity.pmtu)
RESOLVE = "resolve"    # getaddrinfo of the service's name through the pod's resolv.conf
SEND = "send"          # one datagram to the outside, no answer expected: the outside must see it
PROBE = "probe"        # the kubelet's readiness probe of the pod passed (its Ready condition)

# what the answer must be
ANSWER_TARGET = "target"          # the target pod's name
ANSWER_BACKEND = "backend"        # one of the service's backends
ANSWER_NODE_ADDRESS = "node-address"   # the source's node address (masquerade)
ANSWER_POD_ADDRESS = "pod-address"     # the source pod's own address (seen by the outside)
ANSWER_ECHO = "echo"              # the datagram came back
ANSWER_VIPS = "vips"              # the service's cluster IPs


@dataclass(frozen=True)
class Scenario:
    """One named check. ``expect_connect`` False: the traffic must not get through, and one of
    ``required_drops`` must be seen in the flows; any drop whose reason is not in
    ``expected_drops`` fails the scenario either way. ``required_verdict``: a flow with this
    verdict (``audit``) must be seen."""

    name: str
    description: str
    source: str                      # actor role, or "host:A" (node A's host, in its host cgroup)
    target: str                      # actor role, "service", "outside"
    mode: str
    family: int = 4
    port: int = 80
    expect_connect: bool = True
    answer: str | None = ANSWER_TARGET
    expected_drops: frozenset[str] = frozenset()
    required_drops: frozenset[str] = frozenset()
    required_verdict: str | None = None
    needs: frozenset[str] = frozenset()

    @property
    def group(self) -> str:
        """The first path component: ``pod-to-pod``, ``policy`` … (JUnit's classname)."""
        return self.name.split("/", 1)[0]

    @property
    def proto(self) -> str:
        return {TCP: "tcp", UDP: "udp", PMTU: "udp", SEND: "udp", PROBE: "tcp"}.get(self.mode, "any")


def _fam(family: int) -> str:
    return f"ipv{family}"


def _needs(*extra: str, family: int = 4) -> frozenset[str]:
    return frozenset(extra) | (frozenset({IPV6}) if family == 6 else frozenset())


def _build() -> tuple[Scenario, ...]:
    out: list[Scenario] = []
    for where, target, extra in (("same-node", "echo-same", ()), ("cross-node", "echo-other", (TWO_NODES,))):
        for family in (4, 6):
            for mode, port in ((TCP, 80), (UDP, 53)):
                out.append(Scenario(
                    f"pod-to-pod/{where}/{_fam(family)}/{mode}",
                    f"client -> {target} over {_fam(family).replace('ipv', 'IPv')} {mode.upper()}/{port}",
                    "client", target, mode, family, port, answer=ANSWER_TARGET if mode == TCP else ANSWER_ECHO,
                    needs=_needs(*extra, family=family)))
    for family in (4, 6):
        for mode, port in ((TCP, 80), (UDP, 53)):
            out.append(Scenario(
                f"pod-to-service/{_fam(family)}/{mode}",
                f"client -> Service echo's {_fam(family)} ClusterIP {mode}/{port} (backends echo-same, echo-other)",
                "client", "service", mode, family, port,
                answer=ANSWER_BACKEND if mode == TCP else ANSWER_ECHO, needs=_needs(SERVICES, family=family)))
    for family in (4, 6):
        out.append(Scenario(
            f"node-to-service/{_fam(family)}/tcp",
            f"node A's host (its host cgroup: socket-level translation) -> Service echo's {_fam(family)} ClusterIP tcp/80",
            "host:A", "service", TCP, family, 80, answer=ANSWER_BACKEND, needs=_needs(SERVICES, family=family)))
    for family in (4, 6):
        out.append(Scenario(
            f"pod-to-outside/masquerade/{_fam(family)}/tcp",
            "masq (network routed outside with masquerade) -> the outside over TCP: seen from node A's address",
            "masq", "outside", TCP, family, 0, answer=ANSWER_NODE_ADDRESS,
            needs=_needs(OUTSIDE, MASQUERADE, family=family)))
    out.append(Scenario(
        "pod-to-outside/masquerade/ipv4/udp", "masq -> the outside over UDP: echoed back through the translation",
        "masq", "outside", UDP, 4, 0, answer=ANSWER_ECHO, needs=_needs(OUTSIDE, MASQUERADE)))
    for family in (4, 6):
        out.append(Scenario(
            f"pod-to-outside/no-masquerade/{_fam(family)}/udp",
            "open (network routed outside, no masquerade) -> the outside: seen from the pod's own address",
            "open", "outside", SEND, family, 0, answer=ANSWER_POD_ADDRESS, needs=_needs(OUTSIDE, family=family)))
    out.append(Scenario(
        "dns/service-name", "client resolves echo.<ns>.svc.cluster.local through its resolv.conf (kube-dns)",
        "client", "service", RESOLVE, 4, 53, answer=ANSWER_VIPS, needs=_needs(SERVICES, DNS)))
    out.append(Scenario(
        "dns/connect-by-name", "client -> http://echo.<ns>:80 (the name through kube-dns, then the ClusterIP)",
        "client", "service-name", TCP, 4, 80, answer=ANSWER_BACKEND, needs=_needs(SERVICES, DNS)))
    for where, target, extra in (("same-node", "echo-same", ()), ("cross-node", "echo-other", (TWO_NODES,))):
        for family in (4, 6):
            out.append(Scenario(
                f"host-to-pod/{where}/{_fam(family)}",
                f"node A's host -> {target} tcp/8080 through the host device",
                "host:A", target, TCP, family, 8080, answer=ANSWER_TARGET, needs=_needs(*extra, family=family)))
    out.append(Scenario(
        "host-to-pod/probe-isolated", "the kubelet's readiness probe of isolated (another network) passes through "
        "its probe address", "kubelet:A", "isolated", PROBE, 4, 8080, answer=None, needs=_needs(PROBES)))
    for family in (4, 6):
        out.append(Scenario(
            f"large-payload/cross-node/{_fam(family)}",
            "client -> echo-other: one UDP datagram filling the pod MTU, don't-fragment, echoed whole",
            "client", "echo-other", PMTU, family, 5353, answer=ANSWER_ECHO, needs=_needs(TWO_NODES, family=family)))
    for family in (4, 6):
        out.append(Scenario(
            f"isolation/pod-of-another-network/{_fam(family)}",
            "isolated -> echo-other (default network): no route between the networks",
            "isolated", "echo-other", TCP, family, 80, expect_connect=False, answer=None,
            expected_drops=frozenset({"no-route"}), required_drops=frozenset({"no-route"}),
            needs=_needs(family=family)))
    out.append(Scenario(
        "isolation/service-of-another-network/ipv4",
        "isolated -> Service echo's ClusterIP (default network): the VIP does not exist there",
        "isolated", "service", TCP, 4, 80, expect_connect=False, answer=None,
        expected_drops=frozenset({"no-route"}), required_drops=frozenset({"no-route"}), needs=_needs(SERVICES)))
    out.append(Scenario(
        "policy/allow", "client (role=client) -> guarded tcp/80: allowed by NetworkPolicy guard",
        "client", "guarded", TCP, 4, 80, needs=_needs(POLICY)))
    out.append(Scenario(
        "policy/deny", "echo-same -> guarded tcp/80: no rule of NetworkPolicy guard admits it",
        "echo-same", "guarded", TCP, 4, 80, expect_connect=False, answer=None,
        expected_drops=frozenset({"policy-ingress"}), required_drops=frozenset({"policy-ingress"}),
        needs=_needs(POLICY)))
    out.append(Scenario(
        "policy/audit", "echo-same -> audited tcp/80: NetworkPolicy audit (lace.dev/audit) would deny; it passes as AUDIT",
        "echo-same", "audited", TCP, 4, 80, required_verdict="audit", needs=_needs(POLICY)))
    names = [s.name for s in out]
    assert len(names) == len(set(names)), "scenario names must be unique"
    return tuple(out)


SCENARIOS: tuple[Scenario, ...] = _build()


class BadPattern(ValueError):
    """A --test pattern that is not a regular expression, or matches no scenario."""


def select(patterns: list[str] | None, scenarios: tuple[Scenario, ...] = SCENARIOS) -> list[Scenario]:
    """The scenarios whose name one of ``patterns`` matches (``re.search``), in table order; all of
    them when none is given. A pattern that does not compile, or selects nothing, is BadPattern."""
    if not patterns:
        return list(scenarios)
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except re.error as exc:
            raise BadPattern(f'--test "{p}" is not a regular expression: {exc}') from None
    chosen = [s for s in scenarios if any(c.search(s.name) for c in compiled)]
    if not chosen:
        raise BadPattern(f"--test {' '.join(repr(p) for p in patterns)} matches no scenario")
    return chosen


def missing(s: Scenario, have: set[str] | frozenset[str]) -> list[str]:
    """What ``s`` needs that the cluster does not have, in CAPABILITIES order."""
    return [c for c in CAPABILITIES if c in s.needs and c not in have]

