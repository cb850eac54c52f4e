"""What only the etcd backend has: its key layout, revisions from etcd, lost races retried, clear
errors when etcd cannot be reached; and the store spec every component opens a store with.

The etcd tests use the session's etcd in its own network namespace (tests/unit/conftest.py).
"""

from __future__ import annotations

import base64

import pytest

from lace.store import Conflict, StoreConfig, StoreError, Unavailable, open_store
from lace.store import kinds as K
from lace.store.allocate import NETWORK_IDS

privileged = pytest.mark.privileged


def pod(name, ns="default"):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": "node-1"}}


@pytest.fixture
def etcd_store(etcd_config):
    s = open_store(etcd_config)
    yield s
    s.close()


def _raw(store, key):
    out = store.backend.gateway.call("kv/range", {"key": base64.b64encode(key.encode()).decode()})
    kv = out["kvs"][0]
    return base64.b64decode(kv.get("value", "")), int(kv["mod_revision"]), int(kv["create_revision"])


@privileged
def test_keys_are_laid_out_like_the_apiservers_and_resource_version_is_the_mod_revision(etcd_store):
    prefix = etcd_store.backend.prefix
    created = etcd_store.create(pod("web", ns="default"))
    value, mod, _ = _raw(etcd_store, f"{prefix}/registry/Pod/default/web")
    assert b"resourceVersion" not in value            # derived on read, not stored
    assert created["metadata"]["resourceVersion"] == str(mod)
    value, mod, _ = _raw(etcd_store, f"{prefix}/registry/Network/default")   # cluster-scoped
    assert etcd_store.get("net", "default")["metadata"]["resourceVersion"] == str(mod)
    etcd_store.create({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "blue"},
                       "spec": {"cidrs": ["10.10.0.0/16"]}})
    counter, _, _ = _raw(etcd_store, f"{prefix}/counters/{NETWORK_IDS}")
    assert int(counter) == 3   # the next network's ID: "blue" took 2


@privileged
def test_one_transaction_is_one_etcd_revision(etcd_store):
    before = etcd_store.revision()
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}
    results = etcd_store.apply_all([ns, pod("a", "demo"), pod("b", "demo")])
    assert {r.object["metadata"]["resourceVersion"] for r in results} == {str(before + 1)}
    assert etcd_store.revision() == before + 1
    w = etcd_store.watch(["pods", "namespaces"], since=before, timeout=5)
    events = [next(w) for _ in range(3)]
    w.stop()
    assert {(e.type, e.object["metadata"]["name"], e.resource_version) for e in events} == {
        ("ADDED", "demo", str(before + 1)), ("ADDED", "a", str(before + 1)), ("ADDED", "b", str(before + 1))}


@privileged
def test_a_commit_that_lost_the_race_raises_conflict_and_run_retries_the_body(etcd_config):
    one, two = open_store(etcd_config), open_store(etcd_config)
    try:
        backend = one.backend
        with pytest.raises(Conflict, match="another writer committed first"):
            with backend.transaction() as txn:
                assert txn.get("Pod", "default", "x") is None
                two.create(pod("x"))           # commits after our snapshot
                txn.create(pod("x"))
        attempts = []

        def body(txn):
            attempts.append(txn.revision())
            assert txn.get("Pod", "default", f"y{len(attempts)}") is None
            if len(attempts) == 1:
                two.create(pod("y1"))          # what the body read: a race lost once
            return txn.next_value("test-counter", 7)

        assert backend.run(body) == 7
        assert len(attempts) == 2 and attempts[1] > attempts[0]
        assert backend.run(body) == 8
    finally:
        one.close()
        two.close()


def _lease(ip, node="node-1", block="10.244.1.0/24"):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
            "metadata": {"name": K.lease_name("default", ip)},
            "spec": {"network": "default", "node": node, "block": K.block_name("default", block),
                     "ip": ip, "pod": "default/web", "containerID": f"c-{ip}"}}


def _block(cidr, node):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "IPBlock", "metadata": {"name": K.block_name("default", cidr)},
            "spec": {"network": "default", "node": node, "cidr": cidr}}


def _race(store, other, read, write):
    """Whether a transaction of ``store`` that ran ``read`` commits after ``other`` ran ``write``
    between its snapshot and its commit (False: it lost the race)."""
    try:
        with store.backend.transaction() as txn:
            txn.revision()                        # the snapshot
            read(txn)
            write(other)
            txn.next_value("race-counter", 0)     # something to commit
        return True
    except Conflict:
        return False


@privileged
def test_a_commit_checks_what_it_read_so_disjoint_writers_commit_side_by_side(etcd_config):
    one, two = open_store(etcd_config), open_store(etcd_config)
    try:
        one.apply_all([_block("10.244.1.0/24", "node-1"), _block("10.244.2.0/24", "node-2"),
                       _lease("10.244.1.5"), _lease("10.244.1.6"), _lease("10.244.2.5", "node-2", "10.244.2.0/24")])
        block1 = lambda txn: txn.list_prefix("IPLease", "", K.lease_prefix("default", "10.244.1.0/24"))
        # a key read by itself: changed, created or deleted since the snapshot loses the race
        assert not _race(one, two, lambda t: t.get("Pod", "default", "a"), lambda s: s.create(pod("a")))
        assert not _race(one, two, lambda t: t.get("Pod", "default", "a"),
                         lambda s: s.apply({**pod("a"), "metadata": {"name": "a", "namespace": "default",
                                                                     "labels": {"x": "y"}}}))
        assert not _race(one, two, lambda t: t.get("Pod", "default", "a"), lambda s: s.delete("pod", "a"))
        # a range listed: a key created, changed or deleted in it loses the race
        assert not _race(one, two, block1, lambda s: s.create(_lease("10.244.1.7")))
        assert not _race(one, two, block1, lambda s: s.apply({**_lease("10.244.1.7"), "metadata": {
            "name": K.lease_name("default", "10.244.1.7"), "annotations": {"a": "b"}}}))
        assert not _race(one, two, block1, lambda s: s.delete("iplease", K.lease_name("default", "10.244.1.7")))
        # a whole kind listed: a delete anywhere in it loses the race
        assert not _race(one, two, lambda t: t.list("IPLease"),
                         lambda s: s.delete("iplease", K.lease_name("default", "10.244.2.5")))
        # what it did not read commits side by side: another block's leases, another key
        assert _race(one, two, block1, lambda s: s.create(_lease("10.244.2.6", "node-2", "10.244.2.0/24")))
        assert _race(one, two, block1, lambda s: s.delete("iplease", K.lease_name("default", "10.244.2.6")))
        assert _race(one, two, lambda t: t.get("Pod", "default", "b"), lambda s: s.create(pod("c")))
        # counters are keys: two writers of one counter never both commit
        assert not _race(one, two, lambda t: None, lambda s: s.backend.run(lambda t: t.next_value("race-counter", 0)))
    finally:
        one.close()
        two.close()


@privileged
def test_a_transaction_with_too_much_to_check_commits_only_if_nothing_committed_since(etcd_config, monkeypatch):
    from lace.store import etcd as etcd_backend
    one, two = open_store(etcd_config), open_store(etcd_config)
    try:
        monkeypatch.setattr(etcd_backend, "MAX_COMPARES", 4)     # 4 reads and the counter: 5
        reads = lambda names: lambda t: [t.get("Pod", "default", n) for n in names]
        assert not _race(one, two, reads("abcd"), lambda s: s.create(pod("unrelated")))
        assert _race(one, two, reads("abc"), lambda s: s.create(pod("unrelated-2")))
        monkeypatch.setattr(etcd_backend, "MAX_COMPARES", 64)
        monkeypatch.setattr(etcd_backend, "WIDE_RANGE", 1)
        one.create(pod("x"))
        one.create(pod("y"))
        assert not _race(one, two, lambda t: t.list("Pod", "default"),
                         lambda s: s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}))
    finally:
        one.close()
        two.close()


@privileged
def test_unreachable_etcd_is_unavailable_naming_the_endpoint_and_the_fix(etcd_server):
    with pytest.raises(Unavailable) as info:
        open_store(StoreConfig("etcd", endpoints=("127.0.0.1:1",), netns=etcd_server.netns))
    assert "cannot reach etcd at http://127.0.0.1:1" in str(info.value)
    assert etcd_server.netns in str(info.value) and "connection refused" in str(info.value)
    assert "lace lab up --store etcd" in info.value.hint
    with pytest.raises(Unavailable, match="cannot enter the network namespace /run/netns/no-such-ns"):
        open_store(StoreConfig("etcd", endpoints=("127.0.0.1:2379",), netns="no-such-ns"))


@privileged
def test_a_second_member_endpoint_is_used_when_the_first_refuses(etcd_server, etcd_config):
    endpoint = etcd_config.endpoints[0]
    config = StoreConfig("etcd", endpoints=("127.0.0.1:1", endpoint), prefix=etcd_config.prefix,
                         netns=etcd_config.netns)
    s = open_store(config)
    try:
        s.create(pod("a"))
        with s.watch(["pods"], since=s.revision() - 1, timeout=5) as w:
            assert next(w).object["metadata"]["name"] == "a"
    finally:
        s.close()


def test_store_specs():
    assert StoreConfig.parse("/var/lib/lace/store.db") == StoreConfig("sqlite", path="/var/lib/lace/store.db")
    assert StoreConfig.parse("sqlite:store.db").path == "store.db"
    cfg = StoreConfig.parse("etcd://10.0.0.1:2379,10.0.0.2:2379/lace-a?netns=lab-n1")
    assert cfg == StoreConfig("etcd", endpoints=("10.0.0.1:2379", "10.0.0.2:2379"), prefix="/lace-a",
                              netns="lab-n1")
    assert StoreConfig.parse(str(cfg)) == cfg
    assert StoreConfig.parse("etcd://[fd00::1]:2379").prefix == "/lace"
    with pytest.raises(StoreError, match="names no etcd endpoint"):
        StoreConfig.parse("etcd:///lace")
    with pytest.raises(StoreError, match="unknown option"):
        StoreConfig.parse("etcd://h:1?tls=1")
    with pytest.raises(StoreError, match="not a store spec"):
        StoreConfig.parse("http://h:2379")
    assert K.resolve_kind("pods").kind == "Pod"


def test_a_lab_state_dir_names_its_store(tmp_path):
    from lace.store.config import lab_store, write_lab_store
    assert lab_store(tmp_path) == StoreConfig("sqlite", path=str(tmp_path / "store.db"))
    etcd = StoreConfig.parse("etcd://[fd5e:ff::1]:2379,[fd5e:ff::2]:2379/lace?netns=lace-x-worker-1")
    write_lab_store(tmp_path, etcd)
    assert lab_store(tmp_path) == etcd
    # an agent inside a node's namespace reaches the members from where it runs
    assert str(etcd.without_netns()) == "etcd://[fd5e:ff::1]:2379,[fd5e:ff::2]:2379/lace"
    with open_store(tmp_path / "other.db") as s:
        assert type(s).__name__ == "SqliteStore"


@privileged
def test_liveness_is_a_leased_key_outside_the_registry_and_the_guard(etcd_store):
    prefix = etcd_store.backend.prefix
    etcd_store.create(pod("before"))
    _, guard_rev, _ = _raw(etcd_store, f"{prefix}/txn-guard")
    beat = etcd_store.keep_alive("node-1", 10, "agent pid 1")
    out = etcd_store.backend.gateway.call(
        "kv/range", {"key": base64.b64encode(f"{prefix}/liveness/node-1".encode()).decode()})
    assert int(out["kvs"][0]["lease"]) != 0           # etcd deletes it when the lease runs out
    assert _raw(etcd_store, f"{prefix}/txn-guard")[1] == guard_rev
    # a transaction whose snapshot predates the liveness key still commits: nothing it read moved
    with etcd_store.backend.transaction() as txn:
        txn.create(pod("after"))
    beat.release()
    assert etcd_store.node_liveness() == {}


@privileged
def test_a_liveness_key_whose_put_failed_is_taken_again_not_reported_alive(etcd_store):
    from lace.store.etcd import _EtcdError

    beat = etcd_store.keep_alive("node-1", 10, "agent pid 1")
    real, failures = beat._gateway.call, [1]

    def call(path, body, **kw):
        if path == "kv/put" and failures:
            failures.pop()
            raise _EtcdError("injected: the put did not happen")
        return real(path, body, **kw)

    beat._gateway.call = call
    etcd_store.backend.gateway.call("kv/lease/revoke", {"ID": beat._lease})   # as if it expired
    with pytest.raises(Unavailable, match="injected"):
        beat.renew()                       # takes a new lease, but its key is not written
    assert etcd_store.node_liveness() == {}
    assert beat.renew() is False           # not "renewed": it takes the key again
    assert set(etcd_store.node_liveness()) == {"node-1"}
    assert beat.renew() is True
    beat.release()


@privileged
def test_prefetch_reads_a_batch_at_the_snapshot_in_one_request(etcd_config):
    one, two = open_store(etcd_config), open_store(etcd_config)
    try:
        one.create(pod("old"))
        calls = []
        gateway = one.backend.gateway
        real = gateway.call
        gateway.call = lambda path, body, **kw: (calls.append(path), real(path, body, **kw))[1]
        with one.backend.transaction(write=False) as txn:
            txn.revision()                                   # the snapshot starts here
            two.create(pod("new"))                           # after it: not to be seen
            calls.clear()
            txn.prefetch([("Pod", "default", n) for n in ("old", "new", "none")])
            assert calls == ["kv/txn"]
            assert txn.get("Pod", "default", "old")["metadata"]["name"] == "old"
            assert txn.get("Pod", "default", "new") is None and txn.get("Pod", "default", "none") is None
            assert calls == ["kv/txn"]                       # served from what was prefetched
    finally:
        one.close()
        two.close()


@privileged
def test_an_allocation_is_three_requests_whatever_the_other_nodes_hold(etcd_store):
    import ipaddress
    cidrs = [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")]
    for node in ("node-1", "node-2"):
        for i in range(3):
            etcd_store.allocate_leases("default", node, cidrs, f"default/{node}-{i}", f"{node}-{i}", "eth0")
    calls = []
    gateway = etcd_store.backend.gateway
    real = gateway.call
    gateway.call = lambda path, body, **kw: (calls.append((path, body)), real(path, body, **kw))[1]
    leases = etcd_store.allocate_leases("default", "node-1", cidrs, "default/new", "new", "eth0")
    assert sorted(str(l.ip) for l in leases) == ["10.244.0.4", "fd00:10:244::4"]
    # the IPBlocks; the node's two blocks' leases and the Network in one Txn; the commit
    assert [path for path, _ in calls] == ["kv/range", "kv/txn", "kv/txn"]
    read = [base64.b64decode(op["request_range"]["key"]).decode() for op in calls[1][1]["success"]]
    assert not any("node-2" in key or "10-244-1-" in key for key in read)
