"""The ``lace`` CLI entry: ``main(argv, env) -> ExitStatus``, callable in-process (tests do)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn, TextIO

from lace.cli.args import HelpShown, build_parser
from lace.cli.commands import command_modules
from lace.cli.errors import CliError, from_store_error
from lace.cli.invocation import Invocation
from lace.cli.render import print_error, print_unexpected
from lace.cli.status import ExitStatus, exit_with
from lace.store.errors import StoreError


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, *,
         stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> ExitStatus | int:
    """Run one lace command; errors are printed as ``error: ...`` lines, never as tracebacks."""
    argv = sys.argv[1:] if argv is None else list(argv)
    env = os.environ if env is None else env
    inv = Invocation(env, stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr)
    try:
        parser = build_parser(command_modules())
        with contextlib.redirect_stdout(inv.stdout):
            args = parser.parse_args(argv)
        handler = getattr(args, "handler", None)
        if handler is None:
            inv.stdout.write(parser.format_help())
            return ExitStatus.USAGE
        rc = handler(args, inv)
        # commands that run something else (lab exec) pass its exit status through unchanged
        return rc if isinstance(rc, ExitStatus) or rc not in set(ExitStatus) else ExitStatus(rc)
    except HelpShown:
        return ExitStatus.OK
    except CliError as err:
        print_error(inv.stderr, err.message, err.hint)
        return err.status
    except StoreError as err:
        cli_err = from_store_error(err)
        print_error(inv.stderr, cli_err.message, cli_err.hint)
        return cli_err.status
    except KeyboardInterrupt:
        inv.stderr.write("interrupted\n")
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        return ExitStatus.ERROR
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        print_unexpected(inv.stderr, err, env)
        return ExitStatus.ERROR
    finally:
        inv.close()


def entry() -> NoReturn:
    """Console script ``lace``."""
    exit_with(main(sys.argv[1:], os.environ))
