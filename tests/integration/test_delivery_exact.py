"""delivery-exact on a real kernel: the agent's writer (lace.agent.datapath.NodeDatapath) fills the
exact-match hash with the delivery trie's full-length entries and a pod's delete pass takes them out
of both; a node whose pins predate the map gets it pinned new on the next load, nothing migrated."""

from __future__ import annotations

import ipaddress as ia
import os

import pytest

from lace.agent.datapath import NodeDatapath
from lace.agent.desired import OWNED_MAPS, desired_maps
from lace.agent.diff import diff_all
from lace.agent.model import Block, HostAddress, LocalEndpoint, Network, Node, NodeConfig, Snapshot
from lace.datapath import registry
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_exact_key, delivery_key, exact_entries
from lace.datapath.node import load_objects
from lace.datapath.segment import segment_key, segment_value

pytestmark = pytest.mark.privileged

N1 = Node("worker-1", 1, ia.IPv6Address("fd5e:ff::1"), ia.IPv6Network("fd5e:c000:1::/48"))
N2 = Node("worker-2", 2, ia.IPv6Address("fd5e:ff::2"), ia.IPv6Network("fd5e:c000:2::/48"))


def snapshot(pods: int) -> Snapshot:
    """worker-1 with ``pods`` dual-stack pods, its host addresses, and worker-2's blocks."""
    default = Network("default", 1, (ia.ip_network("10.244.0.0/16"), ia.ip_network("fd00:10:244::/56")))
    s = Snapshot(NodeConfig(N1, 1, "02:00:00:00:00:01", 1460), {"default": default},
                 {"worker-1": N1, "worker-2": N2})
    s.blocks = [Block(1, "worker-1", ia.ip_network("10.244.0.0/24")),
                Block(1, "worker-2", ia.ip_network("10.244.1.0/24")),
                Block(1, "worker-2", ia.ip_network("fd00:10:244:1::/64"))]
    s.host_addresses = [HostAddress("worker-1", ia.ip_address("10.244.0.1")),
                        HostAddress("worker-1", ia.ip_address("fd00:10:244::1"))]
    s.endpoints = [LocalEndpoint(10 + i, f"x/p{i}", f"c{i}", 1, 300, 100 + i, f"lx{i:04d}", f"02:bb:00:00:00:{i:02x}",
                                 f"02:aa:00:00:00:{i:02x}", ia.IPv4Address(f"10.244.0.{10 + i}"),
                                 ia.IPv6Address(f"fd00:10:244::{10 + i:x}"))
                   for i in range(pods)]
    return s


def reconcile(dp: NodeDatapath, s: Snapshot) -> None:
    """One pass as the agent makes it: desired state against what the kernel holds."""
    have = {name: dp.read(name) for name in OWNED_MAPS}
    dp.apply({n: ch for n, ch in diff_all(desired_maps(s), have).items() if ch}, OWNED_MAPS)


def test_the_writer_keeps_the_exact_map_in_step_and_a_pod_delete_clears_both(pin_root: str) -> None:
    dp = NodeDatapath(pin_root)
    dp.load()
    try:
        reconcile(dp, snapshot(3))
        trie, exact = dp.read_kernel("delivery"), dp.read_kernel("delivery-exact")
        # the pods' and the host's addresses; worker-2's blocks stay in the trie alone
        assert exact == exact_entries(trie) and len(exact) == 3 * 2 + 2 and len(trie) == len(exact) + 2
        assert delivery_key(1, "10.244.1.0/24") in trie
        gone = [("10.244.0.12/32", "10.244.0.12"), ("fd00:10:244::c/128", "fd00:10:244::c")]
        assert all(DELIVERY.unpack(exact[delivery_exact_key(1, ip)]) == DELIVERY.unpack(trie[delivery_key(1, p)])
                   for p, ip in gone)
        assert all(DELIVERY.unpack(exact[delivery_exact_key(1, ip)])["ifindex"] == 102 for _, ip in gone)

        reconcile(dp, snapshot(2))   # the last pod deleted (CNI DEL ends in this pass)
        trie, exact = dp.read_kernel("delivery"), dp.read_kernel("delivery-exact")
        assert not any(delivery_key(1, p) in trie or delivery_exact_key(1, ip) in exact for p, ip in gone)
        assert exact == exact_entries(trie) and len(exact) == 2 * 2 + 2
        assert DELIVERY.unpack(exact[delivery_exact_key(1, "10.244.0.1")])["kind"] == DeliveryKind.HOST

        reconcile(dp, snapshot(0))
        assert dp.read_kernel("delivery-exact") == exact_entries(dp.read_kernel("delivery"))
        assert len(dp.read_kernel("delivery-exact")) == 2
    finally:
        dp.close()


def test_a_node_whose_pins_predate_the_map_gets_it_pinned_new(pin_root: str) -> None:
    """An upgrade adds delivery-exact to pins made without it: the load pins it, empty, beside the
    reused ones; nothing is migrated (the agent's next pass fills it)."""
    seg = segment_key(1, "10.244.0.10")
    with load_objects(pin_root) as dp:
        dp.map("segment").update(seg, segment_value(300, local=True))
        seg_id = dp.map("segment").id
    pin = os.path.join(pin_root, registry.get("delivery-exact").pin_name)
    os.unlink(pin)
    with load_objects(pin_root) as dp:
        assert dp.migrations == []
        assert os.path.exists(pin) and dp.entries("delivery-exact") == {}
        assert dp.map("segment").id == seg_id and dp.entries("segment") == {seg: segment_value(300, local=True)}


def test_a_resync_read_takes_what_the_kernel_holds_and_keeps_the_records_own_entries(pin_root: str) -> None:
    """The writer's record after a fresh read is the kernel's map, drift included, and the entries
    that did not drift stay the very objects it held (a resync replacing them all every 30 s left
    the agent's heap full of holes)."""
    dp = NodeDatapath(pin_root)
    dp.load()
    try:
        reconcile(dp, snapshot(3))
        held = dp.read("segment", fresh=False)
        m = dp.map("segment")
        k_gone, k_changed = sorted(held)[:2]
        m.delete(k_gone)
        m.update(k_changed, segment_value(4242))
        k_new = segment_key(1, "10.244.0.99")
        m.update(k_new, segment_value(7))
        kernel = dp.read("segment")   # what a resync does
        assert dp.read("segment", fresh=False) == kernel == dp.read_kernel("segment")
        assert k_gone not in kernel and kernel[k_changed] == segment_value(4242) and kernel[k_new] == segment_value(7)
        after = dp.read("segment", fresh=False)
        assert all(after[k] is held[k] for k in held if k not in (k_gone, k_changed))
    finally:
        dp.close()
