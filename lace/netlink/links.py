"""Links: veth pairs, bridges, and their state (up, master, name, MTU, MAC) — declarative verbs.

Every verb is an "ensure": creating what exists already (with the requested shape) succeeds, and
deleting what is gone succeeds.  ``netns`` names a namespace under /run/netns; ``None`` means the
calling thread's namespace.  Addresses, routes and neighbors live in their own modules and are
re-exported here because callers think of them as interface configuration.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from pyroute2.iproute import IPRoute

from . import netns as _netns
from ._rtnl import attr, check_ifname, handle, index_of
from .addresses import add_address, addresses, del_address
from .errors import NetlinkError, where
from .neighbors import add_neighbor, del_neighbor
from .routes import RouteInfo, add_route, del_route, routes

_IFF_UP = 0x1
_IFF_NOARP = 0x80
#: every network namespace's loopback device: the kernel registers it first, as ifindex 1
LOOPBACK_IFINDEX = 1

__all__ = [
    "LOOPBACK_IFINDEX", "LinkIndex", "LinkInfo", "link", "links", "wait_link", "veth_pair", "bridge", "set_master", "set_up", "set_down",
    "rename", "set_mtu", "set_mac", "set_arp", "move_link", "delete_link",
    "add_address", "del_address", "addresses", "add_route", "del_route", "routes", "RouteInfo",
    "add_neighbor", "del_neighbor",
]  # fmt: skip


@dataclass(frozen=True)
class LinkInfo:
    """One interface as the kernel reports it (RTM_NEWLINK / struct ifinfomsg + IFLA_* attributes).

    ``state`` is the operational state in lower case ("up", "down", "unknown" for lo, ...);
    ``admin_up`` is the IFF_UP flag, ``arp`` the absence of IFF_NOARP.  ``peer_ifindex`` is the veth
    peer's ifindex (in the peer's namespace), None for other kinds.  ``master`` is the bridge's
    ifindex when enslaved.
    """

    ifindex: int
    name: str
    mac: str
    mtu: int
    state: str
    kind: str | None
    peer_ifindex: int | None
    master: int | None = None
    admin_up: bool = False
    arp: bool = True


def _info(msg: Any) -> LinkInfo:
    kind = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
    peer = attr(msg, "IFLA_LINK") if kind == "veth" else None
    master = attr(msg, "IFLA_MASTER")
    return LinkInfo(
        ifindex=int(msg["index"]),
        name=attr(msg, "IFLA_IFNAME", ""),
        mac=attr(msg, "IFLA_ADDRESS", ""),
        mtu=int(attr(msg, "IFLA_MTU", 0)),
        state=str(attr(msg, "IFLA_OPERSTATE", "unknown")).lower(),
        kind=kind,
        peer_ifindex=int(peer) if peer else None,
        master=int(master) if master else None,
        admin_up=bool(msg["flags"] & _IFF_UP),
        arp=not msg["flags"] & _IFF_NOARP,
    )


def _get(ip: IPRoute, ifname: str | int) -> LinkInfo | None:
    try:
        msgs = ip.link("get", index=ifname) if isinstance(ifname, int) else ip.link("get", ifname=ifname)
    except Exception as exc:  # pyroute2 NetlinkError: ENODEV (absent) or a real failure
        if getattr(exc, "code", None) in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return _info(msgs[0]) if msgs else None


def link(ifname: str | int, netns: str | None = None) -> LinkInfo | None:
    """The interface named ``ifname`` (or with that ifindex) in NETNS, or None if there is none."""
    with handle("get link", where(str(ifname), netns), netns) as ip:
        return _get(ip, ifname)


def links(netns: str | None = None) -> list[LinkInfo]:
    """Every interface in NETNS, by ifindex."""
    with handle("list links", where("interfaces", netns), netns) as ip:
        return sorted((_info(m) for m in ip.link("dump")), key=lambda i: i.ifindex)


class LinkIndex:
    """The calling thread's namespace's interfaces by name, cheap to look at again and again.

    Names and ifindexes come from if_nameindex(3), one call into libc (~50 us); an interface's
    details (MAC, MTU, ...) are fetched once per ifindex, with one request. ``refresh(full=True)``
    reads every interface afresh with one dump (what pyroute2 costs, ~0.5 ms of CPU an interface):
    details changed in place behind the caller's back (a MAC set by hand) show only then. A name
    whose ifindex changed (deleted and created again) is fetched anew at once; ifindexes are not
    handed out twice while the interface table stays short of wrapping around.
    Not for sharing between threads without a lock.
    """

    def __init__(self) -> None:
        self._by_index: dict[int, LinkInfo] = {}

    def refresh(self, full: bool = False) -> dict[str, LinkInfo]:
        if full:
            infos = links()
        else:
            infos = []
            for idx, name in socket.if_nameindex():
                info = self._by_index.get(idx)
                if info is None or info.name != name:
                    info = link(idx)   # None if it went meanwhile
                if info is not None:
                    infos.append(info)
        self._by_index = {i.ifindex: i for i in infos}
        return {i.name: i for i in infos}


def wait_link(ifname: str, netns: str | None = None, timeout: float = 5.0, *, up: bool = False) -> LinkInfo:
    """Wait until ``ifname`` is visible in NETNS (and operationally up, with ``up=True``)."""
    deadline = time.monotonic() + timeout
    with handle("wait for link", where(ifname, netns), netns) as ip:
        while True:
            info = _get(ip, ifname)
            if info is not None and (not up or info.state == "up"):
                return info
            if time.monotonic() >= deadline:
                raise NetlinkError("wait for link", where(ifname, netns), errno.ETIMEDOUT,
                                   f"not {'up' if up else 'present'} after {timeout:g}s")
            time.sleep(0.02)


@contextlib.contextmanager
def _ns_fd(name: str | None):  # type: ignore[no-untyped-def]
    if name is None:
        yield None
        return
    try:
        fd = os.open(_netns.path(name), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetlinkError("open netns", name, exc.errno or 0,
                           "no such network namespace" if exc.errno == errno.ENOENT else None) from None
    try:
        yield fd
    finally:
        os.close(fd)


def veth_pair(
    name: str,
    peer: str,
    *,
    netns: str | None = None,
    peer_netns: str | None = None,
    mac: str | None = None,
    peer_mac: str | None = None,
    mtu: int | None = None,
) -> LinkInfo:
    """Ensure a veth pair ``name`` (in NETNS) <-> ``peer`` (in PEER_NETNS, default: NETNS).

    The peer is created directly in its namespace (IFLA_NET_NS_FD in the same request), so it
    never appears where it does not belong.  Both ends stay down.  If ``name`` exists already
    as a veth whose peer is ``peer`` in PEER_NETNS, MAC and MTU are brought to what was asked.
    Returns ``name``'s LinkInfo.
    """
    op = "create veth pair"
    target = f"{name} <-> {peer}" + (f" in netns {netns}" if netns else "") + (
        f" (peer in netns {peer_netns})" if peer_netns and peer_netns != netns else "")
    check_ifname(name, op, netns)
    check_ifname(peer, op, peer_netns or netns)
    peer_spec: dict[str, Any] = {"ifname": peer}
    if peer_mac:
        peer_spec["address"] = peer_mac
    if mtu:
        peer_spec["mtu"] = mtu
    kwargs: dict[str, Any] = {"ifname": name, "kind": "veth"}
    if mac:
        kwargs["address"] = mac
    if mtu:
        kwargs["mtu"] = mtu
    with _ns_fd(peer_netns if peer_netns != netns else None) as fd, handle(op, target, netns) as ip:
        if fd is not None:
            peer_spec["net_ns_fd"] = fd
        kwargs["peer"] = peer_spec
        try:
            ip.link("add", **kwargs)
        except Exception as exc:
            if getattr(exc, "code", None) != errno.EEXIST:
                raise
            existed = _existing_veth(ip, name, peer, netns, peer_netns or netns, target)
            if (mac and existed.mac != mac) or (mtu and existed.mtu != mtu):
                ip.link("set", index=existed.ifindex, **({"address": mac} if mac else {}),
                        **({"mtu": mtu} if mtu else {}))
            other = link(peer, peer_netns or netns)
            if other is not None and peer_mac and other.mac != peer_mac:
                set_mac(peer, peer_mac, peer_netns or netns)
            if other is not None and mtu and other.mtu != mtu:
                set_mtu(peer, mtu, peer_netns or netns)
        info = _get(ip, name)
    if info is None:
        raise NetlinkError(op, target, errno.ENODEV, f"{name} not visible after creation")
    wait_link(peer, peer_netns or netns, timeout=5.0)
    return info


def _existing_veth(ip: IPRoute, name: str, peer: str, netns: str | None, peer_netns: str | None,
                   target: str) -> LinkInfo:
    mine = _get(ip, name)
    theirs = link(peer, peer_netns)
    if mine is None or mine.kind != "veth" or theirs is None or theirs.kind != "veth" \
            or theirs.ifindex != mine.peer_ifindex or theirs.peer_ifindex != mine.ifindex:
        raise NetlinkError("create veth pair", target, errno.EEXIST,
                           f"{name} or {peer} exists and is not that veth pair; delete it first")
    return mine


def bridge(name: str, netns: str | None = None, *, mac: str | None = None, mtu: int | None = None,
           mcast_snooping: bool = False) -> LinkInfo:
    """Ensure a bridge ``name`` in NETNS (STP off; multicast snooping off by default, so NDP and
    other multicast are flooded without a querier).  Returns its LinkInfo."""
    op = "create bridge"
    check_ifname(name, op, netns)
    kwargs: dict[str, Any] = {"ifname": name, "kind": "bridge", "br_stp_state": 0,
                              "br_mcast_snooping": int(mcast_snooping)}
    if mac:
        kwargs["address"] = mac
    if mtu:
        kwargs["mtu"] = mtu
    with handle(op, where(name, netns), netns) as ip:
        try:
            ip.link("add", **kwargs)
        except Exception as exc:
            if getattr(exc, "code", None) != errno.EEXIST:
                raise
            existing = _get(ip, name)
            if existing is None or existing.kind != "bridge":
                raise NetlinkError(op, where(name, netns), errno.EEXIST,
                                   f"exists as a {existing.kind if existing else 'different'} device, not a bridge")
        info = _get(ip, name)
    if info is None:
        raise NetlinkError(op, where(name, netns), errno.ENODEV, "not visible after creation")
    return info


def _set(op: str, ifname: str | int, netns: str | None, **attrs: Any) -> None:
    with handle(op, where(str(ifname), netns), netns) as ip:
        ip.link("set", index=index_of(ip, ifname, op, netns), **attrs)


def set_master(ifname: str, bridge: str | None, netns: str | None = None) -> None:
    """Enslave ``ifname`` to ``bridge`` (None: release it from any master)."""
    op = f"attach to bridge {bridge}" if bridge else "detach from bridge"
    with handle(op, where(ifname, netns), netns) as ip:
        master = index_of(ip, bridge, op, netns) if bridge else 0
        ip.link("set", index=index_of(ip, ifname, op, netns), master=master)


def set_up(ifname: str | int, netns: str | None = None, *, wait: float | None = None) -> None:
    """Bring ``ifname`` administratively up; with ``wait`` (seconds), also wait until it is
    operationally up.  Carrier changes reach the kernel's IPv6 and qdisc code through linkwatch,
    up to a second late: until then a veth may drop packets and ignore neighbor solicitations."""
    _set("set up", ifname, netns, state="up")
    if wait:
        wait_link(str(ifname), netns, timeout=wait, up=True)


def set_down(ifname: str | int, netns: str | None = None) -> None:
    """Bring ``ifname`` administratively down."""
    _set("set down", ifname, netns, state="down")


def set_mtu(ifname: str | int, mtu: int, netns: str | None = None) -> None:
    """Set the MTU of ``ifname``."""
    _set(f"set mtu {mtu} on", ifname, netns, mtu=int(mtu))


def set_mac(ifname: str | int, mac: str, netns: str | None = None) -> None:
    """Set the MAC address of ``ifname``."""
    _set(f"set mac {mac} on", ifname, netns, address=mac)


def set_arp(ifname: str | int, on: bool, netns: str | None = None) -> None:
    """Turn neighbour resolution on ``ifname`` on or off (IFF_NOARP, as ``ip link set arp off``).

    Without it the kernel resolves every neighbour on the interface to the interface's own MAC
    (NUD_NOARP) instead of asking by ARP or neighbour discovery."""
    with handle(f"set arp {'on' if on else 'off'} on", where(str(ifname), netns), netns) as ip:
        ip.link("set", index=index_of(ip, ifname, "set arp", netns), flags=0 if on else _IFF_NOARP,
                change=_IFF_NOARP)


def rename(ifname: str, new: str, netns: str | None = None) -> None:
    """Rename ``ifname`` to ``new`` (done already when only ``new`` exists)."""
    op = f"rename to {new}"
    check_ifname(new, op, netns)
    with handle(op, where(ifname, netns), netns) as ip:
        if not ip.link_lookup(ifname=ifname) and ip.link_lookup(ifname=new):
            return
        ip.link("set", index=index_of(ip, ifname, op, netns), ifname=new)


def move_link(ifname: str, target_netns: str, netns: str | None = None, *, new_name: str | None = None) -> LinkInfo:
    """Move ``ifname`` from NETNS into TARGET_NETNS (optionally renaming it); returns its new LinkInfo."""
    final = new_name or ifname
    op = f"move to netns {target_netns}"
    if new_name:
        check_ifname(new_name, op, target_netns)
    with _ns_fd(target_netns) as fd, handle(op, where(ifname, netns), netns) as ip:
        if not ip.link_lookup(ifname=ifname):
            existing = link(final, target_netns)
            if existing is not None:
                return existing
        attrs: dict[str, Any] = {"net_ns_fd": fd}
        if new_name:
            attrs["ifname"] = new_name
        ip.link("set", index=index_of(ip, ifname, op, netns), **attrs)
    return wait_link(final, target_netns)


def delete_link(ifname: str | int, netns: str | None = None) -> bool:
    """Ensure ``ifname`` is gone from NETNS (a veth takes its peer along); True if it existed."""
    op = "delete link"
    with handle(op, where(str(ifname), netns), netns) as ip:
        info = _get(ip, ifname)
        if info is None:
            return False
        try:
            ip.link("del", index=info.ifindex)
        except Exception as exc:
            if getattr(exc, "code", None) in (errno.ENODEV, errno.ENOENT):
                return False
            raise
    return True

