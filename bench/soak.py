#!/usr/bin/env python3
"""Soak: a bounded run of mixed traffic and pod churn in a lab of its own, sampled over time.

The lab (``soak``, 3 nodes, its own state dir) gets a podserver on every node (``srv-N``: HTTP on
80, UDP echo on 53), a dual-stack ClusterIP Service ``srv`` over them, and a client pod on every
node (``cli-N``). In each client's namespace a generator (below) runs for the whole soak:

- long TCP streams, each one connection held open with back-to-back HTTP requests: to the server
  on the next node over IPv4 (across the fabric), to the same server over IPv6, and to the
  Service's IPv4 VIP. A stream that breaks (reset, closed, a request unanswered for 5 s) is
  counted and opened again;
- new TCP connections at ``--conn-rate`` a second (connect, GET, read, close), to the Service's
  VIPs, IPv4 and IPv6 in turn;
- UDP datagrams at ``--udp-rate`` a second to the Service's VIPs and to the next node's server,
  each echo checked (from the address asked, with our payload); what never comes back is lost.

Meanwhile the churn creates ``--wave`` pods at once (no ports: the cost of the network, not of a
server), spread over the nodes, waits until they run, deletes them at once, waits until they are
gone, and starts again. The churned pods are no backends of the Service, so a broken connection
is the datapath's or the agent's doing, never a backend going away.

Every ``--interval`` seconds: each agent's RSS (VmRSS) and CPU (utime + stime over the interval,
% of one core), map fill (``lace_map_entries``: veth, delivery, segment, the conntrack tables),
drops by reason (``lace_datapath_packets{verdict="drop"}``, the interval's increase, all nodes),
the generators' counts and the churn's cycles. Metrics are read from each agent's unix socket.

At the end: the table over time, then the verdict — connections broken (goal 0), UDP datagrams
lost, drop reasons outside the expected set (goal none), and the agents' RSS and CPU trends
(least-squares slopes over the samples after the first minute, the warm-up: RSS is flagged when
the second half's trend adds more than 4 MiB, CPU when the whole run's adds more than half the
first third's mean plus one point). Exit status 1 when a goal is missed.

Run as root after `make install`:
    .venv/bin/python bench/soak.py [--minutes M] [--interval S] [--wave N] [--conn-rate R] [--udp-rate R]
(--minutes from 1 to 60, default 3.) Everything the soak makes goes at the end, after a failure,
Ctrl-C or SIGTERM too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from lace import netlink, nsenter  # noqa: E402
from lace.cni.client import AgentUnavailable, call  # noqa: E402
from lab import Bench  # noqa: E402  (bench/lab.py: python puts the script's own directory first)

LAB = "soak"
NODES = ("worker-1", "worker-2", "worker-3")
#: the map fill columns of the table
FILL_MAPS = ("veth", "delivery", "segment")
#: drop reasons the soak may meet without anything being wrong: none. Every packet its traffic
#: sends has a route, a delivery entry and no policy against it, and no churned pod is anyone's
#: peer, so any drop on any node is unexpected.
EXPECTED_DROPS: frozenset[str] = frozenset()
#: RSS the trend of the run's second half may add before it counts as growth: the e2e churn
#: test's bound. The agents' RSS rises over the first minutes of churn and slows down (the
#: allocators settling: their Python heap and malloc'd memory in use stay flat), so the first
#: half is shown beside it but not judged.
RSS_TREND_MAX = 4 * 2**20
WARMUP_S = 60.0

# The generator, run inside a client pod's namespace: python -c GENERATOR CONFIG_JSON. It prints
# its cumulative counts as one JSON line every report interval, and a last one ("final": true).
GENERATOR = r"""
import json, select, socket, sys, threading, time
cfg = json.loads(sys.argv[1])
stop = threading.Event()
lock = threading.Lock()
c = {"stream_requests": 0, "stream_opened": 0, "stream_breaks": 0, "stream_connect_failed": 0,
     "conn_ok": 0, "conn_failed": 0, "udp_sent": 0, "udp_received": 0, "errors": {}}

def count(key, n=1):
    with lock:
        c[key] += n

def error(what, exc):
    key = f"{what}: {type(exc).__name__}: {exc}"[:160]
    with lock:
        c["errors"][key] = c["errors"].get(key, 0) + 1

def family(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET

def get(sock, close=False):
    sock.sendall(b"GET / HTTP/1.1\r\nHost: soak\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed by the peer")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    if lines[0].split()[1:2] != [b"200"]:
        raise ConnectionError(f"answer {lines[0][:40]!r}")
    length = next(int(l.split(b":", 1)[1]) for l in lines[1:] if l.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed in the body")
        body += chunk
    return body

def stream(ip, port):
    while not stop.is_set():
        try:
            s = socket.create_connection((ip, port), timeout=5)
        except OSError as e:
            count("stream_connect_failed")
            error(f"stream {ip}:{port} connect", e)
            stop.wait(1)
            continue
        count("stream_opened")
        try:
            while not stop.is_set():
                get(s)
                count("stream_requests")
                stop.wait(cfg["stream_gap"])
        except OSError as e:
            count("stream_breaks")
            error(f"stream {ip}:{port}", e)
        finally:
            s.close()

def connections(targets, rate):
    i, due = 0, time.monotonic()
    while not stop.is_set():
        ip, port = targets[i % len(targets)]
        i += 1
        s = socket.socket(family(ip), socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect((ip, port))
            get(s, close=True)
            count("conn_ok")
        except OSError as e:
            count("conn_failed")
            error(f"connection {ip}:{port}", e)
        finally:
            s.close()
        due = max(due + 1 / rate, time.monotonic() - 1)   # behind by more than 1 s: do not burst
        stop.wait(max(0, due - time.monotonic()))

def datagrams(targets, rate):
    socks = []
    for ip, port in targets:
        s = socket.socket(family(ip), socket.SOCK_DGRAM)
        s.setblocking(False)
        socks.append((s, ip, port))
    pending = [set() for _ in socks]
    def drain(timeout):
        ready = select.select([x[0] for x in socks], [], [], timeout)[0]
        for k, (s, ip, port) in enumerate(socks):
            if s not in ready:
                continue
            while True:
                try:
                    data, peer = s.recvfrom(2048)
                except BlockingIOError:
                    break
                # an echo counts from the address asked only (a Service answers as its VIP)
                if peer[0] == ip and peer[1] == port and data in pending[k]:
                    pending[k].discard(data)
                    count("udp_received")
    seq, due = 0, time.monotonic()
    while not stop.is_set():
        k = seq % len(socks)
        s, ip, port = socks[k]
        payload = f"soak {seq}".encode()
        seq += 1
        try:
            s.sendto(payload, (ip, port))
            pending[k].add(payload)
            count("udp_sent")
        except OSError as e:
            error(f"udp {ip}:{port} send", e)
        due = max(due + 1 / rate, time.monotonic() - 1)
        while (wait := due - time.monotonic()) > 0:   # an echo ends a drain early: drain until due
            drain(wait)
    end = time.monotonic() + 2   # the last echoes
    while time.monotonic() < end and any(pending):
        drain(0.1)

def report(final=False):
    with lock:
        doc = dict(c, errors=dict(c["errors"]), t=time.monotonic(), final=final)
    print(json.dumps(doc), flush=True)

threads = [threading.Thread(target=stream, args=tuple(t)) for t in cfg["streams"]]
threads.append(threading.Thread(target=connections, args=(cfg["connect"], cfg["conn_rate"])))
threads.append(threading.Thread(target=datagrams, args=(cfg["udp"], cfg["udp_rate"])))
for t in threads:
    t.start()
end = time.monotonic() + cfg["seconds"]
while time.monotonic() < end:
    time.sleep(min(cfg["report"], max(0, end - time.monotonic())))
    report()
stop.set()
for t in threads:
    t.join()
report(final=True)
"""


class Lab(Bench):
    """The soak's lab, driven through the lace CLI in-process (bench/lab.py's driver)."""

    def __init__(self, state: str) -> None:
        super().__init__(state, LAB)

    def lace(self, *argv: str) -> str:
        try:
            return super().lace(*argv)
        except SystemExit as exc:    # a failed command is the soak's to report, not the end of it
            raise RuntimeError(str(exc)) from None

    def wait(self, names: list[str], timeout: float = 120, gone: bool = False) -> dict[str, dict]:
        """The pods once all of ``names`` are Running (or, with ``gone``, none of them exists)."""
        deadline = time.monotonic() + timeout
        while True:
            ps = self.pods()
            if gone and not set(names) & set(ps):
                return ps
            if not gone and all(ps.get(n, {}).get("status", {}).get("phase") == "Running" for n in names):
                return ps
            if time.monotonic() > deadline:
                left = [n for n in names if (n in ps) == gone or not gone and
                        ps[n].get("status", {}).get("phase") != "Running"]
                raise RuntimeError(f"{len(left)} pods not {'gone' if gone else 'Running'} after {timeout:.0f} s: "
                                   f"{left[:5]}")
            time.sleep(0.5)   # a CLI call a poll: often enough for waves that take seconds

    def status(self) -> dict:
        return json.loads(self.lace("lab", "status", "-o", "json"))


def pod(name: str, node: str, labels: dict[str, str], tcp: tuple[int, ...] = (), udp: tuple[int, ...] = ()) -> dict:
    ports = [{"containerPort": p} for p in tcp] + [{"containerPort": p, "protocol": "UDP"} for p in udp]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "lace/podserver", "ports": ports}]}}


def addresses(p: dict) -> tuple[str, str]:
    found = [a["ip"] for a in p["status"]["podIPs"]]
    return next(a for a in found if ":" not in a), next(a for a in found if ":" in a)


# -- sampling -------------------------------------------------------------------------------------


def proc_sample(pid: int) -> tuple[int, float]:
    """(RSS in bytes, CPU seconds used so far) of ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_metrics(lab: Lab, node: str) -> tuple[dict[str, int], dict[str, float]]:
    """(entries per map, drop packets per reason so far) from the node agent's /metrics."""
    from lace.lab.cluster import agent_socket
    status, body = call(agent_socket(lab.dir, node), "GET", "/metrics", timeout=10)
    if status != 200:
        raise RuntimeError(f"the agent on {node} answered /metrics with {status}")
    fill: dict[str, int] = {}
    drops: dict[str, float] = {}
    for fam in text_string_to_metric_families(body.decode() if isinstance(body, bytes) else str(body)):
        for s in fam.samples:
            if s.name == "lace_map_entries":
                fill[s.labels["map"]] = int(s.value)
            elif s.name.startswith("lace_datapath_packets") and s.labels.get("verdict") == "drop":
                drops[s.labels["reason"]] = drops.get(s.labels["reason"], 0) + s.value
    return fill, drops


class Churn(threading.Thread):
    """Waves of pods created and deleted until stopped; counts the cycles."""

    def __init__(self, lab: Lab, wave: int) -> None:
        super().__init__(name="churn", daemon=True)
        self.lab, self.wave = lab, wave
        self.stop = threading.Event()
        self.cycles = 0
        self.waves: list[tuple[float, float]] = []   # (seconds to Running, seconds to gone)
        self.error: str | None = None

    def run(self) -> None:
        w = 0
        try:
            while not self.stop.is_set():
                names = [f"churn-{w}-{i}" for i in range(self.wave)]
                t0 = time.monotonic()
                self.lab.apply([pod(n, NODES[i % 3], {"app": "churn"}) for i, n in enumerate(names)])
                self.lab.wait(names)
                t1 = time.monotonic()
                # gracefully: the kubelet removes a pod's object once it has torn the pod down
                # (CNI DEL, its namespace), so "gone" ends the whole cycle
                self.lab.lace("delete", "pods", *names, "--grace-period", "1", "--wait=false")
                self.lab.wait(names, gone=True)
                self.waves.append((t1 - t0, time.monotonic() - t1))
                self.cycles += self.wave
                w += 1
        except Exception as e:   # reported in the verdict; the soak goes on without churn
            self.error = f"{type(e).__name__}: {e}"


class Generator:
    """One generator process in a client pod's namespace; its last report."""

    def __init__(self, netns: str, cfg: dict) -> None:
        fd = os.open(netlink.netns.path(netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", GENERATOR, json.dumps(cfg)],
                                         preexec_fn=lambda: nsenter.setns(fd), stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
        finally:
            os.close(fd)
        self.last: dict | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = json.loads(line)

    def finish(self, timeout: float) -> dict:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.reader.join(timeout=5)
        if not (self.last or {}).get("final"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"a generator ended without its final report: {err.strip()[-800:]}")
        return self.last

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def totals(gens: list[Generator]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in gens:
        for k, v in (g.last or {}).items():
            if isinstance(v, int) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    return out


def slope_per_run(xs: list[float], ys: list[float]) -> float:
    """What the least-squares trend of ys over xs adds from the first x to the last."""
    if len(xs) < 3 or xs[-1] == xs[0]:
        return 0.0
    return statistics.linear_regression(xs, ys).slope * (xs[-1] - xs[0])


# -- the run --------------------------------------------------------------------------------------


def setup(lab: Lab) -> dict[str, Any]:
    """Servers, the Service, clients; returns the generators' targets per client node."""
    servers = {node: f"srv-{i + 1}" for i, node in enumerate(NODES)}
    clients = {node: f"cli-{i + 1}" for i, node in enumerate(NODES)}
    lab.apply([pod(name, node, {"app": "srv"}, tcp=(80,), udp=(53,)) for node, name in servers.items()] +
              [pod(name, node, {"app": "cli"}) for node, name in clients.items()] +
              [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "srv", "namespace": "default"},
                "spec": {"selector": {"app": "srv"}, "ipFamilyPolicy": "PreferDualStack",
                         "ports": [{"name": "http", "port": 80}, {"name": "echo", "port": 53, "protocol": "UDP"}]}}])
    ps = lab.wait(list(servers.values()) + list(clients.values()))
    svc = json.loads(lab.lace("get", "services", "srv", "-o", "json"))
    vips = svc["spec"]["clusterIPs"]
    vip4 = next(v for v in vips if ":" not in v)
    vip6 = next(v for v in vips if ":" in v)
    from lace.lab.cluster import pod_netns
    plan = {}
    for i, node in enumerate(NODES):
        s4, s6 = addresses(ps[servers[NODES[(i + 1) % 3]]])
        plan[node] = {"netns": pod_netns(lab.dir, "default", clients[node]),
                      "streams": [[s4, 80], [s6, 80], [vip4, 80]],
                      "connect": [[vip4, 80], [vip6, 80]],
                      "udp": [[vip4, 53], [vip6, 53], [s4, 53]]}
    # the Service answers from every client before the clock starts (its backends are programmed)
    for node in NODES:
        deadline = time.monotonic() + 60
        while subprocess.run(["ip", "netns", "exec", plan[node]["netns"], sys.executable, "-m", "lace.lab.netcheck",
                              "tcp", vip4, "80", "--timeout", "1"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Service srv ({vip4}) does not answer from {clients[node]}")
            time.sleep(0.5)
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="length of the soak, 1 to 60 (default 3)")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between samples (default 10)")
    ap.add_argument("--wave", type=int, default=30, help="pods created and deleted at once by the churn")
    ap.add_argument("--conn-rate", type=float, default=10.0, help="new TCP connections a second per client")
    ap.add_argument("--udp-rate", type=float, default=30.0, help="UDP datagrams a second per client")
    a = ap.parse_args()
    if not 1 <= a.minutes <= 60:
        ap.error(f"--minutes {a.minutes:g}: the soak is bounded; choose 1 to 60")
    if not 2 <= a.interval <= a.minutes * 60 / 3:
        ap.error(f"--interval {a.interval:g}: choose 2 s to a third of the run")
    if a.wave < 3 or a.conn_rate <= 0 or a.udp_rate <= 0:
        ap.error("--wave needs at least 3 pods (one per node); the rates must be positive")
    if os.geteuid() != 0:
        print("bench/soak.py needs root", file=sys.stderr)
        return 2
    state = tempfile.mkdtemp(prefix="lace-soak-")
    lab = Lab(state)
    gens: list[Generator] = []
    churn: Churn | None = None
    samples: list[dict[str, Any]] = []
    finals: list[dict] = []
    # SIGTERM ends the run as Ctrl-C does: through the finally below, which removes everything made
    signal.signal(signal.SIGTERM, lambda sig, _frame: sys.exit(128 + sig))
    seconds = a.minutes * 60
    try:
        print(f"bringing up lab {LAB} (3 nodes) in {state}", file=sys.stderr)
        lab.lace("lab", "up", "--name", LAB, "--nodes", "3")
        plan = setup(lab)
        pids = {n["name"]: n["agentPid"] for n in lab.status()["nodes"]}
        cfg = {"seconds": seconds, "report": 1.0, "stream_gap": 0.02, "conn_rate": a.conn_rate, "udp_rate": a.udp_rate}
        gens = [Generator(plan[node]["netns"], dict(cfg, **{k: plan[node][k] for k in ("streams", "connect", "udp")}))
                for node in NODES]
        churn = Churn(lab, a.wave)
        churn.start()
        t0 = time.monotonic()
        prev = {node: proc_sample(pid) for node, pid in pids.items()}
        prev_drops: dict[str, float] = {}
        for node in NODES:
            for reason, v in agent_metrics(lab, node)[1].items():
                prev_drops[reason] = prev_drops.get(reason, 0) + v
        prev_t = t0
        print(f"soaking for {a.minutes:g} min: samples every {a.interval:g} s", file=sys.stderr)
        while (now := time.monotonic()) < t0 + seconds:
            time.sleep(min(a.interval, t0 + seconds - now))
            t = time.monotonic()
            row: dict[str, Any] = {"t": t - t0, "cycles": churn.cycles, "traffic": totals(gens), "nodes": {}}
            drops: dict[str, float] = {}
            for node, pid in pids.items():
                rss, cpu = proc_sample(pid)
                try:
                    fill, node_drops = agent_metrics(lab, node)
                except AgentUnavailable as e:
                    raise RuntimeError(f"the agent on {node} stopped answering: {e}") from None
                for reason, v in node_drops.items():
                    drops[reason] = drops.get(reason, 0) + v
                row["nodes"][node] = {"rss": rss, "cpu": (cpu - prev[node][1]) / (t - prev_t) * 100,
                                      "fill": fill}
                prev[node] = (rss, cpu)
            row["drops"] = {r: v - prev_drops.get(r, 0) for r, v in drops.items() if v - prev_drops.get(r, 0) > 0}
            prev_drops, prev_t = drops, t
            samples.append(row)
            print(f"  {row['t']:5.0f} s  {row['cycles']} cycles, {row['traffic'].get('stream_requests', 0)} stream "
                  f"requests, {row['traffic'].get('stream_breaks', 0)} breaks", file=sys.stderr)
        churn.stop.set()
        finals = [g.finish(timeout=30) for g in gens]
        churn.join(timeout=180)
        if pids != {n["name"]: n["agentPid"] for n in lab.status()["nodes"]}:
            raise RuntimeError("an agent restarted during the soak")
    finally:
        for g in gens:
            g.kill()
        if churn is not None:
            churn.stop.set()
        try:
            lab.lace("lab", "down", "--name", LAB)
        finally:
            subprocess.run(["rm", "-rf", state])
    return report(a, samples, finals, churn)


def report(a: argparse.Namespace, samples: list[dict[str, Any]], finals: list[dict], churn: Churn) -> int:
    mib = 2**20
    print(f"\nsoak: {a.minutes:g} min, 3 nodes; per client: 3 TCP streams (pod IPv4 across the fabric, pod IPv6, "
          f"Service VIP), {a.conn_rate:g} new connections/s to the VIPs, {a.udp_rate:g} UDP datagrams/s; churn waves "
          f"of {a.wave} pods")
    head = f"{'t s':>5} {'cycles':>6} {'req/s':>6} {'conn/s':>6} {'fail':>4} {'udp/s':>6} {'lost':>5}"
    for i in range(len(NODES)):
        head += f" {'rss' + str(i + 1):>6} {'cpu' + str(i + 1):>5}"
    head += f" {'veth':>5} {'deliv':>5} {'seg':>4} {'ct':>6}  drops"
    print(head)
    before: dict[str, int] = {}
    prev_t = 0.0
    for row in samples:
        tr = row["traffic"]
        d = {k: tr.get(k, 0) - before.get(k, 0) for k in tr}
        span = row["t"] - prev_t
        fills = [n["fill"] for n in row["nodes"].values()]
        ct = sum(v for f in fills for m, v in f.items() if m.startswith("ct-"))
        line = (f"{row['t']:>5.0f} {row['cycles']:>6} {d.get('stream_requests', 0) / span:>6.0f} "
                f"{d.get('conn_ok', 0) / span:>6.1f} {d.get('conn_failed', 0) + d.get('stream_breaks', 0):>4} "
                f"{d.get('udp_sent', 0) / span:>6.0f} {max(0, d.get('udp_sent', 0) - d.get('udp_received', 0)):>5}")
        for node in NODES:
            n = row["nodes"][node]
            line += f" {n['rss'] / mib:>6.1f} {n['cpu']:>5.1f}"
        line += (f" {sum(f.get('veth', 0) for f in fills):>5} {sum(f.get('delivery', 0) for f in fills):>5} "
                 f"{sum(f.get('segment', 0) for f in fills):>4} {ct:>6}  "
                 + (", ".join(f"{r} {int(v)}" for r, v in sorted(row["drops"].items())) or "-"))
        print(line)
        before, prev_t = tr, row["t"]
    print("(rss MiB and cpu % of one core per agent, worker-1..3; veth, delivery, segment and conntrack entries "
          "summed over the nodes; fail: broken streams and failed new connections in the interval; lost: UDP "
          "datagrams not yet echoed at the sample)")

    end: dict[str, Any] = {}
    for f in finals:
        for k, v in f.items():
            if isinstance(v, int) and not isinstance(v, bool):
                end[k] = end.get(k, 0) + v
    errors: dict[str, int] = {}
    for f in finals:
        for k, v in f["errors"].items():
            errors[k] = errors.get(k, 0) + v
    broken = end["stream_breaks"] + end["stream_connect_failed"] + end["conn_failed"]
    lost = end["udp_sent"] - end["udp_received"]
    seen = {r for row in samples for r in row["drops"]}
    unexpected = sorted(seen - EXPECTED_DROPS)
    warm = [row for row in samples if row["t"] >= WARMUP_S] or samples
    xs = [row["t"] for row in warm]
    print("\nverdict")
    ok = True
    print(f"  churn                    {churn.cycles} pod cycles"
          + (f" in {len(churn.waves)} waves: to Running median {statistics.median(w[0] for w in churn.waves):.1f} s, "
             f"to gone {statistics.median(w[1] for w in churn.waves):.1f} s" if churn.waves else "")
          + (f"; STOPPED: {churn.error}" if churn.error else ""))
    ok &= churn.error is None and churn.cycles > 0
    print(f"  connections              {end['stream_opened']} streams opened, {end['stream_requests']} requests on "
          f"them; {end['conn_ok']} new connections")
    print(f"  broken connections       {broken} (streams broken {end['stream_breaks']}, stream connects failed "
          f"{end['stream_connect_failed']}, new connections failed {end['conn_failed']})   goal 0: "
          f"{'met' if broken == 0 else 'NOT met'}")
    ok &= broken == 0
    for k, v in sorted(errors.items(), key=lambda kv: -kv[1])[:8]:
        print(f"      {v:>5} x {k}")
    print(f"  UDP                      {end['udp_sent']} sent, {end['udp_received']} echoed, {lost} lost"
          f" ({100 * lost / max(1, end['udp_sent']):.3f} %)")
    print(f"  drop reasons             {', '.join(sorted(seen)) or 'none'}; unexpected: "
          f"{', '.join(unexpected) or 'none'}   goal none: {'met' if not unexpected else 'NOT met'}")
    ok &= not unexpected
    half = len(warm) // 2
    for node in NODES:
        rss = [row["nodes"][node]["rss"] for row in warm]
        cpu = [row["nodes"][node]["cpu"] for row in warm]
        rss_first = slope_per_run(xs[:half + 1], rss[:half + 1])
        rss_second = slope_per_run(xs[half:], rss[half:])
        cpu_trend = slope_per_run(xs, cpu)
        first = cpu[: max(1, len(cpu) // 3)]
        grows_rss = rss_second > RSS_TREND_MAX
        grows_cpu = cpu_trend > statistics.mean(first) / 2 + 1
        print(f"  {node} agent         RSS {rss[0] / mib:.1f} -> {rss[-1] / mib:.1f} MiB, trend {rss_first / 2**10:+.0f} "
              f"KiB over the first half, {rss_second / 2**10:+.0f} KiB over the second; CPU mean "
              f"{statistics.mean(cpu):.1f} %, trend {cpu_trend:+.1f} points"
              f"   {'GROWS' if grows_rss or grows_cpu else 'no growth trend'}")
        ok &= not (grows_rss or grows_cpu)
    print(f"  ({'all goals met' if ok else 'a goal is NOT met'}; trends: least-squares over the samples from "
          f"{WARMUP_S:.0f} s on, RSS judged on the second half (<= {RSS_TREND_MAX / mib:.0f} MiB), CPU on the whole "
          f"(<= half the first third's mean + 1 point))")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
