"""What the agent programs: one node's ``policy`` and ``prefix-segment`` entries from PolicyInputs.

Holds the process's Resolver (its per-policy cache survives reconciles, so one policy change
re-resolves one policy) and the last assembly per node (an unchanged world costs one fingerprint).
Map pressure per node is kept in ``LAST_PRESSURE`` and logged when a map is full (MAP_FULL).
"""

from __future__ import annotations

import logging
import threading

from lace.datapath import registry

from .model import PolicyInputs
from .resolve import Pressure, Resolution, Resolver

log = logging.getLogger("lace.policy")

_lock = threading.Lock()
_resolver = Resolver()
_assembled: dict[str, tuple[tuple, dict[bytes, bytes], dict[bytes, bytes], Pressure]] = {}
#: node -> the pressure of the last assembly (for status, metrics and the CLI)
LAST_PRESSURE: dict[str, Pressure] = {}
LAST_RESOLUTION: dict[str, Resolution] = {}


def capacities() -> tuple[int, int]:
    return registry.get("policy").max_entries, registry.get("prefix-segment").max_entries


def node_segments(inputs: PolicyInputs, node: str) -> set[int]:
    return {p.segment for p in inputs.pods if p.node == node}


def desired_policy(inputs: PolicyInputs, node: str) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """(policy entries, prefix-segment entries) for ``node``; see lace.policy.resolve."""
    cap, pcap = capacities()
    with _lock:
        res = _resolver.resolve(inputs)
        local = node_segments(inputs, node)
        ck = (res.version, frozenset(local), cap, pcap, tuple(sorted(inputs.network_ids)))
        hit = _assembled.get(node)
        if hit and hit[0] == ck:
            return hit[1], hit[2]
        entries, pr = res.entries(local, cap)
        prefixes, pr.prefix_desired, pr.prefix_dropped = res.prefix_entries(pcap)
        pr.prefix_capacity = pcap
        prev = LAST_PRESSURE.get(node)
        if pr.reason and (prev is None or (prev.dropped, prev.prefix_dropped) != (pr.dropped, pr.prefix_dropped)):
            log.warning("node %s: policy map full (%s): %d of %d entries programmed, %d allow entries left out "
                        "(%s); %d prefix-segment entries left out", node, pr.reason, pr.programmed, pr.desired,
                        pr.dropped, ", ".join(f"{k}: {v}" for k, v in sorted(pr.dropped_by_policy.items())),
                        pr.prefix_dropped)
        LAST_PRESSURE[node] = pr
        LAST_RESOLUTION[node] = res
        _assembled[node] = (ck, entries, prefixes, pr)
        return entries, prefixes
