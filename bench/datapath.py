#!/usr/bin/env python3
"""Datapath cost per packet, from BPF_PROG_TEST_RUN, net of a trivial pass program measured in
the same run, for each path (established, a service flow's established packet and its reply, new
flow allowed, new flow to a service VIP, policy drop, encap; a new flow and a reply to a backend
flagged REPLY_ENTRY, whose flows keep a backend entry) with conntrack filled to 1k, 100k and 1M
entries and 16k policy entries. New flows run cold (once per call) and warm
(tests/bpf/bench_new_flows.c: a fresh flow every repetition).

Then, at the largest conntrack size, a stage table: where each path's nanoseconds go, from
pod_veth.c built to return at each of its LACE_BENCH_STAGE cut points (the Makefile's
pod_veth_stop<n>.o): a stage costs the difference between its cut point and the one before. And
the floor under a new flow: the kernel's LRU hash alone (tests/bpf/bench_ct_floor.c).

Run as root after `make install`:  .venv/bin/python bench/datapath.py [--quick]
Targets (DESIGN): established <= 60 ns, new flow <= 500 ns, <= 10% growth from 1k to 1M.
Numbers are medians of interleaved rounds; on a noisy machine read the ratios.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scapy.layers.inet import TCP  # noqa: E402

from lace.bpf import Map, ObjectSpec, enter_netns, test_run  # noqa: E402
from lace.datapath import registry  # noqa: E402
from lace.datapath.common import Direction  # noqa: E402
from lace.datapath.conntrack import (CT4_KEY, CT_ENTRY, CtState, ct4_key, ct_endpoint_key,  # noqa: E402
                                     ct_endpoint_value)
from lace.datapath.endpoint import endpoint_value, veth_key  # noqa: E402
from lace.datapath.registry import bpf_dir  # noqa: E402
from lace.datapath.testbed import NET1, REMOTE, TC_ACT_OK, Backend, Testbed  # noqa: E402

POLICY_FILL = 16_384
CT_SIZES = (1_000, 100_000, 1_000_000)


def fill_conntrack(m: Map, n: int) -> None:
    """n established TCPv4 entries in m that the measured flows never hit."""
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
    step = 100_000
    for i in range(0, n, step):
        k, v = keys[i:i + step], vals[i:i + step]
        m.update_batch(k.tobytes(), v.tobytes(), len(k))


def fill_delivery(dp: Testbed) -> int:
    """Network 1's delivery entries as a node of a large cluster holds them, none of them reached
    by the measured flows: 200 more local pods in this node's block 10.1.1.0/24 (/32, written as the
    agent does: the trie and the exact map), and every /26 of 10.1.0.0/16 outside node 1's and node
    2's /24 blocks on some other node (the trie alone). The base topology's dozen entries are the
    trie's best case: a lookup walks the trie as deep as the entries sharing the address's leading
    bits make it, as here. Returns the number of entries added."""
    from lace.datapath.delivery import DELIVERY, DeliveryKind, delivery_key

    b = dp.pods["b"]
    taken = {p.ipv4 for p in dp.pods.values()}
    local = [a for a in (f"10.1.1.{i}" for i in range(20, 255)) if a not in taken][:200]
    for addr in local:
        dp.deliver(delivery_key(NET1, f"{addr}/32"), DELIVERY.pack(
            kind=DeliveryKind.LOCAL, ifindex=b.ifindex, endpoint_id=b.endpoint_id))
    blocks = [n for n in ipaddress.ip_network("10.1.0.0/16").subnets(new_prefix=26)
              if not n.subnet_of(ipaddress.ip_network("10.1.1.0/24"))
              and not n.subnet_of(ipaddress.ip_network("10.1.2.0/24"))]
    for i, block in enumerate(blocks):
        dp.deliver(delivery_key(NET1, str(block)), DELIVERY.pack(kind=DeliveryKind.REMOTE, node_id=3 + i // 4))
    return len(local) + len(blocks)


def fill_policy(dp: Testbed, n: int) -> None:
    """n allow entries between segments the measured flows do not use."""
    for i in range(n):
        dp.allow(10_000 + i % 4096, 20_000 + i, Direction.INGRESS, proto=6, port=80)


#: with --ct-limit: pod a's endpoint-ct entry, zeroed before every run as the agent's GC pass would
#: recount it (the runs' flows are forgotten or never meant to count): every new flow is checked
#: against the limit and admitted, never refused for the bench's own volume
CT_COUNT_RESET: tuple[Map, bytes] | None = None


def measure(prog, frames: list[bytes], ctx: bytes, netns: str, repeat: int = 1) -> float:
    """Median kernel-measured ns per run over the frames (each run with ``repeat`` repetitions)."""
    out = []
    with enter_netns(netns):
        for f in frames:
            if CT_COUNT_RESET is not None:
                CT_COUNT_RESET[0].update(CT_COUNT_RESET[1], ct_endpoint_value({}))
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
EST_SPORT, ENC_SPORT, DENY_SPORT, SVC_EST_SPORT = 60001, 60002, 60003, 60004
# "service new": a SYN to this VIP:80 of a service with two backends on pod b (ports 80 and 8080,
# so every flow is delivered locally like "new flow") and a Maglev table
VIP, SVC_TARGETS = "10.96.0.10", (80, 8080)
# the reply rows and the reply-entry rows: a second service, VIP2:80 -> pod b:8081 alone, its backend
# flagged REPLY_ENTRY (more frontends than its revnat entry names: its new flows keep a backend
# entry, which their replies find); its new flows take source ports from 2 up of their own (their
# tuples, to VIP2 and to b:8081, are no other row's); SVC_BE_SPORT is its established flow's port
VIP2, BE_TARGET, SVC_BE_SPORT = "10.96.0.11", 8081, 60005


def check_paths(dp: Testbed, prog, ctx: bytes, est: bytes, deny: bytes, enc: bytes, new: bytes,
                svc_new: bytes, svc_est: bytes) -> None:
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
    # once per call: a repetition would run on the packet the first one translated already
    res, events = run(svc_est)
    out = Ether(res.data_out)["IP"]
    assert res.retval == TC_ACT_REDIRECT and not events and out.dst == dp.pods["b"].ipv4 and \
        out.dport in SVC_TARGETS, f"service established: verdict {res.retval}, {len(events)} events: not translated"
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


def check_replies(dp: Testbed, prog, ctx: bytes, svc_reply: bytes, be_reply: bytes | None) -> None:
    """Fail unless each reply row's packet leaves translated back to its frontend, every call."""
    from scapy.layers.l2 import Ether

    from lace.datapath.testbed import TC_ACT_REDIRECT

    for pkt, vip in ((svc_reply, VIP), (be_reply, VIP2)):
        if pkt is None:
            continue
        with enter_netns(dp.netns):
            res = test_run(prog, pkt, ctx=ctx, data_size_out=len(pkt) + 128)
        dp.ring.consume()
        dp.events.clear()
        out = Ether(res.data_out)["IP"]
        assert res.retval == TC_ACT_REDIRECT and out.src == vip and out.sport == 80, \
            f"reply from {vip}'s backend: verdict {res.retval}, source {out.src}:{out.sport}: not translated"


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
        (7, "conntrack: the frontend entry"),
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


@functools.cache
def flow_keys(src: str, dsts: tuple[tuple[str, int], ...], sports: range) -> tuple[bytes, ...]:
    """The conntrack keys (network 1, TCP) of flows from src:sport to each (address, port)."""
    n = len(sports) * len(dsts)
    keys = np.zeros(n, dtype=CT4_KEY.dtype)
    keys["network"] = 1
    keys["saddr"] = np.full(n, int.from_bytes(socket.inet_aton(src), "big"), dtype=">u4").view("V4")
    keys["daddr"] = np.repeat(np.array([int.from_bytes(socket.inet_aton(d), "big") for d, _ in dsts], dtype=">u4"),
                              len(sports)).view("V4")
    keys["dport"] = np.repeat(np.array([p for _, p in dsts], dtype=">u2"), len(sports))
    keys["sport"] = np.tile(np.array(sports, dtype=">u2"), len(dsts))
    keys["proto"] = 6
    out = tuple(k.tobytes() for k in keys)
    assert out[-1] == ct4_key(1, src, dsts[-1][0], sports[-1], dsts[-1][1], 6), "flow_keys disagrees with ct4_key"
    return out


def forget_flows(dp: Testbed, src: str, dsts: list[tuple[str, int]], sports: range) -> None:
    """Delete the conntrack entries flows from src:sport to each (address, port) left, so that the
    next run meets them as new flows again."""
    m = dp.m("ct-tcp-v4")
    for key in flow_keys(src, tuple(dsts), sports):
        m.delete(key)


def stage_table(dp: Testbed, nf: NewFlows, base, ctx: bytes, est: bytes, new_pkt: bytes, svc_pkt: bytes,
                rounds: int, calls: int) -> dict[str, dict[str, list[float]]]:
    """Per path and way of running ("cold": once per call, "warm": in-kernel repetitions), the
    cost of each stage of STAGES (ns, medians of interleaved rounds, net of the pass program run the
    same way). The established packet runs warm only, as its row; new flows run both ways
    (new_pkt, svc_pkt: their templates, TTL 255)."""
    a, b = dp.pods["a"], dp.pods["b"]
    progs = load_stage_programs(dp)
    try:
        full = {None: dp.prog_pod} | {cut: prog for cut, (_, prog) in progs.items()}
        ports = {"new flow": range(STAGE_NEW_SPORT, STAGE_NEW_SPORT + calls),
                 "service new": range(STAGE_SVC_SPORT, STAGE_SVC_SPORT + calls)}
        tmpl = {"new flow": new_pkt, "service new": svc_pkt}
        dst = {"new flow": (b.ipv4, 80), "service new": (VIP, 80)}
        created = {"new flow": [(b.ipv4, 80)], "service new": [(VIP, 80)]}   # a service flow: one entry
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
        samples: dict[tuple[str, str, int | None], list[float]] = {}
        for rnd in range(rounds + 1):
            got: dict[tuple[str, str, int | None], float] = {
                ("base", "warm", None): measure(base, [est] * few, ctx, dp.netns, WARM_REPEAT),
                ("base", "cold", None): measure(base, [est] * calls, ctx, dp.netns),
                ("base", "warm new", None): measure_new_warm(dp, nf, None, new_pkt, ctx, dst["new flow"], None, few),
            }
            for cut, _ in STAGES["established"]:
                got[("established", "warm", cut)] = measure(full[cut], [est] * few, ctx, dp.netns, WARM_REPEAT)
            for path in ("new flow", "service new"):
                for cut, _ in STAGES[path]:
                    creates = cut is None or cut >= 7        # cut point 7: its entries are made
                    got[(path, "cold", cut)] = measure(full[cut], pkts[path], ctx, dp.netns)
                    if creates:
                        forget_flows(dp, a.ipv4, created[path], ports[path])
                    got[(path, "warm", cut)] = measure_new_warm(dp, nf, full[cut], tmpl[path], ctx, dst[path],
                                                                created[path] if creates else None, few)
            if rnd == 0:            # warm-up round, as in the main table
                continue
            for k, v in got.items():
                samples.setdefault(k, []).append(v)
    finally:
        for obj, _ in progs.values():
            obj.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    bases = {("established", "warm"): med[("base", "warm", None)], ("new flow", "cold"): med[("base", "cold", None)],
             ("new flow", "warm"): med[("base", "warm new", None)]}
    bases[("service new", "cold")] = bases[("new flow", "cold")]
    bases[("service new", "warm")] = bases[("new flow", "warm")]
    out: dict[str, dict[str, list[float]]] = {}
    for path, stages in STAGES.items():
        out[path] = {}
        for how in ("cold", "warm"):
            if (path, how) not in bases:
                continue
            prev, rows = 0.0, []
            for cut, _ in stages:
                upto = med[(path, how, cut)] - bases[(path, how)]
                rows.append(upto - prev)
                prev = upto
            out[path][how] = rows
    return out


def ct_floor(dp: Testbed, base, ctx: bytes, pkt: bytes, size: int, rounds: int, calls: int) -> dict[str, float]:
    """What the kernel itself costs for conntrack's work per packet (tests/bpf/bench_ct_floor.c), in
    an LRU hash with the test bed's capacity and size entries, net of the pass program: for a new
    flow a lookup that misses and an insert, each once per call (cold, like the new-flow rows) and
    warm; for an established packet a lookup that hits and the clock, warm (like its row): the coarse
    clock the walk once read per packet, and the walk's clock (lib/clock.h) that it reads now."""
    spec = ObjectSpec.open(str(bpf_dir() / "test" / "bench_ct_floor.o"))
    spec.maps["bench_ct"].set_max_entries(dp.max_entries["ct-tcp-v4"])
    obj = spec.load()
    try:
        fill_conntrack(obj.maps["bench_ct"], size)
        hit_key = next(obj.maps["bench_ct"].keys())
        bss = next(m for name, m in obj.maps.items() if name.endswith(".bss"))
        seq = bss.lookup(struct.pack("<I", 0))[:4]          # struct bench_keys: seq, then hit_key
        bss.update(struct.pack("<I", 0), seq + hit_key)
        progs = {op: obj.programs[f"bench_{op}"] for op in ("ct_miss", "ct_insert", "ct_hit", "coarse_clock",
                                                                "walk_clock")}
        with enter_netns(dp.netns):
            for op, prog in progs.items():
                rc = test_run(prog, pkt, ctx=ctx, data_size_out=len(pkt) + 128).retval
                assert rc == 0, f"{op}: a fresh key was found or not inserted, or the hit missed"
        few = max(10, calls // 20)
        got: dict[str, list[float]] = {}
        for rnd in range(rounds + 1):
            row = {"pass once": measure(base, [pkt] * calls, ctx, dp.netns),
                   "pass warm": measure(base, [pkt] * few, ctx, dp.netns, WARM_REPEAT)}
            for op in ("ct_miss", "ct_insert"):
                row[f"{op} once"] = measure(progs[op], [pkt] * calls, ctx, dp.netns)
            for op in progs:
                row[f"{op} warm"] = measure(progs[op], [pkt] * few, ctx, dp.netns, WARM_REPEAT)
            if rnd:
                for k, v in row.items():
                    got.setdefault(k, []).append(v)
    finally:
        obj.close()
    med = {k: statistics.median(v) for k, v in got.items()}
    return {k: v - med["pass " + k.split()[1]] for k, v in med.items() if not k.startswith("pass")}


def print_stage_table(stages: dict[str, dict[str, list[float]]], size: int) -> None:
    print(f"\nwhere the time goes, conntrack {size:,} entries: pod_veth.c cut at each stage, ns each stage adds "
          f"(differences of medians: some noise, cold more than warm)")
    for path, rows in STAGES.items():
        hows = list(stages[path])
        totals = "   ".join(f"{how} {sum(stages[path][how]):.0f}" for how in hows)
        print(f"  {path + ' (' + totals + ')':<62}" + "".join(f"{how:>7}" for how in hows))
        for i, (_, what) in enumerate(rows):
            print(f"    {what:<58}" + "".join(f"{stages[path][how][i]:>7.0f}" for how in hows))


def load_pass_program():
    """The baseline: a tc program that only returns (tests/bpf/bench_pass.c), private maps.
    Returns (object, program); close the object when done."""
    spec = ObjectSpec.open(str(bpf_dir() / "test" / "bench_pass.o"))
    spec.private()
    obj = spec.load()
    return obj, obj.programs["bench_pass"]


class NewFlows:
    """tests/bpf/bench_new_flows.c (private maps): BPF_PROG_TEST_RUN's repetitions as new flows back
    to back — each repetition gets the next source port and the destination :meth:`aim` set, then
    tail-calls the program :meth:`into` set (bench_pass_tail when none: the baseline)."""

    def __init__(self) -> None:
        spec = ObjectSpec.open(str(bpf_dir() / "test" / "bench_new_flows.o"))
        spec.private()
        self.obj = spec.load()
        self.prog = self.obj.programs["bench_new_flows"]
        self.bss = next(m for name, m in self.obj.maps.items() if name.endswith(".bss"))
        self.into(None)

    def into(self, prog) -> None:
        target = prog if prog is not None else self.obj.programs["bench_pass_tail"]
        self.obj.maps["bench_walk"].update(struct.pack("<I", 0), struct.pack("<I", target.fd))

    def aim(self, sport: int, daddr: str, dport: int) -> None:
        """struct bench_flow: the next source port, the destination as it sits in the packet."""
        self.bss.update(struct.pack("<I", 0),
                        struct.pack("<I", sport) + socket.inet_aton(daddr) + struct.pack("!H", dport) + bytes(2))

    def close(self) -> None:
        self.obj.close()


# the warm new-flow rows' source ports: WARM_REPEAT per call, forgotten after each measurement
WARM_SPORT = 40000


def measure_new_warm(dp: Testbed, nf: NewFlows, prog, pkt: bytes, ctx: bytes, dst: tuple[str, int],
                     created: list[tuple[str, int]] | None, calls: int) -> float:
    """Median ns per repetition of calls runs of WARM_REPEAT fresh flows each from pod a (pkt: their
    template, TTL 255) to dst through prog (None: the tail-called pass baseline); created: the
    (address, port) destinations whose conntrack entries prog leaves behind, forgotten afterwards
    (None: it creates none)."""
    nf.into(prog)
    nf.aim(WARM_SPORT, *dst)
    ns = measure(nf.prog, [pkt] * calls, ctx, dp.netns, WARM_REPEAT)
    if created:
        forget_flows(dp, dp.pods["a"].ipv4, created, range(WARM_SPORT, WARM_SPORT + calls * WARM_REPEAT))
    dp.ring.consume()
    dp.events.clear()
    return ns


def check_new_warm(dp: Testbed, nf: NewFlows, pkt: bytes, ctx: bytes, dst: tuple[str, int],
                   created: list[tuple[str, int]], service: bool) -> None:
    """Fail unless every repetition through lace_from_pod is a new flow forwarded to pod b (for a
    service, translated to a backend)."""
    from lace.datapath.conntrack import CtStatus
    from lace.datapath.testbed import TC_ACT_REDIRECT
    from lace.datapath.trace import TRACE_EVENT

    nf.into(dp.prog_pod)
    nf.aim(WARM_SPORT, *dst)
    with enter_netns(dp.netns):
        res = test_run(nf.prog, pkt, ctx=ctx, repeat=WARM_REPEAT, data_size_out=len(pkt) + 128)
    dp.ring.consume()
    events = [TRACE_EVENT.unpack(e) for e in dp.events]
    dp.events.clear()
    forget_flows(dp, dp.pods["a"].ipv4, created, range(WARM_SPORT, WARM_SPORT + WARM_REPEAT))
    ok = res.retval == TC_ACT_REDIRECT and len(events) == WARM_REPEAT and \
        len({e["sport"] for e in events}) == WARM_REPEAT and all(e["ct_status"] == CtStatus.NEW for e in events)
    if service:
        ok = ok and all(e["nat_kind"] == 1 and e["dport"] in SVC_TARGETS for e in events)
    assert ok, f"warm new flows to {dst}: verdict {res.retval}, {len(events)} events: not a new flow every repetition"


def check_port_ranges(calls: int, rounds: int) -> None:
    """Fail unless the measured flows' source ports stay apart for this many calls and rounds: the
    main table's new flows (two per call and round, the warm-up round too, from 2) below the stage
    table's, the stage table's two paths (calls each) apart and below the warm rows', the warm rows'
    (WARM_REPEAT per call of a warm row, max(10, calls // 20) calls) below the fixed flows'. A port
    reused by a later measurement would find its flow established and time the wrong path."""
    few = max(10, calls // 20)
    main_last = 1 + 2 * calls * (rounds + 1)
    assert main_last < STAGE_NEW_SPORT, f"{calls} calls x {rounds + 1} rounds: new flows reach port {main_last}"
    assert STAGE_NEW_SPORT + calls <= STAGE_SVC_SPORT, f"{calls} calls: the stage table's new flows reach its service flows"
    assert STAGE_SVC_SPORT + calls <= WARM_SPORT, f"{calls} calls: the stage table's service flows reach the warm rows"
    warm_last = WARM_SPORT + few * WARM_REPEAT
    assert warm_last <= min(EST_SPORT, ENC_SPORT, DENY_SPORT), \
        f"{calls} calls: the warm rows' flows reach port {warm_last}, past the fixed flows' {EST_SPORT}"


def run(quick: bool, ct_limit: int = 0, delivery_fill: bool = False) -> int:
    global CT_COUNT_RESET
    calls = 300 if quick else 1500
    rounds = 3 if quick else 5
    check_port_ranges(calls, rounds)
    sizes = CT_SIZES[:2] if quick else CT_SIZES
    dp = Testbed(max_entries={"ct-tcp-v4": max(sizes) + 200_000})
    passobj, base = load_pass_program()
    nf = NewFlows()
    results: dict[int, dict[str, float]] = {}
    stages: dict[str, dict[str, list[float]]] = {}
    floor: dict[str, float] = {}
    filled = 0
    try:
        a, b = dp.pods["a"], dp.pods["b"]
        a.mac = b.host_mac          # see WARM_REPEAT
        ctx_a = dp.skb_ctx(a.ifindex)
        for size in sizes:
            dp.reset()
            if ct_limit:   # pod a's new flows meet a per-endpoint conntrack limit (the agent's default)
                dp.m("veth").update(veth_key(a.ifindex), endpoint_value(
                    endpoint_id=a.endpoint_id, network=a.network, segment=a.segment, mac=a.mac,
                    ipv4=a.ipv4, ipv6=a.ipv6, ct_max=ct_limit))
                CT_COUNT_RESET = (dp.m("endpoint-ct"), ct_endpoint_key(a.ifindex))
            fill_conntrack(dp.m("ct-tcp-v4"), size)
            fill_policy(dp, POLICY_FILL)
            filled = fill_delivery(dp) if delivery_fill else 0
            dp.select(b.segment, Direction.INGRESS)
            for port in SVC_TARGETS:
                dp.allow(b.segment, a.segment, Direction.INGRESS, proto=6, port=port)
            svc = dp.service(VIP, 80, [Backend(b.ipv4, p) for p in SVC_TARGETS])
            assert svc.table, "two active backends get a Maglev table"
            dp.allow(b.segment, a.segment, Direction.INGRESS, proto=6, port=BE_TARGET)
            dp.service(VIP2, 80, [Backend(b.ipv4, BE_TARGET)], service_id=2, reply_entry=True)
            est = bytes(dp.l3(a, b.ipv4, 4, ttl=255) / TCP(sport=EST_SPORT, dport=80, flags="A"))
            enc = bytes(dp.l3(a, REMOTE["ipv4"], 4) / TCP(sport=ENC_SPORT, dport=80, flags="A"))
            dp.from_pod(a, dp.l3(a, b.ipv4, 4) / TCP(sport=EST_SPORT, dport=80, flags="S"))
            svc_est = bytes(dp.l3(a, VIP, 4, ttl=255) / TCP(sport=SVC_EST_SPORT, dport=80, flags="A"))
            dp.from_pod(a, dp.l3(a, VIP, 4) / TCP(sport=SVC_EST_SPORT, dport=80, flags="S"))
            dp.from_pod(a, dp.l3(a, REMOTE["ipv4"], 4) / TCP(sport=ENC_SPORT, dport=80, flags="S"))
            deny = bytes(dp.l3(a, b.ipv4, 4) / TCP(sport=DENY_SPORT, dport=81, flags="S"))
            # the replies: of the established service flow (found through the revnat entry), and of
            # an established flow to VIP2 (through its backend entry, when this build keeps one)
            svc_port = CT_ENTRY.unpack(dp.m("ct-tcp-v4").lookup(ct4_key(a.network, a.ipv4, VIP, SVC_EST_SPORT, 80, 6)))["nat_port"]
            svc_reply = bytes(dp.l3(b, a.ipv4, 4, ttl=255) / TCP(sport=svc_port, dport=SVC_EST_SPORT, flags="A"))
            dp.from_pod(a, dp.l3(a, VIP2, 4) / TCP(sport=SVC_BE_SPORT, dport=80, flags="S"))
            backend_entries = dp.m("ct-tcp-v4").lookup(ct4_key(a.network, a.ipv4, b.ipv4, SVC_BE_SPORT, BE_TARGET, 6)) \
                is not None
            be_reply = bytes(dp.l3(b, a.ipv4, 4, ttl=255) / TCP(sport=BE_TARGET, dport=SVC_BE_SPORT, flags="A"))
            ctx_b = dp.skb_ctx(b.ifindex)
            check_replies(dp, dp.prog_pod, ctx_b, svc_reply, be_reply if backend_entries else None)
            flow = be_flow = 1

            def new_flow(dst: str = b.ipv4) -> bytes:
                nonlocal flow
                flow += 1
                assert flow < STAGE_NEW_SPORT, "more new flows than source ports (check_port_ranges)"
                return bytes(dp.l3(a, dst, 4) / TCP(sport=flow, dport=80, flags="S"))

            def reply_entry_flow() -> bytes:
                nonlocal be_flow
                be_flow += 1
                return bytes(dp.l3(a, VIP2, 4) / TCP(sport=be_flow, dport=80, flags="S"))

            check_paths(dp, dp.prog_pod, ctx_a, est, deny, enc, new_flow(), new_flow(VIP), svc_est)
            # the warm new-flow rows' templates (NewFlows sets port and destination per repetition)
            new_warm = bytes(dp.l3(a, b.ipv4, 4, ttl=255) / TCP(sport=1, dport=80, flags="S"))
            svc_warm = bytes(dp.l3(a, VIP, 4, ttl=255) / TCP(sport=1, dport=80, flags="S"))
            new_dst, new_made = (b.ipv4, 80), [(b.ipv4, 80)]
            svc_dst, svc_made = (VIP, 80), [(VIP, 80)]   # a service flow has one entry, its frontend's
            check_new_warm(dp, nf, new_warm, ctx_a, new_dst, new_made, service=False)
            check_new_warm(dp, nf, svc_warm, ctx_a, svc_dst, svc_made, service=True)
            names = ("pass warm", "pass once", "pass tail", "established", "established once",
                     "service established", "service reply", "new flow", "service new",
                     "new flow warm", "service new warm", "policy drop", "encap",
                     "svc new, reply entry", "svc reply, entry")
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
                samples["established once"].append(measure(dp.prog_pod, [est] * calls, ctx_a, dp.netns))
                samples["service established"].append(measure(dp.prog_pod, [svc_est] * calls, ctx_a, dp.netns))
                samples["new flow"].append(measure(dp.prog_pod, news, ctx_a, dp.netns))
                samples["service new"].append(measure(dp.prog_pod, svc_news, ctx_a, dp.netns))
                samples["service reply"].append(measure(dp.prog_pod, [svc_reply] * calls, ctx_b, dp.netns))
                samples["svc new, reply entry"].append(
                    measure(dp.prog_pod, [reply_entry_flow() for _ in range(calls)], ctx_a, dp.netns))
                samples["svc reply, entry"].append(measure(dp.prog_pod, [be_reply] * calls, ctx_b, dp.netns))
                samples["encap"].append(measure(dp.prog_pod, [enc] * calls, ctx_a, dp.netns))
                dp.ring.consume()
                dp.events.clear()
                samples["pass tail"].append(measure_new_warm(dp, nf, None, new_warm, ctx_a, new_dst, None, few))
                samples["new flow warm"].append(
                    measure_new_warm(dp, nf, dp.prog_pod, new_warm, ctx_a, new_dst, new_made, few))
                samples["service new warm"].append(
                    measure_new_warm(dp, nf, dp.prog_pod, svc_warm, ctx_a, svc_dst, svc_made, few))
                if rnd == 0:        # a warm-up round: the first size's first round ran slow every time
                    samples = {k: [] for k in names}
            med = {k: statistics.median(v) for k, v in samples.items()}
            results[size] = {
                "established": med["established"] - med["pass warm"],
                "established once": med["established once"] - med["pass once"],
                "service established": med["service established"] - med["pass once"],
                "policy drop": med["policy drop"] - med["pass warm"],
                "new flow": med["new flow"] - med["pass once"],
                "service new": med["service new"] - med["pass once"],
                "service reply": med["service reply"] - med["pass once"],
                "svc new, reply entry": med["svc new, reply entry"] - med["pass once"],
                "svc reply, entry": (med["svc reply, entry"] - med["pass once"]) if backend_entries else float("nan"),
                "encap": med["encap"] - med["pass once"],
                "new flow warm": med["new flow warm"] - med["pass tail"],
                "service new warm": med["service new warm"] - med["pass tail"],
                "pass warm": med["pass warm"],
                "pass once": med["pass once"],
                "pass tail": med["pass tail"],
            }
            if size == sizes[-1]:
                # more rounds than the main table: a round is short, and differences of medians are noisier
                stages = stage_table(dp, nf, base, ctx_a, est, new_warm, svc_warm, 3 * rounds, calls)
                floor = ct_floor(dp, base, ctx_a, est, size, rounds, calls)
    finally:
        nf.close()
        passobj.close()
        dp.close()

    paths = ["established", "established once", "service established", "service reply", "new flow", "service new",
             "new flow warm", "service new warm", "policy drop", "encap", "svc new, reply entry", "svc reply, entry"]
    first = sizes[0]
    print(f"datapath ns/packet net of a pass program (BPF_PROG_TEST_RUN; median of {rounds} interleaved rounds; "
          f"policy map {POLICY_FILL:,} entries; "
          + (f"delivery map {filled:,} more entries (--delivery-fill); " if filled else "")
          + "per-pod conntrack limit "
          f"{ct_limit if ct_limit else 'off'})")
    print(f"{'path':<20}" + "".join(f"{f'ct {s:,}':>12}" for s in sizes) + f"{'growth':>9}   {'target':<10} run")
    targets = {"established": "<= 60", "established once": "", "service established": "", "new flow": "<= 500",
               "service new": "", "new flow warm": "",
               "service new warm": "", "policy drop": "", "encap": "", "service reply": "",
               "svc new, reply entry": "", "svc reply, entry": ""}
    how = {"established": f"warm x{WARM_REPEAT}", "policy drop": f"warm x{WARM_REPEAT}",
           "established once": "once/call, cold: the established packet",
           "service established": "once/call, cold: an ACK to the VIP, translated from its conntrack entry",
           "new flow": "once/call, cold (cannot repeat: run 2 would be established)",
           "service new": "once/call, cold: SYN to a VIP, 2 backends, Maglev",
           "new flow warm": f"warm x{WARM_REPEAT}: a fresh flow every repetition (tests/bpf/bench_new_flows.c)",
           "service new warm": f"warm x{WARM_REPEAT}: a fresh flow to the VIP every repetition",
           "encap": "once/call, cold (cannot repeat: run 2 would see the outer header)",
           "service reply": "once/call, cold: the backend's ACK, found through its revnat entry, leaves as the VIP",
           "svc new, reply entry": "once/call, cold: SYN to a VIP whose backend is flagged REPLY_ENTRY "
                                   "(frontend + backend entry)",
           "svc reply, entry": "once/call, cold: its backend's ACK, found through the backend entry"
                               + ("" if backend_entries else " (n/a: this build keeps no backend entries)")}
    for p in paths:
        row = "".join(f"{results[s][p]:>12.0f}" for s in sizes)
        ratio = results[sizes[-1]][p] / results[first][p] if results[first][p] > 0 else float("nan")
        print(f"{p:<20}{row}{ratio:>8.2f}x   {targets[p]:<10} {how[p]}")
    for k in ("pass warm", "pass once", "pass tail"):
        print(f"{k + ' (base)':<20}" + "".join(f"{results[s][k]:>12.0f}" for s in sizes))
    print_stage_table(stages, sizes[-1])
    print(f"  the floor under conntrack: the kernel alone, an LRU hash of the same capacity and fill "
          f"(tests/bpf/bench_ct_floor.c)\n"
          f"    lookup that misses    {floor['ct_miss once']:>5.0f} once/call   {floor['ct_miss warm']:>5.0f} warm\n"
          f"    insert of a new entry {floor['ct_insert once']:>5.0f} once/call   {floor['ct_insert warm']:>5.0f} warm\n"
          f"    lookup that hits                       {floor['ct_hit warm']:>5.0f} warm\n"
          f"    coarse clock read                      {floor['coarse_clock warm']:>5.0f} warm\n"
          f"    the walk's clock (ticks, lib/clock.h)  {floor['walk_clock warm']:>5.0f} warm")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls, 1k and 100k only")
    ap.add_argument("--ct-limit", type=int, default=0, metavar="FLOWS",
                    help="give the measured pod a per-endpoint conntrack limit (the agent's default is "
                         "8192; 0: none, as the test bed programs it)")
    ap.add_argument("--delivery-fill", action="store_true",
                    help="fill the delivery map as a node of a large cluster holds it: 200 more local pods "
                         "and ~1,000 other nodes' /26 blocks around the measured addresses (default: the "
                         "test bed's dozen entries, the LPM trie's best case)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/datapath.py needs root (BPF_PROG_TEST_RUN, network namespaces)", file=sys.stderr)
        return 2
    return run(args.quick, args.ct_limit, args.delivery_fill)


if __name__ == "__main__":
    sys.exit(main())
