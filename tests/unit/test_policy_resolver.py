"""The resolver without a kernel: policyTypes defaulting, policy IDs, ports (SCTP, ranges as LPM
blocks, named), ipBlock CIDR segments, audit markers, the host allowed into pods selected for
ingress, the per-policy cache, per-node restriction and a full map reported with MAP_FULL."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from lace.datapath.common import SEGMENT_ANY, SEGMENT_HOST, Direction
from lace.datapath.policy import HOST_RULE, decode_policy_entry, decode_policy_key, selected_key
from lace.policy import ContainerPort, NamespaceInfo, PodInfo, PolicyInputs, Resolver, parse_policy, policy_ids
from lace.policy.ids import base_policy_id, cidr_from_label, cidr_label_value
from lace.policy.resolve import MAP_FULL, resolve


def pol(name, spec, ns="x", ann=None):
    meta = {"name": name, "namespace": ns, "resourceVersion": str(hash(repr(spec)))}
    if ann:
        meta["annotations"] = ann
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": spec}


def inputs(*policies, cidrs=None) -> PolicyInputs:
    i = PolicyInputs(namespaces={"x": NamespaceInfo("x", (("ns", "x"),)), "y": NamespaceInfo("y", (("ns", "y"),))})
    ports = (ContainerPort(8080, 6, "http"), ContainerPort(9000, 132, "sctp-x"))
    i.pods = [PodInfo("x", "a", (("app", "a"),), "default", 1, 300, (ipaddress.ip_address("10.0.0.1"),), "n1", ports),
              PodInfo("x", "b", (("app", "b"),), "default", 1, 301, (ipaddress.ip_address("10.0.0.2"),), "n2", ports),
              PodInfo("y", "c", (("app", "c"),), "default", 1, 302, (ipaddress.ip_address("10.0.1.3"),), "n2", ())]
    i.policies = [parse_policy(p) for p in policies]
    i.cidr_segments = dict(cidrs or {})
    return i


def decoded(entries):
    return {tuple(sorted(decode_policy_key(k).items())): decode_policy_entry(v) for k, v in entries.items()}


def allows(entries):
    """The allow entries policies' rules made (not the markers, not the host's default entries)."""
    out = []
    for k, v in entries.items():
        dk = decode_policy_key(k)
        if not dk["selected"] and decode_policy_entry(v)["rule"] != HOST_RULE:
            out.append((dk["segment"], dk["direction"], dk["peer"], dk["proto"], dk["port"], dk["end_port"]))
    return sorted(out, key=repr)


def host_entries(entries):
    """(segment, direction, peer, proto, policy ID) of the host's default entries."""
    out = []
    for k, v in entries.items():
        dk, dv = decode_policy_key(k), decode_policy_entry(v)
        if not dk["selected"] and dv["rule"] == HOST_RULE:
            out.append((dk["segment"], dk["direction"], dk["peer"], dk["proto"], dv["policy_id"]))
    return sorted(out)


def test_policy_types_defaulting():
    assert parse_policy(pol("p", {"podSelector": {}})).types() == ["ingress"]
    assert parse_policy(pol("p", {"podSelector": {}, "egress": [{}]})).types() == ["ingress", "egress"]
    assert parse_policy(pol("p", {"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]})).types() == ["egress"]
    # ingress rules of a policy that only says Egress are ignored
    assert parse_policy(pol("p", {"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]})).rules == ()


def test_policy_ids_are_stable_nonzero_and_collision_free():
    ids = policy_ids(["x/a", "y/b", "x/a"])
    assert ids == policy_ids(["y/b", "x/a"]) and len(set(ids.values())) == 2
    assert all(0 < v < 2 ** 31 for v in ids.values())
    assert ids["x/a"] == base_policy_id("x", "a")


def test_cidr_label_round_trip():
    for c in ("10.0.0.0/8", "2001:db8:cafe::1/128", "0.0.0.0/0"):
        assert cidr_from_label(cidr_label_value(c)) == c


def test_marker_and_any_peer_any_port():
    res = resolve(inputs(pol("p", {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{}]})))
    entries, pr = res.entries()
    m = decode_policy_entry(entries[selected_key(300, Direction.INGRESS)])
    assert "selected" in m["flags"] and "audit" not in m["flags"] and m["policy_id"] == base_policy_id("x", "p")
    assert allows(entries) == [(300, "ingress", SEGMENT_ANY, None, None, None)]
    assert pr.markers == 1 and pr.programmed == 3 and pr.reason is None   # marker, host, the rule


def test_sctp_udp_ranges_and_named_ports():
    spec = {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [
        {"protocol": "SCTP", "port": "sctp-x"}, {"protocol": "UDP", "port": 1000, "endPort": 1003},
        {"port": "http"}, {"port": "missing"}]}]}
    entries, _ = resolve(inputs(pol("p", spec))).entries()
    got = allows(entries)
    for peer in (300, 301, 302):
        assert (300, "ingress", peer, "tcp", 8080, 8080) in got
        assert (300, "ingress", peer, "udp", 1000, 1003) in got      # one aligned LPM block
        assert any(g[:3] == (300, "ingress", peer) and g[4] == 9000 for g in got)   # SCTP (132)
    assert len(got) == 9


def test_named_egress_port_resolves_on_the_destination():
    spec = {"podSelector": {"matchLabels": {"app": "c"}}, "policyTypes": ["Egress"],
            "egress": [{"ports": [{"port": "http"}]}]}
    entries, _ = resolve(inputs(pol("p", spec, ns="y"))).entries()
    # any peer + a named port: one entry per destination segment that has the name (y/c has none)
    assert allows(entries) == [(302, "egress", 300, "tcp", 8080, 8080), (302, "egress", 301, "tcp", 8080, 8080)]


def test_ip_block_segments_and_pod_addresses():
    spec = {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"from": [
        {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.2/32"]}}]}]}
    cidrs = {"10.0.0.0/16": 400, "10.0.0.2/32": 401}
    res = resolve(inputs(pol("p", spec), cidrs=cidrs))
    entries, _ = res.entries()
    peers = {a[2] for a in allows(entries)}
    # the block's segment, x/a (10.0.0.1) and y/c (10.0.1.3); not x/b (in the except), not the except's segment
    assert peers == {400, 300, 302}
    pfx, desired, dropped = res.prefix_entries()
    assert desired == 4 and not dropped   # 2 prefixes x (network 1, outside)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 255), st.integers(300, 310), st.booleans()), max_size=40),
       st.integers(0, 255), st.integers(24, 32), st.lists(st.tuples(st.integers(0, 255), st.integers(24, 32)),
                                                       max_size=3))
def test_the_segments_an_ip_block_holds_are_those_with_an_address_in_it(pods, base, plen, holes):
    """World's range search (bisect over the sorted addresses) picks exactly the segments that
    IPBlockPeer.contains, address by address, says the block holds: IPv4 and IPv6 pods, except
    blocks inside, across or outside the block, a block of one address."""
    from lace.policy.parse import IPBlockPeer
    from lace.policy.world import World

    def addr(last: int, v6: bool):
        return ipaddress.ip_address(f"fd00::{last:x}" if v6 else f"10.0.0.{last}")
    i = PolicyInputs()
    i.pods = [PodInfo("x", f"p{n}", (("n", str(seg)),), "default", 1, seg, (addr(last, v6),), "n1", ())
              for n, (last, seg, v6) in enumerate(pods)]
    world = World(i)
    for v6 in (False, True):
        cidr = ipaddress.ip_network(f"{addr(base, v6)}/{plen + (96 if v6 else 0)}", strict=False)
        excepts = tuple(ipaddress.ip_network(f"{addr(b, v6)}/{p + (96 if v6 else 0)}", strict=False) for b, p in holes)
        block = IPBlockPeer(cidr, excepts)
        want = {s.id for s in world.segments.values() if any(block.contains(ip) for p in s.pods for ip in p.ips)}
        assert world.segments_with_addresses_in(cidr, excepts) == want


def test_audit_marker_only_when_every_selecting_policy_audits():
    deny_audit = pol("audit", {"podSelector": {}}, ann={"lace.dev/audit": "true"})
    res = resolve(inputs(deny_audit))
    entries, _ = res.entries()
    assert "audit" in decode_policy_entry(entries[selected_key(300, Direction.INGRESS)])["flags"]
    allow_audit = pol("audit-allow", {"podSelector": {}, "ingress": [{"ports": [{"port": 81}]}]},
                      ann={"lace.dev/audit": "true"})
    enforce = pol("enforce", {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"ports": [{"port": 80}]}]})
    entries, _ = resolve(inputs(allow_audit, enforce)).entries()
    assert "audit" not in decode_policy_entry(entries[selected_key(300, Direction.INGRESS)])["flags"]
    # x/a: only the enforcing policy's rules count; x/b: only audit policies select it
    assert [a for a in allows(entries) if a[0] == 300] == [(300, "ingress", 0, "tcp", 80, 80)]
    assert [a for a in allows(entries) if a[0] == 301] == [(301, "ingress", 0, "tcp", 81, 81)]
    ns_audit = inputs(enforce)
    ns_audit.namespaces["x"] = NamespaceInfo("x", (("ns", "x"),), audit=True)
    entries, _ = resolve(ns_audit).entries()
    assert "audit" in decode_policy_entry(entries[selected_key(300, Direction.INGRESS)])["flags"]


def test_incremental_cache_reresolves_only_the_changed_policy():
    r = Resolver()
    ps = [pol(f"p{i}", {"podSelector": {}, "ingress": [{"ports": [{"port": 80 + i}]}]}) for i in range(5)]
    r.resolve(inputs(*ps))
    assert r.last_resolved == 5
    r.resolve(inputs(*ps))
    assert r.last_resolved == 0
    ps[2] = pol("p2", {"podSelector": {}, "ingress": [{"ports": [{"port": 99}]}]})
    res = r.resolve(inputs(*ps))
    assert r.last_resolved == 1
    assert (300, "ingress", 0, "tcp", 99, 99) in allows(res.entries()[0])
    relabelled = inputs(*ps)
    relabelled.pods[0] = PodInfo("x", "a", (("app", "z"),), "default", 1, 310, relabelled.pods[0].ips, "n1")
    r.resolve(relabelled)
    assert r.last_resolved == 5       # a new segment: every policy may select it


def test_an_ipblock_policy_is_resolved_again_only_when_its_blocks_hold_other_segments():
    """A pod address that comes elsewhere leaves an ipBlock policy's resolution cached; one inside
    its block (or a pod of the block moved to another segment) resolves it again."""
    r = Resolver()
    block = pol("blk", {"podSelector": {"matchLabels": {"app": "a"}},
                        "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.1.0/24"}}]}]})
    other = pol("any", {"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]})
    cidrs = {"10.0.1.0/24": 900}
    r.resolve(inputs(block, other, cidrs=cidrs))
    assert r.last_resolved == 2
    elsewhere = inputs(block, other, cidrs=cidrs)
    elsewhere.pods.append(PodInfo("x", "d", (("app", "b"),), "default", 1, 301, (ipaddress.ip_address("10.0.2.9"),), "n3"))
    r.resolve(elsewhere)
    assert r.last_resolved == 0
    inside = inputs(block, other, cidrs=cidrs)
    inside.pods.append(PodInfo("x", "e", (("app", "b"),), "default", 1, 301, (ipaddress.ip_address("10.0.1.9"),), "n3"))
    res = r.resolve(inside)
    assert r.last_resolved == 1   # the block's policy; the other one's world did not change
    assert (300, "ingress", 301, None, None, None) in allows(res.entries()[0])


def test_per_node_entries_and_full_map_is_reported():
    ps = [pol(f"p{i}", {"podSelector": {}, "ingress": [{"ports": [{"port": 1000 + i}]}]}) for i in range(10)]
    res = resolve(inputs(*ps))
    n1, _ = res.entries({300})
    assert {decode_policy_key(k)["segment"] for k in n1} == {300}
    entries, pr = res.entries(None, capacity=10)
    assert len(entries) == 10 and pr.reason == MAP_FULL
    # 2 markers, 2 host entries, 10 policies x 2 subjects
    assert pr.markers == 2 and pr.dropped == pr.desired - 10 == 24 - 10
    assert sum(pr.dropped_by_policy.values()) == pr.dropped
    # markers are kept (fail closed): every subject stays default deny; and the host stays allowed
    assert all(selected_key(s, Direction.INGRESS) in entries for s in (300, 301))
    assert [h[0] for h in host_entries(entries)] == [300, 301]


def test_host_allowed_into_every_pod_selected_for_ingress():
    """A pod selected for ingress keeps its node's host (kubelet probes) with one entry: peer HOST,
    any protocol and port, policy 0, whatever the rules say; egress selection adds none."""
    deny_all = pol("deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    res = resolve(inputs(deny_all))
    entries, _ = res.entries()
    assert allows(entries) == []
    assert host_entries(entries) == [(s, "ingress", SEGMENT_HOST, None, 0) for s in (300, 301)]
    egress_only = pol("eg", {"podSelector": {}, "policyTypes": ["Egress"]})
    assert host_entries(resolve(inputs(egress_only)).entries()[0]) == []
    n2, _ = res.entries({301})
    assert host_entries(n2) == [(301, "ingress", SEGMENT_HOST, None, 0)]


#: policies of every shape whose resolution reads a different part of the world
WORLD_POLICIES = [
    pol("named-in", {"podSelector": {"matchLabels": {"app": "a"}},
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}], "ports": [{"port": "http"}]}]}),
    pol("ns-sel", {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]}),
    pol("named-out", {"podSelector": {}, "policyTypes": ["Egress"],
                      "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "c"}}}], "ports": [{"port": "http"}]}]}),
    pol("ns-named-out", {"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Egress"],
                         "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "b"}}}],
                                     "ports": [{"port": "http"}]}]}, ns="y"),
    pol("block", {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.1.0/24",
                                                                          "except": ["10.0.1.128/25"]}}]}]}, ns="z"),
    pol("block-named", {"podSelector": {}, "policyTypes": ["Egress"],
                        "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16"}}], "ports": [{"port": "http"}]}]}, ns="y"),
    pol("any-named", {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Egress"],
                      "egress": [{"ports": [{"port": "http"}]}]}, ns="z"),
    pol("y-from-x", {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}},
                                                                "podSelector": {"matchLabels": {"app": "a"}}}]}]}, ns="y"),
]


PORT_SETS = [(), (ContainerPort(8080, 6, "http"),), (ContainerPort(8081, 6, "http"),)]


def world_inputs(spec: dict) -> PolicyInputs:
    """PolicyInputs of a small cluster: ``spec`` holds the namespaces' team labels (None: no
    Namespace object), the pods as (namespace, app label, address, node, port set) and which of
    WORLD_POLICIES exist. A pod's segment follows its (namespace, labels), as the store allocates."""
    i = PolicyInputs(namespaces={ns: NamespaceInfo(ns, (("team", team),)) for ns, team in spec["ns"].items()
                                 if team is not None})
    for n, (ns, app, ip, node, ports) in enumerate(spec["pods"]):
        seg = 300 + "xyz".index(ns) * 3 + "abc".index(app)
        i.pods.append(PodInfo(ns, f"p{n}", (("app", app),), "default", 1, seg, (ipaddress.ip_address(ip),), node,
                              PORT_SETS[ports]))
    i.policies = [parse_policy(WORLD_POLICIES[k]) for k in sorted(spec["policies"])]
    i.cidr_segments = {"10.0.1.0/24": 900, "10.0.1.128/25": 901, "10.0.0.0/16": 902}
    return i


def changed(spec: dict, rnd) -> dict:
    """``spec`` with one small change: a namespace's label, a pod added, removed, relabelled or
    given other ports, or a policy added or removed."""
    spec = {"ns": dict(spec["ns"]), "pods": list(spec["pods"]), "policies": set(spec["policies"])}
    what = rnd.choice(["ns", "add", "remove", "relabel", "ports", "policy"])
    if what == "ns":
        spec["ns"][rnd.choice("xyz")] = rnd.choice(["a", "b", None])
    elif what == "add" or not spec["pods"]:
        spec["pods"].append((rnd.choice("xyz"), rnd.choice("abc"), f"10.0.{rnd.randint(0, 1)}.{rnd.randint(1, 254)}",
                             rnd.choice(["n1", "n2"]), rnd.randrange(len(PORT_SETS))))
    elif what == "policy":
        spec["policies"] ^= {rnd.randrange(len(WORLD_POLICIES))}
    else:
        k = rnd.randrange(len(spec["pods"]))
        ns, app, ip, node, ports = spec["pods"][k]
        if what == "remove":
            del spec["pods"][k]
        elif what == "relabel":
            spec["pods"][k] = (ns, rnd.choice("abc"), ip, node, ports)
        else:
            spec["pods"][k] = (ns, app, ip, node, rnd.randrange(len(PORT_SETS)))
    return spec


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 25))
def test_the_cache_never_changes_a_resolution(seed, steps):
    """One resolver across a run of small changes to a cluster gives, at every step, exactly the
    entries of a resolver without a cache: each policy is resolved again whenever what it reads
    changed."""
    import random
    rnd = random.Random(seed)
    spec = {"ns": {"x": "a", "y": "b", "z": None}, "policies": set(range(len(WORLD_POLICIES))),
            "pods": [("x", "a", "10.0.0.1", "n1", 1), ("x", "b", "10.0.0.2", "n2", 2),
                     ("y", "c", "10.0.1.3", "n2", 1), ("z", "b", "10.0.1.200", "n1", 0)]}
    r = Resolver()
    for _ in range(steps):
        world = world_inputs(spec)
        cached, fresh = r.resolve(world), resolve(world)
        assert cached.entries() == fresh.entries(), spec
        assert cached.prefix_entries() == fresh.prefix_entries(), spec
        spec = changed(spec, rnd)


def test_a_new_label_set_resolves_again_only_the_policies_that_can_see_it():
    """A segment that comes in namespace y resolves again y's policies and those whose
    namespaceSelector takes y in, not a policy of x that selects in x alone."""
    r = Resolver()
    own = pol("own", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]})
    sees_y = pol("sees-y", {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]})
    in_y = pol("in-y", {"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}, ns="y")
    r.resolve(inputs(own, sees_y, in_y))
    assert r.last_resolved == 3
    more = inputs(own, sees_y, in_y)
    more.pods.append(PodInfo("y", "d", (("app", "d"),), "default", 1, 303, (ipaddress.ip_address("10.0.1.4"),), "n1"))
    r.resolve(more)
    assert r.last_resolved == 2
    assert "x/own" in r._cache and r._cache["x/own"][1].key == "x/own"
