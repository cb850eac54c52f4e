"""One run of the CLI: its environment, streams and (lazily) the store of the selected lab.

Handlers receive ``(args, inv)``; tests pass their own streams to ``main`` and read them back.
rich and the SQLite store are imported when a console or the store is first asked for, so a
command that needs neither (``node ... -o json``) starts without them.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from lace.cli.context import LabContext, resolve_lab

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
            from lace.store import SqliteStore
            self._store = SqliteStore(self.lab(args).store_path)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
