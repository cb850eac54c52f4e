"""Table cells are data: text that looks like rich markup prints as it is."""

from __future__ import annotations

import io

from rich.console import Console

from lace.cli import render


def test_bracketed_ipv6_endpoints_survive_the_table() -> None:
    out = io.StringIO()
    render.node_table(Console(file=out, width=200), ["BACKEND"], [["[fd00:10:244::2]:80 (alpha/web-2)"], ["[bold]x"]])
    assert "[fd00:10:244::2]:80 (alpha/web-2)" in out.getvalue()
    assert "[bold]x" in out.getvalue()
