#!/usr/bin/env python3.11
"""Generate lace/datapath/reasons.py from the drop-reason and trace-point tables.

The tables in bpf/include/lace/abi/*.def are the single source of both the C enums (expanded by
reasons.h) and the Python enums the CLI, metrics and flow stream print from.  This script runs
before the virtualenv exists, so it uses the standard library only, and its output depends on the
tables alone (no timestamps, no paths outside the repository), so ``--check`` can compare it
byte for byte.

    python3.11 tools/gen_enums.py           # (re)write lace/datapath/reasons.py
    python3.11 tools/gen_enums.py --check   # exit 1 if the file on disk is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ABI = Path("bpf/include/lace/abi")
DROP_DEF = ABI / "drop_reasons.def"
TRACE_DEF = ABI / "trace_points.def"
OUTPUT = Path("lace/datapath/reasons.py")

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = r'"((?:[^"\\\n]|\\.)*)"'
# LACE_X(...) is a live entry, LACE_X_RESERVED(...) one whose code is taken but nothing emits yet
_DROP = re.compile(r"LACE_DROP(_RESERVED)?\(\s*([A-Z][A-Z0-9_]*)\s*,\s*(\d+)\s*,\s*" + _STRING + r"\s*\)")
_TRACE = re.compile(
    r"LACE_TRACE_POINT(_RESERVED)?\(\s*([A-Z][A-Z0-9_]*)\s*,\s*(\d+)\s*,\s*" + _STRING + r"\s*,\s*"
    + _STRING + r"\s*\)"
)
_LABEL = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class TableError(Exception):
    """A .def table is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Entry:
    name: str
    code: int
    label: str
    text: str
    reserved: bool = False


def _unescape(s: str) -> str:
    # The tables hold plain C string literals; only \" and \\ are meaningful here.
    return re.sub(r"\\(.)", r"\1", s)


def _parse(path: Path, pattern: re.Pattern[str], macro: str, has_label: bool) -> list[Entry]:
    text = _COMMENT.sub(" ", (ROOT / path).read_text(encoding="utf-8"))
    entries: list[Entry] = []
    for m in pattern.finditer(text):
        reserved, name, code = bool(m.group(1)), m.group(2), int(m.group(3))
        if has_label:
            label, desc = _unescape(m.group(4)), _unescape(m.group(5))
        else:
            label, desc = name.lower().replace("_", "-"), _unescape(m.group(4))
        entries.append(Entry(name, code, label, desc, reserved))
    # Anything that is neither a comment nor a well-formed entry is an error, not silently dropped.
    leftover = pattern.sub(" ", text).strip()
    if leftover:
        raise TableError(f"{path}: cannot parse {leftover.splitlines()[0][:80]!r} (expected {macro}(...))")
    if not entries:
        raise TableError(f"{path}: no {macro} entries")
    for attr in ("name", "code", "label"):
        seen: dict[object, Entry] = {}
        for e in entries:
            key = getattr(e, attr)
            if key in seen:
                raise TableError(f"{path}: duplicate {attr} {key!r} ({seen[key].name} and {e.name})")
            seen[key] = e
    for e in entries:
        if not _LABEL.match(e.label):
            raise TableError(f"{path}: label {e.label!r} of {e.name} is not kebab-case")
    return entries


def _enum(cls: str, doc: str, entries: list[Entry], what: str, noun: str) -> list[str]:
    lines = [f"class {cls}(enum.IntEnum):", f'    """{doc}"""', ""]
    lines += [f"    {e.name} = {e.code}" for e in entries]
    lines += [
        "",
        "    @property",
        "    def label(self) -> str:",
        f'        """The kebab-case name the CLI shows and accepts, e.g. {entries[1].label!r}."""',
        f"        return _{what}_LABEL[self.value]",
        "",
        "    @property",
        "    def text(self) -> str:",
        '        """A one-line description for humans."""',
        f"        return _{what}_TEXT[self.value]",
        "",
        "    @property",
        "    def reserved(self) -> bool:",
        '        """True for a code taken for a feature that does not exist yet: nothing emits it."""',
        f"        return self.value in _{what}_RESERVED",
        "",
        "    @classmethod",
        f'    def from_label(cls, label: str) -> "{cls}":',
        '        """The member named ``label`` (its label or NAME, any case); ValueError if none."""',
        '        wanted = label.strip().lower().replace("_", "-")',
        "        for member in cls:",
        '            if wanted in (member.label, member.name.lower().replace("_", "-")):',
        "                return member",
        f'        raise ValueError(f"unknown {noun} {{label!r}}")',
        "",
        "",
    ]
    lines += [f"_{what}_LABEL: dict[int, str] = {{"]
    lines += [f"    {e.code}: {e.label!r}," for e in entries]
    lines += ["}", "", f"_{what}_TEXT: dict[int, str] = {{"]
    lines += [f"    {e.code}: {e.text!r}," for e in entries]
    lines += ["}", ""]
    reserved = ", ".join(str(e.code) for e in entries if e.reserved)
    lines += [f"_{what}_RESERVED: frozenset[int] = frozenset({{{reserved}}})" if reserved
              else f"_{what}_RESERVED: frozenset[int] = frozenset()", ""]
    return lines


def render() -> str:
    drops = _parse(DROP_DEF, _DROP, "LACE_DROP", has_label=False)
    points = _parse(TRACE_DEF, _TRACE, "LACE_TRACE_POINT", has_label=True)
    lines = [
        f"# generated by tools/gen_enums.py from {DROP_DEF.as_posix()} and {TRACE_DEF.as_posix()}"
        " — do not edit",
        f"# Regenerate with `make gen`; tests/schema checks these against enum lace_drop_reason and",
        f"# enum lace_trace_point in the compiled BTF.",
        '"""Drop reasons and trace points of the datapath (C: lace/abi/reasons.h), generated."""',
        "",
        "from __future__ import annotations",
        "",
        "import enum",
        "",
        '__all__ = ["DropReason", "TracePoint"]',
        "",
        "",
    ]
    lines += _enum("DropReason", "Why the datapath dropped a packet (C: enum lace_drop_reason, LACE_DROP_*).",
                   drops, "DROP", "drop reason")
    lines += [""]
    lines += _enum("TracePoint", "Where a trace event was observed (C: enum lace_trace_point, LACE_POINT_*).",
                   points, "POINT", "trace point")
    lines += [
        "",
        "#: C macro -> Python value (reasons.h defines none); tests/schema checks the mirrors.",
        "C_MACROS: dict[str, int] = {}",
        "#: C enum -> (Python enum, prefix of the C enumerator names)",
        "C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {",
        '    "lace_drop_reason": (DropReason, "LACE_DROP_"),',
        '    "lace_trace_point": (TracePoint, "LACE_POINT_"),',
        "}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help=f"do not write; exit 1 if {OUTPUT} differs from what would be generated")
    args = parser.parse_args(argv)
    try:
        content = render()
    except (TableError, OSError) as e:
        print(f"gen_enums: {e}", file=sys.stderr)
        return 2
    out = ROOT / OUTPUT
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else None
        if current != content:
            print(f"gen_enums: {OUTPUT} is out of date with {DROP_DEF} / {TRACE_DEF}; run `make gen`",
                  file=sys.stderr)
            return 1
        return 0
    if out.exists() and out.read_text(encoding="utf-8") == content:
        out.touch()  # up to date: only refresh the mtime, so make sees the target as built
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".py.tmp")
    tmp.write_text(content, encoding="utf-8")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
