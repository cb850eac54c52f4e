"""The CNI plugin's transport to the node agent: one HTTP/1.1 request per connection on the agent's
unix socket (served by ``lace.agent.api``), stdlib ``socket`` and ``json`` only, so the plugin
starts in a few milliseconds. The lab uses it too, to wait for an agent's health."""

from __future__ import annotations

import json
import socket
TYPE_CHECKING = False   # as in lace.cni.plugin: typing only for the annotations
if TYPE_CHECKING:
    from typing import Any


class AgentUnavailable(Exception):
    """The agent's socket is missing, refuses connections or does not answer in time."""


def read_all(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (the agent answers with Connection: close)."""
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def call(path: str, method: str, url: str, body: dict[str, Any] | None = None,
         timeout: float = 30.0) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body — or raw bytes for other content types)."""
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {url} HTTP/1.1\r\nHost: lace-agent\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(path)
            s.sendall(head + data)
            raw = read_all(s)
        except (FileNotFoundError, ConnectionRefusedError, socket.timeout, OSError) as e:
            raise AgentUnavailable(f"agent at {path} is not answering: {e}") from None
    finally:
        s.close()
    header, _, payload = raw.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise AgentUnavailable(f"agent at {path} sent no HTTP answer") from None
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if "json" in headers.get("content-type", "") and payload:
        return status, json.loads(payload)
    return status, payload
