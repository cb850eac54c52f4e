"""``lace lab up|down|status|exec|restart-agent|restart-kubelet|restart-controllers``: a real multi-node lace
cluster on one machine."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from lace.cli import args as cli_args
from lace.cli.context import clear_current, current_lab, lab_context, set_current
from lace.cli.errors import CliError, NotFoundError, UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus

DEFAULT_LAB = "lace"


def register(subparsers: Any) -> None:
    lab = subparsers.add_parser("lab", help="bring up, inspect and tear down a local lab cluster",
                                description="A lace cluster made of network namespaces on this machine: "
                                            "one per node and pod, an underlay fabric and an outside world.")
    sub = lab.add_subparsers(dest="lab_command", metavar="SUBCOMMAND", parser_class=type(lab))
    p = sub.add_parser("up", help="build a lab and start its agents")
    p.add_argument("--name", default=None, help=f"lab name (default: {DEFAULT_LAB})")
    p.add_argument("--nodes", type=int, default=3, help="number of nodes (default: 3)")
    p.add_argument("--store", choices=("sqlite", "etcd"), default="sqlite",
                   help="the cluster's store: the embedded SQLite file (default), or a 3-member etcd "
                        "cluster on the first three nodes")
    p.add_argument("--kubernetes", action="store_true",
                   help="a real Kubernetes: the upstream control plane, a containerd and a kubelet on every "
                        "node (make upstream builds them), lace installed by its Helm chart; the store is "
                        "the apiserver")
    p.set_defaults(handler=run_up)
    p = sub.add_parser("down", help="remove everything a lab created (safe to run twice)")
    p.add_argument("--name", default=None, help="lab name (default: the selected lab)")
    cli_args.add_lab_option(p)
    p.set_defaults(handler=run_down)
    p = sub.add_parser("status", help="nodes, namespaces, underlay, locators, agents")
    cli_args.add_lab_option(p)
    p.add_argument("-o", "--output", choices=("json",), default=None)
    p.set_defaults(handler=run_status)
    p = sub.add_parser("exec", help="run a command inside a pod's network namespace",
                       description="Run CMD inside NAMESPACE/POD's network namespace, with the pod's "
                                   "resolv.conf as /etc/resolv.conf; its exit status is returned.")
    cli_args.add_lab_option(p)
    p.add_argument("pod", metavar="NAMESPACE/POD")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(handler=run_exec)
    p = sub.add_parser("kubectl", help="the real kubectl against a lab on Kubernetes (lab up --kubernetes)",
                       description="Run kubectl ARGS with the lab's admin kubeconfig, inside the control "
                                   "plane's namespace (the only place its apiserver answers); its exit status "
                                   "is returned.")
    cli_args.add_lab_option(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- ARGS ...")
    p.set_defaults(handler=run_kubectl)
    p = sub.add_parser("restart-agent", help="restart a node's agent (--kill: SIGKILL, as a crash)")
    cli_args.add_lab_option(p)
    p.add_argument("node")
    p.add_argument("--kill", action="store_true", help="kill -9 instead of a clean stop")
    p.set_defaults(handler=run_restart_agent)
    p = sub.add_parser("restart-kubelet", help="restart the lab's kubelet (--kill: SIGKILL, as a crash)")
    cli_args.add_lab_option(p)
    p.add_argument("--kill", action="store_true", help="kill -9 instead of a clean stop")
    p.set_defaults(handler=run_restart_kubelet)
    p = sub.add_parser("restart-controllers", help="restart the lab's controllers (EndpointSlices)")
    cli_args.add_lab_option(p)
    p.set_defaults(handler=run_restart_controllers)
    lab.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(UsageError(
        "say what to do: lace lab up|down|status|exec|kubectl|restart-agent|restart-kubelet|restart-controllers")))


def _selected(args: argparse.Namespace, inv: Invocation, explicit: str | None = None) -> str:
    name = explicit or getattr(args, "lab", None) or inv.env.get("LACE_LAB") or current_lab(inv.env)
    if not name:
        raise UnavailableError("no lab is running", hint="run `lace lab up`")
    return name


def _progress(inv: Invocation):
    start = time.monotonic()

    def show(msg: str) -> None:
        inv.stderr.write(f"[{time.monotonic() - start:5.1f}s] {msg}\n")
        inv.stderr.flush()
    return show


def run_up(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import cluster, topology
    name = args.name or DEFAULT_LAB
    ctx = lab_context(name, inv.env)
    try:
        topology.LabSpec(name=name, nodes=args.nodes).validate()
    except (ValueError, topology.LabError) as e:
        raise UsageError(str(e)) from None
    if args.kubernetes and args.store != "sqlite":
        raise UsageError("--kubernetes and --store go apart: a Kubernetes lab's store is its apiserver",
                         hint="drop --store")
    show = _progress(inv)
    show(f'bringing up lab "{name}" with {args.nodes} nodes' + (" on Kubernetes" if args.kubernetes else ""))
    try:
        if args.kubernetes:
            from lace.lab.kube import cluster as kube_cluster
            lab = kube_cluster.up(name, args.nodes, str(ctx.dir), progress=show)
        else:
            lab = cluster.up(name, args.nodes, str(ctx.dir), progress=show, store=args.store)
    except (cluster.LabError, topology.LabError) as e:
        raise CliError(str(e), hint=f"`lace lab down --name {name}` removes a broken lab") from None
    set_current(name, inv.env)
    show(f'lab "{name}" is up: {", ".join(n.name for n in lab.nodes)}')
    inv.stdout.write(f"lab {name} is up. Try:\n"
                     f"  lace lab status\n  lace apply -f examples/demo.yaml\n  lace get pods -A -o wide\n")
    return ExitStatus.OK


def run_kubectl(args: argparse.Namespace, inv: Invocation) -> int:
    from lace import nsenter
    from lace.store.config import lab_store
    name = _selected(args, inv)
    store = lab_store(lab_context(name, inv.env).dir)
    if store.backend != "k8s":
        raise UsageError(f'lab "{name}" does not run Kubernetes', hint="bring one up with `lace lab up --kubernetes`")
    from lace.lab.kube.upstream import MissingBinary, binary
    try:
        kubectl = binary("kubectl")
    except MissingBinary as e:
        raise UnavailableError(str(e)) from None
    cmd = list(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    argv = [kubectl, f"--kubeconfig={store.kubeconfig}", *cmd]
    fd = os.open(nsenter.path_of(store.netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        res = subprocess.run(argv, preexec_fn=lambda: nsenter.setns(fd), pass_fds=(fd,),
                             stdin=None if inv.stdin is sys.stdin else subprocess.DEVNULL,
                             capture_output=not (inv.stdout is sys.stdout and inv.stderr is sys.stderr))
    finally:
        os.close(fd)
    if res.stdout is not None:
        inv.stdout.write(res.stdout.decode(errors="replace"))
        inv.stderr.write(res.stderr.decode(errors="replace"))
    return res.returncode


def run_down(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import cluster
    name = _selected(args, inv, args.name)
    ctx = lab_context(name, inv.env)
    cluster.down(name, str(ctx.dir))
    clear_current(name, inv.env)
    inv.stdout.write(f"lab {name} is down\n")
    return ExitStatus.OK


def run_status(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import cluster
    name = _selected(args, inv)
    try:
        st = cluster.status(name, str(lab_context(name, inv.env).dir))
    except cluster.LabError as e:
        raise NotFoundError(str(e), hint="run `lace lab up`") from None
    if args.output == "json":
        inv.stdout.write(json.dumps(st, indent=2) + "\n")
        return ExitStatus.OK
    from rich.table import Table
    t = Table(title=f"lab {name}", box=None, pad_edge=False)
    for col in ("NODE", "NETNS", "UNDERLAY", "LOCATOR", "AGENT PID", "AGENT", "ENDPOINTS"):
        t.add_column(col)
    for n in st["nodes"]:
        t.add_row(n["name"], n["netns"], n["underlay"], n["locator"], str(n["agentPid"] or "-"), n["agent"],
                  "-" if n["endpoints"] is None else str(n["endpoints"]))
    con = inv.console()
    con.print(t)
    con.print(f"fabric {st['fabric']}   outside {st['outside']}   kubelet pid {st['kubeletPid'] or '-'}"
              f"   controllers pid {st.get('controllersPid') or '-'}   dns feeder pid {st.get('dnsFeederPid') or '-'}")
    store = st.get("store") or {}
    kube = st.get("kubernetes")
    if kube:
        pids = kube["processes"]
        con.print(f"kubernetes: control plane in {kube['netns']}, kubeconfig {kube['kubeconfig']}")
        con.print("  " + "   ".join(f"{p.removeprefix('k8s-')} pid {pid or 'down'}" for p, pid in sorted(pids.items())
                                   if p.startswith("k8s-")))
        for n in st["nodes"]:
            node = n["name"]
            con.print(f"  {node}: " + "   ".join(f"{what} pid {pids.get(what + '-' + node) or 'down'}"
                                               for what in ("containerd", "kubelet")))
    if store.get("backend") == "etcd":
        members = "   ".join(f"{m} pid {pid or '-'}" for m, pid in sorted((store.get("members") or {}).items()))
        con.print(f"store etcd: {members}")
    healthy = all(n["agent"] == "healthy" for n in st["nodes"])
    return ExitStatus.OK if healthy else ExitStatus.UNAVAILABLE


def run_exec(args: argparse.Namespace, inv: Invocation) -> ExitStatus | int:
    from lace import netlink
    from lace.lab import cluster
    from lace.lab.mountns import PrivateFile
    name = _selected(args, inv)
    ns, sep, pod = args.pod.partition("/")
    if not sep or not ns or not pod:
        raise UsageError(f'"{args.pod}" is not NAMESPACE/POD', hint="e.g. lace lab exec default/web -- curl ...")
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("say what to run after --", hint=f"lace lab exec {args.pod} -- ip addr")
    try:
        rec = cluster.pod_sandbox(str(lab_context(name, inv.env).dir), ns, pod)
    except cluster.LabError as e:
        raise NotFoundError(str(e)) from None
    path = netlink.netns.path(rec["netns"])
    # the pod's resolv.conf over /etc/resolv.conf, in a mount namespace of the command's own
    private = PrivateFile(rec["resolv_conf"]) if rec.get("resolv_conf") else None

    def enter() -> None:
        from pyroute2.netns import setns
        setns(path)
        if private is not None:
            private.enter()
    # a terminal's streams go straight to the command; in-process callers (tests) get its output
    io_kw: dict[str, Any] = {}
    if inv.stdin is not sys.stdin:
        io_kw["input"] = inv.stdin.read().encode()
    if inv.stdout is not sys.stdout:
        io_kw["capture_output"] = True
    try:
        res = subprocess.run(cmd, preexec_fn=enter, **io_kw)
    except FileNotFoundError:
        raise NotFoundError(f"command not found in pod {args.pod}: {cmd[0]}") from None
    except subprocess.SubprocessError:
        raise CliError(f"cannot enter pod {args.pod}: joining its network namespace or mounting its "
                       f"resolv.conf ({rec.get('resolv_conf')}) failed",
                       hint=f"`lace get pod {pod} -n {ns}` shows whether it still runs") from None
    if inv.stdout is not sys.stdout:
        inv.stdout.write(res.stdout.decode(errors="replace"))
        inv.stderr.write(res.stderr.decode(errors="replace"))
    return res.returncode


def run_restart_agent(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import cluster
    name = _selected(args, inv)
    try:
        pid = cluster.restart_agent(name, str(lab_context(name, inv.env).dir), args.node, kill=args.kill)
    except cluster.LabError as e:
        raise NotFoundError(str(e)) from None
    inv.stdout.write(f"agent on {args.node} restarted (pid {pid})\n")
    return ExitStatus.OK


def run_restart_kubelet(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import cluster, procs
    name = _selected(args, inv)
    try:
        pid = cluster.restart_kubelet(name, str(lab_context(name, inv.env).dir), kill=args.kill)
    except cluster.LabError as e:
        raise NotFoundError(str(e), hint="run `lace lab up`") from None
    except procs.ProcError as e:
        raise CliError(str(e)) from None
    inv.stdout.write(f"kubelet restarted (pid {pid})\n")
    return ExitStatus.OK


def run_restart_controllers(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.lab import controllers, procs, topology
    name = _selected(args, inv)
    state_dir = str(lab_context(name, inv.env).dir)
    if topology.load(name, state_dir=state_dir) is None:
        raise NotFoundError(f'lab "{name}" is not running', hint="run `lace lab up`")
    try:
        pid = controllers.restart(state_dir)
    except procs.ProcError as e:
        raise CliError(str(e)) from None
    inv.stdout.write(f"controllers restarted (pid {pid})\n")
    return ExitStatus.OK
