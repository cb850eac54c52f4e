"""The node's datapath as the agent holds it: the BPF objects loaded against the node's pin root
(pinned maps reused or migrated, never flushed), the uplink, host device and pod programs attached
through pinned tcx links, and the one writer of the maps the agent owns.

An agent that restarts finds the maps and links pinned: it loads the objects again (reusing every
pinned map), and swaps the new program instances into the existing links atomically, so traffic
never stops and no entry is lost.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from lace.bpf import BPFError, Link, Map, MapEntryCounts, Migration, NotSupported, Program, attach_tcx
from lace.datapath.node import LoadedDatapath, load_objects
from lace.datapath.registry import MAP_ENTRIES_OBJECT, MAP_ENTRIES_PROGRAM, bpf_dir
from lace.datapath.policy import EXACT_MAP, TRIE_MAP, is_marker, policy_maps
from lace.datapath.services import MAGLEV_SIZE

from .desired import Entries
from .diff import MapChanges

log = logging.getLogger("lace.agent.datapath")

LINKS_DIR = "links"
UPLINK_LINK = "uplink"
HOST_LINK = "host"
POD_PROGRAM = "lace_from_pod"
UPLINK_PROGRAM = "lace_from_uplink"
HOST_PROGRAM = "lace_from_host"
#: maps the agent writes a whole table at a time (entries per table): an entry of the desired
#: state is one table (key: table number as u32, value: its entries back to back). They are
#: mappable u32 arrays (BPF_F_MMAPABLE): tables are read and written through the mapping, a
#: memory copy each, where a batch syscall would copy a key and a value per entry
TABLES = {"maglev": MAGLEV_SIZE}
#: an array map's elements are 8-byte aligned in its memory: a u32 value is the low half of 8 bytes
ARRAY_ALIGN = 8


def seed_policy_exact(loaded: LoadedDatapath) -> int:
    """Fill an empty ``policy-exact`` from the ``policy`` trie when the trie holds selection markers,
    as an earlier version, which kept every policy entry in the trie, left it. This version's
    programs look markers up in the hash: attached before the first reconcile writes it, they would
    find none and allow every new flow. Called after loading, before any program attaches. The trie
    keeps its entries (a check that reaches it still finds the longest prefix) until the reconcile
    deletes what it no longer holds. Returns the number of entries written."""
    exact, trie = loaded.map(EXACT_MAP), loaded.map(TRIE_MAP)
    if next(exact.keys(), None) is not None:
        return 0
    old = dict(trie.entries())
    if not any(is_marker(k) for k in old):
        return 0
    try:
        want = policy_maps(old)[EXACT_MAP]
    except ValueError as e:   # not what an agent writes: leave it to the first reconcile
        log.warning("policy-exact not seeded from the policy trie: %s", e)
        return 0
    for k, v in want.items():
        exact.update(k, v)
    return len(want)


def pod_link_name(host_ifname: str) -> str:
    return f"pod-{host_ifname}"


class TcxMissing(Exception):
    """The kernel cannot attach tcx links; the agent cannot start (lace needs Linux 6.6 or later)."""


class NodeDatapath:
    """Loaded objects (a :class:`~lace.datapath.node.LoadedDatapath`), their maps by CLI name, and
    the attach points; see the module docstring."""

    def __init__(self, pin_root: str, *, max_entries: dict[str, int] | None = None) -> None:
        self.pin_root = pin_root
        self.links_dir = os.path.join(pin_root, LINKS_DIR)
        self.max_entries = dict(max_entries or {})
        self.loaded: LoadedDatapath | None = None
        #: serialises the one writer and the readers that refresh the shadow from the kernel
        self._lock = threading.Lock()
        #: what the agent last wrote to each owned map: the agent is their only writer, so a
        #: reconcile diffs against this instead of reading an LPM trie back entry by entry; the
        #: periodic resync reads the kernel again and repairs anything changed behind its back
        self._shadow: dict[str, Entries] = {}
        #: table maps' memory (lace.agent.datapath.TABLES), mapped while a read or a write uses
        #: it: the Maglev array is 16 MiB of the kernel's pages, which a mapping kept between
        #: passes would count in the agent's RSS for nothing
        self._mapped: dict[str, mmap.mmap] = {}
        self._values: dict[str, np.ndarray] = {}
        #: the map iterator that reads the kernel's entry counts (entry_counts), loaded on first
        #: use; False once it could not be (counts then walk the maps)
        self._counts: MapEntryCounts | bool | None = None
        self._counts_lock = threading.Lock()

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        loaded = load_objects(self.pin_root, self.max_entries)
        os.makedirs(self.links_dir, exist_ok=True)
        for m in loaded.migrations:
            log.warning("map %s migrated (%s): %d entries copied, %d dropped",
                        m.map, m.reason, m.copied, m.dropped)
        seeded = seed_policy_exact(loaded)
        if seeded:
            log.warning("policy-exact seeded with %d entries from the policy trie a previous version "
                        "wrote; the next reconcile removes what the trie no longer needs", seeded)
        with self._lock:
            old, self.loaded = self.loaded, loaded
            self._unmap()
        if old is not None:
            old.close()

    @property
    def migrations(self) -> list[Migration]:
        """The pinned maps the load migrated (none before :meth:`load`)."""
        return list(self.loaded.migrations) if self.loaded is not None else []

    def _unmap(self) -> None:
        self._values.clear()
        for name, mm in list(self._mapped.items()):
            try:
                mm.close()
            except BufferError:   # a view still lives (an exception's frame): unmapped next time
                continue
            del self._mapped[name]

    def _memory(self, cli_name: str) -> np.ndarray:
        """A table map's u32 values, one per array element, in the map's own memory (shared with
        the kernel and every program that reads it): writing them writes the map."""
        values = self._values.get(cli_name)
        if values is None:
            m = self.map(cli_name)
            if m.value_size != 4:
                raise ValueError(f"{cli_name}: a table map holds u32 values, not {m.value_size}-byte ones")
            size = m.max_entries * ARRAY_ALIGN
            mm = mmap.mmap(m.fd, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE, mmap.MAP_SHARED,
                           mmap.PROT_READ | mmap.PROT_WRITE)
            self._mapped[cli_name] = mm
            values = np.frombuffer(mm, dtype=np.uint32, count=2 * m.max_entries)[::2]
            self._values[cli_name] = values
        return values

    def close(self) -> None:
        with self._lock:   # not under a write in progress (a table's mapping still in use)
            self._unmap()
            if self.loaded is not None:
                self.loaded.close()
                self.loaded = None
        with self._counts_lock:
            if isinstance(self._counts, MapEntryCounts):
                self._counts.close()
            self._counts = None

    def _objects(self, what: str) -> LoadedDatapath:
        if self.loaded is None:   # a KeyError, as for a map or program the objects lack
            raise KeyError(f"{what}: the datapath under {self.pin_root} is not loaded")
        return self.loaded

    def map(self, cli_name: str) -> Map:
        """Map ``cli_name`` of the loaded objects (owned by them: do not close it)."""
        return self._objects(cli_name).map(cli_name)

    def program(self, name: str) -> Program:
        return self._objects(name).program(name)

    def entry_counts(self, names: Iterable[str]) -> dict[str, int]:
        """Entries in each of these maps now, for the fill metrics and the status: the kernel's
        own count for a hash map, every one read at once through a map iterator
        (lace.bpf.iter: microseconds, where walking a full conntrack table takes ~0.5 s), and a
        walk for the other types — and for all of them where the iterator cannot load (logged
        once: a kernel before 6.6, no BTF)."""
        maps = {name: self.map(name) for name in names}
        with self._counts_lock:
            if self._counts is None:
                try:
                    self._counts = MapEntryCounts(str(bpf_dir() / MAP_ENTRIES_OBJECT), MAP_ENTRIES_PROGRAM)
                except (BPFError, OSError) as e:
                    log.warning("map entry counts walk each map: the map iterator did not load (%s)", e)
                    self._counts = False
            counts = self._counts
        if isinstance(counts, MapEntryCounts):
            return counts.entries(maps)
        return {name: m.count() for name, m in maps.items()}

    @property
    def counts_from_kernel(self) -> bool:
        """Whether entry_counts reads the kernel's counts (False before its first call, or when
        the map iterator could not load)."""
        return isinstance(self._counts, MapEntryCounts)

    # -- attach points -----------------------------------------------------------------------

    def _attach(self, prog, ifindex: int, link_name: str) -> None:
        path = os.path.join(self.links_dir, link_name)
        if os.path.exists(path):
            link = Link.open_pinned(path)
            try:
                info = link.info()
                if getattr(info, "ifindex", ifindex) == ifindex:
                    link.update(prog)   # adopt: swap in this agent's program, no gap
                    return
                # the pin belongs to an interface that was replaced: drop it, attach anew
                link.unpin()
                link.detach()
            finally:
                link.close()
        try:
            link = attach_tcx(prog, ifindex, "ingress", pin_path=path)
        except NotSupported as e:
            raise TcxMissing(
                f"this kernel has no tcx ({e}): lace attaches its programs through pinned tcx links, "
                "which Linux 6.6 and later provide; run the agent on a newer kernel") from None
        link.close()   # pinned: the link outlives this fd (and this process)

    def attach_uplink(self, ifindex: int) -> None:
        self._attach(self.program(UPLINK_PROGRAM), ifindex, UPLINK_LINK)

    def attach_host(self, ifindex: int) -> None:
        """The host device's datapath end (lace_net; lace.agent.hostdev)."""
        self._attach(self.program(HOST_PROGRAM), ifindex, HOST_LINK)

    def attach_pod(self, host_ifname: str, ifindex: int) -> None:
        self._attach(self.program(POD_PROGRAM), ifindex, pod_link_name(host_ifname))

    def detach_pod(self, host_ifname: str) -> None:
        path = os.path.join(self.links_dir, pod_link_name(host_ifname))
        if not os.path.exists(path):
            return
        link = Link.open_pinned(path)
        try:
            link.unpin()
            try:
                link.detach()
            except BPFError:
                pass   # the interface went away first: the kernel already detached it
        finally:
            link.close()

    def pod_links(self) -> list[str]:
        """Host interface names that have a pinned pod link."""
        try:
            names = os.listdir(self.links_dir)
        except FileNotFoundError:
            return []
        return [n[len("pod-"):] for n in names if n.startswith("pod-")]

    # -- the one writer ----------------------------------------------------------------------

    def read(self, cli_name: str, *, fresh: bool = True) -> Entries:
        """The map's entries: from the kernel, or (``fresh=False``) as this agent last left them.

        Takes the writer's lock, so a read never sees (nor caches) a write half done."""
        with self._lock:
            if not fresh and cli_name in self._shadow:
                return dict(self._shadow[cli_name])
            shadow = self._shadow.get(cli_name)
            if shadow is None:
                entries = self._read_kernel(cli_name)
                self._shadow[cli_name] = dict(entries)
                return entries
            # the record takes what the kernel holds but keeps its own objects where they are
            # equal (at 10k pods a resync that replaced them made ~100k objects anew every 30 s,
            # among the pass's other garbage, and the heap kept the holes they left); the kernel's
            # entries are walked lazily, each key and value alive only while it is compared
            n = 0
            for k, v in self._kernel_pairs(cli_name):
                n += 1
                if shadow.get(k) != v:
                    shadow[k] = v   # an equal key already there stays the dict's own
            if len(shadow) != n:    # the record holds entries the kernel no longer has
                kernel = {k for k, _ in self._kernel_pairs(cli_name)}
                for k in [k for k in shadow if k not in kernel]:
                    del shadow[k]
            return dict(shadow)

    def _kernel_pairs(self, cli_name: str) -> Iterator[tuple[bytes, bytes]]:
        """The map's (key, value)s from one read of the kernel: Map.entries' lazy pairs, or a
        table map's whole tables (few, read through the mapping)."""
        if cli_name in TABLES:
            return iter(self._read_kernel(cli_name).items())
        return self.map(cli_name).entries()

    def held(self, cli_name: str, keys: Iterable[bytes]) -> Entries:
        """These keys' entries as this agent last left them (the kernel's, read once, when it has
        no record of the map yet): an incremental pass's lookups, without copying the map."""
        with self._lock:
            if cli_name not in self._shadow:
                self._shadow[cli_name] = self._read_kernel(cli_name)
            shadow = self._shadow[cli_name]
            return {k: shadow[k] for k in keys if k in shadow}

    def read_kernel(self, cli_name: str) -> Entries:
        """The map's entries from the kernel, leaving what this agent last wrote as it is (an audit
        must not make the next pass trust the kernel)."""
        with self._lock:
            return self._read_kernel(cli_name)

    def _read_kernel(self, cli_name: str) -> Entries:
        size = TABLES.get(cli_name)
        if size is None:
            return self._objects(cli_name).entries(cli_name)
        try:
            return self._read_tables(cli_name, size)
        finally:
            self._unmap()

    def _read_tables(self, cli_name: str, size: int) -> Entries:
        # a table map: whole tables that hold anything (an all-zero table is no table; 0 is unused)
        count = self.map(cli_name).max_entries // size
        tables = self._memory(cli_name)[:count * size].reshape(count, size)
        return {struct.pack("<I", t): tables[t].tobytes() for t in np.flatnonzero(tables[1:].any(axis=1)) + 1}

    def apply(self, changes: dict[str, MapChanges], order: Sequence[str]) -> None:
        """Make before break: every map's updates in ``order`` (backends and Maglev tables before the
        frontends that point at them), then every map's deletes in reverse order."""
        with self._lock:
            try:
                for name in order:
                    ch = changes.get(name)
                    if ch and ch.updates:
                        self._guarded(name, self._update, ch.updates)
                for name in reversed(order):
                    ch = changes.get(name)
                    if ch and ch.deletes:
                        self._guarded(name, self._delete, ch.deletes)
            finally:
                self._unmap()

    def _guarded(self, cli_name: str, fn, arg) -> None:
        try:
            fn(cli_name, arg)
        except BaseException:
            self._shadow.pop(cli_name, None)   # unsure what landed: read the kernel next time
            raise

    def _update(self, cli_name: str, updates: Entries) -> None:
        m = self.map(cli_name)
        shadow = self._shadow.get(cli_name)
        size = TABLES.get(cli_name)
        memory = self._memory(cli_name) if size is not None else None
        for k, v in updates.items():
            if memory is None:
                m.update(k, v)
            else:
                first = struct.unpack("<I", k)[0] * size
                memory[first:first + size] = np.frombuffer(v, dtype=np.uint32)
            if shadow is not None:
                shadow[k] = v

    def _delete(self, cli_name: str, deletes: list[bytes]) -> None:
        m = self.map(cli_name)
        shadow = self._shadow.get(cli_name)
        size = TABLES.get(cli_name)
        memory = self._memory(cli_name) if size is not None else None
        for k in deletes:
            if memory is None:
                m.delete(k)
            else:   # array slots cannot be deleted: a table is cleared to zeros
                first = struct.unpack("<I", k)[0] * size
                memory[first:first + size] = 0
            if shadow is not None:
                shadow.pop(k, None)
