"""The service programmer: one node's ``services``, ``backends`` and ``maglev`` entries from its
frontends.

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
"""

from __future__ import annotations

import copy
import ipaddress
import struct
import threading
from array import array
from dataclasses import dataclass, field

from lace.datapath import registry
from lace.datapath.common import Family
from lace.datapath.maglev import table as maglev_table
from lace.datapath.services import (BACKEND, SERVICE, SERVICE_KEY, MAGLEV_SIZE, BackendFlag, backend_key,
                                    backend_value, service_key, service_value)

from .model import Backend, Frontend

Entries = dict[bytes, bytes]

def table_key(table: int) -> bytes:
    """Key of a whole Maglev table in the programmer's ``maglev`` entries."""
    return struct.pack("<I", table)


def pack_table(backend_ids: list[int]) -> bytes:
    arr = array("I", backend_ids)
    if arr.itemsize != 4:   # pragma: no cover - every platform lace runs on has a 4-byte unsigned int
        arr = array("L", backend_ids)
    return arr.tobytes()


@dataclass
class _Built:
    """What one frontend contributes: its services entries, its backends', and its Maglev table
    (``members``: the active backends' identities when it needs one; ``table``: 0 when none was
    free)."""

    identities: tuple[str, ...]
    services: Entries = field(default_factory=dict)
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
                "withoutTable": self.without_table, "leftOut": self.left_out[:20], "reason": self.reason}


class ServiceProgrammer:
    """What one node's service maps should hold; see the module docstring."""

    def __init__(self, *, capacity: int | None = None, backends_capacity: int | None = None,
                 maglev_entries: int | None = None) -> None:
        self.capacity = registry.get("services").max_entries if capacity is None else capacity
        self.backends_capacity = (registry.get("backends").max_entries if backends_capacity is None
                                  else backends_capacity)
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
        #: the last pass's frontends and what they built: an unchanged frontend costs a lookup
        self._memo: dict[Frontend, _Built] = {}
        self._lock = threading.Lock()

    # -- stable IDs ---------------------------------------------------------------------------


    def scratch(self) -> ServiceProgrammer:
        """A copy to compute desired entries with (an audit) without touching this one's IDs,
        tables or memo: its containers copied (the entries they hold are never changed in place),
        a lock of its own."""
        with self._lock:
            c = copy.copy(self)
            for attr, value in vars(self).items():
                if isinstance(value, (dict, list, set)):
                    setattr(c, attr, copy.copy(value))
        c._lock = threading.Lock()
        return c
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

    def adopt(self, services: Entries, backends: Entries, tables: Entries | None = None) -> None:
        """Take over the IDs and tables found in the pinned maps (after an agent restart), so the
        first reconcile rewrites nothing that is still right. A table's content (``tables``, whole
        tables as the agent writes them) is kept when it names exactly the frontend's active
        backends, so a restart computes no Maglev table again."""
        with self._lock:
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

    # -- entries ------------------------------------------------------------------------------

    def entries(self, fronts: list[Frontend]) -> tuple[Entries, Entries, Entries]:
        """(services, backends, maglev tables) for these frontends."""
        with self._lock:
            return self._entries(fronts)

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
                    self._blobs[t] = pack_table(maglev_table(list(pair), MAGLEV_SIZE))
        for net in f.networks:
            built.services[service_key(net, f.addr, f.port, f.proto, 0)] = service_value(
                service_id=f.service_id, backend_count=len(ids), active_count=len(f.active), flags=f.flags,
                affinity_timeout=f.affinity_timeout, maglev=built.table)
            for slot, bid in enumerate(ids, start=1):
                built.services[service_key(net, f.addr, f.port, f.proto, slot)] = service_value(
                    service_id=f.service_id, backend_id=bid)
        return built

    def _entries(self, fronts: list[Frontend]) -> tuple[Entries, Entries, Entries]:
        services: Entries = {}
        backends: Entries = {}
        tables: Entries = {}
        pr = ServicePressure(frontends=len(fronts), capacity=self.capacity,
                             tables_capacity=self.tables_capacity)
        memo: dict[Frontend, _Built] = {}
        used_ids: set[str] = set()
        used_tables: set[tuple[str, ...]] = set()
        # a stable order: when the map is full, the same frontends stay in
        for f in sorted(fronts, key=lambda f: (f.service_id, f.addr.version, str(f.addr), f.port, f.proto)):
            need = (1 + len(f.active) + len(f.terminating)) * len(f.networks)
            pr.entries_desired += need
            if len(services) + need > self.capacity:
                pr.left_out.append(f"{f.service}:{f.port}")
                pr.left_out_frontends.append(f)
                continue
            pr.programmed += 1
            built = self._memo.get(f)
            if built is None or (built.members and not built.table):   # a table may be free now
                built = self._build(f)
            memo[f] = built
            services.update(built.services)
            backends.update(built.backends)
            used_ids.update(built.identities)
            if built.members:
                if built.table:
                    used_tables.add(built.members)
                    tables[table_key(built.table)] = self._blobs[built.table]
                else:
                    pr.without_table += 1
        # forget what nothing uses any more: tables go back to the pool, IDs are never reused
        for members in [m for m in self._tables if m not in used_tables]:
            t = self._tables.pop(members)
            self._blobs.pop(t, None)
            self._free_tables.append(t)
        for ident in [i for i in self._ids if i not in used_ids]:
            del self._ids[ident]
        self._memo = memo
        pr.tables_used = len(used_tables)
        self.pressure = pr
        return services, backends, tables
