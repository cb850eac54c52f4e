"""Kubelet probes into isolated networks against the real kernel (bpf/lib/probe.h): real sockets,
the lace objects loaded under a throw-away pin root, the maps written here directly.

The node is a fresh namespace with the host device as the agent makes it (lace_host with the host
addresses, NOARP, routes of the default network's CIDRs from them; lace_net with lace_from_host on
tcx ingress) and two pods, red (network 2) and blue (network 3), each in its own namespace behind
a veth with lace_from_pod, each with THE SAME addresses and a server on the same port that answers
its own name and the address it sees. Each pod has its own probe address from the node's block of
the default network. The node's host cgroup (a throw-away cgroup with the socket hooks attached)
has a ``kubelet`` child whose ID is in the config.

The kernel's sockets are the oracle for what gets through; the metrics, trace events, conntrack
entries and probe-cookie map for how."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from lace import netlink, nsenter
from lace.agent.socklb import SockLB
from lace.bpf import BPFFS, Link, RingBuffer, attach_tcx, ensure_bpffs
from lace.bpf.cgroup import cgroup_id
from lace.datapath import delivery as dlv
from lace.datapath.common import SEGMENT_HOST, Verdict, addr_str, mac_bytes
from lace.datapath.config import config_key, config_value
from lace.datapath.conntrack import CT_ENTRY, CtFlag, ct_key
from lace.datapath.delivery import DeliveryKind, delivery_key
from lace.datapath.devices import DeviceRole, device_key, device_value
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.node import LoadedDatapath, load_objects
from lace.datapath.probes import (PROBE_COOKIE, ProbeFlag, probe_address_key, probe_cookie_key, probe_key,
                                  probe_value)
from lace.datapath.reasons import DropReason, TracePoint
from lace.datapath.routing import route_value, routing_key
from lace.datapath.segment import segment_key, segment_value
from lace.datapath.trace import METRICS_VALUE, TRACE_EVENT, metrics_key

pytestmark = pytest.mark.privileged

DEFAULT = 1
HOST = {4: "10.244.0.1", 6: "fd00:10:244::1"}
CIDR = {4: "10.244.0.0/16", 6: "fd00:10:244::/56"}
POD = {4: "10.10.0.5", 6: "fd00:10:10::5"}          # both pods' own addresses, each in its network
PORT, OTHER_PORT = 8080, 9090                      # the probed port; another port the pods serve too
MTU = 1460
GATEWAY4, GATEWAY6 = "169.254.1.1", "fe80::1"       # the pods' link-local gateway (as CNI ADD makes it)


@dataclass
class PodSpec:
    name: str
    network: int
    segment: int
    endpoint_id: int
    mac: str
    probe: dict[int, str]      # its probe address per family, in the node's block of the default network


PODS = [PodSpec("red", 2, 300, 1, "02:00:00:00:b0:02", {4: "10.244.0.200", 6: "fd00:10:244::c8"}),
        PodSpec("blue", 3, 301, 2, "02:00:00:00:b0:03", {4: "10.244.0.201", 6: "fd00:10:244::c9"})]
_seq = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid() % 100000}-{next(_seq)}"


# --- the probing process: a process in the node's namespace and one of its cgroups -------------------

CLIENT = r"""
import json, socket, sys
op = json.loads(sys.argv[1])
s = socket.socket(socket.AF_INET6 if ":" in op["addr"] else socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(op["timeout"])
out = {"cookie": int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), "little")}   # SO_COOKIE
try:
    s.connect((op["addr"], op["port"]))
    out["local"] = list(s.getsockname()[:2])
    out["peer"] = list(s.getpeername()[:2])
    out["data"] = s.recv(64).decode()
except TimeoutError:
    out["timeout"] = True
except OSError as e:
    out["errno"] = e.errno
print(json.dumps(out), flush=True)
if op["hold"]:
    sys.stdin.readline()       # the test looks at the maps while the socket is open
s.close()
"""


def cgroup_root() -> str:
    for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.isfile(os.path.join(root, "cgroup.controllers")):   # only cgroup2 has it
            return root
    pytest.skip("cgroup2 is not mounted")


@dataclass
class Node:
    netns: str
    host_cgroup: str
    kubelet_cgroup: str
    dp: LoadedDatapath
    ifindex: dict[str, int]          # pod name -> host side of its veth
    events: list[dict[str, Any]] = field(default_factory=list)
    ring: RingBuffer | None = None

    def client(self, addr: str, port: int = PORT, *, cgroup: str | None, timeout: float = 3.0,
               hold: bool = False) -> subprocess.Popen[str]:
        """A process in the node's namespace (and in ``cgroup``; None: stays in the test's own)
        connecting to addr:port; its result is the first line of its output."""
        fd = os.open(netlink.netns.path(self.netns), os.O_RDONLY | os.O_CLOEXEC)

        def enter() -> None:
            nsenter.setns(fd)
            if cgroup is not None:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write("0")

        op = {"addr": addr, "port": port, "timeout": timeout, "hold": hold}
        try:
            return subprocess.Popen([sys.executable, "-S", "-c", CLIENT, json.dumps(op)], preexec_fn=enter,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        finally:
            os.close(fd)

    def connect(self, addr: str, port: int = PORT, *, cgroup: str | None, timeout: float = 3.0) -> dict[str, Any]:
        proc = self.client(addr, port, cgroup=cgroup, timeout=timeout)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        return json.loads(out)

    def kubelet(self, addr: str, port: int = PORT, **kw: Any) -> dict[str, Any]:
        return self.connect(addr, port, cgroup=self.kubelet_cgroup, **kw)

    def counter(self, reason: int, point: int = TracePoint.FROM_HOST, verdict: int = Verdict.DROP) -> int:
        values = self.dp.map("metrics").lookup_percpu(metrics_key(reason, point, verdict)) or []
        return sum(METRICS_VALUE.unpack(v)["packets"] for v in values)

    def drops(self, reason: int, daddr: str, dport: int) -> list[dict[str, Any]]:
        """Drop events for reason to daddr:dport since the last call."""
        assert self.ring is not None
        self.ring.consume()
        events, self.events[:] = list(self.events), []
        return [e for e in events if e["verdict"] == Verdict.DROP and e["reason"] == reason
                and addr_str(e["family"], e["daddr"]) == daddr and e["dport"] == dport]

    def ct(self, net: int, src: str, dst: str, sport: int, dport: int) -> dict[str, Any] | None:
        fam, key = ct_key(net, src, dst, sport, dport, 6)
        raw = self.dp.map(f"ct-tcp-v{int(fam)}").lookup(key)
        return CT_ENTRY.unpack(raw) if raw is not None else None

    def cookie(self, cookie: int) -> dict[str, Any] | None:
        raw = self.dp.map("probe-cookie").lookup(probe_cookie_key(cookie))
        return PROBE_COOKIE.unpack(raw) if raw is not None else None

    def configure(self, kubelet_cgroup: int) -> None:
        self.dp.map("config").update(config_key(), config_value(
            locator="2001:db8:1::/48", underlay_addr="2001:db8:f::1", node_id=1, uplink_ifindex=1, mtu=MTU,
            kubelet_cgroup=kubelet_cgroup))


def _serve(sock: socket.socket, name: str) -> None:
    """Answer every connection with the pod's name and the address the pod sees it from."""
    while True:
        try:
            conn, peer = sock.accept()
        except OSError:
            return
        with conn:
            with contextlib.suppress(OSError):
                conn.sendall(f"{name} {peer[0]}".encode())


def _plumb_pod(node_ns: str, pod_ns: str, host_if: str, spec: PodSpec) -> netlink.LinkInfo:
    """The pod's veth as CNI ADD makes it: its /32 and /128, a link-local gateway by permanent
    neighbours; returns the host side."""
    host = netlink.veth_pair(host_if, "eth0", netns=node_ns, peer_netns=pod_ns, peer_mac=spec.mac, mtu=MTU)
    for dev, ns in ((host_if, node_ns), ("lo", pod_ns), ("eth0", pod_ns)):
        netlink.set_up(dev, ns)
    netlink.add_address("eth0", f"{POD[4]}/32", pod_ns)
    netlink.add_address("eth0", f"{POD[6]}/128", pod_ns)
    netlink.add_neighbor(GATEWAY4, host.mac, "eth0", netns=pod_ns)
    netlink.add_neighbor(GATEWAY6, host.mac, "eth0", netns=pod_ns)
    netlink.add_route(f"{GATEWAY4}/32", netns=pod_ns, dev="eth0", scope="link")
    netlink.add_route("0.0.0.0/0", netns=pod_ns, via=GATEWAY4, dev="eth0")
    netlink.add_route("::/0", netns=pod_ns, via=GATEWAY6, dev="eth0")
    return host


def _deliver(dp: LoadedDatapath, key: bytes, value: bytes) -> None:
    """A full-length delivery entry as the agent writes it: the trie, then the exact map."""
    dp.map("delivery").update(key, value)
    dp.map("delivery-exact").update(dlv.exact_key(key), value)


def _program(dp: LoadedDatapath, net_ifindex: int, net_mac: str, pods: dict[str, netlink.LinkInfo]) -> None:
    """The maps as the agent would write them for this node, written directly."""
    dp.map("devices").update(device_key(net_ifindex), device_value(net_mac, DeviceRole.HOST))
    for fam in (4, 6):
        plen = 32 if fam == 4 else 128
        dp.map("segment").update(segment_key(DEFAULT, HOST[fam]), segment_value(SEGMENT_HOST, local=True))
        _deliver(dp, delivery_key(DEFAULT, f"{HOST[fam]}/{plen}"), dlv.DELIVERY.pack(kind=DeliveryKind.HOST))
        dp.map("routing").update(routing_key(DEFAULT, CIDR[fam]), route_value(DEFAULT))
    for spec in PODS:
        host = pods[spec.name]
        dp.map("veth").update(veth_key(host.ifindex), endpoint_value(
            endpoint_id=spec.endpoint_id, network=spec.network, segment=spec.segment, mac=spec.mac,
            ipv4=POD[4], ipv6=POD[6]))
        for fam in (4, 6):
            plen = 32 if fam == 4 else 128
            _deliver(dp, delivery_key(spec.network, f"{POD[fam]}/{plen}"), dlv.DELIVERY.pack(
                kind=DeliveryKind.LOCAL, ifindex=host.ifindex, mac=mac_bytes(spec.mac),
                host_mac=mac_bytes(host.mac), endpoint_id=spec.endpoint_id))
            dp.map("segment").update(segment_key(spec.network, POD[fam]), segment_value(spec.segment, local=True))
            target = dict(network=spec.network, endpoint_id=spec.endpoint_id, ifindex=host.ifindex,
                          target_addr=POD[fam])
            dp.map("probes").update(probe_key(spec.probe[fam], PORT), probe_value(**target, target_port=PORT))
            dp.map("probes").update(probe_address_key(spec.probe[fam]),
                                    probe_value(**target, target_port=0, flags=ProbeFlag.ADDRESS))


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    ensure_bpffs()
    root = cgroup_root()
    node_ns, pin_root = unique("lace-it-pn"), os.path.join(BPFFS, unique("lace-it-probes-"))
    pod_ns = {spec.name: unique(f"lace-it-p{spec.name[0]}") for spec in PODS}
    host_cgroup = os.path.join(root, unique("lace-it-probes-"))
    kubelet = os.path.join(host_cgroup, "kubelet")
    made_ns: list[str] = []
    links: list[Link] = []
    socks: list[socket.socket] = []
    dp: LoadedDatapath | None = None
    lb: SockLB | None = None
    ring: RingBuffer | None = None
    try:
        for ns in (node_ns, *pod_ns.values()):
            netlink.create_netns(ns)
            made_ns.append(ns)
        os.mkdir(host_cgroup)
        os.mkdir(kubelet)
        os.mkdir(pin_root)

        netlink.set_up("lo", node_ns)
        for key, value in (("net.ipv4.conf.all.rp_filter", 0), ("net.ipv4.conf.default.rp_filter", 0),
                           ("net.ipv6.conf.all.forwarding", 1)):
            netlink.sysctl(node_ns, key, value)
        # the host device (lace.agent.hostdev's shape, made here so the test needs only netlink)
        netlink.veth_pair("lace_host", "lace_net", netns=node_ns, mtu=MTU)
        netlink.set_arp("lace_host", False, node_ns)
        for fam in (4, 6):
            netlink.add_address("lace_host", f"{HOST[fam]}/{32 if fam == 4 else 128}", node_ns)
        netlink.set_up("lace_net", node_ns)
        netlink.set_up("lace_host", node_ns)
        for fam in (4, 6):
            netlink.add_route(CIDR[fam], netns=node_ns, dev="lace_host", src=HOST[fam])
        net = netlink.link("lace_net", node_ns)
        assert net is not None
        pods = {spec.name: _plumb_pod(node_ns, pod_ns[spec.name], f"lxp{spec.name}", spec) for spec in PODS}

        dp = load_objects(pin_root)
        links.append(attach_tcx(dp.program("lace_from_host"), net.ifindex, "ingress", netns=node_ns))
        for host in pods.values():
            links.append(attach_tcx(dp.program("lace_from_pod"), host.ifindex, "ingress", netns=node_ns))
        lb = SockLB(host_cgroup, os.path.join(pin_root, "links"))
        lb.attach(dp)
        _program(dp, net.ifindex, net.mac, pods)

        for spec in PODS:
            with netlink.entered(pod_ns[spec.name]):
                for fam in (4, 6):
                    for port in (PORT, OTHER_PORT):
                        s = socket.create_server((POD[fam], port), family=socket.AF_INET if fam == 4 else socket.AF_INET6)
                        socks.append(s)
                        threading.Thread(target=_serve, args=(s, spec.name), daemon=True).start()

        n = Node(node_ns, host_cgroup, kubelet, dp, {name: link.ifindex for name, link in pods.items()})
        ring = n.ring = RingBuffer(dp.map("events"), lambda data: n.events.append(TRACE_EVENT.unpack(data)))
        n.configure(cgroup_id(kubelet))
        yield n
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        if ring is not None:
            ring.close()
        if lb is not None:
            with contextlib.suppress(Exception):
                lb.detach()
        for link in links:
            with contextlib.suppress(Exception):
                link.close()
        if dp is not None:
            dp.close()
        shutil.rmtree(pin_root, ignore_errors=True)
        for ns in made_ns:
            with contextlib.suppress(Exception):
                netlink.delete_netns(ns)
        for cg in (kubelet, host_cgroup):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(cg)     # the clients have exited: nothing keeps them busy
    assert not os.path.exists(host_cgroup) and not os.path.exists(pin_root)
    assert not any(netlink.netns_exists(ns) for ns in made_ns)


# --- the kubelet reaches each pod through its own probe address ---------------------------------------


@pytest.mark.parametrize("family", [4, 6])
def test_the_kubelet_reaches_each_of_two_pods_with_the_same_address_by_its_probe_address(node: Node, family: int) -> None:
    for spec in PODS:
        probe = spec.probe[family]
        got = node.kubelet(probe)
        assert got.get("timeout") is None and got.get("errno") is None, got
        assert got["data"] == f"{spec.name} {HOST[family]}", "that pod, seeing the host's own address"
        assert got["peer"] == [probe, PORT], "the kubelet's socket keeps the probe address"
        # the flow as the host device recorded it: a one-backend service flagged PROBE
        sport = got["local"][1]
        fe = node.ct(DEFAULT, HOST[family], probe, sport, PORT)
        assert fe is not None and fe["flags"] & CtFlag.SERVICE and fe["flags"] & CtFlag.PROBE
        assert addr_str(family, fe["nat_addr"]) == POD[family] and fe["nat_port"] == PORT
        assert fe["dst_network"] == spec.network and fe["src_segment"] == SEGMENT_HOST
        be = node.ct(DEFAULT, HOST[family], POD[family], sport, PORT)
        assert be is not None and be["flags"] & CtFlag.DNAT and be["flags"] & CtFlag.PROBE
        assert addr_str(family, be["nat_addr"]) == probe and be["flags"] & CtFlag.SEEN_REPLY
        alias = node.ct(spec.network, HOST[family], POD[family], sport, PORT)
        assert alias is not None and alias["flags"] == CtFlag.ALIAS and alias["dst_network"] == DEFAULT


def test_a_dual_stack_kubelet_socket_probes_through_an_ipv4_mapped_address(node: Node) -> None:
    got = node.kubelet(f"::ffff:{PODS[1].probe[4]}")
    assert got.get("timeout") is None and got.get("errno") is None, got
    assert got["data"] == f"blue {HOST[4]}"


# --- nobody else ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [4, 6])
def test_a_process_outside_the_kubelets_cgroup_is_refused_and_the_drop_is_named(node: Node, family: int) -> None:
    probe = PODS[0].probe[family]
    node.drops(DropReason.PROBE_DENIED, probe, PORT)     # forget older events
    before = node.counter(DropReason.PROBE_DENIED)
    # the node's host cgroup (hooks run, but it is not the kubelet), then a process of no host cgroup
    for cgroup in (node.host_cgroup, None):
        proc = node.client(probe, cgroup=cgroup, timeout=1.5, hold=True)
        try:
            assert proc.stdout is not None
            got = json.loads(proc.stdout.readline())
            assert got.get("timeout") is True, got
            assert node.cookie(got["cookie"]) is None, "its socket was not recorded"
        finally:
            proc.communicate("\n", timeout=30)
    assert node.counter(DropReason.PROBE_DENIED) >= before + 2, "SYNs dropped at the host device"
    events = node.drops(DropReason.PROBE_DENIED, probe, PORT)
    assert events and all(e["point"] == TracePoint.FROM_HOST for e in events)
    assert addr_str(family, events[-1]["saddr"]) == HOST[family]
    # the kubelet still gets through
    assert node.kubelet(probe)["data"] == f"red {HOST[family]}"


@pytest.mark.parametrize("family", [4, 6])
def test_another_port_of_a_probe_address_is_denied_even_to_the_kubelet(node: Node, family: int) -> None:
    probe = PODS[1].probe[family]
    node.drops(DropReason.PROBE_DENIED, probe, OTHER_PORT)
    before = node.counter(DropReason.PROBE_DENIED)
    got = node.kubelet(probe, OTHER_PORT, timeout=1.5)
    assert got.get("timeout") is True, got           # blue serves OTHER_PORT too: the path is closed
    assert node.counter(DropReason.PROBE_DENIED) > before
    assert node.drops(DropReason.PROBE_DENIED, probe, OTHER_PORT)


def test_with_no_kubelet_cgroup_configured_every_host_process_may_probe(node: Node) -> None:
    try:
        node.configure(0)
        got = node.connect(PODS[0].probe[4], cgroup=node.host_cgroup)
        assert got.get("data") == f"red {HOST[4]}", got
        # still only the host cgroup's processes: nothing records a socket of another cgroup
        got = node.connect(PODS[0].probe[4], cgroup=None, timeout=1.5)
        assert got.get("timeout") is True, got
    finally:
        node.configure(cgroup_id(node.kubelet_cgroup))


# --- probe-cookie lives as long as the socket ---------------------------------------------------------


@pytest.mark.parametrize("family", [4, 6])
def test_the_cookie_entry_lives_while_the_socket_is_open_and_goes_with_it(node: Node, family: int) -> None:
    spec = PODS[1]
    proc = node.client(spec.probe[family], cgroup=node.kubelet_cgroup, hold=True)
    try:
        assert proc.stdout is not None
        got = json.loads(proc.stdout.readline())
        assert got.get("data") == f"blue {HOST[family]}", got
        entry = node.cookie(got["cookie"])
        assert entry is not None, "recorded at connect"
        assert addr_str(family, entry["orig_addr"]) == spec.probe[family] and entry["orig_port"] == PORT
        assert entry["family"] == family and entry["proto"] == 6 and entry["network"] == spec.network
        assert entry["created_ns"] > 0
    finally:
        out, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0, err
    assert node.cookie(got["cookie"]) is None, "sock_release removed it"
