"""The DNS feeder: keeps the lab's cluster DNS records (``<state>/dns/hosts`` for addresses,
``<state>/dns/srv.conf`` for SRV records) in step with the store and has every DNS pod serve them.

``python -m lace.lab.dnsfeed --state-dir DIR`` runs it; ``lace lab up`` starts one per lab (``start``:
process ``dns``) and ``lace lab down`` stops it. It is a process of its own rather than a controller in
``lace.controllers`` because what it writes is the lab's business — a file in the state dir and
signals to the lab's dnsmasq — while ``lace.controllers`` writes only Kubernetes objects to the
store and would serve a real cluster as it is; in a real cluster CoreDNS watches the API itself.

Level-triggered and simple: list Services, EndpointSlices and Pods, compute the records
(``lace.lab.dns.records`` and ``srv_records``), write each file if its content changed, then
watch those kinds and list again after any change (a burst of changes is read in one list). A
write replaces the file atomically (rename). A new hosts file is followed by SIGHUP to each
dnsmasq with a pid file in the same directory (``dnsmasq-*.pid``, checked to be a dnsmasq),
which makes it re-read its hosts files; a new SRV file by SIGHUP to each DNS pod's server
(``dnsmasq-*.server``, checked to be ``lace.lab.dnsserver``), which has a new dnsmasq serve them
(dnsmasq reads SRV records only at start; see ``lace.lab.dnsserver``). The hosts file goes
first, so a new SRV target has its address before its SRV record is served. Nothing is written
or signalled when the records are unchanged, so a restarted feeder is silent. No server can
miss a change: each writes its pid file before it first reads the records and ignores SIGHUP
until it has, so either it is signalled or it reads the new file anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from lace.store.api import Store, Watch
from lace.store.errors import Gone, StoreError

from . import dns, procs

log = logging.getLogger("lace.lab.dnsfeed")

KINDS = ("Service", "EndpointSlice", "Pod")
PROC_NAME = "dns"


def write_if_changed(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` atomically unless it holds that already; True if written."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def _is_dnsmasq(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "dnsmasq"
    except OSError:
        return False


def _is_dns_server(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"lace.lab.dnsserver" in argv[:3]


def _hup(directory: Path, glob: str, check) -> list[int]:
    signalled = []
    for pid_file in sorted(directory.glob(glob)):
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid <= 0 or not check(pid):
            continue
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            continue
        signalled.append(pid)
    return signalled


def reload_servers(directory: Path) -> list[int]:
    """SIGHUP every running dnsmasq with a pid file in ``directory`` (it re-reads the hosts file);
    returns their pids.

    A pid file left by a dnsmasq that is gone (or whose pid now belongs to another program) is
    skipped: the pid is signalled only while /proc says it is a dnsmasq."""
    return _hup(directory, dns.PID_GLOB, _is_dnsmasq)


def reload_srv(directory: Path) -> list[int]:
    """SIGHUP every DNS pod's server (``lace.lab.dnsserver``) with a pid file in ``directory`` (it
    serves the SRV file anew); returns their pids. Stale pid files are skipped as in
    ``reload_servers``."""
    return _hup(directory, dns.SERVER_PID_GLOB, _is_dns_server)


class Feeder:
    """Writes the records file from the store and reloads the servers (see the module docstring)."""

    def __init__(self, store: Store, directory: str | os.PathLike[str], domain: str = dns.CLUSTER_DOMAIN) -> None:
        self.store = store
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hosts = self.dir / dns.HOSTS_FILE
        self.srv = self.dir / dns.SRV_FILE
        self.domain = domain
        self.stopping = threading.Event()
        self._watch: Watch | None = None

    def sync(self) -> int:
        """List, write the records if they changed (then reload the servers); returns the
        revision to watch from."""
        lists = {kind: self.store.list(kind) for kind in KINDS}
        recs = dns.records(lists["Service"].items, lists["EndpointSlice"].items, lists["Pod"].items,
                           domain=self.domain)
        srvs = dns.srv_records(lists["Service"].items, lists["EndpointSlice"].items, domain=self.domain)
        if write_if_changed(self.hosts, dns.hosts_text(recs)):
            pids = reload_servers(self.dir)
            log.info("%d records written to %s; reloaded dnsmasq %s", len(recs), self.hosts,
                     ", ".join(map(str, pids)) or "(none running)")
        if write_if_changed(self.srv, dns.srv_text(srvs)):
            pids = reload_srv(self.dir)
            log.info("%d SRV records written to %s; reloaded DNS servers %s", len(srvs), self.srv,
                     ", ".join(map(str, pids)) or "(none running)")
        return min(int(r.resource_version) for r in lists.values())

    def run(self) -> None:
        """Until ``stop``: sync, wait for a change, sync again."""
        while not self.stopping.is_set():
            try:
                since = self.sync()
                with self.store.watch(list(KINDS), since=since) as w:
                    self._watch = w
                    if self.stopping.is_set():
                        break
                    next(w, None)   # any change: list again
            except Gone:
                continue
            except StoreError as err:
                log.warning("store: %s", err)
                self.stopping.wait(0.5)

    def stop(self) -> None:
        """End ``run`` (safe from a signal handler)."""
        self.stopping.set()
        if self._watch is not None:
            self._watch.stop()


def start(state_dir: str) -> int:
    """Start the lab's DNS feeder; returns the pid."""
    argv = [sys.executable, "-m", "lace.lab.dnsfeed", "--state-dir", state_dir]
    return procs.spawn(argv, netns=None, name=PROC_NAME, state_dir=state_dir,
                       log_path=os.path.join(state_dir, "logs", f"{PROC_NAME}.log"))


def pid(state_dir: str) -> int | None:
    """The running feeder's pid, or None."""
    p = next((p for p in procs.list_procs(state_dir) if p.name == PROC_NAME), None)
    return p.pid if p is not None and p.alive else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-lab-dnsfeed", description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", required=True, help="the lab's state dir (its store and dns/)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from lace.store.config import lab_store, open_store
    try:
        store = open_store(lab_store(args.state_dir))
    except StoreError as err:
        print(f"error: {err}" + (f"\nhint: {err.hint}" if err.hint else ""), file=sys.stderr)
        return 1
    feeder = Feeder(store, os.path.join(args.state_dir, dns.DNS_DIR))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: feeder.stop())
    try:
        feeder.run()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
