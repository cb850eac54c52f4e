"""The embedded store's watches sleep while nothing is written and wake on another process's
commit at once (inotify on the write-ahead log), instead of asking SQLite every few ms."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from lace.store import SqliteStore
from lace.store import sqlite as sq

WRITER = """
import sys
from lace.store import SqliteStore
s = SqliteStore(sys.argv[1])
s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": sys.argv[2]}})
s.close()
"""


def _follow(store):
    """A watch of Namespaces read by a thread: (the names it saw, the watch, the thread)."""
    got: list = []
    w = store.watch(["namespaces"])
    reader = threading.Thread(target=lambda: got.extend(ev.object["metadata"]["name"] for ev in w))
    reader.start()
    return got, w, reader


def _written_elsewhere(path, name: str, got: list, within: float = 20) -> bool:
    """Create Namespace ``name`` from another process; whether the watch feeding ``got`` brought
    it within ``within`` seconds."""
    subprocess.run([sys.executable, "-c", WRITER, str(path), name], check=True, timeout=60,
                   cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    deadline = time.monotonic() + within
    while name not in got and time.monotonic() < deadline:
        time.sleep(0.01)
    return name in got


def test_an_idle_watch_sleeps_and_another_process_commit_wakes_it(tmp_path, monkeypatch):
    # the safety net far away: only a file event can bring the other process's write in time
    monkeypatch.setattr(sq, "WAKE_SAFETY", 60.0)
    path = tmp_path / "store.db"
    store = SqliteStore(path)
    fetches = []
    real = sq.SqliteWatch._fetch

    def counted(self):
        fetches.append(time.monotonic())
        return real(self)
    monkeypatch.setattr(sq.SqliteWatch, "_fetch", counted)
    got, w, reader = _follow(store)
    try:
        time.sleep(1.0)
        idle = len(fetches)
        assert idle <= 3, f"an idle watch looked {idle} times in 1 s (polling, not sleeping)"
        assert _written_elsewhere(path, "from-elsewhere", got), "another process's commit did not wake the watch"
    finally:
        w.stop()
        reader.join(10)
        store.close()
    assert not reader.is_alive()
    # the store's directory is no longer watched once its last watch closed
    assert str(tmp_path) not in sq._FILE_WAKES._dirs


def _ns(name):
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def test_a_watch_that_ends_in_an_error_gives_back_its_connection_and_file_wake(tmp_path):
    import sqlite3

    import pytest

    from lace.store import Gone

    path = tmp_path / "store.db"
    store = SqliteStore(path)
    try:
        since = store.revision()
        w = store.watch(["namespaces"], since=since)
        assert sq._FILE_WAKES._users.get(str(path)) == 1
        store.create(_ns("a"))
        store.create(_ns("b"))
        store.compact(keep=0)                      # the watch's position is compacted away
        with pytest.raises(Gone):
            next(w)
        assert str(path) not in sq._FILE_WAKES._users
        assert str(tmp_path) not in sq._FILE_WAKES._dirs
        with pytest.raises(sqlite3.ProgrammingError):   # closed, not left to the garbage collector
            w._conn.execute("SELECT 1")
        with pytest.raises(StopIteration):
            next(w)
        with pytest.raises(Gone):                  # Gone at the start leaks nothing either
            store.watch(["namespaces"], since=since)
        assert str(path) not in sq._FILE_WAKES._users
    finally:
        store.close()


def test_a_wake_whose_commit_shows_late_is_looked_for_again_and_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sq, "WAKE_SAFETY", 60.0)
    store = SqliteStore(tmp_path / "store.db")
    visible_at = [0.0]
    real = sq.SqliteWatch._fetch

    def late(self):
        if time.monotonic() >= visible_at[0]:   # before: as if the commit were not visible yet
            real(self)
    monkeypatch.setattr(sq.SqliteWatch, "_fetch", late)
    got, w, reader = _follow(store)
    try:
        time.sleep(0.1)
        visible_at[0] = time.monotonic() + 0.05    # past the first few looks after the wake
        store.create(_ns("late"))
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.005)
        assert got == ["late"], "the watch gave up on its wake-up and slept"
    finally:
        w.stop()
        reader.join(10)
        store.close()



def test_a_watch_left_by_a_break_gives_back_its_connection_and_file_wake(tmp_path, monkeypatch):
    """A reader that takes one event and leaves the with-block (as a wait for one object does)
    ends the watch there: its connection closed, its file wake given back, so a store made again
    at the same path after its directory was removed still wakes this process's watches at once."""
    import shutil
    import sqlite3

    import pytest

    monkeypatch.setattr(sq, "WAKE_SAFETY", 60.0)   # only a file event brings a write in time
    home = tmp_path / "lab"
    home.mkdir()
    path = home / "store.db"
    store = SqliteStore(path)
    since = store.revision()
    store.create(_ns("a"))
    with store.watch(["namespaces"], since=since) as w:
        for ev in w:
            break
    assert str(path) not in sq._FILE_WAKES._users and str(home) not in sq._FILE_WAKES._dirs
    with pytest.raises(sqlite3.ProgrammingError):
        w._conn.execute("SELECT 1")
    store.close()
    shutil.rmtree(home)
    home.mkdir()
    store = SqliteStore(path)
    got, w, reader = _follow(store)
    try:
        assert _written_elsewhere(path, "after", got), "the commit did not wake the watch of the store made again"
    finally:
        w.stop()
        reader.join(10)
        store.close()
