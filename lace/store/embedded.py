"""The embedded store: the Store callers construct on one SQLite file (``SqliteStore(path)``).

Only the binding lives here, above both layers it joins: the SQLite backend (``sqlite.py``) under
the shared rules and allocators (``registry.py``). Neither of those knows the other.
"""

from __future__ import annotations

import os
import sqlite3

from lace.store.registry import RegistryStore
from lace.store.sqlite import DEFAULT_MAX_EVENTS, POLL_INTERVAL, SqliteBackend


class SqliteStore(RegistryStore):
    """The Store on one SQLite file: a SqliteBackend under the shared rules and allocators."""

    backend: SqliteBackend

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 10.0,
                 max_events: int = DEFAULT_MAX_EVENTS, poll_interval: float = POLL_INTERVAL) -> None:
        super().__init__(SqliteBackend(path, busy_timeout=busy_timeout, max_events=max_events,
                                       poll_interval=poll_interval))

    @property
    def path(self) -> str:
        return self.backend.path

    @property
    def _conn(self) -> sqlite3.Connection:
        # the backend's connection, for tests that look at the file itself (WAL mode, events rows)
        return self.backend._conn
