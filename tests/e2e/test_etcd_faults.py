"""Faults of the etcd store in a lab (``lace lab up --store etcd``): the leader killed during pod
churn, one node cut off from the other members, every member stopped; and node liveness (an
agent that dies shows its node NotReady once its lease runs out).

The session's etcd lab (``etcd_lab`` in conftest, shared with ``test_lab_etcd.py``; the shared
SQLite lab is another), the scenarios in turn, each leaving the cluster whole again (every member
running, every agent healthy) even when it fails. Everything waits on conditions, never a fixed
sleep; an established stream is held open-ended and ended by the test, so it cannot end on its own
before the fault is over; a partition is nft rules inside the node's own namespace (dropping
etcd's ports on every interface but ``lo``), never anything in the root namespace.
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
from lace.lab import procs
from lace.store.config import lab_store

from .conftest import NETCHECK, LabHandle, ips, liveness_of, pod, start_etcd_members, status_doc, wait_for

PARTITIONED = "worker-3"
#: how long every member stays down in the outage scenario (see its docstring)
OUTAGE_SECONDS = 60.0
#: the agents' liveness TTL (lace.agent.liveness.DEFAULT_TTL): a lost node shows NotReady within it
TTL = 10.0


pytestmark = pytest.mark.etcd_fault


# ---- helpers -------------------------------------------------------------------------------------

def _members(lab: LabHandle) -> dict[str, str]:
    """Each member's client endpoint (HOST:PORT) -> the node it runs on."""
    config = lab_store(lab.dir)
    nodes = {n["underlay"]: n["name"] for n in lab.status()["nodes"]}
    return {e: nodes[e.rsplit(":", 1)[0].strip("[]")] for e in config.endpoints}


@contextmanager
def members_whole(lab: LabHandle) -> Iterator[None]:
    """Whatever the block does to the members, all three run again afterwards."""
    try:
        yield
    finally:
        start_etcd_members(lab, list(_members(lab).values()))


def _degraded(lab: LabHandle, node: str) -> dict | None:
    sub = liveness_of(status_doc(lab, node), node)
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


class HeldStream:
    """One TCP connection from ``client`` (ns/pod) to ``server_ip`` port 80 kept busy (netcheck
    hold) in the background until the test ends it: open-ended, so it cannot end on its own while
    the test still counts on it; ``netcheck hold`` exits at once if the connection breaks."""

    #: far longer than any test holds it; the fraction tells this stream's process from others
    SECONDS = 3600

    def __init__(self, lab: LabHandle, client: str, server_ip: str) -> None:
        self.lab, self.client, self.server_ip = lab, client, server_ip
        self.seconds = f"{self.SECONDS}.{uuid.uuid4().int % 10**6:06d}"
        self.result: dict = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.result["rc"], self.result["out"] = self.lab.exec(
            self.client, *NETCHECK, "hold", self.server_ip, "80", self.seconds, "--timeout", "5")

    def start(self) -> None:
        self._thread.start()
        wait_for(lambda: not self.open() or _established(self.lab, self.client), "the stream to start", 10, 0.05)
        assert self.open(), f"the stream did not start: {self.result}"

    def open(self) -> bool:
        """Whether the stream still runs: it has not broken (nor ended)."""
        return self._thread.is_alive()

    def _pids(self) -> list[int]:
        """The netcheck process of this stream (a child of this test process)."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"lace.lab.netcheck" in argv and self.seconds.encode() in argv:
                found.append(int(pid))
        return found

    def stop(self) -> None:
        """End the stream (SIGTERM to its netcheck) and wait for its thread."""
        deadline = time.monotonic() + 10
        while self._thread.is_alive() and time.monotonic() < deadline:
            for pid in self._pids():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            self._thread.join(timeout=0.2)
        assert not self._thread.is_alive(), f"the held stream from {self.client} did not end"


@contextmanager
def held_stream(lab: LabHandle, client: str, server_ip: str) -> Iterator[HeldStream]:
    """A HeldStream, started (established) before the block and ended after it, even when it fails.
    The block asserts ``stream.open()`` where the stream must have survived."""
    stream = HeldStream(lab, client, server_ip)
    try:
        stream.start()
        yield stream
    finally:
        stream.stop()


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

def test_an_agent_that_dies_shows_its_node_not_ready_after_its_ttl(etcd_lab: LabHandle):
    assert {n: _ready(etcd_lab, n) for n in ("worker-1", "worker-2", "worker-3")} == {
        "worker-1": "True", "worker-2": "True", "worker-3": "True"}
    assert procs.kill("agent-worker-2", etcd_lab.dir, signal.SIGKILL)
    try:
        killed = time.monotonic()
        wait_for(lambda: _ready(etcd_lab, "worker-2") == "Unknown", "worker-2 to show NotReady", TTL + 10, 0.2)
        assert time.monotonic() - killed > TTL / 3, "NotReady only once the lease ran out"
        _, table, _ = etcd_lab.lace("get", "nodes")
        assert any(line.split()[:2] == ["worker-2", "NotReady"] for line in table.splitlines()), table
        rc, out, _ = etcd_lab.lace("status", check=False)
        assert rc == 1 and "worker-2 did not answer" in out and "liveness record expired" in out, out
    finally:
        etcd_lab.lace("lab", "restart-agent", "worker-2")
    wait_for(lambda: _ready(etcd_lab, "worker-2") == "True", "worker-2 to be Ready again", 30, 0.2)


def test_killing_the_leader_during_pod_churn_loses_no_pod_and_allocates_nothing_twice(etcd_lab: LabHandle, ns: str):
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
                _lace_retrying(etcd_lab, "apply", "-f", _manifest(pod(name, ns, nodes[i % 3])))
                kept.add(name)
                if i % 3 == 2:                          # every third pod goes again
                    victim = f"churn-{i - 1}"
                    _lace_retrying(etcd_lab, "delete", "pod", victim, "-n", ns, "--ignore-not-found")
                    kept.discard(victim)
                    deleted.add(victim)
                i += 1
        except AssertionError as e:
            errors.append(str(e))

    with members_whole(etcd_lab):
        worker = threading.Thread(target=churn, daemon=True)
        worker.start()
        try:
            wait_for(lambda: len(kept) >= 4 or errors, "the churn to be under way", 60, 0.05)
            assert not errors, errors[0]
            leader = wait_for(lambda: lab_etcd.leader(lab_store(etcd_lab.dir)), "etcd to report its leader", 10)
            node = _members(etcd_lab)[leader]
            assert procs.kill(lab_etcd.proc_name(node), etcd_lab.dir, signal.SIGKILL)
            killed_at = len(kept)
            # the churn goes on through the election, on the two members left
            wait_for(lambda: len(kept) >= killed_at + 4 or errors, "the churn to go on after the kill", 60, 0.1)
        finally:
            # the churn ends (even when the test fails) before anything reads what it did
            stop.set()
            worker.join(timeout=120)
            assert not worker.is_alive(), "the churn did not end within 120 s"
        assert not errors, errors[0]
        new_leader = wait_for(lambda: lab_etcd.leader(lab_store(etcd_lab.dir)), "a new leader", 20)
        assert new_leader != leader
    # every pod that was kept runs, every deleted one is gone, and nothing else is there
    etcd_lab.wait(ns, sorted(kept), timeout=90)
    for name in deleted:
        etcd_lab.wait_gone(ns, name, timeout=60)
    pods = etcd_lab.pods(ns)
    assert set(pods) == kept, f"pods of {ns}: {sorted(pods)}, kept: {sorted(kept)}"
    pod_ips = [(f"{ns}/{name}", a["ip"]) for name, p in pods.items() for a in p["status"]["podIPs"]]
    assert len({ip for _, ip in pod_ips}) == len(pod_ips), f"two pods with one address: {pod_ips}"
    # the leases agree with the pods (what a lost or doubly applied write during the election
    # would break): every lease of the namespace names an existing pod that holds its address, and
    # every pod address has its lease. A deleted pod's lease goes after the pod (the CNI DEL), so
    # this gives them a while to agree.
    deadline = time.monotonic() + 30
    while (mismatch := _lease_mismatch(etcd_lab, ns, pod_ips)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert mismatch is None, mismatch
    # no block was given twice
    _, out, _ = etcd_lab.lace("get", "ipblocks", "-o", "json")
    blocks = [(b["spec"]["network"], ipaddress.ip_network(b["spec"]["cidr"])) for b in json.loads(out)["items"]]
    for i, (net_a, a) in enumerate(blocks):
        for net_b, b in blocks[i + 1:]:
            assert net_a != net_b or a.version != b.version or not a.overlaps(b), f"blocks {a} and {b} overlap"
    # and the agents reconnected and resynced
    _all_healthy(etcd_lab)


def _leases(lab: LabHandle, ns: str) -> list[tuple[str, str]]:
    """(pod, ip) of every IPLease held by a pod of ``ns``."""
    _, out, _ = lab.lace("get", "ipleases", "-o", "json")
    return [(x["spec"]["pod"], x["spec"]["ip"]) for x in json.loads(out)["items"]
            if x["spec"]["pod"].startswith(f"{ns}/")]


def _lease_mismatch(lab: LabHandle, ns: str, pod_ips: list[tuple[str, str]]) -> str | None:
    """What differs between the IPLeases of ``ns`` and its pods' addresses, or None."""
    leases = _leases(lab, ns)
    orphans = sorted(set(leases) - set(pod_ips))
    missing = sorted(set(pod_ips) - set(leases))
    if orphans or missing or len(leases) != len(pod_ips):
        return (f"{len(leases)} leases for {len(pod_ips)} pod addresses; leases without their pod or address: "
                f"{orphans}; pod addresses without a lease: {missing}")
    return None


def test_a_partitioned_node_degrades_keeps_forwarding_and_catches_up(etcd_lab: LabHandle, ns: str):
    etcd_lab.apply([pod("p1", ns, "worker-1"), pod("p2", ns, "worker-2"), pod("p3", ns, PARTITIONED)])
    pods = etcd_lab.wait(ns, ["p1", "p2", "p3"])
    p1, p2 = ips(pods["p1"])[0], ips(pods["p2"])[0]
    assert p2 in _segment_ips(etcd_lab, PARTITIONED)
    node_ns = etcd_lab.node(PARTITIONED)["netns"]
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
    with held_stream(etcd_lab, f"{ns}/p3", p1) as stream:
        subprocess.run(["ip", "netns", "exec", node_ns, "nft", "-f", "-"], input=rules, text=True, check=True)
        try:
            # the node sees the store go, and the others see the node go
            sub = wait_for(lambda: _degraded(etcd_lab, PARTITIONED), f"{PARTITIONED} to report degraded", 40, 0.5)
            assert "store unavailable" in sub["reason"], sub
            wait_for(lambda: _ready(etcd_lab, PARTITIONED) == "Unknown", f"{PARTITIONED} to show NotReady", 30, 0.5)
            rc, out, _ = etcd_lab.lace("status", check=False)
            assert rc == 1 and f"{PARTITIONED}: " in out and "degraded: store unavailable" in out, out
            # it forwards on what it has: new flows between programmed pods, both ways
            for client, ip in ((f"{ns}/p3", p1), (f"{ns}/p1", ips(pods["p3"])[0])):
                ok, out = etcd_lab.check(client, "tcp", ip, 80)
                assert ok, f"{client} -> {ip} during the partition: {out}"
            # the cluster changes meanwhile: one pod comes, then one goes (in that order, so the
            # new one cannot reuse the gone one's address)
            etcd_lab.apply([pod("p4", ns, "worker-2")])
            p4 = ips(etcd_lab.wait(ns, ["p4"])["p4"])[0]
            etcd_lab.lace("delete", "pod", "p2", "-n", ns)
            etcd_lab.wait_gone(ns, "p2")
            assert p4 not in _segment_ips(etcd_lab, PARTITIONED), "the partition is not one"
        finally:
            open_through_partition = stream.open()
            subprocess.run(["ip", "netns", "exec", node_ns, "nft", "delete", "table", "inet", table],
                           capture_output=True)
        assert open_through_partition, f"the established stream broke during the partition: {stream.result}"
        # healed: it catches up — the change reached its maps, nothing stale is left
        wait_for(lambda: not _degraded(etcd_lab, PARTITIONED), f"{PARTITIONED} to recover", 60, 0.5)
        wait_for(lambda: p4 in (text := _segment_ips(etcd_lab, PARTITIONED)) and p2 not in text,
                 f"{PARTITIONED}'s maps to catch up", 30, 0.5)
        wait_for(lambda: _ready(etcd_lab, PARTITIONED) == "True", f"{PARTITIONED} Ready again", 30, 0.5)
        assert stream.open(), f"the established stream broke after the partition: {stream.result}"
    _all_healthy(etcd_lab)
    rc, out, err = etcd_lab.lace("verify", check=False)
    assert rc == 0, f"lace verify after the partition:\n{out}\n{err}"
    ok, out = etcd_lab.check(f"{ns}/p3", "tcp", p4, 80)
    assert ok, out


def test_every_member_stopped_the_datapath_forwards_and_the_agents_recover(etcd_lab: LabHandle, ns: str):
    """All three members stopped for OUTAGE_SECONDS (a minute): six times the agents' liveness
    TTL, so every lease runs out and every agent is seen degraded long before the members come
    back."""
    etcd_lab.apply([pod("a", ns, "worker-1"), pod("b", ns, "worker-2"), pod("c", ns, "worker-3")])
    pods = etcd_lab.wait(ns, ["a", "b", "c"])
    a, b, c = (ips(pods[n])[0] for n in ("a", "b", "c"))
    members = list(_members(etcd_lab).values())
    with members_whole(etcd_lab), held_stream(etcd_lab, f"{ns}/a", b) as stream:
        for node in members:
            assert procs.stop(lab_etcd.proc_name(node), etcd_lab.dir)
        stopped = time.monotonic()
        for node in ("worker-1", "worker-2", "worker-3"):
            sub = wait_for(lambda: _degraded(etcd_lab, node), f"{node} to report degraded", 30, 0.5)
            assert "store unavailable" in sub["reason"], sub
        # new flows on programmed state, between nodes and both ways
        for client, ip in ((f"{ns}/a", c), (f"{ns}/c", b), (f"{ns}/b", a)):
            ok, out = etcd_lab.check(client, "tcp", ip, 80)
            assert ok, f"{client} -> {ip} with etcd down: {out}"
        wait_for(lambda: time.monotonic() - stopped >= OUTAGE_SECONDS, "the outage to last", OUTAGE_SECONDS + 5, 0.5)
        start_etcd_members(etcd_lab, members)
        assert stream.open(), f"the established stream broke during the outage: {stream.result}"
    _all_healthy(etcd_lab)
    for node in ("worker-1", "worker-2", "worker-3"):
        wait_for(lambda: _ready(etcd_lab, node) == "True", f"{node} Ready again", 30, 0.5)
    # and the cluster works again: a new pod comes up and is reached
    etcd_lab.apply([pod("d", ns, "worker-3")])
    d = ips(etcd_lab.wait(ns, ["d"])["d"])[0]
    ok, out = etcd_lab.check(f"{ns}/a", "tcp", d, 80)
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
