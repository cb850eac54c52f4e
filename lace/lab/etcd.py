"""etcd members for a lab (``lace lab up --store etcd``) and for the store tests: how one is started.

A member listens only inside the network namespace it runs in (a lab node's, or a test's own),
never in the root namespace: clients outside enter that namespace for their sockets
(``lace.store.etcd``, ``netns=``). The limits are raised over etcd's defaults because one lace
transaction is one etcd Txn: a namespace deletion cascading to many pods, or an apply of many
objects, is one Txn of that many operations (etcd's default allows 128). Old revisions are
compacted by etcd itself, keeping the last ``RETENTION`` like the SQLite store's event log.

Stdlib only (the CLI imports the lab on every lab command).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lace.store.config import StoreConfig

CLIENT_PORT = 2379
PEER_PORT = 2380
MAX_TXN_OPS = 16384
MAX_REQUEST_BYTES = 32 * 1024 * 1024
RETENTION = 10_000
ETCD_BINARY = "etcd"


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Member:
    """One member: its name, the address it serves clients and peers on, and its data directory."""

    name: str
    address: str
    data_dir: str

    @property
    def client_url(self) -> str:
        return url(self.address, CLIENT_PORT)

    @property
    def peer_url(self) -> str:
        return url(self.address, PEER_PORT)


def member_argv(member: Member, cluster: list[Member], *, token: str,
                binary: str = ETCD_BINARY) -> list[str]:
    """The command line of ``member`` in a new cluster of ``cluster`` (itself included)."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster)
    return [
        binary, "--name", member.name, "--data-dir", member.data_dir,
        "--listen-client-urls", member.client_url, "--advertise-client-urls", member.client_url,
        "--listen-peer-urls", member.peer_url, "--initial-advertise-peer-urls", member.peer_url,
        "--initial-cluster", initial, "--initial-cluster-state", "new",
        "--initial-cluster-token", token,
        "--max-txn-ops", str(MAX_TXN_OPS), "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--auto-compaction-mode", "revision", "--auto-compaction-retention", str(RETENTION),
    ]


# ---- a lab's etcd cluster (`lace lab up --store etcd`) ---------------------------------------

#: how many members a lab's etcd has (on its first nodes; fewer when the lab has fewer nodes)
LAB_MEMBERS = 3
#: how long `lab up` waits for the members to elect a leader
READY_TIMEOUT = 60.0


def proc_name(node: str) -> str:
    return f"etcd-{node}"


def lab_members(lab: Any, state_dir: str) -> list[tuple[Member, Any]]:
    """The members of ``lab``'s etcd and the node each runs on: one in each of its first nodes,
    serving on the node's underlay (fabric) address, its data under ``<state>/etcd/<node>``."""
    return [(Member(proc_name(n.name), n.underlay_addr, os.path.join(state_dir, "etcd", n.name)), n)
            for n in lab.nodes[:LAB_MEMBERS]]


def start_lab_cluster(lab: Any, state_dir: str) -> StoreConfig:
    """Start ``lab``'s etcd members, each inside its node's namespace, wait for a healthy cluster
    and record it as the lab's store (``store.spec``); returns that store's config.

    Clients outside the lab (the CLI, the kubelet, the controllers) reach the members from the
    first node's namespace; agents from their own. Nothing listens in the root namespace.
    """
    from lace.store.config import StoreConfig, write_lab_store
    from lace.store.etcd import wait_ready

    from . import procs
    placed = lab_members(lab, state_dir)
    members = [m for m, _ in placed]
    for member, node in placed:
        os.makedirs(member.data_dir, mode=0o700, exist_ok=True)
        procs.spawn(member_argv(member, members, token=f"lace-{lab.name}"), netns=node.netns,
                    name=member.name, state_dir=state_dir,
                    log_path=os.path.join(state_dir, "logs", f"{member.name}.log"))
    config = StoreConfig("etcd", endpoints=tuple(m.client_url.removeprefix("http://") for m in members),
                         netns=placed[0][1].netns)

    def exited() -> str | None:
        running = {p.name: p for p in procs.list_procs(state_dir)}
        gone = [m.name for m in members if not (running.get(m.name) and running[m.name].alive)]
        if not gone:
            return None
        log = os.path.join(state_dir, "logs", f"{gone[0]}.log")
        return f"{', '.join(gone)} exited; {log}:\n{procs.log_tail(log, 800)}"

    wait_ready(config.endpoints, netns=config.netns, timeout=READY_TIMEOUT, alive=exited)
    write_lab_store(state_dir, config)
    return config


def start_member(lab: Any, state_dir: str, node: str) -> int:
    """Start ``node``'s member again after it stopped (a fault test, an operator): the same command
    line, on its data directory, which etcd rejoins the cluster from (the ``--initial-*`` flags
    only matter to an empty one). Returns its pid."""
    from . import procs
    placed = lab_members(lab, state_dir)
    members = [m for m, _ in placed]
    for member, n in placed:
        if n.name == node:
            return procs.spawn(member_argv(member, members, token=f"lace-{lab.name}"), netns=n.netns,
                               name=member.name, state_dir=state_dir,
                               log_path=os.path.join(state_dir, "logs", f"{member.name}.log"))
    raise ValueError(f'node "{node}" runs no etcd member of lab "{lab.name}" '
                     f'(members run on {", ".join(n.name for _, n in placed)})')


def leader(config: StoreConfig) -> str | None:
    """The client endpoint (``HOST:PORT``) of the member that leads ``config``'s etcd now, from
    each member's status (``/v3/maintenance/status``: its own ID and its leader's); None when no
    member that answers knows a leader."""
    from lace.store.errors import StoreError
    from lace.store.etcd import member_status
    for endpoint in config.endpoints:
        try:
            status = member_status(endpoint, netns=config.netns)
        except StoreError:
            continue
        if status.get("leader") and status["leader"] == status["header"]["member_id"]:
            return endpoint
    return None

