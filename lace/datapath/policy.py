"""policy: allow entries between segments, per direction, protocol and port block (C: lace/abi/policy.h).

The key is an LPM trie key: (segment, peer, direction) is always matched exactly (72 bits), the
protocol byte optionally (80), then a prefix of the big-endian destination port (up to 96).  A port
range therefore becomes the minimal set of aligned power-of-two port blocks, one entry each.

The entries of a node live in two maps with that one key shape, chosen by prefix length alone
(:func:`policy_maps`): ``policy-exact``, a hash, holds the selection markers and every entry of
length 72, 80 or 96, which the datapath finds with exact keys at a cost that does not grow with
their number; ``policy``, the LPM trie, holds only port blocks (81..95). Each marker carries the
kinds of allow entries its segment has in its direction, for named peers (``PolicyFlag.PORTS`` ..
``BLOCKS``) and for any peer (``ANY_PEER_PORTS`` .. ``ANY_PEER_BLOCKS``), so a check probes only
for those. Code that builds policy (the resolver, the test bed, the fuzzer)
works on one dict of keys as :func:`policy_keys` makes them and hands it to :func:`policy_maps`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from lace.bpf.layout import Layout
from lace.datapath.common import SEGMENT_ANY, SEGMENT_SELECTED, Direction, Proto, enum_label, flag_labels, check_port, check_u32

POLICY_MAX = 65536
POLICY_PREFIX_ANY_PROTO = 72
POLICY_PREFIX_PROTO = 80
POLICY_PREFIX_FULL = 96
_PORT_BITS = POLICY_PREFIX_FULL - POLICY_PREFIX_PROTO
#: the rule number of the entry that lets the node's host into a pod selected for ingress
#: (policy 0; lace.policy.resolve writes one per such segment)
HOST_RULE = 0xFFFE


class PolicyFlag(enum.IntFlag):
    """Bits of lace_policy_entry.flags (LACE_POLICY_F_*), used by the marker entry."""

    SELECTED = 0x1  # the segment is selected in this direction (default deny)
    AUDIT = 0x2  # selected in audit mode: drops are reported, not enforced
    # the segment has allow entries of this kind for a named peer in this direction (policy_maps)
    PORTS = 0x4  # exact ports (prefix length 96, policy-exact)
    PROTOS = 0x8  # whole protocols (80, policy-exact)
    ANY_PROTO = 0x10  # any protocol (72, policy-exact)
    BLOCKS = 0x20  # port blocks of ranges (81..95, the policy trie)
    # the same for peer SEGMENT_ANY: the four bits above shifted by ANY_PEER_SHIFT
    ANY_PEER_PORTS = 0x40
    ANY_PEER_PROTOS = 0x80
    ANY_PEER_ANY_PROTO = 0x100
    ANY_PEER_BLOCKS = 0x200


#: how far a marker's any-peer bits sit above the named-peer ones (LACE_POLICY_ANY_PEER_SHIFT)
ANY_PEER_SHIFT = 4
#: the marker bits policy_maps derives from the allow entries (the others come from the resolver)
LOOKUP_FLAGS = (PolicyFlag.PORTS | PolicyFlag.PROTOS | PolicyFlag.ANY_PROTO | PolicyFlag.BLOCKS
                | PolicyFlag.ANY_PEER_PORTS | PolicyFlag.ANY_PEER_PROTOS | PolicyFlag.ANY_PEER_ANY_PROTO
                | PolicyFlag.ANY_PEER_BLOCKS)
#: the maps a node's policy entries are split into (CLI names): port blocks, everything else
TRIE_MAP = "policy"
EXACT_MAP = "policy-exact"
POLICY_MAPS = (TRIE_MAP, EXACT_MAP)


#: struct lace_policy_key (policy.h): the key of both maps (the trie's prefix length, the hash's exact key)
POLICY_KEY = Layout(
    "struct lace_policy_key",
    [
        ("prefixlen", "u32"),
        ("segment", "u32"),
        ("peer", "u32"),
        ("direction", "u8"),
        ("proto", "u8"),
        ("dport", "be16"),
    ],
)

#: struct lace_policy_entry (policy.h)
POLICY_ENTRY = Layout(
    "struct lace_policy_entry",
    [("policy_id", "u32"), ("rule", "u16"), ("flags", "u16"), ("hits", "u64")],
)

C_MACROS: dict[str, int] = {
    "LACE_POLICY_MAX": POLICY_MAX,
    "LACE_POLICY_PREFIX_ANY_PROTO": POLICY_PREFIX_ANY_PROTO,
    "LACE_POLICY_PREFIX_PROTO": POLICY_PREFIX_PROTO,
    "LACE_POLICY_PREFIX_FULL": POLICY_PREFIX_FULL,
    "LACE_POLICY_F_SELECTED": PolicyFlag.SELECTED,
    "LACE_POLICY_F_AUDIT": PolicyFlag.AUDIT,
    "LACE_POLICY_F_PORTS": PolicyFlag.PORTS,
    "LACE_POLICY_F_PROTOS": PolicyFlag.PROTOS,
    "LACE_POLICY_F_ANY_PROTO": PolicyFlag.ANY_PROTO,
    "LACE_POLICY_F_BLOCKS": PolicyFlag.BLOCKS,
    "LACE_POLICY_ANY_PEER_SHIFT": ANY_PEER_SHIFT,
    "LACE_POLICY_F_ANY_PEER_PORTS": PolicyFlag.ANY_PEER_PORTS,
    "LACE_POLICY_F_ANY_PEER_PROTOS": PolicyFlag.ANY_PEER_PROTOS,
    "LACE_POLICY_F_ANY_PEER_ANY_PROTO": PolicyFlag.ANY_PEER_ANY_PROTO,
    "LACE_POLICY_F_ANY_PEER_BLOCKS": PolicyFlag.ANY_PEER_BLOCKS,
}
C_ENUMS: dict[str, tuple[type[enum.IntEnum], str]] = {}


def port_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """Split the port range [start, end] into the fewest aligned power-of-two blocks.

    Returns ``(first_port, prefix_bits)`` pairs in ascending order; a block covers
    ``2 ** (16 - prefix_bits)`` ports starting at ``first_port``.
    """
    check_port(start, "first port")
    check_port(end, "last port")
    if start > end:
        raise ValueError(f"port range {start}-{end} is empty")
    blocks: list[tuple[int, int]] = []
    lo = start
    while lo <= end:
        # the largest block aligned at lo that stays inside the range
        size = lo & -lo if lo else 1 << _PORT_BITS
        while size > end - lo + 1:
            size >>= 1
        blocks.append((lo, _PORT_BITS - (size.bit_length() - 1)))
        lo += size
    return blocks


def policy_keys(segment: int, peer: int, direction: Direction | int, proto: int | None,
                port: int | None = None, end_port: int | None = None) -> list[bytes]:
    """The LPM keys that together match exactly (segment, peer, direction, proto, ports).

    ``proto`` None matches any protocol (and then no port may be given); ``port`` None matches
    any port of ``proto``; ``end_port`` makes [port, end_port] an inclusive range.
    """
    if peer == SEGMENT_SELECTED:
        raise ValueError(f"peer segment {SEGMENT_SELECTED:#x} is reserved for selection markers: "
                         "use selected_key() for a marker, or a real peer segment")
    base = {
        "segment": check_u32(segment, "segment"),
        "peer": check_u32(peer, "peer segment"),
        "direction": int(Direction(direction)),
    }
    if proto is None:
        if port is not None or end_port is not None:
            raise ValueError("a port needs a protocol")
        return [POLICY_KEY.pack(base, prefixlen=POLICY_PREFIX_ANY_PROTO)]
    if not 0 <= int(proto) <= 255:
        raise ValueError(f"protocol {proto} is not in 0..255")
    base["proto"] = int(proto)
    if port is None:
        if end_port is not None:
            raise ValueError("an end port needs a first port")
        return [POLICY_KEY.pack(base, prefixlen=POLICY_PREFIX_PROTO)]
    last = port if end_port is None else end_port
    return [
        POLICY_KEY.pack(base, prefixlen=POLICY_PREFIX_PROTO + bits, dport=first)
        for first, bits in port_blocks(port, last)
    ]


def selected_key(segment: int, direction: Direction | int) -> bytes:
    """The marker key saying ``segment`` is selected (default deny) in ``direction``."""
    return POLICY_KEY.pack(
        prefixlen=POLICY_PREFIX_ANY_PROTO,
        segment=check_u32(segment, "segment"),
        peer=SEGMENT_SELECTED,
        direction=int(Direction(direction)),
    )


def lookup_key(segment: int, peer: int, direction: Direction | int, proto: int, dport: int) -> bytes:
    """A full-length key as the datapath looks up one packet."""
    return POLICY_KEY.pack(
        prefixlen=POLICY_PREFIX_FULL, segment=segment, peer=peer, direction=int(direction),
        proto=proto, dport=check_port(dport),
    )


def policy_entry(policy_id: int, rule: int, flags: int = 0) -> bytes:
    """A packed struct lace_policy_entry (hits 0)."""
    return POLICY_ENTRY.pack(policy_id=check_u32(policy_id, "policy ID"), rule=rule, flags=int(flags))


def decode_policy_key(raw: bytes) -> dict[str, Any]:
    """``proto`` None = any protocol; ``port``/``end_port`` None = any port; ``selected`` marks the marker."""
    k = POLICY_KEY.unpack(raw)
    plen = k["prefixlen"]
    out: dict[str, Any] = {
        "segment": k["segment"],
        "peer": k["peer"],
        "direction": enum_label(Direction, k["direction"]),
        "selected": k["peer"] == SEGMENT_SELECTED and plen == POLICY_PREFIX_ANY_PROTO,
        "proto": None,
        "port": None,
        "end_port": None,
        "prefixlen": plen,
    }
    if plen >= POLICY_PREFIX_PROTO:
        out["proto"] = enum_label(Proto, k["proto"])
    if plen > POLICY_PREFIX_PROTO:
        bits = min(plen, POLICY_PREFIX_FULL) - POLICY_PREFIX_PROTO
        span = 1 << (_PORT_BITS - bits)
        first = k["dport"] & ~(span - 1) & 0xFFFF
        out["port"], out["end_port"] = first, first + span - 1
    return out


def decode_policy_entry(raw: bytes) -> dict[str, Any]:
    v = POLICY_ENTRY.unpack(raw)
    return {"policy_id": v["policy_id"], "rule": v["rule"], "flags": flag_labels(PolicyFlag, v["flags"]),
            "hits": v["hits"]}


# -- the two maps ------------------------------------------------------------------------------------

_PLEN = {n: (n).to_bytes(4, "little") for n in range(POLICY_PREFIX_ANY_PROTO, POLICY_PREFIX_FULL + 1)}
#: a key's packed prefix length -> the marker bit of its kind of entry
_KIND: dict[bytes, int] = {
    raw: int(PolicyFlag.PORTS if n == POLICY_PREFIX_FULL else PolicyFlag.ANY_PROTO if n == POLICY_PREFIX_ANY_PROTO
             else PolicyFlag.PROTOS if n == POLICY_PREFIX_PROTO else PolicyFlag.BLOCKS)
    for n, raw in _PLEN.items()
}
_PORTS, _PROTOS, _ANY_PROTO, _BLOCKS = (int(f) for f in (PolicyFlag.PORTS, PolicyFlag.PROTOS, PolicyFlag.ANY_PROTO,
                                                          PolicyFlag.BLOCKS))
_SELECTED = SEGMENT_SELECTED.to_bytes(4, "little")
_ANY = SEGMENT_ANY.to_bytes(4, "little")
_ZERO2 = bytes(2)
_FLAGS = slice(6, 8)   # lace_policy_entry.flags in a packed value


def entry_kind(key: bytes) -> PolicyFlag:
    """The marker bit that sends a check to a packed allow key: its kind (PORTS, PROTOS, ANY_PROTO
    or BLOCKS), shifted to the any-peer bits for peer SEGMENT_ANY. ValueError for a prefix length
    the datapath never looks up."""
    kind = _kind(key)
    return PolicyFlag(kind << ANY_PEER_SHIFT if key[8:12] == _ANY else kind)


def _kind(key: bytes) -> int:
    kind = _KIND.get(key[:4])
    if kind is None or len(key) != POLICY_KEY.size:
        plen = int.from_bytes(key[:4], "little")
        raise ValueError(f"policy key {key.hex()} (prefix length {plen}): the datapath looks up lengths "
                         f"{POLICY_PREFIX_ANY_PROTO} to {POLICY_PREFIX_FULL} only; build keys with policy_keys()")
    return kind


def is_marker(key: bytes) -> bool:
    """Whether a packed policy key is a selection marker (selected_key)."""
    return key[8:12] == _SELECTED and key[:4] == _PLEN[POLICY_PREFIX_ANY_PROTO]


def map_of(key: bytes) -> str:
    """The map (CLI name) that holds a policy key: the trie for a port block, else the hash."""
    return TRIE_MAP if _kind(key) == _BLOCKS else EXACT_MAP


def policy_maps(entries: Mapping[bytes, bytes]) -> dict[str, dict[bytes, bytes]]:
    """Split one node's policy entries (keys as policy_keys and selected_key make them) into what
    each map holds: ``{"policy": port blocks, "policy-exact": markers and every other entry}``, each
    marker's LOOKUP_FLAGS set to the kinds of allow entries its segment has in its direction
    (:func:`entry_kind` of each).

    Which map holds an entry depends on its key alone, so the split of a subset is the subset of
    the split; only marker values depend on the other entries. Raises ValueError for a key the
    datapath could never find: a prefix length outside 72..96, bits set past the prefix length of
    an entry the hash holds (a hash needs the exact key the datapath probes), or an allow entry
    with the marker's reserved peer."""
    trie: dict[bytes, bytes] = {}
    exact: dict[bytes, bytes] = {}
    kinds: dict[tuple[bytes, int], int] = {}     # (segment bytes, direction) -> kinds of allow entries
    markers: list[bytes] = []
    kind_of, kinds_get = _KIND.get, kinds.get
    # one pass, kept tight (tens of thousands of entries per change): the kinds of a run of keys
    # of one segment and direction (the resolver's order) are gathered before a dict is touched
    seg, direction, acc = b"", -1, 0
    for k, v in entries.items():
        kind = kind_of(k[:4])
        if kind == _PORTS:
            exact[k] = v
        elif kind == _BLOCKS:
            trie[k] = v
        elif kind is None:
            _kind(k)                 # raises, naming the key
        elif k[14:16] != _ZERO2 or (kind == _ANY_PROTO and k[13] != 0):
            raise ValueError(f"policy key {k.hex()}: bits past its prefix length are set; the datapath "
                             "probes the hash with them zero (build keys with policy_keys())")
        else:
            exact[k] = v
        peer = k[8:12]
        if peer == _SELECTED:
            if kind != _ANY_PROTO:
                raise ValueError(f"policy key {k.hex()}: peer segment {SEGMENT_SELECTED:#x} is reserved for "
                                 "selection markers (selected_key())")
            markers.append(k)
            continue
        if peer == _ANY:
            kind <<= ANY_PEER_SHIFT
        s = k[4:8]
        if s == seg and k[12] == direction:
            acc |= kind
            continue
        if acc:
            kinds[(seg, direction)] = kinds_get((seg, direction), 0) | acc
        seg, direction, acc = s, k[12], kind
    if acc:
        kinds[(seg, direction)] = kinds_get((seg, direction), 0) | acc
    for k in markers:
        v = exact[k]
        old = int.from_bytes(v[_FLAGS], "little")
        flags = (old & ~int(LOOKUP_FLAGS)) | kinds_get((k[4:8], k[12]), 0)
        if flags != old:
            exact[k] = v[:6] + flags.to_bytes(2, "little") + v[8:]
    return {TRIE_MAP: trie, EXACT_MAP: exact}
