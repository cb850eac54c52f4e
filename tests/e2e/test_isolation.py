"""Isolation, tested as an attacker would: every attempt is a test that crafts the attacker's frames
(scapy, sent from a raw socket inside the attacker's namespace), then checks both sides — nothing
reached the victim (a capture in the victim's namespace holds none of them, or the connection
failed) and the datapath named the drop where it dropped it (``node trace flow``).

The attacker is a pod of the default network on worker-1. Its victims: ``neighbour`` (same node,
same network), ``victim`` (worker-2), ``isolated`` (worker-2, in a network of its own with a
ClusterIP service) and ``guarded`` (the same network, worker-1, probed by the kubelet through probe
addresses). ``peer`` on worker-3 is an honest client, to show traffic to the real owners keeps
flowing. The outside namespace attacks too: crafted SRv6 to a node's SID, a pod address, a ClusterIP.
The agent's socket and pinned maps are checked as a non-root process would try them."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import (ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6ND_RA, ICMPv6NDOptDstLLAddr,
                                ICMPv6NDOptPrefixInfo, ICMPv6NDOptSrcLLAddr, IPv6)
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scapy.utils import rdpcap

from lace.datapath import config as cfgmod
from lace.lab import topology
from lace.lab.kubelet import sandbox_netns
from lace.nsenter import entered

from .conftest import ips, namespace, network, pod, wait_for
from .test_outside import external_service, node_addr, node_port, outside_get, service_obj
from .test_probes import PORT as PROBE_PORT, on_host, probe_ip, probed_pod, wait_ready
from .test_service_traffic import programmed, service, vips

ATTACKER = "worker-1"


@dataclass
class World:
    ns: str
    net: str                  # the isolated network
    net_id: int
    pods: dict[str, dict]
    sandbox: dict[str, str]   # pod name -> its network namespace

    def addr(self, name: str, family: int) -> str:
        return ips(self.pods[name])[0 if family == 4 else 1]

    def netns(self, name: str) -> str:
        return self.sandbox[name]


def link_of(netns: str) -> tuple[str, str]:
    """(the pod's MAC, its gateway's MAC): what an attacker inside reads off its own interface."""
    out = subprocess.run(["ip", "-n", netns, "-j", "link", "show", "eth0"], capture_output=True, text=True,
                         check=True).stdout
    mac = json.loads(out)[0]["address"]
    out = subprocess.run(["ip", "-n", netns, "-j", "neigh", "show", "169.254.1.1", "dev", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    return mac, json.loads(out)[0]["lladdr"]


def link_local(mac: str) -> str:
    """The link-local address the kernel derives from mac (EUI-64)."""
    b = bytes.fromhex(mac.replace(":", ""))
    return str(ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + bytes([b[0] ^ 2, b[1], b[2], 0xff, 0xfe, *b[3:]])))


@pytest.fixture(scope="module")
def world(lab):
    tag = uuid.uuid4().hex[:6]
    ns, net = f"iso-{tag}", f"iso{tag}"
    lab.apply([namespace(ns), network(net, "10.77.0.0/16", "fd77::/64")])
    try:
        lab.apply([pod("attacker", ns, ATTACKER), pod("neighbour", ns, ATTACKER), pod("victim", ns, "worker-2"),
                   pod("peer", ns, "worker-3"), pod("isolated", ns, "worker-2", net),
                   probed_pod("guarded", ns, ATTACKER, net, liveness=False),
                   service("hidden", ns, {"app": "isolated"}, network_name=net)])
        ps = lab.wait(ns, ["attacker", "neighbour", "victim", "peer", "isolated", "guarded"])
        ps.update(wait_ready(lab, ns, ["guarded"]))
        _, out, _ = lab.lace("get", "networks", net, "-o", "json")
        yield World(ns, net, int(json.loads(out)["status"]["id"]), ps,
                    {n: sandbox_netns(lab.name, p["metadata"]["uid"]) for n, p in ps.items()})
    finally:
        lab.lace("delete", "namespace", ns, check=False)
        wait_for(lambda: not lab.pods(ns), f"the pods of {ns} to go", timeout=60)
        lab.lace("delete", "network", net, check=False)


# -- the attacker's tools and the victim's eyes ------------------------------------------------------

def inject(netns: str, frames: list[bytes], ifname: str = "eth0") -> None:
    """Each frame out of ifname in netns, as is (a raw socket: no routing, no neighbour lookup)."""
    with entered(netns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    try:
        s.bind((ifname, 0))
        for f in frames:
            s.send(f)
    finally:
        s.close()


class Capture:
    """tcpdump on a namespace's eth0 (an oracle independent of lace), to a pcap file."""

    def __init__(self, netns: str, bpf_filter: str) -> None:
        fd, self.path = tempfile.mkstemp(suffix=".pcap")
        os.close(fd)
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, "tcpdump", "-U", "-nn", "-i", "eth0", "-w",
                                      self.path, bpf_filter], stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()      # "listening on eth0 ..." once the filter is in place
        assert "listening" in line, line

    def packets(self) -> list:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=10)
        try:
            return list(rdpcap(self.path))
        finally:
            os.unlink(self.path)

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.path.exists(self.path):
            os.unlink(self.path)


def carrying(pkts: list, token: bytes) -> list:
    return [p for p in pkts if token in bytes(p)]


#: slack between the test's wall clock and an event's ``time`` (its monotonic stamp on the wall
#: clock, lace.datapath.trace.wall_time): far below the seconds between two tests' attacks
CLOCK_SLACK = 0.2


def drops(lab, node: str, reason: str, point: str, since: float, **fields) -> list[dict]:
    """The drops ``node trace flow`` shows for reason at point since ``since`` (time.time()) whose
    fields match."""
    rc, out, err = lab.lace("exec", "--node", node, "--", "node", "trace", "flow", "--last", "500", "--verdict",
                            "drop", "-o", "json", check=False)
    assert rc in (0, 1), err
    flows = json.loads(out)["flows"] if out.strip() else []
    return [f for f in flows if f["reason"] == reason and f["point"] == point and f["time"] >= since - CLOCK_SLACK
            and all(str(f.get(k)) == str(v) for k, v in fields.items())]


def wait_drop(lab, node: str, reason: str, point: str, since: float, **fields) -> list[dict]:
    return wait_for(lambda: drops(lab, node, reason, point, since, **fields),
                    f"a {reason} drop at {point} on {node} with {fields}", timeout=15, interval=0.2)


def wait_drops(lab, node: str, reason: str, point: str, since: float, each: list[dict]) -> None:
    """A drop for each of ``each`` (fields to match), all read from one trace per poll."""
    def missing() -> list[dict]:
        flows = drops(lab, node, reason, point, since)
        return [want for want in each if not any(all(str(f.get(k)) == str(v) for k, v in want.items())
                                                 for f in flows)]
    wait_for(lambda: not missing(), f"{reason} drops at {point} on {node} for each of {each}", timeout=15,
             interval=0.2)


def attack(lab, world, frames: list[bytes], victim: str, token: bytes, node: str, reason: str, point: str,
           **fields) -> None:
    """Send frames from the attacker; the drop must show on node, and nothing with token reach victim
    (once the datapath has dropped them, none is still on its way)."""
    with Capture(world.netns(victim), "udp or tcp") as cap:
        t0 = time.time()
        inject(world.netns("attacker"), frames)
        wait_drop(lab, node, reason, point, t0, **fields)
        got = carrying(cap.packets(), token)
    assert not got, f"{victim} received the attacker's packets: {[p.summary() for p in got]}"


def udp_frames(world, src: str, dst: str, dport: int, token: bytes, src_mac: str | None = None) -> list[bytes]:
    mac, gw = link_of(world.netns("attacker"))
    l3 = IP(src=src, dst=dst) if ":" not in dst else IPv6(src=src, dst=dst)
    return [bytes(Ether(src=src_mac or mac, dst=gw) / l3 / UDP(sport=40000 + i, dport=dport) / Raw(token))
            for i in range(3)]


def token() -> bytes:
    return f"lace-attack-{uuid.uuid4().hex[:12]}".encode()


# -- spoofing from a pod ------------------------------------------------------------------------------

@pytest.mark.parametrize("claim", ["another-pod", "another-network", "the-node"])
def test_ipv4_source_spoof_is_dropped(lab, world, claim):
    """A pod sends as another pod of its network, as a pod of another network, as its node."""
    src = {"another-pod": world.addr("neighbour", 4), "another-network": world.addr("isolated", 4),
           "the-node": node_addr(lab, ATTACKER, 4)}[claim]
    t = token()
    attack(lab, world, udp_frames(world, src, world.addr("victim", 4), 53, t), "victim", t,
           ATTACKER, "spoofed-source", "from-pod", saddr=src, daddr=world.addr("victim", 4))


def test_mac_spoof_is_dropped(lab, world):
    """The pod's own addresses in a frame from another pod's MAC."""
    t = token()
    other, _ = link_of(world.netns("neighbour"))
    frames = udp_frames(world, world.addr("attacker", 4), world.addr("victim", 4), 53, t, src_mac=other)
    attack(lab, world, frames, "victim", t, ATTACKER, "spoofed-mac", "from-pod", daddr=world.addr("victim", 4))


@pytest.mark.parametrize("claim", ["another-pod", "link-local"])
def test_ipv6_source_spoof_is_dropped(lab, world, claim):
    """IPv6 from another pod's address, or from a link-local address that is not the pod's own."""
    other, _ = link_of(world.netns("neighbour"))
    src = world.addr("neighbour", 6) if claim == "another-pod" else link_local(other)
    t = token()
    attack(lab, world, udp_frames(world, src, world.addr("victim", 6), 53, t), "victim", t,
           ATTACKER, "spoofed-source", "from-pod", saddr=src)


# -- neighbour tables ---------------------------------------------------------------------------------

def neighbours(netns: str) -> list[dict]:
    out = subprocess.run(["ip", "-n", netns, "-j", "neigh", "show"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def poisoned(world, lab, mac: str) -> list[str]:
    """Neighbour entries of worker-1 (the node) and of the neighbour pod that tie an address that
    is not the attacker's own to the attacker's MAC, or mark the attacker a router."""
    own = {world.addr("attacker", 4), world.addr("attacker", 6), link_local(mac)}
    bad = []
    for where in (topology.netns_name(lab.name, ATTACKER), world.netns("neighbour")):
        for n in neighbours(where):
            if n.get("lladdr") == mac and (n["dst"] not in own or "router" in n):
                bad.append(f"{where}: {n}")
    return bad


def assert_owner_still_answers(lab, world, family: int) -> None:
    """The neighbour pod's address still leads to it: from a pod on another node and from the
    attacker's own node."""
    ip = world.addr("neighbour", family)
    ok, out = lab.check(f"{world.ns}/peer", "tcp", ip, 80)
    assert ok and out == f"{world.ns}/neighbour", out
    host = f"[{ip}]" if family == 6 else ip
    res = on_host(lab, ATTACKER, "import urllib.request, sys\n"
                  f"sys.stdout.write(urllib.request.urlopen('http://{host}:80/', timeout=2).read().decode())",
                  kubelet=False)
    assert res.stdout.strip() == f"{world.ns}/neighbour", res.stderr


def test_arp_claiming_another_pods_address_poisons_nothing(lab, world):
    """Gratuitous ARP and an ARP reply claiming the neighbour pod's address, and a request for the
    node's address in its name: all dropped, no table learns the attacker's MAC for it."""
    mac, _ = link_of(world.netns("attacker"))
    victim = world.addr("neighbour", 4)
    bcast = "ff:ff:ff:ff:ff:ff"
    frames = [bytes(Ether(src=mac, dst=bcast) / ARP(op=2, hwsrc=mac, psrc=victim, hwdst=bcast, pdst=victim)),
              bytes(Ether(src=mac, dst=bcast) / ARP(op=2, hwsrc=mac, psrc=victim, pdst="169.254.1.1")),
              bytes(Ether(src=mac, dst=bcast) / ARP(op=1, hwsrc=mac, psrc=victim,
                                                  pdst=node_addr(lab, ATTACKER, 4)))]
    t0 = time.time()
    inject(world.netns("attacker"), frames)
    wait_drops(lab, ATTACKER, "spoofed-source", "from-pod", t0,     # sender -> target, as traced
               [{"saddr": victim, "daddr": target} for target in (victim, "169.254.1.1", node_addr(lab, ATTACKER, 4))])
    assert not poisoned(world, lab, mac)
    assert_owner_still_answers(lab, world, 4)


def test_neighbour_advertisement_for_another_pods_address_poisons_nothing(lab, world):
    """An unsolicited override advertisement of the neighbour pod's IPv6 address, and a
    solicitation in its name to the node: dropped, no table learns the attacker's MAC for it."""
    mac, gw = link_of(world.netns("attacker"))
    victim = world.addr("neighbour", 6)
    node_ll = node_link_local(lab, world)
    na = Ether(src=mac, dst="33:33:00:00:00:01") / IPv6(src=link_local(mac), dst="ff02::1", hlim=255) / \
        ICMPv6ND_NA(tgt=victim, R=0, S=0, O=1) / ICMPv6NDOptDstLLAddr(lladdr=mac)
    ns_ = Ether(src=mac, dst=gw) / IPv6(src=victim, dst=node_ll, hlim=255) / ICMPv6ND_NS(tgt=node_ll) / \
        ICMPv6NDOptSrcLLAddr(lladdr=mac)
    t0 = time.time()
    inject(world.netns("attacker"), [bytes(na), bytes(ns_)])
    wait_drops(lab, ATTACKER, "spoofed-source", "from-pod", t0,
               [{"saddr": link_local(mac), "daddr": "ff02::1", "proto": "icmpv6"},
                {"saddr": victim, "daddr": node_ll, "proto": "icmpv6"}])
    assert not poisoned(world, lab, mac)
    assert_owner_still_answers(lab, world, 6)


def node_link_local(lab, world) -> str:
    """The node's link-local address on the attacker's link (the host side of its veth)."""
    from lace.agent.endpoints import host_ifname
    dev = host_ifname(world.pods["attacker"]["metadata"]["uid"])
    out = subprocess.run(["ip", "-n", topology.netns_name(lab.name, ATTACKER), "-j", "-6", "addr", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout
    return next(a["local"] for a in json.loads(out)[0]["addr_info"] if a["scope"] == "link")


def test_router_advertisement_from_a_pod_is_dropped(lab, world):
    """A pod announcing itself as the default router with a prefix: dropped; the node neither
    learns a router nor gains a route or an address."""
    mac, _ = link_of(world.netns("attacker"))
    ra = Ether(src=mac, dst="33:33:00:00:00:01") / IPv6(src=link_local(mac), dst="ff02::1", hlim=255) / \
        ICMPv6ND_RA(routerlifetime=1800) / ICMPv6NDOptSrcLLAddr(lladdr=mac) / \
        ICMPv6NDOptPrefixInfo(prefix="2001:db8:bad::", prefixlen=64)
    t0 = time.time()
    inject(world.netns("attacker"), [bytes(ra)])
    wait_drop(lab, ATTACKER, "spoofed-source", "from-pod", t0, saddr=link_local(mac), daddr="ff02::1",
              proto="icmpv6")
    node = topology.netns_name(lab.name, ATTACKER)
    assert not poisoned(world, lab, mac)
    routes = subprocess.run(["ip", "-n", node, "-6", "route", "show"], capture_output=True, text=True).stdout
    addrs = subprocess.run(["ip", "-n", node, "-6", "addr", "show"], capture_output=True, text=True).stdout
    assert "default" not in routes and "2001:db8:bad" not in routes + addrs, routes + addrs


# -- reaching another network ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", [4, 6])
def test_pod_of_another_network_by_its_address(lab, world, family):
    ip = world.addr("isolated", family)
    t0 = time.time()
    ok, out = lab.check(f"{world.ns}/attacker", "tcp", ip, 80)
    assert not ok, out
    wait_drop(lab, ATTACKER, "no-route", "from-pod", t0, daddr=ip, dport=80)


def test_service_vip_of_another_network(lab, world):
    """The isolated network's ClusterIP answers its own network only."""
    hidden = vips(lab, world.ns, "hidden")
    for vip in hidden:
        programmed(lab, vip, 1, nodes=(ATTACKER,))
    t0 = time.time()
    for vip in hidden:
        ok, out = lab.check(f"{world.ns}/attacker", "tcp", vip, 80)
        assert not ok, f"{vip}: {out}"
    wait_drops(lab, ATTACKER, "no-route", "from-pod", t0, [{"daddr": vip, "dport": 80} for vip in hidden])


def test_host_addresses_lead_nowhere_from_another_network(lab, world):
    """From the isolated pod: its node's host address, its node's own address and the default
    network's DNS ClusterIP — the node's host namespace and its service VIPs — are no way out."""
    _, out, _ = lab.lace("get", "services", "kube-dns", "-n", "kube-system", "-o", "json")
    dns = json.loads(out)["spec"]["clusterIP"]
    host = json.loads(subprocess.run(["ip", "-n", topology.netns_name(lab.name, "worker-2"), "-j", "-4", "addr",
                                      "show", "dev", "lace_host"], capture_output=True, text=True,
                                     check=True).stdout)[0]["addr_info"][0]["local"]
    targets = ((host, 80), (node_addr(lab, "worker-2", 4), 80), (dns, 53))
    t0 = time.time()
    for target, port in targets:
        ok, out = lab.check(f"{world.ns}/isolated", "tcp", target, port)
        assert not ok, f"{target}: {out}"
    wait_drops(lab, "worker-2", "no-route", "from-pod", t0, [{"daddr": t, "dport": p} for t, p in targets])


@pytest.mark.parametrize("family", [4, 6])
def test_probe_address_is_no_way_in(lab, world, family):
    """The probe address the kubelet uses for an isolated pod, on its probe port, from a pod."""
    ip = probe_ip(world.pods["guarded"], family)
    t0 = time.time()
    ok, out = lab.check(f"{world.ns}/attacker", "tcp", ip, PROBE_PORT)
    assert not ok, out
    wait_drop(lab, ATTACKER, "probe-denied", "from-pod", t0, daddr=ip, dport=PROBE_PORT)


def srv6_to(lab, world, node: str) -> str:
    """The SID of node's locator for the isolated network (function and argument)."""
    loc = lab.node(node)["locator"]
    return str(ipaddress.IPv6Address(cfgmod.sid(loc, None, world.net_id, world.net_id)))


def test_crafted_srv6_from_a_pod(lab, world):
    """An SRv6 packet a pod builds itself, addressed to worker-2's SID for the isolated network."""
    mac, gw = link_of(world.netns("attacker"))
    t = token()
    inner = IP(src="10.77.99.99", dst=world.addr("isolated", 4)) / UDP(sport=40000, dport=53) / Raw(t)
    sid = srv6_to(lab, world, "worker-2")
    frames = [bytes(Ether(src=mac, dst=gw) / IPv6(src=world.addr("attacker", 6), dst=sid, nh=4) / inner)]
    attack(lab, world, frames, "isolated", t, ATTACKER, "unsupported-l4", "from-pod", daddr=sid)


@pytest.mark.parametrize("source", ["underlay", "internet"])
def test_crafted_srv6_from_the_outside(lab, world, source):
    """The outside reaches every locator (the lab routes them); a packet it encapsulates itself
    to worker-2's SID for the isolated network, from its underlay or its internet address."""
    t = token()
    inner = IP(src="10.77.99.98", dst=world.addr("isolated", 4)) / UDP(sport=40001, dport=53) / Raw(t)
    sid = srv6_to(lab, world, "worker-2")
    src = topology.OUTSIDE_UNDERLAY if source == "underlay" else topology.INTERNET6
    with Capture(world.netns("isolated"), "udp") as cap:
        t0 = time.time()
        with entered(lab.status()["outside"]):
            s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_IPIP)
        try:
            s.bind((src, 0))
            for _ in range(3):
                s.sendto(bytes(inner), (sid, 0))
        finally:
            s.close()
        wait_drop(lab, "worker-2", "spoofed-source", "from-uplink", t0, daddr=world.addr("isolated", 4),
                  sport=40001)
        got = carrying(cap.packets(), t)
    assert not got, [p.summary() for p in got]


def edge_drops(lab) -> dict[str, int]:
    """Packets the fabric's edge filter dropped from the outside, by rule comment."""
    out = subprocess.run(["ip", "netns", "exec", lab.status()["fabric"], "nft", "-j", "list", "table", "bridge",
                          topology.EDGE_TABLE], capture_output=True, text=True, check=True).stdout
    rules = [x["rule"] for x in json.loads(out)["nftables"] if "rule" in x]
    return {r["comment"]: next(e["counter"]["packets"] for e in r["expr"] if "counter" in e) for r in rules}


@pytest.mark.parametrize("forged", ["worker-1's underlay address", "worker-1's locator"])
def test_crafted_srv6_from_the_outside_as_a_node(lab, world, forged):
    """The outside forges a node as the outer source of an SRv6 packet to worker-2's SID for the
    isolated network: the lab's edge (the fabric, as an operator's edge router) drops it before any
    node sees it, and counts it."""
    t = token()
    inner = IP(src="10.77.99.97", dst=world.addr("isolated", 4)) / UDP(sport=40002, dport=53) / Raw(t)
    src = (topology.underlay_addr(1) if "underlay" in forged
           else str(ipaddress.IPv6Network(topology.locator(1))[1]))
    outside = lab.status()["outside"]
    mac = {ns: json.loads(subprocess.run(["ip", "-n", ns, "-j", "link", "show", topology.UPLINK], capture_output=True,
                                         text=True, check=True).stdout)[0]["address"]
           for ns in (outside, lab.node("worker-2")["netns"])}
    frame = bytes(Ether(src=mac[outside], dst=mac[lab.node("worker-2")["netns"]]) /
                  IPv6(src=src, dst=srv6_to(lab, world, "worker-2"), nh=4) / inner)
    rule = "a node's underlay address" if "underlay" in forged else "a node's locator"
    with Capture(world.netns("isolated"), "udp") as cap:
        before = edge_drops(lab)[rule]
        inject(outside, [frame] * 3, topology.UPLINK)
        wait_for(lambda: edge_drops(lab)[rule] >= before + 3, f"the edge to drop the outside's packets as {forged}")
        got = carrying(cap.packets(), t)
    assert not got, [p.summary() for p in got]


# -- the agent's socket and pinned maps -----------------------------------------------------------------

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c"]

#: bpf(2)'s system call number
SYS_BPF = {"x86_64": 321, "aarch64": 280}

#: what a non-root process tries: connect to the agent's socket, open a pin, BPF_OBJ_GET it
TRY_AS_NOBODY = r"""
import ctypes, os, socket, struct, sys
kind, path = sys.argv[1], sys.argv[2]
try:
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX); s.connect(path); print("connected")
    elif kind == "open":
        os.close(os.open(path, os.O_RDONLY)); print("opened")
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        p = ctypes.create_string_buffer(path.encode())
        attr = struct.pack("QII", ctypes.addressof(p), 0, 0) + bytes(104)
        fd = libc.syscall(int(sys.argv[3]), 7, attr, len(attr))    # bpf(BPF_OBJ_GET)
        print("got fd" if fd >= 0 else "denied errno %d" % ctypes.get_errno())
except OSError as e:
    print("denied", e)
"""


def as_nobody(kind: str, path: str) -> str:
    r = subprocess.run([*NOBODY, TRY_AS_NOBODY, kind, path, str(SYS_BPF[os.uname().machine])],
                       capture_output=True, text=True, timeout=20)
    return (r.stdout + r.stderr).strip()


def test_agent_socket_is_root_only(lab):
    for node in ("worker-1", "worker-2", "worker-3"):
        path = os.path.join(lab.dir, "agents", f"{node}.sock")
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode) and st.st_uid == 0 and st.st_gid == 0, (path, st)
        assert st.st_mode & 0o007 == 0, f"{path} is mode {oct(st.st_mode & 0o777)}"
        out = as_nobody("socket", path)
        assert out.startswith("denied"), f"nobody on {path}: {out}"


def test_pinned_maps_are_root_only(lab):
    for node in ("worker-1", "worker-2"):
        root = lab.node(node)["pinRoot"]
        pins = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]
        assert any(p.endswith("lace_segment") for p in pins), pins
        for path in pins:
            st = os.stat(path)
            assert st.st_uid == 0 and st.st_mode & 0o077 == 0, f"{path}: uid {st.st_uid} mode {oct(st.st_mode)}"
        for path in (os.path.join(root, "lace_segment"), os.path.join(root, "lace_veth")):
            for kind in ("open", "bpf"):
                out = as_nobody(kind, path)
                assert out.startswith("denied"), f"nobody {kind} {path}: {out}"


# -- the outside ------------------------------------------------------------------------------------------

def node_mac(lab, node: str) -> str:
    out = subprocess.run(["ip", "-n", topology.netns_name(lab.name, node), "-j", "link", "show",
                          topology.UPLINK], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["address"]


def outside_frames(lab, node: str, dst: str, dport: int, t: bytes) -> list[bytes]:
    """Frames from the outside's internet address straight to node's uplink MAC (as if the node
    were its next hop for dst)."""
    out = subprocess.run(["ip", "-n", lab.status()["outside"], "-j", "link", "show", topology.UPLINK],
                         capture_output=True, text=True, check=True).stdout
    mac = json.loads(out)[0]["address"]
    l3 = IP(src=topology.INTERNET4, dst=dst) if ":" not in dst else IPv6(src=topology.INTERNET6, dst=dst)
    return [bytes(Ether(src=mac, dst=node_mac(lab, node)) / l3 / TCP(sport=41000 + i, dport=dport, flags="S") /
                  Raw(t)) for i in range(3)]


@pytest.mark.parametrize("family", [4, 6])
def test_outside_cannot_reach_a_pod_address(lab, world, family):
    """Handed straight to the pod's node, the node's stack routes it to its host device, whose
    program admits only the node's own host addresses as sources."""
    t = token()
    dst = world.addr("neighbour", family)
    with Capture(world.netns("neighbour"), "tcp") as cap:
        t0 = time.time()
        inject(lab.status()["outside"], outside_frames(lab, ATTACKER, dst, 80, t), topology.UPLINK)
        wait_drop(lab, ATTACKER, "spoofed-source", "from-host", t0, daddr=dst, dport=80)
        got = carrying(cap.packets(), t)
    assert not got, [p.summary() for p in got]


def no_routes(lab, node: str) -> int:
    """The node's stack's count of packets it had no route for (both families)."""
    out = subprocess.run(["ip", "netns", "exec", topology.netns_name(lab.name, node), "nstat", "-az",
                          "IpExtInNoRoutes", "Ip6InNoRoutes"], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("family", [4, 6])
def test_outside_cannot_reach_a_cluster_ip(lab, world, family):
    """A ClusterIP is a frontend inside pod networks only: from the outside it is no frontend, the
    uplink hands it to the node's stack, which has no route for it."""
    vip = next(v for v in vips(lab, world.ns, "hidden") if (":" in v) == (family == 6))
    t = token()
    before = no_routes(lab, ATTACKER)
    with Capture(world.netns("isolated"), "tcp") as cap:
        inject(lab.status()["outside"], outside_frames(lab, ATTACKER, vip, 80, t), topology.UPLINK)
        wait_for(lambda: no_routes(lab, ATTACKER) >= before + 3, "the node's stack to find no route",
                 timeout=15, interval=0.2)
        got = carrying(cap.packets(), t)
    assert not got, [p.summary() for p in got]


def test_outside_reaches_node_port_and_load_balancer(lab, world):
    """The ways in that exist: a NodePort on every node's address, a LoadBalancer address."""
    # the lab's pool (test_outside.py applies the same one): removed afterwards if this test made it
    made = lab.lace("get", "loadbalancerippools", "lab", "-o", "json", check=False)[0] != 0
    lab.apply([{"apiVersion": "lace.dev/v1alpha1", "kind": "LoadBalancerIPPool", "metadata": {"name": "lab"},
                "spec": {"cidrs": ["198.18.100.0/24", "2001:db8:1b::/112"]}}])
    try:
        svc = external_service("open", world.ns, type_="LoadBalancer")
        svc["spec"]["selector"] = {"app": "victim"}
        lab.apply([svc])
        port = node_port(service_obj(lab, world.ns, "open"), "http")
        want = f"{world.ns}/victim"
        for node in ("worker-1", "worker-3"):
            for family in (4, 6):
                addr = node_addr(lab, node, family)
                wait_for(lambda: outside_get(lab, addr, port) == want, f"{addr}:{port} answering", timeout=30)
        ingress = wait_for(lambda: service_obj(lab, world.ns, "open")["status"].get("loadBalancer", {}).get("ingress"),
                           "load-balancer addresses", timeout=30)
        for addr in (i["ip"] for i in ingress):
            wait_for(lambda: outside_get(lab, addr, 80) == want, f"{addr}:80 answering", timeout=30)
    finally:
        lab.lace("delete", "services", "open", "-n", world.ns, check=False)
        if made:
            lab.lace("delete", "loadbalancerippools", "lab", check=False)
