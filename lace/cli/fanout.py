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
import json
import subprocess
import threading
from dataclasses import dataclass
from typing import Any, TypeVar

from lace.cli import args as cli_args
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


T = TypeVar("T", bound="NodeDoc")


@dataclass
class NodeDoc:
    """One node's JSON document from a node command (``-o json``), or why it did not give one."""

    node: str
    doc: dict[str, Any] | None = None
    error: str | None = None
    hint: str | None = None


def parse_doc(o: NodeOutput, key: str, *, what: str, ok: tuple[int, ...] = (0, 1),
              cls: type[T] = NodeDoc) -> T:   # type: ignore[assignment]
    """``o`` as a ``cls``: with an exit status in ``ok``, one JSON object holding ``key``; else the
    ``error:``/``hint:`` lines the command printed (``WHAT exited RC without a report`` if none)."""
    if o.error is not None:
        return cls(o.node, error=o.error, hint=o.hint)
    if o.rc in ok:
        try:
            doc = json.loads(o.stdout)
            if isinstance(doc, dict) and key in doc:
                return cls(o.node, doc)
        except ValueError:
            pass
    err, hint = error_lines(o.stderr)
    if err is None:
        err = f"{what} exited {o.rc} without a report"
    return cls(o.node, error=err, hint=hint)


def add_node_option(p: argparse.ArgumentParser) -> None:
    """``--node NODE`` (repeatable): the nodes to ask, all when none."""
    p.add_argument("--node", dest="nodes", action="append", metavar="NODE", help="only this node (repeatable)")


def add_target_options(p: argparse.ArgumentParser) -> None:
    """``--context`` (a cluster's lace-node pods) or ``--lab``, and ``-o json``."""
    p.add_argument("--context", default=None, metavar="CONTEXT",
                   help="kubeconfig context: the cluster's lace-node pods instead of a lab")
    cli_args.add_lab_option(p)
    cli_args.add_output_option(p, ("json",))


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


def spawn(node: Any, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``cmd`` in lab node ``node`` (its network namespace and host cgroup, joined in the child
    between fork and exec), stdin closed, stdout and stderr piped. OSError/SubprocessError when it
    cannot start (a SubprocessError: entering the namespace or the cgroup failed in the child)."""
    from lace.lab import topology
    return subprocess.Popen(cmd, preexec_fn=topology.entering(node.netns, node.cgroup), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


#: the hint for a node that did not answer in time (``{node}``: its name)
STUCK_HINT = "is its agent stuck? lace lab restart-agent {node}"


def wait_all(procs: dict[str, subprocess.Popen[bytes] | NodeOutput], timeout: float,
             timeout_hint: str | None = STUCK_HINT) -> dict[str, NodeOutput]:
    """Each process's answer, waited for together (up to ``timeout`` each; one still running then is
    killed and answers ``no answer within …``). A :class:`NodeOutput` in ``procs`` (a process that
    could not start) is its own answer."""
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
                                       hint=timeout_hint.format(node=name) if timeout_hint else None)

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
    return results


def run_lab_nodes(inv: Invocation, ctx: Any, lab: Any, nodes: list[str], argv: list[str], *, what: str,
                  timeout: float, timeout_hint: str | None = STUCK_HINT) -> list[NodeOutput]:
    """``node ARGV`` on the lab nodes ``nodes`` (of ``lab_nodes``), in that order."""
    from lace.cli.commands.exec import _node_executable, lab_env

    procs: dict[str, subprocess.Popen[bytes] | NodeOutput] = {}
    for n in (lab.node(name) for name in nodes):   # spawned from this thread, waited for together
        try:
            procs[n.name] = spawn(n, _node_executable() + argv,
                                  lab_env(dict(inv.env, NO_COLOR="1"), str(ctx.dir), n))
        except (OSError, subprocess.SubprocessError) as exc:
            procs[n.name] = NodeOutput(n.name, error=f"cannot run {what} in {n.name}: {exc}",
                                       hint=f"check that {n.netns} exists (lace lab status)")
    results = wait_all(procs, timeout, timeout_hint)
    return [results[n] for n in nodes]


def run_lab(args: argparse.Namespace, inv: Invocation, argv: list[str], *, what: str,
            timeout: float) -> list[NodeOutput]:
    """``node ARGV`` on the lab nodes ``args.nodes`` (all when None), in the nodes' order."""
    ctx, lab = lab_nodes(args, inv)
    nodes = pick_nodes(getattr(args, "nodes", None), [n.name for n in lab.nodes])
    return run_lab_nodes(inv, ctx, lab, nodes, argv, what=what, timeout=timeout)


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
