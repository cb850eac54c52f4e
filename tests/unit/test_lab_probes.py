"""The lab kubelet's probes without a lab: the probe state machine on a fake clock, the scheduler
with injected results, where probes connect (the CNI result split into pod and probe addresses),
the pod server's health switch, the node prober process and its client, and exec probes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from lace import probes as P
from lace.lab import probing, procs
from lace.lab.kubelet import split_cni_ips
from lace.lab.probing import FAILURE, LIVENESS, READINESS, STARTUP, SUCCESS, UNKNOWN, PodProbes

NOW = "2030-01-01T00:00:00Z"


def pod(*containers, uid="u1"):
    return {"metadata": {"name": "web", "namespace": "default", "uid": uid},
            "spec": {"containers": [dict(c) for c in containers]}}


def container(name="c", **probes):
    return {"name": name, "image": "lace/podserver", "ports": [{"name": "http", "containerPort": 80}], **probes}


def http(**timing):
    return {"httpGet": {"port": "http", "path": "/healthz"}, **timing}


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def step(pp: PodProbes, now: float, results: dict[str, str]) -> list[tuple[str, str]]:
    """Run what is due at ``now`` with the result given per probe kind; returns (kind, outcome)."""
    out = []
    for c, w in pp.due(now):
        o = pp.complete(c, w, results.get(w.kind, SUCCESS), f"{w.kind} said so", now)
        out.append((w.kind, "restart" if o.restart else "changed" if o.changed else ""))
    return out


# ---- the state machine ---------------------------------------------------------------------

def test_readiness_starts_false_and_follows_its_thresholds():
    pp = PodProbes.of(pod(container(readinessProbe=http(periodSeconds=2, failureThreshold=3))), 0.0, NOW)
    c = pp.containers[0]
    assert c.started and not c.ready and not pp.ready
    assert step(pp, 0.0, {READINESS: SUCCESS}) == [(READINESS, "changed")]
    assert pp.ready
    assert step(pp, 1.9, {}) == []                       # not due before its period
    for t in (2.0, 4.0):                                   # two failures: below the threshold
        assert step(pp, t, {READINESS: FAILURE}) == [(READINESS, "")]
        assert pp.ready
    assert step(pp, 6.0, {READINESS: FAILURE}) == [(READINESS, "changed")]
    assert not pp.ready
    assert step(pp, 8.0, {READINESS: SUCCESS}) == [(READINESS, "changed")]   # successThreshold 1
    assert pp.ready


def test_success_threshold_and_interrupted_runs():
    pp = PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1, successThreshold=2))), 0.0, NOW)
    step(pp, 0.0, {READINESS: SUCCESS})
    assert not pp.ready
    step(pp, 1.0, {READINESS: FAILURE})                  # breaks the run
    step(pp, 2.0, {READINESS: SUCCESS})
    assert not pp.ready
    step(pp, 3.0, {READINESS: SUCCESS})
    assert pp.ready


def test_unknown_results_change_nothing():
    pp = PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1, failureThreshold=1),
                                    livenessProbe=http(periodSeconds=1, failureThreshold=1))), 0.0, NOW)
    step(pp, 0.0, {READINESS: SUCCESS, LIVENESS: SUCCESS})
    for t in range(1, 10):
        assert step(pp, float(t), {READINESS: UNKNOWN, LIVENESS: UNKNOWN}) == [(LIVENESS, ""), (READINESS, "")]
    assert pp.ready and not pp.paused


def test_initial_delay_and_period():
    pp = PodProbes.of(pod(container(readinessProbe=http(initialDelaySeconds=5, periodSeconds=3))), 100.0, NOW)
    assert step(pp, 104.9, {}) == []
    assert step(pp, 105.0, {}) == [(READINESS, "changed")]
    assert step(pp, 107.9, {}) == []
    assert [k for k, _ in step(pp, 108.0, {})] == [READINESS]


def test_a_slow_run_delays_the_next_one_and_one_at_a_time():
    pp = PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1))), 0.0, NOW)
    [(c, w)] = pp.due(0.0)
    assert pp.due(5.0) == []                              # still in flight: never two at once
    pp.complete(c, w, SUCCESS, "", 3.5)                   # took longer than a period
    assert w.next_at == 3.5
    assert [x.kind for _, x in pp.due(3.5)] == [READINESS]


def test_startup_gates_liveness_and_readiness_then_they_start_at_once():
    pp = PodProbes.of(pod(container(startupProbe=http(periodSeconds=1, failureThreshold=10),
                                    livenessProbe=http(periodSeconds=10, initialDelaySeconds=2),
                                    readinessProbe=http(periodSeconds=10))), 0.0, NOW)
    c = pp.containers[0]
    assert not c.started and not c.ready
    for t in range(0, 5):
        assert step(pp, float(t), {STARTUP: FAILURE}) == [(STARTUP, "")]   # only the startup probe runs
    assert not c.started
    assert step(pp, 5.0, {STARTUP: SUCCESS}) == [(STARTUP, "changed")]
    assert c.started and not c.ready                     # started; readiness still to pass
    # at once (the liveness probe's initial delay has passed), not at their next 10 s tick
    assert sorted(k for k, _ in step(pp, 5.0, {READINESS: SUCCESS})) == [LIVENESS, READINESS]
    assert c.ready
    assert step(pp, 6.0, {}) == []                        # the startup probe is done for good


def test_a_startup_probe_failing_past_its_threshold_restarts_the_pod():
    pp = PodProbes.of(pod(container(startupProbe=http(periodSeconds=1, failureThreshold=3),
                                    readinessProbe=http())), 0.0, NOW)
    assert step(pp, 0.0, {STARTUP: FAILURE}) == [(STARTUP, "")]
    assert step(pp, 1.0, {STARTUP: FAILURE}) == [(STARTUP, "")]
    assert step(pp, 2.0, {STARTUP: FAILURE}) == [(STARTUP, "restart")]
    assert pp.paused.startswith("Startup probe of container c failed: startupProbe said so")
    assert step(pp, 50.0, {}) == []                       # nothing runs while it restarts


def test_liveness_restarts_after_its_failure_threshold_and_readiness_without_probe():
    pp = PodProbes.of(pod(container(livenessProbe=http(periodSeconds=1, failureThreshold=2, terminationGracePeriodSeconds=4)),
                          container("side")), 0.0, NOW)
    assert pp.ready                                       # no readiness probe: ready once started
    assert step(pp, 0.0, {LIVENESS: FAILURE}) == [(LIVENESS, "")]
    assert step(pp, 1.0, {LIVENESS: SUCCESS}) == [(LIVENESS, "")]
    assert step(pp, 2.0, {LIVENESS: FAILURE}) == [(LIVENESS, "")]
    assert step(pp, 3.0, {LIVENESS: FAILURE}) == [(LIVENESS, "restart")]
    assert not pp.ready and pp.cause_grace == 4
    statuses = pp.container_statuses()
    assert [s["ready"] for s in statuses] == [False, False]
    assert statuses[0]["state"]["terminated"]["message"].startswith("Liveness probe of container c failed")


def test_conditions_change_their_transition_time_only_when_they_flip():
    pp = PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1, failureThreshold=1))), 0.0, NOW)
    first = pp.conditions("2030-01-01T00:00:00Z")
    assert [(c["type"], c["status"], c["lastTransitionTime"]) for c in first] == [
        ("ContainersReady", "False", "2030-01-01T00:00:00Z"), ("Ready", "False", "2030-01-01T00:00:00Z")]
    assert first[1]["reason"] == "ContainersNotReady" and first[1]["message"] == "containers with unready status: [c]"
    assert pp.conditions("2030-01-01T00:00:05Z") == first
    step(pp, 0.0, {READINESS: SUCCESS})
    up = pp.conditions("2030-01-01T00:00:09Z")
    assert [(c["status"], c["lastTransitionTime"]) for c in up] == [("True", "2030-01-01T00:00:09Z")] * 2
    assert "reason" not in up[1]
    assert pp.conditions("2030-01-01T00:00:10Z") == up
    step(pp, 1.0, {READINESS: FAILURE})
    assert pp.conditions("2030-01-01T00:00:11Z")[1]["lastTransitionTime"] == "2030-01-01T00:00:11Z"


def test_container_statuses_and_a_continued_state():
    pp = PodProbes.of(pod(container(startupProbe=http(), readinessProbe=http())), 50.0, NOW, restart_counts=[3],
                      started_wall="2029-12-31T23:00:00Z", started_at=10.0,
                      initial={("c", STARTUP): SUCCESS, ("c", READINESS): SUCCESS})
    assert pp.ready
    assert pp.container_statuses() == [{"name": "c", "image": "lace/podserver", "ready": True, "started": True,
                                        "restartCount": 3,
                                        "state": {"running": {"startedAt": "2029-12-31T23:00:00Z"}}}]
    # probes of a container that started long ago run at once
    assert sorted(w.kind for _, w in pp.due(50.0)) == [READINESS]


# ---- the scheduler -------------------------------------------------------------------------

class Harness:
    """A Prober on a fake clock whose dispatcher answers from a table (synchronously)."""

    def __init__(self):
        self.clock = Clock(0.0)
        self.results: dict[str, str] = {}
        self.ran: list[tuple[str, str]] = []
        self.changed: list[str] = []
        self.restarts: list[tuple[str, str]] = []
        self.held: list = []
        self.prober = probing.Prober(self.dispatch, self.changed.append,
                                     lambda uid, why: self.restarts.append((uid, why)), clock=self.clock)

    def dispatch(self, task, done):
        self.ran.append((task.uid, task.kind))
        result = self.results.get(task.kind, SUCCESS)
        if result == "hold":
            self.held.append(done)
        else:
            done(result, "")

    def at(self, t):
        self.clock.t = t
        self.prober.run_due()


def test_the_scheduler_runs_due_probes_and_reports_changes_and_restarts():
    h = Harness()
    h.prober.add(PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1),
                                            livenessProbe=http(periodSeconds=2, failureThreshold=1))), 0.0, NOW))
    h.at(0.0)
    assert sorted(h.ran) == [("u1", LIVENESS), ("u1", READINESS)] and h.changed == ["u1"]
    h.at(1.0)
    assert h.ran[-1] == ("u1", READINESS) and len(h.ran) == 3
    h.results[LIVENESS] = FAILURE
    h.at(2.0)
    assert h.restarts and h.restarts[0][0] == "u1" and "Liveness probe" in h.restarts[0][1]
    n = len(h.ran)
    h.at(10.0)
    assert len(h.ran) == n                                # paused until the kubelet registers it again
    h.prober.add(PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1))), 10.0, NOW))
    h.at(10.0)
    assert h.ran[-1] == ("u1", READINESS)


def test_a_deleted_pod_is_never_probed_again_and_late_results_are_dropped():
    h = Harness()
    h.results[READINESS] = "hold"
    h.prober.add(PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1))), 0.0, NOW))
    h.at(0.0)
    assert len(h.held) == 1
    h.prober.remove("u1", deleted=True)
    h.held[0](SUCCESS, "")                                # a run in flight when it went
    assert h.changed == []
    for t in range(1, 5):
        h.at(float(t))
    assert len(h.ran) == 1
    assert not h.prober.add(PodProbes.of(pod(container(readinessProbe=http())), 5.0, NOW))
    # a stopped (not deleted) pod may be registered again, e.g. a pod whose start is retried
    h.prober.add(PodProbes.of(pod(container(readinessProbe=http()), uid="u2"), 5.0, NOW))
    h.prober.remove("u2")
    assert h.prober.add(PodProbes.of(pod(container(readinessProbe=http()), uid="u2"), 5.0, NOW))


def test_the_scheduler_thread_runs_many_pods_at_a_one_second_period():
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def dispatch(task, done):
        with lock:
            seen[task.uid] = seen.get(task.uid, 0) + 1
        done(SUCCESS, "")
    prober = probing.Prober(dispatch, lambda uid: None, lambda uid, why: None)
    start = time.monotonic()
    for i in range(100):
        prober.add(PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1),
                                              livenessProbe=http(periodSeconds=1)), uid=f"p{i}"), start, NOW))
    prober.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with lock:
                if len(seen) == 100 and min(seen.values()) >= 6:   # three rounds of both probes
                    break
            time.sleep(0.05)
    finally:
        prober.stop()
    assert len(seen) == 100 and min(seen.values()) >= 6, seen
    assert time.monotonic() - start < 4.5


# ---- where a probe connects ----------------------------------------------------------------

AGENT_RESULT = {   # the shape lace.agent.endpoints returns for a pod of an isolated network
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "lx1234", "mac": "02:00:00:00:00:01"},
                   {"name": "eth0", "mac": "02:00:00:00:00:02", "mtu": 1460, "sandbox": "/run/netns/p"},
                   {"name": "lace_host"}],
    "ips": [{"address": "10.10.0.5/32", "gateway": "169.254.1.1", "interface": 1},
            {"address": "fd10:10::5/128", "gateway": "fe80::1", "interface": 1},
            {"address": "10.244.1.40/32", "interface": 2},
            {"address": "fd00:10:244:1::40/128", "interface": 2}],
}


def test_the_cni_result_splits_into_pod_and_probe_addresses():
    assert split_cni_ips(AGENT_RESULT) == (["10.10.0.5", "fd10:10::5"], ["10.244.1.40", "fd00:10:244:1::40"])
    default = dict(AGENT_RESULT, interfaces=AGENT_RESULT["interfaces"][:2], ips=AGENT_RESULT["ips"][:2])
    assert split_cni_ips(default) == (["10.10.0.5", "fd10:10::5"], [])
    assert split_cni_ips({"ips": [{"address": "10.244.0.2/32"}]}) == (["10.244.0.2"], [])  # no interface index
    assert split_cni_ips(None) == ([], [])


def test_probe_interface_is_the_agents_host_device():
    hostdev = pytest.importorskip("lace.agent.hostdev")
    assert P.PROBE_INTERFACE == hostdev.HOST_IFNAME


def test_connect_host():
    act = P.action(container(), http())
    assert act == P.Action("httpGet", 80, "", "/healthz", "HTTP")
    pod_ips, probe_ips = ["10.10.0.5", "fd10:10::5"], ["fd00:10:244:1::40", "10.244.1.40"]
    assert P.connect_host(act, pod_ips, probe_ips, isolated=True) == "10.244.1.40"      # the pod IP's family
    assert P.connect_host(act, pod_ips[::-1], probe_ips, isolated=True) == "fd00:10:244:1::40"
    assert P.connect_host(act, pod_ips, probe_ips, isolated=False) == "10.10.0.5"
    assert P.connect_host(act, pod_ips, [], isolated=True) == "10.10.0.5"
    assert P.connect_host(act, ["10.10.0.5"], ["fd00:10:244:1::40"], isolated=True) == "fd00:10:244:1::40"
    named = P.action(container(), {"tcpSocket": {"port": 9000, "host": "192.0.2.1"}})
    assert P.connect_host(named, pod_ips, probe_ips, isolated=True) == "192.0.2.1"
    assert P.connect_host(act, [], [], isolated=False) is None
    assert P.action(container(), {"tcpSocket": {"port": "nope"}}).port is None
    assert P.action(container(), {"exec": {"command": ["cat", "/x"]}}).command == ("cat", "/x")
    assert P.timing({"periodSeconds": 2}) == P.Timing(0, 2, 1, 1, 3)


# ---- the pod server's health switch --------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_file(path, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "exited"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.fixture
def podserver(tmp_path):
    started = []

    def start(*extra):
        port = free_port()
        ready = tmp_path / f"ready-{len(started)}"
        proc = subprocess.Popen([sys.executable, "-m", "lace.lab.podserver", "--name", "ns/web", "--tcp", str(port),
                                 "--ready-file", str(ready), *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        started.append(proc)
        wait_file(ready, proc)
        return port, proc
    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


def test_podserver_health_switch(podserver):
    port, proc = podserver()
    assert get(port, "/") == (200, "ns/web\n")
    assert get(port, "/healthz") == (200, "ok ns/web\n")
    assert get(port, "/fail") == (200, "failing ns/web\n")
    assert get(port, "/healthz") == (500, "unhealthy ns/web\n")
    assert get(port, "/anything") == (200, "ns/web\n")    # still answers with its name
    assert get(port, "/recover") == (200, "recovered ns/web\n")
    assert get(port, "/healthz?x=1") == (200, "ok ns/web\n")
    get(port, "/fail")
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    port2, _ = podserver()                                  # a restarted server is healthy again
    assert get(port2, "/healthz") == (200, "ok ns/web\n")


def test_podserver_startup_delay(podserver):
    port, _ = podserver("--startup-delay", "0.6")
    t0 = time.monotonic()
    assert get(port, "/healthz") == (503, "starting ns/web\n")
    assert get(port, "/") == (200, "ns/web\n")
    while get(port, "/healthz")[0] != 200:
        assert time.monotonic() - t0 < 5
        time.sleep(0.05)
    assert time.monotonic() - t0 >= 0.5


# ---- the node's prober process -------------------------------------------------------------

class Worker:
    """lace.lab.prober in a subprocess (this namespace), spoken to over a socket pair."""

    def __init__(self):
        self.sock, child = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-m", "lace.lab.prober", "--node", "test",
                                      "--fd", str(child.fileno())], pass_fds=(child.fileno(),),
                                     stderr=subprocess.PIPE, text=True)
        child.close()
        self.file = self.sock.makefile("rb")

    def ask(self, *reqs):
        for i, r in enumerate(reqs):
            self.sock.sendall((json.dumps(dict(r, id=i)) + "\n").encode())
        answers = {}
        while len(answers) < len(reqs):
            a = json.loads(self.file.readline())
            answers[a["id"]] = a
        return [answers[i] for i in range(len(reqs))]

    def close(self):
        self.file.close()
        self.sock.close()
        return self.proc.wait(timeout=10)


@pytest.fixture
def worker():
    w = Worker()
    yield w
    if w.proc.poll() is None:
        w.proc.kill()
        w.proc.wait()


def test_prober_http_tcp_and_timeouts(podserver, worker):
    port, _ = podserver()
    closed = free_port()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                                        # accepts, never answers
    base = {"host": "127.0.0.1", "timeout": 5}
    # the worker runs a batch concurrently: /healthz before /fail, and after it, are asked apart
    (healthy,) = worker.ask(dict(base, handler="httpGet", port=port, path="/healthz"))
    (failed,) = worker.ask(dict(base, handler="httpGet", port=port, path="/fail"))
    answers = [healthy, failed] + worker.ask(
        dict(base, handler="tcpSocket", port=port),
        dict(base, handler="tcpSocket", port=closed),
        dict(base, handler="httpGet", port=silent.getsockname()[1], path="/", timeout=0.3),
        dict(base, handler="httpGet", port=port, path="/healthz", host="::1"),
        dict(base, handler="httpGet", port=port, path="/", headers=[["Host", "example"], ["X-Probe", "1"]]),
        dict(base, handler="grpc", port=port),
    )
    silent.close()
    got = [(a["result"], a["message"]) for a in answers]
    assert got[0] == (SUCCESS, "HTTP probe succeeded with statuscode: 200")
    assert got[1][0] == SUCCESS
    assert got[2] == (SUCCESS, "tcp connect succeeded")
    assert got[3][0] == FAILURE and "refused" in got[3][1].lower()
    assert got[4][0] == FAILURE and "no answer within 0.3s" in got[4][1]
    # /fail was asked before, so /healthz now fails with the server's status
    assert got[5] == (FAILURE, "HTTP probe failed with statuscode: 500")
    assert got[6][0] == SUCCESS
    assert got[7][0] == UNKNOWN
    assert worker.close() == 0                              # exits when the kubelet's end closes


def test_prober_request_carries_kubelet_headers():
    req = __import__("lace.lab.prober", fromlist=["http_request"]).http_request(
        "fd00::5", 8080, "/healthz", [["user-agent", "mine"], ["X-A", "b"]]).decode()
    assert req.startswith("GET /healthz HTTP/1.1\r\nHost: [fd00::5]:8080\r\nuser-agent: mine\r\n")
    assert "Connection: close\r\n" in req and req.endswith("X-A: b\r\n\r\n")


def test_prober_runs_hundreds_of_probes_concurrently(podserver, worker):
    port, _ = podserver()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(512)
    t0 = time.monotonic()
    # 300 at once: 100 HTTP probes the pod server answers (its listen backlog is 128), 100 TCP probes
    # the kernel accepts, and 100 HTTP probes that hang for their whole 1 s timeout
    hang = silent.getsockname()[1]
    reqs = [{"handler": "httpGet", "host": "127.0.0.1", "port": port, "path": "/healthz", "timeout": 1}] * 100
    reqs += [{"handler": "tcpSocket", "host": "127.0.0.1", "port": hang, "timeout": 1}] * 100
    reqs += [{"handler": "httpGet", "host": "127.0.0.1", "port": hang, "path": "/", "timeout": 1}] * 100
    answers = worker.ask(*reqs)
    elapsed = time.monotonic() - t0
    silent.close()
    assert [a["result"] for a in answers] == [SUCCESS] * 200 + [FAILURE] * 100
    # one at a time, the 100 hanging probes alone would take 100 s: concurrently about one timeout
    assert elapsed < 30, elapsed


def test_prober_client_starts_restarts_and_stops_its_worker(tmp_path, podserver):
    port, _ = podserver()
    state = str(tmp_path / "state")
    client = probing.ProberClient("worker-x", None, None, state)   # this namespace, no cgroup
    other = probing.ProberClient("worker-x", None, None, state)

    def ask(c):
        got = []
        ev = threading.Event()
        c.submit({"handler": "httpGet", "host": "127.0.0.1", "port": port, "path": "/healthz", "timeout": 1},
                 lambda r, m: (got.append((r, m)), ev.set()))
        assert ev.wait(10)
        return got[0]

    try:
        assert ask(client)[0] == SUCCESS
        first = client.pid
        [info] = [p for p in procs.list_procs(state) if p.name == "prober-worker-x"]
        assert info.pid == first and info.alive and "lace.lab.prober" in info.argv
        assert ask(client)[0] == SUCCESS and client.pid == first          # one worker, reused
        # the worker dies: the next probes are thrown away (UNKNOWN) until a new worker answers
        os.kill(first, 9)
        deadline = time.monotonic() + 10
        while (result := ask(client))[0] != SUCCESS:
            assert result[0] == UNKNOWN, result
            assert time.monotonic() < deadline, result
            time.sleep(0.05)
        second = client.pid
        assert second not in (None, first) and not procs.alive(first)
        # a new client (a restarted kubelet) stops the recorded worker first: never two per node
        assert ask(other)[0] == SUCCESS
        assert other.pid != second and not procs.alive(second)
    finally:
        client.close()
        other.close()
    assert not [p for p in procs.list_procs(state) if p.alive]


# ---- exec probes and short commands ---------------------------------------------------------

def test_exec_probes():
    assert probing.run_exec(["true"], None, None, 1)[0] == SUCCESS
    result, message = probing.run_exec(["sh", "-c", "echo broken; exit 3"], None, None, 1)
    assert result == FAILURE and "exited with 3: broken" in message
    result, message = probing.run_exec(["no-such-command-lace"], None, None, 1)
    assert result == FAILURE and "127" in message
    t0 = time.monotonic()
    result, message = probing.run_exec(["sh", "-c", "sleep 30 & sleep 30"], None, None, 0.3)
    assert result == FAILURE and "timed out after 0.3s" in message and time.monotonic() - t0 < 5
    assert probing.run_exec(["true"], "lace-no-such-netns", None, 1)[0] == UNKNOWN


def test_run_kills_the_whole_group_at_its_timeout(tmp_path):
    marker = tmp_path / "child.pid"
    done = procs.run(["sh", "-c", f"sleep 30 & echo $! > {marker}; wait"], netns=None, timeout=0.3)
    assert done.timed_out
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while procs.alive(child):
        assert time.monotonic() < deadline, "the command's child survived"
        time.sleep(0.01)


@pytest.mark.skipif(os.geteuid() != 0, reason="joining a cgroup needs root")
def test_spawn_joins_a_cgroup(tmp_path):
    from lace.lab.topology import cgroup_root
    root = cgroup_root()
    if root is None:
        pytest.skip("no cgroup2 mounted")
    cg = os.path.join(root, f"lace-unit-{os.getpid()}")
    os.mkdir(cg)
    try:
        pid = procs.spawn(["sleep", "30"], netns=None, name="sleeper", state_dir=str(tmp_path),
                          log_path=str(tmp_path / "log"), cgroup=cg)
        with open(os.path.join(cg, "cgroup.procs")) as f:
            assert str(pid) in f.read().split()
        procs.stop("sleeper", str(tmp_path))
        with pytest.raises(procs.ProcError, match="cgroup"):
            procs.spawn(["true"], netns=None, name="x", state_dir=str(tmp_path), log_path=str(tmp_path / "log"),
                        cgroup=os.path.join(cg, "missing"))
    finally:
        os.rmdir(cg)


# ---- readiness into EndpointSlices ---------------------------------------------------------

def test_endpoint_readiness_follows_the_ready_condition_back_and_forth(tmp_path):
    """The kubelet's Ready condition, flipped as a readiness probe does, is what the EndpointSlice
    controller makes of the pod's endpoint each time (and probe addresses are never endpoints)."""
    from test_endpointslice_controller import Running, service, wait_for
    from lace.store import SqliteStore
    store = SqliteStore(tmp_path / "store.db", poll_interval=0.005)
    running = None
    try:
        store.apply({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "a", "namespace": "default", "labels": {"app": "web"}},
                     "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "ports": [{"containerPort": 8080}],
                                                                      "readinessProbe": {"tcpSocket": {"port": 8080}}}]}})
        store.apply(service() | {"metadata": {"name": "web", "namespace": "default"}})
        running = Running(store)
        pp = PodProbes.of(pod(container(readinessProbe=http(periodSeconds=1, failureThreshold=1))), 0.0, NOW)

        def write():
            store.update_status("pods", "a", "default", {
                "phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}],
                "probeIPs": [{"ip": "10.244.1.99"}], "conditions": pp.conditions(NOW),
                "containerStatuses": pp.container_statuses()})

        def endpoint():
            try:
                [ep] = store.get("endpointslices", "web-ipv4")["endpoints"]
            except Exception:
                return None
            return ep["addresses"], ep["conditions"]["ready"], ep["conditions"]["serving"]

        t = 0.0
        for result, ready in [(None, False), (SUCCESS, True), (FAILURE, False), (SUCCESS, True), (FAILURE, False)]:
            if result is not None:
                [(c, w)] = pp.due(t)
                pp.complete(c, w, result, "", t)
                t += 1
            write()
            assert wait_for(lambda: endpoint() == (["10.244.1.5"], ready, ready)), endpoint()
    finally:
        if running is not None:
            running.stop()
        store.close()


# ---- a restarted kubelet continues from the stored status ----------------------------------

def test_a_restarted_kubelet_continues_from_the_stored_status(tmp_path):
    from lace.lab.kubelet import Kubelet
    from lace.store import STORE_FILE, SqliteStore
    state = tmp_path / "lab"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"nodes": [{"name": "worker-1", "netns": "lace-x-worker-1",
                                                           "cgroup": "", "underlay_addr": "fd5e:ff::1"}]}))
    store = SqliteStore(state / STORE_FILE)
    spec = {"nodeName": "worker-1", "containers": [container(readinessProbe=http(), livenessProbe=http()),
                                                   container("side")]}
    stored = store.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
                          "spec": spec}).object
    status = {"phase": "Running", "hostIP": "fd5e:ff::1", "startTime": "2030-01-01T00:00:00Z", "network": "default",
              "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}],
              "conditions": [{"type": "ContainersReady", "status": "True", "lastTransitionTime": "2030-01-01T00:00:07Z"},
                             {"type": "Ready", "status": "True", "lastTransitionTime": "2030-01-01T00:00:07Z"}],
              "containerStatuses": [
                  {"name": "c", "image": "lace/podserver", "ready": True, "started": True, "restartCount": 4,
                   "state": {"running": {"startedAt": "2030-01-01T00:00:05Z"}},
                   "lastState": {"terminated": {"reason": "Error", "message": "Liveness probe failed"}}},
                  {"name": "side", "image": "lace/podserver", "ready": True, "started": True, "restartCount": 4,
                   "state": {"running": {"startedAt": "2030-01-01T00:00:05Z"}}}]}
    stored = store.update_status("pods", "web", "default", status)
    kubelet = Kubelet("x", str(state))
    try:
        uid = stored["metadata"]["uid"]
        rec = {"uid": uid, "namespace": "default", "name": "web", "node": "worker-1", "netns": "lace-x-p",
               "container_id": uid, "ready": True, "proc": "pod-x", "ips": ["10.244.0.5"], "probe_ips": []}
        kubelet.sandboxes.put(rec)
        kubelet.start_pod(stored)                         # what the first relist does with a running pod
        pp = kubelet.prober.get(uid)
        assert pp is not None and pp.ready
        assert [c.restart_count for c in pp.containers] == [4, 4]
        assert pp.containers[0].workers[READINESS].result == SUCCESS
        # nothing changed, so nothing is written: same conditions, same times, same counts
        after = store.get("pods", "web", "default")
        assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
        assert kubelet.pod_status(uid) == status
        # the probes started long ago: they run at once
        assert sorted(w.kind for _, w in pp.due(time.monotonic())) == [LIVENESS, READINESS]
        kubelet.start_pod(stored)                         # later events: adopted once
        assert kubelet.prober.get(uid) is pp
        queued = []
        kubelet._serial = lambda uid, fn, *args, **kw: queued.append(fn.__name__)   # stopping is not for here
        kubelet.handle(dict(stored, metadata=dict(stored["metadata"], deletionTimestamp="2030-01-01T00:01:00Z")))
        assert queued == ["terminate"]
        # deleted: liveness stops before that runs (nothing restarts the pod), readiness goes on
        assert kubelet.prober.get(uid) is pp and pp.containers[0].workers[LIVENESS].on_hold
        assert not pp.containers[0].workers[READINESS].on_hold and kubelet.prober.terminating == {uid}
        again = probing.PodProbes.of(stored, time.monotonic(), NOW)   # processes started again meanwhile
        assert kubelet.prober.add(again) and again.containers[0].workers[LIVENESS].on_hold
        kubelet.prober.remove(uid, deleted=True)                      # stopped: never probed again
        assert not kubelet.prober.add(probing.PodProbes.of(stored, time.monotonic(), NOW))
    finally:
        kubelet.close()
        kubelet.pool.shutdown(wait=True)
        store.close()


def test_a_running_status_the_store_refused_is_written_at_the_next_relist(tmp_path):
    """A pod set up while the store was unavailable for its status write (an etcd election): the
    next relist writes its Running status; nothing else would, as the pod has no probe to change."""
    from lace.lab.kubelet import Kubelet
    from lace.store import STORE_FILE, SqliteStore
    from lace.store.errors import Unavailable
    state = tmp_path / "lab"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"nodes": [{"name": "worker-1", "netns": "lace-x-worker-1",
                                                           "cgroup": "", "underlay_addr": "fd5e:ff::1"}]}))
    store = SqliteStore(state / STORE_FILE)
    stored = store.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
                          "spec": {"nodeName": "worker-1", "containers": [container()]}}).object
    kubelet = Kubelet("x", str(state))
    try:
        uid = stored["metadata"]["uid"]
        status = {"phase": "Running", "hostIP": "fd5e:ff::1", "startTime": NOW, "network": "default",
                  "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}]}
        kubelet.sandboxes.put({"uid": uid, "namespace": "default", "name": "web", "node": "worker-1",
                               "netns": "lace-x-p", "container_id": uid, "ready": True, "proc": "pod-x",
                               "ips": ["10.244.0.5"], "probe_ips": [], "status": status})
        assert kubelet.prober.add(probing.PodProbes.of(stored, time.monotonic(), NOW))   # as the set-up left it
        real = kubelet.store.update_status

        def unavailable(*_a, **_kw):
            raise Unavailable("etcd is electing a leader")
        kubelet.store.update_status = unavailable
        with pytest.raises(Unavailable):
            kubelet.start_pod(stored)              # a relist while the store still refuses
        assert not (store.get("pods", "web", "default").get("status") or {}).get("phase")
        kubelet.store.update_status = real
        kubelet.start_pod(stored)                  # the next one, the store back
        assert store.get("pods", "web", "default")["status"]["phase"] == "Running"
        before = store.get("pods", "web", "default")["metadata"]["resourceVersion"]
        kubelet.start_pod(stored)                  # written once: later relists write nothing
        assert store.get("pods", "web", "default")["metadata"]["resourceVersion"] == before
    finally:
        kubelet.close()
        kubelet.pool.shutdown(wait=True)
        store.close()


def test_prober_https_does_not_check_the_certificate(tmp_path, worker):
    import shutil
    import ssl
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=not-the-probed-host"], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve():
        conn, _ = server.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            request = b""
            while b"\r\n\r\n" not in request:
                request += tls.recv(4096)
            tls.sendall(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = server.getsockname()[1]
    [https, plain] = worker.ask({"handler": "httpGet", "host": "127.0.0.1", "port": port, "path": "/", "scheme": "HTTPS",
                                 "timeout": 5},
                                {"handler": "httpGet", "host": "127.0.0.1", "port": free_port(), "path": "/",
                                 "scheme": "HTTPS", "timeout": 1})
    t.join(5)
    server.close()
    assert (https["result"], https["message"]) == (SUCCESS, "HTTP probe succeeded with statuscode: 302")
    assert plain["result"] == FAILURE


# ---- counting the runs ---------------------------------------------------------------------

def test_probe_stats_count_per_node_and_write_at_most_once_an_interval_only_on_change(tmp_path):
    path = tmp_path / "kubelet" / "probe-stats.json"
    stats = probing.ProbeStats(path, interval=0.3)
    stats.start()
    try:
        assert stats.writes == 0 and not path.exists()     # nothing counted: nothing written
        stats.record("worker-1", SUCCESS)
        deadline = time.monotonic() + 5
        while stats.writes == 0:                            # the first change is written at once
            assert time.monotonic() < deadline
            time.sleep(0.01)
        first = json.loads(path.read_text())
        assert first["nodes"] == {"worker-1": {"run": 1, "success": 1, "failure": 0, "unknown": 0}}
        assert first["pid"] == os.getpid() and first["since"] <= first["written"]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:                  # a burst: written about once an interval
            stats.record("worker-1", SUCCESS)
            stats.record("worker-2", FAILURE)
            stats.record("worker-2", UNKNOWN)
            time.sleep(0.001)
        deadline = time.monotonic() + 5                     # the last of it is written within an interval
        while json.loads(path.read_text())["nodes"].get("worker-2", {}).get("unknown") != \
                stats.counts["worker-2"]["unknown"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert 2 <= stats.writes <= 5, stats.writes
        doc = json.loads(path.read_text())
        w1, w2 = doc["nodes"]["worker-1"], doc["nodes"]["worker-2"]
        assert w1["run"] == w1["success"] == stats.counts["worker-1"]["success"] > 100
        assert w2["run"] == w2["failure"] == w2["unknown"] > 100 and w2["success"] == 0
        assert doc["monotonic"] - first["monotonic"] >= 1.0
        idle = stats.writes
        time.sleep(1.0)                                     # idle: no writes
        assert stats.writes == idle
    finally:
        stats.stop()
    assert stats.writes == idle                             # nothing left to write at stop
    stats.record("worker-1", FAILURE)                       # counted after the writer stopped:
    stats.stop()                                            # written by stop()
    assert json.loads(path.read_text())["nodes"]["worker-1"]["failure"] == 1


def test_probe_stats_count_each_run_once():
    stats = probing.ProbeStats("/nonexistent/never-written.json")
    got = []
    done = stats.counting("n", lambda result, message: got.append(result))
    done(SUCCESS, "")
    done(FAILURE, "")                                       # a second answer is not another run
    assert stats.counts == {"n": {"run": 1, "success": 1, "failure": 0, "unknown": 0}}
    assert got == [SUCCESS, FAILURE]                        # Prober's own guard drops the second


def test_the_kubelet_counts_its_probe_runs_per_node(tmp_path):
    from lace.lab.kubelet import Kubelet, ProbeContext
    state = tmp_path / "lab"
    state.mkdir()
    (state / "lab.json").write_text(json.dumps({"nodes": [{"name": "worker-1", "netns": "lace-x-worker-1",
                                                           "cgroup": "", "underlay_addr": "fd5e:ff::1"}]}))
    kubelet = Kubelet("x", str(state))
    sent = []

    class Client:
        def submit(self, request, done):
            sent.append(request)
            done(SUCCESS if request["port"] == 8080 else FAILURE, "")

    try:
        kubelet.prober_client = lambda node: Client()
        kubelet._probe_ctx["u1"] = ProbeContext("worker-1", "lace-x-p", None, ("10.244.0.5",), (), False)
        http_action = P.action({"ports": [{"name": "http", "containerPort": 8080}]},
                               {"httpGet": {"path": "/healthz", "port": "http"}})
        tcp_action = P.action({}, {"tcpSocket": {"port": 81}})
        grpc_action = P.action({}, {"grpc": {"port": 9000}})
        results = []
        for action in (http_action, http_action, tcp_action, grpc_action):
            kubelet._dispatch(probing.Task("u1", "c", READINESS, action, 1.0), lambda r, m: results.append(r))
        kubelet._dispatch(probing.Task("gone", "c", READINESS, http_action, 1.0), lambda r, m: results.append(r))
        assert results == [SUCCESS, SUCCESS, FAILURE, UNKNOWN, UNKNOWN]
        assert len(sent) == 3
        # a pod not running here is on no node: not counted
        assert kubelet.stats.counts == {"worker-1": {"run": 3, "success": 2, "failure": 1, "unknown": 1}}
    finally:
        kubelet.close()
        kubelet.pool.shutdown(wait=True)
        kubelet.store.close()
    doc = json.loads((state / probing.PROBE_STATS_FILE).read_text())   # written when it stops
    assert doc["nodes"]["worker-1"]["run"] == 3
