"""``node ct list -o json`` (lace.cli.node.ct_json) against a straightforward per-row rendering.

The writer assembles rows from fixed-width slots a chunk at a time, with single-valued columns
folded into literals and, for large listings, two processes writing in turn; the reference here
builds one dict per entry with ``ipaddress`` and the resolver and lets orjson render it.  Both
must parse to the same document, key order included, on random tables: every chunk boundary,
unknown enum values, NAT and no NAT, expired entries, IDs with and without names, many distinct
IDs (the numeric fallback) and one distinct ID (the literal).
"""

from __future__ import annotations

import io
import ipaddress
import os
import tempfile

import numpy as np
import orjson
import pytest

from lace import textcols as C
from lace.cli.node import ct_json
from lace.cli.node.ct_dump import CtDump, take
from lace.cli.node.resolve import NumericResolver, Resolver
from lace.datapath.common import Proto, enum_label, flag_labels
from lace.datapath.conntrack import CT4_KEY, CT6_KEY, CT_ENTRY, CtFlag, CtState
from lace.datapath.delivery import DeliveryKind

NOW = 7_000_000 * 10**9
NAT = CtFlag.DNAT | CtFlag.SNAT | CtFlag.SERVICE | CtFlag.MASQ


def _table(name: str, n: int, seed: int, *, segments: int = 40, one_network: bool = False) -> CtDump:
    rng = np.random.default_rng(seed)
    fam = 6 if name.endswith("v6") else 4
    width = 16 if fam == 6 else 4
    keys = np.zeros(n, (CT6_KEY if fam == 6 else CT4_KEY).dtype)
    keys["network"] = 2 if one_network else rng.choice(np.array([1, 2, 3, 70000], np.uint32), n)
    for f in ("saddr", "daddr"):
        raw = rng.integers(0, 256, (n, width), dtype=np.uint8)
        if fam == 6:  # zero runs of every length, as RFC 5952 compresses them
            groups = raw.reshape(n, 8, 2)
            groups[rng.random((n, 8)) < 0.4] = 0
        raw[: n // 4] = np.frombuffer(ipaddress.ip_address("10.1.0.7" if fam == 4 else "fd00::7").packed, np.uint8)
        keys[f] = raw.view(f"V{width}").ravel()
    keys["sport"] = rng.integers(0, 65536, n)
    keys["dport"] = rng.choice(np.array([53, 80, 65535], np.uint16), n)
    keys["proto"] = {"tcp": 6, "udp": 17, "icmp": 1 if fam == 4 else 58}[name.split("-")[1]]
    vals = np.zeros(n, CT_ENTRY.dtype)
    vals["created_ns"] = NOW - rng.integers(-5, 10**5, n).astype(np.int64) * 10**8
    vals["last_seen_ns"] = NOW - rng.integers(-5, 10**4, n).astype(np.int64) * 10**8
    vals["expires_ns"] = NOW + rng.integers(-10**12, 10**13, n)
    for f, top in (("packets_fwd", 10**6), ("bytes_fwd", 10**12), ("packets_rev", 10), ("bytes_rev", 2**63)):
        vals[f] = rng.integers(0, top, n, dtype=np.uint64)
    vals["src_segment"] = 256 + rng.integers(0, segments, n)
    vals["dst_segment"] = rng.choice(np.array([1, 2, 300, 301, 4000000], np.uint32), n)
    vals["dst_network"] = keys["network"]
    vals["rev_nat_id"] = rng.choice(np.array([0, 7, 9], np.uint32), n)
    vals["state"] = rng.choice(np.array([3, 8, 200], np.uint8), n)  # 200: not a state
    vals["flags"] = rng.integers(0, 256, n)
    vals["delivery"] = rng.integers(0, 6, n)
    vals["nat_addr"] = rng.integers(0, 256, (n, 16), dtype=np.uint8).view("V16").ravel()
    vals["nat_port"] = rng.integers(0, 65536, n)
    return CtDump(name, fam, keys, vals, 2 * n)


def _resolver() -> Resolver:
    seg = [{"status": {"id": 256 + i}, "spec": {"namespace": "ns", "labels": {"app": f"a{i}"}, "network": "blue"}}
           for i in range(0, 40, 3)]
    return Resolver.from_objects({
        "networks": [{"metadata": {"name": "default"}, "status": {"id": 1}},
                     {"metadata": {"name": "blue"}, "status": {"id": 2}}],
        "segments": seg,
        "ipleases": [{"spec": {"ip": "10.1.0.7", "pod": "ns/web-1", "network": "blue"}},
                     {"spec": {"ip": "fd00::7", "pod": "ns/web-6", "network": "default"}}],
        "services": [{"metadata": {"namespace": "ns", "name": "web"}, "status": {"id": 7}, "spec": {}}],
        "pods": [], "networkpolicies": []})


def _addr(raw: bytes, fam: int) -> str:
    return str(ipaddress.ip_address(raw[:4] if fam == 4 else raw))


def _seconds_toward_zero(d: int) -> int:
    return d // 10**9 if d >= 0 else -((-d) // 10**9)


def reference(t: CtDump, res: NumericResolver) -> list[dict]:
    """Every entry as a dict, field by field, the slow and obvious way."""
    out = []
    named = not res.numeric
    for k, v in zip(t.keys.tolist(), t.vals.tolist()):
        k = dict(zip(t.keys.dtype.names, k))
        v = dict(zip(t.vals.dtype.names, v))
        net = int(k["network"])
        row: dict = {"table": t.name, "network": net}
        if named:
            row["network_name"] = res.network(net)
        row["proto"] = enum_label(Proto, k["proto"])
        sa, da = _addr(k["saddr"], t.family), _addr(k["daddr"], t.family)
        row.update(saddr=sa, sport=k["sport"], daddr=da, dport=k["dport"])
        if named:
            row.update(src_pod=res.pod_for_ip(net, sa), dst_pod=res.pod_for_ip(net, da))
        nat = bool(v["flags"] & NAT)
        row.update(state=enum_label(CtState, v["state"]), flags=flag_labels(CtFlag, v["flags"]),
                   delivery=enum_label(DeliveryKind, v["delivery"]),
                   nat_addr=_addr(v["nat_addr"], t.family) if nat else None, nat_port=v["nat_port"] if nat else None)
        for f in ("packets_fwd", "bytes_fwd", "packets_rev", "bytes_rev"):
            row[f] = v[f]
        for f in ("src_segment", "dst_segment"):
            row[f] = v[f]
            if named:
                row[f + "_name"] = res.segment(v[f])
        row["dst_network"] = v["dst_network"]
        row["rev_nat_id"] = v["rev_nat_id"]
        if named:
            row["service"] = res.service(v["rev_nat_id"]) if v["rev_nat_id"] else None
        row.update(age_s=max((NOW - v["created_ns"]) // 10**9, 0), idle_s=max((NOW - v["last_seen_ns"]) // 10**9, 0),
                   expires_in_s=_seconds_toward_zero(v["expires_ns"] - NOW), expired=v["expires_ns"] <= NOW)
        out.append(row)
    return out


class _Bytes(io.TextIOWrapper):
    """stdout as the CLI has it, over memory (no file descriptor: the one-process path)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), write_through=True)

    def value(self) -> bytes:
        self.flush()
        return self.buffer.getvalue()  # type: ignore[attr-defined]


def _document(tables: list[CtDump], shown: list[CtDump], res: NumericResolver, to_fd: bool) -> bytes:
    total, n_shown = sum(t.count for t in tables), sum(t.count for t in shown)
    if not to_fd:
        out = _Bytes()
        ct_json.write(out, "n1", tables, shown, total, n_shown, NOW, res)
        return out.value()
    with tempfile.TemporaryFile() as f:
        out = io.TextIOWrapper(f, write_through=True)
        ct_json.write(out, "n1", tables, shown, total, n_shown, NOW, res)
        out.flush()
        f.seek(0)
        data = f.read()
        out.detach()
    return data


def _check(doc: bytes, tables: list[CtDump], shown: list[CtDump], res: NumericResolver) -> None:
    got = orjson.loads(doc)
    assert got["numeric"] == res.numeric and got["count"] == sum(t.count for t in tables)
    assert got["tables"] == [{"table": t.name, "count": t.count, "capacity": t.capacity} for t in tables]
    want = [row for t in shown for row in reference(t, res)]
    assert len(got["entries"]) == len(want)
    for i, (g, w) in enumerate(zip(got["entries"], want)):
        assert list(g.items()) == list(w.items()), f"entry {i}"
    # the padding is only spaces between tokens; one entry per line
    assert doc.count(b"\n") == len(want) + 2


TABLES = [
    ("ct-tcp-v6", 4096 + 17, {}),               # a full chunk and a bit
    ("ct-udp-v6", 300, {"one_network": True}),  # one network: a literal slot
    ("ct-icmp-v6", 0, {}),
    ("ct-tcp-v4", 9000, {"segments": 5000}),    # > 4096 distinct segments: numbers and names by code
    ("ct-udp-v4", 1, {}),
    ("ct-icmp-v4", 2500, {}),
]


@pytest.fixture(scope="module")
def tables() -> list[CtDump]:
    return [_table(name, n, seed, **kw) for seed, (name, n, kw) in enumerate(TABLES)]


@pytest.mark.parametrize("numeric", [False, True])
def test_matches_per_row_rendering(tables: list[CtDump], numeric: bool) -> None:
    res = NumericResolver() if numeric else _resolver()
    _check(_document(tables, tables, res, to_fd=False), tables, tables, res)


def test_limit_matches(tables: list[CtDump]) -> None:
    res = _resolver()
    shown = [take(t, min(t.count, 3)) for t in tables]
    doc = orjson.loads(_document(tables, shown, res, to_fd=False))
    assert doc["truncated"] is True and doc["shown"] == sum(t.count for t in shown)
    _check(_document(tables, shown, res, to_fd=False), tables, shown, res)


def test_two_processes_write_the_same_bytes(tables: list[CtDump], monkeypatch: pytest.MonkeyPatch) -> None:
    """To a file descriptor a large listing is rendered by two processes taking turns: the
    bytes are exactly those of one process."""
    res = _resolver()
    one = _document(tables, tables, res, to_fd=False)
    monkeypatch.setattr(ct_json, "PARALLEL_ROWS", 1)
    two = _document(tables, tables, res, to_fd=True)
    assert two == one


def test_ordered_writer_reports_a_failed_worker() -> None:
    """A job that fails in the forked worker is an error in the caller, not a truncated document
    passed off as whole."""
    def bad() -> bytes:
        raise ValueError("boom")

    jobs = [lambda: b"a", bad, lambda: b"c", lambda: b"d"]
    with tempfile.TemporaryFile() as f:
        with pytest.raises(C.WorkerFailed, match="ValueError: boom"):
            C.write_ordered(f.fileno(), jobs, workers=2)
        f.seek(0)
        assert f.read() == b"a"


def test_ordered_writer_order_and_closed_output() -> None:
    jobs = [(lambda i=i: f"{i},".encode()) for i in range(25)]
    with tempfile.TemporaryFile() as f:
        C.write_ordered(f.fileno(), jobs, workers=3)
        f.seek(0)
        assert f.read() == b"".join(f"{i},".encode() for i in range(25))
    r, w = os.pipe()
    os.close(r)  # the reader went away (| head)
    try:
        with pytest.raises(BrokenPipeError):
            C.write_ordered(w, jobs, workers=2)
    finally:
        os.close(w)


def test_addresses_taken_by_code_match(tables: list[CtDump], monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns of few distinct addresses are formatted once per address and taken by code (here
    every table is looked at, not only large ones): the same document."""
    monkeypatch.setattr(C.Address, "MIN_ROWS", 0)
    res = _resolver()
    _check(_document(tables, tables, res, to_fd=False), tables, tables, res)


@pytest.mark.parametrize("family", [4, 6])
def test_address_not_among_the_distinct_ones_is_still_right(family: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk holding an address the column's distinct set lacks (the set was taken, then the
    column changed; or a hash collision) is built as text instead."""
    monkeypatch.setattr(C.Address, "MIN_ROWS", 0)
    width = 4 if family == 4 else 16
    raw = np.tile(np.frombuffer(ipaddress.ip_address("10.0.0.1" if family == 4 else "fd00::1").packed, np.uint8),
                  (50, 1))
    src = raw.view(">u4")[:, 0] if family == 4 else raw.view(">u2")
    null = np.arange(50) % 7 == 0
    slot = C.Address(src, family, null)
    assert slot.table is not None  # one distinct address: taken by code
    raw[10] = np.frombuffer(ipaddress.ip_address("10.9.8.7" if family == 4 else "2001:db8::77").packed, np.uint8)
    buf = np.zeros((50, slot.width), np.uint8)
    slot.fill(buf, 0, 0, 50)
    got = [bytes(r).decode().strip() for r in buf]
    want = ["null" if null[i] else '"' + str(ipaddress.ip_address(raw[i].tobytes()[:width])) + '"' for i in range(50)]
    assert got == want
