#!/usr/bin/env python3
"""``node ct list all -o json`` and ``node ct gc all`` on 1M conntrack entries, side by side with
``bpftool map dump pinned <map> -j`` of the same maps in the same run.

Run as root after `make install`:  .venv/bin/python bench/cli.py [--entries N]
Targets: ct list (end to end, a subprocess writing to /dev/null) under 1.5 s and at least 12x
faster than bpftool over the same maps; gc of 1M entries with half expired under 1 s. Also the
tables' fill as the agent's metrics read it, the kernel's counts against a walk of every table.

The commands run as an installed lace runs: with lace's bytecode compiled beforehand (an editable
install compiles nothing, and with PYTHONDONTWRITEBYTECODE set every run would compile every module
again, ~0.4 s here).

The tables live in a private pin root (/sys/fs/bpf/lace-bench-<pid>) with capacities raised so
1M entries fit; it is removed afterwards.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lace.bpf import MapEntryCounts, ensure_bpffs  # noqa: E402
from lace.datapath import registry  # noqa: E402
from lace.datapath.common import now_coarse  # noqa: E402
from lace.datapath.conntrack import CT4_KEY, CT6_KEY, CT_ENTRY, CtFlag, CtState  # noqa: E402
from lace.datapath.node import PinnedMaps, load_objects  # noqa: E402
from lace.store import STORE_FILE  # noqa: E402

#: share of the entries per table (sums to 1)
SHARES = {"ct-tcp-v4": 0.45, "ct-udp-v4": 0.15, "ct-icmp-v4": 0.05,
          "ct-tcp-v6": 0.25, "ct-udp-v6": 0.07, "ct-icmp-v6": 0.03}
PROTO = {"tcp": 6, "udp": 17, "icmp": 1}


def fill(m, name: str, n: int, seed: int, expired_half: bool) -> None:
    v6 = name.endswith("v6")
    layout = CT6_KEY if v6 else CT4_KEY
    proto = PROTO[name.split("-")[1]]
    if v6 and proto == 1:
        proto = 58
    rng = np.random.default_rng(seed)
    idx = np.arange(n, dtype=np.uint64)
    keys = np.zeros(n, dtype=layout.dtype)
    keys["network"] = 1 + (idx % 3).astype(np.uint32)
    if v6:
        s = np.zeros((n, 16), np.uint8)
        s[:, 0:2] = (0xfd, 0x00)
        s[:, 2:8] = rng.integers(0, 256, (n, 6), dtype=np.uint8)
        s[:, 12:16] = idx.astype(">u4").view(np.uint8).reshape(n, 4)
        d = np.zeros((n, 16), np.uint8)
        d[:, 0:4] = (0x20, 0x01, 0x0d, 0xb8)
        d[:, 15] = rng.integers(1, 255, n, dtype=np.uint8)
    else:
        s = ((100 << 24) | (64 << 16) | (idx & 0xFFFF)).astype(">u4").view(np.uint8).reshape(n, 4)
        d = rng.integers(0, 256, (n, 4), dtype=np.uint8)
        d[:, 0] = 10
    keys["saddr"] = np.ascontiguousarray(s).view(f"V{s.shape[1]}").ravel()
    keys["daddr"] = np.ascontiguousarray(d).view(f"V{d.shape[1]}").ravel()
    keys["sport"] = (1024 + (idx >> 16)).astype(np.uint16)
    keys["dport"] = rng.choice(np.array([80, 443, 53, 8080], np.uint16), n)
    keys["proto"] = proto
    vals = np.zeros(n, dtype=CT_ENTRY.dtype)
    now = now_coarse()
    vals["created_ns"] = now - rng.integers(0, 3600, n).astype(np.uint64) * 10**9
    vals["last_seen_ns"] = now
    life = rng.integers(10, 21600, n).astype(np.int64) * 10**9
    if expired_half:
        life[::2] = -10**9
    vals["expires_ns"] = (np.int64(now) + life).astype(np.uint64)
    vals["packets_fwd"] = rng.integers(1, 10**6, n)
    vals["bytes_fwd"] = rng.integers(60, 10**9, n)
    vals["packets_rev"] = rng.integers(0, 10**6, n)
    vals["bytes_rev"] = rng.integers(0, 10**9, n)
    vals["src_segment"] = 256 + (idx % 50).astype(np.uint32)
    vals["dst_segment"] = 256 + (idx % 70).astype(np.uint32)
    vals["dst_network"] = keys["network"]
    vals["state"] = CtState.ESTABLISHED if proto == 6 else CtState.REPLIED
    dnat = (idx % 5) == 0
    vals["flags"] = CtFlag.SEEN_REPLY | np.where(dnat, int(CtFlag.DNAT), 0).astype(np.uint8)
    vals["rev_nat_id"] = np.where(dnat, 7, 0)
    vals["nat_addr"] = np.frombuffer(bytes([10, 96, 0, 10]) + bytes(12), dtype="V16")[0]
    vals["nat_port"] = 53
    vals["delivery"] = 2
    step = 100_000
    for i in range(0, n, step):
        k, v = keys[i:i + step], vals[i:i + step]
        m.update_batch(k.tobytes(), v.tobytes(), len(k))


def load(pin_root: str, total: int, expired_half: bool) -> dict[str, int]:
    counts = {name: int(total * share) for name, share in SHARES.items()}
    counts["ct-tcp-v4"] += total - sum(counts.values())
    # LRU maps evict before they are full: leave headroom
    with load_objects(pin_root, {name: max(1024, int(n * 1.3)) for name, n in counts.items()}) as dp:
        for i, (name, n) in enumerate(counts.items()):
            fill(dp.map(name), name, n, i, expired_half)
            got = dp.map(name).dump()[2]
            if got != n:
                raise SystemExit(f"{name}: filled {n}, map holds {got}")
    return counts


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        res = subprocess.run(cmd, stdout=null, stderr=subprocess.PIPE, env=env)
    dt = time.perf_counter() - t
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {res.stderr.decode()[-500:]}")
    return dt


def fill_counts(pin_root: str, counts: dict[str, int], rounds: int) -> None:
    """The tables' fill as the agent's metrics and status read it each scrape: the kernel's own
    counts through the map iterator (lace.bpf.iter) against walking every table (Map.count, what
    they did before); both must find the entries filled."""
    pinned = PinnedMaps(pin_root, "bench")
    maps = {n: pinned.open(n) for n in counts}
    try:
        with MapEntryCounts(str(registry.bpf_dir() / registry.MAP_ENTRIES_OBJECT),
                            registry.MAP_ENTRIES_PROGRAM) as counter:
            walks, reads = [], []
            for _ in range(rounds):
                t = time.perf_counter()
                walked = {n: m.count() for n, m in maps.items()}
                walks.append(time.perf_counter() - t)
                t = time.perf_counter()
                read = counter.entries(maps)
                reads.append(time.perf_counter() - t)
                if walked != counts or read != counts:
                    raise SystemExit(f"fill counts: filled {counts}, walked {walked}, kernel {read}")
    finally:
        for m in maps.values():
            m.close()
    walk, read = min(walks), min(reads)
    print(f"map fill, 6 tables: walk      {walk * 1000:8.1f} ms")
    print(f"map fill, 6 tables: kernel    {read * 1000:8.2f} ms   ({walk / read:,.0f}x less time: the map iterator)")


def make_store(path: str) -> None:
    from lace.store import SqliteStore
    st = SqliteStore(path)
    st.apply_all([{"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": n},
                   "spec": {"cidrs": [c]}} for n, c in (("blue", "10.50.0.0/16"), ("red", "10.60.0.0/16"))])
    st.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ensure_bpffs()
    pin_root = f"/sys/fs/bpf/lace-bench-{os.getpid()}"
    tmp = tempfile.mkdtemp(prefix="lace-bench-")
    os.makedirs(pin_root)
    node = [str(ROOT / ".venv" / "bin" / "node")]
    if not os.path.exists(node[0]):
        node = [sys.executable, "-c", "from lace.cli.node.main import entry; entry()"]
    store = os.path.join(tmp, STORE_FILE)
    make_store(store)
    env = dict(os.environ, LACE_PIN_ROOT=pin_root, LACE_STORE=store, LACE_NODE="bench")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    compileall.compile_dir(str(ROOT / "lace"), quiet=1)
    try:
        t = time.perf_counter()
        counts = load(pin_root, a.entries, expired_half=False)
        print(f"filled {sum(counts.values())} entries in {time.perf_counter() - t:.1f}s: "
              + ", ".join(f"{k} {v}" for k, v in counts.items()))
        lists, lists_n, tools = [], [], []
        for _ in range(a.rounds):
            lists.append(timed(node + ["ct", "list", "all", "-o", "json"], env))
            lists_n.append(timed(node + ["-n", "ct", "list", "all", "-o", "json"], env))
            t = time.perf_counter()
            for name in counts:
                timed(["bpftool", "map", "dump", "pinned", os.path.join(pin_root, registry.get(name).pin_name),
                       "-j"], env)
            tools.append(time.perf_counter() - t)
        best, best_n, tool = min(lists), min(lists_n), min(tools)
        print(f"node ct list all -o json      {best:6.2f} s   (target < 1.5 s)  {'OK' if best < 1.5 else 'MISS'}")
        print(f"node -n ct list all -o json   {best_n:6.2f} s")
        print(f"bpftool map dump -j (6 maps)  {tool:6.2f} s")
        ratio = tool / best
        print(f"ratio bpftool / node          {ratio:6.1f} x  (target >= 12x)  {'OK' if ratio >= 12 else 'MISS'}")
        fill_counts(pin_root, counts, a.rounds)
        # gc: refill with half expired
        shutil.rmtree(pin_root)
        os.makedirs(pin_root)
        load(pin_root, a.entries, expired_half=True)
        g = timed(node + ["ct", "gc", "all"], env)
        pinned = PinnedMaps(pin_root, "bench")
        remaining = 0
        for n in counts:
            with pinned.open(n) as m:
                remaining += m.dump()[2]
        print(f"node ct gc all (half expired) {g:6.2f} s   (target < 1 s)  {'OK' if g < 1 else 'MISS'}  "
              f"{a.entries - remaining} removed, {remaining} left")
    finally:
        shutil.rmtree(pin_root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
