"""Slim records of the objects a node agent keeps for the whole cluster.

An agent needs every Pod's identity and every IPLease's address, but not the rest of either object:
keeping the stored dictionaries of 10k pods and 20k leases would cost ~60 MiB of Python objects
that no pass reads. A record holds what the data plane and policy read, parsed once (labels
sorted, the address an ``ipaddress`` object, the named container ports and the kubelet's probe
ports worked out), and the object's resourceVersion, so a cache of records can tell a replayed
event from a newer one as it can with whole objects (``lace.store.cache``). Kubernetes' metadata
informers and Cilium's slim types make the same trade.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from lace.store import kinds as K

IPAddr = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Labels = tuple[tuple[str, str], ...]

PROTO_NUMBERS = {"TCP": 6, "UDP": 17, "SCTP": 132}


#: one copy of each string many records repeat (networks, nodes, namespaces, label keys and values,
#: port names): 10k pods' copies of "default" are otherwise 10k strings
_one = sys.intern


@functools.lru_cache(maxsize=4096)
def shared(value: tuple) -> tuple:
    """One copy of an immutable tuple many records repeat (the label set of a Deployment's pods,
    their probe ports; container ports have ``_ports``): a cluster has few distinct ones, and 10k pods' own copies are ~5 MiB.
    Bounded, so a cluster whose every pod differs costs at most the cache's few hundred KiB."""
    return value


def revision(obj: dict[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


def same_objects(old: Sequence[Any] | None, new: Sequence[Any]) -> bool:
    """Whether ``old`` holds the very objects of ``new``, in order: records (and what is made of
    them) are immutable and replaced on change, so identity says "unchanged" without comparing."""
    return old is not None and len(old) == len(new) and all(a is b for a, b in zip(old, new))


@dataclass(frozen=True, slots=True)
class ContainerPort:
    """One containerPort of a pod (named ports resolve through these)."""

    port: int
    proto: int = 6
    name: str | None = None


def container_ports(pod: dict[str, Any]) -> tuple[ContainerPort, ...]:
    raw = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            name = p.get("name")
            raw.append((int(p["containerPort"]), PROTO_NUMBERS.get(str(p.get("protocol") or "TCP").upper(), 6),
                        name if isinstance(name, str) or name is None else str(name)))
    return _ports(tuple(raw)) if raw else ()


@functools.lru_cache(maxsize=4096)
def _ports(raw: tuple[tuple[int, int, str | None], ...]) -> tuple[ContainerPort, ...]:
    """The ContainerPorts of (port, proto, name)s, one copy per distinct set (``shared``)."""
    return tuple(ContainerPort(port, proto, _one(name) if name is not None else None) for port, proto, name in raw)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A Pod as policy and the data plane see it."""

    namespace: str
    name: str
    labels: Labels
    #: the primary network it asks for (lace.store.kinds.pod_network)
    network: str
    #: spec.nodeName ("" until it is bound)
    node: str
    ports: tuple[ContainerPort, ...] = ()
    #: the TCP ports the node's kubelet probes (lace.probes.pod_probe_ports)
    probe_ports: tuple[int, ...] = ()
    rv: int = 0
    #: for the node's own pods (``of(obj, local=node)``; left at the defaults for other nodes' pods):
    #: creationTimestamp as a POSIX time, and whether the pod is done with its network — host
    #: network, being deleted, Succeeded or Failed — so no endpoint is expected for it
    created: float | None = None
    done: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    @classmethod
    def of(cls, obj: dict[str, Any], local: str | None = None) -> PodRecord:
        """The record of a Pod object; ``local``: the node whose pods keep ``created`` and ``done``
        (None: every pod keeps them)."""
        from lace.probes import pod_probe_ports   # lace.probes reads the probe fields of the spec
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        labels = shared(tuple(sorted((_one(k), _one(v)) for k, v in (meta.get("labels") or {}).items())))
        node = _one(str(spec.get("nodeName") or ""))
        created, done = None, False
        if local is None or node == local:
            created = timestamp(meta.get("creationTimestamp"))
            done = bool(spec.get("hostNetwork") or meta.get("deletionTimestamp")
                        or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
        return cls(_one(meta.get("namespace") or ""), meta["name"], labels, _one(K.pod_network(obj)), node,
                   container_ports(obj), shared(tuple(sorted(pod_probe_ports(obj)))), revision(obj), created, done)


def timestamp(text: str | None) -> float | None:
    """An RFC 3339 timestamp of the store (``2026-01-02T03:04:05Z``) as a POSIX time; None when
    absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """An IPLease: an address of a network held for a pod (or a node's host, or a pod's probe
    address: ``container_id`` tells, lace.agent.model), with the endpoint the agent made for it."""

    name: str
    network: str
    node: str
    ip: IPAddr
    #: ``namespace/name`` of the pod (``node/<name>`` for a host address)
    pod: str
    container_id: str
    #: the agent's host-side interface and the pod's MAC (annotations; "" until the agent sets them)
    host_ifname: str = ""
    pod_mac: str = ""
    rv: int = 0

    @property
    def key(self) -> str:
        return f"/{self.name}"

    @classmethod
    def of(cls, obj: dict[str, Any]) -> LeaseRecord:
        s, meta = obj["spec"], obj["metadata"]
        ann = meta.get("annotations") or {}
        return cls(meta["name"], _one(s["network"]), _one(s["node"]), ipaddress.ip_address(s["ip"]), s["pod"],
                   str(s.get("containerID") or ""), ann.get(K.HOST_IFNAME_ANNOTATION, ""),
                   ann.get(K.POD_MAC_ANNOTATION, ""), revision(obj))


#: the records a cache keeps instead of whole objects, by kind
RECORDS = {"Pod": PodRecord.of, "IPLease": LeaseRecord.of}
