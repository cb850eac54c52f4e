"""Stable numbers for policies and ipBlock CIDRs.

Policy IDs: NetworkPolicy has no store-assigned ID, so lace derives one that every node computes
alike without coordination: the low 31 bits of SHA-256("namespace/name"), never 0 (0 renders as
"no policy"). The rare collision is settled deterministically: policies sorted by namespace/name,
a later one takes the next free number. ``policy_ids`` is also the reverse lookup for rendering.

CIDR segments: every ipBlock ``cidr`` and ``except`` prefix gets a segment from the store, allocated
as the identity (network ``default``, namespace "", labels {lace.dev/cidr: <cidr with "/" as "_"
and ":" as "-">}), so it is a normal cluster-wide Segment the CLI can name; its prefix-segment
entries are written in every network (a CIDR is not tied to one network).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

from lace.store import kinds as K

CIDR_LABEL = K.CIDR_LABEL
CIDR_NETWORK = "default"
CIDR_NAMESPACE = ""

_MASK = 0x7FFFFFFF


def base_policy_id(namespace: str, name: str) -> int:
    h = int.from_bytes(hashlib.sha256(f"{namespace}/{name}".encode()).digest()[:4], "big") & _MASK
    return h or 1


def policy_ids(keys: Iterable[str]) -> dict[str, int]:
    """``namespace/name`` -> policy ID for a set of policies (collisions settled in sorted order)."""
    out: dict[str, int] = {}
    taken: set[int] = set()
    for key in sorted(set(keys)):
        ns, _, name = key.partition("/")
        pid = base_policy_id(ns, name)
        while pid in taken:
            pid = (pid % _MASK) + 1
        taken.add(pid)
        out[key] = pid
    return out


def normalise_cidr(cidr: str) -> str:
    return str(ipaddress.ip_network(cidr.strip(), strict=False))


def cidr_label_value(cidr: str) -> str:
    return normalise_cidr(cidr).replace("/", "_").replace(":", "-")


def cidr_from_label(value: str) -> str | None:
    """The CIDR a CIDR segment's label names, or None for other labels."""
    text = value.replace("_", "/")
    if "-" in text:
        text = text.replace("-", ":")
    try:
        return normalise_cidr(text)
    except ValueError:
        return None


def cidr_identity(cidr: str) -> tuple[str, str, dict[str, str]]:
    """(network, namespace, labels) to allocate the segment of an ipBlock CIDR with."""
    return CIDR_NETWORK, CIDR_NAMESPACE, {CIDR_LABEL: cidr_label_value(cidr)}
