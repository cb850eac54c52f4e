"""``lace policy trace``: would this connection be allowed? Decided from the maps programmed on the
nodes involved (no traffic is sent), compared with what the store's NetworkPolicies imply."""

from __future__ import annotations

import argparse
from typing import Any

from lace.cli import args as cli_args
from lace.cli.errors import NotFoundError, UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.render import write_document
from lace.cli.status import ExitStatus


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("policy", help="explain NetworkPolicy decisions",
                              description="NetworkPolicy as lace resolved and programmed it.")
    sub = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", parser_class=type(p))
    t = sub.add_parser("trace", help="decide a connection from the programmed maps, without sending traffic",
                       description="Emulate the datapath's policy lookups for a new connection FROM -> TO:PORT on "
                                   "the maps pinned on the nodes involved: the source's egress, the destination's "
                                   "ingress, the verdict and the rule that decided it; and compare with what the "
                                   "store's policies imply. Exit 0 when allowed (or audited), 1 when denied.")
    cli_args.add_lab_option(t)
    t.add_argument("--from", dest="src", required=True, metavar="NS/POD", help="the connecting pod")
    t.add_argument("--to", dest="dst", required=True, metavar="NS/POD|IP", help="the destination pod or address")
    t.add_argument("--port", required=True, metavar="PORT[/PROTO]", help="destination port, e.g. 80, 53/udp, 9/sctp")
    t.add_argument("--family", type=int, choices=(4, 6), default=None,
                   help="address family for pod destinations (default: IPv4 when the pods have it)")
    cli_args.add_output_option(t, ("json",))
    t.set_defaults(handler=run_trace)
    p.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(UsageError("say what to do: lace policy trace")))


def run_trace(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import topology
    from lace.policy.emulate import read_node_maps
    from lace.policy.sources import inputs_from_store
    from lace.policy.trace import TraceError, find_pod, render, trace

    ctx = inv.lab(args)
    store = inv.store(args)
    inputs = inputs_from_store(store)
    lab = topology.load(ctx.name, state_dir=ctx.dir)
    if lab is None:
        raise UnavailableError(f'lab "{ctx.name}" is not running (its namespaces are gone)',
                               hint="lace lab up --name " + ctx.name)
    roots = {n.name: n.pin_root for n in lab.nodes}
    try:
        nodes = {find_pod(inputs, args.src).node}
        if "/" in args.dst and ":" not in args.dst:
            nodes.add(find_pod(inputs, args.dst).node)
        else:
            nodes |= {p.node for p in inputs.pods if any(str(ip) == args.dst for ip in p.ips)}
        maps = {}
        for n in sorted(nodes):
            if n not in roots:
                raise TraceError(f'node "{n}" is not part of lab {ctx.name}', kind="unavailable")
            try:
                maps[n] = read_node_maps(n, roots[n])
            except Exception as exc:   # a lace.bpf error: pins missing or unreadable
                raise TraceError(f"cannot read node {n}'s maps under {roots[n]}: {exc}",
                                 "is its agent started? lace lab status", kind="unavailable") from None
        doc = trace(inputs, maps, args.src, args.dst, args.port, args.family)
    except TraceError as exc:
        cls = {"not-found": NotFoundError, "unavailable": UnavailableError}.get(exc.kind, UsageError)
        raise cls(str(exc), hint=exc.hint) from None
    if args.output == "json":
        write_document(inv.stdout, doc, "json")
    else:
        inv.stdout.write("\n".join(render(doc)) + "\n")
    return ExitStatus.OK if doc["verdict"] in ("allow", "audit") else ExitStatus.ERROR
