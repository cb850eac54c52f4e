"""Running the connectivity scenarios against a lab: deploy the test's own objects, wait until the
cluster has programmed them, run the checks (several at once), judge each from its answer and the
flows every node recorded during it, and remove everything again.

The roles and what they are for are described in :mod:`lace.cli.connectivity.scenarios`. Only the
objects the selected scenarios need are deployed. Checks run as processes inside the source's
namespace — a pod's (with its resolv.conf, as ``lace lab exec``) or a node's host namespace and
host cgroup (as ``lace exec --node``) — all spawned from the calling thread, then waited for and
judged on threads of their own. Flows come from each node's agent (``GET /v1/flows``, what ``node
trace flow`` reads), filtered to the test's addresses.
"""

from __future__ import annotations

import io
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import scenarios as S
from .judge import FAIL, SKIP, Outcome, Result, check_answer, evidence_missing, judge, select_flows

POD_ROLES = ("client", "echo-same", "echo-other", "guarded", "audited", "isolated", "masq", "open")
NODE_B_ROLES = {"echo-other", "guarded", "audited", "open"}
NETWORK_ROLES = {"isolated": "iso", "masq": "masq", "open": "open"}
NETWORK_CIDRS = {"iso": ("10.201.0.0/16", "fd20:201::/64"), "masq": ("10.202.0.0/16", "fd20:202::/64"),
                 "open": ("10.203.0.0/16", "fd20:203::/64")}
TCP_PORTS, UDP_PORTS = (80, 8080), (53, 5353)
SERVICE = "echo"
SERVICE_PORTS = {80: 8080, 53: 5353}   # service port -> the pods' port behind it
PROBE_PORT = 8080
NETCHECK = [sys.executable, "-m", "lace.lab.netcheck"]
PMTU = [sys.executable, "-m", "lace.cli.connectivity.pmtu"]
#: resolve a name through the pod's resolv.conf until every wanted address is there (or 10 s)
RESOLVE_CODE = r"""
import socket, sys, time
name, want = sys.argv[1], set(sys.argv[2:])
deadline, got, err = time.monotonic() + 10, set(), ""
while True:
    try:
        got = {i[4][0] for i in socket.getaddrinfo(name, 80, 0, socket.SOCK_STREAM)}
        err = ""
    except socket.gaierror as e:
        err = str(e)
    if want <= got or time.monotonic() > deadline:
        break
    time.sleep(0.1)
if not got:
    print(f"cannot resolve {name}: {err}", file=sys.stderr)
    sys.exit(1)
print(" ".join(sorted(got)))
"""
SEND_CODE = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    s.sendto(b"lace-connectivity", (host, port))
print(f"sent to {host}:{port}")
"""


class DeployError(Exception):
    """The test's objects could not be deployed, or did not become ready in time."""


def new_tag() -> str:
    return secrets.token_hex(3)


def default_namespace(tag: str) -> str:
    return f"lace-connectivity-{tag}"


def roles_needed(chosen: list[S.Scenario]) -> list[str]:
    """The pod roles the chosen scenarios use (a service needs both echo pods as backends)."""
    want: set[str] = set()
    for s in chosen:
        for end in (s.source, s.target):
            if end in ("service", "service-name"):
                want |= {"echo-same", "echo-other"}
            elif end in POD_ROLES:
                want.add(end)
        if s.source in ("host:A",) and s.target in POD_ROLES:
            want.add(s.target)
    return [r for r in POD_ROLES if r in want]


def network_name(tag: str, kind: str) -> str:
    return f"lcx-{tag}-{kind}"


def manifests(ns: str, tag: str, roles: list[str], node_a: str, node_b: str, *,
              create_namespace: bool) -> list[dict[str, Any]]:
    """Every object the run applies, for the pods ``roles`` (pure)."""
    objs: list[dict[str, Any]] = []
    if create_namespace:
        objs.append({"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": ns, "labels": {"app.kubernetes.io/part-of": "lace-connectivity"}}})
    for role in roles:
        kind = NETWORK_ROLES.get(role)
        if kind:
            spec: dict[str, Any] = {"cidrs": list(NETWORK_CIDRS[kind])}
            if kind in ("masq", "open"):
                spec["routes"] = [{"to": "outside", "masquerade": kind == "masq"}]
            objs.append({"apiVersion": "lace.dev/v1alpha1", "kind": "Network",
                         "metadata": {"name": network_name(tag, kind),
                                      "labels": {"app.kubernetes.io/part-of": "lace-connectivity"}},
                         "spec": spec})
    for role in roles:
        labels = {"app": "echo" if role.startswith("echo-") else role, "lace-connectivity": role}
        if role == "client":
            labels["role"] = "client"
        meta: dict[str, Any] = {"name": role, "namespace": ns, "labels": labels}
        if role in NETWORK_ROLES:
            meta["annotations"] = {"lace.dev/network": network_name(tag, NETWORK_ROLES[role])}
        container: dict[str, Any] = {
            "name": "podserver", "image": "lace/podserver",
            "ports": [{"name": f"tcp-{p}", "containerPort": p} for p in TCP_PORTS]
            + [{"name": f"udp-{p}", "containerPort": p, "protocol": "UDP"} for p in UDP_PORTS]}
        if role == "isolated":
            container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": PROBE_PORT}, "periodSeconds": 1}
        objs.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                     "spec": {"nodeName": node_b if role in NODE_B_ROLES else node_a, "containers": [container]}})
    if "echo-same" in roles and "echo-other" in roles:
        objs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": ns},
                     "spec": {"selector": {"app": "echo"}, "ipFamilyPolicy": "PreferDualStack",
                              "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                                        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}})
    if "guarded" in roles:
        objs.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": "guard", "namespace": ns},
                     "spec": {"podSelector": {"matchLabels": {"app": "guarded"}}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                                           "ports": [{"protocol": "TCP", "port": 80}]}]}})
    if "audited" in roles:
        objs.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": "audit", "namespace": ns, "annotations": {"lace.dev/audit": "true"}},
                     "spec": {"podSelector": {"matchLabels": {"app": "audited"}}, "policyTypes": ["Ingress"]}})
    return objs


@dataclass
class Plan:
    """A scenario resolved against the deployed objects: where and what to run, what must come back."""

    scenario: S.Scenario
    where: tuple[str, str] = ("", "")     # ("pod", role) | ("host", node) | ("none", "")
    argv: list[str] = field(default_factory=list)
    want: list[str] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)                 # the flows' source addresses
    dests: set[tuple[str, int | None]] = field(default_factory=set)  # (address, port) they go to
    send_to: str = ""                      # SEND: the outside must see this address
    family: int = 0                        # the flows' family (0: either)

    @property
    def addrs(self) -> set[str]:
        """Every address involved (the agents' flow filter)."""
        return set(self.sources) | {a for a, _ in self.dests}

    def select(self, flows: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
        return select_flows(flows, self.sources, self.dests, self.scenario.proto, start, end, family=self.family)


@dataclass
class Env:
    """Addresses of everything deployed, and what the cluster offers."""

    ns: str
    node_a: str
    node_b: str
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)     # role -> pod object
    vips: list[str] = field(default_factory=list)
    dns_addrs: list[str] = field(default_factory=list)                # kube-dns VIPs and pods
    host_addrs: dict[str, list[str]] = field(default_factory=dict)    # node -> host addresses
    node_addrs: dict[str, list[str]] = field(default_factory=dict)    # node -> InternalIPs
    internet: dict[int, str] = field(default_factory=dict)
    outside_ports: dict[str, int] = field(default_factory=dict)
    pod_mtu: int = 1460
    have: set[str] = field(default_factory=set)
    probe_window: tuple[float, float] = (0.0, 0.0)

    def ips(self, role: str) -> list[str]:
        p = self.pods.get(role) or {}
        return [a["ip"] for a in (p.get("status") or {}).get("podIPs") or []]

    def ip(self, role: str, family: int) -> str | None:
        return next((a for a in self.ips(role) if (":" in a) == (family == 6)), None)


def _of(addrs: list[str], family: int) -> str | None:
    return next((a for a in addrs if (":" in a) == (family == 6)), None)


def plan(s: S.Scenario, env: Env) -> Plan:
    """How to run ``s`` in ``env`` (pure)."""
    p = Plan(s, family=s.family)
    fam = s.family
    timeout = "2" if s.expect_connect else "1"
    names = {r: f"{env.ns}/{r}" for r in POD_ROLES}
    backends = [names["echo-same"], names["echo-other"]]

    def to(addrs: list[str] | set[str], *ports: int | None) -> None:
        p.dests |= {(a, port) for a in addrs for port in ports}
    if s.source.startswith("host:") or s.source.startswith("kubelet:"):
        node = env.node_a
        p.where = ("host", node) if s.source.startswith("host:") else ("none", "")
        p.sources |= set(env.host_addrs.get(node, []))
    else:
        p.where = ("pod", s.source)
        p.sources |= set(env.ips(s.source))
    echo_ips = env.ips("echo-same") + env.ips("echo-other")
    if s.target == "service":
        dst = _of(env.vips, fam) or ""
        to(env.vips, s.port)
        to(echo_ips, SERVICE_PORTS[s.port])
        p.want = backends
    elif s.target == "service-name":
        dst = f"{SERVICE}.{env.ns}"
        to(env.vips, 80)
        to(echo_ips, 8080)
        to(env.dns_addrs, 53)
        p.want = backends
        p.family = 0
    elif s.target == "outside":
        dst = env.internet.get(fam, "")
        src_node = env.node_b if s.source in NODE_B_ROLES else env.node_a
        p.sources |= set(env.node_addrs.get(src_node, []))   # after masquerade
        to(list(env.internet.values()), env.outside_ports.get("tcp" if s.mode == S.TCP else "udp", 0))
        p.want = [a for a in env.node_addrs.get(src_node, []) if (":" in a) == (fam == 6)] \
            if s.answer == S.ANSWER_NODE_ADDRESS else [a for a in [env.ip(s.source, fam)] if a]
    else:
        dst = env.ip(s.target, fam) or ""
        to(env.ips(s.target), s.port)
        p.want = [names.get(s.target, s.target)]
        if s.mode == S.PROBE:
            to([e["ip"] for e in (env.pods.get(s.target, {}).get("status") or {}).get("probeIPs") or []], s.port)
    if s.mode == S.TCP:
        port = env.outside_ports.get("tcp", 0) if s.target == "outside" else s.port
        p.argv = [*NETCHECK, "tcp", dst, str(port), "--timeout", timeout]
    elif s.mode == S.UDP:
        port = env.outside_ports.get("udp", 0) if s.target == "outside" else s.port
        p.argv = [*NETCHECK, "udp", dst, str(port), "--timeout", "1"]
    elif s.mode == S.PMTU:
        p.argv = [*PMTU, dst, str(s.port), "--mtu", str(env.pod_mtu)]
    elif s.mode == S.RESOLVE:
        name = f"{SERVICE}.{env.ns}.svc.cluster.local"
        p.argv = [sys.executable, "-c", RESOLVE_CODE, name, *env.vips]
        p.want = list(env.vips)
        p.dests = {(a, 53) for a in env.dns_addrs}
        p.family = 0
    elif s.mode == S.SEND:
        p.argv = [sys.executable, "-c", SEND_CODE, dst, str(env.outside_ports.get("udp", 0))]
        p.send_to = env.ip(s.source, fam) or ""
    elif s.mode == S.PROBE:
        p.where = ("none", "")
    return p


# ---- the run -------------------------------------------------------------------------------------

Progress = Callable[[str], None]


class Runner:
    """One run. ``store``: the lab's Store; ``lab``: its topology (lace.lab.topology.Lab)."""

    def __init__(self, store: Any, lab: Any, state_dir: str, *, namespace: str | None = None,
                 parallel: int = 6, deploy_timeout: float = 90.0, progress: Progress = lambda m: None) -> None:
        self.store = store
        self.lab = lab
        self.state_dir = state_dir
        self.tag = new_tag()
        self.own_namespace = namespace is None
        self.ns = namespace or default_namespace(self.tag)
        self.parallel = max(1, parallel)
        self.deploy_timeout = deploy_timeout
        self.progress = progress
        self.node_a = lab.nodes[0].name
        self.node_b = lab.nodes[1].name if len(lab.nodes) > 1 else lab.nodes[0].name
        self.applied: list[dict[str, Any]] = []
        self.outside: Any = None
        self.env = Env(self.ns, self.node_a, self.node_b, pod_mtu=getattr(lab, "pod_mtu", 1460))

    # -- deploy ------------------------------------------------------------------------------------

    def deploy(self, chosen: list[S.Scenario]) -> None:
        from lace.store import NotFound
        if not self.own_namespace:
            try:
                self.store.get("namespaces", self.ns)
            except NotFound:
                raise DeployError(f'namespace "{self.ns}" does not exist: create it, or leave out --namespace') from None
        roles = roles_needed(chosen)
        objs = manifests(self.ns, self.tag, roles, self.node_a, self.node_b,
                         create_namespace=self.own_namespace)
        t0 = time.time()
        self.progress(f"deploying {len(roles)} pods into namespace {self.ns} "
                      f"({self.node_a}{', ' + self.node_b if self.node_b != self.node_a else ''})")
        # recorded before the write, so that a failure half-way still removes what was made
        self.applied = objs
        self.store.apply_all(objs)
        self._wait_ready(roles)
        self.env.probe_window = (t0, time.time())
        if "isolated" in roles:
            self.env.pods["isolated"] = self.store.get("pods", "isolated", self.ns)
        self._discover(roles)
        if any(s.target == "outside" for s in chosen) and S.OUTSIDE in self.env.have:
            from .outside import OutsideServer
            self.outside = OutsideServer(self.lab.outside_netns, self.lab.internet4, self.lab.internet6)
            self.env.outside_ports = {"tcp": self.outside.tcp_port, "udp": self.outside.udp_port}
        self.progress(f"ready in {time.time() - t0:.1f}s")

    def _wait(self, what: str, fn: Callable[[], Any], deadline: float) -> Any:
        last: Any = None
        while True:
            last = fn()
            if last is True or (last and not isinstance(last, str)):
                return last
            if time.monotonic() > deadline:
                raise DeployError(f"timed out waiting for {what}" + (f": {last}" if isinstance(last, str) else ""))
            time.sleep(0.1)

    def _wait_ready(self, roles: list[str]) -> None:
        deadline = time.monotonic() + self.deploy_timeout

        def pods_ready() -> Any:
            ps = {p["metadata"]["name"]: p for p in self.store.list("pods", self.ns).items}
            waiting = []
            for r in roles:
                st = (ps.get(r) or {}).get("status") or {}
                if st.get("phase") != "Running":
                    waiting.append(f"{r} ({st.get('phase') or 'Pending'})")
                elif r == "isolated" and not any(c.get("type") == "Ready" and c.get("status") == "True"
                                                 for c in st.get("conditions") or ()):
                    waiting.append(f"{r} (not Ready)")
            if waiting:
                return "pods " + ", ".join(waiting)
            self.env.pods.update({r: ps[r] for r in roles})
            return True
        self._wait("the pods", pods_ready, deadline)
        if "echo-same" in roles and "echo-other" in roles:
            svc = self.store.get("services", SERVICE, self.ns)
            self.env.vips = list((svc.get("spec") or {}).get("clusterIPs") or [])
            if self.env.vips:
                self._wait("Service echo on every node", self._service_programmed, deadline)
        for role, policy in (("guarded", "guard"), ("audited", "audit")):
            if role in roles:
                self._wait(f"NetworkPolicy {policy} on {self.node_b}",
                           lambda policy=policy: self._policy_programmed(policy), deadline)

    def _node_json(self, node: str, argv: list[str]) -> dict[str, Any]:
        from lace.cli.commands.exec import lab_env
        from lace.cli.node.main import main as node_main
        n = self.lab.node(node)
        out, err = io.StringIO(), io.StringIO()
        rc = node_main([*argv, "-o", "json"], lab_env(dict(os.environ, NO_COLOR="1"), self.state_dir, n),
                       stdout=out, stderr=err, stdin=io.StringIO(""))
        if rc == 130:   # Ctrl-C inside the nested command (its run_command caught it): pass it on
            raise KeyboardInterrupt
        if rc != 0:
            return {}
        return json.loads(out.getvalue() or "{}")

    def _service_programmed(self) -> Any:
        for n in self.lab.nodes:
            doc = self._node_json(n.name, ["bpf", "show", "services", "-n"])
            for vip in self.env.vips:
                if not any(e.get("addr") == vip and e.get("slot") == 0 and e.get("active_count") == 2
                           for e in doc.get("entries") or ()):
                    return f"{vip} has not 2 active backends on {n.name} yet"
        return True

    def _policy_programmed(self, policy: str) -> Any:
        doc = self._node_json(self.node_b, ["bpf", "show", "policy", "--ingress"])
        mine = [e for e in doc.get("entries") or () if e.get("policy") == f"{self.ns}/{policy}"]
        if not any(e.get("selected") for e in mine):
            return f"no entries of {self.ns}/{policy} yet"
        if policy == "guard" and not any(not e.get("selected") for e in mine):
            return f"no allow entry of {self.ns}/{policy} yet"
        return True

    def _discover(self, roles: list[str]) -> None:
        env = self.env
        have = {S.POLICY, S.MASQUERADE}
        if len(self.lab.nodes) > 1:
            have.add(S.TWO_NODES)
        if env.vips:
            have.add(S.SERVICES)
        if any(":" in a for r in roles for a in env.ips(r)):
            have.add(S.IPV6)
        if getattr(self.lab, "outside_netns", None):
            have.add(S.OUTSIDE)
            env.internet = {4: self.lab.internet4, 6: self.lab.internet6}
        have.add(S.PROBES)   # the lab's kubelet probes (the scenario itself checks the pod got Ready)
        from lace.store import NotFound
        try:
            dns = self.store.get("services", "kube-dns", "kube-system")
            env.dns_addrs = list((dns.get("spec") or {}).get("clusterIPs") or [])
            for p in self.store.list("pods", "kube-system").items:
                if (p["metadata"].get("labels") or {}).get("k8s-app") == "kube-dns":
                    env.dns_addrs += [a["ip"] for a in (p.get("status") or {}).get("podIPs") or []]
            if env.dns_addrs:
                have.add(S.DNS)
        except NotFound:
            pass
        for lease in self.store.list("ipleases").items:
            pod = lease["spec"].get("pod") or ""
            if pod.startswith("node/"):
                env.host_addrs.setdefault(pod[len("node/"):], []).append(lease["spec"]["ip"])
        for n in self.store.list("nodes").items:
            env.node_addrs[n["metadata"]["name"]] = [a["address"] for a in (n.get("status") or {}).get("addresses") or []
                                                     if a.get("type") == "InternalIP"]
        env.have = have

    # -- checks ------------------------------------------------------------------------------------

    def _spawn(self, p: Plan) -> subprocess.Popen[bytes]:
        from lace.lab import cluster, topology
        from lace.lab.mountns import PrivateFile
        kind, who = p.where
        if kind == "pod":
            rec = cluster.pod_sandbox(self.state_dir, self.ns, who)
            private = PrivateFile(rec["resolv_conf"]) if rec.get("resolv_conf") else None
            enter = topology.entering(rec["netns"], None, *([private.enter] if private is not None else []))
        else:
            node = self.lab.node(who)
            enter = topology.entering(node.netns, node.cgroup)
        return subprocess.Popen(p.argv, preexec_fn=enter, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))

    def flows(self, addrs: set[str], numeric: bool = True) -> list[dict[str, Any]]:
        """Every node's recorded flows to or from ``addrs`` (nodes that do not answer are skipped)."""
        from lace.cli.errors import CliError
        from lace.cli.node.env import NodeEnv
        from lace.cli.node.resolve import for_node
        from lace.cli.node.trace import describe, fetch
        from lace.lab import cluster
        from lace.store.config import lab_store
        store_path = str(lab_store(self.state_dir))
        url = "/v1/flows?ip=" + ",".join(sorted(addrs))
        out: list[dict[str, Any]] = []
        for n in self.lab.nodes:
            ne = NodeEnv(n.pin_root, store_path, n.name, cluster.agent_socket(self.state_dir, n.name))
            res = for_node(numeric, ne.require_store)
            try:
                out += [describe(ev, res) for ev in fetch(ne, url, False)]
            except CliError:
                continue
        return out

    def _finish(self, p: Plan, proc: subprocess.Popen[bytes] | None, started: float,
                done: queue.Queue[Result]) -> None:
        s = p.scenario
        try:
            if proc is None:   # PROBE: the pod's Ready condition, reached during the deploy
                pod = self.env.pods.get(s.target) or {}
                ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (pod.get("status") or {}).get("conditions") or ())
                probe_ips = [e["ip"] for e in (pod.get("status") or {}).get("probeIPs") or []]
                started, finished = self.env.probe_window
                outcome = Outcome(0 if ready else 1, f"Ready via probe address {', '.join(probe_ips) or '-'}"
                                  if ready else "the pod never became Ready", started, finished)
            else:
                try:
                    out, _ = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, _ = proc.communicate()
                text = out.decode(errors="replace")
                rc = proc.returncode
                if s.mode == S.SEND and rc == 0:
                    deadline = time.monotonic() + 3
                    while p.send_to not in self.outside.seen("udp") and time.monotonic() < deadline:
                        time.sleep(0.05)
                    seen = sorted(self.outside.seen("udp"))
                    text += f"the outside saw: {', '.join(seen) or 'nothing'}\n"
                    ok = p.send_to in seen
                    outcome = Outcome(rc, text, started, time.time(), ok,
                                      "" if ok else f"{p.send_to} never reached the outside")
                else:
                    outcome = Outcome(rc, text, started, time.time())
                    if rc == 0 and s.expect_connect:
                        outcome.answer_ok, outcome.answer_problem = check_answer(s.answer, text, p.want)
            flows = p.select(self.flows(p.addrs), outcome.started, outcome.finished)
            if evidence_missing(s, flows):   # the agents may not have read the last events yet
                deadline = time.monotonic() + 2
                while evidence_missing(s, flows) and time.monotonic() < deadline:
                    time.sleep(0.1)
                    flows = p.select(self.flows(p.addrs), outcome.started, outcome.finished)
            result = judge(s, outcome, flows)
            if result.status == FAIL:   # names for the report
                result.flows = p.select(self.flows(p.addrs, numeric=False), outcome.started, outcome.finished)
        except Exception as exc:   # noqa: BLE001 - one scenario's error is that scenario's failure
            result = Result(s, FAIL, f"the check itself failed: {exc}", time.time() - started)
        done.put(result)

    def run(self, chosen: list[S.Scenario], report: Callable[[Result], None]) -> list[Result]:
        results: list[Result] = []
        todo: deque[Plan] = deque()
        for s in chosen:
            lacking = S.missing(s, self.env.have)
            if lacking:
                r = Result(s, SKIP, f"skipped: needs {', '.join(lacking)}")
                results.append(r)
                report(r)
            else:
                todo.append(plan(s, self.env))
        done: queue.Queue[Result] = queue.Queue()
        running = 0
        while todo or running:
            while todo and running < self.parallel:
                p = todo.popleft()
                started = time.time()
                proc = None
                if p.where[0] != "none":
                    try:
                        proc = self._spawn(p)
                    except Exception as exc:   # noqa: BLE001
                        r = Result(p.scenario, FAIL, f"cannot run the check: {exc}")
                        results.append(r)
                        report(r)
                        continue
                threading.Thread(target=self._finish, args=(p, proc, started, done), daemon=True).start()
                running += 1
            if running:
                r = done.get()
                running -= 1
                results.append(r)
                report(r)
        order = {s.name: i for i, s in enumerate(chosen)}
        return sorted(results, key=lambda r: order[r.scenario.name])

    # -- clean-up ----------------------------------------------------------------------------------

    def cleanup(self, timeout: float = 30.0) -> list[str]:
        """Remove everything the run created (safe to call twice); the problems left, if any."""
        from lace.store import NotFound, StoreError
        problems: list[str] = []
        if self.outside is not None:
            self.outside.close()
            self.outside = None
        objs, self.applied = self.applied, []
        if not objs:
            return problems
        ns_objs = [o for o in objs if o["kind"] in ("Pod", "Service", "NetworkPolicy")]
        if self.own_namespace:
            ns_objs = []
        for o in sorted(ns_objs, key=lambda o: {"NetworkPolicy": 0, "Service": 1, "Pod": 2}[o["kind"]]):
            try:
                self.store.delete(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"], grace_period=0)
            except NotFound:
                pass
            except StoreError as exc:
                problems.append(f"{o['kind']} {o['metadata']['name']}: {exc}")
        if self.own_namespace:
            try:
                self.store.delete("Namespace", self.ns, grace_period=0)
            except NotFound:
                pass
            except StoreError as exc:
                problems.append(f"namespace {self.ns}: {exc}")
        deadline = time.monotonic() + timeout
        for o in objs:
            if o["kind"] != "Network":
                continue
            while True:
                try:
                    self.store.delete("Network", o["metadata"]["name"])
                    break
                except NotFound:
                    break
                except StoreError as exc:
                    if time.monotonic() > deadline:
                        problems.append(f"network {o['metadata']['name']}: {exc}")
                        break
                    time.sleep(0.1)
        # the kubelet tears the sandboxes down: wait until none of ours is left
        from lace.lab.kubelet import Sandboxes
        sandboxes = Sandboxes(os.path.join(self.state_dir, "kubelet"))
        pods = [o["metadata"]["name"] for o in objs if o["kind"] == "Pod"]
        while any(sandboxes.find(self.ns, p) is not None for p in pods):
            if time.monotonic() > deadline:
                problems.append("the kubelet has not removed every test pod yet")
                break
            time.sleep(0.1)
        return problems
