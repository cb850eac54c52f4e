"""Pods stopping through their grace period, with real pods and real traffic: the lab's kubelet
runs preStop hooks, then SIGTERM, then SIGKILL at the end of the grace period, and tears the
network down only after the processes are gone; a pod server started with ``--delay-shutdown``
(agnhost netexec's flag) keeps serving meanwhile, its EndpointSlice endpoints are serving and
terminating (not ready), established connections to it keep going, new ones go to the ready
backends, and to it when it is the last one (the fallback to serving terminating endpoints)."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

from .conftest import ips, pod, wait_for
from .test_service_traffic import answers, service, vips
from .test_nodestate import node_json

#: in a client pod: one keep-alive HTTP connection to HOST:80 with a request every 50 ms until the
#: file STOP exists (at most 60 s; the file UP is written after the first answer), then one JSON
#: line: each answer's wall time and text, and the error that broke the connection, if one did
HOLD = """
import http.client, json, os, sys, time
host, stop, up = sys.argv[1], sys.argv[2], sys.argv[3]
conn = http.client.HTTPConnection(host, 80, timeout=3)
out, error, local = [], None, None
end = time.monotonic() + 60
try:
    conn.connect()
    local = conn.sock.getsockname()[1]
    while not os.path.exists(stop) and time.monotonic() < end:
        conn.request("GET", "/")
        out.append((time.time(), conn.getresponse().read().decode().strip()))
        if len(out) == 1:
            open(up, "w").close()
        if conn.sock is None or conn.sock.getsockname()[1] != local:
            raise ConnectionError("the connection was replaced")
        time.sleep(0.05)
except Exception as e:
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"answers": out, "error": error, "port": local}))
"""


def draining(name: str, ns: str, node: str, *, delay: float, grace: int, app: str,
             pre_stop: dict | None = None) -> dict:
    """A lab pod server that keeps serving ``delay`` seconds after SIGTERM, with a grace period."""
    p = pod(name, ns, node, labels={"app": app})
    p["spec"]["terminationGracePeriodSeconds"] = grace
    c = p["spec"]["containers"][0]
    c["args"] = ["--delay-shutdown", str(delay)]
    if pre_stop:
        c["lifecycle"] = {"preStop": pre_stop}
    return p


def pod_log(lab, p: dict) -> str:
    """The log of the pod's processes (the kubelet's ``pod-<uid>`` process record names it)."""
    path = os.path.join(lab.dir, "logs", f"pod-{p['metadata']['uid'][:13]}.log")
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def logged_at(lab, p: dict, event: str) -> float | None:
    """The wall time the pod server logged ``event`` at (SIGTERM, exiting), or None."""
    m = re.search(rf": {event} at (\d+\.\d+)", pod_log(lab, p))
    return float(m.group(1)) if m else None


def endpoint_conditions(lab, ns: str, address: str) -> dict | None:
    _, out, _ = lab.lace("get", "endpointslices", "-n", ns, "-o", "json")
    for sl in json.loads(out)["items"]:
        for ep in sl["endpoints"]:
            if address in ep["addresses"]:
                return ep["conditions"]
    return None


def frontend(lab, node: str, vip: str) -> dict | None:
    """The frontend entry (slot 0) of VIP:80 in ``node``'s services map."""
    doc = node_json(lab, node, "bpf", "show", "services", "-n")
    return next((e for e in doc["entries"] if e["addr"] == vip and e["port"] == 80 and e.get("slot", 0) == 0), None)


def wait_frontend(lab, node: str, vip: str, active: int, total: int) -> None:
    def ok() -> bool:
        e = frontend(lab, node, vip)
        return e is not None and e["active_count"] == active and e["backend_count"] == total
    wait_for(ok, f"{vip} on {node} with {active} active of {total} backends", timeout=30, interval=0.05)


def test_an_established_connection_drains_through_the_grace_period_and_new_ones_go_elsewhere(lab, ns, tmp_path):
    """A connection held to a pod (through its Service's ClusterIP, IPv4 and IPv6) keeps exchanging
    data after ``lace delete pod --grace-period`` while the pod drains (--delay-shutdown); meanwhile
    its endpoints are serving and terminating, not ready, and new connections go to the other pod;
    the pod goes when its server exits, before the grace period ends."""
    delay, grace = 8, 12
    lab.apply([draining("old", ns, "worker-2", delay=delay, grace=grace, app="drain"), pod("client", ns, "worker-1")])
    ps = lab.wait(ns, ["old", "client"])
    lab.apply([service("drain", ns, {"app": "drain"})])
    v4, v6 = vips(lab, ns, "drain")
    for vip in (v4, v6):
        wait_frontend(lab, "worker-1", vip, 1, 1)
    # both connections to old, the only backend when they are made
    stop = tmp_path / "stop"
    held: dict[str, dict] = {}

    def hold(vip: str) -> None:
        rc, out = lab.exec(f"{ns}/client", sys.executable, "-c", HOLD, vip, str(stop), str(tmp_path / vip))
        held[vip] = json.loads(out.strip().splitlines()[-1]) if rc == 0 else {"error": out}

    threads = [threading.Thread(target=hold, args=(vip,)) for vip in (v4, v6)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: all((tmp_path / vip).exists() for vip in (v4, v6)), "the held connections", 15, 0.02)
        lab.apply([draining("new", ns, "worker-3", delay=delay, grace=grace, app="drain")])
        ps.update(lab.wait(ns, ["new"]))
        for vip in (v4, v6):
            wait_frontend(lab, "worker-1", vip, 2, 2)
        old4, old6 = ips(ps["old"])
        t_delete = time.time()
        lab.lace("delete", "pod", "old", "-n", ns, "--grace-period", str(grace), "--wait=false")
        sigterm = wait_for(lambda: logged_at(lab, ps["old"], "SIGTERM"), "old's server to get SIGTERM", 10, 0.05)
        assert sigterm - t_delete < 2, "no preStop hook: SIGTERM comes at once"

        # the endpoints: serving and terminating, not ready, in both families; the pod still runs
        for address in (old4, old6):
            wait_for(lambda: endpoint_conditions(lab, ns, address) == {"ready": False, "serving": True,
                                                                       "terminating": True},
                     f"old's endpoint {address} serving and terminating", 10, 0.05)
        now = lab.pods(ns)["old"]
        assert now["metadata"].get("deletionTimestamp") and now["status"]["phase"] == "Running", now["status"]
        # the datapath: one active backend (new), old kept for its flows; new connections go to new
        for vip in (v4, v6):
            wait_frontend(lab, "worker-1", vip, 1, 2)
            assert set(answers(lab, f"{ns}/client", vip, 6)) == {f"{ns}/new"}, vip
        # let the held connections run until 2 s before old's server exits on its own
        wait_for(lambda: time.time() >= sigterm + delay - 2, "most of old's drain", delay + 5, 0.05)
    finally:
        stop.touch()
        for t in threads:
            t.join(timeout=30)
    for vip in (v4, v6):
        doc = held.get(vip) or {}
        assert doc.get("error") is None, f"the connection through {vip} broke: {doc.get('error')}"
        assert {name for _, name in doc["answers"]} == {f"{ns}/old"}, f"{vip}: {doc['answers'][-3:]}"
        late = [t for t, _ in doc["answers"] if t > sigterm + delay - 2.5]
        assert late, f"{vip}: no answer from old in the last part of its drain"
        gaps = [b - a for (a, _), (b, _) in zip(doc["answers"], doc["answers"][1:])]
        assert max(gaps) < 1.0, f"{vip}: a {max(gaps):.2f} s gap in the held connection"
    # old's server exits at the end of its delay, before the grace period: no SIGKILL
    lab.wait_gone(ns, "old", timeout=grace + 10)
    exited = logged_at(lab, ps["old"], "exiting")
    assert exited is not None and delay - 0.5 < exited - sigterm < delay + 1.5, (sigterm, exited)
    assert set(answers(lab, f"{ns}/client", v4, 3)) == {f"{ns}/new"}


def test_the_last_backend_still_takes_new_connections_while_it_terminates(lab, ns):
    """A Service's only pod drains: with no ready endpoint left, its serving terminating endpoint
    takes new connections (kube-proxy's fallback, KEP-1669), in both families, until it goes."""
    delay, grace = 6, 10
    lab.apply([draining("solo", ns, "worker-2", delay=delay, grace=grace, app="solo"), pod("asker", ns, "worker-1")])
    ps = lab.wait(ns, ["solo", "asker"])
    lab.apply([service("solo", ns, {"app": "solo"})])
    v4, v6 = vips(lab, ns, "solo")
    for vip in (v4, v6):
        wait_frontend(lab, "worker-1", vip, 1, 1)
        assert answers(lab, f"{ns}/asker", vip, 1) == [f"{ns}/solo"]
    lab.lace("delete", "pod", "solo", "-n", ns, "--grace-period", str(grace), "--wait=false")
    sigterm = wait_for(lambda: logged_at(lab, ps["solo"], "SIGTERM"), "solo's server to get SIGTERM", 10, 0.05)
    for address in ips(ps["solo"]):
        wait_for(lambda: endpoint_conditions(lab, ns, address) == {"ready": False, "serving": True,
                                                                   "terminating": True},
                 f"solo's endpoint {address} serving and terminating", 10, 0.05)
    # new connections keep being answered by solo over a window in which the agents have long
    # programmed the slice change (without the fallback they would be refused: no active backend)
    deadline = sigterm + delay - 2
    rounds = 0
    while time.time() < deadline:
        for vip in (v4, v6):
            assert answers(lab, f"{ns}/asker", vip, 2) == [f"{ns}/solo"] * 2, vip
        wait_frontend(lab, "worker-1", v4, 1, 1)
        rounds += 1
    assert rounds >= 3, f"only {rounds} rounds of new connections in solo's drain"
    lab.wait_gone(ns, "solo", timeout=grace + 10)
    for vip in (v4, v6):
        wait_frontend(lab, "worker-1", vip, 0, 0)


def test_prestop_hooks_run_before_sigterm_and_sigkill_ends_the_grace_period(lab, ns, tmp_path):
    """preStop exec (in the pod's namespaces), httpGet and sleep run before SIGTERM; a server that outlives
    its grace period (--delay-shutdown past it) is SIGKILLed at the period's end, and only then does
    the pod go."""
    mark = tmp_path / "prestop"
    # exec: note the time, the pod's own addresses (its network namespace), take a second, note again
    script = f"date +%s.%N > {mark}; ip -o addr show dev eth0 >> {mark}; sleep 1; date +%s.%N >> {mark}"
    hooked = draining("hooked", ns, "worker-1", delay=0, grace=5, app="hooked",
                      pre_stop={"exec": {"command": ["sh", "-c", script]}})
    # sleep 2 of a 4 s period: SIGTERM after 2 s, SIGKILL 2 s later (the server would go on for 30)
    stubborn = draining("stubborn", ns, "worker-2", delay=30, grace=4, app="stubborn",
                        pre_stop={"sleep": {"seconds": 2}})
    witness = pod("witness", ns, "worker-3")
    lab.apply([hooked, stubborn, witness])
    ps = lab.wait(ns, ["hooked", "stubborn", "witness"])
    # httpGet (sent from the node, as a probe): flips the witness's health switch as the pod goes
    caller = draining("caller", ns, "worker-1", delay=0, grace=5, app="caller",
                      pre_stop={"httpGet": {"host": ips(ps["witness"])[0], "port": 80, "path": "/fail"}})
    lab.apply([caller])
    lab.wait(ns, ["caller"])
    assert healthz(lab, f"{ns}/witness") == f"200 ok {ns}/witness"
    t0 = time.time()
    lab.lace("delete", "pod", "hooked", "stubborn", "caller", "-n", ns, "--wait=false")
    lab.wait_gone(ns, "hooked", timeout=15)
    lab.wait_gone(ns, "caller", timeout=15)
    assert healthz(lab, f"{ns}/witness") == f"500 unhealthy {ns}/witness", "the preStop httpGet did not arrive"
    # exec: ran in the pod's network namespace, and SIGTERM came after it had finished
    lines = mark.read_text().splitlines()
    began, ended = float(lines[0]), float(lines[-1])
    assert ips(ps["hooked"])[0] in "".join(lines[1:-1]), f"the hook ran outside the pod's namespace: {lines}"
    sigterm = logged_at(lab, ps["hooked"], "SIGTERM")
    assert sigterm is not None and t0 <= began < ended <= sigterm, (t0, began, ended, sigterm)
    # sleep: SIGTERM after the 2 s hook, SIGKILL at the period's end (4 s), then the pod goes
    lab.wait_gone(ns, "stubborn", timeout=15)
    gone = time.time()
    sigterm = logged_at(lab, ps["stubborn"], "SIGTERM")
    assert sigterm is not None and 2 <= sigterm - t0 < 3, f"SIGTERM {sigterm - t0:.2f} s after the delete"
    assert 4 <= gone - t0 < 6.5, f"the pod went {gone - t0:.2f} s after the delete, not at its 4 s grace period's end"
    assert logged_at(lab, ps["stubborn"], "exiting") is None, "the server exited by itself: it was to be killed"
    assert f"pod {ns}/stubborn: still running at the end of its grace period: SIGKILL" in lab_log(lab)


def healthz(lab, name: str) -> str:
    """``STATUS BODY`` of the pod's own GET /healthz."""
    rc, out = lab.exec(name, sys.executable, "-c", "import urllib.request as u, urllib.error as e\n"
                       "try: r = u.urlopen('http://127.0.0.1/healthz', timeout=3)\n"
                       "except e.HTTPError as x: r = x\n"
                       "print(r.status, r.read().decode().strip())")
    assert rc == 0, out
    return out.strip()


def lab_log(lab) -> str:
    with open(os.path.join(lab.dir, "logs", "kubelet.log")) as f:
        return f.read()
