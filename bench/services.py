#!/usr/bin/env python3
"""Service load balancing: new TCP connections per second to one ClusterIP service while 0 to 100k
services are programmed, lace side by side with kube-proxy's real backends in the same run.

Each connection is connect, 1 byte each way, close (bench/crr.c: one client thread pinned to CPU 0,
one server thread pinned to CPU 1). Backends compared, each programmed the way its owner does it:

  lace             services / backends / maglev maps written directly with lace.datapath.services,
                   lace_from_pod attached (tcx ingress) to the node side of every pod veth
  lace@0           the same, holding only the measured service whatever the count: lace's own
                   baseline, measured in the same rounds as the rest, so that lace(N) / lace(0) is
                   a ratio of one sitting and not of two counts half an hour apart
  direct           no service and no netfilter: the client dials one backend pod's own address
                   through the node's plain routing. The ceiling of this client and server: no
                   service translation can go faster, so lace / X is bounded by direct / X
  iptables-nft     kube-proxy's iptables mode (KUBE-SERVICES -> KUBE-SVC-* with statistic random
  iptables-legacy  probabilities -> KUBE-SEP-* DNAT, plus its filter chains and jumps), loaded with one
                   iptables-restore --noflush, through the nf_tables or the legacy x_tables backend
  nftables         kube-proxy's nftables mode (table ip kube-proxy: the service-ips verdict map keyed
                   by ip daddr . meta l4proto . th dport -> service chain -> numgen random mod N vmap
                   -> endpoint chain -> dnat to), loaded with one nft -f

Topology, built the same way for every backend (each backend gets its own copy, so rules and the
conntrack state they enable never meet another backend's):

  client pod netns --veth-- node netns --veth-- backend pod netns (x3)

The client and server (bench/crr.c, compiled at run time) spin instead of sleeping: on this VM a
cross-CPU wake-up costs ~40 us, which would cap every backend at the same ~5k conn/s. Each cell is
the median of interleaved rounds (every backend is programmed at once, each in its own namespaces,
and measured in turn), because the machine's speed drifts by tens of percent within seconds. The
machine may also be shared: a round in which other tasks kept the client or the server off its CPU
is measured again after a pause (CONTENTION_MAX, TRIES) and the cell flagged if that keeps
happening; a round's rate counts only the time both had their CPUs.

Past EXACT_MAX services two baselines would spend O(n^2) in loading alone (iptables-nft-restore
--noflush in user space, the kernel naming nft's anonymous sets): they then load the same datapath
another way (said in the output), and their setup time is extrapolated from the largest count
loaded kube-proxy's way.

The pods look like lace's (an address /32, a link-local gateway answered by a permanent neighbour
entry). For kube-proxy the node routes between the veths and DNATs in PREROUTING; for lace the
datapath on the veths' node side translates and redirects, and the node's stack is not involved.
The measured service (3 backends) sits in the middle of kube-proxy's service order (kube-proxy
writes them in Go map order: the middle is the expected position); the filler services have one
backend each, every second one two (lace's maps are sized to hold them: its Maglev map holds 1024
tables by default, one per service with two or more backends).

Run as root after `make install`:
  .venv/bin/python bench/services.py [--quick] [--counts 0,1000,...] [--duration S] [--rounds R]
                                     [--only lace,nftables] [--exact-max N]
Goals: lace at 30k >= 0.95x lace at 0; lace >= 1.5x iptables at 5k and >= 4x at 30k; lace ahead of
nftables at every count.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import importlib.util
import ipaddress
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lace import netlink, nsenter  # noqa: E402

COUNTS = (0, 1_000, 5_000, 10_000, 30_000, 100_000)
QUICK_COUNTS = (0, 1_000, 5_000)
BACKENDS = ("lace", "lace@0", "iptables-nft", "iptables-legacy", "nftables", "direct")

POD_NET = ipaddress.IPv4Network("10.244.0.0/16")        # the cluster CIDR (kube-proxy's local detector)
SERVICE_NET = ipaddress.IPv4Network("10.96.0.0/12")     # ClusterIPs
FILLER_PODS = ipaddress.IPv4Network("10.244.64.0/18")   # filler services' backends: never reached
GATEWAY = "169.254.1.1"                                 # the pods' link-local next hop, as lace's CNI
CLIENT_IP = "10.244.0.10"
BACKEND_IPS = ("10.244.0.20", "10.244.0.21", "10.244.0.22")
MEASURED_VIP = str(SERVICE_NET.broadcast_address - 1)
SERVICE_PORT, TARGET_PORT = 80, 8080
MULTI_BACKEND_EVERY = 2          # every second filler service has two backends, the rest one
CLIENT_CPU, SERVER_CPU = 0, 1
WARMUP = 0.2                     # seconds of traffic before counting, each client run
# Other tasks on the client's or the server's CPU (this machine is shared) slow a round down by
# far more than the datapaths differ: a round whose client and server waited for their CPUs more
# than this share of it is measured again after a pause, up to TRIES times (the least contended
# try is kept).
CONTENTION_MAX = 0.02
TRIES = 6
RETRY_PAUSE = 1.0
MTU = 1500
# Past this many services, backends whose owner's way of loading costs O(n^2) (iptables-nft-restore
# --noflush, nft's anonymous sets) load the same datapath another way; their setup time is then
# extrapolated from the largest count loaded their owner's way.
EXACT_MAX = 10_000

CRR_SOURCE = ROOT / "bench" / "crr.c"


# ---- the services --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Service:
    """One ClusterIP service port: VIP:80/TCP -> its backends' pod IPs on TARGET_PORT."""

    namespace: str
    name: str
    vip: str
    backends: tuple[str, ...]
    port: int = SERVICE_PORT
    target_port: int = TARGET_PORT

    @property
    def port_name(self) -> str:
        """kube-proxy's ServicePortName string, ``ns/name:port-name``."""
        return f"{self.namespace}/{self.name}:http"


MEASURED = Service("bench", "measured", MEASURED_VIP, BACKEND_IPS)


def make_services(n: int) -> list[Service]:
    """N filler services plus the measured one in the middle; the same list for every backend."""
    if n > SERVICE_NET.num_addresses - 4:
        raise SystemExit(f"at most {SERVICE_NET.num_addresses - 4} services fit in {SERVICE_NET}")
    pods = FILLER_PODS.num_addresses - 2
    out = []
    for i in range(n):
        k = 2 if i % MULTI_BACKEND_EVERY == MULTI_BACKEND_EVERY - 1 else 1
        backends = tuple(str(FILLER_PODS[1 + (2 * i + j) % pods]) for j in range(k))
        out.append(Service(f"ns{i % 100}", f"svc{i}", str(SERVICE_NET[1 + i]), backends))
    random.Random(n).shuffle(out)
    out.insert(n // 2, MEASURED)
    return out


# ---- topology ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Pod:
    """A pod namespace: eth0 inside, ``host_if`` on the node."""

    netns: str
    ip: str
    mac: str
    host_if: str
    host_mac: str
    host_ifindex: int = 0


class Topology:
    """client pod -- node -- backend pods, in namespaces named after the run and the backend.

    :meth:`close` removes the namespaces (and with them the veths and any netfilter rules in them),
    all of them even when one fails.
    """

    def __init__(self, tag: str, label: str) -> None:
        prefix = f"lsvc-{tag}-{label}"
        self.node = f"{prefix}-node"
        self.client = Pod(f"{prefix}-client", CLIENT_IP, "02:00:0a:f4:00:0a", "cli", "02:00:00:00:01:0a")
        self.backends = [Pod(f"{prefix}-b{i}", ip, f"02:00:0a:f4:00:{20 + i:02x}", f"be{i}", f"02:00:00:00:01:{20 + i:02x}")
                         for i, ip in enumerate(BACKEND_IPS)]
        self.made: list[str] = []

    @property
    def pods(self) -> list[Pod]:
        return [self.client, *self.backends]

    def build(self) -> None:
        for ns in [self.node] + [p.netns for p in self.pods]:
            if netlink.netns_exists(ns):
                raise SystemExit(f"network namespace {ns} exists already")
            netlink.create_netns(ns)
            self.made.append(ns)
        netlink.set_up("lo", self.node)
        netlink.sysctl(self.node, "net.ipv4.ip_forward", 1)
        for key in ("net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"):
            netlink.sysctl(self.node, key, 0)
        for pod in self.pods:
            netlink.veth_pair(pod.host_if, "eth0", netns=self.node, peer_netns=pod.netns,
                              mac=pod.host_mac, peer_mac=pod.mac, mtu=MTU)
            netlink.set_up(pod.host_if, self.node)
            netlink.set_up("lo", pod.netns)
            netlink.set_up("eth0", pod.netns)
            netlink.add_address("eth0", f"{pod.ip}/32", pod.netns)
            netlink.add_neighbor(GATEWAY, pod.host_mac, "eth0", pod.netns)
            netlink.add_route(f"{GATEWAY}/32", netns=pod.netns, dev="eth0", scope="link")
            netlink.add_route("0.0.0.0/0", netns=pod.netns, via=GATEWAY, dev="eth0")
            # the node routes to each pod by its /32 and knows its MAC: no ARP anywhere
            netlink.add_route(f"{pod.ip}/32", netns=self.node, dev=pod.host_if, scope="link")
            netlink.add_neighbor(pod.ip, pod.mac, pod.host_if, self.node)
            pod.host_ifindex = netlink.link(pod.host_if, self.node).ifindex
        # the client opens tens of thousands of connections a second to one VIP:port
        netlink.sysctl(self.client.netns, "net.ipv4.ip_local_port_range", "1024 65535")
        netlink.wait_link(self.client.host_if, self.node, timeout=5, up=True)

    def run_on_node(self, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the node namespace; raise with its stderr if it fails."""
        fd = os.open(netlink.netns_path(self.node), os.O_RDONLY | os.O_CLOEXEC)
        try:
            r = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                               preexec_fn=lambda: nsenter.setns(fd), pass_fds=(fd,), timeout=1800)
        finally:
            os.close(fd)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} in {self.node} failed: {r.stderr.strip()[:2000]}")
        return r

    def close(self) -> None:
        failure: BaseException | None = None
        for ns in reversed(self.made):
            try:
                netlink.delete_netns(ns)
            except BaseException as exc:   # keep removing the others
                failure = failure or exc
        self.made.clear()
        if failure is not None:
            raise failure


# ---- traffic -------------------------------------------------------------------------------------

class Server:
    """One crr server, pinned to SERVER_CPU, for the backend pods of every topology.

    One process, not one per topology: the server spins instead of sleeping (see bench/crr.c),
    and several spinning servers on one CPU would take turns by the scheduler's time slice."""

    def __init__(self, crr: str, topos: list[Topology]) -> None:
        argv = [crr, "server", str(SERVER_CPU), str(TARGET_PORT)]
        argv += [f"{netlink.netns_path(p.netns)}:{p.ip}" for t in topos for p in t.backends]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"the crr server did not start (it said {line!r})")

    def run_delay(self) -> float:
        """Seconds the server has waited for its CPU so far (/proc/PID/schedstat)."""
        with open(f"/proc/{self.proc.pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclasses.dataclass
class Sample:
    """What one client run counted: answered connections, failures, seconds, answers per backend,
    and the seconds the client and the server waited for their CPUs (other tasks ran there)."""

    conns: int
    errors: int
    seconds: float
    per_backend: list[int]
    waited: float = 0.0

    @property
    def contended(self) -> bool:
        return self.waited > CONTENTION_MAX * self.seconds

    @property
    def rate(self) -> float:
        """Connections per second of the time the client and the server had their CPUs: while
        either waits for its CPU the exchange stalls (at most half the run is taken off)."""
        ran = max(self.seconds - self.waited, self.seconds / 2)
        return self.conns / ran if ran > 0 else 0.0


def run_client(crr: str, topo: Topology, dst: str, port: int, seconds: float, warmup: float = WARMUP,
               server: Server | None = None) -> Sample:
    """One crr client run; with ``server``, its CPU wait during the run counts in ``waited``."""
    before = server.run_delay() if server else 0.0
    argv = [crr, "client", str(CLIENT_CPU), netlink.netns_path(topo.client.netns), dst, str(port),
            str(warmup), str(seconds)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=warmup + seconds + 30)
    if r.returncode != 0:
        raise RuntimeError(f"crr client failed: {r.stderr.strip()}")
    fields = dict(kv.split("=", 1) for kv in r.stdout.split())
    per = [int(x) for x in fields["backends"].split(",") if x]
    # the server's wait spans the warm-up too: scaled to the counted part
    served = (server.run_delay() - before) * seconds / (seconds + warmup) if server else 0.0
    return Sample(int(fields["conns"]), int(fields["errors"]), float(fields["seconds"]), per,
                  float(fields["waited"]) + served)


def probe(crr: str, plane: Dataplane) -> str | None:
    """None when connections to the plane's target are answered, by every backend it spreads over;
    else what is wrong.

    The VIP is on no interface and in no route: an answer proves the service was translated."""
    dst, port = plane.target
    s = run_client(crr, plane.topo, dst, port, seconds=0.3, warmup=0)
    if s.conns == 0:
        return f"no connection to {dst}:{port} answered ({s.errors} failed)"
    hit = sum(1 for c in s.per_backend if c > 0)   # the server numbers backends across topologies
    if dst == MEASURED_VIP and hit < len(BACKEND_IPS):
        return f"only {hit} of {len(BACKEND_IPS)} backends answered ({s.per_backend})"
    return None


def compile_crr(workdir: str) -> str:
    cc = shutil.which("cc") or shutil.which("clang")
    if cc is None:
        raise SystemExit("bench/services.py needs a C compiler (cc or clang) for bench/crr.c")
    out = os.path.join(workdir, "crr")
    r = subprocess.run([cc, "-O2", "-Wall", "-o", out, str(CRR_SOURCE)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"compiling {CRR_SOURCE} failed:\n{r.stderr}")
    return out


# ---- the backends --------------------------------------------------------------------------------

class Dataplane(Protocol):
    """One way of translating service VIPs on the node of its own topology."""

    name: str
    topo: Topology
    target: tuple[str, int]      # where the client connects

    def unavailable(self) -> str | None:
        """Why this backend cannot run here (None: it can)."""

    def program(self, services: list[Service], exact: bool) -> float:
        """Program every service from an empty state; the seconds the backend's loading step took.

        ``exact``: load the way the backend's owner does even where that costs O(n^2) (see
        EXACT_MAX); otherwise an equivalent load may be used where one exists."""

    def inexact(self) -> str:
        """How program(exact=False) departs from the owner's way ("" if it does not)."""

    def clear(self) -> None:
        """Remove every service."""

    def close(self) -> None:
        """Remove whatever this backend set up outside its topology."""


def _hash32(text: str, n: int) -> str:
    """kube-proxy's chain-name hash: base32 of the SHA-256, first ``n`` characters."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:n]


class KubeProxyIptables:
    """kube-proxy's iptables mode, as its syncProxyRules writes a full sync for ClusterIP services
    with Cluster traffic policy and the cluster CIDR as local-traffic detector."""

    MARK = "0x4000"
    LARGE_CLUSTER_ENDPOINTS = 1000   # past this many endpoints kube-proxy drops per-endpoint comments

    target = (MEASURED_VIP, SERVICE_PORT)
    def __init__(self, topo: Topology, variant: str) -> None:
        self.topo = topo
        self.variant = variant                       # "nft" or "legacy"
        self.name = f"iptables-{variant}"
        self.restore = f"iptables-{variant}-restore"

    def unavailable(self) -> str | None:
        if shutil.which(self.restore) is None:
            return f"{self.restore} is not installed (Debian package iptables)"
        return None

    # The jumps kube-proxy (and kubelet, for KUBE-FIREWALL) put into the built-in chains; kube-proxy
    # adds these with `iptables -I` before its restore, here they ride in the same restore.
    JUMPS = (
        ("filter", "INPUT", "KUBE-EXTERNAL-SERVICES", "kubernetes externally-visible service portals", True),
        ("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", "kubernetes externally-visible service portals", True),
        ("filter", "INPUT", "KUBE-NODEPORTS", "kubernetes health check service ports", False),
        ("filter", "FORWARD", "KUBE-SERVICES", "kubernetes service portals", True),
        ("filter", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals", True),
        ("filter", "FORWARD", "KUBE-FORWARD", "kubernetes forwarding rules", False),
        ("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kubernetes load balancer firewall", True),
        ("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", "kubernetes load balancer firewall", True),
        ("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kubernetes load balancer firewall", True),
        ("filter", "INPUT", "KUBE-FIREWALL", "", False),
        ("filter", "OUTPUT", "KUBE-FIREWALL", "", False),
        ("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals", False),
        ("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals", False),
        ("nat", "POSTROUTING", "KUBE-POSTROUTING", "kubernetes postrouting rules", False),
    )

    def render(self, services: list[Service]) -> str:
        total_endpoints = sum(len(s.backends) for s in services)
        large = total_endpoints > self.LARGE_CLUSTER_ENDPOINTS

        def comment(text: str) -> str:
            return "" if large else f' -m comment --comment "{text}"'

        def jumps(table: str) -> list[str]:
            out = []
            for tbl, src, dst, text, new_only in self.JUMPS:
                if tbl == table:
                    ct = " -m conntrack --ctstate NEW" if new_only else ""
                    cm = f' -m comment --comment "{text}"' if text else ""
                    out.append(f"-A {src}{ct}{cm} -j {dst}")
            return out

        filt = ["*filter"] + [f":{c} - [0:0]" for c in (
            "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL",
            "KUBE-FIREWALL")]
        filt += jumps("filter")
        filt += [
            '-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 '
            '! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
            f'-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark {self.MARK}/{self.MARK} -j ACCEPT',
            '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "COMMIT",
        ]
        chains = ["*nat"] + [f":{c} - [0:0]" for c in ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ")]
        rules = jumps("nat") + [
            f"-A KUBE-POSTROUTING -m mark ! --mark {self.MARK}/{self.MARK} -j RETURN",
            f"-A KUBE-POSTROUTING -j MARK --xor-mark {self.MARK}",
            '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
            f"-A KUBE-MARK-MASQ -j MARK --or-mark {self.MARK}",
        ]
        for s in services:
            svc = "KUBE-SVC-" + _hash32(s.port_name + "tcp", 16)
            match = f"-m tcp -p tcp -d {s.vip} --dport {s.port}"
            chains.append(f":{svc} - [0:0]")
            rules.append(f'-A KUBE-SERVICES -m comment --comment "{s.port_name} cluster IP" {match} -j {svc}')
            rules.append(f'-A {svc} -m comment --comment "{s.port_name} cluster IP" {match} ! -s {POD_NET} -j KUBE-MARK-MASQ')
            n = len(s.backends)
            seps = []
            for i, ip in enumerate(s.backends):
                ep = f"{ip}:{s.target_port}"
                sep = "KUBE-SEP-" + _hash32(s.port_name + "tcp" + ep, 16)
                seps.append((sep, ip, ep))
                stat = f" -m statistic --mode random --probability {1.0 / (n - i):0.10f}" if i < n - 1 else ""
                rules.append(f"-A {svc}{comment(f'{s.port_name} -> {ep}')}{stat} -j {sep}")
            for sep, ip, ep in seps:
                chains.append(f":{sep} - [0:0]")
                rules.append(f"-A {sep}{comment(s.port_name)} -s {ip} -j KUBE-MARK-MASQ")
                rules.append(f"-A {sep}{comment(s.port_name)} -m tcp -p tcp -j DNAT --to-destination {ep}")
        rules.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the '
                     'last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS')
        return "\n".join(filt + chains + rules + ["COMMIT", ""])

    def program(self, services: list[Service], exact: bool) -> float:
        """kube-proxy restores with --noflush --counters; iptables-nft-restore 1.8.9 spends O(n^2)
        in user space on --noflush (~40 s for 10k services here). The tables are empty before every
        program(), so a plain restore of the same text leaves the same rules in the kernel."""
        text = self.render(services)
        argv = [self.restore, "--noflush", "--counters"] if exact or self.variant == "legacy" else [self.restore]
        t0 = time.perf_counter()
        self.topo.run_on_node(argv, stdin=text)
        return time.perf_counter() - t0

    def inexact(self) -> str:
        """How program(exact=False) departs from kube-proxy ("" if it does not)."""
        return "" if self.variant == "legacy" else "restored without --noflush (the same rules, into empty tables)"

    def clear(self) -> None:
        # a restore without --noflush empties each table it names: rules and user chains
        empty = ("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
                 "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
                 ":POSTROUTING ACCEPT [0:0]\nCOMMIT\n")
        self.topo.run_on_node([self.restore], stdin=empty)

    def close(self) -> None:
        self.clear()


class KubeProxyNftables:
    """kube-proxy's nftables mode, as its syncProxyRules writes a full sync (one nft transaction)
    for ClusterIP services with Cluster traffic policy and the cluster CIDR as local detector."""

    name = "nftables"
    T = "ip kube-proxy"

    target = (MEASURED_VIP, SERVICE_PORT)
    def __init__(self, topo: Topology) -> None:
        self.topo = topo

    def unavailable(self) -> str | None:
        if shutil.which("nft") is None:
            return "nft is not installed (Debian package nftables)"
        return None

    def render(self, services: list[Service], exact: bool = True) -> str:
        """The transaction kube-proxy writes; with ``exact`` False the filler services' chains go
        to their first endpoint instead of through an anonymous numgen map of their own."""
        t = self.T
        vmap = "type ipv4_addr . inet_proto . inet_service : verdict"
        out = [
            f'add table {t} {{ comment "rules for kube-proxy" ; }}',
            f'add set {t} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}',
            f'add set {t} nodeport-ips {{ type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }}',
            f'add map {t} firewall-ips {{ {vmap} ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }}',
            f'add map {t} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; '
            f'comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }}',
            f'add map {t} no-endpoint-services {{ {vmap} ; '
            f'comment "vmap to drop or reject packets to services with no endpoints" ; }}',
            f'add map {t} service-ips {{ {vmap} ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }}',
            f'add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }}',
            f"add chain {t} cluster-ips-check",
            f"add chain {t} filter-prerouting-pre-dnat {{ type filter hook prerouting priority -110 ; }}",
            f"add chain {t} filter-output-pre-dnat {{ type filter hook output priority -110 ; }}",
            f"add chain {t} filter-forward {{ type filter hook forward priority 0 ; }}",
            f"add chain {t} filter-input {{ type filter hook input priority 0 ; }}",
            f"add chain {t} filter-output {{ type filter hook output priority 0 ; }}",
            f"add chain {t} firewall-check",
            f"add chain {t} mark-for-masquerade",
            f"add chain {t} masquerading",
            f"add chain {t} nat-output {{ type nat hook output priority -100 ; }}",
            f"add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}",
            f"add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}",
            f"add chain {t} nodeport-endpoints-check",
            f'add chain {t} reject-chain {{ comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }}',
            f"add chain {t} services",
            f"add chain {t} service-endpoints-check",
            f'add rule {t} cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
            f'add rule {t} cluster-ips-check ip daddr {{ {SERVICE_NET} }} drop comment "Drop traffic to unallocated ClusterIPs"',
            f"add rule {t} filter-prerouting-pre-dnat ct state new jump firewall-check",
            f"add rule {t} filter-forward ct state new jump service-endpoints-check",
            f"add rule {t} filter-forward ct state new jump cluster-ips-check",
            f"add rule {t} filter-input ct state new jump nodeport-endpoints-check",
            f"add rule {t} filter-input ct state new jump service-endpoints-check",
            f"add rule {t} filter-output ct state new jump service-endpoints-check",
            f"add rule {t} filter-output-pre-dnat ct state new jump firewall-check",
            f"add rule {t} filter-output ct state new jump cluster-ips-check",
            f"add rule {t} firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips",
            f"add rule {t} mark-for-masquerade mark set mark or 0x4000",
            f"add rule {t} masquerading mark and 0x4000 == 0 return",
            f"add rule {t} masquerading mark set mark xor 0x4000",
            f"add rule {t} masquerading masquerade fully-random",
            f"add rule {t} nat-output jump services",
            f"add rule {t} nat-postrouting jump masquerading",
            f"add rule {t} nat-prerouting jump services",
            f"add rule {t} nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
            f"add rule {t} reject-chain reject",
            f"add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips",
            f"add rule {t} services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
            f"add rule {t} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
        ]
        for s in services:
            out += self.service_rules(s, exact or s is MEASURED)
        return "\n".join(out) + "\n"

    def service_rules(self, s: Service, exact: bool = True) -> list[str]:
        """One service's chains, rules and map elements; ``exact`` False: its chain goes straight
        to its first endpoint (no numgen map)."""
        t = self.T
        base = f"{s.namespace}/{s.name}/tcp/http"
        svc = f"service-{_hash32(base, 8)}-{base}"
        eps = []
        for ip in s.backends:
            ep_name = f"{base}__{ip}/{s.target_port}"
            eps.append((f"endpoint-{_hash32(ep_name, 8)}-{ep_name}", ip))
        # chains before the rules that jump to them, as kube-proxy's transaction orders them
        out = [f"add chain {t} {svc}"]
        out += [f"add chain {t} {ep}" for ep, _ in eps]
        out.append(f"add rule {t} {svc} ip daddr {s.vip} ip saddr != {POD_NET} jump mark-for-masquerade")
        if exact:
            arms = " , ".join(f"{i} : goto {ep}" for i, (ep, _) in enumerate(eps))
            out.append(f"add rule {t} {svc} numgen random mod {len(eps)} vmap {{ {arms} }}")
        else:
            out.append(f"add rule {t} {svc} goto {eps[0][0]}")
        for ep, ip in eps:
            out.append(f"add rule {t} {ep} ip saddr {ip} jump mark-for-masquerade")
            out.append(f"add rule {t} {ep} meta l4proto tcp dnat to {ip}:{s.target_port}")
        out.append(f"add element {t} cluster-ips {{ {s.vip} }}")
        out.append(f"add element {t} service-ips {{ {s.vip} . tcp . {s.port} : goto {svc} }}")
        return out

    def program(self, services: list[Service], exact: bool) -> float:
        """One nft transaction, as kube-proxy's. Every service's numgen map is an anonymous set,
        and the kernel names each one by scanning every set of the table (nf_tables_set_alloc_name,
        an sscanf per set): O(n^2), ~9 s for 4k services here, hours for 100k. The filler services'
        maps are never looked up by the measured connections, so ``exact`` False leaves them out."""
        text = self.render(services, exact)
        t0 = time.perf_counter()
        self.topo.run_on_node(["nft", "-f", "-"], stdin=text)
        return time.perf_counter() - t0

    @staticmethod
    def inexact() -> str:
        return ("filler services' chains go straight to their first endpoint (no numgen map each); "
                "the service-ips map and the measured service are as kube-proxy writes them")

    def clear(self) -> None:
        self.topo.run_on_node(["nft", "flush", "ruleset"])

    def close(self) -> None:
        self.clear()


def lace_translation_missing() -> str | None:
    """None once pod_veth.c translates services and lace.datapath.maglev builds Maglev tables."""
    prog = (ROOT / "bpf" / "progs" / "pod_veth.c").read_text()
    if "lib/service.h" not in prog and "lib/services.h" not in prog:
        return "service translation not in the datapath yet"
    if importlib.util.find_spec("lace.datapath.maglev") is None:
        return "lace.datapath.maglev (Maglev tables) not there yet"
    return None


class Lace:
    """lace's datapath on the node side of every pod veth, services written straight into its maps."""

    name = "lace"
    NET = 1                      # the pods' network
    FIRST_SEGMENT = 256

    target = (MEASURED_VIP, SERVICE_PORT)
    def __init__(self, topo: Topology, tag: str) -> None:
        self.topo = topo
        self.pin_root = f"/sys/fs/bpf/lsvc-{tag}-{self.name.replace('@', '')}"
        self.loaded = None
        self.links: list = []
        self.capacity: dict[str, int] = {}     # map capacities past the defaults, as loaded
        self.grown: dict[str, int] = {}        # the largest of those over the run, for the report

    def unavailable(self) -> str | None:
        return lace_translation_missing()

    def _load(self, max_entries: dict[str, int]) -> None:
        """Load (or reload with larger maps) lace's objects and attach to every pod veth."""
        from lace.bpf import attach_tcx, ensure_bpffs
        from lace.datapath.node import load_objects

        self._unload()
        ensure_bpffs()
        os.mkdir(self.pin_root)
        self.loaded = load_objects(self.pin_root, max_entries)
        self.capacity = dict(max_entries)
        for k, v in max_entries.items():
            self.grown[k] = max(v, self.grown.get(k, 0))
        prog = self.loaded.program("lace_from_pod")
        for pod in self.topo.pods:
            self.links.append(attach_tcx(prog, pod.host_ifindex, "ingress", netns=self.topo.node))
        self._program_pods()

    def _program_pods(self) -> None:
        from lace.datapath import config as cfgmod
        from lace.datapath import delivery as dlv
        from lace.datapath.common import mac_bytes
        from lace.datapath.endpoint import endpoint_value, veth_key
        from lace.datapath.routing import route_value, routing_key
        from lace.datapath.segment import segment_key, segment_value

        m = self.loaded.map
        m("config").update(cfgmod.config_key(), cfgmod.config_value(
            locator="fd00:0:1::/48", underlay_addr="fd00::1", node_id=1, uplink_ifindex=0, mtu=MTU))
        m("routing").update(routing_key(self.NET, str(POD_NET)), route_value(self.NET))
        for i, pod in enumerate(self.topo.pods, start=1):
            seg = self.FIRST_SEGMENT + i
            m("veth").update(veth_key(pod.host_ifindex), endpoint_value(
                endpoint_id=i, network=self.NET, segment=seg, mac=pod.mac, ipv4=pod.ip))
            key, value = dlv.delivery_key(self.NET, f"{pod.ip}/32"), dlv.DELIVERY.pack(
                kind=dlv.DeliveryKind.LOCAL, ifindex=pod.host_ifindex, mac=mac_bytes(pod.mac),
                host_mac=mac_bytes(pod.host_mac), endpoint_id=i)
            m("delivery").update(key, value)
            m("delivery-exact").update(dlv.exact_key(key), value)   # as the agent writes it: probed first
            m("segment").update(segment_key(self.NET, pod.ip), segment_value(seg, local=True))

    def _unload(self) -> None:
        for link in self.links:
            link.close()             # unpinned: closing detaches
        self.links.clear()
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None
        if os.path.isdir(self.pin_root):
            for f in os.listdir(self.pin_root):
                os.unlink(os.path.join(self.pin_root, f))
            os.rmdir(self.pin_root)

    def attach(self) -> None:
        """Load and attach with the default map sizes (pod-to-pod works; no services yet)."""
        self._load({})

    @staticmethod
    def needed(services: list[Service]) -> dict[str, int]:
        """Map capacities past the defaults that these services need."""
        from lace.datapath import services as svcmod

        slots = sum(1 + len(s.backends) for s in services)
        backends = sum(len(s.backends) for s in services)
        tables = sum(1 for s in services if len(s.backends) > 1)
        out = {}
        if slots > svcmod.SERVICES_MAX:
            out["services"] = slots
        if backends > svcmod.BACKENDS_MAX:
            out["backends"] = backends
        if tables + 1 > svcmod.MAGLEV_TABLES:
            out["maglev"] = (tables + 1) * svcmod.MAGLEV_SIZE
        revnat = len({(ip, s.target_port) for s in services for ip in s.backends})
        if revnat > svcmod.REVNAT_MAX:
            out["revnat"] = revnat
        return out

    @staticmethod
    def inexact() -> str:
        return ""

    def program(self, services: list[Service], exact: bool) -> float:
        """Write services, backends and Maglev tables (computing the tables is counted)."""
        import numpy as np

        from lace.datapath import maglev
        from lace.datapath import services as svcmod
        from lace.datapath.common import Proto

        need = self.needed(services)
        if self.loaded is None or any(self.capacity.get(k, 0) < v for k, v in need.items()):
            self._load(need)
        skeys, svals, bkeys, bvals = [], [], [], []
        multi: list[tuple[int, list[tuple[str, int]]]] = []   # (table, [(stable name, backend ID)])
        # each backend's revnat entry: the frontends its replies may come from (the datapath finds a
        # service flow's one conntrack entry through it), as the agent's programmer writes them
        frontends: dict[tuple[str, int], list[tuple[int, str, int]]] = {}
        bid = 0
        for sid, s in enumerate(services, start=1):
            ids = []
            for slot, ip in enumerate(s.backends, start=1):
                bid += 1
                ids.append((f"{self.NET}/{ip}/{s.target_port}/tcp", bid))
                bkeys.append(svcmod.backend_key(bid))
                bvals.append(svcmod.backend_value(ip, s.target_port, Proto.TCP, self.NET))
                frontends.setdefault((ip, s.target_port), []).append((self.NET, s.vip, s.port))
                skeys.append(svcmod.service_key(self.NET, s.vip, s.port, Proto.TCP, slot))
                svals.append(svcmod.service_value(service_id=sid, backend_id=bid))
            table = 0
            if len(ids) > 1:
                multi.append((len(multi) + 1, ids))
                table = len(multi)
            skeys.append(svcmod.service_key(self.NET, s.vip, s.port, Proto.TCP, 0))
            svals.append(svcmod.service_value(service_id=sid, backend_count=len(ids), active_count=len(ids),
                                              maglev=table))
        t0 = time.perf_counter()
        mg_idx = np.empty(len(multi) * svcmod.MAGLEV_SIZE, dtype=np.uint32)
        mg_val = np.empty(len(multi) * svcmod.MAGLEV_SIZE, dtype=np.uint32)
        for k, (table, names) in enumerate(multi):
            lo = k * svcmod.MAGLEV_SIZE
            mg_idx[lo:lo + svcmod.MAGLEV_SIZE] = np.arange(table * svcmod.MAGLEV_SIZE, (table + 1) * svcmod.MAGLEV_SIZE)
            mg_val[lo:lo + svcmod.MAGLEV_SIZE] = maglev.table(names)
        rkeys = [svcmod.revnat_key(self.NET, ip, port, Proto.TCP) for ip, port in frontends]
        rvals = [svcmod.revnat_value(fes[:svcmod.REVNAT_FRONTENDS]) for fes in frontends.values()]
        m = self.loaded.map
        m("backends").update_batch(b"".join(bkeys), b"".join(bvals), len(bkeys))
        if rkeys:
            m("revnat").update_batch(b"".join(rkeys), b"".join(rvals), len(rkeys))
        if multi:
            m("maglev").update_batch(mg_idx.tobytes(), mg_val.tobytes(), len(mg_idx))
        # frontends (slot 0) last: a service is visible only once its backends are there
        m("services").update_batch(b"".join(skeys), b"".join(svals), len(skeys))
        return time.perf_counter() - t0

    def clear(self) -> None:
        if self.loaded is not None:
            for name in ("services", "backends", "maglev", "revnat"):
                self.loaded.map(name).clear()

    def close(self) -> None:
        self._unload()


class LaceEmpty(Lace):
    """lace with the measured service alone, at every count: the reference lace(N) is divided by."""

    name = "lace@0"

    def program(self, services: list[Service], exact: bool) -> float:
        return super().program(make_services(0), exact)


class Direct:
    """No service: the client dials a backend pod through the node's plain routing (the ceiling)."""

    name = "direct"
    target = (BACKEND_IPS[0], TARGET_PORT)

    def __init__(self, topo: Topology) -> None:
        self.topo = topo

    def unavailable(self) -> str | None:
        return None

    def program(self, services: list[Service], exact: bool) -> float:
        return 0.0

    def inexact(self) -> str:
        return ""

    def clear(self) -> None:
        pass

    def close(self) -> None:
        pass


# ---- the run -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Cell:
    """One backend at one service count: its rounds, the setup time, or why it was not measured."""

    setup: float | None = None
    exact: bool = True           # programmed the way the backend's owner does (see EXACT_MAX)
    retried: int = 0             # rounds measured again because other tasks took the CPUs
    note: str = ""
    samples: list[Sample] = dataclasses.field(default_factory=list)

    @property
    def rate(self) -> float | None:
        """The median of the rounds' rates."""
        return statistics.median(x.rate for x in self.samples) if self.samples else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the rounds' rates."""
        rates = [x.rate for x in self.samples]
        return (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 and self.rate else None


def fmt_rate(c: Cell | None) -> str:
    return f"{c.rate:,.0f}" if c and c.rate is not None else "n/a"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def fmt_secs(t: float | None) -> str:
    if t is None:
        return "n/a"
    return f"{t * 1000:.0f} ms" if t < 1 else f"{t:.2f} s"


def estimate_setup(cells: dict[tuple[str, int], Cell], name: str, n: int) -> float | None:
    """The owner's-way setup time at n, as c * n^2 from the largest count loaded that way
    (the quadratic term dominates from ~2k services on, see EXACT_MAX)."""
    done = [(m, c.setup) for (b, m), c in cells.items() if b == name and c.exact and m >= 1000 and c.setup]
    if not done:
        return None
    m, t = max(done)
    return t * (n / m) ** 2


def fmt_setup(cells: dict[tuple[str, int], Cell], name: str, n: int) -> str:
    c = cells.get((name, n))
    if c is None or c.setup is None:
        return "n/a"
    if c.exact:
        return fmt_secs(c.setup)
    est = estimate_setup(cells, name, n)
    return f"~{est:,.0f} s est." if est else "n/a"


def print_report(counts: list[int], names: list[str], cells: dict[tuple[str, int], Cell], planes: list[Dataplane],
                 skipped: dict[str, str], rounds: int, seconds: float,
                 exact_max: int) -> None:
    def rate(name: str, n: int) -> float | None:
        c = cells.get((name, n))
        return c.rate if c else None

    print(f"\nnew TCP connections/s to one ClusterIP service (3 backends), N other services programmed; "
          f"median of {rounds} interleaved rounds of {seconds:g} s (each after {WARMUP:g} s warm-up), "
          f"client CPU {CLIENT_CPU}, server CPU {SERVER_CPU}")
    spreads = [c.spread for c in cells.values() if c.spread is not None]
    if spreads:
        print(f"round-to-round spread of a cell, (max - min) / median: median {statistics.median(spreads):.0%}, "
              f"worst {max(spreads):.0%} (this machine's noise; compare ratios well above it)")
    retried = sum(c.retried for c in cells.values())
    print(f"rounds measured again because other tasks took the client's or server's CPU (> {CONTENTION_MAX:.0%} "
          f"of a round): {retried}")
    head = f"{'services':>9}" + "".join(f"{n:>17}" for n in names)
    head += f"{'lace/ipt-nft':>14}{'lace/nft':>10}{'lace/lace(0)':>14}"
    print(head)
    first0 = rate("lace", counts[0]) if counts and counts[0] == 0 else None

    def lace0(n: int) -> float | None:
        """lace's rate with no other service: lace@0 of the same rounds, else lace at count 0."""
        return rate("lace@0", n) or first0

    for n in counts:
        row = f"{n:>9,}" + "".join(f"{fmt_rate(cells.get((b, n))):>17}" for b in names)
        row += f"{fmt_ratio(rate('lace', n), rate('iptables-nft', n)):>14}"
        row += f"{fmt_ratio(rate('lace', n), rate('nftables', n)):>10}"
        row += f"{fmt_ratio(rate('lace', n), lace0(n)):>14}"
        print(row)
    print("\nsetup: programming N services from empty (the one iptables-restore / nft -f run, rendering "
          "the rules not counted; lace: Maglev tables and batched map writes, packing the entries not counted)")
    print(f"{'services':>9}" + "".join(f"{n:>17}" for n in names))
    for n in counts:
        print(f"{n:>9,}" + "".join(f"{fmt_setup(cells, b, n):>17}" for b in names))
    for plane in planes:
        loaded = [(n, c.setup) for (b, n), c in cells.items() if b == plane.name and not c.exact]
        if loaded:
            took = ", ".join(f"{n:,}: {fmt_secs(t)}" for n, t in loaded)
            print(f"{plane.name} past {exact_max:,} services (est. = that setup time at the largest count loaded "
                  f"kube-proxy's way, x (n/that)^2): {plane.inexact()}; that load took {took}")
    for plane in planes:
        if type(plane) is Lace:
            from lace.datapath import registry
            print(f"lace: objects from {registry.bpf_dir()}")
        if type(plane) is Lace and plane.grown:
            from lace.datapath import registry
            sizes = ", ".join(f"{k} {v:,} entries (default {registry.MAPS[k].max_entries:,})"
                              for k, v in plane.grown.items())
            print(f"lace: maps sized past their defaults to hold the services: {sizes}")
    notes = [(b, n, c.note) for (b, n), c in cells.items() if c.note]
    for b, why in skipped.items():
        print(f"{b}: {why}")
    for b, n, note in notes:
        print(f"{b} at {n:,}: {note}")

    print("\ngoals")

    def goal(text: str, value: float | None, target: float, above: bool = True) -> None:
        if value is None:
            print(f"  {text:<44} n/a")
            return
        ok = value >= target if above else value <= target
        print(f"  {text:<44} {value:6.2f}x  (target >= {target:g}x)  {'met' if ok else 'NOT met'}")

    r = lambda a, b: a / b if a and b else None  # noqa: E731
    same = " (same rounds)" if rate("lace@0", 30_000) else " (count 0's rounds)"
    goal("lace(30k) / lace(0)" + same, r(rate("lace", 30_000), lace0(30_000)), 0.95)
    goal("lace / iptables-nft at 5k", r(rate("lace", 5_000), rate("iptables-nft", 5_000)), 1.5)
    goal("lace / iptables-legacy at 5k", r(rate("lace", 5_000), rate("iptables-legacy", 5_000)), 1.5)
    goal("lace / iptables-nft at 30k", r(rate("lace", 30_000), rate("iptables-nft", 30_000)), 4)
    goal("lace / iptables-legacy at 30k", r(rate("lace", 30_000), rate("iptables-legacy", 30_000)), 4)
    for n in counts:
        goal(f"lace / nftables at {n:,}", r(rate("lace", n), rate("nftables", n)), 1.0)
    if any(rate("direct", n) for n in counts):
        print("bounds: no translation beats the client dialling a pod directly, so lace / X <= direct / X")
        for n in counts:
            parts = [f"direct / {o} {fmt_ratio(rate('direct', n), rate(o, n)).strip()}"
                     for o in ("iptables-nft", "iptables-legacy", "nftables") if rate(o, n)]
            print(f"  {n:>7,} services: lace / direct {fmt_ratio(rate('lace', n), rate('direct', n)).strip()}"
                  + "".join(f"; {p}" for p in parts))


def build(names: list[str], tag: str, skipped: dict[str, str]) -> list[Dataplane]:
    """Each backend that can run here, on a topology of its own."""
    planes: list[Dataplane] = []
    for name in names:
        topo = Topology(tag, name.replace("iptables-", "ipt").replace("@", ""))
        plane: Dataplane
        if name == "lace":
            plane = Lace(topo, tag)
        elif name == "lace@0":
            plane = LaceEmpty(topo, tag)
        elif name == "direct":
            plane = Direct(topo)
        elif name == "nftables":
            plane = KubeProxyNftables(topo)
        else:
            plane = KubeProxyIptables(topo, name.split("-", 1)[1])
        why = plane.unavailable()
        if why:
            skipped[name] = why
            continue
        planes.append(plane)
        topo.build()
    return planes


def measure_count(crr: str, server: Server, planes: list[Dataplane], n: int, rounds: int, seconds: float,
                  exact_max: int) -> dict[str, Cell]:
    """Program n services into every backend, check each translates, then measure them in
    interleaved rounds (so that the machine's drift hits every backend alike)."""
    services = make_services(n)
    cells = {p.name: Cell() for p in planes}
    live = []
    for plane in planes:
        cell = cells[plane.name]
        plane.clear()
        cell.exact = n <= exact_max or not plane.inexact()
        cell.setup = plane.program(services, cell.exact)
        cell.note = probe(crr, plane) or ""
        if not cell.note:
            live.append(plane)
    for _ in range(rounds):
        for plane in live:
            cell = cells[plane.name]
            tries = []
            while len(tries) < TRIES:
                tries.append(run_client(crr, plane.topo, *plane.target, seconds, server=server))
                if not tries[-1].contended:
                    break
                time.sleep(RETRY_PAUSE)
            cell.retried += len(tries) - 1
            cell.samples.append(min(tries, key=lambda x: x.waited / x.seconds))
    for plane in planes:
        cell = cells[plane.name]
        failed = sum(x.errors for x in cell.samples)
        contended = sum(1 for x in cell.samples if x.contended)
        notes = [f"{failed} connections failed"] if failed else []
        if contended:
            notes.append(f"{contended} of {len(cell.samples)} rounds contended after {TRIES} tries")
        cell.note = cell.note or "; ".join(notes)
        spread = f" (rounds spread {cell.spread:.0%}, {cell.retried} retried)" if cell.spread is not None else ""
        print(f"{plane.name:>16} {n:>7,} services: {fmt_rate(cell):>9} conn/s{spread}, setup {fmt_secs(cell.setup)}"
              f"{'  (' + cell.note + ')' if cell.note else ''}", file=sys.stderr)
        plane.clear()
    return cells


def run(counts: list[int], names: list[str], rounds: int, seconds: float, exact_max: int) -> int:
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:4]}"
    workdir = tempfile.mkdtemp(prefix="lace-bench-services-")
    planes: list[Dataplane] = []
    cells: dict[tuple[str, int], Cell] = {}
    skipped: dict[str, str] = {}
    server: Server | None = None
    stopped = False
    try:
        crr = compile_crr(workdir)
        planes = build(names, tag, skipped)
        if not planes:
            print("no backend can run here:", "; ".join(f"{k}: {v}" for k, v in skipped.items()), file=sys.stderr)
            return 1
        server = Server(crr, [p.topo for p in planes])
        live = []
        for plane in planes:
            try:
                if isinstance(plane, Lace):
                    plane.attach()
                live.append(plane)
            except Exception as exc:   # a datapath being rebuilt, a verifier error: report, go on
                skipped[plane.name] = f"could not load and attach: {exc}"
        for n in counts:
            for name, cell in measure_count(crr, server, live, n, rounds, seconds, exact_max).items():
                cells[(name, n)] = cell
    except KeyboardInterrupt:
        stopped = True             # clean up, then report the counts measured so far
    finally:
        failure: BaseException | None = None
        steps = ([server.close] if server else []) + [p.close for p in planes] + [p.topo.close for p in planes]
        for step in steps:
            try:
                step()
            except BaseException as exc:   # keep cleaning up
                failure = failure or exc
        shutil.rmtree(workdir, ignore_errors=True)
        if failure is not None:
            print(f"cleanup failed: {failure}", file=sys.stderr)
    if stopped:
        counts = [n for n in counts if any(m == n for _, m in cells)]
        print("interrupted: the counts measured so far", file=sys.stderr)
    print_report(counts, names, cells, planes, skipped, rounds, seconds, exact_max)
    return 130 if stopped else 0


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so the namespaces and pins are removed either way."""
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"counts {','.join(map(str, QUICK_COUNTS))}, 1 s per cell")
    ap.add_argument("--counts", help=f"service counts, comma-separated (default {','.join(map(str, COUNTS))})")
    ap.add_argument("--duration", type=float, help="counted seconds per cell, split over the rounds "
                    "(default 6, 1.5 with --quick)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per cell; the median is reported "
                    "(default 8, 3 with --quick)")
    ap.add_argument("--exact-max", type=int, default=EXACT_MAX,
                    help=f"largest count loaded exactly as kube-proxy does where that is O(n^2) (default {EXACT_MAX:,})")
    ap.add_argument("--only", help=f"backends to run, comma-separated, from {','.join(BACKENDS)}")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/services.py needs root (network namespaces, netfilter, BPF)", file=sys.stderr)
        return 2
    counts = [int(x) for x in a.counts.split(",")] if a.counts else list(QUICK_COUNTS if a.quick else COUNTS)
    names = [x.strip() for x in a.only.split(",")] if a.only else list(BACKENDS)
    unknown = [x for x in names if x not in BACKENDS]
    if unknown:
        print(f"unknown backend(s) {', '.join(unknown)}: choose from {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    duration = a.duration or (1.5 if a.quick else 6.0)
    rounds = a.rounds or (3 if a.quick else 8)
    signal.signal(signal.SIGTERM, interrupted)
    return run(counts, names, rounds, duration / rounds, a.exact_max)


if __name__ == "__main__":
    sys.exit(main())
