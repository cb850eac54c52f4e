"""Routes (RTM_NEWROUTE / struct rtmsg): replace, delete, list.

``add_route`` is a replace, so it is idempotent and converges on the requested next hop.  A next
hop of the other family (an IPv4 route via an IPv6 gateway) is sent as RTA_VIA, as
``ip route add 203.0.113.1/32 via inet6 fd5e:ff::fe`` does.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

from ._rtnl import attr, handle, index_of
from .errors import NetlinkError, where

RTNH_F_ONLINK = 0x4
RTPROT_STATIC = 4
_SCOPES = {"universe": 0, "global": 0, "site": 200, "link": 253, "host": 254, "nowhere": 255}


@dataclass(frozen=True)
class RouteInfo:
    """One route: ``dst`` as a CIDR (``default`` for /0), next hop, output ifindex, table, scope,
    preferred source."""

    dst: str
    via: str | None
    oif: int | None
    table: int
    scope: int
    family: int
    #: the preferred source address (RTA_PREFSRC), None when the route has none
    src: str | None = None


def _net(dst: str, op: str, target: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(dst, strict=False)
    except ValueError:
        raise NetlinkError(op, target, errno.EINVAL, f"{dst!r} is not a prefix") from None


def _describe(dst: str, via: str | None, dev: str | int | None) -> str:
    return dst + (f" via {via}" if via else "") + (f" dev {dev}" if dev is not None else "")


def _spec(ip: Any, dst: str, op: str, target: str, netns: str | None, via: str | None, dev: str | int | None,
          scope: str | int | None, onlink: bool, table: int | None, src: str | None,
          metric: int | None, family: int | None) -> dict[str, Any]:
    if dst == "default":
        if family is None:
            family = socket.AF_INET6 if via and ":" in via else socket.AF_INET
        net = ipaddress.ip_network("::/0" if family == socket.AF_INET6 else "0.0.0.0/0")
    else:
        net = _net(dst, op, target)
    fam = socket.AF_INET6 if net.version == 6 else socket.AF_INET
    spec: dict[str, Any] = {"dst": str(net.network_address), "dst_len": net.prefixlen, "family": fam,
                            "proto": RTPROT_STATIC}
    if via:
        try:
            gw = ipaddress.ip_address(via)
        except ValueError:
            raise NetlinkError(op, target, errno.EINVAL, f"next hop {via!r} is not an address") from None
        if gw.version == net.version:
            spec["gateway"] = str(gw)
        else:
            spec["via"] = {"family": socket.AF_INET6 if gw.version == 6 else socket.AF_INET, "addr": str(gw)}
    if dev is not None:
        spec["oif"] = index_of(ip, dev, op, netns)
    if scope is not None:
        if isinstance(scope, str):
            if scope not in _SCOPES:
                raise NetlinkError(op, target, errno.EINVAL, f"unknown scope {scope!r}")
            scope = _SCOPES[scope]
        spec["scope"] = scope
    if onlink:
        spec["flags"] = RTNH_F_ONLINK
    if table is not None:
        spec["table"] = table
    if src:
        spec["prefsrc"] = src
    if metric is not None:
        spec["priority"] = metric
    return spec


def add_route(dst: str, *, netns: str | None = None, via: str | None = None, dev: str | int | None = None,
              scope: str | int | None = None, onlink: bool = False, table: int | None = None,
              src: str | None = None, metric: int | None = None, family: int | None = None) -> None:
    """Ensure the route ``dst`` [via VIA] [dev DEV] in NETNS (a replace: idempotent)."""
    op = "add route"
    target = where(_describe(dst, via, dev), netns)
    with handle(op, target, netns) as ip:
        ip.route("replace", **_spec(ip, dst, op, target, netns, via, dev, scope, onlink, table, src, metric, family))


def del_route(dst: str, *, netns: str | None = None, via: str | None = None, dev: str | int | None = None,
              table: int | None = None, family: int | None = None) -> bool:
    """Ensure the route ``dst`` is gone from NETNS; True if it was there."""
    op = "delete route"
    target = where(_describe(dst, via, dev), netns)
    with handle(op, target, netns) as ip:
        # scope "nowhere" matches a route of any scope, as `ip route del` does: the kernel deletes
        # an IPv4 route only when the request's scope is its own or RT_SCOPE_NOWHERE
        spec = _spec(ip, dst, op, target, netns, via, dev, "nowhere", False, table, None, None, family)
        spec.pop("proto")
        try:
            ip.route("del", **spec)
        except Exception as exc:
            if getattr(exc, "code", None) in (errno.ESRCH, errno.ENOENT, errno.ENODEV):
                return False
            raise
    return True


def routes(netns: str | None = None, *, family: int | None = None, table: int | None = 254) -> list[RouteInfo]:
    """Routes of NETNS (main table by default; ``table=None`` for all tables)."""
    out = []
    with handle("list routes", where("routing table", netns), netns) as ip:
        query: dict[str, Any] = {}
        if family is not None:
            query["family"] = family
        for msg in ip.route("dump", **query):
            tbl = attr(msg, "RTA_TABLE", msg["table"])
            if table is not None and tbl != table:
                continue
            fam = msg["family"]
            dst = attr(msg, "RTA_DST")
            cidr = f"{dst}/{msg['dst_len']}" if dst else ("default" if msg["dst_len"] == 0 else "")
            via = attr(msg, "RTA_GATEWAY")
            if via is None and msg.get("RTA_VIA") is not None:
                via = msg.get("RTA_VIA").get("addr")
            out.append(RouteInfo(cidr, via, attr(msg, "RTA_OIF"), int(tbl), int(msg["scope"]), int(fam),
                                 attr(msg, "RTA_PREFSRC")))
    return out
