"""Interface addresses (RTM_NEWADDR / struct ifaddrmsg): add, delete, list — idempotent."""

from __future__ import annotations

import errno
import ipaddress

from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

from ._rtnl import attr, handle, index_of
from .errors import NetlinkError, where


def _iface(cidr: str, op: str, target: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    try:
        return ipaddress.ip_interface(cidr)
    except ValueError:
        raise NetlinkError(op, target, errno.EINVAL, f"{cidr!r} is not an address/prefix") from None


def add_address(ifname: str | int, cidr: str, netns: str | None = None, nodad: bool = True) -> None:
    """Ensure ``cidr`` (e.g. ``fd5e:ff::1/64``; a bare address means /32 or /128) is on ``ifname``.

    IPv6 addresses skip duplicate address detection by default (IFA_F_NODAD) so they are usable
    as soon as this returns instead of staying "tentative" for a second or two.
    """
    op = f"add address {cidr} to"
    target = where(str(ifname), netns)
    iface = _iface(cidr, op, target)
    kwargs = {"address": str(iface.ip), "prefixlen": iface.network.prefixlen}
    if iface.version == 6 and nodad:
        kwargs["flags"] = IFA_F_NODAD
    with handle(op, target, netns) as ip:
        idx = index_of(ip, ifname, op, netns)
        try:
            ip.addr("add", index=idx, **kwargs)
        except Exception as exc:
            if getattr(exc, "code", None) != errno.EEXIST:
                raise


def del_address(ifname: str | int, cidr: str, netns: str | None = None) -> bool:
    """Ensure ``cidr`` is not on ``ifname``; True if it was."""
    op = f"delete address {cidr} from"
    target = where(str(ifname), netns)
    iface = _iface(cidr, op, target)
    with handle(op, target, netns) as ip:
        idx = index_of(ip, ifname, op, netns)
        try:
            ip.addr("del", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
        except Exception as exc:
            if getattr(exc, "code", None) in (errno.EADDRNOTAVAIL, errno.ENOENT, errno.ESRCH):
                return False
            raise
    return True


def addresses(ifname: str | int | None = None, netns: str | None = None, *, family: int | None = None) -> list[str]:
    """Addresses as ``addr/prefixlen`` on ``ifname`` (None: every interface) in NETNS."""
    op = "list addresses of"
    with handle(op, where(str(ifname or "interfaces"), netns), netns) as ip:
        query = {} if ifname is None else {"index": index_of(ip, ifname, op, netns)}
        if family is not None:
            query["family"] = family
        out = []
        for msg in ip.addr("dump", **query):
            addr = attr(msg, "IFA_ADDRESS") or attr(msg, "IFA_LOCAL")
            if addr:
                out.append(f"{addr}/{msg['prefixlen']}")
    return out
