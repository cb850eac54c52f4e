#!/usr/bin/env python3
"""NetworkPolicy resolution and programming time, and the datapath's per-packet cost with a big
policy map against a small one, in one run.

Control plane: 1,000 pods over 200 namespaces (5 pods each, app/tier labels, named ports), 500
policies (same-namespace allows, namespaceSelector AND podSelector, matchExpressions, ipBlocks with
except, named ports, endPort ranges, egress with DNS). Measures a full resolution (cold resolver)
and the node's assembly, writing every entry into the real policy maps (the hash and the LPM
trie, split as the agent splits them), then one policy changed: re-resolution with the warm cache,
assembly, the agent's pure diff against what it last wrote, and the map writes ("incremental change
programmed").
Datapath: BPF_PROG_TEST_RUN of the pod veth program, new TCP flows (egress + ingress lookups) and
warm policy drops, with 16 policy entries and with 16k under the measured segments, net of a pass
program in the same run. ``--fill ports`` (the default) fills with exact-port entries, the common
shape of a rule with ports; ``--fill mixed`` gives the measured segments every kind of entry (exact
ports, whole protocols, any protocol, port ranges), so a drop probes every kind, the trie of port
blocks included.

Run as root after `make install`:  .venv/bin/python bench/policy.py [--quick] [--fill ports|mixed]
Targets: full resolution < 2 s, incremental change programmed < 100 ms, datapath growth < 10%.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lace.agent.diff import diff  # noqa: E402
from lace.datapath.common import Direction  # noqa: E402
from lace.datapath.policy import POLICY_MAPS, policy_keys, policy_maps  # noqa: E402
from lace.policy import ContainerPort, NamespaceInfo, PodInfo, PolicyInputs, Resolver  # noqa: E402
from lace.policy.ids import normalise_cidr  # noqa: E402
from lace.policy.program import node_segments  # noqa: E402
from lace.policy.resolve import cidrs_of  # noqa: E402
from lace.policy.parse import parse_policy  # noqa: E402

NODES = [f"worker-{i}" for i in range(1, 11)]
APPS = ("web", "api", "db", "cache", "queue")


def synthetic(n_pods: int = 1000, n_ns: int = 200, n_policies: int = 500) -> PolicyInputs:
    inputs = PolicyInputs()
    seg_ids: dict[tuple, int] = {}

    def seg(key: tuple) -> int:
        return seg_ids.setdefault(key, 256 + len(seg_ids))

    for i in range(n_ns):
        ns = f"ns{i}"
        inputs.namespaces[ns] = NamespaceInfo(ns, tuple(sorted({"team": f"t{i % 20}", "env": ("prod", "dev")[i % 2]}.items())))
    ports = (ContainerPort(8080, 6, "http"), ContainerPort(9090, 6, "metrics"), ContainerPort(5353, 17, "dns"))
    for j in range(n_pods):
        ns = f"ns{j % n_ns}"
        labels = tuple(sorted({"app": APPS[(j // n_ns) % len(APPS)], "tier": ("fe", "be")[j % 2]}.items()))
        ip4 = ipaddress.ip_address(f"10.{j >> 16 & 255}.{j >> 8 & 255}.{j & 255}") + 0x0A000000 * 0
        inputs.pods.append(PodInfo(ns, f"p{j}", labels, "default", 1, seg(("default", ns, labels)),
                                   (ipaddress.ip_address(f"10.244.{j >> 8}.{j & 255}"),), NODES[j % len(NODES)], ports))
        del ip4
    for k in range(n_policies):
        inputs.policies.append(parse_policy(policy(k, n_ns)))
    for p in inputs.policies:
        for c in cidrs_of(p):
            inputs.cidr_segments.setdefault(normalise_cidr(c), seg(("cidr", c)))
    return inputs


def policy(k: int, n_ns: int, variant: int = 0) -> dict:
    ns = f"ns{k % n_ns}"
    app = APPS[k % len(APPS)]
    kind = k % 5
    if kind == 0:     # same namespace, one app, numeric and named ports
        spec = {"podSelector": {"matchLabels": {"app": app}}, "ingress": [{"from": [{"podSelector": {}}],
                "ports": [{"port": 8080 + variant}, {"port": "metrics"}]}]}
    elif kind == 1:   # namespaceSelector AND podSelector, matchExpressions
        spec = {"podSelector": {"matchLabels": {"tier": "be"}}, "ingress": [{"from": [
            {"namespaceSelector": {"matchLabels": {"team": f"t{k % 20}"}},
             "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}}],
            "ports": [{"port": "http"}]}]}
    elif kind == 2:   # ipBlock with except, endPort range
        spec = {"podSelector": {"matchLabels": {"app": app}}, "ingress": [{"from": [
            {"ipBlock": {"cidr": f"192.168.{k % 250}.0/24", "except": [f"192.168.{k % 250}.128/25"]}}],
            "ports": [{"port": 30000, "endPort": 30100 + variant}]}]}
    elif kind == 3:   # egress: DNS anywhere plus the namespace's own pods
        spec = {"podSelector": {"matchLabels": {"tier": "fe"}}, "policyTypes": ["Egress"], "egress": [
            {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"podSelector": {"matchLabels": {"tier": "be"}}}]}]}
    else:             # OR of namespaces by env, named egress port
        spec = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                       "podSelector": {"matchLabels": {"app": app}}}]}],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": f"t{k % 20}"}}}],
                            "ports": [{"port": "http"}]}]}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"pol{k}", "namespace": ns, "resourceVersion": f"{k}-{variant}"}, "spec": spec}


def control_plane(quick: bool) -> dict[str, float]:
    from lace.datapath.testbed import Testbed
    inputs = synthetic()
    node = NODES[0]
    local = node_segments(inputs, node)
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    r = Resolver()
    res = r.resolve(inputs)
    t1 = time.perf_counter()
    entries, pr = res.entries(local)
    all_entries, pr_all = res.entries(None)
    t2 = time.perf_counter()
    out["full resolve (500 policies)"] = (t1 - t0) * 1000
    out["assemble one node"] = (t2 - t1) * 1000
    out["entries node"] = len(entries)
    out["entries cluster"] = len(all_entries)
    out["segments"] = len(res.world.segments)
    dp = Testbed()           # the real objects in a throw-away pin root: the real policy maps
    maps = {name: dp.m(name) for name in POLICY_MAPS}
    try:
        t3 = time.perf_counter()
        split = policy_maps(all_entries)     # worst case: one node holds every segment's entries
        for name, entries in split.items():
            for k, v in entries.items():
                maps[name].update(k, v)
        t4 = time.perf_counter()
        out["program full (all entries)"] = (t4 - t3) * 1000
        # the agent diffs against what it last wrote (lace.agent.datapath: the shadow of each map
        # it owns) and reads the kernel back only on its periodic resync, timed apart below
        shadow = {name: dict(entries) for name, entries in split.items()}
        times = []
        changed = 0
        for variant in range(1, 4 if quick else 8):
            t5 = time.perf_counter()
            inputs.policies[0] = parse_policy(policy(0, 200, variant))   # one policy changed
            res2 = r.resolve(inputs)
            want, _ = res2.entries(None)
            changed = 0
            for name, wanted in policy_maps(want).items():
                ch = diff(name, wanted, shadow[name])
                for k in ch.deletes:
                    maps[name].delete(k)
                    shadow[name].pop(k, None)
                for k, v in ch.updates.items():
                    maps[name].update(k, v)
                    shadow[name][k] = v
                changed += len(ch.updates) + len(ch.deletes)
            times.append((time.perf_counter() - t5) * 1000)
            assert r.last_resolved == 1, r.last_resolved
        out["incremental change programmed"] = statistics.median(times)
        t6 = time.perf_counter()
        for name, m in maps.items():
            have = dict(m.entries())     # what the agent's resync reads (NodeDatapath.read)
            assert not diff(name, shadow[name], have), f"the shadow is what the kernel holds ({name})"
        out["periodic resync (dump + diff)"] = (time.perf_counter() - t6) * 1000
        out["changed entries"] = changed
    finally:
        dp.close()
    return out


def fill_policy(dp, a, b, total: int, mixed: bool) -> int:
    """Allow entries under the measured segments (a's egress, b's ingress) for peers that are not
    the measured ones, until the policy maps hold ``total`` entries (the two markers and two allows
    of the measured flow count); returns how many they hold. ``mixed`` cycles every kind of entry
    for both segments: exact ports, a whole protocol, any protocol, a port range (two port blocks),
    then four exact ports again."""
    written, i = 4, 0
    while written < total:
        subj, d = (a.segment, Direction.EGRESS) if i % 2 else (b.segment, Direction.INGRESS)
        peer = 20_000 + i // 4
        kind = (i // 2) % 8 if mixed else 0
        if kind == 1:
            kw: dict = {"proto": 6}
        elif kind == 2:
            kw = {"proto": None}
        elif kind == 3 and total - written >= 2:
            first = 4096 + 64 * (i % 512)
            kw = {"proto": (6, 17)[i // 2 % 2], "port": first, "end_port": first + 47}   # 32 + 16 ports
        else:
            kw = {"proto": (6, 17)[i % 4 // 2], "port": 1000 + i % 7}
        dp.allow(subj, peer, d, **kw)
        written += len(policy_keys(subj, peer, d, **kw))
        i += 1
    return sum(len(dp.m(name)) for name in POLICY_MAPS)


def datapath(quick: bool, fill: str = "ports") -> dict[int, dict[str, float]]:
    from scapy.layers.inet import TCP
    from bench.datapath import load_pass_program, measure
    from lace.datapath.testbed import Testbed

    calls = 300 if quick else 1500
    rounds = 3 if quick else 5
    dp = Testbed()
    passobj, base = load_pass_program()
    results: dict[int, dict[str, float]] = {}
    try:
        a, b = dp.pods["a"], dp.pods["b"]
        ctx_a = dp.skb_ctx(a.ifindex)
        for total in (16, 16_384):
            dp.reset()
            dp.select(a.segment, Direction.EGRESS)
            dp.select(b.segment, Direction.INGRESS)
            dp.allow(a.segment, b.segment, Direction.EGRESS, proto=6, port=80)
            dp.allow(b.segment, a.segment, Direction.INGRESS, proto=6, port=80)
            # the rest share the measured subjects, so the lookups meet populated maps
            held = fill_policy(dp, a, b, total, fill == "mixed")
            deny = bytes(dp.l3(a, b.ipv4, 4) / TCP(sport=50002, dport=81, flags="S"))
            samples: dict[str, list[float]] = {k: [] for k in ("pass warm", "pass once", "new flow", "policy drop")}
            flow = 0
            for _ in range(rounds):
                news = []
                for _ in range(calls):
                    flow += 1
                    news.append(bytes(dp.l3(a, b.ipv4, 4) / TCP(sport=1 + flow % 60000, dport=80, flags="S")))
                few = max(10, calls // 20)
                samples["pass warm"].append(measure(base, [deny] * few, ctx_a, dp.netns, 100))
                samples["policy drop"].append(measure(dp.prog_pod, [deny] * few, ctx_a, dp.netns, 100))
                samples["pass once"].append(measure(base, news, ctx_a, dp.netns))
                samples["new flow"].append(measure(dp.prog_pod, news, ctx_a, dp.netns))
                dp.ring.consume()
                dp.events.clear()
                dp.m("ct-tcp-v4").clear()
            med = {k: statistics.median(v) for k, v in samples.items()}
            results[total] = {"new flow": med["new flow"] - med["pass once"],
                              "policy drop": med["policy drop"] - med["pass warm"], "entries": held}
    finally:
        passobj.close()
        dp.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-datapath", action="store_true", help="control plane only (no root needed but the map)")
    ap.add_argument("--fill", choices=("ports", "mixed"), default="ports",
                    help="the datapath rows' filler entries: exact ports (default), or every kind of entry "
                         "(exact ports, whole protocols, any protocol, port ranges)")
    ap.add_argument("--no-control-plane", action="store_true", help="the datapath rows only")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/policy.py needs root (BPF maps, BPF_PROG_TEST_RUN)", file=sys.stderr)
        return 2
    if not args.no_control_plane:
        cp = control_plane(args.quick)
        print("policy control plane: 1,000 pods, 200 namespaces, 500 policies, 10 nodes")
        print(f"  segments {cp['segments']:.0f}, entries cluster-wide {cp['entries cluster']:,.0f}, "
              f"on one node {cp['entries node']:,.0f}")
        for k, target in (("full resolve (500 policies)", "< 2000"), ("assemble one node", ""),
                          ("program full (all entries)", ""), ("incremental change programmed", "< 100"),
                          ("periodic resync (dump + diff)", "")):
            print(f"  {k:<32}{cp[k]:>9.1f} ms   {('target ' + target + ' ms') if target else ''}")
        print(f"  (incremental: 1 policy re-resolved, assembled over all {cp['entries cluster']:,.0f} entries, "
              f"diffed against what the agent last wrote, {cp['changed entries']:.0f} entries written)")
    if args.no_datapath:
        return 0
    dp = datapath(args.quick, args.fill)
    print(f"datapath ns/packet net of a pass program (BPF_PROG_TEST_RUN, medians; filler: {args.fill}, "
          f"{dp[16]['entries']:.0f} and {dp[16_384]['entries']:,.0f} entries in the policy maps)")
    print(f"  {'path':<14}{'16 entries':>12}{'16k entries':>13}{'growth':>9}   target < 10%")
    for p in ("new flow", "policy drop"):
        a, b = dp[16][p], dp[16_384][p]
        print(f"  {p:<14}{a:>12.0f}{b:>13.0f}{(b / a - 1) * 100 if a > 0 else float('nan'):>8.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
