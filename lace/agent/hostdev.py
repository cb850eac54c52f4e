"""The node's host device: how the node's host namespace and its pods reach each other.

As Cilium's cilium_host / cilium_net, adapted to lace:

- **Host addresses.** One per family of the default network, leased like a pod's address through
  the store's allocator (``Store.allocate_leases``) from this node's own block, to the pseudo-pod
  ``node/<node>`` with container ID ``lace:host`` (``model.HOST_CONTAINER_ID``). A lease rather
  than a Node annotation: it is the allocator's own record, so no pod can ever get the address, it
  survives agent restarts, and every node already watches leases — they program this node's host
  addresses as segment REMOTE_NODE (and route them through this node's block like its pods), this
  node as segment HOST and delivery HOST (``desired.py``). ``lace get ipleases`` shows them.
- **Device.** A veth pair ``lace_host`` <-> ``lace_net``. ``lace_host`` carries the host addresses
  (/32 and /128) and is NOARP: the kernel resolves every neighbour on it to its own MAC instead of
  asking (nobody behind it would answer; the datapath writes the pod's MACs itself). Its MTU is the
  pod MTU, as traffic to pods on other nodes is encapsulated. ``lace_net`` carries
  ``lace_from_host`` (``bpf/progs/host.c``) on tcx ingress through a pinned link (``links/host``),
  so what leaves ``lace_host`` meets the datapath, and keeps meeting it while the agent is down.
- **Routes.** The default network's CIDRs, both families, ``dev lace_host src <host address>``: the
  host's sockets to pods leave from the host address and the pods' answers come back to it
  (delivery HOST). Other networks get no route: their pods stay out of the host's reach.

:meth:`HostDevice.ensure` is idempotent and level-triggered: a restarted agent adopts the pair,
its addresses and routes as it finds them, corrects only what differs (removing addresses and
routes of ``lace_host`` that are no longer wanted), and swaps its program into the pinned link.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from lace import netlink
from lace.store import kinds as K
from lace.store.errors import IpamExhausted, NotFound

from .model import HOST_CONTAINER_ID, IPAddr, IPNet, host_lease_pod

log = logging.getLogger("lace.agent.hostdev")

HOST_IFNAME = "lace_host"
NET_IFNAME = "lace_net"
_LINK_LOCAL6 = ipaddress.ip_network("fe80::/10")


class HostDeviceError(Exception):
    """The host device could not be set up; the message says what, on which node, and what to do."""


class Attacher(Protocol):
    """Where the host program gets attached (``lace.agent.datapath.NodeDatapath``)."""

    def attach_host(self, ifindex: int) -> None: ...


@dataclass(frozen=True)
class HostSetup:
    """What :meth:`HostDevice.ensure` left in place."""

    addresses: tuple[IPAddr, ...]
    routes: tuple[str, ...]
    net_ifindex: int


def default_cidrs(store: Any) -> list[IPNet]:
    """The default network's pod CIDRs."""
    try:
        net = store.get("networks", K.DEFAULT_NETWORK)
    except NotFound:
        return []
    return [ipaddress.ip_network(c) for c in (net.get("spec") or {}).get("cidrs") or ()]


def lease_host_addresses(store: Any, node: str, cidrs: list[IPNet]) -> list[IPAddr]:
    """``node``'s host addresses, one per family of ``cidrs``: its existing leases, else new ones.

    A family added to the default network after the first lease gets no host address until the
    node's host leases are deleted (the addresses of live host connections must not change)."""
    try:
        leases = store.allocate_leases(K.DEFAULT_NETWORK, node, cidrs, host_lease_pod(node),
                                       HOST_CONTAINER_ID, HOST_IFNAME)
    except IpamExhausted as exc:
        raise HostDeviceError(f"node {node} has no host address: {exc}") from None
    return sorted((lease.ip for lease in leases), key=lambda ip: ip.version)


def routes_for(addresses: list[IPAddr], cidrs: list[IPNet]) -> dict[str, str]:
    """Route destination -> preferred source: each CIDR from the host address of its family."""
    by_family = {ip.version: ip for ip in addresses}
    return {str(c): str(by_family[c.version]) for c in cidrs if c.version in by_family}


def _own_addresses(dev: str | int, netns: str | None) -> list[str]:
    """The device's addresses but the kernel's own IPv6 link-local one: what configure manages."""
    return [c for c in netlink.addresses(dev, netns) if ipaddress.ip_interface(c).ip not in _LINK_LOCAL6]


def _own_routes(ifindex: int, netns: str | None) -> dict[IPNet, netlink.RouteInfo]:
    """The main table's routes through the device but default and IPv6 link-local ones, by
    destination: what configure manages."""
    out = {}
    for r in netlink.routes(netns):
        if r.oif != ifindex or r.dst in ("", "default"):
            continue
        dst = ipaddress.ip_network(r.dst)
        if not (dst.version == 6 and dst.subnet_of(_LINK_LOCAL6)):
            out[dst] = r
    return out


def _as_configured(addresses: list[IPAddr], cidrs: list[IPNet], mtu: int, netns: str | None,
                   links: Mapping[str, netlink.LinkInfo] | None) -> HostSetup | None:
    """The setup as it stands when the device is already what :func:`configure` would leave, else
    None. Three dumps (links, unless the caller has them, the host end's addresses, routes)
    instead of a dozen requests that would change nothing: the resync's usual case, and most of an
    idle agent's netlink work."""
    by_name = links if links is not None else {i.name: i for i in netlink.links(netns)}
    host, net = by_name.get(HOST_IFNAME), by_name.get(NET_IFNAME)
    if host is None or net is None or host.kind != "veth" or net.kind != "veth" \
            or host.peer_ifindex != net.ifindex or net.peer_ifindex != host.ifindex \
            or host.mtu != mtu or net.mtu != mtu or host.arp or not host.admin_up or not net.admin_up:
        return None
    if set(_own_addresses(host.ifindex, netns)) != {f"{ip}/{ip.max_prefixlen}" for ip in addresses}:
        return None
    routes = routes_for(addresses, cidrs)
    have = {dst: r.src and ipaddress.ip_address(r.src) for dst, r in _own_routes(host.ifindex, netns).items()}
    if have != {ipaddress.ip_network(d): ipaddress.ip_address(s) for d, s in routes.items()}:
        return None
    return HostSetup(tuple(addresses), tuple(routes), net.ifindex)


def configure(addresses: list[IPAddr], cidrs: list[IPNet], mtu: int, netns: str | None = None,
              links: Mapping[str, netlink.LinkInfo] | None = None) -> HostSetup:
    """Make (or adopt) the veth pair with ``addresses`` on ``lace_host`` and the routes of ``cidrs``
    through it, in ``netns`` (None: this thread's namespace); the program is not attached here.
    A device already in that state is only read (``_as_configured``); ``links``, the namespace's
    interfaces by name as the caller just read them, spares it a dump."""
    current = _as_configured(addresses, cidrs, mtu, netns, links)
    if current is not None:
        return current
    try:
        netlink.veth_pair(HOST_IFNAME, NET_IFNAME, netns=netns, mtu=mtu)
    except netlink.NetlinkError as exc:
        # one end exists without the other, or as another kind of device: these names are ours
        log.warning("replacing %s/%s: %s", HOST_IFNAME, NET_IFNAME, exc)
        netlink.delete_link(HOST_IFNAME, netns)
        netlink.delete_link(NET_IFNAME, netns)
        netlink.veth_pair(HOST_IFNAME, NET_IFNAME, netns=netns, mtu=mtu)
    if netlink.link(HOST_IFNAME, netns).arp:   # type: ignore[union-attr]
        netlink.set_arp(HOST_IFNAME, False, netns)
    want = {f"{ip}/{ip.max_prefixlen}" for ip in addresses}
    for cidr in sorted(want):
        netlink.add_address(HOST_IFNAME, cidr, netns)
    for cidr in _own_addresses(HOST_IFNAME, netns):
        if cidr not in want:
            netlink.del_address(HOST_IFNAME, cidr, netns)
    netlink.set_up(NET_IFNAME, netns)
    netlink.set_up(HOST_IFNAME, netns)
    host = netlink.link(HOST_IFNAME, netns)
    net = netlink.link(NET_IFNAME, netns)
    if host is None or net is None:
        raise HostDeviceError(f"{HOST_IFNAME}/{NET_IFNAME} vanished while being set up")
    routes = routes_for(addresses, cidrs)
    for dst, src in routes.items():
        netlink.add_route(dst, netns=netns, dev=HOST_IFNAME, src=src)
    wanted = {ipaddress.ip_network(d) for d in routes}
    for dst, r in _own_routes(host.ifindex, netns).items():
        if dst not in wanted:
            netlink.del_route(r.dst, netns=netns, dev=HOST_IFNAME)
    return HostSetup(tuple(addresses), tuple(routes), net.ifindex)


class HostDevice:
    """This node's host device, owned by the agent: :meth:`ensure` at start (before the first
    reconcile, which registers the device and programs the host addresses) and on every resync."""

    def __init__(self, node: str, store: Any, datapath: Attacher, mtu: int) -> None:
        self.node = node
        self.store = store
        self.datapath = datapath
        self.mtu = mtu
        self.setup: HostSetup | None = None

    def ensure(self, links: Mapping[str, netlink.LinkInfo] | None = None) -> HostSetup:
        """Lease the host addresses and configure the device (``links``: see :func:`configure`)."""
        cidrs = default_cidrs(self.store)
        if not cidrs:
            raise HostDeviceError(f'node {self.node}: the "{K.DEFAULT_NETWORK}" network has no CIDRs, so the '
                                  "host has no address to reach pods from; give it spec.cidrs")
        addresses = lease_host_addresses(self.store, self.node, cidrs)
        try:
            setup = configure(addresses, cidrs, self.mtu, links=links)
        except netlink.NetlinkError as exc:
            raise HostDeviceError(f"node {self.node}: cannot set up the host device: {exc}") from None
        self.datapath.attach_host(setup.net_ifindex)
        if setup != self.setup:
            log.info("host device %s (%s) -> %s (ifindex %d), routes %s", HOST_IFNAME,
                     ", ".join(map(str, setup.addresses)), NET_IFNAME, setup.net_ifindex, ", ".join(setup.routes))
        self.setup = setup
        return setup
