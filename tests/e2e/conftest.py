"""The e2e tier: one shared 3-node lab for the whole session (independent scenarios use their own
namespaces and networks in it), and one lab on etcd for the etcd tests (which run last), driven
through the real ``lace`` CLI in-process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from lace.cli.main import main as lace_main

NETCHECK = [sys.executable, "-m", "lace.lab.netcheck"]


@contextmanager
def yaml_file(docs: list[dict] | str) -> Iterator[str]:
    """``docs`` (objects, or YAML text) in a temporary file for the block; its path."""
    text = docs if isinstance(docs, str) else yaml.safe_dump_all(docs)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        yield f.name
    finally:
        os.unlink(f.name)


class LabHandle:
    """A running lab and the commands tests run against it."""

    def __init__(self, name: str, state_dir: str) -> None:
        self.name = name
        self.env = dict(os.environ, LACE_STATE_DIR=state_dir, LACE_LAB=name, NO_COLOR="1")
        self.state_dir = state_dir
        self.dir = os.path.join(state_dir, "labs", name)

    def lace(self, *argv: str, check: bool = True) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = int(lace_main(list(argv), self.env, stdout=out, stderr=err, stdin=io.StringIO("")))
        if check and rc != 0:
            raise AssertionError(f"lace {' '.join(argv)} -> {rc}\n{out.getvalue()}\n{err.getvalue()}")
        return rc, out.getvalue(), err.getvalue()

    def apply(self, docs: list[dict] | str) -> None:
        with yaml_file(docs) as path:
            self.lace("apply", "-f", path)

    def pods(self, namespace: str) -> dict[str, dict]:
        _, out, _ = self.lace("get", "pods", "-n", namespace, "-o", "json")
        return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}

    def wait(self, namespace: str, names: list[str], phase: str = "Running", timeout: float = 60) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            ps = self.pods(namespace)
            if all(ps.get(n, {}).get("status", {}).get("phase") == phase for n in names):
                return ps
            if time.monotonic() > deadline:
                raise AssertionError(f"pods {names} in {namespace} not {phase}: "
                                     f"{ {n: ps.get(n, {}).get('status') for n in names} }")
            time.sleep(0.05)

    def wait_gone(self, namespace: str, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while name in self.pods(namespace):
            assert time.monotonic() < deadline, f"pod {namespace}/{name} still there"
            time.sleep(0.05)

    def exec(self, pod: str, *argv: str) -> tuple[int, str]:
        rc, out, err = self.lace("lab", "exec", pod, "--", *argv, check=False)
        return rc, out + err

    def check(self, pod: str, mode: str, ip: str, port: int, timeout: float = 1.0) -> tuple[bool, str]:
        rc, out = self.exec(pod, *NETCHECK, mode, ip, str(port), "--timeout", str(timeout))
        return rc == 0, out.strip()

    def status(self) -> dict[str, Any]:
        _, out, _ = self.lace("lab", "status", "-o", "json", check=False)
        return json.loads(out)

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.status()["nodes"] if n["name"] == name)


def wait_for(fn, what: str, timeout: float = 30.0, interval: float = 0.1):
    """fn()'s first truthy value, polled every ``interval`` seconds; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        out = fn()
        if out:
            return out
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def status_doc(lab: LabHandle, *nodes: str) -> dict[str, Any]:
    """``lace status -o json`` (of ``nodes``, else every node): what each agent reports."""
    argv = ["status", "-o", "json", "--timeout", "30"]
    for n in nodes:
        argv += ["--node", n]
    _, out, _ = lab.lace(*argv, check=False)
    return json.loads(out)


def liveness_of(doc: dict[str, Any], node: str) -> dict[str, Any] | None:
    """``node``'s ``liveness`` subsystem in a status document, or None when it did not answer."""
    report = (doc.get("nodes") or {}).get(node)
    if report is None:
        return None
    return next((s for s in report["subsystems"] if s["name"] == "liveness"), None)


@contextmanager
def agent_down(lab: LabHandle, node: str) -> Iterator[None]:
    """``node``'s agent SIGKILLed (and seen down by the lab) for the block; restarted afterwards."""
    import signal
    from lace.lab import procs
    assert procs.kill(f"agent-{node}", lab.dir, signal.SIGKILL)
    try:
        wait_for(lambda: lab.node(node)["agent"] == "down", f"the agent of {node} to be down", 10, 0.05)
        yield
    finally:
        lab.lace("lab", "restart-agent", node)


def start_etcd_members(lab: LabHandle, nodes: list[str]) -> None:
    """Start the etcd members of ``nodes`` that are not running (``lace.lab.etcd.start_member``,
    from their data), then wait for a healthy cluster."""
    from lace.lab import etcd as lab_etcd
    from lace.lab import procs, topology
    from lace.store.config import lab_store
    from lace.store.etcd import wait_ready
    running = {p.name for p in procs.list_procs(lab.dir) if p.alive}
    topo = topology.load(lab.name, state_dir=lab.dir)
    for node in nodes:
        if lab_etcd.proc_name(node) not in running:
            lab_etcd.start_member(topo, lab.dir, node)
    config = lab_store(lab.dir)
    wait_ready(config.endpoints, netns=config.netns, timeout=60)


def pod(name: str, ns: str, node: str | None = None, network: str | None = None,
        labels: dict | None = None, tcp=(80,), udp=(53,)) -> dict:
    ports = [{"containerPort": p} for p in tcp] + [{"containerPort": p, "protocol": "UDP"} for p in udp]
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {"app": name}}
    if network:
        meta["annotations"] = {"lace.dev/network": network}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "lace/podserver", "ports": ports}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def namespace(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {"ns": name}}}


def network(name: str, *cidrs: str, routes: list | None = None, imports: list[str] | None = None) -> dict:
    spec: dict[str, Any] = {"cidrs": list(cidrs)}
    if routes:
        spec["routes"] = routes
    if imports:
        spec["importServices"] = imports
    return {"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": name}, "spec": spec}


def ips(p: dict) -> tuple[str, str]:
    addrs = [a["ip"] for a in p["status"]["podIPs"]]
    v4 = next((a for a in addrs if ":" not in a), None)
    v6 = next((a for a in addrs if ":" in a), None)
    return v4, v6


def leftovers(lab: str, lab_dir: str | None = None) -> dict[str, list[str]]:
    """Everything of ``lab`` still in the kernel: namespaces, pins, links, cgroups; with the lab's
    state dir, also processes running from it (agents, pods' servers, dnsmasq) and mounts of it."""
    ns = [n.split()[0] for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
          if n.split() and n.split()[0].startswith(f"lace-{lab}-")]
    pins = [p for p in os.listdir("/sys/fs/bpf") if p.startswith(f"lace-{lab}-")]
    cg = [p for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified") if os.path.isdir(base)
          for p in os.listdir(base) if p == f"lace-{lab}"]
    procs: list[str] = []
    mounts: list[str] = []
    if lab_dir:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if lab_dir in cmdline:
                procs.append(f"{pid}: {cmdline.strip()}")
        with open("/proc/self/mountinfo") as f:
            mounts = [line.strip() for line in f if lab_dir in line]
    found = {"netns": ns, "pins": pins, "cgroups": cg, "procs": procs, "mounts": mounts}
    return {k: v for k, v in found.items() if v}


@contextmanager
def _lab(prefix: str, *up_args: str, handle_cls: type[LabHandle] = LabHandle) -> Iterator[LabHandle]:
    """A 3-node lab named ``prefix`` + this process's pid, in a state dir of its own, brought up
    with ``lace lab up ... *up_args``; taken down afterwards (even when the block fails), and
    failing if down left anything of it in the kernel or running. ``handle_cls``: a LabHandle
    with more commands (another tier's)."""
    name = f"{prefix}{os.getpid() % 10000}"
    state = tempfile.mkdtemp(prefix=f"lace-{prefix}-")
    handle = handle_cls(name, state)
    try:
        handle.lace("lab", "up", "--name", name, "--nodes", "3", *up_args)
        yield handle
    finally:
        handle.lace("lab", "down", "--name", name, check=False)
        left = leftovers(name, handle.dir)
        subprocess.run(["rm", "-rf", state])
        assert not left, f"lab down left {left}"


@pytest.fixture(scope="session")
def lab() -> Iterator[LabHandle]:
    """The shared lab, on the SQLite store."""
    with _lab("e2e") as handle:
        yield handle


@pytest.fixture(scope="session")
def etcd_lab() -> Iterator[LabHandle]:
    """The one lab on etcd (``--store etcd``) for ``test_lab_etcd.py`` and ``test_etcd_faults.py``:
    their tests run last in the session (see ``pytest_collection_modifyitems``), so it comes up
    only when they start, and it goes with the session."""
    with _lab("et", "--store", "etcd") as handle:
        yield handle


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, removed afterwards: in the etcd lab when the test uses it,
    else in the shared lab."""
    handle: LabHandle = request.getfixturevalue("etcd_lab" if "etcd_lab" in request.fixturenames else "lab")
    name = f"t-{uuid.uuid4().hex[:8]}"
    handle.apply([namespace(name)])
    yield name
    handle.lace("delete", "namespace", name, check=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "etcd_fault(last=False): breaks the etcd lab on purpose and makes it "
                                       "whole again; runs after its other tests (last=True: after every other)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The etcd lab's tests run after every other test of the session, so that lab is up only
    while they run: first those that leave it as they found it, then the faults, each making it
    whole again, and last those marked ``etcd_fault(last=True)`` (a member killed and started
    again), which could disturb a test after them."""
    def rank(item: pytest.Item) -> int:
        if "etcd_lab" not in getattr(item, "fixturenames", ()):
            return 0
        fault = item.get_closest_marker("etcd_fault")
        if fault is None:
            return 1
        return 3 if fault.kwargs.get("last") else 2
    items.sort(key=rank)    # stable: the order within each rank is the collection's
