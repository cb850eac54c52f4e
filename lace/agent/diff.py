"""The pure diff between desired and actual map contents: what to write and what to delete."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .desired import Entries

#: per-map view of a value for comparison: fields the datapath itself changes are masked out
#: (policy hit counters, in both policy maps), so reconciling never resets them
COMPARE: dict[str, Callable[[bytes], bytes]] = {
    "policy": lambda v: bytes(v[:8]),
    "policy-exact": lambda v: bytes(v[:8]),
}


@dataclass
class MapChanges:
    updates: dict[bytes, bytes] = field(default_factory=dict)
    deletes: list[bytes] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.updates or self.deletes)


def diff(name: str, desired: Entries, actual: Entries) -> MapChanges:
    view = COMPARE.get(name, bytes)
    ch = MapChanges()
    for k, v in desired.items():
        cur = actual.get(k)
        if cur is None or view(cur) != view(v):
            ch.updates[k] = v
    ch.deletes = [k for k in actual if k not in desired]
    return ch


def diff_all(desired: dict[str, Entries], actual: dict[str, Entries]) -> dict[str, MapChanges]:
    return {name: diff(name, want, actual.get(name, {})) for name, want in desired.items()}
