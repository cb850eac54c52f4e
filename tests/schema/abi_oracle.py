"""Oracles for the schema tests: bpftool's view of the compiled objects' BTF, and clang's view of the headers.

The oracles are bpftool and clang, which know nothing of the Python mirrors; only the Layout
class is imported here, to find the mirrors.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest


REPO = Path(__file__).resolve().parents[2]
ABI_DIR = REPO / "bpf" / "include" / "lace" / "abi"
HEADERS = sorted(ABI_DIR.glob("*.h"))

# enum bpf_map_type (include/uapi/linux/bpf.h); stable kernel ABI, spelled as libbpf names them
MAP_TYPE_NAMES = {
    1: "hash", 2: "array", 3: "prog_array", 4: "perf_event_array", 5: "percpu_hash",
    6: "percpu_array", 9: "lru_hash", 10: "lru_percpu_hash", 11: "lpm_trie", 12: "array_of_maps",
    13: "hash_of_maps", 27: "ringbuf",
}  # fmt: skip
LIBBPF_PIN_BY_NAME = 1

_QUALIFIERS = {"TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"}


def tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if path is None:
        pytest.fail(f"{name} not found: the schema tests need it (`make system-packages` installs it)")
    return path


@dataclass(frozen=True)
class MapSpec:
    """A map definition as the BTF of the .maps section encodes it."""

    name: str
    type: int | None
    max_entries: int | None
    map_flags: int
    pinning: int
    key: int | None  # BTF type id of the key (``__type(key, T)``)
    value: int | None
    key_size: int | None  # ``__uint(key_size, N)`` form
    value_size: int | None


class BTF:
    """The BTF of one object file, as ``bpftool btf dump ... format raw -j`` prints it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        out = subprocess.run(
            [tool("bpftool"), "btf", "dump", "file", str(path), "format", "raw", "-j"],
            check=True, capture_output=True, text=True,
        ).stdout
        self.types: dict[int, dict[str, Any]] = {t["id"]: t for t in json.loads(out)["types"]}

    def named(self, kind: str, name: str) -> dict[str, Any] | None:
        found = [t for t in self.types.values() if t["kind"] == kind and t.get("name") == name]
        # clang emits one definition per type; a forward declaration has kind FWD
        return found[0] if found else None

    def strip(self, tid: int) -> dict[str, Any]:
        t = self.types[tid]
        while t["kind"] in _QUALIFIERS:
            t = self.types[t["type_id"]]
        return t

    def typedefs(self, tid: int) -> list[str]:
        """Names of the typedefs on the way from ``tid`` to the underlying type."""
        names = []
        t = self.types[tid]
        while t["kind"] in _QUALIFIERS:
            if t["kind"] == "TYPEDEF":
                names.append(t["name"])
            t = self.types[t["type_id"]]
        return names

    def size(self, tid: int) -> int:
        t = self.strip(tid)
        if t["kind"] == "ARRAY":
            return int(t["nr_elems"]) * self.size(t["type_id"])
        if t["kind"] == "PTR":
            return 8
        return int(t["size"])

    def spelling(self, tid: int) -> str:
        """How C spells the type: ``__u32``, ``struct lace_route``, ``__u8[16]``."""
        t = self.types[tid]
        if t["kind"] == "TYPEDEF":
            return str(t["name"])
        if t["kind"] in _QUALIFIERS:
            return self.spelling(t["type_id"])
        if t["kind"] in ("STRUCT", "UNION", "ENUM"):
            return f"{t['kind'].lower()} {t['name']}"
        if t["kind"] == "ARRAY":
            return f"{self.spelling(t['type_id'])}[{t['nr_elems']}]"
        return str(t.get("name", t["kind"]))

    def field_kind(self, tid: int) -> str:
        """The lace.bpf.layout kind a member of this type must be mirrored with."""
        td = self.typedefs(tid)
        for be in ("__be16", "__be32", "__be64"):
            if be in td:
                return be.strip("_")
        t = self.strip(tid)
        if t["kind"] == "ARRAY":
            elem = self.strip(t["type_id"])
            if elem["kind"] == "INT" and elem["size"] == 1:
                return f"bytes:{t['nr_elems']}"
            return f"array:{self.spelling(tid)}"
        if t["kind"] == "INT":
            signed = t.get("encoding") == "SIGNED" and t["name"] not in ("char",)
            return f"{'s' if signed else 'u'}{8 * t['size']}"
        if t["kind"] == "ENUM":
            return f"u{8 * t['size']}"
        return self.spelling(tid)

    def struct_fields(self, name: str) -> tuple[int, list[tuple[str, str, int, int]]] | None:
        """(size, [(member, kind, byte offset, byte size)]) of ``struct name``, or None if absent."""
        t = self.named("STRUCT", name)
        if t is None:
            return None
        fields = []
        for m in t["members"]:
            if m.get("bitfield_size"):
                fields.append((m["name"], f"bitfield:{m['bitfield_size']}", m["bits_offset"] // 8, 0))
                continue
            fields.append((m["name"], self.field_kind(m["type_id"]), m["bits_offset"] // 8, self.size(m["type_id"])))
        return int(t["size"]), fields

    def enum_values(self, name: str) -> dict[str, int] | None:
        t = self.named("ENUM", name) or self.named("ENUM64", name)
        if t is None:
            return None
        return {v["name"]: int(v["val"]) for v in t["values"]}

    def maps(self) -> dict[str, MapSpec]:
        """Every map in the .maps section, decoded from libbpf's BTF-defined map convention:
        ``__uint(x, N)`` is ``int (*x)[N]`` and ``__type(x, T)`` is ``T *x``."""
        sec = next((t for t in self.types.values() if t["kind"] == "DATASEC" and t["name"] == ".maps"), None)
        out: dict[str, MapSpec] = {}
        for v in sec["vars"] if sec else []:
            var = self.types[v["type_id"]]
            members = {m["name"]: m["type_id"] for m in self.strip(var["type_id"])["members"]}

            def uint(field: str) -> int | None:
                if field not in members:
                    return None
                ptr = self.strip(members[field])
                return int(self.strip(ptr["type_id"])["nr_elems"])

            def typ(field: str) -> int | None:
                return self.strip(members[field])["type_id"] if field in members else None

            out[var["name"]] = MapSpec(
                name=var["name"], type=uint("type"), max_entries=uint("max_entries"),
                map_flags=uint("map_flags") or 0, pinning=uint("pinning") or 0,
                key=typ("key"), value=typ("value"), key_size=uint("key_size"), value_size=uint("value_size"),
            )
        return out


# --- the headers, compiled on their own --------------------------------------------------------

PROBE_TYPES = """typedef unsigned char __u8; typedef unsigned short __u16; typedef unsigned int __u32;
typedef unsigned long long __u64; typedef __u16 __be16; typedef __u32 __be32;
"""
_ENUM_DEF = re.compile(r"\benum\s+(lace_\w+)\s*\{")
_MACRO_DEF = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(LACE_[A-Za-z0-9_]+)(?![A-Za-z0-9_(])", re.M)
_GUARD = re.compile(r"^LACE_ABI_\w+_H$")


def header_enums(header: Path) -> list[str]:
    return _ENUM_DEF.findall(header.read_text())


def header_macros(header: Path) -> list[str]:
    """Object-like LACE_* macros the header defines (include guards excluded)."""
    return [m for m in _MACRO_DEF.findall(header.read_text()) if not _GUARD.match(m)]


def iter_layouts() -> Iterator[tuple[str, str, Any]]:
    """(module, attribute, Layout) for every layout in lace.datapath."""
    import importlib
    import pkgutil

    import lace.datapath
    from lace.bpf.layout import Layout

    seen: set[int] = set()
    for info in sorted(pkgutil.iter_modules(lace.datapath.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"lace.datapath.{info.name}")
        for attr, obj in sorted(vars(mod).items()):
            if isinstance(obj, Layout) and id(obj) not in seen:  # re-exports count once
                seen.add(id(obj))
                yield info.name, attr, obj


def probe_source() -> str:
    """A C file including every ABI header and declaring one global of each enum, so that its
    compiled BTF holds every enum the headers define (programs only carry the ones they use)."""
    src = [PROBE_TYPES] + [f'#include "lace/abi/{h.name}"' for h in HEADERS]
    for h in HEADERS:
        src += [f"enum {e} __probe_{e};" for e in header_enums(h)]
    return "\n".join(src) + "\n"
