"""lace.bpf against the real kernel: pinning and migration, batch ops, LPM, per-CPU, ring buffer,
verifier errors, tcx and tc attachment with real traffic, and cleanup checked with bpftool."""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from lace import bpf
from lace.bpf import Layout, Map, ObjectSpec, TypedMap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def bpftool_json(*args: str) -> object:
    return json.loads(run("bpftool", "-j", *args).stdout or "null")

pytestmark = pytest.mark.privileged

LT_KEY = Layout("lt_key", [("addr", "bytes:16"), ("id", "u32")])
LT_VALUE = Layout("lt_value", [("packets", "u64"), ("bytes", "u64"), ("blob", "bytes:80")])
LT_VALUE_V2 = Layout("lt_value", [("packets", "u64"), ("bytes", "u64"), ("blob", "bytes:80"), ("added", "u64")])
LT_LPM_KEY = Layout("lt_lpm_key", [("prefixlen", "u32"), ("addr", "bytes:4")])
U32 = Layout("u32", [("v", "u32")])
PCPU_VALUE = Layout("lt_pcpu_value", [("runs", "u32"), ("last_len", "u32")])


def key(i: int) -> bytes:
    return LT_KEY.pack(addr=i.to_bytes(16, "big"), id=i)


def value(i: int) -> bytes:
    return LT_VALUE.pack(packets=i, bytes=i * 100, blob=bytes([i % 256]) * 80)


def packet(dst: bytes = b"\x0a\x01\x02\x03", size: int = 64) -> bytes:
    """An Ethernet + IPv4 frame (no checksums needed for test runs) to ``dst``."""
    eth = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00"
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, size - 14, 0, 0, 64, 17, 0, b"\x0a\x00\x00\x01", dst)
    return (eth + ip).ljust(size, b"\0")


def send_udp(v, n: int) -> None:
    """Send ``n`` UDP datagrams from namespace b to a's address (a socket opened inside b)."""
    with bpf.enter_netns(v.b):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(n):
            s.sendto(b"lace", (v.a_addr, 9))
    finally:
        s.close()


def wait_for(pred, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def counter(obj: bpf.Object, slot: int) -> int:
    raw = obj.maps["lt_counter"].lookup(slot)
    assert raw is not None
    return int.from_bytes(raw, "little")


def links_of(prog_ids: set[int]) -> list[dict]:
    """Links bpftool (an independent oracle) sees for any of ``prog_ids``."""
    return [lk for lk in (bpftool_json("link", "show") or []) if lk.get("prog_id") in prog_ids]


def possible_cpus() -> int:
    """CPU count from /sys/devices/system/cpu/possible (e.g. "0-3,8"), independent of libbpf."""
    total = 0
    for part in open("/sys/devices/system/cpu/possible").read().strip().split(","):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def pins_in(root: str) -> list[str]:
    return sorted(os.listdir(root))


# --- pinning, reuse, migration -------------------------------------------------------------------


def test_spec_describes_maps_and_programs(bpf_objects, pin_root):
    spec = ObjectSpec.open(bpf_objects["base"], pin_root=pin_root)
    try:
        h = spec.maps["lt_hash"]
        assert (h.type_name, h.key_size, h.value_size, h.max_entries) == ("hash", 20, 96, 1024)
        assert h.pinned and h.pin_path == os.path.join(pin_root, "lt_hash")
        assert not spec.maps["lt_lpm"].pinned
        assert spec.maps["lt_lpm"].type_name == "lpm_trie"
        assert set(spec.programs) == {"lt_count", "lt_count_v2", "lt_emit", "lt_lpm_lookup"}
        assert spec.programs["lt_count"].type_name == "sched_cls"
        h.set_private()
        assert not h.pinned
    finally:
        spec.close()


def test_pinned_maps_are_reused_by_a_new_process(bpf_objects, pin_root):
    with ObjectSpec.open(bpf_objects["base"], pin_root=pin_root).load() as obj:
        assert obj.migrations == []
        h = obj.maps["lt_hash"]
        for i in range(3):
            h.update(key(i), value(i))
        first_id = h.id
    assert pins_in(pin_root) == ["lt_counter", "lt_hash", "lt_rekeyed"]

    script = f"""
import json
from lace.bpf import ObjectSpec
with ObjectSpec.open({str(bpf_objects['base'])!r}, pin_root={pin_root!r}).load() as obj:
    h = obj.maps["lt_hash"]
    print(json.dumps({{"id": h.id, "migrations": len(obj.migrations),
                      "items": sorted([k.hex(), v.hex()] for k, v in h.items())}}))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen["id"] == first_id and seen["migrations"] == 0
    assert seen["items"] == sorted([key(i).hex(), value(i).hex()] for i in range(3))


def test_migration_grows_value_and_capacity_keeping_entries(bpf_objects, pin_root):
    with ObjectSpec.open(bpf_objects["base"], pin_root=pin_root).load() as obj:
        h = obj.maps["lt_hash"]
        keys = b"".join(key(i) for i in range(100))
        assert h.update_batch(keys, b"".join(value(i) for i in range(100)), 100) == 100
        for i in range(5):
            obj.maps["lt_rekeyed"].update(i, (i * 10).to_bytes(8, "little"))
        obj.maps["lt_counter"].update(0, (42).to_bytes(8, "little"))
        old_counter_id = obj.maps["lt_counter"].id

    with ObjectSpec.open(bpf_objects["v2"], pin_root=pin_root).load() as obj:
        by_map = {m.map: m for m in obj.migrations}
        assert set(by_map) == {"lt_hash", "lt_rekeyed"}
        mh = by_map["lt_hash"]
        assert "value_size 96 -> 104" in mh.reason and "max_entries 1024 -> 2048" in mh.reason
        assert (mh.copied, mh.dropped) == (100, 0)
        mr = by_map["lt_rekeyed"]
        assert "key_size 4 -> 8" in mr.reason and (mr.copied, mr.dropped) == (0, 5)

        h = obj.maps["lt_hash"]
        assert (h.value_size, h.max_entries) == (104, 2048)
        typed = TypedMap(h, LT_KEY, LT_VALUE_V2)
        for i in (0, 57, 99):
            got = typed.lookup(LT_KEY.unpack(key(i)))
            assert got == {**LT_VALUE.unpack(value(i)), "added": 0}
        # compatible pinned maps are reused as they are
        assert obj.maps["lt_counter"].id == old_counter_id
        assert counter(obj, 0) == 42
    assert pins_in(pin_root) == ["lt_counter", "lt_hash", "lt_rekeyed"]  # no "-old-" pin left behind
    info = Map.open_pinned(os.path.join(pin_root, "lt_hash")).info()
    assert (info.value_size, info.max_entries) == (104, 2048)


def test_incompatible_map_without_migration_is_an_error(bpf_objects, pin_root):
    ObjectSpec.open(bpf_objects["base"], pin_root=pin_root).load().close()
    with pytest.raises(bpf.IncompatibleMap, match="value_size 96 -> 104"):
        ObjectSpec.open(bpf_objects["v2"], pin_root=pin_root).load(migrate=False)
    assert Map.open_pinned(os.path.join(pin_root, "lt_hash")).value_size == 96


def test_migration_to_smaller_capacity_copies_what_fits(bpf_objects, pin_root):
    with ObjectSpec.open(bpf_objects["base"], pin_root=pin_root).load() as obj:
        for i in range(100):
            obj.maps["lt_hash"].update(key(i), value(i))
    spec = ObjectSpec.open(bpf_objects["base"], pin_root=pin_root)
    spec.maps["lt_hash"].set_max_entries(40)
    with spec.load() as obj:
        (m,) = obj.migrations
        assert (m.map, m.copied, m.dropped) == ("lt_hash", 40, 60)
        _, vals, n = obj.maps["lt_hash"].dump()
        assert n == 40
        assert all(LT_VALUE.unpack(vals[i * 96 : (i + 1) * 96])["bytes"] % 100 == 0 for i in range(n))


def test_failed_load_restores_the_old_pin(bpf_objects, pin_root):
    with ObjectSpec.open(bpf_objects["base"], pin_root=pin_root).load() as obj:
        obj.maps["lt_hash"].update(key(7), value(7))
        old_id = obj.maps["lt_hash"].id
    with pytest.raises(bpf.VerifierError) as exc:
        ObjectSpec.open(bpf_objects["v2bad"], pin_root=pin_root).load()
    assert exc.value.program == "lt_bad"
    assert pins_in(pin_root) == ["lt_counter", "lt_hash", "lt_rekeyed"]
    with Map.open_pinned(os.path.join(pin_root, "lt_hash")) as h:
        assert h.id == old_id and h.value_size == 96
        assert h.lookup(key(7)) == value(7)


# --- map operations ------------------------------------------------------------------------------


@pytest.fixture
def private_obj(bpf_objects):
    with ObjectSpec.open(bpf_objects["base"]).private().load() as obj:
        yield obj


def test_single_element_api(private_obj):
    h = private_obj.maps["lt_hash"]
    assert h.lookup(key(1)) is None
    h.update(key(1), value(1), bpf.NOEXIST)
    with pytest.raises(bpf.BPFError) as exc:
        h.update(key(1), value(1), bpf.NOEXIST)
    assert exc.value.errno == errno.EEXIST
    with pytest.raises(bpf.KeyNotFound):
        h.update(key(2), value(2), bpf.EXIST)
    assert h.lookup(key(1)) == value(1)
    assert list(h.keys()) == [key(1)]
    assert h.delete(key(1)) and not h.delete(key(1))
    with pytest.raises(ValueError):
        h.lookup(b"short")
    info = h.info()
    assert (info.name, info.type_name, info.key_size, info.value_size) == ("lt_hash", "hash", 20, 96)
    assert bpf.map_info(h.id) == info
    # array maps: u32 index keys, every slot exists
    arr = private_obj.maps["lt_counter"]
    arr.update(3, (9).to_bytes(8, "little"))
    assert arr.lookup(3) == (9).to_bytes(8, "little")
    _, vals, n = arr.dump()
    assert n == 4 and np.frombuffer(vals, "<u8").tolist() == [0, 0, 0, 9]


def test_entries_are_key_value_pairs_of_one_snapshot(bpf_objects):
    """Map.entries(): every entry as (key bytes, value bytes), through the batch dump (hash), the
    iteration fallback (LPM trie) and per-CPU blobs; the snapshot outlives the map's fd."""
    spec = ObjectSpec.open(bpf_objects["base"]).private()
    with spec.load() as obj:
        h = obj.maps["lt_hash"]
        assert list(h.entries()) == []
        want = {key(i): value(i) for i in range(1, 301)}
        for k, v in want.items():
            h.update(k, v)
        pairs = list(h.entries())
        assert len(pairs) == 300 and all(type(k) is bytes and type(v) is bytes for k, v in pairs)
        assert dict(pairs) == want == dict(h.items())  # items(): one lookup per key, an independent path

        lpm = obj.maps["lt_lpm"]
        lpm_want = {LT_LPM_KEY.pack(prefixlen=p, addr=a): U32.pack(v=v)
                    for p, a, v in ((8, b"\x0a\x00\x00\x00", 1), (24, b"\x0a\x01\x02\x00", 3))}
        for k, v in lpm_want.items():
            lpm.update(k, v)
        assert dict(lpm.entries()) == lpm_want

        ph = obj.maps["lt_percpu_hash"]
        ncpus = possible_cpus()
        ph.update(7, [(c + 1).to_bytes(4, "little") for c in range(ncpus)])
        ((k, blob),) = ph.entries()
        assert k == (7).to_bytes(4, "little") and len(blob) == 8 * ncpus
        assert [int.from_bytes(blob[c * 8:c * 8 + 4], "little") for c in range(ncpus)] == list(range(1, ncpus + 1))

        snapshot = h.entries()   # read now, iterated after the fd is gone and the map changed
        h.delete(key(1))
        h.close()
    assert dict(snapshot) == want


def test_batch_update_dump_delete_100k(bpf_objects):
    n = 100_000
    spec = ObjectSpec.open(bpf_objects["base"]).private()
    spec.maps["lt_hash"].set_max_entries(131072)
    with spec.load() as obj:
        h = obj.maps["lt_hash"]
        keys = np.zeros(n, dtype=LT_KEY.dtype)
        keys["id"] = np.arange(n)
        vals = np.zeros(n, dtype=LT_VALUE.dtype)
        vals["packets"] = np.arange(n) * 3
        assert h.update_batch(keys.tobytes(), vals.tobytes(), n) == n

        kb, vb, count = h.dump()
        assert count == n and len(kb) == n * 20 and len(vb) == n * 96
        dk, dv = TypedMap(h, LT_KEY, LT_VALUE).dump()
        order = np.argsort(dk["id"])
        np.testing.assert_array_equal(dk["id"][order], np.arange(n))
        np.testing.assert_array_equal(dv["packets"][order], np.arange(n) * 3)

        # delete the even ids (plus one absent key, skipped), then check what is left
        even = keys[::2].tobytes() + key(10**9)
        assert h.delete_batch(even, n // 2 + 1) == n // 2
        dk, _ = TypedMap(h, LT_KEY, LT_VALUE).dump()
        assert len(dk) == n // 2 and set(dk["id"].tolist()) == set(range(1, n, 2))
        assert h.lookup(keys[1:2].tobytes()) is not None and h.lookup(keys[0:1].tobytes()) is None


def test_dump_one_million_entries(bpf_objects):
    """A full 1M-entry batch dump returns every key (its speed is a benchmark's business; the
    time is printed for the record)."""
    n = 1_000_000
    spec = ObjectSpec.open(bpf_objects["base"]).private()
    spec.maps["lt_hash"].set_max_entries(1 << 20)
    with spec.load() as obj:
        h = obj.maps["lt_hash"]
        keys = np.zeros(n, dtype=LT_KEY.dtype)
        keys["id"] = np.arange(n)
        h.update_batch(keys.tobytes(), np.zeros(n * 96, np.uint8), n)
        t0 = time.perf_counter()
        kb, _, count = h.dump()
        elapsed = time.perf_counter() - t0
        assert count == n
        ids = np.frombuffer(bytes(kb), dtype=LT_KEY.dtype)["id"]
        assert len(np.unique(ids)) == n and ids.min() == 0 and ids.max() == n - 1
        print(f"\n1M-entry hash (20 B keys, 96 B values) dump: {elapsed:.3f}s")


def test_lpm_trie_lookup(private_obj):
    lpm = TypedMap(private_obj.maps["lt_lpm"], LT_LPM_KEY, U32)
    for plen, addr, v in ((8, b"\x0a\x00\x00\x00", 1), (16, b"\x0a\x01\x00\x00", 2), (24, b"\x0a\x01\x02\x00", 3)):
        lpm.update({"prefixlen": plen, "addr": addr}, {"v": v})
    assert lpm.lookup({"prefixlen": 32, "addr": b"\x0a\x01\x02\x03"}) == {"v": 3}
    assert lpm.lookup({"prefixlen": 32, "addr": b"\x0a\x01\x09\x09"}) == {"v": 2}
    assert lpm.lookup({"prefixlen": 32, "addr": b"\x0b\x00\x00\x01"}) is None
    keys, vals = lpm.dump()  # LPM tries have no batch ops: dump falls back to iteration
    assert sorted(zip(keys["prefixlen"].tolist(), vals["v"].tolist())) == [(8, 1), (16, 2), (24, 3)]
    prog = private_obj.programs["lt_lpm_lookup"]
    assert bpf.test_run(prog, packet(b"\x0a\x01\x02\x03")).retval == 3
    assert bpf.test_run(prog, packet(b"\x0a\x07\x00\x01")).retval == 1
    assert lpm.delete({"prefixlen": 24, "addr": b"\x0a\x01\x02\x00"})
    assert bpf.test_run(prog, packet(b"\x0a\x01\x02\x03")).retval == 2


def test_percpu_values(private_obj):
    pa = private_obj.maps["lt_percpu"]
    ncpus = possible_cpus()
    assert pa.ncpus == ncpus
    assert pa.percpu and pa.percpu_stride == 8 and pa.value_blob_size == 8 * ncpus
    res = bpf.test_run(private_obj.programs["lt_emit"], packet(size=80), repeat=5)
    assert res.retval == 0
    per_cpu = [PCPU_VALUE.unpack(v) for v in pa.lookup_percpu(0)]
    assert len(per_cpu) == ncpus
    assert sum(v["runs"] for v in per_cpu) == 5
    assert {v["last_len"] for v in per_cpu if v["runs"]} == {80}
    keys, vals = TypedMap(pa, U32, PCPU_VALUE).dump()
    assert vals.shape == (2, ncpus) and int(vals["runs"][keys["v"] == 0].sum()) == 5

    # 4-byte values are padded to 8 per CPU
    ph = private_obj.maps["lt_percpu_hash"]
    assert ph.percpu_stride == 8
    ph.update(7, [(c + 1).to_bytes(4, "little") for c in range(ncpus)])
    assert ph.lookup_percpu(7) == [(c + 1).to_bytes(4, "little") for c in range(ncpus)]
    kb, vb, n = ph.dump()
    assert n == 1 and len(vb) == 8 * ncpus
    typed = TypedMap(ph, U32, U32)
    assert typed.lookup({"v": 7}) == [{"v": c + 1} for c in range(ncpus)]
    with pytest.raises(ValueError):
        ph.update(8, b"\1\0\0\0")  # one CPU's value is not a per-CPU blob


def test_ring_buffer_events_from_test_run(private_obj):
    events: list[bytes] = []
    rb = bpf.RingBuffer(private_obj.maps["lt_events"], events.append)
    try:
        bpf.test_run(private_obj.programs["lt_emit"], packet(size=72), repeat=3)
        assert rb.poll(1000) == 3
        decoded = [struct.unpack("<IIQ", e) for e in events]
        assert decoded == [(0x1ACE, 72, 0), (0x1ACE, 72, 1), (0x1ACE, 72, 2)]
        assert rb.consume() == 0
        assert rb.fileno() >= 0

        def boom(data: bytes) -> None:
            raise RuntimeError("callback failed")

        rb2 = bpf.RingBuffer(private_obj.maps["lt_events"], boom)
        bpf.test_run(private_obj.programs["lt_emit"], packet())
        with pytest.raises(RuntimeError, match="callback failed"):
            rb2.consume()
        rb2.close()
    finally:
        rb.close()
    with pytest.raises(bpf.NotSupported):
        private_obj.maps["lt_events"].dump()



def test_ring_reader_reads_records_in_bulk_across_the_wrap(private_obj):
    """The bulk reader gives what libbpf's reader gives, in order, also when records wrap around
    the end of the ring (16 KiB: 682 records of 16 + 8 bytes), and skips records of another size."""
    events = private_obj.maps["lt_events"]
    with bpf.RingReader(events) as rr:
        rr.read(16)                                   # whatever earlier tests left
        assert not rr.wait(0)
        first = bpf.test_run(private_obj.programs["lt_emit"], packet(size=72), repeat=1)
        assert first.retval == 0 and rr.wait(1000)
        data, others = rr.read(16)
        (magic, ln, seq0), = struct.iter_unpack("<IIQ", data)
        assert (magic, ln, others) == (0x1ACE, 72, 0)
        seqs = []
        for _ in range(4):                            # 2,000 records through a 682-record ring
            bpf.test_run(private_obj.programs["lt_emit"], packet(size=72), repeat=500)
            data, others = rr.read(16)
            assert len(data) == 500 * 16 and others == 0
            seqs += [s for _m, _l, s in struct.iter_unpack("<IIQ", data)]
        assert seqs == list(range(seq0 + 1, seq0 + 2001))
        assert rr.read(16) == (b"", 0) and not rr.wait(0)
        bpf.test_run(private_obj.programs["lt_emit"], packet(size=72), repeat=3)
        assert rr.read(8) == (b"", 3)                 # a reader of other records: counted, skipped


def test_ring_reader_wait_ends_at_once_when_woken(private_obj):
    """An idle reader waits long; wake() from another thread ends the wait now (False: no records),
    and a wait with records waiting still says so after a wake."""
    with bpf.RingReader(private_obj.maps["lt_events"]) as rr:
        rr.read(16)
        threading.Timer(0.1, rr.wake).start()
        t0 = time.monotonic()
        assert rr.wait(10_000) is False
        assert time.monotonic() - t0 < 5
        assert rr.wait(0) is False                    # the wake-up was consumed
        rr.wake()
        bpf.test_run(private_obj.programs["lt_emit"], packet(size=72), repeat=1)
        assert rr.wait(1000) is True
        assert len(rr.read(16)[0]) == 16

# --- load errors ---------------------------------------------------------------------------------


def test_verifier_error_carries_the_log(bpf_objects):
    with pytest.raises(bpf.VerifierError) as exc:
        ObjectSpec.open(bpf_objects["bad"]).private().load()
    err = exc.value
    assert err.program == "lt_bad"
    assert "invalid access to packet" in err.log
    assert "lt_bad" in str(err) and isinstance(err, bpf.BPFError) and isinstance(err, OSError)


def test_open_error_is_typed(tmp_path):
    junk = tmp_path / "junk.o"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(bpf.LoadError) as exc:
        ObjectSpec.open(junk)
    assert "junk.o" in str(exc.value)
    assert "not a proper ELF object" in str(exc.value)  # libbpf's own message, captured
    with pytest.raises(bpf.BPFError):
        Map.open_pinned("/sys/fs/bpf/does-not-exist-lace")


# --- attachment ----------------------------------------------------------------------------------


def test_tcx_counts_real_traffic_and_is_queryable(private_obj, veth):
    prog = private_obj.programs["lt_count"]
    link = bpf.attach_tcx(prog, veth.a_ifindex, "ingress", netns=veth.a)
    try:
        assert bpf.query_tcx(veth.a_ifindex, "ingress", netns=veth.a) == [prog.id]
        assert bpf.query_tcx(veth.a_ifindex, "egress", netns=veth.a) == []
        full = bpf.query_tcx_full(veth.a_ifindex, "ingress", netns=veth.a)
        assert full.prog_ids == [prog.id] and full.link_ids == [link.id]
        info = link.info()
        assert (info.type_name, info.prog_id, info.ifindex, info.direction) == (
            "tcx", prog.id, veth.a_ifindex, "ingress",
        )
        assert any(li.id == link.id for li in bpf.link_info_all())
        assert [lk["id"] for lk in links_of({prog.id})] == [link.id]  # bpftool agrees
        pinfo = bpf.prog_info(prog.id)
        assert pinfo.name == "lt_count" and pinfo.tag == prog.tag and pinfo.loaded_at <= time.time()

        send_udp(veth, 20)
        assert wait_for(lambda: counter(private_obj, 0) >= 20), counter(private_obj, 0)
    finally:
        link.close()  # the last fd of an unpinned link: detaches
    assert bpf.query_tcx(veth.a_ifindex, "ingress", netns=veth.a) == []
    assert links_of({prog.id}) == []
    before = counter(private_obj, 0)
    send_udp(veth, 5)
    time.sleep(0.2)
    assert counter(private_obj, 0) == before


def test_link_pin_update_detach(private_obj, veth, pin_root):
    p1, p2 = private_obj.programs["lt_count"], private_obj.programs["lt_count_v2"]
    pin = os.path.join(pin_root, "a0_ingress")
    link = bpf.attach_tcx(p1, veth.a_ifindex, "ingress", netns=veth.a, pin_path=pin)
    assert isinstance(link, bpf.Link) and link.pin_path == pin and os.path.exists(pin)
    link.close()  # pinned: stays attached without any fd
    assert bpf.query_tcx(veth.a_ifindex, "ingress", netns=veth.a) == [p1.id]

    # a restarted agent replaces the program behind the pinned link
    with bpf.Link.open_pinned(pin) as again:
        again.update(p2)
    assert bpf.query_tcx(veth.a_ifindex, "ingress", netns=veth.a) == [p2.id]
    send_udp(veth, 10)
    assert wait_for(lambda: counter(private_obj, 1) >= 10)
    assert counter(private_obj, 0) == 0

    again = bpf.Link.open_pinned(pin)
    link_id = again.id
    again.detach()
    assert bpf.query_tcx(veth.a_ifindex, "ingress", netns=veth.a) == []
    again.unpin()
    again.close()
    assert not os.path.exists(pin) and pins_in(pin_root) == []
    assert all(lk["id"] != link_id for lk in (bpftool_json("link", "show") or []))
    assert links_of({p1.id, p2.id}) == []


def test_tc_filter_query_finds_a_filter_tc_attached(veth):
    """lace attaches through tcx only; a classic filter another tool attached is still found."""
    filt = bpf.TcFilter(veth.a_ifindex, "ingress", handle=1, priority=1, netns=veth.a)
    assert filt.query() is None
    run("tc", "-n", veth.a, "qdisc", "add", "dev", "a0", "clsact")
    try:
        run("tc", "-n", veth.a, "filter", "add", "dev", "a0", "ingress", "pref", "1", "handle", "1",
            "bpf", "direct-action", "obj", os.path.join(REPO, "build/bpf/test/bench_pass.o"), "sec", "tc")
        shown = run("tc", "-n", veth.a, "filter", "show", "dev", "a0", "ingress").stdout
        prog_id = int(shown.split(" id ")[1].split()[0])  # tc is the oracle
        assert filt.query() == prog_id
        assert bpf.TcFilter(veth.a_ifindex, "egress", 1, 1, netns=veth.a).query() is None
    finally:
        run("tc", "-n", veth.a, "qdisc", "del", "dev", "a0", "clsact")
    assert filt.query() is None


def test_attach_in_namespace_does_not_move_the_caller(private_obj, veth):
    before = os.readlink("/proc/thread-self/ns/net")
    with pytest.raises(bpf.BPFError):
        bpf.attach_tcx(private_obj.programs["lt_count"], 9999, "ingress", netns=veth.a)
    assert os.readlink("/proc/thread-self/ns/net") == before
    with pytest.raises(ValueError):
        bpf.attach_tcx(private_obj.programs["lt_count"], veth.a_ifindex, "sideways", netns=veth.a)
