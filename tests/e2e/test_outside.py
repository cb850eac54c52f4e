"""Traffic between the lab's pods and its outside namespace (the lab's internet, 203.0.113.1 and
2001:db8:cafe::1): a server there sees a pod's flows from the pod's node address when the pod's
network masquerades to the outside, and from the pod's own address when it does not."""

from __future__ import annotations

import ipaddress
import socket
import uuid

import pytest

from lace.cli.connectivity.outside import OutsideServer
from lace.datapath.common import NETWORK_OUTSIDE
from lace.lab import topology
from lace.nsenter import entered

from .conftest import NETCHECK, ips, network, pod, wait_for
from .test_nodestate import node_cmd, node_json

INTERNET = {4: topology.INTERNET4, 6: topology.INTERNET6}
NODES = ("worker-1", "worker-2", "worker-3")


@pytest.fixture
def outside(lab):
    srv = OutsideServer(lab.status()["outside"], INTERNET[4], INTERNET[6])
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
            rc, out = lab.exec(client, *NETCHECK, "tcp", INTERNET[family], str(outside.tcp_port),
                               "--timeout", "3")
            assert rc == 0 and out.strip() == want, f"{client} -> {INTERNET[family]} over TCP: {out}"
            ok, out = lab.check(client, "udp", INTERNET[family], outside.udp_port, timeout=3)
            assert ok, f"{client} -> {INTERNET[family]} over UDP: {out}"
            assert want in outside.seen("udp")
            rc, out = lab.exec(client, "ping", "-c", "1", "-W", "3", INTERNET[family])
            assert rc == 0, f"{client} pings {INTERNET[family]}: {out}"
            # from the masquerade range, never a pod address
            assert all(49152 <= p <= 65535 for p in outside.ports("tcp", want)), outside.ports("tcp", want)
    pod_addrs = {a for i in range(2) for a in ips(lab.pods(ns)[f"c{i}"]) if a}
    assert not pod_addrs & (outside.seen("tcp") | outside.seen("udp")), (outside.seen("tcp"), outside.seen("udp"))
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
        send_datagram(lab, f"{ns}/c", INTERNET[family], outside.udp_port, "unmasqueraded")
        wait_for(lambda: addr in outside.seen("udp"), f"the outside to see {addr}", timeout=10)
    assert_routed_outside(lab, net, masquerade=False)


# -- NodePort and LoadBalancer ---------------------------------------------------------------------

NODE_INDEX = {n: i for i, n in enumerate(NODES, start=1)}


def client_socket(lab, addr: str, kind: int) -> socket.socket:
    """A socket in the outside namespace bound to its internet address of addr's family (else it
    would send from its fabric address, the on-link route to the nodes)."""
    family = 6 if ":" in addr else 4
    with entered(lab.status()["outside"]):
        s = socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, kind)
        s.bind((INTERNET[family], 0))
    return s


def outside_get(lab, addr: str, port: int, timeout: float = 2.0) -> str:
    """An HTTP GET from the outside's internet address: the answer's body, or what went wrong."""
    s = client_socket(lab, addr, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((addr, port))
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data.split(b"\r\n\r\n", 1)[-1].decode().strip()
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"error: {exc}"
    finally:
        s.close()


def outside_udp(lab, addr: str, port: int, timeout: float = 2.0) -> bool:
    """One datagram from the outside's internet address: whether its echo came back from addr:port."""
    s = client_socket(lab, addr, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        for _ in range(3):
            s.sendto(b"lace-outside", (addr, port))
            try:
                data, peer = s.recvfrom(2048)
            except socket.timeout:
                continue
            return data == b"lace-outside" and ipaddress.ip_address(peer[0]) == ipaddress.ip_address(addr) \
                and peer[1] == port
        return False
    finally:
        s.close()


def external_service(name: str, ns: str, type_: str = "NodePort", policy: str = "Cluster") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"type": type_, "selector": {"app": "web"}, "ipFamilyPolicy": "PreferDualStack",
                     "externalTrafficPolicy": policy,
                     "ports": [{"name": "http", "port": 80, "targetPort": 80},
                               {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}]}}


def service_obj(lab, ns: str, name: str) -> dict:
    import json
    _, out, _ = lab.lace("get", "services", name, "-n", ns, "-o", "json")
    return json.loads(out)


def node_port(svc: dict, name: str) -> int:
    return next(int(p["nodePort"]) for p in svc["spec"]["ports"] if p["name"] == name)


def node_addrs(lab, node: str) -> list[str]:
    return [node_addr(lab, node, 4), node_addr(lab, node, 6)]


@pytest.fixture
def web(lab, ns):
    """Backends web0 on worker-1 and web1 on worker-2 (none on worker-3), and their addresses."""
    lab.apply([pod(f"web{i}", ns, n, labels={"app": "web"}) for i, n in enumerate(NODES[:2])])
    pods = lab.wait(ns, ["web0", "web1"])
    return {f"{ns}/web{i}": ips(pods[f"web{i}"]) for i in range(2)}


def test_nodeport_cluster_policy_answers_on_every_node_and_keeps_the_client(lab, ns, web):
    lab.apply([external_service("np", ns)])
    port = node_port(service_obj(lab, ns, "np"), "http")
    udp_port = node_port(service_obj(lab, ns, "np"), "dns")
    for node in NODES:
        for addr in node_addrs(lab, node):
            wait_for(lambda: outside_get(lab, addr, port) in web, f"{addr}:{port} answering", timeout=30)
            seen = {outside_get(lab, addr, port) for _ in range(12)}
            assert seen <= set(web) and seen, f"{node} {addr}: {seen}"
            assert outside_udp(lab, addr, udp_port), f"UDP through {addr}:{udp_port}"
    # worker-3 has no backend: its flows went to worker-1 and worker-2 over SRv6 and came back. The
    # backends' nodes hold them untranslated (no NAT flag: the translation is on worker-3), keyed
    # in network OUTSIDE by the outside client's own address
    relayed = [e for i, node in enumerate(NODES[:2])
               for e in node_json(lab, node, "ct", "list", "all", "-n")["entries"]
               if e["network"] == NETWORK_OUTSIDE and e["saddr"] in (topology.INTERNET4, topology.INTERNET6)
               and e["daddr"] in web[f"{ns}/web{i}"] and not {"dnat", "service"} & set(e["flags"])]
    assert relayed, "no flow from worker-3's node port reached a backend with the client's address"


def test_nodeport_local_policy_answers_only_where_an_endpoint_is(lab, ns, web):
    lab.apply([external_service("npl", ns, policy="Local")])
    port = node_port(service_obj(lab, ns, "npl"), "http")
    for i, node in enumerate(NODES[:2]):
        for addr in node_addrs(lab, node):
            wait_for(lambda: outside_get(lab, addr, port) == f"{ns}/web{i}",
                       f"{addr}:{port} answering from web{i} only", timeout=30)
            assert {outside_get(lab, addr, port) for _ in range(8)} == {f"{ns}/web{i}"}
    for addr in node_addrs(lab, "worker-3"):
        wait_for(lambda: outside_get(lab, addr, port) == "refused", f"{addr}:{port} refusing", timeout=30)
    flows = node_json(lab, "worker-3", "trace", "flow", "--last", "300", "--verdict", "drop")
    assert any(f["reason"] == "service-no-backend" for f in flows["flows"]), flows
    # the backend saw the client's address: its node's entries are keyed by it
    text = str(node_json(lab, "worker-1", "ct", "list", "all", "-n"))
    assert topology.INTERNET4 in text and topology.INTERNET6 in text


def test_load_balancer_address_reachable_from_the_outside(lab, ns, web):
    lab.apply([{"apiVersion": "lace.dev/v1alpha1", "kind": "LoadBalancerIPPool", "metadata": {"name": "lab"},
                "spec": {"cidrs": ["198.18.100.0/24", "2001:db8:1b::/112"]}}])
    lab.apply([external_service("lb", ns, type_="LoadBalancer")])
    ingress = [i["ip"] for i in service_obj(lab, ns, "lb")["status"]["loadBalancer"]["ingress"]]
    assert {ipaddress.ip_address(a).version for a in ingress} == {4, 6}
    for addr in ingress:
        assert ipaddress.ip_address(addr) in ipaddress.ip_network(
            topology.LOADBALANCER4_NET if ":" not in addr else topology.LOADBALANCER6_NET)
        wait_for(lambda: outside_get(lab, addr, 80) in web, f"{addr}:80 answering", timeout=30)
        assert {outside_get(lab, addr, 80) for _ in range(12)} <= set(web)
        assert outside_udp(lab, addr, 53), f"UDP through {addr}:53"
