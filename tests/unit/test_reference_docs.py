"""The generated reference pages (docs/reference/cli.md and maps.md) match lace's definitions.

tools/gen_cli_reference.py writes them from the argparse definitions (lace/cli/) and the map
registry (lace/datapath/registry.py); a command, flag, help text or map changed without running it
fails here, naming the command that brings the pages up to date.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gen_cli_reference  # noqa: E402

REGENERATE = "run `.venv/bin/python tools/gen_cli_reference.py` and commit docs/reference/"


def _committed(name: str) -> str:
    path = os.path.join(gen_cli_reference.OUT_DIR, name)
    assert os.path.exists(path), f"{path} is missing: {REGENERATE}"
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_cli_reference_is_up_to_date() -> None:
    assert _committed("cli.md") == gen_cli_reference.render_cli(), \
        f"docs/reference/cli.md differs from the argparse definitions: {REGENERATE}"


def test_maps_reference_is_up_to_date() -> None:
    assert _committed("maps.md") == gen_cli_reference.render_maps(), \
        f"docs/reference/maps.md differs from lace/datapath/registry.py: {REGENERATE}"


def test_generation_is_deterministic() -> None:
    assert gen_cli_reference.render_cli() == gen_cli_reference.render_cli()
    assert gen_cli_reference.render_maps() == gen_cli_reference.render_maps()


def test_check_mode_reports_a_stale_page(tmp_path) -> None:
    assert gen_cli_reference.main(["--out", str(tmp_path)]) == 0
    assert gen_cli_reference.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "maps.md").write_text("stale\n", encoding="utf-8")
    assert gen_cli_reference.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_command_and_map_is_in_the_pages() -> None:
    from lace.datapath import registry

    cli = gen_cli_reference.render_cli()
    for command in ("lace get", "lace exec", "lace lab up", "lace observe", "lace verify", "node bpf show",
                    "node ct list", "node ct gc", "node trace flow", "node device list", "node verify",
                    "node endpoint list", "node status", "node metrics"):
        assert f"`{command}`" in cli, command
    for flag in ("`-n, --numeric`", "`--limit N`", "`--endpoints`", "`--egress`", "`--ingress`"):
        assert flag in cli, flag
    maps = gen_cli_reference.render_maps()
    for m in registry.MAPS.values():
        assert f"| `{m.cli_name}` | `{m.pin_name}` |" in maps, m.cli_name
