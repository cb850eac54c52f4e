"""The agent's half of kubelet probes: the probes map from a snapshot, the collection of stale
probe-cookie entries, and the probe ports a pod's spec names."""

from __future__ import annotations

import ipaddress as ia

from lace.agent.desired import desired_maps
from lace.agent.model import LocalEndpoint, is_probe_lease, lease_container, probe_container_id
from lace.agent.probes import COOKIE_MAX_AGE_NS, stale_cookies
from lace.datapath.common import Family, Proto, addr16
from lace.datapath.delivery import delivery_key
from lace.datapath.probes import (PROBE_COOKIE, ProbeFlag, decode_probe, probe_address_key, probe_cookie_key,
                                  probe_key)
from lace.datapath.segment import segment_key
from lace.probes import network_targets, pod_probe_ports

from test_agent_desired import snapshot


def _ep(eid: int, pod: str, network: int, ip: str, *, ports=(8080,), probe_ips=()) -> LocalEndpoint:
    return LocalEndpoint(eid, pod, f"c{eid}", network, 300 + eid, eid, f"lx{eid}", "02:aa:00:00:00:01",
                         "02:bb:00:00:00:01", ia.IPv4Address(ip), None, tuple(ports),
                         tuple(ia.ip_address(a) for a in probe_ips))


def test_isolated_pods_with_one_address_get_their_own_probe_addresses():
    s = snapshot()
    # two pods of two networks, same address, same probe port
    s.endpoints = [_ep(7, "x/a", 2, "10.10.0.5", probe_ips=("10.244.0.40",)),
                   _ep(8, "y/b", 3, "10.10.0.5", probe_ips=("10.244.0.41",))]
    want = desired_maps(s)["probes"]
    a = decode_probe(want[probe_key("10.244.0.40", 8080)], Family.IPV4)
    b = decode_probe(want[probe_key("10.244.0.41", 8080)], Family.IPV4)
    assert (a["network"], a["ifindex"], a["target_addr"], a["target_port"]) == (2, 7, "10.10.0.5", 8080)
    assert (b["network"], b["ifindex"], b["target_addr"], b["target_port"]) == (3, 8, "10.10.0.5", 8080)
    marker = decode_probe(want[probe_address_key("10.244.0.40")], Family.IPV4)
    assert marker["flags"] == ProbeFlag.ADDRESS and marker["network"] == 2
    assert len(want) == 4
    # a probe address is no pod address: no segment, no delivery of its own
    maps = desired_maps(s)
    assert segment_key(1, "10.244.0.40") not in maps["segment"]
    assert delivery_key(1, "10.244.0.40/32") not in maps["delivery"]


def test_default_network_pods_are_probed_at_their_own_address_without_marker():
    s = snapshot()
    s.endpoints = [_ep(7, "x/a", 1, "10.244.0.5", ports=(8080, 9000))]
    want = desired_maps(s)["probes"]
    assert set(want) == {probe_key("10.244.0.5", 8080), probe_key("10.244.0.5", 9000)}
    assert decode_probe(want[probe_key("10.244.0.5", 9000)], Family.IPV4)["target_addr"] == "10.244.0.5"


def test_pods_without_probes_have_no_entries():
    s = snapshot()
    s.endpoints = [_ep(7, "x/a", 2, "10.10.0.5", ports=(), probe_ips=("10.244.0.40",))]
    assert desired_maps(s)["probes"] == {}


def _cookie(addr: str, port: int, created_ns: int) -> bytes:
    family, raw = addr16(addr)
    return PROBE_COOKIE.pack(orig_addr=raw, orig_port=port, family=family, proto=Proto.TCP, network=2,
                             created_ns=created_ns)


def test_stale_cookies_are_those_of_gone_targets_or_too_old():
    now = 10**12
    targets = [probe_key("10.244.0.40", 8080)]
    cookies = {probe_cookie_key(1): _cookie("10.244.0.40", 8080, now - 10**9),          # in flight
               probe_cookie_key(2): _cookie("10.244.0.41", 8080, now - 10**9),          # pod gone
               probe_cookie_key(3): _cookie("10.244.0.40", 8080, now - COOKIE_MAX_AGE_NS - 1)}
    assert sorted(stale_cookies(cookies, targets, now)) == sorted([probe_cookie_key(2), probe_cookie_key(3)])


def test_probe_leases_belong_to_their_pod_container():
    spec = {"containerID": probe_container_id("abc"), "pod": "probe/x/a"}
    assert is_probe_lease(spec) and lease_container(spec) == "abc"
    assert not is_probe_lease({"containerID": "abc"}) and lease_container({"containerID": "abc"}) == "abc"


def test_probe_ports_resolve_names_and_skip_other_hosts_and_exec():
    pod = {"spec": {"containers": [{
        "name": "web", "ports": [{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53,
                                                                          "protocol": "UDP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
        "livenessProbe": {"tcpSocket": {"port": 9000}},
        "startupProbe": {"exec": {"command": ["true"]}}}, {
        "name": "side", "readinessProbe": {"httpGet": {"port": 7000, "host": "192.0.2.1"}},
        "livenessProbe": {"tcpSocket": {"port": "dns"}}}]}}
    assert pod_probe_ports(pod) == {8080, 9000}
    unresolved = [t for t in network_targets(pod) if t.port is None]
    assert [(t.container, t.probe) for t in unresolved] == [("side", "livenessProbe")]
