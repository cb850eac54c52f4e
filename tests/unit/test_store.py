"""The store suite, run against every backend (tests/unit/conftest.py: SQLite and a real etcd):
Kubernetes-like CRUD, revisions, atomic batches, watch, compaction, allocators, and several
processes and clients sharing one store. The tests at the end marked SQLite-only look at the file
itself (WAL mode, event rows)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lace.store import (AlreadyExists, Conflict, Forbidden, Gone, IpamExhausted, NotFound, SqliteStore,
                        UnknownKind, ValidationError)
from lace.store import kinds as K


def net(name, cidrs, routes=None):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": name},
            "spec": {"cidrs": cidrs, **({"routes": routes} if routes is not None else {})}}


def pod(name, ns="default", network=None, labels=None, node="node-1"):
    meta = {"name": name, "namespace": ns}
    if network:
        meta["annotations"] = {K.NETWORK_ANNOTATION: network}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node}}


def ns(name):
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def test_init_creates_default_network_and_namespaces(store_factory):
    store = store_factory()
    default = store.get("networks", "default")
    assert default["status"]["id"] == 1
    assert default["spec"]["cidrs"] == ["10.244.0.0/16", "fd00:10:244::/56"]
    assert {o["metadata"]["name"] for o in store.list("ns").items} == {"default", "kube-system"}
    # reopening does not duplicate anything
    rev = store.revision()
    store_factory().close()
    assert store.revision() == rev


def test_create_sets_metadata_and_revision(store):
    before = store.revision()
    obj = store.create(net("blue", ["10.10.0.0/16"]))
    meta = obj["metadata"]
    assert meta["resourceVersion"] == str(before + 1) and store.revision() == before + 1
    assert meta["generation"] == 1 and len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z")
    assert obj["status"] == {"id": 2}
    assert store.get("net", "blue") == obj
    with pytest.raises(AlreadyExists):
        store.create(net("blue", ["10.11.0.0/16"]))
    assert store.create(net("red", ["10.10.0.0/16"]))["status"]["id"] == 3


@pytest.mark.parametrize("alias", ["pods", "pod", "po", "Pod", "pods", "POD"])
def test_kind_aliases(store, alias):
    store.create(pod("web"))
    assert store.get(alias, "web")["metadata"]["name"] == "web"


def test_every_kubectl_name_resolves():
    for names, kind in [("pods pod po", "Pod"), ("namespaces namespace ns", "Namespace"),
                        ("nodes node no", "Node"), ("networkpolicies networkpolicy netpol", "NetworkPolicy"),
                        ("services service svc", "Service"), ("networks network net network.lace.dev", "Network"),
                        ("segments", "Segment"), ("ipblocks", "IPBlock"), ("ipleases", "IPLease")]:
        for name in names.split():
            assert K.resolve_kind(name).kind == kind
    with pytest.raises(UnknownKind):
        K.resolve_kind("deployments")


def test_get_and_delete_not_found(store):
    with pytest.raises(NotFound, match='Pod "nope" not found in namespace "default"'):
        store.get("pods", "nope")
    with pytest.raises(NotFound):
        store.delete("net", "nope")


def test_apply_creates_configures_and_keeps_status(store):
    assert store.apply(pod("web", labels={"a": "1"})).outcome == "created"
    store.update_status("pod", "web", "default", {"phase": "Running", "podIPs": [{"ip": "10.244.0.5"}]})
    again = store.apply(pod("web", labels={"a": "1"}))
    assert again.outcome == "unchanged"
    rev = store.revision()
    changed = store.apply(pod("web", labels={"a": "2"}, node="node-2"))
    assert changed.outcome == "configured" and store.revision() == rev + 1
    obj = changed.object
    assert obj["metadata"]["labels"] == {"a": "2"} and obj["spec"]["nodeName"] == "node-2"
    assert obj["status"]["phase"] == "Running"
    assert obj["metadata"]["generation"] == 2
    # labels-only change does not bump generation
    assert store.apply(pod("web", labels={"a": "3"}, node="node-2")).object["metadata"]["generation"] == 2


def test_apply_ignores_status_in_body_but_network_id_is_kept(store):
    body = net("blue", ["10.10.0.0/16"])
    body["status"] = {"id": 99}
    created = store.apply(body).object
    assert created["status"] == {"id": 2}
    body["spec"]["cidrs"].append("fd00:b::/64")
    assert store.apply(body).object["status"] == {"id": 2}
    store.update_status("net", "blue", None, {"id": 77, "note": "x"})
    assert store.get("net", "blue")["status"] == {"id": 2, "note": "x"}


def test_update_optimistic_concurrency(store):
    obj = store.create(pod("web"))
    fresh = dict(obj, spec={"nodeName": "node-2"})
    updated = store.update(fresh)
    assert updated["spec"]["nodeName"] == "node-2"
    stale = dict(obj, spec={"nodeName": "node-3"})  # still carries the old resourceVersion
    with pytest.raises(Conflict, match="was modified"):
        store.update(stale)
    with pytest.raises(NotFound):
        store.update(pod("other"))
    with pytest.raises(Conflict):
        store.update_status("pod", "web", "default", {"phase": "Running"},
                            resource_version=obj["metadata"]["resourceVersion"])


def test_apply_all_is_atomic_and_orders_dependencies(store):
    rev = store.revision()
    batch = [pod("web", ns="demo", network="blue"), net("blue", ["10.10.0.0/16"]), ns("demo"),
             net("bad", ["10.244.1.0/24"])]
    with pytest.raises(ValidationError) as info:
        store.apply_all(batch)
    assert info.value.index == 3 and 'Network "bad"' in str(info.value)
    assert store.revision() == rev   # nothing written: no revision, so no event either
    with pytest.raises(NotFound):
        store.get("net", "blue")
    results = store.apply_all(batch[:3])
    assert [r.outcome for r in results] == ["created"] * 3
    assert results[0].object["metadata"]["namespace"] == "demo"
    # every object comes back as stored, its resourceVersion the one a read gives
    for r in results:
        meta = r.object["metadata"]
        stored = store.get(r.object["kind"], meta["name"], meta.get("namespace"))
        assert stored["metadata"]["resourceVersion"] == meta["resourceVersion"]
    assert max(int(r.object["metadata"]["resourceVersion"]) for r in results) == store.revision()


def test_apply_all_rejects_duplicates_and_dry_run_writes_nothing(store):
    with pytest.raises(ValidationError, match="appears twice") as info:
        store.apply_all([net("blue", ["10.10.0.0/16"]), net("blue", ["10.11.0.0/16"])])
    assert info.value.index == 1
    rev = store.revision()
    assert store.apply_all([net("blue", ["10.10.0.0/16"])], dry_run=True)[0].outcome == "created"
    assert store.revision() == rev
    with pytest.raises(NotFound):
        store.get("net", "blue")


def test_delete_rules(store):
    store.apply_all([ns("demo"), net("blue", ["10.10.0.0/16"]), pod("web", ns="demo", network="blue"),
                     net("red", ["10.20.0.0/16"], [{"to": "blue"}])])
    with pytest.raises(Forbidden, match="cannot be deleted"):
        store.delete("net", "default")
    with pytest.raises(Forbidden, match=r"in use by 1 pod\(s\): demo/web"):
        store.delete("net", "blue")
    with pytest.raises(Forbidden, match="cannot be deleted"):
        store.delete("ns", "default")
    # deleting a namespace deletes what is in it
    store.delete("ns", "demo")
    assert store.list("pods").items == []
    with pytest.raises(Forbidden, match="target of routes"):
        store.delete("net", "blue")
    store.delete("net", "red")
    deleted = store.delete("net", "blue")
    assert int(deleted["metadata"]["resourceVersion"]) == store.revision()


def test_list_namespaces_and_selectors(store):
    store.apply_all([ns("demo"), pod("a", labels={"app": "web", "tier": "front"}),
                     pod("b", labels={"app": "db"}), pod("c", ns="demo", labels={"app": "web"})])
    assert [o["metadata"]["name"] for o in store.list("pods").items] == ["a", "b", "c"]
    assert [o["metadata"]["name"] for o in store.list("pods", "demo").items] == ["c"]
    assert [o["metadata"]["name"] for o in store.list("pods", label_selector="app=web").items] == ["a", "c"]
    sel = {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
    assert [o["metadata"]["name"] for o in store.list("pods", label_selector=sel).items] == ["b", "c"]
    result = store.list("pods")
    assert result.resource_version == str(store.revision())
    with pytest.raises(ValidationError):
        store.list("pods", label_selector="a in (")


def test_watch_replays_since_then_blocks_and_stops(store):
    start = store.revision()
    store.create(pod("a"))
    w = store.watch(["pods"], since=start, timeout=5)
    first = next(w)
    assert (first.type, first.object["metadata"]["name"], first.resource_version) == ("ADDED", "a", str(start + 1))
    got = []

    def consume():
        for ev in w:
            got.append(ev)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.05)
    store.create(net("blue", ["10.10.0.0/16"]))  # filtered out by kind
    store.update_status("pod", "a", "default", {"phase": "Running"})
    store.delete("pod", "a")
    deadline = time.monotonic() + 2
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    t.join(2)
    assert not t.is_alive()
    assert [(e.type, e.object["kind"]) for e in got] == [("MODIFIED", "Pod"), ("DELETED", "Pod")]
    assert int(got[1].resource_version) == store.revision()


def test_watch_wakes_promptly_and_times_out(store):
    w = store.watch(since=None, timeout=0.3)
    t0 = time.monotonic()
    assert list(w) == []
    assert 0.25 < time.monotonic() - t0 < 5.0   # waited its timeout, then ended
    w = store.watch(timeout=5)
    threading.Timer(0.05, lambda: store.create(pod("x"))).start()
    t0 = time.monotonic()
    ev = next(w)
    assert ev.object["metadata"]["name"] == "x" and time.monotonic() - t0 < 2.5   # the write woke it, not the 5 s timeout
    w.stop()


def test_compaction_makes_old_watches_gone(store):
    old = store.revision()
    for i in range(30):
        store.apply(pod("p", labels={"i": str(i)}))
    kept_from = store.revision() - 10
    assert store.compact(keep=10) >= kept_from
    with pytest.raises(Gone, match="too old") as info:
        store.watch(since=old)
    assert "list again" in info.value.hint
    # the newest events are still there to watch from
    w = store.watch(["pods"], since=kept_from, timeout=5)
    assert next(w).object["metadata"]["labels"] == {"i": "20"}
    w.stop()
    # relist and watch from the list's revision works
    rv = store.list("pods").resource_version
    w = store.watch(since=rv, timeout=0.1)
    assert list(w) == []


def test_allocate_segment_is_stable(store):
    a = store.allocate_segment("default", "demo", {"app": "web", "tier": "f"})
    assert a >= 256
    assert store.allocate_segment("default", "demo", {"tier": "f", "app": "web"}) == a
    b = store.allocate_segment("default", "demo", {"app": "db"})
    c = store.allocate_segment("default", "other", {"app": "web", "tier": "f"})
    assert len({a, b, c}) == 3
    segs = store.list("segments").items
    assert sorted(s["status"]["id"] for s in segs) == sorted([a, b, c])
    with pytest.raises(ValidationError):
        store.allocate_segment("nope", "demo", {})


def test_allocate_block_never_overlaps(store):
    b1 = store.allocate_block("default", "node-1", 4, 24)
    b2 = store.allocate_block("default", "node-2", 4, 24)
    assert store.allocate_block("default", "node-1", 4, 24) == b1
    b3 = store.allocate_block("default", "node-1", 4, 24, additional=True)
    v6 = store.allocate_block("default", "node-1", 6, 64)
    nets = [ipaddress.ip_network(x) for x in (b1, b2, b3)]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    assert all(n.subnet_of(ipaddress.ip_network("10.244.0.0/16")) for n in nets)
    assert ipaddress.ip_network(v6).subnet_of(ipaddress.ip_network("fd00:10:244::/56"))
    # mixed sizes still never overlap
    b4 = ipaddress.ip_network(store.allocate_block("default", "node-3", 4, 23))
    assert not any(b4.overlaps(n) for n in nets)
    blocks = store.list("ipblocks").items
    assert {b["spec"]["node"] for b in blocks} == {"node-1", "node-2", "node-3"}
    # a hand-written overlapping block is rejected
    with pytest.raises(ValidationError, match="overlaps IPBlock"):
        store.create({"apiVersion": K.LACE_API_VERSION, "kind": "IPBlock", "metadata": {"name": "x"},
                      "spec": {"network": "default", "node": "node-9", "cidr": b1}})


def test_allocate_block_exhaustion(store):
    store.create(net("tiny", ["10.50.0.0/23"]))
    store.allocate_block("tiny", "a", 4, 24)
    store.allocate_block("tiny", "b", 4, 24)
    from lace.store import Exhausted
    with pytest.raises(Exhausted):
        store.allocate_block("tiny", "c", 4, 24)
    with pytest.raises(Exhausted, match="no IPv6"):
        store.allocate_block("tiny", "c", 6, 64)


def run_at_once(stores: list, work, timeout: float) -> None:
    """``work(i, store)`` for every client at once, a thread each; an error in any fails the test."""
    errors: list[BaseException] = []

    def guarded(i, s):
        try:
            work(i, s)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i, s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), f"a client was still working after {timeout:g} s"


def test_concurrent_clients_never_allocate_twice(store_factory):
    """Writers on separate clients racing for blocks, segment IDs and names: every allocation is
    distinct and every create of one name succeeds once (the transactions are serializable)."""
    stores = [store_factory() for _ in range(3)]
    blocks: list[str] = []
    segments: list[int] = []
    created: list[str] = []

    def work(i, s):
        for j in range(4):
            blocks.append(s.allocate_block("default", f"node-{i}-{j}", 4, 26))
            segments.append(s.allocate_segment("default", "default", {"w": f"{i}-{j}"}))
            try:
                s.create(pod("shared", labels={"by": str(i)}))
                created.append(str(i))
            except AlreadyExists:
                pass

    run_at_once(stores, work, 60)
    nets = [ipaddress.ip_network(b) for b in blocks]
    assert len(nets) == 12
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
    assert len(set(segments)) == 12
    assert len(created) == 1
    assert len(stores[0].list("ipblocks").items) == 12


def test_leases(store):
    block = store.allocate_block("default", "node-1", 4, 24)
    ip = str(next(ipaddress.ip_network(block).hosts()))
    lease = {"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
             "metadata": {"name": K.lease_name("default", ip)},
             "spec": {"network": "default", "node": "node-1", "block": K.block_name("default", block),
                      "ip": ip, "pod": "default/web", "containerID": "abc", "ifname": "eth0"}}
    store.create(lease)
    with pytest.raises(AlreadyExists):
        store.create(lease)


def test_a_list_can_convert_each_object_as_it_reads_it(store):
    """A cache that keeps slim records lists with ``convert``: the records of exactly the objects a
    plain list gives, selector and namespace applied first, at the same revision."""
    from lace.store.records import PodRecord
    store.apply_all([pod("web-1", labels={"app": "web"}), pod("web-2", ns="kube-system", labels={"app": "web"}),
                     pod("db-1", labels={"app": "db"})])
    for ns, selector in ((None, None), ("default", None), (None, "app=web")):
        plain = store.list("pods", ns, selector)
        slim = store.list("pods", ns, selector, convert=PodRecord.of)
        assert slim.items == [PodRecord.of(o) for o in plain.items] and slim.resource_version == plain.resource_version
    assert [p.key for p in store.list("pods", None, "app=web", convert=PodRecord.of).items] == ["default/web-1",
                                                                                             "kube-system/web-2"]


def test_allocated_leases_carry_the_objects_as_stored_for_a_watch_cache(store):
    """An agent puts the leases it allocated into its cache before its watch brings them: what it
    puts there must be the stored object, at the revision the watch will bring."""
    store.allocate_block("default", "node-1", 4, 24)
    cidrs = [ipaddress.ip_network("10.244.0.0/16")]
    (first,) = store.allocate_leases("default", "node-1", cidrs, "default/web", "abc", "eth0",
                                     {K.HOST_IFNAME_ANNOTATION: "lace0abc"})
    assert first.object == store.get("ipleases", first.name)
    # a retried ADD that names other interfaces updates the lease: the update is what it returns
    (retried,) = store.allocate_leases("default", "node-1", cidrs, "default/web", "abc", "eth0",
                                       {K.HOST_IFNAME_ANNOTATION: "lace1abc"})
    assert retried.object == store.get("ipleases", first.name)
    assert retried.object["metadata"]["annotations"][K.HOST_IFNAME_ANNOTATION] == "lace1abc"


def lease(network, ip, node="node-1", container="c", block=None):
    spec = {"network": network, "node": node, "ip": ip, "pod": "default/web", "containerID": container}
    if block:
        spec["block"] = K.block_name(network, block)
    return {"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
            "metadata": {"name": K.lease_name(network, ip)}, "spec": spec}


def test_list_prefix_reads_one_name_range_and_sees_the_transaction_s_own_writes(store):
    store.apply_all([lease("default", ip) for ip in ("10.244.1.5", "10.244.1.17", "10.244.10.5", "10.244.2.5")]
                    + [pod(n) for n in ("web-1", "web-2", "db-1")])

    def names(objs):
        return [o["metadata"]["name"] for o in objs]

    def body(txn):
        first = names(txn.list_prefix("IPLease", "", "default-10-244-1-"))
        txn.delete(txn.get("IPLease", "", K.lease_name("default", "10.244.1.5")))
        txn.create(lease("default", "10.244.1.9"))
        return (first, names(txn.list_prefix("IPLease", "", "default-10-244-1-")),
                names(txn.list_prefix("Pod", "default", "web-")), txn.list_prefix("Pod", "kube-system", "web-"))

    first, second, pods, none = store.backend.run(body, dry_run=True)
    assert first == ["default-10-244-1-17", "default-10-244-1-5"]
    assert second == ["default-10-244-1-17", "default-10-244-1-9"]
    assert pods == ["web-1", "web-2"] and none == []
    assert len(store.list("ipleases").items) == 4          # a dry run


def test_an_iplease_is_named_after_its_network_and_address(store):
    with pytest.raises(ValidationError, match="name it default-10-244-1-5"):
        store.create({**lease("default", "10.244.1.5"), "metadata": {"name": "mine"}})
    block = store.allocate_block("default", "node-1", 4, 24)
    ip = str(next(ipaddress.ip_network(block).hosts()))
    with pytest.raises(ValidationError, match="node-1's"):
        store.create(lease("default", ip, node="node-2", block=block))


class _ListSpy:
    """A backend transaction that records which kinds are listed whole."""

    def __init__(self, txn, listed):
        self._txn, self._listed = txn, listed

    def list(self, kind, namespace=None):
        self._listed.append(kind)
        return self._txn.list(kind, namespace)

    def __getattr__(self, name):
        return getattr(self._txn, name)


def test_leases_come_from_the_node_s_own_blocks_reading_no_other_lease(store, monkeypatch):
    store.create(net("small", ["10.60.0.0/27"]))          # two /28 blocks
    cidrs = [ipaddress.ip_network("10.60.0.0/27")]
    listed = []
    real = store.backend.run
    monkeypatch.setattr(store.backend, "run", lambda body, **kw: real(lambda txn: body(_ListSpy(txn, listed)), **kw))

    def ip(node, container, **kw):
        return str(store.allocate_leases("small", node, cidrs, f"default/{container}", container, "eth0", **kw)[0].ip)

    assert ip("n1", "a") == "10.60.0.1"
    assert ip("n2", "b") == "10.60.0.17"
    store.create(lease("small", "10.60.0.2", node="n1", container="hand", block="10.60.0.0/28"))
    assert ip("n1", "c") == "10.60.0.3"                     # the lowest free address
    assert ip("n1", "a", annotations={"x": "y"}) == "10.60.0.1"   # a retried ADD: the same lease
    assert store.get("iplease", K.lease_name("small", "10.60.0.1"))["metadata"]["annotations"] == {"x": "y"}
    assert [o["metadata"]["name"] for o in store.leases_for("n1", "a")] == [K.lease_name("small", "10.60.0.1")]
    assert store.leases_for("n2", "a") == []
    assert [o["spec"]["containerID"] for o in store.release_leases("n1", "a")] == ["a"]
    assert ip("n1", "d") == "10.60.0.1"
    assert [ip("n1", f"f{i}") for i in range(11)] == [f"10.60.0.{i}" for i in range(4, 15)]
    with pytest.raises(IpamExhausted) as info:
        ip("n1", "full")
    assert '"small"' in str(info.value) and '"n1"' in str(info.value) and "14 of 14" in str(info.value)
    assert "IPLease" not in listed, "an allocation listed every lease"
    monkeypatch.undo()
    with pytest.raises(Forbidden, match="still holds 14 lease"):
        store.delete("ipblock", K.block_name("small", "10.60.0.0/28"))
    store.delete("network", "small")                       # its leases go first, then its blocks
    assert not [o for o in store.list("ipleases").items if o["spec"]["network"] == "small"]
    assert not [o for o in store.list("ipblocks").items if o["spec"]["network"] == "small"]


def test_concurrent_allocations_and_releases_never_give_one_address_to_two_containers(store_factory):
    """Clients allocating and releasing at once, two per node (the same blocks) and on two nodes:
    every address a caller was given is its container's alone, as the store records it."""
    stores = [store_factory() for _ in range(4)]
    cidrs = [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")]
    given: dict[str, set[str]] = {}
    released: set[str] = set()

    def work(i, s):
        node = f"node-{i % 2}"
        for j in range(8):
            cid = f"c{i}-{j}"
            given[cid] = {str(lease.ip) for lease in
                          s.allocate_leases("default", node, cidrs, f"default/p{i}-{j}", cid, "eth0")}
            if j % 3 == 1:
                s.release_leases(node, cid)
                released.add(cid)

    run_at_once(stores, work, 120)
    held = {(o["spec"]["ip"]): o["spec"]["containerID"] for o in stores[0].list("ipleases").items}
    kept = {cid: ips for cid, ips in given.items() if cid not in released}
    assert all(len(ips) == 2 for ips in kept.values())
    for cid, ips in kept.items():
        for ip in ips:
            assert held.get(ip) == cid, f"{ip} was given to {cid} but the store says {held.get(ip)}"
    assert len(held) == 2 * len(kept)


WRITER = textwrap.dedent("""
    import sys
    from lace.store import open_store
    spec, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = open_store(spec)
    for i in range(n):
        s.create({"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": f"{tag}-{i}", "namespace": "default"}})
    print(s.allocate_block("default", f"node-{tag}", 4, 26))
""")

WATCHER = textwrap.dedent("""
    import json, sys
    from lace.store import open_store
    spec, since, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    s = open_store(spec)
    print("ready", flush=True)
    out = []
    for ev in s.watch(["pods"], since=since, timeout=30):
        out.append([ev.type, ev.object["metadata"]["name"], int(ev.resource_version)])
        if len(out) == want:
            break
    print(json.dumps(out), flush=True)
""")


def test_processes_write_concurrently_and_a_watcher_sees_every_event_in_order(store_factory):
    path = store_factory.spec
    s = store_factory()
    since = s.revision()
    n = 60
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, path, str(since), str(2 * n)],
                               stdout=subprocess.PIPE, text=True)
    assert watcher.stdout.readline().strip() == "ready"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, path, tag, str(n)],
                                stdout=subprocess.PIPE, text=True) for tag in ("a", "b")]
    blocks = []
    for w in writers:
        out, _ = w.communicate(timeout=60)
        assert w.returncode == 0
        blocks.append(ipaddress.ip_network(out.strip()))
    out, _ = watcher.communicate(timeout=60)
    events = json.loads(out.strip().splitlines()[-1])
    assert len(events) == 2 * n
    assert all(e[0] == "ADDED" for e in events)
    assert {e[1] for e in events} == {f"{t}-{i}" for t in "ab" for i in range(n)}
    rvs = [e[2] for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    # each writer's own events appear in the order it wrote them
    for tag in "ab":
        mine = [int(e[1].split("-")[1]) for e in events if e[1].startswith(tag)]
        assert mine == list(range(n))
    assert not blocks[0].overlaps(blocks[1])
    assert len(s.list("pods").items) == 2 * n


def _wait_until(cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_liveness_is_held_while_renewed_and_touches_no_revision_or_watch(store_factory):
    s, reader = store_factory(), store_factory()
    w = s.watch(since=s.revision(), timeout=30)
    beat = s.keep_alive("node-1", 10, "agent pid 7")
    rev = s.revision()     # taking it may advance etcd's revision (every etcd key does); renewing never
    assert beat.renew() is True and beat.renew() is True
    live = reader.node_liveness()
    assert set(live) == {"node-1"}
    assert live["node-1"].holder == "agent pid 7" and live["node-1"].ttl == 10
    # not an object: no watch event, and a guarded write right after commits untouched
    assert s.revision() == rev
    s.create(ns("after-liveness"))
    assert next(w).object["metadata"]["name"] == "after-liveness"
    w.stop()
    beat.release()
    assert reader.node_liveness() == {}


def test_liveness_expires_without_renewal_and_a_late_renewal_takes_it_again(store_factory):
    s, reader = store_factory(), store_factory()
    beat = s.keep_alive("node-2", 1, "agent")      # etcd's shortest lease is ~2 s
    other = s.keep_alive("node-3", 30, "agent")
    assert set(reader.node_liveness()) == {"node-2", "node-3"}
    _wait_until(lambda: "node-2" not in reader.node_liveness(), 10)
    assert "node-3" in reader.node_liveness()
    assert beat.renew() is False                     # it had expired: taken again
    assert "node-2" in reader.node_liveness()
    assert beat.renew() is True
    beat.release()
    other.release()


def test_liveness_rejects_a_bad_ttl(store):
    with pytest.raises(ValidationError, match="ttl"):
        store.keep_alive("node-1", 0, "agent")


# ---- SQLite-only: the file itself (WAL mode, the events table and its bounded size) ------------

def test_sqlite_store_file_is_wal(tmp_path):
    s = SqliteStore(tmp_path / "store.db")
    assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


def test_sqlite_rejected_batch_writes_no_event_row(tmp_path):
    s = SqliteStore(tmp_path / "store.db")
    events_before = s._conn.execute("SELECT count(*) FROM events").fetchone()[0]
    with pytest.raises(ValidationError):
        s.apply_all([net("blue", ["10.10.0.0/16"]), net("bad", ["10.244.1.0/24"])])
    assert s._conn.execute("SELECT count(*) FROM events").fetchone()[0] == events_before
    s.close()


def test_sqlite_event_log_is_bounded_by_max_events(tmp_path):
    s = SqliteStore(tmp_path / "s.db", max_events=50)
    old = s.revision()
    for i in range(250):
        s.apply(pod("p", labels={"i": str(i)}))
    count = s._conn.execute("SELECT count(*) FROM events").fetchone()[0]
    assert count <= 50 + 100
    with pytest.raises(Gone):
        s.watch(since=old)
    s.close()
