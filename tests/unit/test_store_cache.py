"""The client-side object cache (lace.store.cache): newest revision wins, deletions are
remembered against replayed creates, and a relist forgets them."""

from __future__ import annotations

from lace.store.cache import ObjectCache


def svc(name: str, rv: int) -> dict:
    return {"kind": "Service", "metadata": {"name": name, "namespace": "shop", "resourceVersion": str(rv)}}


def test_a_replayed_create_does_not_bring_back_a_deleted_object() -> None:
    cache = ObjectCache(["Service"])
    cache.apply("ADDED", svc("web", 3))
    cache.apply("DELETED", svc("web", 5))
    cache.apply("ADDED", svc("web", 3))          # a watch restarted from an older revision
    assert cache.objects["Service"] == {}
    cache.apply("ADDED", svc("web", 7))          # created again, later
    assert cache.objects["Service"]["shop/web"]["metadata"]["resourceVersion"] == "7"


def test_a_relist_forgets_the_deletions_of_its_kind() -> None:
    cache = ObjectCache(["Service", "EndpointSlice"])
    for i in range(100):
        cache.apply("ADDED", svc(f"s{i}", i + 1))
        cache.apply("DELETED", svc(f"s{i}", i + 2))
    cache.apply("DELETED", {"kind": "EndpointSlice", "metadata": {"name": "x", "resourceVersion": "9"}})
    assert len(cache._gone) == 101
    cache.replace("Service", [svc("kept", 300)])
    assert list(cache._gone) == [("EndpointSlice", "/x")]     # the other kind's are kept
    assert list(cache.objects["Service"]) == ["shop/kept"]
