"""The lab's cluster DNS: what it serves, who may use it, and how its server is started.

A real cluster runs CoreDNS behind the Service ``kube-system/kube-dns`` (10.96.0.10); the lab runs
dnsmasq from Debian in the same place: ``lace lab up`` writes that Service (fixed ClusterIPs
10.96.0.10 and fd00:10:96::a, ports 53/UDP ``dns`` and 53/TCP ``dns-tcp``) and one Pod behind it,
``kube-system/kube-dns-1`` (label ``k8s-app: kube-dns``, image ``lace/dnsmasq``), which the lab's
kubelet runs as dnsmasq (``dnsmasq_argv``) in the pod's network namespace. dnsmasq answers only
from a hosts-format file that the DNS feeder (``lace.lab.dnsfeed``) keeps current from the store:

- ``SERVICE.NAMESPACE.svc.cluster.local``: the Service's ClusterIPs (A and AAAA); for a headless
  Service (``clusterIP: None``) the ready addresses of its EndpointSlices instead, and
  ``HOSTNAME.SERVICE.NAMESPACE.svc.cluster.local`` for an endpoint that has a hostname;
- ``POD-IP-DASHED.NAMESPACE.pod.cluster.local``: each running pod's addresses
  (``10-244-0-5``, ``fd00-10-244--5``).

Names are cluster-wide, as namespaces are: a Service of network ``red`` has its record like any
other, and pods that cannot reach its VIP simply get no answer from it. ExternalName Services get
no record (a hosts file holds no CNAME). dnsmasq never forwards: names outside cluster.local
are NXDOMAIN at once, so no query leaves the lab.

Pods get ``/etc/resolv.conf`` as a kubelet writes it for ``dnsPolicy: ClusterFirst``
(``resolv_conf``), but only where the DNS Service can be reached: from its own network
(``default``) and from networks that import ``kube-system/kube-dns`` (``Network.spec.
importServices``). Other pods get no nameserver at all — a lookup fails at once instead of
waiting on an address the datapath will never deliver — and none of the machine's resolvers.

Plain values and no I/O: the kubelet, the feeder, ``lace lab up`` and the unit tests share them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lace.store import kinds as K
from lace.services.model import cluster_ips, is_headless, slices_by_service

CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "kube-system"
SERVICE = "kube-dns"
#: how Network.spec.importServices names the DNS Service
SERVICE_REF = f"{NAMESPACE}/{SERVICE}"
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


# ---- records ---------------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _addresses(values: Iterable[Any]) -> list[str]:
    """The valid IP addresses among ``values``, normalised (``None`` and junk are skipped)."""
    out = []
    for v in values:
        try:
            out.append(str(ipaddress.ip_address(v)))
        except (TypeError, ValueError):
            continue
    return out


def dashed(ip: str) -> str | None:
    """A pod address as a DNS label (``10-244-0-5``, ``fd00-10-244--5``), or None when the
    result cannot be one (an IPv6 address starting or ending with ``::``)."""
    label = str(ipaddress.ip_address(ip)).replace(".", "-").replace(":", "-")
    return None if label.startswith("-") or label.endswith("-") else label


def _ready(endpoint: Mapping[str, Any]) -> bool:
    # Kubernetes: a missing ready condition is to be read as ready
    return (endpoint.get("conditions") or {}).get("ready") is not False


def records(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
            pods: Iterable[Mapping[str, Any]], domain: str = CLUSTER_DOMAIN) -> list[tuple[str, str]]:
    """Every (name, address) the cluster DNS answers, sorted by name, then IPv4 before IPv6."""
    by_service = slices_by_service(slices)
    out: set[tuple[str, str]] = set()
    for svc in services:
        meta, spec = _meta(svc), svc.get("spec") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if not ns or not name or spec.get("type") == "ExternalName":
            continue
        fqdn = f"{name}.{ns}.svc.{domain}"
        if not is_headless(svc):
            out.update((fqdn, str(ip)) for ip in cluster_ips(svc))
            continue
        for s in by_service.get(f"{ns}/{name}", ()):
            for ep in s.get("endpoints") or ():
                if not _ready(ep):
                    continue
                for ip in _addresses(ep.get("addresses") or ()):
                    out.add((fqdn, ip))
                    if ep.get("hostname"):
                        out.add((f"{ep['hostname']}.{fqdn}", ip))
    for pod in pods:
        meta, status = _meta(pod), pod.get("status") or {}
        if status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        ips = [e.get("ip") for e in status.get("podIPs") or ()] or [status.get("podIP")]
        for ip in _addresses(ips):
            label = dashed(ip)
            if label:
                out.add((f"{label}.{meta.get('namespace', '')}.pod.{domain}", ip))
    return sorted(out, key=lambda r: (r[0], ipaddress.ip_address(r[1]).version, ipaddress.ip_address(r[1])))


def hosts_text(recs: Sequence[tuple[str, str]]) -> str:
    """``recs`` as the hosts-format file dnsmasq reads (``--addn-hosts``): one address and name a line."""
    head = "# the lab's cluster DNS records, written by lace.lab.dnsfeed from the store: do not edit\n"
    return head + "".join(f"{ip} {name}\n" for name, ip in recs)


# ---- resolv.conf -----------------------------------------------------------------------------


def reaches_cluster_dns(network: Mapping[str, Any] | None, service_network: str = K.DEFAULT_NETWORK) -> bool:
    """Whether pods of ``network`` (a Network object; None: it does not exist) can reach the DNS
    Service's VIPs: it is the Service's own network or imports the Service."""
    if network is None:
        return False
    if _meta(network).get("name") == service_network:
        return True
    return SERVICE_REF in ((network.get("spec") or {}).get("importServices") or ())


def resolv_conf(namespace: str, pod_ips: Iterable[str], *, reachable: bool,
                nameservers: Sequence[str] = CLUSTER_IPS, domain: str = CLUSTER_DOMAIN) -> str:
    """The pod's /etc/resolv.conf, as a kubelet writes it for ``dnsPolicy: ClusterFirst``: the
    cluster DNS addresses of the families the pod has an address in, the namespace's search path
    and ``ndots:5``; without a nameserver (and so without a search path) when ``reachable`` is
    false, so that lookups fail at once instead of timing out."""
    families = {ipaddress.ip_address(ip).version for ip in _addresses(pod_ips)}
    servers = [ns for ns in nameservers if ipaddress.ip_address(ns).version in families] if reachable else []
    if not servers:
        return ("# written by the lace lab kubelet: this pod's network cannot reach the cluster DNS\n"
                f"# ({SERVICE_REF}: neither its network nor imported), so it has no nameserver\n")
    return ("# written by the lace lab kubelet (dnsPolicy ClusterFirst)\n"
            f"search {namespace}.svc.{domain} svc.{domain} {domain}\n"
            + "".join(f"nameserver {ns}\n" for ns in servers)
            + "options ndots:5\n")


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
