"""The lab's cluster DNS: what it serves, who may use it, and how its server is started.

A real cluster runs CoreDNS behind the Service ``kube-system/kube-dns`` (10.96.0.10); the lab runs
dnsmasq from Debian in the same place: ``lace lab up`` writes that Service (fixed ClusterIPs
10.96.0.10 and fd00:10:96::a, ports 53/UDP ``dns`` and 53/TCP ``dns-tcp``) and one Pod behind it,
``kube-system/kube-dns-1`` (label ``k8s-app: kube-dns``, image ``lace/dnsmasq``), which the lab's
kubelet runs as ``lace.lab.dnsserver`` (``dnsmasq_argv``): dnsmasq in the pod's network namespace,
one on port 53 and one behind it for SRV records, which dnsmasq cannot re-read. They answer only
from the files that the DNS feeder (``lace.lab.dnsfeed``) keeps current from the store:

- ``SERVICE.NAMESPACE.svc.cluster.local``: the Service's ClusterIPs (A and AAAA); for a headless
  Service (``clusterIP: None``) the ready addresses of its EndpointSlices instead, and
  ``HOSTNAME.SERVICE.NAMESPACE.svc.cluster.local`` for each of its ready endpoints, by its
  hostname (a pod's ``spec.hostname`` when its ``spec.subdomain`` names the Service) or, without
  one, a name made from its address (``10-244-0-5``; ``endpoint_hostname``);
- ``_PORT._PROTO.SERVICE.NAMESPACE.svc.cluster.local`` (SRV) for each named port: at the
  Service's name and port, or for a headless Service one per ready endpoint at its
  ``HOSTNAME.SERVICE...`` name and the pods' port (``srv_records``);
- ``POD-IP-DASHED.NAMESPACE.pod.cluster.local``: each running pod's addresses
  (``10-244-0-5``, ``fd00-10-244--5``).

Names are cluster-wide, as namespaces are: a Service of network ``red`` has its record like any
other, and pods that cannot reach its VIP simply get no answer from it. ExternalName Services get
no record (a hosts file holds no CNAME). Answers are the same from every network that reaches
the DNS Service: they all reach the one pod. dnsmasq never forwards out of that pod: names
outside cluster.local are NXDOMAIN at once, so no query leaves the lab.

Pods get ``/etc/resolv.conf`` as a kubelet writes it for ``dnsPolicy: ClusterFirst``
(``resolv_conf``), but only where the DNS Service can be reached: from its own network
(``default``) and from networks that import ``kube-system/kube-dns`` (``Network.spec.
importServices``). Other pods get no nameserver at all — a lookup fails at once instead of
waiting on an address the datapath will never deliver — and none of the machine's resolvers.

Plain values and no I/O: the kubelet, the feeder, ``lace lab up`` and the unit tests share them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

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

#: what a DNS label looks like (port names and hostnames are checked by the store; slices written by
#: users are not all, and nothing else may reach dnsmasq's configuration)
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: the protocols a Service port may have, as SRV names spell them
_SRV_PROTOCOLS = ("tcp", "udp", "sctp")

#: under the lab's state dir: the records files (addresses, SRV records) and a pid file per
#: running dnsmasq and per DNS pod's server (``lace.lab.dnsserver``)
DNS_DIR = "dns"
HOSTS_FILE = "hosts"
SRV_FILE = "srv.conf"
PID_GLOB = "dnsmasq-*.pid"
SERVER_PID_GLOB = "dnsmasq-*.server"
#: the two ports (on the DNS pod's loopback) its SRV dnsmasq takes turns on
SRV_PORTS = (10053, 10054)
SRV_ADDRESS = "127.0.0.1"


def pid_file_name(uid: str) -> str:
    """The pid file of the dnsmasq serving pod ``uid`` (matches ``PID_GLOB``)."""
    return f"dnsmasq-{uid}.pid"


def server_files(pid_file: str) -> dict[str, str]:
    """The files of the DNS pod whose front dnsmasq writes ``pid_file`` (``dnsmasq-UID.pid``), all
    beside it: the server's pid file (``server``, matches ``SERVER_PID_GLOB``), the front's
    forwarding file (``servers``), and per SRV port the SRV dnsmasq's configuration and pid file
    (``srv-PORT.conf``, ``srv-PORT.pid``, the latter matching ``PID_GLOB``)."""
    stem = pid_file[:-len(".pid")] if pid_file.endswith(".pid") else pid_file
    out = {"server": f"{stem}.server", "servers": f"{stem}.servers"}
    for port in SRV_PORTS:
        out[f"srv-{port}.conf"] = f"{stem}.srv-{port}.conf"
        out[f"srv-{port}.pid"] = f"{stem}.srv-{port}.pid"
    return out


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


def endpoint_hostname(endpoint: Mapping[str, Any]) -> str | None:
    """The spec's *hostname* of a headless Service's endpoint: its ``hostname`` field, else a name
    unique within the Service made from its first address as CoreDNS makes it (``10-244-1-5``;
    the full IPv6 form, ``fd00-0010-...``, when the short one cannot be a DNS label); None when
    it has neither a valid hostname nor a valid address."""
    hostname = endpoint.get("hostname")
    if hostname:
        return hostname if isinstance(hostname, str) and _LABEL.match(hostname) else None
    addrs = _addresses(endpoint.get("addresses") or ())
    if not addrs:
        return None
    return dashed(addrs[0]) or ipaddress.ip_address(addrs[0]).exploded.replace(":", "-")


def _ready_endpoints(by_service: Mapping[str, list[Mapping[str, Any]]], key: str):
    """(slice, endpoint, its hostname) for each ready endpoint of the Service ``key``'s slices."""
    for s in by_service.get(key, ()):
        for ep in s.get("endpoints") or ():
            if _ready(ep):
                yield s, ep, endpoint_hostname(ep)


def _services(services: Iterable[Mapping[str, Any]]):
    """(the Service, its namespace, name and spec) for each Service that has names (an
    ExternalName one has none: a hosts file holds no CNAME)."""
    for svc in services:
        meta, spec = _meta(svc), svc.get("spec") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if ns and name and spec.get("type") != "ExternalName":
            yield svc, ns, name, spec


def records(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
            pods: Iterable[Mapping[str, Any]], domain: str = CLUSTER_DOMAIN) -> list[tuple[str, str]]:
    """Every (name, address) the cluster DNS answers, sorted by name, then IPv4 before IPv6."""
    by_service = slices_by_service(slices)
    out: set[tuple[str, str]] = set()
    for svc, ns, name, _ in _services(services):
        fqdn = f"{name}.{ns}.svc.{domain}"
        if not is_headless(svc):
            out.update((fqdn, str(ip)) for ip in cluster_ips(svc))
            continue
        for _, ep, hostname in _ready_endpoints(by_service, f"{ns}/{name}"):
            for ip in _addresses(ep.get("addresses") or ()):
                out.add((fqdn, ip))
                # the target of the endpoint's SRV records, with or without a hostname of its own
                if hostname:
                    out.add((f"{hostname}.{fqdn}", ip))
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


class Srv(NamedTuple):
    """One SRV record: ``name`` (``_PORT._PROTO.SERVICE.NAMESPACE.svc.ZONE``) points at port
    ``port`` of ``target``."""
    name: str
    priority: int
    weight: int
    port: int
    target: str


def _srv_owner(port: Mapping[str, Any], fqdn: str) -> str | None:
    """``_PORT._PROTO.<fqdn>`` for a named port, None for an unnamed one (it has no SRV record) or
    one whose name or protocol could not be part of a DNS name."""
    name, proto = port.get("name"), str(port.get("protocol") or "TCP").lower()
    if not isinstance(name, str) or not _LABEL.match(name) or proto not in _SRV_PROTOCOLS:
        return None
    return f"_{name}._{proto}.{fqdn}"


def _port_number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536 else None


def srv_records(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
                domain: str = CLUSTER_DOMAIN) -> list[Srv]:
    """Every SRV record of the cluster DNS (the Kubernetes DNS specification, 2.3.2 and 2.4.2),
    sorted: per named port of a Service with a ClusterIP, one record pointing at the Service's
    name and port; per named port of a headless Service, one record per ready endpoint, pointing
    at ``HOSTNAME.SERVICE...`` (``endpoint_hostname``) and the endpoint's port of that name (the
    EndpointSlice's, where a named targetPort is resolved). Unnamed ports have none.

    The specification leaves priority and weight open; they are CoreDNS': priority 0, and the
    weight 100 shared out evenly between the records of a name (100 for one, 50 each for two)."""
    by_service = slices_by_service(slices)
    found: set[tuple[str, int, str]] = set()
    for svc, ns, name, spec in _services(services):
        fqdn = f"{name}.{ns}.svc.{domain}"
        if not is_headless(svc):
            if not cluster_ips(svc):   # no address yet: a target without a record would dangle
                continue
            for port in spec.get("ports") or ():
                owner, number = _srv_owner(port, fqdn), _port_number(port.get("port"))
                if owner and number:
                    found.add((owner, number, fqdn))
            continue
        for s, ep, hostname in _ready_endpoints(by_service, f"{ns}/{name}"):
            if not hostname or not _addresses(ep.get("addresses") or ()):
                continue
            for port in s.get("ports") or ():
                owner, number = _srv_owner(port, fqdn), _port_number(port.get("port"))
                if owner and number:
                    found.add((owner, number, f"{hostname}.{fqdn}"))
    per_name: dict[str, int] = {}
    for owner, _, _ in found:
        per_name[owner] = per_name.get(owner, 0) + 1
    return sorted(Srv(owner, 0, max(1, 100 // per_name[owner]), number, target)
                  for owner, number, target in found)


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


def srv_text(srvs: Sequence[Srv]) -> str:
    """``srvs`` as the dnsmasq configuration file the SRV dnsmasq reads (``--conf-file``):
    ``srv-host=NAME,TARGET,PORT,PRIORITY,WEIGHT`` a line (dnsmasq's order, not the record's)."""
    head = "# the lab's cluster DNS SRV records, written by lace.lab.dnsfeed from the store: do not edit\n"
    return head + "".join(f"srv-host={r.name},{r.target},{r.port},{r.priority},{r.weight}\n" for r in srvs)


def srv_names(text: str) -> list[str]:
    """The record names an ``srv_text`` file holds, sorted, each once."""
    return sorted({line[len("srv-host="):].split(",", 1)[0] for line in text.splitlines()
                   if line.startswith("srv-host=")})


def servers_text(names: Iterable[str], ports: Sequence[int] = SRV_PORTS, address: str = SRV_ADDRESS) -> str:
    """The front dnsmasq's ``--servers-file``: each SRV record name (and nothing else) forwarded to
    the SRV dnsmasq at ``address`` on each of ``ports`` (with ``--all-servers``, to all of them:
    whichever listens answers)."""
    head = "# the SRV names, forwarded to this DNS pod's SRV dnsmasq (lace.lab.dnsserver): do not edit\n"
    return head + "".join(f"server=/{name}/{address}#{port}\n" for name in names for port in ports)


def _common_argv(binary: str) -> list[str]:
    return [
        binary, "--keep-in-foreground", "--log-facility=-",
        # nothing of the machine's: no /etc/dnsmasq.conf, resolv.conf (so no upstream) or /etc/hosts
        "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
        # any name it has no record for is NXDOMAIN at once (records take precedence over this)
        "--address=/#/",
        # stays root like every lab process: the lab's state dir may be private to root
        "--user=root",
    ]


def front_argv(listen: Iterable[str], hosts_file: str, pid_file: str, servers_file: str,
               args: Sequence[str] = (), binary: str = "dnsmasq") -> list[str]:
    """The DNS pod's front dnsmasq: on port 53 (UDP and TCP) of the pod's addresses ``listen``,
    answering from ``hosts_file`` and forwarding the SRV names ``servers_file`` lists to the SRV
    dnsmasq (both files re-read on SIGHUP), never anything of the machine's; then the container's
    ``args``. A forwarded query goes to both SRV ports at once (``--all-servers``): the first
    answer is the client's, so one SRV dnsmasq can take over from the other without a query
    lost. It caches nothing, so every forwarded query is answered by the SRV dnsmasq of the
    moment (its own records are not cached anyway)."""
    return _common_argv(binary) + [
        f"--port={PORT}", "--bind-dynamic",
        *(f"--listen-address={ip}" for ip in _addresses(listen)),
        f"--addn-hosts={hosts_file}", f"--servers-file={servers_file}", "--all-servers", "--cache-size=0",
        f"--pid-file={pid_file}",
    ] + list(args)


def srv_argv(port: int, hosts_file: str, srv_file: str, pid_file: str, args: Sequence[str] = (),
             binary: str = "dnsmasq", address: str = SRV_ADDRESS) -> list[str]:
    """An SRV dnsmasq: on ``address#port`` (the DNS pod's loopback), answering the SRV records of
    ``srv_file`` with the addresses of ``hosts_file`` for their targets (the Additional section);
    then the container's ``args`` (the same TTL and local domain as the front)."""
    return _common_argv(binary) + [
        f"--port={port}", "--bind-interfaces", f"--listen-address={address}",
        f"--addn-hosts={hosts_file}", f"--conf-file={srv_file}", f"--pid-file={pid_file}",
    ] + list(args)


def dnsmasq_argv(listen: Iterable[str], hosts_file: str, pid_file: str, args: Sequence[str] = (),
                 binary: str = "dnsmasq") -> list[str]:
    """What the kubelet runs for a DNS pod: ``lace.lab.dnsserver``, which runs dnsmasq — the front
    on port 53 of the pod's addresses ``listen`` (it writes ``pid_file`` once it listens) and an SRV
    dnsmasq behind it — with the records of ``hosts_file`` and of ``SRV_FILE`` beside it, and the
    container's ``args`` (see ``lace.lab.dnsserver`` for why two)."""
    argv = [sys.executable, "-m", "lace.lab.dnsserver", "--dnsmasq", binary, "--hosts", hosts_file,
            "--srv", os.path.join(os.path.dirname(hosts_file), SRV_FILE), "--pid-file", pid_file]
    for ip in _addresses(listen):
        argv += ["--listen", ip]
    # the container's args go after "--" whatever they look like
    return argv + ["--", *args]
