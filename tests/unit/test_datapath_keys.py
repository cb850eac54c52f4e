"""Key builders and decoders of lace.datapath: port blocks, LPM prefix lengths, SIDs, addresses."""

from __future__ import annotations

import ipaddress
import random

import pytest

from lace.datapath import common, config, conntrack, delivery, endpoint, policy, registry, routing, segment, services
from lace.datapath.common import Direction, Family, Proto
from lace.datapath.reasons import DropReason, TracePoint

# --- port ranges -> LPM blocks -------------------------------------------------------------------


def _covered(blocks: list[tuple[int, int]]) -> list[int]:
    ports: list[int] = []
    for first, bits in blocks:
        span = 1 << (16 - bits)
        assert first % span == 0, f"block {first}/{bits} is not aligned"
        ports.extend(range(first, first + span))
    return ports


def _minimal_count(a: int, b: int) -> int:
    # reference: greedy over aligned blocks from the top of the trie
    def rec(lo: int, hi: int, node_lo: int, node_bits: int) -> int:
        span = 1 << (16 - node_bits)
        node_hi = node_lo + span - 1
        if hi < node_lo or lo > node_hi:
            return 0
        if lo <= node_lo and node_hi <= hi:
            return 1
        half = span // 2
        return rec(lo, hi, node_lo, node_bits + 1) + rec(lo, hi, node_lo + half, node_bits + 1)

    return rec(a, b, 0, 0)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (80, 80, [(80, 16)]),
        (0, 65535, [(0, 0)]),
        (1, 65535, None),
        (1000, 2000, [(1000, 13), (1008, 12), (1024, 7), (1536, 8), (1792, 9), (1920, 10), (1984, 12), (2000, 16)]),
        (8080, 8081, [(8080, 15)]),
        (65535, 65535, [(65535, 16)]),
        (1024, 2047, [(1024, 6)]),
    ],
)
def test_port_blocks_cover_exactly_the_range(a: int, b: int, expected: list[tuple[int, int]] | None) -> None:
    blocks = policy.port_blocks(a, b)
    assert _covered(blocks) == list(range(a, b + 1))
    assert len(blocks) == _minimal_count(a, b)
    if expected is not None:
        assert blocks == expected


def test_port_blocks_1_65535_is_16_blocks() -> None:
    blocks = policy.port_blocks(1, 65535)
    assert len(blocks) == 16
    assert blocks[0] == (1, 16) and blocks[-1] == (32768, 1)


def test_port_blocks_random_ranges() -> None:
    rng = random.Random(7)
    for _ in range(300):
        a = rng.randrange(65536)
        b = rng.randrange(a, 65536)
        blocks = policy.port_blocks(a, b)
        assert _covered(blocks) == list(range(a, b + 1))
        assert len(blocks) == _minimal_count(a, b)


@pytest.mark.parametrize(("a", "b"), [(10, 9), (-1, 5), (1, 65536)])
def test_port_blocks_reject_bad_ranges(a: int, b: int) -> None:
    with pytest.raises(ValueError):
        policy.port_blocks(a, b)


# --- policy keys ---------------------------------------------------------------------------------


def test_policy_key_exact_port() -> None:
    [key] = policy.policy_keys(300, 301, Direction.EGRESS, Proto.TCP, 80)
    assert len(key) == policy.POLICY_KEY.size == 16
    k = policy.POLICY_KEY.unpack(key)
    assert k == {"prefixlen": 96, "segment": 300, "peer": 301, "direction": 1, "proto": 6, "dport": 80}
    assert key[12:16] == bytes([1, 6, 0, 80])  # direction, proto, then the port big-endian
    d = policy.decode_policy_key(key)
    assert (d["proto"], d["port"], d["end_port"], d["direction"]) == ("tcp", 80, 80, "egress")


def test_policy_key_any_port_and_any_proto() -> None:
    [any_port] = policy.policy_keys(300, 0, Direction.INGRESS, Proto.UDP, None)
    assert policy.POLICY_KEY.unpack(any_port)["prefixlen"] == policy.POLICY_PREFIX_PROTO == 80
    assert policy.decode_policy_key(any_port)["port"] is None
    [any_proto] = policy.policy_keys(300, 0, Direction.INGRESS, None, None)
    k = policy.POLICY_KEY.unpack(any_proto)
    assert k["prefixlen"] == policy.POLICY_PREFIX_ANY_PROTO == 72 and k["proto"] == 0
    assert policy.decode_policy_key(any_proto)["proto"] is None
    with pytest.raises(ValueError):
        policy.policy_keys(300, 0, Direction.INGRESS, None, 80)


def test_policy_key_range() -> None:
    keys = policy.policy_keys(300, 301, Direction.INGRESS, Proto.TCP, 1000, 2000)
    decoded = [policy.decode_policy_key(k) for k in keys]
    ports = [p for d in decoded for p in range(d["port"], d["end_port"] + 1)]
    assert ports == list(range(1000, 2001))
    assert [policy.POLICY_KEY.unpack(k)["prefixlen"] for k in keys] == [80 + bits for _, bits in policy.port_blocks(1000, 2000)]
    # the full range collapses to the any-port key
    assert policy.policy_keys(1, 2, 0, 6, 0, 65535) == policy.policy_keys(1, 2, 0, 6, None)


def test_policy_marker_key() -> None:
    k = policy.decode_policy_key(policy.selected_key(300, Direction.EGRESS))
    assert k["selected"] and k["prefixlen"] == 72 and k["peer"] == common.SEGMENT_SELECTED


# --- LPM prefix lengths --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cidr", "plen", "addr"),
    [
        ("10.1.2.0/24", 64 + 24, bytes([10, 1, 2, 0]) + bytes(12)),
        ("10.1.2.3/24", 64 + 24, bytes([10, 1, 2, 0]) + bytes(12)),  # host bits cleared
        ("10.1.2.3", 64 + 32, bytes([10, 1, 2, 3]) + bytes(12)),
        ("0.0.0.0/0", 64, bytes(16)),
        ("fd00:10::/64", 64 + 64, ipaddress.IPv6Address("fd00:10::").packed),
        ("2001:db8::1/128", 64 + 128, ipaddress.IPv6Address("2001:db8::1").packed),
    ],
)
def test_lpm_keys(cidr: str, plen: int, addr: bytes) -> None:
    fam = Family.IPV4 if "." in cidr else Family.IPV6
    for build, layout, field in (
        (routing.routing_key, routing.ROUTING_KEY, "src_network"),
        (delivery.delivery_key, delivery.DELIVERY_KEY, "network"),
        (segment.prefix_segment_key, segment.PREFIX_SEGMENT_KEY, "network"),
    ):
        raw = build(7, cidr)
        assert len(raw) == layout.size == 28
        k = layout.unpack(raw)
        assert k == {"prefixlen": plen, field: 7, "family": fam, "reserved": bytes(3), "addr": addr}
    d = routing.decode_routing_key(routing.routing_key(7, cidr))
    assert d == {"src_network": 7, "family": fam.label, "prefix": str(ipaddress.ip_network(cidr, strict=False))}


@pytest.mark.parametrize("addr", ["10.1.2.3", "2001:db8::1"])
def test_delivery_exact_key_is_the_full_length_trie_key_past_its_prefixlen(addr: str) -> None:
    ip = ipaddress.ip_address(addr)
    trie = delivery.delivery_key(7, f"{ip}/{ip.max_prefixlen}")
    exact = delivery.delivery_exact_key(7, addr)
    assert len(exact) == delivery.DELIVERY_EXACT_KEY.size == 24 and exact == trie[4:]
    assert delivery.DELIVERY_EXACT_KEY.unpack(exact) == {
        "network": 7, "family": Family.IPV4 if ip.version == 4 else Family.IPV6, "reserved": bytes(3),
        "addr": ip.packed.ljust(16, b"\0")}
    assert delivery.decode_delivery_exact_key(exact) == delivery.decode_delivery_key(trie)
    assert delivery.full_length(trie) and delivery.exact_key(trie) == exact
    block = delivery.delivery_key(7, "10.1.2.0/24" if ip.version == 4 else "2001:db8::/64")
    assert not delivery.full_length(block) and delivery.exact_entries({trie: b"v", block: b"w"}) == {exact: b"v"}
    with pytest.raises(ValueError, match="not full-length"):
        delivery.exact_key(block)
    # an IPv6 /32 has the IPv4 full length's bits, not its family
    assert not delivery.full_length(delivery.delivery_key(7, "2001:db8::/32"))


def test_lpm_key_bases_match_header_constants() -> None:
    assert routing.ROUTING_PREFIX_BASE == delivery.DELIVERY_PREFIX_BASE == segment.PREFIX_SEGMENT_PREFIX_BASE == 64
    # the base counts every byte between prefixlen and addr
    assert routing.ROUTING_KEY.field("addr").offset * 8 - 32 == routing.ROUTING_PREFIX_BASE


# --- SIDs ----------------------------------------------------------------------------------------


def test_sid_layout() -> None:
    s = config.sid("fd00:0:1::/48", None, network=0x01020304, src_network=7)
    assert s[:6] == ipaddress.IPv6Address("fd00:0:1::").packed[:6]
    assert s[6:10] == bytes([1, 2, 3, 4])  # function: destination network, big-endian
    assert s[10:14] == (7).to_bytes(4, "big")  # argument: source network
    assert s[14:] == bytes(2)
    assert str(ipaddress.IPv6Address(s)) == "fd00:0:1:102:304:0:7:0"
    assert config.parse_sid(s, 48) == {"locator": "fd00:0:1::/48", "network": 0x01020304, "src_network": 7}


def test_sid_locator_forms() -> None:
    raw = ipaddress.IPv6Address("fd00:0:2::").packed
    a = config.sid(raw, 48, 5)
    b = config.sid("fd00:0:2::", 48, 5)
    c = config.sid("fd00:0:2:ffff::/48", 48, 5)  # bits past the locator are not kept
    assert a == b == c
    s64 = config.sid("fd00:1:2:3::/64", 64, 1, 2)
    assert s64[8:12] == (1).to_bytes(4, "big") and s64[12:16] == (2).to_bytes(4, "big")


@pytest.mark.parametrize(("loc", "bits"), [("fd00::/72", None), ("fd00::/44", None), ("10.0.0.0/8", None),
                                           ("fd00::/48", 56), ("fd00::", None)])
def test_sid_rejects_bad_locators(loc: str, bits: int | None) -> None:
    with pytest.raises(ValueError):
        config.sid(loc, bits, 1)


def test_config_roundtrip() -> None:
    raw = config.config_value(locator="fd00:0:3::/48", underlay_addr="2001:db8::3", node_id=3,
                              uplink_ifindex=9, mtu=1460, flags=config.ConfigFlag.TRACE_ALL,
                              kubelet_cgroup=4242)
    assert len(raw) == config.CONFIG.size == 56
    assert config.decode_config(raw) == {
        "locator": "fd00:0:3::/48", "underlay_addr": "2001:db8::3", "node_id": 3, "uplink_ifindex": 9,
        "mtu": 1460, "flags": ["trace-all"], "addr4": None, "kubelet_cgroup": 4242,
    }


# --- addresses -----------------------------------------------------------------------------------


def test_addr16() -> None:
    assert common.addr16("10.0.0.1") == (Family.IPV4, bytes([10, 0, 0, 1]) + bytes(12))
    assert common.addr16(ipaddress.ip_address("10.0.0.1")) == common.addr16("10.0.0.1")
    fam, raw = common.addr16("fd00::1")
    assert fam == Family.IPV6 and raw == ipaddress.IPv6Address("fd00::1").packed
    assert common.addr_str(4, bytes([10, 0, 0, 1]) + bytes(12)) == "10.0.0.1"
    assert common.addr_str(6, raw) == "fd00::1"
    with pytest.raises(ValueError, match="not an IPv4 or IPv6 address"):
        common.addr16("10.0.0.300")


def test_mac() -> None:
    assert common.mac_bytes("02:00:0A:00:00:01") == bytes([2, 0, 10, 0, 0, 1])
    assert common.mac_str(bytes([2, 0, 10, 0, 0, 1])) == "02:00:0a:00:00:01"
    with pytest.raises(ValueError):
        common.mac_bytes("02:00:0a")


# --- other keys and decoders ---------------------------------------------------------------------


def test_segment_key() -> None:
    raw = segment.segment_key(2, "10.0.0.5")
    assert len(raw) == segment.SEGMENT_KEY.size == 24
    assert segment.decode_segment_key(raw) == {"network": 2, "family": "ipv4", "addr": "10.0.0.5"}


def test_ct_keys() -> None:
    fam, raw = conntrack.ct_key(1, "10.0.0.1", "10.0.0.2", 40000, 80, Proto.TCP)
    assert fam == Family.IPV4 and len(raw) == conntrack.CT4_KEY.size == 20
    assert raw[12:14] == (40000).to_bytes(2, "big") and raw[14:16] == (80).to_bytes(2, "big")
    assert conntrack.decode_ct4_key(raw) == {"network": 1, "saddr": "10.0.0.1", "daddr": "10.0.0.2",
                                             "sport": 40000, "dport": 80, "proto": "tcp"}
    raw6 = conntrack.ct6_key(1, "fd00::1", "fd00::2", 7, 7, Proto.ICMPV6)
    assert len(raw6) == conntrack.CT6_KEY.size == 44
    assert conntrack.decode_ct6_key(raw6)["daddr"] == "fd00::2"
    with pytest.raises(ValueError):
        conntrack.ct_key(1, "10.0.0.1", "fd00::2", 1, 2, Proto.UDP)
    with pytest.raises(ValueError):
        conntrack.ct4_key(1, "fd00::1", "fd00::2", 1, 2, Proto.UDP)


def test_ct_entry_decode() -> None:
    raw = conntrack.CT_ENTRY.pack(state=conntrack.CtState.ESTABLISHED, flags=conntrack.CtFlag.DNAT | 1,
                                  nat_addr=bytes([10, 96, 0, 10]) + bytes(12), nat_port=443,
                                  tcp_flags_fwd=0x12, delivery=delivery.DeliveryKind.LOCAL)
    d = conntrack.decode_ct4_entry(raw)
    assert d["state"] == "established" and d["flags"] == ["seen-reply", "dnat"]
    assert (d["nat_addr"], d["nat_port"]) == ("10.96.0.10", 443)
    assert d["tcp_flags_fwd"] == ["syn", "ack"] and d["delivery"] == "local"


def test_service_key() -> None:
    raw = services.service_key(1, "10.96.0.10", 53, Proto.UDP, slot=2)
    assert len(raw) == services.SERVICE_KEY.size == 28
    assert services.decode_service_key(raw) == {"network": 1, "family": "ipv4", "addr": "10.96.0.10",
                                                "port": 53, "proto": "udp", "slot": 2}


def test_endpoint_roundtrip() -> None:
    raw = endpoint.endpoint_value(endpoint_id=5, network=1, segment=300, mac="02:00:00:00:00:05",
                                  ipv4="10.0.0.5", ipv6="fd00::5")
    d = endpoint.decode_endpoint(raw)
    assert d["ipv4"] == "10.0.0.5" and d["ipv6"] == "fd00::5" and d["flags"] == ["ipv4", "ipv6"]
    assert endpoint.decode_endpoint(endpoint.endpoint_value(endpoint_id=5, network=1, segment=3,
                                                            mac="02:00:00:00:00:05"))["ipv4"] is None


def test_unknown_enum_values_render_as_numbers() -> None:
    assert common.enum_label(DropReason, 999) == 999
    # (every bit of the conntrack flags byte has a name since ALIAS: backend flags have spare bits)
    assert common.flag_labels(conntrack.CtFlag, 0x81) == ["seen-reply", "alias"]
    assert common.flag_labels(services.BackendFlag, 0x9) == ["active", "0x8"]


# --- reasons and registry ------------------------------------------------------------------------


def test_reasons() -> None:
    assert DropReason.POLICY_EGRESS.label == "policy-egress"
    assert DropReason.from_label("policy-egress") is DropReason.POLICY_EGRESS
    assert DropReason.from_label("POLICY_EGRESS") is DropReason.POLICY_EGRESS
    assert DropReason.NONE.text == "not dropped"
    assert TracePoint.FROM_POD.label == "from-pod" and TracePoint(1) is TracePoint.FROM_POD
    with pytest.raises(ValueError, match="unknown drop reason"):
        DropReason.from_label("nope")


def test_registry() -> None:
    assert registry.CT_TABLES == ("ct-tcp-v6", "ct-udp-v6", "ct-icmp-v6", "ct-tcp-v4", "ct-udp-v4", "ct-icmp-v4")
    assert registry.by_pin_name()["lace_pfx_seg"].cli_name == "prefix-segment"
    assert registry.ct_table(4, Proto.ICMP) == "ct-icmp-v4" and registry.ct_table(6, Proto.ICMPV6) == "ct-icmp-v6"
    m = registry.MAPS["routing"]
    assert m.key_dict(routing.routing_key(1, "10.0.0.0/8"))["prefix"] == "10.0.0.0/8"
    assert m.value_dict(routing.route_value(2, masquerade=True)) == {
        "dst_network": 2, "outside": False, "masquerade": True, "service_map_full": False,
        "flags": ["masquerade"]}


def test_bpf_object_path(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LACE_BPF_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make bpf"):
        registry.bpf_object_path("pod_veth")
    (tmp_path / "uplink.o").write_bytes(b"")
    assert registry.bpf_object_path("uplink") == tmp_path / "uplink.o"
    with pytest.raises(KeyError):
        registry.bpf_object_path("nope")
