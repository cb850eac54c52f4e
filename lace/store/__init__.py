"""lace.store: desired state as Kubernetes-shaped objects with revisions and watch.

Three layers, like kube-apiserver's storage stack, each knowing only the one below:

1. **Backend** (``backend.py``, the generic storage interface; ``sqlite.py``, the embedded
   implementation): objects by kind/namespace/name, one revision counter, an event log that
   ``watch`` replays until compaction (then ``Gone``), transactions, named counters. No rule about
   any kind lives here, so another backend (etcd, ...) needs no domain code.
2. **Rules and allocation**, shared by every backend and applied inside the backend's transaction
   so a rejected write leaves nothing behind: ``rules.py`` (validation via ``validation.py``,
   store-owned status, update and delete guards, cascades, the objects every cluster has) and
   ``allocate.py`` (network and segment IDs, segments, per-node IP blocks, pod address leases).
3. **The Store callers use** (``api.py``, the interface; ``registry.py``, ``RegistryStore``, which
   composes a backend with the rules and the allocators). ``SqliteStore(path)`` (``embedded.py``)
   is that Store over the SQLite backend, ``EtcdStore(endpoints)`` (``etcd.py``) over an etcd v3
   cluster; ``open_store(spec)`` (``config.py``) picks one from a spec string (a path, or
   ``etcd://...``), which is how every component opens the store.

Beside them: errors in ``errors.py``, kinds and their names in ``kinds.py``, label selectors in
``selectors.py``. Importing this package (or ``errors``/``kinds``) stays cheap — no sqlite3,
jsonschema or orjson — so command-line tools that only need the error types start fast; the other
names load on first use.
"""

from __future__ import annotations

import importlib

from lace.store.errors import (AlreadyExists, Conflict, Exhausted, Forbidden, Gone, IpamExhausted,
                               NotFound, StoreError, Unavailable, UnknownKind, ValidationError)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms)
if TYPE_CHECKING:
    from typing import Any

    from lace.store.api import ApplyResult, Lease, ListResult, Store, Watch, WatchEvent
    from lace.store.registry import RegistryStore
    from lace.store.embedded import SqliteStore
    from lace.store.etcd import EtcdStore
    from lace.store.config import StoreConfig, open_store

# The file a lab's store lives in, inside the lab's state directory.
STORE_FILE = "store.db"

# Names loaded on first use (PEP 562), so that `import lace.store` pulls in none of their imports.
_LAZY = {
    "ApplyResult": "lace.store.api", "Lease": "lace.store.api", "ListResult": "lace.store.api",
    "Store": "lace.store.api", "Watch": "lace.store.api", "WatchEvent": "lace.store.api",
    "RegistryStore": "lace.store.registry", "SqliteStore": "lace.store.embedded",
    "EtcdStore": "lace.store.etcd", "StoreConfig": "lace.store.config", "open_store": "lace.store.config",
}

__all__ = [
    "STORE_FILE", "AlreadyExists", "ApplyResult", "Conflict", "EtcdStore", "Exhausted", "Forbidden",
    "Gone", "IpamExhausted", "Lease", "ListResult", "NotFound", "RegistryStore", "SqliteStore",
    "Store", "StoreConfig", "StoreError", "Unavailable", "UnknownKind", "ValidationError", "Watch",
    "WatchEvent", "open_store",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
