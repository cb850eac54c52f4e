#!/usr/bin/env python3
"""Datapath cost per packet, from BPF_PROG_TEST_RUN, net of a trivial pass program measured in
the same run, for each path (established, new flow allowed, new flow to a service VIP, policy
drop, encap) with conntrack filled to 1k, 100k and 1M entries and 16k policy entries.

Then a stage table at the largest conntrack size: where each path's nanoseconds go, from
pod_veth.c built to return at each of its LACE_BENCH_STAGE cut points (the Makefile's
pod_veth_stop<n>.o): a stage costs the difference between its cut point and the one before.

Run as root after `make install`:  .venv/bin/python bench/datapath.py [--quick]
Targets (DESIGN): established <= 60 ns, new flow <= 500 ns, <= 10% growth from 1k to 1M.
Numbers are medians of interleaved rounds; on a noisy machine read the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scapy.layers.inet import TCP  # noqa: E402

from lace.bpf import ObjectSpec, enter_netns, test_run  # noqa: E402
from lace.datapath import registry  # noqa: E402
from lace.datapath.common import Direction  # noqa: E402
from lace.datapath.conntrack import CT4_KEY, CT_ENTRY, CtState, ct4_key  # noqa: E402
from lace.datapath.registry import bpf_dir  # noqa: E402
from lace.datapath.testbed import REMOTE, TC_ACT_OK, Backend, Testbed  # noqa: E402

POLICY_FILL = 16_384
CT_SIZES = (1_000, 100_000, 1_000_000)


def fill_conntrack(dp: Testbed, n: int) -> None:
    """n established TCPv4 entries that the measured flows never hit."""
    keys = np.zeros(n, dtype=CT4_KEY.dtype)
    keys["network"] = 1
    idx = np.arange(n, dtype=np.uint32)
    # 100.64.0.0/10 sources, one port each: unique and disjoint from the test pods
    src = (100 << 24) | (64 << 16) | (idx >> 8 & 0xFFFF)
    keys["saddr"] = src.astype(">u4").view("V4")
    keys["daddr"] = np.full(n, (10 << 24) | (1 << 16) | (1 << 8) | 11, dtype=">u4").view("V4")
    keys["sport"] = (1024 + (idx & 0xFF)).astype(">u2")
    keys["dport"] = 80
    keys["proto"] = 6
    vals = np.zeros(n, dtype=CT_ENTRY.dtype)
    now = time.monotonic_ns()
    vals["created_ns"] = now
    vals["last_seen_ns"] = now
    vals["expires_ns"] = now + 3600 * 10**9
    vals["state"] = CtState.ESTABLISHED
    m = dp.m("ct-tcp-v4")
    step = 100_000
    for i in range(0, n, step):
        k, v = keys[i:i + step], vals[i:i + step]
        m.update_batch(k.tobytes(), v.tobytes(), len(k))


def fill_policy(dp: Testbed, n: int) -> None:
    """n allow entries between segments the measured flows do not use."""
    for i in range(n):
        dp.allow(10_000 + i % 4096, 20_000 + i, Direction.INGRESS, proto=6, port=80)


def measure(prog, frames: list[bytes], ctx: bytes, netns: str, repeat: int = 1) -> float:
    """Median kernel-measured ns per run over the frames (each run with ``repeat`` repetitions)."""
    out = []
    with enter_netns(netns):
        for f in frames:
            out.append(test_run(prog, f, ctx=ctx, repeat=repeat, data_size_out=len(f) + 128).duration_ns)
    return statistics.median(out)


# Warm paths repeat the same packet inside the kernel: BPF_PROG_TEST_RUN runs every repetition on
# the one skb, so whatever the program wrote stays for the next. The established packet therefore
# starts at TTL 255 (the per-hop decrement stays far from the drop) and comes from a source pod
# whose endpoint MAC is the gateway MAC that delivery writes as the frame's source: repetition 2..n
# pass source validation again instead of measuring a spoofed-MAC drop (check_paths proves it).
# Paths that change what the next run sees (a new flow becomes established, an encapsulated packet
# no longer parses as the pod's) cannot repeat: they run once per call, cold, and are compared with
# the pass program run the same way.
WARM_REPEAT = 100
# the measured flows' ports; new flows take source ports below them, one per flow
EST_SPORT, ENC_SPORT, DENY_SPORT = 60001, 60002, 60003
# "service new": a SYN to this VIP:80 of a service with two backends on pod b (ports 80 and 8080,
# so every flow is delivered locally like "new flow") and a Maglev table
VIP, SVC_TARGETS = "10.96.0.10", (80, 8080)


def check_paths(dp: Testbed, prog, ctx: bytes, est: bytes, deny: bytes, enc: bytes, new: bytes,
                svc_new: bytes) -> None:
    """Fail unless each measured packet takes the path its row is named after, every repetition."""
    from scapy.layers.l2 import Ether

    from lace.datapath.conntrack import CtStatus
    from lace.datapath.reasons import DropReason
    from lace.datapath.trace import TRACE_EVENT
    from lace.datapath.testbed import TC_ACT_REDIRECT, TC_ACT_SHOT

    def run(pkt: bytes, repeat: int = 1):
        with enter_netns(dp.netns):
            res = test_run(prog, pkt, ctx=ctx, repeat=repeat, data_size_out=len(pkt) + 128)
        dp.ring.consume()
        events = [TRACE_EVENT.unpack(e) for e in dp.events]
        dp.events.clear()
        return res, events

    res, events = run(est, WARM_REPEAT)
    ttl = Ether(res.data_out)["IP"].ttl
    assert res.retval == TC_ACT_REDIRECT and not events and ttl == 255 - WARM_REPEAT, \
        f"established: verdict {res.retval}, {len(events)} events, TTL {ttl}: not established every repetition"
    res, events = run(deny, WARM_REPEAT)
    assert res.retval == TC_ACT_SHOT and len(events) == WARM_REPEAT and \
        all(e["reason"] == DropReason.POLICY_INGRESS for e in events), \
        f"policy drop: verdict {res.retval}, {len(events)} events: not a traced policy drop every repetition"
    res, events = run(new)
    assert res.retval == TC_ACT_REDIRECT and len(events) == 1 and events[0]["ct_status"] == CtStatus.NEW, \
        f"new flow: verdict {res.retval}, events {events}: not an allowed new flow"
    res, events = run(enc)
    assert res.retval == TC_ACT_REDIRECT and Ether(res.data_out).haslayer("IPv6"), \
        f"encap: verdict {res.retval}: not encapsulated and redirected"
    res, events = run(svc_new)
    assert res.retval == TC_ACT_REDIRECT and len(events) == 1 and events[0]["ct_status"] == CtStatus.NEW \
        and events[0]["nat_kind"] == 1 and events[0]["dport"] in SVC_TARGETS, \
        f"service new flow: verdict {res.retval}, events {events}: not a new flow translated to a backend"


# The stage table. Each path's cut points in walk order (None: the whole program) and what the walk
# did since the previous one (pod_veth.c's LACE_BENCH_STAGE comments). A path passes only some cut
# points: an established packet leaves the walk for delivery after conntrack, a service flow skips
# routing.
STAGES: dict[str, list[tuple[int | None, str]]] = {
    "established": [
        (1, "flow scratch, parse"),
        (2, "endpoint, source check, config"),
        (3, "conntrack lookup, advance"),
        (None, "delivery lookup, TTL, MACs, count, redirect"),
    ],
    "new flow": [
        (1, "flow scratch, parse"),
        (2, "endpoint, source check, config"),
        (3, "conntrack lookup (miss)"),
        (4, "service lookup (miss)"),
        (5, "route lookup"),
        (6, "segment, egress + ingress policy, delivery lookup"),
        (7, "conntrack entry created"),
        (None, "TTL, MACs, count, trace event, redirect"),
    ],
    "service new": [
        (1, "flow scratch, parse"),
        (2, "endpoint, source check, config"),
        (3, "conntrack lookup (miss)"),
        (4, "service lookup (hit)"),
        (6, "backend (Maglev), DNAT, segment, policy, delivery lookup"),
        (7, "conntrack: backend + frontend entries"),
        (None, "TTL, MACs, count, trace event, redirect"),
    ],
}
# source ports of the stage table's new flows (the main table's stay below 20000 per size)
STAGE_NEW_SPORT, STAGE_SVC_SPORT = 20000, 30000


def load_stage_programs(dp: Testbed) -> dict[int, tuple[object, object]]:
    """pod_veth.o cut at each stage point, sharing the test bed's pinned maps (same capacities:
    a changed definition must fail, not migrate the test bed's maps). Cut point -> (object,
    program); close the objects when done."""
    overrides = {registry.get(cli).pin_name: n for cli, n in dp.max_entries.items()}
    progs: dict[int, tuple[object, object]] = {}
    cuts = sorted({cut for stages in STAGES.values() for cut, _ in stages if cut is not None})
    try:
        for cut in cuts:
            spec = ObjectSpec.open(str(bpf_dir() / "test" / f"pod_veth_stop{cut}.o"), pin_root=dp.pin_root)
            for pin, n in overrides.items():
                spec.maps[pin].set_max_entries(n)
            obj = spec.load(migrate=False)
            progs[cut] = (obj, obj.programs["lace_from_pod"])
    except BaseException:
        for obj, _ in progs.values():
            obj.close()
        raise
    return progs


def forget_flows(dp: Testbed, src: str, dsts: list[tuple[str, int]], sports: range) -> None:
    """Delete the conntrack entries flows from src:sport to each (address, port) left, so that the
    next cut point's run meets them as new flows again."""
    m = dp.m("ct-tcp-v4")
    for sport in sports:
        for daddr, dport in dsts:
            m.delete(ct4_key(1, src, daddr, sport, dport, 6))


def stage_table(dp: Testbed, base, ctx: bytes, est: bytes, svc_new, rounds: int, calls: int) -> dict[str, list[float]]:
    """Per path, the cost of each stage of STAGES (ns, medians of interleaved rounds, each cut point
    measured like its row: established warm, new flows once per call against the pass program)."""
    a, b = dp.pods["a"], dp.pods["b"]
    progs = load_stage_programs(dp)
    try:
        full = {None: dp.prog_pod} | {cut: prog for cut, (_, prog) in progs.items()}
        ports = {"new flow": range(STAGE_NEW_SPORT, STAGE_NEW_SPORT + calls),
                 "service new": range(STAGE_SVC_SPORT, STAGE_SVC_SPORT + calls)}
        tmpl = {"new flow": bytes(dp.l3(a, b.ipv4, 4) / TCP(sport=1, dport=80, flags="S")),
                "service new": svc_new}
        created = {"new flow": [(b.ipv4, 80)], "service new": [(VIP, 80)] + [(b.ipv4, p) for p in SVC_TARGETS]}
        # one template per path, its source port patched in (the datapath checks no TCP checksum)
        pkts = {path: [t[:34] + sp.to_bytes(2, "big") + t[36:] for sp in ports[path]] for path, t in tmpl.items()}
        few = max(10, calls // 20)
        # a cut point that the path never reaches would measure the whole walk under its name
        probes = {"established": est, "new flow": pkts["new flow"][0], "service new": pkts["service new"][0]}
        with enter_netns(dp.netns):
            for path, stages in STAGES.items():
                for cut, what in stages:
                    if cut is not None:
                        rc = test_run(full[cut], probes[path], ctx=ctx, data_size_out=len(probes[path]) + 128).retval
                        assert rc == TC_ACT_OK, f"{path}: cut point {cut} ({what}) not reached (verdict {rc})"
        for path in ("new flow", "service new"):
            forget_flows(dp, a.ipv4, created[path], ports[path])
        samples: dict[tuple[str, int | None], list[float]] = {}
        base_samples: dict[str, list[float]] = {"warm": [], "once": []}
        for rnd in range(rounds + 1):
            warm = measure(base, [est] * few, ctx, dp.netns, WARM_REPEAT)
            once = measure(base, [est] * calls, ctx, dp.netns)
            got: dict[tuple[str, int | None], float] = {}
            for cut, _ in STAGES["established"]:
                got[("established", cut)] = measure(full[cut], [est] * few, ctx, dp.netns, WARM_REPEAT)
            for path in ("new flow", "service new"):
                for cut, _ in STAGES[path]:
                    got[(path, cut)] = measure(full[cut], pkts[path], ctx, dp.netns)
                    forget_flows(dp, a.ipv4, created[path], ports[path])
                    dp.ring.consume()
                    dp.events.clear()
            if rnd == 0:            # warm-up round, as in the main table
                continue
            base_samples["warm"].append(warm)
            base_samples["once"].append(once)
            for k, v in got.items():
                samples.setdefault(k, []).append(v)
    finally:
        for obj, _ in progs.values():
            obj.close()
    out: dict[str, list[float]] = {}
    for path, stages in STAGES.items():
        base_ns = statistics.median(base_samples["warm" if path == "established" else "once"])
        prev = 0.0
        out[path] = []
        for cut, _ in stages:
            upto = statistics.median(samples[(path, cut)]) - base_ns
            out[path].append(upto - prev)
            prev = upto
    return out


def print_stage_table(stages: dict[str, list[float]], size: int) -> None:
    print(f"\nwhere the time goes, conntrack {size:,} entries: pod_veth.c cut at each stage, ns each stage adds "
          f"(differences of medians: a few ns of noise; negative = noise)")
    for path, rows in STAGES.items():
        total = sum(stages[path])
        print(f"  {path} ({total:.0f} ns)")
        for (cut, what), ns in zip(rows, stages[path]):
            print(f"    {what:<58}{ns:>7.0f}{100 * ns / total:>6.0f}%")


def load_pass_program():
    """The baseline: a tc program that only returns (tests/bpf/bench_pass.c), private maps.
    Returns (object, program); close the object when done."""
    spec = ObjectSpec.open(str(bpf_dir() / "test" / "bench_pass.o"))
    spec.private()
    obj = spec.load()
    return obj, obj.programs["bench_pass"]


def run(quick: bool) -> int:
    calls = 300 if quick else 1500
    rounds = 3 if quick else 5
    sizes = CT_SIZES[:2] if quick else CT_SIZES
    dp = Testbed(max_entries={"ct-tcp-v4": max(sizes) + 200_000})
    passobj, base = load_pass_program()
    results: dict[int, dict[str, float]] = {}
    stages: dict[str, list[float]] = {}
    try:
        a, b = dp.pods["a"], dp.pods["b"]
        a.mac = b.host_mac          # see WARM_REPEAT
        ctx_a = dp.skb_ctx(a.ifindex)
        for size in sizes:
            dp.reset()
            fill_conntrack(dp, size)
            fill_policy(dp, POLICY_FILL)
            dp.select(b.segment, Direction.INGRESS)
            for port in SVC_TARGETS:
                dp.allow(b.segment, a.segment, Direction.INGRESS, proto=6, port=port)
            svc = dp.service(VIP, 80, [Backend(b.ipv4, p) for p in SVC_TARGETS])
            assert svc.table, "two active backends get a Maglev table"
            est = bytes(dp.l3(a, b.ipv4, 4, ttl=255) / TCP(sport=EST_SPORT, dport=80, flags="A"))
            enc = bytes(dp.l3(a, REMOTE["ipv4"], 4) / TCP(sport=ENC_SPORT, dport=80, flags="A"))
            dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=EST_SPORT, dport=80, flags="S"))
            dp.from_pod(a, dp.l3(a, REMOTE["ipv4"], 4) / TCP(sport=ENC_SPORT, dport=80, flags="S"))
            deny = bytes(dp.l3(a, b.ipv4, 4) / TCP(sport=DENY_SPORT, dport=81, flags="S"))
            flow = 1

            def new_flow(dst: str = b.ipv4) -> bytes:
                nonlocal flow
                flow += 1
                assert flow < EST_SPORT, "more new flows than source ports"
                return bytes(dp.l3(a, dst, 4) / TCP(sport=flow, dport=80, flags="S"))

            check_paths(dp, dp.prog_pod, ctx_a, est, deny, enc, new_flow(), new_flow(VIP))
            names = ("pass warm", "pass once", "established", "new flow", "service new", "policy drop", "encap")
            samples: dict[str, list[float]] = {k: [] for k in names}
            for rnd in range(rounds + 1):
                news = [new_flow() for _ in range(calls)]    # a new source port per run: every flow new
                svc_news = [new_flow(VIP) for _ in range(calls)]
                few = max(10, calls // 20)
                samples["pass warm"].append(measure(base, [est] * few, ctx_a, dp.netns, WARM_REPEAT))
                samples["established"].append(measure(dp.prog_pod, [est] * few, ctx_a, dp.netns, WARM_REPEAT))
                samples["policy drop"].append(measure(dp.prog_pod, [deny] * few, ctx_a, dp.netns, WARM_REPEAT))
                # drain now: a full ring buffer would make the drop path skip its trace event
                dp.ring.consume()
                dp.events.clear()
                samples["pass once"].append(measure(base, [est] * calls, ctx_a, dp.netns))
                samples["new flow"].append(measure(dp.prog_pod, news, ctx_a, dp.netns))
                samples["service new"].append(measure(dp.prog_pod, svc_news, ctx_a, dp.netns))
                samples["encap"].append(measure(dp.prog_pod, [enc] * calls, ctx_a, dp.netns))
                dp.ring.consume()
                dp.events.clear()
                if rnd == 0:        # a warm-up round: the first size's first round ran slow every time
                    samples = {k: [] for k in names}
            med = {k: statistics.median(v) for k, v in samples.items()}
            results[size] = {
                "established": med["established"] - med["pass warm"],
                "policy drop": med["policy drop"] - med["pass warm"],
                "new flow": med["new flow"] - med["pass once"],
                "service new": med["service new"] - med["pass once"],
                "encap": med["encap"] - med["pass once"],
                "pass warm": med["pass warm"],
                "pass once": med["pass once"],
            }
            if size == sizes[-1]:
                # more rounds than the main table: a round is short, and differences of medians are noisier
                stages = stage_table(dp, base, ctx_a, est, new_flow(VIP), 3 * rounds, calls)
    finally:
        passobj.close()
        dp.close()

    paths = ["established", "new flow", "service new", "policy drop", "encap"]
    first = sizes[0]
    print(f"datapath ns/packet net of a pass program (BPF_PROG_TEST_RUN; median of {rounds} interleaved rounds; "
          f"policy map {POLICY_FILL:,} entries)")
    print(f"{'path':<14}" + "".join(f"{f'ct {s:,}':>12}" for s in sizes) + f"{'growth':>9}   {'target':<10} run")
    targets = {"established": "<= 60", "new flow": "<= 500", "service new": "", "policy drop": "", "encap": ""}
    how = {"established": f"warm x{WARM_REPEAT}", "policy drop": f"warm x{WARM_REPEAT}",
           "new flow": "once/call, cold (cannot repeat: run 2 would be established)",
           "service new": "once/call, cold: SYN to a VIP, 2 backends, Maglev",
           "encap": "once/call, cold (cannot repeat: run 2 would see the outer header)"}
    for p in paths:
        row = "".join(f"{results[s][p]:>12.0f}" for s in sizes)
        ratio = results[sizes[-1]][p] / results[first][p] if results[first][p] > 0 else float("nan")
        print(f"{p:<14}{row}{ratio:>8.2f}x   {targets[p]:<10} {how[p]}")
    for k in ("pass warm", "pass once"):
        print(f"{k + ' (base)':<14}" + "".join(f"{results[s][k]:>12.0f}" for s in sizes))
    print_stage_table(stages, sizes[-1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls, 1k and 100k only")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/datapath.py needs root (BPF_PROG_TEST_RUN, network namespaces)", file=sys.stderr)
        return 2
    return run(args.quick)


if __name__ == "__main__":
    sys.exit(main())
