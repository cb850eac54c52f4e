"""The Python mirrors (lace/datapath) against the compiled datapath: structs, maps, enums, constants.

Oracles: bpftool's dump of the BTF in build/bpf/*.o (the objects `make bpf` builds), and clang's
preprocessing/compilation of the ABI headers on their own.  No root and no kernel needed.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys

import pytest

from abi_oracle import (
    ABI_DIR,
    HEADERS,
    LIBBPF_PIN_BY_NAME,
    MAP_TYPE_NAMES,
    REPO,
    BTF,
    header_enums,
    header_macros,
    iter_layouts,
)
from lace.bpf.layout import Layout
from lace.datapath import registry

LAYOUTS = list(iter_layouts())
STRUCT_LAYOUTS = [(m, a, lay) for m, a, lay in LAYOUTS if lay.c_name.startswith("struct ")]


def _layout_fields(layout: Layout) -> list[tuple[str, str, int, int]]:
    return [
        (f.name, f"{f.kind}:{f.size}" if f.kind in ("bytes", "pad") else f.kind, f.offset, f.size)
        for f in layout.fields
    ]


def _find_struct(objects: dict[str, BTF], name: str) -> tuple[int, list[tuple[str, str, int, int]]]:
    found = {obj: btf.struct_fields(name) for obj, btf in objects.items()}
    present = {obj: v for obj, v in found.items() if v is not None}
    if not present:
        pytest.fail(f"struct {name} is in none of {sorted(objects)}: the datapath must use it (a map key/value, "
                    f"a ring buffer record) so its BTF is emitted")
    first = next(iter(present.values()))
    for obj, v in present.items():
        assert v == first, f"struct {name} differs between objects ({obj})"
    return first


# --- structs -------------------------------------------------------------------------------------


def test_every_header_struct_has_a_mirror() -> None:
    mirrored = {lay.c_name for _, _, lay in STRUCT_LAYOUTS}
    declared = {f"struct {s}" for h in HEADERS for s in re.findall(r"^struct\s+(lace_\w+)\s*\{", h.read_text(), re.M)}
    assert declared - mirrored == set(), "structs in the ABI headers without a Layout in lace/datapath"
    assert mirrored - declared == set(), "Layouts naming structs the ABI headers do not declare"


def test_layout_names_are_unique() -> None:
    names = [lay.c_name for _, _, lay in STRUCT_LAYOUTS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("module", "attr", "layout"), STRUCT_LAYOUTS, ids=[f"{m}.{a}" for m, a, _ in STRUCT_LAYOUTS])
def test_layout_matches_btf(objects: dict[str, BTF], module: str, attr: str, layout: Layout) -> None:
    name = layout.c_name.removeprefix("struct ")
    assert re.fullmatch(r"lace_\w+", name), f"{layout.c_name}: mirrors must name a struct lace_*"
    size, fields = _find_struct(objects, name)
    assert _layout_fields(layout) == fields, f"lace.datapath.{module}.{attr} vs {layout.c_name} in BTF"
    assert layout.size == size


@pytest.mark.parametrize(("module", "attr", "layout"), LAYOUTS, ids=[f"{m}.{a}" for m, a, _ in LAYOUTS])
def test_layout_spells_out_its_padding(module: str, attr: str, layout: Layout) -> None:
    # every byte belongs to a named field: no implicit holes, no tail padding (STYLE principle 3)
    end = 0
    for f in layout.fields:
        assert f.offset == end, f"{layout.c_name}: hole before {f.name}"
        end = f.offset + f.size
    assert end == layout.size, f"{layout.c_name}: {layout.size - end} bytes of tail padding"
    assert not any(f.is_padding for f in layout.fields), "reserved bytes are named like the C field"


def test_layout_in_the_module_of_its_header() -> None:
    for module, _attr, layout in STRUCT_LAYOUTS:
        header = ABI_DIR / f"{module}.h"
        name = layout.c_name.removeprefix("struct ")
        assert re.search(rf"^struct\s+{name}\s*\{{", header.read_text(), re.M), (
            f"{layout.c_name} is mirrored in lace/datapath/{module}.py but not declared in {header.name}"
        )


# --- maps ----------------------------------------------------------------------------------------


def _key_value_spelling(btf: BTF, tid: int | None) -> str | None:
    return None if tid is None else btf.spelling(tid)


@pytest.mark.parametrize("mapdef", list(registry.MAPS.values()), ids=list(registry.MAPS))
def test_map_matches_btf(objects: dict[str, BTF], mapdef: registry.MapDef) -> None:
    assert len(mapdef.pin_name) <= 15, "BPF object names are at most 15 characters"
    specs = {obj: btf.maps()[mapdef.pin_name] for obj, btf in objects.items() if mapdef.pin_name in btf.maps()}
    assert specs, f"map {mapdef.pin_name} ({mapdef.cli_name}) is declared in none of {sorted(objects)}"
    for obj, spec in specs.items():
        btf = objects[obj]
        where = f"{mapdef.pin_name} in {obj}.o"
        assert MAP_TYPE_NAMES.get(spec.type or 0, f"type {spec.type}") == mapdef.map_type, where
        assert spec.max_entries == mapdef.max_entries, where
        assert spec.map_flags == mapdef.map_flags, f"{where}: map_flags"
        assert spec.pinning == LIBBPF_PIN_BY_NAME, f"{where}: must be pinned by name to be shared and survive"
        if mapdef.map_type == "ringbuf":
            assert spec.key is None and spec.value is None and mapdef.key is None
            continue
        assert mapdef.key is not None
        assert spec.key is not None and spec.value is not None, f"{where}: declare key and value with __type()"
        assert _key_value_spelling(btf, spec.key) == mapdef.key.c_name, f"{where}: key type"
        assert _key_value_spelling(btf, spec.value) == mapdef.value.c_name, f"{where}: value type"
        assert btf.size(spec.key) == mapdef.key.size and btf.size(spec.value) == mapdef.value.size, where


def test_every_pinned_map_is_registered(objects: dict[str, BTF]) -> None:
    known = registry.by_pin_name()
    for obj, btf in objects.items():
        pinned = {n for n, s in btf.maps().items() if s.pinning == LIBBPF_PIN_BY_NAME}
        assert pinned - set(known) == set(), f"{obj}.o pins maps the registry does not know"


def test_registry_names() -> None:
    assert list(registry.MAPS) == [
        "config", "devices", "nexthops", "routing", "delivery", "delivery-exact", "veth", "services", "backends",
        "maglev",
        "affinity", "revnat", "sock-revnat", "policy", "policy-exact", "segment",
        "prefix-segment", "probes", "probe-cookie", "ct-tcp-v4", "ct-udp-v4", "ct-icmp-v4", "ct-tcp-v6",
        "ct-udp-v6", "ct-icmp-v6", "endpoint-ct", "events", "metrics",
    ]  # fmt: skip
    assert set(registry.CT_TABLES) == {n for n in registry.MAPS if n.startswith("ct-")}
    assert set(registry.SHOWABLE) <= set(registry.MAPS)
    assert len(registry.by_pin_name()) == len(registry.MAPS)
    assert all(m.doc for m in registry.MAPS.values())
    for m in registry.MAPS.values():
        assert (m.map_type == "lpm_trie") == bool(m.map_flags & registry.BPF_F_NO_PREALLOC), m.cli_name


# --- enums ---------------------------------------------------------------------------------------


def _modules() -> list[tuple[str, object]]:
    return [(h.stem, importlib.import_module(f"lace.datapath.{h.stem}")) for h in HEADERS]


def _python_enum(cls: type, prefix: str) -> dict[str, int]:
    return {prefix + m.name: int(m.value) for m in cls}  # type: ignore[attr-defined]


@pytest.mark.parametrize("header", HEADERS, ids=[h.stem for h in HEADERS])
def test_enums_match_headers(header_btf: BTF, objects: dict[str, BTF], header) -> None:
    mod = importlib.import_module(f"lace.datapath.{header.stem}")
    assert sorted(mod.C_ENUMS) == sorted(header_enums(header)), f"lace/datapath/{header.stem}.py C_ENUMS"
    for c_name, (cls, prefix) in mod.C_ENUMS.items():
        expected = header_btf.enum_values(c_name)
        assert _python_enum(cls, prefix) == expected, f"enum {c_name} vs {cls.__name__}"
        for obj, btf in objects.items():  # where a program carries the enum, it must agree too
            got = btf.enum_values(c_name)
            assert got is None or got == expected, f"enum {c_name} in {obj}.o"


@pytest.mark.parametrize("c_name", ["lace_drop_reason", "lace_trace_point"])
def test_reason_tables_match_compiled_objects(objects: dict[str, BTF], c_name: str) -> None:
    from lace.datapath import reasons

    cls, prefix = reasons.C_ENUMS[c_name]
    found = {obj: btf.enum_values(c_name) for obj, btf in objects.items()}
    present = {obj: v for obj, v in found.items() if v is not None}
    assert present, (
        f"enum {c_name} is in the BTF of none of {sorted(objects)}: the datapath must reference it "
        f"(e.g. the type of a drop helper's parameter or a global) so its values can be checked"
    )
    for obj, values in present.items():
        assert values == _python_enum(cls, prefix), f"enum {c_name} in {obj}.o vs lace.datapath.reasons"


def test_gen_enums_check() -> None:
    # -I -S: isolated, no site-packages — the generator must run on the bare stdlib
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(REPO / "tools" / "gen_enums.py"), "--check"],
        capture_output=True, text=True, cwd="/",
    )
    assert proc.returncode == 0, proc.stderr


# --- constants -----------------------------------------------------------------------------------

_SUFFIX = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b")
_OK_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv,
             ast.LShift, ast.RShift, ast.BitOr, ast.BitAnd, ast.BitXor, ast.USub, ast.Invert)


def _c_int(text: str) -> int:
    expr = _SUFFIX.sub(r"\1", text).replace("/", "//")
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _OK_NODES):
            raise ValueError(f"not a simple integer expression: {text!r}")
    return int(eval(compile(tree, "<macro>", "eval"), {"__builtins__": {}}))  # noqa: S307 - checked above


@pytest.mark.parametrize("header", HEADERS, ids=[h.stem for h in HEADERS])
def test_macros_match_headers(macro_values: dict[str, str], header) -> None:
    mod = importlib.import_module(f"lace.datapath.{header.stem}")
    defined = header_macros(header)
    assert sorted(mod.C_MACROS) == sorted(defined), f"lace/datapath/{header.stem}.py C_MACROS vs {header.name}"
    for name in defined:
        assert int(mod.C_MACROS[name]) == _c_int(macro_values[name]), name


def test_every_header_has_a_module() -> None:
    for header in HEADERS:
        assert (REPO / "lace" / "datapath" / f"{header.stem}.py").is_file(), header.name
