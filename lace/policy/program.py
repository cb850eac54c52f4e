"""The policy programmer: one node's policy (``policy`` and ``policy-exact``) and ``prefix-segment``
entries from PolicyInputs.

The agent owns one ``PolicyProgrammer`` and hands it to ``desired_maps``. It keeps a Resolver, whose
per-policy cache survives reconciles (one policy change re-resolves one policy), and its last
assembly (an unchanged world costs one fingerprint). Neither cache changes a result: the entries
depend on the inputs and the map capacities only. ``pressure`` is the last assembly's map pressure,
for the agent's status, metrics and log. The resolver's entries are one dict; what each of the two
policy maps holds of them is ``lace.datapath.policy.policy_maps``'s split, which the capacity
counts as one budget (each map can take all of it).
"""

from __future__ import annotations

import threading

from lace.datapath import registry
from lace.datapath.policy import policy_maps

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
    return assemble_subjects(res, node_segments(inputs, node), capacity, prefix_capacity)


def assemble_subjects(res: Resolution, subjects: set[int], capacity: int | None = None,
                      prefix_capacity: int | None = None) -> tuple[Entries, Entries, Pressure]:
    """``assemble`` for a node whose pods have the segments ``subjects``."""
    cap = registry.get("policy").max_entries if capacity is None else capacity
    pcap = registry.get("prefix-segment").max_entries if prefix_capacity is None else prefix_capacity
    entries, pr = res.entries(subjects, cap)
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
        #: the last resolution, and the last assembly: (fingerprint, entries, prefix-segment
        #: entries, each policy map's entries)
        self._res: Resolution | None = None
        self._last: tuple[tuple, Entries, Entries, dict[str, Entries]] | None = None
        self._lock = threading.Lock()

    def _assemble(self, inputs: PolicyInputs) -> tuple[tuple, Entries, Entries, dict[str, Entries]]:
        with self._lock:
            res = self._res = self._resolver.resolve(inputs)
            fingerprint = (res.version, frozenset(node_segments(inputs, self.node)),
                           tuple(sorted(inputs.network_ids)))
            if self._last is not None and self._last[0] == fingerprint:
                return self._last
            entries, prefixes, self.pressure = assemble(res, inputs, self.node, self.capacity,
                                                        self.prefix_capacity)
            self._last = (fingerprint, entries, prefixes, policy_maps(entries))
            return self._last

    def entries(self, inputs: PolicyInputs) -> tuple[Entries, Entries]:
        """(policy entries as one dict, prefix-segment entries) for this node; see lace.policy.resolve."""
        _, entries, prefixes, _ = self._assemble(inputs)
        return entries, prefixes

    def map_entries(self, inputs: PolicyInputs) -> tuple[dict[str, Entries], Entries]:
        """(each policy map's entries by CLI name, prefix-segment entries) for this node, as the
        agent writes them."""
        _, _, prefixes, maps = self._assemble(inputs)
        return maps, prefixes

    def resubject(self, before: set[int], after: set[int]) -> tuple[dict[str, Entries], dict[str, Entries]] | None:
        """Each policy map's entries for this node with its pods' segments ``before`` and ``after``
        (its subjects), both from the last resolution: for a pass that changes nothing but which
        segments have pods on this node (lace.agent.podsync checks that the segments, their named
        ports and the ipBlocks' pods are the ones the resolution saw). The first is the last
        assembly's; the second becomes the last assembly, with its pressure. None before the first
        assembly, or when the last one was not made for the subjects ``before``."""
        with self._lock:
            res, last = self._res, self._last
            if res is None or last is None or last[0][:2] != (res.version, frozenset(before)):
                return None
            entries, prefixes, pressure = assemble_subjects(res, after, self.capacity, self.prefix_capacity)
            maps = policy_maps(entries)
            self._last = ((res.version, frozenset(after), last[0][2]), entries, prefixes, maps)
            self.pressure = pressure
            return last[3], maps
