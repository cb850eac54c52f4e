"""Fixtures for privileged integration tests: bpffs, compiled test objects, and a fresh network
namespace / bpffs pin root per test, always removed afterwards."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
BPFFS = "/sys/fs/bpf"
BPF_FS_MAGIC = 0xCAFE4A11
_seq = itertools.count()


def unique_name() -> str:
    return f"lace-it-{os.getpid()}-{next(_seq)}"


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def _is_bpffs(path: str) -> bool:
    # statfs f_type is not exposed by os; /proc/mounts says what is mounted where
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)


@pytest.fixture(scope="session")
def bpffs() -> str:
    """bpffs mounted at /sys/fs/bpf (mounted here if the host has not)."""
    if not _is_bpffs(BPFFS):
        run("mount", "-t", "bpf", "bpf", BPFFS)
    return BPFFS


@pytest.fixture(scope="session")
def bpf_objects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/bpf/loader_test.c compiled as the base object and its variants (see its header)."""
    out = tmp_path_factory.mktemp("bpf")
    include = REPO / "build" / "include"
    if not (include / "vmlinux.h").exists():
        include = out / "include"
        include.mkdir()
        with open(include / "vmlinux.h", "w") as f:
            subprocess.run(
                ["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c"], stdout=f, check=True
            )
    variants = {"base": [], "v2": ["-DVARIANT=2"], "bad": ["-DBAD_PROGRAM"], "v2bad": ["-DVARIANT=2", "-DBAD_PROGRAM"]}
    objs = {}
    for name, defs in variants.items():
        obj = out / f"loader_test-{name}.o"
        res = run(
            "clang", "-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-Werror", "-Wno-unused-function",
            f"-I{include}", f"-I{REPO / 'bpf' / 'include'}", f"-I{REPO / 'bpf'}", *defs,
            "-c", str(REPO / "tests" / "bpf" / "loader_test.c"), "-o", str(obj),
            check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"compiling loader_test.c {defs}: {res.stderr}"
        objs[name] = obj
    return objs


@pytest.fixture
def pin_root(bpffs: str) -> Iterator[str]:
    """A fresh directory on bpffs, removed with everything pinned in it."""
    path = os.path.join(bpffs, unique_name())
    os.mkdir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        assert not os.path.exists(path), f"could not remove pin root {path}"


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh named network namespace (/run/netns/<name>), deleted afterwards."""
    name = unique_name()
    run("ip", "netns", "add", name)
    try:
        run("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        run("ip", "netns", "del", name, check=False)


@dataclass
class VethPair:
    """a0 (10.199.0.1) in namespace ``a`` <-> b0 (10.199.0.2) in namespace ``b``."""

    a: str
    b: str
    a_ifindex: int
    a_addr: str = "10.199.0.1"
    b_addr: str = "10.199.0.2"


def ifindex_in(ns: str, dev: str) -> int:
    out = run("ip", "-n", ns, "-j", "link", "show", "dev", dev).stdout
    return int(json.loads(out)[0]["ifindex"])


@pytest.fixture
def veth(netns: str) -> Iterator[VethPair]:
    """Two namespaces joined by a veth pair; the second namespace is removed afterwards too."""
    other = unique_name()
    run("ip", "netns", "add", other)
    try:
        run("ip", "link", "add", "a0", "netns", netns, "type", "veth", "peer", "name", "b0", "netns", other)
        run("ip", "-n", netns, "addr", "add", "10.199.0.1/30", "dev", "a0")
        run("ip", "-n", other, "addr", "add", "10.199.0.2/30", "dev", "b0")
        run("ip", "-n", netns, "link", "set", "a0", "up")
        run("ip", "-n", other, "link", "set", "b0", "up")
        yield VethPair(netns, other, ifindex_in(netns, "a0"))
    finally:
        run("ip", "netns", "del", other, check=False)


def bpftool_json(*args: str) -> object:
    return json.loads(run("bpftool", "-j", *args).stdout or "null")
