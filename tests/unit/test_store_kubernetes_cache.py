"""The Kubernetes store's local cache and the transactions that read it, without an apiserver:
the reflectors are stood in for by applying events to the cache directly."""

from __future__ import annotations

from lace.store.kubernetes import KubernetesTransaction
from lace.store.kubernetes_cache import Cache, CacheWatch


def pod(name: str, rv: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "resourceVersion": rv}}


class _Backend:
    """What a transaction's reads use of the backend: the cache, every kind already synced."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def ensure_synced(self, kind: str) -> None:
        pass


def _drain(watch: CacheWatch) -> list[tuple[str, str, str]]:
    out = [(e.type, e.object["metadata"]["name"], e.resource_version) for e in watch]
    watch.stop()
    return out


def test_a_transactions_revision_is_taken_before_its_first_read() -> None:
    cache = Cache()
    cache.replace("Pod", [pod("a")])
    list_items = cache.list

    def list_then_a_reflector_event(kind, namespace):
        items = list_items(kind, namespace)
        cache.apply("Pod", "ADDED", pod("b"))     # lands between the read and revision()
        return items

    cache.list = list_then_a_reflector_event      # type: ignore[method-assign]
    txn = KubernetesTransaction(_Backend(cache), write=False, dry_run=False)  # type: ignore[arg-type]
    assert [o["metadata"]["name"] for o in txn.list("Pod")] == ["a"]
    since = txn.revision()
    assert since == 1 and cache.revision == 2
    # a watch from the list's revision brings the event the list missed
    assert _drain(CacheWatch(cache, {"Pod"}, since, timeout=0)) == [("ADDED", "b", "2")]


def test_a_cache_watch_resumes_at_its_revision_in_a_wrapped_log() -> None:
    cache = Cache(log_size=4)
    for i in range(10):
        cache.apply("Pod", "ADDED", pod(f"p{i}"))
    assert [rev for rev, _, _ in cache.log] == [7, 8, 9, 10] and cache.compacted == 6
    assert _drain(CacheWatch(cache, None, 8, timeout=0)) == [("ADDED", "p8", "9"), ("ADDED", "p9", "10")]
    assert _drain(CacheWatch(cache, None, 6, timeout=0))[0] == ("ADDED", "p6", "7")
    assert _drain(CacheWatch(cache, None, 10, timeout=0)) == []
    assert _drain(CacheWatch(cache, {"Service"}, 6, timeout=0)) == []
