"""lace.netlink against the kernel: namespaces, veth pairs, addresses, routes, neighbors, errors.

`ip` is the independent oracle; every test works in fresh, uniquely named namespaces that are
deleted afterwards, whatever happens.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import threading
from typing import Iterator

import pytest

from lace import netlink as nl
from lace.netlink import NetlinkError

from .oracles import ip, ipj, ping

_seq = itertools.count()


def uname() -> str:
    return f"lace-t{os.getpid()}-{next(_seq)}"


@pytest.fixture
def ns() -> Iterator[str]:
    name = uname()
    nl.create_netns(name)
    try:
        yield name
    finally:
        nl.delete_netns(name)
        assert not os.path.exists(nl.netns_path(name))


@pytest.fixture
def pair() -> Iterator[tuple[str, str]]:
    a, b = uname(), uname()
    try:
        nl.create_netns(a)
        nl.create_netns(b)
        yield a, b
    finally:
        nl.delete_netns(a)
        nl.delete_netns(b)


def test_netns_create_delete_idempotent() -> None:
    name = uname()
    try:
        assert not nl.netns_exists(name)
        assert nl.create_netns(name) == f"/run/netns/{name}"
        nl.create_netns(name)  # again: fine
        assert nl.netns_exists(name)
        assert name in nl.list_netns("lace-t")
        assert name in ip("netns", "list").stdout
        # a namespace of its own: only lo, and not the inode of ours
        assert [l.name for l in nl.links(name)] == ["lo"]
        assert nl.netns_inode(name) != os.stat("/proc/self/ns/net").st_ino
    finally:
        nl.delete_netns(name)
    nl.delete_netns(name)  # again: fine
    assert not nl.netns_exists(name)
    assert name not in nl.list_netns()


def test_entered_moves_only_this_thread(ns: str) -> None:
    mine = os.stat("/proc/thread-self/ns/net").st_ino
    go, done = threading.Event(), threading.Event()
    seen: list[int] = []

    def other() -> None:  # a thread that already runs: it stays where it was
        go.wait(5)
        seen.append(os.stat("/proc/thread-self/ns/net").st_ino)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with nl.entered(ns):
        assert os.stat("/proc/thread-self/ns/net").st_ino == nl.netns_inode(ns)
        go.set()
        done.wait(5)
        # sockets made here belong to the namespace: only lo
        assert socket.if_nameindex() == [(1, "lo")]
    t.join()
    assert seen == [mine]
    assert os.stat("/proc/thread-self/ns/net").st_ino == mine


def test_sysctl_inside_namespace(ns: str) -> None:
    root_before = open("/proc/sys/net/ipv6/conf/all/forwarding").read().strip()
    assert nl.sysctl(ns, "net.ipv6.conf.all.forwarding", 1) == "1"
    assert nl.sysctl(ns, "net.ipv6.conf.all.forwarding") == "1"
    out = ip("netns", "exec", ns, "sysctl", "-n", "net.ipv6.conf.all.forwarding").stdout.strip()
    assert out == "1"
    assert open("/proc/sys/net/ipv6/conf/all/forwarding").read().strip() == root_before


def test_veth_across_namespaces_with_addresses_routes_neighbors_and_ping(pair: tuple[str, str]) -> None:
    a, b = pair
    info = nl.veth_pair("va", "vb", netns=a, peer_netns=b, mac="02:00:5e:00:00:0a",
                        peer_mac="02:00:5e:00:00:0b", mtu=1400)
    assert (info.name, info.kind, info.mac, info.mtu) == ("va", "veth", "02:00:5e:00:00:0a", 1400)
    # the peer went straight into b: never visible in a, and not in the root namespace
    assert [l.name for l in nl.links(a)] == ["lo", "va"]
    peer = nl.link("vb", b)
    assert peer is not None and peer.ifindex == info.peer_ifindex and peer.peer_ifindex == info.ifindex
    assert (peer.mac, peer.mtu) == ("02:00:5e:00:00:0b", 1400)
    assert nl.link("vb", None) is None or nl.link("vb", None).ifindex != peer.ifindex  # type: ignore[union-attr]
    # ensure: the same pair again is fine
    assert nl.veth_pair("va", "vb", netns=a, peer_netns=b).ifindex == info.ifindex

    for ns_, dev, v4, v6 in ((a, "va", "10.250.0.1/24", "fd00:beef::1/64"), (b, "vb", "10.250.0.2/24", "fd00:beef::2/64")):
        nl.set_up("lo", ns_)
        nl.add_address(dev, v4, ns_)
        nl.add_address(dev, v6, ns_)
        nl.add_address(dev, v6, ns_)  # idempotent
        nl.set_up(dev, ns_)
    got = {(x["family"], x["local"], x["prefixlen"]) for x in ipj(a, "addr", "show", "dev", "va")[0]["addr_info"]}
    assert ("inet", "10.250.0.1", 24) in got and ("inet6", "fd00:beef::1", 64) in got
    v6 = [x for x in ipj(a, "addr", "show", "dev", "va")[0]["addr_info"] if x["local"] == "fd00:beef::1"][0]
    assert v6.get("nodad") and not v6.get("tentative")
    assert "10.250.0.1/24" in nl.addresses("va", a)
    # carrier reaches IPv6 through linkwatch, up to a second late: until both ends say "up",
    # the far side may ignore neighbor solicitations
    assert nl.wait_link("va", a, timeout=5, up=True).state == "up"
    assert nl.wait_link("vb", b, timeout=5, up=True).state == "up"

    # routes: a host route via the peer, twice (replace), an IPv4 route via an IPv6 next hop
    nl.add_route("192.0.2.0/24", netns=a, via="10.250.0.2", dev="va")
    nl.add_route("192.0.2.0/24", netns=a, via="10.250.0.2", dev="va")
    nl.add_route("2001:db8:1::/48", netns=a, via="fd00:beef::2", dev="va")
    nl.add_route("198.51.100.7/32", netns=a, via="fd00:beef::2", dev="va")
    nl.add_route("203.0.113.0/24", netns=a, dev="va", scope="link")
    r4 = ip("-n", a, "route", "show").stdout
    assert "192.0.2.0/24 via 10.250.0.2 dev va" in r4
    assert "198.51.100.7 via inet6 fd00:beef::2 dev va" in r4
    assert "203.0.113.0/24 dev va" in r4 and "scope link" in r4
    assert "2001:db8:1::/48 via fd00:beef::2 dev va" in ip("-n", a, "-6", "route", "show").stdout
    assert any(r.dst == "2001:db8:1::/48" and r.via == "fd00:beef::2" for r in nl.routes(a))
    assert nl.del_route("192.0.2.0/24", netns=a) is True
    assert nl.del_route("192.0.2.0/24", netns=a) is False
    assert "192.0.2.0/24" not in ip("-n", a, "route", "show").stdout

    # neighbors: permanent entry, replaced in place
    nl.add_neighbor("10.250.0.9", "02:00:5e:00:00:99", "va", a)
    nl.add_neighbor("10.250.0.9", "02:00:5e:00:00:98", "va", a)
    out = ip("-n", a, "neigh", "show", "10.250.0.9").stdout
    assert "lladdr 02:00:5e:00:00:98" in out and "PERMANENT" in out
    nl.add_neighbor("10.250.0.2", "02:00:5e:00:00:0b", "va", a)

    # the oracle: traffic flows across the pair, both families
    ping(a, "10.250.0.2")
    ping(a, "fd00:beef::2")
    with pytest.raises(subprocess.CalledProcessError):
        ping(a, "10.250.0.3")  # the oracle can fail: nobody there

    assert nl.delete_link("va", a) is True
    assert nl.delete_link("va", a) is False
    nl.wait_link("lo", b)
    assert nl.link("vb", b) is None  # the peer went with it


def test_bridge_and_master(ns: str) -> None:
    br = nl.bridge("br0", ns, mac="02:00:5e:00:01:00")
    assert br.kind == "bridge" and br.mac == "02:00:5e:00:01:00"
    assert nl.bridge("br0", ns).ifindex == br.ifindex  # ensure
    nl.veth_pair("p1", "p1b", netns=ns)
    nl.set_master("p1", "br0", ns)
    assert nl.link("p1", ns).master == br.ifindex  # type: ignore[union-attr]
    assert ipj(ns, "link", "show", "p1")[0]["master"] == "br0"
    assert ipj(ns, "-d", "link", "show", "br0")[0]["linkinfo"]["info_data"]["mcast_snooping"] == 0
    nl.set_master("p1", None, ns)
    assert nl.link("p1", ns).master is None  # type: ignore[union-attr]
    nl.set_mtu("p1", 1300, ns)
    nl.set_mac("p1", "02:00:5e:00:01:01", ns)
    nl.rename("p1", "p2", ns)
    nl.rename("p1", "p2", ns)  # done already
    got = nl.link("p2", ns)
    assert got is not None and (got.mtu, got.mac) == (1300, "02:00:5e:00:01:01")
    with pytest.raises(NetlinkError, match=r"create bridge p2 in netns .*exists as a veth"):
        nl.bridge("p2", ns)


def test_arp_off_resolves_neighbours_to_the_own_mac(ns: str) -> None:
    """A NOARP interface sends every routed packet to its own MAC, without asking (as lace_host)."""
    nl.veth_pair("na0", "na1", netns=ns, mac="02:00:5e:00:02:00")
    assert nl.link("na0", ns).arp  # type: ignore[union-attr]
    nl.set_arp("na0", False, ns)
    nl.set_arp("na0", False, ns)   # ensure
    assert not nl.link("na0", ns).arp  # type: ignore[union-attr]
    assert "NOARP" in ipj(ns, "link", "show", "na0")[0]["flags"]
    for dev in ("na0", "na1"):
        nl.set_up(dev, ns)
    nl.add_address("na0", "10.77.0.1/32", ns)
    nl.add_route("10.88.0.0/16", netns=ns, dev="na0", src="10.77.0.1")
    with nl.entered(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", ("10.88.0.9", 9))
        finally:
            s.close()
    neigh = [n for n in ipj(ns, "neigh", "show", "nud", "all", "dev", "na0") if n["dst"] == "10.88.0.9"]
    assert neigh and neigh[0]["lladdr"] == "02:00:5e:00:02:00" and neigh[0]["state"] == ["NOARP"]
    nl.set_arp("na0", True, ns)
    assert nl.link("na0", ns).arp  # type: ignore[union-attr]


def test_move_link(pair: tuple[str, str]) -> None:
    a, b = pair
    nl.veth_pair("m0", "m1", netns=a)
    moved = nl.move_link("m1", b, a, new_name="eth9")
    assert moved.name == "eth9" and nl.link("m1", a) is None
    assert nl.move_link("m1", b, a, new_name="eth9").ifindex == moved.ifindex  # done already


def test_errors_name_the_object(ns: str) -> None:
    with pytest.raises(NetlinkError) as e:
        nl.set_up("nosuch0", ns)
    assert str(e.value) == f"set up nosuch0 in netns {ns}: no such interface (ENODEV)"
    assert e.value.errno == 19 and e.value.target == f"nosuch0 in netns {ns}"

    with pytest.raises(NetlinkError, match=r"add address 10\.0\.0\.1/24 to nosuch0 in netns .*no such interface"):
        nl.add_address("nosuch0", "10.0.0.1/24", ns)
    with pytest.raises(NetlinkError, match=r"not an address/prefix"):
        nl.add_address("lo", "10.0.0.300/24", ns)
    with pytest.raises(NetlinkError, match=r"not a valid interface name"):
        nl.veth_pair("a-name-that-is-too-long", "b", netns=ns)
    missing = uname()
    with pytest.raises(NetlinkError, match=rf"{missing}: no such network namespace"):
        nl.links(missing)
    with pytest.raises(NetlinkError, match=r"no such network namespace"):
        nl.veth_pair("x0", "x1", netns=ns, peer_netns=missing)
    # a route through a gateway that is not on any link: the kernel's reason, the route named
    with pytest.raises(NetlinkError, match=r"add route 192\.0\.2\.0/24 via 10\.9\.9\.9 in netns .*ENETUNREACH"):
        nl.add_route("192.0.2.0/24", netns=ns, via="10.9.9.9")
    with pytest.raises(NetlinkError, match=r"exists and is not that veth pair"):
        nl.veth_pair("lo", "lo2", netns=ns)
    # nothing from pyroute2 leaks: NetlinkError is our own type
    assert NetlinkError.__module__ == "lace.netlink.errors"


def test_no_fd_leak(ns: str) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(30):
        nl.links(ns)
        nl.link("lo", ns)
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_link_index_follows_links_as_ip_shows_them(ns: str) -> None:
    """LinkIndex sees links come and go and a name that comes back with another ifindex at once;
    details changed in place behind its back (a MAC set by hand) only on a full refresh."""
    with nl.entered(ns):
        index = nl.LinkIndex()
        assert set(index.refresh()) == {"lo"}
        nl.veth_pair("lx-a", "lx-b", mac="02:00:00:00:0a:01")
        seen = index.refresh()
        shown = {link["ifname"]: link for link in ipj(ns, "link", "show")}
        assert {n: (i.ifindex, i.mac) for n, i in seen.items()} == \
            {n: (link["ifindex"], link["address"]) for n, link in shown.items()}
        nl.delete_link("lx-a")
        nl.veth_pair("lx-a", "lx-b", mac="02:00:00:00:0a:02")
        again = index.refresh()
        assert again["lx-a"].ifindex != seen["lx-a"].ifindex and again["lx-a"].mac == "02:00:00:00:0a:02"
        ip("-n", ns, "link", "set", "lx-a", "address", "02:00:00:00:0a:03")
        assert index.refresh()["lx-a"].mac == "02:00:00:00:0a:02"   # the same ifindex: not asked again
        assert index.refresh(full=True)["lx-a"].mac == "02:00:00:00:0a:03"
        nl.delete_link("lx-a")
        assert set(index.refresh()) == {"lo"}
