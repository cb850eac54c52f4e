"""The agent's local API: HTTP over a unix socket (CNI requests, health, status, metrics)."""

from __future__ import annotations

import json
import logging
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

import orjson

#: what orjson needs to take every document the agent serves (numbers of NumPy, int dict keys)
_ORJSON = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def ndjson_line(doc: Any) -> bytes:
    """One NDJSON line: orjson (several times faster than json on the flow stream), json for what
    orjson refuses (an integer past 64 bits)."""
    try:
        return orjson.dumps(doc, option=_ORJSON)
    except TypeError:
        return json.dumps(doc).encode() + b"\n"

log = logging.getLogger("lace.agent.api")

Handler = Callable[[dict[str, Any]], tuple[int, Any]]


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


class ApiServer:
    """Routes ``(method, path)`` to handlers returning (status, body): a JSON-able body, a
    ``(content-type, bytes)`` pair, or an iterator streamed until it ends or the client leaves —
    bare, NDJSON; as ``(content-type, iterator)``, of that type.  A streamed item is a JSON-able
    document (one NDJSON line) or bytes written as they are (the flow stream's raw frames)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.routes: dict[tuple[str, str], Handler] = {}
        self._server: _Server | None = None

    def route(self, method: str, path: str, fn: Handler) -> None:
        self.routes[(method, path)] = fn

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        api = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def address_string(self) -> str:  # unix sockets have no peer address
                return "local"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("api: " + fmt, *args)

            def _handle(self, method: str) -> None:
                path, _, query = self.path.partition("?")
                fn = api.routes.get((method, path))
                body: Any = {}
                length = (self.headers.get("Content-Length") or "0").strip()
                # a negative or non-numeric length (ASCII digits only: int() refuses '²'): nothing to read by
                if not (length.isascii() and length.isdigit()):
                    self.close_connection = True
                    self._send(400, {"error": f"Content-Length {length!r} is not a byte count"})
                    return
                n = int(length)
                if n:
                    try:
                        body = json.loads(self.rfile.read(n))
                    except (ValueError, RecursionError):
                        self._send(400, {"error": "request body is not JSON"})
                        return
                if not isinstance(body, dict):
                    self._send(400, {"error": f"request body is a JSON {type(body).__name__}, not an object"})
                    return
                body["_query"] = dict(p.partition("=")[::2] for p in query.split("&") if p)
                if fn is None:
                    allowed = sorted(m for m, p in api.routes if p == path)
                    if allowed:
                        self._send(405, {"error": f"{path} takes {', '.join(allowed)}, not {method}"})
                    else:
                        self._send(404, {"error": f"no route {method} {path}"})
                    return
                try:
                    status, out = fn(body)
                except Exception as e:  # a handler bug must not kill the agent
                    log.exception("api %s %s", method, path)
                    status, out = 500, {"error": f"{type(e).__name__}: {e}"}
                self._send(status, out)

            def _send(self, status: int, out: Any) -> None:
                if hasattr(out, "__next__"):
                    self._stream(status, "application/x-ndjson", out)
                    return
                if isinstance(out, tuple):
                    ctype, data = out
                    if hasattr(data, "__next__"):
                        self._stream(status, ctype, data)
                        return
                else:
                    ctype, data = "application/json", json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, status: int, ctype: str, lines: Any) -> None:
                """Each item as it comes (bytes as they are, a document as an NDJSON line), until
                the iterator ends or the client leaves."""
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    for doc in lines:
                        self.wfile.write(doc if isinstance(doc, bytes) else ndjson_line(doc))
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    close = getattr(lines, "close", None)
                    if close:
                        close()

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:      # no route takes them: 405 (or 404), as JSON
                self._handle("PUT")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                """The server's own refusals (a malformed request line, an unknown method) as a
                JSON error document like every other answer, not http.server's HTML page."""
                self.close_connection = True
                try:
                    self._send(code, {"error": message or explain or self.responses.get(code, ("error",))[0]})
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = _Server(self.path, H)
        os.chmod(self.path, 0o660)
        threading.Thread(target=self._server.serve_forever, name="api", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
