"""``lace sysdump``: everything needed to analyse a lab offline, in one directory tree (the CLI
packs it as a .tar.gz).

    index.json                     every file (path, bytes, what it is) and every collection error
    lab/lab.json, lab/procs.json   the lab's description (topology, processes), as the lab wrote them
    lab/status.json                `lace lab status -o json`
    logs/…                         the lab's log directory (agents, kubelet, controllers, DNS, pods)
    store/<kind>.json              every object of every kind, as `lace get KIND -A -o json`
    nodes/<node>/bpf-<map>.json    `node bpf show MAP -o json` for every map it shows (services with
                                   --endpoints: the backends and Maglev slots too)
    nodes/<node>/ct.json           `node ct list all -o json`
    nodes/<node>/flows.json        `node trace flow -o json` (the agent's flow history)
    nodes/<node>/devices.json      `node device list -o json`
    nodes/<node>/agent-status.json the agent's /v1/status
    nodes/<node>/metrics.txt       the agent's /metrics

Each node's part is collected by one process inside the node (its network namespace and host
cgroup, as ``lace exec --node`` runs node commands): ``python -m lace.cli.sysdump node DIR``, which
runs the node commands in-process and writes what each gave and why one failed. A node that is
down, or a command that fails, is recorded in ``index.json`` under ``errors`` and the rest is still
collected.

Secrets never go in: a kind named Secret is left out whole; values under secret-like keys (tokens,
passwords, keys, credentials, certificates), container env values with such names, and
``key=value`` pairs with such keys in logs are replaced by ``<redacted>``.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

REDACTED = "<redacted>"
SECRET_KINDS = {"Secret"}
#: a key (field name, annotation, env var name) whose value is secret
_SECRET_KEY = re.compile(r"(?i)(secret|token|passw(or)?d|passphrase|credential|private[-_.]?key|api[-_.]?key|"
                         r"access[-_.]?key|auth|bearer|cert(ificate)?[-_.]?data|client[-_.]?key|kubeconfig)")
#: ``token=abc``, ``"password": "x"``, ``Authorization: Bearer x`` in free text
_SECRET_TEXT = re.compile(
    r"(?i)(\b[\w.-]*(?:secret|token|passw(?:or)?d|passphrase|credential|api[-_.]?key|private[-_.]?key|auth)"
    r"[\w.-]*[\"']?\s*[:=]\s*[\"']?)(bearer\s+)?([^\s\"',;}]+)")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact(obj: Any) -> Any:
    """A copy of ``obj`` with every secret-like value replaced (see the module docstring)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        name = obj.get("name")
        for k, v in obj.items():
            if isinstance(k, str) and is_secret_key(k) and isinstance(v, (str, int, float, bytes)) and v != "":
                out[k] = REDACTED
            elif k == "value" and isinstance(name, str) and is_secret_key(name) and "valueFrom" not in obj:
                out[k] = REDACTED          # a container env var such as {name: API_TOKEN, value: …}
            elif isinstance(k, str) and is_secret_key(k) and isinstance(v, (dict, list)) and k not in (
                    "metadata", "spec", "status"):
                out[k] = REDACTED
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, list):
        return [redact(x) for x in obj]
    if isinstance(obj, str):
        return redact_text(obj) if _SECRET_TEXT.search(obj) else obj
    return obj


def redact_text(text: str) -> str:
    """``key=secret`` / ``"key": "secret"`` / ``Authorization: Bearer x`` with secret-like keys redacted."""
    return _SECRET_TEXT.sub(lambda m: m.group(1) + (m.group(2) or "") + REDACTED, text)


# ---- inside a node ----------------------------------------------------------------------------------

def node_commands(maps: tuple[str, ...]) -> list[tuple[str, list[str], str]]:
    """(file, node argv, what) for everything collected per node."""
    out = [(f"bpf-{m}.json", ["bpf", "show", m, *(["--endpoints"] if m == "services" else []), "-o", "json"],
            f"node bpf show {m}") for m in maps]
    out += [("ct.json", ["ct", "list", "all", "-o", "json"], "node ct list all"),
            ("flows.json", ["trace", "flow", "-o", "json"], "node trace flow"),
            ("devices.json", ["device", "list", "-o", "json"], "node device list")]
    return out


def collect_node(outdir: str, env: dict[str, str]) -> dict[str, Any]:
    """Run in the node: every node command and the agent's status and metrics into ``outdir``."""
    from lace.cli.node.main import main as node_main
    from lace.datapath import registry
    os.makedirs(outdir, exist_ok=True)
    files: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for fname, argv, what in node_commands(registry.SHOWABLE):
        out, err = io.StringIO(), io.StringIO()
        try:
            rc = int(node_main(argv, env, stdout=out, stderr=err, stdin=io.StringIO("")))
        except Exception as exc:   # noqa: BLE001 - recorded, the rest goes on
            rc, err = 1, io.StringIO(f"error: {exc}")
        if rc == 0 and out.getvalue().strip():
            with open(os.path.join(outdir, fname), "w") as f:
                f.write(out.getvalue())
            files.append({"file": fname, "what": what})
        else:
            errors.append({"what": what, "error": _error_line(err.getvalue()) or f"exit status {rc}"})
    from lace.cni.client import AgentUnavailable, call
    sock = env.get("LACE_AGENT_SOCKET") or ""
    for fname, url, what in (("agent-status.json", "/v1/status", "agent /v1/status"),
                             ("metrics.txt", "/metrics", "agent /metrics")):
        try:
            status, body = call(sock, "GET", url, timeout=10)
        except AgentUnavailable as exc:
            errors.append({"what": what, "error": str(exc)})
            continue
        if status != 200:
            errors.append({"what": what, "error": f"HTTP {status}: {body!r}"[:300]})
            continue
        with open(os.path.join(outdir, fname), "w") as f:
            if isinstance(body, (bytes, bytearray)):
                f.write(body.decode(errors="replace"))
            else:
                json.dump(body, f, indent=2, default=str)
        files.append({"file": fname, "what": what})
    return {"files": files, "errors": errors}


def _error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    err = next((ln for ln in lines if ln.startswith("error: ")), lines[-1] if lines else "")
    return err[len("error: "):] if err.startswith("error: ") else err


# ---- on the workstation ---------------------------------------------------------------------------------

class Collector:
    """Collects a lab into ``root`` (a directory) and writes its index."""

    def __init__(self, root: str, lab_name: str, state_dir: str, store: Any, lab: Any | None,
                 progress: Callable[[str], None] = lambda m: None, node_timeout: float = 120.0) -> None:
        self.root = root
        self.lab_name = lab_name
        self.state_dir = state_dir
        self.store = store
        self.lab = lab
        self.progress = progress
        self.node_timeout = node_timeout
        self.files: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []

    def _write(self, rel: str, data: str | bytes, what: str) -> None:
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        self.files.append({"path": rel, "bytes": os.path.getsize(path), "what": what})

    def error(self, what: str, error: str, node: str | None = None) -> None:
        self.errors.append({k: v for k, v in (("node", node), ("what", what), ("error", error)) if v})

    def collect(self, nodes: list[str] | None = None) -> dict[str, Any]:
        started = time.time()
        self.progress("collecting the nodes")
        procs = self._start_nodes(nodes)
        self.progress("collecting the lab's description, logs and store")
        self._lab_files()
        self._logs()
        self._store()
        self._finish_nodes(procs)
        index = {"lab": self.lab_name, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                 "duration_s": round(time.time() - started, 2),
                 "nodes": [n for n in procs], "files": sorted(self.files, key=lambda f: f["path"]),
                 "errors": self.errors}
        with open(os.path.join(self.root, "index.json"), "w") as f:
            json.dump(index, f, indent=2)
        return index

    def _lab_files(self) -> None:
        for name in ("lab.json", "procs.json"):
            path = os.path.join(self.state_dir, name)
            try:
                with open(path) as f:
                    doc = json.load(f)
            except (OSError, ValueError) as exc:
                self.error(f"lab/{name}", str(exc))
                continue
            self._write(f"lab/{name}", json.dumps(redact(doc), indent=2), f"the lab's {name}")
        try:
            from lace.lab import cluster
            st = cluster.status(self.lab_name, self.state_dir)
            self._write("lab/status.json", json.dumps(st, indent=2), "lace lab status")
        except Exception as exc:   # noqa: BLE001
            self.error("lace lab status", str(exc))

    def _logs(self) -> None:
        logs = os.path.join(self.state_dir, "logs")
        try:
            names = sorted(os.listdir(logs))
        except OSError as exc:
            self.error("logs", str(exc))
            return
        for name in names:
            path = os.path.join(logs, name)
            if not os.path.isfile(path):
                continue
            try:
                with open(path, "rb") as f:
                    text = f.read().decode(errors="replace")
            except OSError as exc:
                self.error(f"logs/{name}", str(exc))
                continue
            self._write(f"logs/{name}", redact_text(text), "log")

    def _store(self) -> None:
        from lace.store import kinds as K
        for info in K.KINDS:
            if info.kind in SECRET_KINDS:
                continue
            try:
                items = self.store.list(info.kind).items
            except Exception as exc:   # noqa: BLE001
                self.error(f"store {info.plural}", str(exc))
                continue
            doc = {"apiVersion": "v1", "kind": "List", "items": [redact(o) for o in items]}
            self._write(f"store/{info.plural}.json", json.dumps(doc, indent=2, default=str),
                        f"lace get {info.plural} -A -o json ({len(items)})")

    def _start_nodes(self, wanted: list[str] | None) -> dict[str, Any]:
        import subprocess

        from lace.cli.commands.exec import lab_env
        from lace.cli.fanout import spawn
        procs: dict[str, Any] = {}
        if self.lab is None:
            self.error("nodes", "the lab's namespaces are gone: no node state to collect")
            return procs
        for n in self.lab.nodes:
            if wanted and n.name not in wanted:
                continue
            outdir = os.path.join(self.root, "nodes", n.name)
            os.makedirs(outdir, exist_ok=True)
            try:
                procs[n.name] = spawn(n, [sys.executable, "-m", "lace.cli.sysdump", "node", outdir],
                                      lab_env(dict(os.environ, NO_COLOR="1"), self.state_dir, n))
            except (OSError, subprocess.SubprocessError) as exc:
                procs[n.name] = None
                self.error("node state", f"cannot run in {n.name}: {exc}", n.name)
        return procs

    def _finish_nodes(self, procs: dict[str, Any]) -> None:
        from lace.cli.fanout import wait_all
        outs = wait_all({name: p for name, p in procs.items() if p is not None}, self.node_timeout,
                        timeout_hint=None)
        for name, o in outs.items():
            if o.error is not None:   # no answer within the timeout
                self.error("node state", o.error, name)
                continue
            try:
                result = json.loads(o.stdout or "{}")
            except ValueError:
                result = {}
            if o.rc != 0 or not result:
                self.error("node state", _error_line(o.stderr) or f"exit status {o.rc}", name)
            for f in result.get("files") or ():
                rel = f"nodes/{name}/{f['file']}"
                self.files.append({"path": rel, "bytes": os.path.getsize(os.path.join(self.root, rel)),
                                   "what": f["what"]})
            for e in result.get("errors") or ():
                self.error(e["what"], e["error"], name)
            self.progress(f"{name}: {len(result.get('files') or ())} files"
                          + (f", {len(result.get('errors') or ())} errors" if result.get("errors") else ""))


def write_archive(root: str, out: str, top: str) -> None:
    """``root`` as ``out`` (.tar.gz), every path under ``top/``; written to a temporary name first."""
    import tarfile

    from lace.lab.files import replacing
    with replacing(out, prefix=".sysdump.", suffix=".tar.gz") as tmp:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(root, arcname=top)
        os.chmod(tmp, 0o600)


def _node_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "node":
        print("usage: python -m lace.cli.sysdump node OUTDIR", file=sys.stderr)
        return 2
    result = collect_node(argv[1], dict(os.environ))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_node_main(sys.argv[1:]))
