"""Validation on write: structure by JSON Schema (schemas.py), meaning by the checks below.

``validate(obj, lookup)`` returns a normalised copy or raises ValidationError naming the object
(``Network "blue"``), the field (``spec.cidrs[1]``) and the fix. ``lookup`` answers questions about
the objects already stored (inside the writer's transaction, so a batch sees its own earlier objects).

The normalised copy carries the defaults Kubernetes fills in that need nothing but the object
itself (a Service's type, protocols, targetPorts, affinity timeout, traffic policies); what depends
on the cluster's ranges (cluster IPs, IP families, node ports, load-balancer addresses) is
allocate.py's, which runs later in the same write.
"""

from __future__ import annotations

import copy
import datetime
import functools
import ipaddress
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import jsonschema

from lace import probes as P
from lace.store import kinds as K
from lace.store.errors import UnknownKind, ValidationError
from lace.store.schemas import SCHEMAS
from lace.store.selectors import (InvalidSelector, label_key_problem, label_value_problem,
                                  validate_selector)

#: a Network's spec.conntrackLimit fits the datapath's 16-bit per-endpoint limit (lace_endpoint.ct_max)
CT_ENDPOINT_LIMIT_MAX = 0xFFFF

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HTTP_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
PROTOCOLS = ("TCP", "UDP", "SCTP")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
IP_FAMILIES = ("IPv4", "IPv6")
IP_FAMILY_POLICIES = ("SingleStack", "PreferDualStack", "RequireDualStack")
TRAFFIC_POLICIES = ("Cluster", "Local")
SESSION_AFFINITIES = ("None", "ClientIP")
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
#: a Service's clusterIP that asks for no virtual IP (a headless service)
HEADLESS = "None"
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400
#: Kubernetes' limits on one EndpointSlice
MAX_SLICE_ENDPOINTS = 1000
MAX_ENDPOINT_ADDRESSES = 100
MAX_SLICE_PORTS = 100
ALLOCATION_RESOURCES = ("id", "clusterIP", "nodePort", "loadBalancerIP")
POLICY_TYPES = ("Ingress", "Egress")
# Kinds whose names end up in DNS labels (namespaces, service names) or in annotations (networks).
_LABEL_NAMED = {"Namespace", "Service", "Network"}

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def ip_family(ip: IPAddress | IPNetwork) -> str:
    """``IPv4`` / ``IPv6``, as Service.spec.ipFamilies and EndpointSlice.addressType spell them."""
    return f"IPv{ip.version}"


def range_problem(net: IPNetwork) -> str | None:
    """Why a service or load-balancer range is too small to hand out addresses, or None."""
    limit = 30 if net.version == 4 else 126
    if net.prefixlen > limit:
        return f"{net} is too small to allocate from"
    return None


class Lookup(Protocol):
    """Read access to stored objects that semantic checks need (references, overlaps)."""

    def get_object(self, kind: str, name: str, namespace: str | None = None) -> dict | None: ...

    def list_objects(self, kind: str, namespace: str | None = None) -> list[dict]: ...


def object_ref(obj: Mapping[str, Any]) -> str:
    """``Network "blue"`` / ``Pod "demo/web"``: how messages name an object."""
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else "<unnamed>"
    ns = meta.get("namespace")
    info = K.BY_KIND.get(kind)
    if info is not None and info.namespaced and isinstance(ns, str) and ns:
        return f'{kind} "{ns}/{name}"'
    return f'{kind} "{name}"'


class _Checker:
    """Collects the context of one object under validation so checks can raise short errors."""

    def __init__(self, obj: dict, lookup: Lookup) -> None:
        self.obj = obj
        self.lookup = lookup
        self.ref = object_ref(obj)

    def fail(self, field: str | None, problem: str, fix: str | None = None) -> None:
        raise ValidationError(self.ref, field, problem, fix)

    # ---- shared field checks -------------------------------------------------------------------

    def cidr(self, value: Any, field: str) -> IPNetwork:
        if not isinstance(value, str):
            self.fail(field, f"{value!r} is not a CIDR", "write it as a string like 10.1.0.0/16")
        try:
            return ipaddress.ip_network(value, strict=True)
        except ValueError:
            pass
        try:
            loose = ipaddress.ip_network(value, strict=False)
        except ValueError:
            self.fail(field, f'"{value}" is not a valid IPv4 or IPv6 CIDR',
                      "write an address and prefix length like 10.1.0.0/16 or fd00:1::/64")
        self.fail(field, f'"{value}" has host bits set', f"use {loose}")
        raise AssertionError("unreachable")

    def ip(self, value: Any, field: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        try:
            return ipaddress.ip_address(value)
        except ValueError:
            self.fail(field, f'"{value}" is not a valid IPv4 or IPv6 address')
        raise AssertionError("unreachable")

    def family_ranges(self, values: list[Any], field: str) -> list[IPNetwork]:
        """At most two CIDRs, one per family, each large enough to allocate from (ServiceCIDR,
        Network.spec.serviceCIDRs)."""
        if len(values) > 2:
            self.fail(field, f"{len(values)} ranges given", "list at most two: one IPv4 and one IPv6")
        out: list[IPNetwork] = []
        for i, value in enumerate(values):
            net = self.cidr(value, f"{field}[{i}]")
            problem = range_problem(net)
            if problem:
                self.fail(f"{field}[{i}]", problem, "use at least a /30 (IPv4) or /126 (IPv6)")
            if out and out[0].version == net.version:
                self.fail(f"{field}[{i}]", f"a second {ip_family(net)} range ({net})",
                          "list one range per family")
            out.append(net)
        return out

    def port(self, value: Any, field: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            self.fail(field, f"port {value!r} is out of range", "use a number from 1 to 65535")

    def named_or_numeric_port(self, value: Any, field: str) -> None:
        if isinstance(value, str):
            if value.isdigit():
                self.port(int(value), field)
            elif len(value) > 15 or not _IANA_SVC_NAME.match(value):
                self.fail(field, f'"{value}" is not a valid port name',
                          "a named port is at most 15 lowercase letters, digits and '-', with a letter")
        else:
            self.port(value, field)

    def protocol(self, value: Any, field: str) -> None:
        if value is not None and value not in PROTOCOLS:
            self.fail(field, f"unsupported protocol {value!r}", "use TCP, UDP or SCTP")

    def selector(self, value: Any, field: str) -> None:
        try:
            validate_selector(value, field)
        except InvalidSelector as err:
            self.fail(err.field, err.problem)

    def labels(self, labels: Mapping[str, Any], field: str) -> None:
        for key, value in labels.items():
            problem = label_key_problem(key) or label_value_problem(value)
            if problem:
                self.fail(f"{field}.{key}", problem)

    def network_exists(self, name: Any, field: str) -> dict:
        net = self.lookup.get_object("Network", name) if isinstance(name, str) else None
        if net is None:
            self.fail(field, f'Network "{name}" does not exist',
                      f"create Network {name} first, or use an existing one (lace get networks)")
        assert net is not None
        return net

    def namespace_exists(self, name: str, field: str) -> None:
        if name in K.ALWAYS_NAMESPACES:
            return
        if self.lookup.get_object("Namespace", name) is None:
            self.fail(field, f'Namespace "{name}" does not exist', f"create Namespace {name} first")


def _network_cidrs(net: Mapping[str, Any]) -> list[IPNetwork]:
    out = []
    for c in (net.get("spec") or {}).get("cidrs") or []:
        try:
            out.append(ipaddress.ip_network(c, strict=False))
        except ValueError:
            continue
    return out


def _overlaps(a: IPNetwork, b: IPNetwork) -> bool:
    return a.version == b.version and a.overlaps(b)  # type: ignore[arg-type]


def _contained(a: IPNetwork, b: IPNetwork) -> bool:
    return a.version == b.version and a.subnet_of(b)  # type: ignore[arg-type]


# ---- per-kind semantic checks ------------------------------------------------------------------

def _check_namespace(c: _Checker) -> None:
    pass


def _check_node(c: _Checker) -> None:
    for i, cidr in enumerate((c.obj.get("spec") or {}).get("podCIDRs") or []):
        c.cidr(cidr, f"spec.podCIDRs[{i}]")


def _check_network(c: _Checker) -> None:
    name = c.obj["metadata"]["name"]
    spec = c.obj["spec"]
    cidrs: list[IPNetwork] = []
    for i, value in enumerate(spec["cidrs"]):
        net = c.cidr(value, f"spec.cidrs[{i}]")
        for j, other in enumerate(cidrs):
            if _overlaps(net, other):
                c.fail(f"spec.cidrs[{i}]", f"{net} overlaps spec.cidrs[{j}] ({other})",
                       "list each range once")
        cidrs.append(net)
    if name == K.DEFAULT_NETWORK:
        for other in c.lookup.list_objects("Network"):
            if other["metadata"]["name"] == name:
                continue
            for i, net in enumerate(cidrs):
                for theirs in _network_cidrs(other):
                    if _overlaps(net, theirs):
                        c.fail(f"spec.cidrs[{i}]",
                               f'{net} overlaps Network "{other["metadata"]["name"]}" ({theirs})',
                               "the default network may not overlap any other network")
    else:
        default = c.lookup.get_object("Network", K.DEFAULT_NETWORK)
        default_cidrs = (_network_cidrs(default) if default
                         else [ipaddress.ip_network(x) for x in K.DEFAULT_NETWORK_CIDRS])
        for i, net in enumerate(cidrs):
            for theirs in default_cidrs:
                if _overlaps(net, theirs):
                    c.fail(f"spec.cidrs[{i}]", f"{net} overlaps the default network ({theirs})",
                           "networks may overlap each other but never default: pick a range outside it")
    limit = spec.get("conntrackLimit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or not 0 <= limit <= CT_ENDPOINT_LIMIT_MAX):
        c.fail("spec.conntrackLimit", f"conntrack limit {limit!r} is out of range",
               f"use the most flows one pod may hold per conntrack table, 1 to {CT_ENDPOINT_LIMIT_MAX}, "
               "or 0 for no limit")
    for i, route in enumerate(spec.get("routes") or []):
        to = route["to"]
        if to == name:
            c.fail(f"spec.routes[{i}].to", f'a route from Network "{name}" to itself',
                   "remove it: a network always reaches its own CIDRs")
        if to != K.ROUTE_OUTSIDE:
            c.network_exists(to, f"spec.routes[{i}].to")
        for j, value in enumerate(route.get("cidrs") or []):
            c.cidr(value, f"spec.routes[{i}].cidrs[{j}]")
    for i, svc_range in enumerate(c.family_ranges(spec.get("serviceCIDRs") or [], "spec.serviceCIDRs")):
        for j, pods in enumerate(cidrs):
            if _overlaps(svc_range, pods):
                c.fail(f"spec.serviceCIDRs[{i}]", f"{svc_range} overlaps the pod range spec.cidrs[{j}] ({pods})",
                       "service addresses and pod addresses of one network must not overlap")
    seen: dict[str, int] = {}
    for i, ref in enumerate(spec.get("importServices") or []):
        field = f"spec.importServices[{i}]"
        ns, sep, svc = ref.partition("/")
        if not sep or not _DNS_LABEL.match(ns) or not _DNS_LABEL.match(svc):
            c.fail(field, f'"{ref}" is not namespace/name of a Service', "write it as kube-system/kube-dns")
        if ref in seen:
            c.fail(field, f'"{ref}" is listed twice (also spec.importServices[{seen[ref]}])',
                   "list each service once")
        seen[ref] = i


def _check_pod(c: _Checker) -> None:
    meta = c.obj["metadata"]
    c.namespace_exists(meta["namespace"], "metadata.namespace")
    c.network_exists(K.pod_network(c.obj), f"metadata.annotations.{K.NETWORK_ANNOTATION}")
    spec = c.obj.get("spec") or {}
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and grace < 0:
        c.fail("spec.terminationGracePeriodSeconds", f"{grace} is negative",
               "use 0 or more seconds (default 30; 0 stops the pod at once)")
    node = spec.get("nodeName")
    if node is not None and not _DNS_SUBDOMAIN.match(node):
        c.fail("spec.nodeName", f'"{node}" is not a valid node name',
               "use lowercase letters, digits, '-' and '.'")
    for field in ("hostname", "subdomain"):   # each one label of a DNS name, as Kubernetes checks them
        value = spec.get(field)
        if value is not None and (len(value) > 63 or not _DNS_LABEL.match(value)):
            c.fail(f"spec.{field}", f'"{value}" is not a DNS label',
                   "use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit")
    for i, container in enumerate(spec.get("containers") or []):
        for j, port in enumerate(container.get("ports") or []):
            where = f"spec.containers[{i}].ports[{j}]"
            c.port(port["containerPort"], f"{where}.containerPort")
            c.protocol(port.get("protocol"), f"{where}.protocol")
            if "name" in port:
                c.named_or_numeric_port(port["name"], f"{where}.name")
        for field in P.PROBE_FIELDS:
            if field in container:
                _check_probe(c, container[field], field, f"spec.containers[{i}].{field}")
        if "lifecycle" in container:
            _check_lifecycle(c, container["lifecycle"], spec.get("terminationGracePeriodSeconds", K.DEFAULT_GRACE_PERIOD),
                             f"spec.containers[{i}].lifecycle")
    for key in ("podIPs", "probeIPs"):
        for i, entry in enumerate((c.obj.get("status") or {}).get(key) or []):
            if "ip" in entry:
                c.ip(entry["ip"], f"status.{key}[{i}].ip")


#: the handlers of a lifecycle hook (preStop, postStart), as Kubernetes', in the order errors name them
HOOK_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")
#: probe handlers in the order errors name them
_PROBE_HANDLER_NAMES = ("httpGet", "tcpSocket", "exec", "grpc")


def _check_lifecycle(c: _Checker, lifecycle: dict, grace: int, where: str) -> None:
    """A container's lifecycle hooks, as Kubernetes checks them: one handler each, its values, and
    a sleep within the pod's terminationGracePeriodSeconds (``grace``, 30 when unset)."""
    for name in ("preStop", "postStart"):
        hook = lifecycle.get(name)
        if hook is None:
            continue
        at = f"{where}.{name}"
        handler = _check_handler(c, hook, HOOK_HANDLERS, at, "hook")
        if handler == "sleep":
            seconds = hook["sleep"]["seconds"]
            if seconds < 0 or seconds > grace:
                c.fail(f"{at}.sleep.seconds", f"{seconds} is not between 0 and terminationGracePeriodSeconds ({grace})",
                       "sleep at most the pod's grace period (spec.terminationGracePeriodSeconds, default 30)")


def _check_handler(c: _Checker, obj: dict, allowed: tuple[str, ...], where: str, what: str) -> str:
    """The one handler of a probe or hook and its values (ports, path, scheme, headers), with
    Kubernetes' defaults filled in (httpGet's path and scheme); returns its name."""
    handlers = [h for h in allowed if h in obj]
    if not handlers:
        names = _PROBE_HANDLER_NAMES if what == "probe" else allowed
        c.fail(where, f"the {what} has no handler", f"set exactly one of {', '.join(names[:-1])} or {names[-1]}")
    if len(handlers) > 1:
        c.fail(f"{where}.{handlers[1]}", f"a {what} has one handler, but {' and '.join(handlers)} are set",
               "keep only one of them")
    handler = handlers[0]
    spec = obj[handler]
    at = f"{where}.{handler}"
    if handler == "sleep":
        return handler
    if handler == "exec":
        if not spec["command"]:
            c.fail(f"{at}.command", "the command is empty",
                   "list the program and its arguments, e.g. [cat, /tmp/healthy]")
    elif handler == "grpc":
        c.port(spec["port"], f"{at}.port")
    else:
        c.named_or_numeric_port(spec["port"], f"{at}.port")
        if isinstance(spec["port"], str) and spec["port"].isdigit():
            spec["port"] = int(spec["port"])
        host = spec.get("host")
        if host:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                if len(host) > 253 or not _DNS_SUBDOMAIN.match(host):
                    c.fail(f"{at}.host", f'"{host}" is neither an IP address nor a host name',
                           "leave host out to probe the pod itself, or give an address like 10.244.0.5")
    if handler == "httpGet":
        path = spec.setdefault("path", "/")
        if not path.startswith("/"):
            c.fail(f"{at}.path", f'"{path}" does not start with "/"', f'write it as "/{path}"')
        if any(ch in path for ch in " \r\n"):
            c.fail(f"{at}.path", f"{path!r} contains whitespace", "percent-encode it (%20)")
        scheme = spec.setdefault("scheme", "HTTP")
        if scheme not in P.SCHEMES:
            c.fail(f"{at}.scheme", f"unsupported scheme {scheme!r}", "use HTTP or HTTPS")
        for k, header in enumerate(spec.get("httpHeaders") or []):
            if not _HTTP_TOKEN.match(header["name"]):
                c.fail(f"{at}.httpHeaders[{k}].name", f'"{header["name"]}" is not an HTTP header name',
                       "use letters, digits and -, e.g. X-Probe")
            if any(ch in header["value"] for ch in "\r\n\0"):
                c.fail(f"{at}.httpHeaders[{k}].value", "a header value may not contain line breaks",
                       "put it on one line")
    return handler


def _check_probe(c: _Checker, probe: dict, kind: str, where: str) -> None:
    """A container's probe, as Kubernetes checks it (one handler, ports, path, timings), with
    Kubernetes' defaults filled in (timings; httpGet's path and scheme)."""
    _check_handler(c, probe, P.HANDLERS, where, "probe")
    if "initialDelaySeconds" in probe and probe["initialDelaySeconds"] < 0:
        c.fail(f"{where}.initialDelaySeconds", f"{probe['initialDelaySeconds']} is negative",
               "use 0 or more seconds (default 0)")
    for key, default in P.DEFAULT_TIMING.items():
        value = probe.setdefault(key, default)
        if value < 1:
            c.fail(f"{where}.{key}", f"{value} is below 1", f"use 1 or more (default {default})")
    if kind != "readinessProbe" and probe["successThreshold"] != 1:
        c.fail(f"{where}.successThreshold", f"must be 1 for a {kind}, not {probe['successThreshold']}",
               "set 1 or leave it out (only a readinessProbe may need several successes)")
    if "terminationGracePeriodSeconds" in probe:
        if kind == "readinessProbe":
            c.fail(f"{where}.terminationGracePeriodSeconds", "a readinessProbe does not restart the container",
                   "remove it (livenessProbe and startupProbe take it)")
        if probe["terminationGracePeriodSeconds"] < 1:
            c.fail(f"{where}.terminationGracePeriodSeconds",
                   f"{probe['terminationGracePeriodSeconds']} is below 1", "use 1 or more seconds")


def _check_policy_ports(c: _Checker, ports: list[dict], where: str) -> None:
    for i, port in enumerate(ports):
        field = f"{where}.ports[{i}]"
        c.protocol(port.get("protocol"), f"{field}.protocol")
        value = port.get("port")
        end = port.get("endPort")
        if value is not None:
            c.named_or_numeric_port(value, f"{field}.port")
        if end is not None:
            if value is None or (isinstance(value, str) and not value.isdigit()):
                c.fail(f"{field}.endPort", "endPort needs a numeric port",
                       "set port to the first number of the range, or remove endPort")
            c.port(end, f"{field}.endPort")
            if end < int(value):
                c.fail(f"{field}.endPort", f"endPort {end} is below port {value}",
                       "make endPort at least port")


def _check_policy_peer(c: _Checker, peer: dict, field: str) -> None:
    if not peer:
        c.fail(field, "an empty peer selects nothing",
               "set podSelector, namespaceSelector or ipBlock")
    if "ipBlock" in peer:
        if "podSelector" in peer or "namespaceSelector" in peer:
            c.fail(field, "ipBlock cannot be combined with podSelector or namespaceSelector",
                   "put the ipBlock in a peer of its own")
        block = c.cidr(peer["ipBlock"]["cidr"], f"{field}.ipBlock.cidr")
        for k, value in enumerate(peer["ipBlock"].get("except") or []):
            exc = c.cidr(value, f"{field}.ipBlock.except[{k}]")
            if not _contained(exc, block) or exc == block:
                c.fail(f"{field}.ipBlock.except[{k}]", f"{exc} is not strictly inside {block}",
                       "except lists sub-ranges of the cidr")
    for key in ("podSelector", "namespaceSelector"):
        if key in peer:
            c.selector(peer[key], f"{field}.{key}")


def _check_network_policy(c: _Checker) -> None:
    spec = c.obj["spec"]
    c.selector(spec["podSelector"], "spec.podSelector")
    for i, value in enumerate(spec.get("policyTypes") or []):
        if value not in POLICY_TYPES:
            c.fail(f"spec.policyTypes[{i}]", f"unknown policy type {value!r}", "use Ingress or Egress")
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(spec.get(direction) or []):
            where = f"spec.{direction}[{i}]"
            for j, peer in enumerate(rule.get(peers_key) or []):
                _check_policy_peer(c, peer, f"{where}.{peers_key}[{j}]")
            _check_policy_ports(c, rule.get("ports") or [], where)


def _check_service(c: _Checker) -> None:
    spec = c.obj.setdefault("spec", {})
    svc_type = spec.setdefault("type", "ClusterIP")
    if svc_type not in SERVICE_TYPES:
        c.fail("spec.type", f"unsupported service type {svc_type!r}", "use ClusterIP, NodePort or LoadBalancer")
    if "selector" in spec:
        c.labels(spec["selector"], "spec.selector")
    headless = _check_cluster_ips(c, spec)
    _check_service_ports(c, spec, headless)
    affinity = spec.setdefault("sessionAffinity", "None")
    if affinity not in SESSION_AFFINITIES:
        c.fail("spec.sessionAffinity", f"unknown session affinity {affinity!r}", "use None or ClientIP")
    if affinity == "None":
        if spec.get("sessionAffinityConfig"):
            c.fail("spec.sessionAffinityConfig", "only a service with sessionAffinity: ClientIP takes it",
                   "set sessionAffinity: ClientIP, or remove sessionAffinityConfig")
        spec.pop("sessionAffinityConfig", None)
    else:
        client = spec.setdefault("sessionAffinityConfig", {}).setdefault("clientIP", {})
        timeout = client.setdefault("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT)
        if isinstance(timeout, bool) or not 1 <= timeout <= MAX_AFFINITY_TIMEOUT:
            c.fail("spec.sessionAffinityConfig.clientIP.timeoutSeconds", f"{timeout!r} is out of range",
                   f"use 1 to {MAX_AFFINITY_TIMEOUT} seconds (default {DEFAULT_AFFINITY_TIMEOUT})")
    internal = spec.setdefault("internalTrafficPolicy", "Cluster")
    if internal not in TRAFFIC_POLICIES:
        c.fail("spec.internalTrafficPolicy", f"unknown traffic policy {internal!r}", "use Cluster or Local")
    external_types = ("NodePort", "LoadBalancer")
    if svc_type in external_types:
        external = spec.setdefault("externalTrafficPolicy", "Cluster")
        if external not in TRAFFIC_POLICIES:
            c.fail("spec.externalTrafficPolicy", f"unknown traffic policy {external!r}", "use Cluster or Local")
    elif "externalTrafficPolicy" in spec:
        c.fail("spec.externalTrafficPolicy", "only NodePort and LoadBalancer services are reached from outside",
               "remove externalTrafficPolicy, or set spec.type: NodePort or LoadBalancer")
    for field in ("loadBalancerIP", "allocateLoadBalancerNodePorts"):
        if field in spec and svc_type != "LoadBalancer":
            c.fail(f"spec.{field}", "only a LoadBalancer service takes it",
                   f"set spec.type: LoadBalancer, or remove {field}")
    if svc_type == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)
        if spec.get("loadBalancerIP"):
            spec["loadBalancerIP"] = str(c.ip(spec["loadBalancerIP"], "spec.loadBalancerIP"))
    for i, entry in enumerate(((c.obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []):
        if "ip" in entry:
            c.ip(entry["ip"], f"status.loadBalancer.ingress[{i}].ip")
    annotations = c.obj["metadata"].get("annotations") or {}
    if K.NETWORK_ANNOTATION in annotations:
        c.network_exists(annotations[K.NETWORK_ANNOTATION], f"metadata.annotations.{K.NETWORK_ANNOTATION}")
    if K.SERVICE_ID_ANNOTATION in annotations:
        raw = annotations[K.SERVICE_ID_ANNOTATION]
        if not raw.isdigit() or not K.FIRST_SERVICE_ID <= int(raw) <= K.MAX_SERVICE_ID:
            c.fail(f"metadata.annotations.{K.SERVICE_ID_ANNOTATION}", f'"{raw}" is not a service ID',
                   f"use a number from {K.FIRST_SERVICE_ID} to {K.MAX_SERVICE_ID}, or remove it to get one")
    c.namespace_exists(c.obj["metadata"]["namespace"], "metadata.namespace")


def _check_cluster_ips(c: _Checker, spec: dict) -> bool:
    """clusterIP, clusterIPs, ipFamilies and ipFamilyPolicy agree with each other (Kubernetes'
    rules); clusterIP and clusterIPs[0] are made the same. Returns whether the service is headless."""
    single = spec.get("clusterIP") or None
    ips = list(spec.get("clusterIPs") or [])
    if single and ips and ips[0] != single:
        c.fail("spec.clusterIPs[0]", f'"{ips[0]}" differs from spec.clusterIP ("{single}")',
               "make clusterIPs[0] the same address as clusterIP, or set only one of them")
    if single and not ips:
        ips = [single]
    if len(ips) > 2:
        c.fail("spec.clusterIPs", f"{len(ips)} addresses given", "list at most two: one IPv4 and one IPv6")
    headless = bool(ips) and ips[0] == HEADLESS
    only_single = single is not None and not spec.get("clusterIPs")
    addrs: list[IPAddress] = []
    for i, value in enumerate(ips):
        field = "spec.clusterIP" if only_single else f"spec.clusterIPs[{i}]"
        if value == HEADLESS:
            if i > 0:
                c.fail(field, '"None" (headless) must be the only entry', "list only None, or only addresses")
            continue
        if headless:
            c.fail(field, 'a headless service (clusterIPs[0]: "None") has no address',
                   "list only None, or only addresses")
        addr = c.ip(value, field)
        if addrs and addrs[0].version == addr.version:
            c.fail(f"spec.clusterIPs[{i}]", f"{addr} is {ip_family(addr)} like spec.clusterIPs[0]",
                   "a dual-stack service takes one IPv4 and one IPv6 address")
        addrs.append(addr)
    if ips:
        spec["clusterIPs"] = [HEADLESS] if headless else [str(a) for a in addrs]
        spec["clusterIP"] = spec["clusterIPs"][0]
    else:
        spec.pop("clusterIP", None)
        spec.pop("clusterIPs", None)
    if headless and spec["type"] != "ClusterIP":
        c.fail("spec.clusterIP", f'a {spec["type"]} service cannot be headless (clusterIP: None)',
               "remove clusterIP: None, or set spec.type: ClusterIP")
    families = spec.get("ipFamilies") or []
    for i, family in enumerate(families):
        if family not in IP_FAMILIES:
            c.fail(f"spec.ipFamilies[{i}]", f"unknown IP family {family!r}", "use IPv4 or IPv6")
        if family in families[:i]:
            c.fail(f"spec.ipFamilies[{i}]", f"{family} is listed twice", "list each family once")
        if i < len(addrs) and ip_family(addrs[i]) != family:
            c.fail(f"spec.ipFamilies[{i}]", f"{family} does not match spec.clusterIPs[{i}] ({addrs[i]})",
                   "list the families in the order of clusterIPs, or leave ipFamilies out")
    if len(families) > 2:
        c.fail("spec.ipFamilies", f"{len(families)} families given", "list at most IPv4 and IPv6")
    policy = spec.get("ipFamilyPolicy")
    if policy is not None and policy not in IP_FAMILY_POLICIES:
        c.fail("spec.ipFamilyPolicy", f"unknown IP family policy {policy!r}",
               "use SingleStack, PreferDualStack or RequireDualStack")
    if policy in (None, "SingleStack") and (len(families) > 1 or len(addrs) > 1):
        c.fail("spec.ipFamilyPolicy", f"{policy or 'SingleStack (the default)'} takes one IP family, "
                                      "but two are given", "set ipFamilyPolicy: PreferDualStack or RequireDualStack")
    return headless


def _check_service_ports(c: _Checker, spec: dict, headless: bool) -> None:
    ports = spec.get("ports") or []
    if not ports and not headless:
        c.fail("spec.ports", "a service needs at least one port",
               "add ports: [{port: 80}] (only a headless service, clusterIP: None, may have none)")
    low, high = K.NODE_PORT_RANGE
    seen: dict[tuple[int, str], int] = {}
    names: dict[str, int] = {}
    node_ports: dict[tuple[int, str], int] = {}
    for i, port in enumerate(ports):
        where = f"spec.ports[{i}]"
        c.port(port["port"], f"{where}.port")
        proto = port.setdefault("protocol", "TCP")
        c.protocol(proto, f"{where}.protocol")
        target = port.setdefault("targetPort", port["port"])
        c.named_or_numeric_port(target, f"{where}.targetPort")
        if isinstance(target, str) and target.isdigit():
            port["targetPort"] = int(target)
        if "nodePort" in port:
            if spec["type"] == "ClusterIP":
                c.fail(f"{where}.nodePort", "a ClusterIP service has no node ports",
                       "set spec.type: NodePort or remove nodePort")
            node_port = port["nodePort"]
            c.port(node_port, f"{where}.nodePort")
            if not low <= node_port <= high:
                c.fail(f"{where}.nodePort", f"{node_port} is outside the node port range {low}-{high}",
                       "pick a port in that range, or leave nodePort out to get one")
            if (node_port, proto) in node_ports:
                c.fail(f"{where}.nodePort", f"nodePort {node_port}/{proto} is also spec.ports"
                                            f"[{node_ports[(node_port, proto)]}]'s", "give each port its own")
            node_ports[(node_port, proto)] = i
        key = (port["port"], proto)
        if key in seen:
            c.fail(f"{where}", f"duplicate port {port['port']}/{proto} (also spec.ports[{seen[key]}])")
        seen[key] = i
        name = port.get("name")
        if len(ports) > 1 and not name:
            c.fail(f"{where}.name", "a service with several ports must name each one",
                   "add name: <port name>")
        if name:
            if not _DNS_LABEL.match(name) or len(name) > 63:
                c.fail(f"{where}.name", f'"{name}" is not a valid port name', "use a DNS label like http")
            if name in names:
                c.fail(f"{where}.name", f'duplicate port name "{name}" (also spec.ports[{names[name]}])')
            names[name] = i


def _check_endpoint_slice(c: _Checker) -> None:
    obj = c.obj
    address_type = obj["addressType"]
    if address_type not in ADDRESS_TYPES:
        c.fail("addressType", f"unknown address type {address_type!r}", "use IPv4, IPv6 or FQDN")
    endpoints = obj.setdefault("endpoints", [])
    if len(endpoints) > MAX_SLICE_ENDPOINTS:
        c.fail("endpoints", f"{len(endpoints)} endpoints in one slice",
               f"split them: a slice holds at most {MAX_SLICE_ENDPOINTS}")
    for i, ep in enumerate(endpoints):
        where = f"endpoints[{i}]"
        addresses = ep["addresses"]
        if not 1 <= len(addresses) <= MAX_ENDPOINT_ADDRESSES:
            c.fail(f"{where}.addresses", f"{len(addresses)} addresses",
                   f"list 1 to {MAX_ENDPOINT_ADDRESSES} addresses of the endpoint")
        for j, value in enumerate(addresses):
            field = f"{where}.addresses[{j}]"
            if address_type == "FQDN":
                if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
                    c.fail(field, f'"{value}" is not a fully qualified domain name',
                           "use lowercase letters, digits, '-' and '.'")
                continue
            addr = c.ip(value, field)
            if ip_family(addr) != address_type:
                c.fail(field, f"{addr} is not an {address_type} address",
                       f"list {address_type} addresses in an {address_type} slice")
            addresses[j] = str(addr)
        node = ep.get("nodeName")
        if node is not None and not _DNS_SUBDOMAIN.match(node):
            c.fail(f"{where}.nodeName", f'"{node}" is not a valid node name',
                   "use lowercase letters, digits, '-' and '.'")
        hostname = ep.get("hostname")
        if hostname is not None and not _DNS_LABEL.match(hostname):
            c.fail(f"{where}.hostname", f'"{hostname}" is not a DNS label', "use lowercase letters, digits and '-'")
    ports = obj.get("ports") or []
    if len(ports) > MAX_SLICE_PORTS:
        c.fail("ports", f"{len(ports)} ports in one slice", f"a slice holds at most {MAX_SLICE_PORTS}")
    names: dict[str, int] = {}
    for i, port in enumerate(ports):
        where = f"ports[{i}]"
        proto = port.setdefault("protocol", "TCP")
        c.protocol(proto, f"{where}.protocol")
        if port.get("port") is not None:
            c.port(port["port"], f"{where}.port")
        name = port.get("name") or ""
        if name and (len(name) > 63 or not _DNS_LABEL.match(name)):
            c.fail(f"{where}.name", f'"{name}" is not a valid port name', "use a DNS label like http")
        if name in names:
            c.fail(f"{where}.name", f'duplicate port name "{name}" (also ports[{names[name]}])',
                   "name each port of a slice differently")
        names[name] = i
    c.namespace_exists(obj["metadata"]["namespace"], "metadata.namespace")


def _check_service_cidr(c: _Checker) -> None:
    c.family_ranges(c.obj["spec"]["cidrs"], "spec.cidrs")


def _check_load_balancer_pool(c: _Checker) -> None:
    name = c.obj["metadata"]["name"]
    cidrs: list[IPNetwork] = []
    for i, value in enumerate(c.obj["spec"]["cidrs"]):
        net = c.cidr(value, f"spec.cidrs[{i}]")
        for j, other in enumerate(cidrs):
            if _overlaps(net, other):
                c.fail(f"spec.cidrs[{i}]", f"{net} overlaps spec.cidrs[{j}] ({other})", "list each range once")
        for pool in c.lookup.list_objects("LoadBalancerIPPool"):
            if pool["metadata"]["name"] == name:
                continue
            for theirs in _network_cidrs(pool):
                if _overlaps(net, theirs):
                    c.fail(f"spec.cidrs[{i}]",
                           f'{net} overlaps LoadBalancerIPPool "{pool["metadata"]["name"]}" ({theirs})',
                           "pools may not share addresses: pick another range")
        cidrs.append(net)


def allocation_name(spec: Mapping[str, Any]) -> str:
    """The one name a ServiceAllocation of ``spec`` may have (what makes its resource unique)."""
    resource = spec["resource"]
    if resource == "id":
        return K.service_id_allocation(spec["id"])
    if resource == "clusterIP":
        return K.cluster_ip_allocation(spec["network"], spec["ip"])
    if resource == "nodePort":
        return K.node_port_allocation(spec["port"])
    return K.load_balancer_allocation(spec["ip"])


def _check_service_allocation(c: _Checker) -> None:
    spec = c.obj["spec"]
    resource = spec["resource"]
    if resource not in ALLOCATION_RESOURCES:
        c.fail("spec.resource", f"unknown resource {resource!r}", "use " + ", ".join(ALLOCATION_RESOURCES))
    ns, sep, name = spec["service"].partition("/")
    if not sep or not ns or not name:
        c.fail("spec.service", f'"{spec["service"]}" is not namespace/name', "write it as default/web")
    needs = {"id": ("id",), "clusterIP": ("network", "ip"), "nodePort": ("port",),
             "loadBalancerIP": ("ip",)}[resource]
    for field in needs:
        if field not in spec:
            c.fail(f"spec.{field}", f"a {resource} allocation needs it", f"add spec.{field}")
    if "network" in spec:
        c.network_exists(spec["network"], "spec.network")
    if "ip" in spec:
        spec["ip"] = str(c.ip(spec["ip"], "spec.ip"))
    if resource == "id" and not K.FIRST_SERVICE_ID <= spec["id"] <= K.MAX_SERVICE_ID:
        c.fail("spec.id", f"{spec['id']} is not a service ID",
               f"use a number from {K.FIRST_SERVICE_ID} to {K.MAX_SERVICE_ID}")
    if resource == "nodePort":
        low, high = K.NODE_PORT_RANGE
        if not low <= spec["port"] <= high:
            c.fail("spec.port", f"{spec['port']} is outside the node port range {low}-{high}")
    expected = allocation_name(spec)
    if c.obj["metadata"]["name"] != expected:
        c.fail("metadata.name", f'a {resource} allocation is named after what it holds',
               f"name it {expected}")


def _check_network_policy_ns(c: _Checker) -> None:
    _check_network_policy(c)
    c.namespace_exists(c.obj["metadata"]["namespace"], "metadata.namespace")


def _check_segment(c: _Checker) -> None:
    spec = c.obj["spec"]
    c.network_exists(spec["network"], "spec.network")
    c.labels(spec["labels"], "spec.labels")


def _check_ip_block(c: _Checker) -> None:
    spec = c.obj["spec"]
    net = c.network_exists(spec["network"], "spec.network")
    block = c.cidr(spec["cidr"], "spec.cidr")
    if not any(_contained(block, n) for n in _network_cidrs(net)):
        c.fail("spec.cidr", f'{block} is outside Network "{spec["network"]}"',
               "allocate blocks from the network's own CIDRs")
    if not _DNS_SUBDOMAIN.match(spec["node"]):
        c.fail("spec.node", f'"{spec["node"]}" is not a valid node name')
    for other in c.lookup.list_objects("IPBlock"):
        if other["metadata"]["name"] == c.obj["metadata"]["name"]:
            continue
        if other["spec"]["network"] != spec["network"]:
            continue
        theirs = ipaddress.ip_network(other["spec"]["cidr"])
        if _overlaps(block, theirs):
            c.fail("spec.cidr", f'{block} overlaps IPBlock "{other["metadata"]["name"]}" '
                                f'of node {other["spec"]["node"]} ({theirs})',
                   "allocate with allocate_block(), which never overlaps")


def _check_ip_lease(c: _Checker) -> None:
    spec = c.obj["spec"]
    net = c.network_exists(spec["network"], "spec.network")
    ip = c.ip(spec["ip"], "spec.ip")
    if not any(ip.version == n.version and ip in n for n in _network_cidrs(net)):
        c.fail("spec.ip", f'{ip} is outside Network "{spec["network"]}"')
    if "block" in spec:
        block = c.lookup.get_object("IPBlock", spec["block"])
        if block is None:
            c.fail("spec.block", f'IPBlock "{spec["block"]}" does not exist')
        elif not (ip.version == ipaddress.ip_network(block["spec"]["cidr"]).version
                  and ip in ipaddress.ip_network(block["spec"]["cidr"])):
            c.fail("spec.ip", f'{ip} is outside IPBlock "{spec["block"]}" ({block["spec"]["cidr"]})')
        elif block["spec"]["network"] != spec["network"] or block["spec"]["node"] != spec["node"]:
            # a node's leases are found through its own blocks (allocate.leases_for)
            c.fail("spec.block", f'IPBlock "{spec["block"]}" is node {block["spec"]["node"]}\'s in Network '
                                 f'"{block["spec"]["network"]}", not node {spec["node"]}\'s in "{spec["network"]}"',
                   "lease from a block of the lease's own node and network")
    ns, sep, name = spec["pod"].partition("/")
    if not sep or not ns or not name:
        c.fail("spec.pod", f'"{spec["pod"]}" is not namespace/name', "write it as demo/web")
    if "ifname" in spec and not 0 < len(spec["ifname"]) <= 15:
        c.fail("spec.ifname", f'"{spec["ifname"]}" is not an interface name', "use 1 to 15 characters")
    # one lease per (network, address) because the name says which: a second holder's create
    # conflicts, and the allocator finds a block's leases by the prefix of their names
    expected = K.lease_name(spec["network"], str(ip))
    if c.obj["metadata"]["name"] != expected:
        c.fail("metadata.name", "an IPLease is named after its network and address", f"name it {expected}")


_CHECKS = {
    "Namespace": _check_namespace, "Node": _check_node, "Network": _check_network,
    "Service": _check_service, "NetworkPolicy": _check_network_policy_ns, "Pod": _check_pod,
    "Segment": _check_segment, "IPBlock": _check_ip_block, "IPLease": _check_ip_lease,
    "EndpointSlice": _check_endpoint_slice, "ServiceCIDR": _check_service_cidr,
    "LoadBalancerIPPool": _check_load_balancer_pool, "ServiceAllocation": _check_service_allocation,
}

@functools.cache
def _validator(kind: str) -> jsonschema.Draft202012Validator:
    # jsonschema costs ~80 ms to import: readers of the store (lace get, node name resolution)
    # never validate, so it loads with the first write
    import jsonschema

    return jsonschema.Draft202012Validator(SCHEMAS[kind])


def _json_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_error(ref: str, err: jsonschema.exceptions.ValidationError) -> ValidationError:
    field = _json_path(err.absolute_path)
    if err.validator == "required":
        missing = re.search(r"'([^']+)' is a required property", err.message)
        name = missing.group(1) if missing else "?"
        return ValidationError(ref, f"{field}.{name}" if field else name, "required field is missing",
                               f"add {name}")
    if err.validator == "additionalProperties":
        extra = re.findall(r"'([^']+)'", err.message)
        name = extra[0] if extra else "?"
        allowed = ", ".join(sorted((err.schema.get("properties") or {}).keys()))
        return ValidationError(ref, f"{field}.{name}" if field else name, "unknown field",
                               f"remove it (known fields: {allowed})")
    if err.validator == "type":
        expected = err.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return ValidationError(ref, field or None, f"must be {expected}, not {err.instance!r}")
    if err.validator == "minItems":
        return ValidationError(ref, field or None, "must not be empty", "list at least one entry")
    return ValidationError(ref, field or None, err.message)


def check_name(obj: Mapping[str, Any], ref: str) -> None:
    """Reject missing and non DNS-1123 names (labels for namespaces, services, networks)."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not name:
        raise ValidationError(ref, "metadata.name", "name is missing", "add metadata.name")
    if not isinstance(name, str):
        raise ValidationError(ref, "metadata.name", f"name must be a string, not {name!r}")
    if obj["kind"] in _LABEL_NAMED:
        if len(name) > 63 or not _DNS_LABEL.match(name):
            raise ValidationError(ref, "metadata.name", f'"{name}" is not a valid DNS-1123 label',
                                  "use at most 63 lowercase letters, digits and '-', "
                                  "starting and ending with a letter or digit")
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ValidationError(ref, "metadata.name", f'"{name}" is not a valid DNS-1123 subdomain',
                              "use lowercase letters, digits, '-' and '.', "
                              "starting and ending with a letter or digit")


#: the integers a JSON document may carry here, as the Kubernetes API takes them (int64)
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


def _json_problem(value: Any, path: tuple[Any, ...] = ()) -> tuple[str, str] | None:
    """(field, problem) of the first value that is no JSON value the store can keep, else None.

    The schemas leave unknown fields open, and YAML makes more than JSON has: an integer past
    64 bits (which the store's encoder refuses mid-write), NaN and infinities, keys that are not
    strings, sets, binary. Such an object is rejected whole here, with the field named."""
    if value is None or isinstance(value, (str, bool, datetime.date)):   # a date is stored as its ISO text
        return None
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            return _json_path(path), f"{value} does not fit in a 64-bit integer"
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return _json_path(path), f"{value} is not a JSON number"
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return _json_path(path) or "(top level)", f"key {k!r} is not a string (quote it)"
            found = _json_problem(v, (*path, k))
            if found:
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _json_problem(v, (*path, i))
            if found:
                return found
        return None
    return _json_path(path), f"a {type(value).__name__} is not a JSON value (quote it as a string)"


def normalize(obj: Any) -> dict:
    """Check kind/apiVersion/name and default metadata.namespace; returns a deep copy."""
    if not isinstance(obj, Mapping):
        raise ValidationError("object", None, f"expected an object, got {type(obj).__name__}",
                              "each document must be a mapping with apiVersion, kind and metadata")
    obj = copy.deepcopy(dict(obj))
    ref = object_ref(obj)
    problem = _json_problem(obj)
    if problem:
        raise ValidationError(ref, problem[0] or None, problem[1])
    kind = obj.get("kind")
    if not kind:
        raise ValidationError(ref, "kind", "kind is missing", "add kind: Pod (or Network, Service, ...)")
    try:
        info = K.kind_info(kind) if isinstance(kind, str) else K.kind_info(repr(kind))
    except UnknownKind:
        raise ValidationError(ref, "kind", f'unknown kind "{kind}"',
                              "use one of " + ", ".join(k.kind for k in K.KINDS)) from None
    api_version = obj.get("apiVersion")
    if api_version != info.api_version:
        raise ValidationError(ref, "apiVersion",
                              f"{kind} has apiVersion {info.api_version}, not {api_version!r}",
                              f"set apiVersion: {info.api_version}")
    if not isinstance(obj.get("metadata"), Mapping):
        raise ValidationError(ref, "metadata", "metadata is missing", "add metadata.name")
    obj["metadata"] = dict(obj["metadata"])
    check_name(obj, ref)
    meta = obj["metadata"]
    if info.namespaced:
        ns = meta.get("namespace") or "default"
        if not isinstance(ns, str) or len(ns) > 63 or not _DNS_LABEL.match(ns):
            raise ValidationError(ref, "metadata.namespace", f'"{ns}" is not a valid namespace name',
                                  "use a DNS-1123 label")
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    return obj


def validate(obj: Any, lookup: Lookup) -> dict:
    """Validate one object whole; returns its normalised copy or raises ValidationError."""
    obj = normalize(obj)
    c = _Checker(obj, lookup)
    import jsonschema.exceptions

    err = jsonschema.exceptions.best_match(_validator(obj["kind"]).iter_errors(obj))
    if err is not None:
        raise _schema_error(c.ref, err)
    meta = obj["metadata"]
    c.labels(meta.get("labels") or {}, "metadata.labels")
    for key in meta.get("annotations") or {}:
        problem = label_key_problem(key)
        if problem:
            c.fail(f"metadata.annotations.{key}", problem.replace("label key", "annotation key"))
    _CHECKS[obj["kind"]](c)
    return obj
