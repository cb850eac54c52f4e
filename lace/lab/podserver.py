"""What a lab pod runs: HTTP servers that answer with the pod's name and UDP echo servers, dual-stack.

    python -m lace.lab.podserver --name NS/POD --tcp 80 --tcp 8080 --udp 53 [--ready-file PATH]
                                 [--startup-delay SECONDS] [--delay-shutdown SECONDS]

Every TCP port answers any GET (or HEAD) with ``NS/POD\\n`` and status 200; every UDP port sends each
datagram back unchanged.  Each port is one IPv6 socket with IPV6_V6ONLY off, so IPv4 clients are
served too (as v4-mapped peers); where IPv6 is disabled it falls back to IPv4 only.  The ready
file is written once every socket is bound, so a client may connect as soon as it exists.
SIGTERM and SIGINT stop it with exit status 0.

``--delay-shutdown SECONDS`` (agnhost netexec's flag, which upstream's e2e tests of terminating
endpoints use) delays the stop after SIGTERM: the server goes on serving its connections, kept
ones and new ones, for that long and only then exits, as a workload draining through its grace
period does; ``/readyz`` answers 503 meanwhile, ``/healthz`` stays healthy (don't kill it, but send
it no new traffic). SIGINT still stops it at once. The log (stderr) has a line with the wall-clock
time (seconds since the epoch) of the SIGTERM and of the exit, so that tests can order them
against a preStop hook.

A health switch, one per process and flipped from inside the cluster (any client that reaches a TCP
port), lets tests make a pod fail its probes on purpose:

- ``GET /healthz``: 200 ``ok NS/POD`` while healthy, 500 ``unhealthy NS/POD`` after ``/fail``, and 503
  ``starting NS/POD`` during the first ``--startup-delay`` seconds (default 0) — the ports are bound
  at once, so a tcpSocket probe succeeds while an httpGet of /healthz still waits;
- ``GET /fail``: /healthz answers 500 from now on (200 ``failing NS/POD``);
- ``GET /recover``: /healthz is healthy again (200 ``recovered NS/POD``);
- ``GET /readyz``: as /healthz, but 503 ``shutting down NS/POD`` once SIGTERM came (agnhost's).

The switch lives in the process: a restarted server (the kubelet restarts a pod whose liveness probe
fails) is healthy again.  The lab's kubelet passes a pod's container ``args`` on to it, so
``args: ["--startup-delay", "5"]`` delays a pod's health.  HEAD answers as GET but flips nothing.

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
import time
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


class Health:
    """The process's health switch (see the module docstring)."""

    def __init__(self, startup_delay: float = 0.0) -> None:
        self.healthy_from = time.monotonic() + startup_delay
        self.failing = False
        #: SIGTERM came: still serving (--delay-shutdown), but no longer ready for new traffic
        self.shutting_down = False

    def status(self) -> tuple[int, str]:
        if self.failing:
            return 500, "unhealthy"
        if time.monotonic() < self.healthy_from:
            return 503, "starting"
        return 200, "ok"

    def readiness(self) -> tuple[int, str]:
        if self.shutting_down:
            return 503, "shutting down"
        code, word = self.status()
        return code, "ready" if code == 200 else word


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "lace-podserver"
    sys_version = ""
    # keep-alive: a client may hold one connection for many requests (the agent-restart test does)
    protocol_version = "HTTP/1.1"
    name = ""
    body = b"\n"
    health = Health()

    def _reply(self, flip: bool) -> tuple[int, bytes]:
        path = self.path.split("?", 1)[0]
        if path in ("/healthz", "/readyz"):
            code, word = self.health.status() if path == "/healthz" else self.health.readiness()
            return code, f"{word} {self.name}\n".encode()
        if path in ("/fail", "/recover"):
            if flip:
                self.health.failing = path == "/fail"
            return 200, f"{'failing' if path == '/fail' else 'recovered'} {self.name}\n".encode()
        return 200, self.body

    def _answer(self, with_body: bool) -> None:
        code, body = self._reply(flip=with_body)
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

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
    parser.add_argument("--startup-delay", type=float, default=0.0, metavar="SECONDS",
                        help="/healthz answers 503 for this long after the start")
    parser.add_argument("--delay-shutdown", type=float, default=0.0, metavar="SECONDS",
                        help="after SIGTERM, keep serving for this long before exiting (/readyz answers 503)")
    args = parser.parse_args(argv)
    if not args.tcp and not args.udp:
        parser.error("give at least one --tcp or --udp port")
    for flag in ("startup_delay", "delay_shutdown"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must be at least 0")

    # stop: a signal came; done: the servers are to stop (at once, or after --delay-shutdown)
    stop, at_once, done = threading.Event(), threading.Event(), threading.Event()
    signals: list[str] = []

    def on_signal(name: str) -> None:
        signals.append(name)
        if name == "SIGINT":
            at_once.set()
        stop.set()
    signal.signal(signal.SIGTERM, lambda *_: on_signal("SIGTERM"))
    signal.signal(signal.SIGINT, lambda *_: on_signal("SIGINT"))

    health = Health(args.startup_delay)
    handler = type("Handler", (_Handler,), {"name": args.name, "body": f"{args.name}\n".encode(),
                                            "health": health})
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
        threads.append(threading.Thread(target=_udp_echo, args=(sock, done), daemon=True))
    for t in threads:
        t.start()
    if args.ready_file:
        _write_ready(args.ready_file)
    print(f"podserver {args.name}: tcp {args.tcp} udp {args.udp}", file=sys.stderr, flush=True)
    while not stop.wait(3600):
        pass
    print(f"podserver {args.name}: {signals[0]} at {time.time():.3f}", file=sys.stderr, flush=True)
    if signals[0] == "SIGTERM" and args.delay_shutdown > 0:
        # drain as a real workload does through its grace period: every socket stays open and
        # served, only readiness says it is going (the kubelet's SIGKILL may come first)
        health.shutting_down = True
        print(f"podserver {args.name}: serving {args.delay_shutdown:g} s more before exiting",
              file=sys.stderr, flush=True)
        at_once.wait(args.delay_shutdown)
    print(f"podserver {args.name}: exiting at {time.time():.3f}", file=sys.stderr, flush=True)
    done.set()
    for srv in servers:
        srv.shutdown()
        srv.server_close()
    for sock in udp:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
