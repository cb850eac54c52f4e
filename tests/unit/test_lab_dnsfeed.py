"""The DNS feeder against a real store: it writes the records file only when the records change,
replaces it atomically, signals every dnsmasq with a pid file beside it (and nothing else), and
follows the store while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lace.lab import dns
from lace.lab.dnsfeed import Feeder, reload_servers, reload_srv, write_if_changed
from lace.store import SqliteStore

# a stand-in for dnsmasq: named "dnsmasq" (what the feeder checks in /proc/PID/comm), counting SIGHUPs
FAKE_DNSMASQ = r"""
import ctypes, signal, sys, time
ctypes.CDLL(None).prctl(15, b"dnsmasq", 0, 0, 0)   # PR_SET_NAME
hups = open(sys.argv[1], "a", buffering=1)
signal.signal(signal.SIGHUP, lambda *_: hups.write("hup\n"))
open(sys.argv[2], "w").close()
while True:
    time.sleep(1)
"""


def wait_until(fn, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def fake_dnsmasq(tmp_path):
    """(process, its pid file in dns/, the file counting its SIGHUPs)."""
    dns_dir = tmp_path / "dns"
    dns_dir.mkdir()
    hups, ready = tmp_path / "hups", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", FAKE_DNSMASQ, str(hups), str(ready)])
    try:
        wait_until(ready.exists, "the fake dnsmasq")
        pid_file = dns_dir / dns.pid_file_name("uid-1")
        pid_file.write_text(f"{proc.pid}\n")
        yield proc, pid_file, hups
    finally:
        proc.kill()
        proc.wait()


# a stand-in for a DNS pod's server (lace.lab.dnsserver, which the feeder looks for in its command
# line), counting SIGHUPs
FAKE_SERVER = r"""
import signal, sys, time
hups = open(sys.argv[2], "a", buffering=1)
signal.signal(signal.SIGHUP, lambda *_: hups.write("hup\n"))
open(sys.argv[3], "w").close()
while True:
    time.sleep(1)
"""


@pytest.fixture
def fake_server(tmp_path, fake_dnsmasq):
    """(its pid file in dns/, the file counting its SIGHUPs) beside the fake dnsmasq."""
    script, hups, ready = tmp_path / "fake_server.py", tmp_path / "server-hups", tmp_path / "server-ready"
    script.write_text(FAKE_SERVER)
    proc = subprocess.Popen([sys.executable, str(script), "lace.lab.dnsserver", str(hups), str(ready)])
    try:
        wait_until(ready.exists, "the fake server")
        pid_file = tmp_path / "dns" / "dnsmasq-uid-1.server"
        pid_file.write_text(f"{proc.pid}\n")
        yield pid_file, hups
    finally:
        proc.kill()
        proc.wait()


def hup_count(hups: Path) -> int:
    return len(hups.read_text().splitlines()) if hups.exists() else 0


def service(name, ns="shop", ips=("10.96.0.20",)):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIPs": list(ips), "ipFamilyPolicy": "PreferDualStack" if len(ips) > 1 else "SingleStack",
                     "ports": [{"port": 80}]}}


def namespace(name):
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def test_write_if_changed_replaces_the_file_only_when_the_text_differs(tmp_path):
    path = tmp_path / "hosts"
    assert write_if_changed(path, "a\n")
    first = path.stat().st_ino
    assert not write_if_changed(path, "a\n")
    assert path.stat().st_ino == first, "unchanged: not rewritten"
    assert write_if_changed(path, "b\n")
    assert path.read_text() == "b\n" and path.stat().st_ino != first, "replaced by a rename, never edited in place"
    assert oct(path.stat().st_mode & 0o777) == "0o644", "readable by dnsmasq whatever user it runs as"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"], "no temporary file left"


def test_reload_signals_dnsmasq_and_nothing_else(tmp_path, fake_dnsmasq):
    proc, pid_file, hups = fake_dnsmasq
    bystander = subprocess.Popen(["sleep", "30"])   # SIGHUP would kill it
    try:
        (pid_file.parent / dns.pid_file_name("uid-stale")).write_text(f"{bystander.pid}\n")
        (pid_file.parent / dns.pid_file_name("uid-junk")).write_text("not a pid\n")
        (pid_file.parent / "other.pid").write_text(f"{proc.pid}\n")   # not a dnsmasq pid file name
        assert reload_servers(pid_file.parent) == [proc.pid]
        wait_until(lambda: hup_count(hups) == 1, "one SIGHUP")
        time.sleep(0.05)
        assert bystander.poll() is None, "a recycled pid is not signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_sync_writes_and_reloads_only_on_change_and_follows_a_delete(tmp_path, fake_dnsmasq):
    _, pid_file, hups = fake_dnsmasq
    store = SqliteStore(tmp_path / "store.db")
    try:
        store.apply_all([namespace("shop"), service("web", ips=("10.96.0.20", "fd00:10:96::14"))])
        feeder = Feeder(store, pid_file.parent)
        feeder.sync()
        hosts = pid_file.parent / dns.HOSTS_FILE
        assert hosts.read_text().splitlines()[1:] == ["10.96.0.20 web.shop.svc.cluster.local",
                                                       "fd00:10:96::14 web.shop.svc.cluster.local"]
        wait_until(lambda: hup_count(hups) == 1, "a reload after the first write")

        # the same records again (a pod without an address changes nothing): no write, no signal
        store.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "shop"},
                     "spec": {"containers": [{"name": "c"}]}})
        inode = hosts.stat().st_ino
        feeder.sync()
        time.sleep(0.05)
        assert hosts.stat().st_ino == inode and hup_count(hups) == 1

        # a restarted feeder finds the file right and stays silent
        Feeder(store, pid_file.parent).sync()
        time.sleep(0.05)
        assert hup_count(hups) == 1

        store.delete("Service", "web", "shop")
        feeder.sync()
        assert "web.shop" not in hosts.read_text()
        wait_until(lambda: hup_count(hups) == 2, "a reload after the delete")
    finally:
        store.close()


def test_srv_records_are_written_and_the_dns_server_alone_is_told(tmp_path, fake_dnsmasq, fake_server):
    _, _, dnsmasq_hups = fake_dnsmasq
    pid_file, hups = fake_server
    store = SqliteStore(tmp_path / "store.db")
    try:
        web = service("web")
        store.apply_all([namespace("shop"), web])
        feeder = Feeder(store, pid_file.parent)
        feeder.sync()
        srv = pid_file.parent / dns.SRV_FILE
        assert srv.read_text().splitlines()[1:] == [], "no named port, no SRV record"
        wait_until(lambda: hup_count(hups) == 1 and hup_count(dnsmasq_hups) == 1, "both told of their first files")

        web["spec"]["ports"] = [{"name": "http", "port": 80}]
        store.apply(web)
        feeder.sync()
        assert srv.read_text().splitlines()[1:] == [
            "srv-host=_http._tcp.web.shop.svc.cluster.local,web.shop.svc.cluster.local,80,0,100"]
        wait_until(lambda: hup_count(hups) == 2, "the server told of the SRV change")
        time.sleep(0.05)
        assert hup_count(dnsmasq_hups) == 1, "the addresses did not change: dnsmasq is left alone"

        # a pid file whose process is not a DNS server is skipped
        (pid_file.parent / "dnsmasq-uid-2.server").write_text(f"{os.getpid()}\n")
        assert reload_srv(pid_file.parent) == [int(pid_file.read_text())]
    finally:
        store.close()


def test_run_follows_the_store_until_stopped(tmp_path, fake_dnsmasq):
    _, pid_file, hups = fake_dnsmasq
    store = SqliteStore(tmp_path / "store.db")
    feeder = Feeder(store, pid_file.parent)
    runner = threading.Thread(target=feeder.run)
    runner.start()
    try:
        hosts = pid_file.parent / dns.HOSTS_FILE
        wait_until(hosts.exists, "the first write")
        store.apply_all([namespace("shop"), namespace("other"),
                         service("a"), service("b", ns="other", ips=("fd00:10:96::b",))])
        wait_until(lambda: "b.other.svc.cluster.local" in hosts.read_text(), "b's record")
        assert "10.96.0.20 a.shop.svc.cluster.local" in hosts.read_text()
        store.delete("Service", "a", "shop")
        wait_until(lambda: "a.shop" not in hosts.read_text(), "a's record to go")
        wait_until(lambda: hup_count(hups) >= 3, "a reload per change")
    finally:
        feeder.stop()
        runner.join(timeout=5)
        store.close()
    assert not runner.is_alive(), "stop ends run"
    assert hosts.exists(), "the file stays for a restarted feeder"
