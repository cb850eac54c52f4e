"""lace.bpf.layout: offsets follow C alignment, records round-trip, batch decode matches pack."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from lace.bpf.layout import Layout

# struct example { __u8 proto; __be16 port; __u32 addr; __u64 bytes; __u8 mac[6]; } -> 32 bytes
EXAMPLE = Layout(
    "example",
    [("proto", "u8"), ("port", "be16"), ("addr", "u32"), ("bytes", "u64"), ("mac", "bytes:6")],
)


def test_offsets_follow_c_alignment():
    offs = {f.name: (f.offset, f.size) for f in EXAMPLE.fields}
    assert offs == {"proto": (0, 1), "port": (2, 2), "addr": (4, 4), "bytes": (8, 8), "mac": (16, 6)}
    assert EXAMPLE.size == 24  # tail padded to the 8-byte alignment of `bytes`
    assert EXAMPLE.dtype.itemsize == EXAMPLE.size


def test_explicit_padding_and_packed():
    lay = Layout("padded", [("a", "u8"), ("_pad", "pad:3"), ("b", "u32")])
    assert [(f.name, f.offset) for f in lay.fields] == [("a", 0), ("_pad", 1), ("b", 4)]
    assert lay.size == 8 and lay.names == ("a", "b")
    packed = Layout("packed", [("a", "u8"), ("b", "u32")], packed=True)
    assert packed.size == 5 and packed.field("b").offset == 1
    assert packed.pack(a=1, b=2) == b"\x01\x02\x00\x00\x00"


def test_pack_unpack_roundtrip():
    rec = {"proto": 6, "port": 443, "addr": 0x0A000001, "bytes": 2**40 + 5, "mac": b"\x02\x00\x00\x00\x00\x01"}
    raw = EXAMPLE.pack(rec)
    assert len(raw) == EXAMPLE.size
    assert EXAMPLE.unpack(raw) == rec
    assert EXAMPLE.pack(**rec) == raw


def test_big_endian_fields_are_network_order():
    lay = Layout("be", [("port", "be16"), ("_pad", "pad:2"), ("addr", "be32"), ("host", "u32")])
    raw = lay.pack(port=0x1234, addr=0x0A000001, host=0x0A000001)
    assert raw[0:2] == b"\x12\x34"
    assert raw[4:8] == b"\x0a\x00\x00\x01"
    assert raw[8:12] == b"\x01\x00\x00\x0a"  # host order (little-endian)
    assert lay.unpack(raw) == {"port": 0x1234, "addr": 0x0A000001, "host": 0x0A000001}
    arr = lay.decode_many(raw, 1)
    assert int(arr["port"][0]) == 0x1234 and int(arr["addr"][0]) == 0x0A000001


def test_missing_fields_are_zero_and_unknown_fields_fail():
    assert EXAMPLE.unpack(EXAMPLE.pack(proto=17))["bytes"] == 0
    assert EXAMPLE.unpack(EXAMPLE.pack())["mac"] == bytes(6)
    with pytest.raises(KeyError):
        EXAMPLE.pack(nope=1)


def test_padding_bytes_are_zero():
    lay = Layout("gap", [("a", "u8"), ("b", "u64")])
    raw = lay.pack(a=0xFF, b=0xFFFFFFFFFFFFFFFF)
    assert raw[1:8] == bytes(7)


def test_decode_many_matches_pack():
    recs = [
        {"proto": i % 256, "port": 1000 + i, "addr": i * 7, "bytes": i * 1000, "mac": bytes([i % 256]) * 6}
        for i in range(500)
    ]
    buf = EXAMPLE.encode_many(recs)
    assert len(buf) == 500 * EXAMPLE.size
    arr = EXAMPLE.decode_many(buf, 500)
    assert arr.shape == (500,)
    np.testing.assert_array_equal(arr["port"], np.arange(1000, 1500))
    np.testing.assert_array_equal(arr["bytes"], np.arange(500) * 1000)
    assert bytes(arr["mac"][3]) == b"\x03" * 6
    # decoding a prefix of a larger buffer (as a batch dump hands it over)
    assert EXAMPLE.decode_many(memoryview(buf), 10)["addr"].tolist() == [i * 7 for i in range(10)]
    for i in (0, 123, 499):
        assert EXAMPLE.unpack(buf[i * EXAMPLE.size : (i + 1) * EXAMPLE.size]) == recs[i]


def test_lpm_key_layout():
    # LPM trie keys: a u32 prefixlen first, then the address bytes in network order
    key = Layout("lpm_v4_key", [("prefixlen", "u32"), ("addr", "bytes:4")])
    raw = key.pack(prefixlen=24, addr=bytes([10, 1, 2, 0]))
    assert raw == struct.pack("<I", 24) + b"\x0a\x01\x02\x00"
    assert key.size == 8


def test_unknown_kinds_fail():
    with pytest.raises(ValueError):
        Layout("bad", [("x", "u24")])
    with pytest.raises(ValueError):
        Layout("bad", [("x", "float:4")])
