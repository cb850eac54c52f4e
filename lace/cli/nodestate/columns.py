"""Vectorised text for big dumps: numbers, IPv4/IPv6 addresses and enum labels rendered for a whole
column at once with NumPy, and JSON rows assembled from fixed-width slots.

Why: ``node ct list`` prints up to a million conntrack entries; formatting each with Python
(``ipaddress``, f-strings, dicts for orjson) costs microseconds per row.  Here every column is a
``(n, width)`` uint8 matrix built with a handful of array operations, and a JSON row is the
concatenation of fixed-width slots.  Padding (NUL while building) becomes spaces, which JSON
allows between tokens, so each row stays valid JSON without a per-row compaction pass.

Text columns are :class:`Text` — ``buf`` (n, w) left-aligned, NUL-padded, and ``lens``.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

import numpy as np

PAD = 0
SPACE = 0x20
_POW10 = np.array([10 ** k for k in range(20)], dtype=np.uint64)


@dataclass
class Text:
    """A column of strings: ``buf`` (n, w) uint8, left-aligned and NUL-padded, and their lengths."""

    buf: np.ndarray
    lens: np.ndarray

    @property
    def width(self) -> int:
        return int(self.buf.shape[1])

    def tolist(self) -> list[str]:
        """Python strings (the slow path: tables, tests)."""
        w = self.width
        if w == 0:
            return [""] * len(self.lens)
        return [s.decode() for s in np.ascontiguousarray(self.buf).view(f"S{w}").ravel().tolist()]


def _table(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    w = max((len(s) for s in strings), default=0) or 1
    t = np.zeros((len(strings), w), dtype=np.uint8)
    for i, s in enumerate(strings):
        b = s.encode()
        t[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
    return t, np.array([len(s) for s in strings], dtype=np.int64)


_OCTETS = _table([str(i) for i in range(256)])
_HEX16: tuple[np.ndarray, np.ndarray] | None = None


def _hex16() -> tuple[np.ndarray, np.ndarray]:
    global _HEX16
    if _HEX16 is None:
        _HEX16 = _table([format(i, "x") for i in range(65536)])
    return _HEX16


@functools.lru_cache(maxsize=256)
def _cached_table(strings: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    return _table(list(strings))


def lookup(codes: np.ndarray, strings: list[str]) -> Text:
    """Strings by integer code (enum labels, flag sets): ``strings[code]``."""
    t, ln = _cached_table(tuple(strings)) if len(strings) <= 1024 else _table(strings)
    c = np.asarray(codes, dtype=np.int64)
    return Text(t[c], ln[c])


def _concat(parts: list[Text]) -> Text:
    """Variable-length concatenation of a few narrow columns.

    Each part is written whole (text and its NUL padding) at the running end of the row; the next
    part overwrites the padding.  One fancy-index write per part, no per-row Python."""
    n = len(parts[0].lens)
    width = sum(p.width for p in parts)
    out = np.zeros((n, width), dtype=np.uint8)
    flat = out.reshape(-1)
    start = np.arange(n, dtype=np.int64) * width
    end = np.zeros(n, dtype=np.int64)
    for p in parts:
        idx = (start + end)[:, None] + np.arange(p.width, dtype=np.int64)[None, :]
        flat[idx] = p.buf
        end = end + p.lens
    return Text(out, end)


_PAIRS: tuple[np.ndarray, np.ndarray] | None = None


def _pairs() -> tuple[np.ndarray, np.ndarray]:
    """"a.b" for every pair of octets, indexed by (a << 8) | b."""
    global _PAIRS
    if _PAIRS is None:
        t, ln = _OCTETS
        a = np.repeat(np.arange(256), 256)
        b = np.tile(np.arange(256), 256)
        dot = Text(np.full((65536, 1), ord("."), np.uint8), np.ones(65536, np.int64))
        pr = _concat([Text(t[a], ln[a]), dot, Text(t[b], ln[b])])
        _PAIRS = (pr.buf, pr.lens)
    return _PAIRS


def ipv4(raw: np.ndarray) -> Text:
    """IPv4 addresses from a (n, 4) uint8 (or V4) column, dotted quad."""
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, 4)
    n = len(b)
    pt, pl = _pairs()
    hi = (b[:, 0].astype(np.int64) << 8) | b[:, 1]
    lo = (b[:, 2].astype(np.int64) << 8) | b[:, 3]
    dot = Text(np.full((n, 1), ord("."), np.uint8), np.ones(n, np.int64))
    return _concat([Text(pt[hi], pl[hi]), dot, Text(pt[lo], pl[lo])])


def ipv6(raw: np.ndarray) -> Text:
    """IPv6 addresses from a (n, 16) uint8 (or V16) column, RFC 5952 text as ``ipaddress`` prints it
    (longest run of two or more zero groups compressed, the first on a tie)."""
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, 16)
    n = len(b)
    groups = (b[:, 0::2].astype(np.int64) << 8) | b[:, 1::2]
    zero = groups == 0
    # run length of zeros starting at each group
    run = np.zeros((n, 9), dtype=np.int64)
    for g in range(7, -1, -1):
        run[:, g] = np.where(zero[:, g], run[:, g + 1] + 1, 0)
    run = run[:, :8]
    best_len = run.max(axis=1)
    best_start = run.argmax(axis=1)  # first maximum: the leftmost run on a tie
    compress = best_len >= 2
    ht, hl = _hex16()
    # pieces in order: group 0 = hex, group g>0 = ":" + hex; the run's first group becomes the
    # marker (":" then the next piece's own ":"; "::" when the run reaches the end), the rest vanish
    colon = np.full((n, 1), ord(":"), np.uint8)
    parts: list[Text] = []
    g_idx = np.arange(8)[None, :]
    in_run = compress[:, None] & (g_idx >= best_start[:, None]) & (g_idx < (best_start + best_len)[:, None])
    at_start = compress[:, None] & (g_idx == best_start[:, None])
    to_end = (best_start + best_len) == 8
    for g in range(8):
        hx = ht[groups[:, g]]
        ln = hl[groups[:, g]].copy()
        if g:
            buf = np.concatenate([colon, hx], axis=1)
            ln = ln + 1
        else:
            buf = np.concatenate([hx, np.zeros((n, 1), np.uint8)], axis=1)
        marker = at_start[:, g]
        if marker.any():
            buf = buf.copy()
            buf[marker, 0] = ord(":")
            buf[marker, 1] = ord(":")
            mlen = np.where(to_end | (g == 0), 2, 1)
            if g == 0:  # "::" + rest, the rest's piece brings its own ":" -> one here unless at end
                mlen = np.where(to_end, 2, 1)
            ln = np.where(marker, mlen, ln)
        gone = in_run[:, g] & ~marker
        if gone.any():
            if not marker.any():
                buf = buf.copy()
            buf[gone] = 0  # written whole by _concat: its text must not survive as padding
            ln = np.where(gone, 0, ln)
        parts.append(Text(buf, ln))
    return _concat(parts)


def ip(raw: np.ndarray, family: int) -> Text:
    return ipv4(np.ascontiguousarray(raw).view(np.uint8).reshape(len(raw), -1)[:, :4]) if family == 4 else ipv6(raw)


def digits(values: np.ndarray, width: int | None = None) -> np.ndarray:
    """Non-negative integers as right-aligned decimal text in a (n, width) uint8 matrix, NUL-padded
    on the left (JSON whitespace once NULs become spaces).  ``width`` defaults to the widest value."""
    v = np.asarray(values)
    n = len(v)
    top = int(v.max()) if n else 0
    w = width or max(1, len(str(top)))
    # 32-bit division vectorises, 64-bit does not: use it whenever the values fit
    dt = np.uint32 if top < 2**32 else np.uint64
    cur = v.astype(dt, copy=True)
    out = np.zeros((n, w), dtype=np.uint8)
    ten = dt(10)
    for k in range(w):
        q = cur // ten
        col = (cur - q * ten).astype(np.uint8) + np.uint8(48)
        if k:
            col[cur == 0] = PAD  # past the number's first digit
        out[:, w - 1 - k] = col
        cur = q
    return out


def signed_digits(values: np.ndarray) -> np.ndarray:
    """Integers (possibly negative) right-aligned, with a '-' before the first digit."""
    v = np.asarray(values, dtype=np.int64)
    mag = np.abs(v).astype(np.uint64)
    body = digits(mag)
    n, w = body.shape
    out = np.zeros((n, w + 1), dtype=np.uint8)
    out[:, 1:] = body
    neg = v < 0
    if neg.any():
        ndig = np.ones(n, dtype=np.int64)
        for k in range(1, 20):
            ndig += (mag >= _POW10[k]).astype(np.int64) if k < 20 else 0
        pos = w - ndig  # column of the '-' in out
        out[np.nonzero(neg)[0], pos[neg]] = ord("-")
    return out


class JsonRows:
    """Assemble one JSON object per row from fixed-width slots (see the module docstring)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: list[np.ndarray | bytes] = []

    def lit(self, text: str | bytes) -> None:
        b = text.encode() if isinstance(text, str) else text
        if self.parts and isinstance(self.parts[-1], bytes):
            self.parts[-1] += b
        else:
            self.parts.append(b)

    def key(self, name: str, first: bool = False) -> None:
        self.lit(("" if first else ",") + f'"{name}":')

    def raw(self, buf: np.ndarray) -> None:
        """Pre-rendered JSON tokens (numbers, literals), NUL-padded."""
        self.parts.append(buf)

    def string(self, t: Text, null: np.ndarray | None = None) -> None:
        """A quoted string per row (``null`` where the mask is set); text must need no escaping."""
        n, w = t.buf.shape
        out = np.zeros((n, w + 2), dtype=np.uint8)
        out[:, 0] = ord('"')
        out[:, 1:w + 1] = t.buf
        out[np.arange(n), t.lens + 1] = ord('"')
        if null is not None and null.any():
            out[null] = 0
            out[null, :4] = np.frombuffer(b"null", np.uint8)
        self.parts.append(out)

    def number(self, values: np.ndarray, null: np.ndarray | None = None) -> None:
        v = np.asarray(values)
        buf = signed_digits(v) if v.dtype.kind == "i" and (v < 0).any() else digits(v)
        if null is not None and null.any():
            if buf.shape[1] < 4:
                buf = np.concatenate([np.zeros((len(buf), 4 - buf.shape[1]), np.uint8), buf], axis=1)
            buf[null] = 0
            buf[null, :4] = np.frombuffer(b"null", np.uint8)
        self.parts.append(buf)

    def tokens(self, codes: np.ndarray, tokens: list[str]) -> None:
        """A JSON token (already encoded, e.g. '"established"', '["dnat"]', 'true') per code."""
        t = lookup(codes, tokens)
        self.parts.append(t.buf)

    def build(self, sep: bytes = b",\n") -> memoryview:
        """Rows joined by ``sep`` (no trailing separator), padding rendered as spaces; a view of
        the one buffer (write it out without a copy)."""
        n = self.n
        if n == 0:
            return memoryview(b"")
        widths = [len(p) if isinstance(p, bytes) else p.shape[1] for p in self.parts]
        total = sum(widths) + len(sep)
        out = np.zeros((n, total), dtype=np.uint8)
        off = 0
        for p, w in zip(self.parts, widths):
            if isinstance(p, bytes):
                out[:, off:off + w] = np.frombuffer(p, dtype=np.uint8)
            else:
                out[:, off:off + w] = p
            off += w
        # every character a row holds is printable (>= space): one SIMD pass turns NUL padding
        # into spaces; the separator (a newline) goes in after it
        np.maximum(out, SPACE, out=out)
        out[:, off:] = np.frombuffer(sep, dtype=np.uint8)
        return memoryview(out.reshape(-1))[: n * total - len(sep)]


def check_ipv6(raw: bytes) -> str:
    """The reference rendering (tests compare :func:`ipv6` against it)."""
    return str(ipaddress.IPv6Address(raw))
