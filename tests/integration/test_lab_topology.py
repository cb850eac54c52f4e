"""The lab topology against the kernel, with `ip` (and bpftool) as oracles; the pod server; lab processes.

Labs are named ``t<pid>`` (and variants) so a test run coexists with a real lab; every lab and
namespace made here is destroyed afterwards, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from lace import netlink as nl
from lace.lab import procs, topology
from lace.lab.topology import LabError, LabSpec

from .oracles import ip, ipj, ping

PID = os.getpid() % 100000
LAB = f"t{PID}"


def leftovers(name: str) -> list[str]:
    """Whatever of lab ``name`` is still there: namespaces, pin dirs, cgroups."""
    left = [ns for ns in nl.list_netns(f"lace-{name}-")]
    left += [p for p in os.listdir("/sys/fs/bpf") if p.startswith(f"lace-{name}-")]
    left += [c for c in (f"/sys/fs/cgroup/unified/lace-{name}", f"/sys/fs/cgroup/lace-{name}") if os.path.exists(c)]
    return left


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[topology.Lab]:
    state = tmp_path_factory.mktemp("lab") / LAB
    steps: list[str] = []
    try:
        built = topology.build(LabSpec(LAB, 2), progress=steps.append, state_dir=state)
        assert steps[0] == "creating fabric" and "creating worker-2" in steps and steps[-1] == "ready"
        yield built
    finally:
        topology.destroy(LAB, state)
        assert leftovers(LAB) == []


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"lace-t{os.getpid()}-{time.monotonic_ns() % 10**9}"
    nl.create_netns(name)
    try:
        nl.set_up("lo", name)
        yield name
    finally:
        nl.delete_netns(name)


# ---- the built lab --------------------------------------------------------------------------

def test_namespaces_and_description(lab: topology.Lab) -> None:
    names = set(ip("netns", "list").stdout.split())
    for ns in (f"lace-{LAB}-fabric", f"lace-{LAB}-outside", f"lace-{LAB}-worker-1", f"lace-{LAB}-worker-2"):
        assert ns in names
    assert [n.name for n in lab.nodes] == ["worker-1", "worker-2"]
    w1 = lab.nodes[0]
    assert (w1.index, w1.node_id, w1.netns, w1.uplink) == (1, 1, f"lace-{LAB}-worker-1", "eth0")
    assert (w1.underlay_addr, w1.locator) == ("fd5e:ff::1", "fd5e:c000:1::/48")
    assert w1.pin_root == f"/sys/fs/bpf/lace-{LAB}-worker-1" and os.path.isdir(w1.pin_root)
    eth0 = ipj(w1.netns, "link", "show", "eth0")[0]
    assert eth0["ifindex"] == w1.uplink_ifindex and eth0["address"] == w1.uplink_mac
    assert eth0["mtu"] == 1500 and lab.pod_mtu == 1460
    # deterministic MACs: a function of lab name and role only
    assert w1.uplink_mac == topology.mac_for(LAB, "worker-1/eth0")
    # the uplink's peer is up1 on br0 in the fabric
    up1 = ipj(lab.fabric_netns, "link", "show", "up1")[0]
    assert up1["master"] == "br0" and up1["operstate"] == "UP"
    assert topology.load(LAB, lab.state_dir) == lab
    assert topology.load(LAB).nodes == lab.nodes  # type: ignore[union-attr]  # from the kernel alone
    assert topology.load("nosuchlab") is None
    saved = json.loads((Path(lab.state_dir or "") / "lab.json").read_text())
    assert saved["name"] == LAB and len(saved["nodes"]) == 2


def test_underlay_addresses_and_sysctls(lab: topology.Lab) -> None:
    for node in lab.nodes:
        addrs = {(a["local"], a["prefixlen"]) for a in ipj(node.netns, "addr", "show", "dev", "eth0")[0]["addr_info"]}
        assert (node.underlay_addr, 64) in addrs and (node.underlay_addr4, 24) in addrs
        for key in ("net.ipv6.conf.all.forwarding", "net.ipv4.ip_forward"):
            out = ip("netns", "exec", node.netns, "sysctl", "-n", key).stdout.strip()
            assert out == "1", f"{key} in {node.netns}"
        assert ipj(node.netns, "link", "show", "lo")[0]["operstate"] in ("UNKNOWN", "UP")
    outside = {(a["local"], a["prefixlen"]) for a in ipj(lab.outside_netns, "addr", "show", "dev", "lo")[0]["addr_info"]}
    assert {("203.0.113.1", 32), ("2001:db8:cafe::1", 128)} <= outside
    # the root namespace got nothing of ours
    assert "fd5e:" not in ip("-6", "addr").stdout and "fd5e:" not in ip("-6", "route").stdout


def test_routes(lab: topology.Lab) -> None:
    w1, w2 = lab.nodes
    r6 = ip("-n", w1.netns, "-6", "route", "show").stdout
    assert "fd5e:c000:2::/48 via fd5e:ff::2 dev eth0" in r6
    assert "fd5e:c000:1::/48" not in r6  # no route to its own locator
    assert "2001:db8:cafe::/48 via fd5e:ff::fe dev eth0" in r6
    assert "203.0.113.0/24 via 198.18.0.254 dev eth0" in ip("-n", w1.netns, "route", "show").stdout
    assert "fd5e:c000:1::/48 via fd5e:ff::1 dev eth0" in ip("-n", w2.netns, "-6", "route", "show").stdout
    back = ip("-n", lab.outside_netns, "-6", "route", "show").stdout
    assert "fd5e:c000:1::/48 via fd5e:ff::1 dev eth0" in back and "fd5e:c000:2::/48 via fd5e:ff::2 dev eth0" in back


def test_pings(lab: topology.Lab) -> None:
    w1, w2 = lab.nodes
    ping(w1.netns, w2.underlay_addr)
    ping(w1.netns, "fd5e:ff::fe")
    ping(w1.netns, "2001:db8:cafe::1")
    ping(w1.netns, "203.0.113.1")
    ping(w2.netns, w1.underlay_addr4)


# ---- build and destroy ----------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    (LabSpec("Bad_Name", 2), "invalid lab name 'Bad_Name'"),
    (LabSpec("elevenchars", 2), "invalid lab name 'elevenchars'"),
    (LabSpec("-x", 2), "invalid lab name"),
    (LabSpec(f"v{PID}", 0), "invalid node count 0"),
    (LabSpec(f"v{PID}", 17), "use 1 to 16"),
])  # fmt: skip
def test_invalid_spec_builds_nothing(spec: LabSpec, message: str) -> None:
    with pytest.raises(LabError, match=message):
        topology.build(spec)
    assert leftovers(spec.name.lower()) == [] and leftovers(f"v{PID}") == []


def test_failure_midway_tears_down(tmp_path: Path) -> None:
    name = f"f{PID}"

    def fail_at_second_node(step: str) -> None:
        if step == "creating worker-2":
            assert nl.netns_exists(f"lace-{name}-worker-1")  # something was built
            raise RuntimeError("injected failure")

    try:
        with pytest.raises(RuntimeError, match="injected"):
            topology.build(LabSpec(name, 3), progress=fail_at_second_node, state_dir=tmp_path / name)
        assert leftovers(name) == []
        assert not (tmp_path / name / "lab.json").exists()
    finally:
        topology.destroy(name)


def test_build_refuses_an_existing_lab(lab: topology.Lab) -> None:
    with pytest.raises(LabError, match=f"lab {LAB} exists already"):
        topology.build(LabSpec(LAB, 1))
    assert nl.netns_exists(lab.fabric_netns)


def test_destroy_twice_leaves_nothing(tmp_path: Path) -> None:
    name, sibling = f"d{PID}", f"d{PID}-b"  # the sibling shares the "lace-d<pid>-" prefix
    state = tmp_path / name
    try:
        built = topology.build(LabSpec(name, 1), state_dir=state)
        topology.build(LabSpec(sibling, 1))
        node = built.nodes[0]
        inodes = {nl.netns_inode(ns) for ns in nl.list_netns(f"lace-{name}-") if not ns.startswith(f"lace-{sibling}-")}
        # a recorded process, an unrecorded one in the node namespace, pins with a subdir, a cgroup
        recorded = procs.spawn(["sleep", "300"], netns=node.netns, name="agent-worker-1", state_dir=state,
                               log_path=state / "agent.log")
        with nl.entered(node.netns):
            stray = subprocess.Popen(["sleep", "300"], start_new_session=True)
        os.makedirs(os.path.join(node.pin_root, "tc", "links"))
        subprocess.run(["bpftool", "map", "create", os.path.join(node.pin_root, "tc", "m"), "type", "hash",
                        "key", "4", "value", "4", "entries", "4", "name", "lace_t"], check=True)
        cgroup = f"/sys/fs/cgroup/unified/lace-{name}"
        os.makedirs(os.path.join(cgroup, "pods"), exist_ok=True)

        removed = topology.destroy(name, state)
        assert f"netns lace-{name}-worker-1" in removed and f"pins {node.pin_root}" in removed
        assert leftovers(name) == [f"lace-{sibling}-fabric", f"lace-{sibling}-outside", f"lace-{sibling}-worker-1",
                                   f"lace-{sibling}-worker-1"]  # the sibling's namespaces and pin dir only
        assert not state.exists() and not os.path.exists(cgroup)
        assert stray.wait(5) is not None and not procs.alive(recorded)
        assert not any(os.stat(f"/proc/{p}/ns/net").st_ino in inodes
                       for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/ns/net"))
        assert topology.destroy(name, state) == []
    finally:
        topology.destroy(name, state)
        topology.destroy(sibling)
    assert leftovers(name) == []


# ---- lab processes --------------------------------------------------------------------------

def test_procs_spawn_and_stop_in_a_namespace(netns: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    pid = procs.spawn(["sleep", "300"], netns=netns, name="sleeper", state_dir=state, log_path=tmp_path / "s.log")
    try:
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == nl.netns_inode(netns)
        assert os.getsid(pid) == pid  # its own session
        [info] = procs.list_procs(state)
        assert (info.name, info.pid, info.argv, info.netns, info.alive) == ("sleeper", pid, ["sleep", "300"], netns, True)
        assert json.loads((state / "procs.json").read_text())["sleeper"]["pid"] == pid
        with pytest.raises(procs.ProcError, match="already running"):
            procs.spawn(["sleep", "1"], netns=netns, name="sleeper", state_dir=state, log_path=tmp_path / "s.log")
        assert procs.stop("sleeper", state) is True
        assert not procs.alive(pid) and procs.list_procs(state) == []
        assert procs.stop("sleeper", state) is False
    finally:
        procs.stop_all(state)


def test_procs_escalate_to_sigkill_and_stop_all(netns: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    stubborn = procs.spawn(["sh", "-c", "trap '' TERM; sleep 300"], netns=netns, name="stubborn",
                           state_dir=state, log_path=tmp_path / "a.log")
    plain = procs.spawn(["sleep", "300"], netns=None, name="plain", state_dir=state, log_path=tmp_path / "b.log")
    try:
        time.sleep(0.2)  # let sh install its trap
        assert procs.kill("stubborn", state, signal.SIGTERM) is True
        time.sleep(0.2)
        assert procs.alive(stubborn)
        t0 = time.monotonic()
        assert procs.stop("stubborn", state, timeout=0.5) is True
        assert not procs.alive(stubborn) and time.monotonic() - t0 < 3
        assert os.stat(f"/proc/{plain}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
        assert procs.stop_all(state) == ["plain"]
        assert not procs.alive(plain)
    finally:
        procs.stop_all(state)


def test_spawn_errors_name_the_process(tmp_path: Path) -> None:
    with pytest.raises(procs.ProcError, match="cannot start agent-x in netns lace-nosuch"):
        procs.spawn(["sleep", "1"], netns="lace-nosuch", name="agent-x", state_dir=tmp_path, log_path=tmp_path / "l")
    with pytest.raises(procs.ProcError, match="cannot start agent-y .*/no/such/binary"):
        procs.spawn(["/no/such/binary"], netns=None, name="agent-y", state_dir=tmp_path, log_path=tmp_path / "l")


# ---- the pod server -------------------------------------------------------------------------

def _udp_echo(addr: str, port: int, payload: bytes) -> bytes:
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.sendto(payload, (addr, port))
        return s.recvfrom(65535)[0]


def test_podserver_http_and_udp_dual_stack(netns: str, tmp_path: Path) -> None:
    nl.veth_pair("eth0", "peer0", netns=netns)
    nl.add_address("eth0", "10.77.0.2/24", netns)
    nl.add_address("eth0", "fd77::2/64", netns)
    nl.set_up("eth0", netns)
    ready = tmp_path / "ready"
    t0 = time.monotonic()
    with nl.entered(netns):  # the child inherits this thread's namespace
        server = subprocess.Popen([sys.executable, "-m", "lace.lab.podserver", "--name", "default/web",
                                   "--tcp", "8080", "--tcp", "9090", "--udp", "5353", "--ready-file", str(ready)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while not ready.exists():
            assert server.poll() is None, server.communicate()
            assert time.monotonic() - t0 < 10, "podserver not ready"
            time.sleep(0.01)
        assert ready.read_text() == "ready\n"
        with nl.entered(netns):
            for host in ("10.77.0.2", "[fd77::2]", "127.0.0.1", "[::1]"):
                for port in (8080, 9090):
                    with urllib.request.urlopen(f"http://{host}:{port}/any/path", timeout=2) as r:
                        assert (r.status, r.read()) == (200, b"default/web\n")
            for addr in ("10.77.0.2", "fd77::2"):
                assert _udp_echo(addr, 5353, b"\x00lace\xff") == b"\x00lace\xff"
        server.send_signal(signal.SIGTERM)
        assert server.wait(5) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
