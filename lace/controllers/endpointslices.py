"""The EndpointSlices a Service should have, from the Service and the pods: plain values, no I/O.

As Kubernetes' EndpointSlice controller: a Service with a selector gets one slice per IP family
it serves (``spec.ipFamilies``) and per port mapping, labelled ``kubernetes.io/service-name`` and
``endpointslice.kubernetes.io/managed-by: endpointslice-controller.lace.dev`` and owned by the
Service (ownerReferences). Its endpoints are the pods of the Service's namespace that its selector
matches, on the Service's network (networks are isolated: a pod of another network is never a
backend), that have an address of the slice's family and have not finished. Per endpoint:

- ``ready``: the pod's Ready condition is True and it is not terminating (always true with
  ``publishNotReadyAddresses``);
- ``serving``: the pod's Ready condition is True;
- ``terminating``: the pod has ``metadata.deletionTimestamp``;
- ``hostname``: the pod's ``spec.hostname`` when its ``spec.subdomain`` names the Service (same
  namespace), as Kubernetes sets it; the cluster DNS answers ``HOSTNAME.SERVICE.NAMESPACE.svc``
  for it.

A named ``targetPort`` is resolved per pod from its containers' ports (same name and protocol);
pods that resolve the Service's ports differently land in different slices, since a slice's ports
apply to all its endpoints, and a port a pod does not have is left out of that pod's slice.
Slice names are stable, so a restarted controller finds what it wrote: ``<service>-ipv4`` (or
``-ipv6``) when every target port is a number, ``<service>-ipv4-<hash of the ports>`` for named
ones; ``-2``, ``-3`` ... continue a slice past Kubernetes' limit of 1000 endpoints. A family with
no endpoints keeps one empty slice (as Kubernetes' placeholder slice). A Service without selector
gets none: its slices are written by its user, and the controller never touches a slice whose
managed-by label is not its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lace.store import kinds as K
from lace.store.kinds import service_of
from lace.store.selectors import matches

MAX_ENDPOINTS = 1000   # Kubernetes' limit per slice (validation.MAX_SLICE_ENDPOINTS)
#: the fields of a slice the controller decides (the rest is the store's metadata)
_COMPARED = ("addressType", "endpoints", "ports")

Port = tuple[str, str, int]   # (service port name, protocol, resolved target port)


def managed(obj: Mapping[str, Any]) -> bool:
    """Whether the controller maintains this EndpointSlice."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(K.MANAGED_BY_LABEL) == K.ENDPOINTSLICE_CONTROLLER


def selects(service: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is a candidate backend of ``service``: same namespace and network, and the
    Service's selector (a plain label map, as Kubernetes') matches its labels."""
    selector = (service.get("spec") or {}).get("selector")
    if not selector:
        return False
    smeta, pmeta = service.get("metadata") or {}, pod.get("metadata") or {}
    return (smeta.get("namespace") == pmeta.get("namespace")
            and K.pod_network(service) == K.pod_network(pod)
            and matches({"matchLabels": selector}, pmeta.get("labels") or {}))


def target_port(service_port: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    """The pod port a service port sends to: a number as is, a name looked up in the pod's
    containers (same protocol), None if the pod has no such port."""
    return K.container_port((pod.get("spec") or {}).get("containers"),
                            service_port.get("targetPort", service_port.get("port")),
                            service_port.get("protocol") or "TCP")


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _pod_address(pod: Mapping[str, Any], family: str) -> str | None:
    status = pod.get("status") or {}
    ips = [e.get("ip") for e in status.get("podIPs") or () if e.get("ip")] or \
        ([status["podIP"]] if status.get("podIP") else [])
    want = ":" if family == "IPv6" else "."
    return next((ip for ip in ips if want in ip), None)


def endpoint(service: Mapping[str, Any], pod: Mapping[str, Any], address: str) -> dict:
    """One pod's endpoint: its address, conditions, node and a reference to it."""
    meta = pod["metadata"]
    serving = _pod_ready(pod)
    terminating = bool(meta.get("deletionTimestamp"))
    publish = bool((service.get("spec") or {}).get("publishNotReadyAddresses"))
    out: dict[str, Any] = {
        "addresses": [address],
        "conditions": {"ready": publish or (serving and not terminating), "serving": serving,
                       "terminating": terminating},
    }
    spec = pod.get("spec") or {}
    if spec.get("hostname") and spec.get("subdomain") == service["metadata"]["name"] \
            and meta["namespace"] == service["metadata"].get("namespace"):
        out["hostname"] = spec["hostname"]
    node = spec.get("nodeName")
    if node:
        out["nodeName"] = node
    out["targetRef"] = {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"],
                        "uid": meta.get("uid", "")}
    return out


def _ports_of(service: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[Port, ...]:
    out = []
    for p in (service.get("spec") or {}).get("ports") or ():
        resolved = target_port(p, pod)
        if resolved is not None:
            out.append((p.get("name") or "", p.get("protocol") or "TCP", resolved))
    return tuple(out)


def _numeric_ports(service: Mapping[str, Any]) -> tuple[Port, ...] | None:
    """The port mapping every pod has when all target ports are numbers, else None."""
    ports = (service.get("spec") or {}).get("ports") or ()
    if any(isinstance(p.get("targetPort"), str) and not p["targetPort"].isdigit() for p in ports):
        return None
    return _ports_of(service, {})


def slice_name(service: str, family: str, ports: Sequence[Port], numeric: bool) -> str:
    """``web-ipv4``, or ``web-ipv4-1a2b3c4d`` for one of several port mappings."""
    base = f"{service}-{family.lower()}"
    if numeric:
        return base
    digest = hashlib.sha256(json.dumps(list(ports)).encode()).hexdigest()[:8]
    return f"{base}-{digest}"


def _slice(service: Mapping[str, Any], name: str, family: str, ports: Sequence[Port],
           endpoints: list[dict]) -> dict:
    meta = service["metadata"]
    return {
        "apiVersion": K.DISCOVERY_API_VERSION, "kind": "EndpointSlice",
        "metadata": {
            "name": name, "namespace": meta["namespace"],
            "labels": {K.SERVICE_NAME_LABEL: meta["name"], K.MANAGED_BY_LABEL: K.ENDPOINTSLICE_CONTROLLER},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                 "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}],
        },
        "addressType": family,
        "endpoints": endpoints,
        "ports": [{"name": n, "protocol": proto, "port": port} for n, proto, port in ports],
    }


def desired_slices(service: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The EndpointSlices the controller keeps for ``service`` given the cluster's ``pods`` (any
    namespace: the ones it does not select are skipped), sorted by name."""
    spec = service.get("spec") or {}
    if not spec.get("selector"):
        return []
    families = spec.get("ipFamilies") or ["IPv4"]
    numeric = _numeric_ports(service)
    groups: dict[tuple[str, tuple[Port, ...]], list[dict]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if not selects(service, pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ports = _ports_of(service, pod)
        for family in families:
            address = _pod_address(pod, family)
            if address is not None:
                groups.setdefault((family, ports), []).append(endpoint(service, pod, address))
    name = service["metadata"]["name"]
    out = []
    for family in families:
        mine = sorted((ports, eps) for (fam, ports), eps in groups.items() if fam == family)
        if not mine:   # the placeholder: a family without endpoints still has its (empty) slice
            out.append(_slice(service, slice_name(name, family, (), True), family, (), []))
        for ports, eps in mine:
            base = slice_name(name, family, ports, ports == numeric)
            for i in range(0, len(eps), MAX_ENDPOINTS):
                chunk = base if i == 0 else f"{base}-{i // MAX_ENDPOINTS + 1}"
                out.append(_slice(service, chunk, family, ports, eps[i:i + MAX_ENDPOINTS]))
    return sorted(out, key=lambda s: s["metadata"]["name"])


def same(want: Mapping[str, Any], have: Mapping[str, Any] | None) -> bool:
    """Whether a stored slice already is what ``want`` says (contents, labels, owner)."""
    if have is None:
        return False
    wmeta, hmeta = want["metadata"], have.get("metadata") or {}
    if any(want[k] != have.get(k) for k in _COMPARED):
        return False
    labels = hmeta.get("labels") or {}
    return (all(labels.get(k) == v for k, v in wmeta["labels"].items())
            and wmeta["ownerReferences"] == hmeta.get("ownerReferences"))


def plan(service: str, desired: Sequence[dict],
         stored: Iterable[Mapping[str, Any]]) -> tuple[list[dict], list[dict], list[str]]:
    """(slices to write, slices to delete, desired names held by slices the controller does not
    manage, which it leaves alone) for the Service ``namespace/name``, given the slices stored
    in its namespace."""
    by_name = {o["metadata"]["name"]: o for o in stored}
    writes, blocked = [], []
    for want in desired:
        have = by_name.get(want["metadata"]["name"])
        if have is not None and not managed(have):
            blocked.append(want["metadata"]["name"])
        elif not same(want, have):
            writes.append(want)
    wanted = {w["metadata"]["name"] for w in desired}
    deletes = [dict(o) for name, o in by_name.items()
               if name not in wanted and managed(o) and service_of(o) == service]
    return writes, deletes, blocked
