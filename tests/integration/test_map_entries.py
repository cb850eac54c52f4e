"""Map fill as the agent's metrics and status read it (NodeDatapath.entry_counts, lace.bpf.iter):
the kernel's own count of a hash map's entries, through a map iterator, must be what walking the
map finds — after writes, deletes and an LRU table's evictions — and the other map types are
walked. The real datapath objects on a private pin root."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lace.agent.datapath import NodeDatapath
from lace.bpf import MapEntryCounts
from lace.bpf.iter import COUNTED_TYPES
from lace.datapath import registry
from lace.datapath.conntrack import CT4_KEY, CT_ENTRY
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_key
from lace.datapath.segment import segment_key, segment_value

pytestmark = pytest.mark.privileged

CT_CAPACITY = 4096


def ct_entries(n: int, first: int = 0) -> tuple[bytes, bytes]:
    """n TCPv4 conntrack keys and entries, source ports first.. (one source address)."""
    keys = np.zeros(n, dtype=CT4_KEY.dtype)
    keys["network"] = 1
    keys["saddr"] = np.full(n, 0x0A010102, dtype=">u4").view("V4")
    keys["daddr"] = np.full(n, 0x0A010103, dtype=">u4").view("V4")
    keys["sport"] = (np.arange(first, first + n) % 65536).astype(">u2")
    keys["dport"] = 80
    keys["proto"] = 6
    vals = np.zeros(n, dtype=CT_ENTRY.dtype)
    vals["expires_ns"] = time.monotonic_ns() + 3600 * 10**9
    return keys.tobytes(), vals.tobytes()


@pytest.fixture
def dp(pin_root):
    d = NodeDatapath(pin_root, max_entries={"ct-tcp-v4": CT_CAPACITY})
    d.load()
    try:
        yield d
    finally:
        d.close()


def walked(dp: NodeDatapath, names) -> dict[str, int]:
    return {name: dp.map(name).count() for name in names}


def test_every_maps_count_is_what_a_walk_finds(dp):
    names = [n for n, m in registry.MAPS.items() if m.map_type != "ringbuf"]
    assert dp.entry_counts(names) == walked(dp, names)
    assert dp.counts_from_kernel, "the map iterator loaded (Linux 6.6+ with BTF)"
    ct = dp.map("ct-tcp-v4")
    assert ct.type in COUNTED_TYPES and dp.map("delivery").type not in COUNTED_TYPES
    keys, vals = ct_entries(1000)
    ct.update_batch(keys, vals, 1000)
    seg = dp.map("segment")
    for i in range(1, 50):
        seg.update(segment_key(1, f"10.1.1.{i}"), segment_value(256 + i))
    dp.map("delivery").update(delivery_key(1, "10.1.1.0/24"),
                              DELIVERY.pack(kind=DeliveryKind.HOST))   # a trie: walked
    counts = dp.entry_counts(names)
    assert counts == walked(dp, names)
    assert (counts["ct-tcp-v4"], counts["segment"], counts["delivery"]) == (1000, 49, 1)
    # deletes, and a full LRU table: its evictions leave the kernel's count right
    ct.delete(keys[:CT4_KEY.size])
    for first in range(1000, 3 * CT_CAPACITY, 1000):
        keys, vals = ct_entries(1000, first)
        ct.update_batch(keys, vals, 1000)
    counts = dp.entry_counts(["ct-tcp-v4", "segment"])
    assert counts == walked(dp, ["ct-tcp-v4", "segment"])
    assert 0 < counts["ct-tcp-v4"] <= CT_CAPACITY


def test_the_iterator_reads_every_hash_map_at_once(dp, pin_root):
    """One read of the iterator has a line for each map in the kernel, the datapath's among them."""
    with MapEntryCounts(str(registry.bpf_dir() / registry.MAP_ENTRIES_OBJECT),
                        registry.MAP_ENTRIES_PROGRAM) as counter:
        dp.map("segment").update(segment_key(1, "10.1.1.1"), segment_value(257))
        got = counter.read()
    hashes = {n: dp.map(n) for n, m in registry.MAPS.items() if m.map_type in ("hash", "lru_hash")}
    assert {m.id for m in hashes.values()} <= set(got)
    assert got[hashes["segment"].id] == 1
