"""The agent's liveness keeper on a real SQLite store: it takes and renews the node's record,
notices when the store cannot be written (the file held locked by another connection) and when
it can again, and tells the agent both times."""

from __future__ import annotations

import sqlite3
import time

import pytest

from lace.agent.liveness import LivenessKeeper
from lace.store import SqliteStore


def test_keeper_renews_reports_an_unavailable_store_and_its_return(tmp_path):
    path = tmp_path / "store.db"
    store = SqliteStore(path, busy_timeout=0.1)
    reader = SqliteStore(path)
    calls = []
    keeper = LivenessKeeper(store, "worker-1", 5.0, "agent pid 1",
                            on_failing=lambda: calls.append("failing"),
                            on_restored=lambda: calls.append("restored"))
    try:
        keeper.renew_once()
        assert not keeper.failing and keeper.last_renewed is not None
        assert reader.node_liveness()["worker-1"].holder == "agent pid 1"
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")          # another process holding the store
        keeper.renew_once()
        keeper.renew_once()
        assert keeper.failing and "locked" in keeper.last_error and calls == ["failing"]
        blocker.execute("COMMIT")
        blocker.close()
        keeper.renew_once()
        assert not keeper.failing and keeper.last_error is None and calls == ["failing", "restored"]
        facts = keeper.facts()
        assert facts["ttl"] == 5.0 and facts["failingSince"] is None and facts["expired"] == 0
    finally:
        store.close()
        reader.close()


def test_a_keeper_started_late_takes_an_expired_record_again(tmp_path):
    store = SqliteStore(tmp_path / "store.db")
    try:
        keeper = LivenessKeeper(store, "worker-2", 0.05, "agent")
        keeper.renew_once()
        keeper._stopping.wait(0.1)                   # past its ttl: expired
        assert store.node_liveness() == {}
        keeper.renew_once()
        assert keeper.expired == 1 and "worker-2" in store.node_liveness()
    finally:
        store.close()


def test_nodes_are_ready_while_their_liveness_is_held(tmp_path):
    from lace.store.nodes import with_ready
    store = SqliteStore(tmp_path / "store.db")
    try:
        for name in ("worker-1", "worker-2"):
            store.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        store.update_status("nodes", "worker-2", None, {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]})
        store.keep_alive("worker-1", 10, "lace-agent pid 9")
        nodes = {n["metadata"]["name"]: n for n in with_ready(store.list("nodes").items, store.node_liveness())}
        one = nodes["worker-1"]["status"]["conditions"]
        assert one[0]["status"] == "True" and "lace-agent pid 9" in one[0]["message"]
        two = nodes["worker-2"]["status"]["conditions"]      # a stored Ready is not believed
        assert [(c["type"], c["status"]) for c in two] == [("Ready", "Unknown"), ("MemoryPressure", "False")]
        assert two[0]["reason"] == "LivenessExpired"
        assert "conditions" not in (store.get("nodes", "worker-1").get("status") or {})   # never stored
    finally:
        store.close()


def test_a_bug_in_a_renewal_is_a_failed_renewal_and_the_thread_goes_on(tmp_path):
    store = SqliteStore(tmp_path / "store.db")
    calls = []
    keeper = LivenessKeeper(store, "worker-1", 0.3, "agent pid 1", on_failing=lambda: calls.append("failing"),
                            on_restored=lambda: calls.append("restored"))
    real, broken = store.keep_alive, [2]

    def keep_alive(*args):
        if broken:
            broken.pop()
            raise RuntimeError("a bug")
        return real(*args)

    store.keep_alive = keep_alive
    try:
        keeper.start()
        deadline = time.monotonic() + 5
        while "restored" not in calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls == ["failing", "restored"]          # failed twice, told once; then renewed
        assert not keeper.failing and keeper.last_renewed is not None
    finally:
        keeper.stop()
        store.close()


@pytest.mark.parametrize("ttl", [0, -1.0, float("nan")])
def test_a_ttl_that_is_not_positive_is_a_configuration_error(tmp_path, ttl):
    with SqliteStore(tmp_path / "store.db") as store:
        with pytest.raises(ValueError, match="liveness TTL of node worker-1 .*positive.*--liveness-ttl"):
            LivenessKeeper(store, "worker-1", ttl, "agent pid 1")


def test_a_renewal_the_store_does_not_answer_reads_as_store_unavailable(tmp_path):
    """While a renewal waits on a locked store (its busy timeout longer than the keeper's
    interval), the status already says the store is unavailable, before the renewal fails."""
    import threading
    from lace.agent.status import liveness_check
    path = tmp_path / "store.db"
    store = SqliteStore(path, busy_timeout=5.0)
    keeper = LivenessKeeper(store, "worker-1", 0.6, "agent")   # interval 0.2 s
    try:
        keeper.renew_once()
        assert keeper.facts()["failingSince"] is None
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        waiting = threading.Thread(target=keeper.renew_once)
        waiting.start()
        time.sleep(0.5)
        facts = keeper.facts()
        assert facts["failingSince"] is not None and "not answered a renewal" in facts["lastError"], facts
        assert "store unavailable" in liveness_check(facts, time.time())["reason"]
        blocker.execute("COMMIT")
        blocker.close()
        waiting.join()
        assert keeper.facts()["failingSince"] is None and not keeper.failing
    finally:
        store.close()
