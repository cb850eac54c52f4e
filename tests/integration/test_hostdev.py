"""The host device against the kernel: lace.agent.hostdev makes (and adopts, and repairs) the veth
pair, its addresses and routes in a fresh namespace; with the datapath loaded and the maps the
agent's desired state computes, the namespace's own processes reach a pod and the pod reaches them
back, only from the host addresses; a restarted agent swaps its program into the pinned link.

`ip`, ping and the kernel's sockets are the oracles."""

from __future__ import annotations

import ipaddress as ia
import os
import socket
from typing import Iterator

import pytest

from lace import netlink
from lace.agent.datapath import HOST_LINK, NodeDatapath
from lace.agent.desired import OWNED_MAPS, desired_maps
from lace.agent.diff import diff_all
from lace.agent.hostdev import HOST_IFNAME, NET_IFNAME, configure
from lace.agent.model import (GATEWAY4, GATEWAY6, Block, HostAddress, HostLink, LocalEndpoint, Network, Node,
                              NodeConfig, PodAddress, Snapshot)
from lace.bpf import Link, query_tcx

from .conftest import unique_name
from .oracles import ip, ipj, ping

pytestmark = pytest.mark.privileged

ADDRS = [ia.ip_address("10.244.0.1"), ia.ip_address("fd00:10:244::1")]
CIDRS = [ia.ip_network("10.244.0.0/16"), ia.ip_network("fd00:10:244::/56")]
POD4, POD6 = ia.IPv4Address("10.244.0.5"), ia.IPv6Address("fd00:10:244::5")
POD_MAC = "02:00:00:00:aa:05"
MTU = 1460


def global_addresses(ns: str, dev: str) -> set[str]:
    return {f'{a["local"]}/{a["prefixlen"]}' for a in ipj(ns, "addr", "show", "dev", dev)[0]["addr_info"]
            if a["scope"] == "global"}


def lace_routes(ns: str) -> dict[str, str]:
    """dst -> preferred source of the routes through lace_host (both families, main table)."""
    out = {}
    for fam in ("-4", "-6"):
        for r in ipj(ns, fam, "route", "show", "dev", HOST_IFNAME):
            out[r["dst"]] = r.get("prefsrc", "")
    return out


def test_configure_makes_adopts_and_repairs_the_device(netns: str) -> None:
    first = configure(ADDRS, CIDRS, MTU, netns)
    host = ipj(netns, "-d", "link", "show", HOST_IFNAME)[0]
    assert host["linkinfo"]["info_kind"] == "veth" and host["mtu"] == MTU
    assert "NOARP" in host["flags"] and "UP" in host["flags"]
    net = ipj(netns, "link", "show", NET_IFNAME)[0]
    assert net["ifindex"] == first.net_ifindex and "UP" in net["flags"] and "NOARP" not in net["flags"]
    assert global_addresses(netns, HOST_IFNAME) == {"10.244.0.1/32", "fd00:10:244::1/128"}
    routes = lace_routes(netns)
    assert routes["10.244.0.0/16"] == "10.244.0.1" and routes["fd00:10:244::/56"] == "fd00:10:244::1"

    # adopted as it is: nothing recreated
    assert configure(ADDRS, CIDRS, MTU, netns) == first
    assert ipj(netns, "link", "show", HOST_IFNAME)[0]["ifindex"] == host["ifindex"]

    # drift is repaired: a stray address and route go, NOARP and the MTU come back, link-local stays
    ip("-n", netns, "addr", "add", "10.244.9.9/32", "dev", HOST_IFNAME)
    ip("-n", netns, "route", "add", "10.99.0.0/16", "dev", HOST_IFNAME)
    ip("-n", netns, "link", "set", HOST_IFNAME, "arp", "on", "mtu", "1500")
    assert configure(ADDRS, CIDRS, MTU, netns) == first
    assert global_addresses(netns, HOST_IFNAME) == {"10.244.0.1/32", "fd00:10:244::1/128"}
    assert "10.99.0.0/16" not in lace_routes(netns)
    host = ipj(netns, "link", "show", HOST_IFNAME)[0]
    assert "NOARP" in host["flags"] and host["mtu"] == MTU
    assert any(a["scope"] == "link" for a in ipj(netns, "addr", "show", "dev", HOST_IFNAME)[0]["addr_info"])

    # a route that lost its preferred source gets it back (the read-only check compares it too)
    ip("-n", netns, "route", "replace", "10.244.0.0/16", "dev", HOST_IFNAME)
    assert lace_routes(netns).get("10.244.0.0/16") != "10.244.0.1"
    assert configure(ADDRS, CIDRS, MTU, netns) == first
    assert lace_routes(netns)["10.244.0.0/16"] == "10.244.0.1"

    # the name taken by a veth that is not the pair (lace_net gone): the pair is made again
    ip("-n", netns, "link", "del", HOST_IFNAME)
    ip("-n", netns, "link", "add", HOST_IFNAME, "type", "veth", "peer", "name", "stray0")
    again = configure(ADDRS, CIDRS, MTU, netns)
    net = ipj(netns, "link", "show", NET_IFNAME)[0]
    assert net["ifindex"] == again.net_ifindex != first.net_ifindex
    assert ipj(netns, "link", "show", HOST_IFNAME)[0]["link"] == NET_IFNAME
    assert "stray0" not in {link["ifname"] for link in ipj(netns, "link", "show")}
    assert lace_routes(netns)["10.244.0.0/16"] == "10.244.0.1"


@pytest.fixture
def pod_ns() -> Iterator[str]:
    name = unique_name()
    netlink.create_netns(name)
    try:
        yield name
    finally:
        netlink.delete_netns(name)


def _plumb_pod(node_ns: str, pod_ns: str) -> netlink.LinkInfo:
    """A pod's veth as CNI ADD makes it: /32 and /128, link-local gateway by permanent neighbours."""
    host = netlink.veth_pair("lxtest0", "eth0", netns=node_ns, peer_netns=pod_ns, peer_mac=POD_MAC, mtu=MTU)
    for dev, ns in (("lxtest0", node_ns), ("lo", pod_ns), ("eth0", pod_ns)):
        netlink.set_up(dev, ns)
    netlink.add_address("eth0", f"{POD4}/32", pod_ns)
    netlink.add_address("eth0", f"{POD6}/128", pod_ns)
    netlink.add_neighbor(str(GATEWAY4), host.mac, "eth0", netns=pod_ns)
    netlink.add_neighbor(str(GATEWAY6), host.mac, "eth0", netns=pod_ns)
    netlink.add_route(f"{GATEWAY4}/32", netns=pod_ns, dev="eth0", scope="link")
    netlink.add_route("0.0.0.0/0", netns=pod_ns, via=str(GATEWAY4), dev="eth0")
    netlink.add_route("::/0", netns=pod_ns, via=str(GATEWAY6), dev="eth0")
    return host


def _snapshot(pod_veth: netlink.LinkInfo, net: netlink.LinkInfo) -> Snapshot:
    me = Node("n1", 1, ia.IPv6Address("2001:db8:f::1"), ia.IPv6Network("2001:db8:1::/48"))
    s = Snapshot(NodeConfig(me, 1, "00:00:00:00:00:00", MTU),
                 {"default": Network("default", 1, tuple(CIDRS))}, {"n1": me})
    s.blocks = [Block(1, "n1", ia.ip_network("10.244.0.0/24")), Block(1, "n1", ia.ip_network("fd00:10:244::/112"))]
    s.pods = [PodAddress(1, POD4, 300, "n1", "t/pod"), PodAddress(1, POD6, 300, "n1", "t/pod")]
    s.endpoints = [LocalEndpoint(pod_veth.ifindex, "t/pod", "c1", 1, 300, pod_veth.ifindex, "lxtest0",
                                 pod_veth.mac, POD_MAC, POD4, POD6)]
    s.host_addresses = [HostAddress("n1", a) for a in ADDRS]
    s.host_link = HostLink(net.ifindex, net.mac)
    return s


def _tcp_peer(node_ns: str, pod_ns: str, dst: str) -> str:
    """Connect from the node's namespace to a listener in the pod; the address the pod sees."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with netlink.entered(pod_ns):
        srv = socket.create_server((dst, 8080), family=family)
    try:
        with netlink.entered(node_ns):
            cli = socket.create_connection((dst, 8080), timeout=2)
        with cli:
            srv.settimeout(2)
            conn, peer = srv.accept()
            with conn:
                conn.sendall(b"pong")
                assert cli.recv(4) == b"pong"
        return str(peer[0])
    finally:
        srv.close()


def test_host_and_pod_reach_each_other_through_the_datapath(netns: str, pod_ns: str, pin_root: str) -> None:
    netlink.sysctl(netns, "net.ipv6.conf.all.forwarding", 1)
    setup = configure(ADDRS, CIDRS, MTU, netns)
    pod_veth = _plumb_pod(netns, pod_ns)
    net = netlink.link(NET_IFNAME, netns)
    dp = NodeDatapath(pin_root)
    dp.load()
    try:
        with netlink.entered(netns):
            dp.attach_host(setup.net_ifindex)
            dp.attach_pod("lxtest0", pod_veth.ifindex)
        want = desired_maps(_snapshot(pod_veth, net))
        dp.apply(diff_all(want, {}), OWNED_MAPS)

        for addr in (str(POD4), str(POD6)):
            ping(netns, addr)                               # host -> pod, pod -> host reply
            assert _tcp_peer(netns, pod_ns, addr) in {str(a) for a in ADDRS}, "from the host address"
        for addr in ADDRS:
            ping(pod_ns, str(addr))                         # pod -> host, host -> pod reply
        # only the host addresses may source traffic into pods: another address of the node is refused
        ip("-n", netns, "addr", "add", "192.0.2.7/32", "dev", "lo")
        assert ip("netns", "exec", netns, "ping", "-c1", "-W1", "-I", "192.0.2.7", str(POD4), check=False).returncode
        ip("netns", "exec", netns, "ping", "-c1", "-W1", "-I", "10.244.0.1", str(POD4))

        # a restarted agent: the pinned link stays, the new program is swapped into it
        path = os.path.join(dp.links_dir, HOST_LINK)
        with Link.open_pinned(path) as before:
            link_id = before.id
        old_prog = query_tcx(setup.net_ifindex, "ingress", netns=netns)
        restarted = NodeDatapath(pin_root)
        restarted.load()
        try:
            with netlink.entered(netns):
                restarted.attach_host(setup.net_ifindex)
            with Link.open_pinned(path) as after:
                assert after.id == link_id
            now = query_tcx(setup.net_ifindex, "ingress", netns=netns)
            assert len(now) == 1 and now != old_prog
            assert now == [restarted.program("lace_from_host").id]
            ping(netns, str(POD4))
        finally:
            restarted.close()
    finally:
        dp.close()
