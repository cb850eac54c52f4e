"""The embedded store while another process is stuck inside a write transaction (holding SQLite's
write lock): opening the store and reading it still work, with the last commit; writes fail as
"store unavailable" once the busy timeout passes."""

from __future__ import annotations

import sqlite3

import pytest

from lace.store import SqliteStore
from lace.store.errors import Unavailable


def _ns(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def test_a_stuck_writer_leaves_opening_and_reading_and_fails_writes(tmp_path):
    path = tmp_path / "store.db"
    first = SqliteStore(path)
    first.create(_ns("before"))
    stuck = sqlite3.connect(path, isolation_level=None)
    stuck.execute("BEGIN IMMEDIATE")
    stuck.execute("UPDATE meta SET value = value + 1 WHERE key = 'revision'")
    try:
        # a new process opening the store (the CLI, an agent starting) does not wait for the lock
        second = SqliteStore(path, busy_timeout=0.2)
        try:
            assert second.get("namespaces", "before")["metadata"]["name"] == "before"
            with pytest.raises(Unavailable, match="locked"):
                second.create(_ns("during"))
        finally:
            second.close()
    finally:
        stuck.close()   # its transaction rolls back: its write never shows
    first.create(_ns("after"))
    names = {n["metadata"]["name"] for n in first.list("namespaces").items}
    assert {"after", "before"} <= names and "during" not in names
    first.close()


def test_a_new_file_still_gets_its_schema(tmp_path):
    store = SqliteStore(tmp_path / "new.db")
    store.create(_ns("a"))
    store.close()
    again = SqliteStore(tmp_path / "new.db")
    assert again.get("namespaces", "a")["metadata"]["name"] == "a"
    again.close()
