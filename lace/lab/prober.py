"""A lab node's prober: the process that opens the kubelet's network probes from the node's host.

    python -m lace.lab.prober --node NODE --fd FD [--lab-dir DIR]

The lab's kubelet is one process for every node, but a probe must leave from the node's host network
namespace *and* from a socket of the node's kubelet cgroup (``<node cgroup>/kubelet``): the datapath
lets only sockets of that cgroup into pods of isolated networks (lace.agent.probes). So the kubelet
starts one of these per node (``lace.lab.probing.ProberClient``: ``procs.spawn`` into the node's
namespace and kubelet cgroup) and asks it to run probes; it schedules them and acts on the results
itself.

The kubelet and the prober talk over a connected unix socket pair the kubelet creates (``--fd`` is
the prober's end, inherited): newline-delimited JSON, any number of requests in flight, answered in
the order they finish::

    -> {"id": 7, "handler": "httpGet", "host": "10.244.0.2", "port": 8080, "path": "/healthz",
        "scheme": "HTTP", "headers": [["X-A", "b"]], "timeout": 1}
    -> {"id": 8, "handler": "tcpSocket", "host": "fd00:10:244::2", "port": 53, "timeout": 1}
    <- {"id": 8, "result": "success", "message": "tcp connect succeeded"}
    <- {"id": 7, "result": "failure", "message": "HTTP probe failed with statuscode: 500"}

``result`` is ``success`` or ``failure`` as a kubelet decides: HTTP succeeds on a status of
200-399 (redirects are not followed), HTTPS without checking the certificate, TCP when the connection
is accepted; a probe not done within ``timeout`` seconds fails. ``unknown`` means the request itself
was bad (the kubelet discards such a result). Probes run concurrently (asyncio), so one node sustains
hundreds a second. The prober exits when the kubelet's end closes (the kubelet stopped or died:
nothing is left behind) and on SIGTERM.

Standard library only, and nothing else from lace: it starts in a few tens of ms.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import signal
import socket
import ssl
import sys
from typing import Any, Sequence

#: how much of a response body is read (a kubelet reads 10 KiB)
MAX_BODY = 10 * 1024
#: the User-Agent of an HTTP probe unless its headers set one
USER_AGENT = "kube-probe/lace"


def _hostport(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def _tls() -> ssl.SSLContext:
    # as a kubelet: HTTPS probes do not verify the server's certificate
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_request(host: str, port: int, path: str, headers: Sequence[Sequence[str]]) -> bytes:
    """The request an httpGet probe sends: Host, User-Agent, Accept and Connection: close, each
    replaced by a header of the probe's own of that name (as a kubelet does)."""
    base = {"host": ("Host", _hostport(host, port)), "user-agent": ("User-Agent", USER_AGENT),
            "accept": ("Accept", "*/*"), "connection": ("Connection", "close")}
    extra: list[tuple[str, str]] = []
    for name, value in headers:
        if name.lower() in base:
            base[name.lower()] = (name, value)
        else:
            extra.append((name, value))
    lines = [f"GET {path} HTTP/1.1"] + [f"{n}: {v}" for n, v in (*base.values(), *extra)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass


async def http_probe(req: dict[str, Any]) -> tuple[str, str]:
    host, port = req["host"], int(req["port"])
    tls = _tls() if str(req.get("scheme", "HTTP")).upper() == "HTTPS" else None
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    try:
        writer.write(http_request(host, port, req.get("path") or "/", req.get("headers") or ()))
        await writer.drain()
        status = await reader.readline()
        parts = status.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            return "failure", f"HTTP probe failed: malformed response {status[:80]!r}"
        code = int(parts[1])
        length = None
        while True:   # the headers: only Content-Length matters, to read the body without waiting
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value.strip())
        # read (some of) the body, so that closing does not reset a server still writing it
        if length is not None:
            await reader.readexactly(min(length, MAX_BODY))
        else:
            await reader.read(MAX_BODY)
    finally:
        await _close(writer)
    if 200 <= code < 400:
        return "success", f"HTTP probe succeeded with statuscode: {code}"
    return "failure", f"HTTP probe failed with statuscode: {code}"


async def tcp_probe(req: dict[str, Any]) -> tuple[str, str]:
    _reader, writer = await asyncio.open_connection(req["host"], int(req["port"]))
    await _close(writer)
    return "success", "tcp connect succeeded"


PROBES = {"httpGet": http_probe, "tcpSocket": tcp_probe}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the connection closed in the middle of the response"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host: {exc.strerror}"
    if isinstance(exc, OSError) and exc.errno and exc.errno > 0 and not isinstance(exc, ssl.SSLError):
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


async def run_probe(req: dict[str, Any]) -> dict[str, Any]:
    """One request's answer (see the module docstring)."""
    rid = req.get("id")
    fn = PROBES.get(req.get("handler"))  # type: ignore[arg-type]
    if fn is None or not req.get("host") or not isinstance(req.get("port"), int):
        return {"id": rid, "result": "unknown", "message": f"bad probe request {req!r}"}
    timeout = float(req.get("timeout") or 1)
    where = _hostport(req["host"], req["port"])
    try:
        async with asyncio.timeout(timeout):
            result, message = await fn(req)
    except TimeoutError:
        result, message = "failure", f"{req['handler']} {where}: no answer within {timeout:g}s"
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:   # ssl.SSLError is an OSError
        result, message = "failure", f"{req['handler']} {where}: {_reason(exc)}"
    return {"id": rid, "result": result, "message": message}


async def serve(sock: socket.socket) -> None:
    """Answer the requests arriving on ``sock`` until its other end closes."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    lock = asyncio.Lock()
    tasks: set[asyncio.Task] = set()

    async def one(req: dict[str, Any]) -> None:
        answer = await run_probe(req)
        async with lock:
            writer.write((json.dumps(answer) + "\n").encode())
            await writer.drain()

    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            try:
                req = json.loads(line)
            except ValueError:
                print(f"prober: ignoring a malformed request {line[:80]!r}", file=sys.stderr, flush=True)
                continue
            task = asyncio.create_task(one(req))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    except (ConnectionError, OSError):
        pass
    for task in tasks:
        task.cancel()
    await _close(writer)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lace.lab.prober", description=__doc__.split("\n")[0])
    parser.add_argument("--node", required=True, help="the node it probes from (for its log)")
    parser.add_argument("--fd", type=int, required=True, help="its end of the kubelet's unix socket pair")
    parser.add_argument("--lab-dir", help="the lab's state dir (names the lab in the command line only)")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"prober {args.node}: ready", file=sys.stderr, flush=True)
    asyncio.run(serve(sock))
    print(f"prober {args.node}: the kubelet closed its end, exiting", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
