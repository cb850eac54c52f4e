"""Name resolution for the node commands: store-backed, numeric, unresolved IDs, and -n never
opening the store."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from lace.cli.render import human_duration
from lace.cli.node.resolve import NumericResolver, Resolver, for_node
from lace.store import SqliteStore

OBJECTS = {
    "networks": [{"metadata": {"name": "default"}, "status": {"id": 1}},
                 {"metadata": {"name": "blue"}, "status": {"id": 7}}],
    "segments": [{"metadata": {"name": "s"}, "spec": {"network": "blue", "namespace": "demo",
                                                      "labels": {"app": "web", "tier": "fe"}}, "status": {"id": 300}}],
    "ipleases": [{"metadata": {"name": "l", "annotations": {"lace.dev/host-ifname": "lc1234"}},
                  "spec": {"network": "blue", "node": "n1", "ip": "10.5.0.3", "pod": "demo/web-0"}}],
    "pods": [{"metadata": {"name": "db", "namespace": "demo", "annotations": {"lace.dev/network": "blue"}},
              "status": {"podIPs": [{"ip": "10.5.0.9"}]}}],
    "services": [{"metadata": {"name": "dns", "namespace": "kube-system", "annotations": {"lace.dev/service-id": "5"}},
                  "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 53, "protocol": "UDP"}]}}],
}


def test_resolves_names() -> None:
    r = Resolver.from_objects(OBJECTS)
    assert r.network(7) == "blue"
    assert r.network(0xFFFFFFFF) == "outside"
    assert r.segment(300) == "demo app=web,tier=fe (blue)"
    assert r.segment(2) == "world"
    assert r.peer(0) == "any"
    assert r.pod_for_ip(7, "10.5.0.3") == "demo/web-0"
    assert r.pod_for_ip(7, "10.5.0.9") == "demo/db"
    assert r.pod_for_ip(1, "10.5.0.3") is None  # the same address in another network is not that pod
    assert r.pod_for_ifname("lc1234") == "demo/web-0"
    assert r.service(5) == "kube-system/dns"
    assert r.service(9, network=1, vip="10.96.0.10", port=53, proto="udp") == "kube-system/dns"


def test_unresolved_ids_are_shown_not_dropped() -> None:
    r = Resolver.from_objects(OBJECTS)
    assert r.segment(812) == "segment 812 (unresolved)"
    assert r.network(99) == "network 99 (unresolved)"
    assert r.service(42) == "service 42 (unresolved)"


def test_numeric_prints_ids() -> None:
    n = NumericResolver()
    assert (n.network(7), n.segment(812), n.peer(0), n.pod_for_ip(7, "10.5.0.3")) == ("7", "812", "any", None)


def test_numeric_never_opens_the_store() -> None:
    def boom() -> str:
        raise AssertionError("the store was opened with -n")
    r = for_node(True, boom)
    assert r.network(7) == "7" and r.segment(812) == "812"


def test_store_backed_resolver(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    st = SqliteStore(path)
    st.apply_all([{"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": "blue"},
                   "spec": {"cidrs": ["10.50.0.0/16"]}}])
    seg = st.allocate_segment("blue", "demo", {"app": "web"})
    st.close()
    r = for_node(False, lambda: str(path))
    names = {r.network(i) for i in (1, 2)}
    assert "blue" in names and "default" in names
    assert r.segment(seg) == "demo app=web (blue)"


@pytest.mark.parametrize("secs,text", [(0, "0s"), (45, "45s"), (192, "3m12s"), (3600, "1h"), (3720, "1h2m"),
                                       (90000, "1d1h"), (-3, "-3s")])
def test_human_duration(secs: float, text: str) -> None:
    assert human_duration(secs) == text


def test_node_main_errors_without_env() -> None:
    from lace.cli.node.main import main
    err = io.StringIO()
    rc = main(["bpf", "show", "routing"], {}, stdout=io.StringIO(), stderr=err)
    assert rc == 2 and "LACE_PIN_ROOT is not set" in err.getvalue()
    err = io.StringIO()
    rc = main(["bpf", "show", "nope"], {"LACE_PIN_ROOT": "/nonexistent"}, stdout=io.StringIO(), stderr=err)
    assert rc == 2 and "valid maps: config, devices, routing" in err.getvalue()
    err = io.StringIO()
    rc = main(["ct", "list", "ct-bogus"], {"LACE_PIN_ROOT": "/nonexistent"}, stdout=io.StringIO(), stderr=err)
    assert rc == 2 and "ct-tcp-v6" in err.getvalue()


def test_policy_ids_resolve_to_the_policy_that_programmed_them():
    from lace.cli.node.resolve import Resolver
    from lace.policy.ids import policy_ids
    r = Resolver.from_objects({"networkpolicies": [{"metadata": {"namespace": "x", "name": "deny"}},
                                                   {"metadata": {"namespace": "y", "name": "allow-dns"}}]})
    ids = policy_ids(["x/deny", "y/allow-dns"])
    assert r.policy(ids["x/deny"]) == "x/deny" and r.policy(ids["y/allow-dns"]) == "y/allow-dns"
    assert "unresolved" in r.policy(12345)
