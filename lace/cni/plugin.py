"""``lace-cni``: a thin CNI 1.1 plugin that hands each request to the node agent.

The runtime sets ``CNI_*`` in the environment and writes the network configuration on stdin; the
result (or a CNI error) goes to stdout as JSON. The agent does the work — addresses, interfaces,
maps, the program — so this process imports only the stdlib and ``lace.cni`` (its constants and
its transport to the agent) and starts in a few milliseconds.
"""

from __future__ import annotations

import json
import os
import sys
#: typing adds ~4 ms to every plugin start (it pulls in half the stdlib); its names serve the
#: annotations only, which ``from __future__ import annotations`` never evaluates
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, TextIO

from lace.cni.client import AgentUnavailable, call
from lace.cni.spec import (CNI_VERSION, E_DECODE, E_INCOMPATIBLE, E_INVALID_CONFIG, E_INVALID_ENV, E_IO, E_NOT_READY,
                           E_TRY_AGAIN, SUPPORTED_VERSIONS, error_result)

DEFAULT_SOCKET = "/run/lace/agent.sock"


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
        return 0, {"cniVersion": CNI_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)}
    try:
        conf = json.loads(stdin.read() or "{}")
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError too: stdin that is not UTF-8
        return 1, error_result(E_DECODE, f"network configuration on stdin is not JSON: {e}")
    if not isinstance(conf, dict):
        return 1, error_result(E_DECODE, f"network configuration on stdin is a JSON {type(conf).__name__}, "
                                         "not an object")
    version = conf.get("cniVersion", CNI_VERSION)
    if not isinstance(version, str) or version not in SUPPORTED_VERSIONS:
        return 1, error_result(E_INCOMPATIBLE, f"cniVersion {version!r} is not supported",
                         f"supported: {', '.join(SUPPORTED_VERSIONS)}")
    socket_path = conf.get("agentSocket") or env.get("LACE_AGENT_SOCKET") or DEFAULT_SOCKET
    if not isinstance(socket_path, str) or "\0" in socket_path:
        return 1, error_result(E_INVALID_CONFIG, f"agentSocket {socket_path!r} is not a socket path",
                               version=version)
    if command == "STATUS":
        try:
            status, body = call(socket_path, "GET", "/healthz", timeout=5)
        except AgentUnavailable as e:
            return 1, error_result(E_NOT_READY, "the lace agent is not ready", str(e), version)
        return (0, None) if status == 200 else (1, error_result(E_NOT_READY, "the lace agent is not healthy",
                                                           json.dumps(body), version))
    if command not in ("ADD", "DEL", "CHECK", "GC"):
        return 1, error_result(E_INVALID_ENV, f"CNI_COMMAND {command!r} is not one of ADD, DEL, CHECK, GC, STATUS, VERSION",
                         version=version)
    cid = env.get("CNI_CONTAINERID", "")
    if command != "GC" and not cid:
        return 1, error_result(E_INVALID_ENV, "CNI_CONTAINERID is required", version=version)
    req = {
        "command": command, "containerID": cid, "netns": env.get("CNI_NETNS", ""),
        "ifname": env.get("CNI_IFNAME", "eth0"), "args": _cni_args(env.get("CNI_ARGS", "")),
        "config": conf,
    }
    try:
        status, body = call(socket_path, "POST", "/v1/cni", req, timeout=60)
    except AgentUnavailable as e:
        # a temporary failure for every command, DEL included: without the agent nothing can be
        # released, and the runtime retries a DEL that failed (the spec's "try again later")
        return 1, error_result(E_TRY_AGAIN, "the lace agent is not reachable", str(e), version)
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
