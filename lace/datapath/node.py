"""One way to reach a node's datapath: its maps by CLI name, pinned or freshly loaded.

Modelled on cilium/ebpf: objects own their file descriptors, and a collection of maps and programs
is loaded from a spec.  Maps are always named by their CLI name (``lace.datapath.registry``, e.g.
``"policy"``, ``"ct-tcp-v4"``); the pin name and the object that holds a map are this module's
business.  There are two ways in:

**A node's pinned maps** — for readers that did not load the objects (the node CLI,
``lace policy trace``)::

    maps = PinnedMaps("/sys/fs/bpf/lace-lab-n1", node="n1")
    with maps.open("policy") as m:          # a lace.bpf.Map the caller owns (closed by ``with``)
        keys, values, n = m.dump()          # raw arrays, for NumPy
    maps.entries("segment")                 # {key bytes: value bytes}, opened and closed inside
    maps.capacity("policy")                 # the pinned map's max_entries
    maps.path("policy")                     # <pin root>/<pin name>, whether it exists or not

Opening fails with a :class:`DatapathError` that names the node, the map and the path, for
callers to turn into their own messages:

* :class:`NodeNotLoaded` — the pin root is not a directory: nothing was ever loaded on the node;
* :class:`MapNotPinned` — the pin root exists but the map is not pinned in it;
* :class:`MapUnavailable` — the pin exists but cannot be opened (``errno`` and ``cause`` say why).

Unknown CLI names raise KeyError (listing the known ones).  Once a map is open, failures are the
``lace.bpf`` errors of the operation (e.g. ``NotSupported`` for dumping the ring buffer).

**Every program object loaded** — for the agent and the datapath test bed::

    dp = load_objects(pin_root, max_entries={"ct-tcp-v4": 1 << 20})
    dp.map("config")                        # a Map owned by dp: do not close it
    dp.entries("routing")                   # {key bytes: value bytes}
    dp.program("lace_from_pod")             # a lace.bpf.Program owned by dp
    dp.migrations                           # pinned maps migrated by this load
    dp.close()                              # or ``with load_objects(...) as dp:``

:func:`load_objects` opens every object of ``registry.OBJECTS`` (pod_veth.o, uplink.o, host.o, sock.o) against
the pin root, applies the capacity overrides, and loads them: the first load creates and pins the
maps, the second (and any later load, e.g. an agent restart) reuses the pins, migrating a pinned
map whose definition changed.  Pinned maps outlive :meth:`LoadedDatapath.close`.
"""

from __future__ import annotations

import errno
import os
from typing import Iterator, Mapping

from lace.bpf import BPFError, Map, Migration, Object, ObjectSpec, Program, ensure_bpffs

from . import registry

Entries = dict[bytes, bytes]

__all__ = [
    "DatapathError", "NodeNotLoaded", "MapNotPinned", "MapUnavailable",
    "PinnedMaps", "LoadedDatapath", "load_objects", "Entries",
]  # fmt: skip


# --- errors ------------------------------------------------------------------------------------


def _node_label(node: str | None) -> str:
    return node or "this node"


class DatapathError(Exception):
    """A node's datapath could not be reached; the subclass says how, the attributes say where."""


class NodeNotLoaded(DatapathError):
    """The node's pin root does not exist (or is not a directory): its datapath was never loaded.

    ``pin_root``, ``node`` (None: unnamed) and ``cli_name`` (the map asked for, if any).
    """

    def __init__(self, pin_root: str, node: str | None = None, cli_name: str | None = None) -> None:
        self.pin_root = pin_root
        self.node = node
        self.cli_name = cli_name
        super().__init__(f"pin root {pin_root} of {_node_label(node)} does not exist")


class MapNotPinned(DatapathError):
    """The pin root exists but map ``cli_name`` is not pinned at ``path``."""

    def __init__(self, cli_name: str, node: str | None, path: str) -> None:
        self.cli_name = cli_name
        self.node = node
        self.path = path
        super().__init__(f"map {cli_name} is not pinned on {_node_label(node)} ({path})")


class MapUnavailable(DatapathError):
    """Map ``cli_name`` is pinned at ``path`` but could not be opened; ``errno`` and ``cause`` (the
    lace.bpf error) say why."""

    def __init__(self, cli_name: str, node: str | None, path: str, cause: BPFError) -> None:
        self.cli_name = cli_name
        self.node = node
        self.path = path
        self.cause = cause
        self.errno = cause.errno
        super().__init__(f"cannot open map {cli_name} at {path}: {cause}")


# --- a node's pinned maps ----------------------------------------------------------------------


class PinnedMaps:
    """The maps pinned under one node's pin root, opened by CLI name; see the module docstring.

    Holds no file descriptors itself: every :meth:`open` hands the caller a new :class:`Map`.
    """

    def __init__(self, pin_root: str, node: str | None = None) -> None:
        self.pin_root = pin_root
        self.node = node

    def __repr__(self) -> str:
        return f"PinnedMaps({self.pin_root!r}, node={self.node!r})"

    def path(self, cli_name: str) -> str:
        """Where map ``cli_name`` is (or would be) pinned: ``<pin root>/<pin name>``."""
        return os.path.join(self.pin_root, registry.get(cli_name).pin_name)

    def require_loaded(self, cli_name: str | None = None) -> str:
        """The pin root, or :class:`NodeNotLoaded` if it is not a directory."""
        if not os.path.isdir(self.pin_root):
            raise NodeNotLoaded(self.pin_root, self.node, cli_name)
        return self.pin_root

    def open(self, cli_name: str) -> Map:
        """Open the pinned map ``cli_name``: a :class:`Map` the caller closes (use ``with``)."""
        path = self.path(cli_name)
        self.require_loaded(cli_name)
        try:
            return Map.open_pinned(path)
        except BPFError as exc:
            if exc.errno == errno.ENOENT:
                if not os.path.isdir(self.pin_root):  # removed between the check and the open
                    raise NodeNotLoaded(self.pin_root, self.node, cli_name) from None
                raise MapNotPinned(cli_name, self.node, path) from None
            raise MapUnavailable(cli_name, self.node, path, exc) from None

    def entries(self, cli_name: str) -> Entries:
        """Every entry of map ``cli_name`` as ``{key: value}`` (raw bytes; see ``Map.entries``)."""
        with self.open(cli_name) as m:
            return dict(m.entries())

    def capacity(self, cli_name: str) -> int:
        """The pinned map's max_entries (for the ring buffer: its size in bytes)."""
        with self.open(cli_name) as m:
            return m.max_entries


# --- both program objects, loaded ---------------------------------------------------------------


class LoadedDatapath:
    """Every program object loaded against one pin root, sharing their pinned maps.

    Owns every map and program fd it hands out (:meth:`map`, :meth:`program`): they stay valid
    until :meth:`close`.  ``objects`` maps the object name (a key of ``registry.OBJECTS``) to its
    ``lace.bpf.Object``; ``migrations`` lists the pinned maps this load migrated.
    """

    def __init__(self, pin_root: str, objects: Mapping[str, Object]) -> None:
        self.pin_root = pin_root
        self.objects: dict[str, Object] = dict(objects)
        self.migrations: list[Migration] = [m for obj in self.objects.values() for m in obj.migrations]

    def __repr__(self) -> str:
        return f"LoadedDatapath({self.pin_root!r}, objects={list(self.objects)})"

    def __enter__(self) -> LoadedDatapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(self, cli_name: str) -> Map:
        """Map ``cli_name`` (owned by this datapath: do not close it); KeyError if no object has it."""
        pin = registry.get(cli_name).pin_name
        for obj in self.objects.values():
            if pin in obj.maps:
                return obj.maps[pin]
        raise KeyError(cli_name)

    def entries(self, cli_name: str) -> Entries:
        """Every entry of map ``cli_name`` as ``{key: value}`` (raw bytes; see ``Map.entries``)."""
        return dict(self.map(cli_name).entries())

    def capacity(self, cli_name: str) -> int:
        """Map ``cli_name``'s max_entries as loaded."""
        return self.map(cli_name).max_entries

    def program(self, name: str) -> Program:
        """The program called ``name`` (its C function name, e.g. ``lace_from_pod``), owned by
        this datapath; KeyError if no object has it."""
        for obj in self.objects.values():
            if name in obj.programs:
                return obj.programs[name]
        raise KeyError(f"no program {name!r}; loaded: {', '.join(self.program_names())}")

    def program_names(self) -> list[str]:
        return [p for obj in self.objects.values() for p in obj.programs]

    def __iter__(self) -> Iterator[Object]:
        return iter(self.objects.values())

    def close(self) -> None:
        """Close every map and program fd (pinned maps stay pinned)."""
        for obj in self.objects.values():
            obj.close()
        self.objects.clear()


def load_objects(pin_root: str, max_entries: Mapping[str, int] | None = None) -> LoadedDatapath:
    """Load every object of ``registry.OBJECTS`` against ``pin_root`` (created if missing, bpffs
    mounted if needed), their pinned maps shared; ``max_entries`` overrides capacities by CLI name.

    Unknown CLI names raise KeyError before anything is loaded; a load failure closes what was
    loaded and raises the ``lace.bpf`` error (pins already made stay, as any load leaves them).
    """
    overrides = {registry.get(cli).pin_name: int(n) for cli, n in (max_entries or {}).items()}
    ensure_bpffs()
    os.makedirs(pin_root, exist_ok=True)
    objects: dict[str, Object] = {}
    try:
        for name in registry.OBJECTS:
            spec = ObjectSpec.open(str(registry.bpf_object_path(name)), pin_root=pin_root)
            try:
                for pin, n in overrides.items():
                    spec.maps[pin].set_max_entries(n)
            except BaseException:
                spec.close()
                raise
            objects[name] = spec.load()
    except BaseException:
        for obj in objects.values():
            obj.close()
        raise
    return LoadedDatapath(pin_root, objects)
