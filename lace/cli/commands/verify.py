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
import io
import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from lace.cli import args as cli_args
from lace.cli import render
from lace.cli.errors import UnavailableError, UsageError
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
    p.add_argument("--node", dest="nodes", action="append", metavar="NODE", help="only this node (repeatable)")
    p.add_argument("--repair", action="store_true", help="ask each agent to reprogram, then verify again")
    p.add_argument("--map", dest="maps", action="append", metavar="NAME",
                   help="audit only this map (repeatable): " + ", ".join(node_verify.AUDITED))
    p.add_argument("-n", "--numeric", action="store_true", help="raw IDs and addresses, no names")
    p.add_argument("--limit", type=int, metavar="N", default=None, help="show at most N entries per map")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=DEFAULT_TIMEOUT,
                   help=f"how long to wait for a node (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--context", default=None, metavar="CONTEXT",
                   help="kubeconfig context: the cluster's lace-node pods instead of a lab")
    cli_args.add_lab_option(p)
    cli_args.add_output_option(p, ("json",))
    p.set_defaults(handler=run)


@dataclass
class NodeResult:
    """What one node's ``node verify -o json`` gave: its document, or why it did not answer."""

    node: str
    doc: dict[str, Any] | None = None
    error: str | None = None
    hint: str | None = None
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
    if rc in (0, 1):
        try:
            doc = json.loads(stdout)
            if isinstance(doc, dict) and "maps" in doc:
                return NodeResult(node, doc)
        except ValueError:
            pass
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    err = next((ln[len("error: "):] for ln in lines if ln.startswith("error: ")), None)
    hint = next((ln[len("hint: "):] for ln in lines if ln.startswith("hint: ")), None)
    if err is None:
        err = lines[-1] if lines else f"node verify exited {rc} without a report"
    return NodeResult(node, error=err, hint=hint)


# ---- running it on the nodes -------------------------------------------------------------------------

def run_lab(args: argparse.Namespace, inv: Invocation) -> list[NodeResult]:
    from lace import netlink
    from lace.cli.commands.exec import _node_executable, lab_env
    from lace.lab import topology

    ctx = inv.lab(args)
    lab = topology.load(ctx.name, state_dir=str(ctx.dir))
    if lab is None:
        raise UnavailableError(f'lab "{ctx.name}" is not running (its namespaces are gone)',
                               hint=f"lace lab up --name {ctx.name}")
    known = [n.name for n in lab.nodes]
    nodes = pick_nodes(args.nodes, known)
    from pyroute2.netns import setns   # imported here, not in the forked children
    argv = node_argv(args)
    procs: dict[str, subprocess.Popen[bytes] | NodeResult] = {}
    # spawned one after the other from this thread (the children enter the node's namespace and
    # cgroup between fork and exec), then waited for together
    for n in (lab.node(name) for name in nodes):
        path = netlink.netns.path(n.netns)
        cgroup = n.cgroup if n.cgroup and os.path.isdir(n.cgroup) else None

        def enter(path: str = path, cgroup: str | None = cgroup) -> None:
            setns(path)
            if cgroup is not None:
                topology.join_cgroup(cgroup)
        try:
            procs[n.name] = subprocess.Popen(_node_executable() + argv, preexec_fn=enter,
                                             env=lab_env(dict(inv.env, NO_COLOR="1"), str(ctx.dir), n),
                                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE)
        except (OSError, subprocess.SubprocessError) as exc:
            procs[n.name] = NodeResult(n.name, error=f"cannot run node verify in {n.name}: {exc}",
                                       hint=f"check that {n.netns} exists (lace lab status)")
    results: dict[str, NodeResult] = {}

    def wait(name: str, p: subprocess.Popen[bytes]) -> None:
        try:
            out, err = p.communicate(timeout=args.timeout)
            results[name] = parse_result(name, p.returncode, out.decode(errors="replace"),
                                         err.decode(errors="replace"))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            results[name] = NodeResult(name, error=f"no answer within {args.timeout:g}s",
                                       hint=f"is its agent stuck? lace lab restart-agent {name}")

    threads = []
    for name, p in procs.items():
        if isinstance(p, NodeResult):
            results[name] = p
            continue
        t = threading.Thread(target=wait, args=(name, p), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return [results[n] for n in nodes]


def run_kubernetes(args: argparse.Namespace, inv: Invocation, *, core: Any = None,
                   stream_fn: Any = None) -> list[NodeResult]:
    """The same through each node's lace-node pod (``lace exec --context``)."""
    from lace.cli.commands.exec import exec_kubernetes
    from lace.cli.errors import CliError
    if core is None:
        try:
            from kubernetes import client, config
            config.load_kube_config(context=args.context)
            core = client.CoreV1Api()
        except ImportError:
            raise UnavailableError("the kubernetes client is not installed") from None
        except Exception as exc:   # the client raises several types: one line
            raise UnavailableError(f"cannot load the kubeconfig: {exc}", hint="check KUBECONFIG / --context") from None
    try:
        known = [n.metadata.name for n in core.list_node().items]
    except Exception as exc:
        raise UnavailableError(f"cannot list the cluster's nodes: {exc}") from None
    nodes = pick_nodes(args.nodes, known)
    results: dict[str, NodeResult] = {}

    def one(name: str) -> None:
        out, err = io.StringIO(), io.StringIO()
        sub = Invocation(inv.env, io.StringIO(""), out, err)
        try:
            rc = exec_kubernetes(name, ["node", *node_argv(args)], sub, core=core, stream_fn=stream_fn)
        except CliError as exc:
            results[name] = NodeResult(name, error=exc.message, hint=exc.hint)
            return
        results[name] = parse_result(name, rc, out.getvalue(), err.getvalue())

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.timeout)
    return [results.get(n) or NodeResult(n, error=f"no answer within {args.timeout:g}s") for n in nodes]


def pick_nodes(wanted: list[str] | None, known: list[str]) -> list[str]:
    """``--node`` names, checked against the cluster's nodes (all of them when none is given)."""
    if not wanted:
        return list(known)
    bad = [n for n in wanted if n not in known]
    if bad:
        raise UsageError(f'no node "{bad[0]}" in this cluster', hint="nodes: " + ", ".join(known))
    return list(dict.fromkeys(wanted))


# ---- the report ------------------------------------------------------------------------------------

def cluster_summary(results: list[NodeResult]) -> str:
    """``2/3 nodes clean; worker-1: 3 entries drift; worker-2 did not answer: …``."""
    clean = [r for r in results if r.doc is not None and node_verify.drift_count(r.doc.get("maps") or {}) == 0]
    parts = [f"{len(clean)}/{len(results)} nodes clean"]
    for r in results:
        if r.doc is None:
            parts.append(f"{r.node} did not answer: {r.error}")
        elif r not in clean:
            n = node_verify.drift_count(r.doc.get("maps") or {})
            parts.append(f"{r.node}: {render.plural(n, 'entries')} {'drifts' if n == 1 else 'drift'}")
    return "; ".join(parts)


def status(results: list[NodeResult]) -> ExitStatus:
    ok = all(r.doc is not None and node_verify.drift_count(r.doc.get("maps") or {}) == 0 for r in results)
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
            "clean": [r.node for r in results if r.doc is not None
                      and node_verify.drift_count(r.doc.get("maps") or {}) == 0],
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
