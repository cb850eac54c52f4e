"""``lace-cni``: a thin CNI 1.1 plugin that hands each request to the node agent.

The runtime sets ``CNI_*`` in the environment and writes the network configuration on stdin; the
result (or a CNI error) goes to stdout as JSON. The agent does the work — addresses, interfaces,
maps, the program — so this stays a stdlib-only process that starts in a few milliseconds.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping, TextIO

from lace.agent.client import AgentUnavailable, call

SUPPORTED_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
DEFAULT_SOCKET = "/run/lace/agent.sock"

# CNI spec error codes
E_INCOMPATIBLE = 1
E_INVALID_ENV = 4
E_IO = 5
E_DECODE = 6
E_INVALID_CONFIG = 7
E_TRY_AGAIN = 11
E_NOT_READY = 50


def _error(code: int, msg: str, details: str = "", version: str = "1.1.0") -> dict[str, Any]:
    return {"cniVersion": version, "code": code, "msg": msg, "details": details}


def _cni_args(raw: str) -> dict[str, str]:
    out = {}
    for part in raw.split(";"):
        k, sep, v = part.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def run(env: Mapping[str, str], stdin: TextIO) -> tuple[int, dict[str, Any] | None]:
    command = env.get("CNI_COMMAND", "")
    if command == "VERSION":
        return 0, {"cniVersion": "1.1.0", "supportedVersions": SUPPORTED_VERSIONS}
    try:
        conf = json.loads(stdin.read() or "{}")
    except ValueError as e:
        return 1, _error(E_DECODE, f"network configuration on stdin is not JSON: {e}")
    version = conf.get("cniVersion", "1.1.0")
    if version not in SUPPORTED_VERSIONS:
        return 1, _error(E_INCOMPATIBLE, f"cniVersion {version} is not supported",
                         f"supported: {', '.join(SUPPORTED_VERSIONS)}")
    socket_path = conf.get("agentSocket") or env.get("LACE_AGENT_SOCKET") or DEFAULT_SOCKET
    if command == "STATUS":
        try:
            status, body = call(socket_path, "GET", "/healthz", timeout=5)
        except AgentUnavailable as e:
            return 1, _error(E_NOT_READY, "the lace agent is not ready", str(e), version)
        return (0, None) if status == 200 else (1, _error(E_NOT_READY, "the lace agent is not healthy",
                                                           json.dumps(body), version))
    if command not in ("ADD", "DEL", "CHECK", "GC"):
        return 1, _error(E_INVALID_ENV, f"CNI_COMMAND {command!r} is not one of ADD, DEL, CHECK, GC, STATUS, VERSION",
                         version=version)
    cid = env.get("CNI_CONTAINERID", "")
    if command != "GC" and not cid:
        return 1, _error(E_INVALID_ENV, "CNI_CONTAINERID is required", version=version)
    req = {
        "command": command, "containerID": cid, "netns": env.get("CNI_NETNS", ""),
        "ifname": env.get("CNI_IFNAME", "eth0"), "args": _cni_args(env.get("CNI_ARGS", "")),
        "config": conf,
    }
    try:
        status, body = call(socket_path, "POST", "/v1/cni", req, timeout=60)
    except AgentUnavailable as e:
        if command == "DEL":
            # DEL must succeed when there is nothing left to delete; with no agent the runtime
            # retries later, as the spec allows for a temporary failure
            return 1, _error(E_TRY_AGAIN, "the lace agent is not reachable; retry DEL", str(e), version)
        return 1, _error(E_TRY_AGAIN, "the lace agent is not reachable", str(e), version)
    if status != 200:
        body = body if isinstance(body, dict) else {"code": E_IO, "msg": str(body)}
        body.setdefault("cniVersion", version)
        return 1, body
    if command == "ADD":
        body["cniVersion"] = version
        return 0, body
    return 0, None


def main() -> int:
    code, out = run(os.environ, sys.stdin)
    if out is not None:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
