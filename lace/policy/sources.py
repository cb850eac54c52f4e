"""Build PolicyInputs from the store: namespaces, pods with their addresses, segments and container
ports, policies, and the segments of ipBlock CIDRs.

This is where lace.policy meets the store: it reads, and allocates the segment of an ipBlock CIDR
on first use (unless ``allocate`` is off), so every node and the CLI agree on it. The pinned maps
are read elsewhere (``emulate``, for ``lace policy trace``); resolution itself does no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lace.store.records import PodRecord, same_objects

from .ids import cidr_identity, normalise_cidr
from .model import NamespaceInfo, PodInfo, PolicyInputs, labels_tuple
from .parse import ParsedPolicy, is_audit, parsed
from .resolve import cidrs_of


def _labels_key(network: str, namespace: str, labels: dict[str, str]) -> tuple:
    return (network, namespace, tuple(sorted(labels.items())))


def policy_inputs(namespaces: Iterable[dict], policies: Iterable[dict | ParsedPolicy], pods: Mapping[str, PodRecord],
                  addresses: Iterable[Any], segments: dict[tuple, int],
                  allocate_segment: Callable[[str, str, dict[str, str]], int] | None = None,
                  pod_memo: dict[str, tuple] | None = None,
                  policy_memo: dict[tuple, tuple] | None = None) -> PolicyInputs:
    """Inputs from Namespace and NetworkPolicy objects (or policies parsed already, as the agent's
    cache keeps them), pod records by ``ns/name``, their addresses
    (objects with network, ip, segment, node, pod — lace.agent.model.PodAddress) and the store's
    segments by (network, namespace, sorted labels); the segment of an ipBlock CIDR missing from
    ``segments`` is allocated with ``allocate_segment`` (the store's), or left out without one.
    A caller that keeps ``pod_memo`` and ``policy_memo`` reuses what was made of each pod (its
    PodInfo, by ``ns/name``, while its record and addresses are the same objects as last time) and
    of each policy (its ipBlock CIDRs, by (namespace, name), while it is the same object)."""
    inputs = PolicyInputs()
    for o in namespaces:
        meta = o.get("metadata") or {}
        inputs.namespaces[meta["name"]] = NamespaceInfo(meta["name"], labels_tuple(meta.get("labels")),
                                                        is_audit(meta.get("annotations")))
    grouped: dict[str, list[Any]] = {}
    nets: set[int] = set()
    for a in addresses:
        grouped.setdefault(a.pod, []).append(a)
        nets.add(a.network)
    if pod_memo is None:
        pod_memo = {}
    if policy_memo is None:
        policy_memo = {}
    for key, addrs in sorted(grouped.items()):
        pod = pods.get(key)
        if pod is None:
            continue
        hit = pod_memo.get(key)
        if hit is not None and hit[0] is pod and same_objects(hit[1], addrs):
            inputs.pods.append(hit[2])
            continue
        info = PodInfo(
            namespace=pod.namespace, name=pod.name, labels=pod.labels, network=pod.network,
            network_id=addrs[0].network, segment=addrs[0].segment,
            ips=tuple(sorted((a.ip for a in addrs), key=lambda ip: (ip.version, ip))),
            node=addrs[0].node, ports=pod.ports)
        pod_memo[key] = (pod, tuple(addrs), info)
        inputs.pods.append(info)
    inputs.network_ids = tuple(sorted(nets | {1}))
    inputs.policies = parsed(policies)
    for policy in inputs.policies:
        ident = (policy.namespace, policy.name)
        hit = policy_memo.get(ident)
        if hit is not None and hit[0] is policy:
            cidrs = hit[1]
        else:
            cidrs = sorted(cidrs_of(policy))
            policy_memo[ident] = (policy, cidrs)
        for c in cidrs:
            net, ns, labels = cidr_identity(c)
            seg = segments.get(_labels_key(net, ns, labels))
            if seg is None and allocate_segment is not None:
                seg = allocate_segment(net, ns, labels)
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
    pods = {p.key: p for p in map(PodRecord.of, store.list("pods").items)}
    addrs = []
    for lease in store.list("ipleases").items:
        s = lease["spec"]
        pod = pods.get(s["pod"])
        if pod is None or s["network"] not in ids:
            continue
        seg = segments.get((s["network"], pod.namespace, pod.labels))
        if seg is None:
            continue
        addrs.append(_Address(ids[s["network"]], ipaddress.ip_address(s["ip"]), seg, s["node"], s["pod"]))
    return policy_inputs(store.list("namespaces").items, store.list("networkpolicies").items, pods, addrs,
                         segments, store.allocate_segment if allocate else None)
