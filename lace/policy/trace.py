"""``lace policy trace``'s engine: decide one new connection from the maps programmed on the nodes
involved (emulating the datapath's lookups), and compare it with what the store's policies imply.

Walk (bpf/progs/pod_veth.c, uplink.c): on the source's node, routing (source network, destination)
-> destination network, segment resolution of the destination, egress check of the source segment;
then, for a pod destination, on its node (the same one for local delivery, else after
decapsulation) the segments of both ends resolved there and the ingress check of the destination
segment. Replies of allowed connections pass through conntrack and are never traced here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Callable

from lace.datapath.common import NETWORK_OUTSIDE, POLICY_SEGMENTS, RESERVED_SEGMENTS, Direction

from .check import drift
from .emulate import PolicyMaps
from .evaluate import Endpoint, Evaluator, overall
from .model import PROTO_NAMES, PodInfo, PolicyInputs
from .program import assemble
from .resolve import Resolution, resolve

REASONS = {"egress": "POLICY_EGRESS", "ingress": "POLICY_INGRESS"}


class TraceError(Exception):
    """The connection cannot be traced (unknown pod, no address of that family, ...)."""

    def __init__(self, message: str, hint: str | None = None, kind: str = "usage") -> None:
        super().__init__(message)
        self.hint = hint
        self.kind = kind


@dataclass
class Target:
    ip: Any
    pod: PodInfo | None

    def doc(self, names: Callable[[int], str]) -> dict[str, Any]:
        d: dict[str, Any] = {"ip": str(self.ip), "pod": self.pod.key if self.pod else None}
        if self.pod:
            d.update(node=self.pod.node, network=self.pod.network, network_id=self.pod.network_id,
                     segment=self.pod.segment, segment_name=names(self.pod.segment))
        return d


def segment_namer(inputs: PolicyInputs) -> Callable[[int], str]:
    by_id: dict[int, str] = {}
    for p in inputs.pods:
        labels = ",".join(f"{k}={v}" for k, v in p.labels) or "<no labels>"
        by_id.setdefault(p.segment, f"{p.namespace} {labels} ({p.network})")
    for cidr, seg in inputs.cidr_segments.items():
        by_id.setdefault(seg, f"cidr {cidr}")

    def name(seg: int) -> str:
        if seg in RESERVED_SEGMENTS:
            return RESERVED_SEGMENTS[seg]
        if seg in POLICY_SEGMENTS:
            return POLICY_SEGMENTS[seg]
        return by_id.get(seg, f"segment {seg} (unresolved)")
    return name


def find_pod(inputs: PolicyInputs, ref: str) -> PodInfo:
    pod = next((p for p in inputs.pods if p.key == ref), None)
    if pod is None:
        raise TraceError(f'pod "{ref}" has no address in the store (not found, or not running yet)',
                         "lace get pods -A lists the pods", kind="not-found")
    return pod


def parse_port(text: str) -> tuple[int, int]:
    port_s, _, proto_s = text.partition("/")
    proto_s = (proto_s or "TCP").upper()
    protos = {"TCP": 6, "UDP": 17, "SCTP": 132, "ICMP": 1, "ICMPV6": 58}
    if proto_s not in protos or not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise TraceError(f'"{text}" is not PORT[/PROTO]', "e.g. --port 80, --port 53/udp, --port 9000/sctp")
    return int(port_s), protos[proto_s]


def _pick_ip(pod: PodInfo, family: int | None) -> Any:
    for ip in pod.ips:
        if family is None or ip.version == family:
            return ip
    raise TraceError(f"pod {pod.key} has no IPv{family} address", "drop --family or pick the other one")


def walk_maps(src_maps: PolicyMaps, dst_maps: Callable[[], PolicyMaps] | None, src_network: int,
              src_segment: int, src_ip: Any, dst_ip: Any, proto: int,
              port: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The datapath's walk for a new connection over programmed maps, as pod_veth.c takes it:
    routing in the source network, the destination's segment, the source segment's egress check
    on the source node (``src_maps``); then, when ``dst_maps`` gives the destination pod's node and
    the destination is not routed outside, the ingress check there (:func:`ingress_step`).

    Returns (egress, ingress or None); an unrouted destination is an egress of verdict "no-route".
    Shared by ``lace policy trace`` and the datapath fuzzer (tests/fuzz/harness.py), which holds the
    C programs to it."""
    dst_net = src_maps.route(src_network, dst_ip)
    if dst_net is None:
        return {"node": src_maps.node, "verdict": "no-route", "reason": "NO_ROUTE"}, None
    dseg, how = src_maps.segment_of(dst_net, dst_ip)
    eg = src_maps.check(src_segment, dseg, Direction.EGRESS, proto, port)
    eg.update(peer_how=how, dst_network=dst_net)
    ing = None
    if dst_maps is not None and dst_net != NETWORK_OUTSIDE:
        ing = ingress_step(dst_maps(), src_network, src_ip, dst_net, dst_ip, proto, port)
    return eg, ing


def ingress_step(dst_maps: PolicyMaps, src_network: int, src_ip: Any, dst_network: int, dst_ip: Any,
                 proto: int, port: int) -> dict[str, Any]:
    """The destination node's ingress check (uplink.c after decapsulation, pod_veth.c for a local
    destination): both ends' segments resolved in their networks there, then the destination
    segment's ingress policy against the source's."""
    sseg, show = dst_maps.segment_of(src_network, src_ip)
    dseg, _ = dst_maps.segment_of(dst_network, dst_ip)
    ing = dst_maps.check(dseg, sseg, Direction.INGRESS, proto, port)
    ing.update(peer_how=show)
    return ing


def verdict_of(eg: dict[str, Any], ing: dict[str, Any] | None) -> tuple[str, str | None]:
    """(verdict, drop reason name or None) of a walk: deny NO_ROUTE, else the policy checks'
    overall verdict with the reason the datapath reports: the denying direction's when one denies
    (an audited egress does not stop the ingress check, whose deny drops the packet as
    POLICY_INGRESS), else the first audited direction's (the audit event's reason)."""
    if eg.get("verdict") == "no-route":
        return "deny", "NO_ROUTE"
    verdicts = [("egress", eg["verdict"])] + ([("ingress", ing["verdict"])] if ing else [])
    verdict = overall(eg["verdict"], ing["verdict"] if ing else "allow")
    reason = next((REASONS[d] for d, v in verdicts if v == "deny"),
                  next((REASONS[d] for d, v in verdicts if v == "audit"), None))
    return verdict, reason


def trace(inputs: PolicyInputs, maps: dict[str, PolicyMaps], src_ref: str, dst_ref: str, port_text: str,
          family: int | None = None, res: Resolution | None = None,
          policy_names: dict[int, str] | None = None) -> dict[str, Any]:
    """The trace as one JSON-able document; ``maps`` are the involved nodes' programmed maps."""
    port, proto = parse_port(port_text)
    src_pod = find_pod(inputs, src_ref)
    ev = Evaluator(inputs)
    try:
        dst_ip = ipaddress.ip_address(dst_ref)
        if family is None:
            family = dst_ip.version
        dst_pod = ev.pod_for_ip(dst_ip)
    except ValueError:
        dst_pod = find_pod(inputs, dst_ref)
        if family is None:
            family = 4 if any(ip.version == 4 for ip in src_pod.ips) else 6
        dst_ip = _pick_ip(dst_pod, family)
    src_ip = _pick_ip(src_pod, family)
    if dst_ip.version != src_ip.version:
        raise TraceError(f"{dst_ref} is IPv{dst_ip.version} but --family says IPv{family}")
    res = res or resolve(inputs)
    names = segment_namer(inputs)
    pnames = dict(res.policy_names)
    pnames.update(policy_names or {})

    def pol(pid: int | None) -> str | None:
        return None if not pid else pnames.get(pid, f"policy {pid} (unresolved)")

    src, dst = Target(src_ip, src_pod), Target(dst_ip, dst_pod)
    doc: dict[str, Any] = {"from": src.doc(names), "to": dst.doc(names), "port": port,
                           "proto": PROTO_NAMES.get(proto, {1: "ICMP", 58: "ICMPv6"}.get(proto, str(proto))),
                           "family": family, "disagreements": [], "maps": {}}
    missing = [n for n in {src_pod.node, *([dst_pod.node] if dst_pod else [])} if n not in maps]
    if missing:
        raise TraceError(f"no maps for node(s) {', '.join(sorted(missing))}", kind="unavailable")

    # what the store implies: per pod, straight from the policies
    eg_s, ing_s = ev.decide(Endpoint(src_ip, src_pod), Endpoint(dst_ip, dst_pod), proto, port)

    # what the programmed maps decide (and what the store-implied maps would decide)
    def walk(node_maps: Callable[[str], PolicyMaps]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return walk_maps(node_maps(src_pod.node),
                         (lambda: node_maps(dst_pod.node)) if dst_pod is not None else None,
                         src_pod.network_id, src_pod.segment, src_ip, dst_ip, proto, port)

    eg, ing = walk(lambda n: maps[n])
    desired_cache: dict[str, PolicyMaps] = {}

    def desired_maps(n: str) -> PolicyMaps:
        if n not in desired_cache:
            want, pfx, _ = assemble(res, inputs, n)
            m = maps[n]
            desired_cache[n] = PolicyMaps.from_entries(n, want, m.segment, pfx, m.routing)
        return desired_cache[n]

    eg_d, ing_d = walk(desired_maps)

    for d in (eg, ing):
        if d is None:
            continue
        d["policy"] = pol(d.get("policy_id"))
        d["subject_name"] = names(d["subject"]) if "subject" in d else None
        d["peer_name"] = names(d["peer"]) if "peer" in d else None
        if d.get("selected"):
            d["selected_by"] = pol(d["marker"]["policy_id"])
        if d.get("entry"):
            d["hits"] = d["entry"]["hits"]
    doc["egress"] = {**eg, "store": eg_s.as_dict()}
    doc["ingress"] = {**ing, "store": ing_s.as_dict()} if ing is not None else None
    doc["verdict"], doc["reason"] = verdict_of(eg, ing)
    doc["store_verdict"] = overall(eg_s.verdict, ing_s.verdict if ing is not None else "allow")

    # disagreements, each with the why
    for direction, got, want, des in (("egress", eg, eg_s, eg_d), ("ingress", ing, ing_s, ing_d)):
        if got is None or "verdict" not in got or got["verdict"] == "no-route":
            continue
        if got["verdict"] != want.verdict:
            node = got["node"]
            dr = drift(res, inputs, maps[node])
            if des is not None and des.get("verdict") == got["verdict"]:
                why = ("lace decides per segment (network, namespace, labels): pods sharing a segment share "
                       "ipBlock matches and named-port numbers, and this connection falls in that gap")
            elif dr.pressure and dr.pressure.reason:
                why = (f"node {node}'s policy map is full ({dr.pressure.reason}): {dr.pressure.dropped} allow "
                       "entries the store implies are not programmed")
            else:
                why = (f"node {node}'s maps are not what the store implies ({len(dr.missing)} entries missing, "
                       f"{len(dr.extra)} extra, {len(dr.differ)} different): its agent has not caught up or is down")
            doc["disagreements"].append({"direction": direction, "programmed": got["verdict"],
                                         "store": want.verdict, "why": why})
    for n in sorted({src_pod.node, *([dst_pod.node] if dst_pod else [])}):
        doc["maps"][n] = drift(res, inputs, maps[n]).as_dict()
    doc["agrees"] = not doc["disagreements"]
    return doc


def render(doc: dict[str, Any]) -> list[str]:
    """The human form of a trace document, one line per fact."""
    def end(d: dict[str, Any]) -> str:
        if d.get("pod"):
            return f'{d["pod"]} ({d["ip"]}, {d["node"]}, segment {d["segment"]} "{d["segment_name"]}")'
        return d["ip"]

    lines = [f'{end(doc["from"])} -> {end(doc["to"])} {doc["proto"].lower()}/{doc["port"]}', ""]
    for direction in ("egress", "ingress"):
        d = doc.get(direction)
        if d is None:
            lines.append(f"{direction:8} not checked: the destination is not a pod")
            continue
        if d.get("verdict") == "no-route":
            lines.append(f"{direction:8} on {d['node']}: no route for the destination (NO_ROUTE)")
            continue
        arrow = "->" if direction == "egress" else "<-"
        lines.append(f'{direction:8} on {d["node"]}: segment {d["subject"]} {arrow} peer {d["peer"]} '
                     f'"{d["peer_name"]}" ({d["peer_how"]})')
        if not d["selected"]:
            lines.append(f"{'':8} not selected by any policy in this direction: allowed")
        else:
            mode = "audit mode" if d.get("audit_mode") else "default deny"
            lines.append(f"{'':8} selected by {d['selected_by']} and others in this direction ({mode})"
                         if len(d["store"]["selected_by"]) > 1 else f"{'':8} selected by {d['selected_by']} ({mode})")
            if d["verdict"] == "allow":
                e = d["entry"]
                ports = "any" if e["port"] is None else (str(e["port"]) if e["port"] == e["end_port"]
                                                          else f'{e["port"]}-{e["end_port"]}')
                peer = "any peer" if e["peer"] == 0 else f'peer {e["peer"]}'
                lines.append(f"{'':8} ALLOW by {d['policy']} rule {d['rule']}: entry {peer} "
                             f"{e['proto'] or 'any proto'} port {ports} (hits {d['hits']})")
            else:
                word = "AUDIT (would drop, passes)" if d["verdict"] == "audit" else "DENY"
                lines.append(f"{'':8} {word}: no rule allows it ({REASONS[direction]})")
    verdict = doc["verdict"].upper() + (f' ({doc["reason"]})' if doc.get("reason") else "")
    lines += ["", f"verdict  {verdict}"]
    if doc["agrees"]:
        lines.append("store    agrees: the store's policies imply the same decision")
    for dis in doc["disagreements"]:
        lines.append(f'store    DISAGREES on {dis["direction"]}: programmed {dis["programmed"]}, '
                     f'the store\'s policies imply {dis["store"]}: {dis["why"]}')
    for node, m in doc["maps"].items():
        pr = m.get("pressure") or {}
        state = "in sync" if m["in_sync"] else (f'out of sync ({m["missing"]} missing, {m["extra"]} extra, '
                                                f'{m["differ"]} different)')
        full = f', {pr["reason"]}: {pr["dropped"]} entries not programmed' if pr.get("reason") else ""
        lines.append(f'maps     {node}: {state}; policy {pr.get("programmed", "?")}/{pr.get("capacity", "?")} '
                     f'entries{full}')
    return lines
