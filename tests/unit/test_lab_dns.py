"""The lab's cluster DNS as plain values: the dnsmasq command line and the objects `lace lab up`
writes (accepted by a real store, as written)."""

from __future__ import annotations

from lace.lab import dns
from lace.lab.kubelet import pod_args, pod_image
from lace.store import SqliteStore


# ---- the server and its objects -----------------------------------------------------------------

def test_dnsmasq_never_uses_anything_of_the_machines_and_listens_on_the_pod():
    argv = dns.dnsmasq_argv(["10.244.0.1", "fd00:10:244::1", "bogus"], "/s/dns/hosts", "/s/dns/dnsmasq-u.pid",
                            ["--local=/cluster.local/"])
    assert argv[0] == "dnsmasq"
    for flag in ("--keep-in-foreground", "--no-resolv", "--no-hosts", "--conf-file=/dev/null", "--address=/#/",
                 "--port=53", "--listen-address=10.244.0.1", "--listen-address=fd00:10:244::1",
                 "--addn-hosts=/s/dns/hosts", "--pid-file=/s/dns/dnsmasq-u.pid"):
        assert flag in argv, flag
    assert not any("bogus" in a for a in argv)
    assert not any(a.startswith("--server") or a.startswith("--resolv-file") for a in argv), "never forwards"
    assert argv[-1] == "--local=/cluster.local/", "the container's args come last"


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
