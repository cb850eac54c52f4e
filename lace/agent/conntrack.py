"""Conntrack housekeeping the agent does: flushing the entries of an endpoint that went away."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

import numpy as np

from lace.datapath import registry
from lace.datapath.conntrack import CT4_KEY, CT6_KEY
from lace.datapath.node import LoadedDatapath

if TYPE_CHECKING:
    from .datapath import NodeDatapath


def flush_addresses(datapath: LoadedDatapath | NodeDatapath, network: int, ips: list) -> int:
    """Delete every conntrack entry of ``network`` whose source or destination is one of ``ips``.

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
        keys, _, n = m.dump()
        if not n:
            continue
        layout = CT6_KEY if v6 else CT4_KEY
        arr = layout.decode_many(keys, n)
        width = 16 if v6 else 4
        sel = np.zeros(n, dtype=bool)
        for ip in wanted:
            raw = np.frombuffer(ipaddress.ip_address(ip).packed, dtype=f"V{width}")[0]
            sel |= (arr["saddr"] == raw) | (arr["daddr"] == raw)
        sel &= arr["network"] == network
        idx = np.nonzero(sel)[0]
        if len(idx):
            kb = bytes(keys)
            picked = b"".join(kb[i * m.key_size:(i + 1) * m.key_size] for i in idx)
            removed += m.delete_batch(picked, len(idx))
    return removed
