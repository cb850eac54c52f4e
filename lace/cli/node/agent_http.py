"""HTTP to a node's agent on its unix socket (``LACE_AGENT_SOCKET``) with the stdlib's http.client,
for the commands that read a streamed or long answer (``node trace flow``, ``node verify``,
``lace observe``). Kept out of :mod:`lace.cli.node.env`, which every node command imports, and out
of :mod:`lace.cni.client`, the CNI plugin's few-millisecond transport: http.client costs ~20 ms to
import. Each caller turns an unreachable agent (``OSError``) into its own message."""

from __future__ import annotations

import http.client
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection to the unix socket ``path`` (``timeout``: seconds, None for no limit)."""

    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)
