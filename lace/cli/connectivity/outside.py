"""The test's server in the lab's outside namespace (the lab's internet): TCP answers an HTTP
request with the client's address as it arrived, UDP echoes each datagram from the address it was
sent to; both remember who came (address and source port). Ports are picked by the kernel, so runs never collide."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading


def _addr(peer: str) -> str:
    a = ipaddress.ip_address(peer.split("%")[0])
    return str(a.ipv4_mapped) if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped else str(a)


class OutsideServer:
    def __init__(self, netns: str, internet4: str, internet6: str) -> None:
        from lace.nsenter import entered
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen: list[tuple[str, str, int]] = []   # (proto, address, source port)
        with entered(netns):   # sockets keep the namespace they were made in
            self.tcp = self._socket(socket.SOCK_STREAM, "::", 0)
            self.tcp_port = self.tcp.getsockname()[1]
            u4 = self._socket(socket.SOCK_DGRAM, "::ffff:" + internet4, 0)
            self.udp_port = u4.getsockname()[1]
            self.udp = [u4, self._socket(socket.SOCK_DGRAM, internet6, self.udp_port)]
        self.tcp.listen(64)
        for s in (self.tcp, *self.udp):
            s.settimeout(0.2)
        self._threads = [threading.Thread(target=self._serve_tcp, daemon=True, name="outside-tcp")] + [
            threading.Thread(target=self._serve_udp, args=(u,), daemon=True, name="outside-udp") for u in self.udp]
        for t in self._threads:
            t.start()

    @staticmethod
    def _socket(kind: int, addr: str, port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            s.bind((addr, port))
        except OSError:
            s.close()
            raise
        return s

    def _note(self, proto: str, peer: tuple) -> str:
        addr = _addr(peer[0])
        with self._lock:
            self._seen.append((proto, addr, peer[1]))
        return addr

    def _serve_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.tcp.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                addr = self._note("tcp", peer)
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    body = f"{addr}\n".encode()
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def _serve_udp(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data, peer = sock.recvfrom(4096)
            except (socket.timeout, OSError):
                continue
            self._note("udp", peer)
            with contextlib.suppress(OSError):
                sock.sendto(data, peer)

    def seen(self, proto: str) -> set[str]:
        with self._lock:
            return {a for p, a, _ in self._seen if p == proto}

    def ports(self, proto: str, addr: str) -> set[int]:
        """The source ports ``addr`` came from over ``proto``."""
        with self._lock:
            return {port for p, a, port in self._seen if p == proto and a == addr}

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        for s in (self.tcp, *self.udp):
            s.close()
