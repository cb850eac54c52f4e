"""The policy programmer: one node's ``policy`` and ``prefix-segment`` entries from PolicyInputs.

The agent owns one ``PolicyProgrammer`` and hands it to ``desired_maps``. It keeps a Resolver, whose
per-policy cache survives reconciles (one policy change re-resolves one policy), and its last
assembly (an unchanged world costs one fingerprint). Neither cache changes a result: the entries
depend on the inputs and the map capacities only. ``pressure`` is the last assembly's map pressure,
for the agent's status, metrics and log.
"""

from __future__ import annotations

import threading

from lace.datapath import registry

from .model import PolicyInputs
from .resolve import Pressure, Resolution, Resolver

Entries = dict[bytes, bytes]


def node_segments(inputs: PolicyInputs, node: str) -> set[int]:
    """The segments of the pods on ``node``: the subjects its policy map needs entries for."""
    return {p.segment for p in inputs.pods if p.node == node}


def assemble(res: Resolution, inputs: PolicyInputs, node: str, capacity: int | None = None,
             prefix_capacity: int | None = None) -> tuple[Entries, Entries, Pressure]:
    """(policy entries, prefix-segment entries, pressure) of ``node`` from a resolution, cut to the
    maps' capacities (default: the registry's)."""
    cap = registry.get("policy").max_entries if capacity is None else capacity
    pcap = registry.get("prefix-segment").max_entries if prefix_capacity is None else prefix_capacity
    entries, pr = res.entries(node_segments(inputs, node), cap)
    prefixes, pr.prefix_desired, pr.prefix_dropped = res.prefix_entries(pcap)
    pr.prefix_capacity = pcap
    return entries, prefixes, pr


class PolicyProgrammer:
    """What one node's policy maps should hold; see the module docstring."""

    def __init__(self, node: str, *, capacity: int | None = None, prefix_capacity: int | None = None) -> None:
        self.node = node
        self.capacity = registry.get("policy").max_entries if capacity is None else capacity
        self.prefix_capacity = (registry.get("prefix-segment").max_entries if prefix_capacity is None
                                else prefix_capacity)
        #: the last assembly's pressure (None before the first)
        self.pressure: Pressure | None = None
        self._resolver = Resolver()
        self._last: tuple[tuple, Entries, Entries] | None = None
        self._lock = threading.Lock()

    def entries(self, inputs: PolicyInputs) -> tuple[Entries, Entries]:
        """(policy entries, prefix-segment entries) for this node; see lace.policy.resolve."""
        with self._lock:
            res = self._resolver.resolve(inputs)
            fingerprint = (res.version, frozenset(node_segments(inputs, self.node)),
                           tuple(sorted(inputs.network_ids)))
            if self._last is not None and self._last[0] == fingerprint:
                return self._last[1], self._last[2]
            entries, prefixes, self.pressure = assemble(res, inputs, self.node, self.capacity,
                                                        self.prefix_capacity)
            self._last = (fingerprint, entries, prefixes)
            return entries, prefixes
