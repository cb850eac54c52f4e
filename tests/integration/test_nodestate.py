"""``node`` commands against real pinned maps: both lace objects loaded under a throw-away pin root,
maps filled with the lace.datapath builders; ``device list`` against a veth with a tcx program in a
throw-away namespace.  Cleanup always (pin roots, namespaces)."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest

from lace.bpf import ObjectSpec, attach_tcx, ensure_bpffs, enter_netns
from lace.cli.node.main import main
from lace.datapath import config as cfg
from lace.datapath import conntrack as C
from lace.datapath import probes as P
from lace.datapath import registry
from lace.datapath import services as S
from lace.datapath.common import Direction, mac_bytes, now_coarse
from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_exact_key, delivery_key
from lace.datapath.devices import NEXTHOP, DeviceRole, device_key, device_value, nexthop_key
from lace.datapath.endpoint import endpoint_value, veth_key
from lace.datapath.node import PinnedMaps
from lace.datapath.policy import POLICY_ENTRY, PolicyFlag, policy_entry, policy_keys, policy_maps, selected_key
from lace.datapath.routing import route_value, routing_key
from lace.datapath.segment import prefix_segment_key, segment_key, segment_value
from lace.store import SqliteStore

from tests.integration.conftest import run



def fill(maps: dict[str, Any]) -> None:
    def m(cli: str) -> Any:
        return maps[registry.get(cli).pin_name]
    m("config").update(cfg.config_key(), cfg.config_value(locator="2001:db8:1::/48", underlay_addr="2001:db8:f::1",
                                                          node_id=1, uplink_ifindex=1, mtu=1460))
    m("devices").update(device_key(77), device_value("02:00:00:00:01:0a", DeviceRole.POD_VETH))
    # the datapath's next-hop cache: one fresh SID, one the FIB must be asked for again
    for sid, left_ns in (("2001:db8:2:0:1:0:1:0", 60 * 10**9), ("2001:db8:3:0:1:0:1:0", -5 * 10**9)):
        m("nexthops").update(nexthop_key(sid), NEXTHOP.pack(
            expires_ns=now_coarse() + left_ns, ifindex=1, mtu=1500, smac=mac_bytes("02:00:00:00:0f:01"),
            dmac=mac_bytes("02:00:00:00:0f:02"), pad=0))
    m("routing").update(routing_key(1, "10.244.0.0/16"), route_value(1))
    m("routing").update(routing_key(2, "0.0.0.0/0"), route_value(0xFFFFFFFF, masquerade=True))
    local = DELIVERY.pack(kind=DeliveryKind.LOCAL, ifindex=77, mac=mac_bytes("02:00:00:00:00:0a"),
                          host_mac=mac_bytes("02:00:00:00:01:0a"), endpoint_id=77)
    m("delivery").update(delivery_key(1, "10.244.1.10/32"), local)
    m("delivery").update(delivery_key(1, "10.244.2.0/24"), DELIVERY.pack(
        kind=DeliveryKind.REMOTE, node_id=2, sid=cfg.sid("2001:db8:2::/48", None, 1)))
    m("delivery").update(delivery_key(1, "fd00:10:244:1::a/128"), local)
    # the full-length entries again, as the agent writes them (lace.agent.desired)
    m("delivery-exact").update(delivery_exact_key(1, "10.244.1.10"), local)
    m("delivery-exact").update(delivery_exact_key(1, "fd00:10:244:1::a"), local)
    m("veth").update(veth_key(77), endpoint_value(endpoint_id=77, network=1, segment=256, mac="02:00:00:00:00:0a",
                                                  ipv4="10.244.1.10", ipv6="fd00:10:244:1::a"))
    m("services").update(S.service_key(1, "10.96.0.10", 53, 17), S.service_value(service_id=5, backend_count=1, active_count=1))
    m("services").update(S.service_key(1, "10.96.0.10", 53, 17, 1), S.service_value(service_id=5, backend_id=100))
    m("backends").update(S.backend_key(100), S.backend_value("10.244.1.10", 5353, 17, 1))
    m("revnat").update(S.revnat_key(1, "10.244.1.10", 5353, 17),
                       S.revnat_value([(1, "10.96.0.10", 53), (7, "10.96.0.10", 53)]))
    pol = {selected_key(256, Direction.INGRESS): policy_entry(3, 0, PolicyFlag.SELECTED)}
    for k in policy_keys(256, 257, Direction.INGRESS, 6, 8080):
        pol[k] = policy_entry(3, 1)
    for k in policy_keys(256, 0, Direction.EGRESS, 17, 53):
        pol[k] = policy_entry(3, 2)
    for k in policy_keys(256, 257, Direction.INGRESS, 6, 9000, 9007):   # one port block: the trie
        pol[k] = policy_entry(3, 3)
    for name, entries in policy_maps(pol).items():   # split as the agent writes them
        for k, v in entries.items():
            m(name).update(k, v)
    m("segment").update(segment_key(1, "10.244.1.10"), segment_value(256, local=True))
    m("segment").update(segment_key(1, "10.244.2.20"), segment_value(812))
    m("prefix-segment").update(prefix_segment_key(1, "203.0.113.0/24"), segment_value(2))
    m("probes").update(P.probe_key("10.244.1.10", 8080), P.probe_value(
        network=1, endpoint_id=77, ifindex=77, target_addr="10.244.1.10", target_port=8080))
    # an isolated pod's probe address (default network) and its marker
    m("probes").update(P.probe_key("10.244.1.40", 8080), P.probe_value(
        network=2, endpoint_id=78, ifindex=78, target_addr="10.10.0.5", target_port=8080))
    m("probes").update(P.probe_address_key("10.244.1.40"), P.probe_value(
        network=2, endpoint_id=78, ifindex=78, target_addr="10.10.0.5", target_port=0, flags=P.ProbeFlag.ADDRESS))
    now = now_coarse()
    m("probe-cookie").update(P.probe_cookie_key(12345), P.PROBE_COOKIE.pack(
        orig_addr=ipaddress.ip_address("10.244.1.40").packed.ljust(16, b"\0"), orig_port=8080, family=4,
        proto=6, network=2, created_ns=now))
    vip = ipaddress.ip_address("10.96.0.10").packed.ljust(16, b"\0")
    live = dict(created_ns=now - 192 * 10**9, last_seen_ns=now, expires_ns=now + 3600 * 10**9, packets_fwd=10,
                bytes_fwd=1000, packets_rev=8, bytes_rev=9000, state=C.CtState.ESTABLISHED,
                flags=C.CtFlag.SEEN_REPLY | C.CtFlag.DNAT, nat_addr=vip, nat_port=53, src_segment=256,
                dst_segment=812, dst_network=1, delivery=2)
    dead = dict(created_ns=now - 300 * 10**9, last_seen_ns=now - 200 * 10**9, expires_ns=now - 10**9,
                state=C.CtState.UNREPLIED, src_segment=256, dst_segment=812, dst_network=1)
    m("ct-tcp-v4").update(C.ct4_key(1, "10.244.1.10", "10.244.2.20", 40000, 5353, 6), C.CT_ENTRY.pack(**live))
    for i in range(3):
        m("ct-udp-v4").update(C.ct4_key(1, "10.244.1.10", "10.244.2.20", 41000 + i, 53, 17), C.CT_ENTRY.pack(**dead))
    m("ct-tcp-v6").update(C.ct6_key(1, "fd00:10:244:1::a", "2001:db8::1", 40002, 443, 6), C.CT_ENTRY.pack(
        **{**live, "flags": C.CtFlag.SEEN_REPLY}))
    m("ct-udp-v6").update(C.ct6_key(1, "fd00:10:244:1::a", "2001:db8::1", 40003, 53, 17), C.CT_ENTRY.pack(**dead))


@pytest.fixture
def node_env(bpffs: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    root = os.path.join(bpffs, f"lace-nt{os.getpid()}-{uuid.uuid4().hex[:6]}")
    ensure_bpffs()
    os.makedirs(root)
    objs = []
    try:
        for name in ("pod_veth", "uplink"):
            objs.append(ObjectSpec.open(str(registry.bpf_object_path(name)), pin_root=root).load())
        maps: dict[str, Any] = {}
        for o in objs:
            for n, mp in o.maps.items():
                maps.setdefault(n, mp)
        fill(maps)
        store = tmp_path / "store.db"
        st = SqliteStore(store)
        st.apply_all([{"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": "blue"},
                       "spec": {"cidrs": ["10.50.0.0/16"]}}])
        st.close()
        yield {"LACE_PIN_ROOT": root, "LACE_STORE": str(store), "LACE_NODE": "n1"}
    finally:
        for o in objs:
            o.close()
        shutil.rmtree(root, ignore_errors=True)
        assert not os.path.exists(root)


def node(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), env, stdout=out, stderr=err)
    return int(rc), out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", registry.SHOWABLE)
def test_every_map_shows(node_env: dict[str, str], name: str) -> None:
    rc, out, err = node(node_env, "bpf", "show", name)
    assert rc == 0, err
    assert out.strip().splitlines()[-1].startswith(name)
    rc, out, err = node(node_env, "bpf", "show", name, "-o", "json", "-n")
    assert rc == 0, err
    doc = json.loads(out)  # one document
    assert doc["map"] == name and doc["count"] >= 1 and doc["numeric"] is True


def test_policy_lists_both_policy_maps_with_hits(node_env: dict[str, str]) -> None:
    """``node bpf show policy`` is every rule wherever the agent put it: the marker and exact ports in
    policy-exact, the port block in the trie, each entry naming its map, with its hit count."""
    rc, out, err = node(node_env, "bpf", "show", "policy", "-o", "json", "-n")
    assert rc == 0, err
    doc = json.loads(out)
    where = {(e["direction"], e["proto"], e["port"], e["end_port"], e["selected"]): e["map"] for e in doc["entries"]}
    assert where == {("ingress", None, None, None, True): "policy-exact",
                     ("ingress", "tcp", 8080, 8080, False): "policy-exact",
                     ("egress", "udp", 53, 53, False): "policy-exact",
                     ("ingress", "tcp", 9000, 9007, False): "policy"}
    assert all(e["hits"] == 0 for e in doc["entries"])
    # the datapath's counts, in either map, are what the listing shows
    pins = PinnedMaps(node_env["LACE_PIN_ROOT"])
    counted = {("policy-exact", 8080): 3, ("policy", 9000): 5}
    for (name, port), hits in counted.items():
        (key,) = policy_keys(256, 257, Direction.INGRESS, 6, port, port + 7 if port == 9000 else None)
        with pins.open(name) as m:
            m.update(key, POLICY_ENTRY.pack(policy_id=3, rule=1, flags=0, hits=hits))
    rc, out, err = node(node_env, "bpf", "show", "policy", "-o", "json", "-n")
    got = {(e["map"], e["port"]): e["hits"] for e in json.loads(out)["entries"] if e["hits"]}
    assert got == counted
    rc, out, err = node(node_env, "-n", "bpf", "show", "policy", "--ingress")
    rows = {line.split()[4]: line.split()[-1] for line in out.splitlines() if "tcp" in line}
    assert rows == {"8080": "3", "9000-9007": "5"}, out
    marker = next(e for e in doc["entries"] if e["selected"])
    assert marker["flags"] == ["selected", "ports", "blocks"]   # what a check of segment 256 probes
    assert doc["maps"]["policy"]["entries"] == 1 and doc["maps"]["policy-exact"]["entries"] == 3
    assert doc["count"] == doc["entries_in_map"] == 4 and doc["capacity"] == 65536


def test_probe_maps(node_env: dict[str, str]) -> None:
    """Probe targets show where each leads; a marker row denies the address's other ports; an
    in-flight cookie shows the destination asked for and what it resolved to."""
    rc, out, err = node(node_env, "bpf", "show", "probes", "-o", "json", "-n")
    assert rc == 0 and err == "", err
    doc = json.loads(out)
    rows = {(e["addr"], e["port"]): e for e in doc["entries"]}
    assert rows[("10.244.1.40", 8080)]["target_addr"] == "10.10.0.5" and not rows[("10.244.1.40", 8080)]["marker"]
    assert rows[("10.244.1.40", 0)]["marker"] and rows[("10.244.1.40", 0)]["network"] == 2
    rc, out, err = node(node_env, "bpf", "show", "probes", "-n")
    assert rc == 0 and "other ports denied" in out
    rc, out, err = node(node_env, "bpf", "show", "probe-cookie", "-o", "json", "-n")
    assert rc == 0 and err == "", err
    (c,) = json.loads(out)["entries"]
    assert (c["cookie"], c["orig_addr"], c["orig_port"]) == (12345, "10.244.1.40", 8080)
    assert (c["target_addr"], c["target_port"]) == ("10.10.0.5", 8080) and 0 <= c["age_s"] < 60


def test_nexthops(node_env: dict[str, str]) -> None:
    """The next-hop cache: per SID, where the datapath sends it and whether it still trusts that."""
    rc, out, err = node(node_env, "bpf", "show", "nexthops", "-o", "json", "-n")
    assert rc == 0 and err == "", err
    rows = {e["sid"]: e for e in json.loads(out)["entries"]}
    fresh, stale = rows["2001:db8:2:0:1:0:1:0"], rows["2001:db8:3:0:1:0:1:0"]
    assert (fresh["dmac"], fresh["smac"], fresh["mtu"], fresh["ifindex"]) == ("02:00:00:00:0f:02", "02:00:00:00:0f:01",
                                                                              1500, 1)
    assert fresh["fresh"] and not stale["fresh"]
    rc, out, _ = node(node_env, "bpf", "show", "nexthops", "-n")
    assert rc == 0 and "02:00:00:00:0f:02" in out and "expired 5s ago" in out and " 59s" in out


def test_names_and_unresolved(node_env: dict[str, str]) -> None:
    rc, out, _ = node(node_env, "bpf", "show", "segment")
    assert rc == 0 and "segment 812 (unresolved)" in out and "default" in out
    rc, out, _ = node(node_env, "bpf", "show", "policy")
    assert "selected (default deny)" in out and "any" in out
    assert "9000-9007" in out and "8080" in out   # both maps: the trie's port block, the hash's port
    rc, out, _ = node(node_env, "bpf", "show", "policy", "--egress")
    assert "ingress" not in out.split("\n", 1)[1].split("policy (egress)")[0]
    rc, out, _ = node(node_env, "bpf", "show", "services", "--endpoints", "-n")
    assert "10.244.1.10:5353" in out
    # each backend with the frontends its replies leave from, one per line
    rc, out, _ = node(node_env, "bpf", "show", "revnat", "-n")
    assert rc == 0 and "10.244.1.10:5353" in out and "10.96.0.10:53 in 1" in out and "10.96.0.10:53 in 7" in out
    rc, out, _ = node(node_env, "bpf", "show", "revnat", "-n", "-o", "json")
    (entry,) = json.loads(out)["entries"]
    assert entry["backend"] == "10.244.1.10" and [f["network"] for f in entry["frontends"]] == [1, 7]


def test_delivery_exact(node_env: dict[str, str]) -> None:
    """The exact map shows as delivery does: the full-length entries only, with -n, JSON and --limit."""
    rc, out, err = node(node_env, "bpf", "show", "delivery-exact", "-o", "json", "-n")
    assert rc == 0 and err == "", err
    doc = json.loads(out)
    assert doc["map"] == "delivery-exact" and doc["capacity"] == registry.get("delivery").max_entries
    assert doc["pin"].endswith("/lace_dlv_exact")
    assert [(e["network"], e["prefix"], e["kind"], e["ifindex"]) for e in doc["entries"]] == [
        (1, "10.244.1.10/32", "local", 77), (1, "fd00:10:244:1::a/128", "local", 77)]
    rc, out, _ = node(node_env, "bpf", "show", "delivery", "-o", "json", "-n")
    trie = {(e["network"], e["prefix"]): e for e in json.loads(out)["entries"]}
    assert all(trie[(e["network"], e["prefix"])] == e for e in doc["entries"])
    rc, out, _ = node(node_env, "-n", "bpf", "show", "delivery-exact", "--limit", "1")
    assert rc == 0 and "local ifindex 77" in out and "showing 1 of 2 entries" in out
    assert "10.244.2.0/24" not in out


def test_limit(node_env: dict[str, str]) -> None:
    rc, out, _ = node(node_env, "-n", "bpf", "show", "policy", "--limit", "1")
    assert rc == 0 and "showing 1 of 4 entries" in out
    rc, out, _ = node(node_env, "ct", "list", "all", "-n", "--limit", "2", "-o", "json")
    doc = json.loads(out)
    assert doc["shown"] == 2 and len(doc["entries"]) == 2 and doc["truncated"] is True


def test_unknown_map_lists_valid_ones(node_env: dict[str, str]) -> None:
    rc, _, err = node(node_env, "bpf", "show", "bogus")
    assert rc == 2 and "valid maps: config, devices, routing, delivery" in err


def test_numeric_never_opens_store(node_env: dict[str, str], tmp_path: Path) -> None:
    store = Path(node_env["LACE_STORE"])
    os.chmod(store, 0)
    before = sorted(os.listdir(store.parent))
    try:
        for argv in (["bpf", "show", "veth"], ["ct", "list", "all"], ["device", "list"]):
            rc, out, err = node(node_env, "-n", *argv)
            assert rc == 0, err
        assert sorted(os.listdir(store.parent)) == before  # no -wal/-shm: never opened
        assert stat.S_IMODE(os.stat(store).st_mode) == 0
    finally:
        os.chmod(store, 0o644)
    env = dict(node_env, LACE_STORE=str(tmp_path / "no" / "such" / "store.db"))
    rc, _, _ = node(env, "bpf", "show", "routing", "-n")
    assert rc == 0
    rc, _, err = node(env, "bpf", "show", "routing")
    assert rc == 5 and "pass -n/--numeric" in err
    assert not (tmp_path / "no").exists()


def test_ct_list_and_gc(node_env: dict[str, str]) -> None:
    rc, out, err = node(node_env, "ct", "list", "all")
    assert rc == 0, err
    assert "10.244.1.10:40000 → 10.96.0.10:53 → 10.244.2.20:5353" in out
    assert "age 3m12s" in out or "age 3m13s" in out
    rc, out, _ = node(node_env, "ct", "list", "all", "-o", "json")
    doc = orjson.loads(out)
    assert doc["count"] == 6
    e = next(x for x in doc["entries"] if x["table"] == "ct-tcp-v4")
    assert (e["saddr"], e["nat_addr"], e["daddr"], e["network_name"]) == ("10.244.1.10", "10.96.0.10",
                                                                          "10.244.2.20", "default")
    assert e["dst_segment_name"] == "segment 812 (unresolved)"
    v6 = next(x for x in doc["entries"] if x["table"] == "ct-tcp-v6")
    assert v6["saddr"] == "fd00:10:244:1::a" and v6["nat_addr"] is None
    rc, out, _ = node(node_env, "ct", "gc", "all", "-o", "json")
    doc = json.loads(out)
    removed = {t["table"]: t["removed"] for t in doc["tables"]}
    assert removed["ct-udp-v4"] == 3 and removed["ct-udp-v6"] == 1 and removed["ct-tcp-v4"] == 0
    assert doc["removed"] == 4
    rc, out, _ = node(node_env, "ct", "list", "all", "-o", "json", "-n")
    assert orjson.loads(out)["count"] == 2  # live entries stay
    rc, out, _ = node(node_env, "ct", "gc", "ct-tcp-v4")
    assert "removed 0 expired entries" in out


def test_trace_agent_down(node_env: dict[str, str]) -> None:
    rc, _, err = node(dict(node_env, LACE_AGENT_SOCKET="/nonexistent/agent.sock"), "trace", "flow")
    assert rc == 5 and "n1" in err and "/nonexistent/agent.sock" in err


def test_device_list_shows_tcx_and_missing(node_env: dict[str, str], netns: str) -> None:
    run("ip", "-n", netns, "link", "add", "lxa", "type", "veth", "peer", "name", "lxb")
    run("ip", "-n", netns, "link", "set", "lxa", "up")
    idx_a = json.loads(run("ip", "-n", netns, "-j", "link", "show", "lxa").stdout)[0]["ifindex"]
    idx_b = json.loads(run("ip", "-n", netns, "-j", "link", "show", "lxb").stdout)[0]["ifindex"]
    from lace.bpf import Map
    with Map.open_pinned(os.path.join(node_env["LACE_PIN_ROOT"], "lace_devices")) as dev:
        dev.update(device_key(idx_a), device_value("02:00:00:00:01:0a", DeviceRole.POD_VETH))
        dev.update(device_key(idx_b), device_value("02:00:00:00:01:0b", DeviceRole.POD_VETH))
    spec = ObjectSpec.open(str(registry.bpf_object_path("pod_veth")), pin_root=node_env["LACE_PIN_ROOT"])
    obj = spec.load()
    try:
        link = attach_tcx(obj.programs["lace_from_pod"], idx_a, "ingress", netns=netns)
        try:
            with enter_netns(netns):
                rc, out, err = node(node_env, "device", "list", "-n")
                rc2, js, _ = node(node_env, "device", "list", "-n", "-o", "json")
            assert rc == 0 and rc2 == 0, err
            devs = {d["name"]: d for d in json.loads(js)["devices"]}
            assert devs["lxa"]["programs"][0]["hook"] == "tcx-ingress"
            assert devs["lxa"]["programs"][0]["name"].startswith("lace_from_pod")
            assert devs["lxa"]["programs"][0]["link_id"] == link.id
            assert devs["lxb"]["missing_program"] is True and devs["lxa"]["missing_program"] is False
            assert "MISSING" in [ln for ln in out.splitlines() if " lxb " in ln][0]
        finally:
            link.close()
    finally:
        obj.close()
