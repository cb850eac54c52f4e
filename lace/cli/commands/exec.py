"""``lace exec --node NODE -- node ...``: run the node command where the node's data plane is.

In the lab: the ``node`` command runs on the node's host, as a process of the node's own: inside
that node's network namespace and its host cgroup (both joined in the child before exec; the
cgroup's socket hooks translate service addresses for it), with LACE_PIN_ROOT, LACE_STORE,
LACE_NODE and LACE_AGENT_SOCKET set; its stdout, stderr and exit status are passed through
unchanged. A lab built before nodes had host cgroups has none to join: the command runs in the
namespace alone.

On a Kubernetes cluster (no lab selected and a kubeconfig context given with ``--context`` or
KUBECONFIG, or LACE_TARGET=kubernetes): the equivalent of ``kubectl exec`` into the lace-node pod
on that node (``spec.nodeName``), through the
official Kubernetes client's ``stream`` API; output and exit status are returned. The pod is the
one deploy/ installs: label ``app.kubernetes.io/name=lace-node`` in lace's namespace (``lace-system``,
or ``--namespace`` for a chart installed elsewhere), container ``agent``, whose environment
(LACE_PIN_ROOT, LACE_STORE, LACE_NODE, LACE_AGENT_SOCKET) points the node command at the node's
pins, the cluster and the agent's socket.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from lace.cli import args as cli_args
from lace.cli.context import current_lab, lab_context
from lace.cli.errors import CliError, NotFoundError, UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus
from lace.store.config import lab_store

#: where deploy/ (the Helm chart's default namespace, the plain manifests) runs the lace-node pods
NODE_POD_NAMESPACE = "lace-system"
NODE_POD_SELECTOR = "app.kubernetes.io/name=lace-node"
NODE_CONTAINER = "agent"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "exec", help="run `node ...` inside a node (its lace-node pod, or its namespace in the lab)",
        description="Run the node-state command inside NODE: lace exec --node worker-3 -- node bpf show routing. "
                    "Flags for the node command (-n, --limit, -o json) go after --.")
    p.add_argument("--node", required=True, metavar="NODE", help="the node to run in")
    p.add_argument("--context", default=None, metavar="CONTEXT",
                   help="kubeconfig context: run in the cluster's lace-node pod instead of a lab")
    p.add_argument("--namespace", default=NODE_POD_NAMESPACE, metavar="NS",
                   help=f"on a cluster: the namespace lace is installed in (default {NODE_POD_NAMESPACE})")
    cli_args.add_lab_option(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- node ...")
    p.set_defaults(handler=run_exec)


def node_command(cmd: Sequence[str]) -> list[str]:
    """The command after ``--``; it must be the ``node`` command."""
    cmd = list(cmd[1:] if cmd[:1] == ["--"] else cmd)
    if not cmd:
        raise UsageError("say what to run after --", hint="lace exec --node NODE -- node bpf show routing")
    if cmd[0] != "node":
        raise UsageError(f'only the node command runs in a node, not "{cmd[0]}"',
                         hint="lace exec --node NODE -- node bpf show routing")
    return cmd


def target(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """``lab`` or ``kubernetes``: a selected lab wins; else a context/KUBECONFIG/LACE_TARGET selects a cluster."""
    if env.get("LACE_TARGET") == "kubernetes":
        return "kubernetes"
    lab_selected = getattr(args, "lab", None) or env.get("LACE_LAB")
    if lab_selected:
        return "lab"
    if args.context or (env.get("KUBECONFIG") and not current_lab(env)):
        return "kubernetes"
    return "lab"


def run_exec(args: argparse.Namespace, inv: Invocation) -> int:
    cmd = node_command(args.cmd)
    if target(args, inv.env) == "kubernetes":
        return exec_kubernetes(args.node, cmd, inv, context=args.context, namespace=args.namespace)
    name = getattr(args, "lab", None) or inv.env.get("LACE_LAB") or current_lab(inv.env)
    if name:
        store = lab_store(lab_context(name, inv.env).dir)
        if store.backend == "k8s":   # a lab on a real Kubernetes (lace lab up --kubernetes): its lace-node pod
            return exec_kubernetes(args.node, cmd, inv, kubeconfig=store.kubeconfig, netns=store.netns,
                                   namespace=args.namespace)
    return exec_lab(args, cmd, inv)


# ---- lab -----------------------------------------------------------------------------------------

def _node_executable() -> list[str]:
    """The ``node`` console script next to this interpreter, else ``python -m``-style entry."""
    script = os.path.join(os.path.dirname(sys.executable), "node")
    if os.access(script, os.X_OK):
        return [script]
    found = shutil.which("node")
    if found and os.path.dirname(found) == os.path.dirname(sys.executable):
        return [found]
    return [sys.executable, "-c", "from lace.cli.node.main import entry; entry()"]


def lab_env(env: Mapping[str, str], state_dir: str, node: Any) -> dict[str, str]:
    from lace.lab import cluster
    out = dict(env)
    # the command runs inside the node's namespace, which reaches the lab's etcd as its agent does
    out.update(LACE_PIN_ROOT=node.pin_root, LACE_STORE=str(lab_store(state_dir).without_netns()),
               LACE_NODE=node.name, LACE_AGENT_SOCKET=cluster.agent_socket(state_dir, node.name))
    return out


def exec_lab(args: argparse.Namespace, cmd: list[str], inv: Invocation) -> int:
    from lace.lab import topology
    name = getattr(args, "lab", None) or inv.env.get("LACE_LAB") or current_lab(inv.env)
    if not name:
        raise UnavailableError("no lab is running", hint="run `lace lab up`, or pass --context for a cluster")
    ctx = lab_context(name, inv.env)
    lab = topology.load(name, state_dir=str(ctx.dir))
    if lab is None:
        raise NotFoundError(f'lab "{name}" is not running', hint="run `lace lab up`")
    node = next((n for n in lab.nodes if n.name == args.node), None)
    if node is None:
        raise NotFoundError(f'lab "{name}" has no node "{args.node}"',
                            hint="nodes: " + ", ".join(n.name for n in lab.nodes))
    enter = topology.entering(node.netns, node.cgroup)
    argv = _node_executable() + cmd[1:]
    passthrough = inv.stdout is sys.stdout and inv.stderr is sys.stderr
    try:
        res = subprocess.run(argv, preexec_fn=enter, env=lab_env(inv.env, str(ctx.dir), node),
                             stdin=None if inv.stdin is sys.stdin else subprocess.DEVNULL,
                             capture_output=not passthrough)
    except (OSError, subprocess.SubprocessError) as exc:
        # a SubprocessError: entering the namespace or the cgroup failed in the child
        raise CliError(f"cannot run the node command in {args.node}: {exc}",
                       hint=f"check that {node.netns} and {node.cgroup or 'its cgroup'} exist "
                            "(lace lab status)") from None
    if not passthrough:
        inv.stdout.write(res.stdout.decode(errors="replace"))
        inv.stderr.write(res.stderr.decode(errors="replace"))
    return res.returncode


# ---- Kubernetes ------------------------------------------------------------------------------------

def find_node_pod(core: Any, node: str, namespace: str = NODE_POD_NAMESPACE) -> str:
    """The name of the running lace-node pod on ``node`` (CoreV1Api-like ``core``)."""
    pods = core.list_namespaced_pod(namespace, label_selector=NODE_POD_SELECTOR,
                                    field_selector=f"spec.nodeName={node}")
    items = [p for p in pods.items if getattr(p.spec, "node_name", None) == node]
    running = [p for p in items if getattr(p.status, "phase", None) == "Running"]
    if not running:
        raise NotFoundError(f"no running lace-node pod on node {node} "
                            f"(namespace {namespace}, label {NODE_POD_SELECTOR})",
                            hint=f"kubectl -n {namespace} get pods -l {NODE_POD_SELECTOR} -o wide; "
                                 "installed elsewhere? pass --namespace")
    return str(sorted(p.metadata.name for p in running)[0])


def exec_request(pod: str, cmd: list[str], namespace: str = NODE_POD_NAMESPACE) -> dict[str, Any]:
    """The keyword arguments of the ``connect_get_namespaced_pod_exec`` stream call."""
    return {"name": pod, "namespace": namespace, "container": NODE_CONTAINER, "command": cmd,
            "stderr": True, "stdin": False, "stdout": True, "tty": False, "_preload_content": False}


def exit_code(status: Any) -> int:
    """The exit status from the exec channel's status document (v1.Status)."""
    if not status:
        return 0
    if isinstance(status, str):
        import json
        status = json.loads(status)
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", 1))
    return 1


def exec_kubernetes(node: str, cmd: list[str], inv: Invocation, *, context: str | None = None,
                    kubeconfig: str | None = None, netns: str | None = None,
                    namespace: str = NODE_POD_NAMESPACE, core: Any = None, stream_fn: Any = None) -> int:
    """``kubectl exec`` of ``cmd`` into the lace-node pod on ``node``: its output and exit status.
    ``netns``: the apiserver is reached from that network namespace (a lab's control plane is only
    there); the exec stream's websocket is made there too, so the whole call runs inside it."""
    try:
        from kubernetes import client, config
        from kubernetes.stream import stream
    except ImportError:
        raise UnavailableError("the kubernetes client is not installed") from None
    if core is None:
        try:
            api = config.new_client_from_config(config_file=kubeconfig, context=context)
        except Exception as exc:  # the client raises several types: report one line
            raise UnavailableError(f"cannot load the kubeconfig{f' context {context}' if context else ''}: {exc}",
                                   hint="check KUBECONFIG / --context") from None
        core = client.CoreV1Api(api)
    stream_fn = stream_fn or stream
    from lace import nsenter
    try:
        with nsenter.entered(netns):
            return _exec_stream(core, stream_fn, node, cmd, inv, namespace)
    except nsenter.NetnsError as exc:
        raise UnavailableError(f"cannot reach the apiserver from network namespace {netns}: {exc.strerror}",
                               hint="is the lab up? lace lab status") from None


def _exec_stream(core: Any, stream_fn: Any, node: str, cmd: list[str], inv: Invocation, namespace: str) -> int:
    try:
        pod = find_node_pod(core, node, namespace)
        resp = stream_fn(core.connect_get_namespaced_pod_exec, **exec_request(pod, cmd, namespace))
        while resp.is_open():
            resp.update(timeout=1)
            if resp.peek_stdout():
                inv.stdout.write(resp.read_stdout())
            if resp.peek_stderr():
                inv.stderr.write(resp.read_stderr())
        inv.stdout.flush()
        from kubernetes.stream.ws_client import ERROR_CHANNEL
        status = resp.read_channel(ERROR_CHANNEL)
        resp.close()
    except CliError:
        raise
    except Exception as exc:
        raise UnavailableError(f"exec into the lace-node pod on {node} failed: {exc}") from None
    return exit_code(status)


_ = ExitStatus
