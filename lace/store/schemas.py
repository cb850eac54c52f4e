"""Structural JSON Schemas, one per kind; semantic rules (CIDRs, references, ports) live in validation.py.

Schemas only say which fields exist and their JSON types, so their error messages stay precise; unknown
top-level spec fields of lace's own kinds are rejected, core kinds stay open like Kubernetes objects.
"""

from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_STR_LIST = {"type": "array", "items": _STR}
_INT_OR_STR = {"type": ["integer", "string"]}
_INT = {"type": "integer"}
_OWNER_REFERENCE = {
    "type": "object",
    "required": ["apiVersion", "kind", "name", "uid"],
    "properties": {"apiVersion": _STR, "kind": _STR, "name": _STR, "uid": _STR,
                   "controller": _BOOL, "blockOwnerDeletion": _BOOL},
}

METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": _STR,
        "namespace": _STR,
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
        "uid": _STR,
        "resourceVersion": _STR,
        "generation": {"type": "integer"},
        "creationTimestamp": _STR,
        "deletionTimestamp": _STR,
        "deletionGracePeriodSeconds": _INT,
        "ownerReferences": {"type": "array", "items": _OWNER_REFERENCE},
    },
}

SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _STR_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {"key": _STR, "operator": _STR, "values": _STR_LIST},
            },
        },
    },
}


def _object(spec: dict[str, Any] | None = None, *, spec_required: bool = False,
            status: dict[str, Any] | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {"apiVersion": _STR, "kind": _STR, "metadata": METADATA}
    if spec is not None:
        props["spec"] = spec
    props["status"] = status or {"type": "object"}
    required = ["apiVersion", "kind", "metadata"] + (["spec"] if spec_required else [])
    return {"type": "object", "required": required, "properties": props}


_CONTAINER_PORT = {
    "type": "object",
    "required": ["containerPort"],
    "properties": {"containerPort": {"type": "integer"}, "name": _STR, "protocol": _STR},
}

# a container's startupProbe, livenessProbe and readinessProbe (validation.py checks the values)
_PROBE = {
    "type": "object",
    "properties": {
        "httpGet": {"type": "object", "required": ["port"], "properties": {
            "path": _STR, "port": _INT_OR_STR, "host": _STR, "scheme": _STR,
            "httpHeaders": {"type": "array", "items": {"type": "object", "required": ["name", "value"],
                                                       "properties": {"name": _STR, "value": _STR}}}}},
        "tcpSocket": {"type": "object", "required": ["port"], "properties": {"port": _INT_OR_STR, "host": _STR}},
        "grpc": {"type": "object", "required": ["port"], "properties": {"port": _INT, "service": _STR}},
        "exec": {"type": "object", "required": ["command"], "properties": {"command": _STR_LIST}},
        "initialDelaySeconds": _INT, "periodSeconds": _INT, "timeoutSeconds": _INT,
        "successThreshold": _INT, "failureThreshold": _INT, "terminationGracePeriodSeconds": _INT,
    },
}
# a container's lifecycle.preStop / postStart (validation.py checks the handler and its values)
_HOOK = {
    "type": "object",
    "properties": {
        "exec": _PROBE["properties"]["exec"], "httpGet": _PROBE["properties"]["httpGet"],
        "tcpSocket": _PROBE["properties"]["tcpSocket"],
        "sleep": {"type": "object", "required": ["seconds"], "properties": {"seconds": _INT}},
    },
}
_LIFECYCLE = {"type": "object", "properties": {"preStop": _HOOK, "postStart": _HOOK}}
_IPS = {"type": "array", "items": {"type": "object", "properties": {"ip": _STR}}}

POD = _object({
    "type": "object",
    "properties": {
        "nodeName": _STR,
        # the pod's name in its headless Service's DNS: HOSTNAME.SUBDOMAIN.NAMESPACE.svc
        "hostname": _STR, "subdomain": _STR,
        "terminationGracePeriodSeconds": _INT,
        "containers": {
            "type": "array",
            "items": {"type": "object", "properties": {
                "name": _STR, "image": _STR, "args": _STR_LIST, "ports": {"type": "array", "items": _CONTAINER_PORT},
                "startupProbe": _PROBE, "livenessProbe": _PROBE, "readinessProbe": _PROBE,
                "lifecycle": _LIFECYCLE}},
        },
    },
}, status={"type": "object", "properties": {
    "phase": _STR, "podIP": _STR,
    "podIPs": _IPS,
    # a lace extension: the pod's probe addresses (the kubelet probes a pod of an isolated network there)
    "probeIPs": _IPS,
    "conditions": {"type": "array", "items": {"type": "object", "required": ["type", "status"],
                                              "properties": {"type": _STR, "status": _STR}}},
    "containerStatuses": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
        "name": _STR, "image": _STR, "ready": _BOOL, "started": _BOOL, "restartCount": _INT,
        "state": {"type": "object"}, "lastState": {"type": "object"}}}},
}})

NAMESPACE = _object({"type": "object"})
NODE = _object({"type": "object", "properties": {"podCIDRs": _STR_LIST}})

_NP_PORT = {"type": "object", "properties": {"protocol": _STR, "port": _INT_OR_STR,
                                             "endPort": {"type": "integer"}}}
_NP_PEER = {"type": "object", "properties": {
    "podSelector": SELECTOR, "namespaceSelector": SELECTOR,
    "ipBlock": {"type": "object", "required": ["cidr"],
                "properties": {"cidr": _STR, "except": _STR_LIST}},
}}
NETWORK_POLICY = _object({
    "type": "object",
    "required": ["podSelector"],
    "properties": {
        "podSelector": SELECTOR,
        "policyTypes": _STR_LIST,
        "ingress": {"type": "array", "items": {"type": "object", "properties": {
            "from": {"type": "array", "items": _NP_PEER},
            "ports": {"type": "array", "items": _NP_PORT}}}},
        "egress": {"type": "array", "items": {"type": "object", "properties": {
            "to": {"type": "array", "items": _NP_PEER},
            "ports": {"type": "array", "items": _NP_PORT}}}},
    },
}, spec_required=True)

SERVICE = _object({
    "type": "object",
    "properties": {
        "type": _STR,
        "selector": _STR_MAP,
        "clusterIP": _STR,
        "clusterIPs": _STR_LIST,
        "ipFamilies": _STR_LIST,
        "ipFamilyPolicy": _STR,
        "ports": {"type": "array", "items": {"type": "object", "required": ["port"], "properties": {
            "name": _STR, "protocol": _STR, "port": _INT, "appProtocol": _STR,
            "targetPort": _INT_OR_STR, "nodePort": _INT}}},
        "sessionAffinity": _STR,
        "sessionAffinityConfig": {"type": "object", "properties": {
            "clientIP": {"type": "object", "properties": {"timeoutSeconds": _INT}}}},
        "externalTrafficPolicy": _STR,
        "internalTrafficPolicy": _STR,
        "loadBalancerIP": _STR,
        "allocateLoadBalancerNodePorts": _BOOL,
        "publishNotReadyAddresses": _BOOL,
    },
}, status={"type": "object", "properties": {
    "id": _INT,
    "loadBalancer": {"type": "object", "properties": {
        "ingress": {"type": "array", "items": {"type": "object", "properties": {"ip": _STR}}}}},
}})

# EndpointSlice keeps Kubernetes' shape: its fields sit at the top level, there is no spec.
ENDPOINT_SLICE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "addressType"],
    "properties": {
        "apiVersion": _STR, "kind": _STR, "metadata": METADATA,
        "addressType": _STR,
        "endpoints": {"type": "array", "items": {
            "type": "object", "required": ["addresses"],
            "properties": {
                "addresses": _STR_LIST,
                "conditions": {"type": "object", "properties": {
                    "ready": {"type": ["boolean", "null"]}, "serving": {"type": ["boolean", "null"]},
                    "terminating": {"type": ["boolean", "null"]}}},
                "hostname": _STR, "nodeName": _STR, "zone": _STR,
                "targetRef": {"type": "object", "properties": {
                    "kind": _STR, "namespace": _STR, "name": _STR, "uid": _STR, "apiVersion": _STR}},
            }}},
        "ports": {"type": "array", "items": {"type": "object", "properties": {
            "name": _STR, "protocol": _STR, "port": {"type": ["integer", "null"]}, "appProtocol": _STR}}},
    },
}

SERVICE_CIDR = _object({
    "type": "object", "required": ["cidrs"], "additionalProperties": False,
    "properties": {"cidrs": {"type": "array", "minItems": 1, "items": _STR}},
}, spec_required=True)

LOAD_BALANCER_IP_POOL = _object({
    "type": "object", "required": ["cidrs"], "additionalProperties": False,
    "properties": {"cidrs": {"type": "array", "minItems": 1, "items": _STR}},
}, spec_required=True)

SERVICE_ALLOCATION = _object({
    "type": "object", "required": ["resource", "service"], "additionalProperties": False,
    "properties": {"resource": _STR, "service": _STR, "network": _STR, "ip": _STR, "port": _INT,
                   "id": _INT},
}, spec_required=True)

NETWORK = _object({
    "type": "object",
    "required": ["cidrs"],
    "additionalProperties": False,
    "properties": {
        "cidrs": {"type": "array", "minItems": 1, "items": _STR},
        "serviceCIDRs": _STR_LIST,
        "importServices": _STR_LIST,
        "conntrackLimit": _INT,
        "routes": {"type": "array", "items": {
            "type": "object", "required": ["to"], "additionalProperties": False,
            "properties": {"to": _STR, "cidrs": _STR_LIST, "masquerade": _BOOL}}},
    },
}, spec_required=True, status={"type": "object", "properties": {"id": {"type": "integer"}}})

SEGMENT = _object({
    "type": "object", "required": ["network", "namespace", "labels"], "additionalProperties": False,
    "properties": {"network": _STR, "namespace": _STR, "labels": _STR_MAP},
}, spec_required=True, status={"type": "object", "properties": {"id": {"type": "integer"}}})

IP_BLOCK = _object({
    "type": "object", "required": ["network", "node", "cidr"], "additionalProperties": False,
    "properties": {"network": _STR, "node": _STR, "cidr": _STR},
}, spec_required=True)

IP_LEASE = _object({
    "type": "object", "required": ["network", "node", "ip", "pod"], "additionalProperties": False,
    "properties": {"network": _STR, "node": _STR, "block": _STR, "ip": _STR, "pod": _STR,
                   "containerID": _STR, "ifname": _STR},
}, spec_required=True)

SCHEMAS: dict[str, dict[str, Any]] = {
    "Namespace": NAMESPACE, "Node": NODE, "Network": NETWORK, "Service": SERVICE,
    "NetworkPolicy": NETWORK_POLICY, "Pod": POD, "Segment": SEGMENT, "IPBlock": IP_BLOCK,
    "IPLease": IP_LEASE, "EndpointSlice": ENDPOINT_SLICE, "ServiceCIDR": SERVICE_CIDR,
    "LoadBalancerIPPool": LOAD_BALANCER_IP_POOL, "ServiceAllocation": SERVICE_ALLOCATION,
}
