"""``node ct list -o json``: one document whose entries are written by :mod:`lace.textcols` a chunk
of rows at a time, without a Python object per entry (a node can hold a million).

Each row is one JSON object of a fixed layout; enum columns are pre-rendered tokens, IDs carry
their names (``"network":2,"network_name":"blue"``) resolved once per distinct value, pods are
matched to addresses by a sorted search over the store's known pod addresses.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import orjson

from lace import textcols as C
from lace.cli.node.resolve import NumericResolver
from lace.datapath.common import Proto, enum_label, flag_labels
from lace.datapath.conntrack import CtFlag, CtState
from lace.datapath.delivery import DeliveryKind

if TYPE_CHECKING:
    from lace.cli.node.ct_dump import CtDump


# ---- tokens for enum columns -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _enum_tokens(cls: Any) -> list[str]:
    out = []
    for i in range(256):
        lab = enum_label(cls, i)
        out.append(orjson.dumps(lab).decode())
    return out


@functools.lru_cache(maxsize=None)
def _flags_tokens() -> list[str]:
    return [orjson.dumps(flag_labels(CtFlag, i)).decode() for i in range(256)]


def _proto_tokens() -> list[str]:
    return _enum_tokens(Proto)


def _named_codes(values: np.ndarray, name_of: Callable[[int], str | None]) -> tuple[np.ndarray, list[str]]:
    """Resolve each distinct value once: (code per row, JSON tokens by code)."""
    uniq, inv = np.unique(values, return_inverse=True)
    return inv, [orjson.dumps(name_of(int(u))).decode() for u in uniq]


# ---- one pass over a table for every column's extremes and distinct values --------------------

#: rows per block of :func:`_scan`: a block of entries (~0.8 MB) stays in the L2 cache while every
#: statistic reads it; a whole-column pass per statistic streams the whole table from memory each
#: time (the fields are strided), ~4x slower over a million entries
BLOCK = C.BLOCK
#: more distinct values than this and an ID column is written as numbers (see C.categorize)
DISTINCT_LIMIT = 4096

_MAX_KEYS = ("sport", "dport")
_MAX_VALS = ("nat_port", "packets_fwd", "bytes_fwd", "packets_rev", "bytes_rev", "dst_network")
_DISTINCT_KEYS = ("network",)
_DISTINCT_VALS = ("src_segment", "dst_segment", "rev_nat_id")
_ENUM_KEYS = ("proto",)
_ENUM_VALS = ("state", "flags", "delivery")
_EXTREMES = ("created_ns", "last_seen_ns", "expires_ns")
_NAT_FLAGS = np.uint8(CtFlag.DNAT | CtFlag.SNAT | CtFlag.SERVICE | CtFlag.MASQ)


@dataclass
class _Stats:
    """What the row layout needs to know about a whole table (slot widths, token tables)."""

    hi: dict[str, int]                          # the largest value of a number column
    distinct: dict[str, np.ndarray | None]      # sorted distinct IDs (None: more than DISTINCT_LIMIT)
    used: dict[str, np.ndarray]                 # which of the 256 codes of an enum column occur
    extremes: dict[str, tuple[int, int]]        # (min, max) of a timestamp column
    no_nat: np.ndarray                          # per row: no NAT address/port to show


def _scan(t: CtDump) -> _Stats:
    """Every statistic of :class:`_Stats` in one pass over blocks of BLOCK rows."""
    k, v, n = t.keys, t.vals, t.count
    hi = dict.fromkeys(_MAX_KEYS + _MAX_VALS, 0)
    seen: dict[str, set[int] | None] = {f: set() for f in _DISTINCT_KEYS + _DISTINCT_VALS}
    counts = {f: np.zeros(256, np.int64) for f in _ENUM_KEYS + _ENUM_VALS}
    lo_hi = {f: [None, None] for f in _EXTREMES}
    no_nat = np.empty(n, bool)
    for a in range(0, n, BLOCK):
        kb, vb = k[a:a + BLOCK], v[a:a + BLOCK]
        for arr, fields in ((kb, _MAX_KEYS), (vb, _MAX_VALS)):
            for f in fields:
                hi[f] = max(hi[f], int(arr[f].max()))
        for arr, fields in ((kb, _DISTINCT_KEYS), (vb, _DISTINCT_VALS)):
            for f in fields:
                got = seen[f]
                if got is not None:
                    got.update(np.unique(arr[f]).tolist())
                    if len(got) > DISTINCT_LIMIT:
                        seen[f] = None
        for arr, fields in ((kb, _ENUM_KEYS), (vb, _ENUM_VALS)):
            for f in fields:
                counts[f] += np.bincount(arr[f], minlength=256)
        for f in _EXTREMES:
            col, ext = vb[f], lo_hi[f]
            lo, top = int(col.min()), int(col.max())
            ext[0] = lo if ext[0] is None else min(ext[0], lo)
            ext[1] = top if ext[1] is None else max(ext[1], top)
        np.equal(vb["flags"] & _NAT_FLAGS, 0, out=no_nat[a:a + BLOCK])
    return _Stats(hi, {f: None if got is None else np.array(sorted(got), dtype=np.int64) for f, got in seen.items()},
                  {f: c > 0 for f, c in counts.items()}, {f: (e[0], e[1]) for f, e in lo_hi.items()}, no_nat)


def _codes_of(ids: np.ndarray, uniq: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """Each row's index in ``uniq`` (sorted, holding every value of ``ids``), a chunk at a time:
    the chunk is in the cache then, and no code column is kept for the whole table."""
    top = int(uniq[-1]) if len(uniq) else 0
    if top < (1 << 22):
        lut = np.zeros(top + 1, np.intp)
        lut[uniq] = np.arange(len(uniq))
        return lambda a, b: lut[ids[a:b]]
    return lambda a, b: np.searchsorted(uniq, ids[a:b])


def _enum(rows: C.Rows, codes: np.ndarray, table: list[str], used: np.ndarray) -> None:
    """An enum column: one token per row, or a literal when the whole table has one value (its
    slot is exactly that token's width, so the bytes are the same)."""
    (which,) = np.nonzero(used)
    if len(which) == 1:
        rows.lit(table[int(which[0])])
    else:
        rows.tokens(codes, table, used=used)


def _pod_codes(t: CtDump, field: str, res: NumericResolver,
               networks: np.ndarray | None) -> tuple[Callable[[int, int], np.ndarray] | None, list[str]]:
    """Pod of each row's address (in the key's network), matched by sorted search against the
    store's known pod addresses of the ``networks`` present (None: not counted yet), a chunk at a
    time (None: no pod known)."""
    width = 4 if t.family == 4 else 16
    known: dict[bytes, str] = {}
    for net in (np.unique(t.keys["network"]) if networks is None else networks).tolist():
        for ip, pod in res.ips_to_pods(int(net)).items():
            a = ipaddress.ip_address(ip)
            if a.version == t.family:
                known[int(net).to_bytes(4, "big") + a.packed] = pod
    if not known:
        return None, ["null"]
    ks = sorted(known)
    arr = np.frombuffer(b"".join(ks), dtype=f"V{4 + width}")
    nets, addrs = t.keys["network"], t.keys[field]

    def codes(a: int, b: int) -> np.ndarray:
        m = b - a
        comb = np.empty((m, 4 + width), dtype=np.uint8)
        comb[:, :4] = nets[a:b].astype(">u4").view(np.uint8).reshape(m, 4)
        comb[:, 4:] = np.ascontiguousarray(addrs[a:b]).view(np.uint8).reshape(m, width)
        rows = comb.view(f"V{4 + width}").ravel()
        # compare as bytes: V dtypes sort and search by memcmp
        pos = np.minimum(np.searchsorted(arr, rows), len(arr) - 1)
        return np.where(arr[pos] == rows, pos + 1, 0)

    return codes, ["null"] + [orjson.dumps(known[k]).decode() for k in ks]


def json_rows(t: CtDump, now: int, res: NumericResolver) -> C.Rows:
    """One JSON object per entry of a table (see the module docstring): a fixed layout whose
    slots :mod:`lace.textcols` writes a chunk of rows at a time."""
    k, v, n = t.keys, t.vals, t.count
    fam = t.family
    st = _scan(t)
    rows = C.Rows(n)
    rows.lit('{"table":"' + t.name + '"')
    rows.key("network")
    _id_and_name(rows, k["network"], st.distinct["network"], None if res.numeric else ("network_name", res.network))
    rows.key("proto")
    _enum(rows, k["proto"], _proto_tokens(), st.used["proto"])
    for addr, port in (("saddr", "sport"), ("daddr", "dport")):
        rows.key(addr)
        rows.address(_addr_source(k, addr, fam), fam)
        rows.key(port)
        rows.number(C.field_view(k, port, ">u2"), hi=st.hi[port])
    if not res.numeric:
        for addr, label in (("saddr", "src_pod"), ("daddr", "dst_pod")):
            codes, toks = _pod_codes(t, addr, res, st.distinct["network"])
            rows.key(label)
            if codes is None:
                rows.lit(toks[0])
            else:
                rows.tokens(codes, toks)
    rows.key("state")
    _enum(rows, v["state"], _enum_tokens(CtState), st.used["state"])
    rows.key("flags")
    _enum(rows, v["flags"], _flags_tokens(), st.used["flags"])
    rows.key("delivery")
    _enum(rows, v["delivery"], _enum_tokens(DeliveryKind), st.used["delivery"])
    nat = st.no_nat
    rows.key("nat_addr")
    rows.address(_addr_source(v, "nat_addr", fam), fam, null=nat)
    rows.key("nat_port")
    rows.number(C.field_view(v, "nat_port", ">u2"), null=nat, hi=st.hi["nat_port"])
    for f in ("packets_fwd", "bytes_fwd", "packets_rev", "bytes_rev"):
        rows.key(f)
        rows.number(v[f], hi=st.hi[f])
    for f in ("src_segment", "dst_segment"):
        rows.key(f)
        _id_and_name(rows, v[f], st.distinct[f], None if res.numeric else (f + "_name", res.segment))
    rows.key("dst_network")
    rows.number(v["dst_network"], hi=st.hi["dst_network"])
    rows.key("rev_nat_id")
    _id_and_name(rows, v["rev_nat_id"], st.distinct["rev_nat_id"], None if res.numeric else
                 ("service", lambda i: res.service(i) if i else None))
    nowv = np.int64(now)
    ns = np.int64(10**9)
    rows.key("age_s")
    rows.slot(_Derived(v["created_ns"], st.extremes["created_ns"],
                       lambda c: np.maximum((nowv - c.astype(np.int64)) // ns, 0)))
    rows.key("idle_s")
    rows.slot(_Derived(v["last_seen_ns"], st.extremes["last_seen_ns"],
                       lambda c: np.maximum((nowv - c.astype(np.int64)) // ns, 0)))
    rows.key("expires_in_s")
    rows.slot(_Derived(v["expires_ns"], st.extremes["expires_ns"],
                       lambda c: _toward_zero(c.astype(np.int64) - nowv, ns), signed=True))
    exp = v["expires_ns"]
    rows.key("expired")
    rows.tokens(lambda a, b: (exp[a:b].astype(np.int64) <= nowv).view(np.uint8), ["false", "true"])
    rows.lit("}")
    return rows


def _toward_zero(left: np.ndarray, ns: np.int64) -> np.ndarray:
    """Whole seconds, truncated toward zero (-1.5 s is -1)."""
    q = left // ns
    q += (left < 0) & (q * ns != left)
    return q


class _Derived(C.Number):
    """A number slot computed per chunk from a column (ages from timestamps): the width comes from
    the extremes of the column, the text from each chunk."""

    def __init__(self, column: np.ndarray, extremes: tuple[int, int], fn: Callable[[np.ndarray], np.ndarray],
                 signed: bool = False) -> None:
        ext = fn(np.array(extremes, dtype=column.dtype)) if len(column) else np.zeros(2, np.int64)
        super().__init__(np.asarray(ext, dtype=np.int64))
        if not signed:  # monotone in the column: min/max bound every value
            self.neg = False
        self.column, self.fn = column, fn

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        self.put(buf, off, self.fn(self.column[a:b]))


def _addr_source(arr: np.ndarray, field: str, family: int) -> np.ndarray:
    return C.field_view(arr, field, ">u4") if family == 4 else C.field_view(arr, field, ">u2", 8)


def _id_and_name(rows: C.Rows, ids: np.ndarray, uniq: np.ndarray | None,
                 named: tuple[str, Callable[[int], str | None]] | None) -> None:
    """An ID column and, unless numeric, the name after it (``"network":2,"network_name":"blue"``):
    one token per distinct ID (``uniq``, sorted) when there are few, else the number and names by code."""
    if uniq is None:
        rows.number(ids)
        if named is not None:
            key, name_of = named
            codes, toks = _named_codes(ids, name_of)
            rows.key(key)
            rows.tokens(codes, toks)
        return
    if named is None:
        toks = [str(int(u)) for u in uniq.tolist()]
    else:
        key, name_of = named
        toks = [f'{int(u)},"{key}":' + orjson.dumps(name_of(int(u))).decode() for u in uniq.tolist()]
    if len(toks) == 1:  # one ID in the whole table: its token is the slot, exactly
        rows.lit(toks[0])
    else:
        rows.tokens(_codes_of(ids, uniq), toks)


#: rows from which the entries are formatted by two processes (:func:`lace.textcols.write_ordered`);
#: below it a fork costs more than it saves
PARALLEL_ROWS = 50_000
WORKERS = 2


def _jobs(shown: list[CtDump], now: int, res: NumericResolver) -> list[Callable[[], Any]]:
    """One job per chunk of rows, in output order; each renders its chunk (the first chunk of a
    table after another one carries the ``,\n`` between them).  A worker process makes a table's
    chunk buffer when it first needs it and drops the one before."""
    tables = [json_rows(t, now, res) for t in shown if t.count]
    current: dict[int, C.ChunkWriter] = {}

    def job(i: int, a: int) -> Any:
        w = current.get(i)
        if w is None:
            current.clear()
            w = current[i] = tables[i].writer()
        body = w.render(a)
        return b",\n" + bytes(body) if a == 0 and i else body

    return [functools.partial(job, i, a) for i, rows in enumerate(tables)
            for a in range(0, rows.n, min(C.CHUNK, rows.n))]


def _fileno(out: TextIO) -> int | None:
    """The file descriptor under ``out`` (None for in-memory streams)."""
    try:
        return out.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def write(out: TextIO, node: str | None, tables: list[CtDump], shown: list[CtDump], total: int, n_shown: int,
          now: int, res: NumericResolver) -> None:
    """The document: a head (node, clock, tables, counts) and the ``shown`` entries of every
    table; a large listing to a file descriptor is formatted by two processes, in order."""
    head = {"node": node, "numeric": bool(res.numeric), "now_ns": now, "clock": "CLOCK_MONOTONIC_COARSE",
            "tables": [{"table": t.name, "count": t.count, "capacity": t.capacity} for t in tables],
            "count": total, "shown": n_shown, "truncated": n_shown < total}
    start = orjson.dumps(head)[:-1] + b',"entries":[\n'
    end = b"\n]}\n"
    jobs = _jobs(shown, now, res)
    fd = _fileno(out) if n_shown >= PARALLEL_ROWS else None
    if fd is not None:
        out.flush()
        buf = getattr(out, "buffer", None)
        if buf is not None:
            buf.flush()
        C.write_ordered(fd, [lambda: start, *jobs, lambda: end], WORKERS)
        return
    buf = getattr(out, "buffer", None)
    if buf is not None:  # bytes straight to the binary stream, no decode/encode
        out.flush()
        emit = buf.write
    else:
        def emit(b: Any) -> None:
            out.write(bytes(b).decode())
    emit(start)
    for job in jobs:
        emit(job())
    emit(end)
    if buf is not None:
        buf.flush()
    else:
        out.flush()
