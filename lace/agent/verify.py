"""Drift audit: what the kernel's maps hold against what the store's desired state implies.

``GET /v1/verify`` computes a fresh snapshot and the desired entries of every map the agent owns
(``OWNED_MAPS``) under the reconcile lock, exactly as a reconcile would, reads the same maps fresh
from the kernel, and classifies every entry that differs:

- **missing**: desired, not in the kernel;
- **stale**: in the kernel, not desired;
- **different**: in both, with another value (``desired`` vs ``actual``; the policy maps' hit
  counters are not compared, as reconcile does not compare them: ``lace.agent.diff.COMPARE``).

Nothing is written. The kernel is read without refreshing the agent's shadow of its own writes, so
a verify changes nothing the agent does next: drift it reports stays until ``POST
/v1/verify/repair`` (a resync reconcile, then a verify again) or the periodic resync repairs it.
The service programmer keeps backend IDs and Maglev table numbers; the audit computes on a scratch
copy of it, so a pending change it sees cannot move the agent's table allocation ahead of the
writes (a table freed in the copy is still referenced in the kernel).

A store change the reconcile loop has not applied yet is not drift: the audit waits for a pending
pass (``Agent.dirty``) first, and when it finds drift it looks again a moment later and reports
only what drifts both times.

Beside the drift, the report names what the desired state holds that a full map could not take
(``left_out``: service frontends, policy entries by policy): not drift — the kernel holds what the
agent could write — but traffic that meets them is dropped as MAP_FULL, so the audit is not clean.

Not audited: the maps the datapath writes itself (conntrack, affinity, events, metrics,
probe-cookie, sock-revnat), which have no desired state.

The pure part (:func:`classify`, :func:`map_report`, :func:`report`, :func:`confirmed`) works
on two dicts of packed entries; :func:`register_routes` puts the routes on an agent.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from lace.datapath import registry

from .datapath import TABLES
from .desired import OWNED_MAPS, Entries
from .diff import COMPARE


class Audited(Protocol):
    """What the audit needs of an agent (lace.agent.daemon.Agent)."""

    node: str
    dirty: threading.Event
    stopping: threading.Event
    stats: dict[str, Any]
    api: Any

    def audit(self, names: list[str]) -> tuple[dict[str, Entries], dict[str, Entries]]: ...

    def left_out(self) -> dict[str, list[str]]: ...

    def reconcile(self, *, resync: bool = False) -> dict[str, int]: ...

#: the kinds of drift, in the order they are listed
KINDS = ("missing", "stale", "different")
#: the maps the datapath writes itself: no desired state, not audited
NOT_AUDITED = tuple(n for n in registry.MAPS if n not in OWNED_MAPS)
#: value fields the datapath changes itself (never drift): left out of what is shown
VOLATILE = {"policy": ("hits",), "policy-exact": ("hits",)}
#: how long an audit waits for a pending reconcile pass, and between its two looks
SETTLE_SECONDS = 2.0
CONFIRM_DELAY = 0.25


@dataclass(frozen=True)
class Drift:
    """One entry that differs: its kind, raw key, and raw desired / actual values (None when absent)."""

    kind: str
    key: bytes
    desired: bytes | None
    actual: bytes | None


def classify(name: str, desired: Entries, actual: Entries) -> list[Drift]:
    """Every entry of map ``name`` that differs between ``desired`` and ``actual``: missing first,
    then stale, then different, each by key."""
    view = COMPARE.get(name, bytes)
    out = [Drift("missing", k, v, None) for k, v in desired.items() if k not in actual]
    out += [Drift("stale", k, None, v) for k, v in actual.items() if k not in desired]
    out += [Drift("different", k, v, actual[k]) for k, v in desired.items()
            if k in actual and view(actual[k]) != view(v)]
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(out, key=lambda d: (order[d.kind], d.key))


def confirmed(first: dict[str, list[Drift]], second: dict[str, list[Drift]]) -> dict[str, list[Drift]]:
    """The drift of ``second`` that ``first`` saw too (same map, kind and key): a store change in
    flight between two looks is not drift."""
    seen = {(name, d.kind, d.key) for name, ds in first.items() for d in ds}
    return {name: [d for d in ds if (name, d.kind, d.key) in seen] for name, ds in second.items()}


# ---- decoding --------------------------------------------------------------------------------------

def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item"):   # a NumPy scalar
        return v.item()
    return v


def _table_ids(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def decode_key(name: str, raw: bytes) -> dict[str, Any]:
    """A key as the registry decodes it; a Maglev entry is a whole table (its number)."""
    if name in TABLES:
        return {"table": struct.unpack("<I", raw)[0]}
    return _jsonable(registry.get(name).key_dict(raw))


def decode_value(name: str, raw: bytes, key: bytes) -> dict[str, Any]:
    """A value as the registry decodes it, without fields the datapath changes itself; a Maglev
    table as its slot count per backend ID."""
    if name in TABLES:
        ids = _table_ids(raw)
        return {"slots": len(ids), "backends": {str(b): n for b, n in sorted(Counter(ids).items())}}
    out = _jsonable(registry.get(name).value_dict(raw, key))
    for f in VOLATILE.get(name, ()):
        out.pop(f, None)
    return out


def entry_doc(name: str, d: Drift) -> dict[str, Any]:
    """One drifting entry as JSON: kind, decoded key, decoded desired / actual values (None when
    absent), and the raw bytes in hex."""
    doc: dict[str, Any] = {
        "kind": d.kind, "key": decode_key(name, d.key),
        "desired": decode_value(name, d.desired, d.key) if d.desired is not None else None,
        "actual": decode_value(name, d.actual, d.key) if d.actual is not None else None,
        "raw_key": d.key.hex()}
    if name not in TABLES:   # a table is 4 KiB of IDs: the decoded counts say enough
        doc["raw_desired"] = d.desired.hex() if d.desired is not None else None
        doc["raw_actual"] = d.actual.hex() if d.actual is not None else None
    elif d.desired is not None and d.actual is not None:
        doc["slots_differ"] = sum(a != b for a, b in zip(_table_ids(d.desired), _table_ids(d.actual)))
    return doc


def map_report(name: str, drift: list[Drift], desired: int, actual: int) -> dict[str, Any]:
    """One map's part of the report: entry counts and its drift by kind."""
    doc: dict[str, Any] = {"desired": desired, "actual": actual}
    for kind in KINDS:
        doc[kind] = [entry_doc(name, d) for d in drift if d.kind == kind]
    doc["drift"] = len(drift)
    return doc


def report(drift: dict[str, list[Drift]], desired: dict[str, Entries], actual: dict[str, Entries]) -> dict[str, Any]:
    """The whole audit: per map (in ``OWNED_MAPS`` order) its counts and drift, the total, and which
    maps were audited and which are not."""
    names = [n for n in OWNED_MAPS if n in drift]
    maps = {n: map_report(n, drift[n], len(desired.get(n, {})), len(actual.get(n, {}))) for n in names}
    return {"maps": maps, "total": sum(m["drift"] for m in maps.values()),
            "entries": sum(m["desired"] for m in maps.values()),
            "audited": names, "not_audited": list(NOT_AUDITED)}


# ---- in the agent --------------------------------------------------------------------------------

class BadRequest(ValueError):
    pass


def parse_maps(query: dict[str, str]) -> list[str]:
    """``?maps=routing,delivery``: the maps to audit (default: every owned map)."""
    text = query.get("maps") or ""
    names = [n for n in text.split(",") if n] or list(OWNED_MAPS)
    bad = [n for n in names if n not in OWNED_MAPS]
    if bad:
        raise BadRequest(f"not audited: {', '.join(bad)}; audited maps: {', '.join(OWNED_MAPS)}")
    return [n for n in OWNED_MAPS if n in names]


class Verifier:
    """The audit on one agent; see the module docstring."""

    def __init__(self, agent: Audited) -> None:
        self.agent = agent

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("GET", "/v1/verify", self._get), ("POST", "/v1/verify/repair", self._repair)]

    def _settle(self) -> bool:
        """Wait (briefly) for a reconcile pass the store asked for; True when none is pending."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.agent.dirty.is_set() and not self.agent.stopping.is_set():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def look(self, names: list[str]) -> tuple[dict[str, list[Drift]], dict[str, Entries], dict[str, Entries]]:
        """One look: (drift, desired, actual) of ``names``, computed as a reconcile would, applying nothing."""
        want, have = self.agent.audit(names)
        return {n: classify(n, want[n], have[n]) for n in names}, want, have

    def verify(self, names: list[str], *, confirm: bool = True) -> dict[str, Any]:
        settled = self._settle()
        drift, want, have = self.look(names)
        looks = 1
        if confirm and any(drift.values()):
            time.sleep(CONFIRM_DELAY)
            settled = self._settle()
            second, want, have = self.look(names)
            drift = confirmed(drift, second)
            looks = 2
        doc = report(drift, want, have)
        doc["left_out"] = self.agent.left_out()
        st = self.agent.stats
        doc.update(node=self.agent.node, time=time.time(), looks=looks, settled=settled,
                   agent={"last_reconcile": st.get("last_reconcile"), "last_error": st.get("last_error"),
                          "reconciles": st.get("reconciles")})
        return doc

    def _get(self, body: dict[str, Any]) -> tuple[int, Any]:
        try:
            names = parse_maps(body.get("_query") or {})
        except BadRequest as e:
            return 400, {"error": str(e)}
        return 200, self.verify(names)

    def _repair(self, body: dict[str, Any]) -> tuple[int, Any]:
        """A resync reconcile (every owned map read back from the kernel and repaired), then a
        verify: what was fixed, what the pass changed, and what drift remains."""
        try:
            names = parse_maps(body.get("_query") or {})
        except BadRequest as e:
            return 400, {"error": str(e)}
        self._settle()
        before, want, have = self.look(names)
        changed = self.agent.reconcile(resync=True, cause="repair")
        after = self.verify(names)
        left = {(n, kind, e["raw_key"]) for n, m in after["maps"].items() for kind in KINDS for e in m[kind]}
        fixed = {n: [d for d in ds if (n, d.kind, d.key.hex()) not in left] for n, ds in before.items()}
        after["repair"] = {"changes": changed,
                           "fixed": report(fixed, want, have)["maps"],
                           "fixed_total": sum(len(ds) for ds in fixed.values())}
        return 200, after


def register_routes(agent: Audited) -> Verifier:
    """Serve ``GET /v1/verify`` and ``POST /v1/verify/repair`` on the agent's API."""
    v = Verifier(agent)
    for method, path, fn in v.routes():
        agent.api.route(method, path, fn)
    return v
