"""The DNS pod's process: two dnsmasq, so that SRV records change without a query lost.

dnsmasq re-reads its hosts files (``--addn-hosts``) and its ``--servers-file`` on SIGHUP, but no
other record: ``--srv-host`` lines are configuration, read once at start (``man dnsmasq``, NOTES:
"SIGHUP does NOT re-read the configuration file"; ``--hostsdir`` and ``--dhcp-hostsdir`` hold
addresses and DHCP hosts only, and its DBus interface sets upstream servers, not records). A
dnsmasq must start again to serve other SRV records, and it cannot start beside the one it
replaces: it binds its addresses without SO_REUSEPORT, so the second one fails with "Address in
use", and any stop-then-start leaves a gap in which queries to port 53 are refused. So the pod
runs them in two roles:

- the **front** dnsmasq, on port 53 of the pod's addresses (the one the DNS Service sends to),
  answers every address record from the hosts file and forwards exactly the SRV record names
  (``lace.lab.dns.servers_text``, ``--servers-file``) to
- an **SRV** dnsmasq on the pod's loopback, which answers them from ``srv.conf``
  (``lace.lab.dns.srv_text``) with the hosts file's addresses of their targets.

When the feeder writes other SRV records it sends this process SIGHUP; it starts a new SRV
dnsmasq on the other of the two loopback ports (``lace.lab.dns.SRV_PORTS``) from a copy of the
file, waits until it listens (its pid file), and only then stops the old one. The front forwards
each SRV name to both ports at once (``--all-servers``) and passes on the first answer, so
while both listen either answers and while one does it does: the front's forwarding never
changes for a switch (re-read, a changed server entry drops the answers to queries in flight to
it). It is told only of names that come or go (its servers file replaced, then SIGHUP: re-read,
never restarted), and it caches nothing, so every query is answered, by the old records or the
new: tests/e2e/test_dns.py asks all through two switches and finds none unanswered (stopping the
old one before starting the new loses some, and fails it). The front writes the pid file the
kubelet waits for once it listens, after the first SRV dnsmasq does. Whatever the feeder sends
in between is not missed: this process writes its own pid file before it first reads the
records, and reads them again on every SIGHUP.

``python -m lace.lab.dnsserver --dnsmasq BINARY --hosts FILE --srv FILE --pid-file FILE --listen IP
... -- ARGS`` (``lace.lab.dns.dnsmasq_argv``); it runs in the DNS pod's network namespace, leads its
process group (the kubelet stops the group), and ends when the front dnsmasq does, or on SIGTERM
after stopping both.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import dns

log = logging.getLogger("lace.lab.dnsserver")

#: how long a dnsmasq may take to listen before it counts as failed
START_TIMEOUT = 10.0


class ServerError(Exception):
    """A dnsmasq that would not start: its exit status or what it was waiting for."""


def _replace(path: str, text: str) -> None:
    """Write ``path`` by a rename, so that dnsmasq never reads half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:   # the feeder has not written it yet: no SRV record so far
        return ""


def _unlink(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _stop(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Server:
    """The front and SRV dnsmasq of one DNS pod (see the module docstring)."""

    def __init__(self, binary: str, listen: list[str], hosts_file: str, srv_file: str, pid_file: str,
                 args: list[str]) -> None:
        self.binary, self.listen, self.args = binary, listen, args
        self.hosts_file, self.srv_file, self.pid_file = hosts_file, srv_file, pid_file
        self.files = dns.server_files(pid_file)
        self.front: subprocess.Popen | None = None
        self.srv: subprocess.Popen | None = None
        self.srv_port: int | None = None
        self.srv_loaded: str | None = None   # the SRV text the running SRV dnsmasq was started with
        self.wake = threading.Event()        # SIGHUP: read the SRV records again
        self.stopping = False

    def _start(self, argv: list[str], pid_file: str, what: str) -> subprocess.Popen:
        """Start one dnsmasq and wait until it listens (it writes ``pid_file`` after binding)."""
        _unlink(pid_file)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        except OSError as err:
            raise ServerError(f"cannot run the {what} dnsmasq ({argv[0]}): {err.strerror}") from None
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(pid_file):
            if proc.poll() is not None:
                raise ServerError(f"the {what} dnsmasq exited at start with status {proc.returncode}")
            if time.monotonic() > deadline:
                _stop(proc)
                raise ServerError(f"the {what} dnsmasq did not listen within {START_TIMEOUT:.0f} s")
            time.sleep(0.005)
        return proc

    def switch(self) -> None:
        """Serve the SRV records of the file now: a new SRV dnsmasq on the other port, the front
        pointed at it, the old one stopped (nothing if the records are the ones served)."""
        text = _read(self.srv_file)
        if text == self.srv_loaded and self.srv is not None and self.srv.poll() is None:
            return
        port = dns.SRV_PORTS[1] if self.srv_port == dns.SRV_PORTS[0] else dns.SRV_PORTS[0]
        conf, pid = self.files[f"srv-{port}.conf"], self.files[f"srv-{port}.pid"]
        _replace(conf, text)   # its own copy: the feeder may replace srv.conf while it starts
        new = self._start(dns.srv_argv(port, self.hosts_file, conf, pid, self.args, self.binary), pid, "SRV")
        old, old_port = self.srv, self.srv_port
        names_before = dns.srv_names(self.srv_loaded or "")
        self.srv, self.srv_port, self.srv_loaded = new, port, text
        names = dns.srv_names(text)
        if names != names_before or not os.path.exists(self.files["servers"]):
            _replace(self.files["servers"], dns.servers_text(names))
            if self.front is not None:
                self.front.send_signal(signal.SIGHUP)   # the names to forward (and the hosts file again)
        # the front sends every forwarded query to both ports: the new one answers from now on
        _stop(old)
        if old_port is not None:
            _unlink(self.files[f"srv-{old_port}.pid"], self.files[f"srv-{old_port}.conf"])
        log.info("SRV dnsmasq %d on port %d: %d names", new.pid, port, len(names))

    def run(self) -> int:
        """Start both, follow SIGHUPs until SIGTERM or the front's end; returns the exit status."""
        _replace(self.files["server"], f"{os.getpid()}\n")   # before the first read: see the docstring
        try:
            self.switch()
            self.front = self._start(dns.front_argv(self.listen, self.hosts_file, self.pid_file,
                                                    self.files["servers"], self.args, self.binary),
                                     self.pid_file, "front")
            while not self.stopping:
                self.wake.wait(1.0)
                self.wake.clear()
                if self.stopping:
                    break
                if self.front.poll() is not None:
                    log.error("the front dnsmasq exited with status %s", self.front.returncode)
                    return self.front.returncode or 1
                try:
                    # on SIGHUP, and when the SRV dnsmasq died: it is started again
                    self.switch()
                except ServerError as err:
                    log.error("%s; the SRV records of the moment stay served", err)
            return 0
        except ServerError as err:
            log.error("%s", err)
            return 1
        finally:
            _stop(self.front)
            _stop(self.srv)
            _unlink(*self.files.values())

    def reload(self) -> None:
        """Read the SRV records again (safe from a signal handler)."""
        self.wake.set()

    def stop(self) -> None:
        """End ``run`` (safe from a signal handler)."""
        self.stopping = True
        self.wake.set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-lab-dnsserver", description=__doc__.splitlines()[0])
    ap.add_argument("--dnsmasq", default="dnsmasq", help="the dnsmasq binary")
    ap.add_argument("--hosts", required=True, help="the address records (hosts format, lace.lab.dnsfeed)")
    ap.add_argument("--srv", required=True, help="the SRV records (srv-host lines, lace.lab.dnsfeed)")
    ap.add_argument("--pid-file", required=True, help="the front dnsmasq's pid file, written once it listens")
    ap.add_argument("--listen", action="append", default=[], help="an address of the pod (repeat)")
    ap.add_argument("args", nargs="*", help="after --: more dnsmasq options, for both")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.listen:
        print("error: no --listen address: the DNS pod has none", file=sys.stderr)
        return 2
    server = Server(args.dnsmasq, args.listen, args.hosts, args.srv, args.pid_file, args.args)
    signal.signal(signal.SIGHUP, lambda *_: server.reload())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    return server.run()


if __name__ == "__main__":
    sys.exit(main())
