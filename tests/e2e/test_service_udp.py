"""UDP through a Service whose backend is replaced, as a resolver, a game or a telemetry client
sees it: the client sends from one fixed source port the whole time, so every datagram renews its
conntrack entry. When the backend pod is deleted and another one comes up, the client's next
datagrams must reach the new pod (the agent deletes the flows to a backend that left its service),
for a ClusterIP from a pod on another node, for a NodePort and a LoadBalancer address from the
outside, and for a host process's connected socket (socket-level translation: terminated, it
connects again), IPv4 and IPv6."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from lace.lab import topology
from lace.lab.kubelet import sandbox_netns
from lace.nsenter import entered

from .conftest import ips, pod, wait_for
from .test_nodestate import node_json
from .test_outside import node_addr

INTERNET = {4: topology.INTERNET4, 6: topology.INTERNET6}
SPORT = 40123


class FixedPortClient:
    """A UDP socket made in a network namespace and bound to one source port there; the test
    process sends through it, as a client that never changes its port."""

    def __init__(self, netns: str, family: int, bind: str = "") -> None:
        with entered(netns):
            self.sock = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM)
            if family == 6:   # the IPv4 client binds the same port
                self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            self.sock.bind((bind, SPORT))

    def echo(self, addr: str, port: int, timeout: float = 0.3) -> bool:
        """One datagram to addr:port: whether its echo came back from addr:port."""
        payload = f"lace-udp {id(self)} {addr}".encode()
        self.sock.settimeout(timeout)
        self.sock.sendto(payload, (addr, port))
        try:
            while True:
                data, peer = self.sock.recvfrom(2048)
                if data == payload:
                    return ipaddress.ip_address(peer[0]) == ipaddress.ip_address(addr) and peer[1] == port
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()


def udp_service(name: str, ns: str, type_: str = "ClusterIP") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"type": type_, "selector": {"app": name}, "ipFamilyPolicy": "PreferDualStack",
                     "ports": [{"name": "echo", "port": 5300, "protocol": "UDP", "targetPort": 53}]}}


def backend_of(lab, node: str, client_port: int, frontend_port: int) -> set[str]:
    """The backends node's UDP service flows from client_port to frontend_port name."""
    out = set()
    for table in ("ct-udp-v4", "ct-udp-v6"):
        for e in node_json(lab, node, "-n", "ct", "list", table)["entries"]:
            if e["sport"] == client_port and e["dport"] == frontend_port and e.get("nat_addr"):
                out.add(e["nat_addr"])
    return out


def active(lab, node: str, vip: str, port: int) -> int | None:
    """The active backends node's services map holds for vip:port."""
    for e in node_json(lab, node, "bpf", "show", "services", "-n")["entries"]:
        if e["addr"] == vip and e["port"] == port:
            return e["active_count"]
    return None


def replace_backend(lab, ns: str, name: str, old: str, new_node: str) -> tuple[str, str]:
    """Delete pod ``old`` at once and start ``name-b`` on new_node with the service's label; its
    addresses."""
    lab.lace("delete", "pod", old, "-n", ns, "--grace-period", "0")
    lab.apply([pod(f"{name}-b", ns, new_node, labels={"app": name}, tcp=(), udp=(53,))])
    return ips(lab.wait(ns, [f"{name}-b"])[f"{name}-b"])


def test_a_udp_client_on_one_port_follows_its_clusterip_to_the_new_backend(lab, ns):
    lab.apply([pod("echo-a", ns, "worker-2", labels={"app": "echo"}, tcp=(), udp=(53,)),
               pod("cli", ns, "worker-1", tcp=(), udp=())])
    ps = lab.wait(ns, ["echo-a", "cli"])
    lab.apply([udp_service("echo", ns)])
    svc = lab.lace("get", "services", "echo", "-n", ns, "-o", "json")[1]
    vips = json.loads(svc)["spec"]["clusterIPs"]
    netns = sandbox_netns(lab.name, ps["cli"]["metadata"]["uid"])
    clients = {vip: FixedPortClient(netns, 6 if ":" in vip else 4) for vip in vips}
    try:
        for vip, c in clients.items():
            wait_for(lambda: c.echo(vip, 5300), f"echo through {vip}:5300", timeout=30)
        old = set(ips(ps["echo-a"]))
        assert backend_of(lab, "worker-1", SPORT, 5300) == old
        new = set(replace_backend(lab, ns, "echo", "echo-a", "worker-3"))
        # the same source port, datagram after datagram: each one renewed the stale entry before
        for vip, c in clients.items():
            wait_for(lambda: c.echo(vip, 5300), f"{vip}:5300 answering the same client port from echo-b",
                     timeout=20)
        assert backend_of(lab, "worker-1", SPORT, 5300) == new
    finally:
        for c in clients.values():
            c.close()


def test_a_udp_client_on_one_port_follows_a_nodeport_to_the_new_backend(lab, ns):
    lab.apply([pod("np-a", ns, "worker-2", labels={"app": "np"}, tcp=(), udp=(53,))])
    ps = lab.wait(ns, ["np-a"])
    lab.apply([udp_service("np", ns, "NodePort")])
    svc = json.loads(lab.lace("get", "services", "np", "-n", ns, "-o", "json")[1])
    port = int(svc["spec"]["ports"][0]["nodePort"])
    outside = lab.status()["outside"]
    # worker-1 translates; the backend is on worker-2, then worker-3
    addrs = {f: node_addr(lab, "worker-1", f) for f in (4, 6)}
    clients = {f: FixedPortClient(outside, f, INTERNET[f]) for f in (4, 6)}
    try:
        for f, c in clients.items():
            wait_for(lambda: c.echo(addrs[f], port), f"echo through {addrs[f]}:{port}", timeout=30)
        assert backend_of(lab, "worker-1", SPORT, port) == set(ips(ps["np-a"]))
        new = set(replace_backend(lab, ns, "np", "np-a", "worker-3"))
        for f, c in clients.items():
            wait_for(lambda: c.echo(addrs[f], port), f"{addrs[f]}:{port} answering the same client port from np-b",
                     timeout=20)
        assert backend_of(lab, "worker-1", SPORT, port) == new
    finally:
        for c in clients.values():
            c.close()


def test_a_udp_client_on_one_port_follows_a_load_balancer_address_to_the_new_backend(lab, ns):
    """After the NodePort test, from the same client port: its backend np-a's address is often
    given to lb-a here, and the flow worker-1 relayed to np-a must have gone with np-a (its entry on
    worker-2 is keyed in the outside's network, not the pod's), or lb-a's replies are dropped."""
    lab.apply([{"apiVersion": "lace.dev/v1alpha1", "kind": "LoadBalancerIPPool", "metadata": {"name": "lab"},
                "spec": {"cidrs": ["198.18.100.0/24", "2001:db8:1b::/112"]}}])
    lab.apply([pod("lb-a", ns, "worker-2", labels={"app": "lb"}, tcp=(), udp=(53,))])
    ps = lab.wait(ns, ["lb-a"])
    lab.apply([udp_service("lb", ns, "LoadBalancer")])
    svc = json.loads(lab.lace("get", "services", "lb", "-n", ns, "-o", "json")[1])
    ingress = {6 if ":" in i["ip"] else 4: i["ip"] for i in svc["status"]["loadBalancer"]["ingress"]}
    outside = lab.status()["outside"]
    clients = {f: FixedPortClient(outside, f, INTERNET[f]) for f in (4, 6)}
    try:
        for f, c in clients.items():
            # the address allocated, then programmed on worker-1 (where the outside routes the pool)
            wait_for(lambda: active(lab, "worker-1", ingress[f], 5300) == 1, f"{ingress[f]}:5300 on worker-1",
                     timeout=60)
            wait_for(lambda: c.echo(ingress[f], 5300), f"echo through {ingress[f]}:5300", timeout=30)
        old = set(ips(ps["lb-a"]))
        new = set(replace_backend(lab, ns, "lb", "lb-a", "worker-3"))
        for f, c in clients.items():
            wait_for(lambda: c.echo(ingress[f], 5300), f"{ingress[f]}:5300 answering the same client port from lb-b",
                     timeout=20)
        held = set().union(*(backend_of(lab, n, SPORT, 5300) for n in ("worker-1", "worker-2", "worker-3")))
        assert held & new and not held & old, held
    finally:
        for c in clients.values():
            c.close()


@pytest.mark.parametrize("family", [4, 6])
def test_nothing_flushes_a_udp_flow_whose_backend_stays(lab, ns, family):
    """A service change that keeps the flow's backend (another backend added) leaves its flow alone:
    the same backend answers the same client port."""
    name = f"keep{family}"
    lab.apply([pod(f"{name}-a", ns, "worker-2", labels={"app": name}, tcp=(), udp=(53,)),
               pod(f"{name}-cli", ns, "worker-1", tcp=(), udp=())])
    ps = lab.wait(ns, [f"{name}-a", f"{name}-cli"])
    lab.apply([udp_service(name, ns)])
    vips = json.loads(lab.lace("get", "services", name, "-n", ns, "-o", "json")[1])["spec"]["clusterIPs"]
    vip = next(v for v in vips if (":" in v) == (family == 6))
    c = FixedPortClient(sandbox_netns(lab.name, ps[f"{name}-cli"]["metadata"]["uid"]), family)
    try:
        wait_for(lambda: c.echo(vip, 5300), f"echo through {vip}:5300", timeout=30)
        before = backend_of(lab, "worker-1", SPORT, 5300)
        lab.apply([pod(f"{name}-b", ns, "worker-3", labels={"app": name}, tcp=(), udp=(53,))])
        lab.wait(ns, [f"{name}-b"])
        wait_for(lambda: active(lab, "worker-1", vip, 5300) == 2, f"{vip}:5300 with two backends on worker-1",
                 timeout=20)
        for _ in range(5):
            assert c.echo(vip, 5300)
        assert backend_of(lab, "worker-1", SPORT, 5300) == before
    finally:
        c.close()


#: a host process's resolver-like client: one connected UDP socket to VIP:5300, a datagram every
#: 50 ms; after an error it connects the same socket again (as resolvers and telemetry clients do)
HOST_CLIENT = r"""
import socket, sys, time
vip, family, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.3)
s.connect((vip, 5300))
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        s.send(b"lace-host")
        print("echo" if s.recv(64) == b"lace-host" else "other", flush=True)
    except socket.timeout:
        print("timeout", flush=True)
    except OSError as e:
        print(f"error {e.errno}", flush=True)
        try:   # no backend yet: the connect is refused (ECONNREFUSED); the next round tries again
            s.connect((vip, 5300))
        except OSError as e:
            print(f"connect {e.errno}", flush=True)
    time.sleep(0.05)
"""


def host_process(lab, node: str, argv: list[str]) -> subprocess.Popen:
    """argv as a process on node's host: its network namespace and its host cgroup (where the
    socket hooks translate), its output a pipe."""
    netns, group = topology.netns_name(lab.name, node), topology.node_cgroup(lab.name, node)

    def enter() -> None:
        from pyroute2.netns import setns
        setns(f"/run/netns/{netns}")
        topology.join_cgroup(group)

    return subprocess.Popen(argv, preexec_fn=enter, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("family", [4, 6])
def test_a_host_socket_connected_to_a_departed_backend_is_terminated_and_reconnects_to_the_new_one(lab, ns, family):
    """The node's own process (its host cgroup: socket-level translation) with a connected UDP
    socket: translated once at connect, it would send to the deleted backend for ever; the agent
    terminates it (its next call fails), and connecting again reaches the new backend."""
    name = f"hostudp{family}"
    lab.apply([pod(f"{name}-a", ns, "worker-2", labels={"app": name}, tcp=(), udp=(53,))])
    lab.wait(ns, [f"{name}-a"])
    lab.apply([udp_service(name, ns)])
    vips = json.loads(lab.lace("get", "services", name, "-n", ns, "-o", "json")[1])["spec"]["clusterIPs"]
    vip = next(v for v in vips if (":" in v) == (family == 6))
    wait_for(lambda: active(lab, "worker-1", vip, 5300) == 1, f"{vip}:5300 on worker-1", timeout=20)
    proc = host_process(lab, "worker-1", [sys.executable, "-c", HOST_CLIENT, vip, str(family), "60"])
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    errors = (f"error {errno.ECONNABORTED}\n", f"error {errno.EDESTADDRREQ}\n")

    def reconnected() -> bool:
        first = next((i for i, line in enumerate(lines) if line in errors), None)
        return first is not None and "echo\n" in lines[first:]
    try:
        wait_for(lambda: "echo\n" in lines, f"the host socket's first echo through {vip}:5300", timeout=15)
        lab.lace("delete", "pod", f"{name}-a", "-n", ns, "--grace-period", "0")
        lab.apply([pod(f"{name}-b", ns, "worker-3", labels={"app": name}, tcp=(), udp=(53,))])
        lab.wait(ns, [f"{name}-b"])
        try:
            wait_for(reconnected, "the socket terminated, connected again and answered from the new backend",
                     timeout=20)
        except AssertionError:
            with open(os.path.join(lab.dir, "logs", "agent-worker-1.log")) as f:
                log = [line for line in f if "UDP" in line or "socket" in line][-10:]
            raise AssertionError(f"the client said {''.join(lines[-8:])!r}; worker-1's agent: {''.join(log)}")
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=5)


@pytest.mark.parametrize("family", [4, 6])
def test_a_udp_flow_to_a_terminating_backend_keeps_it_while_new_flows_go_to_the_ready_one(lab, ns, family):
    """A backend that is only terminating (deleted with a grace period, its server draining) is not
    a departed one: the client's flow from its fixed port keeps reaching it through the grace
    period, while a new client port goes to the ready backend."""
    from .test_termination import draining, endpoint_conditions

    name = f"drain{family}"
    old = draining(f"{name}-a", ns, "worker-2", delay=30, grace=40, app=name)
    old["spec"]["containers"][0]["ports"] = [{"containerPort": 53, "protocol": "UDP"}]
    lab.apply([old, pod(f"{name}-cli", ns, "worker-1", tcp=(), udp=())])
    ps = lab.wait(ns, [f"{name}-a", f"{name}-cli"])
    lab.apply([udp_service(name, ns)])
    vips = json.loads(lab.lace("get", "services", name, "-n", ns, "-o", "json")[1])["spec"]["clusterIPs"]
    vip = next(v for v in vips if (":" in v) == (family == 6))
    netns = sandbox_netns(lab.name, ps[f"{name}-cli"]["metadata"]["uid"])
    c = FixedPortClient(netns, family)
    try:
        wait_for(lambda: c.echo(vip, 5300), f"echo through {vip}:5300", timeout=30)
        draining_addr = ips(ps[f"{name}-a"])[0 if family == 4 else 1]
        lab.apply([pod(f"{name}-b", ns, "worker-3", labels={"app": name}, tcp=(), udp=(53,))])
        ready_addr = ips(lab.wait(ns, [f"{name}-b"])[f"{name}-b"])[0 if family == 4 else 1]
        lab.lace("delete", "pod", f"{name}-a", "-n", ns, "--grace-period", "40", "--wait=false")
        wait_for(lambda: (endpoint_conditions(lab, ns, draining_addr) or {}).get("terminating"),
                 f"{name}-a terminating", timeout=20)
        wait_for(lambda: active(lab, "worker-1", vip, 5300) == 1, f"{vip}:5300 with one active backend", timeout=20)
        for _ in range(20):
            assert c.echo(vip, 5300, timeout=1), "the flow to the terminating backend still answers"
        assert backend_of(lab, "worker-1", SPORT, 5300) == {draining_addr}
    finally:
        c.close()
    # a new client port: the ready backend
    with entered(netns):
        s = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.settimeout(1)
        s.bind(("", SPORT + 1))
        s.sendto(b"new", (vip, 5300))
        assert s.recvfrom(64)[0] == b"new"
        assert backend_of(lab, "worker-1", SPORT + 1, 5300) == {ready_addr}
    finally:
        s.close()
