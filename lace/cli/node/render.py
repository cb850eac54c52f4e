"""Rendering for the ``node`` commands: rich tables with a count line at the end, ``-o json`` as one
document (orjson, no table decoration), human durations, and the empty-map message.

rich (and ``lace.cli.render``, which brings YAML and the store's kinds) is imported only when a
table is drawn: ``-o json`` never loads it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

import orjson

if TYPE_CHECKING:
    from rich.console import Console

NONE = "-"


def human_duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h5m``, ``3d4h`` (two units at most); negative durations are ``-3s``."""
    if seconds < 0:
        return "-" + human_duration(-seconds)
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s}s" if s else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def pressure(count: int, capacity: int) -> str:
    pct = 100.0 * count / capacity if capacity else 0.0
    return f"{count}/{capacity} entries ({pct:.1f}% full)"


def write_json(stream: TextIO, doc: Any) -> None:
    """One JSON document (indented for humans who page it; still one document)."""
    stream.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    stream.write("\n")
    stream.flush()


#: a cell left blank on purpose (the continuation rows of a multi-row entry)
BLANK = "\0"


def _cell(c: Any) -> str:
    if c is BLANK:
        return ""
    return NONE if c is None or c == "" else str(c)


def table(console: Console, headers: list[str], rows: list[list[Any]]) -> None:
    from lace.cli.render import render_table
    render_table(console, headers, [[_cell(c) for c in r] for r in rows])


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def plain_table(stream: TextIO, env: Any, headers: list[str], rows: list[list[Any]]) -> bool:
    """What :func:`table` prints when the output is not a terminal — left-aligned columns three
    spaces apart, trailing blanks trimmed — without importing rich (a small table should not cost
    a command like ``ct gc`` a tenth of a second).  False, and nothing written, when the output
    is a terminal, ``COLUMNS`` is set or a cell is not plain ASCII: then use :func:`table`."""
    if _isatty(stream) or env.get("COLUMNS"):
        return False
    cells = [list(headers)] + [[_cell(c) for c in r] for r in rows]
    if not all(c.isascii() and c.isprintable() for r in cells for c in r):
        return False
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if sum(widths) + 3 * len(widths) > 4096:  # the console width rich would wrap at
        return False
    stream.write("".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in cells))
    stream.flush()
    return True


def plural(n: int, noun: str) -> str:
    if n == 1 and noun.endswith("ies"):
        return f"1 {noun[:-3]}y"
    if n == 1 and noun.endswith("s"):
        return f"1 {noun[:-1]}"
    return f"{n} {noun}"


def count_line(console: Console, what: str, shown: int, total: int, capacity: int | None = None,
               noun: str = "entries", map_entries: int | None = None) -> None:
    """The line that ends every listing: how many, how many shown (--limit), and the map's
    pressure (entries/capacity) when it has one; ``map_entries`` when rows are not map entries."""
    text = plural(total, noun)
    if shown < total:
        text = f"showing {shown} of {text} (--limit)"
    if capacity:
        text += f", map {pressure(total if map_entries is None else map_entries, capacity)}"
    console.file.write(f"{what}: {text}\n")
    console.file.flush()


def empty(console: Console, what: str, capacity: int | None = None) -> None:
    cap = f" (capacity {capacity})" if capacity else ""
    console.file.write(f"{what} is empty{cap}\n")
    console.file.flush()
