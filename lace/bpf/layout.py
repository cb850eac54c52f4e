"""Declarative binary layouts for BPF map keys and values.

A :class:`Layout` names the C struct it mirrors and lists its fields in order; offsets follow C
natural alignment, so a mirror reads like the header it copies.  The same layout packs and unpacks
single records (``struct``) and decodes whole batch dumps at once (a NumPy structured dtype), which
is what keeps a 1M-entry dump fast.  It knows nothing about lace.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

# kind -> (struct code, size, alignment, numpy dtype)
_SCALARS: dict[str, tuple[str, int, int, str]] = {
    "u8": ("B", 1, 1, "u1"),
    "u16": ("H", 2, 2, "<u2"),
    "u32": ("I", 4, 4, "<u4"),
    "u64": ("Q", 8, 8, "<u8"),
    "s32": ("i", 4, 4, "<i4"),
    "s64": ("q", 8, 8, "<i8"),
    # network byte order: stored big-endian, presented as host integers
    "be16": ("H", 2, 2, ">u2"),
    "be32": ("I", 4, 4, ">u4"),
}


@dataclass(frozen=True)
class Field:
    """One field of a layout: name, kind (``u32``, ``be16``, ``bytes``, ``pad``), offset, size."""

    name: str
    kind: str
    offset: int
    size: int
    #: an array of structs (kind ``array:struct NAME[N]``): the element's layout and N
    element: Layout | None = None
    count: int = 0

    @property
    def is_padding(self) -> bool:
        return self.kind == "pad"


def _parse_kind(spec: str | tuple[Layout, int]) -> tuple[str, int, int]:
    """``u32`` -> (u32, 4, 4); ``bytes:16`` -> (bytes, 16, 1); ``pad:3`` -> (pad, 3, 1);
    (element layout, N) -> (array:struct NAME[N], N x its size, its alignment)."""
    if isinstance(spec, tuple):
        element, n = spec
        return f"array:{element.c_name}[{n}]", element.size * n, element.align
    if ":" in spec:
        kind, _, n = spec.partition(":")
        if kind not in ("bytes", "pad"):
            raise ValueError(f"unknown field kind {spec!r}")
        return kind, int(n), 1
    if spec not in _SCALARS:
        raise ValueError(f"unknown field kind {spec!r}")
    _, size, align, _ = _SCALARS[spec]
    return spec, size, align


class Layout:
    """The byte layout of one C struct, with explicit padding; see the module docstring."""

    def __init__(self, c_name: str, fields: Sequence[tuple[str, str | tuple[Layout, int]]], *,
                 packed: bool = False):
        self.c_name = c_name
        out: list[Field] = []
        offset = 0
        max_align = 1
        for name, spec in fields:
            kind, size, align = _parse_kind(spec)
            if packed:
                align = 1
            offset = (offset + align - 1) // align * align
            if isinstance(spec, tuple):
                out.append(Field(name, kind, offset, size, spec[0], spec[1]))
            else:
                out.append(Field(name, kind, offset, size))
            offset += size
            max_align = max(max_align, align)
        self.align = max_align
        self.size = (offset + max_align - 1) // max_align * max_align
        self.fields: tuple[Field, ...] = tuple(out)
        self.names = tuple(f.name for f in out if not f.is_padding)
        self._known = frozenset(self.names)
        self._by_name = {f.name: f for f in out}
        fmt = "<"
        pos = 0
        self._conv: list[tuple[str, str]] = []
        for f in out:
            if f.offset > pos:
                fmt += f"{f.offset - pos}x"
            if f.kind == "pad":
                fmt += f"{f.size}x"
            elif f.kind == "bytes" or f.element is not None:
                fmt += f"{f.size}s"
                self._conv.append((f.name, "bytes" if f.element is None else "array"))
            else:
                fmt += _SCALARS[f.kind][0]
                self._conv.append((f.name, f.kind))
            pos = f.offset + f.size
        if self.size > pos:
            fmt += f"{self.size - pos}x"
        self._struct = struct.Struct(fmt)
        assert self._struct.size == self.size, (c_name, self._struct.size, self.size)
        self.dtype = np.dtype(
            {
                "names": [f.name for f in out if not f.is_padding],
                "formats": [
                    (f"V{f.size}" if f.kind == "bytes" or f.element is not None else _SCALARS[f.kind][3])
                    for f in out
                    if not f.is_padding
                ],
                "offsets": [f.offset for f in out if not f.is_padding],
                "itemsize": self.size,
            }
        )

    def __repr__(self) -> str:
        return f"Layout({self.c_name}, size={self.size})"

    @property
    def struct(self) -> struct.Struct:
        """The compiled record format: little-endian, fields in order (``be16`` fields read as their
        raw little-endian u16), padding skipped — for a hand-tuned decoder of one hot record."""
        return self._struct

    def field(self, name: str) -> Field:
        return self._by_name[name]

    def pack(self, values: Mapping[str, Any] | None = None, **kw: Any) -> bytes:
        """Pack a record; missing fields are zero, unknown names are an error."""
        merged = dict(values, **kw) if values else kw
        if not merged.keys() <= self._known:
            raise KeyError(f"{self.c_name} has no field(s) {sorted(set(merged) - self._known)}")
        args = []
        for name, kind in self._conv:
            v = merged.get(name)
            if kind == "bytes":
                args.append(bytes(v) if v is not None else b"")
            elif kind == "array":   # a list of the element's records, the rest zero
                f = self._by_name[name]
                items = list(v or ())
                if len(items) > f.count:
                    raise ValueError(f"{self.c_name}.{name} holds {f.count} records, not {len(items)}")
                args.append(b"".join(f.element.pack(r) for r in items))   # type: ignore[union-attr]
            elif v is None:
                args.append(0)
            elif kind == "be16":
                args.append(int.from_bytes(int(v).to_bytes(2, "big"), "little"))
            elif kind == "be32":
                args.append(int.from_bytes(int(v).to_bytes(4, "big"), "little"))
            else:
                args.append(int(v))
        return self._struct.pack(*args)

    def unpack(self, data: bytes | bytearray | memoryview) -> dict[str, Any]:
        """Unpack one record into a dict of field name -> int or bytes."""
        vals = self._struct.unpack_from(data)
        out: dict[str, Any] = {}
        for (name, kind), v in zip(self._conv, vals):
            if kind == "be16":
                v = int.from_bytes(v.to_bytes(2, "little"), "big")
            elif kind == "be32":
                v = int.from_bytes(v.to_bytes(4, "little"), "big")
            elif kind == "array":
                el = self._by_name[name].element
                v = [el.unpack(v[i:i + el.size]) for i in range(0, len(v), el.size)]   # type: ignore[union-attr]
            out[name] = v
        return out

    def decode_many(self, data: bytes | bytearray | memoryview, count: int) -> np.ndarray:
        """Decode ``count`` consecutive records at once (a structured array over ``data``)."""
        return np.frombuffer(data, dtype=self.dtype, count=count)

    def encode_many(self, records: Iterable[Mapping[str, Any]]) -> bytes:
        return b"".join(self.pack(r) for r in records)
