"""A small client for the agent's unix-socket API (stdlib only, so the CNI plugin stays fast)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class AgentUnavailable(Exception):
    """The agent's socket is missing or refuses connections."""


def call(path: str, method: str, url: str, body: dict[str, Any] | None = None,
         timeout: float = 30.0) -> tuple[int, Any]:
    conn = _UnixConnection(path, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        try:
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError, socket.timeout, OSError) as e:
            raise AgentUnavailable(f"agent at {path} is not answering: {e}") from None
        raw = resp.read()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, (json.loads(raw) if "json" in ctype and raw else raw)
    finally:
        conn.close()
