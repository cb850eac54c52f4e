"""Pod churn: 1000 pods created, reached and deleted across the lab's three nodes, and nothing of
them left behind — no veth or other link in a node's namespace, no pod namespace, no map entry, no
IP lease, Segment or IPBlock, no pin under bpffs, no conntrack entry on the pod's own node and
none left expired on its peers' after a GC pass — and no growth trend in the agents' memory.

A cycle is one pod created, Running, reached and deleted. Pods come and go in waves of ``WAVE``
(applied at once, deleted at once), spread evenly over the nodes, so that the kubelet and the
agents work on many pods at once. Every pod is reached, both families: an ICMP echo to its IPv4 address from a client
pod on another node (SRv6 across the fabric) and one to its IPv6 address from a client pod on its
own node, each answered by the pod's own stack. The churned pods run no process (no ports), so a
cycle costs what the network costs — namespace, CNI ADD and DEL, the agents' maps, the store —
and not a server's start. They belong to a network of their own, so its conntrack entries and
leases are told apart from the rest of the shared lab's. They share the clients' labels, so the
one Segment they need exists before the churn: Segments are allocated per label set and not
collected (a label set per wave would leave one Segment per wave behind).
"""

from __future__ import annotations

import ipaddress
import json
import os
import select
import socket
import statistics
import struct
import subprocess
import time
import uuid

from lace import netlink
from lace.lab.kubelet import sandbox_netns
from lace.store.config import lab_store, open_store

from .conftest import LabHandle, ips, network, pod, wait_for

NODES = ("worker-1", "worker-2", "worker-3")
CYCLES = 1000
WAVE = 100
LABELS = {"app": "churn"}
#: maps whose entries a pod makes: every one must be back at its count before the churn
POD_MAPS = ("devices", "routing", "delivery", "delivery-exact", "veth", "services", "backends", "policy",
            "policy-exact", "segment", "prefix-segment", "probes")
#: RSS an agent may gain over the second half of the churn (its least-squares trend over the
#: samples after waves 5 to 10: 500 cycles, ~170 pods on each node). The first waves grow the
#: allocators' arenas to their working size: in runs here +8 MiB by the end of wave 1 and another
#: ~4 by wave 5, slowing down; the second half's trend then added 0.8 to 2.8 MiB (two runs, load
#: average 20-30 on the 2-core VM). That is the allocators settling, not the agent holding more:
#: over 300 cycles its Python heap (sys.getallocatedblocks) moved by 60 blocks of 260,000, its
#: malloc'd memory in use (glibc malloc_stats) by 9 KB, and no list, dict or set of it grew.
#: 4 MiB over the second half still catches a leak of ~8 KiB a cycle (25 KiB a pod on its node).
RSS_GROWTH_MAX = 4 * 2**20


def node_netns(lab: LabHandle, node: str) -> str:
    return f"lace-{lab.name}-{node}"


def links(lab: LabHandle, node: str) -> set[str]:
    out = subprocess.run(["ip", "-n", node_netns(lab, node), "-o", "link", "show"],
                         capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def pins(pin_root: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), pin_root) for d, _, files in os.walk(pin_root) for f in files}


def pod_namespaces(lab: LabHandle) -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {n.split()[0] for n in out.splitlines() if n.startswith(f"lace-{lab.name}-p-")}


def metrics(lab: LabHandle, node: str) -> dict:
    _, out, _ = lab.lace("exec", "--node", node, "--", "node", "metrics", "-o", "json")
    return json.loads(out)


def map_entries(lab: LabHandle, node: str) -> dict[str, int]:
    return {s["labels"]["map"]: int(s["value"]) for s in metrics(lab, node)["lace_map_entries"]["samples"]
            if s["labels"]["map"] in POD_MAPS}


def store_items(lab: LabHandle, kind: str) -> list[dict]:
    _, out, _ = lab.lace("get", kind, "-A", "-o", "json")
    return json.loads(out)["items"]


def rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_all(netns: str, addrs: list[str], timeout: float = 10.0) -> dict[str, int]:
    """ICMP echo from ``netns`` to every address of ``addrs`` (one family): how many requests each
    took to be answered; an address missing from the result never was. Unanswered ones are asked
    again every 200 ms until ``timeout``."""
    v6 = ":" in addrs[0]
    with netlink.netns.entered(netns):   # the socket stays in the pod's namespace
        sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_RAW,
                             socket.IPPROTO_ICMPV6 if v6 else socket.IPPROTO_ICMP)
    ident = int.from_bytes(os.urandom(2), "big")
    request = 128 if v6 else 8
    reply = 129 if v6 else 0
    wanted = {ipaddress.ip_address(a).compressed for a in addrs}
    sent: dict[str, int] = {}
    answered: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    try:
        while (missing := wanted - answered.keys()) and time.monotonic() < deadline:
            for addr in missing:
                sent[addr] = sent.get(addr, 0) + 1
                head = struct.pack("!BBHHH", request, 0, 0, ident, sent[addr])
                # the kernel sums ICMPv6 (it needs the addresses); ICMPv4 carries its own sum
                check = 0 if v6 else _checksum(head + b"lace-churn")
                sock.sendto(struct.pack("!BBHHH", request, 0, check, ident, sent[addr]) + b"lace-churn", (addr, 0))
            until = time.monotonic() + 0.2
            while (left := until - time.monotonic()) > 0 and select.select([sock], [], [], left)[0]:
                data, peer = sock.recvfrom(2048)
                icmp = data if v6 else data[(data[0] & 0x0F) * 4:]
                src = ipaddress.ip_address(peer[0].split("%")[0]).compressed
                if len(icmp) >= 8 and icmp[0] == reply and struct.unpack("!H", icmp[4:6])[0] == ident \
                        and src in wanted:
                    answered.setdefault(src, sent[src])
    finally:
        sock.close()
    return answered


def ct_entries(lab: LabHandle, node: str) -> list[dict]:
    _, out, _ = lab.lace("exec", "--node", node, "--", "node", "-n", "ct", "list", "all", "-o", "json")
    return json.loads(out)["entries"]


def test_pod_churn_leaves_nothing_behind(lab: LabHandle, ns: str):
    net = f"churn{uuid.uuid4().hex[:6]}"
    lab.apply([network(net, "10.62.0.0/16", "fd62::/64")])
    clients = {node: f"client-{i + 1}" for i, node in enumerate(NODES)}
    # the waits read the store itself: a CLI call per poll would cost the 2-core VM a third of a core
    store = open_store(lab_store(lab.dir))

    def pods() -> dict[str, dict]:
        return {p["metadata"]["name"]: p for p in store.list("pods", ns).items}
    try:
        # a client on every node: it reaches the churned pods, and it makes the network's address
        # blocks on every node and the churned pods' Segment exist before the baseline
        lab.apply([pod(name, ns, node, net, labels=LABELS, tcp=(), udp=()) for node, name in clients.items()])
        ps = lab.wait(ns, list(clients.values()))
        client_ns = {node: sandbox_netns(lab.name, ps[name]["metadata"]["uid"]) for node, name in clients.items()}
        client_ips = {ipaddress.ip_address(ip).compressed for name in clients.values() for ip in ips(ps[name])}
        net_id = json.loads(lab.lace("get", "networks", net, "-o", "json")[1])["status"]["id"]
        for i, node in enumerate(NODES):   # the network works before the baseline is taken
            peer = ps[clients[NODES[(i + 1) % 3]]]
            assert echo_all(client_ns[node], [ips(peer)[0]]), f"{clients[node]} cannot reach its neighbour"

        pin_roots = {node: lab.node(node)["pinRoot"] for node in NODES}
        pids = {node: lab.node(node)["agentPid"] for node in NODES}

        def leases() -> list[str]:
            return sorted(x["spec"]["ip"] for x in store_items(lab, "ipleases") if x["spec"]["pod"].startswith(f"{ns}/"))

        def names(kind: str) -> list[str]:
            return sorted(x["metadata"]["name"] for x in store_items(lab, kind))

        base = {"links": {node: links(lab, node) for node in NODES},
                "pins": {node: pins(pin_roots[node]) for node in NODES},
                "maps": {node: map_entries(lab, node) for node in NODES},
                "netns": pod_namespaces(lab), "leases": leases(),
                "segments": names("segments"), "ipblocks": names("ipblocks")}
        rss_start = {node: rss(pid) for node, pid in pids.items()}
        rss_waves: list[dict[str, int]] = []   # after each wave is gone
        asked_again = 0
        t0 = time.monotonic()
        for w in range(CYCLES // WAVE):
            t_wave = time.monotonic()
            wave = [f"c{w:02d}-{i:03d}" for i in range(WAVE)]
            home = {name: NODES[i % 3] for i, name in enumerate(wave)}
            lab.apply([pod(name, ns, home[name], net, labels=LABELS, tcp=(), udp=()) for name in wave])

            def running() -> dict | None:
                p = pods()
                return p if all(p.get(n, {}).get("status", {}).get("phase") == "Running" for n in wave) else None
            ps = wait_for(running, f"wave {w}: {WAVE} pods Running", 180, 0.2)
            t_running = time.monotonic()
            # IPv4 from the client on another node, IPv6 from the client on the pod's own node
            for i, node in enumerate(NODES):
                here = [ips(ps[n]) for n in wave if home[n] == node]
                for src, addrs in ((client_ns[NODES[(i + 2) % 3]], [v4 for v4, _ in here]),
                                   (client_ns[node], [v6 for _, v6 in here])):
                    got = echo_all(src, addrs)
                    missing = {ipaddress.ip_address(a).compressed for a in addrs} - got.keys()
                    assert not missing, f"wave {w}: no answer from {sorted(missing)} (pods on {node})"
                    asked_again += sum(n > 1 for n in got.values())
            t_reached = time.monotonic()
            # deleted gracefully: the kubelet removes a pod's object once it has torn the pod down
            # (CNI DEL, its namespace), so "gone" is the end of the whole cycle
            lab.lace("delete", "pods", *wave, "-n", ns, "--grace-period", "1", "--wait=false")
            wait_for(lambda: not set(wave) & set(pods()), f"wave {w}: {WAVE} pods gone", 180, 0.2)
            print(f"wave {w}: Running after {t_running - t_wave:.1f} s, reached in {t_reached - t_running:.1f} s, "
                  f"gone after {time.monotonic() - t_reached:.1f} s")
            rss_waves.append({node: rss(pid) for node, pid in pids.items()})
        churn_s = time.monotonic() - t0
        print(f"\n{CYCLES} cycles in {churn_s:.1f} s ({CYCLES / churn_s:.1f}/s); {2 * CYCLES} echoes, "
              f"{asked_again} answered only when asked again")
        assert {node: lab.node(node)["agentPid"] for node in NODES} == pids, "an agent restarted during the churn"

        def left() -> dict:
            out: dict = {}
            for node in NODES:
                if extra := links(lab, node) - base["links"][node]:
                    out[f"{node} links"] = sorted(extra)
                if extra := pins(pin_roots[node]) - base["pins"][node]:
                    out[f"{node} pins"] = sorted(extra)
                now = map_entries(lab, node)
                if changed := {m: (base["maps"][node][m], n) for m, n in now.items() if n != base["maps"][node][m]}:
                    out[f"{node} map entries (before, after)"] = changed
            if extra := pod_namespaces(lab) - base["netns"]:
                out["pod namespaces"] = sorted(extra)
            if (now_leases := leases()) != base["leases"]:
                out["leases"] = sorted(set(now_leases) - set(base["leases"]))
            for kind in ("segments", "ipblocks"):
                if (now_names := names(kind)) != base[kind]:
                    out[kind] = sorted(set(now_names) ^ set(base[kind]))
            return out

        # deletion ends asynchronously (CNI DEL, the other agents' watches): wait for a clean state
        deadline = time.monotonic() + 30
        while found := left():
            assert time.monotonic() < deadline, f"left behind by {CYCLES} cycles: {found}"
            time.sleep(1)

        rss_end = {node: rss(pid) for node, pid in pids.items()}
        rss_grows = []
        half = len(rss_waves) // 2
        for node in NODES:
            series = [s[node] for s in rss_waves] + [rss_end[node]]
            # the trend over the second half: a least-squares slope, so that one noisy sample
            # neither fails the test nor hides a leak
            tail = series[half - 1:]
            trend = statistics.linear_regression(range(len(tail)), tail).slope * (len(tail) - 1)
            print(f"{node} agent RSS: start {rss_start[node] / 2**20:.1f} MiB, after wave 1 {series[0] / 2**20:.1f}, "
                  f"after wave {half} {series[half - 1] / 2**20:.1f}, end {rss_end[node] / 2**20:.1f}; "
                  f"second half's trend {trend / 2**10:+.0f} KiB")
            if trend >= RSS_GROWTH_MAX:
                rss_grows.append(f"{node}: {[round(x / 2**20, 2) for x in [rss_start[node]] + series]} MiB")
        # conntrack: a pod's own node forgets the pod's entries at CNI DEL, so none of a churned
        # address may be left on the node whose block it comes from. Its peers' nodes keep theirs
        # until they time out (a replied ICMP flow: 180 s) — the datapath cannot know the peer is
        # gone — and a GC pass removes every one that has: none may be left expired.
        blocks = {node: [ipaddress.ip_network(b["spec"]["cidr"]) for b in store_items(lab, "ipblocks")
                         if b["spec"]["network"] == net and b["spec"]["node"] == node] for node in NODES}

        def home(addr: str) -> str:
            return next(n for n, nets in blocks.items() if any(ipaddress.ip_address(addr) in x for x in nets))
        held = 0
        for node in NODES:
            lab.lace("exec", "--node", node, "--", "node", "ct", "gc", "all")
            churned = [e for e in ct_entries(lab, node) if e["network"] == net_id
                       and {e["saddr"], e["daddr"]} - client_ips]
            own = [e for e in churned if any(home(a) == node for a in {e["saddr"], e["daddr"]} - client_ips)]
            assert not own, f"{node} keeps {len(own)} conntrack entries of its own deleted pods: {own[:3]}"
            # expired for more than 5 s when listed: expired before the GC pass, which missed it
            expired = [e for e in churned if e["expires_in_s"] < -5]
            assert not expired, f"{node}: GC left {len(expired)} expired entries of churned pods: {expired[:3]}"
            held += len(churned)
        print(f"conntrack: no entry of a deleted pod on its own node; {held} entries of the last waves' echoes "
              f"still held (not expired) on the clients' nodes")
        assert not rss_grows, f"agent RSS grows over the churn (start, then after each wave): {rss_grows}"

    finally:
        store.close()
        lab.lace("delete", "pods", "--all", "-n", ns, "--grace-period", "0", "--ignore-not-found", check=False)
        lab.lace("delete", "network", net, "--ignore-not-found", check=False)
