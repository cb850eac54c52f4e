"""``node endpoint list``: this node's local endpoints as its data plane holds them.

A local endpoint is a pod veth: its ifindex is the endpoint ID. For each one the command reports
the interface (name, state), its ``veth`` map entry (endpoint, network, segment, MAC, addresses),
its ``devices`` role, the ``delivery`` entries that lead to it, and the BPF programs on its hooks,
with what looks wrong from the node alone (no veth entry, no program on tcx ingress, an address of
the entry without a delivery entry to this interface, an interface gone). Endpoints are every
interface the ``veth`` or ``devices`` map names as a pod veth, and every interface named like a
lace pod veth (``lx`` + 10 hex digits).

What the store expects of each endpoint (the pod's network, segment and addresses) is compared by
``lace endpoint list``, which runs this command on every node (``-n -o json``) and adds the
cluster's view; here the store is only read for names (never with ``-n``).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from collections.abc import Callable
from typing import Any

from lace.bpf import BPFError, link_info_all
from lace.cli import render
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.node.bpf import dump_entries
from lace.cli.node.env import NodeEnv
from lace.cli.node.resolve import NumericResolver, for_node
from lace.cli.status import ExitStatus
from lace.datapath import registry

#: the names lace gives pod veths on the host side (lace.agent.endpoints.host_ifname)
POD_VETH_NAME = re.compile(r"^lx[0-9a-f]{10}$")

#: problems a node can see alone (``problems`` in each endpoint's document)
NO_VETH_ENTRY = "no veth map entry"
NO_PROGRAM = "no lace program on tcx ingress"
LINK_GONE = "interface gone"


def register(sub: Any, add_common: Callable[..., None]) -> None:
    ep = sub.add_parser("endpoint", help="this node's local endpoints (pod veths) as the data plane holds them",
                        description="This node's local endpoints (pod veths): veth map entry, delivery "
                                    "entries, attached programs.")
    add_common(ep)
    esub = ep.add_subparsers(dest="endpoint_command", metavar="SUBCOMMAND", parser_class=type(ep))
    p = esub.add_parser("list", help="every local endpoint: ID, interface, pod, network, segment, addresses, "
                                     "program, problems")
    add_common(p)
    p.set_defaults(handler=run_list)
    ep.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(UsageError("say what to do: node endpoint list")))


# ---- building the documents (pure: the unit tests feed it plain dicts) -------------------------------

def local_delivery(entries: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """``delivery`` entries of kind local by the ifindex they lead to (decoded key + value dicts)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        if e.get("kind") != "local":
            continue
        out.setdefault(int(e["ifindex"]), []).append(
            {"network": e["network"], "prefix": e["prefix"], "ifindex": e["ifindex"],
             "endpoint_id": e.get("endpoint_id"), "mac": e.get("mac")})
    return out


def _host_prefix(ip: str) -> str:
    a = ipaddress.ip_address(ip)
    return f"{a}/{a.max_prefixlen}"


def endpoint_problems(doc: dict[str, Any], delivery_by_key: dict[tuple[int, str], dict[str, Any]]) -> list[str]:
    """What the node alone can tell is wrong with one endpoint document."""
    problems = []
    if doc["link_state"] == "gone":
        problems.append(LINK_GONE)
    veth = doc["veth"]
    if veth is None:
        problems.append(NO_VETH_ENTRY)
    else:
        if veth["endpoint_id"] != doc["ifindex"]:
            problems.append(f'veth entry endpoint {veth["endpoint_id"]} is not its ifindex {doc["ifindex"]}')
        for ip in (veth.get("ipv4"), veth.get("ipv6")):
            if not ip:
                continue
            d = delivery_by_key.get((int(veth["network"]), _host_prefix(ip)))
            if d is None or d.get("kind") != "local":
                problems.append(f"no local delivery entry for {ip}")
            elif int(d["ifindex"]) != doc["ifindex"]:
                problems.append(f'delivery entry for {ip} leads to ifindex {d["ifindex"]}')
    if doc["link_state"] != "gone" and not doc["program_attached"]:
        problems.append(NO_PROGRAM)
    return problems


def build_endpoints(links: list[dict[str, Any]], veth: dict[int, dict[str, Any]], roles: dict[int, dict[str, Any]],
                    delivery: list[dict[str, Any]], hooks: Callable[[int], list[dict[str, Any]]],
                    res: NumericResolver) -> list[dict[str, Any]]:
    """One document per local endpoint from the node's links (ifindex, name, state, mac), the
    decoded ``veth`` entries and ``devices`` roles by ifindex, the decoded ``delivery`` entries
    (key and value merged) and ``hooks(ifindex)`` (the programs on an interface)."""
    by_index = {int(li["ifindex"]): li for li in links}
    wanted = set(veth) | {i for i, r in roles.items() if r.get("role") == "pod-veth"}
    wanted |= {i for i, li in by_index.items() if POD_VETH_NAME.match(li.get("name") or "")}
    by_ifindex = local_delivery(delivery)
    delivery_by_key = {(int(e["network"]), e["prefix"]): e for e in delivery}
    out = []
    for idx in sorted(wanted):
        li = by_index.get(idx)
        name = li["name"] if li else None
        entry = veth.get(idx)
        progs = hooks(idx) if li else []
        doc: dict[str, Any] = {
            "endpoint_id": entry["endpoint_id"] if entry else idx, "ifindex": idx, "ifname": name,
            "link_state": li.get("state") if li else "gone", "host_mac": li.get("mac") if li else None,
            "role": (roles.get(idx) or {}).get("role"), "pod": res.pod_for_ifname(name) if name else None,
            "veth": None, "delivery": by_ifindex.get(idx, []), "programs": progs,
            "program_attached": any(h["hook"] == "tcx-ingress" for h in progs)}
        if entry is not None:
            v = dict(entry)
            if not res.numeric:
                v["network_name"] = res.network(entry["network"])
                v["segment_name"] = res.segment(entry["segment"])
            doc["veth"] = v
        doc["problems"] = endpoint_problems(doc, delivery_by_key)
        out.append(doc)
    return out


# ---- the command -------------------------------------------------------------------------------------

def _read_maps(node_env: NodeEnv) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]], list[dict[str, Any]]]:
    veth_entries, _ = dump_entries(node_env, registry.get("veth"))
    dev_entries, _ = dump_entries(node_env, registry.get("devices"))
    del_entries, _ = dump_entries(node_env, registry.get("delivery"))
    return ({e.key["ifindex"]: e.value for e in veth_entries},
            {e.key["ifindex"]: e.value for e in dev_entries},
            [{**e.key, **e.value} for e in del_entries])


def run_list(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace import netlink  # pyroute2: only the commands that list interfaces import it
    from lace.cli.errors import UnavailableError
    from lace.cli.node.device import hooks_of
    node_env = NodeEnv.from_env(inv.env)
    veth, roles, delivery = _read_maps(node_env)
    try:
        links = [{"ifindex": li.ifindex, "name": li.name, "state": li.state, "mac": li.mac}
                 for li in netlink.links()]
    except netlink.NetlinkError as exc:
        raise UnavailableError(f"cannot list interfaces: {exc}") from None
    try:
        tcx_links = {(li.ifindex, li.prog_id, li.direction or ""): li.id
                     for li in link_info_all() if li.ifindex is not None}
    except BPFError:
        tcx_links = {}
    res = for_node(args.numeric, node_env.require_store)
    docs = build_endpoints(links, veth, roles, delivery, lambda i: hooks_of(i, tcx_links), res)
    total = len(docs)
    shown = docs if args.limit is None else docs[: args.limit]
    if args.output == "json":
        render.write_json(inv.stdout, {"node": node_env.node, "numeric": bool(args.numeric), "count": total,
                                       "shown": len(shown), "endpoints": shown})
        return ExitStatus.OK
    con = inv.console()
    if not docs:
        con.file.write(f"no local endpoints on {node_env.node_name}\n")
        return ExitStatus.OK
    rows = []
    for d in shown:
        v = d["veth"] or {}
        prog = next((f'{h["name"]} (prog {h["id"]})' for h in d["programs"] if h["hook"] == "tcx-ingress"), None)
        net = seg = None
        if v:
            net = v.get("network_name") or v["network"]
            seg = f'{v["segment"]} {v["segment_name"]}' if v.get("segment_name") else v["segment"]
        rows.append([d["endpoint_id"], d["ifname"] or "(gone)", d["pod"], net, seg, v.get("ipv4"), v.get("ipv6"),
                     prog or "MISSING", "; ".join(d["problems"]) or "ok"])
    render.node_table(con, ["ENDPOINT", "IFNAME", "POD", "NETWORK", "SEGMENT", "IPV4", "IPV6", "PROGRAM", "STATUS"],
                      rows)
    bad = sum(1 for d in docs if d["problems"])
    render.count_line(con, "endpoints", len(shown), total, noun="endpoints")
    if bad:
        con.file.write(f"{render.plural(bad, 'endpoints')} with problems\n")
    return ExitStatus.OK
