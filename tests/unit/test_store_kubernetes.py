"""The Kubernetes store through the official client against a recorded-response apiserver.

A real kube-apiserver cannot run here, so ``fake_apiserver.py`` stands in for it over real HTTP:
the store, the official ``kubernetes`` client, urllib3 and the TCP connection are all real. The
fake listens only inside a network namespace this module makes (its ``lo``), and the store's
sockets are made there (``k8s://...?netns=``): nothing listens in the root namespace.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from lace import nsenter
from lace.store import Conflict, Forbidden, Gone, NotFound, StoreConfig, Unavailable, open_store
from lace.store import kinds as K
from lace.store.kubernetes import APISERVER_KINDS, KubernetesStore
from lace.store.kubernetes_cache import Backoff

from fake_apiserver import FakeApiServer, ServedApiServer, kubeconfig, recorded

pytestmark = pytest.mark.privileged

PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"
NAMESPACES = "/api/v1/namespaces"
SERVICES = "/api/v1/services"
SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
POLICIES = "/apis/networking.k8s.io/v1/networkpolicies"
LACE = "/apis/lace.dev/v1alpha1/"
DEFAULT_NETWORK = {"apiVersion": K.LACE_API_VERSION, "kind": "Network",
                   "metadata": {"name": "default", "uid": "net-default", "resourceVersion": "5"},
                   "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS), "routes": []}, "status": {"id": 1}}


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("the apiserver fixture listens in a network namespace of its own: needs root")
    name = f"lace-k8s-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _cluster() -> FakeApiServer:
    api = FakeApiServer()
    for coll, name in ((NAMESPACES, "namespaces"), (NODES, "nodes"), (PODS, "pods"), (SERVICES, "services"),
                       (SLICES, "endpointslices"), (POLICIES, "networkpolicies")):
        api.load(coll, recorded(name))
    api.load(LACE + "networks", [DEFAULT_NETWORK])
    return api


class Cluster:
    """The served fake and how to open stores on it."""

    def __init__(self, api: FakeApiServer, served: ServedApiServer, netns: str, config_path: str) -> None:
        self.api, self.served, self.netns, self.config_path = api, served, netns, config_path
        self.spec = f"k8s://fake?kubeconfig={config_path}&netns={netns}"
        self.opened: list[KubernetesStore] = []

    def store(self, **kw) -> KubernetesStore:
        store = (KubernetesStore.connect(kubeconfig=self.config_path, context="fake", netns=self.netns, **kw)
                 if kw else open_store(self.spec))
        self.opened.append(store)  # type: ignore[arg-type]
        return store  # type: ignore[return-value]


@pytest.fixture
def cluster(netns: str, tmp_path) -> Iterator[Cluster]:
    api = _cluster()
    with nsenter.entered(netns):
        served = ServedApiServer(api)   # its listening socket is made inside the namespace
    c = Cluster(api, served, netns, kubeconfig(served.url, str(tmp_path / "kubeconfig")))
    try:
        yield c
    finally:
        for store in c.opened:
            store.close()
        served.close()


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def _events(watch, n: int, timeout: float = 5.0) -> list:
    out: list = []
    done = threading.Event()

    def read() -> None:
        for ev in watch:
            out.append(ev)
            if len(out) >= n:
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout)
    watch.stop()
    return out


# ---- opening and reading -------------------------------------------------------------------------


def test_spec_selects_the_kubernetes_backend(cluster: Cluster) -> None:
    cfg = StoreConfig.parse(cluster.spec)
    assert cfg.backend == "k8s" and cfg.platform == "kubernetes" and cfg.context == "fake"
    assert StoreConfig.parse("/tmp/store.db").platform == "lab"
    store = cluster.store()
    assert isinstance(store, KubernetesStore)
    pods = store.list("pods", "shop")
    assert [p["metadata"]["name"] for p in pods.items] == ["web-7d9c6b5f4-abcde", "web-7d9c6b5f4-fghij"]
    # list items come without kind; the store gives them the kind lace reads
    assert {p["kind"] for p in pods.items} == {"Pod"} and pods.items[0]["apiVersion"] == "v1"
    assert store.get("service", "web", "shop")["spec"]["clusterIP"] == "10.96.0.20"
    assert store.get("networks", "default")["status"]["id"] == 1


def test_unreachable_apiserver_names_it(tmp_path) -> None:
    path = kubeconfig("http://127.0.0.1:9", str(tmp_path / "kubeconfig"))
    store = KubernetesStore.connect(kubeconfig=path, timeout=1.0)
    try:
        with pytest.raises(Unavailable) as err:
            store.list("pods")
        assert "127.0.0.1:9" in str(err.value) and err.value.hint
    finally:
        store.close()


def test_bad_kubeconfig_is_a_clear_error(tmp_path) -> None:
    from lace.store import StoreError
    with pytest.raises(StoreError) as err:
        open_store(f"k8s://nope?kubeconfig={tmp_path}/missing")
    assert "kubeconfig" in str(err.value) and "k8s://" in (err.value.hint or "")


def test_forbidden_names_the_resource_and_rbac(cluster: Cluster) -> None:
    cluster.api.fail(403, path=PODS, reason="Forbidden")
    store = cluster.store()
    with pytest.raises(Forbidden) as err:
        store.list("pods")
    assert "pods" in str(err.value) and "RBAC" not in str(err.value) and "deploy/rbac.yaml" in err.value.hint


# ---- watch: events, disconnects, 410, bookmarks, backoff -----------------------------------------


def test_watch_delivers_the_apiservers_writes(cluster: Cluster) -> None:
    store = cluster.store()
    since = store.list("pods").resource_version
    watch = store.watch(["pods"], since=since)
    pod = recorded("pods")[0]
    pod["metadata"]["name"] = "web-7d9c6b5f4-new"
    cluster.api.put(PODS, pod)
    cluster.api.remove(PODS, "shop", "web-7d9c6b5f4-abcde")
    events = _events(watch, 2)
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("ADDED", "web-7d9c6b5f4-new"), ("DELETED", "web-7d9c6b5f4-abcde")]
    assert int(events[1].resource_version) > int(events[0].resource_version) > int(since)


def _watching_pods(cluster: Cluster):
    """A store watching Pods from its list, once its Pod reflector's watch reached the apiserver:
    (the store, its watch, the reflector)."""
    store = cluster.store()
    watch = store.watch(["pods"], since=store.list("pods").resource_version)
    reflector = store.backend.reflectors["Pod"]
    _wait(lambda: len(cluster.api.watch_requests(PODS)) == 1)
    return store, watch, reflector


def test_watch_survives_a_disconnect_without_gap_or_duplicate(cluster: Cluster) -> None:
    store, watch, reflector = _watching_pods(cluster)
    cluster.api.disconnect_watches()
    pod = recorded("pods")[0]
    pod["metadata"]["name"] = "after-disconnect"
    cluster.api.put(PODS, pod)
    events = _events(watch, 1)
    assert [e.object["metadata"]["name"] for e in events] == ["after-disconnect"]
    # it watched again from where it was, not from scratch
    watches = cluster.api.watch_requests(PODS)
    assert len(watches) >= 2 and watches[1]["resourceVersion"] == watches[0]["resourceVersion"]
    assert reflector.relists == 0
    assert len(store.list("pods").items) == 3


@pytest.mark.parametrize("as_http_status", [False, True], ids=["error-event", "http-410"])
def test_410_gone_relists_and_turns_the_gap_into_events(cluster: Cluster, as_http_status: bool) -> None:
    cluster.api.expired_as_http_status = as_http_status
    store, watch, reflector = _watching_pods(cluster)
    # while the store is cut off, one pod goes, one comes, and the history is compacted away
    cluster.api.disconnect_watches()
    with cluster.api.cond:   # hold the fake so the store cannot re-watch in between
        pod = recorded("pods")[0]
        pod["metadata"]["name"] = "born-in-the-gap"
        cluster.api._write(PODS, "ADDED", pod)
        del cluster.api.objects[PODS][("shop", "web-7d9c6b5f4-fghij")]
        cluster.api.revision += 1
        cluster.api.compacted = cluster.api.revision
        cluster.api.events = []
    events = _events(watch, 2)
    assert sorted((e.type, e.object["metadata"]["name"]) for e in events) == [
        ("ADDED", "born-in-the-gap"), ("DELETED", "web-7d9c6b5f4-fghij")]
    _wait(lambda: reflector.relists == 1)
    assert sorted(p["metadata"]["name"] for p in store.list("pods").items) == [
        "born-in-the-gap", "web-7d9c6b5f4-abcde"]


def test_bookmarks_move_the_resume_point(cluster: Cluster) -> None:
    store = cluster.store()
    store.list("pods")
    reflector = store.backend.reflectors["Pod"]
    _wait(lambda: len(cluster.api.watch_requests(PODS)) == 1)
    assert cluster.api.watch_requests(PODS)[0]["allowWatchBookmarks"] == "true"
    mark = cluster.api.bookmark()
    _wait(lambda: reflector.resource_version == str(mark))
    cluster.api.disconnect_watches()
    _wait(lambda: len(cluster.api.watch_requests(PODS)) == 2)
    assert cluster.api.watch_requests(PODS)[1]["resourceVersion"] == str(mark)
    # a bookmark is no change: watchers of the cache saw nothing
    watch = store.watch(["pods"], since=0)
    assert len(_events(watch, 3, timeout=0.5)) == 2


def test_watch_errors_back_off_with_jitter_then_recover(cluster: Cluster) -> None:
    store = cluster.store()
    store.list("pods")
    reflector = store.backend.reflectors["Pod"]
    reflector.backoff = Backoff(0.05, 0.4)
    _wait(lambda: len(cluster.api.watch_requests(PODS)) == 1)
    cluster.api.fail(500, count=4, path=PODS, watch=True)
    cluster.api.disconnect_watches()
    _wait(lambda: len(cluster.api.watch_requests(PODS)) >= 6, timeout=10)
    _wait(lambda: reflector.error is None)
    assert reflector.failures == 4
    pod = recorded("pods")[0]
    pod["metadata"]["name"] = "after-the-outage"
    cluster.api.put(PODS, pod)
    _wait(lambda: store.backend.cache.get("Pod", "shop", "after-the-outage") is not None)
    assert reflector.relists == 0   # a failed watch resumes; only 410 lists again


def test_backoff_is_jittered_and_capped() -> None:
    import random
    b = Backoff(0.1, 1.0, rng=random.Random(7))
    waits = [b.next() for _ in range(20)]
    assert all(0 <= w < 1.0 for w in waits) and len(set(waits)) == 20
    assert max(waits[:2]) < 0.2
    b.reset()
    assert b.next() < 0.1


def test_slow_apiserver_times_out_clearly_then_serves(cluster: Cluster) -> None:
    cluster.api.delay = 1.5
    store = cluster.store(timeout=0.5)
    with pytest.raises(Unavailable) as err:
        store.list("nodes")
    assert "not reachable" in str(err.value) and "timed out" in str(err.value).lower()
    cluster.api.delay = 0.2   # slow, but within the timeout
    assert len(store.list("nodes").items) == 3


# ---- writes: lace's kinds as CRDs, allocation races, pass-through ---------------------------------


def test_allocations_are_crd_objects_and_race_free(cluster: Cluster) -> None:
    import ipaddress
    a, b = cluster.store(), cluster.store()
    cidrs = [ipaddress.ip_network(c) for c in K.DEFAULT_NETWORK_CIDRS]
    results: dict[str, list] = {}
    errors: list[BaseException] = []

    def allocate(store: KubernetesStore, who: str) -> None:
        try:
            results[who] = [store.allocate_leases("default", "worker-1", cidrs, f"shop/{who}-{i}", f"c-{who}-{i}", "eth0")
                            for i in range(4)]
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=allocate, args=(s, w)) for s, w in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    ips = [lease.ip for leases in results.values() for pair in leases for lease in pair]
    assert len(ips) == 16 and len(set(ips)) == 16
    blocks = cluster.api.objects[LACE + "ipblocks"]
    assert len(blocks) == 2   # one v4 and one v6 block of worker-1, whoever took them
    leases = cluster.api.objects[LACE + "ipleases"]
    assert len(leases) == 16
    assert a.leases_for("worker-1", "c-b-3") == b.leases_for("worker-1", "c-b-3")


def test_segment_ids_come_from_the_counter_configmap(cluster: Cluster) -> None:
    a, b = cluster.store(), cluster.store()
    ids = {a.allocate_segment("default", "shop", {"app": "web"}), b.allocate_segment("default", "shop", {"app": "db"})}
    assert ids == {256, 257}
    assert a.allocate_segment("default", "shop", {"app": "db"}) in ids
    cm = cluster.api.objects["/api/v1/configmaps"][("lace-system", "lace-counters")]
    assert cm["data"]["next_segment_id"] == "258"


def test_network_status_goes_through_the_status_subresource(cluster: Cluster) -> None:
    store = cluster.store()
    net = store.create({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "red"},
                        "spec": {"cidrs": ["10.10.0.0/16"]}})
    assert net["status"]["id"] == 2
    stored = cluster.api.objects[LACE + "networks"][("", "red")]
    assert stored["status"] == {"id": 2}
    # a user's later apply keeps the allocated id
    result = store.apply({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "red"},
                          "spec": {"cidrs": ["10.10.0.0/16", "10.11.0.0/16"]}})
    assert result.outcome == "configured" and result.object["status"]["id"] == 2
    # lace's rules still apply to lace's kinds
    with pytest.raises(Forbidden):
        store.delete("networks", "default")


def test_apiserver_kinds_pass_through_without_lace_allocation(cluster: Cluster) -> None:
    store = cluster.store()
    assert {"Pod", "Service", "EndpointSlice", "Node", "Namespace", "NetworkPolicy"} <= APISERVER_KINDS
    svc = store.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "shop"},
                        "spec": {"selector": {"app": "db"}, "ports": [{"port": 5432}]}})
    # lace did not allocate a ClusterIP (the apiserver does; this fake does not) nor an ID
    assert "clusterIP" not in svc["spec"] and "status" not in svc
    assert LACE + "serviceallocations" not in cluster.api.objects
    store.delete("pods", "web-7d9c6b5f4-abcde", "shop", grace_period=30)
    assert ("shop", "web-7d9c6b5f4-abcde") not in cluster.api.objects[PODS]
    with pytest.raises(NotFound):
        store.get("pods", "nope", "shop")


def test_stale_update_conflicts(cluster: Cluster) -> None:
    store = cluster.store()
    net = store.create({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "blue"},
                        "spec": {"cidrs": ["10.20.0.0/16"]}})
    stale = dict(net, spec={"cidrs": ["10.20.0.0/15"]})
    store.apply({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "blue"},
                 "spec": {"cidrs": ["10.20.0.0/16", "10.30.0.0/16"]}})
    with pytest.raises(Conflict):
        store.update(stale)


def test_dry_run_writes_nothing(cluster: Cluster) -> None:
    store = cluster.store()
    before = cluster.api.revision
    results = store.apply_all([{"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "dry"},
                                "spec": {"cidrs": ["10.40.0.0/16"]}}], dry_run=True)
    assert results[0].outcome == "created"
    assert cluster.api.revision == before and ("", "dry") not in cluster.api.objects.get(LACE + "networks", {})


def test_node_liveness_is_a_lease(cluster: Cluster) -> None:
    store = cluster.store()
    beat = store.keep_alive("worker-1", 2.0, "lace-agent worker-1 pid 1")
    lease = cluster.api.objects["/apis/coordination.k8s.io/v1/leases"][("lace-system", "lace-node-worker-1")]
    assert lease["spec"]["holderIdentity"] == "lace-agent worker-1 pid 1"
    assert lease["spec"]["leaseDurationSeconds"] == 2
    assert set(store.node_liveness()) == {"worker-1"}
    assert beat.renew() is True
    beat.release()
    assert store.node_liveness() == {}


def test_gone_when_a_cache_watch_falls_behind(cluster: Cluster) -> None:
    store = cluster.store()
    store.list("pods")
    store.backend.cache.log = type(store.backend.cache.log)(store.backend.cache.log, maxlen=2)
    for i in range(3):
        pod = recorded("pods")[0]
        pod["metadata"]["name"] = f"p{i}"
        cluster.api.put(PODS, pod)
    _wait(lambda: store.backend.cache.get("Pod", "shop", "p2") is not None)
    with pytest.raises(Gone):
        next(store.watch(["pods"], since=1))


# ---- one translation: what the agent derives is the lab's ----------------------------------------


def _desired(store) -> dict:
    """What the agent's pure translation makes of a store's objects (nodes, service frontends,
    policy inputs): the functions build_snapshot calls, with no kernel needed."""
    from lace.agent.model import by_name, parse_node
    from lace.policy.sources import policy_inputs
    from lace.services.model import frontends, imports_by_service
    from lace.store.records import PodRecord

    nets = store.list("networks").items
    ids = by_name(nets)
    pods = {p.key: p for p in map(PodRecord.of, store.list("pods").items)}
    inputs = policy_inputs(store.list("namespaces").items, store.list("networkpolicies").items, pods, [], {})
    return {
        "nodes": sorted(repr(n) for n in map(parse_node, store.list("nodes").items) if n),
        "frontends": frontends(store.list("services").items, store.list("endpointslices").items, ids,
                               imports_by_service(nets, ids), "worker-1"),
        "namespaces": inputs.namespaces,
        # policies reach the resolver parsed: compare what it reads (not the stores' revisions)
        "policies": sorted(repr((p.namespace, p.name, p.pod_selector, p.ingress, p.egress, p.rules, p.audit,
                                 p.fingerprint)) for p in inputs.policies),
    }


def test_desired_state_is_the_labs_translation(cluster: Cluster, tmp_path) -> None:
    """The recorded cluster through the Kubernetes store, and the same objects applied to a lab's
    SQLite store, give the agent the same nodes, service frontends and policy inputs."""
    k8s = cluster.store()
    lab = open_store(str(tmp_path / "store.db"))
    try:
        objs = []
        for name, kind, api_version in (("namespaces", "Namespace", "v1"), ("nodes", "Node", "v1"),
                                        ("services", "Service", "v1"), ("pods", "Pod", "v1"),
                                        ("endpointslices", "EndpointSlice", "discovery.k8s.io/v1"),
                                        ("networkpolicies", "NetworkPolicy", "networking.k8s.io/v1")):
            for obj in recorded(name):
                meta = {k: v for k, v in obj["metadata"].items()
                        if k in ("name", "namespace", "labels", "annotations")}
                objs.append({**obj, "apiVersion": api_version, "kind": kind, "metadata": meta})
        lab.apply_all(objs)
        # status is the kubelet's: written apart, as a kubelet does
        for kind, namespace in (("pods", "shop"), ("nodes", None)):
            for obj in recorded(kind):
                lab.update_status(kind, obj["metadata"]["name"], namespace, obj["status"])
        want, got = _desired(lab), _desired(k8s)
        assert want["frontends"] and want["nodes"] and want["policies"]
        assert got == want
    finally:
        lab.close()


# ---- the operator ------------------------------------------------------------------------------


def test_operator_pass_allocates_what_kubernetes_does_not(cluster: Cluster) -> None:
    from lace.operator.operator import Options, reconcile
    del cluster.api.objects[LACE + "networks"][("", "default")]   # a fresh cluster: no default Network
    cluster.api.put(LACE + "networks", {"apiVersion": K.LACE_API_VERSION, "kind": "Network",
                                        "metadata": {"name": "red"}, "spec": {"cidrs": ["10.10.0.0/16"]}})
    cluster.api.put(SERVICES, {"apiVersion": "v1", "kind": "Service",
                               "metadata": {"name": "fresh", "namespace": "shop"},
                               "spec": {"clusterIP": "10.96.0.99", "clusterIPs": ["10.96.0.99"],
                                        "ports": [{"port": 80, "protocol": "TCP"}]}})
    store = cluster.store()
    taken = {s["metadata"]["annotations"][K.SERVICE_ID_ANNOTATION] for s in store.list("services").items
             if K.SERVICE_ID_ANNOTATION in (s["metadata"].get("annotations") or {})}
    first = reconcile(store, Options())
    assert first.networks == ["default", "red"] and first.nodes == ["worker-3"]
    # the apiserver gave the Service its ClusterIP; the operator gives it a lace ID no one else has
    assert first.services == ["shop/fresh"]
    fresh = cluster.api.objects[SERVICES][("shop", "fresh")]
    sid = fresh["metadata"]["annotations"][K.SERVICE_ID_ANNOTATION]
    assert int(sid) >= K.FIRST_SERVICE_ID and sid not in taken
    assert sorted(first.blocks) == sorted(f"worker-{i}:{b}" for i, b in (
        (1, "10.244.0.0/24"), (1, "fd00:10:244::/112"), (2, "10.244.1.0/24"), (2, "fd00:10:244::1:0/112"),
        (3, "10.244.2.0/24"), (3, "fd00:10:244::2:0/112")))
    node = cluster.api.objects[NODES][("", "worker-3")]
    ann = node["metadata"]["annotations"]
    assert ann[K.UNDERLAY_ANNOTATION] == "fd5e:ff::3" and ann[K.NODE_ID_ANNOTATION] == "3"   # 1 and 2 are taken
    assert ann[K.LOCATOR_ANNOTATION] == "fd5e:c000:3::/48"
    assert store.get("networks", "red")["status"]["id"] == 2
    # level-triggered: a second pass finds nothing to do
    again = reconcile(store, Options())
    assert (again.networks, again.nodes, again.blocks, again.services) == ([], [], [], [])


def _service(name: str, created: str | None = None, sid: str | None = None, ip: str = "10.96.0.90") -> dict:
    meta: dict = {"name": name, "namespace": "shop"}
    if created is not None:
        meta["creationTimestamp"] = created
    if sid is not None:
        meta["annotations"] = {K.SERVICE_ID_ANNOTATION: sid}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": 80, "protocol": "TCP"}]}}


def test_operator_pass_gives_a_copied_service_id_to_the_newer_service(cluster: Cluster) -> None:
    from lace.operator.operator import Options, reconcile
    web = cluster.api.objects[SERVICES][("shop", "web")]["metadata"]
    assert web["annotations"][K.SERVICE_ID_ANNOTATION] == "17"
    # copied from web's manifest, annotation and all: one later, one at the same second
    cluster.api.put(SERVICES, _service("web-copy", "2025-03-05T08:00:00Z", "17", "10.96.0.91"))
    cluster.api.put(SERVICES, _service("zz-twin", web["creationTimestamp"], "17", "10.96.0.92"))
    store = cluster.store()
    first = reconcile(store, Options())
    assert sorted(first.services) == ["shop/web-copy", "shop/zz-twin"]
    ids = {name: cluster.api.objects[SERVICES][("shop", name)]["metadata"]["annotations"][K.SERVICE_ID_ANNOTATION]
           for name in ("web", "web-copy", "zz-twin")}
    assert ids["web"] == "17" and len(set(ids.values())) == 3     # the oldest keeps it (then by name)
    assert reconcile(store, Options()).services == []


def test_operator_pass_goes_on_past_an_object_changed_meanwhile(cluster: Cluster) -> None:
    from lace.operator.operator import Options, reconcile
    for i, name in enumerate(("fresh-a", "fresh-b")):
        cluster.api.put(SERVICES, _service(name, ip=f"10.96.0.9{i}"))
    store = cluster.store()
    listed = store.list

    def list_then_someone_writes(kind, *args, **kw):
        out = listed(kind, *args, **kw)
        if kind == "services":      # fresh-a changes after the pass read it
            changed = cluster.api.objects[SERVICES][("shop", "fresh-a")]
            changed["metadata"]["labels"] = {"touched": "yes"}
            cluster.api.put(SERVICES, changed, "MODIFIED")
        return out

    store.list = list_then_someone_writes  # type: ignore[method-assign]
    first = reconcile(store, Options())
    assert first.changed == ['Service "shop/fresh-a"'] and first.services == ["shop/fresh-b"]
    store.list = listed  # type: ignore[method-assign]
    assert reconcile(store, Options()).services == ["shop/fresh-a"]


def test_leader_election_has_one_leader(cluster: Cluster) -> None:
    from lace.operator.leader import LeaderElector
    store = cluster.store()
    a = LeaderElector(store.api, "lace-system", "lace-operator", "op-a", lease_duration=2)
    b = LeaderElector(store.api, "lace-system", "lace-operator", "op-b", lease_duration=2)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    time.sleep(2.1)   # a stops renewing: its lease runs out and b takes over
    assert b.try_acquire_or_renew() and not a.try_acquire_or_renew()
    b.release()
    assert a.try_acquire_or_renew()


LEASES_PATH = "/apis/coordination.k8s.io/v1/leases"


def test_leader_election_judges_expiry_by_its_own_clock_not_the_writers(cluster: Cluster) -> None:
    from lace.operator.leader import LeaderElector
    store = cluster.store()
    # a leader whose clock is far behind: its renewTime looks ancient here, but it keeps renewing
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "lace-operator", "namespace": "lace-system"},
             "spec": {"holderIdentity": "op-a", "leaseDurationSeconds": 1, "renewTime": "2000-01-01T00:00:00Z"}}
    cluster.api.put(LEASES_PATH, lease)
    b = LeaderElector(store.api, "lace-system", "lace-operator", "op-b", lease_duration=1)
    assert not b.try_acquire_or_renew()
    time.sleep(0.6)
    lease["spec"]["renewTime"] = "2000-01-01T00:00:01Z"       # renewed (second precision: a Time)
    cluster.api.put(LEASES_PATH, lease, "MODIFIED")
    assert not b.try_acquire_or_renew()
    time.sleep(0.6)
    assert not b.try_acquire_or_renew() and not b.leading     # 0.6 s since it last changed
    time.sleep(0.5)
    assert b.try_acquire_or_renew() and b.leading             # not renewed for a full duration


def test_a_leader_renews_in_its_thread_through_a_long_pass_and_steps_down_when_it_cannot(cluster: Cluster) -> None:
    from lace.operator.leader import LeaderElector
    from lace.operator.operator import NotLeading, Options, reconcile
    store = cluster.store()
    a = LeaderElector(store.api, "lace-system", "lace-operator", "op-a", lease_duration=2, retry=0.1)
    b = LeaderElector(store.api, "lace-system", "lace-operator", "op-b", lease_duration=2)
    a.start()
    try:
        _wait(lambda: a.leading)
        for _ in range(6):      # a pass three lease durations long: a keeps the Lease all along
            assert not b.try_acquire_or_renew()
            time.sleep(1.0)
            assert a.leading
        # the apiserver stops answering a: it stops leading at its renew deadline, before the
        # Lease could expire for anyone else
        cluster.api.fail(500, count=1000, path=LEASES_PATH.replace("leases", "namespaces/lace-system/leases"))
        lost = time.monotonic()
        _wait(lambda: not a.leading)
        assert time.monotonic() - lost < a.lease_duration
        with pytest.raises(NotLeading, match="stopped leading"):
            reconcile(store, Options(), leading=lambda: a.leading)
    finally:
        a.stop()

