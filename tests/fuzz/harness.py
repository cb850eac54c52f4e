"""Hostile frames for the datapath programs: hypothesis strategies that build them (scapy), and a
harness that runs each through BPF_PROG_TEST_RUN on a :class:`~lace.datapath.testbed.Testbed` and
checks what every verdict must satisfy, whatever the frame:

* **named** — the return code is one the programs use (OK, SHOT, REDIRECT); every trace event
  carries the program's trace point, a known verdict and a drop reason of ``DropReason`` that is
  not reserved; a SHOT ends with a drop event (a drop is never silent);
* **no crash** — the test run itself succeeds and its events decode;
* **no state for a dropped packet** — after a drop or a reject the conntrack, affinity and
  per-endpoint conntrack count (endpoint-ct) tables hold the entries they held before it, with the
  same values but for what conntrack legitimately updates for any packet it sees
  (``VOLATILE_FIELDS``);
* **the emulation agrees** — where ``lace policy trace``'s engine covers the frame
  (:func:`lace.policy.trace.walk_maps`, :func:`~lace.policy.trace.ingress_step` over the test bed's
  own maps), the program's decision is the one it predicts.

The emulation covers the *policy decision of a new flow*: routing in the source network, segment
resolution, the egress check and, for a local destination, the ingress check (from-pod); the
ingress check after decapsulation (from-uplink), which only a packet from another node (its
underlay address) reaches: from anyone else it is a SPOOFED_SOURCE drop; and what the node's
host namespace sends (from-host: source segment HOST, no egress policy, the destination's ingress
policy for a local pod, within the default network's own routes: the host has no route into
another network, which the emulation, made for pods, does not model). It covers well-formed frames
only: not mutated, from a known pod with its own MAC and address (from-pod), encapsulated to a SID
of this node that names two configured networks (from-uplink) or from a host address (from-host),
no fragment, at most four IPv6 extension headers, TCP/UDP/SCTP or an ICMP echo request, no VLAN
tag, no flow in conntrack (every example starts from empty tables), no service frontend. There,
the program must drop with NO_ROUTE, POLICY_EGRESS, POLICY_INGRESS or (from-uplink)
SPOOFED_SOURCE exactly when the emulation says so, and a forwarded new flow's trace event must name the destination segment the emulation resolved and say AUDIT exactly when it
does. A world may give the pods a conntrack limit and start them at it: a covered new flow the
emulation allows must then drop as CT_ENDPOINT_LIMIT (or for what the emulation does not model),
never be forwarded; and CT_ENDPOINT_LIMIT must never drop the flow of a pod below its limit.
What the emulation does not model (delivery entries, TTL, the FIB) may still drop an allowed flow
later; such drops are counted as "beyond the emulation", not as disagreements.

Every example starts from the test bed's base topology plus a drawn *world* (policy markers and
allow rules, prefix segments, a route to the outside), so the same frame meets different policy.

Test code, kept out of the product package: it needs the ``test`` extra (hypothesis, scapy) and
reads ``lace policy trace``'s engine (lace.policy), which the datapath layer sits below; the test
bed needs root and bpffs. tests/fuzz/test_datapath_fuzz.py runs a bounded budget; bench/fuzz.py a
long one (it imports this module as tests.fuzz.harness).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from lace.bpf import BPFError
from lace.datapath import config as cfgmod
from lace.datapath.common import (NETWORK_OUTSIDE, SEGMENT_ANY, SEGMENT_HOST, SEGMENT_UNKNOWN, SEGMENT_WORLD,
                                  Direction, Verdict)
from lace.datapath.conntrack import CT_ENDPOINT, CT_ENDPOINT_FIELDS, CT_ENTRY, CtFlag, ct_endpoint_value
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.policy import POLICY_MAPS, PolicyFlag, policy_entry, policy_keys, policy_maps, selected_key
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.registry import CT_TABLES
from lace.datapath.routing import route_value, routing_key
from lace.datapath.segment import prefix_segment_key, segment_value
from lace.datapath.services import AFFINITY
from lace.datapath.testbed import (HOST, HOST_MAC, LOCATOR1, LOCATOR2, NEIGH_MAC, NET1, NET2, OUTSIDE_ROUTER_MAC,
                                   PEER_HOST, REMOTE, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, UNDERLAY2,
                                   UPLINK_MAC, Testbed)
from lace.policy.emulate import PolicyMaps
from lace.policy.trace import ingress_step, verdict_of, walk_maps

PROGRAMS = ("pod", "uplink", "host")
POINT = {"pod": TracePoint.FROM_POD, "uplink": TracePoint.FROM_UPLINK, "host": TracePoint.FROM_HOST}
PROG_NAME = {"pod": "lace_from_pod", "uplink": "lace_from_uplink", "host": "lace_from_host"}
#: the maps a dropped (or rejected) packet must leave as they were
STATE_TABLES = (*CT_TABLES, "affinity", "endpoint-ct")
#: what a packet may change in an entry it does not create, even when it is dropped later in its
#: walk: conntrack sees the packet before its delivery (ct_advance: counters, state, TCP flags,
#: last seen, expiry, the SEEN_REPLY flag; ct_related and reply aliases: last seen, expiry), as the
#: kernel's conntrack counts a packet its forward path then drops; an affinity entry's last use.
#: Everything else in a value (where the flow goes, its translation, segments, creation) must stay.
VOLATILE_FIELDS = {
    "ct": ("last_seen_ns", "expires_ns", "packets_fwd", "bytes_fwd", "packets_rev", "bytes_rev", "state",
           "tcp_flags_fwd", "tcp_flags_rev"),
    "affinity": ("last_used_ns",),
}
#: ETH_HLEN: BPF_PROG_TEST_RUN refuses a tc frame shorter than its Ethernet header (EINVAL)
MIN_FRAME = 14
MAX_FRAME = 1500

#: the pods' segments, the remote pod's, reserved ones and one a prefix resolves to
POD_SEGMENTS = (257, 258, 300, 301)
PREFIX_SEGMENT = 600
PEERS = (*POD_SEGMENTS, REMOTE["segment"], SEGMENT_WORLD, SEGMENT_HOST, SEGMENT_UNKNOWN, SEGMENT_ANY,
         PREFIX_SEGMENT)
PORTS = (53, 80, 443, 8080)
OUTSIDE = {4: "203.0.113.7", 6: "2001:db8:cafe::7"}
UNROUTED = {4: "192.0.2.9", 6: "2001:db8:dead::9"}
NO_DELIVERY = {4: "10.1.7.7", 6: "fd10:1:0:7::7"}
#: the test bed's routes of network 1 into itself (Testbed.reset): where the host's flows stay
HOST_NETWORK_CIDRS = ("10.1.0.0/16", "fd10:1::/48")
#: drop reasons the emulation decides; any other drop of a covered frame is beyond it
EMULATED_REASONS = {DropReason.NO_ROUTE, DropReason.POLICY_EGRESS, DropReason.POLICY_INGRESS}


# -- what an example programs --------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """One allow rule: ``segment`` may talk to (egress) or hear from (ingress) ``peer``."""

    segment: int
    peer: int
    direction: int
    proto: int | None
    port: int | None
    end_port: int | None


@dataclass(frozen=True)
class World:
    """Policy and routing drawn for one example, on top of the test bed's base topology."""

    selected: tuple[tuple[int, int, bool], ...] = ()    # (segment, direction, audit)
    rules: tuple[Rule, ...] = ()
    outside_route: bool = False                        # NET1's default routes lead outside
    masquerade: bool = False
    prefixes: tuple[tuple[int, str, int], ...] = ()    # (network, cidr, segment)
    ct_limit: int = 0                                  # every pod's conntrack limit per table (0: none)
    ct_full: bool = False                              # every pod starts at its limit in every table

    @property
    def at_limit(self) -> bool:
        return bool(self.ct_limit) and self.ct_full

    def doc(self) -> dict[str, Any]:
        return {"selected": [list(s) for s in self.selected], "rules": [r.__dict__ for r in self.rules],
                "outside_route": self.outside_route, "masquerade": self.masquerade,
                "prefixes": [list(p) for p in self.prefixes], "ct_limit": self.ct_limit, "ct_full": self.ct_full}

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> World:
        return cls(tuple(tuple(s) for s in d["selected"]), tuple(Rule(**r) for r in d["rules"]),  # type: ignore[misc]
                   d["outside_route"], d["masquerade"], tuple(tuple(p) for p in d["prefixes"]),  # type: ignore[misc]
                   d.get("ct_limit", 0), d.get("ct_full", False))


@dataclass(frozen=True)
class Covered:
    """A frame the emulation decides: a new flow from src_ip (network, segment) to dst_ip.
    ``dst_local`` says the destination is a pod on this node (its ingress is checked here);
    ``ingress_only`` is the uplink's case (decapsulated: only the ingress check is on this node);
    there ``outer_node`` says the outer source is another node's (only a node may send to a SID:
    anything else is dropped as spoofed-source before any policy)."""

    family: int
    src_network: int
    src_segment: int
    src_ip: str
    dst_ip: str
    proto: int
    dport: int
    dst_local: bool
    ingress_only: bool = False
    dst_network: int = 0
    outer_node: bool = True

    @property
    def from_pod(self) -> bool:
        """A pod's own new flow, charged to its conntrack share (not the uplink's, not the host's)."""
        return not self.ingress_only and self.src_segment != SEGMENT_HOST


@dataclass
class Frame:
    """One packet for one program; ``preamble`` frames run first in the same example (e.g. the
    flow an ICMP error quotes). ``kind`` names the generator; ``mutated`` lists byte mutations."""

    program: str
    data: bytes
    ifname: str = ""
    kind: str = "raw"
    mutated: tuple[str, ...] = ()
    covered: Covered | None = None
    preamble: tuple[Frame, ...] = ()

    def doc(self) -> dict[str, Any]:
        return {"program": self.program, "data": base64.b64encode(self.data).decode(), "ifname": self.ifname,
                "kind": self.kind, "mutated": list(self.mutated),
                "covered": None if self.covered is None else self.covered.__dict__,
                "preamble": [p.doc() for p in self.preamble]}

    @classmethod
    def from_doc(cls, d: dict[str, Any]) -> Frame:
        return cls(d["program"], base64.b64decode(d["data"]), d.get("ifname", ""), d.get("kind", "raw"),
                   tuple(d.get("mutated", ())), Covered(**d["covered"]) if d.get("covered") else None,
                   tuple(cls.from_doc(p) for p in d.get("preamble", ())))


# -- strategies ------------------------------------------------------------------------------------

@st.composite
def worlds(draw: st.DrawFn) -> World:
    selected = draw(st.lists(st.tuples(st.sampled_from(POD_SEGMENTS), st.sampled_from([int(Direction.INGRESS), int(Direction.EGRESS)]),
                                       st.booleans()), max_size=4, unique_by=lambda s: s[:2]))
    rules = []
    for _ in range(draw(st.integers(0, 5))):
        proto = draw(st.sampled_from([None, 6, 17, 132, 1, 58]))
        port = end = None
        if proto in (6, 17, 132) and draw(st.booleans()):
            port = draw(st.sampled_from(PORTS))
            if draw(st.booleans()):
                end = port + draw(st.integers(1, 500))
        rules.append(Rule(draw(st.sampled_from(POD_SEGMENTS)), draw(st.sampled_from(PEERS)),
                          draw(st.sampled_from([int(Direction.INGRESS), int(Direction.EGRESS)])), proto, port, end))
    prefixes = draw(st.lists(st.sampled_from([
        (NETWORK_OUTSIDE, "203.0.113.0/24", PREFIX_SEGMENT), (NETWORK_OUTSIDE, "2001:db8:cafe::/48", PREFIX_SEGMENT),
        (NET1, "10.1.7.0/24", PREFIX_SEGMENT), (NET1, "10.1.2.0/24", PREFIX_SEGMENT),
        (NET1, "fd10:1:0:2::/64", PREFIX_SEGMENT)]), max_size=3, unique=True))
    outside = draw(st.booleans())
    ct_limit = draw(st.sampled_from([0, 0, 1, 3]))
    return World(tuple(selected), tuple(rules), outside, outside and draw(st.booleans()), tuple(prefixes),
                 ct_limit, bool(ct_limit) and draw(st.booleans()))


def _payload(draw: st.DrawFn) -> bytes:
    return draw(st.binary(max_size=48))


@st.composite
def l4_layers(draw: st.DrawFn, family: int, clean: bool = False) -> tuple[Any, int, int, bool]:
    """(scapy L4 layer, proto, dport, covered by the emulation); ``clean``: a kind the emulation
    covers (TCP SYN, UDP, SCTP, echo request)."""
    from scapy.layers.inet import ICMP, TCP, UDP
    from scapy.layers.inet6 import ICMPv6EchoReply, ICMPv6EchoRequest, ICMPv6Unknown
    from scapy.layers.sctp import SCTP
    from scapy.packet import Raw

    kind = draw(st.sampled_from(["tcp", "tcp", "udp", "sctp", "echo"] if clean else
                                ["tcp", "tcp", "udp", "sctp", "echo", "echo-reply", "icmp-any", "proto-any"]))
    sport = draw(st.sampled_from([1, 1024, 40000, 65535]) | st.integers(0, 65535))
    dport = draw(st.sampled_from(PORTS) | st.integers(0, 65535))
    body = Raw(_payload(draw))
    if kind == "tcp":
        flags = "S" if clean else draw(st.sampled_from(["S", "S", "SA", "A", "R", "FA", "PA"]) | st.integers(0, 255))
        return TCP(sport=sport, dport=dport, flags=flags) / body, 6, dport, flags == "S"
    if kind == "udp":
        return UDP(sport=sport, dport=dport) / body, 17, dport, True
    if kind == "sctp":
        return SCTP(sport=sport, dport=dport) / body, 132, dport, True
    ident = draw(st.integers(0, 65535))
    if kind in ("echo", "echo-reply"):
        reply = kind == "echo-reply"
        if family == 4:
            return ICMP(type=0 if reply else 8, id=ident, seq=1) / body, 1, 0, not reply
        return (ICMPv6EchoReply if reply else ICMPv6EchoRequest)(id=ident, seq=1) / body, 58, 0, not reply
    if kind == "icmp-any":   # any type and code: errors with garbage quotes, ND, router messages
        itype, code = draw(st.integers(0, 255)), draw(st.integers(0, 255))
        if family == 4:
            return ICMP(type=itype, code=code) / body, 1, 0, False
        return ICMPv6Unknown(type=itype, code=code, msgbody=bytes(body)), 58, 0, False
    return Raw(_payload(draw)), draw(st.integers(0, 255)), 0, False


@st.composite
def ipv4_options(draw: st.DrawFn) -> list[Any]:
    """IPv4 options: NOPs, end of list, and options of any type whose length may lie."""
    from scapy.layers.inet import IPOption, IPOption_EOL, IPOption_NOP

    out = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["nop", "eol", "tlv", "tlv"]))
        if kind == "nop":
            out.append(IPOption_NOP())
        elif kind == "eol":
            out.append(IPOption_EOL())
        else:
            value = draw(st.binary(max_size=12))
            length = draw(st.sampled_from([len(value) + 2, len(value) + 2, 0, 1, 255]))
            out.append(IPOption(copy_flag=draw(st.integers(0, 1)), optclass=draw(st.sampled_from([0, 2])),
                                option=draw(st.integers(0, 31)), length=length, value=value))
    return out


@st.composite
def ip_headers(draw: st.DrawFn, family: int, src: str, dst: str, proto: int,
               clean: bool = False) -> tuple[Any, bool]:
    """(scapy IP header chain with drawn options, extension headers, fragments and lengths,
    well-formed); ``clean``: options and extension headers still, but no fragment, no lying
    length, no chain longer than the datapath walks."""
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import (IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop,
                                    IPv6ExtHdrRouting)

    ttl = draw(st.sampled_from([64, 64, 64, 2, 1, 0]))
    ok = True
    if family == 4:
        kw: dict[str, Any] = {}
        if draw(st.integers(0, 3)) == 0:
            kw["options"] = opts = draw(ipv4_options())
            ok = len(b"".join(bytes(o) for o in opts)) <= 40    # longer: IHL wraps, the header lies
        if not clean and draw(st.integers(0, 5)) == 0:
            kw["flags"] = draw(st.sampled_from(["MF", "DF", 0]))
            kw["frag"] = draw(st.sampled_from([0, 1, 185, 8191]))
            ok = ok and kw["flags"] != "MF" and kw["frag"] == 0
        if not clean and draw(st.integers(0, 7)) == 0:
            kw["len"] = draw(st.integers(0, 65535))     # a lie: the datapath does not trust it
        return IP(src=src, dst=dst, ttl=ttl, proto=proto, **kw), ok
    hdr = IPv6(src=src, dst=dst, hlim=ttl, nh=proto)
    if not clean and draw(st.integers(0, 7)) == 0:
        hdr.plen = draw(st.integers(0, 65535))
    chain = draw(st.lists(st.sampled_from(["hbh", "dst", "rt"] if clean else ["hbh", "dst", "rt", "frag"]),
                          max_size=4 if clean else 6))
    for ext in chain:
        if ext == "hbh":
            hdr = hdr / IPv6ExtHdrHopByHop()
        elif ext == "dst":
            hdr = hdr / IPv6ExtHdrDestOpt()
        elif ext == "rt":
            hdr = hdr / IPv6ExtHdrRouting(addresses=[dst] * draw(st.integers(0, 2)))
        else:
            hdr = hdr / IPv6ExtHdrFragment(offset=draw(st.sampled_from([0, 1, 100])), m=draw(st.integers(0, 1)))
    ok = "frag" not in chain and len(chain) <= 4
    if chain:   # scapy sets each header's nh from the next layer: the last one names proto
        last = hdr.lastlayer()
        last.nh = proto
    return hdr, ok


def _ether(draw: st.DrawFn, src: str, dst: str, clean: bool = False) -> tuple[Any, bool]:
    """An Ethernet header, sometimes with one or two VLAN tags (never a lace frame)."""
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether

    tags = 0 if clean else draw(st.sampled_from([0, 0, 0, 0, 1, 2]))
    eth = Ether(src=src, dst=dst)
    if tags == 1:
        eth = eth / Dot1Q(vlan=draw(st.integers(0, 4095)))
    elif tags == 2:
        eth = eth / Dot1AD(vlan=draw(st.integers(0, 4095))) / Dot1Q(vlan=draw(st.integers(0, 4095)))
    return eth, tags == 0


def _pod_destination(draw: st.DrawFn, dp: Testbed, family: int, src_name: str) -> str:
    pods = [p for p in dp.pods.values() if p.name != "x"]
    choice = draw(st.sampled_from(["pod", "pod", "remote", "outside", "unrouted", "no-delivery", "any"]))
    if choice == "pod":
        return draw(st.sampled_from(pods)).ip(family)
    if choice == "remote":
        return REMOTE["ipv4" if family == 4 else "ipv6"]
    if choice == "outside":
        return OUTSIDE[family]
    if choice == "unrouted":
        return UNROUTED[family]
    if choice == "no-delivery":
        return NO_DELIVERY[family]
    raw = draw(st.binary(min_size=4 if family == 4 else 16, max_size=4 if family == 4 else 16))
    return str(ipaddress.ip_address(raw))


def _local_pod(dp: Testbed, network: int, ip: str) -> bool:
    return any(p.network == network and ipaddress.ip_address(p.ip(4 if ":" not in ip else 6)) ==
               ipaddress.ip_address(ip) for p in dp.pods.values() if p.name != "x")


@st.composite
def icmp_errors(draw: st.DrawFn, dp: Testbed, family: int) -> Frame:
    """An ICMP error a pod sends about a flow: the flow opened by a preamble (b -> a, quoted back by
    a), or another flow altogether (a tuple nobody opened, another network's, the outside's)."""
    from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror, TCPerror, UDPerror
    from scapy.layers.inet6 import ICMPv6DestUnreach, ICMPv6TimeExceeded, IPerror6, IPv6
    from scapy.layers.l2 import Ether

    a, b = dp.pods["a"], dp.pods["b"]
    udp = draw(st.booleans())
    sport, dport = draw(st.integers(1, 65535)), draw(st.sampled_from(PORTS))
    quoted_src = draw(st.sampled_from([b.ip(family), dp.pods["d"].ip(family), REMOTE["ipv4" if family == 4 else "ipv6"],
                                       OUTSIDE[family]]))
    opened = quoted_src == b.ip(family) and draw(st.booleans())
    if family == 4:
        inner = IPerror(src=quoted_src, dst=a.ip(4), proto=17 if udp else 6)
        inner = inner / (UDPerror(sport=sport, dport=dport) if udp else TCPerror(sport=sport, dport=dport, flags="S"))
        err = ICMP(type=draw(st.sampled_from([3, 11, 12])), code=draw(st.integers(0, 15)))
        outer = Ether(src=a.mac, dst=a.host_mac) / IP(src=a.ip(4), dst=quoted_src) / err / inner
    else:
        inner = IPerror6(src=quoted_src, dst=a.ip(6), nh=17 if udp else 6)
        inner = inner / (UDPerror(sport=sport, dport=dport) if udp else TCPerror(sport=sport, dport=dport, flags="S"))
        err = draw(st.sampled_from([ICMPv6DestUnreach(code=4), ICMPv6TimeExceeded()]))
        outer = Ether(src=a.mac, dst=a.host_mac) / IPv6(src=a.ip(6), dst=quoted_src) / err / inner
    preamble: tuple[Frame, ...] = ()
    if opened:
        l4 = UDP(sport=sport, dport=dport) if udp else TCP(sport=sport, dport=dport, flags="S")
        opener = dp.l3(b, a.ip(family), family) / l4
        preamble = (Frame("pod", bytes(opener), "b", "open-flow"),)
    return Frame("pod", bytes(outer), "a", f"icmp-error-{'opened' if opened else 'other'}-v{family}",
                 preamble=preamble)


@st.composite
def pod_frames(draw: st.DrawFn, dp: Testbed) -> Frame:
    """A frame leaving a pod: mostly its own, sometimes spoofed, from a veth lace does not know,
    with options, extension headers, fragments, lying lengths, VLAN tags, any protocol."""
    family = draw(st.sampled_from([4, 6]))
    if draw(st.integers(0, 9)) == 0:
        return draw(icmp_errors(dp, family))
    clean = draw(st.booleans())    # half of them well-formed, for the emulation to decide
    src = dp.pods[draw(st.sampled_from(["a", "a", "b", "c", "d"] if clean else ["a", "b", "c", "d", "x"]))]
    src_ip, src_mac = src.ip(family), src.mac
    spoof = None if clean else draw(st.sampled_from([None] * 4 + ["ip", "mac"]))
    if spoof == "ip":
        src_ip = dp.pods["b" if src.name != "b" else "a"].ip(family)
    elif spoof == "mac":
        src_mac = "02:00:00:00:00:ee"
    dst = _pod_destination(draw, dp, family, src.name)
    l4, proto, dport, l4_ok = draw(l4_layers(family, clean))
    ip, ip_ok = draw(ip_headers(family, src_ip, dst, proto, clean))
    eth, eth_ok = _ether(draw, src_mac, src.host_mac, clean)
    data = bytes(eth / ip / l4)
    covered = None
    if l4_ok and ip_ok and eth_ok and spoof is None and src.name != "x":
        covered = Covered(family, src.network, src.segment, src_ip, dst, proto, dport,
                          dst_local=_local_pod(dp, src.network, dst))
    return Frame("pod", data, src.name, f"pod-v{family}", covered=covered)


@st.composite
def uplink_frames(draw: st.DrawFn, dp: Testbed) -> Frame:
    """A frame from the underlay: encapsulated to a SID of this node (networks that exist or not),
    of another locator, or with a SID that is no lace SID; the wrong next header for its inner
    packet; or a plain packet from the outside."""
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrRouting
    from scapy.packet import Raw

    family = draw(st.sampled_from([4, 6]))
    a = dp.pods[draw(st.sampled_from(["a", "b", "c", "d"]))]
    if draw(st.integers(0, 4)) == 0:   # from the outside, not encapsulated
        dst = draw(st.sampled_from([a.ip(family), OUTSIDE[family], "198.18.0.1" if family == 4 else "2001:db8:f::1"]))
        l4, proto, _, _ = draw(l4_layers(family))
        ip, _ = draw(ip_headers(family, OUTSIDE[family], dst, proto))
        eth, _ = _ether(draw, OUTSIDE_ROUTER_MAC, UPLINK_MAC)
        return Frame("uplink", bytes(eth / ip / l4), kind=f"outside-v{family}")
    clean = draw(st.booleans())
    networks = [NET1, NET2, 0, 99, NETWORK_OUTSIDE]
    dst_net = a.network if clean else draw(st.sampled_from([a.network] * 3 + networks))
    src_net = draw(st.sampled_from([NET1, NET2] if clean else [dst_net] * 3 + networks))
    where = "own" if clean else draw(st.sampled_from(["own", "own", "other-locator", "garbage"]))
    if where == "garbage":
        outer_dst = str(ipaddress.IPv6Address(cfgmod.sid(LOCATOR1, None, 0)[:6] + draw(st.binary(min_size=10, max_size=10))))
    else:
        outer_dst = str(ipaddress.IPv6Address(cfgmod.sid(LOCATOR1 if where == "own" else LOCATOR2, None,
                                                         dst_net, src_net)))
    src_ip = draw(st.sampled_from([REMOTE["ipv4" if family == 4 else "ipv6"], dp.pods["b"].ip(family),
                                   OUTSIDE[family]]))
    dst_ip = a.ip(family) if clean else draw(st.sampled_from([a.ip(family), NO_DELIVERY[family], UNROUTED[family]]))
    l4, proto, dport, l4_ok = draw(l4_layers(family, clean))
    inner, ip_ok = draw(ip_headers(family, src_ip, dst_ip, proto, clean))
    right_nh = 4 if family == 4 else 41
    nh = right_nh if clean else draw(st.sampled_from([right_nh] * 3 + [4 if family == 6 else 41, 43, 17, 59]))
    outer_src = draw(st.sampled_from([UNDERLAY2, "2001:db8:f::99"]))    # node 2, or no node
    outer = IPv6(src=outer_src, dst=outer_dst, nh=nh, hlim=64)
    if nh == 43:   # a segment routing header in front of the inner packet
        outer = outer / IPv6ExtHdrRouting(type=4, nh=right_nh, addresses=[outer_dst])
    eth, eth_ok = _ether(draw, NEIGH_MAC, UPLINK_MAC, clean)
    data = bytes(eth / outer / Raw(bytes(inner / l4)))
    covered = None
    if (where == "own" and nh == right_nh and eth_ok and ip_ok and l4_ok and dst_net in (NET1, NET2)
            and src_net in (NET1, NET2) and _local_pod(dp, dst_net, dst_ip)):
        covered = Covered(family, src_net, 0, src_ip, dst_ip, proto, dport, dst_local=True,
                          ingress_only=True, dst_network=dst_net, outer_node=outer_src == UNDERLAY2)
    return Frame("uplink", data, kind=f"encap-{where}-v{family}", covered=covered)


@st.composite
def host_frames(draw: st.DrawFn, dp: Testbed) -> Frame:
    """A frame the node's host namespace sends out of lace_host: mostly from its own addresses, to
    pods of this node and of node 2, to the outside, to nowhere; sometimes from an address that is
    not its own (a pod's, node 2's host address, the outside's: what the node's stack would forward
    to a pod address if it could), with options, extension headers, fragments, VLAN tags."""
    family = draw(st.sampled_from([4, 6]))
    if draw(st.integers(0, 9)) == 0:
        return draw(host_icmp_errors(dp, family))
    clean = draw(st.booleans())
    own = HOST[family]
    src = own if clean else draw(st.sampled_from([own] * 3 + [dp.pods["a"].ip(family), PEER_HOST[family],
                                                              OUTSIDE[family]]))
    dst = _pod_destination(draw, dp, family, "host")
    l4, proto, dport, l4_ok = draw(l4_layers(family, clean))
    ip, ip_ok = draw(ip_headers(family, src, dst, proto, clean))
    eth, eth_ok = _ether(draw, HOST_MAC, HOST_MAC, clean)   # NOARP: the stack sends to its own MAC
    covered = None
    # the host reaches the default network alone: a route into another network (the outside's
    # included) is no route for it, which the emulation, made for pods, does not model
    if l4_ok and ip_ok and eth_ok and src == own and any(ipaddress.ip_address(dst) in ipaddress.ip_network(c)
                                                         for c in HOST_NETWORK_CIDRS):
        covered = Covered(family, NET1, SEGMENT_HOST, src, dst, proto, dport, dst_local=_local_pod(dp, NET1, dst))
    return Frame("host", bytes(eth / ip / l4), kind=f"host-v{family}", covered=covered)


@st.composite
def host_icmp_errors(draw: st.DrawFn, dp: Testbed, family: int) -> Frame:
    """An ICMP error the node's stack sends a pod about the pod's flow to a host address: the flow
    opened by a preamble (from the pod), or never opened."""
    from scapy.layers.inet import ICMP, IP, TCP, UDP, IPerror, TCPerror, UDPerror
    from scapy.layers.inet6 import ICMPv6DestUnreach, ICMPv6TimeExceeded, IPerror6, IPv6
    from scapy.layers.l2 import Ether

    pod = dp.pods[draw(st.sampled_from(["a", "b"]))]        # the default network's pods
    own, udp = HOST[family], draw(st.booleans())
    sport, dport = draw(st.integers(1024, 65535)), draw(st.sampled_from(PORTS))
    quoted = (UDPerror(sport=sport, dport=dport) if udp else TCPerror(sport=sport, dport=dport, flags="S"))
    if family == 4:
        err = ICMP(type=draw(st.sampled_from([3, 11, 12])), code=draw(st.integers(0, 15)))
        outer = IP(src=own, dst=pod.ip(4)) / err / IPerror(src=pod.ip(4), dst=own, proto=17 if udp else 6) / quoted
    else:
        err = draw(st.sampled_from([ICMPv6DestUnreach(code=4), ICMPv6TimeExceeded()]))
        outer = IPv6(src=own, dst=pod.ip(6)) / err / IPerror6(src=pod.ip(6), dst=own, nh=17 if udp else 6) / quoted
    preamble: tuple[Frame, ...] = ()
    if draw(st.booleans()):
        l4 = UDP(sport=sport, dport=dport) if udp else TCP(sport=sport, dport=dport, flags="S")
        preamble = (Frame("pod", bytes(dp.l3(pod, own, family) / l4), pod.name, "open-flow"),)
    return Frame("host", bytes(Ether(src=HOST_MAC, dst=HOST_MAC) / outer), kind=f"host-icmp-error-v{family}",
                 preamble=preamble)


@st.composite
def mutations(draw: st.DrawFn, frame: Frame) -> Frame:
    """``frame`` with byte mutations: truncation, bit flips, overwritten, inserted or deleted bytes."""
    data = bytearray(frame.data)
    ops: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["truncate", "flip", "set", "insert", "delete"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "truncate":
            n = draw(st.integers(MIN_FRAME, max(len(data), MIN_FRAME)))
            del data[n:]
            ops.append(f"truncate {n}")
        elif op == "flip" and data:
            bit = draw(st.integers(0, 7))
            data[i] ^= 1 << bit
            ops.append(f"flip {i}.{bit}")
        elif op == "set" and data:
            data[i] = draw(st.integers(0, 255))
            ops.append(f"set {i}={data[i]}")
        elif op == "insert":
            blob = draw(st.binary(min_size=1, max_size=16))
            data[i:i] = blob
            ops.append(f"insert {i}+{len(blob)}")
        elif op == "delete":
            n = draw(st.integers(1, 16))
            del data[i:i + n]
            ops.append(f"delete {i}-{n}")
    data = data[:MAX_FRAME]
    if len(data) < MIN_FRAME:
        data += bytes(MIN_FRAME - len(data))
    return Frame(frame.program, bytes(data), frame.ifname, frame.kind + "+mutated", tuple(ops), None, frame.preamble)


def frames(dp: Testbed, program: str) -> st.SearchStrategy[Frame]:
    """Frames for ``program``: six in ten structured, three in ten structured then mutated, one in
    ten random bytes."""
    base = {"pod": pod_frames, "uplink": uplink_frames, "host": host_frames}[program](dp)

    @st.composite
    def pick(draw: st.DrawFn) -> Frame:
        n = draw(st.integers(0, 9))
        if n == 0:
            return Frame(program, draw(st.binary(min_size=MIN_FRAME, max_size=200)),
                         "a" if program == "pod" else "", "random-bytes")
        frame = draw(base)
        return draw(mutations(frame)) if n <= 3 else frame
    return pick()


# -- running and checking --------------------------------------------------------------------------

@dataclass
class Outcome:
    """What one frame did: a verdict label (``drop:<reason>``, ``forward``, ``redirect``,
    ``reject:<reason>``, ``pass``), what went wrong, and how the emulation compared."""

    verdict: str
    problems: list[str] = field(default_factory=list)
    emulation: str = "not covered"     # "agrees", "beyond", "disagrees", "not covered"
    crash: bool = False


def kernel_refuses(data: bytes) -> bool:
    """True for a frame BPF_PROG_TEST_RUN will not build an skb of (EINVAL): IPv4 or IPv6 by its
    ethertype with less than a minimal IP header after the Ethernet header (the kernel pulls that
    much before the program runs). Such frames cannot be run here; they are counted as refused."""
    ethertype = int.from_bytes(data[12:14], "big")
    need = {0x0800: 20, 0x86DD: 40}.get(ethertype)
    return need is not None and len(data) - MIN_FRAME < need


class Harness:
    """Runs frames on a test bed under a world and checks them (see the module docstring)."""

    def __init__(self, dp: Testbed) -> None:
        self.dp = dp
        self.progs = {p: dp.loaded.program(PROG_NAME[p]) for p in PROGRAMS}   # type: ignore[union-attr]
        self._reset = False
        self.world = World()

    def program_world(self, world: World) -> None:
        """The base topology, then the world's routes, prefixes and policy; conntrack empty.

        The test bed is reset in full once; after that only what an example changes is undone
        (what the world wrote, the tables the programs write), five times faster than a reset."""
        dp = self.dp
        if not self._reset:
            dp.reset()
            dp.host_device()
            self._reset = True
        else:
            for name in (*STATE_TABLES, *POLICY_MAPS, "prefix-segment"):
                dp.m(name).clear()
            for cidr in ("0.0.0.0/0", "::/0"):
                dp.m("routing").delete(routing_key(NET1, cidr))
        if world.outside_route:
            for cidr in ("0.0.0.0/0", "::/0"):
                dp.m("routing").update(routing_key(NET1, cidr), route_value(NETWORK_OUTSIDE, masquerade=world.masquerade))
        for net, cidr, seg in world.prefixes:
            dp.m("prefix-segment").update(prefix_segment_key(net, cidr), segment_value(seg))
        # one dict of entries (a later rule's key replaces an earlier one's), split into the two
        # maps as the agent splits its resolver's entries
        entries: dict[bytes, bytes] = {}
        for seg, direction, audit in world.selected:
            flags = PolicyFlag.SELECTED | (PolicyFlag.AUDIT if audit else 0)
            entries[selected_key(seg, direction)] = policy_entry(90, 0, int(flags))
        for n, r in enumerate(world.rules, start=1):
            for k in policy_keys(r.segment, r.peer, r.direction, r.proto, r.port, r.end_port):
                entries[k] = policy_entry(91, n)
        for name, want in policy_maps(entries).items():
            for k, v in want.items():
                dp.m(name).update(k, v)
        # every pod's conntrack limit (as the agent writes it), and its counts when it starts at it
        for pod in dp.pods.values():
            if pod.name == "x":
                continue
            dp.m("veth").update(veth_key(pod.ifindex), endpoint_value(
                endpoint_id=pod.endpoint_id, network=pod.network, segment=pod.segment, mac=pod.mac,
                ipv4=pod.ipv4, ipv6=pod.ipv6, ct_max=world.ct_limit))
            if world.at_limit:
                dp.m("endpoint-ct").update(veth_key(pod.ifindex), ct_endpoint_value(
                    {table: world.ct_limit for table in CT_ENDPOINT_FIELDS}))

    def state(self) -> dict[tuple[str, bytes], tuple[Any, ...]]:
        """Every entry of the state tables, its value without the fields a packet may change on
        its way to a drop (VOLATILE_FIELDS)."""
        out = {}
        for name in STATE_TABLES:
            layout, volatile = {"affinity": (AFFINITY, VOLATILE_FIELDS["affinity"]),
                                "endpoint-ct": (CT_ENDPOINT, ())}.get(name, (CT_ENTRY, VOLATILE_FIELDS["ct"]))
            for k, v in self.dp.m(name).entries():
                fields = layout.unpack(v)
                if layout is CT_ENTRY:
                    fields["flags"] &= ~int(CtFlag.SEEN_REPLY)
                out[(name, k)] = tuple(sorted((f, x) for f, x in fields.items() if f not in volatile))
        return out

    @staticmethod
    def state_changes(before: dict[tuple[str, bytes], tuple[Any, ...]],
                      after: dict[tuple[str, bytes], tuple[Any, ...]]) -> list[str]:
        """What a packet that went no further changed in the state tables: entries it left, entries
        it removed, entries whose (non-volatile) value it rewrote, per table."""
        out = []
        for what, keys in (("left entries in", after.keys() - before.keys()),
                           ("removed entries from", before.keys() - after.keys()),
                           ("modified entries in", {k for k in after.keys() & before.keys() if after[k] != before[k]})):
            tables = sorted({name for name, _ in keys})
            if tables:
                out.append(f"{what} {', '.join(tables)}")
        return out

    def emulation(self) -> PolicyMaps:
        """The test bed's maps as ``lace policy trace`` reads a node's pins."""
        dp = self.dp
        return PolicyMaps("testbed", dict(dp.m("policy").entries()), dict(dp.m("segment").entries()),
                          dict(dp.m("prefix-segment").entries()), dict(dp.m("routing").entries()),
                          policy_exact=dict(dp.m("policy-exact").entries()))

    def ifindex(self, frame: Frame) -> int:
        if frame.program == "pod":
            return self.dp.pods[frame.ifname or "a"].ifindex
        if frame.program == "host":
            return self.dp.ifindex["lace_net"]
        return self.dp.ifindex["up0"]

    def run(self, frame: Frame, world: World) -> Outcome:
        """Program ``world``, run the preamble and the frame; the frame's outcome (a preamble's
        problems are the frame's too)."""
        self.program_world(world)
        self.world = world
        problems: list[str] = []
        for pre in frame.preamble:
            out = self._run_one(pre)
            problems += [f"preamble {pre.kind}: {p}" for p in out.problems]
        out = self._run_one(frame)
        out.problems[:0] = problems
        return out

    def _run_one(self, frame: Frame) -> Outcome:
        before = self.state()
        pm = self.emulation() if frame.covered else None
        try:
            res = self.dp.run(self.progs[frame.program], frame.data, self.ifindex(frame))
        except BPFError as exc:
            if kernel_refuses(frame.data):
                return Outcome("refused")
            return Outcome("crash", [f"BPF_PROG_TEST_RUN failed: {exc}"], crash=True)
        except Exception as exc:   # an event that does not decode is a crash of the harness's reading
            return Outcome("crash", [f"{type(exc).__name__}: {exc}"], crash=True)
        out = self.check(frame.program, res.retval, res.events)
        if out.verdict.startswith(("drop:", "reject:")):   # a reject answers a flow that never was
            changes = self.state_changes(before, self.state())
            if changes:
                out.problems.append(f"dropped ({out.verdict}) but {'; '.join(changes)}")
        if frame.covered is not None and pm is not None and not out.problems:
            self.compare(frame.covered, pm, res.retval, res.events, out)
        return out

    @staticmethod
    def check(program: str, retval: int, events: list[dict[str, Any]]) -> Outcome:
        """The verdict label and the naming problems of one run."""
        problems = []
        point = POINT[program]
        for ev in events:
            if ev["point"] != point:
                problems.append(f"event at point {ev['point']}, not {point.label}")
            if ev["verdict"] not in Verdict.__members__.values():
                problems.append(f"event verdict {ev['verdict']} unknown")
                continue
            try:
                reason = DropReason(ev["reason"])
            except ValueError:
                problems.append(f"drop reason {ev['reason']} unknown")
                continue
            if reason.reserved:
                problems.append(f"drop reason {reason.label} is reserved, nothing may emit it")
            if ev["verdict"] == Verdict.DROP and reason == DropReason.NONE:
                problems.append("a drop event without a reason")
            if ev["verdict"] == Verdict.FORWARD and reason != DropReason.NONE:
                problems.append(f"a forward event with reason {reason.label}")
            if ev["verdict"] == Verdict.AUDIT and reason not in (DropReason.POLICY_EGRESS, DropReason.POLICY_INGRESS):
                problems.append(f"an audit event with reason {reason.label}")
        drops = [e for e in events if e["verdict"] == Verdict.DROP]
        if retval == TC_ACT_SHOT:
            if not drops or events[-1]["verdict"] != Verdict.DROP:
                problems.append("dropped (TC_ACT_SHOT) without a drop event: a silent drop")
                return Outcome("drop:unnamed", problems)
            return Outcome("drop:" + DropReason(drops[-1]["reason"]).label, problems)
        if retval == TC_ACT_REDIRECT:
            if drops:   # a refused flow answered (lib/reject.h): traced as its drop, then the answer
                return Outcome("reject:" + DropReason(drops[-1]["reason"]).label, problems)
            return Outcome("redirect", problems)
        if retval == TC_ACT_OK:
            if drops:
                problems.append(f"passed (TC_ACT_OK) after a drop event ({DropReason(drops[-1]['reason']).label})")
            return Outcome("forward" if events else "pass", problems)
        problems.append(f"return code {retval} is none the programs use")
        return Outcome(f"retval:{retval}", problems)

    @staticmethod
    def predict(c: Covered, pm: PolicyMaps) -> tuple[str, str | None, int | None]:
        """(verdict, reason name, destination segment) that ``lace policy trace``'s engine gives."""
        src, dst = ipaddress.ip_address(c.src_ip), ipaddress.ip_address(c.dst_ip)
        if c.ingress_only and not c.outer_node:
            return "deny", "SPOOFED_SOURCE", None
        if c.ingress_only:
            ing = ingress_step(pm, c.src_network, src, c.dst_network, dst, c.proto, c.dport)
            verdict = ing["verdict"]
            return verdict, "POLICY_INGRESS" if verdict == "deny" else None, ing["subject"]
        eg, ing = walk_maps(pm, (lambda: pm) if c.dst_local else None, c.src_network, c.src_segment,
                            src, dst, c.proto, c.dport)
        verdict, reason = verdict_of(eg, ing)
        return verdict, reason, eg.get("peer")

    def compare(self, c: Covered, pm: PolicyMaps, retval: int, events: list[dict[str, Any]], out: Outcome) -> None:
        verdict, reason, dseg = self.predict(c, pm)
        drops = [e for e in events if e["verdict"] == Verdict.DROP]
        got = DropReason(drops[-1]["reason"]) if retval == TC_ACT_SHOT and drops else None
        if verdict == "deny":
            want = DropReason[reason]   # type: ignore[misc]
            if got != want:
                out.emulation = "disagrees"
                out.problems.append(f"emulation says drop {want.label}, the program {out.verdict}")
            else:
                out.emulation = "agrees"
            return
        if got in EMULATED_REASONS:
            out.emulation = "disagrees"
            out.problems.append(f"emulation says {verdict}, the program dropped {got.label}")   # type: ignore[union-attr]
            return
        if got == DropReason.CT_ENDPOINT_LIMIT and not (self.world.at_limit and c.from_pod):
            out.emulation = "disagrees"
            out.problems.append("dropped ct-endpoint-limit, but the pod is below its conntrack limit")
            return
        if got == DropReason.CT_ENDPOINT_LIMIT:
            out.emulation = "agrees"     # allowed by policy, refused by the pod's full share
            return
        if got is not None:
            out.emulation = "beyond"     # allowed by policy, dropped by what the emulation does not model
            return
        new = [e for e in events if e["verdict"] in (Verdict.FORWARD, Verdict.AUDIT)]
        if not new:
            out.emulation = "beyond"     # a reject answer, or a pass the emulation does not model
            return
        ev = new[0]
        if self.world.at_limit and c.from_pod:
            out.emulation = "disagrees"
            out.problems.append(f"a new flow {Verdict(ev['verdict']).label}ed past the pod's conntrack limit "
                                f"({self.world.ct_limit} in every table)")
            return
        if dseg is not None and ev["dst_segment"] != dseg:
            out.emulation = "disagrees"
            out.problems.append(f"emulation resolves the destination to segment {dseg}, the program to {ev['dst_segment']}")
            return
        if (ev["verdict"] == Verdict.AUDIT) != (verdict == "audit"):
            out.emulation = "disagrees"
            out.problems.append(f"emulation says {verdict}, the program's event says {Verdict(ev['verdict']).label}")
            return
        out.emulation = "agrees"


# -- known datapath bugs ----------------------------------------------------------------------------

#: Problems the fuzzer found that are recorded, not fixed: name -> (pattern of the problem, why).
#: The CI property test counts them instead of failing; the corpus keeps one case of each as a
#: strict expected failure, which fails the day the datapath is fixed (drop the entry then).
KNOWN_ISSUES: dict[str, tuple[str, str]] = {
    # name: (a regular expression matching the problem text, what the bug is and how to fix it).
    # None open: "ct-before-late-drop" (a new flow's conntrack entry left behind by a TTL-exceeded
    # or FIB-lookup-failed drop) was fixed in pod_veth.c; its corpus cases now replay clean.
}


def known_issue(problem: str) -> str | None:
    """The name of the recorded bug ``problem`` is an instance of, else None."""
    import re

    for name, (pattern, _) in KNOWN_ISSUES.items():
        if re.search(pattern, problem):
            return name
    return None


# -- statistics and the corpus ---------------------------------------------------------------------

def problem_kind(problem: str) -> str:
    """What a problem is an instance of, for counting and for keeping one corpus case of each: a
    recorded bug by name, else the text with its numbers (segments, return codes, lengths, event
    fields that change from frame to frame) blanked, cut to 100 characters."""
    import re

    return known_issue(problem) or "new: " + re.sub(r"\d+", "N", problem)[:100]


@dataclass
class Stats:
    """Counts over many examples: per program and verdict, emulation comparisons, problems."""

    examples: Counter = field(default_factory=Counter)
    verdicts: dict[str, Counter] = field(default_factory=dict)
    emulation: Counter = field(default_factory=Counter)
    crashes: int = 0
    disagreements: int = 0
    problems: Counter = field(default_factory=Counter)     # problem kind (known issue or new) -> count

    def add(self, program: str, out: Outcome) -> None:
        self.examples[program] += 1
        self.verdicts.setdefault(program, Counter())[out.verdict] += 1
        self.emulation[out.emulation] += 1
        self.crashes += out.crash
        self.disagreements += out.emulation == "disagrees"
        for p in out.problems:
            self.problems[problem_kind(p)] += 1


def corpus_dir() -> str:
    """tests/fuzz/corpus/datapath in the repo: every crashing or disagreeing input, replayed by CI."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "datapath")


def save_case(frame: Frame, world: World, out: Outcome, directory: str | None = None) -> str:
    """Write one failing input (frame, world, what went wrong) as JSON, named by its content."""
    import hashlib

    directory = directory or corpus_dir()
    os.makedirs(directory, exist_ok=True)
    doc: dict[str, Any] = {"frame": frame.doc(), "world": world.doc(),
                           "found": {"verdict": out.verdict, "problems": out.problems}}
    known = {known_issue(p) for p in out.problems}
    if out.problems and None not in known:   # every problem a recorded bug: replayed as expected to fail
        doc["xfail"] = "; ".join(f"{k}: {KNOWN_ISSUES[k][1]}" for k in sorted(known))   # type: ignore[index]
    name = hashlib.sha256(json.dumps([doc["frame"], doc["world"]], sort_keys=True).encode()).hexdigest()[:16]
    path = os.path.join(directory, f"{frame.program}-{name}.json")
    if not os.path.exists(path):
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
    return path


def load_cases(directory: str | None = None) -> list[tuple[str, Frame, World, dict[str, Any]]]:
    """(file name, frame, world, the case's whole document) for every case in the corpus."""
    directory = directory or corpus_dir()
    out = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json"):
                with open(os.path.join(directory, name)) as fh:
                    doc = json.load(fh)
                out.append((name, Frame.from_doc(doc["frame"]), World.from_doc(doc["world"]), doc))
    return out


__all__ = ["Frame", "World", "Rule", "Covered", "Outcome", "Harness", "Stats", "frames", "worlds",
           "save_case", "load_cases", "corpus_dir", "known_issue", "problem_kind", "KNOWN_ISSUES", "PROGRAMS"]
