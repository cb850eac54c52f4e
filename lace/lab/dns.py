"""The lab's cluster DNS: what it serves and how its server is started.

A real cluster runs CoreDNS behind the Service ``kube-system/kube-dns`` (10.96.0.10); the lab runs
dnsmasq from Debian in the same place: ``lace lab up`` writes that Service (fixed ClusterIPs
10.96.0.10 and fd00:10:96::a, ports 53/UDP ``dns`` and 53/TCP ``dns-tcp``) and one Pod behind it,
``kube-system/kube-dns-1`` (label ``k8s-app: kube-dns``, image ``lace/dnsmasq``), which the lab's
kubelet runs as dnsmasq (``dnsmasq_argv``) in the pod's network namespace. dnsmasq answers names
under cluster.local only from the hosts-format file ``<state>/dns/hosts`` (re-read on SIGHUP) and
never forwards: names outside cluster.local are NXDOMAIN at once, so no query leaves the lab.

Plain values and no I/O: the kubelet, ``lace lab up`` and the unit tests share them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any


CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "kube-system"
SERVICE = "kube-dns"
#: the DNS Service's ClusterIPs, fixed as in a kubeadm cluster (the tenth address of each range)
CLUSTER_IPS = ("10.96.0.10", "fd00:10:96::a")
LABELS = {"k8s-app": "kube-dns"}
POD = "kube-dns-1"
#: the image that makes the lab's kubelet run dnsmasq instead of the podserver
DNSMASQ_IMAGE = "lace/dnsmasq"
PORT = 53
#: seconds a client may cache an answer (CoreDNS' kubernetes plugin uses 5 too)
TTL = 5

#: under the lab's state dir: the records file and a pid file per running dnsmasq
DNS_DIR = "dns"
HOSTS_FILE = "hosts"
PID_GLOB = "dnsmasq-*.pid"


def pid_file_name(uid: str) -> str:
    """The pid file of the dnsmasq serving pod ``uid`` (matches ``PID_GLOB``)."""
    return f"dnsmasq-{uid}.pid"


# ---- the objects `lace lab up` writes --------------------------------------------------------


def cluster_objects() -> list[dict]:
    """The DNS Service and the Pod behind it, as a cluster's addon manager would create them."""
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {"selector": dict(LABELS), "clusterIP": CLUSTER_IPS[0], "clusterIPs": list(CLUSTER_IPS),
                 "ipFamilyPolicy": "RequireDualStack",
                 "ports": [{"name": "dns", "port": PORT, "protocol": "UDP", "targetPort": PORT},
                           {"name": "dns-tcp", "port": PORT, "protocol": "TCP", "targetPort": PORT}]},
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
            "name": "dnsmasq", "image": DNSMASQ_IMAGE,
            # what the server answers (the kubelet adds where it listens and what it reads)
            "args": [f"--local=/{CLUSTER_DOMAIN}/", f"--local-ttl={TTL}"],
            "ports": [{"name": "dns", "containerPort": PORT, "protocol": "UDP"},
                      {"name": "dns-tcp", "containerPort": PORT, "protocol": "TCP"}]}]},
    }
    return [service, pod]


def _addresses(values: Iterable[Any]) -> list[str]:
    """The valid IP addresses among ``values``, normalised (``None`` and junk are skipped)."""
    out = []
    for v in values:
        try:
            out.append(str(ipaddress.ip_address(v)))
        except (TypeError, ValueError):
            continue
    return out


# ---- the server --------------------------------------------------------------------------------


def dnsmasq_argv(listen: Iterable[str], hosts_file: str, pid_file: str, args: Sequence[str] = (),
                 binary: str = "dnsmasq") -> list[str]:
    """dnsmasq for one DNS pod: on port 53 (UDP and TCP) of the pod's addresses ``listen``, answering
    from ``hosts_file`` (re-read on SIGHUP) and never from anything of the machine's, then the
    container's ``args``."""
    argv = [
        binary, "--keep-in-foreground", "--log-facility=-",
        # nothing of the machine's: no /etc/dnsmasq.conf, resolv.conf (so no upstream) or /etc/hosts
        "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
        # any name it has no record for is NXDOMAIN at once (records take precedence over this)
        "--address=/#/",
        # stays root like every lab process: the lab's state dir may be private to root
        "--user=root",
        f"--port={PORT}", "--bind-dynamic",
        *(f"--listen-address={ip}" for ip in _addresses(listen)),
        f"--addn-hosts={hosts_file}", f"--pid-file={pid_file}",
    ]
    return argv + list(args)
