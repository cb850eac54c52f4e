"""``node device list``: the node's interfaces, their lace role, the pod behind each pod veth, and
which BPF programs are attached to each hook (tcx links and tc clsact filters), so that an
endpoint missing its program stands out (MISSING)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lace.bpf import BPFError, TcFilter, link_info_all, prog_info, query_tcx_full
from lace.cli import render
from lace.cli.errors import UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.node.bpf import dump_entries
from lace.cli.node.env import NodeEnv
from lace.cli.node.resolve import for_node
from lace.cli.status import ExitStatus
from lace.datapath import registry


def register(sub: Any, add_common: Callable[..., None]) -> None:
    dev = sub.add_parser("device", help="the node's interfaces and the BPF programs on them",
                         description="The node's interfaces and the BPF programs attached to them.")
    add_common(dev)
    dsub = dev.add_subparsers(dest="device_command", metavar="SUBCOMMAND", parser_class=type(dev))
    p = dsub.add_parser("list", help="interfaces, roles, MACs, pods, attached programs")
    add_common(p)
    p.set_defaults(handler=run_list)
    dev.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(UsageError("say what to do: node device list")))


def _prog(pid: int) -> dict[str, Any]:
    try:
        info = prog_info(pid)
        return {"id": pid, "name": info.name, "type": info.type_name}
    except BPFError:
        return {"id": pid, "name": "?", "type": "?"}


def tc_filters(ifindex: int, direction: str) -> list[dict[str, Any]]:
    """BPF programs in the clsact hook (classic tc filters other tools attached; lace uses tcx),
    through ``TcFilter.query``.

    A tc query needs a handle and priority; the common tools use low numbers (and tc's automatic
    priority 49152), so the usual slots are probed."""
    found = []
    for prio in (1, 2, 3, 49152):
        for handle in (1, 2):
            try:
                pid = TcFilter(ifindex, direction, handle, prio).query()
            except BPFError:
                pid = None
            if pid:
                found.append({"hook": f"tc-{direction}", "handle": handle, "priority": prio, **_prog(pid)})
    return found


def hooks_of(ifindex: int, links_by_prog: dict[tuple[int, int, str], int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for direction in ("ingress", "egress"):
        try:
            q = query_tcx_full(ifindex, direction)
        except BPFError:
            q = None
        if q is not None:
            for i, pid in enumerate(q.prog_ids):
                lid = q.link_ids[i] if i < len(q.link_ids) else 0
                lid = lid or links_by_prog.get((ifindex, pid, direction), 0)
                out.append({"hook": f"tcx-{direction}", **_prog(pid), "link_id": lid or None})
        out.extend(tc_filters(ifindex, direction))
    return out


def run_list(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace import netlink  # pyroute2: imported only by the commands that list interfaces
    node_env = NodeEnv.from_env(inv.env)
    try:
        links = netlink.links()
    except netlink.NetlinkError as exc:
        raise UnavailableError(f"cannot list interfaces: {exc}") from None
    roles: dict[int, dict[str, Any]] = {}
    devices_error = None
    try:
        entries, _ = dump_entries(node_env, registry.get("devices"))
        roles = {e.key["ifindex"]: e.value for e in entries}
    except Exception as exc:  # no datapath here: still list interfaces and hooks
        devices_error = getattr(exc, "message", str(exc))
    res = for_node(args.numeric, node_env.require_store)
    try:
        tcx_links = {(li.ifindex, li.prog_id, li.direction or ""): li.id
                     for li in link_info_all() if li.ifindex is not None}
    except BPFError:
        tcx_links = {}
    docs = []
    for li in links:
        role = roles.get(li.ifindex)
        hooks = hooks_of(li.ifindex, tcx_links)
        pod = res.pod_for_ifname(li.name) if role and role["role"] == "pod-veth" else None
        missing = bool(role) and role["role"] in ("pod-veth", "uplink", "host") and not any(
            h["hook"].endswith("ingress") for h in hooks)
        docs.append({"ifindex": li.ifindex, "name": li.name, "kind": li.kind, "mac": li.mac, "mtu": li.mtu,
                     "state": li.state, "role": role["role"] if role else "unmanaged",
                     "lace_mac": role["mac"] if role else None, "pod": pod, "programs": hooks,
                     "missing_program": missing})
    # managed interfaces that no longer exist
    present = {li.ifindex for li in links}
    for idx, role in sorted(roles.items()):
        if idx not in present:
            docs.append({"ifindex": idx, "name": None, "kind": None, "mac": None, "mtu": None, "state": "gone",
                         "role": role["role"], "lace_mac": role["mac"], "pod": None, "programs": [],
                         "missing_program": True})
    total = len(docs)
    shown = docs if args.limit is None else docs[: args.limit]
    if args.output == "json":
        render.write_json(inv.stdout, {"node": node_env.node, "count": total, "shown": len(shown),
                                       "devices_map_error": devices_error, "devices": shown})
        return ExitStatus.OK
    con = inv.console()
    rows = []
    for d in shown:
        progs = [f'{h["hook"]} {h["name"]} (prog {h["id"]}' + (f', link {h["link_id"]})' if h.get("link_id")
                 else f', handle {h["handle"]} prio {h["priority"]})' if "handle" in h else ")")
                 for h in d["programs"]]
        text = "; ".join(progs) or "-"
        if d["missing_program"]:
            text = "MISSING" + (f" ingress program ({text})" if progs else "")
        rows.append([d["ifindex"], d["name"] or "(gone)", d["kind"], d["role"], d["lace_mac"] or d["mac"],
                     d["state"], d["pod"], text])
    render.node_table(con, ["IFINDEX", "NAME", "KIND", "ROLE", "MAC", "STATE", "POD", "PROGRAMS"], rows)
    missing = sum(1 for d in docs if d["missing_program"])
    render.count_line(con, "devices", len(shown), total, noun="interfaces")
    if missing:
        con.file.write(f"{missing} managed interface{'s' if missing != 1 else ''} without a lace program (MISSING)\n")
    if devices_error:
        con.file.write(f"note: roles unknown: {devices_error}\n")
    return ExitStatus.OK
