"""Run one ``node`` command on many nodes at once and collect each node's answer.

Where ``lace exec --node N -- node ...`` would run it: in the lab, inside each node's network
namespace and host cgroup (joined in the child between fork and exec); on a Kubernetes cluster, in
each node's lace-node pod through the official client's exec stream. The children are spawned one
after the other and waited for together, so N nodes take about as long as the slowest one.

Commands that report on the whole cluster (``lace verify``, ``lace status``, ``lace metrics``) build
on :func:`run_nodes`; each parses the raw answers (:class:`NodeOutput`) its own way.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import threading
from dataclasses import dataclass
from typing import Any

from lace.cli.errors import UnavailableError, UsageError
from lace.cli.invocation import Invocation


@dataclass
class NodeOutput:
    """One node's answer: the node command's exit status and output, or why it gave none."""

    node: str
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    hint: str | None = None


def pick_nodes(wanted: list[str] | None, known: list[str]) -> list[str]:
    """``--node`` names, checked against the cluster's nodes (all of them when none is given)."""
    if not wanted:
        return list(known)
    bad = [n for n in wanted if n not in known]
    if bad:
        raise UsageError(f'no node "{bad[0]}" in this cluster', hint="nodes: " + ", ".join(known))
    return list(dict.fromkeys(wanted))


def lab_nodes(args: argparse.Namespace, inv: Invocation) -> tuple[Any, Any]:
    """The selected lab's context and topology (UnavailableError when it is not running)."""
    from lace.lab import topology
    ctx = inv.lab(args)
    lab = topology.load(ctx.name, state_dir=str(ctx.dir))
    if lab is None:
        raise UnavailableError(f'lab "{ctx.name}" is not running (its namespaces are gone)',
                               hint=f"lace lab up --name {ctx.name}")
    return ctx, lab


def run_lab(args: argparse.Namespace, inv: Invocation, argv: list[str], *, what: str,
            timeout: float) -> list[NodeOutput]:
    """``node ARGV`` on the lab nodes ``args.nodes`` (all when None), in the nodes' order."""
    from lace import netlink
    from lace.cli.commands.exec import _node_executable, lab_env
    from lace.lab import topology

    ctx, lab = lab_nodes(args, inv)
    nodes = pick_nodes(getattr(args, "nodes", None), [n.name for n in lab.nodes])
    from pyroute2.netns import setns   # imported here, not in the forked children
    procs: dict[str, subprocess.Popen[bytes] | NodeOutput] = {}
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
            procs[n.name] = NodeOutput(n.name, error=f"cannot run {what} in {n.name}: {exc}",
                                       hint=f"check that {n.netns} exists (lace lab status)")
    results: dict[str, NodeOutput] = {}

    def wait(name: str, p: subprocess.Popen[bytes]) -> None:
        try:
            out, err = p.communicate(timeout=timeout)
            results[name] = NodeOutput(name, p.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            results[name] = NodeOutput(name, error=f"no answer within {timeout:g}s",
                                       hint=f"is its agent stuck? lace lab restart-agent {name}")

    threads = []
    for name, p in procs.items():
        if isinstance(p, NodeOutput):
            results[name] = p
            continue
        t = threading.Thread(target=wait, args=(name, p), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return [results[n] for n in nodes]


def kube_core(context: str | None) -> Any:
    """A CoreV1Api for the kubeconfig context (UnavailableError when there is none)."""
    try:
        from kubernetes import client, config
        config.load_kube_config(context=context)
        return client.CoreV1Api()
    except ImportError:
        raise UnavailableError("the kubernetes client is not installed") from None
    except Exception as exc:   # the client raises several types: one line
        raise UnavailableError(f"cannot load the kubeconfig: {exc}", hint="check KUBECONFIG / --context") from None


def run_kubernetes(args: argparse.Namespace, inv: Invocation, argv: list[str], *, timeout: float,
                   core: Any = None, stream_fn: Any = None) -> list[NodeOutput]:
    """``node ARGV`` in each node's lace-node pod (``lace exec --context``)."""
    from lace.cli.commands.exec import exec_kubernetes
    from lace.cli.errors import CliError
    if core is None:
        core = kube_core(getattr(args, "context", None))
    try:
        known = [n.metadata.name for n in core.list_node().items]
    except Exception as exc:
        raise UnavailableError(f"cannot list the cluster's nodes: {exc}") from None
    nodes = pick_nodes(getattr(args, "nodes", None), known)
    results: dict[str, NodeOutput] = {}

    def one(name: str) -> None:
        out, err = io.StringIO(), io.StringIO()
        sub = Invocation(inv.env, io.StringIO(""), out, err)
        try:
            rc = exec_kubernetes(name, ["node", *argv], sub, core=core, stream_fn=stream_fn)
        except CliError as exc:
            results[name] = NodeOutput(name, error=exc.message, hint=exc.hint)
            return
        results[name] = NodeOutput(name, rc, out.getvalue(), err.getvalue())

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return [results.get(n) or NodeOutput(n, error=f"no answer within {timeout:g}s") for n in nodes]


def run_nodes(args: argparse.Namespace, inv: Invocation, argv: list[str], *, what: str,
              timeout: float) -> list[NodeOutput]:
    """``node ARGV`` on every selected node of the lab or cluster ``args`` targets."""
    from lace.cli.commands.exec import target
    if target(args, inv.env) == "kubernetes":
        return run_kubernetes(args, inv, argv, timeout=timeout)
    return run_lab(args, inv, argv, what=what, timeout=timeout)


def error_lines(stderr: str) -> tuple[str | None, str | None]:
    """The ``error:`` and ``hint:`` lines a node command printed, if any."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    err = next((ln[len("error: "):] for ln in lines if ln.startswith("error: ")), None)
    hint = next((ln[len("hint: "):] for ln in lines if ln.startswith("hint: ")), None)
    if err is None and lines:
        err = lines[-1]
    return err, hint
