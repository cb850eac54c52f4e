"""The ``node`` command: what one node's data plane holds and decides (docs/troubleshooting/node-state.md).

``main(argv, env) -> ExitStatus`` like ``lace``'s own entry, callable in-process.  Run it inside
the node (``lace exec --node NODE -- node ...``); it reads the pinned maps directly, so it works
with the agent down, and resolves IDs to names through the store unless ``-n/--numeric``.

    node bpf show MAP        node ct list|gc TABLE      node trace flow      node device list
    node verify [--repair]   (drift audit, through the agent)
    node endpoint list       (local endpoints: veth entry, delivery, program)
    node status [--verbose]  (the agent's subsystems, OK or failing with the reason)
    node metrics             (the agent's Prometheus metrics)

``-n/--numeric``, ``--limit N`` and ``-o json`` apply to every command, before or after it.

Startup matters (``node ct list all -o json`` on a million entries has a budget of about a
second): only the command group named on the command line is imported.  The CLI's shared modules
(``lace.cli.args``, ``errors``, ``invocation``, ``render``) import cheaply; rich, YAML and the SQLite
store load only on the paths that draw a table, write YAML or resolve names.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn, TextIO

from lace.cli.args import ArgumentParser
from lace.cli.invocation import Invocation, run_command
from lace.cli.status import ExitStatus, exit_with

#: command group -> module of this package that registers it
GROUPS = {"bpf": "bpf", "ct": "ct", "trace": "trace", "device": "device", "verify": "verify",
          "endpoint": "endpoint", "status": "status", "metrics": "metrics"}


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return n


def add_common(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """-n, --limit and -o: on the top level with defaults, on every leaf without (so either place works)."""
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    p.add_argument("-n", "--numeric", action="store_true", default=d(False),
                   help="raw IDs and addresses; never contacts the store / API server")
    p.add_argument("--limit", type=_positive, metavar="N", default=d(None), help="show at most N entries")
    p.add_argument("-o", "--output", choices=("json",), default=d(None),
                   help="json: one JSON document (default: a table)")


def _group_of(argv: Sequence[str]) -> str | None:
    """The command group argv names (skipping the common options before it), if it names one."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--limit", "-o", "--output"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return a if a in GROUPS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> ArgumentParser:
    """The parser; with ``argv`` naming a command group, only that group's module is imported
    (``node --help``, no group or an unknown one: all of them)."""
    group = _group_of(argv) if argv is not None else None
    names = [GROUPS[group]] if group else list(GROUPS.values())
    parser = ArgumentParser(prog="node", description="Inspect this node's lace data plane.")
    add_common(parser, top=True)
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", parser_class=ArgumentParser)
    for name in names:  # device imports pyroute2 lazily too
        importlib.import_module(f"lace.cli.node.{name}").register(sub, add_common)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, *,
         stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> ExitStatus:
    """Run one node command; errors are ``error: ...`` lines with a hint, never tracebacks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    env = os.environ if env is None else env
    inv = Invocation(env, stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    return ExitStatus(run_command(inv, lambda: build_parser(argv), argv))


def entry() -> NoReturn:
    """Console script ``node``."""
    # No node command does linear algebra: one BLAS thread spares NumPy's import (which starts a
    # thread per core) ~50 ms; set before the command's modules import NumPy, never overriding a user's
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    exit_with(main(sys.argv[1:], os.environ))


if __name__ == "__main__":
    entry()
