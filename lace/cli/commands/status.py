"""``lace status [--node N ...] [--verbose] [--wait] [--timeout S] [-o json]``: every node's health.

Runs ``node status -o json`` on each node at once (``lace.cli.fanout``: the lab node's namespace
and host cgroup, or the lace-node pod on a cluster), prints each node's subsystems as ``node
status`` does (``--verbose``: loops, maps, endpoints) and a cluster summary line (``3/3 nodes
healthy``). A node whose agent does not answer is named with the reason, and the others are still
shown. In a lab, each node's liveness record is also read from the store (``Store.node_liveness``,
what ``lace get nodes`` shows as Ready): a node whose record expired — its agent dead, or cut
off from the store — is not ready and so not healthy, even when its agent still answers here. ``--wait`` asks again every half second until every node is healthy or ``--timeout`` runs
out, then prints the last answers.

Exit status: 0 every node answered and is healthy; 1 a node is unhealthy or did not answer;
2 bad command line (an unknown node, a bad timeout); 5 no lab running.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from lace.cli import fanout, render
from lace.cli.errors import UsageError
from lace.cli.invocation import Invocation
from lace.cli.node import status as node_status
from lace.cli.status import ExitStatus

DEFAULT_TIMEOUT = 60.0
#: how long one round waits for a node when not waiting for health
ANSWER_TIMEOUT = 30.0
POLL_INTERVAL = 0.5


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status", help="every node's health: agent, subsystems OK or failing with the reason, a cluster summary",
        description="Run `node status` on every node (or those named with --node) at once: agent version, store "
                    "watch, reconcile, IPAM, segments, policy, services, probes, datapath attach, flow collector, "
                    "MTU, map pressure and endpoints ready/total, then a summary. Exit 0: every node healthy; 1: a "
                    "node is unhealthy or did not answer; 2: bad input.")
    fanout.add_node_option(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also each loop's last success, last error and failures, every map's fill, every endpoint")
    p.add_argument("--wait", action="store_true", help="ask again until every node is healthy or --timeout runs out")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=None,
                   help=f"how long --wait waits (default {DEFAULT_TIMEOUT:g}); without --wait, how long a node "
                        f"may take to answer (default {ANSWER_TIMEOUT:g})")
    fanout.add_target_options(p)
    p.set_defaults(handler=run)


@dataclass
class NodeStatus(fanout.NodeDoc):
    """One node's status document, or why it did not give one; and whether the store holds its
    liveness record (None: not known — a cluster, or the store could not be read)."""

    live: bool | None = None

    @property
    def healthy(self) -> bool:
        return self.doc is not None and bool(self.doc.get("healthy")) and self.live is not False


def parse_result(o: fanout.NodeOutput) -> NodeStatus:
    """``node status -o json`` exits 0 or 1 with its document; anything else is an error line."""
    return fanout.parse_doc(o, "subsystems", what="node status", cls=NodeStatus)


def summary(results: list[NodeStatus]) -> str:
    """``3/3 nodes healthy`` / ``1/3 nodes healthy; worker-1: datapath failing; worker-2 did not answer: …``."""
    ok = [r for r in results if r.healthy]
    parts = [f"{len(ok)}/{len(results)} nodes healthy"]
    for r in results:
        expired = " (not ready: its liveness record expired)" if r.live is False else ""
        if r.doc is None:
            parts.append(f"{r.node} did not answer: {r.error}{expired}")
        elif not r.healthy:
            failing = [s["name"] for s in r.doc["subsystems"] if not s["ok"]]
            parts.append(f"{r.node}: {', '.join(failing) or 'unhealthy'} failing{expired}"
                         if failing or not expired else f"{r.node}: not ready: its liveness record expired")
        elif r.doc.get("warnings"):
            warned = [s["name"] for s in r.doc["subsystems"] if s.get("warning")]
            parts.append(f"{r.node}: {', '.join(warned)} warning")
    return "; ".join(parts)


def exit_status(results: list[NodeStatus]) -> ExitStatus:
    return ExitStatus.OK if results and all(r.healthy for r in results) else ExitStatus.ERROR


def report(results: list[NodeStatus], verbose: bool) -> str:
    out = []
    for r in results:
        if r.doc is None:
            out.append(f"{r.node}: did not answer: {r.error}\n" + (f"  hint: {r.hint}\n" if r.hint else ""))
        else:
            out.append(node_status.render(r.doc, verbose))
        if r.live is False:
            out.append(f"  NOT READY  the store holds no liveness record of {r.node}: other nodes and "
                       "`lace get nodes` see it as down\n")
    return "".join(out) + summary(results) + "\n"


def document(results: list[NodeStatus]) -> dict[str, Any]:
    return {"nodes": {r.node: r.doc for r in results if r.doc is not None},
            "unanswered": {r.node: {"error": r.error, "hint": r.hint} for r in results if r.doc is None},
            "healthy": [r.node for r in results if r.healthy],
            "live": {r.node: r.live for r in results if r.live is not None}, "summary": summary(results)}


def gather(args: argparse.Namespace, inv: Invocation, timeout: float) -> list[NodeStatus]:
    outs = fanout.run_nodes(args, inv, ["status", "-o", "json"], what="node status", timeout=timeout)
    results = [parse_result(o) for o in outs]
    live = _liveness(args, inv)
    if live is not None:
        for r in results:
            r.live = r.node in live
    return results


def _liveness(args: argparse.Namespace, inv: Invocation) -> set[str] | None:
    """The lab nodes whose liveness record the store holds; None on a cluster (the kubelet's
    Lease is the apiserver's business) or when the store cannot be read (each agent's own
    status then says whether it reaches the store)."""
    from lace.cli.commands.exec import target
    from lace.store.errors import StoreError
    if target(args, inv.env) == "kubernetes":
        return None
    try:
        return set(inv.store(args).node_liveness())
    except StoreError:
        return None


def run(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    if not args.wait:
        results = gather(args, inv, args.timeout or ANSWER_TIMEOUT)
    else:
        deadline = time.monotonic() + (args.timeout or DEFAULT_TIMEOUT)
        while True:
            left = deadline - time.monotonic()
            results = gather(args, inv, max(1.0, min(ANSWER_TIMEOUT, left)))
            if exit_status(results) == ExitStatus.OK or time.monotonic() + POLL_INTERVAL >= deadline:
                break
            time.sleep(POLL_INTERVAL)
    if args.output == "json":
        render.write_json(inv.stdout, document(results))
    else:
        inv.stdout.write(report(results, args.verbose))
    return exit_status(results)
