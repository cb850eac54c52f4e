"""Incremental pod passes (lace.agent.podsync) against the full pass they stand in for.

A real store; the agent's cluster cache fed by the store's own watch; after every change, the
maps the incremental pass leaves must be exactly the ones a full pass computes from a fresh
snapshot, and the pass must decline (leaving the maps alone) whenever policy could see the change.
Pods of this node have interfaces (a stand-in for the namespace's link index: names, ifindexes,
MACs), so their endpoints' entries are checked too.
"""

from __future__ import annotations

import ipaddress
from types import SimpleNamespace

import pytest

from lace.agent.cluster import KINDS, ClusterCache
from lace.agent.desired import OWNED_MAPS, desired_maps
from lace.agent.diff import MapChanges
from lace.agent.model import ANN_LOCATOR, ANN_NODE_ID, ANN_UNDERLAY, probe_container_id, probe_pod
from lace.agent.podsync import PodSync
from lace.agent.state import build_snapshot
from lace.policy.program import PolicyProgrammer
from lace.datapath.segment import segment_key
from lace.store import SqliteStore
from lace.store import kinds as K

ME, FAR = "me", "far"


class Links:
    """The node namespace's interfaces as the snapshot reads them: the uplink and the host sides
    of the pod interfaces the test made."""

    def __init__(self) -> None:
        self.links = {"eth0": SimpleNamespace(ifindex=2, mac="02:00:00:00:00:02", name="eth0")}

    def add(self, name: str) -> None:
        n = len(self.links) + 10
        self.links[name] = SimpleNamespace(ifindex=n, mac=f"02:00:00:00:01:{n:02x}", name=name)

    def refresh(self, full: bool = False) -> dict:
        return dict(self.links)


class Maps:
    """The agent's record of the maps it wrote, with NodeDatapath's held and apply."""

    def __init__(self, entries: dict[str, dict[bytes, bytes]]) -> None:
        self.entries = {n: dict(e) for n, e in entries.items()}
        self.writes = 0

    def held(self, name: str, keys) -> dict[bytes, bytes]:
        return {k: self.entries[name][k] for k in keys if k in self.entries[name]}

    def apply(self, changes: dict[str, MapChanges], order: tuple[str, ...]) -> None:
        for name, ch in changes.items():
            self.entries[name].update(ch.updates)
            for k in ch.deletes:
                del self.entries[name][k]
            self.writes += len(ch.updates) + len(ch.deletes)


def node(name: str, nid: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {
        ANN_LOCATOR: f"fd5e:c000:{nid:x}::/48", ANN_UNDERLAY: f"fd5e:ff::{nid:x}", ANN_NODE_ID: str(nid)}}}


def pod(name: str, app: str, on: str = FAR, ports: tuple = (), probe: int | None = None,
        network: str | None = None) -> dict:
    container: dict = {"name": "c", "image": "x", "ports": [{"name": n, "containerPort": p} for n, p in ports]}
    if probe is not None:
        container["readinessProbe"] = {"tcpSocket": {"port": probe}}
    meta: dict = {"name": name, "namespace": "default", "labels": {"app": app}}
    if network is not None:
        meta["annotations"] = {K.NETWORK_ANNOTATION: network}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": on, "containers": [container]}}


class Cluster:
    """A store, the agent's caches over it, a full pass's maps, and the watch between them."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.apply_all([{"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "default"},
                          "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS)}}, node(ME, 1), node(FAR, 2)])
        self.blocks = {n: ipaddress.ip_network(store.allocate_block("default", n, 4, 24)) for n in (ME, FAR)}
        self.links = Links()
        #: the upper half of the other node's block is an ipBlock of the policy
        self.ipblock = list(self.blocks[FAR].subnets(1))[1]
        self.next_ip = {n: 2 for n in (ME, FAR)}
        store.apply({"apiVersion": K.NETWORKING_API_VERSION, "kind": "NetworkPolicy",
                     "metadata": {"name": "outside", "namespace": "default"},
                     "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [
                         {"from": [{"ipBlock": {"cidr": str(self.ipblock)}}]},
                         {"from": [{"podSelector": {}}], "ports": [{"port": "http"}]}]}})
        for name, app in (("web-1", "web"), ("web-2", "web"), ("db-1", "db"), ("db-2", "db")):
            self.add_pod(pod(name, app, ports=(("http", 8080),) if app == "web" else ()))
        self.add_pod(pod("local", "web", on=ME, ports=(("http", 8080),)), host="lxlocal")
        for labels in ({"app": "web"}, {"app": "db"}, {"app": "cache"}):
            store.allocate_segment("default", "default", labels)
        self.cluster = ClusterCache.listed(store, node=ME)   # as the agent of ME keeps it
        self.since = store.revision()
        #: the agent's policy programmer: its full passes' resolution serves incremental ones
        self.policy = PolicyProgrammer(ME)
        self.maps = Maps(self.full())   # the first pass allocates the ipBlock's segment: a full pass
        self.sync = PodSync(ME, self.cluster, self.maps, OWNED_MAPS, self.links, self.policy)
        assert not self.watch()
        self.full_pass()

    def add_pod(self, obj: dict, ip: ipaddress.IPv4Address | None = None, host: str | None = None,
                network: str = "default", block: ipaddress.IPv4Network | None = None,
                probe_ip: ipaddress.IPv4Address | None = None) -> ipaddress.IPv4Address:
        """The pod and its lease, as the allocator writes them; ``host``: the host side of its
        interface (annotated on the lease, and made in the link index); ``probe_ip``: a probe
        address leased for it in the default network."""
        n = obj["spec"]["nodeName"]
        block = block or self.blocks[n]
        if ip is None:
            ip = block.network_address + self.next_ip[n]
            self.next_ip[n] += 1
        name = obj["metadata"]["name"]
        ref = f"default/{name}"
        lease = {"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
                 "metadata": {"name": K.lease_name(network, str(ip)), "labels": {K.NODE_LABEL: n}},
                 "spec": {"network": network, "node": n, "block": K.block_name(network, str(block)),
                          "ip": str(ip), "pod": ref, "containerID": f"c-{name}", "ifname": "eth0"}}
        objs = [obj, lease]
        if host is not None:
            lease["metadata"]["annotations"] = {K.HOST_IFNAME_ANNOTATION: host,
                                                K.POD_MAC_ANNOTATION: f"02:00:00:00:02:{ip.packed[-1]:02x}"}
            self.links.add(host)
        if probe_ip is not None:
            objs.append({"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
                         "metadata": {"name": K.lease_name("default", str(probe_ip)), "labels": {K.NODE_LABEL: n}},
                         "spec": {"network": "default", "node": n, "ip": str(probe_ip), "pod": probe_pod(ref),
                                  "block": K.block_name("default", str(self.blocks[n])),
                                  "containerID": probe_container_id(f"c-{name}"), "ifname": "probe"}})
        self.store.apply_all(objs)
        return ip

    def delete_pod(self, name: str, ip: ipaddress.IPv4Address) -> None:
        self.store.delete("pods", name, "default")
        self.store.delete("ipleases", K.lease_name("default", str(ip)))

    def snapshot(self):
        return build_snapshot(self.store, ME, "eth0", 1500, links=self.links, cluster=self.cluster)  # type: ignore[arg-type]

    def full(self) -> dict[bytes, bytes]:
        """A full pass's maps from a fresh snapshot, with fresh programmers (nothing cached)."""
        return desired_maps(self.snapshot())   # type: ignore[return-value]

    def watch(self) -> bool:
        """Feed the watch's events since the last call to the caches; whether every one of them
        could take the incremental way."""
        until, handled = self.store.revision(), True
        if until == self.since:
            return True
        w = self.store.watch(list(KINDS), since=self.since, timeout=5)
        try:
            for ev in w:
                handled &= self.sync.event(ev, self.cluster.apply(ev))
                if int(ev.resource_version) >= until:
                    break
        finally:
            w.stop()
        self.since = until
        return handled

    def incremental(self) -> dict | None:
        """The incremental pass over what the watch noted, or None when it declines."""
        assert self.watch(), "every event was one an incremental pass may cover"
        return self.sync.sync(self.sync.take())

    def full_pass(self) -> None:
        """What the agent does when the incremental pass declines: a full pass, which also
        rebuilds what the check reads."""
        self.sync.take()
        snap = self.snapshot()
        self.maps = Maps(desired_maps(snap, self.policy))
        self.sync.datapath = self.maps
        self.sync.rebuilt(snap)


@pytest.fixture
def c(tmp_path) -> Cluster:
    store = SqliteStore(str(tmp_path / "store.db"))
    try:
        yield Cluster(store)
    finally:
        store.close()


def agrees(c: Cluster) -> None:
    full = c.full()
    for name in OWNED_MAPS:
        assert c.maps.entries[name] == full[name], name


def test_the_agents_cache_keeps_other_nodes_pod_leases_without_their_container_details(c):
    """A pod lease of another node keeps no container ID, host interface or MAC in the agent's
    cache; its own node's leases keep theirs; and a full pass makes the same maps from it as from
    a cache that keeps everything (an audit's)."""
    local = c.store.get("ipleases", K.lease_name("default", str(c.blocks[ME].network_address + 2)))
    local["metadata"]["annotations"] = {K.HOST_IFNAME_ANNOTATION: "lxlocal", K.POD_MAC_ANNOTATION: "02:00:00:00:00:09"}
    c.store.apply(local)
    mine = ClusterCache.listed(c.store, node=ME)
    leases = {r.pod: r for r in mine.items("ipleases")}
    assert leases["default/web-1"].container_id == "" and leases["default/web-1"].node == FAR
    assert leases["default/local"].container_id == "c-local"
    assert (leases["default/local"].host_ifname, leases["default/local"].pod_mac) == ("lxlocal", "02:00:00:00:00:09")
    everything = ClusterCache.listed(c.store)
    assert {r.pod: r.container_id for r in everything.items("ipleases")}["default/web-1"] == "c-web-1"
    snap = lambda cache: build_snapshot(c.store, ME, "eth0", 1500, links=c.links, cluster=cache)  # noqa: E731
    assert desired_maps(snap(mine)) == desired_maps(snap(everything))


def test_a_pod_of_another_node_with_a_known_identity_is_one_segment_entry_each_way(c):
    ip = c.add_pod(pod("web-3", "web", ports=(("http", 8080),)))
    work = c.incremental()
    assert work is not None and list(work["segment"].updates) == [segment_key(1, ip)] and not work["segment"].deletes
    agrees(c)
    c.delete_pod("web-3", ip)
    work = c.incremental()
    assert work is not None and work["segment"].deletes == [segment_key(1, ip)]
    agrees(c)


def test_a_relabel_between_segments_that_keep_their_pods_moves_the_entry(c):
    ip = c.add_pod(pod("db-3", "db"))
    assert c.incremental() is not None
    c.store.apply(pod("db-3", "web", ports=(("http", 8080),)))
    work = c.incremental()
    assert work is not None and list(work["segment"].updates) == [segment_key(1, ip)]
    agrees(c)


@pytest.mark.parametrize("why", ["first pod of a segment", "last pod of a segment", "new named port",
                                 "address in an ipBlock", "segment not allocated"])
def test_a_change_policy_could_see_is_left_to_a_full_pass(c, why):
    before = dict(c.maps.entries["segment"])
    if why == "first pod of a segment":
        c.add_pod(pod("cache-1", "cache"))
    elif why == "last pod of a segment":
        c.store.delete("pods", "db-1", "default")
        c.store.delete("pods", "db-2", "default")
    elif why == "new named port":
        c.add_pod(pod("web-3", "web", ports=(("http", 8080), ("admin", 9000))))
    elif why == "address in an ipBlock":
        c.add_pod(pod("web-3", "web", ports=(("http", 8080),)), ip=c.ipblock.network_address + 7)
    else:
        c.add_pod(pod("new-1", "never-seen"))
    assert c.incremental() is None
    assert c.maps.entries["segment"] == before, "a declined pass writes nothing"
    assert c.maps.entries["segment"] != c.full()["segment"], "the full pass has something to do"


LOCAL_MAPS = {"segment", "devices", "delivery", "delivery-exact", "veth"}


def test_a_pod_of_this_node_in_a_segment_it_has_is_its_endpoints_entries(c):
    """What a CNI ADD and DEL program: the pod's interface's entries and its address's segment
    entry (flagged local), the same as a full pass, and nothing of policy."""
    ip = c.add_pod(pod("local-2", "web", on=ME, ports=(("http", 8080),)), host="lxlocal2")
    work = c.incremental()
    assert work is not None and set(work) == LOCAL_MAPS
    assert all(len(ch.updates) == 1 and not ch.deletes for ch in work.values())
    assert list(work["segment"].updates) == [segment_key(1, ip)]
    agrees(c)
    assert {ep.pod for ep in c.sync.endpoints()} == {"default/local", "default/local-2"}
    c.delete_pod("local-2", ip)
    work = c.incremental()
    assert work is not None and set(work) == LOCAL_MAPS
    assert all(len(ch.deletes) == 1 and not ch.updates for ch in work.values())
    agrees(c)
    assert {ep.pod for ep in c.sync.endpoints()} == {"default/local"}


def test_an_interface_that_comes_after_its_lease_is_programmed_when_it_does(c):
    """The lease is written before ADD makes the interface: a pass then programs the address
    alone (not flagged local: no endpoint yet), and the next one the endpoint, as full passes
    would at each moment."""
    ip = c.add_pod(pod("local-2", "web", on=ME, ports=(("http", 8080),)))
    work = c.incremental()
    assert work is not None and set(work) == {"segment"}
    agrees(c)
    lease = c.store.get("ipleases", K.lease_name("default", str(ip)))
    lease["metadata"]["annotations"] = {K.HOST_IFNAME_ANNOTATION: "lxlocal2", K.POD_MAC_ANNOTATION: "02:00:00:00:02:09"}
    c.links.add("lxlocal2")
    c.store.apply(lease)
    work = c.incremental()
    assert work is not None and set(work) == LOCAL_MAPS and list(work["segment"].updates) == [segment_key(1, ip)]
    agrees(c)


def test_a_pod_of_this_node_with_probes_brings_its_probe_targets(c):
    ip = c.add_pod(pod("local-2", "web", on=ME, ports=(("http", 8080),), probe=8080), host="lxlocal2")
    work = c.incremental()
    assert work is not None and len(work["probes"].updates) == 1
    agrees(c)
    c.delete_pod("local-2", ip)
    work = c.incremental()
    assert work is not None and len(work["probes"].deletes) == 1
    agrees(c)


def test_a_pod_of_another_network_is_probed_through_its_probe_address(c):
    """A pod of another network has a probe address, leased apart from its own (to the pseudo-pod
    probe/<pod>): its lease's events count for the pod, and the pod's probe targets go through it."""
    c.store.apply({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": "blue"},
                   "spec": {"cidrs": ["10.77.0.0/16"]}})
    blue = ipaddress.ip_network(c.store.allocate_block("blue", ME, 4, 24))
    c.store.allocate_segment("blue", "default", {"app": "web"})
    c.add_pod(pod("blue-1", "web", on=ME, network="blue"), host="lxblue1", network="blue", block=blue)
    assert not c.watch()   # a new Network (and its segment's first pod): a full pass
    c.full_pass()
    probe_ip = c.blocks[ME].network_address + 200
    ip = c.add_pod(pod("blue-2", "web", on=ME, network="blue", probe=8080), host="lxblue2", network="blue",
                   block=blue, probe_ip=probe_ip)
    work = c.incremental()
    assert work is not None and len(work["probes"].updates) == 2   # the port, and the address's marker
    agrees(c)
    c.store.delete("ipleases", K.lease_name("default", str(probe_ip)))
    c.store.delete("pods", "blue-2", "default")
    c.store.delete("ipleases", K.lease_name("blue", str(ip)))
    work = c.incremental()
    assert work is not None and len(work["probes"].deletes) == 2
    agrees(c)


def select_db(c: Cluster) -> None:
    """A policy selecting db, whose pods are all on the other node (a full pass)."""
    c.store.apply({"apiVersion": K.NETWORKING_API_VERSION, "kind": "NetworkPolicy",
                   "metadata": {"name": "db", "namespace": "default"},
                   "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                         "ports": [{"port": 5432}]}]}})
    assert not c.watch()
    c.full_pass()


def test_a_segments_first_pod_on_this_node_brings_its_policy_entries(c):
    """The segments with pods on this node are the subjects its policy map holds entries for: a
    selected segment's first pod here brings its marker and allow entries (the full pass's
    resolution, assembled for the new subjects), its last one takes them, with the pod's own."""
    select_db(c)
    ip = c.add_pod(pod("db-3", "db", on=ME), host="lxdb3")
    work = c.incremental()
    assert work is not None and {"policy", "policy-exact"} & set(work), "the pass writes db's policy entries"
    assert not any(ch.deletes for ch in work.values())
    agrees(c)
    assert c.policy.pressure is not None and c.policy.pressure.dropped == 0
    ip2 = c.add_pod(pod("db-4", "db", on=ME), host="lxdb4")
    work = c.incremental()
    assert work is not None and not {"policy", "policy-exact"} & set(work), "a second local pod: nothing of policy"
    agrees(c)
    c.delete_pod("db-4", ip2)
    c.delete_pod("db-3", ip)
    work = c.incremental()
    assert work is not None and all(not ch.updates for ch in work.values())
    assert {"policy", "policy-exact"} & set(work), "the last local pod takes db's policy entries"
    agrees(c)


def test_the_last_local_pod_of_a_segment_with_ipblock_and_named_port_rules_takes_their_entries(c):
    """web, selected by a policy with an ipBlock and a named port, loses its only pod here."""
    c.store.delete("pods", "local", "default")
    work = c.incremental()
    pol = {n: work[n] for n in ("policy", "policy-exact") if n in work} if work is not None else {}
    assert pol and all(ch.deletes and not ch.updates for ch in pol.values())
    agrees(c)


def test_a_subject_change_after_an_audit_of_other_subjects_is_left_to_a_full_pass(c):
    """The policy entries of a subject change are the difference of two assemblies of one
    resolution; when the programmer's last assembly was for other subjects (an audit read a
    newer world), the pass cannot know what the maps hold and declines."""
    select_db(c)
    c.add_pod(pod("db-3", "db", on=ME), host="lxdb3")
    assert c.watch()
    desired_maps(c.snapshot(), c.policy)   # the agent's audit, with db-3 already in its snapshot
    before = {n: dict(e) for n, e in c.maps.entries.items()}
    assert c.sync.sync(c.sync.take()) is None
    assert c.maps.entries == before, "a declined pass writes nothing"


def test_a_named_port_of_a_local_pod_on_another_number_is_left_to_a_full_pass(c):
    before = {n: dict(e) for n, e in c.maps.entries.items()}
    c.add_pod(pod("local-2", "web", on=ME, ports=(("http", 8081),)), host="lxlocal2")   # http is 8081 too now
    assert c.incremental() is None
    assert c.maps.entries == before, "a declined pass writes nothing"
    full = c.full()
    assert any(c.maps.entries[n] != full[n] for n in ("policy", "policy-exact")), "the full pass has policy to write"


def test_a_declined_pass_leaves_what_it_checks_as_it_was(c):
    c.add_pod(pod("cache-1", "cache"))
    assert c.incremental() is None
    # the full pass the agent then makes rebuilds the check; the next pod goes the short way
    c.full_pass()
    ip = c.add_pod(pod("cache-2", "cache"))
    work = c.incremental()
    assert work is not None and list(work["segment"].updates) == [segment_key(1, ip)]
    agrees(c)


def test_what_passes_reuse_across_changes_is_what_a_fresh_cache_makes(c):
    """Full passes reuse the addresses and policy inputs of unchanged records: after adds,
    relabels and deletes, the kept cache's snapshot equals one made from the store afresh."""
    c.snapshot()
    ip = c.add_pod(pod("db-3", "db"))
    c.store.apply(pod("web-1", "db"))
    c.delete_pod("db-3", ip)
    c.store.delete("pods", "db-2", "default")
    policy = c.store.get("networkpolicies", "outside", "default")
    policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"] = "192.168.7.0/24"
    c.store.apply(policy)
    c.watch()
    kept = c.snapshot()
    fresh = build_snapshot(c.store, ME, "eth0", 1500, links=c.links)   # type: ignore[arg-type]
    assert kept.pods == fresh.pods and kept.policy.pods == fresh.policy.pods
    assert kept.policy.cidr_segments == fresh.policy.cidr_segments and "192.168.7.0/24" in kept.policy.cidr_segments
    assert desired_maps(kept) == desired_maps(fresh)
    assert kept.policy.pods and {p.name for p in kept.policy.pods if p.labels == (("app", "db"),)} == {"db-1", "web-1"}


def test_the_cache_lists_each_kind_in_order_as_keys_come_and_go(c):
    """A pass reads each kind in namespace/name order; the cache keeps that order between passes
    and must still give it after adds, a change and deletes (the store's own list is the reference)."""
    def names():
        return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in c.store.list("pods").items]

    def cached():
        return [p.key for p in c.cluster.items("pods")]

    c.snapshot()
    assert cached() == names()
    c.add_pod(pod("aa-0", "db"))
    c.add_pod(pod("zz-9", "db"))
    c.store.apply(pod("web-1", "cache"))
    c.store.delete("pods", "db-2", "default")
    c.watch()
    assert cached() == names() and "default/aa-0" in cached() and "default/db-2" not in cached()
