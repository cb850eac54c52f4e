"""Traffic between the lab's pods and its outside namespace (the lab's internet, 203.0.113.1 and
2001:db8:cafe::1): a server there sees a pod's flows from the pod's node address when the pod's
network masquerades to the outside, and from the pod's own address when it does not."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import uuid

import pytest

from lace.lab import topology
from lace.nsenter import entered

from .conftest import NETCHECK, ips, network, pod
from .test_nodestate import node_cmd, node_json
from .test_services import wait_until

INTERNET = {4: topology.INTERNET4, 6: topology.INTERNET6}
TCP_PORT, UDP_PORT = 18080, 18053
NODES = ("worker-1", "worker-2", "worker-3")


def _addr(peer: str) -> str:
    """A dual-stack socket's peer as the client sent it (v4-mapped addresses unwrapped)."""
    a = ipaddress.ip_address(peer.split("%")[0])
    return str(a.ipv4_mapped) if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped else str(a)


class OutsideServer:
    """A TCP and a UDP server in the lab's outside namespace: TCP (on every address there) answers
    an HTTP request with the client's address, UDP (one socket per internet address, so that an
    echo leaves from the address it was sent to) echoes each datagram; both remember who came."""

    def __init__(self, netns: str, tcp_port: int = TCP_PORT, udp_port: int = UDP_PORT) -> None:
        self.seen: list[tuple[str, str, int]] = []   # (proto, address, port)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        with entered(netns):   # sockets keep the namespace they were made in
            self.tcp = self._socket(socket.SOCK_STREAM, "::", tcp_port)
            self.udp = [self._socket(socket.SOCK_DGRAM, "::ffff:" + INTERNET[4], udp_port),
                        self._socket(socket.SOCK_DGRAM, INTERNET[6], udp_port)]
        self.tcp.listen(64)
        self.tcp.settimeout(0.2)
        for u in self.udp:
            u.settimeout(0.2)
        self._threads = [threading.Thread(target=self._serve_tcp, daemon=True)] + [
            threading.Thread(target=self._serve_udp, args=(u,), daemon=True) for u in self.udp]
        for t in self._threads:
            t.start()

    @staticmethod
    def _socket(kind: int, addr: str, port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        return s

    def _note(self, proto: str, peer) -> str:
        addr = _addr(peer[0])
        with self._lock:
            self.seen.append((proto, addr, peer[1]))
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
                data, peer = sock.recvfrom(2048)
            except (socket.timeout, OSError):
                continue
            self._note("udp", peer)
            with contextlib.suppress(OSError):
                sock.sendto(data, peer)

    def peers(self, proto: str) -> set[str]:
        with self._lock:
            return {a for p, a, _ in self.seen if p == proto}

    def ports(self, proto: str, addr: str) -> set[int]:
        with self._lock:
            return {port for p, a, port in self.seen if p == proto and a == addr}

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        self.tcp.close()
        for u in self.udp:
            u.close()


@pytest.fixture
def outside(lab):
    srv = OutsideServer(lab.status()["outside"])
    try:
        yield srv
    finally:
        srv.close()


def node_addr(lab, node: str, family: int) -> str:
    """The node's address the outside sees masqueraded flows from (its InternalIP of family)."""
    _, out, _ = lab.lace("get", "nodes", node, "-o", "json")
    import json
    addrs = [a["address"] for a in json.loads(out)["status"]["addresses"] if a["type"] == "InternalIP"]
    return next(a for a in addrs if ipaddress.ip_address(a).version == family)


def send_datagram(lab, client: str, host: str, port: int, payload: str) -> None:
    """One UDP datagram from the pod, no answer awaited."""
    code = (f"import socket; s = socket.socket(socket.AF_INET6 if ':' in {host!r} else socket.AF_INET, "
            f"socket.SOCK_DGRAM); s.sendto({payload!r}.encode(), ({host!r}, {port}))")
    rc, out = lab.exec(client, "python3", "-c", code)
    assert rc == 0, out


def test_the_lab_keeps_node_ports_below_the_masquerade_range(lab):
    from lace.datapath.masquerade import EPHEMERAL_PORT_RANGE, MASQ_PORT_MIN
    from lace import netlink
    for node in NODES:
        low, high = (int(x) for x in netlink.sysctl(topology.netns_name(lab.name, node),
                                                     "net.ipv4.ip_local_port_range").split())
        assert (low, high) == EPHEMERAL_PORT_RANGE and high < MASQ_PORT_MIN


def test_masquerade_hides_pods_behind_their_node_address(lab, ns, outside):
    net = f"masq-{uuid.uuid4().hex[:6]}"
    lab.apply([network(net, "10.91.0.0/16", "fd91::/64", routes=[{"to": "outside", "masquerade": True}])])
    lab.apply([pod(f"c{i}", ns, n, net) for i, n in enumerate(NODES[:2])])
    lab.wait(ns, ["c0", "c1"])
    for i, node in enumerate(NODES[:2]):
        client = f"{ns}/c{i}"
        for family in (4, 6):
            want = node_addr(lab, node, family)
            rc, out = lab.exec(client, *NETCHECK, "tcp", INTERNET[family], str(TCP_PORT), "--timeout", "3")
            assert rc == 0 and out.strip() == want, f"{client} -> {INTERNET[family]} over TCP: {out}"
            ok, out = lab.check(client, "udp", INTERNET[family], UDP_PORT, timeout=3)
            assert ok, f"{client} -> {INTERNET[family]} over UDP: {out}"
            assert want in outside.peers("udp")
            rc, out = lab.exec(client, "ping", "-c", "1", "-W", "3", INTERNET[family])
            assert rc == 0, f"{client} pings {INTERNET[family]}: {out}"
            # from the masquerade range, never a pod address
            assert all(49152 <= p <= 65535 for p in outside.ports("tcp", want)), outside.seen
    pod_addrs = {a for i in range(2) for a in ips(lab.pods(ns)[f"c{i}"]) if a}
    assert not pod_addrs & (outside.peers("tcp") | outside.peers("udp")), outside.seen
    # the node shows the translation: the pod's entry and its port reservation
    text = str(node_json(lab, "worker-1", "ct", "list", "all", "-n"))
    assert node_addr(lab, "worker-1", 4) in text and "masq" in text
    assert_routed_outside(lab, net, masquerade=True)


def assert_routed_outside(lab, net: str, masquerade: bool) -> None:
    """node bpf show routing: the network's default routes lead outside, masquerading or not."""
    _, out = node_cmd(lab, "worker-1", "bpf", "show", "routing")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [net]]
    for prefix in ("0.0.0.0/0", "::/0"):
        assert [net, prefix, "outside", "yes" if masquerade else "no"] in rows, out


def test_without_masquerade_the_outside_sees_the_pod(lab, ns, outside):
    net = f"open-{uuid.uuid4().hex[:6]}"
    lab.apply([network(net, "10.92.0.0/16", "fd92::/64", routes=[{"to": "outside"}])])
    lab.apply([pod("c", ns, "worker-2", net)])
    pods = lab.wait(ns, ["c"])
    v4, v6 = ips(pods["c"])
    for family, addr in ((4, v4), (6, v6)):
        send_datagram(lab, f"{ns}/c", INTERNET[family], UDP_PORT, "unmasqueraded")
        wait_until(lambda: addr in outside.peers("udp"), f"the outside to see {addr}", timeout=10)
    assert_routed_outside(lab, net, masquerade=False)
