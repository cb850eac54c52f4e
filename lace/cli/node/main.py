"""The ``node`` command: what one node's data plane holds and decides (``spec/node-state.md``).

``main(argv, env) -> ExitStatus`` like ``lace``'s own entry, callable in-process.  Run it inside
the node (``lace exec --node NODE -- node ...``); it reads the pinned maps directly, so it works
with the agent down, and resolves IDs to names through the store unless ``-n/--numeric``.

    node bpf show MAP        node ct list|gc TABLE      node trace flow      node device list

``-n/--numeric``, ``--limit N`` and ``-o json`` apply to every command, before or after it.

Startup matters (``node ct list all -o json`` on a million entries has a budget of about a
second): only the command group named on the command line is imported, and the CLI's shared
modules that pull in rich, YAML or the store (``lace.cli.args``, ``errors``, ``invocation``,
``render``) are imported only on the paths that need them (errors, help, tables).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, TextIO

from lace.cli.status import ExitStatus

#: command group -> module of this package that registers it
GROUPS = {"bpf": "bpf", "ct": "ct", "trace": "trace", "device": "device"}


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return n


class ArgumentParser(argparse.ArgumentParser):
    """``lace.cli.args.ArgumentParser`` (UsageError instead of exiting, HelpShown after help),
    without importing it — and the store behind it — on the way to a successful command."""

    def error(self, message: str) -> NoReturn:
        from lace.cli.errors import UsageError
        raise UsageError(f"{self.prog}: {message}", hint=f"run `{self.prog} --help` for usage")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        from lace.cli.args import HelpShown
        from lace.cli.errors import UsageError
        if status:
            raise UsageError(message.strip() if message else f"{self.prog}: bad usage")
        raise HelpShown()


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
    import importlib
    group = _group_of(argv) if argv is not None else None
    names = [GROUPS[group]] if group else list(GROUPS.values())
    parser = ArgumentParser(prog="node", description="Inspect this node's lace data plane.")
    add_common(parser, top=True)
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", parser_class=ArgumentParser)
    for name in names:  # device imports pyroute2 lazily too
        importlib.import_module(f"lace.cli.node.{name}").register(sub, add_common)
    return parser


class NodeInvocation:
    """The ``Invocation`` handlers get: env and streams here, anything else (``console()``, the
    store, ...) from a real :class:`lace.cli.invocation.Invocation` made on first use, so a
    command that never asks for it never imports rich."""

    def __init__(self, env: Mapping[str, str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> None:
        self.env, self.stdin, self.stdout, self.stderr = env, stdin, stdout, stderr
        self._real: Any = None

    def _invocation(self) -> Any:
        if self._real is None:
            from lace.cli.invocation import Invocation
            self._real = Invocation(self.env, self.stdin, self.stdout, self.stderr)
        return self._real

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_real":
            raise AttributeError(name)
        return getattr(self._invocation(), name)

    def close(self) -> None:
        if self._real is not None:
            self._real.close()


def _loaded(module: str, name: str) -> Any:
    """``module.name`` if the module was imported (an exception of its class can only exist then)."""
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, *,
         stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> ExitStatus:
    """Run one node command; errors are ``error: ...`` lines with a hint, never tracebacks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    env = os.environ if env is None else env
    inv = NodeInvocation(env, stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    try:
        parser = build_parser(argv)
        with contextlib.redirect_stdout(inv.stdout):
            args = parser.parse_args(argv)
        handler: Any = getattr(args, "handler", None)
        if handler is None:
            inv.stdout.write(parser.format_help())
            return ExitStatus.USAGE
        return ExitStatus(handler(args, inv))
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        return ExitStatus.ERROR
    except Exception as err:  # noqa: BLE001 - the last line of defence
        help_shown, cli_error = _loaded("lace.cli.args", "HelpShown"), _loaded("lace.cli.errors", "CliError")
        if help_shown is not None and isinstance(err, help_shown):
            return ExitStatus.OK
        from lace.cli.render import print_error, print_unexpected
        if cli_error is not None and isinstance(err, cli_error):
            print_error(inv.stderr, err.message, err.hint)
            return err.status
        print_unexpected(inv.stderr, err, env)
        return ExitStatus.ERROR
    finally:
        inv.close()


def entry() -> NoReturn:
    """Console script ``node``."""
    status = main(sys.argv[1:], os.environ)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.exit(int(status))
