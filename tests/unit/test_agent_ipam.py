"""Per-node IPAM over a real store file: blocks, leases, reuse, release, exhaustion."""

from __future__ import annotations

import ipaddress

import pytest

from lace.agent.ipam import Ipam, IpamExhausted, block_prefixlen
from lace.store import SqliteStore


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "store.db")
    s.apply({"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": "tiny"},
             "spec": {"cidrs": ["10.99.0.0/29", "fd99::/125"]}})
    yield s
    s.close()


def test_block_sizes():
    assert block_prefixlen(ipaddress.ip_network("10.244.0.0/16")) == 24
    assert block_prefixlen(ipaddress.ip_network("10.10.0.0/24")) == 26
    assert block_prefixlen(ipaddress.ip_network("10.99.0.0/29")) == 29
    assert block_prefixlen(ipaddress.ip_network("fd00:10:244::/56")) == 112


def test_allocate_dual_stack_and_reuse(store):
    ipam = Ipam(store, "worker-1")
    cidrs = [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")]
    a = ipam.allocate("default", cidrs, "x/a", "c1", "eth0")
    assert sorted(l.ip.version for l in a) == [4, 6]
    again = ipam.allocate("default", cidrs, "x/a", "c1", "eth0")
    assert {l.ip for l in again} == {l.ip for l in a}, "the same container keeps its addresses"
    b = ipam.allocate("default", cidrs, "x/b", "c2", "eth0")
    assert not {l.ip for l in a} & {l.ip for l in b}
    other = Ipam(store, "worker-2").allocate("default", cidrs, "x/c", "c3", "eth0")
    v4 = next(l for l in other if l.ip.version == 4)
    w1_blocks = [ipaddress.ip_network(o["spec"]["cidr"]) for o in store.list("ipblocks").items
                 if o["spec"]["node"] == "worker-1"]
    assert w1_blocks and not any(v4.ip in b for b in w1_blocks), "nodes never share a block"


def test_exhaustion_names_network_node_and_usage(store):
    ipam = Ipam(store, "worker-1")
    cidrs = [ipaddress.ip_network("10.99.0.0/29")]
    got = [ipam.allocate("tiny", cidrs, f"x/p{i}", f"c{i}", "eth0") for i in range(6)]
    assert len({g[0].ip for g in got}) == 6
    with pytest.raises(IpamExhausted) as e:
        ipam.allocate("tiny", cidrs, "x/p9", "c9", "eth0")
    msg = str(e.value)
    assert '"tiny"' in msg and '"worker-1"' in msg and "6 of 6" in msg


def test_release_frees_the_address(store):
    ipam = Ipam(store, "worker-1")
    cidrs = [ipaddress.ip_network("10.99.0.0/29")]
    first = ipam.allocate("tiny", cidrs, "x/a", "c1", "eth0")[0].ip
    assert [o["spec"]["containerID"] for o in ipam.release("c1")] == ["c1"]
    assert ipam.allocate("tiny", cidrs, "x/b", "c2", "eth0")[0].ip == first
