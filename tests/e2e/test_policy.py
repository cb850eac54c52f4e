"""NetworkPolicy end to end on the shared lab: the x/y/z model (3 namespaces x pods a, b, c, one
pod per node, each serving TCP and UDP 80 and 81) and every scenario of
tests/unit/test_policy_scenarios.py, probing the full 9x9 matrix in parallel after the nodes' maps
have settled (pinned maps == what the store's policies imply, polled). Plus ``lace policy trace``
against the real maps, audit verdicts in the flow stream and hit counters."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lace import netlink
from lace.lab import cluster, topology
from lace.store import SqliteStore

from ..unit.test_policy_scenarios import ALL, NAMESPACES, NODES, PODS, PORTS, SCENARIOS, Reach, Step, port_name
from .conftest import LabHandle, ips, namespace

PROBE_TIMEOUT = 0.5
TRIES = 2   # a blocked probe is retried once: an allowed one must answer at least once


def _pod(ns: str, name: str, extra: dict | None = None) -> dict:
    ports = [{"containerPort": port, "protocol": proto, "name": port_name(port, proto)} for port, proto in PORTS]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"pod": name, **(extra or {})}},
            "spec": {"nodeName": NODES[name], "containers": [{"name": "c", "image": "lace/podserver", "ports": ports}]}}


class Model:
    """The x/y/z pods in the session lab (namespaces prefixed so they never clash)."""

    def __init__(self, lab: LabHandle, prefix: str) -> None:
        self.lab = lab
        self.prefix = prefix
        self.ns = {n: f"{prefix}{n}" for n in NAMESPACES}
        self.labels = {"pods": {}, "ns": {}}
        self.applied: set[str] = set()
        self._sport = 20000
        self._lock = threading.Lock()
        lab.apply([namespace(self.ns[n], ns=n) for n in NAMESPACES])
        lab.apply([_pod(self.ns[n], p) for n in NAMESPACES for p in PODS])
        self.ip4 = {}
        self.ip6 = {}
        for n in NAMESPACES:
            ps = lab.wait(self.ns[n], list(PODS))
            for p in PODS:
                self.ip4[f"{n}/{p}"], self.ip6[f"{n}/{p}"] = ips(ps[p])
        self.store_path = f"{lab.dir}/store.db"
        self.pins = {n.name: n.pin_root for n in topology.load(lab.name, state_dir=lab.dir).nodes}

    def real(self, key: str) -> str:
        ns, pod = key.split("/")
        return f"{self.ns[ns]}/{pod}"

    def localise(self, obj: dict) -> dict:
        """A scenario's policy in this model's namespaces (selectors on ns=<x> labels stay as they are)."""
        out = json.loads(json.dumps(obj))
        out["metadata"]["namespace"] = self.ns[out["metadata"]["namespace"]]
        return out

    def apply_step(self, step: Step) -> None:
        docs = [self.localise(p) for p in step.policies]
        for n in NAMESPACES:
            want = {"ns": n, **step.ns_labels.get(n, {})}
            if self.labels["ns"].get(n, {"ns": n}) != want:
                docs.append(namespace(self.ns[n], **want))
                self.labels["ns"][n] = want
        for key in ALL:
            extra = step.pod_labels.get(key, {})
            if self.labels["pods"].get(key, {}) != extra:
                ns, name = key.split("/")
                docs.append(_pod(self.ns[ns], name, extra))
                self.labels["pods"][key] = extra
        if docs:
            self.lab.apply(docs)
        names = {f'{d["metadata"]["namespace"]}/{d["metadata"]["name"]}' for d in docs if d["kind"] == "NetworkPolicy"}
        for gone in sorted(self.applied - names):
            ns, name = gone.split("/")
            self.lab.lace("delete", "networkpolicy", name, "-n", ns)
        self.applied = names
        self.settle()

    def settle(self, timeout: float = 20.0) -> None:
        """Poll until every node's pinned policy and prefix-segment maps are what the store implies."""
        from lace.policy.check import lab_drift
        deadline = time.monotonic() + timeout
        while True:
            with SqliteStore(self.store_path) as store:
                drift = lab_drift(store, self.pins)
            if not any(drift.values()):
                return
            assert time.monotonic() < deadline, {n: d.as_dict() for n, d in drift.items()}
            time.sleep(0.05)

    def probe_row(self, src: str, port: int, proto: str, family: int) -> dict[str, bool]:
        """One process in ``src`` probes all nine pods concurrently; a TCP answer must name the pod."""
        addrs = self.ip4 if family == 4 else self.ip6
        with self._lock:
            base = self._sport
            self._sport += len(ALL) * TRIES
            if self._sport > 60000:
                self._sport = 20000
        argv = [sys.executable, "-c", PROBE, proto.lower(), str(port), str(PROBE_TIMEOUT), str(TRIES), str(base)]
        argv += [f"{addrs[d]}={self.real(d)}" for d in ALL]
        # straight into the pod's namespace: in-process `lace lab exec` from many threads races on
        # sys.stdout (its capture test), so the probe rows run as plain subprocesses
        ns, pod = self.real(src).split("/")
        path = netlink.netns.path(cluster.pod_netns(self.lab.dir, ns, pod))
        res = subprocess.run(["nsenter", f"--net={path}", *argv], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        got = json.loads(res.stdout.strip().splitlines()[-1])
        return {d: got[f"{addrs[d]}={self.real(d)}"] for d in ALL}

    def matrix(self, port: int, proto: str, family: int = 4) -> dict[tuple[str, str], bool]:
        with ThreadPoolExecutor(max_workers=len(ALL)) as pool:
            rows = dict(zip(ALL, pool.map(lambda s: self.probe_row(s, port, proto, family), ALL)))
        return {(s, d): rows[s][d] for s in ALL for d in ALL}


#: run inside a pod: probe every "ip=ns/name" argument concurrently, print {target: answered}.
#: Each attempt binds its own source port (base + i): a 5-tuple is never reused within a session, so
#: a probe never rides a conntrack entry left by an earlier allowed probe (the datapath treats a SYN
#: that matches a closing entry as established — reported to the conntrack owner).
PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
mode, port, timeout, tries, base = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
targets = sys.argv[6:]
def attempt(ip, name, sport):
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM if mode == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(timeout)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", sport))
        if mode == "tcp":
            s.connect((ip, port))
            s.sendall(f"GET / HTTP/1.0\\r\\nHost: {ip}\\r\\n\\r\\n".encode())
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.split(b"\\r\\n\\r\\n", 1)[-1].decode().strip() == name
        payload = f"probe {sport}".encode()
        s.sendto(payload, (ip, port))
        return s.recvfrom(2048)[0] == payload
    except OSError:
        return False
    finally:
        s.close()
def one(i):
    ip, name = targets[i].split("=")
    return any(attempt(ip, name, base + i * tries + t) for t in range(tries))
with ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(one, range(len(targets)))))))
"""


@pytest.fixture(scope="module")
def model(lab):
    m = Model(lab, "np")
    yield m
    for gone in sorted(m.applied):
        ns, name = gone.split("/")
        lab.lace("delete", "networkpolicy", name, "-n", ns, check=False)
    for n in m.ns.values():
        lab.lace("delete", "namespace", n, check=False)


def _check(model: Model, reach: Reach, port: int, proto: str, family: int, what: str) -> None:
    got = model.matrix(port, proto, family)
    wrong = {k: v for k, v in got.items() if v != reach.get(*k)}
    assert not wrong, f"{what} {port}/{proto} IPv{family}: {len(wrong)} cells differ " \
                      f"(! = expected open but blocked, ? = expected blocked but open)\n{reach.render(got)}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_reachability(model, scenario):
    for n, step in enumerate(scenario.steps(model.ip4)):
        model.apply_step(step)
        for (port, proto), reach in step.expect.items():
            _check(model, reach, port, proto, 4, f"{scenario.name} step {n}")
    model.apply_step(Step([], {}))   # leave nothing behind for the next scenario


def test_ipv6_default_deny_and_namespace(model):
    step = SCENARIOS[[s.name for s in SCENARIOS].index("namespace-selector")].steps(model.ip4)[0]
    model.apply_step(step)
    _check(model, step.expect[(80, "TCP")], 80, "TCP", 6, "namespace-selector")
    model.apply_step(Step([], {}))


def _trace(model: Model, *argv: str) -> tuple[int, dict]:
    rc, out, _ = model.lab.lace("policy", "trace", *argv, "-o", "json", check=False)
    return rc, json.loads(out)


def test_policy_trace_reads_the_programmed_maps(model):
    """Both directions, the verdict, the deciding rule or default deny, hit counters, JSON."""
    x, y = model.ns["x"], model.ns["y"]
    step = SCENARIOS[[s.name for s in SCENARIOS].index("both-sides")].steps(model.ip4)[0]
    model.apply_step(step)
    rc, doc = _trace(model, "--from", f"{x}/a", "--to", f"{y}/c", "--port", "80")
    assert rc == 0 and doc["verdict"] == "allow" and doc["agrees"], doc
    assert doc["egress"]["policy"] == f"{x}/a-to-y" and doc["egress"]["rule"] == 0
    assert doc["ingress"]["selected"] is False
    before = doc["egress"]["hits"]
    assert model.probe_row("x/a", 80, "TCP", 4)["y/c"]
    _, doc = _trace(model, "--from", f"{x}/a", "--to", f"{y}/c", "--port", "80")
    assert doc["egress"]["hits"] > before
    rc, doc = _trace(model, "--from", f"{x}/b", "--to", f"{y}/b", "--port", "80/tcp")
    assert rc == 1 and doc["verdict"] == "deny" and doc["reason"] == "POLICY_INGRESS", doc
    assert doc["ingress"]["selected_by"] == f"{y}/b-from-xa" and doc["ingress"]["rule"] is None
    assert doc["agrees"]
    rc, doc = _trace(model, "--from", f"{x}/a", "--to", model.ip4["z/a"], "--port", "81/udp")
    assert rc == 1 and doc["reason"] == "POLICY_EGRESS" and doc["to"]["pod"] == f"{model.ns['z']}/a"
    rc, out, _ = model.lab.lace("policy", "trace", "--from", f"{x}/a", "--to", f"{y}/b", "--port", "80",
                                check=False)
    assert rc == 0 and "verdict  ALLOW" in out and f"ALLOW by {y}/b-from-xa rule 0" in out, out
    model.apply_step(Step([], {}))


def test_audit_verdicts_in_the_flow_stream(model):
    step = SCENARIOS[[s.name for s in SCENARIOS].index("audit")].steps(model.ip4)[0]
    model.apply_step(step)
    assert model.probe_row("y/b", 80, "TCP", 4)["x/a"]   # passes: audit only
    deadline = time.monotonic() + 10   # the agent reads the ring buffer asynchronously: poll for the event
    while True:
        rc, out, err = model.lab.lace("exec", "--node", NODES["a"], "--", "node", "trace", "flow", "--verdict",
                                      "audit", "--ip", model.ip4["x/a"], "-o", "json", check=False)
        assert rc == 0, err
        flows = json.loads(out)["flows"]
        if any(f["daddr"] == model.ip4["x/a"] and f["saddr"] == model.ip4["y/b"] and
               f["reason"] == "policy-ingress" for f in flows):
            break
        assert time.monotonic() < deadline, flows[-5:]
        time.sleep(0.1)
    rc, doc = _trace(model, "--from", f"{model.ns['y']}/b", "--to", f"{model.ns['x']}/a", "--port", "80")
    assert rc == 0 and doc["verdict"] == "audit" and doc["ingress"]["audit_mode"], doc
    model.apply_step(Step([], {}))
