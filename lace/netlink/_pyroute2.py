"""pyroute2's package, registered without running its ``__init__``.

``import pyroute2`` imports every module the library has — IPDB, NDB with its database, wireless,
IPVS, WireGuard, plan9 and more — because its ``__init__`` re-exports them all: ~0.26 s and
~22 MiB of resident memory in every process that touches netlink (the agent, each CLI command
that names interfaces). lace uses ``IPRoute``, the netns helpers and a few constants, which live
in submodules that import what they need themselves. Registering the package as an empty module
with pyroute2's own spec lets ``from pyroute2.iproute import IPRoute`` load just those (~0.08 s,
~6 MiB less). A process that imported pyroute2 whole already keeps it.
"""

from __future__ import annotations

import importlib.util
import sys


def register() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.submodule_search_locations is None:
        return   # not installed: the submodule import names what is missing
    sys.modules["pyroute2"] = importlib.util.module_from_spec(spec)


register()
