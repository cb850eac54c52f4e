"""Fixtures of the schema tests: the compiled objects' BTF and the headers compiled on their own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from abi_oracle import BTF, REPO, probe_source, tool
from lace.datapath import registry


@pytest.fixture(scope="session")
def objects() -> dict[str, BTF]:
    """name -> BTF of every program object in the registry (the real build/bpf/*.o), the
    iterators' included."""
    out = {}
    for name in registry.OBJECTS:
        try:
            path = registry.bpf_object_path(name)
        except FileNotFoundError as e:
            pytest.fail(str(e))
        out[name] = BTF(path)
    for name, file in registry.ITERATORS.items():
        path = registry.bpf_dir() / file
        if not path.exists():
            pytest.fail(f"{path} is missing: run make bpf")
        out[name] = BTF(str(path))
    return out


@pytest.fixture(scope="session")
def header_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ABI headers in one translation unit (see abi_oracle.probe_source)."""
    d = tmp_path_factory.mktemp("abi_probe")
    (d / "probe.c").write_text(probe_source())
    return d / "probe.c"


@pytest.fixture(scope="session")
def header_btf(header_probe: Path) -> BTF:
    obj = header_probe.with_suffix(".o")
    subprocess.run(
        [tool("clang"), "-O2", "-g", "-target", "bpf", "-c", f"-I{REPO / 'bpf' / 'include'}", str(header_probe),
         "-o", str(obj)],
        check=True, capture_output=True, text=True,
    )
    return BTF(obj)


@pytest.fixture(scope="session")
def macro_values(header_probe: Path) -> dict[str, str]:
    """Every LACE_* macro's replacement text, as the preprocessor sees it."""
    out = subprocess.run(
        [tool("clang"), "-dM", "-E", "-x", "c", f"-I{REPO / 'bpf' / 'include'}", str(header_probe)],
        check=True, capture_output=True, text=True,
    ).stdout
    values = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0] == "#define" and parts[1].startswith("LACE_"):
            values[parts[1]] = parts[2] if len(parts) == 3 else ""
    return values
