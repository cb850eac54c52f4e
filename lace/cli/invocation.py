"""One run of the CLI: its environment, streams and (lazily) the store of the selected lab.

Handlers receive ``(args, inv)``; tests pass their own streams to ``main`` and read them back.
rich and the SQLite store are imported when a console or the store is first asked for, so a
command that needs neither (``node ... -o json``) starts without them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from lace.cli.context import LabContext, resolve_lab
from lace.cli.status import ExitStatus

if TYPE_CHECKING:
    from rich.console import Console

    from lace.store import Store


@dataclasses.dataclass
class Invocation:
    """Environment and streams of one ``main`` call, plus the resources it opened."""

    env: Mapping[str, str]
    stdin: TextIO
    stdout: TextIO
    stderr: TextIO
    _store: Store | None = None

    def isatty(self, stream: TextIO) -> bool:
        try:
            return bool(stream.isatty())
        except (AttributeError, ValueError, io.UnsupportedOperation):
            return False

    def color(self, stream: TextIO) -> bool:
        """Colour only on a terminal, and never with NO_COLOR set."""
        return self.isatty(stream) and "NO_COLOR" not in self.env

    def console(self, stream: TextIO | None = None) -> Console:
        """A rich Console on ``stream`` (stdout): plain text unless it is a colour terminal."""
        from rich.console import Console
        stream = stream or self.stdout
        tty = self.color(stream)
        width = int(self.env.get("COLUMNS") or 0) or (None if tty else 4096)
        return Console(file=stream, force_terminal=tty, no_color=not tty, color_system="auto" if tty else None,
                       width=width, highlight=False, soft_wrap=True, emoji=False)

    def lab(self, args: Any) -> LabContext:
        return resolve_lab(args, self.env)

    def store(self, args: Any) -> Store:
        """The selected lab's store, opened once per invocation."""
        if self._store is None:
            from lace.store.config import open_store
            self._store = open_store(self.lab(args).store_config())
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def run_command(inv: Invocation, build_parser: Callable[[], argparse.ArgumentParser],
                argv: Sequence[str]) -> ExitStatus | int:
    """Parse ``argv`` and run its handler, for ``lace`` and ``node`` alike: every failure is an
    ``error: ...`` line (with a hint) and an exit status, never a traceback; ``inv`` is closed."""
    from lace.cli.args import HelpShown
    from lace.cli.errors import CliError, from_store_error
    from lace.cli.render import print_error, print_unexpected
    from lace.store.errors import StoreError
    try:
        parser = build_parser()
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
    except (CliError, StoreError) as err:
        cli_err = from_store_error(err) if isinstance(err, StoreError) else err
        print_error(inv.stderr, cli_err.message, cli_err.hint)
        return cli_err.status
    except KeyboardInterrupt:
        inv.stderr.write("interrupted\n")
        return ExitStatus.INTERRUPTED
    except BrokenPipeError:
        return ExitStatus.ERROR
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        print_unexpected(inv.stderr, err, inv.env)
        return ExitStatus.ERROR
    finally:
        inv.close()
