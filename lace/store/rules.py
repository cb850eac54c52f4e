"""Per-kind rules every backend shares: validation, status set at create, update and delete guards,
cascades, and the objects every cluster has.

Like kube-apiserver's registry strategies (PrepareForCreate, Validate, delete checks): functions of
one backend ``Transaction`` that the registry (``registry.py``) calls inside the write they judge,
so what they read is consistent with what is written and a rejected write leaves nothing behind.
"""

from __future__ import annotations

import ipaddress

from lace.store import allocate
from lace.store import kinds as K
from lace.store.backend import Transaction
from lace.store.errors import Forbidden
from lace.store.validation import object_ref
from lace.store.validation import validate as _validate

# Status fields the store allocates: every write keeps the stored value, whatever the body says.
OWNED_STATUS: dict[str, tuple[str, ...]] = {"Network": ("id",), "Segment": ("id",)}

# What a namespace holds (deleted with it) and what a network's allocations are (deleted with it),
# in the order they go.
_IN_NAMESPACE = ("Pod", "NetworkPolicy", "Service")
_OF_NETWORK = ("IPLease", "IPBlock", "Segment")


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
    """What every cluster has from the start: the default Network and the always-present Namespaces."""
    out = [{"apiVersion": K.LACE_API_VERSION, "kind": "Network",
            "metadata": {"name": K.DEFAULT_NETWORK},
            "spec": {"cidrs": list(K.DEFAULT_NETWORK_CIDRS), "routes": []}}]
    out += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in K.ALWAYS_NAMESPACES]
    return out


def prepare_for_create(txn: Transaction, obj: dict) -> None:
    """Drop a status written by the user and set the store-allocated one (Network and Segment IDs)."""
    obj.pop("status", None)
    if obj["kind"] == "Network":
        obj["status"] = {"id": allocate.network_id(txn, obj["metadata"]["name"])}
    elif obj["kind"] == "Segment":
        obj["status"] = {"id": allocate.segment_id(txn)}


def guard_update(txn: Transaction, existing: dict, new: dict) -> None:
    """Refuse updates that would orphan allocations (a Network shrinking under its IPBlocks)."""
    if new["kind"] != "Network":
        return
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


def guard_delete(txn: Transaction, obj: dict) -> None:
    """Refuse deleting what must exist or is still used: the default Network and the always-present
    Namespaces, a Network with pods, services or routes pointing at it."""
    name = obj["metadata"]["name"]
    if obj["kind"] == "Namespace" and name in K.ALWAYS_NAMESPACES:
        raise Forbidden(f'Namespace "{name}" cannot be deleted: it always exists')
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
    segments; a Namespace's pods, policies and services."""
    name = obj["metadata"]["name"]
    if obj["kind"] == "Network":
        return [o for kind in _OF_NETWORK for o in txn.list(kind) if o["spec"]["network"] == name]
    if obj["kind"] == "Namespace":
        return [o for kind in _IN_NAMESPACE for o in txn.list(kind, name)]
    return []
