#!/usr/bin/env python3
"""Pod-to-pod performance in a real lab, side by side with a bare veth pair in the same run.

For each path — a bare veth pair between two namespaces (the baseline), two pods on one node, two
pods on different nodes (SRv6 across the fabric) — TCP throughput (iperf3), UDP 64-byte packet rate
(iperf3) and TCP round-trip latency (sockperf ping-pong), client and server pinned to different
CPUs, medians of interleaved rounds, and each path's ratio to the baseline. Then the time from
applying a pod to the first packet it answers (ICMP echo from a pod on another node).

Run as root after `make install`:  .venv/bin/python bench/lab.py [--rounds N] [--seconds S]
Targets: same node >= 0.95x TCP and >= 0.85x packet rate of bare veth; cross node >= 0.95x TCP;
pod creation to first packet: median under 100 ms.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    def __init__(self, state: str) -> None:
        self.env = dict(os.environ, LACE_STATE_DIR=state, LACE_LAB=LAB, NO_COLOR="1")
        self.procs: list[subprocess.Popen] = []

    def lace(self, *argv: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        rc = int(lace_main(list(argv), self.env, stdout=out, stderr=err, stdin=io.StringIO("")))
        if rc != 0:
            raise SystemExit(f"lace {' '.join(argv)} failed: {err.getvalue()}")
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

    def wait(self, names: list[str]) -> dict[str, dict]:
        deadline = time.monotonic() + 60
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


def first_packet_ms(b: Bench, prober_ns: str, n: int) -> list[float]:
    """Apply a pod, then ping its address (from its IPLease, as soon as it exists) every ms."""
    from lace.store import SqliteStore
    store = SqliteStore(os.path.join(b.env["LACE_STATE_DIR"], "labs", LAB, STORE_FILE))
    sock = icmp_echo_socket(prober_ns)
    out = []
    try:
        for i in range(n):
            name = f"fresh-{i}"
            doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                   "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "image": "x"}]}}
            t0 = time.monotonic()
            store.apply(doc)
            ip = None
            while ip is None:
                for lease in store.list("ipleases").items:
                    if lease["spec"]["pod"] == f"default/{name}" and ":" not in lease["spec"]["ip"]:
                        ip = lease["spec"]["ip"]
                if time.monotonic() - t0 > 30:
                    raise SystemExit(f"{name} got no address")
                time.sleep(0.001)
            seq = 0
            while True:
                seq += 1
                hdr = struct.pack("!BBHHH", 8, 0, 0, 0x4C41, seq)
                pkt = struct.pack("!BBHHH", 8, 0, _checksum(hdr + b"lace"), 0x4C41, seq) + b"lace"
                sock.sendto(pkt, (ip, 0))
                try:
                    data, addr = sock.recvfrom(1024)
                    if addr[0] == ip and data[20] == 0:
                        break
                except socket.timeout:
                    pass
                if time.monotonic() - t0 > 30:
                    raise SystemExit(f"{name} never answered")
            out.append((time.monotonic() - t0) * 1000)
            store.delete("pods", name, "default")
    finally:
        sock.close()
        store.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--pods", type=int, default=10, help="pods for the creation-to-first-packet figure")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/lab.py needs root", file=sys.stderr)
        return 2
    state = tempfile.mkdtemp(prefix="lace-bench-")
    b = Bench(state)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        b.lace("lab", "up", "--name", LAB, "--nodes", "2")
        pod = lambda n, node: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "default"},  # noqa: E731
                               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}
        b.apply([pod("client", "worker-1"), pod("local", "worker-1"), pod("remote", "worker-2")])
        ps = b.wait(["client", "local", "remote"])
        ip = {n: next(x["ip"] for x in ps[n]["status"]["podIPs"] if ":" not in x["ip"]) for n in ("local", "remote")}
        bare_pair()
        paths = {"bare veth": (BARE_A, BARE_B, BARE_IP_B),
                 "same node": (b.netns_of("client"), b.netns_of("local"), ip["local"]),
                 "cross node": (b.netns_of("client"), b.netns_of("remote"), ip["remote"])}
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
        first = first_packet_ms(b, b.netns_of("remote"), a.pods)
    finally:
        b.close()
        b.lace("lab", "down", "--name", LAB)
        for ns in (BARE_A, BARE_B):
            netlink.netns.delete(ns)
        subprocess.run(["rm", "-rf", state])

    base = {k: statistics.median(v) for k, v in results["bare veth"].items()}
    print(f"\nlab pod-to-pod vs bare veth (medians of {a.rounds} interleaved rounds, {a.seconds:.0f} s each, "
          f"client CPU 0, server CPU 1, MTU {MTU})")
    print(f"{'path':<12}{'TCP Gbit/s':>12}{'ratio':>8}{'UDP64 kpps':>13}{'ratio':>8}{'TCP RR us':>12}{'ratio':>8}")
    for name, res in results.items():
        m = {k: statistics.median(v) for k, v in res.items()}
        print(f"{name:<12}{m['tcp']:>12.2f}{m['tcp'] / base['tcp']:>7.2f}x{m['pps']:>13.0f}{m['pps'] / base['pps']:>7.2f}x"
              f"{m['rr']:>12.1f}{m['rr'] / base['rr']:>7.2f}x")
    print("targets: same node >= 0.95x TCP and >= 0.85x pps; cross node >= 0.95x TCP")
    print(f"\npod creation to first packet answered (ICMP from another node), {len(first)} pods: "
          f"median {statistics.median(first):.0f} ms, min {min(first):.0f}, max {max(first):.0f}   (target < 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
