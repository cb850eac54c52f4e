"""Socket-level service translation for the node's host processes: sock.o's cgroup programs
attached to the node's host cgroup through pinned links.

Processes in the host cgroup (the node's own tools, hostNetwork pods) reach ClusterIPs through
these hooks: connect and sendmsg to a frontend are rewritten to a backend, recvmsg and getpeername
show the frontend again (``bpf/lib/sock_lb.h``). Pods are never in the host cgroup; the tc path of
their own network serves them. The connect hooks also record the kubelet's connections to probe
targets in other networks by socket cookie, and the socket-release hook forgets them when the socket
closes (``bpf/lib/probe.h``).

The links are pinned under the node's links directory as ``sock-<hook>``, so translation goes on
while the agent is down. A restarted agent swaps its new programs into those links in place; a
pinned link that no longer sits on the configured cgroup (the cgroup was removed and made again,
or the configuration names another one) is detached and replaced. Removing the pin root (``lace
lab down``) or the cgroup detaches everything.

A connected UDP socket is translated once, at connect: when its backend leaves the service (the
pod deleted, its labels changed), it would go on sending to an address that no longer serves it.
:func:`terminate_udp` destroys such sockets through a UDP socket iterator (``bpf/progs/sock_term.c``):
they are disconnected, their owners' next call fails (ECONNABORTED for a receive, EDESTADDRREQ for
a send) and they connect again, to a live backend — what
kube-proxy's conntrack flush does for a packet-level translation. Unconnected sockets need nothing:
their every sendmsg is translated anew. TCP connections keep their backend, as on the packet path.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
from typing import Protocol

from lace.bpf import BPFError, Iterator, Link, Map, Program
from lace.bpf.cgroup import attach_cgroup, attach_type, cgroup_id, cgroup_link_target
from lace.datapath.common import NETWORK_DEFAULT, Family
from lace.datapath.registry import SOCK_TERM_OBJECT, SOCK_TERM_PROGRAM, bpf_dir
from lace.datapath.services import REVNAT_KEY, SOCK_REVNAT, SOCK_REVNAT_KEY, SOCK_TERM

log = logging.getLogger("lace.agent.socklb")

#: cgroup hook -> the sock.o program attached there
HOOK_PROGRAMS: dict[str, str] = {
    "connect4": "lace_sock_connect4",
    "connect6": "lace_sock_connect6",
    "sendmsg4": "lace_sock_sendmsg4",
    "sendmsg6": "lace_sock_sendmsg6",
    "recvmsg4": "lace_sock_recvmsg4",
    "recvmsg6": "lace_sock_recvmsg6",
    "getpeername4": "lace_sock_getpeername4",
    "getpeername6": "lace_sock_getpeername6",
    "sock_release": "lace_sock_release",
}


def link_name(hook: str) -> str:
    """The pin name of a hook's link in the links directory."""
    return f"sock-{hook}"


class Programs(Protocol):
    """Where the loaded programs come from (a :class:`lace.datapath.node.LoadedDatapath`)."""

    def program(self, name: str) -> Program: ...


class SockLBError(Exception):
    """The socket hooks could not be attached; the message names the cgroup and what to do."""


class SockLB:
    """The host cgroup's socket hooks, owned by the agent: :meth:`attach` after the datapath is
    loaded (and again after every reload), :meth:`close` on stop (links stay pinned),
    :meth:`detach` to remove translation for good."""

    def __init__(self, cgroup: str, links_dir: str) -> None:
        self.cgroup = cgroup
        self.links_dir = links_dir
        self._links: dict[str, Link] = {}

    def __repr__(self) -> str:
        return f"SockLB(cgroup={self.cgroup!r}, links_dir={self.links_dir!r})"

    def path(self, hook: str) -> str:
        return os.path.join(self.links_dir, link_name(hook))

    def attach(self, programs: Programs) -> None:
        """Attach (or swap in) every hook's program; the same call after a restart adopts the
        pinned links instead of attaching twice."""
        if not os.path.isdir(self.cgroup):
            raise SockLBError(f"cgroup {self.cgroup} does not exist: create it (cgroup2) or fix --cgroup")
        os.makedirs(self.links_dir, exist_ok=True)
        target = cgroup_id(self.cgroup)
        for hook, name in HOOK_PROGRAMS.items():
            prog = programs.program(name)
            try:
                link = self._adopt(hook, prog, target) or attach_cgroup(prog, self.cgroup, hook,
                                                                         pin_path=self.path(hook))
            except BPFError as exc:
                raise SockLBError(f"cannot attach {name} to {hook} of cgroup {self.cgroup}: {exc}") from None
            old = self._links.pop(hook, None)
            if old is not None and old is not link:
                old.close()
            self._links[hook] = link

    def _adopt(self, hook: str, prog: Program, target: int) -> Link | None:
        """The pinned link of ``hook`` with ``prog`` swapped in, or None when there is none that
        still sits on this cgroup and hook (a stale one is detached and unpinned)."""
        path = self.path(hook)
        try:
            link = Link.open_pinned(path)
        except BPFError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("pinned link %s unusable (%s): replacing it", path, exc)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None
        if cgroup_link_target(link) == (target, attach_type(hook)):
            try:
                link.update(prog)
                return link
            except BPFError as exc:  # ENOLINK: its cgroup went away since the check
                log.warning("pinned link %s cannot take the new program (%s): replacing it", path, exc)
        with contextlib.suppress(BPFError):
            link.detach()
        link.unpin()
        link.close()
        return None

    def link_ids(self) -> dict[str, int]:
        """Hook -> the ID of the link this object holds (after :meth:`attach`)."""
        return {hook: link.id for hook, link in self._links.items()}

    def close(self) -> None:
        """Close this process's link fds; the pinned links keep translating."""
        for link in self._links.values():
            link.close()
        self._links.clear()

    def detach(self) -> None:
        """Detach every hook and remove its pin, whether this object attached it or a previous
        agent did."""
        for hook in HOOK_PROGRAMS:
            link = self._links.pop(hook, None)
            if link is None:
                try:
                    link = Link.open_pinned(self.path(hook))
                except BPFError:
                    continue
            with contextlib.suppress(BPFError):
                link.detach()
            link.pin_path = self.path(hook)
            link.unpin()
            link.close()


def _addr(family: int, raw: bytes, port: int) -> tuple[int, bytes, int]:
    """(family, address bytes of its length, port): the one form the matches below compare."""
    return family, bytes(raw[:4] if family == Family.IPV4 else raw), port


def terminate_udp(sock_revnat: Map, departed: list[tuple[bytes, tuple[int, str, int]]],
                  object_path: str | None = None) -> int:
    """Destroy the host's UDP sockets connected, through the socket hooks, to a backend that left
    the frontend they asked for: ``departed`` pairs (revnat key of a UDP backend, frontend (source
    network, address, port); ServiceProgrammer.take_departed), the sockets found by their
    sock-revnat entries (cookie, backend -> frontend). Only frontends of the default network count:
    the host's. Runs in the calling thread's network namespace (the node's). Returns how many were
    destroyed."""
    wanted: set[tuple[tuple[int, bytes, int], tuple[int, bytes, int]]] = set()
    for k, (net, addr, port) in departed:
        b = REVNAT_KEY.unpack(k)
        if net != NETWORK_DEFAULT:   # the host's frontends are the default network's
            continue
        fe = ipaddress.ip_address(addr)
        wanted.add((_addr(b["family"], b["addr"], b["port"]),
                    _addr(Family.IPV4 if fe.version == 4 else Family.IPV6, fe.packed, port)))
    if not wanted:
        return 0
    targets: dict[int, bytes] = {}
    for raw_k, raw_v in sock_revnat.items():
        k, v = SOCK_REVNAT_KEY.unpack(raw_k), SOCK_REVNAT.unpack(raw_v)
        if (_addr(k["family"], k["addr"], k["port"]), _addr(v["family"], v["addr"], v["port"])) in wanted:
            targets[k["cookie"]] = SOCK_TERM.pack(addr=bytes(k["addr"]), port=k["port"], family=k["family"],
                                                  reserved=bytes(5))
    if not targets:
        return 0
    path = object_path or str(bpf_dir() / SOCK_TERM_OBJECT)
    with Iterator(path, SOCK_TERM_PROGRAM) as it:
        m = it.obj.maps["lace_sk_term"]
        for cookie, value in targets.items():
            m.update(cookie.to_bytes(8, "little"), value)
        done = [line for line in it.read().split(b"\n") if line]
    if done:
        log.info("%d host UDP sockets connected to departed backends terminated", len(done))
    return len(done)
