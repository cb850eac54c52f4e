"""The node's datapath as the agent holds it: both BPF objects loaded against the node's pin root
(pinned maps reused or migrated, never flushed), the uplink and pod programs attached through
pinned tcx links, and the one writer of the maps the agent owns.

An agent that restarts finds the maps and links pinned: it loads the objects again (reusing every
pinned map), and swaps the new program instances into the existing links atomically, so traffic
never stops and no entry is lost.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from lace.bpf import BPFError, Link, Object, ObjectSpec, attach, ensure_bpffs
from lace.datapath import registry

from .desired import OWNED_MAPS, Entries
from .diff import MapChanges

log = logging.getLogger("lace.agent.datapath")

LINKS_DIR = "links"
UPLINK_LINK = "uplink"
POD_PROGRAM = ("pod_veth", "lace_from_pod")
UPLINK_PROGRAM = ("uplink", "lace_from_uplink")


def pod_link_name(host_ifname: str) -> str:
    return f"pod-{host_ifname}"


class NodeDatapath:
    """Loaded objects, their maps by CLI name, and the attach points; see the module docstring."""

    def __init__(self, pin_root: str, *, max_entries: dict[str, int] | None = None) -> None:
        self.pin_root = pin_root
        self.links_dir = os.path.join(pin_root, LINKS_DIR)
        self.max_entries = dict(max_entries or {})
        self.objects: dict[str, Object] = {}
        self.migrations: list = []
        self._lock = threading.Lock()
        #: what the agent last wrote to each owned map: the agent is their only writer, so a
        #: reconcile diffs against this instead of reading an LPM trie back entry by entry; the
        #: periodic resync reads the kernel again and repairs anything changed behind its back
        self._shadow: dict[str, Entries] = {}

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        ensure_bpffs()
        os.makedirs(self.links_dir, exist_ok=True)
        for name, filename in registry.OBJECTS.items():
            spec = ObjectSpec.open(str(registry.bpf_object_path(name)), pin_root=self.pin_root)
            for cli, n in self.max_entries.items():
                spec.maps[registry.get(cli).pin_name].set_max_entries(n)
            obj = spec.load()
            self.migrations.extend(obj.migrations)
            for m in obj.migrations:
                log.warning("map %s migrated (%s): %d entries copied, %d dropped",
                            m.map, m.reason, m.copied, m.dropped)
            self.objects[name] = obj

    def close(self) -> None:
        for obj in self.objects.values():
            obj.close()
        self.objects.clear()

    def map(self, cli_name: str):
        pin = registry.get(cli_name).pin_name
        for obj in self.objects.values():
            if pin in obj.maps:
                return obj.maps[pin]
        raise KeyError(cli_name)

    def program(self, which: tuple[str, str]):
        return self.objects[which[0]].programs[which[1]]

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
        att = attach(prog, ifindex, "ingress", pin_path=path)
        if isinstance(att, Link):
            att.close()   # pinned: the link outlives this fd (and this process)

    def attach_uplink(self, ifindex: int) -> None:
        self._attach(self.program(UPLINK_PROGRAM), ifindex, UPLINK_LINK)

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
        """The map's entries: from the kernel, or (``fresh=False``) as this agent last left them."""
        if not fresh and cli_name in self._shadow:
            return dict(self._shadow[cli_name])
        entries = self._read_kernel(cli_name)
        self._shadow[cli_name] = dict(entries)
        return entries

    def _read_kernel(self, cli_name: str) -> Entries:
        m = self.map(cli_name)
        keys, values, n = m.dump()
        ks, vs = m.key_size, m.value_blob_size
        kb, vb = bytes(keys), bytes(values)
        return {kb[i * ks:(i + 1) * ks]: vb[i * vs:(i + 1) * vs] for i in range(n)}

    def read_owned(self, *, fresh: bool = True) -> dict[str, Entries]:
        return {name: self.read(name, fresh=fresh) for name in OWNED_MAPS}

    def write(self, cli_name: str, changes: MapChanges) -> None:
        m = self.map(cli_name)
        with self._lock:
            shadow = self._shadow.get(cli_name)
            try:
                for k in changes.deletes:
                    m.delete(k)
                    if shadow is not None:
                        shadow.pop(k, None)
                for k, v in changes.updates.items():
                    m.update(k, v)
                    if shadow is not None:
                        shadow[k] = v
            except BaseException:
                self._shadow.pop(cli_name, None)   # unsure what landed: read the kernel next time
                raise
