#!/usr/bin/env python3
"""Scale: one real agent in a cluster of 10k pods, 1k services and 2k policies.

A lab node (worker-1, a real agent with its datapath) in a store that holds a large cluster's
worth of objects: --nodes other nodes (Node objects with their locators and one IPv4 and one IPv6
block each, as the agents of real nodes would have registered them), --pods pods bound to those
nodes with their IPLeases (both families) and segments, spread over 100 namespaces with a handful
of label sets and named container ports, --services Services with an EndpointSlice each (one or
two of those pods as ready backends), and --policies NetworkPolicies of five shapes (same
namespace, namespace and pod selectors, ipBlock with except and port ranges, egress, both
directions; bench/policy.py's). Objects are written in bulk with the store's own apply; leases
are written as the allocator writes them, without running it 10k times.

Then, for worker-1's agent:

  programmed       from the first object written to every pod's address in the agent's segment
                   map (the kernel's map, looked up through its pin)
  RSS              the agent's resident memory (VmRSS) once it has programmed everything and
                   made no pass for 5 s (the passes for the policies and services written with
                   the pods end after the pods are in the map), after the pod changes and after
                   the resyncs, and its peak (VmHWM)
  one pod change   a pod of another node written with its lease, until its address is in the
                   agent's segment map; then deleted, until it is gone: the store's commit,
                   the watch's wake-up and the agent's pass (median of --changes)
  full resync      the agent's periodic resync (every 30 s: a full pass that also reads every
                   map back from the kernel), from its lace_agent_resync_duration_seconds
                   histogram, two passes
  passes           the agent's incremental pod passes and full passes during the pod changes
                   (its metrics), with the incremental passes' mean duration
  local pod start  --changes pods started on worker-1 itself, each another replica of a workload
                   the cluster has: from the apply to the first ICMP echo it answers (the lab
                   kubelet's CNI ADD through the plugin into the agent), the agent's own time
                   per ADD and DEL, its passes
  restart          the agent restarted into the loaded cluster: until it is ready, its RSS then

With --real-pods N (default 0: 1k real pods need several minutes and ~1 GB on a 2-core VM), the
same measures on a second lab of three nodes with N real pods (namespaces, veths, endpoints on
every node) instead of the synthetic cluster. There a new pod (a replica of an existing label set)
starts on worker-2 first, so its time to worker-1's map includes that start; it is also shown from
the moment the bench's own store watch sees the pod's lease, and no verdict is drawn from it.

Run as root after `make install`:
  .venv/bin/python bench/scale.py [--pods 10000] [--services 1000] [--policies 2000] [--nodes 50]
                                  [--changes 10] [--real-pods 0]
Goals: agent RSS < 150 MiB; one pod change programmed < 20 ms; full resync < 2 s; a pod started on
the loaded node Running in < 100 ms (median; p90 < 150 ms), as pod start in an empty lab.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lab import Bench, first_answer_ms, icmp_echo_socket, lease_address, p90  # noqa: E402  (bench/lab.py)
from policy import policy as policy_manifest  # noqa: E402  (bench/policy.py)

from lace import netlink  # noqa: E402
from lace.agent.endpoints import host_ifname, pod_mac  # noqa: E402
from lace.agent.model import ANN_LOCATOR, ANN_NODE_ID, ANN_UNDERLAY  # noqa: E402
from lace.bpf import Map  # noqa: E402
from lace.datapath import registry  # noqa: E402
from lace.datapath.segment import segment_key  # noqa: E402
from lace.lab import procs as labprocs  # noqa: E402
from lace.store import STORE_FILE, SqliteStore  # noqa: E402
from lace.store import kinds as K  # noqa: E402

LAB = "scale"
NAMESPACES = 100
APPS = ("web", "api", "db", "cache", "queue")
PORTS = [{"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090},
         {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]
FIRST_FAKE_ID = 100   # lab nodes are 1..3
GOALS = {"rss": 150.0, "change": 20.0, "resync": 2.0, "start": 100.0, "start_p90": 150.0}


class Lab(Bench):
    """bench/lab.py's driver for a lab named LAB, with what the measures read of it."""

    def __init__(self, state: str) -> None:
        super().__init__(state, LAB)

    def store(self) -> SqliteStore:
        return SqliteStore(os.path.join(self.dir, STORE_FILE))

    def agent(self, node: str = "worker-1") -> labprocs.ProcInfo:
        return next(p for p in labprocs.list_procs(self.dir) if p.name == f"agent-{node}")

    def segment_map(self, node: str = "worker-1") -> Map:
        pin_root = self.agent(node).argv[self.agent(node).argv.index("--pin-root") + 1]
        return Map.open_pinned(os.path.join(pin_root, registry.get("segment").pin_name))

    def metrics(self, node: str = "worker-1") -> dict[str, float]:
        """The agent's Prometheus samples (name{labels} -> value), fetched inside its namespace."""
        p = self.agent(node)
        port = int(p.argv[p.argv.index("--metrics-port") + 1])
        addr = netlink.addresses("eth0", p.netns, family=socket.AF_INET)[0].split("/")[0]
        with netlink.entered(p.netns):
            with socket.create_connection((addr, port), timeout=10) as s:
                s.sendall(f"GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n".encode())
                raw = b""
                while chunk := s.recv(65536):
                    raw += chunk
        out = {}
        for line in raw.partition(b"\r\n\r\n")[2].decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def wait_until(what: str, cond: Callable[[], bool], timeout: float, step: float = 0.0005) -> float:
    """Seconds until ``cond()`` holds (asked every ``step``); SystemExit after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)
    return time.monotonic() - t0


# ---- the synthetic cluster -------------------------------------------------------------------------


def fake_node(i: int) -> dict:
    nid = FIRST_FAKE_ID + i
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": f"far-{i}", "labels": {"kubernetes.io/hostname": f"far-{i}"},
        "annotations": {ANN_LOCATOR: f"fd5e:c000:{nid:x}::/48", ANN_UNDERLAY: f"fd5e:ff::{nid:x}",
                        ANN_NODE_ID: str(nid)}}}


def pod_labels(j: int) -> dict[str, str]:
    return {"app": APPS[(j // NAMESPACES) % len(APPS)], "tier": ("fe", "be")[j % 2]}


def pod_manifest(j: int, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{j}", "namespace": f"ns{j % NAMESPACES}", "labels": pod_labels(j)},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "ports": PORTS}]}}


def lease_manifest(network: str, node: str, block: str, ip: ipaddress._BaseAddress, pod: str, cid: str) -> dict:
    """An IPLease as the allocator writes it (lace.store.allocate.allocate_lease), with the
    annotations its node's agent adds once the pod's interface exists (host interface, MAC)."""
    return {"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
            "metadata": {"name": K.lease_name(network, str(ip)),
                         "labels": {K.NODE_LABEL: node, K.NETWORK_LABEL: network},
                         "annotations": {K.HOST_IFNAME_ANNOTATION: host_ifname(cid),
                                         K.POD_MAC_ANNOTATION: pod_mac(cid)}},
            "spec": {"network": network, "node": node, "block": K.block_name(network, block), "ip": str(ip),
                     "pod": pod, "containerID": cid, "ifname": "eth0"}}


class Cluster:
    """The synthetic cluster's objects, written to the lab's store."""

    def __init__(self, store: SqliteStore, nodes: int) -> None:
        self.store = store
        self.nodes = [f"far-{i}" for i in range(nodes)]
        self.blocks: dict[str, tuple[ipaddress.IPv4Network, ipaddress.IPv6Network]] = {}
        self.pod_ips: dict[int, tuple[ipaddress.IPv4Address, ipaddress.IPv6Address]] = {}

    def write_nodes(self) -> None:
        self.store.apply_all([fake_node(i) for i in range(len(self.nodes))])
        for n in self.nodes:
            v4 = ipaddress.ip_network(self.store.allocate_block(K.DEFAULT_NETWORK, n, 4, 24))
            v6 = ipaddress.ip_network(self.store.allocate_block(K.DEFAULT_NETWORK, n, 6, 112))
            self.blocks[n] = (v4, v6)

    def pod_objects(self, j: int) -> list[dict]:
        """Pod ``j`` on its node, with its two leases (the node's blocks, in order)."""
        node = self.nodes[j % len(self.nodes)]
        k = j // len(self.nodes) + 2          # the block's first addresses stay free
        v4 = self.blocks[node][0].network_address + k
        v6 = self.blocks[node][1].network_address + k
        self.pod_ips[j] = (v4, v6)
        # a container ID as a runtime makes one (64 hex digits)
        ref, cid = f"ns{j % NAMESPACES}/p{j}", hashlib.sha256(f"scale-{j}".encode()).hexdigest()
        return [pod_manifest(j, node),
                lease_manifest(K.DEFAULT_NETWORK, node, str(self.blocks[node][0]), v4, ref, cid),
                lease_manifest(K.DEFAULT_NETWORK, node, str(self.blocks[node][1]), v6, ref, cid)]

    def write_pods(self, pods: int) -> None:
        self.store.apply_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": f"ns{i}", "labels": {"team": f"t{i % 20}", "env": ("prod", "dev")[i % 2]}}}
            for i in range(NAMESPACES)])
        for start in range(0, pods, 500):
            self.store.apply_all([o for j in range(start, min(pods, start + 500)) for o in self.pod_objects(j)])
        # the segments the pods' own agents allocate at their ADD: one per namespace and label set
        for ns in range(NAMESPACES):
            for labels in {tuple(sorted(pod_labels(j).items())) for j in range(ns, pods, NAMESPACES)}:
                self.store.allocate_segment(K.DEFAULT_NETWORK, f"ns{ns}", dict(labels))

    def write_services(self, services: int) -> None:
        pods = len(self.pod_ips)
        for start in range(0, services, 500):
            objs = []
            for i in range(start, min(services, start + 500)):
                ns = f"ns{i % NAMESPACES}"
                # every second service has two backends (a Maglev table), the others one, as in
                # bench/service_programming.py: a node holds 1023 tables
                backends = [(i * 7 + b * 101) % pods for b in range(1 + i % 2)]
                objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc{i}", "namespace": ns},
                             "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
                objs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                             "metadata": {"name": f"svc{i}-1", "namespace": ns,
                                          "labels": {"kubernetes.io/service-name": f"svc{i}"}},
                             "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                             "endpoints": [{"addresses": [str(self.pod_ips[b][0])], "conditions": {"ready": True},
                                            "nodeName": self.nodes[b % len(self.nodes)]} for b in backends]})
            self.store.apply_all(objs)

    def write_policies(self, policies: int) -> None:
        for start in range(0, policies, 500):
            objs = []
            for k in range(start, min(policies, start + 500)):
                doc = policy_manifest(k, NAMESPACES)
                doc["metadata"].pop("resourceVersion", None)
                objs.append(doc)
            self.store.apply_all(objs)


# ---- measures ------------------------------------------------------------------------------------


def one_pod_changes(lab: Lab, cluster: Cluster, seg, changes: int) -> tuple[list[float], list[float]]:
    """Add then delete a pod of a far node ``changes`` times: ms until the agent's segment map has
    its address, and until it is gone again."""
    adds, dels = [], []
    store = cluster.store
    base = len(cluster.pod_ips) + 1000
    for c in range(changes):
        j = base + c
        objs = cluster.pod_objects(j)
        key = segment_key(1, cluster.pod_ips[j][0])
        t0 = time.monotonic()
        store.apply_all(objs)
        wait_until(f"pod p{j} in the segment map", lambda: seg.lookup(key) is not None, 30)
        adds.append((time.monotonic() - t0) * 1000)
        t0 = time.monotonic()
        store.delete("pods", f"p{j}", f"ns{j % NAMESPACES}")
        for lease in objs[1:]:
            store.delete("ipleases", lease["metadata"]["name"])
        wait_until(f"pod p{j} out of the segment map", lambda: seg.lookup(key) is None, 30)
        dels.append((time.monotonic() - t0) * 1000)
    return adds, dels


def local_pod_starts(lab: Lab, store: SqliteStore, n: int) -> dict[str, Any]:
    """``n`` pods started on worker-1 itself, one at a time, each another replica of a workload the
    cluster has (pod 0's namespace, labels and named ports): the lab kubelet makes the pod's
    namespace and calls the CNI plugin, which asks the agent. Measured as bench/lab.py measures pod
    start: from the apply to the first ICMP echo the pod answers, pinged every ms from worker-1's
    own namespace (through the node's host device) once its lease is written; and the agent's own
    time per ADD and DEL (its lace_agent_cni_duration_seconds). A first pod of the label set goes
    first and is reported apart: the segment's first pod on the node makes it a subject of the
    node's policy map (its policy entries come with it); it is also deleted last, for the same
    reason. The others are deleted one at a time, each until the kubelet's DEL for it is done."""
    name = "lace_agent_cni_duration_seconds"
    dels = f'{name}_count{{command="DEL",result="ok"}}'

    def doc(i: int) -> dict:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"local{i}", "namespace": "ns0", "labels": pod_labels(0)},
                "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "image": "x", "ports": PORTS}]}}

    def agent_ms(before: dict[str, float], after: dict[str, float], command: str) -> float:
        key = f'{{command="{command}",result="ok"}}'
        count = after.get(f"{name}_count{key}", 0.0) - before.get(f"{name}_count{key}", 0.0)
        total = after.get(f"{name}_sum{key}", 0.0) - before.get(f"{name}_sum{key}", 0.0)
        return total / count * 1000 if count else float("nan")

    def delete(i: int) -> None:
        seen = lab.metrics().get(dels, 0.0)
        store.delete("pods", f"local{i}", "ns0")
        wait_until(f"local{i}'s DEL", lambda: lab.metrics().get(dels, 0.0) > seen, 60, step=0.05)

    sock = icmp_echo_socket(lab.agent().netns)
    try:
        start = lab.metrics()
        first = first_answer_ms(store, sock, doc(0))
        before = lab.metrics()
        starts = [first_answer_ms(store, sock, doc(i)) for i in range(1, n + 1)]
    finally:
        sock.close()
    added = lab.metrics()
    for i in range(1, n + 1):
        delete(i)
    deleted = lab.metrics()
    delete(0)
    gone = lab.metrics()
    # the first pod's two windows, its ADD (start -> before) and its DEL (deleted -> gone), as one:
    # what the metrics moved by in both is gone - (deleted - before + start)
    first_windows = {k: deleted.get(k, 0.0) - before.get(k, 0.0) + start.get(k, 0.0) for k in deleted}
    return {"starts": starts, "add_ms": agent_ms(before, added, "ADD"), "del_ms": agent_ms(added, deleted, "DEL"),
            "passes": pass_counts(before, deleted), "first": first, "first_add_ms": agent_ms(start, before, "ADD"),
            "first_del_ms": agent_ms(deleted, gone, "DEL"), "first_passes": pass_counts(first_windows, gone)}


def settled(lab: Lab, quiet: float = 5.0, timeout: float = 180.0) -> None:
    """Wait until the agent has made no pass for ``quiet`` seconds: the segment map holds every pod
    before the agent's last full passes for the policies and services written with them are done,
    and memory measured then would miss them."""
    name = "lace_agent_reconciles_total"
    deadline = time.monotonic() + timeout
    last, since = lab.metrics().get(name), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise SystemExit(f"the agent was still making passes after {timeout:.0f} s")
        time.sleep(0.5)
        now = lab.metrics().get(name)
        if now != last:
            last, since = now, time.monotonic()


def resyncs(lab: Lab, count: int = 2) -> list[float]:
    """The durations of the agent's next ``count`` periodic resyncs (s), from its histogram."""
    name = "lace_agent_resync_duration_seconds"
    out = []
    m = lab.metrics()
    for _ in range(count):
        before_n, before_s = m.get(f"{name}_count", 0.0), m.get(f"{name}_sum", 0.0)
        wait_until("a resync", lambda: lab.metrics().get(f"{name}_count", 0.0) > before_n, 75, step=0.5)
        m = lab.metrics()
        out.append((m[f"{name}_sum"] - before_s) / (m[f"{name}_count"] - before_n))
    return out


def pass_counts(before: dict[str, float], after: dict[str, float]) -> str:
    """The agent's passes between two looks at its metrics: incremental pod passes (with their
    mean duration) and full passes."""
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)
    n = delta("lace_agent_pod_sync_duration_seconds_count")
    mean = delta("lace_agent_pod_sync_duration_seconds_sum") / n * 1000 if n else 0.0
    prefix = 'lace_agent_full_passes_total{cause="'
    causes = ", ".join(f"{k[len(prefix):-2]} {d:.0f}" for k in sorted(after)
                       if k.startswith(prefix) and (d := delta(k)))
    return (f"{n:.0f} incremental pod passes (mean {mean:.2f} ms), "
            f"{delta('lace_agent_reconcile_duration_seconds_count'):.0f} full passes"
            + (f" ({causes})" if causes else ""))


def restarted(lab: Lab) -> tuple[float, float, float]:
    """Restart the agent into the cluster as it now is (as after an upgrade): seconds until it
    reports ready again (its first full pass done), and its RSS and peak then (MiB)."""
    t0 = time.monotonic()
    lab.lace("lab", "restart-agent", "--lab", LAB, "worker-1")
    lab.lace("status", "--wait", "--timeout", "120")
    ready = time.monotonic() - t0
    return (ready, *rss_mib(lab.agent().pid))


def fmt_ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.1f} ms (min {min(xs):.1f}, max {max(xs):.1f})"


@contextlib.contextmanager
def lab_up(state: str, nodes: int, why: str) -> Iterator[Lab]:
    """A lab of ``nodes`` nodes whose agents are healthy; down again afterwards, whatever happens."""
    lab = Lab(state)
    print(f"bringing up lab {LAB} ({nodes} nodes) {why} in {state}", file=sys.stderr)
    lab.lace("lab", "up", "--name", LAB, "--nodes", str(nodes))
    try:
        lab.lace("status", "--wait", "--timeout", "60")
        yield lab
    finally:
        lab.lace("lab", "down", "--name", LAB)


def synthetic(a: argparse.Namespace, state: str) -> dict[str, Any]:
    with lab_up(state, 1, "for the synthetic cluster") as lab:
        pid = lab.agent().pid
        idle_rss = rss_mib(pid)[0]
        store = lab.store()
        seg = lab.segment_map()
        try:
            cluster = Cluster(store, a.nodes)
            t0 = time.monotonic()
            cluster.write_nodes()
            cluster.write_pods(a.pods)
            print(f"{a.pods} pods written ({time.monotonic() - t0:.1f} s)", file=sys.stderr)
            cluster.write_services(a.services)
            cluster.write_policies(a.policies)
            written = time.monotonic() - t0
            print(f"{a.services} services and {a.policies} policies written ({written:.1f} s)", file=sys.stderr)
            keys = [segment_key(1, v4) for v4, _ in cluster.pod_ips.values()]
            # the last pods written first: while they are missing, no need to look at the 10k
            wait_until("every pod in worker-1's segment map",
                       lambda: all(seg.lookup(k) is not None for k in keys[-50:]) and
                       all(seg.lookup(k) is not None for k in keys), 600, step=0.2)
            programmed = time.monotonic()
            settled(lab)
            rss, hwm = rss_mib(pid)
            before = lab.metrics()
            adds, dels = one_pod_changes(lab, cluster, seg, a.changes)
            passes = pass_counts(before, lab.metrics())
            local = local_pod_starts(lab, store, a.changes)
            rss1 = rss_mib(pid)[0]
            sync = resyncs(lab)
            rss2, hwm2 = rss_mib(pid)
            restart = restarted(lab)
        finally:
            seg.close()
            store.close()
        return {"restart": restart, "idle_rss": idle_rss, "programmed": programmed - t0, "written": written, "rss": max(rss, rss2),
                "rss_steps": (rss, rss1, rss2), "hwm": max(hwm, hwm2), "adds": adds, "dels": dels, "resync": sync, "passes": passes,
                "local": local}


def real(a: argparse.Namespace, state: str) -> dict[str, Any]:
    with lab_up(state, 3, f"for {a.real_pods} real pods") as lab:
        pid = lab.agent().pid
        names = [f"r{j}" for j in range(a.real_pods)]
        t0 = time.monotonic()
        for start in range(0, len(names), 100):
            lab.apply([{"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": n, "namespace": "default", "labels": pod_labels(j)},
                        "spec": {"nodeName": f"worker-{j % 3 + 1}", "containers": [{"name": "c", "image": "x"}]}}
                       for j, n in enumerate(names[start:start + 100], start)])
        wait_until(f"{len(names)} pods Running", lambda: sum(
            1 for p in lab.pods().values() if (p.get("status") or {}).get("phase") == "Running") >= len(names),
                   1800, step=2)
        up = time.monotonic() - t0
        lab.lace("status", "--wait", "--timeout", "300")
        rss, hwm = rss_mib(pid)
        store = lab.store()
        seg = lab.segment_map()
        try:
            adds, dels, leased = [], [], []
            before = lab.metrics()
            for c in range(a.changes):
                name = f"extra{c}"
                since = store.revision()
                t1 = time.monotonic()
                # another replica of a pod already there (its labels: a known identity), as the
                # synthetic cluster's pod changes; a pod of a new identity is a full pass by design
                store.apply({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": name, "namespace": "default", "labels": pod_labels(c)},
                             "spec": {"nodeName": "worker-2", "containers": [{"name": "c", "image": "x"}]}})
                key = segment_key(1, lease_address(store, since, f"default/{name}"))
                t2 = time.monotonic()   # worker-2's agent has written the pod's lease: worker-1 can know
                wait_until(f"{name} in worker-1's segment map", lambda: seg.lookup(key) is not None, 30)
                adds.append((time.monotonic() - t1) * 1000)
                leased.append((time.monotonic() - t2) * 1000)
                t1 = time.monotonic()
                store.delete("pods", name, "default")
                wait_until(f"{name} out of worker-1's segment map", lambda: seg.lookup(key) is None, 60)
                dels.append((time.monotonic() - t1) * 1000)
            passes = pass_counts(before, lab.metrics())
        finally:
            seg.close()
            store.close()
        sync = resyncs(lab)
        rss2, hwm2 = rss_mib(pid)
        return {"up": up, "rss": max(rss, rss2), "hwm": max(hwm, hwm2), "adds": adds, "dels": dels, "resync": sync,
                "leased": leased, "passes": passes}


def verdict(name: str, value: float, goal: float, unit: str) -> str:
    return f"  {name:<34}{value:>9.1f} {unit:<4} (target < {goal:g} {unit})  {'met' if value < goal else 'NOT met'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--services", type=int, default=1_000)
    ap.add_argument("--policies", type=int, default=2_000)
    ap.add_argument("--nodes", type=int, default=50, help="other nodes the pods are bound to")
    ap.add_argument("--changes", type=int, default=10, help="single pod changes timed")
    ap.add_argument("--real-pods", type=int, default=0, help="real pods on a 3-node lab afterwards (0: skip)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/scale.py needs root", file=sys.stderr)
        return 2
    if not 1 <= a.nodes <= 200 or a.pods > a.nodes * 250:
        ap.error("--nodes: 1 to 200, and at most 250 pods a node (one /24 block each)")
    state = tempfile.mkdtemp(prefix="lace-bench-scale-")
    try:
        s = synthetic(a, state)
        r = real(a, state) if a.real_pods > 0 else None
    finally:
        shutil.rmtree(state, ignore_errors=True)

    print(f"\none agent (worker-1) in a cluster of {a.pods:,} pods on {a.nodes} other nodes, {a.services:,} services, "
          f"{a.policies:,} policies (objects written in {s['written']:.1f} s)")
    print(f"  programmed (first write to every pod in its segment map)  {s['programmed']:.1f} s")
    print(f"  agent RSS: {s['idle_rss']:.1f} MiB before, {s['rss']:.1f} MiB after (peak {s['hwm']:.1f}; "
          f"{s['rss_steps'][0]:.1f} once programmed and settled, {s['rss_steps'][1]:.1f} after the pod changes, "
          f"{s['rss_steps'][2]:.1f} after the resyncs)")
    print(f"  one pod of another node added, until in the agent's map:   {fmt_ms(s['adds'])}")
    print(f"  ... deleted, until out of it:                             {fmt_ms(s['dels'])}")
    print(f"  the agent's passes for them: {s['passes']}")
    lp = s["local"]
    print(f"  a pod started on the agent's own node (a workload's replica), apply to first packet answered: "
          f"{fmt_ms(lp['starts'])}, p90 {p90(lp['starts']):.1f}")
    print(f"  ... the agent's time per CNI ADD {lp['add_ms']:.1f} ms, per DEL {lp['del_ms']:.1f} ms; "
          f"its passes for them: {lp['passes']}")
    print(f"  the workload's first pod on that node (its label set becomes a policy subject there): "
          f"{lp['first']:.1f} ms; the agent's ADD {lp['first_add_ms']:.1f} ms, DEL {lp['first_del_ms']:.1f} ms; "
          f"its passes for them: {lp['first_passes']}")
    print(f"  full resync: {', '.join(f'{x:.2f} s' for x in s['resync'])}")
    print(f"  agent restarted into it: ready after {s['restart'][0]:.1f} s, RSS {s['restart'][1]:.1f} MiB "
          f"(peak {s['restart'][2]:.1f})")
    if r is not None:
        print(f"\n{a.real_pods} real pods on a 3-node lab (all Running after {r['up']:.0f} s), worker-1's agent")
        print(f"  agent RSS: {r['rss']:.1f} MiB (peak {r['hwm']:.1f})")
        print(f"  a new pod on worker-2 (apply to its address in worker-1's map): {fmt_ms(r['adds'])}")
        print(f"  ... after the bench's own watch saw its lease (0: worker-1 was first): {fmt_ms(r['leased'])}")
        print(f"  ... deleted, until out of it:                                 {fmt_ms(r['dels'])}")
        print(f"  worker-1's passes for them: {r['passes']}")
        print(f"  full resync: {', '.join(f'{x:.2f} s' for x in r['resync'])}")
    print("\ngoals")
    for title, res in (("synthetic", s), ("real pods", r)):
        if res is None:
            continue
        print(verdict(f"{title}: agent RSS", res["rss"], GOALS["rss"], "MiB"))
        if res is s:   # with real pods the pod's own start on worker-2 comes first: no verdict from it
            print(verdict(f"{title}: one pod change programmed", statistics.median(res["adds"]), GOALS["change"], "ms"))
            print(verdict(f"{title}: local pod start, median", statistics.median(res["local"]["starts"]),
                          GOALS["start"], "ms"))
            print(verdict(f"{title}: local pod start, p90", p90(res["local"]["starts"]), GOALS["start_p90"], "ms"))
        print(verdict(f"{title}: full resync", max(res["resync"]), GOALS["resync"], "s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
