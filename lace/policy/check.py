"""Compare what nodes have programmed with what the store's policies imply (``lace policy trace``,
the e2e tier's "maps settled" condition, ``node bpf show policy`` pressure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lace.datapath.policy import EXACT_MAP, TRIE_MAP, policy_maps

from .emulate import PolicyMaps, read_node_maps
from .model import PolicyInputs
from .program import assemble
from .resolve import Pressure, Resolution, resolve
from .sources import inputs_from_store


@dataclass
class NodeDrift:
    """Entries a node's maps lack, hold extra, or hold with another value, against the store."""

    node: str
    missing: list[bytes] = field(default_factory=list)
    extra: list[bytes] = field(default_factory=list)
    differ: list[bytes] = field(default_factory=list)
    prefix_missing: int = 0
    prefix_extra: int = 0
    pressure: Pressure | None = None

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.differ or self.prefix_missing or self.prefix_extra)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "in_sync": not self, "missing": len(self.missing), "extra": len(self.extra),
                "differ": len(self.differ), "prefix_missing": self.prefix_missing,
                "prefix_extra": self.prefix_extra,
                "pressure": self.pressure.as_dict() if self.pressure else None}


def drift(res: Resolution, inputs: PolicyInputs, maps: PolicyMaps) -> NodeDrift:
    """What node ``maps.node``'s maps hold against what the store implies: both policy maps entry
    by entry (each in the map the agent writes it to), prefix-segment by count."""
    want, want_pfx, pr = assemble(res, inputs, maps.node)
    d = NodeDrift(maps.node, pressure=pr)
    split = policy_maps(want)
    for name, have in ((TRIE_MAP, maps.policy), (EXACT_MAP, maps.policy_exact)):
        wanted = split[name]
        for k, v in wanted.items():
            cur = have.get(k)
            if cur is None:
                d.missing.append(k)
            elif cur[:8] != v[:8]:    # hits are the datapath's, never compared
                d.differ.append(k)
        d.extra += [k for k in have if k not in wanted]
    d.prefix_missing = sum(1 for k, v in want_pfx.items() if maps.prefix_segment.get(k) != v)
    d.prefix_extra = sum(1 for k in maps.prefix_segment if k not in want_pfx)
    return d


def lab_drift(store: Any, pin_roots: dict[str, str]) -> dict[str, NodeDrift]:
    """Per lab node (name -> pin root): how its pinned maps differ from the store's policies."""
    inputs = inputs_from_store(store)
    res = resolve(inputs)
    return {node: drift(res, inputs, read_node_maps(node, root)) for node, root in sorted(pin_roots.items())}
