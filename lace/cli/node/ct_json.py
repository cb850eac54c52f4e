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


def _pod_codes(t: CtDump, field: str, res: NumericResolver) -> tuple[np.ndarray, list[str]]:
    """Pod of each row's address (in the key's network), matched by sorted search against the
    store's known pod addresses of the networks present."""
    n = t.count
    width = 4 if t.family == 4 else 16
    comb = np.zeros((n, 4 + width), dtype=np.uint8)
    comb[:, :4] = t.keys["network"].astype(">u4").view(np.uint8).reshape(n, 4)
    comb[:, 4:] = np.ascontiguousarray(t.keys[field]).view(np.uint8).reshape(n, width)
    known: dict[bytes, str] = {}
    for net in np.unique(t.keys["network"]).tolist():
        for ip, pod in res.ips_to_pods(int(net)).items():
            a = ipaddress.ip_address(ip)
            if a.version == t.family:
                known[int(net).to_bytes(4, "big") + a.packed] = pod
    codes = np.zeros(n, dtype=np.int64)
    tokens = ["null"]
    if known:
        ks = sorted(known)
        arr = np.frombuffer(b"".join(ks), dtype=f"V{4 + width}")
        rows = comb.view(f"V{4 + width}").ravel()
        # compare as bytes: V dtypes sort and search by memcmp
        pos = np.searchsorted(arr, rows)
        pos = np.minimum(pos, len(arr) - 1)
        hit = arr[pos] == rows
        codes = np.where(hit, pos + 1, 0)
        tokens += [orjson.dumps(known[k]).decode() for k in ks]
    return codes, tokens


def json_rows(t: CtDump, now: int, res: NumericResolver) -> C.Rows:
    """One JSON object per entry of a table (see the module docstring): a fixed layout whose
    slots :mod:`lace.textcols` writes a chunk of rows at a time."""
    k, v, n = t.keys, t.vals, t.count
    fam = t.family
    rows = C.Rows(n)
    rows.lit('{"table":"' + t.name + '"')
    rows.key("network")
    _id_and_name(rows, k["network"], None if res.numeric else ("network_name", res.network))
    rows.key("proto")
    rows.tokens(k["proto"], _proto_tokens(), used=C.used_codes(k["proto"]))
    for addr, port in (("saddr", "sport"), ("daddr", "dport")):
        rows.key(addr)
        rows.address(_addr_source(k, addr, fam), fam)
        rows.key(port)
        rows.number(C.field_view(k, port, ">u2"))
    if not res.numeric:
        for addr, label in (("saddr", "src_pod"), ("daddr", "dst_pod")):
            codes, toks = _pod_codes(t, addr, res)
            rows.key(label)
            rows.tokens(codes, toks)
    flags = v["flags"]
    rows.key("state")
    rows.tokens(v["state"], _enum_tokens(CtState), used=C.used_codes(v["state"]))
    rows.key("flags")
    rows.tokens(flags, _flags_tokens(), used=C.used_codes(flags))
    rows.key("delivery")
    rows.tokens(v["delivery"], _enum_tokens(DeliveryKind), used=C.used_codes(v["delivery"]))
    nat = (flags & np.uint8(CtFlag.DNAT | CtFlag.SNAT | CtFlag.SERVICE | CtFlag.MASQ)) == 0
    rows.key("nat_addr")
    rows.address(_addr_source(v, "nat_addr", fam), fam, null=nat)
    rows.key("nat_port")
    rows.number(C.field_view(v, "nat_port", ">u2"), null=nat)
    for f in ("packets_fwd", "bytes_fwd", "packets_rev", "bytes_rev"):
        rows.key(f)
        rows.number(v[f])
    for f in ("src_segment", "dst_segment"):
        rows.key(f)
        _id_and_name(rows, v[f], None if res.numeric else (f + "_name", res.segment))
    rows.key("dst_network")
    rows.number(v["dst_network"])
    rows.key("rev_nat_id")
    _id_and_name(rows, v["rev_nat_id"], None if res.numeric else
                 ("service", lambda i: res.service(i) if i else None))
    nowv = np.int64(now)
    ns = np.int64(10**9)
    rows.key("age_s")
    rows.slot(_Derived(v["created_ns"], lambda c: np.maximum((nowv - c.astype(np.int64)) // ns, 0)))
    rows.key("idle_s")
    rows.slot(_Derived(v["last_seen_ns"], lambda c: np.maximum((nowv - c.astype(np.int64)) // ns, 0)))
    rows.key("expires_in_s")
    rows.slot(_Derived(v["expires_ns"], lambda c: _toward_zero(c.astype(np.int64) - nowv, ns), signed=True))
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

    def __init__(self, column: np.ndarray, fn: Callable[[np.ndarray], np.ndarray], signed: bool = False) -> None:
        ext = fn(np.array([column.min(), column.max()], dtype=column.dtype)) if len(column) else np.zeros(2, np.int64)
        super().__init__(np.asarray(ext, dtype=np.int64))
        if not signed:  # monotone in the column: min/max bound every value
            self.neg = False
        self.column, self.fn = column, fn

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        self.put(buf, off, self.fn(self.column[a:b]))


def _addr_source(arr: np.ndarray, field: str, family: int) -> np.ndarray:
    return C.field_view(arr, field, ">u4") if family == 4 else C.field_view(arr, field, ">u2", 8)


def _id_and_name(rows: C.Rows, ids: np.ndarray, named: tuple[str, Callable[[int], str | None]] | None) -> None:
    """An ID column and, unless numeric, the name after it (``"network":2,"network_name":"blue"``):
    one token per distinct ID when there are few, else the number and names by code."""
    cat = C.categorize(ids)
    if cat is None:
        rows.number(ids)
        if named is not None:
            key, name_of = named
            codes, toks = _named_codes(ids, name_of)
            rows.key(key)
            rows.tokens(codes, toks)
        return
    codes, uniq = cat
    if named is None:
        rows.tokens(codes, [str(int(u)) for u in uniq.tolist()])
        return
    key, name_of = named
    rows.tokens(codes, [f'{int(u)},"{key}":' + orjson.dumps(name_of(int(u))).decode() for u in uniq.tolist()])


def write(out: TextIO, node: str | None, tables: list[CtDump], shown: list[CtDump], total: int, n_shown: int,
          now: int, res: NumericResolver) -> None:
    """The document: a head (node, clock, tables, counts) and the ``shown`` entries of every table."""
    head = {"node": node, "numeric": bool(res.numeric), "now_ns": now, "clock": "CLOCK_MONOTONIC_COARSE",
            "tables": [{"table": t.name, "count": t.count, "capacity": t.capacity} for t in tables],
            "count": total, "shown": n_shown, "truncated": n_shown < total}
    buf = getattr(out, "buffer", None)
    if buf is not None:  # bytes straight to the binary stream, no decode/encode
        out.flush()
        emit = buf.write
    else:
        def emit(b: Any) -> None:
            out.write(bytes(b).decode())
    emit(orjson.dumps(head)[:-1] + b',"entries":[\n')
    first = True
    for t in shown:
        if not t.count:
            continue
        if not first:
            emit(b",\n")
        first = False
        for body in json_rows(t, now, res).chunks():
            emit(body)
    emit(b"\n]}\n")
    if buf is not None:
        buf.flush()
    else:
        out.flush()
