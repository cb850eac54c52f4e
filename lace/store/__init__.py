"""lace.store: desired state as Kubernetes-shaped objects with revisions and watch.

``Store`` is the interface (``api.py``), ``SqliteStore`` the embedded implementation; errors in
``errors.py``, kinds and their names in ``kinds.py``, label selectors in ``selectors.py``.
"""

from lace.store.api import ApplyResult, ListResult, Store, Watch, WatchEvent
from lace.store.errors import (AlreadyExists, Conflict, Exhausted, Forbidden, Gone, NotFound,
                               StoreError, Unavailable, UnknownKind, ValidationError)
from lace.store.sqlite import SqliteStore

__all__ = [
    "AlreadyExists", "ApplyResult", "Conflict", "Exhausted", "Forbidden", "Gone", "ListResult",
    "NotFound", "SqliteStore", "Store", "StoreError", "Unavailable", "UnknownKind",
    "ValidationError", "Watch", "WatchEvent",
]
