"""``lace metrics [--node N ...] [-o json]``: every node's Prometheus metrics.

Runs ``node metrics`` on each node at once (``lace.cli.fanout``) and prints each node's text
exposition under a ``# node NAME`` line, or with ``-o json`` one document ``{"nodes": {NAME:
{family: {type, help, samples}}}}`` parsed with prometheus_client's parser. Each lab agent also
serves the same text over TCP inside its node's namespace (``--metrics-port``, 9962 in the lab).

Exit status: 0 every node answered; 1 a node did not answer (named, the others still shown);
2 bad command line; 5 no lab running.
"""

from __future__ import annotations

import argparse
from typing import Any

from lace.cli import fanout, render
from lace.cli.invocation import Invocation
from lace.cli.node import metrics as node_metrics
from lace.cli.status import ExitStatus

TIMEOUT = 30.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "metrics", help="every node's Prometheus metrics (text exposition per node, or parsed with -o json)",
        description="Run `node metrics` on every node (or those named with --node) at once and print each node's "
                    "metrics: datapath packets by verdict/point/reason, map pressure, conntrack entries, policy "
                    "entries, endpoints by state, reconcile duration and errors, store watch lag, flow losses.")
    fanout.add_node_option(p)
    fanout.add_target_options(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    outs = fanout.run_nodes(args, inv, ["metrics"], what="node metrics", timeout=TIMEOUT)
    texts: dict[str, str] = {}
    failed: dict[str, dict[str, Any]] = {}
    for o in outs:
        if o.error is None and o.rc == 0:
            texts[o.node] = o.stdout
            continue
        err, hint = (o.error, o.hint) if o.error is not None else fanout.error_lines(o.stderr)
        failed[o.node] = {"error": err or f"node metrics exited {o.rc}", "hint": hint}
    for node, f in failed.items():
        inv.stderr.write(f"node {node} did not answer: {f['error']}\n" + (f"  hint: {f['hint']}\n" if f["hint"] else ""))
    if args.output == "json":
        render.write_json(inv.stdout, {"nodes": {n: node_metrics.parse(t) for n, t in texts.items()},
                                       "unanswered": failed})
    else:
        for node, text in texts.items():
            inv.stdout.write(f"# node {node}\n{text}")
    return ExitStatus.ERROR if failed else ExitStatus.OK
