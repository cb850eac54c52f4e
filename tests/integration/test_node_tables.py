"""The agent's table maps (Maglev) read and written through their memory mapping: each table lands
at exactly the array elements the datapath looks up, and reads back as written; the mapping lasts
only as long as the read or the write (the array's pages are not kept in the agent's RSS)."""

from __future__ import annotations

import random
import struct

import pytest

from lace.agent.datapath import NodeDatapath
from lace.agent.diff import MapChanges
from lace.datapath.services import MAGLEV_SIZE, maglev_key

pytestmark = pytest.mark.privileged


def bpf_map_mappings() -> int:
    """The kernel's map pages mapped into this process, in KiB (/proc/self/smaps)."""
    total, in_map = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and not line.startswith(("Rss", "Size")):
                in_map = line.rstrip().endswith("anon_inode:bpf-map")
            elif in_map and line.startswith("Size:"):
                total += int(line.split()[1])
    return total


def _entry(m, table: int, index: int) -> int:
    return struct.unpack("<I", m.lookup(maglev_key(table, index)))[0]


def test_maglev_tables_through_the_mapping_are_what_lookups_see(pin_root):
    dp = NodeDatapath(pin_root)
    dp.load()
    before = bpf_map_mappings()
    try:
        rnd = random.Random(5)
        tables = {t: [rnd.randrange(1, 1 << 32) for _ in range(MAGLEV_SIZE)] for t in (1, 3)}
        blobs = {struct.pack("<I", t): struct.pack(f"<{MAGLEV_SIZE}I", *ids) for t, ids in tables.items()}
        dp.apply({"maglev": MapChanges(dict(blobs), [])}, ["maglev"])
        assert bpf_map_mappings() == before, "the write left the table's memory mapped"
        m = dp.map("maglev")
        for t, ids in tables.items():
            assert [_entry(m, t, i) for i in range(MAGLEV_SIZE)] == ids, f"table {t}"
        # the neighbours of a table stay empty: nothing is written past its own elements
        assert _entry(m, 2, 0) == 0 and _entry(m, 2, MAGLEV_SIZE - 1) == 0 and _entry(m, 4, 0) == 0
        assert dp.read_kernel("maglev") == blobs
        assert dp.read("maglev") == blobs and bpf_map_mappings() == before, "the read left it mapped"
        # a table written by lookups' own path (a map update) reads back through the mapping
        m.update(maglev_key(5, 7), struct.pack("<I", 42))
        assert dp.read_kernel("maglev")[struct.pack("<I", 5)] == struct.pack(f"<{MAGLEV_SIZE}I", *(
            42 if i == 7 else 0 for i in range(MAGLEV_SIZE)))
        dp.apply({"maglev": MapChanges({}, [struct.pack("<I", 1), struct.pack("<I", 5)])}, ["maglev"])
        assert set(dp.read_kernel("maglev")) == {struct.pack("<I", 3)}
        assert _entry(m, 1, 0) == 0
    finally:
        dp.close()


def test_counting_a_map_reads_it_in_small_batches(pin_root):
    """Map.count (the metrics' and the status's map fill) agrees with a full dump for a hash map
    read over several batches, an array (every element) and a trie (no batch lookup)."""
    from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_key
    from lace.datapath.segment import segment_key, segment_value
    dp = NodeDatapath(pin_root)
    dp.load()
    try:
        seg = dp.map("segment")
        n = 10_000   # more than two batches of 4096
        keys = b"".join(segment_key(1, f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}") for i in range(n))
        seg.update_batch(keys, segment_value(300) * n, n)
        assert seg.count() == seg.dump()[2] == n
        assert seg.count(chunk=7) == n
        maglev = dp.map("maglev")
        assert maglev.count() == maglev.dump()[2] == maglev.max_entries
        trie = dp.map("delivery")
        for i in range(3):
            trie.update(delivery_key(1, f"10.9.{i}.0/24"), DELIVERY.pack(kind=DeliveryKind.HOST))
        assert trie.count() == trie.dump()[2] == 3
    finally:
        dp.close()
