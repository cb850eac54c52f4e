"""The datapath's policy decision replayed in Python over map contents (raw key -> value bytes),
exactly as bpf/lib/segment.h, bpf/lib/routing.h and bpf/lib/policy.h look them up: LPM tries are
matched bit for bit on the raw key, hashes by the exact key, the policy hash probed only for the
kinds of entries its marker names, so the emulation cannot drift from the key layouts or the
lookup order."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from lace.datapath.common import (NETWORK_OUTSIDE, SEGMENT_ANY, SEGMENT_SELECTED, SEGMENT_UNKNOWN, SEGMENT_WORLD,
                                  Direction)
from lace.datapath.policy import (ANY_PEER_SHIFT, EXACT_MAP, TRIE_MAP, PolicyFlag, decode_policy_entry,
                                  decode_policy_key, lookup_key, policy_keys, policy_maps, selected_key)
from lace.datapath.routing import decode_route, routing_key
from lace.datapath.segment import (decode_prefix_segment_key, decode_segment_value, prefix_segment_key,
                                   segment_key)

from .model import IPAddr

Entries = dict[bytes, bytes]


class LpmTable:
    """An LPM trie's entries; ``lookup`` returns the longest prefix matching a full-length key."""

    def __init__(self, entries: Entries) -> None:
        self.by_len: dict[int, dict[int, tuple[bytes, bytes]]] = {}
        self.width = 0
        for k, v in entries.items():
            plen = struct.unpack_from("<I", k)[0]
            data = k[4:]
            self.width = max(self.width, len(data) * 8)
            bits = len(data) * 8
            prefix = int.from_bytes(data, "big") >> (bits - plen) if plen else 0
            self.by_len.setdefault(plen, {})[prefix] = (k, v)
        self.lengths = sorted(self.by_len, reverse=True)

    def lookup(self, key: bytes) -> tuple[bytes, bytes] | None:
        plen_max = struct.unpack_from("<I", key)[0]
        data = key[4:]
        bits = len(data) * 8
        value = int.from_bytes(data, "big")
        for plen in self.lengths:
            if plen > plen_max:
                continue
            hit = self.by_len[plen].get(value >> (bits - plen) if plen else 0)
            if hit is not None:
                return hit
        return None


@dataclass
class PolicyMaps:
    """The entries of one node's maps that a policy decision reads (``policy trace``, the drift
    check), with the datapath's lookups over them; :func:`read_node_maps` fills it from the node's
    pins through :class:`lace.datapath.node.PinnedMaps`, :meth:`from_entries` from one dict of
    policy entries as the resolver makes them. ``policy`` is the trie (port blocks),
    ``policy_exact`` the hash (markers and every other entry)."""

    node: str
    policy: Entries
    segment: Entries
    prefix_segment: Entries
    routing: Entries = field(default_factory=dict)
    capacity: int | None = None
    policy_exact: Entries = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._policy = LpmTable(self.policy)
        self._pfx = LpmTable(self.prefix_segment)
        self._routing = LpmTable(self.routing)

    @classmethod
    def from_entries(cls, node: str, policy: Entries, segment: Entries, prefix_segment: Entries,
                     routing: Entries | None = None, capacity: int | None = None) -> PolicyMaps:
        """The maps an agent writes for ``policy`` (one dict, keys as policy_keys makes them)."""
        split = policy_maps(policy)
        return cls(node, split[TRIE_MAP], segment, prefix_segment, dict(routing or {}), capacity,
                   policy_exact=split[EXACT_MAP])

    # -- bpf/lib/routing.h -------------------------------------------------------------------------
    def route(self, src_network: int, ip: IPAddr) -> int | None:
        hit = self._routing.lookup(routing_key(src_network, f"{ip}/{ip.max_prefixlen}"))
        return decode_route(hit[1])["dst_network"] if hit else None

    # -- bpf/lib/segment.h -------------------------------------------------------------------------
    def segment_of(self, network: int, ip: IPAddr) -> tuple[int, str]:
        """(segment, how it was found) as segment_resolve() does."""
        v = self.segment.get(segment_key(network, ip))
        if v is not None:
            return decode_segment_value(v)["segment"], "endpoint"
        hit = self._pfx.lookup(prefix_segment_key(network, f"{ip}/{ip.max_prefixlen}"))
        if hit is not None:
            return decode_segment_value(hit[1])["segment"], f'prefix {decode_prefix_segment_key(hit[0])["prefix"]}'
        if network == NETWORK_OUTSIDE:
            return SEGMENT_WORLD, "world (no prefix, routed outside)"
        return SEGMENT_UNKNOWN, "unknown (no endpoint or prefix)"

    # -- bpf/lib/policy.h policy_match() and policy_check() ----------------------------------------
    def _match(self, has: int, subject: int, peer: int, direction: Direction, proto: int,
               dport: int) -> tuple[bytes, bytes] | None:
        """(key, value) of the entry policy_match() finds, probing the kinds ``has`` names."""
        key = lookup_key(subject, peer, direction, proto, dport)
        if has & PolicyFlag.PORTS and key in self.policy_exact:
            return key, self.policy_exact[key]
        if has & PolicyFlag.BLOCKS:
            hit = self._policy.lookup(key)
            if hit is not None:
                return hit
        for flag, any_proto in ((PolicyFlag.PROTOS, False), (PolicyFlag.ANY_PROTO, True)):
            if has & flag:
                (key,) = policy_keys(subject, peer, direction, None if any_proto else proto)
                if key in self.policy_exact:
                    return key, self.policy_exact[key]
        return None

    def check(self, subject: int, peer: int, direction: Direction, proto: int, dport: int) -> dict[str, Any]:
        """One direction's decision as policy_check() makes it: ``verdict`` (allow, deny, audit),
        ``selected`` and the ``marker``; for an allow by a rule its ``entry`` (key and value fields),
        ``policy_id`` and ``rule``."""
        out: dict[str, Any] = {"node": self.node, "subject": subject, "peer": peer,
                               "direction": direction.label}
        marker = self.policy_exact.get(selected_key(subject, direction))
        if marker is None:
            out.update(verdict="allow", selected=False)
            return out
        m = decode_policy_entry(marker)
        out.update(selected=True, marker=m, audit_mode="audit" in m["flags"])
        if proto in (1, 58):
            dport = 0
        has = _flags(marker)
        hit = None
        if peer != SEGMENT_SELECTED:
            if peer != SEGMENT_ANY:
                hit = self._match(has, subject, peer, direction, proto, dport)
            if hit is None:
                hit = self._match(has >> ANY_PEER_SHIFT, subject, SEGMENT_ANY, direction, proto, dport)
        if hit is not None and not _flags(hit[1]) & PolicyFlag.SELECTED:
            e = decode_policy_entry(hit[1])
            k = decode_policy_key(hit[0])
            out.update(verdict="allow", entry={**k, **e}, policy_id=e["policy_id"], rule=e["rule"])
            return out
        out.update(verdict="audit" if int(PolicyFlag.AUDIT) & _flags(marker) else "deny",
                   policy_id=m["policy_id"], rule=None)
        return out


def _flags(raw: bytes) -> int:
    return struct.unpack_from("<H", raw, 6)[0]


def read_node_maps(node: str, pin_root: str) -> PolicyMaps:
    """Dump a node's pinned policy (both maps), segment, prefix-segment and routing maps.

    Raises a :class:`lace.datapath.node.DatapathError` when the node's pins are missing."""
    from lace.datapath.node import PinnedMaps

    maps = PinnedMaps(pin_root, node)
    with maps.open(TRIE_MAP) as policy:   # entries and capacity from one open
        entries, capacity = dict(policy.entries()), policy.max_entries
    return PolicyMaps(node, entries, maps.entries("segment"), maps.entries("prefix-segment"),
                      maps.entries("routing"), capacity=capacity, policy_exact=maps.entries(EXACT_MAP))
