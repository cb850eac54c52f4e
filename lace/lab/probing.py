"""The lab kubelet's probes: what each probe concluded, when the next one runs, and who runs it.

Kubernetes' semantics (the kubelet's prober workers), per container:

- Every probe waits ``initialDelaySeconds`` after the container started, then runs every
  ``periodSeconds`` (the next run is a period after the previous one began, or at once when that
  one took longer); a run that takes more than ``timeoutSeconds`` fails.
- A probe's result changes only after ``successThreshold`` successes or ``failureThreshold``
  failures in a row. A run that could not be made (the prober is restarting, a named port the
  container does not have, a handler the lab does not run) is thrown away, as a kubelet does with
  probe errors: it changes nothing.
- ``startupProbe`` gates the other two: until it succeeds, liveness and readiness are not run and
  the container is neither started nor ready; once it has, it stops and the others start at once
  (each still after its own initial delay). Without one, a container is started when it runs.
- ``readinessProbe`` starts out failed: the container is ready once it succeeds (and is not ready
  while it fails); without one, a started container is ready.
- ``livenessProbe`` starts out succeeded; when it fails (or the startup probe does), the pod's
  processes are restarted and its probes start over, as for a new container.
- Once the pod is being deleted (``terminate``) its liveness and startup probes stop, set to
  success, so that nothing restarts a pod on its way out; its readiness probe goes on running
  through the grace period, as the kubelet's does, so that the pod's Ready condition (and with it
  its endpoints' ``serving``) follows the draining workload.

``ProbeWorker`` and ``PodProbes`` are that logic alone: plain state driven by results and a clock
the caller passes in. ``Prober`` schedules them (one thread and a heap of due times), hands each due
probe to a dispatcher and applies what comes back; the lab's kubelet dispatches network probes
(httpGet, tcpSocket) to the node's prober process (``ProberClient``, lace.lab.prober) and exec
probes to ``run_exec`` (the command in the pod's network namespace, with the pod's resolv.conf).

``ProbeStats`` counts what the kubelet's probes did, per node — ``run`` (made: ``success`` +
``failure``), ``success``, ``failure`` and ``unknown`` (thrown away, not made) — since the kubelet
started, and keeps them in ``<state>/kubelet/probe-stats.json`` (``PROBE_STATS_FILE``) for anyone to
read (bench/lab.py takes the probe rate from it)::

    {"pid": 4711, "since": 1767225600.0, "written": 1767225671.3, "monotonic": 8123.402,
     "nodes": {"worker-1": {"run": 14000, "success": 14000, "failure": 0, "unknown": 0}}}

``written`` and ``monotonic`` are when the counts were taken (``time.time()`` and
``time.monotonic()``, the system-wide CLOCK_MONOTONIC: a rate is Δrun / Δmonotonic of two
versions). Counting is a lock and an increment on the result's path; the file is written by a
thread of its own, at most once a second (``STATS_INTERVAL``) and only when a count changed: the
first change after a quiet spell is written at once, later ones when a second has passed since the
previous write, so the file is never more than a second behind. While nothing changes the thread
sleeps on a condition with no timeout — an idle kubelet never wakes up for it. The last counts
are written when the kubelet stops.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from lace import probes as P

from . import procs
from .files import write_json

log = logging.getLogger("lace.lab.probing")

SUCCESS, FAILURE, UNKNOWN = "success", "failure", "unknown"
STARTUP, LIVENESS, READINESS = "startupProbe", "livenessProbe", "readinessProbe"
#: what a probe concluded before its first run (Kubernetes' initial values)
INITIAL = {STARTUP: UNKNOWN, LIVENESS: SUCCESS, READINESS: FAILURE}
#: how status messages and logs name a probe
TITLE = {STARTUP: "Startup", LIVENESS: "Liveness", READINESS: "Readiness"}

Done = Callable[[str, str], None]   # (result, message)
#: seconds a request may wait for room in the prober's socket before the prober counts as hung
SEND_TIMEOUT = 5


# ---- the state machine ----------------------------------------------------------------------

class ProbeWorker:
    """One probe of one container: its result, the run of equal results that leads to it, and when
    it runs next (``next_at``, on the caller's clock)."""

    def __init__(self, kind: str, timing: P.Timing, action: P.Action | None, initial: str | None = None,
                 grace: int | None = None) -> None:
        self.kind = kind
        self.timing = timing
        self.action = action
        #: the probe's terminationGracePeriodSeconds (liveness, startup): overrides the pod's on restart
        self.grace = grace
        self.result = initial or INITIAL[kind]
        self.last: str | None = None
        self.run = 0
        self.message = ""
        #: a liveness or startup probe that failed: no more runs for this container
        self.on_hold = False
        self.in_flight = False
        self.next_at = 0.0
        self.dispatched_at = 0.0
        #: bumped whenever next_at is set anew, so that older heap entries are recognised as stale
        self.gen = 0

    def observe(self, result: str, message: str = "") -> bool:
        """Apply one run's result; True when the probe's result changed (a threshold was reached)."""
        if result not in (SUCCESS, FAILURE):
            return False
        if result == self.last:
            self.run += 1
        else:
            self.last, self.run = result, 1
        self.message = message
        needed = self.timing.failure_threshold if result == FAILURE else self.timing.success_threshold
        if self.run < needed:
            return False
        changed = result != self.result
        self.result = result
        if self.kind in (LIVENESS, STARTUP) and result == FAILURE:
            self.on_hold, self.run = True, 0
        return changed


class ContainerProbes:
    """The probes of one container and what they make of it (``started``, ``ready``)."""

    def __init__(self, index: int, name: str, image: str, workers: dict[str, ProbeWorker], started_at: float,
                 started_wall: str, restart_count: int = 0) -> None:
        self.index = index
        self.name = name
        self.image = image
        self.workers = workers
        self.started_at = started_at
        self.started_wall = started_wall
        self.restart_count = restart_count

    @property
    def started(self) -> bool:
        w = self.workers.get(STARTUP)
        return w is None or w.result == SUCCESS

    @property
    def ready(self) -> bool:
        w = self.workers.get(READINESS)
        return self.started and (w is None or w.result == SUCCESS)

    def active(self, kind: str) -> bool:
        """Whether probe ``kind`` runs now: the startup probe until the container has started, the
        others from then on."""
        return (kind == STARTUP) != self.started

    def first_run(self, kind: str, now: float) -> float:
        """When probe ``kind`` may run first: its initial delay after the container started."""
        return max(now, self.started_at + self.workers[kind].timing.initial_delay)


@dataclass
class Outcome:
    """What applying one result did to a pod: its status changed (``changed``), its processes must
    restart (``restart``: why), and which probes to (re)schedule."""

    changed: bool = False
    restart: str = ""
    schedule: list[tuple[ContainerProbes, ProbeWorker]] = field(default_factory=list)


class PodProbes:
    """Every container's probes of one pod (its processes' current run)."""

    def __init__(self, uid: str, containers: list[ContainerProbes], ref: str = "") -> None:
        self.uid = uid
        self.containers = containers
        #: namespace/name, for logs
        self.ref = ref or uid
        #: the pod's processes are being restarted (why): no probe runs, no result counts
        self.paused = ""
        #: the grace period of the probe that failed, if it has its own
        self.cause_grace: int | None = None
        #: condition type -> (status, lastTransitionTime)
        self.transitions: dict[str, tuple[str, str]] = {}
        #: container name -> its lastState (how its previous run ended)
        self.last_state: dict[str, dict[str, Any]] = {}

    @classmethod
    def of(cls, pod: dict[str, Any], now: float, now_wall: str, *, restart_counts: Sequence[int] = (),
           started_wall: str | None = None, started_at: float | None = None,
           initial: dict[tuple[str, str], str] | None = None) -> PodProbes:
        """The probes of ``pod``'s containers, started at ``started_at`` (default ``now``);
        ``initial`` (container name, probe) -> result overrides the initial values (a restarted
        kubelet continues from what the pod's status says)."""
        containers = []
        for i, c in enumerate((pod.get("spec") or {}).get("containers") or ()):
            name = str(c.get("name") or "")
            workers = {}
            for kind in P.PROBE_FIELDS:
                spec = c.get(kind)
                if isinstance(spec, dict):
                    grace = spec.get("terminationGracePeriodSeconds")
                    workers[kind] = ProbeWorker(kind, P.timing(spec), P.action(c, spec),
                                                (initial or {}).get((name, kind)),
                                                grace if isinstance(grace, int) and not isinstance(grace, bool)
                                                else None)
            containers.append(ContainerProbes(i, name, str(c.get("image") or ""), workers,
                                              now if started_at is None else started_at, started_wall or now_wall,
                                              restart_counts[i] if i < len(restart_counts) else 0))
        meta = pod["metadata"]
        pp = cls(meta["uid"], containers, f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        for c in containers:
            for w in c.workers.values():
                w.next_at = c.first_run(w.kind, now)
        return pp

    def workers(self) -> list[tuple[ContainerProbes, ProbeWorker]]:
        return [(c, w) for c in self.containers for w in c.workers.values()]

    def terminate(self, now: float) -> list[tuple[ContainerProbes, ProbeWorker]]:
        """The pod is being deleted: its liveness and startup probes stop with a last success (the
        kubelet's quiet shutdown); returns the readiness probes to schedule anew (a container whose
        startup probe had not passed yet starts being probed for readiness now)."""
        out = []
        for c in self.containers:
            was_started = c.started
            for kind in (LIVENESS, STARTUP):
                w = c.workers.get(kind)
                if w is not None:
                    w.result, w.on_hold = SUCCESS, True
            ready = c.workers.get(READINESS)
            if ready is not None and c.started and not was_started:
                ready.next_at = c.first_run(READINESS, now)
                ready.gen += 1
                out.append((c, ready))
        return out

    def _signature(self) -> tuple:
        return tuple((c.started, c.ready) for c in self.containers), self.paused

    @property
    def ready(self) -> bool:
        return not self.paused and all(c.ready for c in self.containers)

    def start_run(self, c: ContainerProbes, w: ProbeWorker, now: float) -> bool:
        """Whether probe ``w`` of ``c`` runs at ``now`` (then it is in flight until ``complete``). A
        probe gated off (see ``ContainerProbes.active``) moves on by a period instead."""
        if w.next_at > now or w.in_flight or w.on_hold or self.paused:
            return False
        if not c.active(w.kind):
            w.next_at = now + w.timing.period
            w.gen += 1
            return False
        w.in_flight, w.dispatched_at = True, now
        return True

    def due(self, now: float) -> list[tuple[ContainerProbes, ProbeWorker]]:
        """Every probe that runs at ``now`` (``start_run`` of each)."""
        return [(c, w) for c, w in self.workers() if self.start_run(c, w, now)]

    def complete(self, c: ContainerProbes, w: ProbeWorker, result: str, message: str, now: float) -> Outcome:
        """Apply one run's result (see the module docstring)."""
        out = Outcome()
        w.in_flight = False
        if self.paused or w.on_hold:
            return out
        before = self._signature()
        was_started = c.started
        w.observe(result, message)
        if w.on_hold:
            self.paused = f"{TITLE[w.kind]} probe of container {c.name} failed: {w.message}"
            self.cause_grace = w.grace
            out.restart = self.paused
        else:
            w.next_at = max(w.dispatched_at + w.timing.period, now)
            w.gen += 1
            out.schedule.append((c, w))
            if c.started and not was_started:   # the startup probe succeeded: the others begin
                for other in c.workers.values():
                    if other is not w:
                        other.next_at = c.first_run(other.kind, now)
                        other.gen += 1
                        out.schedule.append((c, other))
        out.changed = self._signature() != before
        return out

    # -- status ------------------------------------------------------------------------------

    def conditions(self, now_wall: str) -> list[dict[str, Any]]:
        """``ContainersReady`` and ``Ready``, each with the time it last changed."""
        unready = [c.name for c in self.containers if not c.ready or self.paused]
        status = "False" if unready or self.paused else "True"
        out = []
        for kind in ("ContainersReady", "Ready"):
            prev = self.transitions.get(kind)
            if prev is None or prev[0] != status:
                self.transitions[kind] = (status, now_wall)
            cond: dict[str, Any] = {"type": kind, "status": status,
                                    "lastTransitionTime": self.transitions[kind][1]}
            if status == "False":
                cond["reason"] = "ContainersNotReady"
                cond["message"] = f"containers with unready status: [{' '.join(unready)}]"
            out.append(cond)
        return out

    def container_statuses(self) -> list[dict[str, Any]]:
        """``status.containerStatuses``: name, image, ready, started, restartCount, state (running
        since the processes started; terminated while they are being restarted) and lastState."""
        out = []
        for c in self.containers:
            if self.paused:
                state = {"terminated": {"reason": "Error", "message": self.paused, "startedAt": c.started_wall}}
            else:
                state = {"running": {"startedAt": c.started_wall}}
            st: dict[str, Any] = {"name": c.name, "image": c.image, "ready": c.ready and not self.paused,
                                  "started": c.started and not self.paused, "restartCount": c.restart_count,
                                  "state": state}
            if c.name in self.last_state:
                st["lastState"] = self.last_state[c.name]
            out.append(st)
        return out


# ---- running the probes ---------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One run of one probe, as the dispatcher gets it."""

    uid: str
    container: str
    kind: str
    action: P.Action | None
    timeout: float
    ref: str = ""   # namespace/name, for logs


Dispatch = Callable[[Task, Done], None]


class _Background:
    """A daemon thread running ``self._loop`` until :meth:`stop`: ``_cond`` guards ``_stopping`` and
    whatever the loop waits on."""

    thread_name = "background"

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Prober(_Background):
    """Runs the probes of every registered pod: a scheduler thread hands due probes to ``dispatch``
    (which must not block long and calls ``done(result, message)`` once, from any thread), applies
    the results, and tells the kubelet: ``on_change(uid)`` when a pod's readiness or startedness
    changed, ``on_restart(uid, why)`` when its processes must restart (its probes are paused until
    it registers the pod again)."""

    thread_name = "prober"

    def __init__(self, dispatch: Dispatch, on_change: Callable[[str], None],
                 on_restart: Callable[[str, str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.dispatch = dispatch
        self.on_change = on_change
        self.on_restart = on_restart
        self.clock = clock
        self.pods: dict[str, PodProbes] = {}
        #: uids of deleted pods: never probed again
        self.gone: set[str] = set()
        #: uids of pods being deleted: readiness only (PodProbes.terminate), also when added again
        self.terminating: set[str] = set()
        self._heap: list[tuple[float, int, PodProbes, ContainerProbes, ProbeWorker, int]] = []
        self._seq = itertools.count()
        super().__init__()

    # -- registration (any thread) -----------------------------------------------------------

    def add(self, pp: PodProbes) -> bool:
        """Probe ``pp``'s pod from now on (replacing what it had); False for a deleted pod."""
        with self._cond:
            if pp.uid in self.gone:
                return False
            if pp.uid in self.terminating:
                pp.terminate(self.clock())
            self.pods[pp.uid] = pp
            for c, w in pp.workers():
                w.gen += 1
                self._push(pp, c, w)
            self._cond.notify()
        return True

    def remove(self, uid: str, *, deleted: bool = False) -> PodProbes | None:
        """Stop probing pod ``uid`` at once (results of runs in flight are dropped); ``deleted``: for
        good, even if something registers it again."""
        with self._cond:
            if deleted:
                self.gone.add(uid)
                self.terminating.discard(uid)
            return self.pods.pop(uid, None)

    def terminate(self, uid: str) -> None:
        """Pod ``uid`` is being deleted: from now on only its readiness probes run (see
        ``PodProbes.terminate``), until ``remove``."""
        with self._cond:
            if uid in self.terminating:
                return
            self.terminating.add(uid)
            pp = self.pods.get(uid)
            if pp is None:
                return
            for c, w in pp.terminate(self.clock()):
                self._push(pp, c, w)
            self._cond.notify()

    def get(self, uid: str) -> PodProbes | None:
        with self._cond:
            return self.pods.get(uid)

    def has(self, uid: str) -> bool:
        with self._cond:
            return uid in self.pods

    def locked(self) -> threading.Condition:
        """The lock to hold while reading a registered PodProbes (results change it concurrently)."""
        return self._cond

    # -- the scheduler -----------------------------------------------------------------------

    def _push(self, pp: PodProbes, c: ContainerProbes, w: ProbeWorker) -> None:
        heapq.heappush(self._heap, (w.next_at, next(self._seq), pp, c, w, w.gen))

    def due_tasks(self) -> list[tuple[PodProbes, ContainerProbes, ProbeWorker, Task]]:
        """Take the probes due now off the heap (marked in flight)."""
        now = self.clock()
        out = []
        with self._cond:
            while self._heap and self._heap[0][0] <= now:
                _, _, pp, c, w, gen = heapq.heappop(self._heap)
                if self.pods.get(pp.uid) is not pp or gen != w.gen:
                    continue   # stale: the pod went or restarted, or this probe was rescheduled
                if pp.start_run(c, w, now):
                    out.append((pp, c, w, Task(pp.uid, c.name, w.kind, w.action, float(w.timing.timeout), pp.ref)))
                elif w.gen != gen:
                    self._push(pp, c, w)   # gated off: its next tick
        return out

    def run_due(self) -> float | None:
        """Dispatch every due probe; returns the seconds until the next one (None: none)."""
        for pp, c, w, task in self.due_tasks():
            self.dispatch(task, self._done(pp, c, w))
        with self._cond:
            return max(0.0, self._heap[0][0] - self.clock()) if self._heap else None

    def _loop(self) -> None:
        while True:
            try:
                self.run_due()
            except Exception:
                log.exception("prober")
            with self._cond:
                if self._stopping:
                    return
                wait = max(0.0, self._heap[0][0] - self.clock()) if self._heap else None
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                if self._stopping:
                    return

    def _done(self, pp: PodProbes, c: ContainerProbes, w: ProbeWorker) -> Done:
        once = threading.Lock()

        def done(result: str, message: str) -> None:
            if not once.acquire(blocking=False):
                return
            self.complete(pp, c, w, result, message)
        return done

    def complete(self, pp: PodProbes, c: ContainerProbes, w: ProbeWorker, result: str, message: str) -> None:
        """Apply one run's result (from any thread) and tell the kubelet what it changed."""
        with self._cond:
            if self.pods.get(pp.uid) is not pp:
                return   # deleted or restarted meanwhile: the result is of no container any more
            out = pp.complete(c, w, result, message, self.clock())
            for c2, w2 in out.schedule:
                self._push(pp, c2, w2)
            self._cond.notify()
        if result == UNKNOWN:
            log.debug("pod %s: %s probe of %s not run: %s", pp.ref, w.kind, c.name, message)
        elif result == FAILURE and w.run == 1 and not out.restart:
            log.info("pod %s: %s probe of container %s failed: %s", pp.ref, TITLE[w.kind], c.name, message)
        if out.changed and not out.restart:
            log.info("pod %s: %s", pp.ref, "ready" if pp.ready else "not ready")
        if out.changed:
            self.on_change(pp.uid)
        if out.restart:
            self.on_restart(pp.uid, out.restart)


# ---- counting the runs ----------------------------------------------------------------------

#: where the kubelet keeps its ProbeStats, under its state dir
PROBE_STATS_FILE = os.path.join("kubelet", "probe-stats.json")
#: the least time between two writes of the stats file, in seconds
STATS_INTERVAL = 1.0
#: the counts of one node, in the order the file lists them
STATS_KEYS = ("run", SUCCESS, FAILURE, UNKNOWN)


class ProbeStats(_Background):
    """Per-node counts of probe runs, kept in a file (see the module docstring)."""

    thread_name = "probe-stats"

    def __init__(self, path: str | os.PathLike[str], interval: float = STATS_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.fspath(path)
        self.interval = interval
        self.clock = clock
        self.since = time.time()
        #: node -> key -> count
        self.counts: dict[str, dict[str, int]] = {}
        #: how many times the file was written (for tests)
        self.writes = 0
        self._dirty = False
        #: the counts the file holds (write skips a write that would change nothing)
        self._written: dict[str, Any] | None = None
        super().__init__()

    def record(self, node: str, result: str) -> None:
        """Count one run's result on ``node`` (any thread)."""
        key = result if result in (SUCCESS, FAILURE) else UNKNOWN
        with self._cond:
            c = self.counts.get(node)
            if c is None:
                c = self.counts[node] = dict.fromkeys(STATS_KEYS, 0)
            c[key] += 1
            if key != UNKNOWN:
                c["run"] += 1
            if not self._dirty:   # the writer wakes once per write, not once per probe
                self._dirty = True
                self._cond.notify()

    def counting(self, node: str, done: Done) -> Done:
        """``done`` that also counts its result on ``node`` (the first call only, as ``Prober`` does)."""
        once = threading.Lock()

        def counted(result: str, message: str) -> None:
            if once.acquire(blocking=False):
                self.record(node, result)
            done(result, message)
        return counted

    def snapshot(self) -> dict[str, Any]:
        """What the file holds: the counts as they are now."""
        with self._cond:
            nodes = {n: dict(c) for n, c in self.counts.items()}
        return {"pid": os.getpid(), "since": self.since, "written": time.time(), "monotonic": time.monotonic(),
                "nodes": nodes}

    def write(self) -> None:
        """Write the counts, unless the file holds them already: a probe counted while the writer
        cleared its flag and took its snapshot is in that snapshot, and sets the flag again for a
        write that would change nothing."""
        doc = self.snapshot()
        if doc["nodes"] == self._written:
            return
        # counted before the file is replaced, so a reader who sees the new file sees the count too
        before = self._written
        self._written = doc["nodes"]
        self.writes += 1
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            write_json(self.path, doc)
        except BaseException:
            self._written = before
            self.writes -= 1
            raise

    def stop(self) -> None:
        """Stop the writer; counts not yet written are written now."""
        super().stop()
        with self._cond:
            dirty, self._dirty = self._dirty, False
        if dirty:
            self._write_logged()

    def _write_logged(self) -> None:
        try:
            self.write()
        except OSError as exc:
            log.warning("cannot write the probe stats %s: %s", self.path, exc)

    def _loop(self) -> None:
        last = float("-inf")
        while True:
            with self._cond:
                while not self._dirty and not self._stopping:
                    self._cond.wait()                 # idle: no timeout, no wake-ups
                if self._stopping:
                    return                            # stop() writes what is left
                wait = last + self.interval - self.clock()
                if wait > 0:
                    self._cond.wait(wait)             # only stop() notifies now: the flag is set
                    continue
                self._dirty = False
            last = self.clock()
            self._write_logged()


# ---- where the runs happen ------------------------------------------------------------------

def network_request(action: P.Action, host: str, timeout: float) -> dict[str, Any]:
    """The request a network probe makes of the node's prober (lace.lab.prober)."""
    req: dict[str, Any] = {"handler": action.handler, "host": host, "port": action.port, "timeout": timeout}
    if action.handler == "httpGet":
        req.update(path=action.path, scheme=action.scheme, headers=[list(h) for h in action.headers])
    return req


def run_exec(command: Sequence[str], netns: str, resolv_conf: str | None, timeout: float) -> tuple[str, str]:
    """An exec probe: ``command`` in the pod's network namespace with its resolv.conf, as its
    processes run; success when it exits 0 within ``timeout`` seconds."""
    try:
        done = procs.run(command, netns=netns, resolv_conf=resolv_conf, timeout=timeout)
    except procs.ProcError as exc:   # the pod's namespace is gone: it is being deleted
        return UNKNOWN, str(exc)
    if done.timed_out:
        return FAILURE, f"command {list(command)} timed out after {timeout:g}s"
    if done.returncode == 0:
        return SUCCESS, done.output.strip()
    return FAILURE, f"command {list(command)} exited with {done.returncode}: {done.output.strip()[:200]}"


class _Conn:
    """One running prober process and the kubelet's end of its socket pair."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        # a prober that stops reading is treated as dead: a send blocks at most this long (a
        # kernel timeout, so that the reader's side of the socket stays blocking)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT, 0))
        self.pid = pid
        self.started = time.monotonic()
        self.pending: dict[int, Done] = {}

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class ProberClient:
    """The kubelet's link to one node's prober process (lace.lab.prober): started on first use in
    the node's network namespace and kubelet cgroup (procs name ``prober-<node>``), started again
    when it died (after a backoff when it keeps dying young). A worker of an earlier kubelet still
    recorded under that name is stopped first, so there is never more than one per node."""

    def __init__(self, node: str, netns: str, cgroup: str | None, state_dir: str) -> None:
        self.node = node
        self.netns = netns
        self.cgroup = cgroup or None
        self.state_dir = state_dir
        self.name = f"prober-{node}"
        self.log_path = os.path.join(state_dir, "logs", f"{self.name}.log")
        self._lock = threading.Lock()
        self._conn: _Conn | None = None
        self._ids = itertools.count(1)
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False

    @property
    def pid(self) -> int | None:
        conn = self._conn
        return conn.pid if conn is not None else None

    def _start(self) -> _Conn:
        procs.stop(self.name, self.state_dir, timeout=2)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            argv = [sys.executable, "-m", "lace.lab.prober", "--node", self.node, "--fd", str(child.fileno()),
                    "--lab-dir", self.state_dir]
            pid = procs.spawn(argv, netns=self.netns, name=self.name, state_dir=self.state_dir,
                              log_path=self.log_path, cgroup=self.cgroup, pass_fds=(child.fileno(),))
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        conn = _Conn(parent, pid)
        threading.Thread(target=self._read, args=(conn,), name=f"{self.name}-reader", daemon=True).start()
        log.info("prober of %s started: pid %d, netns %s, cgroup %s", self.node, pid, self.netns,
                 self.cgroup or "(none: probes into isolated networks will be denied)")
        return conn

    def submit(self, request: dict[str, Any], done: Done) -> None:
        """Send one probe request; ``done(result, message)`` gets its answer (UNKNOWN when the prober
        could not run it: not started, or it died with the request in flight)."""
        failed: str | None = None
        with self._lock:
            if self._closed:
                failed = "the kubelet is stopping"
            elif self._conn is None and time.monotonic() < self._retry_at:
                failed = f"the prober of {self.node} is restarting (log {self.log_path})"
            elif self._conn is None:
                try:
                    self._conn = self._start()
                except procs.ProcError as exc:
                    self._died_young()
                    failed = f"cannot start the prober of {self.node}: {exc}"
                    log.warning("%s", failed)
            if failed is None:
                conn = self._conn
                assert conn is not None
                rid = next(self._ids)
                conn.pending[rid] = done
                try:
                    conn.sock.sendall((json.dumps(dict(request, id=rid)) + "\n").encode())
                except OSError as exc:
                    conn.pending.pop(rid, None)
                    failed = f"the prober of {self.node} does not take requests: {exc}"
                    self._drop(conn)
        if failed is not None:
            done(UNKNOWN, failed)

    def _died_young(self) -> None:
        self._failures += 1
        self._retry_at = time.monotonic() + min(0.25 * 2 ** self._failures, 30.0)

    def _drop(self, conn: _Conn) -> None:
        """Forget ``conn`` (lock held); its reader fails what is pending and the next request starts
        a new prober."""
        if self._conn is conn:
            self._conn = None
            if time.monotonic() - conn.started < 5:
                self._died_young()
            else:
                self._failures = 0
        conn.close()
        procs.kill(self.name, self.state_dir)

    def _read(self, conn: _Conn) -> None:
        try:
            with conn.sock.makefile("rb") as f:
                for line in f:
                    try:
                        answer = json.loads(line)
                    except ValueError:
                        continue
                    with self._lock:
                        done = conn.pending.pop(answer.get("id"), None)
                    if done is not None:
                        done(str(answer.get("result") or UNKNOWN), str(answer.get("message") or ""))
        except (OSError, ValueError):
            pass
        with self._lock:
            pending, conn.pending = conn.pending, {}
            closing = self._closed
            if self._conn is conn:
                self._drop(conn)
        if not closing:
            log.warning("the prober of %s (pid %d) exited; log %s: started again with the next probe",
                        self.node, conn.pid, self.log_path)
        for done in pending.values():
            done(UNKNOWN, f"the prober of {self.node} exited")

    def close(self) -> None:
        """Stop the prober (it also exits by itself when the kubelet's end closes)."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        procs.stop(self.name, self.state_dir, timeout=2)
