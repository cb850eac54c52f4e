"""A conntrack table as ``node ct`` works on it: dumped in one batch sequence and decoded into
NumPy columns (what ``ct list``'s JSON and text writers and ``ct gc`` share)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lace.datapath.conntrack import CT4_KEY, CT6_KEY, CT_ENTRY


@dataclass
class CtDump:
    """One conntrack table as dumped: its decoded key and entry columns (NumPy structured arrays)."""

    name: str
    family: int
    keys: np.ndarray
    vals: np.ndarray
    capacity: int

    @property
    def count(self) -> int:
        return len(self.keys)


def dump_table(name: str, m: Any) -> CtDump:
    """Dump conntrack table ``name`` from its open map ``m`` (closed here)."""
    family = 6 if name.endswith("v6") else 4
    layout = CT6_KEY if family == 6 else CT4_KEY
    with m:
        kb, vb, n = m.dump()
        cap = m.max_entries
    # the dump's buffers are a fresh mapping per dump that lives as long as these views: no copy
    keys = layout.decode_many(kb, n)
    vals = CT_ENTRY.decode_many(vb, n)
    return CtDump(name, family, keys, vals, cap)


def take(t: CtDump, count: int, start: int = 0) -> CtDump:
    """Rows ``start`` to ``start + count`` of a dump (views, no copy)."""
    return CtDump(t.name, t.family, t.keys[start:start + count], t.vals[start:start + count], t.capacity)
