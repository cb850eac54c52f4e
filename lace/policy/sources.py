"""Build PolicyInputs from the store: namespaces, pods with their addresses, segments and container
ports, policies, and the segments of ipBlock CIDRs.

This is where lace.policy meets the store: it reads, and allocates the segment of an ipBlock CIDR
on first use (unless ``allocate`` is off), so every node and the CLI agree on it. The pinned maps
are read elsewhere (``emulate``, for ``lace policy trace``); resolution itself does no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from lace.store import kinds as K

from .ids import cidr_identity, normalise_cidr
from .model import ContainerPort, NamespaceInfo, PodInfo, PolicyInputs, PROTO_NUMBERS, labels_tuple
from .parse import is_audit, parse_policy
from .resolve import cidrs_of


def _labels_key(network: str, namespace: str, labels: dict[str, str]) -> tuple:
    return (network, namespace, tuple(sorted(labels.items())))


def container_ports(pod: dict) -> tuple[ContainerPort, ...]:
    out = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            out.append(ContainerPort(int(p["containerPort"]),
                                     PROTO_NUMBERS.get(str(p.get("protocol") or "TCP").upper(), 6), p.get("name")))
    return tuple(out)


def policy_inputs(store: Any, pods: dict[str, dict], addresses: Iterable[Any],
                  segments: dict[tuple, int] | None = None, *, allocate: bool = True) -> PolicyInputs:
    """Inputs from pod objects by ``ns/name``, their addresses (objects with network, ip, segment,
    node, pod — lace.agent.model.PodAddress) and the store's segments by (network, namespace,
    sorted labels); CIDR segments missing from ``segments`` are allocated unless ``allocate`` is off."""
    if segments is None:
        segments = segment_index(store)
    inputs = PolicyInputs()
    for o in store.list("namespaces").items:
        meta = o.get("metadata") or {}
        inputs.namespaces[meta["name"]] = NamespaceInfo(meta["name"], labels_tuple(meta.get("labels")),
                                                        is_audit(meta.get("annotations")))
    grouped: dict[str, list[Any]] = {}
    nets: set[int] = set()
    for a in addresses:
        grouped.setdefault(a.pod, []).append(a)
        nets.add(a.network)
    for key, addrs in sorted(grouped.items()):
        obj = pods.get(key)
        if obj is None:
            continue
        meta = obj["metadata"]
        inputs.pods.append(PodInfo(
            namespace=meta["namespace"], name=meta["name"], labels=labels_tuple(meta.get("labels")),
            network=K.pod_network(obj), network_id=addrs[0].network, segment=addrs[0].segment,
            ips=tuple(sorted((a.ip for a in addrs), key=lambda ip: (ip.version, ip))),
            node=addrs[0].node, ports=container_ports(obj)))
    inputs.network_ids = tuple(sorted(nets | {1}))
    inputs.policies = list(store.list("networkpolicies").items)
    for obj in inputs.policies:
        try:
            cidrs = cidrs_of(parse_policy(obj))
        except (KeyError, ValueError):
            continue
        for c in sorted(cidrs):
            net, ns, labels = cidr_identity(c)
            seg = segments.get(_labels_key(net, ns, labels))
            if seg is None and allocate:
                seg = store.allocate_segment(net, ns, labels)
                segments[_labels_key(net, ns, labels)] = seg
            if seg is not None:
                inputs.cidr_segments[normalise_cidr(c)] = seg
    return inputs


def segment_index(store: Any) -> dict[tuple, int]:
    return {_labels_key(o["spec"]["network"], o["spec"]["namespace"], o["spec"].get("labels") or {}):
            int(o["status"]["id"]) for o in store.list("segments").items if "id" in (o.get("status") or {})}


class _Address:
    __slots__ = ("network", "ip", "segment", "node", "pod")

    def __init__(self, network: int, ip: Any, segment: int, node: str, pod: str) -> None:
        self.network, self.ip, self.segment, self.node, self.pod = network, ip, segment, node, pod


def inputs_from_store(store: Any, *, allocate: bool = False) -> PolicyInputs:
    """PolicyInputs from the store alone (the CLI, benchmarks): addresses from IPLeases."""
    ids = {o["metadata"]["name"]: int(o["status"]["id"]) for o in store.list("networks").items
           if "id" in (o.get("status") or {})}
    segments = segment_index(store)
    pods = {f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}': p for p in store.list("pods").items}
    addrs = []
    for lease in store.list("ipleases").items:
        s = lease["spec"]
        pod = pods.get(s["pod"])
        if pod is None or s["network"] not in ids:
            continue
        seg = segments.get(_labels_key(s["network"], pod["metadata"]["namespace"],
                                       pod["metadata"].get("labels") or {}))
        if seg is None:
            continue
        addrs.append(_Address(ids[s["network"]], ipaddress.ip_address(s["ip"]), seg, s["node"], s["pod"]))
    return policy_inputs(store, pods, addrs, segments, allocate=allocate)
