"""The lab's kubelet and scheduler: what turns a stored Pod into a running pod on a lab node.

For every Pod: pick a node when it has none (fewest pods first), create its network namespace,
call lace's CNI plugin exactly as a container runtime would (``CNI_*`` environment, the network
configuration on stdin, the result on stdout) from inside the node's namespace, write the pod's
resolv.conf, start what the pod runs and report the pod Running with its addresses. A Pod deleted
gracefully (``metadata.deletionTimestamp`` set by the store) is stopped — its processes get SIGTERM
and, after its grace period, SIGKILL — then gets CNI DEL, loses its namespace and files, and the
kubelet removes the Pod object (grace period 0). A Pod removed at once is stopped the same way
afterwards. Sandboxes are recorded on disk, so a restarted kubelet adopts what is running.

The lab has no image registry: the first container's ``image`` names what a pod runs, in the pod's
network namespace and with the pod's resolv.conf over /etc/resolv.conf (a mount namespace of its
own, see ``mountns``):

- ``lace/dnsmasq``: dnsmasq as the cluster DNS server (``lace.lab.dns.dnsmasq_argv``: port 53 on
  the pod's addresses, the records in ``<state>/dns/hosts``, nothing of the machine's), followed by
  the container's ``args``; ready once its pid file exists (it writes it after binding).
- any other image (``lace/podserver`` by convention): ``lace.lab.podserver``, HTTP answering with the
  pod's name on each TCP containerPort and UDP echo on each UDP port; a pod without ports runs
  nothing.

A pod's resolv.conf (``<state>/kubelet/<uid>.resolv.conf``) is ``lace.lab.dns.resolv_conf``:
the cluster DNS VIPs, the namespace's search path and ``ndots:5`` when the pod's network can reach
``kube-system/kube-dns`` (it is ``default`` or imports it), no nameserver otherwise. It is decided
when the pod starts, as a kubelet does; ``lace lab exec`` runs commands with it too.

``python -m lace.lab.kubelet --lab NAME --state-dir DIR`` runs it (``lace lab up`` does).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from lace import netlink
from lace.cni.spec import CNI_VERSION
from lace.store import STORE_FILE
from lace.store.errors import Conflict, Gone, NotFound, StoreError
from lace.store.kinds import pod_network
from lace.store import SqliteStore

from . import dns, procs
from .files import write_json

log = logging.getLogger("lace.lab.kubelet")



def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sandbox_netns(lab: str, uid: str) -> str:
    return f"lace-{lab}-p-{hashlib.sha256(uid.encode()).hexdigest()[:10]}"


def pod_image(pod: dict) -> str:
    """The image of the pod's first container ("" without one): what the lab runs for it."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return containers[0].get("image") or ""


def pod_args(pod: dict) -> list[str]:
    """The first container's ``args``."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return [str(a) for a in containers[0].get("args") or ()]


def pod_ports(pod: dict) -> tuple[list[int], list[int]]:
    tcp, udp = [], []
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            port = int(p["containerPort"])
            (udp if (p.get("protocol") or "TCP").upper() == "UDP" else tcp).append(port)
    return sorted(set(tcp)), sorted(set(udp))


class Sandboxes:
    """The on-disk record of pod sandboxes: ``<state>/pods/<uid>.json``."""

    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir) / "pods"
        self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, uid: str) -> dict | None:
        try:
            return json.loads((self.dir / f"{uid}.json").read_text())
        except FileNotFoundError:
            return None

    def put(self, rec: dict) -> None:
        write_json(self.dir / f"{rec['uid']}.json", rec)

    def remove(self, uid: str) -> None:
        try:
            (self.dir / f"{uid}.json").unlink()
        except FileNotFoundError:
            pass

    def all(self) -> list[dict]:
        out = []
        for p in self.dir.glob("*.json"):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def find(self, namespace: str, name: str) -> dict | None:
        return next((r for r in self.all() if r["namespace"] == namespace and r["name"] == name), None)


class Kubelet:
    def __init__(self, lab: str, state_dir: str) -> None:
        self.lab = lab
        self.state_dir = state_dir
        desc = json.loads((Path(state_dir) / "lab.json").read_text())
        self.nodes = {n["name"]: n for n in desc["nodes"]}
        # a short poll: a new pod is picked up within a few ms of its apply
        self.store = SqliteStore(Path(state_dir) / STORE_FILE, poll_interval=0.005)
        self.sandboxes = Sandboxes(os.path.join(state_dir, "kubelet"))
        self.dns_dir = os.path.join(state_dir, dns.DNS_DIR)
        os.makedirs(self.dns_dir, exist_ok=True)
        self.stopping = threading.Event()
        self.cni_bin = Path(sys.executable).parent
        #: uid -> (failures, monotonic time of the next attempt): failed pods retry with backoff
        self.backoff: dict[str, tuple[int, float]] = {}
        # pods start and stop in parallel (one slow pod must not hold up the others), but the
        # operations of one pod run one at a time, in order
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pod")
        self._pod_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # -- scheduling --------------------------------------------------------------------------

    def schedule(self, pod: dict) -> dict | None:
        """Bind an unscheduled pod to the lab node with the fewest pods."""
        counts = {n: 0 for n in self.nodes}
        for p in self.store.list("pods").items:
            n = (p.get("spec") or {}).get("nodeName")
            if n in counts:
                counts[n] += 1
        node = min(sorted(counts), key=lambda n: counts[n])
        pod = dict(pod)
        pod["spec"] = dict(pod.get("spec") or {}, nodeName=node)
        try:
            return self.store.update(pod)
        except (Conflict, NotFound):
            return None   # changed or gone meanwhile: the next event brings it back

    # -- pod lifecycle -----------------------------------------------------------------------

    def _cni(self, command: str, node: str, rec: dict) -> dict | None:
        conf = {"cniVersion": CNI_VERSION, "name": "lace", "type": "lace-cni",
                "agentSocket": os.path.join(self.state_dir, "agents", f"{node}.sock")}
        env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=rec["container_id"],
                   CNI_NETNS=netlink.netns.path(rec["netns"]), CNI_IFNAME="eth0",
                   CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={rec['namespace']};K8S_POD_NAME={rec['name']}",
                   CNI_PATH=str(self.cni_bin))
        # the plugin runs on the node: this (pool) thread enters the node's namespace and the child
        # inherits it — no preexec hook, so the spawn stays a cheap vfork
        with netlink.netns.entered(self.nodes[node]["netns"]):
            res = subprocess.run([str(self.cni_bin / conf["type"])], input=json.dumps(conf), env=env,
                                 capture_output=True, text=True, timeout=120)
        out = json.loads(res.stdout) if res.stdout.strip() else None
        if res.returncode != 0:
            msg = (out or {}).get("msg") or res.stderr.strip() or f"exit {res.returncode}"
            raise RuntimeError(f"CNI {command} failed: {msg}" + (f" ({out.get('details')})" if out and out.get("details") else ""))
        return out

    def start_pod(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid, node = meta["uid"], spec["nodeName"]
        if node not in self.nodes:
            return
        rec = self.sandboxes.get(uid)
        if rec is not None and rec.get("ready"):
            return
        fails, next_try = self.backoff.get(uid, (0, 0.0))
        if time.monotonic() < next_try:
            return
        rec = {"uid": uid, "namespace": meta["namespace"], "name": meta["name"], "node": node,
               "netns": sandbox_netns(self.lab, uid), "container_id": uid, "ready": False,
               "proc": f"pod-{uid[:13]}"}
        self.sandboxes.put(rec)
        t0 = time.monotonic()
        netlink.netns.create(rec["netns"])
        t_ns = time.monotonic()
        try:
            result = self._cni("ADD", node, rec)
        except Exception as e:
            log.warning("pod %s/%s: %s", rec["namespace"], rec["name"], e)
            self.backoff[uid] = (fails + 1, time.monotonic() + min(0.2 * 2 ** fails, 10.0))
            self._fail(pod, str(e))
            return
        ips = [ip["address"].split("/")[0] for ip in (result or {}).get("ips", [])]
        rec.update(ips=ips, resolv_conf=self.write_resolv_conf(pod, rec, ips))
        self.sandboxes.put(rec)
        t_cni = time.monotonic()
        problem = self.run_containers(pod, rec, ips)
        if problem is not None:
            log.warning("pod %s/%s: %s", rec["namespace"], rec["name"], problem)
            self.backoff[uid] = (fails + 1, time.monotonic() + min(0.2 * 2 ** fails, 10.0))
            self._fail(pod, problem, reason="RunContainerError")
            return
        self.backoff.pop(uid, None)
        t_run = time.monotonic()
        rec.update(ready=True)
        self.sandboxes.put(rec)
        # status.network (a lace extension): the network the pod is attached to, so that
        # `lace get pods -o json` shows it for pods that rely on the default
        status = {"phase": "Running", "hostIP": self.nodes[node]["underlay_addr"], "startTime": _now(),
                  "network": pod_network(pod),
                  "podIP": ips[0] if ips else None, "podIPs": [{"ip": ip} for ip in ips],
                  "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}]}
        try:
            self.store.update_status("pods", meta["name"], meta["namespace"], status)
        except NotFound:
            self.stop_pod(rec)
            return
        log.info("pod %s/%s running on %s: netns %.0f ms, CNI ADD %.0f ms, servers %.0f ms, status %.0f ms",
                 rec["namespace"], rec["name"], node, (t_ns - t0) * 1000, (t_cni - t_ns) * 1000,
                 (t_run - t_cni) * 1000, (time.monotonic() - t_run) * 1000)

    def write_resolv_conf(self, pod: dict, rec: dict, ips: list[str]) -> str:
        """Write the pod's resolv.conf (see the module docstring); returns its path."""
        try:
            network = self.store.get("Network", pod_network(pod))
        except NotFound:
            network = None
        path = os.path.join(self.state_dir, "kubelet", f"{rec['uid']}.resolv.conf")
        text = dns.resolv_conf(rec["namespace"], ips, reachable=dns.reaches_cluster_dns(network))
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return path

    def run_containers(self, pod: dict, rec: dict, ips: list[str]) -> str | None:
        """Start what the pod's image names (see the module docstring) and wait until it is ready;
        returns what went wrong, or None."""
        what = "dnsmasq" if pod_image(pod) == dns.DNSMASQ_IMAGE else "podserver"
        if what == "dnsmasq":
            ready = os.path.join(self.dns_dir, dns.pid_file_name(rec["uid"]))
            # Debian installs it in /usr/sbin, which a caller's PATH may lack
            binary = shutil.which("dnsmasq", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
            if binary is None:
                return "dnsmasq is not installed (`make install` installs dnsmasq-base)"
            argv = dns.dnsmasq_argv(ips, os.path.join(self.dns_dir, dns.HOSTS_FILE), ready, pod_args(pod), binary)
        else:
            tcp, udp = pod_ports(pod)
            if not tcp and not udp:   # a pod without ports has nothing to serve
                return None
            ready = os.path.join(self.state_dir, "kubelet", f"{rec['uid']}.ready")
            argv = [sys.executable, "-m", "lace.lab.podserver", "--name", f"{rec['namespace']}/{rec['name']}",
                    "--ready-file", ready]
            for p in tcp:
                argv += ["--tcp", str(p)]
            for p in udp:
                argv += ["--udp", str(p)]
        log_path = os.path.join(self.state_dir, "logs", f"{rec['proc']}.log")
        try:
            pid = procs.spawn(argv, netns=rec["netns"], name=rec["proc"], state_dir=self.state_dir,
                              log_path=log_path, resolv_conf=rec["resolv_conf"])
        except procs.ProcError as e:
            return str(e)
        deadline = time.monotonic() + 10
        while not os.path.exists(ready):
            if not procs.alive(pid):
                tail = ""
                try:
                    tail = Path(log_path).read_text()[-400:].strip()
                except OSError:
                    pass
                return f"{what} exited at start; log {log_path}: {tail}"
            if time.monotonic() > deadline:
                return f"{what} not ready after 10 s; log {log_path}"
            time.sleep(0.002)
        return None

    def _fail(self, pod: dict, message: str, reason: str = "NetworkSetupFailed") -> None:
        meta = pod["metadata"]
        try:
            self.store.update_status("pods", meta["name"], meta["namespace"], {
                "phase": "Pending", "conditions": [{"type": "Ready", "status": "False",
                                                    "reason": reason, "message": message}]})
        except NotFound:
            pass
        rec = self.sandboxes.get(meta["uid"])
        if rec:
            self.stop_pod(rec)

    def stop_pod(self, rec: dict, grace: float = 2) -> None:
        procs.stop(rec["proc"], self.state_dir, timeout=grace)
        try:
            self._cni("DEL", rec["node"], rec)
        except Exception as e:
            log.warning("pod %s/%s: %s", rec["namespace"], rec["name"], e)
        netlink.netns.delete(rec["netns"])
        for path in (os.path.join(self.state_dir, "kubelet", rec["uid"] + ".ready"),
                     os.path.join(self.state_dir, "kubelet", rec["uid"] + ".resolv.conf"),
                     os.path.join(self.dns_dir, dns.pid_file_name(rec["uid"]))):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.sandboxes.remove(rec["uid"])

    # -- the loop ----------------------------------------------------------------------------

    def _serial(self, uid: str, fn, *args) -> None:
        with self._locks_guard:
            lock = self._pod_locks.setdefault(uid, threading.Lock())

        def work() -> None:
            with lock:
                try:
                    fn(*args)
                except Exception:
                    log.exception("pod %s", uid)
        self.pool.submit(work)

    def sync(self, pods: list[dict]) -> None:
        """Level-triggered: make sandboxes match the stored pods."""
        live = {p["metadata"]["uid"]: p for p in pods}
        for rec in self.sandboxes.all():
            if rec["uid"] not in live:
                self._serial(rec["uid"], self.stop_pod, rec)
        for pod in pods:
            self.handle(pod)

    def finish_pod(self, pod: dict) -> None:
        """A gracefully deleted pod: stop what runs, then remove the Pod object (unless it was
        replaced meanwhile by another of the same name)."""
        meta = pod["metadata"]
        rec = self.sandboxes.get(meta["uid"])
        if rec is not None:
            self.stop_pod(rec, grace=max(0.1, float(meta.get("deletionGracePeriodSeconds") or 0)))
        try:
            self.store.delete("pods", meta["name"], meta["namespace"], grace_period=0, uid=meta["uid"])
        except (NotFound, Conflict):
            pass
        log.info("pod %s/%s stopped and deleted", meta["namespace"], meta["name"])

    def handle(self, pod: dict) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            self._serial(pod["metadata"]["uid"], self.finish_pod, pod)
            return
        spec = pod.get("spec") or {}
        if not spec.get("nodeName"):
            bound = self.schedule(pod)
            if bound is None:
                return
            pod = bound
        self._serial(pod["metadata"]["uid"], self.start_pod, pod)

    def remove(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]

        def stop() -> None:
            rec = self.sandboxes.get(uid)
            if rec:
                self.stop_pod(rec)
        self._serial(uid, stop)

    def run(self) -> None:
        while not self.stopping.is_set():
            lst = self.store.list("pods")
            self.sync(lst.items)
            try:
                # short watches: a relist every few seconds retries pods that failed
                with self.store.watch(["pods"], since=lst.resource_version, timeout=2) as w:
                    for ev in w:
                        if ev.type == "DELETED":
                            self.remove(ev.object)
                        else:
                            self.handle(ev.object)
                        if self.stopping.is_set():
                            break
            except Gone:
                continue
            except StoreError as e:
                log.warning("watch: %s", e)
                time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-lab-kubelet")
    ap.add_argument("--lab", required=True)
    ap.add_argument("--state-dir", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import signal
    k = Kubelet(args.lab, args.state_dir)
    signal.signal(signal.SIGTERM, lambda *_: (k.stopping.set(), sys.exit(0)))
    k.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
