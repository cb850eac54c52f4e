"""Kubelet health probes as a Pod declares them: which probes a container has and where each one
connects. Shared by the node agent (which opens exactly these ports of an isolated pod to the node's
kubelet: the ``probes`` map) and the lab's kubelet (which runs them), so both read a probe the same
way.

A probe has one handler: ``httpGet`` (path, port, host, scheme, httpHeaders), ``tcpSocket`` (port,
host), ``grpc`` (port) or ``exec`` (command, run inside the pod: no network). ``port`` is a number or
the name of one of the container's TCP ``containerPort``s, as in Kubernetes; a name that no port of
the container carries does not resolve (the kubelet reports the probe failed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

#: the probe fields of a container, in the order a kubelet starts them
PROBE_FIELDS = ("startupProbe", "livenessProbe", "readinessProbe")
#: handlers that connect to the pod over TCP
NETWORK_HANDLERS = ("httpGet", "tcpSocket", "grpc")
HANDLERS = NETWORK_HANDLERS + ("exec",)


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
    if isinstance(port, int) and not isinstance(port, bool):
        return port if 0 < port < 65536 else None
    text = str(port)
    if text.isdigit():
        n = int(text)
        return n if 0 < n < 65536 else None
    for p in container.get("ports") or ():
        if p.get("name") == text and (p.get("protocol") or "TCP").upper() == "TCP":
            try:
                return int(p["containerPort"])
            except (KeyError, TypeError, ValueError):
                return None
    return None


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
