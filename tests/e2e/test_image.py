"""lace's container image (deploy/image/): it builds from the Containerfile with podman and no
registry (``deploy/image/build.sh``, what ``make image`` runs), carries no compiler, finds its BPF
objects where the image puts them; and the agent run from it inside a lab node — privileged, in the
node's network namespace, with bpffs, cgroup2, the pod namespaces and the lab's state mounted at
their own paths, the lab's own command line — serves that node: its pods get traffic both ways and
``lace status`` counts it healthy. The lab's agent is restored afterwards, even on failure.

Podman on these machines (Debian 12's 4.3, no systemd, hybrid cgroups, root without
CAP_SYS_RESOURCE) needs ``PODMAN`` below: runc (crun refuses hybrid cgroups), the cgroupfs
manager, and rlimits no higher than podman's own (its default of 1048576 open files cannot be set).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import time
import uuid
from contextlib import contextmanager
from collections.abc import Iterator

import pytest
import yaml

from lace.lab import cluster, topology

from .conftest import LabHandle, agent_down, ips, pod, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "deploy", "image", "build.sh")
CHART = os.path.join(ROOT, "deploy", "helm", "lace")
MANIFESTS = os.path.join(ROOT, "deploy", "manifests", "lace.yaml")
NODE, OTHER = "worker-1", "worker-2"

# podman hands a container at most its own limits: open files as this process has them, processes
# as podman lowers them (32768) before it starts the runtime
_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
_NPROC = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
LIMITS = ["--ulimit", f"nofile={_NOFILE}:{_NOFILE}", "--ulimit", f"nproc={_NPROC}:{_NPROC}"]


def podman(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *argv], capture_output=True, text=True, timeout=timeout)


def in_image(image: str, script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in a throwaway container of ``image``, without a network."""
    return podman("run", "--rm", "--network", "none", *LIMITS, image, "sh", "-c", script)


def chart_image() -> str:
    """The image the Helm chart runs (values.yaml image.repository:image.tag)."""
    with open(os.path.join(CHART, "values.yaml")) as f:
        values = yaml.safe_load(f)["image"]
    return f"{values['repository']}:{values['tag']}"


def manifest_images() -> set[str]:
    with open(MANIFESTS) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")]
    return {c["image"] for p in pods for c in p.get("initContainers", []) + p["containers"]}


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built by deploy/image/build.sh under its default name (base and layers cached
    after the first run)."""
    start = time.monotonic()
    run = subprocess.run([BUILD], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"{BUILD} failed:\n{run.stdout}\n{run.stderr[-3000:]}"
    built = run.stdout.strip()
    print(f"image {built} built in {time.monotonic() - start:.1f}s")
    return built


def test_the_chart_and_the_manifests_run_the_image_make_builds(image):
    assert chart_image() == image
    assert manifest_images() == {image}


def test_the_image_has_no_compiler_and_finds_its_objects(image):
    for tool in ("clang", "llc", "gcc", "cc", "bpftool"):
        found = in_image(image, f"command -v {tool}")
        assert found.returncode != 0, f"{tool} is in {image}: {found.stdout}"
    # the installed package, not a repository: LACE_BPF_DIR and the Maglev helper next to it
    run = in_image(image, "python3 -c 'from lace.datapath import registry, maglev; "
                   "print(*(registry.bpf_object_path(n) for n in registry.OBJECTS)); "
                   "print(maglev._native_fill() is not None)' && node --help >/dev/null && lace --help >/dev/null")
    assert run.returncode == 0, run.stdout + run.stderr
    paths, native = run.stdout.split("\n")[:2]
    assert paths.split() == [f"/usr/lib/lace/bpf/{f}" for f in ("pod_veth.o", "uplink.o", "host.o", "sock.o")]
    assert native == "True"
    # 386 MB when this was written (a 123 MB base, a 262 MB venv); the build stages' compilers
    # would add 700 MB
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
    print(f"image {image}: {size / 1e6:.0f} MB")
    assert size < 450e6, f"{image} is {size / 1e6:.0f} MB"


@contextmanager
def agent_container(lab: LabHandle, node: topology.LabNode, image: str) -> Iterator[str]:
    """``node``'s agent run from ``image`` with the lab's own command line (its interpreter aside)
    and the image's environment (the lab's agent sets none of its own); the container is removed
    afterwards."""
    argv = cluster._agent_argv(lab.dir, node)
    assert argv[1:3] == ["-m", "lace.agent"], argv
    cgroup2 = topology.cgroup_root()
    name = f"lace-agent-{lab.name}-{node.name}-{uuid.uuid4().hex[:6]}"
    mounts = [
        "-v", "/sys/fs/bpf:/sys/fs/bpf",              # the pins (node.pin_root) on the host's bpffs
        "-v", "/run/netns:/run/netns:rslave",         # pods' namespaces, also those made later
        "-v", f"{lab.dir}:{lab.dir}",                 # the store and the agent's socket
    ] + (["-v", f"{cgroup2}:{cgroup2}"] if cgroup2 else [])   # the node's host cgroup (socket hooks)
    # as the DaemonSet runs it: privileged, on the node's network, its own pid and cgroup namespaces
    # (the agent finds pods by their netns paths, never by pid, and its --cgroup paths are those of
    # the cgroup2 mount bound at its host path, whatever the container's cgroup namespace)
    run = podman("run", "--detach", "--name", name, "--privileged", *LIMITS,
                 "--network", f"ns:/run/netns/{node.netns}", "--pid", "private", "--cgroupns", "private",
                 *mounts, image, "python3", *argv[1:])
    assert run.returncode == 0, f"podman run failed: {run.stderr}"
    try:
        yield name
    finally:
        logs = podman("logs", name)   # podman logs gives the agent's stderr on its stderr
        gone = podman("rm", "--force", "--time", "5", name)
        assert gone.returncode == 0, gone.stderr
        print(f"agent container {name}, its log:\n{(logs.stdout + logs.stderr)[-2000:]}")


def _healthy(lab: LabHandle, node: str) -> bool:
    return lab.node(node)["agent"] == "healthy"


def test_the_agent_from_the_image_serves_a_node(lab, ns, image):
    node = next(n for n in topology.load(lab.name, state_dir=lab.dir).nodes if n.name == NODE)
    with agent_down(lab, NODE), agent_container(lab, node, image) as ctr:
        wait_for(lambda: _healthy(lab, NODE), f"the agent in container {ctr} to be healthy", 60, 0.2)
        # it is the container that answers: the lab's own agent is not running
        assert lab.node(NODE)["agentPid"] is None
        lab.apply([pod("served", ns, node=NODE), pod("peer", ns, node=OTHER)])
        pods = lab.wait(ns, ["served", "peer"])
        served, peer = ips(pods["served"]), ips(pods["peer"])
        # each answer names the pod that sent it: the traffic reached the pod it was meant for
        for family, (s, p) in {"IPv4": (served[0], peer[0]), "IPv6": (served[1], peer[1])}.items():
            ok, out = lab.check(f"{ns}/peer", "tcp", s, 80)
            assert ok and out == f"{ns}/served", f"{family}: peer on {OTHER} -> served on {NODE}: {out}"
            ok, out = lab.check(f"{ns}/served", "tcp", p, 80)
            assert ok and out == f"{ns}/peer", f"{family}: served on {NODE} -> peer on {OTHER}: {out}"
            ok, out = lab.check(f"{ns}/served", "udp", p, 53)
            assert ok, f"{family}: served on {NODE} -> peer on {OTHER} (UDP): {out}"
        rc, out, err = lab.lace("status", check=False)
        assert rc == 0 and out.rstrip().endswith("3/3 nodes healthy"), out + err
        # pid 1: the agent that answers is the one in the container's own pid namespace
        assert re.search(rf"^{NODE}: healthy \(agent [^,]+, pid 1, [^)]*\)$", out, re.M), out
    # the lab's agent again, and the container gone
    assert _healthy(lab, NODE) and lab.node(NODE)["agentPid"] is not None
    assert podman("ps", "--all", "--quiet", "--filter", f"name={ctr}").stdout.strip() == ""
