"""NumPy fixed-width text: columns of values formatted a chunk of rows at a time, without a Python
object per value.  Generic (it knows nothing about lace's maps); the node command's ``ct list``
uses it for up to a million conntrack entries.

Why: formatting each row with Python (``ipaddress``, f-strings, dicts for orjson) costs
microseconds per row.  Here a table's rows share one layout — a template row (keys, punctuation,
spaces) with fixed-width slots for the values — and every slot is written for a whole chunk of
rows with a few array operations:

* tokens (enum labels, names, anything with few distinct values) are ``np.take`` from a
  :class:`PaddedStrings` of pre-rendered, space-padded strings, 8 bytes at a time;
* numbers are right-aligned in their slot: small ones from a table, big ones four digits at a
  time from a 10,000-entry table;
* addresses are built as little-endian 64-bit words (pieces shifted into place), RFC 5952 for
  IPv6 as ``ipaddress`` prints it, then closed with a quote and spaces.

:class:`Rows` writes one JSON object per row this way.  Padding is spaces, which JSON allows
between tokens, so every row is valid JSON as written and nothing is compacted afterwards.  One
chunk buffer (small enough to stay in cache) is reused: the template is written into it once,
slots overwrite their bytes in every chunk, and the chunk goes to the output as one write.

:class:`Text` (``buf`` (n, w) left-aligned NUL-padded, and ``lens``) is the column form for
other output (``ct list``'s lines) and the tests; :func:`ipv4`, :func:`ipv6`, :func:`digits`
and :func:`signed_digits` produce it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

PAD = 0
SPACE = 0x20
_POW10 = np.array([10 ** k for k in range(20)], dtype=np.uint64)
_SPW = np.uint64(0x2020202020202020)
_U = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}

#: rows per chunk: the chunk buffer (rows x row width) should stay in the L2 cache
CHUNK = 4096


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


# ---- writing into a chunk buffer -----------------------------------------------------------

def _col(buf: np.ndarray, off: int, k: int) -> np.ndarray:
    """Bytes ``off:off+k`` of every row of ``buf`` (m, W) uint8 as one k-byte unsigned integer."""
    return buf[:, off:off + k].view(_U[k])[:, 0]


def _spans(w: int) -> tuple[int, list[int]]:
    """Cover ``w`` bytes with as few equal loads as possible (the last may overlap the one before)."""
    k = 8 if w >= 8 else 4 if w >= 4 else 2 if w >= 2 else 1
    starts = sorted(set(list(range(0, w - k, k)) + [w - k]))
    return k, starts


class PaddedStrings:
    """Strings by code, space-padded to one width, ready to be taken 8 bytes at a time."""

    def __init__(self, strings: Sequence[bytes], width: int | None = None) -> None:
        w = width if width is not None else max((len(s) for s in strings), default=0)
        self.width = w = max(w, 1)
        arr = np.full((max(len(strings), 1), w), SPACE, dtype=np.uint8)
        for i, s in enumerate(strings):
            if s:
                arr[i, :len(s)] = np.frombuffer(s[:w], dtype=np.uint8)
        self._init(arr)

    @classmethod
    def from_array(cls, arr: np.ndarray) -> PaddedStrings:
        t = cls.__new__(cls)
        t.width = arr.shape[1]
        t._init(np.ascontiguousarray(arr, dtype=np.uint8))
        return t

    def _init(self, arr: np.ndarray) -> None:
        self.array = arr
        self.k, starts = _spans(self.width)
        self.parts = [(s, np.ascontiguousarray(arr[:, s:s + self.k]).view(_U[self.k]).ravel()) for s in starts]

    def put(self, buf: np.ndarray, off: int, codes: np.ndarray) -> None:
        """Write ``strings[codes[i]]`` into row i of ``buf`` at column ``off``."""
        for s, tab in self.parts:
            np.take(tab, codes, out=_col(buf, off + s, self.k), mode="clip")


def _digits_matrix(v: np.ndarray, w: int, zero_pad: bool) -> np.ndarray:
    """(n, w) ASCII digits of non-negative ints, right-aligned (spaces or zeros on the left)."""
    v = v.astype(np.uint64)
    out = np.empty((len(v), w), dtype=np.uint8)
    cur = v.copy()
    for k in range(w):
        col = (cur % 10).astype(np.uint8) + 48
        if k and not zero_pad:
            col[cur == 0] = SPACE
        out[:, w - 1 - k] = col
        cur //= 10
    return out


#: four digits: [0, 10^4) zero-padded, [10^4, 2*10^4) right-aligned with spaces, 2*10^4 blank
_G4 = np.concatenate([_digits_matrix(np.arange(10000), 4, True), _digits_matrix(np.arange(10000), 4, False),
                      np.full((1, 4), SPACE, np.uint8)])
_G4_TABLES: dict[int, PaddedStrings] = {}
_SMALL: dict[int, PaddedStrings] = {}


def _g4(r: int) -> PaddedStrings:
    """The four-digit table's last ``r`` columns (the most significant group of a number)."""
    t = _G4_TABLES.get(r)
    if t is None:
        t = _G4_TABLES[r] = PaddedStrings.from_array(_G4[:, 4 - r:])
    return t


def _small(nd: int) -> PaddedStrings:
    """Every value below 10^nd (at most 65536) right-aligned in nd characters."""
    t = _SMALL.get(nd)
    if t is None:
        t = _SMALL[nd] = PaddedStrings.from_array(_digits_matrix(np.arange(min(10 ** nd, 65536)), nd, False))
    return t


def ndigits(v: int) -> int:
    return len(str(int(v)))


class Number:
    """A right-aligned integer slot (optionally negative, optionally ``null`` by a mask)."""

    def __init__(self, values: np.ndarray, null: np.ndarray | None = None, *, hi: int | None = None) -> None:
        """``hi``: the largest value when the caller knows it already (an unsigned column's extreme
        gathered in one pass with others: each pass over a strided field streams the whole table)."""
        v = np.asarray(values)
        self.values = v
        self.null = null if null is not None and null.any() else None
        signed = v.dtype.kind == "i"
        lo = int(v.min()) if signed and len(v) else 0
        if hi is None or signed:
            hi = int(v.max()) if len(v) else 0
        self.neg = lo < 0
        mag = max(hi, -lo)
        self.nd = ndigits(mag)
        self.width = self.nd + (1 if self.neg else 0)
        if self.null is not None:
            self.width = max(self.width, 4)
        self.small = mag < 65536
        self.dt = np.uint32 if mag < 2 ** 32 else np.uint64

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        self.put(buf, off, self.values[a:b], None if self.null is None else self.null[a:b])

    def put(self, buf: np.ndarray, off: int, v: np.ndarray, null: np.ndarray | None = None) -> None:
        """Write the values ``v`` (one per row of buf) right-aligned at ``off``."""
        end = off + self.width
        if self.neg:
            v = v.astype(np.int64)
            negm = v < 0
            mag = np.abs(v).astype(self.dt)
        else:
            mag = v.astype(self.dt, copy=False)
        nd = self.nd
        if self.small:
            _small(nd).put(buf, end - nd, mag.astype(np.intp))
        else:
            ng = (nd + 3) // 4
            cur = mag
            ten4 = self.dt(10000)
            for g in range(ng):
                gend = end - 4 * g
                if g < ng - 1:
                    q = cur // ten4
                    idx = (cur - q * ten4).astype(np.intp)
                    idx += 10000 * (q == 0)
                    if g:
                        idx += 10000 * (cur == 0)
                    _g4(4).put(buf, gend - 4, idx)
                    cur = q
                else:
                    r = nd - 4 * g
                    idx = cur.astype(np.intp) + 10000
                    if g:
                        idx += 10000 * (cur == 0)
                    _g4(r).put(buf, gend - r, idx)
        if self.width > nd:  # columns left of the digits: spaces (a '-' of the last chunk may be there)
            buf[:, off:end - nd] = SPACE
        if self.neg and negm.any():
            rows = np.flatnonzero(negm)
            dig = np.searchsorted(_POW10, mag[rows].astype(np.uint64), side="right")
            buf.reshape(-1)[rows * buf.shape[1] + end - 1 - dig] = ord("-")
        if null is not None:
            _nullify(buf, off, self.width, null)


def _nullify(buf: np.ndarray, off: int, width: int, mask: np.ndarray) -> None:
    rows = np.flatnonzero(mask)
    if len(rows):
        filler = np.full(width, SPACE, np.uint8)
        filler[:4] = np.frombuffer(b"null", np.uint8)
        buf[rows, off:off + width] = filler


# ---- addresses as 64-bit words ---------------------------------------------------------------

def _pairs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every 16-bit value ab: "a.b" as a NUL-padded u64, its length, and "a.b." as a u64."""
    d = _digits_matrix(np.arange(256), 3, False)
    ln = np.array([len(str(i)) for i in range(256)], dtype=np.int64)
    left = np.zeros((256, 3), np.uint8)  # left-aligned, NUL-padded
    for i in range(256):
        left[i, :ln[i]] = d[i, 3 - ln[i]:]
    a = np.repeat(np.arange(256), 256)
    b = np.tile(np.arange(256), 256)
    buf = np.zeros((65536, 16), np.uint8)
    buf[:, :3] = left[a]
    pos = ln[a]
    rows = np.arange(65536)
    buf[rows, pos] = ord(".")
    for j in range(3):
        buf[rows, pos + 1 + j] = left[b, j]
    words = np.ascontiguousarray(buf[:, :8]).view("<u8").ravel()
    lens = ln[a] + 1 + ln[b]
    dotted = words | (np.uint64(ord(".")) << (lens.astype(np.uint64) * np.uint64(8)))
    return words, lens, dotted


_PAIRS: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
_HEX: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def _hex() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every 16-bit group: hex text as a NUL-padded u64, its length, and ":" + hex as a u64."""
    global _HEX
    if _HEX is None:
        g = np.arange(65536)
        ln = 1 + (g >= 0x10) + (g >= 0x100) + (g >= 0x1000)
        chars = np.frombuffer(b"0123456789abcdef", np.uint8)
        buf = np.zeros((65536, 8), np.uint8)
        rows = np.arange(65536)
        for k in range(4):  # nibble k from the top of a 4-digit group
            nib = (g >> (12 - 4 * k)) & 0xF
            pos = k - (4 - ln)
            ok = pos >= 0
            buf[rows[ok], pos[ok]] = chars[nib[ok]]
        words = buf.view("<u8").ravel()
        colon = (words << np.uint64(8)) | np.uint64(ord(":"))
        _HEX = (words, ln.astype(np.int64), colon)
    return _HEX


def _finish(words: np.ndarray, lens: np.ndarray) -> None:
    """Close strings held as NUL-padded u64 words with a quote, spaces after it (in place)."""
    fin = _FIN
    for j in range(words.shape[1]):
        k = np.clip(lens - 8 * j, -1, 8) + 1
        words[:, j] |= fin[k]


def _fin_table() -> np.ndarray:
    t = np.zeros(10, np.uint64)
    t[0] = _SPW
    for k in range(8):
        b = bytes(k) + b'"' + b" " * (7 - k)
        t[k + 1] = np.frombuffer(b, "<u8")[0]
    return t


_FIN = _fin_table()


def ipv4_words(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IPv4 addresses (host-order u32 values of the big-endian address) as (m, 2) NUL-padded
    u64 words of dotted-quad text, and their lengths."""
    global _PAIRS
    if _PAIRS is None:
        _PAIRS = _pairs()
    pw, pl, pd = _PAIRS
    x = x.astype(np.uint32, copy=False)
    hi = (x >> 16).astype(np.intp)
    lo = (x & 0xFFFF).astype(np.intp)
    la = pl[hi] + 1
    b = pw[lo]
    sh = (la << 3).astype(np.uint64)
    out = np.empty((len(x), 2), np.uint64)
    np.bitwise_or(pd[hi], b << sh, out=out[:, 0])
    np.right_shift(b, np.uint64(64) - sh, out=out[:, 1])
    return out, la + pl[lo]


#: gathers the low bit of each of 8 bytes into one byte (bit i from byte i)
_ZMUL = np.uint64(sum(1 << (56 - 7 * i) for i in range(8)))
_ZT: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


def _zero_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each pattern of zero groups Z (bit i: group i is 0) and each group i: (all-ones mask
    if the group is printed, the "::"/":" marker that replaces the compressed run's first group,
    the marker's length, 1 if the group is printed).  The run compressed is the longest of two
    or more zero groups, the first on a tie (RFC 5952, as ``ipaddress`` prints it)."""
    global _ZT
    if _ZT is None:
        nm = np.zeros((8, 256), np.uint64)
        mv = np.zeros((8, 256), np.uint64)
        ml = np.zeros((8, 256), np.intp)
        nf = np.zeros((8, 256), np.intp)
        for z in range(256):
            best, start, i = 0, -1, 0
            while i < 8:
                if z >> i & 1:
                    j = i
                    while j < 8 and z >> j & 1:
                        j += 1
                    if j - i > best:
                        best, start = j - i, i
                    i = j
                else:
                    i += 1
            for i in range(8):
                if best >= 2 and i == start:
                    to_end = start + best == 8
                    mv[i, z] = 0x3A3A if to_end else 0x3A
                    ml[i, z] = 2 if to_end else 1
                elif not (best >= 2 and start < i < start + best):
                    nm[i, z] = np.uint64(0xFFFFFFFFFFFFFFFF)
                    nf[i, z] = 1
        _ZT = (nm, mv, ml, nf)
    return _ZT


_PIECES: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
_LOW56 = np.uint64((1 << 56) - 1)


def _piece_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_hex` and :func:`_zero_tables` folded so that a group's piece is two gathers and two
    operations: each piece carries its length in its top byte (pieces are at most 5 bytes).

    (2, 65536): the group's hex text (first group) and ":" + hex (the others); (8, 256) by group
    and zero pattern: all-ones where the group is printed, else 0; (8, 256): the marker and its
    length."""
    global _PIECES
    if _PIECES is None:
        hw, hl, hc = _hex()
        nm, mv, ml, _ = _zero_tables()
        hx = np.stack([hw | (hl.astype(np.uint64) << np.uint64(56)),
                       hc | ((hl + 1).astype(np.uint64) << np.uint64(56))])
        _PIECES = (hx, nm, mv | (ml.astype(np.uint64) << np.uint64(56)))
    return _PIECES


def ipv6_words(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IPv6 addresses from (m, 8) 16-bit groups as (m, 5) NUL-padded u64 words of RFC 5952 text
    (as ``ipaddress`` prints it), and their lengths: each group's piece (hex, ":" + hex, the
    marker or nothing, chosen by the row's zero pattern) shifted into place.

    All eight pieces, their offsets and their shifted halves are computed for the whole chunk at
    once; only the OR into the words goes group by group (two groups can share a word)."""
    hx, zmask, zmark = _piece_tables()
    m = len(groups)
    g = groups.astype(np.intp)
    zb = np.ascontiguousarray(g == 0).view("<u8")[:, 0]
    z = ((zb * _ZMUL) >> np.uint64(56)).astype(np.intp)
    gt = np.ascontiguousarray(g.T)                     # group-major: every step below is contiguous
    pieces = hx[1][gt]
    pieces[0] = hx[0][gt[0]]
    pieces &= zmask[:, z]
    pieces |= zmark[:, z]
    lens = (pieces >> np.uint64(56)).astype(np.intp)
    pieces &= _LOW56
    off = np.empty_like(lens)                           # where each piece starts, in bytes
    off[0] = 0
    for i in range(1, 8):  # (np.cumsum over 8 rows of a chunk is slower than this loop)
        np.add(off[i - 1], lens[i - 1], out=off[i])
    sh = ((off & 7) << 3).astype(np.uint64)
    halves = np.empty((8, 2, m), np.uint64)             # the piece's part in its word and in the next
    np.left_shift(pieces, sh, out=halves[:, 0])
    np.right_shift(pieces, np.uint64(64) - sh, out=halves[:, 1])
    idx = np.empty((8, 2, m), np.intp)
    np.add(off >> 3, np.arange(0, 6 * m, 6, dtype=np.intp), out=idx[:, 0])
    np.add(idx[:, 0], 1, out=idx[:, 1])
    words = np.zeros((m, 6), np.uint64)
    flat = words.reshape(-1)
    flat[idx[0, 0]] = halves[0, 0]                      # the first piece starts every row's text
    for i in range(1, 8):
        at = idx[i].reshape(-1)
        flat[at] |= halves[i].reshape(-1)
    return words[:, :5], off[7] + lens[7]


def _words_text(words: np.ndarray, lens: np.ndarray) -> Text:
    buf = np.ascontiguousarray(words).view(np.uint8).reshape(len(words), -1)
    w = int(lens.max()) if len(lens) else 0
    return Text(np.ascontiguousarray(buf[:, :max(w, 1)]), lens.astype(np.int64))


def _as_u8(raw: np.ndarray, width: int) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.uint8).reshape(len(raw), -1)[:, :width]


def ipv4(raw: np.ndarray) -> Text:
    """IPv4 addresses from a (n, 4) uint8 (or V4) column, dotted quad."""
    b = np.ascontiguousarray(_as_u8(raw, 4))
    words, lens = ipv4_words(b.view(">u4").ravel().astype(np.uint32))
    return _words_text(words, lens)


def ipv6(raw: np.ndarray) -> Text:
    """IPv6 addresses from a (n, 16) uint8 (or V16) column, RFC 5952 text as ``ipaddress`` prints it."""
    b = np.ascontiguousarray(_as_u8(raw, 16))
    words, lens = ipv6_words(b.view(">u2").reshape(len(b), 8))
    return _words_text(words, lens)


def ip(raw: np.ndarray, family: int) -> Text:
    return ipv4(raw) if family == 4 else ipv6(raw)


#: rows per block when a column is scanned whole (a block stays in cache)
BLOCK = 8192
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class Address:
    """A quoted address slot: ``"10.0.0.1"`` / ``"fd00::1"`` (or ``null`` by a mask), padded.

    ``source`` is a strided view of the addresses: host-order u32 values for IPv4, (n, 8) 16-bit
    groups for IPv6 (see :func:`field_view`).

    A column with few distinct addresses (servers, service VIPs, NAT addresses: the usual case)
    has each one formatted once and taken by code, ~10x less work per chunk than building the
    text; a chunk whose addresses are not all among them (never, short of a hash collision) is
    built as text like any other column."""

    #: more distinct addresses than this, and every row's text is built
    DISTINCT = 4096
    #: fewer rows than this, and the column is not looked at first
    MIN_ROWS = 4 * BLOCK

    def __init__(self, source: np.ndarray, family: int, null: np.ndarray | None = None) -> None:
        self.source, self.family = source, family
        self.null = null if null is not None and null.any() else None
        self.lead = 1 if self.null is not None else 0  # the opening quote is in the slot
        self.nwords = 2 if family == 4 else 5
        self.width = self.lead + (16 if family == 4 else 40)
        self.table: PaddedStrings | None = None
        if len(source) >= self.MIN_ROWS:
            self._categorize()

    def _keys(self, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a 64-bit key per address, the address as exact u64 words): IPv4's key is the address."""
        if self.family == 4:
            v = src.astype(np.uint64)
            return v, v[:, None]
        words = np.ascontiguousarray(src).view("<u8")  # (m, 2): the 16 bytes, exactly
        return words[:, 0] ^ (words[:, 1] * _GOLDEN), words

    def _categorize(self) -> None:
        """Collect the distinct addresses block by block, giving up past DISTINCT (a column of
        mostly distinct addresses gives up in its first block), then format them once."""
        keys = np.zeros(0, np.uint64)
        reps: list[np.ndarray] = []
        n = len(self.source)
        for a in range(0, n, BLOCK):
            src = self.source[a:a + BLOCK]
            if self.null is not None:
                src = src[~self.null[a:a + BLOCK]]
            k, _ = self._keys(src)
            u, first = np.unique(k, return_index=True)
            new = ~np.isin(u, keys, assume_unique=True)
            if new.any():
                keys = np.concatenate([keys, u[new]])
                reps.append(np.ascontiguousarray(src[first[new]]))
                if len(keys) > self.DISTINCT:
                    return
        if not len(keys):
            return
        order = np.argsort(keys)
        self.keys = keys[order]
        raw = np.concatenate(reps)[order]
        self.exact = self._keys(raw)[1]
        words, ln = ipv4_words(raw) if self.family == 4 else ipv6_words(raw)
        words = np.ascontiguousarray(words)
        _finish(words, ln)
        texts = words.view(np.uint8).reshape(len(raw), -1)
        arr = np.full((len(raw) + 1, self.width), SPACE, np.uint8)
        arr[:-1, self.lead:] = texts
        if self.lead:
            arr[:-1, 0] = ord('"')
            arr[-1, :4] = np.frombuffer(b"null", np.uint8)  # the last code: null
        self.table = PaddedStrings.from_array(arr)

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        src = self.source[a:b]
        null = self.null[a:b] if self.null is not None else None
        if self.table is not None:
            k, exact = self._keys(src)
            pos = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
            ok = (self.exact[pos] == exact).all(axis=1)
            if null is not None:
                ok |= null
                pos = np.where(null, len(self.keys), pos)
            if ok.all():
                self.table.put(buf, off, pos)
                return
        m = b - a
        if null is not None:
            keep = np.flatnonzero(~null)
            words = np.empty((m, self.nwords), np.uint64)
            words[:] = _SPW
            words[:, 0] = np.frombuffer(b"ull     ", "<u8")[0]
            if len(keep):
                w, ln = ipv4_words(src[keep]) if self.family == 4 else ipv6_words(src[keep])
                w = np.ascontiguousarray(w)
                _finish(w, ln)
                words[keep] = w
            _col(buf, off, 1)[:] = np.where(null, np.uint8(ord("n")), np.uint8(ord('"')))
        else:
            words, ln = ipv4_words(src) if self.family == 4 else ipv6_words(src)
            words = np.ascontiguousarray(words)
            _finish(words, ln)
        o = off + self.lead
        for j in range(self.nwords):
            _col(buf, o + 8 * j, 8)[:] = words[:, j]


def field_view(arr: np.ndarray, name: str, dtype: str, count: int = 1, skip: int = 0) -> np.ndarray:
    """A structured array's field reinterpreted without a copy: ``count`` items of ``dtype``
    starting ``skip`` bytes into the field (e.g. an address's 16-bit groups as ``'>u2'``, 8)."""
    off = arr.dtype.fields[name][1] + skip
    dt = np.dtype(dtype)
    base = arr.view(np.uint8).reshape(len(arr), arr.dtype.itemsize) if len(arr) else np.zeros((0, arr.dtype.itemsize), np.uint8)
    sub = base[:, off:off + dt.itemsize * count]
    v = sub.view(dt)
    return v[:, 0] if count == 1 else v


class TextSlot:
    """A quoted string column from :class:`Text` (general, slower; text must need no escaping)."""

    def __init__(self, t: Text, null: np.ndarray | None = None) -> None:
        self.t = t
        self.null = null if null is not None and null.any() else None
        self.width = max(t.width + 2, 4 if self.null is not None else 0)

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        tb, tl = self.t.buf[a:b], self.t.lens[a:b]
        w = self.t.width
        buf[:, off] = ord('"')
        buf[:, off + 1:off + 1 + w] = np.where(tb == 0, np.uint8(SPACE), tb)
        buf[:, off + 1 + w:off + self.width] = SPACE
        buf[np.arange(b - a), off + 1 + tl] = ord('"')
        if self.null is not None:
            _nullify(buf, off, self.width, self.null[a:b])


class Tokens:
    """A slot of pre-rendered JSON by code (``'"established"'``, ``'["dnat"]'``, ``'true'``)."""

    def __init__(self, codes: np.ndarray | Callable[[int, int], np.ndarray], tokens: Sequence[str | bytes],
                 used: np.ndarray | None = None) -> None:
        enc = [t.encode() if isinstance(t, str) else bytes(t) for t in tokens]
        if used is not None:  # only the codes that occur decide the width
            width = max((len(enc[i]) for i in np.flatnonzero(used)), default=1)
            enc = [t if used[i] else b"" for i, t in enumerate(enc)]
        else:
            width = None
        self.table = PaddedStrings(enc, width)
        self.width = self.table.width
        self.codes = codes

    def fill(self, buf: np.ndarray, off: int, a: int, b: int) -> None:
        c = self.codes(a, b) if callable(self.codes) else self.codes[a:b]
        self.table.put(buf, off, c.astype(np.intp, copy=False))


def used_codes(values: np.ndarray, size: int = 256) -> np.ndarray:
    """Which of ``size`` small codes occur (a bool mask)."""
    return np.bincount(np.asarray(values).astype(np.intp, copy=False), minlength=size)[:size] > 0


def categorize(values: np.ndarray, limit: int = 4096) -> tuple[np.ndarray, np.ndarray] | None:
    """(code per row, distinct values) when there are at most ``limit`` distinct values."""
    v = np.asarray(values)
    if len(v) == 0:
        return np.zeros(0, np.intp), np.zeros(0, v.dtype)
    if v.dtype.kind in "ui" and int(v.min()) >= 0 and int(v.max()) < (1 << 22):
        vi = v.astype(np.intp, copy=False)
        present = np.zeros(int(vi.max()) + 1, bool)
        present[vi] = True
        uniq = np.flatnonzero(present)
        if len(uniq) > limit:
            return None
        lut = np.zeros(len(present), np.intp)
        lut[uniq] = np.arange(len(uniq))
        return lut[vi], uniq.astype(v.dtype)
    uniq, inv = np.unique(v, return_inverse=True)
    if len(uniq) > limit:
        return None
    return inv.astype(np.intp), uniq


class Rows:
    """One JSON object per row: literals and slots in order, written a chunk of rows at a time."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._items: list[bytes | object] = []

    def lit(self, text: str | bytes) -> None:
        b = text.encode() if isinstance(text, str) else text
        if self._items and isinstance(self._items[-1], bytes):
            self._items[-1] += b
        else:
            self._items.append(b)

    def key(self, name: str, first: bool = False) -> None:
        self.lit(("" if first else ",") + f'"{name}":')

    def slot(self, s: object) -> None:
        """Anything with ``width`` and ``fill(buf, off, a, b)`` (rows a:b into buf[:b-a])."""
        self._items.append(s)

    def number(self, values: np.ndarray, null: np.ndarray | None = None, *, hi: int | None = None) -> None:
        self.slot(Number(values, null, hi=hi))

    def tokens(self, codes: np.ndarray | Callable[[int, int], np.ndarray], tokens: Sequence[str | bytes],
               used: np.ndarray | None = None) -> None:
        self.slot(Tokens(codes, tokens, used))

    def address(self, source: np.ndarray, family: int, null: np.ndarray | None = None) -> None:
        if null is None or not null.any():
            self.lit('"')
        self.slot(Address(source, family, null))

    def string(self, t: Text, null: np.ndarray | None = None) -> None:
        self.slot(TextSlot(t, null))

    def _layout(self, sep: bytes) -> tuple[np.ndarray, list[tuple[int, object]]]:
        tmpl = bytearray()
        slots = []
        for it in self._items:
            if isinstance(it, bytes):
                tmpl += it
            else:
                slots.append((len(tmpl), it))
                tmpl += b" " * it.width  # type: ignore[attr-defined]
        tmpl += sep
        return np.frombuffer(bytes(tmpl), np.uint8), slots

    def width(self, sep: bytes = b",\n") -> int:
        """Bytes per row, ``sep`` included (every row of a table has the same width)."""
        return len(self._layout(sep)[0])

    def writer(self, sep: bytes = b",\n", chunk: int = CHUNK) -> ChunkWriter:
        """A :class:`ChunkWriter` over these rows: any chunk of rows, in any order (what
        :func:`write_ordered`'s workers need; :meth:`chunks` walks it in order)."""
        return ChunkWriter(self, sep, chunk)

    def chunks(self, sep: bytes = b",\n", chunk: int = CHUNK) -> Iterator[memoryview]:
        """Yield memoryviews of consecutive chunks of rows, each row followed by ``sep`` except
        the last row of all; a yielded view is valid until the next one is asked for.

        (Formatting chunks on two threads was tried: the GIL between NumPy calls on 4096-row
        arrays made it slower than one thread; :func:`write_ordered` uses processes.)"""
        if self.n == 0:
            return
        w = self.writer(sep, chunk)
        for a in range(0, self.n, w.rows):
            yield w.render(a)

    def build(self, sep: bytes = b",\n") -> memoryview:
        """All rows in one buffer (small outputs, tests)."""
        return memoryview(b"".join(bytes(c) for c in self.chunks(sep)))  # type: ignore[attr-defined]


class ChunkWriter:
    """Renders any chunk of a :class:`Rows` into one reused buffer: the template is written once,
    the slots overwrite their bytes for every chunk."""

    def __init__(self, rows: Rows, sep: bytes, chunk: int = CHUNK) -> None:
        self.n, self.sep = rows.n, sep
        tmpl, self.slots = rows._layout(sep)
        self.W = len(tmpl)
        self.rows = max(1, min(chunk, self.n))
        self.buf = np.empty((self.rows, self.W), np.uint8)
        self.buf[:] = tmpl
        self.flat = self.buf.reshape(-1)

    def render(self, a: int) -> memoryview:
        """Rows ``a`` to ``a + rows`` (fewer at the end), each followed by ``sep`` except the last
        row of all; valid until the next call."""
        b = min(a + self.rows, self.n)
        view = self.buf[: b - a]
        for off, s in self.slots:
            s.fill(view, off, a, b)  # type: ignore[attr-defined]
        size = (b - a) * self.W - (len(self.sep) if b == self.n else 0)
        return memoryview(self.flat)[:size]


# ---- writing chunks in order from several processes ------------------------------------------

def _write_all(fd: int, data: memoryview | bytes) -> None:
    mv = memoryview(data).cast("B")
    while mv:
        mv = mv[os.write(fd, mv):]


class WorkerFailed(RuntimeError):
    """A worker process of :func:`write_ordered` failed (its message says how)."""


def write_ordered(fd: int, jobs: Sequence[Callable[[], memoryview | bytes]], workers: int = 2) -> None:
    """Write ``jobs[0]()``, ``jobs[1]()``, ... to file descriptor ``fd`` in order, the jobs run
    round-robin by ``workers`` processes (this one and ``workers - 1`` forked children).

    Why processes: the formatting is NumPy calls on 4096-row chunks, and threads spend their time
    waiting for the GIL between them (tried: slower than one thread).  Forked children share the
    parent's arrays without a copy.  Order: a baton (one byte) goes round a ring of pipes; a
    worker renders its next chunk while the others write, and writes only when the baton arrives,
    so the output is exactly the serial one, to a file, a pipe or a terminal alike, with one chunk
    per worker in memory.  A child that fails or finds ``fd`` closed breaks the ring: the parent
    raises :class:`WorkerFailed` (or BrokenPipeError); the parent's own failure kills its
    children.  Anything buffered above ``fd`` must be flushed first.
    """
    workers = max(1, min(workers, len(jobs)))
    if workers == 1:
        for job in jobs:
            _write_all(fd, job())
        return
    ring = [os.pipe() for _ in range(workers)]  # worker w reads ring[w], passes on to ring[w + 1]
    err_r, err_w = os.pipe()
    mine = {ring[0][0], ring[1][1], err_r}  # the ends this process keeps once the children run
    opened = {err_r, err_w, *(end for pair in ring for end in pair)}
    pids: list[int] = []
    try:
        for w in range(1, workers):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, reported through err_w / exit status
                code = 1
                try:
                    keep = {ring[w][0], ring[(w + 1) % workers][1], err_w}
                    for end in opened - keep:  # a dead neighbour must read as end of file
                        os.close(end)
                    _ring_worker(fd, jobs, w, workers, ring)
                    code = 0
                except BrokenPipeError:
                    code = 32
                except BaseException as exc:  # noqa: BLE001 - reported to the parent, never a traceback here
                    with contextlib.suppress(OSError):
                        os.write(err_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
                os._exit(code)
            pids.append(pid)
        for end in opened - mine:
            os.close(end)
        opened &= mine
        broken = False
        try:
            _ring_worker(fd, jobs, 0, workers, ring)
        except _RingBroken:
            broken = True  # a child stopped: its exit status says why (below)
        failed = 0
        for pid in list(pids):
            _, status = os.waitpid(pid, 0)
            pids.remove(pid)
            failed = failed or os.waitstatus_to_exitcode(status)
        if failed == 32:
            raise BrokenPipeError(errno.EPIPE, "output closed")
        if failed or broken:
            msg = os.read(err_r, 4096).decode(errors="replace") or f"exit status {failed}"
            raise WorkerFailed(f"an output worker process failed: {msg}")
    finally:
        for pid in pids:  # this process failed: stop the children it started
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        for end in opened:
            os.close(end)


class _RingBroken(Exception):
    """The ring of batons is broken: a neighbour of this worker stopped."""


def _ring_worker(fd: int, jobs: Sequence[Callable[[], memoryview | bytes]], w: int, workers: int,
                 ring: list[tuple[int, int]]) -> None:
    """Worker ``w``'s share of :func:`write_ordered`: jobs w, w + workers, ..."""
    inbox = ring[w][0]
    outbox = ring[(w + 1) % workers][1]
    for j in range(w, len(jobs), workers):
        data = jobs[j]()
        if j and not os.read(inbox, 1):
            raise _RingBroken()
        _write_all(fd, data)
        if j + 1 < len(jobs):
            try:
                os.write(outbox, b"x")
            except BrokenPipeError:
                raise _RingBroken() from None



def digits(values: np.ndarray, width: int | None = None) -> np.ndarray:
    """Non-negative integers as right-aligned decimal text in a (n, width) uint8 matrix, NUL-padded
    on the left.  ``width`` defaults to the widest value."""
    v = np.asarray(values)
    top = int(v.max()) if len(v) else 0
    w = width or max(1, len(str(top)))
    out = _digits_matrix(v, w, False)
    out[out == SPACE] = PAD
    return out


def signed_digits(values: np.ndarray) -> np.ndarray:
    """Integers (possibly negative) right-aligned, with a '-' before the first digit (NUL-padded)."""
    v = np.asarray(values, dtype=np.int64)
    n = Number(v)
    buf = np.zeros((len(v), n.width), np.uint8)
    if len(v):
        n.fill(buf, 0, 0, len(v))
    buf[buf == SPACE] = PAD
    return buf

