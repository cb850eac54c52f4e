#!/usr/bin/env python3
"""Pod-to-pod performance in a real lab, side by side with a bare veth pair in the same run.

For each path — a bare veth pair between two namespaces (the baseline), two pods on one node, two
pods on different nodes (SRv6 across the fabric) — TCP throughput (iperf3), UDP 64-byte packet rate
(iperf3) and TCP round-trip latency (sockperf ping-pong), client and server pinned to different
CPUs, medians of interleaved rounds, and each path's ratio to the baseline. In the same rounds, with
the same commands, the kernel's own paths on the cross-node shape in namespaces the bench builds
(pod -> node -> fabric bridge -> node -> pod, lace's pod MTU): "kernel plain", plain IPv4/IPv6
routing between the two nodes, the kernel forwarding the same packets without encapsulation; and
"kernel SRv6", the kernel's SRv6 with lace's 40 bytes of overhead (``encap seg6 mode encap.red`` to
the other node's SID, ``seg6local End.DX4``/``End.DX6`` there). A kernel path the kernel refuses
(no seg6local, say) is reported as not measured, and the rest still runs. Then the time from
applying a pod to the first packet it answers (ICMP echo from a pod on another node).

First, with no pod yet, the idle lab (three nodes then): every lab process's CPU share over
--idle-window seconds, from the moment every agent reports healthy.

Then kubelet probes. Round trip: a podserver pod of an isolated network (``probed``, 10.77.0.0/16)
and one of the default network on worker-1, each with an httpGet readiness probe on a named port;
from worker-1's host namespace in its kubelet cgroup (as the node's prober), --probe-rtts rounds of
an httpGet probe (connect, GET /healthz with Connection: close, read the answer, close) and a
tcpSocket probe (connect, close) to each — the isolated pod at its probe address (``status.probeIPs``),
the other at its pod IP — interleaved; medians, p90 and the ratio. Rate: --probe-pods pods of the
isolated network on worker-1 with httpGet readiness and liveness probes every second; once all are
Ready, the probe runs per second over --probe-window seconds as the lab kubelet counts them
(``<lab>/kubelet/probe-stats.json``, lace.lab.probing.ProbeStats) with the CPU share (utime + stime
from /proc, % of one core) of worker-1's agent, the lab kubelet (it serves every node) and
worker-1's prober, beside the same shares idle before the pods. Every pod and the network are
deleted afterwards, and the lab torn down.

Run as root after `make install`:
    .venv/bin/python bench/lab.py [--rounds N] [--seconds S] [--pods N]
                                  [--only idle|paths|first-packet|probes] [--idle-window S]
                                  [--paths same,cross,plain,srv6] [--probe-rtts N] [--probe-pods N]
                                  [--probe-window S]
(--paths: the paths beside the bare veth; with --only paths and no lab path, no lab is built.)
Everything the bench makes goes at the end, after a failure, Ctrl-C or SIGTERM too.
Targets: same node >= 0.97x TCP, >= 0.90x packet rate and <= 1.05x round trip of bare veth; cross
node >= kernel plain routing in TCP and packet rate, <= it in round trip;
idle agents and lab kubelet under 0.2 % of a core each; pod creation to first packet: median
under 100 ms and p90 under 150 ms; an httpGet probe to a pod of an isolated network
<= 1.1x the round trip of the same probe to a default-network pod; 2 probes/s per pod at a 1 s period
(200/s for 100 pods) with no failures.
"""

from __future__ import annotations

import argparse
import io
import ipaddress
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from lace import netlink, nsenter  # noqa: E402
from lace.cli.main import main as lace_main  # noqa: E402
from lace.store import STORE_FILE  # noqa: E402

LAB = "bench"
BARE_A, BARE_B = f"lace-{LAB}-bare-a", f"lace-{LAB}-bare-b"
BARE_IP_A, BARE_IP_B = "192.168.250.1", "192.168.250.2"
MTU = 1460


class Bench:
    """A lab (``lab``, under the state directory ``state``) driven through the lace CLI in-process."""

    def __init__(self, state: str, lab: str = LAB) -> None:
        self.env = dict(os.environ, LACE_STATE_DIR=state, LACE_LAB=lab, NO_COLOR="1")
        self.dir = os.path.join(state, "labs", lab)
        self.procs: list[subprocess.Popen] = []

    def lace(self, *argv: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        rc = int(lace_main(list(argv), self.env, stdout=out, stderr=err, stdin=io.StringIO("")))
        if rc != 0:   # what it printed too: lace status says there which check failed
            raise SystemExit(f"lace {' '.join(argv)} failed:\n{out.getvalue()}{err.getvalue()}")
        return out.getvalue()

    def apply(self, docs: list[dict]) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(docs, f)
        try:
            self.lace("apply", "-f", f.name)
        finally:
            os.unlink(f.name)

    def pods(self) -> dict[str, dict]:
        return {p["metadata"]["name"]: p for p in json.loads(self.lace("get", "pods", "-o", "json"))["items"]}

    def wait(self, names: list[str], timeout: float = 60) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            ps = self.pods()
            if all(ps.get(n, {}).get("status", {}).get("phase") == "Running" for n in names):
                return ps
            if time.monotonic() > deadline:
                raise SystemExit(f"pods {names} not running")
            time.sleep(0.05)

    def netns_of(self, pod: str) -> str:
        from lace.lab.cluster import pod_netns
        return pod_netns(os.path.join(self.env["LACE_STATE_DIR"], "labs", LAB), "default", pod)

    def run_in(self, netns: str, argv: list[str], cpu: int, background: bool = False, timeout: float = 60):
        fd = os.open(netlink.netns.path(netns), os.O_RDONLY | os.O_CLOEXEC)

        def enter() -> None:   # between fork and exec
            nsenter.setns(fd)
        cmd = ["taskset", "-c", str(cpu)] + argv
        try:
            if background:
                p = subprocess.Popen(cmd, preexec_fn=enter, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.procs.append(p)
                return p
            return subprocess.run(cmd, preexec_fn=enter, capture_output=True, text=True, timeout=timeout)
        finally:
            os.close(fd)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []


def bare_pair() -> None:
    for ns in (BARE_A, BARE_B):
        netlink.netns.create(ns)
    netlink.veth_pair("bare0", "bare1", netns=BARE_A, peer_netns=BARE_B, mtu=MTU)
    netlink.add_address("bare0", f"{BARE_IP_A}/24", netns=BARE_A)
    netlink.add_address("bare1", f"{BARE_IP_B}/24", netns=BARE_B)
    for ns, dev in ((BARE_A, "bare0"), (BARE_B, "bare1")):
        netlink.set_up("lo", netns=ns)
        netlink.set_up(dev, netns=ns)
    netlink.wait_link("bare0", BARE_A, timeout=5, up=True)   # carrier once both ends are up


# The kernel's own paths on the lab's shape, pod -> node -> fabric bridge -> node -> pod, in namespaces
# of their own (lace-bench-<kind>-{pod1,node1,wire,node2,pod2}; "wire" holds the bridge, L2 only):
# node i's uplink eth0 fd5f:ff::i/64 198.19.0.i/24 MTU 1500 into the bridge, forwarding on; its pod's
# veth eth0 198.19.i.2/24 fd5f:i::2/64 MTU 1460 (lace's pod MTU) with the default route via the
# node end (pod, .1 / ::1). Both kinds are built alike and differ only in the nodes' routes to the
# other node's pod:
#   plain  198.19.j.0/24 via 198.19.0.j, fd5f:j::/64 via fd5f:ff::j: the kernel forwarding the same
#          packets, no encapsulation;
#   srv6   the kernel's SRv6 with one outer IPv6 header (encap.red with one segment: no SRH, 40 bytes
#          like lace's): on the sending node `encap seg6 mode encap.red segs <SID of the other node>`,
#          the other node's locator fd5f:c000:j::/48 via fd5f:ff::j, and on the receiving node its
#          SIDs fd5f:c000:i::4 `End.DX4 nh4 <pod>` and fd5f:c000:i::6 `End.DX6 nh6 <pod>` (dev pod).
KERNEL_KINDS = {"plain": "kernel plain", "srv6": "kernel SRv6"}
PATHS = {"same": "same node", "cross": "cross node", **KERNEL_KINDS}
KERNEL_ROLES = ("pod1", "node1", "wire", "node2", "pod2")
K_BRIDGE, K_UPLINK, K_POD_NODE_END, K_POD_IF = "br0", "eth0", "pod", "eth0"


def kernel_netns(kind: str, role: str) -> str:
    return f"lace-{LAB}-{kind}-{role}"


def kernel_pod_ip(i: int, v6: bool = False) -> str:
    return f"fd5f:{i}::2" if v6 else f"198.19.{i}.2"


def _ip(ns: str, *argv: str) -> None:
    r = subprocess.run(["ip", "-n", ns, *argv], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip -n {ns} {' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")


def kernel_path(kind: str) -> str:
    """Build the ``kind`` (plain|srv6) topology; return pod2's IPv4 address (the server side).
    Raises RuntimeError, with what the kernel said, when a step is refused (e.g. no End.DX4)."""
    for role in KERNEL_ROLES:
        netlink.netns.delete(kernel_netns(kind, role))   # leftovers of an interrupted run
    ns = {role: kernel_netns(kind, role) for role in KERNEL_ROLES}
    for n in ns.values():
        netlink.netns.create(n)
        for scope in ("all", "default"):   # addresses unique by construction: no DAD wait
            netlink.sysctl(n, f"net.ipv6.conf.{scope}.accept_dad", 0)
        netlink.set_up("lo", n)
    for scope in ("all", "default"):
        netlink.sysctl(ns["wire"], f"net.ipv6.conf.{scope}.disable_ipv6", 1)
    netlink.bridge(K_BRIDGE, ns["wire"], mtu=MTU + 40)
    netlink.set_up(K_BRIDGE, ns["wire"])
    for i in (1, 2):
        node, pod = ns[f"node{i}"], ns[f"pod{i}"]
        netlink.sysctl(node, "net.ipv6.conf.all.forwarding", 1)
        netlink.sysctl(node, "net.ipv4.ip_forward", 1)
        netlink.veth_pair(K_UPLINK, f"up{i}", netns=node, peer_netns=ns["wire"], mtu=MTU + 40)
        netlink.set_master(f"up{i}", K_BRIDGE, ns["wire"])
        netlink.set_up(f"up{i}", ns["wire"])
        netlink.add_address(K_UPLINK, f"fd5f:ff::{i}/64", node)
        netlink.add_address(K_UPLINK, f"198.19.0.{i}/24", node)
        netlink.veth_pair(K_POD_NODE_END, K_POD_IF, netns=node, peer_netns=pod, mtu=MTU)
        netlink.add_address(K_POD_NODE_END, f"198.19.{i}.1/24", node)
        netlink.add_address(K_POD_NODE_END, f"fd5f:{i}::1/64", node)
        netlink.add_address(K_POD_IF, f"{kernel_pod_ip(i)}/24", pod)
        netlink.add_address(K_POD_IF, f"{kernel_pod_ip(i, True)}/64", pod)
        for n, dev in ((node, K_UPLINK), (node, K_POD_NODE_END), (pod, K_POD_IF)):
            netlink.set_up(dev, n)
        netlink.wait_link(K_UPLINK, node, timeout=5, up=True)
        netlink.wait_link(K_POD_IF, pod, timeout=5, up=True)
        netlink.add_route("0.0.0.0/0", netns=pod, via=f"198.19.{i}.1", dev=K_POD_IF)
        netlink.add_route("::/0", netns=pod, via=f"fd5f:{i}::1", dev=K_POD_IF)
    for i, j in ((1, 2), (2, 1)):
        node = ns[f"node{i}"]
        if kind == "plain":
            netlink.add_route(f"198.19.{j}.0/24", netns=node, via=f"198.19.0.{j}", dev=K_UPLINK)
            netlink.add_route(f"fd5f:{j}::/64", netns=node, via=f"fd5f:ff::{j}", dev=K_UPLINK)
            continue
        _ip(node, "sr", "tunsrc", "set", f"fd5f:ff::{i}")
        _ip(node, "-6", "route", "add", f"fd5f:c000:{j}::/48", "via", f"fd5f:ff::{j}", "dev", K_UPLINK)
        _ip(node, "route", "add", f"198.19.{j}.0/24", "encap", "seg6", "mode", "encap.red",
            "segs", f"fd5f:c000:{j}::4", "dev", K_UPLINK)
        _ip(node, "-6", "route", "add", f"fd5f:{j}::/64", "encap", "seg6", "mode", "encap.red",
            "segs", f"fd5f:c000:{j}::6", "dev", K_UPLINK)
        _ip(node, "-6", "route", "add", f"fd5f:c000:{i}::4/128", "encap", "seg6local", "action", "End.DX4",
            "nh4", kernel_pod_ip(i), "dev", K_POD_NODE_END)
        _ip(node, "-6", "route", "add", f"fd5f:c000:{i}::6/128", "encap", "seg6local", "action", "End.DX6",
            "nh6", kernel_pod_ip(i, True), "dev", K_POD_NODE_END)
    # both families, both ways, full-size packets with DF (1460 on the pods' veths; 1500 on the fabric)
    for v6, size in ((False, MTU - 28), (True, MTU - 48)):
        for src, dst in ((1, 2), (2, 1)):
            r = subprocess.run(["ip", "netns", "exec", ns[f"pod{src}"], "ping", "-6" if v6 else "-4", "-c", "1",
                                "-W", "2", "-M", "do", "-s", str(size), kernel_pod_ip(dst, v6)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"pod{src} -> pod{dst} {'IPv6' if v6 else 'IPv4'} ({size} B, DF) got no answer: "
                                   f"{(r.stdout.strip() or r.stderr.strip()).splitlines()[-1:]}")
    return kernel_pod_ip(2)


def kernel_cleanup() -> None:
    for kind in KERNEL_KINDS:
        for role in KERNEL_ROLES:
            try:
                netlink.netns.delete(kernel_netns(kind, role))
            except Exception as exc:   # the others still go
                print(f"cannot delete netns {kernel_netns(kind, role)}: {exc}", file=sys.stderr)


def tcp_gbps(b: Bench, client_ns: str, ip: str, seconds: float) -> float:
    r = b.run_in(client_ns, ["iperf3", "-c", ip, "-t", str(seconds), "-J"], cpu=0)
    return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def udp_kpps(b: Bench, client_ns: str, ip: str, seconds: float) -> float:
    r = b.run_in(client_ns, ["iperf3", "-c", ip, "-u", "-b", "0", "-l", "64", "-t", str(seconds), "-J"], cpu=0)
    s = json.loads(r.stdout)["end"]["sum"]
    return (s["packets"] - s["lost_packets"]) / s["seconds"] / 1e3


def rr_us(b: Bench, client_ns: str, ip: str, seconds: float) -> float:
    r = b.run_in(client_ns, ["sockperf", "ping-pong", "--tcp", "-i", ip, "-p", "11111", "-t", str(int(max(1, seconds)))], cpu=0)
    for line in r.stdout.splitlines():
        if "avg-latency" in line:   # sockperf reports half the round trip
            return 2 * float(line.split("avg-latency=")[1].split()[0])
    raise SystemExit(f"sockperf gave no latency: {r.stdout} {r.stderr}")


def icmp_echo_socket(netns: str) -> socket.socket:
    with netlink.netns.entered(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(0.001)
    return s


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def p90(values: list[float]) -> float:
    """The 90th percentile, interpolated between the closest ranks (statistics' 'inclusive')."""
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def lease_address(store: Any, since: int, pod: str, timeout: float = 30) -> ipaddress.IPv4Address:
    """The IPv4 address leased to ``pod`` (namespace/name) after store revision ``since``, from a
    watch: waiting costs the machine nothing the pod's start could use."""
    with store.watch(["ipleases"], since=since, timeout=timeout) as w:
        for ev in w:
            spec = ev.object["spec"]
            if ev.type == "ADDED" and spec["pod"] == pod and ":" not in spec["ip"]:
                return ipaddress.IPv4Address(spec["ip"])
    raise SystemExit(f"{pod} got no address in {timeout:.0f} s")


def first_answer_ms(store: Any, sock: socket.socket, doc: dict, timeout: float = 30) -> float:
    """Apply the pod ``doc``, then ping its IPv4 address every ms over ``sock`` (a raw ICMP socket,
    icmp_echo_socket) from the moment its IPLease is written (a store watch: waiting costs the
    machine nothing the pod's start could use): ms from the apply to the first echo it answers."""
    meta = doc["metadata"]
    ref = f"{meta['namespace']}/{meta['name']}"
    since = store.revision()
    t0 = time.monotonic()
    store.apply(doc)
    ip = str(lease_address(store, since, ref, timeout))
    seq = 0
    while True:
        seq += 1
        hdr = struct.pack("!BBHHH", 8, 0, 0, 0x4C41, seq)
        pkt = struct.pack("!BBHHH", 8, 0, _checksum(hdr + b"lace"), 0x4C41, seq) + b"lace"
        sock.sendto(pkt, (ip, 0))
        try:
            data, addr = sock.recvfrom(1024)
            if addr[0] == ip and data[20] == 0:
                return (time.monotonic() - t0) * 1000
        except socket.timeout:
            pass
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{ref} never answered")


def first_packet_ms(b: Bench, prober_ns: str, n: int) -> list[float]:
    """Pods on worker-1, one at a time: ms from the apply to the first ICMP echo each answers
    from ``prober_ns`` (first_answer_ms); each deleted after."""
    from lace.store import SqliteStore
    store = SqliteStore(os.path.join(b.env["LACE_STATE_DIR"], "labs", LAB, STORE_FILE))
    sock = icmp_echo_socket(prober_ns)
    out = []
    try:
        for i in range(n):
            name = f"fresh-{i}"
            doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                   "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "image": "x"}]}}
            out.append(first_answer_ms(store, sock, doc))
            store.delete("pods", name, "default")
    finally:
        sock.close()
        store.close()
    return out


# A kubelet's probes, as lace.lab.prober makes them: an httpGet probe connects, sends a GET with
# Connection: close, reads the status line, headers and body, and closes; a tcpSocket probe connects
# and closes. Each kind in a pass of its own, every round probing each target once, the order
# turning from round to round.
_PROBE_RTT = r"""
import json, socket, statistics, sys, time
targets, n, warmup = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def http(ip, port):
    s = socket.create_connection((ip, port), timeout=2)
    try:
        s.sendall(("GET /healthz HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: kube-probe/lace\r\nAccept: */*\r\n"
                   "Connection: close\r\n\r\n" % (ip, port)).encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit(f"{ip}:{port}: the connection closed in the headers")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        if head.split(None, 2)[1] != b"200":
            raise SystemExit(f"{ip}:{port}: {head[:60]!r}")
        length = next((int(l.split(b":", 1)[1]) for l in head.split(b"\r\n")[1:]
                       if l.lower().startswith(b"content-length:")), None)
        while length is not None and len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    finally:
        s.close()

def tcp(ip, port):
    socket.create_connection((ip, port), timeout=2).close()

out = {k: {} for k in targets}
order = list(targets.items())
for kind, fn in (("http", http), ("tcp", tcp)):
    res = {k: [] for k in targets}
    for i in range(warmup + n):
        for k, (ip, port) in (order if i % 2 else order[::-1]):   # A B B A A B ...: each follows each alike
            t0 = time.perf_counter_ns()
            fn(ip, port)
            if i >= warmup:
                res[k].append(time.perf_counter_ns() - t0)
    for k, v in res.items():
        v.sort()
        out[k][kind] = {"median": statistics.median(v) / 1000, "p90": v[int(len(v) * 0.9)] / 1000}
print(json.dumps(out))
"""

PROBE_NET = "probed"
PROBE_PORT = 8080


def in_kubelet(b: Bench, node: str, argv: list[str], cpu: int, timeout: float = 300):
    """Run argv on the node's host (its namespace) as the node's kubelet (its cgroup) does."""
    from lace.lab import topology
    enter = topology.entering(topology.netns_name(LAB, node),
                              topology.kubelet_cgroup(topology.node_cgroup(LAB, node)))
    return subprocess.run(["taskset", "-c", str(cpu)] + argv, preexec_fn=enter, capture_output=True,
                          text=True, timeout=timeout)


def probed_pod(name: str, net: str | None, liveness: bool = False) -> dict:
    """A podserver on worker-1 with an httpGet /healthz readiness probe (and liveness) every second."""
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1}
    container = {"name": "c", "image": "lace/podserver", "ports": [{"name": "http", "containerPort": PROBE_PORT}],
                 "readinessProbe": probe}
    if liveness:
        container["livenessProbe"] = probe
    meta: dict = {"name": name, "namespace": "default"}
    if net:
        meta["annotations"] = {"lace.dev/network": net}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": "worker-1", "containers": [container]}}


def _ready(p: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (p.get("status") or {}).get("conditions") or ())


def wait_ready(b: Bench, names: list[str], timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        ps = b.pods()
        if all(_ready(ps.get(n, {})) for n in names):
            return ps
        if time.monotonic() > deadline:
            missing = [n for n in names if not _ready(ps.get(n, {}))]
            raise SystemExit(f"{len(missing)} probed pods not Ready after {timeout:.0f} s: {missing[:5]}")
        time.sleep(0.2)


def delete_pods(b: Bench, names: list[str], timeout: float = 120) -> None:
    """Delete gracefully and wait until the kubelet has stopped them all (processes, CNI DEL,
    namespace) and removed them; all at once (``lace delete`` waits for one pod after the other)."""
    if not names:
        return
    b.lace("delete", "pods", *names, "--grace-period", "1", "--ignore-not-found", "--wait=false")
    deadline = time.monotonic() + timeout
    while left := set(names) & set(b.pods()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(left)} pods not gone {timeout:.0f} s after their deletion")
        time.sleep(0.2)


def pin_pods(b: Bench, names: list[str], cpu: int) -> None:
    """Pin every thread of the named pods' processes (their podservers) to ``cpu``."""
    from lace.lab import procs as labprocs
    state = os.path.join(b.env["LACE_STATE_DIR"], "labs", LAB)
    ps = b.pods()
    wanted = {f"pod-{ps[n]['metadata']['uid'][:13]}" for n in names}
    for p in labprocs.list_procs(state):
        if p.name in wanted and p.alive:
            subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(p.pid)], check=True, capture_output=True)


def _v4(entries: list[dict]) -> str:
    return next(e["ip"] for e in entries if ":" not in e["ip"])


def probe_rtt(b: Bench, n: int) -> dict[str, dict[str, dict[str, float]]]:
    """HTTP and TCP probe round trips from worker-1's host in its kubelet cgroup to a pod of network
    PROBE_NET (its probe address) and to a default-network pod (its pod IP), interleaved."""
    b.apply([probed_pod("probe-iso", PROBE_NET), probed_pod("probe-dflt", None)])
    try:
        ps = wait_ready(b, ["probe-iso", "probe-dflt"], 60)
        pin_pods(b, ["probe-iso", "probe-dflt"], cpu=1)   # the servers on CPU 1, the probes on CPU 0
        iso, dflt = ps["probe-iso"]["status"], ps["probe-dflt"]["status"]
        targets = {"isolated": (_v4(iso["probeIPs"]), PROBE_PORT), "default": (_v4(dflt["podIPs"]), PROBE_PORT)}
        print(f"probe round trips: isolated via probe address {targets['isolated'][0]} (pod IP {_v4(iso['podIPs'])}), "
              f"default at {targets['default'][0]}", file=sys.stderr)
        r = in_kubelet(b, "worker-1", [sys.executable, "-c", _PROBE_RTT, json.dumps(targets), str(n),
                                       str(max(20, n // 20))], cpu=0)
        if r.returncode != 0:
            raise SystemExit(f"probe round trips failed: {(r.stderr.strip() or r.stdout.strip())[-600:]}")
        return json.loads(r.stdout)
    finally:
        delete_pods(b, ["probe-iso", "probe-dflt"])


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])     # utime + stime


def _stats(b: Bench) -> dict | None:
    from lace.lab.probing import PROBE_STATS_FILE
    try:
        with open(os.path.join(b.env["LACE_STATE_DIR"], "labs", LAB, PROBE_STATS_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _fresh_stats(b: Bench, after: float, timeout: float = 5) -> dict:
    """The kubelet's probe stats as first written after monotonic time ``after``."""
    deadline = time.monotonic() + timeout
    while True:
        doc = _stats(b)
        if doc is not None and doc["monotonic"] > after:
            return doc
        if time.monotonic() > deadline:
            raise SystemExit("the kubelet's probe stats were not written (is it an old kubelet?)")
        time.sleep(0.02)


def _cpu_share(watched: dict[str, int], seconds: float) -> dict[str, float]:
    """% of one CPU each pid used over ``seconds`` from now."""
    hz = os.sysconf("SC_CLK_TCK")
    before, t0 = {k: _cpu_ticks(pid) for k, pid in watched.items()}, time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    return {k: (_cpu_ticks(pid) - before[k]) / hz / elapsed * 100 for k, pid in watched.items()}


def idle_cpu(b: Bench, window: float) -> dict[str, float]:
    """Every lab process's share of one CPU over ``window`` seconds in a lab with no pods, from the
    moment every agent reports healthy (a 60 s window holds two of each agent's 30 s resyncs)."""
    from lace.lab import procs as labprocs
    b.lace("status", "--wait", "--timeout", "60")
    state = os.path.join(b.env["LACE_STATE_DIR"], "labs", LAB)
    pids = {p.name: p.pid for p in labprocs.list_procs(state) if p.alive}
    return _cpu_share(pids, window)


def probe_load(b: Bench, count: int, window: float) -> dict[str, Any]:
    """``count`` pods of network PROBE_NET on worker-1, readiness and liveness (httpGet) every second;
    over ``window`` seconds once all are Ready: probe runs per second on worker-1 (the kubelet's own
    count) and the CPU share of worker-1's agent, the lab kubelet and worker-1's prober; beside the
    same shares idle (before the pods)."""
    from lace.lab import procs as labprocs
    state = os.path.join(b.env["LACE_STATE_DIR"], "labs", LAB)

    def watched() -> dict[str, int]:
        pids = {p.name: p.pid for p in labprocs.list_procs(state) if p.alive}
        out = {"agent": pids["agent-worker-1"], "kubelet": pids["kubelet"]}
        if "prober-worker-1" in pids:
            out["prober"] = pids["prober-worker-1"]
        return out

    idle = _cpu_share(watched(), min(5.0, window))
    names = [f"load-{i}" for i in range(count)]
    t0 = time.monotonic()
    b.apply([probed_pod(n, PROBE_NET, liveness=True) for n in names])
    try:
        wait_ready(b, names, 60 + count)
        ready_s = time.monotonic() - t0
        time.sleep(2)   # past the burst of first probes and status writes
        first = _fresh_stats(b, time.monotonic())
        busy = _cpu_share(watched(), window)
        last = _fresh_stats(b, time.monotonic())
        span = last["monotonic"] - first["monotonic"]
        w0, w1 = first["nodes"].get("worker-1", {}), last["nodes"].get("worker-1", {})
        delta = {k: w1.get(k, 0) - w0.get(k, 0) for k in ("run", "success", "failure", "unknown")}
        ps = b.pods()
        restarts = sum(int(c.get("restartCount") or 0) for n in names
                       for c in (ps.get(n, {}).get("status") or {}).get("containerStatuses") or ())
        unready = sum(not _ready(ps.get(n, {})) for n in names)
    finally:
        t1 = time.monotonic()
        delete_pods(b, names)
        print(f"{count} probed pods deleted in {time.monotonic() - t1:.1f} s", file=sys.stderr)
    return {"pods": count, "ready_s": ready_s, "span": span, "rate": delta["run"] / span, "delta": delta,
            "cpu": busy, "idle": idle, "restarts": restarts, "unready": unready}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--pods", type=int, default=10, help="pods for the creation-to-first-packet figure")
    ap.add_argument("--only", choices=("idle", "paths", "first-packet", "probes"), help="run this part only")
    ap.add_argument("--idle-window", type=float, default=60.0,
                    help="seconds the idle lab's CPU shares are measured over")
    ap.add_argument("--paths", default=",".join(PATHS),
                    help="paths measured beside the bare veth, comma-separated: " +
                         ", ".join(f"{k} ({v})" for k, v in PATHS.items()) + " (default: all)")
    ap.add_argument("--probe-rtts", type=int, default=2000, help="probe round trips per target and kind")
    ap.add_argument("--probe-pods", type=int, default=100, help="probed pods on one node for the probe rate")
    ap.add_argument("--probe-window", type=float, default=20.0, help="seconds the probe rate is measured over")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/lab.py needs root", file=sys.stderr)
        return 2
    want = lambda part: a.only in (None, part)  # noqa: E731
    chosen = [x.strip() for x in a.paths.split(",") if x.strip()]
    if unknown := [x for x in chosen if x not in PATHS]:
        ap.error(f"--paths: unknown {', '.join(unknown)} (choose from {', '.join(PATHS)})")
    lab_paths = want("paths") and any(x in ("same", "cross") for x in chosen)
    need_lab = lab_paths or want("first-packet") or want("probes") or want("idle")
    state = tempfile.mkdtemp(prefix="lace-bench-")
    b = Bench(state)
    results: dict[str, dict[str, list[float]]] = {}
    missing: dict[str, str] = {}   # kernel path -> why it was not measured
    first: list[float] = []
    rtt: dict | None = None
    load: dict | None = None
    idle: dict[str, float] | None = None
    # SIGTERM ends the run as Ctrl-C does: through the finally below, which removes everything made
    signal.signal(signal.SIGTERM, lambda sig, _frame: sys.exit(128 + sig))
    try:
        if need_lab:
            # three nodes when the idle lab is measured (the shape its target is set for), else two
            b.lace("lab", "up", "--name", LAB, "--nodes", "3" if want("idle") else "2")
        if want("idle"):
            idle = idle_cpu(b, a.idle_window)
        if lab_paths or want("first-packet"):
            pod = lambda n, node: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "default"},  # noqa: E731
                                   "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}
            b.apply([pod("client", "worker-1"), pod("local", "worker-1"), pod("remote", "worker-2")])
            ps = b.wait(["client", "local", "remote"])
        if want("paths"):
            bare_pair()
            paths = {"bare veth": (BARE_A, BARE_B, BARE_IP_B)}
            if lab_paths:
                ip = {n: next(x["ip"] for x in ps[n]["status"]["podIPs"] if ":" not in x["ip"]) for n in ("local", "remote")}
                if "same" in chosen:
                    paths["same node"] = (b.netns_of("client"), b.netns_of("local"), ip["local"])
                if "cross" in chosen:
                    paths["cross node"] = (b.netns_of("client"), b.netns_of("remote"), ip["remote"])
            for kind, name in KERNEL_KINDS.items():
                if kind in chosen:
                    try:
                        paths[name] = (kernel_netns(kind, "pod1"), kernel_netns(kind, "pod2"), kernel_path(kind))
                    except (RuntimeError, netlink.NetlinkError) as exc:   # e.g. a kernel without seg6local
                        missing[name] = str(exc)
                        print(f"{name}: not measured: {exc}", file=sys.stderr)
            for _, (_, srv, _) in paths.items():
                b.run_in(srv, ["iperf3", "-s"], cpu=1, background=True)
                b.run_in(srv, ["sockperf", "server", "--tcp", "-p", "11111"], cpu=1, background=True)
            time.sleep(0.5)   # servers bind; the first measurement would otherwise race them
            for r in range(a.rounds):
                for name, (cli, _, dst) in paths.items():
                    res = results.setdefault(name, {"tcp": [], "pps": [], "rr": []})
                    res["tcp"].append(tcp_gbps(b, cli, dst, a.seconds))
                    res["pps"].append(udp_kpps(b, cli, dst, a.seconds))
                    res["rr"].append(rr_us(b, cli, dst, a.seconds))
                print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
            b.close()   # the servers: not to weigh on what follows
        if want("first-packet"):
            first = first_packet_ms(b, b.netns_of("remote"), a.pods)
        if want("probes"):
            b.apply([{"apiVersion": "lace.dev/v1alpha1", "kind": "Network", "metadata": {"name": PROBE_NET},
                      "spec": {"cidrs": ["10.77.0.0/16", "fd00:77::/112"]}}])
            rtt = probe_rtt(b, a.probe_rtts)
            print("probe round trips done", file=sys.stderr)
            if a.probe_pods > 0:
                load = probe_load(b, a.probe_pods, a.probe_window)
            b.lace("delete", "network", PROBE_NET)
    finally:
        try:
            b.close()
            if need_lab:
                b.lace("lab", "down", "--name", LAB)
        finally:
            for ns in (BARE_A, BARE_B):
                netlink.netns.delete(ns)
            kernel_cleanup()
            subprocess.run(["rm", "-rf", state])

    if idle is not None:
        print(f"\nidle lab, 3 nodes and no pods: CPU over {a.idle_window:.0f} s (utime + stime from /proc), "
              "% of one core")
        for name, share in sorted(idle.items()):
            goal = "   (target < 0.2 %)" if name.startswith("agent-") or name == "kubelet" else ""
            print(f"  {name:<22}{share:>7.2f}{goal}")
    if results:
        base = {k: statistics.median(v) for k, v in results["bare veth"].items()}
        med = {name: {k: statistics.median(v) for k, v in res.items()} for name, res in results.items()}
        print(f"\nlab pod-to-pod vs bare veth (medians of {a.rounds} interleaved rounds, {a.seconds:.0f} s each, "
              f"client CPU 0, server CPU 1, MTU {MTU})")
        print(f"{'path':<14}{'TCP Gbit/s':>12}{'ratio':>8}{'UDP64 kpps':>13}{'ratio':>8}{'TCP RR us':>12}{'ratio':>8}")
        for name, m in med.items():
            print(f"{name:<14}{m['tcp']:>12.2f}{m['tcp'] / base['tcp']:>7.2f}x{m['pps']:>13.0f}{m['pps'] / base['pps']:>7.2f}x"
                  f"{m['rr']:>12.1f}{m['rr'] / base['rr']:>7.2f}x")
        for name, why in missing.items():
            print(f"{name:<14}not measured: {why}")
        if any(name in med for name in KERNEL_KINDS.values()):
            print("kernel rows: namespaces built by the bench, pod -> node -> bridge -> node -> pod, the same pod MTU; "
                  "plain: IPv4 routing, no encapsulation; SRv6: seg6 encap.red (one outer IPv6 header, 40 B) "
                  "+ seg6local End.DX4")
            if "cross node" in med:
                for name in KERNEL_KINDS.values():
                    if name in med:
                        k, c = med[name], med["cross node"]
                        print(f"  cross node / {name}: TCP {c['tcp'] / k['tcp']:.2f}x, pps {c['pps'] / k['pps']:.2f}x, "
                              f"RR {c['rr'] / k['rr']:.2f}x")
        print("targets: same node / bare veth >= 0.97x TCP, >= 0.90x pps, <= 1.05x RR; "
              "cross node / kernel plain >= 1x TCP and pps, <= 1x RR")
    if first:
        print(f"\npod creation to first packet answered (ICMP from another node), {len(first)} pods: "
              f"median {statistics.median(first):.0f} ms, p90 {p90(first):.0f}, min {min(first):.0f}, "
              f"max {max(first):.0f}   (target: median < 100 ms, p90 < 150 ms)")
    if rtt is not None:
        print(f"\nkubelet probe round trips from worker-1's host namespace in its kubelet cgroup (CPU 0; pods' servers "
              f"on CPU 1), "
              f"{a.probe_rtts} of each interleaved: median (p90) us")
        print(f"{'probe':<22}{'isolated, probe addr':>22}{'default, pod IP':>20}{'ratio':>8}")
        for kind, title in (("http", "httpGet /healthz"), ("tcp", "tcpSocket (connect)")):
            i, d = rtt["isolated"][kind], rtt["default"][kind]
            print(f"{title:<22}{i['median']:>12.1f} ({i['p90']:>6.1f}){d['median']:>10.1f} ({d['p90']:>6.1f})"
                  f"{i['median'] / d['median']:>7.2f}x")
        print("target: an httpGet probe to a pod of an isolated network <= 1.1x the same probe to a default-network pod")
    if load is not None:
        d, n = load["delta"], load["pods"]
        print(f"\nprobe rate: {n} pods of an isolated network on worker-1, httpGet readiness + liveness every 1 s "
              f"(all Ready {load['ready_s']:.1f} s after applying them)")
        print(f"  {load['rate']:.1f} probes/s run over {load['span']:.1f} s (expected {2 * n}/s): "
              f"{d['success']} succeeded, {d['failure']} failed, {d['unknown']} not run; "
              f"{load['restarts']} restarts, {load['unready']} pods not Ready at the end")
        print("  CPU, % of one core    idle  under probes")
        for k, title in (("agent", "agent (worker-1)"), ("kubelet", "lab kubelet (all nodes)"),
                         ("prober", "prober (worker-1)")):
            if k in load["cpu"]:
                idle = f"{load['idle'][k]:>6.1f}" if k in load["idle"] else "     -"
                print(f"  {title:<22}{idle}{load['cpu'][k]:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
