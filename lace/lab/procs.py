"""Long-running processes of a lab (agents, pod servers): start detached inside a namespace, record, stop.

Each process runs in its own session (so a signal to its process group reaches its children too),
with stdin from /dev/null and stdout/stderr appended to a log file.  It enters its network
namespace in the child between fork and exec (setns on /run/netns/NAME), so no ``ip netns exec``
wrapper sits between us and it and the recorded pid is the program itself.  A pod's processes
also get a private mount namespace there, with the pod's resolv.conf over /etc/resolv.conf
(``mountns``), and a node's prober joins the node's kubelet cgroup there (``cgroup``: the parent
opens its ``cgroup.procs``, the child writes itself into it).

``run`` is for short commands instead (a kubelet's exec probes): the same namespace and resolv.conf,
waited for with a timeout after which its whole process group is killed; nothing is recorded.

The record is ``<state_dir>/procs.json``: ``{name: {pid, argv, started, netns, log_path,
starttime}}``, rewritten atomically under an flock so concurrent writers do not lose entries.
``starttime`` (field 22 of /proc/PID/stat) guards against signalling a recycled pid.
Stdlib only: the CLI imports this on every lab command.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from .files import write_json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from lace import nsenter

from .mountns import PrivateFile

PROCS_FILE = "procs.json"
_LOCK_FILE = ".procs.lock"


class ProcError(Exception):
    """A lab process could not be started or signalled; the message says which and why."""


@dataclass(frozen=True)
class ProcInfo:
    """One recorded process and whether it still runs."""

    name: str
    pid: int
    argv: list[str]
    started: float
    netns: str | None
    log_path: str
    alive: bool


def _starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after its last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19]) if fields[0] != "Z" else None


def alive(pid: int, starttime: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie; reaped here if it is our child).

    With ``starttime`` it must also be the same process that was recorded, not a recycled pid.
    """
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    now = _starttime(pid)
    if now is None:
        return False
    return starttime is None or now == starttime


# ---- the record -----------------------------------------------------------------------------

@contextlib.contextmanager
def _locked(state_dir: str | os.PathLike[str]) -> Iterator[str]:
    os.makedirs(state_dir, exist_ok=True)
    fd = os.open(os.path.join(state_dir, _LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield os.path.join(state_dir, PROCS_FILE)
    finally:
        os.close(fd)


def _read(path: str) -> dict[str, dict[str, Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ProcError(f"cannot read the process record {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def _entry(state_dir: str | os.PathLike[str], name: str) -> dict[str, Any] | None:
    with _locked(state_dir) as path:
        return _read(path).get(name)


def _forget(state_dir: str | os.PathLike[str], name: str, pid: int) -> None:
    with _locked(state_dir) as path:
        data = _read(path)
        if data.get(name, {}).get("pid") == pid:
            del data[name]
            write_json(path, data)


# ---- start ----------------------------------------------------------------------------------

@contextlib.contextmanager
def _child_setup(name: str, netns: str | None, resolv_conf: str | os.PathLike[str] | None,
                 cgroup: str | os.PathLike[str] | None) -> Iterator[Any]:
    """The ``preexec_fn`` that puts a child into ``netns``, ``cgroup`` and a mount namespace with
    ``resolv_conf`` (None when there is nothing to do); what it needs is opened here, in the parent,
    so a missing namespace or cgroup is a ProcError naming it, and closed after the block."""
    fds: list[int] = []
    try:
        ns_fd = cg_fd = None
        if netns is not None:
            try:
                ns_fd = os.open(nsenter.path_of(netns), os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise ProcError(f"cannot start {name} in netns {netns}: {exc.strerror}") from None
            fds.append(ns_fd)
        if cgroup is not None:
            path = os.path.join(os.fspath(cgroup), "cgroup.procs")
            try:
                cg_fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise ProcError(f"cannot start {name} in cgroup {os.fspath(cgroup)}: {exc.strerror}") from None
            fds.append(cg_fd)
        private = PrivateFile(resolv_conf) if resolv_conf is not None else None

        def enter() -> None:
            # runs between fork and exec: write(2) "0" (the writer itself) into the cgroup, setns(2),
            # and unshare(2) and two mount(2)s for a resolv.conf
            if cg_fd is not None:
                os.write(cg_fd, b"0")
            if ns_fd is not None:
                nsenter.setns(ns_fd)
            if private is not None:
                private.enter()
        yield enter if fds or private is not None else None
    finally:
        for fd in fds:
            os.close(fd)


def spawn(
    argv: Sequence[str],
    *,
    netns: str | None,
    name: str,
    state_dir: str | os.PathLike[str],
    log_path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    resolv_conf: str | os.PathLike[str] | None = None,
    cgroup: str | os.PathLike[str] | None = None,
    pass_fds: Sequence[int] = (),
) -> int:
    """Start ``argv`` detached inside NETNS (None: the caller's namespace) as ``name``; return its pid.

    With ``resolv_conf`` the process sees that file as /etc/resolv.conf (a mount namespace of
    its own); with ``cgroup`` (a cgroup2 directory) it runs in that cgroup; ``pass_fds`` stay open
    in it.  A process already recorded under ``name`` and still running is an error (stop it
    first); a dead one's record is replaced.
    """
    if not argv:
        raise ProcError(f"cannot start {name}: empty command")
    old = _entry(state_dir, name)
    if old and alive(int(old["pid"]), old.get("starttime")):
        raise ProcError(f"cannot start {name}: already running as pid {old['pid']} (stop it first)")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    where = f" in netns {netns}" if netns else ""
    try:
        with _child_setup(name, netns, resolv_conf, cgroup) as enter, \
                open(log_path, "ab", buffering=0) as log, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                list(argv), stdin=devnull, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                close_fds=True, pass_fds=tuple(pass_fds), env=dict(env) if env is not None else None, cwd=cwd,
                preexec_fn=enter,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ProcError(f"cannot start {name}{where} ({argv[0]}): {exc}") from None
    record = {"pid": proc.pid, "argv": list(argv), "started": time.time(), "netns": netns,
              "log_path": os.fspath(log_path), "starttime": _starttime(proc.pid)}
    with _locked(state_dir) as path:
        data = _read(path)
        data[name] = record
        write_json(path, data)
    return proc.pid


# ---- short commands -------------------------------------------------------------------------

@dataclass(frozen=True)
class Completed:
    """How a command ``run`` waited for ended: its exit status (None: killed at its timeout), and
    the start of what it wrote (stdout and stderr together)."""

    returncode: int | None
    output: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run(argv: Sequence[str], *, netns: str | None, timeout: float,
        resolv_conf: str | os.PathLike[str] | None = None, output_limit: int = 10 * 1024,
        input: str | None = None, env: Mapping[str, str] | None = None) -> Completed:
    """Run ``argv`` inside NETNS (with ``resolv_conf`` as /etc/resolv.conf, ``env`` as its
    environment when given), ``input`` on its stdin, and wait at most ``timeout`` seconds; then its
    process group is killed.  A command that cannot be executed ends with 127 (not found) or 126,
    as in a shell; ProcError if the namespace cannot be entered."""
    if not argv:
        raise ProcError("cannot run an empty command")
    try:
        with _child_setup(argv[0], netns, resolv_conf, None) as enter:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=dict(env) if env is not None else None,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    preexec_fn=enter)
    except OSError as exc:
        # the command itself cannot be executed: what a shell reports with 127 / 126
        return Completed(127 if isinstance(exc, FileNotFoundError) else 126, f"{argv[0]}: {exc.strerror}")
    except subprocess.SubprocessError as exc:
        where = f" in netns {netns}" if netns else ""
        raise ProcError(f"cannot run {argv[0]}{where}: {exc}") from None
    try:
        out, _ = proc.communicate(None if input is None else input.encode(), timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:   # something that left the group holds the pipe open
            proc.kill()
            proc.wait()
            out = b""
        code = None
    return Completed(code, out[:output_limit].decode(errors="replace"))


# ---- logs and readiness ---------------------------------------------------------------------

def log_file(state_dir: str | os.PathLike[str], name: str) -> str:
    """Where lab process ``name`` logs: ``<state>/logs/<name>.log``."""
    return os.path.join(os.fspath(state_dir), "logs", f"{name}.log")


def log_tail(path: str | os.PathLike[str], size: int = 1200) -> str:
    """The last ``size`` bytes of a log ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def wait_started(name: str, state_dir: str | os.PathLike[str], pending: Callable[[], str | None], what: str,
                 timeout: float, error: Callable[[str], Exception]) -> None:
    """Poll ``pending()`` (None once process ``name`` is ready, else what it waits for) until it is
    ready; ``error(message)`` is raised, with the end of its log, when it exits first or is not
    ready within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    log = log_file(state_dir, name)
    while (waiting := pending()) is not None:
        if not running(name, state_dir):
            raise error(f"{what} exited while starting; its log {log} ends:\n{log_tail(log)}")
        if time.monotonic() > deadline:
            raise error(f"{what} not ready within {timeout:.0f}s ({waiting}); its log {log} ends:\n{log_tail(log)}")
        time.sleep(0.05)


# ---- inspect and stop -----------------------------------------------------------------------

def list_procs(state_dir: str | os.PathLike[str]) -> list[ProcInfo]:
    """Every recorded process, by name, with whether it still runs."""
    with _locked(state_dir) as path:
        data = _read(path)
    return [
        ProcInfo(name, int(e["pid"]), list(e.get("argv", [])), float(e.get("started", 0)), e.get("netns"),
                 e.get("log_path", ""), alive(int(e["pid"]), e.get("starttime")))
        for name, e in sorted(data.items())
    ]


def _signal(pid: int, sig: int) -> None:
    # the process leads its own session and group: signal the group so its children go too
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill(name: str, state_dir: str | os.PathLike[str], sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to the process recorded as ``name`` without waiting; False if it is not running."""
    e = _entry(state_dir, name)
    if not e or not alive(int(e["pid"]), e.get("starttime")):
        return False
    _signal(int(e["pid"]), sig)
    return True


def running(name: str, state_dir: str | os.PathLike[str]) -> bool:
    """Whether the process recorded as ``name`` still runs (the recorded one, not a recycled pid)."""
    e = _entry(state_dir, name)
    return e is not None and alive(int(e["pid"]), e.get("starttime"))


def resume(pid: int) -> None:
    """SIGCONT to a process (and its group) stopped with SIGSTOP, by pid and without the record's
    lock: a process stopped while it held that lock (recording a child it spawned) would otherwise
    wait for it forever, and whoever resumes it with it."""
    _signal(pid, signal.SIGCONT)


def _wait_gone(pid: int, starttime: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid, starttime):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def stop(name: str, state_dir: str | os.PathLike[str], sig: int = signal.SIGTERM, timeout: float = 5) -> bool:
    """Stop ``name``: ``sig``, then SIGKILL after ``timeout`` seconds; forget it.  True if it was running."""
    e = _entry(state_dir, name)
    if not e:
        return False
    pid, st = int(e["pid"]), e.get("starttime")
    was = alive(pid, st)
    if was:
        _signal(pid, sig)
        if not _wait_gone(pid, st, timeout):
            _signal(pid, signal.SIGKILL)
            if not _wait_gone(pid, st, 5):
                raise ProcError(f"{name} (pid {pid}) survived SIGKILL")
    _forget(state_dir, name, pid)
    return was


def stop_all(state_dir: str | os.PathLike[str], sig: int = signal.SIGTERM, timeout: float = 5) -> list[str]:
    """Stop every recorded process (all signalled at once, then waited for); returns the names stopped."""
    if not os.path.isdir(state_dir):
        return []
    procs = [p for p in list_procs(state_dir)]
    running = [p for p in procs if p.alive]
    starts = {p.name: (_entry(state_dir, p.name) or {}).get("starttime") for p in running}
    for p in running:
        _signal(p.pid, sig)
    deadline = time.monotonic() + timeout
    for p in running:
        if not _wait_gone(p.pid, starts[p.name], max(0.0, deadline - time.monotonic())):
            _signal(p.pid, signal.SIGKILL)
            _wait_gone(p.pid, starts[p.name], 5)
    for p in procs:
        _forget(state_dir, p.name, p.pid)
    return [p.name for p in running]
