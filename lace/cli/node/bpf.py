"""``node bpf show MAP``: one pinned map at a time, decoded, with names resolved (unless -n).

Each map has a small view function turning decoded entries into table rows and JSON entries; the
dump itself is the loader's (batch where the kernel supports it, iteration for LPM tries).
``policy`` lists both policy maps, the trie of port blocks and ``policy-exact``, as one: every
marker and allow rule with its hit count, wherever the agent put it.
"""

from __future__ import annotations

import argparse
import ipaddress
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lace.cli import render
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.node.env import NodeEnv
from lace.cli.node.resolve import NumericResolver, for_node
from lace.cli.status import ExitStatus
from lace.datapath import registry
from lace.datapath.common import now_coarse
from lace.datapath.policy import HOST_RULE, POLICY_MAPS
from lace.datapath.probes import ProbeFlag
from lace.datapath.registry import MapDef


def register(sub: Any, add_common: Callable[..., None]) -> None:
    bpf = sub.add_parser("bpf", help="show the node's BPF maps", description="Show the node's BPF maps.")
    add_common(bpf)
    bsub = bpf.add_subparsers(dest="bpf_command", metavar="SUBCOMMAND", parser_class=type(bpf))
    p = bsub.add_parser("show", help="dump one map: " + ", ".join(registry.SHOWABLE),
                        description="Dump one map, decoded. MAP is one of: " + ", ".join(registry.SHOWABLE) + ".")
    p.add_argument("map", metavar="MAP", help=", ".join(registry.SHOWABLE))
    p.add_argument("--endpoints", action="store_true",
                   help="services: add each frontend's backends, slot by slot")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--egress", action="store_true", help="policy: only egress entries")
    g.add_argument("--ingress", action="store_true", help="policy: only ingress entries")
    add_common(p)
    p.set_defaults(handler=run_show)
    bpf.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(
        UsageError("say what to do: node bpf show MAP", hint="maps: " + ", ".join(registry.SHOWABLE))))


@dataclass
class Entry:
    """One map entry: decoded key and value, raw bytes, and what the view adds."""

    key: dict[str, Any]
    value: dict[str, Any]
    raw_key: bytes
    raw_value: bytes


@dataclass
class View:
    """What one map looks like: table headers, rows, JSON entries."""

    headers: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    docs: list[dict[str, Any]] = field(default_factory=list)


class Names:
    """Interface names by ifindex in this namespace (read once), and pods behind them."""

    def __init__(self, res: NumericResolver) -> None:
        self.res = res
        self._links: dict[int, str] | None = None

    def ifname(self, ifindex: int) -> str | None:
        if self._links is None:
            from lace import netlink  # ~0.1 s to import (pyroute2): only when names are needed
            try:
                self._links = {li.ifindex: li.name for li in netlink.links()}
            except netlink.NetlinkError:
                self._links = {}
        return self._links.get(int(ifindex))

    def pod_of_ifindex(self, ifindex: int) -> str | None:
        name = self.ifname(ifindex)
        return self.res.pod_for_ifname(name) if name else None


def dump_entries(node_env: NodeEnv, mdef: MapDef) -> tuple[list[Entry], int]:
    """Every entry of a map (decoded), and its capacity."""
    with node_env.open_map(mdef.cli_name) as m:
        pairs = list(m.entries())
        cap = m.max_entries
    return [Entry(mdef.key_dict(rk), mdef.value_dict(rv, rk), rk, rv) for rk, rv in pairs], cap


def dump_policy(node_env: NodeEnv) -> tuple[list[Entry], int, dict[str, dict[str, Any]]]:
    """Both policy maps' entries as one list, each tagged with its map (``key["map"]``), the
    capacity of the one budget the agent splits over them (either map can take all of it), and
    per map its pin, entries and capacity."""
    entries: list[Entry] = []
    maps: dict[str, dict[str, Any]] = {}
    for name in POLICY_MAPS:
        got, cap = dump_entries(node_env, registry.get(name))
        for e in got:
            e.key["map"] = name
        entries += got
        maps[name] = {"pin": node_env.map_path(name), "entries": len(got), "capacity": cap}
    return entries, min(m["capacity"] for m in maps.values()), maps


def _net(res: NumericResolver, net_id: int) -> str:
    return res.network(net_id)


def _names(res: NumericResolver, doc: dict[str, Any], **ids: int | None) -> None:
    """Add ``<field>_name`` to a JSON entry for each network/segment ID (not with -n)."""
    if res.numeric:
        return
    for fieldname, value in ids.items():
        if value is None:
            continue
        if "segment" in fieldname or fieldname == "peer":
            doc[f"{fieldname}_name"] = res.peer(value) if fieldname == "peer" else res.segment(value)
        else:
            doc[f"{fieldname}_name"] = res.network(value)


# ---- per-map views -------------------------------------------------------------------------------

def view_config(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["LOCATOR", "UNDERLAY", "NODE-ID", "UPLINK", "MTU", "FLAGS"])
    for e in entries:
        c = e.value
        if not any(e.raw_value):
            continue  # the array slot exists but nothing was written: not configured
        up = names.ifname(c["uplink_ifindex"])
        uplink = f'{up} ({c["uplink_ifindex"]})' if up and not res.numeric else str(c["uplink_ifindex"])
        v.rows.append([c["locator"], c["underlay_addr"], c["node_id"], uplink, c["mtu"], ",".join(c["flags"])])
        doc = {**c}
        if up:
            doc["uplink"] = up
        v.docs.append(doc)
    return v


def view_devices(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["IFINDEX", "NAME", "ROLE", "MAC", "POD"])
    for e in sorted(entries, key=lambda e: e.key["ifindex"]):
        idx = e.key["ifindex"]
        name = names.ifname(idx)
        pod = res.pod_for_ifname(name) if name and e.value["role"] == "pod-veth" else None
        v.rows.append([idx, name or "(gone)", e.value["role"], e.value["mac"], pod])
        v.docs.append({"ifindex": idx, "name": name, **e.value, "pod": pod})
    return v


def view_nexthops(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    """The datapath's cache of the node FIB's answer per SID: where packets to another node go out,
    and for how long the datapath sends them there before it asks the FIB again."""
    now = now_coarse()
    v = View(["SID", "INTERFACE", "NEXT-HOP-MAC", "SOURCE-MAC", "MTU", "FRESH-FOR"])
    for e in sorted(entries, key=lambda e: ipaddress.IPv6Address(e.key["sid"])):
        val = e.value
        name = names.ifname(val["ifindex"])
        left_s = (val["expires_ns"] - now) / 1e9
        if left_s <= 0:
            fresh = f"expired {render.human_duration(-left_s)} ago"
        else:
            fresh = f"{left_s * 1000:.0f}ms" if left_s < 1 else render.human_duration(left_s)
        v.rows.append([e.key["sid"], f'{val["ifindex"]}' + (f" ({name})" if name and not res.numeric else ""),
                       val["dmac"], val["smac"], val["mtu"], fresh])
        v.docs.append({**e.key, **val, "ifname": name, "fresh": left_s > 0})
    return v


def view_routing(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["SRC-NETWORK", "PREFIX", "DST-NETWORK", "MASQUERADE"])
    for e in sorted(entries, key=lambda e: (e.key["src_network"], _pfx_sort(e.key["prefix"]))):
        k, val = e.key, e.value
        dst = "outside" if val["outside"] else _net(res, val["dst_network"])
        if val.get("service_map_full"):
            dst = render.SERVICE_MAP_FULL_ROUTE
        v.rows.append([_net(res, k["src_network"]), k["prefix"], dst, "yes" if val["masquerade"] else "no"])
        doc = {**k, **val}
        _names(res, doc, src_network=k["src_network"], dst_network=val["dst_network"])
        v.docs.append(doc)
    return v


def _pfx_sort(prefix: str) -> tuple[int, int, int]:
    net = ipaddress.ip_network(prefix, strict=False)
    return (net.version, int(net.network_address), net.prefixlen)


def view_delivery(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["NETWORK", "PREFIX", "KIND", "TARGET"])
    for e in sorted(entries, key=lambda e: (e.key["network"], _pfx_sort(e.key["prefix"]))):
        k, val = e.key, e.value
        doc = {**k, **val}
        if val["kind"] == "local":
            ifname = names.ifname(val["ifindex"])
            pod = res.pod_for_ifname(ifname) if ifname else None
            if not pod and not res.numeric:
                pod = res.pod_for_ip(k["network"], k["prefix"].split("/")[0])
            target = f'local pod {pod or "?"} via {ifname or "ifindex"} ({val["ifindex"]}) mac {val["mac"]}'
            if res.numeric:
                target = f'local ifindex {val["ifindex"]} mac {val["mac"]} endpoint {val["endpoint_id"]}'
            doc.update(ifname=ifname, pod=pod)
        elif val["kind"] == "remote":
            target = f'remote node {val["node_id"]} sid {val["sid"]}'
            doc["node_id"] = val["node_id"]
        elif val["kind"] == "host":
            target = "this node's host stack"
        else:
            target = val["kind"]
        v.rows.append([_net(res, k["network"]), k["prefix"], val["kind"], target])
        _names(res, doc, network=k["network"])
        v.docs.append(doc)
    return v


def view_veth(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["IFINDEX", "IFNAME", "POD", "ENDPOINT", "NETWORK", "SEGMENT", "MAC", "IPV4", "IPV6"])
    for e in sorted(entries, key=lambda e: e.key["ifindex"]):
        idx, val = e.key["ifindex"], e.value
        ifname = names.ifname(idx)
        pod = res.pod_for_ifname(ifname) if ifname else None
        v.rows.append([idx, ifname or "(gone)", pod, val["endpoint_id"], _net(res, val["network"]),
                       res.segment(val["segment"]), val["mac"], val["ipv4"], val["ipv6"]])
        doc = {"ifindex": idx, "ifname": ifname, "pod": pod, **val}
        _names(res, doc, network=val["network"], segment=val["segment"])
        v.docs.append(doc)
    return v


def view_services(entries: list[Entry], res: NumericResolver, names: Names, args: Any,
                  backends: dict[int, dict[str, Any]] | None = None) -> View:
    headers = ["NETWORK", "VIP", "PORT", "PROTO", "SERVICE", "BACKENDS", "FLAGS"]
    if args.endpoints:
        headers.append("BACKEND")
    v = View(headers)
    slots: dict[tuple, list[Entry]] = {}
    services = []
    for e in entries:
        k = e.key
        ident = (k["network"], k["addr"], k["port"], k["proto"])
        if k["slot"] == 0:
            services.append(e)
        else:
            slots.setdefault(ident, []).append(e)
    for e in sorted(services, key=lambda e: (e.key["network"], e.key["addr"], e.key["port"])):
        k, val = e.key, e.value
        name = res.service(val["service_id"], network=k["network"], vip=k["addr"], port=k["port"], proto=k["proto"])
        terminating = val["backend_count"] - val["active_count"]
        count = str(val["active_count"]) + (f" (+{terminating} terminating)" if terminating > 0 else "")
        flags = [f'affinity={val["affinity_timeout"]}s' if f == "affinity" else f for f in val["flags"]]
        if val["maglev"]:
            flags.append(f'maglev={val["maglev"]}')
        row = [_net(res, k["network"]), k["addr"], k["port"], k["proto"], name, count, ",".join(flags)]
        doc: dict[str, Any] = {**k, **val}
        if not res.numeric:
            doc["service"] = name
        _names(res, doc, network=k["network"])
        if args.endpoints:
            bes = []
            for s in sorted(slots.get((k["network"], k["addr"], k["port"], k["proto"]), []),
                            key=lambda s: s.key["slot"]):
                b = (backends or {}).get(s.value["backend_id"])
                be: dict[str, Any] = {"slot": s.key["slot"], "backend_id": s.value["backend_id"]}
                if b is None:
                    text = f'backend {s.value["backend_id"]} (missing from backends)'
                else:
                    be.update(b)
                    host = f'[{b["addr"]}]' if ":" in b["addr"] else b["addr"]
                    pod = res.pod_for_ip(b["network"], b["addr"])
                    text = f'{host}:{b["port"]}' + (f" ({pod})" if pod else "")
                    if pod:
                        be["pod"] = pod
                    shown = [f for f in b["flags"] if f != "active"]
                    if "active" not in b["flags"] and not shown:
                        shown = ["inactive"]
                    if shown:   # terminating, reply-entry (its new flows keep a backend entry)
                        text += " " + ",".join(shown)
                be["text"] = text
                bes.append(be)
            doc["backends"] = bes
            row.append(bes[0]["text"] if bes else "(none)")
            v.rows.append(row)
            for be in bes[1:]:
                v.rows.append([render.BLANK] * (len(headers) - 1) + [be["text"]])
        else:
            v.rows.append(row)
        v.docs.append(doc)
    return v


def view_revnat(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    """Each backend (network, address:port, protocol) with the frontends its replies leave from: a
    service flow's one conntrack entry is keyed by its frontend, and its replies find it through
    these. A frontend whose service no longer uses the backend stays while its flows may live."""
    v = View(["NETWORK", "BACKEND", "PROTO", "POD", "FRONTENDS"])
    for e in sorted(entries, key=lambda e: (e.key["network"], _pfx_sort(e.key["backend"]), e.key["port"],
                                            e.key["proto"])):
        k, fronts = e.key, e.value["frontends"]
        host = f'[{k["backend"]}]' if ":" in k["backend"] else k["backend"]
        pod = res.pod_for_ip(k["network"], k["backend"])
        texts = []
        for f in fronts:
            addr = f'[{f["addr"]}]' if ":" in f["addr"] else f["addr"]
            texts.append(f'{addr}:{f["port"]} in {_net(res, f["network"])}')
            _names(res, f, network=f["network"])
        v.rows.append([_net(res, k["network"]), f'{host}:{k["port"]}', k["proto"], pod, texts[0] if texts else "(none)"])
        for t in texts[1:]:
            v.rows.append([render.BLANK] * 4 + [t])
        doc = {**k, "pod": pod, "frontends": fronts}
        _names(res, doc, network=k["network"])
        v.docs.append(doc)
    return v


def view_policy(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    """Markers and allow entries of both policy maps, by segment and direction, the marker first:
    where an entry lives (``map`` in JSON) follows from its ports, so the table does not repeat it."""
    v = View(["SEGMENT", "DIRECTION", "PEER", "PROTO", "PORTS", "POLICY", "RULE", "HITS"])
    want = "egress" if args.egress else "ingress" if args.ingress else None

    def order(e: Entry) -> tuple:
        k = e.key
        return (k["segment"], k["direction"], not k["selected"], k["peer"], str(k["proto"]), k["port"] or 0)

    for e in sorted(entries, key=order):
        k, val = e.key, e.value
        if want and k["direction"] != want:
            continue
        doc = {**k, **val}
        if k["selected"]:
            mode = "selected (audit)" if "audit" in val["flags"] else "selected (default deny)"
            peer, proto, ports = mode, "", ""
            doc["marker"] = mode
        else:
            peer = res.peer(k["peer"])
            proto = k["proto"] if k["proto"] is not None else "any"
            if k["port"] is None:
                ports = "any" if k["proto"] is not None else ""
            elif k["port"] == k["end_port"]:
                ports = str(k["port"])
            else:
                ports = f'{k["port"]}-{k["end_port"]}'
        pol = res.policy(val["policy_id"]) if val["policy_id"] else "-"
        rule = val["rule"]
        if not k["selected"] and rule == HOST_RULE:
            rule = "host-default"   # the node's host into a pod selected for ingress (lace.policy.resolve)
            doc["host_default"] = True
        v.rows.append([res.segment(k["segment"]), k["direction"], peer, proto, ports, pol, rule, val["hits"]])
        if not res.numeric:
            doc["segment_name"] = res.segment(k["segment"])
            if not k["selected"]:
                doc["peer_name"] = res.peer(k["peer"])
            if val["policy_id"]:
                doc["policy"] = pol
        v.docs.append(doc)
    return v


def view_segment(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["NETWORK", "ADDRESS", "POD", "SEGMENT", "LOCAL"])
    for e in sorted(entries, key=lambda e: (e.key["network"], _pfx_sort(e.key["addr"]))):
        k, val = e.key, e.value
        pod = res.pod_for_ip(k["network"], k["addr"])
        v.rows.append([_net(res, k["network"]), k["addr"], pod, res.segment(val["segment"]),
                       "yes" if val["local"] else "no"])
        doc = {**k, **val, "pod": pod}
        _names(res, doc, network=k["network"], segment=val["segment"])
        v.docs.append(doc)
    return v


def view_prefix_segment(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    v = View(["NETWORK", "PREFIX", "SEGMENT"])
    for e in sorted(entries, key=lambda e: (e.key["network"], _pfx_sort(e.key["prefix"]))):
        k, val = e.key, e.value
        v.rows.append([_net(res, k["network"]), k["prefix"], res.segment(val["segment"])])
        doc = {**k, **val}
        _names(res, doc, network=k["network"], segment=val["segment"])
        v.docs.append(doc)
    return v


def view_probes(entries: list[Entry], res: NumericResolver, names: Names, args: Any) -> View:
    """Probe targets: the address and port the kubelet connects to, the pod and network they lead into
    and the pod's own address:port there. An address's marker row (port and protocol ``*``) says
    every other port of that probe address is denied."""
    v = View(["ADDRESS", "PORT", "PROTO", "NETWORK", "POD", "IFINDEX", "TARGET"])
    for e in sorted(entries, key=lambda e: (_pfx_sort(e.key["addr"]), e.key["port"])):
        k, val = e.key, e.value
        ifname = names.ifname(val["ifindex"])
        pod = (res.pod_for_ifname(ifname) if ifname else None) or res.pod_for_ip(val["network"], val["target_addr"])
        marker = bool(val["flags"] & ProbeFlag.ADDRESS)
        tgt = f'[{val["target_addr"]}]' if ":" in val["target_addr"] else val["target_addr"]
        v.rows.append([k["addr"], "*" if marker else k["port"], "*" if marker else k["proto"],
                       _net(res, val["network"]), pod,
                       f'{val["ifindex"]}' + (f" ({ifname})" if ifname and not res.numeric else ""),
                       "other ports denied" if marker else f'{tgt}:{val["target_port"]}'])
        doc = {**k, **val, "pod": pod, "ifname": ifname, "marker": marker}
        _names(res, doc, network=val["network"])
        v.docs.append(doc)
    return v


def view_probe_cookie(entries: list[Entry], res: NumericResolver, names: Names, args: Any,
                      probes: dict[tuple, dict[str, Any]] | None = None) -> View:
    """In-flight probe connections by socket cookie: the destination the kubelet asked for, the pod
    it resolved to (through the probes map) and the connection's age."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    v = View(["COOKIE", "ORIGINAL-DESTINATION", "PROTO", "NETWORK", "POD", "AGE"])
    for e in sorted(entries, key=lambda e: e.key["cookie"]):
        k, val = e.key, e.value
        dst = f'[{val["orig_addr"]}]' if ":" in val["orig_addr"] else val["orig_addr"]
        age_s = (now - val["created_ns"]) / 1e9 if val["created_ns"] else None
        target = (probes or {}).get((val["orig_addr"], val["orig_port"], val["proto"]))
        pod = None
        if target is not None:
            ifname = names.ifname(target["ifindex"])
            pod = (res.pod_for_ifname(ifname) if ifname else None) or \
                res.pod_for_ip(target["network"], target["target_addr"])
        v.rows.append([k["cookie"], f'{dst}:{val["orig_port"]}', val["proto"], _net(res, val["network"]), pod,
                       render.human_duration(age_s) if age_s is not None else None])
        doc = {**k, **val, "age_s": age_s, "pod": pod,
               "target_addr": target["target_addr"] if target else None,
               "target_port": target["target_port"] if target else None}
        _names(res, doc, network=val["network"])
        v.docs.append(doc)
    return v


VIEWS: dict[str, Callable[..., View]] = {
    "config": view_config, "devices": view_devices, "routing": view_routing, "delivery": view_delivery,
    # the same entries as delivery's full-length ones: the same view
    "delivery-exact": view_delivery, "veth": view_veth, "services": view_services, "revnat": view_revnat,
    "policy": view_policy, "segment": view_segment,
    "prefix-segment": view_prefix_segment, "probes": view_probes, "probe-cookie": view_probe_cookie,
    "nexthops": view_nexthops,
}
assert tuple(VIEWS) == registry.SHOWABLE



def run_show(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    name = args.map
    if name not in VIEWS:
        raise UsageError(f'unknown map "{name}"', hint="valid maps: " + ", ".join(registry.SHOWABLE))
    if (args.egress or args.ingress) and name != "policy":
        raise UsageError("--egress/--ingress apply to `node bpf show policy` only")
    if args.endpoints and name != "services":
        raise UsageError("--endpoints applies to `node bpf show services` only")
    _show(args, inv, name)
    return ExitStatus.OK


def _show(args: argparse.Namespace, inv: Invocation, name: str) -> None:
    node_env = NodeEnv.from_env(inv.env)
    mdef = registry.get(name)
    policy_maps: dict[str, dict[str, Any]] | None = None
    if name == "policy":
        entries, cap, policy_maps = dump_policy(node_env)
    else:
        entries, cap = dump_entries(node_env, mdef)
    res = for_node(args.numeric, node_env.require_store)
    names = Names(res)
    if name == "services":
        backends: dict[int, dict[str, Any]] = {}
        if args.endpoints:
            bes, _ = dump_entries(node_env, registry.get("backends"))
            backends = {b.key["backend_id"]: b.value for b in bes}
        view = view_services(entries, res, names, args, backends)
    elif name == "probe-cookie":
        targets, _ = dump_entries(node_env, registry.get("probes"))
        view = view_probe_cookie(entries, res, names, args, {
            (t.key["addr"], t.key["port"], t.key["proto"]): t.value for t in targets})
    else:
        view = VIEWS[name](entries, res, names, args)
    total = len(view.docs)
    limit = args.limit
    shown_docs = view.docs if limit is None else view.docs[:limit]
    if args.output == "json":
        doc: dict[str, Any] = {"node": node_env.node, "map": name}
        doc.update({
            "pin": node_env.map_path(name), "capacity": cap, "count": total, "entries_in_map": len(entries),
            "shown": len(shown_docs), "truncated": len(shown_docs) < total, "numeric": bool(args.numeric),
            "entries": shown_docs})
        if policy_maps is not None:
            doc["maps"] = policy_maps
        render.write_json(inv.stdout, doc)
        return
    con = inv.console()
    label = f"{name}" + (f" ({'egress' if args.egress else 'ingress'})" if args.egress or args.ingress else "")
    if not view.rows:
        render.empty(con, label if total == 0 and not entries else f"{label} (after filters)", cap)
        return
    rows = view.rows
    if limit is not None:
        # services --endpoints spreads one entry over several rows: cut at entry boundaries
        if name == "services" and args.endpoints:
            cut, seen = len(rows), 0
            for i, r in enumerate(rows):
                if r[0] is not render.BLANK:
                    if seen == limit:
                        cut = i
                        break
                    seen += 1
            rows = rows[:cut]
        else:
            rows = rows[:limit]
    render.node_table(con, view.headers, rows)
    nouns = {"services": "services", "config": "entries"}
    render.count_line(con, label, len(shown_docs), total, cap if name != "config" else None,
                      noun=nouns.get(name, "entries"), map_entries=len(entries))

