"""``lace connectivity test [--test REGEX] [--junit FILE] [--namespace NS]``: deploy the test's own
pods across the nodes, run the named scenarios (lace.cli.connectivity.scenarios), report each as it
finishes, and remove everything again — also when interrupted (SIGINT, SIGTERM).

A scenario fails when its check did not get the answer it must get (or got through where it must
not), or when a node recorded a drop during it whose reason the scenario does not expect; the
flows seen are printed for each failure. Scenarios needing something the cluster lacks are
reported as ``skipped: needs X``.

Exit status: 0 every scenario run passed; 1 one failed (or the deployment failed); 2 bad command
line (a --test pattern that is no regex or matches nothing, a --namespace that does not exist);
5 no lab running; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

from lace.cli import args as cli_args
from lace.cli.errors import CliError, UnavailableError, UsageError
from lace.cli.invocation import Invocation
from lace.cli.status import ExitStatus


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "connectivity", help="run connectivity scenarios against the cluster (lace connectivity test)",
        description="Connectivity checks with the test's own pods.")
    sub = p.add_subparsers(dest="connectivity_command", metavar="SUBCOMMAND", parser_class=type(p))
    t = sub.add_parser(
        "test", help="deploy test pods, run the scenarios, report pass/fail with the flows of each failure",
        description="Deploy test pods across the nodes (in a namespace of their own), run the named scenarios — "
                    "pod to pod on one node and across nodes (IPv4/IPv6, TCP/UDP), pod and node to a Service, "
                    "pod to the outside with and without masquerade, DNS, host to pod and kubelet probes, a "
                    "datagram at the full pod MTU, network isolation, policy allow/deny/audit — and remove "
                    "everything afterwards. A scenario fails on a wrong answer or on any drop whose reason it "
                    "does not expect. Exit 0: all passed; 1: a scenario failed.")
    t.add_argument("--test", dest="patterns", action="append", metavar="REGEX",
                   help="run only the scenarios whose name matches (repeatable; re.search)")
    t.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML to FILE")
    t.add_argument("--namespace", metavar="NS",
                   help="deploy into this existing namespace (default: a new lace-connectivity-<random>)")
    t.add_argument("--list", action="store_true", help="list the scenarios (after --test) and exit")
    t.add_argument("--parallel", type=int, default=6, metavar="N", help="checks run at once (default 6)")
    t.add_argument("--timeout", type=float, default=90.0, metavar="SECONDS",
                   help="how long the deployment may take to become ready (default 90)")
    cli_args.add_lab_option(t)
    t.set_defaults(handler=run_test)
    p.set_defaults(handler=lambda a, inv: (_ for _ in ()).throw(
        UsageError("say what to do: lace connectivity test")))


class _Terminated(BaseException):
    """SIGTERM during the run: handled like Ctrl-C (clean up, exit 130)."""


@contextlib.contextmanager
def _signals() -> Iterator[dict[str, bool]]:
    """SIGINT and SIGTERM stop the run (KeyboardInterrupt / _Terminated) so that ``finally`` cleans
    up; while cleaning up, further signals are only noted. Only in the main thread (else a no-op)."""
    state = {"cleaning": False, "again": False}
    try:
        old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        yield state
        return

    def handler(signum: int, frame: Any) -> None:
        if state["cleaning"]:
            state["again"] = True
            return
        raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated()
    try:
        for sig in old:
            signal.signal(sig, handler)
    except ValueError:   # not the main thread
        yield state
        return
    try:
        yield state
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _flow_line(f: dict[str, Any]) -> str:
    from lace.cli.node.resolve import make_resolver
    from lace.cli.node.trace import line
    return line(f, make_resolver(False, lambda: None))


class _Report:
    """One line per scenario as it finishes (colour on a terminal), details under each failure."""

    def __init__(self, inv: Invocation, total: int) -> None:
        self.inv = inv
        self.tty = inv.color(inv.stdout)
        self.console = inv.console()
        self.start = time.monotonic()
        self.total = total
        self.done = 0
        self.status: Any = None

    def note(self, msg: str) -> None:
        self.console.print(f"[{time.monotonic() - self.start:5.1f}s] {msg}", markup=False)

    def begin(self) -> None:
        if self.tty:
            self.status = self.console.status(f"running {self.total} scenarios …")
            self.status.start()

    def end(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def __call__(self, r: Any) -> None:
        from lace.cli.connectivity.judge import FAIL, PASS
        self.done += 1
        word = {PASS: "PASS", FAIL: "FAIL"}.get(r.status, "SKIP")
        style = {PASS: "green", FAIL: "bold red"}.get(r.status, "yellow")
        when = f"[{time.monotonic() - self.start:5.1f}s]"
        from rich.text import Text
        text = Text(f"{when} ")
        text.append(f"{word:4}", style=style if self.tty else None)
        text.append(f"  {r.scenario.name}")
        if r.status == PASS:
            text.append(f"  ({r.duration:.2f}s)", style="dim" if self.tty else None)
        elif r.status == FAIL:
            text.append(f"  {r.message}")
        else:
            text.append(f"  {r.message}")
        self.console.print(text)
        if r.status == FAIL:
            self.console.print(f"        {r.scenario.description}", markup=False)
            if r.output.strip():
                for ln in r.output.strip().splitlines()[-5:]:
                    self.console.print(f"        | {ln}", markup=False)
            self.console.print(f"        flows seen ({len(r.flows)}):" if r.flows else "        flows seen: none",
                               markup=False)
            for f in r.flows[-20:]:
                self.console.print(f"          {_flow_line(f)}", markup=False)
        if self.status is not None:
            self.status.update(f"{self.done}/{self.total} scenarios done …")


def run_test(args: argparse.Namespace, inv: Invocation) -> ExitStatus:
    from lace.cli.connectivity import scenarios as S
    from lace.cli.connectivity.judge import FAIL, PASS, SKIP
    try:
        chosen = S.select(args.patterns)
    except S.BadPattern as exc:
        raise UsageError(str(exc), hint="scenario names: lace connectivity test --list") from None
    if args.parallel < 1:
        raise UsageError("--parallel must be 1 or more")
    if args.junit:
        d = os.path.dirname(os.path.abspath(args.junit))
        if not os.path.isdir(d):
            raise UsageError(f"--junit {args.junit}: directory {d} does not exist")
    if args.list:
        for s in chosen:
            inv.stdout.write(f"{s.name:48} {s.description}\n")
        return ExitStatus.OK
    from lace.cli.connectivity.runner import DeployError, Runner
    from lace.lab import topology
    from lace.store import NotFound
    ctx = inv.lab(args)
    lab = topology.load(ctx.name, state_dir=str(ctx.dir))
    if lab is None:
        raise UnavailableError(f'lab "{ctx.name}" is not running', hint=f"lace lab up --name {ctx.name}")
    store = inv.store(args)
    if args.namespace:
        try:
            store.get("namespaces", args.namespace)
        except NotFound:
            raise UsageError(f'namespace "{args.namespace}" does not exist',
                             hint="create it first, or leave out --namespace") from None
    report = _Report(inv, len(chosen))
    runner = Runner(store, lab, str(ctx.dir), namespace=args.namespace, parallel=args.parallel,
                    deploy_timeout=args.timeout, progress=report.note)
    results: list[Any] = []
    started = time.monotonic()
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    deploy_error = None
    with _signals() as sig:
        try:
            try:
                runner.deploy(chosen)
            except DeployError as exc:
                deploy_error = str(exc)
            if deploy_error is None:
                report.begin()
                try:
                    results = runner.run(chosen, report)
                finally:
                    report.end()
        except (KeyboardInterrupt, _Terminated):
            report.end()
            sig["cleaning"] = True
            inv.stderr.write("interrupted: removing the test's objects\n")
            problems = runner.cleanup()
            for p in problems:
                inv.stderr.write(f"warning: not removed: {p}\n")
            return ExitStatus.INTERRUPTED
        finally:
            sig["cleaning"] = True
            problems = runner.cleanup()
            for p in problems:
                inv.stderr.write(f"warning: not removed: {p}\n")
    elapsed = time.monotonic() - started
    if deploy_error is not None:
        raise CliError(f"the test's pods did not become ready: {deploy_error}",
                       hint="lace get pods -n " + runner.ns + " (while it runs), lace lab status")
    passed = sum(r.status == PASS for r in results)
    failed = [r for r in results if r.status == FAIL]
    skipped = sum(r.status == SKIP for r in results)
    summary = f"{passed} passed, {len(failed)} failed, {skipped} skipped in {elapsed:.1f}s"
    if failed:
        inv.stdout.write("\nfailed:\n" + "".join(f"  {r.scenario.name}: {r.message}\n" for r in failed))
    inv.stdout.write(summary + "\n")
    if args.junit:
        from lace.cli.connectivity import junit
        junit.write(args.junit, junit.to_xml(results, duration=elapsed, timestamp=stamp, hostname=socket.gethostname(),
                                             properties={"lab": ctx.name, "namespace": runner.ns},
                                             flow_text=_flow_line))
    return ExitStatus.ERROR if failed else ExitStatus.OK
