"""Kubelet health probes as a Pod declares them: which probes a container has and where each one
connects. Shared by the node agent (which opens exactly these ports of an isolated pod to the node's
kubelet: the ``probes`` map) and the lab's kubelet (which runs them), so both read a probe the same
way.

A probe has one handler: ``httpGet`` (path, port, host, scheme, httpHeaders), ``tcpSocket`` (port,
host), ``grpc`` (port) or ``exec`` (command, run inside the pod: no network). ``port`` is a number or
the name of one of the container's TCP ``containerPort``s, as in Kubernetes; a name that no port of
the container carries does not resolve (the kubelet reports the probe failed).

Timings (``timing``) take Kubernetes' defaults: ``periodSeconds`` 10, ``timeoutSeconds`` 1,
``successThreshold`` 1, ``failureThreshold`` 3, ``initialDelaySeconds`` 0. ``action`` reads what a
probe does (handler, resolved port, host, HTTP path, scheme and headers, or the command), and
``connect_host`` where a network probe connects: its ``host`` if set, else for a pod of another
network than the default one its *probe address* (``status.probeIPs``: the address the agent lists
on ``PROBE_INTERFACE`` in the CNI result) of the family of the pod's primary IP, else that IP
(``status.podIP``), as a kubelet does.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from lace.store.kinds import container_port

#: the probe fields of a container, in the order a kubelet starts them
PROBE_FIELDS = ("startupProbe", "livenessProbe", "readinessProbe")
#: handlers that connect to the pod over TCP
NETWORK_HANDLERS = ("httpGet", "tcpSocket", "grpc")
HANDLERS = NETWORK_HANDLERS + ("exec",)
#: the HTTP schemes an httpGet probe may use
SCHEMES = ("HTTP", "HTTPS")
#: Kubernetes' defaults of a probe's timing fields (initialDelaySeconds: 0)
DEFAULT_TIMING = {"periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}
#: the interface of a CNI result whose addresses are the pod's probe addresses, not its own
#: (the node's host device, lace.agent.hostdev.HOST_IFNAME)
PROBE_INTERFACE = "lace_host"


@dataclass(frozen=True)
class ProbeTarget:
    """Where one network probe of a pod connects: the container port (TCP), and the host it names
    (``httpGet.host`` / ``tcpSocket.host``; "" means the pod itself)."""

    container: str
    probe: str       # startupProbe, livenessProbe or readinessProbe
    handler: str     # httpGet, tcpSocket or grpc
    port: int | None  # None: a named port no containerPort carries
    host: str = ""


def handler(probe: dict[str, Any]) -> str | None:
    """The handler a probe uses (the first of HANDLERS it sets), or None."""
    return next((h for h in HANDLERS if isinstance(probe.get(h), dict)), None)


def resolve_port(container: dict[str, Any], port: Any) -> int | None:
    """A probe's port: a number, or the name of one of the container's TCP containerPorts."""
    return container_port([container], port, "TCP")


def probes(pod: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Every (container, probe field, probe) the pod declares."""
    for c in (pod.get("spec") or {}).get("containers") or ():
        for name in PROBE_FIELDS:
            p = c.get(name)
            if isinstance(p, dict):
                yield c, name, p


def network_targets(pod: dict[str, Any]) -> list[ProbeTarget]:
    """The pod's probes that connect over TCP, with their ports resolved."""
    out = []
    for c, name, p in probes(pod):
        h = handler(p)
        if h not in NETWORK_HANDLERS:
            continue
        spec = p[h]
        out.append(ProbeTarget(c.get("name") or "", name, h, resolve_port(c, spec.get("port")),
                               str(spec.get("host") or "")))
    return out


def pod_probe_ports(pod: dict[str, Any]) -> set[int]:
    """The TCP ports of the pod the node's kubelet probes (those that name another host are not the
    pod's)."""
    return {t.port for t in network_targets(pod) if t.port is not None and not t.host}


@dataclass(frozen=True)
class Timing:
    """When a probe runs and how many results in a row decide (seconds and counts)."""

    initial_delay: int = 0
    period: int = DEFAULT_TIMING["periodSeconds"]
    timeout: int = DEFAULT_TIMING["timeoutSeconds"]
    success_threshold: int = DEFAULT_TIMING["successThreshold"]
    failure_threshold: int = DEFAULT_TIMING["failureThreshold"]


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def timing(probe: dict[str, Any]) -> Timing:
    """A probe's timing, Kubernetes' defaults where it sets none."""
    return Timing(initial_delay=_int(probe.get("initialDelaySeconds"), 0),
                  period=_int(probe.get("periodSeconds"), DEFAULT_TIMING["periodSeconds"]),
                  timeout=_int(probe.get("timeoutSeconds"), DEFAULT_TIMING["timeoutSeconds"]),
                  success_threshold=_int(probe.get("successThreshold"), DEFAULT_TIMING["successThreshold"]),
                  failure_threshold=_int(probe.get("failureThreshold"), DEFAULT_TIMING["failureThreshold"]))


@dataclass(frozen=True)
class Action:
    """What one probe does: its handler and, by handler, where it connects (``port`` None: a named
    port the container does not have), the HTTP request, or the command."""

    handler: str
    port: int | None = None
    host: str = ""
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    service: str = ""   # grpc


def action(container: dict[str, Any], probe: dict[str, Any]) -> Action | None:
    """What ``probe`` (one of ``container``'s) does, or None without a handler."""
    h = handler(probe)
    if h is None:
        return None
    spec = probe[h]
    if h == "exec":
        return Action(h, command=tuple(str(a) for a in spec.get("command") or ()))
    port = resolve_port(container, spec.get("port"))
    host = str(spec.get("host") or "")
    if h == "httpGet":
        headers = tuple((str(e.get("name", "")), str(e.get("value", "")))
                        for e in spec.get("httpHeaders") or () if isinstance(e, dict))
        return Action(h, port, host, str(spec.get("path") or "/"), str(spec.get("scheme") or "HTTP").upper(),
                      headers)
    if h == "grpc":
        return Action(h, port, service=str(spec.get("service") or ""))
    return Action(h, port, host)


def _family(ip: str) -> int | None:
    try:
        return ipaddress.ip_address(ip).version
    except ValueError:
        return None


def connect_host(act: Action, pod_ips: Sequence[str], probe_ips: Sequence[str], isolated: bool) -> str | None:
    """Where a network probe connects (see the module docstring); None when the pod has no address.
    ``isolated``: the pod belongs to another network than the default one."""
    if act.host:
        return act.host
    primary = pod_ips[0] if pod_ips else None
    if isolated and probe_ips:
        want = _family(primary) if primary else None
        return next((ip for ip in probe_ips if _family(ip) == want), probe_ips[0])
    return primary
