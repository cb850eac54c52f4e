"""Per-kind rules every backend shares: validation, what the store sets at create and update,
update and delete guards, graceful deletion, cascades, and the objects every cluster has.

Like kube-apiserver's registry strategies (PrepareForCreate, PrepareForUpdate, Validate, delete
checks): functions of one backend ``Transaction`` (or of the registry's ``Writer`` where they
allocate) that the registry (``registry.py``) calls inside the write they judge, so what they read
is consistent with what is written and a rejected write leaves nothing behind.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping
from typing import Any

from lace.store import allocate
from lace.store import kinds as K
from lace.store.backend import Transaction
from lace.store.errors import Forbidden, ValidationError
from lace.store.validation import object_ref
from lace.store.validation import validate as _validate

# Status fields the store allocates: every write keeps the stored value, whatever the body says.
OWNED_STATUS: dict[str, tuple[str, ...]] = {"Network": ("id",), "Segment": ("id",),
                                            "Service": ("id", "loadBalancer")}

# What a namespace holds (deleted with it) and what a network's allocations are (deleted with it),
# in the order they go (slices before their services, which would take them along).
_IN_NAMESPACE = ("Pod", "NetworkPolicy", "EndpointSlice", "Service")
_OF_NETWORK = ("IPLease", "IPBlock", "Segment")
#: metadata the store sets on a graceful delete; a body never sets or clears it
DELETION_FIELDS = ("deletionTimestamp", "deletionGracePeriodSeconds")


class _Lookup:
    """Validation's view of the store inside the current transaction (sees the batch so far)."""

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn

    def get_object(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        return self.txn.get(kind, namespace or "", name)

    def list_objects(self, kind: str, namespace: str | None = None) -> list[dict]:
        return self.txn.list(kind, namespace)


def validate(txn: Transaction, obj: object) -> dict:
    """The object normalised and checked against the schema and the stored objects, or ValidationError."""
    return _validate(obj, _Lookup(txn))


def builtin_objects() -> list[dict]:
    """What every cluster has from the start: the default Network, the always-present Namespaces
    and the default ServiceCIDR."""
    out = [{"apiVersion": K.LACE_API_VERSION, "kind": "Network",
            "metadata": {"name": K.DEFAULT_NETWORK},
            "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS), "routes": []}}]
    out += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in K.ALWAYS_NAMESPACES]
    out.append({"apiVersion": K.NETWORKING_API_VERSION, "kind": "ServiceCIDR",
                "metadata": {"name": K.DEFAULT_SERVICE_CIDR},
                "spec": {"cidrs": list(K.DEFAULT_SERVICE_CIDRS)}})
    return out


def prepare_for_create(w: allocate.ServiceRecords, obj: dict) -> None:
    """Drop a status written by the user and set the store-allocated one (Network, Segment and
    Service IDs; a Service's addresses and ports)."""
    obj.pop("status", None)
    for key in DELETION_FIELDS:
        obj["metadata"].pop(key, None)
    if obj["kind"] == "Network":
        obj["status"] = {"id": allocate.network_id(w, obj["metadata"]["name"])}
    elif obj["kind"] == "Segment":
        obj["status"] = {"id": allocate.segment_id(w)}
    elif obj["kind"] == "Service":
        allocate.allocate_service(w, None, obj)


def prepare_for_update(w: allocate.ServiceRecords, existing: dict, new: dict) -> None:
    """Carry over what only the store sets (deletion marks; a Service's allocations, which an
    update may extend but not change)."""
    for key in DELETION_FIELDS:
        if key in existing["metadata"]:
            new["metadata"][key] = existing["metadata"][key]
        else:
            new["metadata"].pop(key, None)
    if new["kind"] == "Service":
        allocate.allocate_service(w, existing, new)


def check_written(w: allocate.Records, existing: dict | None, obj: dict) -> None:
    """Checks of references that a batch may satisfy after the object itself: run once the whole
    batch is written (a Network importing a Service applied in the same file)."""
    if obj["kind"] == "Network":
        allocate.check_imports(w, existing, obj)


def _refuse_orphans(obj: dict, orphans: list[str], action: str) -> None:
    if orphans:
        shown = ", ".join(orphans[:5]) + (", ..." if len(orphans) > 5 else "")
        raise Forbidden(f"{object_ref(obj)}: {action} would leave {len(orphans)} allocated address(es) "
                        f"outside every range: {shown}", hint="keep the range, or delete those services first")


def _guard_service_ranges(txn: Transaction, obj: dict, *, deleted: bool = False) -> None:
    """A ServiceCIDR, a Network's serviceCIDRs or a LoadBalancerIPPool may not shrink (or go)
    under the addresses services hold; ``obj`` is the new version, or the deleted one."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    action = "deleting it" if deleted else "this change"
    allocations = txn.list("ServiceAllocation")
    if kind == "LoadBalancerIPPool":
        pools = [o for o in txn.list(kind) if o["metadata"]["name"] != name] + ([] if deleted else [obj])
        _refuse_orphans(obj, allocate.load_balancer_ips_outside(allocations, allocate.pool_ranges(pools)),
                        action)
        return
    shared_objs = [o for o in txn.list("ServiceCIDR") if o["metadata"]["name"] != name or kind != "ServiceCIDR"]
    if kind == "ServiceCIDR" and not deleted:
        shared_objs.append(obj)
    shared = allocate.cluster_service_ranges(shared_objs)
    own = {n["metadata"]["name"]: n["spec"].get("serviceCIDRs") for n in txn.list("Network")}
    if kind == "Network":
        own = {name: obj["spec"].get("serviceCIDRs")}

    def ranges_of(network: str) -> list[allocate.IPNet] | None:
        if network not in own:
            return None
        return [ipaddress.ip_network(c) for c in own[network]] if own[network] else shared

    _refuse_orphans(obj, allocate.cluster_ips_outside(allocations, ranges_of), action)


def guard_update(txn: Transaction, existing: dict, new: dict) -> None:
    """Refuse updates that would orphan allocations (a Network shrinking under its IPBlocks, a
    service range under its services' addresses) or change what may not change."""
    if new["kind"] == "EndpointSlice" and new["addressType"] != existing["addressType"]:
        raise ValidationError(object_ref(new), "addressType",
                              f'may not change once set ({existing["addressType"]} -> {new["addressType"]})',
                              "delete the slice and create it again")
    if new["kind"] in ("ServiceCIDR", "LoadBalancerIPPool") and new["spec"] != existing["spec"]:
        _guard_service_ranges(txn, new)
    if new["kind"] != "Network":
        return
    if new["spec"].get("serviceCIDRs") != existing["spec"].get("serviceCIDRs"):
        _guard_service_ranges(txn, new)
    cidrs = [ipaddress.ip_network(c) for c in new["spec"]["cidrs"]]
    for block in txn.list("IPBlock"):
        if block["spec"]["network"] != new["metadata"]["name"]:
            continue
        cidr = ipaddress.ip_network(block["spec"]["cidr"])
        if not any(cidr.version == c.version and cidr.subnet_of(c) for c in cidrs):  # type: ignore[arg-type]
            raise Forbidden(
                f'{object_ref(new)}: the new spec.cidrs no longer contain IPBlock '
                f'"{block["metadata"]["name"]}" ({cidr}) of node {block["spec"]["node"]}',
                hint="keep the range, or drain the pods of that network first")


def _guard_block(txn: Transaction, block: dict) -> None:
    """An IPBlock may not go while it holds leases: a node's leases are found through its blocks
    (``allocate.leases_for``), so a lease left without its block would never be released. A
    Network's deletion takes its leases first, in the same transaction."""
    spec = block["spec"]
    cidr = ipaddress.ip_network(spec["cidr"])
    held = [o["metadata"]["name"] for _, o in allocate.leases_in(
        txn.list_prefix("IPLease", "", K.lease_prefix(spec["network"], str(cidr))), spec["network"], cidr)]
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise Forbidden(f'{object_ref(block)} still holds {len(held)} lease(s): {shown}',
                        hint="delete the pods that hold them first (or the leases themselves)")


def guard_delete(txn: Transaction, obj: dict) -> None:
    """Refuse deleting what must exist or is still used: the default Network and the always-present
    Namespaces, a Network with pods, services or routes pointing at it, an IPBlock holding leases."""
    name = obj["metadata"]["name"]
    if obj["kind"] == "Namespace" and name in K.ALWAYS_NAMESPACES:
        raise Forbidden(f'Namespace "{name}" cannot be deleted: it always exists')
    if obj["kind"] == "ServiceCIDR" and name == K.DEFAULT_SERVICE_CIDR:
        raise Forbidden(f'ServiceCIDR "{name}" cannot be deleted: every cluster has it',
                        hint="change its spec.cidrs instead, or give networks their own spec.serviceCIDRs")
    if obj["kind"] in ("ServiceCIDR", "LoadBalancerIPPool"):
        _guard_service_ranges(txn, obj, deleted=True)
    if obj["kind"] == "IPBlock":
        _guard_block(txn, obj)
    if obj["kind"] != "Network":
        return
    if name == K.DEFAULT_NETWORK:
        raise Forbidden('Network "default" cannot be deleted: every cluster has it')
    users = [f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}'
             for p in txn.list("Pod") if K.pod_network(p) == name]
    if users:
        shown = ", ".join(users[:5]) + (", ..." if len(users) > 5 else "")
        raise Forbidden(f'Network "{name}" is in use by {len(users)} pod(s): {shown}',
                        hint="delete or move those pods first")
    services = [f'{s["metadata"]["namespace"]}/{s["metadata"]["name"]}' for s in txn.list("Service")
                if (s["metadata"].get("annotations") or {}).get(K.NETWORK_ANNOTATION) == name]
    if services:
        raise Forbidden(f'Network "{name}" is in use by service(s): {", ".join(services[:5])}',
                        hint="delete those services first")
    routed = [n["metadata"]["name"] for n in txn.list("Network")
              if any(r.get("to") == name for r in (n["spec"].get("routes") or []))]
    if routed:
        raise Forbidden(f'Network "{name}" is the target of routes in Network(s): {", ".join(routed)}',
                        hint="remove those routes first")


def dependents(txn: Transaction, obj: dict) -> list[dict]:
    """What goes with ``obj`` when it is deleted, in deletion order: a Network's leases, blocks and
    segments; a Namespace's pods, policies, endpoint slices and services; the EndpointSlices a
    Service owns (ownerReferences, as Kubernetes' garbage collector)."""
    name = obj["metadata"]["name"]
    if obj["kind"] == "Network":
        return [o for kind in _OF_NETWORK for o in txn.list(kind) if o["spec"]["network"] == name]
    if obj["kind"] == "Namespace":
        return [o for kind in _IN_NAMESPACE for o in txn.list(kind, name)]
    if obj["kind"] == "Service":
        uid = obj["metadata"].get("uid")
        return [o for o in txn.list("EndpointSlice", obj["metadata"]["namespace"])
                if any(ref.get("kind") == "Service" and ref.get("uid") == uid
                       for ref in o["metadata"].get("ownerReferences") or ())]
    return []


def after_delete(w: allocate.Records, obj: dict) -> None:
    """Free what a deleted object held (a Service's addresses, ports and ID)."""
    if obj["kind"] == "Service":
        allocate.release_service(w, obj)


# ---- graceful deletion (Pods) -----------------------------------------------------------------

def grace_period(obj: Mapping[str, Any], requested: int | None) -> int:
    """Seconds a delete of ``obj`` waits for its kubelet (0: remove it now). Only Pods wait, and only
    those a kubelet runs: a pod with no node, none reported (no status.phase) or finished is
    removed at once, as there is nothing to stop. ``requested`` None: the pod's
    spec.terminationGracePeriodSeconds, else Kubernetes' 30."""
    if requested == 0:
        return 0
    if obj["kind"] != "Pod":
        return 0
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in (None, "Succeeded", "Failed"):
        return 0
    if requested is None:
        requested = spec.get("terminationGracePeriodSeconds", K.DEFAULT_GRACE_PERIOD)
    return max(0, int(requested))


def mark_deleted(obj: dict, grace: int) -> bool:
    """Set the deletion marks of a graceful delete; False if an earlier delete already asked for
    no longer a wait (a later delete may only shorten it)."""
    meta = obj["metadata"]
    current = meta.get("deletionGracePeriodSeconds")
    if "deletionTimestamp" in meta and current is not None and current <= grace:
        return False
    deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace)
    meta["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
    meta["deletionGracePeriodSeconds"] = grace
    return True
