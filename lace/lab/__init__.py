"""lace.lab: a multi-node lace cluster on one machine, out of network namespaces.

``topology`` builds and destroys the namespaces, links and addresses; ``procs`` runs the lab's
long-lived processes inside them; ``podserver`` is what a lab pod runs, and dnsmasq what the
cluster DNS pod runs (``dns``, fed by ``dnsfeed``).  Names are loaded on first use so that
``python -m lace.lab.podserver`` starts without importing pyroute2 or libbpf.
"""

from __future__ import annotations

import importlib
from typing import Any

_TOPOLOGY = ("Lab", "LabError", "LabNode", "LabSpec", "build", "destroy", "load")
_PROCS = ("ProcError", "ProcInfo", "spawn", "stop", "stop_all", "kill", "alive", "list_procs")

__all__ = [*_TOPOLOGY, *_PROCS]


def __getattr__(name: str) -> Any:
    if name in _TOPOLOGY:
        return getattr(importlib.import_module("lace.lab.topology"), name)
    if name in _PROCS:
        return getattr(importlib.import_module("lace.lab.procs"), name)
    raise AttributeError(f"module 'lace.lab' has no attribute {name!r}")
