"""Socket-level service translation against the real kernel: sock.o's cgroup hooks attached by
lace.agent.socklb to a throw-away cgroup, the lace objects loaded under a throw-away pin root.

Client processes run in a fresh network namespace and (unless a test says otherwise) in that
cgroup, the way a process runs on a node's host; backends listen on addresses of the namespace's
loopback. The namespace has no route to the service addresses, so an untranslated connect fails
with ENETUNREACH. bpftool is the independent oracle for what is attached to the cgroup.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pytest

from lace import netlink, nsenter
from lace.agent.socklb import HOOK_PROGRAMS, SockLB, SockLBError, link_name
from lace.bpf import BPFFS, Link, enter_netns, ensure_bpffs
from lace.bpf.cgroup import cgroup_link_target
from lace.cli.commands import exec as lexec
from lace.cli.invocation import Invocation
from lace.datapath import services as svc
from lace.datapath.common import Proto, Verdict, now_coarse
from lace.datapath.config import config_key, config_value
from lace.datapath.node import LoadedDatapath, load_objects
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.trace import METRICS_VALUE, metrics_key
from lace.lab import topology

pytestmark = pytest.mark.privileged

NODE_ADDR4, NODE_ADDR6 = "192.0.2.1", "2001:db8:f::1"   # the node's own addresses: its affinity identity
VIP = {4: "10.96.0.10", 6: "fd00:96::10"}
VIP_PORT = 80
BACKEND_PORT = 8080
#: backend name -> address per family, on the namespace's loopback
BACKENDS = {"a": {4: "10.244.0.10", 6: "fd00:244::a"},
            "b": {4: "10.244.0.11", 6: "fd00:244::b"},
            "c": {4: "10.244.0.12", 6: "fd00:244::c"}}
_seq = itertools.count()


def backend_id(name: str, family: int, proto: int) -> int:
    """A distinct backend ID per (backend, family, protocol), as the programmer hands them out."""
    return {"a": 1, "b": 2, "c": 3}[name] + (0 if family == 4 else 10) + (0 if proto == Proto.TCP else 100)


def lb_hash64(x: int) -> int:
    """bpf/lib/backend_select.h's lb_hash64: MurmurHash3's 64-bit finaliser, folded to 32 bits."""
    m = (1 << 64) - 1
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & m
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & m
    x ^= x >> 33
    return (x ^ (x >> 32)) & 0xFFFFFFFF


# --- the client: a process on the "node's host" -----------------------------------------------

CLIENT = r"""
import json, socket, sys
SO_COOKIE = 57

def cookie(s):
    return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little")

def run(op):
    fam = socket.AF_INET6 if ":" in op["addr"] else socket.AF_INET
    dst = (op["addr"], op["port"])
    kind = op["op"]
    s = socket.socket(fam, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(2)
    out = {"cookie": cookie(s)}
    try:
        if kind == "tcp":
            s.connect(dst)
            out["peer"] = list(s.getpeername()[:2])
            out["data"] = s.recv(16).decode()
        elif kind == "udp":
            s.sendto(b"hi", dst)
            data, src = s.recvfrom(16)
            out["data"], out["from"] = data.decode(), list(src[:2])
        elif kind == "udp-connected":
            s.connect(dst)
            out["peer"] = list(s.getpeername()[:2])
            s.send(b"hi")
            data, src = s.recvfrom(16)
            out["data"], out["from"] = data.decode(), list(src[:2])
    except OSError as e:
        out["errno"] = e.errno
    finally:
        s.close()
    return out

print(json.dumps([run(op) for op in json.load(sys.stdin)]))
"""


@dataclass
class Host:
    """A node's host as the tests see it: a namespace with the backends, the cgroup whose socket
    hooks translate, and the loaded datapath whose maps say what to translate."""

    netns: str
    cgroup: str
    dp: LoadedDatapath

    def run(self, ops: list[dict[str, Any]], *, in_cgroup: bool = True) -> list[dict[str, Any]]:
        """Run the client's operations in one process in the namespace (and the cgroup)."""
        fd = os.open(netlink.netns.path(self.netns), os.O_RDONLY | os.O_CLOEXEC)
        cgroup = self.cgroup

        def enter() -> None:
            nsenter.setns(fd)
            if in_cgroup:
                topology.join_cgroup(cgroup)

        try:
            res = subprocess.run([sys.executable, "-S", "-c", CLIENT], input=json.dumps(ops), preexec_fn=enter,
                                 capture_output=True, text=True, timeout=30)
        finally:
            os.close(fd)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def one(self, op: str, family: int = 4, *, addr: str | None = None, port: int = VIP_PORT,
            in_cgroup: bool = True) -> dict[str, Any]:
        return self.run([{"op": op, "addr": addr or VIP[family], "port": port}], in_cgroup=in_cgroup)[0]

    def many(self, op: str, n: int, family: int = 4) -> list[dict[str, Any]]:
        return self.run([{"op": op, "addr": VIP[family], "port": VIP_PORT}] * n)

    # -- programming the maps the way the agent does ----------------------------------------

    def service(self, *, active: Sequence[str], terminating: Sequence[str] = (), family: int = 4,
                proto: int = Proto.TCP, service_id: int = 7, flags: int = 0, affinity_timeout: int = 0,
                maglev: int = 0) -> None:
        """Frontend VIP[family]:80 in the default network with these backends (active first)."""
        services, backends = self.dp.map("services"), self.dp.map("backends")
        names = [*active, *terminating]
        services.update(svc.service_key(1, VIP[family], VIP_PORT, proto), svc.service_value(
            service_id=service_id, backend_count=len(names), active_count=len(active), flags=flags,
            affinity_timeout=affinity_timeout, maglev=maglev))
        for slot, name in enumerate(names, start=1):
            bid = backend_id(name, family, proto)
            services.update(svc.service_key(1, VIP[family], VIP_PORT, proto, slot),
                            svc.service_value(service_id=service_id, backend_id=bid))
            flag = svc.BackendFlag.ACTIVE if name in active else svc.BackendFlag.TERMINATING
            backends.update(svc.backend_key(bid), svc.backend_value(BACKENDS[name][family], BACKEND_PORT, proto, 1, flag))

    def maglev(self, table: int, entries: list[str], family: int = 4, proto: int = Proto.TCP) -> None:
        """Maglev table ``table``: entry i names backend entries[i % len(entries)]."""
        m = self.dp.map("maglev")
        for i in range(svc.MAGLEV_SIZE):
            m.update(svc.maglev_key(table, i), backend_id(entries[i % len(entries)], family, proto).to_bytes(4, "little"))

    def affinity(self, family: int = 4, service_id: int = 7) -> dict[str, Any] | None:
        raw = self.dp.map("affinity").lookup(svc.affinity_key(service_id, 1, NODE_ADDR4 if family == 4 else NODE_ADDR6))
        return svc.AFFINITY.unpack(raw) if raw is not None else None

    def set_affinity(self, name: str, age_s: float, family: int = 4, service_id: int = 7) -> None:
        now = now_coarse()
        self.dp.map("affinity").update(
            svc.affinity_key(service_id, 1, NODE_ADDR4 if family == 4 else NODE_ADDR6),
            svc.AFFINITY.pack(last_used_ns=now - int(age_s * 1e9), backend_id=backend_id(name, family, Proto.TCP),
                              reserved=0))

    def counter(self, reason: int, verdict: int) -> int:
        values = self.dp.map("metrics").lookup_percpu(metrics_key(reason, TracePoint.SOCK, verdict)) or []
        return sum(METRICS_VALUE.unpack(v)["packets"] for v in values)


# --- fixtures -----------------------------------------------------------------------------------


def _new_cgroup() -> str:
    root = topology.cgroup_root()
    assert root is not None, "cgroup2 is not mounted"
    path = os.path.join(root, f"lace-it-{os.getpid()}-{next(_seq)}")
    os.mkdir(path)
    return path


def _rm_cgroup(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)   # the clients have exited: nothing keeps it busy


@pytest.fixture(scope="module")
def loaded() -> Iterator[tuple[LoadedDatapath, str, str]]:
    """The lace objects under a private pin root, with the socket hooks attached to a private cgroup."""
    ensure_bpffs()
    pin_root = os.path.join(BPFFS, f"lace-it-{os.getpid()}-sock")
    os.mkdir(pin_root)
    cgroup = _new_cgroup()
    dp = lb = None
    try:
        dp = load_objects(pin_root)
        dp.map("config").update(config_key(), config_value(
            locator="2001:db8:1::/48", underlay_addr=NODE_ADDR6, node_id=1, uplink_ifindex=1, mtu=1460,
            addr4=NODE_ADDR4))
        lb = SockLB(cgroup, os.path.join(pin_root, "links"))
        lb.attach(dp)
        yield dp, cgroup, pin_root
    finally:
        if lb is not None:
            lb.detach()
        if dp is not None:
            dp.close()
        shutil.rmtree(pin_root, ignore_errors=True)
        _rm_cgroup(cgroup)


def _serve_tcp(sock: socket.socket, name: str) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            with contextlib.suppress(OSError):
                conn.sendall(name.encode())


def _serve_udp(sock: socket.socket, name: str) -> None:
    while True:
        try:
            _, src = sock.recvfrom(64)
            if src is None:   # shut down
                return
            sock.sendto(name.encode(), src)
        except OSError:
            return


@pytest.fixture
def host(loaded: tuple[LoadedDatapath, str, str]) -> Iterator[Host]:
    """A fresh namespace whose loopback carries backends a, b and c (TCP and UDP, IPv4 and IPv6,
    port 8080), and service maps emptied of what an earlier test programmed."""
    dp, cgroup, _ = loaded
    for name in ("services", "backends", "affinity", "sock-revnat"):
        dp.map(name).clear()
    ns = f"lace-it-{os.getpid()}-{next(_seq)}"
    netlink.create_netns(ns)
    socks: list[socket.socket] = []
    try:
        netlink.set_up("lo", ns)
        for addrs in BACKENDS.values():
            netlink.add_address("lo", f"{addrs[4]}/32", ns)
            netlink.add_address("lo", f"{addrs[6]}/128", ns, nodad=True)
        with enter_netns(ns):
            for name, addrs in BACKENDS.items():
                for family, addr in addrs.items():
                    af = socket.AF_INET if family == 4 else socket.AF_INET6
                    t = socket.socket(af, socket.SOCK_STREAM)
                    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    t.bind((addr, BACKEND_PORT))
                    t.listen(64)
                    u = socket.socket(af, socket.SOCK_DGRAM)
                    u.bind((addr, BACKEND_PORT))
                    socks += [t, u]
                    threading.Thread(target=_serve_tcp, args=(t, name), daemon=True).start()
                    threading.Thread(target=_serve_udp, args=(u, name), daemon=True).start()
        yield Host(ns, cgroup, dp)
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        netlink.delete_netns(ns)


def vip(family: int) -> list[Any]:
    return [VIP[family], VIP_PORT]


# --- translation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [4, 6])
def test_tcp_connect_reaches_the_backend_and_getpeername_shows_the_vip(host: Host, family: int) -> None:
    host.service(active=["b"], family=family)
    before = host.counter(DropReason.NONE, Verdict.FORWARD)
    got = host.one("tcp", family)
    assert got.get("errno") is None, got
    assert got["data"] == "b"
    assert got["peer"] == vip(family)
    assert host.counter(DropReason.NONE, Verdict.FORWARD) == before + 1
    # the reverse entry: this socket, sent to b, asked for the VIP
    rev = host.dp.map("sock-revnat").lookup(svc.sock_revnat_key(got["cookie"], BACKENDS["b"][family], BACKEND_PORT))
    assert rev is not None
    assert svc.decode_sock_revnat(rev) == {"family": f"ipv{family}", "frontend": VIP[family], "port": VIP_PORT,
                                           "service_id": 7}


@pytest.mark.parametrize("family", [4, 6])
def test_udp_round_trips_show_the_vip_as_the_source(host: Host, family: int) -> None:
    host.service(active=["a"], family=family, proto=Proto.UDP)
    unconnected, connected = host.run([{"op": "udp", "addr": VIP[family], "port": VIP_PORT},
                                       {"op": "udp-connected", "addr": VIP[family], "port": VIP_PORT}])
    assert unconnected.get("errno") is None, unconnected
    assert unconnected["data"] == "a" and unconnected["from"] == vip(family)
    assert connected.get("errno") is None, connected
    assert connected["data"] == "a" and connected["from"] == vip(family) and connected["peer"] == vip(family)


def test_a_dual_stack_socket_reaches_an_ipv4_service_through_a_mapped_address(host: Host) -> None:
    mapped = f"::ffff:{VIP[4]}"
    host.service(active=["c"], family=4)
    host.service(active=["b"], family=4, proto=Proto.UDP)
    tcp, udp, udp_connected = host.run([{"op": op, "addr": mapped, "port": VIP_PORT}
                                        for op in ("tcp", "udp", "udp-connected")])
    assert tcp.get("errno") is None, tcp
    assert tcp["data"] == "c" and tcp["peer"] == [mapped, VIP_PORT]
    assert udp.get("errno") is None, udp
    assert udp["data"] == "b" and udp["from"] == [mapped, VIP_PORT]
    assert udp_connected.get("errno") is None, udp_connected
    assert udp_connected["data"] == "b" and udp_connected["from"] == udp_connected["peer"] == [mapped, VIP_PORT]


def test_the_protocol_is_part_of_the_frontend(host: Host) -> None:
    host.service(active=["a"], family=4, proto=Proto.UDP)
    # a TCP connect to the UDP-only frontend is not translated: nothing routes the VIP
    assert host.one("tcp")["errno"] == errno.ENETUNREACH


# --- who is translated ---------------------------------------------------------------------------


def test_a_process_outside_the_cgroup_is_not_translated(host: Host) -> None:
    host.service(active=["a"])
    assert host.one("tcp")["data"] == "a"
    outside = host.one("tcp", in_cgroup=False)
    assert outside["errno"] == errno.ENETUNREACH


def test_addresses_that_are_no_frontend_are_left_alone(host: Host) -> None:
    host.service(active=["a"])
    direct = host.one("tcp", addr=BACKENDS["b"][4], port=BACKEND_PORT)
    assert direct["data"] == "b" and direct["peer"] == [BACKENDS["b"][4], BACKEND_PORT]
    # same address, another port: not the frontend
    assert host.one("tcp", port=81)["errno"] == errno.ENETUNREACH


# --- selection -----------------------------------------------------------------------------------


def test_new_connections_spread_over_the_active_backends_only(host: Host) -> None:
    host.service(active=["a", "b"], terminating=["c"])
    got = host.many("tcp", 40)
    assert {g.get("errno") for g in got} == {None}
    assert {g["data"] for g in got} == {"a", "b"}  # 2 * 2^-40 that one of them is missed by chance


def test_terminating_backends_take_no_new_connections(host: Host) -> None:
    host.service(active=["a"], terminating=["b", "c"])
    assert {g["data"] for g in host.many("tcp", 20)} == {"a"}


def test_slot_selection_follows_the_socket_cookie(host: Host) -> None:
    host.service(active=["a", "b", "c"])
    for g in host.many("tcp", 12):
        assert g["data"] == ["a", "b", "c"][lb_hash64(g["cookie"]) % 3]


def test_the_maglev_table_decides_when_there_is_one(host: Host) -> None:
    host.maglev(1, ["c", "b"])   # entry i: c when i is even, b when odd
    host.service(active=["a", "b", "c"], maglev=1)
    got = host.many("tcp", 16)
    for g in got:
        assert g["data"] == ("c" if lb_hash64(g["cookie"]) % svc.MAGLEV_SIZE % 2 == 0 else "b"), g
    assert "a" not in {g["data"] for g in got}


@pytest.mark.parametrize("family", [4, 6])
def test_no_active_backend_refuses_the_connection(host: Host, family: int) -> None:
    host.service(active=[], terminating=["a"], family=family)
    host.service(active=[], terminating=["a"], family=family, proto=Proto.UDP, service_id=8)
    before = host.counter(DropReason.SERVICE_NO_BACKEND, Verdict.DROP)
    tcp, udp, udp_connected = host.run([{"op": op, "addr": VIP[family], "port": VIP_PORT}
                                        for op in ("tcp", "udp", "udp-connected")])
    assert tcp["errno"] == errno.ECONNREFUSED
    assert udp["errno"] == errno.ECONNREFUSED
    assert udp_connected["errno"] == errno.ECONNREFUSED
    assert host.counter(DropReason.SERVICE_NO_BACKEND, Verdict.DROP) == before + 3


# --- ClientIP affinity: the node is one client, named by its own address -------------------------


@pytest.mark.parametrize("family", [4, 6])
def test_affinity_keeps_the_node_on_one_backend(host: Host, family: int) -> None:
    host.service(active=["a", "b", "c"], family=family, flags=svc.ServiceFlag.AFFINITY, affinity_timeout=300)
    got = host.many("tcp", 12, family)
    assert len({g["data"] for g in got}) == 1
    entry = host.affinity(family)
    assert entry is not None
    assert entry["backend_id"] == backend_id(got[0]["data"], family, Proto.TCP)


def test_an_affinity_entry_is_honoured_until_it_expires(host: Host) -> None:
    host.service(active=["a", "b", "c"], flags=svc.ServiceFlag.AFFINITY, affinity_timeout=60)
    host.set_affinity("b", age_s=30)
    assert {g["data"] for g in host.many("tcp", 8)} == {"b"}
    # used just now: the entry's clock moved on
    entry = host.affinity()
    assert entry is not None and now_coarse() - entry["last_used_ns"] < 10e9
    # older than the timeout: chosen afresh (by the cookie's hash) and recorded
    host.set_affinity("b", age_s=120)
    first = host.one("tcp")
    assert first["data"] == ["a", "b", "c"][lb_hash64(first["cookie"]) % 3]
    entry = host.affinity()
    assert entry is not None and entry["backend_id"] == backend_id(first["data"], 4, Proto.TCP)


def test_affinity_to_a_terminating_backend_is_dropped(host: Host) -> None:
    host.service(active=["a"], terminating=["b"], flags=svc.ServiceFlag.AFFINITY, affinity_timeout=60)
    host.set_affinity("b", age_s=1)
    assert host.one("tcp")["data"] == "a"
    entry = host.affinity()
    assert entry is not None and entry["backend_id"] == backend_id("a", 4, Proto.TCP)


def test_without_the_affinity_flag_no_entry_is_kept(host: Host) -> None:
    host.service(active=["a", "b"], affinity_timeout=60)
    host.set_affinity("b", age_s=1)
    for g in host.many("tcp", 6):
        assert g["data"] == ["a", "b"][lb_hash64(g["cookie"]) % 2]


# --- attaching: pinned links, restarts, detach --------------------------------------------------


#: the hooks as bpftool names their attach types
BPFTOOL_ATTACH_TYPES = ["cgroup_inet4_connect", "cgroup_inet6_connect", "cgroup_udp4_sendmsg", "cgroup_udp6_sendmsg",
                        "cgroup_udp4_recvmsg", "cgroup_udp6_recvmsg", "cgroup_inet4_getpeername",
                        "cgroup_inet6_getpeername", "cgroup_inet_sock_release"]


def _bpftool_cgroup(path: str) -> list[dict[str, Any]]:
    res = subprocess.run(["bpftool", "-j", "cgroup", "show", path], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip() or "[]")


def test_pinned_links_survive_the_agent_and_a_restart_updates_them_in_place(loaded, host: Host) -> None:
    _, _, pin_root = loaded
    cgroup = _new_cgroup()
    links_dir = os.path.join(pin_root, f"links-{next(_seq)}")
    other = None
    try:
        first = SockLB(cgroup, links_dir)
        first.attach(host.dp)
        ids = first.link_ids()
        assert sorted(ids) == sorted(HOOK_PROGRAMS)
        assert sorted(a["attach_type"] for a in _bpftool_cgroup(cgroup)) == sorted(BPFTOOL_ATTACH_TYPES)
        first.close()   # the agent stops: its fds go, the pinned links stay

        host.service(active=["a"])
        probe = Host(host.netns, cgroup, host.dp)
        assert probe.one("tcp")["data"] == "a"

        # a restarted agent loads new program instances and swaps them into the same links
        other = load_objects(pin_root)
        again = SockLB(cgroup, links_dir)
        again.attach(other)
        assert again.link_ids() == ids
        for hook in ids:
            with Link.open_pinned(os.path.join(links_dir, link_name(hook))) as link:
                assert link.info().prog_id == other.program(HOOK_PROGRAMS[hook]).info().id
        assert len(_bpftool_cgroup(cgroup)) == len(HOOK_PROGRAMS)   # swapped, not attached twice
        assert probe.one("tcp")["data"] == "a"
        again.close()

        # the cgroup made again: the old links point at nothing and are replaced
        os.rmdir(cgroup)
        os.mkdir(cgroup)
        fresh = SockLB(cgroup, links_dir)
        fresh.attach(other)
        assert set(fresh.link_ids().values()).isdisjoint(ids.values())
        with Link.open_pinned(os.path.join(links_dir, link_name("connect4"))) as link:
            assert cgroup_link_target(link) == (os.stat(cgroup).st_ino, 10)
        assert len(_bpftool_cgroup(cgroup)) == len(HOOK_PROGRAMS)
        assert probe.one("tcp")["data"] == "a"

        fresh.detach()
        assert os.listdir(links_dir) == []
        assert _bpftool_cgroup(cgroup) == []
        assert probe.one("tcp")["errno"] == errno.ENETUNREACH
    finally:
        if other is not None:
            other.close()
        shutil.rmtree(links_dir, ignore_errors=True)   # unpinned and closed: detached
        _rm_cgroup(cgroup)


def test_a_missing_cgroup_is_named(loaded) -> None:
    dp, _, pin_root = loaded
    with pytest.raises(SockLBError, match="cgroup /nonexistent/lace does not exist"):
        SockLB("/nonexistent/lace", os.path.join(pin_root, "links-none")).attach(dp)


# --- the lab: a node's host cgroup, joined by lace exec ------------------------------------------


def test_lab_nodes_get_a_host_cgroup_that_lace_exec_joins(tmp_path, monkeypatch) -> None:
    name = f"s{os.getpid() % 100000}"
    state = tmp_path / "state"
    ctx_dir = state / "labs" / name
    try:
        lab = topology.build(topology.LabSpec(name, 1), state_dir=ctx_dir)
        node = lab.node("worker-1")
        assert node.cgroup == os.path.join(topology.cgroup_root() or "", f"lace-{name}", "worker-1")
        assert os.path.isdir(node.cgroup)
        assert topology.load(name, state_dir=ctx_dir).node("worker-1").cgroup == node.cgroup  # type: ignore[union-attr]

        # what lace exec runs instead of the node command: a probe that says where it runs
        probe = ("import os; print(open('/proc/self/cgroup').read().strip().splitlines()[-1]); "
                 "print(os.stat('/proc/self/ns/net').st_ino)")
        monkeypatch.setattr(lexec, "_node_executable", lambda: [sys.executable, "-S", "-c", probe])
        out, err = io.StringIO(), io.StringIO()
        inv = Invocation(env={"LACE_STATE_DIR": str(state)}, stdin=io.StringIO(), stdout=out, stderr=err)
        args = argparse.Namespace(lab=name, node="worker-1", context=None, cmd=["--", "node"])
        assert lexec.exec_lab(args, ["node"], inv) == 0, err.getvalue()
        cgroup_line, netns_inode = out.getvalue().split()
        assert cgroup_line == f"0::/lace-{name}/worker-1"
        assert int(netns_inode) == netlink.netns.inode(node.netns)
    finally:
        topology.destroy(name, ctx_dir)
    assert not os.path.exists(os.path.join(topology.cgroup_root() or "/nonexistent", f"lace-{name}"))


# --- connected UDP sockets whose backend left ---------------------------------------------------

HELD = r"""
import json, socket, sys
SO_COOKIE = 57
vip, port = sys.argv[1], int(sys.argv[2])
fam = socket.AF_INET6 if ":" in vip else socket.AF_INET
def ask(s):
    try:
        s.send(b"hi")
        return s.recv(16).decode()
    except OSError as e:
        return e.errno
socks = [socket.socket(fam, socket.SOCK_DGRAM) for _ in range(2)]
for s in socks:
    s.settimeout(1)
    s.connect((vip, port))
print(json.dumps([[int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little"), ask(s)]
                  for s in socks]), flush=True)
sys.stdin.readline()
out = [ask(s) for s in socks]
socks[0].connect((vip, port))
print(json.dumps(out + [[ask(socks[0]) for _ in range(2)]]), flush=True)
"""


@pytest.mark.parametrize("family", [4, 6])
def test_a_connected_udp_socket_whose_backend_left_is_terminated_and_connects_again_to_a_live_one(
        host: Host, family: int) -> None:
    """Two host sockets connected to a UDP VIP, one translated to backend a; a leaves the service
    (b takes it): terminate_udp destroys the socket connected to a — its next call fails, and
    connecting again reaches b — and leaves a socket of another backend alone."""
    import errno

    from lace.agent.socklb import terminate_udp
    from lace.datapath.common import NETWORK_DEFAULT

    host.service(active=["a"], family=family, proto=Proto.UDP)
    fd = os.open(netlink.netns.path(host.netns), os.O_RDONLY | os.O_CLOEXEC)

    def enter() -> None:
        nsenter.setns(fd)
        topology.join_cgroup(host.cgroup)

    proc = subprocess.Popen([sys.executable, "-S", "-c", HELD, VIP[family], str(VIP_PORT)], preexec_fn=enter,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        (c0, a0), (c1, a1) = json.loads(proc.stdout.readline())
        assert a0 == a1 == "a"
        # the second socket stands for one another service sent to another backend: its entry names c
        rev = host.dp.map("sock-revnat")
        key1 = svc.sock_revnat_key(c1, BACKENDS["a"][family], BACKEND_PORT)
        value1 = rev.lookup(key1)
        rev.delete(key1)
        rev.update(svc.sock_revnat_key(c1, BACKENDS["c"][family], BACKEND_PORT), value1)
        host.service(active=["b"], family=family, proto=Proto.UDP)
        departed = [(svc.revnat_key(NETWORK_DEFAULT, BACKENDS["a"][family], BACKEND_PORT, Proto.UDP),
                     (NETWORK_DEFAULT, VIP[family], VIP_PORT)),
                    (svc.revnat_key(NETWORK_DEFAULT, BACKENDS["c"][family], BACKEND_PORT, Proto.UDP),
                     (NETWORK_DEFAULT, "10.96.9.9" if family == 4 else "fd00:96::99", VIP_PORT))]
        with enter_netns(host.netns):
            assert terminate_udp(rev, departed) == 1
        proc.stdin.write("go\n")
        proc.stdin.flush()
        first, second, again = json.loads(proc.stdout.readline())
        # disconnected: a send fails for want of a destination (a receive pending then got ECONNABORTED)
        assert first in (errno.EDESTADDRREQ, errno.ECONNABORTED), f"terminated: {first}"
        assert second == "a", "the other socket is left alone"
        # connected again: the abort still pending is reported once, then the live backend answers
        assert again[0] in ("b", errno.ECONNABORTED) and again[1] == "b", again
    finally:
        proc.kill()
        proc.wait()
        os.close(fd)
