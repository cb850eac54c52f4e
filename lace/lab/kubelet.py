"""The lab's kubelet and scheduler: what turns a stored Pod into a running pod on a lab node.

For every Pod: pick a node when it has none (fewest pods first), create its network namespace,
call lace's CNI plugin exactly as a container runtime would (``CNI_*`` environment, the network
configuration on stdin, the result on stdout) from inside the node's namespace, write the pod's
resolv.conf, start what the pod runs and report the pod Running with its addresses, then run its
probes (below). Sandboxes are recorded on disk, so a restarted kubelet adopts what is running.

A Pod deleted gracefully (``metadata.deletionTimestamp`` set by the store) is stopped in
Kubernetes' order, by a thread of its own (a grace period holds up no other pod):

1. its grace period is ``metadata.deletionGracePeriodSeconds`` (the delete's ``--grace-period``,
   else ``spec.terminationGracePeriodSeconds``, else 30; at least 1 s, ``deletion_grace``); a later
   delete may shorten it;
2. every container's ``lifecycle.preStop`` hook runs, all at once, for at most the grace period:
   ``exec`` runs its command in the pod's namespaces as an exec probe does, ``sleep`` waits
   ``seconds``, ``httpGet`` is sent from the node's prober as an httpGet probe is (tcpSocket, which
   no kubelet runs, is logged as failed); a failed hook is logged and changes nothing else;
3. SIGTERM, and SIGKILL when the processes have not exited by the end of what the hooks left of
   the period, in whole seconds as the kubelet counts, but never less than 2 s (``GraceClock``);
4. only once the processes are gone: the pod's status says so (phase Succeeded, or Failed when
   SIGKILL was needed; not Ready; every container terminated), it gets CNI DEL, loses its
   namespace and files, and the kubelet removes the Pod object (grace period 0).

Meanwhile the pod is still Running and its status still reported: liveness and startup probes
stop (nothing restarts a pod on its way out), its readiness probes go on as the kubelet's do, so
its Ready condition stays what they say (True without one) until the processes are gone — and
with it its EndpointSlice endpoints' ``serving`` (``ready`` is false from the deletion on, as
``terminating`` is true). A DEL that fails (its agent down, the store unavailable) is called again
at each relist, and until one succeeds the namespace, the sandbox record and the Pod (Terminating)
stay, as a runtime retries tearing a sandbox's network down. A Pod removed at once (``--force``,
or gone while the kubelet was away) is stopped afterwards the same way with 1 s of grace. The
processes restarted after a failed liveness probe are stopped the same way too (hooks, SIGTERM,
SIGKILL), with the probe's or the pod's grace period.

The lab has no image registry: the first container's ``image`` names what a pod runs, in the pod's
network namespace and with the pod's resolv.conf over /etc/resolv.conf (a mount namespace of its
own, see ``mountns``):

- ``lace/dnsmasq``: the cluster DNS server, ``lace.lab.dnsserver`` (``lace.lab.dns.dnsmasq_argv``):
  a dnsmasq on port 53 of the pod's addresses with the records of ``<state>/dns/hosts``, and one
  for the SRV records of ``<state>/dns/srv.conf`` behind it, nothing of the machine's; followed by
  the container's ``args``; ready once its pid file exists (written after binding).
- any other image (``lace/podserver`` by convention): ``lace.lab.podserver``, HTTP answering with the
  pod's name on each TCP containerPort and UDP echo on each UDP port, followed by the container's
  ``args`` (e.g. ``--startup-delay 5``; its ``/healthz``, ``/fail`` and ``/recover`` make probes
  fail on purpose; ``--delay-shutdown 10`` keeps it serving for 10 s after SIGTERM, as agnhost's
  netexec, with ``/readyz`` failing meanwhile); a pod without ports runs nothing.

The pod's addresses come from the CNI result: ``status.podIPs`` (and ``podIP``, the first) are the
addresses on the interface with a ``sandbox`` (the pod's eth0); addresses on the agent's host
device (``lace_host``, no sandbox) are the pod's probe addresses, reported as ``status.probeIPs``
(a lace extension, like ``status.network``; ``split_cni_ips``).

Probes (``startupProbe``, ``livenessProbe``, ``readinessProbe`` of each container) run with
Kubernetes' semantics (``lace.lab.probing``). Network probes (httpGet, tcpSocket) leave from the
node's host namespace and the node's kubelet cgroup (``<node cgroup>/kubelet``, the only cgroup the
datapath lets into pods of isolated networks): the kubelet cannot be in every node's cgroup, so it
starts one prober process per node there (``lace.lab.prober``, procs name ``prober-<node>``, on
first use; started again if it dies; stopped with the kubelet) and sends it each probe over a unix
socket pair. A probe connects to its ``host`` if it names one, else to the pod's probe address of
the family of its pod IP when the pod belongs to another network than ``default``, else to its pod
IP. Exec probes run the command in the pod's network namespace with the pod's resolv.conf, as the
pod's processes run. grpc probes are accepted but not run by the lab (their runs are discarded, so
such a readiness probe never passes); so are runs that cannot be made (a named port the container
does not have), as a kubelet discards probe errors.

Readiness makes the pod's ``Ready`` and ``ContainersReady`` conditions (lastTransitionTime when they
change); a pod without readiness probes is Ready once started. A failed liveness probe (or a startup
probe failed past its threshold) restarts the pod's processes — all of them: the lab runs one
process for all of a pod's containers — without a new sandbox or CNI call: stopped (preStop hooks,
SIGTERM, the probe's or pod's termination grace period, then SIGKILL) and started again as at first, and every
container's ``restartCount`` goes up by one (``containerStatuses``: name, image, ready, started,
restartCount, state, lastState). Restarts are not delayed further (no CrashLoopBackOff): a pod that
keeps failing restarts every failureThreshold x periodSeconds. Once a pod is deleted only its
readiness probes run (see above). A restarted kubelet
continues from the stored status: restart counts, start times, readiness and the conditions'
transition times. Every probe run is counted per node (``lace.lab.probing.ProbeStats``: run,
success, failure, unknown) in ``<state>/kubelet/probe-stats.json``, written at most once a second
and only when a count changed.

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
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple

from lace import netlink
from lace import probes as P
from lace.cni.spec import CNI_VERSION
from lace.store.config import lab_store, open_store
from lace.store.errors import Conflict, Gone, NotFound, StoreError
from lace.store.kinds import DEFAULT_NETWORK, pod_network

from . import dns, probing, procs
from .files import write_json
from .topology import kubelet_cgroup

log = logging.getLogger("lace.lab.kubelet")



_TIME = "%Y-%m-%dT%H:%M:%SZ"
#: the status fields written when a pod starts (the probes add conditions and containerStatuses)
BASE_STATUS = ("phase", "hostIP", "startTime", "network", "podIP", "podIPs", "probeIPs")
#: Kubernetes' default terminationGracePeriodSeconds
DEFAULT_GRACE = 30
#: the least time between SIGTERM and SIGKILL, whatever the preStop hooks took (the kubelet's
#: minimumGracePeriodInSeconds)
MIN_STOP_WINDOW = 2
#: how often a wait for a pod's processes to exit looks again
_EXIT_POLL = 0.02


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime(_TIME)


def _age(stamp: str | None) -> float:
    """Seconds since an RFC 3339 time as the kubelet writes them (0 when unreadable)."""
    try:
        then = dt.datetime.strptime(str(stamp), _TIME).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return 0.0
    return max(0.0, (dt.datetime.now(dt.timezone.utc) - then).total_seconds())


def split_cni_ips(result: dict | None) -> tuple[list[str], list[str]]:
    """(pod IPs, probe IPs) of a CNI result: the addresses of the interface with a ``sandbox`` (or
    of no interface) are the pod's; those of ``lace_host`` (``lace.probes.PROBE_INTERFACE``, no
    sandbox) are its probe addresses; addresses of other interfaces are neither."""
    interfaces = (result or {}).get("interfaces") or []
    pod, probe = [], []
    for entry in (result or {}).get("ips") or []:
        address = str(entry.get("address") or "").split("/")[0]
        if not address:
            continue
        idx = entry.get("interface")
        iface = interfaces[idx] if isinstance(idx, int) and 0 <= idx < len(interfaces) else None
        if iface is None or iface.get("sandbox"):
            pod.append(address)
        elif iface.get("name") == P.PROBE_INTERFACE:
            probe.append(address)
    return pod, probe


def deletion_grace(pod: dict | None) -> int:
    """The seconds a deleted pod is given, as the kubelet reckons them: the delete's
    ``metadata.deletionGracePeriodSeconds`` (the store sets it from the request, else from the
    spec), else ``spec.terminationGracePeriodSeconds``, else 30; at least 1, as the kubelet never
    stops a pod with less (a pod removed at once, ``--force``, gets 1)."""
    meta, spec = (pod or {}).get("metadata") or {}, (pod or {}).get("spec") or {}
    for value in (meta.get("deletionGracePeriodSeconds"), spec.get("terminationGracePeriodSeconds")):
        if isinstance(value, int) and not isinstance(value, bool):
            return max(1, value)
    return DEFAULT_GRACE if pod is not None else 1


class GraceClock:
    """A stopping pod's grace period as the kubelet spends it (plain state; the caller passes the
    clock, monotonic seconds).

    The preStop hooks run first, for at most the whole period (``hooks_until``); what they took,
    in whole seconds as the kubelet counts, comes off it, and ``signal`` (SIGTERM) returns when
    SIGKILL follows: after what is left, but never sooner than ``MIN_STOP_WINDOW`` seconds, so a
    hook that used up the period still leaves the processes 2 s to exit. A later delete may
    shorten the period, never lengthen it: from then on at most the new period remains."""

    def __init__(self, seconds: int, now: float) -> None:
        self.seconds = max(1, int(seconds))
        self.started = now
        self.hooks_until = now + self.seconds
        self.sigterm_at: float | None = None
        self.kill_at: float | None = None

    def signal(self, now: float) -> float:
        """The hooks are done (or there were none): SIGTERM goes now; returns when SIGKILL follows."""
        self.sigterm_at = now
        left = self.seconds - int(now - self.started)
        self.kill_at = now + max(MIN_STOP_WINDOW, left)
        return self.kill_at

    def shorten(self, seconds: int, now: float) -> bool:
        """A later delete asks for ``seconds``; True when that shortened the period."""
        seconds = max(1, int(seconds))
        if seconds >= self.seconds:
            return False
        self.seconds = seconds
        self.hooks_until = min(self.hooks_until, now + seconds)
        if self.kill_at is not None:
            self.kill_at = min(self.kill_at, now + max(MIN_STOP_WINDOW, seconds))
        return True


def pre_stop_hooks(pod: dict | None) -> list[tuple[dict, dict]]:
    """(container, its ``lifecycle.preStop``) of every container that has one."""
    out = []
    for c in ((pod or {}).get("spec") or {}).get("containers") or ():
        hook = (c.get("lifecycle") or {}).get("preStop")
        if isinstance(hook, dict) and hook:
            out.append((c, hook))
    return out


class Stopping:
    """One pod's processes being stopped: its grace clock and what a wait on it watches. A
    shortened period (a later delete, a force delete) wakes every wait at once."""

    def __init__(self, uid: str, rec: dict, pod: dict | None, grace: int, why: str = "deleted") -> None:
        self.uid, self.rec, self.pod, self.why = uid, rec, pod, why
        self.clock = GraceClock(grace, time.monotonic())
        self.cond = threading.Condition()
        #: SIGKILL was needed (the processes outlived the period)
        self.killed = False

    def shorten(self, seconds: int) -> None:
        with self.cond:
            if self.clock.shorten(seconds, time.monotonic()):
                self.cond.notify_all()

    def wait(self, deadline: str, done: Callable[[], bool]) -> bool:
        """Wait until ``done()`` or the clock's ``deadline`` (an attribute name: a shortened period
        moves it while we wait); True when ``done()``."""
        with self.cond:
            while not done():
                left = (getattr(self.clock, deadline) or 0.0) - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, _EXIT_POLL))
            return True


class ProbeContext(NamedTuple):
    """What running a pod's probes needs beyond the probe: where the pod is and its addresses."""

    node: str
    netns: str
    resolv_conf: str | None
    pod_ips: tuple[str, ...]
    probe_ips: tuple[str, ...]
    isolated: bool


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
        # on the embedded store a commit wakes the watch at once (inotify on its write-ahead log);
        # the poll interval is only the fallback where inotify cannot, kept short so that a new
        # pod is still picked up within a few ms of its apply
        self.store = open_store(lab_store(state_dir), poll_interval=0.005)
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
        # status writes after probe results have threads of their own, so that a burst of pod
        # starts does not hold up readiness (they still take the pod's lock)
        self.status_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="status")
        self._pod_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # probes: the scheduler, one prober process per node (on first use), exec probes in threads
        self.prober = probing.Prober(self._dispatch, self._probe_changed, self._probe_restart)
        self.prober_clients: dict[str, probing.ProberClient] = {}
        self._clients_guard = threading.Lock()
        self.exec_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="exec-probe")
        self._probe_ctx: dict[str, ProbeContext] = {}
        #: what the probes did, per node (written by a thread run() starts)
        self.stats = probing.ProbeStats(os.path.join(state_dir, probing.PROBE_STATS_FILE))
        #: uid -> the status last written, so that unchanged statuses are not written again
        self._written: dict[str, dict] = {}
        self._warned: set[tuple[str, str, str]] = set()
        #: uid -> the pod whose processes are being stopped (a thread each: a grace period must not
        #: hold up other pods, nor the pod's own status writes, which readiness still makes)
        self._stopping: dict[str, Stopping] = {}
        self._stopping_guard = threading.Lock()

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
            if not self.prober.has(uid):
                self.adopt(pod, rec)   # running before this kubelet started
            elif uid not in self._written:
                # set up, but its status write met an unavailable store (an etcd election): the
                # pod would stay without a status, as nothing else writes it unless a probe
                # changes; every relist tries again until one goes through
                self.write_status(uid, rec)
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
        ips, probe_ips = split_cni_ips(result)
        rec.update(ips=ips, probe_ips=probe_ips, resolv_conf=self.write_resolv_conf(pod, rec, ips))
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
        # status.network (a lace extension): the network the pod is attached to, so that
        # `lace get pods -o json` shows it for pods that rely on the default
        status = {"phase": "Running", "hostIP": self.nodes[node]["underlay_addr"], "startTime": _now(),
                  "network": pod_network(pod),
                  "podIP": ips[0] if ips else None, "podIPs": [{"ip": ip} for ip in ips]}
        if probe_ips:
            status["probeIPs"] = [{"ip": ip} for ip in probe_ips]
        rec.update(ready=True, status=status)
        self.sandboxes.put(rec)
        self._probe_ctx[uid] = self._context(pod, rec)
        if not self.prober.add(probing.PodProbes.of(pod, time.monotonic(), status["startTime"])):
            return   # deleted meanwhile: terminate follows
        if not self.write_status(uid):
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
            argv += pod_args(pod)
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

    def stop_pod(self, rec: dict, grace: float = 2) -> bool:
        """Stop the pod's processes and tear its sandbox down (CNI DEL, namespace, files, record).
        False when the DEL failed (the agent down, the store unavailable): the namespace and the
        record stay, and the next relist calls DEL again, as a runtime retries StopPodSandbox until
        its network is torn down — dropping the record would orphan the pod's leases and veth."""
        self.prober.remove(rec["uid"])
        self._probe_ctx.pop(rec["uid"], None)
        self._written.pop(rec["uid"], None)
        procs.stop(rec["proc"], self.state_dir, timeout=grace)
        try:
            self._cni("DEL", rec["node"], rec)
        except Exception as e:
            log.warning("pod %s/%s: %s; the DEL is tried again at the next relist", rec["namespace"], rec["name"], e)
            return False
        netlink.netns.delete(rec["netns"])
        self._remove_run_files(rec)
        try:
            os.unlink(os.path.join(self.state_dir, "kubelet", rec["uid"] + ".resolv.conf"))
        except FileNotFoundError:
            pass
        self.sandboxes.remove(rec["uid"])
        return True

    def _remove_run_files(self, rec: dict) -> None:
        """What a run of the pod's processes leaves (its ready file, dnsmasq's pid file)."""
        for path in (os.path.join(self.state_dir, "kubelet", rec["uid"] + ".ready"),
                     os.path.join(self.dns_dir, dns.pid_file_name(rec["uid"]))):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- stopping ----------------------------------------------------------------------------

    def terminate(self, pod: dict) -> None:
        """A pod marked deleted (the pod's serial lock held): start stopping it (``finish``, a thread
        of its own), or shorten its grace period when a later delete asked for less."""
        uid = pod["metadata"]["uid"]
        grace = deletion_grace(pod)
        with self._stopping_guard:
            st = self._stopping.get(uid)
        if st is not None:
            st.shorten(grace)
            return
        rec = self.sandboxes.get(uid)
        if rec is None:   # nothing of it runs here (never started, or torn down): it goes at once
            self._delete_pod(pod)
            return
        if rec.get("ready") and not self.prober.has(uid):
            self.adopt(pod, rec)   # running before this kubelet started: its readiness is still reported
        self.write_status(uid, rec)
        log.info("pod %s/%s: deleted, grace period %d s", rec["namespace"], rec["name"], grace)
        self._start_stopping(Stopping(uid, rec, pod, grace))

    def stop_removed(self, uid: str, pod: dict | None) -> None:
        """A pod no longer stored (removed at once, or gone while this kubelet was away; the pod's
        serial lock held): stopped as the kubelet stops a force-deleted pod, with 1 s of grace
        (``pod``: the removed object, for its preStop hooks, when known)."""
        with self._stopping_guard:
            st = self._stopping.get(uid)
        if st is not None:
            st.shorten(1)
            return
        rec = self.sandboxes.get(uid)
        if rec is not None:
            self._start_stopping(Stopping(uid, rec, pod, 1, why="removed"))

    def _start_stopping(self, st: Stopping) -> None:
        with self._stopping_guard:
            self._stopping[st.uid] = st
        threading.Thread(target=self.finish, args=(st,), name=f"stop-{st.rec['name']}"[:15], daemon=True).start()

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._pod_locks.setdefault(uid, threading.Lock())

    def finish(self, st: Stopping) -> None:
        """Stop the pod's processes (hooks, SIGTERM, SIGKILL: ``stop_processes``), and only once they
        are gone report it terminated, tear its sandbox down and remove the Pod object. A DEL that
        fails leaves the Pod (Terminating) and the sandbox for the next relist, which comes here again
        and finds nothing left to stop."""
        try:
            self.stop_processes(st)
            with self._lock(st.uid):
                last = self.pod_status(st.uid, st.rec)
                self.prober.remove(st.uid, deleted=True)
                if st.why == "deleted" and st.rec.get("ready") and not st.rec.get("terminated"):
                    self._write_terminated(st, last)
                if not self.stop_pod(st.rec, grace=0.1):
                    return
                if st.why == "deleted":
                    assert st.pod is not None
                    self._delete_pod(st.pod)
        except Exception:
            log.exception("pod %s/%s: stopping", st.rec["namespace"], st.rec["name"])
        finally:
            with self._stopping_guard:
                if self._stopping.get(st.uid) is st:
                    del self._stopping[st.uid]

    def stop_processes(self, st: Stopping) -> None:
        """Stop the pod's processes as the kubelet kills a container: its containers' preStop hooks
        (all at once, for at most the grace period), then SIGTERM, then SIGKILL when they have not
        exited by the end of the period (``GraceClock``); returns once they are gone. Nothing is run
        for processes that already exited."""
        rec, name = st.rec, st.rec["proc"]
        ref = f"{rec['namespace']}/{rec['name']}"
        if not procs.running(name, self.state_dir):
            procs.stop(name, self.state_dir)   # forget a dead one's record
            return
        hooks = pre_stop_hooks(st.pod)
        if hooks:
            threads = [threading.Thread(target=self._run_hook, args=(st, c, hook), daemon=True,
                                        name=f"prestop-{rec['name']}"[:15]) for c, hook in hooks]
            for t in threads:
                t.start()
            if not st.wait("hooks_until", lambda: not any(t.is_alive() for t in threads)):
                log.warning("pod %s: preStop hooks still running at the end of the grace period (%d s)",
                            ref, st.clock.seconds)
        with st.cond:
            kill_at = st.clock.signal(time.monotonic())
        log.info("pod %s (%s): SIGTERM; SIGKILL in %.0f s unless it exits", ref, st.why, kill_at - time.monotonic())
        procs.kill(name, self.state_dir, signal.SIGTERM)
        if not st.wait("kill_at", lambda: not procs.running(name, self.state_dir)):
            st.killed = True
            log.warning("pod %s: still running at the end of its grace period: SIGKILL", ref)
        procs.stop(name, self.state_dir, sig=signal.SIGKILL)

    def _run_hook(self, st: Stopping, container: dict, hook: dict) -> None:
        """One container's preStop hook (a thread of its own; ``stop_processes`` waits for it for at
        most the grace period): exec runs the command in the pod's namespaces as an exec probe does,
        sleep waits, httpGet is sent from the node's prober as a probe is; a failed hook is logged
        and the pod stopped all the same, as the kubelet does."""
        rec = st.rec
        ref, cname = f"{rec['namespace']}/{rec['name']}", container.get("name") or ""
        t0 = time.monotonic()
        timeout = max(0.0, st.clock.hooks_until - t0)
        problem: str | None = None
        kind = next((k for k in ("exec", "httpGet", "sleep", "tcpSocket") if k in hook), "")
        if kind == "exec":
            command = [str(a) for a in (hook["exec"] or {}).get("command") or ()]
            try:
                done = procs.run(command, netns=rec["netns"], resolv_conf=rec.get("resolv_conf"), timeout=timeout)
            except procs.ProcError as exc:
                problem = str(exc)
            else:
                if done.timed_out:
                    problem = f"command {command} did not end within the grace period"
                elif done.returncode != 0:
                    problem = f"command {command} exited with {done.returncode}: {done.output.strip()[:200]}"
        elif kind == "sleep":
            seconds = float((hook["sleep"] or {}).get("seconds") or 0)
            st.wait("hooks_until", lambda: time.monotonic() - t0 >= seconds)
        elif kind == "httpGet":
            problem = self._http_hook(st, container, hook, timeout)
        else:
            problem = f"the kubelet runs exec, httpGet and sleep hooks, not {kind or 'this one'}"
        took = time.monotonic() - t0
        if problem is None:
            log.info("pod %s: preStop %s hook of container %s done in %.1f s", ref, kind, cname, took)
        else:
            log.warning("pod %s: preStop %s hook of container %s failed after %.1f s: %s", ref, kind, cname,
                        took, problem)

    def _http_hook(self, st: Stopping, container: dict, hook: dict, timeout: float) -> str | None:
        """A preStop httpGet, from the node's prober to the pod (as an httpGet probe goes); what went
        wrong, or None."""
        act = P.action(container, hook)
        if act is None or act.port is None:
            return "its port names no TCP containerPort of the container"
        ctx = self._probe_ctx.get(st.uid) or (self._context(st.pod, st.rec) if st.pod else None)
        host = P.connect_host(act, ctx.pod_ips, ctx.probe_ips, ctx.isolated) if ctx else None
        if host is None:
            return "the pod has no address"
        answered = threading.Event()
        outcome: list[tuple[str, str]] = []

        def done(result: str, message: str) -> None:
            outcome.append((result, message))
            answered.set()
        self.prober_client(st.rec["node"]).submit(probing.network_request(act, host, max(0.1, timeout)), done)
        if not answered.wait(timeout + 1):
            return "no answer within the grace period"
        result, message = outcome[0]
        return None if result == probing.SUCCESS else message or result

    def _write_terminated(self, st: Stopping, last: dict | None) -> None:
        """The pod's status once its processes are gone, before its network is: a terminal phase
        (Succeeded, or Failed when SIGKILL was needed), not Ready, each container terminated —
        as the kubelet reports a deleted pod before the API server lets it go. The lab reads no exit
        codes: 0 for processes that exited on their own, 137 for killed ones."""
        rec, now = st.rec, _now()
        status = dict(last or {k: v for k, v in (rec.get("status") or {}).items() if k in BASE_STATUS})
        status["phase"] = "Failed" if st.killed else "Succeeded"
        status["conditions"] = [{"type": kind, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                                for kind in ("ContainersReady", "Ready")]
        code, reason = (137, "Error") if st.killed else (0, "Completed")
        statuses = []
        for cs in status.get("containerStatuses") or ():
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
            statuses.append(dict(cs, ready=False, started=False, state={"terminated": {
                "exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now}}))
        if statuses:
            status["containerStatuses"] = statuses
        try:
            self.store.update_status("pods", rec["name"], rec["namespace"], status)
        except NotFound:
            pass
        except StoreError as exc:   # the store unavailable: the pod goes all the same
            log.warning("pod %s/%s: cannot report it terminated: %s", rec["namespace"], rec["name"], exc)
            return
        # once: a DEL tried again (nothing left to stop, nothing known of how it ended) keeps it
        rec["terminated"] = True
        self.sandboxes.put(rec)

    def _delete_pod(self, pod: dict) -> None:
        """Remove a stopped pod's object (unless another of the same name replaced it meanwhile)."""
        meta = pod["metadata"]
        try:
            self.store.delete("pods", meta["name"], meta["namespace"], grace_period=0, uid=meta["uid"])
        except (NotFound, Conflict):
            pass
        log.info("pod %s/%s stopped and deleted", meta["namespace"], meta["name"])

    # -- probes ------------------------------------------------------------------------------

    def _context(self, pod: dict, rec: dict) -> ProbeContext:
        return ProbeContext(rec["node"], rec["netns"], rec.get("resolv_conf"), tuple(rec.get("ips") or ()),
                            tuple(rec.get("probe_ips") or ()), pod_network(pod) != DEFAULT_NETWORK)

    def prober_client(self, node: str) -> probing.ProberClient:
        """The node's prober (started by its first probe)."""
        with self._clients_guard:
            client = self.prober_clients.get(node)
            if client is None:
                desc = self.nodes[node]
                cgroup = kubelet_cgroup(desc.get("cgroup") or "")
                client = probing.ProberClient(node, desc["netns"], cgroup or None, self.state_dir)
                self.prober_clients[node] = client
            return client

    def _dispatch(self, task: probing.Task, done: probing.Done) -> None:
        """Run one probe (the prober's scheduler thread calls this; it must not block)."""
        ctx, act = self._probe_ctx.get(task.uid), task.action
        if ctx is not None:
            done = self.stats.counting(ctx.node, done)
        problem = None
        if ctx is None:
            problem = "the pod is not running"
        elif act is None:
            problem = "the probe has no handler"
        elif act.handler == "grpc":
            problem = "the lab's kubelet does not run grpc probes"
        elif act.handler != "exec" and act.port is None:
            problem = f"its port names no TCP containerPort of container {task.container}"
        if problem is not None:
            key = (task.uid, task.container, task.kind)
            if ctx is not None and key not in self._warned:
                self._warned.add(key)
                log.warning("pod %s: %s of container %s is not run: %s", task.ref, task.kind, task.container,
                            problem)
            done(probing.UNKNOWN, problem)
            return
        assert ctx is not None and act is not None
        if act.handler == "exec":
            def run() -> None:
                try:
                    result = probing.run_exec(act.command, ctx.netns, ctx.resolv_conf, task.timeout)
                except Exception as e:   # never leave a probe in flight for good
                    result = (probing.UNKNOWN, str(e))
                done(*result)
            self.exec_pool.submit(run)
            return
        host = P.connect_host(act, ctx.pod_ips, ctx.probe_ips, ctx.isolated)
        if host is None:
            done(probing.UNKNOWN, "the pod has no address")
            return
        self.prober_client(ctx.node).submit(probing.network_request(act, host, task.timeout), done)

    def _probe_changed(self, uid: str) -> None:
        self._serial(uid, self.write_status, uid, pool=self.status_pool)

    def _probe_restart(self, uid: str, why: str) -> None:
        self._serial(uid, self.restart_pod, uid, why)

    def pod_status(self, uid: str, rec: dict | None = None) -> dict | None:
        """The pod's whole status as it is now (None when it does not run here); ``rec``: its sandbox
        record when the caller has read it already."""
        rec, pp = rec if rec is not None else self.sandboxes.get(uid), self.prober.get(uid)
        if rec is None or not rec.get("ready") or pp is None:
            return None
        status = {k: v for k, v in (rec.get("status") or {}).items() if k in BASE_STATUS}
        with self.prober.locked():
            status["conditions"] = pp.conditions(_now())
            status["containerStatuses"] = pp.container_statuses()
        return status

    def write_status(self, uid: str, rec: dict | None = None) -> bool:
        """Write the pod's status unless it is what was written last; False if the pod is gone.
        ``rec``: its sandbox record when the caller has read it already (one disk read per write)."""
        rec = rec if rec is not None else self.sandboxes.get(uid)
        status = self.pod_status(uid, rec)
        if status is None or self._written.get(uid) == status:
            return True
        assert rec is not None
        try:
            self.store.update_status("pods", rec["name"], rec["namespace"], status)
        except NotFound:
            return False
        self._written[uid] = status
        return True

    def adopt(self, pod: dict, rec: dict) -> None:
        """Probe a pod that ran before this kubelet started, continuing from its stored status."""
        uid, st = pod["metadata"]["uid"], pod.get("status") or {}
        if not rec.get("status"):   # recorded by an older kubelet: the status holds what it wrote
            rec["status"] = {k: st[k] for k in BASE_STATUS if k in st}
            self.sandboxes.put(rec)
        stored = {cs.get("name"): cs for cs in st.get("containerStatuses") or () if isinstance(cs, dict)}
        names = [str(c.get("name") or "") for c in (pod.get("spec") or {}).get("containers") or ()]
        counts = [int((stored.get(n) or {}).get("restartCount") or 0) for n in names]
        first = stored.get(names[0]) if names else None
        state = (first or {}).get("state") or {}
        started_wall = (state.get("running") or state.get("terminated") or {}).get("startedAt") \
            or st.get("startTime") or _now()
        now = time.monotonic()
        initial = {}
        for n in names:
            cs = stored.get(n) or {}
            if cs.get("ready"):
                initial[(n, probing.READINESS)] = probing.SUCCESS
            if cs.get("started"):
                initial[(n, probing.STARTUP)] = probing.SUCCESS
        pp = probing.PodProbes.of(pod, now, _now(), restart_counts=counts, started_wall=started_wall,
                                  started_at=now - _age(started_wall), initial=initial)
        for cond in st.get("conditions") or ():
            if cond.get("type") in ("Ready", "ContainersReady") and cond.get("lastTransitionTime"):
                pp.transitions[cond["type"]] = (cond.get("status"), cond["lastTransitionTime"])
        pp.last_state = {n: cs["lastState"] for n, cs in stored.items() if isinstance(cs.get("lastState"), dict)}
        interrupted = any("terminated" in ((stored.get(n) or {}).get("state") or {}) for n in names)
        if interrupted:   # the previous kubelet stopped in the middle of restarting the pod's processes
            pp.paused = "the kubelet restarted while restarting the pod's processes"
        self._probe_ctx[uid] = self._context(pod, rec)
        if not self.prober.add(pp):
            return
        log.info("pod %s/%s: adopted (restarts %s)", rec["namespace"], rec["name"], counts)
        if interrupted:
            self.restart_pod(uid, pp.paused)
        else:
            self.write_status(uid)

    def restart_pod(self, uid: str, why: str) -> None:
        """Restart the pod's processes after a failed liveness or startup probe (see the module
        docstring); its probes start over."""
        rec, pp = self.sandboxes.get(uid), self.prober.get(uid)
        if rec is None or not rec.get("ready") or pp is None or not pp.paused:
            return
        try:
            pod = self.store.get("pods", rec["name"], rec["namespace"])
        except NotFound:
            return
        if pod["metadata"].get("uid") != uid or pod["metadata"].get("deletionTimestamp"):
            return   # being deleted: terminate stops it
        self.write_status(uid, rec)   # not ready while it restarts
        grace = pp.cause_grace if pp.cause_grace is not None else \
            (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE)
        log.warning("pod %s/%s: %s: restarting its processes", rec["namespace"], rec["name"], why)
        self.stop_processes(Stopping(uid, rec, pod, int(grace), why="restarted"))
        finished = _now()
        self._remove_run_files(rec)
        problem = self.run_containers(pod, rec, rec.get("ips") or [])
        if problem is not None:
            log.warning("pod %s/%s: %s", rec["namespace"], rec["name"], problem)
            fails, _ = self.backoff.get(uid, (0, 0.0))
            self.backoff[uid] = (fails + 1, time.monotonic() + min(0.2 * 2 ** fails, 10.0))
            self._fail(pod, problem, reason="RunContainerError")
            return
        new = probing.PodProbes.of(pod, time.monotonic(), _now(),
                                   restart_counts=[c.restart_count + 1 for c in pp.containers])
        new.transitions = dict(pp.transitions)
        new.last_state = {c.name: {"terminated": {"reason": "Error", "message": why, "startedAt": c.started_wall,
                                                  "finishedAt": finished}} for c in pp.containers}
        if self.prober.add(new):
            self.write_status(uid)

    # -- the loop ----------------------------------------------------------------------------

    def _serial(self, uid: str, fn, *args, pool: ThreadPoolExecutor | None = None) -> None:
        with self._locks_guard:
            lock = self._pod_locks.setdefault(uid, threading.Lock())

        def work() -> None:
            with lock:
                try:
                    fn(*args)
                except Exception:
                    log.exception("pod %s", uid)
        (pool or self.pool).submit(work)

    def sync(self, pods: list[dict]) -> None:
        """Level-triggered: make sandboxes match the stored pods."""
        live = {p["metadata"]["uid"]: p for p in pods}
        for rec in self.sandboxes.all():
            if rec["uid"] not in live:
                self.prober.remove(rec["uid"], deleted=True)
                self._serial(rec["uid"], self.stop_removed, rec["uid"], None)
        for pod in pods:
            self.handle(pod)

    def handle(self, pod: dict) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            # from now on only readiness is probed: nothing restarts a pod on its way out, and its
            # Ready condition goes on following what it serves through its grace period
            self.prober.terminate(pod["metadata"]["uid"])
            self._serial(pod["metadata"]["uid"], self.terminate, pod)
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
        self.prober.remove(uid, deleted=True)
        self._serial(uid, self.stop_removed, uid, pod)

    def close(self) -> None:
        """Stop probing and the nodes' probers (the pods keep running, for the next kubelet)."""
        self.stopping.set()
        self.prober.stop()
        with self._clients_guard:
            clients = list(self.prober_clients.values())
        for client in clients:
            client.close()
        self.exec_pool.shutdown(wait=False, cancel_futures=True)
        self.status_pool.shutdown(wait=False, cancel_futures=True)
        self.stats.stop()

    def run(self) -> None:
        self.prober.start()
        self.stats.start()
        while not self.stopping.is_set():
            try:
                # the relist inside the try: a store that is unavailable for a while (etcd being
                # restarted) is waited out, not the end of the kubelet
                lst = self.store.list("pods")
                self.sync(lst.items)
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
    try:
        k.run()
    finally:
        k.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
