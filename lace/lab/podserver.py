"""What a lab pod runs: HTTP servers that answer with the pod's name and UDP echo servers, dual-stack.

    python -m lace.lab.podserver --name NS/POD --tcp 80 --tcp 8080 --udp 53 [--ready-file PATH]

Every TCP port answers any GET (or HEAD) with ``NS/POD\\n`` and status 200; every UDP port sends each
datagram back unchanged.  Each port is one IPv6 socket with IPV6_V6ONLY off, so IPv4 clients are
served too (as v4-mapped peers); where IPv6 is disabled it falls back to IPv4 only.  The ready
file is written once every socket is bound, so a client may connect as soon as it exists.
SIGTERM and SIGINT stop it with exit status 0.

Standard library only, and nothing else from lace: dozens of pods start this at once.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import socket
import socketserver
import sys
import threading
from typing import Sequence


def _dual_stack_socket(kind: int, port: int) -> socket.socket:
    try:
        sock = socket.socket(socket.AF_INET6, kind)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr: tuple[str, int] = ("::", port)
    except OSError:  # IPv6 disabled in this namespace
        sock = socket.socket(socket.AF_INET, kind)
        addr = ("0.0.0.0", port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "lace-podserver"
    sys_version = ""
    # keep-alive: a client may hold one connection for many requests (the agent-restart test does)
    protocol_version = "HTTP/1.1"
    body = b"\n"

    def _answer(self, with_body: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        if with_body:
            self.wfile.write(self.body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # one line per request would drown the pod's log


class _HTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, sock: socket.socket, handler: type[_Handler]) -> None:
        # adopt a bound socket instead of letting TCPServer make an IPv4-only one
        socketserver.BaseServer.__init__(self, sock.getsockname()[:2], handler)
        self.socket = sock
        self.address_family = sock.family
        self.server_address = sock.getsockname()[:2]
        self.socket.listen(128)


def _udp_echo(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            data, peer = sock.recvfrom(65535)
        except socket.timeout:
            continue
        except OSError:
            if stop.is_set():
                return
            raise
        try:
            sock.sendto(data, peer)
        except OSError:
            pass  # an unreachable peer must not stop the echo for everybody else


def _write_ready(path: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("ready\n")
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lace.lab.podserver", description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="NS/POD: what HTTP answers with")
    parser.add_argument("--tcp", type=int, action="append", default=[], metavar="PORT", help="HTTP port (repeatable)")
    parser.add_argument("--udp", type=int, action="append", default=[], metavar="PORT", help="UDP echo port (repeatable)")
    parser.add_argument("--ready-file", help="written with 'ready' once every port is bound")
    args = parser.parse_args(argv)
    if not args.tcp and not args.udp:
        parser.error("give at least one --tcp or --udp port")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    handler = type("Handler", (_Handler,), {"body": f"{args.name}\n".encode()})
    servers: list[_HTTPServer] = []
    udp: list[socket.socket] = []
    threads: list[threading.Thread] = []
    try:
        for port in args.tcp:
            servers.append(_HTTPServer(_dual_stack_socket(socket.SOCK_STREAM, port), handler))
        for port in args.udp:
            udp.append(_dual_stack_socket(socket.SOCK_DGRAM, port))
    except OSError as exc:
        print(f"podserver {args.name}: cannot bind: {exc}", file=sys.stderr)
        return 1
    for srv in servers:
        threads.append(threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True))
    for sock in udp:
        threads.append(threading.Thread(target=_udp_echo, args=(sock, stop), daemon=True))
    for t in threads:
        t.start()
    if args.ready_file:
        _write_ready(args.ready_file)
    print(f"podserver {args.name}: tcp {args.tcp} udp {args.udp}", file=sys.stderr, flush=True)
    while not stop.wait(3600):
        pass
    for srv in servers:
        srv.shutdown()
        srv.server_close()
    for sock in udp:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
