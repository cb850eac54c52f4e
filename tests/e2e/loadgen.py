"""A load generator for the fault tests, run inside a pod's namespace (``lace lab exec POD --
python tests/e2e/loadgen.py ...``): long TCP streams and new connections per second against lab
pods (``lace.lab.podserver`` answers each HTTP GET with the pod's name), counting what breaks.

  --hold HOST:PORT     one long stream: a keep-alive HTTP connection kept busy (a request every
                       10 ms) until the end; repeat for more streams. A stream that errors (reset,
                       closed, replaced by the server) or makes no progress for --stream-timeout
                       counts as broken (it is not reopened); a slower answer only shows in its
                       longest gap
  --connect HOST:PORT  new connections to HOST:PORT, --rate a second, each one HTTP GET on a fresh
                       connection with --timeout; repeat for more targets. A connection that is
                       refused, reset or times out counts as failed, with the wall time it started

It runs until SIGTERM (or SIGINT), then prints one JSON document: every stream (target, who
answered, requests, longest gap, broken and why) and every target's attempts (their wall start
times) and failures (wall time, error). Stdlib only, so it starts fast in a fresh namespace; exit status 0 once the
document is printed, 2 when no stream could even start.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
import time


def _target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (an IPv6 host in brackets: [fd00::1]:80)")
    return host.strip("[]"), int(port)


class Stream(threading.Thread):
    """One keep-alive HTTP connection kept busy until ``stop`` is set."""

    def __init__(self, host: str, port: int, timeout: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.timeout, self.stop = host, port, timeout, stop
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.answered = ""
        self.requests = 0
        self.worst_gap = 0.0
        self.broken: str | None = None
        self.broken_at: float | None = None

    def open(self) -> None:
        """Connect and make the first request (before the fault: a failure here is no break)."""
        self.conn.connect()
        self.local = self.conn.sock.getsockname()
        self.conn.request("GET", "/")
        self.answered = self.conn.getresponse().read().decode().strip()

    def run(self) -> None:
        last = time.monotonic()
        try:
            while not self.stop.is_set():
                self.conn.request("GET", "/")
                self.conn.getresponse().read()
                if self.conn.sock is None or self.conn.sock.getsockname() != self.local:
                    raise ConnectionError("the server closed the connection")
                self.requests += 1
                now = time.monotonic()
                self.worst_gap = max(self.worst_gap, now - last)
                last = now
                self.stop.wait(0.01)
        except (OSError, http.client.HTTPException) as e:
            self.broken, self.broken_at = f"{type(e).__name__}: {e}", time.time()
        finally:
            self.conn.close()

    def report(self) -> dict:
        return {"target": f"{self.host}:{self.port}", "answered": self.answered, "requests": self.requests,
                "worstGapMs": round(self.worst_gap * 1000), "broken": self.broken, "brokenAt": self.broken_at}


class Connector(threading.Thread):
    """New connections to one target, ``rate`` a second (paced by start time, so a slow attempt
    does not lower the rate below what it can reach), until ``stop`` is set."""

    def __init__(self, host: str, port: int, rate: float, timeout: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.rate, self.timeout, self.stop = host, port, rate, timeout, stop
        self.starts: list[float] = []
        self.answers: dict[str, int] = {}
        self.failures: list[tuple[float, str]] = []

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            started = time.time()
            self.starts.append(started)
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request("GET", "/")
                name = conn.getresponse().read().decode().strip()
                self.answers[name] = self.answers.get(name, 0) + 1
            except (OSError, http.client.HTTPException) as e:
                self.failures.append((started, f"{type(e).__name__}: {e}"))
            finally:
                conn.close()
            next_at += 1 / self.rate
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def report(self) -> dict:
        return {"target": f"{self.host}:{self.port}", "attempts": len(self.starts), "answers": self.answers,
                "starts": [round(t, 3) for t in self.starts], "failed": len(self.failures), "failures": self.failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="loadgen", description=__doc__.splitlines()[0])
    ap.add_argument("--hold", type=_target, action="append", default=[], metavar="HOST:PORT")
    ap.add_argument("--connect", type=_target, action="append", default=[], metavar="HOST:PORT")
    ap.add_argument("--rate", type=float, default=10.0, help="new connections a second, per --connect target")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds a new connection and its request may take")
    ap.add_argument("--stream-timeout", type=float, default=10.0,
                    help="seconds a stream may make no progress before it counts as broken (long past "
                         "TCP's own retransmissions after a lost packet)")
    ap.add_argument("--tag", default="", help="ignored: tells this run's process from others")
    a = ap.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    streams = [Stream(host, port, a.stream_timeout, stop) for host, port in a.hold]
    try:
        for s in streams:
            s.open()
    except (OSError, http.client.HTTPException) as e:
        print(f"a stream to {s.host}:{s.port} did not start: {e}", file=sys.stderr)
        return 2
    workers = streams + [Connector(host, port, a.rate, a.timeout, stop) for host, port in a.connect]
    for w in workers:
        w.start()
    # the streams are up: the test waits for this line before it starts the fault
    print("running", file=sys.stderr, flush=True)
    while not stop.wait(0.2):
        pass
    for w in workers:
        w.join(max(a.timeout, a.stream_timeout) + 5)
    print(json.dumps({"streams": [s.report() for s in streams],
                      "connect": [w.report() for w in workers if isinstance(w, Connector)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
