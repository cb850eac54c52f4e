"""A datapath under test: both lace programs loaded against one throw-away pin root, inside a
throw-away network namespace whose devices give the test packets real ifindexes (BPF_PROG_TEST_RUN
resolves ctx ifindex there) and whose underlay route and neighbour let bpf_fib_lookup succeed.

The base topology, reset before every row:

  node 1: locator 2001:db8:1::/48, underlay 2001:db8:f::1 on up0 (uplink)
  node 2: locator 2001:db8:2::/48, underlay 2001:db8:f::2, reached through up0
  network 1 (default)  10.1.0.0/16, fd10:1::/48     pods a, b here; remote block 10.1.2.0/24 on node 2
  network 2 (blue)     10.1.0.0/16, fd10:1::/48     pods c (same IPs as a) and d — overlapping
"""

from __future__ import annotations

import ipaddress
import os
import struct
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import Any

from scapy.layers.inet import IP, TCP, UDP, ICMP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from lace.bpf import ObjectSpec, RingBuffer, ensure_bpffs, enter_netns, test_run
from lace.datapath import config as cfgmod
from lace.datapath import registry
from lace.datapath.common import mac_bytes, Direction
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_key
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.policy import policy_entry, policy_keys, selected_key
from lace.datapath.routing import route_value, routing_key
from lace.datapath.segment import prefix_segment_key, segment_key, segment_value
from lace.datapath.trace import TRACE_EVENT

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
SKB_SIZE, SKB_INGRESS_IFINDEX, SKB_IFINDEX = 192, 36, 40

LOCATOR1, LOCATOR2 = "2001:db8:1::/48", "2001:db8:2::/48"
UNDERLAY1, UNDERLAY2 = "2001:db8:f::1", "2001:db8:f::2"
NEIGH_MAC = "02:00:00:00:0f:02"
UPLINK_MAC = "02:00:00:00:0f:01"
NET1, NET2 = 1, 2


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


@dataclass
class Result:
    retval: int
    data: bytes
    events: list[dict[str, Any]] = field(default_factory=list)

    def packet(self) -> Ether:
        return Ether(self.data)


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True)


class Datapath:
    """Loads pod_veth.o and uplink.o sharing their maps; see the module docstring."""

    def __init__(self, max_entries: dict[str, int] | None = None) -> None:
        #: CLI map name -> capacity override (benchmarks fill conntrack past its default size)
        self.max_entries = dict(max_entries or {})
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.netns = f"lace-dp-{tag}"
        self.pin_root = f"/sys/fs/bpf/lace-dp-{tag}"
        self.objects: list[Any] = []
        self.pods: dict[str, Pod] = {}
        self.events: list[bytes] = []
        _ip("netns", "add", self.netns)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- set-up -----------------------------------------------------------------------------

    def _build(self) -> None:
        ns = self.netns
        _ip("link", "set", "lo", "up", netns=ns)
        _ip("link", "add", "up0", "address", UPLINK_MAC, "type", "veth", "peer", "name", "up1", netns=ns)
        specs = [
            Pod("a", NET1, "10.1.1.10", "fd10:1::a", "02:00:00:00:00:0a", "02:00:00:00:01:0a", 257, "pa"),
            Pod("b", NET1, "10.1.1.11", "fd10:1::b", "02:00:00:00:00:0b", "02:00:00:00:01:0b", 258, "pb"),
            Pod("c", NET2, "10.1.1.10", "fd10:1::a", "02:00:00:00:00:0c", "02:00:00:00:01:0c", 300, "pc"),
            Pod("d", NET2, "10.1.1.12", "fd10:1::d", "02:00:00:00:00:0d", "02:00:00:00:01:0d", 301, "pd"),
            # a veth lace does not know: no endpoint entry
            Pod("x", NET1, "10.1.1.99", "fd10:1::99", "02:00:00:00:00:99", "02:00:00:00:01:99", 0, "px"),
        ]
        for i, pod in enumerate(specs, start=1):
            _ip("link", "add", pod.ifname, "address", pod.host_mac, "type", "veth", "peer", "name",
                pod.ifname + "p", netns=ns)
            pod.endpoint_id = i
            self.pods[pod.name] = pod
        for dev in ["up0", "up1"] + [p.ifname for p in specs] + [p.ifname + "p" for p in specs]:
            _ip("link", "set", dev, "up", netns=ns)
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
                       check=True, capture_output=True)
        _ip("-6", "addr", "add", f"{UNDERLAY1}/64", "dev", "up0", "nodad", netns=ns)
        _ip("-6", "neigh", "add", UNDERLAY2, "lladdr", NEIGH_MAC, "dev", "up0", "nud", "permanent", netns=ns)
        _ip("-6", "route", "add", LOCATOR2, "via", UNDERLAY2, "dev", "up0", netns=ns)
        self.ifindex = self._ifindexes()
        for pod in specs:
            pod.ifindex = self.ifindex[pod.ifname]

        ensure_bpffs()
        os.makedirs(self.pin_root)
        for name in ("pod_veth", "uplink"):
            spec = ObjectSpec.open(str(registry.bpf_object_path(name)), pin_root=self.pin_root)
            for cli, n in self.max_entries.items():
                spec.maps[registry.get(cli).pin_name].set_max_entries(n)
            self.objects.append(spec.load())
        self.maps = {}
        for obj in self.objects:
            for name, m in obj.maps.items():
                self.maps.setdefault(name, m)
        self.prog_pod = self.objects[0].programs["lace_from_pod"]
        self.prog_uplink = self.objects[1].programs["lace_from_uplink"]
        self.ring = RingBuffer(self.maps["lace_events"], self._on_event)

    def _ifindexes(self) -> dict[str, int]:
        out = subprocess.run(["ip", "-n", self.netns, "-o", "link"], check=True, capture_output=True, text=True)
        res = {}
        for line in out.stdout.splitlines():
            idx, name = line.split(":")[0:2]
            res[name.strip().split("@")[0]] = int(idx)
        return res

    def _on_event(self, data: bytes) -> int:
        self.events.append(bytes(data))
        return 0

    def close(self) -> None:
        ring = getattr(self, "ring", None)
        if ring is not None:
            ring.close()
        for obj in self.objects:
            obj.close()
        self.objects = []
        if os.path.isdir(self.pin_root):
            for f in os.listdir(self.pin_root):
                os.unlink(os.path.join(self.pin_root, f))
            os.rmdir(self.pin_root)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)

    # -- map programming --------------------------------------------------------------------

    def m(self, cli_name: str):
        return self.maps[registry.get(cli_name).pin_name]

    def clear(self) -> None:
        for cli, mdef in registry.MAPS.items():
            if mdef.map_type != "ringbuf":
                self.maps[mdef.pin_name].clear()
        self.ring.consume()
        self.events.clear()

    def reset(self) -> None:
        """Clear every map and program the base topology."""
        self.clear()
        self.m("config").update(cfgmod.config_key(), cfgmod.config_value(
            locator=LOCATOR1, underlay_addr=UNDERLAY1, node_id=1,
            uplink_ifindex=self.ifindex["up0"], mtu=1460))
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

    def route(self, src_net: int, cidr: str, dst_net: int, masquerade: bool = False) -> None:
        self.m("routing").update(routing_key(src_net, cidr), route_value(dst_net, masquerade=masquerade))

    def deliver_local(self, pod: Pod, family: int) -> None:
        plen = 32 if family == 4 else 128
        self.m("delivery").update(delivery_key(pod.network, f"{pod.ip(family)}/{plen}"), DELIVERY.pack(
            kind=DeliveryKind.LOCAL, ifindex=pod.ifindex, mac=mac_bytes(pod.mac),
            host_mac=mac_bytes(pod.host_mac), endpoint_id=pod.endpoint_id))

    def deliver_remote(self, net: int, cidr: str, locator: str, node_id: int) -> None:
        self.m("delivery").update(delivery_key(net, cidr), DELIVERY.pack(
            kind=DeliveryKind.REMOTE, node_id=node_id, sid=cfgmod.sid(locator, None, net)))

    def deliver_host(self, net: int, cidr: str) -> None:
        self.m("delivery").update(delivery_key(net, cidr), DELIVERY.pack(kind=DeliveryKind.HOST))

    def select(self, segment: int, direction: Direction, policy_id: int = 1, audit: bool = False) -> None:
        from lace.datapath.policy import PolicyFlag
        flags = PolicyFlag.SELECTED | (PolicyFlag.AUDIT if audit else 0)
        self.m("policy").update(selected_key(segment, direction), policy_entry(policy_id, 0, int(flags)))

    def allow(self, segment: int, peer: int, direction: Direction, proto: int | None = None,
              port: int | None = None, end_port: int | None = None, policy_id: int = 7, rule: int = 1) -> None:
        for k in policy_keys(segment, peer, direction, proto, port, end_port):
            self.m("policy").update(k, policy_entry(policy_id, rule))

    def prefix_segment(self, net: int, cidr: str, segment: int) -> None:
        self.m("prefix-segment").update(prefix_segment_key(net, cidr), segment_value(segment))

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
        self.ring.consume()
        events = [TRACE_EVENT.unpack(e) for e in self.events]
        self.events.clear()
        return Result(res.retval, res.data_out, events)

    def from_pod(self, pod: str | Pod, pkt) -> Result:
        p = self.pods[pod] if isinstance(pod, str) else pod
        return self.run(self.prog_pod, bytes(pkt), p.ifindex)

    def from_uplink(self, pkt) -> Result:
        return self.run(self.prog_uplink, bytes(pkt), self.ifindex["up0"])

    # -- packets ----------------------------------------------------------------------------

    def l3(self, src: Pod, dst_ip: str, family: int, **kw):
        ether = Ether(src=src.mac, dst=src.host_mac)
        if family == 4:
            return ether / IP(src=src.ipv4, dst=dst_ip, **kw)
        return ether / IPv6(src=src.ipv6, dst=dst_ip, **kw)

    def encap(self, inner, dst_net: int, src_net: int, locator: str = LOCATOR1):
        """An SRv6-encapsulated packet as node 2 would send it to us."""
        outer_dst = str(ipaddress.IPv6Address(cfgmod.sid(locator, None, dst_net, src_net)))
        nh = 4 if inner.haslayer(IP) else 41
        return (Ether(src=NEIGH_MAC, dst=UPLINK_MAC) /
                IPv6(src=UNDERLAY2, dst=outer_dst, nh=nh, hlim=64) / inner)


def icmp_echo(family: int, ident: int = 0x77, reply: bool = False):
    from scapy.layers.inet6 import ICMPv6EchoReply, ICMPv6EchoRequest
    if family == 4:
        return ICMP(type=0 if reply else 8, id=ident, seq=1)
    return (ICMPv6EchoReply if reply else ICMPv6EchoRequest)(id=ident, seq=1)


__all__ = ["Datapath", "Pod", "Result", "REMOTE", "icmp_echo", "TCP", "UDP", "IP", "IPv6", "Ether",
           "TC_ACT_OK", "TC_ACT_SHOT", "TC_ACT_REDIRECT", "NET1", "NET2"]
