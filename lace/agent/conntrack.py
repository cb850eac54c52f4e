"""Conntrack housekeeping the agent does: flushing the entries of an endpoint that went away, and
reading which frontends live service flows still name (the revnat entries they need)."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

import time

import numpy as np

from lace.datapath import registry
from lace.datapath.conntrack import CT4_KEY, CT6_KEY, CT_ENTRY, CtFlag
from lace.datapath.services import revnat_key
from lace.datapath.node import LoadedDatapath

if TYPE_CHECKING:
    from .datapath import NodeDatapath


def flush_addresses(datapath: LoadedDatapath | NodeDatapath, network: int, ips: list) -> int:
    """Delete every conntrack entry of ``network`` whose source or destination is one of ``ips``,
    and every service flow (whatever network its client is in) whose backend is one of them in
    ``network``: a flow to a pod that is gone goes nowhere, and its client's next packet should
    meet the service as a new flow and get a backend that exists.

    ``datapath`` hands out the loaded maps by CLI name: a :class:`~lace.datapath.node.LoadedDatapath`
    or the agent's ``NodeDatapath`` (which holds one).  The tables are read as raw arrays
    (``Map.dump``) and matched with NumPy: a table holds up to a million entries.
    """
    removed = 0
    for name in registry.CT_TABLES:
        v6 = name.endswith("v6")
        wanted = [ip for ip in ips if ip.version == (6 if v6 else 4)]
        if not wanted:
            continue
        m = datapath.map(name)
        keys, values, n = m.dump()
        if not n:
            continue
        layout = CT6_KEY if v6 else CT4_KEY
        arr = layout.decode_many(keys, n)
        val = CT_ENTRY.decode_many(values, n)
        width = 16 if v6 else 4
        sel = np.zeros(n, dtype=bool)
        backend = np.zeros(n, dtype=bool)
        nat = val["nat_addr"]
        for ip in wanted:
            packed = ipaddress.ip_address(ip).packed
            raw = np.frombuffer(packed, dtype=f"V{width}")[0]
            sel |= (arr["saddr"] == raw) | (arr["daddr"] == raw)
            backend |= nat == np.frombuffer(packed.ljust(16, b"\0"), dtype="V16")[0]
        sel &= arr["network"] == network
        sel |= backend & ((val["flags"] & np.uint8(CtFlag.SERVICE)) != 0) & (val["dst_network"] == network)
        idx = np.nonzero(sel)[0]
        if len(idx):
            kb = bytes(keys)
            picked = b"".join(kb[i * m.key_size:(i + 1) * m.key_size] for i in idx)
            removed += m.delete_batch(picked, len(idx))
    return removed


def revnat_in_use(datapath: LoadedDatapath | NodeDatapath) -> set[tuple[bytes, tuple[int, str, int]]]:
    """(revnat key of the backend, frontend (source network, address, port)) of every live service
    flow's entry: the frontends the backends' revnat entries must keep (ServiceProgrammer.release_revnat).
    An entry past its expiry counts no more (the datapath ignores it, the LRU reclaims it later)."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out: set[tuple[bytes, tuple[int, str, int]]] = set()
    for name in registry.CT_TABLES:
        if "icmp" in name:
            continue   # services are TCP and UDP only
        v6 = name.endswith("v6")
        keys, values, n = datapath.map(name).dump()
        if not n:
            continue
        arr = (CT6_KEY if v6 else CT4_KEY).decode_many(keys, n)
        val = CT_ENTRY.decode_many(values, n)
        idx = np.nonzero(((val["flags"] & np.uint8(CtFlag.SERVICE)) != 0) & (val["expires_ns"] >= now))[0]
        width = 16 if v6 else 4
        for i in idx:
            backend = ipaddress.ip_address(bytes(val["nat_addr"][i])[:width])
            frontend = ipaddress.ip_address(bytes(arr["daddr"][i]))
            key = revnat_key(int(val["dst_network"][i]), backend, int(val["nat_port"][i]), int(arr["proto"][i]))
            out.add((key, (int(arr["network"][i]), str(frontend), int(arr["dport"][i]))))
    return out
