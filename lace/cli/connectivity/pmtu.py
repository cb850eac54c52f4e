"""``python -m lace.cli.connectivity.pmtu HOST PORT --mtu N``: one UDP datagram that fills an MTU of N
exactly (N - 28 bytes of payload over IPv4, N - 48 over IPv6), sent with don't-fragment, must come
back whole from HOST:PORT (a UDP echo). Run inside a pod, with N its interface MTU.

Before sending it checks that the route's MTU is N (so the datagram really is full size) and that
one byte more is refused locally (EMSGSIZE: don't-fragment is in force). Prints one line; exit
status 0 when the echo came back, 1 otherwise. Standard library only: it starts in a fresh pod.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_MTU = 10, 2, 14
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO, IPV6_MTU = 23, 2, 24


def overhead(family: int) -> int:
    """IP + UDP header bytes."""
    return 48 if family == socket.AF_INET6 else 28


def check(host: str, port: int, mtu: int, timeout: float) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    size = mtu - overhead(family)
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.settimeout(timeout)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
        else:
            s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        s.connect((host, port))
        route_mtu = s.getsockopt(*((socket.IPPROTO_IPV6, IPV6_MTU) if family == socket.AF_INET6
                                   else (socket.IPPROTO_IP, IP_MTU)))
        if route_mtu != mtu:
            raise OSError(f"the route to {host} has MTU {route_mtu}, not {mtu}")
        try:
            s.send(b"\0" * (size + 1))
            raise OSError(f"{size + 1} bytes left without EMSGSIZE: don't-fragment is not in force")
        except OSError as exc:
            if exc.errno != errno.EMSGSIZE:
                raise
        payload = os.urandom(size)
        for _ in range(3):
            s.send(payload)
            try:
                data = s.recv(65535)
            except socket.timeout:
                continue
            if data == payload:
                return f"{size} bytes echoed whole at MTU {mtu} (don't-fragment)"
            raise OSError(f"the echo differs: {len(data)} bytes back for {size}")
        raise TimeoutError(f"no echo of {size} bytes from {host}:{port}")
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pmtu", description=__doc__.splitlines()[0])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--mtu", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=1.0)
    a = ap.parse_args(argv)
    try:
        print(check(a.host, a.port, a.mtu, a.timeout))
    except (OSError, TimeoutError) as exc:
        print(f"no answer from {a.host}:{a.port} (pmtu {a.mtu}): {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
