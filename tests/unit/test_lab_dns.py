"""The lab's cluster DNS as plain values: the records the store yields (services of both families,
headless services, pods, deletions; SRV records of named ports), the hosts and SRV files,
resolv.conf per network, the dnsmasq command lines, and the objects `lace lab up` writes
(accepted by a real store, as written)."""

from __future__ import annotations

import json
import os

import pytest

from lace.lab import dns
from lace.lab.kubelet import Kubelet, pod_args, pod_image
from lace.store import SqliteStore
from lace.store import kinds as K


def service(name, ns="shop", cluster_ips=("10.96.0.20",), **spec):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": cluster_ips[0], "clusterIPs": list(cluster_ips), "ports": [{"port": 80}], **spec}}


def headless(name, ns="shop", **spec):
    return service(name, ns, cluster_ips=("None",), **spec)


def endpoint(ip, ready=True, hostname=None):
    ep = {"addresses": [ip], "conditions": {"ready": ready}}
    if ready is None:
        del ep["conditions"]["ready"]
    if hostname:
        ep["hostname"] = hostname
    return ep


def slice_(service_name, family, *endpoints, ns="shop", name=None, ports=({"port": 80},)):
    return {"apiVersion": K.DISCOVERY_API_VERSION, "kind": "EndpointSlice",
            "metadata": {"name": name or f"{service_name}-{family.lower()}", "namespace": ns,
                         "labels": {K.SERVICE_NAME_LABEL: service_name}},
            "addressType": family, "endpoints": list(endpoints), "ports": list(ports)}


def pod(name, *ips, ns="shop", phase="Running", deleting=False):
    meta = {"name": name, "namespace": ns}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "status": {"phase": phase, "podIPs": [{"ip": ip} for ip in ips]}}


def names(recs):
    out = {}
    for name, ip in recs:
        out.setdefault(name, []).append(ip)
    return out


# ---- records -----------------------------------------------------------------------------------

def test_a_dual_stack_service_gets_both_cluster_ips_ipv4_first():
    recs = dns.records([service("web", cluster_ips=("fd00:10:96::14", "10.96.0.20"))], [], [])
    assert recs == [("web.shop.svc.cluster.local", "10.96.0.20"), ("web.shop.svc.cluster.local", "fd00:10:96::14")]


def test_a_single_stack_service_gets_its_one_address():
    recs = dns.records([service("db", ns="data", cluster_ips=("fd00:10:96::7",))], [], [])
    assert recs == [("db.data.svc.cluster.local", "fd00:10:96::7")]


def test_a_service_with_only_clusterip_set_still_gets_it():
    svc = service("old")
    del svc["spec"]["clusterIPs"]
    assert dns.records([svc], [], []) == [("old.shop.svc.cluster.local", "10.96.0.20")]


def test_a_headless_service_gets_the_ready_addresses_of_its_slices():
    slices = [slice_("hl", "IPv4", endpoint("10.244.1.5"), endpoint("10.244.2.5", ready=False),
                     endpoint("10.244.3.5", ready=None)),
              slice_("hl", "IPv6", endpoint("fd00:10:244::1:5")),
              # another service's slice, and a slice of the same name in another namespace
              slice_("web", "IPv4", endpoint("10.244.9.9")),
              slice_("hl", "IPv4", endpoint("10.244.8.8"), ns="other")]
    recs = names(dns.records([headless("hl"), service("web")], slices, []))
    # not ready: left out; no ready condition at all reads as ready (Kubernetes' rule)
    assert recs["hl.shop.svc.cluster.local"] == ["10.244.1.5", "10.244.3.5", "fd00:10:244::1:5"]
    assert recs["web.shop.svc.cluster.local"] == ["10.96.0.20"], "a service with a VIP ignores its slices"
    assert "hl.other.svc.cluster.local" not in recs, "no Service hl in namespace other"


def test_headless_endpoints_get_their_own_name_by_hostname_or_address():
    slices = [slice_("db", "IPv4", endpoint("10.244.1.5", hostname="db-0"), endpoint("10.244.2.5"),
                     endpoint("10.244.3.5", ready=False, hostname="db-2")),
              slice_("db", "IPv6", endpoint("fd00:10:244::1:5", hostname="db-0"), endpoint("fd00::"))]
    recs = names(dns.records([headless("db")], slices, []))
    # a hostname names each of its addresses, one of each family here
    assert recs["db-0.db.shop.svc.cluster.local"] == ["10.244.1.5", "fd00:10:244::1:5"]
    # without one, a name unique in the service from the address (as CoreDNS makes it)
    assert recs["10-244-2-5.db.shop.svc.cluster.local"] == ["10.244.2.5"]
    assert recs["fd00-0000-0000-0000-0000-0000-0000-0000.db.shop.svc.cluster.local"] == ["fd00::"]
    assert "db-2.db.shop.svc.cluster.local" not in recs, "not ready: no name"
    assert recs["db.shop.svc.cluster.local"] == ["10.244.1.5", "10.244.2.5", "fd00::", "fd00:10:244::1:5"]


@pytest.mark.parametrize("ep,hostname", [
    (endpoint("10.244.1.5", hostname="web-0"), "web-0"), (endpoint("10.244.1.5"), "10-244-1-5"),
    (endpoint("fd00:10:244::5"), "fd00-10-244--5"), (endpoint("::1"), "0000-0000-0000-0000-0000-0000-0000-0001"),
    (endpoint("10.244.1.5", hostname="Bad_Name"), None), ({"addresses": ["junk"]}, None), ({}, None)])
def test_endpoint_hostname(ep, hostname):
    assert dns.endpoint_hostname(ep) == hostname


def test_a_headless_service_without_ready_endpoints_has_no_record():
    recs = dns.records([headless("hl")], [slice_("hl", "IPv4", endpoint("10.244.1.5", ready=False))], [])
    assert recs == []


def test_a_deleted_service_takes_its_records_along():
    slices = [slice_("hl", "IPv4", endpoint("10.244.1.5"))]
    before = names(dns.records([service("web"), headless("hl")], slices, []))
    assert set(before) == {"web.shop.svc.cluster.local", "hl.shop.svc.cluster.local",
                           "10-244-1-5.hl.shop.svc.cluster.local"}
    # the store lists no Service any more; the slices may outlive it for a moment
    after = names(dns.records([service("web")], slices, []))
    assert set(after) == {"web.shop.svc.cluster.local"}
    assert dns.srv_records([service("web")], slices) == []


def test_externalname_services_have_no_record():
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": "shop"},
           "spec": {"type": "ExternalName", "externalName": "db.example.com"}}
    assert dns.records([svc], [], []) == []


def test_running_pods_get_dashed_address_records_in_their_namespace():
    pods = [pod("a", "10.244.1.5", "fd00:10:244::1:5"), pod("b", "10.244.2.5", phase="Pending"),
            pod("c", "10.244.3.5", deleting=True), pod("d", "10.10.0.1", ns="alpha")]
    recs = names(dns.records([], [], pods))
    assert recs == {"10-244-1-5.shop.pod.cluster.local": ["10.244.1.5"],
                    "fd00-10-244--1-5.shop.pod.cluster.local": ["fd00:10:244::1:5"],
                    "10-10-0-1.alpha.pod.cluster.local": ["10.10.0.1"]}


@pytest.mark.parametrize("ip,label", [("10.244.0.1", "10-244-0-1"), ("fd00:10:244::1", "fd00-10-244--1"),
                                      ("FD00:0010::0001", "fd00-10--1"), ("::1", None), ("fe80::", None)])
def test_dashed_labels(ip, label):
    assert dns.dashed(ip) == label


def test_records_are_sorted_deduplicated_and_skip_junk_addresses():
    svc = service("web", cluster_ips=("10.96.0.20", "not-an-ip"))
    twins = [pod("a", "10.244.1.5"), pod("a2", "10.244.1.5")]   # same address, two networks
    recs = dns.records([svc, service("api")], [], twins)
    assert recs == sorted(set(recs)) and len(recs) == len(set(recs))
    assert [r for r in recs if r[0].endswith(".svc.cluster.local")] == [
        ("api.shop.svc.cluster.local", "10.96.0.20"), ("web.shop.svc.cluster.local", "10.96.0.20")]
    assert recs.count(("10-244-1-5.shop.pod.cluster.local", "10.244.1.5")) == 1


def test_another_cluster_domain():
    assert dns.records([service("web")], [], [], domain="lab.test") == [("web.shop.svc.lab.test", "10.96.0.20")]


def test_hosts_text_is_one_address_and_name_a_line():
    text = dns.hosts_text([("web.shop.svc.cluster.local", "10.96.0.20"),
                           ("web.shop.svc.cluster.local", "fd00:10:96::14")])
    lines = text.splitlines()
    assert lines[0].startswith("#")
    assert lines[1:] == ["10.96.0.20 web.shop.svc.cluster.local", "fd00:10:96::14 web.shop.svc.cluster.local"]
    assert dns.hosts_text([]).count("\n") == 1


# ---- SRV records -------------------------------------------------------------------------------

WEB_PORTS = [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
             {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "sig", "port": 5060, "protocol": "SCTP"}]


def test_a_clusterip_service_gets_one_srv_per_named_port_pointing_at_its_name():
    svc = service("web", cluster_ips=("10.96.0.20", "fd00:10:96::14"), ports=WEB_PORTS)
    assert dns.srv_records([svc], []) == [
        dns.Srv("_dns._udp.web.shop.svc.cluster.local", 0, 100, 53, "web.shop.svc.cluster.local"),
        dns.Srv("_http._tcp.web.shop.svc.cluster.local", 0, 100, 80, "web.shop.svc.cluster.local"),
        dns.Srv("_sig._sctp.web.shop.svc.cluster.local", 0, 100, 5060, "web.shop.svc.cluster.local")]


def test_unnamed_ports_and_services_without_names_have_no_srv():
    ext = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": "shop"},
           "spec": {"type": "ExternalName", "externalName": "db.example.com", "ports": WEB_PORTS}}
    pending = service("new", cluster_ips=("",), ports=WEB_PORTS)   # no ClusterIP yet: no target record
    junk = service("odd", ports=[{"name": "Bad,Name", "port": 80}, {"name": "x", "port": 81, "protocol": "ICMP"},
                                 {"name": "y", "port": "80"}])
    assert dns.srv_records([service("plain"), ext, pending, junk], []) == []


def test_a_headless_service_gets_one_srv_per_ready_endpoint_and_named_port():
    ports = ({"name": "http", "port": 8080, "protocol": "TCP"}, {"port": 9090})   # the slice's: target ports
    slices = [slice_("db", "IPv4", endpoint("10.244.1.5", hostname="db-0"), endpoint("10.244.2.5"),
                     endpoint("10.244.3.5", ready=False), ports=ports),
              slice_("db", "IPv6", endpoint("fd00:10:244::1:5", hostname="db-0"), ports=ports)]
    srvs = dns.srv_records([headless("db", ports=[{"name": "http", "port": 80}, {"port": 90}])], slices)
    # db-0 has two addresses but is one endpoint name: one record; the unready one has none;
    # two records share the weight
    assert srvs == [dns.Srv("_http._tcp.db.shop.svc.cluster.local", 0, 50, 8080, "10-244-2-5.db.shop.svc.cluster.local"),
                    dns.Srv("_http._tcp.db.shop.svc.cluster.local", 0, 50, 8080, "db-0.db.shop.svc.cluster.local")]
    # every target has its address records
    recs = names(dns.records([headless("db")], slices, []))
    assert recs["db-0.db.shop.svc.cluster.local"] == ["10.244.1.5", "fd00:10:244::1:5"]
    assert recs["10-244-2-5.db.shop.svc.cluster.local"] == ["10.244.2.5"]


def test_srv_follows_a_renamed_or_removed_port():
    before = dns.srv_records([service("web", ports=[{"name": "http", "port": 80}])], [])
    renamed = dns.srv_records([service("web", ports=[{"name": "web", "port": 80}])], [])
    removed = dns.srv_records([service("web", ports=[{"port": 80}])], [])
    assert [r.name for r in before] == ["_http._tcp.web.shop.svc.cluster.local"]
    assert [r.name for r in renamed] == ["_web._tcp.web.shop.svc.cluster.local"]
    assert removed == []


def test_headless_weights_split_100_and_never_reach_zero():
    eps = [endpoint(f"10.244.{i // 250}.{i % 250 + 1}") for i in range(150)]
    srvs = dns.srv_records([headless("big")], [slice_("big", "IPv4", *eps, ports=({"name": "http", "port": 80},))])
    assert len(srvs) == 150 and {r.weight for r in srvs} == {1}
    three = dns.srv_records([headless("t")], [slice_("t", "IPv4", *eps[:3], ports=({"name": "http", "port": 80},))])
    assert {r.weight for r in three} == {33}


def test_srv_text_and_the_names_it_holds():
    srvs = [dns.Srv("_http._tcp.web.shop.svc.cluster.local", 0, 100, 80, "web.shop.svc.cluster.local"),
            dns.Srv("_http._tcp.db.shop.svc.cluster.local", 0, 50, 8080, "db-0.db.shop.svc.cluster.local"),
            dns.Srv("_http._tcp.db.shop.svc.cluster.local", 0, 50, 8080, "db-1.db.shop.svc.cluster.local")]
    text = dns.srv_text(srvs)
    lines = text.splitlines()
    assert lines[0].startswith("#")
    # dnsmasq's --srv-host order: name, target, port, priority, weight
    assert lines[1] == "srv-host=_http._tcp.web.shop.svc.cluster.local,web.shop.svc.cluster.local,80,0,100"
    assert dns.srv_names(text) == ["_http._tcp.db.shop.svc.cluster.local", "_http._tcp.web.shop.svc.cluster.local"]
    assert dns.srv_names(dns.srv_text([])) == []
    servers = dns.servers_text(dns.srv_names(text)).splitlines()
    assert servers[1:] == [f"server=/_http._tcp.{s}.shop.svc.cluster.local/127.0.0.1#{p}"
                           for s in ("db", "web") for p in dns.SRV_PORTS]


# ---- resolv.conf ---------------------------------------------------------------------------------

def network(name, imports=()):
    return {"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": name},
            "spec": {"cidrs": ["10.10.0.0/16"], "importServices": list(imports)}}


def test_who_reaches_the_cluster_dns():
    assert dns.reaches_cluster_dns(network("default"))
    assert dns.reaches_cluster_dns(network("red", ["alpha/web", "kube-system/kube-dns"]))
    assert not dns.reaches_cluster_dns(network("blue", ["alpha/web"]))
    assert not dns.reaches_cluster_dns(network("green"))
    assert not dns.reaches_cluster_dns(None)


def test_resolv_conf_of_a_dual_stack_pod():
    text = dns.resolv_conf("shop", ["10.244.1.5", "fd00:10:244::1:5"], reachable=True)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["search shop.svc.cluster.local svc.cluster.local cluster.local",
                     "nameserver 10.96.0.10", "nameserver fd00:10:96::a", "options ndots:5"]


def test_resolv_conf_names_only_the_servers_of_the_pods_families():
    v4 = dns.resolv_conf("shop", ["10.244.1.5"], reachable=True)
    v6 = dns.resolv_conf("shop", ["fd00:10:244::1:5"], reachable=True)
    assert [line for line in v4.splitlines() if line.startswith("nameserver")] == ["nameserver 10.96.0.10"]
    assert [line for line in v6.splitlines() if line.startswith("nameserver")] == ["nameserver fd00:10:96::a"]


def test_resolv_conf_without_a_reachable_server_has_no_nameserver_nor_search():
    for text in (dns.resolv_conf("shop", ["10.10.0.1", "fd10:10::1"], reachable=False),
                 dns.resolv_conf("shop", [], reachable=True)):
        assert all(line.startswith("#") for line in text.splitlines()), text
        assert "kube-system/kube-dns" in text


@pytest.mark.parametrize("net,imports,expect", [("default", None, True), ("red", ["kube-system/kube-dns"], True),
                                                ("blue", [], False), ("missing", None, False)])
def test_the_kubelet_writes_resolv_conf_by_the_pods_network(tmp_path, net, imports, expect):
    (tmp_path / "lab.json").write_text(json.dumps({"nodes": [{"name": "worker-1", "netns": "n1"}]}))
    store = SqliteStore(tmp_path / "store.db")
    store.apply_all(dns.cluster_objects()[:1])   # the Service must exist before a Network imports it
    if imports is not None and net != "default":
        store.apply({"apiVersion": K.LACE_API_VERSION, "kind": "Network", "metadata": {"name": net},
                     "spec": {"cidrs": ["10.10.0.0/16", "fd10:10::/64"], "importServices": imports}})
    kubelet = Kubelet("t", str(tmp_path))
    try:
        p = {"metadata": {"name": "p", "namespace": "shop", "annotations": {K.NETWORK_ANNOTATION: net}}}
        path = kubelet.write_resolv_conf(p, {"uid": "u1", "namespace": "shop"}, ["10.10.0.1", "fd10:10::1"])
        text = open(path).read()
    finally:
        kubelet.pool.shutdown()
        kubelet.store.close()
        store.close()
    assert path == str(tmp_path / "kubelet" / "u1.resolv.conf")
    assert ("nameserver 10.96.0.10" in text) == expect and ("nameserver fd00:10:96::a" in text) == expect
    assert ("search shop.svc.cluster.local" in text) == expect


# ---- the server and its objects -----------------------------------------------------------------

def _machine_free(argv):
    for flag in ("--keep-in-foreground", "--no-resolv", "--no-hosts", "--conf-file=/dev/null", "--address=/#/"):
        assert flag in argv, flag
    # (the front forwards only what its servers file lists: the SRV names, to its own loopback)
    assert not any(a.startswith(("--server=", "--resolv-file")) for a in argv), "never forwards out of the pod"


def test_the_front_dnsmasq_never_uses_anything_of_the_machines_and_listens_on_the_pod():
    argv = dns.front_argv(["10.244.0.1", "fd00:10:244::1", "bogus"], "/s/dns/hosts", "/s/dns/dnsmasq-u.pid",
                          "/s/dns/dnsmasq-u.servers", ["--local=/cluster.local/"])
    assert argv[0] == "dnsmasq"
    _machine_free(argv)
    for flag in ("--port=53", "--listen-address=10.244.0.1", "--listen-address=fd00:10:244::1",
                 "--addn-hosts=/s/dns/hosts", "--pid-file=/s/dns/dnsmasq-u.pid",
                 "--servers-file=/s/dns/dnsmasq-u.servers", "--all-servers", "--cache-size=0"):
        assert flag in argv, flag
    assert not any("bogus" in a for a in argv)
    assert argv[-1] == "--local=/cluster.local/", "the container's args come last"


def test_the_srv_dnsmasq_listens_on_loopback_only():
    argv = dns.srv_argv(10054, "/s/dns/hosts", "/s/dns/dnsmasq-u.srv-10054.conf", "/s/dns/dnsmasq-u.srv-10054.pid",
                        ["--local-ttl=5"], "/usr/sbin/dnsmasq")
    assert argv[0] == "/usr/sbin/dnsmasq"
    _machine_free(argv)
    assert [a for a in argv if a.startswith("--listen-address")] == ["--listen-address=127.0.0.1"]
    for flag in ("--port=10054", "--bind-interfaces", "--conf-file=/s/dns/dnsmasq-u.srv-10054.conf",
                 "--addn-hosts=/s/dns/hosts", "--pid-file=/s/dns/dnsmasq-u.srv-10054.pid"):
        assert flag in argv, flag
    assert argv[-1] == "--local-ttl=5"


def test_the_kubelet_runs_the_dns_server_with_the_pods_addresses_and_args():
    argv = dns.dnsmasq_argv(["10.244.0.1", "bogus"], "/s/dns/hosts", "/s/dns/dnsmasq-u.pid", ["--local-ttl=5"],
                            "/usr/sbin/dnsmasq")
    assert argv[1:3] == ["-m", "lace.lab.dnsserver"]
    assert argv[argv.index("--srv") + 1] == "/s/dns/srv.conf"
    assert argv[argv.index("--listen") + 1] == "10.244.0.1" and "bogus" not in argv
    assert argv[-2:] == ["--", "--local-ttl=5"]
    files = dns.server_files("/s/dns/dnsmasq-u.pid")
    assert files["server"] == "/s/dns/dnsmasq-u.server" and files["servers"] == "/s/dns/dnsmasq-u.servers"
    # the SRV dnsmasq's pid files are ones the feeder signals for a new hosts file, the server's is not
    import fnmatch
    assert all(fnmatch.fnmatch(os.path.basename(files[f"srv-{p}.pid"]), dns.PID_GLOB) for p in dns.SRV_PORTS)
    assert fnmatch.fnmatch("dnsmasq-u.server", dns.SERVER_PID_GLOB)
    assert not fnmatch.fnmatch("dnsmasq-u.server", dns.PID_GLOB)


def test_lab_up_objects_are_what_a_cluster_has_and_the_store_takes_them(tmp_path):
    svc, p = dns.cluster_objects()
    store = SqliteStore(tmp_path / "store.db")
    try:
        stored = [r.object for r in store.apply_all([svc, p])]
    finally:
        store.close()
    spec = stored[0]["spec"]
    assert (stored[0]["metadata"]["namespace"], stored[0]["metadata"]["name"]) == ("kube-system", "kube-dns")
    assert spec["clusterIPs"] == ["10.96.0.10", "fd00:10:96::a"] and spec["ipFamilies"] == ["IPv4", "IPv6"]
    assert sorted((x["name"], x["port"], x["protocol"]) for x in spec["ports"]) == [
        ("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]
    assert spec["selector"] == {"k8s-app": "kube-dns"} == stored[1]["metadata"]["labels"]
    assert pod_image(stored[1]) == dns.DNSMASQ_IMAGE
    assert "--local=/cluster.local/" in pod_args(stored[1])


def test_pod_image_and_args_of_plain_pods():
    assert pod_image({"spec": {"containers": [{"image": "lace/podserver"}]}}) == "lace/podserver"
    assert pod_image({"spec": {}}) == "" and pod_args({"spec": {}}) == []
    assert pod_args({"spec": {"containers": [{"args": ["-v", 3]}]}}) == ["-v", "3"]


def test_the_dns_server_reports_a_dnsmasq_it_cannot_run_and_leaves_no_file(tmp_path, caplog):
    import signal
    from lace.lab import dnsserver
    pid_file = tmp_path / "dnsmasq-u.pid"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        rc = dnsserver.main(["--dnsmasq", str(tmp_path / "no-dnsmasq"), "--hosts", str(tmp_path / "hosts"),
                             "--srv", str(tmp_path / "srv.conf"), "--pid-file", str(pid_file),
                             "--listen", "10.244.0.1"])
    finally:   # main sets its own, for its process
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert rc == 1
    assert "cannot run the SRV dnsmasq" in caplog.text and "No such file" in caplog.text
    assert list(tmp_path.iterdir()) == [], "its pid file and the SRV copies are removed"
    assert dnsserver.main(["--hosts", "h", "--srv", "s", "--pid-file", "p"]) == 2, "no address to listen on"
