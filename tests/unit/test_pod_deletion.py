"""Graceful Pod deletion: the store marks a running pod terminating, its kubelet removes it;
``lace delete`` asks for it and waits, ``--force`` removes at once."""

from __future__ import annotations

import io
import threading
import time

import pytest

from lace.cli import context
from lace.cli.main import main
from lace.cli.status import ExitStatus
from lace.store import Conflict, NotFound, SqliteStore


def pod(name, node="node-1", **spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, **spec}}


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "store.db")
    yield s
    s.close()


def running(store, name, **spec):
    store.apply(pod(name, **spec))
    store.update_status("pods", name, "default", {"phase": "Running"})
    return store.get("pods", name)


def test_running_pod_is_marked_then_removed_by_uid(store):
    p = running(store, "web")
    marked = store.delete("pods", "web", grace_period=None)
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 30 and marked["metadata"]["deletionTimestamp"]
    assert store.get("pods", "web")["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    # a second delete may shorten the wait, not lengthen it
    assert store.delete("pods", "web", grace_period=60)["metadata"]["deletionGracePeriodSeconds"] == 30
    assert store.delete("pods", "web", grace_period=5)["metadata"]["deletionGracePeriodSeconds"] == 5
    # apply keeps the mark: a body never sets or clears it
    store.apply(pod("web", terminationGracePeriodSeconds=10))
    assert store.get("pods", "web")["metadata"]["deletionGracePeriodSeconds"] == 5
    with pytest.raises(Conflict):
        store.delete("pods", "web", grace_period=0, uid="another")
    store.delete("pods", "web", grace_period=0, uid=p["metadata"]["uid"])
    with pytest.raises(NotFound):
        store.get("pods", "web")


def test_what_is_removed_at_once(store):
    running(store, "own", terminationGracePeriodSeconds=3)
    assert store.delete("pods", "own", grace_period=None)["metadata"]["deletionGracePeriodSeconds"] == 3
    store.apply(pod("unbound", node=None) | {"spec": {}})
    store.apply(pod("unstarted"))
    done = running(store, "done")
    store.update_status("pods", "done", "default", {"phase": "Succeeded"})
    for name in ("unbound", "unstarted", "done"):
        store.delete("pods", name, grace_period=None)
        with pytest.raises(NotFound):
            store.get("pods", name)
    assert done
    # a created pod never carries a deletion mark from its body
    created = store.create(pod("fresh") | {"metadata": {"name": "fresh", "namespace": "default",
                                                        "deletionTimestamp": "2020-01-01T00:00:00Z"}})
    assert "deletionTimestamp" not in created["metadata"]


@pytest.fixture
def cli(tmp_path):
    env = {"LACE_STATE_DIR": str(tmp_path / "state")}
    lab = context.lab_context("t", env)
    lab.dir.mkdir(parents=True)
    SqliteStore(lab.store_path).close()
    context.set_current("t", env)

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        rc = main(list(argv), env, stdout=out, stderr=err)
        return rc, out.getvalue(), err.getvalue()
    return run, lab.store_path


def test_lace_delete_waits_for_the_kubelet(cli):
    run, path = cli
    with SqliteStore(path) as s:
        running(s, "web")
        running(s, "db")
        running(s, "cache")

    def kubelet():   # what the lab's kubelet does once the pod is stopped
        with SqliteStore(path) as s:
            while True:
                p = s.get("pods", "web")
                if p["metadata"].get("deletionTimestamp"):
                    s.delete("pods", "web", grace_period=0, uid=p["metadata"]["uid"])
                    return
                time.sleep(0.02)
    t = threading.Thread(target=kubelet)
    t.start()
    rc, out, err = run("delete", "pod", "web", "--grace-period", "7")
    t.join(5)
    assert rc == ExitStatus.OK and out == 'pod "web" deleted\n', err
    rc, out, _ = run("delete", "pod", "db", "--wait=false")
    assert rc == ExitStatus.OK
    with SqliteStore(path) as s:
        assert s.get("pods", "db")["metadata"]["deletionGracePeriodSeconds"] == 30
    assert run("delete", "pod", "db", "--force")[0] == ExitStatus.OK
    assert run("delete", "pod", "cache", "--grace-period", "0")[0] == ExitStatus.OK
    with SqliteStore(path) as s:
        assert [p["metadata"]["name"] for p in s.list("pods").items] == []
    rc, _, err = run("delete", "pod", "x", "--grace-period", "-5")
    assert rc == ExitStatus.USAGE and "negative" in err


def test_lace_delete_says_when_no_kubelet_removes_the_pod(cli, monkeypatch):
    from lace.cli.commands import delete
    monkeypatch.setattr(delete, "WAIT_MARGIN", 0.2)
    run, path = cli
    with SqliteStore(path) as s:
        running(s, "web")
    rc, out, err = run("delete", "pod", "web", "--grace-period", "0", "--wait")
    assert rc == ExitStatus.OK
    with SqliteStore(path) as s:
        running(s, "web")
    rc, out, err = run("delete", "pod", "web", "--grace-period", "1")
    assert rc == ExitStatus.UNAVAILABLE and "still terminating after 1s" in err and "--force" in err
    assert "Traceback" not in err
