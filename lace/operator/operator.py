"""The operator's reconcile pass: idempotent, level-triggered, one allocation per object.

Each pass reads Networks, Nodes, the default network's blocks and Services from the store and fixes
what is missing; running it twice changes nothing the second time, so a new leader just runs it
again. In Kubernetes the apiserver gives a Service its ClusterIPs, but not the cluster-wide ID
lace's datapath keys reverse translation and affinity by: the operator writes it into the
``lace.dev/service-id`` annotation, which the agents read (the lab's store sets ``status.id``).
A Service copied with another's annotation would share its ID: the newer of the two gets a new one.

An object someone else changed (or deleted) while the pass worked on it is left to the next pass,
which reads it again; the pass goes on with the others. Before each write the pass checks that this
operator still leads (``leading``), and stops when it does not (``NotLeading``).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from lace.store import allocate
from lace.store import kinds as K
from lace.store.errors import Conflict, NotFound, StoreError
from lace.store.kubernetes import KubernetesStore
from lace.store.kubernetes_client import parse_micro_time

log = logging.getLogger("lace.operator")
NODE_IDS = "next_node_id"
FIRST_NODE_ID = 1
SERVICE_IDS = "next_service_id"


class NotLeading(StoreError):
    """The pass stopped because this operator no longer leads."""


def _still_leading(leading: Callable[[], bool]) -> None:
    if not leading():
        raise NotLeading("this operator stopped leading (its Lease was not renewed in time, or another "
                         "operator took it): the pass stopped before its next write",
                         hint="the leader runs the next pass")


@dataclasses.dataclass(frozen=True)
class Options:
    """The operator's options (the lace-config ConfigMap)."""

    #: the cluster's locator block; node i gets the i-th subnet of ``locator_prefixlen``
    locator_block: str = "fd5e:c000::/32"
    locator_prefixlen: int = 48


@dataclasses.dataclass
class PassResult:
    """What one pass did, for logs and tests."""

    networks: list[str] = dataclasses.field(default_factory=list)
    nodes: list[str] = dataclasses.field(default_factory=list)
    blocks: list[str] = dataclasses.field(default_factory=list)
    services: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    #: objects another writer changed or deleted during the pass: the next pass does them
    changed: list[str] = dataclasses.field(default_factory=list)


def _changed_meanwhile(out: PassResult, what: str, err: StoreError) -> None:
    log.info("%s changed while the pass worked on it (%s): the next pass reads it again", what, err)
    out.changed.append(what)


def underlay_address(node: dict) -> ipaddress.IPv6Address | None:
    """The node's IPv6 InternalIP (SRv6 runs over the IPv6 underlay)."""
    for a in (node.get("status") or {}).get("addresses") or ():
        if a.get("type") == "InternalIP":
            try:
                addr = ipaddress.ip_address(a.get("address", ""))
            except ValueError:
                continue
            if isinstance(addr, ipaddress.IPv6Address):
                return addr
    return None


def locator(options: Options, node_id: int) -> str:
    block = ipaddress.IPv6Network(options.locator_block)
    size = 1 << (options.locator_prefixlen - block.prefixlen)
    if node_id >= size:
        raise StoreError(f"node ID {node_id} has no locator left in {block} (/{options.locator_prefixlen} each)",
                         hint="give the cluster a larger locatorBlock")
    return str(ipaddress.IPv6Network((int(block.network_address) + (node_id << (128 - options.locator_prefixlen)),
                                      options.locator_prefixlen)))


def reconcile(store: KubernetesStore, options: Options,
              leading: Callable[[], bool] = lambda: True) -> PassResult:
    """One pass (see the module docstring); NotLeading as soon as ``leading`` says False."""
    out = PassResult()
    _still_leading(leading)
    out.networks = [o["metadata"]["name"] for o in store.ensure_builtins()]
    for net in store.list("networks").items:
        if "id" in (net.get("status") or {}):
            continue
        _still_leading(leading)
        name = net["metadata"]["name"]
        new_id = store.backend.run(lambda txn: allocate.network_id(txn, name))
        try:
            store.update_status("networks", name, None, {**(net.get("status") or {}), "id": new_id},
                                resource_version=net["metadata"]["resourceVersion"])
        except (Conflict, NotFound) as err:
            _changed_meanwhile(out, f'Network "{name}"', err)
            continue
        out.networks.append(name)
    default = store.get("networks", K.DEFAULT_NETWORK)
    cidrs = [ipaddress.ip_network(c) for c in default["spec"]["cidrs"]]
    held = {(b["spec"]["node"], ipaddress.ip_network(b["spec"]["cidr"]).version)
            for b in store.list("ipblocks").items if b["spec"]["network"] == K.DEFAULT_NETWORK}
    nodes = store.list("nodes").items
    # IDs nodes already carry (given by hand, or by an earlier operator): never handed out again
    used = {(n["metadata"].get("annotations") or {}).get(K.NODE_ID_ANNOTATION) for n in nodes}
    for node in nodes:
        _still_leading(leading)
        name = node["metadata"]["name"]
        ann = node["metadata"].get("annotations") or {}
        if K.NODE_ID_ANNOTATION not in ann or K.LOCATOR_ANNOTATION not in ann:
            underlay = underlay_address(node)
            if underlay is None:
                log.warning('Node "%s" has no IPv6 InternalIP: lace needs an IPv6 underlay; skipped', name)
                out.skipped.append(name)
                continue
            node_id = store.backend.run(lambda txn: txn.next_value(NODE_IDS, FIRST_NODE_ID))
            while str(node_id) in used:
                node_id = store.backend.run(lambda txn: txn.next_value(NODE_IDS, FIRST_NODE_ID))
            used.add(str(node_id))
            node["metadata"]["annotations"] = {**ann, K.NODE_ID_ANNOTATION: str(node_id),
                                               K.LOCATOR_ANNOTATION: locator(options, node_id),
                                               K.UNDERLAY_ANNOTATION: str(underlay)}
            try:
                store.update(node)
                out.nodes.append(name)
            except (Conflict, NotFound) as err:
                _changed_meanwhile(out, f'Node "{name}"', err)
        for cidr in cidrs:
            if (name, cidr.version) in held:
                continue
            _still_leading(leading)
            block = store.allocate_block(K.DEFAULT_NETWORK, name, cidr.version, allocate.block_prefixlen(cidr))
            out.blocks.append(f"{name}:{block}")
    _service_ids(store, out, leading)
    return out


def _service_ids(store: KubernetesStore, out: PassResult, leading: Callable[[], bool]) -> None:
    """A lace service ID for every Service without one (the annotation; never reused: IDs other
    Services carry, given by hand or by an earlier operator, are skipped)."""
    services = store.list("services").items
    _unshare_ids(services)
    used = {(s["metadata"].get("annotations") or {}).get(K.SERVICE_ID_ANNOTATION) for s in services}
    for svc in services:
        meta = svc["metadata"]
        if K.SERVICE_ID_ANNOTATION in (meta.get("annotations") or {}):
            continue
        _still_leading(leading)
        while True:
            sid = store.backend.run(lambda txn: txn.next_value(SERVICE_IDS, K.FIRST_SERVICE_ID))
            if sid > K.MAX_SERVICE_ID:
                raise StoreError(f"no service ID left for Service {meta['namespace']}/{meta['name']}",
                                 hint="the cluster has handed out every ID; reset the lace-counters ConfigMap's "
                                      f"{SERVICE_IDS} only after checking no Service uses the low IDs")
            if str(sid) not in used:
                break
        used.add(str(sid))
        meta["annotations"] = {**(meta.get("annotations") or {}), K.SERVICE_ID_ANNOTATION: str(sid)}
        try:
            store.update(svc)
        except (Conflict, NotFound) as err:
            _changed_meanwhile(out, f'Service "{meta["namespace"]}/{meta["name"]}"', err)
            continue
        out.services.append(f"{meta['namespace']}/{meta['name']}")


def _age(svc: dict) -> tuple[datetime.datetime, str, str]:
    meta = svc["metadata"]
    created = parse_micro_time(meta.get("creationTimestamp")) or datetime.datetime.max.replace(tzinfo=datetime.UTC)
    return created, meta.get("namespace", ""), meta["name"]


def _unshare_ids(services: list[dict]) -> None:
    """Where Services carry the same ID (one was copied with the other's annotation), keep it on
    the oldest (by creationTimestamp, then name) and drop it from the others, which then get new
    IDs like any Service without one."""
    holders: dict[str, list[dict]] = {}
    for svc in services:
        sid = (svc["metadata"].get("annotations") or {}).get(K.SERVICE_ID_ANNOTATION)
        if sid is not None:
            holders.setdefault(sid, []).append(svc)
    for sid, same in holders.items():
        if len(same) < 2:
            continue
        first, *later = sorted(same, key=_age)
        for svc in later:
            log.warning('Service "%s/%s" carries service ID %s, which Service "%s/%s" (older) has too: '
                        "it gets a new one", svc["metadata"].get("namespace", ""), svc["metadata"]["name"],
                        sid, first["metadata"].get("namespace", ""), first["metadata"]["name"])
            del svc["metadata"]["annotations"][K.SERVICE_ID_ANNOTATION]


def summary(result: PassResult) -> dict[str, Any]:
    return dataclasses.asdict(result)
