"""Cluster DNS in the lab: dnsmasq in kube-system/kube-dns-1 answers from the records the feeder
writes (services of both families, headless services, pods; SRV records of named ports and the
names of headless endpoints; changes and deletes followed, an SRV change without a query lost;
nothing forwarded), pods resolve names through the kube-dns ClusterIPs with their own
resolv.conf — from the default network and from a network importing kube-system/kube-dns, short
names through the search path — and a network that does not import it gets no nameserver."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

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


# runs in a pod: SRV questions (name, server) asked over UDP round and round until the file argv[2]
# exists; prints how many were answered, the failures, and per name each answer that differed
# from the one before
HAMMER = r"""
import json, os, sys
import dns.exception, dns.message, dns.query, dns.rcode
questions, stop = json.loads(sys.argv[1]), sys.argv[2]
answered, failures, seen, i = 0, [], {}, 0
while not os.path.exists(stop):
    name, server = questions[i % len(questions)]
    i += 1
    try:
        r = dns.query.udp(dns.message.make_query(name, "SRV"), server, timeout=2)
    except (dns.exception.DNSException, OSError) as e:
        failures.append(f"{server}: {e!r}")
        continue
    answered += 1
    got = [dns.rcode.to_text(r.rcode())] + sorted(x.to_text() for rrset in r.answer for x in rrset)
    mine = seen.setdefault(name, [])
    if not mine or mine[-1] != got:
        mine.append(got)
print(json.dumps({"answered": answered, "failures": failures, "seen": seen}))
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
    # SRV records answer from this network too, through either VIP
    svc = f"{ns}.svc.{dns.CLUSTER_DOMAIN}"
    want = sorted(f"0 25 80 {dns.dashed(ip)}.rhl.{svc}." for ip in pods4 + pods6)
    for server in dns.CLUSTER_IPS:
        assert srv(lab, rcli, f"_http._tcp.rhl.{svc}", server) == ("NOERROR", want), server
        assert srv(lab, rcli, f"_http._tcp.web.{svc}", server, "tcp") == ("NOERROR", [f"0 100 80 web.{svc}."]), server


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


def srv(lab, client: str, name: str, server: str, proto: str = "udp") -> tuple[str, list[str]]:
    """(rcode, the SRV records as ``PRIORITY WEIGHT PORT TARGET``) for ``name`` asked of ``server``."""
    (got,) = ask(lab, client, [(name, "SRV", server, proto)])
    return got["rcode"], got["answers"]


def test_srv_records_of_named_ports_and_names_of_headless_endpoints(lab, ns):
    """The Kubernetes DNS specification's SRV records (2.3.2 and 2.4.2) and headless endpoint
    names, through both kube-dns VIPs over UDP and TCP: as a client pod sees them."""
    dns_pod(lab)
    named = pod("w1", ns, "worker-1", labels={"app": "web"})
    named["spec"].update(hostname="db-0", subdomain="hl")   # db-0.hl.<ns>.svc.cluster.local
    lab.apply([named, pod("w2", ns, "worker-2", labels={"app": "web"}), pod("cli", ns, "worker-3")])
    ps = lab.wait(ns, ["w1", "w2", "cli"])
    lab.apply([service("web", ns, {"app": "web"}, ipFamilyPolicy="PreferDualStack",
                       ports=[{"name": "http", "port": 8080, "targetPort": 80},
                              {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "plain", "port": 81}]),
               service("hl", ns, {"app": "web"}, clusterIP="None", ipFamilyPolicy="PreferDualStack",
                       ports=[{"name": "http", "port": 8080, "targetPort": 80}])])
    w1, w2 = ips(ps["w1"]), ips(ps["w2"])
    cli = f"{ns}/cli"
    svc = f"{ns}.svc.{dns.CLUSTER_DOMAIN}"
    d4, d6 = dns.dashed(w2[0]), dns.dashed(w2[1])
    # one record per ready endpoint: db-0 names both of w1's (one target), w2's are named by address
    want_hl = sorted(f"0 33 80 {h}.hl.{svc}." for h in ("db-0", d4, d6))
    wait_for(lambda: srv(lab, cli, f"_http._tcp.hl.{svc}", dns.CLUSTER_IPS[0]) == ("NOERROR", want_hl),
             "hl's SRV records for both pods")
    for server in dns.CLUSTER_IPS:
        for proto in ("udp", "tcp"):
            where = f"{server}/{proto}"
            got = ask(lab, cli, [
                (f"_http._tcp.web.{svc}", "SRV", server, proto), (f"_dns._udp.web.{svc}", "SRV", server, proto),
                (f"_plain._tcp.web.{svc}", "SRV", server, proto), (f"_http._udp.web.{svc}", "SRV", server, proto),
                (f"_http._tcp.hl.{svc}", "SRV", server, proto),
                (f"db-0.hl.{svc}", "A", server, proto), (f"db-0.hl.{svc}", "AAAA", server, proto),
                (f"{d4}.hl.{svc}", "A", server, proto), (f"{d6}.hl.{svc}", "AAAA", server, proto)])
            # a ClusterIP service: priority 0, weight 100, the service port, the service's own name
            assert got[0] == {"rcode": "NOERROR", "aa": True, "answers": [f"0 100 8080 web.{svc}."]}, where
            assert got[1]["answers"] == [f"0 100 53 web.{svc}."], where
            assert got[2]["answers"] == [f"0 100 81 web.{svc}."], where
            # http is a TCP port: there is no such port over UDP
            assert got[3]["rcode"] == "NXDOMAIN", where
            # a headless service: the pods' port (the targetPort), each at its own name
            assert (got[4]["rcode"], got[4]["answers"]) == ("NOERROR", want_hl), where
            assert got[5]["answers"] == [w1[0]] and got[6]["answers"] == [w1[1]], where
            assert got[7]["answers"] == [w2[0]] and got[8]["answers"] == [w2[1]], where
    # the pod's own resolver finds hostname.subdomain through the search path
    assert lookup(lab, cli, [("db-0.hl", 4), ("db-0.hl", 6)]) == [[w1[0]], [w1[1]]]

    # an endpoint that goes takes its SRV record along
    lab.lace("delete", "pod", "w2", "-n", ns)
    wait_for(lambda: srv(lab, cli, f"_http._tcp.hl.{svc}", dns.CLUSTER_IPS[1]) == (
        "NOERROR", [f"0 100 80 db-0.hl.{svc}."]), "w2's SRV records to go")


def test_srv_records_follow_a_renamed_and_a_removed_port_without_a_query_lost(lab, ns):
    """While a client in a pod asks for the SRV records over and over (through both VIPs), the
    port is renamed, then loses its name: each answer changes, and no query goes unanswered
    (the DNS pod's SRV dnsmasq is replaced twice meanwhile)."""
    dns_pod(lab)
    lab.apply([pod("w1", ns, "worker-1", labels={"app": "web"}), pod("cli", ns, "worker-2")])
    lab.wait(ns, ["w1", "cli"])
    web = service("web", ns, {"app": "web"}, ipFamilyPolicy="PreferDualStack")   # port 80 named http
    lab.apply([web])
    cli = f"{ns}/cli"
    svc = f"{ns}.svc.{dns.CLUSTER_DOMAIN}"
    http, renamed = f"_http._tcp.web.{svc}", f"_www._tcp.web.{svc}"
    wait_for(lambda: srv(lab, cli, http, dns.CLUSTER_IPS[0]) == ("NOERROR", [f"0 100 80 web.{svc}."]),
             "web's SRV record")

    stop = os.path.join(lab.dir, f"hammer-{ns}.stop")
    questions = [(name, server) for name in (http, renamed) for server in dns.CLUSTER_IPS]
    # `lace lab exec` as a user runs it, in the background while the port changes
    lace = os.path.join(os.path.dirname(sys.executable), "lace")
    hammer = subprocess.Popen([lace, "lab", "exec", cli, "--", sys.executable, "-c", HAMMER, json.dumps(questions), stop],
                              env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(zip(("out", "err"), hammer.communicate(timeout=120))))
    reader.start()
    try:
        time.sleep(1)
        web["spec"]["ports"] = [{"name": "www", "port": 80}]
        lab.apply([web])
        wait_for(lambda: srv(lab, cli, renamed, dns.CLUSTER_IPS[1]) == ("NOERROR", [f"0 100 80 web.{svc}."]),
                 "the renamed port's SRV record")
        assert srv(lab, cli, http, dns.CLUSTER_IPS[1])[0] == "NXDOMAIN", "the old name's record is gone"
        time.sleep(1)
        web["spec"]["ports"] = [{"port": 80}]
        lab.apply([web])
        wait_for(lambda: srv(lab, cli, renamed, dns.CLUSTER_IPS[0])[0] == "NXDOMAIN",
                 "the unnamed port's SRV record to go")
        time.sleep(1)
    finally:
        open(stop, "w").close()
        reader.join(timeout=30)
        os.unlink(stop)
    assert hammer.returncode == 0, result.get("err")
    out = json.loads(result["out"])
    assert out["failures"] == [], f"{len(out['failures'])} of {out['answered'] + len(out['failures'])} queries unanswered"
    assert out["answered"] > 50, out
    answered, gone = ["NOERROR", f"0 100 80 web.{svc}."], ["NXDOMAIN"]
    # each name's answers went from the old port's to the new one's (while the SRV dnsmasq are
    # swapped, for a few milliseconds either may answer, so a change can show twice)
    http_seen, renamed_seen = out["seen"][http], out["seen"][renamed]
    assert (http_seen[0], http_seen[-1]) == (answered, gone) and gone in http_seen, http_seen
    assert (renamed_seen[0], renamed_seen[-1]) == (gone, gone) and answered in renamed_seen, renamed_seen
    assert all(a in (answered, gone) for a in http_seen + renamed_seen), out["seen"]
    # the records end where the store says: no SRV record for an unnamed port
    assert srv(lab, cli, http, dns.CLUSTER_IPS[0])[0] == srv(lab, cli, renamed, dns.CLUSTER_IPS[1])[0] == "NXDOMAIN"
