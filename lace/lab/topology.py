"""The lab's network: node namespaces on an IPv6 underlay bridge, and an "outside" playing the internet.

Layout (everything is named after the lab, so two labs and a test run coexist)::

    lace-<lab>-outside   eth0 fd5e:ff::fe/64 198.18.0.254/24; lo 203.0.113.1/32 2001:db8:cafe::1/128;
                         198.18.100.0/24 via 198.18.0.1, 2001:db8:1b::/64 via fd5e:ff::1 (load balancers)
          |
    lace-<lab>-fabric    br0 <- upout, up1 .. upN          (L2 only: IPv6 disabled in this namespace)
          |
    lace-<lab>-worker-i  eth0 fd5e:ff::i/64 198.18.0.i/24, MTU 1500, forwarding on;
                         fd5e:c000:j::/48 via fd5e:ff::j for every other node j;
                         203.0.113.0/24 via 198.18.0.254, 2001:db8:cafe::/48 via fd5e:ff::fe;
                         ephemeral ports 32768-49151 (net.ipv4.ip_local_port_range)
                         host cgroup <cgroup2>/lace-<lab>/worker-i

Node i owns locator fd5e:c000:i::/48 (block fd5e:c000::/32); pods get MTU 1500 - 40 = 1460 (one
outer IPv6 header).  Beyond the IPv6 underlay, each node also has an IPv4 address on the fabric
(198.18.0.i, a benchmarking range): masqueraded IPv4 pod traffic needs a node source address and a
next hop the outside can answer; routing IPv4 through an IPv6 next hop would work for the kernel but
hands ``bpf_fib_lookup`` an AF_INET6 neighbor for an IPv4 packet.

The node's own sockets take their ephemeral ports below the masquerade range (49152-65535,
lace/abi/masquerade.h): a reply to the node itself must never look like the reply of a pod flow the
node masquerades.  The outside reaches the lab's load-balancer blocks (LOADBALANCER4_NET,
LOADBALANCER6_NET: LoadBalancerIPPools inside them are reachable from the outside) through
worker-1, whose uplink program balances them before its stack sees them; worker-1 sends flows of
services with externalTrafficPolicy Cluster on to backends on any node.

Each node also has a host cgroup (cgroup2): the processes that run "on the node's host" (``lace
exec --node``) join it as well as the node's namespace, and the node's agent attaches the socket
hooks that translate service addresses to it. Pod processes are never in it: pods reach services
through the tc path of their own network.

The fabric is the edge of the lab's SR domain, and filters the outside's port as an operator's edge
router would (source address validation, BCP 38): a frame from the outside whose source is a node's
underlay address (IPv6 or IPv4) or lies in the locator block is dropped there, counted in the
fabric's nftables table ``lace-edge`` (``EDGE_TABLE``).  A node's datapath trusts an SRv6 packet
whose outer source is another node's address; on a real underlay nobody outside the domain can
forge one, and the lab keeps that true.

Nothing is added to the machine's own namespace, and nothing is bridged to a real interface: the
lab's traffic never leaves its namespaces.
``build`` leaves either a whole lab or nothing; ``destroy`` removes namespaces, processes in
them, pinned BPF objects, the lab's cgroup and its state dir, and is safe to repeat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lace import netlink as nl
from lace.datapath.config import DEFAULT_POD_MTU, DEFAULT_UNDERLAY_MTU
from lace.datapath.masquerade import EPHEMERAL_PORT_RANGE
from lace.lab import procs
from .files import write_json
from .names import name_problem

BPFFS = "/sys/fs/bpf"
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")  # cgroup2 is at .../unified on these machines
LAB_FILE = "lab.json"
MAX_NODES = 16

UNDERLAY_PREFIX = "fd5e:ff::/64"
UNDERLAY_PREFIXLEN = 64
OUTSIDE_UNDERLAY = "fd5e:ff::fe"
UNDERLAY4_PREFIXLEN = 24
OUTSIDE_UNDERLAY4 = "198.18.0.254"
LOCATOR_BLOCK = "fd5e:c000::/32"
LOCATOR_PREFIXLEN = 48
UNDERLAY_MTU = DEFAULT_UNDERLAY_MTU
POD_MTU = DEFAULT_POD_MTU
INTERNET4 = "203.0.113.1"
INTERNET6 = "2001:db8:cafe::1"
INTERNET4_NET = "203.0.113.0/24"
INTERNET6_NET = "2001:db8:cafe::/48"
#: where the outside sends load-balancer addresses (LoadBalancerIPPools of the lab go inside these)
LOADBALANCER4_NET = "198.18.100.0/24"
LOADBALANCER6_NET = "2001:db8:1b::/64"
#: the node that receives them
LOADBALANCER_NODE = 1
FABRIC_BRIDGE = "br0"
UPLINK = "eth0"
OUTSIDE_PORT = "upout"
#: the fabric's nftables table (family bridge) holding the edge filter on the outside's port
EDGE_TABLE = "lace-edge"

Progress = Callable[[str], None]


class LabError(Exception):
    """The lab could not be built, loaded or destroyed; the message says what, to which lab, and what to do."""


# ---- names and addresses --------------------------------------------------------------------

def check_name(name: str) -> str:
    """A lab name (lace.lab.names: a lowercase DNS-1123 label short enough for every derived name)."""
    problem = name_problem(name)
    if problem:
        raise LabError(problem)
    return name


def node_name(index: int) -> str:
    """``worker-<index>``."""
    return f"worker-{index}"


def netns_name(lab: str, what: str) -> str:
    """``lace-<lab>-<what>``: ``fabric``, ``outside`` or a node name."""
    return f"lace-{lab}-{what}"


def pin_root(lab: str, node: str) -> str:
    """The node's bpffs pin root, ``/sys/fs/bpf/lace-<lab>-<node>``."""
    return os.path.join(BPFFS, f"lace-{lab}-{node}")


def cgroup_root() -> str | None:
    """The cgroup2 mount point among CGROUP_ROOTS, or None when cgroup2 is mounted at neither."""
    for root in CGROUP_ROOTS:
        if os.path.isfile(os.path.join(root, "cgroup.controllers")):  # only a cgroup2 directory has it
            return root
    return None


def cgroup_hierarchies() -> list[str]:
    """Every mounted cgroup hierarchy under /sys/fs/cgroup: the v1 ones (cpu, memory, pids, ...,
    name=systemd) and cgroup2's, each a directory with a cgroup.procs of its own."""
    base = "/sys/fs/cgroup"
    if os.path.isfile(os.path.join(base, "cgroup.procs")):   # cgroup2 alone, mounted at the base
        return [base]
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return []
    return [p for e in entries if os.path.isfile(os.path.join(p := os.path.join(base, e), "cgroup.procs"))
            and not os.path.islink(p)]


def node_cgroup(lab: str, node: str) -> str:
    """The node's host cgroup, ``<cgroup2>/lace-<lab>/<node>`` ("" when cgroup2 is not mounted)."""
    root = cgroup_root()
    return os.path.join(root, f"lace-{lab}", node) if root else ""


def kubelet_cgroup(node_cgroup_path: str) -> str:
    """The cgroup the node's kubelet probes from, ``<node cgroup>/kubelet`` ("" without a node cgroup):
    a child of the host cgroup, so the host's socket hooks apply to it too, and the only cgroup whose
    sockets may open probes into pods of other networks (the agent's ``--kubelet-cgroup``)."""
    return os.path.join(node_cgroup_path, "kubelet") if node_cgroup_path else ""


def join_cgroup(path: str) -> None:
    """Move the calling process into cgroup ``path`` (a child process calls it before exec)."""
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write("0")   # 0: the writer itself


def entering(netns: str, cgroup: str | None = None, *then: Callable[[], None]) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the child into network namespace ``netns`` (a name) and, when the
    directory exists, cgroup ``cgroup`` (a node's host cgroup), then calls each of ``then``. The
    namespace's path and whether the cgroup exists are settled here, in the parent."""
    from pyroute2.netns import setns   # imported here, never in a forked child
    path = nl.netns.path(netns)
    group = cgroup if cgroup and os.path.isdir(cgroup) else None

    def enter() -> None:
        setns(path)
        if group is not None:
            join_cgroup(group)
        for f in then:
            f()
    return enter


def underlay_addr(index: int) -> str:
    """Node ``index``'s IPv6 underlay address (fd5e:ff::<index>; the index is written in hex)."""
    return f"fd5e:ff::{index:x}"


def underlay_addr4(index: int) -> str:
    """Node ``index``'s IPv4 fabric address (198.18.0.<index>)."""
    return f"198.18.0.{index}"


def locator(index: int) -> str:
    """Node ``index``'s locator prefix, fd5e:c000:<index>::/48."""
    return f"fd5e:c000:{index:x}::/{LOCATOR_PREFIXLEN}"


def mac_for(lab: str, role: str) -> str:
    """A stable, locally administered unicast MAC for ``role`` in ``lab`` (same on every run)."""
    b = bytearray(hashlib.sha256(f"lace/{lab}/{role}".encode()).digest()[:6])
    b[0] = (b[0] & 0xFC) | 0x02
    return ":".join(f"{x:02x}" for x in b)


# ---- descriptions ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LabSpec:
    """What to build: the lab's name and how many nodes (``worker-1`` .. ``worker-N``)."""

    name: str = "lace"
    nodes: int = 3

    def validate(self) -> LabSpec:
        check_name(self.name)
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= MAX_NODES:
            raise LabError(f"invalid node count {self.nodes!r} for lab {self.name}: use 1 to {MAX_NODES}")
        return self


@dataclass(frozen=True)
class LabNode:
    """One node: its namespace, uplink, underlay addresses, locator, pin root and host cgroup.

    ``uplink_ifindex`` is the uplink's ifindex inside the node's namespace; ``underlay_addr`` is
    the plain IPv6 address (prefix /64), ``locator`` a CIDR; ``cgroup`` the node's host cgroup.
    """

    name: str
    index: int
    node_id: int
    netns: str
    uplink: str
    uplink_ifindex: int
    uplink_mac: str
    underlay_addr: str
    locator: str
    pin_root: str
    underlay_addr4: str = ""
    fabric_port: str = ""
    cgroup: str = ""


@dataclass(frozen=True)
class Lab:
    """A built lab: its namespaces and nodes, and the addresses its outside answers on."""

    name: str
    fabric_netns: str
    outside_netns: str
    nodes: list[LabNode]
    state_dir: str | None = None
    underlay_mtu: int = UNDERLAY_MTU
    pod_mtu: int = POD_MTU
    outside_underlay: str = OUTSIDE_UNDERLAY
    outside_underlay4: str = OUTSIDE_UNDERLAY4
    internet4: str = INTERNET4
    internet6: str = INTERNET6
    locator_block: str = LOCATOR_BLOCK
    created: float = field(default=0.0, compare=False)

    def node(self, name_or_index: str | int) -> LabNode:
        """The node called ``worker-N`` (or with index N)."""
        for n in self.nodes:
            if n.name == name_or_index or n.index == name_or_index:
                return n
        raise LabError(f"lab {self.name} has no node {name_or_index!r} "
                       f"(nodes: {', '.join(n.name for n in self.nodes)})")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lab:
        nodes = [LabNode(**n) for n in data.get("nodes", [])]
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known}, "nodes": nodes})


def _node_desc(lab: str, i: int, ifindex: int, mac: str) -> LabNode:
    name = node_name(i)
    return LabNode(name=name, index=i, node_id=i, netns=netns_name(lab, name), uplink=UPLINK,
                   uplink_ifindex=ifindex, uplink_mac=mac, underlay_addr=underlay_addr(i),
                   locator=locator(i), pin_root=pin_root(lab, name), underlay_addr4=underlay_addr4(i),
                   fabric_port=f"up{i}", cgroup=node_cgroup(lab, name))


# ---- build ----------------------------------------------------------------------------------

def _quiet_ipv6_dad(ns: str) -> None:
    # The lab's addresses are unique by construction: skip DAD (link-locals included) so every
    # address works as soon as its link is up.
    for scope in ("all", "default"):
        nl.sysctl(ns, f"net.ipv6.conf.{scope}.accept_dad", 0)


def _build_fabric(lab: str) -> str:
    ns = netns_name(lab, "fabric")
    nl.create_netns(ns)
    # L2 only: no addresses, no router/neighbor chatter of its own
    for scope in ("all", "default"):
        nl.sysctl(ns, f"net.ipv6.conf.{scope}.disable_ipv6", 1)
    nl.set_up("lo", ns)
    nl.bridge(FABRIC_BRIDGE, ns, mac=mac_for(lab, "fabric/br0"), mtu=UNDERLAY_MTU)
    nl.set_up(FABRIC_BRIDGE, ns)
    return ns


def _attach(lab: str, ns: str, port: str, fabric: str, role: str) -> nl.LinkInfo:
    info = nl.veth_pair(UPLINK, port, netns=ns, peer_netns=fabric, mac=mac_for(lab, f"{role}/eth0"),
                        peer_mac=mac_for(lab, f"{role}/{port}"), mtu=UNDERLAY_MTU)
    nl.set_master(port, FABRIC_BRIDGE, fabric)
    nl.set_up(port, fabric)
    return info


def attach_to_fabric(lab: str, ns: str, port: str, role: str) -> nl.LinkInfo:
    """Plug namespace ``ns`` into lab ``lab``'s fabric: its UPLINK, the fabric's ``port`` on the
    bridge (no addresses: the caller gives them)."""
    return _attach(lab, ns, port, netns_name(lab, "fabric"), role)


def _guard_edge(fabric: str) -> None:
    """Source address validation on the outside's port: it may not send as a node (see the module
    docstring). Each rule counts what it drops (``nft list table bridge lace-edge`` in the fabric)."""
    underlay4 = f"{OUTSIDE_UNDERLAY4.rsplit('.', 1)[0]}.0/{UNDERLAY4_PREFIXLEN}"
    rules = f"""
table bridge {EDGE_TABLE} {{
    chain forward {{
        type filter hook forward priority 0; policy accept;
        iifname "{OUTSIDE_PORT}" ip6 saddr {UNDERLAY_PREFIX} ip6 saddr != {OUTSIDE_UNDERLAY} counter drop comment "a node's underlay address"
        iifname "{OUTSIDE_PORT}" ip6 saddr {LOCATOR_BLOCK} counter drop comment "a node's locator"
        iifname "{OUTSIDE_PORT}" ip saddr {underlay4} ip saddr != {OUTSIDE_UNDERLAY4} counter drop comment "a node's IPv4 underlay address"
    }}
}}
"""
    r = subprocess.run(["ip", "netns", "exec", fabric, "nft", "-f", "-"], input=rules, capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"cannot filter the outside's port in {fabric} (nftables, bridge family): "
                       f"{r.stderr.strip()}; install nftables (make install)")


def _build_outside(lab: str, fabric: str, n: int) -> str:
    ns = netns_name(lab, "outside")
    nl.create_netns(ns)
    _quiet_ipv6_dad(ns)
    nl.set_up("lo", ns)
    nl.add_address("lo", f"{INTERNET4}/32", ns)
    nl.add_address("lo", f"{INTERNET6}/128", ns)
    _attach(lab, ns, OUTSIDE_PORT, fabric, "outside")
    _guard_edge(fabric)
    nl.add_address(UPLINK, f"{OUTSIDE_UNDERLAY}/{UNDERLAY_PREFIXLEN}", ns)
    nl.add_address(UPLINK, f"{OUTSIDE_UNDERLAY4}/{UNDERLAY4_PREFIXLEN}", ns)
    nl.set_up(UPLINK, ns)
    for i in range(1, n + 1):
        nl.add_route(locator(i), netns=ns, via=underlay_addr(i), dev=UPLINK)
    return ns


def _route_load_balancers(outside: str) -> None:
    nl.add_route(LOADBALANCER4_NET, netns=outside, via=underlay_addr4(LOADBALANCER_NODE), dev=UPLINK)
    nl.add_route(LOADBALANCER6_NET, netns=outside, via=underlay_addr(LOADBALANCER_NODE), dev=UPLINK)


def _build_node(lab: str, fabric: str, i: int) -> LabNode:
    name = node_name(i)
    ns = netns_name(lab, name)
    nl.create_netns(ns)
    _quiet_ipv6_dad(ns)
    nl.sysctl(ns, "net.ipv6.conf.all.forwarding", 1)
    nl.sysctl(ns, "net.ipv4.ip_forward", 1)
    # IPv6 sockets take their ephemeral ports from this range too
    nl.sysctl(ns, "net.ipv4.ip_local_port_range", "%d %d" % EPHEMERAL_PORT_RANGE)
    nl.set_up("lo", ns)
    info = _attach(lab, ns, f"up{i}", fabric, name)
    nl.add_address(UPLINK, f"{underlay_addr(i)}/{UNDERLAY_PREFIXLEN}", ns)
    nl.add_address(UPLINK, f"{underlay_addr4(i)}/{UNDERLAY4_PREFIXLEN}", ns)
    nl.set_up(UPLINK, ns)
    os.makedirs(pin_root(lab, name), exist_ok=True)
    desc = _node_desc(lab, i, info.ifindex, info.mac)
    try:
        os.makedirs(kubelet_cgroup(desc.cgroup), exist_ok=True)
    except OSError as exc:
        raise LabError(f"cannot build lab {lab}: cannot create the host cgroup {desc.cgroup} of {name}: "
                       f"{exc.strerror}") from None
    return desc


def _route_node(node: LabNode, n: int) -> None:
    for j in range(1, n + 1):
        if j != node.index:
            nl.add_route(locator(j), netns=node.netns, via=underlay_addr(j), dev=UPLINK)
    nl.add_route(INTERNET6_NET, netns=node.netns, via=OUTSIDE_UNDERLAY, dev=UPLINK)
    nl.add_route(INTERNET4_NET, netns=node.netns, via=OUTSIDE_UNDERLAY4, dev=UPLINK)


def build(spec: LabSpec, progress: Progress | None = None, *, state_dir: str | os.PathLike[str] | None = None) -> Lab:
    """Build the lab ``spec`` describes and return its description (written to ``<state_dir>/lab.json``).

    A lab of that name must not exist yet (``destroy`` it first).  If any step fails, everything
    built so far is removed again before the error is raised.
    """
    spec.validate()
    say = progress or (lambda _msg: None)
    lab = spec.name
    existing = _lab_netns(lab)
    if existing:
        raise LabError(f"lab {lab} exists already ({', '.join(existing)}): destroy it first (lace lab down)")
    from lace.bpf import ensure_bpffs  # here, not at import: the CLI imports this module for every command

    lab_file = os.path.join(os.fspath(state_dir), LAB_FILE) if state_dir is not None else None
    try:
        try:
            ensure_bpffs(BPFFS)
        except Exception as exc:
            raise LabError(f"cannot build lab {lab}: bpffs at {BPFFS}: {exc}") from None
        if cgroup_root() is None:
            raise LabError(f"cannot build lab {lab}: cgroup2 is mounted at none of {', '.join(CGROUP_ROOTS)} "
                           "(the nodes' host cgroups live there): mount it, e.g. "
                           f"mount -t cgroup2 none {CGROUP_ROOTS[0]}")
        say("creating fabric")
        fabric = _build_fabric(lab)
        say("creating outside")
        outside = _build_outside(lab, fabric, spec.nodes)
        nodes = []
        for i in range(1, spec.nodes + 1):
            say(f"creating {node_name(i)}")
            nodes.append(_build_node(lab, fabric, i))
        say("routing")
        for node in nodes:
            _route_node(node, spec.nodes)
        _route_load_balancers(outside)
        say("waiting for links")
        # carrier reaches IPv6 and the qdiscs through linkwatch, up to a second late; until then
        # the first packets on a fresh veth can vanish
        for node in nodes:
            nl.wait_link(UPLINK, node.netns, timeout=10, up=True)
            nl.wait_link(node.fabric_port, fabric, timeout=10, up=True)
        nl.wait_link(UPLINK, outside, timeout=10, up=True)
        nl.wait_link(OUTSIDE_PORT, fabric, timeout=10, up=True)
        result = Lab(name=lab, fabric_netns=fabric, outside_netns=outside, nodes=nodes,
                     state_dir=os.fspath(state_dir) if state_dir is not None else None, created=time.time())
        if lab_file is not None:
            os.makedirs(os.path.dirname(lab_file), exist_ok=True)
            write_json(lab_file, result.to_json())
        say("ready")
        return result
    except BaseException as exc:
        with contextlib.suppress(Exception):
            _teardown(lab)
        if lab_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(lab_file)
        if isinstance(exc, nl.NetlinkError):
            raise LabError(f"cannot build lab {lab}: {exc}") from None
        raise


# ---- load -----------------------------------------------------------------------------------

def load(name: str, state_dir: str | os.PathLike[str] | None = None) -> Lab | None:
    """The description of lab ``name`` as the kernel shows it (None when its fabric is gone).

    Node namespaces present define the nodes; ``<state_dir>/lab.json``, when given and readable,
    supplies the rest (creation time).  Interface indexes and MACs are read from the kernel.
    """
    check_name(name)
    fabric, outside = netns_name(name, "fabric"), netns_name(name, "outside")
    if not nl.netns_exists(fabric):
        return None
    saved: dict[str, Any] = {}
    if state_dir is not None:
        try:
            with open(os.path.join(os.fspath(state_dir), LAB_FILE)) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = {}
    pattern = re.compile(rf"^lace-{re.escape(name)}-worker-(\d+)$")
    indexes = sorted(int(m.group(1)) for ns in nl.list_netns(f"lace-{name}-worker-") if (m := pattern.match(ns)))
    nodes = []
    for i in indexes:
        up = nl.link(UPLINK, netns_name(name, node_name(i)))
        nodes.append(_node_desc(name, i, up.ifindex if up else 0, up.mac if up else ""))
    return Lab(name=name, fabric_netns=fabric, outside_netns=outside, nodes=nodes,
               state_dir=os.fspath(state_dir) if state_dir is not None else None,
               created=float(saved.get("created", 0.0)))


# ---- destroy --------------------------------------------------------------------------------

def _other_labs(name: str) -> list[str]:
    # Labs whose names extend ours ("a" vs "a-b") share the "lace-a-" prefix: keep their objects.
    suffix = "-fabric"
    return [ns[len("lace-"):-len(suffix)] for ns in nl.list_netns(f"lace-{name}-")
            if ns.endswith(suffix) and ns != netns_name(name, "fabric")]


def _owned(candidate: str, name: str, others: list[str]) -> bool:
    if not candidate.startswith(f"lace-{name}-"):
        return False
    return not any(candidate.startswith(f"lace-{o}-") for o in others)


def _lab_netns(name: str) -> list[str]:
    others = _other_labs(name)
    return [ns for ns in nl.list_netns(f"lace-{name}-") if _owned(ns, name, others)]


def _pids_in(inodes: set[int]) -> list[int]:
    dev = os.stat("/proc/self/ns/net").st_dev
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if st.st_dev == dev and st.st_ino in inodes:
            out.append(int(entry))
    return out


def _kill_pids(pids: list[int], timeout: float = 3.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if procs.alive(p)]
            if pids:
                time.sleep(0.02)
        if not pids:
            return


def _cgroup_pids(path: str) -> list[int]:
    pids: list[int] = []
    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            with open(os.path.join(dirpath, "cgroup.procs")) as f:
                pids += [int(p) for p in f.read().split()]
    return pids


def _rm_cgroup(path: str, timeout: float = 10.0) -> bool:
    """Kill every process in the cgroup tree at ``path``, then remove it bottom-up. A cgroup whose
    last process is still exiting is busy for a moment (a container's, whose PID 1 the kill of
    its shim left to exit): it is tried again, its processes killed again, until ``timeout``."""
    if not os.path.isdir(path):
        return False
    _kill_pids(_cgroup_pids(path))
    deadline = time.monotonic() + timeout
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        while True:
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise LabError(f"cannot remove cgroup {dirpath}: {exc.strerror} "
                                   f"(processes in it: {_cgroup_pids(dirpath) or 'none'})") from None
                _kill_pids(_cgroup_pids(dirpath), timeout=0.5)
                time.sleep(0.02)
    return True


def _teardown(name: str) -> list[str]:
    removed: list[str] = []
    namespaces = _lab_netns(name)
    inodes = set()
    for ns in namespaces:
        with contextlib.suppress(nl.NetlinkError):
            inodes.add(nl.netns_inode(ns))
    _kill_pids(_pids_in(inodes))
    for ns in namespaces:
        nl.delete_netns(ns)
        removed.append(f"netns {ns}")
    others = _other_labs(name)
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.listdir(BPFFS)):
            path = os.path.join(BPFFS, entry)
            if _owned(entry, name, others) and os.path.isdir(path):
                shutil.rmtree(path)
                removed.append(f"pins {path}")
    # the lab's cgroup in every hierarchy: cgroup2's (the nodes' host cgroups) and, with a real
    # kubelet, the v1 ones its pods' cgroups are made in
    for root in dict.fromkeys([*CGROUP_ROOTS, *cgroup_hierarchies()]):
        path = os.path.join(root, f"lace-{name}")
        if _rm_cgroup(path):
            removed.append(f"cgroup {path}")
    return removed


def destroy(name: str, state_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove lab ``name`` entirely; returns what was removed (empty when nothing was left).

    Order: the processes recorded in ``<state_dir>/procs.json``, any other process still inside
    one of the lab's namespaces, the namespaces (``lace-<name>-*``, which takes every veth along),
    the pin dirs ``/sys/fs/bpf/lace-<name>-*`` with everything pinned below them, the cgroup
    ``lace-<name>``, and the state dir.  Safe to run again.
    """
    check_name(name)
    removed: list[str] = []
    if state_dir is not None:
        try:
            removed += [f"process {p}" for p in procs.stop_all(state_dir)]
        except procs.ProcError as exc:
            raise LabError(f"cannot stop the processes of lab {name}: {exc}") from None
    try:
        removed += _teardown(name)
    except nl.NetlinkError as exc:
        raise LabError(f"cannot destroy lab {name}: {exc}") from None
    except OSError as exc:
        raise LabError(f"cannot destroy lab {name}: {exc.filename}: {exc.strerror}") from None
    if state_dir is not None and os.path.isdir(state_dir):
        shutil.rmtree(state_dir)
        removed.append(f"state {os.fspath(state_dir)}")
    return removed


__all__ = [
    "Lab", "LabError", "LabNode", "LabSpec", "build", "destroy", "load",
    "check_name", "node_name", "netns_name", "pin_root", "underlay_addr", "underlay_addr4", "locator", "mac_for",
    "UNDERLAY_PREFIX", "UNDERLAY_MTU", "POD_MTU", "LOCATOR_BLOCK", "OUTSIDE_UNDERLAY", "OUTSIDE_UNDERLAY4",
    "INTERNET4", "INTERNET6", "INTERNET4_NET", "INTERNET6_NET", "FABRIC_BRIDGE", "UPLINK",
    "LOADBALANCER4_NET", "LOADBALANCER6_NET", "LOADBALANCER_NODE",
]  # fmt: skip
