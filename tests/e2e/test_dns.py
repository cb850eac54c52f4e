"""Cluster DNS in the lab: dnsmasq in kube-system/kube-dns-1 answers from the records the feeder
writes (services of both families, headless services, pods; changes and deletes followed; nothing
forwarded), pods resolve names through the kube-dns ClusterIPs with their own resolv.conf — from
the default network and from a network importing kube-system/kube-dns, short names through the
search path — and a network that does not import it gets no nameserver."""

from __future__ import annotations

import hashlib
import json
import os
import sys

from lace.lab import dns
from lace.lab.kubelet import Sandboxes

from .conftest import ips, network, pod, wait_for

DNS_POD = f"{dns.NAMESPACE}/{dns.POD}"

# runs in a pod: each (name, type, server, "udp"|"tcp") asked of server directly, with dnspython
QUERIES = r"""
import json, sys
import dns.flags, dns.message, dns.query, dns.rcode
out = []
for name, rdtype, server, proto in json.loads(sys.argv[1]):
    r = (dns.query.tcp if proto == "tcp" else dns.query.udp)(dns.message.make_query(name, rdtype), server, timeout=2)
    out.append({"rcode": dns.rcode.to_text(r.rcode()), "aa": bool(r.flags & dns.flags.AA),
                "answers": sorted(x.to_text() for rrset in r.answer for x in rrset)})
print(json.dumps(out))
"""

# runs in a pod: getaddrinfo (the libc resolver, so the pod's /etc/resolv.conf) per (name, family)
LOOKUPS = r"""
import json, socket, sys
out = []
for name, family in json.loads(sys.argv[1]):
    try:
        infos = socket.getaddrinfo(name, 80, socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_STREAM)
        out.append(sorted({i[4][0] for i in infos}))
    except socket.gaierror as e:
        out.append(f"error: {e}")
print(json.dumps(out))
"""


def dns_pod(lab) -> dict:
    return lab.wait(dns.NAMESPACE, [dns.POD], timeout=60)[dns.POD]


def ask(lab, client: str, questions: list[tuple[str, str, str, str]]) -> list[dict]:
    rc, out = lab.exec(client, sys.executable, "-c", QUERIES, json.dumps(questions))
    assert rc == 0, out
    return json.loads(out)


def lookup(lab, client: str, questions: list[tuple[str, int]]) -> list:
    rc, out = lab.exec(client, sys.executable, "-c", LOOKUPS, json.dumps(questions))
    assert rc == 0, out
    return json.loads(out)


def service(name: str, ns: str, selector: dict, *, network_name: str | None = None, **spec) -> dict:
    meta: dict = {"name": name, "namespace": ns}
    if network_name:
        meta["annotations"] = {"lace.dev/network": network_name}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"selector": selector, "ports": [{"name": "http", "port": 80}], **spec}}


def vips(lab, ns: str, name: str) -> list[str]:
    _, out, _ = lab.lace("get", "services", name, "-n", ns, "-o", "json")
    return json.loads(out)["spec"]["clusterIPs"]


def resolv_conf(lab, client: str) -> list[str]:
    rc, out = lab.exec(client, "cat", "/etc/resolv.conf")
    assert rc == 0, out
    return [line for line in out.splitlines() if line and not line.startswith("#")]


def test_dns_pod_answers_from_the_store_at_its_pod_ip(lab, ns):
    server4, server6 = ips(dns_pod(lab))
    lab.apply([pod("w1", ns, "worker-2", labels={"app": "web"}), pod("w2", ns, "worker-3", labels={"app": "web"}),
               pod("cli", ns, "worker-3")])
    ps = lab.wait(ns, ["w1", "w2", "cli"])
    lab.apply([service("web", ns, {"app": "web"}, ipFamilyPolicy="PreferDualStack"),
               service("six", ns, {"app": "web"}, ipFamilies=["IPv6"]),
               service("hl", ns, {"app": "web"}, clusterIP="None", ipFamilyPolicy="PreferDualStack")])
    web4, web6 = vips(lab, ns, "web")
    (six6,) = vips(lab, ns, "six")
    w1, w2 = ips(ps["w1"]), ips(ps["w2"])
    cli = f"{ns}/cli"
    svc = f"svc.{dns.CLUSTER_DOMAIN}"
    hl = f"hl.{ns}.{svc}"

    # the headless records wait for the EndpointSlice controller; the rest is there by then
    wait_for(lambda: ask(lab, cli, [(hl, "A", server4, "udp")])[0]["answers"] == sorted([w1[0], w2[0]]),
               "hl's A records to list both pods")
    for server in (server4, server6):
        for proto in ("udp", "tcp"):
            got = ask(lab, cli, [
                (f"web.{ns}.{svc}", "A", server, proto), (f"web.{ns}.{svc}", "AAAA", server, proto),
                (f"six.{ns}.{svc}", "AAAA", server, proto), (f"six.{ns}.{svc}", "A", server, proto),
                (hl, "A", server, proto), (hl, "AAAA", server, proto),
                (f"{dns.dashed(w1[0])}.{ns}.pod.{dns.CLUSTER_DOMAIN}", "A", server, proto),
                (f"{dns.dashed(w1[1])}.{ns}.pod.{dns.CLUSTER_DOMAIN}", "AAAA", server, proto),
                (f"kube-dns.kube-system.{svc}", "A", server, proto),
                (f"nope.{ns}.{svc}", "A", server, proto),
                ("example.com", "A", server, proto)])
            where = f"{server}/{proto}"
            assert got[0] == {"rcode": "NOERROR", "aa": True, "answers": [web4]}, where
            assert got[1]["answers"] == [web6], where
            assert got[2]["answers"] == [six6], where
            assert (got[3]["rcode"], got[3]["answers"]) == ("NOERROR", []), where
            assert got[4]["answers"] == sorted([w1[0], w2[0]]) and got[5]["answers"] == sorted([w1[1], w2[1]]), where
            assert got[6]["answers"] == [w1[0]] and got[7]["answers"] == [w1[1]], where
            assert got[8]["answers"] == [dns.CLUSTER_IPS[0]], where
            assert got[9]["rcode"] == "NXDOMAIN", where
            # nothing is forwarded out of the lab: a name outside cluster.local does not exist
            assert (got[10]["rcode"], got[10]["answers"]) == ("NXDOMAIN", []), where

    # changes are followed: a pod leaves the headless service, a deleted service loses its name
    lab.lace("delete", "pod", "w2", "-n", ns)
    lab.lace("delete", "service", "web", "-n", ns)
    wait_for(lambda: [r["answers"] for r in ask(lab, cli, [(hl, "A", server4, "udp")])] == [[w1[0]]],
               "w2 to leave hl's records")
    got = ask(lab, cli, [(f"web.{ns}.{svc}", "A", server4, "udp"), (f"web.{ns}.{svc}", "AAAA", server6, "tcp")])
    assert [r["rcode"] for r in got] == ["NXDOMAIN", "NXDOMAIN"], got


def getent(lab, pod: str, database: str, name: str) -> str | None:
    """What ``getent DATABASE NAME`` prints in the pod, or None when it finds nothing (yet)."""
    rc, out = lab.exec(pod, "getent", database, name)
    return out if rc == 0 else None


def test_default_network_pods_resolve_through_the_kube_dns_vip(lab, ns):
    """Through 10.96.0.10 and fd00:10:96::a: needs the datapath's ClusterIP translation."""
    dns_pod(lab)
    lab.apply([pod("w1", ns, "worker-1", labels={"app": "web"}), pod("w2", ns, "worker-2", labels={"app": "web"}),
               pod("cli", ns, "worker-3")])
    ps = lab.wait(ns, ["w1", "w2", "cli"])
    lab.apply([service("web", ns, {"app": "web"}, ipFamilyPolicy="PreferDualStack"),
               service("hl", ns, {"app": "web"}, clusterIP="None", ipFamilyPolicy="PreferDualStack")])
    web4, web6 = vips(lab, ns, "web")
    pods4 = sorted(ips(ps[n])[0] for n in ("w1", "w2"))
    pods6 = sorted(ips(ps[n])[1] for n in ("w1", "w2"))
    cli = f"{ns}/cli"
    assert resolv_conf(lab, cli) == [f"search {ns}.svc.cluster.local svc.cluster.local cluster.local",
                                     "nameserver 10.96.0.10", "nameserver fd00:10:96::a", "options ndots:5"]
    fqdn = f"web.{ns}.svc.cluster.local"
    for tool, family, want in (("ahostsv4", 4, web4), ("ahostsv6", 6, web6)):
        # the DNS server learns the new service from the store a moment after the apply
        out = wait_for(lambda: getent(lab, cli, tool, fqdn), f"{fqdn} in the cluster DNS (getent {tool})")
        assert {line.split()[0] for line in out.splitlines()} == {want}, f"getent {tool}: {out}"
    wait_for(lambda: lookup(lab, cli, [(f"hl.{ns}", 4)]) == [pods4], "hl to list both pods")
    got = lookup(lab, cli, [(fqdn, 4), (fqdn, 6),
                            ("web", 4), ("web", 6),                # the search path: <ns>.svc.cluster.local
                            (f"web.{ns}", 4), (f"web.{ns}.svc", 6),
                            (f"hl.{ns}", 4), ("hl", 6),
                            ("kube-dns.kube-system", 4), ("nope", 4)])
    assert got[:6] == [[web4], [web6], [web4], [web6], [web4], [web6]], got
    assert got[6:8] == [pods4, pods6], got
    assert got[8] == [dns.CLUSTER_IPS[0]], got
    assert isinstance(got[9], str) and got[9].startswith("error"), got


def test_a_network_importing_kube_dns_resolves_through_its_vip(lab, ns):
    """From a network other than the DNS pod's: needs the datapath to carry an imported
    service's ClusterIP across networks (and the answers back)."""
    dns_pod(lab)
    red = f"dr{ns[-6:]}"
    lab.apply([network(red, "10.63.0.0/16", "fd63::/64", imports=[dns.SERVICE_REF])])
    lab.apply([pod("r1", ns, "worker-1", red, labels={"app": "rweb"}),
               pod("r2", ns, "worker-3", red, labels={"app": "rweb"}),
               pod("rcli", ns, "worker-2", red), pod("d1", ns, "worker-2", labels={"app": "web"})])
    ps = lab.wait(ns, ["r1", "r2", "rcli", "d1"])
    lab.apply([service("rhl", ns, {"app": "rweb"}, network_name=red, clusterIP="None",
                       ipFamilyPolicy="PreferDualStack"),
               service("web", ns, {"app": "web"}, ipFamilyPolicy="PreferDualStack")])
    web4, web6 = vips(lab, ns, "web")
    rcli = f"{ns}/rcli"
    assert resolv_conf(lab, rcli)[1:3] == ["nameserver 10.96.0.10", "nameserver fd00:10:96::a"]
    pods4 = sorted(ips(ps[n])[0] for n in ("r1", "r2"))
    pods6 = sorted(ips(ps[n])[1] for n in ("r1", "r2"))
    wait_for(lambda: lookup(lab, rcli, [("rhl", 4)]) == [pods4], "rhl to list both red pods, by its short name")
    rc, out = lab.exec(rcli, "getent", "ahostsv6", f"rhl.{ns}.svc.cluster.local")
    assert rc == 0 and sorted({line.split()[0] for line in out.splitlines()}) == pods6, out
    # names are cluster-wide: the default network's service resolves too (reaching it is another matter)
    assert lookup(lab, rcli, [("web", 4), (f"web.{ns}", 6)]) == [[web4], [web6]]


def test_resolv_conf_is_the_pods_own_and_a_network_without_kube_dns_has_no_nameserver(lab, ns):
    dns_pod(lab)
    lone = f"dl{ns[-6:]}"
    lab.apply([network(lone, "10.64.0.0/16", "fd64::/64")])
    lab.apply([pod("d", ns, "worker-1"), pod("l", ns, "worker-2", lone)])
    lab.wait(ns, ["d", "l"])
    before = hashlib.sha256(open("/etc/resolv.conf", "rb").read()).hexdigest()

    assert resolv_conf(lab, f"{ns}/l") == []
    rc, out = lab.exec(f"{ns}/l", "getent", "ahostsv4", f"kube-dns.kube-system.svc.{dns.CLUSTER_DOMAIN}")
    assert rc != 0, f"a pod whose network cannot reach kube-dns resolved through something else: {out}"

    # the pod's server process sees the pod's file as /etc/resolv.conf, from the lab's state dir
    rec = Sandboxes(os.path.join(lab.dir, "kubelet")).find(ns, "d")
    assert rec["resolv_conf"].startswith(lab.dir)
    procs = json.load(open(os.path.join(lab.dir, "procs.json")))
    pid = procs[rec["proc"]]["pid"]
    with open(f"/proc/{pid}/root/etc/resolv.conf") as f:
        assert f.read() == open(rec["resolv_conf"]).read()
    assert f"search {ns}.svc.cluster.local" in open(rec["resolv_conf"]).read()
    # ... in a mount namespace of its own: the machine's file and mount table are untouched
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    assert hashlib.sha256(open("/etc/resolv.conf", "rb").read()).hexdigest() == before
    with open("/proc/self/mountinfo") as f:
        assert lab.dir not in f.read()

    # the pod's files go with the pod
    lab.lace("delete", "pod", "d", "-n", ns)
    assert not os.path.exists(rec["resolv_conf"])
