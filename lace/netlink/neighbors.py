"""Neighbor entries (RTM_NEWNEIGH / struct ndmsg): static ARP/NDP entries, replace and delete."""

from __future__ import annotations

import errno
import ipaddress

from ._rtnl import handle, index_of
from .errors import NetlinkError, where

NUD_REACHABLE = 0x02
NUD_PERMANENT = 0x80


def add_neighbor(ip_addr: str, mac: str, ifname: str | int, netns: str | None = None, permanent: bool = True) -> None:
    """Ensure ``ip_addr`` resolves to ``mac`` on ``ifname`` (a replace; PERMANENT unless told)."""
    op = f"add neighbor {ip_addr} lladdr {mac} on"
    target = where(str(ifname), netns)
    try:
        ipaddress.ip_address(ip_addr)
    except ValueError:
        raise NetlinkError(op, target, errno.EINVAL, f"{ip_addr!r} is not an address") from None
    with handle(op, target, netns) as ip:
        ip.neigh("replace", dst=ip_addr, lladdr=mac, ifindex=index_of(ip, ifname, op, netns),
                 state=NUD_PERMANENT if permanent else NUD_REACHABLE)


def del_neighbor(ip_addr: str, ifname: str | int, netns: str | None = None) -> bool:
    """Ensure there is no neighbor entry for ``ip_addr`` on ``ifname``; True if there was."""
    op = f"delete neighbor {ip_addr} on"
    with handle(op, where(str(ifname), netns), netns) as ip:
        try:
            ip.neigh("del", dst=ip_addr, ifindex=index_of(ip, ifname, op, netns))
        except Exception as exc:
            if getattr(exc, "code", None) in (errno.ENOENT, errno.ESRCH):
                return False
            raise
    return True
