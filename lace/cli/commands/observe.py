"""``lace observe``: flows from every node's flow collector, merged in time order (Hubble-like).

Each node's agent is the one reader of its ``events`` ring buffer and keeps a bounded history
(``GET /v1/flows`` on its unix socket, ``lace/agent/flows.py``).  This command asks every node at
once (``--node`` picks some), for its history or its followed stream, and merges them by time:
``heapq.merge`` for history, a bounded reorder window (``--reorder-window``, default 0.25 s) when
following.  Filters the agent understands (verdict, reason, protocol, port, addresses, a pod's
addresses, time) are pushed down to it, so ``--follow`` ships only what may match; every filter
is also applied here, after names (pods, namespaces, networks) were resolved through the store to
networks, addresses and segments.  Repeating a filter ORs its values (``--verdict DROPPED
--verdict AUDIT``); different filters AND; ``--not`` negates the filter that follows it.

Each flow names its node, the pods (or segments) at both ends, the verdict, the drop reason and
the policy that decided when the event carries one: the datapath records the policy ID and rule of
the entry that allowed a flow, and for a policy drop the policy that selected the pod (its default
deny, rule ``-``).  Lost events are reported per node: the ring buffer was full (counted by the
datapath) or this reader was too slow (counted by the agent per follower).

Exit status: 0; 1 a node did not answer (the others are shown); 2 bad input (one line and a hint);
5 no lab running.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import heapq
import ipaddress
import json
import os
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

import orjson

from lace.cli import args as cli_args
from lace.cli import render
from lace.cli.errors import UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus

if TYPE_CHECKING:   # http.client (ssl, email: ~20 ms) loads when flows are read, not with every `lace` command
    import http.client

    from lace.cli.node.agent_http import UnixHTTPConnection

Event = dict[str, Any]

OUTPUTS = ("compact", "table", "json", "jsonl")
VERDICTS = {"FORWARDED": "forward", "DROPPED": "drop", "AUDIT": "audit",
            "FORWARD": "forward", "DROP": "drop"}
VERDICT_TEXT = {"forward": "FORWARDED", "drop": "DROPPED", "audit": "AUDIT"}
PROTOCOLS = ("tcp", "udp", "icmp", "icmpv6", "sctp")
#: filter kinds, in the order they are documented
KINDS = ("verdict", "drop_reason", "from_pod", "to_pod", "pod", "from_ip", "to_ip", "ip", "port",
         "protocol", "node", "network", "namespace")
DEFAULT_WINDOW = 0.25
DEFAULT_TIMEOUT = 10.0
MARKER_RULE = 0xFFFF


# ---- arguments ------------------------------------------------------------------------------------


def _json(doc: Any) -> str:
    """One flow as a JSON line's text (orjson: the follow path writes one per event)."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(doc)

class _NotAction(argparse.Action):
    """``--not``: negate the filter that follows."""

    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        if getattr(ns, "_negate", False):
            raise UsageError("--not twice in a row", hint="--not negates the one filter after it")
        ns._negate = True


class _FilterAction(argparse.Action):
    """A filter option: appended to ``filters`` in command-line order, negated after ``--not``."""

    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        neg = bool(getattr(ns, "_negate", False))
        ns._negate = False
        filters = list(getattr(ns, "filters", None) or [])
        filters.append(Spec(self.dest, str(values), neg))
        ns.filters = filters


@dataclass(frozen=True)
class Spec:
    kind: str
    value: str
    negated: bool = False

    def __str__(self) -> str:
        return ("--not " if self.negated else "") + f"--{self.kind.replace('_', '-')} {self.value}"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "observe", help="flows from every node merged in time order, with filters (Hubble-like)",
        description="Flows from every node's flow collector merged in time order: node, pods or segments, "
                    "verdict, drop reason and the policy that decided. Repeating a filter ORs its values, "
                    "different filters AND, --not negates the next filter. Exit 0; 1 a node did not answer "
                    "(the others are shown); 2 bad input.")
    f = p.add_argument_group("filters")
    f.add_argument("--not", dest="_not", nargs=0, action=_NotAction, help="negate the next filter")
    f.add_argument("--verdict", dest="verdict", action=_FilterAction, metavar="FORWARDED|DROPPED|AUDIT")
    f.add_argument("--drop-reason", dest="drop_reason", action=_FilterAction, metavar="REASON",
                   help="e.g. policy-ingress, no-route (lace.datapath.reasons)")
    f.add_argument("--from-pod", dest="from_pod", action=_FilterAction, metavar="NS/POD")
    f.add_argument("--to-pod", dest="to_pod", action=_FilterAction, metavar="NS/POD")
    f.add_argument("--pod", dest="pod", action=_FilterAction, metavar="NS/POD", help="either end")
    f.add_argument("--from-ip", dest="from_ip", action=_FilterAction, metavar="IP|CIDR")
    f.add_argument("--to-ip", dest="to_ip", action=_FilterAction, metavar="IP|CIDR",
                   help="the destination (or the service frontend it was translated from)")
    f.add_argument("--ip", dest="ip", action=_FilterAction, metavar="IP|CIDR", help="either end")
    f.add_argument("--port", dest="port", action=_FilterAction, metavar="N", help="either end")
    f.add_argument("--protocol", "--proto", dest="protocol", action=_FilterAction, metavar="PROTO",
                   help="tcp, udp, icmp, sctp")
    f.add_argument("--node", dest="node", action=_FilterAction, metavar="NODE", help="ask only this node")
    f.add_argument("--network", dest="network", action=_FilterAction, metavar="NETWORK", help="either end")
    f.add_argument("--namespace", dest="namespace", action=_FilterAction, metavar="NS", help="either end")
    w = p.add_argument_group("what and how")
    w.add_argument("--last", type=int, metavar="N", default=0, help="the last N matching flows (default: all kept)")
    w.add_argument("--since", metavar="TIME", help="5m, 30s, 2h, or 2026-12-03T12:00:00 (local time unless it says)")
    w.add_argument("--until", metavar="TIME", help="as --since")
    w.add_argument("--follow", "-f", action="store_true", help="keep streaming new flows (Ctrl-C stops)")
    w.add_argument("-o", "--output", choices=OUTPUTS, default="compact",
                   help="compact (default), table, json (json lines when following), jsonl")
    w.add_argument("-n", "--numeric", action="store_true", help="raw IDs and addresses, no names (no store)")
    w.add_argument("--summary", action="store_true",
                   help="top talkers, top drop reasons and per-pair verdict counts of the selected flows")
    w.add_argument("--top", type=int, metavar="N", default=10, help="rows per --summary table (default 10)")
    w.add_argument("--export", metavar="FILE", help="write the flows to FILE as JSON lines, rotated by size")
    w.add_argument("--export-max-size", type=float, metavar="MB", default=10.0,
                   help="rotate FILE when it would grow past this (default 10 MB)")
    w.add_argument("--export-keep", type=int, metavar="N", default=5,
                   help="rotated files kept: FILE.1 (newest) .. FILE.N (default 5)")
    w.add_argument("--reorder-window", type=float, metavar="SECONDS", default=DEFAULT_WINDOW,
                   help=f"when following, hold flows this long to merge nodes in time order (default {DEFAULT_WINDOW:g})")
    w.add_argument("--timeout", type=float, metavar="SECONDS", default=DEFAULT_TIMEOUT,
                   help=f"how long to wait for a node's history (default {DEFAULT_TIMEOUT:g})")
    # an agent's socket by path instead of the lab's nodes (benchmarks, debugging one agent)
    w.add_argument("--agent", dest="agents", action="append", metavar="NODE=SOCKET", help=argparse.SUPPRESS)
    cli_args.add_lab_option(p)
    p.set_defaults(handler=run, filters=[], _negate=False)


# ---- parsing values -------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_time(text: str, now: float | None = None, *, flag: str = "--since") -> float:
    """Seconds since the epoch: ``5m`` (ago), ``30s``, ``2h``, ``1d``, ``1.5h``, an ISO 8601 time
    (``2026-12-03T12:00:00``, local time without an offset; ``Z`` or ``+01:00`` say otherwise),
    or seconds since the epoch (``@1764763200``)."""
    now = time.time() if now is None else now
    t = text.strip()
    m = _DURATION.match(t)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    if t.startswith("@"):
        try:
            return float(t[1:])
        except ValueError:
            pass
    else:
        try:
            d = datetime.datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith("Z") else t)
            return d.timestamp()   # naive: local time
        except ValueError:
            pass
    raise UsageError(f'{flag} "{text}" is not a time',
                     hint="say 5m, 30s, 2h, 1d (ago), 2026-12-03T12:00:00 (local), 2026-12-03T12:00:00Z or @EPOCH")


def parse_verdict(text: str) -> str:
    v = VERDICTS.get(text.strip().upper())
    if v is None:
        raise UsageError(f'--verdict "{text}" is not a verdict', hint="one of FORWARDED, DROPPED, AUDIT")
    return v


def drop_reasons() -> list[str]:
    from lace.datapath.reasons import DropReason
    return [r.label for r in DropReason if r.label != "none"]


def parse_reason(text: str) -> str:
    r = text.strip().lower().replace("_", "-")
    known = drop_reasons()
    if r not in known:
        close = [k for k in known if r and (r in k or k in r)]
        raise UsageError(f'--drop-reason "{text}" is not a drop reason',
                         hint=("did you mean " + ", ".join(close) + "? " if close else "") + "reasons: " + ", ".join(known))
    return r


def parse_net(text: str, flag: str) -> Any:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise UsageError(f'{flag} "{text}" is not an address or CIDR',
                         hint="e.g. 10.244.0.5, 10.244.0.0/16, fd00:10:244::/56") from None


def parse_port(text: str) -> int:
    try:
        p = int(text)
    except ValueError:
        p = -1
    if not 0 < p < 65536:
        raise UsageError(f'--port "{text}" is not a port', hint="a number from 1 to 65535")
    return p


def parse_protocol(text: str) -> str:
    p = text.strip().lower()
    if p not in PROTOCOLS:
        raise UsageError(f'--protocol "{text}" is not a protocol', hint="one of tcp, udp, icmp, sctp")
    return p


def split_pod(text: str, flag: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name or "/" in name:
        raise UsageError(f'{flag} "{text}" is not NS/POD', hint=f"e.g. {flag} alpha/web-1")
    return ns, name


# ---- what the store says about the names -----------------------------------------------------------

@dataclass
class Names:
    """What name-based filters and the output need from the store, read once."""

    networks: dict[str, int] = field(default_factory=dict)          # name -> ID
    network_names: dict[int, str] = field(default_factory=dict)
    pods: dict[str, tuple[str, set[str]]] = field(default_factory=dict)   # ns/name -> (network, IPs)
    pods_by_ip: dict[tuple[int, str], str] = field(default_factory=dict)  # (network ID, IP) -> ns/name
    namespaces: set[str] = field(default_factory=set)
    segments: dict[int, dict[str, Any]] = field(default_factory=dict)     # ID -> spec
    policies: dict[int, str] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    #: names already given, by (kind, ID): the output names every event, the names never change
    _given: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_objects(cls, objects: dict[str, list[dict[str, Any]]]) -> Names:
        from lace.cli.node.resolve import Resolver
        from lace.store import kinds as K
        n = cls()
        for net in objects.get("networks", []):
            nid = (net.get("status") or {}).get("id")
            if nid is not None:
                n.networks[net["metadata"]["name"]] = int(nid)
                n.network_names[int(nid)] = net["metadata"]["name"]
        n.namespaces = {o["metadata"]["name"] for o in objects.get("namespaces", [])}
        for seg in objects.get("segments", []):
            sid = (seg.get("status") or {}).get("id")
            if sid is not None:
                n.segments[int(sid)] = seg.get("spec") or {}
        for pod in objects.get("pods", []):
            meta = pod.get("metadata") or {}
            key = f'{meta.get("namespace", "default")}/{meta.get("name")}'
            st = pod.get("status") or {}
            ips = {str(ipaddress.ip_address(e["ip"])) for e in st.get("podIPs") or [] if e.get("ip")}
            n.pods[key] = (K.pod_network(pod), ips)
        for lease in objects.get("ipleases", []):
            spec = lease.get("spec") or {}
            if spec.get("pod") in n.pods and spec.get("ip"):
                n.pods[spec["pod"]][1].add(str(ipaddress.ip_address(spec["ip"])))
        for key, (net, ips) in n.pods.items():
            nid = n.networks.get(net)
            for ip in ips:
                n.pods_by_ip[(nid or 0, ip)] = key
        for lease in objects.get("ipleases", []):   # probe addresses and the like: pseudo-pods
            spec = lease.get("spec") or {}
            if spec.get("pod") and spec.get("ip"):
                nid = n.networks.get(spec.get("network", "default"), 0)
                n.pods_by_ip.setdefault((nid, str(ipaddress.ip_address(spec["ip"]))), spec["pod"])
        n.policies = Resolver.from_objects({"networkpolicies": objects.get("networkpolicies", [])}).policies
        n.nodes = [o["metadata"]["name"] for o in objects.get("nodes", [])]
        return n

    @classmethod
    def from_store(cls, store: Any) -> Names:
        kinds = ("networks", "namespaces", "segments", "pods", "ipleases", "networkpolicies", "nodes")
        return cls.from_objects({k: store.list(k).items for k in kinds})

    def pod(self, text: str, flag: str) -> tuple[int, set[str]]:
        ns, name = split_pod(text, flag)
        key = f"{ns}/{name}"
        if key not in self.pods:
            if ns not in self.namespaces:
                raise UsageError(f'{flag} {text}: no namespace "{ns}"',
                                 hint="namespaces: " + ", ".join(sorted(self.namespaces)))
            in_ns = sorted(k.split("/", 1)[1] for k in self.pods if k.startswith(ns + "/"))
            raise UsageError(f'{flag} {text}: no pod "{name}" in namespace {ns}',
                             hint=("pods in " + ns + ": " + ", ".join(in_ns)) if in_ns else f"namespace {ns} has no pods")
        net, ips = self.pods[key]
        if not ips:
            raise UsageError(f"{flag} {text}: the pod has no addresses yet", hint=f"lace get pods -n {ns} -o wide")
        return self.networks.get(net, 0), ips

    def network(self, text: str) -> int:
        if text not in self.networks:
            raise UsageError(f'--network "{text}": no such network', hint="networks: " + ", ".join(sorted(self.networks)))
        return self.networks[text]

    def namespace(self, text: str) -> tuple[set[int], set[tuple[int, str]]]:
        if text not in self.namespaces:
            raise UsageError(f'--namespace "{text}": no such namespace',
                             hint="namespaces: " + ", ".join(sorted(self.namespaces)))
        segs = {sid for sid, spec in self.segments.items() if spec.get("namespace") == text}
        addrs = {(nid, ip) for (nid, ip), pod in self.pods_by_ip.items() if pod.split("/", 1)[0] == text}
        return segs, addrs

    # -- names for output --
    def network_name(self, nid: int) -> str:
        name = self._given.get(("network", nid))
        if name is None:
            name = self._given[("network", nid)] = self._network_name(nid)
        return name

    def segment_name(self, seg: int) -> str:
        name = self._given.get(("segment", seg))
        if name is None:
            name = self._given[("segment", seg)] = self._segment_name(seg)
        return name

    def _network_name(self, nid: int) -> str:
        from lace.datapath.common import RESERVED_NETWORKS
        if not nid:
            return "-"
        if nid in RESERVED_NETWORKS and nid != 1:
            return RESERVED_NETWORKS[nid]
        return self.network_names.get(nid) or RESERVED_NETWORKS.get(nid) or f"network {nid}"

    def _segment_name(self, seg: int) -> str:
        from lace.datapath.common import RESERVED_SEGMENTS
        if not seg:
            return "-"
        if seg in RESERVED_SEGMENTS:
            return RESERVED_SEGMENTS[seg]
        spec = self.segments.get(seg)
        if spec is None:
            return f"segment {seg}"
        labels = ",".join(f"{k}={v}" for k, v in sorted((spec.get("labels") or {}).items())) or "<no labels>"
        return f'{spec.get("namespace", "?")} {labels}'

    def policy_name(self, pid: int) -> str:
        return self.policies.get(pid) or f"policy {pid}"


# ---- the selection: predicates and what the agents are asked --------------------------------------

@dataclass
class Selection:
    predicate: Callable[[Event], bool] | None
    query: dict[str, str]            # pushed down to every agent
    nodes: list[str]                  # which nodes to ask
    since: float | None = None
    until: float | None = None
    exact_pushdown: bool = True       # the agents' filtering is all there is (--last can be pushed)
    #: ``predicate`` without the time window: what the flow must be (a followed stream asks it
    #: once per flow and checks ``since``/``until`` per event)
    flow_predicate: Callable[[Event], bool] | None = None

    def in_window(self, t: float) -> bool:
        return (self.since is None or t >= self.since) and (self.until is None or t <= self.until)


def _any(preds: list[Callable[[Event], bool]]) -> Callable[[Event], bool]:
    return preds[0] if len(preds) == 1 else (lambda e: any(p(e) for p in preds))


def _all(preds: list[Callable[[Event], bool]]) -> Callable[[Event], bool] | None:
    preds = list(preds)
    return None if not preds else preds[0] if len(preds) == 1 else (lambda e: all(p(e) for p in preds))


def _addr_pred(net: Any, keys: tuple[str, ...]) -> Callable[[Event], bool]:
    exact = str(net.network_address) if net.prefixlen == net.max_prefixlen else None

    def pred(e: Event) -> bool:
        for k in keys:
            a = e.get(k)
            if not a:
                continue
            if exact is not None:
                if a == exact:
                    return True
                continue
            try:
                addr = ipaddress.ip_address(a)
            except ValueError:
                continue
            if addr.version == net.version and addr in net:
                return True
        return False
    return pred


def _pod_pred(nid: int, ips: set[str], side: str) -> Callable[[Event], bool]:
    """A pod's addresses in its network (0: the event had not decided the network yet)."""
    nets = (nid, 0)

    def src(e: Event) -> bool:
        return e.get("saddr") in ips and e.get("src_network") in nets

    def dst(e: Event) -> bool:
        return e.get("daddr") in ips and e.get("dst_network") in nets
    if side == "src":
        return src
    if side == "dst":
        return dst
    return lambda e: src(e) or dst(e)


def build_selection(specs: list[Spec], *, names: Names | None, known_nodes: list[str],
                    since: float | None = None, until: float | None = None) -> Selection:
    """Turn the filters into one predicate and the agents' query (see the module docstring)."""
    groups: dict[tuple[str, bool], list[Spec]] = collections.defaultdict(list)
    for s in specs:
        groups[(s.kind, s.negated)].append(s)
    preds: list[Callable[[Event], bool]] = []
    query: dict[str, str] = {}
    exact = True
    nodes = list(known_nodes)

    def need_names(s: Spec) -> Names:
        if names is None:
            raise UsageError(f"{s} needs the store to resolve names, which -n never opens",
                             hint="use --from-ip/--to-ip/--ip with -n")
        return names

    for (kind, neg), group in groups.items():
        alts: list[Callable[[Event], bool]] = []
        push: list[str] = []
        push_key: str | None = None
        for s in group:
            v = s.value
            if kind == "verdict":
                vv = parse_verdict(v)
                alts.append(lambda e, vv=vv: e.get("verdict") == vv)
                push_key, _ = "verdict", push.append(vv)
            elif kind == "drop_reason":
                r = parse_reason(v)
                alts.append(lambda e, r=r: e.get("reason") == r)
                push_key, _ = "reason", push.append(r)
            elif kind in ("from_ip", "to_ip", "ip"):
                net = parse_net(v, "--" + kind.replace("_", "-"))
                keys = {"from_ip": ("saddr",), "to_ip": ("daddr", "nat_addr"),
                        "ip": ("saddr", "daddr", "nat_addr")}[kind]
                alts.append(_addr_pred(net, keys))
                push_key, _ = {"from_ip": "src_ip", "to_ip": "dst_ip", "ip": "ip"}[kind], push.append(str(net))
            elif kind == "port":
                p = parse_port(v)
                alts.append(lambda e, p=p: p in (e.get("sport"), e.get("dport"), e.get("nat_port")))
                push_key, _ = "port", push.append(str(p))
            elif kind == "protocol":
                pr = parse_protocol(v)
                want = {"icmp", "icmpv6"} if pr == "icmp" else {pr}
                alts.append(lambda e, w=frozenset(want): str(e.get("proto")) in w)
                push_key, _ = "proto", push.append(pr)
            elif kind in ("from_pod", "to_pod", "pod"):
                nid, ips = need_names(s).pod(v, "--" + kind.replace("_", "-"))
                side = {"from_pod": "src", "to_pod": "dst", "pod": "any"}[kind]
                alts.append(_pod_pred(nid, ips, side))
                push_key = {"from_pod": "src_ip", "to_pod": "dst_ip", "pod": "pod_ip"}[kind]
                push.extend(sorted(ips))
                exact = False   # the network is checked here, not in the agent
            elif kind == "network":
                nid = need_names(s).network(v)
                alts.append(lambda e, n=nid: e.get("src_network") == n or e.get("dst_network") == n)
                exact = False
            elif kind == "namespace":
                segs, addrs = need_names(s).namespace(v)
                alts.append(lambda e, segs=frozenset(segs), addrs=frozenset(addrs):
                            e.get("src_segment") in segs or e.get("dst_segment") in segs
                            or (e.get("src_network"), e.get("saddr")) in addrs
                            or (e.get("dst_network"), e.get("daddr")) in addrs)
                exact = False
            elif kind == "node":
                if v not in known_nodes:
                    raise UsageError(f'--node "{v}": no such node', hint="nodes: " + ", ".join(known_nodes))
                alts.append(lambda e, n=v: e.get("node") == n)
            else:  # pragma: no cover - the parser knows only KINDS
                raise UsageError(f"unknown filter {kind}")
        pred = _any(alts)
        if kind == "node":
            wanted = {s.value for s in group}
            nodes = [n for n in nodes if (n in wanted) != neg]
            continue
        if neg:
            preds.append(lambda e, p=pred: not p(e))
            exact = False
        else:
            preds.append(pred)
            if push_key is not None:
                if push_key in query:   # from_pod and from_ip both push src_ip: keep it here only
                    exact = False
                    continue
                query[push_key] = ",".join(dict.fromkeys(push))
    flow_predicate = _all(preds)
    if since is not None:
        query["since"] = repr(since)
        preds.append(lambda e: isinstance(e.get("time"), (int, float)) and e["time"] >= since)
    if until is not None:
        query["until"] = repr(until)
        preds.append(lambda e: isinstance(e.get("time"), (int, float)) and e["time"] <= until)
    if not nodes:
        raise UsageError("no node left to ask after --node filters", hint="nodes: " + ", ".join(known_nodes))
    return Selection(_all(preds), query, nodes, since, until, exact, flow_predicate)


# ---- talking to the agents -----------------------------------------------------------------------

class NodeError(Exception):
    def __init__(self, node: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.node, self.message, self.hint = node, message, hint


def url(query: dict[str, str]) -> str:
    return "/v1/flows" + ("?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items()) if query else "")


def _open(node: str, sock: str, query: dict[str, str], timeout: float | None
          ) -> tuple[UnixHTTPConnection, http.client.HTTPResponse]:
    import http.client

    from lace.cli.node.agent_http import UnixHTTPConnection
    hint = f"is its agent running? lace lab restart-agent {node}"
    if not os.path.exists(sock):
        raise NodeError(node, f"no agent socket {sock}", hint)
    conn = UnixHTTPConnection(sock, timeout)
    try:
        conn.request("GET", url(query))
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise NodeError(node, f"the agent is not answering on {sock}: {exc}", hint) from None
    if resp.status != 200:
        body = resp.read()
        conn.close()
        try:
            msg = json.loads(body).get("error", body.decode(errors="replace"))
        except ValueError:
            msg = body.decode(errors="replace")
        raise NodeError(node, f"the agent refused the request ({resp.status}): {msg}",
                        "restart it with this version" if resp.status in (400, 404) else None)
    return conn, resp


def fetch_history(node: str, sock: str, query: dict[str, str], timeout: float) -> dict[str, Any]:
    conn, resp = _open(node, sock, query, timeout)
    try:
        return json.loads(resp.read() or b"{}")
    except (OSError, ValueError) as exc:
        raise NodeError(node, f"bad answer from the agent: {exc}") from None
    finally:
        conn.close()


def gather_history(sockets: dict[str, str], query: dict[str, str], timeout: float
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, NodeError]]:
    """Every node's history at once: answers by node, and the nodes that did not answer."""
    docs: dict[str, dict[str, Any]] = {}
    errors: dict[str, NodeError] = {}

    def one(node: str) -> None:
        try:
            docs[node] = fetch_history(node, sockets[node], query, timeout)
        except NodeError as exc:
            errors[node] = exc
    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in sockets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1)
    for n in sockets:
        if n not in docs and n not in errors:
            errors[n] = NodeError(n, f"no answer within {timeout:g}s", f"is its agent stuck? lace lab restart-agent {n}")
    return docs, errors


def merge_history(per_node: Iterable[list[Event]]) -> Iterator[Event]:
    """Nodes' histories (each in its own time order) merged by time."""
    def keyed(events: list[Event]) -> list[Event]:
        return sorted(events, key=_t)   # a node's CPUs may submit slightly out of order
    return heapq.merge(*(keyed(evs) for evs in per_node), key=_t)


def _t(e: Event) -> float:
    t = e.get("time")
    return t if isinstance(t, (int, float)) else 0.0


class Reorder:
    """Bounded reorder window for followed streams: a flow (an event or its JSON text) is released
    once it is ``window`` seconds old (by its own time), oldest first; later arrivals older than
    what was released go out at once (they cannot be placed any more)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.heap: list[tuple[float, int, Any]] = []
        self.seq = 0

    def push(self, t: float, flow: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, flow))

    def pop_ready(self, now: float) -> list[Any]:
        out = []
        limit = now - self.window
        h = self.heap
        while h and h[0][0] <= limit:
            out.append(heapq.heappop(h)[2])
        return out

    def drain(self) -> list[Any]:
        out = [x[2] for x in sorted(self.heap)]
        self.heap = []
        return out


# ---- output ------------------------------------------------------------------------------------------

class Describer:
    """An event with the names an operator reads: pods or segments, networks, the deciding policy."""

    def __init__(self, names: Names | None) -> None:
        self.names = names
        self._pod: dict[tuple[int, str], str | None] = {}

    def pod(self, nid: int, ip: str | None) -> str | None:
        if self.names is None or not ip:
            return None
        k = (nid, ip)
        if k not in self._pod:
            p = self.names.pods_by_ip.get(k)
            if p is None and not nid:    # dropped before routing: the address alone, if unique
                cands = {v for (n, a), v in self.names.pods_by_ip.items() if a == ip}
                p = cands.pop() if len(cands) == 1 else None
            self._pod[k] = p
        return self._pod[k]

    def policy(self, e: Event) -> str | None:
        pid = e.get("policy_id") or 0
        if not pid:
            return None
        name = self.names.policy_name(pid) if self.names is not None else str(pid)
        rule = e.get("rule")
        if rule == MARKER_RULE:
            return f"{name} (default deny)" if e.get("verdict") == "drop" else f"{name} (would deny)"
        return f"{name} rule {rule}"

    def __call__(self, e: Event) -> Event:
        d = dict(e)
        n = self.names
        d["src_pod"] = self.pod(e.get("src_network") or 0, e.get("saddr"))
        d["dst_pod"] = self.pod(e.get("dst_network") or 0, e.get("daddr"))
        if n is not None:
            d["src_network_name"] = n.network_name(e.get("src_network") or 0)
            d["dst_network_name"] = n.network_name(e.get("dst_network") or 0)
            d["src_segment_name"] = n.segment_name(e.get("src_segment") or 0)
            d["dst_segment_name"] = n.segment_name(e.get("dst_segment") or 0)
        d["verdict_text"] = VERDICT_TEXT.get(str(e.get("verdict")), str(e.get("verdict")).upper())
        d["policy"] = self.policy(e)
        if e.get("verdict") in ("drop", "audit") and str(e.get("reason", "")).startswith("policy") and not d["policy"]:
            d["policy"] = "no policy info in the event"
        return d


#: the fields of a flow's events that change with every packet (and ``time``, made from ``ts_ns``)
#: in the order the decoder gives them: the holes of a flow's JSON template
_PER_PACKET = ("ts_ns", "pkt_len", "sport", "dport", "time")
#: answers and templates kept per stream, forgotten past this many flows
_FLOW_CACHE = 65536


class FrameRenderer:
    """One node's followed records (``batch=raw`` frames of raw ring buffer records) into what the
    sink takes, with the work done per flow rather than per event.

    Every packet of a flow gives the same described event but for :data:`_PER_PACKET`.  So a flow
    (its record with those fields zeroed) is decoded once (``decode_trace_event``), described once
    (:class:`Describer`) and its JSON text made once, in pieces around those fields; each event is then the template filled in (JSON lines, exports) or the described event
    copied with its own values (the other outputs).  The filters are asked once per flow too (the
    record from ``point`` on, as the agent keys them: ``lace.agent.flows.FlowFilter``), without
    the per-packet fields; the time window per event."""

    def __init__(self, node: str, sel: Selection, describe: Describer, as_text: bool) -> None:
        from lace.datapath.trace import PER_PACKET_BYTES, TRACE_EVENT
        self.node, self.sel, self.describe, self.as_text = node, sel, describe, as_text
        self._size = TRACE_EVENT.size
        self._flow_from = PER_PACKET_BYTES
        fields = [TRACE_EVENT.field(k) for k in _PER_PACKET if k != "time"]
        self._zero = [(f.offset, f.offset + f.size) for f in fields]
        self._answers: dict[bytes, bool] = {}
        self._shapes: dict[bytes, tuple[str, Event]] = {}

    def _matches(self, record: bytes) -> bool:
        key = record[self._flow_from:]
        ok = self._answers.get(key)
        if ok is None:
            from lace.datapath.trace import decode_trace_event
            pred = self.sel.flow_predicate
            if pred is None:
                return True
            ev = decode_trace_event(record)
            for k in ("ts_ns", "ifindex", "pkt_len"):
                del ev[k]
            ev["node"] = self.node
            if len(self._answers) >= _FLOW_CACHE:
                self._answers.clear()
            ok = self._answers[key] = bool(pred(ev))
        return ok

    def _shape(self, key: bytes, record: bytes) -> tuple[tuple[str, ...], Event]:
        """A flow's JSON text around the per-packet values (six pieces: before ts_ns, between it
        and pkt_len, ... after time) and its described event (per-packet fields of this record)."""
        from lace.datapath.trace import decode_trace_event
        ev = decode_trace_event(record)
        ev["time"] = 0.0
        ev["node"] = self.node
        d = self.describe(ev)
        if tuple(k for k in d if k in _PER_PACKET) != _PER_PACKET:
            # the values are filled in _PER_PACKET's order: a description that has them otherwise
            # (or lacks one) gets them last, in that order
            d = {k: v for k, v in d.items() if k not in _PER_PACKET} | {k: d.get(k) for k in _PER_PACKET}
        # a NUL marks each value's place: JSON text has none of its own (a string's is escaped)
        members = [f'"{k}":\0' if k in _PER_PACKET else _json({k: v})[1:-1] for k, v in d.items()]
        pieces = ("{" + ",".join(members) + "}").split("\0")
        if len(self._shapes) >= _FLOW_CACHE:
            self._shapes.clear()
        shape = self._shapes[key] = (tuple(pieces), d)
        return shape

    def render(self, count: int, offset_ns: int, data: bytes) -> tuple[list[float], list[Any]]:
        """The selected flows of one frame: their times, and their JSON texts (``as_text``) or
        described events."""
        import numpy as np

        from lace.datapath.trace import TRACE_EVENT, record_ts, wall_time
        if not count:
            return [], []
        size, sel = self._size, self.sel
        ts = record_ts(data)
        times = [wall_time(t, offset_ns) for t in ts]
        rows: Iterable[int] = range(count)
        if sel.since is not None or sel.until is not None:
            rows = [i for i in rows if sel.in_window(times[i])]
        if sel.flow_predicate is not None:
            rows = [i for i in rows if self._matches(data[i * size:(i + 1) * size])]
        rows = list(rows)
        cols = TRACE_EVENT.decode_many(data, count)
        pkt, sport, dport = cols["pkt_len"].tolist(), cols["sport"].tolist(), cols["dport"].tolist()
        masked = np.frombuffer(data, np.uint8, count * size).reshape(count, size).copy()
        for a, b in self._zero:
            masked[:, a:b] = 0
        keys = masked.tobytes()
        shapes, learn = self._shapes, self._shape
        out: list[Any] = []
        if self.as_text:
            # the times as orjson writes them (its float text differs from repr's in places)
            time_text = orjson.dumps([times[i] for i in rows]).decode()[1:-1].split(",")
            for j, i in enumerate(rows):
                a = i * size
                key = keys[a:a + size]
                p0, p1, p2, p3, p4, p5 = (shapes.get(key) or learn(key, data[a:a + size]))[0]
                out.append(f"{p0}{ts[i]}{p1}{pkt[i]}{p2}{sport[i]}{p3}{dport[i]}{p4}{time_text[j]}{p5}")
        else:
            for i in rows:
                a = i * size
                key = keys[a:a + size]
                shape = shapes.get(key) or learn(key, data[a:a + size])
                d = dict(shape[1])
                d["ts_ns"], d["pkt_len"], d["sport"], d["dport"], d["time"] = ts[i], pkt[i], sport[i], dport[i], times[i]
                out.append(d)
        return [times[i] for i in rows], out


def _ep(addr: Any, port: Any, proto: str) -> str:
    a = str(addr or "?")
    a = f"[{a}]" if ":" in a else a
    return a if proto in ("icmp", "icmpv6") or not port else f"{a}:{port}"


def endpoint_text(d: Event, side: str) -> str:
    s = "s" if side == "src" else "d"
    proto = str(d.get("proto"))
    addr = _ep(d.get(f"{s}addr"), d.get(f"{s}port"), proto)
    pod = d.get(f"{side}_pod")
    if pod:
        return f"{pod} ({addr})"
    seg = d.get(f"{side}_segment_name")
    if seg is None:
        seg = str(d.get(f"{side}_segment") or "-")
    return f"{addr} [{seg}]" if seg and seg != "-" else addr


def time_text(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "?"
    return datetime.datetime.fromtimestamp(t).strftime("%b %d %H:%M:%S.%f")[:-3]


def reason_text(d: Event) -> str:
    r = d.get("reason")
    return str(r) if r and r != "none" else "-"


def compact_line(d: Event) -> str:
    proto = str(d.get("proto"))
    flags = ",".join(d.get("tcp_flags") or [])
    what = f"{proto} {flags}" if flags else proto
    v = d["verdict_text"]
    r = reason_text(d)
    if r != "-":
        v += f" ({r})"
    nat = ""
    if d.get("nat_kind") not in (None, "none") and d.get("nat_addr"):
        nat = f"  via {_ep(d.get('nat_addr'), d.get('nat_port'), proto)}"
    pol = f"  policy {d['policy']}" if d.get("policy") else ""
    return (f"{time_text(d.get('time'))} [{d.get('node')}] {endpoint_text(d, 'src')} -> "
            f"{endpoint_text(d, 'dst')}{nat} {what} {v}{pol}")


TABLE_HEADERS = ["TIME", "NODE", "SOURCE", "DESTINATION", "PROTO", "VERDICT", "REASON", "POLICY"]


def table_row(d: Event) -> list[str]:
    return [time_text(d.get("time")), str(d.get("node")), endpoint_text(d, "src"), endpoint_text(d, "dst"),
            str(d.get("proto")), d["verdict_text"], reason_text(d), d.get("policy") or "-"]


class RotatingWriter:
    """JSON lines into FILE; when a line would take FILE past ``max_bytes`` it becomes FILE.1
    (FILE.1 becomes FILE.2, ... up to FILE.``keep``; older ones are removed)."""

    def __init__(self, path: str, max_bytes: int, keep: int) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.rotations = 0
        self.lines = 0
        try:
            self.f: TextIO = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--export {path}: cannot open it: {exc.strerror}",
                             hint="name a file in a directory you can write") from None
        self.size = self.f.tell()

    def write(self, text: str) -> None:
        data = text + "\n"
        n = len(data.encode())
        if self.size and self.size + n > self.max_bytes:
            self.rotate()
        self.f.write(data)
        self.size += n
        self.lines += 1

    def rotate(self) -> None:
        self.f.close()
        if self.keep > 0:
            for i in range(self.keep - 1, 0, -1):
                src = f"{self.path}.{i}"
                if os.path.exists(src):
                    os.replace(src, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        self.f = open(self.path, "w", encoding="utf-8")
        self.size = 0
        self.rotations += 1

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def pair_label(d: Event, side: str) -> str:
    s = "s" if side == "src" else "d"
    return d.get(f"{side}_pod") or str(d.get(f"{s}addr") or "?")


class Summary:
    """Counts over the selected flows: top talkers, drop reasons, per-pair verdicts."""

    def __init__(self) -> None:
        self.flows = 0
        self.talkers: collections.Counter[tuple[str, str]] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()
        self.pairs: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.nodes: collections.Counter[str] = collections.Counter()

    def add(self, d: Event) -> None:
        self.flows += 1
        pair = (pair_label(d, "src"), pair_label(d, "dst"))
        self.talkers[pair] += 1
        v = str(d.get("verdict"))
        if v in ("drop", "audit") and d.get("reason") not in (None, "none"):
            self.reasons[str(d["reason"])] += 1
        self.pairs[pair][VERDICT_TEXT.get(v, v.upper())] += 1
        self.nodes[str(d.get("node"))] += 1

    def document(self, top: int) -> dict[str, Any]:
        pairs = sorted(self.pairs.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:top]
        return {
            "flows": self.flows,
            "nodes": dict(sorted(self.nodes.items())),
            "top_talkers": [{"source": s, "destination": d, "flows": n}
                            for (s, d), n in sorted(self.talkers.items(), key=lambda kv: (-kv[1], kv[0]))[:top]],
            "drop_reasons": [{"reason": r, "flows": n}
                             for r, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:top]],
            "pairs": [{"source": s, "destination": d, "forwarded": c.get("FORWARDED", 0),
                       "dropped": c.get("DROPPED", 0), "audit": c.get("AUDIT", 0), "flows": sum(c.values())}
                      for (s, d), c in pairs],
        }

    def render(self, inv: Invocation, top: int) -> None:
        doc = self.document(top)
        out = inv.stdout
        per_node = ", ".join(f"{n} {c}" for n, c in doc["nodes"].items())
        out.write(f"{render.plural(doc['flows'], 'flows')}" + (f" ({per_node})" if per_node else "") + "\n\n")
        out.write("TOP TALKERS\n")
        render.render_table(inv.console(), ["SOURCE", "DESTINATION", "FLOWS"],
                            [[t["source"], t["destination"], str(t["flows"])] for t in doc["top_talkers"]])
        out.write("\nTOP DROP REASONS\n")
        if doc["drop_reasons"]:
            render.render_table(inv.console(), ["REASON", "FLOWS"],
                                [[r["reason"], str(r["flows"])] for r in doc["drop_reasons"]])
        else:
            out.write("no drops\n")
        out.write("\nPAIRS\n")
        render.render_table(inv.console(), ["SOURCE", "DESTINATION", "FORWARDED", "DROPPED", "AUDIT"],
                            [[p["source"], p["destination"], str(p["forwarded"]), str(p["dropped"]), str(p["audit"])]
                             for p in doc["pairs"]])


class Sink:
    """Where described flows go: stdout in one format, an export file, or a summary."""

    def __init__(self, args: argparse.Namespace, inv: Invocation) -> None:
        self.inv = inv
        self.out = inv.stdout
        self.fmt = args.output
        self.follow = args.follow
        self.summary = Summary() if args.summary else None
        self.export: RotatingWriter | None = None
        if args.export:
            if args.export_max_size <= 0:
                raise UsageError("--export-max-size must be more than 0 MB", hint="e.g. --export-max-size 10")
            if args.export_keep < 0:
                raise UsageError("--export-keep must be 0 or more", hint="e.g. --export-keep 5")
            self.export = RotatingWriter(args.export, max(1, int(args.export_max_size * 1024 * 1024)),
                                         args.export_keep)
        self.count = 0
        self.rows: list[list[str]] = []
        self.json_flows: list[Event] = []
        self._table_header = False
        self.jsonl = self.fmt == "jsonl" or (self.fmt == "json" and self.follow)

    def add(self, d: Event) -> None:
        self.count += 1
        if self.summary is not None:
            self.summary.add(d)
            if self.export is None:
                return
        if self.export is not None:
            self.export.write(_json(d))
            return
        if self.jsonl:
            self.out.write(_json(d) + "\n")
        elif self.fmt == "json":
            self.json_flows.append(d)
        elif self.fmt == "table":
            if self.follow:
                if not self._table_header:
                    self.out.write(_fixed(TABLE_HEADERS) + "\n")
                    self._table_header = True
                self.out.write(_fixed(table_row(d)) + "\n")
            else:
                self.rows.append(table_row(d))
        else:
            self.out.write(compact_line(d) + "\n")

    @property
    def takes_text(self) -> bool:
        """Whether every flow goes out as its JSON text (JSON lines, an export): then a followed
        stream renders that text straight from the records (:class:`FrameRenderer`)."""
        return self.summary is None and (self.export is not None or self.jsonl)

    def add_texts(self, texts: list[str]) -> None:
        """Flows as the JSON text :func:`_json` gives for their described events (``takes_text``)."""
        if not texts:
            return
        self.count += len(texts)
        if self.export is not None:
            for t in texts:
                self.export.write(t)
        else:
            self.out.write("\n".join(texts) + "\n")

    def lost(self, node: str, ring: int, reader: int) -> None:
        msg = {"lost": {"node": node, "ring": ring, "reader": reader, "total": ring + reader}}
        if self.export is not None:
            self.export.write(json.dumps(msg))
        if self.jsonl and self.export is None:
            self.out.write(json.dumps(msg) + "\n")
        parts = ([f"ring buffer full: {ring}"] if ring else []) + ([f"this reader too slow: {reader}"] if reader else [])
        self.inv.stderr.write(f"warning: {node}: {render.plural(ring + reader, 'flows')} lost ({', '.join(parts)})\n")

    def flush(self) -> None:
        if self.export is not None:
            self.export.flush()
        try:
            self.out.flush()
        except (OSError, ValueError):
            pass


def _fixed(cells: list[str]) -> str:
    widths = (18, 10, 44, 44, 6, 10, 16, 0)
    return "  ".join(c.ljust(w) if w else c for c, w in zip(cells, widths)).rstrip()


# ---- the command -------------------------------------------------------------------------------------

def validate_values(specs: list[Spec]) -> None:
    """Filters whose values need neither the lab nor the store, checked before anything is asked."""
    for s in specs:
        flag = "--" + s.kind.replace("_", "-")
        {"verdict": parse_verdict, "drop_reason": parse_reason, "port": parse_port, "protocol": parse_protocol,
         "from_ip": lambda v: parse_net(v, flag), "to_ip": lambda v: parse_net(v, flag),
         "ip": lambda v: parse_net(v, flag), "from_pod": lambda v: split_pod(v, flag),
         "to_pod": lambda v: split_pod(v, flag), "pod": lambda v: split_pod(v, flag)}.get(s.kind, str)(s.value)


def lab_sockets(args: argparse.Namespace, inv: Invocation) -> dict[str, str]:
    """Every node's agent socket: ``--agent NODE=SOCKET``, else the lab's nodes."""
    if args.agents:
        out = {}
        for a in args.agents:
            node, sep, path = a.partition("=")
            if not sep or not node or not path:
                raise UsageError(f'--agent "{a}" is not NODE=SOCKET')
            out[node] = path
        return out
    from lace.cli import fanout
    from lace.cli.commands.exec import target
    from lace.lab import cluster
    args.context = getattr(args, "context", None)
    if target(args, inv.env) == "kubernetes":
        raise UnavailableError("lace observe reads the nodes' agents of a lab; on a cluster it is not supported yet",
                               hint="lace exec --node NODE -- node trace flow (one node)")
    ctx, lab = fanout.lab_nodes(args, inv)
    return {n.name: cluster.agent_socket(str(ctx.dir), n.name) for n in lab.nodes}


def check_args(args: argparse.Namespace) -> None:
    if getattr(args, "_negate", False):
        raise UsageError("--not must be followed by a filter", hint="e.g. --not --verdict FORWARDED")
    if args.last < 0:
        raise UsageError("--last must be 0 or more", hint="e.g. --last 20")
    if args.top <= 0:
        raise UsageError("--top must be more than 0", hint="e.g. --top 10")
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds", hint="e.g. --timeout 10")
    if args.reorder_window < 0:
        raise UsageError("--reorder-window must be 0 or more seconds", hint="e.g. --reorder-window 0.25")
    if args.summary and args.follow:
        raise UsageError("--summary counts the flows kept on the nodes; it does not follow",
                         hint="drop --follow (use --since to choose the period)")


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    check_args(args)
    now = time.time()
    since = parse_time(args.since, now, flag="--since") if args.since else None
    until = parse_time(args.until, now, flag="--until") if args.until else None
    if since is not None and until is not None and until < since:
        raise UsageError("--until is before --since", hint="--since is the start, --until the end")
    specs: list[Spec] = list(args.filters or [])
    validate_values(specs)
    # cheap checks first, so that bad input is reported before any node is asked
    sockets = lab_sockets(args, inv)
    names = None if args.numeric else Names.from_store(inv.store(args))
    sel = build_selection(specs, names=names, known_nodes=list(sockets), since=since, until=until)
    sink = Sink(args, inv)
    describe = Describer(names)
    try:
        if args.follow:
            return follow(args, inv, sel, {n: sockets[n] for n in sel.nodes}, sink, describe)
        return history(args, inv, sel, {n: sockets[n] for n in sel.nodes}, sink, describe)
    finally:
        if sink.export is not None:
            sink.export.close()


def _report_unanswered(inv: Invocation, errors: dict[str, NodeError]) -> None:
    for node in sorted(errors):
        e = errors[node]
        inv.stderr.write(f"node {node} did not answer: {e.message}\n")
        if e.hint:
            inv.stderr.write(f"  hint: {e.hint}\n")


def history(args: argparse.Namespace, inv: Invocation, sel: Selection, sockets: dict[str, str],
            sink: Sink, describe: Describer) -> ExitStatus:
    query = dict(sel.query)
    if args.last and sel.exact_pushdown:
        query["last"] = str(args.last)
    docs, errors = gather_history(sockets, query, args.timeout)
    _report_unanswered(inv, errors)
    pred = sel.predicate
    merged: Iterable[Event] = merge_history(docs[n].get("flows") or [] for n in sockets if n in docs)
    if pred is not None:
        merged = (e for e in merged if pred(e))
    events = list(merged)
    if args.last:
        events = events[-args.last:]
    for n in sockets:
        if n in docs and docs[n].get("ring_lost"):
            inv.stderr.write(f"warning: {n}: {render.plural(int(docs[n]['ring_lost']), 'flows')} lost since its "
                             "agent started (ring buffer full)\n")
    for e in events:
        sink.add(describe(e))
    status = ExitStatus.ERROR if errors else ExitStatus.OK
    nodes_doc = {n: {k: docs[n].get(k) for k in ("received", "ring_lost", "kept", "capacity")} for n in docs}
    if sink.summary is not None:
        if args.output in ("json", "jsonl"):
            render.write_json(inv.stdout, {**sink.summary.document(args.top),
                                           "unanswered": {n: e.message for n, e in errors.items()}})
        else:
            sink.summary.render(inv, args.top)
    elif sink.export is not None:
        inv.stdout.write(f"exported {render.plural(sink.export.lines, 'flows')} to {sink.export.path}"
                         + (f" ({render.plural(sink.export.rotations, 'rotations')})" if sink.export.rotations else "")
                         + "\n")
    elif args.output == "json":
        render.write_json(inv.stdout, {"flows": sink.json_flows, "count": len(sink.json_flows), "nodes": nodes_doc,
                                       "unanswered": {n: {"error": e.message, "hint": e.hint} for n, e in errors.items()}})
    elif args.output == "table":
        if sink.rows:
            render.render_table(inv.console(), TABLE_HEADERS, sink.rows)
        inv.stdout.write(_footer(sink.count, docs) + "\n")
    elif args.output == "compact":
        inv.stdout.write(_footer(sink.count, docs) + "\n")
    sink.flush()
    return status


def _footer(count: int, docs: dict[str, dict[str, Any]]) -> str:
    return f"{render.plural(count, 'flows')} from {render.plural(len(docs), 'nodes')}" + (
        f" ({', '.join(sorted(docs))})" if docs else "")


#: records a frame header may announce: far past any frame an agent sends (lace.agent.flows.BATCH
#: plus the rest of one ring read); more is a broken stream, not a read of gigabytes
_MAX_FRAME_RECORDS = 1 << 22


def _frame_header(line: bytes) -> dict[str, int]:
    """A raw stream's frame header line (``lace.agent.flows``), checked: ``records`` (0 up to
    _MAX_FRAME_RECORDS) and ``offset_ns`` integers, ``lost`` and ``ring_lost`` integers >= 0 when
    present (0 when not). ValueError for anything else."""
    head = orjson.loads(line)
    if not isinstance(head, dict):
        raise ValueError(f"a frame header that is no JSON object: {line[:80]!r}")
    out: dict[str, int] = {}
    for key, required in (("records", True), ("offset_ns", True), ("lost", False), ("ring_lost", False)):
        v = head.get(key)
        if v is None and not required:
            v = 0
        if not isinstance(v, int) or isinstance(v, bool) or (key != "offset_ns" and v < 0):
            raise ValueError(f"a frame header with {key} {v!r}")
        out[key] = v
    if out["records"] > _MAX_FRAME_RECORDS:
        raise ValueError(f"a frame header announcing {out['records']} records")
    return out


class _Stream(threading.Thread):
    """One node's followed stream (``batch=raw``, see ``lace.agent.flows``) into the shared queue:
    ("first", node, document), then ("frame", node, (header, records)) per frame (the header
    checked, :func:`_frame_header`), then ("end", node, error) — always, whatever broke the
    stream, so that ``follow`` never waits for a thread that is gone."""

    def __init__(self, node: str, sock: str, query: dict[str, str], out: queue.Queue[Any]) -> None:
        super().__init__(name=f"observe-{node}", daemon=True)
        self.node, self.sock, self.query, self.out = node, sock, query, out
        self.conn: UnixHTTPConnection | None = None
        self.stopping = False

    def run(self) -> None:
        import http.client

        from lace.datapath.trace import TRACE_EVENT
        err: NodeError | None = None
        try:
            conn, resp = _open(self.node, self.sock, self.query, None)
            self.conn = conn
            first = orjson.loads(resp.readline() or b"{}")
            if not isinstance(first, dict):
                raise ValueError(f"its first line is no JSON object: {str(first)[:80]}")
            if first.get("record_size") != TRACE_EVENT.size:
                what = (f"sends flow records of {first['record_size']} bytes, this lace reads {TRACE_EVENT.size}"
                        if "record_size" in first else "does not stream raw flow records (an older lace?)")
                raise NodeError(self.node, f"its agent {what}",
                                f"run the same lace version on both: lace lab restart-agent {self.node}")
            flows = first.get("flows") or []
            if not isinstance(flows, list) or not all(isinstance(e, dict) for e in flows):
                raise ValueError("its backlog (--last) is no list of flow events")
            self.out.put(("first", self.node, first))
            readline, read, size = resp.readline, resp.read, TRACE_EVENT.size
            while True:
                line = readline()
                if not line:
                    break
                head = _frame_header(line)
                want = head["records"] * size
                data = read(want) if want else b""
                if len(data) != want:
                    raise ValueError(f"a frame of {head['records']} records ended after {len(data)} bytes")
                self.out.put(("frame", self.node, (head, data)))
        except NodeError as exc:
            err = exc
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if not self.stopping:
                err = NodeError(self.node, f"the stream from its agent broke: {exc}",
                                "is its agent still running? lace lab status")
        except Exception as exc:   # a thread that died unreported would leave follow() waiting
            if not self.stopping:
                err = NodeError(self.node, f"its stream could not be read: {type(exc).__name__}: {exc}",
                                "run lace observe --follow again; if it recurs, report it with the agent's version")
        if err is None and not self.stopping:
            err = NodeError(self.node, "its agent ended the stream (restarted?)", "run lace observe --follow again")
        self.out.put(("end", self.node, err))

    def stop(self) -> None:
        self.stopping = True
        c = self.conn
        if c is not None and c.sock is not None:
            try:
                import socket
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def follow(args: argparse.Namespace, inv: Invocation, sel: Selection, sockets: dict[str, str],
           sink: Sink, describe: Describer) -> ExitStatus:
    query = dict(sel.query, follow="1", batch="raw")
    if args.last:
        query["last"] = str(args.last if sel.exact_pushdown else max(args.last, 10000))
    q: queue.Queue[Any] = queue.Queue()
    streams = {n: _Stream(n, s, query, q) for n, s in sockets.items()}
    for s in streams.values():
        s.start()
    pred = sel.predicate
    reorder = Reorder(args.reorder_window) if len(streams) > 1 else None
    live = set(streams)
    failed: dict[str, NodeError] = {}
    lost = collections.Counter()
    backlog: list[Event] = []
    pending_first = set(streams)
    renderers: dict[str, FrameRenderer] = {}
    as_text = sink.takes_text
    old_term = None
    if threading.current_thread() is threading.main_thread():
        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt
        old_term = signal.signal(signal.SIGTERM, _term)

    def emit(flows: list[Any]) -> None:
        """Rendered flows: JSON texts when the sink takes text, else described events."""
        if as_text:
            sink.add_texts(flows)
        else:
            for d in flows:
                sink.add(d)

    def emit_events(events: Iterable[Event]) -> None:
        described = [describe(e) for e in events]
        emit([_json(d) for d in described] if as_text else described)

    def backlog_if_complete() -> None:
        """The --last backlog, once every node has sent its own or ended (a node that failed
        before its first document takes nothing from the others')."""
        nonlocal backlog
        if not pending_first and args.last and backlog:
            emit_events(sorted(backlog, key=_t)[-args.last:])
            backlog = []

    try:
        while live:
            try:
                kind, node, doc = q.get(timeout=0.05 if reorder is not None else 1.0)
            except queue.Empty:
                kind = None
            if kind == "end":
                live.discard(node)
                pending_first.discard(node)
                backlog_if_complete()
                if doc is not None:
                    failed[node] = doc
                    inv.stderr.write(f"node {node} did not answer: {doc.message}\n")
                    if doc.hint:
                        inv.stderr.write(f"  hint: {doc.hint}\n")
                    sink.flush()
            elif kind == "first":       # the backlog (--last), decoded by the agent
                renderers[node] = FrameRenderer(str(doc.get("node") or node), sel, describe, as_text)
                flows = doc.get("flows") or []
                pending_first.discard(node)
                backlog.extend(e for e in flows if pred is None or pred(e))
                backlog_if_complete()
            elif kind == "frame":
                head, data = doc
                ring, reader = head["ring_lost"], head["lost"]
                if ring or reader:
                    lost[(node, "ring")] += ring
                    lost[(node, "reader")] += reader
                    sink.lost(node, ring, reader)
                times, flows = renderers[node].render(head["records"], head["offset_ns"], data)
                if reorder is None:
                    emit(flows)
                else:
                    for t, f in zip(times, flows):
                        reorder.push(t, f)
            if reorder is not None:
                emit(reorder.pop_ready(time.time()))
            if sel.until is not None and time.time() > sel.until + args.reorder_window:
                break
            if q.empty():
                sink.flush()
    except KeyboardInterrupt:
        pass
    finally:
        for s in streams.values():
            s.stop()
        if reorder is not None:
            try:
                emit(reorder.drain())
            except (OSError, ValueError):
                pass
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        sink.flush()
    total_lost = sum(lost.values())
    if total_lost:
        inv.stderr.write("lost: " + ", ".join(
            f"{n} {lost[(n, 'ring')] + lost[(n, 'reader')]} (ring {lost[(n, 'ring')]}, reader {lost[(n, 'reader')]})"
            for n in sorted({n for n, _ in lost})) + "\n")
    if sink.export is not None:
        inv.stderr.write(f"exported {render.plural(sink.export.lines, 'flows')} to {sink.export.path}"
                         + (f" ({render.plural(sink.export.rotations, 'rotations')})" if sink.export.rotations else "")
                         + "\n")
    return ExitStatus.ERROR if failed else ExitStatus.OK
