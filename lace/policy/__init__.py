"""Kubernetes NetworkPolicy for lace: resolution into segments and the ``policy`` /
``prefix-segment`` maps, the semantic evaluator, and the datapath emulation ``lace policy trace``
uses. No I/O except in ``sources`` (store reads, CIDR segment allocation) and ``emulate``'s
``read_node_maps`` (a node's pinned maps); ``program``'s caches never change a result."""

from .ids import policy_ids
from .model import ContainerPort, NamespaceInfo, PodInfo, PolicyInputs
from .parse import parse_policy
from .program import PolicyProgrammer
from .resolve import Pressure, Resolution, Resolver, resolve

__all__ = ["ContainerPort", "NamespaceInfo", "PodInfo", "PolicyInputs", "PolicyProgrammer", "Pressure", "Resolution",
           "Resolver", "parse_policy", "policy_ids", "resolve"]
