"""``lace verify [--node N ...] [--repair]``: the drift audit on every node of the cluster.

Runs ``node verify -o json`` on each node at once, where ``lace exec --node N -- node verify``
would run it (the lab node's namespace and host cgroup; the lace-node pod on a cluster), prints
each node's result as ``node verify`` does and a cluster summary line. A node whose command fails
(its agent down, no lace-node pod, no answer within ``--timeout``) is reported by name with the
reason, and the others are still shown.

Exit status: 0 every node answered and has no drift; 1 drift on a node, or a node did not answer;
2 bad command line (an unknown node, an unknown map); 5 no lab running.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from lace.cli import fanout, render
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.node import verify as node_verify
from lace.cli.status import ExitStatus

DEFAULT_TIMEOUT = 90.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "verify", help="drift audit: every node's maps against the desired state (node verify on each node)",
        description="Run `node verify` on every node (or those named with --node) at once: every map the agent "
                    "owns against what the store implies, missing / stale / different entries by map with names. "
                    "Exit 0: every node answered and has no drift; 1: drift, or a node did not answer. Not audited "
                    f"(written by the datapath itself): {node_verify.NOT_AUDITED_TEXT}.")
    fanout.add_node_option(p)
    p.add_argument("--repair", action="store_true", help="ask each agent to reprogram, then verify again")
    p.add_argument("--map", dest="maps", action="append", metavar="NAME",
                   help="audit only this map (repeatable): " + ", ".join(node_verify.AUDITED))
    p.add_argument("-n", "--numeric", action="store_true", help="raw IDs and addresses, no names")
    p.add_argument("--limit", type=int, metavar="N", default=None, help="show at most N entries per map")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=DEFAULT_TIMEOUT,
                   help=f"how long to wait for a node (default {DEFAULT_TIMEOUT:g})")
    fanout.add_target_options(p)
    p.set_defaults(handler=run)


@dataclass
class NodeResult(fanout.NodeDoc):
    """What one node's ``node verify -o json`` gave: its document, or why it did not answer."""

    extra: dict[str, Any] = field(default_factory=dict)


def node_argv(args: argparse.Namespace) -> list[str]:
    """The ``node`` command line each node runs (after ``node``)."""
    argv = ["verify", "-o", "json"]
    if args.repair:
        argv.append("--repair")
    for m in args.maps or ():
        argv += ["--map", m]
    if args.numeric:
        argv.append("-n")
    return argv


def parse_result(node: str, rc: int | None, stdout: str, stderr: str) -> NodeResult:
    """A node's answer: exit 0 or 1 with one JSON document, else the error line it printed."""
    return _result(fanout.NodeOutput(node, rc, stdout, stderr))


def _result(o: fanout.NodeOutput) -> NodeResult:
    return fanout.parse_doc(o, "maps", what="node verify", cls=NodeResult)


# ---- running it on the nodes (lace.cli.fanout) -----------------------------------------------------

def run_lab(args: argparse.Namespace, inv: Invocation) -> list[NodeResult]:
    return [_result(o) for o in fanout.run_lab(args, inv, node_argv(args), what="node verify",
                                               timeout=args.timeout)]


def run_kubernetes(args: argparse.Namespace, inv: Invocation, *, core: Any = None,
                   stream_fn: Any = None) -> list[NodeResult]:
    """The same through each node's lace-node pod (``lace exec --context``)."""
    return [_result(o) for o in fanout.run_kubernetes(args, inv, node_argv(args), timeout=args.timeout,
                                                      core=core, stream_fn=stream_fn)]


pick_nodes = fanout.pick_nodes


# ---- the report ------------------------------------------------------------------------------------

def cluster_summary(results: list[NodeResult]) -> str:
    """``2/3 nodes clean; worker-1: 3 entries drift; worker-2 did not answer: …``."""
    clean = [r for r in results if r.doc is not None and node_verify.clean(r.doc)]
    parts = [f"{len(clean)}/{len(results)} nodes clean"]
    for r in results:
        if r.doc is None:
            parts.append(f"{r.node} did not answer: {r.error}")
        elif r not in clean:
            n = node_verify.drift_count(r.doc.get("maps") or {})
            full = node_verify.left_out_text(r.doc)
            parts.append(f"{r.node}: " + ", ".join(
                ([f"{render.plural(n, 'entries')} {'drifts' if n == 1 else 'drift'}"] if n else []) +
                ([f"full maps left out {full}"] if full else [])))
    return "; ".join(parts)


def status(results: list[NodeResult]) -> ExitStatus:
    ok = all(r.doc is not None and node_verify.clean(r.doc) for r in results)
    return ExitStatus.OK if ok else ExitStatus.ERROR


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.cli.commands.exec import target
    node_verify.check_maps(args.maps)
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be 0 or more")
    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    if target(args, inv.env) == "kubernetes":
        results = run_kubernetes(args, inv)
    else:
        results = run_lab(args, inv)
    summary = cluster_summary(results)
    if args.output == "json":
        render.write_json(inv.stdout, {
            "nodes": {r.node: r.doc for r in results if r.doc is not None},
            "unanswered": {r.node: {"error": r.error, "hint": r.hint} for r in results if r.doc is None},
            "clean": [r.node for r in results if r.doc is not None and node_verify.clean(r.doc)],
            "summary": summary})
        return status(results)
    for r in results:
        if r.doc is None:
            inv.stdout.write(f"node {r.node}: did not answer: {r.error}\n")
            if r.hint:
                inv.stdout.write(f"  hint: {r.hint}\n")
        else:
            node_verify.render_report(inv, r.node, r.doc, args.limit)
    inv.stdout.write(summary + "\n")
    return status(results)
