"""The agent's pure parts: desired map contents from a snapshot, and the diff against the kernel."""

from __future__ import annotations

import ipaddress as ia

from lace.agent.desired import desired_maps
from lace.agent.diff import diff, diff_all
from lace.agent.model import (Block, HostAddress, HostLink, LocalEndpoint, Network, Node, NodeConfig, PodAddress,
                              Route, Snapshot)
from lace.datapath.common import NETWORK_OUTSIDE, SEGMENT_HOST, SEGMENT_REMOTE_NODE
from lace.datapath.config import decode_config, sid
from lace.datapath.delivery import (DELIVERY, DELIVERY_EXACT_KEY, DELIVERY_KEY, DeliveryKind, decode_delivery_key,
                                    delivery_exact_key, delivery_key)
from lace.datapath.devices import decode_device, device_key
from lace.datapath.endpoint import decode_endpoint, veth_key
from lace.datapath.policy import policy_entry, selected_key
from lace.datapath.routing import decode_route, routing_key
from lace.datapath.segment import SEGMENT_VALUE, segment_key

N1 = Node("worker-1", 1, ia.IPv6Address("fd5e:ff::1"), ia.IPv6Network("fd5e:c000:1::/48"))
N2 = Node("worker-2", 2, ia.IPv6Address("fd5e:ff::2"), ia.IPv6Network("fd5e:c000:2::/48"))


def snapshot() -> Snapshot:
    default = Network("default", 1, (ia.ip_network("10.244.0.0/16"), ia.ip_network("fd00:10:244::/56")))
    blue = Network("blue", 2, (ia.ip_network("10.10.0.0/16"),),
                   (Route(1, (ia.ip_network("10.244.7.0/24"),)), Route(NETWORK_OUTSIDE, (), True)))
    s = Snapshot(NodeConfig(N1, 2, "02:00:00:00:00:01", 1460), {"default": default, "blue": blue},
                 {"worker-1": N1, "worker-2": N2})
    s.blocks = [Block(1, "worker-1", ia.ip_network("10.244.0.0/24")),
                Block(1, "worker-2", ia.ip_network("10.244.1.0/24")),
                Block(2, "worker-2", ia.ip_network("10.10.1.0/24"))]
    s.pods = [PodAddress(1, ia.ip_address("10.244.0.5"), 300, "worker-1", "x/a"),
              PodAddress(1, ia.ip_address("10.244.1.9"), 301, "worker-2", "x/b")]
    s.endpoints = [LocalEndpoint(7, "x/a", "c1", 1, 300, 7, "lxaaaa", "02:aa:00:00:00:01", "02:bb:00:00:00:01",
                                 ia.IPv4Address("10.244.0.5"), None)]
    return s


def test_config_and_devices():
    want = desired_maps(snapshot())
    ((k, v),) = want["config"].items()
    c = decode_config(v)
    assert c["node_id"] == 1 and c["uplink_ifindex"] == 2 and c["mtu"] == 1460
    assert len(want["devices"]) == 2   # the uplink and the pod veth


def test_routing_own_cidrs_routes_and_outside():
    want = desired_maps(snapshot())["routing"]
    assert decode_route(want[routing_key(1, "10.244.0.0/16")])["dst_network"] == 1
    assert decode_route(want[routing_key(2, "10.10.0.0/16")])["dst_network"] == 2
    assert decode_route(want[routing_key(2, "10.244.7.0/24")])["dst_network"] == 1
    out = decode_route(want[routing_key(2, "0.0.0.0/0")])
    assert out["outside"] and out["masquerade"]
    assert routing_key(1, "0.0.0.0/0") not in want, "default has no route out"


def test_delivery_remote_blocks_and_local_pods():
    want = desired_maps(snapshot())["delivery"]
    remote = DELIVERY.unpack(want[delivery_key(1, "10.244.1.0/24")])
    assert remote["kind"] == DeliveryKind.REMOTE and remote["node_id"] == 2
    assert remote["sid"] == sid("fd5e:c000:2::/48", None, 1)
    assert DELIVERY.unpack(want[delivery_key(2, "10.10.1.0/24")])["sid"] == sid("fd5e:c000:2::/48", None, 2)
    assert delivery_key(1, "10.244.0.0/24") not in want, "own blocks are delivered per pod"
    local = DELIVERY.unpack(want[delivery_key(1, "10.244.0.5/32")])
    assert local["kind"] == DeliveryKind.LOCAL and local["ifindex"] == 7


def test_veth_and_segments():
    want = desired_maps(snapshot())
    ep = decode_endpoint(want["veth"][veth_key(7)])
    assert ep["network"] == 1 and ep["segment"] == 300
    seg = SEGMENT_VALUE.unpack(want["segment"][segment_key(1, "10.244.1.9")])
    assert seg["segment"] == 301 and seg["flags"] == 0
    assert SEGMENT_VALUE.unpack(want["segment"][segment_key(1, "10.244.0.5")])["flags"] == 1  # local


def host_snapshot() -> Snapshot:
    s = snapshot()
    s.host_addresses = [HostAddress("worker-1", ia.ip_address("10.244.0.1")),
                        HostAddress("worker-1", ia.ip_address("fd00:10:244::1")),
                        HostAddress("worker-2", ia.ip_address("10.244.1.1"))]
    s.host_link = HostLink(12, "02:cc:00:00:00:01")
    return s


def test_host_device_registered_as_role_host():
    want = desired_maps(host_snapshot())["devices"]
    assert decode_device(want[device_key(12)]) == {"mac": "02:cc:00:00:00:01", "role": "host", "flags": 0}
    assert device_key(12) not in desired_maps(snapshot())["devices"], "no device before the agent makes it"


def test_host_addresses_delivered_to_the_stack_here_and_through_the_block_elsewhere():
    want = desired_maps(host_snapshot())["delivery"]
    for ip in ("10.244.0.1/32", "fd00:10:244::1/128"):
        assert DELIVERY.unpack(want[delivery_key(1, ip)])["kind"] == DeliveryKind.HOST
    # worker-2's host address is reached through worker-2's block, like its pods
    assert delivery_key(1, "10.244.1.1/32") not in want
    assert DELIVERY.unpack(want[delivery_key(1, "10.244.1.0/24")])["kind"] == DeliveryKind.REMOTE


def test_host_addresses_are_segment_host_here_and_remote_node_elsewhere():
    want = desired_maps(host_snapshot())["segment"]
    assert SEGMENT_VALUE.unpack(want[segment_key(1, "10.244.0.1")]) == {"segment": SEGMENT_HOST, "flags": 1}
    assert SEGMENT_VALUE.unpack(want[segment_key(1, "fd00:10:244::1")]) == {"segment": SEGMENT_HOST, "flags": 1}
    assert SEGMENT_VALUE.unpack(want[segment_key(1, "10.244.1.1")]) == {"segment": SEGMENT_REMOTE_NODE, "flags": 0}


def test_other_nodes_are_the_only_underlay_peers():
    """The uplink decapsulates only from another node: worker-2's underlay address and origin SID
    (locator, function OUTSIDE) are REMOTE_NODE in network OUTSIDE; this node's own are not."""
    want = desired_maps(snapshot())["segment"]
    peers = {k: SEGMENT_VALUE.unpack(v) for k, v in want.items() if k[:4] == NETWORK_OUTSIDE.to_bytes(4, "little")}
    origin = str(ia.IPv6Address(sid("fd5e:c000:2::/48", None, NETWORK_OUTSIDE)))
    assert origin == "fd5e:c000:2:ffff:ffff::"
    assert peers == {segment_key(NETWORK_OUTSIDE, "fd5e:ff::2"): {"segment": SEGMENT_REMOTE_NODE, "flags": 0},
                     segment_key(NETWORK_OUTSIDE, origin): {"segment": SEGMENT_REMOTE_NODE, "flags": 0}}


def test_diff_updates_deletes_and_leaves_equal_entries():
    desired = {b"k1": b"v1", b"k2": b"v2"}
    actual = {b"k1": b"v1", b"k2": b"old", b"k3": b"gone"}
    ch = diff("routing", desired, actual)
    assert ch.updates == {b"k2": b"v2"} and ch.deletes == [b"k3"]
    assert not diff("routing", desired, desired)


def test_diff_keeps_policy_hit_counters():
    key = selected_key(300, 0)
    counted = bytearray(policy_entry(5, 1))
    counted[8:16] = (1234).to_bytes(8, "little")
    assert not diff("policy", {key: policy_entry(5, 1)}, {key: bytes(counted)})


def test_desired_is_deterministic():
    assert desired_maps(snapshot()) == desired_maps(snapshot())
    assert not any(diff_all(desired_maps(snapshot()), desired_maps(snapshot())).values())


def test_frontends_left_out_of_a_full_services_map_get_map_full_routes():
    from lace.datapath.routing import decode_route, routing_key
    from lace.services.model import Backend, Frontend
    from lace.services.program import ServiceProgrammer
    s = snapshot()
    b = Backend(1, ia.ip_address("10.244.0.5"), 8080, 6)
    s.frontends = [Frontend(i, f"x/s{i}", "", (1,), ia.ip_address(f"10.96.0.{i}"), 80, 6, 0, 0, (b,))
                   for i in (1, 2, 3)]
    svc = ServiceProgrammer(capacity=4)     # two frontends of two entries each fit
    want = desired_maps(s, services=svc)
    assert svc.pressure.reason == "services map full" and svc.pressure.programmed == 2
    r = decode_route(want["routing"][routing_key(1, "10.96.0.3/32")])
    assert r["service_map_full"] and not r["masquerade"]
    assert routing_key(1, "10.96.0.1/32") not in want["routing"], "a programmed frontend has no such route"
    # room again: the route goes
    svc_ok = ServiceProgrammer(capacity=100)
    assert routing_key(1, "10.96.0.3/32") not in desired_maps(s, services=svc_ok)["routing"]


# ---- delivery-exact: the delivery trie's full-length entries, kept in step with it --------------

def dual_stack_snapshot() -> Snapshot:
    """host_snapshot plus a dual-stack pod and a remote node's block of a single address (a
    full-length REMOTE entry)."""
    s = host_snapshot()
    s.blocks.append(Block(1, "worker-2", ia.ip_network("10.244.9.7/32")))
    s.endpoints.append(LocalEndpoint(8, "x/c", "c2", 1, 300, 8, "lxcccc", "02:aa:00:00:00:02",
                                     "02:bb:00:00:00:02", ia.IPv4Address("10.244.0.6"),
                                     ia.IPv6Address("fd00:10:244::6")))
    return s


def full_length_by_prefix(entries: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The /32 and /128 entries under their exact keys, told apart by their decoded prefix and
    packed field by field (not by the helpers the agent uses)."""
    out = {}
    for k, v in entries.items():
        d = decode_delivery_key(k)
        if d["prefix"].endswith("/32" if d["family"] == "ipv4" else "/128"):
            f = DELIVERY_KEY.unpack(k)
            out[DELIVERY_EXACT_KEY.pack(network=f["network"], family=f["family"], addr=f["addr"])] = v
    return out


def test_every_full_length_delivery_entry_has_an_identical_exact_entry_and_nothing_else():
    for s in (snapshot(), host_snapshot(), dual_stack_snapshot()):
        want = desired_maps(s)
        assert want["delivery-exact"] == full_length_by_prefix(want["delivery"])
    want = desired_maps(dual_stack_snapshot())
    exact = want["delivery-exact"]
    for ip, kind in (("10.244.0.5", DeliveryKind.LOCAL), ("10.244.0.6", DeliveryKind.LOCAL),
                     ("fd00:10:244::6", DeliveryKind.LOCAL), ("10.244.0.1", DeliveryKind.HOST),
                     ("fd00:10:244::1", DeliveryKind.HOST), ("10.244.9.7", DeliveryKind.REMOTE)):
        plen = 32 if ":" not in ip else 128
        assert exact[delivery_exact_key(1, ip)] == want["delivery"][delivery_key(1, f"{ip}/{plen}")], ip
        assert DELIVERY.unpack(exact[delivery_exact_key(1, ip)])["kind"] == kind, ip
    assert len(exact) == 6, "the /24 blocks stay in the trie alone"


class _Kernel:
    """Owned maps as dicts, written through NodeDatapath.apply (the agent's one writer) with every
    write logged; after each one, the exact map must hold no key the trie lacks."""

    def __init__(self, maps: dict[str, dict[bytes, bytes]]) -> None:
        self.maps = {n: dict(e) for n, e in maps.items()}
        self.log: list[tuple[str, str, bytes]] = []

    def map(self, name: str):
        kernel, entries = self, self.maps[name]

        class M:
            def update(self, k: bytes, v: bytes) -> None:
                entries[k] = v
                kernel.wrote("update", name, k)

            def delete(self, k: bytes) -> None:
                del entries[k]
                kernel.wrote("delete", name, k)
        return M()

    def wrote(self, op: str, name: str, k: bytes) -> None:
        self.log.append((op, name, k))
        trie, exact = self.maps["delivery"], self.maps["delivery-exact"]
        assert exact.keys() <= full_length_by_prefix(trie).keys(), \
            f"after {op} {name}: the exact map holds a key the trie lacks"

    def apply(self, want: dict[str, dict[bytes, bytes]]) -> None:
        from lace.agent.datapath import NodeDatapath
        from lace.agent.desired import OWNED_MAPS

        dp = NodeDatapath("/nonexistent")   # never loaded: its maps are these dicts
        dp.map = self.map                   # type: ignore[method-assign]
        dp.apply({n: ch for n, ch in diff_all(want, self.maps).items() if ch}, OWNED_MAPS)
        assert self.maps["delivery-exact"] == full_length_by_prefix(self.maps["delivery"])


def pod_keys(ep: LocalEndpoint) -> list[tuple[bytes, bytes]]:
    """The endpoint's (trie key, exact key) per address."""
    return [(delivery_key(ep.network, f"{ip}/{ip.max_prefixlen}"), delivery_exact_key(ep.network, str(ip)))
            for ip in ep.ips()]


def ops_on(kernel: _Kernel, trie_key: bytes, exact_key: bytes) -> list[tuple[str, str]]:
    return [(op, name) for op, name, key in kernel.log
            if (name, key) in (("delivery", trie_key), ("delivery-exact", exact_key))]


def test_a_pod_delete_removes_both_entries_in_one_pass_the_exact_one_first():
    before = dual_stack_snapshot()
    gone = before.endpoints[-1]
    after = dual_stack_snapshot()
    after.endpoints = after.endpoints[:-1]
    kernel = _Kernel(desired_maps(before))
    kernel.apply(desired_maps(after))
    for k, ek in pod_keys(gone):
        assert k not in kernel.maps["delivery"] and ek not in kernel.maps["delivery-exact"]
        ops = ops_on(kernel, k, ek)
        assert ops == [("delete", "delivery-exact"), ("delete", "delivery")], ops
    assert delivery_exact_key(1, "10.244.0.5") in kernel.maps["delivery-exact"], "the other pod stays"


def test_a_pod_add_writes_the_trie_then_the_exact_map():
    after = dual_stack_snapshot()
    before = dual_stack_snapshot()
    before.endpoints = before.endpoints[:-1]
    kernel = _Kernel(desired_maps(before))
    kernel.apply(desired_maps(after))
    want = desired_maps(after)
    for k, ek in pod_keys(after.endpoints[-1]):
        assert kernel.maps["delivery"][k] == kernel.maps["delivery-exact"][ek] == want["delivery"][k]
        ops = ops_on(kernel, k, ek)
        assert ops == [("update", "delivery"), ("update", "delivery-exact")], ops


def test_an_address_taken_over_by_another_pod_changes_both_to_the_same_value():
    """One pass deletes a pod and adds another with its address: the entry changes in place, the
    trie first, then the exact map, which ends with the trie's new value (in between it still
    answers with the old one, as the trie did a moment before)."""
    before = dual_stack_snapshot()
    old = before.endpoints[-1]
    after = dual_stack_snapshot()
    after.endpoints[-1] = LocalEndpoint(9, "x/d", "c3", 1, 300, 9, "lxdddd", "02:aa:00:00:00:03",
                                        "02:bb:00:00:00:03", old.ipv4, old.ipv6)
    kernel = _Kernel(desired_maps(before))
    kernel.apply(desired_maps(after))
    for k, ek in pod_keys(old):
        new = kernel.maps["delivery"][k]
        assert DELIVERY.unpack(new)["ifindex"] == 9 and kernel.maps["delivery-exact"][ek] == new
        ops = ops_on(kernel, k, ek)
        assert ops == [("update", "delivery"), ("update", "delivery-exact")], ops
