#!/usr/bin/env python3
"""Service programming: how long the agent takes to program services, with 1k to 30k in the store.

The agent's own code on a real store and real kernel maps (no traffic, no namespace needed):
services and their EndpointSlices are written to an embedded store with its allocators and rules,
and the node's datapath objects are loaded and pinned under a bpffs directory of the run's own.
Three measures per service count:

  cold sync     the agent meets N services and empty maps (a first start): list Services and
                EndpointSlices into the service cache, work out every frontend, build the entries
                and Maglev tables, write the three service maps
  full sync     the periodic resync with everything programmed: every frontend looked at again
                (the cache's), the maps read back from the kernel and compared, nothing to write
  add one       a Service and its EndpointSlice written to the store while the agent's watch
                runs, until the frontend is in the kernel's services map: the incremental pass
                alone (event to map written, the agent's part) and end to end (store write,
                watch wake-up, pass); the median of ADDS services added one by one

Beside lace, kube-proxy's nftables mode doing the same in the same run: a full sync (one
``nft -f`` of the whole ruleset for N services, rendered as bench/services.py renders it) and
adding one service (its chains, elements and rules in one ``nft -f`` transaction against a table
that holds N, as its partial sync writes). Rendering the rules is not counted for nftables; for
lace every Python step is.

Run as root after `make install`:
  .venv/bin/python bench/service_programming.py [--counts 1000,10000,30000] [--adds 20]
Goals: adding one service <= 5 ms; full sync of 30k services <= 0.4 s.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

COUNTS = (1_000, 10_000, 30_000)
ADDS = 20
NODE = "bench-node"
NODE_ADDR4 = ipaddress.ip_address("192.0.2.1")
NODE_ADDR6 = ipaddress.ip_address("fd00::1")
SLICE_LABEL = "kubernetes.io/service-name"


def service_objects(i: int) -> list[dict]:
    """Service ``svc<i>`` (ClusterIP allocated by the store) and its slice: every second service
    has two ready backends (a Maglev table), the others one, as in bench/services.py."""
    n = 2 if i % 2 else 1
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": f"svc{i}", "namespace": f"ns{i % 100}"},
           "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
    sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
          "metadata": {"name": f"svc{i}-1", "namespace": f"ns{i % 100}", "labels": {SLICE_LABEL: f"svc{i}"}},
          "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
          "endpoints": [{"addresses": [str(ipaddress.ip_address("10.244.64.1") + 2 * i + j)],
                         "conditions": {"ready": True}, "nodeName": NODE} for j in range(n)]}
    return [svc, sl]


def fill(store, have: int, want: int) -> None:
    for start in range(have, want, 1000):
        objs = [o for i in range(start, min(want, start + 1000)) for o in service_objects(i)]
        objs += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns{i}"}}
                 for i in range(100) if start == 0]
        store.apply_all(sorted(objs, key=lambda o: o["kind"] != "Namespace"))


class Agent:
    """The agent's service path, as lace.agent.daemon composes it: the service programmer, the
    service sync with its cache, the node datapath's writer over freshly loaded maps."""

    def __init__(self, pin_root: str, capacities: dict[str, int]) -> None:
        from lace.agent.datapath import NodeDatapath
        from lace.agent.desired import OWNED_MAPS
        from lace.agent.servicesync import ServiceSync
        from lace.services.program import ServiceProgrammer

        self.datapath = NodeDatapath(pin_root, max_entries=capacities)
        self.datapath.load()
        self.programmer = ServiceProgrammer(capacity=capacities.get("services"),
                                            maglev_entries=capacities.get("maglev"))
        self.sync = ServiceSync(NODE, self.programmer, self.datapath, OWNED_MAPS)
        self.order = OWNED_MAPS

    def full_pass(self, store, *, resync: bool) -> dict[str, float]:
        """The service part of a full reconcile pass (lace.agent.state.build_snapshot's and
        lace.agent.desired's), timed by step."""
        from lace.agent.diff import diff_all
        from lace.agent.model import by_name
        from lace.services.model import imports_by_service

        t = {}
        t0 = time.perf_counter()
        if not resync:
            self.since = self.sync.list(store)
        t1 = time.perf_counter()
        nets = store.list("networks").items
        ids = by_name(nets)
        self.sync.cache.set_context(ids, imports_by_service(nets, ids), NODE_ADDR4, NODE_ADDR6)
        fronts = self.sync.cache.frontends()
        t2 = time.perf_counter()
        services, backends, tables = self.programmer.entries(fronts)
        t3 = time.perf_counter()
        want = {"services": services, "backends": backends, "maglev": tables}
        have = {name: self.datapath.read(name, fresh=resync) for name in want}
        changes = {name: ch for name, ch in diff_all(want, have).items() if ch}
        self.datapath.apply(changes, self.order)
        t4 = time.perf_counter()
        t.update(list=t1 - t0, frontends=t2 - t1, entries=t3 - t2, write=t4 - t3, total=t4 - t0)
        t["written"] = sum(len(c.updates) + len(c.deletes) for c in changes.values())
        return t

    def close(self) -> None:
        self.datapath.close()


def watch_and_sync(store, agent: Agent, since: int, done: dict, stop: threading.Event) -> None:
    """The agent's watch and reconcile loops reduced to their service path: each event into the
    cache, then an incremental pass for what it touched."""
    with store.watch(["services", "endpointslices"], since=since) as w:
        stop.watch = w
        for ev in w:
            t0 = time.perf_counter()
            agent.sync.event(ev)
            keys, full = agent.sync.take()
            if keys and agent.sync.sync(keys) is None:
                raise RuntimeError("an incremental pass declined: the maps are too small for the run")
            for key in keys:
                done.setdefault(key, []).append((t0, time.perf_counter()))
            if stop.is_set():
                return


def add_one(store, agent: Agent, first: int, adds: int) -> tuple[list[float], list[float]]:
    """Add ``adds`` services one by one; per service, (the pass, end to end) in seconds."""
    from lace.datapath.common import Proto
    from lace.datapath.services import service_key

    done: dict[str, list] = {}
    stop = threading.Event()
    th = threading.Thread(target=watch_and_sync, args=(store, agent, store.revision(), done, stop), daemon=True)
    th.start()
    time.sleep(0.2)   # the watch is open
    passes, e2e = [], []
    m = agent.datapath.map("services")
    try:
        for i in range(first, first + adds):
            svc, sl = service_objects(i)
            key = f'{svc["metadata"]["namespace"]}/{svc["metadata"]["name"]}'
            t0 = time.perf_counter()
            stored = store.apply_all([svc, sl])[0].object
            vip = stored["spec"]["clusterIP"]
            head = service_key(1, vip, 80, Proto.TCP, 0)
            deadline = time.monotonic() + 5
            while len(done.get(key, ())) < 2:   # the Service's event, then its slice's
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{key} was not programmed within 5 s")
                time.sleep(0.0002)
            t_end = done[key][-1][1]
            if m.lookup(head) is None:
                raise RuntimeError(f"{key}: programmed, but its frontend is not in the services map")
            passes.append(sum(b - a for a, b in done[key]))
            e2e.append(t_end - t0)
    finally:
        stop.set()
        if getattr(stop, "watch", None) is not None:
            stop.watch.stop()
        th.join(5)
    return passes, e2e


# ---- kube-proxy's nftables mode -----------------------------------------------------------------

class Nftables:
    """kube-proxy's nftables ruleset (bench/services.py's rendering) in a namespace of its own."""

    def __init__(self, tag: str) -> None:
        from lace import netlink
        from services import EXACT_MAX, KubeProxyNftables, Service, Topology

        self.Service = Service
        self.exact_max = EXACT_MAX
        self.topo = Topology(tag, "nftprog")
        netlink.create_netns(self.topo.node)
        self.topo.made.append(self.topo.node)
        self.plane = KubeProxyNftables(self.topo)

    def service(self, i: int):
        return self.Service(f"ns{i % 100}", f"svc{i}", str(ipaddress.ip_address("10.96.0.1") + i),
                            tuple(str(ipaddress.ip_address("10.244.64.1") + 2 * i + j) for j in range(1 + i % 2)))

    def full_sync(self, n: int) -> tuple[float, bool]:
        """One ``nft -f`` of the whole ruleset; past EXACT_MAX services without the per-service
        numgen maps (their anonymous sets make the load O(n^2): bench/services.py)."""
        self.plane.clear()
        exact = n <= self.exact_max
        return self.plane.program([self.service(i) for i in range(n)], exact), exact

    def add_one(self, n: int, adds: int) -> list[float]:
        """One service's chains, rules and elements in one ``nft -f`` transaction, as a partial sync."""
        out = []
        for i in range(n, n + adds):
            text = "\n".join(self.plane.service_rules(self.service(i))) + "\n"
            t0 = time.perf_counter()
            self.topo.run_on_node(["nft", "-f", "-"], stdin=text)
            out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        self.topo.close()


# ---- the run ------------------------------------------------------------------------------------

def fmt(t: float | None) -> str:
    if t is None:
        return "n/a"
    return f"{t * 1000:.2f} ms" if t < 0.01 else f"{t * 1000:.0f} ms" if t < 1 else f"{t:.2f} s"


def run(counts: list[int], adds: int, with_nft: bool) -> int:
    from lace.bpf import ensure_bpffs
    from lace.datapath import services as svcmod
    from lace.store import SqliteStore

    tag = f"{os.getpid()}-{uuid.uuid4().hex[:4]}"
    workdir = tempfile.mkdtemp(prefix="lace-bench-svcprog-")
    pin_root = f"/sys/fs/bpf/lsvcprog-{tag}"
    top = max(counts) + adds * len(counts) + 10
    capacities = {"services": 4 * top, "backends": 2 * top,
                  "maglev": (top // 2 + 2) * svcmod.MAGLEV_SIZE}
    rows = []
    inexact: list[int] = []
    nft = None
    store = SqliteStore(os.path.join(workdir, "store.db"))
    try:
        ensure_bpffs()
        nft = Nftables(tag) if with_nft else None
        have = 0
        for n in counts:
            t = time.perf_counter()
            fill(store, have, n)
            have = n
            print(f"{n:,} services stored ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
            agent = Agent(pin_root, capacities)
            try:
                cold = agent.full_pass(store, resync=False)
                gc.freeze()   # as the agent does after its first pass
                full = min((agent.full_pass(store, resync=True) for _ in range(3)), key=lambda x: x["total"])
                if full["written"]:
                    raise RuntimeError(f"a resync with nothing changed wrote {full['written']} entries")
                passes, e2e = add_one(store, agent, have, adds)
                have += adds
            finally:
                agent.close()
                for f in os.listdir(pin_root):
                    os.unlink(os.path.join(pin_root, f)) if os.path.isfile(os.path.join(pin_root, f)) else \
                        shutil.rmtree(os.path.join(pin_root, f))
                os.rmdir(pin_root)
            nft_full, exact = nft.full_sync(n) if nft else (None, True)
            nft_add = statistics.median(nft.add_one(n, adds)) if nft else None
            if not exact:
                inexact.append(n)
            rows.append((n, cold, full, statistics.median(passes), statistics.median(e2e), max(passes),
                         nft_full, nft_add))
            print(f"{n:,}: cold {fmt(cold['total'])}, full sync {fmt(full['total'])}, add one "
                  f"{fmt(statistics.median(passes))} (end to end {fmt(statistics.median(e2e))})", file=sys.stderr)
    finally:
        store.close()
        if nft is not None:
            nft.close()
        if os.path.isdir(pin_root):
            shutil.rmtree(pin_root, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nservice programming with N services in the store (lace: the agent's code on real maps; "
          f"add one: median of {adds})")
    head = (f"{'services':>9}{'cold sync':>11}{'full sync':>11}{'add one':>10}{'add e2e':>10}{'add max':>10}"
            f"{'nft full':>10}{'nft add':>10}{'full/nft':>10}{'add/nft':>9}")
    print(head)
    for n, cold, full, add, e2e, add_max, nft_full, nft_add in rows:
        r_full = f"{full['total'] / nft_full:.2g}x" if nft_full else "n/a"
        r_add = f"{add / nft_add:.2g}x" if nft_add else "n/a"
        print(f"{n:>9,}{fmt(cold['total']):>11}{fmt(full['total']):>11}{fmt(add):>10}{fmt(e2e):>10}"
              f"{fmt(add_max):>10}{fmt(nft_full):>10}{fmt(nft_add):>10}{r_full:>10}{r_add:>9}")
    if inexact:
        print(f"nft full sync at {', '.join(f'{n:,}' for n in inexact)}: without the per-service numgen maps "
              "(loading them is O(n^2)); a lighter ruleset than kube-proxy's")
    print("\nwhere the time goes (cold sync / full sync):")
    for n, cold, full, *_ in rows:
        steps = ", ".join(f"{k} {fmt(cold[k])} / {fmt(full[k])}" for k in ("list", "frontends", "entries", "write"))
        print(f"{n:>9,}  {steps}")
    print("\ngoals")
    by_n = {r[0]: r for r in rows}
    if 30_000 in by_n:
        full = by_n[30_000][2]["total"]
        print(f"  full sync of 30k services  {fmt(full):>9}  (target <= 400 ms)  {'met' if full <= 0.4 else 'NOT met'}")
    worst = max(r[3] for r in rows)
    print(f"  adding one service         {fmt(worst):>9}  (target <= 5 ms; the worst count's median)  "
          f"{'met' if worst <= 0.005 else 'NOT met'}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default=",".join(str(c) for c in COUNTS))
    ap.add_argument("--adds", type=int, default=ADDS)
    ap.add_argument("--no-nftables", action="store_true", help="lace only")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: it loads BPF maps (and nftables rules in a namespace)")
    counts = sorted(int(c) for c in args.counts.split(","))
    return run(counts, args.adds, not args.no_nftables)


if __name__ == "__main__":
    sys.exit(main())
