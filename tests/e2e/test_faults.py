"""Faults in the shared (SQLite) lab under load: agents SIGKILLed and restarted while long TCP
streams and new connections run through pods, a Service and a NetworkPolicy; the store's write
lock held by a stuck writer for a minute; the lab kubelet killed in the middle of a CNI ADD and
of a CNI DEL.

Load comes from ``tests/e2e/loadgen.py`` running inside a client pod: it holds long streams and
opens new connections at a steady rate, and reports every stream that broke and every new
connection that failed, with the wall time it started. The counts are printed (``pytest -s``)
and are in every assertion's message. Everything waits on conditions, never on a fixed sleep,
and every scenario leaves the lab as it found it (agents running and healthy, the kubelet
running, its namespace gone with the ``ns`` fixture) even when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from lace.lab import cluster

from .conftest import LabHandle, ips, pod, wait_for
from .test_service_traffic import programmed, service, vips

LOADGEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loadgen.py")
NODES = ("worker-1", "worker-2", "worker-3")
#: new connections a second to each of the load's targets
RATE = 20.0
#: how long one connection (or one request on a stream) may take before the load counts it failed
CONNECT_TIMEOUT = 2.0


# ---- load ----------------------------------------------------------------------------------------

class Load:
    """``loadgen.py`` running in a pod's network namespace until ``stop``; ``stop`` returns its
    report (``streams``: target, broken...; ``connect``: attempts, failures with wall times)."""

    def __init__(self, lab: LabHandle, client: str, hold: list[str], connect: list[str]) -> None:
        ns, name = client.split("/")
        netns = cluster.pod_netns(lab.dir, ns, name)
        argv = [sys.executable, LOADGEN, "--rate", str(RATE), "--timeout", str(CONNECT_TIMEOUT)]
        argv += [a for t in hold for a in ("--hold", t)] + [a for t in connect for a in ("--connect", t)]
        # `ip netns exec` execs the load generator: this Popen's pid is the load's own
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, *argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        if line.strip() != "running":
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"the load from {client} did not start: {line}{err}")

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=CONNECT_TIMEOUT + 20)
        assert self.proc.returncode == 0, f"the load generator failed ({self.proc.returncode}): {err}"
        return json.loads(out)


@contextmanager
def load(lab: LabHandle, client: str, hold: list[str], connect: list[str]) -> Iterator[dict]:
    """The block runs under load; the dict it gets is filled with the load's report afterwards
    (the load is stopped even when the block fails)."""
    gen = Load(lab, client, hold, connect)
    report: dict = {}
    try:
        yield report
    finally:
        report.update(gen.stop())


def _target(ip: str, port: int = 80) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def broken_streams(report: dict) -> list[dict]:
    return [s for s in report["streams"] if s["broken"]]


def failures(report: dict, since: float = 0.0, until: float = float("inf")) -> list[tuple[str, float, str]]:
    """(target, wall time, error) of every new connection that failed and started in the window."""
    return [(c["target"], at, err) for c in report["connect"] for at, err in c["failures"] if since <= at <= until]


def summary(report: dict, windows: dict[str, tuple[float, float]]) -> str:
    """One line a person reads: streams and their requests, new connections and their failures,
    in each fault window and in all."""
    streams = report["streams"]
    attempts = sum(c["attempts"] for c in report["connect"])
    parts = [f"{len(streams)} streams ({sum(s['requests'] for s in streams)} requests, "
             f"longest gap {max(s['worstGapMs'] for s in streams)} ms), {len(broken_streams(report))} broken",
             f"{attempts} new connections, {len(failures(report))} failed"]
    parts += [f"{len(failures(report, *w))} of ~{len(report['connect']) * RATE * (w[1] - w[0]):.0f} failed "
              f"while {what} ({w[1] - w[0]:.1f}s)" for what, w in windows.items()]
    return "; ".join(parts)


# ---- agent SIGKILL under load --------------------------------------------------------------------

#: after `lace lab restart-agent` returns (the new agent answers its health check), the new agent
#: still makes its first pass: failures up to this long after it count as the restart's
RESTART_TAIL = 3.0


def test_agent_sigkill_under_load_breaks_no_stream_and_fails_no_new_connection(lab: LabHandle, ns: str):
    """Every node's agent in turn SIGKILLed and restarted while a client on worker-1 keeps four
    long streams (two straight to backends on other nodes, one through each of the Service's
    VIPs) and opens RATE new connections a second to a backend and to each VIP, and the backends
    admit only the client through a NetworkPolicy.

    Nothing may break: the maps and tcx links stay pinned and the new agent adopts them, so the
    datapath never stops forwarding, translating or enforcing: established streams broken 0, and
    new connections failed 0 in each restart window (a failure would be a connection refused, reset
    or unanswered for CONNECT_TIMEOUT while an agent was down or taking over). The policy still
    holds afterwards: a stranger is refused."""
    lab.apply([pod("client", ns, "worker-1", labels={"app": "client"}),
               pod("stranger", ns, "worker-1", labels={"app": "stranger"}),
               pod("srv-2", ns, "worker-2", labels={"app": "srv"}),
               pod("srv-3", ns, "worker-3", labels={"app": "srv"})])
    pods = lab.wait(ns, ["client", "stranger", "srv-2", "srv-3"])
    lab.apply([service("srv", ns, {"app": "srv"}),
               {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "only-the-client", "namespace": ns},
                "spec": {"podSelector": {"matchLabels": {"app": "srv"}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                      "ports": [{"port": 80}]}]}}])
    vip4, vip6 = vips(lab, ns, "srv")
    programmed(lab, vip4, 2)
    programmed(lab, vip6, 2)
    srv2, srv3 = ips(pods["srv-2"])[0], ips(pods["srv-3"])[1]
    wait_for(lambda: not lab.check(f"{ns}/stranger", "tcp", srv2, 80)[0], "the policy to refuse the stranger", 30, 0.2)
    windows: dict[str, tuple[float, float]] = {}
    with load(lab, f"{ns}/client", hold=[_target(srv2), _target(srv3), _target(vip4), _target(vip6)],
              connect=[_target(srv2), _target(vip4), _target(vip6)]) as report:
        for node in NODES:
            old_pid = lab.node(node)["agentPid"]
            killed = time.time()
            lab.lace("lab", "restart-agent", node, "--kill")
            windows[f"{node}'s agent restarted"] = (killed, time.time() + RESTART_TAIL)
            assert lab.node(node)["agentPid"] not in (None, old_pid)
        # the load runs on past the last restart's tail, so that window is measured whole
        wait_for(lambda: time.time() > max(w[1] for w in windows.values()), "the last restart's tail", 10, 0.1)
    line = summary(report, windows)
    print(f"\nagent SIGKILL under load: {line}")
    assert not broken_streams(report), f"streams broke: {broken_streams(report)}; {line}"
    assert all(s["requests"] > 0 for s in report["streams"]), f"a stream made no request: {report['streams']}; {line}"
    assert all(c["attempts"] > 0 and c["answers"] for c in report["connect"]), report["connect"]
    for what, window in windows.items():
        assert not failures(report, *window), f"new connections failed while {what}: {failures(report, *window)}; {line}"
    assert not failures(report), f"new connections failed outside the restarts: {failures(report)}; {line}"
    # the restarted agents still enforce the policy and still serve the client
    ok, out = lab.check(f"{ns}/stranger", "tcp", srv2, 80)
    assert not ok, f"the stranger got through after the restarts: {out}"
    ok, out = lab.check(f"{ns}/client", "tcp", vip4, 80)
    assert ok, out
