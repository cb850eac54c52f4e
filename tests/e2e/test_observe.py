"""``lace observe`` against the shared lab: a policy drop found with the policy named, filters,
two concurrent followers, export with rotation, the summary, bad input, a node that is down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from .conftest import agent_down, ips, namespace, pod

LACE = os.path.join(os.path.dirname(sys.executable), "lace")


@pytest.fixture(scope="module")
def obs(lab):
    """client (worker-1) and other (worker-1) may reach web (worker-2) only as the policies say:
    web is selected by a default-deny ingress policy, other answers anything."""
    ns = f"obs-{uuid.uuid4().hex[:6]}"
    deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "web-deny", "namespace": ns},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}}
    lab.apply([namespace(ns), pod("client", ns, "worker-1"), pod("web", ns, "worker-2"),
               pod("other", ns, "worker-3"), deny])
    ps = lab.wait(ns, ["client", "web", "other"])
    web4, _ = ips(ps["web"])
    other4, _ = ips(ps["other"])
    ok, out = lab.check(f"{ns}/client", "tcp", web4, 80, timeout=0.5)
    assert not ok, "web is default-deny"
    ok, out = lab.check(f"{ns}/client", "tcp", other4, 80)
    assert ok, out
    ok, out = lab.check(f"{ns}/client", "udp", other4, 53)
    assert ok, out
    yield {"ns": ns, "web4": web4, "other4": other4, "client4": ips(ps["client"])[0]}
    lab.lace("delete", "namespace", ns, check=False)


def observe_json(lab, *argv: str) -> dict:
    rc, out, err = lab.lace("observe", *argv, "-o", "json", check=False)
    assert rc == 0, err
    return json.loads(out)


def wait_flows(lab, *argv: str, want=lambda flows: bool(flows), timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        flows = observe_json(lab, *argv)["flows"]
        if want(flows):
            return flows
        assert time.monotonic() < deadline, json.dumps(flows)[:2000]
        time.sleep(0.1)


def test_a_policy_drop_is_found_with_the_policy_named(lab, obs):
    ns = obs["ns"]
    flows = wait_flows(lab, "--verdict", "DROPPED", "--to-pod", f"{ns}/web")
    d = flows[-1]
    assert (d["verdict"], d["reason"], d["node"]) == ("drop", "policy-ingress", "worker-2")
    assert d["src_pod"] == f"{ns}/client" and d["dst_pod"] == f"{ns}/web"
    assert d["policy"] == f"{ns}/web-deny (default deny)"
    rc, out, _ = lab.lace("observe", "--verdict", "DROPPED", "--namespace", ns)
    line = next(x for x in out.splitlines() if f"{ns}/web" in x)
    assert "[worker-2]" in line and f"{ns}/client (" in line and "DROPPED (policy-ingress)" in line
    assert line.endswith(f"policy {ns}/web-deny (default deny)")
    rc, out, _ = lab.lace("observe", "--drop-reason", "policy-ingress", "--namespace", ns, "-o", "table")
    assert "POLICY" in out.splitlines()[0] and f"{ns}/web-deny (default deny)" in out


def test_filters(lab, obs):
    ns = obs["ns"]
    client, web, other = f"{ns}/client", f"{ns}/web", f"{ns}/other"
    flows = wait_flows(lab, "--from-pod", client, "--to-pod", other, "--protocol", "udp",
                       want=lambda fl: any(f["dport"] == 53 for f in fl))
    assert all(f["proto"] == "udp" and f["src_pod"] == client and f["dst_pod"] == other for f in flows)
    flows = observe_json(lab, "--namespace", ns)["flows"]
    pods = {f["dst_pod"] for f in flows}
    assert {web, other} <= pods
    by_port = observe_json(lab, "--namespace", ns, "--port", "80")["flows"]
    assert by_port and all(80 in (f["sport"], f["dport"]) for f in by_port)
    no_web = observe_json(lab, "--namespace", ns, "--not", "--to-pod", web)["flows"]
    assert no_web and all(f["dst_pod"] != web for f in no_web)
    assert len(no_web) < len(flows)
    not_fwd = observe_json(lab, "--namespace", ns, "--not", "--verdict", "FORWARDED")["flows"]
    assert not_fwd and all(f["verdict"] != "forward" for f in not_fwd)
    ip = observe_json(lab, "--from-ip", obs["client4"] + "/32", "--to-ip", obs["other4"])["flows"]
    assert ip and all(f["saddr"] == obs["client4"] and f["daddr"] == obs["other4"] for f in ip)
    one = observe_json(lab, "--namespace", ns, "--node", "worker-3")["flows"]
    assert one and {f["node"] for f in one} == {"worker-3"}
    times = [f["time"] for f in flows]
    assert times == sorted(times), "merged in time order"
    assert len(observe_json(lab, "--namespace", ns, "--last", "2")["flows"]) == 2
    assert observe_json(lab, "--namespace", ns, "--until", "@1")["flows"] == []
    assert observe_json(lab, "--namespace", ns, "--since", "2000-01-01T00:00:00")["flows"]


def test_two_followers_see_the_same_new_flows(lab, obs):
    ns = obs["ns"]
    # PYTHONFAULTHANDLER: a reader that does not stop on SIGINT is aborted, and its stderr then
    # holds every thread's stack
    env = dict(lab.env, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    cmd = [LACE, "observe", "--follow", "-o", "jsonl", "--namespace", ns, "--port", "81"]
    readers = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    lines: list[list[dict]] = [[], []]
    done = [threading.Event(), threading.Event()]

    def watch(i: int) -> None:
        for text in readers[i].stdout:
            d = json.loads(text)
            if "lost" in d:
                continue
            lines[i].append(d)
            if len({f["node"] for f in lines[i]}) == 2:   # the egress (worker-1) and the drop (worker-2)
                done[i].set()

    threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while not all(d.is_set() for d in done):
            assert time.monotonic() < deadline, (lines, [r.poll() for r in readers])
            lab.check(f"{ns}/client", "tcp", obs["web4"], 81, timeout=0.3)
    finally:
        for r in readers:
            r.send_signal(signal.SIGINT)
        for r in readers:
            try:
                r.wait(10)
            except subprocess.TimeoutExpired:
                r.send_signal(signal.SIGABRT)
                try:
                    r.wait(5)
                except subprocess.TimeoutExpired:
                    r.kill()
                    r.wait()
    assert [r.returncode for r in readers] == [0, 0], [r.stderr.read() for r in readers]
    for i in range(2):
        assert all(f["dport"] == 81 and f["dst_pod"] == f"{ns}/web" for f in lines[i])
    key = lambda f: (f["node"], f["ts_ns"])  # noqa: E731
    first = {key(f) for f in lines[0]} & {key(f) for f in lines[1]}
    assert any(n == "worker-2" for n, _ in first) and any(n == "worker-1" for n, _ in first), \
        "both readers saw the same flows"
    drops = [f for f in lines[0] if f["node"] == "worker-2"]
    assert drops[0]["policy"] == f"{ns}/web-deny (default deny)"


def test_export_writes_json_lines_and_rotates(lab, obs, tmp_path):
    path = str(tmp_path / "flows.jsonl")
    rc, out, _ = lab.lace("observe", "--namespace", obs["ns"], "--export", path,
                          "--export-max-size", "0.004", "--export-keep", "2")
    assert out.startswith("exported ") and "rotation" in out, out
    files = sorted(os.listdir(tmp_path))
    assert files[:2] == ["flows.jsonl", "flows.jsonl.1"] and len(files) <= 3, files
    total = 0
    for f in files:
        assert os.path.getsize(tmp_path / f) <= 4194
        for text in open(tmp_path / f):
            d = json.loads(text)
            assert d["node"] and d["verdict_text"] in ("FORWARDED", "DROPPED", "AUDIT")
            total += 1
    assert total > 0


def test_summary(lab, obs):
    ns = obs["ns"]
    doc = observe_json(lab, "--namespace", ns, "--summary")
    assert doc["flows"] > 0
    assert any(t["source"] == f"{ns}/client" and t["destination"] == f"{ns}/other" for t in doc["top_talkers"])
    assert any(r["reason"] == "policy-ingress" for r in doc["drop_reasons"])
    pair = next(p for p in doc["pairs"] if p["destination"] == f"{ns}/web")
    assert pair["dropped"] >= 1
    rc, out, _ = lab.lace("observe", "--namespace", ns, "--summary")
    assert "TOP TALKERS" in out and "TOP DROP REASONS" in out and "PAIRS" in out and "policy-ingress" in out


@pytest.mark.parametrize("argv, needle", [
    (["--pod", "nosuchns/x"], 'no namespace "nosuchns"'),
    (["--to-pod", "default/nosuchpod"], 'no pod "nosuchpod"'),
    (["--namespace", "nosuchns"], "no such namespace"),
    (["--node", "worker-9"], "no such node"),
    (["--from-ip", "10.1.2.300/8"], "not an address or CIDR"),
    (["--since", "last tuesday"], "is not a time"),
    (["--drop-reason", "policy"], "not a drop reason"),
    (["--network", "nosuchnet"], "no such network"),
])
def test_bad_input_exits_2_with_a_hint(lab, argv, needle):
    rc, out, err = lab.lace("observe", *argv, check=False)
    assert rc == 2, (rc, out, err)
    assert needle in err and "hint: " in err and "Traceback" not in err


def test_a_node_down_is_named_and_the_rest_shown(lab, obs):
    with agent_down(lab, "worker-3"):
        rc, out, err = lab.lace("observe", "--namespace", obs["ns"], check=False)
        assert rc == 1
        assert "node worker-3 did not answer" in err and "hint: " in err
        assert "[worker-2]" in out and "[worker-1]" in out
