"""A datapath under test: both lace programs loaded by :func:`lace.datapath.node.load_objects`
against one throw-away pin root, inside a throw-away network namespace whose devices give the test
packets real ifindexes (BPF_PROG_TEST_RUN resolves ctx ifindex there) and whose underlay route and
neighbour let bpf_fib_lookup succeed.  The namespace and its devices are made with lace.netlink
(no ``ip`` processes); the datapath tests (tests/datapath) and the benchmarks (bench/) run on it.

Needs root and bpffs; the packet builders (:meth:`Testbed.l3`, :meth:`Testbed.encap`,
:func:`icmp_echo`, :meth:`Result.packet`) need scapy (the ``test`` extra), imported when called.

Policy is written as the agent splits it (lace.datapath.policy.policy_maps): markers and every
entry but port blocks in ``policy-exact``, port blocks in ``policy``, each marker naming the kinds
of allow entries its segment has, whichever of :meth:`Testbed.select` and :meth:`Testbed.allow`
comes first.

Services are programmed as the agent does (frontend slot 0, backend slots active first, backends,
a Maglev table for two or more active backends) by :meth:`Testbed.service`, which returns a
:class:`Service` that predicts the backend the datapath gives a new flow.

The base topology, reset before every row:

  node 1: locator 2001:db8:1::/48, underlay 2001:db8:f::1 and IPv4 198.18.0.1 on up0 (uplink)
  node 2: locator 2001:db8:2::/48, underlay 2001:db8:f::2, reached through up0 (its underlay address and origin SID
          are the only outer sources the uplink decapsulates)
  the outside: 203.0.113.0/24 via 198.18.0.254 and 2001:db8:cafe::/48 via 2001:db8:f::fe, both
               routers with permanent neighbour entries (OUTSIDE_ROUTER_MAC) on up0
  network 1 (default)  10.1.0.0/16, fd10:1::/48     pods a, b here; remote block 10.1.2.0/24 on node 2
  network 2 (blue)     10.1.0.0/16, fd10:1::/48     pods c (same IPs as a) and d — overlapping
"""

from __future__ import annotations

import ipaddress
import os
import struct
import uuid
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from lace import netlink
from lace.bpf import BPFFS, Map, RingBuffer, ensure_bpffs, enter_netns, test_run
# Layouts (DELIVERY, TRACE_EVENT) are used through their modules: the schema tests take a Layout
# held at module level as declared by that module's ABI header.
from lace.datapath import config as cfgmod
from lace.datapath import delivery as dlv
from lace.datapath import maglev
from lace.datapath import registry
from lace.datapath import services as svc
from lace.datapath import trace as trc
from lace.datapath.common import NETWORK_OUTSIDE, SEGMENT_REMOTE_NODE, mac_bytes, Direction
from lace.datapath.delivery import DeliveryKind, delivery_key
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.node import LoadedDatapath, load_objects
from lace.datapath.policy import (EXACT_MAP, POLICY_MAPS, PolicyFlag, entry_kind, map_of, policy_entry,
                                  policy_keys, selected_key)
from lace.datapath.routing import route_value, routing_key
from lace.datapath.segment import prefix_segment_key, segment_key, segment_value

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
SKB_SIZE, SKB_INGRESS_IFINDEX, SKB_IFINDEX = 192, 36, 40

LOCATOR1, LOCATOR2 = "2001:db8:1::/48", "2001:db8:2::/48"
UNDERLAY1, UNDERLAY2 = "2001:db8:f::1", "2001:db8:f::2"
NEIGH_MAC = "02:00:00:00:0f:02"
UPLINK_MAC = "02:00:00:00:0f:01"
#: node 1's IPv4 address (config addr4: IPv4 masquerade source, IPv4 NodePort frontend)
NODE_ADDR4 = "198.18.0.1"
#: the outside's routers on up0 and what lies behind them
ROUTER4, ROUTER6 = "198.18.0.254", "2001:db8:f::fe"
OUTSIDE_ROUTER_MAC = "02:00:00:00:0f:fe"
OUTSIDE4_NET, OUTSIDE6_NET = "203.0.113.0/24", "2001:db8:cafe::/48"
NET1, NET2 = 1, 2
#: node 1's host device (:meth:`Testbed.host_device`): its host addresses (network 1, inside node
#: 1's block), node 2's (inside node 2's block), and the MACs of the pair's two ends
HOST = {4: "10.1.1.1", 6: "fd10:1::1"}
PEER_HOST = {4: "10.1.2.1", 6: "fd10:1:0:2::1"}
HOST_MAC, NET_MAC = "02:00:00:00:0e:01", "02:00:00:00:0e:02"


@dataclass
class Pod:
    """A test endpoint: its veth (ifindex), network, addresses, MACs and segment."""

    name: str
    network: int
    ipv4: str
    ipv6: str
    mac: str
    host_mac: str
    segment: int
    ifname: str
    ifindex: int = 0
    endpoint_id: int = 0

    def ip(self, family: int) -> str:
        return self.ipv4 if family == 4 else self.ipv6


REMOTE = {"ipv4": "10.1.2.20", "ipv6": "fd10:1:0:2::20", "segment": 259}


@dataclass(frozen=True)
class Backend:
    """A service backend: address, port and the network it lives in (identity for Maglev)."""

    addr: str
    port: int
    network: int = NET1

    def name(self, proto: int) -> str:
        """The stable identity Maglev hashes, spelled as the service programmer does."""
        return f"{self.network}/{ipaddress.ip_address(self.addr)}/{self.port}/{proto}"


@dataclass
class Service:
    """A frontend as :meth:`Testbed.service` programmed it, and the backend choice it implies."""

    network: int
    vip: str
    port: int
    proto: int
    service_id: int
    active: list[Backend]
    terminating: list[Backend]
    ids: dict[Backend, int]
    table: int            # Maglev table number (0: none)
    entries: list[int]    # the Maglev table's backend IDs ([] without a table)

    def by_id(self, backend_id: int) -> Backend:
        return next(b for b, i in self.ids.items() if i == backend_id)

    def predict(self, client: str, sport: int) -> Backend:
        """The backend a new flow from client:sport gets when no affinity entry decides."""
        h = maglev.flow_hash(self.network, client, self.vip, sport, self.port, self.proto)
        return self.by_id(maglev.pick(h, self.entries, [self.ids[b] for b in self.active]))


@dataclass
class Result:
    """What one test run returned: the program's verdict, the packet as it left, the trace events."""

    retval: int
    data: bytes
    events: list[dict[str, Any]] = field(default_factory=list)

    def packet(self) -> Any:
        """The output packet as a scapy ``Ether``."""
        from scapy.layers.l2 import Ether

        return Ether(self.data)


class Testbed:
    """pod_veth.o and uplink.o loaded sharing their maps (:func:`lace.datapath.node.load_objects`)
    in a throw-away namespace and pin root; see the module docstring.  :meth:`close` removes both."""

    __test__ = False   # not a pytest class, whatever imports it

    def __init__(self, max_entries: dict[str, int] | None = None) -> None:
        #: CLI map name -> capacity override (benchmarks fill conntrack past its default size)
        self.max_entries = dict(max_entries or {})
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.netns = f"lace-dp-{tag}"
        self.pin_root = os.path.join(BPFFS, f"lace-dp-{tag}")
        self.loaded: LoadedDatapath | None = None
        self.ring: RingBuffer | None = None
        self.pods: dict[str, Pod] = {}
        self.events: list[bytes] = []
        self.ifindex: dict[str, int] = {}
        self._backend_ids: dict[tuple[Backend, int], int] = {}
        self._maglev_tables: set[int] = set()
        #: (segment, direction) -> its marker's (policy ID, flags) and the kinds of allow entries
        #: written for it (PolicyFlag bits): a marker is rewritten when a new kind arrives
        self._markers: dict[tuple[int, int], tuple[int, int]] = {}
        self._kinds: dict[tuple[int, int], int] = {}
        self._made_netns = self._made_pin_root = False
        try:
            if netlink.netns_exists(self.netns):
                raise FileExistsError(f"network namespace {self.netns} exists already")
            netlink.create_netns(self.netns)
            self._made_netns = True
            self._build()
        except BaseException:
            self.close()
            raise

    # -- set-up -----------------------------------------------------------------------------

    def _build(self) -> None:
        with netlink.reuse():   # one netlink handle into the namespace for the whole set-up
            self._build_devices()
        ensure_bpffs()
        os.mkdir(self.pin_root)   # fresh: never someone else's pins
        self._made_pin_root = True
        self.loaded = load_objects(self.pin_root, self.max_entries)
        self.prog_pod = self.loaded.program("lace_from_pod")
        self.prog_uplink = self.loaded.program("lace_from_uplink")
        self.ring = RingBuffer(self.m("events"), self._on_event)

    def _build_devices(self) -> None:
        ns = self.netns
        netlink.set_up("lo", ns)
        netlink.veth_pair("up0", "up1", netns=ns, mac=UPLINK_MAC)
        specs = [
            Pod("a", NET1, "10.1.1.10", "fd10:1::a", "02:00:00:00:00:0a", "02:00:00:00:01:0a", 257, "pa"),
            Pod("b", NET1, "10.1.1.11", "fd10:1::b", "02:00:00:00:00:0b", "02:00:00:00:01:0b", 258, "pb"),
            Pod("c", NET2, "10.1.1.10", "fd10:1::a", "02:00:00:00:00:0c", "02:00:00:00:01:0c", 300, "pc"),
            Pod("d", NET2, "10.1.1.12", "fd10:1::d", "02:00:00:00:00:0d", "02:00:00:00:01:0d", 301, "pd"),
            # a veth lace does not know: no endpoint entry
            Pod("x", NET1, "10.1.1.99", "fd10:1::99", "02:00:00:00:00:99", "02:00:00:00:01:99", 0, "px"),
        ]
        for i, pod in enumerate(specs, start=1):
            netlink.veth_pair(pod.ifname, pod.ifname + "p", netns=ns, mac=pod.host_mac)
            pod.endpoint_id = i
            self.pods[pod.name] = pod
        for dev in ["up0", "up1"] + [p.ifname for p in specs] + [p.ifname + "p" for p in specs]:
            netlink.set_up(dev, ns)
        netlink.sysctl(ns, "net.ipv6.conf.all.forwarding", 1)
        netlink.sysctl(ns, "net.ipv4.ip_forward", 1)      # bpf_fib_lookup asks for it (IPv4)
        netlink.add_address("up0", f"{UNDERLAY1}/64", ns, nodad=True)
        netlink.add_address("up0", f"{NODE_ADDR4}/24", ns)
        netlink.add_neighbor(UNDERLAY2, NEIGH_MAC, "up0", ns, permanent=True)
        netlink.add_neighbor(ROUTER4, OUTSIDE_ROUTER_MAC, "up0", ns, permanent=True)
        netlink.add_neighbor(ROUTER6, OUTSIDE_ROUTER_MAC, "up0", ns, permanent=True)
        netlink.add_route(LOCATOR2, netns=ns, via=UNDERLAY2, dev="up0")
        netlink.add_route(OUTSIDE4_NET, netns=ns, via=ROUTER4, dev="up0")
        netlink.add_route(OUTSIDE6_NET, netns=ns, via=ROUTER6, dev="up0")
        self.ifindex = {link.name: link.ifindex for link in netlink.links(ns)}
        for pod in specs:
            pod.ifindex = self.ifindex[pod.ifname]

    def _on_event(self, data: bytes) -> int:
        self.events.append(bytes(data))
        return 0

    def close(self) -> None:
        """Close the ring buffer and the objects, remove the pin root and the namespace; each
        step runs even when an earlier one fails (the first failure is raised at the end)."""
        steps = [self._close_ring, self._close_objects, self._remove_pins, self._remove_netns]
        failure: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as exc:   # keep cleaning up
                failure = failure or exc
        if failure is not None:
            raise failure

    def _close_ring(self) -> None:
        ring, self.ring = self.ring, None
        if ring is not None:
            ring.close()

    def _close_objects(self) -> None:
        loaded, self.loaded = self.loaded, None
        if loaded is not None:
            loaded.close()

    def _remove_pins(self) -> None:
        if self._made_pin_root and os.path.isdir(self.pin_root):
            for f in os.listdir(self.pin_root):
                os.unlink(os.path.join(self.pin_root, f))
            os.rmdir(self.pin_root)
        self._made_pin_root = False

    def _remove_netns(self) -> None:
        if self._made_netns:
            netlink.delete_netns(self.netns)
        self._made_netns = False

    def _ring(self) -> RingBuffer:
        if self.ring is None:
            raise RuntimeError("the test bed is closed")
        return self.ring

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- map programming --------------------------------------------------------------------

    def m(self, cli_name: str) -> Map:
        """Map ``cli_name`` (owned by the test bed)."""
        if self.loaded is None:
            raise RuntimeError("the test bed is closed")
        return self.loaded.map(cli_name)

    def clear(self) -> None:
        """Empty every map: hash-like maps deleted, arrays zeroed; of the maglev array only the
        tables written through :meth:`maglev_table` (write Maglev entries through it)."""
        for cli, mdef in registry.MAPS.items():
            if mdef.map_type != "ringbuf" and cli != "maglev":
                self.m(cli).clear()
        # zeroing the whole maglev array (1M slots) takes ~0.3 s: only the tables written here
        for table in sorted(self._maglev_tables):
            self.maglev_table(table, [0] * svc.MAGLEV_SIZE)
        self._maglev_tables.clear()
        self._backend_ids.clear()
        self._markers.clear()
        self._kinds.clear()
        self._ring().consume()
        self.events.clear()

    def reset(self) -> None:
        """Clear every map and program the base topology."""
        self.clear()
        self.configure()
        for net in (NET1, NET2):
            self.route(net, "10.1.0.0/16", net)
            self.route(net, "fd10:1::/48", net)
            self.deliver_remote(net, "10.1.2.0/24", LOCATOR2, node_id=2)
            self.deliver_remote(net, "fd10:1:0:2::/64", LOCATOR2, node_id=2)
        for pod in self.pods.values():
            if pod.name == "x":
                continue
            self.m("veth").update(veth_key(pod.ifindex), endpoint_value(
                endpoint_id=pod.endpoint_id, network=pod.network, segment=pod.segment,
                mac=pod.mac, ipv4=pod.ipv4, ipv6=pod.ipv6))
            for fam in (4, 6):
                self.deliver_local(pod, fam)
                self.m("segment").update(segment_key(pod.network, pod.ip(fam)),
                                         segment_value(pod.segment, local=True))
        for fam in ("ipv4", "ipv6"):
            self.m("segment").update(segment_key(NET1, REMOTE[fam]), segment_value(REMOTE["segment"]))
        # node 2 on the underlay, as its agent would write it: the uplink decapsulates only from
        # its underlay address and its origin SID
        for peer in (UNDERLAY2, str(ipaddress.IPv6Address(cfgmod.sid(LOCATOR2, None, NETWORK_OUTSIDE)))):
            self.m("segment").update(segment_key(NETWORK_OUTSIDE, peer), segment_value(SEGMENT_REMOTE_NODE))

    def host_device(self) -> int:
        """Node 1's host device as the agent makes it (lace/agent/hostdev.py): a veth pair whose
        datapath end lace_net is registered as role HOST, host addresses HOST in network 1 (segment
        HOST, local, and a HOST delivery entry), node 2's host address PEER_HOST inside node 2's block
        (REMOTE_NODE). Made once, programmed again on every call (a reset clears the maps); returns
        lace_net's ifindex, where ``lace_from_host`` runs."""
        from lace.datapath.common import SEGMENT_HOST
        from lace.datapath.devices import DeviceRole, device_key, device_value

        if "lace_net" not in self.ifindex:
            netlink.veth_pair("lace_net", "lace_host", netns=self.netns, mac=NET_MAC, peer_mac=HOST_MAC)
            self.ifindex["lace_net"] = netlink.link("lace_net", self.netns).ifindex   # type: ignore[union-attr]
        ifindex = self.ifindex["lace_net"]
        self.m("devices").update(device_key(ifindex), device_value(NET_MAC, DeviceRole.HOST))
        for fam in (4, 6):
            self.m("segment").update(segment_key(NET1, HOST[fam]), segment_value(SEGMENT_HOST, local=True))
            self.m("segment").update(segment_key(NET1, PEER_HOST[fam]), segment_value(SEGMENT_REMOTE_NODE))
            self.deliver_host(NET1, f"{HOST[fam]}/{32 if fam == 4 else 128}")
        return ifindex

    def configure(self, trace_all: bool = False, addr4: str | None = NODE_ADDR4) -> None:
        """The node's config entry; ``trace_all`` traces every packet, not only new flows and drops;
        ``addr4`` is the node's IPv4 address (None: it has none)."""
        self.m("config").update(cfgmod.config_key(), cfgmod.config_value(
            locator=LOCATOR1, underlay_addr=UNDERLAY1, node_id=1,
            uplink_ifindex=self.ifindex["up0"], mtu=1460, flags=cfgmod.ConfigFlag.TRACE_ALL if trace_all else 0,
            addr4=addr4))

    def route(self, src_net: int, cidr: str, dst_net: int, masquerade: bool = False) -> None:
        self.m("routing").update(routing_key(src_net, cidr), route_value(dst_net, masquerade=masquerade))

    def deliver(self, key: bytes, value: bytes) -> None:
        """A delivery entry as the agent writes it: into the trie, and a full-length one then into
        the exact map too (lace.agent.desired), so the programs probe the hash as on a node."""
        self.m("delivery").update(key, value)
        if dlv.full_length(key):
            self.m("delivery-exact").update(dlv.exact_key(key), value)

    def undeliver(self, key: bytes) -> None:
        """Delete a delivery entry as the agent does: from the exact map first, then the trie."""
        if dlv.full_length(key):
            self.m("delivery-exact").delete(dlv.exact_key(key))
        self.m("delivery").delete(key)

    def deliver_local(self, pod: Pod, family: int) -> None:
        plen = 32 if family == 4 else 128
        self.deliver(delivery_key(pod.network, f"{pod.ip(family)}/{plen}"), dlv.DELIVERY.pack(
            kind=DeliveryKind.LOCAL, ifindex=pod.ifindex, mac=mac_bytes(pod.mac),
            host_mac=mac_bytes(pod.host_mac), endpoint_id=pod.endpoint_id))

    def deliver_remote(self, net: int, cidr: str, locator: str, node_id: int) -> None:
        self.deliver(delivery_key(net, cidr), dlv.DELIVERY.pack(
            kind=DeliveryKind.REMOTE, node_id=node_id, sid=cfgmod.sid(locator, None, net)))

    def deliver_host(self, net: int, cidr: str) -> None:
        self.deliver(delivery_key(net, cidr), dlv.DELIVERY.pack(kind=DeliveryKind.HOST))

    def select(self, segment: int, direction: Direction, policy_id: int = 1, audit: bool = False) -> None:
        """Mark ``segment`` selected (default deny, or audit) in ``direction``."""
        flags = PolicyFlag.SELECTED | (PolicyFlag.AUDIT if audit else 0)
        self._markers[(segment, int(direction))] = (policy_id, int(flags))
        self._write_marker(segment, int(direction))

    def allow(self, segment: int, peer: int, direction: Direction, proto: int | None = None,
              port: int | None = None, end_port: int | None = None, policy_id: int = 7, rule: int = 1) -> None:
        """Allow entries for one rule (lace.datapath.policy.policy_keys), each in the map the agent
        puts it in; the segment's marker learns their kinds."""
        sd = (segment, int(direction))
        kinds = self._kinds.get(sd, 0)
        for k in policy_keys(segment, peer, direction, proto, port, end_port):
            self.m(map_of(k)).update(k, policy_entry(policy_id, rule))
            kinds |= entry_kind(k)
        if kinds != self._kinds.get(sd, 0):
            self._kinds[sd] = kinds
            if sd in self._markers:
                self._write_marker(*sd)

    def clear_policy(self) -> None:
        """Remove every policy entry (both maps): no segment is selected any more."""
        for name in POLICY_MAPS:
            self.m(name).clear()
        self._markers.clear()
        self._kinds.clear()

    def _write_marker(self, segment: int, direction: int) -> None:
        policy_id, flags = self._markers[(segment, direction)]
        self.m(EXACT_MAP).update(selected_key(segment, direction),
                                 policy_entry(policy_id, 0, flags | self._kinds.get((segment, direction), 0)))

    def prefix_segment(self, net: int, cidr: str, segment: int) -> None:
        self.m("prefix-segment").update(prefix_segment_key(net, cidr), segment_value(segment))

    def backend_id(self, b: Backend, proto: int) -> int:
        """The backend ID of b for proto: stable until the next reset, one per (backend, proto)."""
        return self._backend_ids.setdefault((b, proto), len(self._backend_ids) + 1)

    def maglev_table(self, table: int, entries: Sequence[int]) -> None:
        """Write Maglev table ``table`` (``MAGLEV_SIZE`` backend IDs); reset zeroes it again."""
        if len(entries) != svc.MAGLEV_SIZE:
            raise ValueError(f"a Maglev table has {svc.MAGLEV_SIZE} entries, not {len(entries)}")
        base = table * svc.MAGLEV_SIZE
        keys = struct.pack(f"<{svc.MAGLEV_SIZE}I", *range(base, base + svc.MAGLEV_SIZE))
        self.m("maglev").update_batch(keys, struct.pack(f"<{svc.MAGLEV_SIZE}I", *entries), svc.MAGLEV_SIZE)
        self._maglev_tables.add(table)

    def revnat(self, b: Backend, proto: int, network: int, frontend: str, port: int) -> None:
        """Add frontend:port of source network ``network`` to backend b's revnat entry (once)."""
        m, key = self.m("revnat"), svc.revnat_key(b.network, b.addr, b.port, proto)
        raw = m.lookup(key)
        have = []
        if raw is not None:
            family = svc.REVNAT_KEY.unpack(key)["family"]
            have = [(f["network"], f["addr"], f["port"]) for f in svc.decode_revnat(raw, family)["frontends"]]
        want = (network, str(ipaddress.ip_address(frontend)), port)
        if want not in have:
            m.update(key, svc.revnat_value([*have, want]))

    def service(self, vip: str, port: int, active: Sequence[Backend], *, terminating: Sequence[Backend] = (),
                network: int = NET1, proto: int = 6, service_id: int = 1, maglev_table: int | None = None,
                affinity_timeout: int = 0, flags: int = 0, reply_entry: bool = False) -> Service:
        """Program frontend vip:port/proto in ``network`` as the agent does: the backends, their
        slots (``active`` first, then ``terminating``) and slot 0 last; a Maglev table (number
        ``maglev_table``, default ``service_id``; 0 for none) when two or more are active.
        ``affinity_timeout`` > 0 turns on ClientIP affinity. Reprogramming a frontend with fewer
        backends leaves its old slots behind (the datapath never reads past backend_count), and
        every backend keeps the frontend in its revnat entry (as the agent keeps it while
        conntrack may hold a flow to it). ``reply_entry``: as the agent programs a backend whose
        revnat entry is full — the backends flagged REPLY_ENTRY, and this frontend not added to
        their revnat entries."""
        ids = {b: self.backend_id(b, proto) for b in [*active, *terminating]}
        extra = svc.BackendFlag.REPLY_ENTRY if reply_entry else 0
        for b in [*active, *terminating]:
            if not reply_entry:
                self.revnat(b, proto, network, vip, port)
        for b in active:
            self.m("backends").update(svc.backend_key(ids[b]), svc.backend_value(
                b.addr, b.port, proto, b.network, svc.BackendFlag.ACTIVE | extra))
        for b in terminating:
            self.m("backends").update(svc.backend_key(ids[b]), svc.backend_value(
                b.addr, b.port, proto, b.network, svc.BackendFlag.TERMINATING | extra))
        table = service_id if maglev_table is None else maglev_table
        entries: list[int] = []
        if len(active) >= 2 and table:
            entries = maglev.table([(b.name(proto), ids[b]) for b in active])
            self.maglev_table(table, entries)
        else:
            table = 0
        for slot, b in enumerate([*active, *terminating], start=1):
            self.m("services").update(svc.service_key(network, vip, port, proto, slot),
                                      svc.service_value(service_id=service_id, backend_id=ids[b]))
        if affinity_timeout:
            flags |= svc.ServiceFlag.AFFINITY
        self.m("services").update(svc.service_key(network, vip, port, proto), svc.service_value(
            service_id=service_id, backend_count=len(active) + len(terminating), active_count=len(active),
            flags=flags, affinity_timeout=affinity_timeout, maglev=table))
        return Service(network, vip, port, proto, service_id, list(active), list(terminating), ids, table, entries)

    # -- running ----------------------------------------------------------------------------

    @staticmethod
    def skb_ctx(ifindex: int) -> bytes:
        ctx = bytearray(SKB_SIZE)
        struct.pack_into("<I", ctx, SKB_IFINDEX, ifindex)
        struct.pack_into("<I", ctx, SKB_INGRESS_IFINDEX, ifindex)
        return bytes(ctx)

    def run(self, prog, pkt: bytes, ifindex: int) -> Result:
        with enter_netns(self.netns):
            res = test_run(prog, pkt, ctx=self.skb_ctx(ifindex), data_size_out=len(pkt) + 256)
        self._ring().consume()
        events = [trc.TRACE_EVENT.unpack(e) for e in self.events]
        self.events.clear()
        return Result(res.retval, res.data_out, events)

    def from_pod(self, pod: str | Pod, pkt) -> Result:
        p = self.pods[pod] if isinstance(pod, str) else pod
        return self.run(self.prog_pod, bytes(pkt), p.ifindex)

    def from_uplink(self, pkt) -> Result:
        return self.run(self.prog_uplink, bytes(pkt), self.ifindex["up0"])

    # -- packets ----------------------------------------------------------------------------

    def l3(self, src: Pod, dst_ip: str, family: int, **kw):
        """An Ethernet + IP packet from ``src`` to ``dst_ip`` as the pod would send it (scapy)."""
        from scapy.layers.inet import IP
        from scapy.layers.inet6 import IPv6
        from scapy.layers.l2 import Ether

        ether = Ether(src=src.mac, dst=src.host_mac)
        if family == 4:
            return ether / IP(src=src.ipv4, dst=dst_ip, **kw)
        return ether / IPv6(src=src.ipv6, dst=dst_ip, **kw)

    def encap(self, inner, dst_net: int, src_net: int, locator: str = LOCATOR1):
        """An SRv6-encapsulated packet as node 2 would send it to us (scapy)."""
        from scapy.layers.inet import IP
        from scapy.layers.inet6 import IPv6
        from scapy.layers.l2 import Ether

        outer_dst = str(ipaddress.IPv6Address(cfgmod.sid(locator, None, dst_net, src_net)))
        nh = 4 if inner.haslayer(IP) else 41
        return (Ether(src=NEIGH_MAC, dst=UPLINK_MAC) /
                IPv6(src=UNDERLAY2, dst=outer_dst, nh=nh, hlim=64) / inner)


def icmp_echo(family: int, ident: int = 0x77, reply: bool = False):
    """An ICMP (v4) or ICMPv6 echo request (or reply) layer (scapy)."""
    from scapy.layers.inet import ICMP
    from scapy.layers.inet6 import ICMPv6EchoReply, ICMPv6EchoRequest

    if family == 4:
        return ICMP(type=0 if reply else 8, id=ident, seq=1)
    return (ICMPv6EchoReply if reply else ICMPv6EchoRequest)(id=ident, seq=1)


__all__ = ["Testbed", "Pod", "Result", "Backend", "Service", "REMOTE", "icmp_echo", "TC_ACT_OK", "TC_ACT_SHOT", "TC_ACT_REDIRECT",
           "NET1", "NET2", "LOCATOR1", "LOCATOR2", "UNDERLAY1", "UNDERLAY2", "NEIGH_MAC", "UPLINK_MAC",
           "NODE_ADDR4", "ROUTER4", "ROUTER6", "OUTSIDE_ROUTER_MAC", "OUTSIDE4_NET", "OUTSIDE6_NET"]
