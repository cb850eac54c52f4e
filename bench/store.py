#!/usr/bin/env python3
"""The store under load: the same workload on the embedded SQLite store and on a 3-member etcd.

The bench builds a 3-node lab topology of its own (namespaces, fabric, no agents) and starts a
3-member etcd on it as ``lace lab up --store etcd`` does (``lace.lab.etcd``); every process that
talks to a store runs inside one of those node namespaces; everything is removed afterwards.

Per backend:

- **create**: 10k pods (``apply_all``, 100 a transaction), then 10k IP leases in the nodes'
  blocks (blocks from the allocator, leases 100 a transaction): objects/s.
- **watch fan-out**: 3 watcher processes (one per node namespace) watch pods while a writer
  changes 20 pods a transaction at a paced 1k object writes/s; each event's latency is its arrival
  in a watcher minus the writer's clock just before the commit (one machine, one clock): p50/p99
  over every watcher's events. The writer writes through the backend's transactions (the stored
  pods with a new annotation), so what is timed is the commit and the fan-out, not the rules'
  reads a registry write makes first (the create rows measure those). SQLite watchers are woken
  by each commit (inotify on the write-ahead log), as the agent's are; the agent's 5 ms poll
  period is their fallback where inotify is not available.
- **allocation under contention**: a fresh store; 3 processes, one per node namespace, each
  allocates addresses (IPv4 + IPv6, as the CNI asks) for its own pods at the same time: pods/s,
  the Conflict errors that reached a caller (target 0: the store retries lost races itself), and
  addresses leased twice (must be 0).
- **one allocation among 10k leases**: the allocator's latency in the big store (median of 5).
- **resync after 410**: the store compacted past a watcher's revision: the time from the watch
  raising Gone to a full relist of every kind the agent watches and a new watch.

Run as root after `make install`:  .venv/bin/python bench/store.py [--quick]
Goals: watch p99 < 50 ms at 1k writes/s on etcd; no allocation conflict reaches a user.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lace.store import Conflict, StoreError, open_store  # noqa: E402
from lace.store import kinds as K  # noqa: E402
from lace.store.config import StoreConfig  # noqa: E402

#: the agent's store poll period (lace.agent.__main__.STORE_POLL_SECONDS): how often SQLite watchers
#: look for commits when inotify cannot wake them
SQLITE_POLL = 0.005
NODES = ("worker-1", "worker-2", "worker-3")
NS = "bench"
#: the kinds an agent watches (lace.agent.daemon.WATCH_KINDS), relisted after a 410
WATCH_KINDS = ["networks", "nodes", "ipblocks", "ipleases", "pods", "segments", "namespaces",
               "networkpolicies", "services", "endpointslices"]


def pod(i: int, node: str, note: str = "") -> dict:
    meta: dict[str, Any] = {"name": f"p{i}", "namespace": NS, "labels": {"app": f"a{i % 50}"}}
    if note:
        meta["annotations"] = {"bench/sent": note}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "lace/podserver"}]}}


def open_for(spec: str) -> Any:
    return open_store(spec, poll_interval=SQLITE_POLL)


# ---- roles run in a node namespace (this file, re-executed) -------------------------------------

def role_watcher(spec: str, since: int, want: int, timeout: float) -> None:
    """Watch pods from ``since``; print each event's latency (ms) as one JSON list."""
    store = open_for(spec)
    out: list[float] = []
    print("ready", flush=True)
    w = store.watch(["pods"], since=since, timeout=timeout)
    for ev in w:
        now = time.time_ns()
        sent = (ev.object["metadata"].get("annotations") or {}).get("bench/sent")
        if sent:
            out.append((now - int(sent)) / 1e6)
        if len(out) >= want:
            break
    w.stop()
    print(json.dumps(out), flush=True)


def role_allocator(spec: str, node: str, count: int) -> None:
    """Allocate addresses for ``count`` pods of ``node``; print pods/s, Conflicts and other errors."""
    store = open_for(spec)
    net = store.get("networks", "default")
    cidrs = [ipaddress.ip_network(c) for c in net["spec"]["cidrs"]]
    print("ready", flush=True)
    sys.stdin.readline()                       # go: every allocator starts together
    conflicts = errors = 0
    start = time.perf_counter()
    for i in range(count):
        try:
            store.allocate_leases("default", node, cidrs, f"{NS}/{node}-{i}", f"c-{node}-{i}", "eth0")
        except Conflict:
            conflicts += 1
        except StoreError as e:
            errors += 1
            print(f"error: {e}", file=sys.stderr)
    elapsed = time.perf_counter() - start
    print(json.dumps({"elapsed": elapsed, "conflicts": conflicts, "errors": errors}), flush=True)


# ---- the workload, per backend ------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, netns: dict[str, str]) -> None:
        self.args = args
        self.netns = netns

    def spawn(self, node: str, *argv: str) -> subprocess.Popen[str]:
        from lace.lab.topology import entering
        return subprocess.Popen([sys.executable, __file__, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, preexec_fn=entering(self.netns[node]))

    def run(self, spec: str, local_spec: str, fresh_spec: str, fresh_local: str) -> dict[str, float]:
        """``spec`` opened here (root namespace), ``local_spec`` inside a node namespace."""
        res: dict[str, float] = {}
        n = self.args.pods
        with open_for(spec) as store:
            store.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            t = time.perf_counter()
            for i in range(0, n, 100):
                store.apply_all([pod(j, NODES[j % 3]) for j in range(i, min(n, i + 100))])
            res["create pods (objects/s)"] = n / (time.perf_counter() - t)
            t = time.perf_counter()
            self._leases(store, n)
            res["create leases (objects/s)"] = n / (time.perf_counter() - t)
            res.update(self._watch(store, local_spec))
            times = []
            net = store.get("networks", "default")
            cidrs = [ipaddress.ip_network(c) for c in net["spec"]["cidrs"] if ":" not in c]
            for i in range(5):
                t = time.perf_counter()
                store.allocate_leases("default", "worker-1", cidrs, f"{NS}/one-{i}", f"one-{i}", "eth0")
                times.append(time.perf_counter() - t)
            res[f"one allocation among {n:,} leases (ms)"] = statistics.median(times) * 1e3
            res["resync after 410 (ms)"] = self._resync(store)
        res.update(self._allocate(fresh_spec, fresh_local))
        return res

    def _leases(self, store: Any, n: int) -> None:
        """``n`` leases spread over the three nodes' blocks (taken from the allocator as needed)."""
        per_node: dict[str, list[ipaddress.IPv4Address]] = {node: [] for node in NODES}
        for idx, node in enumerate(NODES):
            need = (n - idx + 2) // 3
            while len(per_node[node]) < need:
                cidr = ipaddress.ip_network(store.allocate_block("default", node, 4, 24, additional=True))
                per_node[node] += list(cidr.hosts())
        batch: list[dict] = []
        for j in range(n):
            node = NODES[j % 3]
            ip = per_node[node][j // 3]
            block = ipaddress.ip_network(f"{ip}/24", strict=False)
            batch.append({"apiVersion": K.LACE_API_VERSION, "kind": "IPLease",
                          "metadata": {"name": K.lease_name("default", str(ip)),
                                       "labels": {K.NODE_LABEL: node, K.NETWORK_LABEL: "default"}},
                          "spec": {"network": "default", "node": node, "block": K.block_name("default", str(block)),
                                   "ip": str(ip), "pod": f"{NS}/p{j}", "containerID": f"c{j}", "ifname": "eth0"}})
            if len(batch) == 100:
                store.apply_all(batch)
                batch = []
        if batch:
            store.apply_all(batch)

    def _watch(self, store: Any, local_spec: str) -> dict[str, float]:
        rate, seconds = self.args.rate, self.args.seconds
        per_txn = 20      # 50 commits a second: what one writer sustains on etcd here (10 fell short)
        total = int(rate * seconds) // per_txn * per_txn
        since = store.revision()
        watchers = [self.spawn(node, "--role", "watcher", local_spec, str(since), str(total),
                               str(seconds + 60)) for node in NODES]
        for w in watchers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        time.sleep(0.5)   # the watches are open (a watcher prints ready just before it opens)
        stored = store.list("pods", NS).items

        def body(txn: Any, objs: list[dict]) -> None:
            stamp = str(time.time_ns())      # the last thing before the commit
            for obj in objs:
                obj = copy.deepcopy(obj)
                obj["metadata"].setdefault("annotations", {})["bench/sent"] = stamp
                txn.update(obj)

        start = time.perf_counter()
        written = 0
        while written < total:
            due = start + written / rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            objs = [stored[(written + k) % len(stored)] for k in range(per_txn)]
            store.backend.run(lambda txn: body(txn, objs))
            written += per_txn
        achieved = written / (time.perf_counter() - start)
        lat: list[float] = []
        for w in watchers:
            out, _ = w.communicate(timeout=seconds + 90)
            lat += json.loads(out.strip().splitlines()[-1])
        lat.sort()
        return {"watch writes/s achieved": achieved, "watch events received": len(lat) / len(watchers),
                "watch fan-out p50 (ms)": lat[len(lat) // 2] if lat else float("nan"),
                "watch fan-out p99 (ms)": lat[int(len(lat) * 0.99)] if lat else float("nan")}

    def _resync(self, store: Any) -> float:
        from lace.store import Gone
        old = store.revision()
        store.apply(pod(0, NODES[0], "resync"))
        store.apply(pod(1, NODES[1], "resync"))
        store.compact(keep=1)
        t = time.perf_counter()
        try:
            store.watch(WATCH_KINDS, since=old).stop()
            raise SystemExit("the store did not answer 410 Gone after compaction")
        except Gone:
            pass
        revs = [int(store.list(kind).resource_version) for kind in WATCH_KINDS]
        # from the oldest list's revision, as the agent does: a watch from a newer one would skip
        # a change committed between two lists (what it replays instead is harmless)
        store.watch(WATCH_KINDS, since=min(revs), timeout=1).stop()
        return (time.perf_counter() - t) * 1e3

    def _allocate(self, spec: str, local_spec: str) -> dict[str, float]:
        count = self.args.alloc
        open_for(spec).close()   # the fresh store's built-in objects, before the race starts
        procs = [self.spawn(node, "--role", "allocator", local_spec, node, str(count)) for node in NODES]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            results.append(json.loads(out.strip().splitlines()[-1]))
        wall = time.perf_counter() - t
        with open_for(spec) as store:
            leases = store.list("ipleases").items
        addrs = [(x["spec"]["network"], x["spec"]["ip"]) for x in leases]
        return {"allocation, 3 nodes (pods/s)": 3 * count / wall,
                "conflicts seen by callers": sum(r["conflicts"] for r in results),
                "allocation errors": sum(r["errors"] for r in results),
                "addresses leased twice": len(addrs) - len(set(addrs)),
                "leases allocated": len(leases) / 2}


# ---- setup, report ------------------------------------------------------------------------------

def report(args: argparse.Namespace, sq: dict[str, float], et: dict[str, float]) -> None:
    print(f"store bench: {args.pods:,} pods + {args.pods:,} leases, 3 nodes; watch: 3 watchers, "
          f"{args.rate:,} writes/s for {args.seconds:g} s; allocation: 3 processes x {args.alloc} pods")
    print(f"  {'':<42}{'sqlite':>10}{'etcd x3':>10}{'etcd/sqlite':>13}   goal")
    goals = {"watch fan-out p99 (ms)": "< 50 ms on etcd", "conflicts seen by callers": "0",
             "addresses leased twice": "0"}
    for key in sq:
        a, b = sq[key], et[key]
        ratio = f"{b / a:.2f}x" if a else "-"
        fmt = "{:>10.0f}" if abs(a) >= 100 or abs(b) >= 100 or float(a).is_integer() else "{:>10.1f}"
        print(f"  {key:<42}{fmt.format(a)}{fmt.format(b)}{ratio:>13}   {goals.get(key, '')}")
    ok = et["watch fan-out p99 (ms)"] < 50 and et["conflicts seen by callers"] == 0 and \
        sq["conflicts seen by callers"] == 0 and et["addresses leased twice"] == sq["addresses leased twice"] == 0
    print(f"  goals {'met' if ok else 'NOT met'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1k pods, 2 s of watch, 50 allocations a node")
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=1000, help="watch phase: object writes per second")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--alloc", type=int, default=200, help="pods allocated by each of the 3 processes")
    ap.add_argument("--role", choices=("watcher", "allocator"), help=argparse.SUPPRESS)
    ap.add_argument("role_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "watcher":
        spec, since, want, timeout = args.role_args
        role_watcher(spec, int(since), int(want), float(timeout))
        return 0
    if args.role == "allocator":
        spec, node, count = args.role_args
        role_allocator(spec, node, int(count))
        return 0
    if args.quick:
        args.pods, args.seconds, args.alloc = 1000, 2.0, 50
    if os.geteuid() != 0:
        print("bench/store.py needs root (it builds network namespaces and runs etcd in them)", file=sys.stderr)
        return 1
    if shutil.which("etcd") is None:
        print("etcd is not installed: `make install` installs Debian's etcd-server", file=sys.stderr)
        return 1
    from lace.lab import etcd as lab_etcd
    from lace.lab import topology
    name = f"bst{os.getpid() % 10000}"
    state = tempfile.mkdtemp(prefix="lace-bench-store-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        lab = topology.build(topology.LabSpec(name=name, nodes=3), state_dir=state)
        netns = {n.name: n.netns for n in lab.nodes}
        bench = Bench(args, netns)
        db, fresh_db = os.path.join(state, "store.db"), os.path.join(state, "alloc.db")
        sq = bench.run(db, db, fresh_db, fresh_db)
        config = lab_etcd.start_lab_cluster(lab, state)
        fresh = StoreConfig("etcd", endpoints=config.endpoints, prefix="/bench-alloc", netns=config.netns)
        et = bench.run(str(config), str(config.without_netns()), str(fresh), str(fresh.without_netns()))
        report(args, sq, et)
    finally:
        from lace.lab import topology as topo
        topo.destroy(name, state_dir=state)
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
