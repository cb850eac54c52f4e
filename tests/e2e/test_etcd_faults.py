"""Faults of the etcd store in a lab (``lace lab up --store etcd``): the leader killed during pod
churn, one node cut off from the other members, every member stopped; and node liveness (an
agent that dies shows its node NotReady once its lease runs out).

One lab for the module (its own, on etcd: the session's shared lab is on SQLite), the scenarios
in turn, each leaving the cluster whole again (every member running, every agent healthy) even
when it fails. Everything waits on conditions, never a fixed sleep; a partition is nft rules
inside the node's own namespace (dropping etcd's ports on every interface but ``lo``), never
anything in the root namespace.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from lace.lab import etcd as lab_etcd
from lace.lab import procs, topology
from lace.store.config import lab_store
from lace.store.etcd import wait_ready

from .conftest import NETCHECK, LabHandle, ips, leftovers, namespace, pod, wait_for

PARTITIONED = "worker-3"
#: how long every member stays down in the outage scenario (see its docstring)
OUTAGE_SECONDS = 20.0
#: the agents' liveness TTL (lace.agent.liveness.DEFAULT_TTL): a lost node shows NotReady within it
TTL = 10.0


@pytest.fixture(scope="module")
def flab() -> Iterator[LabHandle]:
    name = f"ef{os.getpid() % 10000}"
    state = tempfile.mkdtemp(prefix="lace-e2e-etcdf-")
    handle = LabHandle(name, state)
    try:
        handle.lace("lab", "up", "--name", name, "--nodes", "3", "--store", "etcd")
        yield handle
    finally:
        handle.lace("lab", "down", "--name", name, check=False)
        left = leftovers(name, handle.dir)
        subprocess.run(["rm", "-rf", state])
        assert not left, f"lab down left {left}"


@pytest.fixture
def ns(flab: LabHandle) -> Iterator[str]:
    name = f"f-{uuid.uuid4().hex[:8]}"
    flab.apply([namespace(name)])
    yield name
    flab.lace("delete", "namespace", name, check=False)


# ---- helpers -------------------------------------------------------------------------------------

def _members(lab: LabHandle) -> dict[str, str]:
    """Each member's client endpoint (HOST:PORT) -> the node it runs on."""
    config = lab_store(lab.dir)
    nodes = {n["underlay"]: n["name"] for n in lab.status()["nodes"]}
    return {e: nodes[e.rsplit(":", 1)[0].strip("[]")] for e in config.endpoints}


def _start_members(lab: LabHandle, nodes: list[str]) -> None:
    """Start the members of ``nodes`` that are not running, and wait for a healthy cluster."""
    running = {p.name for p in procs.list_procs(lab.dir) if p.alive}
    topo = topology.load(lab.name, state_dir=lab.dir)
    for node in nodes:
        if lab_etcd.proc_name(node) not in running:
            lab_etcd.start_member(topo, lab.dir, node)
    config = lab_store(lab.dir)
    wait_ready(config.endpoints, netns=config.netns, timeout=60)


@contextmanager
def members_whole(lab: LabHandle) -> Iterator[None]:
    """Whatever the block does to the members, all three run again afterwards."""
    try:
        yield
    finally:
        _start_members(lab, list(_members(lab).values()))


def _status(lab: LabHandle, *nodes: str) -> dict:
    argv = ["status", "-o", "json", "--timeout", "30"]
    for n in nodes:
        argv += ["--node", n]
    _, out, _ = lab.lace(*argv, check=False)
    return json.loads(out)


def _liveness_sub(doc: dict, node: str) -> dict | None:
    report = (doc.get("nodes") or {}).get(node)
    if report is None:
        return None
    return next((s for s in report["subsystems"] if s["name"] == "liveness"), None)


def _degraded(lab: LabHandle, node: str) -> dict | None:
    sub = _liveness_sub(_status(lab, node), node)
    return sub if sub is not None and sub.get("degraded") else None


def _ready(lab: LabHandle, node: str) -> str:
    _, out, _ = lab.lace("get", "nodes", node, "-o", "json")
    cond = next(c for c in json.loads(out)["status"]["conditions"] if c["type"] == "Ready")
    return cond["status"]


def _all_healthy(lab: LabHandle, timeout: float = 90) -> None:
    rc, out, err = lab.lace("status", "--wait", "--timeout", str(timeout), check=False)
    assert rc == 0, f"the agents did not all become healthy again:\n{out}\n{err}"


def _segment_ips(lab: LabHandle, node: str) -> str:
    """The text of ``node``'s segment map (every pod address of the cluster has an entry), numeric:
    a partitioned node cannot reach the store to name things."""
    rc, out, err = lab.lace("exec", "--node", node, "--", "node", "bpf", "show", "segment", "-n", "-o", "json",
                            check=False)
    assert rc == 0, err
    return out


@contextmanager
def held_stream(lab: LabHandle, client: str, server_ip: str, seconds: float) -> Iterator[dict]:
    """One TCP connection from ``client`` kept busy for ``seconds`` (netcheck hold) in the
    background; the block's caller checks ``result["rc"] == 0`` after the block."""
    result: dict = {}

    def stream() -> None:
        result["rc"], result["out"] = lab.exec(client, *NETCHECK, "hold", server_ip, "80", str(seconds),
                                               "--timeout", "5")

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    try:
        yield result
    finally:
        t.join(timeout=seconds + 30)


def _lace_retrying(lab: LabHandle, *argv: str, timeout: float = 30) -> None:
    """A CLI call retried while the store is unavailable or a write lost its race (exit 5 or 4):
    what a user (or a controller) does while etcd elects a leader."""
    deadline = time.monotonic() + timeout
    while True:
        rc, out, err = lab.lace(*argv, check=False)
        if rc == 0:
            return
        assert rc in (4, 5) and time.monotonic() < deadline, f"lace {' '.join(argv)} -> {rc}\n{out}\n{err}"
        time.sleep(0.2)


# ---- the scenarios -------------------------------------------------------------------------------

def test_an_agent_that_dies_shows_its_node_not_ready_after_its_ttl(flab: LabHandle):
    assert {n: _ready(flab, n) for n in ("worker-1", "worker-2", "worker-3")} == {
        "worker-1": "True", "worker-2": "True", "worker-3": "True"}
    assert procs.kill("agent-worker-2", flab.dir, signal.SIGKILL)
    try:
        killed = time.monotonic()
        wait_for(lambda: _ready(flab, "worker-2") == "Unknown", "worker-2 to show NotReady", TTL + 10, 0.2)
        assert time.monotonic() - killed > TTL / 3, "NotReady only once the lease ran out"
        _, table, _ = flab.lace("get", "nodes")
        assert any(line.split()[:2] == ["worker-2", "NotReady"] for line in table.splitlines()), table
        rc, out, _ = flab.lace("status", check=False)
        assert rc == 1 and "worker-2 did not answer" in out and "liveness record expired" in out, out
    finally:
        flab.lace("lab", "restart-agent", "worker-2")
    wait_for(lambda: _ready(flab, "worker-2") == "True", "worker-2 to be Ready again", 30, 0.2)


def test_killing_the_leader_during_pod_churn_loses_no_pod_and_allocates_nothing_twice(flab: LabHandle, ns: str):
    nodes = ["worker-1", "worker-2", "worker-3"]
    kept: set[str] = set()
    deleted: set[str] = set()
    errors: list[str] = []
    stop = threading.Event()

    def churn() -> None:
        i = 0
        try:
            while not stop.is_set() or i < 12:
                name = f"churn-{i}"
                _lace_retrying(flab, "apply", "-f", _manifest(pod(name, ns, nodes[i % 3])))
                kept.add(name)
                if i % 3 == 2:                          # every third pod goes again
                    victim = f"churn-{i - 1}"
                    _lace_retrying(flab, "delete", "pod", victim, "-n", ns, "--ignore-not-found")
                    kept.discard(victim)
                    deleted.add(victim)
                i += 1
        except AssertionError as e:
            errors.append(str(e))

    with members_whole(flab):
        worker = threading.Thread(target=churn, daemon=True)
        worker.start()
        wait_for(lambda: len(kept) >= 4, "the churn to be under way", 60, 0.05)
        leader = wait_for(lambda: lab_etcd.leader(lab_store(flab.dir)), "etcd to report its leader", 10)
        node = _members(flab)[leader]
        assert procs.kill(lab_etcd.proc_name(node), flab.dir, signal.SIGKILL)
        killed_at = len(kept)
        # the churn goes on through the election, on the two members left
        wait_for(lambda: len(kept) >= killed_at + 4 or errors, "the churn to go on after the kill", 60, 0.1)
        stop.set()
        worker.join(timeout=120)
        assert not errors, errors[0]
        new_leader = wait_for(lambda: lab_etcd.leader(lab_store(flab.dir)), "a new leader", 20)
        assert new_leader != leader
    # every pod that was kept runs, every deleted one is gone
    pods = flab.wait(ns, sorted(kept), timeout=90)
    for name in deleted:
        flab.wait_gone(ns, name, timeout=60)
    # nothing was allocated twice: leases, their addresses, blocks
    _, out, _ = flab.lace("get", "ipleases", "-o", "json")
    leases = json.loads(out)["items"]
    addrs = [(x["spec"]["network"], x["spec"]["ip"]) for x in leases]
    assert len(addrs) == len(set(addrs)), "an address leased twice"
    _, out, _ = flab.lace("get", "ipblocks", "-o", "json")
    blocks = [(b["spec"]["network"], ipaddress.ip_network(b["spec"]["cidr"])) for b in json.loads(out)["items"]]
    for i, (net_a, a) in enumerate(blocks):
        for net_b, b in blocks[i + 1:]:
            assert net_a != net_b or a.version != b.version or not a.overlaps(b), f"blocks {a} and {b} overlap"
    pod_ips = [ip for p in pods.values() if p["metadata"]["name"] in kept for ip in ips(p) if ip]
    assert len(pod_ips) == len(set(pod_ips)), "two pods with one address"
    leased = {ip for _, ip in addrs}
    assert set(pod_ips) <= leased, "a running pod's address has no lease"
    # and the agents reconnected and resynced
    _all_healthy(flab)


def test_a_partitioned_node_degrades_keeps_forwarding_and_catches_up(flab: LabHandle, ns: str):
    flab.apply([pod("p1", ns, "worker-1"), pod("p2", ns, "worker-2"), pod("p3", ns, PARTITIONED)])
    pods = flab.wait(ns, ["p1", "p2", "p3"])
    p1, p2 = ips(pods["p1"])[0], ips(pods["p2"])[0]
    assert p2 in _segment_ips(flab, PARTITIONED)
    node_ns = flab.node(PARTITIONED)["netns"]
    table = f"lace_partition_{uuid.uuid4().hex[:6]}"
    rules = f"""table inet {table} {{
      chain input {{
        type filter hook input priority -10; policy accept;
        iifname != "lo" tcp dport {{ 2379, 2380 }} drop
        iifname != "lo" tcp sport {{ 2379, 2380 }} drop
      }}
      chain output {{
        type filter hook output priority -10; policy accept;
        oifname != "lo" tcp dport {{ 2379, 2380 }} drop
        oifname != "lo" tcp sport {{ 2379, 2380 }} drop
      }}
    }}
    """
    cut = TTL * 2 + 25
    with held_stream(flab, f"{ns}/p3", p1, cut) as stream:
        wait_for(lambda: "out" in stream or _established(flab, f"{ns}/p3"), "the stream to start", 10, 0.05)
        subprocess.run(["ip", "netns", "exec", node_ns, "nft", "-f", "-"], input=rules, text=True, check=True)
        try:
            # the node sees the store go, and the others see the node go
            sub = wait_for(lambda: _degraded(flab, PARTITIONED), f"{PARTITIONED} to report degraded", 40, 0.5)
            assert "store unavailable" in sub["reason"], sub
            wait_for(lambda: _ready(flab, PARTITIONED) == "Unknown", f"{PARTITIONED} to show NotReady", 30, 0.5)
            rc, out, _ = flab.lace("status", check=False)
            assert rc == 1 and f"{PARTITIONED}: " in out and "degraded: store unavailable" in out, out
            # it forwards on what it has: new flows between programmed pods, both ways
            for client, ip in ((f"{ns}/p3", p1), (f"{ns}/p1", ips(pods["p3"])[0])):
                ok, out = flab.check(client, "tcp", ip, 80)
                assert ok, f"{client} -> {ip} during the partition: {out}"
            # the cluster changes meanwhile: one pod comes, then one goes (in that order, so the
            # new one cannot reuse the gone one's address)
            flab.apply([pod("p4", ns, "worker-2")])
            p4 = ips(flab.wait(ns, ["p4"])["p4"])[0]
            flab.lace("delete", "pod", "p2", "-n", ns)
            flab.wait_gone(ns, "p2")
            assert p4 not in _segment_ips(flab, PARTITIONED), "the partition is not one"
        finally:
            subprocess.run(["ip", "netns", "exec", node_ns, "nft", "delete", "table", "inet", table],
                           capture_output=True)
        # healed: it catches up — the change reached its maps, nothing stale is left
        wait_for(lambda: not _degraded(flab, PARTITIONED), f"{PARTITIONED} to recover", 60, 0.5)
        wait_for(lambda: p4 in (text := _segment_ips(flab, PARTITIONED)) and p2 not in text,
                 f"{PARTITIONED}'s maps to catch up", 30, 0.5)
        wait_for(lambda: _ready(flab, PARTITIONED) == "True", f"{PARTITIONED} Ready again", 30, 0.5)
    assert stream.get("rc") == 0, f"the established stream broke: {stream}"
    _all_healthy(flab)
    rc, out, err = flab.lace("verify", check=False)
    assert rc == 0, f"lace verify after the partition:\n{out}\n{err}"
    ok, out = flab.check(f"{ns}/p3", "tcp", p4, 80)
    assert ok, out


def test_every_member_stopped_the_datapath_forwards_and_the_agents_recover(flab: LabHandle, ns: str):
    """All three members stopped for OUTAGE_SECONDS (20 s), not the issue's minute: 20 s is
    twice the agents' liveness TTL, so every lease runs out and every agent is seen degraded,
    and nothing in the agents depends on how long the outage lasts beyond that — a minute would
    add 40 s to a file that must stay under four minutes and prove nothing more."""
    flab.apply([pod("a", ns, "worker-1"), pod("b", ns, "worker-2"), pod("c", ns, "worker-3")])
    pods = flab.wait(ns, ["a", "b", "c"])
    a, b, c = (ips(pods[n])[0] for n in ("a", "b", "c"))
    members = list(_members(flab).values())
    with members_whole(flab), held_stream(flab, f"{ns}/a", b, OUTAGE_SECONDS + 15) as stream:
        wait_for(lambda: "out" in stream or _established(flab, f"{ns}/a"), "the stream to start", 10, 0.05)
        for node in members:
            assert procs.stop(lab_etcd.proc_name(node), flab.dir)
        stopped = time.monotonic()
        for node in ("worker-1", "worker-2", "worker-3"):
            sub = wait_for(lambda: _degraded(flab, node), f"{node} to report degraded", 30, 0.5)
            assert "store unavailable" in sub["reason"], sub
        # new flows on programmed state, between nodes and both ways
        for client, ip in ((f"{ns}/a", c), (f"{ns}/c", b), (f"{ns}/b", a)):
            ok, out = flab.check(client, "tcp", ip, 80)
            assert ok, f"{client} -> {ip} with etcd down: {out}"
        wait_for(lambda: time.monotonic() - stopped >= OUTAGE_SECONDS, "the outage to last", OUTAGE_SECONDS + 5, 0.5)
        _start_members(flab, members)
    assert stream.get("rc") == 0, f"the established stream broke: {stream}"
    _all_healthy(flab)
    for node in ("worker-1", "worker-2", "worker-3"):
        wait_for(lambda: _ready(flab, node) == "True", f"{node} Ready again", 30, 0.5)
    # and the cluster works again: a new pod comes up and is reached
    flab.apply([pod("d", ns, "worker-3")])
    d = ips(flab.wait(ns, ["d"])["d"])[0]
    ok, out = flab.check(f"{ns}/a", "tcp", d, 80)
    assert ok, out


# ---- small helpers -------------------------------------------------------------------------------

def _manifest(doc: dict) -> str:
    import yaml
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, prefix="lace-churn-")
    with f:
        yaml.safe_dump(doc, f)
    _manifests.append(f.name)
    return f.name


_manifests: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def _remove_manifests() -> Iterator[None]:
    yield
    for path in _manifests:
        try:
            os.unlink(path)
        except OSError:
            pass


def _established(lab: LabHandle, client: str) -> bool:
    """Whether ``client`` (ns/pod) has a TCP connection to a port 80 established: a held stream
    is under way."""
    rc, out = lab.exec(client, "ss", "-Htn", "state", "established", "( dport = :80 )")
    return rc == 0 and bool(out.strip())
