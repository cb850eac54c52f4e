"""lace.netlink: network namespaces, links, addresses, routes and neighbors — pyroute2 only.

It knows nothing about lace.  Verbs are declarative "ensure" calls (creating what exists with the
requested shape, or deleting what is gone, succeeds), every object is addressed by name plus the
namespace it lives in (``None``: the calling thread's), and every failure is a
:class:`NetlinkError` naming the operation and the object.
"""

from . import _pyroute2  # noqa: F401  (first: pyroute2's submodules without its whole package)
from .errors import NetlinkError
from ._rtnl import reuse
from .netns import create as create_netns
from .netns import delete as delete_netns
from .netns import entered, ipr, list_netns, run_in, sysctl
from .netns import exists as netns_exists
from .netns import inode as netns_inode
from .netns import path as netns_path
from .links import (
    LOOPBACK_IFINDEX,
    LinkIndex,
    LinkInfo,
    RouteInfo,
    add_address,
    add_neighbor,
    add_route,
    addresses,
    bridge,
    del_address,
    del_neighbor,
    del_route,
    delete_link,
    link,
    links,
    move_link,
    rename,
    routes,
    set_arp,
    set_down,
    set_mac,
    set_master,
    set_mtu,
    set_up,
    veth_pair,
    wait_link,
)
from . import netns

__all__ = [
    "reuse",
    "NetlinkError", "netns",
    "create_netns", "delete_netns", "netns_exists", "netns_inode", "netns_path", "list_netns",
    "entered", "ipr", "run_in", "sysctl",
    "LOOPBACK_IFINDEX", "LinkIndex", "LinkInfo", "RouteInfo", "link", "links", "wait_link", "veth_pair", "bridge", "set_master", "set_up",
    "set_down", "rename", "set_mtu", "set_mac", "set_arp", "move_link", "delete_link",
    "add_address", "del_address", "addresses", "add_route", "del_route", "routes",
    "add_neighbor", "del_neighbor",
]  # fmt: skip
