"""The service programmer: one node's ``services``, ``backends``, ``maglev`` and ``revnat`` entries
from its frontends.

The agent owns one ``ServiceProgrammer`` and hands it to ``desired_maps``. Two things must stay
stable across reconciles and agent restarts, so the programmer keeps them (and ``adopt`` reads
them back from the pinned maps after a restart):

- **backend IDs**: one per backend identity (network, address, port, protocol), handed out in
  increasing order and never reused while the programmer lives, so an affinity entry naming a
  removed backend cannot land on a newcomer;
- **Maglev tables**: one per set of active backends (frontends with the same set share it). A
  changed set gets a *new* table number: the agent writes the new table before it points the
  frontend at it and clears the old one only afterwards, so a packet never reads a half-written
  table.

Maglev entries are handled as whole tables: key = table number (u32), value = MAGLEV_SIZE backend
IDs; the agent's datapath writer spreads a table over its slice of the ``maglev`` array.

``revnat`` (lace/abi/services.h): a service flow has one conntrack entry, keyed by its frontend;
its replies come from the backend and find that entry through the backend's revnat entry, which
names the frontends (source network, address, port) that send flows to it. A frontend that stops
using a backend (a backend deleted, a service gone) does not take itself out of the entry at once:
conntrack may still hold flows through it, whose replies need it. It is *retired* — kept in the
entry — until :meth:`ServiceProgrammer.release_revnat`, which the agent calls on its periodic
resync with the frontends live conntrack entries still name, drops the others. At most
REVNAT_FRONTENDS frontends per backend: the programmed ones first, in a stable order. A backend
with more (or whose entry the revnat map has no room for) is flagged REPLY_ENTRY in the backends
map, and the datapath gives its new flows a backend entry that their replies find directly (a
second conntrack entry, for those flows only): every frontend works, whatever number share a
backend. The frontends a revnat entry does not name are counted
(``ServicePressure.revnat_left_out``) and the backends flagged (``reply_entry_backends``).

A UDP flow has no end the datapath could see: its client may send from one source port for as
long as it lives, each datagram renewing its entry, so a flow whose backend left the service would
stay dead (TCP's would end, and a new connection gets a live backend). kube-proxy deletes such
conntrack entries when an endpoint goes; the programmer does the same through the agent: every
(backend, frontend) pair retired from a UDP backend's revnat entry is handed out once by
:meth:`ServiceProgrammer.take_departed`, and the agent deletes those flows' entries after the
pass that retired it has been written (so the client's next datagram is a new flow that meets the
service as it is now). A terminating backend is not retired: its flows keep going.
"""

from __future__ import annotations

import copy
import ipaddress
import socket
import struct
import threading
from array import array
from dataclasses import dataclass, field

from lace.datapath import registry
from lace.datapath.common import Family
from lace.datapath.maglev import table_bytes as maglev_table
from lace.datapath.services import (BACKEND, REVNAT, REVNAT_FRONTENDS, REVNAT_KEY, SERVICE, SERVICE_KEY,
                                    MAGLEV_SIZE, BackendFlag, backend_key, backend_value, revnat_key,
                                    revnat_value, service_key, service_value)
from lace.store.records import same_objects

from .model import Backend, Frontend

Entries = dict[bytes, bytes]
#: a frontend in a revnat entry: (source network, address, port)
Ref = tuple[int, str, int]

def table_key(table: int) -> bytes:
    """Key of a whole Maglev table in the programmer's ``maglev`` entries."""
    return struct.pack("<I", table)


@dataclass
class _Built:
    """What one frontend contributes: its services entries, its backends', and its Maglev table
    (``members``: the active backends' identities when it needs one; ``table``: 0 when none was
    free)."""

    identities: tuple[str, ...]
    services: Entries = field(default_factory=dict)
    #: revnat key of each backend -> the frontend refs this frontend puts there
    revnat: dict[bytes, tuple[Ref, ...]] = field(default_factory=dict)
    #: revnat key of each backend -> its backends map key
    backend_keys: dict[bytes, bytes] = field(default_factory=dict)
    backends: Entries = field(default_factory=dict)
    members: tuple[str, ...] | None = None
    table: int = 0


@dataclass
class ServicePressure:
    """What did not fit: frontends left out of a full services map, frontends without a Maglev
    table (they spread new flows by hash over their slots instead, which a backend change
    reshuffles)."""

    frontends: int = 0
    programmed: int = 0
    entries_desired: int = 0
    capacity: int = 0
    tables_capacity: int = 0
    tables_used: int = 0
    without_table: int = 0
    #: frontends a backend's revnat entry does not name (their flows keep a backend entry)
    revnat_left_out: int = 0
    #: backends flagged REPLY_ENTRY: more frontends than a revnat entry names, or no room in the map
    reply_entry_backends: int = 0
    left_out: list[str] = field(default_factory=list)
    #: the frontends left out (for the datapath's map-full routes)
    left_out_frontends: list[Frontend] = field(default_factory=list)

    @property
    def reason(self) -> str | None:
        if self.programmed < self.frontends:
            return "services map full"
        if self.without_table:
            return "maglev map full"
        return None

    def as_dict(self) -> dict:
        return {"frontends": self.frontends, "programmed": self.programmed,
                "entriesDesired": self.entries_desired, "capacity": self.capacity,
                "maglevTables": self.tables_used, "maglevCapacity": self.tables_capacity,
                "withoutTable": self.without_table, "revnatLeftOut": self.revnat_left_out,
                "replyEntryBackends": self.reply_entry_backends,
                "leftOut": self.left_out[:20], "reason": self.reason}


class ServiceProgrammer:
    """What one node's service maps should hold; see the module docstring.

    The programmer keeps the maps' desired contents as running totals (``_out``), counting how
    many programmed frontends use each backend entry, backend ID and Maglev table. A pass, full
    (:meth:`entries`) or incremental (:meth:`update`), adds the frontends that are new and removes
    the ones that are gone; an unchanged frontend — the same object the service cache handed out
    before — costs one dictionary lookup, so a pass costs what changed, not what exists.
    """

    def __init__(self, *, capacity: int | None = None, maglev_entries: int | None = None,
                 revnat_entries: int | None = None) -> None:
        self.capacity = registry.get("services").max_entries if capacity is None else capacity
        self.revnat_capacity = registry.get("revnat").max_entries if revnat_entries is None else revnat_entries
        entries = registry.get("maglev").max_entries if maglev_entries is None else maglev_entries
        self.tables_capacity = max(entries // MAGLEV_SIZE - 1, 0)   # table 0 is never used
        self.pressure: ServicePressure | None = None
        self._ids: dict[str, int] = {}
        self._next_id = 1
        self._tables: dict[tuple[str, ...], int] = {}
        self._free_tables: list[int] = []
        self._next_table = 1
        #: table number -> its content, for the tables in use
        self._blobs: dict[int, bytes] = {}
        #: the programmed frontends and what each built
        self._memo: dict[Frontend, _Built] = {}
        #: service (namespace/name) -> its programmed frontends, for incremental passes
        self._groups: dict[str, tuple[Frontend, ...]] = {}
        #: the maps' desired contents: services, backends, maglev (whole tables)
        self._out: tuple[Entries, Entries, Entries] = ({}, {}, {})
        #: services key -> the frontends that write it, the one whose value is in the map last (a
        #: changed frontend's new version writes the same keys before the old version is removed;
        #: two services may claim one VIP and port in a network)
        self._owners: dict[bytes, list[Frontend]] = {}
        #: how many programmed frontends use each backend identity, backend entry value, table
        self._id_users: dict[str, int] = {}
        self._backend_users: dict[bytes, dict[bytes, int]] = {}
        self._table_users: dict[tuple[str, ...], int] = {}
        #: programmed frontends that want a Maglev table and got none (none was free)
        self._without_table = 0
        #: the revnat map's desired contents; per key, how many programmed frontends put each ref
        #: there, and the refs retired (no frontend puts them there, conntrack may still need them)
        self._revnat: Entries = {}
        self._revnat_users: dict[bytes, dict[Ref, int]] = {}
        self._revnat_retired: dict[bytes, set[Ref]] = {}
        self._revnat_left_out: dict[bytes, int] = {}
        #: per key, the frontends its entry holds, in their slots (never changed in place)
        self._revnat_refs: dict[bytes, list[Ref]] = {}
        #: revnat key -> backends map key of every programmed backend; the revnat keys whose backend
        #: is flagged REPLY_ENTRY (more frontends than an entry names, or no room in the map)
        self._revnat_backend: dict[bytes, bytes] = {}
        self._reply_entry: set[bytes] = set()
        #: retired (UDP backend key, frontend) pairs whose flows take_departed handed out already
        self._departed_taken: set[tuple[bytes, Ref]] = set()
        self._lock = threading.Lock()

    def scratch(self) -> ServiceProgrammer:
        """A copy to compute desired entries with (an audit) without touching this one's IDs,
        tables or memo: its containers copied (the entries they hold are never changed in place),
        a lock of its own."""
        with self._lock:
            c = copy.copy(self)
            for attr, value in vars(self).items():
                if isinstance(value, (dict, list, set)):
                    setattr(c, attr, copy.copy(value))
            c._out = tuple(dict(x) for x in self._out)
            c.pressure = copy.copy(self.pressure)   # a pass updates its counts in place
            c._backend_users = {k: dict(v) for k, v in self._backend_users.items()}
            c._revnat_users = {k: dict(v) for k, v in self._revnat_users.items()}
            c._revnat_retired = {k: set(v) for k, v in self._revnat_retired.items()}
            c._owners = {k: list(v) for k, v in self._owners.items()}
        c._lock = threading.Lock()
        return c

    # -- stable IDs ---------------------------------------------------------------------------

    def _backend_id(self, b: Backend) -> int:
        bid = self._ids.get(b.identity)
        if bid is None:
            bid = self._next_id
            self._next_id += 1
            if self._next_id > 0xFFFFFFFF:
                self._next_id = 1
            self._ids[b.identity] = bid
        return bid

    def _table_number(self, members: tuple[str, ...]) -> int | None:
        t = self._tables.get(members)
        if t is not None:
            return t
        if self._free_tables:
            t = self._free_tables.pop()
        elif self._next_table <= self.tables_capacity:
            t = self._next_table
            self._next_table += 1
        else:
            return None
        self._tables[members] = t
        return t

    def adopt(self, services: Entries, backends: Entries, tables: Entries | None = None,
              revnat: Entries | None = None) -> None:
        """Take over the IDs and tables found in the pinned maps (after an agent restart), so the
        first reconcile rewrites nothing that is still right. A table's content (``tables``, whole
        tables as the agent writes them) is kept when it names exactly the frontend's active
        backends, so a restart computes no Maglev table again. The frontends in ``revnat`` entries
        are kept as retired ones: a frontend gone while no agent ran may still have flows."""
        with self._lock:
            for k, v in (revnat or {}).items():
                family = REVNAT_KEY.unpack(k)["family"]
                val = REVNAT.unpack(v)
                ordered = [_ref(r, family) for r in val["frontends"][:min(val["count"], REVNAT_FRONTENDS)]]
                if ordered:
                    self._revnat_retired.setdefault(k, set()).update(ordered)
                    self._revnat_refs[k] = ordered
                    self._revnat_set(k)
            identity: dict[int, str] = {}
            for k, v in backends.items():
                bid = struct.unpack_from("<I", k)[0]
                b = BACKEND.unpack(v)
                addr = ipaddress.ip_address(b["addr"][:4] if b["family"] == Family.IPV4 else b["addr"])
                ident = Backend(b["network"], addr, b["port"], b["proto"]).identity
                identity[bid] = ident
                self._ids[ident] = bid
                self._next_id = max(self._next_id, bid + 1)
            slots: dict[bytes, dict[int, int]] = {}
            fronts: dict[bytes, dict] = {}
            for k, v in services.items():
                key = SERVICE_KEY.unpack(k)
                base = SERVICE_KEY.pack(**{**key, "slot": 0})
                val = SERVICE.unpack(v)
                if key["slot"] == 0:
                    fronts[base] = val
                else:
                    slots.setdefault(base, {})[key["slot"]] = val["backend_id"]
            for base, val in fronts.items():
                if not val["maglev"]:
                    continue
                mine = slots.get(base, {})
                active = [mine.get(i, 0) for i in range(1, val["active_count"] + 1)]
                members = tuple(sorted(identity.get(bid, "") for bid in active))
                if "" in members:
                    continue
                t = self._tables.setdefault(members, val["maglev"])
                self._next_table = max(self._next_table, t + 1)
                blob = (tables or {}).get(table_key(t))
                if blob is not None and t not in self._blobs and set(array("I", blob)) == set(active):
                    self._blobs[t] = blob

    # -- one frontend -------------------------------------------------------------------------

    def _build(self, f: Frontend) -> _Built:
        """One frontend's entries, its backends' and its Maglev table (number and content)."""
        ids = [self._backend_id(b) for b in (*f.active, *f.terminating)]
        built = _Built(identities=tuple(b.identity for b in (*f.active, *f.terminating)))
        for b, bid in zip(f.active, ids):
            built.backends[backend_key(bid)] = backend_value(b.addr, b.port, b.proto, b.network, BackendFlag.ACTIVE)
        for b, bid in zip(f.terminating, ids[len(f.active):]):
            built.backends[backend_key(bid)] = backend_value(b.addr, b.port, b.proto, b.network,
                                                             BackendFlag.TERMINATING)
        if len(f.active) >= 2:
            built.members = tuple(sorted(b.identity for b in f.active))
            t = self._table_number(built.members)
            if t is not None:
                built.table = t
                if t not in self._blobs:
                    pair = tuple(sorted((b.identity, bid) for b, bid in zip(f.active, ids)))
                    self._blobs[t] = maglev_table(list(pair), MAGLEV_SIZE)
        refs = tuple((net, str(f.addr), f.port) for net in f.networks)
        for b, bid in zip((*f.active, *f.terminating), ids):
            rk = revnat_key(b.network, b.addr, b.port, b.proto)
            built.revnat[rk] = refs
            built.backend_keys[rk] = backend_key(bid)
        for net in f.networks:
            built.services[service_key(net, f.addr, f.port, f.proto, 0)] = service_value(
                service_id=f.service_id, backend_count=len(ids), active_count=len(f.active), flags=f.flags,
                affinity_timeout=f.affinity_timeout, maglev=built.table)
            for slot, bid in enumerate(ids, start=1):
                built.services[service_key(net, f.addr, f.port, f.proto, slot)] = service_value(
                    service_id=f.service_id, backend_id=bid)
        return built

    @staticmethod
    def _need(f: Frontend) -> int:
        """The services entries a frontend takes: a head and a slot per backend, per network."""
        return (1 + len(f.active) + len(f.terminating)) * len(f.networks)

    def _add(self, f: Frontend, built: _Built) -> None:
        """Count a built frontend into the running totals."""
        services, backends, tables = self._out
        services.update(built.services)
        for k in built.services:
            self._owners.setdefault(k, []).append(f)
        self._revnat_backend.update(built.backend_keys)
        revnat_of = {bk: rk for rk, bk in built.backend_keys.items()}
        for k, v in built.backends.items():
            users = self._backend_users.setdefault(k, {})
            users[v] = users.get(v, 0) + 1
            backends[k] = self._backend_entry(k, revnat_of.get(k))
        for k, refs in built.revnat.items():
            users = self._revnat_users.setdefault(k, {})
            for ref in refs:
                users[ref] = users.get(ref, 0) + 1
            retired = self._revnat_retired.get(k)
            if retired:
                back = retired.intersection(refs)
                retired.difference_update(back)
                # back in use: its next retirement is news again (take_departed)
                self._departed_taken.difference_update((k, r) for r in back)
            self._revnat_set(k)
        for ident in built.identities:
            self._id_users[ident] = self._id_users.get(ident, 0) + 1
        if built.members and built.table:
            self._table_users[built.members] = self._table_users.get(built.members, 0) + 1
            tables[table_key(built.table)] = self._blobs[built.table]
        elif built.members:
            self._without_table += 1
        self._memo[f] = built

    def _remove(self, f: Frontend) -> None:
        """Take a programmed frontend out of the running totals; what nothing uses any more goes:
        its entries, its backend IDs (never handed out again), its table (back to the pool)."""
        built = self._memo.pop(f)
        services, backends, tables = self._out
        for k in built.services:
            owners = self._owners.get(k, [])
            last = bool(owners) and owners[-1] == f
            if f in owners:
                owners.remove(f)
            if not owners:
                self._owners.pop(k, None)
                services.pop(k, None)
            elif last:   # the entry was this frontend's: the one still claiming the key takes it over
                services[k] = self._memo[owners[-1]].services[k]
        for k, v in built.backends.items():
            users = self._backend_users[k]
            users[v] -= 1
            if not users[v]:
                del users[v]
            if users:
                backends[k] = self._backend_entry(k, next((r for r, b in built.backend_keys.items() if b == k), None))
            else:
                del self._backend_users[k]
                backends.pop(k, None)
        for k, refs in built.revnat.items():
            users = self._revnat_users[k]
            for ref in refs:
                users[ref] -= 1
                if not users[ref]:   # retired: conntrack may still hold flows through it
                    del users[ref]
                    self._revnat_retired.setdefault(k, set()).add(ref)
            if not users:
                del self._revnat_users[k]
                if built.backend_keys.get(k) not in backends:
                    self._revnat_backend.pop(k, None)
            self._revnat_set(k)
        for ident in built.identities:
            self._id_users[ident] -= 1
            if not self._id_users[ident]:
                del self._id_users[ident]
                self._ids.pop(ident, None)
        if built.members and built.table:
            self._table_users[built.members] -= 1
            if not self._table_users[built.members]:
                del self._table_users[built.members]
                t = self._tables.pop(built.members)
                self._blobs.pop(t, None)
                self._free_tables.append(t)
                tables.pop(table_key(t), None)
        elif built.members:
            self._without_table -= 1

    def _revnat_set(self, k: bytes) -> None:
        """Recompute the revnat entry of backend key k, at most REVNAT_FRONTENDS frontends: those it
        holds already keep their slots (programmed or retired: their flows' replies depend on
        them), then the others, programmed before retired, each in a stable order. A frontend
        that finds the entry full is left out (and counted) rather than pushing out one whose
        established flows would lose their replies."""
        users, retired = self._revnat_users.get(k, {}), self._revnat_retired.get(k, set())
        wanted = users.keys() | retired
        if not wanted:
            self._revnat.pop(k, None)
            self._revnat_retired.pop(k, None)
            self._revnat_left_out.pop(k, None)
            self._revnat_refs.pop(k, None)
            self._set_reply_entry(k, False)
            return
        kept = [r for r in self._revnat_refs.get(k, ()) if r in wanted]
        held = set(kept)
        refs = kept + [r for r in sorted(users) + sorted(retired - users.keys()) if r not in held]
        room = k in self._revnat or len(self._revnat) < self.revnat_capacity
        over = len(refs) - REVNAT_FRONTENDS if room else len(refs)
        if over > 0:
            self._revnat_left_out[k] = over
        else:
            self._revnat_left_out.pop(k, None)
        self._set_reply_entry(k, over > 0)
        if not room:
            return
        self._revnat_refs[k] = refs[:REVNAT_FRONTENDS]
        self._revnat[k] = revnat_value(self._revnat_refs[k])

    def _set_reply_entry(self, k: bytes, on: bool) -> None:
        """Flag (or no longer) the backend of revnat key k REPLY_ENTRY in the backends entries."""
        if on == (k in self._reply_entry):
            return
        if on:
            self._reply_entry.add(k)
        else:
            self._reply_entry.discard(k)
        bk = self._revnat_backend.get(k)
        if bk is not None and bk in self._out[1] and self._backend_users.get(bk):
            self._out[1][bk] = self._backend_entry(bk, k)

    def _backend_entry(self, bk: bytes, rk: bytes | None) -> bytes:
        """The backends entry bk as its frontends agree on it (_shared_value), flagged REPLY_ENTRY
        when its revnat key rk is one of _reply_entry."""
        value = _shared_value(self._backend_users[bk])
        return _flagged(value) if rk in self._reply_entry else value

    def revnat_entries(self) -> Entries:
        """The revnat map's desired entries (after a pass)."""
        with self._lock:
            return dict(self._revnat)

    @property
    def revnat_retired(self) -> bool:
        """Whether some retired frontend waits for its flows to end (only then is conntrack read)."""
        with self._lock:
            return bool(self._revnat_retired)

    def take_departed(self) -> list[tuple[bytes, Ref]]:
        """The (UDP backend's revnat key, frontend) pairs retired since the last call: flows through
        that frontend to that backend are to be deleted (see the module docstring). A pair that
        comes back and is retired again is handed out again."""
        with self._lock:
            retired = {(k, r) for k, refs in self._revnat_retired.items()
                       if REVNAT_KEY.unpack(k)["proto"] == socket.IPPROTO_UDP for r in refs}
            new = sorted(retired - self._departed_taken)
            self._departed_taken = retired
            return new

    def release_revnat(self, in_use: set[tuple[bytes, Ref]]) -> tuple[Entries, list[bytes]]:
        """Drop the retired frontends that no live conntrack entry names any more: ``in_use`` holds
        (revnat key, frontend) of every live service flow (:func:`revnat_in_use`). Returns the
        revnat map's (updates, deletes)."""
        with self._lock:
            updates: Entries = {}
            deletes: list[bytes] = []
            for k in list(self._revnat_retired):
                retired = self._revnat_retired[k]
                gone = {r for r in retired if (k, r) not in in_use}
                if not gone:
                    continue
                retired -= gone
                if not retired:
                    del self._revnat_retired[k]
                self._revnat_set(k)
                if k in self._revnat:
                    updates[k] = self._revnat[k]
                else:
                    deletes.append(k)
            if self.pressure is not None:
                self.pressure.revnat_left_out = sum(self._revnat_left_out.values())
                self.pressure.reply_entry_backends = len(self._reply_entry)
            return updates, deletes

    def _give_table(self, f: Frontend) -> None:
        """A programmed frontend that got no Maglev table takes one if one is free now: the same
        entries, its frontend naming the table; its backend IDs stay (they are still held)."""
        new = self._build(f)
        if not new.table:
            return
        self._memo[f] = new
        self._out[0].update(new.services)
        self._table_users[new.members] = self._table_users.get(new.members, 0) + 1
        self._out[2][table_key(new.table)] = self._blobs[new.table]
        self._without_table -= 1

    def _replace(self, adds: list[Frontend], removes: list[Frontend]) -> None:
        """Add first, remove afterwards: a changed backend set gets a new table number while the
        old one is still in use, so a packet never reads a table being rewritten."""
        for f in adds:
            self._add(f, self._build(f))
        for f in removes:
            self._remove(f)

    # -- passes -------------------------------------------------------------------------------

    def entries(self, fronts: list[Frontend]) -> tuple[Entries, Entries, Entries]:
        """(services, backends, maglev tables) for exactly these frontends: a full pass."""
        with self._lock:
            self._full(fronts)
            return tuple(dict(x) for x in self._out)   # type: ignore[return-value]

    def _full(self, fronts: list[Frontend]) -> None:
        if self.pressure is not None and not self.pressure.reason:
            # everything fit last time: a service whose frontends are the very objects programmed
            # last time (the service cache's) is unchanged; the others go through _update, unless
            # they would overflow a map, and then the stable order below decides
            groups: dict[str, list[Frontend]] = {}
            for f in fronts:
                groups.setdefault(f.service, []).append(f)
            # the service cache hands out the very same Frontends until a service changes
            changed = {k: v for k, v in groups.items() if not same_objects(self._groups.get(k), v)}
            changed.update((k, []) for k in self._groups if k not in groups)
            if self._update(changed) is not None:
                return
        pr = ServicePressure(frontends=len(fronts), capacity=self.capacity,
                             tables_capacity=self.tables_capacity)
        pr.entries_desired = sum(self._need(f) for f in fronts)
        kept = fronts
        if pr.entries_desired > self.capacity:
            # a stable order: when the map is full, the same frontends stay in
            kept, room = [], self.capacity
            for f in sorted(fronts, key=lambda f: (f.service_id, f.addr.version, str(f.addr), f.port, f.proto)):
                need = self._need(f)
                if need > room:
                    pr.left_out.append(f"{f.service}:{f.port}")
                    pr.left_out_frontends.append(f)
                    continue
                room -= need
                kept.append(f)
        wanted = set(kept)
        memo = self._memo
        # a frontend left without a table when none was free tries again: one may be free now
        retry = [f for f, b in memo.items() if b.members and not b.table and f in wanted]
        self._replace([f for f in kept if f not in memo], [f for f in memo if f not in wanted])
        # IDs and tables adopted from the maps that no frontend claimed
        for ident in [i for i in self._ids if i not in self._id_users]:
            del self._ids[ident]
        for members in [m for m in self._tables if m not in self._table_users]:
            t = self._tables.pop(members)
            self._blobs.pop(t, None)
            self._free_tables.append(t)
        for f in retry:   # now that this pass freed what it frees
            self._give_table(f)
        groups: dict[str, list[Frontend]] = {}
        for f in kept:
            groups.setdefault(f.service, []).append(f)
        self._groups = {k: tuple(v) for k, v in groups.items()}
        pr.programmed = len(kept)
        self._count_tables(pr)
        self.pressure = pr

    def _count_tables(self, pr: ServicePressure) -> None:
        pr.tables_used = len(self._table_users)
        pr.without_table = self._without_table
        pr.revnat_left_out = sum(self._revnat_left_out.values())
        pr.reply_entry_backends = len(self._reply_entry)

    def update(self, changed: dict[str, list[Frontend]]) -> dict[str, tuple[Entries, list[bytes]]] | None:
        """An incremental pass: these services (namespace/name) now have these frontends (none:
        gone). Returns each service map's (updates, deletes), or None when only a full pass can
        decide — a map is full, or would be — and then nothing was changed."""
        with self._lock:
            return self._update(changed)

    def _update(self, changed: dict[str, list[Frontend]]) -> dict[str, tuple[Entries, list[bytes]]] | None:
        pr = self.pressure
        if pr is None or pr.reason:
            return None
        old = {k: self._groups.get(k, ()) for k in changed}
        grow = sum(self._need(f) for fs in changed.values() for f in fs) - \
            sum(self._need(f) for fs in old.values() for f in fs)
        if len(self._out[0]) + grow > self.capacity:
            return None
        wanted = {tuple(sorted(b.identity for b in f.active)) for fs in changed.values() for f in fs
                  if len(f.active) >= 2}
        free = len(self._free_tables) + max(self.tables_capacity - self._next_table + 1, 0)
        if len(wanted - self._tables.keys()) > free:
            return None   # no table for some: the full pass decides which frontends go without
        adds, removes = [], []
        for key, fronts in changed.items():
            now, was = set(fronts), set(old[key])
            adds += [f for f in fronts if f not in was]
            removes += [f for f in old[key] if f not in now]
        built = [(f, self._build(f)) for f in adds]
        # what every key this pass touches held before it: the changes are the difference
        before: tuple[dict[bytes, bytes | None], ...] = ({}, {}, {}, {})
        current_maps = (*self._out, self._revnat)
        for b in (*(b for _, b in built), *(self._memo[f] for f in removes)):
            keys = (b.services, b.backends, (table_key(b.table),) if b.members and b.table else (), b.revnat)
            for ks, was_map, current in zip(keys, before, current_maps):
                for k in ks:
                    if k not in was_map:
                        was_map[k] = current.get(k)
        for f, b in built:   # add first, remove afterwards (see _replace)
            self._add(f, b)
        for f in removes:
            self._remove(f)
        for key, fronts in changed.items():
            if fronts:
                self._groups[key] = tuple(fronts)
            else:
                self._groups.pop(key, None)
        pr.frontends += len(adds) - len(removes)
        pr.programmed += len(adds) - len(removes)
        pr.entries_desired += grow
        self._count_tables(pr)
        out: dict[str, tuple[Entries, list[bytes]]] = {}
        for name, entries, was_map in zip(("services", "backends", "maglev", "revnat"), current_maps, before):
            updates = {k: entries[k] for k in was_map if k in entries and entries[k] != was_map[k]}
            deletes = [k for k, v in was_map.items() if v is not None and k not in entries]
            out[name] = (updates, deletes)
        return out


def _ref(rec: dict, family: int) -> Ref:
    """A revnat frontend record as a Ref."""
    raw = rec["addr"][:4] if family == Family.IPV4 else rec["addr"]
    return (rec["network"], str(ipaddress.ip_address(raw)), rec["port"])


def _flagged(value: bytes) -> bytes:
    """A backends entry with REPLY_ENTRY set."""
    b = BACKEND.unpack(value)
    b["flags"] |= BackendFlag.REPLY_ENTRY
    return BACKEND.pack(**b)


def _shared_value(users: dict[bytes, int]) -> bytes:
    """The one value of a backend entry several frontends use: they agree, except when one has the
    backend active and another terminating (two services, two views of one pod): active wins, so
    the backend keeps taking new flows for the service that still wants it."""
    if len(users) == 1:
        return next(iter(users))
    return max(users, key=lambda v: bool(BACKEND.unpack(v)["flags"] & BackendFlag.ACTIVE))
