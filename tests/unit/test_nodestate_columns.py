"""Vectorised formatting (lace.textcols) against the reference renderers."""

from __future__ import annotations

import ipaddress

import numpy as np
import orjson
import pytest

from lace import textcols as C


def test_ipv4_matches_ipaddress() -> None:
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (5000, 4), dtype=np.uint8)
    raw[0] = 0
    raw[1] = 255
    got = C.ipv4(raw).tolist()
    assert got == [str(ipaddress.IPv4Address(r.tobytes())) for r in raw]


@pytest.mark.parametrize("text", ["::", "::1", "1::", "2001:db8::1", "fe80::1:0:0:1", "1:0:0:1:0:0:0:1",
                                  "1:0:1:0:1:0:1:0", "0:0:1::", "1:2:3:4:5:6:7:8", "::ffff:a00:1"])
def test_ipv6_known(text: str) -> None:
    raw = np.frombuffer(ipaddress.IPv6Address(text).packed, dtype=np.uint8).reshape(1, 16)
    assert C.ipv6(raw).tolist() == [str(ipaddress.IPv6Address(text))]


def test_ipv6_random_with_zero_runs() -> None:
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (20000, 16), dtype=np.uint8)
    groups = raw.reshape(-1, 8, 2)
    groups[rng.random((20000, 8)) < 0.5] = 0
    got = C.ipv6(raw).tolist()
    assert got == [str(ipaddress.IPv6Address(r.tobytes())) for r in raw]


def test_digits_and_signed() -> None:
    v = np.array([0, 7, 10, 99, 2**32 - 1, 2**32, 2**64 - 1], dtype=np.uint64)
    assert [bytes(r).strip(b"\0").decode() for r in C.digits(v)] == [str(int(x)) for x in v]
    s = np.array([-1, 0, 5, -12345], dtype=np.int64)
    assert [bytes(r).strip(b"\0").decode() for r in C.signed_digits(s)] == ["-1", "0", "5", "-12345"]


def test_json_rows_are_valid_json() -> None:
    n = 300
    rows = C.Rows(n)
    rows.lit('{"a":')
    rows.number(np.arange(n, dtype=np.uint64) * 1000)
    rows.key("ip")
    rows.string(C.ipv4(np.full((n, 4), 10, np.uint8)), null=np.arange(n) % 3 == 0)
    rows.key("t")
    rows.tokens(np.arange(n) % 2, ['"x"', "null"])
    rows.key("neg")
    rows.number(np.arange(n, dtype=np.int64) - 100)
    rows.lit("}")
    doc = orjson.loads(b"[" + bytes(rows.build()) + b"]")
    assert len(doc) == n
    assert doc[4] == {"a": 4000, "ip": "10.10.10.10", "t": "x", "neg": -96}
    assert doc[3]["ip"] is None and doc[1]["t"] is None
