"""``python -m lace.lab.demo`` (``make lab``): bring up a 3-node lab, apply examples/demo.yaml,
show pods talking within and across nodes over IPv4 and IPv6, the overlapping networks keeping to
themselves, a blocked cross-network attempt, and what to try next. Every step is a real ``lace``
command whose real output is printed."""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import sys
import time
from pathlib import Path

from lace.cli.main import main as lace

ROOT = Path(__file__).resolve().parents[2]
NETCHECK = [sys.executable, "-m", "lace.lab.netcheck"]


def run(*argv: str, show: bool = True, check: bool = True) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = int(lace(list(argv), os.environ, stdout=out, stderr=err))
    shown = [a if not a.startswith(sys.executable) else "python" for a in argv]
    if show:
        print(f"$ lace {' '.join(shlex.quote(a) for a in shown)}".replace(" -m lace.lab.netcheck", " -m lace.lab.netcheck"))
        text = err.getvalue() + out.getvalue()   # progress (stderr) came first
        if text:
            print(text.rstrip())
        print()
    if check and rc != 0:
        raise SystemExit(f"demo step failed (exit {rc}): lace {' '.join(argv)}\n{err.getvalue()}")
    return rc, out.getvalue()


def pods() -> dict[str, dict]:
    _, out = run("get", "pods", "-A", "-o", "json", show=False)
    return {f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}': p for p in json.loads(out)["items"]}


def wait_running(names: list[str], timeout: float = 60) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        ps = pods()
        if all((ps.get(n) or {}).get("status", {}).get("phase") == "Running" for n in names):
            return ps
        if time.monotonic() > deadline:
            missing = [n for n in names if (ps.get(n) or {}).get("status", {}).get("phase") != "Running"]
            raise SystemExit(f"pods not running after {timeout:.0f}s: {', '.join(missing)}")
        time.sleep(0.1)


def ips(p: dict) -> tuple[str, str]:
    addrs = [a["ip"] for a in p["status"]["podIPs"]]
    return next(a for a in addrs if ":" not in a), next(a for a in addrs if ":" in a)


def wait_service(ns: str, name: str, backends: int, timeout: float = 60) -> tuple[str, str]:
    """The service's IPv4 and IPv6 VIPs once every node has programmed ``backends`` active ones."""
    _, out = run("get", "services", name, "-n", ns, "-o", "json", show=False)
    v4, v6 = json.loads(out)["spec"]["clusterIPs"]
    deadline = time.monotonic() + timeout
    while True:
        ready = 0
        for node in ("worker-1", "worker-2", "worker-3"):
            _, doc = run("exec", "--node", node, "--", "node", "bpf", "show", "services", "-n", "-o", "json",
                         show=False)
            ready += any(e["addr"] == v4 and e["slot"] == 0 and e["active_count"] == backends
                         for e in json.loads(doc)["entries"])
        if ready == 3:
            return v4, v6
        if time.monotonic() > deadline:
            raise SystemExit(f"service {ns}/{name} not programmed with {backends} backends after {timeout:.0f}s")
        time.sleep(0.1)


def check(src: str, mode: str, ip: str, port: int, expect_ok: bool = True) -> None:
    print(f"# {src} -> {ip}:{port}/{mode}" + ("" if expect_ok else "   (expected to fail)"))
    rc, _ = run("lab", "exec", src, "--", *NETCHECK, mode, ip, str(port), "--timeout", "1", check=False)
    if (rc == 0) != expect_ok:
        raise SystemExit(f"unexpected result for {src} -> {ip}:{port}/{mode}: exit {rc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="lace")
    a = ap.parse_args()
    os.environ["LACE_LAB"] = a.name
    run("lab", "down", "--name", a.name, show=False, check=False)
    run("lab", "up", "--name", a.name, "--nodes", "3")
    run("lab", "status")
    os.chdir(ROOT)
    run("apply", "-f", "examples/demo.yaml")
    names = ["alpha/web-1", "alpha/web-2", "beta/web-3", "alpha/red-1", "alpha/red-2", "beta/blue-1", "beta/blue-2"]
    ps = wait_running(names)
    run("get", "networks")
    run("get", "pods", "-A", "-o", "wide")
    w2, w2v6 = ips(ps["alpha/web-2"])
    w3, _ = ips(ps["beta/web-3"])
    print("## pods talking across nodes (default network), IPv4 and IPv6, TCP and UDP\n")
    check("alpha/web-1", "tcp", w2, 80)
    check("alpha/web-1", "tcp", w2v6, 80)
    check("alpha/web-1", "udp", w3, 53)
    r2, _ = ips(ps["alpha/red-2"])
    b2, _ = ips(ps["beta/blue-2"])
    print("## overlapping networks: red and blue both use 10.10.0.0/16\n")
    check("alpha/red-1", "tcp", r2, 80)
    check("beta/blue-1", "tcp", b2, 80)
    print("## a blocked cross-network attempt: red-1 tries web-2, a pod of the default network;\n"
          "## red has no route into default, so the datapath drops it (no route)\n")
    check("alpha/red-1", "tcp", w2, 80, expect_ok=False)
    print("## a Service: alpha/web spreads over web-1 and web-2; beta/web-3 (worker-3) asks its VIP\n")
    vip4, vip6 = wait_service("alpha", "web", backends=2)
    run("get", "services", "-n", "alpha", "-o", "wide")
    print(f"# beta/web-3 -> {vip4}:80/tcp, four connections")
    run("lab", "exec", "beta/web-3", "--", *NETCHECK, "tcp", vip4, "80", "--count", "4")
    check("beta/web-3", "tcp", vip6, 80)
    check("beta/web-3", "udp", vip4, 53)
    run("exec", "--node", "worker-3", "--", "node", "bpf", "show", "services", "--endpoints")
    print("## cluster DNS: the service by name, through kube-dns's VIP (dnsmasq in kube-system/kube-dns-1)\n")
    run("lab", "exec", "beta/web-3", "--", "getent", "hosts", "web.alpha.svc.cluster.local")
    run("lab", "exec", "beta/web-3", "--", *NETCHECK, "tcp", "web.alpha", "80")
    print(f"""The lab is up. Try next:
  lace get pods -A -o wide
  lace lab exec alpha/web-1 -- python -m lace.lab.netcheck tcp {w2} 80
  lace exec --node worker-1 -- node bpf show delivery
  lace exec --node worker-1 -- node ct list all
  lace exec --node worker-3 -- node trace flow --last 20
  lace exec --node worker-2 -- node trace flow --follow
  lace lab restart-agent worker-2 --kill
  lace lab down
""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
