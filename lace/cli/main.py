"""The ``lace`` CLI entry: ``main(argv, env) -> ExitStatus``, callable in-process (tests do)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn, TextIO

from lace.cli.args import build_parser
from lace.cli.commands import command_modules
from lace.cli.invocation import Invocation, run_command
from lace.cli.status import ExitStatus, exit_with


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, *,
         stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> ExitStatus | int:
    """Run one lace command; errors are printed as ``error: ...`` lines, never as tracebacks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    env = os.environ if env is None else env
    inv = Invocation(env, stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    return run_command(inv, lambda: build_parser(command_modules()), argv)


def entry() -> NoReturn:
    """Console script ``lace``."""
    exit_with(main(sys.argv[1:], os.environ))
