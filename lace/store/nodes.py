"""A Node's Ready condition, derived from its liveness record when it is read.

In Kubernetes the kubelet renews a Lease and the node lifecycle controller writes the Node's
Ready condition (``Unknown`` once the Lease is older than its grace period). The lace lab has no
such controller, and a written condition would be stale the moment its writer died: so readers
that show readiness (``lace get nodes``, ``lace status``) derive the condition from the store's
liveness records at read time and never store it. Both backends answer ``node_liveness`` the same
way, so the condition is the same on SQLite and etcd.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable, Mapping

from lace.store.api import Liveness

READY = "Ready"
#: the reasons of the derived condition (Kubernetes says NodeStatusUnknown for an expired Lease)
ALIVE_REASON = "AgentAlive"
EXPIRED_REASON = "LivenessExpired"


def ready_condition(node: str, liveness: Mapping[str, Liveness]) -> dict:
    """The Ready condition of ``node``: True while a live agent renews its record, Unknown after."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    held = liveness.get(node)
    if held is not None:
        return {"type": READY, "status": "True", "reason": ALIVE_REASON, "lastHeartbeatTime": now,
                "message": f"{held.holder or 'an agent'} renews the node's liveness (ttl {held.ttl:g}s)"}
    return {"type": READY, "status": "Unknown", "reason": EXPIRED_REASON, "lastHeartbeatTime": now,
            "message": "no live lace agent: the node's liveness record expired or was never taken "
                       "(the agent is down, or cut off from the store); `lace status` says which"}


def with_ready(nodes: Iterable[dict], liveness: Mapping[str, Liveness]) -> list[dict]:
    """Copies of Node objects whose Ready condition is the one their liveness says (any stored
    Ready condition replaced, the others kept)."""
    out = []
    for node in nodes:
        node = copy.deepcopy(node)
        status = node.setdefault("status", {})
        others = [c for c in status.get("conditions") or () if c.get("type") != READY]
        status["conditions"] = [ready_condition(node["metadata"]["name"], liveness), *others]
        out.append(node)
    return out
