"""``python -m lace.lab.netcheck``: the lab's connectivity probe, run inside a pod's namespace.

  netcheck tcp HOST PORT      HTTP GET; prints the answer (lab pods answer with their name);
                              --count N: N connections one after another, one answer per line;
                              --sport P: from source port P (P+1, ... for the next ones),
                              closed with a reset so the same ports can be used again at once
  netcheck udp HOST PORT      one datagram; prints the echo, which must come from HOST:PORT
  netcheck hold HOST PORT S   one TCP connection kept busy for S seconds; prints who answered and
                              the longest gap

Exit status 0 when the peer answered, 1 when it did not (timeout, refused, unreachable).
Stdlib only, so that it starts fast in a fresh namespace.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import struct
import sys
import time


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def tcp(host: str, port: int, timeout: float, sport: int | None = None) -> str:
    conn = http.client.HTTPConnection(host, port, timeout=timeout,
                                      source_address=("", sport) if sport else None)
    try:
        conn.request("GET", "/")
        answer = conn.getresponse().read().decode().strip()
        if sport and conn.sock is not None:
            # close with a reset: no TIME_WAIT, so the same source port (and tuple) can come again
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return answer
    finally:
        conn.close()


def udp(host: str, port: int, timeout: float) -> str:
    s = socket.socket(_family(host), socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        payload = f"lace-netcheck {time.monotonic_ns()}".encode()
        for _ in range(3):   # a datagram may be lost; a reply must echo ours exactly
            s.sendto(payload, (host, port))
            try:
                data, peer = s.recvfrom(2048)
            except socket.timeout:
                continue
            # an answer from another address is not an answer (a service must reply as its VIP)
            if data == payload and peer[0] == host and peer[1] == port:
                return data.decode()
        raise TimeoutError(f"no echo from {host}:{port}")
    finally:
        s.close()


def hold(host: str, port: int, seconds: float, timeout: float) -> str:
    """Keep one TCP connection busy with back-to-back HTTP requests for ``seconds``; fail if the
    connection breaks or is replaced, and report the longest gap between answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    requests, worst = 0, 0.0
    try:
        conn.connect()
        local = conn.sock.getsockname()
        conn.request("GET", "/")
        name = conn.getresponse().read().decode().strip()
        last = time.monotonic()
        end = last + seconds
        while time.monotonic() < end:
            conn.request("GET", "/")
            conn.getresponse().read()
            if conn.sock is None or conn.sock.getsockname() != local:
                raise ConnectionError("the server closed the connection")
            requests += 1
            now = time.monotonic()
            worst = max(worst, now - last)
            last = now
            time.sleep(0.002)
    finally:
        conn.close()
    return f"answered by {name}\n{requests} requests on one connection, longest gap {worst * 1000:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="netcheck", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("tcp", "udp", "hold"))
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("seconds", type=float, nargs="?", default=5.0)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--count", type=int, default=1, help="tcp: connections, one after another")
    ap.add_argument("--sport", type=int, help="tcp: source port of the first connection")
    a = ap.parse_args(argv)
    try:
        if a.mode == "tcp":
            out = "\n".join(tcp(a.host, a.port, a.timeout, a.sport + i if a.sport else None)
                            for i in range(a.count))
        elif a.mode == "udp":
            out = udp(a.host, a.port, a.timeout)
        else:
            out = hold(a.host, a.port, a.seconds, a.timeout)
    except (OSError, TimeoutError, http.client.HTTPException) as e:
        print(f"no answer from {a.host}:{a.port} ({a.mode}): {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
